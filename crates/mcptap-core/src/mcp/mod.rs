//! MCP session tracking over HTTP messages: state only.
//!
//! Sessions are keyed by (server endpoint, `Mcp-Session-Id`). Every JSON-RPC request is
//! correlated with its response, whether it came as a JSON body, on the POST's SSE stream or on
//! a GET stream of the same session. Handshakes, exchanges and session ends become events.
//! Whether something is alarming is decided by the detection layer, which implements
//! [`Detector`] and is handed every finished handshake, answer and unanswered request.
//!
//! - [`session`]: one session's state; [`budget`]: the session table and its caps;
//! - [`transactions`]: open exchanges per flow; [`handshake`]: `initialize` as an event;
//! - [`lineage`]: ended sessions a new one may continue; [`review`]: the detection interface.

pub mod budget;
pub mod caps;
pub mod handshake;
pub mod headers;
pub mod lineage;
pub mod review;
pub mod session;
pub mod transactions;

pub use headers::HTTP_INTEREST;
pub use review::{AnswerReview, Detector, HandshakeReview, HandshakeVerdict, UnansweredReview};

use crate::http::sse::SseItem;
use crate::http::{BodyEnd, HttpEvent, RequestHead, ResponseHead};
use crate::jsonrpc::{self, Id, Message, ResultFields};
use crate::model::{
    Alert, AlertKind, EndReason, Event, Exchange, FramingMode, HandshakeDiff, Limit, Output,
    PathDiff, SessionEnd, StreamEnd, Telemetry, Timestamp,
};
use crate::usage::SharedUsage;
use budget::SessionTable;
use handshake::Answer;
use lineage::{Ended, Lineage, LineageKey};
use serde_json::Value;
use session::{ExchangeKey, Resuming, Session, SessionKey};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::Arc;
use transactions::{AnswerShape, ExchangeState, Origin, PendingRequest, Requests, Transactions};

pub use crate::limits::SessionLimits;

/// Where an HTTP event came from.
#[derive(Debug, Clone, Copy)]
pub struct FlowCtx {
    pub flow: u64,
    pub client: SocketAddr,
    pub server: SocketAddr,
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

/// The session layer: HTTP events in, events out, with `D` deciding the alerts.
#[derive(Debug)]
pub struct Tracker<D: Detector> {
    limits: SessionLimits,
    detector: D,
    sessions: SessionTable<D::SessionState>,
    transactions: Transactions,
    lineage: Lineage,
    /// The totals the session table's caps apply to; lineage records count there too.
    usage: Arc<SharedUsage>,
    /// Lineage bytes last added to `usage`.
    published_lineage_bytes: usize,
    /// When each waiting resumption gives up, soonest first.
    resumption_deadlines: BinaryHeap<Reverse<(Timestamp, SessionKey, Id)>>,
}

impl<D: Detector> Tracker<D> {
    /// A session layer with limits of its own.
    pub fn new(limits: SessionLimits, detector: D) -> Self {
        Self::with_usage(limits, detector, Arc::default())
    }

    /// A session layer whose caps are totals over every layer sharing `usage`.
    pub fn with_usage(limits: SessionLimits, detector: D, usage: Arc<SharedUsage>) -> Self {
        Tracker {
            limits,
            detector,
            sessions: SessionTable::new(
                limits.max_sessions,
                limits.max_session_bytes,
                usage.clone(),
            ),
            transactions: Transactions::new(limits.max_exchanges_per_flow),
            // Records of ended sessions may take an eighth of what sessions may.
            lineage: Lineage::new(limits.max_session_bytes / 8),
            usage,
            published_lineage_bytes: 0,
            resumption_deadlines: BinaryHeap::new(),
        }
    }

    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Estimated bytes held by tracked sessions, as charged against `max_session_bytes`.
    pub fn session_bytes(&self) -> usize {
        self.sessions.bytes()
    }

    /// Estimated bytes held by open exchanges (they live as long as their flow).
    pub fn exchange_bytes(&self) -> usize {
        self.transactions.bytes()
    }

