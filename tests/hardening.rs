//! Issue 11's regressions, each built from bytes with the test kit: blind spots that must be
//! counted, false alerts on conformant traffic that must stay quiet, and inputs that must not
//! exhaust the monitor.

use mcptap_testkit::mcp::{self, Answer, Conversation, FULL_CLIENT_CAPS};
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::Endpoint;
use serde_json::Value;

fn client() -> Endpoint {
    Endpoint::new([127, 0, 0, 2], 40000)
}

fn server() -> Endpoint {
    Endpoint::new([127, 0, 0, 3], 8080)
}

/// The client's address on another port: another connection of the same client.
fn client_port(port: u16) -> Endpoint {
    Endpoint::new([127, 0, 0, 2], port)
}

/// How many of `outputs` are telemetry that `pick` picks.
fn telemetry_count(
    outputs: &[mcptap_core::model::Output],
    pick: impl Fn(&mcptap_core::model::Telemetry) -> bool,
) -> usize {
    outputs
        .iter()
        .filter(|o| matches!(o, mcptap_core::model::Output::Telemetry(t) if pick(t)))
        .count()
}

/// Runs on `sim` one connection from `from` that initializes session `sid` (the full client
/// capabilities, no server capabilities, JSON answers).
fn initialize_on(sim: &mut Sim, sid: &str, from: Endpoint) {
    let mut talk = Conversation::new(sid);
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let conn = sim.connect(from, server(), talk.take_writes());
    sim.run(vec![conn]);
}

/// A `tools/call` of `tool` with request id `id` on session `sid`, answered with one text
/// result as `answer`.
fn answered_call(talk: &mut Conversation, sid: &str, id: u64, tool: &str, answer: Answer) {
    let body = mcp::tools_call_request(id, tool, "{}");
    talk.exchange(
        talk.post(&body),
        mcp::response(sid, answer, &mcp::tool_result(id, "ok")),
    );
}

/// Events of one conversation on one connection.
fn events_of(talk: &mut Conversation) -> Vec<Value> {
    let mut sim = Sim::new(1);
    let conn = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![conn]);
    sim.events()
}

fn alerts(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["event"] == "alert").collect()
}

/// The frames of `sim` without the TCP segments `keep` turns down (frames that are not TCP
/// stay): a capture that lost what a tap would have lost.
fn frames_keeping(
    sim: &Sim,
    mut keep: impl FnMut(&mcptap_core::decode::TcpSegment<'_>) -> bool,
) -> Vec<mcptap_testkit::Frame> {
    use mcptap_core::decode::{Decoded, decode};
    let linktype = sim.linktype();
    sim.frames()
        .iter()
        .filter(|f| match decode(linktype, &f.data) {
            Decoded::Tcp(seg) => keep(&seg),
            _ => true,
        })
        .cloned()
        .collect()
}

/// Item 10: an error is every SDK's early-exit path; answered as plain JSON inside a session
/// whose tools/call results stream, it decides no response mode and raises nothing.
#[test]
fn a_json_rpc_error_answered_as_json_in_a_streaming_session_is_no_divergence() {
    let mut talk = Conversation::new("err-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json)
        .initialized()
        .tools_call("one", Answer::Sse)
        .tools_call("two", Answer::Sse);
    let id = talk.take_request_id();
    let request = talk.post(&mcp::tools_call_request(id, "search_docs", "{}"));
    let error = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"Unknown tool: search_docs"}}}}"#
    );
    let answer = mcp::response("err-s1", Answer::Json, &error);
    talk.exchange(request, answer)
        .tools_call("three", Answer::Sse);
    let events = events_of(&mut talk);
    let errors: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "exchange" && e["error_code"] == -32602)
        .collect();
    assert_eq!(errors.len(), 1, "the error is an exchange: {events:?}");
    assert_eq!(errors[0]["media_type"], "json");
    assert!(alerts(&events).is_empty(), "{:?}", alerts(&events));
}

/// Item 10: the incident's JSON answer shows several reasons at once; it raises one alert.
#[test]
fn one_answer_raises_at_most_one_alert() {
    let mut talk = Conversation::new("one-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json)
        .tools_call("one", Answer::Sse)
        .tools_call("two", Answer::Json);
    let events = events_of(&mut talk);
    let alerts = alerts(&events);
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["reason"], "mode_contradiction");
    assert_eq!(
        alerts[0]["also"],
        serde_json::json!(["streaming_negotiated"])
    );
}

/// Events of several conversations, each on its own connection from its own client port, one
/// after the other.
fn events_of_many(talks: &mut [Conversation]) -> Vec<Value> {
    let mut sim = Sim::new(2);
    let conns = talks
        .iter_mut()
        .enumerate()
        .map(|(i, talk)| {
            let port = 20_000 + (i % 40_000) as u16;
            let octet = 2 + (i / 40_000) as u8;
            sim.connect(
                Endpoint::new([127, 0, 1, octet], port),
                server(),
                talk.take_writes(),
            )
        })
        .collect::<Vec<_>>();
    for conn in conns {
        sim.run(vec![conn]);
    }
    sim.events()
}

