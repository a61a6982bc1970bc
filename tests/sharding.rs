//! Live sharding by server endpoint (`live::Dispatcher`, also behind `replay --worker-threads`):
//! whatever the port layout, N pipeline workers give the events one pipeline gives — servers
//! on ports above their clients', equal ports, servers on 64000 with clients on 1024, flows
//! first seen midstream, configured servers.

mod common;

use mcptap_core::model::Output;
use mcptap_core::pipeline::Limits;
use mcptap_testkit::capture::Frame;
use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
use mcptap_testkit::segment::Segment;
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::Endpoint;
use mcptap_testkit::{Link, pcap_bytes};

/// One port layout: the server endpoint and the client endpoint of connection `i`.
struct Layout {
    name: &'static str,
    server: Endpoint,
    client: fn(u8) -> Endpoint,
}

fn layouts() -> Vec<Layout> {
    vec![
        Layout {
            name: "server on 8080, ephemeral clients",
            server: Endpoint::new([10, 0, 0, 1], 8080),
            client: |i| Endpoint::new([10, 0, 1, i], 40000 + u16::from(i)),
        },
        Layout {
            name: "server on 64000, clients on 1024",
            server: Endpoint::new([10, 0, 0, 1], 64000),
            client: |i| Endpoint::new([10, 0, 1, i], 1024 + u16::from(i)),
        },
        Layout {
            name: "server port above its clients' (source NAT)",
            server: Endpoint::new([10, 0, 0, 1], 50000),
            client: |i| Endpoint::new([10, 0, 1, 1], 40000 + u16::from(i)),
        },
        Layout {
            name: "equal ports",
            server: Endpoint::new([10, 0, 0, 9], 5000),
            client: |i| Endpoint::new([10, 0, 1, i], 5000),
        },
        Layout {
            name: "equal ports, server address above its clients'",
            server: Endpoint::new([10, 9, 0, 9], 5000),
            client: |i| Endpoint::new([10, 0, 1, i], 5000),
        },
    ]
}

/// Frames of the connections, run one after the other, with the clock starting `offset_ns`
/// after the simulation's start; with `midstream`, the first connection's SYN and SYN-ACK are
/// not captured (mcptap started while it was open).
fn frames(
    seed: u64,
    offset_ns: i64,
    conns: Vec<(Endpoint, Endpoint, Vec<mcptap_testkit::tcp::AppWrite>, bool)>,
    midstream: bool,
) -> Vec<Frame> {
    let mut sim = Sim::new(seed).with_step(1_000_000);
    sim.advance(offset_ns);
    let mut first = None;
    for (client, server, writes, server_closes) in conns {
        first.get_or_insert((client.addr(), server.addr()));
        let mut conn = sim.connect(client, server, writes);
        if server_closes {
            conn = conn.server_closes();
        }
        sim.run(vec![conn]);
    }
    sim.frames()
        .iter()
        .filter(|f| {
            let Some(seg) = Segment::decode(f.ts_nanos, sim.linktype(), &f.data) else {
                return true;
            };
            let of_first = first
                .is_some_and(|(c, s)| (seg.src, seg.dst) == (c, s) || (seg.src, seg.dst) == (s, c));
            !(midstream && of_first && seg.flags.syn)
        })
        .cloned()
        .collect()
}

/// The incident: SSE session, a 502 and a close, reconnect from another client endpoint,
/// re-initialize narrowed on the same session, `tools/call` answered JSON: 2 alerts.
fn incident(
    l: &Layout,
    sid: &str,
    c1: u8,
    c2: u8,
) -> Vec<(Endpoint, Endpoint, Vec<mcptap_testkit::tcp::AppWrite>, bool)> {
    let mut talk = Conversation::new(sid);
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized()
        .tools_call("one", Answer::Sse)
        .tools_call_bad_gateway();
    let first = talk.take_writes();
    talk.reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
        .initialized()
        .tools_call("two", Answer::Json)
        .delete();
    vec![
        ((l.client)(c1), l.server, first, true),
        ((l.client)(c2), l.server, talk.take_writes(), false),
    ]
}

