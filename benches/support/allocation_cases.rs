//! The traffic of the allocation checks and how it is counted, shared by
//! `benches/allocations.rs` (full size, release) and `tests/allocations.rs` (small, debug).
//! Not part of `support/mod.rs`: each includes this file with `#[path]`, and brings its own
//! counting global allocator, handed in as a function returning the counts so far.
//!
//! Every case feeds testkit-made frames to one [`Pipeline`] and attributes the allocations
//! made inside each `handle_packet` call (plus dropping its outputs) to that packet:
//!
//! * skip path: packets the pipeline does not analyse. After a warm-up (the first packets of
//!   a flow open its table entries), they must not allocate at all.
//! * exchanges: each request and everything until the next request (its answer, the ACKs)
//!   is one exchange; a warm-up conversation goes through the same pipeline first.

#![allow(dead_code)]

use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::{Limits, Pipeline};
use mcptap_testkit::Frame;
use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, modern};
use mcptap_testkit::segment::Segment;
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::{AppWrite, Endpoint, Piece};
use mcptap_testkit::wire::{ethernet, ipv4};

/// Allocation calls one steady-state exchange (request, answer, ACKs) may make. Measured
/// (2026-12-02; the same in every run, and every exchange of a run within one of the others):
/// legacy `tools/call` 63 (JSON and SSE), modern `tools/call` 99-100 (each request carries its
/// client's `_meta` declaration). The bound is the largest plus 20 %: a new copy per message
/// or per header fails it, while a small change of the event contents does not.
pub const MAX_ALLOCATIONS_PER_EXCHANGE: u64 = 120;
/// The same for a legacy `initialize` exchange (a warm pipeline, a new session: its capability
/// tree, session and lineage records): measured 212 (JSON) and 217 (SSE), plus 20 %.
pub const MAX_ALLOCATIONS_PER_HANDSHAKE: u64 = 260;

/// Allocation calls (`alloc`, `alloc_zeroed`, `realloc`) and bytes asked for, so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allocations: u64,
    pub reallocations: u64,
    pub bytes: u64,
}

impl Counts {
    pub fn calls(&self) -> u64 {
        self.allocations + self.reallocations
    }

    fn since(self, earlier: Counts) -> Counts {
        Counts {
            allocations: self.allocations - earlier.allocations,
            reallocations: self.reallocations - earlier.reallocations,
            bytes: self.bytes - earlier.bytes,
        }
    }

    fn add(&mut self, other: Counts) {
        self.allocations += other.allocations;
        self.reallocations += other.reallocations;
        self.bytes += other.bytes;
    }
}

/// Reads the counting allocator.
pub type Counter = fn() -> Counts;

/// The server's address in every case; clients are 10.0.0.x.
const SERVER: [u8; 4] = [10, 0, 0, 1];
/// Packets of a flow that may allocate: the flow's table entry, its reassembly and HTTP state.
const FLOW_WARMUP_PACKETS: usize = 8;
/// Packets of one kind in a flow that may allocate once (an SSE parser's item buffer at the
/// stream's first keep-alive).
const KIND_WARMUP_PACKETS: usize = 4;

/// How big the cases are: the bench runs them at full size, the test small.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Payload bytes of the bulk (TLS, undecodable) flows' server side.
    pub bulk_bytes: u64,
    /// SSE keep-alive comments on the long stream.
    pub keepalives: usize,
    /// `tools/call` exchanges per conversation.
    pub tool_calls: usize,
}

pub const FULL: Scale = Scale {
    bulk_bytes: 8 << 20,
    keepalives: 20_000,
    tool_calls: 200,
};

pub const SMALL: Scale = Scale {
    bulk_bytes: 256 << 10,
    keepalives: 400,
    tool_calls: 12,
};

/// One skip-path case: frames, and which of them are measured.
pub struct SkipCase {
    pub name: &'static str,
    pub linktype: u32,
    pub frames: Vec<Frame>,
    pub measured: Vec<bool>,
}

/// What a skip-path case allocated in its measured packets.
#[derive(Debug, Clone, Default)]
pub struct SkipResult {
    pub name: &'static str,
    pub packets: usize,
    pub counts: Counts,
    /// Index of the first measured frame that allocated.
    pub first_offender: Option<usize>,
}

