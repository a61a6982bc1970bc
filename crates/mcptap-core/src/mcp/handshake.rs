//! `initialize` exchanges as handshake events: everything both sides declared.

use super::headers;
use super::session::CapsRecord;
use super::transactions::Origin;
use crate::jsonrpc::ResultFields;
use crate::model::{Handshake, HandshakeSource, JsonRpcError, Outcome, SharedJson, Timestamp};
use serde_json::Value;

/// How an `initialize` was answered.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The result's members as sent (`None`: no result).
    pub result: Option<&'a ResultFields<'a>>,
    pub error: Option<&'a (i64, String)>,
    pub status: u16,
}

impl Answer<'_> {
    pub fn accepted(&self) -> bool {
        self.result.is_some() && (200..300).contains(&self.status)
    }
}

/// What both sides of an `initialize` declared, read from the texts they sent: a function of
/// those texts alone, so that one reading serves every handshake sending the same (see
/// `session::HandshakeCache`).
#[derive(Debug, Clone)]
pub struct Declared {
    pub client_capabilities: SharedJson,
    pub client_info: SharedJson,
    pub protocol_version_requested: Option<String>,
    pub server_capabilities: SharedJson,
    pub server_info: SharedJson,
    pub protocol_version: Option<String>,
    pub record: CapsRecord,
    /// The result's members could not be read (nesting too deep): counted with each.
    pub result_error: Option<JsonRpcError>,
    /// The params were not JSON: counted with each.
    pub params_invalid: bool,
}

impl Declared {
    /// Bytes of the values' rendered texts.
    pub fn text_bytes(&self) -> usize {
        [
            &self.client_capabilities,
            &self.client_info,
            &self.server_capabilities,
            &self.server_info,
        ]
        .iter()
        .map(|v| v.text().len())
        .sum()
    }

    /// Parses the request's params and the result's `initialize` members.
    pub fn read(params: Option<&str>, result: Option<&ResultFields<'_>>) -> Declared {
        let mut result_error = None;
        let mut result = result.map(|r| {
            r.initialize_value().unwrap_or_else(|e| {
                result_error = Some(e.into());
                Value::Null
            })
        });
        let (mut params, params_invalid) = match params.map(serde_json::from_str::<Value>) {
            None => (Value::Null, false),
            Some(Ok(v)) => (v, false),
            Some(Err(_)) => (Value::Null, true),
        };
        // Both were parsed for this reading alone: their parts move into it.
        let client_caps = take_member(Some(&mut params), "capabilities");
        let server_caps = take_member(result.as_mut(), "capabilities");
        Declared {
            record: CapsRecord::new(&client_caps, &server_caps),
            client_info: SharedJson::new(take_member(Some(&mut params), "clientInfo")),
            protocol_version_requested: string(take_member(Some(&mut params), "protocolVersion")),
            protocol_version: string(take_member(result.as_mut(), "protocolVersion")),
            server_info: SharedJson::new(take_member(result.as_mut(), "serverInfo")),
            client_capabilities: SharedJson::new(client_caps),
            server_capabilities: SharedJson::new(server_caps),
            result_error,
            params_invalid,
        }
    }
}

/// The handshake event (seq 1, no diff or lineage yet) of one answered `initialize`.
pub fn describe(
    ts: Timestamp,
    origin: &Origin,
    answer: &Answer<'_>,
    declared: &Declared,
) -> Handshake {
    Handshake {
        ts,
        session_id: origin.session_id.clone(),
        seq: 1,
        outcome: if answer.accepted() {
            Outcome::Accepted
        } else {
            Outcome::Rejected
        },
        http_status: answer.status,
        error_code: answer.error.map(|(c, _)| *c),
        error_message: answer.error.map(|(_, m)| m.clone()),
        client: origin.client,
        server: origin.server,
        host: origin.head.host().map(str::to_string),
        path: origin.head.path().to_string(),
        protocol_version_requested: declared.protocol_version_requested.clone(),
        protocol_version: declared.protocol_version.clone(),
        client_info: declared.client_info.clone(),
        server_info: declared.server_info.clone(),
        client_capabilities: declared.client_capabilities.clone(),
        server_capabilities: declared.server_capabilities.clone(),
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
    }
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
