//! End-of-run summary for `mcptap replay`.

use crate::event::{AlertKind, Event, Telemetry};
use crate::mcp::Output;
use crate::pipeline::PacketStats;
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
}

impl Summary {
    pub fn observe(&mut self, output: &Output) {
        match output {
            Output::Event(Event::Handshake(_)) => self.handshakes += 1,
            Output::Event(Event::Exchange(_)) => self.exchanges += 1,
            Output::Event(Event::Alert(a)) => *self.alerts.entry(a.kind.as_str()).or_default() += 1,
            Output::Event(Event::SessionEnd(_)) => {}
            Output::Telemetry(Telemetry::FlowOpened) => self.flows += 1,
            Output::Telemetry(Telemetry::SessionStarted { .. }) => self.sessions += 1,
            Output::Telemetry(Telemetry::TcpGap { bytes, .. }) => {
                self.gaps += 1;
                self.gap_bytes += bytes;
            }
            Output::Telemetry(Telemetry::HttpError { .. }) => self.http_errors += 1,
            Output::Telemetry(Telemetry::JsonRpcError { .. }) => self.jsonrpc_errors += 1,
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
    }

    pub fn total_alerts(&self) -> u64 {
        self.alerts.values().sum()
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
