//! The hasher of the core's tables: foldhash, with each integer written mixed in at once.
//! foldhash first shifts writes narrower than 128 bits into a 128-bit buffer, a variable
//! shift of a 128-bit value per write; a session table's key of an address (family, address,
//! port) and a session id makes four such writes per lookup, and lookups run several times
//! per exchange. One 128-bit write is a single folded multiply with the per-map seed.

use std::hash::{BuildHasher, Hasher};

/// A `HashMap` with [`RandomState`]'s hasher.
pub type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
/// A `HashSet` with [`RandomState`]'s hasher.
pub type HashSet<K> = std::collections::HashSet<K, RandomState>;

/// foldhash's per-map random seeds (so that no input can aim at collisions it cannot see).
#[derive(Clone, Debug, Default)]
pub struct RandomState(foldhash::fast::RandomState);

impl BuildHasher for RandomState {
    type Hasher = WideWrites;

    #[inline]
    fn build_hasher(&self) -> WideWrites {
        WideWrites(self.0.build_hasher())
    }
}

/// foldhash with every integer written as a 128-bit one.
pub struct WideWrites(foldhash::fast::FoldHasher<'static>);

impl Hasher for WideWrites {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0.write_u128(u128::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.0.write_u128(u128::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.0.write_u128(u128::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0.write_u128(u128::from(i));
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.0.write_u128(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0.write_u128(i as u128);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// Equal keys hash equally, and keys that differ in one field (the address, the port, the
    /// id, or where the address ends and the id begins) land apart.
    #[test]
    fn session_keys_hash_by_every_part() {
        let state = RandomState::default();
        let key = |addr: &str, id: &str| {
            let addr: SocketAddr = addr.parse().expect("address");
            state.hash_one((addr, id.to_string()))
        };
        assert_eq!(key("10.0.0.1:80", "s-1"), key("10.0.0.1:80", "s-1"));
        let base = key("10.0.0.1:80", "s-1");
        for other in [
            key("10.0.0.2:80", "s-1"),
            key("10.0.0.1:81", "s-1"),
            key("10.0.0.1:80", "s-2"),
            key("10.0.0.1:80", "s-1\0"),
            key("[::ffff:10.0.0.1]:80", "s-1"),
        ] {
            assert_ne!(base, other);
        }
        let mut set: HashSet<(SocketAddr, String)> = HashSet::default();
        for port in 0..1000u16 {
            set.insert((SocketAddr::from(([10, 0, 0, 1], port)), format!("s-{port}")));
        }
        assert_eq!(set.len(), 1000);
    }
}
