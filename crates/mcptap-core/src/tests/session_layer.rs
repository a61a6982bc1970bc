use crate::detect::Detectors;
use crate::http::BodyEnd;
use crate::http::sse::{SseEvent, SseItem};
use crate::http::{HttpEvent, RequestHead, RequestHeader, ResponseHead};
use crate::mcp::Tracker;
use crate::mcp::{FlowCtx, SessionLimits, headers};
use crate::model::{Output, Telemetry, Timestamp};
use serde_json::json;

const SERVER: &str = "10.0.0.1:8080";

fn ctx(flow: u64, client_port: u16) -> FlowCtx {
    FlowCtx {
        flow,
        client: format!("10.0.0.2:{client_port}").parse().expect("addr"),
        server: SERVER.parse().expect("addr"),
    }
}

fn post(session: Option<&str>) -> RequestHead {
    let mut head = headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        session,
        Some("2025-06-18"),
    );
    head.set(RequestHeader::Host, Some("mcp.example"));
    head
}

fn resp(status: u16, media: &str, session: Option<&str>) -> ResponseHead {
    headers::response_head(status, Some(media), session)
}

fn sse_data(v: serde_json::Value) -> SseItem {
    SseItem::Event(SseEvent {
        event_type: None,
        data: v.to_string().into(),
        id: None,
        retry: None,
    })
}

/// Drives one tracker and collects events only.
struct Harness {
    t: Tracker<Detectors>,
    out: Vec<Output>,
    now: i64,
}

impl Harness {
    fn new() -> Self {
        Harness {
            t: Tracker::new(SessionLimits::default(), Detectors::default()),
            out: Vec::new(),
            now: 1_000_000_000,
        }
    }

    fn send(&mut self, c: FlowCtx, ev: HttpEvent) {
        self.now += 1_000_000;
        if let Some(body) = self.t.on_http(c, Timestamp(self.now), ev, &mut self.out) {
            self.t.spend_body(body);
        }
    }

