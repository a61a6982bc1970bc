//! The one frame emitter. Header layouts are named field ranges (smoltcp `wire` style) that
//! mirror what `mcptap_core::decode` reads; [`TcpFrame::write`] fills them in order and then
//! patches lengths and checksums through the same names.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use mcptap_core::decode::dlt;

/// A byte range inside a header.
pub type Field = Range<usize>;

/// Ethernet II.
pub mod ethernet {
    use super::Field;
    pub const DESTINATION: Field = 0..6;
    pub const SOURCE: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    pub const HEADER_LEN: usize = 14;
    pub const ETHERTYPE_IPV4: u16 = 0x0800;
    pub const ETHERTYPE_IPV6: u16 = 0x86DD;
    /// 802.1Q customer tag.
    pub const ETHERTYPE_VLAN: u16 = 0x8100;
    /// 802.1ad service tag (the outer tag of QinQ).
    pub const ETHERTYPE_QINQ: u16 = 0x88A8;
}

/// One 802.1Q / 802.1ad tag, after the tag's own TPID (which sits where the ethertype was).
pub mod vlan {
    use super::Field;
    pub const TCI: Field = 0..2;
    pub const ETHERTYPE: Field = 2..4;
    pub const TAG_LEN: usize = 4;
}

/// Linux cooked capture v1 (LINKTYPE_LINUX_SLL).
pub mod sll {
    use super::Field;
    pub const PACKET_TYPE: Field = 0..2;
    pub const ARPHRD: Field = 2..4;
    pub const ADDRESS_LEN: Field = 4..6;
    pub const ADDRESS: Field = 6..14;
    pub const PROTOCOL: Field = 14..16;
    pub const HEADER_LEN: usize = 16;
}

/// Linux cooked capture v2 (LINKTYPE_LINUX_SLL2).
pub mod sll2 {
    use super::Field;
    pub const PROTOCOL: Field = 0..2;
    pub const RESERVED: Field = 2..4;
    pub const INTERFACE_INDEX: Field = 4..8;
    pub const ARPHRD: Field = 8..10;
    pub const PACKET_TYPE: usize = 10;
    pub const ADDRESS_LEN: usize = 11;
    pub const ADDRESS: Field = 12..20;
    pub const HEADER_LEN: usize = 20;
}

/// BSD loopback (LINKTYPE_NULL): the address family in the capturing host's byte order.
pub mod null {
    use super::Field;
    pub const FAMILY: Field = 0..4;
    pub const HEADER_LEN: usize = 4;
    pub const AF_INET: u32 = 2;
    /// AF_INET6 as macOS numbers it, where BSD loopback captures usually come from.
    pub const AF_INET6: u32 = 30;
}

/// IPv4 without options.
pub mod ipv4 {
    use super::Field;
    pub const VERSION_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const TOTAL_LEN: Field = 2..4;
    pub const IDENTIFICATION: Field = 4..6;
    pub const FLAGS_FRAGMENT: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SOURCE: Field = 12..16;
    pub const DESTINATION: Field = 16..20;
    pub const HEADER_LEN: usize = 20;
    pub const DONT_FRAGMENT: u16 = 0x4000;
}

/// IPv6 fixed header.
pub mod ipv6 {
    use super::Field;
    pub const VERSION_CLASS_FLOW: Field = 0..4;
    pub const PAYLOAD_LEN: Field = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SOURCE: Field = 8..24;
    pub const DESTINATION: Field = 24..40;
    pub const HEADER_LEN: usize = 40;
}

/// TCP; options follow the fixed header, data offset counts both.
pub mod tcp {
    use super::Field;
    pub const SOURCE_PORT: Field = 0..2;
    pub const DESTINATION_PORT: Field = 2..4;
    pub const SEQUENCE: Field = 4..8;
    pub const ACKNOWLEDGEMENT: Field = 8..12;
    pub const DATA_OFFSET: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: Field = 14..16;
    pub const CHECKSUM: Field = 16..18;
    pub const URGENT: Field = 18..20;
    pub const HEADER_LEN: usize = 20;
    pub const PROTOCOL_NUMBER: u8 = 6;
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

/// ARPHRD_LOOPBACK, the device type of `lo` in SLL/SLL2 headers.
pub const ARPHRD_LOOPBACK: u16 = 772;

/// One VLAN tag: its TPID and the 12-bit VLAN id (priority and DEI zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlanTag {
    pub tpid: u16,
    pub vid: u16,
}

impl VlanTag {
    /// A plain 802.1Q tag.
    pub fn dot1q(vid: u16) -> Self {
        VlanTag {
            tpid: ethernet::ETHERTYPE_VLAN,
            vid,
        }
    }

