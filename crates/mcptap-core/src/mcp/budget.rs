//! The session table and what it may hold: a cap on sessions and on their estimated bytes,
//! with least-recently-seen eviction beyond either.

use super::review::HeapBytes;
use super::session::{KeyView, Session, SessionKey, SessionKeyRef};
use crate::model::Timestamp;
use crate::table_hash::HashMap;
use crate::usage::SharedUsage;
use std::sync::Arc;

/// What one session costs besides what it holds on the heap: the boxed struct and its slot
/// in the table (counted twice: the table keeps up to half its slots free).
fn fixed_cost<D>() -> usize {
    std::mem::size_of::<Session<D>>()
        + 2 * (std::mem::size_of::<SessionKey>() + std::mem::size_of::<Box<Session<D>>>() + 1)
}

fn session_cost<D: HeapBytes>(sid: &str, s: &Session<D>) -> usize {
    fixed_cost::<D>()
        + sid.len()
        + s.in_flight.heap_bytes()
        + s.detection.heap_bytes()
        + s.lineage_id.as_ref().map_or(0, |l| l.len())
        + s.protocol_version.as_ref().map_or(0, |l| l.len())
        + s.baseline.as_ref().map_or(0, |b| b.heap_bytes())
        + s.resuming.iter().map(resuming_cost).sum::<usize>()
        + s.ext.as_ref().map_or(0, |e| e.heap_bytes())
        // As charged when parked (an answer only shrinks one): a parked POST may carry a
        // batch of thousands of requests, and sessions are recharged per request.
        + s.parked.iter().map(|e| e.charged).sum::<usize>()
        + s.server_requests
            .iter()
            .map(|r| {
                std::mem::size_of::<super::session::ServerRequest>() + r.id.0.len() + r.method.len()
            })
            .sum::<usize>()
}

/// A request waiting for its resumed stream: the entry, its exchange event and its strings.
fn resuming_cost(r: &super::session::Resuming) -> usize {
    let e = &r.exchange;
    std::mem::size_of::<super::session::Resuming>()
        + std::mem::size_of::<crate::model::Exchange>()
        + 256
        + r.id.0.len()
        + e.method.len()
        + e.tool.as_ref().map_or(0, String::len)
        + e.session_id.as_ref().map_or(0, String::len)
}

/// Tracked sessions with their charged bytes. The caps apply to the totals in `usage`, which
/// other tables (other workers' pipelines) may share.
#[derive(Debug)]
pub struct SessionTable<D> {
    /// Boxed: the table keeps up to half its slots free, and those should hold a pointer.
    sessions: HashMap<SessionKey, Box<Session<D>>>,
    /// Sum of the sessions' `charged` bytes.
    bytes: usize,
    max_sessions: usize,
    max_bytes: usize,
    usage: Arc<SharedUsage>,
}