impl SkipResult {
    pub fn per_packet(&self) -> f64 {
        self.counts.calls() as f64 / self.packets.max(1) as f64
    }

    /// Something was measured, and it allocated nothing.
    pub fn check(&self) -> Result<(), String> {
        if self.packets == 0 {
            return Err(format!("{}: no packet measured", self.name));
        }
        if self.counts.calls() > 0 {
            return Err(format!(
                "{}: {} allocation calls in {} skipped packets (the first in frame {:?})",
                self.name,
                self.counts.calls(),
                self.packets,
                self.first_offender
            ));
        }
        Ok(())
    }
}

fn client(i: u8, port: u16) -> Endpoint {
    Endpoint::new([10, 0, 0, 10 + i], port)
}

fn sim(seed: u64, step_ns: i64) -> Sim {
    Sim::new(seed).with_step(step_ns)
}

/// A legacy session with one `tools/call` whose SSE answer is a long stream of keep-alive
/// comments (servers send them so that proxies keep the stream open), then the result.
fn keepalive_stream(session: &str, keepalives: usize) -> Vec<AppWrite> {
    let mut talk = Conversation::new(session);
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json)
        .initialized();
    let id = talk.take_request_id();
    let body = mcptap_testkit::mcp::tools_call_request(id, "tail_logs", r#"{"follow":true}"#);
    let request = talk.post(&body);
    let mut writes = talk.take_writes();
    writes.push(AppWrite::client(request));
    writes.push(AppWrite::server(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {session}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes(),
    ));
    let keepalive = ": keep-alive\n\n";
    let chunk = format!("{:x}\r\n{keepalive}\r\n", keepalive.len()).into_bytes();
    for _ in 0..keepalives {
        writes.push(AppWrite::server(chunk.clone()));
    }
    let event = format!(
        "event: message\ndata: {}\n\n",
        mcptap_testkit::mcp::tool_result(id, "done")
    );
    writes.push(AppWrite::server(
        format!("{:x}\r\n{event}\r\n0\r\n\r\n", event.len()).into_bytes(),
    ));
    writes
}

/// What [`steady_state`] knows of one flow.
struct FlowSeen {
    key: (std::net::SocketAddr, std::net::SocketAddr),
    packets: usize,
    kept: usize,
    closing: bool,
}

/// Marks, per frame, whether it is in its flow's steady state: accepted by `keep`, past the
/// flow's first [`FLOW_WARMUP_PACKETS`] and its first [`KIND_WARMUP_PACKETS`] accepted ones,
/// before any FIN or RST of the flow.
fn steady_state(linktype: u32, frames: &[Frame], keep: impl Fn(&Segment) -> bool) -> Vec<bool> {
    let mut seen: Vec<FlowSeen> = Vec::new();
    frames
        .iter()
        .map(|f| {
            let Some(seg) = Segment::decode(f.ts_nanos, linktype, &f.data) else {
                return false;
            };
            let key = (seg.src.min(seg.dst), seg.src.max(seg.dst));
            let at = match seen.iter().position(|s| s.key == key) {
                Some(i) => i,
                None => {
                    seen.push(FlowSeen {
                        key,
                        packets: 0,
                        kept: 0,
                        closing: false,
                    });
                    seen.len() - 1
                }
            };
            let flow = &mut seen[at];
            flow.packets += 1;
            flow.closing |= seg.flags.fin || seg.flags.rst;
            if flow.packets <= FLOW_WARMUP_PACKETS || flow.closing || !keep(&seg) {
                return false;
            }
            flow.kept += 1;
            flow.kept > KIND_WARMUP_PACKETS
        })
        .collect()
}

