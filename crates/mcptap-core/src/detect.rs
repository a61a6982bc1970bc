//! Detectors: pure decisions over what the session layer observed.
//!
//! The session layer feeds facts (an answer's media type, how a stream ended); these functions
//! and the per-session [`ModeTracker`] decide whether that is an alert.

use crate::model::{DivergenceReason, EmptyReason};

/// How one 2xx answer to a request was delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    Json,
    /// An SSE stream whose first JSON-RPC message is the result.
    SseResultOnly,
    /// An SSE stream in which notifications or requests came before the result.
    SseAfterMessages,
}

impl AnswerShape {
    pub fn media_type(self) -> &'static str {
        match self {
            AnswerShape::Json => "application/json",
            AnswerShape::SseResultOnly | AnswerShape::SseAfterMessages => "text/event-stream",
        }
    }

    /// Server modes that can produce this answer.
    fn fits(self) -> u8 {
        match self {
            AnswerShape::Json => JSON | AUTO,
            AnswerShape::SseResultOnly => SSE,
            AnswerShape::SseAfterMessages => SSE | AUTO,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            AnswerShape::Json => "application/json",
            AnswerShape::SseResultOnly => "text/event-stream with only the result",
            AnswerShape::SseAfterMessages => "text/event-stream with messages before the result",
        }
    }
}

// Server response modes: always streams, never streams, JSON unless messages precede the result.
const SSE: u8 = 1;
const JSON: u8 = 2;
const AUTO: u8 = 4;

fn expectation(mask: u8) -> &'static str {
    match mask {
        SSE => "text/event-stream",
        m if m & SSE == 0 && m & JSON != 0 => "application/json",
        m if m & SSE == 0 => "application/json unless messages precede the result",
        m if m & JSON == 0 => "text/event-stream (json only without messages before the result)",
        _ => "any",
    }
}

#[derive(Debug, Default, Clone)]
struct MethodState {
    /// Modes consistent with every answer seen so far; all three at first.
    modes: u8,
    /// Reasons already alerted for this method, so a steady state alerts once.
    alerted: Vec<DivergenceReason>,
}

/// A divergence to alert on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DivergenceFinding {
    pub expected: String,
    pub observed: String,
    pub reason: DivergenceReason,
}

/// Per-session record of how the server answers each method.
#[derive(Debug, Default, Clone)]
pub struct ModeTracker {
    /// A handful of methods per session: a linear search beats hashing the name.
    methods: Vec<(Box<str>, MethodState)>,
}

/// Bound on distinct methods tracked per session (method names come from the wire).
const MAX_METHODS: usize = 64;

impl ModeTracker {
    /// Records one 2xx answer and returns the divergences it shows.
    /// `streaming_negotiated`: the session's current handshake has `tools.streaming: true`.
    /// `accept`: the request's Accept header, if any.
    pub fn observe(
        &mut self,
        method: &str,
        shape: AnswerShape,
        streaming_negotiated: bool,
        accept: Option<&str>,
    ) -> Vec<DivergenceFinding> {
        let at = match self.methods.iter().position(|(m, _)| **m == *method) {
            Some(at) => at,
            None if self.methods.len() >= MAX_METHODS => return Vec::new(),
            None => {
                let fresh = MethodState {
                    modes: SSE | JSON | AUTO,
                    alerted: Vec::new(),
                };
                self.methods.push((method.into(), fresh));
                self.methods.len() - 1
            }
        };
        let state = &mut self.methods[at].1;
        let mut found = Vec::new();
        let remaining = state.modes & shape.fits();
        if remaining == 0 {
            found.push(DivergenceFinding {
                expected: expectation(state.modes).to_string(),
                observed: shape.describe().to_string(),
                reason: DivergenceReason::ModeContradiction,
            });
            // Start over from this answer, so a lasting change alerts once, not on every call.
            state.modes = shape.fits();
        } else {
            state.modes = remaining;
        }
        if method == "tools/call" && streaming_negotiated && shape == AnswerShape::Json {
            push_once(
                state,
                &mut found,
                DivergenceFinding {
                    expected: "text/event-stream".into(),
                    observed: shape.describe().into(),
                    reason: DivergenceReason::StreamingNegotiated,
                },
            );
        }
        if let Some(accept) = accept
            && !accepts(accept, shape.media_type())
        {
            push_once(
                state,
                &mut found,
                DivergenceFinding {
                    expected: accept.to_string(),
                    observed: shape.media_type().into(),
                    reason: DivergenceReason::NotAccepted,
                },
            );
        }
        found
    }
}

fn push_once(state: &mut MethodState, found: &mut Vec<DivergenceFinding>, f: DivergenceFinding) {
    if !state.alerted.contains(&f.reason) {
        state.alerted.push(f.reason);
        found.push(f);
    }
}