impl<D: HeapBytes> SessionTable<D> {
    pub fn new(max_sessions: usize, max_bytes: usize, usage: Arc<SharedUsage>) -> Self {
        SessionTable {
            sessions: HashMap::default(),
            bytes: 0,
            max_sessions: max_sessions.max(1),
            max_bytes,
            usage,
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Estimated bytes held by the tracked sessions.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn get(&self, key: &SessionKey) -> Option<&Session<D>> {
        self.sessions.get(key).map(Box::as_ref)
    }

    pub fn get_mut(&mut self, key: &SessionKey) -> Option<&mut Session<D>> {
        self.sessions.get_mut(key).map(Box::as_mut)
    }

    /// [`SessionTable::get`] by a borrowed key.
    pub fn get_at(&self, key: SessionKeyRef<'_>) -> Option<&Session<D>> {
        self.sessions.get(&key as &dyn KeyView).map(Box::as_ref)
    }

    /// [`SessionTable::get_mut`] by a borrowed key.
    pub fn get_mut_at(&mut self, key: SessionKeyRef<'_>) -> Option<&mut Session<D>> {
        self.sessions.get_mut(&key as &dyn KeyView).map(Box::as_mut)
    }

    pub fn keys(&self) -> impl Iterator<Item = &SessionKey> {
        self.sessions.keys()
    }

    pub fn contains(&self, key: &SessionKey) -> bool {
        self.sessions.contains_key(key)
    }

    /// Adds a session (charged at its next [`SessionTable::recharge`]).
    pub fn insert(&mut self, key: SessionKey, session: Box<Session<D>>) {
        match self.sessions.insert(key, session) {
            Some(old) => {
                self.bytes -= old.charged;
                self.usage.republish_session_bytes(old.charged, 0);
            }
            None => self.usage.add_sessions(1),
        }
    }

    pub fn remove(&mut self, key: &SessionKey) -> Option<Box<Session<D>>> {
        let s = self.sessions.remove(key)?;
        self.bytes -= s.charged;
        self.usage.sub_sessions(1);
        self.usage.republish_session_bytes(s.charged, 0);
        Some(s)
    }

    /// Whether one more session would exceed the count or byte cap (totals of the usage).
    pub fn is_full(&self) -> bool {
        let bytes = self.usage.session_bytes();
        let bytes_full = bytes.saturating_add(fixed_cost::<D>()) > self.max_bytes;
        self.usage.sessions() >= self.max_sessions || bytes_full
    }

    /// Re-estimates what session `key` costs after it changed; true when the sessions no
    /// longer fit their byte cap.
    pub fn recharge(&mut self, key: &SessionKey) -> bool {
        let Some(s) = self.sessions.get_mut(key) else {
            return false;
        };
        let cost = session_cost(&key.1, s);
        self.bytes = self.bytes - s.charged + cost;
        self.usage.republish_session_bytes(s.charged, cost);
        s.charged = cost;
        self.usage.session_bytes() > self.max_bytes
    }

    /// The least recently seen 1/16 of the sessions (at least one), never `keep`, oldest
    /// first. A batch at once, so that a flood of new ids costs O(n) per batch, not per id.
    pub fn eviction_batch(&self, keep: Option<&SessionKey>) -> Vec<SessionKey> {
        let mut by_age: Vec<(Timestamp, &SessionKey)> = self
            .sessions
            .iter()
            .filter(|(k, _)| Some(*k) != keep)
            .map(|(k, s)| (s.last_seen, k))
            .collect();
        if by_age.is_empty() {
            return Vec::new();
        }
        let batch = (by_age.len() / 16).max(1);
        by_age.select_nth_unstable(batch - 1);
        let mut oldest: Vec<(Timestamp, &SessionKey)> = by_age.into_iter().take(batch).collect();
        oldest.sort_unstable();
        oldest.into_iter().map(|(_, k)| k.clone()).collect()
    }

    /// Sessions without traffic for longer than `timeout_ns`, in key order (so replays stay
    /// deterministic, whatever the hash order). One seen after `now` (a packet stamped ahead of
    /// the clock, which may have refused it) counts as seen now, so that it still idles out.
    pub fn idle(&mut self, now: Timestamp, timeout_ns: i64) -> Vec<SessionKey> {
        let mut idle: Vec<SessionKey> = self
            .sessions
            .iter_mut()
            .filter_map(|(k, s)| {
                s.last_seen = s.last_seen.min(now);
                (now.0.saturating_sub(s.last_seen.0) > timeout_ns).then(|| k.clone())
            })
            .collect();
        idle.sort_unstable();
        idle
    }
}

impl<D> Drop for SessionTable<D> {
    /// What this table held no longer counts against the shared totals.
    fn drop(&mut self) {
        self.usage.sub_sessions(self.sessions.len());
        self.usage.republish_session_bytes(self.bytes, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> SessionKey {
        ("127.0.0.2:80".parse().expect("addr"), format!("s{i:03}"))
    }

    /// A borrowed key hashes as the owned one does (`Borrow` requires it), so that it finds
    /// the same entries, and no other.
    #[test]
    fn borrowed_keys_find_what_owned_keys_find() {
        use std::hash::BuildHasher;
        let hasher = crate::table_hash::RandomState::default();
        let mut t: SessionTable<()> = SessionTable::new(1000, usize::MAX, Arc::default());
        let servers: [std::net::SocketAddr; 2] = [
            "127.0.0.2:80".parse().expect("addr"),
            "[::1]:8080".parse().expect("addr"),
        ];
        let ids = [
            "",
            "a",
            "s001",
            "\0Lx",
            "0123456789abcdef0123456789abcdef-0123",
        ];
        for (n, server) in (0..).zip(servers) {
            for id in ids {
                let owned: SessionKey = (server, id.to_string());
                let borrowed: SessionKeyRef<'_> = (server, id);
                assert_eq!(
                    hasher.hash_one(&owned),
                    hasher.hash_one(&borrowed as &dyn KeyView)
                );
                let mut s = Session::new("127.0.0.3:5".parse().expect("addr"), Timestamp(0));
                s.last_seen = Timestamp(n);
                t.insert(owned, s);
            }
        }
        for (n, server) in (0..).zip(servers) {
            for id in ids {
                let found = t.get_at((server, id)).map(|s| s.last_seen);
                assert_eq!(found, Some(Timestamp(n)));
                assert!(t.get_mut_at((server, id)).is_some());
            }
            assert!(t.get_at((server, "s002")).is_none());
            assert!(t.get_at((server, "s00")).is_none());
        }
        assert!(
            t.get_at(("127.0.0.2:81".parse().expect("addr"), "a"))
                .is_none()
        );
    }

    #[test]
    fn eviction_takes_the_least_recently_seen_sixteenth_and_spares_keep() {
        let mut t: SessionTable<()> = SessionTable::new(1000, usize::MAX, Arc::default());
        for i in 0..64 {
            let mut s = Session::new("127.0.0.3:5".parse().expect("addr"), Timestamp(0));
            s.last_seen = Timestamp(i64::from(i));
            t.insert(key(i), s);
            t.recharge(&key(i));
        }
        assert_eq!(t.eviction_batch(None), vec![key(0), key(1), key(2), key(3)]);
        // 63 candidates without `keep`: a batch of 3.
        assert_eq!(
            t.eviction_batch(Some(&key(0))),
            vec![key(1), key(2), key(3)]
        );
        let before = t.bytes();
        assert!(t.remove(&key(5)).is_some());
        assert!(t.bytes() < before);
    }

    /// A session last seen after the clock (a packet stamped ahead of it, which it may have
    /// refused) is taken as seen at the sweep: it idles out a timeout later, not never.
    #[test]
    fn a_session_seen_after_the_clock_idles_out_from_the_sweep() {
        let mut t: SessionTable<()> = SessionTable::new(10, usize::MAX, Arc::default());
        let hours = 7200 * 1_000_000_000;
        t.insert(
            key(0),
            Session::new("127.0.0.3:5".parse().expect("addr"), Timestamp(hours)),
        );
        let timeout = 300 * 1_000_000_000;
        assert!(t.idle(Timestamp(1_000_000_000), timeout).is_empty());
        assert!(t.idle(Timestamp(timeout), timeout).is_empty());
        assert_eq!(
            t.idle(Timestamp(timeout + 2_000_000_000), timeout),
            vec![key(0)]
        );
    }

    #[test]
    fn a_session_is_charged_for_its_requests_in_flight_until_they_are_answered() {
        use crate::jsonrpc::Id;
        let mut t: SessionTable<()> = SessionTable::new(10, usize::MAX, Arc::default());
        t.insert(
            key(0),
            Session::new("127.0.0.3:5".parse().expect("addr"), Timestamp(0)),
        );
        t.recharge(&key(0));
        let idle = t.bytes();
        let ids: Vec<Id> = (0..4096).map(|i| Id(format!("\"{i:0>100}\""))).collect();
        let s = t.get_mut(&key(0)).expect("session");
        for (n, id) in (0..).zip(&ids) {
            s.in_flight.insert(id, (1, n));
        }
        t.recharge(&key(0));
        // Each request holds a slot and a copy of its 102-byte id, at the least.
        let busy = t.bytes();
        assert!(busy - idle >= 4096 * (102 + 24), "{idle} -> {busy}");
        let s = t.get_mut(&key(0)).expect("session");
        for id in &ids[..4000] {
            s.in_flight.remove(id);
        }
        t.recharge(&key(0));
        let fewer = t.bytes();
        assert!(
            fewer - idle < (busy - idle) / 8,
            "{idle} -> {busy} -> {fewer}"
        );
        let s = t.get_mut(&key(0)).expect("session");
        for id in &ids[4000..] {
            s.in_flight.remove(id);
        }
        t.recharge(&key(0));
        // All answered: what is left is at most the smallest table's room (4 slots, each with
        // an id's allowance).
        assert!(t.bytes() - idle <= 512, "{idle} -> {}", t.bytes());
    }

    #[test]
    fn byte_cap_is_reported_by_recharge() {
        // Each costs the fixed part, its id ("s000") and its client info ("null").
        let one = fixed_cost::<()>() + 4;
        let mut t: SessionTable<()> = SessionTable::new(1000, 3 * one, Arc::default());
        for i in 0..3 {
            t.insert(
                key(i),
                Session::new("127.0.0.3:5".parse().expect("addr"), Timestamp(0)),
            );
            assert!(!t.recharge(&key(i)), "{i}");
        }
        assert!(t.is_full());
        t.insert(
            key(3),
            Session::new("127.0.0.3:5".parse().expect("addr"), Timestamp(0)),
        );
        assert!(t.recharge(&key(3)));
    }

    #[test]
    fn caps_apply_to_the_totals_of_tables_that_share_a_usage() {
        let one = fixed_cost::<()>() + 4;
        let usage = Arc::new(SharedUsage::default());
        let mut a: SessionTable<()> = SessionTable::new(3, usize::MAX, usage.clone());
        let mut b: SessionTable<()> = SessionTable::new(3, 4 * one, usage.clone());
        let client = "127.0.0.3:5".parse().expect("addr");
        for i in 0..2 {
            a.insert(key(i), Session::new(client, Timestamp(0)));
            a.recharge(&key(i));
        }
        assert!(!b.is_full());
        b.insert(key(9), Session::new(client, Timestamp(0)));
        b.recharge(&key(9));
        // Three sessions in all: b is full although it holds one.
        assert!(b.is_full());
        assert_eq!((usage.sessions(), usage.session_bytes()), (3, 3 * one));
        drop(a);
        assert_eq!((usage.sessions(), usage.session_bytes()), (1, one));
        assert!(!b.is_full());
    }
}
