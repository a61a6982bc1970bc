//! Issue 11's exhaustion cases: hostile inputs that once took gigabytes or quadratic time.
//! Each replays a generated capture in a child `mcptap replay` under `/usr/bin/time` and bounds
//! its peak RSS (or its time, generously: the figures themselves live in the benchmarks).

use mcptap_testkit::mcp::hostile::{deep_long_key_capabilities, ping_batch};
use mcptap_testkit::mcp::{self, Answer, Conversation, FULL_CLIENT_CAPS};
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::Endpoint;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Budget the children run with: small, so that what escapes it shows.
const BUDGET_MIB: u64 = 64;

/// Replays `capture` with a 64 MiB budget; returns the child's peak RSS (KiB), its wall time
/// and its standard error.
fn replay_bounded(capture: &Path) -> (u64, Duration, String) {
    let time = Path::new("/usr/bin/time");
    assert!(
        time.exists(),
        "/usr/bin/time is needed (scripts/setup.sh --test installs it)"
    );
    let started = Instant::now();
    let out = Command::new(time)
        .args(["-f", "peak-rss-kib %M"])
        .arg(env!("CARGO_BIN_EXE_mcptap"))
        .arg("replay")
        .arg(capture)
        .args(["--memory-budget-bytes", &(BUDGET_MIB << 20).to_string()])
        .args(["--log-level", "error"])
        .output()
        .expect("run mcptap under /usr/bin/time");
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let rss = stderr
        .lines()
        .find_map(|l| l.strip_prefix("peak-rss-kib "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in {stderr}"));
    (rss, elapsed, stderr)
}

fn write_capture(dir: &Path, name: &str, talk: &mut Conversation) -> std::path::PathBuf {
    let mut sim = Sim::new(5);
    let conn = sim.connect(
        Endpoint::new([127, 0, 0, 2], 41000),
        Endpoint::new([127, 0, 0, 3], 8080),
        talk.take_writes(),
    );
    sim.run(vec![conn]);
    let path = dir.join(name);
    sim.write_pcap(&path).expect("write capture");
    path
}

/// A capability object of `levels` nested levels of `width` members with long keys.
fn wide_capabilities(levels: usize, width: usize) -> String {
    let key = "k".repeat(120);
    let mut v = "true".to_string();
    for level in 0..levels {
        let members: Vec<String> = (0..width)
            .map(|i| format!(r#""{key}{level}x{i}":{v}"#))
            .collect();
        v = format!("{{{}}}", members.join(","));
    }
    v
}

fn assert_within_budget(rss_kib: u64, what: &str) {
    let limit = (BUDGET_MIB + 64) * 1024;
    assert!(
        rss_kib < limit,
        "{what}: peak RSS {rss_kib} KiB over {limit} KiB"
    );
}

/// Item 12: one multi-megabyte `initialize`, rejected by the server, stays within the budget.
#[test]
fn a_huge_rejected_initialize_stays_within_the_budget() {
    let dir = tempfile::tempdir().expect("tmp");
    let caps = deep_long_key_capabilities();
    assert!(caps.len() > 3_000_000, "{}", caps.len());
    let mut talk = Conversation::new("huge-s1");
    let body = mcp::initialize_request(1, &caps, "hostile", "1");
    let request = talk.post(&body);
    let error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Invalid params"}}"#;
    let rejection = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{error}",
        error.len()
    )
    .into_bytes();
    talk.exchange(request, rejection);
    let capture = write_capture(dir.path(), "huge.pcap", &mut talk);
    let (rss, _, stderr) = replay_bounded(&capture);
    assert_within_budget(rss, "3 MB initialize");
    assert!(
        stderr.contains("limits hit: capability_paths=1"),
        "the cut is counted: {stderr}"
    );
}

/// Item 13: unanswered `initialize` requests keep their params; they are charged to the
/// budget, and the flow holding them is evicted before they exhaust memory.
#[test]
fn unanswered_initializes_are_charged_to_the_budget() {
    let dir = tempfile::tempdir().expect("tmp");
    let caps = wide_capabilities(1, 9000);
    assert!(caps.len() > 1_000_000);
    let mut talk = Conversation::new("pending-s1");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    for id in 2..60u64 {
        let body = mcp::initialize_request(id, &caps, "hostile", "1");
        let request = talk.post(&body);
        talk.exchange(request, Vec::new());
    }
    let capture = write_capture(dir.path(), "pending.pcap", &mut talk);
    let (rss, _, _) = replay_bounded(&capture);
    assert_within_budget(rss, "60 MB of unanswered initializes");
}

/// Item 14: the answers of one huge JSON-RPC batch are matched in linear time.
#[test]
fn a_huge_batch_is_matched_in_linear_time() {
    let dir = tempfile::tempdir().expect("tmp");
    let n = 60_000u64;
    let (requests, answers) = ping_batch(n);
    let mut talk = Conversation::new("batch-s1");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let request = talk.post(&requests);
    let answer = mcp::response("batch-s1", Answer::Json, &answers);
    talk.exchange(request, answer);
    let capture = write_capture(dir.path(), "batch.pcap", &mut talk);
    let (_, elapsed, stderr) = replay_bounded(&capture);
    // Quadratic matching took over a minute for this; linear takes about a second even
    // unoptimised. The bound is loose on purpose: this is no benchmark.
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}: {stderr}");
    assert!(stderr.contains(&format!("{} exchanges", n + 1)), "{stderr}");
}

/// Item 13: pipelined requests never answered hold their heads (60 KB paths here) in the
/// HTTP layer and in the session layer's open exchanges: both count against the budget.
#[test]
fn unanswered_pipelined_heads_are_charged_to_the_budget() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = format!("/mcp?{}", "p".repeat(60_000));
    let mut sim = Sim::new(6);
    let mut conns = Vec::new();
    for c in 0..8u16 {
        let mut talk = Conversation::new(&format!("heads-{c}"));
        for _ in 0..150 {
            let get = format!(
                "GET {path} HTTP/1.1\r\nHost: mcp.internal\r\nAccept: text/event-stream\r\nMcp-Session-Id: heads-{c}\r\n\r\n"
            );
            talk.exchange(get.into_bytes(), Vec::new());
        }
        conns.push(sim.connect(
            Endpoint::new([127, 0, 0, 2], 42000 + c),
            Endpoint::new([127, 0, 0, 3], 8080),
            talk.take_writes(),
        ));
    }
    sim.run(conns);
    let capture = dir.path().join("heads.pcap");
    sim.write_pcap(&capture).expect("write capture");
    let (rss, _, stderr) = replay_bounded(&capture);
    assert_within_budget(rss, "72 MB of pipelined request heads");
    assert!(stderr.contains("flows evicted: memory="), "{stderr}");
}

/// A head that spans segments is gathered in its connection's head buffer, which grows to
/// about one and a half times the head. Once the head is parsed, a long head's buffer is given
/// back, and what a connection keeps between heads is charged by its capacity: open
/// connections that each sent one long head once held it all, uncharged (2026-12-07).
#[test]
fn long_heads_leave_no_uncharged_buffers_on_open_connections() {
    use mcptap_core::decode::TcpFlags;
    use mcptap_testkit::capture::{PcapHeader, PcapWriter};
    use mcptap_testkit::{Link, Segment};
    let link = Link::Ethernet {
        vlan_tags: Vec::new(),
    };
    let dir = tempfile::tempdir().expect("tmp");
    let capture = dir.path().join("long-heads.pcap");
    let file = std::io::BufWriter::new(std::fs::File::create(&capture).expect("capture"));
    let mut w = PcapWriter::new(file, PcapHeader::nanos(link.linktype())).expect("header");
    let server: std::net::SocketAddr = "127.0.0.3:8080".parse().expect("addr");
    let flags = |syn, ack| TcpFlags {
        syn,
        ack,
        ..TcpFlags::default()
    };
    // 60 KB in 1,400-byte segments: the buffer grows to 89,600 bytes, 60 KB of them written.
    let head = format!(
        "GET /mcp?{} HTTP/1.1\r\nHost: mcp.internal\r\n\r\n",
        "p".repeat(60_000)
    );
    let answer = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
    let mut ts = 1_000_000_000i64;
    // One connection after the other, none closed: 2,400 x 60 KB written is over the budget
    // and its slack.
    for i in 0..2400u32 {
        let client: std::net::SocketAddr = format!("127.1.{}.{}:{}", i / 250, 1 + i % 250, 40000)
            .parse()
            .expect("addr");
        let mut write = |src, dst, seq: u32, ack: u32, f, payload: &[u8]| {
            ts += 1000;
            let seg = Segment {
                ts_nanos: ts,
                src,
                dst,
                seq,
                ack,
                flags: f,
                payload: payload.to_vec(),
            };
            w.write(ts, &seg.frame(&link)).expect("record");
        };
        let (c0, s0) = (1000u32, 9000u32);
        write(client, server, c0, 0, flags(true, false), b"");
        write(server, client, s0, c0 + 1, flags(true, true), b"");
        let mut seq = c0 + 1;
        for piece in head.as_bytes().chunks(1400) {
            write(client, server, seq, s0 + 1, flags(false, true), piece);
            seq += piece.len() as u32;
        }
        write(server, client, s0 + 1, seq, flags(false, true), answer);
        write(
            client,
            server,
            seq,
            s0 + 1 + answer.len() as u32,
            flags(false, true),
            b"",
        );
    }
    drop(w);
    let (rss, _, stderr) = replay_bounded(&capture);
    assert_within_budget(rss, "2,400 open connections after a 60 KB head each");
    assert!(stderr.contains("2400 flows"), "{stderr}");
}
