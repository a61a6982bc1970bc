//! pcap / pcapng file reading: the I/O adapter between capture files (or
//! standard input) and the pure decoder.
//!
//! Regular files are memory-mapped a window at a time and parsed in place
//! (see [`mapped`]); pipes and standard input go through `pcap-parser`'s
//! streaming readers. In the single-file case packets are handed out
//! zero-copy from the window or buffer; with several files a k-way merge by
//! timestamp keeps one pending (copied) packet per file.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::rc::Rc;

mod mapped;

use mapped::MappedReader;
use pcap_parser::traits::{PcapNGPacketBlock, PcapReaderIterator};
use pcap_parser::{
    Block, EnhancedPacketBlock, InterfaceDescriptionBlock, LegacyPcapBlock, LegacyPcapReader,
    OptionCode, PcapBlockOwned, PcapError, PcapNGReader, SimplePacketBlock, UnknownBlock,
};

#[derive(Debug, Clone, Copy)]
pub struct RawPacket<'a> {
    /// Nanoseconds since the Unix epoch.
    pub ts_nanos: i64,
    /// LINKTYPE_* value of the interface the packet was captured on.
    pub linktype: u32,
    /// Captured bytes (possibly fewer than `orig_len`).
    pub data: &'a [u8],
    /// Length of the packet on the wire.
    pub orig_len: u32,
}

#[derive(Debug)]
pub enum CaptureError {
    /// The file could not be opened.
    Open { path: String, source: io::Error },
    /// The file does not start with a pcap or pcapng magic number.
    NotACapture { path: String, head: Vec<u8> },
    /// Reading failed (I/O error) at the given byte offset.
    Read {
        path: String,
        offset: u64,
        source: io::Error,
    },
    /// The file structure is invalid at the given byte offset.
    Corrupt {
        path: String,
        offset: u64,
        detail: String,
    },
    /// A single record is larger than the reader is willing to buffer.
    RecordTooLarge {
        path: String,
        offset: u64,
        len: u64,
        limit: u64,
    },
    /// "-" was given more than once.
    StdinTwice,
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Open { path, source } => write!(f, "{path}: cannot open: {source}"),
            CaptureError::NotACapture { path, head } => {
                write!(f, "{path}: not a pcap or pcapng file (starts with 0x")?;
                for b in head {
                    write!(f, "{b:02x}")?;
                }
                write!(f, ")")
            }
            CaptureError::Read {
                path,
                offset,
                source,
            } => write!(f, "{path}: read error at byte {offset}: {source}"),
            CaptureError::Corrupt {
                path,
                offset,
                detail,
            } => write!(f, "{path}: corrupt capture at byte {offset}: {detail}"),
            CaptureError::RecordTooLarge {
                path,
                offset,
                len,
                limit,
            } => write!(
                f,
                "{path}: record at byte {offset} is {len} bytes, over the {limit}-byte limit"
            ),
            CaptureError::StdinTwice => {
                write!(f, "standard input (\"-\") can only be read once")
            }
        }
    }
}

// The underlying io::Error is already part of the one-line Display, so it is
// deliberately not exposed as `source()` (that would print it twice in chains).
impl std::error::Error for CaptureError {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    pub path: String,
    /// Byte offset where the incomplete record starts.
    pub offset: u64,
}

/// A corrupt record length with data after it: the bytes from `offset` to `resumed_at` (the
/// next plausible record, or the end of the file) were skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resync {
    pub path: String,
    /// Byte offset of the record with the corrupt length.
    pub offset: u64,
    /// Byte offset where reading resumed; `None`: no plausible record after it, the rest of
    /// the file was skipped.
    pub resumed_at: Option<u64>,
    /// Bytes skipped.
    pub skipped: u64,
}

impl Resync {
    /// One line for the log.
    pub fn describe(&self) -> String {
        match self.resumed_at {
            Some(at) => format!(
                "{}: corrupt record length at byte {}: resynchronised at byte {at}, {} bytes skipped",
                self.path, self.offset, self.skipped
            ),
            None => format!(
                "{}: corrupt record length at byte {}: no plausible record after it, the last {} bytes skipped",
                self.path, self.offset, self.skipped
            ),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct ReadSummary {
    /// Number of inputs read (including empty ones).
    pub files: usize,
    /// Packets delivered to the callback.
    pub packets: u64,
    /// Captured bytes delivered (sum of `RawPacket::data` lengths).
    pub bytes: u64,
    pub truncations: Vec<Truncation>,
    /// Corrupt record lengths skipped over (the file was read on after them).
    pub resyncs: Vec<Resync>,
    /// Files with packets cut short by the capture's snaplen (captured < on the wire).
    pub snaplen_cuts: Vec<SnaplenCut>,
    pub warnings: Vec<String>,
}

/// Packets of one file captured shorter than they were on the wire: what is cut from a body is
/// lost (the pipeline treats it as a gap) and the file's snaplen is too small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnaplenCut {
    pub path: String,
    pub packets: u64,
    /// The largest captured length among the cut packets: about the capture's snaplen.
    pub caplen: u32,
}

/// Cut packets of one file, while reading.
#[derive(Debug, Default, Clone, Copy)]
struct CutCount {
    packets: u64,
    caplen: u32,
}

impl CutCount {
    fn note(&mut self, p: &RawPacket<'_>) {
        let caplen = u32::try_from(p.data.len()).unwrap_or(u32::MAX);
        if caplen < p.orig_len {
            self.packets += 1;
            self.caplen = self.caplen.max(caplen);
        }
    }
}

impl ReadSummary {
    /// Bytes skipped over corrupt record lengths, in every file.
    pub fn skipped_bytes(&self) -> u64 {
        self.resyncs.iter().map(|r| r.skipped).sum()
    }
}

/// Reads every packet of every file, calling `on_packet` for each, in
/// timestamp order across files (a rotated capture set given in any order
/// behaves as one capture; within a file, file order is kept). Path "-" means
/// standard input (at most once); it is named "<stdin>" in messages.
///
/// All files are opened and their magic checked before any packet is
/// delivered, so a missing/unreadable/non-capture file fails fast with a
/// one-line error. A file truncated mid-record is not an error: packets up to
/// the cut are delivered, a [`Truncation`] is recorded and reading continues
/// with the other files. An empty file only produces a warning.
pub fn read_captures(
    paths: &[String],
    on_packet: &mut dyn FnMut(RawPacket<'_>),
) -> Result<ReadSummary, CaptureError> {
    let limits = Limits::for_file_count(paths.len());
    let mut inputs = Vec::with_capacity(paths.len());
    let mut stdin_taken = false;
    for path in paths {
        if path == "-" {
            if stdin_taken {
                return Err(CaptureError::StdinTwice);
            }
            stdin_taken = true;
            inputs.push(Input {
                name: "<stdin>".to_string(),
                data: InputData::Stream(Box::new(io::stdin().lock())),
            });
        } else {
            let file = File::open(path).map_err(|source| CaptureError::Open {
                path: path.clone(),
                source,
            })?;
            // Regular files have a known length (no record can be longer than the file) and
            // can be mapped; FIFOs, character devices and the like are read as streams.
            let len = file
                .metadata()
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len());
            let data = match len {
                Some(len) => InputData::File(file, len),
                None => InputData::Stream(Box::new(file)),
            };
            inputs.push(Input {
                name: path.clone(),
                data,
            });
        }
    }
    read_inputs(inputs, &limits, on_packet)
}

/// Buffer sizing. The buffer must hold one whole record; it starts at
/// `initial` and grows on demand up to `max_record`.
#[derive(Debug, Clone, Copy)]
struct Limits {
    initial: usize,
    max_record: usize,
}

const SINGLE_FILE_BUFFER: usize = 4 << 20;
const MAX_RECORD: usize = 256 << 20;

impl Limits {
    fn for_file_count(n: usize) -> Limits {
        // Every file of a merge is open at once, so keep their sum bounded.
        let initial = if n <= 1 {
            SINGLE_FILE_BUFFER
        } else {
            ((32 << 20) / n).clamp(64 << 10, SINGLE_FILE_BUFFER)
        };
        Limits {
            initial,
            max_record: MAX_RECORD,
        }
    }
}

struct Input {
    name: String,
    data: InputData,
}

enum InputData {
    /// Pipes, standard input: read sequentially.
    Stream(Box<dyn Read>),
    /// A regular file and its length: memory-mapped.
    File(File, u64),
}

impl InputData {
    fn len(&self) -> Option<u64> {
        match self {
            InputData::Stream(_) => None,
            InputData::File(_, len) => Some(*len),
        }
    }
}

/// Only used to sniff the file header; a mapped file is then read through its map.
impl Read for InputData {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            InputData::Stream(r) => r.read(buf),
            InputData::File(f, _) => f.read(buf),
        }
    }
}

fn read_inputs(
    inputs: Vec<Input>,
    limits: &Limits,
    on_packet: &mut dyn FnMut(RawPacket<'_>),
) -> Result<ReadSummary, CaptureError> {
    let mut summary = ReadSummary {
        files: inputs.len(),
        ..ReadSummary::default()
    };
    // Check every header before delivering anything.
    let mut files = Vec::with_capacity(inputs.len());
    for input in inputs {
        files.push(FileReader::open(input, limits)?);
    }
    let mut cuts = vec![CutCount::default(); files.len()];
    let single = files.len() == 1;
    // One file: its cut packets are counted here, on the one per-packet call.
    let mut single_cuts = CutCount::default();
    let mut deliver = |p: RawPacket<'_>| {
        summary.packets += 1;
        summary.bytes += p.data.len() as u64;
        if single {
            single_cuts.note(&p);
        }
        on_packet(p);
    };
    let result = if single {
        read_single(&mut files, &mut deliver)
    } else {
        read_merged(&mut files, &mut cuts, &mut deliver)
    };
    result?;
    if let Some(first) = cuts.first_mut().filter(|_| single) {
        *first = single_cuts;
    }
    for (file, cut) in files.iter().zip(&cuts) {
        file.report(&mut summary);
        if cut.packets > 0 {
            summary.snaplen_cuts.push(SnaplenCut {
                path: file.state.name.clone(),
                packets: cut.packets,
                caplen: cut.caplen,
            });
        }
    }
    Ok(summary)
}

