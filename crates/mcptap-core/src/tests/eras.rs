//! The era paths of the session layer (HTTP+SSE, modern declarations, server requests) driven
//! from HTTP events, with the bounds an attacker would push against.

use crate::detect::Detectors;
use crate::http::BodyEnd;
use crate::http::sse::{SseEvent, SseItem};
use crate::http::{HttpEvent, RequestHead, RequestHeader, ResponseHead};
use crate::mcp::{FlowCtx, SessionLimits, Tracker, headers};
use crate::model::{Limit, Output, Telemetry, Timestamp};
use serde_json::{Value, json};

const SERVER: &str = "10.0.0.1:8080";

fn ctx(flow: u64) -> FlowCtx {
    FlowCtx {
        flow,
        client: format!("10.0.0.2:{}", 40000 + flow).parse().expect("addr"),
        server: SERVER.parse().expect("addr"),
    }
}

/// An SSE event as the parser gives it: the default type, `message`, as no type.
fn event(kind: &str, data: String) -> SseItem {
    SseItem::Event(SseEvent {
        event_type: (kind != "message").then(|| kind.into()),
        data: data.into(),
        id: None,
        retry: None,
    })
}

fn modern_post(method: &str) -> RequestHead {
    let mut head = headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        None,
        Some("2026-07-28"),
    );
    headers::set_request_mcp_headers(&mut head, Some(method), None);
    head.set(RequestHeader::Host, Some("mcp.example"));
    head
}

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
        self.t.on_http(c, Timestamp(self.now), ev, &mut self.out);
    }

    fn request(&mut self, c: FlowCtx, ex: u64, head: RequestHead, body: Value) {
        let body = body.to_string().into_bytes();
        self.send(
            c,
            HttpEvent::Request {
                exchange: ex,
                head: Box::new(head),
                body,
            },
        );
    }

    fn head(&mut self, c: FlowCtx, ex: u64, head: ResponseHead) {
        self.send(
            c,
            HttpEvent::ResponseHead {
                exchange: ex,
                head: Box::new(head),
            },
        );
    }

    fn json(&mut self, c: FlowCtx, ex: u64, body: Value) {
        let body = body.to_string().into_bytes();
        self.send(c, HttpEvent::ResponseJson { exchange: ex, body });
    }

    fn sse(&mut self, c: FlowCtx, ex: u64, item: SseItem) {
        self.send(c, HttpEvent::ResponseSse { exchange: ex, item });
    }

    fn end(&mut self, c: FlowCtx, ex: u64, end: BodyEnd) {
        self.send(c, HttpEvent::ResponseEnd { exchange: ex, end });
    }

    /// A POST answered 200 JSON with `result`.
    fn answered(&mut self, c: FlowCtx, ex: u64, head: RequestHead, body: Value, result: Value) {
        let id = body["id"].clone();
        self.request(c, ex, head, body);
        self.head(
            c,
            ex,
            headers::response_head(200, Some("application/json"), None),
        );
        self.json(c, ex, json!({"jsonrpc":"2.0","id":id,"result":result}));
        self.end(c, ex, BodyEnd::Complete);
    }

    fn events(&self) -> Vec<Value> {
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Event(e) => serde_json::to_value(e).ok(),
                Output::Telemetry(_) | Output::Shared(_) => None,
            })
            .collect()
    }

    fn of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }

    fn limit_hits(&self, limit: Limit) -> usize {
        self.out
            .iter()
            .filter(
                |o| matches!(o, Output::Telemetry(Telemetry::LimitHit { limit: l }) if *l == limit),
            )
            .count()
    }
}

/// An HTTP+SSE GET stream on flow 1 (exchange 1) that announced `endpoint`.
fn sse_stream(h: &mut Harness, endpoint: &str) {
    let get = headers::request_head("GET", "/sse", None, Some("text/event-stream"), None, None);
    h.send(
        ctx(1),
        HttpEvent::Request {
            exchange: 1,
            head: Box::new(get),
            body: Vec::new(),
        },
    );
    h.head(
        ctx(1),
        1,
        headers::response_head(200, Some("text/event-stream"), None),
    );
    h.sse(ctx(1), 1, event("endpoint", endpoint.to_string()));
}

/// A POST to the HTTP+SSE endpoint on flow 2, answered 202.
fn sse_post(h: &mut Harness, ex: u64, path: &str, body: Value) {
    let head = headers::request_head(
        "POST",
        path,
        Some("application/json"),
        Some("*/*"),
        None,
        None,
    );
    h.request(ctx(2), ex, head, body);
    h.head(ctx(2), ex, headers::response_head(202, None, None));
    h.send(
        ctx(2),
        HttpEvent::ResponseJson {
            exchange: ex,
            body: b"Accepted".to_vec(),
        },
    );
    h.end(ctx(2), ex, BodyEnd::Complete);
}

#[test]
fn http_sse_answers_on_the_get_stream_and_parked_posts_end_with_it() {
    let mut h = Harness::new();
    let path = "/messages/?session_id=abc123";
    sse_stream(&mut h, path);
    sse_post(
        &mut h,
        1,
        path,
        json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}),
    );
    sse_post(
        &mut h,
        2,
        path,
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}),
    );
    assert!(h.of("exchange").is_empty(), "parked: {:?}", h.events());
    h.sse(
        ctx(1),
        1,
        event(
            "message",
            json!({"jsonrpc":"2.0","id":0,"result":{"tools":[]}}).to_string(),
        ),
    );
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 1);
    assert_eq!(
        (ex[0]["answered"].clone(), ex[0]["http_status"].clone()),
        (json!(true), json!(202))
    );
    assert_eq!(ex[0]["era"], "http+sse");
    // The GET stream is the only way answers come: once it is over, the POST still waiting
    // is reported, not an hour later when the session idles out.
    h.end(ctx(1), 1, BodyEnd::ServerClosed);
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 2, "{:?}", h.events());
    assert_eq!(ex[1]["method"], "tools/call");
    assert_eq!(ex[1]["answered"], false);
}

