//! One MCP session's state: what the session layer remembers between messages.

use super::caps::{self, CapPaths};
use super::handshake::Declared;
use super::modern::ParamHeader;
use super::text_cache::{CacheLimits, TextCache};
use super::transactions::ExchangeState;
use crate::jsonrpc::Id;
use crate::model::{Era, Exchange, FailedAnswer, Timestamp};
use crate::table_hash::HashMap;
use serde_json::Value;
use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

/// Sessions are keyed by (server endpoint, `Mcp-Session-Id`). State without a session id
/// lives in the same table under keys no session id can take (they start with NUL, which is
/// not visible ASCII): a lineage's, a server's, an endpoint method's (see [`Scope`]).
pub type SessionKey = (SocketAddr, String);

/// A session key looked up without owning its id: the table is asked several times per
/// exchange, and copying the id into a key for each question cost an allocation each time.
pub type SessionKeyRef<'a> = (SocketAddr, &'a str);

/// What a [`SessionKey`] and a [`SessionKeyRef`] have alike: the table looks either up.
pub trait KeyView {
    fn server(&self) -> &SocketAddr;
    fn id(&self) -> &str;
}

impl KeyView for SessionKey {
    fn server(&self) -> &SocketAddr {
        &self.0
    }
    fn id(&self) -> &str {
        &self.1
    }
}

impl KeyView for SessionKeyRef<'_> {
    fn server(&self) -> &SocketAddr {
        &self.0
    }
    fn id(&self) -> &str {
        self.1
    }
}

impl<'a> Borrow<dyn KeyView + 'a> for SessionKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

/// As the tuple hashes: its fields in order (`Borrow` requires the same hash).
impl Hash for dyn KeyView + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.server().hash(state);
        self.id().hash(state);
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.server() == other.server() && self.id() == other.id()
    }
}

impl Eq for dyn KeyView + '_ {}

/// What an entry of the session table tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A session with an `Mcp-Session-Id` (or an HTTP+SSE `sessionId`).
    Session,
    /// A client lineage without a session id (modern, legacy stateless).
    Lineage,
    /// A server's own state (`server/discover` results, `x-mcp-header` tools).
    Server,
    /// How a stateless server answers one method (and tool): its response mode.
    Endpoint,
}

const LINEAGE_PREFIX: &str = "\0L";
const SERVER_KEY: &str = "\0S";
const ENDPOINT_PREFIX: &str = "\0E";

pub fn lineage_key(server: SocketAddr, lineage_id: &str) -> SessionKey {
    (server, super::joined(&[LINEAGE_PREFIX, lineage_id]))
}

/// The lineage id of a lineage entry's key.
pub fn lineage_of_key(key: &SessionKey) -> Option<&str> {
    key.1.strip_prefix(LINEAGE_PREFIX)
}

pub fn server_key(server: SocketAddr) -> SessionKey {
    (server, SERVER_KEY.to_string())
}

/// The mode of a stateless endpoint is per method and, for `tools/call`, per tool.
pub fn endpoint_key(server: SocketAddr, method: &str, tool: Option<&str>) -> SessionKey {
    let mut k = super::joined(&[ENDPOINT_PREFIX, method]);
    if let Some(t) = tool {
        k.push('\0');
        k.push_str(&t[..floor_boundary(t, 128)]);
    }
    (server, k)
}

pub(crate) fn floor_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

pub fn scope_of(key: &SessionKey) -> Scope {
    scope_of_key(&key.1)
}

/// [`scope_of`] from the key text alone (a snapshot's record holds it apart from its server).
pub fn scope_of_key(k: &str) -> Scope {
    if !k.starts_with('\0') {
        Scope::Session
    } else if k.starts_with(LINEAGE_PREFIX) {
        Scope::Lineage
    } else if k == SERVER_KEY {
        Scope::Server
    } else {
        Scope::Endpoint
    }
}

/// The session id an event shows for a table key: `None` for state without a session id.
pub fn public_session_id(key: &SessionKey) -> Option<String> {
    (scope_of(key) == Scope::Session).then(|| key.1.clone())
}

