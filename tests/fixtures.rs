//! Whole-pipeline runs against the captures in tests/fixtures (real traffic on loopback).

use mcptap_core::model::Output;
use mcptap_core::pipeline::Limits;
use serde_json::Value;
use std::collections::BTreeSet;

fn events(fixture: &str) -> Vec<Value> {
    let path = format!("{}/tests/fixtures/{fixture}", env!("CARGO_MANIFEST_DIR"));
    let (outputs, report) = mcptap::replay::replay_collect(&[path], Limits::default())
        .unwrap_or_else(|e| panic!("{fixture}: {e}"));
    assert!(report.read.truncations.is_empty(), "{fixture}: truncated");
    outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(serde_json::to_value(e).expect("serialize")),
            Output::Telemetry(_) => None,
        })
        .collect()
}

fn of<'a>(evs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    evs.iter().filter(|e| e["event"] == kind).collect()
}

/// Distinct (session_id, alert kind) pairs.
fn alerts(evs: &[Value]) -> BTreeSet<(String, String)> {
    of(evs, "alert")
        .iter()
        .map(|a| {
            (
                a["session_id"].as_str().unwrap_or("-").to_string(),
                a["kind"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items
        .iter()
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn assert_every_request_answered(evs: &[Value], fixture: &str) {
    for ex in of(evs, "exchange") {
        assert_eq!(ex["answered"], true, "{fixture}: unanswered {ex}");
    }
}

#[test]
fn python_sdk_sse_mode_is_healthy() {
    let evs = events("sdk_sse.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    let hs = of(&evs, "handshake");
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0]["outcome"], "accepted");
    assert_eq!(hs[0]["seq"], 1);
    assert!(hs[0]["server_capabilities"]["tools"].is_object());
    assert!(hs[0]["client_info"]["name"].is_string());
    let sid = hs[0]["session_id"]
        .as_str()
        .expect("session id learned from the response");
    let calls: Vec<_> = of(&evs, "exchange")
        .into_iter()
        .filter(|e| e["method"] == "tools/call")
        .collect();
    assert!(calls.len() >= 2);
    for c in &calls {
        assert_eq!(c["media_type"], "sse");
        assert_eq!(c["session_id"], sid);
        assert!(c["sse_events"].as_u64() >= Some(1));
        assert!(c["tool"].is_string());
    }
    assert_every_request_answered(&evs, "sdk_sse");
    let ends = of(&evs, "session_end");
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["reason"], "deleted");
}

#[test]
fn python_sdk_json_mode_is_healthy() {
    let evs = events("sdk_json.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    assert_eq!(of(&evs, "handshake").len(), 1);
    for c in of(&evs, "exchange") {
        assert_eq!(c["media_type"], "json", "{c}");
    }
    assert_every_request_answered(&evs, "sdk_json");
}

#[test]
fn typescript_sdk_is_healthy() {
    let evs = events("ts_sdk_sse.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    assert_eq!(of(&evs, "handshake").len(), 1);
    assert!(
        of(&evs, "exchange")
            .iter()
            .any(|e| e["method"] == "tools/call")
    );
}

#[test]
fn the_incident_narrows_and_drifts_on_exactly_that_session() {
    let evs = events("incident.pcap");
    assert_eq!(
        alerts(&evs),
        pairs(&[
            ("incident-s1", "capability_narrowing"),
            ("incident-s1", "content_type_divergence")
        ])
    );
    let hs = of(&evs, "handshake");
    assert_eq!(hs.len(), 2);
    assert_eq!(
        (hs[0]["seq"].as_u64(), hs[1]["seq"].as_u64()),
        (Some(1), Some(2))
    );
    assert!(hs.iter().all(|h| h["outcome"] == "accepted"));
    assert_eq!(
        strings(&hs[1]["diff"]["server"]["removed"]),
        vec!["tools.streaming"]
    );
    let narrowing = of(&evs, "alert")
        .into_iter()
        .find(|a| a["kind"] == "capability_narrowing")
        .expect("narrowing");
    assert_eq!(strings(&narrowing["removed"]), vec!["tools.streaming"]);
    assert!(strings(&narrowing["client_removed"]).contains(&"tools.streaming".to_string()));
    assert_eq!(narrowing["previous"]["tools"]["streaming"], true);
    assert_eq!(narrowing["current"]["tools"]["streaming"], false);
    let drift = of(&evs, "alert")
        .into_iter()
        .find(|a| a["kind"] == "content_type_divergence")
        .expect("divergence");
    assert_eq!(drift["method"], "tools/call");
    assert_eq!(drift["expected"], "text/event-stream");
    assert_eq!(drift["observed"], "application/json");
    assert_eq!(drift["reason"], "mode_contradiction");
    // The 502 is an answer without JSON-RPC; it is reported, not alerted.
    assert!(
        of(&evs, "exchange")
            .iter()
            .any(|e| e["http_status"] == 502 && e["answered"] == false)
    );
    // MCP-Protocol-Version is recorded per request.
    assert!(
        of(&evs, "exchange")
            .iter()
            .filter(|e| e["method"] == "tools/call")
            .all(|e| e["protocol_version"] == "2025-06-18")
    );
    // Narrowing is reported when it happens, before the drift it causes.
    let pos = |k: &str| evs.iter().position(|e| e["kind"] == k);
    assert!(pos("capability_narrowing") < pos("content_type_divergence"));
}

#[test]
fn rejected_reinitialize_is_healthy_and_lineage_is_recorded() {
    let evs = events("reinit_rejected.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    let hs = of(&evs, "handshake");
    let rejected = hs
        .iter()
        .find(|h| h["session_id"] == "rejected-s1" && h["seq"] == 2)
        .expect("second handshake on rejected-s1");
    assert_eq!(rejected["outcome"], "rejected");
    assert_eq!(rejected["error_code"], -32600);
    assert_eq!(rejected["http_status"], 400);
    let successor = hs
        .iter()
        .find(|h| h["session_id"] == "rejected-s2")
        .expect("new session");
    assert_eq!(successor["seq"], 1);
    assert_eq!(successor["predecessor_session_id"], "rejected-s1");
    let lost = strings(&successor["lineage"]["client"]["removed"]);
    assert!(lost.contains(&"tools.streaming".to_string()), "{lost:?}");
    assert!(
        of(&evs, "session_end")
            .iter()
            .any(|e| e["session_id"] == "rejected-s1" && e["reason"] == "expired")
    );
}

#[test]
fn pinned_server_is_a_near_miss_not_an_alert() {
    let evs = events("pinned_server.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    let hs = of(&evs, "handshake");
    assert_eq!(hs.len(), 2);
    assert_eq!(hs[1]["client_near_miss"], true);
    assert!(strings(&hs[1]["diff"]["client"]["removed"]).contains(&"tools.streaming".to_string()));
    assert!(strings(&hs[1]["diff"]["server"]["removed"]).is_empty());
}

#[test]
fn widening_alerts() {
    let evs = events("widening.pcap");
    assert_eq!(
        alerts(&evs),
        pairs(&[("widening-s1", "capability_widening")])
    );
    let a = &of(&evs, "alert")[0];
    let added = strings(&a["added"]);
    assert!(added.contains(&"completions".to_string()), "{added:?}");
    assert!(
        added.contains(&"resources.subscribe".to_string()),
        "{added:?}"
    );
}

#[test]
fn server_side_shrink_alerts_with_an_innocent_client() {
    let evs = events("server_shrink.pcap");
    assert_eq!(
        alerts(&evs),
        pairs(&[("shrink-s1", "capability_narrowing")])
    );
    let a = &of(&evs, "alert")[0];
    let removed = strings(&a["removed"]);
    assert!(
        removed.contains(&"resources.subscribe".to_string()),
        "{removed:?}"
    );
    assert!(removed.contains(&"prompts".to_string()), "{removed:?}");
    assert!(strings(&a["client_removed"]).is_empty());
}

#[test]
fn media_type_flip_without_reinitialize_alerts() {
    let evs = events("media_flip.pcap");
    assert_eq!(
        alerts(&evs),
        pairs(&[("flip-s1", "content_type_divergence")])
    );
    assert_eq!(of(&evs, "handshake").len(), 1);
    assert!(
        of(&evs, "alert")
            .iter()
            .any(|a| a["reason"] == "mode_contradiction" && a["method"] == "tools/call")
    );
}

#[test]
fn auto_mode_server_is_healthy() {
    let evs = events("auto_mode.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    let media: BTreeSet<String> = of(&evs, "exchange")
        .iter()
        .filter(|e| e["method"] == "tools/call")
        .map(|e| e["media_type"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        media,
        ["json", "sse"].iter().map(|s| s.to_string()).collect()
    );
}

#[test]
fn streams_that_end_empty_alert_but_one_cut_by_the_capture_does_not() {
    let evs = events("empty_stream.pcap");
    let empties: Vec<_> = of(&evs, "alert")
        .into_iter()
        .filter(|a| a["kind"] == "empty_tool_result")
        .collect();
    let reasons: BTreeSet<String> = empties
        .iter()
        .map(|a| a["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(empties.len(), 3, "{empties:?}");
    assert_eq!(
        reasons,
        ["no_events", "only_priming", "only_notifications"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert!(empties.iter().all(|a| a["session_id"] == "empty-s1"));
    assert!(empties.iter().any(|a| a["ended_by"] == "server_closed"));
    assert!(empties.iter().any(|a| a["ended_by"] == "final_chunk"));
    assert_eq!(alerts(&evs), pairs(&[("empty-s1", "empty_tool_result")]));
}

#[test]
fn chunk_boundaries_anywhere_change_nothing() {
    let evs = events("chunk_split.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    assert!(of(&evs, "exchange").len() >= 3);
    assert_every_request_answered(&evs, "chunk_split");
}

#[test]
fn pipelined_requests_on_one_connection_all_pair_up() {
    let evs = events("pipelined.pcap");
    assert!(alerts(&evs).is_empty(), "{:?}", alerts(&evs));
    let exchanges = of(&evs, "exchange");
    // 20 pipelined requests plus the handshake.
    assert!(exchanges.len() >= 21, "{}", exchanges.len());
    assert_every_request_answered(&evs, "pipelined");
    let ids: BTreeSet<String> = exchanges
        .iter()
        .map(|e| e["request_id"].to_string())
        .collect();
    assert_eq!(
        ids.len(),
        exchanges.len(),
        "request ids pair with their own answers"
    );
}

#[test]
fn only_the_faulty_session_of_several_alerts() {
    let evs = events("interleaved.pcap");
    assert_eq!(
        alerts(&evs),
        pairs(&[
            ("mix-b", "capability_narrowing"),
            ("mix-b", "content_type_divergence")
        ])
    );
    let sessions: BTreeSet<String> = of(&evs, "handshake")
        .iter()
        .filter_map(|h| h["session_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(sessions.len(), 3);
}

#[test]
fn secrets_never_reach_the_events() {
    for f in ["incident.pcap", "reinit_rejected.pcap", "sdk_sse.pcap"] {
        let text = events(f)
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!text.contains("fixture-secret-token"), "{f}");
        assert!(!text.to_ascii_lowercase().contains("authorization"), "{f}");
    }
}
