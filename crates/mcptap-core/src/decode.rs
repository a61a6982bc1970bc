//! Link layer, IP and TCP decoding of captured frames.
//!
//! Pure and zero-copy: the returned [`TcpSegment`] borrows its payload from the
//! frame. Decoding is tolerant (a frame cut by the snaplen still yields the TCP
//! bytes that were captured) but never panics on hostile input; anything that is
//! not a complete-enough TCP segment becomes a [`SkipReason`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

use etherparse::{IpNumber, LaxIpSlice, TcpSlice};

/// Link-layer header types (the LINKTYPE_* values stored in pcap/pcapng files).
pub mod dlt {
    pub const NULL: u32 = 0;
    pub const EN10MB: u32 = 1;
    pub const RAW: u32 = 101;
    pub const LOOP: u32 = 108;
    pub const LINUX_SLL: u32 = 113;
    pub const IPV4: u32 = 228;
    pub const IPV6: u32 = 229;
    pub const LINUX_SLL2: u32 = 276;
    /// DLT_RAW as numbered on most BSDs; some writers store it unmapped.
    pub const RAW_DLT12: u32 = 12;
    /// DLT_RAW as numbered on OpenBSD; some writers store it unmapped.
    pub const RAW_DLT14: u32 = 14;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpFlags {
    pub syn: bool,
    pub ack: bool,
    pub fin: bool,
    pub rst: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    /// TCP payload as captured: bounded by the IP length (so link padding is
    /// excluded) and possibly shorter than sent if the frame was truncated.
    pub payload: &'a [u8],
    /// The frame was cut short (a snaplen): the IP header claims more than was captured, so
    /// bytes after `payload` were sent but are missing.
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    UnsupportedLink,
    NotIp,
    NotTcp,
    IpFragment,
    Malformed,
}

impl SkipReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            SkipReason::UnsupportedLink => "unsupported_link",
            SkipReason::NotIp => "not_ip",
            SkipReason::NotTcp => "not_tcp",
            SkipReason::IpFragment => "ip_fragment",
            SkipReason::Malformed => "malformed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    Tcp(TcpSegment<'a>),
    Skipped(SkipReason),
}

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88A8;
// Pre-standard QinQ outer tag still emitted by some switches.
const ETHERTYPE_QINQ_OLD: u16 = 0x9100;
/// More stacked tags than this is treated as garbage rather than looped over.
const MAX_VLAN_TAGS: usize = 8;

const ETHERNET_HEADER_LEN: usize = 14;
const SLL_HEADER_LEN: usize = 16;
const SLL2_HEADER_LEN: usize = 20;
// SLL carries netlink messages (not ethertypes) in its protocol field for this ARPHRD.
const ARPHRD_NETLINK: u16 = 824;

pub fn is_supported_link(linktype: u32) -> bool {
    matches!(
        linktype,
        dlt::NULL
            | dlt::EN10MB
            | dlt::RAW
            | dlt::RAW_DLT12
            | dlt::RAW_DLT14
            | dlt::LOOP
            | dlt::LINUX_SLL
            | dlt::IPV4
            | dlt::IPV6
            | dlt::LINUX_SLL2
    )
}

/// Decodes one captured frame of the given link type down to TCP.
pub fn decode(linktype: u32, frame: &[u8]) -> Decoded<'_> {
    match ip_packet(linktype, frame) {
        Ok(packet) => decode_ip(packet),
        Err(reason) => Decoded::Skipped(reason),
    }
}

/// A TCP segment's endpoints and flags, without its payload: what a capture thread needs to
/// route a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEndpoints {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub flags: TcpFlags,
}

/// [`decode`] for routing: the same frames are TCP, but only the endpoints and flags are
/// kept, so that the common case (plain IPv4) inlines to a few loads in the caller.
#[inline]
pub fn tcp_endpoints(linktype: u32, frame: &[u8]) -> Option<TcpEndpoints> {
    let packet = ip_packet(linktype, frame).ok()?;
    let seg = match plain_ipv4_tcp(packet) {
        Some(seg) => seg,
        None => match decode_ip_general(packet) {
            Decoded::Tcp(seg) => seg,
            Decoded::Skipped(_) => return None,
        },
    };
    Some(TcpEndpoints {
        src: seg.src,
        dst: seg.dst,
        flags: seg.flags,
    })
}

/// The addresses in a frame's headers: what a capture must show before it is pushed onto an
/// interface (see `mcptap endpoints --require-loopback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameAddresses {
    /// Ethernet destination (Ethernet link type only).
    pub dst_mac: Option<[u8; 6]>,
    /// Source and destination of the IPv4/IPv6 header, when the frame carries one.
    pub ip: Option<(IpAddr, IpAddr)>,
}

