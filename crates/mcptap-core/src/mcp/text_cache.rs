//! A bounded cache of what was read or computed from a few texts: a fleet's clients send the
//! same few handshakes and come back under the same few identities thousands of times, and
//! what is a function of those texts is worked out once per distinct set.

use crate::table_hash::HashMap;
use std::hash::BuildHasher;

/// Values by the `N` texts they were computed from. Bounded in bytes (each entry charged its
/// texts, its slot and what the caller says its value holds) and in entries; emptied whole
/// when full, and the next lookups refill it with what is common. Keys are a hash of the
/// texts and the texts are kept, so a collision is told from a hit (the newer texts take the
/// slot): hostile texts can replace entries, never grow the cache.
#[derive(Debug)]
pub struct TextCache<const N: usize, V> {
    entries: HashMap<u64, Entry<N, V>>,
    bytes: usize,
    limits: CacheLimits,
}

/// The keys of texts offered to a cache once, in a few slots: a text is kept from its second
/// sighting on, so that texts seen once (a tool call's arguments) cost a hash, not a copy.
#[derive(Debug)]
pub struct Sightings(Box<[u64; SIGHTING_SLOTS]>);

const SIGHTING_SLOTS: usize = 256;

impl Default for Sightings {
    fn default() -> Self {
        Sightings(Box::new([0; SIGHTING_SLOTS]))
    }
}

impl Sightings {
    /// Whether `key` was offered before (in its slot since); remembers it.
    pub fn again(&mut self, key: u64) -> bool {
        let slot = &mut self.0[(key as usize) % SIGHTING_SLOTS];
        let again = *slot == key;
        *slot = key;
        again
    }
}

/// How much a [`TextCache`] may hold.
#[derive(Debug, Clone, Copy)]
pub struct CacheLimits {
    pub max_bytes: usize,
    pub max_entries: usize,
    /// Sets with a text longer than this are not cached (a hostile one must not take it).
    pub max_text: usize,
}

#[derive(Debug)]
struct Entry<const N: usize, V> {
    /// The texts one after another; `ends[i]` is where text `i` ends.
    texts: Box<[u8]>,
    ends: [u32; N],
    value: V,
    cost: usize,
}

impl<const N: usize, V> Entry<N, V> {
    fn holds(&self, texts: &[&[u8]; N]) -> bool {
        let mut start = 0;
        texts.iter().zip(self.ends).all(|(t, end)| {
            let kept = self.texts.get(start..end as usize);
            start = end as usize;
            kept == Some(*t)
        })
    }
}

impl<const N: usize, V> TextCache<N, V> {
    pub fn new(limits: CacheLimits) -> Self {
        TextCache {
            entries: HashMap::default(),
            bytes: 0,
            limits,
        }
    }

    /// The key these texts are kept under.
    pub fn key(texts: &[&[u8]; N]) -> u64 {
        foldhash::fast::FixedState::with_seed(0x7465_7874).hash_one(texts)
    }

    /// The value computed from these texts, if one was kept.
    pub fn get(&self, texts: &[&[u8]; N]) -> Option<&V> {
        self.get_keyed(Self::key(texts), texts)
    }

    /// [`Self::get`] with the texts' [`Self::key`] already worked out.
    pub fn get_keyed(&self, key: u64, texts: &[&[u8]; N]) -> Option<&V> {
        let hit = self.entries.get(&key)?;
        hit.holds(texts).then_some(&hit.value)
    }

    /// Whether a set with these texts may be kept at all (none longer than the cut): the caller
    /// can skip building a value that would not be.
    pub fn admits(&self, texts: &[&[u8]; N]) -> bool {
        texts.iter().all(|t| t.len() <= self.limits.max_text)
    }

    /// Keeps `value` for these texts within the bounds; `value_bytes`: the heap it holds (or
    /// an estimate that is not below it).
    pub fn insert(&mut self, texts: &[&[u8]; N], value: V, value_bytes: usize) {
        if !self.admits(texts) {
            return;
        }
        let text_bytes: usize = texts.iter().map(|t| t.len()).sum();
        let cost = std::mem::size_of::<(u64, Entry<N, V>)>() + text_bytes + value_bytes;
        if cost > self.limits.max_bytes {
            return;
        }
        if self.bytes.saturating_add(cost) > self.limits.max_bytes
            || self.entries.len() >= self.limits.max_entries
        {
            self.entries.clear();
            self.bytes = 0;
        }
        let mut kept = Vec::with_capacity(text_bytes);
        let mut ends = [0u32; N];
        for (t, end) in texts.iter().zip(&mut ends) {
            kept.extend_from_slice(t);
            // Within u32: each text is at most `max_text`, the sum at most `max_bytes`.
            *end = u32::try_from(kept.len()).unwrap_or(u32::MAX);
        }
        let entry = Entry {
            texts: kept.into_boxed_slice(),
            ends,
            value,
            cost,
        };
        if let Some(old) = self.entries.insert(Self::key(texts), entry) {
            self.bytes -= old.cost;
        }
        self.bytes += cost;
    }

    /// Bytes held, as charged against the session budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_bytes: usize) -> CacheLimits {
        CacheLimits {
            max_bytes,
            max_entries: 100,
            max_text: 64,
        }
    }

    #[test]
    fn a_hit_needs_every_text_equal_in_its_slot() {
        let mut cache = TextCache::<3, u32>::new(limits(1 << 20));
        cache.insert(&[b"ab", b"c", b""], 7, 0);
        assert_eq!(cache.get(&[b"ab", b"c", b""]), Some(&7));
        // The same bytes split otherwise, or one byte apart, are other keys.
        assert_eq!(cache.get(&[b"a", b"bc", b""]), None);
        assert_eq!(cache.get(&[b"ab", b"", b"c"]), None);
        assert_eq!(cache.get(&[b"ab", b"d", b""]), None);
        cache.insert(&[b"ab", b"c", b""], 8, 0);
        assert_eq!(cache.get(&[b"ab", b"c", b""]), Some(&8));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn bounds_hold_whatever_is_inserted() {
        let mut cache = TextCache::<2, Vec<u8>>::new(limits(4096));
        for i in 0..10_000u32 {
            let text = i.to_string();
            cache.insert(&[text.as_bytes(), b"x"], vec![0; 16], 16);
            assert!(cache.bytes() <= 4096, "{}", cache.bytes());
            assert!(cache.len() <= 100);
        }
        assert!(!cache.is_empty());
        // Texts beyond the cut, or an entry larger than the whole cache, are not kept.
        let before = cache.bytes();
        cache.insert(&[&[b'a'; 65], b""], Vec::new(), 0);
        cache.insert(&[b"big", b""], Vec::new(), 8192);
        assert_eq!(cache.bytes(), before);
        assert_eq!(cache.get(&[&[b'a'; 65], b""]), None);
        assert_eq!(cache.get(&[b"big", b""]), None);
        cache.clear();
        assert_eq!((cache.len(), cache.bytes()), (0, 0));
    }
}
