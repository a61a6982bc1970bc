//! The gateway-shaped capture: what a gateway host in front of one or two MCP upstreams
//! carries. Many short sessions in small packets, many clients, the capability sets real SDKs
//! send, legacy and modern traffic, and a few incidents. Used by `gen_capture --gateway` and
//! `scripts/bench.sh`.
//!
//! * Sessions go to `127.0.0.5:8080` (about 85 %) or `127.0.0.6:8080`, from 4,096 clients
//!   (`127.1.x.y`; each client's sessions follow one another, so lineages have several).
//! * 70 % legacy sessions of the Python, TypeScript and Rust SDKs' capability sets:
//!   `initialize`, `notifications/initialized`, `tools/list`, 1–4 `tools/call` (answered as
//!   the session's server does: chunked SSE or JSON), `DELETE`.
//! * 20 % modern requests (2026-07-28): `server/discover`, then 1–4 `tools/call`, each
//!   declaring its client in `params._meta` and the mirrored headers; no session.
//! * 10 % legacy stateless: `initialize` and 1–3 `tools/call` without a session id.
//! * A client speaks one era (its kind follows from its address).
//! * Incidents: conversations 70–79 of every 100,000. A legacy one replays the incident (SSE
//!   answers, a 502 and close, a reconnect that re-initializes on the same session id with
//!   `tools.streaming: false`, JSON answers after); a modern one narrows its declared set (and
//!   declares the narrowed set again).
//! * Segments of 90–150 payload bytes (a gateway's small writes), delayed ACKs, FIN
//!   exchanges; 32 connections interleaved packet by packet, 10 µs apart.

use mcptap_testkit::SplitMix64 as Rng;
use mcptap_testkit::mcp::{
    self, Answer, Client, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS, modern,
};
use mcptap_testkit::sim::START_NS;
use mcptap_testkit::tcp::{AppWrite, Conn, Endpoint, Pool};

/// Connections open at once.
const CONCURRENCY: usize = 32;
/// Clients (distinct addresses).
const CLIENTS: u64 = 4096;
/// Conversations 70–79 of every 100,000 are incidents (legacy: the reconnect; modern: a
/// narrowed declaration).
const INCIDENT_EVERY: u64 = 10_000;
/// Payload sizes of data segments, in turn.
const SEGMENTS: [usize; 4] = [150, 110, 90, 130];

/// Capability sets the SDKs send in `initialize` (Python SDK 1.x with callbacks, TypeScript
/// SDK, rmcp) and in `_meta` (Python SDK 2.x).
const SDK_CAPS: [(&str, &str, &str); 3] = [
    (
        "mcp",
        "1.30.0",
        r#"{"sampling":{},"elicitation":{},"roots":{"listChanged":true}}"#,
    ),
    (
        "typescript-sdk",
        "1.32.2",
        r#"{"roots":{"listChanged":true}}"#,
    ),
    ("rmcp", "0.11.0", "{}"),
];

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub packets: u64,
    pub bytes: u64,
    pub sessions: u64,
    pub modern_lineages: u64,
    pub stateless: u64,
    pub incidents: u64,
    pub modern_incidents: u64,
    pub exchanges: u64,
}

/// Generates the capture of `sessions` conversations, handing every frame to `sink`.
pub fn generate(sessions: u64, seed: u64, sink: &mut dyn FnMut(i64, &[u8])) -> Stats {
    let mut rng = Rng(seed ^ 0x6a7e_3a75_0000_0001);
    let pool = Pool::new(seed);
    let mut stats = Stats::default();
    let mut buf = Vec::with_capacity(2048);
    let mut now = START_NS;
    let mut active: Vec<Conn> = Vec::with_capacity(CONCURRENCY);
    // Second connections (incident reconnects), started when a slot frees up.
    let mut later: Vec<Conn> = Vec::new();
    let mut next = 0u64;
    loop {
        while active.len() < CONCURRENCY {
            if let Some(c) = later.pop() {
                active.push(c);
            } else if next < sessions {
                let (first, second) = conversation(next, &mut rng, &mut stats);
                active.push(first);
                later.extend(second);
                next += 1;
            } else {
                break;
            }
        }
        if active.is_empty() {
            break;
        }
        active.retain_mut(|conn| {
            if conn.next_packet(&pool, now, &mut buf) {
                sink(now, &buf);
                stats.packets += 1;
                stats.bytes += buf.len() as u64;
                now += 10_000;
                true
            } else {
                false
            }
        });
    }
    stats
}

