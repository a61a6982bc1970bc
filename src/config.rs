//! Daemon configuration: a TOML file, overridden by command-line flags.

use mcptap_core::detect::Detectors;
use mcptap_core::limits::Limits;
use mcptap_core::mcp::identity::IdentitySettings;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Longest a metrics connection may wait (a day): beyond, the timer would overflow.
const MAX_METRICS_TIMEOUT_SECS: u64 = 86_400;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub capture: CaptureConfig,
    pub metrics: MetricsConfig,
    pub events: EventsConfig,
    /// `[limits]`: the core's own type; its keys and their checks are in `mcptap_core::limits`.
    pub limits: Limits,
    /// `[detect]`: detector settings, the core's own type (`mcptap_core::detect::Detectors`).
    pub detect: Detectors,
    /// `[identity]`: trusted proxies whose Forwarded / X-Forwarded-For headers name the client
    /// (the core's own type, `mcptap_core::mcp::identity::IdentitySettings`).
    pub identity: IdentitySettings,
    /// `[state]`: the snapshot file that keeps session state across restarts.
    pub state: StateConfig,
    /// `[fleet]`: session state shared with the other gateway hosts through Redis/Valkey.
    pub fleet: crate::fleet::FleetSettings,
    /// `[privacy]`: fields emitted and stored as keyed hashes.
    pub privacy: crate::redact::PrivacySettings,
    pub log: LogConfig,
    /// Drop root privileges to this user once the capture handles are open.
    pub user: Option<String>,
    /// `[servers]`: known MCP server endpoints and their display names, "10.0.0.5:8080" =
    /// "tools-gateway". Live capture shards their traffic by them (before anything learned from
    /// SYN / SYN-ACK), and the `server` metric label shows the name. `metrics.server_names` is
    /// an accepted alias; on a conflict this table wins.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<SocketAddr, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptureConfig {
    /// Interfaces to capture on; `any` captures all (Linux cooked SLL2).
    pub interfaces: Vec<String>,
    /// BPF filter.
    pub filter: String,
    pub snaplen: u32,
    pub promiscuous: bool,
    /// Kernel capture buffer per interface, bytes. libpcap's 2 MiB default drops under bursts.
    pub buffer_bytes: u32,
    /// Read timeout in ms: packets are delivered in batches (TPACKET_V3 stays on).
    pub read_timeout_ms: u32,
    /// Pipeline worker threads; traffic is sharded by server endpoint. 0 = as the cores
    /// allow ([`CaptureConfig::layout`]: one worker sharded over them, or a worker per core).
    pub threads: usize,
    /// Each worker's flow layer (decode, reassembly, HTTP, SSE, decompression) on a thread of
    /// its own in front of its session layer, so that one busy upstream uses two cores. Not
    /// with fleet mode.
    pub split_stages: bool,
    /// With `split_stages`: each worker's flow layer sharded by connection over this many
    /// threads of its own (the worker's thread dispatches packets and merges the shards' work
    /// back in order), so that one busy upstream uses more cores. 0 = none. Unset: see
    /// [`CaptureConfig::layout`].
    pub flow_threads: Option<usize>,
    /// With `split_stages`: each worker's session layer (MCP state, detection) sharded by
    /// client over this many threads, the outputs merged back in one worker's order. 1 = one
    /// session thread. Unset: see [`CaptureConfig::layout`].
    pub session_threads: Option<usize>,
}

/// How `run` lays its pipelines over threads: `workers` pipelines (traffic sharded by server
/// endpoint), each with its flow layer sharded over `flow_threads` threads of its own (0: on
/// the worker's thread) and its session layer over `session_threads` (with `split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub workers: usize,
    pub split: bool,
    pub flow_threads: usize,
    pub session_threads: usize,
}

/// How `threads` threads split between a pipeline's flow shards and its session shards, the
/// calling thread reading, merging and writing besides (as `replay --threads`): `flow_threads`
/// as given, else none below four threads and about half of the rest from four on. `None`
/// for one thread: the whole pipeline on it.
pub fn stage_threads(threads: usize, flow_threads: Option<usize>) -> Option<(usize, usize)> {
    let threads = threads.clamp(1, MAX_THREADS);
    if threads == 1 {
        return None;
    }
    // Each flow shard is a pipeline with its allocator's slack charged to the budget: never
    // more of them than the threads asked for.
    let flows = flow_threads
        .unwrap_or(if threads >= 4 { (threads - 1) / 2 } else { 0 })
        .min(threads - 1);
    Some((flows, (threads - 1 - flows).max(1)))
}

