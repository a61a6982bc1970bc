//! HTTP/1.1 MCP (Streamable HTTP) messages, and [`Conversation`], a builder for the
//! application writes of a typical session that [`crate::sim::Sim`] puts on the wire.

use std::fmt::Write as _;

use crate::tcp::AppWrite;

/// The protocol version every message names.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// How the server answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `application/json` with Content-Length.
    Json,
    /// `text/event-stream`, one `message` event in one chunk of a chunked body.
    Sse,
}

/// The client side of the requests: Host header and the client's name and version (also the
/// User-Agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client<'a> {
    pub host: &'a str,
    pub name: &'a str,
    pub version: &'a str,
}

impl Client<'_> {
    /// `POST /mcp` with a JSON body; with `session`, the Mcp-Session-Id and
    /// MCP-Protocol-Version headers.
    pub fn post(&self, body: &str, session: Option<&str>) -> Vec<u8> {
        let mut s = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}/{}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\n",
            self.host, self.name, self.version
        );
        if let Some(sid) = session {
            let _ = write!(
                s,
                "Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\n"
            );
        }
        let _ = write!(
            s,
            "Connection: keep-alive\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.into_bytes()
    }

    /// `DELETE /mcp` ending `session`.
    pub fn delete(&self, session: &str) -> Vec<u8> {
        format!(
            "DELETE /mcp HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}/{}\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\nContent-Length: 0\r\n\r\n",
            self.host, self.name, self.version
        )
        .into_bytes()
    }
}

/// An `initialize` request declaring `capabilities` (a JSON object).
pub fn initialize_request(id: u64, capabilities: &str, name: &str, version: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{capabilities},"clientInfo":{{"name":"{name}","version":"{version}"}}}}}}"#
    )
}

/// An `initialize` result whose `tools` capability is `tools` (a JSON object).
pub fn initialize_result(id: u64, tools: &str, server_name: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{"tools":{tools},"resources":{{"subscribe":true,"listChanged":true}},"prompts":{{"listChanged":true}},"logging":{{}}}},"serverInfo":{{"name":"{server_name}","version":"2.3.0"}}}}}}"#
    )
}

/// The `notifications/initialized` notification.
pub const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// A `tools/call` request of `tool` with `arguments` (a JSON object).
pub fn tools_call_request(id: u64, tool: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
    )
}

/// A successful `tools/call` result with one text content item.
pub fn tool_result(id: u64, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}],"isError":false}}}}"#
    )
}

/// A 200 answer carrying `msg` on `session`, as JSON or as one SSE event in one chunk.
pub fn response(session: &str, answer: Answer, msg: &str) -> Vec<u8> {
    match answer {
        Answer::Json => format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{msg}",
            msg.len()
        )
        .into_bytes(),
        Answer::Sse => {
            let event = format!("event: message\r\ndata: {msg}\r\n\r\n");
            format!(
                "HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {session}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n0\r\n\r\n",
                event.len()
            )
            .into_bytes()
        }
    }
}