/// Reads the link-layer destination and the IP addresses of one frame; never panics.
pub fn frame_addresses(linktype: u32, frame: &[u8]) -> FrameAddresses {
    let dst_mac = match linktype {
        dlt::EN10MB => frame.get(..6).and_then(|m| m.try_into().ok()),
        _ => None,
    };
    let ip = ip_packet(linktype, frame).ok().and_then(ip_addresses);
    FrameAddresses { dst_mac, ip }
}

fn ip_addresses(packet: &[u8]) -> Option<(IpAddr, IpAddr)> {
    let field = |range: std::ops::Range<usize>| packet.get(range);
    match packet.first()? >> 4 {
        4 => {
            let src: [u8; 4] = field(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = field(16..20)?.try_into().ok()?;
            Some((IpAddr::from(src), IpAddr::from(dst)))
        }
        6 => {
            let src: [u8; 16] = field(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = field(24..40)?.try_into().ok()?;
            Some((IpAddr::from(src), IpAddr::from(dst)))
        }
        _ => None,
    }
}

/// Walks the link layer of one frame to its IPv4/IPv6 packet.
#[inline]
fn ip_packet(linktype: u32, frame: &[u8]) -> Result<&[u8], SkipReason> {
    match linktype {
        dlt::EN10MB => ethernet_ip(frame),
        dlt::LINUX_SLL => sll_ip(frame),
        dlt::LINUX_SLL2 => sll2_ip(frame),
        dlt::RAW | dlt::RAW_DLT12 | dlt::RAW_DLT14 => raw_ip(frame, None),
        dlt::IPV4 => raw_ip(frame, Some(4)),
        dlt::IPV6 => raw_ip(frame, Some(6)),
        dlt::NULL | dlt::LOOP => loopback_ip(frame),
        _ => Err(SkipReason::UnsupportedLink),
    }
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    let b: [u8; 2] = bytes.get(at..at.checked_add(2)?)?.try_into().ok()?;
    Some(u16::from_be_bytes(b))
}

#[inline]
fn ethernet_ip(frame: &[u8]) -> Result<&[u8], SkipReason> {
    let (Some(ethertype), Some(rest)) = (be16(frame, 12), frame.get(ETHERNET_HEADER_LEN..)) else {
        return Err(SkipReason::Malformed);
    };
    ethertype_ip(ethertype, rest)
}

/// Follows any VLAN tags to an IPv4/IPv6 payload.
fn ethertype_ip(mut ethertype: u16, mut rest: &[u8]) -> Result<&[u8], SkipReason> {
    for _ in 0..=MAX_VLAN_TAGS {
        match ethertype {
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => return Ok(rest),
            ETHERTYPE_VLAN | ETHERTYPE_QINQ | ETHERTYPE_QINQ_OLD => {
                // Tag: 2 bytes TCI, then the encapsulated ethertype.
                let (Some(inner), Some(after)) = (be16(rest, 2), rest.get(4..)) else {
                    return Err(SkipReason::Malformed);
                };
                ethertype = inner;
                rest = after;
            }
            _ => return Err(SkipReason::NotIp),
        }
    }
    Err(SkipReason::Malformed)
}

/// Linux cooked capture v1: packet type u16, ARPHRD u16, address length u16,
/// 8 address bytes, protocol u16 — all big-endian.
fn sll_ip(frame: &[u8]) -> Result<&[u8], SkipReason> {
    let (Some(arphrd), Some(protocol), Some(rest)) =
        (be16(frame, 2), be16(frame, 14), frame.get(SLL_HEADER_LEN..))
    else {
        return Err(SkipReason::Malformed);
    };
    if arphrd == ARPHRD_NETLINK {
        return Err(SkipReason::NotIp);
    }
    ethertype_ip(protocol, rest)
}

/// Linux cooked capture v2: protocol u16, reserved u16, interface index u32,
/// ARPHRD u16, packet type u8, address length u8, 8 address bytes.
fn sll2_ip(frame: &[u8]) -> Result<&[u8], SkipReason> {
    let (Some(protocol), Some(arphrd), Some(rest)) =
        (be16(frame, 0), be16(frame, 8), frame.get(SLL2_HEADER_LEN..))
    else {
        return Err(SkipReason::Malformed);
    };
    if arphrd == ARPHRD_NETLINK {
        return Err(SkipReason::NotIp);
    }
    ethertype_ip(protocol, rest)
}

/// Raw IP: the version nibble decides; `expect` pins it for LINKTYPE_IPV4/IPV6.
fn raw_ip(frame: &[u8], expect: Option<u8>) -> Result<&[u8], SkipReason> {
    let Some(first) = frame.first() else {
        return Err(SkipReason::Malformed);
    };
    let version = first >> 4;
    match expect {
        Some(v) if v != version => Err(SkipReason::Malformed),
        _ if version == 4 || version == 6 => Ok(frame),
        _ => Err(SkipReason::Malformed),
    }
}

/// BSD loopback (NULL/LOOP): a 4-byte address family. NULL stores it in the
/// capturing host's byte order and LOOP in network order, but files get moved
/// between machines, so both orders are accepted for both (the valid values
/// are tiny, so the two readings can't collide).
fn loopback_ip(frame: &[u8]) -> Result<&[u8], SkipReason> {
    let (Some(family), Some(rest)) = (frame.get(..4), frame.get(4..)) else {
        return Err(SkipReason::Malformed);
    };
    let Ok(family) = <[u8; 4]>::try_from(family) else {
        return Err(SkipReason::Malformed);
    };
    let is_ip = |af: u32| {
        // AF_INET is 2 everywhere; AF_INET6 is 10 (Linux), 23 (Windows/Npcap),
        // 24 (NetBSD/OpenBSD), 28 (FreeBSD), 30 (macOS).
        matches!(af, 2 | 10 | 23 | 24 | 28 | 30)
    };
    if is_ip(u32::from_le_bytes(family)) || is_ip(u32::from_be_bytes(family)) {
        raw_ip(rest, None)
    } else {
        Err(SkipReason::NotIp)
    }
}

/// IPv4/IPv6 down to TCP: the plain IPv4 case inline, everything else through etherparse.
fn decode_ip(packet: &[u8]) -> Decoded<'_> {
    match plain_ipv4_tcp(packet) {
        Some(seg) => Decoded::Tcp(seg),
        None => decode_ip_general(packet),
    }
}

/// The case nearly every packet is: IPv4 without options, wholly inside the frame, not a
/// fragment, carrying a well-formed TCP header. It costs a few loads here against a few hundred
/// instructions for etherparse's general slicing, which is most of the per-packet cost of
/// skipping bulk traffic. Anything else (options, IPv6, truncation, odd lengths) returns `None`
/// for the general path; a property test checks that the two agree on every input this
/// accepts.
#[inline]
fn plain_ipv4_tcp(packet: &[u8]) -> Option<TcpSegment<'_>> {
    let (ip, header, payload) = plain_ipv4_parts(packet)?;
    let be32 = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let (src, dst) = plain_ipv4_endpoints(ip, header);
    Some(TcpSegment {
        src: SocketAddr::from(src),
        dst: SocketAddr::from(dst),
        seq: be32(4),
        ack: be32(8),
        flags: tcp_flags(header[13]),
        payload,
        truncated: false,
    })
}

