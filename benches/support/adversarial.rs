//! Issue 11's exhaustion cases as captures, one per case, for `scripts/exhaustion-bench.sh`
//! (`gen_capture --adversarial NAME|all`). The same shapes as `tests/exhaustion.rs`, at the
//! sizes the issue reported, plus the open-requests case of item 14:
//!
//! * `huge-initialize`: one 3 MB `initialize` whose capabilities nest 7 levels of 450 KB keys
//!   with 500 members at the bottom, answered 400 (item 12).
//! * `unanswered-initializes`: an answered `initialize`, then 40 unanswered ones of 1.0 to
//!   3.8 MB each on the same connection, their capabilities an array of zeros (item 13: params
//!   kept as `Value` trees, 16x their wire size for this shape).
//! * `pipelined-heads`: 8 connections of 250 pipelined `GET`s with 60 KB paths, never
//!   answered: 120 MB of request heads (item 13).
//! * `lineage-client-info`: 200 sessions one after the other, each on its own connection
//!   with a distinct 3 MB `clientInfo`, ended by `DELETE` (item 13: ended-session lineage
//!   records).
//! * `batch-64k`, `batch-90k`: one JSON-RPC batch of 64,000 / 90,000 pings, the answers in
//!   reverse order (item 14).
//! * `open-requests-10k`, `open-requests-40k`: 10,000 / 40,000 `tools/call` requests of one
//!   session left open, 1,000 per connection (the HTTP layer's per-connection cap is 1,024),
//!   then every connection closes (item 14: the flow-close path; two sizes, so the ratio of
//!   their times shows whether it stays linear).
//!
//! Conversations are built with the test kit's `mcp::Conversation` and packetised by its TCP
//! model (`tcp::Conn`) as `sim::Sim::run` does (round robin, 10 µs per packet, from
//! `sim::START_NS`), but streamed to the writer instead of held in memory: the lineage case is
//! 600 MB of capture. Connections are made one at a time where they follow each other.

use mcptap_testkit::SplitMix64 as Rng;
use mcptap_testkit::mcp::hostile::{array_capabilities, deep_long_key_capabilities, ping_batch};
use mcptap_testkit::mcp::{self, Answer, Conversation, FULL_CLIENT_CAPS};
use mcptap_testkit::sim::START_NS;
use mcptap_testkit::tcp::{Conn, Endpoint, Pool};

/// Every case, in the order the script runs them.
pub const CASES: &[&str] = &[
    "huge-initialize",
    "unanswered-initializes",
    "pipelined-heads",
    "lineage-client-info",
    "batch-64k",
    "batch-90k",
    "open-requests-10k",
    "open-requests-40k",
];

/// Virtual time between two packets (as `Sim`).
const STEP_NS: i64 = 10_000;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub packets: u64,
    pub connections: u64,
    /// What the case holds: requests, sessions or batch members.
    pub items: u64,
}

struct Driver<'a> {
    rng: Rng,
    pool: Pool,
    now: i64,
    buf: Vec<u8>,
    sink: &'a mut dyn FnMut(i64, &[u8]),
    stats: Stats,
}

impl Driver<'_> {
    fn connect(&mut self, client_port: u16, talk: &mut Conversation) -> Conn {
        self.stats.connections += 1;
        Conn::new(
            Endpoint::new([127, 0, 0, 2], client_port),
            Endpoint::new([127, 0, 0, 3], 8080),
            &mut self.rng,
            talk.take_writes(),
        )
    }

    /// Runs `conns` to completion, their packets interleaved round robin (as `Sim::run`).
    fn run(&mut self, mut conns: Vec<Conn>) {
        while !conns.is_empty() {
            conns.retain_mut(|conn| {
                if conn.next_packet(&self.pool, self.now, &mut self.buf) {
                    (self.sink)(self.now, &self.buf);
                    self.stats.packets += 1;
                    self.now += STEP_NS;
                    true
                } else {
                    false
                }
            });
        }
    }
}

/// Writes case `name` to `sink`; `None` for an unknown name.
pub fn generate(name: &str, seed: u64, sink: &mut dyn FnMut(i64, &[u8])) -> Option<Stats> {
    let mut d = Driver {
        rng: Rng(seed ^ 0xad7e_25a1_0000_0011),
        pool: Pool::new(seed),
        now: START_NS,
        buf: Vec::with_capacity(2048),
        sink,
        stats: Stats::default(),
    };
    match name {
        "huge-initialize" => huge_initialize(&mut d),
        "unanswered-initializes" => unanswered_initializes(&mut d),
        "pipelined-heads" => pipelined_heads(&mut d),
        "lineage-client-info" => lineage_client_info(&mut d),
        "batch-64k" => batch(&mut d, 64_000),
        "batch-90k" => batch(&mut d, 90_000),
        "open-requests-10k" => open_requests(&mut d, 10_000),
        "open-requests-40k" => open_requests(&mut d, 40_000),
        _ => return None,
    }
    Some(d.stats)
}