/// The skip-path cases at `scale`.
pub fn skip_cases(scale: Scale) -> Vec<SkipCase> {
    let mut cases = Vec::new();

    // Not TCP: the frames of a conversation with the IPv4 protocol set to UDP, and the same
    // as IPv4 fragments (non-first fragments carry no TCP header). 10 ms apart: the pipeline's
    // once-a-second sweeps run during the measurement.
    let mut talk = Conversation::new("skip-not-tcp");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    // About 20 frames per 10 calls.
    for _ in 0..10 * scale.tool_calls {
        talk.tools_call("ok", Answer::Sse);
    }
    let mut s = sim(1, 10_000_000);
    let conn = s.connect(
        client(0, 40000),
        Endpoint::new(SERVER, 8080),
        talk.take_writes(),
    );
    s.run(vec![conn]);
    let ip = ethernet::HEADER_LEN;
    let udp: Vec<Frame> = s
        .frames()
        .iter()
        .map(|f| {
            let mut f = f.clone();
            f.data[ip + ipv4::PROTOCOL] = 17;
            f
        })
        .collect();
    let fragments: Vec<Frame> = s
        .frames()
        .iter()
        .map(|f| {
            let mut f = f.clone();
            // Offset 185 (1480 bytes), more fragments.
            f.data[ip + ipv4::FLAGS_FRAGMENT.start..ip + ipv4::FLAGS_FRAGMENT.end]
                .copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
            f
        })
        .collect();
    for (name, frames) in [("not TCP (UDP)", udp), ("IPv4 fragments", fragments)] {
        let measured = (0..frames.len())
            .map(|i| i >= FLOW_WARMUP_PACKETS)
            .collect();
        cases.push(SkipCase {
            name,
            linktype: s.linktype(),
            frames,
            measured,
        });
    }

    // TLS to :443 and an unknown binary protocol on :8080: the flow is marked not-HTTP at its
    // first bytes; everything after (data both ways, ACKs) is skipped. 100 µs apart.
    let bulk = |seed: u64, port: u16, first: Vec<u8>, tls: bool| {
        let body = if tls {
            Piece::Tls {
                len: scale.bulk_bytes,
                seed,
            }
        } else {
            Piece::Random {
                len: scale.bulk_bytes,
                seed,
            }
        };
        let writes = vec![
            AppWrite::client(first),
            AppWrite {
                from_client: false,
                pieces: vec![body],
            },
            AppWrite::client(b"\x17\x03\x03\x00\x02ok".to_vec()),
        ];
        let mut s = sim(seed, 100_000);
        let conn = s.connect(client(1, 40001), Endpoint::new(SERVER, port), writes);
        s.run(vec![conn]);
        s
    };
    // A TLS 1.2 ClientHello's record and handshake headers, then opaque bytes.
    let hello = [
        &[
            0x16u8, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03,
        ][..],
        &[0x5a; 189][..],
    ]
    .concat();
    let tls = bulk(2, 443, hello, true);
    let binary = bulk(
        3,
        8080,
        b"\x00\x00\x00\x10\xde\xad\xbe\xef binary".to_vec(),
        false,
    );
    for (name, s) in [
        ("TLS flow (:443)", tls),
        ("undecodable flow (:8080)", binary),
    ] {
        let measured = steady_state(s.linktype(), s.frames(), |_| true);
        cases.push(SkipCase {
            name,
            linktype: s.linktype(),
            frames: s.frames().to_vec(),
            measured,
        });
    }

    // A long SSE stream of keep-alive comments: its in-flow data packets (no event in them)
    // and the client's pure ACKs.
    let mut s = sim(4, 1_000_000);
    let conn = s.connect(
        client(2, 40002),
        Endpoint::new(SERVER, 8080),
        keepalive_stream("skip-sse", scale.keepalives),
    );
    s.run(vec![conn]);
    let in_stream = |seg: &Segment| {
        let p = &seg.payload;
        !p.is_empty()
            && p.windows(12).any(|w| w == b": keep-alive")
            && !p.windows(5).any(|w| w == b"data:")
            && !p.starts_with(b"HTTP/")
    };
    let keepalives = steady_state(s.linktype(), s.frames(), in_stream);
    // ACKs once the stream is under way (after the first keep-alive).
    let stream_start = keepalives.iter().position(|&m| m).unwrap_or(usize::MAX);
    let acks: Vec<bool> = steady_state(s.linktype(), s.frames(), Segment::is_pure_ack)
        .into_iter()
        .enumerate()
        .map(|(i, m)| m && i > stream_start)
        .collect();
    cases.push(SkipCase {
        name: "SSE stream: keep-alive data packets",
        linktype: s.linktype(),
        frames: s.frames().to_vec(),
        measured: keepalives,
    });
    cases.push(SkipCase {
        name: "SSE stream: pure ACKs",
        linktype: s.linktype(),
        frames: s.frames().to_vec(),
        measured: acks,
    });
    cases
}

