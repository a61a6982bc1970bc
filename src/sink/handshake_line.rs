//! The handshake log line, written here byte for byte as `tracing-subscriber` would write it
//! (text without colour, or JSON), into the buffered log writer. Every handshake is logged at
//! INFO (the handshake log is the product's contract), and on gateway traffic there are tens of
//! thousands: through tracing's field visitors and `fmt` machinery a line cost ~29,000
//! instructions (13–15 % of a replay's time); written directly, a fraction of that. The test
//! below holds both writers to the same output for every handshake of every fixture.

use mcptap_core::model::{Handshake, Ipv4Text, SharedJson, Timestamp};
use std::io::Write;
use std::sync::OnceLock;

/// How log lines look; set once when logging starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    Text,
    Json,
}

static DIRECT: OnceLock<LineFormat> = OnceLock::new();

/// Handshake lines are written directly in `format` from now on. Not for coloured output (a
/// terminal), which keeps tracing's own formatting.
pub fn write_directly(format: LineFormat) {
    let _ = DIRECT.set(format);
}

/// Logs `h` directly if that was set up and the handshake target is enabled at INFO; false if
/// the caller must log it through tracing.
pub fn try_log(h: &Handshake) -> bool {
    let Some(format) = DIRECT.get() else {
        return false;
    };
    if tracing::enabled!(target: "mcptap::handshake", tracing::Level::INFO) {
        with_line(|line| {
            write(*format, now(), h, line);
            super::log_writer::write_buffered(line);
        });
    }
    true
}

/// Appends `h`'s line to `out` if lines are written directly and the handshake target is
/// enabled at INFO, for [`write_rendered`] later (on another thread, say); else leaves `out`
/// as it is, and [`try_log`] decides when the handshake is logged.
pub fn render(h: &Handshake, out: &mut Vec<u8>) {
    if let Some(format) = DIRECT.get()
        && tracing::enabled!(target: "mcptap::handshake", tracing::Level::INFO)
    {
        write(*format, now(), h, out);
    }
}

/// Writes a line [`render`] made, stamped with the time now as [`try_log`] would have: the
/// log's wall-clock stamps stay in the order its lines are written.
pub fn write_rendered(rendered: &[u8]) {
    with_line(|line| {
        line.extend_from_slice(rendered);
        if let Some(format) = DIRECT.get() {
            restamp(*format, now(), line);
        }
        super::log_writer::write_buffered(line);
    });
}

/// Puts `now` in place of the wall-clock stamp [`write`] began `line` with; false (and
/// `line` as it was) if it does not begin so.
fn restamp(format: LineFormat, now: Timestamp, line: &mut [u8]) -> bool {
    let at = match format {
        LineFormat::Text => 0,
        LineFormat::Json => JSON_START.len(),
    };
    let stamp = now.rfc3339_bytes().unwrap_or(NO_STAMP);
    let starts_right = format == LineFormat::Text || line.starts_with(JSON_START);
    match line.get_mut(at..at + stamp.len()) {
        Some(old) if starts_right && old.last() == Some(&b'Z') => {
            old.copy_from_slice(&stamp);
            true
        }
        _ => false,
    }
}

/// How a JSON line begins, before its stamp.
const JSON_START: &[u8] = b"{\"timestamp\":\"";
/// The stamp of a time RFC 3339 cannot write (outside years 0-9999).
const NO_STAMP: [u8; 27] = *b"0000-00-00T00:00:00.000000Z";

/// Runs `f` on this thread's line buffer, emptied (a fresh one if it is in use or gone).
fn with_line(f: impl FnOnce(&mut Vec<u8>)) {
    let mut f = Some(f);
    let _ = LINE.try_with(|cell| {
        if let Ok(mut line) = cell.try_borrow_mut()
            && let Some(f) = f.take()
        {
            line.clear();
            f(&mut line);
            if line.capacity() > LINE_KEEP {
                *line = Vec::with_capacity(1024);
            }
        }
    });
    if let Some(f) = f {
        f(&mut Vec::with_capacity(1024));
    }
}

/// Keep the line's buffer only up to this size (after a handshake with huge capabilities).
const LINE_KEEP: usize = 64 << 10;

