//! Lineage: which ended session a new one continues. A client whose session was rejected,
//! expired, deleted or evicted usually starts over in a new one; its first handshake is linked
//! to the predecessor so that what it lost across the two shows up.
//!
//! Ended sessions are indexed by [`LineageKey`] (a hash lookup per first handshake, not a
//! scan), kept for the lineage window and within a byte bound, oldest dropped first (counted).

use super::session::{CapsRecord, heap_block_bytes};
use crate::model::Timestamp;
use crate::table_hash::HashMap;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Who a session belongs to, for lineage: the server endpoint and the client lineage (server
/// identity, client identity, clientInfo name and version: see [`super::identity`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LineageKey {
    pub server: SocketAddr,
    pub lineage_id: Box<str>,
}

/// A session that was rejected, expired, deleted or evicted: a possible predecessor.
#[derive(Debug, Clone)]
pub struct Ended {
    pub ts: Timestamp,
    pub session_id: String,
    pub baseline: Option<CapsRecord>,
    /// The ended session's route bucket (see `Session::route`).
    pub route: Option<u16>,
}

impl From<super::snapshot::EndedEntry> for Ended {
    fn from(e: super::snapshot::EndedEntry) -> Self {
        Ended {
            ts: Timestamp(e.ts_ns),
            session_id: e.session_id,
            baseline: e.baseline,
            route: e.route,
        }
    }
}

/// One remembered session: its key, its record and its serial (its place in the age order).
#[derive(Debug)]
struct Entry {
    serial: u64,
    key: LineageKey,
    ended: Ended,
    /// What it was charged, besides the shared parts of its capability record.
    bytes: usize,
}

/// Bytes one item of `size` bytes takes in a hash table at its emptiest: a table fills to
/// 7/8 and then doubles, so up to 16/7 slots per item, each with a control byte.
const fn table_slot_bytes(size: usize) -> usize {
    (size + 1) * 16 / 7 + 1
}

/// Bytes one record costs besides its strings: its slot in the age queue (twice: a queue
/// grows by doubling, and shrinks when a quarter full, see [`Lineage::fit`]) and its key's
/// slot in the table of newest records.
const ENTRY_OVERHEAD: usize =
    2 * std::mem::size_of::<Entry>() + table_slot_bytes(std::mem::size_of::<(LineageKey, u64)>());

/// What a record costs besides the shared parts of its capability record: its key is held
/// twice (in the record, and in the table of newest records while it is its key's newest).
fn entry_bytes(key: &LineageKey, session_id: &str) -> usize {
    ENTRY_OVERHEAD + 2 * heap_block_bytes(key.lineage_id.len()) + heap_block_bytes(session_id.len())
}

/// Bytes one shared part of capability records costs besides its own: its table slot.
const SHARED_OVERHEAD: usize = table_slot_bytes(std::mem::size_of::<(usize, (usize, usize))>());

/// Tables and queues keep their room after a peak; below a quarter full they give it back,
/// so that what a peak of small records left is not held uncharged beside large ones.
const SHRINK_BELOW_FILL: usize = 4;
/// Room kept however empty the store is.
const MIN_ROOM: usize = 64;

/// Recently ended sessions by lineage key.
#[derive(Debug, Default)]
pub struct Lineage {
    /// Every record, oldest first. Serials are consecutive and records leave only from the
    /// front, so a record's place is its serial less the front's.
    order: VecDeque<Entry>,
    /// Each key's newest record, by serial: a lineage's predecessor is its newest.
    newest: HashMap<LineageKey, u64>,
    /// The parts of capability records the entries hold, by address: (entries holding it,
    /// its bytes). The records of one SDK share their parts, so each is charged once, with
    /// the first entry that holds it, and given back with the last; while an entry holds it,
    /// its address cannot be reused by another.
    shared: HashMap<usize, (usize, usize)>,
    next_serial: u64,
    bytes: usize,
    max_bytes: usize,
}

