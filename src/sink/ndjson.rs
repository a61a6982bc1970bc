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

/// An events file that can be reopened (after logrotate moved it away), appending. A write
/// the file refuses (a full disk) loses the lines its buffer held, counted
/// ([`EventFile::take_lost`]), and the file is cut back to its last complete line, so that
/// a line half written is not glued to the next one.
pub struct EventFile {
    path: std::path::PathBuf,
    /// Always set; taken only while it is rebuilt after an error.
    writer: Option<NdjsonWriter<std::io::BufWriter<LineTrackedFile>>>,
    lost: u64,
}

/// The events file under its buffer, knowing where its last complete line ends.
struct LineTrackedFile {
    file: std::fs::File,
    /// Bytes in the file, as written through here (appending: its length).
    len: u64,
    /// Where its last complete line ends.
    complete: u64,
}

impl Write for LineTrackedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        if let Some(nl) = buf
            .get(..n)
            .and_then(|b| b.iter().rposition(|c| *c == b'\n'))
        {
            self.complete = self.len + nl as u64 + 1;
        }
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn open_append(path: &std::path::Path) -> io::Result<std::io::BufWriter<LineTrackedFile>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let len = file.metadata()?.len();
    // What the file held before is not cut (a line of its own left half written stays).
    let file = LineTrackedFile {
        file,
        len,
        complete: len,
    };
    Ok(std::io::BufWriter::new(file))
}

impl EventFile {
    pub fn open(path: impl Into<std::path::PathBuf>) -> io::Result<Self> {
        let path = path.into();
        let writer = Some(NdjsonWriter::new(open_append(&path)?));
        Ok(EventFile {
            path,
            writer,
            lost: 0,
        })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        let result = match self.writer.as_mut() {
            Some(w) => w.write(event),
            None => Ok(()),
        };
        self.after(result, 1)
    }

    pub fn write_value<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> io::Result<()> {
        let result = match self.writer.as_mut() {
            Some(w) => w.write_value(value),
            None => Ok(()),
        };
        self.after(result, 1)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let result = match self.writer.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        };
        self.after(result, 0)
    }

    /// Events lost to write errors since the last call.
    pub fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost)
    }

    /// After a write of `lines` lines: on an error, what the buffer holds is dropped and
    /// counted with them, and the file is cut back to its last complete line.
    fn after(&mut self, result: io::Result<()>, lines: u64) -> io::Result<()> {
        let Err(e) = result else {
            return Ok(());
        };
        let Some(writer) = self.writer.take() else {
            return Err(e);
        };
        let (mut file, buffered) = writer.into_inner().into_parts();
        let buffered = buffered.unwrap_or_else(|p| p.into_inner());
        // The line being written may be partly in the buffer: it is counted in `lines`.
        let complete_lines = buffered.iter().filter(|b| **b == b'\n').count() as u64;
        self.lost += lines + complete_lines;
        if file.len > file.complete && file.file.set_len(file.complete).is_ok() {
            file.len = file.complete;
        }
        self.writer = Some(NdjsonWriter::new(std::io::BufWriter::new(file)));
        Err(e)
    }

    /// Flushes and reopens the same path (SIGHUP).
    pub fn reopen(&mut self) -> io::Result<()> {
        self.flush()?;
        self.writer = Some(NdjsonWriter::new(open_append(&self.path)?));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcptap_core::model::{EndReason, SessionEnd, Timestamp};

    fn line(n: u64) -> serde_json::Value {
        serde_json::json!({ "event": "stats", "n": n, "pad": "x".repeat(100) })
    }

    /// A disk that refuses every write (`/dev/full`): the lines the buffer held and the one
    /// being written are counted lost, once each, and writing goes on.
    #[test]
    fn events_a_full_disk_refuses_are_counted_lost() {
        let Ok(mut f) = EventFile::open("/dev/full") else {
            return; // no /dev/full here
        };
        let mut refused = 0;
        for n in 0..1000 {
            refused += u64::from(f.write_value(&line(n)).is_err());
        }
        refused += u64::from(f.flush().is_err());
        assert!(refused > 0);
        assert_eq!(f.take_lost(), 1000, "every line lost, none twice");
        assert_eq!(f.take_lost(), 0);
    }

    /// A write cut short mid-line: the file is cut back to its last complete line, and the
    /// next lines follow it whole.
    #[test]
    fn a_line_cut_short_by_an_error_is_removed() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("events.ndjson");
        std::fs::write(&path, b"{\"before\":1}\n").expect("write");
        let mut f = EventFile::open(&path).expect("open");
        f.write_value(&line(1)).expect("write");
        f.flush().expect("flush");
        // Half a line reaches the file, then the disk refuses the rest.
        if let Some(w) = f.writer.as_mut() {
            w.out.get_mut().write_all(b"{\"half\":").expect("half");
        }
        let refused = f.after(Err(io::Error::other("no space")), 1);
        assert!(refused.is_err());
        assert_eq!(f.take_lost(), 1);
        f.write_value(&line(2)).expect("write");
        f.flush().expect("flush");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line whole"))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[2]["n"], 2);
    }

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