/// A plain IPv4 packet's IP header, TCP header and TCP payload: no IP options, TCP, not a
/// fragment, every byte the IP length claims captured.
#[inline]
fn plain_ipv4_parts(packet: &[u8]) -> Option<(&[u8; 20], &[u8; 20], &[u8])> {
    const IPV4_NO_OPTIONS: u8 = 0x45;
    const PROTO_TCP: u8 = 6;
    const MORE_FRAGMENTS_AND_OFFSET: u16 = 0x3fff;
    let ip: &[u8; 20] = packet.get(..20)?.try_into().ok()?;
    if ip[0] != IPV4_NO_OPTIONS || ip[9] != PROTO_TCP {
        return None;
    }
    if u16::from_be_bytes([ip[6], ip[7]]) & MORE_FRAGMENTS_AND_OFFSET != 0 {
        return None;
    }
    let total_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let tcp = packet.get(20..total_len)?;
    let header: &[u8; 20] = tcp.get(..20)?.try_into().ok()?;
    let data_offset = usize::from(header[12] >> 4) * 4;
    if data_offset < 20 {
        return None;
    }
    let payload = tcp.get(data_offset..)?;
    Some((ip, header, payload))
}

/// Source and destination of a plain IPv4 TCP segment's headers.
#[inline]
fn plain_ipv4_endpoints(ip: &[u8; 20], tcp: &[u8; 20]) -> (SocketAddrV4, SocketAddrV4) {
    let endpoint = |addr: [u8; 4], port: [u8; 2]| {
        SocketAddrV4::new(Ipv4Addr::from(addr), u16::from_be_bytes(port))
    };
    (
        endpoint([ip[12], ip[13], ip[14], ip[15]], [tcp[0], tcp[1]]),
        endpoint([ip[16], ip[17], ip[18], ip[19]], [tcp[2], tcp[3]]),
    )
}

