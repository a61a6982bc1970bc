//! A session's timeline as both renderers (HTML, terminal) show it: entries in time order,
//! reconnects (a new client port), media types that changed, capability sets before and after,
//! and the few lines that tell what happened.

use super::model::{Entry, ExchangeMark, Item, SessionRecord, compact, str_field};
use serde_json::Value;
use std::collections::HashMap;

/// Capability leaves shown per side; a larger set is cut (and says so).
const MAX_CAPABILITY_LINES: usize = 200;
/// Lines of a session's story.
const MAX_STORY_LINES: usize = 12;

#[derive(Debug)]
pub enum RowKind<'a> {
    Handshake(&'a Value),
    Exchange(&'a ExchangeMark),
    Alert(&'a Value),
    End(&'a str),
    /// The first event from a client address this session had not seen (a new connection
    /// after the first: the client reconnected).
    Reconnect {
        from: &'a str,
        to: &'a str,
    },
}

#[derive(Debug)]
pub struct Row<'a> {
    pub ts: &'a str,
    pub ts_ns: Option<i64>,
    /// Milliseconds since the session's first entry.
    pub offset_ms: Option<f64>,
    pub kind: RowKind<'a>,
    /// An answer whose media type differs from the method's first successful one.
    pub media_changed_from: Option<&'a str>,
}

/// A method whose successful answers changed media type (the incident: SSE, then JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct MediaChange {
    pub method: String,
    pub from: String,
    pub to: String,
    pub before: u64,
    pub after: u64,
    pub first_changed_ms: Option<f64>,
    pub first_changed_request: String,
}

/// One side's capability set before and after a change.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub title: String,
    pub before_label: String,
    pub after_label: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub removed: Vec<String>,
    pub added: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Alert,
    Error,
    Change,
    Info,
}

#[derive(Debug, Clone)]
pub struct StoryLine {
    pub offset_ms: Option<f64>,
    pub severity: Severity,
    pub text: String,
}

#[derive(Debug)]
pub struct Timeline<'a> {
    pub rows: Vec<Row<'a>>,
    pub start_ns: Option<i64>,
    pub end_ns: Option<i64>,
    pub media_changes: Vec<MediaChange>,
    pub comparisons: Vec<Comparison>,
    pub story: Vec<StoryLine>,
}

