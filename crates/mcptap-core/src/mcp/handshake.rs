//! `initialize` exchanges as handshake events: everything both sides declared.

use super::headers;
use super::session::CapsRecord;
use super::transactions::Origin;
use crate::model::{Handshake, HandshakeSource, Outcome, Timestamp};
use serde_json::Value;

/// How an `initialize` was answered.
#[derive(Debug, Clone)]
pub struct Answer<'a> {
    /// The result's `initialize` members, owned: the event takes them (see `describe`).
    pub result: Option<Value>,
    pub error: Option<&'a (i64, String)>,
    pub status: u16,
}

impl Answer<'_> {
    pub fn accepted(&self) -> bool {
        self.result.is_some() && (200..300).contains(&self.status)
    }
}

/// The handshake event (seq 1, no diff or lineage yet) and the capability record of one
/// answered `initialize` (`cached`: built before from the same texts).
pub fn describe(
    ts: Timestamp,
    origin: &Origin,
    mut params: Value,
    answer: Answer<'_>,
    cached: Option<CapsRecord>,
) -> (Handshake, CapsRecord) {
    let accepted = answer.accepted();
    let Answer {
        mut result,
        error,
        status,
    } = answer;
    // The request's parameters are the caller's to give, and the result was parsed for this
    // event alone: their parts move into it.
    let client_caps = take_member(Some(&mut params), "capabilities");
    let client_info = take_member(Some(&mut params), "clientInfo");
    let protocol_version_requested = string(take_member(Some(&mut params), "protocolVersion"));
    let server_caps = take_member(result.as_mut(), "capabilities");
    let protocol_version = string(take_member(result.as_mut(), "protocolVersion"));
    let server_info = take_member(result.as_mut(), "serverInfo");
    let record = cached.unwrap_or_else(|| CapsRecord::new(&client_caps, &server_caps));
    let hs = Handshake {
        ts,
        session_id: origin.session_id.clone(),
        seq: 1,
        outcome: if accepted {
            Outcome::Accepted
        } else {
            Outcome::Rejected
        },
        http_status: status,
        error_code: error.map(|(c, _)| *c),
        error_message: error.map(|(_, m)| m.clone()),
        client: origin.client,
        server: origin.server,
        host: origin.head.host().map(str::to_string),
        path: origin.head.path().to_string(),
        protocol_version_requested,
        protocol_version,
        client_info,
        server_info,
        client_capabilities: client_caps,
        server_capabilities: server_caps,
        diff: None,
        client_near_miss: false,
        predecessor_session_id: None,
        lineage: None,
        v: Default::default(),
        era: origin.era,
        source: HandshakeSource::Initialize,
        lineage_id: origin.lineage_id.as_deref().map(str::to_string),
        method: None,
        supported_versions: None,
    };
    (hs, record)
}

/// Member `key` of `object`, moved out; null when there is none.
fn take_member(object: Option<&mut Value>, key: &str) -> Value {
    object
        .and_then(|o| o.get_mut(key))
        .map(Value::take)
        .unwrap_or(Value::Null)
}

fn string(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// The session a re-`initialize` replays: set only when the request itself named a session.
pub fn reinitialized_session(origin: &Origin) -> Option<&str> {
    headers::request_session_id(&origin.head)?;
    origin.session_id.as_deref()
}
