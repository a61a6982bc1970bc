//! Per-layer throughput benchmarks (criterion), bottom to top:
//!
//! decode → reassembly → http (framing) → sse → jsonrpc → the whole pipeline.
//!
//! Every input is built in memory once, up front; each benchmark reports bytes/s of the input
//! it consumes (`Throughput::Bytes`). Measurement times are short so a full `cargo bench` stays
//! around a minute and a half; pass criterion options (e.g. `-- --measurement-time 10`) for
//! steadier numbers, or a filter (`cargo bench --bench layers -- pipeline`) for one group.

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime,
};
use mcptap_core::decode::{self, Decoded, dlt};
use mcptap_core::http::sse::SseParser;
use mcptap_core::http::{Connection, HttpEvent, HttpLimits};
use mcptap_core::mcp::HTTP_INTEREST;
use mcptap_core::model::Timestamp;
use mcptap_core::pipeline::{Limits, Pipeline};
use mcptap_core::reassembly::{PushReport, Reassembler, StreamConsumer};
use mcptap_testkit::SplitMix64 as Rng;
use mcptap_testkit::tcp::{Endpoint, MSS, SegmentHeader, write_segment};
use mcptap_testkit::wire::{
    Link, fix_ipv4_tcp_checksums,
    tcp::{ACK, PSH},
};

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(400))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20);
    g
}

use support::frames::FrameStore as Capture;

/// Every frame through a fresh pipeline; the number of outputs (so that nothing is optimised
/// away).
fn run_pipeline(cap: &Capture) -> usize {
    let mut p = Pipeline::new(Limits::default());
    let mut out = Vec::new();
    let mut outputs = 0;
    for (ts, f) in cap.frames() {
        p.handle_packet(Timestamp(ts), dlt::EN10MB, f, &mut out);
        outputs += out.len();
        out.clear();
    }
    p.finish(&mut out);
    outputs + out.len()
}

fn words(rng: &mut Rng, len: usize) -> String {
    const W: &[&str] = &[
        "service", "latency", "deploy", "rollback", "the", "of", "owner", "query", "index", "retry",
    ];
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        s.push_str(W[(rng.next_u64() % W.len() as u64) as usize]);
        s.push(' ');
    }
    s
}

fn tools_call(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"search_docs","arguments":{{"query":"release notes for the payments service"}}}}}}"#
    )
}

fn tool_result(id: u64, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}],"structuredContent":{{"matches":3,"checksum":1072333}},"isError":false}}}}"#
    )
}

