//! The session layer sharded by client over threads (`docs/sharding.md`): the calling thread
//! reads the capture, runs the flow layer, routes each staged input ([`ShardRouter`]) and
//! writes the outputs in one worker's order; each shard runs on a thread of its own. The
//! shards' server-scoped entries are shared through [`ThreadScope`], which orders every access
//! by input position: one worker's order.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use mcptap_core::detect::ModeTracker;
use mcptap_core::flow_shard::StagedSteps;
use mcptap_core::mcp::session::{Session, SessionKey};
use mcptap_core::mcp::{GroupKey, ServerScope};
use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::{Analysis, Limits, SessionInput, SessionStage, Staged};
use mcptap_core::shard::{BroadcastPart, Route, ShardRouter, broadcast_order};

use crate::capture::CaptureError;
use crate::progress::ReplayProgress;
use crate::replay::{ReplayReport, read_flows, split_layers};

/// A shard's promise once it is gone: it accesses nothing any more.
const GONE: u64 = u64::MAX;

/// What the shards share: how far each has come, and the server-scoped entries.
#[derive(Debug)]
struct Progress {
    /// Per shard: no server-scoped access of its own before this input position.
    promises: Vec<AtomicU64>,
    /// Shards waiting for the others' promises (promises are told of only when there are).
    waiting: AtomicUsize,
    entries: Mutex<Entries>,
    moved: Condvar,
}

#[derive(Debug, Default)]
struct Entries {
    latest: HashMap<SessionKey, (u64, Box<Session<ModeTracker>>)>,
    written: u64,
}

