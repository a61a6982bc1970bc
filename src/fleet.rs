//! Fleet mode's store adapter: session state shared through Redis (or Valkey, which speaks the
//! same protocol), keyed fleet-wide by (server identity, session id). The core asks
//! ([`SharedRequest`]); this adapter answers from the store and writes changes.
//!
//! A store that is down or slow never stops the monitor: a failed or timed-out lookup is
//! answered "none" (the local view, as without a store), counted, warned about once per
//! outage, and the connection is retried with back-off.

use mcptap_core::model::{Output, SharedRequest};
use std::time::{Duration, Instant};

/// `[fleet]` settings (and `replay --fleet*` flags).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetSettings {
    /// `redis://host:port/db`; none: no fleet mode.
    pub url: Option<String>,
    pub username: Option<String>,
    /// A file holding the password (never on the command line, never logged).
    pub password_file: Option<String>,
    /// Prefix of every key mcptap writes (give its ACL user only `~prefix*`).
    pub key_prefix: String,
    /// Longest a lookup may take before the session goes on with its local view.
    pub lookup_timeout_ms: u64,
    /// `rediss://`: the CA (PEM) the store's certificate must chain to; none: the system's
    /// roots.
    pub tls_ca_file: Option<String>,
}

impl Default for FleetSettings {
    fn default() -> Self {
        FleetSettings {
            url: None,
            username: None,
            password_file: None,
            key_prefix: "mcptap:".into(),
            lookup_timeout_ms: 50,
            tls_ca_file: None,
        }
    }
}

/// Compare-and-set of a session record and its version (KEYS: record, version; ARGV: base
/// version, new version, record, TTL in ms). Nothing stored (never, or expired) accepts any.
/// A version key of another type (only a hand or a hostile host puts one there) reads as
/// nothing stored, and is written over: it must not fail the batch's writes as an outage.
const CAS_SCRIPT: &str = r#"
local v = redis.pcall('GET', KEYS[2])
if type(v) == 'table' then
  if v.err == nil or string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then
    return redis.error_reply(v.err or 'ERR version')
  end
  v = false
end
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
  return 1
end
return 0
"#;

/// Most bytes of one stored record a lookup reads: a record holds a session's lasting state
/// (its own is ~1 KB), and whatever another host (or anyone with the store's password) left
/// under a key — up to Redis's 512 MB — must not be read whole. Beyond: counted as garbage.
pub const MAX_RECORD_BYTES: usize = 1 << 20;
/// Most record bytes one lookup round reads; the rest of its keys are asked again in the next
/// round, so that a batch of thousands of large records is never held at once, and a round
/// of them stays well within the lookup timeout (2 MiB: ~17 ms at 1 Gbit/s).
const MAX_ROUND_BYTES: usize = 2 << 20;

/// Reads records (KEYS; ARGV: most bytes of one, most bytes in all), those of the first keys
/// that fit in all (at least one): each is its text, nil when absent, -1 when it cannot be a
/// record (too large, or a key of another type). One bad key must not fail the others, nor
/// read as an outage. Sizes come from STRLEN (O(1)) before any GET: a GET of a huge value
/// would copy it inside Redis, blocking every client of the store while it does.
const READ_SCRIPT: &str = r#"
local out, total = {}, 0
local one, all = tonumber(ARGV[1]), tonumber(ARGV[2])
for i, k in ipairs(KEYS) do
  local n = redis.pcall('STRLEN', k)
  if type(n) == 'table' then
    if n.err == nil or string.sub(n.err, 1, 9) ~= 'WRONGTYPE' then
      return redis.error_reply(n.err or 'ERR read')
    end
    out[i] = -1
  elseif n > one then
    out[i] = -1
  elseif total > 0 and total + n > all then
    break
  else
    total = total + n
    out[i] = redis.call('GET', k)
  end
end
return out
"#;

/// A stored record as a lookup read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Nothing stored (or the store failed: the local view).
    Absent,
    Found(String),
    /// Something that cannot be a record: larger than [`MAX_RECORD_BYTES`], not UTF-8 text,
    /// or a key of another type.
    Unreadable,
}

impl Record {
    /// What the core is handed: an unreadable record as one that does not parse (the core
    /// counts it as garbage and goes on with the local view).
    fn as_core(&self) -> Option<&str> {
        match self {
            Record::Absent => None,
            Record::Found(text) => Some(text),
            Record::Unreadable => Some(""),
        }
    }
}

