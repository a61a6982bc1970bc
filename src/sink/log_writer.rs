//! Where log lines go: standard error, in a buffer. A gateway logs tens of thousands of
//! handshakes a minute, and one `write(2)` per line cost more than formatting it. Warnings
//! and errors are written at once; other lines wait in a bounded buffer that is flushed when
//! it fills, when the previous flush is more than [`MAX_DELAY`] old at the next line, and by
//! [`flush`] (each pipeline batch or idle tick, the end of a run); the program's own lines go through
//! [`say`], after what waits.

use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tracing_subscriber::fmt::MakeWriter;

/// Longest a line waits for a later one to carry it out.
const MAX_DELAY: Duration = Duration::from_millis(100);
/// Buffer size that triggers a flush.
const FLUSH_AT: usize = 64 * 1024;

struct Pending {
    bytes: Vec<u8>,
    flushed: Option<Instant>,
    /// A progress bar on the terminal: lines are written with the bar hidden, then it is redrawn
    /// below them.
    progress: Option<indicatif::ProgressBar>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    bytes: Vec::new(),
    flushed: None,
    progress: None,
});

/// Lines written from now on go above `bar` (None: no bar any more).
pub fn set_progress(bar: Option<indicatif::ProgressBar>) {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    flush_locked(&mut p);
    p.progress = bar;
}

/// A line below WARN, written with the others that wait (see [`LineWriter`]).
pub fn write_buffered(line: &[u8]) {
    let _ = LineWriter { direct: false }.write_all(line);
}

/// Writes to standard error, above the progress bar if there is one.
fn write_stderr(progress: Option<&indicatif::ProgressBar>, bytes: &[u8]) -> io::Result<()> {
    match progress {
        Some(bar) => bar.suspend(|| io::stderr().lock().write_all(bytes)),
        None => io::stderr().lock().write_all(bytes),
    }
}

/// Writes what waits to standard error.
pub fn flush() {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    flush_locked(&mut p);
}

/// Log lines are JSON records (`--log-format json`): the program's own lines become records
/// too, so that every line on standard error parses.
static JSON_RECORDS: AtomicBool = AtomicBool::new(false);

pub fn set_json_records(on: bool) {
    JSON_RECORDS.store(on, Ordering::Relaxed);
}

/// A line of the program's own on standard error (errors, the replay summary), after the
/// log lines that wait, so that the order stays as written. With JSON logs, a record whose
/// message is the line, at `level` (`ERROR`, `INFO`).
pub fn say(level: &str, line: std::fmt::Arguments<'_>) {
    if JSON_RECORDS.load(Ordering::Relaxed) {
        let mut fields = serde_json::Map::new();
        fields.insert("message".into(), line.to_string().into());
        return say_record(level, fields);
    }
    write_line(format!("{line}\n").as_bytes());
}

/// A record of the program's own with `fields` (`message` among them), shaped as the JSON log
/// format writes tracing's: timestamp, level, fields, target.
pub fn say_record(level: &str, fields: serde_json::Map<String, serde_json::Value>) {
    write_line(record_line(&wall_clock_text(), level, &fields).as_bytes());
}

/// One record's line: the message first among the fields, as the formatter writes them.
fn record_line(
    timestamp: &str,
    level: &str,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> String {
    let text = |v: &serde_json::Value| serde_json::to_string(v).unwrap_or_default();
    let message = fields
        .get("message")
        .map(|m| format!("\"message\":{}", text(m)));
    let rest = fields
        .iter()
        .filter(|(k, _)| *k != "message")
        .map(|(k, v)| format!("{}:{}", text(&k.as_str().into()), text(v)));
    let members: Vec<String> = message.into_iter().chain(rest).collect();
    format!(
        "{{\"timestamp\":{},\"level\":{},\"fields\":{{{}}},\"target\":\"mcptap\"}}\n",
        text(&timestamp.into()),
        text(&level.into()),
        members.join(",")
    )
}

/// Whether the program's own lines are JSON records.
pub fn json_records() -> bool {
    JSON_RECORDS.load(Ordering::Relaxed)
}

fn write_line(bytes: &[u8]) {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    flush_locked(&mut p);
    let _ = write_stderr(p.progress.as_ref(), bytes);
}

/// The wall clock as RFC 3339 with microseconds, as the JSON log format stamps records.
fn wall_clock_text() -> String {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    mcptap_core::model::Timestamp(ns).rfc3339()
}

fn flush_locked(p: &mut Pending) {
    if !p.bytes.is_empty() {
        // A log line that cannot be written has nowhere else to go.
        let _ = write_stderr(p.progress.as_ref(), &p.bytes);
        p.bytes.clear();
    }
    p.flushed = Some(Instant::now());
}

/// The `tracing-subscriber` writer: buffered below WARN, direct from WARN up.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

/// One line's writer.
pub struct LineWriter {
    direct: bool,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        if self.direct {
            // Keep the order: what waits goes first.
            flush_locked(&mut p);
            write_stderr(p.progress.as_ref(), buf)?;
            return Ok(buf.len());
        }
        p.bytes.extend_from_slice(buf);
        let stale = p.flushed.is_none_or(|t| t.elapsed() >= MAX_DELAY);
        if p.bytes.len() >= FLUSH_AT || stale {
            flush_locked(&mut p);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter { direct: true }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        LineWriter {
            direct: *meta.level() <= tracing::Level::WARN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program's own records parse, in the JSON log format's shape.
    #[test]
    fn own_records_are_json_in_the_formatters_shape() {
        let mut fields = serde_json::Map::new();
        fields.insert("packets".into(), 72.into());
        fields.insert("message".into(), "summary \"quoted\"".into());
        let line = record_line("2026-12-07T15:17:38.681424Z", "INFO", &fields);
        assert_eq!(
            line,
            "{\"timestamp\":\"2026-12-07T15:17:38.681424Z\",\"level\":\"INFO\",\"fields\":\
             {\"message\":\"summary \\\"quoted\\\"\",\"packets\":72},\"target\":\"mcptap\"}\n"
        );
        let parsed: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(parsed["fields"]["message"], "summary \"quoted\"");
    }

    #[test]
    fn info_lines_wait_warnings_do_not() {
        let waiting = || PENDING.lock().map(|p| p.bytes.len()).unwrap_or(0);
        // Right after a flush an INFO line waits for company.
        flush();
        LineWriter { direct: false }
            .write_all(b"one\n")
            .expect("write");
        assert_eq!(waiting(), 4);
        // A warning goes out at once, after what waited.
        LineWriter { direct: true }
            .write_all(b"(log_writer test: a warning)\n")
            .expect("write");
        assert_eq!(waiting(), 0);
        // A line after a quiet period goes out at once too.
        std::thread::sleep(MAX_DELAY);
        LineWriter { direct: false }
            .write_all(b"(log_writer test: after a pause)\n")
            .expect("write");
        assert_eq!(waiting(), 0);
    }
}
