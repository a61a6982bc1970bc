//! The guard in front of tcpreplay (scripts/loopback-guard.sh, `mcptap endpoints
//! --require-loopback`): a capture pushed onto an interface carries loopback addresses only.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;

use common::read_segments;
use mcptap_testkit::{Frame, Link, pcap_bytes};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The incident fixture with every endpoint moved: the server to `server`, clients to 127.1.0.9.
fn incident_with_server(server: Ipv4Addr) -> Vec<u8> {
    let (segments, _) = read_segments(&Path::new(ROOT).join("tests/fixtures/incident.pcap"));
    assert!(!segments.is_empty());
    let server_port = segments[0].dst.port();
    let moved = |a: SocketAddr| {
        let ip = if a.port() == server_port {
            server
        } else {
            Ipv4Addr::new(127, 1, 0, 9)
        };
        SocketAddr::new(IpAddr::V4(ip), a.port())
    };
    let frames: Vec<Frame> = segments
        .into_iter()
        .map(|mut s| {
            s.src = moved(s.src);
            s.dst = moved(s.dst);
            Frame {
                ts_nanos: s.ts_nanos,
                data: s.frame(&Link::default()),
            }
        })
        .collect();
    pcap_bytes(1, &frames)
}

fn guard(capture: &Path) -> std::process::Output {
    Command::new(Path::new(ROOT).join("scripts/loopback-guard.sh"))
        .args(["--bin", env!("CARGO_BIN_EXE_mcptap"), "--interface", "lo"])
        .arg(capture)
        .output()
        .expect("run scripts/loopback-guard.sh")
}

#[test]
fn guard_refuses_a_capture_with_a_private_range_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("ten.pcap");
    std::fs::write(&bad, incident_with_server(Ipv4Addr::new(10, 0, 0, 10))).expect("write");
    let out = guard(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("non-loopback address 10.0.0.10"),
        "{stderr}"
    );
}

#[test]
fn guard_passes_the_same_capture_on_loopback_addresses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("lo.pcap");
    std::fs::write(&good, incident_with_server(Ipv4Addr::new(127, 10, 0, 10))).expect("write");
    let out = guard(&good);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn guard_refuses_frames_addressed_to_lo_itself() {
    // The fixtures were captured on lo: their destination MAC is lo's own (all zeros), so the
    // kernel would hand them to the local stack.
    let out = guard(&Path::new(ROOT).join("tests/fixtures/incident.pcap"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("local destination MAC 00:00:00:00:00:00"),
        "{stderr}"
    );
}

#[test]
fn every_script_that_calls_tcpreplay_runs_the_guard_first() {
    let mut checked = 0;
    for entry in std::fs::read_dir(Path::new(ROOT).join("scripts")).expect("scripts/") {
        let path = entry.expect("entry").path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        let Some(first_replay) = code
            .iter()
            .position(|l| l.contains("tcpreplay") && l.contains("--intf") && !l.contains("echo"))
        else {
            continue;
        };
        let guard_at = code.iter().position(|l| l.contains("loopback-guard.sh"));
        assert!(
            guard_at.is_some_and(|g| g < first_replay),
            "{} calls tcpreplay without scripts/loopback-guard.sh before it",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 1, "live-bench.sh calls tcpreplay");
}
