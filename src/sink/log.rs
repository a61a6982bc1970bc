//! Human-readable `tracing` lines: handshakes and sessions that ended with alerts at INFO,
//! alerts at WARN, the rest at DEBUG.
//! Only the fields of the event are logged: never headers such as Authorization or Cookie,
//! never bodies beyond capabilities, client/server info, methods, tool names and ids.

use mcptap_core::model::Output;
use mcptap_core::model::{AlertKind, Event, Telemetry};

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

pub fn log_output(output: &Output) {
    match output {
        Output::Event(ev) => log_event(ev),
        Output::Telemetry(t) => log_telemetry(t),
        // The fleet adapter handles these.
        Output::Shared(_) => {}
    }
}

/// One `session end` line at `level` (a tracing macro's name).
macro_rules! session_end {
    ($level:ident, $s:expr) => {
        tracing::$level!(
            target: "mcptap::session",
            ts = %$s.ts.rfc3339(),
            session_id = $s.session_id.as_deref().unwrap_or("-"),
            server = %$s.server,
            reason = $s.reason.as_str(),
            handshakes = $s.handshakes,
            requests = $s.requests,
            alerts = $s.alerts,
            "session end"
        )
    };
}

/// A handshake's source, unless it is an `initialize` (whose lines keep their shape).
pub(crate) fn modern_source(h: &mcptap_core::model::Handshake) -> Option<&'static str> {
    (h.source != mcptap_core::model::HandshakeSource::Initialize).then(|| h.source.as_str())
}

/// The handshake line through tracing (a terminal's coloured output, tests).
pub(crate) fn trace_handshake(h: &mcptap_core::model::Handshake) {
    tracing::info!(
            target: "mcptap::handshake",
            ts = %h.ts.rfc3339(),
            session_id = h.session_id.as_deref().unwrap_or("-"),
            // Modern handshakes say what they are (an `initialize` needs no saying).
            source = modern_source(h),
            method = h.method.as_deref(),
            seq = h.seq,
            outcome = h.outcome.as_str(),
            http_status = h.http_status,
            error_code = h.error_code,
            error_message = h.error_message.as_deref(),
            client = %h.client,
            server = %h.server,
            host = h.host.as_deref(),
            path = %h.path,
            protocol_version_requested = h.protocol_version_requested.as_deref(),
            protocol_version = h.protocol_version.as_deref(),
            client_info = %json(&h.client_info),
            server_info = %json(&h.server_info),
            client_capabilities = %json(&h.client_capabilities),
            server_capabilities = %json(&h.server_capabilities),
            diff = h.diff.as_ref().map(json),
            client_near_miss = h.client_near_miss,
            predecessor_session_id = h.predecessor_session_id.as_deref(),
            lineage = h.lineage.as_ref().map(json),
            "handshake"
    )
}

/// [`log_output`], with `rendered` the output's log line if [`render_event_line`] wrote one
/// (on another thread, say), else empty. A rendered line gets the time now as its stamp, as a
/// line logged here would.
pub fn log_output_prepared(output: &Output, rendered: &[u8]) {
    if rendered.is_empty() {
        log_output(output);
    } else {
        super::handshake_line::write_rendered(rendered);
    }
}

/// Appends `ev`'s log line to `line` if it is one [`log_output_prepared`] can write as it is
/// (a handshake's, written directly): the rest is logged when delivered.
pub fn render_event_line(ev: &Event, line: &mut Vec<u8>) {
    if let Event::Handshake(h) = ev {
        super::handshake_line::render(h, line);
    }
}

