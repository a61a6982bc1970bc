//! The live capture thread's cost per packet (issue 15, item 6; goal: at most 150 ns), without
//! libpcap: what `live::spawn` does with each packet libpcap hands it, over testkit-made frames
//! held in memory, with one consumer thread per worker queue draining it as a pipeline worker
//! would (it only counts and drops the batches, so the capture side is what is timed).
//!
//! Per packet: [`Dispatcher::worker_of`] (decode the headers, find the server endpoint, hash it
//! to a worker), [`Batch::push`], and every 512 packets [`live::send`] to that worker's queue.
//! Three stages are timed separately so that a regression shows where it is: dispatch alone,
//! dispatch + copying into batches (recycled, never sent), and the whole path with the queues.
//! The whole path is timed twice: over frames in memory walked once per pass (cold: every
//! frame header is a cache miss, as when a capture thread reads a ring long after the kernel
//! wrote it), and through a ring of blocks that another thread writes just ahead of the reader
//! (as the kernel fills TPACKET_V3 blocks for a capture thread that keeps up). The goal is
//! judged on the second, in the capture thread's own CPU time (its cost: the wall clock also
//! counts the time the drain threads and the writer had its core); its wall time and the
//! first are reported beside it.
//!
//! `cargo bench --bench capture_thread [-- --runs N] [--quick]`: prints ns/packet per stage
//! (median of N passes, after a warm-up pass) against the goal; timings are reported, never
//! asserted. With `--callgrind-pass`, one warm-up and one counted pass of the whole path, the
//! latter in `full_pass` (for `valgrind --tool=callgrind --toggle-collect=*full_pass*`:
//! instructions per packet).

mod support;

use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mcptap::live::{self, Batch, Dispatcher, ServerDirectory, WorkerInbox, WorkerQueue};
use mcptap_core::decode::dlt;

/// The binary's allocator: batches are allocated here and handed back by the consumer threads
/// (`WorkerInbox::recycle`), as the daemon's workers do.
#[global_allocator]
static ALLOCATOR: mcptap::allocator::Allocator = mcptap::allocator::Allocator;

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

/// A TPACKET_V3 ring as the kernel fills it: blocks of `RING_BLOCK_BYTES`, each a frame count
/// then frames behind headers, written by another thread (the kernel's softirq, on another
/// core) just before the capture thread reads it.
const RING_BLOCK_BYTES: usize = 256 * 1024;
const RING_BLOCKS: usize = 8;
/// How many blocks the writer may run ahead: a capture thread that keeps up reads blocks the
/// kernel has just written (one that falls a whole ring behind drops packets instead).
const RING_LEAD: usize = 2;
/// Room before each frame, as for `tpacket3_hdr` and `sockaddr_ll`; frames start 16-aligned.
const RING_FRAME_HEADER: usize = 64;

struct Ring {
    slots: Vec<Mutex<Vec<u8>>>,
    /// Blocks written so far.
    written: AtomicUsize,
    /// Blocks read so far.
    read: AtomicUsize,
}

