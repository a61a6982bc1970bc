//! HTTP/1.1 message framing over a reassembled TCP connection.
//!
//! Each direction of a connection gets a [`HalfParser`]; the [`Connection`] pairs requests with
//! responses in order (pipelining, keep-alive). Heads are parsed with `httparse`; bodies with a
//! push state machine (Content-Length, chunked, read-until-close). HTTP knows no protocol above
//! it: the layer above names, in an [`Interest`], the headers to copy out and the exchanges to
//! keep; their bodies are kept (JSON) or parsed as SSE, every other body is skipped by length
//! without buffering.

mod buffer;
pub mod chunked;
pub mod sse;

use crate::http::sse::{SseItem, SseParser};
use buffer::grow_for;
use chunked::ChunkedDecoder;
use std::collections::VecDeque;
use std::mem::MaybeUninit;

pub use crate::limits::HttpLimits;

/// Most headers a layer above can ask HTTP to copy out of a head (see [`Interest`]).
pub const MAX_EXTRACTED_HEADERS: usize = 4;

/// Values of the headers an [`Interest`] names, by the index of the name in its list.
pub type ExtractedHeaders = [Option<String>; MAX_EXTRACTED_HEADERS];

/// What the layer above wants from HTTP, which knows no protocol above itself: the headers to
/// copy out of request and response heads, and which exchanges are worth keeping (request body
/// buffered, response parsed as JSON or SSE). Everything else is skipped by length, unbuffered.
#[derive(Debug, Clone, Copy)]
pub struct Interest {
    /// Request header names (case-insensitive), at most [`MAX_EXTRACTED_HEADERS`]; their
    /// values land in [`RequestHead::extracted`] at the same index.
    pub request_headers: &'static [&'static str],
    /// Response header names, as for requests, into [`ResponseHead::extracted`].
    pub response_headers: &'static [&'static str],
    /// Whether the exchange a request opens is kept.
    pub keeps: fn(&RequestHead) -> bool,
}

impl Interest {
    /// Keeps every exchange with a JSON request body or an event-stream `Accept`, and no headers
    /// beyond the generic ones.
    pub const JSON_AND_SSE: Interest = Interest {
        request_headers: &[],
        response_headers: &[],
        keeps: RequestHead::may_carry_json_or_sse,
    };
}

/// The request facts later layers need: the generic ones plus the headers the [`Interest`]
/// names. Other headers (Authorization, Cookie, ...) are never copied out of the packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub path: String,
    pub host: Option<String>,
    pub accept: Option<String>,
    pub content_type: Option<String>,
    pub extracted: ExtractedHeaders,
}

impl RequestHead {
    /// A POST with a JSON body, or a GET that accepts an event stream.
    pub fn may_carry_json_or_sse(&self) -> bool {
        (self.method == "POST" && self.content_type.as_deref().is_some_and(is_json))
            || (self.method == "GET"
                && self
                    .accept
                    .as_deref()
                    .is_some_and(|a| a.to_ascii_lowercase().contains("text/event-stream")))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// Media type, lowercased, without parameters.
    pub media_type: Option<String>,
    pub extracted: ExtractedHeaders,
}

/// Records one request header in `head`: the generic ones and those `interest` names.
fn note_request_header(head: &mut RequestHead, interest: &Interest, name: &str, value: &[u8]) {
    let slot = if name.eq_ignore_ascii_case("host") {
        &mut head.host
    } else if name.eq_ignore_ascii_case("accept") {
        &mut head.accept
    } else if name.eq_ignore_ascii_case("content-type") {
        &mut head.content_type
    } else {
        return extract(interest.request_headers, name, value, &mut head.extracted);
    };
    *slot = Some(header_str(value));
}

/// Records one response header in `head`, as [`note_request_header`].
fn note_response_header(head: &mut ResponseHead, interest: &Interest, name: &str, value: &[u8]) {
    if name.eq_ignore_ascii_case("content-type") {
        head.media_type = Some(media_type(&header_str(value)));
    } else {
        extract(interest.response_headers, name, value, &mut head.extracted);
    }
}

/// Stores `value` at the index of `name` in `names`, if it is there.
fn extract(names: &[&str], name: &str, value: &[u8], into: &mut ExtractedHeaders) {
    if let Some(i) = names.iter().position(|n| name.eq_ignore_ascii_case(n))
        && let Some(slot) = into.get_mut(i)
    {
        *slot = Some(header_str(value));
    }
}

/// How a response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Framing says the body is complete (Content-Length reached, final chunk).
    Complete,
    /// A read-until-close body ended by the server closing the connection (FIN).
    ServerClosed,
    /// The connection was reset or bytes were lost: the body is incomplete.
    Aborted,
    /// The capture ended or the flow timed out while the body was still open.
    Unfinished,
}

