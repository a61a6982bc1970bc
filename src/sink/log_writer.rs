//! Where log lines go: standard error, in a buffer. A gateway logs tens of thousands of
//! handshakes a minute, and one `write(2)` per line cost more than formatting it. Warnings
//! and errors are written at once; other lines wait in a bounded buffer that is flushed when
//! it fills, when the previous flush is more than [`MAX_DELAY`] old at the next line, and by
//! [`flush`] (each pipeline batch or idle tick, the end of a run); the program's own lines go through
//! [`say`], after what waits.

use std::io::{self, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};
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

/// A line of the program's own on standard error (errors, the replay summary), after the
/// log lines that wait, so that the order stays as written.
pub fn say(line: std::fmt::Arguments<'_>) {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    flush_locked(&mut p);
    let _ = write_stderr(p.progress.as_ref(), format!("{line}\n").as_bytes());
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
