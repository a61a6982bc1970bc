//! One MCP session's state: what the session layer remembers between messages.

use super::caps::{self, CapPaths};
use crate::jsonrpc::Id;
use crate::model::Timestamp;
use foldhash::HashMap;
use serde_json::Value;
use std::net::SocketAddr;

/// Sessions are keyed by (server endpoint, `Mcp-Session-Id`).
pub type SessionKey = (SocketAddr, String);

/// An exchange: (flow id, request number on that connection).
pub type ExchangeKey = (u64, u64);

/// One handshake's capability sets, kept as the baseline of comparisons. Every tracked session
/// holds one, so it is kept compact: the server's capability object as JSON text (a `Value`
/// tree costs several KB), parsed again only when an alert needs it.
#[derive(Debug, Clone)]
pub struct CapsRecord {
    server_caps: Box<str>,
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
            server_caps: compact_json(server_caps),
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
    /// `clientInfo` of the latest handshake, as compact JSON (for lineage matching).
    pub client_info: Box<str>,
    pub last_seen: Timestamp,
    pub handshakes: u32,
    /// The first accepted handshake: the baseline, never replaced.
    pub baseline: Option<CapsRecord>,
    /// `tools.streaming: true` in the latest accepted handshake.
    pub streaming_negotiated: bool,
    pub requests: u64,
    pub alerts: u32,
    /// Requests awaiting a response, for answers that arrive on a GET stream.
    pub in_flight: HashMap<Id, ExchangeKey>,
    /// Requests whose stream ended without their answer but may be resumed.
    pub resuming: Vec<Resuming>,
    pub detection: D,
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
}

impl<D: Default> Session<D> {
    pub fn new(client: SocketAddr, ts: Timestamp) -> Box<Session<D>> {
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
            resuming: Vec::new(),
            detection: D::default(),
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
    use std::hash::BuildHasher;
    let digest = foldhash::fast::FixedState::with_seed(0x6c69_6e65_6167_6521).hash_one(&*text);
    format!("digest:{digest:016x}:{}", text.len()).into_boxed_str()
}

/// MCP session ids are visible ASCII; anything else is hostile or broken and never becomes a
/// key.
pub fn is_valid_session_id(id: &str, max_len: usize) -> bool {
    !id.is_empty() && id.len() <= max_len && id.bytes().all(|b| (0x21..=0x7e).contains(&b))
}
