//! End-of-run summary for `mcptap replay`.

use mcptap_core::model::Output;
use mcptap_core::model::{AlertKind, Event, SchemaVersion, Telemetry, Timestamp};
use mcptap_core::pipeline::PacketStats;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub flows: u64,
    pub sessions: u64,
    pub handshakes: u64,
    pub exchanges: u64,
    pub alerts: BTreeMap<&'static str, u64>,
    pub gaps: u64,
    pub gap_bytes: u64,
    pub http_errors: u64,
    pub jsonrpc_errors: u64,
    /// Flows evicted, by reason (`idle`, `flow_limit`, `memory`).
    pub flows_evicted: BTreeMap<&'static str, u64>,
    /// Sessions ended, by reason (`deleted`, `expired`, `idle`, `evicted`).
    pub sessions_ended: BTreeMap<&'static str, u64>,
    /// Bounds of the session layer that refused or cut something, by limit.
    pub limits_hit: BTreeMap<&'static str, u64>,
    /// Clock jumps: packets stamped far ahead and refused, one each, and gaps the clock
    /// followed, one each.
    pub clock_jumps: u64,
    /// Empty results still waiting for their stream's resumption when the input ended.
    pub resumptions_unresolved: u64,
    /// Connections not decoded because they carry something else than HTTP/1.1, by reason.
    pub undecodable_flows: BTreeMap<&'static str, u64>,
    /// HTTP framing decoded leniently or ignored (bare LF, empty lines, ...).
    pub framing_anomalies: u64,
    /// Duplicated headers that peers read differently.
    pub duplicate_headers: u64,
    /// Kept bodies whose coding could not be decoded.
    pub undecodable_bodies: u64,
    /// Capture file bytes skipped over corrupt record lengths (set by the reader's report).
    pub capture_bytes_skipped: u64,
}

/// The totals as an event (`summary` at the end of a replay or run, `stats` every
/// `events.stats_interval_secs` while live), so that whatever is built from the events alone can
/// show the blind spots as well as what was seen. Counters are totals since the start.
#[derive(Debug, Serialize)]
pub struct TotalsEvent<'a> {
    pub event: &'static str,
    pub v: SchemaVersion,
    /// The last packet's time (the first packet's, `first_ts`).
    pub ts: Option<Timestamp>,
    pub first_ts: Option<Timestamp>,
    /// Always null: like every event, these have the field; they belong to no session.
    pub session_id: Option<&'static str>,
    pub packets: u64,
    pub bytes: u64,
    pub flows: u64,
    pub sessions: u64,
    pub handshakes: u64,
    pub exchanges: u64,
    pub alerts: &'a BTreeMap<&'static str, u64>,
    pub gaps: u64,
    pub gap_bytes: u64,
    /// Packets the kernel or interface dropped (live capture only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_drops: Option<u64>,
    pub http_errors: u64,
    pub jsonrpc_errors: u64,
    pub packets_skipped: BTreeMap<&'static str, u64>,
    pub truncated_segments: u64,
    pub flows_evicted: &'a BTreeMap<&'static str, u64>,
    pub sessions_ended: &'a BTreeMap<&'static str, u64>,
    pub limits_hit: &'a BTreeMap<&'static str, u64>,
    pub clock_jumps: u64,
    pub undecodable_flows: &'a BTreeMap<&'static str, u64>,
    pub undecodable_bodies: u64,
    pub framing_anomalies: u64,
    pub duplicate_headers: u64,
    pub capture_bytes_skipped: u64,
    pub resumptions_unresolved: u64,
}

/// First and last packet time seen.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TimeSpan {
    pub first: Option<Timestamp>,
    pub last: Option<Timestamp>,
}

impl TimeSpan {
    pub fn see(&mut self, ts: Timestamp) {
        if self.first.is_none_or(|f| ts < f) {
            self.first = Some(ts);
        }
        if self.last.is_none_or(|l| ts > l) {
            self.last = Some(ts);
        }
    }

    pub fn merge(&mut self, other: TimeSpan) {
        for ts in [other.first, other.last].into_iter().flatten() {
            self.see(ts);
        }
    }
}

