//! The core's two entry points agree: every fixture replayed as packets
//! (`Pipeline::handle_packet`) and as the HTTP messages a gateway terminating HTTP would see
//! (`Pipeline::handle_http`) gives the same events.
//!
//! The "gateway" here is a small HTTP/1.1 splitter over each direction's bytes, fed segment by
//! segment with the segment's timestamp, so each message piece carries the time of the packet
//! that completed it, as in the packet path.

use std::net::SocketAddr;
use std::path::Path;

use mcptap::capture::read_captures;
use mcptap_core::http::chunked::ChunkedDecoder;
use mcptap_core::model::{Event, Output, Timestamp};
use mcptap_core::pipeline::{HttpMessage, Limits, Pipeline};
use mcptap_testkit::Segment;

/// How the body after a head is framed (what the gateway's own parser decided).
enum Body {
    Head,
    Length(usize),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// One direction of one connection as the gateway parses it.
struct Direction {
    buf: Vec<u8>,
    body: Body,
    /// Request methods awaiting their response (HEAD responses have no body).
    is_request: bool,
}

struct Conn {
    client: SocketAddr,
    server: SocketAddr,
    to_server: Direction,
    to_client: Direction,
    methods: std::collections::VecDeque<String>,
    fins: u8,
}

/// What the gateway hands to the pipeline, owned.
enum Piece {
    RequestHead(String, String, Vec<(String, Vec<u8>)>),
    ResponseHead(u16, Vec<(String, Vec<u8>)>),
    Body(bool, Vec<u8>),
    End(bool),
}

fn header_value<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn framing(headers: &[(String, Vec<u8>)], is_request: bool, no_body: bool) -> Body {
    if no_body {
        return Body::Length(0);
    }
    if header_value(headers, "transfer-encoding").is_some_and(|v| {
        String::from_utf8_lossy(v)
            .to_ascii_lowercase()
            .contains("chunked")
    }) {
        return Body::Chunked(ChunkedDecoder::new());
    }
    match header_value(headers, "content-length") {
        Some(v) => Body::Length(String::from_utf8_lossy(v).trim().parse().expect("length")),
        None if is_request => Body::Length(0),
        None => Body::UntilClose,
    }
}

/// Splits what `dir` has buffered into message pieces.
fn split(dir: &mut Direction, methods: &mut std::collections::VecDeque<String>) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let side = dir.is_request;
    loop {
        match &mut dir.body {
            Body::Head => {
                let Some(end) = dir.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    break;
                };
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let head_len = end + 4;
                let owned = |hs: &[httparse::Header<'_>]| -> Vec<(String, Vec<u8>)> {
                    hs.iter()
                        .map(|h| (h.name.to_string(), h.value.to_vec()))
                        .collect()
                };
                if side {
                    let mut req = httparse::Request::new(&mut headers);
                    req.parse(&dir.buf[..head_len]).expect("request head");
                    let method = req.method.expect("method").to_string();
                    let hs = owned(req.headers);
                    dir.body = framing(&hs, true, false);
                    methods.push_back(method.clone());
                    pieces.push(Piece::RequestHead(
                        method,
                        req.path.expect("path").into(),
                        hs,
                    ));
                } else {
                    let mut resp = httparse::Response::new(&mut headers);
                    resp.parse(&dir.buf[..head_len]).expect("response head");
                    let status = resp.code.expect("status");
                    let hs = owned(resp.headers);
                    let interim = (100..200).contains(&status);
                    if !interim {
                        let method = methods.pop_front().unwrap_or_default();
                        let no_body = method == "HEAD" || status == 204 || status == 304;
                        dir.body = framing(&hs, false, no_body);
                    }
                    pieces.push(Piece::ResponseHead(status, hs));
                }
                dir.buf.drain(..head_len);
            }
            Body::Length(left) => {
                let take = (*left).min(dir.buf.len());
                if take > 0 {
                    pieces.push(Piece::Body(side, dir.buf.drain(..take).collect()));
                    *left -= take;
                }
                if *left > 0 {
                    break;
                }
                pieces.push(Piece::End(side));
                dir.body = Body::Head;
            }
            Body::Chunked(decoder) => {
                let mut data = Vec::new();
                let status = decoder
                    .push(&dir.buf, &mut |bytes: &[u8]| data.extend_from_slice(bytes))
                    .expect("chunked body");
                dir.buf.drain(..status.consumed);
                if !data.is_empty() {
                    pieces.push(Piece::Body(side, data));
                }
                if !status.done {
                    break;
                }
                pieces.push(Piece::End(side));
                dir.body = Body::Head;
            }
            Body::UntilClose => {
                if !dir.buf.is_empty() {
                    pieces.push(Piece::Body(side, std::mem::take(&mut dir.buf)));
                }
                break;
            }
        }
    }
    pieces
}

