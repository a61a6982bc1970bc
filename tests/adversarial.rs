//! Hostile input through the whole pipeline: every case must finish, stay within bounded
//! memory, and be counted. Tests here run one at a time so peak-RSS readings are their own.

use mcptap_core::model::Output;
use mcptap_core::model::{Event, Telemetry, Timestamp};
use mcptap_core::pipeline::{Limits, Pipeline};
use mcptap_testkit::wire::{Link, TcpFrame, tcp};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

/// Peak resident set size of this process in KiB; resettable through clear_refs.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// A TCP connection driven straight into a pipeline, counting what comes out.
struct Conn {
    client: SocketAddr,
    server: SocketAddr,
    cseq: u32,
    sseq: u32,
    ts: i64,
    pipeline: Pipeline,
    out: Vec<Output>,
    telemetry: BTreeMap<String, u64>,
    events: Vec<Event>,
    answered: u64,
    ended: BTreeMap<&'static str, u64>,
    link: Link,
}

const MSS: usize = 1448;

impl Conn {
    fn new(limits: Limits, client_port: u16) -> Self {
        let mut c = Conn {
            client: SocketAddr::from(([10, 0, 0, 2], client_port)),
            server: SocketAddr::from(([10, 0, 0, 1], 8080)),
            cseq: 1000,
            sseq: 5000,
            ts: 1_700_000_000_000_000_000,
            pipeline: Pipeline::new(limits),
            out: Vec::new(),
            telemetry: BTreeMap::new(),
            events: Vec::new(),
            answered: 0,
            ended: BTreeMap::new(),
            link: Link::default(),
        };
        c.handshake();
        c
    }

    fn frame(&mut self, from_client: bool, syn: bool, ack: bool, fin: bool, payload: &[u8]) {
        let (src, dst, seq, ackn) = if from_client {
            (self.client, self.server, self.cseq, self.sseq)
        } else {
            (self.server, self.client, self.sseq, self.cseq)
        };
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let bytes = TcpFrame {
            seq,
            ack: if ack { ackn } else { 0 },
            flags: flag(syn, tcp::SYN) | flag(ack, tcp::ACK) | flag(fin, tcp::FIN),
            ..TcpFrame::new(&self.link, src, dst)
        }
        .to_vec(payload);
        self.ts += 10_000;
        self.pipeline
            .handle_packet(Timestamp(self.ts), 1, &bytes, &mut self.out);
        let adv = payload.len() as u32 + u32::from(syn) + u32::from(fin);
        if from_client {
            self.cseq = self.cseq.wrapping_add(adv);
        } else {
            self.sseq = self.sseq.wrapping_add(adv);
        }
        self.collect();
    }

    fn collect(&mut self) {
        for o in self.out.drain(..) {
            match o {
                Output::Telemetry(t) => {
                    let key = match t {
                        Telemetry::HttpError { reason } => format!("http:{reason}"),
                        Telemetry::JsonRpcError { reason } => format!("jsonrpc:{reason}"),
                        Telemetry::LimitHit { limit } => format!("limit:{limit}"),
                        Telemetry::FlowEvicted { reason } => format!("evicted:{reason}"),
                        other => format!("{other:?}")
                            .split([' ', '{'])
                            .next()
                            .unwrap_or("")
                            .to_string(),
                    };
                    *self.telemetry.entry(key).or_default() += 1;
                }
                // Only what the assertions need is kept, so memory readings are the pipeline's.
                Output::Event(Event::Exchange(x)) => self.answered += u64::from(x.answered),
                Output::Event(Event::SessionEnd(e)) => {
                    *self.ended.entry(e.reason.as_str()).or_default() += 1
                }
                Output::Event(e) => self.events.push(e),
                Output::Shared(_) => {}
            }
        }
    }

    fn handshake(&mut self) {
        self.frame(true, true, false, false, b"");
        self.frame(false, true, true, false, b"");
        self.frame(true, false, true, false, b"");
    }

    fn send(&mut self, from_client: bool, bytes: &[u8]) {
        for chunk in bytes.chunks(MSS) {
            self.frame(from_client, false, true, false, chunk);
        }
    }

