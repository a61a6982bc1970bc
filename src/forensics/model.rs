//! The forensics model: sessions and lineages built from JSON event values, whatever input they
//! came from (an events file, or a capture replayed in-process). One code path, so a report of a
//! capture and of its NDJSON say the same.
//!
//! Memory is bounded: at most `--max-sessions` sessions and lineages have a record (the events of
//! others are counted in the totals and said to be), each with a few counters; only
//! `detail_limit` of them keep their timeline (and each at most [`MAX_TIMELINE_ENTRIES`]);
//! distinct servers, sessions and lineages are counted up to a bound.

use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// `--detail-sessions` default.
pub const DEFAULT_DETAIL_SESSIONS: usize = 200;
/// Timeline entries kept per detailed session; later ones are only counted.
pub const MAX_TIMELINE_ENTRIES: usize = 2000;
/// Distinct client addresses remembered per session; more are only counted.
const MAX_CLIENTS: usize = 16;
/// Malformed event lines quoted per input (all are counted).
const MAX_MALFORMED_EXAMPLES: usize = 3;

/// Which sessions to keep: `--session`, `--lineage`, or `show ID` (either).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub session: Option<String>,
    pub lineage: Option<String>,
    /// A session id or a lineage id (`show`).
    pub any: Option<String>,
}

impl Filter {
    pub fn is_active(&self) -> bool {
        self.session.is_some() || self.lineage.is_some() || self.any.is_some()
    }

    fn accepts(&self, session_id: Option<&str>, lineage_id: Option<&str>) -> bool {
        let is = |want: &Option<String>, got: Option<&str>| {
            want.as_deref().is_none_or(|w| Some(w) == got)
        };
        let any = self
            .any
            .as_deref()
            .is_none_or(|w| Some(w) == session_id || Some(w) == lineage_id);
        is(&self.session, session_id) && is(&self.lineage, lineage_id) && any
    }

    /// The filter in words, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = &self.session {
            parts.push(format!("session \"{s}\""));
        }
        if let Some(l) = &self.lineage {
            parts.push(format!("lineage \"{l}\""));
        }
        if let Some(a) = &self.any {
            parts.push(format!("session or lineage \"{a}\""));
        }
        parts.join(" and ")
    }
}

/// What a timeline belongs to: an MCP session on a server, or, for sessionless (modern,
/// stateless) traffic, a client lineage; events with neither are grouped by server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SessionKey {
    Session { server: String, id: String },
    Lineage(String),
    Sessionless(String),
}

impl SessionKey {
    pub fn kind(&self) -> &'static str {
        match self {
            SessionKey::Session { .. } => "session",
            SessionKey::Lineage(_) => "lineage",
            SessionKey::Sessionless(_) => "sessionless",
        }
    }

    /// The id a user types (`show ID`, `--session ID`); the server for sessionless traffic.
    pub fn id(&self) -> &str {
        match self {
            SessionKey::Session { id, .. } => id,
            SessionKey::Lineage(id) => id,
            SessionKey::Sessionless(server) => server,
        }
    }

    fn hash64(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    Capture,
    Events,
}

impl InputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Capture => "capture",
            InputKind::Events => "events",
        }
    }
}

/// One input as read: a capture (or a set replayed as one), or an events file.
#[derive(Debug, Clone)]
pub struct InputInfo {
    pub name: String,
    pub kind: InputKind,
    pub events: u64,
    /// Lines that are not a JSON object with an `event` field: counted, not fatal.
    pub malformed_lines: u64,
    pub malformed_examples: Vec<String>,
    /// Events of kinds this version does not read (newer writers).
    pub unknown_events: u64,
    /// The input's `summary` event, else its latest `stats` event: its blind-spot totals.
    pub totals: Option<Value>,
    pub totals_source: Option<&'static str>,
    /// Reader warnings (a truncated capture, skipped bytes).
    pub notes: Vec<String>,
}

/// One exchange, reduced to what a timeline shows.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeMark {
    pub method: String,
    pub tool: Option<String>,
    pub request_id: String,
    pub client: String,
    pub http_status: Option<u64>,
    pub media_type: String,
    pub duration_ms: Option<f64>,
    pub answered: bool,
    pub error_code: Option<i64>,
    pub sse_events: u64,
    pub empty_content: Option<bool>,
    pub server_to_client: bool,
}