    /// Re-estimates what session `key` costs after it changed, then evicts the least recently
    /// seen sessions if all of them no longer fit.
    fn recharge(&mut self, key: &SessionKey, now: Timestamp, out: &mut Vec<Output>) {
        if self.sessions.recharge(key) {
            for old in self.sessions.eviction_batch(Some(key)) {
                self.end_session(&old, now, EndReason::Evicted, out);
            }
        }
    }

    /// Enforces the session caps by ending the least recently seen sessions.
    fn make_room(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        if self.sessions.is_full() {
            for old in self.sessions.eviction_batch(None) {
                self.end_session(&old, now, EndReason::Evicted, out);
            }
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
            HttpEvent::Abandoned { exchange, reason } => {
                out.push(Output::Telemetry(Telemetry::ExchangeAbandoned { reason }));
                if let Some(ex) = self.transactions.remove((ctx.flow, exchange)) {
                    self.forget_in_flight(ctx.server, &ex);
                }
            }
            HttpEvent::Anomaly { exchange, reason } => {
                out.push(Output::Telemetry(Telemetry::FramingAnomaly { reason }));
                if let Some(ex) = exchange.and_then(|e| self.transactions.get_mut((ctx.flow, e)))
                    && let Some(response) = ex.response.as_mut()
                {
                    response.lenient = true;
                }
            }
            HttpEvent::DuplicateHeader { header } => {
                out.push(Output::Telemetry(Telemetry::DuplicateHeader {
                    server: ctx.server,
                    header,
                }));
            }
            HttpEvent::Undecodable { reason, .. } => {
                out.push(Output::Telemetry(Telemetry::UndecodableBody {
                    server: ctx.server,
                    reason,
                }));
            }
            HttpEvent::Error(e) => {
                out.push(Output::Telemetry(Telemetry::HttpError { reason: e }));
            }
            // The pipeline reports these (it knows the server before any request does).
            HttpEvent::NotDecodable { .. } => {}
        }
    }

    /// An exchange that will never be answered on its connection: its requests no longer
    /// wait for answers on other streams either.
    fn forget_in_flight(&mut self, server: SocketAddr, ex: &ExchangeState) {
        if let Some(sid) = &ex.session_id
            && let Some(s) = self.sessions.get_mut(&(server, sid.clone()))
        {
            for r in ex.requests.iter() {
                s.in_flight.remove(&r.id);
            }
        }
    }

    /// The flow is gone: forget its exchanges (their ends were reported by the HTTP layer).
    pub fn on_flow_closed(&mut self, flow: u64) {
        self.transactions.close_flow(flow);
    }

    /// Ends sessions idle for longer than the limit.
    pub fn sweep(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        for key in self.sessions.idle(now, self.limits.session_idle_timeout_ns) {
            self.end_session(&key, now, EndReason::Idle, out);
        }
        self.lineage.expire(now, self.limits.lineage_window_ns);
        self.publish_lineage_bytes();
        while let Some(Reverse((deadline, _, _))) = self.resumption_deadlines.peek()
            && *deadline <= now
        {
            if let Some(Reverse((deadline, key, id))) = self.resumption_deadlines.pop() {
                self.give_up_resumption(&key, &id, Some(deadline), now, true, out);
            }
        }
    }

    /// End of input: streams still waiting for their resumption were cut off by the end of
    /// the capture, which concludes nothing: their exchanges are reported, without alerts.
    pub fn finish(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        // Soonest first, so the reports come in a fixed order.
        while let Some(Reverse((deadline, key, id))) = self.resumption_deadlines.pop() {
            self.give_up_resumption(&key, &id, Some(deadline), now, false, out);
        }
    }