/// Parse and limit problems, one label value each.
pub use crate::model::HttpError;

/// Output of the HTTP layer, in wire order. `exchange` numbers requests on the connection;
/// a response carries the number of the request it answers.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpEvent {
    Request {
        exchange: u64,
        head: RequestHead,
        body: Vec<u8>,
    },
    ResponseHead {
        exchange: u64,
        head: ResponseHead,
    },
    /// A complete JSON response body.
    ResponseJson {
        exchange: u64,
        body: Vec<u8>,
    },
    ResponseSse {
        exchange: u64,
        item: SseItem,
    },
    ResponseEnd {
        exchange: u64,
        end: BodyEnd,
    },
    /// The request will never be paired with a response (lost sync, pipelining cap): forget it.
    Abandoned {
        exchange: u64,
    },
    Error(HttpError),
}

#[derive(Debug)]
enum Framing {
    None,
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
    /// The caller parses HTTP itself and says where the body ends (see
    /// [`Connection::on_message_end`]).
    Delimited,
}

#[derive(Debug)]
enum Sink {
    Discard,
    Json(Vec<u8>),
    Sse(Box<SseParser>),
}

/// Most bytes reserved ahead for the rest of a message or chunk the framing announces.
/// Reservations are address space until the bytes arrive; the cap bounds what a false claim
/// can reserve.
const MAX_RESERVE_HINT: u64 = 1 << 20;

impl Sink {
    /// The framing says `expected` more bytes of this body (or chunk) are coming: make room
    /// now, so a body or event arriving in many segments is not regrown and recopied.
    fn reserve_hint(&mut self, expected: u64, max_message: usize) {
        let expected = expected.min(MAX_RESERVE_HINT) as usize;
        match self {
            Sink::Discard => {}
            Sink::Json(buf) => grow_for(buf, expected.min(max_message.saturating_sub(buf.len()))),
            Sink::Sse(parser) => parser.reserve_hint(expected),
        }
    }
}

// One per half-connection and replaced in place, so the size gap costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum State {
    /// At a message boundary.
    Idle,
    /// Lost (midstream pickup or after a gap): scanning for the next message start.
    Resync,
    /// Accumulating a head that spans segments.
    Head,
    Body {
        framing: Framing,
        sink: Sink,
        exchange: Option<u64>,
        request: Option<RequestHead>,
        is_request: bool,
    },
    /// Not HTTP (or switched protocols): ignore the rest of this direction.
    Ignored,
}

/// Parser for one direction of a connection.
#[derive(Debug)]
pub struct HalfParser {
    state: State,
    head_buf: Vec<u8>,
    /// Bytes scanned in Resync without finding a message start.
    resync_scanned: u64,
    /// A message was parsed here once: this is HTTP, never give up on it.
    seen_http: bool,
    /// The half was seen from its first byte (the connection's SYN was captured).
    synchronised_start: bool,
}

/// Give up on a direction that shows no HTTP message start within this many bytes.
const MAX_RESYNC_SCAN: u64 = 256 * 1024;

const METHODS: &[&[u8]] = &[
    b"GET ",
    b"POST ",
    b"DELETE ",
    b"PUT ",
    b"HEAD ",
    b"OPTIONS ",
    b"PATCH ",
];