fn read_single(
    files: &mut [FileReader],
    deliver: &mut dyn FnMut(RawPacket<'_>),
) -> Result<(), CaptureError> {
    for file in files {
        while file.next_packets(deliver)? {}
    }
    Ok(())
}

/// One pending packet per file, copied out of its reader's buffer.
struct Pending {
    ts_nanos: i64,
    linktype: u32,
    orig_len: u32,
    data: Vec<u8>,
}

fn fetch(file: &mut FileReader, slot: &mut Pending) -> Result<bool, CaptureError> {
    file.next_packet(&mut |p| {
        slot.ts_nanos = p.ts_nanos;
        slot.linktype = p.linktype;
        slot.orig_len = p.orig_len;
        slot.data.clear();
        slot.data.extend_from_slice(p.data);
    })
}

fn read_merged(
    files: &mut [FileReader],
    cuts: &mut [CutCount],
    deliver: &mut dyn FnMut(RawPacket<'_>),
) -> Result<(), CaptureError> {
    let mut slots: Vec<Pending> = Vec::with_capacity(files.len());
    let mut live = Vec::with_capacity(files.len());
    for file in files.iter_mut() {
        let mut slot = Pending {
            ts_nanos: 0,
            linktype: 0,
            orig_len: 0,
            data: Vec::new(),
        };
        live.push(fetch(file, &mut slot)?);
        slots.push(slot);
    }
    // Equal timestamps across files are ordered by each file's first packet,
    // so argument order never matters for a rotated set.
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by_key(|&i| {
        let first = match (live.get(i), slots.get(i)) {
            (Some(true), Some(s)) => s.ts_nanos,
            _ => i64::MAX,
        };
        (first, i)
    });
    let mut heap = BinaryHeap::with_capacity(files.len());
    for (rank, &i) in order.iter().enumerate() {
        if let (Some(true), Some(s)) = (live.get(i), slots.get(i)) {
            heap.push(Reverse((s.ts_nanos, rank, i)));
        }
    }
    while let Some(Reverse((_, rank, i))) = heap.pop() {
        let (Some(file), Some(slot)) = (files.get_mut(i), slots.get_mut(i)) else {
            continue;
        };
        let packet = RawPacket {
            ts_nanos: slot.ts_nanos,
            linktype: slot.linktype,
            data: &slot.data,
            orig_len: slot.orig_len,
        };
        if let Some(cut) = cuts.get_mut(i) {
            cut.note(&packet);
        }
        deliver(packet);
        if fetch(file, slot)? {
            heap.push(Reverse((slot.ts_nanos, rank, i)));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Per-file reading

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
/// Classic pcap magics as they appear on disk: µs LE, µs BE, ns LE, ns BE,
/// and the (little-endian only in pcap-parser) "modified" Kuznetzov format.
const PCAP_MAGICS: [[u8; 4]; 5] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
    [0x34, 0xcd, 0xb2, 0xa1],
];
const PCAP_HEADER_LEN: usize = 24;
/// libpcap's LT_LINKTYPE mask: the upper bits carry FCS information.
const LINKTYPE_MASK: u32 = 0x03FF_FFFF;
const PCAPNG_SHB_MIN_LEN: usize = 28;
/// Obsolete pcapng Packet Block (superseded by the EPB).
const PCAPNG_PB_TYPE: u32 = 2;
const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Wraps the input so the bytes read while sniffing the header are replayed
/// to pcap-parser, and so the real `io::Error` survives pcap-parser's
/// error mapping (it only reports `ReadError`).
struct Source {
    prefix: Vec<u8>,
    pos: usize,
    inner: Box<dyn Read>,
    last_error: Rc<Cell<Option<io::Error>>>,
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(rest) = self.prefix.get(self.pos..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.len());
            if let (Some(dst), Some(src)) = (buf.get_mut(..n), rest.get(..n)) {
                dst.copy_from_slice(src);
            }
            self.pos += n;
            if self.pos >= self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Ok(n);
        }
        loop {
            match self.inner.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let copy = io::Error::new(e.kind(), e.to_string());
                    self.last_error.set(Some(e));
                    return Err(copy);
                }
                ok => return ok,
            }
        }
    }
}

/// Reads until `buf` holds `want` bytes or the input ends.
fn fill_to(r: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> io::Result<()> {
    let missing = want.saturating_sub(buf.len()) as u64;
    r.take(missing).read_to_end(buf).map(|_| ())
}

#[derive(Debug, Clone, Copy)]
struct LegacyInfo {
    linktype: u32,
    nanos: bool,
    big_endian: bool,
    record_header: usize,
    snaplen: u32,
}

/// The largest caplen a classic pcap record of a file with `snaplen` can plausibly have:
/// libpcap never captures more than the snaplen, but some writers put a small snaplen in the
/// header (so up to 256 KiB is tolerated); 0 means no limit. A caplen above it is a corrupt
/// length: the reader skips to the next plausible record instead of trusting it.
pub(super) fn pcap_caplen_limit(snaplen: u32) -> u32 {
    if snaplen == 0 {
        u32::MAX
    } else {
        snaplen.max(262_144)
    }
}

/// Longest gap between the timestamps of a corrupt record's neighbours for a candidate record
/// to be taken as the next one.
const RESYNC_MAX_TS_GAP_SECS: i64 = 86_400;

/// pcapng block types a resynchronisation may land on.
const PCAPNG_KNOWN_BLOCKS: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0x0A, 0x0BAD, 0x4000_0BAD];

/// What scanning at one position found.
enum Candidate {
    Yes,
    No,
    /// Not decidable with the buffered bytes: this many are needed from the position.
    NeedMore(usize),
}

impl LegacyInfo {
    /// Delivers a classic pcap record as a packet; returns its timestamp.
    fn packet(&self, b: &LegacyPcapBlock<'_>, on_packet: &mut dyn FnMut(RawPacket<'_>)) -> i64 {
        let frac = i64::from(b.ts_usec);
        let frac = if self.nanos { frac } else { frac * 1000 };
        let ts = i64::from(b.ts_sec) * NANOS_PER_SEC + frac;
        on_packet(RawPacket {
            ts_nanos: ts,
            linktype: self.linktype,
            data: b.data,
            orig_len: b.origlen,
        });
        ts
    }
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    snaplen: u32,
    /// Timestamp units per second (from if_tsresol).
    units_per_sec: u128,
    /// if_tsoffset, seconds added to every timestamp.
    offset_secs: i64,
}

impl Interface {
    fn ts_nanos(&self, high: u32, low: u32) -> i64 {
        let raw = (u128::from(high) << 32) | u128::from(low);
        // raw < 2^64 and 1e9 < 2^30, so this cannot overflow a u128.
        let nanos = raw * 1_000_000_000 / self.units_per_sec.max(1);
        i64::try_from(nanos)
            .unwrap_or(i64::MAX)
            .saturating_add(self.offset_secs.saturating_mul(NANOS_PER_SEC))
    }
}

/// Units per second for an if_tsresol value: 10^-n, or 2^-n if the high bit
/// is set. (pcap-parser's `build_ts_resolution` rejects every 2^-n value, so
/// it is not used.)
fn ts_units_per_sec(tsresol: u8) -> Option<u128> {
    let exp = u32::from(tsresol & 0x7f);
    if tsresol & 0x80 == 0 {
        10u128.checked_pow(exp)
    } else {
        1u128.checked_shl(exp)
    }
}

#[derive(Debug, Default)]
struct NgInfo {
    big_endian: bool,
    interfaces: Vec<Interface>,
}

#[derive(Debug)]
enum Format {
    /// Classic pcap; `None` until the file header block has been seen.
    Legacy(Option<LegacyInfo>),
    Ng(NgInfo),
}

/// Per-file parsing state, kept apart from the reader so a block borrowed
/// from the reader can be handled while this is mutated.
#[derive(Debug)]
struct State {
    name: String,
    format: Format,
    /// Timestamp of the previous packet, for Simple Packet Blocks.
    last_ts: i64,
    bad_interface: u64,
    warnings: Vec<String>,
}

/// A mapped file is kept as its concrete type for the fast path in `next_packet`.
enum Reader {
    Mapped(MappedReader),
    Stream(Box<dyn PcapReaderIterator>),
}

impl Reader {
    fn iter(&mut self) -> &mut dyn PcapReaderIterator {
        match self {
            Reader::Mapped(m) => m,
            Reader::Stream(s) => s.as_mut(),
        }
    }
}

struct FileReader {
    state: State,
    /// `None` once the file is finished.
    reader: Option<Reader>,
    last_error: Rc<Cell<Option<io::Error>>>,
    capacity: usize,
    max_record: usize,
    truncated_at: Option<u64>,
    resyncs: Vec<Resync>,
    empty: bool,
    /// Length of a regular file, which bounds how large a record can be.
    file_len: Option<u64>,
}

/// What one `next()` call of the reader amounted to, without borrows.
enum Step {
    Packet,
    Other,
    NeedData,
    End,
    Cut,
    ReadFailed,
    Invalid(String),
}

impl FileReader {
    fn open(input: Input, limits: &Limits) -> Result<FileReader, CaptureError> {
        let Input {
            name,
            data: mut inner,
        } = input;
        let file_len = inner.len();
        let read_err = |source: io::Error| CaptureError::Read {
            path: name.clone(),
            offset: 0,
            source,
        };
        let mut head = Vec::new();
        fill_to(&mut inner, &mut head, 4).map_err(read_err)?;
        let mut file = FileReader {
            state: State {
                name: name.clone(),
                format: Format::Legacy(None),
                last_ts: 0,
                bad_interface: 0,
                warnings: Vec::new(),
            },
            reader: None,
            last_error: Rc::new(Cell::new(None)),
            capacity: limits.initial,
            max_record: limits.max_record,
            truncated_at: None,
            resyncs: Vec::new(),
            empty: false,
            file_len,
        };
        if head.is_empty() {
            file.empty = true;
            return Ok(file);
        }
        let is_pcapng = head.as_slice() == PCAPNG_MAGIC;
        let is_pcap = PCAP_MAGICS.iter().any(|m| head.as_slice() == m);
        if !is_pcap && !is_pcapng {
            let prefix_of_magic = head.len() < 4
                && (PCAPNG_MAGIC.starts_with(&head)
                    || PCAP_MAGICS.iter().any(|m| m.starts_with(&head)));
            if prefix_of_magic {
                file.truncated_at = Some(0);
                return Ok(file);
            }
            return Err(CaptureError::NotACapture { path: name, head });
        }
        // Pull in the whole file header so pcap-parser's one-shot header
        // check succeeds even on a pipe that delivers a few bytes at a time.
        let header_len = if is_pcapng {
            fill_to(&mut inner, &mut head, 12).map_err(read_err)?;
            match pcapng_shb_len(&head, limits.max_record) {
                Ok(Some(len)) => len,
                Ok(None) => PCAPNG_SHB_MIN_LEN,
                Err(e) => return Err(e.into_error(&name, 0)),
            }
        } else {
            PCAP_HEADER_LEN
        };
        fill_to(&mut inner, &mut head, header_len).map_err(read_err)?;
        if head.len() < header_len {
            file.truncated_at = Some(0);
            return Ok(file);
        }
        // +1: pcap-parser reports BufferTooSmall when a record fills the
        // buffer exactly.
        file.capacity = limits.initial.max(header_len + 1);
        if is_pcapng {
            file.state.format = Format::Ng(NgInfo::default());
        }
        let reader: Result<Reader, _> = match inner {
            InputData::File(f, len) => {
                MappedReader::open(f, len, file.capacity, is_pcapng).map(Reader::Mapped)
            }
            InputData::Stream(inner) => {
                let source = Source {
                    prefix: head,
                    pos: 0,
                    inner,
                    last_error: Rc::clone(&file.last_error),
                };
                if is_pcapng {
                    PcapNGReader::new(file.capacity, source).map(|r| Reader::Stream(Box::new(r)))
                } else {
                    LegacyPcapReader::new(file.capacity, source)
                        .map(|r| Reader::Stream(Box::new(r)))
                }
            }
        };
        match reader {
            Ok(r) => file.reader = Some(r),
            Err(e) => {
                return Err(CaptureError::Corrupt {
                    path: name,
                    offset: 0,
                    detail: describe(&e),
                });
            }
        }
        Ok(file)
    }

