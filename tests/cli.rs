//! The `mcptap replay` command as an operator runs it: output contract, exit codes, bad input.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcptap"))
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run mcptap")
}

fn stdout_events(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

#[test]
fn replay_writes_ndjson_with_the_common_fields_and_a_summary() {
    let out = run(&["replay", &fixture("incident.pcap")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let evs = stdout_events(&out);
    assert!(!evs.is_empty());
    for e in &evs {
        assert!(e["event"].is_string(), "{e}");
        let ts = e["ts"].as_str().expect("ts");
        // RFC 3339, UTC, microseconds.
        assert_eq!(ts.len(), "2026-11-30T17:35:00.995335Z".len(), "{ts}");
        assert!(ts.ends_with('Z'));
        assert!(e.get("session_id").is_some(), "{e}");
    }
    // The last event is the totals, blind spots included.
    let summary = evs.last().expect("summary");
    assert_eq!(summary["event"], "summary", "{summary}");
    assert_eq!(summary["alerts"]["capability_narrowing"], 1, "{summary}");
    assert_eq!(summary["packets"], 72, "{summary}");
    assert_eq!(summary["gaps"], 0, "{summary}");
    assert!(summary["undecodable_flows"].is_object(), "{summary}");
    assert!(
        summary["first_ts"].as_str() < summary["ts"].as_str(),
        "{summary}"
    );
    assert_eq!(
        evs.iter().filter(|e| e["event"] == "summary").count(),
        1,
        "one summary"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("mcptap summary"), "{stderr}");
    assert!(stderr.contains("capability_narrowing=1"), "{stderr}");
    // Handshakes at INFO with the full capability sets, alerts at WARN.
    assert!(
        stderr.contains("INFO") && stderr.contains("server_capabilities"),
        "{stderr}"
    );
    assert!(stderr.contains("WARN"), "{stderr}");
    assert!(!stderr.contains("fixture-secret-token"));
}

#[test]
fn fail_on_alert_exits_3_only_when_an_alert_fired() {
    let bad = run(&["replay", "--fail-on-alert", &fixture("incident.pcap")]);
    assert_eq!(bad.status.code(), Some(3));
    let good = run(&["replay", "--fail-on-alert", &fixture("sdk_sse.pcap")]);
    assert_eq!(good.status.code(), Some(0));
}

#[test]
fn events_file_and_standard_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.ndjson");
    let capture = std::fs::read(fixture("incident.pcap")).expect("fixture");
    let mut child = bin()
        .args(["replay", "--events", events.to_str().expect("utf8"), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&capture)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    let text = std::fs::read_to_string(&events).expect("events file");
    assert!(text.lines().any(|l| l.contains("\"capability_narrowing\"")));
}

#[test]
fn events_to_dash_are_written_to_standard_output_not_to_a_file_named_dash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = bin()
        .current_dir(dir.path())
        .args(["replay", "--events", "-", &fixture("incident.pcap")])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_events(&out)
            .iter()
            .any(|e| e["kind"] == "capability_narrowing")
    );
    assert!(!dir.path().join("-").exists());
}

#[test]
fn several_files_are_one_capture_in_timestamp_order() {
    // Given in either order, the earlier capture's session comes out first.
    let sessions = |args: &[&str]| -> Vec<String> {
        let mut seen = Vec::new();
        for e in stdout_events(&run(args)) {
            if let Some(s) = e["session_id"].as_str()
                && !seen.iter().any(|x| x == s)
            {
                seen.push(s.to_string());
            }
        }
        seen
    };
    let a = sessions(&[
        "replay",
        &fixture("widening.pcap"),
        &fixture("incident.pcap"),
    ]);
    let b = sessions(&[
        "replay",
        &fixture("incident.pcap"),
        &fixture("widening.pcap"),
    ]);
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a, b);
    let first_ts = |f: &str| {
        stdout_events(&run(&["replay", &fixture(f)]))[0]["ts"]
            .as_str()
            .map(str::to_string)
    };
    let incident_first = first_ts("incident.pcap") < first_ts("widening.pcap");
    assert_eq!(a[0] == "incident-s1", incident_first, "{a:?}");
}