impl HalfParser {
    fn new(synchronised: bool) -> Self {
        HalfParser {
            state: if synchronised {
                State::Idle
            } else {
                State::Resync
            },
            head_buf: Vec::new(),
            resync_scanned: 0,
            seen_http: false,
            synchronised_start: synchronised,
        }
    }

    pub fn is_ignored(&self) -> bool {
        matches!(self.state, State::Ignored)
    }
}

/// Both halves of a connection plus the queue pairing requests with responses.
#[derive(Debug)]
pub struct Connection {
    halves: [HalfParser; 2],
    /// Which half (0 or 1) carries requests, once seen.
    client_half: Option<usize>,
    pending: VecDeque<(u64, RequestHead)>,
    next_exchange: u64,
    limits: HttpLimits,
    interest: Interest,
    /// The SSE parser of the previous event-stream response, kept for the next one.
    spare_sse: Option<Box<SseParser>>,
}

/// Most a body buffer is sized up front: a Content-Length is only a claim, and thousands of
/// connections each claiming megabytes must not reserve them before the bytes arrive.
const MAX_BODY_PRESIZE: u64 = 64 << 10;

/// A body buffer sized up front from Content-Length, so a body that arrives in many segments
/// is not regrown (and recopied) as it comes.
fn json_buffer(framing: &Framing, max_message: usize) -> Vec<u8> {
    match framing {
        Framing::Length(len) => {
            Vec::with_capacity((*len).min(max_message as u64).min(MAX_BODY_PRESIZE) as usize)
        }
        _ => Vec::new(),
    }
}

pub fn is_json(content_type: &str) -> bool {
    let mt = media_type(content_type);
    mt == "application/json" || mt.ends_with("+json")
}

/// Lowercased media type without parameters.
pub fn media_type(value: &str) -> String {
    value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn header_str(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(s) => s.trim().to_string(),
        Err(_) => String::from_utf8_lossy(value).trim().to_string(),
    }
}

impl Connection {
    /// `synchronised`: the connection was seen from its SYN, so both directions start at a
    /// message boundary; otherwise they resynchronise at the next message start. `interest`
    /// says what the layer above wants kept.
    pub fn new(synchronised: bool, limits: HttpLimits, interest: Interest) -> Self {
        Connection {
            halves: [HalfParser::new(synchronised), HalfParser::new(synchronised)],
            client_half: None,
            pending: VecDeque::new(),
            next_exchange: 0,
            limits,
            interest,
            spare_sse: None,
        }
    }

    /// Which half carries requests, once known.
    pub fn client_half(&self) -> Option<usize> {
        self.client_half
    }

    /// Both directions have given up on HTTP: the flow can be skipped entirely.
    pub fn is_ignored(&self) -> bool {
        self.halves.iter().all(HalfParser::is_ignored)
    }

    /// Feeds reassembled bytes of half `half` (0 or 1).
    pub fn on_data(&mut self, half: usize, mut data: &[u8], out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        while !data.is_empty() {
            let used = self.step(half, data, out);
            if used == 0 {
                break;
            }
            data = &data[used..];
        }
    }

    /// Bytes were lost in half `half`: abandon the current message and resynchronise.
    pub fn on_gap(&mut self, half: usize, out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        if let State::Body {
            exchange: Some(ex),
            is_request: false,
            ..
        } = self.halves[half].state
        {
            out.push(HttpEvent::ResponseEnd {
                exchange: ex,
                end: BodyEnd::Aborted,
            });
        }
        if Some(half) == self.client_half {
            // Requests may have been lost, so responses can no longer be paired by order.
            for (exchange, _) in self.pending.drain(..) {
                out.push(HttpEvent::Abandoned { exchange });
            }
        }
        if !self.halves[half].is_ignored() {
            self.halves[half].state = State::Resync;
            self.halves[half].head_buf.clear();
            self.halves[half].resync_scanned = 0;
        }
    }