/// An exchange: (flow id, request number on that connection).
pub type ExchangeKey = (u64, u64);

/// One handshake's capability sets, kept as the baseline of comparisons. Every tracked session
/// holds one, so it is kept compact: the server's capability object as JSON text (a `Value`
/// tree costs several KB), parsed again only when an alert needs it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CapsRecord {
    server_caps: Arc<str>,
    /// A bound cut a path set short (see [`caps::bounded_paths`]).
    pub truncated: bool,
    /// `tools.streaming: true` in the server's capabilities.
    pub streaming: bool,
    pub client_paths: CapPaths,
    pub server_paths: CapPaths,
}

impl CapsRecord {
    pub fn new(client_caps: &Value, server_caps: &Value) -> CapsRecord {
        let (client_paths, client_cut) = caps::bounded_paths(client_caps);
        let (server_paths, server_cut) = caps::bounded_paths(server_caps);
        CapsRecord {
            server_caps: compact_json(server_caps).into(),
            truncated: client_cut || server_cut,
            streaming: caps::streaming_enabled(server_caps),
            client_paths,
            server_paths,
        }
    }

    /// The server's capability object, parsed again from its compact text.
    pub fn server_caps(&self) -> Value {
        serde_json::from_str(&self.server_caps).unwrap_or(Value::Null)
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.server_caps.len() + paths_bytes(&self.client_paths) + paths_bytes(&self.server_paths)
    }

    /// The record's three heap parts, by address and the bytes their blocks take (the
    /// `Arc`'s counts and the allocator's rounding included): the records of one fleet's
    /// `initialize` texts share them (see [`HandshakeCache`]), so a store of many records
    /// can charge each part once.
    pub(super) fn shared_parts(&self) -> [(usize, usize); 3] {
        const ARC_COUNTS: usize = 2 * std::mem::size_of::<usize>();
        let paths = |p: &CapPaths| {
            heap_block_bytes(ARC_COUNTS + std::mem::size_of_val(&**p))
                + p.iter().map(|s| heap_block_bytes(s.len())).sum::<usize>()
        };
        [
            (
                Arc::as_ptr(&self.server_caps).cast::<u8>().addr(),
                heap_block_bytes(ARC_COUNTS + self.server_caps.len()),
            ),
            (
                Arc::as_ptr(&self.client_paths).cast::<u8>().addr(),
                paths(&self.client_paths),
            ),
            (
                Arc::as_ptr(&self.server_paths).cast::<u8>().addr(),
                paths(&self.server_paths),
            ),
        ]
    }
}

/// At most what a heap block asked for `len` bytes takes: the allocator's size classes are
/// at most a quarter apart, in steps of 16 bytes at least.
pub(crate) fn heap_block_bytes(len: usize) -> usize {
    len.saturating_add(len / 4).next_multiple_of(16) + 16
}

/// What `initialize`s declared (parsed values and capability records), by the raw texts of the
/// request's params and of the result's members: a fleet's clients run a few SDK versions
/// against a few servers, so thousands of handshakes send the same texts, and their reading is
/// done once per distinct set and shared. Bounded in bytes (charged with the sessions, value
/// trees by an estimate); emptied whole when full, and the next handshakes refill it with what
/// is common.
#[derive(Debug)]
pub struct HandshakeCache {
    cache: TextCache<4, Declared>,
}

/// The raw texts a [`Declared`] is read from: the params, and the result's `protocolVersion`,
/// `capabilities` and `serverInfo` ("" for absent).
pub type HandshakeTexts<'a> = [&'a str; 4];

/// Texts longer than this are not cached: declarations are small, and a hostile one must not
/// take the cache.
pub(crate) const MAX_CACHED_TEXT: usize = 4096;

/// Most readings kept, whatever the byte bound (a session layer built without a budget).
const MAX_CACHED_HANDSHAKES: usize = 1024;

/// Heap a parsed value tree takes per byte of its text, at most (maps' nodes, keys): the
/// estimate charged for a cached tree.
pub(crate) const VALUE_BYTES_PER_TEXT_BYTE: usize = 32;