/// Parked POSTs are charged to their session once, as they were when parked: the requests of
/// 64 parked batches were added up again at every recharge of the session, so that each later
/// request cost time in proportion to all of them.
#[test]
fn parked_batches_are_charged_once_and_later_requests_do_not_add_them_up() {
    let mut h = Harness::new();
    let path = "/messages?sessionId=abc";
    sse_stream(&mut h, path);
    let idle = h.t.session_bytes();
    // One id throughout: the in-flight table holds one entry, the batches all their requests.
    let batch = Value::Array(vec![
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list"});
        1000
    ]);
    for ex in 1..=64 {
        sse_post(&mut h, ex, path, batch.clone());
    }
    let parked = h.t.session_bytes();
    assert!(parked - idle >= 64 * 1000 * 64, "{idle} -> {parked}");
    // The parked list is full: these end unanswered, each recharging the session.
    for ex in 65..2065 {
        sse_post(
            &mut h,
            ex,
            path,
            json!({"jsonrpc":"2.0","id":ex + 1,"method":"tools/list"}),
        );
    }
    assert_eq!(h.limit_hits(Limit::ParkedPosts), 2000);
    assert!(
        h.t.session_bytes() >= parked,
        "still charged for the parked batches"
    );
    // The stream's end reports every parked request, and the charge goes with them.
    h.end(ctx(1), 1, BodyEnd::ServerClosed);
    assert!(h.t.session_bytes() < parked - 64 * 1000 * 64);
}

#[test]
fn http_sse_endpoints_are_bounded_per_stream_and_in_length() {
    let mut h = Harness::new();
    sse_stream(&mut h, "/messages?sessionId=first");
    // One stream announces one endpoint; a stream re-announcing more would otherwise fill
    // the endpoint table (and the session table) on its own.
    for i in 0..100 {
        h.sse(
            ctx(1),
            1,
            event("endpoint", format!("/messages?sessionId=more{i}")),
        );
    }
    assert_eq!(h.limit_hits(Limit::SseEndpoints), 100);
    assert_eq!(h.t.active_sessions(), 1);
    // An endpoint URL of kilobytes (the session id stays short) is no endpoint to keep.
    let long = format!("/messages?sessionId=s2&pad={}", "a".repeat(64 * 1024));
    let get = headers::request_head("GET", "/sse", None, Some("text/event-stream"), None, None);
    h.send(
        ctx(3),
        HttpEvent::Request {
            exchange: 1,
            head: Box::new(get),
            body: Vec::new(),
        },
    );
    h.head(
        ctx(3),
        1,
        headers::response_head(200, Some("text/event-stream"), None),
    );
    h.sse(ctx(3), 1, event("endpoint", long));
    assert_eq!(h.limit_hits(Limit::SseEndpoints), 101);
    assert_eq!(h.t.active_sessions(), 1);
    // The first binding still works.
    sse_post(
        &mut h,
        1,
        "/messages?sessionId=first",
        json!({"jsonrpc":"2.0","id":0,"method":"ping"}),
    );
    h.sse(
        ctx(1),
        1,
        event(
            "message",
            json!({"jsonrpc":"2.0","id":0,"result":{}}).to_string(),
        ),
    );
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0]["session_id"], "first");
}

fn declared(id: u64, method: &str, caps: &Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion":"2026-07-28",
        "io.modelcontextprotocol/clientInfo":{"name":"agent","version":"1"},
        "io.modelcontextprotocol/clientCapabilities":caps}}})
}

#[test]
fn client_narrowing_alerts_and_their_memory_are_bounded_per_method() {
    let mut h = Harness::new();
    let all: serde_json::Map<String, Value> =
        (0..64).map(|i| (format!("c{i}"), json!({}))).collect();
    let mut id = 0;
    let mut call = |h: &mut Harness, caps: &Value| {
        id += 1;
        h.answered(
            ctx(1),
            id,
            modern_post("tools/list"),
            declared(id, "tools/list", caps),
            json!({"tools":[]}),
        );
    };
    call(&mut h, &Value::Object(all.clone()));
    // A hostile client narrows in ever new ways, each set declared twice (as a real narrowing
    // is): one remembered lost-path set per alert would grow without end, and each lookup in
    // them would cost more.
    for drop in 0..64 {
        let mut caps = all.clone();
        caps.remove(&format!("c{drop}"));
        let caps = Value::Object(caps);
        call(&mut h, &caps);
        call(&mut h, &caps);
    }
    let alerts = h.of("alert");
    assert!(!alerts.is_empty());
    assert!(
        alerts.len() <= crate::mcp::session::MAX_SETS_PER_METHOD,
        "{} alerts",
        alerts.len()
    );
    assert!(h.limit_hits(Limit::LineageDeclarations) > 0);
}

fn discover_result(versions: &[String], caps: &Value) -> Value {
    json!({"resultType":"complete","supportedVersions":versions,"capabilities":caps,
        "_meta":{"io.modelcontextprotocol/serverInfo":{"name":"srv","version":"1"}}})
}

