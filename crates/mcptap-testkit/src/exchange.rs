//! Running one simulated connection through the core's pipeline, and the bytes of a reverse
//! proxy with `gzip on` (nginx's default `gzip_types` plus JSON and event streams): what the
//! HTTP-conformance tests wrap their vectors in.

use std::io::Write as _;

use mcptap_core::limits::Limits;
use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::Pipeline;

use crate::sim::Sim;
use crate::tcp::{AppWrite, Endpoint};

/// The events and telemetry of one connection carrying `writes`, seen from its SYN, cut into
/// segments of `segment` bytes (or MSS-sized with `None`); with `server_closes` the server
/// sends the first FIN (`Connection: close`).
pub fn replay(writes: Vec<AppWrite>, server_closes: bool, segment: Option<usize>) -> Vec<Output> {
    let mut sim = Sim::new(7);
    if let Some(size) = segment {
        sim = sim.with_segment_sizes(vec![size]);
    }
    let mut conn = sim.connect(
        Endpoint::new([10, 0, 0, 2], 40000),
        Endpoint::new([10, 0, 0, 1], 8080),
        writes,
    );
    if server_closes {
        conn = conn.server_closes();
    }
    sim.run(vec![conn]);
    let mut pipeline = Pipeline::new(Limits::default());
    let mut out = Vec::new();
    for f in sim.frames() {
        pipeline.handle_packet(Timestamp(f.ts_nanos), sim.linktype(), &f.data, &mut out);
    }
    pipeline.finish(&mut out);
    out
}

/// `data` gzip-compressed in one piece.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

/// `data` zlib-wrapped deflate (HTTP's `deflate` coding) in one piece.
pub fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

/// One chunk of a chunked body.
fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    if !data.is_empty() {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
}

/// A 200 JSON answer through a `gzip on` proxy: the length dropped, the body gzip-compressed
/// and chunked, as nginx sends it.
pub fn gzip_json_response(session: &str, msg: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nMcp-Session-Id: {session}\r\nContent-Encoding: gzip\r\n\r\n"
    )
    .into_bytes();
    chunk(&mut out, &gzip(msg.as_bytes()));
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// A 200 event stream through a `gzip on` proxy: each event compressed and sync-flushed into
/// its own chunk (nginx flushes the gzip stream on every upstream buffer), the gzip trailer in
/// the last chunk.
pub fn gzip_sse_response(session: &str, events: &[&str]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nMcp-Session-Id: {session}\r\nContent-Encoding: gzip\r\n\r\n"
    )
    .into_bytes();
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for data in events {
        let _ = e.write_all(format!("event: message\ndata: {data}\n\n").as_bytes());
        let _ = e.flush();
        let piece = std::mem::take(e.get_mut());
        chunk(&mut out, &piece);
    }
    let tail = e.finish().unwrap_or_default();
    chunk(&mut out, &tail);
    out.extend_from_slice(b"0\r\n\r\n");
    out
}
