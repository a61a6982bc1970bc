//! What MCP needs from the HTTP layer: its header names and which exchanges can carry it.

use crate::http::{Interest, RequestHead, RequestHeader, ResponseHead};

/// Index of `Mcp-Session-Id` in the extracted headers of requests and responses.
const SESSION_ID: usize = 0;
/// Index of `MCP-Protocol-Version` in the extracted request headers.
const PROTOCOL_VERSION: usize = 1;
/// Index of `Mcp-Method` in the extracted request headers.
const METHOD: usize = 2;
/// Index of `Mcp-Name` in the extracted request headers.
const NAME: usize = 3;
/// Index of `User-Agent` in the extracted request headers.
const USER_AGENT: usize = 4;
/// Index of `Last-Event-ID` in the extracted request headers.
const LAST_EVENT_ID: usize = 5;

/// Prefix of the headers a tool's `x-mcp-header` parameters are mirrored into (2026-07-28).
pub const PARAM_PREFIX: &str = "mcp-param-";

/// The headers MCP reads and the exchanges it keeps: anything on a session, POSTs with JSON
/// bodies and GETs that accept an event stream.
pub const HTTP_INTEREST: Interest = Interest {
    request_headers: &[
        "mcp-session-id",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "user-agent",
        "last-event-id",
    ],
    response_headers: &["mcp-session-id"],
    request_header_prefix: PARAM_PREFIX,
    keeps: may_carry_mcp,
};

/// Whether a request can be part of an MCP conversation.
pub fn may_carry_mcp(head: &RequestHead) -> bool {
    request_session_id(head).is_some() || head.may_carry_json_or_sse()
}

pub fn request_session_id(head: &RequestHead) -> Option<&str> {
    head.extracted(SESSION_ID)
}

pub fn request_protocol_version(head: &RequestHead) -> Option<&str> {
    head.extracted(PROTOCOL_VERSION)
}

pub fn request_mcp_method(head: &RequestHead) -> Option<&str> {
    head.extracted(METHOD)
}

pub fn request_mcp_name(head: &RequestHead) -> Option<&str> {
    head.extracted(NAME)
}

pub fn request_user_agent(head: &RequestHead) -> Option<&str> {
    head.extracted(USER_AGENT)
}

/// A GET's `Last-Event-ID`: it resumes a stream that ended (2025-11-25).
pub fn request_last_event_id(head: &RequestHead) -> Option<&str> {
    head.extracted(LAST_EVENT_ID)
}

pub fn response_session_id(head: &ResponseHead) -> Option<&str> {
    head.extracted[SESSION_ID].as_deref()
}

/// Request heads as the HTTP layer builds them, for tests and for callers that feed HTTP
/// messages themselves.
pub fn request_head(
    method: &str,
    path: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    session_id: Option<&str>,
    protocol_version: Option<&str>,
) -> RequestHead {
    let mut head = RequestHead::new(method, path);
    head.set(RequestHeader::ContentType, content_type);
    head.set(RequestHeader::Accept, accept);
    head.set(RequestHeader::Extracted(SESSION_ID), session_id);
    head.set(RequestHeader::Extracted(PROTOCOL_VERSION), protocol_version);
    head
}

/// Sets the modern revision's `Mcp-Method` and `Mcp-Name` on a head built by [`request_head`].
pub fn set_request_mcp_headers(head: &mut RequestHead, method: Option<&str>, name: Option<&str>) {
    head.set(RequestHeader::Extracted(METHOD), method);
    head.set(RequestHeader::Extracted(NAME), name);
}

/// A response head with MCP's headers, as [`request_head`].
pub fn response_head(
    status: u16,
    media_type: Option<&str>,
    session_id: Option<&str>,
) -> ResponseHead {
    let mut head = ResponseHead {
        status,
        media_type: media_type.map(str::to_string),
        ..ResponseHead::default()
    };
    head.extracted[SESSION_ID] = session_id.map(str::to_string);
    head
}
