//! `mcptap run` and `mcptap check-config` as an operator meets them: one clear line per error,
//! a clean stop on SIGTERM. Tests that need to open a capture run only as root (CI is root).

mod common;
use common::free_port;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcptap"))
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run mcptap")
}

fn one_error_line(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("mcptap: error: "), "{stderr}");
    stderr
}

#[test]
fn no_such_interface() {
    let e = one_error_line(&run(&["run", "-i", "nosuch0"]));
    assert!(e.contains("no such interface: nosuch0"), "{e}");
    assert!(e.contains("available:"), "{e}");
}

#[test]
fn no_interface_at_all() {
    let e = one_error_line(&run(&["run"]));
    assert!(e.contains("--interface"), "{e}");
}

#[test]
fn bad_config_names_file_and_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("mcptap.toml");
    std::fs::write(
        &p,
        "[capture]\ninterfaces = [\"lo\"]\nbuffer_bytes = \"lots\"\n",
    )
    .expect("write");
    let path = p.to_str().expect("utf8");
    let e = one_error_line(&run(&["run", "--config", path]));
    assert!(e.contains(path) && e.contains("line 3"), "{e}");
    let e = one_error_line(&run(&["check-config", path]));
    assert!(e.contains("line 3"), "{e}");
}

/// Settings that used to pass `check-config` and then blinded or crashed `run`.
#[test]
fn absurd_settings_are_refused_before_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("mcptap.toml");
    let path = p.to_str().expect("utf8");
    let cases = [
        ("[capture]\nthreads = 100000\n", "capture.threads"),
        ("[capture]\nflow_threads = 5000\n", "capture.flow_threads"),
        (
            "[capture]\nthreads = 64\nflow_threads = 64\n",
            "capture.flow_threads",
        ),
        (
            "[capture]\nsession_threads = 0\n",
            "capture.session_threads",
        ),
        (
            "[metrics]\nmax_connections = 0\n",
            "metrics.max_connections",
        ),
        (
            "[metrics]\nheader_timeout_secs = 0\n",
            "metrics.header_timeout_secs",
        ),
        (
            "[limits]\nmax_flows = 0\nmax_sessions = 0\nmemory_budget_bytes = 0\n",
            "limits.max_flows",
        ),
        (
            "[limits]\nmax_message_bytes = 0\n",
            "limits.max_message_bytes",
        ),
        (
            "[limits]\nsession_idle_timeout_secs = 0\n",
            "limits.session_idle_timeout_secs",
        ),
    ];
    for (text, key) in cases {
        std::fs::write(&p, text).expect("write");
        let e = one_error_line(&run(&["check-config", path]));
        assert!(e.contains(path) && e.contains(key), "{text}: {e}");
        let e = one_error_line(&run(&["run", "--config", path, "-i", "lo"]));
        assert!(e.contains(key), "{text}: {e}");
    }
    let e = one_error_line(&run(&["run", "-i", "lo", "--threads", "100000"]));
    assert!(e.contains("capture.threads"), "{e}");
    let fixture = format!(
        "{}/tests/fixtures/incident.pcap",
        env!("CARGO_MANIFEST_DIR")
    );
    let e = one_error_line(&run(&["replay", "--max-head-bytes", "0", &fixture]));
    assert!(e.contains("limits.max_head_bytes"), "{e}");
    let e = one_error_line(&run(&["replay", "--worker-threads", "100000", &fixture]));
    assert!(e.contains("--worker-threads must be at most 1024"), "{e}");
    let e = one_error_line(&run(&[
        "replay",
        "--worker-threads",
        "2",
        "--worker-flow-threads",
        "100000",
        &fixture,
    ]));
    assert!(e.contains("--worker-flow-threads"), "{e}");
}

/// Seconds beyond i64 nanoseconds saturate: the lineage window stays on (it used to wrap
/// negative through `as i64` and turn lineage off).
#[test]
fn huge_seconds_saturate_in_the_effective_configuration() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("mcptap.toml");
    std::fs::write(&p, "[limits]\nlineage_window_secs = 18446744073709551615\n").expect("write");
    let out = run(&["check-config", p.to_str().expect("utf8")]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("lineage_window_secs = 9223372037\n"),
        "{text}"
    );
}

#[test]
fn check_config_prints_the_effective_configuration() {
    let example = format!("{}/mcptap.example.toml", env!("CARGO_MANIFEST_DIR"));
    let out = run(&["check-config", &example]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("listen = \"127.0.0.1:9917\""), "{text}");
    assert!(text.contains("[limits]"), "{text}");
}

