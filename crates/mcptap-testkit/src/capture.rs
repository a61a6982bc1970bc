//! Capture file writers: classic pcap (µs or ns timestamps, either byte order) and pcapng
//! (several sections of either byte order, several interfaces with their own link type and
//! options such as `if_tsresol`, enhanced / simple / obsolete packet blocks).

use std::io;

/// One captured frame: timestamp (ns since the Unix epoch) and link-layer bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ts_nanos: i64,
    pub data: Vec<u8>,
}

/// Byte order of a capture file (pcap) or section (pcapng).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ByteOrder {
    #[default]
    Little,
    Big,
}

impl ByteOrder {
    fn u16(self, v: u16) -> [u8; 2] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }
    fn u32(self, v: u32) -> [u8; 4] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }
    fn i64(self, v: i64) -> [u8; 8] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }
}

/// The snapshot length the writers declare unless told otherwise.
pub const SNAPLEN: u32 = 262_144;

/// A classic pcap file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcapHeader {
    /// Nanosecond timestamps (magic 0xa1b23c4d) rather than microseconds (0xa1b2c3d4).
    pub nanos: bool,
    pub byte_order: ByteOrder,
    pub linktype: u32,
    pub snaplen: u32,
}

impl PcapHeader {
    /// Microsecond, little-endian header for `linktype`.
    pub fn micros(linktype: u32) -> Self {
        PcapHeader {
            nanos: false,
            byte_order: ByteOrder::Little,
            linktype,
            snaplen: SNAPLEN,
        }
    }

    /// Nanosecond, little-endian header for `linktype`.
    pub fn nanos(linktype: u32) -> Self {
        PcapHeader {
            nanos: true,
            ..Self::micros(linktype)
        }
    }
}

/// Length of the pcap file header; every record adds [`PCAP_RECORD_HEADER_LEN`] bytes.
pub const PCAP_FILE_HEADER_LEN: u64 = 24;
pub const PCAP_RECORD_HEADER_LEN: u64 = 16;

/// Streaming classic pcap writer.
pub struct PcapWriter<W: io::Write> {
    out: W,
    header: PcapHeader,
    /// Records written.
    pub packets: u64,
    /// Bytes written to the file, headers included.
    pub file_bytes: u64,
}

impl<W: io::Write> PcapWriter<W> {
    /// Writes the file header.
    pub fn new(mut out: W, header: PcapHeader) -> io::Result<Self> {
        let o = header.byte_order;
        let magic = if header.nanos {
            0xa1b2_3c4d
        } else {
            0xa1b2_c3d4
        };
        let mut h = Vec::with_capacity(PCAP_FILE_HEADER_LEN as usize);
        h.extend_from_slice(&o.u32(magic));
        h.extend_from_slice(&o.u16(2)); // version 2.4
        h.extend_from_slice(&o.u16(4));
        h.extend_from_slice(&o.u32(0)); // thiszone
        h.extend_from_slice(&o.u32(0)); // sigfigs
        h.extend_from_slice(&o.u32(header.snaplen));
        h.extend_from_slice(&o.u32(header.linktype));
        out.write_all(&h)?;
        Ok(PcapWriter {
            out,
            header,
            packets: 0,
            file_bytes: PCAP_FILE_HEADER_LEN,
        })
    }

    /// Writes one record as given: seconds, fraction (µs or ns by the header), captured bytes
    /// and the original length (which may exceed them).
    pub fn write_record(
        &mut self,
        ts_sec: u32,
        ts_frac: u32,
        data: &[u8],
        orig_len: u32,
    ) -> io::Result<()> {
        let o = self.header.byte_order;
        let caplen = u32::try_from(data.len()).expect("frame length fits pcap");
        let mut rec = [0u8; PCAP_RECORD_HEADER_LEN as usize];
        rec[0..4].copy_from_slice(&o.u32(ts_sec));
        rec[4..8].copy_from_slice(&o.u32(ts_frac));
        rec[8..12].copy_from_slice(&o.u32(caplen));
        rec[12..16].copy_from_slice(&o.u32(orig_len));
        self.out.write_all(&rec)?;
        self.out.write_all(data)?;
        self.packets += 1;
        self.file_bytes += PCAP_RECORD_HEADER_LEN + data.len() as u64;
        Ok(())
    }

