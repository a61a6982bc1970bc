//! The flow layer sharded by connection over threads (`docs/sharding.md`, step 3): the calling
//! thread runs the [`FlowDispatcher`] (packet numbers, the clock, the sweeps); each flow shard
//! (decoding, reassembly, HTTP, SSE, decompression) runs on a thread of its own and takes the
//! packets of its connections, a round at a time; the calling thread merges each round's
//! staged steps back into one pipeline's order ([`merge_rounds`]) and hands them to the session
//! layer, as the flow side of a split pipeline would. [`FlowShards`] is pushed packets: a
//! replay's (`crate::replay`), or a live worker's batches (`crate::daemon`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::thread::JoinHandle;

use mcptap_core::flow_shard::{
    FlowDispatcher, FlowRound, MergedSteps, PacketAt, StagedSteps, merge_rounds,
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
/// 200 times their size, and it waits, charged to the budget, until the whole round is merged
/// (an attacker's pass: pipelined gzip bodies of 3.8 MiB, 512 KiB rounds and four queued took
/// 414 MB and evicted flows one thread keeps; with these, 217 MB and no eviction at the default
/// budget). Bulk traffic pays for it in hand-overs (the mixed quick capture 53 ms against 42 ms
/// with one flow thread).
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

/// One shard's work of one round: its packets' frames, one after another, and what to do.
#[derive(Default)]
struct FlowBatch {
    frames: Vec<u8>,
    commands: Vec<Command>,
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
}

/// Runs one round's commands through a shard; its staged steps come back as one round.
fn run_batch(
    shard: &mut Pipeline,
    batch: &mut FlowBatch,
    out: &mut Vec<Output>,
    spare: FlowRound,
) -> FlowRound {
    let mut start = 0;
    for command in batch.commands.drain(..) {
        match command {
            Command::Packet { at, linktype, end } => {
                let frame = batch.frames.get(start..end).unwrap_or_default();
                shard.shard_packet(at, linktype, frame, out);
                start = end;
            }
            Command::Sweep { seq, now } => shard.shard_sweep(seq, now, out),
            Command::Finish { now } => shard.shard_finish(now, out),
        }
    }
    // Every unit was marked; anything left follows them.
    shard.stage_outputs(out);
    batch.frames.clear();
    shard.take_flow_round(spare)
}

/// What a shard hands back for one round: its staged steps, the emptied batch (to be filled
/// again), and its counts after the round.
struct Answer {
    round: FlowRound,
    batch: FlowBatch,
    stats: PacketStats,
    flows: usize,
}

/// A flow shard's thread: rounds in, answers out, until the rounds stop coming.
fn run_shard(
    mut shard: Pipeline,
    batches: Receiver<FlowBatch>,
    done: Sender<Answer>,
    spares: Receiver<FlowRound>,
) {
    let mut out = Vec::new();
    for mut batch in batches {
        let spare = spares.try_recv().unwrap_or_default();
        let round = run_batch(&mut shard, &mut batch, &mut out, spare);
        let answer = Answer {
            round,
            batch,
            stats: shard.stats().clone(),
            flows: shard.active_flows(),
        };
        if done.send(answer).is_err() {
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
    /// Per round sent, oldest first: the dispatcher's own steps and the latest packet time.
    sent: VecDeque<(FlowRound, Option<i64>)>,
    /// Per shard: rounds it answered that are not merged yet.
    answered: Vec<VecDeque<FlowRound>>,
    spare_batches: Vec<FlowBatch>,
    merged: MergedSteps,
    /// Per shard, its latest counts (packets, open flows), and the packets' sum.
    counts: Vec<(PacketStats, usize)>,
    stats: PacketStats,
    /// A shard's thread is gone (it panicked): nothing more is sent; the join says why.
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
            answered: (0..n).map(|_| VecDeque::new()).collect(),
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
        let dispatcher_round = self.dispatcher.take_round(FlowRound::default());
        if self.filling.iter().all(|b| b.commands.is_empty()) && dispatcher_round.is_empty() {
            return;
        }
        self.filled = (0, 0);
        self.sent
            .push_back((dispatcher_round, self.filling_up_to.take()));
        for (i, shard) in self.shards.iter_mut().enumerate() {
            let fresh = self.spare_batches.pop().unwrap_or_default();
            let batch = std::mem::replace(&mut self.filling[i], fresh);
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
                    let mut batch = batch;
                    let spare = spares.pop().unwrap_or_default();
                    let round = run_batch(shard, &mut batch, out, spare);
                    done.push_back(Answer {
                        round,
                        batch,
                        stats: shard.stats().clone(),
                        flows: shard.active_flows(),
                    });
                }
            }
        }
    }

    /// Takes the shards' answers in (`wait`: until every round sent is answered), and hands
    /// each round that every shard answered to `hand_over`, merged, with the latest packet
    /// time it covers.
    pub fn merge_ready(
        &mut self,
        wait: bool,
        hand_over: &mut dyn FnMut(&mut dyn StagedSteps, Option<i64>),
    ) {
        self.take_answers(wait);
        while !self.sent.is_empty() && self.answered.iter().all(|a| !a.is_empty()) {
            let mut rounds: Vec<FlowRound> = self
                .answered
                .iter_mut()
                .filter_map(VecDeque::pop_front)
                .collect();
            let (own, up_to) = self.sent.pop_front().unwrap_or_default();
            rounds.push(own);
            merge_rounds(&mut rounds, &mut self.merged.steps);
            // The shards' emptied rounds go back to them to be filled again.
            for (shard, round) in self.shards.iter_mut().zip(rounds) {
                match shard {
                    Shard::Thread { spares, .. } => {
                        let _ = spares.send(round);
                    }
                    Shard::InPlace { spares, .. } => spares.push(round),
                }
            }
            hand_over(&mut self.merged, up_to);
        }
    }

    fn take_answers(&mut self, wait: bool) {
        let want = self.sent.len();
        let mut changed = false;
        for (i, (shard, answered)) in self.shards.iter_mut().zip(&mut self.answered).enumerate() {
            let mut answers = Vec::new();
            match shard {
                Shard::Thread { done, .. } => {
                    answers.extend(done.try_iter());
                    while wait && answered.len() + answers.len() < want {
                        match done.recv() {
                            Ok(answer) => answers.push(answer),
                            Err(_) => {
                                // Gone: the join reports why.
                                self.broken = true;
                                break;
                            }
                        }
                    }
                }
                Shard::InPlace { done, .. } => answers.extend(done.drain(..)),
            }
            for answer in answers {
                answered.push_back(answer.round);
                self.spare_batches.push(answer.batch);
                if let Some(c) = self.counts.get_mut(i) {
                    *c = (answer.stats, answer.flows);
                }
                changed = true;
            }
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
