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
use mcptap_core::decode::{Decoded, decode};
use mcptap_core::mcp::HTTP_INTEREST;
use mcptap_core::http::{BodyEnd, Connection, HttpLimits};
use mcptap_fuzz::{FILE_SPLIT, HttpOp, McpOp, encode_frames, encode_http, encode_mcp};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

struct Packet {
    ts: i64,
    linktype: u32,
    data: Vec<u8>,
}

struct Seg {
    ts: i64,
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    syn: bool,
    fin: bool,
    rst: bool,
    payload: Vec<u8>,
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

fn segments(packets: &[Packet]) -> Vec<Seg> {
    packets
        .iter()
        .filter_map(|p| match decode(p.linktype, &p.data) {
            Decoded::Tcp(s) => Some(Seg {
                ts: p.ts,
                src: s.src,
                dst: s.dst,
                seq: s.seq,
                syn: s.flags.syn,
                fin: s.flags.fin,
                rst: s.flags.rst,
                payload: s.payload.to_vec(),
            }),
            Decoded::Skipped(_) => None,
        })
        .collect()
}

/// One TCP connection: its client (SYN sender) and its in-order data steps.
struct Conn {
    client: SocketAddr,
    /// (ts, half, bytes) with half 0 = client to server; retransmissions dropped.
    steps: Vec<(i64, usize, Vec<u8>)>,
    end_ts: i64,
}

fn connections(segs: &[Seg]) -> Vec<Conn> {
    let mut conns: Vec<Conn> = Vec::new();
    let mut index: HashMap<(SocketAddr, SocketAddr), usize> = HashMap::new();
    let mut next_seq: HashMap<(SocketAddr, SocketAddr), u32> = HashMap::new();
    for s in segs {
        let key = if s.src <= s.dst {
            (s.src, s.dst)
        } else {
            (s.dst, s.src)
        };
        let i = *index.entry(key).or_insert_with(|| {
            conns.push(Conn {
                client: s.src,
                steps: Vec::new(),
                end_ts: s.ts,
            });
            conns.len() - 1
        });
        let c = &mut conns[i];
        c.end_ts = s.ts;
        let data_seq = s.seq.wrapping_add(u32::from(s.syn));
        let expected = next_seq.entry((s.src, s.dst)).or_insert(data_seq);
        if s.syn {
            *expected = data_seq;
        }
        if !s.payload.is_empty() && *expected == data_seq {
            let half = usize::from(s.src != c.client);
            c.steps.push((s.ts, half, s.payload.clone()));
            *expected = data_seq.wrapping_add(s.payload.len() as u32);
        }
        let _ = (s.fin, s.rst);
    }
    conns
}

fn pcapng(packets: &[Packet]) -> Vec<u8> {
    fn block(out: &mut Vec<u8>, block_type: u32, body: &[u8]) {
        let padded = body.len().next_multiple_of(4);
        let total = (12 + padded) as u32;
        out.extend_from_slice(&block_type.to_le_bytes());
        out.extend_from_slice(&total.to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + padded - body.len(), 0);
        out.extend_from_slice(&total.to_le_bytes());
    }
    let mut v = Vec::new();
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut v, 0x0a0d_0d0a, &shb);
    let mut idb = Vec::new();
    idb.extend_from_slice(&(packets[0].linktype as u16).to_le_bytes());
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&262_144u32.to_le_bytes());
    idb.extend_from_slice(&9u16.to_le_bytes()); // if_tsresol
    idb.extend_from_slice(&1u16.to_le_bytes());
    idb.extend_from_slice(&[9, 0, 0, 0]);
    idb.extend_from_slice(&[0, 0, 0, 0]);
    block(&mut v, 1, &idb);
    for p in packets {
        let ts = p.ts as u64;
        let mut epb = Vec::new();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(ts as u32).to_le_bytes());
        epb.extend_from_slice(&(p.data.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(p.data.len() as u32).to_le_bytes());
        epb.extend_from_slice(&p.data);
        block(&mut v, 6, &epb);
    }
    v
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
        let conns = connections(&segs);
        for (ci, c) in conns.iter().enumerate() {
            if c.steps.is_empty() {
                continue;
            }
            let split = if ci % 3 == 2 { 7 } else { 0 };
            let mut ops: Vec<HttpOp> = c
                .steps
                .iter()
                .map(|(_, half, b)| HttpOp::Data {
                    half: *half,
                    split,
                    bytes: b.clone(),
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
            for (ts, half, b) in &c.steps {
                let mut evs = Vec::new();
                conn.on_data(*half, b, &mut evs);
                timeline.extend(evs.into_iter().map(|e| (*ts, ci, Some(e))));
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