impl HandshakeCache {
    pub fn new(max_bytes: usize) -> Self {
        HandshakeCache {
            cache: TextCache::new(CacheLimits {
                max_bytes,
                max_entries: MAX_CACHED_HANDSHAKES,
                max_text: MAX_CACHED_TEXT,
            }),
        }
    }

    fn bytes_of<'a>(texts: &HandshakeTexts<'a>) -> [&'a [u8]; 4] {
        texts.map(str::as_bytes)
    }

    /// The reading of a handshake with these texts, if one was done before.
    pub fn get(&self, texts: &HandshakeTexts<'_>) -> Option<Declared> {
        self.cache.get(&Self::bytes_of(texts)).cloned()
    }

    /// Keeps `declared` for these texts, within the byte bound.
    pub fn insert(&mut self, texts: &HandshakeTexts<'_>, declared: &Declared) {
        if !self.cache.admits(&Self::bytes_of(texts)) {
            return;
        }
        let text_bytes: usize = texts.iter().map(|t| t.len()).sum();
        let value_bytes = text_bytes * VALUE_BYTES_PER_TEXT_BYTE
            + declared.text_bytes()
            + declared.record.heap_bytes();
        self.cache
            .insert(&Self::bytes_of(texts), declared.clone(), value_bytes);
    }

    /// Bytes held, as charged against the session budget.
    pub fn bytes(&self) -> usize {
        self.cache.bytes()
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

/// A value kept as JSON text: `Value` trees are large, and JSON objects serialize with sorted
/// keys, so equal values give equal text.
pub fn compact_json(v: &Value) -> Box<str> {
    serde_json::to_string(v)
        .unwrap_or_default()
        .into_boxed_str()
}

/// One session. `D` is the detection layer's own per-session state (see
/// [`super::Detector::SessionState`]), stored here so that it lives and dies with the session.
#[derive(Debug)]
pub struct Session<D> {
    /// Bytes this session is charged against the session budget (see `budget`).
    pub(super) charged: usize,
    pub client: SocketAddr,
    /// The client lineage (see `identity::lineage_id`), once a handshake or declaration named it.
    pub lineage_id: Option<Box<str>>,
    /// The route bucket of its client, or of its id (`identity::route_bucket`): where session
    /// shards keep it, so that a snapshot loads it into the shard its requests go to.
    pub route: Option<u16>,
    /// The route bucket of the client its lineage is of (set with `lineage_id`): where its
    /// ended record goes, next to the lineage's other state.
    pub lineage_route: Option<u16>,
    pub era: Era,
    /// The protocol version the latest accepted handshake negotiated.
    pub protocol_version: Option<Box<str>>,
    pub last_seen: Timestamp,
    pub handshakes: u32,
    /// Accepted handshakes whose capabilities differ from the baseline's: a replayed
    /// `initialize` that changed the session (what response modes are judged across).
    pub capability_changes: u32,
    /// When the latest of them was answered (answers to requests sent before belong to the
    /// time before it). Not kept in snapshots: requests in flight are not either.
    pub capability_changed_at: Timestamp,
    /// The first accepted handshake: the baseline, never replaced.
    pub baseline: Option<CapsRecord>,
    /// `tools.streaming: true` in the latest accepted handshake.
    pub streaming_negotiated: bool,
    pub requests: u64,
    pub alerts: u32,
    /// Requests awaiting a response, for answers that arrive on a GET stream.
    pub in_flight: InFlight,
    /// Requests whose stream ended without their answer but may be resumed.
    pub resuming: Vec<Resuming>,
    /// Its resumed streams (`Last-Event-ID`) were active lately: the waits of `resuming` go
    /// on at least until then (a long-running tool's answer, polled for or held back).
    pub resumed_until: Timestamp,
    pub detection: D,
    /// Era state: modern declarations, failures, discover results; allocated on first use.
    pub ext: Option<Box<EraState>>,
    /// HTTP+SSE: POST exchanges answered 202 whose answers come on the GET stream, each
    /// charged as it was when parked (`ExchangeState::charged`).
    pub parked: Vec<Box<ExchangeState>>,
    /// Requests the server sent on a stream, waiting for the client's POSTed answer.
    pub server_requests: Vec<ServerRequest>,
    /// Fleet mode: the session's fleet-wide key and the digest of the state last shared.
    pub fleet_key: Option<Box<str>>,
    pub shared_digest: u64,
    /// The store's version of this session's record, as last read or written.
    pub shared_version: u64,
    /// The connections its latest requests came on (fleet mode: on another one, the
    /// session may have moved between hosts, and its record is read again).
    pub fleet_flows: [u64; FLEET_FLOWS],
    /// The store's version as this instance last read it (a later `shared_version` is a
    /// write of its own the store may not have yet).
    pub read_version: u64,
}

/// Connections remembered per session in fleet mode (a client's pool, its GET stream).
pub const FLEET_FLOWS: usize = 4;

impl<D: Clone> Session<D> {
    /// A copy of a server-scoped entry (a server's discover result and `x-mcp-header` tools, a
    /// stateless endpoint's modes) for another shard of a sharded session layer (see
    /// [`super::ServerScope`]). Such entries never hold exchanges, so none are copied.
    pub fn server_replica(&self) -> Box<Session<D>> {
        Box::new(Session {
            charged: 0,
            client: self.client,
            lineage_id: self.lineage_id.clone(),
            route: self.route,
            lineage_route: self.lineage_route,
            era: self.era,
            protocol_version: self.protocol_version.clone(),
            last_seen: self.last_seen,
            handshakes: self.handshakes,
            capability_changes: self.capability_changes,
            capability_changed_at: self.capability_changed_at,
            baseline: self.baseline.clone(),
            streaming_negotiated: self.streaming_negotiated,
            requests: self.requests,
            alerts: self.alerts,
            in_flight: InFlight::default(),
            resuming: Vec::new(),
            resumed_until: Timestamp(i64::MIN),
            detection: self.detection.clone(),
            ext: self.ext.as_ref().map(|e| Box::new(e.server_replica())),
            parked: Vec::new(),
            server_requests: Vec::new(),
            fleet_key: self.fleet_key.clone(),
            shared_digest: self.shared_digest,
            shared_version: self.shared_version,
            fleet_flows: self.fleet_flows,
            read_version: self.read_version,
        })
    }
}

impl<D> Session<D> {
    /// Remembers `flow` among the session's latest connections.
    pub fn note_flow(&mut self, flow: u64) {
        if !self.fleet_flows.contains(&flow) {
            self.fleet_flows.rotate_right(1);
            self.fleet_flows[0] = flow;
        }
    }
}

/// A session's requests awaiting a response, by id, with what their ids hold: a client can
/// have thousands in flight, with ids of any length, and the session is charged for them.
#[derive(Debug, Default)]
pub struct InFlight {
    by_id: HashMap<Id, ExchangeKey>,
    /// Heap bytes of the ids in `by_id` (the table holds copies of them) beyond the
    /// [`ID_ALLOWANCE`] each slot is charged with.
    id_bytes: usize,
}

/// An id's block charged with every slot of the table: the ids clients send (`1`, a UUID)
/// fit it, so noting and answering them leaves the charge as it was, and only the table's
/// room or a longer id changes it (and calls for a recharge).
const ID_ALLOWANCE: usize = 48;

/// The smallest table's room (4 slots), kept when it empties: a session's one request at a
/// time does not reallocate it per request.
const IN_FLIGHT_KEPT_CAPACITY: usize = 3;

impl InFlight {
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Slots the table has room for: what changes its charge besides the ids.
    pub fn room(&self) -> usize {
        self.by_id.capacity()
    }

    pub fn get(&self, id: &Id) -> Option<ExchangeKey> {
        self.by_id.get(id).copied()
    }

    /// Notes request `id` of exchange `at` (a repeated id keeps its stored copy).
    pub fn insert(&mut self, id: &Id, at: ExchangeKey) {
        match self.by_id.get_mut(id) {
            Some(slot) => *slot = at,
            None => {
                self.id_bytes += id_excess_bytes(id);
                self.by_id.insert(id.clone(), at);
            }
        }
    }

    /// Forgets request `id`. A table left under a quarter full gives back its room (a burst
    /// of requests must not keep thousands of slots for the session's life).
    pub fn remove(&mut self, id: &Id) -> Option<ExchangeKey> {
        let (stored, at) = self.by_id.remove_entry(id)?;
        self.id_bytes -= id_excess_bytes(&stored);
        let capacity = self.by_id.capacity();
        if capacity > IN_FLIGHT_KEPT_CAPACITY && self.by_id.len() * 4 < capacity {
            self.by_id.shrink_to(self.by_id.len() * 2);
        }
        Some(at)
    }

    /// What the table and its ids take on the heap: its slots (a power of two with 1/8 kept
    /// free, the std table's layout) with a control byte and an id's allowance each, and the
    /// ids' blocks beyond their allowance.
    pub fn heap_bytes(&self) -> usize {
        let capacity = self.by_id.capacity();
        let slots = if capacity == 0 {
            0
        } else {
            (capacity.saturating_mul(8) / 7).next_power_of_two()
        };
        slots * (std::mem::size_of::<(Id, ExchangeKey)>() + 1 + ID_ALLOWANCE) + self.id_bytes
    }
}

/// What an id's block takes beyond the allowance its slot is charged with.
fn id_excess_bytes(id: &Id) -> usize {
    if id.0.is_empty() {
        0
    } else {
        heap_block_bytes(id.0.len()).saturating_sub(ID_ALLOWANCE)
    }
}

/// A request a server sent on an SSE stream (legacy revisions).
#[derive(Debug, Clone)]
pub struct ServerRequest {
    pub id: Id,
    pub method: Box<str>,
    pub ts: Timestamp,
}

/// Most server requests awaiting the client's answer per session, and parked POSTs.
pub const MAX_SERVER_REQUESTS: usize = 64;
pub const MAX_PARKED: usize = 64;

/// One method's declarations by one modern lineage.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MethodDeclarations {
    pub method: Box<str>,
    /// The first declared set: its paths and its capability object's text.
    pub first_paths: CapPaths,
    pub first_caps: Box<str>,
    pub first_digest: u64,
    /// The previous declaration of this method.
    pub last_digest: u64,
    /// The previous declaration's capability text as sent (`None`: none declared) with its
    /// paths and whether a bound cut them: the same text again is not parsed again.
    #[serde(default)]
    pub last_caps: Option<Box<str>>,
    #[serde(default)]
    pub last_paths: CapPaths,
    #[serde(default)]
    pub last_cut: bool,
    /// Declarations seen for this method (digests), bounded.
    pub seen: Vec<u64>,
    /// Its requests alternate between sets: interleaved conversations, never alerted.
    pub multiplexed: bool,
    /// Lost path sets already alerted.
    pub alerted: Vec<Vec<String>>,
}

