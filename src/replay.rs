//! Replay adapter: capture files in, pipeline outputs to a callback.

use crate::capture::{self, CaptureError, ReadSummary};
use mcptap_core::model::Output;
use mcptap_core::model::Timestamp;
use mcptap_core::pipeline::{Analysis, Limits, PacketStats, Pipeline};

/// What a replay produced besides the outputs themselves.
#[derive(Debug)]
pub struct ReplayReport {
    pub read: ReadSummary,
    pub stats: PacketStats,
}

/// Runs every packet of `paths` through one pipeline, handing each output to `on_output` as
/// soon as it is produced.
pub fn replay(
    paths: &[String],
    limits: Limits,
    analysis: Analysis,
    on_output: &mut dyn FnMut(&Output),
) -> Result<ReplayReport, CaptureError> {
    let mut pipeline = Pipeline::configured(limits, analysis, Default::default());
    let mut outputs = Vec::new();
    let read = capture::read_captures(paths, &mut |pkt| {
        pipeline.handle_packet(
            Timestamp(pkt.ts_nanos),
            pkt.linktype,
            pkt.data,
            &mut outputs,
        );
        // Most packets produce nothing: skip the drain.
        if !outputs.is_empty() {
            for o in outputs.drain(..) {
                on_output(&o);
            }
        }
    })?;
    pipeline.finish(&mut outputs);
    for o in outputs.drain(..) {
        on_output(&o);
    }
    Ok(ReplayReport {
        read,
        stats: pipeline.stats().clone(),
    })
}

/// Convenience for tests and tools: all outputs of a replay, in order.
pub fn replay_collect(
    paths: &[String],
    limits: Limits,
) -> Result<(Vec<Output>, ReplayReport), CaptureError> {
    replay_collect_with(paths, limits, Analysis::default())
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
