//! Synthetic traffic: MCP sessions and non-MCP bulk flows, interleaved packet by packet.
//! Shared by `gen_capture` (files) and `layers` (in-memory captures).

use std::collections::VecDeque;
use std::fmt::Write as _;

use mcptap_testkit::SplitMix64 as Rng;
use mcptap_testkit::mcp;
use mcptap_testkit::tcp::{AppWrite, Conn, Endpoint, Piece, Pool};

pub use mcptap_testkit::sim::START_NS;
const MCP: usize = 0;
const BULK: usize = 1;
/// Concurrent conversations per category.
const CONCURRENCY: [usize; 2] = [24, 8];

/// What a generation produced.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub packets: u64,
    /// Frame bytes per category (MCP, bulk), pcap record headers included.
    pub mcp_bytes: u64,
    pub bulk_bytes: u64,
    pub sessions: u64,
    pub incidents: u64,
    pub tool_calls: u64,
    pub bulk_flows: u64,
}

/// Generates about `target` bytes (as pcap records: 16-byte header + frame) of which a share
/// `mcp_share` is MCP, handing every frame to `sink` with its timestamp in nanoseconds.
pub fn generate(target: u64, mcp_share: f64, seed: u64, sink: &mut dyn FnMut(i64, &[u8])) -> Stats {
    let mut g = Gen::new(seed);
    let mut stats = Stats::default();
    let budget = [
        (target as f64 * mcp_share) as u64,
        (target as f64 * (1.0 - mcp_share)) as u64,
    ];
    let mut committed = [0u64; 2];
    let mut emitted = [0u64; 2];
    let mut active: [Vec<VecDeque<Conn>>; 2] = [Vec::new(), Vec::new()];
    let mut buf = Vec::with_capacity(2048);
    let mut now = START_NS;
    loop {
        for cat in [MCP, BULK] {
            while active[cat].len() < CONCURRENCY[cat] && committed[cat] < budget[cat] {
                let conns = if cat == MCP {
                    g.mcp_session(&mut stats)
                } else {
                    stats.bulk_flows += 1;
                    g.bulk_flow(budget[cat] - committed[cat])
                };
                committed[cat] += conns.iter().map(Conn::planned_file_bytes).sum::<u64>();
                active[cat].push(conns.into());
            }
        }
        // The category furthest behind its share sends next.
        let cat = match (active[MCP].is_empty(), active[BULK].is_empty()) {
            (true, true) => break,
            (false, true) => MCP,
            (true, false) => BULK,
            (false, false) => {
                if emitted[MCP] as f64 / budget[MCP] as f64
                    <= emitted[BULK] as f64 / budget[BULK] as f64
                {
                    MCP
                } else {
                    BULK
                }
            }
        };
        let i = (g.rng.next_u64() % active[cat].len() as u64) as usize;
        let convo = &mut active[cat][i];
        let conn = convo.front_mut().expect("non-empty conversation");
        if conn.next_packet(&g.pool, now, &mut buf) {
            sink(now, &buf);
            stats.packets += 1;
            emitted[cat] += 16 + buf.len() as u64;
            // 1 Gbit/s: 8 ns per byte on the wire (preamble + IFG included), plus jitter.
            now += (buf.len() as i64 + 24) * 8 + (g.rng.next_u64() % 512) as i64;
        } else {
            convo.pop_front();
            if convo.is_empty() {
                active[cat].swap_remove(i);
            }
        }
    }
    stats.mcp_bytes = emitted[MCP];
    stats.bulk_bytes = emitted[BULK];
    stats
}

struct McpServer {
    ep: Endpoint,
    host: String,
    sse: bool,
}

struct Gen {
    rng: Rng,
    pool: Pool,
    servers: Vec<McpServer>,
    conns: u64,
}

const WORDS: &[&str] = &[
    "the", "of", "request", "latency", "service", "deploy", "error", "rollback", "cluster", "node",
    "pod", "config", "release", "notes", "owner", "incident", "timeline", "metric", "query",
    "table", "index", "user", "account", "billing", "invoice", "region", "zone", "replica",
    "primary", "backup", "snapshot", "volume", "disk", "network", "route", "policy", "token",
    "session", "cache", "hit", "miss", "ratio", "p99", "budget", "alert", "page", "runbook",
    "step", "check", "status", "green", "degraded", "and", "with", "for", "from", "after",
    "before", "while", "retry", "timeout", "queue", "worker", "job",
];

