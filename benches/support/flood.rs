//! The flood capture: a SYN flood of distinct TCP flows and a storm of distinct MCP session
//! ids, with one faulty session (the incident) in the middle. Used by `gen_capture --flood`
//! and checked by `scripts/flood.sh`.
//!
//! * `flows` SYNs (no answer: the server is drowning), each from a distinct client address
//!   (a bijection of the flow index onto 127.64.0.0/10, so addresses look random but never
//!   repeat; loopback like every address the generators use) and a random port, to one of four server ports on the MCP server's address.
//! * `sessions` short MCP connections to the MCP server (127.10.0.10:8080): handshake, one
//!   `POST /mcp` `initialize`, answered 200 with a fresh `Mcp-Session-Id` (3 in 4 as
//!   `application/json`, 1 in 4 as a chunked `text/event-stream`), FIN exchange. No DELETE:
//!   every session id stays live until the tracker evicts it.
//! * The faulty session [`VICTIM_SID`], on the same server: a first connection at 40 % of the
//!   flood (initialize with `tools.streaming: true` answered over SSE, notifications/initialized,
//!   two `tools/call` answered over SSE, a third answered by a proxy's 502 + close), then a
//!   reconnect at 60 % that re-initializes on the same session id with narrowed capabilities
//!   and gets two `tools/call` answered `application/json`. Its packets are spread thinly
//!   among the flood's, so its flows must survive the flood's evictions.
//!
//! Timestamps advance ~10 µs per packet (the whole capture spans ~20 s), so no flow or
//! session reaches an idle timeout: every eviction is forced by a cap or the memory budget.

use std::fmt::Write as _;

use mcptap_testkit::SplitMix64 as Rng;
use mcptap_testkit::mcp::{self, Answer, Client};
use mcptap_testkit::tcp::{AppWrite, Conn, Endpoint, Pool, SegmentHeader, write_segment};
use mcptap_testkit::wire::{Link, tcp};

/// The session id of the one faulty session (never produced for the flood's sessions, whose
/// ids start with the session index as 8 hex digits, below 0xdeadbeef).
pub const VICTIM_SID: &str = "deadbeef-5eed-4bad-8a11-00000000c0de";

use mcptap_testkit::sim::START_NS;
/// Concurrent flood sessions.
const CONCURRENCY: usize = 8;
/// Server ports the SYN flood hits (all on the MCP server's address).
const FLOOD_PORTS: [u16; 4] = [8080, 443, 80, 8443];

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub packets: u64,
    pub syns: u64,
    pub sessions: u64,
    pub victim_packets: u64,
}

/// Generates the flood capture, handing every frame to `sink` with its timestamp (ns).
pub fn generate(flows: u64, sessions: u64, seed: u64, sink: &mut dyn FnMut(i64, &[u8])) -> Stats {
    let mut rng = Rng(seed ^ 0xf100_d5ee_d000_0001);
    let pool = Pool::new(seed);
    let server = Endpoint::loopback([127, 10, 0, 10], 8080);
    let mut stats = Stats::default();
    let mut buf = Vec::with_capacity(2048);
    let mut now = START_NS;
    let mut active: Vec<Conn> = Vec::new();
    let mut started = 0u64;
    // Victim: connection 1 starts at 40 % of the SYNs, connection 2 at 60 % (after 1 ended).
    let mut victim: Option<Conn> = None;
    let mut victim_stage = 0u8;
    let mut victim_id = 0u64;
    loop {
        while active.len() < CONCURRENCY && started < sessions {
            active.push(session_conn(started, server, &mut rng));
            started += 1;
        }
        if victim.is_none() {
            let due = match victim_stage {
                0 => stats.syns >= flows * 2 / 5,
                1 => stats.syns >= flows * 3 / 5,
                _ => false,
            };
            if due {
                let client = Endpoint::loopback([127, 2, 0, 7], 51_000 + u16::from(victim_stage));
                victim = Some(victim_conn(victim_stage, client, server, &mut victim_id));
                victim_stage += 1;
            }
        }
        let syn_left = flows - stats.syns;
        // Packets still to come from flood sessions (about 9 per connection).
        let sess_left = (sessions - started) * 9 + active.len() as u64 * 5;
        let victim_turn =
            victim.is_some() && (rng.next_u64().is_multiple_of(64) || syn_left + sess_left == 0);
        if victim_turn {
            let v = victim.as_mut().expect("victim");
            if v.next_packet(&pool, now, &mut buf) {
                stats.victim_packets += 1;
            } else {
                victim = None;
                continue;
            }
        } else if syn_left + sess_left == 0 {
            if victim.is_none() && victim_stage >= 2 {
                break;
            }
            continue;
        } else if rng.next_u64() % (syn_left + sess_left) < syn_left {
            syn_frame(stats.syns, flows, &mut rng, &mut buf);
            stats.syns += 1;
        } else {
            if active.is_empty() {
                continue;
            }
            let i = (rng.next_u64() % active.len() as u64) as usize;
            if !active[i].next_packet(&pool, now, &mut buf) {
                active.swap_remove(i);
                stats.sessions += 1;
                continue;
            }
        }
        sink(now, &buf);
        stats.packets += 1;
        now += 6_000 + (rng.next_u64() % 8_000) as i64;
    }
    stats
}

