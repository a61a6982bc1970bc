//! Every limit of the core, in one place: [`Limits`] for the pipeline, holding [`HttpLimits`]
//! for each connection's parser and [`SessionLimits`] for the session layer.
//!
//! In code the limits are counts, bytes and nanoseconds. Their serde form is the operator's,
//! [`LimitSettings`]: seconds and bytes, every key optional — the `[limits]` table of mcptap's
//! config file, and what its `replay` flags fill in. Both reach [`Limits`] through
//! `Limits::try_from(LimitSettings)`, which converts with saturation and rejects settings that
//! would leave the monitor blind, so a file and a command line can never disagree.
//!
//! ```
//! use mcptap_core::limits::{LimitSettings, Limits};
//!
//! let settings = LimitSettings { lineage_window_secs: u64::MAX, ..LimitSettings::default() };
//! let limits = Limits::try_from(settings).expect("valid");
//! assert_eq!(limits.session.lineage_window_ns, i64::MAX); // saturated, not wrapped
//! assert!(Limits::try_from(LimitSettings { max_flows: 0, ..settings }).is_err());
//! ```

use serde::{Deserialize, Serialize};

const NS_PER_SEC: i64 = 1_000_000_000;

/// Every limit of the pipeline; each is counted when hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "LimitSettings", into = "LimitSettings")]
pub struct Limits {
    pub max_flows: usize,
    /// Total for flow state, everything buffered in flows and tracked sessions; least recently
    /// seen flows are evicted (reason `memory`) to stay under it. Sessions may take at most 3/4
    /// of it (least recently seen sessions are evicted beyond that, reason `evicted`).
    pub memory_budget_bytes: usize,
    /// Out-of-order bytes buffered per direction before a gap is declared.
    pub max_flow_buffer_bytes: usize,
    pub flow_idle_timeout_ns: i64,
    /// A packet further than this ahead of the packet clock does not move it (counted as a
    /// clock jump), unless a few packets in a row agree: one bad timestamp must not expire
    /// every flow and session.
    pub clock_jump_ns: i64,
    pub http: HttpLimits,
    pub session: SessionLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_flows: 262_144,
            memory_budget_bytes: 256 * 1024 * 1024,
            max_flow_buffer_bytes: 1024 * 1024,
            flow_idle_timeout_ns: 300 * NS_PER_SEC,
            clock_jump_ns: 60 * NS_PER_SEC,
            http: HttpLimits::default(),
            session: SessionLimits::default(),
        }
    }
}

/// Limits for one connection's parsing; all are counted when hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub max_head_bytes: usize,
    pub max_message_bytes: usize,
    pub max_sse_event_bytes: usize,
    /// Requests awaiting a response on one connection (pipelining depth).
    pub max_pending_requests: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_head_bytes: 64 * 1024,
            max_message_bytes: 4 * 1024 * 1024,
            max_sse_event_bytes: 4 * 1024 * 1024,
            max_pending_requests: 1024,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub max_sessions: usize,
    /// Estimated bytes all tracked sessions may hold (see [`crate::mcp::Tracker::session_bytes`]);
    /// least recently seen sessions are evicted beyond it, as beyond `max_sessions`.
    pub max_session_bytes: usize,
    /// A session with no traffic for this long is ended (reason `idle`).
    pub session_idle_timeout_ns: i64,
    /// Lineage: a new session within this time of its predecessor's end is linked to it.
    pub lineage_window_ns: i64,
    /// Requests awaiting a response per session (ids from the wire).
    pub max_in_flight: usize,
    pub max_session_id_len: usize,
    /// Open exchanges per connection; the oldest is dropped (and counted) beyond it.
    pub max_exchanges_per_flow: usize,
    /// A stream that ended without its answer after an event with an id may be resumed
    /// (`Last-Event-ID`): its empty result waits this long (or the stream's `retry` + 5 s, if
    /// longer) for the answer on a resumed stream before it alerts.
    pub resumption_window_ns: i64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_sessions: 100_000,
            max_session_bytes: usize::MAX,
            session_idle_timeout_ns: 3600 * NS_PER_SEC,
            lineage_window_ns: 600 * NS_PER_SEC,
            max_in_flight: 4096,
            max_session_id_len: 256,
            max_exchanges_per_flow: 1024,
            resumption_window_ns: 30 * NS_PER_SEC,
        }
    }
}

