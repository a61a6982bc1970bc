//! Inputs to JSON event values: NDJSON events files as they are, captures replayed in-process
//! and serialised as the NDJSON writer does. Both feed the same [`Collector`].

use super::model::{Collector, InputKind};
use crate::sink::summary::Summary;
use mcptap_core::model::Output;
use mcptap_core::pipeline::{Analysis, Limits};
use serde_json::{Value, json};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};

/// How captures are replayed: `mcptap replay`'s limits and analysis settings.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub limits: Limits,
    pub analysis: Analysis,
}

/// An events line longer than this is skipped (counted as malformed) rather than held: the
/// writer's lines are bounded by the message limits, far below it.
const MAX_LINE_BYTES: usize = 64 << 20;

/// The capture magics as they appear on disk (as the capture reader knows them): pcapng, then
/// classic pcap µs/ns in both byte orders and the "modified" format.
const CAPTURE_MAGICS: [[u8; 4]; 6] = [
    [0x0a, 0x0d, 0x0d, 0x0a],
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
    [0x34, 0xcd, 0xb2, 0xa1],
];

/// gzip's magic: logrotate's `compress` leaves rotated events files so.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// An events file, decompressed if it is gzip'd.
fn open_events(path: &str) -> io::Result<Box<dyn BufRead>> {
    let mut file = BufReader::new(File::open(path)?);
    if file.fill_buf()?.starts_with(&GZIP_MAGIC) {
        return Ok(Box::new(BufReader::new(
            flate2::bufread::MultiGzDecoder::new(file),
        )));
    }
    Ok(Box::new(file))
}

/// Recognises an input by its first bytes: a capture magic, or `{` (after blanks) for events,
/// gzip'd or not.
pub fn detect(path: &str) -> Result<InputKind, String> {
    if path == "-" {
        return Err("standard input is not read here: give the file".into());
    }
    let mut head = Vec::with_capacity(4096);
    File::open(path)
        .and_then(|f| f.take(4096).read_to_end(&mut head))
        .map_err(|e| format!("{path}: {e}"))?;
    if head.len() >= 4 && CAPTURE_MAGICS.iter().any(|m| head[..4] == m[..]) {
        return Ok(InputKind::Capture);
    }
    if head.starts_with(&GZIP_MAGIC) {
        let mut inner = Vec::with_capacity(4096);
        // A cut or corrupt stream still shows its first bytes; what it holds decides.
        let _ = open_events(path)
            .map_err(|e| format!("{path}: {e}"))?
            .take(4096)
            .read_to_end(&mut inner);
        if inner.len() >= 4 && CAPTURE_MAGICS.iter().any(|m| inner[..4] == m[..]) {
            return Err(format!(
                "{path}: a gzip'd capture: decompress it first (`gunzip -k {path}`)"
            ));
        }
        head = inner;
    }
    let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&head);
    match text.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(InputKind::Events),
        // An empty events file (a quiet day): nothing to read, but not an error.
        None => Ok(InputKind::Events),
        Some(_) => Err(format!(
            "{path}: neither a capture (pcap/pcapng) nor an NDJSON events file"
        )),
    }
}