impl<'a> Timeline<'a> {
    pub fn of(record: &'a SessionRecord) -> Timeline<'a> {
        let empty: &[Entry] = &[];
        let entries = record.detail.as_ref().map_or(empty, |d| &d.entries);
        let mut sorted: Vec<&Entry> = entries.iter().collect();
        sorted.sort_by(|a, b| (a.ts_ns, &a.ts, a.arrival).cmp(&(b.ts_ns, &b.ts, b.arrival)));
        let start_ns = sorted.iter().filter_map(|e| e.ts_ns).min();
        let offset = |ns: Option<i64>| Some(ns?.saturating_sub(start_ns?) as f64 / 1e6);
        let mut rows = Vec::with_capacity(sorted.len() + 2);
        let mut seen_clients: Vec<&str> = Vec::new();
        let mut last_client: Option<&str> = None;
        let mut baseline: HashMap<&str, &str> = HashMap::new();
        let mut end_ns = start_ns;
        for e in sorted {
            let client = match &e.item {
                Item::Exchange(x) => Some(x.client.as_str()),
                Item::Handshake(h) => h.get("client").and_then(Value::as_str),
                _ => None,
            };
            if let Some(c) = client.filter(|c| !c.is_empty()) {
                if let Some(prev) = last_client
                    && !seen_clients.contains(&c)
                {
                    rows.push(Row {
                        ts: &e.ts,
                        ts_ns: e.ts_ns,
                        offset_ms: offset(e.ts_ns),
                        kind: RowKind::Reconnect { from: prev, to: c },
                        media_changed_from: None,
                    });
                }
                if !seen_clients.contains(&c) {
                    seen_clients.push(c);
                }
                last_client = Some(c);
            }
            let mut media_changed_from = None;
            let kind = match &e.item {
                Item::Handshake(h) => RowKind::Handshake(h),
                Item::Alert(a) => RowKind::Alert(a),
                Item::End { reason } => RowKind::End(reason),
                Item::Exchange(x) => {
                    if let (Some(ns), Some(d)) = (e.ts_ns, x.duration_ms) {
                        end_ns = end_ns.max(Some(ns.saturating_add((d * 1e6) as i64)));
                    }
                    if decides_media(x) {
                        let first = *baseline.entry(&x.method).or_insert(&x.media_type);
                        if first != x.media_type {
                            media_changed_from = Some(first);
                        }
                    }
                    RowKind::Exchange(x)
                }
            };
            end_ns = end_ns.max(e.ts_ns);
            rows.push(Row {
                ts: &e.ts,
                ts_ns: e.ts_ns,
                offset_ms: offset(e.ts_ns),
                kind,
                media_changed_from,
            });
        }
        let media_changes = media_changes(&rows);
        let comparisons = comparisons(&rows);
        let story = story(&rows, &media_changes);
        Timeline {
            rows,
            start_ns,
            end_ns,
            media_changes,
            comparisons,
            story,
        }
    }

    /// Span in milliseconds (at least 1, for scaling).
    pub fn span_ms(&self) -> f64 {
        match (self.start_ns, self.end_ns) {
            (Some(a), Some(b)) => (b.saturating_sub(a) as f64 / 1e6).max(1.0),
            _ => 1.0,
        }
    }
}

/// Answers that tell which media type a method gets: successful, and SSE or JSON.
fn decides_media(x: &ExchangeMark) -> bool {
    x.http_status.is_some_and(|s| (200..300).contains(&s))
        && matches!(x.media_type.as_str(), "sse" | "json")
}

fn media_changes(rows: &[Row]) -> Vec<MediaChange> {
    let mut out: Vec<MediaChange> = Vec::new();
    for r in rows {
        let RowKind::Exchange(x) = r.kind else {
            continue;
        };
        if !decides_media(x) {
            continue;
        }
        match (
            out.iter_mut().find(|c| c.method == x.method),
            r.media_changed_from,
        ) {
            (Some(c), Some(_)) => {
                if c.after == 0 {
                    c.to = x.media_type.clone();
                    c.first_changed_ms = r.offset_ms;
                    c.first_changed_request = x.request_id.clone();
                }
                c.after += 1;
            }
            (Some(c), None) => c.before += 1,
            (None, _) => out.push(MediaChange {
                method: x.method.clone(),
                from: x.media_type.clone(),
                to: x.media_type.clone(),
                before: 1,
                after: 0,
                first_changed_ms: None,
                first_changed_request: String::new(),
            }),
        }
    }
    out.retain(|c| c.after > 0);
    out
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().map(compact).collect())
        .unwrap_or_default()
}

fn handshake_with_seq<'a>(rows: &[Row<'a>], seq: Option<u64>) -> Option<&'a Value> {
    rows.iter().find_map(|r| match r.kind {
        RowKind::Handshake(h)
            if seq.is_none_or(|s| h.get("seq").and_then(Value::as_u64) == Some(s))
                && str_field_v(h, "source") != Some("discover") =>
        {
            Some(h)
        }
        _ => None,
    })
}

fn str_field_v<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.as_object().and_then(|o| str_field(o, key))
}

