//! Who talks to whom, the same on every gateway host: server identity, client identity and the
//! client lineage traffic without a session id is tracked by.
//!
//! - *server identity*: the endpoint's configured name (`[servers]`), else the request's `Host`
//!   plus path, else `ip:port`;
//! - *client identity*: behind trusted proxies the first untrusted hop of `Forwarded` or
//!   `X-Forwarded-For` (walked from the nearest hop outwards), else the peer address;
//! - *lineage*: (server identity, client identity, clientInfo name and version, or the
//!   `User-Agent` without clientInfo), named on events by [`lineage_id`].

use crate::http::RequestHead;
use crate::lasting_digest::LastingDigest;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// An address block (`10.0.0.0/8`, `::1/128`, or a single address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses compare as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = canonical(
            addr.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("`{s}` is not an address or address/prefix"))?,
        );
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}`: the prefix must be 0..={max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The `[identity]` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentitySettings {
    /// Proxies whose `Forwarded` / `X-Forwarded-For` headers are believed. Without any, the
    /// client is the connection's peer.
    pub trusted_proxies: Vec<Cidr>,
}

/// Longest identity text kept (hostile `Host` headers are kilobytes).
const MAX_IDENTITY_BYTES: usize = 256;

/// Resolves server and client identities.
#[derive(Debug, Clone, Default)]
pub struct Identities {
    servers: BTreeMap<SocketAddr, String>,
    trusted: Vec<Cidr>,
    /// With redaction: lineage ids are keyed hashes (an unkeyed hash of an address and a client
    /// name is easily reversed by trying them all).
    lineage_key: Option<Vec<u8>>,
}

/// The purpose of route bucket digests ("route" and three NULs, as a number).
const ROUTE_PURPOSE: u64 = 0x726f_7574_6500_0000;

impl Identities {
    pub fn new(servers: BTreeMap<SocketAddr, String>, settings: &IdentitySettings) -> Self {
        Identities {
            servers,
            trusted: settings.trusted_proxies.clone(),
            lineage_key: None,
        }
    }

    /// Lineage ids become HMAC-SHA-256 under `key` (redaction).
    pub fn with_lineage_key(mut self, key: Vec<u8>) -> Self {
        self.lineage_key = Some(key);
        self
    }

    /// The lineage id of these identities (see [`lineage_id`]), keyed when configured.
    pub fn lineage_id(&self, server_identity: &str, client_identity: &str, label: &str) -> String {
        match &self.lineage_key {
            None => lineage_id(server_identity, client_identity, label),
            Some(key) => {
                let mut msg = Vec::new();
                for part in [server_identity, client_identity, label] {
                    msg.extend_from_slice(&(part.len() as u64).to_be_bytes());
                    msg.extend_from_slice(part.as_bytes());
                }
                hex16(&hmac_sha256(key, &msg))
            }
        }
    }

    /// The route bucket of a client of `server` (its client identity) or of a session (its
    /// id): session shards take buckets, not hashes, so that a snapshot can say where each
    /// record belongs whatever the shard count of the run that loads it. A lasting digest
    /// (XXH3-64 over an explicit encoding), so that it stays the same across builds and
    /// machines (it is written to files); the router asks for one per request of a client or
    /// session it does not know yet, where SHA-256 cost it a hundred times more. Keyed as
    /// lineage ids are with redaction (HMAC-SHA-256), so that 16 bits of it are no way back
    /// to a redacted address.
    pub fn route_bucket(&self, server: SocketAddr, key: &str) -> u16 {
        let (msg, len) = endpoint_bytes(server);
        let head = &msg[..len];
        match &self.lineage_key {
            None => {
                let digest = LastingDigest::new(ROUTE_PURPOSE)
                    .part(head)
                    .part(key.as_bytes())
                    .finish();
                (digest >> 48) as u16
            }
            Some(k) => {
                let mut m = Vec::with_capacity(6 + head.len() + key.len());
                m.extend_from_slice(b"route\0");
                m.extend_from_slice(head);
                m.extend_from_slice(key.as_bytes());
                let digest = hmac_sha256(k, &m);
                u16::from_be_bytes([digest[0], digest[1]])
            }
        }
    }

    /// The configured name of `server`, else `Host` + path (without the query), else `ip:port`.
    pub fn server_identity(&self, server: SocketAddr, head: &RequestHead) -> String {
        if let Some(name) = self.servers.get(&server) {
            return name.clone();
        }
        match head.host().filter(|h| !h.is_empty()) {
            Some(host) => {
                let path = head.path().split(['?', '#']).next().unwrap_or("");
                let mut id = String::with_capacity(host.len() + path.len());
                id.push_str(host);
                id.make_ascii_lowercase();
                id.push_str(path);
                bounded(id)
            }
            None => server.to_string(),
        }
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client behind the connection from `peer`: with `peer` a trusted proxy, the first
    /// untrusted hop of `Forwarded` (preferred) or `X-Forwarded-For`, nearest hop first.
    pub fn client_identity(&self, peer: IpAddr, head: &RequestHead) -> String {
        self.client_identity_via(peer, None, head)
    }

    /// As [`Identities::client_identity`], for a connection that opened with a PROXY protocol
    /// header naming `proxied`: believed when `peer` is trusted, and then the hop to start from.
    pub fn client_identity_via(
        &self,
        peer: IpAddr,
        proxied: Option<IpAddr>,
        head: &RequestHead,
    ) -> String {
        if self.trusted.is_empty() || !self.trusted(peer) {
            return ip_text(canonical(peer));
        }
        let peer = match proxied {
            Some(p) if !self.trusted(p) => return ip_text(canonical(p)),
            Some(p) => p,
            None => peer,
        };
        let hops: Vec<String> = match (&head.forwarded, &head.forwarded_for) {
            (Some(fwd), _) => forwarded_hops(fwd),
            (None, Some(xff)) => xff
                .split(',')
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect(),
            (None, None) => Vec::new(),
        };
        let mut client = ip_text(canonical(peer));
        for hop in hops.iter().rev() {
            let addr = hop_address(hop);
            client = bounded(addr.map_or_else(|| hop.clone(), |a| a.to_string()));
            match addr {
                Some(a) if self.trusted(a) => continue,
                _ => break,
            }
        }
        client
    }
}

/// `ip` as `Display` writes it; IPv4 without the formatting machinery (this runs on every
/// request).
fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => crate::model::Ipv4Text::new(v4, None).as_str().to_string(),
        IpAddr::V6(_) => ip.to_string(),
    }
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_IDENTITY_BYTES {
        let mut at = MAX_IDENTITY_BYTES;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// The `for=` values of a `Forwarded` header (RFC 7239), in order.
fn forwarded_hops(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| v.trim().trim_matches('"').to_string())
            })
        })
        .collect()
}

/// The address of one hop: `1.2.3.4`, `1.2.3.4:5678`, `[::1]:80`, `::1`; `None` for
/// obfuscated (`_hidden`) or `unknown` hops.
fn hop_address(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sa) = hop.parse::<SocketAddr>() {
        return Some(canonical(sa.ip()));
    }
    let inner = hop.strip_prefix('[')?.split(']').next()?;
    inner.parse::<IpAddr>().ok().map(canonical)
}

/// The stable short name of a lineage: 16 hex digits of SHA-256 over its parts, so that every
/// gateway host of a fleet names a lineage alike.
pub fn lineage_id(server_identity: &str, client_identity: &str, client_label: &str) -> String {
    let mut h = Sha256::new();
    for part in [server_identity, client_identity, client_label] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    hex16(&digest)
}

/// `server` as route buckets hash it: the family (4 or 6), the address, the port (big
/// endian); the encoding is the first `len` bytes.
pub fn endpoint_bytes(server: SocketAddr) -> ([u8; 19], usize) {
    let mut out = [0u8; 19];
    let len = match server.ip() {
        IpAddr::V4(ip) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&ip.octets());
            5
        }
        IpAddr::V6(ip) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&ip.octets());
            17
        }
    };
    out[len..len + 2].copy_from_slice(&server.port().to_be_bytes());
    (out, len + 2)
}

/// The first 8 bytes of a digest as 16 hex digits.
fn hex16(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(16);
    for b in digest.iter().take(8) {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

/// HMAC-SHA-256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// What names a client within a lineage: clientInfo's name and version, else the User-Agent.
pub fn client_label(name: Option<&str>, version: Option<&str>, user_agent: Option<&str>) -> String {
    match (name, version) {
        (Some(n), v) => bounded(super::joined(&[n, "/", v.unwrap_or("")])),
        (None, _) => bounded(super::joined(&["ua:", user_agent.unwrap_or("")])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::RequestHeader;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "10.200.3.45",
            "::1",
            "2001:db8::7",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for octet in 0..=255u8 {
            let ip = IpAddr::from([octet, 255 - octet, octet / 2, 7]);
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    #[test]
    fn keys_joined_as_format_joined_them() {
        assert_eq!(client_label(Some("n"), Some("1.0"), None), "n/1.0");
        assert_eq!(client_label(Some("n"), None, Some("ua")), "n/");
        assert_eq!(client_label(None, None, Some("curl/8")), "ua:curl/8");
        assert_eq!(client_label(None, None, None), "ua:");
        let ids = Identities::default();
        let server: SocketAddr = "10.0.0.1:8080".parse().unwrap();
        assert_eq!(
            ids.server_identity(server, &head(None, None)),
            "gw.example:8080/mcp"
        );
    }

    fn head(xff: Option<&str>, fwd: Option<&str>) -> RequestHead {
        let mut head = RequestHead::new("POST", "/mcp?x=1");
        head.set(RequestHeader::Host, Some("GW.example:8080"));
        head.forwarded_for = xff.map(str::to_string);
        head.forwarded = fwd.map(str::to_string);
        head
    }

    fn ids(trusted: &[&str]) -> Identities {
        let settings = IdentitySettings {
            trusted_proxies: trusted.iter().map(|t| t.parse().unwrap()).collect(),
        };
        Identities::new(BTreeMap::new(), &settings)
    }

    #[test]
    fn cidr_parse_and_contains() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.2.3.4".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.0.0.1".parse().unwrap()));
        let one: Cidr = "::1".parse().unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let peer = "127.0.0.1".parse().unwrap();
        let h = head(Some("127.0.9.1"), None);
        assert_eq!(ids(&[]).client_identity(peer, &h), "127.0.0.1");
        assert_eq!(ids(&["10.0.0.0/8"]).client_identity(peer, &h), "127.0.0.1");
    }

    #[test]
    fn first_untrusted_hop_from_the_right() {
        let peer = "127.0.0.1".parse().unwrap();
        let i = ids(&["127.0.0.1/32", "127.0.8.0/24"]);
        // A client may forge the leftmost entries; the trusted chain appended the rest.
        let h = head(Some("6.6.6.6, 127.0.9.1, 127.0.8.5"), None);
        assert_eq!(i.client_identity(peer, &h), "127.0.9.1");
        let h = head(None, Some(r#"for=127.0.9.2;proto=http, for="[::1]:4711""#));
        assert_eq!(i.client_identity(peer, &h), "::1");
        let h = head(None, Some("for=_hidden"));
        assert_eq!(i.client_identity(peer, &h), "_hidden");
        // Only trusted hops: the leftmost one.
        let h = head(Some("127.0.8.1"), None);
        assert_eq!(i.client_identity(peer, &h), "127.0.8.1");
    }

    #[test]
    fn proxy_protocol_source_is_believed_from_trusted_peers_only() {
        let h = head(Some("127.0.9.9"), None);
        let lb = "127.0.0.1".parse().unwrap();
        let src = Some("127.0.9.1".parse().unwrap());
        assert_eq!(
            ids(&["127.0.0.1"]).client_identity_via(lb, src, &h),
            "127.0.9.1"
        );
        assert_eq!(ids(&[]).client_identity_via(lb, src, &h), "127.0.0.1");
        // The PROXY source is a trusted proxy too: its X-Forwarded-For counts.
        let i = ids(&["127.0.0.1", "127.0.9.1"]);
        assert_eq!(i.client_identity_via(lb, src, &h), "127.0.9.9");
    }

    #[test]
    fn server_identity_prefers_names_then_host_and_path() {
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let i = ids(&[]);
        assert_eq!(
            i.server_identity(server, &head(None, None)),
            "gw.example:8080/mcp"
        );
        let mut named = BTreeMap::new();
        named.insert(server, "tools-gw".to_string());
        let n = Identities::new(named, &IdentitySettings::default());
        assert_eq!(n.server_identity(server, &head(None, None)), "tools-gw");
        assert_eq!(
            i.server_identity(server, &RequestHead::default()),
            "127.0.0.1:8080"
        );
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231 test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex16(&mac),
            "5bdcc146bf60754e",
            "first 8 bytes of 5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let keyed = ids(&[]).with_lineage_key(b"k".to_vec());
        assert_ne!(keyed.lineage_id("s", "c", "l"), lineage_id("s", "c", "l"));
    }

    /// Route buckets are written to snapshot files: their encoding is pinned (the unkeyed
    /// value is the lasting digest's chain, checked against Python's `xxhash`; the keyed one
    /// HMAC-SHA-256, computed with Python's hashlib).
    #[test]
    fn route_buckets_are_pinned_and_keyed_with_redaction() {
        let server: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        assert_eq!(ids(&[]).route_bucket(server, "10.0.0.7"), PINNED_ROUTE);
        let keyed = ids(&[]).with_lineage_key(b"k".to_vec());
        assert_eq!(keyed.route_bucket(server, "10.0.0.7"), 29352);
        let v6: SocketAddr = "[::1]:8080".parse().expect("addr");
        assert_ne!(
            ids(&[]).route_bucket(v6, "10.0.0.7"),
            ids(&[]).route_bucket(server, "10.0.0.7")
        );
    }

    /// XXH3-64 of the endpoint's bytes seeded with `ROUTE_PURPOSE`, then of `10.0.0.7` seeded
    /// with that, its top 16 bits (Python's `xxhash.xxh3_64_intdigest`).
    const PINNED_ROUTE: u16 = 7982;

    #[test]
    fn lineage_ids_are_stable_and_distinct() {
        let a = lineage_id("gw/mcp", "127.0.9.1", "client/1.0");
        assert_eq!(a, lineage_id("gw/mcp", "127.0.9.1", "client/1.0"));
        assert_eq!(a.len(), 16);
        assert_ne!(a, lineage_id("gw/mcp", "127.0.9.2", "client/1.0"));
        // Parts are length-prefixed: moving bytes between parts changes the id.
        assert_ne!(lineage_id("ab", "c", "d"), lineage_id("a", "bc", "d"));
    }
}