fn feed(pipeline: &mut Pipeline, ts: Timestamp, c: &Conn, piece: &Piece, out: &mut Vec<Output>) {
    let borrowed = |hs: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> { hs.to_vec() };
    match piece {
        Piece::RequestHead(method, path, hs) => {
            let hs = borrowed(hs);
            let refs: Vec<(&str, &[u8])> =
                hs.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
            let msg = HttpMessage::RequestHead {
                method,
                path,
                headers: &refs,
            };
            pipeline.handle_http(ts, c.client, c.server, msg, out);
        }
        Piece::ResponseHead(status, hs) => {
            let refs: Vec<(&str, &[u8])> =
                hs.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
            let msg = HttpMessage::ResponseHead {
                status: *status,
                headers: &refs,
            };
            pipeline.handle_http(ts, c.client, c.server, msg, out);
        }
        Piece::Body(true, b) => {
            pipeline.handle_http(ts, c.client, c.server, HttpMessage::RequestBody(b), out)
        }
        Piece::Body(false, b) => {
            pipeline.handle_http(ts, c.client, c.server, HttpMessage::ResponseBody(b), out)
        }
        Piece::End(true) => {
            pipeline.handle_http(ts, c.client, c.server, HttpMessage::RequestEnd, out)
        }
        Piece::End(false) => {
            pipeline.handle_http(ts, c.client, c.server, HttpMessage::ResponseEnd, out)
        }
    }
}

fn events(outputs: Vec<Output>) -> Vec<Event> {
    outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(e),
            Output::Telemetry(_) | Output::Shared(_) => None,
        })
        .collect()
}

/// Both ways through one fixture; returns (packet events, message events).
fn both_ways(path: &Path) -> (Vec<Event>, Vec<Event>) {
    let mut by_packets = Pipeline::new(Limits::default());
    let mut by_messages = Pipeline::new(Limits::default());
    let (mut out_p, mut out_m) = (Vec::new(), Vec::new());
    let mut conns: Vec<Conn> = Vec::new();
    read_captures(&[path.display().to_string()], &mut |pkt| {
        let ts = Timestamp(pkt.ts_nanos);
        by_packets.handle_packet(ts, pkt.linktype, pkt.data, &mut out_p);
        // The gateway's clock runs with the packets, messages or not (a request cut off by the
        // end is reported with the time of the end).
        by_messages.advance_time(ts, &mut out_m);
        let Some(seg) = Segment::decode(pkt.ts_nanos, pkt.linktype, pkt.data) else {
            return;
        };
        // The client is the side that sends the SYN (fixtures capture every connection whole).
        let at = match conns.iter().position(|c| {
            (c.client, c.server) == (seg.src, seg.dst) || (c.client, c.server) == (seg.dst, seg.src)
        }) {
            Some(i) => i,
            None if seg.flags.syn && !seg.flags.ack => {
                let dir = |is_request| Direction {
                    buf: Vec::new(),
                    body: Body::Head,
                    is_request,
                };
                conns.push(Conn {
                    client: seg.src,
                    server: seg.dst,
                    to_server: dir(true),
                    to_client: dir(false),
                    methods: Default::default(),
                    fins: 0,
                });
                conns.len() - 1
            }
            // The last ACK after both FINs.
            None if seg.payload.is_empty() => return,
            None => panic!("{}: data of a connection without SYN", path.display()),
        };
        let c = &mut conns[at];
        let to_server = seg.src == c.client;
        let pieces = {
            let Conn {
                to_server: ts_dir,
                to_client: tc_dir,
                methods,
                ..
            } = c;
            let dir = if to_server { ts_dir } else { tc_dir };
            dir.buf.extend_from_slice(&seg.payload);
            split(dir, methods)
        };
        for piece in &pieces {
            feed(&mut by_messages, ts, c, piece, &mut out_m);
        }
        // The gateway sees the connection end when the server closes it (or either resets),
        // and the client close its side before that.
        if seg.flags.rst || (seg.flags.fin && !to_server) {
            by_messages.handle_http(ts, c.client, c.server, HttpMessage::Closed, &mut out_m);
        } else if seg.flags.fin {
            by_messages.handle_http(
                ts,
                c.client,
                c.server,
                HttpMessage::ClientClosed,
                &mut out_m,
            );
        }
        c.fins += u8::from(seg.flags.fin);
        if seg.flags.rst || c.fins == 2 {
            conns.remove(at);
        }
    })
    .expect("read fixture");
    by_packets.finish(&mut out_p);
    by_messages.finish(&mut out_m);
    (events(out_p), events(out_m))
}

#[test]
fn every_fixture_gives_the_same_events_as_packets_and_as_http_messages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 14);
    for path in paths {
        let (packets, messages) = both_ways(&path);
        assert!(!packets.is_empty(), "{}", path.display());
        assert_eq!(
            packets.len(),
            messages.len(),
            "{}: event counts differ",
            path.display()
        );
        for (p, m) in packets.iter().zip(&messages) {
            assert_eq!(p, m, "{}", path.display());
        }
    }
}