/// Before/after capability sets of the session's changes: from the alerts (they carry both
/// sets), else from handshakes whose diff lost something without an alert (a near miss).
fn comparisons(rows: &[Row]) -> Vec<Comparison> {
    let mut out: Vec<Comparison> = Vec::new();
    let mut covered_seqs = Vec::new();
    let mut covered_methods = std::collections::HashSet::new();
    for r in rows {
        let RowKind::Alert(a) = r.kind else {
            continue;
        };
        let kind = str_field_v(a, "kind").unwrap_or("");
        match kind {
            "capability_narrowing" | "capability_widening" => {
                let seq = a.get("handshake_seq").and_then(Value::as_u64);
                if covered_seqs.contains(&seq) {
                    continue;
                }
                covered_seqs.push(seq);
                let label = format!("handshake #{}", seq.unwrap_or(0));
                out.push(Comparison {
                    title: "Server capabilities".into(),
                    before_label: "first accepted handshake".into(),
                    after_label: label.clone(),
                    before: a.get("previous").cloned(),
                    after: a.get("current").cloned(),
                    removed: strings(a.get("removed")),
                    added: strings(a.get("added")),
                });
                let client_removed = strings(a.get("client_removed"));
                let client_added = strings(a.get("client_added"));
                let first = handshake_with_seq(rows, None);
                let changed = handshake_with_seq(rows, seq);
                if !client_removed.is_empty() || !client_added.is_empty() {
                    out.push(Comparison {
                        title: "Client capabilities (the client's own declaration)".into(),
                        before_label: first
                            .and_then(|h| h.get("seq"))
                            .map_or("first handshake".into(), |s| format!("handshake #{s}")),
                        after_label: label,
                        before: first.and_then(|h| h.get("client_capabilities")).cloned(),
                        after: changed.and_then(|h| h.get("client_capabilities")).cloned(),
                        removed: client_removed,
                        added: client_added,
                    });
                }
            }
            "client_capability_narrowing" => {
                let method = str_field_v(a, "method").unwrap_or("?");
                if !covered_methods.insert(method) {
                    continue;
                }
                out.push(Comparison {
                    title: format!("Client declaration for {method}"),
                    before_label: "first declaration".into(),
                    after_label: format!(
                        "declaration #{}",
                        a.get("declaration_seq")
                            .and_then(Value::as_u64)
                            .unwrap_or(0)
                    ),
                    before: a.get("previous").cloned(),
                    after: a.get("current").cloned(),
                    removed: strings(a.get("removed")),
                    added: strings(a.get("added")),
                });
            }
            _ => {}
        }
    }
    if out.is_empty() {
        for r in rows {
            let RowKind::Handshake(h) = r.kind else {
                continue;
            };
            let removed = strings(h.pointer("/diff/client/removed"));
            if removed.is_empty() {
                continue;
            }
            let first = handshake_with_seq(rows, None);
            out.push(Comparison {
                title: "Client capabilities (the server kept its answer)".into(),
                before_label: "first handshake".into(),
                after_label: format!(
                    "handshake #{}",
                    h.get("seq").map(compact).unwrap_or_default()
                ),
                before: first.and_then(|f| f.get("client_capabilities")).cloned(),
                after: h.get("client_capabilities").cloned(),
                removed,
                added: strings(h.pointer("/diff/client/added")),
            });
            break;
        }
    }
    out
}

fn story(rows: &[Row], media: &[MediaChange]) -> Vec<StoryLine> {
    let mut out = Vec::new();
    let mut errors = 0;
    let mut told_media: Vec<&str> = Vec::new();
    for r in rows {
        let line = match &r.kind {
            RowKind::Exchange(x) if x.is_http_error() && errors < 3 => {
                errors += 1;
                Some((
                    Severity::Error,
                    format!(
                        "HTTP {} on {}{}",
                        x.http_status.unwrap_or(0),
                        x.method,
                        x.tool
                            .as_deref()
                            .map(|t| format!(" ({t})"))
                            .unwrap_or_default()
                    ),
                ))
            }
            RowKind::Exchange(x) if r.media_changed_from.is_some() => {
                match media.iter().find(|m| m.method == x.method) {
                    Some(m) if !told_media.contains(&m.method.as_str()) => {
                        told_media.push(&m.method);
                        Some((
                            Severity::Change,
                            format!(
                                "{} answered {} instead of {} from request {} on ({} before, {} after)",
                                m.method,
                                media_label(&m.to),
                                media_label(&m.from),
                                m.first_changed_request,
                                m.before,
                                m.after
                            ),
                        ))
                    }
                    _ => None,
                }
            }
            RowKind::Reconnect { to, .. } => Some((
                Severity::Info,
                format!("reconnect: new client connection {to}"),
            )),
            RowKind::Handshake(h) if h.get("seq").and_then(Value::as_u64).unwrap_or(1) > 1 => {
                if str_field_v(h, "source") == Some("initialize") {
                    Some((Severity::Info, describe_handshake(h)))
                } else {
                    None
                }
            }
            RowKind::Alert(a) => Some((Severity::Alert, describe_alert(a))),
            _ => None,
        };
        if let Some((severity, text)) = line {
            out.push(StoryLine {
                offset_ms: r.offset_ms,
                severity,
                text,
            });
            if out.len() >= MAX_STORY_LINES {
                break;
            }
        }
    }
    out
}

