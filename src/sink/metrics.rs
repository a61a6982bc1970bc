//! Prometheus metrics from pipeline outputs.
//!
//! Every output becomes a counter increment here. Labels stay low-cardinality: `server` is the
//! server address (or an operator-given name), capped with an `other` bucket; methods outside
//! the MCP set are `other`; session and request ids are never labels.

use mcptap_core::mcp::caps::scope;
use mcptap_core::model::Output;
use mcptap_core::model::{
    AbandonReason, AlertKind, Era, Event, FramingAnomaly, HandshakeSource, HttpError, Limit,
    Telemetry, UndecodableFlowReason, UndecodableReason, method_label,
};
use mcptap_core::pipeline::PacketStats;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Mutex;

/// HTTP statuses that get their own `status` label value: the codes MCP servers, gateways and
/// proxies answer with. Any other code is bucketed by its class (`1xx` … `5xx`) or `other`, so
/// one server cannot mint 900 series.
const KNOWN_STATUSES: &[u16] = &[
    100, 101, 200, 201, 202, 204, 206, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 406,
    408, 409, 410, 411, 412, 413, 414, 415, 421, 422, 426, 428, 429, 431, 500, 501, 502, 503, 504,
];

/// The `status` label of an HTTP response.
pub fn status_label(status: u16) -> std::borrow::Cow<'static, str> {
    const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
    if KNOWN_STATUSES.contains(&status) {
        return status.to_string().into();
    }
    match usize::from(status / 100).checked_sub(1) {
        Some(class) => CLASSES.get(class).copied().unwrap_or("other").into(),
        None => "other".into(),
    }
}

/// Maps server addresses to bounded label values.
#[derive(Debug)]
struct ServerLabels {
    names: HashMap<SocketAddr, String>,
    seen: HashMap<SocketAddr, String>,
    /// Distinct labels handed out (names count once however many endpoints share them).
    labels: usize,
    max: usize,
}

/// Operator settings for the `server` label.
#[derive(Debug, Clone, Default)]
pub struct LabelConfig {
    /// Display names for known servers.
    pub server_names: HashMap<SocketAddr, String>,
    /// Distinct `server` values before new servers fall into `other`.
    pub max_servers: usize,
}

pub struct Metrics {
    registry: Registry,
    servers: Mutex<ServerLabels>,
    packets: IntCounter,
    bytes: IntCounter,
    events_lost: IntCounter,
    packets_skipped: IntCounterVec,
    capture_drops: IntCounterVec,
    flows_active: IntGauge,
    flows_opened: IntCounter,
    flows_evicted: IntCounterVec,
    flows_closed: IntCounterVec,
    tcp_gaps: IntCounterVec,
    tcp_gap_bytes: IntCounter,
    tcp_overlaps: IntCounterVec,
    http_parse_errors: IntCounterVec,
    http_framing_anomalies: IntCounterVec,
    http_exchanges_abandoned: IntCounterVec,
    duplicate_headers: IntCounterVec,
    undecodable_bodies: IntCounterVec,
    undecodable_flows: IntCounterVec,
    http_responses: IntCounterVec,
    jsonrpc_parse_errors: IntCounterVec,
    limits_hit: IntCounterVec,
    clock_jumps: IntCounterVec,
    segments_truncated: IntCounter,
    resumptions_unresolved: IntCounterVec,
    sessions_active: IntGaugeVec,
    sessions_started: IntCounterVec,
    sessions_ended: IntCounterVec,
    handshakes: IntCounterVec,
    requests: IntCounterVec,
    responses: IntCounterVec,
    tool_calls: IntCounterVec,
    alerts: IntCounterVec,
    capability_changes: IntCounterVec,
    near_misses: IntCounterVec,
    lineage_losses: IntCounterVec,
    empty_tool_results: IntCounterVec,
    empty_tool_content: IntCounterVec,
    header_mismatches: IntCounterVec,
    declarations_repeated: IntCounterVec,
    client_capability_losses: IntCounterVec,
    input_required_abandoned: IntCounterVec,
    proxy_headers: IntCounterVec,
    lineages_ended: IntCounterVec,
    snapshots: IntCounterVec,
    fleet_lookups: IntCounterVec,
    fleet_errors: IntCounterVec,
    fleet_up: prometheus::IntGauge,
    request_duration: HistogramVec,
    worker_queue: IntGaugeVec,
    memory: IntGaugeVec,
    capture_waits: IntCounterVec,
    pipeline_lag: prometheus::Histogram,
    server_directory: DirectoryMetrics,
    metrics_endpoint_errors: IntCounterVec,
}