    /// An 802.1ad service tag (outer tag of QinQ).
    pub fn dot1ad(vid: u16) -> Self {
        VlanTag {
            tpid: ethernet::ETHERTYPE_QINQ,
            vid,
        }
    }
}

/// The link layer a frame is wrapped in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Ethernet II with VLAN tags, outermost first (none: untagged).
    Ethernet { vlan_tags: Vec<VlanTag> },
    /// Linux cooked capture v1, as from `lo` (the source MAC as address).
    LinuxSll,
    /// Linux cooked capture v2 (`tcpdump -i any`), as from `lo`.
    LinuxSll2,
    /// Raw IP (LINKTYPE_RAW).
    RawIp,
    /// BSD loopback (LINKTYPE_NULL), little-endian family.
    BsdLoopback,
}

impl Default for Link {
    /// Untagged Ethernet II.
    fn default() -> Self {
        Link::Ethernet {
            vlan_tags: Vec::new(),
        }
    }
}

impl Link {
    /// Ethernet with one 802.1Q tag.
    pub fn vlan(vid: u16) -> Self {
        Link::Ethernet {
            vlan_tags: vec![VlanTag::dot1q(vid)],
        }
    }

    /// Ethernet with an 802.1ad outer and an 802.1Q inner tag.
    pub fn qinq(outer: u16, inner: u16) -> Self {
        Link::Ethernet {
            vlan_tags: vec![VlanTag::dot1ad(outer), VlanTag::dot1q(inner)],
        }
    }

    /// The pcap link type of frames built with this link.
    pub fn linktype(&self) -> u32 {
        match self {
            Link::Ethernet { .. } => dlt::EN10MB,
            Link::LinuxSll => dlt::LINUX_SLL,
            Link::LinuxSll2 => dlt::LINUX_SLL2,
            Link::RawIp => dlt::RAW,
            Link::BsdLoopback => dlt::NULL,
        }
    }

    fn vlan_tags(&self) -> &[VlanTag] {
        match self {
            Link::Ethernet { vlan_tags } => vlan_tags,
            _ => &[],
        }
    }
}

/// Locally administered MACs used when a frame names none: the client side and the server side.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// Everything about one TCP frame except its payload.
#[derive(Debug, Clone)]
pub struct TcpFrame<'a> {
    pub link: &'a Link,
    pub source_mac: [u8; 6],
    pub destination_mac: [u8; 6],
    /// Both endpoints must be of the same address family.
    pub source: SocketAddr,
    pub destination: SocketAddr,
    /// IPv4 identification (ignored for IPv6).
    pub ip_id: u16,
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv4 DF bit.
    pub dont_fragment: bool,
    pub seq: u32,
    pub ack: u32,
    /// [`tcp::FIN`] | [`tcp::SYN`] | ...
    pub flags: u8,
    pub window: u16,
    /// Raw TCP options, a multiple of 4 bytes long.
    pub options: &'a [u8],
}

impl<'a> TcpFrame<'a> {
    /// A frame from `source` to `destination` with defaults: MACs [`CLIENT_MAC`] →
    /// [`SERVER_MAC`], TTL 64, DF set, IP id 0, window 65535, no flags, no options.
    pub fn new(link: &'a Link, source: SocketAddr, destination: SocketAddr) -> Self {
        TcpFrame {
            link,
            source_mac: CLIENT_MAC,
            destination_mac: SERVER_MAC,
            source,
            destination,
            ip_id: 0,
            ttl: 64,
            dont_fragment: true,
            seq: 0,
            ack: 0,
            flags: 0,
            window: 65535,
            options: &[],
        }
    }

    /// The frame around `payload`, as a new vector.
    pub fn to_vec(&self, payload: &[u8]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(80 + payload.len());
        self.write(&mut buf, |b| b.extend_from_slice(payload));
        buf
    }