pub fn media_label(media: &str) -> String {
    match media {
        "sse" => "SSE".into(),
        "json" => "JSON".into(),
        other => other.to_string(),
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

/// One line for an alert, whatever its kind.
pub fn describe_alert(a: &Value) -> String {
    let kind = str_field_v(a, "kind").unwrap_or("alert");
    let s = |k: &str| str_field_v(a, k).unwrap_or("?").to_string();
    let n = |k: &str| a.get(k).map(compact).unwrap_or_else(|| "?".into());
    let tool = str_field_v(a, "tool")
        .map(|t| format!(" ({t})"))
        .unwrap_or_default();
    match kind {
        "capability_narrowing" => {
            let client = strings(a.get("client_removed"));
            format!(
                "capability_narrowing: the server narrowed the session at handshake #{}: lost {}{}",
                n("handshake_seq"),
                list(&strings(a.get("removed"))),
                if client.is_empty() {
                    String::new()
                } else {
                    format!("; the client had dropped {}", list(&client))
                }
            )
        }
        "capability_widening" => format!(
            "capability_widening: the server widened the session at handshake #{}: gained {}",
            n("handshake_seq"),
            list(&strings(a.get("added")))
        ),
        "content_type_divergence" => format!(
            "content_type_divergence: {}{tool} request {}: expected {}, got {} ({})",
            s("method"),
            n("request_id"),
            s("expected"),
            s("observed"),
            s("reason")
        ),
        "empty_tool_result" => format!(
            "empty_tool_result: request {}{tool}: empty result ({}, {} SSE events, {})",
            n("request_id"),
            s("reason"),
            n("sse_events"),
            s("ended_by")
        ),
        "client_capability_narrowing" => format!(
            "client_capability_narrowing: {} declared at #{}: lost {}",
            s("method"),
            n("declaration_seq"),
            list(&strings(a.get("removed")))
        ),
        "protocol_downgrade" => format!(
            "protocol_downgrade: {} (requested {}, versions lost: {})",
            s("reason"),
            a.get("requested_version")
                .and_then(Value::as_str)
                .unwrap_or("-"),
            list(&strings(a.get("removed_versions")))
        ),
        "header_mismatch" => format!(
            "header_mismatch: {}{tool}: header {} = {} but body says {}",
            s("method"),
            s("header_name"),
            n("header_value"),
            n("body_value")
        ),
        other => other.to_string(),
    }
}

/// One line for a handshake or declaration, with what it lost or gained.
pub fn describe_handshake(h: &Value) -> String {
    let seq = h.get("seq").map(compact).unwrap_or_else(|| "?".into());
    let what = match str_field_v(h, "source") {
        Some("request_meta") => format!(
            "declaration #{seq} ({})",
            str_field_v(h, "method").unwrap_or("?")
        ),
        Some("discover") => format!("server/discover #{seq}"),
        _ => format!("initialize #{seq}"),
    };
    let mut s = format!(
        "{what} {} (HTTP {})",
        str_field_v(h, "outcome").unwrap_or("?"),
        h.get("http_status")
            .map(compact)
            .unwrap_or_else(|| "?".into())
    );
    if let Some(msg) = str_field_v(h, "error_message") {
        s.push_str(&format!(": {msg}"));
    }
    for side in ["client", "server"] {
        let removed = strings(h.pointer(&format!("/diff/{side}/removed")));
        let added = strings(h.pointer(&format!("/diff/{side}/added")));
        if !removed.is_empty() {
            s.push_str(&format!("; {side} lost {}", removed.join(", ")));
        }
        if !added.is_empty() {
            s.push_str(&format!("; {side} gained {}", added.join(", ")));
        }
    }
    if h.get("client_near_miss").and_then(Value::as_bool) == Some(true) {
        s.push_str("; the server kept its first answer");
    }
    if let Some(p) = str_field_v(h, "predecessor_session_id") {
        s.push_str(&format!("; continues session {p}"));
    }
    s
}

/// A capability set as sorted `path = value` leaves (at most [`MAX_CAPABILITY_LINES`]; the
/// flag says whether it was cut).
pub fn capability_lines(v: &Value) -> (Vec<(String, String)>, bool) {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) -> bool {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if !walk(&path, child, out) {
                        return false;
                    }
                }
                true
            }
            leaf => {
                if out.len() >= MAX_CAPABILITY_LINES {
                    return false;
                }
                out.push((prefix.to_string(), leaf.to_string()));
                true
            }
        }
    }
    let mut out = Vec::new();
    let complete = match v {
        Value::Null => true,
        _ => walk("", v, &mut out),
    };
    out.sort();
    (out, !complete)
}

