//! Deterministic generator of the reference captures used by `scripts/bench.sh`.
//!
//! A `harness = false` bench target so it builds with the bench profile and needs nothing
//! outside `benches/`. It does nothing unless given `--out`, so a plain `cargo bench` skips it:
//!
//! ```text
//! cargo bench --bench gen_capture -- --out target/bench-data --seed 1 --mixed-mb 1024 --mcp-mb 256
//! ```
//!
//! writes `mixed-<MB>MB-seed<SEED>.pcap` and `mcp-<MB>MB-seed<SEED>.pcap` (classic pcap,
//! Ethernet, IPv4; a size of 0 skips that file). Same seed and sizes give the same bytes.
//!
//! * mixed: ~90% of the bytes are non-MCP bulk TCP (2/3 TLS-like application-data records on
//!   port 443, 1/3 plain HTTP file downloads on port 80), ~10% MCP sessions on port 8080.
//! * mcp: every byte is MCP over HTTP (Streamable HTTP: POST + JSON or chunked SSE answers).
//!
//! MCP sessions: initialize, notifications/initialized, sometimes tools/list, 1-40 tools/call
//! (answered as chunked `text/event-stream` or `application/json` with Content-Length depending
//! on the server; some SSE answers carry progress notifications first), usually DELETE. One
//! session in 40 replays the incident: 502 + close, reconnect, re-initialize on the same
//! session id with narrowed capabilities, tools/call answered as JSON from then on.
//! Connections are interleaved packet by packet, with handshakes, 1448-byte segments, delayed
//! ACKs and FIN exchanges; timestamps advance as on a 1 Gbit/s link.
//!
//! With `--flood`, writes only the flood capture used by `scripts/flood.sh` instead:
//!
//! ```text
//! cargo bench --bench gen_capture -- --out target/bench-data --seed 1 --flood \
//!     [--flood-flows 1000000] [--flood-sessions 100000]
//! ```
//!
//! `flood-<FLOWS>f-<SESSIONS>s-seed<SEED>.pcap`: a SYN flood of FLOWS distinct TCP flows,
//! SESSIONS short MCP connections each minting a distinct `Mcp-Session-Id`, and one faulty
//! session (the incident) in the middle; see `support/flood.rs`.
//!
//! With `--gateway N`, writes only the gateway-shaped capture of N conversations
//! (`gateway-<N>s-seed<SEED>.pcap`: many short sessions in small packets to one or two
//! upstreams, legacy and modern, a few incidents; see `support/gateway.rs`).
//!
//! With `--adversarial NAME` (or `all`), writes only issue 11's exhaustion captures used by
//! `scripts/exhaustion-bench.sh` instead, one per case:
//!
//! ```text
//! cargo bench --bench gen_capture -- --out target/bench-data --seed 1 --adversarial all
//! ```
//!
//! `adv-<NAME>-seed<SEED>.pcap`; the cases (`huge-initialize`, `unanswered-initializes`,
//! `pipelined-heads`, `lineage-client-info`, `batch-64k`, `batch-90k`, `open-requests-10k`,
//! `open-requests-40k`) are described in `support/adversarial.rs`.

mod support;

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use mcptap_testkit::capture::{PcapHeader, PcapWriter};
use support::{adversarial, flood, gateway, traffic};

struct Args {
    out: PathBuf,
    seed: u64,
    mixed_mb: u64,
    mcp_mb: u64,
    flood: bool,
    flood_flows: u64,
    flood_sessions: u64,
    adversarial: Vec<String>,
    fleet_pair: u64,
    gateway: u64,
}
fn parse_args() -> Option<Args> {
    let raw: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if !raw.iter().any(|a| a == "--out") {
        return None;
    }
    let mut args = Args {
        out: PathBuf::from("target/bench-data"),
        seed: 1,
        mixed_mb: 1024,
        mcp_mb: 256,
        flood: false,
        flood_flows: 1_000_000,
        flood_sessions: 100_000,
        adversarial: Vec::new(),
        fleet_pair: 0,
        gateway: 0,
    };
    let mut it = raw.into_iter();
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| die(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--out" => args.out = PathBuf::from(val()),
            "--seed" => args.seed = val().parse().unwrap_or_else(|_| die("bad --seed")),
            "--mixed-mb" => args.mixed_mb = val().parse().unwrap_or_else(|_| die("bad --mixed-mb")),
            "--mcp-mb" => args.mcp_mb = val().parse().unwrap_or_else(|_| die("bad --mcp-mb")),
            "--flood" => args.flood = true,
            "--fleet-pair" => {
                args.fleet_pair = val()
                    .parse()
                    .ok()
                    .filter(|n| (1..=1_000_000).contains(n))
                    .unwrap_or_else(|| die("bad --fleet-pair (1..=1000000 sessions)"))
            }
            "--gateway" => {
                args.gateway = val()
                    .parse()
                    .ok()
                    .filter(|n| (1..=10_000_000).contains(n))
                    .unwrap_or_else(|| die("bad --gateway (1..=10000000 sessions)"))
            }
            "--flood-flows" => {
                args.flood_flows = val()
                    .parse()
                    .ok()
                    .filter(|n| *n <= 1 << 22)
                    .unwrap_or_else(|| die("bad --flood-flows (at most 4194304)"))
            }
            "--flood-sessions" => {
                args.flood_sessions = val()
                    .parse()
                    .ok()
                    .filter(|n| *n < 0xdead_beef)
                    .unwrap_or_else(|| die("bad --flood-sessions"))
            }
            "--adversarial" => {
                let name = val();
                if name == "all" {
                    args.adversarial
                        .extend(adversarial::CASES.iter().map(|c| c.to_string()));
                } else if adversarial::CASES.contains(&name.as_str()) {
                    args.adversarial.push(name);
                } else {
                    die(&format!(
                        "unknown --adversarial case {name} (all, {})",
                        adversarial::CASES.join(", ")
                    ));
                }
            }
            other => die(&format!("unknown argument {other}")),
        }
    }
    Some(args)
}