fn post(body: &str) -> Vec<u8> {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: mcp.internal:8080\r\nUser-Agent: claude-code/1.0.71\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nAuthorization: Bearer 0123456789abcdef0123456789abcdef\r\nMcp-Session-Id: 5574c500-9152-4a9f-b80c-707c1e93b3a2\r\nMCP-Protocol-Version: 2025-06-18\r\nConnection: keep-alive\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn json_response(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: 5574c500-9152-4a9f-b80c-707c1e93b3a2\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// SSE event text (one `message` event).
fn sse_event(msg: &str) -> String {
    format!("event: message\r\ndata: {msg}\r\n\r\n")
}

fn sse_response(msgs: &[String]) -> Vec<u8> {
    let mut v = b"HTTP/1.1 200 OK\r\nCache-Control: no-cache, no-transform\r\nConnection: keep-alive\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: 5574c500-9152-4a9f-b80c-707c1e93b3a2\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for m in msgs {
        for part in sse_event(m).as_bytes().chunks(16 << 10) {
            v.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            v.extend_from_slice(part);
            v.extend_from_slice(b"\r\n");
        }
    }
    v.extend_from_slice(b"0\r\n\r\n");
    v
}

/// Result sizes of a typical session: mostly small, some medium, a few large.
fn result_size(rng: &mut Rng, i: u64) -> usize {
    match i % 10 {
        0..=6 => rng.log_uniform(150, 4_000) as usize,
        7 | 8 => rng.log_uniform(4_000, 48_000) as usize,
        _ => rng.log_uniform(48_000, 200_000) as usize,
    }
}

// ---------------------------------------------------------------- decode

fn bench_decode(c: &mut Criterion) {
    let mut rng = Rng(7);
    let server = Endpoint::loopback([127, 10, 0, 10], 8080);
    let payload: Vec<u8> = (0..MSS).map(|i| (i * 31) as u8).collect();
    let mut data_frames = Capture::default();
    let mut ack_frames = Capture::default();
    let mut buf = Vec::new();
    for i in 0..1024u32 {
        let client = Endpoint::loopback([127, 1, (i >> 8) as u8, i as u8], 33_000 + i as u16);
        let mut h = SegmentHeader {
            ip_id: i as u16,
            seq: rng.next_u64() as u32,
            ack: rng.next_u64() as u32,
            flags: ACK | PSH,
            window: 502,
            tsval: i,
            tsecr: i,
        };
        write_segment(&mut buf, &Link::default(), &server, &client, &h, |out| {
            out.extend_from_slice(&payload)
        });
        data_frames.push(0, &buf);
        h.flags = ACK;
        write_segment(&mut buf, &Link::default(), &client, &server, &h, |_| {});
        ack_frames.push(0, &buf);
    }
    let mut g = group(c, "decode");
    for (name, cap) in [
        ("eth_ipv4_tcp_1448", &data_frames),
        ("eth_ipv4_tcp_ack", &ack_frames),
    ] {
        g.throughput(Throughput::Bytes(cap.bytes()));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut n = 0usize;
                for (_, f) in cap.frames() {
                    if let Decoded::Tcp(seg) = decode::decode(dlt::EN10MB, black_box(f)) {
                        n += seg.payload.len();
                    }
                }
                n
            })
        });
    }
    g.finish();
}

/// The live capture thread's per-packet work besides copying: decode the headers, find the
/// server endpoint (configured, learned from SYN/SYN-ACK, or pinned), hash it to a worker.
/// `Throughput::Elements`: packets; ns/packet = 1e9 / the reported rate.
fn bench_dispatch(c: &mut Criterion) {
    use mcptap::live::{Dispatcher, ServerDirectory};
    use mcptap_testkit::wire::tcp::SYN;
    let mut rng = Rng(11);
    // 1024 flows to 16 servers on high ports, clients on low ones: first the handshakes
    // (SYN, SYN-ACK), then data and ACKs both ways, as a capture thread sees them.
    let mut cap = Capture::default();
    let mut buf = Vec::new();
    let payload = vec![b'x'; 600];
    let flows: Vec<(Endpoint, Endpoint)> = (0..1024u32)
        .map(|i| {
            let server =
                Endpoint::loopback([127, 10, 0, (i % 16) as u8 + 1], 60_000 + (i % 16) as u16);
            let client = Endpoint::loopback([127, 1, (i >> 8) as u8, i as u8], 1024 + i as u16);
            (client, server)
        })
        .collect();
    let header = |flags, i: u32, rng: &mut Rng| SegmentHeader {
        ip_id: i as u16,
        seq: rng.next_u64() as u32,
        ack: rng.next_u64() as u32,
        flags,
        window: 502,
        tsval: i,
        tsecr: i,
    };
    for (i, (client, server)) in flows.iter().enumerate() {
        let i = i as u32;
        write_segment(
            &mut buf,
            &Link::default(),
            client,
            server,
            &header(SYN, i, &mut rng),
            |_| {},
        );
        cap.push(0, &buf);
        write_segment(
            &mut buf,
            &Link::default(),
            server,
            client,
            &header(SYN | ACK, i, &mut rng),
            |_| {},
        );
        cap.push(0, &buf);
    }
    for round in 0..4u32 {
        for (i, (client, server)) in flows.iter().enumerate() {
            let i = i as u32 + round;
            write_segment(
                &mut buf,
                &Link::default(),
                client,
                server,
                &header(ACK | PSH, i, &mut rng),
                |o| o.extend_from_slice(&payload),
            );
            cap.push(0, &buf);
            write_segment(
                &mut buf,
                &Link::default(),
                server,
                client,
                &header(ACK, i, &mut rng),
                |_| {},
            );
            cap.push(0, &buf);
        }
    }
    let packets = cap.packets() as u64;
    let mut g = group(c, "dispatch");
    g.throughput(Throughput::Elements(packets));
    for (name, configured) in [("learned_4_workers", false), ("configured_4_workers", true)] {
        let servers: Vec<std::net::SocketAddr> = if configured {
            flows.iter().map(|(_, s)| s.addr()).collect()
        } else {
            Vec::new()
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut d = Dispatcher::new(ServerDirectory::new(servers.iter().copied()), 4);
                let mut n = 0usize;
                for (_, f) in cap.frames() {
                    n += d.worker_of(dlt::EN10MB, black_box(f));
                }
                n
            })
        });
    }
    g.finish();
}

