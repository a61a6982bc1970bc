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

/// A corrupt record length mid-file (issue 11): the file is read on from the next plausible
/// record, exit 0, a warning names the file and both byte offsets, the summary counts the
/// skipped bytes; through a pipe the same. A bogus record spliced between two real ones is
/// all that is skipped, so the events are the intact file's.
#[test]
fn corrupt_record_length_mid_file_is_resynchronised() {
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