/// Conversation `n`: its connection, and a later one for an incident's reconnect.
fn conversation(n: u64, rng: &mut Rng, stats: &mut Stats) -> (Conn, Option<Conn>) {
    let client_no = n % CLIENTS;
    let client = Endpoint::loopback(
        [127, 1, (client_no >> 8) as u8, (client_no & 0xff) as u8],
        20_000 + (n % 40_000) as u16,
    );
    let server = Endpoint::loopback([127, 0, 0, if n % 7 == 3 { 6 } else { 5 }], 8080);
    let (name, version, caps) = SDK_CAPS[(client_no % 3) as usize];
    let calls = 1 + rng.next_u64() % 4;
    let conn = |writes: Vec<AppWrite>, rng: &mut Rng, port_shift: u16| {
        let mut c = client;
        c.port = c.port.wrapping_add(port_shift);
        Conn::new(c, server, rng, writes).with_segment_sizes(SEGMENTS.to_vec())
    };
    // A client speaks one era: its kind comes from the client, not the conversation.
    let incident = (n / 10) % INCIDENT_EVERY == 7;
    match client_no % 10 {
        0 | 3 | 5 | 6 | 8 | 9 | 1 => {
            stats.sessions += 1;
            let sid = format!(
                "{:08x}-{:04x}-4a5e-9c1d-{:012x}",
                n,
                n % 0xffff,
                rng.next_u64() >> 16
            );
            let mut talk = Conversation::new(&sid);
            talk.client_name = name.into();
            talk.client_version = version.into();
            talk.server_name = "gateway-upstream".into();
            if incident {
                stats.incidents += 1;
                talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
                    .initialized()
                    .tools_call("before", Answer::Sse)
                    .tools_call_bad_gateway();
                let first = talk.take_writes();
                talk.reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
                    .initialized()
                    .tools_call("after", Answer::Json)
                    .tools_call("after", Answer::Json)
                    .delete();
                stats.exchanges += 10;
                let second = talk.take_writes();
                return (conn(first, rng, 0), Some(conn(second, rng, 1)));
            }
            let answer = if n.is_multiple_of(3) {
                Answer::Json
            } else {
                Answer::Sse
            };
            let streaming = if matches!(answer, Answer::Sse) {
                "true"
            } else {
                "false"
            };
            talk.initialize(caps, &format!(r#"{{"listChanged":{streaming}}}"#), answer)
                .initialized();
            let id = talk.take_request_id();
            let list = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
            let tools = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"search_docs","inputSchema":{{"type":"object"}}}}]}}}}"#
            );
            let request = talk.post(&list);
            talk.exchange(request, mcp::response(&sid, Answer::Json, &tools));
            for _ in 0..calls {
                talk.tools_call("ok", answer);
            }
            talk.delete();
            stats.exchanges += 4 + calls;
            (conn(talk.take_writes(), rng, 0), None)
        }
        2 | 4 => {
            stats.modern_lineages += 1;
            let mut talk = Conversation::new("unused");
            let narrows = incident;
            let full = modern::FULL_CAPS;
            let body = modern::request(1, "server/discover", "", full, name, version);
            let discover = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}},"serverInfo":{"name":"gateway-upstream","version":"1"}}}"#;
            talk.exchange(
                modern::post(&body, "server/discover", None, ""),
                modern::answer(false, discover),
            );
            let calls = if narrows {
                stats.modern_incidents += 1;
                4
            } else {
                calls
            };
            for i in 0..calls {
                let id = 2 + i;
                let caps = if narrows && i >= 2 {
                    modern::RESET_CAPS
                } else {
                    full
                };
                let body = modern::request(
                    id,
                    "tools/call",
                    r#""name":"search_docs","arguments":{"query":"status"}"#,
                    caps,
                    name,
                    version,
                );
                talk.exchange(
                    modern::post(&body, "tools/call", Some("search_docs"), ""),
                    modern::answer(n.is_multiple_of(4), &modern::tool_result(id)),
                );
            }
            stats.exchanges += 1 + calls;
            (conn(talk.take_writes(), rng, 0), None)
        }
        _ => {
            stats.stateless += 1;
            let mut talk = Conversation::new("unused");
            let http = Client {
                host: "mcp.internal:8080",
                name,
                version,
            };
            let init = mcp::initialize_request(1, caps, name, version);
            let result =
                mcp::initialize_result(1, r#"{"listChanged":false}"#, "stateless-upstream");
            talk.exchange(http.post(&init, None), modern::answer(false, &result));
            let calls = calls.min(3);
            for i in 0..calls {
                let id = 2 + i;
                let body = mcp::tools_call_request(id, "search_docs", r#"{"query":"status"}"#);
                talk.exchange(
                    http.post(&body, None),
                    modern::answer(false, &mcp::tool_result(id, "ok")),
                );
            }
            stats.exchanges += 1 + calls;
            (conn(talk.take_writes(), rng, 0), None)
        }
    }
}