/// What [`Lineage::remember`] had to drop to stay within its bound.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dropped(pub usize);

impl Lineage {
    /// A lineage store that holds at most `max_bytes` of records.
    pub fn new(max_bytes: usize) -> Self {
        Lineage {
            max_bytes,
            ..Lineage::default()
        }
    }

    /// Bytes the records hold, as charged against the session budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Every record, oldest first.
    pub fn records(&self) -> impl Iterator<Item = (&LineageKey, &Ended)> {
        self.order.iter().map(|e| (&e.key, &e.ended))
    }

    /// Remembers an ended session under `key`; drops the oldest records beyond the byte bound.
    pub fn remember(&mut self, key: LineageKey, ended: Ended) -> Dropped {
        let bytes = entry_bytes(&key, &ended.session_id);
        let shared = self.hold_parts(ended.baseline.as_ref());
        let serial = self.next_serial;
        self.next_serial += 1;
        self.bytes += bytes + shared;
        self.newest.insert(key.clone(), serial);
        self.order.push_back(Entry {
            serial,
            key,
            ended,
            bytes,
        });
        let mut dropped = 0;
        while self.bytes > self.max_bytes && self.drop_oldest() {
            dropped += 1;
        }
        Dropped(dropped)
    }

    /// The most recent ended session under `key`.
    pub fn latest(&self, key: &LineageKey) -> Option<&Ended> {
        let serial = *self.newest.get(key)?;
        let front = self.order.front()?.serial;
        let at = usize::try_from(serial.checked_sub(front)?).ok()?;
        self.order
            .get(at)
            .filter(|e| e.serial == serial)
            .map(|e| &e.ended)
    }

    /// The most recent ended session under `key` within `window_ns` of `now`.
    pub fn predecessor(&self, key: &LineageKey, now: Timestamp, window_ns: i64) -> Option<&Ended> {
        let newest = self.latest(key)?;
        (now.0.saturating_sub(newest.ts.0) <= window_ns).then_some(newest)
    }

    /// Forgets sessions that ended longer than `window_ns` ago. A record that ended after
    /// `now` (a packet stamped ahead of the clock, which may have refused it) counts as ended
    /// now once it is the oldest, so that it cannot hold the ones behind it for longer than the
    /// window.
    pub fn expire(&mut self, now: Timestamp, window_ns: i64) {
        loop {
            let Some(oldest) = self.order.front_mut() else {
                return;
            };
            oldest.ended.ts = oldest.ended.ts.min(now);
            if now.0.saturating_sub(oldest.ended.ts.0) <= window_ns {
                return;
            }
            self.drop_oldest();
        }
    }

    /// Drops the oldest record (and its key, when it was the key's newest).
    fn drop_oldest(&mut self) -> bool {
        let Some(e) = self.order.pop_front() else {
            return false;
        };
        if self.newest.get(&e.key) == Some(&e.serial) {
            self.newest.remove(&e.key);
        }
        let shared = self.release_parts(e.ended.baseline.as_ref());
        debug_assert!(self.bytes >= e.bytes + shared, "charges drifted");
        self.bytes = self.bytes.saturating_sub(e.bytes + shared);
        self.fit();
        true
    }

    /// Gives back the room of the queue and the tables when they are a quarter full or less
    /// (amortised: each shrink follows at least as many drops as it copies records).
    fn fit(&mut self) {
        let fits = |len: usize, capacity: usize| {
            capacity <= MIN_ROOM || len.saturating_mul(SHRINK_BELOW_FILL) > capacity
        };
        if !fits(self.order.len(), self.order.capacity()) {
            self.order.shrink_to(self.order.len() * 2);
        }
        if !fits(self.newest.len(), self.newest.capacity()) {
            self.newest.shrink_to(self.newest.len() * 2);
        }
        if !fits(self.shared.len(), self.shared.capacity()) {
            self.shared.shrink_to(self.shared.len() * 2);
        }
    }

