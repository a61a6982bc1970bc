//! The allocation checks of `benches/allocations.rs` at a small scale, in debug, for CI: the
//! pipeline's skip path allocates nothing once its flows are warm, and a steady-state exchange
//! stays within the bound. Allocation counts do not depend on the optimisation level.
//!
//! The test harness allocates on its own threads, so the counting allocator counts only on a
//! thread that asked for it (a thread-local flag).

#[path = "../benches/support/allocation_cases.rs"]
mod cases;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use cases::Counts;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNTS: Cell<Counts> = const {
        Cell::new(Counts { allocations: 0, reallocations: 0, bytes: 0 })
    };
}

fn note(allocations: u64, reallocations: u64, bytes: u64) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let counting = COUNTING.try_with(Cell::get).unwrap_or(false);
    if counting {
        let _ = COUNTS.try_with(|c| {
            let mut n = c.get();
            n.allocations += allocations;
            n.reallocations += reallocations;
            n.bytes += bytes;
            c.set(n);
        });
    }
}

struct ThreadCountingAllocator;

// SAFETY: every call goes to `System` unchanged; the counters are const-initialised
// thread-locals without destructors, so reading them never allocates.
unsafe impl GlobalAlloc for ThreadCountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(1, 0, layout.size() as u64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(1, 0, layout.size() as u64);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(0, 1, new_size.saturating_sub(layout.size()) as u64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: ThreadCountingAllocator = ThreadCountingAllocator;

fn counts() -> Counts {
    COUNTS.with(Cell::get)
}

fn counting<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.with(|c| c.set(true));
    let t = f();
    COUNTING.with(|c| c.set(false));
    t
}

#[test]
fn the_counter_sees_this_threads_allocations() {
    let before = counts();
    let v = counting(|| std::hint::black_box(vec![1u8; 100]));
    let after = counts();
    assert_eq!(after.allocations - before.allocations, 1);
    assert_eq!(after.bytes - before.bytes, 100);
    drop(v);
    // Not counting: nothing noted.
    let _w = std::hint::black_box(vec![1u8; 100]);
    assert_eq!(counts(), after);
}

#[test]
fn the_skip_path_allocates_nothing_in_steady_state() {
    for case in cases::skip_cases(cases::SMALL) {
        let r = counting(|| cases::run_skip(&case, counts));
        assert!(
            r.packets >= 50,
            "{}: only {} packets measured",
            r.name,
            r.packets
        );
        assert_eq!(r.check(), Ok(()));
    }
}

#[test]
fn an_exchange_stays_within_its_allocation_bound() {
    for case in cases::exchange_cases(cases::SMALL) {
        let r = counting(|| cases::run_exchanges(&case, counts));
        // The counter counted something real: every exchange allocates its events.
        assert!(r.mean() > 0.0, "{}: nothing counted", r.name);
        assert_eq!(r.check(), Ok(()));
    }
}