/// An `InputRequiredResult` waiting for its retry.
#[derive(Debug)]
pub struct InputPending {
    pub method: Box<str>,
    pub tool: Option<Box<str>>,
    pub deadline: Timestamp,
    pub exchange: Box<Exchange>,
}

/// What the era-aware detectors remember for a lineage or a server.
#[derive(Debug, Default)]
pub struct EraState {
    pub declarations: Vec<MethodDeclarations>,
    /// Declaration digests already logged as handshakes.
    pub logged: Vec<u64>,
    pub declaration_seq: u32,
    /// The lineage had a 2xx modern answer (reset by a downgrade alert).
    pub modern_ok: bool,
    /// The latest failing answers, oldest first.
    pub failures: VecDeque<FailedAnswer>,
    pub input_pending: Vec<InputPending>,
    /// Server scope: the latest discover result's digest and the first `supportedVersions`.
    pub discover_digest: Option<u64>,
    pub first_versions: Option<Vec<Box<str>>>,
    pub alerted_versions: Vec<Box<str>>,
    pub alerted_paths: Vec<Vec<String>>,
    /// Server scope: tools with `x-mcp-header` parameters (from `tools/list`).
    pub param_tools: Vec<(Box<str>, Vec<ParamHeader>)>,
}

fn strings_bytes(s: &[String]) -> usize {
    s.iter().map(|x| x.len() + 24).sum::<usize>() + 24
}