thread_local! {
    /// The line being written, kept between lines.
    static LINE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
}

fn now() -> Timestamp {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    Timestamp(ns)
}

/// One line, newline included.
pub fn write(format: LineFormat, now: Timestamp, h: &Handshake, out: &mut Vec<u8>) {
    let mut line = match format {
        LineFormat::Text => Line::Text(out),
        LineFormat::Json => Line::Json(out),
    };
    line.start(now);
    line.time("ts", h.ts);
    line.str("session_id", h.session_id.as_deref().unwrap_or("-"));
    if let Some(source) = super::log::modern_source(h) {
        line.str("source", source);
    }
    if let Some(method) = &h.method {
        line.str("method", method);
    }
    line.num("seq", i64::from(h.seq));
    line.str("outcome", h.outcome.as_str());
    line.num("http_status", i64::from(h.http_status));
    if let Some(code) = h.error_code {
        line.num("error_code", code);
    }
    if let Some(m) = &h.error_message {
        line.str("error_message", m);
    }
    line.endpoint("client", &h.client);
    line.endpoint("server", &h.server);
    if let Some(host) = &h.host {
        line.str("host", host);
    }
    line.display_str("path", &h.path);
    if let Some(v) = &h.protocol_version_requested {
        line.str("protocol_version_requested", v);
    }
    if let Some(v) = &h.protocol_version {
        line.str("protocol_version", v);
    }
    line.json_text("client_info", &h.client_info);
    line.json_text("server_info", &h.server_info);
    line.json_text("client_capabilities", &h.client_capabilities);
    line.json_text("server_capabilities", &h.server_capabilities);
    if let Some(diff) = &h.diff {
        line.json_str("diff", diff);
    }
    line.bool("client_near_miss", h.client_near_miss);
    if let Some(p) = &h.predecessor_session_id {
        line.str("predecessor_session_id", p);
    }
    if let Some(lineage) = &h.lineage {
        line.json_str("lineage", lineage);
    }
    line.end();
}