/// Whether an Accept header value admits `media_type` (case-insensitive, parameters ignored,
/// wildcards honoured, `q=0` excluded).
pub fn accepts(accept: &str, media_type: &str) -> bool {
    let (want_type, want_sub) = media_type.split_once('/').unwrap_or((media_type, ""));
    accept.split(',').any(|range| {
        let mut parts = range.split(';');
        let mt = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let refused = parts.any(|p| {
            let p = p.trim().replace(' ', "");
            p == "q=0" || p == "q=0.0" || p == "q=0.00" || p == "q=0.000"
        });
        if refused || mt.is_empty() {
            return false;
        }
        let (t, s) = mt.split_once('/').unwrap_or((mt.as_str(), ""));
        (t == "*" || t.eq_ignore_ascii_case(want_type))
            && (s == "*" || s.eq_ignore_ascii_case(want_sub))
    })
}

/// What an SSE answer carried, for the empty-result detector.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamContent {
    /// Dispatched events, comments and data-less blocks.
    pub items: u32,
    /// JSON-RPC notifications or requests seen.
    pub messages: u32,
}

/// A stream that ended without the response for its request: why it was empty.
pub fn empty_result_reason(content: StreamContent) -> EmptyReason {
    if content.messages > 0 {
        EmptyReason::OnlyNotifications
    } else if content.items > 0 {
        EmptyReason::OnlyPriming
    } else {
        EmptyReason::NoEvents
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AnswerShape::*;

    fn reasons(f: &[DivergenceFinding]) -> Vec<DivergenceReason> {
        f.iter().map(|f| f.reason).collect()
    }

    #[test]
    fn sse_then_json_is_the_incident() {
        let mut t = ModeTracker::default();
        assert!(
            t.observe("tools/call", SseResultOnly, false, None)
                .is_empty()
        );
        assert!(
            t.observe("tools/call", SseResultOnly, false, None)
                .is_empty()
        );
        let f = t.observe("tools/call", Json, false, None);
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        assert_eq!(f[0].expected, "text/event-stream");
        assert_eq!(f[0].observed, "application/json");
        // The new state is established: no alert storm.
        assert!(t.observe("tools/call", Json, false, None).is_empty());
    }

    #[test]
    fn json_then_result_only_sse_alerts_but_auto_mode_does_not() {
        let mut t = ModeTracker::default();
        t.observe("tools/call", Json, false, None);
        assert_eq!(
            reasons(&t.observe("tools/call", SseResultOnly, false, None)),
            vec![DivergenceReason::ModeContradiction]
        );
        let mut auto = ModeTracker::default();
        assert!(auto.observe("tools/call", Json, false, None).is_empty());
        assert!(
            auto.observe("tools/call", SseAfterMessages, false, None)
                .is_empty()
        );
        assert!(auto.observe("tools/call", Json, false, None).is_empty());
        // Auto mode never streams a bare result.
        assert!(
            !auto
                .observe("tools/call", SseResultOnly, false, None)
                .is_empty()
        );
    }

    #[test]
    fn sse_server_with_progress_then_plain_sse_is_fine() {
        let mut t = ModeTracker::default();
        assert!(
            t.observe("tools/call", SseAfterMessages, false, None)
                .is_empty()
        );
        assert!(
            t.observe("tools/call", SseResultOnly, false, None)
                .is_empty()
        );
        assert!(!t.observe("tools/call", Json, false, None).is_empty());
    }

    #[test]
    fn methods_are_independent() {
        let mut t = ModeTracker::default();
        t.observe("tools/call", SseResultOnly, false, None);
        assert!(t.observe("tools/list", Json, false, None).is_empty());
    }

    #[test]
    fn streaming_negotiated_json_alerts_once() {
        let mut t = ModeTracker::default();
        let f = t.observe("tools/call", Json, true, None);
        assert_eq!(reasons(&f), vec![DivergenceReason::StreamingNegotiated]);
        assert!(t.observe("tools/call", Json, true, None).is_empty());
        assert!(t.observe("tools/list", Json, true, None).is_empty());
    }

    #[test]
    fn accept_header_is_honoured() {
        assert!(accepts(
            "application/json, text/event-stream",
            "text/event-stream"
        ));
        assert!(accepts(
            "Application/JSON; charset=utf-8",
            "application/json"
        ));
        assert!(accepts("*/*", "text/event-stream"));
        assert!(accepts("text/*", "text/event-stream"));
        assert!(!accepts("application/json", "text/event-stream"));
        assert!(!accepts(
            "text/event-stream;q=0, application/json",
            "text/event-stream"
        ));
        let mut t = ModeTracker::default();
        let f = t.observe("tools/call", SseResultOnly, false, Some("application/json"));
        assert_eq!(reasons(&f), vec![DivergenceReason::NotAccepted]);
    }

    #[test]
    fn empty_reasons() {
        assert_eq!(
            empty_result_reason(StreamContent::default()),
            EmptyReason::NoEvents
        );
        assert_eq!(
            empty_result_reason(StreamContent {
                items: 2,
                messages: 0
            }),
            EmptyReason::OnlyPriming
        );
        assert_eq!(
            empty_result_reason(StreamContent {
                items: 2,
                messages: 1
            }),
            EmptyReason::OnlyNotifications
        );
    }
}
