//! Writes the seed corpora under `seeds/<target>/` from the fixture captures in
//! `../tests/fixtures`:
//! - `pipeline_capture`: the pcap files themselves, two of them re-encoded as pcapng, and one
//!   pair joined with `FILE_SPLIT` (a two-file merged replay);
//! - `pipeline_frames`: every fixture's frames in the frame format;
//! - `http_sse`: the client and server payload streams of every TCP connection (deduplicated),
//!   in capture order, fed whole or in small pieces;
//! - `jsonrpc_mcp`: per fixture, the HTTP events its connections produce, in time order.
//!
//! Run from `fuzz/`: `cargo run --example gen_seeds`.

use mcptap::capture::read_captures;
use mcptap_core::http::{BodyEnd, Connection, HttpLimits};
use mcptap_core::mcp::HTTP_INTEREST;
use mcptap_fuzz::{FILE_SPLIT, HttpOp, McpOp, encode_frames, encode_http, encode_mcp};
use mcptap_testkit::segment::payload_streams;
use mcptap_testkit::{Frame, Segment, pcapng_bytes};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

struct Packet {
    ts: i64,
    linktype: u32,
    data: Vec<u8>,
}

fn read(path: &Path) -> Vec<Packet> {
    let mut packets = Vec::new();
    read_captures(&[path.display().to_string()], &mut |p| {
        packets.push(Packet {
            ts: p.ts_nanos,
            linktype: p.linktype,
            data: p.data.to_vec(),
        })
    })
    .expect("reading a fixture");
    packets
}

fn segments(packets: &[Packet]) -> Vec<Segment> {
    packets
        .iter()
        .filter_map(|p| Segment::decode(p.ts, p.linktype, &p.data))
        .collect()
}

