//! The `mcptap` command line.

use clap::{Parser, Subcommand, ValueEnum};

/// The pipeline allocates and frees small buffers for every HTTP message and event; mimalloc
/// does that in a fraction of glibc's instructions (see `mcptap::allocator`).
#[global_allocator]
static ALLOCATOR: mcptap::allocator::Allocator = mcptap::allocator::Allocator;
use mcptap::config::{self, Config};
use mcptap::sink::{log, ndjson::NdjsonWriter, summary::Summary};
use mcptap_core::detect::Detectors;
use mcptap_core::limits::{LimitSettings, Limits};
use mcptap_core::model::Output;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

/// `eprintln!` in order with the buffered log lines (see `sink::log_writer`); with JSON logs,
/// a record at INFO.
macro_rules! say {
    ($($arg:tt)*) => {
        mcptap::sink::log_writer::say("INFO", format_args!($($arg)*))
    };
}

/// An error of the program's own on standard error (a record at ERROR with JSON logs).
macro_rules! say_error {
    ($($arg:tt)*) => {
        mcptap::sink::log_writer::say("ERROR", format_args!($($arg)*))
    };
}

mod assets;

/// What `mcptap --help` and the man page say after the options: how to start, where things
/// are, how it ends.
const AFTER_HELP: &str = "\
Examples:
  mcptap replay capture.pcap --events events.ndjson
      Replay a capture; events to a file, a summary on standard error.
  mcptap replay --fail-on-alert rotated-*.pcap
      Exit status 3 when any alert fired.
  mcptap run --config /etc/mcptap/mcptap.toml
      The daemon, as mcptap.service runs it.
  mcptap report events.ndjson -o report.html
      An HTML report: alerted sessions, timelines, blind spots.
  mcptap check-config /etc/mcptap/mcptap.toml
      Check a configuration file; print the effective one.

Files:
  /etc/mcptap/mcptap.toml
      The configuration (every key is in mcptap.example.toml).
  /var/log/mcptap/events.ndjson
      NDJSON events: handshakes, exchanges, alerts, stats.
  /var/lib/mcptap/state.json
      Session state kept across a restart ([state] snapshot_file).

Signals (run):
  SIGTERM, SIGINT
      Stop capturing, flush the events, write the snapshot,
      print the summary, exit 0.
  SIGHUP
      Reopen the events file (logrotate).

Exit status:
  0   Success; for replay also a capture file cut mid-record
      (the events up to the cut are written, with a warning).
  2   Unusable input or configuration: a missing file, not a
      capture, no such interface, permission denied, a bad
      filter or configuration line, the listen address in use.
  3   replay --fail-on-alert: an alert fired.

Metrics: http://127.0.0.1:9917/metrics by default
([metrics] listen). Alert rules, a Grafana dashboard and the
systemd unit come with the package.";

#[derive(Parser)]
#[command(
    name = "mcptap",
    version,
    about = "Passive monitor for MCP over HTTP: handshakes, capability narrowing, Content-Type drift, empty tool results",
    after_long_help = AFTER_HELP
)]
struct Cli {
    /// Log format on standard error [default: text, or the config file's].
    #[arg(long, value_enum, global = true)]
    log_format: Option<LogFormat>,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `mcptap=debug` [default: info].
    #[arg(long, global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

impl From<LogFormat> for config::LogFormat {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Text => config::LogFormat::Text,
            LogFormat::Json => config::LogFormat::Json,
        }
    }
}