    /// [`FileReader::next_packet`], delivering every classic pcap record wholly inside the
    /// mapped window in one call: where packets follow each other in one file (not merged
    /// with others'), the general path's checks are made once per window, not per packet.
    /// (`next_packet`'s fast path, looped: one function for both cost 10 instructions per
    /// packet.)
    fn next_packets(
        &mut self,
        on_packet: &mut dyn FnMut(RawPacket<'_>),
    ) -> Result<bool, CaptureError> {
        if let Some(Reader::Mapped(mapped)) = self.reader.as_mut()
            && let Format::Legacy(Some(info)) = &self.state.format
        {
            let mut last_ts = None;
            while let Some(block) = mapped.next_legacy_record() {
                last_ts = Some(info.packet(&block, on_packet));
            }
            if let Some(ts) = last_ts {
                self.state.last_ts = ts;
                return Ok(true);
            }
        }
        self.next_packet(on_packet)
    }

    /// Delivers the next packet of this file, if any. `Ok(false)` means the
    /// file is finished (cleanly or truncated).
    fn next_packet(
        &mut self,
        on_packet: &mut dyn FnMut(RawPacket<'_>),
    ) -> Result<bool, CaptureError> {
        // Fast path: a classic pcap record wholly inside the mapped window. Anything else (the
        // file header, a record cut by the window or the file, an error) takes the general path.
        if let Some(Reader::Mapped(mapped)) = self.reader.as_mut()
            && let Format::Legacy(Some(info)) = &self.state.format
            && let Some(block) = mapped.next_legacy_record()
        {
            self.state.last_ts = info.packet(&block, on_packet);
            return Ok(true);
        }
        let mut stalled = 0u32;
        loop {
            let Some(reader) = self.reader.as_mut().map(Reader::iter) else {
                return Ok(false);
            };
            let offset = reader.consumed() as u64;
            if self.state.corrupt_length(reader.data(), self.max_record) {
                self.resync(offset)?;
                stalled = 0;
                continue;
            }
            let Some(reader) = self.reader.as_mut().map(Reader::iter) else {
                return Ok(false);
            };
            let mut used = 0;
            let step = match reader.next() {
                Ok((len, block)) => {
                    used = len;
                    match self.state.handle(block, on_packet) {
                        Ok(true) => Step::Packet,
                        Ok(false) => Step::Other,
                        Err(detail) => Step::Invalid(detail),
                    }
                }
                Err(PcapError::Eof) => Step::End,
                Err(PcapError::UnexpectedEof) => Step::Cut,
                Err(PcapError::Incomplete(_) | PcapError::BufferTooSmall) => Step::NeedData,
                Err(PcapError::ReadError) => Step::ReadFailed,
                Err(e) => Step::Invalid(describe(&e)),
            };
            match step {
                Step::Packet => {
                    reader.consume_noshift(used);
                    return Ok(true);
                }
                Step::Other => {
                    reader.consume_noshift(used);
                    stalled = 0;
                }
                Step::End => {
                    self.reader = None;
                    return Ok(false);
                }
                Step::Cut => {
                    // The reader hit EOF inside a record. Tell a record that
                    // is really cut short from one that is all there but
                    // inconsistent (pcap-parser says "incomplete" for both).
                    let have = reader.data().len();
                    if have == 0 {
                        self.reader = None;
                        return Ok(false);
                    }
                    if let Ok(Some(need)) = self.state.record_len(reader.data())
                        && have >= need
                    {
                        return Err(self.corrupt(offset, "record contents overrun its length"));
                    }
                    self.truncated_at = Some(offset);
                    self.reader = None;
                    return Ok(false);
                }
                Step::NeedData => {
                    let before = reader.data().len();
                    self.make_room(offset)?;
                    let Some(reader) = self.reader.as_mut().map(Reader::iter) else {
                        return Ok(false);
                    };
                    if reader.refill().is_err() {
                        return Err(self.read_error(offset));
                    }
                    if reader.data().len() == before && !reader.reader_exhausted() {
                        stalled += 1;
                        if stalled > 3 {
                            return Err(self.corrupt(offset, "reader made no progress"));
                        }
                    } else {
                        stalled = 0;
                    }
                }
                Step::ReadFailed => return Err(self.read_error(offset)),
                Step::Invalid(detail) => {
                    return Err(CaptureError::Corrupt {
                        path: self.state.name.clone(),
                        offset,
                        detail,
                    });
                }
            }
        }
    }

    /// The record at `offset` has a corrupt length: skips to the next plausible record (or the
    /// end of the file), recording what was skipped. Works on the buffered bytes and refills,
    /// so mapped files and streams skip the same bytes.
    fn resync(&mut self, offset: u64) -> Result<(), CaptureError> {
        let step = match self.state.format {
            Format::Ng(_) => 4,
            Format::Legacy(_) => 1,
        };
        let mut skipped = 0u64;
        // The corrupt record's own position is not a candidate.
        let mut start = step;
        let mut stalled = 0u32;
        while let Some(reader) = self.reader.as_mut().map(Reader::iter) {
            let exhausted = reader.reader_exhausted();
            let data = reader.data();
            let mut i = start.min(data.len());
            start = 0;
            let mut need = None;
            let mut found = false;
            while i < data.len() {
                match self.state.candidate(
                    data.get(i..).unwrap_or_default(),
                    exhausted,
                    self.max_record,
                ) {
                    Candidate::Yes => {
                        found = true;
                        break;
                    }
                    Candidate::NeedMore(n) => {
                        need = Some(n);
                        break;
                    }
                    Candidate::No => i += step,
                }
            }
            let i = i.min(data.len());
            reader.consume_noshift(i);
            skipped += i as u64;
            if found {
                self.record_resync(offset, Some(offset + skipped), skipped);
                return Ok(());
            }
            if exhausted && need.is_none() {
                // Nothing plausible up to the end of the file.
                self.record_resync(offset, None, skipped);
                return Ok(());
            }
            let want = need.unwrap_or(0);
            if want >= self.capacity {
                let grown = want
                    .saturating_add(1)
                    .max(self.capacity.saturating_mul(2))
                    .min(self.max_record.saturating_add(64));
                reader.grow(grown);
                self.capacity = grown;
            }
            let before = reader.data().len();
            if reader.refill().is_err() {
                return Err(self.read_error(offset + skipped));
            }
            let Some(reader) = self.reader.as_mut().map(Reader::iter) else {
                break;
            };
            if reader.data().len() <= before && !reader.reader_exhausted() {
                stalled += 1;
                if stalled > 3 {
                    return Err(self.corrupt(offset + skipped, "reader made no progress"));
                }
            } else {
                stalled = 0;
            }
        }
        self.record_resync(offset, None, skipped);
        Ok(())
    }

    fn record_resync(&mut self, offset: u64, resumed_at: Option<u64>, skipped: u64) {
        self.resyncs.push(Resync {
            path: self.state.name.clone(),
            offset,
            resumed_at,
            skipped,
        });
    }

    /// Before a refill: make sure the pending record can fit in the buffer,
    /// and reject records that are absurdly large or self-inconsistent.
    fn make_room(&mut self, offset: u64) -> Result<(), CaptureError> {
        let Some(reader) = self.reader.as_mut().map(Reader::iter) else {
            return Ok(());
        };
        let have = reader.data().len();
        let need = match self.state.record_len(reader.data()) {
            Ok(Some(need)) => need,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e.into_error(&self.state.name, offset)),
        };
        if need > self.max_record {
            return Err(CaptureError::RecordTooLarge {
                path: self.state.name.clone(),
                offset,
                len: need as u64,
                limit: self.max_record as u64,
            });
        }
        if have >= need {
            // The whole record is buffered yet the parser wants more: its
            // inner lengths disagree with the block length.
            return Err(self.corrupt(offset, "record contents overrun its length"));
        }
        if self
            .file_len
            .is_some_and(|len| offset.saturating_add(need as u64) > len)
        {
            // The record claims to run past the end of the file: it is cut short. Don't grow
            // a buffer for bytes that cannot come (a 56-byte file must not cost 250 MB).
            self.truncated_at = Some(offset);
            self.reader = None;
            return Ok(());
        }
        if need >= self.capacity {
            let grown = need
                .saturating_add(1)
                .max(self.capacity.saturating_mul(2))
                .min(self.max_record.saturating_add(1));
            reader.grow(grown);
            self.capacity = grown;
        }
        Ok(())
    }

    fn corrupt(&self, offset: u64, detail: &str) -> CaptureError {
        CaptureError::Corrupt {
            path: self.state.name.clone(),
            offset,
            detail: detail.to_string(),
        }
    }

    fn read_error(&self, offset: u64) -> CaptureError {
        let source = self
            .last_error
            .take()
            .unwrap_or_else(|| io::Error::other("read failed"));
        CaptureError::Read {
            path: self.state.name.clone(),
            offset,
            source,
        }
    }

    fn report(&self, summary: &mut ReadSummary) {
        let name = &self.state.name;
        if self.empty {
            summary
                .warnings
                .push(format!("{name}: empty file, no packets"));
        }
        if let Some(offset) = self.truncated_at {
            summary.truncations.push(Truncation {
                path: name.clone(),
                offset,
            });
        }
        summary.resyncs.extend(self.resyncs.iter().cloned());
        summary.warnings.extend(self.state.warnings.iter().cloned());
        if self.state.bad_interface > 0 {
            summary.warnings.push(format!(
                "{name}: skipped {} packet(s) naming an undefined interface",
                self.state.bad_interface
            ));
        }
    }
}

/// Problems found while sizing a record from its header.
enum SizeError {
    Corrupt(&'static str),
    TooLarge(u64, u64),
}

impl SizeError {
    fn into_error(self, name: &str, offset: u64) -> CaptureError {
        match self {
            SizeError::Corrupt(detail) => CaptureError::Corrupt {
                path: name.to_string(),
                offset,
                detail: detail.to_string(),
            },
            SizeError::TooLarge(len, limit) => CaptureError::RecordTooLarge {
                path: name.to_string(),
                offset,
                len,
                limit,
            },
        }
    }
}

/// The shortest well-formed block of pcapng type `kind` (header, fixed fields, trailer): a
/// resynchronisation candidate shorter than that is payload bytes that happen to match.
fn pcapng_min_len(kind: u32) -> usize {
    match kind {
        0x0000_0001 => 20, // interface description
        0x0000_0006 => 32, // enhanced packet
        0x0000_0003 => 16, // simple packet
        0x0000_0002 => 32, // obsolete packet
        0x0000_0005 => 28, // interface statistics
        0x0000_0004 => 16, // name resolution
        _ => 12,
    }
}

fn u32_at(data: &[u8], at: usize, big_endian: bool) -> Option<u32> {
    let b: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big_endian {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    })
}

fn u16_at(data: &[u8], at: usize, big_endian: bool) -> Option<u16> {
    let b: [u8; 2] = data.get(at..at.checked_add(2)?)?.try_into().ok()?;
    Some(if big_endian {
        u16::from_be_bytes(b)
    } else {
        u16::from_le_bytes(b)
    })
}

/// Length of a pcapng Section Header Block from its first 12 bytes (the
/// byte-order magic says how to read the length). `Ok(None)`: not enough bytes.
fn pcapng_shb_len(head: &[u8], max_record: usize) -> Result<Option<usize>, SizeError> {
    let big_endian = match head.get(8..12) {
        None => return Ok(None),
        Some([0x1a, 0x2b, 0x3c, 0x4d]) => true,
        Some([0x4d, 0x3c, 0x2b, 0x1a]) => false,
        Some(_) => return Err(SizeError::Corrupt("bad byte-order magic in section header")),
    };
    let Some(len) = u32_at(head, 4, big_endian) else {
        return Ok(None);
    };
    let len = len as usize;
    if len < PCAPNG_SHB_MIN_LEN || !len.is_multiple_of(4) {
        return Err(SizeError::Corrupt("invalid section header length"));
    }
    if len > max_record {
        return Err(SizeError::TooLarge(len as u64, max_record as u64));
    }
    Ok(Some(len))
}

fn describe(e: &PcapError<&[u8]>) -> String {
    // PcapError's Display dumps the whole remaining input for parser errors.
    match e {
        PcapError::NomError(_, kind) | PcapError::OwnedNomError(_, kind) => {
            format!("malformed block ({kind:?} check failed)")
        }
        PcapError::HeaderNotRecognized => "header not recognized".to_string(),
        other => other.to_string(),
    }
}

impl State {
    /// Total size of the record starting at `data[0]`, from its header.
    fn record_len(&self, data: &[u8]) -> Result<Option<usize>, SizeError> {
        match &self.format {
            Format::Legacy(None) => Ok(None),
            Format::Legacy(Some(info)) => Ok(u32_at(data, 8, info.big_endian)
                .map(|caplen| info.record_header.saturating_add(caplen as usize))),
            Format::Ng(ng) => {
                if data.get(..4) == Some(&PCAPNG_MAGIC[..]) {
                    return pcapng_shb_len(data, usize::MAX);
                }
                let Some(len) = u32_at(data, 4, ng.big_endian) else {
                    return Ok(None);
                };
                if len < 12 {
                    return Err(SizeError::Corrupt("block length below minimum"));
                }
                Ok(Some(len as usize))
            }
        }
    }

