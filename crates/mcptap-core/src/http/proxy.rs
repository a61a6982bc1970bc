//! The PROXY protocol header (HAProxy, v1 text and v2 binary) a load balancer may send before
//! the first HTTP request of a connection: it names the client the balancer accepted.
//! Push-style: bytes in as they arrive, a verdict once the header is complete or ruled out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const V1_PREFIX: &[u8] = b"PROXY ";
/// v1 headers are at most 107 bytes, CRLF included.
const V1_MAX: usize = 107;
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The fixed part of a v2 header plus the largest address block read (IPv6: 36 bytes).
const V2_KEEP: usize = 16 + 36;

/// What the bytes seen so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyVerdict {
    /// Not a PROXY header: parse the bytes as HTTP.
    Absent,
    /// Still possibly a header: more bytes needed (all given bytes are held).
    Incomplete,
    /// A complete header of `len` bytes; `source` is the client it names (`None`: `UNKNOWN`
    /// or a `LOCAL` command, e.g. a balancer's health check).
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
    /// It starts like a PROXY header but is malformed: `len` bytes are skipped.
    Malformed { len: usize },
}

/// Examines the first bytes of a connection's client direction.
pub fn examine(data: &[u8]) -> ProxyVerdict {
    let n = data.len().min(V1_PREFIX.len());
    if data[..n] == V1_PREFIX[..n] && !data.is_empty() {
        return v1(data);
    }
    let n = data.len().min(V2_SIGNATURE.len());
    if !data.is_empty() && data[..n] == V2_SIGNATURE[..n] {
        return v2(data);
    }
    ProxyVerdict::Absent
}

fn v1(data: &[u8]) -> ProxyVerdict {
    let Some(end) = memchr::memmem::find(&data[..data.len().min(V1_MAX)], b"\r\n") else {
        return if data.len() >= V1_MAX {
            ProxyVerdict::Malformed { len: V1_MAX }
        } else {
            ProxyVerdict::Incomplete
        };
    };
    let len = end + 2;
    let Ok(line) = std::str::from_utf8(&data[V1_PREFIX.len()..end]) else {
        return ProxyVerdict::Malformed { len };
    };
    let parts: Vec<&str> = line.split(' ').collect();
    let source = match parts.as_slice() {
        ["UNKNOWN", ..] => None,
        [proto, src, _dst, sport, _dport] if *proto == "TCP4" || *proto == "TCP6" => {
            match (src.parse::<IpAddr>(), sport.parse::<u16>()) {
                (Ok(ip), Ok(port)) if ip.is_ipv4() == (*proto == "TCP4") => {
                    Some(SocketAddr::new(ip, port))
                }
                _ => return ProxyVerdict::Malformed { len },
            }
        }
        _ => return ProxyVerdict::Malformed { len },
    };
    ProxyVerdict::Header { len, source }
}

fn v2(data: &[u8]) -> ProxyVerdict {
    if data.len() < 16 {
        return ProxyVerdict::Incomplete;
    }
    let version_command = data[12];
    let family = data[13];
    let body = usize::from(u16::from_be_bytes([data[14], data[15]]));
    let len = 16 + body;
    if version_command >> 4 != 2 {
        return ProxyVerdict::Malformed { len: 16 };
    }
    // Only the address block is read; TLVs after it are skipped by length.
    let address_len = match family >> 4 {
        1 => 12,
        2 => 36,
        _ => 0,
    };
    let needed = 16 + address_len.min(body);
    debug_assert!(needed <= V2_KEEP);
    if data.len() < needed {
        return ProxyVerdict::Incomplete;
    }
    let local = version_command & 0x0f == 0;
    let addresses = &data[16..needed];
    let source = match (local, family >> 4) {
        (true, _) => None,
        (false, 1) if addresses.len() >= 12 => {
            let ip = Ipv4Addr::new(addresses[0], addresses[1], addresses[2], addresses[3]);
            let port = u16::from_be_bytes([addresses[8], addresses[9]]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        (false, 2) if addresses.len() >= 36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&addresses[..16]);
            let port = u16::from_be_bytes([addresses[32], addresses[33]]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
        }
        // AF_UNSPEC, AF_UNIX: no address to use.
        (false, 0 | 3) => None,
        _ => return ProxyVerdict::Malformed { len },
    };
    ProxyVerdict::Header { len, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_headers() {
        let h = b"PROXY TCP4 127.0.9.1 127.0.0.1 56324 443\r\nPOST /mcp HTTP/1.1\r\n";
        assert_eq!(
            examine(h),
            ProxyVerdict::Header {
                len: 42,
                source: Some("127.0.9.1:56324".parse().unwrap())
            }
        );
        assert_eq!(examine(b"PROX"), ProxyVerdict::Incomplete);
        assert_eq!(examine(b"PROXY TCP4 1.2"), ProxyVerdict::Incomplete);
        assert_eq!(
            examine(b"PROXY UNKNOWN\r\n"),
            ProxyVerdict::Header {
                len: 15,
                source: None
            }
        );
        assert_eq!(
            examine(b"PROXY TCP4 ::1 ::1 1 2\r\n"),
            ProxyVerdict::Malformed { len: 24 }
        );
        assert_eq!(
            examine(&[b'P', b'R', b'O', b'X', b'Y', b' '].repeat(30)),
            ProxyVerdict::Malformed { len: V1_MAX }
        );
        assert_eq!(examine(b"POST / HTTP/1.1\r\n"), ProxyVerdict::Absent);
        assert_eq!(examine(b"PRI * HTTP/2.0"), ProxyVerdict::Absent);
    }

    #[test]
    fn v2_headers() {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[
            0x21, 0x11, 0, 12, 127, 0, 9, 2, 127, 0, 0, 1, 0x1f, 0x90, 1, 187,
        ]);
        h.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            examine(&h),
            ProxyVerdict::Header {
                len: 28,
                source: Some("127.0.9.2:8080".parse().unwrap())
            }
        );
        assert_eq!(examine(&h[..20]), ProxyVerdict::Incomplete);
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(
            examine(&local),
            ProxyVerdict::Header {
                len: 16,
                source: None
            }
        );
        // A large TLV block: only the addresses are read, the rest is skipped by length.
        let mut big = V2_SIGNATURE.to_vec();
        big.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        big.extend_from_slice(&[127, 0, 9, 3, 127, 0, 0, 1, 0, 1, 0, 2]);
        assert!(matches!(
            examine(&big),
            ProxyVerdict::Header {
                len: 65551,
                source: Some(_)
            }
        ));
        let mut bad = V2_SIGNATURE.to_vec();
        bad.extend_from_slice(&[0x11, 0x11, 0, 0]);
        assert_eq!(examine(&bad), ProxyVerdict::Malformed { len: 16 });
    }
}