impl CaptureConfig {
    /// The threads of `run` on a machine with `cores` cores (`fleet`: fleet mode, which keeps
    /// whole pipelines). By default (no `threads`, `flow_threads` or `session_threads` set,
    /// stages split, no fleet) one worker whose flow and session layers are sharded over the
    /// cores as `replay --threads` shards them, so that a single busy upstream, the common
    /// gateway, uses every core. Otherwise `threads` workers (0: one per core), each with the
    /// flow and session threads given (0 and 1 when not).
    pub fn layout(&self, cores: usize, fleet: bool) -> Layout {
        let cores = cores.clamp(1, MAX_THREADS);
        let split = self.split_stages && !fleet;
        let unset =
            self.threads == 0 && self.flow_threads.is_none() && self.session_threads.is_none();
        if unset && split {
            let (flow_threads, session_threads) = stage_threads(cores, None).unwrap_or((0, 1));
            return Layout {
                workers: 1,
                split,
                flow_threads,
                session_threads,
            };
        }
        Layout {
            workers: if self.threads == 0 {
                cores
            } else {
                self.threads
            },
            split,
            flow_threads: self.flow_threads.unwrap_or(0),
            session_threads: self.session_threads.unwrap_or(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// Distinct `server` label values before new servers are counted as `other`.
    pub max_servers: usize,
    /// Connections the endpoint serves at once; beyond, the one idle the longest is closed.
    pub max_connections: usize,
    /// Seconds allowed for a request head (also how long a connection may wait for one).
    pub header_timeout_secs: u64,
    /// Seconds without a byte read or written before a connection is closed.
    pub idle_timeout_secs: u64,
    /// Alias of the top-level `[servers]` table (its older name); merged into it.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub server_names: BTreeMap<SocketAddr, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// NDJSON events file, reopened on SIGHUP (for logrotate).
    pub file: Option<String>,
    /// Also write events to standard output.
    pub stdout: bool,
    /// Seconds between two `stats` events (the totals so far: packets, gaps, drops, parse
    /// errors, evictions) while capturing; 0: none (the `summary` at exit stays).
    pub stats_interval_secs: u64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            file: None,
            stdout: false,
            stats_interval_secs: 60,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateConfig {
    /// Snapshot file (e.g. /var/lib/mcptap/state.json); none: state lives in memory only.
    pub snapshot_file: Option<String>,
    /// Seconds between snapshots besides the one at SIGTERM.
    pub snapshot_interval_secs: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            snapshot_file: None,
            snapshot_interval_secs: 60,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// tracing filter, e.g. `info` or `mcptap=debug`.
    pub level: String,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            interfaces: Vec::new(),
            filter: "tcp".into(),
            snaplen: 262_144,
            promiscuous: false,
            buffer_bytes: 64 * 1024 * 1024,
            read_timeout_ms: 100,
            threads: 0,
            split_stages: true,
            flow_threads: None,
            session_threads: None,
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9917)),
            max_servers: 64,
            max_connections: 128,
            header_timeout_secs: 10,
            idle_timeout_secs: 30,
            server_names: BTreeMap::new(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// More metrics connections than this is a typo: each is a descriptor.
pub const MAX_METRICS_CONNECTIONS: usize = 65_536;

/// More pipeline workers than this is a typo, not a machine: each is a thread and a pipeline.
pub const MAX_THREADS: usize = 1024;

impl Config {
    /// Reads and validates a config file; the error is one line naming the file.
    pub fn load(path: &str) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{path}: cannot read config: {e}"))?;
        let cfg: Config = toml::from_str(&text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    // Line feeds before the error, plus one (`lines()` would not count the
                    // line an error at a line's first byte is on).
                    let before = text.as_bytes().get(..span.start).unwrap_or(text.as_bytes());
                    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
                    format!("{path}: line {line}: {msg}")
                }
                None => format!("{path}: {msg}"),
            }
        })?;
        cfg.validate().map_err(|e| format!("{path}: {e}"))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.capture.snaplen < 96 {
            return Err("capture.snaplen must be at least 96".into());
        }
        if self.capture.threads > MAX_THREADS {
            return Err(format!(
                "capture.threads must be at most {MAX_THREADS} (0 = by the cores; got {})",
                self.capture.threads
            ));
        }
        // Every worker gets its own flow threads: the product is bounded (with threads = 0
        // the workers are counted when `run` starts).
        let workers = self.capture.threads.max(1);
        let flow_threads = self.capture.flow_threads.unwrap_or(0);
        let session_threads = self.capture.session_threads.unwrap_or(1);
        if workers.saturating_mul(flow_threads.saturating_add(session_threads)) > MAX_THREADS {
            return Err(format!(
                "capture.flow_threads plus capture.session_threads, times capture.threads, must be at most {MAX_THREADS} (got ({flow_threads} + {session_threads}) x {workers})"
            ));
        }
        if session_threads == 0 {
            return Err("capture.session_threads must be at least 1".into());
        }
        if self.metrics.max_servers == 0 {
            return Err("metrics.max_servers must be at least 1".into());
        }
        crate::redact::Redactor::from_settings(&self.privacy)?;
        if let Some(url) = &self.fleet.url
            && !url.starts_with("redis://")
            && !url.starts_with("rediss://")
        {
            return Err(format!(
                "fleet.url must be redis://HOST:PORT/DB or rediss://HOST:PORT/DB (got {url})"
            ));
        }
        if !(1..=10_000).contains(&self.fleet.lookup_timeout_ms) {
            return Err(format!(
                "fleet.lookup_timeout_ms must be 1..=10000 (got {})",
                self.fleet.lookup_timeout_ms
            ));
        }
        if self.events.stats_interval_secs > MAX_METRICS_TIMEOUT_SECS {
            return Err(format!(
                "events.stats_interval_secs must be 0..={MAX_METRICS_TIMEOUT_SECS} (got {})",
                self.events.stats_interval_secs
            ));
        }
        if !(1..=MAX_METRICS_TIMEOUT_SECS).contains(&self.state.snapshot_interval_secs) {
            return Err(format!(
                "state.snapshot_interval_secs must be 1..={MAX_METRICS_TIMEOUT_SECS} (got {})",
                self.state.snapshot_interval_secs
            ));
        }
        if !(1..=MAX_METRICS_CONNECTIONS).contains(&self.metrics.max_connections) {
            return Err(format!(
                "metrics.max_connections must be between 1 and {MAX_METRICS_CONNECTIONS} (got {})",
                self.metrics.max_connections
            ));
        }
        let timeouts = [
            self.metrics.header_timeout_secs,
            self.metrics.idle_timeout_secs,
        ];
        if timeouts
            .iter()
            .any(|t| !(1..=MAX_METRICS_TIMEOUT_SECS).contains(t))
        {
            return Err(format!(
                "metrics.header_timeout_secs and metrics.idle_timeout_secs must be between 1 and {MAX_METRICS_TIMEOUT_SECS}"
            ));
        }
        if self.capture.read_timeout_ms == 0 {
            return Err("capture.read_timeout_ms must be at least 1".into());
        }
        check_log_filter(&self.log.level).map_err(|e| format!("log.level: {e}"))?;
        Ok(())
    }

