//! The flow layer sharded by connection (`docs/sharding.md`, step 3): a dispatcher numbers the
//! packets and keeps the clock, N flow shards take the packets of their connections, and their
//! staged steps, merged round by round, feed the session layer. The outputs must be one
//! pipeline's, in its order, whatever the number of shards and wherever the rounds end:
//! serially here (every interleaving of rounds is one the threads may produce), and on threads
//! through `replay --threads`'s own code.

mod common;

use std::path::Path;
use std::sync::Arc;

use mcptap_core::decode::{Decoded, decode};
use mcptap_core::flow_shard::{
    FlowDispatcher, FlowMerge, FlowPhase, FlowRound, FlowUnit, merge_rounds,
};
use mcptap_core::model::{EndReason, Event, Output, Telemetry, Timestamp};
use mcptap_core::pipeline::{Analysis, Limits, PacketStats, Pipeline, Staged};
use mcptap_core::usage::SharedUsage;
use mcptap_testkit::Frame;
use mcptap_testkit::sim::replay_frames;

/// What a serial run through flow shards gave.
#[derive(Default)]
struct Sharded {
    outputs: Vec<Output>,
    stats: PacketStats,
    /// Units the shards marked, per phase.
    idle_units: usize,
    held_units: usize,
    /// Packets each shard took.
    packets: Vec<u64>,
}

/// `frames` through a dispatcher, `shards` flow shards and one session stage, a round every
/// `round` packets merged whole ([`merge_rounds`]); or, with `round` 0, each source's steps
/// taken after every packet and merged by watermarks ([`FlowMerge`]), source `i` answering
/// every `i + 1` packets and the dispatcher every third: the shards far apart. With `quiet`,
/// time passes between packets far apart (see [`quiet_times`]).
fn flow_sharded(
    linktype: u32,
    frames: &[Frame],
    limits: Limits,
    (shards, round): (usize, usize),
    quiet: bool,
) -> Sharded {
    let usage: Arc<SharedUsage> = Arc::default();
    let (mut flows, mut stages) =
        Pipeline::split_flows(limits, Analysis::default(), Arc::clone(&usage), shards, 1);
    assert_eq!(flows.len(), shards);
    let mut stage = stages.pop().expect("one session stage");
    let mut dispatcher = FlowDispatcher::new(&limits, shards, Arc::clone(&usage));
    let mut got = Sharded {
        packets: vec![0; shards],
        ..Sharded::default()
    };
    let mut out = Vec::new();
    let mut merge = FlowMerge::new(shards + 1);
    let mut waiting: Vec<Vec<(FlowRound, FlowUnit)>> = (0..=shards).map(|_| Vec::new()).collect();
    let mut parts = |flows: &mut Vec<Pipeline>,
                     dispatcher: &mut FlowDispatcher,
                     got: &mut Sharded,
                     i: usize,
                     end: bool| {
        let mut merged: Vec<Staged> = Vec::new();
        // Every source has done every packet dispatched: that is its watermark.
        let passed = dispatcher.passed();
        for (source, flow) in flows.iter_mut().enumerate() {
            let part = flow.take_flow_round(FlowRound::default());
            for (_, unit) in &part.marks {
                got.idle_units += usize::from(unit.phase == FlowPhase::Idle);
                got.held_units += usize::from(unit.phase == FlowPhase::Held);
            }
            waiting[source].push((part, passed));
        }
        waiting[shards].push((dispatcher.take_round(FlowRound::default()), passed));
        for (source, parts) in waiting.iter_mut().enumerate() {
            let every = if source == shards { 3 } else { source + 1 };
            if end || (i + 1).is_multiple_of(every) {
                for (part, passed) in parts.drain(..) {
                    merge.push(source, part, passed);
                    merge.merge(&mut merged, usize::MAX, &mut |_, _| {});
                }
            }
        }
        merged
    };
    let end_round =
        |flows: &mut Vec<Pipeline>, dispatcher: &mut FlowDispatcher, got: &mut Sharded| {
            let mut rounds: Vec<FlowRound> = flows
                .iter_mut()
                .map(|f| f.take_flow_round(FlowRound::default()))
                .collect();
            for r in &rounds {
                for (_, unit) in &r.marks {
                    got.idle_units += usize::from(unit.phase == FlowPhase::Idle);
                    got.held_units += usize::from(unit.phase == FlowPhase::Held);
                }
            }
            rounds.push(dispatcher.take_round(FlowRound::default()));
            let mut merged = Vec::new();
            merge_rounds(&mut rounds, &mut merged);
            merged
        };
    for (i, f) in frames.iter().enumerate() {
        for now in quiet_times(frames, i).into_iter().filter(|_| quiet) {
            if let Some((seq, now)) = dispatcher.advance(now) {
                for shard in &mut flows {
                    shard.shard_sweep(seq, now, &mut out);
                }
            }
        }
        let d = dispatcher.dispatch(Timestamp(f.ts_nanos), linktype, &f.data);
        flows[d.shard].shard_packet(d.at, linktype, &f.data, &mut out);
        got.packets[d.shard] += 1;
        if let Some(now) = d.sweep {
            for shard in &mut flows {
                shard.shard_sweep(d.at.seq, now, &mut out);
            }
        }
        assert!(out.is_empty(), "a shard left outputs unstaged");
        let steps = if round == 0 {
            parts(&mut flows, &mut dispatcher, &mut got, i, false)
        } else if (i + 1) % round == 0 {
            end_round(&mut flows, &mut dispatcher, &mut got)
        } else {
            Vec::new()
        };
        for step in steps {
            stage.process(step, &mut got.outputs);
        }
    }
    let now = dispatcher.finish();
    for shard in &mut flows {
        shard.shard_finish(now, &mut out);
    }
    let steps = if round == 0 {
        parts(&mut flows, &mut dispatcher, &mut got, frames.len(), true)
    } else {
        end_round(&mut flows, &mut dispatcher, &mut got)
    };
    for step in steps {
        stage.process(step, &mut got.outputs);
    }
    // As every caller does after a batch: the steps done stop counting as waiting.
    stage.publish_usage();
    for shard in &flows {
        got.stats.merge(shard.stats());
    }
    // Every staged step was counted while it waited, and done.
    assert_eq!(usage.staged_bytes(), 0, "staged bytes left counted");
    got
}

