//! Terminal output: `mcptap sessions` (one line per session or lineage) and `mcptap show`
//! (one timeline). Wire strings are cleaned of control characters: a client name must not
//! drive the terminal.

use super::model::{Forensics, SessionRecord};
use super::timeline::{RowKind, Timeline, describe_alert, describe_handshake, media_label};
use std::fmt::Write;

/// `--sort` of `mcptap sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortOrder {
    /// First seen, earliest first.
    #[value(name = "first_seen")]
    FirstSeen,
    /// Most alerts first.
    Alerts,
    /// Most requests first.
    Requests,
}

/// A wire string made safe for a terminal: control characters become `\u{..}` escapes.
pub fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// The client of a session: its name, else its first address; `+N` more connections.
pub fn client_label(s: &SessionRecord) -> String {
    let first = s.clients.first().map_or("-", String::as_str);
    let more = s.clients.len().saturating_sub(1) as u64 + s.more_clients;
    let mut label = match &s.client_info {
        Some(name) => format!("{name} @ {first}"),
        None => first.to_string(),
    };
    if more > 0 {
        let _ = write!(label, " (+{more} conn)");
    }
    label
}

pub fn sorted(f: &Forensics, order: SortOrder) -> Vec<&SessionRecord> {
    let mut v: Vec<&SessionRecord> = f.sessions.iter().collect();
    match order {
        SortOrder::FirstSeen => {
            v.sort_by(|a, b| (&a.first_ts, a.order).cmp(&(&b.first_ts, b.order)))
        }
        SortOrder::Alerts => v.sort_by(|a, b| {
            (b.total_alerts(), &a.first_ts, a.order).cmp(&(a.total_alerts(), &b.first_ts, b.order))
        }),
        SortOrder::Requests => v.sort_by(|a, b| {
            (b.requests, &a.first_ts, a.order).cmp(&(a.requests, &b.first_ts, b.order))
        }),
    }
    v
}