    /// Whether the record at `data[0]` has a length no sane writer produces (a pcap caplen
    /// above the snaplen, a pcapng block longer than any record may be). Decided from the
    /// record header alone, so the mapped and streaming paths agree at every window size.
    fn corrupt_length(&self, data: &[u8], max_record: usize) -> bool {
        match &self.format {
            Format::Legacy(None) => false,
            Format::Legacy(Some(info)) => u32_at(data, 8, info.big_endian)
                .is_some_and(|caplen| caplen > pcap_caplen_limit(info.snaplen)),
            Format::Ng(ng) => {
                data.get(..4) != Some(&PCAPNG_MAGIC[..])
                    && u32_at(data, 4, ng.big_endian).is_some_and(|len| len as usize > max_record)
            }
        }
    }

    /// A classic pcap record header that could be the next record: its caplen, or `None`.
    fn plausible_pcap_header(&self, info: &LegacyInfo, h: &[u8]) -> Option<u32> {
        let be = info.big_endian;
        let (sec, frac) = (u32_at(h, 0, be)?, u32_at(h, 4, be)?);
        let (caplen, origlen) = (u32_at(h, 8, be)?, u32_at(h, 12, be)?);
        let frac_limit = if info.nanos { 1_000_000_000 } else { 1_000_000 };
        let near = self.last_ts == 0
            || (i64::from(sec) - self.last_ts.div_euclid(NANOS_PER_SEC)).abs()
                <= RESYNC_MAX_TS_GAP_SECS;
        (frac < frac_limit
            && caplen <= pcap_caplen_limit(info.snaplen)
            && caplen <= origlen
            && near)
            .then_some(caplen)
    }

    /// Whether `data` (from a scanned position to the end of the buffered bytes) starts with a
    /// plausible record: pcap, a header with a near timestamp and caplen within the snaplen and
    /// the original length, followed by another such header or the end of the file; pcapng, a
    /// known block type whose leading and trailing lengths match.
    fn candidate(&self, data: &[u8], exhausted: bool, max_record: usize) -> Candidate {
        let undecided = |n: usize| {
            if exhausted {
                Candidate::No
            } else {
                Candidate::NeedMore(n)
            }
        };
        match &self.format {
            Format::Legacy(None) => Candidate::No,
            Format::Legacy(Some(info)) => {
                let hl = info.record_header;
                if data.len() < hl {
                    return undecided(hl);
                }
                let Some(caplen) = self.plausible_pcap_header(info, data) else {
                    return Candidate::No;
                };
                let end = hl.saturating_add(caplen as usize);
                if end > max_record {
                    return Candidate::No;
                }
                match data.get(end..) {
                    None => undecided(end.saturating_add(hl)),
                    Some(rest) if rest.len() < hl => {
                        if exhausted {
                            // The record ends the file, or a cut header follows it.
                            Candidate::Yes
                        } else {
                            Candidate::NeedMore(end + hl)
                        }
                    }
                    Some(rest) => match self.plausible_pcap_header(info, rest) {
                        Some(_) => Candidate::Yes,
                        None => Candidate::No,
                    },
                }
            }
            Format::Ng(ng) => {
                if data.len() < 12 {
                    return undecided(12);
                }
                let (big_endian, min) = if data.get(..4) == Some(&PCAPNG_MAGIC[..]) {
                    match data.get(8..12) {
                        Some([0x1a, 0x2b, 0x3c, 0x4d]) => (true, PCAPNG_SHB_MIN_LEN),
                        Some([0x4d, 0x3c, 0x2b, 0x1a]) => (false, PCAPNG_SHB_MIN_LEN),
                        _ => return Candidate::No,
                    }
                } else {
                    let Some(kind) =
                        u32_at(data, 0, ng.big_endian).filter(|t| PCAPNG_KNOWN_BLOCKS.contains(t))
                    else {
                        return Candidate::No;
                    };
                    (ng.big_endian, pcapng_min_len(kind))
                };
                let Some(len) = u32_at(data, 4, big_endian).map(|l| l as usize) else {
                    return Candidate::No;
                };
                if len < min || !len.is_multiple_of(4) || len > max_record {
                    return Candidate::No;
                }
                if data.len() < len {
                    return undecided(len);
                }
                if u32_at(data, len - 4, big_endian) == Some(len as u32) {
                    Candidate::Yes
                } else {
                    Candidate::No
                }
            }
        }
    }