    /// Half `half` ended. `fin` is a clean close by its sender; otherwise a reset, timeout or
    /// the end of the capture (`unfinished`).
    pub fn on_close(&mut self, half: usize, how: BodyEnd, out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        let state = std::mem::replace(&mut self.halves[half].state, State::Ignored);
        if let State::Body {
            framing,
            sink,
            exchange,
            request,
            is_request: false,
        } = state
        {
            // A body the caller delimits ends at the close like one read until close.
            let until_close = matches!(framing, Framing::UntilClose | Framing::Delimited);
            let end = match how {
                BodyEnd::ServerClosed if until_close => BodyEnd::ServerClosed,
                BodyEnd::ServerClosed => BodyEnd::Aborted,
                other => other,
            };
            self.finish_body(sink, exchange, request, end, out);
        }
    }

    /// For callers that parse HTTP themselves (a gateway terminating it): a request head sent
    /// by half `half`. Its body follows in [`on_body`](Self::on_body) calls (without transfer
    /// coding) and ends with [`on_message_end`](Self::on_message_end), also for no body.
    pub fn on_request_head(
        &mut self,
        half: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        out: &mut Vec<HttpEvent>,
    ) {
        let half = half.min(1);
        self.abort_open_body(half, out);
        let mut head = RequestHead {
            method: method.to_string(),
            path: path.to_string(),
            ..RequestHead::default()
        };
        for (name, value) in headers {
            note_request_header(&mut head, &self.interest, name, value);
        }
        self.halves[half].seen_http = true;
        self.start_request(half, head, Framing::Delimited, out);
    }

    /// A response head sent by half `half`, as [`on_request_head`](Self::on_request_head).
    /// Interim (1xx) heads have no body and no end.
    pub fn on_response_head(
        &mut self,
        half: usize,
        status: u16,
        headers: &[(&str, &[u8])],
        out: &mut Vec<HttpEvent>,
    ) {
        let half = half.min(1);
        self.abort_open_body(half, out);
        let mut head = ResponseHead {
            status,
            ..ResponseHead::default()
        };
        for (name, value) in headers {
            note_response_header(&mut head, &self.interest, name, value);
        }
        self.halves[half].seen_http = true;
        let framing = if (100..200).contains(&status) {
            Framing::None
        } else {
            Framing::Delimited
        };
        self.start_response(half, head, framing, status == 101, out);
    }

    /// Body bytes of the message open in half `half`, transfer coding already removed.
    pub fn on_body(&mut self, half: usize, chunk: &[u8], out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        if matches!(self.halves[half].state, State::Body { .. }) && !chunk.is_empty() {
            self.body(half, chunk, out);
        }
    }

    /// The message open in half `half` is complete.
    pub fn on_message_end(&mut self, half: usize, out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        if matches!(self.halves[half].state, State::Body { .. }) {
            self.end_body(half, BodyEnd::Complete, State::Idle, out);
        }
    }

    /// A new head while a body is still open: the caller lost the end; the body is cut short.
    fn abort_open_body(&mut self, half: usize, out: &mut Vec<HttpEvent>) {
        if matches!(self.halves[half].state, State::Body { .. }) {
            self.end_body(half, BodyEnd::Aborted, State::Idle, out);
        }
        if !matches!(self.halves[half].state, State::Ignored) {
            self.halves[half].state = State::Idle;
        }
    }

    fn step(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) -> usize {
        match &mut self.halves[half].state {
            State::Ignored => data.len(),
            State::Resync => self.resync(half, data, out),
            State::Idle | State::Head => self.head(half, data, out),
            State::Body { .. } => self.body(half, data, out),
        }
    }

    fn resync(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) -> usize {
        let want_response = self.client_half.map(|c| c != half);
        let found = find_message_start(data, want_response);
        let parser = &mut self.halves[half];
        match found {
            Some(pos) => {
                parser.state = State::Idle;
                parser.resync_scanned = 0;
                if pos == 0 {
                    // Already at the start: parse now rather than report no progress.
                    return self.head(half, data, out);
                }
                pos
            }
            None => {
                parser.resync_scanned += data.len() as u64;
                if parser.resync_scanned > MAX_RESYNC_SCAN && !parser.seen_http {
                    parser.state = State::Ignored;
                }
                data.len()
            }
        }
    }