    fn events(&self) -> Vec<serde_json::Value> {
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Event(e) => serde_json::to_value(e).ok(),
                Output::Telemetry(_) | Output::Shared(_) => None,
            })
            .collect()
    }

    fn of(&self, kind: &str) -> Vec<serde_json::Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }

    /// How often `limit` was hit so far.
    fn limit_hits(&self, limit: crate::model::Limit) -> usize {
        self.out
            .iter()
            .filter(
                |o| matches!(o, Output::Telemetry(Telemetry::LimitHit { limit: l }) if *l == limit),
            )
            .count()
    }

    /// initialize on a new connection; the server assigns `sid`.
    fn handshake(
        &mut self,
        c: FlowCtx,
        ex: u64,
        reinit: Option<&str>,
        sid: &str,
        client_caps: serde_json::Value,
        server_caps: serde_json::Value,
    ) {
        let body = json!({"jsonrpc":"2.0","id":ex,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":client_caps,"clientInfo":{"name":"agent","version":"1"}}});
        self.send(
            c,
            HttpEvent::Request {
                exchange: ex,
                head: Box::new(post(reinit)),
                body: body.to_string().into_bytes(),
            },
        );
        self.send(
            c,
            HttpEvent::ResponseHead {
                exchange: ex,
                head: Box::new(resp(200, "application/json", Some(sid))),
            },
        );
        let result = json!({"jsonrpc":"2.0","id":ex,"result":{"protocolVersion":"2025-06-18","capabilities":server_caps,"serverInfo":{"name":"srv","version":"2"}}});
        self.send(
            c,
            HttpEvent::ResponseJson {
                exchange: ex,
                body: result.to_string().into_bytes(),
            },
        );
        self.send(
            c,
            HttpEvent::ResponseEnd {
                exchange: ex,
                end: BodyEnd::Complete,
            },
        );
    }

    /// DELETE of session `sid`, answered with `status`.
    fn delete(&mut self, c: FlowCtx, ex: u64, sid: &str, status: u16) {
        let head = headers::request_head("DELETE", "", None, None, Some(sid), None);
        self.send(
            c,
            HttpEvent::Request {
                exchange: ex,
                head: Box::new(head),
                body: Vec::new(),
            },
        );
        let head = headers::response_head(status, None, None);
        self.send(
            c,
            HttpEvent::ResponseHead {
                exchange: ex,
                head: Box::new(head),
            },
        );
        self.send(
            c,
            HttpEvent::ResponseEnd {
                exchange: ex,
                end: BodyEnd::Complete,
            },
        );
    }

    fn tool_call_sse(&mut self, c: FlowCtx, ex: u64, sid: &str, items: Vec<SseItem>, end: BodyEnd) {
        self.open_tool_call_sse(c, ex, sid);
        for item in items {
            self.send(c, HttpEvent::ResponseSse { exchange: ex, item });
        }
        self.send(c, HttpEvent::ResponseEnd { exchange: ex, end });
    }

    /// A tools/call on session `sid` and the head of its SSE answer, not ended.
    fn open_tool_call_sse(&mut self, c: FlowCtx, ex: u64, sid: &str) {
        self.open_call_sse(c, ex, sid, "search");
    }

    /// A tools/call of `tool` on session `sid` and the head of its SSE answer, not ended.
    fn open_call_sse(&mut self, c: FlowCtx, ex: u64, sid: &str, tool: &str) {
        let body = json!({"jsonrpc":"2.0","id":ex,"method":"tools/call","params":{"name":tool}});
        self.send(
            c,
            HttpEvent::Request {
                exchange: ex,
                head: Box::new(post(Some(sid))),
                body: body.to_string().into_bytes(),
            },
        );
        self.send(
            c,
            HttpEvent::ResponseHead {
                exchange: ex,
                head: Box::new(resp(200, "text/event-stream", None)),
            },
        );
    }

    /// A tools/call on session `sid` whose client closes the SSE answer right after its
    /// priming event (id `p-{ex}`), as the Python SDK does on its read timeout.
    fn call_dropped_after_priming(&mut self, c: FlowCtx, ex: u64, sid: &str) {
        self.open_tool_call_sse(c, ex, sid);
        let id = Some(format!("p-{ex}"));
        self.send(
            c,
            HttpEvent::ResponseSse {
                exchange: ex,
                item: SseItem::NoData { id },
            },
        );
        self.send(c, HttpEvent::ClientGone { exchange: ex });
        self.send(
            c,
            HttpEvent::ResponseEnd {
                exchange: ex,
                end: BodyEnd::Aborted,
            },
        );
    }

    /// A GET resuming session `sid`'s stream after `last_event_id`, answering request `id`
    /// with a result there (its stream ended when `complete`).
    fn resumed_answer(
        &mut self,
        c: FlowCtx,
        sid: &str,
        last_event_id: &str,
        id: u64,
        complete: bool,
    ) {
        use crate::http::RequestHeader;
        let mut get = headers::request_head(
            "GET",
            "/mcp",
            None,
            Some("text/event-stream"),
            Some(sid),
            Some("2025-06-18"),
        );
        get.set(RequestHeader::Extracted(5), Some(last_event_id));
        self.send(
            c,
            HttpEvent::Request {
                exchange: 1,
                head: Box::new(get),
                body: Vec::new(),
            },
        );
        self.send(
            c,
            HttpEvent::ResponseHead {
                exchange: 1,
                head: Box::new(resp(200, "text/event-stream", None)),
            },
        );
        let answer =
            json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":"ok"}]}});
        self.send(
            c,
            HttpEvent::ResponseSse {
                exchange: 1,
                item: sse_data(answer),
            },
        );
        if complete {
            self.send(
                c,
                HttpEvent::ResponseEnd {
                    exchange: 1,
                    end: BodyEnd::Complete,
                },
            );
        }
    }
}

/// Kept for the thread that allocated them (`Tracker::keep_spent`), every body read and every
/// head given comes back once, however its exchange ends (answered, cut off, abandoned, closed
/// with its connection, never opened: not JSON-RPC, or a response to no request), and the
/// outputs are the same; not kept, nothing comes back.
#[test]
fn spent_bodies_and_heads_come_back_once_and_only_when_kept() {
    let run = |keep: bool| {
        let mut h = Harness::new();
        if keep {
            h.t.keep_spent();
        }
        let c = ctx(1, 40000);
        h.handshake(c, 1, None, "s1", json!({}), json!({"tools":{}}));
        let answer = json!({"jsonrpc":"2.0","id":2,"result":{"content":[]}});
        h.tool_call_sse(c, 2, "s1", vec![sse_data(answer)], BodyEnd::Complete);
        h.tool_call_sse(c, 3, "s1", Vec::new(), BodyEnd::Unfinished);
        let request = |id: u64| {
            let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/list"});
            HttpEvent::Request {
                exchange: id,
                head: Box::new(post(Some("s1"))),
                body: body.to_string().into_bytes(),
            }
        };
        h.send(c, request(4));
        let reason = crate::http::AbandonReason::Gap;
        h.send(
            c,
            HttpEvent::Abandoned {
                exchange: 4,
                reason,
            },
        );
        let not_jsonrpc = HttpEvent::Request {
            exchange: 5,
            head: Box::new(post(Some("s1"))),
            body: b"hello".to_vec(),
        };
        h.send(c, not_jsonrpc);
        let head = Box::new(resp(200, "application/json", None));
        h.send(c, HttpEvent::ResponseHead { exchange: 99, head });
        let other = ctx(2, 40001);
        h.send(other, request(6));
        h.t.on_flow_closed(other.flow);
        let spent = h.t.swap_spent(crate::http::Spent::default());
        assert!(
            h.t.swap_spent(crate::http::Spent::default()).is_empty(),
            "taken once"
        );
        let counts = (
            spent.bodies.len(),
            spent.request_heads.len(),
            spent.response_heads.len(),
        );
        (format!("{:?}", h.out), counts)
    };
    let (kept_outputs, kept) = run(true);
    // Bodies: two of the handshake, a request and an SSE event's data, four more requests.
    // Heads: all six requests', all four responses'.
    assert_eq!(kept, (8, 6, 4));
    let (outputs, none) = run(false);
    assert_eq!(none, (0, 0, 0));
    assert_eq!(outputs, kept_outputs);
    assert!(outputs.contains("Exchange"), "{outputs}");
}

#[test]
fn handshake_creates_the_session_from_the_response_header() {
    let mut h = Harness::new();
    h.handshake(
        ctx(1, 5000),
        0,
        None,
        "s1",
        json!({"tools":{"streaming":true}}),
        json!({"tools":{"streaming":true}}),
    );
    let hs = h.of("handshake");
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0]["session_id"], "s1");
    assert_eq!(hs[0]["seq"], 1);
    assert_eq!(hs[0]["host"], "mcp.example");
    assert_eq!(hs[0]["protocol_version_requested"], "2025-06-18");
    assert_eq!(hs[0]["server_info"]["name"], "srv");
    assert_eq!(h.t.active_sessions(), 1);
}