/// SYN number `i` of `flows`: a distinct client address, a random port.
fn syn_frame(i: u64, flows: u64, rng: &mut Rng, buf: &mut Vec<u8>) {
    debug_assert!(flows <= 1 << 22);
    // An odd multiplier is a bijection modulo 2^22: distinct i, distinct address.
    let a = (i.wrapping_mul(0x2c_9277) & ((1 << 22) - 1)) as u32;
    let ip = [127, 64 | (a >> 16) as u8, (a >> 8) as u8, a as u8];
    let port = 1024 + (rng.next_u64() % 64_000) as u16;
    let client = Endpoint::loopback(ip, port);
    let dst = Endpoint::loopback([127, 10, 0, 10], *rng.pick(&FLOOD_PORTS));
    let h = SegmentHeader {
        ip_id: rng.next_u64() as u16,
        seq: rng.next_u64() as u32,
        ack: 0,
        flags: tcp::SYN,
        window: 64240,
        tsval: rng.next_u64() as u32,
        tsecr: 0,
    };
    write_segment(buf, &Link::default(), &client, &dst, &h, |_| {});
}

const CLIENTS: &[(&str, &str)] = &[
    ("claude-code", "1.0.71"),
    ("cursor-vscode", "0.48.2"),
    ("mcp-inspector", "0.16.1"),
    ("fixture-client", "0.4.2"),
];

fn sid_for(k: u64, rng: &mut Rng) -> String {
    let b = rng.next_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        k,
        (b >> 48) & 0xffff,
        (b >> 36) & 0xfff,
        0x8000 | (b >> 20) & 0x3fff,
        rng.next_u64() & 0xffff_ffff_ffff
    )
}

/// Flood session `k`: one connection, one initialize exchange that mints a new session id.
fn session_conn(k: u64, server: Endpoint, rng: &mut Rng) -> Conn {
    let (name, version) = *rng.pick(CLIENTS);
    let sid = sid_for(k, rng);
    let host = (k % 65_536) as u16;
    let client = Endpoint::loopback(
        [127, 1, (host >> 8) as u8, host as u8],
        40_000 + (k / 65_536) as u16,
    );
    let body = init_body(
        1,
        r#"{"roots":{"listChanged":true},"sampling":{},"tools":{"streaming":true}}"#,
        name,
        version,
    );
    let mut writes = vec![AppWrite::client(post(&body, None, name, version))];
    let result = init_result(1, r#"{"listChanged":true}"#);
    writes.push(AppWrite::server(answer(&sid, rng.chance(0.25), &result)));
    Conn::new(client, server, rng, writes)
}

/// The faulty session: stage 0 is the first connection, stage 1 the reconnect.
fn victim_conn(stage: u8, client: Endpoint, server: Endpoint, id: &mut u64) -> Conn {
    let (name, version) = ("claude-code", "1.0.71");
    let sid = Some(VICTIM_SID);
    let mut rng = Rng(0x0bad_5e55_1011 + u64::from(stage));
    let mut writes = Vec::new();
    let call = |writes: &mut Vec<AppWrite>, id: &mut u64, sse: bool, rng: &mut Rng| {
        *id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"search_docs","arguments":{{"query":"rollback plan {id}"}}}}}}"#
        );
        writes.push(AppWrite::client(post(&body, sid, name, version)));
        let mut text = String::new();
        for w in 0..(40 + rng.next_u64() % 200) {
            let _ = write!(text, "line {w} of the runbook; ");
        }
        let result = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}],"isError":false}}}}"#
        );
        writes.push(AppWrite::server(answer(VICTIM_SID, sse, &result)));
    };
    // initialize (on `reinit`, re-initialize) with these capabilities, then initialized.
    let handshake = |writes: &mut Vec<AppWrite>,
                     id: &mut u64,
                     reinit: Option<&str>,
                     client_caps: &str,
                     server_tools: &str| {
        *id += 1;
        writes.push(AppWrite::client(post(
            &init_body(*id, client_caps, name, version),
            reinit,
            name,
            version,
        )));
        let result = init_result(*id, server_tools);
        writes.push(AppWrite::server(answer(VICTIM_SID, true, &result)));
        writes.push(AppWrite::client(post(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            sid,
            name,
            version,
        )));
        writes.push(AppWrite::server(mcp::accepted(VICTIM_SID)));
    };
    if stage == 0 {
        handshake(
            &mut writes,
            id,
            None,
            r#"{"roots":{"listChanged":true},"sampling":{},"tools":{"streaming":true}}"#,
            r#"{"listChanged":true,"streaming":true}"#,
        );
        for _ in 0..2 {
            call(&mut writes, id, true, &mut rng);
        }
        // The proxy loses its upstream and closes the connection.
        *id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"search_docs","arguments":{{"query":"status"}}}}}}"#
        );
        writes.push(AppWrite::client(post(&body, sid, name, version)));
        writes.push(AppWrite::server(mcp::bad_gateway()));
        return Conn::new(client, server, &mut rng, writes).server_closes();
    }
    // Reconnect: re-initialize on the same session id with reset (narrower) capabilities.
    handshake(
        &mut writes,
        id,
        sid,
        r#"{"roots":{"listChanged":true},"tools":{"streaming":false}}"#,
        r#"{"listChanged":true,"streaming":false}"#,
    );
    for _ in 0..2 {
        call(&mut writes, id, false, &mut rng);
    }
    Conn::new(client, server, &mut rng, writes)
}

fn init_body(id: u64, caps: &str, name: &str, version: &str) -> String {
    mcp::initialize_request(id, caps, name, version)
}

fn init_result(id: u64, tools: &str) -> String {
    mcp::initialize_result(id, tools, "flood-server")
}

fn post(body: &str, sid: Option<&str>, name: &str, version: &str) -> Vec<u8> {
    let host = "mcp-0.internal:8080";
    Client {
        host,
        name,
        version,
    }
    .post(body, sid)
}

/// A 200 answer carrying `msg`: JSON with Content-Length, or one SSE event in one chunk.
fn answer(sid: &str, sse: bool, msg: &str) -> Vec<u8> {
    mcp::response(sid, if sse { Answer::Sse } else { Answer::Json }, msg)
}