// ---------------------------------------------------------------- reassembly

struct Count(u64);

impl StreamConsumer for Count {
    fn on_data(&mut self, data: &[u8]) {
        self.0 += data.len() as u64;
    }
    fn on_gap(&mut self, _len: u64) {}
}

fn bench_reassembly(c: &mut Criterion) {
    const STREAM: usize = 4 << 20;
    let stream: Vec<u8> = (0..STREAM).map(|i| (i * 7) as u8).collect();
    let isn = 0xfff0_0000u32; // wraps around inside the stream
    let in_order: Vec<(u32, &[u8])> = stream
        .chunks(MSS)
        .enumerate()
        .map(|(i, c)| (isn.wrapping_add(1 + (i * MSS) as u32), c))
        .collect();
    // Out of order: inside each window of 8 segments, every other pair is swapped and the
    // window's first segment arrives last (like a retransmitted loss).
    let mut ooo = Vec::with_capacity(in_order.len());
    for w in in_order.chunks(8) {
        let mut w = w.to_vec();
        for p in w.chunks_mut(2).skip(1).step_by(2) {
            p.reverse();
        }
        w.rotate_left(1);
        ooo.extend(w);
    }
    let mut g = group(c, "reassembly");
    g.throughput(Throughput::Bytes(STREAM as u64));
    for (name, segs) in [("in_order", &in_order), ("out_of_order", &ooo)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut r = Reassembler::new(1 << 20);
                r.on_syn(isn);
                let mut sink = Count(0);
                let mut report = PushReport::default();
                for (seq, p) in segs.iter() {
                    r.push(*seq, p, false, &mut sink, &mut report);
                }
                assert_eq!(sink.0, STREAM as u64);
                sink.0
            })
        });
    }
    g.finish();
}

// ---------------------------------------------------------------- http

/// One connection's worth of traffic, as the reassembler would hand it over: (half, bytes)
/// pieces of at most one segment each. Half 0 is the client.
struct HttpInput {
    pieces: Vec<(usize, Vec<u8>)>,
    bytes: u64,
}

impl HttpInput {
    fn new() -> Self {
        HttpInput {
            pieces: Vec::new(),
            bytes: 0,
        }
    }
    fn write(&mut self, half: usize, data: &[u8]) {
        for seg in data.chunks(MSS) {
            self.pieces.push((half, seg.to_vec()));
        }
        self.bytes += data.len() as u64;
    }
    fn run(&self) -> usize {
        let mut conn = Connection::new(true, HttpLimits::default(), HTTP_INTEREST);
        let mut out: Vec<HttpEvent> = Vec::new();
        let mut events = 0;
        for (half, data) in &self.pieces {
            conn.on_data(*half, data, &mut out);
            events += out.len();
            out.clear();
        }
        events
    }
}

