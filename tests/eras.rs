//! Whole-pipeline tests of the MCP eras from bytes: modern declarations, PROXY protocol
//! identities, and the bounds of lineage state. The captured fixtures (tests/fixtures.rs)
//! cover real peers; these cover what captures cannot vary cheaply.

use mcptap_core::mcp::identity::{Identities, IdentitySettings};
use mcptap_core::pipeline::{Analysis, Limits, Pipeline};
use mcptap_testkit::mcp::{Conversation, modern};
use mcptap_testkit::sim::{Sim, events_of, replay_frames};
use mcptap_testkit::tcp::{AppWrite, Endpoint};
use serde_json::Value;
use std::collections::BTreeSet;

fn server() -> Endpoint {
    Endpoint::new([10, 0, 0, 1], 8080)
}

/// A modern tools/call declaring `caps` by client `name`, answered SSE.
fn call(talk: &mut Conversation, caps: &str, name: &str) {
    let id = talk.take_request_id();
    let body = modern::request(
        id,
        "tools/call",
        r#""name":"search","arguments":{}"#,
        caps,
        name,
        "1.0",
    );
    talk.exchange(
        modern::post(&body, "tools/call", Some("search"), ""),
        modern::answer(true, &modern::tool_result(id)),
    );
}

fn run(sim: &Sim, limits: Limits, trusted: &[&str]) -> Vec<Value> {
    let settings = IdentitySettings {
        trusted_proxies: trusted.iter().map(|t| t.parse().expect("cidr")).collect(),
    };
    let analysis = Analysis {
        detectors: Default::default(),
        identities: Identities::new(Default::default(), &settings),
    };
    let pipeline = Pipeline::configured(limits, analysis, Default::default());
    events_of(&replay_frames(sim.linktype(), sim.frames(), pipeline))
}

fn of<'a>(evs: &'a [Value], event: &str) -> Vec<&'a Value> {
    evs.iter().filter(|e| e["event"] == event).collect()
}

fn lineages(evs: &[Value]) -> BTreeSet<String> {
    of(evs, "exchange")
        .iter()
        .filter_map(|e| e["lineage_id"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn proxy_protocol_names_the_client_behind_a_trusted_balancer() {
    let mut sim = Sim::new(3);
    let balancer = [10, 0, 0, 2];
    let mut conns = Vec::new();
    for (n, src) in ["127.0.9.1", "127.0.9.2"].iter().enumerate() {
        let mut talk = Conversation::new("unused");
        call(&mut talk, modern::FULL_CAPS, "agent");
        let header = format!("PROXY TCP4 {src} 10.0.0.1 4000{n} 8080\r\n");
        let mut writes = vec![AppWrite::client(header.into_bytes())];
        writes.extend(talk.take_writes());
        conns.push(sim.connect(Endpoint::new(balancer, 41_000 + n as u16), server(), writes));
    }
    sim.run(conns);
    let trusting = run(&sim, Limits::default(), &["10.0.0.2"]);
    assert_eq!(
        of(&trusting, "exchange").len(),
        2,
        "both requests parse after the header"
    );
    assert_eq!(
        lineages(&trusting).len(),
        2,
        "two clients behind one balancer"
    );
    let blind = run(&sim, Limits::default(), &[]);
    assert_eq!(
        lineages(&blind).len(),
        1,
        "untrusted: the balancer is the client"
    );
}

#[test]
fn a_narrowed_set_alerts_once_it_is_declared_again_and_never_when_multiplexed() {
    let cases: [(&[&str], usize); 4] = [
        (
            &[
                modern::FULL_CAPS,
                modern::RESET_CAPS,
                modern::RESET_CAPS,
                modern::RESET_CAPS,
            ],
            1,
        ),
        // One narrowed request is an outlier until it repeats.
        (
            &[modern::FULL_CAPS, modern::FULL_CAPS, modern::RESET_CAPS],
            0,
        ),
        // Interleaved conversations of one lineage: A, B, A, B.
        (
            &[
                modern::FULL_CAPS,
                modern::RESET_CAPS,
                modern::FULL_CAPS,
                modern::RESET_CAPS,
                modern::RESET_CAPS,
            ],
            0,
        ),
        // Wider is no narrowing.
        (
            &[modern::RESET_CAPS, modern::FULL_CAPS, modern::FULL_CAPS],
            0,
        ),
    ];
    for (sets, alerts) in cases {
        let mut talk = Conversation::new("unused");
        for caps in sets {
            call(&mut talk, caps, "agent");
        }
        let mut sim = Sim::new(5);
        let conn = sim.connect(
            Endpoint::new([10, 0, 0, 2], 40_000),
            server(),
            talk.take_writes(),
        );
        sim.run(vec![conn]);
        let evs = run(&sim, Limits::default(), &[]);
        let got = of(&evs, "alert");
        assert_eq!(got.len(), alerts, "{sets:?}: {got:?}");
        for a in got {
            assert_eq!(a["kind"], "client_capability_narrowing");
            assert!(a["session_id"].is_null());
            assert_eq!(a["era"], "modern");
        }
        // Each distinct set is logged once as a handshake, with where it was declared.
        let distinct: BTreeSet<&str> = sets.iter().copied().collect();
        let handshakes = of(&evs, "handshake");
        assert_eq!(handshakes.len(), distinct.len(), "{sets:?}");
        for h in handshakes {
            assert_eq!(h["source"], "request_meta");
            assert_eq!(h["method"], "tools/call");
            assert_eq!(h["host"], "mcp.internal:8080", "{h}");
            assert_eq!(h["path"], "/mcp", "{h}");
        }
    }
}

#[test]
fn modern_lineages_are_bounded_by_the_session_table_and_evictions_say_so() {
    let mut talk = Conversation::new("unused");
    for n in 0..600 {
        call(&mut talk, modern::FULL_CAPS, &format!("agent-{n}"));
    }
    let mut sim = Sim::new(9);
    let conn = sim.connect(
        Endpoint::new([10, 0, 0, 2], 40_000),
        server(),
        talk.take_writes(),
    );
    sim.run(vec![conn]);
    let mut limits = Limits::default();
    limits.session.max_sessions = 50;
    let evs = run(&sim, limits, &[]);
    assert_eq!(of(&evs, "exchange").len(), 600);
    let evicted = of(&evs, "session_end")
        .iter()
        .filter(|e| e["reason"] == "evicted" && e["session_id"].is_null())
        .count();
    assert!(
        evicted >= 500,
        "lineages beyond the cap are evicted and reported: {evicted}"
    );
}
