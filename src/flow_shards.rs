//! The flow layer sharded by connection over threads (`docs/sharding.md`, step 3): the calling
//! thread reads the capture and runs the [`FlowDispatcher`] (packet numbers, the clock, the
//! sweeps); each flow shard (decoding, reassembly, HTTP, SSE, decompression) runs on a thread
//! of its own and takes the packets of its connections, a round at a time; the calling thread
//! merges each round's staged steps back into one pipeline's order ([`merge_rounds`]) and
//! hands them to the session layer, as the flow side of a split pipeline would.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};

use mcptap_core::flow_shard::{
    FlowDispatcher, FlowRound, MergedSteps, PacketAt, StagedSteps, merge_rounds,
};
use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::{Limits, PacketStats, Pipeline};
use mcptap_core::usage::SharedUsage;

use crate::capture::{self, CaptureError};
use crate::progress::ReplayProgress;
use crate::replay::ReplayReport;
use crate::sink::summary::TimeSpan;

/// Packets (or bytes of frames) the calling thread gives the shards per round, and rounds that
/// may wait for a shard. What waits is charged to the memory budget, and bounded here besides.
const ROUND_PACKETS: usize = 4096;
const ROUND_BYTES: usize = 2 << 20;
const QUEUE_ROUNDS: usize = 4;

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

/// A flow shard's thread: rounds in, staged rounds out (with the emptied batch, to be filled
/// again); its packet counts at the end.
fn run_shard(
    mut shard: Pipeline,
    batches: Receiver<FlowBatch>,
    done: Sender<(FlowRound, FlowBatch)>,
    spares: Receiver<FlowRound>,
    usage: Arc<SharedUsage>,
) -> PacketStats {
    let mut out = Vec::new();
    for mut batch in batches {
        let held = batch.frames.len();
        let spare = spares.try_recv().unwrap_or_default();
        let round = run_batch(&mut shard, &mut batch, &mut out, spare);
        usage.release_in_flight(held);
        if done.send((round, batch)).is_err() {
            break; // the calling thread is gone
        }
    }
    shard.stats().clone()
}

/// A flow shard as the calling thread sees it: on a thread, or (when none could be started)
/// run in place, which gives the same steps.
enum Shard<'scope> {
    Thread {
        batches: SyncSender<FlowBatch>,
        done: Receiver<(FlowRound, FlowBatch)>,
        spares: Sender<FlowRound>,
        thread: std::thread::ScopedJoinHandle<'scope, PacketStats>,
    },
    InPlace {
        shard: Box<Pipeline>,
        done: VecDeque<(FlowRound, FlowBatch)>,
        spares: Vec<FlowRound>,
        out: Vec<Output>,
    },
}

/// The calling thread's side: the dispatcher, the round being filled, and the rounds whose
/// shards have not all answered.
struct Rounds<'scope> {
    shards: Vec<Shard<'scope>>,
    dispatcher: FlowDispatcher,
    usage: Arc<SharedUsage>,
    filling: Vec<FlowBatch>,
    filled: (usize, usize),
    /// The dispatcher's own steps of each round sent, oldest first.
    sent: VecDeque<FlowRound>,
    /// Per shard: rounds it answered that are not merged yet.
    answered: Vec<VecDeque<FlowRound>>,
    spare_batches: Vec<FlowBatch>,
    merged: MergedSteps,
    /// A shard's thread is gone (it panicked): nothing more is sent; the join says why.
    broken: bool,
}