/// What [`FleetStore::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Yes,
    /// Another instance wrote first: merge and write again.
    Conflict,
    Failed,
    /// A read-only store (`replay --fleet` without `--fleet-write`).
    NotWriting,
}

/// Why a store operation failed (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetError {
    Connect,
    Timeout,
    Io,
}

impl FleetError {
    pub fn as_str(self) -> &'static str {
        match self {
            FleetError::Connect => "connect",
            FleetError::Timeout => "timeout",
            FleetError::Io => "io",
        }
    }
}

/// Counts of what the store did, for the summary and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetCounts {
    pub lookups: u64,
    pub found: u64,
    pub writes: u64,
    pub errors: u64,
    /// Errors by operation and reason: lookup, write × connect, timeout, io.
    pub lookup_errors: [u64; 3],
    pub write_errors: [u64; 3],
    /// Updates refused because another instance had changed the session (then merged).
    pub conflicts: u64,
    /// Alerts another instance had raised already: not repeated.
    pub alerts_deduplicated: u64,
    /// Stored values that cannot be records (see [`Record::Unreadable`]).
    pub unreadable: u64,
}

/// Most lookup latencies kept for the percentiles (a reservoir of the first ones).
const MAX_LATENCIES: usize = 1 << 20;

/// One worker's (or a replay's) store: the redis crate's tokio `ConnectionManager` (it
/// reconnects by itself, re-authenticating), driven on a current-thread runtime of its own so
/// that the pipeline's synchronous loop can wait for an answer, at most `lookup_timeout_ms`.
pub struct FleetStore {
    client: redis::Client,
    conn: Option<redis::aio::ConnectionManager>,
    rt: tokio::runtime::Runtime,
    settings: FleetSettings,
    write: bool,
    timeout: Duration,
    /// Down since, and when to try again.
    down: Option<(Instant, Instant)>,
    backoff: Duration,
    pub counts: FleetCounts,
    /// Lookup round trips, µs.
    latencies: Vec<u32>,
    /// Redaction of what is stored (client addresses).
    pub redactor: Option<crate::redact::Redactor>,
}