fn bench_http(c: &mut Criterion) {
    let mut rng = Rng(11);
    let mut json = HttpInput::new();
    let mut sse = HttpInput::new();
    for id in 0..200 {
        let size = result_size(&mut rng, id);
        let text = words(&mut rng, size);
        let req = post(&tools_call(id));
        json.write(0, &req);
        json.write(1, &json_response(&tool_result(id, &text)));
        sse.write(0, &req);
        sse.write(1, &sse_response(&[tool_result(id, &text)]));
    }
    // Pipelined: 20 requests in one segment, the answers coalesced, 10 rounds.
    let mut pipelined = HttpInput::new();
    for round in 0..10u64 {
        let mut reqs = Vec::new();
        let mut resps = Vec::new();
        for i in 0..20 {
            let id = round * 20 + i;
            reqs.extend_from_slice(&post(&tools_call(id)));
            let text = words(&mut rng, 300);
            resps.extend_from_slice(&json_response(&tool_result(id, &text)));
        }
        pipelined.write(0, &reqs);
        pipelined.write(1, &resps);
    }
    // A non-MCP file download: the body is skipped by length.
    let mut download = HttpInput::new();
    let body = vec![0x5au8; 4 << 20];
    download.write(0, b"GET /downloads/f.tar.zst HTTP/1.1\r\nHost: mirror.internal\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n");
    let mut resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    resp.extend_from_slice(&body);
    download.write(1, &resp);

    let mut g = group(c, "http");
    for (name, input) in [
        ("content_length_json", &json),
        ("chunked_sse", &sse),
        ("pipelined_json", &pipelined),
        ("download_skipped_body", &download),
    ] {
        g.throughput(Throughput::Bytes(input.bytes));
        g.bench_function(name, |b| b.iter(|| input.run()));
    }
    g.finish();
}

// ---------------------------------------------------------------- sse

fn bench_sse(c: &mut Criterion) {
    let mut rng = Rng(13);
    let mut small = String::new();
    let mut id = 0;
    while small.len() < 1 << 20 {
        id += 1;
        small.push_str(&sse_event(&format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"p-{id}","progress":{id},"total":100000}}}}"#
        )));
        small.push_str(&sse_event(&tool_result(id, &words(&mut rng, 200))));
    }
    let mut large = String::new();
    while large.len() < 1 << 20 {
        id += 1;
        large.push_str(&sse_event(&tool_result(id, &words(&mut rng, 64 << 10))));
    }
    let mut g = group(c, "sse");
    for (name, input) in [
        ("small_events", small.as_bytes()),
        ("64k_events", large.as_bytes()),
    ] {
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut p = SseParser::new(4 << 20);
                let mut out = Vec::new();
                let mut n = 0;
                for piece in input.chunks(MSS) {
                    p.push(piece, &mut out);
                    n += out.len();
                    out.clear();
                }
                n
            })
        });
    }
    g.finish();
}

// ---------------------------------------------------------------- jsonrpc

fn bench_jsonrpc(c: &mut Criterion) {
    let mut rng = Rng(17);
    let request = tools_call(42);
    let small = tool_result(42, &words(&mut rng, 1000));
    let large = tool_result(43, &words(&mut rng, 64 << 10));
    // Tool output with a JSON-escaped newline every ~60 bytes, like file contents or logs.
    let lines = tool_result(44, &words(&mut rng, 64 << 10).replace("e ", "e\\n"));
    let batch = format!(
        "[{}]",
        (0..10)
            .map(|i| tool_result(i, &words(&mut rng, 300)))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut g = group(c, "jsonrpc");
    for (name, input) in [
        ("tools_call_request", &request),
        ("result_1k", &small),
        ("result_64k", &large),
        ("result_64k_newlines", &lines),
        ("batch_10", &batch),
    ] {
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| mcptap_core::jsonrpc::parse(black_box(input.as_bytes())).map(|m| m.len()))
        });
    }
    g.finish();
}

// ---------------------------------------------------------------- pipeline