/// Runs one skip case through a fresh pipeline, counting the measured packets only.
pub fn run_skip(case: &SkipCase, counts: Counter) -> SkipResult {
    let mut pipeline = Pipeline::new(Limits::default());
    let mut out: Vec<Output> = Vec::with_capacity(256);
    let mut result = SkipResult {
        name: case.name,
        ..SkipResult::default()
    };
    for (i, (f, &measured)) in case.frames.iter().zip(&case.measured).enumerate() {
        let before = counts();
        pipeline.handle_packet(Timestamp(f.ts_nanos), case.linktype, &f.data, &mut out);
        out.clear();
        let spent = counts().since(before);
        if measured {
            result.packets += 1;
            result.counts.add(spent);
            if spent.calls() > 0 && result.first_offender.is_none() {
                result.first_offender = Some(i);
            }
        }
    }
    pipeline.finish(&mut out);
    result
}

/// One exchange-level case: a conversation whose exchanges are measured.
pub struct ExchangeCase {
    pub name: &'static str,
    pub linktype: u32,
    /// A conversation of the same kind on another connection, run first.
    pub warmup: Vec<Frame>,
    pub frames: Vec<Frame>,
    /// Which exchanges (counted from 0, in request order) are the steady state measured.
    pub steady: std::ops::Range<usize>,
    /// The `initialize` exchange, if the conversation has one.
    pub handshake: Option<usize>,
}

/// What an exchange case allocated, per exchange.
#[derive(Debug, Clone, Default)]
pub struct ExchangeResult {
    pub name: &'static str,
    /// Before the first request (the TCP handshake).
    pub connection: Counts,
    /// Per exchange, in request order.
    pub exchanges: Vec<Counts>,
    pub steady: std::ops::Range<usize>,
    pub handshake: Option<usize>,
}

impl ExchangeResult {
    fn steady_calls(&self) -> impl Iterator<Item = u64> + '_ {
        self.exchanges
            .get(self.steady.clone())
            .unwrap_or(&[])
            .iter()
            .map(Counts::calls)
    }

    /// Most allocation calls of one steady-state exchange.
    pub fn max(&self) -> u64 {
        self.steady_calls().max().unwrap_or(0)
    }

    /// Allocation calls of the `initialize` exchange.
    pub fn handshake_calls(&self) -> Option<u64> {
        self.exchanges.get(self.handshake?).map(Counts::calls)
    }

    /// Every exchange was seen, and each stays within its bound.
    pub fn check(&self) -> Result<(), String> {
        if self.steady.is_empty() || self.exchanges.len() < self.steady.end {
            return Err(format!(
                "{}: {} exchanges seen, steady state {:?}",
                self.name,
                self.exchanges.len(),
                self.steady
            ));
        }
        if self.max() > MAX_ALLOCATIONS_PER_EXCHANGE {
            return Err(format!(
                "{}: {} allocation calls in one exchange (bound {MAX_ALLOCATIONS_PER_EXCHANGE})",
                self.name,
                self.max()
            ));
        }
        match (self.handshake, self.handshake_calls()) {
            (Some(_), None) => Err(format!("{}: no initialize exchange", self.name)),
            (_, Some(n)) if n > MAX_ALLOCATIONS_PER_HANDSHAKE => Err(format!(
                "{}: {n} allocation calls in initialize (bound {MAX_ALLOCATIONS_PER_HANDSHAKE})",
                self.name
            )),
            _ => Ok(()),
        }
    }

    pub fn mean(&self) -> f64 {
        let n = self.steady.len().max(1) as f64;
        self.steady_calls().sum::<u64>() as f64 / n
    }

    pub fn mean_bytes(&self) -> f64 {
        let n = self.steady.len().max(1) as f64;
        let bytes: u64 = self
            .exchanges
            .get(self.steady.clone())
            .unwrap_or(&[])
            .iter()
            .map(|c| c.bytes)
            .sum();
        bytes as f64 / n
    }
}