    fn head(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) -> usize {
        let limits = self.limits;
        let parser = &mut self.halves[half];
        let fresh = matches!(parser.state, State::Idle);
        if fresh && !looks_like_http_start(data) {
            // Not HTTP at a message boundary: a TLS or other protocol flow.
            parser.state = State::Ignored;
            return data.len();
        }
        // Zero-copy when the whole head is in this segment; otherwise accumulate.
        let (buf, carried): (&[u8], usize) = if parser.head_buf.is_empty() {
            (data, 0)
        } else {
            let carried = parser.head_buf.len();
            let take = data
                .len()
                .min(limits.max_head_bytes + 4 - carried.min(limits.max_head_bytes));
            parser.head_buf.extend_from_slice(&data[..take]);
            (&parser.head_buf[..], carried)
        };
        let parsed = parse_head(buf, &self.interest);
        match parsed {
            HeadParse::Partial => {
                let parser = &mut self.halves[half];
                if carried == 0 {
                    parser.head_buf.extend_from_slice(data);
                }
                if parser.head_buf.len() > limits.max_head_bytes {
                    out.push(HttpEvent::Error(HttpError::HeadTooLarge));
                    parser.head_buf.clear();
                    // HTTP-shaped, only too big: keep looking for the next message.
                    parser.seen_http = true;
                    parser.state = State::Resync;
                } else {
                    parser.state = State::Head;
                }
                data.len()
            }
            HeadParse::Invalid { .. } | HeadParse::TooManyHeaders => {
                out.push(HttpEvent::Error(match parsed {
                    HeadParse::Invalid { response: true, .. } => HttpError::BadResponseHead,
                    HeadParse::Invalid {
                        response: false, ..
                    } => HttpError::BadRequestHead,
                    _ => HttpError::TooManyHeaders,
                }));
                let parser = &mut self.halves[half];
                parser.head_buf.clear();
                let http_shaped = matches!(
                    parsed,
                    HeadParse::TooManyHeaders
                        | HeadParse::Invalid {
                            in_headers: true,
                            ..
                        }
                );
                if http_shaped {
                    parser.seen_http = true;
                } else if parser.synchronised_start && !parser.seen_http {
                    // The first bytes of a connection seen from its SYN are not HTTP; decided
                    // the same way however the bytes were cut into segments.
                    parser.state = State::Ignored;
                    return data.len();
                }
                parser.state = State::Resync;
                // Skip one byte so resync looks for the next start past this one.
                1.min(data.len())
            }
            HeadParse::Request { head, len, framing } => {
                self.halves[half].head_buf.clear();
                self.halves[half].seen_http = true;
                let used = len - carried;
                self.start_request(half, head, framing, out);
                used
            }
            HeadParse::Response {
                head,
                len,
                framing,
                switching,
            } => {
                self.halves[half].head_buf.clear();
                self.halves[half].seen_http = true;
                let used = len - carried;
                self.start_response(half, head, framing, switching, out);
                used
            }
        }
    }

    fn start_request(
        &mut self,
        half: usize,
        head: RequestHead,
        framing: Framing,
        out: &mut Vec<HttpEvent>,
    ) {
        self.client_half.get_or_insert(half);
        let exchange = self.next_exchange;
        self.next_exchange += 1;
        let keep = (self.interest.keeps)(&head);
        let sink = if keep && !matches!(framing, Framing::None) {
            Sink::Json(json_buffer(&framing, self.limits.max_message_bytes))
        } else {
            Sink::Discard
        };
        if self.pending.len() >= self.limits.max_pending_requests {
            out.push(HttpEvent::Error(HttpError::TooManyPending));
            if let Some((exchange, _)) = self.pending.pop_front() {
                out.push(HttpEvent::Abandoned { exchange });
            }
        }
        self.pending.push_back((exchange, head.clone()));
        let parser = &mut self.halves[half];
        match framing {
            Framing::None => {
                parser.state = State::Idle;
                if keep {
                    out.push(HttpEvent::Request {
                        exchange,
                        head,
                        body: Vec::new(),
                    });
                }
            }
            framing => {
                parser.state = State::Body {
                    framing,
                    sink,
                    exchange: keep.then_some(exchange),
                    request: keep.then_some(head),
                    is_request: true,
                };
            }
        }
    }

