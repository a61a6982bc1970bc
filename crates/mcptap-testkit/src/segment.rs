//! TCP segments as owned values: decoded from frames, re-cut, re-framed, and grouped into
//! each connection's in-order payload streams.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use mcptap_core::decode::{Decoded, TcpFlags, decode};

use crate::wire::{Link, TcpFrame, tcp};

/// One TCP segment with its capture timestamp, owning its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Nanoseconds since the Unix epoch.
    pub ts_nanos: i64,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    pub payload: Vec<u8>,
}

impl Segment {
    /// The TCP segment in a frame of `linktype`, if it decodes to one.
    pub fn decode(ts_nanos: i64, linktype: u32, frame: &[u8]) -> Option<Segment> {
        match decode(linktype, frame) {
            Decoded::Tcp(seg) => Some(Segment {
                ts_nanos,
                src: seg.src,
                dst: seg.dst,
                seq: seg.seq,
                ack: seg.ack,
                flags: seg.flags,
                payload: seg.payload.to_vec(),
            }),
            Decoded::Skipped(_) => None,
        }
    }

    /// Sequence number of the first payload byte (a SYN occupies one number before it).
    pub fn data_seq(&self) -> u32 {
        self.seq.wrapping_add(u32::from(self.flags.syn))
    }

    /// Sequence number just after the last payload byte (FIN not counted).
    pub fn data_end(&self) -> u32 {
        self.data_seq().wrapping_add(self.payload.len() as u32)
    }

    /// The (source, destination) pair: one direction of one connection.
    pub fn direction(&self) -> (SocketAddr, SocketAddr) {
        (self.src, self.dst)
    }

    /// No payload and no SYN/FIN/RST: a bare acknowledgement.
    pub fn is_pure_ack(&self) -> bool {
        self.payload.is_empty() && !self.flags.syn && !self.flags.fin && !self.flags.rst
    }

    /// The TCP flag bits (PSH on every segment that carries data).
    pub fn flag_bits(&self) -> u8 {
        let f = &self.flags;
        [
            (f.fin, tcp::FIN),
            (f.syn, tcp::SYN),
            (f.rst, tcp::RST),
            (!self.payload.is_empty(), tcp::PSH),
            (f.ack, tcp::ACK),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |bits, (_, bit)| bits | bit)
    }

    /// The segment as a frame of `link` with valid checksums (window 65535, no options).
    pub fn frame(&self, link: &Link) -> Vec<u8> {
        TcpFrame {
            seq: self.seq,
            ack: if self.flags.ack { self.ack } else { 0 },
            flags: self.flag_bits(),
            ..TcpFrame::new(link, self.src, self.dst)
        }
        .to_vec(&self.payload)
    }

    /// Cuts the payload at the given offsets (sorted, inside `1..len`) into consecutive
    /// segments. SYN stays on the first piece, FIN and RST move to the last one; all pieces
    /// keep the timestamp.
    pub fn split_at(&self, cuts: &[usize]) -> Vec<Segment> {
        let n = self.payload.len();
        let mut out = Vec::with_capacity(cuts.len() + 1);
        let mut start = 0;
        for end in cuts.iter().copied().chain([n]) {
            let (first, last) = (start == 0, end == n);
            out.push(Segment {
                // The first piece keeps the original sequence number (which precedes the
                // payload by one if it carries the SYN).
                seq: if first {
                    self.seq
                } else {
                    self.data_seq().wrapping_add(start as u32)
                },
                flags: TcpFlags {
                    syn: self.flags.syn && first,
                    ack: self.flags.ack,
                    fin: self.flags.fin && last,
                    rst: self.flags.rst && last,
                },
                payload: self.payload[start..end].to_vec(),
                ..self.clone()
            });
            start = end;
        }
        out
    }
}

/// One step of a [`PayloadStream`]: bytes of one half at the time of their segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStep {
    pub ts_nanos: i64,
    /// 0: client to server, 1: server to client.
    pub half: usize,
    pub bytes: Vec<u8>,
}

/// One TCP connection's payload, in order, retransmissions dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadStream {
    /// The side that sent the connection's first segment.
    pub client: SocketAddr,
    pub steps: Vec<StreamStep>,
    /// Timestamp of the connection's last segment.
    pub end_ts: i64,
}

/// Groups segments (in capture order) into connections by endpoint pair, keeping each
/// direction's payload that continues exactly where the previous one ended.
pub fn payload_streams(segments: &[Segment]) -> Vec<PayloadStream> {
    let mut streams: Vec<PayloadStream> = Vec::new();
    let mut index: HashMap<(SocketAddr, SocketAddr), usize> = HashMap::new();
    let mut next_seq: HashMap<(SocketAddr, SocketAddr), u32> = HashMap::new();
    for s in segments {
        let key = if s.src <= s.dst {
            (s.src, s.dst)
        } else {
            (s.dst, s.src)
        };
        let i = *index.entry(key).or_insert_with(|| {
            streams.push(PayloadStream {
                client: s.src,
                steps: Vec::new(),
                end_ts: s.ts_nanos,
            });
            streams.len() - 1
        });
        let stream = &mut streams[i];
        stream.end_ts = s.ts_nanos;
        let expected = next_seq.entry(s.direction()).or_insert(s.data_seq());
        if s.flags.syn {
            *expected = s.data_seq();
        }
        if !s.payload.is_empty() && *expected == s.data_seq() {
            stream.steps.push(StreamStep {
                ts_nanos: s.ts_nanos,
                half: usize::from(s.src != stream.client),
                bytes: s.payload.clone(),
            });
            *expected = s.data_end();
        }
    }
    streams
}

/// Maps an IPv4 address a.b.c.d to the IPv6 address `fd00::a.b.c.d` (e.g. 127.0.0.1 →
/// `fd00::7f00:1`); IPv6 addresses are returned unchanged. The port is kept.
pub fn to_fd00(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            let ip = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, hi, lo);
            SocketAddr::new(IpAddr::V6(ip), addr.port())
        }
        IpAddr::V6(_) => addr,
    }
}

/// Inverse of [`to_fd00`]: `fd00::a.b.c.d` back to a.b.c.d; anything else unchanged.
pub fn from_fd00(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if s[..6] == [0xfd00, 0, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), addr.port())
            } else {
                addr
            }
        }
        IpAddr::V4(_) => addr,
    }
}
