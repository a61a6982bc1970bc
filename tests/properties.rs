//! Property tests (proptest) of the capture-to-events path and of the parsers under it.
//!
//! (a) Invariance: the TCP payload streams of a few fixtures are re-cut at random points,
//!     reordered within a small window and duplicated at random; the emitted events (as
//!     serialised) must not change. Reordering moves segments to other capture timestamps,
//!     so `ts` and `duration_ms` are not compared when it is on.
//! (b) Robustness: random byte mutations (bit flips, overwrites, insertions, deletions,
//!     truncations) of fixture frames, of capture files and of the HTTP byte streams never
//!     panic, and the HTTP layer's event stream keeps its per-exchange structure.
//! (c) Robustness of the parsers on their own: random byte streams into `SseParser`,
//!     `ChunkedDecoder` and `jsonrpc::parse` never panic, and the two push parsers give the
//!     same result however their input is split (both document this).
//!
//! The plans driving the transformations are plain byte vectors read cyclically, so a
//! failure shrinks towards the smallest plan (an empty plan is the identity).
//!
//! Regression tests for inputs found by the fuzz targets in `fuzz/` are at the end; their
//! inputs live in `tests/regressions/`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::read_segments_observing;
use mcptap_core::detect::Detectors;
use mcptap_core::http::chunked::{ChunkedDecoder, ChunkedError};
use mcptap_core::http::sse::{SseItem, SseParser};
use mcptap_core::http::{BodyEnd, Connection, HttpLimits};
use mcptap_core::jsonrpc;
use mcptap_core::mcp::{FlowCtx, HTTP_INTEREST, SessionLimits, Tracker};
use mcptap_core::model::Output;
use mcptap_core::model::Timestamp;
use mcptap_core::pipeline::{Limits, Pipeline};
use mcptap_testkit::segment::payload_streams;
use mcptap_testkit::{HttpEventChecker, Link, Segment};
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::Value;

// ---------------------------------------------------------------------------
// Fixtures

/// Fixtures used here: scripted framing edge cases, pipelining, several flows at once, and
/// the two SDK captures (many short connections; LF-only SSE).
const FIXTURES: [&str; 7] = [
    "chunk_split.pcap",
    "pipelined.pcap",
    "incident.pcap",
    "empty_stream.pcap",
    "interleaved.pcap",
    "sdk_sse.pcap",
    "ts_sdk_sse.pcap",
];

struct Fixture {
    name: &'static str,
    path: PathBuf,
    /// Link type and bytes of every frame, as captured.
    frames: Vec<(u32, i64, Vec<u8>)>,
    segments: Vec<Segment>,
    /// Events of the identity re-encoding of `segments`, serialised.
    events: Vec<Value>,
}

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn fixtures() -> &'static [Fixture] {
    static FIXTURES_CELL: OnceLock<Vec<Fixture>> = OnceLock::new();
    FIXTURES_CELL.get_or_init(|| {
        FIXTURES
            .iter()
            .map(|name| {
                let path = fixture_path(name);
                let mut frames = Vec::new();
                let (segments, stats) = read_segments_observing(&path, &mut |pkt| {
                    frames.push((pkt.linktype, pkt.ts_nanos, pkt.data.to_vec()))
                });
                assert_eq!(stats.non_tcp, 0, "{name}: every frame should be TCP");
                let events = events_of(&run_segments(&segments));
                assert!(!events.is_empty(), "{name}: no events in the baseline");
                Fixture {
                    name,
                    path,
                    frames,
                    segments,
                    events,
                }
            })
            .collect()
    })
}

/// Feeds segments (as Ethernet frames) through a fresh pipeline.
fn run_segments(segments: &[Segment]) -> Vec<Output> {
    let mut pipeline = Pipeline::new(Limits::default());
    let mut out = Vec::new();
    for s in segments {
        let frame = s.frame(&Link::default());
        pipeline.handle_packet(Timestamp(s.ts_nanos), 1, &frame, &mut out);
    }
    pipeline.finish(&mut out);
    out
}

