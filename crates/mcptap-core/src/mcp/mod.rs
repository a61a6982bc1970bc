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
pub mod identity;
pub mod lineage;
pub mod modern;
pub mod review;
pub mod session;
pub mod snapshot;
pub mod text_cache;
pub mod transactions;

pub use headers::HTTP_INTEREST;
pub use review::{
    AnswerReview, AnswerVerdict, DeclarationReview, Detector, DiscoverReview, DowngradeReview,
    HandshakeReview, HandshakeVerdict, HeapBytes, MismatchReview, UnansweredReview,
};

use crate::http::sse::SseItem;
use crate::http::{BodyEnd, HttpEvent, RequestHead, ResponseHead, Spent};
use crate::jsonrpc::{self, Id, Message, ResultFields};
use crate::model::{
    Alert, AlertKind, Direction, EndReason, Era, Event, Exchange, FailedAnswer, FramingMode,
    Handshake, HandshakeDiff, HandshakeSource, InputRequired, Limit, Outcome, Output, PathDiff,
    SessionEnd, SharedAlert, SharedJson, SharedRequest, StreamEnd, Telemetry, Timestamp,
};
use crate::table_hash::HashMap;
use crate::usage::SharedUsage;
use budget::SessionTable;
use handshake::Answer;
use identity::Identities;
use lineage::{Ended, Lineage, LineageKey, StatelessLabels};
use modern::{ParamHeader, RequestFacts};
use serde_json::Value;
use session::{
    CapsRecord, EraState, ExchangeKey, InputPending, MethodDeclarations, Resuming, Scope,
    ServerRequest, Session, SessionKey, SessionKeyRef,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::Arc;
use text_cache::{CacheLimits, TextCache};
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
    identities: Identities,
    sessions: SessionTable<D::SessionState>,
    transactions: Transactions,
    lineage: Lineage,
    /// The totals the session table's caps apply to; lineage records count there too.
    usage: Arc<SharedUsage>,
    /// Lineage bytes last added to `usage`.
    published_lineage_bytes: usize,
    /// When each waiting resumption gives up, soonest first. A wait that ended early (its
    /// answer came, its session ended) leaves its entry until it falls due or a purge.
    resumption_deadlines: BinaryHeap<Reverse<(Timestamp, SessionKey, Id)>>,
    /// Entries in `resumption_deadlines` at which the ones of ended waits are purged.
    deadlines_purge_at: usize,
    /// When a lineage's oldest `InputRequiredResult` stops waiting for its retry.
    input_deadlines: BinaryHeap<Reverse<(Timestamp, SessionKey)>>,
    /// HTTP+SSE: POST endpoints announced by `endpoint` events, (server, path and query) to
    /// the session they belong to.
    sse_endpoints: HashMap<(SocketAddr, Box<str>), Box<str>>,
    /// Legacy stateless clients: the clientInfo label of the latest `initialize` per (server,
    /// client identity), so their later requests (which name no client) join its lineage.
    stateless_labels: StatelessLabels,
    /// What handshakes seen before declared (see [`session::HandshakeCache`]).
    handshakes: session::HandshakeCache,
    /// Lineage ids and route buckets by (server endpoint, server identity, client identity,
    /// label): a client comes back under the same ones with every request.
    lineage_ids: TextCache<4, (Box<str>, u16)>,
    /// What `server/discover` results seen before said (see [`DiscoverReading`]).
    discovers: TextCache<3, DiscoverReading>,
    /// What request `_meta` texts seen before declared (see [`modern::read_meta`]).
    declarations: TextCache<1, Option<Arc<modern::Declaration>>>,
    /// Request params texts already validated (see [`ParamsShape`]), kept from their second
    /// sighting on.
    params_seen: TextCache<1, ParamsShape>,
    params_sightings: text_cache::Sightings,
    /// Connections that opened with a PROXY protocol header: the client it named.
    proxied: HashMap<u64, std::net::IpAddr>,
    /// Fleet mode: sessions shared through the adapter's store.
    fleet: Option<Box<Fleet>>,
    /// One shard of a session layer sharded by client: where the other shards' writes of
    /// server-scoped entries are read and this shard's go (see [`ServerScope`]).
    server_scope: Option<Box<dyn ServerScope<D::SessionState>>>,
    /// The version of each server-scoped entry held here, as `server_scope` numbered it.
    server_versions: HashMap<SessionKey, u64>,
    /// The time of the latest sweep: a replica last seen longer ago ended there.
    last_sweep: Timestamp,
    /// Sharded: where each unit of a sweep's or the end's outputs starts, and its key, so
    /// that the shards' outputs merge into one worker's order ([`GroupKey`]).
    group_marks: Option<Vec<(usize, GroupKey)>>,
    /// Kept to be handed back instead of freed here (see [`Tracker::keep_spent`]).
    spent: Option<Spent>,
}

/// The order one worker makes the outputs of a sweep or of the end of the input in, unit by
/// unit: idle sessions ended by key, then waits for a resumption given up by deadline (then
/// key and request), then `InputRequiredResult`s released by deadline, then HTTP+SSE requests
/// left unanswered by key. A sweep has the first three, the end the last three. Each shard of
/// a sharded session layer makes its own sessions' units in this order; merged by key, they
/// are one worker's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupKey {
    Idle(SessionKey),
    Resumption(Timestamp, SessionKey, Id),
    Input(Timestamp, SessionKey),
    Parked(SessionKey),
}

/// The server-scoped entries of a session layer sharded by client (`docs/sharding.md`): a
/// server's `server/discover` result and `x-mcp-header` tools, and each stateless endpoint's
/// response modes. Every client's traffic reads and writes them, so each shard keeps
/// replicas. Before it reads one, it takes the latest version that any shard wrote earlier in
/// the input. After a write, it hands the entry out. An implementation orders these calls by
/// input position, which is one worker's order (a serial one trivially; threads by waiting
/// for the other shards' progress), so every shard sees what one worker would. Each write
/// site reads first, so no shard can write ahead of another's read: the latest version is
/// always the one to read.
pub trait ServerScope<D>: Send + std::fmt::Debug {
    /// The entry `key` as last written, when its version is newer than `have` (0: none held).
    fn newer(&mut self, key: &SessionKey, have: u64) -> Option<(u64, Box<Session<D>>)>;
    /// This shard wrote `entry` (its state now); returns the version it becomes.
    fn publish(&mut self, key: &SessionKey, entry: Box<Session<D>>) -> u64;
    /// This shard swept at `now`: entries last seen more than `idle_ns` before it have ended
    /// (every shard reads them as ended), so the scope may forget them.
    fn swept(&mut self, now: Timestamp, idle_ns: i64) {
        let _ = (now, idle_ns);
    }
}

/// Fleet mode's bookkeeping: sessions waiting for the store's answer with their held
/// messages, and sessions whose shared state changed.
#[derive(Debug, Default)]
struct Fleet {
    pending: HashMap<SessionKey, Held>,
    by_fleet_key: HashMap<Box<str>, Vec<SessionKey>>,
    /// Exchanges (flow, exchange) whose request waits behind a pending lookup: the rest of
    /// that exchange (its answer) waits with it, nothing else of its connection.
    held_exchanges: HashMap<(u64, u64), SessionKey>,
    /// Connections whose `initialize` waits for its lineage's state: a session this instance
    /// does not know that comes next on the connection (the initialize's answer may create
    /// it) waits behind it. Nothing else does.
    flow_waits: HashMap<u64, SessionKey>,
    /// Held exchanges per connection, and connections that closed while some were held
    /// (closed when the last is released).
    held_per_flow: HashMap<u64, usize>,
    closed_flows: crate::table_hash::HashSet<u64>,
    held_bytes: usize,
    dirty: Vec<SessionKey>,
    /// Sessions by their fleet-wide key (for conflicts).
    sessions: HashMap<Box<str>, SessionKey>,
    /// Lineages by their fleet-wide key: looked up (or created) already, and their version.
    lineages: HashMap<Box<str>, SharedMark>,
    /// The input ended: what waits is released, nothing new is looked up.
    closing: bool,
    /// Held messages processed again after a release (each once: linear in what was held).
    replayed: u64,
    /// Sessions the store did not have, looked up ahead of their turn (their connection
    /// waited for another): not asked again when their request comes.
    absent: crate::table_hash::HashSet<SessionKey>,
}

/// A request's JSON-RPC messages and whom they belong to, before its exchange is opened.
#[derive(Debug)]
struct ClassifiedRequest {
    session_id: Option<String>,
    era: Era,
    requests: Vec<PendingRequest>,
    client_answers: Vec<(Id, Option<i64>)>,
    /// Set for requests without a session and for `initialize`.
    lineage_id: Option<Box<str>>,
    /// The client's route bucket, with `lineage_id`.
    route: Option<u16>,
    /// Requests the client cancelled (`notifications/cancelled`), by id.
    cancels: Vec<Id>,
}

/// Most sessions indexed by fleet key; beyond, a conflict on an unindexed one is not merged
/// (its next change is written over the store's).
const MAX_FLEET_SESSIONS: usize = 1 << 20;

/// A session's or lineage's messages held until the store answers.
#[derive(Debug)]
struct Held {
    fleet_key: Box<str>,
    /// The client whose request asked.
    client: SocketAddr,
    events: Vec<(FlowCtx, Timestamp, HeldMessage)>,
    bytes: usize,
    /// Exchanges whose messages wait here.
    exchanges: Vec<(u64, u64)>,
}

/// A held message: as it came, or a request already classified (its body parsed).
#[derive(Debug)]
enum HeldMessage {
    Http(HttpEvent),
    Request {
        exchange: u64,
        head: Box<RequestHead>,
        request: ClassifiedRequest,
        /// What it was charged when first held.
        cost: usize,
    },
}

/// What this instance last wrote (or found) of a lineage's shared record.
#[derive(Debug)]
struct SharedMark {
    server: SocketAddr,
    version: u64,
    /// Of the record's lasting content (0: unknown).
    digest: u64,
}

/// Lineages whose store version is remembered at once; beyond, the index starts over.
const MAX_FLEET_LINEAGES: usize = 65_536;

/// The fleet-wide key of a stateless server's endpoint (method and tool).
pub fn fleet_endpoint_key(server_identity: &str, method: &str, tool: Option<&str>) -> String {
    // Cut as the table key cuts it, so that one local endpoint is one record everywhere.
    let tool = tool.map(|t| &t[..session::floor_boundary(t, 128)]);
    joined(&[
        "endpoint:",
        &identity::lineage_id(server_identity, method, tool.unwrap_or("\0")),
    ])
}

/// Fleet keys of lineage records start with this.
const LINEAGE_FLEET_PREFIX: &str = "lineage:";

/// The fleet-wide key of a lineage (its id already names the server and the client).
pub fn fleet_lineage_key(lineage_id: &str) -> String {
    joined(&[LINEAGE_FLEET_PREFIX, lineage_id])
}

/// The digest of what lasts in `entry`: counters that move with every request (requests,
/// last seen, declaration sequence) and the version are left out, so that a write goes
/// out only when something a detector uses changed. `None`: it does not serialize.
fn lasting_digest<D: serde::Serialize>(entry: &mut snapshot::SessionEntry<D>) -> Option<u64> {
    let requests = std::mem::take(&mut entry.requests);
    let last_seen = std::mem::take(&mut entry.last_seen_ns);
    let version = std::mem::take(&mut entry.shared_version);
    let seq = entry
        .era_state
        .as_mut()
        .map(|e| std::mem::take(&mut e.declaration_seq));
    let text = serde_json::to_string(&*entry).ok();
    entry.requests = requests;
    entry.last_seen_ns = last_seen;
    entry.shared_version = version;
    if let (Some(e), Some(seq)) = (entry.era_state.as_mut(), seq) {
        e.declaration_seq = seq;
    }
    text.map(|t| text_digest(&t))
}

/// Takes the alerts of `out[start..]` that `mine` picks, each named fleet-wide under
/// `fleet_key` (they wait for the fleet's verdict).
fn take_alerts(
    out: &mut Vec<Output>,
    start: usize,
    fleet_key: &str,
    mine: impl Fn(&Alert) -> bool,
) -> Vec<SharedAlert> {
    let start = start.min(out.len());
    let picked = |o: &Output| matches!(o, Output::Event(Event::Alert(a)) if mine(a));
    if !out[start..].iter().any(picked) {
        return Vec::new();
    }
    // One pass over the tail: removing each alert in place moved the rest of `out` once per
    // alert (a batch whose answers each alert made that quadratic).
    let tail: Vec<Output> = out.drain(start..).collect();
    let mut alerts = Vec::new();
    for o in tail {
        match o {
            Output::Event(Event::Alert(a)) if mine(&a) => {
                let dedup = format!("{fleet_key}:{}", a.kind.identity());
                alerts.push(SharedAlert {
                    dedup,
                    event: Event::Alert(a),
                });
            }
            other => out.push(other),
        }
    }
    alerts
}

#[cfg(test)]
mod take_alerts_tests {
    use super::*;
    use crate::model::{AlertKind, EmptyReason, EmptyResult, StreamEnd};

    fn alert(id: u64, session: &str) -> Output {
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        Output::Event(Event::Alert(Box::new(Alert {
            v: Default::default(),
            ts: Timestamp(id as i64),
            session_id: Some(session.to_string()),
            server: addr,
            client: addr,
            kind: AlertKind::EmptyToolResult(EmptyResult {
                request_id: Value::from(id),
                tool: None,
                reason: EmptyReason::NoEvents,
                sse_events: 0,
                ended_by: StreamEnd::FinalChunk,
            }),
            framing: FramingMode::Strict,
            era: Era::Legacy,
            protocol_version: None,
            lineage_id: None,
        })))
    }

    fn session_of(o: &Output) -> Option<&str> {
        match o {
            Output::Event(Event::Alert(a)) => a.session_id.as_deref(),
            _ => None,
        }
    }

    /// The picked alerts after `start` come out in order, everything else stays in order, and
    /// tens of thousands of them take one pass.
    #[test]
    fn picked_alerts_leave_in_order_and_the_rest_stays() {
        let mut out = vec![alert(0, "mine")];
        for i in 1..=40_000u64 {
            out.push(alert(i, if i % 2 == 0 { "mine" } else { "other" }));
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ParkedPosts,
            }));
        }
        let taken = take_alerts(&mut out, 1, "fleet", |a| {
            a.session_id.as_deref() == Some("mine")
        });
        assert_eq!(taken.len(), 20_000);
        for (n, t) in taken.iter().enumerate() {
            assert_eq!(t.dedup, format!("fleet:empty_tool_result:{}", 2 * (n + 1)));
            let Event::Alert(a) = &t.event else {
                panic!("not an alert");
            };
            assert_eq!(a.ts, Timestamp(2 * (n as i64 + 1)));
        }
        // The one before `start` stays; the rest alternate as they came.
        assert_eq!(out.len(), 1 + 20_000 + 40_000);
        assert_eq!(session_of(&out[0]), Some("mine"));
        let others: Vec<i64> = out
            .iter()
            .filter_map(|o| match o {
                Output::Event(Event::Alert(a)) => Some(a.ts.0),
                _ => None,
            })
            .skip(1)
            .collect();
        assert_eq!(others, (0..20_000).map(|n| 2 * n + 1).collect::<Vec<_>>());
        assert!(take_alerts(&mut out, 1, "fleet", |_| false).is_empty());
    }
}

/// Bounds of fleet mode's held messages: per session, in all, and sessions waiting at once.
/// Beyond, a session goes on with its local view at once (counted).
const MAX_HELD_BYTES_PER_SESSION: usize = 1 << 20;
const MAX_HELD_BYTES: usize = 16 << 20;
const MAX_PENDING_LOOKUPS: usize = 4096;

/// The exchange an HTTP event belongs to, if it belongs to one.
fn exchange_id_of(ev: &HttpEvent) -> Option<u64> {
    match ev {
        HttpEvent::Request { exchange, .. }
        | HttpEvent::ResponseHead { exchange, .. }
        | HttpEvent::ResponseJson { exchange, .. }
        | HttpEvent::ResponseSse { exchange, .. }
        | HttpEvent::ResponseEnd { exchange, .. }
        | HttpEvent::NoResponse { exchange, .. }
        | HttpEvent::ClientGone { exchange }
        | HttpEvent::Abandoned { exchange, .. } => Some(*exchange),
        HttpEvent::Anomaly { exchange, .. } | HttpEvent::Undecodable { exchange, .. } => *exchange,
        HttpEvent::DuplicateHeader { .. }
        | HttpEvent::NotDecodable { .. }
        | HttpEvent::ProxyHeader { .. }
        | HttpEvent::Error(_) => None,
    }
}

/// Roughly what a held message holds.
pub(crate) fn held_cost(ev: &HttpEvent) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
    256 + match ev {
        HttpEvent::Request { head, body, .. } => body.capacity() + head.heap_bytes(),
        HttpEvent::ResponseJson { body, .. } => body.capacity(),
        // An event's type and id are as long as the wire made them.
        HttpEvent::ResponseSse {
            item: SseItem::Event(e),
            ..
        } => e.data.capacity() + text(&e.event_type) + text(&e.id),
        HttpEvent::ResponseSse {
            item: SseItem::NoData { id },
            ..
        } => text(id),
        _ => 0,
    }
}

/// The fleet-wide key of a session: its server's identity and its id.
pub fn fleet_session_key(server_identity: &str, session_id: &str) -> String {
    joined(&[
        "session:",
        &identity::lineage_id(server_identity, "", ""),
        ":",
        session_id,
    ])
}

/// `parts` end to end: keys are built on every request, and `format!` costs several times
/// more than copying.
pub(crate) fn joined(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// Most connections whose PROXY protocol source is remembered at once (beyond: counted, and
/// their clients are identified by the peer address).
pub(crate) const MAX_PROXIED_FLOWS: usize = 65_536;

/// Bounds of the tracker's small indexes (entries; each a few hundred bytes at most).
const MAX_SSE_ENDPOINTS: usize = 4096;
/// Most `supportedVersions` of a discover result compared (the latest ones).
pub(crate) const MAX_SUPPORTED_VERSIONS: usize = 64;
/// Longest HTTP+SSE endpoint (path and query) kept.
const MAX_SSE_ENDPOINT_BYTES: usize = 1024;
/// Most lineage ids kept worked out, whatever the byte bound (a gateway's clients come back
/// under a few thousand identities).
const MAX_CACHED_LINEAGE_IDS: usize = 16_384;
/// Most distinct `server/discover` results whose reading is kept.
const MAX_CACHED_DISCOVERS: usize = 256;
/// Most distinct request `_meta` texts whose declaration is kept.
const MAX_CACHED_DECLARATIONS: usize = 1024;
/// Identities and labels longer than this are hashed every time (they are cut at 512 bytes).
const MAX_CACHED_IDENTITY: usize = 512;

/// What an alert is about: where, who, which era.
/// Borrowed: most answers raise nothing, so the strings are copied only into an alert.
struct AlertCtx<'a> {
    session_id: Option<&'a str>,
    lineage_id: Option<&'a str>,
    era: Era,
    protocol_version: Option<&'a str>,
    server: SocketAddr,
    client: SocketAddr,
    framing: FramingMode,
}

impl AlertCtx<'_> {
    fn push(&self, out: &mut Vec<Output>, ts: Timestamp, kind: Option<AlertKind>) {
        if let Some(kind) = kind {
            out.push(Output::Event(Event::Alert(Box::new(Alert {
                v: Default::default(),
                ts,
                session_id: self.session_id.map(str::to_string),
                server: self.server,
                client: self.client,
                kind,
                framing: self.framing,
                era: self.era,
                protocol_version: self.protocol_version.map(str::to_string),
                lineage_id: self.lineage_id.map(str::to_string),
            }))));
        }
    }
}

/// An answered or ended request, as the era-aware steps need it.
struct Concluded<'a> {
    ts: Timestamp,
    server: SocketAddr,
    client: SocketAddr,
    era: Era,
    lineage_id: Option<&'a str>,
    route: Option<u16>,
    session_id: Option<&'a str>,
    /// The request's `Host` and path: where a modern declaration or discover result was made.
    host: Option<&'a str>,
    path: &'a str,
    method: &'a str,
    tool: Option<&'a str>,
    request_id: &'a Value,
    status: u16,
    media_type: Option<&'a str>,
    error_code: Option<i64>,
    facts: Option<&'a modern::RequestFacts>,
    findings: &'a [modern::HeaderFinding],
    result: Option<&'a ResultFields<'a>>,
    framing: FramingMode,
    protocol_version: Option<&'a str>,
    /// A JSON-RPC response was seen (an ended stream without one is no success).
    answered: bool,
}

/// A member's JSON text, "" when absent.
fn raw_text(raw: Option<jsonrpc::Json<'_>>) -> &str {
    raw.map_or("", |r| r.get())
}