fn die(msg: &str) -> ! {
    eprintln!("gen_capture: {msg}");
    std::process::exit(2);
}

fn main() {
    let Some(args) = parse_args() else {
        eprintln!("gen_capture: nothing to do without --out (used by scripts/bench.sh)");
        return;
    };
    std::fs::create_dir_all(&args.out)
        .unwrap_or_else(|e| die(&format!("{}: {e}", args.out.display())));
    if !args.adversarial.is_empty() {
        for name in &args.adversarial {
            let path = args.out.join(format!("adv-{name}-seed{}.pcap", args.seed));
            generate_adversarial(&path, name, args.seed);
        }
        return;
    }
    if args.gateway > 0 {
        let path = args
            .out
            .join(format!("gateway-{}s-seed{}.pcap", args.gateway, args.seed));
        generate_gateway(&path, args.gateway, args.seed);
        return;
    }
    if args.fleet_pair > 0 {
        generate_fleet_pair(&args.out, args.fleet_pair, args.seed);
        return;
    }
    if args.flood {
        let path = args.out.join(format!(
            "flood-{}f-{}s-seed{}.pcap",
            args.flood_flows, args.flood_sessions, args.seed
        ));
        generate_flood(&path, args.flood_flows, args.flood_sessions, args.seed);
        return;
    }
    for (name, mb, mcp_share) in [("mixed", args.mixed_mb, 0.10), ("mcp", args.mcp_mb, 1.0)] {
        if mb == 0 {
            continue;
        }
        let path = args
            .out
            .join(format!("{name}-{mb}MB-seed{}.pcap", args.seed));
        // Each file has its own stream of randomness, so sizes can change independently.
        let seed =
            args.seed.wrapping_mul(0x1000_0000_01b3) ^ (mb << 8) ^ u64::from(mcp_share < 1.0);
        generate(&path, mb * 1_000_000, mcp_share, seed);
    }
}

/// Writes the frames `produce` emits to `path` (atomically, through a temporary file) and
/// returns what `produce` returned and the file's size.
fn write_capture<S>(
    path: &Path,
    produce: impl FnOnce(&mut dyn FnMut(i64, &[u8])) -> S,
) -> (S, u64) {
    let tmp = path.with_extension("pcap.tmp");
    let file = File::create(&tmp).unwrap_or_else(|e| die(&format!("{}: {e}", tmp.display())));
    let mut w = PcapWriter::new(
        BufWriter::with_capacity(8 << 20, file),
        PcapHeader::micros(1),
    )
    .expect("pcap header");
    let mut err = None;
    let stats = produce(&mut |ts, frame| {
        if err.is_none()
            && let Err(e) = w.write(ts, frame)
        {
            err = Some(e);
        }
    });
    if let Some(e) = err {
        die(&format!("{}: {e}", tmp.display()));
    }
    let bytes = w.file_bytes;
    let mut out = w.into_inner();
    out.flush()
        .unwrap_or_else(|e| die(&format!("{}: {e}", tmp.display())));
    drop(out);
    std::fs::rename(&tmp, path).unwrap_or_else(|e| die(&format!("{}: {e}", path.display())));
    (stats, bytes)
}

fn generate(path: &Path, target: u64, mcp_share: f64, seed: u64) {
    let started = Instant::now();
    let (stats, bytes) = write_capture(path, |emit| {
        traffic::generate(target, mcp_share, seed, emit)
    });
    let total = (stats.mcp_bytes + stats.bulk_bytes).max(1);
    println!(
        "gen_capture: wrote {} ({} bytes, {} packets, {:.1}% MCP bytes, {} MCP sessions ({} incident), {} tools/call, {} bulk flows) in {:.1} s",
        path.display(),
        bytes,
        stats.packets,
        100.0 * stats.mcp_bytes as f64 / total as f64,
        stats.sessions,
        stats.incidents,
        stats.tool_calls,
        stats.bulk_flows,
        started.elapsed().as_secs_f64()
    );
}