impl FleetStore {
    /// A store for `settings` (which name a URL); `write`: also store changes.
    pub fn open(settings: &FleetSettings, write: bool) -> Result<FleetStore, String> {
        let url = settings.url.as_deref().ok_or("fleet: no url")?;
        // rustls needs its crypto chosen once per process (a second install is a no-op).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let password = match &settings.password_file {
            None => None,
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| format!("fleet password_file {f}: {e}"))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
        };
        // Credentials live in the connection info, so every reconnect authenticates again.
        use redis::IntoConnectionInfo;
        let info = url
            .into_connection_info()
            .map_err(|e| format!("fleet url: {e}"))?;
        let mut redis_settings = info.redis_settings().clone();
        if let Some(user) = &settings.username {
            redis_settings = redis_settings.set_username(user);
        }
        if let Some(pass) = &password {
            redis_settings = redis_settings.set_password(pass);
        }
        let info = info.set_redis_settings(redis_settings);
        let client = match &settings.tls_ca_file {
            Some(ca) if url.starts_with("rediss://") => {
                let pem = std::fs::read(ca).map_err(|e| format!("fleet tls_ca_file {ca}: {e}"))?;
                redis::Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem),
                    },
                )
            }
            _ => redis::Client::open(info),
        }
        .map_err(|e| format!("fleet url: {e}"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("fleet: runtime: {e}"))?;
        Ok(FleetStore {
            client,
            conn: None,
            rt,
            settings: settings.clone(),
            write,
            timeout: Duration::from_millis(settings.lookup_timeout_ms.max(1)),
            down: None,
            backoff: Duration::from_millis(100),
            counts: FleetCounts::default(),
            latencies: Vec::new(),
            redactor: None,
        })
    }

    /// The connection manager, made on first use and again after it could not be made; no
    /// attempt at all while an outage waits for its next retry (so a dead store costs nothing).
    fn connection(&mut self) -> Result<redis::aio::ConnectionManager, FleetError> {
        if let Some((_, retry_at)) = self.down
            && Instant::now() < retry_at
        {
            return Err(FleetError::Connect);
        }
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(200))))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(10));
        let limit = self.timeout.max(Duration::from_millis(200)) * 2;
        let client = &self.client;
        // The timer must be made inside the runtime.
        let made = self.rt.block_on(async move {
            tokio::time::timeout(limit, client.get_connection_manager_with_config(config)).await
        });
        match made {
            Ok(Ok(c)) => {
                self.conn = Some(c.clone());
                Ok(c)
            }
            _ => Err(FleetError::Connect),
        }
    }

    /// Runs one store operation within the lookup timeout.
    fn run<T, F>(
        &mut self,
        op: impl FnOnce(redis::aio::ConnectionManager) -> F,
    ) -> Result<T, FleetError>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.connection()?;
        let limit = self.timeout;
        let fut = op(conn);
        match self
            .rt
            .block_on(async move { tokio::time::timeout(limit, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Self::classify(&e)),
            Err(_) => Err(FleetError::Timeout),
        }
    }

    fn failed(&mut self, e: FleetError, write: bool) {
        self.counts.errors += 1;
        let slot = match e {
            FleetError::Connect => 0,
            FleetError::Timeout => 1,
            FleetError::Io => 2,
        };
        if write {
            self.counts.write_errors[slot] += 1;
        } else {
            self.counts.lookup_errors[slot] += 1;
        }
        let now = Instant::now();
        match self.down {
            None => {
                tracing::warn!(
                    reason = e.as_str(),
                    "fleet store unreachable: going on with the local view"
                );
                self.down = Some((now, now + self.backoff));
            }
            Some((since, _)) => {
                self.backoff = (self.backoff * 2).min(Duration::from_secs(10));
                self.down = Some((since, now + self.backoff));
            }
        }
    }

    fn recovered(&mut self) {
        if let Some((since, _)) = self.down.take() {
            tracing::info!(
                down_for_ms = since.elapsed().as_millis() as u64,
                "fleet store reachable again"
            );
            self.backoff = Duration::from_millis(100);
        }
    }

    fn classify(e: &redis::RedisError) -> FleetError {
        if e.is_timeout() {
            FleetError::Timeout
        } else if e.is_connection_dropped() || e.is_connection_refusal() {
            FleetError::Connect
        } else {
            FleetError::Io
        }
    }

    /// Percentiles of the lookup round trips so far (µs): p50, p99, max.
    pub fn lookup_latency_us(&self) -> Option<(u32, u32, u32)> {
        let mut v = self.latencies.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.99), v[v.len() - 1]))
    }

    /// The store answered the latest operation (no outage going on).
    pub fn is_up(&self) -> bool {
        self.down.is_none()
    }

    /// The record stored under `key` ([`Record::Absent`] when the store failed).
    pub fn lookup(&mut self, key: &str) -> Record {
        let mut round = self.lookup_round(std::slice::from_ref(&key.to_string()));
        round.pop().unwrap_or(Record::Absent)
    }

    /// Stores `record` under `key` for `ttl_ns` if the stored version is `base_version` (or
    /// nothing is stored): a compare-and-set in one Lua script, so that instances changing one
    /// session at once (no load-balancer affinity) never overwrite each other.
    pub fn update(
        &mut self,
        key: &str,
        record: &str,
        ttl_ns: i64,
        base_version: u64,
        version: u64,
    ) -> Written {
        if !self.write {
            return Written::NotWriting;
        }
        let full = format!("{}{key}", self.settings.key_prefix);
        let ttl_ms = (ttl_ns / 1_000_000).max(1);
        let record = record.to_string();
        let done = self.run(|mut c| async move {
            redis::Script::new(CAS_SCRIPT)
                .key(&full)
                .key(format!("{full}:v"))
                .arg(base_version)
                .arg(version)
                .arg(record)
                .arg(ttl_ms)
                .invoke_async::<i64>(&mut c)
                .await
        });
        match done {
            Ok(1) => {
                self.recovered();
                self.counts.writes += 1;
                Written::Yes
            }
            Ok(_) => {
                self.recovered();
                self.counts.conflicts += 1;
                Written::Conflict
            }
            Err(e) => {
                self.failed(e, true);
                Written::Failed
            }
        }
    }

    /// The records of the first of `keys` in one round trip: at least one, and as many as fit
    /// in [`MAX_ROUND_BYTES`] (ask again for the rest). [`Record::Absent`] for all on a failure.
    pub fn lookup_round(&mut self, keys: &[String]) -> Vec<Record> {
        if keys.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let full: Vec<String> = keys
            .iter()
            .map(|k| format!("{}{k}", self.settings.key_prefix))
            .collect();
        let got = self.run(|mut c| async move {
            redis::cmd("EVAL")
                .arg(READ_SCRIPT)
                .arg(full.len())
                .arg(&full)
                .arg(MAX_RECORD_BYTES)
                .arg(MAX_ROUND_BYTES)
                .query_async::<Vec<redis::Value>>(&mut c)
                .await
        });
        let replies = match got {
            Ok(v) if !v.is_empty() && v.len() <= keys.len() => v,
            Ok(_) => {
                // Not what the script returns: nothing of it is trusted.
                self.counts.lookups += 1;
                self.counts.unreadable += 1;
                return vec![Record::Unreadable];
            }
            Err(e) => {
                self.counts.lookups += keys.len() as u64;
                self.failed(e, false);
                return vec![Record::Absent; keys.len()];
            }
        };
        self.recovered();
        if self.latencies.len() < MAX_LATENCIES {
            let us = started.elapsed().as_micros();
            self.latencies.push(u32::try_from(us).unwrap_or(u32::MAX));
        }
        let mut out = Vec::with_capacity(keys.len());
        for v in replies {
            let record = match v {
                redis::Value::Nil => Record::Absent,
                redis::Value::BulkString(bytes) => match String::from_utf8(bytes) {
                    Ok(text) => Record::Found(text),
                    Err(_) => Record::Unreadable,
                },
                _ => Record::Unreadable,
            };
            self.counts.found += u64::from(matches!(record, Record::Found(_)));
            self.counts.unreadable += u64::from(record == Record::Unreadable);
            out.push(record);
        }
        self.counts.lookups += out.len() as u64;
        out
    }

    /// Writes `updates` (compare-and-set each) and claims their alerts in one pipelined round
    /// trip. Per update: what the write did, and for each alert whether this instance is the
    /// first to raise it. A failed or read-only store writes nothing and claims every alert.
    pub fn write_batch(&mut self, updates: &[PendingUpdate]) -> Vec<(Written, Vec<bool>)> {
        let all_first = |w: Written| {
            updates
                .iter()
                .map(|u| (w, vec![true; u.alerts.len()]))
                .collect::<Vec<_>>()
        };
        if !self.write {
            return all_first(Written::NotWriting);
        }
        let prefix = self.settings.key_prefix.clone();
        let mut pipe = redis::pipe();
        for u in updates {
            let full = format!("{prefix}{}", u.key);
            let record = match &self.redactor {
                Some(r) => std::borrow::Cow::Owned(r.record(&u.record)),
                None => std::borrow::Cow::Borrowed(u.record.as_str()),
            };
            let ttl_ms = (u.ttl_ns / 1_000_000).max(1);
            pipe.cmd("EVAL")
                .arg(CAS_SCRIPT)
                .arg(2)
                .arg(&full)
                .arg(format!("{full}:v"))
                .arg(u.base_version)
                .arg(u.version)
                .arg(record.as_ref())
                .arg(ttl_ms);
            for a in &u.alerts {
                pipe.cmd("SET")
                    .arg(format!("{prefix}alert:{}", a.dedup))
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
            }
        }
        let replies =
            self.run(|mut c| async move { pipe.query_async::<Vec<redis::Value>>(&mut c).await });
        let replies = match replies {
            Ok(r) => {
                self.recovered();
                r
            }
            Err(e) => {
                self.failed(e, true);
                return all_first(Written::Failed);
            }
        };
        let mut replies = replies.into_iter();
        let mut out = Vec::with_capacity(updates.len());
        for u in updates {
            let written = match replies.next() {
                Some(redis::Value::Int(1)) => {
                    self.counts.writes += 1;
                    Written::Yes
                }
                Some(redis::Value::Int(_)) => {
                    self.counts.conflicts += 1;
                    Written::Conflict
                }
                _ => Written::Failed,
            };
            let firsts = u
                .alerts
                .iter()
                .map(|_| {
                    let first = !matches!(replies.next(), Some(redis::Value::Nil));
                    if !first {
                        self.counts.alerts_deduplicated += 1;
                    }
                    first
                })
                .collect();
            out.push((written, firsts));
        }
        out
    }

    /// Whether this instance is the first of the fleet to raise the alert `dedup` (within
    /// `ttl_ns`). A store that fails says yes: a duplicate beats a lost alert.
    pub fn first_alert(&mut self, dedup: &str, ttl_ns: i64) -> bool {
        if !self.write {
            return true;
        }
        let full = format!("{}alert:{dedup}", self.settings.key_prefix);
        let ttl_ms = (ttl_ns / 1_000_000).max(1);
        let set = self.run(|mut c| async move {
            redis::cmd("SET")
                .arg(&full)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<Option<String>>(&mut c)
                .await
        });
        match set {
            Ok(v) => {
                self.recovered();
                if v.is_none() {
                    self.counts.alerts_deduplicated += 1;
                }
                v.is_some()
            }
            Err(e) => {
                self.failed(e, true);
                true
            }
        }
    }
}