#[test]
fn answers_on_a_get_stream_correlate_by_id_within_the_session() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({"tools":{}}));
    // The POST is answered 202 with no body; the answer comes on the GET stream (flow 2).
    let body = json!({"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"t"}});
    h.send(
        c,
        HttpEvent::Request {
            exchange: 1,
            head: Box::new(post(Some("s1"))),
            body: body.to_string().into_bytes(),
        },
    );
    let g = ctx(2, 5001);
    let get = headers::request_head("GET", "", None, Some("text/event-stream"), Some("s1"), None);
    h.send(
        g,
        HttpEvent::Request {
            exchange: 0,
            head: Box::new(get),
            body: Vec::new(),
        },
    );
    h.send(
        g,
        HttpEvent::ResponseHead {
            exchange: 0,
            head: Box::new(resp(200, "text/event-stream", None)),
        },
    );
    h.send(
        g,
        HttpEvent::ResponseSse {
            exchange: 0,
            item: sse_data(json!({"jsonrpc":"2.0","id":"abc","result":{"content":[]}})),
        },
    );
    let ex = h.of("exchange");
    let call = ex
        .iter()
        .find(|e| e["method"] == "tools/call")
        .expect("exchange");
    assert_eq!(call["request_id"], "abc");
    assert_eq!(call["answered"], true);
    assert_eq!(call["empty_content"], true);
    assert!(h.of("alert").is_empty());
}

#[test]
fn batches_are_answered_per_id() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({}));
    let batch = json!([
        {"jsonrpc":"2.0","id":10,"method":"tools/list"},
        {"jsonrpc":"2.0","method":"notifications/progress"},
        {"jsonrpc":"2.0","id":11,"method":"ping"}
    ]);
    h.send(
        c,
        HttpEvent::Request {
            exchange: 1,
            head: Box::new(post(Some("s1"))),
            body: batch.to_string().into_bytes(),
        },
    );
    h.send(
        c,
        HttpEvent::ResponseHead {
            exchange: 1,
            head: Box::new(resp(200, "application/json", None)),
        },
    );
    let answer = json!([{"jsonrpc":"2.0","id":11,"result":{}},{"jsonrpc":"2.0","id":10,"result":{"tools":[]}}]);
    h.send(
        c,
        HttpEvent::ResponseJson {
            exchange: 1,
            body: answer.to_string().into_bytes(),
        },
    );
    h.send(
        c,
        HttpEvent::ResponseEnd {
            exchange: 1,
            end: BodyEnd::Complete,
        },
    );
    let methods: Vec<String> = h
        .of("exchange")
        .iter()
        .filter(|e| e["answered"] == true)
        .map(|e| e["method"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(methods, vec!["initialize", "ping", "tools/list"]);
}

#[test]
fn midstream_sessions_have_no_baseline_until_a_handshake() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.tool_call_sse(
        c,
        0,
        "old",
        vec![sse_data(
            json!({"jsonrpc":"2.0","id":0,"result":{"content":[{"type":"text","text":"x"}]}}),
        )],
        BodyEnd::Complete,
    );
    assert_eq!(h.t.active_sessions(), 1);
    assert!(h.out.iter().any(|o| matches!(
        o,
        Output::Telemetry(Telemetry::SessionStarted {
            midstream: true,
            ..
        })
    )));
    // A later re-initialize is the first handshake seen: it becomes the baseline, no alert.
    h.handshake(c, 1, Some("old"), "old", json!({}), json!({"tools":{}}));
    assert!(h.of("alert").is_empty());
    assert_eq!(h.of("handshake")[0]["seq"], 1);
}

