//! `mcptap report`: one self-contained HTML page. No scripts, no fetches (the page's content
//! security policy forbids both, so a string that slipped past escaping would still not run);
//! everything from the wire goes through [`esc`].

use super::model::{Forensics, SessionRecord, Totals};
use super::text::{client_label, duration};
use super::timeline::{
    Comparison, Row, RowKind, Severity, Timeline, capability_lines, describe_alert,
    describe_handshake, media_label, under_any,
};
use std::fmt::Write;

/// Rows of a session's event table; the timeline strip still shows every kept entry.
const MAX_TABLE_ROWS: usize = 400;
/// Rows of the alerted and the aggregated session tables.
const MAX_LIST_ROWS: usize = 500;
/// Sessions whose story is told in the findings at the top.
const MAX_FINDINGS: usize = 3;

/// HTML-escapes text for element content and double-quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {
                let _ = write!(out, "&#x{:x};", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = r#"
:root{--bg:#f4f5f7;--card:#fff;--line:#e2e5ea;--ink:#1d2530;--muted:#667085;--red:#c62828;--red-bg:#fdecec;
--amber:#b45309;--amber-bg:#fff4e0;--green:#1b7f3b;--green-bg:#e8f6ec;--sse:#2563eb;--json:#e07b00;--other:#7b8794;
--hs:#7c3aed;--hs-bg:#f3edff}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif}
code,.mono{font-family:ui-monospace,"SFMono-Regular","DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12.5px}
header.top{background:#17202b;color:#e8edf3;padding:18px 32px}
header.top h1{margin:0;font-size:20px;font-weight:650;letter-spacing:.2px}
header.top .meta{color:#a9b4c2;font-size:13px;margin-top:4px}
main{max-width:1340px;margin:0 auto;padding:20px 32px 48px}
h2{font-size:16px;margin:26px 0 10px;color:#111827}
h3{font-size:15px;margin:0}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 18px;margin-bottom:14px}
.finding{border-left:5px solid var(--red)}
.finding h3 a{color:inherit;text-decoration:none}
.finding .sub{color:var(--muted);font-size:13px;margin:2px 0 8px}
.keys{display:flex;flex-wrap:wrap;gap:8px;margin:4px 0 10px}
.key{border-radius:8px;padding:5px 11px;font-size:14px;border:1px solid var(--line);background:#f7f8fa}
.key.lost{background:var(--red-bg);border-color:#f2b8b8;color:var(--red)}
.key.change{background:var(--amber-bg);border-color:#f3cf94;color:#7a3e00}
.key.err{background:var(--red-bg);border-color:#f2b8b8;color:var(--red)}
.key.info{color:#344054}
ol.story{list-style:none;margin:0;padding:0}
ol.story li{display:grid;grid-template-columns:86px 1fr;gap:10px;padding:3px 0;border-top:1px dashed #eef0f3}
ol.story li:first-child{border-top:0}
ol.story .at{color:var(--muted);text-align:right;font-variant-numeric:tabular-nums}
ol.story .sev-alert .txt{color:var(--red);font-weight:600}
ol.story .sev-error .txt{color:var(--red)}
ol.story .sev-change .txt{color:var(--amber);font-weight:600}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(128px,1fr));gap:10px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:10px 14px}
.tile .n{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums}
.tile .l{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.4px}
.tile.bad .n{color:var(--red)}
.row2{display:grid;grid-template-columns:1fr 1.25fr;gap:14px;margin-top:14px}
.chip{display:inline-block;white-space:nowrap;border-radius:999px;padding:1px 9px;font-size:12px;margin:2px 4px 2px 0;border:1px solid var(--line);background:#f7f8fa}
.chip.alert{background:var(--red-bg);border-color:#f5c2c2;color:var(--red);font-weight:600}
.verdict{border-radius:8px;padding:8px 12px;margin-bottom:10px;font-weight:600}
.verdict.ok{background:var(--green-bg);color:var(--green)}
.verdict.warn{background:var(--amber-bg);color:var(--amber)}
.verdict.unknown{background:#eef0f3;color:#475467}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.3px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.nonzero td:first-child{color:var(--amber);font-weight:600}
.zeros{color:var(--muted);font-size:12.5px;margin-top:8px}
td.nowrap,.nowrap,td a code{white-space:nowrap}
.session{border-top:4px solid #cbd2d9}
.session.alerted{border-top-color:var(--red)}
.session-head{display:flex;flex-wrap:wrap;align-items:baseline;gap:10px;margin-bottom:8px}
.session-head .kind{color:var(--muted);font-weight:500;font-size:13px}
dl.facts{display:grid;grid-template-columns:repeat(auto-fit,minmax(210px,1fr));gap:4px 18px;margin:6px 0 12px}
dl.facts div{min-width:0}
dl.facts dt{color:var(--muted);font-size:11.5px;text-transform:uppercase;letter-spacing:.3px}
dl.facts dd{margin:0;overflow-wrap:anywhere}
.caps{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:12px;margin:12px 0}
.cmp{border:1px solid var(--line);border-radius:8px;overflow:hidden}
.cmp h4{margin:0;padding:7px 10px;background:#f7f8fa;border-bottom:1px solid var(--line);font-size:13px}
.cmp .cols{display:grid;grid-template-columns:1fr 1fr}
.cmp .col{padding:6px 10px}
.cmp .col+.col{border-left:1px solid var(--line)}
.cmp .lab{color:var(--muted);font-size:12px;margin-bottom:3px}
.cap{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px;padding:1px 5px;border-radius:4px;overflow-wrap:anywhere}
.cap.lost{background:var(--red-bg);color:var(--red)}
.cap.lost.before{text-decoration:line-through}
.cap.gone{color:var(--red);font-style:italic}
.cap.new{background:var(--green-bg);color:var(--green)}
.tag{font-family:system-ui,sans-serif;font-size:10.5px;font-weight:700;text-transform:uppercase;margin-left:6px;letter-spacing:.4px}
.strip{margin:8px 0 2px;border:1px solid var(--line);border-radius:8px;background:#fbfcfd}
.strip svg{display:block;width:100%;height:auto}
.legend{color:var(--muted);font-size:12px;margin:4px 0 10px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin:0 4px 0 12px}
.m{display:inline-block;min-width:40px;text-align:center;border-radius:4px;padding:0 6px;font-size:12px;font-weight:650;color:#fff}
.m-sse{background:var(--sse)}.m-json{background:var(--json)}.m-other{background:var(--other)}.m-none{background:#b8c0cc}
.badge{display:inline-block;border-radius:4px;padding:0 6px;font-size:11.5px;font-weight:700;margin-right:4px}
.badge.change{background:var(--amber-bg);color:var(--amber);border:1px solid #f3cf94}
.badge.err{background:var(--red-bg);color:var(--red);border:1px solid #f5c2c2}
.badge.info{background:#eef0f3;color:#475467}
table.events td{font-size:13px}
table.events td.at{color:var(--muted);text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.events tr.alert td{background:var(--red-bg)}
table.events tr.alert td.what{color:var(--red);font-weight:600}
table.events tr.handshake td{background:var(--hs-bg)}
table.events tr.reconnect td{color:#475467;font-style:italic;background:#f6f7f9}
table.events tr.error td.status{color:var(--red);font-weight:700}
details>summary{cursor:pointer;color:#344054;font-weight:600;margin:6px 0}
.note{color:var(--muted);font-size:13px}
.partial{background:var(--amber-bg);color:var(--amber);padding:6px 10px;border-radius:6px;margin:6px 0}
a{color:#1d4ed8}
"#;

/// The whole page.
pub fn render(f: &Forensics) -> String {
    let mut h = String::with_capacity(64 << 10);
    let title = format!("mcptap report: {}", f.input_names());
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(&title)
    );
    header(&mut h, f);
    h.push_str("<main>\n");
    let ranked = f.ranked();
    let alerted: Vec<&SessionRecord> = ranked
        .iter()
        .copied()
        .filter(|s| s.total_alerts() > 0)
        .collect();
    findings(&mut h, &alerted);
    summary(&mut h, f);
    alerted_table(&mut h, &alerted);
    let detailed: Vec<&SessionRecord> = ranked
        .iter()
        .copied()
        .filter(|s| s.detail.is_some())
        .collect();
    let (loud, quiet): (Vec<&SessionRecord>, Vec<&SessionRecord>) =
        detailed.iter().partition(|s| s.total_alerts() > 0);
    if !loud.is_empty() {
        h.push_str("<h2>Alerted sessions in detail</h2>\n");
        for (i, s) in loud.iter().enumerate() {
            // The findings at the top told the first ones' story already.
            session_detail(&mut h, s, i >= MAX_FINDINGS);
        }
    }
    if !quiet.is_empty() {
        let _ = write!(
            h,
            "<h2>Sessions without alerts</h2>\n<details><summary>{} sessions and lineages in detail</summary>\n",
            quiet.len()
        );
        for s in &quiet {
            session_detail(&mut h, s, true);
        }
        h.push_str("</details>\n");
    }
    aggregated(&mut h, f, &ranked);
    h.push_str("</main></body></html>\n");
    h
}

fn header(h: &mut String, f: &Forensics) {
    let (first, last) = time_span(f);
    let span = match (first.as_deref(), last.as_deref()) {
        (Some(a), Some(b)) => {
            let ms = match (super::model::parse_ts(a), super::model::parse_ts(b)) {
                (Some(x), Some(y)) => format!(" ({})", duration(y.saturating_sub(x) as f64 / 1e6)),
                _ => String::new(),
            };
            format!("{} → {}{ms}", esc(a), esc(b))
        }
        _ => "no events".into(),
    };
    let _ = writeln!(
        h,
        "<header class=\"top\"><h1>mcptap forensics report</h1><div class=\"meta\">{} · {span}{} · mcptap {}</div></header>",
        esc(&f.input_names()),
        if f.filter.is_active() {
            format!(" · narrowed to {}", esc(&f.filter.describe()))
        } else {
            String::new()
        },
        env!("CARGO_PKG_VERSION")
    );
}

fn time_span(f: &Forensics) -> (Option<String>, Option<String>) {
    let pick = |a: &Option<String>, b: &Option<String>, min: bool| match (a, b) {
        (Some(x), Some(y)) => Some(if (x < y) == min { x.clone() } else { y.clone() }),
        (x, y) => x.clone().or(y.clone()),
    };
    (
        pick(&f.totals.first_ts, &f.counts.first_ts, true),
        pick(&f.totals.last_ts, &f.counts.last_ts, false),
    )
}

fn offset(ms: Option<f64>) -> String {
    ms.map_or("?".into(), |ms| format!("+{}", duration(ms)))
}

fn anchor(s: &SessionRecord) -> String {
    format!("s{}", s.order)
}

fn session_title(s: &SessionRecord) -> String {
    format!(
        "<span class=\"kind\">{}</span> <code>{}</code>",
        s.key.kind(),
        esc(s.id())
    )
}

fn findings(h: &mut String, alerted: &[&SessionRecord]) {
    if alerted.is_empty() {
        return;
    }
    h.push_str("<h2>Findings</h2>\n");
    for s in alerted.iter().take(MAX_FINDINGS) {
        let t = Timeline::of(s);
        let _ = write!(
            h,
            "<div class=\"card finding\"><h3><a href=\"#{}\">{}</a> on <code>{}</code></h3>\
             <div class=\"sub\">{} · {} handshakes · {} requests · {}</div>",
            anchor(s),
            session_title(s),
            esc(&s.server),
            esc(&client_label(s)),
            s.handshakes,
            s.requests,
            alert_chips(s)
        );
        key_facts(h, s, &t);
        story(h, &t);
        h.push_str("</div>\n");
    }
    if alerted.len() > MAX_FINDINGS {
        let _ = writeln!(
            h,
            "<p class=\"note\">{} more alerted sessions are listed below.</p>",
            alerted.len() - MAX_FINDINGS
        );
    }
}

/// The finding in a few large chips: what was lost, which answers changed media type.
fn key_facts(h: &mut String, s: &SessionRecord, t: &Timeline) {
    h.push_str("<div class=\"keys\">");
    for c in &t.comparisons {
        if !c.removed.is_empty() {
            let _ = write!(
                h,
                "<span class=\"key lost\">{} lost <b>{}</b></span>",
                esc(c.title.split(' ').next().unwrap_or("")),
                esc(&c.removed.join(", "))
            );
        }
        if !c.added.is_empty() {
            let _ = write!(
                h,
                "<span class=\"key info\">{} gained <b>{}</b></span>",
                esc(c.title.split(' ').next().unwrap_or("")),
                esc(&c.added.join(", "))
            );
        }
    }
    for m in &t.media_changes {
        let _ = write!(
            h,
            "<span class=\"key change\"><b>{}</b> {} ×{} → {} ×{}</span>",
            esc(&m.method),
            media_badge(&m.from),
            m.before,
            media_badge(&m.to),
            m.after
        );
    }
    if s.http_errors > 0 {
        let _ = write!(
            h,
            "<span class=\"key err\">{} HTTP error{}</span>",
            s.http_errors,
            if s.http_errors == 1 { "" } else { "s" }
        );
    }
    let reconnects = t
        .rows
        .iter()
        .filter(|r| matches!(r.kind, RowKind::Reconnect { .. }))
        .count();
    if reconnects > 0 {
        let _ = write!(
            h,
            "<span class=\"key info\">{reconnects} reconnect{}</span>",
            if reconnects == 1 { "" } else { "s" }
        );
    }
    h.push_str("</div>");
}

fn story(h: &mut String, t: &Timeline) {
    if t.story.is_empty() {
        return;
    }
    h.push_str("<ol class=\"story\">");
    for line in &t.story {
        let class = match line.severity {
            Severity::Alert => "sev-alert",
            Severity::Error => "sev-error",
            Severity::Change => "sev-change",
            Severity::Info => "sev-info",
        };
        let _ = write!(
            h,
            "<li class=\"{class}\"><span class=\"at\">{}</span><span class=\"txt\">{}</span></li>",
            offset(line.offset_ms),
            esc(&line.text)
        );
    }
    h.push_str("</ol>");
}

fn alert_chips(s: &SessionRecord) -> String {
    if s.alerts.is_empty() {
        return "no alerts".into();
    }
    s.alerts
        .iter()
        .map(|(k, n)| format!("<span class=\"chip alert\">{} ×{n}</span>", esc(k)))
        .collect()
}

fn tile(h: &mut String, label: &str, value: &str, bad: bool) {
    let _ = write!(
        h,
        "<div class=\"tile{}\"><div class=\"n\">{value}</div><div class=\"l\">{label}</div></div>",
        if bad { " bad" } else { "" }
    );
}

fn summary(h: &mut String, f: &Forensics) {
    h.push_str("<h2>Summary</h2>\n<div class=\"tiles\">");
    let c = &f.counts;
    let alerts: u64 = c.alerts.values().sum();
    tile(h, "inputs", &f.inputs.len().to_string(), false);
    tile(h, "servers", &c.servers.len().to_string(), false);
    tile(h, "sessions", &c.sessions.to_string(), false);
    tile(h, "client lineages", &c.lineages.to_string(), false);
    tile(h, "handshakes", &c.handshakes.to_string(), false);
    tile(h, "exchanges", &c.exchanges.to_string(), false);
    tile(h, "alerts", &alerts.to_string(), alerts > 0);
    if f.totals.known() {
        tile(h, "packets", &f.totals.count("packets").to_string(), false);
    }
    h.push_str("</div>\n");
    if f.filter.is_active() {
        let _ = writeln!(
            h,
            "<p class=\"note\">Narrowed to {}: {} of {} sessions and lineages shown. The totals are the whole input's.</p>",
            esc(&f.filter.describe()),
            f.sessions.len(),
            c.sessions
        );
    }
    h.push_str("<div class=\"row2\"><div class=\"card\"><h3>Alerts by kind</h3>");
    if c.alerts.is_empty() {
        h.push_str("<p class=\"note\">No alert fired.</p>");
    } else {
        h.push_str("<table><tr><th>kind</th><th class=\"num\">alerts</th></tr>");
        for (k, n) in &c.alerts {
            let _ = write!(h, "<tr><td>{}</td><td class=\"num\">{n}</td></tr>", esc(k));
        }
        h.push_str("</table>");
    }
    h.push_str("<h3 style=\"margin-top:14px\">Inputs</h3><table><tr><th>input</th><th>kind</th><th class=\"num\">events</th><th>totals</th></tr>");
    for i in &f.inputs {
        let _ = write!(
            h,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&i.name),
            i.kind.as_str(),
            i.events,
            match i.totals_source {
                Some("summary") if i.kind == super::model::InputKind::Capture => "replayed",
                Some(s) => s,
                None => "none",
            }
        );
        for note in i.notes.iter().chain(&i.malformed_examples) {
            let _ = write!(
                h,
                "<tr><td colspan=\"4\" class=\"note\">{}</td></tr>",
                esc(note)
            );
        }
    }
    h.push_str("</table></div>\n");
    blind_spots(h, f);
    h.push_str("</div>\n");
}

/// One blind-spot row: label, total (with reasons), and what it hides.
struct Blind<'a> {
    label: &'a str,
    total: u64,
    detail: String,
}

fn reasons_text(
    m: Option<&std::collections::BTreeMap<String, u64>>,
    skip: &[&str],
) -> (u64, String) {
    let Some(m) = m else {
        return (0, String::new());
    };
    let kept: Vec<(&String, &u64)> = m
        .iter()
        .filter(|(k, n)| **n > 0 && !skip.contains(&k.as_str()))
        .collect();
    let total = kept.iter().fold(0u64, |a, (_, n)| a.saturating_add(**n));
    let text = kept
        .iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    (total, text)
}

fn blind_rows(t: &Totals, malformed: u64, beyond_max_records: u64) -> Vec<Blind<'static>> {
    let plain = |label, key: &str| Blind {
        label,
        total: t.count(key),
        detail: String::new(),
    };
    let by = |label, key: &str, skip: &[&str]| {
        let (total, detail) = reasons_text(t.reasons(key), skip);
        Blind {
            label,
            total,
            detail,
        }
    };
    let mut gaps = plain("TCP gaps (bytes never captured)", "gaps");
    if gaps.total > 0 {
        gaps.detail = format!("{} bytes", t.count("gap_bytes"));
    }
    vec![
        plain("packets dropped by the kernel (live)", "capture_drops"),
        gaps,
        plain("segments cut by the snaplen", "truncated_segments"),
        by("packets not decoded", "packets_skipped", &[]),
        by(
            "connections not decoded (TLS, HTTP/2, ...)",
            "undecodable_flows",
            &[],
        ),
        plain("bodies not decoded", "undecodable_bodies"),
        plain("HTTP parse errors", "http_errors"),
        plain("JSON-RPC parse errors", "jsonrpc_errors"),
        // Idle flows and ended sessions are the normal course; limits are not.
        by("flows evicted by limits", "flows_evicted", &["idle"]),
        by(
            "sessions evicted",
            "sessions_ended",
            &["deleted", "expired", "idle"],
        ),
        by("limits hit", "limits_hit", &[]),
        plain("clock jumps", "clock_jumps"),
        plain(
            "capture bytes skipped (corrupt records)",
            "capture_bytes_skipped",
        ),
        plain(
            "empty results unresolved at the end",
            "resumptions_unresolved",
        ),
        plain("HTTP framing anomalies", "framing_anomalies"),
        plain("duplicate ambiguous headers", "duplicate_headers"),
        Blind {
            label: "event lines not read (malformed)",
            total: malformed,
            detail: String::new(),
        },
        Blind {
            label: "events of sessions beyond --max-sessions (counted, not listed)",
            total: beyond_max_records,
            detail: String::new(),
        },
    ]
}

fn blind_spots(h: &mut String, f: &Forensics) {
    h.push_str("<div class=\"card\"><h3>Blind spots</h3>");
    let rows = blind_rows(&f.totals, f.malformed_lines(), f.beyond_max_records);
    let nonzero = rows.iter().filter(|r| r.total > 0).count();
    if !f.totals.known() {
        h.push_str(
            "<div class=\"verdict unknown\">Blind-spot totals unknown: the inputs carry no summary or stats event \
             (an older mcptap wrote them). Gaps, drops and undecodable traffic may be hiding sessions; \
             only what the events say is counted here.</div>",
        );
    } else if nonzero == 0 {
        h.push_str(
            "<div class=\"verdict ok\">No blind spots recorded: nothing was dropped, cut, skipped or left undecoded, \
             so a quiet session here was quiet on the wire.</div>",
        );
    } else {
        let _ = write!(
            h,
            "<div class=\"verdict warn\">{nonzero} kinds of blind spot recorded: what they hid is not in this report. \
             Question a quiet report before trusting it.</div>"
        );
    }
    if !f.totals.inputs_without.is_empty() && f.totals.known() {
        let _ = write!(
            h,
            "<p class=\"note\">No totals in: {} (their blind spots are unknown).</p>",
            esc(&f.totals.inputs_without.join(", "))
        );
    }
    // Recorded blind spots get a row each; the zeros one line, so that what was checked shows.
    if nonzero > 0 {
        h.push_str(
            "<table><tr><th>blind spot</th><th class=\"num\">total</th><th>detail</th></tr>",
        );
        for r in rows.iter().filter(|r| r.total > 0) {
            let _ = write!(
                h,
                "<tr class=\"nonzero\"><td>{}</td><td class=\"num\">{}</td><td class=\"mono\">{}</td></tr>",
                r.label,
                r.total,
                esc(&r.detail)
            );
        }
        h.push_str("</table>");
    }
    let zeros: Vec<&str> = rows
        .iter()
        .filter(|r| r.total == 0 && (f.totals.known() || r.label.starts_with("event lines")))
        .map(|r| r.label)
        .collect();
    if !zeros.is_empty() {
        let _ = write!(
            h,
            "<div class=\"zeros\"><b>Zero:</b> {}</div>",
            zeros.join(" · ")
        );
    }
    h.push_str("</div>\n");
}

fn alerted_table(h: &mut String, alerted: &[&SessionRecord]) {
    h.push_str("<h2>Alerted sessions and lineages</h2>\n<div class=\"card\">");
    if alerted.is_empty() {
        h.push_str("<p class=\"note\">No session or lineage alerted.</p></div>\n");
        return;
    }
    session_list(h, alerted, true);
    h.push_str("</div>\n");
}

fn session_list(h: &mut String, list: &[&SessionRecord], with_alerts: bool) {
    h.push_str(
        "<table><tr><th>id</th><th>server</th><th>client</th><th>era</th><th>first seen</th>\
         <th class=\"num\">handshakes</th><th class=\"num\">requests</th><th>media</th>",
    );
    if with_alerts {
        h.push_str("<th>alerts</th>");
    }
    h.push_str("</tr>");
    for s in list.iter().take(MAX_LIST_ROWS) {
        let code = format!("<code>{}</code>", esc(s.id()));
        let id = if s.detail.is_some() {
            format!("<a href=\"#{}\">{code}</a>", anchor(s))
        } else {
            code
        };
        let id = format!("{id} <span class=\"note\">{}</span>", s.key.kind());
        let _ = write!(
            h,
            "<tr><td>{id}</td><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td class=\"mono nowrap\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td>",
            esc(&s.server),
            esc(&client_label(s)),
            esc(s.era.as_deref().unwrap_or("-")),
            esc(&s.first_ts),
            s.handshakes,
            s.requests,
            media_badges(s)
        );
        if with_alerts {
            let _ = write!(h, "<td>{}</td>", alert_chips(s));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    if list.len() > MAX_LIST_ROWS {
        let _ = write!(
            h,
            "<p class=\"note\">… and {} more (<code>mcptap sessions</code> lists them all).</p>",
            list.len() - MAX_LIST_ROWS
        );
    }
}

fn media_class(media: &str) -> &'static str {
    match media {
        "sse" => "m-sse",
        "json" => "m-json",
        "none" => "m-none",
        _ => "m-other",
    }
}

fn media_badge(media: &str) -> String {
    format!(
        "<span class=\"m {}\">{}</span>",
        media_class(media),
        esc(&media_label(media))
    )
}

fn media_badges(s: &SessionRecord) -> String {
    s.media_in_order()
        .into_iter()
        .map(|(m, n)| format!("<span class=\"nowrap\">{} ×{n}</span> ", media_badge(m)))
        .collect()
}

fn fact(h: &mut String, label: &str, value: &str) {
    let _ = write!(h, "<div><dt>{label}</dt><dd>{value}</dd></div>");
}

fn session_detail(h: &mut String, s: &SessionRecord, with_story: bool) {
    let t = Timeline::of(s);
    let _ = write!(
        h,
        "<section class=\"card session{}\" id=\"{}\"><div class=\"session-head\"><h3>{}</h3>{}</div><dl class=\"facts\">",
        if s.total_alerts() > 0 { " alerted" } else { "" },
        anchor(s),
        session_title(s),
        alert_chips(s)
    );
    fact(h, "server", &format!("<code>{}</code>", esc(&s.server)));
    let clients: Vec<String> = s.clients.iter().map(|c| esc(c)).collect();
    let more = if s.more_clients > 0 {
        format!(" +{}", s.more_clients)
    } else {
        String::new()
    };
    fact(
        h,
        "client",
        &format!(
            "{}<br><code>{}</code>{more}",
            esc(s.client_info.as_deref().unwrap_or("(unnamed)")),
            clients.join(", ")
        ),
    );
    fact(
        h,
        "lineage · era",
        &format!(
            "<code>{}</code> · {}",
            esc(s.lineage_id.as_deref().unwrap_or("-")),
            esc(s.era.as_deref().unwrap_or("-"))
        ),
    );
    fact(
        h,
        "seen",
        &format!(
            "<span class=\"mono\">{}</span><br>for {}{}",
            esc(&s.first_ts),
            duration(t.span_ms()),
            s.end_reason
                .as_deref()
                .map(|r| format!(", ended: {}", esc(r)))
                .unwrap_or_default()
        ),
    );
    fact(
        h,
        "handshakes · requests",
        &format!("{} · {}", s.handshakes, s.requests),
    );
    fact(h, "media types", &media_badges(s));
    h.push_str("</dl>");
    if s.is_partial() {
        let _ = write!(
            h,
            "<div class=\"partial\">This timeline starts at the session's first alert: {} earlier events were only counted (beyond --detail-sessions).</div>",
            s.events_without_detail
        );
    }
    if with_story {
        story(h, &t);
    }
    if !t.comparisons.is_empty() {
        h.push_str("<div class=\"caps\">");
        for c in &t.comparisons {
            comparison(h, c);
        }
        h.push_str("</div>");
    }
    strip(h, &t);
    events_table(h, &t, s);
    h.push_str("</section>\n");
}

fn comparison(h: &mut String, c: &Comparison) {
    let _ = write!(
        h,
        "<div class=\"cmp\"><h4>{}{}{}</h4><div class=\"cols\">",
        esc(&c.title),
        if c.removed.is_empty() {
            String::new()
        } else {
            format!(
                " — <span style=\"color:var(--red)\">lost {}</span>",
                esc(&c.removed.join(", "))
            )
        },
        if c.added.is_empty() {
            String::new()
        } else {
            format!(
                " — <span style=\"color:var(--green)\">gained {}</span>",
                esc(&c.added.join(", "))
            )
        }
    );
    for (side, value, label) in [
        ("before", &c.before, &c.before_label),
        ("after", &c.after, &c.after_label),
    ] {
        let _ = write!(
            h,
            "<div class=\"col\"><div class=\"lab\">{}</div>",
            esc(label)
        );
        let Some(value) = value else {
            h.push_str("<div class=\"note\">not in the timeline</div></div>");
            continue;
        };
        let (lines, cut) = capability_lines(value);
        if lines.is_empty() {
            h.push_str("<div class=\"note\">(none declared)</div>");
        }
        for (path, v) in &lines {
            let text = format!("{} = {}", esc(path), esc(v));
            if under_any(path, &c.removed) {
                let _ = write!(
                    h,
                    "<div class=\"cap lost {side}\">{text}<span class=\"tag\">{}</span></div>",
                    if side == "before" { "lost" } else { "off" }
                );
            } else if side == "after" && under_any(path, &c.added) {
                let _ = write!(
                    h,
                    "<div class=\"cap new\">{text}<span class=\"tag\">new</span></div>"
                );
            } else {
                let _ = write!(h, "<div class=\"cap\">{text}</div>");
            }
        }
        if side == "after" {
            for r in &c.removed {
                if !lines
                    .iter()
                    .any(|(p, _)| under_any(p, std::slice::from_ref(r)))
                {
                    let _ = write!(
                        h,
                        "<div class=\"cap gone\">{} — gone<span class=\"tag\">lost</span></div>",
                        esc(r)
                    );
                }
            }
        }
        if cut {
            h.push_str("<div class=\"note\">… cut (too many entries)</div>");
        }
        h.push_str("</div>");
    }
    h.push_str("</div></div>");
}

fn media_color(x: &super::model::ExchangeMark) -> &'static str {
    if x.is_http_error() {
        return "#c62828";
    }
    match x.media_type.as_str() {
        "sse" => "#2563eb",
        "json" => "#e07b00",
        "none" => "#b8c0cc",
        _ => "#7b8794",
    }
}

/// The timeline as an SVG strip: handshakes and alerts above, exchanges as bars (their
/// duration, coloured by media type), reconnects as dashed lines, a time axis below.
fn strip(h: &mut String, t: &Timeline) {
    const W: f64 = 1000.0;
    const PAD: f64 = 14.0;
    // Lane labels live in the left gutter.
    const LEFT: f64 = 78.0;
    let span = t.span_ms();
    let Some(start) = t.start_ns else {
        return;
    };
    let server_requests = t
        .rows
        .iter()
        .any(|r| matches!(r.kind, RowKind::Exchange(x) if x.server_to_client));
    let x = |ns: Option<i64>| -> f64 {
        let ms = ns.map_or(0.0, |n| n.saturating_sub(start) as f64 / 1e6);
        LEFT + (W - LEFT - PAD) * (ms / span).clamp(0.0, 1.0)
    };
    let _ = write!(
        h,
        "<div class=\"strip\"><svg viewBox=\"0 0 {W} 118\" role=\"img\" aria-label=\"timeline\" font-family=\"system-ui,sans-serif\" font-size=\"11\">\
         <rect x=\"0\" y=\"0\" width=\"{W}\" height=\"118\" fill=\"#fbfcfd\"/>\
         <text x=\"8\" y=\"26\" fill=\"#667085\" font-size=\"10.5\">handshakes</text>\
         <text x=\"8\" y=\"38\" fill=\"#667085\" font-size=\"10.5\">&amp; alerts</text>\
         <text x=\"8\" y=\"57\" fill=\"#667085\" font-size=\"10.5\">requests</text>\
         {}<line x1=\"{LEFT}\" y1=\"92\" x2=\"{}\" y2=\"92\" stroke=\"#cbd2d9\"/>",
        if server_requests {
            "<text x=\"8\" y=\"81\" fill=\"#667085\" font-size=\"10.5\">server reqs</text>"
        } else {
            ""
        },
        W - PAD
    );
    for i in 0..=4 {
        let ms = span * f64::from(i) / 4.0;
        let px = LEFT + (W - LEFT - PAD) * f64::from(i) / 4.0;
        let anchor = match i {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            h,
            "<line x1=\"{px:.1}\" y1=\"89\" x2=\"{px:.1}\" y2=\"95\" stroke=\"#98a2b3\"/>\
             <text x=\"{px:.1}\" y=\"108\" fill=\"#667085\" text-anchor=\"{anchor}\">+{}</text>",
            duration(ms)
        );
    }
    for r in &t.rows {
        let px = x(r.ts_ns);
        match &r.kind {
            RowKind::Reconnect { to, .. } => {
                let _ = write!(
                    h,
                    "<g><title>reconnect: {}</title><line x1=\"{px:.1}\" y1=\"16\" x2=\"{px:.1}\" y2=\"88\" stroke=\"#475467\" stroke-dasharray=\"4 3\"/>\
                     <text x=\"{:.1}\" y=\"86\" fill=\"#475467\" font-size=\"10\">reconnect</text></g>",
                    esc(to),
                    px + 3.0
                );
            }
            RowKind::Exchange(x_) => {
                let width = x_
                    .duration_ms
                    .map_or(3.0, |d| (W - LEFT - PAD) * d / span)
                    .max(3.0);
                let y = if x_.server_to_client { 68.0 } else { 44.0 };
                let _ = write!(
                    h,
                    "<g><title>{} {}{} → {} {} {}</title><rect x=\"{px:.1}\" y=\"{y}\" width=\"{width:.1}\" height=\"18\" rx=\"2\" fill=\"{}\"{}/>",
                    offset(r.offset_ms),
                    esc(&x_.method),
                    esc(&x_
                        .tool
                        .as_deref()
                        .map(|t| format!(" {t}"))
                        .unwrap_or_default()),
                    x_.http_status.map_or("-".into(), |s| s.to_string()),
                    esc(&media_label(&x_.media_type)),
                    x_.duration_ms.map_or("-".into(), duration),
                    media_color(x_),
                    if r.media_changed_from.is_some() {
                        " stroke=\"#7a3e00\" stroke-width=\"2\""
                    } else {
                        ""
                    }
                );
                if x_.is_http_error() {
                    let _ = write!(
                        h,
                        "<text x=\"{px:.1}\" y=\"40\" fill=\"#c62828\" font-weight=\"700\">{}</text>",
                        x_.http_status.unwrap_or(0)
                    );
                } else if width >= 34.0 {
                    let _ = write!(
                        h,
                        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#fff\" font-size=\"10\" font-weight=\"700\" text-anchor=\"middle\">{}</text>",
                        px + width / 2.0,
                        y + 12.5,
                        esc(&media_label(&x_.media_type))
                    );
                }
                h.push_str("</g>");
            }
            RowKind::Handshake(hs) => {
                let seq = hs.get("seq").map(super::model::compact).unwrap_or_default();
                let _ = write!(
                    h,
                    "<g><title>{} {}</title><path d=\"M{px:.1} 16 l7 7 l-7 7 l-7 -7 z\" fill=\"#7c3aed\"/>\
                     <text x=\"{:.1}\" y=\"27\" fill=\"#5b21b6\" font-weight=\"600\">#{}</text></g>",
                    offset(r.offset_ms),
                    esc(&describe_handshake(hs)),
                    px + 9.0,
                    esc(&seq)
                );
            }
            RowKind::Alert(a) => {
                let _ = write!(
                    h,
                    "<g><title>{} {}</title><path d=\"M{px:.1} 14 l8 14 l-16 0 z\" fill=\"#c62828\"/>\
                     <text x=\"{px:.1}\" y=\"26\" fill=\"#fff\" font-size=\"10\" font-weight=\"700\" text-anchor=\"middle\">!</text></g>",
                    offset(r.offset_ms),
                    esc(&describe_alert(a))
                );
            }
            RowKind::End(_) => {
                let _ = write!(
                    h,
                    "<line x1=\"{px:.1}\" y1=\"40\" x2=\"{px:.1}\" y2=\"66\" stroke=\"#1d2530\" stroke-width=\"2\"/>"
                );
            }
        }
    }
    h.push_str("</svg></div>");
    h.push_str(
        "<div class=\"legend\">exchanges by media type:<i style=\"background:#2563eb\"></i>SSE\
         <i style=\"background:#e07b00\"></i>JSON<i style=\"background:#7b8794\"></i>other\
         <i style=\"background:#b8c0cc\"></i>none<i style=\"background:#c62828\"></i>HTTP error\
         <i style=\"background:#7c3aed\"></i>handshake<i style=\"background:#c62828;border-radius:0\"></i>alert\
         <i style=\"background:#fff;border:2px solid #7a3e00\"></i>media type changed</div>",
    );
}

fn events_table(h: &mut String, t: &Timeline, s: &SessionRecord) {
    let open = if s.total_alerts() > 0 { " open" } else { "" };
    let _ = write!(
        h,
        "<details{open}><summary>{} timeline entries</summary><table class=\"events\">\
         <tr><th class=\"num\">at</th><th>event</th><th>what</th><th>status</th><th>media</th><th class=\"num\">duration</th><th>notes</th></tr>",
        t.rows.len()
    );
    for r in t.rows.iter().take(MAX_TABLE_ROWS) {
        event_row(h, r);
    }
    h.push_str("</table>");
    let dropped = s.detail.as_ref().map_or(0, |d| d.entries_dropped);
    if t.rows.len() > MAX_TABLE_ROWS || dropped > 0 {
        let _ = write!(
            h,
            "<p class=\"note\">{} more entries not listed (mcptap show prints the timeline).</p>",
            t.rows.len().saturating_sub(MAX_TABLE_ROWS) as u64 + dropped
        );
    }
    h.push_str("</details>");
}

fn event_row(h: &mut String, r: &Row) {
    let at = offset(r.offset_ms);
    let title = esc(r.ts);
    match &r.kind {
        RowKind::Handshake(hs) => {
            let _ = write!(
                h,
                "<tr class=\"handshake\"><td class=\"at\" title=\"{title}\">{at}</td><td>handshake</td><td class=\"what\">{}</td>\
                 <td class=\"status\">{}</td><td></td><td></td><td></td></tr>",
                esc(&describe_handshake(hs)),
                esc(&hs
                    .get("http_status")
                    .map(super::model::compact)
                    .unwrap_or_default())
            );
        }
        RowKind::Alert(a) => {
            let _ = write!(
                h,
                "<tr class=\"alert\"><td class=\"at\" title=\"{title}\">{at}</td><td>alert</td><td class=\"what\" colspan=\"5\">{}</td></tr>",
                esc(&describe_alert(a))
            );
        }
        RowKind::End(reason) => {
            let _ = write!(
                h,
                "<tr><td class=\"at\" title=\"{title}\">{at}</td><td>end</td><td colspan=\"5\">session ended: {}</td></tr>",
                esc(reason)
            );
        }
        RowKind::Reconnect { from, to } => {
            let _ = write!(
                h,
                "<tr class=\"reconnect\"><td class=\"at\" title=\"{title}\">{at}</td><td>reconnect</td><td colspan=\"5\">new client connection <code>{}</code> (was <code>{}</code>)</td></tr>",
                esc(to),
                esc(from)
            );
        }
        RowKind::Exchange(x) => {
            let mut notes = String::new();
            if let Some(from) = r.media_changed_from {
                let _ = write!(
                    notes,
                    "<span class=\"badge change\">{} → {}</span>",
                    esc(&media_label(from)),
                    esc(&media_label(&x.media_type))
                );
            }
            if x.is_http_error() {
                let _ = write!(
                    notes,
                    "<span class=\"badge err\">HTTP {}</span>",
                    x.http_status.unwrap_or(0)
                );
            }
            if let Some(code) = x.error_code {
                let _ = write!(notes, "<span class=\"badge err\">JSON-RPC {code}</span>");
            }
            if !x.answered && !x.is_http_error() {
                notes.push_str("<span class=\"badge info\">no answer</span>");
            }
            if x.empty_content == Some(true) {
                notes.push_str("<span class=\"badge err\">empty content</span>");
            }
            if x.server_to_client {
                notes.push_str("<span class=\"badge info\">server → client</span>");
            }
            let _ = write!(
                h,
                "<tr class=\"exchange{}\"><td class=\"at\" title=\"{title}\">{at}</td><td>exchange</td>\
                 <td class=\"what\"><code>{}</code>{} <span class=\"note\">#{}</span></td><td class=\"status\">{}</td>\
                 <td>{}</td><td class=\"num\">{}</td><td>{notes}</td></tr>",
                if x.is_http_error() { " error" } else { "" },
                esc(&x.method),
                x.tool
                    .as_deref()
                    .map(|t| format!(" <code>{}</code>", esc(t)))
                    .unwrap_or_default(),
                esc(&x.request_id),
                x.http_status.map_or("-".into(), |s| s.to_string()),
                media_badge(&x.media_type),
                x.duration_ms.map_or("-".into(), duration)
            );
        }
    }
}

fn aggregated(h: &mut String, f: &Forensics, ranked: &[&SessionRecord]) {
    let rest: Vec<&SessionRecord> = ranked
        .iter()
        .copied()
        .filter(|s| s.detail.is_none())
        .collect();
    if rest.is_empty() {
        return;
    }
    let events: u64 = rest.iter().map(|s| s.events_without_detail).sum();
    let requests: u64 = rest.iter().map(|s| s.requests).sum();
    let alerts: u64 = rest.iter().map(|s| s.total_alerts()).sum();
    let _ = write!(
        h,
        "<h2>Further sessions (aggregated)</h2>\n<div class=\"card\"><p class=\"note\">{} sessions and lineages beyond \
         --detail-sessions {}: {events} events, {requests} requests, {alerts} alerts, counted only.</p>",
        rest.len(),
        f.detail_limit
    );
    session_list(h, &rest, true);
    h.push_str("</div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forensics::model::{Collector, Filter, InputKind};
    use serde_json::json;

    #[test]
    fn escaping_covers_markup_quotes_and_controls() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\x07"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;&#x7;"
        );
    }

    #[test]
    fn huge_totals_saturate_rather_than_overflow() {
        let mut c = Collector::new(Filter::default(), 10);
        for name in ["a", "b"] {
            c.begin_input(name, InputKind::Events);
            c.observe(
                &json!({"event":"summary","ts":"2026-01-01T00:00:00.000000Z","gaps":u64::MAX,
                    "flows_evicted":{"memory":u64::MAX,"table":u64::MAX}}),
                1,
            );
        }
        let f = c.finish();
        assert_eq!(f.totals.count("gaps"), u64::MAX);
        assert_eq!(f.totals.sum_of("flows_evicted"), u64::MAX);
        let html = render(&f);
        assert!(html.contains(&u64::MAX.to_string()));
    }

    #[test]
    fn hostile_wire_strings_never_reach_the_page_as_markup() {
        let evil = "<script>alert(1)</script><img src=x onerror=alert(2)>";
        let mut c = Collector::new(Filter::default(), 10);
        c.begin_input(evil, InputKind::Events);
        let hs = json!({"event":"handshake","ts":"2026-01-01T00:00:00.000000Z","session_id":evil,
            "seq":1,"outcome":"accepted","http_status":200,"client":"10.0.0.2:1","server":"10.0.0.1:80",
            "client_info":{"name":evil,"version":evil},"client_capabilities":{evil:{evil:true}},
            "server_capabilities":{},"era":"legacy","source":"initialize","lineage_id":evil});
        let al = json!({"event":"alert","ts":"2026-01-01T00:00:01.000000Z","session_id":evil,
            "server":"10.0.0.1:80","client":"10.0.0.2:1","kind":"capability_narrowing","handshake_seq":2,
            "removed":[evil],"added":[],"previous":{evil:{}},"current":{},"client_removed":[evil],
            "client_added":[],"lineage_id":evil});
        let ex = json!({"event":"exchange","ts":"2026-01-01T00:00:02.000000Z","session_id":evil,
            "server":"10.0.0.1:80","client":"10.0.0.3:1","method":evil,"tool":evil,"request_id":evil,
            "http_status":200,"media_type":evil,"duration_ms":1.0,"lineage_id":evil});
        for (i, ev) in [hs, al, ex].iter().enumerate() {
            c.observe(ev, i as u64);
        }
        let html = render(&c.finish());
        assert!(!html.contains("<script"), "a script tag got through");
        assert!(!html.contains("<img"), "an img tag got through");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("default-src 'none'"));
    }
}