    /// Writes one whole frame at `ts_nanos` (truncated to µs for a microsecond file).
    pub fn write(&mut self, ts_nanos: i64, data: &[u8]) -> io::Result<()> {
        let secs = u32::try_from(ts_nanos.div_euclid(1_000_000_000)).expect("ts fits pcap");
        let nanos = ts_nanos.rem_euclid(1_000_000_000) as u32;
        let frac = if self.header.nanos {
            nanos
        } else {
            nanos / 1000
        };
        let len = u32::try_from(data.len()).expect("frame length fits pcap");
        self.write_record(secs, frac, data, len)
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Classic pcap file (little-endian, nanosecond timestamps) of `frames` with one link type.
pub fn pcap_bytes(linktype: u32, frames: &[Frame]) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), PcapHeader::nanos(linktype)).expect("into a Vec");
    for f in frames {
        w.write(f.ts_nanos, &f.data).expect("into a Vec");
    }
    w.into_inner()
}

/// A pcapng option; the writer encodes integers in the section's byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcapngOption<'a> {
    /// `opt_comment` (1), any block.
    Comment(&'a str),
    /// `shb_userappl` (4).
    UserApplication(&'a str),
    /// `if_name` (2).
    InterfaceName(&'a str),
    /// `if_tsresol` (9): bit 7 clear, 10^-n s; set, 2^-n s.
    TsResolution(u8),
    /// `if_tsoffset` (14): seconds added to every timestamp.
    TsOffset(i64),
    /// Anything else, raw.
    Raw { code: u16, value: &'a [u8] },
}

/// pcapng block types.
pub mod block_type {
    pub const SECTION_HEADER: u32 = 0x0A0D_0D0A;
    pub const INTERFACE_DESCRIPTION: u32 = 1;
    pub const OBSOLETE_PACKET: u32 = 2;
    pub const SIMPLE_PACKET: u32 = 3;
    pub const ENHANCED_PACKET: u32 = 6;
}

/// pcapng writer, building the file in memory; the byte order follows the latest section
/// header. Methods chain: `w.section(..).interface(..).enhanced_packet(..)`.
#[derive(Debug, Default, Clone)]
pub struct PcapngWriter {
    order: ByteOrder,
    out: Vec<u8>,
}

fn pad4(v: &mut Vec<u8>) {
    v.resize(v.len().next_multiple_of(4), 0);
}

impl PcapngWriter {
    /// An empty file: start it with [`PcapngWriter::section`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Any block: type, body (padded to 4 bytes), lengths around it.
    pub fn block(&mut self, block_type: u32, body: &[u8]) -> &mut Self {
        let padded = body.len().next_multiple_of(4);
        let total = self
            .order
            .u32(u32::try_from(12 + padded).expect("block length"));
        self.out.extend_from_slice(&self.order.u32(block_type));
        self.out.extend_from_slice(&total);
        self.out.extend_from_slice(body);
        self.out.resize(self.out.len() + padded - body.len(), 0);
        self.out.extend_from_slice(&total);
        self
    }

    /// The encoded option list: nothing when empty, else the options and `opt_endofopt`.
    fn options(&self, options: &[PcapngOption<'_>]) -> Vec<u8> {
        let mut v = Vec::new();
        if options.is_empty() {
            return v;
        }
        for opt in options {
            let int;
            let (code, value): (u16, &[u8]) = match *opt {
                PcapngOption::Comment(s) => (1, s.as_bytes()),
                PcapngOption::UserApplication(s) => (4, s.as_bytes()),
                PcapngOption::InterfaceName(s) => (2, s.as_bytes()),
                PcapngOption::TsResolution(r) => {
                    int = [r].to_vec();
                    (9, &int)
                }
                PcapngOption::TsOffset(o) => {
                    int = self.order.i64(o).to_vec();
                    (14, &int)
                }
                PcapngOption::Raw { code, value } => (code, value),
            };
            let len = u16::try_from(value.len()).expect("option length");
            v.extend_from_slice(&self.order.u16(code));
            v.extend_from_slice(&self.order.u16(len));
            v.extend_from_slice(value);
            pad4(&mut v);
        }
        v.extend_from_slice(&[0, 0, 0, 0]); // opt_endofopt
        v
    }

    /// A section header block (version 1.0, length unknown) in `order`; later blocks follow
    /// that byte order.
    pub fn section(&mut self, order: ByteOrder, options: &[PcapngOption<'_>]) -> &mut Self {
        self.order = order;
        let mut body = self.order.u32(0x1a2b_3c4d).to_vec();
        body.extend_from_slice(&self.order.u16(1));
        body.extend_from_slice(&self.order.u16(0));
        body.extend_from_slice(&self.order.i64(-1)); // section length unknown
        body.extend(self.options(options));
        self.block(block_type::SECTION_HEADER, &body)
    }

    /// An interface description block: the next interface id of the section.
    pub fn interface(
        &mut self,
        linktype: u16,
        snaplen: u32,
        options: &[PcapngOption<'_>],
    ) -> &mut Self {
        let mut body = self.order.u16(linktype).to_vec();
        body.extend_from_slice(&self.order.u16(0));
        body.extend_from_slice(&self.order.u32(snaplen));
        body.extend(self.options(options));
        self.block(block_type::INTERFACE_DESCRIPTION, &body)
    }

    /// An enhanced packet block; `ts` counts the interface's timestamp units.
    pub fn enhanced_packet(
        &mut self,
        interface: u32,
        ts: u64,
        data: &[u8],
        orig_len: u32,
        options: &[PcapngOption<'_>],
    ) -> &mut Self {
        let mut body = self.order.u32(interface).to_vec();
        body.extend_from_slice(&self.order.u32((ts >> 32) as u32));
        body.extend_from_slice(&self.order.u32(ts as u32));
        let caplen = u32::try_from(data.len()).expect("frame length");
        body.extend_from_slice(&self.order.u32(caplen));
        body.extend_from_slice(&self.order.u32(orig_len));
        body.extend_from_slice(data);
        pad4(&mut body);
        body.extend(self.options(options));
        self.block(block_type::ENHANCED_PACKET, &body)
    }

    /// A simple packet block (interface 0, no timestamp).
    pub fn simple_packet(&mut self, orig_len: u32, data: &[u8]) -> &mut Self {
        let mut body = self.order.u32(orig_len).to_vec();
        body.extend_from_slice(data);
        self.block(block_type::SIMPLE_PACKET, &body)
    }

    /// An obsolete packet block (drops count 0, whole frame captured).
    pub fn obsolete_packet(&mut self, interface: u16, ts: u64, data: &[u8]) -> &mut Self {
        let len = self
            .order
            .u32(u32::try_from(data.len()).expect("frame length"));
        let mut body = self.order.u16(interface).to_vec();
        body.extend_from_slice(&self.order.u16(0));
        body.extend_from_slice(&self.order.u32((ts >> 32) as u32));
        body.extend_from_slice(&self.order.u32(ts as u32));
        body.extend_from_slice(&len);
        body.extend_from_slice(&len);
        body.extend_from_slice(data);
        self.block(block_type::OBSOLETE_PACKET, &body)
    }

    /// Bytes written so far (e.g. the offset the next block will start at).
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// True before the first block.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// The bytes so far, to corrupt on purpose.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut self.out
    }

    /// The file so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.out.clone()
    }

    /// The file, consuming the writer.
    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }
}

/// Minimal little-endian pcapng file: one section without options, one interface
/// (`if_tsresol` = 9, i.e. nanoseconds) and one enhanced packet block per frame.
pub fn pcapng_bytes(linktype: u32, frames: &[Frame]) -> Vec<u8> {
    let mut w = PcapngWriter::new();
    w.section(ByteOrder::Little, &[]).interface(
        u16::try_from(linktype).expect("pcapng link type"),
        SNAPLEN,
        &[PcapngOption::TsResolution(9)],
    );
    for f in frames {
        let ts = u64::try_from(f.ts_nanos).expect("non-negative timestamp");
        let len = u32::try_from(f.data.len()).expect("frame length");
        w.enhanced_packet(0, ts, &f.data, len, &[]);
    }
    w.into_bytes()
}