/// A live link gone quiet: time passes without packets 1.5 s and 6 s after a packet, when the
/// next one comes later: a sweep is due each time (held segments let go first, idle flows and
/// sessions later, between the same two packets).
fn quiet_times(frames: &[Frame], i: usize) -> Vec<Timestamp> {
    let Some(before) = i.checked_sub(1).and_then(|b| frames.get(b)) else {
        return Vec::new();
    };
    let gap = frames[i].ts_nanos.saturating_sub(before.ts_nanos);
    [1_500_000_000, 6_000_000_000]
        .into_iter()
        .filter(|&d| d < gap)
        .map(|d| Timestamp(before.ts_nanos + d))
        .collect()
}

fn assert_same(got: &[Output], want: &[Output], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}, output {i}");
    }
    assert_eq!(got.len(), want.len(), "{what}");
}

/// One pipeline's outputs and packet counts, and the same through 1 to 4 flow shards with
/// rounds of one packet, a few and many, and merged by watermarks from parts.
fn assert_flow_shards_agree(
    linktype: u32,
    frames: &[Frame],
    limits: Limits,
    what: &str,
) -> Vec<Sharded> {
    let mut pipeline = Pipeline::new(limits);
    let mut whole = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        for now in quiet_times(frames, i) {
            pipeline.advance_time(now, &mut whole);
        }
        pipeline.handle_packet(Timestamp(f.ts_nanos), linktype, &f.data, &mut whole);
    }
    pipeline.finish(&mut whole);
    let mut runs = Vec::new();
    for shards in 1..=4 {
        for round in [1, 7, 4096, 0] {
            let got = flow_sharded(linktype, frames, limits, (shards, round), true);
            let what = format!("{what}: {shards} flow shards, rounds of {round}");
            assert_same(&got.outputs, &whole, &what);
            assert_eq!(&got.stats, pipeline.stats(), "{what}");
            runs.push(got);
        }
    }
    runs
}