/// `mcptap sessions`: a header and one aligned line per session or lineage.
pub fn sessions_table(f: &Forensics, order: SortOrder) -> String {
    let header = [
        "FIRST SEEN",
        "KIND",
        "ID",
        "SERVER",
        "CLIENT",
        "ERA",
        "HS",
        "REQ",
        "MEDIA",
        "ALERTS",
    ];
    let mut rows: Vec<[String; 10]> = vec![header.map(str::to_string)];
    for s in sorted(f, order) {
        rows.push([
            clean(&s.first_ts),
            s.key.kind().to_string(),
            clean(s.id()),
            clean(&s.server),
            clean(&client_label(s)),
            clean(s.era.as_deref().unwrap_or("-")),
            s.handshakes.to_string(),
            s.requests.to_string(),
            non_empty(clean(&s.media_summary())),
            non_empty(clean(&s.alert_summary())),
        ]);
    }
    let mut widths = [0usize; 10];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn non_empty(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

fn offset(ms: Option<f64>) -> String {
    match ms {
        Some(ms) => format!("+{}", duration(ms)),
        None => "?".into(),
    }
}

/// `6.8 ms`, `2.31 s`, `3 min 02 s`.
pub fn duration(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        let secs = (ms / 1000.0) as u64;
        format!("{} min {:02} s", secs / 60, secs % 60)
    }
}

/// `mcptap show`: each matching session's timeline.
pub fn show(f: &Forensics) -> String {
    let mut out = String::new();
    for s in f.ranked() {
        session_timeline(&mut out, s);
        out.push('\n');
    }
    out
}

fn session_timeline(out: &mut String, s: &SessionRecord) {
    let _ = writeln!(
        out,
        "{} {}  server {}  lineage {}  era {}",
        s.key.kind(),
        clean(s.id()),
        clean(&s.server),
        clean(s.lineage_id.as_deref().unwrap_or("-")),
        clean(s.era.as_deref().unwrap_or("-"))
    );
    let _ = writeln!(
        out,
        "  client {}  first seen {}  last seen {}",
        clean(&client_label(s)),
        clean(&s.first_ts),
        clean(&s.last_ts)
    );
    let _ = writeln!(
        out,
        "  handshakes {}  requests {}  media {}  alerts {}{}",
        s.handshakes,
        s.requests,
        non_empty(clean(&s.media_summary())),
        non_empty(clean(&s.alert_summary())),
        s.end_reason
            .as_deref()
            .map(|r| format!("  ended: {}", clean(r)))
            .unwrap_or_default()
    );
    let Some(detail) = &s.detail else {
        let _ = writeln!(
            out,
            "  (no timeline: beyond --detail-sessions; {} events counted)",
            s.events_without_detail
        );
        return;
    };
    if s.is_partial() {
        let _ = writeln!(
            out,
            "  (timeline starts at its first alert: {} earlier events were only counted)",
            s.events_without_detail
        );
    }
    let t = Timeline::of(s);
    for c in &t.comparisons {
        let _ = writeln!(
            out,
            "  {}: {} -> {}: lost {}{}",
            clean(&c.title),
            clean(&c.before_label),
            clean(&c.after_label),
            if c.removed.is_empty() {
                "nothing".into()
            } else {
                clean(&c.removed.join(", "))
            },
            if c.added.is_empty() {
                String::new()
            } else {
                format!(", gained {}", clean(&c.added.join(", ")))
            }
        );
    }
    for m in &t.media_changes {
        let _ = writeln!(
            out,
            "  {}: {} x{} then {} x{} (from request {})",
            clean(&m.method),
            clean(&media_label(&m.from)),
            m.before,
            clean(&media_label(&m.to)),
            m.after,
            clean(&m.first_changed_request)
        );
    }
    let _ = writeln!(out, "  timeline:");
    for r in &t.rows {
        let at = offset(r.offset_ms);
        let line = match &r.kind {
            RowKind::Handshake(h) => format!("handshake  {}", describe_handshake(h)),
            RowKind::Alert(a) => format!("ALERT      {}", describe_alert(a)),
            RowKind::End(reason) => format!("end        session ended: {reason}"),
            RowKind::Reconnect { from, to } => {
                format!("reconnect  new client connection {to} (was {from})")
            }
            RowKind::Exchange(x) => {
                let mut l = format!(
                    "exchange   {}{} #{}  {}  {}  {}",
                    x.method,
                    x.tool
                        .as_deref()
                        .map(|t| format!(" {t}"))
                        .unwrap_or_default(),
                    x.request_id,
                    x.http_status.map_or("-".into(), |s| s.to_string()),
                    media_label(&x.media_type),
                    x.duration_ms.map_or("-".into(), duration)
                );
                if let Some(from) = r.media_changed_from {
                    let _ = write!(
                        l,
                        "  [{} -> {}]",
                        media_label(from),
                        media_label(&x.media_type)
                    );
                }
                if x.is_http_error() {
                    let _ = write!(l, "  [HTTP {}]", x.http_status.unwrap_or(0));
                }
                if let Some(code) = x.error_code {
                    let _ = write!(l, "  [JSON-RPC error {code}]");
                }
                if !x.answered && !x.is_http_error() {
                    l.push_str("  [no answer]");
                }
                if x.empty_content == Some(true) {
                    l.push_str("  [empty content]");
                }
                l
            }
        };
        let _ = writeln!(out, "  {at:>12}  {}", clean(&line));
    }
    if detail.entries_dropped > 0 {
        let _ = writeln!(
            out,
            "  ... {} more events (timeline limit reached)",
            detail.entries_dropped
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_cannot_reach_the_terminal() {
        assert_eq!(clean("ok\x1b[31mred\n"), "ok\\u{1b}[31mred\\u{a}");
        assert_eq!(clean("plain <b>"), "plain <b>");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(6.764), "6.8 ms");
        assert_eq!(duration(2310.0), "2.31 s");
        assert_eq!(duration(182_000.0), "3 min 02 s");
    }
}