    fn start_response(
        &mut self,
        half: usize,
        head: ResponseHead,
        mut framing: Framing,
        switching: bool,
        out: &mut Vec<HttpEvent>,
    ) {
        if self.client_half.is_none() {
            self.client_half = Some(1 - half);
        }
        let interim = (100..200).contains(&head.status) && !switching;
        let matched = if interim {
            self.pending.front().cloned()
        } else {
            self.pending.pop_front()
        };
        let parser = &mut self.halves[half];
        if switching {
            parser.state = State::Ignored;
            return;
        }
        let Some((exchange, request)) = matched else {
            out.push(HttpEvent::Error(HttpError::UnmatchedResponse));
            parser.state = if matches!(framing, Framing::None) {
                State::Idle
            } else {
                State::Body {
                    framing,
                    sink: Sink::Discard,
                    exchange: None,
                    request: None,
                    is_request: false,
                }
            };
            return;
        };
        if interim {
            parser.state = State::Idle;
            return;
        }
        if request.method == "HEAD" || head.status == 204 || head.status == 304 {
            framing = Framing::None;
        }
        let mcp = (self.interest.keeps)(&request);
        let sink = match head.media_type.as_deref() {
            Some("text/event-stream") if mcp => {
                let max_event = self.limits.max_sse_event_bytes;
                Sink::Sse(
                    self.spare_sse
                        .take()
                        .unwrap_or_else(|| Box::new(SseParser::new(max_event))),
                )
            }
            Some(mt) if mcp && is_json(mt) => {
                Sink::Json(json_buffer(&framing, self.limits.max_message_bytes))
            }
            _ => Sink::Discard,
        };
        if mcp {
            out.push(HttpEvent::ResponseHead { exchange, head });
        }
        let exchange = mcp.then_some(exchange);
        let request = mcp.then_some(request);
        if matches!(framing, Framing::None) {
            parser.state = State::Idle;
            self.finish_body(sink, exchange, request, BodyEnd::Complete, out);
        } else {
            self.halves[half].state = State::Body {
                framing,
                sink,
                exchange,
                request,
                is_request: false,
            };
        }
    }

    fn body(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) -> usize {
        let max_message = self.limits.max_message_bytes;
        let State::Body {
            framing,
            sink,
            exchange,
            ..
        } = &mut self.halves[half].state
        else {
            return 0;
        };
        let exchange = *exchange;
        let mut too_large = false;
        let mut feed = |sink: &mut Sink, bytes: &[u8], out: &mut Vec<HttpEvent>| match sink {
            Sink::Discard => {}
            Sink::Json(buf) => {
                if buf.len() + bytes.len() > max_message {
                    too_large = true;
                    *sink = Sink::Discard;
                } else {
                    buf.extend_from_slice(bytes);
                }
            }
            Sink::Sse(parser) => {
                let mut items = Vec::new();
                let overflows = parser.overflows();
                parser.push(bytes, &mut items);
                if parser.overflows() > overflows {
                    // An event beyond the size cap was dropped.
                    too_large = true;
                }
                if let Some(ex) = exchange {
                    out.extend(
                        items
                            .into_iter()
                            .map(|item| HttpEvent::ResponseSse { exchange: ex, item }),
                    );
                }
            }
        };
        let progress = match framing {
            Framing::None => Ok((0, true)),
            Framing::Length(remaining) => {
                let take = (*remaining).min(data.len() as u64) as usize;
                feed(sink, &data[..take], out);
                *remaining -= take as u64;
                Ok((take, *remaining == 0))
            }
            Framing::UntilClose | Framing::Delimited => {
                feed(sink, data, out);
                Ok((data.len(), false))
            }
            Framing::Chunked(decoder) => decoder
                .push(data, &mut |bytes: &[u8]| feed(sink, bytes, out))
                .map(|status| (status.consumed, status.done)),
        };
        if too_large {
            out.push(HttpEvent::Error(HttpError::MessageTooLarge));
        }
        let expected = match framing {
            Framing::Length(remaining) => *remaining,
            Framing::Chunked(decoder) => decoder.chunk_remaining(),
            Framing::None | Framing::UntilClose | Framing::Delimited => 0,
        };
        sink.reserve_hint(expected, max_message);
        let (used, end) = match progress {
            Ok((used, true)) => (used, BodyEnd::Complete),
            Ok((used, false)) => return used,
            Err(_) => {
                out.push(HttpEvent::Error(HttpError::BadChunk));
                (data.len(), BodyEnd::Aborted)
            }
        };
        let next = if end == BodyEnd::Complete {
            State::Idle
        } else {
            State::Resync
        };
        self.end_body(half, end, next, out);
        used
    }