#[test]
fn baseline_is_the_first_handshake_not_the_last() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    let full = json!({"tools":{"streaming":true,"listChanged":true}});
    h.handshake(c, 0, None, "s1", json!({}), full.clone());
    h.handshake(
        c,
        1,
        Some("s1"),
        "s1",
        json!({}),
        json!({"tools":{"listChanged":true}}),
    );
    // Third handshake still lacks streaming: narrowing again against the FIRST, not the second.
    h.handshake(
        c,
        2,
        Some("s1"),
        "s1",
        json!({}),
        json!({"tools":{"listChanged":true}}),
    );
    let alerts = h.of("alert");
    assert_eq!(alerts.len(), 2);
    assert!(
        alerts
            .iter()
            .all(|a| a["kind"] == "capability_narrowing" && a["previous"] == full)
    );
    assert_eq!(alerts[1]["handshake_seq"], 3);
}

#[test]
fn empty_stream_reasons_and_unfinished_streams() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({}));
    h.tool_call_sse(c, 1, "s1", vec![], BodyEnd::Complete);
    h.tool_call_sse(
        c,
        2,
        "s1",
        vec![
            SseItem::Comment,
            // No id: nothing to resume from, so it concludes at once.
            SseItem::NoData { id: None },
        ],
        BodyEnd::Complete,
    );
    h.tool_call_sse(
        c,
        3,
        "s1",
        vec![sse_data(
            json!({"jsonrpc":"2.0","method":"notifications/message","params":{}}),
        )],
        BodyEnd::ServerClosed,
    );
    h.tool_call_sse(c, 4, "s1", vec![], BodyEnd::Unfinished);
    h.tool_call_sse(c, 5, "s1", vec![], BodyEnd::Aborted);
    let reasons: Vec<String> = h
        .of("alert")
        .iter()
        .map(|a| a["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        reasons,
        vec!["no_events", "only_priming", "only_notifications"]
    );
}

/// A client that closes its connection while its tools/call is answered stopped waiting
/// (2026-07-28: closing the stream cancels the request): the stream then ending empty raises
/// nothing, and the exchange says it was cancelled. The same stream with the client still
/// there alerts.
#[test]
fn a_stream_its_client_left_ends_empty_without_an_alert() {
    let run = |client_leaves: bool| {
        let mut h = Harness::new();
        let c = ctx(1, 5000);
        h.handshake(c, 0, None, "s1", json!({}), json!({}));
        h.open_tool_call_sse(c, 1, "s1");
        if client_leaves {
            h.send(c, HttpEvent::ClientGone { exchange: 1 });
        }
        h.send(
            c,
            HttpEvent::ResponseEnd {
                exchange: 1,
                end: BodyEnd::Complete,
            },
        );
        let alerts = h.of("alert").len();
        let cancelled = h
            .of("exchange")
            .iter()
            .any(|e| e["request_id"] == 1 && e["cancelled"] == true);
        (alerts, cancelled)
    };
    assert_eq!(run(true), (0, true));
    assert_eq!(run(false), (1, false));
}

#[test]
fn delete_and_404_end_sessions_and_feed_lineage() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(
        c,
        0,
        None,
        "s1",
        json!({"sampling":{}}),
        json!({"tools":{}}),
    );
    h.delete(c, 1, "s1", 200);
    let ends = h.of("session_end");
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["reason"], "deleted");
    // Same client host (new port), same clientInfo: linked, and the lost capability is shown.
    h.handshake(ctx(2, 5001), 0, None, "s2", json!({}), json!({"tools":{}}));
    let hs = h.of("handshake");
    assert_eq!(hs[1]["predecessor_session_id"], "s1");
    assert_eq!(hs[1]["lineage"]["client"]["removed"], json!(["sampling"]));
}

#[test]
fn lineage_window_is_honoured() {
    let mut h = Harness::new();
    h.t = Tracker::new(
        SessionLimits {
            lineage_window_ns: 1_000,
            ..SessionLimits::default()
        },
        Detectors::default(),
    );
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({}));
    h.delete(c, 1, "s1", 204);
    h.handshake(ctx(2, 5001), 0, None, "s2", json!({}), json!({}));
    assert!(h.of("handshake")[1]["predecessor_session_id"].is_null());
}

#[test]
fn hostile_session_ids_are_refused_and_counted() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    for sid in ["bad\u{7}id".to_string(), "x".repeat(10_000), String::new()] {
        h.tool_call_sse(c, 0, &sid, vec![], BodyEnd::Complete);
    }
    assert_eq!(h.t.active_sessions(), 0);
    let refused = h.limit_hits(crate::model::Limit::InvalidSessionId);
    assert!(refused >= 3);
}