fn lineage_links(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["event"] == "handshake" && !e["predecessor_session_id"].is_null())
        .map(|e| {
            (
                e["session_id"].as_str().unwrap_or_default().to_string(),
                e["predecessor_session_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// Item 7: a gateway ending thousands of sessions within the lineage window forgets none of
/// them (ended sessions are indexed by lineage key, not kept in a short list).
#[test]
fn lineage_survives_thousands_of_ended_sessions() {
    let mut talks: Vec<Conversation> = (0..6000)
        .map(|i| {
            let mut t = Conversation::new(&format!("gw-{i}"));
            t.client_name = format!("agent-{i}");
            t.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json).delete();
            t
        })
        .collect();
    // Client 0 comes back (same address: the first connection's) with a new session.
    let mut back = Conversation::new("gw-0-again");
    back.client_name = "agent-0".into();
    back.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let mut sim = Sim::new(3);
    let mut conns = Vec::new();
    for (i, talk) in talks.iter_mut().enumerate() {
        let port = 20_000 + i as u16;
        conns.push(sim.connect(
            Endpoint::new([127, 0, 1, 2], port),
            server(),
            talk.take_writes(),
        ));
    }
    conns.push(sim.connect(
        Endpoint::new([127, 0, 1, 2], 19_999),
        server(),
        back.take_writes(),
    ));
    for conn in conns {
        sim.run(vec![conn]);
    }
    let links = lineage_links(&sim.events());
    assert_eq!(links, vec![("gw-0-again".to_string(), "gw-0".to_string())]);
}

/// Item 7: a server that hands out the same session id again after a 404 keeps the link.
#[test]
fn lineage_links_a_reissued_session_id() {
    let mut first = Conversation::new("same-id");
    first.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json);
    let id = first.take_request_id();
    let call = first.post(&mcp::tools_call_request(id, "search_docs", "{}"));
    let not_found =
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nnot found"
            .to_vec();
    first.exchange(call, not_found);
    let mut again = Conversation::new("same-id");
    again.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let events = events_of_many(&mut [first, again]);
    assert_eq!(
        lineage_links(&events),
        vec![("same-id".to_string(), "same-id".to_string())]
    );
    let second = events
        .iter()
        .filter(|e| e["event"] == "handshake")
        .nth(1)
        .expect("second handshake");
    assert_eq!(
        second["lineage"]["server"]["removed"],
        serde_json::json!(["tools.streaming"])
    );
}

/// Item 5: one packet stamped two hours ahead must not end every session as idle: it is
/// counted and ignored by the clock, and the incident still alerts afterwards.
#[test]
fn one_far_future_timestamp_does_not_wipe_state() {
    use mcptap_core::model::Telemetry;
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::{events_of, replay_frames};
    let mut talk = Conversation::new("clock-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json)
        .tools_call("one", Answer::Sse)
        .tools_call("two", Answer::Sse);
    let mut later = Conversation::new("clock-s1");
    later
        .reinitialize(
            mcp::NARROWED_CLIENT_CAPS,
            r#"{"streaming":false}"#,
            Answer::Json,
        )
        .tools_call("three", Answer::Json);
    let mut sim = Sim::new(9);
    let first = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![first]);
    let mut frames = sim.frames().to_vec();
    // A stray frame (a retransmitted ACK of another flow) stamped two hours ahead.
    let mut stray = frames[0].clone();
    stray.ts_nanos += 2 * 3600 * 1_000_000_000;
    frames.push(stray);
    // The reconnect comes 30 s later: within every timeout of the real clock.
    let mut sim2 = Sim::new(10);
    sim2.advance(30_000_000_000);
    let second = sim2.connect(client_port(40001), server(), later.take_writes());
    sim2.run(vec![second]);
    frames.extend(sim2.frames().iter().cloned());
    let limits = Limits {
        flow_idle_timeout_ns: 60_000_000_000,
        session: mcptap_core::limits::SessionLimits {
            session_idle_timeout_ns: 600_000_000_000,
            ..Default::default()
        },
        ..Limits::default()
    };
    let outputs = replay_frames(sim.linktype(), &frames, Pipeline::new(limits));
    let jumps = telemetry_count(&outputs, |t| {
        matches!(
            t,
            Telemetry::ClockJump {
                followed: false,
                ..
            }
        )
    });
    assert_eq!(jumps, 1);
    let events = events_of(&outputs);
    let kinds: Vec<&str> = alerts(&events)
        .iter()
        .filter_map(|a| a["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        vec!["capability_narrowing", "content_type_divergence"],
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "session_end" && e["reason"] == "idle"),
        "{events:?}"
    );
}

/// Item 5: a real gap (a rotated set with an hour missing, a link quiet for a while) is
/// followed once a few packets agree, so sessions still expire.
#[test]
fn the_clock_follows_a_jump_that_several_packets_agree_on() {
    use mcptap_core::model::{Output, Telemetry};
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::{events_of, replay_frames};
    let mut sim = Sim::new(11);
    initialize_on(&mut sim, "gap-s1", client());
    sim.advance(2 * 3600 * 1_000_000_000);
    initialize_on(&mut sim, "other-s1", client_port(40002));
    let limits = Limits {
        session: mcptap_core::limits::SessionLimits {
            session_idle_timeout_ns: 600_000_000_000,
            ..Default::default()
        },
        ..Limits::default()
    };
    let outputs = replay_frames(sim.linktype(), sim.frames(), Pipeline::new(limits));
    let jumps: Vec<bool> = outputs
        .iter()
        .filter_map(|o| match o {
            Output::Telemetry(Telemetry::ClockJump { followed, .. }) => Some(*followed),
            _ => None,
        })
        .collect();
    // The gap is followed once; its first packets were no wrong stamps.
    assert_eq!(jumps, vec![true]);
    let events = events_of(&outputs);
    assert!(
        events.iter().any(|e| e["event"] == "session_end"
            && e["session_id"] == "gap-s1"
            && e["reason"] == "idle"),
        "{events:?}"
    );
}

/// A link quiet for longer than the flow timeout: the first packets after the gap are held
/// pending by the clock until a third agrees. They are handled at their own time, so the sweep
/// that follows the gap does not end the connection they just used (handled at the old time,
/// its `tools/call` lost its answer), and the exchange is answered.
#[test]
fn the_first_packets_after_a_quiet_gap_keep_their_connection() {
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::{events_of, replay_frames};
    let mut talk = Conversation::new("quiet-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json)
        .tools_call("late", Answer::Json);
    let mut sim = Sim::new(21);
    let a = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![a]);
    let mut frames = sim.frames().to_vec();
    // The connection goes quiet before its tools/call, for 400 s (the flow timeout is 300 s).
    let call = frames
        .iter()
        .position(|f| f.data.windows(10).any(|w| w == b"tools/call"))
        .expect("the tools/call frame");
    let gap = 400 * 1_000_000_000;
    for f in &mut frames[call..] {
        f.ts_nanos += gap;
    }
    // Another client's connection opens right after the call's request, all of it before the
    // call's answer: its first two packets are the second and third after the gap, and the
    // clock follows the gap at its third.
    let mut sim2 = Sim::new(22);
    initialize_on(&mut sim2, "quiet-s2", client_port(40003));
    let (start, room) = (
        frames[call].ts_nanos + 1,
        frames[call + 1].ts_nanos - frames[call].ts_nanos,
    );
    let b_frames = sim2.frames();
    let span = b_frames.last().map_or(0, |f| f.ts_nanos) - b_frames[0].ts_nanos + 1;
    frames.extend(b_frames.iter().map(|f| mcptap_testkit::capture::Frame {
        ts_nanos: start + (f.ts_nanos - b_frames[0].ts_nanos) * (room - 2) / span,
        data: f.data.clone(),
    }));
    frames.sort_by_key(|f| f.ts_nanos);
    let outputs = replay_frames(sim.linktype(), &frames, Pipeline::new(Limits::default()));
    let events = events_of(&outputs);
    let call_events: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "exchange" && e["method"] == "tools/call")
        .collect();
    assert_eq!(call_events.len(), 1, "{events:#?}");
    assert_eq!(call_events[0]["session_id"], "quiet-s1");
    assert_eq!(call_events[0]["answered"], true, "{:#?}", call_events[0]);
    assert_eq!(call_events[0]["http_status"], 200);
    // Stamped with its own time, after the gap.
    let first_ts = events[0]["ts"].as_str().unwrap_or_default().to_string();
    assert_ne!(call_events[0]["ts"].as_str(), Some(first_ts.as_str()));
    assert!(
        !events.iter().any(|e| e["event"] == "session_end"
            && e["session_id"] == "quiet-s2"
            && e["reason"] == "idle"),
        "{events:#?}"
    );
}

/// A packet stamped hours ahead opens a connection; the clock refuses the stamp once time
/// comes back. The connection, seen "in the future", still idles out with the real clock.
#[test]
fn a_connection_opened_by_a_refused_stamp_still_idles_out() {
    use mcptap_core::model::{FlowEvictReason, Telemetry};
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::replay_frames;
    let mut sim = Sim::new(23);
    initialize_on(&mut sim, "stray-s1", client());
    // A client's data segment stamped two hours ahead, on a connection of its own.
    let mut stray_sim = Sim::new(24);
    initialize_on(&mut stray_sim, "stray-s2", client_port(40009));
    let mut stray_frame = stray_sim
        .frames()
        .iter()
        .find(|f| f.data.windows(10).any(|w| w == b"initialize"))
        .expect("a data segment")
        .clone();
    let mut frames = sim.frames().to_vec();
    let last = frames.last().map_or(0, |f| f.ts_nanos);
    stray_frame.ts_nanos = last + 2 * 3600 * 1_000_000_000;
    frames.push(stray_frame);
    // Traffic goes on at the real time for longer than the flow timeout (300 s).
    let mut sim2 = Sim::new(25);
    sim2.advance(last - sim2.now() + 10 * 1_000_000_000);
    for i in 0..8u16 {
        sim2.advance(60 * 1_000_000_000);
        initialize_on(&mut sim2, &format!("later-{i}"), client_port(41000 + i));
    }
    frames.extend(sim2.frames().iter().cloned());
    let outputs = replay_frames(sim.linktype(), &frames, Pipeline::new(Limits::default()));
    let refused = telemetry_count(&outputs, |t| {
        matches!(
            t,
            Telemetry::ClockJump {
                followed: false,
                ..
            }
        )
    });
    assert_eq!(refused, 1);
    let idle = telemetry_count(&outputs, |t| {
        matches!(
            t,
            Telemetry::FlowEvicted {
                reason: FlowEvictReason::Idle
            }
        )
    });
    assert_eq!(idle, 1, "the stray connection idles out");
}

/// Item 3: a capture taken with a small snaplen cuts bodies short. The cut bytes are gaps
/// (HTTP resynchronises at the next message), the cut segments are counted, and the replay
/// warns once per file with the snaplen and the advice.
#[test]
fn snaplen_cuts_are_gaps_counted_and_warned_about() {
    use mcptap_testkit::capture::{PcapHeader, PcapWriter};
    let mut talk = Conversation::new("snap-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json);
    for i in 0..3 {
        talk.tools_call(&"x".repeat(3000 + i), Answer::Json);
    }
    let mut sim = Sim::new(12).with_segment_sizes(vec![1400]);
    let conn = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![conn]);
    let snaplen = 200u32;
    let mut w = PcapWriter::new(
        Vec::new(),
        PcapHeader {
            snaplen,
            ..PcapHeader::nanos(sim.linktype())
        },
    )
    .expect("header");
    let mut cut = 0;
    for f in sim.frames() {
        let keep = f.data.len().min(snaplen as usize);
        cut += usize::from(keep < f.data.len());
        let secs = (f.ts_nanos / 1_000_000_000) as u32;
        let nanos = (f.ts_nanos % 1_000_000_000) as u32;
        let orig_len = u32::try_from(f.data.len()).expect("frame length");
        w.write_record(secs, nanos, &f.data[..keep], orig_len)
            .expect("record");
    }
    assert!(cut > 3);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("snaplen.pcap");
    std::fs::write(&path, w.into_inner()).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcptap"))
        .arg("replay")
        .arg(&path)
        .output()
        .expect("replay");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("cut short by the capture's snaplen").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("snaplen=200") && stderr.contains("tcpdump -s 0"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("segments cut by the snaplen: {cut}")),
        "{stderr}"
    );
    assert!(!stderr.contains("gaps: 0 "), "{stderr}");
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(alerts(&events).is_empty(), "{events:?}");
}

