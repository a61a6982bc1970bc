//! Shared by the bench targets (not a bench itself): a deterministic PRNG, Ethernet/IPv4/TCP
//! frame building with valid checksums, a classic pcap writer and a TCP connection model that
//! turns application writes into realistic packets (handshake, MSS-sized segments, delayed
//! ACKs, FIN exchange).
#![allow(dead_code)]

pub mod flood;
pub mod traffic;

use std::collections::VecDeque;
use std::io;

/// SplitMix64: small, fast and fully determined by its seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    /// Log-uniform in `lo..=hi` (many small, a few large).
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let v = ((lo as f64).ln() + u * ((hi as f64).ln() - (lo as f64).ln())).exp();
        (v as u64).clamp(lo, hi)
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next_u64() % items.len() as u64) as usize]
    }
}

/// Payload of a full-sized segment: 1500 MTU - 20 (IPv4) - 32 (TCP with timestamps).
pub const MSS: usize = 1448;

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    pub port: u16,
}

impl Endpoint {
    /// An endpoint of a reference capture. `ip` must be loopback (127.0.0.0/8, never 127.0.0.1,
    /// which the metrics endpoint and tests use): the captures are pushed onto `lo` with
    /// tcpreplay. The MAC is locally administered (`02:…`), never lo's own, so the kernel marks
    /// the frames PACKET_OTHERHOST and drops them before IP: no local service answers.
    pub fn new(ip: [u8; 4], port: u16) -> Self {
        assert!(
            ip[0] == 127 && ip != [127, 0, 0, 1],
            "reference captures use loopback addresses only"
        );
        Endpoint {
            mac: [0x02, 0x00, ip[0], ip[1], ip[2], ip[3]],
            ip,
            port,
        }
    }
}

