//! MCP session tracking over HTTP messages.
//!
//! Sessions are keyed by (server endpoint, `Mcp-Session-Id`). Every JSON-RPC request is
//! correlated with its response, whether it came as a JSON body, on the POST's SSE stream or on
//! a GET stream of the same session. Handshakes, exchanges and session ends become events; the
//! decisions about what is alarming live in [`crate::detect`].

pub mod caps;
pub mod headers;

pub use headers::HTTP_INTEREST;

use crate::detect::{self, AnswerShape, ModeTracker, StreamContent};
use crate::http::sse::SseItem;
use crate::http::{BodyEnd, HttpEvent, RequestHead, ResponseHead};
use crate::jsonrpc::{self, Id, Message, ResultFields};
use crate::model::{
    Alert, AlertKind, CapabilityChange, Divergence, EmptyResult, EndReason, Event, Exchange,
    Handshake, Outcome, SessionEnd, StreamEnd, Telemetry, Timestamp,
};
use crate::model::{HandshakeDiff, Output, PathDiff};
use caps::CapPaths;
use foldhash::HashMap;
use serde_json::Value;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

pub use crate::limits::SessionLimits;

/// Where an HTTP event came from.
#[derive(Debug, Clone, Copy)]
pub struct FlowCtx {
    pub flow: u64,
    pub client: SocketAddr,
    pub server: SocketAddr,
}

type SessionKey = (SocketAddr, String);
type ExchangeKey = (u64, u64);

/// One handshake's capability sets, kept as the baseline of comparisons. Every tracked session
/// holds one, so it is kept compact: the server's capability object as JSON text (a `Value`
/// tree costs several KB), parsed again only when an alert needs it.
#[derive(Debug, Clone)]
struct CapsRecord {
    server_caps: Box<str>,
    streaming: bool,
    client_paths: CapPaths,
    server_paths: CapPaths,
}

impl CapsRecord {
    fn new(client_caps: &Value, server_caps: &Value) -> CapsRecord {
        CapsRecord {
            server_caps: compact_json(server_caps),
            streaming: caps::streaming_enabled(server_caps),
            client_paths: caps::paths(client_caps),
            server_paths: caps::paths(server_caps),
        }
    }

    fn server_caps(&self) -> Value {
        serde_json::from_str(&self.server_caps).unwrap_or(Value::Null)
    }

    fn heap_bytes(&self) -> usize {
        self.server_caps.len() + paths_bytes(&self.client_paths) + paths_bytes(&self.server_paths)
    }
}

/// Heap held by a path set: the strings (allocator rounding included) and the slice.
fn paths_bytes(paths: &[Box<str>]) -> usize {
    paths
        .iter()
        .map(|p| p.len().next_multiple_of(16) + 16)
        .sum::<usize>()
        + std::mem::size_of_val(paths)
}

/// What one session costs besides its id and capability record: the boxed struct, its slot in
/// the table (counted twice: the table keeps up to half its slots free), and the per-method
/// mode tracker and in-flight table a busy session grows. Measured at ~1.6 KB in all with the
/// capability sets of common clients and servers.
const SESSION_FIXED_COST: usize = std::mem::size_of::<Session>()
    + 2 * (std::mem::size_of::<SessionKey>() + std::mem::size_of::<Box<Session>>() + 1)
    + 768;

fn session_cost(sid: &str, s: &Session) -> usize {
    SESSION_FIXED_COST
        + sid.len()
        + s.client_info.len()
        + s.baseline.as_ref().map_or(0, CapsRecord::heap_bytes)
}

/// A value kept as JSON text: `Value` trees are large, and JSON objects serialize with sorted
/// keys, so equal values give equal text.
fn compact_json(v: &Value) -> Box<str> {
    serde_json::to_string(v)
        .unwrap_or_default()
        .into_boxed_str()
}