    /// The request `id` of session `key` waited for a resumed stream in vain (`alert`: the
    /// wait is over, so an empty result alerts now) or can no longer tell (capture end,
    /// eviction): its exchange is reported unanswered.
    /// `deadline`: only the wait with that deadline (a later wait for a reused id keeps its
    /// own); `None`: whichever waits.
    fn give_up_resumption(
        &mut self,
        key: &SessionKey,
        id: &Id,
        deadline: Option<Timestamp>,
        now: Timestamp,
        alert: bool,
        out: &mut Vec<Output>,
    ) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let Some(at) = s
            .resuming
            .iter()
            .position(|r| &r.id == id && deadline.is_none_or(|d| d == r.deadline))
        else {
            return;
        };
        let r = s.resuming.swap_remove(at);
        s.in_flight.remove(id);
        let framing = r.exchange.framing;
        let client = r.exchange.client;
        out.push(Output::Event(Event::Exchange(r.exchange)));
        match (alert, r.alert) {
            (true, Some(kind)) => {
                s.alerts += 1;
                push_alert(out, now, key, client, framing, Some(kind));
            }
            (false, Some(_)) => out.push(Output::Telemetry(Telemetry::ResumptionUnresolved {
                server: key.0,
            })),
            (_, None) => {}
        }
    }

    /// The answer to `id` arrived on another stream of session `key` after the stream that
    /// carried its request had ended: a resumed stream (`Last-Event-ID`). Returns whether it
    /// was waited for.
    fn resumed(&mut self, key: &SessionKey, id: &Id, ts: Timestamp, out: &mut Vec<Output>) -> bool {
        let Some(s) = self.sessions.get_mut(key) else {
            return false;
        };
        let Some(at) = s.resuming.iter().position(|r| &r.id == id) else {
            return false;
        };
        let mut r = s.resuming.swap_remove(at);
        s.in_flight.remove(id);
        r.exchange.answered = true;
        r.exchange.duration_ms = ts.millis_since(r.exchange.ts);
        out.push(Output::Event(Event::Exchange(r.exchange)));
        true
    }