/// A session calling more tools than its answers' modes are recorded for: the table filling
/// is counted once, nothing alerts.
#[test]
fn answers_past_the_mode_records_are_counted() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({"tools":{}}));
    let tools = 130;
    for i in 0..tools {
        let ex = 1 + i;
        h.open_call_sse(c, ex, "s1", &format!("tool{i}"));
        let result = json!({"jsonrpc":"2.0","id":ex,"result":{"content":[]}});
        h.send(
            c,
            HttpEvent::ResponseSse {
                exchange: ex,
                item: sse_data(result),
            },
        );
        h.send(
            c,
            HttpEvent::ResponseEnd {
                exchange: ex,
                end: BodyEnd::Complete,
            },
        );
    }
    // The initialize answer and 127 tools take the 128 kinds' records; the last three tools'
    // answers find none, counted once for the session.
    assert_eq!(h.limit_hits(crate::model::Limit::ModeRecords), 1);
    assert!(h.of("alert").is_empty(), "{:?}", h.of("alert"));
}

#[test]
fn session_cap_evicts_least_recently_seen() {
    let mut h = Harness::new();
    h.t = Tracker::new(
        SessionLimits {
            max_sessions: 32,
            ..SessionLimits::default()
        },
        Detectors::default(),
    );
    let c = ctx(1, 5000);
    for i in 0..1000 {
        h.tool_call_sse(c, i, &format!("s{i}"), vec![], BodyEnd::Unfinished);
    }
    assert!(h.t.active_sessions() <= 32);
    let evicted = h
        .of("session_end")
        .iter()
        .filter(|e| e["reason"] == "evicted")
        .count();
    assert!(evicted >= 968 - 1, "{evicted}");
}

#[test]
fn session_bytes_are_charged_and_capped() {
    let mut h = Harness::new();
    let caps = json!({"tools": {"streaming": true, "listChanged": true}, "logging": {}});
    h.handshake(
        ctx(1, 5000),
        0,
        None,
        "one",
        json!({"sampling": {}}),
        caps.clone(),
    );
    let one = h.t.session_bytes();
    // The fixed part, the id, the client info and the capability record.
    assert!((1000..2500).contains(&one), "{one}");
    // A budget for about five such sessions.
    h.t = Tracker::new(
        SessionLimits {
            max_session_bytes: one * 5,
            ..SessionLimits::default()
        },
        Detectors::default(),
    );
    let before = h.of("handshake").len();
    for i in 0..100u64 {
        let sid = format!("s{i:03}");
        h.now += 1_000;
        h.handshake(ctx(i, 6000), i, None, &sid, json!({}), caps.clone());
        assert!(h.t.session_bytes() <= one * 5, "{}", h.t.session_bytes());
        // The session just handshaking is never the one evicted to make room.
        assert_eq!(h.of("handshake").len(), before + i as usize + 1);
    }
    assert!((3..=5).contains(&h.t.active_sessions()));
    let evicted = h
        .of("session_end")
        .iter()
        .filter(|e| e["reason"] == "evicted")
        .count();
    assert_eq!(evicted, 100 - h.t.active_sessions());
    // Even a budget smaller than one session keeps the session being set up.
    h.t = Tracker::new(
        SessionLimits {
            max_session_bytes: 1,
            ..SessionLimits::default()
        },
        Detectors::default(),
    );
    h.handshake(ctx(1, 7000), 0, None, "alone", json!({}), caps.clone());
    h.handshake(
        ctx(1, 7000),
        1,
        Some("alone"),
        "alone",
        json!({}),
        json!({}),
    );
    assert_eq!(h.t.active_sessions(), 1);
    assert!(
        h.of("alert")
            .iter()
            .any(|a| a["kind"] == "capability_narrowing")
    );
}

#[test]
fn stateless_servers_log_handshakes_without_a_session() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    let body = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}});
    h.send(
        c,
        HttpEvent::Request {
            exchange: 0,
            head: Box::new(post(None)),
            body: body.to_string().into_bytes(),
        },
    );
    h.send(
        c,
        HttpEvent::ResponseHead {
            exchange: 0,
            head: Box::new(resp(200, "application/json", None)),
        },
    );
    h.send(
        c,
        HttpEvent::ResponseJson {
            exchange: 0,
            body: json!({"jsonrpc":"2.0","id":1,"result":{"capabilities":{}}})
                .to_string()
                .into_bytes(),
        },
    );
    let hs = h.of("handshake");
    assert_eq!(hs.len(), 1);
    assert!(hs[0]["session_id"].is_null());
    // The lineage is what a stateless client is tracked by.
    assert_eq!(hs[0]["lineage_id"].as_str().map(str::len), Some(16));
    assert_eq!(hs[0]["era"], "legacy");
}