/// Bounds of [`EraState`] (counted when hit).
pub const MAX_DECLARED_METHODS: usize = 32;
pub const MAX_SETS_PER_METHOD: usize = 16;
pub const MAX_LOGGED_SETS: usize = 64;
pub const MAX_FAILURES: usize = 4;
pub const MAX_INPUT_PENDING: usize = 16;

impl EraState {
    /// What a server-scoped entry keeps of its era state (see [`Session::server_replica`]).
    fn server_replica(&self) -> EraState {
        EraState {
            discover_digest: self.discover_digest,
            first_versions: self.first_versions.clone(),
            alerted_versions: self.alerted_versions.clone(),
            alerted_paths: self.alerted_paths.clone(),
            param_tools: self.param_tools.clone(),
            declarations: self.declarations.clone(),
            logged: self.logged.clone(),
            declaration_seq: self.declaration_seq,
            modern_ok: self.modern_ok,
            ..EraState::default()
        }
    }

    /// Another instance's record of the same lineage or server: its first declarations stay
    /// the first (it got to the store first); what either saw or alerted counts as seen.
    pub fn merge(&mut self, theirs: super::snapshot::EraRecord) {
        let theirs = theirs.bounded();
        for d in theirs.declarations {
            let full = self.declarations.len() >= MAX_DECLARED_METHODS;
            match self.declarations.iter_mut().find(|m| m.method == d.method) {
                Some(mine) => {
                    mine.first_paths = d.first_paths;
                    mine.first_caps = d.first_caps;
                    mine.first_digest = d.first_digest;
                    mine.multiplexed |= d.multiplexed;
                    for digest in d.seen {
                        if !mine.seen.contains(&digest) && mine.seen.len() < MAX_SETS_PER_METHOD {
                            mine.seen.push(digest);
                        }
                    }
                    for set in d.alerted {
                        if !mine.alerted.contains(&set) && mine.alerted.len() < MAX_SETS_PER_METHOD
                        {
                            mine.alerted.push(set);
                        }
                    }
                }
                None if !full => self.declarations.push(d),
                None => {}
            }
        }
        for digest in theirs.logged {
            if !self.logged.contains(&digest) && self.logged.len() < MAX_LOGGED_SETS {
                self.logged.push(digest);
            }
        }
        self.declaration_seq = self.declaration_seq.max(theirs.declaration_seq);
        self.modern_ok |= theirs.modern_ok;
        if theirs.first_versions.is_some() {
            self.first_versions = theirs.first_versions;
        }
        self.discover_digest = self.discover_digest.or(theirs.discover_digest);
        for v in theirs.alerted_versions {
            if !self.alerted_versions.contains(&v) && self.alerted_versions.len() < MAX_LOGGED_SETS
            {
                self.alerted_versions.push(v);
            }
        }
        for p in theirs.alerted_paths {
            if !self.alerted_paths.contains(&p) && self.alerted_paths.len() < MAX_LOGGED_SETS {
                self.alerted_paths.push(p);
            }
        }
    }

