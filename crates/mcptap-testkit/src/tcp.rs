//! A TCP connection model that turns application writes into realistic packets: three-way
//! handshake, segments of at most the segment size, delayed ACKs (every second full
//! segment, or at the end of a write unless the peer answers at once), FIN exchange.
//! Linux-style options (timestamps on every segment, MSS / SACK / window scale on SYNs).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::rng::SplitMix64;
use crate::wire::{Link, TcpFrame, linux_tcp_options, tcp};

/// Payload of a full-sized segment: 1500 MTU - 20 (IPv4) - 32 (TCP with timestamps).
pub const MSS: usize = 1448;

/// Frame bytes of a segment around its payload, as stored in a pcap (record header too).
pub const FRAME_OVERHEAD: u64 = 16 + 14 + 20 + 32;

/// One end of a connection: MAC, IPv4 address, port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    pub port: u16,
}

impl Endpoint {
    /// An endpoint with a locally administered MAC derived from its address (`02:00:a:b:c:d`).
    pub fn new(ip: [u8; 4], port: u16) -> Self {
        Endpoint {
            mac: [0x02, 0x00, ip[0], ip[1], ip[2], ip[3]],
            ip,
            port,
        }
    }

    /// An endpoint of a capture meant for tcpreplay onto `lo`: `ip` must be loopback
    /// (127.0.0.0/8, never 127.0.0.1, which the metrics endpoint and tests use). The MAC is
    /// locally administered (`02:…`), never lo's own, so the kernel marks the frames
    /// PACKET_OTHERHOST and drops them before IP: no local service answers.
    pub fn loopback(ip: [u8; 4], port: u16) -> Self {
        assert!(
            ip[0] == 127 && ip != [127, 0, 0, 1],
            "reference captures use loopback addresses only"
        );
        Self::new(ip, port)
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::from(self.ip)), self.port)
    }
}

/// The TCP fields of one segment that vary from packet to packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub ip_id: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub tsval: u32,
    pub tsecr: u32,
}

/// Writes a frame of `link` from `src` to `dst` into `buf` (cleared first), with Linux-style
/// options and the payload `fill` appends. Returns the payload length.
pub fn write_segment(
    buf: &mut Vec<u8>,
    link: &Link,
    src: &Endpoint,
    dst: &Endpoint,
    h: &SegmentHeader,
    fill: impl FnOnce(&mut Vec<u8>),
) -> usize {
    let (options, options_len) = linux_tcp_options(h.flags & tcp::SYN != 0, h.tsval, h.tsecr);
    let frame = TcpFrame {
        link,
        source_mac: src.mac,
        destination_mac: dst.mac,
        source: src.addr(),
        destination: dst.addr(),
        ip_id: h.ip_id,
        ttl: 64,
        dont_fragment: true,
        seq: h.seq,
        ack: h.ack,
        flags: h.flags,
        window: h.window,
        options: &options[..options_len],
    };
    let mut payload_len = 0;
    frame.write(buf, |out| {
        let start = out.len();
        fill(out);
        payload_len = out.len() - start;
    });
    payload_len
}

/// Bytes standing in for encrypted or compressed content.
pub struct Pool(Vec<u8>);

/// Size of the pool's random bytes.
pub const POOL_LEN: usize = 1 << 20;

impl Pool {
    /// A pool filled from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut rng = SplitMix64(seed ^ 0x5eed_9001);
        let mut v = Vec::with_capacity(POOL_LEN);
        while v.len() < POOL_LEN {
            v.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        Pool(v)
    }
    /// Appends the `len` bytes of the virtual random stream `seed` starting at `pos`.
    fn copy(&self, seed: u64, pos: u64, len: usize, out: &mut Vec<u8>) {
        let mut at = ((seed.wrapping_add(pos)) % POOL_LEN as u64) as usize;
        let mut left = len;
        while left > 0 {
            let n = left.min(POOL_LEN - at);
            out.extend_from_slice(&self.0[at..at + n]);
            left -= n;
            at = 0;
        }
    }
}

/// TLS 1.3 application-data record: 5-byte header + at most 16401 bytes.
const TLS_RECORD: u64 = 5 + 16401;

/// Part of one application write.
#[derive(Debug, Clone)]
pub enum Piece {
    Bytes(Vec<u8>),
    /// Opaque random bytes (a file download body).
    Random {
        len: u64,
        seed: u64,
    },
    /// TLS application-data records carrying random bytes, `len` bytes in all (>= 6).
    Tls {
        len: u64,
        seed: u64,
    },
}