// Parsed once per process: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Replay pcap/pcapng files (or `-` for standard input) as one capture, in timestamp order.
    Replay {
        /// Capture files; several files are merged by timestamp (a rotated set).
        #[arg(required = true)]
        files: Vec<String>,
        /// Write NDJSON events here instead of standard output (`-`: standard output).
        #[arg(long)]
        events: Option<String>,
        /// Exit with status 3 when any alert fired.
        #[arg(long)]
        fail_on_alert: bool,
        /// No progress bar and no summary on standard error (warnings and errors still). The
        /// bar is shown only when standard error is a terminal.
        #[arg(long, short = 'q')]
        quiet: bool,
        /// Threads: 1 runs everything on one; 2 put the session layer (MCP, detection) on a
        /// thread of its own beside the flow layer (capture reading, TCP, HTTP) and the
        /// output; 3 or more shard the session layer by client over N-1 threads. The same
        /// events in the same order, unless a limit is hit. With --fleet: 1
        /// [default: one per core].
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
        /// With --threads 2 or more: the flow layer (TCP, HTTP, SSE) sharded by connection
        /// over F threads of its own (at most N-1), this thread reading, merging and writing,
        /// and the session layer on the other N-1-F (at least one). The same events in the
        /// same order unless a limit is hit (each flow shard holds its share of max_flows)
        /// [default: 0 below 4 threads, else (N-1)/2].
        #[arg(long, value_name = "F")]
        flow_threads: Option<usize>,
        /// Replay through the daemon's worker path: N pipeline workers sharded by server
        /// endpoint, with process-wide limits, as `run` does. Events come in no fixed order
        /// across workers. For checking the live path's limits on a capture.
        #[arg(long, hide = true, value_name = "N")]
        worker_threads: Option<usize>,
        /// With --worker-threads: each worker on one thread, as `run --no-split-stages`.
        #[arg(long, hide = true)]
        worker_whole: bool,
        /// With --worker-threads: each worker's flow layer over F threads more, as
        /// `run --flow-threads`.
        #[arg(long, hide = true, value_name = "F", default_value_t = 0)]
        worker_flow_threads: usize,
        /// With --worker-threads: each worker's session layer over S threads, as
        /// `run --session-threads`.
        #[arg(long, hide = true, value_name = "S", default_value_t = 1)]
        worker_session_threads: usize,
        /// JSON-RPC error responses take part in content-type mode elimination (config
        /// `detect.errors_decide_mode`).
        #[arg(long)]
        errors_decide_mode: bool,
        /// With --worker-threads: a configured server endpoint (repeatable), as `[servers]`
        /// gives `run`.
        #[arg(long = "worker-server", hide = true, value_name = "IP:PORT")]
        worker_servers: Vec<std::net::SocketAddr>,
        /// A proxy whose Forwarded / X-Forwarded-For headers name the client (repeatable;
        /// an address or address/prefix), as `identity.trusted_proxies`.
        #[arg(long = "trusted-proxy", value_name = "CIDR")]
        trusted_proxies: Vec<mcptap_core::mcp::identity::Cidr>,
        /// Fleet mode: read the state of sessions first seen from this Redis/Valkey store
        /// (`redis://host:port/db`), as the other gateway hosts' mcptap left it.
        #[arg(long, value_name = "URL")]
        fleet: Option<String>,
        /// With --fleet: also write this replay's session state to the store.
        #[arg(long, requires = "fleet")]
        fleet_write: bool,
        /// With --fleet: the store's ACL user.
        #[arg(long, requires = "fleet", value_name = "USER")]
        fleet_username: Option<String>,
        /// With --fleet: a file holding the store's password.
        #[arg(long, requires = "fleet", value_name = "FILE")]
        fleet_password_file: Option<String>,
        /// With --fleet: the prefix of every key [default: mcptap:].
        #[arg(long, requires = "fleet", value_name = "PREFIX")]
        fleet_key_prefix: Option<String>,
        /// With --fleet: longest a lookup may take, ms [default: 50].
        #[arg(long, requires = "fleet", value_name = "MS")]
        fleet_lookup_timeout_ms: Option<u64>,
        /// With --fleet rediss://: the CA (PEM) the store's certificate must chain to.
        #[arg(long, requires = "fleet", value_name = "FILE")]
        fleet_tls_ca_file: Option<String>,
        /// Emit (and store) this field as a keyed hash: client_ip, client_info (repeatable), as
        /// `privacy.redact`.
        #[arg(long, value_name = "FIELD", requires = "redact_key_file")]
        redact: Vec<String>,
        /// The redaction key (at least 16 bytes), as `privacy.redact_key_file`.
        #[arg(long, value_name = "FILE")]
        redact_key_file: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Capture live on one or more interfaces; serve metrics; write events.
    Run(RunArgs),
    /// Write a self-contained HTML forensics report of captures or NDJSON events files:
    /// summary and blind spots, alerted sessions, their timelines and capability changes.
    Report {
        #[command(flatten)]
        input: ForensicInputs,
        /// The HTML file to write.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: String,
        #[command(flatten)]
        selection: mcptap::forensics::Selection,
        /// Sessions shown in full (alerted first); the rest are aggregated.
        #[arg(long, value_name = "N", default_value_t = mcptap::forensics::model::DEFAULT_DETAIL_SESSIONS)]
        detail_sessions: usize,
    },
    /// List the sessions and lineages of captures or NDJSON events files, one line each.
    Sessions {
        #[command(flatten)]
        input: ForensicInputs,
        /// Order of the lines.
        #[arg(long, value_enum, default_value = "first_seen")]
        sort: mcptap::forensics::text::SortOrder,
        #[command(flatten)]
        selection: mcptap::forensics::Selection,
    },
    /// Print the timeline of one session or lineage (its id) in captures or NDJSON events files.
    Show {
        /// A session id (Mcp-Session-Id) or a lineage id.
        id: String,
        #[command(flatten)]
        input: ForensicInputs,
    },
    /// Validate a configuration file and print the effective configuration.
    CheckConfig { file: String },
    /// List the IP addresses of capture files; with --require-loopback, refuse (exit 1) a
    /// capture that is not safe to push onto an interface with tcpreplay.
    Endpoints {
        #[arg(required = true)]
        files: Vec<String>,
        /// Refuse any frame with an address outside 127.0.0.0/8 and ::1, a destination MAC the
        /// interface would take as its own (or broadcast/multicast), or a non-Ethernet link type.
        #[arg(long)]
        require_loopback: bool,
        /// The target interface's own MAC address (repeatable) [default: lo's, 00:00:00:00:00:00].
        #[arg(long = "local-mac", value_parser = mcptap::endpoints::parse_mac)]
        local_macs: Vec<[u8; 6]>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// TOML configuration file; flags given here override it.
    #[arg(long, short = 'c')]
    config: Option<String>,
    /// Interface to capture on (repeatable); `any` captures all interfaces.
    #[arg(long = "interface", short = 'i')]
    interfaces: Vec<String>,
    /// BPF capture filter [default: tcp].
    #[arg(long, short = 'f')]
    filter: Option<String>,
    /// Put the interfaces in promiscuous mode.
    #[arg(long)]
    promiscuous: bool,
    /// Kernel capture buffer per interface, bytes [default: 64 MiB].
    #[arg(long)]
    buffer_bytes: Option<u32>,
    /// Pipeline workers, traffic sharded by server endpoint [default, or 0: one worker sharded
    /// over the cores by connection and client, as `replay --threads`; a worker per core with
    /// --flow-threads, --session-threads, --no-split-stages or fleet mode].
    #[arg(long)]
    threads: Option<usize>,
    /// Run each worker's flow and session layers on one thread (by default the flow layer
    /// has a thread of its own).
    #[arg(long)]
    no_split_stages: bool,
    /// Each worker's flow layer sharded by connection over F threads more (the worker's thread
    /// dispatches and merges) [default: 0 with --threads or --session-threads, else by the
    /// cores].
    #[arg(long, value_name = "F")]
    flow_threads: Option<usize>,
    /// Each worker's session layer sharded by client over S threads, the events merged back
    /// in one worker's order [default: 1 with --threads or --flow-threads, else by the
    /// cores].
    #[arg(long, value_name = "S")]
    session_threads: Option<usize>,
    /// Metrics endpoint address [default: 127.0.0.1:9917].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// NDJSON events file (reopened on SIGHUP; `-`: standard output, as --events-stdout).
    #[arg(long)]
    events: Option<String>,
    /// Also write events to standard output.
    #[arg(long)]
    events_stdout: bool,
    /// Seconds between two `stats` events (totals so far); 0: none [default: 60].
    #[arg(long, value_name = "SECS")]
    stats_interval: Option<u64>,
    /// Drop root privileges to this user after opening the capture.
    #[arg(long)]
    user: Option<String>,
    /// Keep session state across restarts in this file (written on SIGTERM and every
    /// `state.snapshot_interval_secs`, loaded at start).
    #[arg(long)]
    snapshot_file: Option<String>,
}

impl RunArgs {
    fn config(&self) -> Result<Config, String> {
        let mut cfg = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if !self.interfaces.is_empty() {
            cfg.capture.interfaces = self.interfaces.clone();
        }
        if let Some(f) = &self.filter {
            cfg.capture.filter = f.clone();
        }
        cfg.capture.promiscuous |= self.promiscuous;
        if let Some(b) = self.buffer_bytes {
            cfg.capture.buffer_bytes = b;
        }
        if let Some(t) = self.threads {
            cfg.capture.threads = t;
        }
        if self.no_split_stages {
            cfg.capture.split_stages = false;
        }
        if let Some(f) = self.flow_threads {
            cfg.capture.flow_threads = Some(f);
        }
        if let Some(n) = self.session_threads {
            cfg.capture.session_threads = Some(n);
        }
        if let Some(l) = self.listen {
            cfg.metrics.listen = l;
        }
        match self.events.as_deref() {
            Some("-") => cfg.events.stdout = true,
            Some(e) => cfg.events.file = Some(e.to_owned()),
            None => {}
        }
        cfg.events.stdout |= self.events_stdout;
        if let Some(secs) = self.stats_interval {
            cfg.events.stats_interval_secs = secs;
        }
        if let Some(u) = &self.user {
            cfg.user = Some(u.clone());
        }
        if let Some(s) = &self.snapshot_file {
            cfg.state.snapshot_file = Some(s.clone());
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The inputs of `report`, `sessions` and `show`: captures are replayed with replay's settings.
#[derive(clap::Args)]
struct ForensicInputs {
    /// Capture files (pcap/pcapng, replayed together as one capture) and NDJSON events files,
    /// recognised by their content.
    #[arg(required = true, value_name = "INPUT")]
    inputs: Vec<String>,
    /// For captures: as `replay --errors-decide-mode`.
    #[arg(long)]
    errors_decide_mode: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

impl ForensicInputs {
    fn options(&self) -> Result<mcptap::forensics::load::ReplayOptions, String> {
        Ok(mcptap::forensics::load::ReplayOptions {
            limits: self.limits.limits()?,
            analysis: Detectors {
                errors_decide_mode: self.errors_decide_mode,
            }
            .into(),
        })
    }
}

/// Prints what a forensics command produced; an error is one line and exit 2.
fn forensics(run: impl FnOnce() -> Result<mcptap::forensics::Done, String>) -> ExitCode {
    match run() {
        Ok(done) => {
            let mut out = io::stdout().lock();
            if let Err(e) = out
                .write_all(done.stdout.as_bytes())
                .and_then(|()| out.flush())
                && e.kind() != io::ErrorKind::BrokenPipe
            {
                return fail(&format!("writing the output: {e}"));
            }
            for note in &done.notes {
                say!("{note}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// The replay flags for `[limits]`: one flag per key of the config file, same name, same
/// defaults and the same conversion and checks (`Limits::try_from(LimitSettings)`).
#[derive(clap::Args)]
struct LimitArgs {
    /// Maximum tracked TCP flows (least recently seen are evicted).
    #[arg(long, default_value_t = LimitSettings::default().max_flows)]
    max_flows: usize,
    /// Budget for flow state, buffers and sessions, bytes (least recently seen flows are evicted).
    #[arg(long, default_value_t = LimitSettings::default().memory_budget_bytes)]
    memory_budget_bytes: usize,
    /// Out-of-order bytes buffered per flow direction before a gap is declared.
    #[arg(long, default_value_t = LimitSettings::default().max_flow_buffer_bytes)]
    max_flow_buffer_bytes: usize,
    /// Largest JSON-RPC message body kept for parsing, in bytes.
    #[arg(long, default_value_t = LimitSettings::default().max_message_bytes)]
    max_message_bytes: usize,
    /// Largest SSE event kept for parsing, in bytes [default: --max-message-bytes].
    #[arg(long)]
    max_sse_event_bytes: Option<usize>,
    /// Largest HTTP request or response head, in bytes.
    #[arg(long, default_value_t = LimitSettings::default().max_head_bytes)]
    max_head_bytes: usize,
    /// Maximum tracked MCP sessions (they may also take at most 3/4 of the memory budget).
    #[arg(long, default_value_t = LimitSettings::default().max_sessions)]
    max_sessions: usize,
    /// A flow without packets for this long (capture time) is closed, in seconds.
    #[arg(long, default_value_t = LimitSettings::default().flow_idle_timeout_secs)]
    flow_idle_timeout_secs: u64,
    /// A session without traffic for this long (capture time) is ended, in seconds.
    #[arg(long, default_value_t = LimitSettings::default().session_idle_timeout_secs)]
    session_idle_timeout_secs: u64,
    /// Window for linking a new session to a rejected/expired/deleted one, in seconds (0: off).
    #[arg(long, default_value_t = LimitSettings::default().lineage_window_secs)]
    lineage_window_secs: u64,
    /// A packet stamped this far ahead of the packet clock is a clock jump: counted, and it
    /// moves the clock only when several in a row agree, in seconds.
    #[arg(long, default_value_t = LimitSettings::default().clock_jump_secs)]
    clock_jump_secs: u64,
    /// How long the empty result of an SSE stream that may be resumed (it carried an event id)
    /// waits for the answer on a resumed stream before it alerts, in seconds.
    #[arg(long, default_value_t = LimitSettings::default().resumption_window_secs)]
    resumption_window_secs: u64,
}

impl LimitArgs {
    fn settings(&self) -> LimitSettings {
        LimitSettings {
            max_flows: self.max_flows,
            memory_budget_bytes: self.memory_budget_bytes,
            max_flow_buffer_bytes: self.max_flow_buffer_bytes,
            max_message_bytes: self.max_message_bytes,
            max_sse_event_bytes: self.max_sse_event_bytes,
            max_head_bytes: self.max_head_bytes,
            max_sessions: self.max_sessions,
            flow_idle_timeout_secs: self.flow_idle_timeout_secs,
            session_idle_timeout_secs: self.session_idle_timeout_secs,
            lineage_window_secs: self.lineage_window_secs,
            clock_jump_secs: self.clock_jump_secs,
            resumption_window_secs: self.resumption_window_secs,
        }
    }

    fn limits(&self) -> Result<Limits, String> {
        Limits::try_from(self.settings())
    }
}

fn init_logging(format: config::LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: journald, files and pipes get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_writer(mcptap::sink::log_writer::LogWriter);
    let ansi = io::IsTerminal::is_terminal(&io::stderr());
    match format {
        config::LogFormat::Text => builder.with_target(false).init(),
        config::LogFormat::Json => builder.json().init(),
    }
    mcptap::sink::log_writer::set_json_records(format == config::LogFormat::Json);
    // Handshake lines, the many INFO lines, skip tracing's formatting (same bytes), except in
    // colour.
    if !ansi {
        use mcptap::sink::handshake_line::{LineFormat, write_directly};
        write_directly(match format {
            config::LogFormat::Text => LineFormat::Text,
            config::LogFormat::Json => LineFormat::Json,
        });
    }
}

fn main() -> ExitCode {
    let code = run_main();
    mcptap::sink::log_writer::flush();
    code
}

fn run_main() -> ExitCode {
    if let Some(code) = assets::run_if_requested() {
        return code;
    }
    let cli = Cli::parse();
    if let Some(level) = &cli.log_level
        && let Err(e) = config::check_log_filter(level)
    {
        return fail(&format!("--log-level: {e}"));
    }
    let format = cli.log_format.map(config::LogFormat::from);
    match cli.command {
        Command::Replay {
            files,
            events,
            fail_on_alert,
            quiet,
            threads,
            flow_threads,
            worker_threads,
            worker_whole,
            worker_flow_threads,
            worker_session_threads,
            errors_decide_mode,
            worker_servers,
            trusted_proxies,
            fleet,
            fleet_write,
            fleet_username,
            fleet_password_file,
            fleet_key_prefix,
            fleet_lookup_timeout_ms,
            fleet_tls_ca_file,
            redact,
            redact_key_file,
            limits,
        } => {
            let redactor =
                match mcptap::redact::Redactor::from_settings(&mcptap::redact::PrivacySettings {
                    redact,
                    redact_key_file,
                }) {
                    Ok(r) => r,
                    Err(e) => return fail(&e),
                };
            let defaults = mcptap::fleet::FleetSettings::default();
            let fleet = fleet.map(|url| {
                (
                    mcptap::fleet::FleetSettings {
                        url: Some(url),
                        username: fleet_username,
                        password_file: fleet_password_file,
                        key_prefix: fleet_key_prefix.unwrap_or(defaults.key_prefix),
                        lookup_timeout_ms: fleet_lookup_timeout_ms
                            .unwrap_or(defaults.lookup_timeout_ms),
                        tls_ca_file: fleet_tls_ca_file,
                    },
                    fleet_write,
                )
            });
            let identities = mcptap_core::mcp::identity::Identities::new(
                Default::default(),
                &mcptap_core::mcp::identity::IdentitySettings { trusted_proxies },
            );
            let detectors = mcptap_core::pipeline::Analysis {
                detectors: Detectors { errors_decide_mode },
                identities: match &redactor {
                    Some(r) => identities.with_lineage_key(r.key()),
                    None => identities,
                },
            };
            init_logging(
                format.unwrap_or(config::LogFormat::Text),
                cli.log_level.as_deref().unwrap_or("info"),
            );
            match (limits.limits(), worker_threads) {
                (Err(e), _) => fail(&e),
                (Ok(limits), None) => replay(
                    &files,
                    ReplayTo {
                        events: events.as_deref(),
                        fail_on_alert,
                        quiet,
                        threads: ReplayThreads::of(
                            threads.unwrap_or_else(|| {
                                std::thread::available_parallelism().map_or(1, |n| n.get())
                            }),
                            flow_threads,
                        ),
                    },
                    limits,
                    detectors,
                    fleet,
                    redactor,
                ),
                (Ok(_), Some(threads)) if threads > config::MAX_THREADS => fail(&format!(
                    "--worker-threads must be at most {} (got {threads})",
                    config::MAX_THREADS
                )),
                (Ok(_), Some(threads))
                    if threads.saturating_mul(
                        worker_flow_threads.saturating_add(worker_session_threads),
                    ) > config::MAX_THREADS =>
                {
                    fail(&format!(
                        "--worker-flow-threads plus --worker-session-threads, times --worker-threads, must be at most {} (got ({worker_flow_threads} + {worker_session_threads}) x {threads})",
                        config::MAX_THREADS
                    ))
                }
                (Ok(limits), Some(threads)) => replay_through_workers(
                    &files,
                    events.as_deref(),
                    (fail_on_alert, quiet),
                    (limits, detectors),
                    (
                        threads,
                        mcptap::daemon::WorkerLayout {
                            split: !worker_whole,
                            flow_threads: worker_flow_threads,
                            session_threads: worker_session_threads.max(1),
                        },
                    ),
                    &worker_servers,
                ),
            }
        }
        Command::Run(args) => {
            let cfg = match args.config() {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            init_logging(
                format.unwrap_or(cfg.log.format),
                cli.log_level.as_deref().unwrap_or(&cfg.log.level),
            );
            match mcptap::daemon::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Report {
            input,
            output,
            selection,
            detail_sessions,
        } => forensics(|| {
            let options = input.options()?;
            mcptap::forensics::report(&input.inputs, &output, selection, detail_sessions, &options)
        }),
        Command::Sessions {
            input,
            sort,
            selection,
        } => forensics(|| {
            let options = input.options()?;
            mcptap::forensics::sessions(&input.inputs, sort, selection, &options)
        }),
        Command::Show { id, input } => forensics(|| {
            let options = input.options()?;
            mcptap::forensics::show(&id, &input.inputs, &options)
        }),
        Command::CheckConfig { file } => match Config::load(&file) {
            Ok(cfg) => {
                print!("{}", cfg.effective().to_toml());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Endpoints {
            files,
            require_loopback,
            mut local_macs,
        } => {
            if local_macs.is_empty() {
                local_macs.push(mcptap::endpoints::LO_MAC);
            }
            endpoints(&files, require_loopback, &local_macs)
        }
    }
}

fn endpoints(files: &[String], require_loopback: bool, local_macs: &[[u8; 6]]) -> ExitCode {
    let inv = match mcptap::endpoints::inventory(files, local_macs) {
        Ok(inv) => inv,
        Err(e) => return fail(&e.to_string()),
    };
    if !require_loopback {
        print!("{}", inv.render());
        return ExitCode::SUCCESS;
    }
    match inv.refusal() {
        Some(why) => {
            say_error!("mcptap: error: {}: {why}", files.join(", "));
            ExitCode::from(1)
        }
        None => {
            say!(
                "mcptap: {}: {} frames, {} addresses, all loopback",
                files.join(", "),
                inv.frames,
                inv.addresses.len()
            );
            ExitCode::SUCCESS
        }
    }
}

fn fail(msg: &str) -> ExitCode {
    say_error!("mcptap: error: {msg}");
    ExitCode::from(2)
}

/// Where a replay's results go.
struct ReplayTo<'a> {
    /// The events file (None: standard output).
    events: Option<&'a str>,
    /// Exit with 3 if anything alerted.
    fail_on_alert: bool,
    /// No progress bar, no summary on standard error.
    quiet: bool,
    threads: ReplayThreads,
}

/// How a replay spreads over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplayThreads {
    /// Everything on the calling thread.
    One,
    /// The session layer in `sessions` shards on threads of their own (one: a split
    /// pipeline), and the flow layer on the calling thread (`flows` 0) or in `flows` shards
    /// on threads of their own.
    Split { flows: usize, sessions: usize },
}

impl ReplayThreads {
    /// `threads` in all; `flow_threads` as given, else none below four threads and about half
    /// of the rest from four on (the calling thread then only reads, merges and writes).
    fn of(threads: usize, flow_threads: Option<usize>) -> ReplayThreads {
        match config::stage_threads(threads, flow_threads) {
            None => ReplayThreads::One,
            Some((flows, sessions)) => ReplayThreads::Split { flows, sessions },
        }
    }
}

/// What the events of a replay of files are written in at once: it writes hundreds of
/// megabytes, and with `BufWriter`'s default of 8 KiB every few dozen events cost a `write(2)`.
/// A replay of standard input (`tcpdump -w - | mcptap replay -`) keeps the default, so that
/// a quiet link's events do not wait for 256 KiB of company.
const EVENTS_BUFFER: usize = 256 << 10;
const STREAMED_EVENTS_BUFFER: usize = 8 << 10;

fn replay(
    files: &[String],
    to: ReplayTo<'_>,
    limits: Limits,
    detectors: mcptap_core::pipeline::Analysis,
    fleet: Option<(mcptap::fleet::FleetSettings, bool)>,
    redactor: Option<mcptap::redact::Redactor>,
) -> ExitCode {
    let mut store = match fleet {
        None => None,
        Some((settings, write)) => match mcptap::fleet::FleetStore::open(&settings, write) {
            Ok(mut s) => {
                s.redactor = redactor.clone();
                Some(s)
            }
            Err(e) => {
                say_error!("mcptap: error: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let ReplayTo {
        events,
        fail_on_alert,
        quiet,
        threads,
    } = to;
    let buffer = if files.iter().any(|f| f == "-") {
        STREAMED_EVENTS_BUFFER
    } else {
        EVENTS_BUFFER
    };
    // `--events -` is standard output, as `-` is standard input among the files.
    let sink: Box<dyn Write> = match events.filter(|path| *path != "-") {
        Some(path) => match File::create(path) {
            Ok(f) => Box::new(BufWriter::with_capacity(buffer, f)),
            Err(e) => {
                say_error!("mcptap: error: {path}: cannot create events file: {e}");
                return ExitCode::from(2);
            }
        },
        None => Box::new(BufWriter::with_capacity(buffer, io::stdout().lock())),
    };
    let mut writer = NdjsonWriter::new(sink);
    let mut summary = Summary::default();
    let mut write_error: Option<io::Error> = None;
    let started = Instant::now();
    let mut progress = mcptap::progress::ReplayProgress::for_inputs(files, !quiet);
    // Summary, log and events file, in output order; `prepared` holds the event's NDJSON line
    // and log line when another thread rendered them (`--threads 2`), else nothing.
    let mut deliver = |o: &Output, prepared: mcptap::replay::Prepared<'_>| {
        summary.observe(o);
        log::log_output_prepared(o, prepared.log);
        if let (Output::Event(ev), None) = (o, &write_error) {
            let written = if prepared.line.is_empty() {
                writer.write(ev)
            } else {
                writer.write_rendered(prepared.line)
            };
            if let Err(e) = written {
                write_error = Some(e);
            }
        }
    };
    // The split pipeline has no fleet store: a replay with one stays on one thread.
    let split = match threads {
        ReplayThreads::Split { flows, sessions } if store.is_none() => Some((flows, sessions)),
        _ => None,
    };
    let result = if let Some((flows, 1)) = split {
        // Redaction on the session thread, and rendering while it keeps up (see
        // `PrepareOutput`): the thread with time to spare renders.
        let prepare = |o: &mut Output, into: Option<mcptap::replay::RenderInto<'_>>| {
            if let Output::Event(ev) = o {
                if let Some(r) = &redactor {
                    r.event(ev);
                }
                // On an error rendering the NDJSON line nothing is appended: the writer
                // renders it again and reports it. The log line cannot fail.
                if let Some(into) = into {
                    let _ = mcptap::sink::ndjson::render_event(ev, into.line);
                    log::render_event_line(ev, into.log);
                }
            }
        };
        mcptap::replay::replay_split(
            files,
            limits,
            detectors,
            flows,
            &mut progress,
            Some(&prepare),
            &mut deliver,
        )
    } else {
        let mut on_output = |o: &Output| {
            let redacted;
            let o = match (&redactor, o) {
                (Some(r), Output::Event(ev)) => {
                    let mut ev = ev.clone();
                    r.event(&mut ev);
                    redacted = Output::Event(ev);
                    &redacted
                }
                _ => o,
            };
            deliver(o, mcptap::replay::Prepared::default());
        };
        if let Some((flows, sessions)) = split {
            // The output on this thread (and the flow layer, unless it is sharded too), the
            // session layer in shards by client on the others.
            mcptap::sharded::replay_sharded(
                files,
                limits,
                detectors,
                (flows, sessions),
                &mut progress,
                &mut on_output,
            )
        } else {
            mcptap::replay::replay_with_fleet(
                files,
                limits,
                detectors,
                store.as_mut(),
                &mut progress,
                &mut on_output,
            )
        }
    };
    progress.finish();
    if let Some(s) = &store {
        let c = s.counts;
        let latency = s
            .lookup_latency_us()
            .map_or(String::new(), |(p50, p99, max)| {
                format!("; lookup p50 {p50} µs, p99 {p99} µs, max {max} µs")
            });
        say!(
            "fleet store: {} lookups ({} found), {} writes ({} conflicts), {} alerts already raised elsewhere, {} errors, {} unreadable records{latency}",
            c.lookups,
            c.found,
            c.writes,
            c.conflicts,
            c.alerts_deduplicated,
            c.errors,
            c.unreadable
        );
    }
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = writer.flush();
            say_error!("mcptap: error: {e}");
            return ExitCode::from(2);
        }
    };
    summary.capture_bytes_skipped = report.read.skipped_bytes();
    if write_error.is_none()
        && let Err(e) =
            writer.write_value(&summary.totals_event("summary", &report.stats, report.span, None))
    {
        write_error = Some(e);
    }
    let flushed = writer.flush();
    for t in &report.read.truncations {
        tracing::warn!(file = %t.path, offset = t.offset, "capture file truncated mid-record; events up to the cut were emitted");
    }
    for r in &report.read.resyncs {
        tracing::warn!("{}", r.describe());
    }
    for w in &report.read.warnings {
        tracing::warn!("{w}");
    }
    warn_snaplen_cuts(&report.read);
    if let Some(e) = write_error.or(flushed.err())
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        say_error!("mcptap: error: writing events: {e}");
        return ExitCode::from(2);
    }
    if !quiet {
        summary.say(&report.stats, report.span, started.elapsed());
    }
    if fail_on_alert && summary.total_alerts() > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

fn replay_through_workers(
    files: &[String],
    events: Option<&str>,
    (fail_on_alert, quiet): (bool, bool),
    (limits, detectors): (Limits, mcptap_core::pipeline::Analysis),
    (threads, layout): (usize, mcptap::daemon::WorkerLayout),
    servers: &[std::net::SocketAddr],
) -> ExitCode {
    let started = Instant::now();
    match mcptap::daemon::replay_through_workers(
        files, limits, detectors, threads, layout, servers, events,
    ) {
        Ok(r) => {
            for t in &r.read.truncations {
                tracing::warn!(file = %t.path, offset = t.offset, "capture file truncated mid-record; events up to the cut were emitted");
            }
            warn_snaplen_cuts(&r.read);
            for resync in &r.read.resyncs {
                tracing::warn!("{}", resync.describe());
            }
            for w in &r.read.warnings {
                tracing::warn!("{w}");
            }
            let mut summary = r.summary;
            summary.capture_bytes_skipped = r.read.skipped_bytes();
            if !quiet {
                summary.say(&r.stats, Default::default(), started.elapsed());
            }
            if fail_on_alert && summary.total_alerts() > 0 {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(&e),
    }
}

/// One warning per file whose packets the capture's snaplen cut short.
fn warn_snaplen_cuts(read: &mcptap::capture::ReadSummary) {
    for cut in &read.snaplen_cuts {
        tracing::warn!(
            file = %cut.path,
            packets = cut.packets,
            snaplen = cut.caplen,
            "packets cut short by the capture's snaplen: what they carried is lost (counted as gaps); capture with `tcpdump -s 0`"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn run_events_to_dash_are_standard_output() {
        let config = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("parses");
            let Command::Run(run) = cli.command else {
                panic!("not run")
            };
            run.config().expect("config")
        };
        let dash = config(&["mcptap", "run", "-i", "lo", "--events", "-"]);
        assert!(dash.events.stdout);
        assert_eq!(dash.events.file, None);
        let file = config(&["mcptap", "run", "-i", "lo", "--events", "/tmp/e.ndjson"]);
        assert!(!file.events.stdout);
        assert_eq!(file.events.file.as_deref(), Some("/tmp/e.ndjson"));
    }

    #[test]
    fn replay_threads_spread_over_the_layers() {
        use ReplayThreads::{One, Split};
        assert_eq!(ReplayThreads::of(1, Some(3)), One);
        assert_eq!(ReplayThreads::of(0, None), One);
        assert_eq!(
            ReplayThreads::of(2, None),
            Split {
                flows: 0,
                sessions: 1
            }
        );
        assert_eq!(
            ReplayThreads::of(3, None),
            Split {
                flows: 0,
                sessions: 2
            }
        );
        assert_eq!(
            ReplayThreads::of(4, None),
            Split {
                flows: 1,
                sessions: 2
            }
        );
        assert_eq!(
            ReplayThreads::of(8, None),
            Split {
                flows: 3,
                sessions: 4
            }
        );
        assert_eq!(
            ReplayThreads::of(3, Some(1)),
            Split {
                flows: 1,
                sessions: 1
            }
        );
        // The session layer keeps a thread whatever is asked; flow shards are at most N-1.
        assert_eq!(
            ReplayThreads::of(2, Some(2)),
            Split {
                flows: 1,
                sessions: 1
            }
        );
        assert_eq!(
            ReplayThreads::of(3, Some(40)),
            Split {
                flows: 2,
                sessions: 1
            }
        );
        assert_eq!(
            ReplayThreads::of(4, Some(0)),
            Split {
                flows: 0,
                sessions: 3
            }
        );
    }

    /// Config keys without a replay flag: they configure live capture, the metrics endpoint or
    /// the daemon, which replay has none of. Every other key, and every `[limits]` key, has one.
    const LIVE_ONLY_KEYS: &[&str] = &[
        "user",
        "state.snapshot_file",
        "state.snapshot_interval_secs",
        "capture.interfaces",
        "capture.filter",
        "capture.snaplen",
        "capture.promiscuous",
        "capture.buffer_bytes",
        "capture.read_timeout_ms",
        "capture.threads",
        "capture.split_stages",
        "capture.flow_threads",
        "capture.session_threads",
        "metrics.listen",
        "metrics.max_servers",
        "metrics.max_connections",
        "metrics.header_timeout_secs",
        "metrics.idle_timeout_secs",
        "metrics.server_names",
        "servers",
        "events.stdout",
        "events.stats_interval_secs",
    ];

    /// Replay flags of config keys outside `[limits]` whose name differs from the key's.
    const REPLAY_FLAG_OF_KEY: &[(&str, &str)] = &[
        ("events.file", "events"),
        ("detect.errors_decide_mode", "errors-decide-mode"),
        ("identity.trusted_proxies", "trusted-proxy"),
        ("fleet.url", "fleet"),
        ("fleet.username", "fleet-username"),
        ("fleet.password_file", "fleet-password-file"),
        ("fleet.key_prefix", "fleet-key-prefix"),
        ("fleet.lookup_timeout_ms", "fleet-lookup-timeout-ms"),
        ("fleet.tls_ca_file", "fleet-tls-ca-file"),
        ("privacy.redact", "redact"),
        ("privacy.redact_key_file", "redact-key-file"),
        ("log.format", "log-format"),
        ("log.level", "log-level"),
    ];

    /// Every key of a config file with every optional key set, as `section.key` (`user` alone).
    fn config_keys() -> Vec<String> {
        let mut cfg = Config {
            user: Some("mcptap".into()),
            ..Config::default()
        };
        cfg.events.file = Some("events.ndjson".into());
        cfg.state.snapshot_file = Some("state.json".into());
        cfg.fleet.url = Some("redis://127.0.0.1:6379/".into());
        cfg.fleet.username = Some("mcptap".into());
        cfg.fleet.password_file = Some("/etc/mcptap/redis.pass".into());
        cfg.fleet.tls_ca_file = Some("/etc/mcptap/redis-ca.pem".into());
        cfg.privacy.redact_key_file = Some("/etc/mcptap/redact.key".into());
        cfg.capture.flow_threads = Some(0);
        cfg.capture.session_threads = Some(1);
        let server: std::net::SocketAddr = "10.0.0.5:8080".parse().expect("addr");
        cfg.servers.insert(server, "gw".into());
        cfg.metrics.server_names.insert(server, "gw".into());
        cfg.limits.http.max_sse_event_bytes += 1;
        let toml::Value::Table(sections) = toml::Value::try_from(&cfg).expect("serialises") else {
            panic!("a config is a table");
        };
        let mut keys = Vec::new();
        for (section, value) in sections {
            match value {
                // Its keys are server endpoints, not settings.
                toml::Value::Table(_) if section == "servers" => keys.push(section),
                toml::Value::Table(t) => keys.extend(t.keys().map(|k| format!("{section}.{k}"))),
                _ => keys.push(section),
            }
        }
        keys
    }

    fn replay_flags() -> Vec<String> {
        let cli = Cli::command();
        let replay = cli.find_subcommand("replay").expect("replay subcommand");
        cli.get_arguments()
            .chain(replay.get_arguments())
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect()
    }

    fn replay_limits(flags: &[String]) -> Result<Limits, String> {
        let args = ["mcptap".to_string(), "replay".into()]
            .into_iter()
            .chain(flags.iter().cloned())
            .chain(["capture.pcap".to_string()]);
        let Command::Replay { limits, .. } = Cli::try_parse_from(args)
            .map_err(|e| e.to_string())?
            .command
        else {
            panic!("parsed as replay");
        };
        limits.limits()
    }

    #[test]
    fn every_config_key_has_a_replay_flag_or_is_live_only() {
        let flags = replay_flags();
        let keys = config_keys();
        assert!(
            keys.iter().any(|k| k == "limits.max_sse_event_bytes"),
            "{keys:?}"
        );
        for key in &keys {
            if LIVE_ONLY_KEYS.contains(&key.as_str()) {
                assert!(
                    !key.starts_with("limits."),
                    "{key}: limits apply to replay too"
                );
                continue;
            }
            let flag = match REPLAY_FLAG_OF_KEY.iter().find(|(k, _)| k == key) {
                Some((_, flag)) => flag.to_string(),
                None => key.strip_prefix("limits.").unwrap_or(key).replace('_', "-"),
            };
            assert!(
                flags.contains(&flag),
                "config key {key}: no replay flag --{flag}, and not listed as live-only"
            );
        }
        for listed in LIVE_ONLY_KEYS
            .iter()
            .chain(REPLAY_FLAG_OF_KEY.iter().map(|(k, _)| k))
        {
            assert!(
                keys.iter().any(|k| k == listed),
                "{listed} is no config key"
            );
        }
    }

    #[test]
    fn flags_and_config_file_give_equal_limits() {
        let defaults = toml::Value::try_from(LimitSettings::default()).expect("serialises");
        let toml::Value::Table(defaults) = defaults else {
            panic!("a table");
        };
        let mut keys: Vec<String> = defaults.keys().cloned().collect();
        keys.push("max_sse_event_bytes".into());
        // One key at a time, each with its own value: a flag mapped onto the wrong field, or
        // onto none, gives a different Limits than the file.
        for (i, key) in keys.iter().enumerate() {
            let value = 2_000_000_000 + i as u64;
            let from_file: Config =
                toml::from_str(&format!("[limits]\n{key} = {value}\n")).expect("config");
            let from_flags =
                replay_limits(&[format!("--{}", key.replace('_', "-")), value.to_string()]);
            assert_eq!(from_flags, Ok(from_file.limits), "{key}");
            assert_ne!(from_file.limits, Limits::default(), "{key} changes nothing");
        }
        let from_file: Config = toml::from_str("").expect("empty config");
        assert_eq!(replay_limits(&[]), Ok(from_file.limits));
        assert_eq!(from_file.limits, Limits::default());
    }

    #[test]
    fn flag_seconds_saturate_and_blind_limits_are_refused() {
        let huge =
            replay_limits(&["--lineage-window-secs".into(), u64::MAX.to_string()]).expect("valid");
        assert_eq!(huge.session.lineage_window_ns, i64::MAX);
        let e = replay_limits(&["--max-flows".into(), "0".into()]).expect_err("blind");
        assert!(e.contains("max_flows") && !e.contains('\n'), "{e}");
    }
}