/// What an answer on a resumed stream says, for its exchange event.
struct ResumedAnswer {
    error_code: Option<i64>,
    empty_content: Option<bool>,
}

/// The exchange event of request `method` of `ex`, unanswered; callers fill in the answer.
fn exchange_of(
    ex: &ExchangeState,
    method: String,
    tool: Option<String>,
    request_id: Value,
    protocol_version: Option<String>,
) -> Exchange {
    let (framing, ambiguous) = framing_of(ex);
    let mt = ex.response.as_ref().and_then(|r| r.media_type.as_deref());
    Exchange {
        v: Default::default(),
        ts: ex.ts,
        session_id: ex.session_id.clone(),
        server: ex.server,
        client: ex.client,
        method,
        request_id,
        tool,
        protocol_version,
        http_status: ex.response.as_ref().map_or(0, |r| r.status),
        media_type: media_label(mt),
        sse_events: 0,
        duration_ms: 0.0,
        answered: false,
        error_code: None,
        empty_content: None,
        cancelled: false,
        framing,
        ambiguous,
        era: ex.era,
        lineage_id: ex.lineage_id.as_deref().map(str::to_string),
        direction: Direction::ClientToServer,
        input_required: None,
    }
}

impl<D: Detector> Tracker<D> {
    /// Entries in the resumption deadline heap (tests).
    #[cfg(test)]
    pub(crate) fn resumption_deadlines_len(&self) -> usize {
        self.resumption_deadlines.len()
    }

    /// A session layer with limits of its own.
    pub fn new(limits: SessionLimits, detector: D) -> Self {
        Self::with_usage(limits, detector, Arc::default())
    }

    /// A session layer whose caps are totals over every layer sharing `usage`.
    pub fn with_usage(limits: SessionLimits, detector: D, usage: Arc<SharedUsage>) -> Self {
        Tracker {
            limits,
            detector,
            identities: Identities::default(),
            sessions: SessionTable::new(
                limits.max_sessions,
                limits.max_session_bytes,
                usage.clone(),
            ),
            transactions: Transactions::new(limits.max_exchanges_per_flow),
            // Records of ended sessions may take an eighth of what sessions may; stateless
            // clients' labels a thirty-second.
            lineage: Lineage::new(limits.max_session_bytes / 8),
            stateless_labels: StatelessLabels::new(limits.max_session_bytes / 32),
            handshakes: session::HandshakeCache::new(limits.max_session_bytes / 64),
            lineage_ids: TextCache::new(CacheLimits {
                max_bytes: limits.max_session_bytes / 64,
                max_entries: MAX_CACHED_LINEAGE_IDS,
                max_text: MAX_CACHED_IDENTITY,
            }),
            discovers: TextCache::new(CacheLimits {
                max_bytes: limits.max_session_bytes / 64,
                max_entries: MAX_CACHED_DISCOVERS,
                max_text: session::MAX_CACHED_TEXT,
            }),
            declarations: TextCache::new(CacheLimits {
                max_bytes: limits.max_session_bytes / 64,
                max_entries: MAX_CACHED_DECLARATIONS,
                max_text: session::MAX_CACHED_TEXT,
            }),
            params_seen: TextCache::new(CacheLimits {
                max_bytes: limits.max_session_bytes / 64,
                max_entries: MAX_CACHED_DECLARATIONS,
                max_text: session::MAX_CACHED_TEXT,
            }),
            params_sightings: text_cache::Sightings::default(),
            usage,
            published_lineage_bytes: 0,
            resumption_deadlines: BinaryHeap::new(),
            deadlines_purge_at: MIN_DEADLINES_PURGE_AT,
            input_deadlines: BinaryHeap::new(),
            sse_endpoints: HashMap::default(),
            proxied: HashMap::default(),
            fleet: None,
            server_scope: None,
            server_versions: HashMap::default(),
            last_sweep: Timestamp(i64::MIN),
            group_marks: None,
            spent: None,
        }
    }

    /// From now on the bodies read (see [`Tracker::spend_body`]) and the request and response
    /// heads done with (exchanges ended, closed with their connection or evicted; heads no
    /// exchange took) are kept for [`Tracker::swap_spent`] instead of freed here (see
    /// [`Spent`]): for a session layer on another thread than the HTTP layer that allocated
    /// them. The caller takes them after every batch of input; they are no longer charged
    /// anywhere. Held messages of fleet mode (whole pipelines only) are freed here.
    pub fn keep_spent(&mut self) {
        self.spent.get_or_insert_with(Spent::default);
    }

    /// What was kept since the last call (see [`Tracker::keep_spent`]), with `spare` (emptied)
    /// keeping from now on. What waits to be taken is at most what the input between two
    /// calls held.
    pub fn swap_spent(&mut self, mut spare: Spent) -> Spent {
        spare.clear();
        match self.spent.as_mut() {
            Some(spent) => std::mem::replace(spent, spare),
            None => spare,
        }
    }

    /// A body [`Tracker::on_http`] gave back: kept (see [`Tracker::keep_spent`]) or freed.
    pub fn spend_body(&mut self, body: Vec<u8>) {
        if let Some(spent) = self.spent.as_mut() {
            spent.bodies.push(body);
        }
    }

    /// An exchange is done with: its heads are kept (see [`Tracker::keep_spent`]), the rest is
    /// freed.
    fn retire(&mut self, ex: Box<ExchangeState>) {
        if self.spent.is_some() {
            let ExchangeState { head, response, .. } = *ex;
            self.spend_request_head(head);
            if let Some(response) = response {
                self.spend_response_head(response);
            }
        }
    }

    /// A request head no exchange took: kept (see [`Tracker::keep_spent`]) or freed.
    fn spend_request_head(&mut self, head: Box<RequestHead>) {
        if let Some(spent) = self.spent.as_mut() {
            spent.request_heads.push(head);
        }
    }

    /// A response head no exchange took: kept (see [`Tracker::keep_spent`]) or freed.
    fn spend_response_head(&mut self, head: Box<ResponseHead>) {
        if let Some(spent) = self.spent.as_mut() {
            spent.response_heads.push(head);
        }
    }

    /// Makes this tracker one shard of a session layer sharded by client (see
    /// [`ServerScope`]). Not with fleet mode.
    pub fn share_server_scope(&mut self, scope: Box<dyn ServerScope<D::SessionState>>) {
        self.server_scope = Some(scope);
        self.group_marks = Some(Vec::new());
    }

    /// Sharded: the units of the sweeps' and ends' outputs since the last call, as (index
    /// into the `out` they were written to, key), in order; appended to `into`.
    pub fn take_group_marks(&mut self, into: &mut Vec<(usize, GroupKey)>) {
        if let Some(marks) = self.group_marks.as_mut() {
            into.append(marks);
        }
    }

    fn mark_group(&mut self, at: usize, key: impl FnOnce() -> GroupKey) {
        if let Some(marks) = self.group_marks.as_mut() {
            marks.push((at, key()));
        }
    }

    /// Sharded: brings server-scoped entry `key` up to the latest write of any shard (none
    /// when not sharded).
    fn sync_server_entry(&mut self, key: &SessionKey, ts: Timestamp, out: &mut Vec<Output>) {
        let Some(scope) = self.server_scope.as_mut() else {
            return;
        };
        let held = self.sessions.contains(key);
        let have = if held {
            self.server_versions.get(key).copied().unwrap_or(0)
        } else {
            0
        };
        let Some((version, entry)) = scope.newer(key, have) else {
            return;
        };
        // Idle at a sweep since its last use: it ended there, as in one worker.
        if self.last_sweep.0.saturating_sub(entry.last_seen.0) > self.limits.session_idle_timeout_ns
        {
            if held {
                self.sessions.remove(key);
                self.server_versions.remove(key);
            }
            return;
        }
        self.server_versions.insert(key.clone(), version);
        if !held {
            self.make_room(ts, out);
        }
        self.sessions.insert(key.clone(), entry);
        self.recharge(key, ts, out);
    }

    /// Sharded: hands server-scoped entry `key` out after this shard wrote it.
    fn publish_server_entry(&mut self, key: &SessionKey) {
        let (Some(scope), Some(entry)) = (self.server_scope.as_mut(), self.sessions.get(key))
        else {
            return;
        };
        let version = scope.publish(key, entry.server_replica());
        self.server_versions.insert(key.clone(), version);
    }

    /// Sharded: hands out every server-scoped entry this shard holds (after a snapshot's load,
    /// so that the other shards take them from the scope when they read them, as they would
    /// have had one shard written them).
    pub fn publish_server_entries(&mut self) {
        let mut keys: Vec<SessionKey> = self
            .sessions
            .keys()
            .filter(|k| matches!(session::scope_of(k), Scope::Server | Scope::Endpoint))
            .cloned()
            .collect();
        keys.sort();
        for key in keys {
            self.publish_server_entry(&key);
        }
    }

    /// The lasting state of every session, lineage and server, and the records of ended
    /// sessions (see [`snapshot`]).
    pub fn export_state(&self) -> snapshot::StateSnapshot<D::SessionState>
    where
        D::SessionState: Clone,
    {
        let mut snap = snapshot::StateSnapshot::default();
        let mut keys: Vec<&SessionKey> = self.sessions.keys().collect();
        keys.sort();
        for key in keys {
            let Some(s) = self.sessions.get(key) else {
                continue;
            };
            snap.sessions.push(session_entry(key, s));
        }
        for (key, ended) in self.lineage.records() {
            snap.ended.push(snapshot::EndedEntry {
                server: key.server,
                lineage_id: key.lineage_id.clone(),
                ts_ns: ended.ts.0,
                session_id: ended.session_id.clone(),
                baseline: ended.baseline.clone(),
                route: ended.route,
            });
        }
        snap
    }

    /// Loads exported state at time `now`: entries idle beyond the session idle timeout and
    /// ended-session records beyond the lineage window are dropped; entries already tracked
    /// are kept as they are. Everything loaded is charged and bounded like live state.
    pub fn import_state(
        &mut self,
        snap: snapshot::StateSnapshot<D::SessionState>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) -> snapshot::ImportReport {
        let mut report = snapshot::ImportReport::default();
        for e in snap.sessions {
            let key = (e.server, e.key.clone());
            let public = session::scope_of(&key) == Scope::Session;
            if (public && !session::is_valid_session_id(&key.1, self.limits.max_session_id_len))
                || key.1.len() > 512
            {
                report.refused += 1;
                continue;
            }
            if now.0.saturating_sub(e.last_seen_ns) > self.limits.session_idle_timeout_ns {
                report.expired += 1;
                continue;
            }
            if self.sessions.contains(&key) {
                continue;
            }
            let last_seen = Timestamp(e.last_seen_ns.min(now.0));
            self.install(&key, e, last_seen, now, out);
            report.sessions += 1;
        }
        for e in snap.ended {
            if now.0.saturating_sub(e.ts_ns) > self.limits.lineage_window_ns {
                report.expired += 1;
                continue;
            }
            let key = LineageKey {
                server: e.server,
                lineage_id: e.lineage_id.clone(),
            };
            self.remember_record(key, Ended::from(e), out);
            report.ended += 1;
        }
        self.publish_lineage_bytes();
        report
    }