/// The two layouts, field by field, as tracing-subscriber's `DefaultVisitor` (text: `name=`
/// then Debug, Display for `%` fields) and `JsonVisitor` (strings, numbers, booleans) write
/// them.
enum Line<'a> {
    Text(&'a mut Vec<u8>),
    Json(&'a mut Vec<u8>),
}

impl Line<'_> {
    fn start(&mut self, now: Timestamp) {
        let stamp = now.rfc3339_bytes().unwrap_or(NO_STAMP);
        match self {
            Line::Text(o) => {
                o.extend_from_slice(&stamp);
                o.extend_from_slice(b"  INFO handshake");
            }
            Line::Json(o) => {
                o.extend_from_slice(JSON_START);
                o.extend_from_slice(&stamp);
                o.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"handshake\"");
            }
        }
    }

    fn name(&mut self, name: &str) -> &mut Vec<u8> {
        match self {
            Line::Text(o) => {
                o.push(b' ');
                o.extend_from_slice(name.as_bytes());
                o.push(b'=');
                o
            }
            Line::Json(o) => {
                o.extend_from_slice(b",\"");
                o.extend_from_slice(name.as_bytes());
                o.extend_from_slice(b"\":");
                o
            }
        }
    }

    fn is_json(&self) -> bool {
        matches!(self, Line::Json(_))
    }

    /// A `&str` field: Debug-quoted in text, a JSON string in JSON.
    fn str(&mut self, name: &str, v: &str) {
        let json = self.is_json();
        let o = self.name(name);
        if json {
            crate::sink::json::write_str(o, v);
        } else if crate::sink::json::plain_printable(v.as_bytes()) {
            // Nothing for Debug to escape (nearly always): copied, quoted.
            o.reserve(v.len() + 2);
            o.push(b'"');
            o.extend_from_slice(v.as_bytes());
            o.push(b'"');
        } else if v.bytes().all(|b| matches!(b, b' '..=b'~')) {
            // Printable ASCII: Debug escapes only quotes and backslashes, done here without
            // the formatting machinery (which goes a character at a time).
            o.reserve(v.len() + 2);
            o.push(b'"');
            let mut run = 0;
            for (at, b) in v.bytes().enumerate() {
                if matches!(b, b'"' | b'\\') {
                    o.extend_from_slice(&v.as_bytes()[run..at]);
                    o.push(b'\\');
                    run = at;
                }
            }
            o.extend_from_slice(&v.as_bytes()[run..]);
            o.push(b'"');
        } else {
            let _ = write!(o, "{v:?}");
        }
    }

    /// A `%` field of an address: as [`Self::display`], IPv4 without the formatting machinery.
    fn endpoint(&mut self, name: &str, v: &std::net::SocketAddr) {
        match v {
            std::net::SocketAddr::V4(v4) => {
                let text = Ipv4Text::new(*v4.ip(), Some(v4.port()));
                let json = self.is_json();
                let o = self.name(name);
                if json {
                    o.push(b'"');
                }
                o.extend_from_slice(text.as_bytes());
                if json {
                    o.push(b'"');
                }
            }
            std::net::SocketAddr::V6(_) => self.display(name, v),
        }
    }

    /// A `%` field: Display, unquoted in text, a JSON string in JSON.
    fn display(&mut self, name: &str, v: &dyn std::fmt::Display) {
        let json = self.is_json();
        let o = self.name(name);
        if json {
            // Escaped as it is formatted: no String of it.
            o.push(b'"');
            let _ = write!(Escaping(&mut *o), "{v}");
            o.push(b'"');
        } else {
            let _ = write!(o, "{v}");
        }
    }

    fn time(&mut self, name: &str, ts: Timestamp) {
        let json = self.is_json();
        let o = self.name(name);
        match ts.rfc3339_bytes() {
            Some(b) if json => {
                o.push(b'"');
                o.extend_from_slice(&b);
                o.push(b'"');
            }
            Some(b) => o.extend_from_slice(&b),
            None if json => crate::sink::json::write_str(o, &ts.rfc3339()),
            None => o.extend_from_slice(ts.rfc3339().as_bytes()),
        }
    }

    fn num(&mut self, name: &str, v: i64) {
        use serde_json::ser::Formatter;
        let o = self.name(name);
        // The digits Display writes, without the formatting machinery.
        let _ = serde_json::ser::CompactFormatter.write_i64(o, v);
    }

    fn bool(&mut self, name: &str, v: bool) {
        let o = self.name(name);
        o.extend_from_slice(if v { b"true" } else { b"false" });
    }

    /// A `%` field of a string: as [`Self::display`], the text copied rather than formatted.
    fn display_str(&mut self, name: &str, v: &str) {
        let json = self.is_json();
        let o = self.name(name);
        if json {
            o.push(b'"');
            crate::sink::json::escape_contents(o, v.as_bytes());
            o.push(b'"');
        } else {
            o.extend_from_slice(v.as_bytes());
        }
    }

    /// [`Self::json_display`] of a value with its JSON text at hand: the text copied (in JSON,
    /// escaped once per shared value, see [`EscapedTexts`]).
    fn json_text(&mut self, name: &str, v: &SharedJson) {
        let json = self.is_json();
        let o = self.name(name);
        if json {
            o.push(b'"');
            ESCAPED.with_borrow_mut(|cache| cache.write(o, v));
            o.push(b'"');
        } else {
            o.extend_from_slice(v.text().as_bytes());
        }
    }

    /// `Option<String>` of the value's JSON: a string field (Debug-quoted in text, a JSON
    /// string in JSON). The JSON writer's bytes are serde_json's; what it does not handle,
    /// serde_json writes. Rendered whole, then escaped in one pass: serde_json's writes come a
    /// few bytes at a time.
    fn json_str(&mut self, name: &str, v: &impl serde::Serialize) {
        let mut text = Vec::with_capacity(256);
        if crate::sink::json::to_vec(v, &mut text).is_err() {
            text.clear();
            let _ = serde_json::to_writer(&mut text, v);
        }
        if self.is_json() {
            let o = self.name(name);
            o.push(b'"');
            crate::sink::json::escape_contents(o, &text);
            o.push(b'"');
        } else {
            self.str(name, std::str::from_utf8(&text).unwrap_or_default());
        }
    }

    fn end(self) {
        match self {
            Line::Text(o) => o.push(b'\n'),
            Line::Json(o) => o.extend_from_slice(b"},\"target\":\"mcptap::handshake\"}\n"),
        }
    }
}