/// The capture of a layout: a session on a connection first seen midstream (before any SYN to
/// its server), the incident starting while it is under way, and a short healthy session.
/// With `split_midstream_session`, also a session that starts on a midstream connection and
/// goes on over a new one: only configured servers can keep that one whole.
fn capture(l: &Layout, split_midstream_session: bool) -> Vec<u8> {
    let mut all = frames(
        1,
        0,
        vec![(
            (l.client)(10),
            l.server,
            common::long_session("s-mid", 30, Answer::Sse),
            false,
        )],
        true,
    );
    all.extend(frames(2, 20_000_000, incident(l, "s-inc", 20, 21), false));
    all.extend(frames(
        3,
        40_000_000,
        vec![(
            (l.client)(30),
            l.server,
            common::long_session("s-ok", 2, Answer::Json),
            false,
        )],
        false,
    ));
    if split_midstream_session {
        let mut inc = incident(l, "s-split", 40, 41);
        let tail = inc.pop().expect("second connection");
        all.extend(frames(4, 5_000_000, inc, true));
        all.extend(frames(5, 200_000_000, vec![tail], false));
    }
    all.sort_by_key(|f| f.ts_nanos);
    pcap_bytes(Link::default().linktype(), &all)
}

fn events_of_one_pipeline(path: &str) -> Vec<String> {
    let (outputs, _) =
        mcptap::replay::replay_collect(&[path.to_string()], Limits::default()).expect("replay");
    let mut v: Vec<String> = outputs
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(serde_json::to_string(e).expect("json")),
            Output::Telemetry(_) | Output::Shared(_) => None,
        })
        .collect();
    v.sort();
    v
}