/// Results repeated byte for byte are read once (a server answers every client's discover
/// alike): what each answer says and alerts is as when each is read anew.
#[test]
fn repeated_discover_results_say_what_they_said() {
    let mut h = Harness::new();
    let full = discover_result(
        &["2026-07-28".into(), "2027-01-01".into()],
        &json!({"tools":{"listChanged":true},"prompts":{}}),
    );
    let narrowed = discover_result(
        &["2026-07-28".into()],
        &json!({"tools":{"listChanged":true}}),
    );
    let discover = |h: &mut Harness, ex: u64, result: &Value| {
        h.answered(
            ctx(ex),
            ex,
            modern_post("server/discover"),
            declared(ex, "server/discover", &json!({})),
            result.clone(),
        );
        let logged = h
            .of("handshake")
            .into_iter()
            .filter(|e| e["source"] == "discover");
        (logged.count(), h.of("alert").len())
    };
    // The first result is logged; its repeat is not.
    assert_eq!(discover(&mut h, 1, &full), (1, 0));
    assert_eq!(discover(&mut h, 2, &full), (1, 0));
    // A narrowed result is logged and alerts (a capability and a version lost), once.
    let (logged, alerts) = discover(&mut h, 3, &narrowed);
    assert_eq!(logged, 2);
    let kinds: Vec<Value> = h.of("alert").iter().map(|a| a["kind"].clone()).collect();
    assert!(
        alerts >= 1 && kinds.contains(&json!("capability_narrowing")),
        "{kinds:?}"
    );
    assert_eq!(discover(&mut h, 4, &narrowed), (2, alerts));
    // Back to the full set, then narrowed again: logged as changes, alerted no more.
    assert_eq!(discover(&mut h, 5, &full), (3, alerts));
    assert_eq!(discover(&mut h, 6, &narrowed), (4, alerts));
    let seqs: Vec<Value> = h
        .of("handshake")
        .iter()
        .filter(|e| e["source"] == "discover")
        .map(|e| e["seq"].clone())
        .collect();
    assert_eq!(seqs, [json!(1), json!(3), json!(5), json!(6)]);
}

#[test]
fn discover_versions_and_alerts_are_bounded() {
    let mut h = Harness::new();
    let versions: Vec<String> = (0..20_000)
        .map(|i| {
            format!(
                "{:04}-{:02}-{:02}",
                2000 + i / 400,
                1 + (i / 28) % 12,
                1 + i % 28
            )
        })
        .collect();
    let caps: serde_json::Map<String, Value> =
        (0..64).map(|i| (format!("c{i}"), json!({}))).collect();
    let discover = |id: u64| declared(id, "server/discover", &json!({}));
    h.answered(
        ctx(1),
        1,
        modern_post("server/discover"),
        discover(1),
        discover_result(&versions, &Value::Object(caps.clone())),
    );
    let first = h.t.session_bytes();
    // Twenty thousand versions are kept as a bounded list, not as twenty thousand strings
    // compared pairwise with every later result's.
    assert!(first < 64 * 1024, "{first} bytes");
    assert!(h.limit_hits(Limit::LineageDeclarations) > 0);
    // A server shrinking in ever new ways: each lost set is one alert, within a bound.
    for i in 0..64u64 {
        let mut c = caps.clone();
        c.remove(&format!("c{i}"));
        let mut v = versions.clone();
        v.remove(v.len() - 1 - i as usize);
        h.answered(
            ctx(1),
            2 + i,
            modern_post("server/discover"),
            discover(2 + i),
            discover_result(&v, &Value::Object(c)),
        );
    }
    let narrowing = h
        .of("alert")
        .iter()
        .filter(|a| a["kind"] == "capability_narrowing")
        .count();
    assert!(
        narrowing <= crate::mcp::session::MAX_SETS_PER_METHOD,
        "{narrowing}"
    );
    assert!(
        h.t.session_bytes() < first + 64 * 1024,
        "{} bytes",
        h.t.session_bytes()
    );
}

#[test]
fn server_requests_never_answered_do_not_block_later_ones() {
    let mut h = Harness::new();
    let get = headers::request_head(
        "GET",
        "/mcp",
        None,
        Some("text/event-stream"),
        Some("s1"),
        Some("2025-06-18"),
    );
    h.send(
        ctx(1),
        HttpEvent::Request {
            exchange: 1,
            head: Box::new(get),
            body: Vec::new(),
        },
    );
    h.head(
        ctx(1),
        1,
        headers::response_head(200, Some("text/event-stream"), None),
    );
    // Pings a client never answers (lost, or ignored) fill the table of waiting requests...
    for i in 0..200 {
        h.sse(
            ctx(1),
            1,
            event(
                "message",
                json!({"jsonrpc":"2.0","id":format!("p{i}"),"method":"ping"}).to_string(),
            ),
        );
    }
    assert!(h.limit_hits(Limit::ServerRequests) > 0);
    // ... but a later request of the server is still followed to its answer.
    h.sse(
        ctx(1),
        1,
        event(
            "message",
            json!({"jsonrpc":"2.0","id":"r1","method":"roots/list"}).to_string(),
        ),
    );
    let post = headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        Some("s1"),
        Some("2025-06-18"),
    );
    h.request(
        ctx(2),
        1,
        post,
        json!({"jsonrpc":"2.0","id":"r1","result":{"roots":[]}}),
    );
    h.head(ctx(2), 1, headers::response_head(202, None, None));
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 1, "{:?}", h.events());
    assert_eq!(ex[0]["method"], "roots/list");
    assert_eq!(ex[0]["direction"], "server_to_client");
}

#[test]
fn http_sse_answer_before_the_202_is_accepted() {
    let mut h = Harness::new();
    let path = "/messages?sessionId=race";
    sse_stream(&mut h, path);
    let head = headers::request_head(
        "POST",
        path,
        Some("application/json"),
        Some("*/*"),
        None,
        None,
    );
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"c","version":"1"}}});
    h.request(ctx(2), 1, head, init);
    // The answer on the stream overtakes the POST's 202.
    let result = json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}});
    h.sse(ctx(1), 1, event("message", result.to_string()));
    h.head(ctx(2), 1, headers::response_head(202, None, None));
    h.end(ctx(2), 1, BodyEnd::Complete);
    let hs = h.of("handshake");
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0]["outcome"], "accepted", "{:?}", hs[0]);
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0]["http_status"], 202, "{:?}", ex[0]);
}