    /// Handles one block; `Ok(true)` if a packet was delivered.
    fn handle(
        &mut self,
        block: PcapBlockOwned<'_>,
        on_packet: &mut dyn FnMut(RawPacket<'_>),
    ) -> Result<bool, String> {
        match block {
            PcapBlockOwned::LegacyHeader(h) => {
                self.format = Format::Legacy(Some(LegacyInfo {
                    linktype: (h.network.0 as u32) & LINKTYPE_MASK,
                    nanos: h.is_nanosecond_precision(),
                    big_endian: h.is_bigendian(),
                    record_header: if h.is_modified_format() { 24 } else { 16 },
                    snaplen: h.snaplen,
                }));
                Ok(false)
            }
            PcapBlockOwned::Legacy(b) => {
                let Format::Legacy(Some(info)) = &self.format else {
                    return Err("packet record before file header".to_string());
                };
                self.last_ts = info.packet(&b, on_packet);
                Ok(true)
            }
            PcapBlockOwned::NG(block) => self.handle_ng(block, on_packet),
        }
    }

    fn handle_ng(
        &mut self,
        block: Block<'_>,
        on_packet: &mut dyn FnMut(RawPacket<'_>),
    ) -> Result<bool, String> {
        let Format::Ng(ng) = &mut self.format else {
            return Err("pcapng block in a pcap file".to_string());
        };
        match block {
            Block::SectionHeader(shb) => {
                // A new section starts a new interface list.
                ng.big_endian = shb.big_endian();
                ng.interfaces.clear();
                Ok(false)
            }
            Block::InterfaceDescription(idb) => {
                let iface = interface_from(&idb, ng.big_endian);
                let iface = match iface {
                    Ok(i) => i,
                    Err(i) => {
                        self.warnings.push(format!(
                            "{}: interface {} has an invalid if_tsresol ({}), assuming microseconds",
                            self.name,
                            ng.interfaces.len(),
                            idb.if_tsresol
                        ));
                        i
                    }
                };
                ng.interfaces.push(iface);
                Ok(false)
            }
            Block::EnhancedPacket(epb) => {
                let Some(iface) = ng.interfaces.get(epb.if_id as usize) else {
                    self.bad_interface += 1;
                    return Ok(false);
                };
                let ts = iface.ts_nanos(epb.ts_high, epb.ts_low);
                self.last_ts = ts;
                on_packet(epb_packet(&epb, iface, ts));
                Ok(true)
            }
            Block::SimplePacket(spb) => {
                let Some(iface) = ng.interfaces.first() else {
                    self.bad_interface += 1;
                    return Ok(false);
                };
                on_packet(spb_packet(&spb, iface, self.last_ts));
                Ok(true)
            }
            Block::Unknown(ub) => {
                let block_type = if ng.big_endian {
                    ub.block_type.swap_bytes()
                } else {
                    ub.block_type
                };
                if block_type != PCAPNG_PB_TYPE {
                    return Ok(false);
                }
                let Some(pb) = ObsoletePacket::parse(&ub, ng.big_endian) else {
                    return Err("malformed packet block".to_string());
                };
                let Some(iface) = ng.interfaces.get(usize::from(pb.if_id)) else {
                    self.bad_interface += 1;
                    return Ok(false);
                };
                let ts = iface.ts_nanos(pb.ts_high, pb.ts_low);
                self.last_ts = ts;
                on_packet(RawPacket {
                    ts_nanos: ts,
                    linktype: iface.linktype,
                    data: pb.data,
                    orig_len: pb.orig_len,
                });
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// `Err` carries a usable fallback (µs) when if_tsresol is out of range.
fn interface_from(
    idb: &InterfaceDescriptionBlock<'_>,
    big_endian: bool,
) -> Result<Interface, Interface> {
    // pcap-parser decodes if_tsoffset as little-endian whatever the section
    // byte order, so it is read from the raw option here.
    let offset_secs = idb
        .options
        .iter()
        .find(|o| o.code == OptionCode::IfTsoffset)
        .and_then(|o| {
            let b: [u8; 8] = o.value().get(..8)?.try_into().ok()?;
            Some(if big_endian {
                i64::from_be_bytes(b)
            } else {
                i64::from_le_bytes(b)
            })
        })
        .unwrap_or(0);
    let mut iface = Interface {
        linktype: u32::from(idb.linktype.0 as u16),
        snaplen: idb.snaplen,
        units_per_sec: 1_000_000,
        offset_secs,
    };
    match ts_units_per_sec(idb.if_tsresol) {
        Some(units) if units > 0 => {
            iface.units_per_sec = units;
            Ok(iface)
        }
        _ => Err(iface),
    }
}

fn epb_packet<'a>(epb: &EnhancedPacketBlock<'a>, iface: &Interface, ts: i64) -> RawPacket<'a> {
    let caplen = epb.caplen as usize;
    // packet_data() borrows from the block itself; slice the data directly
    // so the packet outlives the block struct.
    let data = epb.data.get(..caplen).unwrap_or(epb.data);
    RawPacket {
        ts_nanos: ts,
        linktype: iface.linktype,
        data,
        orig_len: epb.orig_len(),
    }
}

fn spb_packet<'a>(spb: &SimplePacketBlock<'a>, iface: &Interface, ts: i64) -> RawPacket<'a> {
    // An SPB stores min(orig_len, snaplen) bytes plus padding.
    let mut caplen = spb.origlen as usize;
    if iface.snaplen != 0 {
        caplen = caplen.min(iface.snaplen as usize);
    }
    let data = spb.data.get(..caplen).unwrap_or(spb.data);
    RawPacket {
        ts_nanos: ts,
        linktype: iface.linktype,
        data,
        orig_len: spb.origlen,
    }
}

/// Obsolete pcapng Packet Block (type 2), which pcap-parser only exposes as
/// an unknown block: if_id u16, drops u16, ts_high, ts_low, caplen, origlen,
/// then the data.
struct ObsoletePacket<'a> {
    if_id: u16,
    ts_high: u32,
    ts_low: u32,
    orig_len: u32,
    data: &'a [u8],
}

impl<'a> ObsoletePacket<'a> {
    fn parse(ub: &UnknownBlock<'a>, big_endian: bool) -> Option<ObsoletePacket<'a>> {
        let body = ub.data;
        let caplen = u32_at(body, 12, big_endian)? as usize;
        Some(ObsoletePacket {
            if_id: u16_at(body, 0, big_endian)?,
            ts_high: u32_at(body, 4, big_endian)?,
            ts_low: u32_at(body, 8, big_endian)?,
            orig_len: u32_at(body, 16, big_endian)?,
            data: body.get(20..20usize.checked_add(caplen)?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::Path;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Pkt {
        ts: i64,
        linktype: u32,
        data: Vec<u8>,
        orig_len: u32,
    }

    fn pkt(ts: i64, linktype: u32, data: &[u8], orig_len: u32) -> Pkt {
        Pkt {
            ts,
            linktype,
            data: data.to_vec(),
            orig_len,
        }
    }

    const SEC: i64 = 1_000_000_000;

    // ---- writers (mcptap-testkit, with the options these tests always wrote) ----

    use mcptap_testkit::capture::{
        ByteOrder, PcapHeader, PcapWriter, PcapngOption, PcapngWriter, SNAPLEN,
    };

    fn byte_order(big_endian: bool) -> ByteOrder {
        if big_endian {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        }
    }

    /// Classic pcap. `records`: (ts_sec, ts_frac, data, orig_len).
    fn pcap(
        nanos: bool,
        big_endian: bool,
        linktype: u32,
        records: &[(u32, u32, &[u8], u32)],
    ) -> Vec<u8> {
        let header = PcapHeader {
            nanos,
            byte_order: byte_order(big_endian),
            linktype,
            snaplen: SNAPLEN,
        };
        let mut w = PcapWriter::new(Vec::new(), header).expect("into a Vec");
        for &(sec, frac, data, orig) in records {
            w.write_record(sec, frac, data, orig).expect("into a Vec");
        }
        w.into_inner()
    }

    type Ng = PcapngWriter;

    // Every block carries an option (application name, interface name, comment), so option
    // parsing is exercised everywhere.
    const SHB_OPTIONS: &[PcapngOption<'static>] = &[PcapngOption::UserApplication("mcptap-test")];
    const EPB_OPTIONS: &[PcapngOption<'static>] = &[PcapngOption::Comment("a comment")];

    fn idb_options(tsresol: Option<u8>, tsoffset: Option<i64>) -> Vec<PcapngOption<'static>> {
        let mut opts = vec![PcapngOption::InterfaceName("eth0")];
        opts.extend(tsresol.map(PcapngOption::TsResolution));
        opts.extend(tsoffset.map(PcapngOption::TsOffset));
        opts
    }

    // ---- harness ---------------------------------------------------------

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
        let path = dir.join(name);
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn run(paths: &[String]) -> (Vec<Pkt>, Result<ReadSummary, CaptureError>) {
        let mut got = Vec::new();
        let res = read_captures(paths, &mut |p| {
            got.push(pkt(p.ts_nanos, p.linktype, p.data, p.orig_len))
        });
        (got, res)
    }

    fn run_inputs(
        inputs: Vec<Input>,
        limits: Limits,
    ) -> (Vec<Pkt>, Result<ReadSummary, CaptureError>) {
        let mut got = Vec::new();
        let res = read_inputs(inputs, &limits, &mut |p| {
            got.push(pkt(p.ts_nanos, p.linktype, p.data, p.orig_len))
        });
        (got, res)
    }

    /// Hands out at most a few bytes per read, like a pipe under load.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.step = self.step % 7 + 1;
            let n = self.step.min(buf.len()).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    fn trickle(name: &str, data: Vec<u8>) -> Input {
        Input {
            name: name.to_string(),
            data: InputData::Stream(Box::new(Trickle {
                data,
                pos: 0,
                step: 0,
            })),
        }
    }

    /// A stream that hands out as much as asked: the reference for large captures, where
    /// `trickle` would take millions of reads.
    fn in_memory(name: &str, data: Vec<u8>) -> Input {
        Input {
            name: name.to_string(),
            data: InputData::Stream(Box::new(io::Cursor::new(data))),
        }
    }

    fn tiny() -> Limits {
        Limits {
            initial: 64,
            max_record: 1 << 20,
        }
    }

    fn frame(n: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| n.wrapping_add(i as u8)).collect()
    }

    // ---- tests -----------------------------------------------------------

    #[test]
    fn pcap_microseconds_little_endian() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (frame(1, 60), frame(2, 40));
        let bytes = pcap(
            false,
            false,
            1,
            &[
                (1_700_000_000, 123_456, &a, 60),
                (1_700_000_001, 999_999, &b, 1514),
            ],
        );
        assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        let path = write(dir.path(), "us-le.pcap", &bytes);
        let (got, res) = run(&[path]);
        let s = res.unwrap();
        assert_eq!(
            got,
            vec![
                pkt(1_700_000_000 * SEC + 123_456_000, 1, &a, 60),
                pkt(1_700_000_001 * SEC + 999_999_000, 1, &b, 1514),
            ]
        );
        assert_eq!((s.files, s.packets, s.bytes), (1, 2, 100));
        assert!(s.truncations.is_empty() && s.warnings.is_empty());
    }

    #[test]
    fn pcap_nanoseconds_big_endian() {
        let dir = tempfile::tempdir().unwrap();
        let a = frame(3, 48);
        let bytes = pcap(true, true, 101, &[(1_700_000_000, 123_456_789, &a, 48)]);
        assert_eq!(&bytes[..4], &[0xa1, 0xb2, 0x3c, 0x4d]);
        let path = write(dir.path(), "ns-be.pcap", &bytes);
        let (got, res) = run(&[path]);
        res.unwrap();
        assert_eq!(
            got,
            vec![pkt(1_700_000_000 * SEC + 123_456_789, 101, &a, 48)]
        );
    }

    #[test]
    fn pcap_linktype_fcs_bits_are_masked() {
        let a = frame(3, 20);
        let bytes = pcap(false, false, 0x1400_0001, &[(1, 0, &a, 20)]);
        let (got, res) = run_inputs(vec![trickle("fcs.pcap", bytes)], tiny());
        res.unwrap();
        assert_eq!(got[0].linktype, 1);
    }

    fn two_section_pcapng() -> (Vec<u8>, Vec<Pkt>) {
        let (a, b, c, d) = (frame(10, 61), frame(20, 33), frame(30, 20), frame(40, 7));
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 65535, &idb_options(Some(9), None)) // ns
            .interface(113, 65535, &idb_options(None, Some(100))) // default µs, +100 s
            .enhanced_packet(0, 1_700_000_000_123_456_789, &a, 61, EPB_OPTIONS)
            .block(0x0BAD_F00D, &[1, 2, 3, 4]) // unknown block: skipped
            .enhanced_packet(1, 1_700_000_000_654_321, &b, 1500, EPB_OPTIONS)
            .section(ByteOrder::Big, SHB_OPTIONS)
            .interface(276, 65535, &idb_options(Some(0x80 | 20), Some(-1))) // 2^-20 s, -1 s
            .enhanced_packet(0, (3 << 20) + (1 << 19), &c, 20, EPB_OPTIONS) // 3.5 units-seconds
            .enhanced_packet(1, 5, &d, 7, EPB_OPTIONS) // interface 1 no longer exists
            .enhanced_packet(0, 1 << 20, &d, 7, EPB_OPTIONS);
        let want = vec![
            pkt(1_700_000_000 * SEC + 123_456_789, 1, &a, 61),
            pkt(1_700_000_100 * SEC + 654_321_000, 113, &b, 1500),
            pkt(2 * SEC + SEC / 2, 276, &c, 20),
            pkt(0, 276, &d, 7),
        ];
        (ng.bytes(), want)
    }

    #[test]
    fn pcapng_sections_interfaces_and_resolutions() {
        let dir = tempfile::tempdir().unwrap();
        let (bytes, want) = two_section_pcapng();
        let path = write(dir.path(), "two.pcapng", &bytes);
        let (got, res) = run(std::slice::from_ref(&path));
        let s = res.unwrap();
        assert_eq!(got, want);
        assert_eq!(s.packets, 4);
        assert_eq!(
            s.warnings,
            vec![format!(
                "{path}: skipped 1 packet(s) naming an undefined interface"
            )]
        );
    }

    #[test]
    fn pcapng_through_a_trickling_pipe_with_tiny_buffer() {
        let (bytes, want) = two_section_pcapng();
        let (got, res) = run_inputs(vec![trickle("<stdin>", bytes)], tiny());
        res.unwrap();
        assert_eq!(got, want);
        let a = frame(1, 300);
        let bytes = pcap(true, false, 1, &[(1, 5, &a, 300), (2, 6, &a, 300)]);
        let (got, res) = run_inputs(vec![trickle("<stdin>", bytes)], tiny());
        assert_eq!(res.unwrap().packets, 2);
        assert_eq!(got[1], pkt(2 * SEC + 6, 1, &a, 300));
    }

    fn mapped(dir: &Path, name: &str, bytes: &[u8]) -> Input {
        let path = write(dir, name, bytes);
        Input {
            name: name.to_string(),
            data: InputData::File(File::open(path).unwrap(), bytes.len() as u64),
        }
    }

    /// Packets, then truncations and warnings or the error message.
    type Outcome = (Vec<Pkt>, Result<(Vec<Truncation>, Vec<String>), String>);

    /// What a read amounted to, comparable across the two paths.
    fn outcome((got, res): (Vec<Pkt>, Result<ReadSummary, CaptureError>)) -> Outcome {
        let res = res
            .map(|s| (s.truncations, s.warnings))
            .map_err(|e| e.to_string());
        (got, res)
    }

    #[test]
    fn mapped_files_read_exactly_like_streams_at_every_cut() {
        let dir = tempfile::tempdir().unwrap();
        let a = frame(1, 300);
        let mut spb = Ng::default();
        spb.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 8, &idb_options(Some(9), None))
            .simple_packet(20, &a[..8])
            .obsolete_packet(0, 7, &a[..13]);
        let captures = [
            two_section_pcapng().0,
            spb.bytes(),
            pcap(true, false, 1, &[(1, 5, &a, 300), (2, 6, &a[..10], 300)]),
            pcap(false, true, 101, &[(1, 0, &a[..50], 50), (3, 9, &a, 300)]),
        ];
        for (n, bytes) in captures.iter().enumerate() {
            for cut in 0..=bytes.len() {
                let part = &bytes[..cut];
                // Windows from 1 byte (every record straddles one) to larger than the file.
                for window in [1, 64, 4096] {
                    let limits = Limits {
                        initial: window,
                        max_record: 1 << 20,
                    };
                    let streamed = outcome(run_inputs(vec![trickle("c", part.to_vec())], tiny()));
                    let name = format!("c{n}-{cut}");
                    let input = mapped(dir.path(), &name, part);
                    let mut via_map = outcome(run_inputs(vec![input], limits));
                    // Same file, another name: align the messages before comparing.
                    if let Err(e) = &mut via_map.1 {
                        *e = e.replacen(&name, "c", 1);
                    }
                    if let Ok((t, w)) = &mut via_map.1 {
                        t.iter_mut().for_each(|t| t.path = "c".into());
                        w.iter_mut().for_each(|w| *w = w.replacen(&name, "c", 1));
                    }
                    assert_eq!(via_map, streamed, "capture {n}, cut {cut}, window {window}");
                }
            }
        }
    }

    /// Windows of the real size start on huge-page boundaries, so every window after the
    /// first begins some way before the first unconsumed record: records straddling window
    /// and huge-page boundaries, and files cut anywhere near one, read as streamed.
    #[test]
    fn huge_page_aligned_windows_read_exactly_like_streams() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [1usize, 60, 1514, 9000, 65_535, 333, 4093];
        let payloads: Vec<Vec<u8>> = (0..1_500)
            .map(|i| frame(i as u8, sizes[i % sizes.len()]))
            .collect();
        let records: Vec<(u32, u32, &[u8], u32)> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32, 0, p.as_slice(), p.len() as u32))
            .collect();
        let bytes = pcap(false, false, 1, &records);
        assert!(
            bytes.len() > 3 * SINGLE_FILE_BUFFER,
            "spans several windows"
        );
        let limits = || Limits {
            initial: SINGLE_FILE_BUFFER,
            max_record: MAX_RECORD,
        };
        let huge = mapped::HUGE_PAGE;
        for cut in [
            bytes.len(),
            bytes.len() - 1,
            SINGLE_FILE_BUFFER + 5,
            2 * huge + 17,
            3 * huge - 3,
            2 * SINGLE_FILE_BUFFER + huge / 2,
        ] {
            let part = &bytes[..cut];
            let streamed = outcome(run_inputs(vec![in_memory("c", part.to_vec())], limits()));
            let name = format!("h{cut}");
            let mut via_map = outcome(run_inputs(vec![mapped(dir.path(), &name, part)], limits()));
            if let Ok((t, _)) = &mut via_map.1 {
                t.iter_mut().for_each(|t| t.path = "c".into());
            }
            assert_eq!(via_map, streamed, "cut {cut}");
        }
    }