/// Item 4: what is not HTTP/1.1 on a monitored port is counted per connection with its
/// server and reason, and a switched protocol's frames raise no HTTP parse errors.
#[test]
fn connections_that_are_not_http_1_1_are_counted_with_their_reason() {
    use mcptap_core::model::{Output, Telemetry};
    use mcptap_core::pipeline::Limits;
    let tls_hello: Vec<u8> = [&[0x16, 0x03, 0x01, 0x00, 0x40][..], &[0x01; 64][..]].concat();
    let server_hello: Vec<u8> = [&[0x16, 0x03, 0x03, 0x00, 0x10][..], &[0x02; 16][..]].concat();
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec();
    let upgrade = |to: &str| {
        format!("GET /mcp HTTP/1.1\r\nHost: mcp.internal\r\nConnection: Upgrade\r\nUpgrade: {to}\r\n\r\n")
            .into_bytes()
    };
    let switching = |to: &str| {
        format!("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {to}\r\n\r\n")
            .into_bytes()
    };
    let frames_after = b"\x81\x05hello\x82\x03abc".to_vec();
    let cases: Vec<(Vec<u8>, Vec<u8>, &str)> = vec![
        (tls_hello, server_hello, "tls"),
        (
            preface.clone(),
            b"\x00\x00\x00\x04\x01\x00\x00\x00\x00".to_vec(),
            "h2c",
        ),
        // An HTTP/1.1-only server (nginx without `http2`) answers the preface with a 400: no
        // exchange of the connection's, so no unmatched response either.
        (
            preface,
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
            "h2c",
        ),
        (upgrade("h2c"), switching("h2c"), "h2c"),
        (
            upgrade("websocket"),
            [switching("websocket"), frames_after.clone()].concat(),
            "websocket",
        ),
    ];
    for (i, (from_client, from_server, want)) in cases.into_iter().enumerate() {
        let mut talk = Conversation::new("nothttp");
        talk.exchange(from_client, from_server);
        talk.exchange(frames_after.clone(), frames_after.clone());
        let mut sim = Sim::new(20 + i as u64);
        let port = 9000 + i as u16;
        let conn = sim.connect(
            client(),
            Endpoint::new([127, 0, 0, 3], port),
            talk.take_writes(),
        );
        sim.run(vec![conn]);
        let outputs = sim.outputs(Limits::default());
        let found: Vec<(String, &str)> = outputs
            .iter()
            .filter_map(|o| match o {
                Output::Telemetry(Telemetry::UndecodableFlow { server, reason }) => {
                    Some((server.to_string(), reason.as_str()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            found,
            vec![(format!("127.0.0.3:{port}"), want)],
            "case {want}"
        );
        let http_errors: Vec<&Output> = outputs
            .iter()
            .filter(|o| matches!(o, Output::Telemetry(Telemetry::HttpError { .. })))
            .collect();
        assert!(http_errors.is_empty(), "case {want}: {http_errors:?}");
    }
}

/// Item 11: two taps merged with the server-side tap 5 ms early put answers before the end
/// of their requests. Within a connection requests and answers pair by TCP order (the answer
/// acknowledges request bytes not seen yet, so it waits for them): the same alerts as
/// without skew, and no false empty_tool_result.
#[test]
fn clock_skew_between_merged_taps_does_not_reorder_a_connection() {
    use mcptap_core::decode::{Decoded, decode};
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::{events_of, replay_frames};
    let mut talk = Conversation::new("skew-s1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Json)
        .tools_call("one", Answer::Sse)
        .tools_call("two", Answer::Sse)
        .reinitialize(
            mcp::NARROWED_CLIENT_CAPS,
            r#"{"streaming":false}"#,
            Answer::Json,
        )
        .tools_call("three", Answer::Json)
        .tools_call("four", Answer::Sse);
    let mut sim = Sim::new(13).with_segment_sizes(vec![60, 200]);
    let conn = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![conn]);
    let linktype = sim.linktype();
    let summary = |frames: &[mcptap_testkit::Frame]| -> Vec<(String, String)> {
        let events = events_of(&replay_frames(
            linktype,
            frames,
            Pipeline::new(Limits::default()),
        ));
        events
            .iter()
            .filter(|e| e["event"] == "alert" || e["event"] == "exchange")
            .map(|e| {
                let what = e["kind"]
                    .as_str()
                    .or(e["method"].as_str())
                    .unwrap_or_default();
                (what.to_string(), e["answered"].to_string())
            })
            .collect()
    };
    let straight = summary(sim.frames());
    let mut skewed: Vec<mcptap_testkit::Frame> = sim.frames().to_vec();
    for f in &mut skewed {
        if let Decoded::Tcp(seg) = decode(linktype, &f.data)
            && seg.src.port() == 8080
        {
            f.ts_nanos -= 5_000_000;
        }
    }
    skewed.sort_by_key(|f| f.ts_nanos);
    assert_eq!(summary(&skewed), straight);
    assert!(straight.iter().any(|(k, _)| k == "capability_narrowing"));
    assert!(!straight.iter().any(|(k, _)| k == "empty_tool_result"));
}

/// A chunked SSE answer of `events` (whole SSE blocks) on `session`, ended by the final chunk.
fn sse_answer(session: &str, events: &[String]) -> Vec<u8> {
    let mut body = String::new();
    for e in events {
        body.push_str(&format!("{:x}\r\n{e}\r\n", e.len()));
    }
    body.push_str("0\r\n\r\n");
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {session}\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
    )
    .into_bytes()
}

/// A tools/call whose stream sends a priming event with an id and ends; then (optionally,
/// after `gap_ns`) the client resumes it with `Last-Event-ID` and gets the result there.
fn resumption(resume: bool, gap_ns: i64) -> Vec<Value> {
    let sid = "resume-s1";
    let mut talk = Conversation::new(sid);
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let id = talk.take_request_id();
    let call = talk.post(&mcp::tools_call_request(id, "search_docs", "{}"));
    let priming = "id: ev-1\r\nretry: 1000\r\ndata: \r\n\r\n".to_string();
    talk.exchange(call, sse_answer(sid, &[priming]));
    let mut later = Conversation::new(sid);
    if resume {
        let get = format!(
            "GET /mcp HTTP/1.1\r\nHost: mcp.internal\r\nAccept: text/event-stream\r\nMcp-Session-Id: {sid}\r\nLast-Event-ID: ev-1\r\n\r\n"
        );
        let result = format!("id: ev-2\r\ndata: {}\r\n\r\n", mcp::tool_result(id, "late"));
        later.exchange(get.into_bytes(), sse_answer(sid, &[result]));
    }
    // Some traffic on the session afterwards, so that packet time passes.
    later.tools_call("after", Answer::Json);
    let mut sim = Sim::new(14);
    let first = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![first]);
    sim.advance(gap_ns);
    let second = sim.connect(client_port(40003), server(), later.take_writes());
    sim.run(vec![second]);
    sim.events()
}

/// Item 9: a stream closed after an event with an id and resumed with `Last-Event-ID`, the
/// answer arriving there: conformant (2025-11-25), no alert, and the request is answered.
#[test]
fn a_resumed_sse_stream_is_followed_and_raises_nothing() {
    let events = resumption(true, 2_000_000_000);
    assert!(alerts(&events).is_empty(), "{:?}", alerts(&events));
    let call = events
        .iter()
        .find(|e| e["event"] == "exchange" && e["method"] == "tools/call" && e["request_id"] == 2)
        .expect("the resumed call's exchange");
    assert_eq!(call["answered"], true, "{call}");
}

/// Item 9: the same stream never resumed: the empty result alerts once the resumption window
/// (30 s) is over, not before.
#[test]
fn an_unresumed_sse_stream_alerts_after_the_resumption_window() {
    let quick = resumption(false, 5_000_000_000);
    assert!(
        alerts(&quick).is_empty(),
        "within the window: {:?}",
        alerts(&quick)
    );
    let late = resumption(false, 40_000_000_000);
    let kinds: Vec<&Value> = alerts(&late).iter().map(|a| &a["kind"]).collect();
    assert_eq!(kinds, vec!["empty_tool_result"], "{late:?}");
    let call = late
        .iter()
        .find(|e| e["event"] == "exchange" && e["method"] == "tools/call" && e["request_id"] == 2)
        .expect("the call's exchange");
    assert_eq!(call["answered"], false);
}

/// Review of item 11: a client segment lost by the capture must not freeze the connection
/// (the answers acknowledging it cannot wait for bytes that will never come).
#[test]
fn a_lost_request_segment_does_not_freeze_the_connection() {
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::{events_of, replay_frames};
    let mut talk = Conversation::new("lost-s1");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    for i in 0..4 {
        talk.tools_call(&format!("r{i}"), Answer::Json);
    }
    let mut sim = Sim::new(15).with_segment_sizes(vec![120]);
    let conn = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![conn]);
    let linktype = sim.linktype();
    // Drop the first data segment of the second request.
    let mut seen_requests = 0;
    let mut dropped = false;
    let frames = frames_keeping(&sim, |seg| {
        if dropped || seg.dst.port() != 8080 || !seg.payload.starts_with(b"POST ") {
            return true;
        }
        seen_requests += 1;
        dropped = seen_requests == 2;
        !dropped
    });
    assert!(dropped);
    let outputs = replay_frames(linktype, &frames, Pipeline::new(Limits::default()));
    // Every answer reaches the HTTP layer (none stays held behind the bytes that never come),
    // and the calls after the lost request are still reported.
    let responses = outputs
        .iter()
        .filter(|o| {
            matches!(
                o,
                mcptap_core::model::Output::Telemetry(
                    mcptap_core::model::Telemetry::HttpResponse { .. }
                )
            )
        })
        .count();
    assert!(responses >= 4, "{responses}");
    let events = events_of(&outputs);
    let calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "exchange" && e["method"] == "tools/call")
        .collect();
    assert!(calls.len() >= 2, "{events:?}");
    assert!(alerts(&events).is_empty(), "{:?}", alerts(&events));
}