/// The operator's form of [`Limits`]: the config file's `[limits]` keys, in bytes and seconds.
/// A key left out keeps its default. Limits without a key here (pipelining depth, requests in
/// flight, session id length, the session share of the budget) keep their defaults: they guard
/// against hostile traffic and are not tuned per site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    pub max_flows: usize,
    pub memory_budget_bytes: usize,
    pub max_flow_buffer_bytes: usize,
    /// Largest JSON-RPC message body kept for parsing.
    pub max_message_bytes: usize,
    /// Largest SSE event kept for parsing; `None` follows `max_message_bytes` (an event carries
    /// one JSON-RPC message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sse_event_bytes: Option<usize>,
    pub max_head_bytes: usize,
    pub max_sessions: usize,
    pub flow_idle_timeout_secs: u64,
    pub session_idle_timeout_secs: u64,
    /// 0 turns lineage off.
    pub lineage_window_secs: u64,
    /// A packet this far ahead of the packet clock is a clock jump.
    pub clock_jump_secs: u64,
    /// How long an empty result of a resumable SSE stream waits for its resumption.
    pub resumption_window_secs: u64,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Limits::default().into()
    }
}

/// Below these, a byte limit drops every message: the monitor would be blind.
const MIN_MEMORY_BUDGET_BYTES: usize = 1024 * 1024;
const MIN_MESSAGE_BYTES: usize = 1024;

fn secs_to_ns(secs: u64) -> i64 {
    i64::try_from(secs)
        .unwrap_or(i64::MAX)
        .saturating_mul(NS_PER_SEC)
}

/// Rounds up, so that a saturated `i64::MAX` comes back as a value that saturates again.
fn ns_to_secs(ns: i64) -> u64 {
    u64::try_from(ns)
        .unwrap_or(0)
        .div_ceil(NS_PER_SEC.unsigned_abs())
}

fn at_least<T: PartialOrd + std::fmt::Display>(key: &str, value: T, min: T) -> Result<(), String> {
    if value < min {
        Err(format!("limits.{key} must be at least {min} (got {value})"))
    } else {
        Ok(())
    }
}

impl LimitSettings {
    /// Rejects settings that leave the monitor blind (nothing tracked, every message too large,
    /// everything expired at once); the error is one line naming the key.
    pub fn validate(&self) -> Result<(), String> {
        at_least("max_flows", self.max_flows, 1)?;
        at_least("max_sessions", self.max_sessions, 1)?;
        at_least(
            "memory_budget_bytes",
            self.memory_budget_bytes,
            MIN_MEMORY_BUDGET_BYTES,
        )?;
        at_least(
            "max_message_bytes",
            self.max_message_bytes,
            MIN_MESSAGE_BYTES,
        )?;
        if let Some(sse) = self.max_sse_event_bytes {
            at_least("max_sse_event_bytes", sse, MIN_MESSAGE_BYTES)?;
        }
        at_least("max_head_bytes", self.max_head_bytes, MIN_MESSAGE_BYTES)?;
        at_least("flow_idle_timeout_secs", self.flow_idle_timeout_secs, 1)?;
        at_least("clock_jump_secs", self.clock_jump_secs, 1)?;
        at_least(
            "session_idle_timeout_secs",
            self.session_idle_timeout_secs,
            1,
        )?;
        Ok(())
    }
}

impl TryFrom<LimitSettings> for Limits {
    type Error = String;

    fn try_from(s: LimitSettings) -> Result<Limits, String> {
        s.validate()?;
        let d = Limits::default();
        Ok(Limits {
            max_flows: s.max_flows,
            memory_budget_bytes: s.memory_budget_bytes,
            max_flow_buffer_bytes: s.max_flow_buffer_bytes,
            flow_idle_timeout_ns: secs_to_ns(s.flow_idle_timeout_secs),
            clock_jump_ns: secs_to_ns(s.clock_jump_secs),
            http: HttpLimits {
                max_head_bytes: s.max_head_bytes,
                max_message_bytes: s.max_message_bytes,
                max_sse_event_bytes: s.max_sse_event_bytes.unwrap_or(s.max_message_bytes),
                ..d.http
            },
            session: SessionLimits {
                max_sessions: s.max_sessions,
                session_idle_timeout_ns: secs_to_ns(s.session_idle_timeout_secs),
                lineage_window_ns: secs_to_ns(s.lineage_window_secs),
                resumption_window_ns: secs_to_ns(s.resumption_window_secs),
                ..d.session
            },
        })
    }
}