fn legacy(session: &str, answer: Answer, tool_calls: usize) -> Vec<AppWrite> {
    let mut talk = Conversation::new(session);
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, answer)
        .initialized();
    for i in 0..tool_calls {
        talk.tools_call(&format!("result {i}"), answer);
    }
    talk.delete();
    talk.take_writes()
}

fn modern_requests(sse: bool, requests: usize) -> Vec<AppWrite> {
    let mut talk = Conversation::new("unused");
    for _ in 0..requests {
        let id = talk.take_request_id();
        let body = modern::request(
            id,
            "tools/call",
            r#""name":"search_docs","arguments":{"query":"status"}"#,
            modern::FULL_CAPS,
            "modern-client",
            "2.3.0",
        );
        let request = modern::post(&body, "tools/call", Some("search_docs"), "");
        talk.exchange(request, modern::answer(sse, &modern::tool_result(id)));
    }
    talk.take_writes()
}

fn frames_of(seed: u64, port: u16, writes: Vec<AppWrite>) -> (u32, Vec<Frame>) {
    let mut s = sim(seed, 50_000);
    let conn = s.connect(client(5, port), Endpoint::new(SERVER, 8080), writes);
    s.run(vec![conn]);
    (s.linktype(), s.frames().to_vec())
}

/// The exchange cases at `scale`: legacy sessions (initialize, initialized, N tools/call,
/// DELETE) answered in JSON and in SSE, and modern requests (no session, `_meta`).
pub fn exchange_cases(scale: Scale) -> Vec<ExchangeCase> {
    let n = scale.tool_calls;
    // Exchanges of a legacy conversation: 0 initialize, 1 initialized, 2.. tools/call, DELETE.
    // The steady state skips the first two tools/call (the session's tables grow there).
    let legacy_steady = 4..2 + n;
    let mut cases = Vec::new();
    for (name, answer, seed) in [
        ("legacy session, JSON answers", Answer::Json, 10),
        ("legacy session, SSE answers", Answer::Sse, 20),
    ] {
        let (linktype, warmup) = frames_of(seed, 41000, legacy("warmup-session", answer, n));
        let (_, frames) = frames_of(seed + 1, 41001, legacy("measured-session", answer, n));
        cases.push(ExchangeCase {
            name,
            linktype,
            warmup,
            frames,
            steady: legacy_steady.clone(),
            handshake: Some(0),
        });
    }
    for (name, sse, seed) in [
        ("modern tools/call, JSON answers", false, 30),
        ("modern tools/call, SSE answers", true, 40),
    ] {
        let (linktype, warmup) = frames_of(seed, 42000, modern_requests(sse, n));
        let (_, frames) = frames_of(seed + 1, 42001, modern_requests(sse, n));
        cases.push(ExchangeCase {
            name,
            linktype,
            warmup,
            frames,
            steady: 2..n,
            handshake: None,
        });
    }
    cases
}

/// Runs the warm-up conversation, then the measured one, attributing each packet's
/// allocations to the exchange whose request it is or follows.
pub fn run_exchanges(case: &ExchangeCase, counts: Counter) -> ExchangeResult {
    let mut pipeline = Pipeline::new(Limits::default());
    let mut out: Vec<Output> = Vec::with_capacity(256);
    for f in &case.warmup {
        pipeline.handle_packet(Timestamp(f.ts_nanos), case.linktype, &f.data, &mut out);
        out.clear();
    }
    let mut result = ExchangeResult {
        name: case.name,
        steady: case.steady.clone(),
        handshake: case.handshake,
        ..ExchangeResult::default()
    };
    for f in &case.frames {
        let starts_request = Segment::decode(f.ts_nanos, case.linktype, &f.data)
            .is_some_and(|s| s.payload.starts_with(b"POST ") || s.payload.starts_with(b"DELETE "));
        if starts_request {
            result.exchanges.push(Counts::default());
        }
        let before = counts();
        pipeline.handle_packet(Timestamp(f.ts_nanos), case.linktype, &f.data, &mut out);
        out.clear();
        let spent = counts().since(before);
        match result.exchanges.last_mut() {
            Some(exchange) => exchange.add(spent),
            None => result.connection.add(spent),
        }
    }
    pipeline.finish(&mut out);
    result
}