impl Piece {
    /// Bytes this piece contributes.
    pub fn len(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::Random { len, .. } | Piece::Tls { len, .. } => *len,
        }
    }

    /// True for a piece of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn append(&self, pool: &Pool, pos: u64, n: usize, out: &mut Vec<u8>) {
        match self {
            Piece::Bytes(b) => out.extend_from_slice(&b[pos as usize..pos as usize + n]),
            Piece::Random { seed, .. } => pool.copy(*seed, pos, n, out),
            Piece::Tls { len, seed } => {
                let (mut pos, end) = (pos, pos + n as u64);
                while pos < end {
                    let rec_start = pos - pos % TLS_RECORD;
                    let off = pos - rec_start;
                    let rec_end = (rec_start + TLS_RECORD).min(*len);
                    if off < 5 {
                        let body = (rec_end - rec_start - 5) as u16;
                        let [hi, lo] = body.to_be_bytes();
                        let hdr = [0x17, 0x03, 0x03, hi, lo];
                        let take = (5 - off).min(end - pos);
                        out.extend_from_slice(&hdr[off as usize..(off + take) as usize]);
                        pos += take;
                    } else {
                        let take = (rec_end.min(end)) - pos;
                        pool.copy(*seed ^ rec_start, pos, take as usize, out);
                        pos += take;
                    }
                }
            }
        }
    }
}

/// One application write (one `send()`), in one direction.
#[derive(Debug, Clone)]
pub struct AppWrite {
    pub from_client: bool,
    pub pieces: Vec<Piece>,
}

impl AppWrite {
    /// A write of `bytes` by the client.
    pub fn client(bytes: Vec<u8>) -> Self {
        AppWrite {
            from_client: true,
            pieces: vec![Piece::Bytes(bytes)],
        }
    }
    /// A write of `bytes` by the server.
    pub fn server(bytes: Vec<u8>) -> Self {
        AppWrite {
            from_client: false,
            pieces: vec![Piece::Bytes(bytes)],
        }
    }
    /// Bytes of the whole write.
    pub fn len(&self) -> u64 {
        self.pieces.iter().map(Piece::len).sum()
    }

    /// True for a write of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Syn,
    SynAck,
    HandshakeAck,
    Data,
    Fin1,
    Fin2,
    LastAck,
    Done,
}

/// One TCP connection replaying a list of application writes as packets.
#[derive(Debug)]
pub struct Conn {
    ends: [Endpoint; 2],
    /// Next sequence number per side (0 = client, 1 = server).
    seq: [u32; 2],
    ip_id: [u16; 2],
    ts_off: [u32; 2],
    writes: VecDeque<AppWrite>,
    /// Position in the front write: piece index and offset inside it.
    piece: usize,
    offset: u64,
    /// Full segments per side not yet acknowledged by the peer.
    unacked: [u32; 2],
    /// A side that owes a bare ACK before anything else is sent.
    ack_due: Option<usize>,
    phase: Phase,
    /// Which side sends the first FIN.
    closer: usize,
    /// Payload bytes still to send (for budgeting).
    pub remaining: u64,
    link: Link,
    /// Payload sizes of successive data segments, cycled; empty: always [`MSS`].
    segment_sizes: Vec<usize>,
    segments_sent: usize,
}

impl Conn {
    /// A connection from `client` to `server` that will carry `writes` in order; initial
    /// sequence numbers, IP ids and timestamp offsets come from `rng`.
    pub fn new(
        client: Endpoint,
        server: Endpoint,
        rng: &mut SplitMix64,
        writes: Vec<AppWrite>,
    ) -> Self {
        let remaining = writes.iter().map(AppWrite::len).sum();
        Conn {
            ends: [client, server],
            seq: [rng.next_u64() as u32, rng.next_u64() as u32],
            ip_id: [rng.next_u64() as u16, rng.next_u64() as u16],
            ts_off: [rng.next_u64() as u32, rng.next_u64() as u32],
            writes: writes.into(),
            piece: 0,
            offset: 0,
            unacked: [0, 0],
            ack_due: None,
            phase: Phase::Syn,
            closer: 0,
            remaining,
            link: Link::default(),
            segment_sizes: Vec::new(),
            segments_sent: 0,
        }
    }

