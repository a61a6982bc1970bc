//! Reading a capture file down to its TCP segments, shared by the integration tests (building
//! frames and capture files lives in mcptap-testkit).
//!
//! Each test binary uses only part of this module, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::path::Path;

use mcptap::capture::{RawPacket, read_captures};
use mcptap_testkit::Segment;

/// What [`read_segments`] found besides the TCP segments.
#[derive(Debug, Default, Clone)]
pub struct ReadStats {
    pub frames: usize,
    /// Frames that did not decode to TCP (they are not part of the returned segments).
    pub non_tcp: usize,
}

/// Reads every frame of a capture file and decodes it down to TCP, in file order.
pub fn read_segments(path: &Path) -> (Vec<Segment>, ReadStats) {
    read_segments_observing(path, &mut |_| {})
}

/// [`read_segments`], also handing every raw packet to `observe` (e.g. to feed a pipeline
/// in the same pass: opening a capture has a noticeable fixed cost in debug builds).
pub fn read_segments_observing(
    path: &Path,
    observe: &mut dyn FnMut(&RawPacket<'_>),
) -> (Vec<Segment>, ReadStats) {
    let mut segments = Vec::new();
    let mut stats = ReadStats::default();
    read_captures(&[path.display().to_string()], &mut |pkt| {
        observe(&pkt);
        stats.frames += 1;
        match Segment::decode(pkt.ts_nanos, pkt.linktype, pkt.data) {
            Some(seg) => segments.push(seg),
            None => stats.non_tcp += 1,
        }
    })
    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    (segments, stats)
}