    /// Server names and trusted proxies for server and client identities.
    pub fn set_identities(&mut self, identities: Identities) {
        self.identities = identities;
        self.lineage_ids.clear();
        self.publish_lineage_bytes();
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

    /// Re-estimates what session `key` costs after it shrank. A smaller charge never calls for
    /// room, so nothing is evicted here (the next growth evicts if the total is still over).
    fn recharge_shrunk(&mut self, key: &SessionKey) {
        self.sessions.recharge(key);
    }

    /// Enforces the session caps by ending the least recently seen sessions.
    fn make_room(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        if self.sessions.is_full() {
            for old in self.sessions.eviction_batch(None) {
                self.end_session(&old, now, EndReason::Evicted, out);
            }
        }
    }

    /// Makes sure table entry `key` exists (a session, lineage, server or endpoint state).
    fn ensure(
        &mut self,
        key: &SessionKey,
        client: SocketAddr,
        ts: Timestamp,
        midstream: bool,
        out: &mut Vec<Output>,
    ) {
        if let Some(s) = self.sessions.get_mut(key) {
            s.last_seen = ts;
            return;
        }
        self.make_room(ts, out);
        if session::scope_of(key) == Scope::Session {
            out.push(Output::Telemetry(Telemetry::SessionStarted {
                server: key.0,
                midstream,
            }));
        }
        self.sessions.insert(key.clone(), Session::new(client, ts));
        self.recharge(key, ts, out);
    }

    /// Gives entry `key` its route bucket, if it has none yet.
    fn route_entry(&mut self, key: &SessionKey, route: Option<u16>) {
        if let Some(s) = self.sessions.get_mut(key)
            && s.route.is_none()
        {
            s.route = route;
        }
    }

    /// The era state of entry `key`, allocated on first use.
    fn ext_mut(&mut self, key: &SessionKey) -> Option<&mut EraState> {
        let s = self.sessions.get_mut(key)?;
        Some(s.ext.get_or_insert_with(Box::default))
    }

    /// Fleet mode: held messages processed again after their lookups were answered.
    pub fn fleet_replayed(&self) -> u64 {
        self.fleet.as_ref().map_or(0, |f| f.replayed)
    }

    /// Fleet mode: state of sessions this instance has not seen is asked of the adapter's
    /// store ([`SharedRequest::Lookup`]) before their messages are processed, and changes are
    /// handed out ([`SharedRequest::Update`]).
    pub fn enable_fleet(&mut self) {
        self.fleet = Some(Box::default());
    }

    /// One HTTP event of connection `ctx`. The body of a request or JSON response, or the
    /// data of an SSE event, comes back once read (outside fleet mode, where one may be held):
    /// its buffer, for the caller to free or reuse on the thread that allocated it.
    pub fn on_http(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        ev: HttpEvent,
        out: &mut Vec<Output>,
    ) -> Option<Vec<u8>> {
        if self.fleet.is_none() {
            return self.on_http_local(ctx, ts, ev, out);
        }
        let start = out.len();
        self.on_http_fleet(ctx, ts, ev, None, out);
        self.share_dirty(out, start);
        None
    }

    /// Fleet mode: a request of a session or lineage whose shared state is not known yet is
    /// held (and its state asked for on first sighting), with everything that follows on its
    /// connection; other messages are processed now.
    fn on_http_fleet(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        ev: HttpEvent,
        released: Option<&SessionKey>,
        out: &mut Vec<Output>,
    ) {
        let HttpEvent::Request {
            exchange,
            head,
            body,
        } = ev
        else {
            let waiting = exchange_id_of(&ev).and_then(|ex| {
                self.fleet
                    .as_ref()
                    .and_then(|f| f.held_exchanges.get(&(ctx.flow, ex)).cloned())
            });
            return match waiting {
                Some(key) => {
                    let cost = held_cost(&ev);
                    let message = HeldMessage::Http(ev);
                    self.hold(&key, (ctx, ts, released.is_some()), message, cost, out)
                }
                None => {
                    self.on_http_local(ctx, ts, ev, out);
                }
            };
        };
        let Some(request) = self.classify_request(ctx, &head, &body, out) else {
            return;
        };
        let cost = 256 + body.len() + head.path().len();
        self.route_request(ctx, ts, exchange, head, request, cost, released, out);
    }

    /// A classified request: held behind the lookup it needs (its session's, lineage's or
    /// stateless endpoint's), or behind its connection's waiting `initialize` that may create
    /// its session, or its exchange opened now. Requests of other sessions are never held.
    /// `released`: the lookup it waited for (never asked again).
    #[allow(clippy::too_many_arguments)]
    fn route_request(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        head: Box<RequestHead>,
        request: ClassifiedRequest,
        cost: usize,
        released: Option<&SessionKey>,
        out: &mut Vec<Output>,
    ) {
        let flow_wait = self
            .fleet
            .as_ref()
            .and_then(|f| f.flow_waits.get(&ctx.flow).cloned());
        let target = self.fleet_target(ctx, &head, &request, released);
        let sessionless = request.session_id.is_none();
        let pending =
            |t: &Self, k: &SessionKey| t.fleet.as_ref().is_some_and(|f| f.pending.contains_key(k));
        let held = match (target, flow_wait) {
            // A session this instance does not know, on a connection whose `initialize` waits:
            // that initialize's answer may create it, so it waits behind it (and is asked for
            // afterwards only if it did not).
            (Some((k, _)), Some(w)) if !sessionless && !pending(self, &k) => Some(w),
            // Each waits for its own state only (a lineage's requests stay in order behind
            // its lookup; other lineages and sessions do not wait for it), so that a release
            // processes each held request once, not a chain of them again and again.
            (Some((k, fleet_key)), _) => self.start_lookup(ctx, k, fleet_key, out),
            (None, _) => None,
        };
        match held {
            Some(key) => {
                // A known session waiting for a read is not idle: a sweep while it waits must
                // not end it.
                if let Some(sid) = &request.session_id
                    && let Some(s) = self.sessions.get_mut_at((ctx.server, sid))
                {
                    s.last_seen = s.last_seen.max(ts);
                }
                let initialize = request.requests.iter().any(|r| r.method == "initialize");
                if sessionless
                    && initialize
                    && let Some(f) = self.fleet.as_mut()
                {
                    f.flow_waits.insert(ctx.flow, key.clone());
                }
                let message = HeldMessage::Request {
                    exchange,
                    head,
                    request,
                    cost,
                };
                self.hold(&key, (ctx, ts, released.is_some()), message, cost, out);
            }
            None => self.open_request(ctx, ts, exchange, head, request, out),
        }
    }

    /// The session or lineage whose shared state `request` needs and this instance does not
    /// have: its table key and its fleet-wide key.
    fn fleet_target(
        &self,
        ctx: FlowCtx,
        head: &RequestHead,
        request: &ClassifiedRequest,
        released: Option<&SessionKey>,
    ) -> Option<(SessionKey, String)> {
        if self.fleet.as_ref().is_none_or(|f| f.closing) {
            return None;
        }
        if let Some(sid) = &request.session_id {
            let key = (ctx.server, sid.clone());
            if released == Some(&key) {
                return None;
            }
            if let Some(s) = self.sessions.get(&key) {
                // Known here. A shared session on a connection it has not used here lately
                // may have moved between hosts (a load balancer moves it at a connection),
                // so another host may have changed it: its record is read again. (Not an
                // HTTP+SSE session: its state lives with its GET stream's host, and its
                // answers come on that stream.) While that read is under way, the session's
                // other requests wait behind it, in order.
                let reading = self
                    .fleet
                    .as_ref()
                    .is_some_and(|f| f.pending.contains_key(&key));
                // (A session restored from a snapshot has no fleet key yet: read too.)
                let moved = s.era != Era::HttpSse && !s.fleet_flows.contains(&ctx.flow);
                if !(reading || moved) {
                    return None;
                }
                let fleet_key = match s.fleet_key.as_deref() {
                    Some(k) => k.to_string(),
                    None => {
                        fleet_session_key(&self.identities.server_identity(ctx.server, head), sid)
                    }
                };
                return Some((key.clone(), fleet_key));
            }
            if self.fleet.as_ref().is_some_and(|f| f.absent.contains(&key)) {
                return None;
            }
            let server = self.identities.server_identity(ctx.server, head);
            return Some((key, fleet_session_key(&server, sid)));
        }
        // A request without JSON-RPC messages (an HTTP+SSE GET stream) decides nothing on
        // its lineage: not held (its stream's `endpoint` event binds the session's POSTs).
        if let Some(lid) = request.lineage_id.as_deref()
            && !(request.requests.is_empty() && request.client_answers.is_empty())
        {
            let fleet_key = fleet_lineage_key(lid);
            let known = self
                .fleet
                .as_ref()
                .is_none_or(|f| f.lineages.contains_key(fleet_key.as_str()));
            let key = session::lineage_key(ctx.server, lid);
            if !known && released != Some(&key) {
                return Some((key, fleet_key));
            }
        }
        // A stateless legacy server (requests after `initialize` without a session id): its
        // response modes per method and tool.
        if request.era != Era::Legacy {
            return None;
        }
        let r = request.requests.iter().find(|r| {
            let key = session::endpoint_key(ctx.server, &r.method, r.tool.as_deref());
            r.method != "initialize" && !self.sessions.contains(&key) && released != Some(&key)
        })?;
        let server = self.identities.server_identity(ctx.server, head);
        Some((
            session::endpoint_key(ctx.server, &r.method, r.tool.as_deref()),
            fleet_endpoint_key(&server, &r.method, r.tool.as_deref()),
        ))
    }

    /// Asks the store for `key`'s state unless that is under way. `None`: too many lookups
    /// wait already (counted), go on with the local view.
    fn start_lookup(
        &mut self,
        ctx: FlowCtx,
        key: SessionKey,
        fleet_key: String,
        out: &mut Vec<Output>,
    ) -> Option<SessionKey> {
        let fleet = self.fleet.as_mut()?;
        if !fleet.pending.contains_key(&key) {
            if fleet.pending.len() >= MAX_PENDING_LOOKUPS {
                out.push(Output::Telemetry(Telemetry::LimitHit {
                    limit: Limit::FleetHeld,
                }));
                return None;
            }
            let waiters = fleet
                .by_fleet_key
                .entry(fleet_key.as_str().into())
                .or_default();
            if waiters.is_empty() {
                out.push(Output::Shared(SharedRequest::Lookup {
                    key: fleet_key.clone(),
                }));
            }
            waiters.push(key.clone());
            fleet.pending.insert(
                key.clone(),
                Held {
                    fleet_key: fleet_key.into(),
                    client: ctx.client,
                    events: Vec::new(),
                    bytes: 0,
                    exchanges: Vec::new(),
                },
            );
        }
        Some(key)
    }

    /// Queues `message` behind `key`'s lookup; beyond the bounds the lookup is given up and
    /// everything held is processed with the local view (counted). `from`: its connection,
    /// its time, and whether it was just released from another wait: then it goes among the
    /// held ones by its time, not last. A session's requests can wait behind two lookups (the
    /// connection's `initialize`'s lineage, and the session's own for a later connection): the
    /// older ones, released first and held again behind the session's, must stay ahead of the
    /// later connection's, or the session's answers are reviewed out of order.
    fn hold(
        &mut self,
        key: &SessionKey,
        from: (FlowCtx, Timestamp, bool),
        message: HeldMessage,
        cost: usize,
        out: &mut Vec<Output>,
    ) {
        let (ctx, ts, released) = from;
        let Some(fleet) = self.fleet.as_mut() else {
            return;
        };
        let over = fleet.held_bytes + cost > MAX_HELD_BYTES
            || fleet
                .pending
                .get(key)
                .is_some_and(|h| h.bytes + cost > MAX_HELD_BYTES_PER_SESSION);
        if let Some(held) = fleet.pending.get_mut(key) {
            if let HeldMessage::Request { exchange, .. } = &message {
                let at = (ctx.flow, *exchange);
                if fleet.held_exchanges.insert(at, key.clone()).is_none() {
                    *fleet.held_per_flow.entry(ctx.flow).or_default() += 1;
                }
                held.exchanges.push(at);
            }
            let at = if released {
                held.events.partition_point(|(_, t, _)| *t <= ts)
            } else {
                held.events.len()
            };
            held.events.insert(at, (ctx, ts, message));
            held.bytes += cost;
            fleet.held_bytes += cost;
        }
        if over {
            // The store is too slow for what this session sends: go on with the local view.
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::FleetHeld,
            }));
            self.release_held(key, None, ts, out);
        }
    }

    /// The store answered the lookup of `fleet_key`: `record` is the session's or lineage's
    /// shared state (JSON, as an [`SharedRequest::Update`] wrote it) or `None` (absent, timed
    /// out, store down). The held messages are processed now, in order.
    pub fn on_shared_state(
        &mut self,
        fleet_key: &str,
        record: Option<&str>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let Some(keys) = self
            .fleet
            .as_mut()
            .and_then(|f| f.by_fleet_key.remove(fleet_key))
        else {
            return; // a late or unknown answer
        };
        let start = out.len();
        for key in keys {
            self.release_held(&key, record, now, out);
        }
        self.share_dirty(out, start);
    }

    /// The store refused an [`SharedRequest::Update`] of `fleet_key`: another instance
    /// changed the session or lineage first. Its record (`stored`) is merged into this one's
    /// view — the first handshake or declaration stays the fleet's first, response modes must
    /// fit what both saw — and written again on top of it.
    pub fn on_shared_conflict(
        &mut self,
        fleet_key: &str,
        stored: &str,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let start = out.len();
        if fleet_key.starts_with(LINEAGE_FLEET_PREFIX) {
            self.merge_lineage_conflict(fleet_key, stored, now, out);
        } else {
            self.merge_session_conflict(fleet_key, stored, now, out);
        }
        self.share_dirty(out, start);
    }

    fn merge_session_conflict(
        &mut self,
        fleet_key: &str,
        stored: &str,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let Some(key) = self
            .fleet
            .as_ref()
            .and_then(|f| f.sessions.get(fleet_key).cloned())
        else {
            return;
        };
        let Ok(theirs) = serde_json::from_str::<snapshot::SessionEntry<D::SessionState>>(stored)
        else {
            out.push(Output::Telemetry(Telemetry::FleetGarbage));
            return;
        };
        let Some(s) = self.sessions.get_mut(&key) else {
            return;
        };
        s.shared_version = theirs.shared_version;
        s.read_version = theirs.shared_version;
        s.shared_digest = 0;
        self.merge_entry(&key, theirs);
        self.touch_shared(&key);
        self.recharge(&key, now, out);
    }

    fn merge_lineage_conflict(
        &mut self,
        fleet_key: &str,
        stored: &str,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let Some(server) = self
            .fleet
            .as_ref()
            .and_then(|f| f.lineages.get(fleet_key).map(|m| m.server))
        else {
            return;
        };
        let theirs = match serde_json::from_str::<snapshot::LineageShare<D::SessionState>>(stored) {
            Ok(t) if t.v == snapshot::SNAPSHOT_VERSION => t,
            _ => {
                out.push(Output::Telemetry(Telemetry::FleetGarbage));
                return;
            }
        };
        let lid = &fleet_key[LINEAGE_FLEET_PREFIX.len()..];
        let key = session::lineage_key(server, lid);
        if let Some(f) = self.fleet.as_mut()
            && let Some(mark) = f.lineages.get_mut(fleet_key)
        {
            mark.version = theirs.shared_version;
            mark.digest = 0;
        }
        if let Some(entry) = theirs.entry {
            if self.sessions.contains(&key) {
                self.merge_entry(&key, entry);
            } else {
                let last_seen = Timestamp(entry.last_seen_ns.min(now.0));
                self.install(&key, entry, last_seen, now, out);
            }
        }
        if let Some(ended) = theirs.ended {
            self.adopt_ended(server, lid, ended, now, out);
        }
        self.touch_shared(&key);
        self.recharge(&key, now, out);
    }

    /// The store's later view of entry `key` replaces what lasts of this one's (what is in
    /// flight here stays).
    fn supersede_entry(
        &mut self,
        key: &SessionKey,
        theirs: snapshot::SessionEntry<D::SessionState>,
    ) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        if theirs.baseline.is_some() {
            s.baseline = theirs.baseline;
        }
        s.handshakes = theirs.handshakes;
        s.capability_changes = theirs.capability_changes;
        s.streaming_negotiated = theirs.streaming_negotiated;
        s.protocol_version = theirs.protocol_version;
        s.requests = s.requests.max(theirs.requests);
        s.alerts = s.alerts.max(theirs.alerts);
        // Within the detector's bounds, as in `install`.
        s.detection = Default::default();
        self.detector
            .merge_state(&mut s.detection, theirs.detection);
        if let Some(record) = theirs.era_state {
            s.ext.get_or_insert_with(Box::default).merge(record);
        }
    }

    /// Another instance's view of entry `key`, merged into this one's: its first handshake
    /// and first declarations stay the baseline; response modes must fit what both saw.
    fn merge_entry(&mut self, key: &SessionKey, theirs: snapshot::SessionEntry<D::SessionState>) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        if theirs.baseline.is_some() {
            s.baseline = theirs.baseline;
        }
        // A later handshake elsewhere: what it negotiated is the session's now.
        if theirs.handshakes > s.handshakes {
            s.streaming_negotiated = theirs.streaming_negotiated;
            s.protocol_version = theirs.protocol_version;
        }
        s.handshakes = s.handshakes.max(theirs.handshakes);
        s.capability_changes = s.capability_changes.max(theirs.capability_changes);
        s.requests = s.requests.max(theirs.requests);
        s.alerts = s.alerts.max(theirs.alerts);
        self.detector
            .merge_state(&mut s.detection, theirs.detection);
        if let Some(record) = theirs.era_state {
            s.ext.get_or_insert_with(Box::default).merge(record);
        }
    }

    /// Releases what waits behind `key`'s lookup, with the store's `record` if it answered.
    fn release_held(
        &mut self,
        key: &SessionKey,
        record: Option<&str>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let Some(fleet) = self.fleet.as_mut() else {
            return;
        };
        let Some(held) = fleet.pending.remove(key) else {
            return;
        };
        if let Some(w) = fleet.by_fleet_key.get_mut(&held.fleet_key) {
            w.retain(|k| k != key);
            if w.is_empty() {
                fleet.by_fleet_key.remove(&held.fleet_key);
            }
        }
        let mut flows: Vec<u64> = Vec::new();
        for at in &held.exchanges {
            if fleet.held_exchanges.get(at) == Some(key) {
                fleet.held_exchanges.remove(at);
                if let Some(n) = fleet.held_per_flow.get_mut(&at.0) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        fleet.held_per_flow.remove(&at.0);
                    }
                }
                flows.push(at.0);
            }
        }
        flows.dedup();
        for flow in &flows {
            if fleet.flow_waits.get(flow) == Some(key) {
                fleet.flow_waits.remove(flow);
            }
        }
        fleet.held_bytes = fleet.held_bytes.saturating_sub(held.bytes);
        match session::scope_of(key) {
            Scope::Lineage => self.adopt_lineage(key, &held.fleet_key, record, now, out),
            Scope::Endpoint => {
                self.adopt_session(key, &held.fleet_key, record, now, out);
                // Known from now on, whether the store had it or not.
                self.ensure(key, held.client, now, false, out);
                if let Some(s) = self.sessions.get_mut(key) {
                    s.fleet_key.get_or_insert_with(|| held.fleet_key.clone());
                }
            }
            _ => self.adopt_session(key, &held.fleet_key, record, now, out),
        }
        // In order; this key is known now (from the store, or as new), but a request may
        // need another one (its endpoint after its lineage), and its connection waits again.
        if let Some(f) = self.fleet.as_mut() {
            f.replayed += held.events.len() as u64;
        }
        for (ctx, ts, message) in held.events {
            match message {
                HeldMessage::Http(ev) => self.on_http_fleet(ctx, ts, ev, Some(key), out),
                HeldMessage::Request {
                    exchange,
                    head,
                    request,
                    cost,
                } => {
                    // Charged again as it was first (its parsed parts outlive its body).
                    let released = Some(key);
                    self.route_request(ctx, ts, exchange, head, request, cost, released, out)
                }
            }
        }
        // Connections that closed while their exchanges waited close now, if nothing of
        // theirs waits any more.
        for flow in flows {
            let done = self.fleet.as_mut().is_some_and(|f| {
                !f.held_per_flow.contains_key(&flow) && f.closed_flows.remove(&flow)
            });
            if done {
                self.close_flow_now(flow);
            }
        }
    }

    fn adopt_session(
        &mut self,
        key: &SessionKey,
        fleet_key: &str,
        record: Option<&str>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let Some(text) = record else {
            out.push(Output::Telemetry(Telemetry::FleetState { found: false }));
            if self.sessions.contains(key) {
                return; // read again, and the store has nothing (down, or expired there)
            }
            if let Some(f) = self.fleet.as_mut() {
                if f.absent.len() >= MAX_PENDING_LOOKUPS {
                    f.absent.clear();
                }
                f.absent.insert(key.clone());
            }
            return;
        };
        match serde_json::from_str::<snapshot::SessionEntry<D::SessionState>>(text) {
            Ok(entry) if !self.sessions.contains(key) => {
                let version = entry.shared_version;
                self.install(key, entry, now, now, out);
                let digest = self
                    .sessions
                    .get(key)
                    .and_then(|s| lasting_digest(&mut session_entry(key, s)));
                if let Some(s) = self.sessions.get_mut(key) {
                    s.fleet_key = Some(fleet_key.into());
                    s.shared_version = version;
                    s.read_version = version;
                    s.shared_digest = digest.unwrap_or(0);
                }
                out.push(Output::Telemetry(Telemetry::FleetState { found: true }));
            }
            Ok(entry) => {
                // Read again (the session came back on another connection): what another
                // host changed since this one last read or wrote it is merged in.
                if let Some(s) = self.sessions.get_mut(key) {
                    s.fleet_key.get_or_insert_with(|| fleet_key.into());
                }
                let newer = self
                    .sessions
                    .get(key)
                    .is_some_and(|s| entry.shared_version > s.shared_version);
                if newer {
                    let version = entry.shared_version;
                    // Nothing changed here since this host last wrote or read it: the store's
                    // record is the later view and replaces this one's. Else both changed it:
                    // merged.
                    // (A write of this host's since its last read may not have reached the
                    // store yet: that counts as a change here.)
                    let unshared = self.sessions.get(key).is_some_and(|s| {
                        s.shared_version > s.read_version
                            || lasting_digest(&mut session_entry(key, s)) != Some(s.shared_digest)
                    });
                    if unshared {
                        self.merge_entry(key, entry);
                        if let Some(s) = self.sessions.get_mut(key) {
                            s.shared_version = version;
                            s.read_version = version;
                            s.shared_digest = 0; // what it merged of its own is written
                        }
                        self.touch_shared(key);
                    } else {
                        self.supersede_entry(key, entry);
                        let digest = self
                            .sessions
                            .get(key)
                            .and_then(|s| lasting_digest(&mut session_entry(key, s)));
                        if let Some(s) = self.sessions.get_mut(key) {
                            s.shared_version = version;
                            s.read_version = version;
                            s.shared_digest = digest.unwrap_or(0);
                        }
                    }
                    self.recharge(key, now, out);
                }
                out.push(Output::Telemetry(Telemetry::FleetState { found: true }));
            }
            Err(_) => out.push(Output::Telemetry(Telemetry::FleetGarbage)),
        }
    }

    /// A lineage's shared record: its entry (modern declarations, a stateless client's
    /// handshakes) and its latest ended session, kept where this instance has nothing newer.
    fn adopt_lineage(
        &mut self,
        key: &SessionKey,
        fleet_key: &str,
        record: Option<&str>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        let mut version = 0;
        match record.map(serde_json::from_str::<snapshot::LineageShare<D::SessionState>>) {
            None => out.push(Output::Telemetry(Telemetry::FleetState { found: false })),
            Some(Ok(share)) if share.v == snapshot::SNAPSHOT_VERSION => {
                version = share.shared_version;
                let lid = &fleet_key[LINEAGE_FLEET_PREFIX.len()..];
                if let Some(entry) = share.entry
                    && !self.sessions.contains(key)
                {
                    let last_seen = Timestamp(entry.last_seen_ns.min(now.0));
                    self.install(key, entry, last_seen, now, out);
                }
                if let Some(ended) = share.ended {
                    self.adopt_ended(key.0, lid, ended, now, out);
                }
                out.push(Output::Telemetry(Telemetry::FleetState { found: true }));
            }
            Some(_) => out.push(Output::Telemetry(Telemetry::FleetGarbage)),
        }
        let digest = self.lineage_digest(key);
        if let Some(mark) = self.mark_lineage(fleet_key, key.0, version, out) {
            mark.digest = digest.unwrap_or(0);
        }
    }

    /// What `share_lineage` compares: the lasting digest of the lineage's entry and its
    /// latest ended session.
    fn lineage_digest(&self, key: &SessionKey) -> Option<u64> {
        let lid = session::lineage_of_key(key)?;
        let mut entry = self.sessions.get(key).map(|s| session_entry(key, s));
        let ended = self
            .lineage
            .latest(&LineageKey {
                server: key.0,
                lineage_id: lid.into(),
            })
            .map(|e| snapshot::EndedEntry {
                server: key.0,
                lineage_id: lid.into(),
                ts_ns: e.ts.0,
                session_id: e.session_id.clone(),
                baseline: e.baseline.clone(),
                route: e.route,
            });
        if entry.is_none() && ended.is_none() {
            return None;
        }
        let d = match entry.as_mut() {
            Some(e) => lasting_digest(e)?,
            None => 0,
        };
        let ed = ended
            .as_ref()
            .and_then(|e| serde_json::to_string(e).ok())
            .map_or(0, |t| text_digest(&t));
        Some(d ^ ed.rotate_left(1))
    }

    /// Remembers that the store's version of lineage `fleet_key` is `version`. The index is
    /// bounded: when full it starts over (counted), which costs lookups, not findings.
    fn mark_lineage(
        &mut self,
        fleet_key: &str,
        server: SocketAddr,
        version: u64,
        out: &mut Vec<Output>,
    ) -> Option<&mut SharedMark> {
        let fleet = self.fleet.as_mut()?;
        if !fleet.lineages.contains_key(fleet_key) && fleet.lineages.len() >= MAX_FLEET_LINEAGES {
            fleet.lineages.clear();
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::FleetHeld,
            }));
        }
        let mark = fleet
            .lineages
            .entry(fleet_key.into())
            .or_insert(SharedMark {
                server,
                version,
                digest: 0,
            });
        Some(mark)
    }

    /// An ended session of lineage `lid` that another instance saw: remembered unless this
    /// instance knows a later one or it is older than the lineage window.
    fn adopt_ended(
        &mut self,
        server: SocketAddr,
        lid: &str,
        e: snapshot::EndedEntry,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        if now.0.saturating_sub(e.ts_ns) > self.limits.lineage_window_ns
            || !session::is_valid_session_id(&e.session_id, self.limits.max_session_id_len)
        {
            return;
        }
        let key = LineageKey {
            server,
            lineage_id: lid.into(),
        };
        if self
            .lineage
            .latest(&key)
            .is_some_and(|mine| mine.ts.0 >= e.ts_ns)
        {
            return;
        }
        self.remember_record(key, Ended::from(e), out);
        self.publish_lineage_bytes();
    }

    /// Remembers an ended session for lineage; what the bound drops is counted.
    fn remember_record(&mut self, key: LineageKey, ended: Ended, out: &mut Vec<Output>) {
        let dropped = self.lineage.remember(key, ended);
        for _ in 0..dropped.0 {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::LineageRecords,
            }));
        }
    }

    /// A session from a shared or snapshot record, last seen at `last_seen`. Counted as
    /// started (midstream) like any session this instance picks up, so that it is counted as
    /// ended too.
    fn install(
        &mut self,
        key: &SessionKey,
        e: snapshot::SessionEntry<D::SessionState>,
        last_seen: Timestamp,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) {
        self.make_room(now, out);
        let mut s = Session::new(e.client, last_seen);
        s.lineage_id = e.lineage_id;
        s.route = e.route;
        s.lineage_route = e.lineage_route;
        s.era = e.era;
        s.protocol_version = e.protocol_version;
        s.handshakes = e.handshakes;
        s.capability_changes = e.capability_changes;
        s.baseline = e.baseline;
        s.streaming_negotiated = e.streaming_negotiated;
        s.requests = e.requests;
        s.alerts = e.alerts;
        // Merged into a new state, so that the detector's bounds hold for a record from
        // elsewhere (a snapshot, another host) as for its own.
        self.detector.merge_state(&mut s.detection, e.detection);
        s.ext = e.era_state.map(|r| Box::new(EraState::from(r)));
        self.sessions.insert(key.clone(), s);
        if session::scope_of(key) == Scope::Session {
            out.push(Output::Telemetry(Telemetry::SessionStarted {
                server: key.0,
                midstream: true,
            }));
        }
        self.recharge(key, now, out);
    }

    /// Marks entry `key`'s shared state as possibly changed (fleet mode): a session, an
    /// endpoint's modes, or a lineage (its entry or its ended sessions).
    fn touch_shared(&mut self, key: &SessionKey) {
        self.touch_shared_at((key.0, &key.1));
    }

    /// [`Tracker::touch_shared`] by a borrowed key.
    fn touch_shared_at(&mut self, (server, id): SessionKeyRef<'_>) {
        if let Some(f) = self.fleet.as_mut()
            && session::scope_of_key(id) != Scope::Server
            && !f.dirty.iter().any(|(s, k)| *s == server && k == id)
        {
            f.dirty.push((server, id.to_string()));
        }
    }

    /// Hands out the shared state of sessions and lineages that changed since it was last
    /// shared, with the alerts those changes raised (taken from `out[start..]`: the fleet
    /// decides whether they are new).
    fn share_dirty(&mut self, out: &mut Vec<Output>, start: usize) {
        let Some(dirty) = self.fleet.as_mut().map(|f| std::mem::take(&mut f.dirty)) else {
            return;
        };
        for key in dirty {
            if session::scope_of(&key) == Scope::Lineage {
                self.share_lineage(&key, out, start);
            } else {
                self.share_session(&key, out, start);
            }
        }
    }

    fn share_session(&mut self, key: &SessionKey, out: &mut Vec<Output>, start: usize) {
        let Some(s) = self.sessions.get(key) else {
            return;
        };
        let Some(fleet_key) = s.fleet_key.clone() else {
            return;
        };
        let base_version = s.shared_version;
        let mut entry = session_entry(key, s);
        let Some(digest) = lasting_digest(&mut entry) else {
            return;
        };
        let unchanged = self
            .sessions
            .get(key)
            .is_none_or(|s| s.shared_digest == digest);
        let endpoint = session::scope_of(key) == Scope::Endpoint;
        let mine = |a: &Alert| {
            a.server == key.0
                && if endpoint {
                    a.session_id.is_none()
                        && matches!(&a.kind, AlertKind::ContentTypeDivergence(d)
                            if session::endpoint_key(key.0, &d.method, d.tool.as_deref()) == *key)
                } else {
                    a.session_id.as_deref() == Some(key.1.as_str())
                }
        };
        // An alert is claimed fleet-wide even when what it changed is what the store holds
        // already (another host got there first): the claim decides whether it is new.
        let raised = out.get(start..).is_some_and(|tail| {
            tail.iter()
                .any(|o| matches!(o, Output::Event(Event::Alert(a)) if mine(a)))
        });
        if unchanged && !raised {
            return;
        }
        // Saturating: the version came from the store, which may hold any number.
        let version = base_version.saturating_add(1);
        entry.shared_version = version;
        let Ok(record) = serde_json::to_string(&entry) else {
            return;
        };
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        s.shared_digest = digest;
        s.shared_version = version;
        let alerts = take_alerts(out, start, &fleet_key, mine);
        if let Some(f) = self.fleet.as_mut()
            && (f.sessions.len() < MAX_FLEET_SESSIONS || f.sessions.contains_key(&fleet_key))
        {
            f.sessions.insert(fleet_key.clone(), key.clone());
        }
        out.push(Output::Shared(SharedRequest::Update {
            key: fleet_key.to_string(),
            record,
            ttl_ns: self.limits.session_idle_timeout_ns,
            base_version,
            version,
            alerts,
        }));
    }

    /// A lineage's record: its entry (if it has one) and its latest ended session.
    fn share_lineage(&mut self, key: &SessionKey, out: &mut Vec<Output>, start: usize) {
        let Some(lid) = session::lineage_of_key(key).map(str::to_string) else {
            return;
        };
        let mut entry = self.sessions.get(key).map(|s| session_entry(key, s));
        let ended = self
            .lineage
            .latest(&LineageKey {
                server: key.0,
                lineage_id: lid.as_str().into(),
            })
            .map(|e| snapshot::EndedEntry {
                server: key.0,
                lineage_id: lid.as_str().into(),
                ts_ns: e.ts.0,
                session_id: e.session_id.clone(),
                baseline: e.baseline.clone(),
                route: e.route,
            });
        if entry.is_none() && ended.is_none() {
            return;
        }
        let digest = match entry.as_mut() {
            Some(e) => lasting_digest(e),
            None => Some(0),
        };
        let ended_digest = ended
            .as_ref()
            .and_then(|e| serde_json::to_string(e).ok())
            .map_or(0, |t| text_digest(&t));
        let Some(digest) = digest.map(|d| d ^ ended_digest.rotate_left(1)) else {
            return;
        };
        let fleet_key = fleet_lineage_key(&lid);
        let mine = |a: &Alert| {
            a.server == key.0
                && a.session_id.is_none()
                && a.lineage_id.as_deref() == Some(&lid)
                && !matches!(a.kind, AlertKind::ContentTypeDivergence(_))
        };
        // Alerts are claimed even when the store holds this state already.
        let raised = out.get(start..).is_some_and(|tail| {
            tail.iter()
                .any(|o| matches!(o, Output::Event(Event::Alert(a)) if mine(a)))
        });
        let Some(mark) = self.mark_lineage(&fleet_key, key.0, 0, out) else {
            return;
        };
        if mark.digest == digest && !raised {
            return;
        }
        let base_version = mark.version;
        // Saturating: the version came from the store, which may hold any number.
        let version = base_version.saturating_add(1);
        let share = snapshot::LineageShare {
            v: snapshot::SNAPSHOT_VERSION,
            shared_version: version,
            entry,
            ended,
        };
        let Ok(record) = serde_json::to_string(&share) else {
            return;
        };
        mark.digest = digest;
        mark.version = version;
        let alerts = take_alerts(out, start, &fleet_key, mine);
        out.push(Output::Shared(SharedRequest::Update {
            key: fleet_key,
            record,
            ttl_ns: self
                .limits
                .lineage_window_ns
                .max(self.limits.session_idle_timeout_ns),
            base_version,
            version,
            alerts,
        }));
    }

    /// One HTTP event; a request's or JSON response's body, or an SSE event's data, comes
    /// back once read.
    fn on_http_local(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        ev: HttpEvent,
        out: &mut Vec<Output>,
    ) -> Option<Vec<u8>> {
        match ev {
            HttpEvent::Request {
                exchange,
                head,
                body,
            } => {
                self.on_request(ctx, ts, exchange, head, &body, out);
                return Some(body);
            }
            HttpEvent::ResponseHead { exchange, head } => {
                self.on_response_head(ctx, ts, exchange, head, out)
            }
            HttpEvent::ResponseJson { exchange, body } => {
                self.on_response_body(ctx, ts, exchange, &body, out);
                return Some(body);
            }
            HttpEvent::ResponseSse { exchange, item } => {
                self.on_sse(ctx, ts, exchange, &item, out);
                if let SseItem::Event(event) = item {
                    return Some(event.data);
                }
            }
            HttpEvent::ResponseEnd { exchange, end } => {
                self.on_response_end(ctx, ts, exchange, end, out)
            }
            // Reported as a response that ended before it began: unanswered, no alert.
            HttpEvent::NoResponse { exchange, end } => {
                let end = match end {
                    BodyEnd::Unfinished => BodyEnd::Unfinished,
                    _ => BodyEnd::Aborted,
                };
                self.on_response_end(ctx, ts, exchange, end, out)
            }
            HttpEvent::ClientGone { exchange } => {
                if let Some(ex) = self.transactions.get_mut((ctx.flow, exchange)) {
                    ex.client_gone = true;
                }
            }
            HttpEvent::Abandoned { exchange, reason } => {
                out.push(Output::Telemetry(Telemetry::ExchangeAbandoned { reason }));
                if let Some(ex) = self.transactions.remove((ctx.flow, exchange)) {
                    self.forget_in_flight(ctx.server, &ex);
                    self.end_if_expired(&ex, ts, out);
                    self.retire(ex);
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
            HttpEvent::ProxyHeader { source, .. } => {
                self.on_proxy_header(ctx.flow, ctx.server, source, out)
            }
        }
        None
    }

    /// Connection `flow` to `server` opened with a PROXY protocol header naming `source`.
    pub fn on_proxy_header(
        &mut self,
        flow: u64,
        server: SocketAddr,
        source: Option<SocketAddr>,
        out: &mut Vec<Output>,
    ) {
        out.push(Output::Telemetry(Telemetry::ProxyHeader {
            server,
            named_client: source.is_some(),
        }));
        let Some(source) = source else { return };
        if self.proxied.len() < MAX_PROXIED_FLOWS || self.proxied.contains_key(&flow) {
            self.proxied.insert(flow, source.ip());
        } else {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ProxiedFlows,
            }));
        }
    }

    /// An exchange that will never be answered on its connection: its requests no longer
    /// wait for answers on other streams either.
    fn forget_in_flight(&mut self, server: SocketAddr, ex: &ExchangeState) {
        let Some(sid) = &ex.session_id else {
            return;
        };
        let key = (server, sid.clone());
        let Some(s) = self.sessions.get_mut(&key) else {
            return;
        };
        let mut forgot = false;
        for r in ex.requests.iter() {
            forgot |= s.in_flight.remove(&r.id).is_some();
        }
        if forgot {
            self.recharge_shrunk(&key);
        }
    }

    /// The flow is gone: forget its exchanges (their ends were reported by the HTTP layer,
    /// `NoResponse` included).
    /// In fleet mode, a connection whose exchanges wait for the store closes once they are
    /// released.
    pub fn on_flow_closed(&mut self, flow: u64) {
        if let Some(f) = self.fleet.as_mut() {
            f.flow_waits.remove(&flow);
            if f.held_per_flow.contains_key(&flow) {
                f.closed_flows.insert(flow);
                return;
            }
        }
        self.close_flow_now(flow);
    }

    fn close_flow_now(&mut self, flow: u64) {
        // HTTP ended them all (`NoResponse` for those never answered); any left can no longer
        // be answered either.
        for ex in self.transactions.close_flow(flow) {
            self.forget_in_flight(ex.server, &ex);
            self.retire(ex);
        }
        self.proxied.remove(&flow);
    }

    /// Ends sessions idle for longer than the limit.
    pub fn sweep(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        let start = out.len();
        self.last_sweep = now;
        for key in self.sessions.idle(now, self.limits.session_idle_timeout_ns) {
            self.mark_group(out.len(), || GroupKey::Idle(key.clone()));
            self.end_session(&key, now, EndReason::Idle, out);
        }
        if let Some(scope) = self.server_scope.as_mut() {
            scope.swept(now, self.limits.session_idle_timeout_ns);
        }
        self.lineage.expire(now, self.limits.lineage_window_ns);
        self.publish_lineage_bytes();
        while let Some(Reverse((deadline, _, _))) = self.resumption_deadlines.peek()
            && *deadline <= now
        {
            if let Some(Reverse((deadline, key, id))) = self.resumption_deadlines.pop() {
                if let Some(later) = self.resumption_kept_on(&key, &id, deadline, now) {
                    self.resumption_deadlines.push(Reverse((later, key, id)));
                    continue;
                }
                self.mark_group(out.len(), || {
                    GroupKey::Resumption(deadline, key.clone(), id.clone())
                });
                self.give_up_resumption(&key, &id, Some(deadline), now, true, out);
            }
        }
        while let Some(Reverse((deadline, _))) = self.input_deadlines.peek()
            && *deadline <= now
        {
            if let Some(Reverse((deadline, key))) = self.input_deadlines.pop() {
                self.mark_group(out.len(), || GroupKey::Input(deadline, key.clone()));
                self.release_inputs(&key, Some(now), out);
            }
        }
        // Fleet mode: alerts a deadline raised are claimed like those of a message.
        self.share_dirty(out, start);
    }

    /// End of input: streams still waiting for their resumption were cut off by the end of
    /// the capture, which concludes nothing: their exchanges are reported, without alerts.
    pub fn finish(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        // Sessions still waiting for the store go on with their local view.
        if let Some(f) = self.fleet.as_mut() {
            f.closing = true;
        }
        let waiting: Vec<SessionKey> = self
            .fleet
            .as_ref()
            .map(|f| f.pending.keys().cloned().collect())
            .unwrap_or_default();
        let mut waiting = waiting;
        waiting.sort();
        for key in waiting {
            self.release_held(&key, None, now, out);
        }
        self.share_dirty(out, 0);
        // Soonest first, so the reports come in a fixed order.
        while let Some(Reverse((deadline, key, id))) = self.resumption_deadlines.pop() {
            self.mark_group(out.len(), || {
                GroupKey::Resumption(deadline, key.clone(), id.clone())
            });
            self.give_up_resumption(&key, &id, Some(deadline), now, false, out);
        }
        while let Some(Reverse((deadline, key))) = self.input_deadlines.pop() {
            self.mark_group(out.len(), || GroupKey::Input(deadline, key.clone()));
            self.release_inputs(&key, None, out);
        }
        // HTTP+SSE requests whose answers never came on the stream.
        let parked: Vec<SessionKey> = self
            .sessions
            .keys()
            .filter(|k| self.sessions.get(k).is_some_and(|s| !s.parked.is_empty()))
            .cloned()
            .collect();
        let mut sorted = parked;
        sorted.sort();
        for key in sorted {
            self.mark_group(out.len(), || GroupKey::Parked(key.clone()));
            self.report_parked(&key, now, out);
        }
    }

    /// `InputRequiredResult`s of lineage `key` whose wait is over (`now`: those due by then,
    /// not retried; `None`: all of them, undecided).
    fn release_inputs(&mut self, key: &SessionKey, now: Option<Timestamp>, out: &mut Vec<Output>) {
        let Some(ext) = self.sessions.get_mut(key).and_then(|s| s.ext.as_mut()) else {
            return;
        };
        let mut i = 0;
        while i < ext.input_pending.len() {
            if now.is_some_and(|n| ext.input_pending[i].deadline > n) {
                i += 1;
                continue;
            }
            let mut p = ext.input_pending.remove(i);
            if let Some(ir) = p.exchange.input_required.as_mut() {
                ir.retried = now.map(|_| false);
            }
            if now.is_some() {
                out.push(Output::Telemetry(Telemetry::InputRequiredAbandoned {
                    server: p.exchange.server,
                }));
            }
            out.push(Output::Event(Event::Exchange(p.exchange)));
        }
    }

    /// A request retried an `InputRequiredResult` of its lineage: that exchange is reported.
    fn input_retried(
        &mut self,
        key: &SessionKey,
        method: &str,
        tool: Option<&str>,
        out: &mut Vec<Output>,
    ) {
        let Some(ext) = self.sessions.get_mut(key).and_then(|s| s.ext.as_mut()) else {
            return;
        };
        if let Some(at) = ext
            .input_pending
            .iter()
            .position(|p| &*p.method == method && p.tool.as_deref() == tool)
        {
            let mut p = ext.input_pending.remove(at);
            if let Some(ir) = p.exchange.input_required.as_mut() {
                ir.retried = Some(true);
            }
            out.push(Output::Event(Event::Exchange(p.exchange)));
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
        let (sid, lid, pv) = (
            r.exchange.session_id.clone(),
            r.exchange.lineage_id.clone(),
            r.exchange.protocol_version.clone(),
        );
        let ctx = AlertCtx {
            session_id: sid.as_deref(),
            lineage_id: lid.as_deref(),
            era: r.exchange.era,
            protocol_version: pv.as_deref(),
            server: key.0,
            client: r.exchange.client,
            framing: r.exchange.framing,
        };
        out.push(Output::Event(Event::Exchange(r.exchange)));
        match (alert, r.alert) {
            (true, Some(kind)) => {
                s.alerts = s.alerts.saturating_add(1);
                ctx.push(out, now, Some(kind));
            }
            (false, Some(_)) => out.push(Output::Telemetry(Telemetry::ResumptionUnresolved {
                server: key.0,
            })),
            (_, None) => {}
        }
        self.recharge_shrunk(key);
    }

    /// How long an empty result waits for its stream's resumption after a stream that asked
    /// for `retry_ms` between reconnections ended: the window, or a server's `retry` + 5 s,
    /// within reason.
    fn resumption_wait(&self, retry_ms: Option<u64>) -> i64 {
        let retry = retry_ms.map_or(0, |ms| {
            i64::try_from(ms)
                .unwrap_or(i64::MAX)
                .saturating_mul(1_000_000)
        });
        self.limits.resumption_window_ns.max(
            retry
                .saturating_add(5_000_000_000)
                .min(MAX_RESUMPTION_WAIT_NS),
        )
    }

    /// A resumed stream (`Last-Event-ID`) of session `key` was active at `ts` (an event or a
    /// keep-alive comment came, or it ended as a server polling its client ends it): the
    /// session's requests waiting for a resumed stream wait on for [`Self::resumption_wait`]
    /// from now. A long-running tool's answer may take minutes, held back on a stream or
    /// polled for (2025-11-25: the server may close the connection at any time after an
    /// event id, and the client polls). O(1): the waits read it when they fall due.
    fn resumed_stream_active(&mut self, key: &SessionKey, ts: Timestamp, retry_ms: Option<u64>) {
        let wait = self.resumption_wait(retry_ms);
        if let Some(s) = self.sessions.get_mut(key)
            && !s.resuming.is_empty()
        {
            s.resumed_until = s.resumed_until.max(Timestamp(ts.0.saturating_add(wait)));
        }
    }

    /// A wait for a resumed stream fell due at `deadline`: the later time the session's
    /// resumed streams keep it to, if they do (the wait is moved there).
    /// Drops the deadlines of waits that already ended, once the heap has doubled since the
    /// last purge: a client closing every call's stream and resuming it leaves one per call
    /// (for up to the server's `retry`, 600 s at most), which nothing else bounds. Amortised
    /// O(1) per wait; only entries that would fall due on nothing go.
    fn purge_stale_deadlines(&mut self) {
        if self.resumption_deadlines.len() < self.deadlines_purge_at {
            return;
        }
        let sessions = &self.sessions;
        self.resumption_deadlines
            .retain(|Reverse((deadline, key, id))| {
                sessions.get(key).is_some_and(|s| {
                    s.resuming
                        .iter()
                        .any(|r| &r.id == id && r.deadline == *deadline)
                })
            });
        self.deadlines_purge_at = (2 * self.resumption_deadlines.len()).max(MIN_DEADLINES_PURGE_AT);
    }

    fn resumption_kept_on(
        &mut self,
        key: &SessionKey,
        id: &Id,
        deadline: Timestamp,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let s = self.sessions.get_mut(key)?;
        let until = s.resumed_until;
        if until <= now {
            return None;
        }
        let r = s
            .resuming
            .iter_mut()
            .find(|r| &r.id == id && r.deadline == deadline)?;
        r.deadline = until;
        Some(until)
    }

    /// The client of session `key` cancelled requests `ids` (`notifications/cancelled`): the
    /// server need not answer them, so a stream that ends without the answer is no empty
    /// result. An open request is marked; one already waiting for a resumed stream is
    /// reported without its alert when the wait ends.
    fn cancel_requests(&mut self, key: &SessionKey, ids: &[Id]) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        for id in ids {
            if let Some(r) = s.resuming.iter_mut().find(|r| &r.id == id) {
                r.alert = None;
                r.exchange.cancelled = true;
                r.client_left = false;
            } else if let Some(at) = s.in_flight.get(id)
                && let Some(ex) = self.transactions.get_mut(at)
            {
                ex.requests.cancel(id);
            }
        }
    }

    /// The answer to `id` arrived on another stream of session `key` after the stream that
    /// carried its request had ended: a resumed stream (`Last-Event-ID`). Returns whether it
    /// was waited for.
    fn resumed(
        &mut self,
        key: &SessionKey,
        id: &Id,
        ts: Timestamp,
        answer: ResumedAnswer,
        out: &mut Vec<Output>,
    ) -> bool {
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
        r.exchange.error_code = answer.error_code;
        if r.exchange.method == "tools/call" {
            r.exchange.empty_content = answer.empty_content;
        }
        // The client that closed its stream came back for the answer: it did not cancel.
        if r.client_left {
            r.exchange.cancelled = false;
        }
        out.push(Output::Event(Event::Exchange(r.exchange)));
        self.recharge_shrunk(key);
        true
    }

    fn valid_session_id(&self, id: Option<&str>, out: &mut Vec<Output>) -> Option<String> {
        self.checked_session_id(id, out).map(str::to_string)
    }

    /// [`Self::valid_session_id`] without the copy, for a caller that may not keep it.
    fn checked_session_id<'i>(
        &self,
        id: Option<&'i str>,
        out: &mut Vec<Output>,
    ) -> Option<&'i str> {
        let id = id?;
        let ok = session::is_valid_session_id(id, self.limits.max_session_id_len);
        if !ok {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::InvalidSessionId,
            }));
        }
        ok.then_some(id)
    }

    /// The lineage of a request from `ctx` with `head`: `name` is the client's clientInfo
    /// (name, version) if the request names it. Legacy requests that name no client take the
    /// label of their client's latest `initialize`; `remember`: this one is an initialize.
    /// With it, the client's route bucket.
    fn lineage_of(
        &mut self,
        ctx: FlowCtx,
        head: &RequestHead,
        name: Option<(&str, Option<&str>)>,
        legacy: bool,
        out: &mut Vec<Output>,
    ) -> (Box<str>, u16) {
        let server_ident = self.identities.server_identity(ctx.server, head);
        let proxied = self.proxied.get(&ctx.flow).copied();
        let client_ident = self
            .identities
            .client_identity_via(ctx.client.ip(), proxied, head);
        let label = match name {
            Some((n, v)) => identity::client_label(Some(n), v, None),
            None => {
                let known = legacy
                    .then(|| self.stateless_labels.get(ctx.server, &client_ident))
                    .flatten();
                match known {
                    Some(l) => l.to_string(),
                    None => identity::client_label(None, None, headers::request_user_agent(head)),
                }
            }
        };
        if legacy && name.is_some() {
            let dropped = self.stateless_labels.set(ctx.server, &client_ident, &label);
            // Rarely reached: a fleet of distinct stateless clients on one pipeline.
            for _ in 0..dropped.0 {
                out.push(Output::Telemetry(Telemetry::LimitHit {
                    limit: Limit::LineageRecords,
                }));
            }
            self.publish_lineage_bytes();
        }
        // Both are hashes of these texts, worked out once per distinct set.
        let (endpoint, len) = identity::endpoint_bytes(ctx.server);
        let texts = [
            endpoint.get(..len).unwrap_or_default(),
            server_ident.as_bytes(),
            client_ident.as_bytes(),
            label.as_bytes(),
        ];
        if let Some((lineage_id, route)) = self.lineage_ids.get(&texts) {
            return (lineage_id.clone(), *route);
        }
        let lineage_id = self
            .identities
            .lineage_id(&server_ident, &client_ident, &label)
            .into_boxed_str();
        let route = self.identities.route_bucket(ctx.server, &client_ident);
        let held = lineage_id.len().next_multiple_of(16);
        self.lineage_ids
            .insert(&texts, (lineage_id.clone(), route), held);
        self.publish_lineage_bytes();
        (lineage_id, route)
    }

    fn on_request(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        head: Box<RequestHead>,
        body: &[u8],
        out: &mut Vec<Output>,
    ) {
        match self.classify_request(ctx, &head, body, out) {
            Some(request) => self.open_request(ctx, ts, exchange, head, request, out),
            None => self.spend_request_head(head),
        }
    }

    /// What a request is and whom it belongs to: its JSON-RPC messages, its session and
    /// lineage. `None`: its body is not JSON-RPC (counted).
    fn classify_request(
        &mut self,
        ctx: FlowCtx,
        head: &RequestHead,
        body: &[u8],
        out: &mut Vec<Output>,
    ) -> Option<ClassifiedRequest> {
        let mut session_id = self.valid_session_id(headers::request_session_id(head), out);
        let mut era = Era::Legacy;
        if session_id.is_none()
            && !self.sse_endpoints.is_empty()
            && let Some(sid) = self
                .sse_endpoints
                .get(&(ctx.server, Box::from(head.path())))
        {
            session_id = Some(sid.to_string());
            era = Era::HttpSse;
        }
        let header_modern =
            headers::request_protocol_version(head).is_some_and(modern::is_modern_version);
        let mut requests = Vec::new();
        let mut client_answers: Vec<(Id, Option<i64>)> = Vec::new();
        let mut cancels = Vec::new();
        // The first initialize's clientInfo (name, version), if its params are kept.
        let mut init_name: Option<Option<(String, Option<String>)>> = None;
        let cached_held = self.declarations.bytes() + self.params_seen.bytes();
        if !body.is_empty() {
            let (seen, sightings) = (&mut self.params_seen, &mut self.params_sightings);
            let read_params = &mut |rest, _: Option<&str>| cached_params(seen, sightings, rest);
            match jsonrpc::parse_with(body, read_params) {
                Ok(msgs) => {
                    for m in msgs {
                        match m {
                            Message::Request { id, method, params } => {
                                let method = method.into_owned();
                                let tool = (method == "tools/call")
                                    .then(|| jsonrpc::tool_name(params.as_ref()))
                                    .flatten();
                                let progress = jsonrpc::progress_requested(params.as_ref());
                                let init_params = (method == "initialize")
                                    .then(|| params.as_ref().and_then(|p| checked_params(p, out)))
                                    .flatten();
                                if method == "initialize" && init_name.is_none() {
                                    init_name = Some(
                                        params
                                            .as_ref()
                                            .filter(|_| init_params.is_some())
                                            .and_then(init_client_name_of),
                                    );
                                }
                                let facts = params
                                    .filter(|p| header_modern || modern::may_declare(p.get()))
                                    .and_then(|p| {
                                        let cache = &mut self.declarations;
                                        modern::request_facts_with(
                                            &p,
                                            method == "tools/call",
                                            &mut |meta| cached_declaration(cache, meta),
                                        )
                                    })
                                    .map(Box::new);
                                requests.push(PendingRequest {
                                    id,
                                    method,
                                    tool,
                                    progress,
                                    init_params,
                                    answered: false,
                                    facts,
                                    findings: Vec::new(),
                                    cancelled: false,
                                });
                            }
                            Message::Notification { method, params }
                                if method == "notifications/cancelled" =>
                            {
                                // Bounded as requests are: one per message of the body.
                                cancels.extend(jsonrpc::cancelled_request_id(params.as_ref()));
                            }
                            Message::Result { id, .. } => client_answers.push((id, None)),
                            Message::Error {
                                id: Some(id), code, ..
                            } => client_answers.push((id, Some(code))),
                            _ => {}
                        }
                    }
                }
                Err(e) => {
                    out.push(Output::Telemetry(Telemetry::JsonRpcError {
                        reason: e.into(),
                    }));
                    // What the caches took before the message failed is charged all the same.
                    if self.declarations.bytes() + self.params_seen.bytes() != cached_held {
                        self.publish_lineage_bytes();
                    }
                    return None;
                }
            }
        }
        if self.declarations.bytes() + self.params_seen.bytes() != cached_held {
            self.publish_lineage_bytes();
        }
        let declaration = requests
            .iter()
            .find_map(|r| r.facts.as_ref().and_then(|f| f.declaration.as_ref()));
        if era != Era::HttpSse && (header_modern || declaration.is_some()) {
            era = Era::Modern;
        }
        // Who this client is, for traffic without a session id and for handshakes.
        let init_name = init_name.flatten();
        let lineage = if session_id.is_none() || init_name.is_some() {
            let name = match (declaration, &init_name) {
                (Some(d), _) if d.client_name.is_some() => d
                    .client_name
                    .as_deref()
                    .map(|n| (n, d.client_version.as_deref())),
                (_, Some((n, v))) => Some((n.as_str(), v.as_deref())),
                _ => None,
            };
            let legacy = era != Era::Modern;
            Some(self.lineage_of(ctx, head, name, legacy, out))
        } else {
            // A session's requests: its lineage, looked up with the session.
            None
        };
        let (lineage_id, route) = lineage.unzip();
        Some(ClassifiedRequest {
            session_id,
            era,
            requests,
            client_answers,
            lineage_id,
            route,
            cancels,
        })
    }

    /// Opens the exchange of a classified request (see [`Self::classify_request`]).
    fn open_request(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        head: Box<RequestHead>,
        request: ClassifiedRequest,
        out: &mut Vec<Output>,
    ) {
        let ClassifiedRequest {
            session_id,
            era,
            mut requests,
            mut client_answers,
            mut lineage_id,
            mut route,
            cancels,
        } = request;
        for r in &requests {
            out.push(Output::Telemetry(Telemetry::Request {
                server: ctx.server,
                method: crate::model::method_label(&r.method),
                era,
            }));
        }
        if era == Era::Modern {
            if requests.iter().any(|r| r.method == "tools/call") {
                self.sync_server_entry(&session::server_key(ctx.server), ts, out);
            }
            for r in &mut requests {
                let params = (r.method == "tools/call")
                    .then(|| self.param_headers(ctx.server, r.tool.as_deref()))
                    .flatten();
                if params.is_some() && head.prefixed_truncated {
                    out.push(Output::Telemetry(Telemetry::LimitHit {
                        limit: Limit::ParamHeaders,
                    }));
                }
                r.findings = modern::header_findings(
                    &head,
                    &r.method,
                    r.facts.as_deref(),
                    params.as_deref(),
                );
                for f in &r.findings {
                    out.push(Output::Telemetry(Telemetry::HeaderMismatch {
                        server: ctx.server,
                        header: f.header,
                    }));
                }
            }
        }
        if let Some(lid) = &lineage_id {
            let key = session::lineage_key(ctx.server, lid);
            for r in requests
                .iter()
                .filter(|r| r.facts.as_ref().is_some_and(|f| f.input_responses))
            {
                self.input_retried(&key, &r.method, r.tool.as_deref(), out);
            }
        }
        let mut server_answers = Vec::new();
        let mut session_id = session_id;
        if let Some(sid) = session_id.take() {
            // The id moves into the key and back: no copy of it per request.
            let key = (ctx.server, sid);
            let noted = SessionRequest {
                ctx,
                exchange,
                ts,
                era,
                max_in_flight: self.limits.max_in_flight,
                head: &head,
                requests: &requests,
            };
            // A known session with its route, outside fleet mode (nearly every request): one
            // lookup.
            let mut in_flight_grew = false;
            let done = self.fleet.is_none()
                && match self.sessions.get_mut(&key) {
                    Some(s) if s.route.is_some() => {
                        s.last_seen = ts;
                        let answers = std::mem::take(&mut client_answers);
                        in_flight_grew = noted.note(
                            s,
                            &key.1,
                            None,
                            answers,
                            &mut server_answers,
                            &mut lineage_id,
                            &mut route,
                        );
                        true
                    }
                    _ => false,
                };
            if !done {
                self.touch_session(&key, ctx, ts, out);
                let fleet_key = (self.fleet.is_some()
                    && self
                        .sessions
                        .get(&key)
                        .is_some_and(|s| s.fleet_key.is_none()))
                .then(|| {
                    fleet_session_key(&self.identities.server_identity(ctx.server, &head), &key.1)
                });
                if let Some(s) = self.sessions.get_mut(&key) {
                    let answers = std::mem::take(&mut client_answers);
                    in_flight_grew = noted.note(
                        s,
                        &key.1,
                        fleet_key,
                        answers,
                        &mut server_answers,
                        &mut lineage_id,
                        &mut route,
                    );
                }
            }
            if in_flight_grew {
                self.recharge(&key, ts, out);
            }
            if !cancels.is_empty() {
                self.cancel_requests(&key, &cancels);
            }
            session_id = Some(key.1);
        } else if let Some(lid) = lineage_id.as_deref()
            && era == Era::Legacy
            && !cancels.is_empty()
        {
            // Without a session id the cancelled request is the same client's (its lineage,
            // at this server) open request with that id, on whichever connection it went.
            for id in &cancels {
                self.transactions.cancel_sessionless(ctx.server, lid, id);
            }
        }
        let opened = Box::new(ExchangeState {
            flow: ctx.flow,
            number: exchange,
            ts,
            client: ctx.client,
            server: ctx.server,
            head,
            session_id,
            requests: Requests::new(requests),
            response: None,
            stream: Default::default(),
            era,
            lineage_id,
            route,
            ends_session: false,
            client_gone: false,
            server_answers,
            charged: 0,
            indexed: false,
        });
        if let Some(dropped) = self.transactions.open(ctx.flow, opened) {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ExchangesPerFlow,
            }));
            self.forget_in_flight(ctx.server, &dropped);
            self.retire(dropped);
        }
    }

    /// The `x-mcp-header` parameters `tool` of `server` declared in `tools/list`.
    fn param_headers(&self, server: SocketAddr, tool: Option<&str>) -> Option<Vec<ParamHeader>> {
        let tool = tool?;
        let ext = self
            .sessions
            .get(&session::server_key(server))?
            .ext
            .as_ref()?;
        ext.param_tools
            .iter()
            .find(|(t, _)| &**t == tool)
            .map(|(_, p)| p.clone())
    }

    /// Makes sure a session exists for a request that names it (midstream pickup).
    fn touch_session(
        &mut self,
        key: &SessionKey,
        ctx: FlowCtx,
        ts: Timestamp,
        out: &mut Vec<Output>,
    ) {
        // A known session with its route (nearly every request): one lookup.
        match self.sessions.get_mut(key) {
            Some(s) => {
                s.last_seen = ts;
                if s.route.is_some() {
                    return;
                }
            }
            None => self.ensure(key, ctx.client, ts, true, out),
        }
        // Its requests name it: a router that has not learned it routes them by the id.
        if self.sessions.get(key).is_some_and(|s| s.route.is_none()) {
            let route = self.identities.route_bucket(key.0, &key.1);
            self.route_entry(key, Some(route));
        }
    }

    fn on_response_head(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        exchange: u64,
        head: Box<ResponseHead>,
        out: &mut Vec<Output>,
    ) {
        out.push(Output::Telemetry(Telemetry::HttpResponse {
            server: ctx.server,
            status: head.status,
        }));
        let learned = self.checked_session_id(headers::response_session_id(&head), out);
        let Some(ex) = self.transactions.get_mut((ctx.flow, exchange)) else {
            self.spend_response_head(head);
            return;
        };
        if ex.session_id.is_none() && is_2xx(head.status) && ex.era != Era::Modern {
            ex.session_id = learned.map(str::to_string);
        }
        let status = head.status;
        let is_delete = ex.head.method() == "DELETE";
        let named_session = headers::request_session_id(&ex.head).is_some();
        let sid = ex.session_id.clone();
        if let (Some(old), Some(spent)) = (ex.response.replace(head), self.spent.as_mut()) {
            spent.response_heads.push(old);
        }
        for mut answer in std::mem::take(&mut ex.server_answers) {
            answer.http_status = status;
            out.push(Output::Event(Event::Exchange(answer)));
        }
        let Some(sid) = sid else { return };
        let key = (ctx.server, sid);
        if status == 404 && named_session {
            // The session ends once this answer is reported.
            ex.ends_session = true;
        } else if is_delete && is_2xx(status) {
            self.end_session(&key, ts, EndReason::Deleted, out);
        } else if let Some(s) = self.sessions.get_mut(&key) {
            s.last_seen = ts;
        }
    }

    /// A 404 ended the session the exchange named: reported after the exchange.
    fn end_if_expired(&mut self, ex: &ExchangeState, ts: Timestamp, out: &mut Vec<Output>) {
        if ex.ends_session
            && let Some(sid) = &ex.session_id
        {
            self.end_session(&(ex.server, sid.clone()), ts, EndReason::Expired, out);
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
        // A 202 answers a notification or a client's response, or (HTTP+SSE) says the answer
        // comes on the stream; its body (`Accepted`) is no JSON-RPC.
        let accepted_only = self
            .transactions
            .get((ctx.flow, exchange))
            .and_then(|ex| ex.response.as_ref())
            .is_some_and(|r| r.status == 202);
        if accepted_only {
            return;
        }
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
        item: &SseItem,
        out: &mut Vec<Output>,
    ) {
        let key = (ctx.flow, exchange);
        let Some(ex) = self.transactions.get_mut(key) else {
            return;
        };
        ex.stream.items = ex.stream.items.saturating_add(1);
        let ex = if !self.resumption_deadlines.is_empty()
            && resumes_a_stream(ex)
            && let Some(sid) = ex.session_id.clone()
        {
            let retry = match item {
                SseItem::Event(event) => event.retry.or(ex.stream.retry_ms),
                _ => ex.stream.retry_ms,
            };
            self.resumed_stream_active(&(ctx.server, sid), ts, retry);
            let Some(ex) = self.transactions.get_mut(key) else {
                return;
            };
            ex
        } else {
            ex
        };
        if let SseItem::NoData { id: Some(_) } = item {
            // `id:` alone sets the stream's last event id too: it may be resumed from there.
            ex.stream.event_id_seen = true;
        }
        let SseItem::Event(event) = item else { return };
        ex.stream.event_id_seen |= event.id.is_some();
        if event.retry.is_some() {
            ex.stream.retry_ms = event.retry;
        }
        let text = event.text();
        if event.event_type.as_deref() == Some("endpoint") && ex.head.method() == "GET" {
            self.bind_sse_endpoint(ctx, ts, key, text.trim(), out);
            return;
        }
        if text.trim().is_empty() {
            return; // priming event
        }
        match jsonrpc::parse_str(&text) {
            Ok(msgs) => {
                for m in msgs {
                    if m.is_request_or_notification() {
                        if let Some(ex) = self.transactions.get_mut(key) {
                            ex.stream.messages = ex.stream.messages.saturating_add(1);
                        }
                        if let Message::Request { id, method, .. } = &m {
                            self.server_request(ctx, ts, key, id, method, out);
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

    /// A server's request on a stream of a session: remembered until the client answers it.
    fn server_request(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        here: ExchangeKey,
        id: &Id,
        method: &str,
        out: &mut Vec<Output>,
    ) {
        let Some(sid) = self
            .transactions
            .get(here)
            .and_then(|ex| ex.session_id.clone())
        else {
            return;
        };
        let key = (ctx.server, sid);
        let Some(s) = self.sessions.get_mut(&key) else {
            return;
        };
        if s.server_requests.len() >= session::MAX_SERVER_REQUESTS {
            // The oldest gives way: requests a client never answered (lost, ignored) must
            // not keep the session's later ones from being followed.
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ServerRequests,
            }));
            s.server_requests.remove(0);
        }
        s.server_requests.push(ServerRequest {
            id: id.clone(),
            method: method.into(),
            ts,
        });
        self.recharge(&key, ts, out);
    }

    /// An HTTP+SSE `endpoint` event: POSTs to that URL belong to this stream's session.
    fn bind_sse_endpoint(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        here: ExchangeKey,
        url: &str,
        out: &mut Vec<Output>,
    ) {
        let path = endpoint_path(url);
        // A stream announces one endpoint (a stream re-announcing would fill the table on its
        // own), and a URL of kilobytes is no endpoint to keep: the table holds them as keys.
        let rebinding = self
            .transactions
            .get(here)
            .is_some_and(|ex| ex.era == Era::HttpSse);
        if rebinding || path.len() > MAX_SSE_ENDPOINT_BYTES {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::SseEndpoints,
            }));
            return;
        }
        let Some(sid) = self.valid_session_id(Some(endpoint_session_id(path)), out) else {
            return;
        };
        let binding = (ctx.server, Box::from(path));
        if !self.sse_endpoints.contains_key(&binding)
            && self.sse_endpoints.len() >= MAX_SSE_ENDPOINTS
        {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::SseEndpoints,
            }));
            return;
        }
        self.sse_endpoints.insert(binding, Box::from(sid.as_str()));
        let key = (ctx.server, sid.clone());
        self.ensure(&key, ctx.client, ts, false, out);
        // Its POSTs name it in the query alone: they go where the stream's client goes.
        let route = self.transactions.get(here).and_then(|ex| ex.route);
        self.route_entry(&key, route);
        if let Some(s) = self.sessions.get_mut(&key) {
            s.era = Era::HttpSse;
        }
        if let Some(ex) = self.transactions.get_mut(here) {
            ex.session_id = Some(sid);
            ex.era = Era::HttpSse;
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
        let session = self.sessions.get_at((ctx.server, sid))?;
        session.in_flight.get(id)
    }

    fn sole_open_request(&self, here: ExchangeKey) -> Option<Id> {
        let ex = self.transactions.get(here)?;
        ex.requests.sole_open().map(|r| r.id.clone())
    }

    /// The protocol version an exchange ran under: its header, else the session's negotiated
    /// one, else its `_meta` declaration.
    fn protocol_version_of(
        &self,
        ex: &ExchangeState,
        facts: Option<&RequestFacts>,
    ) -> Option<String> {
        headers::request_protocol_version(&ex.head)
            .map(str::to_string)
            .or_else(|| {
                let sid = ex.session_id.as_ref()?;
                let s = self.sessions.get_at((ex.server, sid))?;
                s.protocol_version.as_deref().map(str::to_string)
            })
            .or_else(|| {
                facts
                    .and_then(|f| f.declaration.as_ref())
                    .and_then(|d| d.protocol_version.as_deref())
                    .map(str::to_string)
            })
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
        // HTTP+SSE: the POST that carried the request was answered 202 and parked.
        let mut parked = None;
        let mut here_sid = None;
        let target_gone = if target == here {
            carrier.is_none()
        } else {
            self.transactions.get(target).is_none()
        };
        if target_gone {
            here_sid = self
                .transactions
                .get(here)
                .and_then(|ex| ex.session_id.clone());
            if let Some(sid) = &here_sid
                && let Some(s) = self.sessions.get_mut_at((ctx.server, sid))
                && let Some(at) = s
                    .parked
                    .iter()
                    .position(|p| (ctx_flow_of(p), p.number) == target)
            {
                parked = Some(s.parked.swap_remove(at));
            }
        }
        let from_parked = parked.is_some();
        let ex = match parked.as_mut() {
            Some(p) => p,
            None => match self.transactions.get_mut(target) {
                Some(ex) => ex,
                None => {
                    // The exchange that carried the request is over: a resumed stream, perhaps.
                    if let Some(sid) = here_sid {
                        let answer = ResumedAnswer {
                            error_code: error.as_ref().map(|(c, _)| *c),
                            empty_content: result.as_ref().map(ResultFields::is_empty_tool_content),
                        };
                        self.resumed(&(ctx.server, sid), &id, ts, answer, out);
                    }
                    return;
                }
            },
        };
        let Some(idx) = ex.requests.find_open(&id) else {
            return;
        };
        // HTTP+SSE: an answer on the GET stream may overtake the POST's 202 (the TypeScript
        // SDK writes it first); the server took the request, so it is a 202 all the same.
        let pending_202 = ex.era == Era::HttpSse && target != here;
        let status = ex
            .response
            .as_ref()
            .map_or(if pending_202 { 202 } else { 0 }, |r| r.status);
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
        let client = ex.client;
        let (framing, ambiguous) = framing_of(ex);
        let accept = ex.head.accept().map(str::to_string);
        let era = ex.era;
        let Some(request) = ex.requests.answer(idx) else {
            return;
        };
        let method = request.method.clone();
        let tool = request.tool.clone();
        let progress_requested = request.progress;
        // Cancelled by name before its answer came (the Python SDK then answers an error).
        let cancelled = request.cancelled;
        let init_params = request.init_params.take();
        let facts = request.facts.take();
        // Where it was asked, for a modern handshake (a declaration, a discover result).
        let declares = facts.as_ref().is_some_and(|f| f.declaration.is_some());
        let place = ((era == Era::Modern && declares) || method == "server/discover").then(|| {
            (
                ex.head.host().map(str::to_string),
                ex.head.path().to_string(),
            )
        });
        let findings = std::mem::take(&mut request.findings);
        // The whole request side is only needed for a handshake.
        let origin = (method == "initialize").then(|| ex.origin());
        let route = ex.route;
        // A parked exchange is not in the table once answered: its header is read now.
        let parked_pv = from_parked
            .then(|| headers::request_protocol_version(&ex.head).map(str::to_string))
            .flatten();
        // The event owns the exchange's strings; what follows reads them there.
        let mut event = exchange_of(ex, method, tool, id.to_value(), None);
        // O(1): a scan here, after each answer of a batch, made a batch answered in order
        // quadratic (a 3.6 MB batch of 80,000 requests took 15 s).
        let still_open = ex.requests.has_open();
        if let Some(p) = parked.take() {
            let session = here_sid
                .as_ref()
                .filter(|_| still_open)
                .and_then(|sid| self.sessions.get_mut_at((ctx.server, sid)));
            match session {
                Some(s) => s.parked.push(p),
                None => self.retire(p),
            }
        }

        if let Some(origin) = &origin {
            let answer = Answer {
                result: result.as_ref(),
                error: error.as_ref(),
                status,
            };
            self.on_handshake(ts, origin, init_params.as_deref(), answer, framing, out);
        }
        let protocol_version = match self.transactions.get(target) {
            Some(ex) => self.protocol_version_of(ex, facts.as_deref()),
            None => parked_pv.or_else(|| {
                facts
                    .as_ref()
                    .and_then(|f| f.declaration.as_ref())
                    .and_then(|d| d.protocol_version.as_deref())
                    .map(str::to_string)
            }),
        };
        event.protocol_version = protocol_version.or_else(|| {
            event
                .session_id
                .as_ref()
                .and_then(|s| self.sessions.get_at((ctx.server, s)))
                .and_then(|s| s.protocol_version.as_deref().map(str::to_string))
        });
        event.empty_content = (event.method == "tools/call")
            .then(|| result.as_ref().map(ResultFields::is_empty_tool_content))
            .flatten();
        event.http_status = status;
        event.media_type = media_label(mt.as_deref());
        event.sse_events = sse_events;
        event.duration_ms = ts.millis_since(event.ts);
        event.answered = true;
        event.error_code = error.as_ref().map(|(c, _)| *c);
        event.cancelled = cancelled;
        let concluded = Concluded {
            ts,
            server: ctx.server,
            client,
            era,
            lineage_id: event.lineage_id.as_deref(),
            route,
            session_id: event.session_id.as_deref(),
            host: place.as_ref().and_then(|(host, _)| host.as_deref()),
            path: place.as_ref().map_or("", |(_, path)| path),
            method: &event.method,
            tool: event.tool.as_deref(),
            request_id: &event.request_id,
            status,
            media_type: mt.as_deref(),
            error_code: event.error_code,
            facts: facts.as_deref(),
            findings: &findings,
            result: result.as_ref(),
            framing,
            protocol_version: event.protocol_version.as_deref(),
            answered: true,
        };
        let mut alerts = Vec::new();
        let input = self.conclude(&concluded, out, &mut alerts);
        // The event goes here in the output, before the alerts: it is put there once the
        // review below, which reads it, is done.
        let mut event_at = Some(out.len());
        if let (Some(kinds), Some(lid)) = (input, &event.lineage_id) {
            // An `InputRequiredResult` (rare): the exchange is held until its lineage retries.
            let mut held = event.clone();
            held.input_required = Some(InputRequired {
                requests: kinds,
                retried: None,
            });
            self.hold_input(
                ctx.server,
                lid,
                route,
                &event.method,
                event.tool.as_deref(),
                ts,
                Box::new(held),
                out,
            );
            event_at = None;
        }
        out.append(&mut alerts);
        let review = AnswerReview {
            method: &event.method,
            tool: event.tool.as_deref(),
            progress_requested,
            capability_changes: 0,
            requested_at: event.ts,
            request_id: &event.request_id,
            http_status: status,
            is_error: error.is_some(),
            shape,
            on_other_stream: target != here && on_stream,
            streaming_negotiated: false,
            accept: accept.as_deref(),
            ambiguous,
        };
        let alert_ctx = AlertCtx {
            session_id: event.session_id.as_deref(),
            lineage_id: event.lineage_id.as_deref(),
            era,
            protocol_version: event.protocol_version.as_deref(),
            server: ctx.server,
            client,
            framing,
        };
        self.review_answer(ctx, ts, &id, &review, &alert_ctx, out);
        if let Some(at) = event_at {
            out.insert(at, Output::Event(Event::Exchange(Box::new(event))));
        }
    }

    /// The answer-shape review of an answered request: against its session's modes, or a
    /// stateless legacy endpoint's (modern servers choose per request: nothing to compare).
    fn review_answer(
        &mut self,
        ctx: FlowCtx,
        ts: Timestamp,
        id: &Id,
        review: &AnswerReview<'_>,
        alert_ctx: &AlertCtx<'_>,
        out: &mut Vec<Output>,
    ) {
        match (alert_ctx.session_id, alert_ctx.era) {
            (Some(sid), _) => {
                let Some(session) = self.sessions.get_mut_at((ctx.server, sid)) else {
                    return;
                };
                let before = (session.in_flight.room(), session.detection.heap_bytes());
                session.in_flight.remove(id);
                let review = AnswerReview {
                    streaming_negotiated: session.streaming_negotiated,
                    // An answer to a request sent before the latest change belongs before it.
                    capability_changes: session.capability_changes.saturating_sub(u32::from(
                        review.requested_at < session.capability_changed_at,
                    )),
                    ..*review
                };
                let AnswerVerdict { alert, untracked } =
                    self.detector.answer(&mut session.detection, &review);
                session.alerts = session.alerts.saturating_add(u32::from(alert.is_some()));
                count_untracked(untracked, out);
                // Recharged when its detection state grew or its in-flight table gave room
                // back; an answered id alone is left charged until then (over, never under).
                let changed = (session.in_flight.room(), session.detection.heap_bytes()) != before;
                alert_ctx.push(out, ts, alert);
                self.touch_shared_at((ctx.server, sid));
                if changed {
                    self.recharge(&(ctx.server, sid.to_string()), ts, out);
                }
            }
            (None, Era::Legacy) => {
                let Some(lid) = alert_ctx.lineage_id else {
                    return;
                };
                let streaming = self
                    .sessions
                    .get(&session::lineage_key(ctx.server, lid))
                    .is_some_and(|s| s.streaming_negotiated);
                let key = session::endpoint_key(ctx.server, review.method, review.tool);
                self.sync_server_entry(&key, ts, out);
                self.ensure(&key, alert_ctx.client, ts, false, out);
                let Some(endpoint) = self.sessions.get_mut(&key) else {
                    return;
                };
                let review = AnswerReview {
                    streaming_negotiated: streaming,
                    ..*review
                };
                let before = endpoint.detection.heap_bytes();
                let AnswerVerdict { alert, untracked } =
                    self.detector.answer(&mut endpoint.detection, &review);
                count_untracked(untracked, out);
                let grew = endpoint.detection.heap_bytes() != before;
                self.publish_server_entry(&key);
                if alert.is_some()
                    && let Some(l) = self
                        .sessions
                        .get_mut(&session::lineage_key(ctx.server, lid))
                {
                    l.alerts = l.alerts.saturating_add(1);
                }
                alert_ctx.push(out, ts, alert);
                self.touch_shared(&key);
                if grew {
                    self.recharge(&key, ts, out);
                }
            }
            (None, _) => {}
        }
    }

    /// Holds the exchange of an `InputRequiredResult` until its lineage retries it or the
    /// lineage window passes.
    #[allow(clippy::too_many_arguments)]
    fn hold_input(
        &mut self,
        server: SocketAddr,
        lineage_id: &str,
        route: Option<u16>,
        method: &str,
        tool: Option<&str>,
        ts: Timestamp,
        exchange: Box<Exchange>,
        out: &mut Vec<Output>,
    ) {
        let key = session::lineage_key(server, lineage_id);
        let client = exchange.client;
        self.ensure(&key, client, ts, false, out);
        self.route_entry(&key, route);
        let deadline = Timestamp(ts.0.saturating_add(self.limits.lineage_window_ns));
        let Some(ext) = self.ext_mut(&key) else {
            out.push(Output::Event(Event::Exchange(exchange)));
            return;
        };
        if ext.input_pending.len() >= session::MAX_INPUT_PENDING {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::InputPending,
            }));
            out.push(Output::Event(Event::Exchange(exchange)));
            return;
        }
        ext.input_pending.push(InputPending {
            method: method.into(),
            tool: tool.map(Box::from),
            deadline,
            exchange,
        });
        self.input_deadlines.push(Reverse((deadline, key.clone())));
        self.recharge(&key, ts, out);
    }

    /// The era-aware steps once a request is answered or ended: modern declarations, modern
    /// successes and failures, header mismatches, `server/discover` results, `x-mcp-header`
    /// tools. Handshake events go to `out` (before the exchange), alerts to `alerts` (after
    /// it). Returns what an `InputRequiredResult` asked for.
    fn conclude(
        &mut self,
        c: &Concluded<'_>,
        out: &mut Vec<Output>,
        alerts: &mut Vec<Output>,
    ) -> Option<Vec<String>> {
        let alert_ctx = AlertCtx {
            session_id: c.session_id,
            lineage_id: c.lineage_id,
            era: c.era,
            protocol_version: c.protocol_version,
            server: c.server,
            client: c.client,
            framing: c.framing,
        };
        let accepted = c.answered && is_2xx(c.status) && c.error_code.is_none();
        let lineage_key = (c.era == Era::Modern || !c.findings.is_empty())
            .then(|| c.lineage_id.map(|l| session::lineage_key(c.server, l)))
            .flatten();
        if c.era == Era::Modern
            && let Some(key) = &lineage_key
        {
            self.ensure(key, c.client, c.ts, false, out);
            self.route_entry(key, c.route);
            if let Some(decl) = c.facts.and_then(|f| f.declaration.as_ref()) {
                self.declaration(c, key, decl, &alert_ctx, out, alerts);
            }
            let failure = (!accepted).then(|| FailedAnswer {
                method: c.method.to_string(),
                http_status: c.status,
                media_type: media_label(c.media_type),
                content_type: c
                    .media_type
                    .filter(|m| media_label(Some(m)) == "other")
                    .map(str::to_string),
                error_code: c.error_code,
            });
            self.touch_shared(key);
            if let Some(ext) = self.ext_mut(key) {
                match failure {
                    None => ext.modern_ok = true,
                    Some(f) => {
                        if ext.failures.len() >= session::MAX_FAILURES {
                            ext.failures.pop_front();
                        }
                        ext.failures.push_back(f);
                    }
                }
            }
        }
        if !c.findings.is_empty() {
            let alert = self.detector.header_mismatch(&MismatchReview {
                findings: c.findings,
                method: c.method,
                tool: c.tool,
                request_id: c.request_id,
                http_status: c.status,
                error_code: c.error_code,
            });
            if alert.is_some()
                && let Some(s) = lineage_key.as_ref().and_then(|k| self.sessions.get_mut(k))
            {
                s.alerts = s.alerts.saturating_add(1);
            }
            alert_ctx.push(alerts, c.ts, alert);
        }
        let result = c.result?;
        if accepted && c.method == "server/discover" {
            self.discover(c, result, &alert_ctx, out, alerts);
        }
        if accepted
            && c.method == "tools/list"
            && let Some(tools) = result.tools
        {
            let (found, truncated) = modern::param_headers(tools);
            if truncated {
                out.push(Output::Telemetry(Telemetry::LimitHit {
                    limit: Limit::ParamHeaders,
                }));
            }
            if !found.is_empty() {
                let key = session::server_key(c.server);
                self.sync_server_entry(&key, c.ts, out);
                self.ensure(&key, c.client, c.ts, false, out);
                if let Some(ext) = self.ext_mut(&key) {
                    for (tool, params) in found {
                        let full = ext.param_tools.len() >= modern::MAX_PARAM_TOOLS;
                        match ext.param_tools.iter_mut().find(|(t, _)| *t == tool) {
                            Some(entry) => entry.1 = params,
                            None if !full => ext.param_tools.push((tool, params)),
                            None => {}
                        }
                    }
                }
                self.recharge(&key, c.ts, out);
                self.publish_server_entry(&key);
            }
        }
        let requests = result.input_requests?;
        Some(input_request_methods(requests.get()))
    }

    /// One modern declaration of lineage `key`: logged when first seen, compared with the
    /// method's first declaration.
    fn declaration(
        &mut self,
        c: &Concluded<'_>,
        key: &SessionKey,
        decl: &modern::Declaration,
        alert_ctx: &AlertCtx,
        out: &mut Vec<Output>,
        alerts: &mut Vec<Output>,
    ) {
        let Some(ext) = self.ext_mut(key) else { return };
        let logged_before = ext.logged.contains(&decl.digest);
        // Beyond the bound a set is logged each time it comes: counted, as it is not
        // remembered.
        let mut truncated = !logged_before && ext.logged.len() >= session::MAX_LOGGED_SETS;
        if !logged_before && !truncated {
            ext.logged.push(decl.digest);
        }
        // A lineage lives as long as its traffic: billions of requests are not out of reach.
        ext.declaration_seq = ext.declaration_seq.saturating_add(1);
        let seq = ext.declaration_seq;
        let at = ext.declarations.iter().position(|d| &*d.method == c.method);
        // Parsed only when this method meets a text it did not have last time (a lineage
        // declares the same set with every request), or when the event or an alert shows it.
        let raw = decl.capabilities.as_deref();
        let known = at
            .and_then(|i| ext.declarations.get(i))
            .filter(|d| d.last_caps.as_deref() == raw)
            .map(|d| (d.last_paths.clone(), d.last_cut));
        let is_known = known.is_some();
        let mut parsed = None;
        let (current_paths, cut) = match known {
            Some(known) => known,
            None => {
                let value = decl.capabilities_value();
                let paths = caps::bounded_paths(&value);
                parsed = Some(value);
                paths
            }
        };
        truncated |= cut;
        let mut current_caps = || parsed.take().unwrap_or_else(|| decl.capabilities_value());
        let mut review_data = None;
        match at {
            None if ext.declarations.len() >= session::MAX_DECLARED_METHODS => truncated = true,
            None => ext.declarations.push(MethodDeclarations {
                method: c.method.into(),
                first_paths: current_paths.clone(),
                first_caps: session::compact_json(&current_caps()),
                first_digest: decl.digest,
                last_digest: decl.digest,
                last_caps: raw.map(Box::from),
                last_paths: current_paths.clone(),
                last_cut: cut,
                seen: vec![decl.digest],
                multiplexed: false,
                alerted: Vec::new(),
            }),
            Some(at) => {
                let d = &mut ext.declarations[at];
                let repeated = d.last_digest == decl.digest;
                if !repeated && d.seen.contains(&decl.digest) {
                    // Back to an earlier set: the lineage interleaves conversations.
                    d.multiplexed = true;
                }
                if !d.seen.contains(&decl.digest) {
                    if d.seen.len() < session::MAX_SETS_PER_METHOD {
                        d.seen.push(decl.digest);
                    } else {
                        truncated = true;
                    }
                }
                d.last_digest = decl.digest;
                if !is_known {
                    d.last_caps = raw.map(Box::from);
                    d.last_paths = current_paths.clone();
                    d.last_cut = cut;
                }
                let diff = PathDiff::between(&d.first_paths, &current_paths);
                let mut already = d.alerted.contains(&diff.removed);
                // Lost-path sets alerted are remembered within the bound of sets per method;
                // beyond it, a lineage narrowing in ever new ways is counted, not alerted.
                if !already
                    && !diff.removed.is_empty()
                    && d.alerted.len() >= session::MAX_SETS_PER_METHOD
                {
                    already = true;
                    truncated = true;
                }
                review_data = Some((diff, repeated, d.multiplexed, already, d.first_caps.clone()));
            }
        }
        if truncated {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::LineageDeclarations,
            }));
        }
        let first_diff = review_data.as_ref().map(|(diff, ..)| diff.clone());
        if !first_diff.as_ref().is_none_or(|d| d.removed.is_empty()) {
            out.push(Output::Telemetry(Telemetry::ClientCapabilityLoss {
                server: c.server,
            }));
        }
        if logged_before {
            out.push(Output::Telemetry(Telemetry::DeclarationRepeated {
                server: c.server,
            }));
        } else {
            out.push(Output::Event(Event::Handshake(Box::new(Handshake {
                v: Default::default(),
                ts: c.ts,
                session_id: None,
                seq,
                outcome: if is_2xx(c.status) && c.error_code.is_none() {
                    Outcome::Accepted
                } else {
                    Outcome::Rejected
                },
                http_status: c.status,
                error_code: c.error_code,
                error_message: None,
                client: c.client,
                server: c.server,
                host: c.host.map(str::to_string),
                path: c.path.to_string(),
                protocol_version_requested: decl.protocol_version.as_deref().map(str::to_string),
                protocol_version: decl.protocol_version.as_deref().map(str::to_string),
                client_info: SharedJson::new(decl.client_info_value()),
                server_info: SharedJson::default(),
                client_capabilities: SharedJson::new(current_caps()),
                server_capabilities: SharedJson::default(),
                diff: first_diff.map(|client| HandshakeDiff {
                    client,
                    server: PathDiff::default(),
                }),
                client_near_miss: false,
                predecessor_session_id: None,
                lineage: None,
                era: Era::Modern,
                source: HandshakeSource::RequestMeta,
                lineage_id: c.lineage_id.map(str::to_string),
                method: Some(c.method.to_string()),
                supported_versions: None,
            }))));
        }
        if let Some((diff, repeated, multiplexed, already, first_caps)) = review_data {
            let alert = self.detector.declaration(&DeclarationReview {
                method: c.method,
                seq,
                diff: &diff,
                repeated,
                multiplexed,
                already_alerted: already,
                previous: &first_caps,
                current: raw,
            });
            if alert.is_some()
                && let Some(s) = self.sessions.get_mut(key)
            {
                s.alerts = s.alerts.saturating_add(1);
                if let Some(d) = s
                    .ext
                    .as_mut()
                    .and_then(|e| e.declarations.iter_mut().find(|d| &*d.method == c.method))
                {
                    d.alerted.push(diff.removed.clone());
                }
            }
            alert_ctx.push(alerts, c.ts, alert);
        }
        self.recharge(key, c.ts, out);
    }

    /// A `server/discover` result: logged when it differs from the server's previous one,
    /// compared with its first.
    fn discover(
        &mut self,
        c: &Concluded<'_>,
        result: &ResultFields<'_>,
        alert_ctx: &AlertCtx,
        out: &mut Vec<Output>,
        alerts: &mut Vec<Output>,
    ) {
        let key = session::server_key(c.server);
        self.sync_server_entry(&key, c.ts, out);
        self.discover_into(&key, c, result, alert_ctx, out, alerts);
        self.publish_server_entry(&key);
    }

    fn discover_into(
        &mut self,
        key: &SessionKey,
        c: &Concluded<'_>,
        result: &ResultFields<'_>,
        alert_ctx: &AlertCtx,
        out: &mut Vec<Output>,
        alerts: &mut Vec<Output>,
    ) {
        self.ensure(key, c.client, c.ts, false, out);
        // Read once per distinct set of texts: the reading is a function of them.
        let texts = [
            raw_text(result.capabilities).as_bytes(),
            raw_text(result.supported_versions).as_bytes(),
            raw_text(result.meta).as_bytes(),
        ];
        let mut fresh = None;
        let reading = match self.discovers.get(&texts) {
            Some(reading) => reading,
            None => &*fresh.insert(DiscoverReading::read(result)),
        };
        let DiscoverReading {
            capabilities: caps_value,
            versions,
            latest,
            versions_cut,
            server_info,
            digest,
            record,
        } = reading;
        let digest = *digest;
        if *versions_cut {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::LineageDeclarations,
            }));
        }
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        s.handshakes = s.handshakes.saturating_add(1);
        let seq = s.handshakes;
        let ext = s.ext.get_or_insert_with(Box::default);
        let changed = ext.discover_digest != Some(digest);
        ext.discover_digest = Some(digest);
        let first_versions = ext
            .first_versions
            .get_or_insert_with(|| latest.iter().map(|v| Box::from(v.as_str())).collect())
            .clone();
        let removed_versions: Vec<String> = first_versions
            .iter()
            .filter(|v| latest.binary_search_by(|x| x.as_str().cmp(v)).is_err())
            .map(|v| v.to_string())
            .collect();
        let versions_alerted = !removed_versions.is_empty()
            && removed_versions
                .iter()
                .all(|v| ext.alerted_versions.iter().any(|a| &**a == v.as_str()));
        let diff = s
            .baseline
            .as_ref()
            .map(|b| PathDiff::between(&b.server_paths, &record.server_paths));
        let previous = s
            .baseline
            .as_ref()
            .map_or(Value::Null, CapsRecord::server_caps);
        let mut paths_alerted = diff
            .as_ref()
            .is_some_and(|d| ext.alerted_paths.contains(&d.removed));
        // As for declarations: a bounded number of lost-path sets alert, later ones count.
        if !paths_alerted
            && diff.as_ref().is_some_and(|d| !d.removed.is_empty())
            && ext.alerted_paths.len() >= session::MAX_SETS_PER_METHOD
        {
            paths_alerted = true;
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::LineageDeclarations,
            }));
        }
        if s.baseline.is_none() {
            s.baseline = Some(record.clone());
        }
        if changed {
            out.push(Output::Event(Event::Handshake(Box::new(Handshake {
                v: Default::default(),
                ts: c.ts,
                session_id: None,
                seq,
                outcome: Outcome::Accepted,
                http_status: c.status,
                error_code: None,
                error_message: None,
                client: c.client,
                server: c.server,
                host: c.host.map(str::to_string),
                path: c.path.to_string(),
                protocol_version_requested: c
                    .facts
                    .and_then(|f| f.declaration.as_ref())
                    .and_then(|d| d.protocol_version.as_deref())
                    .map(str::to_string),
                protocol_version: c.protocol_version.map(str::to_string),
                client_info: SharedJson::default(),
                server_info: SharedJson::new(server_info.clone()),
                client_capabilities: SharedJson::default(),
                server_capabilities: SharedJson::new(caps_value.clone()),
                diff: diff.clone().map(|server| HandshakeDiff {
                    client: PathDiff::default(),
                    server,
                }),
                client_near_miss: false,
                predecessor_session_id: None,
                lineage: None,
                era: Era::Modern,
                source: HandshakeSource::Discover,
                lineage_id: c.lineage_id.map(str::to_string),
                method: None,
                supported_versions: Some(versions.clone()),
            }))));
        } else {
            out.push(Output::Telemetry(Telemetry::DeclarationRepeated {
                server: c.server,
            }));
        }
        let no_diff = PathDiff::default();
        let found = self.detector.discover(&DiscoverReview {
            seq,
            diff: diff.as_ref().unwrap_or(&no_diff),
            paths_alerted,
            previous: &previous,
            current: caps_value,
            removed_versions: &removed_versions,
            versions_alerted,
            supported_versions: versions,
        });
        if let Some(ext) = self.sessions.get_mut(key).and_then(|s| s.ext.as_mut()) {
            for kind in &found {
                match kind {
                    AlertKind::CapabilityNarrowing(_) => {
                        if let Some(d) = &diff {
                            ext.alerted_paths.push(d.removed.clone());
                        }
                    }
                    AlertKind::ProtocolDowngrade(_) => {
                        // Each once: the list stays within the first result's versions.
                        for v in &removed_versions {
                            if !ext.alerted_versions.iter().any(|a| **a == **v) {
                                ext.alerted_versions.push(Box::from(v.as_str()));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        for kind in found {
            alert_ctx.push(alerts, c.ts, Some(kind));
        }
        if let Some(reading) = fresh {
            let value_bytes = reading.heap_bytes(&texts);
            self.discovers.insert(&texts, reading, value_bytes);
            self.publish_lineage_bytes();
        }
        self.recharge(key, c.ts, out);
    }

    fn on_handshake(
        &mut self,
        ts: Timestamp,
        origin: &Origin,
        params: Option<&str>,
        answer: Answer<'_>,
        framing: FramingMode,
        out: &mut Vec<Output>,
    ) {
        // Read once per distinct set of texts: the reading is a function of them.
        let texts: session::HandshakeTexts<'_> = [
            params.unwrap_or_default(),
            raw_text(answer.result.and_then(|r| r.protocol_version)),
            raw_text(answer.result.and_then(|r| r.capabilities)),
            raw_text(answer.result.and_then(|r| r.server_info)),
        ];
        let declared = match self.handshakes.get(&texts) {
            Some(declared) => declared,
            None => {
                let declared = handshake::Declared::read(params, answer.result);
                self.handshakes.insert(&texts, &declared);
                self.publish_lineage_bytes();
                declared
            }
        };
        if let Some(reason) = declared.result_error {
            out.push(Output::Telemetry(Telemetry::JsonRpcError { reason }));
        }
        if declared.params_invalid {
            out.push(Output::Telemetry(Telemetry::JsonRpcError {
                reason: crate::model::JsonRpcError::InvalidJson,
            }));
        }
        let accepted = answer.accepted();
        let mut hs = handshake::describe(ts, origin, &answer, &declared);
        let record = declared.record;
        if record.truncated {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::CapabilityPaths,
            }));
        }
        // A dual-era client falling back: did this lineage have a modern answer before?
        let mut downgrade = None;
        if let Some(lid) = &origin.lineage_id {
            let lkey = session::lineage_key(origin.server, lid);
            if let Some(ext) = self.sessions.get_mut(&lkey).and_then(|s| s.ext.as_mut()) {
                let before: Vec<FailedAnswer> = ext.failures.iter().cloned().collect();
                downgrade = self.detector.downgrade(&DowngradeReview {
                    modern_ok: ext.modern_ok,
                    before: &before,
                    requested_version: hs.protocol_version_requested.as_deref(),
                });
                if downgrade.is_some() {
                    ext.modern_ok = false;
                    ext.failures.clear();
                }
            }
        }
        let key = match (&origin.session_id, &origin.lineage_id) {
            (Some(sid), _) => (origin.server, sid.clone()),
            (None, Some(lid)) => session::lineage_key(origin.server, lid),
            (None, None) => {
                out.push(Output::Event(Event::Handshake(Box::new(hs))));
                return;
            }
        };
        let scope = session::scope_of(&key);
        self.ensure(&key, origin.client, ts, false, out);
        self.route_entry(&key, origin.route);
        let reinit = match scope {
            Scope::Session if origin.era == Era::HttpSse => {
                self.sessions.get(&key).is_some_and(|s| s.handshakes > 0)
            }
            Scope::Session => handshake::reinitialized_session(origin).is_some(),
            _ => self.sessions.get(&key).is_some_and(|s| s.handshakes > 0),
        };
        if accepted
            && !reinit
            && scope == Scope::Session
            && let Some(lid) = &origin.lineage_id
        {
            let lineage_key = LineageKey {
                server: origin.server,
                lineage_id: lid.clone(),
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
        session.handshakes = session.handshakes.saturating_add(1);
        hs.seq = session.handshakes;
        if origin.lineage_id.is_some() {
            session.lineage_id = origin.lineage_id.clone();
            session.lineage_route = origin.route;
        }
        if scope == Scope::Session && origin.era == Era::HttpSse {
            session.era = Era::HttpSse;
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
            let changed = hs
                .diff
                .as_ref()
                .is_some_and(|d| !(d.client.is_empty() && d.server.is_empty()));
            if changed {
                session.capability_changes = session.capability_changes.saturating_add(1);
                session.capability_changed_at = ts;
            }
            session.streaming_negotiated = record.streaming;
            session.protocol_version = hs.protocol_version.as_deref().map(Box::from);
            if session.baseline.is_none() {
                session.baseline = Some(record);
            }
        }
        session.alerts = session
            .alerts
            .saturating_add(u32::from(verdict.alert.is_some()) + u32::from(downgrade.is_some()));
        let public_sid = session::public_session_id(&key);
        let negotiated = hs.protocol_version.clone();
        let alert_ctx = AlertCtx {
            session_id: public_sid.as_deref(),
            lineage_id: origin.lineage_id.as_deref(),
            era: origin.era,
            protocol_version: negotiated.as_deref(),
            server: origin.server,
            client: origin.client,
            framing,
        };
        out.push(Output::Event(Event::Handshake(Box::new(hs))));
        alert_ctx.push(out, ts, verdict.alert);
        alert_ctx.push(out, ts, downgrade);
        if self.fleet.is_some() && scope == Scope::Session {
            let fleet_key = fleet_session_key(
                &self.identities.server_identity(origin.server, &origin.head),
                &key.1,
            );
            if let Some(s) = self.sessions.get_mut(&key) {
                s.fleet_key.get_or_insert_with(|| fleet_key.into());
                s.note_flow(origin.flow);
            }
        }
        self.touch_shared(&key);
        if let Some(lid) = &origin.lineage_id {
            // A downgrade verdict changed the lineage's modern state.
            self.touch_shared(&session::lineage_key(origin.server, lid));
        }
        // The handshake may have given the session its baseline and client info.
        self.recharge(&key, ts, out);
        if !accepted && reinit && scope == Scope::Session {
            // A rejected re-initialize: the client will most likely start over in a new session.
            self.remember_ended(&key, ts, out);
        }
    }

    fn remember_ended(&mut self, key: &SessionKey, ts: Timestamp, out: &mut Vec<Output>) {
        let Some(s) = self.sessions.get(key) else {
            return;
        };
        let Some(lineage_id) = s.lineage_id.clone() else {
            return;
        };
        let lineage_key = LineageKey {
            server: key.0,
            lineage_id,
        };
        let record = Ended {
            ts,
            session_id: key.1.clone(),
            baseline: s.baseline.clone(),
            route: s.lineage_route,
        };
        self.touch_shared(&session::lineage_key(key.0, &lineage_key.lineage_id));
        self.remember_record(lineage_key, record, out);
        self.publish_lineage_bytes();
    }

    /// Lineage records, stateless labels and cached handshake readings count against the
    /// session budget with the sessions.
    fn publish_lineage_bytes(&mut self) {
        let now = self.lineage.bytes()
            + self.stateless_labels.bytes()
            + self.handshakes.bytes()
            + self.lineage_ids.bytes()
            + self.discovers.bytes()
            + self.declarations.bytes()
            + self.params_seen.bytes();
        self.usage
            .republish_session_bytes(self.published_lineage_bytes, now);
        self.published_lineage_bytes = now;
    }

    /// HTTP+SSE POSTs of session `key` still waiting for answers on the stream: reported
    /// unanswered (their stream is gone, or the capture ended).
    fn report_parked(&mut self, key: &SessionKey, _now: Timestamp, out: &mut Vec<Output>) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let parked = std::mem::take(&mut s.parked);
        let negotiated = s.protocol_version.as_deref().map(str::to_string);
        for ex in &parked {
            for r in ex.requests.iter().filter(|r| !r.answered) {
                s.in_flight.remove(&r.id);
                let pv = headers::request_protocol_version(&ex.head)
                    .map(str::to_string)
                    .or_else(|| negotiated.clone());
                let event = exchange_of(ex, r.method.clone(), r.tool.clone(), r.id.to_value(), pv);
                out.push(Output::Event(Event::Exchange(Box::new(event))));
            }
        }
        for ex in parked {
            self.retire(ex);
        }
    }

    fn end_session(
        &mut self,
        key: &SessionKey,
        ts: Timestamp,
        reason: EndReason,
        out: &mut Vec<Output>,
    ) {
        if let Some(f) = self.fleet.as_mut() {
            // Seen again, it is a first sighting again: the store may have it by then.
            f.absent.remove(key);
        }
        let scope = session::scope_of(key);
        // An evicted session keeps its lineage record: its client may well come back.
        if scope == Scope::Session
            && matches!(
                reason,
                EndReason::Expired | EndReason::Deleted | EndReason::Evicted
            )
        {
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
        self.report_parked(key, ts, out);
        self.release_inputs(key, None, out);
        // Fleet mode: its last change and the alerts it raised are shared before it goes (a
        // session deleted in the call that raised its alert has it claimed like any other).
        if self.fleet.is_some() && matches!(scope, Scope::Session | Scope::Endpoint) {
            self.share_session(key, out, 0);
        }
        let Some(s) = self.sessions.remove(key) else {
            return;
        };
        if self.server_scope.is_some() {
            // Bounded by the table: a version is kept only for an entry held.
            self.server_versions.remove(key);
        }
        // Server requests the client never answered in the session's life.
        for asked in &s.server_requests {
            out.push(Output::Event(Event::Exchange(Box::new(Exchange {
                v: Default::default(),
                ts: asked.ts,
                session_id: session::public_session_id(key),
                server: key.0,
                client: s.client,
                method: asked.method.to_string(),
                request_id: asked.id.to_value(),
                tool: None,
                protocol_version: s.protocol_version.as_deref().map(str::to_string),
                http_status: 0,
                media_type: "none",
                sse_events: 0,
                duration_ms: ts.millis_since(asked.ts),
                answered: false,
                error_code: None,
                empty_content: None,
                cancelled: false,
                framing: FramingMode::Strict,
                ambiguous: false,
                era: s.era,
                lineage_id: s.lineage_id.as_deref().map(str::to_string),
                direction: Direction::ServerToClient,
                input_required: None,
            }))));
        }
        if s.era == Era::HttpSse {
            self.sse_endpoints
                .retain(|(server, _), sid| !(*server == key.0 && **sid == *key.1));
        }
        let lineage_id = s.lineage_id.as_deref().map(str::to_string);
        match scope {
            Scope::Session => out.push(Output::Event(Event::SessionEnd(SessionEnd {
                v: Default::default(),
                ts,
                session_id: Some(key.1.clone()),
                server: key.0,
                reason,
                handshakes: s.handshakes,
                requests: s.requests,
                alerts: s.alerts,
                lineage_id: None,
            }))),
            // A lineage's state is dropped: its next declarations compare against new ones.
            Scope::Lineage if s.handshakes > 0 || s.alerts > 0 || s.ext.is_some() => {
                out.push(Output::Event(Event::SessionEnd(SessionEnd {
                    v: Default::default(),
                    ts,
                    session_id: None,
                    server: key.0,
                    reason,
                    handshakes: s.handshakes,
                    requests: s.requests,
                    alerts: s.alerts,
                    lineage_id: lineage_id.or_else(|| key.1.get(2..).map(str::to_string)),
                })))
            }
            _ => {}
        }
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
        // Cut off by the end of the capture or a timeout (`Unfinished`), or reset: not ended,
        // so nothing is concluded (no alert), but its unanswered requests are reported.
        let status = ex.response.as_ref().map_or(0, |r| r.status);
        // A resumed stream that ended (a server polling its client): the client reconnects
        // within the stream's `retry`.
        if end != BodyEnd::Unfinished
            && !self.resumption_deadlines.is_empty()
            && resumes_a_stream(&ex)
            && let Some(sid) = &ex.session_id
        {
            self.resumed_stream_active(&(ctx.server, sid.clone()), ts, ex.stream.retry_ms);
        }
        // HTTP+SSE: the GET stream carried every answer of its session; the POSTs still
        // waiting for theirs will not get them (at the end of the capture, `finish` reports
        // them).
        if ex.era == Era::HttpSse
            && end != BodyEnd::Unfinished
            && ex.response.is_some()
            && ex.head.method() == "GET"
            && let Some(sid) = &ex.session_id
        {
            let key = (ctx.server, sid.clone());
            self.report_parked(&key, ts, out);
            self.recharge(&key, ts, out);
        }
        // HTTP+SSE: a POST accepted with 202 is answered on the GET stream.
        if ex.era == Era::HttpSse
            && is_2xx(status)
            && ex.head.method() == "POST"
            && ex.requests.iter().any(|r| !r.answered)
            && let Some(sid) = &ex.session_id
            && let Some(s) = self.sessions.get_mut_at((ctx.server, sid))
        {
            if s.parked.len() < session::MAX_PARKED {
                let key = (ctx.server, sid.clone());
                // Charged to the session as it is now, once: answers only shrink it, and adding
                // up its requests at every recharge of the session made each of its requests
                // cost time in proportion to the batches parked.
                let mut ex = ex;
                ex.charged = ex.cost();
                s.parked.push(ex);
                self.recharge(&key, ts, out);
                return;
            }
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ParkedPosts,
            }));
        }
        let mt = ex.response.as_ref().and_then(|r| r.media_type.clone());
        let (framing, _) = framing_of(&ex);
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
            let pv = self.protocol_version_of(&ex, r.facts.as_deref());
            let mut event = exchange_of(
                &ex,
                r.method.clone(),
                r.tool.clone(),
                request_id.clone(),
                pv.clone(),
            );
            event.sse_events = ex.stream.items;
            event.duration_ms = ts.millis_since(ex.ts);
            // Cancelled by name, or by the client closing its connection while it was answered.
            let cancelled = r.cancelled || ex.client_gone;
            event.cancelled = cancelled;
            // Before 2026-07-28 a client's disconnection is no cancellation: after an event
            // with an id it may resume the stream with `Last-Event-ID` (2025-11-25), and the
            // answer comes on the resumed one. Held for it as a server-closed stream is; still
            // cancelled (no alert) if no answer comes.
            let client_may_resume = ex.client_gone && !r.cancelled && ex.era == Era::Legacy;
            let exchange = Box::new(event);
            let mut alerts = Vec::new();
            if ended_by.is_some() {
                let concluded = Concluded {
                    ts,
                    server: ctx.server,
                    client: ex.client,
                    era: ex.era,
                    lineage_id: ex.lineage_id.as_deref(),
                    route: ex.route,
                    session_id: ex.session_id.as_deref(),
                    host: ex.head.host(),
                    path: ex.head.path(),
                    method: &r.method,
                    tool: r.tool.as_deref(),
                    request_id: &request_id,
                    status,
                    media_type: mt.as_deref(),
                    error_code: None,
                    facts: r.facts.as_deref(),
                    findings: &r.findings,
                    result: None,
                    framing,
                    protocol_version: pv.as_deref(),
                    answered: false,
                };
                self.conclude(&concluded, out, &mut alerts);
            }
            // A cancelled request need not be answered (the server SHOULD NOT).
            let alert = (!cancelled)
                .then(|| {
                    self.detector.unanswered(&UnansweredReview {
                        method: &r.method,
                        tool: r.tool.as_deref(),
                        request_id: &request_id,
                        http_status: status,
                        media_type: mt.as_deref(),
                        stream: ex.stream,
                        ended_by,
                    })
                })
                .flatten();
            let alert_ctx = AlertCtx {
                session_id: ex.session_id.as_deref(),
                lineage_id: ex.lineage_id.as_deref(),
                era: ex.era,
                protocol_version: pv.as_deref(),
                server: ex.server,
                client: ex.client,
                framing,
            };
            let key = ex.session_id.as_ref().map(|sid| (ctx.server, sid.clone()));
            let resume_wait = self.resumption_wait(ex.stream.retry_ms);
            let mut session = key.as_ref().and_then(|k| self.sessions.get_mut(k));
            // The server may close a stream after an event with an id and answer on the
            // resumed one (2025-11-25): wait for it before concluding anything. A chunked
            // stream's connection closed before its final chunk (`Aborted`) is closed so
            // too; it concludes nothing (no alert) but its answer may still come.
            let resumable = (ended_by.is_some() || end == BodyEnd::Aborted || client_may_resume)
                && ex.stream.event_id_seen
                && (!cancelled || client_may_resume);
            // A client's own disconnections take at most half the places, and a wait the
            // server's close calls for takes the place of one of them (which carries no alert:
            // reported cancelled, as it was before such waits), so that a client closing its
            // streams cannot crowd out the waits that decide alerts.
            if resumable
                && !client_may_resume
                && let Some(s) = session.as_deref_mut()
                && s.resuming.len() >= MAX_RESUMING_PER_SESSION
                && let Some(at) = s.resuming.iter().position(|w| w.client_left)
            {
                let left = s.resuming.swap_remove(at);
                s.in_flight.remove(&left.id);
                out.push(Output::Event(Event::Exchange(left.exchange)));
            }
            let places = if client_may_resume {
                MAX_RESUMING_PER_SESSION / 2
            } else {
                MAX_RESUMING_PER_SESSION
            };
            if resumable
                && session
                    .as_deref()
                    .is_some_and(|s| s.resuming.len() >= places)
            {
                out.push(Output::Telemetry(Telemetry::LimitHit {
                    limit: Limit::ResumptionWaits,
                }));
            }
            if let (Some(s), Some(key), true) = (session, &key, resumable)
                && s.resuming.len() < places
            {
                let deadline = Timestamp(ts.0.saturating_add(resume_wait));
                s.resuming.push(Resuming {
                    id: r.id.clone(),
                    deadline,
                    exchange,
                    alert,
                    client_left: client_may_resume,
                });
                self.resumption_deadlines
                    .push(Reverse((deadline, key.clone(), r.id.clone())));
                self.purge_stale_deadlines();
                self.recharge(key, ts, out);
                out.append(&mut alerts);
                continue;
            }
            out.push(Output::Event(Event::Exchange(exchange)));
            out.append(&mut alerts);
            let session = key.as_ref().and_then(|k| self.sessions.get_mut(k));
            if let Some(s) = session {
                let forgot = s.in_flight.remove(&r.id).is_some();
                s.alerts = s.alerts.saturating_add(u32::from(alert.is_some()));
                if forgot && let Some(k) = &key {
                    self.recharge_shrunk(k);
                }
            }
            alert_ctx.push(out, ts, alert);
        }
        self.end_if_expired(&ex, ts, out);
        self.retire(ex);
    }
}

