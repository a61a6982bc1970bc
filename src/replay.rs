//! Replay adapter: capture files in, pipeline outputs to a callback.

use crate::capture::{self, CaptureError, ReadSummary};
use crate::fleet::{self, FleetStore};
use crate::flow_shards::{FlowLayer, FlowShards};
use crate::progress::ReplayProgress;
use crate::sink::summary::TimeSpan;
use mcptap_core::flow_shard::StagedSteps;
use mcptap_core::http::Spent;
use mcptap_core::model::Output;
use mcptap_core::model::Timestamp;
use mcptap_core::pipeline::{Analysis, Limits, PacketStats, Pipeline, SessionStage, Staged};
use mcptap_core::usage::SharedUsage;
use std::sync::Arc;

/// What a replay produced besides the outputs themselves.
#[derive(Debug)]
pub struct ReplayReport {
    pub read: ReadSummary,
    pub stats: PacketStats,
    /// First and last packet time.
    pub span: TimeSpan,
}

/// Runs every packet of `paths` through one pipeline, handing each output to `on_output` as
/// soon as it is produced.
pub fn replay(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    on_output: &mut dyn FnMut(&Output),
) -> Result<ReplayReport, CaptureError> {
    replay_with_fleet(
        paths,
        limits,
        analysis,
        None,
        &mut ReplayProgress::hidden(),
        on_output,
    )
}

/// [`replay`] in fleet mode: sessions first seen are looked up in `fleet`'s store (and, if it
/// writes, their changes stored), so that a capture of one gateway host is read with the
/// baselines the others recorded. `progress` is told of every packet read.
pub fn replay_with_fleet(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    mut fleet: Option<&mut FleetStore>,
    progress: &mut ReplayProgress,
    on_output: &mut dyn FnMut(&Output),
) -> Result<ReplayReport, CaptureError> {
    let mut pipeline = Pipeline::configured(limits, analysis, Default::default());
    if fleet.is_some() {
        pipeline.enable_fleet();
    }
    let mut outputs = Vec::new();
    let fleet_mode = fleet.is_some();
    let mut since_served = 0usize;
    let mut span = TimeSpan::default();
    let mut deliver =
        |pipeline: &mut Pipeline, outputs: &mut Vec<Output>| match fleet.as_deref_mut() {
            Some(store) => fleet::serve(store, outputs, pipeline, on_output),
            None => {
                for o in outputs.drain(..) {
                    on_output(&o);
                }
            }
        };
    let read = capture::read_captures(paths, &mut |pkt| {
        span.see(Timestamp(pkt.ts_nanos));
        progress.packet(pkt.data.len());
        pipeline.handle_packet(
            Timestamp(pkt.ts_nanos),
            pkt.linktype,
            pkt.data,
            &mut outputs,
        );
        // Most packets produce nothing: skip the drain. In fleet mode the store is served
        // every few hundred packets: its writes go out pipelined (held sessions wait as they
        // would for a slower store).
        since_served += 1;
        if !outputs.is_empty() && (!fleet_mode || since_served >= FLEET_BATCH_PACKETS) {
            deliver(&mut pipeline, &mut outputs);
            since_served = 0;
        }
    })?;
    // The store answers what is still asked before the end concludes anything.
    deliver(&mut pipeline, &mut outputs);
    pipeline.finish(&mut outputs);
    deliver(&mut pipeline, &mut outputs);
    Ok(ReplayReport {
        read,
        stats: pipeline.stats().clone(),
        span,
    })
}

/// Output work that [`replay_split`] does on its session thread: each output is handed to it
/// there, in order (redaction, say), with buffers to append its bytes to (the event's NDJSON
/// line, its log line) while the session thread keeps up. When staged input waits for it, the
/// buffers are `None` and the calling thread, which delivers the outputs, renders them itself:
/// the rendering goes to whichever thread has time, and the bytes are the same.
pub type PrepareOutput<'a> = &'a (dyn Fn(&mut Output, Option<RenderInto<'_>>) + Sync);

/// Where [`PrepareOutput`] appends an output's bytes; what it leaves empty is rendered when
/// the output is delivered.
pub struct RenderInto<'a> {
    /// The event's NDJSON line.
    pub line: &'a mut Vec<u8>,
    /// Its log line.
    pub log: &'a mut Vec<u8>,
}

/// What [`PrepareOutput`] rendered for one output (each empty when it did not).
#[derive(Debug, Clone, Copy, Default)]
pub struct Prepared<'a> {
    pub line: &'a [u8],
    pub log: &'a [u8],
}

