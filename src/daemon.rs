//! `mcptap run`: live capture threads → one pipeline thread → events, logs and metrics, with
//! the metrics endpoint and signal handling on a small tokio runtime.

use crate::capture::{self, ReadSummary};
use crate::config::{CaptureConfig, Config};
use crate::fleet::{FleetCounts, FleetStore};
use crate::flow_shards::FlowShards;
use crate::live::worker_of_server;
use crate::live::{
    self, Batch, CaptureHealth, DirectoryStats, Dispatcher, ServerDirectory, WorkerInbox,
    WorkerQueue,
};
use crate::redact::Redactor;
use crate::server::{self, ServerState};
use crate::sharded::SessionShards;
use crate::sink::log;
use crate::sink::metrics::{LabelConfig, Metrics};
use crate::sink::ndjson::{EventFile, NdjsonWriter};
use crate::sink::summary::{Summary, TimeSpan};
use crate::state::{self, Snapshot, SnapshotSlots};
use mcptap_core::flow_shard::StagedSteps;
use mcptap_core::http::Spent;
use mcptap_core::mcp::identity::Identities;
use mcptap_core::mcp::snapshot::ImportReport;
use mcptap_core::model::Output;
use mcptap_core::model::Timestamp;
use mcptap_core::pipeline::Analysis;
use mcptap_core::pipeline::{Limits, PacketStats, Pipeline, SessionStage, Staged};
use mcptap_core::shard::ShardRouter;
use mcptap_core::usage::SharedUsage;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where product events go.
struct EventSinks {
    file: Option<EventFile>,
    stdout: Option<NdjsonWriter<std::io::Stdout>>,
    dirty: bool,
    /// Every worker's outputs counted (they are written here, under the same lock).
    totals: Summary,
    /// Each worker's packet counters as of its last batch.
    worker_packets: Vec<PacketStats>,
    span: TimeSpan,
    /// Packets the kernel or the interfaces dropped (live capture).
    capture_drops: Option<u64>,
    /// Events the file refused lately (a full disk), logged once per such spell.
    losing: Option<u64>,
    /// Events lost to the file's write errors, not yet added to the metric.
    lost: u64,
}

impl EventSinks {
    fn new(file: Option<EventFile>, stdout: Option<NdjsonWriter<std::io::Stdout>>) -> Self {
        EventSinks {
            file,
            stdout,
            dirty: false,
            totals: Summary::default(),
            worker_packets: Vec::new(),
            span: TimeSpan::default(),
            capture_drops: None,
            losing: None,
            lost: 0,
        }
    }

    fn write(&mut self, output: &Output) {
        self.totals.observe(output);
        let Output::Event(ev) = output else { return };
        self.write_line(ev);
    }

    fn write_line<T: serde::Serialize + ?Sized>(&mut self, line: &T) {
        if let Some(f) = self.file.as_mut() {
            let written = f.write_value(line);
            self.note_file(written);
        }
        if let Some(w) = self.stdout.as_mut() {
            let _ = w.write_value(line);
        }
        self.dirty = true;
    }

    /// After a write or flush of the events file: the events it lost are counted, and a spell
    /// of errors is logged when it starts and when it ends, not per event.
    fn note_file(&mut self, result: std::io::Result<()>) {
        let Some(f) = self.file.as_mut() else { return };
        let lost = f.take_lost();
        self.lost += lost;
        match (result, self.losing.as_mut()) {
            (Err(e), None) => {
                tracing::error!(
                    path = %f.path().display(),
                    "events file refuses writes ({e}): events are lost until it takes them again, counted in mcptap_events_lost_total"
                );
                self.losing = Some(lost);
            }
            (Err(_), Some(n)) => *n += lost,
            (Ok(()), Some(n)) => {
                tracing::warn!(
                    path = %f.path().display(),
                    lost = *n,
                    "events file takes writes again"
                );
                self.losing = None;
            }
            (Ok(()), None) => {}
        }
    }

    /// Events lost since the last call, for the metric.
    fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost)
    }

    fn packets(&self) -> PacketStats {
        let mut all = PacketStats::default();
        for p in &self.worker_packets {
            all.merge(p);
        }
        all
    }

    /// Writes the totals so far as a `summary` or `stats` event, and flushes.
    fn write_totals(&mut self, event: &'static str) {
        let packets = self.packets();
        let totals = std::mem::take(&mut self.totals);
        self.write_line(&totals.totals_event(event, &packets, self.span, self.capture_drops));
        self.totals = totals;
        self.flush();
    }

    fn flush(&mut self) {
        if !self.dirty {
            return;
        }
        if let Some(f) = self.file.as_mut() {
            let flushed = f.flush();
            self.note_file(flushed);
        }
        if let Some(w) = self.stdout.as_mut() {
            let _ = w.flush();
        }
        self.dirty = false;
    }
}

fn wall_clock() -> Timestamp {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    Timestamp(ns)
}

/// A worker's pipeline: whole on its thread, or split (the session layer on a thread of its
/// own behind, see [`SessionThread`]; this thread does capture batches, the flow layer and the
/// sinks), so that one busy upstream still uses two cores, each about equally busy.
#[allow(clippy::large_enum_variant)] // one per worker
enum Stages {
    Whole(Pipeline),
    Split {
        flows: Pipeline,
        sessions: SessionThread,
    },
    /// The flow layer sharded by connection over threads of its own too (this thread
    /// dispatches and merges), so that one busy upstream uses more than two cores.
    FlowSharded {
        flows: FlowShards,
        sessions: SessionThread,
    },
    /// The session layer sharded by client over threads of its own (this thread routes and
    /// merges), the flow layer here or sharded by connection.
    Sharded {
        flows: FlowSide,
        sessions: SessionShards,
    },
}

/// The flow layer in front of session shards.
#[allow(clippy::large_enum_variant)] // one per worker
enum FlowSide {
    Here(Pipeline),
    Sharded(FlowShards),
}

impl FlowSide {
    fn stats(&self) -> &PacketStats {
        match self {
            FlowSide::Here(p) => p.stats(),
            FlowSide::Sharded(f) => f.stats(),
        }
    }

    fn active_flows(&self) -> usize {
        match self {
            FlowSide::Here(p) => p.active_flows(),
            FlowSide::Sharded(f) => f.active_flows(),
        }
    }

    /// What the flow layer has staged, to the session shards (`wait`: every round of sharded
    /// flows; those here are staged already).
    fn hand_over(&mut self, sessions: &mut SessionShards, wait: bool, up_to: Option<i64>) {
        match self {
            FlowSide::Here(p) => sessions.send_round(p, up_to),
            FlowSide::Sharded(f) => {
                f.send_round();
                f.merge_ready(wait, &mut |steps, up_to| sessions.send_round(steps, up_to));
            }
        }
    }
}