/// Whether a capability path falls under one of `paths` (`tools.streaming` under `tools`).
pub fn under_any(path: &str, paths: &[String]) -> bool {
    paths.iter().any(|p| {
        path == p
            || path
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forensics::model::{Collector, Filter, InputKind};
    use serde_json::json;

    fn incident() -> crate::forensics::model::Forensics {
        let text = include_str!("../../tests/golden/incident.pcap.ndjson");
        let mut c = Collector::new(Filter::default(), 10);
        c.begin_input("incident", InputKind::Events);
        crate::forensics::load::read_events(text.as_bytes(), &mut c).expect("read");
        c.finish()
    }

    #[test]
    fn the_incident_shows_its_reconnect_media_change_and_narrowing() {
        let f = incident();
        let t = Timeline::of(&f.sessions[0]);
        let reconnects: Vec<&str> = t
            .rows
            .iter()
            .filter_map(|r| match r.kind {
                RowKind::Reconnect { to, .. } => Some(to),
                _ => None,
            })
            .collect();
        assert_eq!(reconnects, ["127.0.0.1:35702"]);
        assert_eq!(
            t.media_changes,
            [MediaChange {
                method: "tools/call".into(),
                from: "sse".into(),
                to: "json".into(),
                before: 2,
                after: 2,
                first_changed_ms: t.media_changes[0].first_changed_ms,
                first_changed_request: "6".into(),
            }]
        );
        let server = &t.comparisons[0];
        assert_eq!(server.removed, ["tools.streaming"]);
        let client = &t.comparisons[1];
        assert_eq!(client.removed, ["sampling", "tools.streaming"]);
        assert!(
            client
                .before
                .as_ref()
                .is_some_and(|b| b["sampling"].is_object())
        );
        let story: Vec<&str> = t.story.iter().map(|s| s.text.as_str()).collect();
        assert!(story[0].starts_with("HTTP 502 on tools/call"), "{story:?}");
        assert!(
            story.iter().any(|s| s.contains("lost tools.streaming")),
            "{story:?}"
        );
        assert!(
            story
                .iter()
                .any(|s| s.contains("tools/call answered JSON instead of SSE")),
            "{story:?}"
        );
    }

    #[test]
    fn capability_leaves_and_paths_under_removed_ones() {
        let (lines, cut) = capability_lines(&json!({"tools":{"streaming":true},"sampling":{}}));
        assert!(!cut);
        assert_eq!(
            lines,
            [
                ("sampling".to_string(), "{}".to_string()),
                ("tools.streaming".to_string(), "true".to_string())
            ]
        );
        let removed = vec!["tools".to_string()];
        assert!(under_any("tools.streaming", &removed));
        assert!(!under_any("toolsx", &removed));
    }
}
