//! The NDJSON of every fixture, byte for byte, against tests/golden/NAME.ndjson: recorded before
//! the core was reshaped into a library, so any change of output is seen. Regenerate only for
//! an intended change of the event contract:
//! `for f in tests/fixtures/*.pcap; do mcptap replay $f > tests/golden/$(basename $f).ndjson; done`

use std::path::Path;
use std::process::Command;

#[test]
fn every_fixture_replays_to_its_golden_ndjson() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut compared = 0;
    let mut entries: Vec<_> = std::fs::read_dir(root.join("tests/fixtures"))
        .expect("tests/fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    entries.sort();
    for capture in entries {
        let name = capture
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let golden = root.join("tests/golden").join(format!("{name}.ndjson"));
        let want = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (every fixture has a golden file)",
                golden.display()
            )
        });
        // One thread, the flow and session layers on two, the session layer in three shards
        // by client, the flow layer in one shard of its own and then (five threads' default)
        // in two by connection with two session shards: the same bytes.
        for threads in [
            &["1"][..],
            &["2"],
            &["4"],
            &["3", "--flow-threads", "1"],
            &["5"],
        ] {
            compare(&name, &capture, &golden, &want, threads);
        }
        compared += 1;
    }
    assert!(compared >= 14, "compared {compared} fixtures");
}

fn compare(name: &str, capture: &Path, golden: &Path, want: &str, threads: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcptap"))
        .args(["replay", "--threads"])
        .args(threads)
        .arg(capture)
        .output()
        .expect("run mcptap replay");
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).expect("UTF-8 NDJSON");
    if got != want {
        let line = got
            .lines()
            .zip(want.lines())
            .position(|(g, w)| g != w)
            .unwrap_or_else(|| got.lines().count().min(want.lines().count()));
        panic!(
            "{name} (--threads {}): output differs from {} at line {}:\n got: {}\nwant: {}",
            threads.join(" "),
            golden.display(),
            line + 1,
            got.lines().nth(line).unwrap_or("<end>"),
            want.lines().nth(line).unwrap_or("<end>")
        );
    }
}

/// Under `--threads 2` the session thread redacts and renders the events; the bytes are one
/// thread's, and redacted (no client address or clientInfo in the clear).
#[test]
fn redacted_replays_write_the_same_bytes_on_every_thread_count() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tmp");
    let key = dir.path().join("redact.key");
    std::fs::write(&key, "a redaction key for the golden test").expect("key");
    for fixture in ["mixed_era.pcap", "forwarded_client.pcap", "incident.pcap"] {
        let replay = |threads: &str| {
            let out = Command::new(env!("CARGO_BIN_EXE_mcptap"))
                .args(["replay", "--threads", threads, "--redact", "client_ip"])
                .args(["--redact", "client_info", "--redact-key-file"])
                .arg(&key)
                .arg(root.join("tests/fixtures").join(fixture))
                .output()
                .expect("run mcptap replay");
            assert!(out.status.success(), "{fixture}: {out:?}");
            String::from_utf8(out.stdout).expect("UTF-8 NDJSON")
        };
        let one = replay("1");
        let handshakes = one.matches(r#""event":"handshake""#).count();
        assert!(handshakes >= 2, "{fixture}: {handshakes} handshakes");
        assert!(one.contains(r#""redacted""#), "{fixture}: {one}");
        assert!(!one.contains(r#""client":"127."#), "{fixture}: {one}");
        for threads in ["2", "4", "5"] {
            assert_eq!(replay(threads), one, "{fixture}: --threads {threads}");
        }
    }
}

/// Under `--threads 2` the session thread also renders the handshake log lines while it keeps
/// up, and the calling thread writes them: standard error has the same lines as with one
/// thread, in the same order among the others (alerts, and at DEBUG each exchange and session
/// end), in both formats and redacted alike, with the flow layer on the calling thread or in a
/// shard of its own. Only each line's wall-clock stamp differs.
#[test]
fn log_lines_are_the_same_on_every_thread_count() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tmp");
    let key = dir.path().join("redact.key");
    std::fs::write(&key, "a redaction key for the log test").expect("key");
    // The wall-clock stamp: text lines start with it, JSON lines carry it first.
    let unstamped = |stderr: &[u8], format: &str| -> Vec<String> {
        String::from_utf8_lossy(stderr)
            .lines()
            .map(|l| match (format, l.split_once(' ')) {
                ("text", Some((stamp, rest))) if stamp.ends_with('Z') => rest.to_string(),
                ("json", _) if l.starts_with("{\"timestamp\":\"") => {
                    l.get(42..).unwrap_or(l).to_string()
                }
                _ => l.to_string(),
            })
            .collect()
    };
    let runs = [
        ("incident.pcap", "info"),
        ("mixed_era.pcap", "info"),
        ("reinit_rejected.pcap", "debug"),
    ];
    for (fixture, level) in runs {
        for format in ["text", "json"] {
            for redact in [false, true] {
                let replay = |threads: &[&str]| {
                    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcptap"));
                    cmd.args(["--log-format", format, "--log-level", level])
                        .args(["replay", "-q", "--events", "/dev/null", "--threads"])
                        .args(threads);
                    if redact {
                        cmd.args(["--redact", "client_ip", "--redact", "client_info"])
                            .arg("--redact-key-file")
                            .arg(&key);
                    }
                    let out = cmd
                        .arg(root.join("tests/fixtures").join(fixture))
                        .output()
                        .expect("run mcptap replay");
                    assert!(out.status.success(), "{fixture}: {out:?}");
                    unstamped(&out.stderr, format)
                };
                let one = replay(&["1"]);
                let handshakes = one.iter().filter(|l| l.contains("handshake")).count();
                assert!(handshakes >= 2, "{fixture} {format}: {one:?}");
                if level == "debug" {
                    // Handshakes come between other lines: their order is tested too.
                    let last_handshake = one.iter().rposition(|l| l.contains("INFO"));
                    let first_other = one.iter().position(|l| l.contains("DEBUG"));
                    assert!(first_other < last_handshake, "{fixture} {format}: {one:?}");
                }
                if redact {
                    assert!(
                        !one.iter()
                            .any(|l| l.contains("client=127.") || l.contains("\"client\":\"127.")),
                        "{fixture} {format}: {one:?}"
                    );
                }
                for threads in [&["2"][..], &["3", "--flow-threads", "1"], &["4"]] {
                    assert_eq!(
                        replay(threads),
                        one,
                        "{fixture} {format} redacted {redact}: --threads {}",
                        threads.join(" ")
                    );
                }
            }
        }
    }
}