    fn valid_session_id(&self, id: Option<&str>, out: &mut Vec<Output>) -> Option<String> {
        let id = id?;
        let ok = session::is_valid_session_id(id, self.limits.max_session_id_len);
        if !ok {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::InvalidSessionId,
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
                            let init_params = (method == "initialize")
                                .then(|| params.and_then(|p| checked_params(p.get(), out)))
                                .flatten();
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
                        reason: e.into(),
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
        let opened = ExchangeState {
            number: exchange,
            ts,
            client: ctx.client,
            server: ctx.server,
            head,
            session_id,
            requests: Requests::new(requests),
            response: None,
            stream: Default::default(),
            charged: 0,
        };
        if let Some(dropped) = self.transactions.open(ctx.flow, opened) {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ExchangesPerFlow,
            }));
            self.forget_in_flight(ctx.server, &dropped);
        }
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
            .insert(key.clone(), Session::new(ctx.client, ts));
        self.recharge(key, ts, out);
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
        let Some(ex) = self.transactions.get_mut((ctx.flow, exchange)) else {
            return;
        };
        if ex.session_id.is_none() && is_2xx(head.status) {
            ex.session_id = learned;
        }
        let status = head.status;
        let is_delete = ex.head.method == "DELETE";
        let named_session = headers::request_session_id(&ex.head).is_some();
        let sid = ex.session_id.clone();
        ex.response = Some(head);
        let Some(sid) = sid else { return };
        let key = (ctx.server, sid);
        if status == 404 && named_session {
            self.end_session(&key, ts, EndReason::Expired, out);
        } else if is_delete && is_2xx(status) {
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
                reason: e.into(),
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
        let Some(ex) = self.transactions.get_mut(key) else {
            return;
        };
        ex.stream.items = ex.stream.items.saturating_add(1);
        if let SseItem::NoData { id: Some(_) } = &item {
            // `id:` alone sets the stream's last event id too: it may be resumed from there.
            ex.stream.event_id_seen = true;
        }
        let SseItem::Event(event) = item else { return };
        ex.stream.event_id_seen |= event.id.is_some();
        if event.retry.is_some() {
            ex.stream.retry_ms = event.retry;
        }
        if event.data.trim().is_empty() {
            return; // priming event
        }
        match jsonrpc::parse_str(&event.data) {
            Ok(msgs) => {
                for m in msgs {
                    if m.is_request_or_notification() {
                        if let Some(ex) = self.transactions.get_mut(key) {
                            ex.stream.messages = ex.stream.messages.saturating_add(1);
                        }
                    } else {
                        self.on_answer(ctx, ts, exchange, m, true, out);
                    }
                }
            }
            Err(e) => out.push(Output::Telemetry(Telemetry::JsonRpcError {
                reason: e.into(),
            })),
        }
    }

    /// Where the open request with `id` lives: this exchange, or (answers on a GET stream)
    /// another exchange of the same session.
    fn locate(&self, here: ExchangeKey, ctx: FlowCtx, id: &Id) -> Option<ExchangeKey> {
        let ex = self.transactions.get(here)?;
        if ex.requests.find_open(id).is_some() {
            return Some(here);
        }
        let sid = ex.session_id.as_ref()?;
        let session = self.sessions.get(&(ctx.server, sid.clone()))?;
        session.in_flight.get(id).copied()
    }

    fn sole_open_request(&self, here: ExchangeKey) -> Option<Id> {
        let ex = self.transactions.get(here)?;
        ex.requests.sole_open().map(|r| r.id.clone())
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
        let Some(target) = self.locate(here, ctx, &id) else {
            out.push(Output::Telemetry(Telemetry::JsonRpcError {
                reason: crate::model::JsonRpcError::UnmatchedResponse,
            }));
            return;
        };
        let carrier = self.transactions.get(here).map(|ex| ex.stream);
        let Some(ex) = self.transactions.get_mut(target) else {
            // The exchange that carried the request is over: a resumed stream, perhaps.
            let sid = self
                .transactions
                .get(here)
                .and_then(|ex| ex.session_id.clone());
            if let Some(sid) = sid {
                self.resumed(&(ctx.server, sid), &id, ts, out);
            }
            return;
        };
        let Some(idx) = ex.requests.find_open(&id) else {
            return;
        };
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
        let req_ts = ex.ts;
        let client = ex.client;
        let (framing, ambiguous) = framing_of(ex);
        let accept = ex.head.accept.clone();
        let Some(request) = ex.requests.answer(idx) else {
            return;
        };
        let method = request.method.clone();
        let tool = request.tool.clone();
        let init_params = request.init_params.take();
        let protocol_version = headers::request_protocol_version(&ex.head).map(str::to_string);
        // The whole request side is only needed for a handshake.
        let origin = (method == "initialize").then(|| ex.origin());
        let sid = ex.session_id.clone();

        if let Some(origin) = &origin {
            let result = result.as_ref().map(|r| {
                r.initialize_value().unwrap_or_else(|e| {
                    out.push(Output::Telemetry(Telemetry::JsonRpcError {
                        reason: e.into(),
                    }));
                    Value::Null
                })
            });
            let answer = Answer {
                result: result.as_ref(),
                error: error.as_ref(),
                status,
            };
            self.on_handshake(ts, origin, init_params.as_deref(), answer, framing, out);
        }
        let empty_content = (method == "tools/call")
            .then(|| result.as_ref().map(ResultFields::is_empty_tool_content))
            .flatten();
        let request_id = id.to_value();
        out.push(Output::Event(Event::Exchange(Box::new(Exchange {
            ts: req_ts,
            session_id: sid.clone(),
            server: ctx.server,
            client,
            method: method.clone(),
            request_id: request_id.clone(),
            tool: tool.clone(),
            protocol_version,
            http_status: status,
            media_type: media_label(mt.as_deref()),
            sse_events,
            duration_ms: ts.millis_since(req_ts),
            answered: true,
            error_code: error.as_ref().map(|(c, _)| *c),
            empty_content,
            framing,
            ambiguous,
        }))));
        let Some(sid) = sid else { return };
        let key = (ctx.server, sid);
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        session.in_flight.remove(&id);
        let review = AnswerReview {
            method: &method,
            tool: tool.as_deref(),
            request_id: &request_id,
            http_status: status,
            is_error: error.is_some(),
            shape,
            on_other_stream: target != here && on_stream,
            streaming_negotiated: session.streaming_negotiated,
            accept: accept.as_deref(),
            ambiguous,
        };
        let alert = self.detector.answer(&mut session.detection, &review);
        session.alerts += u32::from(alert.is_some());
        push_alert(out, ts, &key, client, framing, alert);
    }

    fn on_handshake(
        &mut self,
        ts: Timestamp,
        origin: &Origin,
        init_params: Option<&str>,
        answer: Answer<'_>,
        framing: FramingMode,
        out: &mut Vec<Output>,
    ) {
        let params = match init_params.map(serde_json::from_str::<Value>) {
            None => Value::Null,
            Some(Ok(v)) => v,
            Some(Err(_)) => {
                out.push(Output::Telemetry(Telemetry::JsonRpcError {
                    reason: crate::model::JsonRpcError::InvalidJson,
                }));
                Value::Null
            }
        };
        let accepted = answer.accepted();
        let reinit = handshake::reinitialized_session(origin).is_some();
        let (mut hs, record) = handshake::describe(ts, origin, &params, answer);
        if record.truncated {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::CapabilityPaths,
            }));
        }
        let Some(sid) = origin.session_id.clone() else {
            // Stateless server: nothing to compare against.
            out.push(Output::Event(Event::Handshake(Box::new(hs))));
            return;
        };
        let key = (origin.server, sid);
        if !self.sessions.contains(&key) {
            self.make_room(ts, out);
            out.push(Output::Telemetry(Telemetry::SessionStarted {
                server: origin.server,
                midstream: false,
            }));
            self.sessions
                .insert(key.clone(), Session::new(origin.client, ts));
            self.recharge(&key, ts, out);
        }
        let client_info_text = session::client_info_key(&hs.client_info);
        if accepted && !reinit {
            let lineage_key = LineageKey {
                server: origin.server,
                client_ip: origin.client.ip(),
                client_info: client_info_text.clone(),
            };
            let window = self.limits.lineage_window_ns;
            let predecessor = self.lineage.predecessor(&lineage_key, ts, window);
            if let Some(p) = predecessor {
                hs.predecessor_session_id = Some(p.session_id.clone());
                hs.lineage = p.baseline.as_ref().map(|b| HandshakeDiff {
                    client: PathDiff::between(&b.client_paths, &record.client_paths),
                    server: PathDiff::between(&b.server_paths, &record.server_paths),
                });
            }
        }
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        session.last_seen = ts;
        session.handshakes += 1;
        hs.seq = session.handshakes;
        if !hs.client_info.is_null() {
            session.client_info = client_info_text;
        }
        hs.diff = session.baseline.as_ref().map(|base| HandshakeDiff {
            client: PathDiff::between(&base.client_paths, &record.client_paths),
            server: if accepted {
                PathDiff::between(&base.server_paths, &record.server_paths)
            } else {
                PathDiff::default()
            },
        });
        let verdict = self.detector.handshake(&HandshakeReview {
            seq: hs.seq,
            accepted,
            baseline: session.baseline.as_ref(),
            diff: hs.diff.as_ref(),
            server_capabilities: &hs.server_capabilities,
        });
        hs.client_near_miss = verdict.client_near_miss;
        if accepted {
            session.streaming_negotiated = record.streaming;
            if session.baseline.is_none() {
                session.baseline = Some(record);
            }
        }
        session.alerts += u32::from(verdict.alert.is_some());
        let client = origin.client;
        out.push(Output::Event(Event::Handshake(Box::new(hs))));
        push_alert(out, ts, &key, client, framing, verdict.alert);
        // The handshake may have given the session its baseline and client info.
        self.recharge(&key, ts, out);
        if !accepted && reinit {
            // A rejected re-initialize: the client will most likely start over in a new session.
            self.remember_ended(&key, ts, out);
        }
    }

    fn remember_ended(&mut self, key: &SessionKey, ts: Timestamp, out: &mut Vec<Output>) {
        let Some(s) = self.sessions.get(key) else {
            return;
        };
        let lineage_key = LineageKey {
            server: key.0,
            client_ip: s.client.ip(),
            client_info: s.client_info.clone(),
        };
        let record = Ended {
            ts,
            session_id: key.1.clone(),
            baseline: s.baseline.clone(),
        };
        let dropped = self.lineage.remember(lineage_key, record);
        for _ in 0..dropped.0 {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::LineageRecords,
            }));
        }
        self.publish_lineage_bytes();
    }

    /// Lineage records count against the session budget with the sessions.
    fn publish_lineage_bytes(&mut self) {
        let now = self.lineage.bytes();
        self.usage
            .republish_session_bytes(self.published_lineage_bytes, now);
        self.published_lineage_bytes = now;
    }

    fn end_session(
        &mut self,
        key: &SessionKey,
        ts: Timestamp,
        reason: EndReason,
        out: &mut Vec<Output>,
    ) {
        // An evicted session keeps its lineage record: its client may well come back.
        if matches!(
            reason,
            EndReason::Expired | EndReason::Deleted | EndReason::Evicted
        ) {
            self.remember_ended(key, ts, out);
        }
        // Requests still waiting for a resumed stream wait in vain now; an eviction is the
        // monitor's own doing and concludes nothing about them.
        let waiting: Vec<Id> = self
            .sessions
            .get(key)
            .map(|s| s.resuming.iter().map(|r| r.id.clone()).collect())
            .unwrap_or_default();
        for id in waiting {
            self.give_up_resumption(key, &id, None, ts, reason != EndReason::Evicted, out);
        }
        let Some(s) = self.sessions.remove(key) else {
            return;
        };
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
        let Some(ex) = self.transactions.remove((ctx.flow, exchange)) else {
            return;
        };
        if end == BodyEnd::Unfinished {
            // Cut off by the end of the capture or a timeout: not ended, nothing to conclude.
            return;
        }
        let status = ex.response.as_ref().map_or(0, |r| r.status);
        let mt = ex.response.as_ref().and_then(|r| r.media_type.clone());
        let (framing, ambiguous) = framing_of(&ex);
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
                self.on_handshake(ts, origin, r.init_params.as_deref(), answer, framing, out);
            }
            let request_id = r.id.to_value();
            let exchange = Box::new(Exchange {
                ts: ex.ts,
                session_id: ex.session_id.clone(),
                server: ex.server,
                client: ex.client,
                method: r.method.clone(),
                request_id: request_id.clone(),
                tool: r.tool.clone(),
                protocol_version: headers::request_protocol_version(&ex.head).map(str::to_string),
                http_status: status,
                media_type: media_label(mt.as_deref()),
                sse_events: ex.stream.items,
                duration_ms: ts.millis_since(ex.ts),
                answered: false,
                error_code: None,
                empty_content: None,
                framing,
                ambiguous,
            });
            let alert = self.detector.unanswered(&UnansweredReview {
                method: &r.method,
                tool: r.tool.as_deref(),
                request_id: &request_id,
                http_status: status,
                media_type: mt.as_deref(),
                stream: ex.stream,
                ended_by,
            });
            let key = ex.session_id.as_ref().map(|sid| (ctx.server, sid.clone()));
            let session = key.as_ref().and_then(|k| self.sessions.get_mut(k));
            // The server may close a stream after an event with an id and answer on the
            // resumed one (2025-11-25): wait for it before concluding anything.
            let resumable = ended_by.is_some() && ex.stream.event_id_seen;
            if let (Some(s), Some(key), true) = (session, &key, resumable)
                && s.resuming.len() < MAX_RESUMING_PER_SESSION
            {
                let retry = ex.stream.retry_ms.map_or(0, |ms| {
                    i64::try_from(ms)
                        .unwrap_or(i64::MAX)
                        .saturating_mul(1_000_000)
                });
                // A server's `retry` stretches the wait, within reason.
                let wait = self.limits.resumption_window_ns.max(
                    retry
                        .saturating_add(5_000_000_000)
                        .min(MAX_RESUMPTION_WAIT_NS),
                );
                let deadline = Timestamp(ts.0.saturating_add(wait));
                s.resuming.push(Resuming {
                    id: r.id.clone(),
                    deadline,
                    exchange,
                    alert,
                });
                self.resumption_deadlines
                    .push(Reverse((deadline, key.clone(), r.id.clone())));
                self.recharge(key, ts, out);
                continue;
            }
            out.push(Output::Event(Event::Exchange(exchange)));
            let session = key.as_ref().and_then(|k| self.sessions.get_mut(k));
            if let Some(s) = session {
                s.in_flight.remove(&r.id);
                s.alerts += u32::from(alert.is_some());
            }
            if let Some(kind) = alert {
                out.push(Output::Event(Event::Alert(Box::new(Alert {
                    ts,
                    session_id: ex.session_id.clone(),
                    server: ex.server,
                    client: ex.client,
                    kind,
                    framing,
                }))));
            }
        }
    }
}

