//! Fleet mode against a real `redis-server` (started here on a free loopback port): the
//! incident split across two gateway hosts' captures is found when the second is replayed
//! with the first one's state (`replay --fleet`, `--fleet-write`), and a store that is down
//! changes nothing but the log and the counters.

use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::Endpoint;

mod common;
use common::{Redis, free_port, start_redis};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway redis-server on 127.0.0.1, or `None` where it is not installed.
fn redis(dir: &Path) -> Option<(Redis, u16)> {
    let port = free_port();
    start_redis(&["127.0.0.1".to_string()], port, dir).map(|r| (r, port))
}

/// The incident split by connection: host A saw the healthy session up to the 502, host B the
/// reconnect with the narrowed re-initialize and JSON answers.
/// `servers`: the address of the MCP endpoint as each host's capture shows it.
fn split_incident(dir: &Path, servers: [[u8; 4]; 2]) -> (PathBuf, PathBuf) {
    let mut talk = Conversation::new("fleet-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized()
        .tools_call("one", Answer::Sse)
        .tools_call_bad_gateway();
    let first = talk.take_writes();
    talk.reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
        .initialized()
        .tools_call("two", Answer::Json)
        .delete();
    let second = talk.take_writes();
    let mut paths = Vec::new();
    for (n, (writes, server)) in [(first, servers[0]), (second, servers[1])]
        .into_iter()
        .enumerate()
    {
        let mut sim = Sim::new(40 + n as u64);
        let conn = sim.connect(
            Endpoint::new([127, 0, 0, 20], 41_000 + n as u16),
            // Each gateway host has its own address: the session is keyed by the server's
            // identity (Host + path), not by it.
            Endpoint::new(server, 8080),
            writes,
        );
        sim.run(vec![conn]);
        let path = dir.join(format!("host-{n}-{}.pcap", servers[1][3]));
        sim.write_pcap(&path).expect("pcap");
        paths.push(path);
    }
    (paths.remove(0), paths.remove(0))
}

fn replay(args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcptap"))
        .arg("replay")
        .args(args)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("ndjson"))
        .collect();
    (events, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn alerts(events: &[serde_json::Value]) -> Vec<String> {
    let mut kinds: Vec<String> = events
        .iter()
        .filter(|e| e["event"] == "alert")
        .map(|e| {
            format!(
                "{}:{}",
                e["session_id"].as_str().unwrap_or("-"),
                e["kind"].as_str().unwrap_or("?")
            )
        })
        .collect();
    kinds.sort();
    kinds
}

#[test]
fn a_second_hosts_capture_finds_the_incident_with_the_first_hosts_state() {
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let Some((_redis, port)) = redis(&dir) else {
        eprintln!("redis-server not installed: skipped (scripts/setup.sh --test installs it)");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    // One gateway host's two connections, merged, show the incident.
    let (one_a, one_b) = split_incident(&dir, [[127, 0, 0, 11], [127, 0, 0, 11]]);
    let merged = alerts(&replay(&[one_a.to_str().expect("path"), one_b.to_str().expect("path")]).0);
    // Two gateway hosts (their own addresses; the same Host header): each capture alone sees
    // nothing wrong.
    let (a, b) = split_incident(&dir, [[127, 0, 0, 11], [127, 0, 0, 12]]);
    let (a, b) = (a.to_str().expect("path"), b.to_str().expect("path"));
    assert!(alerts(&replay(&[a]).0).is_empty());
    assert!(alerts(&replay(&[b]).0).is_empty());
    assert_eq!(
        merged,
        [
            "fleet-s1:capability_narrowing",
            "fleet-s1:content_type_divergence"
        ]
    );

    // Host A's capture writes its state; host B's reads it.
    let (events, stderr) = replay(&["--fleet", &url, "--fleet-write", a]);
    assert!(alerts(&events).is_empty());
    assert!(stderr.contains(" 0 errors"), "{stderr}");
    let (events, stderr) = replay(&["--fleet", &url, b]);
    assert_eq!(alerts(&events), merged, "{stderr}");
    assert!(stderr.contains("(1 found)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_store_that_is_down_leaves_the_local_view() {
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-down-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (a, b) = split_incident(&dir, [[127, 0, 0, 11], [127, 0, 0, 11]]);
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let (events, stderr) = replay(&[
        "--fleet",
        &url,
        "--fleet-write",
        a.to_str().expect("path"),
        b.to_str().expect("path"),
    ]);
    // As without a store: the merged replay's own view finds the incident.
    assert_eq!(
        alerts(&events),
        [
            "fleet-s1:capability_narrowing",
            "fleet-s1:content_type_divergence"
        ]
    );
    assert!(stderr.contains("fleet store unreachable"), "{stderr}");
    assert_eq!(
        stderr.matches("fleet store unreachable").count(),
        1,
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// No load-balancer affinity: one session's exchanges alternate between two instances that
/// share the store. Updates are compare-and-set with a merge on conflict, and each alert is
/// published by the first instance to raise it: both alerts come out exactly once.
/// One connection's frames (its own client port), cut before the `POST`s numbered in `cuts`
/// (0-based), so that a kept-alive connection can carry exchanges in several steps.
fn connection_parts(
    n: u16,
    writes: Vec<mcptap_testkit::tcp::AppWrite>,
    cuts: &[usize],
) -> (u32, Vec<Vec<mcptap_testkit::capture::Frame>>) {
    let mut sim = Sim::new(60 + n as u64);
    let conn = sim.connect(
        Endpoint::new([127, 0, 0, 20], 42_000 + n),
        Endpoint::new([127, 0, 0, 11], 8080),
        writes,
    );
    sim.run(vec![conn]);
    let mut parts = vec![Vec::new()];
    let mut posts = 0;
    for f in sim.frames() {
        if f.data.windows(9).any(|w| w == b"POST /mcp") {
            if cuts.contains(&posts) {
                parts.push(Vec::new());
            }
            posts += 1;
        }
        if let Some(part) = parts.last_mut() {
            part.push(f.clone());
        }
    }
    (sim.linktype(), parts)
}

/// Plays `steps` through two instances sharing a real redis-server, step by step, each on
/// its instance (`(instance, linktype, frames)`), the store served after each: the alerts
/// as "instance:kind", and the conflicts and repeated alerts the store saw.
fn alternate(
    name: &str,
    steps: Vec<(usize, u32, Vec<mcptap_testkit::capture::Frame>)>,
) -> Option<(Vec<String>, u64, u64)> {
    use mcptap::fleet::{FleetSettings, FleetStore, serve};
    use mcptap_core::model::{Event, Output, Timestamp};
    use mcptap_core::pipeline::{Limits, Pipeline};
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let Some((_redis, port)) = redis(&dir) else {
        eprintln!("redis-server not installed: skipped");
        return None;
    };
    let settings = FleetSettings {
        url: Some(format!("redis://127.0.0.1:{port}/")),
        lookup_timeout_ms: 500,
        ..FleetSettings::default()
    };
    let mut instances: Vec<(Pipeline, FleetStore)> = (0..2)
        .map(|_| {
            let mut p = Pipeline::new(Limits::default());
            p.enable_fleet();
            (p, FleetStore::open(&settings, true).expect("store"))
        })
        .collect();
    let mut alerts = Vec::new();
    let mut ts = 0i64;
    for (host, linktype, frames) in steps {
        let (pipeline, store) = &mut instances[host];
        let mut out = Vec::new();
        for f in frames {
            ts = ts.max(f.ts_nanos) + 1_000;
            pipeline.handle_packet(Timestamp(ts), linktype, &f.data, &mut out);
        }
        serve(store, &mut out, pipeline, &mut |o| {
            if let Output::Event(Event::Alert(a)) = o {
                alerts.push(format!("{host}:{}", a.kind.as_str()));
            }
        });
    }
    let conflicts: u64 = instances.iter().map(|(_, s)| s.counts.conflicts).sum();
    let repeated: u64 = instances
        .iter()
        .map(|(_, s)| s.counts.alerts_deduplicated)
        .sum();
    alerts.sort();
    let _ = std::fs::remove_dir_all(&dir);
    Some((alerts, conflicts, repeated))
}

/// Each exchange on its own connection; connection n goes to instance n % 2. A session seen
/// again on another connection is read again, so each instance decides on the fleet's view.
#[test]
fn a_session_alternating_between_instances_alerts_once() {
    let mut talk = Conversation::new("alt-s1");
    let mut steps = Vec::new();
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse);
    steps.push(talk.take_writes());
    talk.initialized();
    steps.push(talk.take_writes());
    for _ in 0..2 {
        talk.tools_call("sse", Answer::Sse);
        steps.push(talk.take_writes());
    }
    talk.reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse);
    steps.push(talk.take_writes());
    for _ in 0..3 {
        talk.tools_call("json", Answer::Json);
        steps.push(talk.take_writes());
    }
    let steps = steps
        .into_iter()
        .enumerate()
        .map(|(n, writes)| {
            let (linktype, mut parts) = connection_parts(n as u16, writes, &[]);
            (n % 2, linktype, parts.remove(0))
        })
        .collect();
    let Some((alerts, _, _)) = alternate("alt", steps) else {
        return;
    };
    assert_eq!(
        alerts,
        ["0:capability_narrowing", "1:content_type_divergence"],
        "{alerts:?}"
    );
}

/// The session the two tests below move between hosts A and B, in four steps: A's handshake;
/// B's SSE answer and narrowing re-initialize; A's JSON answer; B's JSON answer (with the
/// session's DELETE when `delete`).
fn narrowing_in_four_steps(session: &str, delete: bool) -> [Vec<mcptap_testkit::tcp::AppWrite>; 4] {
    let mut talk = Conversation::new(session);
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized();
    let a1 = talk.take_writes();
    talk.tools_call("b-one", Answer::Sse)
        .reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
        .initialized();
    let b1 = talk.take_writes();
    talk.tools_call("a-two", Answer::Json);
    let a2 = talk.take_writes();
    talk.tools_call("b-three", Answer::Json);
    if delete {
        talk.delete();
    }
    let b2 = talk.take_writes();
    [a1, b1, a2, b2]
}

/// Each instance alone would see something else: A the first handshake and a JSON answer,
/// B an SSE answer, the re-initialize and a JSON answer. With the store, B raises the
/// narrowing (against A's handshake), A the divergence (against B's SSE answer, read again
/// on A's new connection), and B's JSON answer on its kept connection — a stale view that
/// meets A's newer version when it writes — is not raised again.
#[test]
fn each_alert_is_raised_where_the_fleets_view_first_shows_it() {
    let [a1, mut b_kept, a2, b2] = narrowing_in_four_steps("alt-s2", false);
    b_kept.extend(b2);
    let (linktype, mut a1) = connection_parts(1, a1, &[]);
    // B's connection: three POSTs now, the fourth after A's answer.
    let (_, mut b) = connection_parts(2, b_kept, &[3]);
    let (_, mut a2) = connection_parts(3, a2, &[]);
    let b_rest = b.remove(1);
    let steps = vec![
        (0, linktype, a1.remove(0)),
        (1, linktype, b.remove(0)),
        (0, linktype, a2.remove(0)),
        (1, linktype, b_rest),
    ];
    let Some((alerts, conflicts, repeated)) = alternate("where", steps) else {
        return;
    };
    assert_eq!(
        alerts,
        ["0:content_type_divergence", "1:capability_narrowing"],
        "{alerts:?}"
    );
    assert!(
        conflicts > 0,
        "B's stale view never met the store's newer version"
    );
    assert!(
        repeated > 0,
        "B's repeat of the divergence was not even tried"
    );
}

/// The same as a load balancer without affinity that moves the session at every connection:
/// each step on a new connection (each host reads the session again).
#[test]
fn each_alert_once_when_every_step_is_a_new_connection() {
    // The JSON answer and the DELETE in one go: the session ends in the call that raised
    // (and must claim) its divergence.
    let [a1, b1, a2, b2] = narrowing_in_four_steps("alt-s3", true);
    let mut steps = Vec::new();
    for (n, (host, writes)) in [(0, a1), (1, b1), (0, a2), (1, b2)].into_iter().enumerate() {
        let (linktype, mut parts) = connection_parts(10 + n as u16, writes, &[]);
        steps.push((host, linktype, parts.remove(0)));
    }
    let Some((alerts, _, _)) = alternate("fresh", steps) else {
        return;
    };
    assert_eq!(
        alerts,
        ["0:content_type_divergence", "1:capability_narrowing"],
        "{alerts:?}"
    );
}

/// The TLS redis-server of [`tls_and_a_password_file`], killed when dropped.
struct TlsRedis(std::process::Child);

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rediss://` with a private CA and a password from a file: the same forensics as above; the
/// password never reaches the output.
#[test]
fn tls_and_a_password_file() {
    if Command::new("openssl").arg("version").output().is_err()
        || Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("openssl or redis-server not installed: skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let d = |f: &str| dir.join(f).to_str().expect("path").to_string();
    let openssl = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl")
            .success();
        assert!(ok, "openssl {args:?}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &d("ca.key"),
        "-out",
        &d("ca.crt"),
        "-days",
        "2",
        "-subj",
        "/CN=mcptap-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &d("s.key"),
        "-out",
        &d("s.csr"),
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        d("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &d("s.csr"),
        "-CA",
        &d("ca.crt"),
        "-CAkey",
        &d("ca.key"),
        "-CAcreateserial",
        "-out",
        &d("s.crt"),
        "-days",
        "2",
        "-extfile",
        &d("ext.cnf"),
    ]);
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            &d("s.crt"),
            "--tls-key-file",
            &d("s.key"),
        ])
        .args([
            "--tls-ca-cert-file",
            &d("ca.crt"),
            "--tls-auth-clients",
            "no",
        ])
        .args([
            "--requirepass",
            "fixture-secret-pass",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--dir", &d("")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    let _redis = TlsRedis(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server (TLS) did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(d("pass"), "fixture-secret-pass\n").expect("pass");
    std::fs::write(d("wrong"), "not-the-password\n").expect("pass");
    let url = format!("rediss://127.0.0.1:{port}/");
    let (a, b) = split_incident(&dir, [[127, 0, 0, 11], [127, 0, 0, 12]]);
    let (a, b) = (a.to_str().expect("path"), b.to_str().expect("path"));
    let tls = ["--fleet-tls-ca-file", &d("ca.crt")];
    let (events, stderr) = replay(
        &[
            &[
                "--fleet",
                &url,
                "--fleet-write",
                "--fleet-password-file",
                &d("pass"),
            ][..],
            &tls,
            &[a],
        ]
        .concat(),
    );
    assert!(alerts(&events).is_empty());
    assert!(stderr.contains(" 0 errors"), "{stderr}");
    let (events, stderr) = replay(
        &[
            &["--fleet", &url, "--fleet-password-file", &d("pass")][..],
            &tls,
            &[b],
        ]
        .concat(),
    );
    assert_eq!(
        alerts(&events),
        [
            "fleet-s1:capability_narrowing",
            "fleet-s1:content_type_divergence"
        ],
        "{stderr}"
    );
    // A wrong password is an outage like any other: the local view, warned once.
    let (events, stderr) = replay(
        &[
            &["--fleet", &url, "--fleet-password-file", &d("wrong")][..],
            &tls,
            &[b],
        ]
        .concat(),
    );
    assert!(alerts(&events).is_empty());
    assert!(stderr.contains("fleet store unreachable"), "{stderr}");
    assert!(!stderr.contains("fixture-secret-pass") && !stderr.contains("not-the-password"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--redact client_ip --redact client_info`: client addresses and clientInfo are emitted and
/// stored as keyed hashes, the same on every replay with the key; detection is unchanged.
#[test]
fn redaction_hides_clients_in_events_and_in_the_store() {
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-redact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key = dir.join("redact.key");
    std::fs::write(&key, "a redaction key of the fleet, 32+").expect("key");
    let key = key.to_str().expect("path");
    let (a, b) = split_incident(&dir, [[127, 0, 0, 11], [127, 0, 0, 11]]);
    let (a, b) = (a.to_str().expect("path"), b.to_str().expect("path"));
    let redact = [
        "--redact",
        "client_ip",
        "--redact",
        "client_info",
        "--redact-key-file",
        key,
    ];
    let (plain, _) = replay(&[a, b]);
    let (events, _) = replay(&[&redact[..], &[a, b]].concat());
    assert_eq!(alerts(&events), alerts(&plain));
    assert!(!alerts(&events).is_empty());
    for e in &events {
        if let Some(c) = e["client"].as_str() {
            assert!(c.starts_with("[fd6d:6370:"), "{e}");
        }
        if e["event"] == "handshake" {
            assert!(e["client_info"]["redacted"].is_string(), "{e}");
        }
    }
    let (again, _) = replay(&[&redact[..], &[a, b]].concat());
    assert_eq!(events, again, "pseudonyms are stable under one key");
    let lineage = |evs: &[serde_json::Value]| {
        evs.iter()
            .find_map(|e| e["lineage_id"].as_str().map(str::to_string))
    };
    assert_ne!(lineage(&events), lineage(&plain), "lineage ids are keyed");
    // The store keeps the redacted address only.
    if let Some((_redis, port)) = redis(&dir) {
        let url = format!("redis://127.0.0.1:{port}/");
        replay(&[&["--fleet", &url, "--fleet-write"][..], &redact[..], &[a]].concat());
        let out = Command::new("redis-cli")
            .args([
                "-p",
                &port.to_string(),
                "--scan",
                "--pattern",
                "mcptap:session:*",
            ])
            .output()
            .expect("redis-cli");
        let keys = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut records = 0;
        for k in keys.lines().filter(|k| !k.ends_with(":v")) {
            let v = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "GET", k])
                .output()
                .expect("redis-cli");
            let text = String::from_utf8_lossy(&v.stdout).into_owned();
            assert!(
                text.contains("fd6d:6370:") && !text.contains("127.0.0.20"),
                "{text}"
            );
            records += 1;
        }
        assert!(records > 0, "{keys}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Host A's and host B's writes of one client as two captures (each host its own address,
/// the same Host header; the client the same address, as a load balancer's
/// `X-Forwarded-For` or PROXY header would name it).
/// `servers`: the last octet of the MCP endpoint's address as each capture shows it.
fn split_writes(
    dir: &Path,
    name: &str,
    writes: &[Vec<mcptap_testkit::tcp::AppWrite>; 2],
    servers: [u8; 2],
) -> (PathBuf, PathBuf) {
    let mut paths = Vec::new();
    for (n, writes) in writes.iter().enumerate() {
        let mut sim = Sim::new(60 + n as u64);
        // Host B's part comes a second after host A's.
        sim.advance(n as i64 * 1_000_000_000);
        let conn = sim.connect(
            Endpoint::new([127, 0, 0, 20], 42_000 + n as u16),
            Endpoint::new([127, 0, 0, servers[n]], 8080),
            writes.clone(),
        );
        sim.run(vec![conn]);
        let path = dir.join(format!("{name}-host-{n}-{}.pcap", servers[1]));
        sim.write_pcap(&path).expect("pcap");
        paths.push(path);
    }
    (paths.remove(0), paths.remove(0))
}

/// What a person reads off a replay: alerts (by session or lineage) and handshakes'
/// predecessors.
fn findings(events: &[serde_json::Value]) -> Vec<String> {
    let mut found: Vec<String> = events
        .iter()
        .filter_map(|e| match e["event"].as_str() {
            Some("alert") => Some(format!(
                "alert {} {}",
                e["session_id"]
                    .as_str()
                    .or(e["lineage_id"].as_str().map(|_| "(lineage)"))
                    .unwrap_or("-"),
                e["kind"].as_str().unwrap_or("?")
            )),
            Some("handshake") if !e["predecessor_session_id"].is_null() => Some(format!(
                "handshake {} after {}",
                e["session_id"].as_str().unwrap_or("-"),
                e["predecessor_session_id"].as_str().unwrap_or("?")
            )),
            _ => None,
        })
        .collect();
    found.sort();
    found
}

/// Sessionless state crosses hosts too: a modern client's first declarations, a stateless
/// server's response modes per endpoint, and an ended session as the predecessor of the
/// client's next one. For each, host B's replay with host A's state finds what a merged
/// replay finds, and neither capture alone finds it.
#[test]
fn lineages_and_stateless_endpoints_cross_hosts() {
    use mcptap_testkit::mcp::{initialize_request, initialize_result, modern, tools_call_request};
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-lineage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let Some((_redis, port)) = redis(&dir) else {
        eprintln!("redis-server not installed: skipped (scripts/setup.sh --test installs it)");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");

    // A modern client declares its full set on host A, then a narrowed one (twice) on B.
    let modern_writes = |caps: &str, first_id: u64| {
        let mut talk = Conversation::new("unused");
        for id in first_id..first_id + 2 {
            let body = modern::request(
                id,
                "tools/call",
                r#""name":"search_docs","arguments":{}"#,
                caps,
                "agent",
                "1.0",
            );
            talk.exchange(
                modern::post(&body, "tools/call", Some("search_docs"), ""),
                modern::answer(false, &modern::tool_result(id)),
            );
        }
        talk.take_writes()
    };
    // A stateless legacy server: SSE answers on host A, JSON on B.
    let stateless = |answers: &[bool], first_id: u64, init: bool| {
        let mut talk = Conversation::new("unused");
        let client = mcptap_testkit::mcp::Client {
            host: "mcp.internal:8080",
            name: "testkit-client",
            version: "0.1.0",
        };
        if init {
            let body = initialize_request(first_id, FULL_CLIENT_CAPS, "testkit-client", "0.1.0");
            let result = initialize_result(first_id, r#"{"streaming":true}"#, "stateless");
            talk.exchange(client.post(&body, None), modern::answer(false, &result));
        }
        for (n, sse) in answers.iter().enumerate() {
            let id = first_id + 1 + n as u64;
            let body = tools_call_request(id, "search_docs", r#"{"query":"status"}"#);
            let result = mcptap_testkit::mcp::tool_result(id, "ok");
            talk.exchange(client.post(&body, None), modern::answer(*sse, &result));
        }
        talk.take_writes()
    };
    // A session deleted on host A; the client's next session starts on B, narrowed.
    let mut first = Conversation::new("gone-s1");
    first
        .initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized()
        .tools_call("one", Answer::Sse)
        .delete();
    let mut next = Conversation::new("next-s2");
    next.initialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Json)
        .initialized();

    let cases = [
        (
            "modern",
            "alert (lineage) client_capability_narrowing",
            [
                modern_writes(modern::FULL_CAPS, 1),
                modern_writes(modern::RESET_CAPS, 10),
            ],
        ),
        (
            "stateless",
            "alert (lineage) content_type_divergence",
            [
                stateless(&[true, true], 1, true),
                stateless(&[false], 20, false),
            ],
        ),
        (
            "predecessor",
            "handshake next-s2 after gone-s1",
            [first.take_writes(), next.take_writes()],
        ),
    ];
    for (name, expected, writes) in &cases {
        // One gateway host's two connections, merged, show it; two hosts' captures (their
        // own addresses, the same Host header) need the store.
        let (one_a, one_b) = split_writes(&dir, name, writes, [31, 31]);
        let merged =
            findings(&replay(&[one_a.to_str().expect("path"), one_b.to_str().expect("path")]).0);
        assert_eq!(merged, [*expected], "{name}: the merged replay finds it");
        let (a, b) = split_writes(&dir, name, writes, [31, 32]);
        let (a, b) = (a.to_str().expect("path"), b.to_str().expect("path"));
        assert!(findings(&replay(&[b]).0).is_empty(), "{name}: B alone");
        let key_prefix = format!("t-{name}:");
        let (events, stderr) = replay(&[
            "--fleet",
            &url,
            "--fleet-key-prefix",
            &key_prefix,
            "--fleet-write",
            a,
        ]);
        assert!(
            findings(&events).iter().all(|f| !merged.contains(f)),
            "{name}: A alone finds nothing of it: {:?}",
            findings(&events)
        );
        assert!(stderr.contains(" 0 errors"), "{name}: {stderr}");
        let (events, stderr) = replay(&["--fleet", &url, "--fleet-key-prefix", &key_prefix, b]);
        assert_eq!(findings(&events), merged, "{name}: {stderr}");
        assert!(!stderr.contains("(0 found)"), "{name}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The captured incident (one host, the session's two connections one after the other) with
/// a store, up and down: the first connection's requests wait behind its `initialize`'s
/// lineage lookup, the second's behind the session's own; released, the first ones must stay
/// ahead, or the session's answers are reviewed out of order and the divergence is missed.
#[test]
fn the_captured_incident_alerts_the_same_with_a_store() {
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-fixture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/incident.pcap");
    let want = [
        "incident-s1:capability_narrowing",
        "incident-s1:content_type_divergence",
    ];
    assert_eq!(alerts(&replay(&[fixture]).0), want);
    let down = format!("redis://127.0.0.1:{}/", free_port());
    let (events, stderr) = replay(&["--fleet", &down, fixture]);
    assert_eq!(alerts(&events), want, "store down: {stderr}");
    let Some((_redis, port)) = redis(&dir) else {
        eprintln!("redis-server not installed: skipped (scripts/setup.sh --test installs it)");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let (events, stderr) = replay(&["--fleet", &url, "--fleet-write", fixture]);
    assert_eq!(alerts(&events), want, "store up: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fleet instance on the store at `port`: its pipeline, and its store (writing).
fn instance(port: u16) -> (mcptap_core::pipeline::Pipeline, mcptap::fleet::FleetStore) {
    instance_waiting(port, 2_000)
}

/// [`instance`], its lookups timing out after `timeout_ms`.
fn instance_waiting(
    port: u16,
    timeout_ms: u64,
) -> (mcptap_core::pipeline::Pipeline, mcptap::fleet::FleetStore) {
    use mcptap::fleet::{FleetSettings, FleetStore};
    use mcptap_core::pipeline::{Limits, Pipeline};
    let settings = FleetSettings {
        url: Some(format!("redis://127.0.0.1:{port}/")),
        lookup_timeout_ms: timeout_ms,
        ..FleetSettings::default()
    };
    let mut p = Pipeline::new(Limits::default());
    p.enable_fleet();
    (p, FleetStore::open(&settings, true).expect("store"))
}

/// Plays `parts` of connections on `instance`, then serves its store once: what came out.
fn play(
    instance: &mut (mcptap_core::pipeline::Pipeline, mcptap::fleet::FleetStore),
    parts: Vec<(u32, Vec<mcptap_testkit::capture::Frame>)>,
    ts: &mut i64,
) -> Vec<mcptap_core::model::Output> {
    use mcptap_core::model::Timestamp;
    let (pipeline, store) = instance;
    let mut out = Vec::new();
    for (linktype, frames) in parts {
        for f in frames {
            *ts = (*ts).max(f.ts_nanos) + 1_000;
            pipeline.handle_packet(Timestamp(*ts), linktype, &f.data, &mut out);
        }
    }
    let mut seen = Vec::new();
    mcptap::fleet::serve(store, &mut out, pipeline, &mut |o| seen.push(o.clone()));
    seen
}

/// `redis-cli -p port args...`, with `stdin` as the last argument (`-x`) if given.
fn redis_cli(port: u16, args: &[&str], stdin: Option<&[u8]>) -> Vec<u8> {
    use std::io::Write;
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &port.to_string()]);
    if stdin.is_some() {
        cmd.arg("-x");
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli");
    if let Some(bytes) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(bytes)
            .expect("write");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("redis-cli").stdout
}

/// The store key of session `sid`.
fn session_store_key(port: u16, sid: &str) -> String {
    let pattern = format!("mcptap:session:*:{sid}");
    let keys = redis_cli(port, &["--scan", "--pattern", &pattern], None);
    let key = String::from_utf8_lossy(&keys).trim().to_string();
    assert!(!key.is_empty() && !key.contains('\n'), "{key:?}");
    key
}

/// A host with the store's password (or a compromised gateway host) leaves what it likes
/// under the key prefix. A record far larger than any record (a valid one, padded), bytes
/// that are not text, and a key of another type are each counted as garbage — never read
/// whole, never an outage — and a good record looked up in the same batch is still found.
#[test]
fn tampered_records_are_garbage_never_read_whole_nor_an_outage() {
    use mcptap_core::model::{Output, Telemetry};
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-tamper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let Some((_redis, port)) = redis(&dir) else {
        eprintln!("redis-server not installed: skipped");
        return;
    };
    // Host B waits 150 ms for a lookup (the default is 50): room for a loaded machine, none
    // for a store that copies a huge value before it answers.
    let (mut a, mut b) = (instance(port), instance_waiting(port, 150));
    let empty = b.0.usage().session_bytes();
    let mut ts = 0;
    let names = ["huge", "binary", "hash", "version", "good"];
    let mut comebacks = Vec::new();
    for (n, name) in names.iter().enumerate() {
        let mut talk = Conversation::new(&format!("tamper-{name}"));
        talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
            .initialized();
        let (linktype, mut parts) = connection_parts(100 + n as u16, talk.take_writes(), &[]);
        play(&mut a, vec![(linktype, parts.remove(0))], &mut ts);
        talk.tools_call("again", Answer::Sse);
        let (linktype, mut parts) = connection_parts(200 + n as u16, talk.take_writes(), &[]);
        comebacks.push((linktype, parts.remove(0)));
    }
    let huge = session_store_key(port, "tamper-huge");
    let mut record = redis_cli(port, &["GET", &huge], None);
    // A valid record whose protocol version is 64 MiB long: a GET of it takes Redis about half
    // a second, past host B's lookup timeout (below), so it must never be read.
    let field = b"\"protocol_version\":\"";
    let at = record
        .windows(field.len())
        .position(|w| w == field)
        .expect("protocol_version")
        + field.len();
    record.splice(at..at, std::iter::repeat_n(b'9', 64 << 20));
    redis_cli(port, &["SET", &huge], Some(&record));
    let binary = session_store_key(port, "tamper-binary");
    redis_cli(port, &["SET", &binary], Some(b"{\"\xff\xfe\"}"));
    let hash = session_store_key(port, "tamper-hash");
    redis_cli(port, &["DEL", &hash], None);
    redis_cli(port, &["HSET", &hash, "f", "v"], None);
    // A version key of another type: the next write goes over it.
    let version = format!("{}:v", session_store_key(port, "tamper-version"));
    redis_cli(port, &["DEL", &version], None);
    redis_cli(port, &["HSET", &version, "f", "v"], None);

    // Host B sees all five come back: one batch of lookups, then one of writes.
    let out = play(&mut b, comebacks, &mut ts);
    let count = |t: &Telemetry| {
        out.iter()
            .filter(|o| matches!(o, Output::Telemetry(x) if x == t))
            .count()
    };
    // Garbage at the lookup, and again when this host's write of the session (on its local
    // view) meets the stored version and the record is read for the merge.
    assert_eq!(count(&Telemetry::FleetGarbage), 3 + 3, "{out:?}");
    assert_eq!(count(&Telemetry::FleetState { found: true }), 2);
    let store = &b.1;
    assert!(store.is_up());
    let c = store.counts;
    assert_eq!(
        (c.errors, c.unreadable, c.found, c.conflicts),
        (0, 3 + 3, 2, 3)
    );
    let written = redis_cli(port, &["TYPE", &version], None);
    assert_eq!(String::from_utf8_lossy(&written).trim(), "string");
    // The padded record was not taken in: the session table holds nothing like it.
    let held = b.0.usage().session_bytes() - empty;
    assert!(held < 1 << 20, "{held}");
    let _ = std::fs::remove_dir_all(&dir);
}