/// A GET of the streamable HTTP transport resuming an earlier stream (`Last-Event-ID`).
fn resumes_a_stream(ex: &ExchangeState) -> bool {
    ex.era != Era::HttpSse
        && ex.head.method() == "GET"
        && headers::request_last_event_id(&ex.head).is_some()
}

/// A session's lasting state as a record (snapshot file, fleet store).
fn session_entry<D: Clone>(key: &SessionKey, s: &Session<D>) -> snapshot::SessionEntry<D> {
    snapshot::SessionEntry::of(key, s)
}

/// An answer detection had no room to record ([`Limit::ModeRecords`]).
fn count_untracked(untracked: bool, out: &mut Vec<Output>) {
    if untracked {
        out.push(Output::Telemetry(Telemetry::LimitHit {
            limit: Limit::ModeRecords,
        }));
    }
}

fn text_digest(text: &str) -> u64 {
    crate::lasting_digest::lasting_digest_of(0x666c_6565_7473_7461, text.as_bytes())
}

/// The flow a (parked) exchange came on.
fn ctx_flow_of(ex: &ExchangeState) -> u64 {
    ex.flow
}

/// `clientInfo` name and version of `initialize` params (JSON text).
fn init_client_name(params: &str) -> Option<(String, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "clientInfo", default)]
        client_info: Option<ClientInfo>,
    }
    let p: Params = serde_json::from_str(params).ok()?;
    let info = p.client_info?;
    Some((info.name?, info.version))
}