#[inline]
fn tcp_flags(flags: u8) -> TcpFlags {
    TcpFlags {
        syn: flags & 0x02 != 0,
        ack: flags & 0x10 != 0,
        fin: flags & 0x01 != 0,
        rst: flags & 0x04 != 0,
    }
}

/// A plain IPv4 TCP segment's endpoints and flags, for routing every frame without building
/// a segment: the frames [`tcp_endpoints`] reads on its plain IPv4 path, with the same
/// answer; None for every other frame (ask [`tcp_endpoints`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainV4Endpoints {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub flags: TcpFlags,
}

#[inline]
pub fn plain_v4_endpoints(linktype: u32, frame: &[u8]) -> Option<PlainV4Endpoints> {
    let packet = if linktype == dlt::EN10MB {
        ethernet_ip(frame).ok()?
    } else {
        ip_packet(linktype, frame).ok()?
    };
    let (ip, header, _) = plain_ipv4_parts(packet)?;
    let (src, dst) = plain_ipv4_endpoints(ip, header);
    Some(PlainV4Endpoints {
        src,
        dst,
        flags: tcp_flags(header[13]),
    })
}

/// IPv4/IPv6 (with extension headers) and TCP, via etherparse's lax slicing:
/// the IP length field bounds the payload when the frame holds all of it
/// (dropping link padding / FCS), and the captured bytes are used when the
/// frame was cut short.
#[inline(never)]
fn decode_ip_general(packet: &[u8]) -> Decoded<'_> {
    let Ok((ip, ext_error)) = LaxIpSlice::from_slice(packet) else {
        return Decoded::Skipped(SkipReason::Malformed);
    };
    if ext_error.is_some() {
        // A broken extension header chain leaves the transport header unknown.
        return Decoded::Skipped(SkipReason::Malformed);
    }
    let payload = ip.payload();
    if payload.ip_number != IpNumber::TCP {
        return Decoded::Skipped(SkipReason::NotTcp);
    }
    if payload.fragmented {
        return Decoded::Skipped(SkipReason::IpFragment);
    }
    let Ok(tcp) = TcpSlice::from_slice(payload.payload) else {
        return Decoded::Skipped(SkipReason::Malformed);
    };
    Decoded::Tcp(TcpSegment {
        src: SocketAddr::new(ip.source_addr(), tcp.source_port()),
        dst: SocketAddr::new(ip.destination_addr(), tcp.destination_port()),
        seq: tcp.sequence_number(),
        ack: tcp.acknowledgment_number(),
        flags: TcpFlags {
            syn: tcp.syn(),
            ack: tcp.ack(),
            fin: tcp.fin(),
            rst: tcp.rst(),
        },
        payload: tcp.payload(),
        truncated: payload.incomplete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{PacketBuilder, VlanId};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    const V4_SRC: [u8; 4] = [10, 0, 0, 1];
    const V4_DST: [u8; 4] = [10, 0, 0, 2];
    const V6_SRC: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const V6_DST: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    const PAYLOAD: &[u8] = b"POST /mcp HTTP/1.1\r\n\r\n";

    fn ipv4_tcp() -> Vec<u8> {
        let b = PacketBuilder::ipv4(V4_SRC, V4_DST, 64)
            .tcp(40000, 8080, 1000, 512)
            .ack(77)
            .psh();
        let mut v = Vec::new();
        b.write(&mut v, PAYLOAD).unwrap();
        v
    }

    fn ipv6_tcp() -> Vec<u8> {
        let b = PacketBuilder::ipv6(V6_SRC, V6_DST, 64)
            .tcp(40000, 8080, 1000, 512)
            .syn();
        let mut v = Vec::new();
        b.write(&mut v, PAYLOAD).unwrap();
        v
    }

    fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        v.extend_from_slice(&ethertype.to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn expect_tcp(d: Decoded<'_>) -> TcpSegment<'_> {
        match d {
            Decoded::Tcp(seg) => seg,
            other => panic!("expected TCP, got {other:?}"),
        }
    }

    fn check_v4(seg: &TcpSegment<'_>) {
        assert_eq!(
            seg.src,
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(V4_SRC)), 40000)
        );
        assert_eq!(
            seg.dst,
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(V4_DST)), 8080)
        );
        assert_eq!(seg.seq, 1000);
        assert_eq!(seg.ack, 77);
        assert_eq!(
            seg.flags,
            TcpFlags {
                ack: true,
                ..TcpFlags::default()
            }
        );
        assert_eq!(seg.payload, PAYLOAD);
    }

    fn check_v6(seg: &TcpSegment<'_>) {
        assert_eq!(
            seg.src,
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(V6_SRC)), 40000)
        );
        assert_eq!(
            seg.dst,
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(V6_DST)), 8080)
        );
        assert!(seg.flags.syn && !seg.flags.ack);
        assert_eq!(seg.payload, PAYLOAD);
    }

    #[test]
    fn ethernet_ipv4_tcp_via_builder() {
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(V4_SRC, V4_DST, 64)
            .tcp(40000, 8080, 1000, 512)
            .ack(77);
        let mut frame = Vec::new();
        b.write(&mut frame, PAYLOAD).unwrap();
        check_v4(&expect_tcp(decode(dlt::EN10MB, &frame)));
    }

    #[test]
    fn ethernet_ipv6_tcp() {
        let frame = eth(0x86DD, &ipv6_tcp());
        check_v6(&expect_tcp(decode(dlt::EN10MB, &frame)));
    }

    #[test]
    fn single_vlan_via_builder() {
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .single_vlan(VlanId::try_new(42).unwrap())
            .ipv4(V4_SRC, V4_DST, 64)
            .tcp(40000, 8080, 1000, 512)
            .ack(77);
        let mut frame = Vec::new();
        b.write(&mut frame, PAYLOAD).unwrap();
        assert_eq!(&frame[12..14], &[0x81, 0x00]);
        check_v4(&expect_tcp(decode(dlt::EN10MB, &frame)));
    }

    #[test]
    fn double_vlan_qinq_and_old_9100() {
        for outer in [0x88A8u16, 0x9100, 0x8100] {
            // outer tag (VID 100) -> inner 802.1Q tag (VID 42) -> IPv4
            let mut body = vec![0x00, 0x64, 0x81, 0x00, 0x00, 0x2a, 0x08, 0x00];
            body.extend_from_slice(&ipv4_tcp());
            let frame = eth(outer, &body);
            check_v4(&expect_tcp(decode(dlt::EN10MB, &frame)));
        }
    }

    #[test]
    fn triple_stacked_tags() {
        let mut body = vec![0, 1, 0x91, 0x00, 0, 2, 0x81, 0x00, 0, 3, 0x86, 0xdd];
        body.extend_from_slice(&ipv6_tcp());
        check_v6(&expect_tcp(decode(dlt::EN10MB, &eth(0x88A8, &body))));
    }

    #[test]
    fn endless_vlan_tags_are_malformed() {
        let body: Vec<u8> = [0u8, 1, 0x81, 0x00].repeat(20);
        assert_eq!(
            decode(dlt::EN10MB, &eth(0x8100, &body)),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    #[test]
    fn truncated_vlan_tag_is_malformed() {
        assert_eq!(
            decode(dlt::EN10MB, &eth(0x8100, &[0, 1, 0x08])),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    #[test]
    fn linux_sll_v1() {
        let b = PacketBuilder::linux_sll(
            etherparse::LinuxSllPacketType::OUTGOING,
            6,
            [1, 2, 3, 4, 5, 6, 0, 0],
        )
        .ipv4(V4_SRC, V4_DST, 64)
        .tcp(40000, 8080, 1000, 512)
        .ack(77);
        let mut frame = Vec::new();
        b.write(&mut frame, PAYLOAD).unwrap();
        check_v4(&expect_tcp(decode(dlt::LINUX_SLL, &frame)));

        // Hand-built IPv6 over SLL with a loopback ARPHRD (772).
        let mut frame = vec![0, 0, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x86, 0xdd];
        frame.extend_from_slice(&ipv6_tcp());
        check_v6(&expect_tcp(decode(dlt::LINUX_SLL, &frame)));
    }

    fn sll2(protocol: u16, arphrd: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&protocol.to_be_bytes());
        v.extend_from_slice(&[0, 0]); // reserved
        v.extend_from_slice(&7u32.to_be_bytes()); // interface index
        v.extend_from_slice(&arphrd.to_be_bytes());
        v.push(4); // packet type: outgoing
        v.push(6); // address length
        v.extend_from_slice(&[1, 2, 3, 4, 5, 6, 0, 0]);
        assert_eq!(v.len(), SLL2_HEADER_LEN);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn linux_sll_v2_ipv4_and_ipv6() {
        check_v4(&expect_tcp(decode(
            dlt::LINUX_SLL2,
            &sll2(0x0800, 1, &ipv4_tcp()),
        )));
        check_v6(&expect_tcp(decode(
            dlt::LINUX_SLL2,
            &sll2(0x86DD, 772, &ipv6_tcp()),
        )));
        assert_eq!(
            decode(dlt::LINUX_SLL2, &sll2(0x0806, 1, &[0; 28])),
            Decoded::Skipped(SkipReason::NotIp)
        );
        assert_eq!(
            decode(dlt::LINUX_SLL2, &sll2(0x0800, 824, &ipv4_tcp())),
            Decoded::Skipped(SkipReason::NotIp)
        );
        let short = sll2(0x0800, 1, &[]);
        assert_eq!(
            decode(dlt::LINUX_SLL2, &short[..19]),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    #[test]
    fn raw_ipv4_and_ip_linktypes() {
        let p = ipv4_tcp();
        for lt in [dlt::RAW, dlt::RAW_DLT12, dlt::RAW_DLT14, dlt::IPV4] {
            check_v4(&expect_tcp(decode(lt, &p)));
        }
        check_v6(&expect_tcp(decode(dlt::IPV6, &ipv6_tcp())));
        assert_eq!(
            decode(dlt::IPV6, &p),
            Decoded::Skipped(SkipReason::Malformed)
        );
        assert_eq!(
            decode(dlt::RAW, &[0x50; 40]),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    /// Inserts an 8-byte IPv6 extension header of type `ext` right after the
    /// fixed header, fixing up next-header and payload length.
    fn with_ipv6_ext(ext: u8) -> Vec<u8> {
        let p = ipv6_tcp();
        let mut v = p[..40].to_vec();
        v[6] = ext;
        let plen = u16::from_be_bytes([v[4], v[5]]) + 8;
        v[4..6].copy_from_slice(&plen.to_be_bytes());
        // next header TCP, length 0 (8 bytes), PadN option filling 6 bytes
        v.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]);
        v.extend_from_slice(&p[40..]);
        v
    }

    #[test]
    fn raw_ipv6_with_extension_headers() {
        for ext in [0u8 /* hop-by-hop */, 60 /* destination options */] {
            check_v6(&expect_tcp(decode(dlt::RAW, &with_ipv6_ext(ext))));
        }
    }

    #[test]
    fn truncated_extension_header_is_malformed() {
        let v = with_ipv6_ext(60);
        assert_eq!(
            decode(dlt::RAW, &v[..44]),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    #[test]
    fn bsd_null_both_byte_orders_and_loop() {
        let v4 = ipv4_tcp();
        let v6 = ipv6_tcp();
        for af in [2u32] {
            for bytes in [af.to_le_bytes(), af.to_be_bytes()] {
                let mut f = bytes.to_vec();
                f.extend_from_slice(&v4);
                check_v4(&expect_tcp(decode(dlt::NULL, &f)));
            }
        }
        for af in [10u32, 23, 24, 28, 30] {
            for bytes in [af.to_le_bytes(), af.to_be_bytes()] {
                let mut f = bytes.to_vec();
                f.extend_from_slice(&v6);
                check_v6(&expect_tcp(decode(dlt::NULL, &f)));
            }
        }
        // LOOP: network byte order
        let mut f = 2u32.to_be_bytes().to_vec();
        f.extend_from_slice(&v4);
        check_v4(&expect_tcp(decode(dlt::LOOP, &f)));
        let mut f = 30u32.to_be_bytes().to_vec();
        f.extend_from_slice(&v6);
        check_v6(&expect_tcp(decode(dlt::LOOP, &f)));
        // unknown family (AF_APPLETALK = 16)
        let mut f = 16u32.to_le_bytes().to_vec();
        f.extend_from_slice(&v4);
        assert_eq!(decode(dlt::NULL, &f), Decoded::Skipped(SkipReason::NotIp));
        assert_eq!(
            decode(dlt::NULL, &[2, 0]),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    #[test]
    fn udp_is_not_tcp() {
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(V4_SRC, V4_DST, 64)
            .udp(53, 53);
        let mut frame = Vec::new();
        b.write(&mut frame, b"dns").unwrap();
        assert_eq!(
            decode(dlt::EN10MB, &frame),
            Decoded::Skipped(SkipReason::NotTcp)
        );
    }

    #[test]
    fn arp_and_other_ethertypes_are_not_ip() {
        let arp = [
            0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
        ];
        assert_eq!(
            decode(dlt::EN10MB, &eth(0x0806, &arp)),
            Decoded::Skipped(SkipReason::NotIp)
        );
        // 802.3 length field instead of an ethertype
        assert_eq!(
            decode(dlt::EN10MB, &eth(0x0040, &[0; 64])),
            Decoded::Skipped(SkipReason::NotIp)
        );
    }

    #[test]
    fn ipv4_fragments_are_skipped() {
        // More-fragments set.
        let mut p = ipv4_tcp();
        p[6] |= 0x20;
        assert_eq!(
            decode(dlt::RAW, &p),
            Decoded::Skipped(SkipReason::IpFragment)
        );
        // Non-zero offset, MF clear (last fragment).
        let mut p = ipv4_tcp();
        p[6] = 0;
        p[7] = 10;
        assert_eq!(
            decode(dlt::RAW, &p),
            Decoded::Skipped(SkipReason::IpFragment)
        );
        // Don't-fragment alone is a whole packet.
        let mut p = ipv4_tcp();
        p[6] = 0x40;
        p[7] = 0;
        check_v4(&expect_tcp(decode(dlt::RAW, &p)));
    }

    #[test]
    fn ipv6_fragment_header_is_skipped() {
        let p = ipv6_tcp();
        let mut v = p[..40].to_vec();
        v[6] = 44; // fragment header
        let plen = u16::from_be_bytes([v[4], v[5]]) + 8;
        v[4..6].copy_from_slice(&plen.to_be_bytes());
        // next header TCP, reserved, offset 0 with M flag set, identification
        v.extend_from_slice(&[6, 0, 0x00, 0x01, 0, 0, 0, 9]);
        v.extend_from_slice(&p[40..]);
        assert_eq!(
            decode(dlt::RAW, &v),
            Decoded::Skipped(SkipReason::IpFragment)
        );
    }

    #[test]
    fn garbage_and_truncation_never_panic() {
        let frame = eth(0x0800, &ipv4_tcp());
        for lt in [
            dlt::EN10MB,
            dlt::LINUX_SLL,
            dlt::LINUX_SLL2,
            dlt::RAW,
            dlt::NULL,
            dlt::LOOP,
            dlt::IPV4,
            dlt::IPV6,
        ] {
            for len in 0..frame.len() {
                let _ = decode(lt, &frame[..len]);
            }
            // pseudo-random bytes
            let mut x: u32 = 0x1234_5678 ^ lt;
            for len in 0..200 {
                let junk: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect();
                let _ = decode(lt, &junk);
            }
        }
        assert_eq!(
            decode(dlt::EN10MB, &[]),
            Decoded::Skipped(SkipReason::Malformed)
        );
        assert_eq!(
            decode(dlt::EN10MB, &frame[..13]),
            Decoded::Skipped(SkipReason::Malformed)
        );
        // IP header cut short
        assert_eq!(
            decode(dlt::EN10MB, &frame[..14 + 10]),
            Decoded::Skipped(SkipReason::Malformed)
        );
        // TCP header cut short
        assert_eq!(
            decode(dlt::EN10MB, &frame[..14 + 20 + 10]),
            Decoded::Skipped(SkipReason::Malformed)
        );
        // IHL below 5
        let mut bad = ipv4_tcp();
        bad[0] = 0x44;
        assert_eq!(
            decode(dlt::RAW, &bad),
            Decoded::Skipped(SkipReason::Malformed)
        );
        // TCP data offset below 5
        let mut bad = ipv4_tcp();
        bad[20 + 12] = 0x40;
        assert_eq!(
            decode(dlt::RAW, &bad),
            Decoded::Skipped(SkipReason::Malformed)
        );
    }

    #[test]
    fn snaplen_truncated_frame_yields_captured_payload() {
        let frame = eth(0x0800, &ipv4_tcp());
        let cut = &frame[..frame.len() - 5];
        let seg = expect_tcp(decode(dlt::EN10MB, cut));
        assert_eq!(seg.payload, &PAYLOAD[..PAYLOAD.len() - 5]);
        assert!(seg.truncated);
        // header complete, payload entirely missing
        let seg = expect_tcp(decode(dlt::EN10MB, &frame[..14 + 40]));
        assert!(seg.payload.is_empty() && seg.truncated);
        assert!(!expect_tcp(decode(dlt::EN10MB, &frame)).truncated);
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        // A bare ACK is padded to the 60-byte Ethernet minimum; a trailing FCS
        // may follow too. Neither belongs to TCP.
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(V4_SRC, V4_DST, 64)
            .tcp(40000, 8080, 1000, 512)
            .ack(77);
        let mut frame = Vec::new();
        b.write(&mut frame, &[]).unwrap();
        assert_eq!(frame.len(), 54);
        frame.extend_from_slice(&[0; 6]);
        frame.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let seg = expect_tcp(decode(dlt::EN10MB, &frame));
        assert!(seg.payload.is_empty());

        let mut frame = eth(0x86DD, &ipv6_tcp());
        frame.extend_from_slice(&[0xaa; 8]);
        check_v6(&expect_tcp(decode(dlt::EN10MB, &frame)));
    }

    #[test]
    fn tso_zero_total_length_uses_captured_bytes() {
        let mut p = ipv4_tcp();
        p[2] = 0;
        p[3] = 0;
        check_v4(&expect_tcp(decode(dlt::RAW, &p)));
    }

    #[test]
    fn payload_borrows_from_frame() {
        let frame = eth(0x0800, &ipv4_tcp());
        let seg = expect_tcp(decode(dlt::EN10MB, &frame));
        let start = frame.len() - PAYLOAD.len();
        assert!(std::ptr::eq(seg.payload.as_ptr(), frame[start..].as_ptr()));
    }

    #[test]
    fn unknown_link_type() {
        assert_eq!(
            decode(105, &ipv4_tcp()),
            Decoded::Skipped(SkipReason::UnsupportedLink)
        );
        assert!(!is_supported_link(105));
        for lt in [0, 1, 12, 14, 101, 108, 113, 228, 229, 276] {
            assert!(is_supported_link(lt), "{lt}");
        }
    }

    /// Valid IPv4/TCP packets of all shapes, then mutated: header bytes rewritten at random,
    /// cut short, padded.
    fn ipv4_packets() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec((0usize..60, any::<u8>()), 0..4),
            proptest::option::of(0usize..80),
            0usize..8,
        )
            .prop_map(|(src, dst, sp, dp, seq, payload, edits, cut, pad)| {
                let mut v = Vec::new();
                PacketBuilder::ipv4(src, dst, 64)
                    .tcp(sp, dp, seq, 512)
                    .ack(seq ^ 0x5555)
                    .write(&mut v, &payload)
                    .unwrap();
                for (at, byte) in edits {
                    if let Some(b) = v.get_mut(at) {
                        *b = byte;
                    }
                }
                v.truncate(v.len().saturating_sub(cut.unwrap_or(0)));
                v.extend(std::iter::repeat_n(0xee, pad));
                v
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        #[test]
        fn plain_ipv4_fast_path_agrees_with_etherparse(packet in ipv4_packets()) {
            if let Some(seg) = plain_ipv4_tcp(&packet) {
                proptest::prop_assert_eq!(Decoded::Tcp(seg), decode_ip_general(&packet));
            }
        }

        #[test]
        fn routing_decode_agrees_with_decode(packet in ipv4_packets(), v6 in proptest::bool::ANY) {
            // As raw IP and behind Ethernet (IPv4, or the IPv6 ethertype for a mismatch).
            let ethertype = if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 };
            for (linktype, frame) in [
                (dlt::RAW, packet.clone()),
                (dlt::EN10MB, eth(ethertype, &packet)),
                (dlt::IPV4, packet.clone()),
                (dlt::NULL, [&[2u8, 0, 0, 0][..], &packet].concat()),
            ] {
                let full = match decode(linktype, &frame) {
                    Decoded::Tcp(seg) => Some(TcpEndpoints { src: seg.src, dst: seg.dst, flags: seg.flags }),
                    Decoded::Skipped(_) => None,
                };
                proptest::prop_assert_eq!(tcp_endpoints(linktype, &frame), full);
                // The routing fast path: the plain IPv4 frames only, read alike.
                if let Some(e) = plain_v4_endpoints(linktype, &frame) {
                    let fast = TcpEndpoints { src: e.src.into(), dst: e.dst.into(), flags: e.flags };
                    proptest::prop_assert_eq!(Some(fast), full);
                } else if let Ok(ip) = ip_packet(linktype, &frame) {
                    proptest::prop_assert!(plain_ipv4_tcp(ip).is_none());
                }
            }
        }
    }

    #[test]
    fn plain_ipv4_fast_path_takes_the_common_case_only() {
        let plain = ipv4_tcp();
        assert_eq!(
            plain_ipv4_tcp(&plain).map(Decoded::Tcp),
            Some(decode_ip_general(&plain))
        );
        let mut padded = plain.clone();
        padded.extend_from_slice(&[0; 6]); // Ethernet minimum-size padding
        assert_eq!(plain_ipv4_tcp(&padded).map(|s| s.payload), Some(PAYLOAD));
        let mut fragment = plain.clone();
        fragment[6] |= 0x20; // more fragments
        let mut cut = plain.clone();
        cut.pop();
        let mut options = plain.clone();
        options[0] = 0x46;
        for other in [fragment, cut, options, ipv6_tcp()] {
            assert!(plain_ipv4_tcp(&other).is_none());
        }
    }

    #[test]
    fn skip_reason_names() {
        let all = [
            (SkipReason::UnsupportedLink, "unsupported_link"),
            (SkipReason::NotIp, "not_ip"),
            (SkipReason::NotTcp, "not_tcp"),
            (SkipReason::IpFragment, "ip_fragment"),
            (SkipReason::Malformed, "malformed"),
        ];
        for (r, s) in all {
            assert_eq!(r.as_str(), s);
        }
    }
}