fn alerts(events: &[String]) -> usize {
    events
        .iter()
        .filter(|e| e.contains(r#""event":"alert""#))
        .count()
}

#[test]
fn workers_equal_one_pipeline_for_every_port_layout() {
    let dir = tempfile::tempdir().expect("tmp");
    for l in layouts() {
        for configured in [false, true] {
            let path = dir.path().join("capture.pcap");
            std::fs::write(&path, capture(&l, configured)).expect("write");
            let path = path.to_str().expect("utf-8");
            let want = events_of_one_pipeline(path);
            let expected_alerts = if configured { 4 } else { 2 };
            assert_eq!(alerts(&want), expected_alerts, "{}: {want:#?}", l.name);
            let servers = if configured {
                vec![l.server.addr()]
            } else {
                Vec::new()
            };
            for threads in [1, 2, 4] {
                let got = common::events_of_workers(path, threads, &servers, dir.path());
                assert_eq!(
                    got, want,
                    "{} (configured: {configured}) with {threads} workers",
                    l.name
                );
            }
        }
    }
}

/// The regression of issue 11: the incident with its server on port 64000 and clients on
/// 1024 raised its 2 alerts with one worker and none with two.
#[test]
fn the_incident_on_port_64000_alerts_with_two_workers() {
    let dir = tempfile::tempdir().expect("tmp");
    let l = &layouts()[1];
    let mut frames_ = frames(2, 0, incident(l, "s-inc", 1, 4), false);
    frames_.sort_by_key(|f| f.ts_nanos);
    let path = dir.path().join("incident-64000.pcap");
    std::fs::write(&path, pcap_bytes(Link::default().linktype(), &frames_)).expect("write");
    let path = path.to_str().expect("utf-8");
    let got = common::events_of_workers(path, 2, &[], dir.path());
    let kinds: Vec<&String> = got
        .iter()
        .filter(|e| e.contains(r#""event":"alert""#))
        .collect();
    assert_eq!(kinds.len(), 2, "{got:#?}");
    assert!(kinds.iter().any(|e| e.contains("capability_narrowing")));
    assert!(kinds.iter().any(|e| e.contains("content_type_divergence")));
    // The same through the command line (the hidden flag).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcptap"))
        .args(["replay", "--worker-threads", "2", path])
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches(r#""event":"alert""#).count(), 2, "{stdout}");
}

/// The legacy bursts capture in a temporary directory (kept while the guard lives).
fn bursts_capture() -> (tempfile::TempDir, [String; 1]) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bursts.pcap");
    common::write_legacy_bursts(&path);
    let paths = [path.to_str().expect("utf-8").to_string()];
    (dir, paths)
}

/// The split pipeline (`replay --threads 2`: the flow layer and the session layer on threads of
/// their own) gives the outputs of one pipeline, in the same order: many interleaved
/// connections, incidents, sessions that go idle (sweeps end them between bursts) and
/// connections left open at the end of the capture.
#[test]
fn the_split_pipeline_gives_one_pipelines_outputs_in_order() {
    let (_dir, paths) = bursts_capture();
    let limits = common::bursts_limits();
    let (whole, whole_report) = mcptap::replay::replay_collect(&paths, limits).expect("replay");
    let alerts = whole
        .iter()
        .filter(|o| matches!(o, Output::Event(mcptap_core::model::Event::Alert(_))))
        .count();
    let idle_ends = whole
        .iter()
        .filter(|o| {
            matches!(o, Output::Event(mcptap_core::model::Event::SessionEnd(e))
                if e.reason == mcptap_core::model::EndReason::Idle)
        })
        .count();
    // What the comparison covers: alerts, sessions ended by a sweep, and thousands of outputs.
    assert!(alerts >= 18, "{alerts} alerts");
    assert!(idle_ends >= 6, "{idle_ends} idle session ends");
    assert!(whole.len() > 1000, "{} outputs", whole.len());
    // The flow layer on the flow thread (0), or sharded by connection over threads of its own.
    for flow_threads in 0..=3 {
        let mut split = Vec::new();
        let split_report = mcptap::replay::replay_split(
            &paths,
            limits,
            Default::default(),
            flow_threads,
            &mut mcptap::progress::ReplayProgress::hidden(),
            None,
            &mut |o: &Output, _| split.push(o.clone()),
        )
        .expect("split replay");
        assert_eq!(
            whole_report.stats, split_report.stats,
            "{flow_threads} flow threads"
        );
        assert_eq!(whole_report.span, split_report.span);
        for (i, (w, s)) in whole.iter().zip(&split).enumerate() {
            assert_eq!(w, s, "output {i}, {flow_threads} flow threads");
        }
        assert_eq!(whole.len(), split.len(), "{flow_threads} flow threads");
    }
}

/// The split's rendering goes to whichever thread has time: while staged input waits for the
/// session thread, it leaves its outputs' lines to the flow thread. Here the session thread is
/// made slow (its prepare sleeps), so both happen; the lines are the same bytes either way.
#[test]
fn a_session_thread_that_falls_behind_leaves_rendering_to_the_flow_thread() {
    let (_dir, paths) = bursts_capture();
    let limits = common::bursts_limits();
    let mut expected = Vec::new();
    mcptap::replay::replay(&paths, limits, Default::default(), &mut |o| {
        if let Output::Event(ev) = o {
            mcptap::sink::ndjson::render_line(ev, &mut expected).expect("render");
        }
    })
    .expect("replay");
    // The first rendering waits long enough for the flow thread to stage several more
    // batches (milliseconds of work in release, a few hundred in a debug build on a busy
    // machine), so that the session thread finds input waiting when it comes back.
    let first = std::sync::atomic::AtomicBool::new(true);
    let prepare = |o: &mut Output, into: Option<mcptap::replay::RenderInto<'_>>| {
        if let (Output::Event(ev), Some(into)) = (o, into) {
            let pause = if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                std::time::Duration::from_millis(1500)
            } else {
                std::time::Duration::from_micros(200)
            };
            std::thread::sleep(pause);
            mcptap::sink::ndjson::render_line(ev, into.line).expect("render");
            mcptap::sink::log::render_event_line(ev, into.log);
        }
    };
    // Handshake log lines are rendered there too when they are written directly and enabled
    // (as `mcptap` sets up logging to a file): this test binary's only subscriber.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .with_max_level(tracing::Level::INFO)
        .try_init();
    use mcptap::sink::handshake_line::{LineFormat, write, write_directly};
    write_directly(LineFormat::Text);
    let unstamped = |line: &[u8]| line.get(27..).unwrap_or_default().to_vec();
    let mut logs_rendered_there = 0;
    let (mut got, mut rendered_there, mut rendered_here) = (Vec::new(), 0, 0);
    mcptap::replay::replay_split(
        &paths,
        limits,
        Default::default(),
        0,
        &mut mcptap::progress::ReplayProgress::hidden(),
        Some(&prepare),
        &mut |o: &Output, prepared: mcptap::replay::Prepared<'_>| {
            if let Output::Event(ev) = o {
                let line = prepared.line;
                if line.is_empty() {
                    rendered_here += 1;
                    mcptap::sink::ndjson::render_line(ev, &mut got).expect("render");
                } else {
                    rendered_there += 1;
                    got.extend_from_slice(line);
                }
                // A handshake rendered there has its log line, as the direct writer makes it.
                if let (mcptap_core::model::Event::Handshake(h), false) = (ev, line.is_empty()) {
                    let mut want = Vec::new();
                    write(
                        LineFormat::Text,
                        mcptap_core::model::Timestamp(0),
                        h,
                        &mut want,
                    );
                    assert_eq!(unstamped(prepared.log), unstamped(&want));
                    logs_rendered_there += 1;
                }
                if !matches!(ev, mcptap_core::model::Event::Handshake(_)) {
                    assert!(prepared.log.is_empty(), "a log line for {ev:?}");
                }
            }
        },
    )
    .expect("split replay");
    assert!(
        logs_rendered_there > 0,
        "the session thread rendered no log line"
    );
    assert!(rendered_there > 0, "the session thread rendered nothing");
    assert!(rendered_here > 0, "the flow thread rendered nothing");
    assert!(got == expected, "the lines differ");
}
