//! What the session layer hands the detection layer once something is finished: a handshake
//! answered, a request answered, a stream that ended without its answer. The session layer
//! defines the interface and keeps state only; [`crate::detect`] implements it and decides
//! what is an alert.

use super::modern::HeaderFinding;
use super::session::CapsRecord;
use super::transactions::{AnswerShape, StreamContent};
use crate::model::{AlertKind, FailedAnswer, HandshakeDiff, PathDiff, StreamEnd, Timestamp};
use serde_json::Value;

/// What a session's part holds on the heap, charged with the session (see `budget`).
pub trait HeapBytes {
    fn heap_bytes(&self) -> usize;
}

/// Sessions without detection state (tests of the session table).
impl HeapBytes for () {
    fn heap_bytes(&self) -> usize {
        0
    }
}

/// The detection layer, as the session layer sees it.
pub trait Detector {
    /// Detection's own state per session (e.g. how the server answers each method), stored
    /// in the session so that it is bounded and evicted with it.
    type SessionState: Default
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + HeapBytes;

    /// Fleet mode: another instance's view of a session's detection state (`theirs`) met
    /// this one's; afterwards `ours` holds what both saw.
    fn merge_state(&self, ours: &mut Self::SessionState, theirs: Self::SessionState);

    /// A handshake of a session was answered (accepted or rejected).
    fn handshake(&self, review: &HandshakeReview<'_>) -> HandshakeVerdict;

    /// A request of a session was answered. One answer raises at most one alert.
    fn answer(&self, state: &mut Self::SessionState, review: &AnswerReview<'_>) -> AnswerVerdict;

    /// An exchange ended with a request still unanswered.
    fn unanswered(&self, review: &UnansweredReview<'_>) -> Option<AlertKind>;

    /// A modern lineage declared client capabilities for a method (a set first seen for
    /// that method, or a repeat of the previous one).
    fn declaration(&self, review: &DeclarationReview<'_>) -> Option<AlertKind>;

    /// A server answered `server/discover`, against its first discover result.
    fn discover(&self, review: &DiscoverReview<'_>) -> Vec<AlertKind>;

    /// A lineage sent `initialize` to a server.
    fn downgrade(&self, review: &DowngradeReview<'_>) -> Option<AlertKind>;

    /// A request whose headers disagreed with its body was answered.
    fn header_mismatch(&self, review: &MismatchReview<'_>) -> Option<AlertKind>;
}

/// One modern declaration of a method, against the method's first one.
#[derive(Debug)]
pub struct DeclarationReview<'a> {
    pub method: &'a str,
    pub seq: u32,
    pub diff: &'a PathDiff,
    /// The same set as the method's previous declaration.
    pub repeated: bool,
    /// The lineage alternates between sets for this method.
    pub multiplexed: bool,
    /// These lost paths were alerted before for this method.
    pub already_alerted: bool,
    /// The method's first set, as JSON text ([`Self::previous_value`] parses it).
    pub previous: &'a str,
    /// This declaration's set as sent (`None`: none declared; [`Self::current_value`]).
    pub current: Option<&'a str>,
}

impl DeclarationReview<'_> {
    /// The first set as a value, parsed only for an alert (most declarations repeat a set).
    pub fn previous_value(&self) -> Value {
        serde_json::from_str(self.previous).unwrap_or(Value::Null)
    }

    /// This declaration's set as a value (null when none was declared).
    pub fn current_value(&self) -> Value {
        self.current
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(Value::Null)
    }
}

/// A `server/discover` result against the server's first.
#[derive(Debug)]
pub struct DiscoverReview<'a> {
    pub seq: u32,
    pub diff: &'a PathDiff,
    /// The lost paths were alerted before.
    pub paths_alerted: bool,
    pub previous: &'a Value,
    pub current: &'a Value,
    pub removed_versions: &'a [String],
    pub versions_alerted: bool,
    pub supported_versions: &'a [String],
}

/// An `initialize` from a lineage.
#[derive(Debug)]
pub struct DowngradeReview<'a> {
    /// The lineage had a 2xx modern answer from this server.
    pub modern_ok: bool,
    pub before: &'a [FailedAnswer],
    pub requested_version: Option<&'a str>,
}

/// The answer to a request with mismatched headers.
#[derive(Debug)]
pub struct MismatchReview<'a> {
    pub findings: &'a [HeaderFinding],
    pub method: &'a str,
    pub tool: Option<&'a str>,
    pub request_id: &'a Value,
    pub http_status: u16,
    pub error_code: Option<i64>,
}

/// A finished handshake of a session, against the session's baseline.
#[derive(Debug)]
pub struct HandshakeReview<'a> {
    pub seq: u32,
    pub accepted: bool,
    /// The session's first accepted handshake, if it had one before this one.
    pub baseline: Option<&'a CapsRecord>,
    /// Paths removed and added against the baseline (none without a baseline).
    pub diff: Option<&'a HandshakeDiff>,
    pub server_capabilities: &'a Value,
}

/// What detection concluded about a handshake.
#[derive(Debug, Default, PartialEq)]
pub struct HandshakeVerdict {
    /// The client declared fewer capabilities but the server kept its first answer.
    pub client_near_miss: bool,
    /// One handshake raises at most one alert.
    pub alert: Option<AlertKind>,
}

/// What detection concluded about an answer.
#[derive(Debug, Default, PartialEq)]
pub struct AnswerVerdict {
    /// One answer raises at most one alert.
    pub alert: Option<AlertKind>,
    /// The session's detection state had no room to record the answer
    /// ([`Limit::ModeRecords`](crate::model::Limit::ModeRecords)).
    pub untracked: bool,
}

/// A request answered within a session.
#[derive(Debug)]
pub struct AnswerReview<'a> {
    pub method: &'a str,
    pub tool: Option<&'a str>,
    /// The request asked for progress notifications (`_meta.progressToken`): a server may
    /// stream such answers and not others.
    pub progress_requested: bool,
    /// The session's accepted handshakes that changed its capabilities against its first one
    /// (0 for a stateless endpoint): response modes are judged across them.
    pub capability_changes: u32,
    /// When the request was sent.
    pub requested_at: Timestamp,
    pub request_id: &'a Value,
    pub http_status: u16,
    /// A JSON-RPC error response, not a result.
    pub is_error: bool,
    pub shape: AnswerShape,
    /// The answer came on another exchange's stream (a GET stream), which says nothing about
    /// how the POST is answered.
    pub on_other_stream: bool,
    /// The session's latest accepted handshake has `tools.streaming: true`.
    pub streaming_negotiated: bool,
    /// The request's Accept header.
    pub accept: Option<&'a str>,
    /// A duplicated header (Content-Type, ...) made the exchange ambiguous: peers disagree on
    /// what the answer was, so it says nothing about the server's response mode.
    pub ambiguous: bool,
}

/// A request whose exchange ended without its answer.
#[derive(Debug)]
pub struct UnansweredReview<'a> {
    pub method: &'a str,
    pub tool: Option<&'a str>,
    pub request_id: &'a Value,
    pub http_status: u16,
    pub media_type: Option<&'a str>,
    pub stream: StreamContent,
    /// How the response body ended; `None` when it was cut off (reset, lost bytes).
    pub ended_by: Option<StreamEnd>,
}