/// How many shared values keep their escaped text per thread, and up to what length.
const ESCAPED_ENTRIES: usize = 16;
const ESCAPED_MAX: usize = 4 << 10;

thread_local! {
    static ESCAPED: std::cell::RefCell<EscapedTexts> =
        const { std::cell::RefCell::new(EscapedTexts { entries: Vec::new(), tick: 0 }) };
}

/// The escaped texts of the shared values a JSON line wrote last: a fleet's handshakes repeat
/// a few SDKs' capability sets and infos, each escaped once here and then copied (escaping
/// them on every line was half of a JSON handshake line's instructions). At most
/// [`ESCAPED_ENTRIES`] values of up to [`ESCAPED_MAX`] escaped bytes, the least recently
/// written one replaced; the entries hold their values, so no other value takes their address.
struct EscapedTexts {
    /// (value, its escaped text, when it was last written)
    entries: Vec<(SharedJson, Box<[u8]>, u64)>,
    tick: u64,
}

impl EscapedTexts {
    /// Appends `v`'s text to `out`, escaped as the contents of a JSON string.
    fn write(&mut self, out: &mut Vec<u8>, v: &SharedJson) {
        self.tick += 1;
        // The same value, or another with the same text (not every value is shared).
        let same = |e: &&mut (SharedJson, Box<[u8]>, u64)| {
            SharedJson::ptr_eq(&e.0, v) || e.0.text() == v.text()
        };
        if let Some(entry) = self.entries.iter_mut().find(same) {
            entry.2 = self.tick;
            out.extend_from_slice(&entry.1);
            return;
        }
        let from = out.len();
        crate::sink::json::escape_contents(out, v.text().as_bytes());
        let escaped = out.get(from..).unwrap_or_default();
        if escaped.len() > ESCAPED_MAX {
            return;
        }
        let entry = (v.clone(), Box::from(escaped), self.tick);
        if self.entries.len() < ESCAPED_ENTRIES {
            self.entries.push(entry);
        } else if let Some(oldest) = self.entries.iter_mut().min_by_key(|e| e.2) {
            *oldest = entry;
        }
    }
}

/// Writes what it is given as the contents of a JSON string, escaped as `serde_json` escapes
/// a string (what is written here is UTF-8: multi-byte characters pass through as they are).
struct Escaping<'a>(&'a mut Vec<u8>);