/// An initialize's `clientInfo`, as [`init_client_name`] reads it.
#[derive(serde::Deserialize)]
struct ClientInfo {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
}

/// [`init_client_name`] of params whose members were read while validating: only
/// `clientInfo` is given to serde_json, not the whole (validated) params.
fn init_client_name_of(params: &jsonrpc::Params<'_>) -> Option<(String, Option<String>)> {
    match params.fields(["clientInfo"]) {
        None => init_client_name(params.get()),
        Some(Err(_)) => None,
        Some(Ok([info])) => {
            let info: ClientInfo = serde_json::from_str(info?).ok()?;
            Some((info.name?, info.version))
        }
    }
}

/// The methods an `InputRequiredResult`'s `inputRequests` (a map of key to request) ask for.
fn input_request_methods(raw: &str) -> Vec<String> {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(raw) else {
        return Vec::new();
    };
    let mut methods: Vec<String> = map
        .values()
        .filter_map(|r| r.get("method").and_then(Value::as_str).map(str::to_string))
        .collect();
    methods.sort();
    methods.truncate(16);
    methods
}

/// The path and query of an `endpoint` event's URL (absolute URLs lose scheme and authority).
fn endpoint_path(url: &str) -> &str {
    for scheme in ["http://", "https://"] {
        if let Some(rest) = url.strip_prefix(scheme) {
            return rest.find('/').map_or("/", |at| &rest[at..]);
        }
    }
    url
}

