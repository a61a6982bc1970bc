//! Memory-mapped reading of regular capture files.
//!
//! `read()` copies every byte from the page cache into the reader's buffer, and pcap-parser's
//! buffer then moves what is left to its front on each refill: on a 1 GB capture that is most of
//! the time spent outside the decoder. Mapping the file lets the parsers borrow records straight
//! from the page cache. The file is mapped a window at a time, so resident memory stays at a
//! few windows however large the file is.
//!
//! [`MappedReader`] implements pcap-parser's own `PcapReaderIterator` contract (the same
//! `Incomplete` / `BufferTooSmall` / `UnexpectedEof` / `Eof` outcomes as its streaming readers),
//! so `FileReader` drives both the same way and every truncation and corruption rule applies
//! unchanged to both.
//!
//! Caveat: a file truncated by another process while it is mapped makes the kernel raise
//! SIGBUS on the next access to a vanished page. Capture writers append, so this only matters
//! for a capture rewritten in place (e.g. logrotate's `copytruncate`); read such a file
//! through standard input instead.

use std::fs::File;

use memmap2::{Advice, Mmap, MmapOptions};
use pcap_parser::nom::{self, Needed, Offset};
use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{
    Block, LegacyPcapBlock, PcapBlockOwned, PcapError, PcapHeader, parse_block_be, parse_block_le,
    parse_pcap_frame, parse_pcap_frame_be, parse_pcap_frame_modified, parse_pcap_header,
    parse_sectionheaderblock,
};

/// 2 MiB: an x86-64 / arm64 huge page.
pub(super) const HUGE_PAGE: usize = 2 << 20;

type LegacyParseFn = fn(&[u8]) -> nom::IResult<&[u8], LegacyPcapBlock<'_>, PcapError<&[u8]>>;

enum Format {
    /// Classic pcap: the header is handed out as the first block, like pcap-parser's reader.
    /// `records`: how [`MappedReader::next_legacy_record`] reads a record; `caplen_limit`: see
    /// [`super::pcap_caplen_limit`].
    Legacy {
        header: PcapHeader,
        parse: LegacyParseFn,
        records: RecordLayout,
        caplen_limit: u32,
    },
    /// pcapng: the byte order of the current section, set by each Section Header Block.
    Ng { big_endian: bool },
}

pub(super) struct MappedReader {
    file: File,
    file_len: u64,
    /// The current window; `None` when it would be empty.
    map: Option<Mmap>,
    /// File offset of `map[0]`.
    map_start: u64,
    /// Offset in `map` of the first unconsumed byte.
    pos: usize,
    /// Offset in `map` where the bytes handed to the parsers end: at most `window` bytes past
    /// the refill's start, like a stream reader's buffer, so every record-size limit applies
    /// the same way. The mapping itself may reach further, to a huge-page boundary.
    end: usize,
    consumed: usize,
    /// Bytes mapped past the first unconsumed byte on refill (at least; full-size windows are
    /// widened to huge-page boundaries); grown for records larger than a window.
    window: usize,
    format: Format,
}