/// `frames` replayed on threads with 1 to `flow_threads` flow shards, the session layer split
/// and in `session_shards` shards: each gives `whole`.
fn assert_threads_agree(
    linktype: u32,
    frames: &[Frame],
    limits: Limits,
    whole: &[Output],
    flow_threads: std::ops::RangeInclusive<usize>,
    session_shards: usize,
    name: &str,
) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join(format!("{name}.pcap"));
    std::fs::write(&path, mcptap_testkit::capture::pcap_bytes(linktype, frames)).expect("write");
    let paths = [path.display().to_string()];
    for flow_threads in flow_threads {
        let mut got = Vec::new();
        mcptap::replay::replay_split(
            &paths,
            limits,
            Analysis::default(),
            flow_threads,
            &mut mcptap::progress::ReplayProgress::hidden(),
            None,
            &mut |o: &Output, _| got.push(o.clone()),
        )
        .expect("replay");
        assert_same(&got, whole, &format!("{name}: {flow_threads} flow threads"));
        let mut got = Vec::new();
        mcptap::sharded::replay_sharded(
            &paths,
            limits,
            Analysis::default(),
            (flow_threads, session_shards),
            &mut mcptap::progress::ReplayProgress::hidden(),
            &mut |o: &Output| got.push(o.clone()),
        )
        .expect("replay");
        assert_same(
            &got,
            whole,
            &format!("{name}: {flow_threads} flow threads, {session_shards} session shards"),
        );
    }
}

fn frames_of(path: &Path) -> (u32, Vec<Frame>) {
    let mut linktype = 0;
    let mut frames = Vec::new();
    mcptap::capture::read_captures(&[path.display().to_string()], &mut |pkt| {
        linktype = pkt.linktype;
        frames.push(Frame {
            ts_nanos: pkt.ts_nanos,
            data: pkt.data.to_vec(),
        });
    })
    .expect("read");
    (linktype, frames)
}

#[test]
fn every_fixture_gives_one_pipelines_outputs_through_flow_shards() {
    for f in common::fixture_pcaps() {
        let (linktype, frames) = frames_of(&f);
        assert_flow_shards_agree(
            linktype,
            &frames,
            Limits::default(),
            &f.display().to_string(),
        );
    }
}