    /// Counts one more holder of each of `record`'s parts; the bytes of those held first.
    fn hold_parts(&mut self, record: Option<&CapsRecord>) -> usize {
        let mut charged = 0;
        for (address, bytes) in record.map(CapsRecord::shared_parts).into_iter().flatten() {
            let held = self.shared.entry(address).or_insert((0, bytes));
            if held.0 == 0 {
                charged += held.1 + SHARED_OVERHEAD;
            }
            held.0 += 1;
        }
        charged
    }

    /// Counts one holder less of each of `record`'s parts; the bytes of those held no more.
    fn release_parts(&mut self, record: Option<&CapsRecord>) -> usize {
        let mut released = 0;
        for (address, _) in record.map(CapsRecord::shared_parts).into_iter().flatten() {
            let Some(held) = self.shared.get_mut(&address) else {
                debug_assert!(false, "a part released that was not held");
                continue;
            };
            held.0 = held.0.saturating_sub(1);
            if held.0 == 0 {
                released += held.1 + SHARED_OVERHEAD;
                self.shared.remove(&address);
            }
        }
        released
    }
}

/// One server's stateless clients: identity to (serial, label).
type ClientLabels = HashMap<Box<str>, (u64, Box<str>)>;

/// Legacy stateless clients: the clientInfo label of each (server, client identity)'s latest
/// `initialize`, so that its later requests (which name no client) join that lineage. Held
/// within a byte bound charged to the session budget; the longest-known clients give way first.
#[derive(Debug, Default)]
pub struct StatelessLabels {
    /// Per server, per client identity: (serial, label). Keyed in two levels so that a
    /// lookup borrows the client identity instead of building a key.
    by_server: HashMap<SocketAddr, ClientLabels>,
    /// Every client's (serial, server, identity), in the order first seen.
    order: VecDeque<(u64, SocketAddr, Box<str>)>,
    next_serial: u64,
    len: usize,
    bytes: usize,
    max_bytes: usize,
}

/// Bytes one label costs besides its strings: its table slot (twice, for a table's free
/// slots) and its order slot.
const LABEL_OVERHEAD: usize = 2 * std::mem::size_of::<(Box<str>, (u64, Box<str>))>()
    + std::mem::size_of::<(u64, SocketAddr, Box<str>)>();

fn label_bytes(client: &str, label: &str) -> usize {
    // The identity is held twice: in the table and in the order.
    LABEL_OVERHEAD + 2 * client.len() + label.len()
}

impl StatelessLabels {
    pub fn new(max_bytes: usize) -> Self {
        StatelessLabels {
            max_bytes,
            ..StatelessLabels::default()
        }
    }