fn pcapng(packets: &[Packet]) -> Vec<u8> {
    let frames: Vec<Frame> = packets
        .iter()
        .map(|p| Frame {
            ts_nanos: p.ts,
            data: p.data.clone(),
        })
        .collect();
    pcapng_bytes(packets[0].linktype, &frames)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("seed dir");
    std::fs::write(dir.join(name), bytes).expect("writing a seed");
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = root.join("../tests/fixtures");
    let seeds = root.join("seeds");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    paths.sort();
    for t in [
        "pipeline_capture",
        "pipeline_frames",
        "http_sse",
        "jsonrpc_mcp",
    ] {
        let _ = std::fs::remove_dir_all(seeds.join(t));
    }

    let mut http_seen = BTreeSet::new();
    for (fi, path) in paths.iter().enumerate() {
        let stem = path
            .file_stem()
            .expect("stem")
            .to_string_lossy()
            .into_owned();
        let bytes = std::fs::read(path).expect("fixture");
        let packets = read(path);

        // pipeline_capture
        write(
            &seeds.join("pipeline_capture"),
            &format!("{stem}.pcap"),
            &bytes,
        );
        if stem == "chunk_split" || stem == "incident" {
            write(
                &seeds.join("pipeline_capture"),
                &format!("{stem}.pcapng"),
                &pcapng(&packets),
            );
        }
        if stem == "media_flip" {
            let other = std::fs::read(fixtures.join("widening.pcap")).expect("fixture");
            let mut joined = bytes.clone();
            joined.extend_from_slice(FILE_SPLIT);
            joined.extend_from_slice(&other);
            write(&seeds.join("pipeline_capture"), "merged.pcap", &joined);
        }

        // pipeline_frames
        let frames: Vec<(u32, i64, &[u8])> = packets
            .iter()
            .map(|p| (p.linktype, p.ts, p.data.as_slice()))
            .collect();
        write(
            &seeds.join("pipeline_frames"),
            &format!("{stem}.bin"),
            &encode_frames(fi % 4 == 3, &frames),
        );

        // http_sse: one seed per distinct connection, every third one cut into small pieces.
        let segs = segments(&packets);
        let conns = payload_streams(&segs);
        for (ci, c) in conns.iter().enumerate() {
            if c.steps.is_empty() {
                continue;
            }
            let split = if ci % 3 == 2 { 7 } else { 0 };
            let mut ops: Vec<HttpOp> = c
                .steps
                .iter()
                .map(|step| HttpOp::Data {
                    half: step.half,
                    split,
                    bytes: step.bytes.clone(),
                })
                .collect();
            ops.push(HttpOp::Close {
                half: 1,
                how: BodyEnd::ServerClosed,
            });
            let seed = encode_http(true, &ops);
            if http_seen.insert(seed.clone()) {
                write(
                    &seeds.join("http_sse"),
                    &format!("{stem}-{ci:02}.bin"),
                    &seed,
                );
            }
        }

        // jsonrpc_mcp: HTTP events of all connections, in time order, flows reused after close.
        let mut timeline: Vec<(i64, usize, Option<mcptap_core::http::HttpEvent>)> = Vec::new();
        for (ci, c) in conns.iter().enumerate() {
            let mut conn = Connection::new(true, HttpLimits::default(), HTTP_INTEREST);
            for step in &c.steps {
                let mut evs = Vec::new();
                conn.on_data(step.half, &step.bytes, &mut evs);
                timeline.extend(evs.into_iter().map(|e| (step.ts_nanos, ci, Some(e))));
            }
            let mut evs = Vec::new();
            conn.on_close(1, BodyEnd::ServerClosed, &mut evs);
            conn.on_close(0, BodyEnd::ServerClosed, &mut evs);
            timeline.extend(evs.into_iter().map(|e| (c.end_ts, ci, Some(e))));
            timeline.push((c.end_ts, ci, None));
        }
        timeline.sort_by_key(|(ts, ci, ev)| (*ts, ev.is_none(), *ci));
        let mut slots: HashMap<usize, u8> = HashMap::new();
        let mut free: Vec<u8> = (0..6).rev().collect();
        let mut ops = Vec::new();
        let mut prev_ts = timeline.first().map_or(0, |t| t.0);
        for (ts, ci, ev) in timeline {
            let dt = ((ts - prev_ts) / 1_000_000).clamp(0, 0xEF) as u8;
            prev_ts = ts;
            match ev {
                Some(ev) => {
                    let flow = *slots.entry(ci).or_insert_with(|| free.pop().unwrap_or(5));
                    ops.push(McpOp::Http { flow, dt, ev });
                }
                None => {
                    if let Some(flow) = slots.remove(&ci) {
                        ops.push(McpOp::FlowClosed { flow });
                        free.push(flow);
                    }
                }
            }
        }
        ops.push(McpOp::Sweep { dt: 0xFF });
        write(
            &seeds.join("jsonrpc_mcp"),
            &format!("{stem}.bin"),
            &encode_mcp(&ops),
        );
    }
    for t in [
        "pipeline_capture",
        "pipeline_frames",
        "http_sse",
        "jsonrpc_mcp",
    ] {
        let dir = seeds.join(t);
        let (n, size) = std::fs::read_dir(&dir)
            .expect("seed dir")
            .map(|e| e.expect("entry").metadata().expect("meta").len())
            .fold((0, 0), |(n, s), l| (n + 1, s + l));
        let run: fn(&[u8]) -> usize = match t {
            "pipeline_capture" => mcptap_fuzz::run_capture,
            "pipeline_frames" => mcptap_fuzz::run_frames,
            "http_sse" => mcptap_fuzz::run_http,
            _ => mcptap_fuzz::run_mcp,
        };
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("seed dir")
            .map(|e| e.expect("entry").path())
            .collect();
        names.sort();
        let events: Vec<String> = names
            .iter()
            .map(|p| {
                let n = run(&std::fs::read(p).expect("seed"));
                format!("{}={n}", p.file_stem().expect("stem").to_string_lossy())
            })
            .collect();
        println!("{t}: {n} seeds, {size} bytes; events: {}", events.join(" "));
    }
}