#[derive(Debug)]
struct Session {
    /// Bytes this session is charged against `max_session_bytes` (see `session_cost`).
    charged: usize,
    client: SocketAddr,
    /// `clientInfo` of the latest handshake, as compact JSON (for lineage matching).
    client_info: Box<str>,
    last_seen: Timestamp,
    handshakes: u32,
    /// The first accepted handshake: the baseline, never replaced.
    baseline: Option<CapsRecord>,
    /// `tools.streaming: true` in the latest accepted handshake.
    streaming_negotiated: bool,
    requests: u64,
    alerts: u32,
    /// Requests awaiting a response, for answers that arrive on a GET stream.
    in_flight: HashMap<Id, ExchangeKey>,
    modes: ModeTracker,
}

/// A JSON-RPC request carried by one HTTP request.
#[derive(Debug)]
struct PendingRequest {
    id: Id,
    method: String,
    tool: Option<String>,
    /// `initialize` params, kept for the handshake event.
    init_params: Option<Value>,
    answered: bool,
}

#[derive(Debug)]
struct ExchangeState {
    ts: Timestamp,
    client: SocketAddr,
    server: SocketAddr,
    head: RequestHead,
    /// Session named by the request header, or learned from the response header.
    session_id: Option<String>,
    requests: Vec<PendingRequest>,
    response: Option<ResponseHead>,
    stream: StreamContent,
}

/// The request side of an exchange, as the handshake logic needs it.
#[derive(Debug, Clone)]
struct Origin {
    client: SocketAddr,
    server: SocketAddr,
    head: RequestHead,
    session_id: Option<String>,
}

/// How an `initialize` was answered.
#[derive(Debug, Clone, Copy)]
struct Answer<'a> {
    result: Option<&'a Value>,
    error: Option<&'a (i64, String)>,
    status: u16,
}

/// A session that was rejected, expired or deleted: a possible predecessor of the next one.
#[derive(Debug, Clone)]
struct Ended {
    ts: Timestamp,
    server: SocketAddr,
    client_ip: IpAddr,
    client_info: Box<str>,
    session_id: String,
    baseline: Option<CapsRecord>,
}

/// Bounded list of recently ended sessions for lineage.
const MAX_ENDED: usize = 4096;

#[derive(Debug, Default)]
pub struct Tracker {
    limits: SessionLimits,
    /// Boxed: the table keeps up to half its slots free, and those should hold a pointer.
    sessions: HashMap<SessionKey, Box<Session>>,
    /// Sum of the sessions' `charged` bytes.
    session_bytes: usize,
    exchanges: HashMap<ExchangeKey, ExchangeState>,
    ended: VecDeque<Ended>,
}

fn is_2xx(status: u16) -> bool {
    (200..300).contains(&status)
}

fn media_label(mt: Option<&str>) -> &'static str {
    match mt {
        None => "none",
        Some("text/event-stream") => "sse",
        Some(m) if m == "application/json" || m.ends_with("+json") => "json",
        Some(_) => "other",
    }
}

impl Tracker {
    pub fn new(limits: SessionLimits) -> Self {
        Tracker {
            limits,
            ..Default::default()
        }
    }

    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Estimated bytes held by tracked sessions, as charged against `max_session_bytes`.
    pub fn session_bytes(&self) -> usize {
        self.session_bytes
    }