    pub fn heap_bytes(&self) -> usize {
        let paths = |p: &CapPaths| paths_bytes(p);
        let decl: usize = self
            .declarations
            .iter()
            .map(|d| {
                std::mem::size_of::<MethodDeclarations>()
                    + d.method.len()
                    + paths(&d.first_paths)
                    + d.first_caps.len()
                    + d.last_caps.as_ref().map_or(0, |c| c.len())
                    + if Arc::ptr_eq(&d.last_paths, &d.first_paths) {
                        0
                    } else {
                        paths(&d.last_paths)
                    }
                    + d.seen.len() * 8
                    + d.alerted.iter().map(|a| strings_bytes(a)).sum::<usize>()
            })
            .sum();
        let params: usize = self
            .param_tools
            .iter()
            .map(|(t, ps)| {
                t.len()
                    + 32
                    + ps.iter()
                        .map(|p| {
                            p.name.len() + p.path.iter().map(|k| k.len() + 16).sum::<usize>() + 48
                        })
                        .sum::<usize>()
            })
            .sum();
        std::mem::size_of::<EraState>()
            + decl
            + self.logged.len() * 8
            + self.failures.len() * (std::mem::size_of::<FailedAnswer>() + 64)
            + self
                .input_pending
                .iter()
                .map(|p| {
                    // The method and tool come from the wire: held twice, and of any length.
                    let e = &p.exchange;
                    std::mem::size_of::<InputPending>()
                        + std::mem::size_of::<Exchange>()
                        + 256
                        + p.method.len()
                        + p.tool.as_ref().map_or(0, |t| t.len())
                        + e.method.len()
                        + e.tool.as_ref().map_or(0, String::len)
                        + e.session_id.as_ref().map_or(0, String::len)
                        + e.protocol_version.as_ref().map_or(0, String::len)
                })
                .sum::<usize>()
            + self
                .first_versions
                .as_ref()
                .map_or(0, |v| v.iter().map(|s| s.len() + 16).sum())
            + self
                .alerted_paths
                .iter()
                .map(|a| strings_bytes(a))
                .sum::<usize>()
            + params
    }
}