/// Reads every input into `collector`. Captures are replayed together as one capture, as
/// `mcptap replay` does with several files (a rotated set); events files one by one.
pub fn load(
    inputs: &[String],
    options: &ReplayOptions,
    collector: &mut Collector,
) -> Result<(), String> {
    let mut captures = Vec::new();
    let mut events = Vec::new();
    for path in inputs {
        match detect(path)? {
            InputKind::Capture => captures.push(path.clone()),
            InputKind::Events => events.push(path.clone()),
        }
    }
    if !captures.is_empty() {
        load_captures(&captures, options, collector)?;
    }
    for path in &events {
        let reader = open_events(path).map_err(|e| format!("{path}: {e}"))?;
        collector.begin_input(path, InputKind::Events);
        read_events(reader, collector).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// One JSON event per line; blank lines are skipped, anything else that is not an event is
/// counted as malformed.
pub fn read_events(mut reader: impl BufRead, collector: &mut Collector) -> io::Result<()> {
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        number += 1;
        let (read, too_long) = read_line_bounded(&mut reader, &mut line)?;
        if read == 0 {
            return Ok(());
        }
        if too_long {
            collector.malformed_line(number, &format!("longer than {MAX_LINE_BYTES} bytes"));
            continue;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Value>(&line) {
            Ok(v) => collector.observe(&v, number),
            Err(e) => collector.malformed_line(number, &format!("not JSON: {e}")),
        }
    }
}

/// Reads up to and including `\n`, keeping at most [`MAX_LINE_BYTES`]; returns the bytes
/// consumed and whether the line was cut.
fn read_line_bounded(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<(usize, bool)> {
    let mut consumed = 0;
    let mut too_long = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok((consumed, too_long));
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        if line.len() + chunk.len() > MAX_LINE_BYTES {
            too_long = true;
            line.clear();
        } else if !too_long {
            line.extend_from_slice(chunk);
        }
        let n = chunk.len();
        reader.consume(n);
        consumed += n;
        if done {
            return Ok((consumed, too_long));
        }
    }
}

fn load_captures(
    paths: &[String],
    options: &ReplayOptions,
    collector: &mut Collector,
) -> Result<(), String> {
    collector.begin_input(&paths.join(" + "), InputKind::Capture);
    let mut summary = Summary::default();
    let mut serialise_error = None;
    let report = crate::replay::replay(
        paths,
        options.limits,
        options.analysis.clone(),
        &mut |o: &Output| {
            summary.observe(o);
            if let Output::Event(ev) = o {
                // The NDJSON writer's serialisation: the report reads what the file would say.
                match serde_json::to_value(ev) {
                    Ok(v) => collector.observe(&v, 0),
                    Err(e) => serialise_error = Some(e.to_string()),
                }
            }
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(e) = serialise_error {
        return Err(format!("serialising an event: {e}"));
    }
    for t in &report.read.truncations {
        collector.note(format!(
            "{}: truncated mid-record at byte {}; events up to the cut were read",
            t.path, t.offset
        ));
    }
    for r in &report.read.resyncs {
        collector.note(r.describe());
    }
    for cut in &report.read.snaplen_cuts {
        collector.note(format!(
            "{}: {} packets cut short by the snaplen ({} bytes)",
            cut.path, cut.packets, cut.caplen
        ));
    }
    for w in &report.read.warnings {
        collector.note(w.clone());
    }
    summary.capture_bytes_skipped = report.read.skipped_bytes();
    // A replay that emits its own summary event has said it already.
    if !collector.has_summary() {
        let (first, last) = collector.first_and_last_ts();
        let event = summary_event(&summary, &report.stats, first, last);
        collector.observe(&event, 0);
    }
    Ok(())
}

/// The `summary` event of a replay, from what the replay counted (`mcptap replay` writes the
/// same totals): its times are the first and last event's, the packets' are not reported.
pub fn summary_event(
    summary: &Summary,
    stats: &mcptap_core::pipeline::PacketStats,
    first_ts: Option<String>,
    last_ts: Option<String>,
) -> Value {
    let skipped: serde_json::Map<String, Value> = stats
        .skipped()
        .iter()
        .map(|(reason, n)| (reason.to_string(), json!(n)))
        .collect();
    json!({
        "event": "summary",
        "v": mcptap_core::model::SCHEMA_VERSION,
        "ts": last_ts,
        "first_ts": first_ts,
        "packets": stats.packets,
        "bytes": stats.bytes,
        "flows": summary.flows,
        "sessions": summary.sessions,
        "handshakes": summary.handshakes,
        "exchanges": summary.exchanges,
        "alerts": summary.alerts,
        "gaps": summary.gaps,
        "gap_bytes": summary.gap_bytes,
        "http_errors": summary.http_errors,
        "jsonrpc_errors": summary.jsonrpc_errors,
        "packets_skipped": skipped,
        "truncated_segments": stats.truncated_segments,
        "flows_evicted": summary.flows_evicted,
        "sessions_ended": summary.sessions_ended,
        "limits_hit": summary.limits_hit,
        "clock_jumps": summary.clock_jumps,
        "undecodable_flows": summary.undecodable_flows,
        "undecodable_bodies": summary.undecodable_bodies,
        "framing_anomalies": summary.framing_anomalies,
        "duplicate_headers": summary.duplicate_headers,
        "capture_bytes_skipped": summary.capture_bytes_skipped,
        "resumptions_unresolved": summary.resumptions_unresolved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forensics::model::Filter;

    #[test]
    fn inputs_are_recognised_by_content() {
        let dir = tempfile::tempdir().expect("tmp");
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).expect("write");
            p.to_string_lossy().into_owned()
        };
        let pcap = write("x.ndjson", &[0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0]);
        let events = write("x.pcap", b"\n  {\"event\":\"exchange\"}\n");
        let empty = write("empty", b"");
        let other = write("other", b"[tcpdump output]");
        assert_eq!(detect(&pcap), Ok(InputKind::Capture));
        assert_eq!(detect(&events), Ok(InputKind::Events));
        assert_eq!(detect(&empty), Ok(InputKind::Events));
        let e = detect(&other).expect_err("neither");
        assert!(e.contains("neither a capture"), "{e}");
        assert!(detect("/nonexistent/x").is_err());
        assert!(detect("-").is_err());
    }

    #[test]
    fn a_malformed_or_overlong_line_is_counted_and_reading_goes_on() {
        let mut c = Collector::new(Filter::default(), 10);
        c.begin_input("e", InputKind::Events);
        let text = "{\"event\":\"exchange\",\"server\":\"1.2.3.4:5\",\"ts\":\"2026-01-01T00:00:00Z\",\"session_id\":\"s\"}\n\
                    {broken\n\
                    \n\
                    {\"event\":\"exchange\",\"server\":\"1.2.3.4:5\",\"ts\":\"2026-01-01T00:00:01Z\",\"session_id\":\"s\"}";
        read_events(text.as_bytes(), &mut c).expect("read");
        let f = c.finish();
        assert_eq!(f.inputs[0].malformed_lines, 1);
        assert!(f.inputs[0].malformed_examples[0].starts_with("line 2: not JSON"));
        assert_eq!(f.sessions[0].requests, 2);

        let mut line = Vec::new();
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let mut reader = BufReader::with_capacity(1 << 16, &long[..]);
        let (n, cut) = read_line_bounded(&mut reader, &mut line).expect("read");
        assert_eq!((n, cut), (long.len(), true));
        assert!(line.len() <= MAX_LINE_BYTES);
    }

    #[test]
    fn the_summary_event_has_the_documented_fields() {
        let v = summary_event(
            &Summary::default(),
            &Default::default(),
            Some("a".into()),
            Some("b".into()),
        );
        for key in [
            "packets",
            "bytes",
            "flows",
            "sessions",
            "handshakes",
            "exchanges",
            "alerts",
            "gaps",
            "gap_bytes",
            "http_errors",
            "jsonrpc_errors",
            "packets_skipped",
            "truncated_segments",
            "flows_evicted",
            "sessions_ended",
            "limits_hit",
            "clock_jumps",
            "undecodable_flows",
            "undecodable_bodies",
            "framing_anomalies",
            "duplicate_headers",
            "capture_bytes_skipped",
            "resumptions_unresolved",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["event"], "summary");
        assert_eq!(v["first_ts"], "a");
    }
}