#[test]
fn missing_file_is_one_clear_line_and_exit_2() {
    let out = run(&["replay", "/nonexistent/day.pcap"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/nonexistent/day.pcap"), "{stderr}");
}

#[test]
fn a_file_that_is_not_a_capture_is_rejected() {
    let out = run(&[
        "replay",
        &format!("{}/Cargo.toml", env!("CARGO_MANIFEST_DIR")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a pcap or pcapng"), "{stderr}");
}

#[test]
fn truncated_file_keeps_events_up_to_the_cut_and_warns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cut = dir.path().join("cut.pcap");
    let full = std::fs::read(fixture("incident.pcap")).expect("fixture");
    std::fs::write(&cut, &full[..full.len() * 2 / 3 + 5]).expect("write");
    let out = run(&["replay", cut.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("truncated") && stderr.contains("cut.pcap"),
        "{stderr}"
    );
    assert!(stderr.contains("offset"), "{stderr}");
    let evs = stdout_events(&out);
    assert!(evs.iter().any(|e| e["event"] == "handshake"));
}

#[test]
fn garbage_after_a_valid_header_does_not_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("junk.pcap");
    let mut bytes = std::fs::read(fixture("incident.pcap")).expect("fixture")[..24].to_vec();
    let mut seed = 7u32;
    for _ in 0..50_000 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
        bytes.push((seed >> 16) as u8);
    }
    std::fs::write(&path, bytes).expect("write");
    let out = run(&["replay", path.to_str().expect("utf8")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(matches!(out.status.code(), Some(0) | Some(2)), "{stderr}");
}

/// A record claiming more than the file holds costs no big buffer: within the snaplen it is
/// a file cut short (a truncation); beyond it, a corrupt length whose rest is skipped.
#[test]
fn a_record_claiming_more_than_the_file_holds_costs_no_big_buffer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("liar.pcap");
    for (caplen, expect) in [
        (60_000u32, "offset=24"),
        (
            250_000_000,
            "corrupt record length at byte 24: no plausible record after it",
        ),
    ] {
        let mut bytes = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(&65535u32.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(&caplen.to_le_bytes());
        bytes.extend_from_slice(&caplen.to_le_bytes());
        bytes.extend_from_slice(&[0xab; 16]);
        std::fs::write(&path, &bytes).expect("write");
        let out = bin()
            .args(["replay", path.to_str().expect("utf8")])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{caplen}: {stderr}");
        assert_eq!(stderr.contains("truncated"), caplen == 60_000, "{stderr}");
    }
}

/// The incident capture with a bogus 116-byte record spliced in mid-file; and where.
fn incident_with_a_corrupt_record() -> (Vec<u8>, usize) {
    let intact = std::fs::read(fixture("incident.pcap")).expect("fixture");
    // Walk the records to the middle one (little-endian µs pcap, 16-byte record headers).
    let mut at = 24usize;
    let mut starts = Vec::new();
    while at + 16 <= intact.len() {
        starts.push(at);
        let caplen = u32::from_le_bytes(intact[at + 8..at + 12].try_into().expect("4 bytes"));
        at += 16 + caplen as usize;
    }
    let splice = starts[starts.len() / 2];
    let mut bogus = intact[splice..splice + 16].to_vec();
    bogus[8..12].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    bogus.extend(std::iter::repeat_n(0xee, 100));
    let mut corrupt = intact[..splice].to_vec();
    corrupt.extend_from_slice(&bogus);
    corrupt.extend_from_slice(&intact[splice..]);
    (corrupt, splice)
}

/// A corrupt record length mid-file (issue 11): the file is read on from the next plausible
/// record, exit 0, a warning names the file and both byte offsets, the summary counts the
/// skipped bytes; through a pipe the same. A bogus record spliced between two real ones is
/// all that is skipped, so the events are the intact file's.
#[test]
fn corrupt_record_length_mid_file_is_resynchronised() {
    let (corrupt, splice) = incident_with_a_corrupt_record();
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("corrupt.pcap");
    std::fs::write(&path, &corrupt).expect("write");
    let path = path.to_str().expect("utf-8");

    let want = run(&["replay", &fixture("incident.pcap")]);
    let got = run(&["replay", path]);
    assert!(got.status.success(), "{got:?}");
    // The events of the intact file; the closing summary counts the bytes skipped.
    let (got_events, want_events) = (stdout_events(&got), stdout_events(&want));
    let split = |evs: &[serde_json::Value]| {
        let (summary, events) = evs.split_last().expect("events");
        assert_eq!(summary["event"], "summary");
        (summary.clone(), events.to_vec())
    };
    let ((got_summary, got_events), (want_summary, want_events)) =
        (split(&got_events), split(&want_events));
    assert!(got_events == want_events, "the events of the intact file");
    assert_eq!(got_summary["capture_bytes_skipped"], 116);
    assert_eq!(want_summary["capture_bytes_skipped"], 0);
    assert_eq!(got_summary["packets"], want_summary["packets"]);
    let stderr = String::from_utf8_lossy(&got.stderr);
    let line = format!(
        "{path}: corrupt record length at byte {splice}: resynchronised at byte {}, 116 bytes skipped",
        splice + 116
    );
    assert!(stderr.contains(&line), "{stderr}");
    assert!(
        stderr.contains("capture bytes skipped over corrupt record lengths: 116"),
        "{stderr}"
    );
    assert!(!stderr.contains("truncated"), "{stderr}");

    let mut child = bin()
        .args(["replay", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&corrupt));
    let piped = child.wait_with_output().expect("wait");
    writer.join().expect("writer").expect("write");
    assert!(piped.status.success(), "{piped:?}");
    let (piped_summary, piped_events) = split(&stdout_events(&piped));
    assert!(
        piped_events == want_events,
        "the events of the intact file, from a pipe"
    );
    assert_eq!(piped_summary["capture_bytes_skipped"], 116);
    assert!(
        String::from_utf8_lossy(&piped.stderr).contains("<stdin>: corrupt record length at byte"),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
}

/// A progress bar on standard error only when it is a terminal (here a pseudo-terminal made by
/// util-linux `script`), never in a pipe and never with `--quiet`.
/// Through the daemon's worker path the closing summary event counts the skipped bytes as
/// well, as the single-pipeline replay's does (and as the worker replay's stderr says).
#[test]
fn worker_replay_summary_counts_the_capture_bytes_skipped() {
    let (corrupt, _) = incident_with_a_corrupt_record();
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("corrupt.pcap");
    std::fs::write(&path, &corrupt).expect("write");
    let path = path.to_str().expect("utf-8");
    let out = run(&["replay", "--worker-threads", "2", path]);
    assert!(out.status.success(), "{out:?}");
    let evs = stdout_events(&out);
    let summary = evs.last().expect("summary");
    assert_eq!(summary["event"], "summary", "{summary}");
    assert_eq!(summary["capture_bytes_skipped"], 116, "{summary}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("capture bytes skipped over corrupt record lengths: 116")
    );
}

#[test]
fn progress_bar_on_a_terminal_only_and_not_with_quiet() {
    let on_terminal = |extra: &str| {
        let cmd = format!(
            "'{}' replay {extra} '{}' --events /dev/null --log-level warn",
            env!("CARGO_BIN_EXE_mcptap"),
            fixture("interleaved.pcap")
        );
        let out = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .expect("util-linux script");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = on_terminal("");
    assert!(shown.contains("replay ["), "{shown}");
    assert!(shown.contains("28.75 KiB"), "the inputs' size: {shown}");
    assert!(shown.contains("mcptap summary"), "{shown}");
    let quiet = on_terminal("--quiet");
    assert!(!quiet.contains("replay ["), "{quiet}");
    assert!(!quiet.contains("mcptap summary"), "{quiet}");
    let piped = run(&["replay", &fixture("interleaved.pcap")]);
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(!stderr.contains("replay ["), "{stderr}");
    assert!(stderr.contains("mcptap summary"), "{stderr}");
}

// The forensics commands: `sessions`, `show`, `report`.

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok_stdout(out: &Output) -> String {
    assert!(out.status.success(), "{}", stderr_of(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The events `mcptap replay` writes for a fixture, as a file in `dir`.
fn events_file(dir: &std::path::Path, capture: &str) -> String {
    let path = dir.join(format!("{capture}.ndjson"));
    let path = path.to_str().expect("utf-8").to_string();
    let out = run(&["replay", "--events", &path, &fixture(capture)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    path
}

/// The column of `name` in an aligned table, per data line.
fn column(table: &str, name: &str) -> Vec<String> {
    let mut lines = table.lines();
    let header = lines.next().expect("a header");
    let at = header.find(name).expect("the column");
    lines
        .map(|l| {
            l.get(at..)
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

const SESSIONS_FIXTURES: [&str; 4] = [
    "widening.pcap",
    "incident.pcap",
    "modern_narrowing.pcap",
    "sdk_sse.pcap",
];

fn sessions_sorted(order: &str) -> String {
    let mut args = vec!["sessions".to_string(), "--sort".into(), order.into()];
    args.extend(SESSIONS_FIXTURES.iter().map(|f| fixture(f)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok_stdout(&run(&args))
}

#[test]
fn sessions_lists_every_session_with_its_alerts_in_each_sort_order() {
    let by_first_seen = sessions_sorted("first_seen");
    let ids = column(&by_first_seen, "ID");
    assert!(ids.len() >= 4, "{by_first_seen}");
    let incident = by_first_seen
        .lines()
        .find(|l| l.contains("incident-s1"))
        .expect("the incident session");
    assert!(
        incident.contains("capability_narrowing=1 content_type_divergence=1"),
        "{incident}"
    );
    assert!(incident.contains("fixture-client 0.4.2"), "{incident}");
    let seen = column(&by_first_seen, "FIRST SEEN");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{by_first_seen}");

    let by_alerts = sessions_sorted("alerts");
    assert_eq!(column(&by_alerts, "ID")[0], "incident-s1", "{by_alerts}");
    let alerts: Vec<u64> = by_alerts
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('=').and_then(|(_, n)| n.parse::<u64>().ok()))
                .sum()
        })
        .collect();
    assert!(alerts.windows(2).all(|w| w[0] >= w[1]), "{by_alerts}");

    let by_requests = sessions_sorted("requests");
    let requests: Vec<u64> = column(&by_requests, "REQ")
        .iter()
        .map(|n| n.parse().expect("a count"))
        .collect();
    assert!(requests.windows(2).all(|w| w[0] >= w[1]), "{by_requests}");
    let mut a = ids.clone();
    let mut b = column(&by_requests, "ID");
    a.sort();
    b.sort();
    assert_eq!(a, b, "every order lists the same sessions");
}

#[test]
fn show_prints_the_incident_timeline_with_the_narrowing_and_the_media_change() {
    let out = ok_stdout(&run(&["show", "incident-s1", &fixture("incident.pcap")]));
    assert!(
        out.contains("initialize #2 accepted (HTTP 200); client lost sampling, tools.streaming; server lost tools.streaming"),
        "{out}"
    );
    assert!(out.contains("ALERT      capability_narrowing"), "{out}");
    assert!(out.contains("[HTTP 502]"), "{out}");
    assert!(
        out.contains("reconnect  new client connection 127.0.0.1:35702"),
        "{out}"
    );
    let changed: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("tools/call") && l.contains("[SSE -> JSON]"))
        .collect();
    assert_eq!(changed.len(), 2, "{out}");
    assert!(out.contains("tools/call: SSE x2 then JSON x2"), "{out}");
    // The lineage id finds the same timeline.
    let by_lineage = ok_stdout(&run(&[
        "show",
        "213e518f622a8498",
        &fixture("incident.pcap"),
    ]));
    assert_eq!(by_lineage, out);
}

#[test]
fn an_unknown_id_is_a_clear_error() {
    for args in [
        vec!["show", "no-such-session"],
        vec!["report", "-o", "/dev/null", "--session", "no-such-session"],
        vec!["sessions", "--lineage", "no-such-session"],
    ] {
        let mut args: Vec<String> = args.into_iter().map(str::to_string).collect();
        args.push(fixture("incident.pcap"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = stderr_of(&out);
        assert!(
            stderr.contains("no-such-session\"") && stderr.contains("incident.pcap"),
            "{stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

/// The part of a report that describes sessions (the inputs table and header name files).
fn sessions_part(html: &str) -> &str {
    let at = html
        .find("<h2>Alerted sessions and lineages")
        .expect("the table");
    &html[at..]
}

fn findings_part(html: &str) -> &str {
    let from = html.find("<h2>Findings").expect("findings");
    let to = html.find("<h2>Summary").expect("summary");
    &html[from..to]
}

#[test]
fn report_of_a_capture_and_of_its_events_file_say_the_same() {
    let dir = tempfile::tempdir().expect("tmp");
    let events = events_file(dir.path(), "incident.pcap");
    let from_capture = dir.path().join("capture.html");
    let from_events = dir.path().join("events.html");
    for (input, html) in [
        (fixture("incident.pcap"), &from_capture),
        (events.clone(), &from_events),
    ] {
        let out = run(&["report", &input, "-o", html.to_str().expect("utf-8")]);
        assert!(out.status.success(), "{}", stderr_of(&out));
        assert!(stderr_of(&out).contains("1 alerted"), "{}", stderr_of(&out));
    }
    let a = std::fs::read_to_string(&from_capture).expect("report");
    let b = std::fs::read_to_string(&from_events).expect("report");
    assert_eq!(sessions_part(&a), sessions_part(&b));
    assert_eq!(findings_part(&a), findings_part(&b));
    for html in [&a, &b] {
        assert!(html.contains("incident-s1"));
        assert!(html.contains("Server lost <b>tools.streaming</b>"));
        assert!(html.contains("<span class=\"badge change\">SSE → JSON</span>"));
        assert!(!html.contains("<script"), "no scripts");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no fetches"
        );
    }
    // The capture's replay counted its blind spots, and the events file has its summary.
    assert!(a.contains("No blind spots recorded"), "capture totals");
    assert!(
        b.contains("No blind spots recorded"),
        "the summary event's totals"
    );
    // An events file from before the summary event: the report says it cannot know.
    let text = std::fs::read_to_string(&events).expect("events");
    let old: String = text
        .lines()
        .filter(|l| !l.contains(r#""event":"summary""#))
        .map(|l| format!("{l}\n"))
        .collect();
    let old_events = dir.path().join("old.ndjson");
    std::fs::write(&old_events, old).expect("write");
    let old_html = dir.path().join("old.html");
    let out = run(&[
        "report",
        old_events.to_str().expect("utf-8"),
        "-o",
        old_html.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let c = std::fs::read_to_string(&old_html).expect("report");
    assert_eq!(findings_part(&a), findings_part(&c));
    assert!(
        c.contains("Blind-spot totals unknown"),
        "events without totals"
    );
}

#[test]
fn report_reads_summary_totals_and_counts_malformed_lines() {
    let dir = tempfile::tempdir().expect("tmp");
    let events = events_file(dir.path(), "incident.pcap");
    // The replay's own summary makes way for one with blind spots.
    let mut text: String = std::fs::read_to_string(&events)
        .expect("events")
        .lines()
        .filter(|l| !l.contains(r#""event":"summary""#))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str("{not json\n");
    text.push_str(concat!(
        r#"{"event":"summary","v":2,"ts":"2026-11-30T17:42:49.491193Z","first_ts":"2026-11-30T17:42:49.399000Z","#,
        r#""packets":72,"gaps":3,"gap_bytes":900,"undecodable_flows":{"tls":2},"flows_evicted":{"idle":5}}"#,
        "\n"
    ));
    std::fs::write(&events, text).expect("write");
    let html_path = dir.path().join("r.html");
    let out = run(&["report", &events, "-o", html_path.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("1 malformed event lines skipped (line 13: not JSON"),
        "{}",
        stderr_of(&out)
    );
    let html = std::fs::read_to_string(&html_path).expect("report");
    assert!(html.contains("3 kinds of blind spot recorded"), "{html}");
    assert!(html.contains("900 bytes"));
    assert!(html.contains("tls=2"));
    // Idle flows are the normal course, not a blind spot.
    assert!(!html.contains("idle=5"));
}

#[test]
fn report_session_narrows_to_one_session() {
    let dir = tempfile::tempdir().expect("tmp");
    let html_path = dir.path().join("r.html");
    let out = run(&[
        "report",
        &fixture("incident.pcap"),
        &fixture("widening.pcap"),
        "--session",
        "widening-s1",
        "-o",
        html_path.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let html = std::fs::read_to_string(&html_path).expect("report");
    let sessions = sessions_part(&html);
    assert!(sessions.contains("widening-s1"));
    assert!(!sessions.contains("incident-s1"));
    assert!(
        html.contains("Narrowed to session &quot;widening-s1&quot;: 1 of 2"),
        "{html}"
    );

    let listed = ok_stdout(&run(&[
        "sessions",
        "--session",
        "incident-s1",
        &fixture("incident.pcap"),
        &fixture("widening.pcap"),
    ]));
    assert_eq!(column(&listed, "ID"), ["incident-s1"]);
}

#[test]
fn report_escapes_hostile_strings_from_the_wire() {
    let dir = tempfile::tempdir().expect("tmp");
    let events = events_file(dir.path(), "incident.pcap");
    let hostile = r#"<script>alert(document.cookie)</script><img src=x onerror=alert(1)>"#;
    let text = std::fs::read_to_string(&events)
        .expect("events")
        .replace("fixture-client", &hostile.replace('"', "\\\""))
        .replace("search_docs", "\\\"><svg onload=alert(2)>");
    std::fs::write(&events, text).expect("write");
    let html_path = dir.path().join("r.html");
    let out = run(&["report", &events, "-o", html_path.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let html = std::fs::read_to_string(&html_path).expect("report");
    assert!(!html.contains("<script"), "a script tag got through");
    assert!(!html.contains("<img"), "an img tag got through");
    assert!(!html.contains("<svg onload"), "an svg handler got through");
    assert!(html.contains("&lt;script&gt;alert(document.cookie)&lt;/script&gt;"));
    assert!(html.contains("&quot;&gt;&lt;svg onload=alert(2)&gt;"));
    // The terminal gets the text, not the markup's effect: control characters are escaped.
    let shown = ok_stdout(&run(&["show", "incident-s1", &events]));
    assert!(shown.contains("<script>alert(document.cookie)</script>"));
}

/// `sessions` and `show` print no control character from an events file, whichever field
/// carries it (the server, times, era, media types, end reasons, a declaration's method).
#[test]
fn sessions_and_show_print_no_control_characters_from_any_field() {
    let dir = tempfile::tempdir().expect("tmp");
    let esc = "\u{1b}[2J\u{9b}31m";
    let e = |v: serde_json::Value| format!("{v}\n");
    let server = format!("10.0.0.1:80{esc}");
    let mut text = String::new();
    text += &e(
        serde_json::json!({"event":"handshake","ts":format!("2026-01-01T00:00:00.000000Z{esc}"),
        "session_id":"s1","seq":1,"outcome":"accepted","http_status":200,"client":"10.0.0.2:1",
        "server":server,"era":format!("legacy{esc}"),"source":"initialize","lineage_id":"l1"}),
    );
    text += &e(
        serde_json::json!({"event":"exchange","ts":"2026-01-01T00:00:01.000000Z",
        "session_id":"s1","server":server,"client":"10.0.0.2:1","method":"m","request_id":1,
        "http_status":200,"media_type":format!("sse{esc}"),"lineage_id":"l1"}),
    );
    text += &e(
        serde_json::json!({"event":"exchange","ts":"2026-01-01T00:00:02.000000Z",
        "session_id":"s1","server":server,"client":"10.0.0.2:1","method":"m","request_id":2,
        "http_status":200,"media_type":"json","lineage_id":"l1"}),
    );
    text += &e(
        serde_json::json!({"event":"alert","ts":"2026-01-01T00:00:03.000000Z",
        "session_id":"s1","server":server,"kind":"client_capability_narrowing",
        "method":format!("tools/call{esc}"),"removed":["x"],"declaration_seq":2,"lineage_id":"l1"}),
    );
    text += &e(
        serde_json::json!({"event":"session_end","ts":"2026-01-01T00:00:04.000000Z",
        "session_id":"s1","server":server,"reason":format!("deleted{esc}")}),
    );
    let path = dir.path().join("hostile.ndjson");
    std::fs::write(&path, text).expect("write");
    let path = path.to_str().expect("utf-8");
    for args in [vec!["sessions", path], vec!["show", "s1", path]] {
        let out = ok_stdout(&run(&args));
        assert!(out.contains("10.0.0.1:80"), "{out}");
        let bad: Vec<char> = out
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(
            bad.is_empty(),
            "{args:?}: control characters {bad:?} in\n{out}"
        );
    }
}

/// An events file names any number of sessions: at most `--max-sessions` get a record, the
/// events of the others are counted and said to be.
#[test]
fn forensics_keep_at_most_max_sessions_records_and_say_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut all = String::new();
    for capture in ["incident.pcap", "widening.pcap", "sdk_sse.pcap"] {
        let events = events_file(dir.path(), capture);
        all.push_str(&std::fs::read_to_string(&events).expect("events"));
    }
    let events = dir.path().join("all.ndjson");
    std::fs::write(&events, all).expect("write");
    let events = events.to_str().expect("utf-8");
    let every = ok_stdout(&run(&["sessions", events]));
    let bounded = run(&["sessions", "--max-sessions", "1", events]);
    let listed = ok_stdout(&bounded);
    assert!(
        every.lines().count() > listed.lines().count(),
        "{every}\n{listed}"
    );
    assert!(listed.contains("incident-s1"), "{listed}");
    assert!(
        stderr_of(&bounded).contains("beyond --max-sessions 1 were counted, not listed"),
        "{}",
        stderr_of(&bounded)
    );
}

/// Rotated events files that logrotate compressed are read as they are; a gzip'd capture is
/// refused with what to do.
#[test]
fn gzipped_events_files_are_read_and_gzipped_captures_refused_clearly() {
    use std::io::Write as _;
    let gzip = |bytes: &[u8], path: &std::path::Path| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).expect("gzip");
        std::fs::write(path, enc.finish().expect("gzip")).expect("write");
    };
    let dir = tempfile::tempdir().expect("tmp");
    let events = events_file(dir.path(), "incident.pcap");
    let gz = dir.path().join("events.ndjson.1.gz");
    gzip(&std::fs::read(&events).expect("events"), &gz);
    let plain = ok_stdout(&run(&["sessions", &events]));
    let unzipped = ok_stdout(&run(&["sessions", gz.to_str().expect("utf-8")]));
    assert!(unzipped.contains("incident-s1"), "{unzipped}");
    assert_eq!(plain, unzipped);
    let capture = dir.path().join("incident.pcap.gz");
    gzip(
        &std::fs::read(fixture("incident.pcap")).expect("fixture"),
        &capture,
    );
    let refused = run(&["sessions", capture.to_str().expect("utf-8")]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr_of(&refused).contains("a gzip'd capture: decompress it first"),
        "{}",
        stderr_of(&refused)
    );
}

/// The worker path writes its events file anew, as `replay --events` does (it appended: a
/// second run doubled the file), and `--quiet` leaves its summary out.
#[test]
fn worker_replay_writes_a_new_events_file_and_keeps_quiet() {
    let dir = tempfile::tempdir().expect("tmp");
    let events = dir.path().join("e.ndjson");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/incident.pcap");
    let mut lines = Vec::new();
    for _ in 0..2 {
        let out = bin()
            .args(["replay", "--quiet", "--worker-threads", "1", "--events"])
            .arg(&events)
            .arg(fixture)
            .output()
            .expect("run");
        assert!(out.status.success(), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("mcptap summary"), "{stderr}");
        lines.push(
            std::fs::read_to_string(&events)
                .expect("events")
                .lines()
                .count(),
        );
    }
    assert!(lines[0] > 5, "{lines:?}");
    assert_eq!(lines[0], lines[1]);
}

/// A misspelt level (`warning`) is refused, not read as a target that silences every line.
#[test]
fn a_log_level_that_is_no_level_is_refused_in_one_line() {
    let out = run(&[
        "--log-level",
        "warning",
        "replay",
        &fixture("incident.pcap"),
        "--events",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--log-level") && err.contains("warning"),
        "{err}"
    );
    let mut config = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(config, "[log]\nlevel = \"verbose\"").expect("write");
    let path = config.path().to_string_lossy().into_owned();
    let out = run(&["check-config", &path]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("log.level"));
    let ok = run(&[
        "--log-level",
        "mcptap=debug,warn",
        "replay",
        &fixture("incident.pcap"),
        "--events",
        "/dev/null",
    ]);
    assert_eq!(ok.status.code(), Some(0));
}

/// With JSON logs every line on standard error is a JSON record, the summary and the
/// program's own errors included, so that a log pipeline parses all of them.
#[test]
fn json_logs_make_every_stderr_line_a_record() {
    let records = |out: &Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
            .collect()
    };
    for threads in ["1", "2"] {
        let out = run(&[
            "--log-format",
            "json",
            "replay",
            "--events",
            "/dev/null",
            "--threads",
            threads,
            &fixture("incident.pcap"),
        ]);
        assert!(out.status.success(), "{out:?}");
        let all = records(&out);
        let summary = all
            .iter()
            .find(|r| r["fields"]["message"] == "summary")
            .unwrap_or_else(|| panic!("no summary record: {all:?}"));
        assert_eq!(summary["level"], "INFO");
        assert_eq!(summary["target"], "mcptap");
        assert!(
            summary["fields"]["packets"].as_u64().unwrap_or(0) > 0,
            "{summary}"
        );
        assert_eq!(
            summary["fields"]["alerts"]["capability_narrowing"], 1,
            "{summary}"
        );
        assert!(summary["fields"]["elapsed_secs"].is_number(), "{summary}");
    }
    let out = run(&[
        "--log-format",
        "json",
        "replay",
        "/nonexistent/capture.pcap",
    ]);
    assert!(!out.status.success());
    let all = records(&out);
    assert!(
        all.iter().any(|r| r["level"] == "ERROR"
            && r["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("/nonexistent/capture.pcap"))),
        "{all:?}"
    );
}
