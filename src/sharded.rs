//! The session layer sharded by client over threads (`docs/sharding.md`): the calling thread
//! reads the capture, runs the flow layer, routes each staged input ([`ShardRouter`]) and
//! writes the outputs in one worker's order; each shard runs on a thread of its own. The
//! shards' server-scoped entries are shared through [`ThreadScope`], which orders every access
//! by input position: one worker's order.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use mcptap_core::detect::ModeTracker;
use mcptap_core::flow_shard::StagedSteps;
use mcptap_core::mcp::session::{Scope, Session, SessionKey, scope_of_key};
use mcptap_core::mcp::snapshot::{ImportReport, SessionEntry};
use mcptap_core::mcp::{GroupKey, ServerScope};
use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::{Analysis, Limits, SessionInput, SessionStage, Staged};
use mcptap_core::shard::{BroadcastPart, Route, ShardRouter, broadcast_order, merge_exports};

use crate::capture::CaptureError;
use crate::progress::ReplayProgress;
use crate::replay::{ReplayReport, read_flows, split_layers};
use crate::state::Snapshot;

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
        entries.latest.retain(|_, (_, e)| {
            // Seen after the clock (a stamp it refused): seen now, as each shard's own table
            // takes it (`SessionTable::idle`).
            e.last_seen = e.last_seen.min(now);
            now.0.saturating_sub(e.last_seen.0) <= idle_ns
        });
    }
}

/// What the flow thread hands a shard: its inputs of one round with their positions, and the
/// position the round ends at.
struct ShardBatch {
    inputs: Vec<(u64, SessionInput)>,
    end: u64,
}

/// What a shard is given to do, in order.
enum ShardJob {
    Round(ShardBatch),
    /// Its lasting state, once every round before is done.
    Export(SyncSender<Snapshot>),
    /// Loads its own share of a snapshot and what every shard loads (of which only shard 0
    /// reports what it did and its outputs: the others load the same); shard 0 alone loads
    /// the server-scoped entries, and hands them out to the others through the scope.
    Import {
        own: Box<Snapshot>,
        every: Box<Snapshot>,
        now: Timestamp,
        reply: SyncSender<(ImportReport, Vec<Output>)>,
    },
    /// Tests: the shard's thread panics here, as a bug in the session layer would make it.
    #[cfg(test)]
    Panic,
}

#[cfg(test)]
thread_local! {
    /// Tests: the next round this thread sends makes its first shard panic first.
    pub(crate) static PANIC_IN_NEXT_ROUND: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

#[cfg(test)]
pub(crate) const INJECTED_PANIC: &str = "injected: a bug in a session shard";

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

/// Runs shard `me`: its jobs in order, each input at its position. The stage comes back at
/// the end (a final snapshot).
fn run_shard(
    mut stage: SessionStage,
    me: usize,
    progress: Arc<Progress>,
    jobs: Receiver<ShardJob>,
    done: Sender<(usize, ShardDone)>,
) -> SessionStage {
    // Whatever ends this thread, the other shards no longer wait for it.
    struct Gone(Arc<Progress>, usize);
    impl Drop for Gone {
        fn drop(&mut self) {
            self.0.promise(self.1, GONE);
        }
    }
    let _gone = Gone(Arc::clone(&progress), me);
    for job in jobs {
        let batch = match job {
            ShardJob::Round(batch) => batch,
            #[cfg(test)]
            ShardJob::Panic => std::panic::panic_any(INJECTED_PANIC),
            ShardJob::Export(reply) => {
                let _ = reply.send(stage.export_state());
                continue;
            }
            ShardJob::Import {
                own,
                every,
                now,
                reply,
            } => {
                let mut out = Vec::new();
                let mut report = stage.import_state(*own, now, &mut out);
                let mut replicas = Vec::new();
                let copied = stage.import_state(*every, now, &mut replicas);
                if me == 0 {
                    stage.publish_server_entries();
                    out.append(&mut replicas);
                    report = add_reports(report, copied);
                }
                let _ = reply.send((report, out));
                continue;
            }
        };
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
            break; // the flow thread is gone
        }
    }
    stage
}