/// A flood of distinct stateless clients: their `initialize` labels stay within their share
/// of the session budget, charged there, and what gives way is counted.
#[test]
fn stateless_client_labels_are_bounded_charged_and_counted() {
    let mut h = Harness::new();
    let budget = 64 * 1024;
    let usage = std::sync::Arc::new(crate::usage::SharedUsage::default());
    h.t = Tracker::with_usage(
        SessionLimits {
            max_session_bytes: budget,
            ..SessionLimits::default()
        },
        Detectors::default(),
        usage.clone(),
    );
    let stateless = |i: u32| FlowCtx {
        flow: u64::from(i),
        client: std::net::SocketAddr::from((i.to_be_bytes(), 40_000)),
        server: SERVER.parse().expect("addr"),
    };
    let initialize = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "capabilities":{}, "clientInfo":{"name":"fleet-agent","version":"1.0"}}});
    for i in 0..20_000u32 {
        h.now += 1_000;
        h.send(
            stateless(i),
            HttpEvent::Request {
                exchange: 0,
                head: Box::new(post(None)),
                body: initialize.to_string().into_bytes(),
            },
        );
        // The labels' share, the lineage ids' cache's and the params' cache's.
        assert!(
            usage.session_bytes() <= budget / 32 + 2 * (budget / 64),
            "{}",
            usage.session_bytes()
        );
    }
    assert!(
        usage.session_bytes() > 2 * (budget / 64),
        "the labels are charged (the two caches alone hold at most a 64th each)"
    );
    let dropped = h.limit_hits(crate::model::Limit::LineageRecords);
    assert!(dropped > 19_000, "{dropped}");
}

#[test]
fn idle_sessions_end() {
    let mut h = Harness::new();
    h.handshake(ctx(1, 5000), 0, None, "s1", json!({}), json!({}));
    let later = Timestamp(h.now + SessionLimits::default().session_idle_timeout_ns + 1);
    h.t.sweep(later, &mut h.out);
    assert_eq!(h.of("session_end")[0]["reason"], "idle");
}

/// A harness whose session `s1` began with a handshake that negotiated streaming.
fn streaming_session() -> Harness {
    let mut h = Harness::new();
    h.handshake(
        ctx(1, 5000),
        0,
        None,
        "s1",
        json!({"sampling":{}, "tools":{"streaming":true}}),
        json!({"tools":{"streaming":true}}),
    );
    h
}

/// A new harness at `now` that imports `snap` (one session) and sees `s1` re-initialized with
/// nothing declared.
fn narrowed_after_restore(
    now: i64,
    snap: crate::mcp::snapshot::StateSnapshot<crate::detect::ModeTracker>,
) -> Harness {
    let mut after = Harness::new();
    after.now = now;
    let report = after
        .t
        .import_state(snap, Timestamp(after.now), &mut after.out);
    assert_eq!(report.sessions, 1);
    after.handshake(ctx(2, 5001), 0, Some("s1"), "s1", json!({}), json!({}));
    after
}

#[test]
fn a_snapshot_keeps_the_baseline_across_a_restart() {
    let before = streaming_session();
    let text = serde_json::to_string(&before.t.export_state()).expect("serialises");
    let after = narrowed_after_restore(before.now, serde_json::from_str(&text).expect("parses"));
    let alerts = after.of("alert");
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["kind"], "capability_narrowing");
    assert_eq!(after.of("handshake")[0]["seq"], 2);
    // Past the idle timeout a snapshot's sessions are dropped, not revived.
    let mut late = Harness::new();
    let snap = serde_json::from_str(&text).expect("parses");
    let stale = Timestamp(before.now + SessionLimits::default().session_idle_timeout_ns + 1);
    let report = late.t.import_state(snap, stale, &mut late.out);
    assert_eq!((report.sessions, report.expired), (0, 1));
}

/// A version 1 snapshot (its digests from a hasher nothing computes again) is read with its
/// mode records dropped and its baselines kept: the narrowing still alerts, and the session's
/// answer modes are learned again.
#[test]
fn a_version_1_snapshot_keeps_its_baselines_and_drops_its_digests() {
    let mut before = streaming_session();
    before.tool_call_sse(ctx(1, 5000), 1, "s1", vec![], BodyEnd::Complete);
    let mut snap = before.t.export_state();
    snap.v = crate::mcp::snapshot::SNAPSHOT_VERSION_1;
    let text = serde_json::to_string(&snap).expect("serialises");
    assert!(text.contains("\"methods\":[["), "mode records kept: {text}");
    let mut old: crate::mcp::snapshot::StateSnapshot<crate::detect::ModeTracker> =
        serde_json::from_str(&text).expect("parses");
    old.upgrade();
    assert_eq!(old.v, crate::mcp::snapshot::SNAPSHOT_VERSION);
    let back = serde_json::to_string(&old).expect("serialises");
    assert!(
        back.contains("\"methods\":[]"),
        "mode records dropped: {back}"
    );
    let after = narrowed_after_restore(before.now, old);
    let alerts = after.of("alert");
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["kind"], "capability_narrowing");
}