fn generate_flood(path: &Path, flows: u64, sessions: u64, seed: u64) {
    let started = Instant::now();
    let (stats, bytes) = write_capture(path, |emit| flood::generate(flows, sessions, seed, emit));
    println!(
        "gen_capture: wrote {} ({} bytes, {} packets, {} SYN flows, {} MCP sessions, faulty session {} in {} packets) in {:.1} s",
        path.display(),
        bytes,
        stats.packets,
        stats.syns,
        stats.sessions,
        flood::VICTIM_SID,
        stats.victim_packets,
        started.elapsed().as_secs_f64()
    );
}

fn generate_gateway(path: &Path, sessions: u64, seed: u64) {
    let started = Instant::now();
    let (stats, bytes) = write_capture(path, |emit| gateway::generate(sessions, seed, emit));
    // The alerts its incidents must raise, for scripts/bench.sh to check.
    let expected = path.with_extension("alerts");
    let line = format!(
        "capability_narrowing={n} content_type_divergence={n} client_capability_narrowing={m}\n",
        n = stats.incidents,
        m = stats.modern_incidents
    );
    std::fs::write(&expected, line)
        .unwrap_or_else(|e| die(&format!("{}: {e}", expected.display())));
    println!(
        "gen_capture: wrote {} ({} bytes, {} packets, {:.0} bytes per packet on the wire, {} legacy sessions, {} modern lineages, {} stateless conversations, {} legacy incidents, {} modern incidents, {} exchanges) in {:.1} s",
        path.display(),
        bytes,
        stats.packets,
        stats.bytes as f64 / stats.packets.max(1) as f64,
        stats.sessions,
        stats.modern_lineages,
        stats.stateless,
        stats.incidents,
        stats.modern_incidents,
        stats.exchanges,
        started.elapsed().as_secs_f64()
    );
}

fn generate_adversarial(path: &Path, name: &str, seed: u64) {
    let started = Instant::now();
    let (stats, bytes) = write_capture(path, |emit| adversarial::generate(name, seed, emit));
    let stats = stats.unwrap_or_else(|| die(&format!("unknown adversarial case {name}")));
    println!(
        "gen_capture: wrote {} ({} bytes, {} packets, {} connections, {} items) in {:.1} s",
        path.display(),
        bytes,
        stats.packets,
        stats.connections,
        stats.items,
        started.elapsed().as_secs_f64()
    );
}

/// `--fleet-pair N`: two gateway hosts' captures of N short sessions. Host A saw each session
/// start (initialize answered SSE, initialized, one SSE tools/call); the load balancer sent
/// each client's reconnect to host B (two tools/calls naming the session, DELETE). Session 0
/// is the incident: its reconnect re-initializes narrowed and gets JSON. Replaying B alone
/// picks N sessions up midstream; with A's state in the fleet store it finds the incident.
fn generate_fleet_pair(out: &Path, sessions: u64, seed: u64) {
    use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
    use mcptap_testkit::sim::Sim;
    use mcptap_testkit::tcp::Endpoint;
    let mut parts = [Vec::new(), Vec::new()];
    for n in 0..sessions {
        let mut talk = Conversation::new(&format!("fleet-{seed}-{n}"));
        talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
            .initialized()
            .tools_call("first", Answer::Sse);
        let first = talk.take_writes();
        if n == 0 {
            talk.reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
                .tools_call("after", Answer::Json)
                .tools_call("after", Answer::Json);
        } else {
            talk.tools_call("again", Answer::Sse)
                .tools_call("again", Answer::Sse);
        }
        talk.delete();
        let second = talk.take_writes();
        for (host, writes) in [first, second].into_iter().enumerate() {
            let mut sim = Sim::new(seed ^ (n << 1) ^ host as u64);
            let client = Endpoint::new(
                [127, 0, 1 + (n >> 16) as u8, 1 + (n & 0xff) as u8],
                20_000 + (n as u16 & 0x7fff),
            );
            let server = Endpoint::new([127, 0, 0, 31 + host as u8], 8080);
            let conn = sim.connect(client, server, writes);
            sim.run(vec![conn]);
            // Sessions follow one another, a millisecond apart.
            let offset = n as i64 * 1_000_000;
            parts[host].extend(
                sim.frames()
                    .iter()
                    .map(|f| (f.ts_nanos + offset, f.data.clone())),
            );
        }
    }
    for (host, frames) in parts.iter().enumerate() {
        let name = if host == 0 { "a" } else { "b" };
        let path = out.join(format!("fleet-{name}-{sessions}s-seed{seed}.pcap"));
        let (_, bytes) = write_capture(&path, |emit| {
            for (ts, data) in frames {
                emit(*ts, data);
            }
        });
        println!("{} ({bytes} bytes)", path.display());
    }
}
