//! NDJSON event output: one JSON object per line.

use mcptap_core::model::Event;
use std::io::{self, Write};

pub struct NdjsonWriter<W: Write> {
    out: W,
    /// One event is serialised here, then written with one call: serde_json writes each
    /// punctuation mark and field separately, and a `BufWriter` call per fragment cost more than
    /// the formatting itself.
    line: Vec<u8>,
}

/// Appends `value` to `line` as one NDJSON line; on an error `line` is left as it was.
pub fn render_line<T: serde::Serialize + ?Sized>(value: &T, line: &mut Vec<u8>) -> io::Result<()> {
    let start = line.len();
    if super::json::to_vec(value, line).is_err() {
        // What the fast writer does not handle, serde_json writes (or rejects) as always.
        line.truncate(start);
        if let Err(e) = serde_json::to_writer(&mut *line, value) {
            line.truncate(start);
            return Err(e.into());
        }
    }
    line.push(b'\n');
    Ok(())
}

/// Appends `event` to `line` as one NDJSON line, as [`render_line`] does, with the exchange
/// events written by the exchange writer.
pub fn render_event(event: &Event, line: &mut Vec<u8>) -> io::Result<()> {
    let start = line.len();
    if super::json::event_to_vec(event, line).is_err() {
        line.truncate(start);
        return render_line(event, line);
    }
    line.push(b'\n');
    Ok(())
}

/// Keep the line buffer after a very large event only up to this size.
const LINE_BUFFER_KEEP: usize = 64 << 10;

impl<W: Write> NdjsonWriter<W> {
    pub fn new(out: W) -> Self {
        NdjsonWriter {
            out,
            line: Vec::with_capacity(1024),
        }
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        self.write_with(|line| render_event(event, line))
    }

    /// Any serialisable line (the totals events, which the binary makes, not the core).
    pub fn write_value<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> io::Result<()> {
        self.write_with(|line| render_line(value, line))
    }

    fn write_with(
        &mut self,
        render: impl FnOnce(&mut Vec<u8>) -> io::Result<()>,
    ) -> io::Result<()> {
        self.line.clear();
        if self.line.capacity() > LINE_BUFFER_KEEP {
            self.line.shrink_to(LINE_BUFFER_KEEP);
        }
        render(&mut self.line)?;
        self.out.write_all(&self.line)
    }

    /// A line [`render_line`] made (on another thread): the bytes [`NdjsonWriter::write`]
    /// would have written.
    pub fn write_rendered(&mut self, line: &[u8]) -> io::Result<()> {
        self.out.write_all(line)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// An events file that can be reopened (after logrotate moved it away), appending.
pub struct EventFile {
    path: std::path::PathBuf,
    writer: NdjsonWriter<std::io::BufWriter<std::fs::File>>,
}

fn open_append(path: &std::path::Path) -> io::Result<std::io::BufWriter<std::fs::File>> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    Ok(std::io::BufWriter::new(f))
}

impl EventFile {
    pub fn open(path: impl Into<std::path::PathBuf>) -> io::Result<Self> {
        let path = path.into();
        let writer = NdjsonWriter::new(open_append(&path)?);
        Ok(EventFile { path, writer })
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        self.writer.write(event)
    }

    pub fn write_value<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> io::Result<()> {
        self.writer.write_value(value)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// Flushes and reopens the same path (SIGHUP).
    pub fn reopen(&mut self) -> io::Result<()> {
        self.writer.flush()?;
        self.writer = NdjsonWriter::new(open_append(&self.path)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcptap_core::model::{EndReason, SessionEnd, Timestamp};

    #[test]
    fn one_object_per_line_with_event_ts_and_session_id() {
        let mut w = NdjsonWriter::new(Vec::new());
        let ev = Event::SessionEnd(SessionEnd {
            v: Default::default(),
            lineage_id: None,
            ts: Timestamp(1_700_000_000_123_456_789),
            session_id: Some("s1".into()),
            server: "127.0.0.1:8080".parse().unwrap(),
            reason: EndReason::Deleted,
            handshakes: 1,
            requests: 3,
            alerts: 0,
        });
        w.write(&ev).unwrap();
        w.write(&ev).unwrap();
        let text = String::from_utf8(w.into_inner()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["event"], "session_end");
        assert_eq!(v["ts"], "2023-11-14T22:13:20.123456Z");
        assert_eq!(v["session_id"], "s1");
        assert_eq!(v["server"], "127.0.0.1:8080");
        assert_eq!(v["reason"], "deleted");
    }
}