/// What answers the store's replies: the pipeline.
pub trait SharedState {
    fn on_shared_state(&mut self, key: &str, record: Option<&str>, out: &mut Vec<Output>);
    fn on_shared_conflict(&mut self, key: &str, stored: &str, out: &mut Vec<Output>);
}

impl SharedState for mcptap_core::pipeline::Pipeline {
    fn on_shared_state(&mut self, key: &str, record: Option<&str>, out: &mut Vec<Output>) {
        mcptap_core::pipeline::Pipeline::on_shared_state(self, key, record, out)
    }
    fn on_shared_conflict(&mut self, key: &str, stored: &str, out: &mut Vec<Output>) {
        mcptap_core::pipeline::Pipeline::on_shared_conflict(self, key, stored, out)
    }
}

/// Rounds of merge-and-write one session gets within one call before its change waits for
/// the next (heavy contention on one session).
const MAX_CONFLICT_ROUNDS: usize = 4;

/// Serves the store requests among `outputs`: lookups and conflicts are answered through
/// `pipeline`, whose own outputs are served in turn; alerts a change raised are published
/// when the fleet has not seen them; everything else is handed to `on_output` in order.
pub fn serve(
    store: &mut FleetStore,
    outputs: &mut Vec<Output>,
    pipeline: &mut dyn SharedState,
    on_output: &mut dyn FnMut(&Output),
) {
    let mut queue: std::collections::VecDeque<Output> = outputs.drain(..).collect();
    let mut more = Vec::new();
    let mut rounds: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut updates: Vec<PendingUpdate> = Vec::new();
    let mut lookups: Vec<String> = Vec::new();
    loop {
        while let Some(o) = queue.pop_front() {
            match o {
                Output::Shared(SharedRequest::Lookup { key }) => lookups.push(key),
                Output::Shared(SharedRequest::Update {
                    key,
                    record,
                    ttl_ns,
                    base_version,
                    version,
                    alerts,
                }) => updates.push(PendingUpdate {
                    key,
                    record,
                    ttl_ns,
                    base_version,
                    version,
                    alerts,
                }),
                other => on_output(&other),
            }
            for (i, m) in more.drain(..).enumerate() {
                queue.insert(i, m);
            }
        }
        if !lookups.is_empty() {
            // Every session first seen in this call, in one round trip (the read script).
            // (More round trips only when their records are large: each round's are handed
            // over before the next is read.)
            let keys = std::mem::take(&mut lookups);
            let mut at = 0;
            while at < keys.len() {
                let records = store.lookup_round(&keys[at..]);
                for (key, record) in keys[at..].iter().zip(&records) {
                    pipeline.on_shared_state(key, record.as_core(), &mut more);
                }
                at += records.len().max(1);
            }
            queue.extend(more.drain(..));
            continue;
        }
        if updates.is_empty() {
            return;
        }
        // One round trip for every change of the call, and their alerts.
        let results = store.write_batch(&updates);
        let mut conflicts: Vec<String> = Vec::new();
        for (u, (written, first)) in updates.drain(..).zip(results) {
            if written == Written::Conflict {
                let n = rounds.entry(u.key.clone()).or_default();
                *n += 1;
                if *n <= MAX_CONFLICT_ROUNDS {
                    conflicts.push(u.key);
                }
            }
            for (a, first) in u.alerts.into_iter().zip(first) {
                if first {
                    on_output(&Output::Event(a.event));
                }
            }
        }
        // The stored records of every conflict of the batch, read together (one round trip
        // each was a round trip per session: a store whose versions another host keeps moving
        // made every write cost one).
        let mut at = 0;
        while at < conflicts.len() {
            let records = store.lookup_round(&conflicts[at..]);
            for (key, record) in conflicts[at..].iter().zip(&records) {
                if let Some(stored) = record.as_core() {
                    pipeline.on_shared_conflict(key, stored, &mut more);
                }
            }
            at += records.len().max(1);
        }
        queue.extend(more.drain(..));
    }
}

/// A change waiting for the call's write batch.
pub struct PendingUpdate {
    pub key: String,
    pub record: String,
    pub ttl_ns: i64,
    pub base_version: u64,
    pub version: u64,
    pub alerts: Vec<mcptap_core::model::SharedAlert>,
}