#[test]
fn handshakes_read_once_and_reused_give_the_same_events_and_counts() {
    let mut h = Harness::new();
    // The server's capabilities nest beyond what a value tree reads: the result is counted
    // as a JSON-RPC error with every handshake, the reading reused or not.
    let mut deep = json!(true);
    for _ in 0..200 {
        deep = json!({ "x": deep });
    }
    let caps = json!({"roots": {"listChanged": true}});
    let narrower = json!({"roots": {}});
    for (i, client_caps) in [&caps, &caps, &narrower, &caps].into_iter().enumerate() {
        let n = i as u64 + 1;
        let server_caps = json!({"tools": {}, "deep": deep.clone()});
        h.handshake(
            ctx(n, 4000 + n as u16),
            1,
            None,
            &format!("s-{n}"),
            client_caps.clone(),
            server_caps,
        );
    }
    let errors = h
        .out
        .iter()
        .filter(|o| matches!(o, Output::Telemetry(Telemetry::JsonRpcError { .. })))
        .count();
    assert_eq!(errors, 4);
    let events = h.of("handshake");
    assert_eq!(events.len(), 4);
    let client: Vec<&serde_json::Value> =
        events.iter().map(|e| &e["client_capabilities"]).collect();
    assert_eq!(client, [&caps, &caps, &narrower, &caps]);
    for e in &events {
        assert_eq!(e["server_capabilities"], serde_json::Value::Null, "{e}");
        assert_eq!(e["protocol_version_requested"], "2025-06-18");
        assert_eq!(e["client_info"], json!({"name": "agent", "version": "1"}));
    }
}

/// A request whose connection ends before any response began is reported unanswered (status
/// 0, media type `none`), without an alert, however the connection ended; its id leaves the
/// session's requests in flight, so a client that reconnects after each lost request does not
/// grow the session. Leftovers of a flow closed without those reports leave it too.
#[test]
fn requests_their_connection_ended_on_are_reported_unanswered_and_forgotten() {
    let mut h = Harness::new();
    h.handshake(ctx(1, 40000), 1, None, "s1", json!({}), json!({"tools":{}}));
    let mut settled = None;
    let ends = [BodyEnd::ServerClosed, BodyEnd::Aborted, BodyEnd::Unfinished];
    for i in 0..96u64 {
        let c = ctx(10 + i, 41000 + i as u16);
        let body = json!({"jsonrpc":"2.0","id":format!("lost-{i}"),"method":"tools/call","params":{"name":"search"}});
        h.send(
            c,
            HttpEvent::Request {
                exchange: 0,
                head: Box::new(post(Some("s1"))),
                body: body.to_string().into_bytes(),
            },
        );
        if i < 64 {
            let end = ends[i as usize % 3];
            h.send(c, HttpEvent::NoResponse { exchange: 0, end });
        }
        h.t.on_flow_closed(c.flow);
        // The first request gave the table its kept room; the rest add nothing.
        let now = h.t.session_bytes();
        let settled = *settled.get_or_insert(now);
        assert_eq!(now, settled, "after request {i}");
    }
    let lost: Vec<_> = h
        .of("exchange")
        .into_iter()
        .filter(|e| e["method"] == "tools/call")
        .collect();
    assert_eq!(lost.len(), 64);
    for (i, e) in lost.iter().enumerate() {
        assert_eq!(e["request_id"], format!("lost-{i}"));
        assert_eq!(e["answered"], false);
        assert_eq!(e["http_status"], 0);
        assert_eq!(e["media_type"], "none");
        assert_eq!(e["tool"], "search");
        assert_eq!(e["session_id"], "s1");
    }
    assert!(h.of("alert").is_empty(), "{:?}", h.of("alert"));
}