#[test]
fn bad_filter_is_reported() {
    if !is_root() {
        return;
    }
    let port = free_port().to_string();
    let e = one_error_line(&run(&[
        "run",
        "-i",
        "lo",
        "-f",
        "tcp port",
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]));
    assert!(e.contains("bad capture filter"), "{e}");
}

#[test]
fn listen_address_in_use_is_reported() {
    if !is_root() {
        return;
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr").to_string();
    let e = one_error_line(&run(&["run", "-i", "lo", "--listen", &addr]));
    assert!(
        e.contains("address already in use") && e.contains(&addr),
        "{e}"
    );
}

#[test]
fn missing_capabilities_are_named() {
    // As root, drop to `nobody` to see what an unprivileged operator sees.
    let dir = tempfile::tempdir().expect("tmp");
    let copy = dir.path().join("mcptap");
    std::fs::copy(env!("CARGO_BIN_EXE_mcptap"), &copy).expect("copy");
    for p in [dir.path(), copy.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let mut cmd = if is_root() {
        if Command::new("runuser").arg("--help").output().is_err() {
            return;
        }
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(&copy);
        c
    } else {
        Command::new(&copy)
    };
    let port = free_port().to_string();
    let out = cmd
        .args(["run", "-i", "lo", "--listen", &format!("127.0.0.1:{port}")])
        .output()
        .expect("run");
    let e = one_error_line(&out);
    assert!(
        e.contains("CAP_NET_RAW") && e.contains("CAP_NET_ADMIN"),
        "{e}"
    );
}

#[test]
fn sigterm_stops_cleanly_and_serves_health_until_then() {
    if !is_root() {
        return;
    }
    let port = free_port();
    let mut child = bin()
        .args([
            "run",
            "-i",
            "lo",
            "-f",
            "tcp port 1",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ready = false;
    while Instant::now() < deadline && !ready {
        std::thread::sleep(Duration::from_millis(100));
        ready = http_get(port, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"));
    }
    assert!(ready, "never became ready");
    let metrics = http_get(port, "/metrics").expect("metrics");
    assert!(metrics.contains("mcptap_build_info"), "{metrics}");
    assert!(http_get(port, "/healthz").is_some_and(|r| r.starts_with("HTTP/1.1 200")));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("kill");
    let stopped_by = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(Instant::now() < stopped_by, "did not stop within 3 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    assert!(String::from_utf8_lossy(&out.stderr).contains("mcptap summary"));
}

/// Waits up to 10 s for the daemon listening on `port` to say it is ready.
fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline
        && !http_get(port, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn http_get(port: u16, path: &str) -> Option<String> {
    http_get_at(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path)
}

fn http_get_at(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    Some(buf)
}

/// The daemon's worker path (several pipelines sharded by server endpoint, with shared
/// limits) gives every fixture the events one pipeline gives, whatever the worker count.
#[test]
fn worker_path_gives_the_events_of_one_pipeline() {
    use mcptap_core::model::Output;
    use mcptap_core::pipeline::Limits;
    let dir = tempfile::tempdir().expect("tmp");
    let fixtures = format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&fixtures)
        .expect("fixtures")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    names.sort();
    assert!(names.len() > 10);
    for name in names {
        let path = format!("{fixtures}/{name}");
        let (outputs, _) =
            mcptap::replay::replay_collect(std::slice::from_ref(&path), Limits::default())
                .expect("replay");
        let mut want: Vec<String> = outputs
            .iter()
            .filter_map(|o| match o {
                Output::Event(e) => Some(serde_json::to_string(e).expect("json")),
                Output::Telemetry(_) | Output::Shared(_) => None,
            })
            .collect();
        want.sort();
        for threads in [1, 2, 4] {
            let got = common::events_of_workers(&path, threads, &[], dir.path());
            assert_eq!(got, want, "{name} with {threads} workers");
        }
    }
}

/// Live equals replay with two workers when the server's port is above its clients' (issue 11:
/// the incident with the server on a high port and clients on 1024 gave 0 alerts with
/// `--threads 2`). Real connections on lo: 127.0.0.2:<high> serves, 127.0.0.3:<low> connects.
/// Again with each worker's flow layer sharded over two threads more (`--flow-threads 2`), and
/// its session layer over two threads by client too (`--session-threads 2`).
#[test]
fn live_two_workers_see_the_incident_on_a_high_server_port() {
    if !is_root() {
        return;
    }
    incident_on_a_high_server_port(&[]);
    incident_on_a_high_server_port(&["--flow-threads", "2"]);
    incident_on_a_high_server_port(&["--flow-threads", "2", "--session-threads", "2"]);
}

fn incident_on_a_high_server_port(extra: &[&str]) {
    use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
    let server = std::net::TcpListener::bind("127.0.0.2:0").expect("bind server");
    let server_port = server.local_addr().expect("addr").port();
    if server_port < 10_000 {
        return;
    }
    let port = free_port();
    let child = bin()
        .args([
            "run",
            "-i",
            "lo",
            "-f",
            &format!("tcp and host 127.0.0.2 and port {server_port}"),
            "--threads",
            "2",
            "--events-stdout",
            "--stats-interval",
            "1",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    wait_ready(port);
    let mut talk = Conversation::new("live-s1");
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Client ports below the server's; the first free pair from 1024 up.
    let mut client_port = 1024u16;
    for writes in [first, second] {
        let client = loop {
            let sock = tokio::net::TcpSocket::new_v4().expect("socket");
            let bound = sock.bind(std::net::SocketAddr::from(([127, 0, 0, 3], client_port)));
            client_port += 1;
            if bound.is_ok() {
                let to = std::net::SocketAddr::from(([127, 0, 0, 2], server_port));
                break rt.block_on(sock.connect(to)).expect("connect");
            }
        };
        let mut client = client.into_std().expect("std stream");
        client.set_nonblocking(false).expect("blocking");
        let (mut srv, _) = server.accept().expect("accept");
        pump_writes(&mut client, &mut srv, writes);
        drop(srv);
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    // The workers' queues and lag: both workers have a queue gauge (drained by now), the
    // capture never had to wait, and every batch's lag was observed.
    let metrics = http_get(port, "/metrics").expect("metrics");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    for w in ["0", "1"] {
        assert_eq!(
            value(&format!("mcptap_worker_queue_batches{{worker=\"{w}\"}}")),
            0.0,
            "{metrics}"
        );
        assert_eq!(
            value(&format!(
                "mcptap_capture_waited_packets_total{{worker=\"{w}\"}}"
            )),
            0.0,
            "{metrics}"
        );
    }
    assert!(
        value("mcptap_pipeline_lag_seconds_count") >= 2.0,
        "{metrics}"
    );
    // What the pipelines hold: the session and its lineage's record, and nothing staged
    // between the threads once they are drained.
    assert!(
        value("mcptap_memory_bytes{part=\"sessions\"}") > 0.0,
        "{metrics}"
    );
    assert!(
        value("mcptap_memory_bytes{part=\"flows\"}") >= 0.0,
        "{metrics}"
    );
    assert_eq!(
        value("mcptap_memory_bytes{part=\"staged\"}"),
        0.0,
        "{metrics}"
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("kill");
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let alerts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(r#""event":"alert""#))
        .collect();
    assert_eq!(alerts.len(), 2, "{stdout}");
    assert!(alerts.iter().any(|a| a.contains("capability_narrowing")));
    assert!(alerts.iter().any(|a| a.contains("content_type_divergence")));
    // Totals: a `stats` event every second while capturing (the last one, after the traffic,
    // counts both alerts and the capture's drops), one `summary` at exit, last.
    let totals: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.contains(r#""event":"stats""#) || l.contains(r#""event":"summary""#))
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let stats: Vec<&serde_json::Value> = totals.iter().filter(|t| t["event"] == "stats").collect();
    // One at least comes after the traffic: it is followed by 1.5 s of quiet.
    assert!(!stats.is_empty(), "{stdout}");
    let last_stats = stats.last().expect("stats");
    assert_eq!(
        last_stats["alerts"]["capability_narrowing"], 1,
        "{last_stats}"
    );
    assert_eq!(last_stats["capture_drops"], 0, "{last_stats}");
    assert!(last_stats["packets"].as_u64() > Some(10), "{last_stats}");
    let summary = totals.last().expect("summary");
    assert_eq!(summary["event"], "summary", "{stdout}");
    assert_eq!(totals.iter().filter(|t| t["event"] == "summary").count(), 1);
    assert_eq!(summary["alerts"]["content_type_divergence"], 1, "{summary}");
    assert!(summary["packets"].as_u64() >= last_stats["packets"].as_u64());
    let last_line = stdout.lines().last().unwrap_or_default();
    assert!(last_line.contains(r#""event":"summary""#), "{last_line}");
}

/// Plays one connection's writes over real sockets on lo: `client` connects to `server`.
fn play_connection(
    server: &std::net::TcpListener,
    from: std::net::SocketAddr,
    writes: Vec<mcptap_testkit::tcp::AppWrite>,
) {
    let to = server.local_addr().expect("addr");
    let sock = socket2_free_connect(from, to);
    let mut client = sock;
    // Bounded: a connection that went elsewhere fails the test instead of hanging it.
    server.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut srv = loop {
        match server.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("accept on {to}: {e}"),
        }
    };
    server.set_nonblocking(false).expect("blocking");
    srv.set_nonblocking(false).expect("blocking");
    srv.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    pump_writes(&mut client, &mut srv, writes);
}

/// Plays a conversation's writes over a connected pair of sockets, each read back whole by the
/// other side before the next.
fn pump_writes(
    client: &mut std::net::TcpStream,
    srv: &mut std::net::TcpStream,
    writes: Vec<mcptap_testkit::tcp::AppWrite>,
) {
    use mcptap_testkit::tcp::Piece;
    use std::io::{Read, Write};
    for w in writes {
        let bytes: Vec<u8> = w
            .pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Bytes(b) => b.clone(),
                _ => Vec::new(),
            })
            .collect();
        let (a, b) = if w.from_client {
            (&mut *client, &mut *srv)
        } else {
            (&mut *srv, &mut *client)
        };
        a.write_all(&bytes).expect("write");
        let mut got = vec![0; bytes.len()];
        b.read_exact(&mut got).expect("read");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A connection from `from` (an address on lo) to `to`.
fn socket2_free_connect(
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(from).expect("bind client");
    let s = rt.block_on(sock.connect(to)).expect("connect");
    let s = s.into_std().expect("std stream");
    s.set_nonblocking(false).expect("blocking");
    s
}

fn start_daemon_with(
    filter: &str,
    snapshot: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, u16) {
    let port = free_port();
    let child = bin()
        .args([
            "run",
            "-i",
            "lo",
            "-f",
            filter,
            "--threads",
            "2",
            "--events-stdout",
            "--snapshot-file",
            snapshot.to_str().expect("path"),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_ready(port);
    (child, port)
}

fn stop_daemon(child: std::process::Child) -> (String, String) {
    std::thread::sleep(Duration::from_millis(1500));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("kill");
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 14: mcptap restarted (SIGTERM, start) between the first handshake and the narrowed
/// re-initialize still raises both alerts, from the snapshot file.
#[test]
fn a_restart_between_the_handshakes_keeps_the_baseline_through_the_snapshot() {
    restart_between_the_handshakes(&[], &[], "127.0.0.4");
}

/// The same with session shards: three before the restart, two after (the snapshot's
/// records go to the shards their requests go to).
#[test]
fn a_restart_of_session_shards_keeps_the_baseline_through_the_snapshot() {
    restart_between_the_handshakes(
        &["--session-threads", "3"],
        &["--session-threads", "2"],
        "127.0.0.6",
    );
}

fn restart_between_the_handshakes(before: &[&str], after: &[&str], server_ip: &str) {
    use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
    if !is_root() {
        return;
    }
    let server = std::net::TcpListener::bind(format!("{server_ip}:0")).expect("bind server");
    let server_port = server.local_addr().expect("addr").port();
    let filter = format!("tcp and host {server_ip} and port {server_port}");
    let dir = std::env::temp_dir().join(format!(
        "mcptap-snapshot-{}-{server_ip}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let snapshot = dir.join("state.json");
    let _ = std::fs::remove_file(&snapshot);

    let mut talk = Conversation::new("restart-s1");
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

    let (a, _) = start_daemon_with(&filter, &snapshot, before);
    play_connection(&server, "127.0.0.5:0".parse().expect("addr"), first);
    let (out_a, err_a) = stop_daemon(a);
    assert!(!out_a.contains(r#""event":"alert""#), "{out_a}");
    let text = std::fs::read_to_string(&snapshot).unwrap_or_else(|e| panic!("{e}: {err_a}"));
    assert!(text.contains("restart-s1"), "{text}");

    let (b, port_b) = start_daemon_with(&filter, &snapshot, after);
    play_connection(&server, "127.0.0.5:0".parse().expect("addr"), second);
    let metrics = http_get(port_b, "/metrics").expect("metrics");
    assert!(
        metrics.contains(r#"mcptap_state_snapshots_total{op="load",result="ok"} 1"#),
        "{metrics}"
    );
    let (out_b, _) = stop_daemon(b);
    let alerts: Vec<&str> = out_b
        .lines()
        .filter(|l| l.contains(r#""event":"alert""#))
        .collect();
    assert_eq!(alerts.len(), 2, "{out_b}");
    assert!(alerts.iter().any(|a| a.contains("capability_narrowing")));
    assert!(alerts.iter().any(|a| a.contains("content_type_divergence")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14: two `mcptap run` instances (two "gateway hosts": each captures its own server
/// address on lo) sharing one real redis-server. The incident's first connection passes host A,
/// the reconnect host B: B raises both alerts, A none.
#[test]
fn two_gateway_instances_share_session_state_through_redis() {
    use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
    if !is_root()
        || Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mcptap-fleet-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let redis_port = free_port();
    let redis =
        common::start_redis(&["127.0.0.1".to_string()], redis_port, &dir).expect("redis-server");
    let config = dir.join("fleet.toml");
    std::fs::write(
        &config,
        format!("[fleet]\nurl = \"redis://127.0.0.1:{redis_port}/\"\nlookup_timeout_ms = 500\n"),
    )
    .expect("config");
    let server_a = std::net::TcpListener::bind("127.0.0.11:0").expect("bind a");
    let server_b = std::net::TcpListener::bind("127.0.0.12:0").expect("bind b");
    let start = |server: &std::net::TcpListener| {
        let addr = server.local_addr().expect("addr");
        let port = free_port();
        let child = bin()
            .args([
                "run",
                "-c",
                config.to_str().expect("path"),
                "-i",
                "lo",
                "-f",
            ])
            .arg(format!(
                "tcp and host {} and port {}",
                addr.ip(),
                addr.port()
            ))
            .args(["--threads", "1", "--events-stdout", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        wait_ready(port);
        (child, port)
    };
    let (a, _) = start(&server_a);
    let (b, port_b) = start(&server_b);
    let mut talk = Conversation::new("fleet-live-s1");
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
    play_connection(&server_a, "127.0.0.13:0".parse().expect("addr"), first);
    // Host A's worker writes after its batch; give it a moment before the reconnect.
    std::thread::sleep(Duration::from_millis(800));
    play_connection(&server_b, "127.0.0.13:0".parse().expect("addr"), second);
    std::thread::sleep(Duration::from_millis(500));
    let metrics = http_get(port_b, "/metrics").expect("metrics");
    assert!(metrics.contains("mcptap_fleet_up 1"), "{metrics}");
    assert!(
        metrics.contains(r#"mcptap_fleet_lookups_total{result="found"} 1"#),
        "{metrics}"
    );
    let (out_a, _) = stop_daemon(a);
    let (out_b, err_b) = stop_daemon(b);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out_a.contains(r#""event":"alert""#), "{out_a}");
    let alerts: Vec<&str> = out_b
        .lines()
        .filter(|l| l.contains(r#""event":"alert""#))
        .collect();
    assert_eq!(alerts.len(), 2, "{out_b}\n{err_b}");
    assert!(alerts.iter().any(|a| a.contains("capability_narrowing")));
    assert!(alerts.iter().any(|a| a.contains("content_type_divergence")));
}

/// Runs a command; true when it succeeded.
fn sh(cmd: &[&str]) -> bool {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two gateway hosts as network namespaces (`ip netns`, veth to the test's namespace), each
/// with its own MCP server and its own `mcptap run` capturing its own interface; one real
/// redis-server reachable from both. The incident's first connection goes to host A, the
/// reconnect to host B: B raises both alerts, A none. Then Redis stops: host B's next
/// session goes on with the local view (`mcptap_fleet_up` 0), and recovers once Redis is back.
#[test]
fn gateway_hosts_in_network_namespaces_share_state_and_survive_the_store() {
    use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
    use std::os::fd::AsFd;
    if !is_root()
        || Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
    {
        return;
    }
    let tag = std::process::id() % 10_000;
    // Subnets of this run only (10.N.0.0/24, N from the pid), so that two runs at once (two
    // checkouts on one machine) never route into each other's namespaces.
    let base = 100 + (std::process::id() % 75) as u8 * 2;
    let hosts: Vec<(String, String, u8)> = (0..2u8)
        .map(|i| (format!("mcpgw{tag}{i}"), format!("mg{tag}{i}"), base + i))
        .collect();
    struct Cleanup(Vec<(String, String, u8)>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for (ns, veth, _) in &self.0 {
                sh(&["ip", "netns", "del", ns]);
                sh(&["ip", "link", "del", &format!("{veth}a")]);
            }
        }
    }
    let _cleanup = Cleanup(hosts.clone());
    let cleanup = |hosts: &[(String, String, u8)]| {
        for (ns, veth, _) in hosts {
            sh(&["ip", "netns", "del", ns]);
            sh(&["ip", "link", "del", &format!("{veth}a")]);
        }
    };
    cleanup(&hosts);
    for (ns, veth, net) in &hosts {
        let (outer, inner) = (format!("{veth}a"), format!("{veth}b"));
        let ok = sh(&["ip", "netns", "add", ns])
            && sh(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])
            && sh(&["ip", "link", "set", &inner, "netns", ns])
            && sh(&[
                "ip",
                "addr",
                "add",
                &format!("10.{net}.0.1/24"),
                "dev",
                &outer,
            ])
            && sh(&["ip", "link", "set", &outer, "up"])
            && sh(&[
                "ip",
                "netns",
                "exec",
                ns,
                "ip",
                "addr",
                "add",
                &format!("10.{net}.0.2/24"),
                "dev",
                &inner,
            ])
            && sh(&["ip", "netns", "exec", ns, "ip", "link", "set", &inner, "up"])
            && sh(&["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]);
        if !ok {
            cleanup(&hosts);
            eprintln!("network namespaces unavailable: skipped");
            return;
        }
    }
    let dir = std::env::temp_dir().join(format!("mcptap-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let redis_port = free_port();
    let bind: Vec<String> = hosts.iter().map(|h| format!("10.{}.0.1", h.2)).collect();
    let start = || common::start_redis(&bind, redis_port, &dir).expect("redis-server");
    let redis = start();
    // Each host's MCP server: a socket made inside its namespace (it stays there).
    let listeners: Vec<std::net::TcpListener> = hosts
        .iter()
        .map(|(ns, _, net)| {
            let ns = ns.clone();
            let addr = format!("10.{net}.0.2:8080");
            std::thread::spawn(move || {
                let f = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns");
                nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                std::net::TcpListener::bind(&addr).expect("bind in netns")
            })
            .join()
            .expect("thread")
        })
        .collect();
    let mut daemons = Vec::new();
    for (i, (ns, veth, net)) in hosts.iter().enumerate() {
        let config = dir.join(format!("gw{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "[fleet]\nurl = \"redis://10.{net}.0.1:{redis_port}/\"\nlookup_timeout_ms = 500\n"
            ),
        )
        .expect("config");
        let listen: std::net::SocketAddr = format!("10.{net}.0.2:9917").parse().expect("addr");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                env!("CARGO_BIN_EXE_mcptap"),
                "run",
                "-c",
            ])
            .arg(&config)
            .args([
                "-i",
                &format!("{veth}b"),
                "-f",
                "tcp port 8080",
                "--threads",
                "1",
            ])
            .args(["--events-stdout", "--listen", &listen.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && !http_get_at(listen, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        daemons.push((child, listen));
    }
    // A real Prometheus scraping both hosts with the shipped rules (`for:` durations are the
    // promtool tests' business; history of `up` is backfilled, as scripts/e2e.sh does, so the
    // rules' first-sample branch applies whatever the scrape timing).
    let prometheus = start_prometheus(&dir, &[daemons[0].1, daemons[1].1]);
    let client = |i: usize| -> std::net::SocketAddr {
        format!("10.{}.0.1:0", hosts[i].2).parse().expect("addr")
    };
    let mut talk = Conversation::new("netns-s1");
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
    play_connection(&listeners[0], client(0), first);
    std::thread::sleep(Duration::from_millis(800));
    play_connection(&listeners[1], client(1), second);
    std::thread::sleep(Duration::from_millis(500));
    let metrics_b = http_get_at(daemons[1].1, "/metrics").expect("metrics");
    assert!(metrics_b.contains("mcptap_fleet_up 1"), "{metrics_b}");
    // Prometheus: the narrowing alert fires once, for host B.
    let firing = prometheus.as_ref().map(|(_, port)| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let q = http_get_at(
                std::net::SocketAddr::from(([127, 0, 0, 1], *port)),
                "/api/v1/query?query=ALERTS%7Balertname%3D%22McpCapabilityNarrowing%22%2Calertstate%3D%22firing%22%7D",
            )
            .unwrap_or_default();
            let body = q.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
            if body.contains("\"instance\"") || Instant::now() > deadline {
                break body;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });

    // A healthy session crossing hosts (initialize on A, calls on B, then A): nothing. A
    // session without affinity (its requests alternate between A and B) that narrows: each
    // alert once in the fleet, raised where the fleet's view first shows it.
    let mut healthy = Conversation::new("netns-healthy");
    healthy
        .initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized();
    let healthy_a = healthy.take_writes();
    healthy.tools_call("b-one", Answer::Sse);
    let healthy_b = healthy.take_writes();
    healthy.tools_call("a-two", Answer::Sse).delete();
    let healthy_a2 = healthy.take_writes();
    let mut alt = Conversation::new("netns-alternating");
    // A: the first handshake. B: an SSE answer, then the narrowed re-initialize (narrowing,
    // against A's handshake). A: a JSON answer (divergence, against B's SSE answer). B: a
    // JSON answer (B's own view diverges too, but A raised it already).
    alt.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized();
    let alt_a1 = alt.take_writes();
    alt.tools_call("b-one", Answer::Sse)
        .reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
        .initialized();
    let alt_b1 = alt.take_writes();
    alt.tools_call("a-two", Answer::Json);
    let alt_a2 = alt.take_writes();
    alt.tools_call("b-three", Answer::Json).delete();
    let alt_b2 = alt.take_writes();
    // Requests a host counted so far: each step waits until its host has processed it
    // (and so written what it changed) before the next host is asked, however loaded the
    // machine is.
    let requests_seen = |host: usize| -> u64 {
        http_get_at(daemons[host].1, "/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("mcptap_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    for (host, writes) in [
        (0, healthy_a),
        (1, healthy_b),
        (0, healthy_a2),
        (0, alt_a1),
        (1, alt_b1),
        (0, alt_a2),
        (1, alt_b2),
    ] {
        let before = requests_seen(host);
        play_connection(&listeners[host], client(host), writes);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = before;
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let now = requests_seen(host);
            if (now > before && now == last) || Instant::now() > deadline {
                break;
            }
            last = now;
        }
    }

    // The store goes away: host B keeps working on its local view and says so.
    drop(redis);
    let mut down = Conversation::new("netns-s2");
    down.tools_call("midstream", Answer::Sse);
    play_connection(&listeners[1], client(1), down.take_writes());
    std::thread::sleep(Duration::from_millis(800));
    let metrics_b = http_get_at(daemons[1].1, "/metrics").expect("metrics while the store is down");
    assert!(metrics_b.contains("mcptap_fleet_up 0"), "{metrics_b}");
    assert!(
        metrics_b.contains("mcptap_fleet_errors_total{op=\"lookup\""),
        "{metrics_b}"
    );
    // Back: the next first sighting is served again.
    let redis = start();
    std::thread::sleep(Duration::from_millis(300));
    let mut back = Conversation::new("netns-s3");
    back.tools_call("midstream", Answer::Sse);
    play_connection(&listeners[1], client(1), back.take_writes());
    std::thread::sleep(Duration::from_millis(800));
    let metrics_b = http_get_at(daemons[1].1, "/metrics").expect("metrics after recovery");

    let daemons_listen: Vec<std::net::SocketAddr> = daemons.iter().map(|d| d.1).collect();
    let mut outs = Vec::new();
    for (child, _) in daemons {
        outs.push(stop_daemon(child));
    }
    drop(redis);
    if let Some((mut p, _)) = prometheus {
        let _ = p.kill();
        let _ = p.wait();
    }
    drop(listeners);
    cleanup(&hosts);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        metrics_b.contains("mcptap_fleet_up 1"),
        "did not recover: {metrics_b}"
    );
    let (out_a, err_a) = &outs[0];
    let (out_b, err_b) = &outs[1];
    let alerts_of = |out: &str, session: &str| -> Vec<String> {
        let mut kinds: Vec<String> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "alert" && e["session_id"] == session)
            .map(|e| e["kind"].as_str().unwrap_or("?").to_string())
            .collect();
        kinds.sort();
        kinds
    };
    let all_alerts = |out: &str| {
        out.lines()
            .filter(|l| l.contains(r#""event":"alert""#))
            .count()
    };
    // The incident: both alerts on B, none on A.
    assert!(alerts_of(out_a, "netns-s1").is_empty(), "{out_a}");
    assert_eq!(
        alerts_of(out_b, "netns-s1"),
        ["capability_narrowing", "content_type_divergence"],
        "{out_b}\n{err_b}"
    );
    // The healthy session crossing hosts: nothing anywhere.
    assert!(out_a.contains("netns-healthy") && out_b.contains("netns-healthy"));
    assert!(alerts_of(out_a, "netns-healthy").is_empty(), "{out_a}");
    assert!(alerts_of(out_b, "netns-healthy").is_empty(), "{out_b}");
    // The session without affinity: narrowing once, on B (against A's first handshake);
    // divergence once, on A (against B's SSE answer), not again on B.
    assert_eq!(
        alerts_of(out_b, "netns-alternating"),
        ["capability_narrowing"],
        "B: {out_b}\n{err_b}"
    );
    assert_eq!(
        alerts_of(out_a, "netns-alternating"),
        ["content_type_divergence"],
        "A: {out_a}\n{err_a}"
    );
    assert_eq!(all_alerts(out_a) + all_alerts(out_b), 4, "{out_a}\n{out_b}");
    assert!(err_b.contains("fleet store unreachable"), "{err_b}");
    assert!(err_b.contains("fleet store reachable again"), "{err_b}");
    // The midstream sessions were still tracked while the store was down.
    assert!(out_b.contains("netns-s2"), "{out_b}");
    if let Some(body) = firing {
        let instance_b = daemons_listen[1].to_string();
        assert_eq!(
            body.matches("\"alertname\":\"McpCapabilityNarrowing\"")
                .count(),
            1,
            "{body}"
        );
        assert!(
            body.contains(&instance_b),
            "fired for host B ({instance_b}): {body}"
        );
    }
}

/// Prometheus on 127.0.0.1 scraping `targets` (job mcptap) every second with the shipped rules,
/// `up` history backfilled; `None` where it is not installed.
fn start_prometheus(
    dir: &std::path::Path,
    targets: &[std::net::SocketAddr],
) -> Option<(std::process::Child, u16)> {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        return None;
    }
    let prom = dir.join("prom");
    std::fs::create_dir_all(prom.join("data")).ok()?;
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/alerts/mcptap.rules.yml"
    ))
    .ok()?;
    std::fs::write(prom.join("rules.yml"), rules).ok()?;
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(
        prom.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: mcptap\n    static_configs:\n      - targets: [{}]\n",
            prom.join("rules.yml").display(),
            list.join(", ")
        ),
    )
    .ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let mut om = String::new();
    for t in (now - 600..now - 2).step_by(5) {
        for target in targets {
            om.push_str(&format!(
                "up{{job=\"mcptap\",instance=\"{target}\"}} 1 {t}\n"
            ));
        }
    }
    om.push_str("# EOF\n");
    std::fs::write(prom.join("up.om"), om).ok()?;
    // Through the script that writes the block in a tmpfs: promtool preallocates 512 MiB.
    let backfill = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/prom-backfill.sh"
    ))
    .arg(prom.join("up.om"))
    .arg(prom.join("data"))
    .output()
    .ok()?;
    assert!(
        backfill.status.success(),
        "promtool backfill: {}",
        String::from_utf8_lossy(&backfill.stderr)
    );
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            prom.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let up = |port: u16| {
        http_get(port, "/api/v1/query?query=up")
            .is_some_and(|r| r.matches("\"value\"").count() >= 2)
    };
    while !up(port) {
        assert!(
            Instant::now() < deadline,
            "prometheus did not scrape both hosts"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Some((child, port))
}

/// `--user` with events and snapshot in a directory only root may write: said at startup (a
/// rotation's reopen and the shutdown's save would fail there), with the privilege drop.
#[test]
fn a_user_that_cannot_write_beside_its_files_is_warned_at_startup() {
    if !is_root()
        || nix::unistd::User::from_name("nobody")
            .ok()
            .flatten()
            .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let events = dir.path().join("events.ndjson");
    let snapshot = dir.path().join("state.json");
    let port = free_port();
    let child = bin()
        .args(["run", "-i", "lo", "-f", "tcp port 1", "--user", "nobody"])
        .args(["--events", events.to_str().expect("path")])
        .args(["--snapshot-file", snapshot.to_str().expect("path")])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_ready(port);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("privileges dropped"), "{stderr}");
    for what in ["events file: its directory", "snapshot file: its directory"] {
        let line = stderr
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no warning for the {what}: {stderr}"));
        assert!(
            line.contains("WARN") && line.contains("not writable as nobody"),
            "{line}"
        );
    }
}

/// A snapshot file whose directory does not exist (a typo, a missing StateDirectory) is said
/// at startup, without `--user` too, and a save that keeps failing is warned about once, not
/// at every interval: a WARN a minute for a day is noise that hides the next one.
#[test]
fn a_snapshot_that_cannot_be_written_is_warned_at_startup_and_once() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let snapshot = dir.path().join("missing").join("state.json");
    let config = dir.path().join("mcptap.toml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "[capture]\ninterfaces = [\"lo\"]\nfilter = \"tcp port 1\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n\
             [state]\nsnapshot_file = \"{}\"\nsnapshot_interval_secs = 1\n",
            snapshot.display()
        ),
    )
    .expect("config");
    let child = bin()
        .args(["run", "--config", config.to_str().expect("path")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_ready(port);
    // Four saves fail meanwhile.
    std::thread::sleep(Duration::from_millis(4500));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (running, _) = stderr
        .split_once("SIGTERM: stopping")
        .unwrap_or_else(|| panic!("no stop: {stderr}"));
    let startup = running
        .lines()
        .find(|l| l.contains("snapshot file: its directory"))
        .unwrap_or_else(|| panic!("no startup warning: {stderr}"));
    assert!(
        startup.contains("WARN") && startup.contains("not writable"),
        "{startup}"
    );
    // One WARN for the spell (the saves after it are DEBUG lines, shown with RUST_LOG=debug).
    let warned = running
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot write the snapshot"))
        .count();
    assert_eq!(warned, 1, "{stderr}");
}