    /// Sends `total` bytes made by repeating `pattern`, without materialising them.
    fn send_repeated(&mut self, from_client: bool, pattern: &[u8], total: usize) {
        // A whole number of patterns per block, so the pattern stays aligned across blocks.
        let per_block = (MSS * 64 / pattern.len().max(1)).max(1) * pattern.len();
        let block: Vec<u8> = pattern.iter().copied().cycle().take(per_block).collect();
        let mut left = total;
        while left > 0 {
            let n = left.min(block.len());
            self.send(from_client, &block[..n]);
            left -= n;
        }
    }

    fn count(&self, key: &str) -> u64 {
        self.telemetry.get(key).copied().unwrap_or(0)
    }

    fn alerts(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Alert(_)))
            .count()
    }
}

fn mcp_post(session: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Runs `f` alone and returns how much the peak RSS grew, in MiB.
fn measured(f: impl FnOnce()) -> u64 {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    reset_peak_rss();
    let before = peak_rss_kib();
    f();
    peak_rss_kib().saturating_sub(before) / 1024
}

#[test]
fn ten_gigabyte_content_length_streams_without_buffering() {
    let grew = measured(|| {
        let mut c = Conn::new(Limits::default(), 40000);
        c.send(
            true,
            &mcp_post(
                "s1",
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            ),
        );
        c.send(false, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10737418240\r\n\r\n");
        c.send_repeated(false, b"{\"a\":1}", 64 << 20);
        assert!(c.count("http:message_too_large") >= 1, "{:?}", c.telemetry);
    });
    assert!(grew < 64, "peak RSS grew {grew} MiB");
}

#[test]
fn endless_chunked_body_is_bounded() {
    let grew = measured(|| {
        let mut c = Conn::new(Limits::default(), 40001);
        c.send(
            true,
            &mcp_post(
                "s1",
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            ),
        );
        c.send(false, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
        let chunk: Vec<u8> = b"400\r\n"
            .iter()
            .copied()
            .chain(std::iter::repeat_n(b'x', 1024))
            .chain(*b"\r\n")
            .collect();
        c.send_repeated(false, &chunk, 48 << 20);
        assert!(c.count("http:message_too_large") >= 1, "{:?}", c.telemetry);
    });
    assert!(grew < 64, "peak RSS grew {grew} MiB");
}

#[test]
fn fifty_megabyte_sse_line_without_newline_is_bounded() {
    let grew = measured(|| {
        let mut c = Conn::new(Limits::default(), 40002);
        c.send(
            true,
            &mcp_post(
                "s1",
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            ),
        );
        c.send(
            false,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: ",
        );
        c.send_repeated(false, b"abcdefgh", 50 << 20);
        // The stream continues normally afterwards: the answer still gets through.
        c.send(false, b"\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}}\n\n");
        c.frame(false, false, true, true, b"");
        assert_eq!(c.alerts(), 0, "{:?}", c.events);
        assert_eq!(c.answered, 1, "{:?}", c.telemetry);
        assert!(c.count("http:message_too_large") >= 1, "{:?}", c.telemetry);
    });
    assert!(grew < 64, "peak RSS grew {grew} MiB");
}

#[test]
fn a_hundred_thousand_headers_are_refused_and_counted() {
    let grew = measured(|| {
        let mut c = Conn::new(Limits::default(), 40003);
        let mut head = b"POST /mcp HTTP/1.1\r\n".to_vec();
        for i in 0..100_000 {
            head.extend_from_slice(format!("X-Junk-{i}: v\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        c.send(true, &head);
        let refused = c.count("http:head_too_large") + c.count("http:too_many_headers");
        assert!(refused >= 1, "{:?}", c.telemetry);
        // The connection recovers at the next request.
        c.send(
            true,
            &mcp_post("s1", r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#),
        );
        c.send(false, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}");
        assert_eq!(c.answered, 1, "{:?}", c.telemetry);
    });
    assert!(grew < 64, "peak RSS grew {grew} MiB");
}

#[test]
fn json_nested_a_hundred_thousand_deep_is_an_error_not_a_crash() {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut c = Conn::new(Limits::default(), 40004);
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    c.send(true, &mcp_post("s1", &deep));
    let nested = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"capabilities\":{}1{}}}}}",
        "{\"a\":".repeat(100_000),
        "}".repeat(100_000)
    );
    c.send(true, &mcp_post("s1", &nested));
    let refused = c.count("jsonrpc:invalid_json") + c.count("jsonrpc:not_jsonrpc");
    assert!(refused >= 2, "{:?}", c.telemetry);
}

#[test]
fn invalid_utf8_everywhere() {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut c = Conn::new(Limits::default(), 40005);
    let mut req = b"POST /mcp HTTP/1.1\r\nHost: \xc3\x28\r\nMcp-Session-Id: \xe2\x82\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n".to_vec();
    req.extend_from_slice(b"{\"a\":\"\xff\xff\"}");
    c.send(true, &req);
    c.send(false, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: \xff\r\n\r\ndata: \xff\xfe\xfd\n\n: \xc0\n\n");
    c.frame(false, false, true, true, b"");
    // Nothing to assert beyond survival and no bogus session: the id was not visible ASCII.
    assert!(
        c.count("limit:invalid_session_id") >= 1,
        "{:?}",
        c.telemetry
    );
}

#[test]
fn hostile_session_ids_never_become_sessions() {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut c = Conn::new(Limits::default(), 40006);
    let long = "A".repeat(10 * 1024);
    for sid in ["ctl\x01chars", long.as_str(), "tab\tinside"] {
        c.send(
            true,
            &mcp_post(sid, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
        );
    }
    assert_eq!(c.pipeline.active_sessions(), 0);
    // Refused as a session id, or (control characters) already as a header.
    let refused = c.count("limit:invalid_session_id") + c.count("http:bad_request_head");
    assert_eq!(refused, 3, "{:?}", c.telemetry);
}

#[test]
fn many_distinct_session_ids_are_capped_and_evicted() {
    let grew = measured(|| {
        let mut limits = Limits::default();
        limits.session.max_sessions = 10_000;
        let mut c = Conn::new(limits, 40007);
        let mut batch = Vec::new();
        for i in 0..200_000u32 {
            batch.extend_from_slice(&mcp_post(
                &format!("flood-{i:08x}"),
                r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            ));
            if batch.len() > 64 * 1024 {
                c.send(true, &batch);
                batch.clear();
            }
        }
        c.send(true, &batch);
        assert!(c.pipeline.active_sessions() <= 10_000);
        let evicted = c.ended.get("evicted").copied().unwrap_or(0);
        assert!(evicted >= 190_000, "{evicted}");
        // Pipelined requests without answers are capped too.
        assert!(c.count("http:too_many_pending") > 0, "{:?}", c.telemetry);
    });
    assert!(grew < 256, "peak RSS grew {grew} MiB");
}

#[test]
fn syn_flood_evicts_flows_and_the_faulty_session_still_alerts() {
    let grew = measured(|| {
        let limits = Limits {
            max_flows: 4096,
            ..Limits::default()
        };
        let mut real = Conn::new(limits, 2);
        // Interleave: a handshake, 100k SYNs from distinct ports, a narrowing re-initialize.
        let init = |caps: &str, sid: Option<&str>| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"capabilities":{caps},"clientInfo":{{"name":"a","version":"1"}}}}}}"#
            );
            let hdr = sid
                .map(|s| format!("Mcp-Session-Id: {s}\r\n"))
                .unwrap_or_default();
            format!("POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\n{hdr}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
        };
        let answer = |streaming: bool| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"capabilities":{{"tools":{{"streaming":{streaming}}}}}}}}}"#
            );
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: victim\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
        };
        real.send(true, &init(r#"{"tools":{"streaming":true}}"#, None));
        real.send(false, &answer(true));
        let mut syn = Conn::new(limits, 3);
        std::mem::swap(&mut syn.pipeline, &mut real.pipeline);
        for port in 0..100_000u32 {
            syn.client = SocketAddr::from((
                [10, 1, (port >> 16) as u8, (port >> 8) as u8],
                (port & 0xffff) as u16,
            ));
            syn.frame(true, true, false, false, b"");
        }
        std::mem::swap(&mut syn.pipeline, &mut real.pipeline);
        real.telemetry.append(&mut syn.telemetry);
        real.send(
            true,
            &init(r#"{"tools":{"streaming":false}}"#, Some("victim")),
        );
        real.send(false, &answer(false));
        assert!(
            real.count("evicted:flow_limit") > 90_000,
            "{:?}",
            real.telemetry
        );
        assert_eq!(real.alerts(), 1, "{:?}", real.events);
    });
    assert!(grew < 256, "peak RSS grew {grew} MiB");
}