/// A request whose SSE stream ended without its answer after an event with an id: the client
/// may resume it with `Last-Event-ID` and get the answer on a new stream, so its exchange and
/// any alert wait for that until `deadline`.
#[derive(Debug)]
pub struct Resuming {
    pub id: Id,
    pub deadline: Timestamp,
    /// The exchange as it stands (unanswered).
    pub exchange: Box<crate::model::Exchange>,
    /// What detection concluded of the stream that ended empty.
    pub alert: Option<crate::model::AlertKind>,
    /// The client closed the stream (a disconnection, not a cancellation, before
    /// 2026-07-28): it is reported cancelled unless the client resumes it.
    pub client_left: bool,
}

impl<D: Default> Session<D> {
    pub fn new(client: SocketAddr, ts: Timestamp) -> Box<Session<D>> {
        Box::new(Session {
            charged: 0,
            client,
            lineage_id: None,
            route: None,
            lineage_route: None,
            era: Era::Legacy,
            protocol_version: None,
            last_seen: ts,
            handshakes: 0,
            capability_changes: 0,
            capability_changed_at: Timestamp(i64::MIN),
            baseline: None,
            streaming_negotiated: false,
            requests: 0,
            alerts: 0,
            in_flight: InFlight::default(),
            resuming: Vec::new(),
            resumed_until: Timestamp(i64::MIN),
            detection: D::default(),
            ext: None,
            parked: Vec::new(),
            server_requests: Vec::new(),
            fleet_key: None,
            shared_digest: 0,
            shared_version: 0,
            fleet_flows: [u64::MAX; FLEET_FLOWS],
            read_version: 0,
        })
    }
}

/// Longest `clientInfo` text kept as is for lineage matching; longer ones are kept as a digest.
const MAX_CLIENT_INFO_BYTES: usize = 512;

/// `clientInfo` as the text lineage compares: its compact JSON, or for an oversized one (only a
/// hostile client sends kilobytes of it) a digest of that text, so that every session and
/// lineage record holds a bounded key.
pub fn client_info_key(client_info: &Value) -> Box<str> {
    let text = compact_json(client_info);
    if text.len() <= MAX_CLIENT_INFO_BYTES {
        return text;
    }
    let digest = crate::lasting_digest::lasting_digest_of(0x6c69_6e65_6167_6521, text.as_bytes());
    format!("digest:{digest:016x}:{}", text.len()).into_boxed_str()
}

