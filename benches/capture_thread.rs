//! The live capture thread's cost per packet (issue 15, item 6; goal: at most 150 ns), without
//! libpcap: what `live::spawn` does with each packet libpcap hands it, over testkit-made frames
//! held in memory, with one consumer thread per worker queue draining it as a pipeline worker
//! would (it only counts and drops the batches, so the capture side is what is timed).
//!
//! Per packet: [`Dispatcher::worker_of`] (decode the headers, find the server endpoint, hash it
//! to a worker), [`Batch::push`], and every 512 packets [`live::send`] to that worker's queue.
//! Three stages are timed separately so that a regression shows where it is: dispatch alone,
//! dispatch + copying into batches (recycled, never sent), and the whole path with the queues.
//!
//! `cargo bench --bench capture_thread [-- --runs N] [--quick]`: prints ns/packet per stage
//! (median of N passes, after a warm-up pass) against the goal; timings are reported, never
//! asserted. With `--callgrind-pass`, one warm-up and one counted pass of the whole path, the
//! latter in `full_pass` (for `valgrind --tool=callgrind --toggle-collect=*full_pass*`:
//! instructions per packet).

mod support;

use std::hint::black_box;
use std::thread::JoinHandle;
use std::time::Instant;

use mcptap::live::{self, Batch, Dispatcher, ServerDirectory, WorkerInbox, WorkerQueue};
use mcptap_core::decode::dlt;

/// The binary's allocator: batches are allocated here and handed back by the consumer threads
/// (`WorkerInbox::recycle`), as the daemon's workers do.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GOAL_NS_PER_PACKET: f64 = 150.0;
/// Batches queued per worker, as `mcptap run` sets them.
const QUEUE_BATCHES: usize = 64;

use support::frames::FrameStore as Capture;

/// Worker queues as the daemon makes them, each drained by a thread that counts packets.
struct Queues {
    queues: Vec<WorkerQueue>,
    drains: Vec<JoinHandle<u64>>,
}

impl Queues {
    fn new(workers: usize) -> Queues {
        let mut queues = Vec::new();
        let mut drains = Vec::new();
        for i in 0..workers {
            let depth =
                prometheus::IntGauge::new(format!("depth_{i}"), "batches queued").expect("gauge");
            let waited = prometheus::IntCounter::new(format!("waited_{i}"), "packets waited")
                .expect("counter");
            let (queue, inbox) = live::worker_queue(QUEUE_BATCHES, depth.clone(), waited);
            drains.push(std::thread::spawn(move || drain(inbox, depth)));
            queues.push(queue);
        }
        Queues { queues, drains }
    }

    /// Closes the queues; packets received and packets the capture side waited for.
    fn close(self) -> (u64, u64) {
        let waited = self.queues.iter().map(|q| q.waited_packets.get()).sum();
        drop(self.queues);
        let received = self.drains.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        (received, waited)
    }
}

fn drain(inbox: WorkerInbox, depth: prometheus::IntGauge) -> u64 {
    let mut packets = 0;
    while let Some(batch) = inbox.recv() {
        depth.dec();
        packets += batch.packets.len() as u64;
        inbox.recycle(batch);
    }
    packets
}

/// Stage 1: the dispatcher alone.
#[inline(never)]
fn dispatch_pass(cap: &Capture, dispatcher: &mut Dispatcher) -> usize {
    let mut sum = 0;
    for (_, frame) in cap.frames() {
        sum += dispatcher.worker_of(dlt::EN10MB, black_box(frame));
    }
    sum
}

/// Stage 2: dispatch and copy into per-worker batches, cleared instead of sent.
#[inline(never)]
fn batch_pass(cap: &Capture, dispatcher: &mut Dispatcher, batches: &mut [Batch]) -> usize {
    let mut full = 0;
    for (ts, frame) in cap.frames() {
        let w = dispatcher.worker_of(dlt::EN10MB, frame);
        let Some(batch) = batches.get_mut(w) else {
            continue;
        };
        batch.push(ts, frame);
        if batch.is_full() {
            full += 1;
            batch.data.clear();
            batch.packets.clear();
        }
    }
    full
}

/// Stage 3: what `live::spawn` does per packet, queues included (the same calls in the same
/// order; the end-of-poll flush happens once, at the end).
#[inline(never)]
fn full_pass(
    cap: &Capture,
    dispatcher: &mut Dispatcher,
    batches: &mut [Batch],
    queues: &[WorkerQueue],
) -> bool {
    capture(cap, dispatcher, batches, queues)
}

/// [`full_pass`] under another name, for warming up outside what callgrind counts (the
/// `black_box` keeps the linker from folding the two identical functions into one).
#[inline(never)]
fn warmup_pass(
    cap: &Capture,
    dispatcher: &mut Dispatcher,
    batches: &mut [Batch],
    queues: &[WorkerQueue],
) -> bool {
    black_box(capture(cap, dispatcher, batches, queues))
}