fn add_reports(a: ImportReport, b: ImportReport) -> ImportReport {
    ImportReport {
        sessions: a.sessions + b.sessions,
        ended: a.ended + b.ended,
        expired: a.expired + b.expired,
        refused: a.refused + b.refused,
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

/// A round sent to the shards: its steps, kept until the shards' outputs are in, and the latest
/// packet time it covers.
struct SentRound {
    steps: Vec<Step>,
    up_to: Option<i64>,
}

/// The session layer sharded by client, each shard on a thread of its own: the calling thread
/// routes each round of staged steps to the shards ([`SessionShards::send_round`]) and takes
/// the outputs back in one worker's order ([`SessionShards::deliver_ready`]).
pub struct SessionShards {
    router: ShardRouter,
    /// `None` once closed: the shards end once they have answered every round.
    to_shards: Option<Vec<SyncSender<ShardJob>>>,
    /// Input position of the latest routed input.
    position: u64,
    waiting_rounds: VecDeque<SentRound>,
    results: Vec<ShardResults>,
    done: Receiver<(usize, ShardDone)>,
    threads: Vec<JoinHandle<SessionStage>>,
    /// The shards' stages once their threads ended (for a final snapshot).
    closed: Vec<SessionStage>,
    /// A shard's thread is gone (it panicked): the join at the close says why.
    shards_gone: bool,
    /// The shards' progress and the server-scoped entries they handed out.
    progress: Arc<Progress>,
}

impl SessionShards {
    /// Starts a thread per stage (named `{name}-{i}`), the stages sharing their
    /// server-scoped entries. Fails (with every thread started stopped again) when a thread
    /// cannot start.
    pub fn spawn(
        stages: Vec<SessionStage>,
        router: ShardRouter,
        name: &str,
    ) -> std::io::Result<SessionShards> {
        let shared = Arc::new(Progress::new(stages.len()));
        let (done_tx, done_rx) = channel::<(usize, ShardDone)>();
        let mut to_shards: Vec<SyncSender<ShardJob>> = Vec::new();
        let mut threads = Vec::new();
        let shards = stages.len();
        for (me, mut stage) in stages.into_iter().enumerate() {
            stage.share_server_scope(Box::new(ThreadScope {
                progress: Arc::clone(&shared),
                me,
            }));
            let (tx, rx) = sync_channel::<ShardJob>(QUEUE_ROUNDS);
            let done_tx = done_tx.clone();
            let shared = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{me}"))
                .spawn(move || run_shard(stage, me, shared, rx, done_tx))?;
            to_shards.push(tx);
            threads.push(thread);
        }
        Ok(SessionShards {
            router,
            to_shards: Some(to_shards),
            position: 0,
            waiting_rounds: VecDeque::new(),
            results: (0..shards).map(|_| ShardResults::default()).collect(),
            done: done_rx,
            threads,
            closed: Vec::new(),
            shards_gone: false,
            progress: shared,
        })
    }

    /// Hands the steps staged so far (of packets up to `up_to`) to the shards as one round.
    pub fn send_round(&mut self, flows: &mut dyn StagedSteps, up_to: Option<i64>) {
        let Some(to_shards) = &self.to_shards else {
            return;
        };
        if self.shards_gone {
            return;
        }
        let shards = to_shards.len();
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
        #[cfg(test)]
        if PANIC_IN_NEXT_ROUND.with(|p| p.replace(false))
            && let Some(tx) = to_shards.first()
        {
            self.shards_gone |= tx.send(ShardJob::Panic).is_err();
        }
        for (tx, inputs) in to_shards.iter().zip(batches) {
            self.shards_gone |= tx
                .send(ShardJob::Round(ShardBatch { inputs, end }))
                .is_err();
        }
        self.waiting_rounds.push_back(SentRound { steps, up_to });
        if self.shards_gone {
            // A shard's thread is gone (it panicked): its panic goes on here at once, rather
            // than the rounds waiting for it, and every output after them, with nothing said
            // until a quiet moment or the close.
            self.join();
            panic!("a session shard's thread ended before its input did");
        }
    }

    /// Writes every round whose shards have all answered (`wait`: every round sent), in one
    /// worker's order; returns the latest packet time written.
    pub fn deliver_ready(&mut self, wait: bool, on_output: &mut dyn FnMut(&Output)) -> Option<i64> {
        let mut up_to = None;
        loop {
            while self.results.iter().all(|r| !r.rounds.is_empty()) {
                let Some(round) = self.waiting_rounds.pop_front() else {
                    return up_to;
                };
                deliver_round(round.steps, &mut self.results, on_output);
                up_to = round.up_to.or(up_to);
            }
            if self.waiting_rounds.is_empty() {
                return up_to;
            }
            let next = if wait {
                self.wait_for_answer()
            } else {
                self.done.try_recv().ok()
            };
            let Some((shard, d)) = next else {
                return up_to;
            };
            if let Some(r) = self.results.get_mut(shard) {
                r.rounds.push_back(d);
            }
        }
    }

    /// The next answer of a shard. A shard whose thread ended before the close panicked: the
    /// panic goes on here rather than the wait lasting for ever (the other shards, waiting for
    /// input, would never end it).
    fn wait_for_answer(&mut self) -> Option<(usize, ShardDone)> {
        loop {
            match self.done.recv_timeout(Duration::from_millis(100)) {
                Ok(answer) => return Some(answer),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    if self.to_shards.is_some() && self.threads.iter().any(|t| t.is_finished()) {
                        self.to_shards = None;
                        self.shards_gone = true;
                        self.join();
                        return None;
                    }
                }
            }
        }
    }

    /// No more rounds: writes every one sent and joins the threads (a panic in one goes on
    /// here).
    pub fn close(&mut self, on_output: &mut dyn FnMut(&Output)) {
        self.to_shards = None;
        self.deliver_ready(true, on_output);
        self.join();
    }

    /// Joins the threads, keeping their stages (a panic in one goes on here). Their job
    /// queues close first, or a live shard would wait for jobs for ever.
    fn join(&mut self) {
        self.to_shards = None;
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(stage) => self.closed.push(stage),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }

    /// The lasting state of every shard as one worker's ([`merge_exports`]), once every round
    /// sent so far is done (each shard takes its jobs in order).
    pub fn export_state(&mut self) -> Snapshot {
        let parts = match &self.to_shards {
            Some(to_shards) if !self.shards_gone => {
                let mut replies = Vec::new();
                for tx in to_shards {
                    let (reply, answer) = sync_channel(1);
                    self.shards_gone |= tx.send(ShardJob::Export(reply)).is_err();
                    replies.push(answer);
                }
                let parts: Vec<Snapshot> = replies.iter().filter_map(|r| r.recv().ok()).collect();
                if parts.len() == replies.len() {
                    parts
                } else {
                    // A shard is gone (it panicked): the join says why.
                    self.to_shards = None;
                    self.shards_gone = true;
                    self.join();
                    return Snapshot::default();
                }
            }
            _ => {
                // Closed, or a shard is gone (it panicked: the join says why).
                self.join();
                self.closed.iter().map(SessionStage::export_state).collect()
            }
        };
        let published = self
            .progress
            .lock()
            .latest
            .iter()
            .map(|(key, (_, entry))| SessionEntry::of(key, entry))
            .collect();
        merge_exports(parts, published)
    }

    /// Loads a snapshot at time `now`: each record into the shard its requests go to
    /// ([`ShardRouter::split_snapshot`]). Call it before the first round.
    pub fn import_state(
        &mut self,
        snap: Snapshot,
        now: Timestamp,
        outputs: &mut Vec<Output>,
    ) -> ImportReport {
        let Some(to_shards) = &self.to_shards else {
            return ImportReport::default();
        };
        let shares = self.router.split_snapshot(snap, now, outputs);
        // Server-scoped entries go to shard 0, which hands them out: a copy in every shard
        // would be charged to the budget once per shard.
        let mut first = shares.every;
        let mut others = Snapshot {
            ended: first.ended.clone(),
            ..Snapshot::default()
        };
        others.sessions = first
            .sessions
            .iter()
            .filter(|e| scope_of_key(&e.key) == Scope::Lineage)
            .cloned()
            .collect();
        let mut replies = Vec::new();
        for (i, (tx, own)) in to_shards.iter().zip(shares.own).enumerate() {
            let (reply, answer) = sync_channel(1);
            let every = if i == 0 {
                std::mem::take(&mut first)
            } else {
                others.clone()
            };
            let job = ShardJob::Import {
                own: Box::new(own),
                every: Box::new(every),
                now,
                reply,
            };
            self.shards_gone |= tx.send(job).is_err();
            replies.push(answer);
        }
        let mut report = ImportReport::default();
        for answer in replies {
            if let Ok((r, mut out)) = answer.recv() {
                report = add_reports(report, r);
                outputs.append(&mut out);
            }
        }
        report
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
    // Nothing of the input is read yet: if the threads cannot start, the split pipeline
    // takes it.
    let Ok(mut sessions) = SessionShards::spawn(stages, router, "sessions") else {
        return crate::replay::replay_split(
            paths,
            limits,
            whole,
            flow_threads,
            progress,
            None,
            &mut |o, _| on_output(o),
        );
    };
    run_shards(paths, flows, &mut sessions, progress, on_output)
}

/// Reads `paths` through `flows` into `sessions` and closes them.
fn run_shards(
    paths: &[String],
    flows: crate::flow_shards::FlowLayer,
    sessions: &mut SessionShards,
    progress: &mut ReplayProgress,
    on_output: &mut dyn FnMut(&Output),
) -> Result<ReplayReport, CaptureError> {
    let report = read_flows(
        paths,
        flows,
        progress,
        (ROUND_STEPS, ROUND_BYTES),
        &mut |flows, last| {
            sessions.send_round(flows, None);
            if !last {
                sessions.deliver_ready(false, on_output);
            }
        },
    );
    sessions.close(on_output);
    report
}

/// What loading a snapshot did, and its outputs.
pub type Loaded = (ImportReport, Vec<Output>);

/// [`replay_sharded`] as `run` with a snapshot file sees its input: `initial` loaded at its
/// time before the first packet (what the load did, and its outputs, are returned with the
/// snapshot of the end). Fails only when the shards' threads cannot start.
pub fn replay_sharded_from(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    (flow_threads, shards): (usize, usize),
    initial: Option<(Snapshot, Timestamp)>,
    on_output: &mut dyn FnMut(&Output),
) -> std::io::Result<(Result<ReplayReport, CaptureError>, Loaded, Snapshot)> {
    let shards = shards.max(1);
    let router = ShardRouter::new(shards, &limits, analysis.identities.clone());
    let (flows, stages) = split_layers(limits, analysis, flow_threads, shards);
    let mut sessions = SessionShards::spawn(stages, router, "sessions")?;
    let mut loaded = (ImportReport::default(), Vec::new());
    if let Some((snap, now)) = initial {
        loaded.0 = sessions.import_state(snap, now, &mut loaded.1);
    }
    let report = run_shards(
        paths,
        flows,
        &mut sessions,
        &mut ReplayProgress::hidden(),
        on_output,
    );
    Ok((report, loaded, sessions.export_state()))
}

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;
    use std::time::{Duration, Instant};

    use mcptap_core::pipeline::{Analysis, Pipeline};
    use mcptap_core::usage::SharedUsage;

    use super::*;
    use crate::flow_shards::tests::{FIXTURE, fixture_packets, run_with_a_panic};
    use crate::progress::ReplayProgress;

    /// At the close: the replay ends with the shard's panic, whatever the threads were
    /// waiting for (the test below checks that it comes before the close too).
    #[test]
    fn a_panic_in_a_session_shard_ends_a_sharded_replay_with_it_not_a_hang() {
        let said = run_with_a_panic(&PANIC_IN_NEXT_ROUND, || {
            replay_sharded(
                &[FIXTURE.to_string()],
                Limits::default(),
                Analysis::default(),
                (0, 2),
                &mut ReplayProgress::hidden(),
                &mut |_| {},
            )
        });
        assert_eq!(said.as_deref(), Some(INJECTED_PANIC));
    }

    /// A live worker's session shards are not waited for while packets keep coming: the
    /// panic must surface as rounds are sent, or the worker would stall with nothing said.
    #[test]
    fn a_session_shard_that_panics_stops_the_sending_thread_while_rounds_still_go() {
        let packets = fixture_packets();
        let limits = Limits::default();
        let usage: Arc<SharedUsage> = Arc::default();
        let (mut flows, stages) =
            Pipeline::split_flows(limits, Analysis::default(), Arc::clone(&usage), 1, 2);
        let mut flow = flows.pop().expect("one flow pipeline");
        let router = ShardRouter::new(2, &limits, Default::default());
        let mut sessions = SessionShards::spawn(stages, router, "test-sessions").expect("threads");
        PANIC_IN_NEXT_ROUND.with(|p| p.set(true));
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        let fed = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut offset = 0;
            while Instant::now() < deadline {
                for (ts, linktype, frame) in &packets {
                    flow.handle_packet(Timestamp(ts + offset), *linktype, frame, &mut out);
                    flow.stage_outputs(&mut out);
                    sessions.send_round(&mut flow, Some(ts + offset));
                    sessions.deliver_ready(false, &mut |_| {});
                }
                offset += 1_000_000_000;
            }
        }));
        let panic = fed.expect_err("the shard's panic reached the sending thread");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&INJECTED_PANIC));
    }
}