impl MappedReader {
    /// Maps the first window of `file` (`file_len` bytes long) and checks its file header,
    /// like pcap-parser's `LegacyPcapReader::new` / `PcapNGReader::new`.
    pub(super) fn open(
        file: File,
        file_len: u64,
        window: usize,
        pcapng: bool,
    ) -> Result<MappedReader, PcapError<&'static [u8]>> {
        let format = Format::Ng { big_endian: false };
        let mut reader = MappedReader {
            file,
            file_len,
            map: None,
            map_start: 0,
            pos: 0,
            end: 0,
            consumed: 0,
            window: window.max(1),
            format,
        };
        reader.map_from(0)?;
        if pcapng {
            return match parse_sectionheaderblock(reader.data()) {
                Ok(_) => Ok(reader),
                Err(e) => Err(owned(e)),
            };
        }
        let header = match parse_pcap_header(reader.data()) {
            Ok((_, h)) => h,
            Err(e) => return Err(owned(e)),
        };
        let (parse, records): (LegacyParseFn, _) = if header.is_modified_format() {
            (parse_pcap_frame_modified, RecordLayout::Other)
        } else if header.is_bigendian() {
            (
                parse_pcap_frame_be,
                RecordLayout::Plain { big_endian: true },
            )
        } else {
            (parse_pcap_frame, RecordLayout::Plain { big_endian: false })
        };
        let caplen_limit = super::pcap_caplen_limit(header.snaplen);
        reader.format = Format::Legacy {
            header,
            parse,
            records,
            caplen_limit,
        };
        Ok(reader)
    }

    /// Replaces the window with one starting at file offset `start`.
    fn map_from(&mut self, start: u64) -> Result<(), PcapError<&'static [u8]>> {
        self.map = None;
        let start = start.min(self.file_len);
        // Full-size windows start and end on huge-page boundaries, so that a page cache holding
        // the file in huge folios (what readahead and large writes build) is mapped a huge page
        // per fault instead of 16 small pages. The window then begins up to 2 MiB before `start`.
        let huge = self.window >= 2 * HUGE_PAGE;
        let base = if huge {
            start & !(HUGE_PAGE as u64 - 1)
        } else {
            start
        };
        let lead = (start - base) as usize;
        let mut want = lead.saturating_add(self.window);
        if huge {
            want = want.next_multiple_of(HUGE_PAGE);
        }
        let len = (self.file_len - base).min(want as u64) as usize;
        self.map_start = base;
        self.pos = lead;
        self.end = len.min(lead.saturating_add(self.window));
        if len == lead {
            return Ok(());
        }
        // SAFETY: the map is only read, never written, and lives no longer than `self`. Another
        // process truncating the file while it is mapped is the documented caveat above.
        let map = unsafe { MmapOptions::new().offset(base).len(len).map(&self.file) }
            .map_err(|_| PcapError::ReadError)?;
        // Best effort: read ahead aggressively, drop pages behind us early, map huge folios
        // whole.
        let _ = map.advise(Advice::Sequential);
        #[cfg(target_os = "linux")]
        let _ = map.advise(Advice::HugePage);
        self.map = Some(map);
        Ok(())
    }

    /// The next classic pcap record, if it lies wholly in the current window: the common case,
    /// without the block wrapping of the general `next`/`consume` protocol. `None` leaves the
    /// reader untouched for the general path (file header not yet handed out, pcapng, a record
    /// cut by the window or the file, a malformed record).
    #[inline]
    pub(super) fn next_legacy_record(&mut self) -> Option<LegacyPcapBlock<'_>> {
        let Format::Legacy {
            parse,
            records,
            caplen_limit,
            ..
        } = &self.format
        else {
            return None;
        };
        if self.consumed == 0 {
            return None;
        }
        let data = self.map.as_ref()?.get(self.pos..self.end)?;
        let (block, used) = match *records {
            // Read here rather than through the parser's function pointer: once per packet.
            RecordLayout::Plain { big_endian: false } => plain_record::<false>(data)?,
            RecordLayout::Plain { big_endian: true } => plain_record::<true>(data)?,
            RecordLayout::Other => {
                let (rest, block) = parse(data).ok()?;
                (block, data.len() - rest.len())
            }
        };
        if block.caplen > *caplen_limit {
            // A corrupt length: the general path resynchronises.
            return None;
        }
        self.pos += used;
        self.consumed += used;
        prefetch(data.get(used..).unwrap_or_default());
        Some(block)
    }

    /// File offset just past the bytes handed to the parsers.
    fn window_end(&self) -> u64 {
        self.map_start + self.map.as_ref().map_or(self.pos, |_| self.end) as u64
    }
}

/// How a classic pcap file's records are laid out.
#[derive(Debug, Clone, Copy)]
enum RecordLayout {
    /// The 16-byte record header of libpcap's format, in the file's byte order.
    Plain { big_endian: bool },
    /// Another (the modified format's longer header): read by pcap-parser.
    Other,
}

/// A classic pcap record wholly in `data` (what pcap-parser's `parse_pcap_frame` /
/// `parse_pcap_frame_be` read) and the bytes it takes; `None` when it is cut.
#[inline]
fn plain_record<const BIG_ENDIAN: bool>(data: &[u8]) -> Option<(LegacyPcapBlock<'_>, usize)> {
    let header: &[u8; 16] = data.first_chunk()?;
    let word = |at: usize| {
        let bytes = [header[at], header[at + 1], header[at + 2], header[at + 3]];
        if BIG_ENDIAN {
            u32::from_be_bytes(bytes)
        } else {
            u32::from_le_bytes(bytes)
        }
    };
    let caplen = word(8);
    let used = 16usize.checked_add(usize::try_from(caplen).ok()?)?;
    let block = LegacyPcapBlock {
        ts_sec: word(0),
        ts_usec: word(4),
        caplen,
        origlen: word(12),
        data: data.get(16..used)?,
    };
    Some((block, used))
}

fn owned(e: nom::Err<PcapError<&[u8]>>) -> PcapError<&'static [u8]> {
    match e {
        nom::Err::Error(e) | nom::Err::Failure(e) => e.to_owned_vec(),
        nom::Err::Incomplete(Needed::Size(n)) => PcapError::Incomplete(n.into()),
        nom::Err::Incomplete(Needed::Unknown) => PcapError::Incomplete(0),
    }
}