#[test]
fn mcp_param_headers_beyond_those_kept_raise_no_mismatch() {
    let mut h = Harness::new();
    // A tool with 20 `x-mcp-header` parameters: 16 are kept, in schema order.
    let props: serde_json::Map<String, Value> = (0..20)
        .map(|i| {
            (
                format!("p{i:02}"),
                json!({"type":"string","x-mcp-header":format!("P{i:02}")}),
            )
        })
        .collect();
    let tools =
        json!({"tools":[{"name":"wide","inputSchema":{"type":"object","properties":props}}]});
    h.answered(
        ctx(1),
        1,
        modern_post("tools/list"),
        declared(1, "tools/list", &json!({})),
        tools,
    );
    // A conformant client sends all 20 headers, in another order: HTTP keeps the first 16.
    let mut head = modern_post("tools/call");
    headers::set_request_mcp_headers(&mut head, Some("tools/call"), Some("wide"));
    head.prefixed = (4..20)
        .rev()
        .map(|i| (format!("Mcp-Param-P{i:02}"), format!("v{i}")))
        .collect();
    head.prefixed_truncated = true;
    let args: serde_json::Map<String, Value> = (0..20)
        .map(|i| (format!("p{i:02}"), json!(format!("v{i}"))))
        .collect();
    let mut call = declared(2, "tools/call", &json!({}));
    call["params"]["name"] = json!("wide");
    call["params"]["arguments"] = Value::Object(args);
    h.answered(ctx(1), 2, head, call, json!({"content":[]}));
    assert!(h.of("alert").is_empty(), "{:?}", h.of("alert"));
    assert!(h.limit_hits(Limit::ParamHeaders) > 0);
}

#[test]
fn declarations_beyond_the_logged_sets_are_counted() {
    let mut h = Harness::new();
    let sets = crate::mcp::session::MAX_LOGGED_SETS + 4;
    for round in 0..2u64 {
        for i in 0..sets as u64 {
            let id = round * 1000 + i;
            let caps = json!({ format!("c{i}"): {} });
            // Methods of their own, so that no set is compared with another.
            let method = format!("x/m{}", i % 8);
            h.answered(
                ctx(1),
                id,
                modern_post(&method),
                declared(id, &method, &caps),
                json!({}),
            );
        }
    }
    let logged = h.of("handshake").len();
    // Each set once, but for those beyond the bound, logged on each of their two rounds.
    assert_eq!(logged, sets + 4);
    assert!(h.limit_hits(Limit::LineageDeclarations) >= 8);
}

#[test]
fn input_required_exchanges_are_charged_for_their_strings() {
    let mut h = Harness::new();
    let method = format!("x/{}", "a".repeat(64 * 1024));
    let result = json!({"resultType":"input_required","inputRequests":{"k":{"method":"elicitation/create"}}});
    h.answered(
        ctx(1),
        1,
        modern_post(&method),
        declared(1, &method, &json!({})),
        result,
    );
    assert!(h.of("exchange").is_empty(), "held for its retry");
    // The method is held three times: the lineage's declarations, the waiting entry and its
    // exchange event.
    assert!(
        h.t.session_bytes() >= 3 * 64 * 1024,
        "{}",
        h.t.session_bytes()
    );
}

/// The fleet store as the adapter keeps it, in memory: records with versions
/// (compare-and-set) and the claims that make each alert fleet-wide once.
#[derive(Default)]
struct MemoryStore {
    records: std::collections::HashMap<String, (u64, String)>,
    claims: std::collections::HashSet<String>,
    lookups: Vec<String>,
    writes: Vec<String>,
    published: Vec<Value>,
}

impl MemoryStore {
    /// Serves the store requests of `h`'s latest outputs, as `fleet::serve` does.
    fn serve(&mut self, h: &mut Harness, from: usize) {
        use crate::model::{Event, SharedRequest};
        let mut at = from;
        while at < h.out.len() {
            let Output::Shared(request) = h.out[at].clone() else {
                at += 1;
                continue;
            };
            let now = Timestamp(h.now);
            match request {
                SharedRequest::Lookup { key } => {
                    self.lookups.push(key.clone());
                    let record = self.records.get(&key).map(|(_, r)| r.clone());
                    h.t.on_shared_state(&key, record.as_deref(), now, &mut h.out);
                }
                SharedRequest::Update {
                    key,
                    record,
                    base_version,
                    version,
                    alerts,
                    ..
                } => {
                    // Claims are taken whether the write wins or not (SET NX).
                    for a in alerts {
                        if self.claims.insert(a.dedup)
                            && let Event::Alert(alert) = &a.event
                        {
                            self.published
                                .push(serde_json::to_value(alert).expect("json"));
                        }
                    }
                    let stored = self.records.get(&key).map_or(0, |(v, _)| *v);
                    if stored == base_version || stored == 0 {
                        self.writes.push(key.clone());
                        self.records.insert(key, (version, record));
                    } else {
                        let theirs = self.records[&key].1.clone();
                        h.t.on_shared_conflict(&key, &theirs, now, &mut h.out);
                    }
                }
            }
            at += 1;
        }
    }
}

