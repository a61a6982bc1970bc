//! Reading a capture file down to its TCP segments, shared by the integration tests (building
//! frames and capture files lives in mcptap-testkit).
//!
//! Each test binary uses only part of this module, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::path::Path;

use mcptap::capture::{RawPacket, read_captures};
use mcptap_core::pipeline::Limits;
use mcptap_testkit::Segment;
use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::{AppWrite, Endpoint};

/// Every `.pcap` fixture in `tests/fixtures`, sorted (at least 30 of them).
pub fn fixture_pcaps() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut fixtures: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 30, "{} fixtures", fixtures.len());
    fixtures
}

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

/// The events of `path` replayed through the daemon's worker path with `threads` workers (and
/// `servers` configured), one NDJSON line each, sorted: workers emit in no fixed order. The
/// workers run split (flow and session layers on two threads each, as `run` by default),
/// whole, and split with their flow layers sharded by connection, their session layers by
/// client, or both: all must give the same events.
pub fn events_of_workers(
    path: &str,
    threads: usize,
    servers: &[std::net::SocketAddr],
    dir: &Path,
) -> Vec<String> {
    use mcptap::daemon::WorkerLayout;
    let layout = |split, flow_threads, session_threads| WorkerLayout {
        split,
        flow_threads,
        session_threads,
    };
    let split = worker_events(path, threads, layout(true, 0, 1), servers, dir);
    for other in [
        layout(false, 0, 1),
        layout(true, 2, 1),
        layout(true, 0, 3),
        layout(true, 2, 2),
    ] {
        let got = worker_events(path, threads, other, servers, dir);
        assert_eq!(split, got, "workers of {other:?} differ from split ones");
    }
    split
}

fn worker_events(
    path: &str,
    threads: usize,
    layout: mcptap::daemon::WorkerLayout,
    servers: &[std::net::SocketAddr],
    dir: &Path,
) -> Vec<String> {
    let out = dir.join(format!(
        "w{threads}-{}-{}-{}.ndjson",
        layout.split, layout.flow_threads, layout.session_threads
    ));
    let out = out.to_str().expect("utf-8");
    let _ = std::fs::remove_file(out);
    let r = mcptap::daemon::replay_through_workers(
        &[path.to_string()],
        mcptap_core::pipeline::Limits::default(),
        Default::default(),
        threads,
        layout,
        servers,
        Some(out),
    )
    .expect("worker replay");
    assert!(r.read.truncations.is_empty());
    let text = std::fs::read_to_string(out).expect("events");
    let mut lines: Vec<&str> = text.lines().collect();
    // The workers' totals close the file, once, and count what they wrote.
    let summary = lines.pop().unwrap_or_default();
    let totals: serde_json::Value = serde_json::from_str(summary).expect("summary JSON");
    assert_eq!(totals["event"], "summary", "{summary}");
    assert_eq!(totals["packets"], r.stats.packets, "{summary}");
    let alerts = lines
        .iter()
        .filter(|l| l.contains(r#""event":"alert""#))
        .count() as u64;
    let counted: u64 = totals["alerts"].as_object().map_or(0, |m| {
        m.values().filter_map(serde_json::Value::as_u64).sum()
    });
    assert_eq!(counted, alerts, "{summary}");
    let mut v: Vec<String> = lines.into_iter().map(str::to_string).collect();
    v.sort();
    v
}

/// A free TCP port on 127.0.0.1 (bound and released: free when asked, almost always after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A throwaway redis-server, killed when dropped.
pub struct Redis {
    child: std::process::Child,
    pub port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts redis-server on `port` listening on `bind`, with its files in `dir`; `None` where
/// Debian's package is not installed (CI installs it: scripts/setup.sh --test). Waits until it
/// accepts connections on the first address.
pub fn start_redis(bind: &[String], port: u16, dir: &Path) -> Option<Redis> {
    use std::time::{Duration, Instant};
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind"])
        .args(bind)
        .args([
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let redis = Redis { child, port };
    let first = bind.first().map_or("127.0.0.1", String::as_str);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect((first, port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(redis)
}

/// A long session on one connection.
pub fn long_session(sid: &str, calls: usize, answer: Answer) -> Vec<AppWrite> {
    let mut talk = Conversation::new(sid);
    let tools = match answer {
        Answer::Sse => r#"{"streaming":true}"#,
        Answer::Json => r#"{"streaming":false}"#,
    };
    talk.initialize(FULL_CLIENT_CAPS, tools, answer)
        .initialized();
    for i in 0..calls {
        talk.tools_call(&format!("r{i}"), answer);
    }
    // Its end counts the session's handshakes and requests: a session split over two
    // workers shows.
    talk.delete();
    talk.take_writes()
}

/// Six bursts of twelve clients of one stateful server, with incidents, sessions left to go
/// idle (a sweep between bursts ends them, with [`bursts_limits`]) and connections left open
/// at the end of the capture; written to `path`.
pub fn write_legacy_bursts(path: &Path) {
    legacy_bursts().write_pcap(path).expect("write");
}

/// The conversations of [`write_legacy_bursts`], simulated.
pub fn legacy_bursts() -> Sim {
    let server = Endpoint::new([10, 0, 0, 1], 8080);
    let mut sim = Sim::new(7).with_step(200_000);
    for burst in 0u8..6 {
        let mut conns = Vec::new();
        for i in 0u8..12 {
            let client = Endpoint::new([10, 1, burst, i], 40000 + u16::from(i));
            let sid = format!("b{burst}-s{i}");
            let writes = if i % 4 == 0 {
                let mut talk = Conversation::new(&sid);
                talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
                    .initialized()
                    .tools_call("one", Answer::Sse)
                    .reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
                    .tools_call("two", Answer::Json);
                talk.take_writes()
            } else if i % 3 == 0 {
                // No DELETE: the session goes idle and a later sweep ends it.
                let mut talk = Conversation::new(&sid);
                talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
                    .initialized()
                    .tools_call("quiet", Answer::Sse);
                talk.take_writes()
            } else {
                long_session(&sid, usize::from(i % 5), Answer::Json)
            };
            let conn = sim.connect(client, server, writes);
            conns.push(if i % 2 == 0 {
                conn.server_closes()
            } else {
                conn
            });
        }
        sim.run(conns);
        // Longer than the idle timeouts below: the next burst's first packets sweep.
        sim.advance(20_000_000_000);
    }
    sim
}

/// Idle timeouts shorter than the gaps between the bursts of [`write_legacy_bursts`].
pub fn bursts_limits() -> Limits {
    let mut limits = Limits::default();
    limits.session.session_idle_timeout_ns = 5_000_000_000;
    limits.flow_idle_timeout_ns = 5_000_000_000;
    limits
}