/// Outputs of session shards as they come, in one worker's order; the latest packet time
/// they are of.
fn deliver_sharded(
    sessions: &mut SessionShards,
    wait: bool,
    outputs: &mut Vec<Output>,
) -> Option<i64> {
    sessions.deliver_ready(wait, &mut |o| outputs.push(o.clone()))
}

impl Stages {
    fn stats(&self) -> &PacketStats {
        match self {
            Stages::Whole(p) | Stages::Split { flows: p, .. } => p.stats(),
            Stages::FlowSharded { flows, .. } => flows.stats(),
            Stages::Sharded { flows, .. } => flows.stats(),
        }
    }

    fn active_flows(&self) -> usize {
        match self {
            Stages::Whole(p) | Stages::Split { flows: p, .. } => p.active_flows(),
            Stages::FlowSharded { flows, .. } => flows.active_flows(),
            Stages::Sharded { flows, .. } => flows.active_flows(),
        }
    }

    /// The session layer's lasting state (a split worker waits for its session thread to
    /// reach everything handed over so far).
    fn export_state(&mut self) -> Snapshot {
        match self {
            Stages::Whole(p) => p.export_state(),
            Stages::Split { sessions, .. } | Stages::FlowSharded { sessions, .. } => {
                sessions.export_state()
            }
            Stages::Sharded { sessions, .. } => sessions.export_state(),
        }
    }

    fn import_state(
        &mut self,
        snap: Snapshot,
        now: Timestamp,
        outputs: &mut Vec<Output>,
    ) -> ImportReport {
        match self {
            Stages::Whole(p) => p.import_state(snap, now, outputs),
            Stages::Split { sessions, .. } | Stages::FlowSharded { sessions, .. } => {
                sessions.import_state(snap, now, outputs)
            }
            Stages::Sharded { sessions, .. } => sessions.import_state(snap, now, outputs),
        }
    }

    /// One capture batch's packets. Returns the latest packet time whose outputs are now in
    /// `outputs` (a split worker's come back from its session thread a little later).
    fn packets(&mut self, batch: &Batch, outputs: &mut Vec<Output>) -> Option<i64> {
        let last = batch.iter().last().map(|(ts, _)| ts);
        match self {
            Stages::Whole(p) => {
                for (ts, frame) in batch.iter() {
                    p.handle_packet(Timestamp(ts), batch.linktype, frame, outputs);
                }
                // Exactly, once a batch: between, the figure may lag (see `publish_usage`).
                p.publish_usage();
                last
            }
            Stages::Split { flows, sessions } => {
                for (ts, frame) in batch.iter() {
                    flows.handle_packet(Timestamp(ts), batch.linktype, frame, outputs);
                    flows.stage_outputs(outputs);
                }
                sessions.hand_over(flows, last, outputs)
            }
            Stages::FlowSharded { flows, sessions } => {
                for (ts, frame) in batch.iter() {
                    flows.packet(Timestamp(ts), batch.linktype, frame);
                }
                // The batch's round goes now, whatever its size: its events are not held
                // back until more packets come.
                flows.send_round();
                Stages::hand_over_merged(flows, sessions, false, outputs)
            }
            Stages::Sharded { flows, sessions } => {
                match flows {
                    FlowSide::Here(p) => {
                        for (ts, frame) in batch.iter() {
                            p.handle_packet(Timestamp(ts), batch.linktype, frame, outputs);
                            p.stage_outputs(outputs);
                        }
                    }
                    FlowSide::Sharded(f) => {
                        for (ts, frame) in batch.iter() {
                            f.packet(Timestamp(ts), batch.linktype, frame);
                        }
                    }
                }
                flows.hand_over(sessions, false, last);
                deliver_sharded(sessions, false, outputs)
            }
        }
    }

    /// Flow shards' merged rounds (`wait`: all of them) to the session thread; returns the
    /// latest packet time of the outputs collected.
    fn hand_over_merged(
        flows: &mut FlowShards,
        sessions: &mut SessionThread,
        wait: bool,
        outputs: &mut Vec<Output>,
    ) -> Option<i64> {
        let mut up_to = None;
        flows.merge_ready(wait, &mut |steps, last| {
            up_to = sessions.hand_over(steps, last, outputs).or(up_to);
        });
        sessions.collect(wait, outputs).or(up_to)
    }

    /// Written outputs: a split worker's go back to its session thread, which made most of
    /// them, to be freed there; `outputs` is left empty.
    fn spent(&mut self, outputs: &mut Vec<Output>) {
        match self {
            Stages::Split { sessions, .. } | Stages::FlowSharded { sessions, .. }
                if sessions.jobs.is_some() =>
            {
                // If the thread is gone, the send fails and the vector is dropped here.
                let _ = sessions.spent.send(std::mem::take(outputs));
            }
            _ => outputs.clear(),
        }
    }

    /// Time passes on a quiet link: idle flows and sessions expire.
    fn advance_time(&mut self, now: Timestamp, outputs: &mut Vec<Output>) {
        match self {
            Stages::Whole(p) => p.advance_time(now, outputs),
            Stages::Split { flows, sessions } => {
                flows.advance_time(now, outputs);
                flows.stage_outputs(outputs);
                sessions.hand_over(flows, None, outputs);
            }
            Stages::FlowSharded { flows, sessions } => {
                flows.advance_time(now);
                flows.send_round();
                Stages::hand_over_merged(flows, sessions, false, outputs);
            }
            Stages::Sharded { flows, sessions } => {
                match flows {
                    FlowSide::Here(p) => {
                        p.advance_time(now, outputs);
                        p.stage_outputs(outputs);
                    }
                    FlowSide::Sharded(f) => f.advance_time(now),
                }
                flows.hand_over(sessions, false, None);
                deliver_sharded(sessions, false, outputs);
            }
        }
    }

    /// The session thread's outputs so far (`wait`: all of those handed over, e.g. before a
    /// quiet wait for packets); returns the latest packet time they are of.
    fn collect(&mut self, wait: bool, outputs: &mut Vec<Output>) -> Option<i64> {
        match self {
            Stages::Whole(_) => None,
            Stages::Split { sessions, .. } => sessions.collect(wait, outputs),
            Stages::FlowSharded { flows, sessions } => {
                Stages::hand_over_merged(flows, sessions, wait, outputs)
            }
            Stages::Sharded { flows, sessions } => {
                if let FlowSide::Sharded(f) = flows {
                    f.merge_ready(wait, &mut |steps, up_to| sessions.send_round(steps, up_to));
                }
                deliver_sharded(sessions, wait, outputs)
            }
        }
    }