impl ExchangeMark {
    pub fn is_http_error(&self) -> bool {
        self.http_status.is_some_and(|s| s >= 400)
    }

    fn of(e: &serde_json::Map<String, Value>) -> Self {
        ExchangeMark {
            method: str_field(e, "method").unwrap_or("?").to_string(),
            tool: str_field(e, "tool").map(str::to_string),
            request_id: e.get("request_id").map(compact).unwrap_or_default(),
            client: str_field(e, "client").unwrap_or("").to_string(),
            http_status: e.get("http_status").and_then(Value::as_u64),
            media_type: str_field(e, "media_type").unwrap_or("none").to_string(),
            duration_ms: e.get("duration_ms").and_then(Value::as_f64),
            answered: e.get("answered").and_then(Value::as_bool).unwrap_or(false),
            error_code: e.get("error_code").and_then(Value::as_i64),
            sse_events: e.get("sse_events").and_then(Value::as_u64).unwrap_or(0),
            empty_content: e.get("empty_content").and_then(Value::as_bool),
            server_to_client: str_field(e, "direction") == Some("server_to_client"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// The handshake (or declaration) event as read: its capability sets are shown.
    Handshake(Value),
    Exchange(ExchangeMark),
    Alert(Value),
    End {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub ts: String,
    pub ts_ns: Option<i64>,
    /// Order of arrival: breaks ties between equal timestamps.
    pub arrival: u64,
    pub item: Item,
}

#[derive(Debug, Clone, Default)]
pub struct Detail {
    pub entries: Vec<Entry>,
    /// Entries beyond [`MAX_TIMELINE_ENTRIES`], counted only.
    pub entries_dropped: u64,
}

/// One session or lineage: counters always, the timeline while within the detail budget.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub key: SessionKey,
    pub server: String,
    pub lineage_id: Option<String>,
    pub first_ts: String,
    pub last_ts: String,
    pub clients: Vec<String>,
    pub more_clients: u64,
    /// `name version` of the first handshake that named the client.
    pub client_info: Option<String>,
    pub era: Option<String>,
    pub handshakes: u64,
    pub requests: u64,
    pub http_errors: u64,
    pub media: BTreeMap<String, u64>,
    pub alerts: BTreeMap<String, u64>,
    pub end_reason: Option<String>,
    pub detail: Option<Detail>,
    /// Events seen while this session had no detail (the budget was full): counted only.
    pub events_without_detail: u64,
    /// First seen order.
    pub order: u64,
}

impl SessionRecord {
    pub fn id(&self) -> &str {
        self.key.id()
    }

    pub fn total_alerts(&self) -> u64 {
        self.alerts.values().sum()
    }

    /// Whether its timeline starts later than the session (it got detail when it alerted).
    pub fn is_partial(&self) -> bool {
        self.detail.is_some() && self.events_without_detail > 0
    }

    /// Report order: narrowed sessions first (the incident), then by alerts, then first seen.
    pub fn rank(&self) -> (bool, std::cmp::Reverse<u64>, String, u64) {
        let narrowed = self.alerts.contains_key("capability_narrowing")
            || self.alerts.contains_key("client_capability_narrowing");
        (
            !narrowed,
            std::cmp::Reverse(self.total_alerts()),
            self.first_ts.clone(),
            self.order,
        )
    }

    /// Media types with counts, SSE and JSON first.
    pub fn media_in_order(&self) -> Vec<(&String, &u64)> {
        let rank = |m: &str| match m {
            "sse" => 0,
            "json" => 1,
            "other" => 2,
            "none" => 3,
            _ => 4,
        };
        let mut v: Vec<(&String, &u64)> = self.media.iter().collect();
        v.sort_by_key(|(m, _)| (rank(m), m.as_str()));
        v
    }

    /// Media types with counts: `sse:3 json:2`.
    pub fn media_summary(&self) -> String {
        let parts: Vec<String> = self
            .media_in_order()
            .into_iter()
            .map(|(m, n)| format!("{m}:{n}"))
            .collect();
        parts.join(" ")
    }

    pub fn alert_summary(&self) -> String {
        let parts: Vec<String> = self
            .alerts
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        parts.join(" ")
    }

    fn new(key: SessionKey, server: &str, ts: &str, order: u64) -> Self {
        SessionRecord {
            key,
            server: server.to_string(),
            lineage_id: None,
            first_ts: ts.to_string(),
            last_ts: ts.to_string(),
            clients: Vec::new(),
            more_clients: 0,
            client_info: None,
            era: None,
            handshakes: 0,
            requests: 0,
            http_errors: 0,
            media: BTreeMap::new(),
            alerts: BTreeMap::new(),
            end_reason: None,
            detail: None,
            events_without_detail: 0,
            order,
        }
    }
}

/// Totals counted from the events themselves (all of them, before any filter): what can be
/// known without a summary event.
#[derive(Debug, Clone, Default)]
pub struct EventCounts {
    pub events: u64,
    pub handshakes: u64,
    pub exchanges: u64,
    pub alerts: BTreeMap<String, u64>,
    pub sessions_ended: BTreeMap<String, u64>,
    pub servers: BTreeSet<String>,
    pub sessions: u64,
    pub lineages: u64,
    pub first_ts: Option<String>,
    pub last_ts: Option<String>,
    /// Distinct servers, sessions or lineages beyond what is counted: the counts are lower
    /// bounds.
    pub counts_capped: bool,
}

/// Distinct servers named in the summary at most.
const MAX_SERVERS: usize = 4096;

/// The summary/stats events' totals, summed over inputs.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub counts: BTreeMap<String, u64>,
    pub by_reason: BTreeMap<String, BTreeMap<String, u64>>,
    pub first_ts: Option<String>,
    pub last_ts: Option<String>,
    /// Inputs without a summary or stats event: their blind spots are unknown.
    pub inputs_without: Vec<String>,
    pub inputs_with: usize,
}

impl Totals {
    pub fn count(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }

    pub fn reasons(&self, key: &str) -> Option<&BTreeMap<String, u64>> {
        self.by_reason.get(key)
    }

    pub fn sum_of(&self, key: &str) -> u64 {
        self.by_reason
            .get(key)
            .map_or(0, |m| m.values().fold(0, |a, n| a.saturating_add(*n)))
    }

    /// Whether any input carried totals at all.
    pub fn known(&self) -> bool {
        self.inputs_with > 0
    }

    fn add(&mut self, summary: &Value) {
        let Some(obj) = summary.as_object() else {
            return;
        };
        for (k, v) in obj {
            match (k.as_str(), v) {
                ("event" | "v", _) => {}
                ("ts", Value::String(t)) => keep_max(&mut self.last_ts, t),
                ("first_ts", Value::String(t)) => keep_min(&mut self.first_ts, t),
                (_, Value::Number(n)) => {
                    let slot = self.counts.entry(k.clone()).or_default();
                    *slot = slot.saturating_add(n.as_u64().unwrap_or(0));
                }
                (_, Value::Object(m)) => {
                    let slot = self.by_reason.entry(k.clone()).or_default();
                    for (reason, n) in m {
                        let count = slot.entry(reason.clone()).or_default();
                        *count = count.saturating_add(n.as_u64().unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
    }
}

/// Everything loaded: what the renderers read.
#[derive(Debug)]
pub struct Forensics {
    pub inputs: Vec<InputInfo>,
    pub filter: Filter,
    pub detail_limit: usize,
    /// Matching sessions, in first-seen order.
    pub sessions: Vec<SessionRecord>,
    pub counts: EventCounts,
    pub totals: Totals,
    /// Events of sessions and lineages beyond the record limit (`--max-sessions`): counted
    /// in the totals, not in any session.
    pub beyond_max_records: u64,
    pub max_records: usize,
}

impl Forensics {
    pub fn malformed_lines(&self) -> u64 {
        self.inputs.iter().map(|i| i.malformed_lines).sum()
    }

    /// Sessions in report order (the incident first).
    pub fn ranked(&self) -> Vec<&SessionRecord> {
        let mut v: Vec<&SessionRecord> = self.sessions.iter().collect();
        v.sort_by_key(|s| s.rank());
        v
    }

    pub fn input_names(&self) -> String {
        let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
        names.join(", ")
    }
}

/// Builds [`Forensics`] from JSON event values, one at a time.
pub struct Collector {
    filter: Filter,
    detail_limit: usize,
    inputs: Vec<InputInfo>,
    sessions: Vec<SessionRecord>,
    index: HashMap<SessionKey, usize>,
    /// Indices of the sessions that keep a timeline (at most `detail_limit`).
    detailed: Vec<usize>,
    arrivals: u64,
    counts: EventCounts,
    seen_sessions: HashSet<u64>,
    seen_lineages: HashSet<u64>,
    /// Sessions and lineages with a record at most (`--max-sessions`, the tracking limit that
    /// replay shares); the events of any beyond are counted only.
    max_records: usize,
    beyond_max_records: u64,
}

impl Collector {
    pub fn new(filter: Filter, detail_limit: usize) -> Self {
        Self::bounded(filter, detail_limit, usize::MAX)
    }

    /// A collector keeping a record of `max_records` sessions and lineages at most.
    pub fn bounded(filter: Filter, detail_limit: usize, max_records: usize) -> Self {
        Collector {
            max_records,
            beyond_max_records: 0,
            filter,
            detail_limit,
            inputs: Vec::new(),
            sessions: Vec::new(),
            index: HashMap::new(),
            detailed: Vec::new(),
            arrivals: 0,
            counts: EventCounts::default(),
            seen_sessions: HashSet::new(),
            seen_lineages: HashSet::new(),
        }
    }

    /// Events observed from now on belong to this input.
    pub fn begin_input(&mut self, name: &str, kind: InputKind) {
        self.inputs.push(InputInfo {
            name: name.to_string(),
            kind,
            events: 0,
            malformed_lines: 0,
            malformed_examples: Vec::new(),
            unknown_events: 0,
            totals: None,
            totals_source: None,
            notes: Vec::new(),
        });
    }

    fn input(&mut self) -> &mut InputInfo {
        if self.inputs.is_empty() {
            self.begin_input("<input>", InputKind::Events);
        }
        let last = self.inputs.len() - 1;
        &mut self.inputs[last]
    }

    pub fn malformed_line(&mut self, line: u64, why: &str) {
        let input = self.input();
        input.malformed_lines += 1;
        if input.malformed_examples.len() < MAX_MALFORMED_EXAMPLES {
            input.malformed_examples.push(format!("line {line}: {why}"));
        }
    }

    pub fn note(&mut self, note: String) {
        self.input().notes.push(note);
    }

    /// Whether the current input carried a summary event (a replay that emits one itself).
    pub fn has_summary(&self) -> bool {
        self.inputs
            .last()
            .is_some_and(|i| i.totals_source == Some("summary"))
    }

    pub fn first_and_last_ts(&self) -> (Option<String>, Option<String>) {
        (self.counts.first_ts.clone(), self.counts.last_ts.clone())
    }

    /// One event; anything that is not an event object is a malformed line (`line`).
    pub fn observe(&mut self, event: &Value, line: u64) {
        let Some(obj) = event.as_object() else {
            self.malformed_line(line, "not a JSON object");
            return;
        };
        let Some(kind) = str_field(obj, "event") else {
            self.malformed_line(line, "no \"event\" field");
            return;
        };
        self.input().events += 1;
        match kind {
            "summary" => {
                let input = self.input();
                input.totals = Some(event.clone());
                input.totals_source = Some("summary");
            }
            // Live mode: periodic, cumulative; the latest one counts (a summary wins).
            "stats" => {
                let input = self.input();
                if input.totals_source != Some("summary") {
                    input.totals = Some(event.clone());
                    input.totals_source = Some("stats");
                }
            }
            "handshake" | "exchange" | "alert" | "session_end" => {
                self.session_event(kind, obj, line)
            }
            _ => self.input().unknown_events += 1,
        }
    }

    fn session_event(&mut self, kind: &str, ev: &serde_json::Map<String, Value>, line: u64) {
        let Some(server) = str_field(ev, "server") else {
            self.malformed_line(line, &format!("{kind} event without \"server\""));
            return;
        };
        let Some(ts) = str_field(ev, "ts") else {
            self.malformed_line(line, &format!("{kind} event without \"ts\""));
            return;
        };
        let session_id = str_field(ev, "session_id");
        let lineage_id = str_field(ev, "lineage_id");
        let key = match (session_id, lineage_id) {
            (Some(id), _) => SessionKey::Session {
                server: server.to_string(),
                id: id.to_string(),
            },
            (None, Some(l)) => SessionKey::Lineage(l.to_string()),
            (None, None) => SessionKey::Sessionless(server.to_string()),
        };
        self.count(kind, ev, &key, server, ts, lineage_id);
        // A session_end names no lineage: a session already kept is kept whole.
        let idx = match self.index.get(&key) {
            Some(&i) => i,
            None if self.sessions.len() >= self.max_records => {
                self.beyond_max_records += 1;
                return;
            }
            None if self.filter.accepts(session_id, lineage_id) => {
                let order = self.sessions.len() as u64;
                let mut record = SessionRecord::new(key.clone(), server, ts, order);
                if self.detailed.len() < self.detail_limit {
                    record.detail = Some(Detail::default());
                    self.detailed.push(self.sessions.len());
                }
                self.sessions.push(record);
                self.index.insert(key, self.sessions.len() - 1);
                self.sessions.len() - 1
            }
            None => return,
        };
        if kind == "alert" && self.sessions[idx].detail.is_none() {
            self.promote(idx);
        }
        let arrival = self.arrivals;
        self.arrivals += 1;
        let Some(record) = self.sessions.get_mut(idx) else {
            return;
        };
        record.update(kind, ev, ts, lineage_id);
        let item = match kind {
            "handshake" => Item::Handshake(Value::Object(ev.clone())),
            "exchange" => Item::Exchange(ExchangeMark::of(ev)),
            "alert" => Item::Alert(Value::Object(ev.clone())),
            _ => Item::End {
                reason: str_field(ev, "reason").unwrap_or("?").to_string(),
            },
        };
        match &mut record.detail {
            Some(d) if d.entries.len() < MAX_TIMELINE_ENTRIES => d.entries.push(Entry {
                ts: ts.to_string(),
                ts_ns: parse_ts(ts),
                arrival,
                item,
            }),
            Some(d) => d.entries_dropped += 1,
            None => record.events_without_detail += 1,
        }
    }

    /// An alerted session without detail takes the place of a detailed one that has no alert
    /// (the latest first seen): an alerted session matters more. Its timeline then starts at
    /// the alert; what came before was only counted.
    fn promote(&mut self, idx: usize) {
        if self.detail_limit == 0 {
            return;
        }
        if self.detailed.len() >= self.detail_limit {
            // Only the detailed sessions are scanned: the budget, not the capture, bounds it.
            let victim = self
                .detailed
                .iter()
                .enumerate()
                .filter(|(_, i)| self.sessions[**i].alerts.is_empty())
                .max_by_key(|(_, i)| self.sessions[**i].order)
                .map(|(slot, &i)| (slot, i));
            let Some((slot, victim)) = victim else {
                return;
            };
            let v = &mut self.sessions[victim];
            if let Some(d) = v.detail.take() {
                v.events_without_detail += d.entries.len() as u64 + d.entries_dropped;
            }
            self.detailed.swap_remove(slot);
        }
        self.sessions[idx].detail = Some(Detail::default());
        self.detailed.push(idx);
    }

    fn count(
        &mut self,
        kind: &str,
        ev: &serde_json::Map<String, Value>,
        key: &SessionKey,
        server: &str,
        ts: &str,
        lineage_id: Option<&str>,
    ) {
        let c = &mut self.counts;
        c.events += 1;
        keep_min(&mut c.first_ts, ts);
        keep_max(&mut c.last_ts, ts);
        // Distinct servers, sessions and lineages are counted up to a bound (a hostile file
        // may name millions); beyond it the counts are lower bounds and say so.
        let distinct_bound = self.max_records.saturating_mul(4).max(MAX_SERVERS);
        if !c.servers.contains(server) {
            if c.servers.len() < MAX_SERVERS {
                c.servers.insert(server.to_string());
            } else {
                c.counts_capped = true;
            }
        }
        if self.seen_sessions.len() < distinct_bound {
            if self.seen_sessions.insert(key.hash64()) {
                c.sessions += 1;
            }
        } else {
            c.counts_capped = true;
        }
        if let Some(l) = lineage_id {
            let mut h = DefaultHasher::new();
            l.hash(&mut h);
            if self.seen_lineages.len() < distinct_bound {
                if self.seen_lineages.insert(h.finish()) {
                    c.lineages += 1;
                }
            } else {
                c.counts_capped = true;
            }
        }
        match kind {
            "handshake" => c.handshakes += 1,
            "exchange" => c.exchanges += 1,
            "alert" => {
                let k = str_field(ev, "kind").unwrap_or("unknown");
                *c.alerts.entry(k.to_string()).or_default() += 1;
            }
            _ => {
                let r = str_field(ev, "reason").unwrap_or("unknown");
                *c.sessions_ended.entry(r.to_string()).or_default() += 1;
            }
        }
    }

    pub fn finish(self) -> Forensics {
        // A run's totals are since it started and go on across a logrotate: its rotated files
        // carry the same `first_ts`, and only the latest of their totals counts.
        fn run_of(t: &Value) -> Option<&str> {
            t.get("first_ts").and_then(Value::as_str)
        }
        fn ts_of(t: &Value) -> &str {
            t.get("ts").and_then(Value::as_str).unwrap_or("")
        }
        let mut latest: HashMap<&str, (usize, &str)> = HashMap::new();
        for (i, input) in self.inputs.iter().enumerate() {
            if let Some(t) = &input.totals
                && let Some(run) = run_of(t)
                && latest.get(run).is_none_or(|(_, ts)| ts_of(t) >= *ts)
            {
                latest.insert(run, (i, ts_of(t)));
            }
        }
        let mut totals = Totals::default();
        for (i, input) in self.inputs.iter().enumerate() {
            match &input.totals {
                Some(t) => {
                    let superseded = run_of(t)
                        .and_then(|run| latest.get(run))
                        .is_some_and(|(j, _)| *j != i);
                    if !superseded {
                        totals.add(t);
                    }
                    totals.inputs_with += 1;
                }
                None => totals.inputs_without.push(input.name.clone()),
            }
        }
        Forensics {
            inputs: self.inputs,
            filter: self.filter,
            detail_limit: self.detail_limit,
            sessions: self.sessions,
            counts: self.counts,
            totals,
            beyond_max_records: self.beyond_max_records,
            max_records: self.max_records,
        }
    }
}

impl SessionRecord {
    fn update(
        &mut self,
        kind: &str,
        ev: &serde_json::Map<String, Value>,
        ts: &str,
        lineage_id: Option<&str>,
    ) {
        if ts < self.first_ts.as_str() {
            self.first_ts = ts.to_string();
        }
        if ts > self.last_ts.as_str() {
            self.last_ts = ts.to_string();
        }
        if self.lineage_id.is_none() {
            self.lineage_id = lineage_id.map(str::to_string);
        }
        if self.era.is_none() {
            self.era = str_field(ev, "era").map(str::to_string);
        }
        if let Some(client) = str_field(ev, "client")
            && !self.clients.iter().any(|c| c == client)
        {
            if self.clients.len() < MAX_CLIENTS {
                self.clients.push(client.to_string());
            } else {
                self.more_clients += 1;
            }
        }
        match kind {
            "handshake" => {
                self.handshakes += 1;
                if self.client_info.is_none() {
                    self.client_info = ev.get("client_info").and_then(client_name);
                }
            }
            "exchange" => {
                self.requests += 1;
                let media = str_field(ev, "media_type").unwrap_or("none");
                *self.media.entry(media.to_string()).or_default() += 1;
                if ev
                    .get("http_status")
                    .and_then(Value::as_u64)
                    .is_some_and(|s| s >= 400)
                {
                    self.http_errors += 1;
                }
            }
            "alert" => {
                let k = str_field(ev, "kind").unwrap_or("unknown");
                *self.alerts.entry(k.to_string()).or_default() += 1;
            }
            _ => self.end_reason = str_field(ev, "reason").map(str::to_string),
        }
    }
}

/// `name version` from a `client_info` object, if it names the client.
fn client_name(info: &Value) -> Option<String> {
    let name = info.get("name")?.as_str()?;
    Some(match info.get("version").and_then(Value::as_str) {
        Some(v) => format!("{name} {v}"),
        None => name.to_string(),
    })
}

pub fn str_field<'a>(obj: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str)
}

/// A JSON value as compact text (request ids: `7`, `"abc"`).
pub fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn keep_min(slot: &mut Option<String>, ts: &str) {
    if slot.as_deref().is_none_or(|cur| ts < cur) {
        *slot = Some(ts.to_string());
    }
}

fn keep_max(slot: &mut Option<String>, ts: &str) {
    if slot.as_deref().is_none_or(|cur| ts > cur) {
        *slot = Some(ts.to_string());
    }
}

/// Nanoseconds since the epoch of an event timestamp (`2026-11-30T17:42:49.406653Z`, the
/// writer's RFC 3339 UTC form); `None` for anything else.
pub fn parse_ts(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    if b.len() < 20 || b.get(4) != Some(&b'-') || b.get(10) != Some(&b'T') {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut nanos = 0i64;
    let rest = b.get(19..)?;
    let rest = match rest.first() {
        Some(b'.') => {
            let digits: Vec<u8> = rest[1..]
                .iter()
                .copied()
                .take_while(u8::is_ascii_digit)
                .collect();
            if digits.is_empty() || digits.len() > 9 {
                return None;
            }
            for (i, d) in digits.iter().enumerate() {
                nanos += i64::from(d - b'0') * 10i64.pow(8 - i as u32);
            }
            &rest[1 + digits.len()..]
        }
        _ => rest,
    };
    if rest != b"Z" {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exchange(session: Option<&str>, lineage: &str, ts: &str) -> Value {
        json!({"event":"exchange","ts":ts,"session_id":session,"server":"10.0.0.1:80",
               "client":"10.0.0.2:5000","method":"tools/call","media_type":"sse",
               "http_status":200,"lineage_id":lineage})
    }

    fn alert(session: &str, ts: &str) -> Value {
        json!({"event":"alert","ts":ts,"session_id":session,"server":"10.0.0.1:80",
               "client":"10.0.0.2:5000","kind":"capability_narrowing","lineage_id":"l"})
    }

    #[test]
    fn timestamps_parse_like_the_writer_prints_them() {
        for ns in [0i64, 1_764_523_546_123_456_000, 951_782_400_000_001_000] {
            let text = mcptap_core::model::Timestamp(ns).rfc3339();
            assert_eq!(parse_ts(&text), Some(ns), "{text}");
        }
        for bad in [
            "",
            "2026-11-30",
            "2026-13-30T00:00:00Z",
            "2026-11-30T17:42:49.1x",
            "<b>",
        ] {
            assert_eq!(parse_ts(bad), None, "{bad}");
        }
    }

    #[test]
    fn sessions_are_keyed_by_server_and_id_and_sessionless_by_lineage() {
        let mut c = Collector::new(Filter::default(), 10);
        c.begin_input("a", InputKind::Events);
        c.observe(
            &exchange(Some("s1"), "l1", "2026-01-01T00:00:01.000000Z"),
            1,
        );
        c.observe(
            &exchange(Some("s1"), "l1", "2026-01-01T00:00:00.000000Z"),
            2,
        );
        c.observe(&exchange(None, "l2", "2026-01-01T00:00:02.000000Z"), 3);
        c.observe(
            &json!({"event":"session_end","ts":"2026-01-01T00:00:03.000000Z",
            "session_id":"s1","server":"10.0.0.1:80","reason":"deleted"}),
            4,
        );
        let f = c.finish();
        assert_eq!(f.sessions.len(), 2);
        let s1 = &f.sessions[0];
        assert_eq!(s1.key.kind(), "session");
        assert_eq!(s1.requests, 2);
        assert_eq!(s1.first_ts, "2026-01-01T00:00:00.000000Z");
        assert_eq!(s1.end_reason.as_deref(), Some("deleted"));
        assert_eq!(f.sessions[1].key, SessionKey::Lineage("l2".into()));
        assert_eq!(f.counts.sessions, 2);
        assert_eq!(f.totals.inputs_without, vec!["a".to_string()]);
    }

    #[test]
    fn malformed_events_are_counted_not_fatal() {
        let mut c = Collector::new(Filter::default(), 10);
        c.begin_input("a", InputKind::Events);
        c.observe(&json!([1, 2]), 1);
        c.observe(&json!({"no": "event"}), 2);
        c.observe(&json!({"event": "exchange", "ts": "x"}), 3);
        c.observe(&json!({"event": "future_kind"}), 4);
        let f = c.finish();
        assert_eq!(f.inputs[0].malformed_lines, 3);
        assert_eq!(f.inputs[0].malformed_examples.len(), 3);
        assert_eq!(f.inputs[0].unknown_events, 1);
        assert!(f.sessions.is_empty());
    }

    #[test]
    fn detail_is_bounded_and_an_alerted_session_takes_a_quiet_ones_place() {
        let mut c = Collector::new(Filter::default(), 2);
        c.begin_input("a", InputKind::Events);
        for (i, s) in ["q1", "q2", "late"].iter().enumerate() {
            let ts = format!("2026-01-01T00:00:0{i}.000000Z");
            c.observe(&exchange(Some(s), "l", &ts), i as u64);
        }
        c.observe(&alert("late", "2026-01-01T00:00:05.000000Z"), 9);
        let f = c.finish();
        let detail: Vec<&str> = f
            .sessions
            .iter()
            .filter(|s| s.detail.is_some())
            .map(|s| s.id())
            .collect();
        assert_eq!(detail, ["q1", "late"]);
        let late = &f.sessions[2];
        assert!(late.is_partial());
        assert_eq!(late.events_without_detail, 1);
        assert_eq!(f.sessions[1].events_without_detail, 1);
        assert_eq!(f.ranked()[0].id(), "late");
    }

    #[test]
    fn filter_keeps_one_session_but_counts_everything() {
        let filter = Filter {
            session: Some("s2".into()),
            ..Filter::default()
        };
        let mut c = Collector::new(filter, 10);
        c.begin_input("a", InputKind::Events);
        c.observe(&exchange(Some("s1"), "l", "2026-01-01T00:00:00.000000Z"), 1);
        c.observe(&exchange(Some("s2"), "l", "2026-01-01T00:00:01.000000Z"), 2);
        let f = c.finish();
        assert_eq!(f.sessions.len(), 1);
        assert_eq!(f.sessions[0].id(), "s2");
        assert_eq!(f.counts.exchanges, 2);
    }

    #[test]
    fn rotated_files_of_one_run_count_its_totals_once() {
        // `run`'s totals are since it started, across a logrotate: yesterday's file ends with a
        // stats event that today's summary includes. Another run's totals add up.
        let mut c = Collector::new(Filter::default(), 10);
        let run = "2026-01-01T00:00:00.000000Z";
        c.begin_input("events.ndjson.1", InputKind::Events);
        c.observe(
            &json!({"event":"stats","ts":"2026-01-01T23:59:00.000000Z","first_ts":run,
            "gaps":10,"flows_evicted":{"memory":1}}),
            1,
        );
        c.begin_input("events.ndjson", InputKind::Events);
        c.observe(
            &json!({"event":"stats","ts":"2026-01-02T00:01:00.000000Z","first_ts":run,
            "gaps":11,"flows_evicted":{"memory":1}}),
            1,
        );
        c.observe(
            &json!({"event":"summary","ts":"2026-01-02T00:02:00.000000Z","first_ts":run,
            "gaps":12,"flows_evicted":{"memory":2}}),
            2,
        );
        c.begin_input("other-host.ndjson", InputKind::Events);
        c.observe(
            &json!({"event":"summary","ts":"2026-01-02T00:00:00.000000Z",
            "first_ts":"2026-01-01T00:00:05.000000Z","gaps":1}),
            1,
        );
        let f = c.finish();
        assert_eq!(f.totals.count("gaps"), 13);
        assert_eq!(f.totals.sum_of("flows_evicted"), 2);
        assert_eq!(f.totals.inputs_with, 3);
        assert!(f.totals.inputs_without.is_empty());
    }

    #[test]
    fn summary_totals_sum_over_inputs_and_the_latest_stats_count() {
        let mut c = Collector::new(Filter::default(), 10);
        c.begin_input("a", InputKind::Events);
        c.observe(
            &json!({"event":"summary","ts":"2026-01-01T00:00:09.000000Z",
            "first_ts":"2026-01-01T00:00:00.000000Z","gaps":2,"flows_evicted":{"memory":1}}),
            1,
        );
        c.begin_input("b", InputKind::Events);
        c.observe(
            &json!({"event":"stats","ts":"2026-01-01T00:00:05.000000Z","gaps":100}),
            1,
        );
        c.observe(
            &json!({"event":"stats","ts":"2026-01-01T00:00:06.000000Z","gaps":3,
            "capture_drops":4,"flows_evicted":{"memory":2}}),
            2,
        );
        c.begin_input("c", InputKind::Events);
        let f = c.finish();
        assert_eq!(f.totals.count("gaps"), 5);
        assert_eq!(f.totals.count("capture_drops"), 4);
        assert_eq!(f.totals.sum_of("flows_evicted"), 3);
        assert_eq!(f.totals.inputs_without, vec!["c".to_string()]);
        assert_eq!(
            f.totals.last_ts.as_deref(),
            Some("2026-01-01T00:00:09.000000Z")
        );
    }
}