/// A capture that lost the last segment of an SSE answer (a kernel drop on a busy tap), before
/// the FIN, and the client acknowledged every byte: the hole is a gap counted as lost. It was
/// declared by nothing (no bytes follow it, and the end of a capture flushes no holes), so the
/// answer went unseen with no blind spot counted.
#[test]
fn a_lost_tail_before_the_fin_is_a_counted_gap() {
    use mcptap_core::decode::{Decoded, decode};
    use mcptap_core::model::{GapReason, Output, Telemetry};
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::sim::{events_of, replay_frames};
    let mut talk = Conversation::new("tail-s1");
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    talk.tools_call("r0", Answer::Sse);
    let mut sim = Sim::new(15).with_segment_sizes(vec![120]);
    let conn = sim.connect(client(), server(), talk.take_writes());
    sim.run(vec![conn]);
    let linktype = sim.linktype();
    let last_answer_segment = sim
        .frames()
        .iter()
        .rposition(|f| match decode(linktype, &f.data) {
            Decoded::Tcp(seg) => seg.src.port() == 8080 && !seg.payload.is_empty(),
            _ => false,
        })
        .expect("the server sent data");
    let frames: Vec<mcptap_testkit::Frame> = sim
        .frames()
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != last_answer_segment)
        .map(|(_, f)| f.clone())
        .collect();
    let outputs = replay_frames(linktype, &frames, Pipeline::new(Limits::default()));
    let lost: u64 = outputs
        .iter()
        .filter_map(|o| match o {
            Output::Telemetry(Telemetry::TcpGap {
                reason: GapReason::Lost,
                bytes,
            }) => Some(*bytes),
            _ => None,
        })
        .sum();
    assert!(lost > 0, "the lost tail is no counted gap: {outputs:?}");
    let events = events_of(&outputs);
    assert!(alerts(&events).is_empty(), "{:?}", alerts(&events));
}