fn events_of(outputs: &[Output]) -> Vec<Value> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(serde_json::to_value(e).expect("event serialises")),
            Output::Telemetry(_) | Output::Shared(_) => None,
        })
        .collect()
}

fn without_timing(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if let Some(obj) = e.as_object_mut() {
                obj.remove("ts");
                obj.remove("duration_ms");
            }
            e
        })
        .collect()
}

/// A byte plan read cyclically; an empty plan yields zeros (no change).
struct Plan<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Plan<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Plan { bytes, at: 0 }
    }

    fn next(&mut self) -> u8 {
        if self.bytes.is_empty() {
            return 0;
        }
        let b = self.bytes[self.at % self.bytes.len()];
        self.at += 1;
        b
    }

    fn next_u16(&mut self) -> u16 {
        u16::from_le_bytes([self.next(), self.next()])
    }
}

// ---------------------------------------------------------------------------
// (a) Transformations of a fixture's segments

fn is_data(s: &Segment) -> bool {
    !s.payload.is_empty() && !s.flags.syn && !s.flags.fin && !s.flags.rst
}

/// Re-cuts every payload-bearing segment at 0..=3 random points. SYN stays on the first
/// piece, FIN and RST move to the last one; all pieces keep the original timestamp.
fn recut(segments: &[Segment], plan: &mut Plan<'_>) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segments.len() * 2);
    for s in segments {
        let n = s.payload.len();
        let cuts = if n > 1 { plan.next() % 4 } else { 0 };
        let mut points: Vec<usize> = (0..cuts)
            .map(|_| 1 + usize::from(plan.next_u16()) % (n - 1))
            .collect();
        points.sort_unstable();
        points.dedup();
        if points.is_empty() {
            out.push(s.clone());
            continue;
        }
        out.extend(s.split_at(&points));
    }
    out
}

/// Shuffles data segments within runs where all data goes one way and no SYN, FIN or RST
/// occurs (bare ACKs may be in between and move along); each step swaps a segment with one
/// up to 3 positions later. The first data segment of each direction stays in place, and
/// every position keeps its timestamp (so time never runs backwards).
fn reorder(segments: &[Segment], plan: &mut Plan<'_>) -> Vec<Segment> {
    let mut out: Vec<Segment> = segments.to_vec();
    let mut seen_data = std::collections::HashSet::new();
    let mut i = 0;
    while i < out.len() {
        // Find the run starting at i.
        let mut dir = None;
        let mut j = i;
        while j < out.len() {
            let s = &out[j];
            let barrier = s.flags.syn || s.flags.fin || s.flags.rst;
            if barrier {
                break;
            }
            if is_data(s) {
                if !seen_data.contains(&s.direction()) {
                    break;
                }
                match dir {
                    None => dir = Some(s.direction()),
                    Some(d) if d != s.direction() => break,
                    _ => {}
                }
            }
            j += 1;
        }
        if j == i {
            // A barrier (or a first data segment) of its own.
            if is_data(&out[i]) || !out[i].payload.is_empty() {
                seen_data.insert(out[i].direction());
            }
            i += 1;
            continue;
        }
        let stamps: Vec<i64> = out[i..j].iter().map(|s| s.ts_nanos).collect();
        let run = &mut out[i..j];
        for k in 0..run.len() {
            let to = (k + usize::from(plan.next() % 4)).min(run.len() - 1);
            run.swap(k, to);
        }
        for (s, ts) in run.iter_mut().zip(stamps) {
            s.ts_nanos = ts;
        }
        i = j;
    }
    out
}