/// A modern lineage without load-balancer affinity: its requests alternate between two
/// instances sharing a store. Each instance looks the lineage up once, writes only when what
/// detection uses changed, and the narrowing is published once.
#[test]
fn a_modern_lineage_alternating_between_instances_narrows_once() {
    let mut store = MemoryStore::default();
    let mut hosts = [Harness::new(), Harness::new()];
    for h in &mut hosts {
        h.t.enable_fleet();
    }
    let full = json!({"roots":{"listChanged":true},"sampling":{},"elicitation":{}});
    let narrowed = json!({"roots":{"listChanged":true}});
    let sets = [
        &full, &full, &full, &full, &narrowed, &narrowed, &narrowed, &narrowed,
    ];
    for (n, caps) in sets.iter().enumerate() {
        let h = &mut hosts[n % 2];
        h.now = 1_000_000_000 + n as i64 * 10_000_000;
        let from = h.out.len();
        let id = n as u64 + 1;
        h.answered(
            ctx(n as u64 + 1),
            0,
            modern_post("tools/list"),
            declared(id, "tools/list", caps),
            json!({"tools":[]}),
        );
        store.serve(h, from);
    }
    let local: Vec<Value> = hosts.iter().flat_map(|h| h.of("alert")).collect();
    assert!(local.is_empty(), "alerts wait for the store: {local:?}");
    let kinds: Vec<&str> = store
        .published
        .iter()
        .filter_map(|a| a["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["client_capability_narrowing"],
        "{:?}",
        store.published
    );
    assert_eq!(
        store.published[0]["removed"],
        json!(["elicitation", "sampling"])
    );
    // One lookup per instance; writes: the first declaration, the narrowed set, the alert.
    assert_eq!(store.lookups.len(), 2, "{:?}", store.lookups);
    assert!(store.writes.len() <= 6, "{:?}", store.writes);
    // The full set repeated changed nothing that detection uses: no write for it.
    let first_writes = store.writes.len();
    for n in 0..6u64 {
        let h = &mut hosts[0];
        h.now += 10_000_000;
        let from = h.out.len();
        h.answered(
            ctx(100 + n),
            0,
            modern_post("tools/list"),
            declared(100 + n, "tools/list", &narrowed),
            json!({"tools":[]}),
        );
        store.serve(h, from);
    }
    assert_eq!(store.writes.len(), first_writes, "{:?}", store.writes);
}

/// Sessions one after another on one keep-alive connection: the second is looked up while
/// the connection still waits for the first, so both answers come in one round trip, and
/// nothing is asked twice.
#[test]
fn sessions_queued_on_one_connection_are_looked_up_together() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    h.answered(
        ctx(1),
        0,
        session_post("s-one"),
        legacy_call(1),
        json!({"content":[]}),
    );
    h.answered(
        ctx(1),
        1,
        session_post("s-two"),
        legacy_call(2),
        json!({"content":[]}),
    );
    let asked = lookups_of(&h);
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(h.of("exchange").is_empty(), "held until the store answers");
    let now = Timestamp(h.now);
    for key in &asked {
        h.t.on_shared_state(key, None, now, &mut h.out);
    }
    let exchanges = h.of("exchange");
    let ids: Vec<&Value> = exchanges.iter().map(|e| &e["request_id"]).collect();
    assert_eq!(ids, [&json!(1), &json!(2)], "in order");
    assert_eq!(lookups_of(&h).len(), 2, "nothing asked twice");
}

/// A known session's request on a connection where another session waits for the store is
/// processed at once: only the waiting session's exchange (request and answer) is held.
#[test]
fn a_session_waiting_for_the_store_holds_no_other_session() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    // s-known becomes known on this connection (the store lacked it).
    h.answered(
        ctx(1),
        0,
        session_post("s-known"),
        legacy_call(1),
        json!({"content":[]}),
    );
    let asked = lookups_of(&h);
    let now = Timestamp(h.now);
    h.t.on_shared_state(&asked[0], None, now, &mut h.out);
    assert_eq!(h.of("exchange").len(), 1);
    // The same connection: s-new (unknown: held), then s-known (processed now).
    h.answered(
        ctx(1),
        1,
        session_post("s-new"),
        legacy_call(2),
        json!({"content":[]}),
    );
    h.answered(
        ctx(1),
        2,
        session_post("s-known"),
        legacy_call(3),
        json!({"content":[]}),
    );
    let ids: Vec<Value> = h
        .of("exchange")
        .iter()
        .map(|e| e["request_id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!(1), json!(3)],
        "s-known is not held behind s-new"
    );
    // The connection closes before the store answers: s-new's exchange still comes out
    // whole, and the connection's state is gone afterwards.
    h.t.on_flow_closed(1);
    let asked = lookups_of(&h);
    assert_eq!(asked.len(), 2, "{asked:?}");
    let now = Timestamp(h.now);
    h.t.on_shared_state(&asked[1], None, now, &mut h.out);
    let exchanges = h.of("exchange");
    assert_eq!(exchanges.len(), 3);
    assert_eq!(exchanges[2]["request_id"], json!(2));
    assert_eq!(exchanges[2]["session_id"], json!("s-new"));
    assert_eq!(exchanges[2]["media_type"], json!("json"));
    assert_eq!(
        h.t.exchange_bytes(),
        0,
        "the closed connection's exchanges are gone"
    );
}