/// One's-complement sum of `data` (as big-endian 16-bit words) added to `acc`, unfolded.
fn sum_words(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_be_bytes(c.try_into().unwrap());
        acc += (v >> 32) + (v & 0xffff_ffff);
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 2 {
        acc += u64::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let [b] = rest {
        acc += u64::from(*b) << 8;
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

pub struct TcpHeader {
    pub ip_id: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub tsval: u32,
    pub tsecr: u32,
}

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;

/// Writes an Ethernet II / IPv4 / TCP frame into `buf` (cleared first): TCP timestamps option
/// on every segment (plus MSS, SACK-permitted and window scale on SYNs), payload appended by
/// `fill`, then lengths and both checksums set.
pub fn tcp_frame(
    buf: &mut Vec<u8>,
    src: &Endpoint,
    dst: &Endpoint,
    h: &TcpHeader,
    fill: impl FnOnce(&mut Vec<u8>),
) {
    buf.clear();
    buf.extend_from_slice(&dst.mac);
    buf.extend_from_slice(&src.mac);
    buf.extend_from_slice(&0x0800u16.to_be_bytes());
    // IPv4: version/IHL, DSCP, total length (later), id, DF, TTL 64, TCP, checksum (later).
    buf.extend_from_slice(&[0x45, 0, 0, 0]);
    buf.extend_from_slice(&h.ip_id.to_be_bytes());
    buf.extend_from_slice(&[0x40, 0, 64, 6, 0, 0]);
    buf.extend_from_slice(&src.ip);
    buf.extend_from_slice(&dst.ip);
    let tcp_start = buf.len();
    let syn = h.flags & SYN != 0;
    let hdr_len: usize = if syn { 40 } else { 32 };
    buf.extend_from_slice(&src.port.to_be_bytes());
    buf.extend_from_slice(&dst.port.to_be_bytes());
    buf.extend_from_slice(&h.seq.to_be_bytes());
    buf.extend_from_slice(&h.ack.to_be_bytes());
    buf.push(((hdr_len / 4) as u8) << 4);
    buf.push(h.flags);
    buf.extend_from_slice(&h.window.to_be_bytes());
    buf.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    if syn {
        // MSS 1460, SACK permitted, timestamps, NOP, window scale 7 (Linux's order).
        buf.extend_from_slice(&[2, 4, 0x05, 0xb4, 4, 2, 8, 10]);
        buf.extend_from_slice(&h.tsval.to_be_bytes());
        buf.extend_from_slice(&h.tsecr.to_be_bytes());
        buf.extend_from_slice(&[1, 3, 3, 7]);
    } else {
        buf.extend_from_slice(&[1, 1, 8, 10]);
        buf.extend_from_slice(&h.tsval.to_be_bytes());
        buf.extend_from_slice(&h.tsecr.to_be_bytes());
    }
    fill(buf);
    let ip_total = (buf.len() - ETH_LEN) as u16;
    buf[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&ip_total.to_be_bytes());
    let ip_sum = fold(sum_words(&buf[ETH_LEN..ETH_LEN + IP_LEN], 0));
    buf[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&ip_sum.to_be_bytes());
    let tcp_len = buf.len() - tcp_start;
    let mut acc = sum_words(&src.ip, 0);
    acc = sum_words(&dst.ip, acc);
    acc += 6 + tcp_len as u64;
    let tcp_sum = fold(sum_words(&buf[tcp_start..], acc));
    buf[tcp_start + 16..tcp_start + 18].copy_from_slice(&tcp_sum.to_be_bytes());
}

/// Recomputes the IPv4 header and TCP checksums of an Ethernet/IPv4/TCP frame in place.
pub fn fix_checksums(frame: &mut [u8]) {
    let ihl = usize::from(frame[ETH_LEN] & 0x0f) * 4;
    frame[ETH_LEN + 10..ETH_LEN + 12].fill(0);
    let ip_sum = fold(sum_words(&frame[ETH_LEN..ETH_LEN + ihl], 0));
    frame[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&ip_sum.to_be_bytes());
    let ip_total = usize::from(u16::from_be_bytes([frame[ETH_LEN + 2], frame[ETH_LEN + 3]]));
    let tcp_start = ETH_LEN + ihl;
    let end = (ETH_LEN + ip_total).min(frame.len());
    frame[tcp_start + 16..tcp_start + 18].fill(0);
    let mut acc = sum_words(&frame[ETH_LEN + 12..ETH_LEN + 20], 0);
    acc += 6 + (end - tcp_start) as u64;
    let tcp_sum = fold(sum_words(&frame[tcp_start..end], acc));
    frame[tcp_start + 16..tcp_start + 18].copy_from_slice(&tcp_sum.to_be_bytes());
}

/// Classic pcap (microsecond timestamps, LINKTYPE_ETHERNET) writer.
pub struct PcapWriter<W: io::Write> {
    out: W,
    pub packets: u64,
    /// Bytes written to the file, headers included.
    pub file_bytes: u64,
}

impl<W: io::Write> PcapWriter<W> {
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&262_144u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter {
            out,
            packets: 0,
            file_bytes: 24,
        })
    }

    pub fn write(&mut self, ts_ns: i64, frame: &[u8]) -> io::Result<()> {
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&((ts_ns % 1_000_000_000 / 1000) as u32).to_le_bytes());
        rec[8..12].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        rec[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(frame)?;
        self.packets += 1;
        self.file_bytes += 16 + frame.len() as u64;
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Bytes standing in for encrypted or compressed content.
pub struct Pool(Vec<u8>);

pub const POOL_LEN: usize = 1 << 20;

impl Pool {
    pub fn new(seed: u64) -> Self {
        let mut rng = Rng(seed ^ 0x5eed_9001);
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
    pub fn len(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::Random { len, .. } | Piece::Tls { len, .. } => *len,
        }
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
    pub fn client(bytes: Vec<u8>) -> Self {
        AppWrite {
            from_client: true,
            pieces: vec![Piece::Bytes(bytes)],
        }
    }
    pub fn server(bytes: Vec<u8>) -> Self {
        AppWrite {
            from_client: false,
            pieces: vec![Piece::Bytes(bytes)],
        }
    }
    pub fn len(&self) -> u64 {
        self.pieces.iter().map(Piece::len).sum()
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
}

/// Frame bytes of a segment around `payload` bytes, as stored in a pcap (record header too).
pub const FRAME_OVERHEAD: u64 = 16 + 14 + 20 + 32;

impl Conn {
    pub fn new(client: Endpoint, server: Endpoint, rng: &mut Rng, writes: Vec<AppWrite>) -> Self {
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
        let h = TcpHeader {
            ip_id: self.ip_id[side],
            seq: self.seq[side],
            ack: if flags & ACK != 0 { self.seq[peer] } else { 0 },
            flags,
            window: if flags & SYN != 0 { 64240 } else { 502 },
            tsval: ms.wrapping_add(self.ts_off[side]),
            tsecr: if flags & ACK != 0 {
                ms.wrapping_add(self.ts_off[peer])
            } else {
                0
            },
        };
        self.ip_id[side] = self.ip_id[side].wrapping_add(1);
        let (src, dst) = (self.ends[side], self.ends[peer]);
        tcp_frame(buf, &src, &dst, &h, payload);
        let payload_len = buf.len() - (ETH_LEN + IP_LEN + if flags & SYN != 0 { 40 } else { 32 });
        let consumed = payload_len as u32 + u32::from(flags & (SYN | FIN) != 0);
        self.seq[side] = self.seq[side].wrapping_add(consumed);
        payload_len
    }

    /// Builds the next packet of the connection into `buf`; false once the connection is over.
    pub fn next_packet(&mut self, pool: &Pool, now_ns: i64, buf: &mut Vec<u8>) -> bool {
        match self.phase {
            Phase::Syn => {
                self.emit(0, SYN, now_ns, buf, |_| {});
                self.phase = Phase::SynAck;
            }
            Phase::SynAck => {
                self.emit(1, SYN | ACK, now_ns, buf, |_| {});
                self.phase = Phase::HandshakeAck;
            }
            Phase::HandshakeAck => {
                self.emit(0, ACK, now_ns, buf, |_| {});
                self.phase = Phase::Data;
            }
            Phase::Data => {
                if let Some(side) = self.ack_due.take() {
                    self.unacked[1 - side] = 0;
                    self.emit(side, ACK, now_ns, buf, |_| {});
                    return true;
                }
                let Some(w) = self.writes.pop_front() else {
                    self.phase = Phase::Fin1;
                    return self.next_packet(pool, now_ns, buf);
                };
                let side = usize::from(!w.from_client);
                let left: u64 =
                    w.pieces[self.piece..].iter().map(Piece::len).sum::<u64>() - self.offset;
                let write_done = left <= MSS as u64;
                let flags = if write_done { ACK | PSH } else { ACK };
                let (mut piece, mut offset) = (self.piece, self.offset);
                let sent = self.emit(side, flags, now_ns, buf, |out| {
                    let mut room = MSS;
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
                self.emit(c, FIN | ACK, now_ns, buf, |_| {});
                self.phase = Phase::Fin2;
            }
            Phase::Fin2 => {
                let c = 1 - self.closer;
                self.emit(c, FIN | ACK, now_ns, buf, |_| {});
                self.phase = Phase::LastAck;
            }
            Phase::LastAck => {
                let c = self.closer;
                self.emit(c, ACK, now_ns, buf, |_| {});
                self.phase = Phase::Done;
            }
            Phase::Done => return false,
        }
        true
    }
}
