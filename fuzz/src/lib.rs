//! Input formats and drivers shared by the fuzz targets and the seed generator.
//!
//! Every format is a flat byte sequence read by [`Reader`], which never fails: a field cut
//! short by the end of the input is simply shorter (or absent), so every input is valid and
//! the fuzzer spends no time on rejected inputs. The `encode_*` functions write the same
//! formats; `examples/gen_seeds.rs` uses them to turn the fixture captures into seeds.
//!
//! The drivers panic only where mcptap itself panics, or where an invariant that the layers
//! above rely on is broken (see `mcptap_testkit::HttpEventChecker`).

// Limits are set field by field over the defaults so that new limits in mcptap need no change
// here; ops are short-lived, so their size does not matter.
#![allow(clippy::field_reassign_with_default, clippy::large_enum_variant)]

use mcptap_core::detect::Detectors;
use mcptap_core::http::sse::{SseEvent, SseItem};
use mcptap_core::http::{
    AbandonReason, BodyEnd, Connection, DuplicateHeader, FramingAnomaly, HttpError, HttpEvent,
    HttpLimits, RequestHead, RequestHeader, ResponseHead, UndecodableFlowReason, UndecodableReason,
};
use mcptap_core::mcp::{FlowCtx, HTTP_INTEREST, SessionLimits, Tracker};
use mcptap_core::model::Output;
use mcptap_core::model::{Event, Timestamp};
use mcptap_core::pipeline::{Limits, Pipeline};
use mcptap_testkit::HttpEventChecker;
use serde_json::{Map, Value, json};
use std::net::SocketAddr;

// ---------------------------------------------------------------------------
// Reading and writing the formats

/// Cursor over fuzz input; every read succeeds, with zeros / short slices past the end.
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }

    /// u16 length, then that many bytes.
    pub fn blob(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.bytes(n)
    }

    /// u8 length + 1 (0 = absent), then the bytes, as a lossy string.
    pub fn opt_str(&mut self) -> Option<String> {
        match self.u8() {
            0 => None,
            n => Some(String::from_utf8_lossy(self.bytes(n as usize - 1)).into_owned()),
        }
    }

    /// u8 length, then the bytes, as a lossy string.
    pub fn str(&mut self) -> String {
        let n = self.u8() as usize;
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }
}

/// Writer for the same formats.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn blob(&mut self, b: &[u8]) {
        let n = b.len().min(u16::MAX as usize);
        self.u16(n as u16);
        self.buf.extend_from_slice(&b[..n]);
    }
    pub fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                let n = s.len().min(254);
                self.u8(n as u8 + 1);
                self.buf.extend_from_slice(&s.as_bytes()[..n]);
            }
        }
    }
    pub fn str(&mut self, s: &str) {
        let n = s.len().min(255);
        self.u8(n as u8);
        self.buf.extend_from_slice(&s.as_bytes()[..n]);
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("static address")
}

/// Flow contexts used by the drivers: eight client connections; flows 0..=5 go to one
/// server, 6 and 7 to another.
pub fn flow_ctx(flow: u8) -> FlowCtx {
    let flow = flow % 8;
    FlowCtx {
        flow: u64::from(flow),
        client: addr(&format!("10.0.0.{}:{}", 1 + flow, 40000 + u16::from(flow))),
        server: if flow < 6 {
            addr("10.0.0.100:8080")
        } else {
            addr("[fd00::100]:3000")
        },
    }
}

/// Serialises every event as a sink would, so serialisation is fuzzed too.
pub fn serialise_events(out: &[Output]) -> usize {
    let mut n = 0;
    for o in out {
        if let Output::Event(e) = o {
            let line = serde_json::to_string(e).expect("event serialises");
            std::hint::black_box(line);
            std::hint::black_box(Event::ts(e));
            n += 1;
        }
    }
    n
}

// ---------------------------------------------------------------------------
// http_sse: byte streams of both halves into one `Connection` (+ a `Tracker`)

/// One step of an `http_sse` input.
#[derive(Debug, Clone)]
pub enum HttpOp {
    /// Bytes of `half`, fed in pieces of `split` bytes (0: all at once).
    Data {
        half: usize,
        split: u8,
        bytes: Vec<u8>,
    },
    Gap {
        half: usize,
    },
    Close {
        half: usize,
        how: BodyEnd,
    },
}

const BODY_ENDS: [BodyEnd; 4] = [
    BodyEnd::ServerClosed,
    BodyEnd::Aborted,
    BodyEnd::Unfinished,
    BodyEnd::Complete,
];