/// A known session is read again when it comes back on another connection (where a load
/// balancer may have moved it between hosts), not on the connection it used last.
#[test]
fn a_known_session_on_another_connection_is_read_again() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let post = session_post("s-moves");
    let mut answered = 0;
    h.answered(
        ctx(1),
        0,
        post.clone(),
        legacy_call(1),
        json!({"content":[]}),
    );
    answer_new_lookups(&mut h, &mut answered);
    h.answered(
        ctx(1),
        1,
        post.clone(),
        legacy_call(2),
        json!({"content":[]}),
    );
    answer_new_lookups(&mut h, &mut answered);
    assert_eq!(answered, 1, "the same connection: not read again");
    h.answered(
        ctx(2),
        0,
        post.clone(),
        legacy_call(3),
        json!({"content":[]}),
    );
    assert_eq!(h.of("exchange").len(), 2, "held until the store answers");
    // Its next request on the first connection does not overtake the held one.
    h.answered(
        ctx(1),
        2,
        post.clone(),
        legacy_call(4),
        json!({"content":[]}),
    );
    assert_eq!(h.of("exchange").len(), 2, "waits behind the read");
    answer_new_lookups(&mut h, &mut answered);
    assert_eq!(answered, 2, "another connection: read again, once");
    let ids: Vec<Value> = h
        .of("exchange")
        .iter()
        .map(|e| e["request_id"].clone())
        .collect();
    assert_eq!(ids, [json!(1), json!(2), json!(3), json!(4)], "in order");
    // Both connections are remembered: going back and forth reads nothing again.
    for (n, c) in [ctx(2), ctx(1), ctx(2)].into_iter().enumerate() {
        h.answered(
            c,
            10 + n as u64,
            post.clone(),
            legacy_call(5 + n as u64),
            json!({"content":[]}),
        );
    }
    answer_new_lookups(&mut h, &mut answered);
    assert_eq!(answered, 2);
    assert_eq!(h.of("exchange").len(), 7);
}

/// An HTTP+SSE session's POSTs on a new connection are not read again: their answers come
/// on the GET stream (another connection), which would overtake a held POST.
#[test]
fn http_sse_posts_on_a_new_connection_are_not_held() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let mut answered = 0;
    let path = "/messages/?session_id=abc123";
    sse_stream(&mut h, path);
    answer_new_lookups(&mut h, &mut answered);
    for (n, flow) in [2u64, 3, 4].into_iter().enumerate() {
        let head = headers::request_head(
            "POST",
            path,
            Some("application/json"),
            Some("*/*"),
            None,
            None,
        );
        let c = ctx(flow);
        h.request(
            c,
            0,
            head,
            json!({"jsonrpc":"2.0","id":n,"method":"tools/list"}),
        );
        h.head(c, 0, headers::response_head(202, None, None));
        h.end(c, 0, BodyEnd::Complete);
        h.sse(
            ctx(1),
            1,
            event(
                "message",
                json!({"jsonrpc":"2.0","id":n,"result":{"tools":[]}}).to_string(),
            ),
        );
        answer_new_lookups(&mut h, &mut answered);
    }
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 3, "{:?}", h.events());
    assert!(ex.iter().all(|e| e["answered"] == json!(true)), "{ex:?}");
}

/// HTTP+SSE first contact in fleet mode: the GET stream is not held, so its `endpoint` event
/// binds the `initialize` POST that follows on another connection before the store answers.
#[test]
fn http_sse_first_contact_binds_its_posts_in_fleet_mode() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let path = "/messages/?session_id=first1";
    sse_stream(&mut h, path);
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"c","version":"1"}}});
    sse_post(&mut h, 1, path, init);
    let result = json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2024-11-05",
        "capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}});
    h.sse(ctx(1), 1, event("message", result.to_string()));
    let mut answered = 0;
    answer_new_lookups(&mut h, &mut answered);
    let ex = h.of("exchange");
    assert_eq!(ex.len(), 1, "{:?}", h.events());
    assert_eq!(ex[0]["session_id"], json!("first1"));
    assert_eq!(ex[0]["answered"], json!(true));
    assert_eq!(h.of("handshake").len(), 1);
}

/// Many lineages queued on one connection (a proxy's, or an attacker's): each request waits
/// for its own lineage only, so releasing them processes each once — not the rest of the
/// queue again at every release (quadratic).
#[test]
fn lineages_queued_on_one_connection_are_released_in_linear_time() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let n = 300u64;
    for id in 0..n {
        let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/list","params":{"_meta":{
            "io.modelcontextprotocol/protocolVersion":"2026-07-28",
            "io.modelcontextprotocol/clientInfo":{"name":format!("agent-{id}"),"version":"1"},
            "io.modelcontextprotocol/clientCapabilities":{}}}});
        h.answered(
            ctx(1),
            id,
            modern_post("tools/list"),
            body,
            json!({"tools":[]}),
        );
    }
    let asked = lookups_of(&h);
    assert_eq!(asked.len() as u64, n, "one lookup per lineage");
    let now = Timestamp(h.now);
    // Answered one by one, first first: the worst order for a chain behind the connection's
    // first waiting request.
    for key in &asked {
        h.t.on_shared_state(key, None, now, &mut h.out);
    }
    assert_eq!(h.of("exchange").len() as u64, n);
    // Each request and its three answer messages, once.
    assert!(
        h.t.fleet_replayed() <= 4 * n,
        "{} messages processed again for {n} requests",
        h.t.fleet_replayed()
    );
}

/// A session restored from a snapshot file in fleet mode is read from the store on its first
/// request (another host may have changed it while this one was down).
#[test]
fn a_session_restored_from_a_snapshot_is_read_from_the_store() {
    let mut before = Harness::new();
    before.answered(
        ctx(1),
        0,
        session_post("s-restored"),
        legacy_call(1),
        json!({"content":[]}),
    );
    let snap = before.t.export_state();
    let mut h = Harness::new();
    h.t.enable_fleet();
    let now = Timestamp(h.now);
    h.t.import_state(snap, now, &mut h.out);
    assert_eq!(h.t.active_sessions(), 1);
    h.answered(
        ctx(5),
        0,
        session_post("s-restored"),
        legacy_call(2),
        json!({"content":[]}),
    );
    let asked = lookups_of(&h);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].starts_with("session:"), "{asked:?}");
    assert!(h.of("exchange").is_empty(), "held until the store answers");
    let now = Timestamp(h.now);
    h.t.on_shared_state(&asked[0], None, now, &mut h.out);
    assert_eq!(h.of("exchange").len(), 1);
}