    /// The end of the input: everything concluded, and every output collected.
    fn finish(&mut self, outputs: &mut Vec<Output>) {
        match self {
            Stages::Whole(p) => p.finish(outputs),
            Stages::Split { flows, sessions } => {
                flows.finish(outputs);
                flows.stage_outputs(outputs);
                sessions.hand_over(flows, None, outputs);
                sessions.close(outputs);
            }
            Stages::FlowSharded { flows, sessions } => {
                flows.finish(&mut |steps, last| {
                    sessions.hand_over(steps, last, outputs);
                });
                sessions.close(outputs);
            }
            Stages::Sharded { flows, sessions } => {
                match flows {
                    FlowSide::Here(p) => {
                        p.finish(outputs);
                        p.stage_outputs(outputs);
                        sessions.send_round(p, None);
                    }
                    FlowSide::Sharded(f) => {
                        f.finish(&mut |steps, up_to| sessions.send_round(steps, up_to));
                    }
                }
                sessions.close(&mut |o| outputs.push(o.clone()));
            }
        }
    }
}

/// What a split worker asks of its session thread, in order.
enum SessionJob {
    /// The staged steps of packets up to the time given (if any).
    Steps(Vec<Staged>, Option<i64>),
    Import(Box<Snapshot>, Timestamp, SyncSender<ImportReport>),
    Export(SyncSender<Snapshot>),
}

/// What a session thread hands back for a job: its outputs, the capture time they go up to,
/// and the bodies and heads it is done with (to be freed on the worker's thread).
type SessionReturn = (Vec<Output>, Option<i64>, Spent);

/// A split worker's session layer on a thread of its own: it takes the staged steps of each
/// capture batch and hands back their outputs.
struct SessionThread {
    jobs: Option<SyncSender<SessionJob>>,
    /// Unbounded, so that neither thread can wait for the other forever; what waits in it is
    /// bounded all the same: outputs come only of the jobs queued (at most
    /// [`SPLIT_QUEUE_BATCHES`]), and the worker collects them after every batch.
    /// With the bodies and heads the session layer is done with, when it keeps them: freed on
    /// the worker's thread, which allocated them (see `SessionStage::keep_spent`).
    outputs: Receiver<SessionReturn>,
    /// The emptied [`Spent`] lists go back to keep the next job's (their room stays, and
    /// they are freed on the session thread, which allocated them); one per job at most.
    spare_spent: Sender<Spent>,
    /// Outputs the worker has written go back to be dropped on the thread that made them
    /// (mimalloc frees fastest there) when it takes its next job; the vectors are refilled.
    /// What waits here is one batch's outputs at most, when the link goes quiet.
    spent: Sender<Vec<Output>>,
    /// Jobs handed over whose outputs have not come back yet.
    outstanding: usize,
    thread: Option<JoinHandle<SessionStage>>,
    /// The session layer back from its thread once the input ended (for the final snapshot).
    closed: Option<SessionStage>,
}

impl SessionThread {
    fn spawn(mut sessions: SessionStage, name: String) -> std::io::Result<SessionThread> {
        let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel::<SessionJob>(SPLIT_QUEUE_BATCHES);
        let (out_tx, out_rx) = std::sync::mpsc::channel::<SessionReturn>();
        let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<Output>>();
        let (spare_spent_tx, spare_spent_rx) = std::sync::mpsc::channel::<Spent>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            for job in jobs_rx {
                // All that came back is dropped here; one vector is kept to fill.
                let mut out = Vec::new();
                while let Ok(mut spent) = spent_rx.try_recv() {
                    spent.clear();
                    if spent.capacity() > out.capacity() {
                        out = spent;
                    }
                }
                let mut up_to = None;
                match job {
                    SessionJob::Steps(steps, last) => {
                        up_to = last;
                        for step in steps {
                            sessions.process(step, &mut out);
                        }
                        sessions.publish_usage();
                    }
                    SessionJob::Import(snap, now, reply) => {
                        let _ = reply.send(sessions.import_state(*snap, now, &mut out));
                    }
                    SessionJob::Export(reply) => {
                        // Answered on its own channel: no outputs.
                        let _ = reply.send(sessions.export_state());
                        continue;
                    }
                }
                let spare = spare_spent_rx.try_recv().unwrap_or_default();
                let spent = sessions.swap_spent(spare);
                if out_tx.send((out, up_to, spent)).is_err() {
                    break; // the worker is gone
                }
            }
            sessions
        })?;
        Ok(SessionThread {
            jobs: Some(jobs_tx),
            outputs: out_rx,
            spent: spent_tx,
            spare_spent: spare_spent_tx,
            outstanding: 0,
            thread: Some(thread),
            closed: None,
        })
    }

    fn send(&mut self, job: SessionJob) -> bool {
        let Some(jobs) = &self.jobs else {
            return false;
        };
        if jobs.send(job).is_err() {
            self.join();
            return false;
        }
        self.outstanding += 1;
        true
    }

    /// No more jobs: joins the thread and keeps its session layer (for the final snapshot).
    /// Called early when the thread is gone while jobs were still to come: it panicked, and
    /// the worker fails with it, as when the session layer ran on the worker's own thread (no
    /// snapshot goes out without this worker's sessions, no decoded batch goes unwritten).
    fn join(&mut self) {
        self.jobs = None;
        self.outstanding = 0;
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(sessions) => self.closed = Some(sessions),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }

    /// Hands the steps staged so far (of packets up to `last`) over (`outputs` must be staged
    /// already), and collects what has come back.
    fn hand_over(
        &mut self,
        flows: &mut dyn StagedSteps,
        last: Option<i64>,
        outputs: &mut Vec<Output>,
    ) -> Option<i64> {
        let steps = flows.take_staged(Vec::new());
        // A batch that staged nothing goes too: its packets' lag is measured as a whole
        // worker's would be.
        if !steps.is_empty() || last.is_some() {
            self.send(SessionJob::Steps(steps, last));
        }
        self.collect(false, outputs)
    }

    /// Outputs back from the thread (`wait`: all that are due); returns the latest packet time
    /// they are of.
    fn collect(&mut self, wait: bool, outputs: &mut Vec<Output>) -> Option<i64> {
        let mut up_to = None;
        while self.outstanding > 0 {
            let got = if wait {
                self.outputs.recv().map_err(|_| TryRecvError::Disconnected)
            } else {
                self.outputs.try_recv()
            };
            let (mut batch, last, mut spent) = match got {
                Ok(got) => got,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.join();
                    break;
                }
            };
            self.outstanding -= 1;
            spent.clear();
            let _ = self.spare_spent.send(spent);
            if outputs.is_empty() {
                std::mem::swap(outputs, &mut batch);
            } else {
                outputs.append(&mut batch);
            }
            up_to = last.or(up_to);
        }
        up_to
    }

    fn import_state(
        &mut self,
        snap: Snapshot,
        now: Timestamp,
        outputs: &mut Vec<Output>,
    ) -> ImportReport {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.send(SessionJob::Import(Box::new(snap), now, tx));
        self.collect(true, outputs);
        rx.recv().unwrap_or_default()
    }

    fn export_state(&mut self) -> Snapshot {
        if self.closed.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            // Not counted: its answer comes on its own channel.
            let sent = self
                .jobs
                .as_ref()
                .is_some_and(|j| j.send(SessionJob::Export(tx)).is_ok());
            match rx.recv().ok().filter(|_| sent) {
                Some(snap) => return snap,
                None => self.join(),
            }
        }
        self.closed
            .as_ref()
            .map(SessionStage::export_state)
            .unwrap_or_default()
    }

    /// No more jobs: waits for every output and for the thread.
    fn close(&mut self, outputs: &mut Vec<Output>) {
        self.jobs = None;
        for (mut batch, _, _) in self.outputs.iter() {
            outputs.append(&mut batch);
        }
        self.join();
    }
}