/// Review of item 11: evicting many flows that hold segments must neither recurse per flow
/// nor empty the table.
#[test]
fn evicting_flows_that_hold_segments_stays_shallow() {
    use mcptap_core::decode::TcpFlags;
    use mcptap_core::model::Timestamp;
    use mcptap_core::pipeline::{Limits, Pipeline};
    use mcptap_testkit::{Link, Segment};
    let link = Link::Ethernet {
        vlan_tags: Vec::new(),
    };
    let mut p = Pipeline::new(Limits {
        memory_budget_bytes: 1 << 20,
        ..Limits::default()
    });
    let mut out = Vec::new();
    let server: std::net::SocketAddr = "127.0.0.3:8080".parse().expect("addr");
    let flags = |syn, ack| TcpFlags {
        syn,
        ack,
        ..TcpFlags::default()
    };
    let post = b"POST /mcp HTTP/1.1\r\nContent-Length: 400\r\n\r\n".repeat(8);
    for i in 0..5000u32 {
        let client: std::net::SocketAddr =
            format!("127.0.{}.{}:{}", 1 + i / 250, 2 + i % 250, 40000)
                .parse()
                .expect("addr");
        let ts = Timestamp(1_000_000_000 + i64::from(i) * 1000);
        let seg = |src, dst, seq, ack, f, payload: &[u8]| Segment {
            ts_nanos: ts.0,
            src,
            dst,
            seq,
            ack,
            flags: f,
            payload: payload.to_vec(),
        };
        for s in [
            seg(client, server, 100, 0, flags(true, false), b""),
            seg(server, client, 5000, 101, flags(true, true), b""),
            // Acknowledges 100 bytes of the server that never come: held.
            seg(client, server, 101, 5101, flags(false, true), &post),
        ] {
            p.handle_packet(ts, link.linktype(), &s.frame(&link), &mut out);
        }
    }
    assert!(p.memory_in_use() <= 1 << 20, "{}", p.memory_in_use());
    assert!(p.active_flows() > 100, "{} flows left", p.active_flows());
}

/// `mcptap replay --threads THREADS` of `frames` written as a capture file; it must succeed.
fn replay_binary(
    linktype: u32,
    frames: &[mcptap_testkit::Frame],
    threads: &str,
) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("frames.pcap");
    std::fs::write(&path, mcptap_testkit::capture::pcap_bytes(linktype, frames)).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcptap"))
        .args(["replay", "--threads", threads])
        .arg(&path)
        .output()
        .expect("run mcptap replay");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One `exchange` event per JSON-RPC request: a tools/call whose connection the server closes