    /// Writes the frame into `buf` (cleared first): headers, then the payload `fill` appends,
    /// then lengths and both checksums.
    pub fn write(&self, buf: &mut Vec<u8>, fill: impl FnOnce(&mut Vec<u8>)) {
        assert!(
            self.options.len().is_multiple_of(4),
            "TCP options must be padded to 4 bytes"
        );
        let v4 = match (self.source.ip(), self.destination.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => true,
            (IpAddr::V6(_), IpAddr::V6(_)) => false,
            (s, d) => panic!("mixed address families {s} -> {d}"),
        };
        let ethertype = if v4 {
            ethernet::ETHERTYPE_IPV4
        } else {
            ethernet::ETHERTYPE_IPV6
        };
        buf.clear();
        self.write_link(buf, ethertype);
        let ip_start = buf.len();
        if v4 {
            self.write_ipv4(buf);
        } else {
            self.write_ipv6(buf);
        }
        let tcp_start = buf.len();
        let header_len = tcp::HEADER_LEN + self.options.len();
        buf.resize(tcp_start + tcp::HEADER_LEN, 0);
        {
            let h = &mut buf[tcp_start..];
            h[tcp::SOURCE_PORT].copy_from_slice(&self.source.port().to_be_bytes());
            h[tcp::DESTINATION_PORT].copy_from_slice(&self.destination.port().to_be_bytes());
            h[tcp::SEQUENCE].copy_from_slice(&self.seq.to_be_bytes());
            h[tcp::ACKNOWLEDGEMENT].copy_from_slice(&self.ack.to_be_bytes());
            h[tcp::DATA_OFFSET] = ((header_len / 4) as u8) << 4;
            h[tcp::FLAGS] = self.flags;
            h[tcp::WINDOW].copy_from_slice(&self.window.to_be_bytes());
        }
        buf.extend_from_slice(self.options);
        fill(buf);
        let tcp_len = buf.len() - tcp_start;
        if v4 {
            let total = u16::try_from(buf.len() - ip_start).expect("IPv4 packet over 64 KiB");
            let ip = &mut buf[ip_start..];
            ip[ipv4::TOTAL_LEN].copy_from_slice(&total.to_be_bytes());
            let sum = checksum(&ip[..ipv4::HEADER_LEN], 0);
            ip[ipv4::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
        } else {
            let len = u16::try_from(tcp_len).expect("IPv6 payload over 64 KiB");
            buf[ip_start..][ipv6::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
        }
        let pseudo = pseudo_header_sum(&buf[ip_start..tcp_start], v4, tcp_len);
        let sum = checksum(&buf[tcp_start..], pseudo);
        buf[tcp_start..][tcp::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }

    fn write_link(&self, buf: &mut Vec<u8>, ethertype: u16) {
        let tags = self.link.vlan_tags();
        match self.link {
            Link::Ethernet { .. } => {
                buf.resize(ethernet::HEADER_LEN, 0);
                buf[ethernet::DESTINATION].copy_from_slice(&self.destination_mac);
                buf[ethernet::SOURCE].copy_from_slice(&self.source_mac);
                // Each tag's TPID takes the ethertype's place; the real one follows the last tag.
                let first_type = tags.first().map_or(ethertype, |t| t.tpid);
                buf[ethernet::ETHERTYPE].copy_from_slice(&first_type.to_be_bytes());
                for (i, tag) in tags.iter().enumerate() {
                    let next = tags.get(i + 1).map_or(ethertype, |t| t.tpid);
                    let at = buf.len();
                    buf.resize(at + vlan::TAG_LEN, 0);
                    let t = &mut buf[at..];
                    t[vlan::TCI].copy_from_slice(&(tag.vid & 0x0fff).to_be_bytes());
                    t[vlan::ETHERTYPE].copy_from_slice(&next.to_be_bytes());
                }
            }
            Link::LinuxSll => {
                buf.resize(sll::HEADER_LEN, 0);
                buf[sll::PACKET_TYPE].copy_from_slice(&0u16.to_be_bytes()); // PACKET_HOST
                buf[sll::ARPHRD].copy_from_slice(&ARPHRD_LOOPBACK.to_be_bytes());
                buf[sll::ADDRESS_LEN].copy_from_slice(&6u16.to_be_bytes());
                buf[sll::ADDRESS][..6].copy_from_slice(&self.source_mac);
                buf[sll::PROTOCOL].copy_from_slice(&ethertype.to_be_bytes());
            }
            Link::LinuxSll2 => {
                buf.resize(sll2::HEADER_LEN, 0);
                buf[sll2::PROTOCOL].copy_from_slice(&ethertype.to_be_bytes());
                buf[sll2::RESERVED].copy_from_slice(&0u16.to_be_bytes());
                buf[sll2::INTERFACE_INDEX].copy_from_slice(&1u32.to_be_bytes()); // lo
                buf[sll2::ARPHRD].copy_from_slice(&ARPHRD_LOOPBACK.to_be_bytes());
                buf[sll2::PACKET_TYPE] = 0; // PACKET_HOST
                buf[sll2::ADDRESS_LEN] = 6;
                buf[sll2::ADDRESS][..6].copy_from_slice(&self.source_mac);
            }
            Link::RawIp => {}
            Link::BsdLoopback => {
                let family = if ethertype == ethernet::ETHERTYPE_IPV4 {
                    null::AF_INET
                } else {
                    null::AF_INET6
                };
                buf.resize(null::HEADER_LEN, 0);
                buf[null::FAMILY].copy_from_slice(&family.to_le_bytes());
            }
        }
    }

    fn write_ipv4(&self, buf: &mut Vec<u8>) {
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (self.source.ip(), self.destination.ip()) else {
            unreachable!("checked by write")
        };
        let at = buf.len();
        buf.resize(at + ipv4::HEADER_LEN, 0);
        let ip = &mut buf[at..];
        ip[ipv4::VERSION_IHL] = 0x45;
        ip[ipv4::DSCP_ECN] = 0;
        ip[ipv4::IDENTIFICATION].copy_from_slice(&self.ip_id.to_be_bytes());
        let flags = if self.dont_fragment {
            ipv4::DONT_FRAGMENT
        } else {
            0
        };
        ip[ipv4::FLAGS_FRAGMENT].copy_from_slice(&flags.to_be_bytes());
        ip[ipv4::TTL] = self.ttl;
        ip[ipv4::PROTOCOL] = tcp::PROTOCOL_NUMBER;
        ip[ipv4::SOURCE].copy_from_slice(&src.octets());
        ip[ipv4::DESTINATION].copy_from_slice(&dst.octets());
    }

    fn write_ipv6(&self, buf: &mut Vec<u8>) {
        let (IpAddr::V6(src), IpAddr::V6(dst)) = (self.source.ip(), self.destination.ip()) else {
            unreachable!("checked by write")
        };
        let at = buf.len();
        buf.resize(at + ipv6::HEADER_LEN, 0);
        let ip = &mut buf[at..];
        ip[ipv6::VERSION_CLASS_FLOW].copy_from_slice(&(6u32 << 28).to_be_bytes());
        ip[ipv6::NEXT_HEADER] = tcp::PROTOCOL_NUMBER;
        ip[ipv6::HOP_LIMIT] = self.ttl;
        ip[ipv6::SOURCE].copy_from_slice(&src.octets());
        ip[ipv6::DESTINATION].copy_from_slice(&dst.octets());
    }
}

/// The TCP options Linux sends: on a SYN, MSS 1460, SACK permitted, timestamps, NOP and
/// window scale 7 (20 bytes); otherwise NOP, NOP, timestamps (12 bytes). Returns the buffer
/// and the used length.
pub fn linux_tcp_options(syn: bool, tsval: u32, tsecr: u32) -> ([u8; 20], usize) {
    let mut o = [0u8; 20];
    if syn {
        o[..8].copy_from_slice(&[2, 4, 0x05, 0xb4, 4, 2, 8, 10]);
        o[8..12].copy_from_slice(&tsval.to_be_bytes());
        o[12..16].copy_from_slice(&tsecr.to_be_bytes());
        o[16..20].copy_from_slice(&[1, 3, 3, 7]);
        (o, 20)
    } else {
        o[..4].copy_from_slice(&[1, 1, 8, 10]);
        o[4..8].copy_from_slice(&tsval.to_be_bytes());
        o[8..12].copy_from_slice(&tsecr.to_be_bytes());
        (o, 12)
    }
}

/// One's-complement sum of `data` (big-endian 16-bit words) added to `acc`, unfolded.
fn sum_words(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        let v = u64::from_be_bytes(word);
        acc += (v >> 32) + (v & 0xffff_ffff);
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 2 {
        acc += u64::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let [last] = rest {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// The Internet checksum of `data` with `acc` (a pseudo-header sum) folded in.
fn checksum(data: &[u8], acc: u64) -> u16 {
    let mut acc = sum_words(data, acc);
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Sum of the TCP pseudo header, given the IP header bytes.
fn pseudo_header_sum(ip_header: &[u8], v4: bool, tcp_len: usize) -> u64 {
    let addresses = if v4 {
        ipv4::SOURCE.start..ipv4::DESTINATION.end
    } else {
        ipv6::SOURCE.start..ipv6::DESTINATION.end
    };
    sum_words(&ip_header[addresses], 0) + u64::from(tcp::PROTOCOL_NUMBER) + tcp_len as u64
}

/// Recomputes the IPv4 header and TCP checksums of an Ethernet / IPv4 / TCP frame in place
/// (after a test edited addresses, ports or sequence numbers).
pub fn fix_ipv4_tcp_checksums(frame: &mut [u8]) {
    let ip_start = ethernet::HEADER_LEN;
    let ihl = usize::from(frame[ip_start + ipv4::VERSION_IHL] & 0x0f) * 4;
    let ip = &mut frame[ip_start..];
    ip[ipv4::CHECKSUM].fill(0);
    let sum = checksum(&ip[..ihl], 0);
    ip[ipv4::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([
        ip[ipv4::TOTAL_LEN.start],
        ip[ipv4::TOTAL_LEN.start + 1],
    ]));
    let end = total.min(ip.len());
    let tcp_len = end - ihl;
    let pseudo = pseudo_header_sum(&ip[..ihl], true, tcp_len);
    let segment = &mut ip[ihl..end];
    segment[tcp::CHECKSUM].fill(0);
    let sum = checksum(segment, pseudo);
    segment[tcp::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
}
