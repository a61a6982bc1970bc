//! What the session layer hands the detection layer once something is finished: a handshake
//! answered, a request answered, a stream that ended without its answer. The session layer
//! defines the interface and keeps state only; [`crate::detect`] implements it and decides
//! what is an alert.

use super::session::CapsRecord;
use super::transactions::{AnswerShape, StreamContent};
use crate::model::{AlertKind, HandshakeDiff, StreamEnd};
use serde_json::Value;

/// The detection layer, as the session layer sees it.
pub trait Detector {
    /// Detection's own state per session (e.g. how the server answers each method), stored
    /// in the session so that it is bounded and evicted with it.
    type SessionState: Default + std::fmt::Debug;

    /// A handshake of a session was answered (accepted or rejected).
    fn handshake(&self, review: &HandshakeReview<'_>) -> HandshakeVerdict;

    /// A request of a session was answered. One answer raises at most one alert.
    fn answer(
        &self,
        state: &mut Self::SessionState,
        review: &AnswerReview<'_>,
    ) -> Option<AlertKind>;

    /// An exchange ended with a request still unanswered.
    fn unanswered(&self, review: &UnansweredReview<'_>) -> Option<AlertKind>;
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

/// A request answered within a session.
#[derive(Debug)]
pub struct AnswerReview<'a> {
    pub method: &'a str,
    pub tool: Option<&'a str>,
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