    /// Ends the body open in half `half` as `end`, leaving the half in state `next`: a request
    /// is emitted whole (when complete), a response's end is reported.
    fn end_body(&mut self, half: usize, end: BodyEnd, next: State, out: &mut Vec<HttpEvent>) {
        let state = std::mem::replace(&mut self.halves[half].state, next);
        if let State::Body {
            sink,
            exchange,
            request,
            is_request,
            ..
        } = state
        {
            if is_request {
                if let (Some(ex), Some(head), BodyEnd::Complete) = (exchange, request, end) {
                    let body = match sink {
                        Sink::Json(b) => b,
                        _ => Vec::new(),
                    };
                    out.push(HttpEvent::Request {
                        exchange: ex,
                        head,
                        body,
                    });
                }
            } else {
                self.finish_body(sink, exchange, request, end, out);
            }
        }
    }

    /// Emits the end of a response body (requests are emitted whole, never ended).
    fn finish_body(
        &mut self,
        sink: Sink,
        exchange: Option<u64>,
        request: Option<RequestHead>,
        end: BodyEnd,
        out: &mut Vec<HttpEvent>,
    ) {
        let Some(ex) = exchange else { return };
        if request.is_none() {
            return;
        }
        match sink {
            Sink::Json(body) if end == BodyEnd::Complete && !body.is_empty() => {
                out.push(HttpEvent::ResponseJson { exchange: ex, body })
            }
            Sink::Sse(mut parser) => {
                parser.recycle();
                self.spare_sse = Some(parser);
            }
            _ => {}
        }
        out.push(HttpEvent::ResponseEnd { exchange: ex, end });
    }

    /// Bytes held for messages in progress (heads, JSON bodies, SSE events) and the spare SSE
    /// parser's buffers, for the pipeline's memory budget.
    pub fn buffered_bytes(&self) -> usize {
        let spare = self.spare_sse.as_ref().map_or(0, |p| p.retained_bytes());
        spare
            + self
                .halves
                .iter()
                .map(|h| {
                    h.head_buf.len()
                        + match &h.state {
                            State::Body {
                                sink: Sink::Json(b),
                                ..
                            } => b.len(),
                            State::Body {
                                sink: Sink::Sse(p), ..
                            } => p.buffered_bytes(),
                            _ => 0,
                        }
                })
                .sum::<usize>()
    }
}

enum HeadParse {
    Partial,
    Invalid {
        response: bool,
        /// The start line parsed; a header did not (still HTTP-shaped).
        in_headers: bool,
    },
    TooManyHeaders,
    Request {
        head: RequestHead,
        len: usize,
        framing: Framing,
    },
    Response {
        head: ResponseHead,
        len: usize,
        framing: Framing,
        switching: bool,
    },
}

const MAX_HEADERS: usize = 96;

/// Errors past the start line: the message is HTTP, one of its headers is not.
fn header_error(e: httparse::Error) -> bool {
    matches!(
        e,
        httparse::Error::HeaderName | httparse::Error::HeaderValue
    )
}