/// One pipeline thread: everything downstream of capture for its shard of the traffic.
struct Worker {
    /// Batches waiting in this worker's queue (the capture side counts them in).
    queue_depth: prometheus::IntGauge,
    /// What every pipeline of the process holds.
    usage: Arc<SharedUsage>,
    stages: Stages,
    sinks: Arc<Mutex<EventSinks>>,
    metrics: Arc<Metrics>,
    reopen: Arc<AtomicBool>,
    /// What this worker last reported to the shared counters.
    reported: PacketStats,
    reported_flows: usize,
    /// Live capture: time passes on a quiet link (idle flows and sessions expire by the wall
    /// clock). A replay's time is its packets' alone.
    wall_clock_when_idle: bool,
    /// This worker's index, and where it leaves its part of periodic snapshots.
    index: usize,
    snapshots: Option<Arc<SnapshotSlots>>,
    answered_snapshot: u64,
    /// Fleet mode: this worker's connection to the shared store.
    fleet: Option<FleetStore>,
    reported_fleet: FleetCounts,
    redactor: Option<Redactor>,
}

impl Worker {
    fn drain(&mut self, outputs: &mut Vec<Output>) {
        if outputs.is_empty() {
            return;
        }
        if let Some(r) = &self.redactor {
            r.outputs(outputs);
        }
        if let Some(store) = self.fleet.as_mut()
            && let Stages::Whole(pipeline) = &mut self.stages
        {
            // Lookups are answered now (bounded by the lookup timeout), so the sessions they
            // hold go on within this batch. (Fleet mode runs whole pipelines.)
            let mut plain = Vec::with_capacity(outputs.len());
            crate::fleet::serve(store, outputs, pipeline, &mut |o| plain.push(o.clone()));
            *outputs = plain;
            let (now, before) = (store.counts, self.reported_fleet);
            self.metrics.add_fleet(&now, &before, store.is_up());
            self.reported_fleet = now;
        }
        let mut sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
        for o in outputs.iter() {
            self.metrics.observe(o);
            log::log_output(o);
            sinks.write(o);
        }
        drop(sinks);
        self.stages.spent(outputs);
    }

    fn report(&mut self) {
        let stats = self.stages.stats();
        let flows = self.stages.active_flows();
        let delta = flows as i64 - self.reported_flows as i64;
        self.metrics.add_packet_stats(stats, &self.reported, delta);
        self.metrics.set_memory(&self.usage);
        self.reported = stats.clone();
        self.reported_flows = flows;
    }

