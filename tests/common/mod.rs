//! Helpers shared by the integration tests: pulling TCP segments out of a capture, building
//! link-layer frames around them (Ethernet, 802.1Q / 802.1ad VLAN, Linux SLL2; IPv4 or IPv6
//! TCP with correct checksums) and writing classic pcap / pcapng files.
//!
//! Each test binary uses only part of this module, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use etherparse::PacketBuilder;
use mcptap::capture::{RawPacket, read_captures};
use mcptap_core::decode::{Decoded, TcpFlags, decode};

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
}

/// What [`read_segments`] found besides the TCP segments.
#[derive(Debug, Default, Clone)]
pub struct ReadStats {
    pub frames: usize,
    /// Frames that did not decode to TCP (they are not part of the returned segments).
    pub non_tcp: usize,
}

/// Reads every frame of a capture file and decodes it down to TCP, in file order.
pub fn read_segments(path: &Path) -> (Vec<Segment>, ReadStats) {
    read_segments_observing(path, &mut |_| {})
}

/// [`read_segments`], also handing every raw packet to `observe` (e.g. to feed a pipeline
/// in the same pass: opening a capture has a noticeable fixed cost in debug builds).
pub fn read_segments_observing(
    path: &Path,
    observe: &mut dyn FnMut(&RawPacket<'_>),
) -> (Vec<Segment>, ReadStats) {
    let mut segments = Vec::new();
    let mut stats = ReadStats::default();
    read_captures(&[path.display().to_string()], &mut |pkt| {
        observe(&pkt);
        stats.frames += 1;
        match decode(pkt.linktype, pkt.data) {
            Decoded::Tcp(seg) => segments.push(Segment {
                ts_nanos: pkt.ts_nanos,
                src: seg.src,
                dst: seg.dst,
                seq: seg.seq,
                ack: seg.ack,
                flags: seg.flags,
                payload: seg.payload.to_vec(),
            }),
            Decoded::Skipped(_) => stats.non_tcp += 1,
        }
    })
    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    (segments, stats)
}

/// One captured frame: timestamp (ns since the epoch) and link-layer bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ts_nanos: i64,
    pub data: Vec<u8>,
}

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const ETHERTYPE_QINQ: u16 = 0x88A8;

/// Builds the IPv4 or IPv6 packet (by the address family of `seg`) carrying the TCP segment,
/// with valid IP and TCP checksums. Both endpoints must be of the same family.
pub fn ip_tcp_packet(seg: &Segment) -> Vec<u8> {
    let step = match (seg.src.ip(), seg.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
        (s, d) => panic!("mixed address families {s} -> {d}"),
    };
    let mut tcp = step.tcp(seg.src.port(), seg.dst.port(), seg.seq, 65535);
    if seg.flags.ack {
        tcp = tcp.ack(seg.ack);
    }
    if seg.flags.syn {
        tcp = tcp.syn();
    }
    if seg.flags.fin {
        tcp = tcp.fin();
    }
    if seg.flags.rst {
        tcp = tcp.rst();
    }
    if !seg.payload.is_empty() {
        tcp = tcp.psh();
    }
    let mut out = Vec::with_capacity(tcp.size(seg.payload.len()));
    tcp.write(&mut out, &seg.payload)
        .expect("building an IP/TCP packet");
    out
}

/// The ethertype matching an IP packet's version nibble.
pub fn ethertype_of(ip_packet: &[u8]) -> u16 {
    match ip_packet.first().map(|b| b >> 4) {
        Some(4) => ETHERTYPE_IPV4,
        Some(6) => ETHERTYPE_IPV6,
        other => panic!("not an IP packet (version {other:?})"),
    }
}

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// Ethernet II frame (LINKTYPE_ETHERNET) around an IP packet.
pub fn ethernet(ip_packet: &[u8]) -> Vec<u8> {
    ethernet_vlan(&[], ip_packet)
}

/// Ethernet II frame with the given VLAN tags, outermost first, each as (TPID, VLAN id):
/// `&[(ETHERTYPE_VLAN, 42)]` is plain 802.1Q, `&[(ETHERTYPE_QINQ, 100), (ETHERTYPE_VLAN, 42)]`
/// is 802.1ad QinQ.
pub fn ethernet_vlan(tags: &[(u16, u16)], ip_packet: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(14 + 4 * tags.len() + ip_packet.len());
    v.extend_from_slice(&MAC_B);
    v.extend_from_slice(&MAC_A);
    for (tpid, vid) in tags {
        v.extend_from_slice(&tpid.to_be_bytes());
        // TCI: priority 0, DEI 0, 12-bit VLAN id.
        v.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    }
    v.extend_from_slice(&ethertype_of(ip_packet).to_be_bytes());
    v.extend_from_slice(ip_packet);
    v
}