impl Write for Escaping<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::sink::json::escape_contents(self.0, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcptap_core::model::Event;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn every_fixture_handshake() -> Vec<Handshake> {
        crate::replay::fixture_events()
            .into_iter()
            .filter_map(|(_, e)| match e {
                Event::Handshake(h) => Some(*h),
                _ => None,
            })
            .collect()
    }

    /// Without the leading wall-clock time, which differs between the two writers; the rest
    /// byte for byte (a parsed JSON value would hide the field order and the escaping).
    fn untimed(format: LineFormat, line: &str) -> String {
        let skip = match format {
            LineFormat::Text => 0,
            LineFormat::Json => {
                assert!(line.starts_with("{\"timestamp\":\""), "{line}");
                "{\"timestamp\":\"".len()
            }
        };
        line.get(skip + "2025-11-24T16:00:00.123456Z".len()..)
            .unwrap_or_default()
            .to_string()
    }

    /// Each handshake through tracing and directly: the same lines.
    fn assert_written_as_tracing_does(handshakes: &[Handshake]) {
        for format in [LineFormat::Text, LineFormat::Json] {
            let captured = Captured::default();
            let writer = {
                let c = captured.clone();
                move || c.clone()
            };
            let builder = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(writer)
                .with_max_level(tracing::Level::INFO);
            let dispatch = match format {
                LineFormat::Text => tracing::Dispatch::new(builder.with_target(false).finish()),
                LineFormat::Json => tracing::Dispatch::new(builder.json().finish()),
            };
            // One at a time: a raw newline (a `%` field) must not shift the comparison.
            for h in handshakes {
                tracing::dispatcher::with_default(&dispatch, || {
                    super::super::log::trace_handshake(h);
                });
                let want = std::mem::take(&mut *captured.0.lock().expect("lock"));
                let want = String::from_utf8(want).expect("utf-8");
                let mut got = Vec::new();
                write(format, Timestamp(1_764_000_000_123_456_000), h, &mut got);
                let got = String::from_utf8(got).expect("utf-8");
                assert!(got.ends_with('\n'));
                assert_eq!(untimed(format, &got), untimed(format, &want), "{format:?}");
            }
        }
    }

    #[test]
    fn direct_lines_are_what_tracing_writes() {
        let handshakes = every_fixture_handshake();
        // Every optional field appears somewhere: the comparison covers them.
        assert!(handshakes.iter().any(|h| h.diff.is_some()));
        assert!(handshakes.iter().any(|h| h.lineage.is_some()));
        assert!(handshakes.iter().any(|h| h.error_code.is_some()));
        assert!(
            handshakes
                .iter()
                .any(|h| h.predecessor_session_id.is_some())
        );
        assert!(handshakes.iter().any(|h| h.method.is_some()));
        assert!(
            handshakes
                .iter()
                .any(|h| h.source == mcptap_core::model::HandshakeSource::Discover)
        );
        assert_written_as_tracing_does(&handshakes);
    }

    /// What the fixtures do not have: quotes, backslashes, newlines, control characters
    /// (C0, DEL, C1, ESC), non-ASCII and bidi overrides in every string field, empty strings,
    /// IPv6 addresses, negative and extreme numbers and timestamps outside RFC 3339's years.
    #[test]
    fn hostile_strings_and_addresses_are_written_as_tracing_does() {
        let base = every_fixture_handshake().remove(0);
        let nasty =
            "q\"uo'te \\ back\nnew\r\tline \u{1b}[31mred \u{7}\u{7f}\u{9b} é 😀 \u{202e} \u{0}";
        let mut all = Vec::new();
        for (i, ts) in [0i64, -1, i64::MIN, i64::MAX, -9_000_000_000_000_000_000]
            .into_iter()
            .enumerate()
        {
            let mut h = base.clone();
            h.ts = Timestamp(ts);
            h.session_id = Some(nasty.to_string());
            h.error_code = Some(if i % 2 == 0 { i64::MIN } else { -32_602 });
            h.error_message = Some(nasty.to_string());
            h.client = "[fe80::1%3]:54321".parse().unwrap_or(h.client);
            h.server = "[2001:db8::1]:443".parse().unwrap_or(h.server);
            h.host = Some(nasty.to_string());
            h.path = nasty.to_string();
            h.protocol_version_requested = Some(nasty.to_string());
            h.protocol_version = Some(String::new());
            h.client_info = serde_json::json!({ "name": nasty, "version": nasty }).into();
            h.server_info = serde_json::json!({ nasty: [nasty, 1.5, -0.0, u64::MAX] }).into();
            h.predecessor_session_id = Some(nasty.to_string());
            h.seq = u32::MAX;
            h.http_status = u16::MAX;
            all.push(h);
        }
        // One awkward character each, and IPv4 endpoints at the ends of their ranges: what
        // decides between the quick and the formatted writing.
        for (i, odd) in [
            "plain-session-1",
            "",
            "with\"quote",
            "back\\slash",
            "\"\"\\\\\"{\"a\":\"b\\\\\"}\\",
            "tab\there",
            "del\u{7f}",
            "bell\u{7}",
            "tilde~ and space",
            "caf\u{e9}",
            "\u{a0}",
        ]
        .into_iter()
        .enumerate()
        {
            let mut h = base.clone();
            h.session_id = Some(odd.to_string());
            h.host = Some(odd.to_string());
            h.error_message = Some(odd.to_string());
            h.client = if i % 2 == 0 {
                "0.0.0.0:0".parse().unwrap_or(h.client)
            } else {
                "255.255.255.255:65535".parse().unwrap_or(h.client)
            };
            h.server = "10.20.3.100:8080".parse().unwrap_or(h.server);
            all.push(h);
        }
        let mut h = base;
        h.session_id = None;
        h.error_message = None;
        h.host = None;
        h.path = String::new();
        all.push(h);
        assert_written_as_tracing_does(&all);
    }

    /// A line rendered on one thread and written on another gets the time it is written: the
    /// stamp is replaced, and nothing else.
    #[test]
    fn a_rendered_line_is_restamped_when_written() {
        let (then, later) = (
            Timestamp(1_764_000_000_123_456_000),
            Timestamp(1_764_000_061_500_000_000),
        );
        for h in every_fixture_handshake().iter().take(8) {
            for format in [LineFormat::Text, LineFormat::Json] {
                let mut line = Vec::new();
                write(format, then, h, &mut line);
                assert!(restamp(format, later, &mut line), "{format:?}");
                let mut want = Vec::new();
                write(format, later, h, &mut want);
                assert_eq!(line, want, "{format:?}");
            }
        }
        // A line that does not begin with a stamp is left as it is.
        for (format, odd) in [
            (LineFormat::Text, &b"short"[..]),
            (
                LineFormat::Text,
                b"2025-11-24 16:00:00 INFO not ours, long enough to hold a stamp",
            ),
            (
                LineFormat::Json,
                b"{\"level\":\"INFO\",\"timestamp\":\"2025-11-24T16:00:00.123456Z\"}",
            ),
        ] {
            let mut line = odd.to_vec();
            assert!(!restamp(format, later, &mut line), "{format:?}");
            assert_eq!(line, odd);
        }
    }

    /// Escaped once and copied after: the same bytes as escaping every time, for values seen
    /// again (the same or an equal one), more values than the cache holds, and a value too
    /// long to keep; the cache stays within its bounds.
    #[test]
    fn kept_escaped_texts_are_what_escaping_writes() {
        let values: Vec<SharedJson> = (0..ESCAPED_ENTRIES * 2)
            .map(|i| serde_json::json!({ "tools": { "n": i, "q": "\"x\"\n\\" } }).into())
            .chain([
                serde_json::json!({ "long": "\"".repeat(ESCAPED_MAX) }).into(),
                serde_json::json!("caf\u{e9} \u{1b}").into(),
            ])
            .collect();
        let mut cache = EscapedTexts {
            entries: Vec::new(),
            tick: 0,
        };
        // In order, then the first few again and again, then copies with equal texts.
        let order = (0..values.len())
            .chain((0..200).map(|i| i % 5))
            .chain((0..values.len()).rev());
        for (round, i) in order.enumerate() {
            let v = if round % 3 == 0 {
                SharedJson::new(values[i].value().clone())
            } else {
                values[i].clone()
            };
            let (mut got, mut want) = (b"prefix".to_vec(), b"prefix".to_vec());
            cache.write(&mut got, &v);
            crate::sink::json::escape_contents(&mut want, v.text().as_bytes());
            assert_eq!(got, want, "value {i}, round {round}");
            assert!(cache.entries.len() <= ESCAPED_ENTRIES);
            assert!(cache.entries.iter().all(|e| e.1.len() <= ESCAPED_MAX));
        }
        // The values written most lately are the ones kept.
        assert!(cache.entries.iter().any(|e| e.0.text() == values[0].text()));
    }

    #[test]
    fn the_line_starts_with_the_wall_clock_time() {
        let h = every_fixture_handshake().remove(0);
        let mut text = Vec::new();
        write(
            LineFormat::Text,
            Timestamp(1_764_000_000_123_456_000),
            &h,
            &mut text,
        );
        assert!(text.starts_with(b"2025-11-24T16:00:00.123456Z  INFO handshake ts="));
        let mut json = Vec::new();
        write(
            LineFormat::Json,
            Timestamp(1_764_000_000_123_456_000),
            &h,
            &mut json,
        );
        let v: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        assert_eq!(v["timestamp"], "2025-11-24T16:00:00.123456Z");
        assert_eq!(v["target"], "mcptap::handshake");
    }
}