    fn run(mut self, inbox: WorkerInbox, initial: Option<Snapshot>) -> WorkerEnd {
        let mut outputs = Vec::new();
        if let Some(snap) = initial {
            let report = self.stages.import_state(snap, wall_clock(), &mut outputs);
            tracing::info!(
                worker = self.index,
                sessions = report.sessions,
                ended_sessions = report.ended,
                expired = report.expired,
                refused = report.refused,
                "session state loaded from the snapshot"
            );
            self.drain(&mut outputs);
        }
        // The session thread's latest outputs are waited for before a long quiet wait, so
        // that an alert never lies in a queue while the link is quiet.
        let mut handed_over = false;
        loop {
            let wait = if handed_over {
                Duration::from_millis(5)
            } else {
                Duration::from_millis(250)
            };
            match inbox.recv_timeout(wait) {
                Ok(batch) => {
                    self.queue_depth.dec();
                    let done_up_to = self.stages.packets(&batch, &mut outputs);
                    handed_over = !matches!(self.stages, Stages::Whole(_));
                    self.drain(&mut outputs);
                    if let (Some((first, _)), Some((last, _))) =
                        (batch.iter().next(), batch.iter().last())
                    {
                        let mut sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
                        sinks.span.see(Timestamp(first));
                        sinks.span.see(Timestamp(last));
                    }
                    inbox.recycle(batch);
                    self.observe_lag(done_up_to);
                }
                Err(RecvTimeoutError::Timeout) if handed_over => {
                    let done_up_to = self.stages.collect(true, &mut outputs);
                    handed_over = false;
                    self.drain(&mut outputs);
                    self.observe_lag(done_up_to);
                }
                Err(RecvTimeoutError::Timeout) if self.wall_clock_when_idle => {
                    // No traffic: let time pass so idle flows and sessions still expire.
                    self.stages.advance_time(wall_clock(), &mut outputs);
                    self.stages.collect(true, &mut outputs);
                    self.drain(&mut outputs);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.report();
            let mut sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
            self.share_packet_stats(&mut sinks);
            if self.reopen.swap(false, Ordering::SeqCst)
                && let Some(f) = sinks.file.as_mut()
            {
                match f.reopen() {
                    Ok(()) => tracing::info!("events file reopened"),
                    Err(e) => tracing::error!("reopening events file: {e}"),
                }
            }
            // Flushed after every batch: an alert reaches the file within the batch latency.
            sinks.flush();
            self.metrics.add_events_lost(sinks.take_lost());
            drop(sinks);
            crate::sink::log_writer::flush();
            if let Some(slots) = &self.snapshots
                && let Some(generation) = slots.pending(self.answered_snapshot)
            {
                slots.answer(self.index, generation, self.stages.export_state());
                self.answered_snapshot = generation;
            }
        }
        self.stages.finish(&mut outputs);
        self.drain(&mut outputs);
        let mut sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
        self.share_packet_stats(&mut sinks);
        sinks.flush();
        self.metrics.add_events_lost(sinks.take_lost());
        drop(sinks);
        self.report();
        let state = self.snapshots.is_some().then(|| self.stages.export_state());
        (self.stages.stats().clone(), state)
    }

    /// Live: how long a packet took from the wire to its events (the latest one whose outputs
    /// were just written).
    fn observe_lag(&self, done_up_to: Option<i64>) {
        if self.wall_clock_when_idle
            && let Some(ts) = done_up_to
        {
            let lag_ns = wall_clock().0.saturating_sub(ts).max(0);
            self.metrics.observe_pipeline_lag(lag_ns as f64 / 1e9);
        }
    }

    fn share_packet_stats(&self, sinks: &mut EventSinks) {
        if sinks.worker_packets.len() <= self.index {
            sinks
                .worker_packets
                .resize(self.index + 1, PacketStats::default());
        }
        if let Some(slot) = sinks.worker_packets.get_mut(self.index) {
            slot.clone_from(self.stages.stats());
        }
    }
}

/// What every pipeline worker of a process shares.
struct WorkerPool {
    limits: Limits,
    analysis: Analysis,
    sinks: Arc<Mutex<EventSinks>>,
    metrics: Arc<Metrics>,
    reopen: Arc<AtomicBool>,
    wall_clock_when_idle: bool,
    /// Batches queued per worker. Live capture absorbs bursts here; a replay reads as fast as
    /// the workers go, so a short queue only bounds what waits in it (outside the budget).
    queue_batches: usize,
    /// Periodic snapshots (with a snapshot file), and each worker's share of the loaded one.
    snapshots: Option<Arc<SnapshotSlots>>,
    initial: Mutex<Vec<Option<Snapshot>>>,
    /// Fleet mode: the store every worker connects to.
    fleet: Option<crate::fleet::FleetSettings>,
    redactor: Option<Redactor>,
    /// Each worker's flow layer on a thread of its own (not with fleet mode).
    split: bool,
    /// With `split`: each worker's flow layer sharded by connection over this many threads
    /// (0: on the worker's own thread).
    flow_threads: usize,
    /// With `split`: each worker's session layer sharded by client over this many threads
    /// (1: one session thread).
    session_threads: usize,
}

/// Jobs that may wait for a split worker's session thread.
const SPLIT_QUEUE_BATCHES: usize = 4;

/// What a worker hands back: its counters and (with a snapshot file) its state.
type WorkerEnd = (PacketStats, Option<Snapshot>);
type WorkerHandle = JoinHandle<WorkerEnd>;

impl WorkerPool {
    /// Starts `n` workers. Their limits are process-wide totals: every pipeline counts what it
    /// holds in one [`SharedUsage`].
    fn spawn(&self, n: usize) -> Result<(Vec<WorkerQueue>, Vec<WorkerHandle>), String> {
        let usage = Arc::new(SharedUsage::default());
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for i in 0..n {
            let (depth, waited_packets) = self.metrics.worker_queue(i);
            let (queue, inbox) =
                live::worker_queue(self.queue_batches, depth.clone(), waited_packets);
            senders.push(queue);
            // Split stages unless fleet mode (its store answers go to a whole pipeline).
            let split = self.split && self.fleet.is_none();
            let stages = if split && self.session_threads > 1 {
                let (mut shards, stages) = Pipeline::split_flows(
                    self.limits,
                    self.analysis.clone(),
                    usage.clone(),
                    self.flow_threads.max(1),
                    self.session_threads,
                );
                let router = ShardRouter::new(
                    self.session_threads,
                    &self.limits,
                    self.analysis.identities.clone(),
                );
                let sessions = SessionShards::spawn(stages, router, &format!("sessions-{i}"))
                    .map_err(|e| format!("cannot start session thread: {e}"))?;
                let flows = match (self.flow_threads, shards.pop()) {
                    (0, Some(flows)) => FlowSide::Here(flows),
                    (_, last) => {
                        shards.extend(last);
                        FlowSide::Sharded(FlowShards::spawn(
                            shards,
                            &self.limits,
                            usage.clone(),
                            &format!("flows-{i}"),
                        ))
                    }
                };
                Stages::Sharded { flows, sessions }
            } else if split && self.flow_threads > 0 {
                let (shards, mut stages) = Pipeline::split_flows(
                    self.limits,
                    self.analysis.clone(),
                    usage.clone(),
                    self.flow_threads,
                    1,
                );
                let sessions = stages
                    .pop()
                    .ok_or_else(|| "no session layer".to_string())
                    .and_then(|s| {
                        SessionThread::spawn(s, format!("sessions-{i}"))
                            .map_err(|e| format!("cannot start session thread: {e}"))
                    })?;
                let flows =
                    FlowShards::spawn(shards, &self.limits, usage.clone(), &format!("flows-{i}"));
                Stages::FlowSharded { flows, sessions }
            } else if split {
                let (flows, mut sessions) =
                    Pipeline::split(self.limits, self.analysis.clone(), usage.clone());
                // The flow layer runs on this worker's thread: the bodies and heads it allocated
                // come back to be freed here (not so with flow shards, whose threads allocate
                // them).
                sessions.keep_spent();
                let sessions = SessionThread::spawn(sessions, format!("sessions-{i}"))
                    .map_err(|e| format!("cannot start session thread: {e}"))?;
                Stages::Split { flows, sessions }
            } else {
                Stages::Whole(Pipeline::configured(
                    self.limits,
                    self.analysis.clone(),
                    usage.clone(),
                ))
            };
            let worker = Worker {
                queue_depth: depth,
                usage: usage.clone(),
                stages,
                sinks: self.sinks.clone(),
                metrics: self.metrics.clone(),
                reopen: self.reopen.clone(),
                reported: PacketStats::default(),
                reported_flows: 0,
                wall_clock_when_idle: self.wall_clock_when_idle,
                index: i,
                snapshots: self.snapshots.clone(),
                answered_snapshot: 0,
                fleet: match &self.fleet {
                    Some(settings) => {
                        let mut store =
                            FleetStore::open(settings, true).map_err(|e| format!("fleet: {e}"))?;
                        store.redactor = self.redactor.clone();
                        Some(store)
                    }
                    None => None,
                },
                reported_fleet: FleetCounts::default(),
                redactor: self.redactor.clone(),
            };
            let mut worker = worker;
            if worker.fleet.is_some()
                && let Stages::Whole(pipeline) = &mut worker.stages
            {
                pipeline.enable_fleet();
            }
            let initial = self
                .initial
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(i)
                .and_then(Option::take);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("pipeline-{i}"))
                    .spawn(move || worker.run(inbox, initial))
                    .map_err(|e| format!("cannot start pipeline thread: {e}"))?,
            );
        }
        Ok((senders, handles))
    }
}

/// Waits for every worker; then writes the `summary` event (the totals of all of them, and
/// the capture bytes the reader skipped).
fn join_workers(
    workers: Vec<WorkerHandle>,
    sinks: &Mutex<EventSinks>,
    capture_bytes_skipped: u64,
) -> Result<(Summary, PacketStats, Option<Snapshot>), String> {
    let mut stats = PacketStats::default();
    let mut state: Option<Snapshot> = None;
    for w in workers {
        let (p, part) = w
            .join()
            .map_err(|_| "pipeline thread panicked".to_string())?;
        stats.merge(&p);
        if let Some(part) = part {
            state.get_or_insert_with(Snapshot::default).merge(part);
        }
    }
    let mut sinks = sinks.lock().unwrap_or_else(|p| p.into_inner());
    sinks.totals.capture_bytes_skipped = capture_bytes_skipped;
    sinks.write_totals("summary");
    Ok((sinks.totals.clone(), stats, state))
}