/// Retransmits data segments at random: a copy right after the original, or up to 4
/// positions later (with that position's timestamp), never past a SYN, FIN or RST.
fn duplicate(segments: &[Segment], plan: &mut Plan<'_>) -> Vec<Segment> {
    // (position, copy) pairs to insert after `position`.
    let mut inserts: Vec<(usize, Segment)> = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        if !is_data(s) {
            continue;
        }
        let b = plan.next();
        if !b.is_multiple_of(3) {
            continue;
        }
        let mut at = i;
        for _ in 0..(b >> 6) {
            match segments.get(at + 1) {
                Some(n) if !(n.flags.syn || n.flags.fin || n.flags.rst) => at += 1,
                _ => break,
            }
        }
        inserts.push((
            at,
            Segment {
                ts_nanos: segments[at].ts_nanos,
                ..s.clone()
            },
        ));
    }
    inserts.sort_by_key(|(at, _)| *at);
    let mut out = Vec::with_capacity(segments.len() + inserts.len());
    let mut pending = inserts.into_iter().peekable();
    for (i, s) in segments.iter().enumerate() {
        out.push(s.clone());
        while let Some((_, copy)) = pending.next_if(|(at, _)| *at == i) {
            out.push(copy);
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Transform {
    reorder: bool,
    duplicate: bool,
}

fn check_invariance(fixture: usize, plan: &[u8], t: Transform) -> Result<(), TestCaseError> {
    let f = &fixtures()[fixture];
    let mut plan = Plan::new(plan);
    let mut segments = recut(&f.segments, &mut plan);
    if t.reorder {
        segments = reorder(&segments, &mut plan);
    }
    if t.duplicate {
        segments = duplicate(&segments, &mut plan);
    }
    prop_assert!(
        segments.windows(2).all(|w| w[0].ts_nanos <= w[1].ts_nanos),
        "timestamps must stay non-decreasing"
    );
    let got = events_of(&run_segments(&segments));
    let (want, got) = if t.reorder {
        (without_timing(&f.events), without_timing(&got))
    } else {
        (f.events.clone(), got)
    };
    if want != got {
        let first = want
            .iter()
            .zip(&got)
            .position(|(a, b)| a != b)
            .unwrap_or(want.len().min(got.len()));
        return Err(TestCaseError::fail(format!(
            "{}: {} events expected, {} emitted; first difference at {first}:\nexpected {}\n     got {}",
            f.name,
            want.len(),
            got.len(),
            want.get(first).map_or("-".into(), Value::to_string),
            got.get(first).map_or("-".into(), Value::to_string),
        )));
    }
    Ok(())
}

/// The transformations do something: a fixed plan cuts, moves and copies segments, and the
/// identity re-encoding used as the baseline agrees with a replay of the capture file.
#[test]
fn transformations_are_not_noops() {
    let plan: Vec<u8> = (0..=255u8).map(|b| b.wrapping_mul(37)).collect();
    for (i, f) in fixtures().iter().enumerate() {
        let (outputs, _) =
            mcptap::replay::replay_collect(&[f.path.display().to_string()], Limits::default())
                .expect("replay");
        assert_eq!(events_of(&outputs), f.events, "{}: baseline", f.name);
        let mut p = Plan::new(&plan);
        let cut = recut(&f.segments, &mut p);
        assert!(cut.len() > f.segments.len(), "{}: nothing cut", f.name);
        let moved = reorder(&cut, &mut p);
        assert_eq!(moved.len(), cut.len());
        let changed = moved
            .iter()
            .zip(&cut)
            .filter(|(a, b)| a.seq != b.seq)
            .count();
        assert!(changed > 0, "{}: nothing reordered", f.name);
        let copied = duplicate(&moved, &mut p);
        assert!(copied.len() > moved.len(), "{}: nothing duplicated", f.name);
        check_invariance(
            i,
            &plan,
            Transform {
                reorder: true,
                duplicate: true,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn plan_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..512)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn resegmentation_keeps_events(fixture in 0..FIXTURES.len(), plan in plan_strategy()) {
        check_invariance(fixture, &plan, Transform { reorder: false, duplicate: false })?;
    }

    #[test]
    fn resegmentation_and_duplication_keep_events(
        fixture in 0..FIXTURES.len(),
        plan in plan_strategy(),
    ) {
        check_invariance(fixture, &plan, Transform { reorder: false, duplicate: true })?;
    }

    #[test]
    fn resegmentation_reordering_and_duplication_keep_events(
        fixture in 0..FIXTURES.len(),
        plan in plan_strategy(),
    ) {
        check_invariance(fixture, &plan, Transform { reorder: true, duplicate: true })?;
    }
}

// ---------------------------------------------------------------------------
// (b) Mutations

/// Applies byte mutations to `data`, driven by the plan: flip a bit, overwrite, insert or
/// delete a byte, or truncate.
fn mutate(data: &mut Vec<u8>, plan: &mut Plan<'_>) {
    let op = plan.next();
    let at = usize::from(plan.next_u16());
    let byte = plan.next();
    let len = data.len();
    match op % 8 {
        0 | 1 if len > 0 => data[at % len] ^= 1 << (byte % 8),
        2 if len > 0 => data[at % len] = byte,
        3 | 4 => data.insert(at % (len + 1), byte),
        5 | 6 if len > 0 => {
            data.remove(at % len);
        }
        7 => data.truncate(at % (len + 1)),
        _ => {}
    }
}

#[derive(Debug, Clone)]
struct Mutation {
    target: u16,
    plan: Vec<u8>,
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(
        (any::<u16>(), proptest::collection::vec(any::<u8>(), 4..=4))
            .prop_map(|(target, plan)| Mutation { target, plan }),
        1..48,
    )
}

/// One connection's payload as (half, bytes) steps; half 0 is the SYN sender.
type Steps = Vec<(usize, Vec<u8>)>;

/// The HTTP byte streams of every connection of the fixtures, in capture order with
/// retransmissions dropped.
fn http_streams() -> &'static [Steps] {
    static STREAMS: OnceLock<Vec<Steps>> = OnceLock::new();
    STREAMS.get_or_init(|| {
        let mut all = Vec::new();
        for f in fixtures() {
            all.extend(
                payload_streams(&f.segments)
                    .into_iter()
                    .map(|stream| {
                        let steps = stream.steps.into_iter();
                        steps.map(|step| (step.half, step.bytes)).collect::<Steps>()
                    })
                    .filter(|s| !s.is_empty()),
            );
        }
        all
    })
}

fn flow_ctx() -> FlowCtx {
    FlowCtx {
        flow: 7,
        client: "10.0.0.2:40000".parse().expect("addr"),
        server: "10.0.0.1:8080".parse().expect("addr"),
    }
}

/// Feeds (half, bytes) steps into a connection, each step in pieces of `split` bytes (0:
/// whole), and everything it emits into a tracker. Returns the serialised events.
fn run_http_steps(steps: &[(usize, Vec<u8>)], split: usize, synchronised: bool) -> Vec<Value> {
    let mut conn = Connection::new(synchronised, HttpLimits::default(), HTTP_INTEREST);
    let mut tracker = Tracker::new(SessionLimits::default(), Detectors::default());
    let mut events = Vec::new();
    let mut out = Vec::new();
    let mut checker = HttpEventChecker::default();
    let mut ts = 1_700_000_000_000_000_000i64;
    for (half, bytes) in steps {
        ts += 1_000_000;
        if split == 0 {
            conn.on_data(*half, bytes, &mut events);
        } else {
            for piece in bytes.chunks(split) {
                conn.on_data(*half, piece, &mut events);
            }
        }
        checker.check(&events);
        for ev in events.drain(..) {
            tracker.on_http(flow_ctx(), Timestamp(ts), ev, &mut out);
        }
    }
    for half in [1, 0] {
        conn.on_close(half, BodyEnd::ServerClosed, &mut events);
    }
    checker.check(&events);
    for ev in events.drain(..) {
        tracker.on_http(flow_ctx(), Timestamp(ts), ev, &mut out);
    }
    tracker.sweep(Timestamp(i64::MAX), &mut out);
    events_of(&out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn mutated_fixture_frames_never_panic(fixture in 0..FIXTURES.len(), muts in mutations()) {
        let f = &fixtures()[fixture];
        let mut frames = f.frames.clone();
        for m in &muts {
            let i = usize::from(m.target) % frames.len();
            mutate(&mut frames[i].2, &mut Plan::new(&m.plan));
        }
        let mut pipeline = Pipeline::new(Limits::default());
        let mut out = Vec::new();
        for (linktype, ts, data) in &frames {
            pipeline.handle_packet(Timestamp(*ts), *linktype, data, &mut out);
        }
        pipeline.finish(&mut out);
        let _ = events_of(&out);
    }

    #[test]
    fn mutated_http_streams_never_panic(
        stream in any::<prop::sample::Index>(),
        muts in mutations(),
        split in prop_oneof![Just(0usize), 1usize..16],
        synchronised in any::<bool>(),
    ) {
        let streams = http_streams();
        let mut steps = streams[stream.index(streams.len())].clone();
        for m in &muts {
            let i = usize::from(m.target) % steps.len();
            mutate(&mut steps[i].1, &mut Plan::new(&m.plan));
        }
        let _ = run_http_steps(&steps, split, synchronised);
    }

    #[test]
    fn http_streams_are_split_invariant(
        stream in any::<prop::sample::Index>(),
        split in 1usize..24,
    ) {
        // Each step is still delivered as a whole relative to the other direction, only its
        // own bytes are cut: the events must not change at all.
        let streams = http_streams();
        let steps = &streams[stream.index(streams.len())];
        prop_assert_eq!(run_http_steps(steps, 0, true), run_http_steps(steps, split, true));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn mutated_capture_files_never_panic(fixture in 0..FIXTURES.len(), muts in mutations()) {
        let f = &fixtures()[fixture];
        let mut bytes = std::fs::read(&f.path).expect("fixture");
        for m in &muts {
            // Header mutations are the interesting ones: bias a third of them to the start.
            let mut plan = m.plan.clone();
            if m.target % 3 == 0 {
                plan[1] %= 64;
                plan[2] = 0;
            }
            mutate(&mut bytes, &mut Plan::new(&plan));
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mutated.pcap");
        std::fs::write(&path, &bytes).expect("write");
        let mut pipeline = Pipeline::new(Limits::default());
        let mut out = Vec::new();
        let _ = mcptap::capture::read_captures(&[path.display().to_string()], &mut |pkt| {
            pipeline.handle_packet(Timestamp(pkt.ts_nanos), pkt.linktype, pkt.data, &mut out);
        });
        pipeline.finish(&mut out);
        let _ = events_of(&out);
    }
}

// ---------------------------------------------------------------------------
// (c) Parsers on random byte streams

/// Byte streams biased towards a grammar: pieces drawn from `tokens`, mixed with random bytes.
fn token_stream(tokens: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            3 => proptest::sample::select(tokens).prop_map(<[u8]>::to_vec),
            1 => proptest::collection::vec(any::<u8>(), 1..8),
        ],
        0..64,
    )
    .prop_map(|pieces| pieces.concat())
}

const SSE_TOKENS: &[&[u8]] = &[
    b"data:",
    b"data: ",
    b"event: message",
    b"event:",
    b"id: 7",
    b"id:",
    b"retry: 1500",
    b"retry: 99999999999999999999999",
    b": keepalive",
    b":",
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b" ",
    b"\xEF\xBB\xBF",
    b"\xEF\xBB",
    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",
    b"\xff\xfe",
    b"\0",
];

const CHUNK_TOKENS: &[&[u8]] = &[
    b"0",
    b"1",
    b"5",
    b"a",
    b"F",
    b"10",
    b"ffffffffffffffff",
    b"1ffffffffffffffff",
    b";ext=1",
    b";",
    b" ",
    b"\t",
    b"\r\n",
    b"\n",
    b"\r",
    b"hello",
    b"0\r\n\r\n",
    b"Trailer: x\r\n",
    b"5\r\nhello\r\n",
];

/// Split points for a stream of length `len` from arbitrary numbers.
fn pieces<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.sort_unstable();
    points.push(data.len());
    let mut out = Vec::new();
    let mut start = 0;
    for p in points {
        out.push(&data[start..p]);
        start = p;
    }
    out
}

fn sse_run(max: usize, parts: &[&[u8]]) -> (Vec<SseItem>, u64, u64, bool) {
    let mut p = SseParser::new(max);
    let mut items = Vec::new();
    for part in parts {
        p.push(part, &mut items);
    }
    let finished = p.finish();
    (items, p.overflows(), p.events_dispatched(), finished)
}

/// Runs the chunked decoder over `parts` until done or failed: the decoded bytes, the bytes
/// consumed in total, and how it ended.
fn chunked_run(parts: &[&[u8]]) -> (Vec<u8>, usize, Result<bool, ChunkedError>) {
    let mut d = ChunkedDecoder::new();
    let mut body = Vec::new();
    let mut consumed = 0;
    for part in parts {
        match d.push(part, &mut |b| body.extend_from_slice(b)) {
            Ok(status) => {
                assert!(status.consumed <= part.len());
                consumed += status.consumed;
                if status.done {
                    assert_eq!(body.len() as u64, d.body_bytes());
                    return (body, consumed, Ok(true));
                }
                assert_eq!(status.consumed, part.len(), "not done but input left over");
            }
            // How much of the failing push was consumed is not reported: compare 0.
            Err(e) => return (body, 0, Err(e)),
        }
    }
    (body, consumed, Ok(d.is_done()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sse_parser_random_bytes(
        data in prop_oneof![token_stream(SSE_TOKENS), proptest::collection::vec(any::<u8>(), 0..256)],
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        max in prop_oneof![Just(4usize * 1024 * 1024), 0usize..48],
    ) {
        let whole = sse_run(max, &[&data]);
        let split = sse_run(max, &pieces(&data, &cuts));
        let bytes = sse_run(max, &data.chunks(1).collect::<Vec<_>>());
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(&whole, &bytes);
    }

    #[test]
    fn chunked_decoder_random_bytes(
        data in prop_oneof![token_stream(CHUNK_TOKENS), proptest::collection::vec(any::<u8>(), 0..256)],
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = chunked_run(&[&data]);
        let split = chunked_run(&pieces(&data, &cuts));
        let bytes = chunked_run(&data.chunks(1).collect::<Vec<_>>());
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(&whole, &bytes);
    }

    #[test]
    fn jsonrpc_parse_random_bytes(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..256),
            token_stream(&[
                b"{", b"}", b"[", b"]", b",", b":", b"\"jsonrpc\"", b"\"2.0\"", b"\"id\"",
                b"\"method\"", b"\"params\"", b"\"result\"", b"\"error\"", b"\"code\"",
                b"\"message\"", b"null", b"1", b"-32600", b"1e400", b"\"tools/call\"",
                b"\"\\ud800\"", b"true",
            ]),
        ],
    ) {
        if let Ok(msgs) = jsonrpc::parse(&data) {
            prop_assert!(!msgs.is_empty());
        }
    }

    #[test]
    fn jsonrpc_parse_json_values(value in json_value()) {
        let text = serde_json::to_vec(&value).expect("serialise");
        let _ = jsonrpc::parse(&text);
        // Wrapped as a JSON-RPC message and as a batch of one.
        let msg = serde_json::json!({"jsonrpc": "2.0", "id": value.clone(), "result": value});
        let text = serde_json::to_vec(&msg).expect("serialise");
        let _ = jsonrpc::parse(&text);
        let batch = serde_json::to_vec(&Value::Array(vec![msg])).expect("serialise");
        let _ = jsonrpc::parse(&batch);
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("jsonrpc".to_string()),
                    Just("id".to_string()),
                    Just("method".to_string()),
                    Just("error".to_string()),
                    ".{0,6}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

// ---------------------------------------------------------------------------
// Regressions found by fuzzing (inputs in tests/regressions/)