impl From<Limits> for LimitSettings {
    fn from(l: Limits) -> LimitSettings {
        LimitSettings {
            max_flows: l.max_flows,
            memory_budget_bytes: l.memory_budget_bytes,
            max_flow_buffer_bytes: l.max_flow_buffer_bytes,
            max_message_bytes: l.http.max_message_bytes,
            max_sse_event_bytes: (l.http.max_sse_event_bytes != l.http.max_message_bytes)
                .then_some(l.http.max_sse_event_bytes),
            max_head_bytes: l.http.max_head_bytes,
            max_sessions: l.session.max_sessions,
            flow_idle_timeout_secs: ns_to_secs(l.flow_idle_timeout_ns),
            session_idle_timeout_secs: ns_to_secs(l.session.session_idle_timeout_ns),
            lineage_window_secs: ns_to_secs(l.session.lineage_window_ns),
            clock_jump_secs: ns_to_secs(l.clock_jump_ns),
            resumption_window_secs: ns_to_secs(l.session.resumption_window_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_survive_the_operator_form() {
        assert_eq!(
            Limits::try_from(LimitSettings::default()),
            Ok(Limits::default())
        );
        assert_eq!(LimitSettings::default().lineage_window_secs, 600);
        assert_eq!(LimitSettings::default().max_sse_event_bytes, None);
    }

    #[test]
    fn seconds_saturate_instead_of_wrapping() {
        let s = LimitSettings {
            flow_idle_timeout_secs: u64::MAX,
            session_idle_timeout_secs: i64::MAX as u64,
            lineage_window_secs: 9_223_372_037,
            ..LimitSettings::default()
        };
        let l = Limits::try_from(s).expect("valid");
        assert_eq!(l.flow_idle_timeout_ns, i64::MAX);
        assert_eq!(l.session.session_idle_timeout_ns, i64::MAX);
        assert_eq!(l.session.lineage_window_ns, i64::MAX);
        // And back: a saturated value stays saturated on the next round.
        assert_eq!(Limits::try_from(LimitSettings::from(l)), Ok(l));
    }

    #[test]
    fn sse_events_follow_the_message_limit_unless_set() {
        let s = LimitSettings {
            max_message_bytes: 10_000,
            ..LimitSettings::default()
        };
        let l = Limits::try_from(s).expect("valid");
        assert_eq!(l.http.max_sse_event_bytes, 10_000);
        let own = Limits::try_from(LimitSettings {
            max_sse_event_bytes: Some(20_000),
            ..s
        })
        .expect("valid");
        assert_eq!(own.http.max_sse_event_bytes, 20_000);
        assert_eq!(LimitSettings::from(own).max_sse_event_bytes, Some(20_000));
        assert_eq!(LimitSettings::from(l).max_sse_event_bytes, None);
    }

    #[test]
    fn blind_settings_are_refused_with_the_key_named() {
        let d = LimitSettings::default();
        let cases = [
            ("max_flows", LimitSettings { max_flows: 0, ..d }),
            (
                "max_sessions",
                LimitSettings {
                    max_sessions: 0,
                    ..d
                },
            ),
            (
                "memory_budget_bytes",
                LimitSettings {
                    memory_budget_bytes: 0,
                    ..d
                },
            ),
            (
                "max_message_bytes",
                LimitSettings {
                    max_message_bytes: 0,
                    ..d
                },
            ),
            (
                "max_sse_event_bytes",
                LimitSettings {
                    max_sse_event_bytes: Some(0),
                    ..d
                },
            ),
            (
                "max_head_bytes",
                LimitSettings {
                    max_head_bytes: 0,
                    ..d
                },
            ),
            (
                "flow_idle_timeout_secs",
                LimitSettings {
                    flow_idle_timeout_secs: 0,
                    ..d
                },
            ),
            (
                "session_idle_timeout_secs",
                LimitSettings {
                    session_idle_timeout_secs: 0,
                    ..d
                },
            ),
        ];
        for (key, s) in cases {
            let e = Limits::try_from(s).expect_err(key);
            assert!(
                e.starts_with(&format!("limits.{key} ")) && !e.contains('\n'),
                "{e}"
            );
        }
        // No lineage is a choice, not blindness.
        assert!(
            Limits::try_from(LimitSettings {
                lineage_window_secs: 0,
                ..d
            })
            .is_ok()
        );
    }
}