/// The session an HTTP+SSE endpoint names: its `sessionId` (TypeScript) or `session_id`
/// (Python) query parameter, else the whole path.
fn endpoint_session_id(path: &str) -> &str {
    let query = path.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == "sessionId" || k == "session_id").then_some(v)
        })
        .filter(|v| !v.is_empty())
        .unwrap_or(path)
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

/// Resumption deadlines below which no purge of ended waits' entries runs.
const MIN_DEADLINES_PURGE_AT: usize = 1024;

/// Requests of one session waiting for a resumed stream at once; beyond, an empty result
/// concludes at once.
const MAX_RESUMING_PER_SESSION: usize = 64;

/// Deepest nesting of `initialize` params accepted (serde_json's own limit when it parses them).
const MAX_PARAMS_DEPTH: usize = 128;

/// `initialize` params kept as text, checked now (one pass, no tree built) so that hostile
/// ones, nested beyond what the handshake will parse, are counted when they arrive.
fn checked_params(params: &jsonrpc::Params<'_>, out: &mut Vec<Output>) -> Option<Box<str>> {
    let text = params.get();
    let depth = params
        .deepest()
        .unwrap_or_else(|| jsonrpc::nesting_depth(text.as_bytes()));
    if depth <= MAX_PARAMS_DEPTH {
        return Some(Box::from(text));
    }
    out.push(Output::Telemetry(Telemetry::JsonRpcError {
        reason: crate::model::JsonRpcError::InvalidJson,
    }));
    None
}

