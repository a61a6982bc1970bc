//! The flow layer sharded by connection over threads (`docs/sharding.md`, step 3): the calling
//! thread runs the [`FlowDispatcher`] (packet numbers, the clock, the sweeps); each flow shard
//! (decoding, reassembly, HTTP, SSE, decompression) runs on a thread of its own and takes the
//! packets of its connections, a round at a time, and answers in parts; the calling thread
//! merges the parts back into one pipeline's order by watermarks ([`FlowMerge`]) and hands them
//! to the session layer, as the flow side of a split pipeline would. [`FlowShards`] is pushed
//! packets: a replay's (`crate::replay`), or a live worker's batches (`crate::daemon`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::thread::JoinHandle;

use mcptap_core::flow_shard::{
    FlowDispatcher, FlowMerge, FlowPhase, FlowRound, FlowUnit, MergedSteps, PacketAt, StagedSteps,
};
use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::{Limits, PacketStats, Pipeline};
use mcptap_core::usage::SharedUsage;

/// Packets (or bytes of frames) the calling thread gives the shards per round, and rounds that
/// may wait for a shard. The frames on their way (at most `QUEUE_ROUNDS` + 2 rounds per shard:
/// queued, being processed, being filled) are bounded here, outside the memory budget: charged
/// to it, they would make the shards evict flows for bytes no eviction can free (as the live
/// capture queues, which are bounded the same way).
/// Small in bytes: what a shard stages of a round's frames (decompressed bodies) can be up to
/// 200 times their size. It is not charged to the budget either (the merge takes it in parts
/// of [`PART_BYTES`] as soon as every shard has passed it, and the session layer's queues
/// bound it beyond), so what bounds it is these rounds (an attacker's pass: pipelined gzip
/// bodies of 3.8 MiB, 512 KiB rounds and four queued took 414 MB; with these, about 130 MB
/// and one thread's events at any budget, `docs/sharding.md`). Bulk traffic pays for small
/// rounds in hand-overs (the mixed quick capture 53 ms against 42 ms with one flow thread).
const ROUND_PACKETS: usize = 1024;
const ROUND_BYTES: usize = 64 << 10;
const QUEUE_ROUNDS: usize = 2;

/// Where the flow layer of a split replay runs.
pub enum FlowLayer {
    /// On the calling thread.
    Here(Box<Pipeline>),
    /// Sharded by connection, each shard on a thread of its own (see [`Pipeline::split_flows`]):
    /// the shards' pipelines, their limits, and the budget they share.
    Sharded {
        shards: Vec<Pipeline>,
        limits: Limits,
        usage: Arc<SharedUsage>,
    },
}

/// Session inputs (decoded bodies, bytes) a shard stages before it answers part of a round,
/// and that the merge hands the session layer at once: as the split hands over
/// (`SPLIT_BATCH_BYTES`), so that what waits between the threads comes in pieces of about
/// this size (one body may pass it) instead of a round's worth.
const PART_BYTES: usize = 1 << 20;

/// One shard's work of one round: its packets' frames, one after another, and what to do.
struct FlowBatch {
    frames: Vec<u8>,
    commands: Vec<Command>,
    /// Every unit of the round is before this one (the shard's watermark once done).
    end: FlowUnit,
}

impl Default for FlowBatch {
    fn default() -> FlowBatch {
        FlowBatch {
            frames: Vec::new(),
            commands: Vec::new(),
            end: FlowUnit::START,
        }
    }
}

enum Command {
    /// A packet whose frame ends at `end` in the batch's frames (and starts where the one
    /// before it ended).
    Packet {
        at: PacketAt,
        linktype: u32,
        end: usize,
    },
    Sweep {
        seq: u64,
        now: Timestamp,
    },
    Finish {
        now: Timestamp,
    },
    /// Tests: the shard's thread panics here, as a bug in the flow layer would make it.
    #[cfg(test)]
    Panic,
}