/// MCP session ids are visible ASCII; anything else is hostile or broken and never becomes a
/// key.
pub fn is_valid_session_id(id: &str, max_len: usize) -> bool {
    !id.is_empty() && id.len() <= max_len && crate::ascii::all_visible(id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SharedJson;
    use serde_json::json;

    #[test]
    fn in_flight_counts_its_room_and_ids_and_gives_room_back_as_it_drains() {
        let mut t = InFlight::default();
        assert_eq!(t.heap_bytes(), 0);
        let long = Id(format!("\"{}\"", "i".repeat(10_000)));
        t.insert(&long, (1, 1));
        assert!(t.heap_bytes() >= 10_002, "{}", t.heap_bytes());
        // The same id again keeps its stored copy: nothing more to count.
        let once = t.heap_bytes();
        t.insert(&long, (1, 2));
        assert_eq!((t.heap_bytes(), t.get(&long)), (once, Some((1, 2))));
        for i in 0..4095 {
            t.insert(&Id(i.to_string()), (2, i));
        }
        let slot = std::mem::size_of::<(Id, ExchangeKey)>() + 1;
        let full = t.heap_bytes();
        // 4096 entries need more than 4096 slots, each id its own block besides.
        assert!(full >= 4096 * slot + 4095 * 16 + 10_002, "{full}");
        assert_eq!(t.remove(&long), Some((1, 2)));
        assert!(full - t.heap_bytes() >= 10_002);
        for i in 0..4000 {
            assert_eq!(t.remove(&Id(i.to_string())), Some((2, i)));
        }
        // 95 left: the room shrank with them.
        assert!(t.heap_bytes() < full / 8, "{} of {full}", t.heap_bytes());
        for i in 4000..4095 {
            t.remove(&Id(i.to_string()));
        }
        assert!(t.is_empty());
        assert!(t.remove(&Id("0".into())).is_none());
        // Drained: at most the smallest table is kept.
        assert!(
            t.heap_bytes() <= 4 * (slot + ID_ALLOWANCE),
            "{}",
            t.heap_bytes()
        );
    }

    #[test]
    fn handshake_cache_shares_readings_of_equal_texts_within_its_bound() {
        let params = r#"{"protocolVersion":"2025-06-18","capabilities":{"roots":{"listChanged":true},"sampling":{}},"clientInfo":{"name":"c","version":"1"}}"#;
        let declared = Declared::read(Some(params), None);
        let texts = [params, "", r#"{"tools":{"streaming":true}}"#, ""];
        let mut cache = HandshakeCache::new(64 << 10);
        assert!(cache.get(&texts).is_none());
        cache.insert(&texts, &declared);
        let hit = cache.get(&texts).expect("cached");
        assert!(SharedJson::ptr_eq(
            &hit.client_capabilities,
            &declared.client_capabilities
        ));
        assert!(Arc::ptr_eq(
            &hit.record.client_paths,
            &declared.record.client_paths
        ));
        assert_eq!(
            *hit.client_capabilities,
            json!({"roots": {"listChanged": true}, "sampling": {}})
        );
        assert_eq!(
            hit.protocol_version_requested.as_deref(),
            Some("2025-06-18")
        );
        // Other texts, even one byte apart or in another slot, are not a hit.
        assert!(
            cache
                .get(&[params, "", r#"{"tools":{"streaming":false}}"#, ""])
                .is_none()
        );
        assert!(
            cache
                .get(&[params, r#"{"tools":{"streaming":true}}"#, "", ""])
                .is_none()
        );
        // The bound holds: inserting many distinct sets never holds more than it.
        let max = 64 << 10;
        for i in 0..2000 {
            let p = format!("{{\"n\":{i}}}");
            cache.insert(&[&p, "", "", ""], &declared);
            assert!(cache.bytes() <= max, "{}", cache.bytes());
        }
        assert!(cache.cache.len() <= MAX_CACHED_HANDSHAKES);
        let mut unbounded = HandshakeCache::new(usize::MAX);
        for i in 0..3000 {
            unbounded.insert(&[&format!("{i}"), "", "", ""], &declared);
            assert!(unbounded.cache.len() <= MAX_CACHED_HANDSHAKES);
        }
        // Texts beyond the size cut are not kept.
        let big = format!("{{\"k\":\"{}\"}}", "x".repeat(MAX_CACHED_TEXT));
        let before = cache.bytes();
        cache.insert(&[&big, "", "", ""], &declared);
        assert_eq!(cache.bytes(), before);
        assert!(cache.get(&[&big, "", "", ""]).is_none());
    }
}