    /// Configured server endpoints and their names: `[servers]` and its alias
    /// `metrics.server_names`, the former winning on a conflict.
    pub fn server_names(&self) -> BTreeMap<SocketAddr, String> {
        let mut names = self.metrics.server_names.clone();
        names.extend(self.servers.iter().map(|(k, v)| (*k, v.clone())));
        names
    }

    /// The effective configuration: the alias folded into `[servers]`.
    pub fn effective(mut self) -> Config {
        self.servers = self.server_names();
        self.metrics.server_names.clear();
        self
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }
}

/// The levels a log filter names.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a log filter (tracing's EnvFilter syntax: `info`, `mcptap=debug,warn`). EnvFilter
/// reads a bare word that is no level as a target to log at every level, so a misspelt level
/// (`warning`) silenced every line, alerts' WARNs included: each directive must be a level or
/// `target=level`.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    let is_level = |l: &str| LOG_LEVELS.iter().any(|k| k.eq_ignore_ascii_case(l.trim()));
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = match directive.rsplit_once('=') {
            Some((_, level)) => level,
            None => directive,
        };
        if !is_level(level) {
            return Err(format!(
                "`{directive}` in `{filter}` is no level: use one of {} or TARGET=LEVEL",
                LOG_LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(drop)
        .map_err(|e| format!("`{filter}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_name_levels() {
        for ok in [
            "info",
            "WARN",
            "mcptap=debug",
            "mcptap=debug,warn",
            " error ",
            "off",
            "",
        ] {
            assert_eq!(check_log_filter(ok), Ok(()), "{ok}");
        }
        for bad in ["warning", "verbose", "mcptap=loud", "info,mcptap"] {
            let e = check_log_filter(bad).expect_err(bad);
            assert!(e.contains("is no level"), "{bad}: {e}");
        }
        let mut cfg = Config::default();
        cfg.log.level = "warning".into();
        assert!(
            cfg.validate()
                .expect_err("refused")
                .starts_with("log.level:")
        );
    }

    #[test]
    fn example_config_parses_and_round_trips() {
        let path = format!("{}/mcptap.example.toml", env!("CARGO_MANIFEST_DIR"));
        let cfg = Config::load(&path).expect("example config");
        assert_eq!(cfg.capture.filter, "tcp port 8080 or tcp port 443");
        let again: Config = toml::from_str(&cfg.to_toml()).expect("round trip");
        assert_eq!(again, cfg);
    }

    #[test]
    fn the_default_layout_spreads_one_worker_over_the_cores_and_explicit_ones_stay() {
        let layout = |toml: &str, cores: usize, fleet: bool| {
            let cfg: Config = toml::from_str(toml).expect("config");
            let l = cfg.capture.layout(cores, fleet);
            (l.workers, l.split, l.flow_threads, l.session_threads)
        };
        // As `replay --threads <cores>`.
        assert_eq!(layout("", 1, false), (1, true, 0, 1));
        assert_eq!(layout("", 2, false), (1, true, 0, 1));
        assert_eq!(layout("", 3, false), (1, true, 0, 2));
        assert_eq!(layout("", 4, false), (1, true, 1, 2));
        assert_eq!(layout("", 8, false), (1, true, 3, 4));
        // Fleet mode keeps whole pipelines, a worker per core.
        assert_eq!(layout("", 8, true), (8, false, 0, 1));
        // Anything set: workers by server endpoint, each with the threads given.
        assert_eq!(layout("[capture]\nthreads = 2", 8, false), (2, true, 0, 1));
        assert_eq!(
            layout("[capture]\nflow_threads = 2", 8, false),
            (8, true, 2, 1)
        );
        assert_eq!(
            layout("[capture]\nthreads = 1\nsession_threads = 3", 8, false),
            (1, true, 0, 3)
        );
        assert_eq!(
            layout("[capture]\nsplit_stages = false", 4, false),
            (4, false, 0, 1)
        );
    }

    #[test]
    fn empty_config_is_the_defaults() {
        let cfg: Config = toml::from_str("").expect("empty");
        assert_eq!(cfg, Config::default());
        assert_eq!(cfg.metrics.listen.to_string(), "127.0.0.1:9917");
        assert_eq!(cfg.capture.buffer_bytes, 64 * 1024 * 1024);
    }

    #[test]
    fn servers_table_and_its_metrics_alias_merge() {
        let cfg: Config = toml::from_str(
            "[servers]\n\"10.0.0.5:8080\" = \"gw\"\n\"10.0.0.6:64000\" = \"high\"\n[metrics.server_names]\n\"10.0.0.5:8080\" = \"old\"\n\"10.0.0.7:80\" = \"web\"\n",
        )
        .expect("config");
        let names = cfg.server_names();
        let get = |a: &str| names.get(&a.parse::<SocketAddr>().expect("addr")).cloned();
        assert_eq!(get("10.0.0.5:8080").as_deref(), Some("gw"));
        assert_eq!(get("10.0.0.6:64000").as_deref(), Some("high"));
        assert_eq!(get("10.0.0.7:80").as_deref(), Some("web"));
        let effective = cfg.effective();
        assert!(effective.metrics.server_names.is_empty());
        let again: Config = toml::from_str(&effective.to_toml()).expect("round trip");
        assert_eq!(again.servers.len(), 3);
        assert_eq!(again, effective);
    }

    #[test]
    fn errors_name_the_line() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, "[capture]\nfilter = \"tcp\"\nsnaplen = \"big\"\n").expect("write");
        let e = Config::load(p.to_str().expect("utf8")).expect_err("bad");
        assert!(e.contains("line 3"), "{e}");
        assert!(!e.contains('\n'));
        // An unknown key at the start of its line is on that line, not the one before.
        std::fs::write(&p, "[capture]\nfilter = \"tcp\"\n\nbuffer_byts = 1\n").expect("write");
        let e = Config::load(p.to_str().expect("utf8")).expect_err("bad");
        assert!(e.contains("line 4"), "{e}");
        std::fs::write(&p, "[capture]\nfliter = \"tcp\"\n").expect("write");
        let e = Config::load(p.to_str().expect("utf8")).expect_err("unknown key");
        assert!(e.contains("fliter"), "{e}");
    }
}