#[cfg(test)]
thread_local! {
    /// Tests: the next round this thread sends makes its first shard panic.
    static PANIC_IN_NEXT_ROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
const INJECTED_PANIC: &str = "injected: a bug in a flow shard";

impl Command {
    /// The first unit of the shard's this command may give.
    fn first(&self) -> FlowUnit {
        let (seq, phase) = match self {
            Command::Packet { at, .. } => (at.seq, FlowPhase::Packet),
            Command::Sweep { seq, .. } => (*seq, FlowPhase::Idle),
            Command::Finish { .. } => (u64::MAX, FlowPhase::Idle),
            #[cfg(test)]
            Command::Panic => (0, FlowPhase::Packet),
        };
        FlowUnit {
            seq,
            phase,
            flow: 0,
        }
    }
}

/// Runs one round's commands through a shard; its staged steps come back in parts: to
/// `part` (with the shard's watermark) whenever they hold [`PART_BYTES`] of session inputs
/// with commands left, the rest returned.
fn run_batch(
    shard: &mut Pipeline,
    batch: &mut FlowBatch,
    out: &mut Vec<Output>,
    spare: &mut dyn FnMut() -> FlowRound,
    part: &mut dyn FnMut(&Pipeline, FlowRound, FlowUnit),
) -> FlowRound {
    let mut start = 0;
    let mut commands = batch.commands.drain(..).peekable();
    while let Some(command) = commands.next() {
        match command {
            Command::Packet { at, linktype, end } => {
                let frame = batch.frames.get(start..end).unwrap_or_default();
                shard.shard_packet(at, linktype, frame, out);
                start = end;
            }
            Command::Sweep { seq, now } => shard.shard_sweep(seq, now, out),
            Command::Finish { now } => shard.shard_finish(now, out),
            #[cfg(test)]
            Command::Panic => std::panic::panic_any(INJECTED_PANIC),
        }
        if shard.staged_bytes() >= PART_BYTES
            && let Some(next) = commands.peek()
        {
            let passed = next.first();
            shard.stage_outputs(out);
            let round = shard.take_flow_round(spare());
            part(shard, round, passed);
        }
    }
    // Every unit was marked; anything left follows them.
    shard.stage_outputs(out);
    batch.frames.clear();
    shard.take_flow_round(spare())
}

/// What a shard hands back: staged steps, its watermark after them (every later unit of
/// its is at or after it), the emptied batch once the round is done (to be filled again),
/// and its counts.
struct Answer {
    part: FlowRound,
    passed: FlowUnit,
    batch: Option<FlowBatch>,
    stats: PacketStats,
    flows: usize,
}

impl Answer {
    fn new(shard: &Pipeline, part: FlowRound, passed: FlowUnit, batch: Option<FlowBatch>) -> Self {
        Answer {
            part,
            passed,
            batch,
            stats: shard.stats().clone(),
            flows: shard.active_flows(),
        }
    }
}

/// A flow shard's thread: rounds in, answers out, until the rounds stop coming. Answers are
/// not bounded: the shard never waits on the calling thread, which may be waiting on it; what
/// they hold is bounded by the rounds the shard was sent.
fn run_shard(
    mut shard: Pipeline,
    batches: Receiver<FlowBatch>,
    done: Sender<Answer>,
    spares: Receiver<FlowRound>,
) {
    let mut out = Vec::new();
    for mut batch in batches {
        let mut gone = false;
        let round = run_batch(
            &mut shard,
            &mut batch,
            &mut out,
            &mut || spares.try_recv().unwrap_or_default(),
            &mut |shard, part, passed| {
                gone |= done.send(Answer::new(shard, part, passed, None)).is_err();
            },
        );
        let passed = batch.end;
        if gone
            || done
                .send(Answer::new(&shard, round, passed, Some(batch)))
                .is_err()
        {
            break; // the calling thread is gone
        }
    }
}

/// A flow shard as the calling thread sees it: on a thread, or (when none could be started)
/// run in place, which gives the same steps.
enum Shard {
    Thread {
        /// `None` once the input ended: the thread ends after its last answer.
        batches: Option<SyncSender<FlowBatch>>,
        done: Receiver<Answer>,
        spares: Sender<FlowRound>,
        thread: Option<JoinHandle<()>>,
    },
    InPlace {
        shard: Box<Pipeline>,
        done: VecDeque<Answer>,
        spares: Vec<FlowRound>,
        out: Vec<Output>,
    },
}

/// The flow layer sharded by connection, each shard on a thread of its own, fed packets by
/// the calling thread, which gets the merged steps back through [`FlowShards::merge_ready`].
pub struct FlowShards {
    shards: Vec<Shard>,
    dispatcher: FlowDispatcher,
    filling: Vec<FlowBatch>,
    filled: (usize, usize),
    /// The latest packet time in the round being filled.
    filling_up_to: Option<i64>,
    /// Per round sent and not merged, oldest first: the unit it ends before and its latest
    /// packet time.
    sent: VecDeque<(FlowUnit, Option<i64>)>,
    /// Rounds sent, and per shard the rounds it answered whole.
    rounds_sent: usize,
    rounds_done: Vec<usize>,
    /// The shards' parts (sources 0..n) and the dispatcher's own (source n), merged by
    /// watermarks.
    merge: FlowMerge,
    own_spares: Vec<FlowRound>,
    spare_batches: Vec<FlowBatch>,
    merged: MergedSteps,
    /// Per shard, its latest counts (packets, open flows), and the packets' sum.
    counts: Vec<(PacketStats, usize)>,
    stats: PacketStats,
    /// A shard's thread is gone (it panicked): nothing more is sent, and [`Self::fail`]
    /// raises its panic.
    broken: bool,
}

impl FlowShards {
    /// Starts a thread per shard (named `{name}-{i}`), or runs a shard in place when its
    /// thread cannot start. `usage` is the budget the shards share.
    pub fn spawn(
        shards: Vec<Pipeline>,
        limits: &Limits,
        usage: Arc<SharedUsage>,
        name: &str,
    ) -> FlowShards {
        let mut handles = Vec::with_capacity(shards.len());
        for (i, shard) in shards.into_iter().enumerate() {
            let (batch_tx, batch_rx) = sync_channel::<FlowBatch>(QUEUE_ROUNDS);
            let (done_tx, done_rx) = channel();
            let (spare_tx, spare_rx) = channel();
            // The pipeline comes back if its thread cannot start: it then runs in place.
            let slot = Arc::new(std::sync::Mutex::new(Some(shard)));
            let theirs = Arc::clone(&slot);
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let shard = theirs.lock().ok().and_then(|mut s| s.take());
                    if let Some(shard) = shard {
                        run_shard(shard, batch_rx, done_tx, spare_rx);
                    }
                });
            let handle = match spawned {
                Ok(thread) => Shard::Thread {
                    batches: Some(batch_tx),
                    done: done_rx,
                    spares: spare_tx,
                    thread: Some(thread),
                },
                Err(_) => {
                    let shard = slot.lock().ok().and_then(|mut s| s.take());
                    match shard {
                        Some(shard) => Shard::InPlace {
                            shard: Box::new(shard),
                            done: VecDeque::new(),
                            spares: Vec::new(),
                            out: Vec::new(),
                        },
                        None => continue,
                    }
                }
            };
            handles.push(handle);
        }
        let n = handles.len();
        FlowShards {
            shards: handles,
            dispatcher: FlowDispatcher::new(limits, n, Arc::clone(&usage)),
            filling: (0..n).map(|_| FlowBatch::default()).collect(),
            filled: (0, 0),
            filling_up_to: None,
            sent: VecDeque::new(),
            rounds_sent: 0,
            rounds_done: vec![0; n],
            merge: FlowMerge::new(n + 1),
            own_spares: Vec::new(),
            spare_batches: Vec::new(),
            merged: MergedSteps::new(usage),
            counts: vec![(PacketStats::default(), 0); n],
            stats: PacketStats::default(),
            broken: false,
        }
    }

    /// One packet, into the round being filled; a full round is sent (this waits while the
    /// shard it is for has [`QUEUE_ROUNDS`] rounds waiting). Returns whether a round went.
    pub fn packet(&mut self, ts: Timestamp, linktype: u32, frame: &[u8]) -> bool {
        let d = self.dispatcher.dispatch(ts, linktype, frame);
        if let Some(batch) = self.filling.get_mut(d.shard) {
            batch.frames.extend_from_slice(frame);
            let end = batch.frames.len();
            batch.commands.push(Command::Packet {
                at: d.at,
                linktype,
                end,
            });
        }
        if let Some(now) = d.sweep {
            self.sweep(d.at.seq, now);
        }
        self.filled.0 += 1;
        self.filled.1 += frame.len();
        self.filling_up_to = Some(ts.0);
        let full = self.filled.0 >= ROUND_PACKETS || self.filled.1 >= ROUND_BYTES;
        if full {
            self.send_round();
        }
        full
    }

    /// Time passes without packets: idle flows and sessions expire as in one pipeline.
    pub fn advance_time(&mut self, now: Timestamp) {
        if let Some((seq, now)) = self.dispatcher.advance(now) {
            self.sweep(seq, now);
        }
    }

    fn sweep(&mut self, seq: u64, now: Timestamp) {
        for batch in &mut self.filling {
            batch.commands.push(Command::Sweep { seq, now });
        }
    }

    /// Sends every shard its part of the round being filled (empty or not: the rounds stay
    /// aligned), if anything was put in it.
    pub fn send_round(&mut self) {
        #[cfg(test)]
        if PANIC_IN_NEXT_ROUND.with(|p| p.replace(false))
            && let Some(batch) = self.filling.first_mut()
        {
            batch.commands.push(Command::Panic);
        }
        let spare = self.own_spares.pop().unwrap_or_default();
        let dispatcher_round = self.dispatcher.take_round(spare);
        if self.filling.iter().all(|b| b.commands.is_empty()) && dispatcher_round.is_empty() {
            self.own_spares.push(dispatcher_round);
            return;
        }
        self.filled = (0, 0);
        let end = self.dispatcher.passed();
        self.sent.push_back((end, self.filling_up_to.take()));
        self.rounds_sent += 1;
        let own = self.shards.len();
        self.own_spares
            .extend(self.merge.push(own, dispatcher_round, end));
        for (i, shard) in self.shards.iter_mut().enumerate() {
            let fresh = self.spare_batches.pop().unwrap_or_default();
            let mut batch = std::mem::replace(&mut self.filling[i], fresh);
            batch.end = end;
            match shard {
                Shard::Thread { batches, .. } => {
                    let sent =
                        !self.broken && batches.as_ref().is_some_and(|b| b.send(batch).is_ok());
                    if !sent {
                        self.broken = true;
                    }
                }
                Shard::InPlace {
                    shard,
                    done,
                    spares,
                    out,
                } => {
                    let round = run_batch(
                        shard,
                        &mut batch,
                        out,
                        &mut || spares.pop().unwrap_or_default(),
                        &mut |shard, part, passed| {
                            done.push_back(Answer::new(shard, part, passed, None));
                        },
                    );
                    let passed = batch.end;
                    done.push_back(Answer::new(shard, round, passed, Some(batch)));
                }
            }
        }
        if self.broken {
            self.fail();
        }
    }

    /// A shard's thread is gone (it panicked): its panic goes on here, on the calling thread,
    /// at once. Carrying on without it would stall the merge, and with it every output of
    /// the worker, with nothing said; a live worker that panics instead stops its capture,
    /// which `/readyz` and the exit status report.
    fn fail(&mut self) -> ! {
        self.broken = true;
        for shard in &mut self.shards {
            if let Shard::Thread { batches, .. } = shard {
                // Closed, so that the other shards' threads end too.
                *batches = None;
            }
        }
        for shard in &mut self.shards {
            if let Shard::Thread { thread, .. } = shard
                && let Some(t) = thread.take()
                && let Err(panic) = t.join()
            {
                std::panic::resume_unwind(panic);
            }
        }
        panic!("a flow shard's thread ended before its input did");
    }

    /// Takes the shards' answers in (`wait`: until every round sent is answered whole), and
    /// hands what is merged of them to `hand_over` (in pieces of about [`PART_BYTES`] of
    /// session inputs), with the latest packet time of the rounds merged whole.
    pub fn merge_ready(
        &mut self,
        wait: bool,
        hand_over: &mut dyn FnMut(&mut dyn StagedSteps, Option<i64>),
    ) {
        self.take_answers(wait);
        loop {
            let shards = &mut self.shards;
            let own_spares = &mut self.own_spares;
            let more =
                self.merge
                    .merge(
                        &mut self.merged.steps,
                        PART_BYTES,
                        &mut |source, round| match shards.get_mut(source) {
                            // The shards' emptied parts go back to them to be filled again.
                            Some(Shard::Thread { spares, .. }) => {
                                let _ = spares.send(round);
                            }
                            Some(Shard::InPlace { spares, .. }) => spares.push(round),
                            None => own_spares.push(round),
                        },
                    );
            let mut up_to = None;
            let mut rounds = 0;
            if !more {
                let passed = self.merge.passed();
                while let Some(&(end, at)) = self.sent.front()
                    && end <= passed
                {
                    self.sent.pop_front();
                    up_to = at.or(up_to);
                    rounds += 1;
                }
            }
            if rounds > 0 || !self.merged.steps.is_empty() {
                hand_over(&mut self.merged, up_to);
            }
            if !more {
                break;
            }
        }
    }

    fn take_answers(&mut self, wait: bool) {
        let want = self.rounds_sent;
        let mut changed = false;
        let mut gone = false;
        for (i, shard) in self.shards.iter_mut().enumerate() {
            let mut answers = Vec::new();
            let done_before = self.rounds_done.get(i).copied().unwrap_or(want);
            match shard {
                Shard::Thread { done, .. } => {
                    answers.extend(done.try_iter());
                    let mut whole =
                        done_before + answers.iter().filter(|a| a.batch.is_some()).count();
                    while wait && whole < want {
                        match done.recv() {
                            Ok(answer) => {
                                whole += usize::from(answer.batch.is_some());
                                answers.push(answer);
                            }
                            Err(_) => {
                                // Gone: it panicked, and its panic goes on below.
                                gone = true;
                                break;
                            }
                        }
                    }
                }
                Shard::InPlace { done, .. } => answers.extend(done.drain(..)),
            }
            for answer in answers {
                if let Some(batch) = answer.batch {
                    self.spare_batches.push(batch);
                    if let Some(r) = self.rounds_done.get_mut(i) {
                        *r += 1;
                    }
                }
                if let Some(spare) = self.merge.push(i, answer.part, answer.passed) {
                    match shard {
                        Shard::Thread { spares, .. } => {
                            let _ = spares.send(spare);
                        }
                        Shard::InPlace { spares, .. } => spares.push(spare),
                    }
                }
                if let Some(c) = self.counts.get_mut(i) {
                    *c = (answer.stats, answer.flows);
                }
                changed = true;
            }
        }
        if gone {
            self.fail();
        }
        if changed {
            let mut stats = PacketStats::default();
            for (s, _) in &self.counts {
                stats.merge(s);
            }
            self.stats = stats;
        }
    }

    /// The end of the input: every flow ends, the session layer's finish is staged, and
    /// every round is merged and handed over; the shards' threads are joined (a panic in one
    /// goes on here).
    pub fn finish(&mut self, hand_over: &mut dyn FnMut(&mut dyn StagedSteps, Option<i64>)) {
        let now = self.dispatcher.finish();
        for batch in &mut self.filling {
            batch.commands.push(Command::Finish { now });
        }
        self.send_round();
        self.close(hand_over);
    }

    /// No more input (and no finish: an input that could not be read): what was sent is
    /// merged and handed over, and the threads are joined.
    pub fn close(&mut self, hand_over: &mut dyn FnMut(&mut dyn StagedSteps, Option<i64>)) {
        self.send_round();
        for shard in &mut self.shards {
            if let Shard::Thread { batches, .. } = shard {
                // Closed: the thread ends once it has answered every round.
                *batches = None;
            }
        }
        self.merge_ready(true, hand_over);
        for shard in &mut self.shards {
            if let Shard::Thread { thread, .. } = shard
                && let Some(t) = thread.take()
                && let Err(panic) = t.join()
            {
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// The merged steps not handed over yet (none once every round was, e.g. after
    /// [`FlowShards::finish`]).
    pub fn merged(&mut self) -> &mut MergedSteps {
        &mut self.merged
    }

    /// The packet counts of every shard, as of their latest answers.
    pub fn stats(&self) -> &PacketStats {
        &self.stats
    }

    /// Flows open in every shard, as of their latest answers.
    pub fn active_flows(&self) -> usize {
        self.counts.iter().map(|c| c.1).sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::panic::AssertUnwindSafe;
    use std::time::{Duration, Instant};

    use mcptap_core::pipeline::Analysis;

    use super::*;
    use crate::progress::ReplayProgress;

    pub(crate) const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/http_sse_narrowing.pcap"
    );

    /// The fixture's packets: (time, link type, frame).
    pub(crate) fn fixture_packets() -> Vec<(i64, u32, Vec<u8>)> {
        let mut packets = Vec::new();
        crate::capture::read_captures(&[FIXTURE.to_string()], &mut |pkt| {
            packets.push((pkt.ts_nanos, pkt.linktype, pkt.data.to_vec()));
        })
        .expect("the fixture reads");
        packets
    }

    /// Runs `run` on a thread of its own with `inject` set there (a shard panics in the
    /// first round): what the panic said, if `run` ended with it within a minute.
    pub(crate) fn run_with_a_panic<T: 'static>(
        inject: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
        run: fn() -> T,
    ) -> Option<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            inject.with(|p| p.set(true));
            let ended = std::panic::catch_unwind(run);
            let said = ended
                .err()
                .and_then(|p| p.downcast_ref::<&str>().map(|s| s.to_string()));
            let _ = tx.send(said);
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("it ended instead of waiting for the shard for ever")
    }

    /// At the close: the replay ends with the shard's panic, whatever the threads were
    /// waiting for (the test below checks that it comes before the close too).
    #[test]
    fn a_panic_in_a_flow_shard_ends_a_split_replay_with_it_not_a_hang() {
        let said = run_with_a_panic(&PANIC_IN_NEXT_ROUND, || {
            crate::replay::replay_split(
                &[FIXTURE.to_string()],
                Limits::default(),
                Analysis::default(),
                2,
                &mut ReplayProgress::hidden(),
                None,
                &mut |_, _| {},
            )
        });
        assert_eq!(said.as_deref(), Some(INJECTED_PANIC));
    }

    /// At the close: the replay ends with the shard's panic, whatever the threads were
    /// waiting for (the test below checks that it comes before the close too).
    #[test]
    fn a_panic_in_a_flow_shard_ends_a_sharded_replay_with_it_not_a_hang() {
        let said = run_with_a_panic(&PANIC_IN_NEXT_ROUND, || {
            crate::sharded::replay_sharded(
                &[FIXTURE.to_string()],
                Limits::default(),
                Analysis::default(),
                (2, 2),
                &mut ReplayProgress::hidden(),
                &mut |_| {},
            )
        });
        assert_eq!(said.as_deref(), Some(INJECTED_PANIC));
    }

    /// A live worker's flow shards never reach their close while packets keep coming: the
    /// panic must surface while they do, or the worker would stall with nothing said.
    #[test]
    fn a_flow_shard_that_panics_stops_the_feeding_thread_while_packets_still_come() {
        let packets = fixture_packets();
        let limits = Limits::default();
        let usage: Arc<SharedUsage> = Arc::default();
        let (shards, _stages) =
            Pipeline::split_flows(limits, Analysis::default(), Arc::clone(&usage), 2, 1);
        let mut flows = FlowShards::spawn(shards, &limits, usage, "test-flows");
        PANIC_IN_NEXT_ROUND.with(|p| p.set(true));
        let deadline = Instant::now() + Duration::from_secs(30);
        let fed = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut offset = 0;
            while Instant::now() < deadline {
                for (ts, linktype, frame) in &packets {
                    if flows.packet(Timestamp(ts + offset), *linktype, frame) {
                        flows.merge_ready(false, &mut |steps, _| {
                            steps.take_staged(Vec::new());
                        });
                    }
                }
                offset += 1_000_000_000;
            }
        }));
        let panic = fed.expect_err("the shard's panic reached the feeding thread");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&INJECTED_PANIC));
    }
}