/// A fleet store record (another host's, or anyone's with the store's password) with absurd
/// numbers — its version at u64::MAX, its handshake and alert counts at u32::MAX, thousands of
/// mode records — is taken within the bounds: the next handshake, alert and write neither
/// overflow (a panic in a debug build, a wrap in a release one) nor keep more mode records
/// than the session's own traffic could.
#[test]
fn a_store_record_with_absurd_numbers_neither_overflows_nor_passes_the_bounds() {
    use crate::model::SharedRequest;
    let mut before = streaming_session();
    before.tool_call_sse(ctx(1, 5000), 1, "s1", vec![], BodyEnd::Complete);
    let entry = before.t.export_state().sessions.remove(0);
    let mut record = serde_json::to_value(&entry).expect("json");
    record["shared_version"] = json!(u64::MAX);
    record["handshakes"] = json!(u32::MAX);
    record["alerts"] = json!(u32::MAX);
    let one = record["detection"]["methods"][0].clone();
    assert!(one.is_array(), "{record}");
    record["detection"]["methods"] = (0..10_000u64)
        .map(|n| {
            let mut m = one.clone();
            m[0] = json!(n * 2); // kind records (their lowest bit clear)
            m
        })
        .collect();

    let mut after = Harness::new();
    after.t.enable_fleet();
    after.now = before.now;
    after.handshake(ctx(2, 5001), 0, Some("s1"), "s1", json!({}), json!({}));
    let key = after
        .out
        .iter()
        .find_map(|o| match o {
            Output::Shared(SharedRequest::Lookup { key }) => Some(key.clone()),
            _ => None,
        })
        .expect("looked up");
    let now = Timestamp(after.now);
    let (text, mut out) = (record.to_string(), Vec::new());
    after.t.on_shared_state(&key, Some(&text), now, &mut out);
    assert_eq!(after.of("handshake").len(), 0);
    let (seq, versions) = out.iter().fold((None, None), |(seq, versions), o| match o {
        Output::Event(crate::model::Event::Handshake(h)) => (Some(h.seq), versions),
        Output::Shared(SharedRequest::Update {
            base_version,
            version,
            alerts,
            ..
        }) => {
            assert_eq!(alerts.len(), 1, "the narrowing");
            (seq, Some((*base_version, *version)))
        }
        _ => (seq, versions),
    });
    assert_eq!(seq, Some(u32::MAX));
    assert_eq!(versions, Some((u64::MAX, u64::MAX)));
    // The mode records within the detector's bounds (128 kind records, 64 method records).
    let held = after.t.export_state().sessions.remove(0);
    let modes = serde_json::to_value(&held.detection).expect("json");
    let n = modes["methods"].as_array().map_or(0, Vec::len);
    assert!(n <= 128 + 64, "{n}");
}

/// `client_left` calls whose client closed the stream after the priming event (each waits
/// for a resumption), then a call whose stream a polling server closed (SEP-1699), resumed and
/// answered: (alerts when that stream closed, unmatched answers, whether it was answered).
fn crowding(client_left: u64) -> (usize, usize, bool, usize) {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({"tools":{}}));
    for i in 0..client_left {
        h.call_dropped_after_priming(ctx(10 + i, 6000 + i as u16), 1 + i, "s1");
    }
    // A polling server closes the stream of call 500 after its priming event (SEP-1699).
    let cp = ctx(900, 7000);
    h.tool_call_sse(
        cp,
        500,
        "s1",
        vec![SseItem::NoData {
            id: Some("p-500".into()),
        }],
        BodyEnd::ServerClosed,
    );
    let alerts_at_close = h.of("alert").len();
    // The client resumes and the answer comes there.
    h.resumed_answer(ctx(901, 7001), "s1", "p-500", 500, false);
    let unmatched = h
        .out
        .iter()
        .filter(|o| matches!(o, Output::Telemetry(Telemetry::JsonRpcError { .. })))
        .count();
    let answered = h
        .of("exchange")
        .iter()
        .any(|e| e["request_id"] == 500 && e["answered"] == true);
    let refused = h.limit_hits(crate::model::Limit::ResumptionWaits);
    (alerts_at_close, unmatched, answered, refused)
}

#[test]
fn a_clients_dropped_streams_cannot_crowd_out_a_servers_closed_one() {
    // The client's own waits beyond 32 are refused and counted; the server's wait finds a
    // place each time.
    assert_eq!(crowding(0), (0, 0, true, 0), "no crowding");
    assert_eq!(crowding(32), (0, 0, true, 0), "32 client-left waits");
    assert_eq!(crowding(63), (0, 0, true, 31), "63 client-left waits");
    assert_eq!(crowding(64), (0, 0, true, 32), "64 client-left waits");
}

/// A client that closes each call's stream after the priming event and resumes it: every call
/// answered, and the deadlines of the ended waits purged (one per call was left in the heap,
/// uncharged, until it fell due: 30 s to 600 s).
#[test]
fn client_closed_and_resumed_calls_are_answered_and_leave_no_deadlines_behind() {
    let mut h = Harness::new();
    let c = ctx(1, 5000);
    h.handshake(c, 0, None, "s1", json!({}), json!({"tools":{}}));
    let n = 3000u64;
    for i in 0..n {
        let ex = 1 + i;
        let (cc, cr) = (ctx(10 + 2 * i, 6000), ctx(11 + 2 * i, 6001));
        h.call_dropped_after_priming(cc, ex, "s1");
        h.resumed_answer(cr, "s1", &format!("p-{ex}"), ex, true);
        h.t.on_flow_closed(cc.flow);
        h.t.on_flow_closed(cr.flow);
    }
    let answered = h
        .of("exchange")
        .iter()
        .filter(|e| {
            e["method"] == "tools/call" && e["answered"] == true && e["cancelled"].is_null()
        })
        .count();
    assert_eq!(answered as u64, n);
    let left = h.t.resumption_deadlines_len();
    assert!(left <= 1024, "{left} deadlines of ended waits kept");
}