fn huge_initialize(d: &mut Driver) {
    let caps = deep_long_key_capabilities();
    let mut talk = Conversation::new("adv-huge-s1");
    let body = mcp::initialize_request(1, &caps, "hostile", "1");
    let request = talk.post(&body);
    let error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Invalid params"}}"#;
    let rejection = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{error}",
        error.len()
    )
    .into_bytes();
    talk.exchange(request, rejection);
    d.stats.items = 1;
    let conn = d.connect(41000, &mut talk);
    d.run(vec![conn]);
}

fn unanswered_initializes(d: &mut Driver) {
    let mut talk = Conversation::new("adv-pending-s1");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    for i in 0..40usize {
        // 0.5 M to 1.9 M array members of 2 bytes each: 1.0 to 3.8 MB, under the default 4 MiB
        // message limit. As a `Value` tree each member takes 32 bytes or more, 16x its wire
        // size (the issue's "~9x" was measured on mixed shapes).
        let caps = array_capabilities(500_000 + i * 1_400_000 / 39);
        let id = talk.take_request_id();
        let request = talk.post(&mcp::initialize_request(id, &caps, "hostile", "1"));
        talk.exchange(request, Vec::new());
    }
    d.stats.items = 40;
    let conn = d.connect(41000, &mut talk);
    d.run(vec![conn]);
}

fn pipelined_heads(d: &mut Driver) {
    let path = format!("/mcp?{}", "p".repeat(60_000));
    let mut conns = Vec::new();
    for c in 0..8u16 {
        let sid = format!("adv-heads-{c}");
        let mut talk = Conversation::new(&sid);
        for _ in 0..250 {
            let get = format!(
                "GET {path} HTTP/1.1\r\nHost: mcp.internal\r\nAccept: text/event-stream\r\nMcp-Session-Id: {sid}\r\n\r\n"
            );
            talk.exchange(get.into_bytes(), Vec::new());
        }
        d.stats.items += 250;
        conns.push(d.connect(42000 + c, &mut talk));
    }
    d.run(conns);
}

fn lineage_client_info(d: &mut Driver) {
    let filler = "c".repeat(3_000_000);
    for s in 0..200u16 {
        let sid = format!("adv-lineage-{s:03}");
        let mut talk = Conversation::new(&sid);
        // Distinct per session, so that each ended session keeps its own lineage record.
        let client_info =
            format!(r#"{{"name":"hostile-{s}","version":"1","description":"{s}{filler}"}}"#);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{}","capabilities":{FULL_CLIENT_CAPS},"clientInfo":{client_info}}}}}"#,
            mcp::PROTOCOL_VERSION
        );
        let request = mcp::Client {
            host: &talk.host,
            name: "hostile",
            version: "1",
        }
        .post(&body, None);
        let result = mcp::initialize_result(1, "{}", &talk.server_name);
        let reply = mcp::response(&sid, Answer::Json, &result);
        talk.exchange(request, reply);
        talk.initialized().delete();
        d.stats.items += 1;
        let conn = d.connect(43000 + s, &mut talk);
        d.run(vec![conn]);
    }
}

fn batch(d: &mut Driver, n: u64) {
    let (requests, answers) = ping_batch(n);
    let mut talk = Conversation::new("adv-batch-s1");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let request = talk.post(&requests);
    let answer = mcp::response("adv-batch-s1", Answer::Json, &answers);
    talk.exchange(request, answer);
    d.stats.items = n;
    let conn = d.connect(41000, &mut talk);
    d.run(vec![conn]);
}

fn open_requests(d: &mut Driver, n: u64) {
    // The HTTP layer tracks at most 1,024 pipelined requests per connection
    // (`max_pending_requests`; more are counted `too_many_pending`), so the open requests are
    // spread over connections of 1,000, all on one session and all open at once; then each
    // connection closes in turn with its requests still open.
    const PER_CONN: u64 = 1_000;
    let mut first = Conversation::new("adv-open-s1");
    first
        .initialize(FULL_CLIENT_CAPS, "{}", Answer::Json)
        .initialized();
    let mut conns = Vec::new();
    let mut left = n;
    let mut c = 0u16;
    while left > 0 {
        let mut talk = first.clone();
        if c > 0 {
            talk.take_writes();
        }
        for _ in 0..left.min(PER_CONN) {
            let id = first.take_request_id();
            let body = mcp::tools_call_request(id, "search_docs", r#"{"query":"status"}"#);
            let request = talk.post(&body);
            talk.exchange(request, Vec::new());
        }
        left -= left.min(PER_CONN);
        conns.push(d.connect(44000 + c, &mut talk));
        c += 1;
    }
    d.stats.items = n;
    d.run(conns);
}