    /// Frames of `link` instead of untagged Ethernet.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = link;
        self
    }

    /// Data segments carry these payload sizes in turn (each at least 1) instead of [`MSS`].
    pub fn with_segment_sizes(mut self, sizes: Vec<usize>) -> Self {
        assert!(
            sizes.iter().all(|&n| n > 0),
            "segment sizes must be positive"
        );
        self.segment_sizes = sizes;
        self
    }

    /// The client and server endpoints.
    pub fn endpoints(&self) -> (Endpoint, Endpoint) {
        (self.ends[0], self.ends[1])
    }

    fn next_segment_size(&self) -> usize {
        if self.segment_sizes.is_empty() {
            MSS
        } else {
            self.segment_sizes[self.segments_sent % self.segment_sizes.len()]
        }
    }

    /// The server sends the first FIN (e.g. after `Connection: close`).
    pub fn server_closes(mut self) -> Self {
        self.closer = 1;
        self
    }

    /// Approximate pcap bytes this connection will still produce.
    pub fn planned_file_bytes(&self) -> u64 {
        let segs = self.remaining / MSS as u64 + 2 * self.writes.len() as u64;
        self.remaining + segs * 3 / 2 * FRAME_OVERHEAD + 7 * FRAME_OVERHEAD
    }

    /// True once the final ACK was sent.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    fn emit(
        &mut self,
        side: usize,
        flags: u8,
        now_ns: i64,
        buf: &mut Vec<u8>,
        payload: impl FnOnce(&mut Vec<u8>),
    ) -> usize {
        let peer = 1 - side;
        let ms = (now_ns / 1_000_000) as u32;
        let h = SegmentHeader {
            ip_id: self.ip_id[side],
            seq: self.seq[side],
            ack: if flags & tcp::ACK != 0 {
                self.seq[peer]
            } else {
                0
            },
            flags,
            window: if flags & tcp::SYN != 0 { 64240 } else { 502 },
            tsval: ms.wrapping_add(self.ts_off[side]),
            tsecr: if flags & tcp::ACK != 0 {
                ms.wrapping_add(self.ts_off[peer])
            } else {
                0
            },
        };
        self.ip_id[side] = self.ip_id[side].wrapping_add(1);
        let (src, dst) = (self.ends[side], self.ends[peer]);
        let payload_len = write_segment(buf, &self.link, &src, &dst, &h, payload);
        let consumed = payload_len as u32 + u32::from(flags & (tcp::SYN | tcp::FIN) != 0);
        self.seq[side] = self.seq[side].wrapping_add(consumed);
        payload_len
    }

    /// Builds the next packet of the connection into `buf`; false once the connection is over.
    pub fn next_packet(&mut self, pool: &Pool, now_ns: i64, buf: &mut Vec<u8>) -> bool {
        match self.phase {
            Phase::Syn => {
                self.emit(0, tcp::SYN, now_ns, buf, |_| {});
                self.phase = Phase::SynAck;
            }
            Phase::SynAck => {
                self.emit(1, tcp::SYN | tcp::ACK, now_ns, buf, |_| {});
                self.phase = Phase::HandshakeAck;
            }
            Phase::HandshakeAck => {
                self.emit(0, tcp::ACK, now_ns, buf, |_| {});
                self.phase = Phase::Data;
            }
            Phase::Data => {
                if let Some(side) = self.ack_due.take() {
                    self.unacked[1 - side] = 0;
                    self.emit(side, tcp::ACK, now_ns, buf, |_| {});
                    return true;
                }
                let Some(w) = self.writes.pop_front() else {
                    self.phase = Phase::Fin1;
                    return self.next_packet(pool, now_ns, buf);
                };
                let side = usize::from(!w.from_client);
                let left: u64 =
                    w.pieces[self.piece..].iter().map(Piece::len).sum::<u64>() - self.offset;
                let segment_size = self.next_segment_size();
                self.segments_sent += 1;
                let write_done = left <= segment_size as u64;
                let flags = if write_done {
                    tcp::ACK | tcp::PSH
                } else {
                    tcp::ACK
                };
                let (mut piece, mut offset) = (self.piece, self.offset);
                let sent = self.emit(side, flags, now_ns, buf, |out| {
                    let mut room = segment_size;
                    while room > 0 && piece < w.pieces.len() {
                        let p = &w.pieces[piece];
                        let n = ((p.len() - offset) as usize).min(room);
                        p.append(pool, offset, n, out);
                        room -= n;
                        offset += n as u64;
                        if offset == p.len() {
                            piece += 1;
                            offset = 0;
                        }
                    }
                });
                self.remaining -= sent as u64;
                if write_done {
                    self.piece = 0;
                    self.offset = 0;
                    // The peer acknowledges now unless it is about to answer (piggybacked ACK).
                    let next_same_side =
                        self.writes.front().map(|n| n.from_client == w.from_client);
                    if next_same_side == Some(false) {
                        self.unacked[side] = 0;
                    } else {
                        self.ack_due = Some(1 - side);
                    }
                } else {
                    self.piece = piece;
                    self.offset = offset;
                    self.writes.push_front(w);
                    self.unacked[side] += 1;
                    if self.unacked[side] >= 2 {
                        self.ack_due = Some(1 - side);
                    }
                }
            }
            Phase::Fin1 => {
                let c = self.closer;
                self.emit(c, tcp::FIN | tcp::ACK, now_ns, buf, |_| {});
                self.phase = Phase::Fin2;
            }
            Phase::Fin2 => {
                let c = 1 - self.closer;
                self.emit(c, tcp::FIN | tcp::ACK, now_ns, buf, |_| {});
                self.phase = Phase::LastAck;
            }
            Phase::LastAck => {
                let c = self.closer;
                self.emit(c, tcp::ACK, now_ns, buf, |_| {});
                self.phase = Phase::Done;
            }
            Phase::Done => return false,
        }
        true
    }
}