impl Progress {
    fn new(shards: usize) -> Progress {
        Progress {
            promises: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            waiting: AtomicUsize::new(0),
            entries: Mutex::new(Entries::default()),
            moved: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // A shard that panicked holding it left the entries whole (each change is one insert).
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shard `me` is at input position `at`.
    fn promise(&self, me: usize, at: u64) {
        self.promises[me].store(at, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            // Under the lock: a waiter checks and sleeps under it, so this cannot fall between.
            let _held = self.lock();
            self.moved.notify_all();
        }
    }

    /// Waits until every shard but `me` has promised no access before `at`; returns the
    /// entries, locked.
    fn wait_for_others(&self, me: usize, at: u64) -> MutexGuard<'_, Entries> {
        let passed = |p: &Progress| {
            p.promises
                .iter()
                .enumerate()
                .all(|(i, promise)| i == me || promise.load(Ordering::SeqCst) >= at)
        };
        let mut entries = self.lock();
        if passed(self) {
            return entries;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while !passed(self) {
            // Timed, so that a missed wake-up costs a millisecond, not the run.
            entries = match self.moved.wait_timeout(entries, Duration::from_millis(1)) {
                Ok((e, _)) => e,
                Err(e) => e.into_inner().0,
            };
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        entries
    }
}

/// One shard's view of the shared server-scoped entries.
#[derive(Debug)]
struct ThreadScope {
    progress: Arc<Progress>,
    me: usize,
}

impl ServerScope<ModeTracker> for ThreadScope {
    fn newer(&mut self, key: &SessionKey, have: u64) -> Option<(u64, Box<Session<ModeTracker>>)> {
        let at = self.progress.promises[self.me].load(Ordering::SeqCst);
        let entries = self.progress.wait_for_others(self.me, at);
        let (version, entry) = entries.latest.get(key)?;
        (*version > have).then(|| (*version, entry.server_replica()))
    }

    fn publish(&mut self, key: &SessionKey, entry: Box<Session<ModeTracker>>) -> u64 {
        // Every write follows a read at the same position (`newer`), which waited already.
        let mut entries = self.progress.lock();
        entries.written += 1;
        let version = entries.written;
        entries.latest.insert(key.clone(), (version, entry));
        version
    }

    fn swept(&mut self, now: Timestamp, idle_ns: i64) {
        // Entries idle at a sweep have ended for every shard (each reads them as ended), once
        // every shard has passed it: so the entries stay within what the tables hold. The
        // first shard forgets them for all.
        if self.me != 0 {
            return;
        }
        let at = self.progress.promises[self.me].load(Ordering::SeqCst);
        let mut entries = self.progress.wait_for_others(self.me, at);
        entries
            .latest
            .retain(|_, (_, e)| now.0.saturating_sub(e.last_seen.0) <= idle_ns);
    }
}

/// What the flow thread hands a shard: its inputs of one round with their positions, and the
/// position the round ends at.
struct ShardBatch {
    inputs: Vec<(u64, SessionInput)>,
    end: u64,
}

/// A shard's outputs of one round: where each input's end, and the marks of its broadcast
/// inputs' units.
#[derive(Default)]
struct ShardDone {
    outputs: Vec<Output>,
    ends: Vec<usize>,
    marks: Vec<(usize, GroupKey)>,
}

/// One step of a round, in input order.
enum Step {
    Output(Output),
    Input(Route),
}

/// Runs shard `me`: its batches in order, each input at its position.
fn run_shard(
    mut stage: SessionStage,
    me: usize,
    progress: Arc<Progress>,
    batches: Receiver<ShardBatch>,
    done: Sender<(usize, ShardDone)>,
) {
    // Whatever ends this thread, the other shards no longer wait for it.
    struct Gone(Arc<Progress>, usize);
    impl Drop for Gone {
        fn drop(&mut self) {
            self.0.promise(self.1, GONE);
        }
    }
    let _gone = Gone(Arc::clone(&progress), me);
    for batch in batches {
        let mut round = ShardDone {
            outputs: Vec::with_capacity(batch.inputs.len()),
            ends: Vec::with_capacity(batch.inputs.len()),
            marks: Vec::new(),
        };
        for (at, input) in batch.inputs {
            progress.promise(me, at);
            stage.process(Staged::Input(input), &mut round.outputs);
            stage.take_group_marks(&mut round.marks);
            round.ends.push(round.outputs.len());
        }
        progress.promise(me, batch.end);
        stage.publish_usage();
        if done.send((me, round)).is_err() {
            return; // the flow thread is gone
        }
    }
}

/// A shard's rounds as they come back, read input by input.
#[derive(Default)]
struct ShardResults {
    rounds: VecDeque<ShardDone>,
    /// In the front round: the next input's index and where its outputs start.
    input: usize,
    start: usize,
    mark: usize,
}

impl ShardResults {
    /// The front round's next input: its outputs' range and marks.
    fn next_input(&mut self) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let Some(round) = self.rounds.front() else {
            return (0..0, 0..0);
        };
        let end = round.ends.get(self.input).copied().unwrap_or(self.start);
        let marks_end = self.mark + round.marks[self.mark..].partition_point(|(at, _)| *at < end);
        let outputs = self.start..end;
        let marks = self.mark..marks_end;
        self.input += 1;
        self.start = end;
        self.mark = marks_end;
        (outputs, marks)
    }

    fn next_round(&mut self) {
        self.rounds.pop_front();
        self.input = 0;
        self.start = 0;
        self.mark = 0;
    }
}

/// Writes one round in input order: the flow layer's outputs in their places, each input's
/// outputs from the shard that took it, a broadcast input's merged into one worker's order.
fn deliver_round(
    steps: Vec<Step>,
    results: &mut [ShardResults],
    on_output: &mut dyn FnMut(&Output),
) {
    for step in steps {
        match step {
            Step::Output(o) => on_output(&o),
            Step::Input(Route::One(shard)) => {
                let (outputs, _) = results[shard].next_input();
                if let Some(round) = results[shard].rounds.front() {
                    round.outputs[outputs].iter().for_each(&mut *on_output);
                }
            }
            Step::Input(Route::EveryOnce) => {
                for (i, r) in results.iter_mut().enumerate() {
                    let (outputs, _) = r.next_input();
                    if i == 0
                        && let Some(round) = r.rounds.front()
                    {
                        round.outputs[outputs].iter().for_each(&mut *on_output);
                    }
                }
            }
            Step::Input(Route::Every) => {
                let ranges: Vec<_> = results.iter_mut().map(|r| r.next_input()).collect();
                let parts: Vec<BroadcastPart> = results
                    .iter()
                    .zip(&ranges)
                    .map(|(r, (outputs, marks))| BroadcastPart {
                        outputs: outputs.clone(),
                        marks: r
                            .rounds
                            .front()
                            .map_or(&[][..], |round| &round.marks[marks.clone()]),
                    })
                    .collect();
                for (shard, range) in broadcast_order(&parts) {
                    if let Some(round) = results[shard].rounds.front() {
                        round.outputs[range].iter().for_each(&mut *on_output);
                    }
                }
            }
        }
    }
    for r in results.iter_mut() {
        r.next_round();
    }
}

/// Staged steps per round, and rounds that may wait per shard (as [`crate::replay`]'s split).
const ROUND_STEPS: usize = 1024;
const ROUND_BYTES: usize = 1 << 20;
const QUEUE_ROUNDS: usize = 8;

/// The flow thread's side of a sharded replay: routes staged inputs to the shards, round by
/// round, and keeps each round's steps until its shards' outputs are in.
struct Dispatch {
    router: ShardRouter,
    to_shards: Vec<SyncSender<ShardBatch>>,
    /// Input position of the latest routed input.
    position: u64,
    waiting_rounds: VecDeque<Vec<Step>>,
    shards_gone: bool,
}

impl Dispatch {
    /// Hands the staged steps to the shards as one round.
    fn send_round(&mut self, flows: &mut dyn StagedSteps) {
        let shards = self.to_shards.len();
        let staged = flows.take_staged(Vec::new());
        let mut steps = Vec::with_capacity(staged.len());
        let mut batches: Vec<Vec<(u64, SessionInput)>> = vec![Vec::new(); shards];
        let mut routed = Vec::new();
        for step in staged {
            let input = match step {
                Staged::Output(o) => {
                    steps.push(Step::Output(o));
                    continue;
                }
                Staged::Input(input) => input,
            };
            let route = self.router.route(&input, &mut routed);
            steps.extend(routed.drain(..).map(Step::Output));
            self.position += 1;
            let at = self.position;
            match route {
                Route::One(shard) => batches[shard].push((at, input)),
                Route::Every | Route::EveryOnce => {
                    for batch in &mut batches[..shards - 1] {
                        batch.push((at, flows.stage_copy(&input)));
                    }
                    batches[shards - 1].push((at, input));
                }
            }
            steps.push(Step::Input(route));
        }
        let end = self.position + 1;
        for (tx, inputs) in self.to_shards.iter().zip(batches) {
            self.shards_gone |= tx.send(ShardBatch { inputs, end }).is_err();
        }
        self.waiting_rounds.push_back(steps);
    }

    /// Closes the shards' inputs (they end once they have answered every round); the rounds
    /// still waiting for their answers.
    fn close(self) -> VecDeque<Vec<Step>> {
        self.waiting_rounds
    }
}

/// [`crate::replay::replay_split`] with the session layer in `shards` shards by client, each
/// on a thread of its own. The outputs are one pipeline's, in the same order, unless a limit
/// is reached (each shard's tables are bounded on their own; routes are bounded too:
/// `limit="shard_routes"`).
pub fn replay_sharded(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    (flow_threads, shards): (usize, usize),
    progress: &mut ReplayProgress,
    on_output: &mut dyn FnMut(&Output),
) -> Result<ReplayReport, CaptureError> {
    let shards = shards.max(1);
    let whole = analysis.clone();
    let router = ShardRouter::new(shards, &limits, analysis.identities.clone());
    let (flows, stages) = split_layers(limits, analysis, flow_threads, shards);
    let shared = Arc::new(Progress::new(shards));
    let done = std::thread::scope(|scope| {
        let (done_tx, done_rx) = channel::<(usize, ShardDone)>();
        let mut to_shards: Vec<SyncSender<ShardBatch>> = Vec::new();
        let mut threads = Vec::new();
        for (me, mut stage) in stages.into_iter().enumerate() {
            stage.share_server_scope(Box::new(ThreadScope {
                progress: Arc::clone(&shared),
                me,
            }));
            let (tx, rx) = sync_channel::<ShardBatch>(QUEUE_ROUNDS);
            let done_tx = done_tx.clone();
            let shared = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name(format!("sessions-{me}"))
                .spawn_scoped(scope, move || run_shard(stage, me, shared, rx, done_tx));
            // Nothing of the input is read yet: the split pipeline can take it (below).
            let Ok(thread) = thread else {
                return None;
            };
            to_shards.push(tx);
            threads.push(thread);
        }
        drop(done_tx);
        let mut results: Vec<ShardResults> = (0..shards).map(|_| ShardResults::default()).collect();
        let mut dispatch = Dispatch {
            router,
            to_shards,
            position: 0,
            waiting_rounds: VecDeque::new(),
            shards_gone: false,
        };
        // Writes every round whose shards have all answered.
        let mut deliver_ready = |results: &mut Vec<ShardResults>,
                                 waiting_rounds: &mut VecDeque<Vec<Step>>,
                                 block: bool| {
            loop {
                while results.iter().all(|r| !r.rounds.is_empty()) {
                    let Some(steps) = waiting_rounds.pop_front() else {
                        return;
                    };
                    deliver_round(steps, results, on_output);
                }
                if waiting_rounds.is_empty() {
                    return;
                }
                let next = if block {
                    done_rx.recv().ok()
                } else {
                    done_rx.try_recv().ok()
                };
                let Some((shard, d)) = next else { return };
                results[shard].rounds.push_back(d);
            }
        };
        let report = read_flows(
            paths,
            flows,
            progress,
            (ROUND_STEPS, ROUND_BYTES),
            &mut |flows, last| {
                if last || !dispatch.shards_gone {
                    dispatch.send_round(flows);
                }
                if !last {
                    deliver_ready(&mut results, &mut dispatch.waiting_rounds, false);
                }
            },
        );
        let mut waiting_rounds = dispatch.close();
        deliver_ready(&mut results, &mut waiting_rounds, true);
        for t in threads {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Some(report)
    });
    match done {
        Some(result) => result,
        None => crate::replay::replay_split(
            paths,
            limits,
            whole,
            flow_threads,
            progress,
            None,
            &mut |o, _| on_output(o),
        ),
    }
}