impl Summary {
    /// This summary as a `summary` or `stats` event.
    pub fn totals_event<'a>(
        &'a self,
        event: &'static str,
        stats: &PacketStats,
        span: TimeSpan,
        capture_drops: Option<u64>,
    ) -> TotalsEvent<'a> {
        TotalsEvent {
            event,
            v: SchemaVersion,
            ts: span.last,
            first_ts: span.first,
            session_id: None,
            packets: stats.packets,
            bytes: stats.bytes,
            flows: self.flows,
            sessions: self.sessions,
            handshakes: self.handshakes,
            exchanges: self.exchanges,
            alerts: &self.alerts,
            gaps: self.gaps,
            gap_bytes: self.gap_bytes,
            capture_drops,
            http_errors: self.http_errors,
            jsonrpc_errors: self.jsonrpc_errors,
            packets_skipped: stats
                .skipped()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            truncated_segments: stats.truncated_segments,
            flows_evicted: &self.flows_evicted,
            sessions_ended: &self.sessions_ended,
            limits_hit: &self.limits_hit,
            clock_jumps: self.clock_jumps,
            undecodable_flows: &self.undecodable_flows,
            undecodable_bodies: self.undecodable_bodies,
            framing_anomalies: self.framing_anomalies,
            duplicate_headers: self.duplicate_headers,
            capture_bytes_skipped: self.capture_bytes_skipped,
            resumptions_unresolved: self.resumptions_unresolved,
        }
    }

    pub fn observe(&mut self, output: &Output) {
        match output {
            Output::Shared(_) => {}
            Output::Event(Event::Handshake(_)) => self.handshakes += 1,
            Output::Event(Event::Exchange(_)) => self.exchanges += 1,
            Output::Event(Event::Alert(a)) => *self.alerts.entry(a.kind.as_str()).or_default() += 1,
            Output::Event(Event::SessionEnd(e)) => {
                *self.sessions_ended.entry(e.reason.as_str()).or_default() += 1
            }
            Output::Telemetry(Telemetry::FlowOpened) => self.flows += 1,
            Output::Telemetry(Telemetry::FlowEvicted { reason }) => {
                *self.flows_evicted.entry(reason.as_str()).or_default() += 1
            }
            Output::Telemetry(Telemetry::SessionStarted { .. }) => self.sessions += 1,
            Output::Telemetry(Telemetry::TcpGap { bytes, .. }) => {
                self.gaps += 1;
                self.gap_bytes += bytes;
            }
            Output::Telemetry(Telemetry::HttpError { .. }) => self.http_errors += 1,
            Output::Telemetry(Telemetry::JsonRpcError { .. }) => self.jsonrpc_errors += 1,
            Output::Telemetry(Telemetry::LimitHit { limit }) => {
                *self.limits_hit.entry(limit.as_str()).or_default() += 1
            }
            Output::Telemetry(Telemetry::ClockJump { .. }) => self.clock_jumps += 1,
            Output::Telemetry(Telemetry::ResumptionUnresolved { .. }) => {
                self.resumptions_unresolved += 1
            }
            Output::Telemetry(Telemetry::UndecodableFlow { reason, .. }) => {
                *self.undecodable_flows.entry(reason.as_str()).or_default() += 1
            }
            Output::Telemetry(Telemetry::FramingAnomaly { .. }) => self.framing_anomalies += 1,
            Output::Telemetry(Telemetry::DuplicateHeader { .. }) => self.duplicate_headers += 1,
            Output::Telemetry(Telemetry::UndecodableBody { .. }) => self.undecodable_bodies += 1,
            Output::Telemetry(_) => {}
        }
    }

    /// Adds another worker's summary.
    pub fn merge(&mut self, other: &Summary) {
        self.flows += other.flows;
        self.sessions += other.sessions;
        self.handshakes += other.handshakes;
        self.exchanges += other.exchanges;
        for (k, v) in &other.alerts {
            *self.alerts.entry(k).or_default() += v;
        }
        self.gaps += other.gaps;
        self.gap_bytes += other.gap_bytes;
        self.http_errors += other.http_errors;
        self.jsonrpc_errors += other.jsonrpc_errors;
        self.framing_anomalies += other.framing_anomalies;
        self.duplicate_headers += other.duplicate_headers;
        self.undecodable_bodies += other.undecodable_bodies;
        self.capture_bytes_skipped += other.capture_bytes_skipped;
        for (k, v) in &other.flows_evicted {
            *self.flows_evicted.entry(k).or_default() += v;
        }
        for (k, v) in &other.sessions_ended {
            *self.sessions_ended.entry(k).or_default() += v;
        }
        for (k, v) in &other.limits_hit {
            *self.limits_hit.entry(k).or_default() += v;
        }
        self.clock_jumps += other.clock_jumps;
        self.resumptions_unresolved += other.resumptions_unresolved;
        for (k, v) in &other.undecodable_flows {
            *self.undecodable_flows.entry(k).or_default() += v;
        }
    }

    pub fn total_alerts(&self) -> u64 {
        self.alerts.values().sum()
    }

    /// The summary on standard error, after the log lines that wait: [`Summary::render`]'s
    /// lines, or with JSON logs one record whose fields are the events file's `summary`
    /// totals.
    pub fn say(&self, stats: &PacketStats, span: TimeSpan, elapsed: Duration) {
        use crate::sink::log_writer;
        if !log_writer::json_records() {
            log_writer::say("INFO", format_args!("{}", self.render(stats, elapsed)));
            return;
        }
        let totals = serde_json::to_value(self.totals_event("summary", stats, span, None));
        let mut fields = serde_json::Map::new();
        fields.insert("message".into(), "summary".into());
        if let Ok(serde_json::Value::Object(totals)) = totals {
            for (k, v) in totals {
                if !matches!(k.as_str(), "event" | "v" | "session_id") && !v.is_null() {
                    fields.insert(k, v);
                }
            }
        }
        fields.insert("elapsed_secs".into(), elapsed.as_secs_f64().into());
        log_writer::say_record("INFO", fields);
    }

    /// A few lines for standard error.
    pub fn render(&self, stats: &PacketStats, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "mcptap summary: {} packets, {} bytes, {} flows, {} sessions, {} handshakes, {} exchanges",
            stats.packets, stats.bytes, self.flows, self.sessions, self.handshakes, self.exchanges
        );
        let alerts = if self.alerts.is_empty() {
            "none".to_string()
        } else {
            AlertKind::ALL
                .iter()
                .filter_map(|k| self.alerts.get(k).map(|n| format!("{k}={n}")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(s, "  alerts: {alerts}");
        let skipped: Vec<String> = stats
            .skipped()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        let _ = writeln!(
            s,
            "  gaps: {} ({} bytes), http parse errors: {}, json-rpc parse errors: {}, packets skipped: {}",
            self.gaps,
            self.gap_bytes,
            self.http_errors,
            self.jsonrpc_errors,
            if skipped.is_empty() {
                "0".to_string()
            } else {
                skipped.join(" ")
            }
        );
        let counts = |m: &BTreeMap<&'static str, u64>| {
            if m.is_empty() {
                "0".to_string()
            } else {
                m.iter()
                    .map(|(k, n)| format!("{k}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        let _ = writeln!(
            s,
            "  flows evicted: {}, sessions ended: {}",
            counts(&self.flows_evicted),
            counts(&self.sessions_ended)
        );
        let _ = writeln!(
            s,
            "  limits hit: {}, clock jumps: {}, segments cut by the snaplen: {}",
            counts(&self.limits_hit),
            self.clock_jumps,
            stats.truncated_segments
        );
        let _ = writeln!(
            s,
            "  connections not decoded (not HTTP/1.1): {}",
            counts(&self.undecodable_flows)
        );
        if self.resumptions_unresolved > 0 {
            let _ = writeln!(
                s,
                "  empty results still waiting for a resumed stream when the input ended (no alert): {}",
                self.resumptions_unresolved
            );
        }
        if self.framing_anomalies + self.duplicate_headers + self.undecodable_bodies > 0 {
            let _ = writeln!(
                s,
                "  http framing anomalies: {}, duplicate headers: {}, undecodable bodies: {}",
                self.framing_anomalies, self.duplicate_headers, self.undecodable_bodies
            );
        }
        if self.capture_bytes_skipped > 0 {
            let _ = writeln!(
                s,
                "  capture bytes skipped over corrupt record lengths: {}",
                self.capture_bytes_skipped
            );
        }
        let _ = write!(
            s,
            "  elapsed: {:.3} s, {:.1} MB/s, {:.0} packets/s",
            secs,
            stats.bytes as f64 / 1e6 / secs,
            stats.packets as f64 / secs
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcptap_core::model::{EndReason, SessionEnd, Timestamp};

    #[test]
    fn evictions_are_counted_by_reason_and_rendered() {
        let mut sum = Summary::default();
        use mcptap_core::model::FlowEvictReason::{FlowLimit, Memory};
        for reason in [FlowLimit, FlowLimit, Memory] {
            sum.observe(&Output::Telemetry(Telemetry::FlowEvicted { reason }));
        }
        let end = |reason| {
            Output::Event(Event::SessionEnd(SessionEnd {
                v: Default::default(),
                lineage_id: None,
                ts: Timestamp(0),
                session_id: Some("s".into()),
                server: "10.0.0.1:8080".parse().unwrap(),
                reason,
                handshakes: 1,
                requests: 0,
                alerts: 0,
            }))
        };
        sum.observe(&end(EndReason::Evicted));
        sum.observe(&end(EndReason::Deleted));
        let mut total = Summary::default();
        total.merge(&sum);
        total.merge(&sum);
        let text = total.render(&PacketStats::default(), Duration::from_secs(1));
        assert!(
            text.contains(
                "flows evicted: flow_limit=4 memory=2, sessions ended: deleted=2 evicted=2"
            ),
            "{text}"
        );
        let empty = Summary::default().render(&PacketStats::default(), Duration::from_secs(1));
        assert!(
            empty.contains("flows evicted: 0, sessions ended: 0"),
            "{empty}"
        );
    }
}