pub fn log_event(ev: &Event) {
    match ev {
        Event::Handshake(h) => {
            if !super::handshake_line::try_log(h) {
                trace_handshake(h);
            }
        }
        Event::Alert(a) => {
            let detail = alert_detail(&a.kind);
            tracing::warn!(
                target: "mcptap::alert",
                ts = %a.ts.rfc3339(),
                kind = a.kind.as_str(),
                era = a.era.as_str(),
                session_id = a.session_id.as_deref().unwrap_or("-"),
                lineage_id = a.lineage_id.as_deref().unwrap_or("-"),
                server = %a.server,
                client = %a.client,
                "{detail}"
            );
        }
        Event::Exchange(e) => tracing::debug!(
            target: "mcptap::exchange",
            ts = %e.ts.rfc3339(),
            session_id = e.session_id.as_deref().unwrap_or("-"),
            method = %e.method,
            request_id = %e.request_id,
            tool = e.tool.as_deref(),
            http_status = e.http_status,
            media_type = e.media_type,
            sse_events = e.sse_events,
            duration_ms = e.duration_ms,
            answered = e.answered,
            "exchange"
        ),
        // A session that ended with alerts is worth a line at INFO; the many that ended
        // quietly are DEBUG (a gateway ends tens of thousands a minute).
        Event::SessionEnd(s) if s.alerts > 0 => session_end!(info, s),
        Event::SessionEnd(s) => session_end!(debug, s),
    }
}

/// The message of an alert's WARN line. Reasons and stream ends are written by the names the
/// events carry (`mode_contradiction`, `final_chunk`), so a log line and its event match.
fn alert_detail(kind: &AlertKind) -> String {
    match kind {
        AlertKind::CapabilityNarrowing(c) => format!(
            "server removed {:?}; client removed {:?} (handshake {})",
            c.removed, c.client_removed, c.handshake_seq
        ),
        AlertKind::CapabilityWidening(c) => format!(
            "server added {:?}; client added {:?} (handshake {})",
            c.added, c.client_added, c.handshake_seq
        ),
        AlertKind::ContentTypeDivergence(d) => format!(
            "{}{} id={} expected {} observed {} ({})",
            wire(&d.method),
            d.tool
                .as_deref()
                .map_or_else(String::new, |t| format!(" tool={}", wire(t))),
            d.request_id,
            d.expected,
            d.observed,
            d.reason.as_str()
        ),
        AlertKind::ClientCapabilityNarrowing(c) => format!(
            "client declared less for {} than at first: removed {:?} (declaration {})",
            wire(&c.method),
            c.removed,
            c.declaration_seq
        ),
        AlertKind::ProtocolDowngrade(d) => format!(
            "{}: before {:?}; removed versions {:?}",
            d.reason.as_str(),
            d.before
                .iter()
                .map(|b| format!(
                    "{} {} {}",
                    wire(&b.method),
                    b.http_status,
                    b.content_type.as_deref().unwrap_or(b.media_type)
                ))
                .collect::<Vec<_>>(),
            d.removed_versions
        ),
        AlertKind::HeaderMismatch(m) => format!(
            "{} {:?} disagrees with the body {:?} ({} id={}), answered {}",
            m.header_name,
            m.header_value,
            m.body_value,
            wire(&m.method),
            m.request_id,
            m.http_status
        ),
        AlertKind::EmptyToolResult(e) => format!(
            "tools/call id={} tool={} stream ended ({}) without a response: {}",
            e.request_id,
            wire(e.tool.as_deref().unwrap_or("?")),
            e.ended_by.as_str(),
            e.reason.as_str()
        ),
    }
}

/// A method or tool name from the wire as a log line may show it: as it is when it is
/// printable ASCII, else quoted and escaped (a newline in it must not start a forged line).
fn wire(text: &str) -> std::borrow::Cow<'_, str> {
    if crate::sink::json::plain_printable(text.as_bytes()) {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(format!("{text:?}"))
    }
}