impl PcapReaderIterator for MappedReader {
    fn next(&mut self) -> Result<(usize, PcapBlockOwned<'_>), PcapError<&'_ [u8]>> {
        if self.consumed == 0
            && let Format::Legacy { header, .. } = &self.format
        {
            return Ok((header.size(), PcapBlockOwned::from(header.clone())));
        }
        let exhausted = self.reader_exhausted();
        let window = self.window;
        let data = match &self.map {
            Some(map) => map.get(self.pos..self.end).unwrap_or_default(),
            None => &[],
        };
        if data.is_empty() && exhausted {
            return Err(PcapError::Eof);
        }
        let parsed = match &mut self.format {
            Format::Legacy { parse, .. } => parse(data).map(|(rem, b)| (rem, b.into())),
            Format::Ng { big_endian } => {
                let parse = if *big_endian {
                    parse_block_be
                } else {
                    parse_block_le
                };
                parse(data).map(|(rem, b)| {
                    if let Block::SectionHeader(shb) = &b {
                        *big_endian = shb.big_endian();
                    }
                    (rem, PcapBlockOwned::from(b))
                })
            }
        };
        match parsed {
            Ok((rem, block)) => Ok((data.offset(rem), block)),
            Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(e),
            Err(nom::Err::Incomplete(_)) if exhausted => Err(PcapError::UnexpectedEof),
            Err(nom::Err::Incomplete(Needed::Size(n))) => {
                if data.len().saturating_add(n.get()) >= window {
                    Err(PcapError::BufferTooSmall)
                } else {
                    Err(PcapError::Incomplete(n.get()))
                }
            }
            Err(nom::Err::Incomplete(Needed::Unknown)) => Err(PcapError::Incomplete(0)),
        }
    }

    fn consume(&mut self, offset: usize) {
        self.consume_noshift(offset);
    }

    fn consume_noshift(&mut self, offset: usize) {
        let available = self.data().len();
        let n = offset.min(available);
        self.pos += n;
        self.consumed += n;
    }

    fn consumed(&self) -> usize {
        self.consumed
    }

    /// Maps the next window, starting at the first unconsumed byte.
    fn refill(&mut self) -> Result<(), PcapError<&[u8]>> {
        let next = self.map_start + self.pos as u64;
        self.map_from(next).map_err(|_| PcapError::ReadError)
    }

    fn position(&self) -> usize {
        self.pos
    }

    /// Takes effect at the next refill, which maps a window of at least `new_size` bytes.
    fn grow(&mut self, new_size: usize) -> bool {
        self.window = self.window.max(new_size);
        true
    }

    fn data(&self) -> &[u8] {
        match &self.map {
            Some(map) => map.get(self.pos..self.end).unwrap_or_default(),
            None => &[],
        }
    }

    fn reader_exhausted(&self) -> bool {
        self.window_end() >= self.file_len
    }
}

/// Asks the CPU to start loading the next record's header (and the network headers behind it)
/// while the current packet is processed: with a mapped file, that first touch is otherwise a
/// cache and TLB miss on every record.
#[inline(always)]
fn prefetch(next: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = next.as_ptr();
        // SAFETY: prefetching has no architectural effect and never faults, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = next;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records read here as pcap-parser reads them, whole or cut anywhere, in both byte orders.
    #[test]
    fn plain_records_read_as_pcap_parser_reads_them() {
        let mut rng = mcptap_testkit::SplitMix64(7);
        let mut next = move || rng.next_u64();
        for _ in 0..2000 {
            let caplen = (next() % 300) as u32;
            let big_endian = next() % 2 == 0;
            let word = |v: u32| {
                if big_endian {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                }
            };
            let mut record = Vec::new();
            for v in [next() as u32, next() as u32, caplen, next() as u32] {
                record.extend_from_slice(&word(v));
            }
            record.extend((0..caplen + (next() % 40) as u32).map(|i| i as u8));
            let cut = (next() as usize) % (record.len() + 1);
            let data = &record[..cut];
            let ours = if big_endian {
                plain_record::<true>(data)
            } else {
                plain_record::<false>(data)
            };
            let theirs = if big_endian {
                parse_pcap_frame_be(data)
            } else {
                parse_pcap_frame(data)
            };
            match (ours, theirs) {
                (Some((block, used)), Ok((rest, expected))) => {
                    let fields = |b: &LegacyPcapBlock<'_>| {
                        (b.ts_sec, b.ts_usec, b.caplen, b.origlen, b.data.to_vec())
                    };
                    assert_eq!(fields(&block), fields(&expected));
                    assert_eq!(used, data.len() - rest.len());
                }
                (None, Err(_)) => {}
                (ours, theirs) => panic!("cut {cut} of {}: {ours:?} {theirs:?}", record.len()),
            }
        }
    }
}