/// Many connections of one upstream, made hard: the server's tap 5 ms early (answers wait for
/// their requests), requests lost (answers held until a sweep lets them go on), a lone
/// far-future timestamp (ignored) and a gap the clock follows (every flow idles out at once,
/// in every shard), sessions idle between bursts, connections open at the end.
#[test]
fn sweeps_clock_jumps_and_held_segments_come_out_in_one_pipelines_order() {
    let sim = common::legacy_bursts();
    let linktype = sim.linktype();
    let mut frames: Vec<Frame> = sim.frames().to_vec();
    // Three connections of the first burst lose their last request and end right after the
    // answer: it waits for bytes that never come, until a sweep lets it go on ...
    for host in [1u8, 2, 5] {
        let client = std::net::SocketAddr::from(([10, 1, 0, host], 40000 + u16::from(host)));
        let of_conn: Vec<(usize, bool, bool)> = frames
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match decode(linktype, &f.data) {
                Decoded::Tcp(seg) if seg.src == client || seg.dst == client => {
                    Some((i, seg.src == client, !seg.payload.is_empty()))
                }
                _ => None,
            })
            .collect();
        let lost = of_conn
            .iter()
            .rev()
            .find(|(_, from_client, data)| *from_client && *data)
            .map(|c| c.0)
            .expect("a request");
        let answer = of_conn
            .iter()
            .find(|(i, from_client, data)| *i > lost && !from_client && *data)
            .map(|c| c.0)
            .expect("an answer");
        let gone: Vec<usize> = of_conn
            .iter()
            .map(|c| c.0)
            .filter(|&i| i == lost || i > answer)
            .collect();
        let mut i = 0;
        frames.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
    }
    // ... which comes with a slow client's packets a quarter of a second apart.
    let mut ticker = mcptap_testkit::sim::Sim::new(99).with_step(250_000_000);
    let conn = ticker.connect(
        mcptap_testkit::tcp::Endpoint::new([10, 9, 9, 9], 50000),
        mcptap_testkit::tcp::Endpoint::new([10, 0, 0, 1], 8080),
        common::long_session("ticker", 4, mcptap_testkit::mcp::Answer::Json),
    );
    ticker.run(vec![conn.server_closes()]);
    frames.extend(ticker.frames().iter().cloned());
    let mut requests = 0;
    frames.retain_mut(|f| {
        let Decoded::Tcp(seg) = decode(linktype, &f.data) else {
            return true;
        };
        if seg.src.port() == 8080 {
            f.ts_nanos -= 5_000_000;
            return true;
        }
        if seg.payload.is_empty() {
            return true;
        }
        requests += 1;
        requests % 41 != 0
    });
    frames.sort_by_key(|f| f.ts_nanos);
    let hour = 3_600_000_000_000i64;
    let third = frames.len() / 3;
    frames[third].ts_nanos += 10 * hour;
    for f in &mut frames[2 * third..2 * third + 4] {
        f.ts_nanos += hour;
    }
    for f in &mut frames[2 * third + 4..] {
        f.ts_nanos += hour;
    }
    let limits = common::bursts_limits();
    let whole = replay_frames(linktype, &frames, Pipeline::new(limits));
    // What the comparison covers.
    let jumps: Vec<bool> = whole
        .iter()
        .filter_map(|o| match o {
            Output::Telemetry(Telemetry::ClockJump { followed, .. }) => Some(*followed),
            _ => None,
        })
        .collect();
    assert!(jumps.contains(&true) && jumps.contains(&false), "{jumps:?}");
    let idle_ends = whole
        .iter()
        .filter(|o| matches!(o, Output::Event(Event::SessionEnd(e)) if e.reason == EndReason::Idle))
        .count();
    assert!(idle_ends >= 6, "{idle_ends} idle session ends");
    let runs = assert_flow_shards_agree(linktype, &frames, limits, "bursts");
    for run in &runs {
        assert!(run.idle_units >= 5, "{} idle units", run.idle_units);
        assert!(run.held_units >= 1, "{} held units", run.held_units);
        eprintln!("{} idle, {} held", run.idle_units, run.held_units);
    }
    // With four shards every shard takes a share of one upstream's connections.
    let four = runs.last().expect("runs");
    let all: u64 = four.packets.iter().sum();
    assert!(
        four.packets.iter().all(|&p| p * 8 > all),
        "{:?}",
        four.packets
    );

    // The same on threads: `replay --threads` with the flow layer sharded, the session layer
    // split or sharded too.
    assert_threads_agree(linktype, &frames, limits, &whole, 1..=3, 2, "hard");
}

/// A limit hit: with `max_flows` below what the bursts hold at once, each flow shard evicts
/// within its share of the flows. Where one pipeline's outputs and the shards' then part, the
/// shards' are still the same from one run to the next, on threads as serially: the shards'
/// evictions depend on their own flows, not on how far the others have come.
#[test]
fn a_flow_limit_hit_gives_the_same_outputs_from_run_to_run() {
    let sim = common::legacy_bursts();
    let linktype = sim.linktype();
    let frames = sim.frames().to_vec();
    let mut limits = common::bursts_limits();
    limits.max_flows = 8;
    let whole = replay_frames(linktype, &frames, Pipeline::new(limits));
    let evicted = |outputs: &[Output]| {
        outputs
            .iter()
            .filter(|o| matches!(o, Output::Telemetry(Telemetry::FlowEvicted { .. })))
            .count()
    };
    assert!(evicted(&whole) > 0, "the limit is hit");
    let serial = flow_sharded(linktype, &frames, limits, (2, 4096), false).outputs;
    assert!(evicted(&serial) > 0);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bursts.pcap");
    std::fs::write(
        &path,
        mcptap_testkit::capture::pcap_bytes(linktype, &frames),
    )
    .expect("write");
    let paths = [path.display().to_string()];
    for run in 0..3 {
        let mut got = Vec::new();
        mcptap::replay::replay_split(
            &paths,
            limits,
            Analysis::default(),
            2,
            &mut mcptap::progress::ReplayProgress::hidden(),
            None,
            &mut |o: &Output, _| got.push(o.clone()),
        )
        .expect("replay");
        assert_same(&got, &serial, &format!("run {run}"));
    }
}