/// `tests/fixtures/interleaved.pcap` (three MCP sessions) replicated `copies` times: each copy
/// gets its own client ports, sequence numbers and session ids, and starts 997 µs after the
/// previous one, so the copies overlap in time like concurrent clients.
fn replicated_fixture(copies: u32) -> Capture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/interleaved.pcap"
    );
    let mut frames: Vec<(i64, Vec<u8>)> = Vec::new();
    mcptap::capture::read_captures(&[path.to_string()], &mut |pkt| {
        assert_eq!(pkt.linktype, dlt::EN10MB, "fixture link type");
        frames.push((pkt.ts_nanos, pkt.data.to_vec()));
    })
    .expect("reading the fixture");
    let server_port = 18131u16;
    let mut all: Vec<(i64, Vec<u8>)> = Vec::with_capacity(frames.len() * copies as usize);
    for k in 0..copies {
        let delta = k.wrapping_mul(0x0100_0193);
        let tag: Vec<u8> = {
            let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
            (0..4)
                .map(|i| digits[(k / 36u32.pow(3 - i) % 36) as usize])
                .collect()
        };
        for (ts, f) in &frames {
            let mut f = f.clone();
            let ip = 14;
            let ihl = usize::from(f[ip] & 0x0f) * 4;
            let tcp = ip + ihl;
            for port_at in [tcp, tcp + 2] {
                let port = u16::from_be_bytes([f[port_at], f[port_at + 1]]);
                if port != server_port {
                    let new = 20_000 + (k as u16) * 32 + port % 32;
                    f[port_at..port_at + 2].copy_from_slice(&new.to_be_bytes());
                }
            }
            for at in [tcp + 4, tcp + 8] {
                let v = u32::from_be_bytes(f[at..at + 4].try_into().unwrap()).wrapping_add(delta);
                f[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            let payload = tcp + usize::from(f[tcp + 12] >> 4) * 4;
            let mut i = payload;
            while i + 4 <= f.len() {
                if &f[i..i + 4] == b"mix-" {
                    f[i..i + 4].copy_from_slice(&tag);
                    i += 4;
                } else {
                    i += 1;
                }
            }
            fix_ipv4_tcp_checksums(&mut f);
            all.push((ts + i64::from(k) * 997_000, f));
        }
    }
    all.sort_by_key(|(ts, _)| *ts);
    let mut cap = Capture::default();
    for (ts, f) in &all {
        cap.push(*ts, f);
    }
    cap
}

fn synthetic(target: u64, mcp_share: f64, seed: u64) -> Capture {
    let mut cap = Capture::default();
    support::traffic::generate(target, mcp_share, seed, &mut |ts, f| cap.push(ts, f));
    cap
}

fn bench_pipeline(c: &mut Criterion) {
    let inputs = [
        ("interleaved_fixture_x160", replicated_fixture(160)),
        ("synthetic_all_mcp_8mb", synthetic(8_000_000, 1.0, 3)),
        ("synthetic_mixed_16mb", synthetic(16_000_000, 0.10, 5)),
    ];
    // MCPTAP_BENCH_DUMP=DIR writes these captures as pcap files, to look at them with
    // `mcptap replay` or tshark.
    if let Some(dir) = std::env::var_os("MCPTAP_BENCH_DUMP") {
        std::fs::create_dir_all(&dir).expect("creating MCPTAP_BENCH_DUMP");
        for (name, cap) in &inputs {
            let path = std::path::Path::new(&dir).join(format!("{name}.pcap"));
            let file = std::fs::File::create(&path).expect("creating dump file");
            let mut w = mcptap_testkit::PcapWriter::new(
                std::io::BufWriter::new(file),
                mcptap_testkit::capture::PcapHeader::micros(dlt::EN10MB),
            )
            .expect("pcap header");
            for (ts, f) in cap.frames() {
                w.write(ts, f).expect("writing dump");
            }
            std::io::Write::flush(&mut w.into_inner()).expect("flushing dump");
        }
    }
    let mut g = group(c, "pipeline");
    for (name, cap) in &inputs {
        assert!(
            run_pipeline(cap) > 0,
            "{name}: the pipeline produced nothing"
        );
        g.throughput(Throughput::Bytes(cap.bytes()));
        g.bench_function(*name, |b| b.iter(|| run_pipeline(cap)));
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_decode,
    bench_dispatch,
    bench_reassembly,
    bench_http,
    bench_sse,
    bench_jsonrpc,
    bench_pipeline
);
criterion_main!(benches);