/// How each worker runs: whole on its thread, split (the session layer on a thread of its
/// own), with its flow layer sharded over `flow_threads` threads more and its session layer
/// over `session_threads` (with `split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLayout {
    pub split: bool,
    pub flow_threads: usize,
    /// With `split`: the session layer sharded by client over this many threads (1: one).
    pub session_threads: usize,
}

/// What [`replay_through_workers`] read and what its workers saw.
pub struct WorkerReplay {
    pub read: ReadSummary,
    pub summary: Summary,
    pub stats: PacketStats,
}

/// Replays capture files through the daemon's worker path: packets sharded by server
/// endpoint over `threads` pipeline workers with process-wide limits, exactly as `run` does
/// with live traffic (the same [`Dispatcher`], knowing the configured `servers`); events (in
/// no fixed order across workers) to `events` or standard output. For testing the live path's
/// sharding and limits on a capture; `layout`: each worker's threads, as `run`'s config says.
pub fn replay_through_workers(
    files: &[String],
    limits: Limits,
    analysis: Analysis,
    threads: usize,
    layout: WorkerLayout,
    servers: &[SocketAddr],
    events: Option<&str>,
) -> Result<WorkerReplay, String> {
    let file = match events {
        // A new file, as `replay --events` writes (`run` appends: a restart keeps the day's).
        Some(path) => Some(
            std::fs::File::create(path)
                .and_then(|_| EventFile::open(path))
                .map_err(|e| format!("{path}: cannot open events file: {e}"))?,
        ),
        None => None,
    };
    let stdout = file.is_none().then(|| NdjsonWriter::new(std::io::stdout()));
    let sinks = Arc::new(Mutex::new(EventSinks::new(file, stdout)));
    let metrics =
        Arc::new(Metrics::new(LabelConfig::default()).map_err(|e| format!("metrics: {e}"))?);
    let pool = WorkerPool {
        limits,
        analysis,
        sinks: sinks.clone(),
        metrics,
        reopen: Arc::new(AtomicBool::new(false)),
        wall_clock_when_idle: false,
        queue_batches: 4,
        snapshots: None,
        initial: Mutex::new(Vec::new()),
        fleet: None,
        redactor: None,
        split: layout.split,
        flow_threads: layout.flow_threads,
        session_threads: layout.session_threads,
    };
    let threads = threads.max(1);
    let mut dispatcher = Dispatcher::new(ServerDirectory::new(servers.iter().copied()), threads);
    let (senders, workers) = pool.spawn(threads)?;
    let mut batches: Vec<Batch> = (0..threads).map(|_| Batch::default()).collect();
    let mut send_failed = false;
    let read = capture::read_captures(files, &mut |pkt| {
        let w = dispatcher.worker_of(pkt.linktype, pkt.data);
        let (Some(batch), Some(queue)) = (batches.get_mut(w), senders.get(w)) else {
            return;
        };
        if batch.linktype != pkt.linktype && !batch.packets.is_empty() {
            let linktype = batch.linktype;
            send_failed |= !live::send(queue, batch, linktype);
        }
        batch.linktype = pkt.linktype;
        let off = batch.data.len();
        batch.data.extend_from_slice(pkt.data);
        batch.packets.push((pkt.ts_nanos, off, pkt.data.len()));
        if batch.packets.len() >= 512 {
            let linktype = batch.linktype;
            send_failed |= !live::send(queue, batch, linktype);
        }
    });
    for (mut batch, queue) in batches.into_iter().zip(&senders) {
        if !batch.packets.is_empty() {
            let linktype = batch.linktype;
            send_failed |= !live::send(queue, &mut batch, linktype);
        }
    }
    drop(senders);
    let skipped = read.as_ref().map_or(0, ReadSummary::skipped_bytes);
    let (summary, stats, _) = join_workers(workers, &sinks, skipped)?;
    let read = read.map_err(|e| e.to_string())?;
    if send_failed {
        return Err("a pipeline worker stopped early".into());
    }
    Ok(WorkerReplay {
        read,
        summary,
        stats,
    })
}

/// The capture adapter's part of the config file.
fn capture_setup(c: &CaptureConfig) -> live::CaptureSetup {
    live::CaptureSetup {
        interfaces: c.interfaces.clone(),
        filter: c.filter.clone(),
        snaplen: c.snaplen,
        promiscuous: c.promiscuous,
        buffer_bytes: c.buffer_bytes,
        read_timeout_ms: c.read_timeout_ms,
    }
}

/// The metrics sink's part of the config file.
fn label_config(cfg: &Config) -> LabelConfig {
    LabelConfig {
        server_names: cfg.server_names().into_iter().collect(),
        max_servers: cfg.metrics.max_servers,
    }
}

/// At startup, after dropping privileges if asked to: the events file's directory must take a
/// new file (logrotate moves the file away, SIGHUP opens a new one) and the snapshot's must
/// take its file, as the process now runs (`user`, or as started: a missing directory fails
/// root too). Said once at startup, rather than found at the first rotation or save.
fn warn_unwritable(user: Option<&str>, events: Option<&str>, snapshot: Option<&str>) {
    let who = user.map_or_else(String::new, |u| format!(" as {u}"));
    for (what, path) in [("events file", events), ("snapshot file", snapshot)] {
        let Some(path) = path else { continue };
        let dir = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        // A file made and removed: what a rotation or a save will do there.
        let probe = dir.join(format!(".mcptap-probe-{}", std::process::id()));
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe);
        if made.is_ok() {
            let _ = std::fs::remove_file(&probe);
        }
        if let Err(e) = made {
            tracing::warn!(
                user = user.unwrap_or("-"),
                path = %path,
                "{what}: its directory {} is not writable{who} ({e}): {}",
                dir.display(),
                if what == "events file" {
                    "reopening it after a rotation (SIGHUP) will fail"
                } else {
                    "the session state will not be saved, and a restart loses every baseline"
                }
            );
        }
    }
}

/// Switches to `user` (and its primary group) after the privileged setup is done.
fn drop_privileges(user: &str) -> Result<(), String> {
    use nix::unistd::{Gid, Uid, User, setgid, setgroups, setuid};
    if !Uid::effective().is_root() {
        return Err(format!("--user {user}: only possible when started as root"));
    }
    let u = User::from_name(user)
        .map_err(|e| format!("--user {user}: {e}"))?
        .ok_or_else(|| format!("--user {user}: no such user"))?;
    setgroups(&[u.gid]).map_err(|e| format!("--user {user}: setgroups: {e}"))?;
    setgid(u.gid).map_err(|e| format!("--user {user}: setgid: {e}"))?;
    setuid(u.uid).map_err(|e| format!("--user {user}: setuid: {e}"))?;
    if Uid::effective().is_root() || Gid::effective().as_raw() != u.gid.as_raw() {
        return Err(format!("--user {user}: privileges were not dropped"));
    }
    Ok(())
}

