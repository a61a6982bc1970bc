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