/// Format: `flags` (bit 0: synchronised), then records. A record starts with `ctrl`:
/// bit 0 is the half, bits 1..=3 the op: 0..=3 data (`len: u16`, `split: u8`, bytes),
/// 4 a generated message ([`gen_http_message`], then `split: u8`), 5 gap, 6 close
/// (bits 4..=5 pick how), 7 data to the end of the input (`split: u8`).
pub fn decode_http(data: &[u8]) -> (bool, Vec<HttpOp>) {
    let mut r = Reader::new(data);
    let synchronised = r.u8() & 1 == 1;
    let mut ops = Vec::new();
    while !r.is_empty() {
        let ctrl = r.u8();
        let half = usize::from(ctrl & 1);
        match (ctrl >> 1) & 7 {
            5 => ops.push(HttpOp::Gap { half }),
            6 => ops.push(HttpOp::Close {
                half,
                how: BODY_ENDS[usize::from((ctrl >> 4) & 3)],
            }),
            7 => {
                let split = r.u8();
                ops.push(HttpOp::Data {
                    half,
                    split,
                    bytes: r.rest().to_vec(),
                });
            }
            4 => {
                let bytes = gen_http_message(&mut r, half == 1);
                let split = r.u8();
                ops.push(HttpOp::Data { half, split, bytes });
            }
            _ => {
                let len = r.u16() as usize;
                let split = r.u8();
                ops.push(HttpOp::Data {
                    half,
                    split,
                    bytes: r.bytes(len).to_vec(),
                });
            }
        }
    }
    (synchronised, ops)
}

pub fn encode_http(synchronised: bool, ops: &[HttpOp]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(u8::from(synchronised));
    for op in ops {
        match op {
            HttpOp::Data { half, split, bytes } => {
                for piece in bytes.chunks(u16::MAX as usize) {
                    w.u8(*half as u8);
                    w.blob(piece);
                    // blob wrote the length before the bytes; the split byte goes between.
                    let at = w.buf.len() - piece.len();
                    w.buf.insert(at, *split);
                }
            }
            HttpOp::Gap { half } => w.u8(*half as u8 | 5 << 1),
            HttpOp::Close { half, how } => {
                let i = BODY_ENDS.iter().position(|b| b == how).unwrap_or(0) as u8;
                w.u8(*half as u8 | 6 << 1 | i << 4);
            }
        }
    }
    w.buf
}

/// Framing of a generated message (its index is 3 bits of the feature word).
const FRAMINGS: [&str; 8] = [
    "Content-Length: {len}",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: chunked\r\nContent-Length: {len}",
    "Content-Length: {len}\r\nContent-Length: 1",
    "Content-Length: 4 2",
    "Transfer-Encoding: gzip, chunked",
    "Transfer-Encoding: chunked, gzip",
    "Transfer-Encoding: x-custom",
];

/// Content codings of a generated message; index 2 is claimed gzip but is not.
const CONTENT_CODINGS: [&str; 4] = ["", "gzip", "gzip", "compress"];