#[inline(always)]
fn capture(
    cap: &Capture,
    dispatcher: &mut Dispatcher,
    batches: &mut [Batch],
    queues: &[WorkerQueue],
) -> bool {
    for (ts, frame) in cap.frames() {
        let w = dispatcher.worker_of(dlt::EN10MB, frame);
        let (Some(batch), Some(queue)) = (batches.get_mut(w), queues.get(w)) else {
            continue;
        };
        batch.push(ts, frame);
        if batch.is_full() && !live::send(queue, batch, dlt::EN10MB) {
            return false;
        }
    }
    for (batch, queue) in batches.iter_mut().zip(queues) {
        if !batch.packets.is_empty() && !live::send(queue, batch, dlt::EN10MB) {
            return false;
        }
    }
    true
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn new_batches(workers: usize) -> Vec<Batch> {
    (0..workers)
        .map(|_| Batch {
            linktype: dlt::EN10MB,
            ..Batch::default()
        })
        .collect()
}

/// Times `runs` passes of each stage over `cap` with `workers` queues; prints one line each.
fn measure(name: &str, cap: &Capture, workers: usize, runs: usize) -> f64 {
    let packets = cap.packets() as f64;
    // One dispatcher for all passes, as a capture thread keeps its own: after the first pass
    // its directory knows every flow (the steady state).
    // Its batches too: each sent batch leaves its room to the next.
    let mut dispatcher = Dispatcher::new(ServerDirectory::default(), workers);
    let queues = Queues::new(workers);
    let mut sending = new_batches(workers);
    assert!(
        warmup_pass(cap, &mut dispatcher, &mut sending, &queues.queues),
        "a consumer thread stopped"
    );
    let ns = |t: Instant| t.elapsed().as_nanos() as f64 / packets;
    let mut dispatch = Vec::new();
    let mut batch = Vec::new();
    let mut full = Vec::new();
    let mut batches = new_batches(workers);
    for _ in 0..runs {
        let t = Instant::now();
        black_box(dispatch_pass(cap, &mut dispatcher));
        dispatch.push(ns(t));
        let t = Instant::now();
        black_box(batch_pass(cap, &mut dispatcher, &mut batches));
        batch.push(ns(t));
        let t = Instant::now();
        let ok = full_pass(cap, &mut dispatcher, &mut sending, &queues.queues);
        full.push(ns(t));
        assert!(ok, "a consumer thread stopped");
    }
    let (received, waited) = queues.close();
    assert_eq!(
        received,
        (cap.packets() * (runs + 1)) as u64,
        "every packet reached a worker queue"
    );
    let whole = median(full);
    println!(
        "{name:<24} {:>5.0} {:>6.0} {workers:>7} {:>9} {:>10.1} {:>12.1} {:>10.1} {:>12} {:>6.0}%",
        cap.bytes() as f64 / (1 << 20) as f64,
        cap.bytes() as f64 / packets,
        cap.packets(),
        median(dispatch),
        median(batch),
        whole,
        waited,
        100.0 * whole / GOAL_NS_PER_PACKET
    );
    whole
}

fn gateway(sessions: u64) -> Capture {
    let mut cap = Capture::default();
    support::gateway::generate(sessions, 1, &mut |ts, f| cap.push(ts, f));
    cap
}

fn mixed(bytes: u64) -> Capture {
    let mut cap = Capture::default();
    support::traffic::generate(bytes, 0.10, 1, &mut |ts, f| cap.push(ts, f));
    cap
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 5 } else { 11 });
    let (sessions, mixed_bytes) = if quick {
        (1_000, 20_000_000)
    } else {
        (4_000, 100_000_000)
    };
    let gateway = gateway(sessions);
    let mixed = mixed(mixed_bytes);

    if args.iter().any(|a| a == "--callgrind-pass") {
        // Warm the directory and the batches first (outside `full_pass`), then one counted pass.
        for (cap, workers) in [(&gateway, 2), (&mixed, 2)] {
            let mut dispatcher = Dispatcher::new(ServerDirectory::default(), workers);
            let queues = Queues::new(workers);
            let mut batches = new_batches(workers);
            let ok = warmup_pass(cap, &mut dispatcher, &mut batches, &queues.queues)
                && full_pass(cap, &mut dispatcher, &mut batches, &queues.queues);
            queues.close();
            assert!(ok, "a consumer thread stopped");
        }
        println!("packets: {}", gateway.packets() + mixed.packets());
        return;
    }

    println!(
        "== live capture thread, per packet, without libpcap (median of {runs} passes; goal <= {GOAL_NS_PER_PACKET} ns) =="
    );
    println!(
        "{:<24} {:>5} {:>6} {:>7} {:>9} {:>10} {:>12} {:>10} {:>12} {:>7}",
        "frames",
        "MiB",
        "avg B",
        "workers",
        "packets",
        "dispatch",
        "+batch copy",
        "+queues",
        "waited pkts",
        "of goal"
    );
    let mut worst: f64 = 0.0;
    for (name, cap) in [
        ("gateway-shaped", &gateway),
        ("mixed (90 % bulk bytes)", &mixed),
    ] {
        for workers in [1, 2, 4] {
            worst = worst.max(measure(name, cap, workers, runs));
        }
    }
    println!(
        "(ns/packet per stage, each column including the ones before it; MiB: frames walked per \
         pass: the mixed ones and the batches they are copied into exceed the CPU caches, so \
         each frame there costs cache misses, as in a 64 MiB capture ring)"
    );
    println!(
        "capture thread: worst {worst:.1} ns/packet, goal <= {GOAL_NS_PER_PACKET} ns: {}",
        if worst <= GOAL_NS_PER_PACKET {
            "met"
        } else {
            "NOT met"
        }
    );
}
