//! A progress bar for long replays: on standard error when it is a terminal, never otherwise
//! (a pipe or a file gets the summary alone) and never with `--quiet`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Bytes read between two updates of the bar: an update per packet would cost more than the
/// packet.
const UPDATE_EVERY: u64 = 256 << 10;

/// Capture file record header (pcap); pcapng blocks are a little larger, so the bar runs a
/// little behind and jumps to the end when the inputs are read.
const RECORD_OVERHEAD: u64 = 16;

pub struct ReplayProgress {
    bar: Option<ProgressBar>,
    unreported: u64,
}

impl ReplayProgress {
    /// A bar over the inputs' total size (a spinner when one is standard input), shown only if
    /// `show` and standard error is a terminal.
    pub fn for_inputs(paths: &[String], show: bool) -> Self {
        if !show || !std::io::stderr().is_terminal() {
            return ReplayProgress::hidden();
        }
        let total: Option<u64> = paths
            .iter()
            .map(|p| {
                (p != "-")
                    .then(|| std::fs::metadata(p).ok().map(|m| m.len()))
                    .flatten()
            })
            .sum();
        ReplayProgress::drawn_to(ProgressDrawTarget::stderr_with_hz(4), total)
    }

    pub fn hidden() -> Self {
        ReplayProgress {
            bar: None,
            unreported: 0,
        }
    }

    fn drawn_to(target: ProgressDrawTarget, total: Option<u64>) -> Self {
        let bar = match total {
            Some(len) => ProgressBar::with_draw_target(Some(len), target).with_style(
                ProgressStyle::with_template(
                    "replay [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            ),
            None => ProgressBar::with_draw_target(None, target).with_style(
                ProgressStyle::with_template("replay {spinner} {bytes} {bytes_per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        crate::sink::log_writer::set_progress(Some(bar.clone()));
        ReplayProgress {
            bar: Some(bar),
            unreported: 0,
        }
    }

    /// One packet of `captured` bytes read.
    #[inline]
    pub fn packet(&mut self, captured: usize) {
        if self.bar.is_none() {
            return;
        }
        self.unreported += captured as u64 + RECORD_OVERHEAD;
        if self.unreported >= UPDATE_EVERY {
            self.report();
        }
    }

    fn report(&mut self) {
        if let Some(bar) = &self.bar {
            let at = bar.position() + self.unreported;
            bar.set_position(bar.length().map_or(at, |len| at.min(len)));
        }
        self.unreported = 0;
    }

    /// The inputs are read: the bar goes (the summary that follows says how long it took).
    pub fn finish(mut self) {
        self.report();
        if let Some(bar) = self.bar.take() {
            if let Some(len) = bar.length() {
                bar.set_position(len);
            }
            bar.finish_and_clear();
            crate::sink::log_writer::set_progress(None);
        }
    }

    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }
}

impl Drop for ReplayProgress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
            crate::sink::log_writer::set_progress(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_shown_unless_asked_and_on_a_terminal() {
        // The test harness's standard error is captured, not a terminal.
        assert!(!ReplayProgress::for_inputs(&["x.pcap".into()], true).is_shown());
        assert!(!ReplayProgress::for_inputs(&["x.pcap".into()], false).is_shown());
    }

    #[test]
    fn position_follows_the_bytes_read_and_ends_at_the_total() {
        let mut p = ReplayProgress::drawn_to(ProgressDrawTarget::hidden(), Some(10 << 20));
        let bar = p.bar.clone().expect("bar");
        for _ in 0..1000 {
            p.packet(1484);
        }
        // Updated in steps, never past what was read.
        let read = 1000 * (1484 + RECORD_OVERHEAD);
        assert!(bar.position() <= read && bar.position() + UPDATE_EVERY > read);
        p.finish();
        assert_eq!(bar.position(), 10 << 20);
        assert!(bar.is_finished());
    }
}