    /// A window grown for a large record is still widened to a huge-page boundary; the bytes
    /// past the window must stay out of the parsers' reach, or a record over the size limit
    /// that lies there would be accepted where the stream reader refuses it.
    #[test]
    fn grown_aligned_windows_keep_the_record_size_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mib = 1 << 20;
        let first = frame(1, 4 * mib + 600 * 1024);
        let filler = frame(2, 1000);
        let small = frame(3, 100);
        let over = frame(4, 5 * mib + mib / 2);
        // Fillers, then one sized so that the small record starts 50 bytes before 6 MiB and
        // straddles it: the refill it causes maps up to 8 MiB past a 4 MiB base.
        let fillers = (6 * mib - 50 - (24 + 16 + first.len())) / (16 + filler.len()) - 1;
        let at = 24 + 16 + first.len() + fillers * (16 + filler.len());
        let pad = frame(5, 6 * mib - 50 - at - 16);
        let mut records: Vec<(u32, u32, &[u8], u32)> = vec![(1, 0, &first, first.len() as u32)];
        records.extend((0..fillers).map(|_| (2, 0, filler.as_slice(), 1000)));
        records.push((2, 0, &pad, pad.len() as u32));
        records.push((3, 0, &small, 100));
        records.push((4, 0, &over, over.len() as u32));
        let mut bytes = pcap(false, false, 1, &records);
        // Records above any snaplen are corrupt lengths unless the header sets none (0).
        bytes[16..20].copy_from_slice(&0u32.to_le_bytes());
        let limits = || Limits {
            initial: 4 * mib,
            max_record: 5 * mib,
        };
        let streamed = outcome(run_inputs(vec![in_memory("c", bytes.clone())], limits()));
        let via_map = outcome(run_inputs(vec![mapped(dir.path(), "c", &bytes)], limits()));
        assert!(streamed.1.as_ref().is_err_and(|e| e.contains("over the")));
        assert_eq!(via_map, streamed);
    }

    #[test]
    fn mapped_record_larger_than_the_window_grows_it() {
        let dir = tempfile::tempdir().unwrap();
        let big = frame(7, 100_000);
        let bytes = pcap(
            false,
            false,
            1,
            &[(1, 0, &big, 100_000), (2, 0, &big[..9], 9)],
        );
        let limits = Limits {
            initial: 64,
            max_record: 1 << 20,
        };
        let (got, res) = run_inputs(vec![mapped(dir.path(), "big.pcap", &bytes)], limits);
        res.unwrap();
        assert_eq!(
            got,
            vec![pkt(SEC, 1, &big, 100_000), pkt(2 * SEC, 1, &big[..9], 9)]
        );
        let small = Limits {
            initial: 64,
            max_record: 1000,
        };
        let (got, res) = run_inputs(vec![mapped(dir.path(), "big2.pcap", &bytes)], small);
        assert!(got.is_empty());
        assert_eq!(
            res.unwrap_err().to_string(),
            "big2.pcap: record at byte 24 is 100016 bytes, over the 1000-byte limit"
        );
    }

    #[test]
    fn simple_packet_blocks_use_previous_timestamp_and_snaplen() {
        let big = frame(5, 20);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .simple_packet(4, &big[..4]) // before any interface: skipped
            .interface(1, 8, &idb_options(Some(9), None))
            .enhanced_packet(0, 42, &big[..3], 3, EPB_OPTIONS)
            .simple_packet(20, &big[..8]) // snaplen 8
            .simple_packet(5, &big[..5]);
        let (got, res) = run_inputs(vec![trickle("spb.pcapng", ng.bytes())], tiny());
        let s = res.unwrap();
        assert_eq!(
            got,
            vec![
                pkt(42, 1, &big[..3], 3),
                pkt(42, 1, &big[..8], 20),
                pkt(42, 1, &big[..5], 5),
            ]
        );
        assert_eq!(s.warnings.len(), 1);
    }