/// A whole HTTP message built from the input, so that the framing HTTP counts (anomalies,
/// duplicate headers, undecodable bodies, each parse-error reason) is reached without the
/// fuzzer having to find it byte by byte. `features: u16`: bits 0..=2 framing
/// ([`FRAMINGS`]), 3..=4 content coding, 5 bare LF line ends, 6 an empty line before,
/// 7 a second, different Content-Type, 8 a second Mcp-Session-Id, 9..=10 a chunk-size
/// anomaly (whitespace, `;`, an unbalanced quote), 11 an SSE body, 12..=13 garbage before
/// (`HTTP/5.6`, TLS bytes, an extension method); then the body ([`gen_body`] or SSE data).
pub fn gen_http_message(r: &mut Reader<'_>, response: bool) -> Vec<u8> {
    let features = r.u16();
    let bit = |i: u16| features & (1 << i) != 0;
    let sse = bit(11);
    let mut body = if sse {
        format!(
            "event: message\ndata: {}\n\n",
            String::from_utf8_lossy(&gen_body(r))
        )
        .into_bytes()
    } else {
        gen_body(r)
    };
    let coding = usize::from((features >> 3) & 3);
    match coding {
        1 => body = mcptap_testkit::exchange::gzip(&body),
        2 => {
            body.splice(0..0, [0x1f, 0x8b, 8, 0]);
        }
        _ => {}
    }
    let framing = usize::from(features & 7);
    let chunked = matches!(framing, 1 | 2 | 5 | 6);
    if framing == 5 {
        body = mcptap_testkit::exchange::gzip(&body);
    }
    let media = if sse {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut head = if response {
        format!("HTTP/1.1 200 OK\r\nContent-Type: {media}\r\n")
    } else {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: h\r\nAccept: application/json, text/event-stream\r\nContent-Type: {media}\r\n"
        )
    };
    if bit(7) {
        let other = if sse {
            "application/json"
        } else {
            "text/event-stream"
        };
        head.push_str(&format!("Content-Type: {other}\r\n"));
    }
    head.push_str("Mcp-Session-Id: s-1\r\n");
    if bit(8) {
        head.push_str("Mcp-Session-Id: s-2\r\n");
    }
    if let Some(c) = CONTENT_CODINGS.get(coding).filter(|c| !c.is_empty()) {
        head.push_str(&format!("Content-Encoding: {c}\r\n"));
    }
    head.push_str(&FRAMINGS[framing].replace("{len}", &body.len().to_string()));
    head.push_str("\r\n\r\n");
    if bit(5) {
        head = head.replace("\r\n", "\n");
    }
    let mut out = Vec::new();
    match (features >> 12) & 3 {
        1 => out.extend_from_slice(b"HTTP/5.6 200 OK\r\n\r\n"),
        2 => out.extend_from_slice(b"\x16\x03\x01\x00\x05hello"),
        3 if !response => out.extend_from_slice(b"REPORT /x HTTP/1.1\r\n\r\n"),
        _ => {}
    }
    if bit(6) {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(head.as_bytes());
    if chunked {
        let size_suffix = ["", "  ", ";", ";x=\"open"][usize::from((features >> 9) & 3)];
        let cut = body.len() / 2;
        for part in [&body[..cut], &body[cut..]] {
            if !part.is_empty() {
                out.extend_from_slice(format!("{:x}{size_suffix}\r\n", part.len()).as_bytes());
                out.extend_from_slice(part);
                out.extend_from_slice(b"\r\n");
            }
        }
        out.extend_from_slice(b"0\r\n\r\n");
    } else {
        out.extend_from_slice(&body);
    }
    out
}

/// Runs an `http_sse` input: the ops into a `Connection`, its events into a `Tracker`.
/// Returns the number of events produced.
pub fn run_http(data: &[u8]) -> usize {
    let mut n_events = 0;
    let (synchronised, ops) = decode_http(data);
    let mut conn = Connection::new(synchronised, HttpLimits::default(), HTTP_INTEREST);
    let mut tracker = Tracker::new(SessionLimits::default(), Detectors::default());
    let ctx = flow_ctx(0);
    let mut events = Vec::new();
    let mut out = Vec::new();
    let mut checker = HttpEventChecker::default();
    let mut ts = 1_700_000_000_000_000_000i64;
    let mut deliver = |events: &mut Vec<HttpEvent>, tracker: &mut Tracker<Detectors>, ts: i64| {
        checker.check(events);
        for ev in events.drain(..) {
            tracker.on_http(ctx, Timestamp(ts), ev, &mut out);
        }
        n_events += serialise_events(&out);
        out.clear();
    };
    for op in ops {
        ts += 1_000_000;
        match op {
            HttpOp::Data { half, split, bytes } => {
                if split == 0 {
                    conn.on_data(half, &bytes, &mut events);
                } else {
                    for piece in bytes.chunks(usize::from(split)) {
                        conn.on_data(half, piece, &mut events);
                    }
                }
            }
            HttpOp::Gap { half } => conn.on_gap(half, &mut events),
            HttpOp::Close { half, how } => conn.on_close(half, how, &mut events),
        }
        deliver(&mut events, &mut tracker, ts);
    }
    for half in 0..2 {
        conn.on_close(half, BodyEnd::Unfinished, &mut events);
    }
    deliver(&mut events, &mut tracker, ts);
    let _ = conn.buffered_bytes();
    tracker.on_flow_closed(0);
    let mut out = Vec::new();
    tracker.sweep(Timestamp(i64::MAX), &mut out);
    n_events += serialise_events(&out);
    n_events
}

// ---------------------------------------------------------------------------
// jsonrpc_mcp: a sequence of HTTP events into a `Tracker`

/// One step of a `jsonrpc_mcp` input.
#[derive(Debug, Clone)]
pub enum McpOp {
    Http { flow: u8, dt: u8, ev: HttpEvent },
    FlowClosed { flow: u8 },
    Sweep { dt: u8 },
}

/// Time step: up to ~0.24 s in ms steps, then jumps of 2^k minutes (up to ~22 days), so the
/// idle and lineage timeouts are reachable.
pub fn time_step(dt: u8) -> i64 {
    if dt < 0xF0 {
        i64::from(dt) * 1_000_000
    } else {
        (1i64 << (dt - 0xF0)) * 60 * 1_000_000_000
    }
}

const METHODS: [&str; 6] = ["POST", "GET", "DELETE", "PUT", "HEAD", "OPTIONS"];
const RPC_METHODS: [&str; 12] = [
    "initialize",
    "notifications/initialized",
    "tools/call",
    "tools/list",
    "ping",
    "notifications/progress",
    "notifications/message",
    "resources/list",
    "prompts/list",
    "sampling/createMessage",
    "notifications/cancelled",
    "completion/complete",
];
const KEYS: [&str; 32] = [
    "jsonrpc",
    "id",
    "method",
    "params",
    "result",
    "error",
    "code",
    "message",
    "capabilities",
    "tools",
    "streaming",
    "listChanged",
    "resources",
    "subscribe",
    "prompts",
    "logging",
    "sampling",
    "roots",
    "completions",
    "protocolVersion",
    "clientInfo",
    "serverInfo",
    "name",
    "version",
    "content",
    "structuredContent",
    "isError",
    "_meta",
    "progressToken",
    "arguments",
    "type",
    "text",
];
const STRINGS: [&str; 8] = [
    "2.0",
    "2025-06-18",
    "2025-11-25",
    "2024-11-05",
    "add",
    "count_slowly",
    "text",
    "",
];

/// A JSON value built from the input, biased towards MCP's vocabulary.
fn gen_value(r: &mut Reader<'_>, depth: u32) -> Value {
    let b = r.u8();
    match b % 10 {
        0 => Value::Null,
        1 => Value::Bool(b & 0x10 != 0),
        2 => json!(i64::from(r.u16()) - 1000),
        3 => json!(f64::from(r.u16()) / 7.0),
        4 => Value::String(STRINGS[usize::from(b >> 4) % STRINGS.len()].to_string()),
        5 => Value::String(r.str()),
        6 | 7 if depth < 5 => {
            let n = usize::from(r.u8() % 6);
            let mut obj = Map::new();
            for _ in 0..n {
                let k = r.u8();
                let key = if k == 0xFF {
                    r.str()
                } else {
                    KEYS[usize::from(k) % KEYS.len()].to_string()
                };
                obj.insert(key, gen_value(r, depth + 1));
            }
            Value::Object(obj)
        }
        8 if depth < 5 => {
            let n = usize::from(r.u8() % 5);
            Value::Array((0..n).map(|_| gen_value(r, depth + 1)).collect())
        }
        _ => json!({}),
    }
}

fn gen_id(r: &mut Reader<'_>) -> Value {
    let b = r.u8();
    match b % 6 {
        0 => Value::Null,
        1 => Value::String(format!("{}", b >> 3)),
        2 => Value::String(r.str()),
        3 => json!(f64::from(b >> 3) + 0.5),
        _ => json!(i64::from(b >> 3)),
    }
}

/// One JSON-RPC message built from the input.
fn gen_message(r: &mut Reader<'_>) -> Value {
    let kind = r.u8();
    let mut obj = Map::new();
    if kind & 0x80 == 0 {
        obj.insert("jsonrpc".into(), json!("2.0"));
    }
    let method = || RPC_METHODS[usize::from(kind >> 2) % RPC_METHODS.len()].to_string();
    match kind % 4 {
        0 => {
            obj.insert("id".into(), gen_id(r));
            obj.insert("method".into(), json!(method()));
            obj.insert("params".into(), gen_value(r, 1));
        }
        1 => {
            obj.insert("method".into(), json!(method()));
            obj.insert("params".into(), gen_value(r, 1));
        }
        2 => {
            obj.insert("id".into(), gen_id(r));
            obj.insert("result".into(), gen_value(r, 1));
        }
        _ => {
            obj.insert("id".into(), gen_id(r));
            obj.insert(
                "error".into(),
                json!({"code": i64::from(r.u16()) - 32768, "message": r.str()}),
            );
        }
    }
    Value::Object(obj)
}

/// A body: mode byte 0 = raw bytes (`blob`), 1 = one generated message, 2 = a batch,
/// anything else = one generated message with trailing raw bytes.
fn gen_body(r: &mut Reader<'_>) -> Vec<u8> {
    match r.u8() % 4 {
        0 => r.blob().to_vec(),
        1 => serde_json::to_vec(&gen_message(r)).expect("json"),
        2 => {
            let n = usize::from(r.u8() % 4);
            serde_json::to_vec(&Value::Array((0..n).map(|_| gen_message(r)).collect()))
                .expect("json")
        }
        _ => {
            let mut v = serde_json::to_vec(&gen_message(r)).expect("json");
            v.extend_from_slice(r.blob());
            v
        }
    }
}

/// Format: records, each `kind: u8`, then for HTTP events `flow: u8`, `dt: u8`,
/// `exchange: u8` and the event's fields:
/// 0 request (method, path, host, accept, content-type, session id, protocol version, body),
/// 1 response head (status: u16, media type, session id), 2 JSON body, 3 SSE event
/// (event type, data body, id, retry), 4 SSE block without data (id), 5 SSE comment,
/// 6 response end (how); 7 ends flow `flow`; 8 sweeps after `dt`; 9 an HTTP error
/// (reason: u8); 10 abandons the exchange (reason: u8); 11 a framing anomaly (reason: u8),
/// 12 a duplicate header (header: u8), 13 an undecodable body (reason: u8); in 11 and 13
/// bit 4 of the exchange byte says whether the event names the exchange. Bits 4..=6 of
/// the exchange byte of a request or response head set `lenient`, `ambiguous` and (for a
/// response, then an `opt_str`) `other_media_type`.
/// Strings are `opt_str`/`str` fields, bodies are [`gen_body`] fields.
pub fn decode_mcp(data: &[u8]) -> Vec<McpOp> {
    let mut r = Reader::new(data);
    let mut ops = Vec::new();
    while !r.is_empty() {
        let kind = r.u8() % 16;
        let flow = r.u8();
        let dt = r.u8();
        if kind == 7 {
            ops.push(McpOp::FlowClosed { flow });
            continue;
        }
        if kind == 8 {
            ops.push(McpOp::Sweep { dt });
            continue;
        }
        let exchange_byte = r.u8();
        let exchange = u64::from(exchange_byte % 16);
        let flag = |i: u8| exchange_byte & (1 << i) != 0;
        let named = flag(4).then_some(exchange);
        let ev = match kind {
            0 => {
                let m = r.u8();
                let method = if usize::from(m) < METHODS.len() {
                    METHODS[usize::from(m)].to_string()
                } else if m == 0xFF {
                    r.str()
                } else {
                    "POST".to_string()
                };
                let mut head = RequestHead::new(&method, &r.str());
                head.set(RequestHeader::Host, r.opt_str().as_deref());
                head.set(RequestHeader::Accept, r.opt_str().as_deref());
                head.set(RequestHeader::ContentType, r.opt_str().as_deref());
                // Mcp-Session-Id, MCP-Protocol-Version: the slots of mcp::HTTP_INTEREST.
                head.set(RequestHeader::Extracted(0), r.opt_str().as_deref());
                head.set(RequestHeader::Extracted(1), r.opt_str().as_deref());
                head.lenient = flag(4);
                head.ambiguous = flag(5);
                HttpEvent::Request {
                    exchange,
                    head: Box::new(head),
                    body: gen_body(&mut r),
                }
            }
            1 => HttpEvent::ResponseHead {
                exchange,
                head: {
                    let mut head = ResponseHead {
                        status: r.u16(),
                        media_type: r.opt_str(),
                        ..ResponseHead::default()
                    };
                    head.extracted[0] = r.opt_str();
                    head.lenient = flag(4);
                    head.ambiguous = flag(5);
                    if flag(6) {
                        head.other_media_type = r.opt_str();
                    }
                    Box::new(head)
                },
            },
            2 => HttpEvent::ResponseJson {
                exchange,
                body: gen_body(&mut r),
            },
            3 => {
                let event_type = r.opt_str();
                // As a lossy string, as before the data became bytes: seeds keep their meaning.
                let data = String::from_utf8_lossy(&gen_body(&mut r))
                    .into_owned()
                    .into_bytes();
                let id = r.opt_str();
                let retry = match r.u8() {
                    0 => None,
                    n => Some(u64::from(n)),
                };
                HttpEvent::ResponseSse {
                    exchange,
                    item: SseItem::Event(SseEvent {
                        event_type,
                        data,
                        id,
                        retry,
                    }),
                }
            }
            4 => HttpEvent::ResponseSse {
                exchange,
                item: SseItem::NoData { id: r.opt_str() },
            },
            5 => HttpEvent::ResponseSse {
                exchange,
                item: SseItem::Comment,
            },
            // The end's top bit: no response began (the encoder writes ResponseEnd's as 0..4).
            6 => match r.u8() {
                e if e & 0x80 != 0 => HttpEvent::NoResponse {
                    exchange,
                    end: BODY_ENDS[usize::from(e % 4)],
                },
                e if e & 0x40 != 0 => HttpEvent::ClientGone { exchange },
                e => HttpEvent::ResponseEnd {
                    exchange,
                    end: BODY_ENDS[usize::from(e % 4)],
                },
            },
            10 => HttpEvent::Abandoned {
                exchange,
                reason: pick(AbandonReason::ALL, r.u8()),
            },
            11 => HttpEvent::Anomaly {
                exchange: named,
                reason: pick(FramingAnomaly::ALL, r.u8()),
            },
            12 => HttpEvent::DuplicateHeader {
                header: pick(DuplicateHeader::ALL, r.u8()),
            },
            13 => HttpEvent::Undecodable {
                exchange: named,
                reason: pick(UndecodableReason::ALL, r.u8()),
            },
            14 => HttpEvent::NotDecodable {
                half: usize::from(r.u8() & 1),
                reason: pick(UndecodableFlowReason::ALL, r.u8()),
            },
            15 => HttpEvent::ProxyHeader {
                half: usize::from(r.u8() & 1),
                source: match r.u8() {
                    0 => None,
                    b => Some(std::net::SocketAddr::from(([127, 0, 9, b], 40_000))),
                },
            },
            _ => HttpEvent::Error(pick(HttpError::ALL, r.u8())),
        };
        ops.push(McpOp::Http { flow, dt, ev });
    }
    ops
}

/// The value at `sel` (wrapping) of a label set.
fn pick<T: Copy>(all: &[T], sel: u8) -> T {
    all[usize::from(sel) % all.len()]
}

/// The index of `v` in a label set, for the encoders.
fn index_of<T: PartialEq>(all: &[T], v: &T) -> u8 {
    all.iter().position(|x| x == v).unwrap_or(0) as u8
}

/// Encodes HTTP events for `decode_mcp` (bodies raw, `dt` as given).
pub fn encode_mcp(ops: &[McpOp]) -> Vec<u8> {
    let mut w = Writer::default();
    for op in ops {
        let (flow, dt, ev) = match op {
            McpOp::FlowClosed { flow } => {
                w.buf.extend_from_slice(&[7, *flow, 0]);
                continue;
            }
            McpOp::Sweep { dt } => {
                w.buf.extend_from_slice(&[8, 0, *dt]);
                continue;
            }
            McpOp::Http { flow, dt, ev } => (flow, dt, ev),
        };
        let raw_body = |w: &mut Writer, b: &[u8]| {
            w.u8(0);
            w.blob(b);
        };
        let kind = match ev {
            HttpEvent::Request { .. } => 0,
            HttpEvent::ResponseHead { .. } => 1,
            HttpEvent::ResponseJson { .. } => 2,
            HttpEvent::ResponseSse {
                item: SseItem::Event(_),
                ..
            } => 3,
            HttpEvent::ResponseSse {
                item: SseItem::NoData { .. },
                ..
            } => 4,
            HttpEvent::ResponseSse {
                item: SseItem::Comment,
                ..
            } => 5,
            HttpEvent::ResponseEnd { .. }
            | HttpEvent::NoResponse { .. }
            | HttpEvent::ClientGone { .. } => 6,
            HttpEvent::Error(_) => 9,
            HttpEvent::Abandoned { .. } => 10,
            HttpEvent::Anomaly { .. } => 11,
            HttpEvent::DuplicateHeader { .. } => 12,
            HttpEvent::Undecodable { .. } => 13,
            HttpEvent::NotDecodable { .. } => 14,
            HttpEvent::ProxyHeader { .. } => 15,
        };
        w.buf.extend_from_slice(&[kind, *flow, *dt]);
        let exchange = match ev {
            HttpEvent::Request { exchange, .. }
            | HttpEvent::ResponseHead { exchange, .. }
            | HttpEvent::ResponseJson { exchange, .. }
            | HttpEvent::ResponseSse { exchange, .. }
            | HttpEvent::ResponseEnd { exchange, .. }
            | HttpEvent::NoResponse { exchange, .. }
            | HttpEvent::ClientGone { exchange }
            | HttpEvent::Abandoned { exchange, .. } => *exchange % 16,
            HttpEvent::Anomaly { exchange, .. } | HttpEvent::Undecodable { exchange, .. } => {
                exchange.map_or(0, |e| (e % 16) | 16)
            }
            _ => 0,
        };
        let flags = match ev {
            HttpEvent::Request { head, .. } => {
                u8::from(head.lenient) << 4 | u8::from(head.ambiguous) << 5
            }
            HttpEvent::ResponseHead { head, .. } => {
                u8::from(head.lenient) << 4
                    | u8::from(head.ambiguous) << 5
                    | u8::from(head.other_media_type.is_some()) << 6
            }
            _ => 0,
        };
        w.u8(exchange as u8 | flags);
        match ev {
            HttpEvent::Request { head, body, .. } => {
                match METHODS.iter().position(|m| *m == head.method()) {
                    Some(i) => w.u8(i as u8),
                    None => {
                        w.u8(0xFF);
                        w.str(head.method());
                    }
                }
                w.str(head.path());
                w.opt_str(head.host());
                w.opt_str(head.accept());
                w.opt_str(head.content_type());
                w.opt_str(head.extracted(0));
                w.opt_str(head.extracted(1));
                raw_body(&mut w, body);
            }
            HttpEvent::ResponseHead { head, .. } => {
                w.u16(head.status);
                w.opt_str(head.media_type.as_deref());
                w.opt_str(head.extracted[0].as_deref());
                if let Some(other) = &head.other_media_type {
                    w.opt_str(Some(other));
                }
            }
            HttpEvent::ResponseJson { body, .. } => raw_body(&mut w, body),
            HttpEvent::ResponseSse { item, .. } => match item {
                SseItem::Event(e) => {
                    w.opt_str(e.event_type.as_deref());
                    raw_body(&mut w, &e.data);
                    w.opt_str(e.id.as_deref());
                    w.u8(e.retry.map_or(0, |r| r.clamp(1, 255) as u8));
                }
                SseItem::NoData { id } => w.opt_str(id.as_deref()),
                SseItem::Comment => {}
            },
            HttpEvent::ResponseEnd { end, .. } => {
                w.u8(BODY_ENDS.iter().position(|b| b == end).unwrap_or(0) as u8)
            }
            HttpEvent::NoResponse { end, .. } => {
                w.u8(0x80 | BODY_ENDS.iter().position(|b| b == end).unwrap_or(0) as u8)
            }
            HttpEvent::ClientGone { .. } => w.u8(0x40),
            HttpEvent::Error(reason) => w.u8(index_of(HttpError::ALL, reason)),
            HttpEvent::Abandoned { reason, .. } => w.u8(index_of(AbandonReason::ALL, reason)),
            HttpEvent::Anomaly { reason, .. } => w.u8(index_of(FramingAnomaly::ALL, reason)),
            HttpEvent::DuplicateHeader { header } => w.u8(index_of(DuplicateHeader::ALL, header)),
            HttpEvent::Undecodable { reason, .. } => w.u8(index_of(UndecodableReason::ALL, reason)),
            HttpEvent::NotDecodable { half, reason } => {
                w.u8(*half as u8);
                w.u8(index_of(UndecodableFlowReason::ALL, reason));
            }
            HttpEvent::ProxyHeader { half, source } => {
                w.u8(*half as u8);
                w.u8(match source {
                    Some(std::net::SocketAddr::V4(a)) => a.ip().octets()[3].max(1),
                    _ => 0,
                });
            }
        }
    }
    w.buf
}

/// Runs a `jsonrpc_mcp` input through a `Tracker` with small limits (so eviction and the
/// in-flight cap are reachable), then through one with the default limits.
/// Returns the number of events produced.
pub fn run_mcp(data: &[u8]) -> usize {
    let mut n_events = 0;
    let ops = decode_mcp(data);
    let mut small = SessionLimits::default();
    small.max_sessions = 3;
    small.max_in_flight = 4;
    small.max_session_id_len = 16;
    for limits in [small, SessionLimits::default()] {
        let mut tracker = Tracker::new(limits, Detectors::default());
        let mut ts = 1_700_000_000_000_000_000i64;
        let mut out = Vec::new();
        for op in &ops {
            match op {
                McpOp::Http { flow, dt, ev } => {
                    ts = ts.saturating_add(time_step(*dt));
                    tracker.on_http(flow_ctx(*flow), Timestamp(ts), ev.clone(), &mut out);
                }
                McpOp::FlowClosed { flow } => tracker.on_flow_closed(u64::from(flow % 8)),
                McpOp::Sweep { dt } => {
                    ts = ts.saturating_add(time_step(*dt));
                    tracker.sweep(Timestamp(ts), &mut out);
                }
            }
            n_events += serialise_events(&out);
            out.clear();
        }
        let _ = tracker.active_sessions();
        tracker.sweep(Timestamp(i64::MAX), &mut out);
        n_events += serialise_events(&out);
    }
    n_events
}

// ---------------------------------------------------------------------------
// pipeline_frames: raw frames with link types straight into a `Pipeline`

/// Link types a frame can be tagged with; index 10 means "the byte itself".
pub const LINKTYPES: [u32; 10] = [1, 101, 113, 276, 0, 108, 228, 229, 12, 14];

pub fn linktype_of(sel: u8) -> u32 {
    LINKTYPES
        .get(usize::from(sel))
        .copied()
        .unwrap_or(u32::from(sel))
}

/// Time delta in ns from an i16: sign and cube, so small values are fine steps (ns to µs)
/// and large ones jump by up to ~3 days; negative values move the clock backwards.
pub fn frame_time_step(v: i16) -> i64 {
    let m = i64::from(v.unsigned_abs());
    let d = m * m * m * 1000;
    if v < 0 { -d } else { d }
}

/// Format: `limits: u8` (bit 0: small flow limits), then frames: `linktype: u8` (index
/// into [`LINKTYPES`], else the value itself), `dt: i16`, `len: u16`, frame bytes.
/// Returns the number of events produced.
pub fn run_frames(data: &[u8]) -> usize {
    let mut n_events = 0;
    let mut r = Reader::new(data);
    let small = r.u8() & 1 == 1;
    let limits = if small {
        // Field by field over the defaults, so new limits in mcptap need no change here.
        let mut l = Limits::default();
        l.max_flows = 4;
        l.max_flow_buffer_bytes = 4096;
        l.flow_idle_timeout_ns = 10_000_000_000;
        l.http.max_head_bytes = 512;
        l.http.max_message_bytes = 2048;
        l.http.max_sse_event_bytes = 1024;
        l.http.max_pending_requests = 4;
        l.session.max_sessions = 2;
        l.session.session_idle_timeout_ns = 20_000_000_000;
        l.session.lineage_window_ns = 30_000_000_000;
        l.session.max_in_flight = 4;
        l.session.max_session_id_len = 32;
        l
    } else {
        Limits::default()
    };
    let mut pipeline = Pipeline::new(limits);
    let mut out = Vec::new();
    let mut ts = 1_700_000_000_000_000_000i64;
    while !r.is_empty() {
        let linktype = linktype_of(r.u8());
        ts = ts.saturating_add(frame_time_step(r.u16() as i16));
        let frame = r.blob();
        pipeline.handle_packet(Timestamp(ts), linktype, frame, &mut out);
        n_events += serialise_events(&out);
        out.clear();
    }
    let _ = (pipeline.active_flows(), pipeline.active_sessions());
    pipeline.advance_time(Timestamp(ts.saturating_add(3_600_000_000_000)), &mut out);
    pipeline.finish(&mut out);
    n_events += serialise_events(&out);
    n_events
}

pub fn encode_frames(small: bool, frames: &[(u32, i64, &[u8])]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(u8::from(small));
    let mut prev = None;
    for (linktype, ts, frame) in frames {
        let sel = LINKTYPES.iter().position(|l| l == linktype).unwrap_or(0) as u8;
        w.u8(sel);
        // The closest cube step (exact timing does not matter for a seed).
        let delta = prev.map_or(0, |p| ts - p).max(0);
        let mut v = ((delta as f64 / 1000.0).cbrt().round() as i64).clamp(0, i16::MAX as i64);
        if delta > 0 && v == 0 {
            v = 1;
        }
        w.u16(v as i16 as u16);
        w.blob(frame);
        prev = Some(*ts);
    }
    w.buf
}

// ---------------------------------------------------------------------------
// pipeline_capture: raw capture file bytes through `read_captures` and a `Pipeline`

/// Inputs holding this marker are split there into two capture files, read as a merged set.
pub const FILE_SPLIT: &[u8] = b"\n--MCPTAP-NEXT-FILE--\n";

fn temp_path(i: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("mcptap-fuzz-{}-{i}.cap", std::process::id()))
}

/// Writes the input as one (or two) capture files and replays them.
/// Returns the number of events produced.
pub fn run_capture(data: &[u8]) -> usize {
    let mut n_events = 0;
    let parts: Vec<&[u8]> = match memfind(data, FILE_SPLIT) {
        Some(at) => vec![&data[..at], &data[at + FILE_SPLIT.len()..]],
        None => vec![data],
    };
    let mut paths = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let p = temp_path(i);
        std::fs::write(&p, part).expect("writing the temporary capture");
        paths.push(p.display().to_string());
    }
    let mut pipeline = Pipeline::new(Limits::default());
    let mut out = Vec::new();
    let result = mcptap::capture::read_captures(&paths, &mut |pkt| {
        assert!(pkt.data.len() <= 256 << 20);
        pipeline.handle_packet(Timestamp(pkt.ts_nanos), pkt.linktype, pkt.data, &mut out);
        n_events += serialise_events(&out);
        out.clear();
    });
    if let Err(e) = &result {
        std::hint::black_box(e.to_string());
    }
    pipeline.finish(&mut out);
    n_events += serialise_events(&out);
    n_events
}

fn memfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