/// What a server was already warned about (one WARN per server and blind spot), bounded.
type Warned = std::collections::BTreeSet<(std::net::SocketAddr, &'static str)>;
static WARNED: std::sync::Mutex<Warned> = std::sync::Mutex::new(std::collections::BTreeSet::new());
/// Most (server, blind spot) pairs remembered for the once-per-server warnings; beyond, no more
/// warnings (the counters go on).
const MAX_WARNED_SERVERS: usize = 1024;

/// Whether `server` gets its first warning about `what` now.
fn first_warning(server: std::net::SocketAddr, what: &'static str) -> bool {
    let Ok(mut warned) = WARNED.lock() else {
        return false;
    };
    warned.len() < MAX_WARNED_SERVERS && warned.insert((server, what))
}

/// Whether `server` gets its first warning about undecodable bodies now.
fn first_undecodable_warning(server: std::net::SocketAddr) -> bool {
    first_warning(server, "undecodable_body")
}

/// Blind spots already warned about in this process: (what, reason), one WARN each. The
/// kinds and reasons are fixed label sets, so this stays small.
static BLIND_SPOTS_WARNED: std::sync::Mutex<std::collections::BTreeSet<(&str, &str)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Whether blind spot `what` with `reason` gets its one warning now.
fn first_blind_spot(what: &'static str, reason: &'static str) -> bool {
    let Ok(mut warned) = BLIND_SPOTS_WARNED.lock() else {
        return false;
    };
    warned.insert((what, reason))
}

/// The one WARN of a blind spot that hides traffic (a gap, an eviction, a limit, an answer
/// that cannot be paired or read): what it means and where it is counted. Later ones are
/// DEBUG lines and counts.
fn warn_blind_spot(t: &Telemetry) -> bool {
    let (what, reason, meaning) = match t {
        Telemetry::TcpGap { reason, .. } => (
            "tcp_gaps",
            reason.as_str(),
            "TCP bytes were lost to mcptap: HTTP messages crossing them are not seen (counted in mcptap_tcp_gaps_total)",
        ),
        Telemetry::FlowEvicted { reason } if reason.as_str() != "idle" => (
            "flows_evicted",
            reason.as_str(),
            "connections were dropped while still tracked: what they carry next is not seen (counted in mcptap_flows_evicted_total; raise limits.max_flows or limits.memory_budget_bytes)",
        ),
        Telemetry::LimitHit { limit } => (
            "limits_hit",
            limit.as_str(),
            "a limit was hit: what it bounds is cut short (counted in mcptap_limits_hit_total; the README's metrics table says what each limit drops)",
        ),
        Telemetry::ExchangeAbandoned { reason } => (
            "exchanges_abandoned",
            reason.as_str(),
            "requests could not be paired with their responses: their answers are not seen (counted in mcptap_http_exchanges_abandoned_total)",
        ),
        Telemetry::HttpError { reason } => (
            "http_parse_errors",
            reason.as_str(),
            "HTTP messages could not be read as sent (counted in mcptap_http_parse_errors_total)",
        ),
        Telemetry::JsonRpcError { reason } => (
            "jsonrpc_parse_errors",
            reason.as_str(),
            "MCP bodies could not be read as JSON-RPC (counted in mcptap_jsonrpc_parse_errors_total)",
        ),
        Telemetry::FleetGarbage => (
            "fleet_lookups",
            "garbage",
            "fleet store records could not be read (another version's, larger than 1 MiB, not text, or tampered with): those sessions go on with the local view (counted in mcptap_fleet_lookups_total{result=\"garbage\"})",
        ),
        _ => return false,
    };
    if !first_blind_spot(what, reason) {
        return false;
    }
    tracing::warn!(target: "mcptap::blind_spot", what, reason, "{meaning}; warned once per reason");
    true
}

pub fn log_telemetry(t: &Telemetry) {
    if warn_blind_spot(t) {
        return;
    }
    match t {
        Telemetry::UndecodableFlow { server, reason } => {
            if first_warning(*server, reason.as_str()) {
                tracing::warn!(
                    target: "mcptap_core::http",
                    server = %server,
                    reason = reason.as_str(),
                    "connections to this server are not HTTP/1.1 and are not decoded (capture the plaintext leg; counted in mcptap_undecodable_flows_total; warned once per server)"
                )
            } else {
                tracing::debug!(target: "mcptap_core::http", server = %server, reason = reason.as_str(), "undecodable connection")
            }
        }
        Telemetry::UndecodableBody { server, reason } => {
            if first_undecodable_warning(*server) {
                tracing::warn!(
                    target: "mcptap_core::http",
                    server = %server,
                    reason = reason.as_str(),
                    "bodies from this server cannot be decoded: its answers are not seen (counted in mcptap_undecodable_bodies_total; warned once per server)"
                )
            } else {
                tracing::debug!(target: "mcptap_core::http", server = %server, reason = reason.as_str(), "undecodable body")
            }
        }
        Telemetry::FramingAnomaly { reason } => {
            tracing::debug!(target: "mcptap_core::http", reason = reason.as_str(), "lenient HTTP framing")
        }
        Telemetry::DuplicateHeader { server, header } => {
            tracing::debug!(target: "mcptap_core::http", server = %server, header = header.as_str(), "duplicate header")
        }
        Telemetry::TcpGap { reason, bytes } => {
            tracing::debug!(target: "mcptap::tcp", reason = reason.as_str(), bytes, "reassembly gap")
        }
        Telemetry::TcpOverlap { conflicting: true } => {
            tracing::debug!(target: "mcptap::tcp", "overlapping segment with different bytes")
        }
        Telemetry::HttpError { reason } => {
            tracing::debug!(target: "mcptap_core::http", reason = reason.as_str(), "HTTP parse error")
        }
        Telemetry::JsonRpcError { reason } => {
            tracing::debug!(target: "mcptap_core::jsonrpc", reason = reason.as_str(), "JSON-RPC parse error")
        }
        Telemetry::FlowEvicted { reason } => {
            tracing::debug!(target: "mcptap::flow", reason = reason.as_str(), "flow evicted")
        }
        Telemetry::LimitHit { limit } => {
            tracing::debug!(target: "mcptap::limit", limit = limit.as_str(), "limit hit")
        }
        Telemetry::ClockJump { ahead_ns, followed } => {
            let ahead_secs = *ahead_ns as f64 / 1e9;
            if *followed {
                tracing::info!(target: "mcptap::clock", ahead_secs, "packets resumed after a gap (a quiet link, or a gap in the capture): the packet clock followed them")
            } else {
                tracing::warn!(target: "mcptap::clock", ahead_secs, "packet stamped far ahead of the packets around it: ignored for time-outs")
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcptap_core::model::{Divergence, DivergenceReason, EmptyReason, EmptyResult, StreamEnd};

    /// A fleet store record that cannot be read is warned about once (and counted each time).
    #[test]
    fn unreadable_fleet_records_are_warned_about_once() {
        assert!(warn_blind_spot(&Telemetry::FleetGarbage));
        assert!(!warn_blind_spot(&Telemetry::FleetGarbage));
    }

    /// An operator greps the log for what the events say: `mode_contradiction`, not the Rust
    /// name `ModeContradiction`; and a divergence names its tool.
    #[test]
    fn alert_lines_use_the_events_names() {
        let divergence = AlertKind::ContentTypeDivergence(Divergence {
            method: "tools/call".into(),
            request_id: 6.into(),
            tool: Some("search_docs".into()),
            expected: "text/event-stream".into(),
            observed: "application/json".into(),
            reason: DivergenceReason::ModeContradiction,
            also: Vec::new(),
        });
        assert_eq!(
            alert_detail(&divergence),
            "tools/call tool=search_docs id=6 expected text/event-stream observed application/json (mode_contradiction)"
        );
        for (end, name) in [
            (StreamEnd::FinalChunk, "final_chunk"),
            (StreamEnd::ServerClosed, "server_closed"),
        ] {
            let empty = AlertKind::EmptyToolResult(EmptyResult {
                request_id: 3.into(),
                tool: Some("search_docs".into()),
                reason: EmptyReason::NoEvents,
                sse_events: 0,
                ended_by: end,
            });
            assert_eq!(
                alert_detail(&empty),
                format!(
                    "tools/call id=3 tool=search_docs stream ended ({name}) without a response: no_events"
                )
            );
            assert_eq!(serde_json::to_value(end).expect("json"), name);
        }
        // A name with a line break in it cannot forge a line of its own.
        let forged = AlertKind::EmptyToolResult(EmptyResult {
            request_id: 4.into(),
            tool: Some("x\n2026-01-01T00:00:00Z  INFO all clear".into()),
            reason: EmptyReason::NoEvents,
            sse_events: 0,
            ended_by: StreamEnd::FinalChunk,
        });
        let line = alert_detail(&forged);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains(r#"tool="x\n2026"#), "{line}");
        for r in [
            DivergenceReason::ModeContradiction,
            DivergenceReason::StreamingNegotiated,
            DivergenceReason::NotAccepted,
        ] {
            assert_eq!(serde_json::to_value(r).expect("json"), r.as_str());
        }
    }
}