/// Text of `len` bytes that gzip takes down about 150 times: within the 200x guard on
/// decompressed bodies, so every body is decoded.
fn bulky_text(len: usize) -> String {
    let mut text = String::with_capacity(len + 401);
    let mut x = 0x2545_f491_u32;
    while text.len() < len {
        text.push_str(&"A".repeat(400));
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        text.push(char::from(b"0123456789abcdef"[(x >> 16) as usize % 16]));
    }
    text
}

/// `docs/sharding.md`, step 3, "Staged steps and the budget": gzip-compressed answers of
/// 256 KiB on six connections at once, at a budget of 4 MiB, which one pipeline keeps within
/// (each gzip decoder charged for what a member's header may make it hold, 272 KiB). A
/// shard stages the decoded bodies of many answers per round; they wait for the session layer
/// in bounded queues and must not make the shards evict flows (which would free none of
/// them): the outputs are one pipeline's, with no eviction, on threads as serially.
#[test]
fn gzip_bodies_at_a_tight_budget_give_one_pipelines_outputs_through_flow_shards() {
    use mcptap_testkit::exchange::{gzip, gzip_json_response};
    use mcptap_testkit::mcp::{
        Answer, Conversation, FULL_CLIENT_CAPS, tool_result, tools_call_request,
    };
    use mcptap_testkit::tcp::Endpoint;
    let text = bulky_text(256 << 10);
    let ratio = text.len() / gzip(text.as_bytes()).len();
    assert!((100..200).contains(&ratio), "{ratio}x");
    let server = Endpoint::new([10, 0, 0, 1], 8080);
    let mut sim = mcptap_testkit::sim::Sim::new(5).with_step(50_000);
    let mut conns = Vec::new();
    for i in 0u8..6 {
        let mut talk = Conversation::new(&format!("gz{i}"));
        talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Json)
            .initialized();
        for _ in 0..4 {
            let id = talk.take_request_id();
            let request = talk.post(&tools_call_request(id, "fetch", "{}"));
            let answer = gzip_json_response(talk.session_id(), &tool_result(id, &text));
            talk.exchange(request, answer);
        }
        talk.delete();
        let client = Endpoint::new([10, 2, 0, i], 41000 + u16::from(i));
        conns.push(sim.connect(client, server, talk.take_writes()));
    }
    sim.run(conns);
    let linktype = sim.linktype();
    let frames = sim.frames().to_vec();
    let limits = Limits {
        memory_budget_bytes: 4 << 20,
        ..Limits::default()
    };
    let whole = replay_frames(linktype, &frames, Pipeline::new(limits));
    let calls = whole
        .iter()
        .filter(|o| matches!(o, Output::Event(Event::Exchange(e)) if e.method == "tools/call"))
        .count();
    assert_eq!(calls, 24, "one pipeline keeps every exchange");
    assert!(
        !whole
            .iter()
            .any(|o| matches!(o, Output::Telemetry(Telemetry::FlowEvicted { .. }))),
        "one pipeline evicts nothing"
    );
    for shards in [1, 2] {
        for round in [4096, 0] {
            let got = flow_sharded(linktype, &frames, limits, (shards, round), false);
            assert_same(
                &got.outputs,
                &whole,
                &format!("{shards} shards, round {round}"),
            );
        }
    }
    assert_threads_agree(linktype, &frames, limits, &whole, 1..=2, 1, "gzip");
}