/// before answering, and one whose connection is still open when the capture ends, are each
/// reported unanswered (HTTP status 0, media type `none`), without an alert; the same bytes
/// with one thread, the layers on two and the session layer in shards.
#[test]
fn requests_never_answered_are_reported_when_their_connection_ends() {
    let server = server();
    let mut sim = Sim::new(16);
    let mut talk = Conversation::new("lost-s2");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized();
    let first = sim.connect(client(), server, talk.take_writes());
    sim.run(vec![first]);
    let mut lost = |sim: &mut Sim, port: u16, server_closes: bool| {
        let id = talk.take_request_id();
        let body = mcp::tools_call_request(id, "search_docs", "{}");
        let request = mcptap_testkit::tcp::AppWrite::client(talk.post(&body));
        let conn = sim.connect(Endpoint::new([127, 0, 0, 2], port), server, vec![request]);
        sim.run(vec![if server_closes {
            conn.server_closes()
        } else {
            conn
        }]);
    };
    lost(&mut sim, 40001, true);
    lost(&mut sim, 40002, false);
    // The second connection's FINs never make it into the capture: it is open at the end.
    let linktype = sim.linktype();
    let frames = frames_keeping(&sim, |seg| {
        !(seg.flags.fin && (seg.src.port() == 40002 || seg.dst.port() == 40002))
    });
    let replay = |threads: &str| {
        let out = replay_binary(linktype, &frames, threads);
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let one = replay("1");
    for threads in ["2", "4"] {
        assert_eq!(one, replay(threads), "--threads {threads}");
    }
    let events: Vec<Value> = one
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "exchange" && e["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "{events:?}");
    for (call, port) in calls.iter().zip(["40001", "40002"]) {
        assert!(
            call["client"].as_str().is_some_and(|c| c.ends_with(port)),
            "{call}"
        );
        assert_eq!(call["answered"], false, "{call}");
        assert_eq!(call["http_status"], 0, "{call}");
        assert_eq!(call["media_type"], "none", "{call}");
        assert_eq!(call["session_id"], "lost-s2", "{call}");
    }
    assert!(alerts(&events).is_empty(), "{:?}", alerts(&events));
    let summary = events.last().expect("summary");
    assert_eq!(summary["exchanges"], 3, "{summary}");
}

/// Blind spots are counted and warned about once: a capture where twelve connections each lost
/// a request segment gives gaps on every one, one WARN per gap reason, and the counts in the
/// summary.
#[test]
fn each_blind_spot_is_warned_about_once_and_counted_every_time() {
    let mut sim = Sim::new(17).with_segment_sizes(vec![120]);
    let conns: Vec<_> = (0..12u16)
        .map(|i| {
            let mut talk = Conversation::new(&format!("gap-s{i}"));
            talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
            talk.tools_call("r", Answer::Json);
            sim.connect(
                Endpoint::new([127, 0, 0, 2], 41000 + i),
                server(),
                talk.take_writes(),
            )
        })
        .collect();
    sim.run(conns);
    let linktype = sim.linktype();
    // Each connection loses the first segment of its second request.
    let mut requests_seen = std::collections::HashMap::new();
    let frames = frames_keeping(&sim, |seg| {
        if seg.dst.port() != 8080 || !seg.payload.starts_with(b"POST ") {
            return true;
        }
        let seen = requests_seen.entry(seg.src.port()).or_insert(0);
        *seen += 1;
        *seen != 2
    });
    for threads in ["1", "2"] {
        let out = replay_binary(linktype, &frames, threads);
        let stdout = String::from_utf8(out.stdout).expect("UTF-8");
        let summary: Value =
            serde_json::from_str(stdout.lines().last().expect("summary")).expect("JSON");
        assert!(
            summary["gaps"].as_u64().is_some_and(|g| g >= 12),
            "{summary}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("tcp_gaps"))
            .collect();
        assert!(!warnings.is_empty(), "--threads {threads}: {stderr}");
        let mut reasons: Vec<&str> = warnings
            .iter()
            .filter_map(|l| l.split("reason=").nth(1))
            .filter_map(|r| r.split_whitespace().next())
            .collect();
        let all = reasons.len();
        reasons.sort();
        reasons.dedup();
        assert_eq!(reasons.len(), all, "--threads {threads}: {warnings:?}");
    }
}

/// A tools/call answered with an SSE stream that sends keep-alive comments, then ends with the
/// final chunk and no result; meanwhile (on another connection) the client posts
/// `notifications/cancelled` for it when `cancel` is set, after a ping so that the
/// cancellation comes while the stream is still open.
fn cancelled_call(cancel: bool) -> Vec<Value> {
    let sid = "cancel-s1";
    let mut setup = Conversation::new(sid);
    setup.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    // Ids from one counter: the conversations below number their own from 1.
    let id = setup.take_request_id();
    let mut calling = Conversation::new(sid);
    let call = calling.post(&mcp::tools_call_request(id, "search_docs", "{}"));
    let keep_alive: Vec<String> = (0..40)
        .map(|_| ": keep-alive\r\n\r\n".to_string())
        .collect();
    calling.exchange(call, sse_answer(sid, &keep_alive));
    let mut other = Conversation::new(sid);
    other.tools_call("ping first", Answer::Json);
    if cancel {
        let body = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"user"}}}}"#
        );
        other.exchange(other.post(&body), mcp::accepted(sid));
    }
    let mut sim = Sim::new(16).with_segment_sizes(vec![64]);
    let first = sim.connect(client(), server(), setup.take_writes());
    sim.run(vec![first]);
    let streaming = sim.connect(client_port(40004), server(), calling.take_writes());
    let cancelling = sim.connect(client_port(40005), server(), other.take_writes());
    sim.run(vec![streaming, cancelling]);
    sim.events()
}

/// A client may cancel a request with `notifications/cancelled`, and the server SHOULD NOT
/// answer it then (2025-06-18 and later, utilities/cancellation): its stream ending empty is no
/// empty result. The exchange says it was cancelled; without the cancellation the same stream
/// alerts.
#[test]
fn a_tools_call_the_client_cancelled_raises_no_empty_result() {
    let cancelled = cancelled_call(true);
    assert!(alerts(&cancelled).is_empty(), "{:?}", alerts(&cancelled));
    let call = cancelled
        .iter()
        .find(|e| e["event"] == "exchange" && e["method"] == "tools/call" && e["request_id"] == 2)
        .expect("the cancelled call's exchange");
    assert_eq!(
        (&call["answered"], &call["cancelled"]),
        (&Value::Bool(false), &Value::Bool(true)),
        "{call}"
    );
    let plain = cancelled_call(false);
    let kinds: Vec<&Value> = alerts(&plain).iter().map(|a| &a["kind"]).collect();
    assert_eq!(kinds, vec!["empty_tool_result"], "{plain:?}");
    assert!(
        plain.iter().all(|e| e.get("cancelled").is_none()),
        "absent unless cancelled"
    );
}

/// [`cancelled_call`] on a server without session ids (legacy stateless): the client posts
/// `notifications/cancelled` on another connection, naming no session; its lineage (the
/// client's address and name) says whose request it cancels.
fn stateless_cancelled_call(cancel: bool) -> Vec<Value> {
    let who = mcptap_testkit::mcp::Client {
        host: "mcp.internal:8080",
        name: "testkit-client",
        version: "0.1.0",
    };
    let stateless = |answer: Vec<u8>| {
        String::from_utf8(answer)
            .expect("UTF-8")
            .replace("Mcp-Session-Id: \r\n", "")
            .into_bytes()
    };
    let mut setup = Conversation::new("");
    let init = mcp::initialize_request(1, FULL_CLIENT_CAPS, "testkit-client", "0.1.0");
    let init_result = mcp::initialize_result(1, "{}", "testkit-server");
    setup.exchange(
        who.post(&init, None),
        stateless(mcp::response("", Answer::Json, &init_result)),
    );
    let mut calling = Conversation::new("");
    let keep_alive: Vec<String> = (0..40)
        .map(|_| ": keep-alive\r\n\r\n".to_string())
        .collect();
    calling.exchange(
        who.post(&mcp::tools_call_request(2, "search_docs", "{}"), None),
        stateless(sse_answer("", &keep_alive)),
    );
    let mut other = Conversation::new("");
    other.exchange(
        who.post(&mcp::tools_call_request(3, "ping first", "{}"), None),
        stateless(mcp::response(
            "",
            Answer::Json,
            &mcp::tool_result(3, "pong"),
        )),
    );
    if cancel {
        let body = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"user"}}"#;
        other.exchange(who.post(body, None), stateless(mcp::accepted("")));
    }
    let mut sim = Sim::new(16).with_segment_sizes(vec![64]);
    let first = sim.connect(client(), server(), setup.take_writes());
    sim.run(vec![first]);
    let streaming = sim.connect(client_port(40006), server(), calling.take_writes());
    let cancelling = sim.connect(client_port(40007), server(), other.take_writes());
    sim.run(vec![streaming, cancelling]);
    sim.events()
}

/// Without a session id too, a tools/call the client cancelled (from another connection)
/// whose stream ends empty is no empty result, and its exchange says it was cancelled.
#[test]
fn a_stateless_tools_call_the_client_cancelled_raises_no_empty_result() {
    let cancelled = stateless_cancelled_call(true);
    assert!(alerts(&cancelled).is_empty(), "{:?}", alerts(&cancelled));
    let call = cancelled
        .iter()
        .find(|e| e["event"] == "exchange" && e["method"] == "tools/call" && e["request_id"] == 2)
        .expect("the cancelled call's exchange");
    assert!(call["session_id"].is_null(), "{call}");
    assert_eq!(
        (&call["answered"], &call["cancelled"]),
        (&Value::Bool(false), &Value::Bool(true)),
        "{call}"
    );
    let plain = stateless_cancelled_call(false);
    let kinds: Vec<&Value> = alerts(&plain).iter().map(|a| &a["kind"]).collect();
    assert_eq!(kinds, vec!["empty_tool_result"], "{plain:?}");
}