/// The capture threads' server directories (live sharding by server endpoint).
struct DirectoryMetrics {
    entries: IntGaugeVec,
    evictions: IntCounterVec,
}

impl DirectoryMetrics {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        let d = DirectoryMetrics {
            entries: gauge_vec(
                r,
                "mcptap_server_directory_entries",
                "Server endpoints learned from SYN/SYN-ACK and midstream flows pinned, held by the capture threads for sharding.",
                &["kind"],
            )?,
            evictions: counter_vec(
                r,
                "mcptap_server_directory_evictions_total",
                "Learned server endpoints and pinned midstream flows evicted from the capture threads' bounded sets.",
                &["kind"],
            )?,
        };
        for kind in ["learned_server", "pinned_flow"] {
            d.entries.with_label_values(&[kind]);
            d.evictions.with_label_values(&[kind]);
        }
        Ok(d)
    }
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    pub fn new(labels: LabelConfig) -> prometheus::Result<Self> {
        let r = Registry::new();
        let build = IntGaugeVec::new(
            Opts::new("mcptap_build_info", "Build information; always 1."),
            &["version"],
        )?;
        r.register(Box::new(build.clone()))?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let flows_active = IntGauge::new("mcptap_flows_active", "TCP flows currently tracked.")?;
        r.register(Box::new(flows_active.clone()))?;
        let buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "mcptap_request_duration_seconds",
                "Time from a JSON-RPC request to its response, by method.",
            )
            .buckets(buckets),
            &["server", "method"],
        )?;
        r.register(Box::new(request_duration.clone()))?;
        let worker_queue = gauge_vec(
            &r,
            "mcptap_worker_queue_batches",
            "Batches of packets waiting in a pipeline worker's queue (up to 512 packets each).",
            &["worker"],
        )?;
        let memory = gauge_vec(
            &r,
            "mcptap_memory_bytes",
            "Estimated bytes the pipelines hold: part=\"flows\" and part=\"sessions\" are charged against limits.memory_budget_bytes; part=\"staged\" is decoded input waiting between a worker's threads, bounded by their queues and not charged (evicting flows would not free it).",
            &["part"],
        )?;
        let capture_waits = counter_vec(
            &r,
            "mcptap_capture_waited_packets_total",
            "Packets whose batch found a pipeline worker's queue full: the capture thread waited for the worker (the kernel buffer absorbs the wait; what it cannot is in mcptap_capture_drops_total).",
            &["worker"],
        )?;
        let pipeline_lag = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "mcptap_pipeline_lag_seconds",
                "Live: from a batch's last packet on the wire (its capture timestamp) to its events written.",
            )
            .buckets(vec![
                0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )?;
        r.register(Box::new(pipeline_lag.clone()))?;
        let m = Metrics {
            packets: counter(&r, "mcptap_packets_total", "Packets seen.")?,
            bytes: counter(&r, "mcptap_bytes_total", "Bytes of captured frames seen.")?,
            events_lost: counter(
                &r,
                "mcptap_events_lost_total",
                "Events the events file refused (a write error such as a full disk): lost.",
            )?,
            packets_skipped: counter_vec(
                &r,
                "mcptap_packets_skipped_total",
                "Packets not analysed, by reason.",
                &["reason"],
            )?,
            capture_drops: counter_vec(
                &r,
                "mcptap_capture_drops_total",
                "Packets dropped before mcptap saw them (pcap_stats), by source.",
                &["source"],
            )?,
            flows_active,
            flows_opened: counter(&r, "mcptap_flows_opened_total", "TCP flows opened.")?,
            flows_evicted: counter_vec(
                &r,
                "mcptap_flows_evicted_total",
                "TCP flows evicted, by reason.",
                &["reason"],
            )?,
            flows_closed: counter_vec(
                &r,
                "mcptap_flows_closed_total",
                "TCP flows closed by FIN or RST.",
                &["reason"],
            )?,
            tcp_gaps: counter_vec(
                &r,
                "mcptap_tcp_gaps_total",
                "Reassembly gaps declared, by reason.",
                &["reason"],
            )?,
            tcp_gap_bytes: counter(
                &r,
                "mcptap_tcp_gap_bytes_total",
                "Stream bytes lost in reassembly gaps.",
            )?,
            tcp_overlaps: counter_vec(
                &r,
                "mcptap_tcp_overlaps_total",
                "Retransmitted or overlapping TCP segments, by whether their bytes differed.",
                &["kind"],
            )?,
            http_parse_errors: counter_vec(
                &r,
                "mcptap_http_parse_errors_total",
                "HTTP parse errors and limits hit, by reason.",
                &["reason"],
            )?,
            http_framing_anomalies: counter_vec(
                &r,
                "mcptap_http_framing_anomalies_total",
                "HTTP framing a strict peer rejects, decoded leniently, or ignored, by reason.",
                &["reason"],
            )?,
            http_exchanges_abandoned: counter_vec(
                &r,
                "mcptap_http_exchanges_abandoned_total",
                "Requests HTTP gave up pairing with a response, by reason.",
                &["reason"],
            )?,
            duplicate_headers: counter_vec(
                &r,
                "mcptap_duplicate_headers_total",
                "Headers that peers read differently, seen more than once in one head.",
                &["server", "header"],
            )?,
            undecodable_bodies: counter_vec(
                &r,
                "mcptap_undecodable_bodies_total",
                "MCP bodies whose content or transfer coding could not be decoded, by reason.",
                &["server", "reason"],
            )?,
            undecodable_flows: counter_vec(
                &r,
                "mcptap_undecodable_flows_total",
                "Connections that carry something other than HTTP/1.1 (tls, h2c, websocket, upgrade, not_http): not decoded.",
                &["server", "reason"],
            )?,
            http_responses: counter_vec(
                &r,
                "mcptap_http_responses_total",
                "HTTP responses to MCP requests, by status.",
                &["server", "status"],
            )?,
            jsonrpc_parse_errors: counter_vec(
                &r,
                "mcptap_jsonrpc_parse_errors_total",
                "JSON-RPC payloads that could not be used, by reason.",
                &["reason"],
            )?,
            limits_hit: counter_vec(
                &r,
                "mcptap_limits_hit_total",
                "Inputs refused by a configured limit, by limit.",
                &["limit"],
            )?,
            resumptions_unresolved: counter_vec(
                &r,
                "mcptap_resumptions_unresolved_total",
                "Empty results that waited for their SSE stream's resumption and could not be concluded (input ended or session evicted inside the window).",
                &["server"],
            )?,
            segments_truncated: counter(
                &r,
                "mcptap_segments_truncated_total",
                "TCP segments the capture's snaplen cut short; their missing bytes are counted as gaps (reason snaplen).",
            )?,
            clock_jumps: counter_vec(
                &r,
                "mcptap_clock_jumps_total",
                "Packets stamped more than clock_jump_secs ahead of the packet clock; followed=true when several in a row moved it.",
                &["followed"],
            )?,
            sessions_active: gauge_vec(
                &r,
                "mcptap_sessions_active",
                "MCP sessions currently tracked.",
                &["server"],
            )?,
            sessions_started: counter_vec(
                &r,
                "mcptap_sessions_started_total",
                "MCP sessions first seen, by whether a handshake was seen.",
                &["server", "baseline"],
            )?,
            sessions_ended: counter_vec(
                &r,
                "mcptap_sessions_ended_total",
                "MCP sessions ended, by reason.",
                &["server", "reason"],
            )?,
            handshakes: counter_vec(
                &r,
                "mcptap_handshakes_total",
                "Handshakes and declarations, by outcome, kind (initial, reinitialize: initialize; declaration: a modern request's _meta capability set first seen; discover: a server/discover result first seen or changed) and era.",
                &["server", "outcome", "kind", "era"],
            )?,
            requests: counter_vec(
                &r,
                "mcptap_requests_total",
                "JSON-RPC requests, by method and era.",
                &["server", "method", "era"],
            )?,
            responses: counter_vec(
                &r,
                "mcptap_responses_total",
                "JSON-RPC requests answered or ended, by method and media type.",
                &["server", "method", "media_type"],
            )?,
            tool_calls: counter_vec(
                &r,
                "mcptap_tool_calls_total",
                "tools/call answers, by media type.",
                &["server", "media_type"],
            )?,
            alerts: counter_vec(
                &r,
                "mcptap_alerts_total",
                "Alerts raised, by kind and era.",
                &["server", "kind", "era"],
            )?,
            capability_changes: counter_vec(
                &r,
                "mcptap_capability_changes_total",
                "Capability scopes lost or gained on re-initialize, by side.",
                &["server", "direction", "side", "scope"],
            )?,
            near_misses: counter_vec(
                &r,
                "mcptap_client_capability_near_misses_total",
                "Re-initializes where the client declared less but the server kept its answer.",
                &["server"],
            )?,
            lineage_losses: counter_vec(
                &r,
                "mcptap_lineage_capability_losses_total",
                "Capability paths lost by a client's new session against its predecessor.",
                &["server"],
            )?,
            empty_tool_results: counter_vec(
                &r,
                "mcptap_empty_tool_results_total",
                "tools/call SSE streams that ended without the response, by reason.",
                &["server", "reason"],
            )?,
            empty_tool_content: counter_vec(
                &r,
                "mcptap_empty_tool_content_total",
                "tools/call results with empty content and no structuredContent.",
                &["server"],
            )?,
            header_mismatches: counter_vec(
                &r,
                "mcptap_header_mismatches_total",
                "Modern requests whose Mcp-Method, Mcp-Name, MCP-Protocol-Version or Mcp-Param-* header disagreed with the body, whether or not the server rejected them.",
                &["server", "header"],
            )?,
            declarations_repeated: counter_vec(
                &r,
                "mcptap_declarations_repeated_total",
                "Capability sets (modern _meta, server/discover) declared again: counted, not logged.",
                &["server"],
            )?,
            client_capability_losses: counter_vec(
                &r,
                "mcptap_client_capability_losses_total",
                "Modern declarations that lost capability paths against the method's first declaration (alerted or not).",
                &["server"],
            )?,
            input_required_abandoned: counter_vec(
                &r,
                "mcptap_input_required_abandoned_total",
                "InputRequiredResults their lineage did not retry within the lineage window.",
                &["server"],
            )?,
            proxy_headers: counter_vec(
                &r,
                "mcptap_proxy_headers_total",
                "Connections that opened with a PROXY protocol header, by whether it named a client (named) or not (UNKNOWN, LOCAL).",
                &["server", "source"],
            )?,
            lineages_ended: counter_vec(
                &r,
                "mcptap_lineages_ended_total",
                "Client lineages without a session id (modern, legacy stateless) whose state was dropped, by reason (idle, evicted).",
                &["server", "reason"],
            )?,
            snapshots: counter_vec(
                &r,
                "mcptap_state_snapshots_total",
                "Snapshot file loads and saves, by result: ok, io (cannot read or write), garbage (not a snapshot), version (another format version), timeout (workers did not answer in time).",
                &["op", "result"],
            )?,
            fleet_lookups: counter_vec(
                &r,
                "mcptap_fleet_lookups_total",
                "Fleet mode: first sightings of a session answered by the store, by result: found, absent (none stored, timed out or store down: the local view), garbage (a record that does not parse, is larger than 1 MiB or is not text).",
                &["result"],
            )?,
            fleet_errors: counter_vec(
                &r,
                "mcptap_fleet_errors_total",
                "Fleet store operations that failed, by op (lookup, write) and reason (connect, timeout, io): each went on with the local view.",
                &["op", "reason"],
            )?,
            fleet_up: {
                let g = prometheus::IntGauge::new(
                    "mcptap_fleet_up",
                    "1 while the fleet store answers (or no store is configured), 0 during an outage.",
                )?;
                r.register(Box::new(g.clone()))?;
                g.set(1);
                g
            },
            request_duration,
            worker_queue,
            memory,
            capture_waits,
            pipeline_lag,
            server_directory: DirectoryMetrics::new(&r)?,
            metrics_endpoint_errors: counter_vec(
                &r,
                "mcptap_metrics_endpoint_errors_total",
                "What the metrics endpoint did to protect itself: accept failures at the descriptor limit (fd_limit) or otherwise (accept_error), connections closed at the connection cap (connection_limit) or by a timeout (timeout).",
                &["reason"],
            )?,
            servers: Mutex::new(ServerLabels {
                names: labels.server_names,
                seen: HashMap::new(),
                labels: 0,
                max: labels.max_servers.max(1),
            }),
            registry: r,
        };
        for reason in ["idle", "flow_limit", "memory"] {
            m.flows_evicted.with_label_values(&[reason]);
        }
        for reason in ["fd_limit", "accept_error", "connection_limit", "timeout"] {
            m.metrics_endpoint_errors.with_label_values(&[reason]);
        }
        for source in ["kernel", "interface"] {
            m.capture_drops.with_label_values(&[source]);
        }
        for reason in ["buffer_limit", "closed", "timeout"] {
            m.tcp_gaps.with_label_values(&[reason]);
        }
        // Error series exist from the start, so dashboards show 0 rather than no data.
        for reason in HttpError::ALL {
            m.http_parse_errors.with_label_values(&[reason]);
        }
        for reason in FramingAnomaly::ALL {
            m.http_framing_anomalies.with_label_values(&[reason]);
        }
        for reason in AbandonReason::ALL {
            m.http_exchanges_abandoned.with_label_values(&[reason]);
        }
        for reason in ["invalid_json", "not_jsonrpc", "unmatched_response"] {
            m.jsonrpc_parse_errors.with_label_values(&[reason]);
        }
        // A limit's first hit is an increase, so that McptapLimitsHit sees it.
        for limit in Limit::ALL {
            m.limits_hit.with_label_values(&[limit.as_str()]);
        }
        Ok(m)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// The label for a server; the first time a label appears, its alert series start at 0 so
    /// that `increase()` sees the first alert.
    fn server(&self, addr: SocketAddr) -> String {
        let Ok(mut s) = self.servers.lock() else {
            return "other".into();
        };
        if let Some(l) = s.seen.get(&addr) {
            return l.clone();
        }
        let label = match s.names.get(&addr) {
            Some(name) => name.clone(),
            None if s.labels < s.max => addr.to_string(),
            // Past the cap nothing is remembered: a flood of endpoints costs no memory here.
            None => return "other".to_string(),
        };
        if !s.seen.values().any(|l| *l == label) {
            s.labels += 1;
        }
        s.seen.insert(addr, label.clone());
        drop(s);
        for kind in AlertKind::ALL {
            for era in Era::ALL {
                self.alerts.with_label_values(&[&label, kind, era.as_str()]);
            }
        }
        for reason in ["no_events", "only_priming", "only_notifications"] {
            self.empty_tool_results.with_label_values(&[&label, reason]);
        }
        // What mcptap cannot read of this server (McptapUndecodableTraffic).
        for reason in UndecodableFlowReason::ALL {
            self.undecodable_flows
                .with_label_values(&[&label, reason.as_str()]);
        }
        for reason in UndecodableReason::ALL {
            self.undecodable_bodies
                .with_label_values(&[&label, reason.as_str()]);
        }
        for (outcome, kind) in [
            ("accepted", "initial"),
            ("accepted", "reinitialize"),
            ("rejected", "initial"),
            ("rejected", "reinitialize"),
        ] {
            self.handshakes
                .with_label_values(&[&label, outcome, kind, Era::Legacy.as_str()]);
        }
        label
    }

    /// What the pipelines of the process hold, as their shared usage counts it.
    pub fn set_memory(&self, usage: &mcptap_core::usage::SharedUsage) {
        for (part, bytes) in [
            ("flows", usage.flow_bytes()),
            ("sessions", usage.session_bytes()),
            ("staged", usage.staged_bytes()),
        ] {
            self.memory
                .with_label_values(&[part])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// Adds what one pipeline counted since its previous report (`before`). Several pipelines
    /// (one per worker) report into the same counters.
    pub fn add_packet_stats(&self, now: &PacketStats, before: &PacketStats, flows_delta: i64) {
        self.flows_active.add(flows_delta);
        self.packets
            .inc_by(now.packets.saturating_sub(before.packets));
        self.bytes.inc_by(now.bytes.saturating_sub(before.bytes));
        self.segments_truncated.inc_by(
            now.truncated_segments
                .saturating_sub(before.truncated_segments),
        );
        for ((reason, n), (_, b)) in now.skipped().iter().zip(before.skipped().iter()) {
            self.packets_skipped
                .with_label_values(&[reason])
                .inc_by(n.saturating_sub(*b));
        }
    }

    /// A capture thread's server directory, against its previous report: `kind` is
    /// `learned_server` or `pinned_flow`; entries gained (or lost) and evictions since.
    pub fn add_server_directory(&self, kind: &str, entries_delta: i64, evicted: u64) {
        let d = &self.server_directory;
        d.entries.with_label_values(&[kind]).add(entries_delta);
        d.evictions.with_label_values(&[kind]).inc_by(evicted);
    }

    /// The metrics endpoint protected itself (`reason`: fd_limit, accept_error,
    /// connection_limit, timeout).
    pub fn add_metrics_endpoint_error(&self, reason: &str) {
        self.metrics_endpoint_errors
            .with_label_values(&[reason])
            .inc();
    }

    /// What a worker's fleet store did since it last reported.
    pub fn add_fleet(
        &self,
        now: &crate::fleet::FleetCounts,
        before: &crate::fleet::FleetCounts,
        up: bool,
    ) {
        for (op, n, b) in [
            ("lookup", &now.lookup_errors, &before.lookup_errors),
            ("write", &now.write_errors, &before.write_errors),
        ] {
            for (i, reason) in ["connect", "timeout", "io"].iter().enumerate() {
                let d = n[i].saturating_sub(b[i]);
                if d > 0 {
                    self.fleet_errors.with_label_values(&[op, reason]).inc_by(d);
                }
            }
        }
        self.fleet_up.set(i64::from(up));
    }

    /// Events the events file lost to write errors.
    pub fn add_events_lost(&self, n: u64) {
        self.events_lost.inc_by(n);
    }

    /// A snapshot file load or save and how it went.
    pub fn add_snapshot(&self, op: &str, result: &str) {
        self.snapshots.with_label_values(&[op, result]).inc();
    }

    /// Snapshots are saved: their save results exist at 0 from the start, so that the first
    /// failure is an increase (McptapSnapshotSaveFailing reads them).
    pub fn snapshots_saved(&self) {
        for result in ["ok", "io", "timeout"] {
            let _ = self.snapshots.with_label_values(&["save", result]);
        }
    }

    /// Drops reported by the capture (already widened from pcap's wrapping u32 counters).
    /// Worker `index`'s queue gauge and the counter of packets the capture waited with.
    pub fn worker_queue(&self, index: usize) -> (IntGauge, IntCounter) {
        let label = index.to_string();
        (
            self.worker_queue.with_label_values(&[label.as_str()]),
            self.capture_waits.with_label_values(&[label.as_str()]),
        )
    }

    pub fn observe_pipeline_lag(&self, seconds: f64) {
        self.pipeline_lag.observe(seconds);
    }

    pub fn add_capture_drops(&self, kernel: u64, interface: u64) {
        self.capture_drops
            .with_label_values(&["kernel"])
            .inc_by(kernel);
        self.capture_drops
            .with_label_values(&["interface"])
            .inc_by(interface);
    }

    pub fn observe(&self, output: &Output) {
        match output {
            Output::Event(e) => self.observe_event(e),
            Output::Telemetry(t) => self.observe_telemetry(t),
            Output::Shared(_) => {}
        }
    }

    fn observe_event(&self, ev: &Event) {
        let server = self.server(ev.server());
        match ev {
            Event::Handshake(h) => {
                let kind = match h.source {
                    HandshakeSource::Initialize if h.seq > 1 => "reinitialize",
                    HandshakeSource::Initialize => "initial",
                    HandshakeSource::RequestMeta => "declaration",
                    HandshakeSource::Discover => "discover",
                };
                self.handshakes
                    .with_label_values(&[&server, h.outcome.as_str(), kind, h.era.as_str()])
                    .inc();
                if let Some(diff) = &h.diff {
                    for (side, d) in [("client", &diff.client), ("server", &diff.server)] {
                        for (direction, paths) in
                            [("narrowing", &d.removed), ("widening", &d.added)]
                        {
                            let scopes: BTreeSet<&str> = paths.iter().map(|p| scope(p)).collect();
                            for sc in scopes {
                                self.capability_changes
                                    .with_label_values(&[&server, direction, side, sc])
                                    .inc();
                            }
                        }
                    }
                }
                if h.client_near_miss {
                    self.near_misses.with_label_values(&[&server]).inc();
                }
                if let Some(l) = &h.lineage {
                    let lost = (l.client.removed.len() + l.server.removed.len()) as u64;
                    self.lineage_losses
                        .with_label_values(&[&server])
                        .inc_by(lost);
                }
            }
            Event::Alert(a) => {
                self.alerts
                    .with_label_values(&[&server, a.kind.as_str(), a.era.as_str()])
                    .inc();
                if let AlertKind::EmptyToolResult(e) = &a.kind {
                    self.empty_tool_results
                        .with_label_values(&[&server, e.reason.as_str()])
                        .inc();
                }
            }
            Event::Exchange(x) => {
                let method = method_label(&x.method);
                self.responses
                    .with_label_values(&[&server, method, x.media_type])
                    .inc();
                if x.method == "tools/call" {
                    self.tool_calls
                        .with_label_values(&[&server, x.media_type])
                        .inc();
                }
                if x.empty_content == Some(true) {
                    self.empty_tool_content.with_label_values(&[&server]).inc();
                }
                if x.answered {
                    self.request_duration
                        .with_label_values(&[&server, method])
                        .observe(x.duration_ms / 1000.0);
                }
            }
            // A lineage's state dropped is no session.
            Event::SessionEnd(s) if s.session_id.is_none() => {
                self.lineages_ended
                    .with_label_values(&[&server, s.reason.as_str()])
                    .inc();
            }
            Event::SessionEnd(s) => {
                self.sessions_ended
                    .with_label_values(&[&server, s.reason.as_str()])
                    .inc();
                self.sessions_active.with_label_values(&[&server]).dec();
            }
        }
    }

    fn observe_telemetry(&self, t: &Telemetry) {
        match t {
            Telemetry::FlowOpened => self.flows_opened.inc(),
            Telemetry::FlowClosed { reason } => {
                self.flows_closed.with_label_values(&[reason]).inc()
            }
            Telemetry::FlowEvicted { reason } => {
                self.flows_evicted.with_label_values(&[reason]).inc()
            }
            Telemetry::TcpGap { reason, bytes } => {
                self.tcp_gaps.with_label_values(&[reason]).inc();
                self.tcp_gap_bytes.inc_by(*bytes);
            }
            Telemetry::TcpOverlap { conflicting } => self
                .tcp_overlaps
                .with_label_values(&[if *conflicting {
                    "conflicting"
                } else {
                    "identical"
                }])
                .inc(),
            Telemetry::HttpError { reason } => {
                self.http_parse_errors.with_label_values(&[reason]).inc()
            }
            Telemetry::JsonRpcError { reason } => {
                self.jsonrpc_parse_errors.with_label_values(&[reason]).inc()
            }
            Telemetry::HttpResponse { server, status } => {
                let server = self.server(*server);
                let status = status_label(*status);
                self.http_responses
                    .with_label_values(&[server.as_str(), &status])
                    .inc();
            }
            Telemetry::Request {
                server,
                method,
                era,
            } => {
                let server = self.server(*server);
                self.requests
                    .with_label_values(&[server.as_str(), method, era.as_str()])
                    .inc();
            }
            Telemetry::HeaderMismatch { server, header } => {
                let server = self.server(*server);
                self.header_mismatches
                    .with_label_values(&[server.as_str(), header.as_str()])
                    .inc();
            }
            Telemetry::DeclarationRepeated { server } => {
                let server = self.server(*server);
                self.declarations_repeated
                    .with_label_values(&[server.as_str()])
                    .inc();
            }
            Telemetry::ClientCapabilityLoss { server } => {
                let server = self.server(*server);
                self.client_capability_losses
                    .with_label_values(&[server.as_str()])
                    .inc();
            }
            Telemetry::ProxyHeader {
                server,
                named_client,
            } => {
                let server = self.server(*server);
                let source = if *named_client { "named" } else { "none" };
                self.proxy_headers
                    .with_label_values(&[server.as_str(), source])
                    .inc();
            }
            Telemetry::FleetState { found } => self
                .fleet_lookups
                .with_label_values(&[if *found { "found" } else { "absent" }])
                .inc(),
            Telemetry::FleetGarbage => self.fleet_lookups.with_label_values(&["garbage"]).inc(),
            Telemetry::InputRequiredAbandoned { server } => {
                let server = self.server(*server);
                self.input_required_abandoned
                    .with_label_values(&[server.as_str()])
                    .inc();
            }
            Telemetry::SessionStarted { server, midstream } => {
                let server = self.server(*server);
                let baseline = if *midstream { "midstream" } else { "handshake" };
                self.sessions_started
                    .with_label_values(&[&server, baseline])
                    .inc();
                self.sessions_active.with_label_values(&[&server]).inc();
            }
            Telemetry::LimitHit { limit } => self.limits_hit.with_label_values(&[limit]).inc(),
            Telemetry::ClockJump { followed, .. } => self
                .clock_jumps
                .with_label_values(&[if *followed { "true" } else { "false" }])
                .inc(),
            Telemetry::FramingAnomaly { reason } => self
                .http_framing_anomalies
                .with_label_values(&[reason])
                .inc(),
            Telemetry::ExchangeAbandoned { reason } => self
                .http_exchanges_abandoned
                .with_label_values(&[reason])
                .inc(),
            Telemetry::DuplicateHeader { server, header } => {
                let server = self.server(*server);
                self.duplicate_headers
                    .with_label_values(&[server.as_str(), header.as_str()])
                    .inc();
            }
            Telemetry::ResumptionUnresolved { server } => {
                let server = self.server(*server);
                self.resumptions_unresolved
                    .with_label_values(&[server.as_str()])
                    .inc();
            }
            Telemetry::UndecodableFlow { server, reason } => {
                let server = self.server(*server);
                self.undecodable_flows
                    .with_label_values(&[server.as_str(), reason.as_str()])
                    .inc();
            }
            Telemetry::UndecodableBody { server, reason } => {
                let server = self.server(*server);
                self.undecodable_bodies
                    .with_label_values(&[server.as_str(), reason.as_str()])
                    .inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(max_servers: usize) -> Metrics {
        Metrics::new(LabelConfig {
            server_names: HashMap::new(),
            max_servers,
        })
        .expect("metrics")
    }

    #[test]
    fn replayed_incident_counts_alerts_per_server_without_session_ids() {
        let m = metrics(8);
        let path = format!(
            "{}/tests/fixtures/incident.pcap",
            env!("CARGO_MANIFEST_DIR")
        );
        let report =
            crate::replay::replay(&[path], Default::default(), Default::default(), &mut |o| {
                m.observe(o)
            })
            .expect("replay");
        m.add_packet_stats(&report.stats, &PacketStats::default(), 0);
        let text = m.render();
        assert!(
            text.contains(
                r#"mcptap_alerts_total{era="legacy",kind="capability_narrowing",server="127.0.0.1:18111"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"mcptap_alerts_total{era="legacy",kind="empty_tool_result",server="127.0.0.1:18111"} 0"#
        ));
        assert!(text.contains(r#"mcptap_handshakes_total{era="legacy",kind="reinitialize",outcome="accepted",server="127.0.0.1:18111"} 1"#));
        assert!(
            text.contains(
                r#"mcptap_tool_calls_total{media_type="json",server="127.0.0.1:18111"} 2"#
            )
        );
        assert!(
            text.contains(
                r#"mcptap_http_responses_total{server="127.0.0.1:18111",status="502"} 1"#
            )
        );
        assert!(text.contains(r#"mcptap_capability_changes_total{direction="narrowing",scope="tools",server="127.0.0.1:18111",side="server"} 1"#));
        assert!(text.contains(&format!("mcptap_packets_total {}", report.stats.packets)));
        assert!(
            !text.contains("incident-s1"),
            "session ids never become labels"
        );
    }

    /// The series the blind-spot alerts read exist at 0 before their first count: a limit's
    /// from the start, a server's undecodable flows and bodies once the server is seen.
    #[test]
    fn snapshot_save_results_start_at_zero_when_snapshots_are_saved() {
        let m = metrics(1);
        assert!(!m.render().contains("mcptap_state_snapshots_total{"));
        m.snapshots_saved();
        let text = m.render();
        for result in ["ok", "io", "timeout"] {
            let series =
                format!(r#"mcptap_state_snapshots_total{{op="save",result="{result}"}} 0"#);
            assert!(text.contains(&series), "{series} in {text}");
        }
    }

    #[test]
    fn blind_spot_series_start_at_zero() {
        let m = metrics(8);
        let text = m.render();
        for limit in Limit::ALL {
            let series = format!(r#"mcptap_limits_hit_total{{limit="{}"}} 0"#, limit.as_str());
            assert!(text.contains(&series), "{series} in {text}");
        }
        let server = SocketAddr::from(([10, 0, 0, 1], 443));
        m.observe(&Output::Telemetry(Telemetry::UndecodableFlow {
            server,
            reason: UndecodableFlowReason::Tls,
        }));
        let text = m.render();
        assert!(
            text.contains(
                r#"mcptap_undecodable_flows_total{reason="tls",server="10.0.0.1:443"} 1"#
            )
        );
        assert!(
            text.contains(
                r#"mcptap_undecodable_flows_total{reason="h2c",server="10.0.0.1:443"} 0"#
            )
        );
        assert!(text.contains(
            r#"mcptap_undecodable_bodies_total{reason="unknown_coding",server="10.0.0.1:443"} 0"#
        ));
    }

    #[test]
    fn unknown_statuses_are_bucketed_by_class() {
        assert_eq!(status_label(200), "200");
        assert_eq!(status_label(429), "429");
        assert_eq!(status_label(299), "2xx");
        assert_eq!(status_label(418), "4xx");
        assert_eq!(status_label(599), "5xx");
        assert_eq!(status_label(600), "other");
        assert_eq!(status_label(999), "other");
        assert_eq!(status_label(0), "other");
        let m = metrics(8);
        let server = SocketAddr::from(([10, 0, 0, 1], 8080));
        for status in 100..=999u16 {
            m.observe(&Output::Telemetry(Telemetry::HttpResponse {
                server,
                status,
            }));
        }
        let text = m.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("mcptap_http_responses_total{"))
            .count();
        assert_eq!(series, KNOWN_STATUSES.len() + 6, "{text}");
        assert!(
            text.contains(
                r#"mcptap_http_responses_total{server="10.0.0.1:8080",status="other"} 400"#
            )
        );
        assert!(
            text.contains(r#"mcptap_http_responses_total{server="10.0.0.1:8080",status="2xx"} 95"#)
        );
    }

    #[test]
    fn server_label_is_capped() {
        let m = metrics(2);
        for port in 1..=5u16 {
            m.observe(&Output::Telemetry(Telemetry::Request {
                era: mcptap_core::model::Era::Legacy,
                server: SocketAddr::from(([10, 0, 0, 1], port)),
                method: method_label("x/unknown"),
            }));
        }
        let text = m.render();
        assert!(
            text.contains(r#"mcptap_requests_total{era="legacy",method="other",server="other"} 3"#),
            "{text}"
        );
    }
}