    /// Re-estimates what session `key` costs after it changed, then evicts the least recently
    /// seen sessions if all of them no longer fit.
    fn recharge(&mut self, key: &SessionKey, now: Timestamp, out: &mut Vec<Output>) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let cost = session_cost(&key.1, s);
        self.session_bytes = self.session_bytes - s.charged + cost;
        s.charged = cost;
        if self.session_bytes > self.limits.max_session_bytes {
            self.evict_oldest(now, Some(key), out);
        }
    }

    pub fn on_http(&mut self, ctx: FlowCtx, ts: Timestamp, ev: HttpEvent, out: &mut Vec<Output>) {
        match ev {
            HttpEvent::Request {
                exchange,
                head,
                body,
            } => self.on_request(ctx, ts, exchange, head, &body, out),
            HttpEvent::ResponseHead { exchange, head } => {
                self.on_response_head(ctx, ts, exchange, head, out)
            }
            HttpEvent::ResponseJson { exchange, body } => {
                self.on_response_body(ctx, ts, exchange, &body, out)
            }
            HttpEvent::ResponseSse { exchange, item } => self.on_sse(ctx, ts, exchange, item, out),
            HttpEvent::ResponseEnd { exchange, end } => {
                self.on_response_end(ctx, ts, exchange, end, out)
            }
            HttpEvent::Abandoned { exchange } => self.abandon(ctx, exchange),
            HttpEvent::Error(e) => out.push(Output::Telemetry(Telemetry::HttpError {
                reason: e.as_str(),
            })),
        }
    }

    /// A request that will never be answered on its connection: forget it.
    fn abandon(&mut self, ctx: FlowCtx, exchange: u64) {
        let Some(ex) = self.exchanges.remove(&(ctx.flow, exchange)) else {
            return;
        };
        if let Some(sid) = ex.session_id
            && let Some(s) = self.sessions.get_mut(&(ctx.server, sid))
        {
            for r in &ex.requests {
                s.in_flight.remove(&r.id);
            }
        }
    }

    /// The flow is gone: forget its exchanges (their ends were reported by the HTTP layer).
    pub fn on_flow_closed(&mut self, flow: u64) {
        self.exchanges.retain(|(f, _), _| *f != flow);
    }

    /// Ends sessions idle for longer than the limit.
    pub fn sweep(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        let timeout = self.limits.session_idle_timeout_ns;
        let mut idle: Vec<SessionKey> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.0.saturating_sub(s.last_seen.0) > timeout)
            .map(|(k, _)| k.clone())
            .collect();
        // Key order, not hash order, so replays stay deterministic.
        idle.sort_unstable();
        for key in idle {
            self.end_session(&key, now, EndReason::Idle, out);
        }
        let window = self.limits.lineage_window_ns;
        while self
            .ended
            .front()
            .is_some_and(|e| now.0.saturating_sub(e.ts.0) > window)
        {
            self.ended.pop_front();
        }
    }

    fn valid_session_id(&self, id: Option<&str>, out: &mut Vec<Output>) -> Option<String> {
        let id = id?;
        // MCP: visible ASCII only. Anything else is hostile or broken; don't let it become a key.
        let ok = !id.is_empty()
            && id.len() <= self.limits.max_session_id_len
            && id.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if !ok {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: "invalid_session_id",
            }));
        }
        ok.then(|| id.to_string())
    }

    fn on_request(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        head: RequestHead,
        body: &[u8],
        out: &mut Vec<Output>,
    ) {
        let session_id = self.valid_session_id(headers::request_session_id(&head), out);
        let mut requests = Vec::new();
        if !body.is_empty() {
            match jsonrpc::parse(body) {
                Ok(msgs) => {
                    for m in msgs {
                        if let Message::Request { id, method, params } = m {
                            let method = method.into_owned();
                            out.push(Output::Telemetry(Telemetry::Request {
                                server: ctx.server,
                                method: method.clone(),
                            }));
                            let tool = (method == "tools/call")
                                .then(|| jsonrpc::tool_name(params))
                                .flatten();
                            let init_params = (method == "initialize").then(|| {
                                jsonrpc::to_value(params).unwrap_or_else(|e| {
                                    out.push(Output::Telemetry(Telemetry::JsonRpcError {
                                        reason: e.as_str(),
                                    }));
                                    Value::Null
                                })
                            });
                            requests.push(PendingRequest {
                                id,
                                method,
                                tool,
                                init_params,
                                answered: false,
                            });
                        }
                    }
                }
                Err(e) => {
                    out.push(Output::Telemetry(Telemetry::JsonRpcError {
                        reason: e.as_str(),
                    }));
                    return;
                }
            }
        }
        if let Some(sid) = &session_id {
            let key = (ctx.server, sid.clone());
            self.touch_session(&key, ctx, ts, out);
            let max_in_flight = self.limits.max_in_flight;
            if let Some(s) = self.sessions.get_mut(&key) {
                s.requests += requests.len() as u64;
                for r in &requests {
                    if s.in_flight.len() < max_in_flight {
                        s.in_flight.insert(r.id.clone(), (ctx.flow, exchange));
                    }
                }
            }
        }
        self.exchanges.insert(
            (ctx.flow, exchange),
            ExchangeState {
                ts,
                client: ctx.client,
                server: ctx.server,
                head,
                session_id,
                requests,
                response: None,
                stream: StreamContent::default(),
            },
        );
    }

    /// Makes sure a session exists for a request that names it (midstream pickup).
    fn touch_session(
        &mut self,
        key: &SessionKey,
        ctx: FlowCtx,
        ts: Timestamp,
        out: &mut Vec<Output>,
    ) {
        if let Some(s) = self.sessions.get_mut(key) {
            s.last_seen = ts;
            return;
        }
        self.make_room(ts, out);
        out.push(Output::Telemetry(Telemetry::SessionStarted {
            server: ctx.server,
            midstream: true,
        }));
        self.sessions
            .insert(key.clone(), new_session(ctx.client, ts));
        self.recharge(key, ts, out);
    }

    /// Enforces the session cap by ending the least recently seen sessions.
    fn make_room(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        let max = self.limits.max_sessions.max(1);
        let bytes_full =
            self.session_bytes.saturating_add(SESSION_FIXED_COST) > self.limits.max_session_bytes;
        if self.sessions.len() >= max || bytes_full {
            self.evict_oldest(now, None, out);
        }
    }

    /// Ends the least recently seen 1/16 of the sessions, never `keep`. A batch at once, so
    /// that a flood of new ids costs O(n) per batch, not per id.
    fn evict_oldest(&mut self, now: Timestamp, keep: Option<&SessionKey>, out: &mut Vec<Output>) {
        let mut by_age: Vec<(Timestamp, SessionKey)> = self
            .sessions
            .iter()
            .filter(|(k, _)| Some(*k) != keep)
            .map(|(k, s)| (s.last_seen, k.clone()))
            .collect();
        if by_age.is_empty() {
            return;
        }
        let batch = (by_age.len() / 16).max(1);
        by_age.select_nth_unstable(batch - 1);
        let mut oldest: Vec<(Timestamp, SessionKey)> = by_age.into_iter().take(batch).collect();
        oldest.sort_unstable();
        for (_, key) in oldest {
            self.end_session(&key, now, EndReason::Evicted, out);
        }
    }

    fn on_response_head(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        head: ResponseHead,
        out: &mut Vec<Output>,
    ) {
        out.push(Output::Telemetry(Telemetry::HttpResponse {
            server: ctx.server,
            status: head.status,
        }));
        let learned = self.valid_session_id(headers::response_session_id(&head), out);
        let Some(ex) = self.exchanges.get_mut(&(ctx.flow, exchange)) else {
            return;
        };
        if ex.session_id.is_none() && is_2xx(head.status) {
            ex.session_id = learned;
        }
        let status = head.status;
        let method = ex.head.method.clone();
        let sid = ex.session_id.clone();
        ex.response = Some(head);
        let Some(sid) = sid else { return };
        let key = (ctx.server, sid);
        if status == 404 && headers::request_session_id(&ex.head).is_some() {
            self.end_session(&key, ts, EndReason::Expired, out);
        } else if method == "DELETE" && is_2xx(status) {
            self.end_session(&key, ts, EndReason::Deleted, out);
        } else if let Some(s) = self.sessions.get_mut(&key) {
            s.last_seen = ts;
        }
    }

    fn on_response_body(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        body: &[u8],
        out: &mut Vec<Output>,
    ) {
        match jsonrpc::parse(body) {
            Ok(msgs) => {
                for m in msgs {
                    self.on_answer(ctx, ts, exchange, m, false, out);
                }
            }
            Err(e) => out.push(Output::Telemetry(Telemetry::JsonRpcError {
                reason: e.as_str(),
            })),
        }
    }

    fn on_sse(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        item: SseItem,
        out: &mut Vec<Output>,
    ) {
        let key = (ctx.flow, exchange);
        let Some(ex) = self.exchanges.get_mut(&key) else {
            return;
        };
        ex.stream.items = ex.stream.items.saturating_add(1);
        let SseItem::Event(event) = item else { return };
        if event.data.trim().is_empty() {
            return; // priming event
        }
        match jsonrpc::parse_str(&event.data) {
            Ok(msgs) => {
                for m in msgs {
                    if m.is_request_or_notification() {
                        if let Some(ex) = self.exchanges.get_mut(&key) {
                            ex.stream.messages = ex.stream.messages.saturating_add(1);
                        }
                    } else {
                        self.on_answer(ctx, ts, exchange, m, true, out);
                    }
                }
            }
            Err(e) => out.push(Output::Telemetry(Telemetry::JsonRpcError {
                reason: e.as_str(),
            })),
        }
    }

    /// Where the open request with `id` lives: this exchange, or (answers on a GET stream)
    /// another exchange of the same session.
    fn locate(&self, here: ExchangeKey, ctx: FlowCtx, id: &Id) -> Option<ExchangeKey> {
        let ex = self.exchanges.get(&here)?;
        if ex.requests.iter().any(|r| &r.id == id && !r.answered) {
            return Some(here);
        }
        let sid = ex.session_id.as_ref()?;
        let session = self.sessions.get(&(ctx.server, sid.clone()))?;
        session.in_flight.get(id).copied()
    }

    fn sole_open_request(&self, here: ExchangeKey) -> Option<Id> {
        let ex = self.exchanges.get(&here)?;
        let mut open = ex.requests.iter().filter(|r| !r.answered);
        match (open.next(), open.next()) {
            (Some(r), None) => Some(r.id.clone()),
            _ => None,
        }
    }

    /// A JSON-RPC response arrived on exchange `exchange` (its body or its stream).
    fn on_answer(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        msg: Message<'_>,
        on_stream: bool,
        out: &mut Vec<Output>,
    ) {
        let here = (ctx.flow, exchange);
        let (id, result, error) = match msg {
            Message::Result { id, result } => (id, Some(result), None),
            Message::Error { id, code, message } => {
                // Servers answer some errors with `id: null` or a made-up id (the Python SDK's
                // "server-error"); on an exchange with exactly one open request it is the answer.
                let Some(id) = id
                    .filter(|id| self.locate(here, ctx, id).is_some())
                    .or_else(|| self.sole_open_request(here))
                else {
                    return;
                };
                (id, None, Some((code, message)))
            }
            _ => return,
        };
        let target = self.locate(here, ctx, &id);
        let Some(target) = target else {
            out.push(Output::Telemetry(Telemetry::JsonRpcError {
                reason: "unmatched_response",
            }));
            return;
        };
        let carrier = self.exchanges.get(&here).map(|ex| ex.stream);
        let Some(ex) = self.exchanges.get_mut(&target) else {
            return;
        };
        let Some(idx) = ex.requests.iter().position(|r| r.id == id && !r.answered) else {
            return;
        };
        ex.requests[idx].answered = true;
        let status = ex.response.as_ref().map_or(0, |r| r.status);
        let mt = ex.response.as_ref().and_then(|r| r.media_type.clone());
        let sse_events = if target == here {
            carrier.map_or(0, |c| c.items)
        } else {
            0
        };
        // How the answer was shaped on the exchange that carried it.
        let shape = if !on_stream {
            AnswerShape::Json
        } else if carrier.is_some_and(|c| c.messages > 0) {
            AnswerShape::SseAfterMessages
        } else {
            AnswerShape::SseResultOnly
        };
        let method = ex.requests[idx].method.clone();
        let tool = ex.requests[idx].tool.clone();
        let init_params = ex.requests[idx].init_params.take();
        let req_ts = ex.ts;
        let client = ex.client;
        let accept = ex.head.accept.clone();
        let protocol_version = headers::request_protocol_version(&ex.head).map(str::to_string);
        // The whole request side is only needed for a handshake.
        let origin = (method == "initialize").then(|| ex.origin());
        let sid = ex.session_id.clone();

        if let Some(origin) = &origin {
            let result = result.as_ref().map(|r| {
                r.initialize_value().unwrap_or_else(|e| {
                    out.push(Output::Telemetry(Telemetry::JsonRpcError {
                        reason: e.as_str(),
                    }));
                    Value::Null
                })
            });
            let answer = Answer {
                result: result.as_ref(),
                error: error.as_ref(),
                status,
            };
            self.on_handshake(ts, origin, init_params, answer, out);
        }
        let empty_content = (method == "tools/call")
            .then(|| result.as_ref().map(ResultFields::is_empty_tool_content))
            .flatten();
        out.push(Output::Event(Event::Exchange(Box::new(Exchange {
            ts: req_ts,
            session_id: sid.clone(),
            server: ctx.server,
            client,
            method: method.clone(),
            request_id: id.to_value(),
            tool: tool.clone(),
            protocol_version,
            http_status: status,
            media_type: media_label(mt.as_deref()),
            sse_events,
            duration_ms: ts.millis_since(req_ts),
            answered: true,
            error_code: error.as_ref().map(|(c, _)| *c),
            empty_content,
        }))));
        let Some(sid) = sid else { return };
        let key = (ctx.server, sid.clone());
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        session.in_flight.remove(&id);
        if !is_2xx(status) || (target != here && on_stream) {
            // Answers on a GET stream say nothing about the POST's response mode.
            return;
        }
        let findings = session.modes.observe(
            &method,
            shape,
            session.streaming_negotiated,
            accept.as_deref(),
        );
        for f in findings {
            session.alerts += 1;
            out.push(Output::Event(Event::Alert(Box::new(Alert {
                ts,
                session_id: Some(sid.clone()),
                server: ctx.server,
                client,
                kind: AlertKind::ContentTypeDivergence(Divergence {
                    method: method.clone(),
                    request_id: id.to_value(),
                    tool: tool.clone(),
                    expected: f.expected,
                    observed: f.observed,
                    reason: f.reason,
                }),
            }))));
        }
    }

    fn on_handshake(
        &mut self,
        ts: Timestamp,
        ex: &Origin,
        init_params: Option<Value>,
        answer: Answer<'_>,
        out: &mut Vec<Output>,
    ) {
        let Answer {
            result,
            error,
            status,
        } = answer;
        let params = init_params.unwrap_or(Value::Null);
        let accepted = result.is_some() && is_2xx(status);
        let reinit_of = headers::request_session_id(&ex.head)
            .is_some()
            .then(|| ex.session_id.clone())
            .flatten();
        let sid = ex.session_id.clone();
        let client_caps = params.get("capabilities").cloned().unwrap_or(Value::Null);
        let client_info = params.get("clientInfo").cloned().unwrap_or(Value::Null);
        let server_caps = result
            .and_then(|r| r.get("capabilities"))
            .cloned()
            .unwrap_or(Value::Null);
        let mut hs = Handshake {
            ts,
            session_id: sid.clone(),
            seq: 1,
            outcome: if accepted {
                Outcome::Accepted
            } else {
                Outcome::Rejected
            },
            http_status: status,
            error_code: error.map(|(c, _)| *c),
            error_message: error.map(|(_, m)| m.clone()),
            client: ex.client,
            server: ex.server,
            host: ex.head.host.clone(),
            path: ex.head.path.clone(),
            protocol_version_requested: params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
            protocol_version: result
                .and_then(|r| r.get("protocolVersion"))
                .and_then(Value::as_str)
                .map(str::to_string),
            client_info: client_info.clone(),
            server_info: result
                .and_then(|r| r.get("serverInfo"))
                .cloned()
                .unwrap_or(Value::Null),
            client_capabilities: client_caps.clone(),
            server_capabilities: server_caps.clone(),
            diff: None,
            client_near_miss: false,
            predecessor_session_id: None,
            lineage: None,
        };
        let record = CapsRecord::new(&client_caps, &server_caps);
        let Some(sid) = sid else {
            // Stateless server: nothing to compare against.
            out.push(Output::Event(Event::Handshake(Box::new(hs))));
            return;
        };
        let key = (ex.server, sid.clone());
        if !self.sessions.contains_key(&key) {
            self.make_room(ts, out);
            out.push(Output::Telemetry(Telemetry::SessionStarted {
                server: ex.server,
                midstream: false,
            }));
            self.sessions
                .insert(key.clone(), new_session(ex.client, ts));
            self.recharge(&key, ts, out);
        }
        let lineage_window = self.limits.lineage_window_ns;
        let client_info_text = compact_json(&client_info);
        let predecessor = if accepted && reinit_of.is_none() {
            self.find_predecessor(
                ex.server,
                ex.client.ip(),
                &client_info_text,
                &sid,
                ts,
                lineage_window,
            )
        } else {
            None
        };
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        session.last_seen = ts;
        session.handshakes += 1;
        hs.seq = session.handshakes;
        if !client_info.is_null() {
            session.client_info = client_info_text;
        }
        let mut alerts = Vec::new();
        match (&session.baseline, accepted) {
            (None, true) => {
                session.streaming_negotiated = record.streaming;
                session.baseline = Some(record.clone());
            }
            (Some(base), _) => {
                let client = PathDiff::between(&base.client_paths, &record.client_paths);
                let server = if accepted {
                    PathDiff::between(&base.server_paths, &record.server_paths)
                } else {
                    PathDiff::default()
                };
                if accepted {
                    session.streaming_negotiated = record.streaming;
                    let change = CapabilityChange::new(
                        hs.seq,
                        &server,
                        &client,
                        base.server_caps(),
                        server_caps.clone(),
                    );
                    if !server.removed.is_empty() {
                        alerts.push(AlertKind::CapabilityNarrowing(change.clone()));
                    }
                    if !server.added.is_empty() {
                        alerts.push(AlertKind::CapabilityWidening(change));
                    }
                    hs.client_near_miss = server.is_empty() && !client.removed.is_empty();
                }
                hs.diff = Some(HandshakeDiff { client, server });
            }
            (None, false) => {}
        }
        session.alerts += alerts.len() as u32;
        if let Some(p) = predecessor {
            hs.predecessor_session_id = Some(p.session_id.clone());
            hs.lineage = p.baseline.as_ref().map(|b| HandshakeDiff {
                client: PathDiff::between(&b.client_paths, &record.client_paths),
                server: PathDiff::between(&b.server_paths, &record.server_paths),
            });
        }
        out.push(Output::Event(Event::Handshake(Box::new(hs))));
        for kind in alerts {
            out.push(Output::Event(Event::Alert(Box::new(Alert {
                ts,
                session_id: Some(sid.clone()),
                server: ex.server,
                client: ex.client,
                kind,
            }))));
        }
        // The handshake may have given the session its baseline and client info.
        self.recharge(&key, ts, out);
        if !accepted && reinit_of.is_some() {
            // A rejected re-initialize: the client will most likely start over in a new session.
            self.remember_ended(&key, ts);
        }
    }

    fn find_predecessor(
        &self,
        server: SocketAddr,
        client_ip: IpAddr,
        client_info: &str,
        sid: &str,
        now: Timestamp,
        window: i64,
    ) -> Option<Ended> {
        self.ended
            .iter()
            .rev()
            .find(|e| {
                e.server == server
                    && e.client_ip == client_ip
                    && e.session_id != sid
                    && &*e.client_info == client_info
                    && now.0.saturating_sub(e.ts.0) <= window
            })
            .cloned()
    }

    fn remember_ended(&mut self, key: &SessionKey, ts: Timestamp) {
        let Some(s) = self.sessions.get(key) else {
            return;
        };
        self.ended
            .retain(|e| !(e.server == key.0 && e.session_id == key.1));
        if self.ended.len() >= MAX_ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back(Ended {
            ts,
            server: key.0,
            client_ip: s.client.ip(),
            client_info: s.client_info.clone(),
            session_id: key.1.clone(),
            baseline: s.baseline.clone(),
        });
    }

    fn end_session(
        &mut self,
        key: &SessionKey,
        ts: Timestamp,
        reason: EndReason,
        out: &mut Vec<Output>,
    ) {
        if matches!(reason, EndReason::Expired | EndReason::Deleted) {
            self.remember_ended(key, ts);
        }
        let Some(s) = self.sessions.remove(key) else {
            return;
        };
        self.session_bytes -= s.charged;
        out.push(Output::Event(Event::SessionEnd(SessionEnd {
            ts,
            session_id: Some(key.1.clone()),
            server: key.0,
            reason,
            handshakes: s.handshakes,
            requests: s.requests,
            alerts: s.alerts,
        })));
    }

    fn on_response_end(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        end: BodyEnd,
        out: &mut Vec<Output>,
    ) {
        let Some(ex) = self.exchanges.remove(&(ctx.flow, exchange)) else {
            return;
        };
        if end == BodyEnd::Unfinished {
            // Cut off by the end of the capture or a timeout: not ended, nothing to conclude.
            return;
        }
        let status = ex.response.as_ref().map_or(0, |r| r.status);
        let mt = ex.response.as_ref().and_then(|r| r.media_type.clone());
        let ended_by = match end {
            BodyEnd::Complete => Some(StreamEnd::FinalChunk),
            BodyEnd::ServerClosed => Some(StreamEnd::ServerClosed),
            _ => None,
        };
        // Only an unanswered initialize needs the request side (copying it is most of the work).
        let origin = ex
            .requests
            .iter()
            .any(|r| !r.answered && r.method == "initialize")
            .then(|| ex.origin());
        for r in ex.requests.iter().filter(|r| !r.answered) {
            if let Some(origin) = &origin
                && r.method == "initialize"
                && ended_by.is_some()
            {
                // An initialize refused at the HTTP level (4xx/5xx without a JSON-RPC error).
                let answer = Answer {
                    result: None,
                    error: None,
                    status,
                };
                self.on_handshake(ts, origin, r.init_params.clone(), answer, out);
            }
            out.push(Output::Event(Event::Exchange(Box::new(Exchange {
                ts: ex.ts,
                session_id: ex.session_id.clone(),
                server: ex.server,
                client: ex.client,
                method: r.method.clone(),
                request_id: r.id.to_value(),
                tool: r.tool.clone(),
                protocol_version: headers::request_protocol_version(&ex.head).map(str::to_string),
                http_status: status,
                media_type: media_label(mt.as_deref()),
                sse_events: ex.stream.items,
                duration_ms: ts.millis_since(ex.ts),
                answered: false,
                error_code: None,
                empty_content: None,
            }))));
            if let Some(sid) = &ex.session_id
                && let Some(s) = self.sessions.get_mut(&(ctx.server, sid.clone()))
            {
                s.in_flight.remove(&r.id);
            }
            let streamed = mt.as_deref() == Some("text/event-stream");
            if let (true, true, Some(ended_by)) = (
                r.method == "tools/call",
                streamed && is_2xx(status),
                ended_by,
            ) {
                let reason = detect::empty_result_reason(ex.stream);
                if let Some(sid) = &ex.session_id
                    && let Some(s) = self.sessions.get_mut(&(ctx.server, sid.clone()))
                {
                    s.alerts += 1;
                }
                out.push(Output::Event(Event::Alert(Box::new(Alert {
                    ts,
                    session_id: ex.session_id.clone(),
                    server: ex.server,
                    client: ex.client,
                    kind: AlertKind::EmptyToolResult(EmptyResult {
                        request_id: r.id.to_value(),
                        tool: r.tool.clone(),
                        reason,
                        sse_events: ex.stream.items,
                        ended_by,
                    }),
                }))));
            }
        }
    }
}

impl ExchangeState {
    fn origin(&self) -> Origin {
        Origin {
            client: self.client,
            server: self.server,
            head: self.head.clone(),
            session_id: self.session_id.clone(),
        }
    }
}

fn new_session(client: SocketAddr, ts: Timestamp) -> Box<Session> {
    Box::new(Session {
        charged: 0,
        client,
        client_info: Box::from("null"),
        last_seen: ts,
        handshakes: 0,
        baseline: None,
        streaming_negotiated: false,
        requests: 0,
        alerts: 0,
        in_flight: HashMap::default(),
        modes: ModeTracker::default(),
    })
}

#[cfg(test)]
mod tests;