/// A long-running tools/call (2025-11-25): its POST stream sends a priming event with an id
/// and ends; the client resumes it with `Last-Event-ID` a second later. `polls` > 0: the
/// server answers each resumption with an event with an id and `retry: 20000` and closes it,
/// the client polling again 20 s later, the result on the last poll. `polls` == 0: one resumed
/// stream held open with a keep-alive comment every ~2 s for over a minute, then the result
/// (`answered`) or its end without it. Packet time then passes well beyond every wait.
fn long_running(polls: usize, answered: bool) -> Vec<Value> {
    long_running_cut(polls, answered, false)
}

/// [`long_running`]; with `cut`, the server closes the POST stream's connection after its
/// priming event, before the final chunk (what closing a chunked stream without ending it
/// looks like).
fn long_running_cut(polls: usize, answered: bool, cut: bool) -> Vec<Value> {
    let sid = "long-s1";
    let mut talk = Conversation::new(sid);
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Json);
    let id = talk.take_request_id();
    let call = talk.post(&mcp::tools_call_request(id, "search_docs", "{}"));
    let priming = "id: ev-0\r\nretry: 1000\r\ndata: \r\n\r\n".to_string();
    let mut answer = sse_answer(sid, &[priming]);
    if cut {
        answer.truncate(answer.len() - b"0\r\n\r\n".len());
    }
    talk.exchange(call, answer);
    let mut sim = Sim::new(17);
    let mut first = sim.connect(client(), server(), talk.take_writes());
    if cut {
        first = first.server_closes();
    }
    sim.run(vec![first]);
    let get = |last: &str| {
        format!(
            "GET /mcp HTTP/1.1\r\nHost: mcp.internal\r\nAccept: text/event-stream\r\nMcp-Session-Id: {sid}\r\nLast-Event-ID: {last}\r\n\r\n"
        )
        .into_bytes()
    };
    let result = format!("id: ev-r\r\ndata: {}\r\n\r\n", mcp::tool_result(id, "late"));
    let mut port = 41000;
    let mut connect_and_run = |sim: &mut Sim, writes| {
        port += 1;
        let conn = sim.connect(Endpoint::new([127, 0, 0, 2], port), server(), writes);
        sim.run(vec![conn]);
    };
    sim.advance(1_000_000_000);
    if polls > 0 {
        for poll in 1..=polls {
            let mut resumed = Conversation::new(sid);
            let events = if poll == polls && answered {
                vec![result.clone()]
            } else {
                vec![format!("id: ev-{poll}\r\nretry: 20000\r\ndata: \r\n\r\n")]
            };
            resumed.exchange(get(&format!("ev-{}", poll - 1)), sse_answer(sid, &events));
            connect_and_run(&mut sim, resumed.take_writes());
            sim.advance(20_000_000_000);
        }
    } else {
        let mut held = Conversation::new(sid);
        let mut events: Vec<String> = (0..40)
            .map(|i| format!(": keep-alive {i}\r\n\r\n"))
            .collect();
        if answered {
            events.push(result);
        }
        held.exchange(get("ev-0"), sse_answer(sid, &events));
        // Each keep-alive in a segment of its own, a second per packet.
        let step = 10_000;
        sim = sim.with_segment_sizes(vec![24]).with_step(1_000_000_000);
        connect_and_run(&mut sim, held.take_writes());
        sim = sim.with_segment_sizes(Vec::new()).with_step(step);
    }
    // Later traffic on the session, so that packet time passes every deadline.
    sim.advance(120_000_000_000);
    let mut later = Conversation::new(sid);
    later.tools_call("after", Answer::Json);
    connect_and_run(&mut sim, later.take_writes());
    sim.events()
}

fn the_call(events: &[Value]) -> &Value {
    events
        .iter()
        .find(|e| e["event"] == "exchange" && e["method"] == "tools/call" && e["request_id"] == 2)
        .expect("the long call's exchange")
}

/// A long-running tool's answer held back on a resumed stream that stays open, sending
/// keep-alive comments, for longer than the resumption window: the wait goes on while the
/// stream is active, and the answer is matched. Without it, the stream's end starts the last
/// wait, and the empty result alerts once that is over.
#[test]
fn a_resumed_stream_held_open_past_the_window_keeps_the_wait() {
    let held = long_running(0, true);
    assert!(alerts(&held).is_empty(), "{:?}", alerts(&held));
    assert_eq!(the_call(&held)["answered"], true);
    assert!(
        !held.iter().any(|e| e["event"] == "summary"
            && e["jsonrpc_errors"]
                .as_object()
                .is_some_and(|m| !m.is_empty())),
        "the late answer is no unmatched response"
    );
    let never = long_running(0, false);
    let kinds: Vec<&Value> = alerts(&never).iter().map(|a| &a["kind"]).collect();
    assert_eq!(kinds, vec!["empty_tool_result"], "{never:?}");
    assert_eq!(the_call(&never)["answered"], false);
}

/// The same answer polled for: each resumed stream carries an event id and `retry: 20000` and
/// is closed by the server, the client reconnecting 20 s later, five times (100 s), the answer
/// on the last poll. Without the answer, the polls' end starts the last wait.
#[test]
fn a_long_running_call_polled_for_keeps_the_wait() {
    let polled = long_running(5, true);
    assert!(alerts(&polled).is_empty(), "{:?}", alerts(&polled));
    assert_eq!(the_call(&polled)["answered"], true);
    let never = long_running(5, false);
    let kinds: Vec<&Value> = alerts(&never).iter().map(|a| &a["kind"]).collect();
    assert_eq!(kinds, vec!["empty_tool_result"], "{never:?}");
}

/// The POST stream's connection closed by the server after the priming event, before its
/// final chunk, then resumed: the answer on the resumed stream is matched (it was reported
/// unanswered at once, and the answer counted as an unmatched response).
#[test]
fn a_chunked_stream_closed_before_its_end_and_resumed_is_answered() {
    let events = long_running_cut(1, true, true);
    assert!(alerts(&events).is_empty(), "{:?}", alerts(&events));
    assert_eq!(the_call(&events)["answered"], true, "{events:?}");
    let unmatched = events.iter().any(|e| {
        e["event"] == "summary"
            && e["http_parse_errors"]["unmatched_response"]
                .as_u64()
                .unwrap_or(0)
                > 0
    });
    assert!(!unmatched, "{events:?}");
    // Never resumed: reported unanswered, without an alert (its client saw the connection end).
    let never = long_running_cut(1, false, true);
    assert!(alerts(&never).is_empty(), "{:?}", alerts(&never));
    assert_eq!(the_call(&never)["answered"], false);
}