/// Runs until SIGTERM/SIGINT (exit 0) or a capture failure (error).
pub fn run(cfg: Config) -> Result<(), String> {
    let captures = live::open(&capture_setup(&cfg.capture))?;
    let listener = std::net::TcpListener::bind(cfg.metrics.listen).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "cannot listen on {}: address already in use",
                cfg.metrics.listen
            )
        } else {
            format!("cannot listen on {}: {e}", cfg.metrics.listen)
        }
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.metrics.listen))?;
    let file = match &cfg.events.file {
        Some(path) => Some(
            EventFile::open(path).map_err(|e| format!("{path}: cannot open events file: {e}"))?,
        ),
        None => None,
    };
    if let Some(user) = &cfg.user {
        drop_privileges(user)?;
        tracing::info!(user = %user, "privileges dropped");
    }
    warn_unwritable(
        cfg.user.as_deref(),
        cfg.events.file.as_deref(),
        cfg.state.snapshot_file.as_deref(),
    );
    let metrics = Arc::new(Metrics::new(label_config(&cfg)).map_err(|e| format!("metrics: {e}"))?);
    let stop = Arc::new(AtomicBool::new(false));
    let reopen = Arc::new(AtomicBool::new(false));
    let health = Arc::new(CaptureHealth::default());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let layout = cfg.capture.layout(cores, cfg.fleet.url.is_some());
    let n_workers = layout.workers;
    if n_workers > 1 && layout.split {
        // A config written before the default changed (or `check-config`'s output of one)
        // names these keys and keeps the old layout: say what it costs, once.
        tracing::info!(
            workers = n_workers,
            "workers sharded by server endpoint (capture.threads, flow_threads or session_threads set): one busy upstream gets one worker; leave the three unset for one worker sharded over the cores"
        );
    }
    let per_worker = layout.flow_threads + layout.session_threads;
    if n_workers.saturating_mul(per_worker) > crate::config::MAX_THREADS {
        return Err(format!(
            "capture.flow_threads plus capture.session_threads, times the workers ({n_workers}), must be at most {}",
            crate::config::MAX_THREADS
        ));
    }
    let stdout = cfg
        .events
        .stdout
        .then(|| NdjsonWriter::new(std::io::stdout()));
    let sinks = Arc::new(Mutex::new(EventSinks::new(file, stdout)));
    sinks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .capture_drops = Some(0);
    let started = Instant::now();
    let snapshot_path = cfg
        .state
        .snapshot_file
        .as_ref()
        .map(std::path::PathBuf::from);
    let redactor = Redactor::from_settings(&cfg.privacy)?;
    let initial = load_snapshot(snapshot_path.as_deref(), n_workers, &metrics);
    let snapshots = snapshot_path
        .as_ref()
        .map(|_| Arc::new(SnapshotSlots::new(n_workers)));
    let pool = WorkerPool {
        limits: cfg.limits,
        analysis: Analysis {
            detectors: cfg.detect,
            identities: match &redactor {
                Some(r) => {
                    Identities::new(cfg.server_names(), &cfg.identity).with_lineage_key(r.key())
                }
                None => Identities::new(cfg.server_names(), &cfg.identity),
            },
        },
        sinks: sinks.clone(),
        metrics: metrics.clone(),
        reopen: reopen.clone(),
        wall_clock_when_idle: true,
        queue_batches: 64,
        snapshots: snapshots.clone(),
        initial: Mutex::new(initial),
        fleet: cfg.fleet.url.is_some().then(|| cfg.fleet.clone()),
        redactor: redactor.clone(),
        split: layout.split,
        flow_threads: layout.flow_threads,
        session_threads: layout.session_threads,
    };
    let (senders, workers) = pool.spawn(n_workers)?;
    let n_captures = captures.len();
    let mut threads = Vec::new();
    let directory = ServerDirectory::new(cfg.server_names().into_keys());
    for oc in captures {
        tracing::info!(interface = %oc.interface, linktype = oc.linktype, filter = %cfg.capture.filter, workers = n_workers, split = layout.split, flow_threads = layout.flow_threads, session_threads = layout.session_threads, "capturing");
        let dispatcher = Dispatcher::new(directory.clone(), n_workers);
        let interface = oc.interface.clone();
        threads.push(
            live::spawn(
                oc,
                senders.clone(),
                dispatcher,
                stop.clone(),
                health.clone(),
                {
                    let metrics = metrics.clone();
                    let sinks = sinks.clone();
                    let mut reported = DirectoryStats::default();
                    let interface = interface.clone();
                    let mut warnings = live::DropWarnings::default();
                    move |d: live::Drops, directory: DirectoryStats| {
                        metrics.add_capture_drops(d.kernel, d.interface);
                        for (source, packets) in warnings.first(d) {
                            tracing::warn!(
                                interface = %interface,
                                source,
                                packets,
                                "packets dropped before mcptap read them: connections crossing the drops have gaps and MCP alerts may be missed (counted in mcptap_capture_drops_total; warned once per interface and source; see the McptapCaptureDrops runbook)"
                            );
                        }
                        if d.kernel + d.interface > 0 {
                            let mut sinks = sinks.lock().unwrap_or_else(|p| p.into_inner());
                            *sinks.capture_drops.get_or_insert(0) += d.kernel + d.interface;
                        }
                        let (now, before) = (directory, reported);
                        metrics.add_server_directory(
                            "learned_server",
                            now.learned as i64 - before.learned as i64,
                            now.learned_evicted.saturating_sub(before.learned_evicted),
                        );
                        metrics.add_server_directory(
                            "pinned_flow",
                            now.pinned as i64 - before.pinned as i64,
                            now.pinned_evicted.saturating_sub(before.pinned_evicted),
                        );
                        reported = directory;
                    }
                },
            )
            .map_err(|e| format!("cannot start capture thread: {e}"))?,
        );
    }
    // Workers end when every capture thread has dropped its senders.
    drop(senders);
    let saver = match (&snapshot_path, &snapshots) {
        (Some(path), Some(slots)) => Some(spawn_snapshot_saver(
            path.clone(),
            slots.clone(),
            Duration::from_secs(cfg.state.snapshot_interval_secs),
            stop.clone(),
            metrics.clone(),
            redactor.clone(),
        )?),
        _ => None,
    };
    let stats_writer = match cfg.events.stats_interval_secs {
        0 => None,
        secs => Some(spawn_stats_writer(
            sinks.clone(),
            Duration::from_secs(secs),
            stop.clone(),
        )?),
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    let listen = cfg.metrics.listen;
    let failed = runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(ServerState {
            render_metrics: Box::new({
                let metrics = metrics.clone();
                move || metrics.render()
            }),
            readiness: Box::new({
                let health = health.clone();
                move || health.readiness(n_captures)
            }),
            on_event: Box::new({
                let metrics = metrics.clone();
                move |e: server::ServerEvent| metrics.add_metrics_endpoint_error(e.as_str())
            }),
        });
        let limits = server::ServerLimits {
            max_connections: cfg.metrics.max_connections,
            header_timeout: Duration::from_secs(cfg.metrics.header_timeout_secs),
            idle_timeout: Duration::from_secs(cfg.metrics.idle_timeout_secs),
        };
        let server = tokio::spawn(server::serve(listener, state, limits, shutdown_rx));
        tracing::info!(%listen, "metrics endpoint up");
        let failed = wait_for_stop(&reopen, &health).await?;
        let _ = shutdown_tx.send(true);
        let _ = server.await;
        Ok::<bool, String>(failed)
    })?;
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    if let Some(t) = saver {
        let _ = t.join();
    }
    if let Some(t) = stats_writer {
        let _ = t.join();
    }
    let (summary, stats, state) = join_workers(workers, &sinks, 0)?;
    if let (Some(path), Some(mut state)) = (&snapshot_path, state) {
        redact_snapshot(&mut state, redactor.as_ref());
        // The last save is said whatever came before: the state is lost with the process.
        save_snapshot(path, &state, &metrics, &mut false);
    }
    summary.say(&stats, Default::default(), started.elapsed());
    if failed {
        Err("capture failed; see the log above".into())
    } else {
        Ok(())
    }
}