/// ARPHRD_LOOPBACK, the device type of `lo` in SLL/SLL2 headers.
pub const ARPHRD_LOOPBACK: u16 = 772;

/// Linux cooked capture v2 frame (LINKTYPE_LINUX_SLL2, 276) around an IP packet: protocol,
/// reserved, interface index, ARPHRD (loopback), packet type (host), address length 6 and
/// 8 address bytes, then the packet.
pub fn sll2(ip_packet: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + ip_packet.len());
    v.extend_from_slice(&ethertype_of(ip_packet).to_be_bytes());
    v.extend_from_slice(&0u16.to_be_bytes()); // reserved
    v.extend_from_slice(&1u32.to_be_bytes()); // interface index of lo
    v.extend_from_slice(&ARPHRD_LOOPBACK.to_be_bytes());
    v.push(0); // PACKET_HOST
    v.push(6); // address length
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(ip_packet);
    v
}

/// Classic pcap file (little-endian, nanosecond timestamps) of `frames` with one link type.
pub fn pcap_bytes(linktype: u32, frames: &[Frame]) -> Vec<u8> {
    let mut v = Vec::with_capacity(24 + frames.iter().map(|f| 16 + f.data.len()).sum::<usize>());
    v.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes()); // nanosecond magic
    v.extend_from_slice(&2u16.to_le_bytes());
    v.extend_from_slice(&4u16.to_le_bytes());
    v.extend_from_slice(&0i32.to_le_bytes()); // thiszone
    v.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
    v.extend_from_slice(&262_144u32.to_le_bytes()); // snaplen
    v.extend_from_slice(&linktype.to_le_bytes());
    for f in frames {
        let secs = u32::try_from(f.ts_nanos.div_euclid(1_000_000_000)).expect("ts fits pcap");
        let nanos = f.ts_nanos.rem_euclid(1_000_000_000) as u32;
        let len = u32::try_from(f.data.len()).expect("frame length");
        v.extend_from_slice(&secs.to_le_bytes());
        v.extend_from_slice(&nanos.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&f.data);
    }
    v
}

/// Minimal little-endian pcapng file: a Section Header Block, one Interface Description
/// Block (`if_tsresol` = 9, i.e. nanoseconds) and one Enhanced Packet Block per frame.
pub fn pcapng_bytes(linktype: u32, frames: &[Frame]) -> Vec<u8> {
    fn block(out: &mut Vec<u8>, block_type: u32, body: &[u8]) {
        let padded = body.len().next_multiple_of(4);
        let total = u32::try_from(12 + padded).expect("block length");
        out.extend_from_slice(&block_type.to_le_bytes());
        out.extend_from_slice(&total.to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + padded - body.len(), 0);
        out.extend_from_slice(&total.to_le_bytes());
    }
    let mut v = Vec::new();
    // SHB: byte-order magic, version 1.0, section length unknown (-1), no options.
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut v, 0x0a0d_0d0a, &shb);
    // IDB: link type, reserved, snaplen, if_tsresol=9, opt_endofopt.
    let mut idb = Vec::new();
    idb.extend_from_slice(&u16::try_from(linktype).expect("linktype").to_le_bytes());
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&262_144u32.to_le_bytes());
    idb.extend_from_slice(&9u16.to_le_bytes()); // if_tsresol
    idb.extend_from_slice(&1u16.to_le_bytes());
    idb.extend_from_slice(&[9, 0, 0, 0]); // 10^-9, padded to 4
    idb.extend_from_slice(&[0, 0, 0, 0]); // opt_endofopt
    block(&mut v, 1, &idb);
    for f in frames {
        let ts = u64::try_from(f.ts_nanos).expect("non-negative timestamp");
        let len = u32::try_from(f.data.len()).expect("frame length");
        let mut epb = Vec::with_capacity(20 + f.data.len());
        epb.extend_from_slice(&0u32.to_le_bytes()); // interface id
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(ts as u32).to_le_bytes());
        epb.extend_from_slice(&len.to_le_bytes());
        epb.extend_from_slice(&len.to_le_bytes());
        epb.extend_from_slice(&f.data);
        block(&mut v, 6, &epb);
    }
    v
}

/// Maps an IPv4 address a.b.c.d to the IPv6 address `fd00::a.b.c.d` (e.g. 127.0.0.1 →
/// `fd00::7f00:1`); IPv6 addresses are returned unchanged. The port is kept.
pub fn to_fd00(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            let ip = Ipv6Addr::new(
                0xfd00,
                0,
                0,
                0,
                0,
                0,
                u16::from_be_bytes([a, b]),
                u16::from_be_bytes([c, d]),
            );
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

/// Small deterministic PRNG (SplitMix64) so transformed captures are reproducible.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform-ish value in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}