/// Rendered bytes of a batch's outputs, one after the other.
#[derive(Default)]
struct RenderedBytes {
    bytes: Vec<u8>,
    /// End of each output's bytes in `bytes`.
    ends: Vec<usize>,
}

impl RenderedBytes {
    fn with_capacity(outputs: usize) -> Self {
        RenderedBytes {
            bytes: Vec::new(),
            ends: Vec::with_capacity(outputs),
        }
    }

    /// Output `i`'s bytes; `start` is where they begin (the previous output's end).
    fn of(&self, i: usize, start: &mut usize) -> &[u8] {
        let end = self.ends.get(i).copied().unwrap_or(*start);
        let bytes = self.bytes.get(*start..end).unwrap_or_default();
        *start = end;
        bytes
    }

    fn clear(&mut self) {
        self.ends.clear();
        self.bytes.clear();
        if self.bytes.capacity() > OUTPUT_BYTES_KEEP {
            self.bytes.shrink_to(OUTPUT_BYTES_KEEP);
        }
    }
}

/// Outputs of the session side with what [`PrepareOutput`] appended for each.
#[derive(Default)]
struct OutputBatch {
    outputs: Vec<Output>,
    lines: RenderedBytes,
    logs: RenderedBytes,
    /// What the session side was done with of the flow side's allocations for these outputs,
    /// to be freed on the flow side's thread, which allocated them (see
    /// `SessionStage::keep_spent`); emptied there before the batch goes back.
    spent: Spent,
}

/// Keep each of a recycled batch's two buffers only up to this size (after a run of very
/// large events; a handshake's log line is about as large as its event's line).
const OUTPUT_BYTES_KEEP: usize = 2 << 20;

impl OutputBatch {
    fn with_capacity(outputs: usize) -> Self {
        OutputBatch {
            outputs: Vec::with_capacity(outputs),
            lines: RenderedBytes::with_capacity(outputs),
            logs: RenderedBytes::with_capacity(outputs),
            spent: Spent::default(),
        }
    }

    /// Prepares every output; `render`: with buffers for its bytes.
    fn prepare(&mut self, prepare: PrepareOutput<'_>, render: bool) {
        for o in &mut self.outputs {
            let into = render.then_some(RenderInto {
                line: &mut self.lines.bytes,
                log: &mut self.logs.bytes,
            });
            prepare(o, into);
            self.lines.ends.push(self.lines.bytes.len());
            self.logs.ends.push(self.logs.bytes.len());
        }
    }