/// A request's params as the validating pass found them (see [`jsonrpc::Container`]), by
/// offsets into the text: the same text validates alike, so a text seen before is not walked
/// again.
#[derive(Debug)]
struct ParamsShape {
    /// Each top-level member's key and value as (start, end) offsets; `None` as in
    /// [`jsonrpc::Container::members`].
    members: Option<Vec<[(u32, u32); 2]>>,
    deepest: usize,
}

/// [`jsonrpc::leading_container`] of `rest` (a request's params and what follows them),
/// answered from `seen` when the params are the message's last member and their text was
/// validated before (the text must match byte for byte, so what is answered is what the pass
/// would find).
fn cached_params<'a>(
    seen: &mut TextCache<1, ParamsShape>,
    sightings: &mut text_cache::Sightings,
    rest: &'a str,
) -> Option<jsonrpc::Container<'a>> {
    // The params of `{..., "params": {...}}`: up to the envelope's closing brace.
    let last = rest
        .trim_end_matches([' ', '\t', '\n', '\r'])
        .strip_suffix('}')
        .map(|t| t.trim_end_matches([' ', '\t', '\n', '\r']));
    let last = last.map(|text| (text, TextCache::<1, ParamsShape>::key(&[text.as_bytes()])));
    if let Some((text, key)) = last
        && let Some(shape) = seen.get_keyed(key, &[text.as_bytes()])
    {
        let at = |(start, end): (u32, u32)| text.get(start as usize..end as usize);
        let members = match &shape.members {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|[key, value]| Some((at(*key)?, at(*value)?)))
                    .collect::<Option<Vec<_>>>()?,
            ),
        };
        return Some(jsonrpc::Container {
            len: text.len(),
            members,
            deepest: shape.deepest,
        });
    }
    let found = jsonrpc::leading_container(rest)?;
    let text = rest.get(..found.len)?;
    let texts = [text.as_bytes()];
    let key = match last {
        Some((guess, key)) if guess.len() == text.len() => key,
        _ => TextCache::<1, ParamsShape>::key(&texts),
    };
    if seen.admits(&texts) && sightings.again(key) {
        let base = text.as_ptr() as usize;
        let offsets = |part: &str| {
            let start = (part.as_ptr() as usize).checked_sub(base)?;
            Some((
                u32::try_from(start).ok()?,
                u32::try_from(start + part.len()).ok()?,
            ))
        };
        let members = match &found.members {
            None => Some(None),
            Some(list) => list
                .iter()
                .map(|(key, value)| Some([offsets(key)?, offsets(value)?]))
                .collect::<Option<Vec<_>>>()
                .map(Some),
        };
        if let Some(members) = members {
            let held = members.as_ref().map_or(0, |m| m.len() * 16);
            let shape = ParamsShape {
                members,
                deepest: found.deepest,
            };
            seen.insert(&texts, shape, held);
        }
    }
    Some(found)
}

