//! Detectors: every alert decision, over what the session layer finished.
//!
//! The session layer ([`crate::mcp`]) keeps state and hands over finished handshakes, answers
//! and unanswered requests through its [`Detector`] interface; [`Detectors`] implements it and
//! returns alert values. Per-session detection state (how the server answers each method) is
//! a [`ModeTracker`], stored in the session.

use crate::mcp::transactions::{AnswerShape, StreamContent};
use crate::mcp::{AnswerReview, Detector, HandshakeReview, HandshakeVerdict, UnansweredReview};
use crate::model::{
    AlertKind, CapabilityChange, Divergence, DivergenceReason, EmptyReason, EmptyResult,
};

/// mcptap's detectors: capability narrowing and widening, content-type divergence, empty tool
/// results.
#[derive(Debug, Default, Clone, Copy)]
pub struct Detectors;

impl Detector for Detectors {
    type SessionState = ModeTracker;

    fn handshake(&self, review: &HandshakeReview<'_>) -> HandshakeVerdict {
        let (Some(base), Some(diff), true) = (review.baseline, review.diff, review.accepted) else {
            return HandshakeVerdict::default();
        };
        let change = CapabilityChange::new(
            review.seq,
            &diff.server,
            &diff.client,
            base.server_caps(),
            review.server_capabilities.clone(),
        );
        let mut alerts = Vec::new();
        if !diff.server.removed.is_empty() {
            alerts.push(AlertKind::CapabilityNarrowing(change.clone()));
        }
        if !diff.server.added.is_empty() {
            alerts.push(AlertKind::CapabilityWidening(change));
        }
        HandshakeVerdict {
            client_near_miss: diff.server.is_empty() && !diff.client.removed.is_empty(),
            alerts,
        }
    }

    fn answer(&self, modes: &mut ModeTracker, review: &AnswerReview<'_>) -> Vec<AlertKind> {
        if !(200..300).contains(&review.http_status) || review.on_other_stream || review.ambiguous {
            // Errors at the HTTP level, answers on a GET stream and ambiguous answers (peers
            // disagree on their Content-Type) say nothing about the POST's response mode.
            return Vec::new();
        }
        modes
            .observe(
                review.method,
                review.shape,
                review.streaming_negotiated,
                review.accept,
            )
            .into_iter()
            .map(|f| {
                AlertKind::ContentTypeDivergence(Divergence {
                    method: review.method.to_string(),
                    request_id: review.request_id.clone(),
                    tool: review.tool.map(str::to_string),
                    expected: f.expected,
                    observed: f.observed,
                    reason: f.reason,
                })
            })
            .collect()
    }

    fn unanswered(&self, review: &UnansweredReview<'_>) -> Option<AlertKind> {
        let streamed = review.media_type == Some("text/event-stream");
        let ended_by = review.ended_by?;
        if review.method != "tools/call" || !streamed || !(200..300).contains(&review.http_status) {
            return None;
        }
        Some(AlertKind::EmptyToolResult(EmptyResult {
            request_id: review.request_id.clone(),
            tool: review.tool.map(str::to_string),
            reason: empty_result_reason(review.stream),
            sse_events: review.stream.items,
            ended_by,
        }))
    }
}

/// Server modes that can produce an answer of this shape.
fn fits(shape: AnswerShape) -> u8 {
    match shape {
        AnswerShape::Json => JSON | AUTO,
        AnswerShape::SseResultOnly => SSE,
        AnswerShape::SseAfterMessages => SSE | AUTO,
    }
}

