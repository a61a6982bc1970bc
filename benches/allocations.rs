//! Allocations of the core pipeline per packet and per exchange (issue 15, item 5), counted by
//! a global allocator that wraps the system one:
//!
//! * the skip path (not TCP, IPv4 fragments, TLS and undecodable flows, an SSE stream's
//!   keep-alive packets and pure ACKs) must not allocate at all once its flow is warm;
//! * a steady-state exchange (legacy `tools/call` in JSON and SSE, modern `tools/call`) must
//!   stay within `cases::MAX_ALLOCATIONS_PER_EXCHANGE` (and an `initialize` within
//!   `cases::MAX_ALLOCATIONS_PER_HANDSHAKE`).
//!
//! Exits 1 when either fails. `cargo bench --bench allocations` (`scripts/bench.sh` runs it);
//! the same checks at a small scale run in debug as `tests/allocations.rs`.

#[path = "support/allocation_cases.rs"]
mod cases;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use cases::Counts;

struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static REALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to `System` unchanged; the counters are plain atomics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new_size.saturating_sub(layout.size()) as u64, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The bench runs on one thread, so the global counts are this thread's.
fn counts() -> Counts {
    Counts {
        allocations: ALLOCATIONS.load(Relaxed),
        reallocations: REALLOCATIONS.load(Relaxed),
        bytes: BYTES.load(Relaxed),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let mut failures = Vec::new();

    println!("== skip path: allocation calls per packet, steady state (must be 0) ==");
    println!(
        "{:<40} {:>9} {:>12} {:>10} {:>10}",
        "case", "packets", "alloc calls", "bytes", "per packet"
    );
    for case in cases::skip_cases(cases::FULL) {
        let r = cases::run_skip(&case, counts);
        println!(
            "{:<40} {:>9} {:>12} {:>10} {:>10.3}",
            r.name,
            r.packets,
            r.counts.calls(),
            r.counts.bytes,
            r.per_packet()
        );
        failures.extend(r.check().err());
    }

    println!();
    println!(
        "== exchanges: allocation calls per exchange, steady state (bound {}; initialize {}) ==",
        cases::MAX_ALLOCATIONS_PER_EXCHANGE,
        cases::MAX_ALLOCATIONS_PER_HANDSHAKE
    );
    println!(
        "{:<36} {:>9} {:>6} {:>6} {:>10} {:>11} {:>10}",
        "case", "exchanges", "mean", "max", "bytes/exch", "initialize", "TCP open"
    );
    for case in cases::exchange_cases(cases::FULL) {
        let r = cases::run_exchanges(&case, counts);
        println!(
            "{:<36} {:>9} {:>6.1} {:>6} {:>10.0} {:>11} {:>10}",
            r.name,
            r.steady.len(),
            r.mean(),
            r.max(),
            r.mean_bytes(),
            r.handshake_calls().map_or("-".into(), |n| n.to_string()),
            r.connection.calls(),
        );
        failures.extend(r.check().err());
    }
    println!();
    if failures.is_empty() {
        println!("allocations: PASS");
    } else {
        for f in &failures {
            println!("allocations: FAIL: {f}");
        }
        std::process::exit(1);
    }
}