fn parse_head(buf: &[u8], interest: &Interest) -> HeadParse {
    // Left uninitialised: httparse writes only the headers it finds, and initialising all 96
    // slots (3 KB) cost more than parsing a typical head.
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let config = httparse::ParserConfig::default();
    if buf.starts_with(b"HTTP/") {
        let mut resp = httparse::Response::new(&mut []);
        match config.parse_response_with_uninit_headers(&mut resp, buf, &mut headers) {
            Ok(httparse::Status::Partial) => HeadParse::Partial,
            Err(httparse::Error::TooManyHeaders) => HeadParse::TooManyHeaders,
            Err(e) => HeadParse::Invalid {
                response: true,
                in_headers: header_error(e),
            },
            Ok(httparse::Status::Complete(len)) => {
                let status = resp.code.unwrap_or(0);
                let mut head = ResponseHead {
                    status,
                    ..Default::default()
                };
                let framing = framing_from(resp.headers, &mut |name, value| {
                    note_response_header(&mut head, interest, name, value)
                });
                let framing = framing.unwrap_or(Framing::UntilClose);
                let no_body = (100..200).contains(&status);
                HeadParse::Response {
                    head,
                    len,
                    framing: if no_body { Framing::None } else { framing },
                    switching: status == 101,
                }
            }
        }
    } else {
        let mut req = httparse::Request::new(&mut []);
        match config.parse_request_with_uninit_headers(&mut req, buf, &mut headers) {
            Ok(httparse::Status::Partial) => HeadParse::Partial,
            Err(httparse::Error::TooManyHeaders) => HeadParse::TooManyHeaders,
            Err(e) => HeadParse::Invalid {
                response: false,
                in_headers: header_error(e),
            },
            Ok(httparse::Status::Complete(len)) => {
                let mut head = RequestHead {
                    method: req.method.unwrap_or("").to_string(),
                    path: req.path.unwrap_or("").to_string(),
                    ..Default::default()
                };
                let framing = framing_from(req.headers, &mut |name, value| {
                    note_request_header(&mut head, interest, name, value)
                });
                HeadParse::Request {
                    head,
                    len,
                    framing: framing.unwrap_or(Framing::None),
                }
            }
        }
    }
}

/// Reads the framing headers, passing every header to `visit`. None: no framing header.
fn framing_from(
    headers: &[httparse::Header<'_>],
    visit: &mut dyn FnMut(&str, &[u8]),
) -> Option<Framing> {
    let mut chunked = false;
    let mut length: Option<u64> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked |= h
                .value
                .windows(7)
                .any(|w| w.eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        } else {
            visit(h.name, h.value);
        }
    }
    // RFC 9112 §6.3: chunked wins over Content-Length.
    if chunked {
        Some(Framing::Chunked(ChunkedDecoder::new()))
    } else {
        length.map(|n| {
            if n == 0 {
                Framing::None
            } else {
                Framing::Length(n)
            }
        })
    }
}

fn looks_like_http_start(data: &[u8]) -> bool {
    let n = data.len().min(8);
    let prefix = &data[..n];
    if b"HTTP/1."[..n.min(7)] == prefix[..n.min(7)] {
        return true;
    }
    METHODS
        .iter()
        .any(|m| m[..n.min(m.len())] == prefix[..n.min(m.len())])
}

/// Finds the offset of the next plausible message start at a line beginning. `want_response`
/// narrows the search once the direction is known.
fn find_message_start(data: &[u8], want_response: Option<bool>) -> Option<usize> {
    let mut line_start = 0;
    loop {
        let rest = data.get(line_start..)?;
        let is_response = rest.starts_with(b"HTTP/1.");
        let is_request = METHODS.iter().any(|m| rest.starts_with(m));
        let ok = match want_response {
            Some(true) => is_response,
            Some(false) => is_request,
            None => is_response || is_request,
        };
        if ok {
            return Some(line_start);
        }
        let nl = memchr::memchr(b'\n', rest)?;
        line_start += nl + 1;
    }
}

#[cfg(test)]
mod tests;