/// A session record a version 2 host wrote names its SHA-256 route buckets `route` and
/// `lineage_route` (fleet session records carry no version): adopted here they read as
/// absent, so this host's snapshot never carries a bucket its router does not name.
#[test]
fn a_version_2_hosts_session_record_brings_no_route_buckets() {
    let mut other = Harness::new();
    other.answered(
        ctx(1),
        0,
        session_post("s-moved"),
        legacy_call(1),
        json!({"content":[]}),
    );
    let entry = other
        .t
        .export_state()
        .sessions
        .into_iter()
        .find(|e| e.key == "s-moved")
        .expect("entry");
    let mut record = serde_json::to_value(&entry).expect("json");
    let fields = record.as_object_mut().expect("object");
    fields.remove("bucket");
    fields.remove("lineage_bucket");
    fields.insert("route".into(), 4242.into());
    fields.insert("lineage_route".into(), 4242.into());
    let mut h = Harness::new();
    h.t.enable_fleet();
    h.answered(
        ctx(5),
        0,
        session_post("s-moved"),
        legacy_call(2),
        json!({"content":[]}),
    );
    let asked = lookups_of(&h);
    assert_eq!(asked.len(), 1, "{asked:?}");
    let now = Timestamp(h.now);
    h.t.on_shared_state(&asked[0], Some(&record.to_string()), now, &mut h.out);
    assert_eq!(h.of("exchange").len(), 1);
    let adopted =
        h.t.export_state()
            .sessions
            .into_iter()
            .find(|e| e.key == "s-moved")
            .expect("adopted");
    assert!(adopted.requests > entry.requests, "the record was adopted");
    assert_ne!(adopted.route, Some(4242));
    assert_ne!(adopted.lineage_route, Some(4242));
}

/// A legacy `initialize` waits for its lineage; the session its answer creates follows on
/// the same connection and waits behind it (not looked up: the initialize created it).
#[test]
fn a_new_session_waits_behind_its_connections_initialize() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}});
    let mut head = headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        None,
        None,
    );
    head.set(RequestHeader::Host, Some("mcp.example"));
    h.request(ctx(1), 0, head, init);
    h.head(
        ctx(1),
        0,
        headers::response_head(200, Some("application/json"), Some("s-fresh")),
    );
    h.json(
        ctx(1),
        0,
        json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{}}}),
    );
    h.end(ctx(1), 0, BodyEnd::Complete);
    let post = headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        Some("s-fresh"),
        Some("2025-06-18"),
    );
    h.answered(
        ctx(1),
        1,
        post,
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t"}}),
        json!({"content":[]}),
    );
    let asked = lookups_of(&h);
    assert_eq!(asked.len(), 1, "only the lineage: {asked:?}");
    assert!(h.of("handshake").is_empty() && h.of("exchange").is_empty());
    let now = Timestamp(h.now);
    h.t.on_shared_state(&asked[0], None, now, &mut h.out);
    assert_eq!(h.of("handshake").len(), 1);
    let ids: Vec<Value> = h
        .of("exchange")
        .iter()
        .map(|e| e["request_id"].clone())
        .collect();
    assert_eq!(ids, [json!(1), json!(2)], "in order");
    assert_eq!(lookups_of(&h).len(), 1, "the new session was not looked up");
}

// ---- review14 ----

/// A legacy POST naming session `sid`.
fn session_post(sid: &str) -> RequestHead {
    headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        Some(sid),
        Some("2025-06-18"),
    )
}

/// A `tools/call` request numbered `id`.
fn legacy_call(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"t"}})
}

fn lookups_of(h: &Harness) -> Vec<String> {
    h.out
        .iter()
        .filter_map(|o| match o {
            Output::Shared(crate::model::SharedRequest::Lookup { key }) => Some(key.clone()),
            _ => None,
        })
        .collect()
}

fn updates_of(h: &Harness) -> Vec<String> {
    h.out
        .iter()
        .filter_map(|o| match o {
            Output::Shared(crate::model::SharedRequest::Update { key, .. }) => Some(key.clone()),
            _ => None,
        })
        .collect()
}

/// One modern lineage reaching two backend addresses behind one Host (same server identity):
/// one fleet key, two table keys. Both requests must come out once the store answers.
#[test]
fn one_fleet_key_two_backends_nothing_held_forever() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let caps = json!({"roots":{}});
    let mut other = ctx(2);
    other.server = "10.0.0.3:8080".parse().expect("addr");
    h.request(
        ctx(1),
        0,
        modern_post("tools/list"),
        declared(1, "tools/list", &caps),
    );
    h.request(
        other,
        0,
        modern_post("tools/list"),
        declared(2, "tools/list", &caps),
    );
    let asked = lookups_of(&h);
    let now = Timestamp(h.now);
    for key in &asked {
        h.t.on_shared_state(key, None, now, &mut h.out);
    }
    for c in [ctx(1), other] {
        h.head(
            c,
            0,
            headers::response_head(200, Some("application/json"), None),
        );
        h.json(c, 0, json!({"jsonrpc":"2.0","id":1,"result":{"tools":[]}}));
        h.end(c, 0, BodyEnd::Complete);
    }
    assert_eq!(
        h.of("exchange").len(),
        2,
        "lookups {asked:?}: one flow still held"
    );
}