fn wait_until(counter: &AtomicUsize, at_least: usize) {
    let mut spins = 0u32;
    while counter.load(Ordering::Acquire) < at_least {
        spins += 1;
        if spins < 1000 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Frames per ring block, packed in order as [`write_ring`] packs them.
fn ring_layout(cap: &Capture) -> Vec<usize> {
    let mut blocks = Vec::new();
    let (mut count, mut used) = (0, 4usize);
    for (_, frame) in cap.frames() {
        let end = used.next_multiple_of(16) + RING_FRAME_HEADER + frame.len();
        if count > 0 && end > RING_BLOCK_BYTES {
            blocks.push(count);
            (count, used) = (0, 4);
        }
        used = used.next_multiple_of(16) + RING_FRAME_HEADER + frame.len();
        count += 1;
    }
    if count > 0 {
        blocks.push(count);
    }
    blocks
}

/// The kernel's side: writes `cap`'s frames into the ring's blocks, at most `RING_LEAD` ahead
/// of the reader.
fn write_ring(cap: &Capture, layout: &[usize], ring: &Ring) {
    let mut frames = cap.frames();
    for (block, &count) in layout.iter().enumerate() {
        wait_until(&ring.read, (block + 1).saturating_sub(RING_LEAD));
        let Some(slot) = ring.slots.get(block % RING_BLOCKS) else {
            return;
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        slot.clear();
        slot.extend_from_slice(&(count as u32).to_le_bytes());
        for (ts, frame) in frames.by_ref().take(count) {
            let at = slot.len().next_multiple_of(16);
            slot.resize(at, 0);
            slot.extend_from_slice(&ts.to_le_bytes());
            slot.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            slot.resize(at + RING_FRAME_HEADER, 0);
            slot.extend_from_slice(frame);
        }
        drop(slot);
        ring.written.store(block + 1, Ordering::Release);
    }
}

/// This thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`): what it ran, not what the
/// other threads of the bench ran on its core meanwhile.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// What the capture thread spent per packet of a pass: by the wall clock, and in its own CPU
/// time (the cost of its work; the wall clock also counts the time the drain threads and the
/// ring's writer had its core, which `workers + 2` threads on fewer cores make large).
#[derive(Debug, Clone, Copy)]
struct Spent {
    wall_ns: f64,
    cpu_ns: f64,
}

/// The whole path over `cap` as it arrives through a ring (see [`Ring`]): what the capture
/// thread spent per packet on its blocks, not counting its waits for the writer.
#[inline(never)]
fn ring_pass(
    cap: &Capture,
    dispatcher: &mut Dispatcher,
    batches: &mut [Batch],
    queues: &[WorkerQueue],
) -> Spent {
    let ring = Ring {
        slots: (0..RING_BLOCKS)
            .map(|_| Mutex::new(Vec::with_capacity(RING_BLOCK_BYTES)))
            .collect(),
        written: AtomicUsize::new(0),
        read: AtomicUsize::new(0),
    };
    let layout = ring_layout(cap);
    let mut busy = Duration::ZERO;
    let mut busy_cpu = Duration::ZERO;
    let mut packets = 0usize;
    std::thread::scope(|scope| {
        scope.spawn(|| write_ring(cap, &layout, &ring));
        for block in 0..layout.len() {
            wait_until(&ring.written, block + 1);
            let Some(slot) = ring.slots.get(block % RING_BLOCKS) else {
                break;
            };
            let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            let (t, c) = (Instant::now(), thread_cpu());
            packets += read_block(&slot, dispatcher, batches, queues);
            busy += t.elapsed();
            busy_cpu += thread_cpu().saturating_sub(c);
            drop(slot);
            ring.read.store(block + 1, Ordering::Release);
        }
        let (t, c) = (Instant::now(), thread_cpu());
        for (batch, queue) in batches.iter_mut().zip(queues) {
            if !batch.packets.is_empty() {
                assert!(
                    live::send(queue, batch, dlt::EN10MB),
                    "a consumer thread stopped"
                );
            }
        }
        busy += t.elapsed();
        busy_cpu += thread_cpu().saturating_sub(c);
    });
    assert_eq!(packets, cap.packets(), "every frame came through the ring");
    Spent {
        wall_ns: busy.as_nanos() as f64 / packets as f64,
        cpu_ns: busy_cpu.as_nanos() as f64 / packets as f64,
    }
}

/// One ring block through the capture thread's per-packet path; the packets in it.
#[inline(always)]
fn read_block(
    block: &[u8],
    dispatcher: &mut Dispatcher,
    batches: &mut [Batch],
    queues: &[WorkerQueue],
) -> usize {
    let word = |at: usize, n: usize| block.get(at..at + n);
    let count = word(0, 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut at = 4usize;
    for _ in 0..count {
        at = at.next_multiple_of(16);
        let (Some(ts), Some(len)) = (word(at, 8), word(at + 8, 4)) else {
            return 0;
        };
        let ts = i64::from_le_bytes(ts.try_into().unwrap_or_default());
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        let Some(frame) = word(at + RING_FRAME_HEADER, len) else {
            return 0;
        };
        at += RING_FRAME_HEADER + len;
        let w = dispatcher.worker_of(dlt::EN10MB, frame);
        let (Some(batch), Some(queue)) = (batches.get_mut(w), queues.get(w)) else {
            continue;
        };
        batch.push(ts, frame);
        if batch.is_full() {
            assert!(
                live::send(queue, batch, dlt::EN10MB),
                "a consumer thread stopped"
            );
        }
    }
    count as usize
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

/// Times `runs` passes of each stage over `cap` with `workers` queues and prints one line:
/// returns the whole path over frames in memory (cold), and through a freshly written ring.
fn measure(name: &str, cap: &Capture, workers: usize, runs: usize) -> (f64, Spent) {
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
    let mut ring = Vec::new();
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
        ring.push(ring_pass(
            cap,
            &mut dispatcher,
            &mut sending,
            &queues.queues,
        ));
    }
    let (received, waited) = queues.close();
    assert_eq!(
        received,
        (cap.packets() * (2 * runs + 1)) as u64,
        "every packet reached a worker queue"
    );
    let whole = median(full);
    let ringed = Spent {
        wall_ns: median(ring.iter().map(|r| r.wall_ns).collect()),
        cpu_ns: median(ring.iter().map(|r| r.cpu_ns).collect()),
    };
    println!(
        "{name:<24} {:>5.0} {:>6.0} {workers:>7} {:>9} {:>10.1} {:>12.1} {:>10.1} {:>10.1} {:>10.1} {:>12} {:>6.0}%",
        cap.bytes() as f64 / (1 << 20) as f64,
        cap.bytes() as f64 / packets,
        cap.packets(),
        median(dispatch),
        median(batch),
        whole,
        ringed.wall_ns,
        ringed.cpu_ns,
        waited,
        100.0 * ringed.cpu_ns / GOAL_NS_PER_PACKET
    );
    (whole, ringed)
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
        "{:<24} {:>5} {:>6} {:>7} {:>9} {:>10} {:>12} {:>10} {:>10} {:>10} {:>12} {:>7}",
        "frames",
        "MiB",
        "avg B",
        "workers",
        "packets",
        "dispatch",
        "+batch copy",
        "+queues",
        "from ring",
        "ring, CPU",
        "waited pkts",
        "of goal"
    );
    let (mut worst_cold, mut worst_ring, mut worst_ring_cpu): (f64, f64, f64) = (0.0, 0.0, 0.0);
    for (name, cap) in [
        ("gateway-shaped", &gateway),
        ("mixed (90 % bulk bytes)", &mixed),
    ] {
        for workers in [1, 2, 4] {
            let (cold, ringed) = measure(name, cap, workers, runs);
            worst_cold = worst_cold.max(cold);
            worst_ring = worst_ring.max(ringed.wall_ns);
            worst_ring_cpu = worst_ring_cpu.max(ringed.cpu_ns);
        }
    }
    println!(
        "(ns/packet per stage; dispatch, +batch copy and +queues each include the ones before, \
         over frames in memory: MiB is what one pass walks, and the mixed ones with their \
         batches exceed the CPU caches, so each frame there costs cache misses. from ring: the \
         whole path again, with each frame read from a {RING_BLOCKS}-block ring of {} KiB \
         blocks that another thread wrote at most {RING_LEAD} blocks ahead, as the kernel fills \
         TPACKET_V3 blocks for a capture thread that keeps up; waits for the writer not \
         counted; by the wall clock, and in the capture thread's own CPU time (ring, CPU: its \
         cost; the wall clock also counts the time the workers' drain threads and the writer \
         had its core, {cores} cores for workers + 2 threads here). of goal: ring, CPU.)",
        RING_BLOCK_BYTES / 1024,
        cores = std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let verdict = |ns: f64| {
        if ns <= GOAL_NS_PER_PACKET {
            "met"
        } else {
            "NOT met"
        }
    };
    println!(
        "capture thread: worst {worst_ring_cpu:.1} ns/packet of its CPU from a freshly written \
         ring, goal <= {GOAL_NS_PER_PACKET} ns: {}; by the wall clock worst {worst_ring:.1} \
         ns/packet: {}; from cold memory (frames read long after they were written, wall \
         clock) worst {worst_cold:.1} ns/packet: {}",
        verdict(worst_ring_cpu),
        verdict(worst_ring),
        verdict(worst_cold)
    );
}