    #[test]
    fn obsolete_packet_block() {
        let a = frame(9, 13);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Big, SHB_OPTIONS)
            .interface(1, 0, &idb_options(Some(3), None))
            .obsolete_packet(0, 1234, &a)
            .obsolete_packet(3, 1, &a);
        let (got, res) = run_inputs(vec![trickle("pb.pcapng", ng.bytes())], tiny());
        let s = res.unwrap();
        assert_eq!(got, vec![pkt(1_234_000_000, 1, &a, 13)]);
        assert_eq!(s.warnings.len(), 1);
    }

    #[test]
    fn invalid_tsresol_warns_and_assumes_microseconds() {
        let a = frame(9, 4);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 0, &idb_options(Some(0x7f), None))
            .enhanced_packet(0, 5, &a, 4, EPB_OPTIONS);
        let (got, res) = run_inputs(vec![trickle("r.pcapng", ng.bytes())], tiny());
        let s = res.unwrap();
        assert_eq!(got, vec![pkt(5_000, 1, &a, 4)]);
        assert!(s.warnings[0].contains("if_tsresol"), "{:?}", s.warnings);
    }

    fn ts_file(dir: &Path, name: &str, secs: &[u32]) -> String {
        let data: Vec<Vec<u8>> = secs.iter().map(|&s| frame(s as u8, 10)).collect();
        let recs: Vec<(u32, u32, &[u8], u32)> = secs
            .iter()
            .zip(&data)
            .map(|(&s, d)| (s, 0, d.as_slice(), 10))
            .collect();
        write(dir, name, &pcap(false, false, 1, &recs))
    }

    #[test]
    fn merge_rotated_files_given_in_reverse_order() {
        let dir = tempfile::tempdir().unwrap();
        let first = ts_file(dir.path(), "cap0", &[1, 2, 3]);
        let second = ts_file(dir.path(), "cap1", &[4, 5, 6]);
        let (got, res) = run(&[second, first]);
        let s = res.unwrap();
        let ts: Vec<i64> = got.iter().map(|p| p.ts / SEC).collect();
        assert_eq!(ts, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!((s.files, s.packets), (2, 6));
        assert!(got.iter().all(|p| p.data == frame((p.ts / SEC) as u8, 10)));
    }

    #[test]
    fn merge_interleaves_and_keeps_file_order_within_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = ts_file(dir.path(), "a", &[1, 5, 3, 7]); // out of order inside
        let b = ts_file(dir.path(), "b", &[2, 4, 6]);
        let (got, res) = run(&[a, b]);
        res.unwrap();
        let ts: Vec<i64> = got.iter().map(|p| p.ts / SEC).collect();
        assert_eq!(ts, vec![1, 2, 4, 5, 3, 6, 7]);
    }

    #[test]
    fn merge_ties_follow_the_earlier_starting_file() {
        let dir = tempfile::tempdir().unwrap();
        let late = ts_file(dir.path(), "late", &[10, 11]);
        let early = ts_file(dir.path(), "early", &[5, 10]);
        let (got, res) = run(&[late, early]);
        res.unwrap();
        let order: Vec<(i64, u8)> = got.iter().map(|p| (p.ts / SEC, p.data[0])).collect();
        // Both files hold a packet at t=10; "early" started first, so its wins.
        assert_eq!(order, vec![(5, 5), (10, 10), (10, 10), (11, 11)]);
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn truncated_pcap_delivers_up_to_the_cut_and_continues() {
        let dir = tempfile::tempdir().unwrap();
        let a = frame(1, 100);
        let full = pcap(
            false,
            false,
            1,
            &[(1, 0, &a, 100), (2, 0, &a, 100), (3, 0, &a, 100)],
        );
        let third = 24 + 2 * (16 + 100);
        let cut = write(dir.path(), "cut.pcap", &full[..third + 16 + 30]);
        let hdr_cut = write(dir.path(), "cut2.pcap", &full[..third + 7]);
        let other = ts_file(dir.path(), "other.pcap", &[4]);
        let (got, res) = run(&[cut.clone(), hdr_cut.clone(), other]);
        let s = res.unwrap();
        let ts: Vec<i64> = got.iter().map(|p| p.ts / SEC).collect();
        assert_eq!(ts, vec![1, 1, 2, 2, 4]);
        assert_eq!(
            s.truncations,
            vec![
                Truncation {
                    path: cut,
                    offset: third as u64
                },
                Truncation {
                    path: hdr_cut,
                    offset: third as u64
                },
            ]
        );
    }

    #[test]
    fn truncated_pcapng_reports_block_offset() {
        let a = frame(1, 100);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 0, &idb_options(None, None))
            .enhanced_packet(0, 1, &a, 100, EPB_OPTIONS);
        let second_epb = ng.len();
        ng.enhanced_packet(0, 2, &a, 100, EPB_OPTIONS);
        let bytes = ng.bytes();
        for cut in [second_epb + 3, second_epb + 50, bytes.len() - 1] {
            let (got, res) = run_inputs(vec![trickle("t.pcapng", bytes[..cut].to_vec())], tiny());
            let s = res.unwrap();
            assert_eq!(got.len(), 1, "cut at {cut}");
            assert_eq!(
                s.truncations,
                vec![Truncation {
                    path: "t.pcapng".into(),
                    offset: second_epb as u64
                }]
            );
        }
    }

    #[test]
    fn file_header_cut_short_is_a_truncation_at_zero() {
        let bytes = pcap(false, false, 1, &[]);
        for cut in [2, 10, 23] {
            let (got, res) = run_inputs(vec![trickle("h.pcap", bytes[..cut].to_vec())], tiny());
            let s = res.unwrap();
            assert!(got.is_empty());
            assert_eq!(s.truncations[0].offset, 0);
        }
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS);
        let (_, res) = run_inputs(vec![trickle("h.pcapng", ng.bytes()[..20].to_vec())], tiny());
        assert_eq!(res.unwrap().truncations[0].offset, 0);
    }

    #[test]
    fn header_only_file_has_no_packets() {
        let (got, res) = run_inputs(vec![trickle("h.pcap", pcap(false, true, 1, &[]))], tiny());
        let s = res.unwrap();
        assert!(got.is_empty() && s.truncations.is_empty() && s.warnings.is_empty());
    }

    #[test]
    fn not_a_capture_is_a_one_line_error() {
        let dir = tempfile::tempdir().unwrap();
        let good = ts_file(dir.path(), "good.pcap", &[1]);
        let elf = write(dir.path(), "x.pcap", b"\x7fELF\x02\x01\x01\x00");
        let (got, res) = run(&[good, elf.clone()]);
        assert!(got.is_empty(), "nothing delivered before the check");
        let msg = res.unwrap_err().to_string();
        assert_eq!(
            msg,
            format!("{elf}: not a pcap or pcapng file (starts with 0x7f454c46)")
        );
        let short = write(dir.path(), "y", b"ab");
        assert_eq!(
            run(std::slice::from_ref(&short)).1.unwrap_err().to_string(),
            format!("{short}: not a pcap or pcapng file (starts with 0x6162)")
        );
    }

    #[test]
    fn missing_file_fails_fast() {
        let dir = tempfile::tempdir().unwrap();
        let good = ts_file(dir.path(), "good.pcap", &[1]);
        let missing = dir
            .path()
            .join("nosuch.pcap")
            .to_string_lossy()
            .into_owned();
        let (got, res) = run(&[good, missing.clone()]);
        assert!(got.is_empty());
        let err = res.unwrap_err();
        assert!(matches!(err, CaptureError::Open { .. }));
        assert_eq!(
            err.to_string(),
            format!("{missing}: cannot open: No such file or directory (os error 2)")
        );
    }

    #[test]
    fn directory_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_string_lossy().into_owned();
        let msg = run(std::slice::from_ref(&path)).1.unwrap_err().to_string();
        assert!(msg.starts_with(&format!("{path}: ")), "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn empty_file_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let empty = write(dir.path(), "empty.pcap", b"");
        let good = ts_file(dir.path(), "good.pcap", &[1, 2]);
        let (got, res) = run(&[empty.clone(), good]);
        let s = res.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(s.files, 2);
        assert_eq!(s.warnings, vec![format!("{empty}: empty file, no packets")]);
        let (got, res) = run(&[empty]);
        assert!(got.is_empty());
        assert_eq!(res.unwrap().warnings.len(), 1);
    }

    #[test]
    fn stdin_only_once() {
        let err = read_captures(&["-".to_string(), "-".to_string()], &mut |_| {}).unwrap_err();
        assert!(matches!(err, CaptureError::StdinTwice));
        assert!(!err.to_string().contains('\n'));
    }

    #[test]
    fn epb_with_undefined_interface_is_skipped_with_warning() {
        let a = frame(1, 10);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .enhanced_packet(0, 1, &a, 10, EPB_OPTIONS)
            .interface(1, 0, &idb_options(None, None))
            .enhanced_packet(1, 2, &a, 10, EPB_OPTIONS)
            .enhanced_packet(7, 3, &a, 10, EPB_OPTIONS)
            .enhanced_packet(0, 4, &a, 10, EPB_OPTIONS);
        let (got, res) = run_inputs(vec![trickle("i.pcapng", ng.bytes())], tiny());
        let s = res.unwrap();
        assert_eq!(got, vec![pkt(4_000, 1, &a, 10)]);
        assert_eq!(
            s.warnings,
            vec!["i.pcapng: skipped 3 packet(s) naming an undefined interface".to_string()]
        );
    }

    #[test]
    fn records_larger_than_the_initial_buffer() {
        let big = frame(7, 5000);
        let bytes = pcap(
            false,
            false,
            1,
            &[
                (1, 0, &big[..10], 10),
                (2, 0, &big, 5000),
                (3, 0, &big[..1], 1),
            ],
        );
        let (got, res) = run_inputs(vec![trickle("big.pcap", bytes)], tiny());
        res.unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1].data, big);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 0, &idb_options(None, None))
            .enhanced_packet(0, 1, &big, 5000, EPB_OPTIONS)
            .enhanced_packet(0, 2, &big[..3], 3, EPB_OPTIONS);
        let (got, res) = run_inputs(vec![trickle("big.pcapng", ng.bytes())], tiny());
        res.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].data, big);
    }

    #[test]
    fn record_larger_than_the_default_four_mib_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let big = frame(3, (5 << 20) + 3);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 0, &idb_options(None, None))
            .enhanced_packet(0, 1, &big, big.len() as u32, EPB_OPTIONS);
        ng.enhanced_packet(0, 2, &big[..5], 5, EPB_OPTIONS);
        let path = write(dir.path(), "huge.pcapng", &ng.bytes());
        let (got, res) = run(&[path]);
        res.unwrap();
        assert_eq!(got.len(), 2);
        assert!(got[0].data == big);
    }

    #[test]
    fn record_over_the_limit_is_an_error() {
        let big = frame(7, 5000);
        let bytes = pcap(false, false, 1, &[(1, 0, &big, 5000)]);
        let limits = Limits {
            initial: 64,
            max_record: 4096,
        };
        let (got, res) = run_inputs(vec![trickle("huge.pcap", bytes)], limits);
        assert!(got.is_empty());
        assert_eq!(
            res.unwrap_err().to_string(),
            "huge.pcap: record at byte 24 is 5016 bytes, over the 4096-byte limit"
        );
    }

    /// Packets, truncations and resyncs, or the error: both paths must agree on all of it.
    type ResyncOutcome = (Vec<Pkt>, Result<(Vec<Truncation>, Vec<Resync>), String>);

    fn resync_outcome(
        (got, res): (Vec<Pkt>, Result<ReadSummary, CaptureError>),
        name: &str,
    ) -> ResyncOutcome {
        let res = res
            .map(|s| {
                let mut t = s.truncations;
                t.iter_mut().for_each(|t| t.path = "c".into());
                let mut r = s.resyncs;
                r.iter_mut().for_each(|r| r.path = "c".into());
                (t, r)
            })
            .map_err(|e| e.to_string().replacen(name, "c", 1));
        (got, res)
    }

    /// Reads `bytes` streamed and mapped at several window sizes; every way gives the same.
    fn read_every_way(dir: &Path, name: &str, bytes: &[u8]) -> ResyncOutcome {
        let streamed = resync_outcome(run_inputs(vec![trickle("c", bytes.to_vec())], tiny()), "c");
        for window in [1, 64, 4096, 1 << 20] {
            let limits = Limits {
                initial: window,
                max_record: 1 << 20,
            };
            let input = mapped(dir, name, bytes);
            let via_map = resync_outcome(run_inputs(vec![input], limits), name);
            assert_eq!(via_map, streamed, "{name}, window {window}");
        }
        streamed
    }

    /// A classic pcap of four records whose second has caplen 0x7fffffff: its offset, the
    /// third's, and the bytes.
    fn pcap_with_corrupt_caplen() -> (u64, u64, Vec<u8>) {
        let a = frame(1, 60);
        let records: Vec<(u32, u32, &[u8], u32)> =
            (0..4).map(|i| (100 + i, 5, &a[..], 60)).collect();
        let mut bytes = pcap(false, false, 1, &records);
        let second = 24 + 16 + 60;
        bytes[second + 8..second + 12].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        (second as u64, (second + 16 + 60) as u64, bytes)
    }

    #[test]
    fn corrupt_pcap_caplen_mid_file_is_skipped_to_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let (bad_at, next_at, bytes) = pcap_with_corrupt_caplen();
        let (got, res) = read_every_way(dir.path(), "caplen.pcap", &bytes);
        let (truncations, resyncs) = res.expect("read on");
        assert!(truncations.is_empty());
        assert_eq!(
            resyncs,
            vec![Resync {
                path: "c".into(),
                offset: bad_at,
                resumed_at: Some(next_at),
                skipped: next_at - bad_at,
            }]
        );
        let secs: Vec<i64> = got.iter().map(|p| p.ts / NANOS_PER_SEC).collect();
        assert_eq!(secs, vec![100, 102, 103]);
        assert!(resyncs[0].describe().contains("resynchronised at byte"));
    }

    #[test]
    fn corrupt_pcapng_block_length_mid_file_is_skipped_to_the_next_block() {
        let dir = tempfile::tempdir().unwrap();
        let a = frame(1, 40);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 0, &idb_options(None, None))
            .enhanced_packet(0, 1, &a, 40, EPB_OPTIONS);
        let bad_at = ng.len();
        ng.enhanced_packet(0, 2, &a, 40, EPB_OPTIONS);
        let next_at = ng.len();
        ng.enhanced_packet(0, 3, &a, 40, EPB_OPTIONS)
            .enhanced_packet(0, 4, &a, 40, EPB_OPTIONS);
        let mut bytes = ng.bytes();
        // A 4 GB block length.
        bytes[bad_at + 4..bad_at + 8].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let (got, res) = read_every_way(dir.path(), "len.pcapng", &bytes);
        let (truncations, resyncs) = res.expect("read on");
        assert!(truncations.is_empty());
        assert_eq!(
            resyncs,
            vec![Resync {
                path: "c".into(),
                offset: bad_at as u64,
                resumed_at: Some(next_at as u64),
                skipped: (next_at - bad_at) as u64,
            }]
        );
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn corrupt_length_with_nothing_plausible_after_it_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (bad_at, _, mut bytes) = pcap_with_corrupt_caplen();
        // Garbage after the corrupt record: nothing that parses as a record.
        bytes.truncate(bad_at as usize + 16);
        bytes.extend(std::iter::repeat_n(0xee, 300));
        let (got, res) = read_every_way(dir.path(), "tail.pcap", &bytes);
        let (truncations, resyncs) = res.expect("read on");
        assert!(truncations.is_empty());
        assert_eq!(got.len(), 1);
        assert_eq!(resyncs.len(), 1);
        assert_eq!(resyncs[0].resumed_at, None);
        assert_eq!(resyncs[0].skipped, bytes.len() as u64 - bad_at);
        assert!(resyncs[0].describe().contains("no plausible record"));
    }

    /// Cut anywhere, a capture with a corrupt length reads the same streamed and mapped.
    #[test]
    fn corrupt_lengths_read_alike_mapped_and_streamed_at_every_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, bytes) = pcap_with_corrupt_caplen();
        for cut in 0..=bytes.len() {
            let _ = read_every_way(dir.path(), &format!("cut-{cut}.pcap"), &bytes[..cut]);
        }
    }

    #[test]
    fn corrupt_block_is_an_error_with_offset() {
        let a = frame(1, 8);
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS)
            .interface(1, 0, &idb_options(None, None))
            .enhanced_packet(0, 1, &a, 8, EPB_OPTIONS);
        let bad_at = ng.len();
        ng.enhanced_packet(0, 2, &a, 8, EPB_OPTIONS)
            .enhanced_packet(0, 3, &a, 8, EPB_OPTIONS);
        let mut bytes = ng.bytes();
        // Break the trailing length copy of the second EPB.
        let second_end = bytes.len() - (bytes.len() - bad_at) / 2;
        bytes[second_end - 4] ^= 0x40;
        let (got, res) = run_inputs(vec![trickle("c.pcapng", bytes)], tiny());
        assert_eq!(got.len(), 1);
        let msg = res.unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("c.pcapng: corrupt capture at byte {bad_at}: ")),
            "{msg}"
        );
        assert!(!msg.contains('\n') && msg.len() < 120, "{msg}");
    }

    #[test]
    fn epb_caplen_overrunning_its_block_is_corrupt_not_a_hang() {
        let a = frame(1, 8);
        for trailing in [false, true] {
            let mut ng = Ng::default();
            ng.section(ByteOrder::Little, SHB_OPTIONS)
                .interface(1, 0, &idb_options(None, None));
            let bad_at = ng.len();
            ng.enhanced_packet(0, 1, &a, 8, EPB_OPTIONS);
            // caplen field (offset 20 in the block) claims more than the block holds
            ng.as_mut_bytes()[bad_at + 20] = 200;
            if trailing {
                ng.enhanced_packet(0, 2, &a, 8, EPB_OPTIONS);
            }
            let (got, res) = run_inputs(vec![trickle("o.pcapng", ng.bytes())], tiny());
            assert!(got.is_empty());
            let msg = res.unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("o.pcapng: corrupt capture at byte {bad_at}")),
                "{msg}"
            );
        }
    }

    #[test]
    fn io_error_mid_file_is_a_read_error() {
        /// Serves its bytes, then fails instead of reporting EOF.
        struct Failing(Vec<u8>, usize);
        impl Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1 == self.0.len() {
                    return Err(io::Error::other("disk on fire"));
                }
                let n = (self.0.len() - self.1).min(buf.len());
                buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        let a = frame(1, 100);
        let bytes = pcap(false, false, 1, &[(1, 0, &a, 100), (2, 0, &a, 100)]);
        let input = Input {
            name: "f.pcap".into(),
            data: InputData::Stream(Box::new(Failing(bytes[..200].to_vec(), 0))),
        };
        let (got, res) = run_inputs(vec![input], tiny());
        assert_eq!(got.len(), 1);
        assert_eq!(
            res.unwrap_err().to_string(),
            "f.pcap: read error at byte 140: disk on fire"
        );
    }

    #[test]
    fn bad_section_header_byte_order_is_corrupt() {
        let mut ng = Ng::default();
        ng.section(ByteOrder::Little, SHB_OPTIONS);
        ng.as_mut_bytes()[8] = 0x99;
        let (_, res) = run_inputs(vec![trickle("b.pcapng", ng.bytes())], tiny());
        assert_eq!(
            res.unwrap_err().to_string(),
            "b.pcapng: corrupt capture at byte 0: bad byte-order magic in section header"
        );
    }

    #[test]
    fn garbage_after_magic_never_panics() {
        let mut x: u32 = 0x9e37_79b9;
        for magic in [PCAPNG_MAGIC, PCAP_MAGICS[0], PCAP_MAGICS[3]] {
            for len in [0usize, 5, 30, 100, 400] {
                let mut bytes = magic.to_vec();
                bytes.extend((0..len).map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                }));
                let _ = run_inputs(vec![trickle("g", bytes)], tiny());
            }
        }
    }

    #[test]
    fn ts_resolution_helper() {
        assert_eq!(ts_units_per_sec(6), Some(1_000_000));
        assert_eq!(ts_units_per_sec(9), Some(1_000_000_000));
        assert_eq!(ts_units_per_sec(0x80 | 10), Some(1024));
        assert_eq!(ts_units_per_sec(0x80 | 127), Some(1 << 127));
        assert_eq!(ts_units_per_sec(39), None);
    }
}