/// A session the store lacked, created here, evicted/idled out, then seen again: its state
/// (written by this instance) must be asked for again.
#[test]
fn absent_session_is_looked_up_again_after_it_ended_here() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let post = session_post("s-1");
    h.request(ctx(1), 0, post.clone(), legacy_call(1));
    let asked = lookups_of(&h);
    assert_eq!(asked.len(), 1);
    let now = Timestamp(h.now);
    h.t.on_shared_state(&asked[0], None, now, &mut h.out);
    // Idle out locally.
    h.now += SessionLimits::default().session_idle_timeout_ns + 1_000_000_000;
    h.t.sweep(Timestamp(h.now), &mut h.out);
    assert_eq!(h.t.active_sessions(), 0);
    h.request(ctx(2), 0, post, legacy_call(2));
    assert_eq!(lookups_of(&h).len(), 2, "seen again: asked again");
}

/// A lineage adopted from the store and then seen declaring the same set: nothing that
/// detection uses changed, so nothing is written.
#[test]
fn adopted_lineage_is_not_written_back_unchanged() {
    let caps = json!({"roots":{}});
    let mut a = Harness::new();
    a.t.enable_fleet();
    a.answered(
        ctx(1),
        0,
        modern_post("tools/list"),
        declared(1, "tools/list", &caps),
        json!({"tools":[]}),
    );
    let key = lookups_of(&a)[0].clone();
    let now = Timestamp(a.now);
    a.t.on_shared_state(&key, None, now, &mut a.out);
    let record = a
        .out
        .iter()
        .rev()
        .find_map(|o| match o {
            Output::Shared(crate::model::SharedRequest::Update { key: k, record, .. })
                if *k == key =>
            {
                Some(record.clone())
            }
            _ => None,
        })
        .expect("A writes the lineage");
    let mut b = Harness::new();
    b.t.enable_fleet();
    b.answered(
        ctx(2),
        0,
        modern_post("tools/list"),
        declared(2, "tools/list", &caps),
        json!({"tools":[]}),
    );
    let now = Timestamp(b.now);
    b.t.on_shared_state(&key, Some(&record), now, &mut b.out);
    b.answered(
        ctx(3),
        0,
        modern_post("tools/list"),
        declared(3, "tools/list", &caps),
        json!({"tools":[]}),
    );
    for o in &b.out {
        if let Output::Shared(crate::model::SharedRequest::Update { record: r, .. }) = o {
            eprintln!("A: {record}\nB: {r}");
        }
    }
    assert_eq!(updates_of(&b), Vec::<String>::new(), "B changed nothing");
}

fn answer_new_lookups(h: &mut Harness, answered: &mut usize) {
    loop {
        let asked = lookups_of(h);
        if asked.len() == *answered {
            return;
        }
        for key in &asked[*answered..] {
            let now = Timestamp(h.now);
            h.t.on_shared_state(key, None, now, &mut h.out);
        }
        *answered = asked.len();
    }
}

fn stateless_post() -> RequestHead {
    let mut head = headers::request_head(
        "POST",
        "/mcp",
        Some("application/json"),
        Some("application/json, text/event-stream"),
        None,
        None,
    );
    head.set(RequestHeader::Host, Some("mcp.example"));
    head
}

fn stateless_talk(
    h: &mut Harness,
    c: FlowCtx,
    name: &str,
    sse: bool,
    answered: Option<&mut usize>,
) {
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":name,"version":"1"}}});
    let result =
        json!({"protocolVersion":"2025-06-18","capabilities":{"tools":{"streaming":true}}});
    h.answered(c, 0, stateless_post(), init, result);
    let mut answered = answered;
    if let Some(a) = answered.as_deref_mut() {
        answer_new_lookups(h, a);
    }
    for ex in 1..3u64 {
        let call =
            json!({"jsonrpc":"2.0","id":ex+1,"method":"tools/call","params":{"name":"search"}});
        h.request(c, ex, stateless_post(), call);
        let result = json!({"jsonrpc":"2.0","id":ex+1,"result":{"content":[]}});
        if sse {
            h.head(
                c,
                ex,
                headers::response_head(200, Some("text/event-stream"), None),
            );
            h.sse(c, ex, event("message", result.to_string()));
        } else {
            h.head(
                c,
                ex,
                headers::response_head(200, Some("application/json"), None),
            );
            h.json(c, ex, result);
        }
        h.end(c, ex, BodyEnd::Complete);
        if let Some(a) = answered.as_deref_mut() {
            answer_new_lookups(h, a);
        }
    }
}

/// A stateless endpoint's divergence is the endpoint's alert: it must be claimed under the
/// endpoint's fleet key whatever else changed in the same call.
#[test]
fn endpoint_alert_is_claimed_under_the_endpoint_key() {
    let mut h = Harness::new();
    h.t.enable_fleet();
    let mut answered = 0;
    stateless_talk(&mut h, ctx(1), "x", true, Some(&mut answered));
    assert!(h.of("alert").is_empty(), "{:?}", h.of("alert"));
    // Client y's whole conversation waits behind its lineage's lookup, released at once.
    stateless_talk(&mut h, ctx(2), "y", false, None);
    answer_new_lookups(&mut h, &mut answered);
    let claims: Vec<String> = h
        .out
        .iter()
        .filter_map(|o| match o {
            Output::Shared(crate::model::SharedRequest::Update { alerts, .. }) => Some(alerts),
            _ => None,
        })
        .flatten()
        .map(|a| a.dedup.clone())
        .collect();
    assert!(!claims.is_empty(), "local: {:?}", h.of("alert"));
    assert!(
        claims.iter().all(|d| d.starts_with("endpoint:")),
        "{claims:?}"
    );
}