impl<D: Detector> Drop for Tracker<D> {
    /// Lineage records no longer count against the shared totals.
    fn drop(&mut self) {
        self.usage
            .republish_session_bytes(self.published_lineage_bytes, 0);
    }
}

/// Longest a server's `retry` may stretch the wait for a resumed stream.
const MAX_RESUMPTION_WAIT_NS: i64 = 600 * 1_000_000_000;

/// Requests of one session waiting for a resumed stream at once; beyond, an empty result
/// concludes at once.
const MAX_RESUMING_PER_SESSION: usize = 64;

/// Deepest nesting of `initialize` params accepted (serde_json's own limit when it parses them).
const MAX_PARAMS_DEPTH: usize = 128;

/// `initialize` params kept as text, checked now (one pass, no tree built) so that hostile
/// ones, nested beyond what the handshake will parse, are counted when they arrive.
fn checked_params(text: &str, out: &mut Vec<Output>) -> Option<Box<str>> {
    if nesting_depth(text.as_bytes()) <= MAX_PARAMS_DEPTH {
        return Some(Box::from(text));
    }
    out.push(Output::Telemetry(Telemetry::JsonRpcError {
        reason: crate::model::JsonRpcError::InvalidJson,
    }));
    None
}

/// The deepest array/object nesting of a JSON text (strings skipped, escapes honoured).
fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// How an exchange was framed (strict or lenient) and whether a header made it ambiguous.
fn framing_of(ex: &ExchangeState) -> (FramingMode, bool) {
    let response = ex.response.as_ref();
    let lenient = ex.head.lenient || response.is_some_and(|r| r.lenient);
    let ambiguous = ex.head.ambiguous || response.is_some_and(|r| r.ambiguous);
    (FramingMode::of(lenient), ambiguous)
}

/// An alert of session `key` about an exchange framed `framing`, as an event.
fn push_alert(
    out: &mut Vec<Output>,
    ts: Timestamp,
    key: &SessionKey,
    client: SocketAddr,
    framing: FramingMode,
    alert: Option<AlertKind>,
) {
    if let Some(kind) = alert {
        out.push(Output::Event(Event::Alert(Box::new(Alert {
            ts,
            session_id: Some(key.1.clone()),
            server: key.0,
            client,
            kind,
            framing,
        }))));
    }
}

#[cfg(test)]
mod tests {
    use super::nesting_depth;

    #[test]
    fn nesting_depth_skips_strings_and_escapes() {
        assert_eq!(nesting_depth(br#"{}"#), 1);
        assert_eq!(nesting_depth(br#"{"a":[{"b":[]}]}"#), 4);
        assert_eq!(nesting_depth(br#"{"a":"[[[{{{","b":"\"[[["}"#), 1);
        assert_eq!(nesting_depth(b"1"), 0);
    }
}