    /// Each output with its prepared bytes (empty when nothing prepared them).
    fn deliver(&self, on_output: &mut dyn FnMut(&Output, Prepared<'_>)) {
        let (mut line_start, mut log_start) = (0, 0);
        for (i, o) in self.outputs.iter().enumerate() {
            let prepared = Prepared {
                line: self.lines.of(i, &mut line_start),
                log: self.logs.of(i, &mut log_start),
            };
            on_output(o, prepared);
        }
    }

    fn clear(&mut self) {
        self.outputs.clear();
        self.lines.clear();
        self.logs.clear();
    }
}

/// [`replay_with_fleet`] without a store, on two threads: the calling thread reads the
/// capture, runs the flow layer (decoding, reassembly, HTTP) and hands every output to
/// `on_output` (events, logs); the session layer ([`Pipeline::split`]) runs on the other, and
/// so does `prepare`, if given, on each output before it is handed over. Two busy threads for
/// two cores: on gateway traffic the flow layer with the writing of outputs costs about what
/// the session layer with their rendering does. The outputs are those of [`replay`], in the
/// same order, unless a memory limit is reached.
pub fn replay_split(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    flow_threads: usize,
    progress: &mut ReplayProgress,
    prepare: Option<PrepareOutput<'_>>,
    on_output: &mut dyn FnMut(&Output, Prepared<'_>),
) -> Result<ReplayReport, CaptureError> {
    let whole = analysis.clone();
    let (flows, stages) = split_layers(limits, analysis, flow_threads, 1);
    let Some(mut sessions) = stages.into_iter().next() else {
        return replay_whole(paths, limits, whole, progress, prepare, on_output);
    };
    // With the flow layer on this thread, the bodies and heads the session side is done with
    // come back to be freed here (with flow shards they were allocated on the shards' threads).
    if matches!(flows, FlowLayer::Here(_)) {
        sessions.keep_spent();
    }
    let (staged_tx, staged_rx) = std::sync::mpsc::sync_channel::<Vec<Staged>>(SPLIT_QUEUE_BATCHES);
    // Unbounded, so that neither side can wait for the other forever; what waits in it is
    // bounded all the same: the session side makes outputs only of the staged batches it was
    // given (at most the staging channel's), and the flow side takes them after every batch.
    let (out_tx, out_rx) = std::sync::mpsc::channel::<OutputBatch>();
    // Done batches go back to be filled again: a batch is large, and allocating it anew (and
    // freeing it on the other thread) cost more than the hand-over itself.
    let (spare_staged_tx, spare_staged_rx) = std::sync::mpsc::channel::<Vec<Staged>>();
    let (spare_out_tx, spare_out_rx) = std::sync::mpsc::channel::<OutputBatch>();
    // Staged batches sent and not yet taken by the session side: while some wait, it is the
    // slower side, and leaves the rendering of its outputs to the flow side.
    let waiting = std::sync::atomic::AtomicUsize::new(0);
    let waiting = &waiting;
    let done = std::thread::scope(|scope| {
        let session_side = std::thread::Builder::new()
            .name("sessions".into())
            .spawn_scoped(scope, move || {
                for mut batch in staged_rx {
                    waiting.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    // Cleared here: the outputs were made on this thread, and mimalloc frees
                    // memory fastest on the thread that allocated it.
                    let mut out = match spare_out_rx.try_recv() {
                        Ok(mut spare) => {
                            spare.clear();
                            spare
                        }
                        Err(_) => OutputBatch::with_capacity(SPLIT_BATCH),
                    };
                    for staged in batch.drain(..) {
                        sessions.process(staged, &mut out.outputs);
                    }
                    let _ = spare_staged_tx.send(batch);
                    out.spent = sessions.swap_spent(std::mem::take(&mut out.spent));
                    sessions.publish_usage();
                    if let Some(prepare) = prepare {
                        let behind = waiting.load(std::sync::atomic::Ordering::Relaxed) > 0;
                        out.prepare(prepare, !behind);
                    }
                    if out_tx.send(out).is_err() {
                        return; // the flow side is gone
                    }
                }
            });
        // Nothing of the input is read yet: the whole pipeline can take it (below).
        let Ok(session_side) = session_side else {
            return None;
        };
        let mut deliver = |mut batch: OutputBatch| {
            batch.deliver(on_output);
            batch.spent.clear();
            // Back whole: the session side drops the outputs it made (see above).
            let _ = spare_out_tx.send(batch);
        };
        let mut session_side_gone = false;
        let report = read_flows(
            paths,
            flows,
            progress,
            (SPLIT_BATCH, SPLIT_BATCH_BYTES),
            &mut |flows, last| {
                if last {
                    waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = staged_tx.send(flows.take_staged(Vec::new()));
                    return;
                }
                if session_side_gone {
                    return;
                }
                let spare = spare_staged_rx
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(SPLIT_BATCH));
                waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                session_side_gone = staged_tx.send(flows.take_staged(spare)).is_err();
                while let Ok(batch) = out_rx.try_recv() {
                    deliver(batch);
                }
            },
        );
        // The session side ends when the staging channel closes, and so does its output.
        drop(staged_tx);
        for batch in out_rx {
            deliver(batch);
        }
        if let Err(panic) = session_side.join() {
            std::panic::resume_unwind(panic);
        }
        Some(report)
    });
    match done {
        Some(result) => result,
        None => replay_whole(paths, limits, whole, progress, prepare, on_output),
    }
}

/// [`replay_split`]'s work on the calling thread alone (when it cannot split): each output
/// prepared and rendered here, in order.
fn replay_whole(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    progress: &mut ReplayProgress,
    prepare: Option<PrepareOutput<'_>>,
    on_output: &mut dyn FnMut(&Output, Prepared<'_>),
) -> Result<ReplayReport, CaptureError> {
    let (mut line, mut log) = (Vec::new(), Vec::new());
    let mut on_whole = |o: &Output| match prepare {
        Some(prepare) => {
            let mut o = o.clone();
            line.clear();
            log.clear();
            let into = RenderInto {
                line: &mut line,
                log: &mut log,
            };
            prepare(&mut o, Some(into));
            on_output(
                &o,
                Prepared {
                    line: &line,
                    log: &log,
                },
            );
        }
        None => on_output(o, Prepared::default()),
    };
    replay_with_fleet(paths, limits, analysis, None, progress, &mut on_whole)
}

/// The flow side of a replay whose session layer runs elsewhere: [`read_staged`] on this
/// thread, or [`read_flow_sharded`] over flow shards on threads of their own. `batch` bounds
/// what is staged before a hand-over on this thread (flow shards hand over every round).
pub(crate) fn read_flows(
    paths: &[String],
    flows: FlowLayer,
    progress: &mut ReplayProgress,
    batch: (usize, usize),
    hand_over: &mut dyn FnMut(&mut dyn StagedSteps, bool),
) -> Result<ReplayReport, CaptureError> {
    match flows {
        FlowLayer::Here(mut flows) => read_staged(paths, &mut flows, progress, batch, hand_over),
        FlowLayer::Sharded {
            shards,
            limits,
            usage,
        } => read_flow_sharded(paths, shards, &limits, usage, progress, hand_over),
    }
}

/// The flow layer of a split replay: on the calling thread with `flow_threads` 0, else
/// sharded by connection over that many threads; and the session layer in `session_shards`
/// stages (see [`Pipeline::split_flows`]).
pub(crate) fn split_layers(
    limits: Limits,
    analysis: Analysis,
    flow_threads: usize,
    session_shards: usize,
) -> (FlowLayer, Vec<SessionStage>) {
    let usage: Arc<SharedUsage> = Arc::default();
    let (mut shards, stages) = Pipeline::split_flows(
        limits,
        analysis,
        Arc::clone(&usage),
        flow_threads.max(1),
        session_shards,
    );
    let layer = match (flow_threads, shards.pop()) {
        (0, Some(flows)) if shards.is_empty() => FlowLayer::Here(Box::new(flows)),
        (_, last) => {
            shards.extend(last);
            FlowLayer::Sharded {
                shards,
                limits,
                usage,
            }
        }
    };
    (layer, stages)
}

/// The flow thread of a replay whose session layer runs elsewhere: reads `paths` through
/// `flows` and calls `hand_over(flows, false)` whenever `batch` (staged steps, bytes of
/// bodies) is staged, and `hand_over(flows, true)` once at the end, after the finish. As the
/// whole pipeline, an input that cannot be read ends without the finish.
pub(crate) fn read_staged(
    paths: &[String],
    flows: &mut Pipeline,
    progress: &mut ReplayProgress,
    batch: (usize, usize),
    hand_over: &mut dyn FnMut(&mut dyn StagedSteps, bool),
) -> Result<ReplayReport, CaptureError> {
    let mut out = Vec::new();
    let mut span = TimeSpan::default();
    let read = capture::read_captures(paths, &mut |pkt| {
        span.see(Timestamp(pkt.ts_nanos));
        progress.packet(pkt.data.len());
        flows.handle_packet(Timestamp(pkt.ts_nanos), pkt.linktype, pkt.data, &mut out);
        let (steps, bytes) = flows.stage_outputs(&mut out);
        if steps >= batch.0 || bytes >= batch.1 {
            hand_over(&mut *flows, false);
        }
    });
    if read.is_ok() {
        flows.finish(&mut out);
    }
    flows.stage_outputs(&mut out);
    hand_over(&mut *flows, true);
    read.map(|read| ReplayReport {
        read,
        stats: flows.stats().clone(),
        span,
    })
}

/// Staged steps (or bytes of bodies) the flow thread hands over at once, and batches that may
/// wait: what waits for the session side is charged to the memory budget, and bounded here
/// besides; the outputs of each staged batch come back as one batch.
const SPLIT_BATCH: usize = 1024;
const SPLIT_BATCH_BYTES: usize = 1 << 20;
const SPLIT_QUEUE_BATCHES: usize = 8;

/// Packets between two rounds with the fleet store in a replay.
const FLEET_BATCH_PACKETS: usize = 256;

/// Convenience for tests and tools: all outputs of a replay, in order.
pub fn replay_collect(
    paths: &[String],
    limits: Limits,
) -> Result<(Vec<Output>, ReplayReport), CaptureError> {
    replay_collect_with(paths, limits, Analysis::default())
}

/// Every event of every capture in `tests/fixtures`, with the capture's path, for tests that
/// hold a writer to a reference on real traffic.
#[cfg(test)]
pub(crate) fn fixture_events() -> Vec<(String, mcptap_core::model::Event)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let mut paths: Vec<String> = std::fs::read_dir(dir)
        .expect("fixtures")
        .filter_map(|e| Some(e.ok()?.path().to_str()?.to_string()))
        .filter(|p| p.ends_with(".pcap") || p.ends_with(".pcapng"))
        .collect();
    paths.sort();
    let mut all = Vec::new();
    for p in paths {
        let (outputs, _) =
            replay_collect(std::slice::from_ref(&p), Default::default()).expect("replay");
        all.extend(outputs.into_iter().filter_map(|o| match o {
            Output::Event(e) => Some((p.clone(), e)),
            _ => None,
        }));
    }
    all
}

/// [`replay_collect`] with detector settings and identities.
pub fn replay_collect_with(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
) -> Result<(Vec<Output>, ReplayReport), CaptureError> {
    let mut all = Vec::new();
    let report = replay(paths, limits, analysis, &mut |o| all.push(o.clone()))?;
    Ok((all, report))
}

/// [`read_staged`] with the flow layer sharded by connection ([`FlowShards`]): reads `paths`,
/// runs each packet through its connection's shard and calls
/// `hand_over(steps, false)` with each merged round, then `hand_over(steps, true)` once, after
/// the finish. As the whole pipeline, an input that cannot be read ends without the finish.
fn read_flow_sharded(
    paths: &[String],
    shards: Vec<Pipeline>,
    limits: &Limits,
    usage: Arc<SharedUsage>,
    progress: &mut ReplayProgress,
    hand_over: &mut dyn FnMut(&mut dyn StagedSteps, bool),
) -> Result<ReplayReport, CaptureError> {
    let mut flows = FlowShards::spawn(shards, limits, usage, "flows");
    let mut span = TimeSpan::default();
    let mut each = |steps: &mut dyn StagedSteps, _: Option<i64>| hand_over(steps, false);
    let read = capture::read_captures(paths, &mut |pkt| {
        span.see(Timestamp(pkt.ts_nanos));
        progress.packet(pkt.data.len());
        if flows.packet(Timestamp(pkt.ts_nanos), pkt.linktype, pkt.data) {
            flows.merge_ready(false, &mut each);
        }
    });
    if read.is_ok() {
        flows.finish(&mut each);
    } else {
        flows.close(&mut each);
    }
    hand_over(flows.merged(), true);
    let stats = flows.stats().clone();
    read.map(|read| ReplayReport { read, stats, span })
}