const TOOLS: &[(&str, &str)] = &[
    ("search_docs", "query"),
    ("read_file", "path"),
    ("run_sql", "sql"),
    ("get_ticket", "ticket"),
    ("list_dir", "path"),
    ("fetch_logs", "service"),
];

const CLIENTS: &[(&str, &str)] = &[
    ("claude-code", "1.0.71"),
    ("cursor-vscode", "0.48.2"),
    ("mcp-inspector", "0.16.1"),
    ("fixture-client", "0.4.2"),
];

impl Gen {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let servers = (0..16u8)
            .map(|i| McpServer {
                ep: Endpoint::loopback([127, 10, 0, 10 + i], 8080),
                host: format!("mcp-{i}.internal:8080"),
                sse: i == 0 || rng.chance(0.6),
            })
            .collect();
        Gen {
            pool: Pool::new(seed),
            rng,
            servers,
            conns: 0,
        }
    }

    /// A fresh client endpoint: 4096 client addresses per category, ports cycling above 33000.
    fn client(&mut self, net: u8) -> Endpoint {
        let k = self.conns;
        self.conns += 1;
        let host = (k % 4096) as u16 + 256;
        let port = 33_000 + ((k / 4096) % 28_000) as u16;
        Endpoint::loopback([127, net, (host >> 8) as u8, host as u8], port)
    }

    fn words(&mut self, len: usize) -> String {
        let mut s = String::with_capacity(len + 16);
        while s.len() < len {
            if !s.is_empty() {
                s.push(if self.rng.chance(0.05) { '.' } else { ' ' });
            }
            if self.rng.chance(0.02) {
                s.push_str("\\n");
            }
            let word: &str = self.rng.pick::<&str>(WORDS);
            s.push_str(word);
        }
        s
    }

    fn uuid(&mut self) -> String {
        let a = self.rng.next_u64();
        let b = self.rng.next_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48) & 0x3fff,
            b & 0xffff_ffff_ffff
        )
    }

    /// Non-MCP bulk: a TLS-like transfer (2/3) or plain HTTP downloads (1/3), at most `left`
    /// bytes (but at least 64 KB).
    fn bulk_flow(&mut self, left: u64) -> Vec<Conn> {
        let size = self
            .rng
            .log_uniform(64 << 10, 48 << 20)
            .min(left.max(64 << 10));
        let client = self.client(3);
        let mut writes = Vec::new();
        if self.rng.chance(2.0 / 3.0) {
            let server = Endpoint::loopback([127, 10, 2, self.rng.range(1, 40) as u8], 443);
            let rounds = self.rng.range(1, 4);
            for _ in 0..rounds {
                let req = self.rng.range(120, 900);
                writes.push(AppWrite {
                    from_client: true,
                    pieces: vec![Piece::Tls {
                        len: req,
                        seed: self.rng.next_u64(),
                    }],
                });
                writes.push(AppWrite {
                    from_client: false,
                    pieces: vec![Piece::Tls {
                        len: (size / rounds).max(64),
                        seed: self.rng.next_u64(),
                    }],
                });
            }
            vec![Conn::new(client, server, &mut self.rng, writes)]
        } else {
            let server = Endpoint::loopback([127, 10, 1, self.rng.range(1, 40) as u8], 80);
            let files = self.rng.range(1, 3);
            for _ in 0..files {
                let len = (size / files).max(1);
                let name = self.rng.next_u64();
                let req = format!(
                    "GET /downloads/{name:016x}.tar.zst HTTP/1.1\r\nHost: mirror-{}.internal\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
                    server.ip[3]
                );
                let head = format!(
                    "HTTP/1.1 200 OK\r\nServer: nginx/1.24.0\r\nDate: Thu, 15 Jan 2026 09:00:00 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: {len}\r\nLast-Modified: Mon, 12 Jan 2026 17:21:05 GMT\r\nConnection: keep-alive\r\nETag: \"{name:x}\"\r\nAccept-Ranges: bytes\r\n\r\n"
                );
                writes.push(AppWrite::client(req.into_bytes()));
                writes.push(AppWrite {
                    from_client: false,
                    pieces: vec![
                        Piece::Bytes(head.into_bytes()),
                        Piece::Random {
                            len,
                            seed: self.rng.next_u64(),
                        },
                    ],
                });
            }
            vec![Conn::new(client, server, &mut self.rng, writes)]
        }
    }

    /// One MCP session: one connection, or two for the incident.
    fn mcp_session(&mut self, stats: &mut Stats) -> Vec<Conn> {
        stats.sessions += 1;
        // Sessions 3, 43, 83, ... replay the incident, on a server that answers SSE.
        let incident = stats.sessions % 40 == 3;
        let mut s = (self.rng.next_u64() % self.servers.len() as u64) as usize;
        while incident && !self.servers[s].sse {
            s = (s + 1) % self.servers.len();
        }
        let (server, host, sse) = {
            let srv = &self.servers[s];
            (srv.ep, srv.host.clone(), srv.sse)
        };
        let sid = self.uuid();
        let token = format!("{:016x}{:016x}", self.rng.next_u64(), self.rng.next_u64());
        let (cname, cver) = *self.rng.pick(CLIENTS);
        let ctx = Ctx {
            host,
            token,
            sid,
            cname,
            cver,
        };
        let mut id = 0u64;
        let mut writes = Vec::new();
        let full_caps =
            r#"{"roots":{"listChanged":true},"sampling":{},"tools":{"streaming":true}}"#;
        self.initialize(&ctx, &mut writes, &mut id, false, full_caps, sse, sse);
        self.initialized(&ctx, &mut writes);
        if incident {
            stats.incidents += 1;
            for _ in 0..2 {
                self.tool_call(&ctx, &mut writes, &mut id, sse, false);
                stats.tool_calls += 1;
            }
            // The proxy loses its upstream and closes the connection.
            id += 1;
            writes.push(AppWrite::client(
                ctx.post(&self.tool_call_body(id, false), true),
            ));
            writes.push(AppWrite::server(mcp::bad_gateway()));
            stats.tool_calls += 1;
            let client = self.client(1);
            let first = Conn::new(client, server, &mut self.rng, writes).server_closes();
            // Reconnect; re-initialize on the same session id with reset capabilities.
            let mut writes = Vec::new();
            let narrowed = r#"{"roots":{"listChanged":true},"tools":{"streaming":false}}"#;
            self.initialize(&ctx, &mut writes, &mut id, true, narrowed, true, false);
            self.initialized(&ctx, &mut writes);
            for _ in 0..2 {
                self.tool_call(&ctx, &mut writes, &mut id, false, false);
                stats.tool_calls += 1;
            }
            self.delete(&ctx, &mut writes);
            let client = self.client(1);
            return vec![first, Conn::new(client, server, &mut self.rng, writes)];
        }
        if self.rng.chance(0.6) {
            id += 1;
            writes.push(AppWrite::client(ctx.post(
                &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{{}}}}"#),
                true,
            )));
            let mut tools = String::from(r#"{"tools":["#);
            for (i, (name, arg)) in TOOLS.iter().enumerate() {
                if i > 0 {
                    tools.push(',');
                }
                let desc = self.words(200);
                let _ = write!(
                    tools,
                    r#"{{"name":"{name}","description":"{desc}","inputSchema":{{"type":"object","properties":{{"{arg}":{{"type":"string"}}}},"required":["{arg}"]}}}}"#
                );
            }
            tools.push_str("]}");
            let msg = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{tools}}}"#);
            self.answer(&ctx, &mut writes, sse, &[msg]);
        }
        let calls = self.rng.log_uniform(1, 40);
        for _ in 0..calls {
            let progress = sse && self.rng.chance(0.2);
            self.tool_call(&ctx, &mut writes, &mut id, sse, progress);
            stats.tool_calls += 1;
        }
        if self.rng.chance(0.8) {
            self.delete(&ctx, &mut writes);
        }
        let client = self.client(1);
        vec![Conn::new(client, server, &mut self.rng, writes)]
    }

    #[allow(clippy::too_many_arguments)]
    fn initialize(
        &mut self,
        ctx: &Ctx,
        writes: &mut Vec<AppWrite>,
        id: &mut u64,
        with_session: bool,
        client_caps: &str,
        answer_sse: bool,
        streaming: bool,
    ) {
        *id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{client_caps},"clientInfo":{{"name":"{}","version":"{}"}}}}}}"#,
            ctx.cname, ctx.cver
        );
        writes.push(AppWrite::client(ctx.post(&body, with_session)));
        let tools = if streaming {
            r#"{"listChanged":true,"streaming":true}"#
        } else if answer_sse {
            r#"{"listChanged":true,"streaming":false}"#
        } else {
            r#"{"listChanged":true}"#
        };
        let result = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{tools},"resources":{{"subscribe":true,"listChanged":true}},"prompts":{{"listChanged":true}},"logging":{{}}}},"serverInfo":{{"name":"bench-server","version":"2.3.0"}}}}}}"#
        );
        self.answer(ctx, writes, answer_sse, &[result]);
    }

    fn initialized(&mut self, ctx: &Ctx, writes: &mut Vec<AppWrite>) {
        writes.push(AppWrite::client(ctx.post(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            true,
        )));
        writes.push(AppWrite::server(mcp::accepted(&ctx.sid)));
    }

    fn delete(&mut self, ctx: &Ctx, writes: &mut Vec<AppWrite>) {
        writes.push(AppWrite::client(
            format!(
                "DELETE /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nMcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-06-18\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                ctx.host, ctx.token, ctx.sid
            )
            .into_bytes(),
        ));
        writes.push(AppWrite::server(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: {}\r\nContent-Length: 0\r\n\r\n",
                ctx.sid
            )
            .into_bytes(),
        ));
    }

    fn tool_call_body(&mut self, id: u64, progress: bool) -> String {
        let (name, arg) = *self.rng.pick(TOOLS);
        let n = self.rng.range(2, 8) as usize;
        let value = self.words(n * 6);
        let meta = if progress {
            format!(r#","_meta":{{"progressToken":"p-{id}"}}"#)
        } else {
            String::new()
        };
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{{"{arg}":"{value}"}}{meta}}}}}"#
        )
    }

    fn tool_call(
        &mut self,
        ctx: &Ctx,
        writes: &mut Vec<AppWrite>,
        id: &mut u64,
        sse: bool,
        progress: bool,
    ) {
        *id += 1;
        let id = *id;
        writes.push(AppWrite::client(
            ctx.post(&self.tool_call_body(id, progress), true),
        ));
        let r = self.rng.next_u64() % 100;
        let size = if r < 70 {
            self.rng.log_uniform(150, 4_000)
        } else if r < 95 {
            self.rng.log_uniform(4_000, 48_000)
        } else {
            self.rng.log_uniform(48_000, 400_000)
        } as usize;
        let text = self.words(size);
        let structured = if self.rng.chance(0.3) {
            format!(
                r#","structuredContent":{{"matches":{},"checksum":{}}}"#,
                self.rng.range(0, 50),
                self.rng.range(1_000_000, 9_999_999)
            )
        } else {
            String::new()
        };
        let mut msgs = Vec::new();
        if progress {
            let steps = self.rng.range(1, 3);
            for i in 1..=steps {
                msgs.push(format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"p-{id}","progress":{i},"total":{}}}}}"#,
                    steps + 1
                ));
            }
        }
        msgs.push(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}]{structured},"isError":false}}}}"#
        ));
        self.answer(ctx, writes, sse, &msgs);
    }

    /// Answers the last request: chunked SSE (one event per message, each flushed as one or
    /// more 16 KiB chunks) or one JSON body with Content-Length (last message only).
    fn answer(&mut self, ctx: &Ctx, writes: &mut Vec<AppWrite>, sse: bool, msgs: &[String]) {
        if !sse {
            let body = msgs.last().expect("a message");
            writes.push(AppWrite::server(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: {}\r\nContent-Length: {}\r\nDate: Thu, 15 Jan 2026 09:00:00 GMT\r\n\r\n{body}",
                    ctx.sid,
                    body.len()
                )
                .into_bytes(),
            ));
            return;
        }
        writes.push(AppWrite::server(
            format!(
                "HTTP/1.1 200 OK\r\nCache-Control: no-cache, no-transform\r\nConnection: keep-alive\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {}\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n",
                ctx.sid
            )
            .into_bytes(),
        ));
        for m in msgs {
            let event = format!("event: message\r\ndata: {m}\r\n\r\n");
            for part in event.as_bytes().chunks(16 << 10) {
                let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
                chunk.extend_from_slice(part);
                chunk.extend_from_slice(b"\r\n");
                writes.push(AppWrite::server(chunk));
            }
        }
        writes.push(AppWrite::server(b"0\r\n\r\n".to_vec()));
    }
}

struct Ctx {
    host: String,
    token: String,
    sid: String,
    cname: &'static str,
    cver: &'static str,
}

impl Ctx {
    fn post(&self, body: &str, with_session: bool) -> Vec<u8> {
        let mut s = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}/{}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nAuthorization: Bearer {}\r\n",
            self.host, self.cname, self.cver, self.token
        );
        if with_session {
            let _ = write!(
                s,
                "Mcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-06-18\r\n",
                self.sid
            );
        }
        let _ = write!(
            s,
            "Connection: keep-alive\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.into_bytes()
    }
}