    /// Bytes the labels hold, as charged against the session budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, server: SocketAddr, client: &str) -> Option<&str> {
        let (_, label) = self.by_server.get(&server)?.get(client)?;
        Some(label)
    }

    /// Sets the label of (`server`, `client`); drops the clients first seen longest ago
    /// beyond the byte bound and says how many.
    pub fn set(&mut self, server: SocketAddr, client: &str, label: &str) -> Dropped {
        let clients = self.by_server.entry(server).or_default();
        if let Some((_, old)) = clients.get_mut(client) {
            if **old != *label {
                self.bytes = self.bytes - old.len() + label.len();
                *old = Box::from(label);
            }
        } else {
            let serial = self.next_serial;
            self.next_serial += 1;
            self.len += 1;
            self.bytes += label_bytes(client, label);
            self.order.push_back((serial, server, Box::from(client)));
            clients.insert(Box::from(client), (serial, Box::from(label)));
        }
        let mut dropped = 0;
        while self.bytes > self.max_bytes && self.len > 1 {
            let Some((serial, server, client)) = self.order.pop_front() else {
                break;
            };
            let Some(clients) = self.by_server.get_mut(&server) else {
                continue;
            };
            if let Some((s, label)) = clients.get(&*client)
                && *s == serial
            {
                self.bytes -= label_bytes(&client, label);
                self.len -= 1;
                clients.remove(&*client);
                dropped += 1;
            }
            if clients.is_empty() {
                self.by_server.remove(&server);
            }
        }
        Dropped(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(info: &str) -> LineageKey {
        LineageKey {
            server: "127.0.0.2:80".parse().expect("addr"),
            lineage_id: Box::from(info),
        }
    }

    fn ended(sid: &str, ts: i64) -> Ended {
        Ended {
            ts: Timestamp(ts),
            session_id: sid.to_string(),
            baseline: None,
            route: None,
        }
    }

    #[test]
    fn the_most_recent_session_of_the_key_within_the_window_is_the_predecessor() {
        let mut l = Lineage::new(usize::MAX);
        l.remember(key("a"), ended("s1", 10));
        l.remember(key("a"), ended("s2", 20));
        l.remember(key("z"), ended("s3", 25));
        let found = |l: &Lineage, info: &str, now: i64| {
            l.predecessor(&key(info), Timestamp(now), 100)
                .map(|e| e.session_id.clone())
        };
        assert_eq!(found(&l, "a", 30), Some("s2".into()));
        assert_eq!(found(&l, "z", 30), Some("s3".into()));
        assert_eq!(found(&l, "q", 30), None);
        assert_eq!(found(&l, "a", 500), None);
        l.expire(Timestamp(115), 100);
        assert_eq!((l.len(), found(&l, "a", 115)), (2, Some("s2".into())));
        l.expire(Timestamp(1000), 100);
        assert!(l.is_empty() && l.bytes() == 0);
    }

    /// A record stamped ahead of the clock (a refused stamp) counts as ended at the sweep
    /// that finds it oldest: it expires a window later, and the ones behind it with it.
    #[test]
    fn a_record_that_ended_after_the_clock_holds_the_others_for_one_window_at_most() {
        let mut l = Lineage::new(usize::MAX);
        l.remember(key("a"), ended("future", 7_200_000));
        l.remember(key("b"), ended("s2", 20));
        l.expire(Timestamp(50), 100);
        assert_eq!(l.len(), 2);
        l.expire(Timestamp(151), 100);
        assert_eq!(l.len(), 0, "both gone a window after the sweep at 50");
    }

    #[test]
    fn records_that_share_a_capability_record_are_charged_for_it_once() {
        let caps = CapsRecord::new(
            &serde_json::json!({"roots": {"listChanged": true}, "sampling": {}}),
            &serde_json::json!({"tools": {"listChanged": true}, "logging": {}}),
        );
        let charged = |c: &CapsRecord| {
            c.shared_parts().iter().map(|&(_, b)| b).sum::<usize>() + 3 * SHARED_OVERHEAD
        };
        let parts = charged(&caps);
        assert!(
            parts > caps.heap_bytes(),
            "blocks, counts and table slots besides the text"
        );
        let with_caps = |sid: &str, ts: i64| Ended {
            baseline: Some(caps.clone()),
            ..ended(sid, ts)
        };
        let mut l = Lineage::new(usize::MAX);
        l.remember(key("a"), ended("s0", 0));
        let bare = l.bytes();
        assert_eq!(bare, entry_bytes(&key("a"), "s0"));
        l.remember(key("a"), with_caps("s1", 1));
        assert_eq!(l.bytes(), 2 * bare + parts);
        l.remember(key("b"), with_caps("s2", 2));
        assert_eq!(
            l.bytes(),
            3 * bare + parts,
            "the second holder adds its entry only"
        );
        // Another record's parts are its own: charged whole.
        let other = CapsRecord::new(&serde_json::json!({}), &serde_json::json!({"tools": {}}));
        l.remember(
            key("c"),
            Ended {
                baseline: Some(other.clone()),
                ..ended("s3", 3)
            },
        );
        let others = charged(&other);
        assert_eq!(l.bytes(), 4 * bare + parts + others);
        // Given back with the last holder, not before.
        l.expire(Timestamp(102), 100);
        assert_eq!((l.len(), l.bytes()), (2, 2 * bare + parts + others));
        l.expire(Timestamp(103), 100);
        assert_eq!((l.len(), l.bytes()), (1, bare + others));
        l.expire(Timestamp(1000), 100);
        assert!(l.is_empty() && l.bytes() == 0 && l.shared.is_empty());
    }

    #[test]
    fn the_room_of_a_peak_is_given_back() {
        let mut l = Lineage::new(usize::MAX);
        for i in 0..10_000 {
            l.remember(key(&format!("k{i}")), ended("s", i));
        }
        let peak = (l.order.capacity(), l.newest.capacity());
        l.expire(Timestamp(9_990 + 100), 100);
        assert_eq!(l.len(), 10);
        assert!(
            l.order.capacity() <= MIN_ROOM && l.newest.capacity() <= 2 * MIN_ROOM,
            "{peak:?} -> {} {}",
            l.order.capacity(),
            l.newest.capacity()
        );
        assert_eq!(
            l.predecessor(&key("k9999"), Timestamp(10_000), 100)
                .map(|e| e.ts),
            Some(Timestamp(9_999))
        );
    }

    #[test]
    fn the_byte_bound_drops_the_oldest_records_and_says_how_many() {
        let one = entry_bytes(&key("a"), "s0");
        let mut l = Lineage::new(3 * one);
        for i in 0..3 {
            assert_eq!(l.remember(key("a"), ended(&format!("s{i}"), i)), Dropped(0));
        }
        assert_eq!(l.remember(key("b"), ended("s9", 9)), Dropped(1));
        assert_eq!(l.len(), 3);
        assert!(l.bytes() <= 3 * one);
        assert_eq!(
            l.predecessor(&key("a"), Timestamp(10), 100)
                .map(|e| e.session_id.as_str()),
            Some("s2")
        );
    }

    fn server() -> SocketAddr {
        "127.0.0.2:80".parse().expect("addr")
    }

    #[test]
    fn a_stateless_label_follows_the_latest_initialize_and_is_charged_once() {
        let mut l = StatelessLabels::new(usize::MAX);
        assert_eq!(l.set(server(), "10.0.0.1", "a/1"), Dropped(0));
        let one = l.bytes();
        assert_eq!(l.set(server(), "10.0.0.1", "b/2"), Dropped(0));
        assert_eq!(
            (l.len(), l.bytes(), l.get(server(), "10.0.0.1")),
            (1, one, Some("b/2"))
        );
        assert_eq!(l.get(server(), "10.0.0.9"), None);
    }

    #[test]
    fn the_byte_bound_drops_the_clients_seen_first_and_says_how_many() {
        let one = label_bytes("10.0.0.0", "a/1");
        let mut l = StatelessLabels::new(3 * one);
        for i in 0..3 {
            assert_eq!(l.set(server(), &format!("10.0.0.{i}"), "a/1"), Dropped(0));
        }
        // Relabelling a known client neither grows nor reorders the store.
        assert_eq!(l.set(server(), "10.0.0.0", "b/1"), Dropped(0));
        assert_eq!(l.set(server(), "10.0.0.3", "a/1"), Dropped(1));
        assert_eq!((l.len(), l.get(server(), "10.0.0.0")), (3, None));
        assert_eq!(l.get(server(), "10.0.0.3"), Some("a/1"));
        assert!(l.bytes() <= 3 * one);
        // Many clients never grow it past the bound.
        let mut dropped = 0;
        for i in 0..10_000 {
            dropped += l
                .set(server(), &format!("10.1.{}.{}", i / 256, i % 256), "a/1")
                .0;
        }
        assert!(l.len() <= 3 && l.bytes() <= 3 * one && dropped >= 9_997);
    }
}