/// A session whose server chooses the answer's type per request, as the specification lets it
/// (basic/transports: JSON or a stream, for each request): `search` streamed, `add` as JSON,
/// and `add` streamed when the client asks for progress. With `replay`, the client then
/// replays a narrower `initialize` on the session and calls a tool it has not called before,
/// answered as JSON (the incident, told by a tool not seen before).
fn per_request_modes(replay: bool, uniform: bool) -> Vec<Value> {
    let sid = "modes-s1";
    let mut talk = Conversation::new(sid);
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Sse);
    let call = |talk: &mut Conversation, tool: &str, progress: bool, answer: Answer| {
        let id = talk.take_request_id();
        // `_meta` goes after the arguments, the last member the kit writes.
        let args = if progress {
            format!(r#"{{"q":1}},"_meta":{{"progressToken":"p{id}"}}"#)
        } else {
            r#"{"q":1}"#.to_string()
        };
        let body = mcp::tools_call_request(id, tool, &args);
        talk.exchange(
            talk.post(&body),
            mcp::response(sid, answer, &mcp::tool_result(id, "ok")),
        );
    };
    let add = if uniform { Answer::Sse } else { Answer::Json };
    for _ in 0..2 {
        call(&mut talk, "search", false, Answer::Sse);
        call(&mut talk, "add", false, add);
        call(&mut talk, "add", true, Answer::Sse);
    }
    if replay {
        talk.reinitialize(r#"{"roots":{}}"#, "{}", Answer::Sse);
        call(&mut talk, "fetch", false, Answer::Json);
    }
    events_of(&mut talk)
}

#[test]
fn a_server_that_streams_some_tools_and_not_others_raises_no_divergence() {
    let quiet = per_request_modes(false, false);
    assert!(alerts(&quiet).is_empty(), "{:?}", alerts(&quiet));
    let calls = quiet
        .iter()
        .filter(|e| e["event"] == "exchange" && e["method"] == "tools/call")
        .count();
    assert_eq!(calls, 6);
    // Nor does a tool called for the first time after a replayed handshake: the server
    // answers its tools each its own way.
    let replayed = per_request_modes(true, false);
    assert!(alerts(&replayed).is_empty(), "{:?}", alerts(&replayed));
    // A server that streamed every tool until a replayed handshake: a tool called for the
    // first time and answered as JSON shows the session's change (the incident).
    let replayed = per_request_modes(true, true);
    let divergences: Vec<&Value> = alerts(&replayed)
        .into_iter()
        .filter(|a| a["kind"] == "content_type_divergence")
        .collect();
    assert_eq!(divergences.len(), 1, "{replayed:?}");
    assert_eq!(divergences[0]["tool"], "fetch");
    assert_eq!(divergences[0]["reason"], "mode_contradiction");
}

/// A session that streamed its one tool so far; the client re-initializes on the session
/// (`client_caps`) and calls another tool, answered as JSON.
fn second_tool_after_reinitialize(client_caps: &str) -> Vec<Value> {
    let sid = "modes-s2";
    let mut talk = Conversation::new(sid);
    talk.initialize(FULL_CLIENT_CAPS, "{}", Answer::Sse);
    for _ in 0..2 {
        let id = talk.take_request_id();
        answered_call(&mut talk, sid, id, "search", Answer::Sse);
    }
    talk.reinitialize(client_caps, "{}", Answer::Sse);
    let id = talk.take_request_id();
    answered_call(&mut talk, sid, id, "add", Answer::Json);
    events_of(&mut talk)
}

#[test]
fn only_a_reinitialize_that_changed_the_capabilities_judges_a_new_tool_against_the_others() {
    // The same capabilities again (a client that reconnected, conformant or not): the server
    // may answer its other tool as JSON, as it may have from the start.
    let same = second_tool_after_reinitialize(FULL_CLIENT_CAPS);
    assert!(alerts(&same).is_empty(), "{:?}", alerts(&same));
    // Narrower capabilities, accepted: the new tool's JSON answer is the session's change.
    let narrower = second_tool_after_reinitialize(r#"{"roots":{}}"#);
    let kinds: Vec<&Value> = alerts(&narrower).iter().map(|a| &a["kind"]).collect();
    assert_eq!(kinds, vec!["content_type_divergence"], "{narrower:?}");
}

/// The incident with a call in flight across the replay: `search` streamed before; a long
/// `search` stream is open while the client replays a narrower `initialize` on another
/// connection, and its result comes after the replay was accepted; then a tool not called
/// before is answered as JSON. The in-flight answer belongs before the replay and must not
/// count as the method's first answer after it.
#[test]
fn an_answer_to_a_call_sent_before_the_replay_does_not_hide_the_incident() {
    let sid = "inflight-s1";
    let mut setup = Conversation::new(sid);
    setup.initialize(FULL_CLIENT_CAPS, "{}", Answer::Sse);
    let id = setup.take_request_id();
    answered_call(&mut setup, sid, id, "search", Answer::Sse);
    let mut sim = Sim::new(18).with_segment_sizes(vec![64]);
    let first = sim.connect(client(), server(), setup.take_writes());
    sim.run(vec![first]);
    // The long stream, and the replay beside it.
    let mut streaming = Conversation::new(sid);
    let id = 100;
    let body = mcp::tools_call_request(id, "search", "{}");
    let mut events: Vec<String> = (0..40)
        .map(|_| ": keep-alive\r\n\r\n".to_string())
        .collect();
    events.push(format!("data: {}\r\n\r\n", mcp::tool_result(id, "late")));
    streaming.exchange(streaming.post(&body), sse_answer(sid, &events));
    let mut replay = Conversation::new(sid);
    replay.reinitialize(r#"{"roots":{}}"#, "{}", Answer::Sse);
    let long = sim.connect(client_port(40010), server(), streaming.take_writes());
    let replaying = sim.connect(client_port(40011), server(), replay.take_writes());
    sim.run(vec![long, replaying]);
    let mut later = Conversation::new(sid);
    answered_call(&mut later, sid, 200, "add", Answer::Json);
    let last = sim.connect(client_port(40012), server(), later.take_writes());
    sim.run(vec![last]);
    let events = sim.events();
    // The late result came after the replay's answer (what the test is about).
    let ts_of = |pred: &dyn Fn(&Value) -> bool| {
        events
            .iter()
            .find(|e| pred(e))
            .and_then(|e| e["ts"].as_str().map(str::to_string))
    };
    let replayed = ts_of(&|e| e["event"] == "handshake" && e["seq"] == 2);
    let late = ts_of(&|e| e["event"] == "exchange" && e["request_id"] == 100);
    assert!(replayed.is_some() && late.is_some(), "{events:?}");
    let kinds: Vec<(&Value, &Value)> = alerts(&events)
        .iter()
        .map(|a| (&a["kind"], &a["tool"]))
        .collect();
    assert_eq!(
        kinds,
        vec![(&Value::from("content_type_divergence"), &Value::from("add"))],
        "{events:?}"
    );
}