/// `202 Accepted` for a notification on `session`.
pub fn accepted(session: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// `200 OK` without a body (the answer to a DELETE).
pub fn empty_ok(session: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// A proxy's `502 Bad Gateway` after losing its upstream; it closes the connection.
pub fn bad_gateway() -> Vec<u8> {
    let body = "502 Bad Gateway: upstream connection reset by peer\n";
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Client capabilities of a streaming-capable client.
pub const FULL_CLIENT_CAPS: &str =
    r#"{"roots":{"listChanged":true},"sampling":{},"tools":{"streaming":true}}"#;
/// The narrowed client capabilities of the incident's re-initialize.
pub const NARROWED_CLIENT_CAPS: &str =
    r#"{"roots":{"listChanged":true},"tools":{"streaming":false}}"#;

/// The application writes of one MCP session, request by request, with ids counted for you.
///
/// ```
/// use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS};
/// let mut c = Conversation::new("s-1");
/// c.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
///     .initialized()
///     .tools_call("hello", Answer::Sse)
///     .delete();
/// assert_eq!(c.writes().len(), 8);
/// ```
#[derive(Debug, Clone)]
pub struct Conversation {
    /// Host header of every request.
    pub host: String,
    /// Client name and version (clientInfo and User-Agent).
    pub client_name: String,
    pub client_version: String,
    /// serverInfo name of initialize results.
    pub server_name: String,
    session_id: String,
    next_id: u64,
    writes: Vec<AppWrite>,
}

impl Conversation {
    /// A session the server will name `session_id`.
    pub fn new(session_id: &str) -> Self {
        Conversation {
            host: "mcp.internal:8080".into(),
            client_name: "testkit-client".into(),
            client_version: "0.1.0".into(),
            server_name: "testkit-server".into(),
            session_id: session_id.into(),
            next_id: 0,
            writes: Vec::new(),
        }
    }

    fn client(&self) -> Client<'_> {
        Client {
            host: &self.host,
            name: &self.client_name,
            version: &self.client_version,
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn handshake(
        &mut self,
        on_session: bool,
        client_caps: &str,
        server_tools: &str,
        answer: Answer,
    ) -> &mut Self {
        let id = self.next_id();
        let body = initialize_request(id, client_caps, &self.client_name, &self.client_version);
        let session = on_session.then_some(self.session_id.as_str());
        let request = self.client().post(&body, session);
        let result = initialize_result(id, server_tools, &self.server_name);
        let reply = response(&self.session_id, answer, &result);
        self.writes.push(AppWrite::client(request));
        self.writes.push(AppWrite::server(reply));
        self
    }

    /// `initialize` without a session; the server answers with the session id.
    pub fn initialize(
        &mut self,
        client_caps: &str,
        server_tools: &str,
        answer: Answer,
    ) -> &mut Self {
        self.handshake(false, client_caps, server_tools, answer)
    }

    /// `initialize` again on the same session id (a client that reconnected).
    pub fn reinitialize(
        &mut self,
        client_caps: &str,
        server_tools: &str,
        answer: Answer,
    ) -> &mut Self {
        self.handshake(true, client_caps, server_tools, answer)
    }

    /// `notifications/initialized`, answered 202.
    pub fn initialized(&mut self) -> &mut Self {
        let request = self.client().post(INITIALIZED, Some(&self.session_id));
        self.writes.push(AppWrite::client(request));
        self.writes
            .push(AppWrite::server(accepted(&self.session_id)));
        self
    }

    /// A `tools/call` answered with one text result.
    pub fn tools_call(&mut self, text: &str, answer: Answer) -> &mut Self {
        let id = self.next_id();
        let body = tools_call_request(id, "search_docs", r#"{"query":"status"}"#);
        let request = self.client().post(&body, Some(&self.session_id));
        self.writes.push(AppWrite::client(request));
        let reply = response(&self.session_id, answer, &tool_result(id, text));
        self.writes.push(AppWrite::server(reply));
        self
    }

    /// A `tools/call` answered by a proxy's 502 (the server should close after it).
    pub fn tools_call_bad_gateway(&mut self) -> &mut Self {
        let id = self.next_id();
        let body = tools_call_request(id, "search_docs", r#"{"query":"status"}"#);
        let request = self.client().post(&body, Some(&self.session_id));
        self.writes.push(AppWrite::client(request));
        self.writes.push(AppWrite::server(bad_gateway()));
        self
    }

    /// `DELETE /mcp`, answered 200.
    pub fn delete(&mut self) -> &mut Self {
        let request = self.client().delete(&self.session_id);
        self.writes.push(AppWrite::client(request));
        self.writes
            .push(AppWrite::server(empty_ok(&self.session_id)));
        self
    }

    /// The session id the server hands out.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The next JSON-RPC request id, for a hand-made exchange.
    pub fn take_request_id(&mut self) -> u64 {
        self.next_id()
    }

    /// A hand-made request and its answer, as raw bytes.
    pub fn exchange(&mut self, request: Vec<u8>, answer: Vec<u8>) -> &mut Self {
        self.writes.push(AppWrite::client(request));
        self.writes.push(AppWrite::server(answer));
        self
    }

    /// A `POST /mcp` of `body` on this conversation's session, as the client sends it.
    pub fn post(&self, body: &str) -> Vec<u8> {
        self.client().post(body, Some(&self.session_id))
    }

    /// Takes the writes so far (the request ids keep counting).
    pub fn take_writes(&mut self) -> Vec<AppWrite> {
        std::mem::take(&mut self.writes)
    }

    /// The writes so far.
    pub fn writes(&self) -> &[AppWrite] {
        &self.writes
    }
}

/// Hostile inputs for the exhaustion tests and benchmarks: small on the wire, costly for a
/// naive monitor.
pub mod hostile {
    /// Seven nested levels under keys of 450 KB each and 500 members at the bottom, so that
    /// each of the 500 dotted paths, built naively, repeats all seven keys (3.15 MB on the
    /// wire, gigabytes of path strings).
    pub fn deep_long_key_capabilities() -> String {
        let key = "k".repeat(450_000);
        let leaves: Vec<String> = (0..500).map(|i| format!(r#""m{i}":true"#)).collect();
        let mut v = format!("{{{}}}", leaves.join(","));
        for level in 0..7 {
            v = format!(r#"{{"{key}{level}":{v}}}"#);
        }
        v
    }

    /// Capabilities with one experimental array of `n` zeros: small on the wire, large as a
    /// tree (a `Value` per zero).
    pub fn array_capabilities(n: usize) -> String {
        let mut zeros = "0,".repeat(n);
        zeros.pop();
        format!(r#"{{"roots":{{"listChanged":true}},"experimental":{{"blob":[{zeros}]}}}}"#)
    }

    /// One JSON-RPC batch of `n` pings and the batch of their answers, in reverse order.
    pub fn ping_batch(n: u64) -> (String, String) {
        let requests: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#))
            .collect();
        let answers: Vec<String> = (0..n)
            .rev()
            .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"result":{{}}}}"#))
            .collect();
        (
            format!("[{}]", requests.join(",")),
            format!("[{}]", answers.join(",")),
        )
    }
}

/// The modern revision (2026-07-28): requests declare themselves in `params._meta` and the
/// mirrored headers; there is no session.
pub mod modern {
    use std::fmt::Write;

    pub const VERSION: &str = "2026-07-28";
    pub const FULL_CAPS: &str = r#"{"roots":{"listChanged":true},"sampling":{},"elicitation":{}}"#;
    pub const RESET_CAPS: &str = r#"{"roots":{"listChanged":true}}"#;

    /// A modern request body: `params` (a JSON object's members, may be empty) plus the
    /// `_meta` declaration of `caps` by client `name`/`version`.
    pub fn request(
        id: u64,
        method: &str,
        params: &str,
        caps: &str,
        name: &str,
        version: &str,
    ) -> String {
        let sep = if params.is_empty() { "" } else { "," };
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{{params}{sep}"_meta":{{"io.modelcontextprotocol/protocolVersion":"{VERSION}","io.modelcontextprotocol/clientInfo":{{"name":"{name}","version":"{version}"}},"io.modelcontextprotocol/clientCapabilities":{caps}}}}}}}"#
        )
    }

    /// `POST /mcp` of a modern request with `MCP-Protocol-Version`, `Mcp-Method` and, given,
    /// `Mcp-Name`; `extra` header lines (each ending in CRLF) go before Content-Length.
    pub fn post(body: &str, method: &str, name: Option<&str>, extra: &str) -> Vec<u8> {
        let mut s = format!(
            "POST /mcp HTTP/1.1\r\nHost: mcp.internal:8080\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: {VERSION}\r\nMcp-Method: {method}\r\n"
        );
        if let Some(n) = name {
            let _ = write!(s, "Mcp-Name: {n}\r\n");
        }
        let _ = write!(s, "{extra}Content-Length: {}\r\n\r\n{body}", body.len());
        s.into_bytes()
    }

    /// A 200 answer without a session id: JSON, or SSE with one event.
    pub fn answer(sse: bool, msg: &str) -> Vec<u8> {
        if sse {
            let event = format!("event: message\r\ndata: {msg}\r\n\r\n");
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n0\r\n\r\n",
                event.len()
            )
            .into_bytes()
        } else {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{msg}",
                msg.len()
            )
            .into_bytes()
        }
    }

    /// A `tools/call` result with text content.
    pub fn tool_result(id: u64) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"complete","content":[{{"type":"text","text":"ok"}}]}}}}"#
        )
    }
}