/// The snapshot at `path`, split into each worker's share (by the dispatcher's sharding of
/// server endpoints). A missing file is a first start; a bad one is logged, counted, ignored.
fn load_snapshot(
    path: Option<&std::path::Path>,
    workers: usize,
    metrics: &Metrics,
) -> Vec<Option<Snapshot>> {
    let mut shares: Vec<Option<Snapshot>> = (0..workers).map(|_| None).collect();
    let Some(path) = path else { return shares };
    metrics.snapshots_saved();
    match state::load(path) {
        Ok(None) => tracing::info!(path = %path.display(), "no snapshot yet: starting empty"),
        Ok(Some(mut snap)) => {
            metrics.add_snapshot("load", "ok");
            for (i, share) in shares.iter_mut().enumerate() {
                *share = Some(snap.split_off(|server| worker_of_server(server, workers) == i));
            }
        }
        Err(e) => {
            metrics.add_snapshot("load", e.label());
            tracing::warn!(path = %path.display(), "snapshot ignored: {e}");
        }
    }
    shares
}

/// A snapshot keeps client addresses only as redacted (with `[privacy] redact`).
fn redact_snapshot(snap: &mut Snapshot, redactor: Option<&Redactor>) {
    if let Some(r) = redactor {
        for e in &mut snap.sessions {
            e.client = r.addr(e.client);
        }
    }
}

/// Writes the snapshot. `failing` is whether the previous save failed: a failure is warned
/// about when a spell of them starts (a wrong path fails every interval, and a WARN a minute
/// would bury the next real one), its end is said at INFO; every failure is counted.
fn save_snapshot(path: &std::path::Path, snap: &Snapshot, metrics: &Metrics, failing: &mut bool) {
    match state::save(path, snap) {
        Ok(()) => {
            metrics.add_snapshot("save", "ok");
            if std::mem::take(failing) {
                tracing::info!(path = %path.display(), "snapshot written again");
            }
            tracing::debug!(path = %path.display(), sessions = snap.sessions.len(), "snapshot written");
        }
        Err(e) => {
            metrics.add_snapshot("save", "io");
            if std::mem::replace(failing, true) {
                tracing::debug!(path = %path.display(), "cannot write the snapshot: {e}");
            } else {
                tracing::warn!(path = %path.display(), "cannot write the snapshot: {e} (said once until a save succeeds; counted in mcptap_state_snapshots_total)");
            }
        }
    }
}

/// Every `interval`, asks the workers for their state and writes the snapshot.
fn spawn_snapshot_saver(
    path: std::path::PathBuf,
    slots: Arc<SnapshotSlots>,
    interval: Duration,
    stop: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    redactor: Option<Redactor>,
) -> Result<JoinHandle<()>, String> {
    let stopped = stop.clone();
    let mut failing = false;
    spawn_every("snapshot", interval, stop, move || {
        let generation = slots.request();
        // Workers answer after their next batch or idle tick (250 ms).
        let deadline = Instant::now() + Duration::from_secs(5);
        let snap = loop {
            if let Some(s) = slots.collect(generation) {
                break Some(s);
            }
            if Instant::now() > deadline || stopped.load(Ordering::SeqCst) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match snap {
            Some(mut s) => {
                redact_snapshot(&mut s, redactor.as_ref());
                save_snapshot(&path, &s, &metrics, &mut failing)
            }
            None => metrics.add_snapshot("save", "timeout"),
        }
    })
}

/// Every `interval`, writes the totals so far as a `stats` event.
fn spawn_stats_writer(
    sinks: Arc<Mutex<EventSinks>>,
    interval: Duration,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, String> {
    spawn_every("stats", interval, stop, move || {
        sinks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_totals("stats");
    })
}

/// A thread `name` that runs `task` every `interval` until `stop` (checked every 100 ms).
fn spawn_every(
    name: &str,
    interval: Duration,
    stop: Arc<AtomicBool>,
    mut task: impl FnMut() + Send + 'static,
) -> Result<JoinHandle<()>, String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let tick = Duration::from_millis(100);
            let mut next = Instant::now() + interval;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(tick);
                if Instant::now() < next {
                    continue;
                }
                next = Instant::now() + interval;
                task();
            }
        })
        .map_err(|e| format!("cannot start {name} thread: {e}"))
}

/// Waits for SIGTERM/SIGINT (returns false) or a failed capture (returns true); SIGHUP asks
/// the pipeline thread to reopen the events file.
async fn wait_for_stop(reopen: &AtomicBool, health: &CaptureHealth) -> Result<bool, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let sig = |k| signal(k).map_err(|e| format!("cannot install signal handler: {e}"));
    let mut term = sig(SignalKind::terminate())?;
    let mut int = sig(SignalKind::interrupt())?;
    let mut hup = sig(SignalKind::hangup())?;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); return Ok(false); }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); return Ok(false); }
            _ = hup.recv() => { reopen.store(true, Ordering::SeqCst); }
            _ = tick.tick() => {
                if health.failed.load(Ordering::SeqCst) {
                    return Ok(true);
                }
            }
        }
    }
}