/// [`modern::read_meta`] of `meta`, read once per distinct text.
fn cached_declaration(
    cache: &mut TextCache<1, Option<Arc<modern::Declaration>>>,
    meta: &str,
) -> Option<Option<Arc<modern::Declaration>>> {
    let texts = [meta.as_bytes()];
    if let Some(known) = cache.get(&texts) {
        return Some(known.clone());
    }
    let declaration = modern::read_meta(meta)?.map(Arc::new);
    // The shared allocation: the declaration, its strings and the count before it.
    let held = declaration.as_ref().map_or(0, |d| {
        std::mem::size_of::<Arc<()>>() * 2
            + std::mem::size_of::<modern::Declaration>()
            + d.heap_bytes()
    });
    cache.insert(&texts, declaration.clone(), held);
    Some(declaration)
}

/// What a `server/discover` result says, as the session layer compares it: a function of its
/// `capabilities`, `supportedVersions` and `_meta` texts, so read once per distinct set (a
/// server answers every client's discover alike).
#[derive(Debug)]
struct DiscoverReading {
    capabilities: Value,
    /// `supportedVersions` as sent, at most [`MAX_SUPPORTED_VERSIONS`].
    versions: Vec<String>,
    /// The latest versions, sorted, without repeats: what is compared with the first result.
    latest: Vec<String>,
    /// More versions than are compared were sent (counted on every result).
    versions_cut: bool,
    /// `_meta`'s `io.modelcontextprotocol/serverInfo`.
    server_info: Value,
    /// Of the declared members: equal readings, equal digests.
    digest: u64,
    record: CapsRecord,
}

impl DiscoverReading {
    fn read(result: &ResultFields<'_>) -> DiscoverReading {
        let capabilities = jsonrpc::to_value(result.capabilities).unwrap_or(Value::Null);
        let mut versions: Vec<String> = result
            .supported_versions
            .and_then(|v| serde_json::from_str(v.get()).ok())
            .unwrap_or_default();
        // Compared with the first result version by version: the latest versions only, in a
        // fixed order (a reordered list is the same list). Events show them as sent, as many.
        let mut latest = versions.clone();
        latest.sort_unstable();
        latest.dedup();
        let versions_cut = latest.len() > MAX_SUPPORTED_VERSIONS;
        if versions_cut {
            latest.drain(..latest.len() - MAX_SUPPORTED_VERSIONS);
            versions.truncate(MAX_SUPPORTED_VERSIONS);
        }
        let server_info = result
            .meta
            .and_then(|m| serde_json::from_str::<Value>(m.get()).ok())
            .and_then(|m| m.get("io.modelcontextprotocol/serverInfo").cloned())
            .unwrap_or(Value::Null);
        let digest = crate::lasting_digest::LastingDigest::new(0x6469_7363_6f76_6572)
            .optional(result.capabilities.map(|c| c.get().as_bytes()))
            .optional(result.supported_versions.map(|c| c.get().as_bytes()))
            .part(session::compact_json(&server_info).as_bytes())
            .finish();
        let record = CapsRecord::new(&Value::Null, &capabilities);
        DiscoverReading {
            capabilities,
            versions,
            latest,
            versions_cut,
            server_info,
            digest,
            record,
        }
    }

    /// The heap it holds, at most: its trees by their texts' length (a tree of nested objects
    /// takes over 100 bytes per byte of its text: a map node per few bytes), its lists, its
    /// record.
    fn heap_bytes(&self, texts: &[&[u8]; 3]) -> usize {
        const TREE_BYTES_PER_TEXT_BYTE: usize = 128;
        let strings = |v: &[String]| v.iter().map(|s| s.len() + 24).sum::<usize>();
        texts.iter().map(|t| t.len()).sum::<usize>() * TREE_BYTES_PER_TEXT_BYTE
            + strings(&self.versions)
            + strings(&self.latest)
            + self.record.heap_bytes()
    }
}

/// A request of a session, as the session notes it.
struct SessionRequest<'r> {
    ctx: FlowCtx,
    exchange: u64,
    ts: Timestamp,
    era: Era,
    max_in_flight: usize,
    head: &'r RequestHead,
    requests: &'r [PendingRequest],
}

impl SessionRequest<'_> {
    /// Notes the request in session `s` (id `sid`): its flow, its requests in flight, the
    /// client's answers to the server's requests (into `server_answers`). Fills in the lineage
    /// and route the request did not name from the session's. Returns whether its requests in
    /// flight grew (the session is to be charged again).
    // `server_answers` is the exchange's list, boxed as it keeps them.
    #[allow(clippy::too_many_arguments, clippy::vec_box)]
    fn note<D>(
        &self,
        s: &mut session::Session<D>,
        sid: &str,
        fleet_key: Option<String>,
        client_answers: Vec<(Id, Option<i64>)>,
        server_answers: &mut Vec<Box<Exchange>>,
        lineage_id: &mut Option<Box<str>>,
        route: &mut Option<u16>,
    ) -> bool {
        let (ctx, head, ts) = (self.ctx, self.head, self.ts);
        if let Some(k) = fleet_key {
            s.fleet_key = Some(k.into());
        }
        s.note_flow(ctx.flow);
        if lineage_id.is_none() {
            *lineage_id = s.lineage_id.clone();
        }
        if route.is_none() {
            *route = s.route;
        }
        s.requests = s.requests.saturating_add(self.requests.len() as u64);
        if self.era == Era::HttpSse {
            s.era = Era::HttpSse;
        }
        let in_flight_before = s.in_flight.heap_bytes();
        for r in self.requests {
            if s.in_flight.len() < self.max_in_flight {
                s.in_flight.insert(&r.id, (ctx.flow, self.exchange));
            }
        }
        for (id, code) in client_answers {
            let Some(at) = s.server_requests.iter().position(|r| r.id == id) else {
                continue;
            };
            // In order of arrival, so that the oldest is first when the table is full.
            let asked = s.server_requests.remove(at);
            server_answers.push(Box::new(Exchange {
                v: Default::default(),
                ts: asked.ts,
                session_id: Some(sid.to_string()),
                server: ctx.server,
                client: ctx.client,
                method: asked.method.to_string(),
                request_id: id.to_value(),
                tool: None,
                protocol_version: headers::request_protocol_version(head)
                    .map(str::to_string)
                    .or_else(|| s.protocol_version.as_deref().map(str::to_string)),
                http_status: 0,
                media_type: "none",
                sse_events: 0,
                duration_ms: ts.millis_since(asked.ts),
                answered: true,
                error_code: code,
                empty_content: None,
                cancelled: false,
                framing: FramingMode::of(head.lenient),
                ambiguous: head.ambiguous,
                era: s.era,
                lineage_id: s.lineage_id.as_deref().map(str::to_string),
                direction: Direction::ServerToClient,
                input_required: None,
            }));
        }
        s.in_flight.heap_bytes() != in_flight_before
    }
}

/// How an exchange was framed (strict or lenient) and whether a header made it ambiguous.
fn framing_of(ex: &ExchangeState) -> (FramingMode, bool) {
    let response = ex.response.as_ref();
    let lenient = ex.head.lenient || response.is_some_and(|r| r.lenient);
    let ambiguous = ex.head.ambiguous || response.is_some_and(|r| r.ambiguous);
    (FramingMode::of(lenient), ambiguous)
}

#[cfg(test)]
mod tests {
    use crate::jsonrpc::nesting_depth;

    /// What a staged or held SSE item costs counts the texts the wire sized: a block with a
    /// 1 MB id and no data once cost 256 bytes, and a split replay's queue took dozens.
    #[test]
    fn an_sse_items_texts_count_in_what_it_holds() {
        use crate::http::HttpEvent;
        use crate::http::sse::{SseEvent, SseItem};
        let long = || Some("i".repeat(1 << 20));
        let no_data = HttpEvent::ResponseSse {
            exchange: 0,
            item: SseItem::NoData { id: long() },
        };
        assert!(super::held_cost(&no_data) > 1 << 20);
        let event = HttpEvent::ResponseSse {
            exchange: 0,
            item: SseItem::Event(SseEvent {
                event_type: long(),
                id: long(),
                ..SseEvent::default()
            }),
        };
        assert!(super::held_cost(&event) > 2 << 20);
    }

    /// The validating pass measures the depth the handshake's limit is checked against.
    #[test]
    fn the_validating_pass_measures_the_same_depth() {
        let deep = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        for text in [
            r#"{}"#.to_string(),
            r#"{"a":[{"b":[]}]}"#.to_string(),
            r#"{"a":"[[[{{{","b":"\"[[["}"#.to_string(),
            r#"[[],[[{}]],{"x":[[[]]]}]"#.to_string(),
            deep(127),
            deep(128),
            deep(300),
        ] {
            let ways = crate::jsonrpc::Params::both_ways(&text);
            let measured = ways.iter().find_map(|p| p.deepest());
            assert_eq!(measured, Some(nesting_depth(text.as_bytes())), "{text}");
        }
    }

    /// Params answered from the cache are what the validating pass finds, hit or miss: params
    /// last or not, whitespace, members, arrays, invalid text and prefixes of valid text.
    #[test]
    fn cached_params_are_what_the_pass_finds() {
        let mut seen = super::TextCache::new(super::CacheLimits {
            max_bytes: 64 << 10,
            max_entries: 16,
            max_text: 4096,
        });
        let mut sightings = super::text_cache::Sightings::default();
        let rests = [
            r#"{"name":"t","arguments":{"a":[1,{"b":2}]}}"#,
            r#"{"name":"t","arguments":{"a":[1,{"b":2}]}} }"#,
            "{\"name\" : \"t\" }\r\n}\n",
            r#"{"name":"t"},"id":1}"#,
            r#"{"name":"t"}}"#,
            r#"{"name":"t"}"#,
            r#"[1,2,{"x":[]}]}"#,
            r#"{"a":"}"}}"#,
            r#"{"a":}}"#,
            r#"{"a":1}x}"#,
            r#"{}}"#,
            r#"{"name":"t","arguments":{"a":[1,{"b":2}]}"#,
        ];
        // Kept on the second sighting, answered from the cache on the third.
        for _ in 0..3 {
            for rest in rests {
                assert_eq!(
                    super::cached_params(&mut seen, &mut sightings, rest),
                    crate::jsonrpc::leading_container(rest),
                    "{rest}"
                );
            }
        }
    }

    /// A `_meta` reading from the cache is the reading itself, hit or miss: declarations,
    /// nothing declared, and texts serde_json refuses (never kept).
    #[test]
    fn cached_declarations_are_the_readings() {
        let mut cache = super::TextCache::new(super::CacheLimits {
            max_bytes: 64 << 10,
            max_entries: 16,
            max_text: 4096,
        });
        for meta in [
            r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"a","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}"#,
            r#"{"progressToken":7}"#,
            r#"{}"#,
            r#"{"io.modelcontextprotocol/protocolVersion":"a","io.modelcontextprotocol/protocolVersion":"b"}"#,
            r#"["2026-07-28"]"#,
            r#"7"#,
        ] {
            let expected = super::modern::read_meta(meta);
            for _ in 0..2 {
                let got = super::cached_declaration(&mut cache, meta);
                assert_eq!(got.map(|d| d.map(|d| (*d).clone())), expected, "{meta}");
            }
        }
    }

    /// An initialize's client name read from members found while validating is what
    /// serde_json reads from the whole params: nulls, repeats, escaped keys, wrong types,
    /// params and clientInfo as arrays.
    #[test]
    fn the_client_name_is_read_as_serde_reads_it() {
        for text in [
            r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#,
            r#"{"clientInfo":{"name":"c"}}"#,
            r#"{"clientInfo":{"version":"1"}}"#,
            r#"{"clientInfo":null}"#,
            r#"{"clientInfo":{"name":null,"version":"1"}}"#,
            r#"{"clientInfo":{"name":"a"},"clientInfo":{"name":"b"}}"#,
            r#"{"clientInfo":{"name":"a","name":"b"}}"#,
            r#"{"client\u0049nfo":{"n\u0061me":"\u00e9","version":"\"1\""}}"#,
            r#"{"clientInfo":{"name":5}}"#,
            r#"{"clientInfo":["c","1"]}"#,
            r#"{"clientInfo":"c"}"#,
            r#"[{"name":"c","version":"1"}]"#,
            r#"{ "x" : [ { "clientInfo" : 1 } ] , "clientInfo" : { "name" : "s" , "v" : 2 } }"#,
            r#"{}"#,
        ] {
            for p in crate::jsonrpc::Params::both_ways(text) {
                assert_eq!(
                    super::init_client_name_of(&p),
                    super::init_client_name(text),
                    "{text}"
                );
            }
        }
    }
}
