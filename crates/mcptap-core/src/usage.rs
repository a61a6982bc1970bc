//! What the pipelines of one process hold together, so that limits are process-wide totals.
//!
//! A process that runs several pipelines (one per worker thread) hands each the same
//! [`SharedUsage`]. Every pipeline adds what it holds and compares the totals with its limits;
//! one over a total evicts its own least recently seen entries, so a single busy worker may use
//! the whole budget (an even split would starve the one worker of a single-upstream gateway).
//! A lone pipeline has a usage of its own, and then the totals are its own figures.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counters shared by the pipelines of one process. Relaxed atomics: each is a running total
/// that limits are checked against, not a synchronisation point.
#[derive(Debug, Default)]
pub struct SharedUsage {
    flows: OwnLine,
    flow_bytes: OwnLine,
    sessions: OwnLine,
    session_bytes: OwnLine,
    staged_bytes: OwnLine,
}

/// A counter on cache lines of its own. A split replay's flow thread writes the flow figures
/// on every packet and its session thread the session figures on every request: sharing one
/// line, each write took the line from the other core.
#[derive(Debug, Default)]
#[repr(align(128))] // two lines: x86 fetches lines in adjacent pairs
struct OwnLine(AtomicUsize);

impl std::ops::Deref for OwnLine {
    type Target = AtomicUsize;

    fn deref(&self) -> &AtomicUsize {
        &self.0
    }
}

impl SharedUsage {
    /// Tracked flows, all pipelines together.
    pub fn flows(&self) -> usize {
        self.flows.load(Ordering::Relaxed)
    }

    /// Estimated bytes of flow state and buffers, all pipelines together.
    pub fn flow_bytes(&self) -> usize {
        self.flow_bytes.load(Ordering::Relaxed)
    }

    /// Tracked sessions, all pipelines together.
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Estimated bytes of session state, all pipelines together.
    pub fn session_bytes(&self) -> usize {
        self.session_bytes.load(Ordering::Relaxed)
    }

    /// Estimated bytes of the steps a split pipeline's flow layer handed over that its session
    /// layer has not done yet (bodies, mostly), all pipelines together; counted at each
    /// hand-over and done at the end of each batch, not step by step. Not part of
    /// [`SharedUsage::memory`]: they wait in the queues between threads, which bound them, and
    /// evicting flows would not free them (`docs/sharding.md`, step 3).
    pub fn staged_bytes(&self) -> usize {
        self.staged_bytes.load(Ordering::Relaxed)
    }

    /// Everything charged against the memory budget.
    pub fn memory(&self) -> usize {
        self.flow_bytes().saturating_add(self.session_bytes())
    }

    pub(crate) fn add_flows(&self, n: usize) {
        self.flows.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub_flows(&self, n: usize) {
        self.flows.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn add_sessions(&self, n: usize) {
        self.sessions.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub_sessions(&self, n: usize) {
        self.sessions.fetch_sub(n, Ordering::Relaxed);
    }

    /// Moves a published figure from `before` to `after`.
    pub(crate) fn republish_flow_bytes(&self, before: usize, after: usize) {
        republish(&self.flow_bytes, before, after);
    }

    pub(crate) fn republish_session_bytes(&self, before: usize, after: usize) {
        republish(&self.session_bytes, before, after);
    }

    pub(crate) fn republish_staged_bytes(&self, before: usize, after: usize) {
        republish(&self.staged_bytes, before, after);
    }
}

fn republish(counter: &AtomicUsize, before: usize, after: usize) {
    if after > before {
        counter.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        counter.fetch_sub(before - after, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_move_by_their_difference() {
        let u = SharedUsage::default();
        u.republish_flow_bytes(0, 100);
        u.republish_flow_bytes(0, 50);
        u.republish_flow_bytes(100, 30);
        u.republish_session_bytes(0, 7);
        u.republish_staged_bytes(0, 5);
        assert_eq!((u.flow_bytes(), u.session_bytes(), u.memory()), (80, 7, 87));
        assert_eq!(u.staged_bytes(), 5);
        u.add_flows(3);
        u.sub_flows(1);
        u.add_sessions(2);
        assert_eq!((u.flows(), u.sessions()), (2, 2));
    }
}