fn describe(shape: AnswerShape) -> &'static str {
    match shape {
        AnswerShape::Json => "application/json",
        AnswerShape::SseResultOnly => "text/event-stream with only the result",
        AnswerShape::SseAfterMessages => "text/event-stream with messages before the result",
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
        let remaining = state.modes & fits(shape);
        if remaining == 0 {
            found.push(DivergenceFinding {
                expected: expectation(state.modes).to_string(),
                observed: describe(shape).to_string(),
                reason: DivergenceReason::ModeContradiction,
            });
            // Start over from this answer, so a lasting change alerts once, not on every call.
            state.modes = fits(shape);
        } else {
            state.modes = remaining;
        }
        if method == "tools/call" && streaming_negotiated && shape == AnswerShape::Json {
            push_once(
                state,
                &mut found,
                DivergenceFinding {
                    expected: "text/event-stream".into(),
                    observed: describe(shape).into(),
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
    use crate::model::StreamEnd;
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

    fn review<'a>(
        accepted: bool,
        baseline: Option<&'a crate::mcp::session::CapsRecord>,
        diff: Option<&'a crate::model::HandshakeDiff>,
        caps: &'a serde_json::Value,
    ) -> HandshakeReview<'a> {
        HandshakeReview {
            seq: 2,
            accepted,
            baseline,
            diff,
            server_capabilities: caps,
        }
    }

    #[test]
    fn handshakes_alert_on_server_paths_lost_or_gained_against_the_baseline() {
        use crate::mcp::session::CapsRecord;
        use crate::model::{HandshakeDiff, PathDiff};
        use serde_json::json;
        let first = json!({"tools": {"streaming": true}});
        let base = CapsRecord::new(&json!({"sampling": {}}), &first);
        let now = json!({"tools": {}});
        let narrowed = HandshakeDiff {
            client: PathDiff {
                removed: vec!["sampling".into()],
                added: vec![],
            },
            server: PathDiff {
                removed: vec!["tools.streaming".into()],
                added: vec![],
            },
        };
        let v = Detectors.handshake(&review(true, Some(&base), Some(&narrowed), &now));
        assert!(!v.client_near_miss);
        let [AlertKind::CapabilityNarrowing(change)] = v.alerts.as_slice() else {
            panic!("{:?}", v.alerts);
        };
        assert_eq!(change.removed, vec!["tools.streaming".to_string()]);
        assert_eq!(change.client_removed, vec!["sampling".to_string()]);
        assert_eq!(change.previous, first);
        // A rejected handshake or a first one decides nothing.
        assert_eq!(
            Detectors.handshake(&review(false, Some(&base), Some(&narrowed), &now)),
            HandshakeVerdict::default()
        );
        assert_eq!(
            Detectors.handshake(&review(true, None, None, &now)),
            HandshakeVerdict::default()
        );
        // The client lost a capability, the server kept its answer: a near miss, no alert.
        let pinned = HandshakeDiff {
            server: PathDiff::default(),
            ..narrowed
        };
        let v = Detectors.handshake(&review(true, Some(&base), Some(&pinned), &first));
        assert!(v.client_near_miss && v.alerts.is_empty());
    }

    #[test]
    fn only_2xx_answers_on_their_own_exchange_take_part_in_mode_elimination() {
        let id = serde_json::json!(1);
        let answer = |status, on_other_stream, shape| AnswerReview {
            method: "tools/call",
            tool: Some("t"),
            request_id: &id,
            http_status: status,
            shape,
            on_other_stream,
            streaming_negotiated: false,
            accept: None,
            ambiguous: false,
        };
        let mut modes = ModeTracker::default();
        assert!(
            Detectors
                .answer(&mut modes, &answer(200, false, SseResultOnly))
                .is_empty()
        );
        assert!(
            Detectors
                .answer(&mut modes, &answer(500, false, Json))
                .is_empty()
        );
        assert!(
            Detectors
                .answer(&mut modes, &answer(200, true, Json))
                .is_empty()
        );
        // Duplicated Content-Types: peers disagree on the answer, so it decides nothing.
        let ambiguous = AnswerReview {
            ambiguous: true,
            ..answer(200, false, Json)
        };
        assert!(Detectors.answer(&mut modes, &ambiguous).is_empty());
        let alerts = Detectors.answer(&mut modes, &answer(200, false, Json));
        assert!(matches!(
            alerts.as_slice(),
            [AlertKind::ContentTypeDivergence(d)] if d.reason == DivergenceReason::ModeContradiction
        ));
    }

    #[test]
    fn an_unanswered_tools_call_alerts_only_on_an_ended_2xx_event_stream() {
        let id = serde_json::json!(7);
        let end = |method, status, media, ended_by| UnansweredReview {
            method,
            tool: None,
            request_id: &id,
            http_status: status,
            media_type: media,
            stream: StreamContent::default(),
            ended_by,
        };
        let sse = Some("text/event-stream");
        let fin = Some(StreamEnd::FinalChunk);
        assert!(
            Detectors
                .unanswered(&end("tools/call", 200, sse, fin))
                .is_some()
        );
        assert!(
            Detectors
                .unanswered(&end("tools/call", 200, sse, None))
                .is_none()
        );
        assert!(
            Detectors
                .unanswered(&end("tools/list", 200, sse, fin))
                .is_none()
        );
        assert!(
            Detectors
                .unanswered(&end("tools/call", 502, sse, fin))
                .is_none()
        );
        assert!(
            Detectors
                .unanswered(&end("tools/call", 200, Some("application/json"), fin))
                .is_none()
        );
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