impl Rounds<'_> {
    fn packet(&mut self, ts: Timestamp, linktype: u32, frame: &[u8]) {
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
            for batch in &mut self.filling {
                batch.commands.push(Command::Sweep { seq: d.at.seq, now });
            }
        }
        self.filled.0 += 1;
        self.filled.1 += frame.len();
    }

    fn round_full(&self) -> bool {
        self.filled.0 >= ROUND_PACKETS || self.filled.1 >= ROUND_BYTES
    }

    /// Sends every shard its part of the round (empty or not: the rounds stay aligned).
    fn send_round(&mut self) {
        self.filled = (0, 0);
        let spare = FlowRound::default();
        self.sent.push_back(self.dispatcher.take_round(spare));
        for (i, shard) in self.shards.iter_mut().enumerate() {
            let fresh = self.spare_batches.pop().unwrap_or_default();
            let batch = std::mem::replace(&mut self.filling[i], fresh);
            let held = batch.frames.len();
            self.usage.hold_in_flight(held);
            match shard {
                Shard::Thread { batches, .. } => {
                    if self.broken || batches.send(batch).is_err() {
                        self.usage.release_in_flight(held);
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
                    self.usage.release_in_flight(held);
                    done.push_back((round, batch));
                }
            }
        }
    }

    /// Takes the shards' answers in; with `block`, waits for them until every round sent is
    /// merged.
    fn take_answers(&mut self, block: bool) {
        let want = self.sent.len();
        for (shard, answered) in self.shards.iter_mut().zip(&mut self.answered) {
            let mut answers = Vec::new();
            match shard {
                Shard::Thread { done, .. } => {
                    answers.extend(done.try_iter());
                    while block && answered.len() + answers.len() < want {
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
            for (round, batch) in answers {
                answered.push_back(round);
                self.spare_batches.push(batch);
            }
        }
    }

    /// Merges every round that all shards answered, and hands each to the session layer.
    fn merge_ready(&mut self, hand_over: &mut dyn FnMut(&mut dyn StagedSteps, bool)) {
        while !self.sent.is_empty() && self.answered.iter().all(|a| !a.is_empty()) {
            let mut rounds: Vec<FlowRound> = self
                .answered
                .iter_mut()
                .filter_map(VecDeque::pop_front)
                .collect();
            rounds.extend(self.sent.pop_front());
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
            hand_over(&mut self.merged, false);
        }
    }
}

/// [`crate::replay::read_staged`] with the flow layer sharded by connection: reads `paths`,
/// runs each packet through its connection's shard (see the module's doc) and calls
/// `hand_over(steps, false)` with each merged round, then `hand_over(steps, true)` once, after
/// the finish. As the whole pipeline, an input that cannot be read ends without the finish.
pub(crate) fn read_flow_sharded(
    paths: &[String],
    shards: Vec<Pipeline>,
    limits: &Limits,
    usage: Arc<SharedUsage>,
    progress: &mut ReplayProgress,
    hand_over: &mut dyn FnMut(&mut dyn StagedSteps, bool),
) -> Result<ReplayReport, CaptureError> {
    let count = shards.len().max(1);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(count);
        for (i, shard) in shards.into_iter().enumerate() {
            let (batch_tx, batch_rx) = sync_channel::<FlowBatch>(QUEUE_ROUNDS);
            let (done_tx, done_rx) = channel();
            let (spare_tx, spare_rx) = channel();
            // The pipeline comes back if its thread cannot start: it then runs in place.
            let slot = Arc::new(std::sync::Mutex::new(Some(shard)));
            let theirs = Arc::clone(&slot);
            let usage = Arc::clone(&usage);
            let spawned = std::thread::Builder::new()
                .name(format!("flows-{i}"))
                .spawn_scoped(scope, move || {
                    let shard = theirs.lock().ok().and_then(|mut s| s.take());
                    match shard {
                        Some(shard) => run_shard(shard, batch_rx, done_tx, spare_rx, usage),
                        None => PacketStats::default(),
                    }
                });
            let handle = match spawned {
                Ok(thread) => Shard::Thread {
                    batches: batch_tx,
                    done: done_rx,
                    spares: spare_tx,
                    thread,
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
        let shards = handles.len();
        let mut rounds = Rounds {
            shards: handles,
            dispatcher: FlowDispatcher::new(limits, shards, Arc::clone(&usage)),
            usage: Arc::clone(&usage),
            filling: (0..shards).map(|_| FlowBatch::default()).collect(),
            filled: (0, 0),
            sent: VecDeque::new(),
            answered: (0..shards).map(|_| VecDeque::new()).collect(),
            spare_batches: Vec::new(),
            merged: MergedSteps::new(Arc::clone(&usage)),
            broken: false,
        };
        let mut span = TimeSpan::default();
        let read = capture::read_captures(paths, &mut |pkt| {
            span.see(Timestamp(pkt.ts_nanos));
            progress.packet(pkt.data.len());
            rounds.packet(Timestamp(pkt.ts_nanos), pkt.linktype, pkt.data);
            if rounds.round_full() {
                // At most the queue's rounds wait: a shard that falls behind makes this wait.
                rounds.send_round();
                rounds.take_answers(false);
                rounds.merge_ready(hand_over);
            }
        });
        if read.is_ok() {
            let now = rounds.dispatcher.finish();
            for batch in &mut rounds.filling {
                batch.commands.push(Command::Finish { now });
            }
        }
        rounds.send_round();
        let mut stats = PacketStats::default();
        let mut threads = Vec::new();
        for shard in rounds.shards.iter_mut() {
            if let Shard::Thread { batches, .. } = shard {
                // Closed: the thread ends once it has answered every round.
                let (closed, _) = sync_channel(0);
                drop(std::mem::replace(batches, closed));
            }
        }
        rounds.take_answers(true);
        rounds.merge_ready(hand_over);
        hand_over(&mut rounds.merged, true);
        for shard in rounds.shards {
            match shard {
                Shard::Thread { thread, .. } => threads.push(thread),
                Shard::InPlace { shard, .. } => stats.merge(shard.stats()),
            }
        }
        for thread in threads {
            match thread.join() {
                Ok(s) => stats.merge(&s),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        read.map(|read| ReplayReport { read, stats, span })
    })
}
