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
pub mod coding;
mod head_text;
pub mod proxy;
pub mod sse;

use crate::ascii::eq_ignore_case;
use crate::http::sse::{SseItem, SseParser};
pub use crate::model::{
    AbandonReason, DuplicateHeader, FramingAnomaly, UndecodableFlowReason, UndecodableReason,
};
use buffer::grow_for;
use chunked::ChunkedDecoder;
use coding::{BodyDecoder, Coding, CodingList};
use head_text::{HeadText, Span};
use std::collections::VecDeque;
use std::mem::MaybeUninit;

pub use crate::limits::HttpLimits;

/// Most headers a layer above can ask HTTP to copy out of a head (see [`Interest`]).
pub const MAX_EXTRACTED_HEADERS: usize = 6;

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
    /// Request headers whose name starts with this prefix (case-insensitive; empty: none) are
    /// copied into [`RequestHead::prefixed`], at most [`MAX_PREFIXED_HEADERS`] of them.
    pub request_header_prefix: &'static str,
    /// Whether the exchange a request opens is kept.
    pub keeps: fn(&RequestHead) -> bool,
}

impl Interest {
    /// Keeps every exchange with a JSON request body or an event-stream `Accept`, and no headers
    /// beyond the generic ones.
    pub const JSON_AND_SSE: Interest = Interest {
        request_headers: &[],
        response_headers: &[],
        request_header_prefix: "",
        keeps: RequestHead::may_carry_json_or_sse,
    };
}

/// The request facts later layers need: the generic ones plus the headers the [`Interest`]
/// names. Other headers (Authorization, Cookie, ...) are never copied out of the packet. The
/// kept values share one buffer; methods read them.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    text: HeadText,
    method: Span,
    path: Span,
    host: Option<Span>,
    accept: Option<Span>,
    content_type: Option<Span>,
    upgrade: Option<Span>,
    extracted: [Option<Span>; MAX_EXTRACTED_HEADERS],
    /// `X-Forwarded-For`, every occurrence joined with ", " in order (as RFC 9110 combines
    /// repeated list fields), at most [`MAX_FORWARDED_BYTES`].
    pub forwarded_for: Option<String>,
    /// `Forwarded` (RFC 7239), combined as `forwarded_for`.
    pub forwarded: Option<String>,
    /// Headers named with [`Interest::request_header_prefix`]: (name as sent, value).
    pub prefixed: Vec<(String, String)>,
    /// More such headers came than [`MAX_PREFIXED_HEADERS`]: `prefixed` lacks some.
    pub prefixed_truncated: bool,
    /// The head or body needed framing leniency a strict peer rejects (bare LF, ...).
    pub lenient: bool,
    /// A header peers read differently was duplicated with differing values; the first
    /// value is the one recorded (hyper's and starlette's reading).
    pub ambiguous: bool,
}

/// A request header [`RequestHead`] keeps by itself, for [`RequestHead::set`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestHeader {
    Host,
    Accept,
    ContentType,
    /// The `Upgrade` header: what a `101 Switching Protocols` answer switches to.
    Upgrade,
    /// The header at this index of [`Interest::request_headers`].
    Extracted(usize),
}

impl RequestHead {
    pub fn new(method: &str, path: &str) -> Self {
        let mut text = HeadText::for_head();
        let method = text.push_str(method);
        let path = text.push_str(path);
        RequestHead {
            text,
            method,
            path,
            ..RequestHead::default()
        }
    }

    pub fn method(&self) -> &str {
        self.text.get(self.method)
    }

    pub fn path(&self) -> &str {
        self.text.get(self.path)
    }

    pub fn host(&self) -> Option<&str> {
        self.get(RequestHeader::Host)
    }

    pub fn accept(&self) -> Option<&str> {
        self.get(RequestHeader::Accept)
    }

    pub fn content_type(&self) -> Option<&str> {
        self.get(RequestHeader::ContentType)
    }

    pub fn upgrade(&self) -> Option<&str> {
        self.get(RequestHeader::Upgrade)
    }

    /// The value of the header at index `i` of [`Interest::request_headers`].
    pub fn extracted(&self, i: usize) -> Option<&str> {
        self.get(RequestHeader::Extracted(i))
    }

    pub fn get(&self, header: RequestHeader) -> Option<&str> {
        self.slot(header)
            .copied()
            .flatten()
            .map(|span| self.text.get(span))
    }

    /// Sets (or with `None` removes) a header's value, as a head carrying it would.
    pub fn set(&mut self, header: RequestHeader, value: Option<&str>) {
        let span = value.map(|v| self.text.push_str(v));
        if let Some(slot) = self.slot_mut(header) {
            *slot = span;
        }
    }

    /// Replaces the path.
    pub fn set_path(&mut self, path: &str) {
        self.path = self.text.push_str(path);
    }

    /// Bytes it holds besides itself, as allocated: its kept values, the forwarding headers
    /// and the prefixed headers it copied (each with its tuple and a word of rounding).
    pub fn heap_bytes(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        self.text.held_bytes()
            + text(&self.forwarded_for)
            + text(&self.forwarded)
            + self
                .prefixed
                .iter()
                .map(|(n, v)| n.capacity() + v.capacity() + 48)
                .sum::<usize>()
    }

    fn slot(&self, header: RequestHeader) -> Option<&Option<Span>> {
        match header {
            RequestHeader::Host => Some(&self.host),
            RequestHeader::Accept => Some(&self.accept),
            RequestHeader::ContentType => Some(&self.content_type),
            RequestHeader::Upgrade => Some(&self.upgrade),
            RequestHeader::Extracted(i) => self.extracted.get(i),
        }
    }

    fn slot_mut(&mut self, header: RequestHeader) -> Option<&mut Option<Span>> {
        match header {
            RequestHeader::Host => Some(&mut self.host),
            RequestHeader::Accept => Some(&mut self.accept),
            RequestHeader::ContentType => Some(&mut self.content_type),
            RequestHeader::Upgrade => Some(&mut self.upgrade),
            RequestHeader::Extracted(i) => self.extracted.get_mut(i),
        }
    }

    /// A POST with a JSON body, or a GET that accepts an event stream.
    pub fn may_carry_json_or_sse(&self) -> bool {
        (self.method() == "POST" && self.content_type().is_some_and(is_json))
            || (self.method() == "GET"
                && self
                    .accept()
                    .is_some_and(|a| a.to_ascii_lowercase().contains("text/event-stream")))
    }
}

/// Heads are equal when their values are, wherever in the buffer they lie.
impl PartialEq for RequestHead {
    fn eq(&self, other: &Self) -> bool {
        let headers = [
            RequestHeader::Host,
            RequestHeader::Accept,
            RequestHeader::ContentType,
            RequestHeader::Upgrade,
        ]
        .into_iter()
        .chain((0..MAX_EXTRACTED_HEADERS).map(RequestHeader::Extracted));
        self.method() == other.method()
            && self.path() == other.path()
            && headers.into_iter().all(|h| self.get(h) == other.get(h))
            && self.forwarded_for == other.forwarded_for
            && self.forwarded == other.forwarded
            && self.prefixed == other.prefixed
            && self.prefixed_truncated == other.prefixed_truncated
            && self.lenient == other.lenient
            && self.ambiguous == other.ambiguous
    }
}

impl Eq for RequestHead {}

/// What the HTTP layer allocated and the session layer is done with: bodies (and SSE events'
/// data) read, heads of exchanges ended. With the two layers on two threads they go back to
/// be freed on the thread that allocated them: the allocator frees a block fastest there (on
/// another, its page's owner later collects the block from a list both threads write).
#[derive(Debug, Default)]
pub struct Spent {
    pub bodies: Vec<Vec<u8>>,
    pub request_heads: Vec<Box<RequestHead>>,
    pub response_heads: Vec<Box<ResponseHead>>,
}

impl Spent {
    /// Frees what is held, keeping the lists' room.
    pub fn clear(&mut self) {
        self.bodies.clear();
        self.request_heads.clear();
        self.response_heads.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty() && self.request_heads.is_empty() && self.response_heads.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// Media type, lowercased, without parameters.
    pub media_type: Option<String>,
    pub extracted: ExtractedHeaders,
    /// As [`RequestHead::lenient`]; leniency found later in the body is reported as
    /// [`HttpEvent::Anomaly`] with the exchange.
    pub lenient: bool,
    /// As [`RequestHead::ambiguous`].
    pub ambiguous: bool,
    /// A second Content-Type with a different media type (the first is `media_type`): the
    /// body is parsed by what it is.
    pub other_media_type: Option<String>,
}

/// Most headers [`Interest::request_header_prefix`] copies out of one request head.
pub const MAX_PREFIXED_HEADERS: usize = 16;

/// Longest combined `X-Forwarded-For` or `Forwarded` value kept; longer chains are cut at a
/// list element boundary. Each proxy appends its hop, so the trusted hops nearest the monitor
/// come last: the leftmost elements, the ones a client may forge, fall off first.
pub const MAX_FORWARDED_BYTES: usize = 1024;

/// Appends one occurrence of a list header to its combined value, within the bound.
fn combine_list(slot: &mut Option<String>, value: &[u8]) {
    let value = header_str(value);
    let all = slot.get_or_insert_with(String::new);
    if !all.is_empty() {
        all.push_str(", ");
    }
    all.push_str(&value);
    if all.len() > MAX_FORWARDED_BYTES {
        let from = all.len() - MAX_FORWARDED_BYTES;
        // After a comma (ASCII, so a char boundary); a single oversized element is no hop.
        let cut =
            memchr::memchr(b',', &all.as_bytes()[from..]).map_or(all.len(), |at| from + at + 1);
        all.drain(..cut);
        let pad = all.len() - all.trim_start().len();
        all.drain(..pad);
    }
}

/// Records the first value of a header in `slot`; a later one is a duplicate (returned), and
/// one with a different value makes the head ambiguous.
fn note_first(
    slot: &mut Option<String>,
    ambiguous: &mut bool,
    header: impl FnOnce() -> DuplicateHeader,
    value: &[u8],
    within: HeadStr<'_>,
) -> Option<DuplicateHeader> {
    match slot {
        None => {
            *slot = Some(value_text(value, within).into_owned());
            None
        }
        Some(first) => {
            if first.as_bytes() != value.trim_ascii() {
                *ambiguous = true;
            }
            Some(header())
        }
    }
}

/// Records one request header in `head`: the generic ones and those `interest` names.
/// Returns the header when it is a counted duplicate.
fn note_request_header(
    head: &mut RequestHead,
    interest: &Interest,
    name: &str,
    value: &[u8],
    within: HeadStr<'_>,
) -> Option<DuplicateHeader> {
    // The names read here have different lengths: one comparison per header, chosen by its
    // length, rather than one per name.
    let known = match name.len() {
        4 if eq_ignore_case(name, "host") => Some((RequestHeader::Host, DuplicateHeader::Host)),
        6 if eq_ignore_case(name, "accept") => {
            Some((RequestHeader::Accept, DuplicateHeader::Accept))
        }
        12 if eq_ignore_case(name, "content-type") => {
            Some((RequestHeader::ContentType, DuplicateHeader::ContentType))
        }
        7 if eq_ignore_case(name, "upgrade") => {
            Some((RequestHeader::Upgrade, DuplicateHeader::Other))
        }
        15 if eq_ignore_case(name, "x-forwarded-for") => {
            combine_list(&mut head.forwarded_for, value);
            return None;
        }
        9 if eq_ignore_case(name, "forwarded") => {
            combine_list(&mut head.forwarded, value);
            return None;
        }
        _ => None,
    };
    let (header, duplicate) = if let Some(known) = known {
        known
    } else if !interest.request_header_prefix.is_empty()
        && name.len() > interest.request_header_prefix.len()
        && name
            .get(..interest.request_header_prefix.len())
            .is_some_and(|p| eq_ignore_case(p, interest.request_header_prefix))
    {
        if head.prefixed.len() < MAX_PREFIXED_HEADERS {
            head.prefixed.push((name.to_string(), header_str(value)));
        } else {
            head.prefixed_truncated = true;
        }
        return None;
    } else {
        let i = interest
            .request_headers
            .iter()
            .position(|n| eq_ignore_case(name, n))?;
        // Which duplicate it is is found only for a duplicate (most heads have none).
        (RequestHeader::Extracted(i), DuplicateHeader::Other)
    };
    match *head.slot(header)? {
        None => {
            let span = head.text.push_value(value, within);
            if let Some(slot) = head.slot_mut(header) {
                *slot = Some(span);
            }
            None
        }
        Some(first) => {
            if head.text.get(first).as_bytes() != value.trim_ascii() {
                head.ambiguous = true;
            }
            Some(match header {
                RequestHeader::Extracted(_) => DuplicateHeader::of_extracted(name),
                _ => duplicate,
            })
        }
    }
}

/// Records one response header in `head`, as [`note_request_header`].
fn note_response_header(
    head: &mut ResponseHead,
    interest: &Interest,
    name: &str,
    value: &[u8],
    within: HeadStr<'_>,
) -> Option<DuplicateHeader> {
    if eq_ignore_case(name, "content-type") {
        let mt = media_type_of(value, within);
        match &head.media_type {
            None => head.media_type = Some(mt),
            Some(first) => {
                if *first != mt {
                    head.ambiguous = true;
                    head.other_media_type.get_or_insert(mt);
                }
                return Some(DuplicateHeader::ContentType);
            }
        }
        None
    } else {
        extract(
            interest.response_headers,
            name,
            value,
            &mut head.extracted,
            &mut head.ambiguous,
            within,
        )
    }
}

/// Stores `value` at the index of `name` in `names`, if it is there (the first value; a later
/// one is a duplicate).
fn extract(
    names: &[&str],
    name: &str,
    value: &[u8],
    into: &mut ExtractedHeaders,
    ambiguous: &mut bool,
    within: HeadStr<'_>,
) -> Option<DuplicateHeader> {
    let i = names.iter().position(|n| eq_ignore_case(name, n))?;
    let slot = into.get_mut(i)?;
    // Which duplicate it is, only for a duplicate (most heads have none).
    note_first(
        slot,
        ambiguous,
        || DuplicateHeader::of_extracted(name),
        value,
        within,
    )
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
    /// Heads are boxed: events move through queues, and most are a few words.
    Request {
        exchange: u64,
        head: Box<RequestHead>,
        body: Vec<u8>,
    },
    ResponseHead {
        exchange: u64,
        head: Box<ResponseHead>,
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
    /// The server's side of the connection ended (`end`: closed, reset, timed out, the end of
    /// the capture) before any response to the request began: it has its answer, none.
    NoResponse {
        exchange: u64,
        end: BodyEnd,
    },
    /// The client's side of the connection ended (FIN or reset) while the response to
    /// `exchange` was still coming: the client stopped waiting for it (the 2026-07-28 revision
    /// makes closing a response stream the request's cancellation).
    ClientGone {
        exchange: u64,
    },
    /// The request will never be paired with a response (lost sync, pipelining cap): forget it.
    Abandoned {
        exchange: u64,
        reason: AbandonReason,
    },
    /// Framing decoded leniently (or an ignored empty line); `exchange` is the kept response
    /// it was found in, if any (request leniency is in [`RequestHead::lenient`]).
    Anomaly {
        exchange: Option<u64>,
        reason: FramingAnomaly,
    },
    /// A header peers read differently appeared more than once in a head.
    DuplicateHeader {
        header: DuplicateHeader,
    },
    /// The body of a kept message could not be decoded: its answer cannot be seen (the
    /// response then ends as [`BodyEnd::Aborted`], never as a complete empty stream).
    Undecodable {
        exchange: Option<u64>,
        reason: UndecodableReason,
    },
    /// The connection carries something other than HTTP/1.1 (TLS, HTTP/2, a protocol switched
    /// to): it is not decoded from here on. Reported once per connection; `half` is the
    /// direction whose bytes showed it.
    NotDecodable {
        half: usize,
        reason: UndecodableFlowReason,
    },
    /// A PROXY protocol header (v1 or v2) opened half `half`: `source` is the client the load
    /// balancer accepted (`None`: `UNKNOWN` or `LOCAL`).
    ProxyHeader {
        half: usize,
        source: Option<std::net::SocketAddr>,
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
    /// Content-Types disagree (JSON and event stream): the first body byte decides.
    Sniff,
    /// The body's coding could not be decoded: skipped, and the body cannot end complete.
    Undecodable,
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
            Sink::Discard | Sink::Sniff | Sink::Undecodable => {}
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
        /// Decoders of the content and transfer codings (kept bodies only).
        coding: Option<Box<BodyDecoder>>,
        exchange: Option<u64>,
        /// A kept request's head, sent on with its body.
        request: Option<Box<RequestHead>>,
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
    /// In Resync: the scan is inside a line, so the next message start is past a line feed
    /// (or at the next segment's start). The first bytes of a line that may become a start,
    /// cut by a segment's end, are kept in `head_buf`.
    resync_mid_line: bool,
    /// The head in `head_buf` began with too few bytes to tell whether it is HTTP.
    start_undecided: bool,
    /// Set when a spanning head turned out broken and its bytes were scanned again: the
    /// segment that ended it is read again from its start, in the state that scan left.
    read_again: bool,
    /// Bytes kept from earlier segments are being scanned again: they are no segment, so a
    /// short remainder of them is parsed at once rather than left to wait for its end.
    refeeding: bool,
    /// A message was parsed here once: this is HTTP, never give up on it.
    seen_http: bool,
    /// The half was seen from its first byte (the connection's SYN was captured).
    synchronised_start: bool,
    /// Empty lines counted at the current message boundary (at most [`MAX_EMPTY_LINES`]).
    empty_lines: u8,
}

/// Empty lines counted per message boundary; more are skipped uncounted.
const MAX_EMPTY_LINES: u8 = 8;

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
            resync_mid_line: false,
            start_undecided: false,
            read_again: false,
            refeeding: false,
            seen_http: false,
            synchronised_start: synchronised,
            empty_lines: 0,
        }
    }

    pub fn is_ignored(&self) -> bool {
        matches!(self.state, State::Ignored)
    }

    /// A head that spans segments starts its buffer with room for a typical head, so that it
    /// is not regrown segment by segment.
    fn start_head_buf(&mut self, first: &[u8]) {
        if self.head_buf.capacity() == 0 {
            self.head_buf.reserve(first.len().max(HEAD_BUF_START));
        }
        self.head_buf.extend_from_slice(first);
    }

    /// Look for the next message start; `mid_line` when the bytes to come continue a line.
    fn enter_resync(&mut self, mid_line: bool) {
        self.state = State::Resync;
        self.clear_head_buf();
        self.resync_scanned = 0;
        self.resync_mid_line = mid_line;
    }

    /// Done with the head in the buffer. A buffer that a long head grew past
    /// [`HEAD_BUF_KEPT`] is given back: kept, it would hold up to twice `max_head_bytes` for
    /// the connection's life (it is charged by its capacity, see
    /// [`Connection::buffered_bytes`]).
    fn clear_head_buf(&mut self) {
        self.start_undecided = false;
        if self.head_buf.capacity() > HEAD_BUF_KEPT {
            self.head_buf = Vec::new();
        } else {
            self.head_buf.clear();
        }
    }
}

/// Room a spanning head's buffer starts with: most MCP heads are a few hundred bytes.
const HEAD_BUF_START: usize = 1024;
/// The largest head buffer a connection keeps between heads.
const HEAD_BUF_KEPT: usize = 4 * HEAD_BUF_START;

/// Both halves of a connection plus the queue pairing requests with responses.
#[derive(Debug)]
pub struct Connection {
    halves: [HalfParser; 2],
    /// Which half (0 or 1) carries requests, once seen.
    client_half: Option<usize>,
    pending: PendingRequests,
    next_exchange: u64,
    limits: HttpLimits,
    interest: Interest,
    /// The SSE parser of the previous event-stream response, kept for the next one.
    spare_sse: Option<Box<SseParser>>,
    /// [`HttpEvent::NotDecodable`] was reported for this connection.
    undecodable_reported: bool,
    /// A PROXY protocol header may still start each half (only before its first byte was
    /// parsed as HTTP, on a connection seen from its SYN).
    proxy: [ProxyScan; 2],
}

/// Where a half stands with a leading PROXY protocol header.
#[derive(Debug)]
enum ProxyScan {
    /// Undecided: the bytes so far (at most a header's examined length).
    Open(Vec<u8>),
    /// A header's remaining bytes to skip (a v2 TLV block beyond the addresses).
    Skip(usize),
    Done,
}

/// Requests awaiting their response, in order, with the bytes their heads hold: pipelined
/// requests with long paths must count against the memory budget like any buffer.
#[derive(Debug, Default)]
struct PendingRequests {
    queue: VecDeque<(u64, PendingRequest)>,
    /// Bytes the queued requests hold besides their slots.
    bytes: usize,
}

/// Most slots an empty queue keeps: a connection that pipelined a thousand requests once does
/// not keep their room.
const KEPT_PENDING_SLOTS: usize = 8;

/// What the response to a request needs of it: its head went up with the request (a copy of
/// every header kept for each request cost more allocations than the rest of the exchange).
#[derive(Debug, Clone, Default)]
struct PendingRequest {
    /// The layer above keeps the exchange ([`Interest::keeps`]).
    keep: bool,
    /// `HEAD`: the response has no body whatever its head says.
    head_method: bool,
    /// The `Upgrade` header, for what a `101` switched to.
    upgrade: Option<Box<str>>,
}

impl PendingRequest {
    fn of(head: &RequestHead, keep: bool) -> Self {
        PendingRequest {
            keep,
            head_method: head.method() == "HEAD",
            upgrade: head.upgrade().map(Box::from),
        }
    }

    /// Bytes it holds besides its queue slot.
    fn bytes(&self) -> usize {
        self.upgrade.as_ref().map_or(0, |u| u.len())
    }
}

impl PendingRequests {
    fn len(&self) -> usize {
        self.queue.len()
    }

    fn front(&self) -> Option<&(u64, PendingRequest)> {
        self.queue.front()
    }

    fn push_back(&mut self, entry: (u64, PendingRequest)) {
        self.bytes += entry.1.bytes();
        self.queue.push_back(entry);
    }

    fn pop_front(&mut self) -> Option<(u64, PendingRequest)> {
        let entry = self.queue.pop_front()?;
        self.bytes -= entry.1.bytes().min(self.bytes);
        if self.queue.is_empty() && self.queue.capacity() > KEPT_PENDING_SLOTS {
            self.queue = VecDeque::new();
        }
        Some(entry)
    }

    /// Bytes held, as allocated: every slot of the queue and what the requests hold.
    fn held_bytes(&self) -> usize {
        self.queue.capacity() * std::mem::size_of::<(u64, PendingRequest)>() + self.bytes
    }
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
    // As `media_type` then a comparison, without lowering a copy (every request asks).
    let mt = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .as_bytes();
    mt.eq_ignore_ascii_case(b"application/json")
        || mt
            .len()
            .checked_sub(5)
            .and_then(|at| mt.get(at..))
            .is_some_and(|tail| tail.eq_ignore_ascii_case(b"+json"))
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

/// [`media_type`] of a raw header value, in one allocation.
fn media_type_of(value: &[u8], within: HeadStr<'_>) -> String {
    let before_params = value.split(|b| *b == b';').next().unwrap_or_default();
    let text = within
        .text_of(before_params)
        .or_else(|| std::str::from_utf8(before_params).ok());
    match text {
        Some(s) => s.trim().to_ascii_lowercase(),
        None => String::from_utf8_lossy(before_params)
            .trim()
            .to_ascii_lowercase(),
    }
}

/// A header value as text, trimmed as `str::trim` trims.
fn header_str(value: &[u8]) -> String {
    value_text(value, HeadStr::default()).into_owned()
}

/// [`header_str`] without a copy where the value is text as it is: read as a slice of `head`
/// when it lies in it.
fn value_text<'a>(value: &'a [u8], head: HeadStr<'a>) -> std::borrow::Cow<'a, str> {
    let text =
        trim_like_str(value).and_then(|t| head.text_of(t).or_else(|| std::str::from_utf8(t).ok()));
    match text {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(String::from_utf8_lossy(value).trim().to_string()),
    }
}

/// A request head as text when it is UTF-8 (nearly always: ASCII), validated in one pass, so
/// that its header values are read as slices of it rather than each validated on its own.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HeadStr<'a>(Option<&'a str>);

impl<'a> HeadStr<'a> {
    fn of(head: &'a [u8]) -> Self {
        // simdutf8: a whole head at once, where the standard check goes a word at a time.
        HeadStr(simdutf8::basic::from_utf8(head).ok())
    }

    /// `part` as text if it is a slice of the head starting and ending at character
    /// boundaries (memory ranges of live values do not overlap: an address inside the head's
    /// range is in the head).
    pub(crate) fn text_of(self, part: &[u8]) -> Option<&'a str> {
        let head = self.0?;
        let start = (part.as_ptr() as usize).checked_sub(head.as_ptr() as usize)?;
        head.get(start..start.checked_add(part.len())?)
    }
}

/// `text` trimmed as `str::trim` trims it, without decoding characters when its ends are ASCII
/// (ASCII whitespace is Unicode whitespace; of the rest, only VT and non-ASCII ends need
/// decoding). None when they do and `text` is not UTF-8.
pub(crate) fn trim_like_str(text: &[u8]) -> Option<&[u8]> {
    let trimmed = text.trim_ascii();
    let plain = |b: Option<&u8>| b.is_none_or(|b| b.is_ascii() && *b != 0x0b);
    if plain(trimmed.first()) && plain(trimmed.last()) {
        return Some(trimmed);
    }
    std::str::from_utf8(text).ok().map(|s| s.trim().as_bytes())
}

impl Connection {
    /// `synchronised`: the connection was seen from its SYN, so both directions start at a
    /// message boundary; otherwise they resynchronise at the next message start. `interest`
    /// says what the layer above wants kept.
    pub fn new(synchronised: bool, limits: HttpLimits, interest: Interest) -> Self {
        Connection {
            halves: [HalfParser::new(synchronised), HalfParser::new(synchronised)],
            client_half: None,
            pending: PendingRequests::default(),
            next_exchange: 0,
            limits,
            interest,
            spare_sse: None,
            undecodable_reported: false,
            proxy: if synchronised {
                [ProxyScan::Open(Vec::new()), ProxyScan::Open(Vec::new())]
            } else {
                [ProxyScan::Done, ProxyScan::Done]
            },
        }
    }

    /// Half `half` is given up on: it is not HTTP/1.1 (reported once per connection).
    fn give_up(&mut self, half: usize, reason: UndecodableFlowReason, out: &mut Vec<HttpEvent>) {
        self.halves[half].state = State::Ignored;
        // TLS and HTTP/2 are spoken both ways: what the other side sends is no HTTP/1.1
        // exchange either (an HTTP/1.1-only server's 400 to the h2c preface included).
        if matches!(
            reason,
            UndecodableFlowReason::Tls | UndecodableFlowReason::H2c
        ) && let Some(other) = self.halves.get_mut(1 - half.min(1))
        {
            other.state = State::Ignored;
        }
        if !self.undecodable_reported {
            self.undecodable_reported = true;
            out.push(HttpEvent::NotDecodable { half, reason });
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
    pub fn on_data(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        // A segment may start a message wherever the last one ended: clients send a message
        // per segment, and this is how a resynchronising half finds the next one.
        self.halves[half].resync_mid_line = false;
        if matches!(self.proxy[half], ProxyScan::Done) {
            return self.feed(half, data, out);
        }
        match std::mem::replace(&mut self.proxy[half], ProxyScan::Done) {
            ProxyScan::Done => self.feed(half, data, out),
            ProxyScan::Skip(n) => {
                let skipped = n.min(data.len());
                if n > skipped {
                    self.proxy[half] = ProxyScan::Skip(n - skipped);
                }
                self.feed(half, &data[skipped..], out);
            }
            // The usual case: the first bytes decide at once, nothing is copied.
            ProxyScan::Open(held)
                if held.is_empty() && proxy::examine(data) == proxy::ProxyVerdict::Absent =>
            {
                self.feed(half, data, out)
            }
            ProxyScan::Open(mut held) => {
                held.extend_from_slice(data);
                match proxy::examine(&held) {
                    proxy::ProxyVerdict::Incomplete => self.proxy[half] = ProxyScan::Open(held),
                    proxy::ProxyVerdict::Absent => self.feed(half, &held, out),
                    verdict => {
                        let len = match verdict {
                            proxy::ProxyVerdict::Header { len, source } => {
                                out.push(HttpEvent::ProxyHeader { half, source });
                                len
                            }
                            proxy::ProxyVerdict::Malformed { len } => {
                                out.push(HttpEvent::Error(HttpError::MalformedProxyHeader));
                                len
                            }
                            _ => 0,
                        };
                        if len > held.len() {
                            self.proxy[half] = ProxyScan::Skip(len - held.len());
                        } else {
                            self.feed(half, &held[len..], out);
                        }
                    }
                }
            }
        }
    }

    fn feed(&mut self, half: usize, mut data: &[u8], out: &mut Vec<HttpEvent>) {
        while !data.is_empty() {
            let used = self.step(half, data, out);
            if used == 0 {
                // Each reading again starts from a shorter head buffer, so this ends.
                if std::mem::take(&mut self.halves[half].read_again) {
                    continue;
                }
                break;
            }
            data = &data[used..];
        }
    }

    /// Bytes were lost in half `half`: abandon the current message and resynchronise.
    pub fn on_gap(&mut self, half: usize, out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        if let State::Body {
            exchange,
            is_request,
            ..
        } = self.halves[half].state
        {
            out.push(HttpEvent::Error(HttpError::TruncatedBody));
            if let (Some(ex), false) = (exchange, is_request) {
                out.push(HttpEvent::ResponseEnd {
                    exchange: ex,
                    end: BodyEnd::Aborted,
                });
            }
        }
        if Some(half) == self.client_half {
            // Requests may have been lost, so responses can no longer be paired by order.
            self.abandon_pending(AbandonReason::Gap, out);
        }
        if !self.halves[half].is_ignored() {
            self.halves[half].enter_resync(false);
        }
    }

    /// The client (half `client`) closed or reset its side: the response being read and those
    /// still to come will not be read by it.
    fn client_left(&mut self, client: usize, out: &mut Vec<HttpEvent>) {
        let server = 1 - client.min(1);
        if let Some(HalfParser {
            state:
                State::Body {
                    exchange: Some(exchange),
                    is_request: false,
                    ..
                },
            ..
        }) = self.halves.get(server)
        {
            out.push(HttpEvent::ClientGone {
                exchange: *exchange,
            });
        }
        for (exchange, _) in &self.pending.queue {
            out.push(HttpEvent::ClientGone {
                exchange: *exchange,
            });
        }
    }

    fn abandon_pending(&mut self, reason: AbandonReason, out: &mut Vec<HttpEvent>) {
        while let Some((exchange, _)) = self.pending.pop_front() {
            out.push(HttpEvent::Abandoned { exchange, reason });
        }
    }

    /// Bytes at a message boundary of half `half` that cannot be framed: count `reason`,
    /// abandon every pending exchange (pairing by order is lost) and resynchronise.
    fn desync(&mut self, half: usize, reason: HttpError, out: &mut Vec<HttpEvent>) {
        out.push(HttpEvent::Error(reason));
        self.abandon_pending(AbandonReason::Desync, out);
        // At a message boundary: the next line starts here.
        self.halves[half].enter_resync(false);
    }

    /// Half `half` ended. `fin` is a clean close by its sender; otherwise a reset, timeout or
    /// the end of the capture (`unfinished`).
    pub fn on_close(&mut self, half: usize, how: BodyEnd, out: &mut Vec<HttpEvent>) {
        let half = half.min(1);
        if Some(half) == self.client_half && matches!(how, BodyEnd::ServerClosed | BodyEnd::Aborted)
        {
            self.client_left(half, out);
        }
        let parser = &self.halves[half];
        if matches!(parser.state, State::Head) && !parser.head_buf.is_empty() {
            // A head cut short by the close is parsed once: what its complete lines already
            // break is counted, not lost with it (a head waiting for its end is not parsed).
            match parse_head(&parser.head_buf, &self.interest) {
                HeadParse::Invalid { response, .. } => out.push(HttpEvent::Error(if response {
                    HttpError::BadResponseHead
                } else {
                    HttpError::BadRequestHead
                })),
                HeadParse::TooManyHeaders => out.push(HttpEvent::Error(HttpError::TooManyHeaders)),
                _ => {}
            }
        }
        let state = std::mem::replace(&mut self.halves[half].state, State::Ignored);
        if let State::Body {
            framing,
            mut sink,
            mut coding,
            exchange,
            is_request: false,
            ..
        } = state
        {
            // A body the caller delimits ends at the close like one read until close.
            let until_close = matches!(framing, Framing::UntilClose | Framing::Delimited);
            let end = match how {
                BodyEnd::ServerClosed if until_close => BodyEnd::ServerClosed,
                BodyEnd::ServerClosed => BodyEnd::Aborted,
                other => other,
            };
            if end == BodyEnd::ServerClosed {
                self.drain_coding(&mut coding, &mut sink, exchange, out);
            }
            self.finish_body(sink, exchange, end, out);
        }
        if self.client_half.is_some_and(|client| client != half) {
            // No response can follow on this connection: the requests still waiting for one
            // went unanswered.
            while let Some((exchange, _)) = self.pending.pop_front() {
                out.push(HttpEvent::NoResponse { exchange, end: how });
            }
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
        let mut head = RequestHead::new(method, path);
        let mut ce = CodingList::default();
        for (name, value) in headers {
            if eq_ignore_case(name, "content-encoding") {
                ce.add_header(value);
            } else if let Some(header) =
                note_request_header(&mut head, &self.interest, name, value, HeadStr::default())
            {
                out.push(HttpEvent::DuplicateHeader { header });
            }
        }
        self.halves[half].seen_http = true;
        let codings = Codings {
            content: ce,
            transfer: CodingList::default(),
        };
        self.start_request(half, Box::new(head), Framing::Delimited, codings, out);
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
        let mut ce = CodingList::default();
        for (name, value) in headers {
            if eq_ignore_case(name, "content-encoding") {
                ce.add_header(value);
            } else if let Some(header) =
                note_response_header(&mut head, &self.interest, name, value, HeadStr::default())
            {
                out.push(HttpEvent::DuplicateHeader { header });
            }
        }
        self.halves[half].seen_http = true;
        let framing = if (100..200).contains(&status) {
            Framing::None
        } else {
            Framing::Delimited
        };
        let codings = Codings {
            content: ce,
            transfer: CodingList::default(),
        };
        self.start_response(half, Box::new(head), framing, codings, status == 101, out);
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
        let parser = &mut self.halves[half];
        if !parser.head_buf.is_empty() {
            // The previous segment ended on the first bytes of a line that may start a
            // message: decide with the bytes that follow.
            let mut joined = [0u8; START_TOKEN_MAX];
            let kept = parser.head_buf.len().min(START_TOKEN_MAX);
            joined[..kept].copy_from_slice(&parser.head_buf[..kept]);
            let added = (START_TOKEN_MAX - kept).min(data.len());
            joined[kept..kept + added].copy_from_slice(&data[..added]);
            match start_token(&joined[..kept + added], want_response) {
                StartToken::Yes => {
                    // The message starts in the kept bytes: they become its head's first.
                    parser.state = State::Head;
                    parser.resync_scanned = 0;
                    parser.empty_lines = MAX_EMPTY_LINES;
                    return self.head(half, data, out);
                }
                StartToken::Maybe => {
                    // Still too short to tell (a segment shorter than a method).
                    parser.head_buf.extend_from_slice(data);
                    return data.len();
                }
                // This segment's start is still a candidate (see `on_data`).
                StartToken::No => parser.clear_head_buf(),
            }
        }
        let from = if parser.resync_mid_line {
            match memchr::memchr(b'\n', data) {
                Some(nl) => {
                    parser.resync_mid_line = false;
                    nl + 1
                }
                None => {
                    parser.resync_scanned += data.len() as u64;
                    if parser.resync_scanned > MAX_RESYNC_SCAN && !parser.seen_http {
                        self.give_up(half, UndecodableFlowReason::NotHttp, out);
                    }
                    return data.len();
                }
            }
        } else {
            0
        };
        let rest = data.get(from..).unwrap_or_default();
        match find_message_start(rest, want_response) {
            Some(pos) => {
                parser.state = State::Idle;
                parser.resync_scanned = 0;
                parser.empty_lines = MAX_EMPTY_LINES;
                if from + pos == 0 {
                    // Already at the start: parse now rather than report no progress.
                    return self.head(half, data, out);
                }
                from + pos
            }
            None => {
                // Where the scan stops decides where the next segment's scan begins.
                let last_line = memchr::memrchr(b'\n', rest).map_or(0, |nl| nl + 1);
                let tail = rest.get(last_line..).unwrap_or_default();
                match start_token(tail, want_response) {
                    _ if tail.is_empty() => parser.resync_mid_line = false,
                    // A few bytes: no head buffer's room is reserved for them.
                    StartToken::Maybe => parser.head_buf.extend_from_slice(tail),
                    StartToken::Yes | StartToken::No => parser.resync_mid_line = true,
                }
                parser.resync_scanned += data.len() as u64;
                if parser.resync_scanned > MAX_RESYNC_SCAN && !parser.seen_http {
                    self.give_up(half, UndecodableFlowReason::NotHttp, out);
                }
                data.len()
            }
        }
    }

    /// Scans `held`, bytes kept from earlier segments, as resync would have had they come in
    /// one segment with what follows.
    fn refeed(&mut self, half: usize, held: &[u8], out: &mut Vec<HttpEvent>) {
        let was = std::mem::replace(&mut self.halves[half].refeeding, true);
        self.feed(half, held, out);
        self.halves[half].refeeding = was;
    }

    /// Bytes kept from earlier segments were scanned again: the segment that ended them is
    /// read again from its start (see [`Connection::feed`]), unless the half was given up.
    fn read_again_unless_ignored(&mut self, half: usize) {
        let parser = &mut self.halves[half];
        parser.read_again = !parser.is_ignored();
    }

    /// The connection carried HTTP: one of its directions parsed a message.
    fn carried_http(&self) -> bool {
        self.halves.iter().any(|h| h.seen_http)
    }

    fn head(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) -> usize {
        let limits = self.limits;
        let established = self.carried_http();
        // On the request direction of an HTTP connection any token is a method (RFC 9112
        // §3.1: REPORT, PURGE, M-SEARCH, ...), not only the ones a fresh flow is sniffed by.
        let any_method = established && self.client_half == Some(half);
        let parser = &mut self.halves[half];
        let refeeding = parser.refeeding;
        let fresh = matches!(parser.state, State::Idle);
        if fresh && matches!(data.first(), Some(b'\r' | b'\n')) {
            // RFC 9112 §2.2: empty lines before a message are ignored (and counted).
            let run = data
                .iter()
                .position(|b| !matches!(b, b'\r' | b'\n'))
                .unwrap_or(data.len());
            let lines = data.get(..run).unwrap_or_default();
            for _ in lines.iter().filter(|b| **b == b'\n') {
                if parser.empty_lines < MAX_EMPTY_LINES {
                    parser.empty_lines += 1;
                    out.push(HttpEvent::Anomaly {
                        exchange: None,
                        reason: FramingAnomaly::EmptyLineBetweenMessages,
                    });
                }
            }
            return run;
        }
        // A segment too short to tell whether a message starts is told with the next one's
        // bytes, so that the answer does not depend on where the bytes were cut.
        let mut joined = [0u8; MAX_METHOD + 1];
        let probe: Option<&[u8]> = if fresh {
            Some(data)
        } else if parser.start_undecided {
            let kept = parser.head_buf.len().min(joined.len());
            joined[..kept].copy_from_slice(&parser.head_buf[..kept]);
            let added = (joined.len() - kept).min(data.len());
            joined[kept..kept + added].copy_from_slice(&data[..added]);
            Some(&joined[..kept + added])
        } else {
            None
        };
        if let Some(probe) = probe {
            match sniff_start(probe, any_method) {
                StartSniff::Http => parser.start_undecided = false,
                StartSniff::Undecided => parser.start_undecided = true,
                StartSniff::NotHttp => {
                    let held = std::mem::take(&mut parser.head_buf);
                    if !established {
                        // Not HTTP at a message boundary: a TLS or other protocol flow.
                        self.give_up(half, classify_non_http(probe), out);
                        return data.len();
                    }
                    // An HTTP connection with something else where a message must start.
                    let reason = if probe.starts_with(b"HTTP/") {
                        HttpError::UnsupportedHttpVersion
                    } else {
                        HttpError::NotHttp
                    };
                    self.desync(half, reason, out);
                    if held.is_empty() {
                        return self.resync(half, data, out);
                    }
                    // Scan the bytes kept from earlier segments, then read this one again.
                    self.refeed(half, &held, out);
                    self.read_again_unless_ignored(half);
                    return 0;
                }
            }
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
        // A head that spans segments is parsed again only once its end may have arrived, so a
        // head sent a byte at a time costs linear, not quadratic, time. A short first segment
        // without the end waits for it too: small-packet traffic sends most heads in two, and
        // parsing the first half was a wasted parse per message. (Too short to hold more than
        // MAX_HEADERS headers, so the head-too-many check does not move.)
        let waits_for_end = if carried > 0 {
            !holds_head_end(buf.get(carried.saturating_sub(3)..))
        } else {
            // A segment ending the head (a head sent alone) is parsed without the search.
            let ends_head = buf.ends_with(b"\n\n") || buf.ends_with(b"\n\r\n");
            // Bytes scanned again are no first segment: a broken head among them is found now,
            // not once per start line, each copying the segment that follows them.
            !refeeding
                && buf.len() < SHORT_FIRST_SEGMENT
                && !ends_head
                && !holds_head_end(Some(buf))
        };
        // A buffer past the limit is parsed once all the same: a head broken before the limit
        // is read as broken, as it is when it comes in one segment.
        let parsed = if waits_for_end && buf.len() <= limits.max_head_bytes {
            HeadParse::Partial
        } else {
            parse_head(buf, &self.interest)
        };
        match parsed {
            HeadParse::Partial => {
                let parser = &mut self.halves[half];
                if carried == 0 {
                    parser.start_head_buf(data);
                }
                // The bytes of this segment the head took (all of them, unless it went past
                // the limit here).
                let took = parser.head_buf.len() - carried;
                if parser.head_buf.len() > limits.max_head_bytes {
                    out.push(HttpEvent::Error(HttpError::HeadTooLarge));
                    let response = parser.head_buf.starts_with(b"HTTP/");
                    // HTTP-shaped, only too big: keep looking for the next message, past
                    // the line the limit cut.
                    parser.seen_http = true;
                    parser.enter_resync(true);
                    if response {
                        // The skipped response answers the oldest pending request.
                        if let Some((exchange, _)) = self.pending.pop_front() {
                            out.push(HttpEvent::Abandoned {
                                exchange,
                                reason: AbandonReason::Desync,
                            });
                        }
                    } else {
                        // The skipped request still gets a response: queue a stand-in that
                        // keeps nothing, so the responses after it pair as they should.
                        self.client_half.get_or_insert(half);
                        let exchange = self.next_exchange;
                        self.next_exchange += 1;
                        self.pending
                            .push_back((exchange, PendingRequest::default()));
                    }
                    // The rest of the segment, past what the limit cut, is read by resync: a
                    // message behind the head is found as when the head came in one segment.
                    return took;
                }
                parser.state = State::Head;
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
                let held = std::mem::take(&mut parser.head_buf);
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
                } else if parser.synchronised_start && !parser.seen_http && !established {
                    // The first bytes of a connection seen from its SYN are not HTTP; decided
                    // the same way however the bytes were cut into segments.
                    self.give_up(half, classify_non_http(data), out);
                    return data.len();
                }
                if established {
                    // A message of an HTTP connection was lost: pairing by order is too.
                    self.abandon_pending(AbandonReason::Desync, out);
                }
                // Resync looks for the next start past this one's first line.
                let parser = &mut self.halves[half];
                parser.enter_resync(true);
                if carried > 0 {
                    // The head began in earlier segments: scan its bytes as resync would
                    // have had they come in one segment, then read this one again.
                    self.refeed(half, held.get(1..carried).unwrap_or_default(), out);
                    self.read_again_unless_ignored(half);
                    return 0;
                }
                // Skip one byte so resync looks for the next start past this one.
                1.min(data.len())
            }
            HeadParse::Rejected { reason, len, notes } => {
                for e in notes.iter().flatten() {
                    out.push(HttpEvent::Error(*e));
                }
                let parser = &mut self.halves[half];
                parser.seen_http = true;
                parser.clear_head_buf();
                self.desync(half, reason, out);
                // Resynchronise past the head: its body cannot be delimited.
                len.saturating_sub(carried).max(1).min(data.len())
            }
            HeadParse::Request {
                mut head,
                len,
                framing,
                facts,
            } => {
                let parser = &mut self.halves[half];
                parser.clear_head_buf();
                parser.seen_http = true;
                parser.empty_lines = 0;
                let used = len - carried;
                head.lenient |= facts.emit(out);
                self.start_request(half, head, framing, facts.codings, out);
                used
            }
            HeadParse::Response {
                mut head,
                len,
                framing,
                switching,
                facts,
            } => {
                let parser = &mut self.halves[half];
                parser.clear_head_buf();
                parser.seen_http = true;
                parser.empty_lines = 0;
                let used = len - carried;
                head.lenient |= facts.emit(out);
                self.start_response(half, head, framing, facts.codings, switching, out);
                used
            }
        }
    }

    /// The decoders for a kept body with `codings`, or why it cannot be decoded.
    fn decoder_for(codings: &Codings) -> Result<Option<Box<BodyDecoder>>, UndecodableReason> {
        if !codings.content.present && codings.transfer.is_empty() {
            return Ok(None);
        }
        if codings.content.overflow || codings.transfer.overflow {
            return Err(UndecodableReason::TooManyCodings);
        }
        let applied: Vec<Coding> = codings
            .content
            .iter()
            .chain(codings.transfer.iter())
            .collect();
        let decoder = BodyDecoder::new(&applied)?;
        Ok((!decoder.is_identity()).then(|| Box::new(decoder)))
    }

    /// `sink` with the decoders `codings` need: a body that cannot be decoded is skipped.
    fn coded_sink(
        sink: Sink,
        codings: &Codings,
        exchange: Option<u64>,
        out: &mut Vec<HttpEvent>,
    ) -> (Sink, Option<Box<BodyDecoder>>) {
        if matches!(sink, Sink::Discard) {
            return (sink, None);
        }
        match Self::decoder_for(codings) {
            Ok(coding) => (sink, coding),
            Err(reason) => {
                out.push(HttpEvent::Undecodable { exchange, reason });
                (Sink::Undecodable, None)
            }
        }
    }

    fn start_request(
        &mut self,
        half: usize,
        head: Box<RequestHead>,
        framing: Framing,
        codings: Codings,
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
                out.push(HttpEvent::Abandoned {
                    exchange,
                    reason: AbandonReason::TooManyPending,
                });
            }
        }
        self.pending
            .push_back((exchange, PendingRequest::of(&head, keep)));
        match framing {
            Framing::None => {
                self.halves[half].state = State::Idle;
                if keep {
                    out.push(HttpEvent::Request {
                        exchange,
                        head,
                        body: Vec::new(),
                    });
                }
            }
            framing => {
                let (sink, coding) = Self::coded_sink(sink, &codings, None, out);
                self.halves[half].state = State::Body {
                    framing,
                    sink,
                    coding,
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
        head: Box<ResponseHead>,
        mut framing: Framing,
        codings: Codings,
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
        if switching {
            let to = matched.as_ref().and_then(|(_, r)| r.upgrade.as_deref());
            self.give_up(half, switched_to(to), out);
            if let Some(client) = self.client_half.filter(|c| *c != half) {
                self.halves[client].state = State::Ignored;
            }
            return;
        }
        let parser = &mut self.halves[half];
        let Some((exchange, request)) = matched else {
            out.push(HttpEvent::Error(HttpError::UnmatchedResponse));
            parser.state = if matches!(framing, Framing::None) {
                State::Idle
            } else {
                State::Body {
                    framing,
                    sink: Sink::Discard,
                    coding: None,
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
        if request.head_method || head.status == 204 || head.status == 304 {
            framing = Framing::None;
        }
        let mcp = request.keep;
        let is_sse = |mt: Option<&str>| mt == Some("text/event-stream");
        let is_json_mt = |mt: Option<&str>| mt.is_some_and(is_json);
        let first = head.media_type.as_deref();
        let second = head.other_media_type.as_deref();
        let sink = if mcp
            && second.is_some()
            && (is_sse(first) || is_sse(second))
            && (is_json_mt(first) || is_json_mt(second))
        {
            // Peers disagree on which Content-Type counts: parse the body by what it is.
            Sink::Sniff
        } else if mcp && is_sse(first) {
            let max_event = self.limits.max_sse_event_bytes;
            Sink::Sse(
                self.spare_sse
                    .take()
                    .unwrap_or_else(|| Box::new(SseParser::new(max_event))),
            )
        } else if mcp && is_json_mt(first) {
            Sink::Json(json_buffer(&framing, self.limits.max_message_bytes))
        } else {
            Sink::Discard
        };
        if mcp {
            out.push(HttpEvent::ResponseHead { exchange, head });
        }
        // Set for a kept exchange only.
        let exchange = mcp.then_some(exchange);
        let (sink, coding) = if matches!(framing, Framing::None) {
            (sink, None)
        } else {
            Self::coded_sink(sink, &codings, exchange, out)
        };
        if matches!(framing, Framing::None) {
            self.halves[half].state = State::Idle;
            self.finish_body(sink, exchange, BodyEnd::Complete, out);
        } else {
            self.halves[half].state = State::Body {
                framing,
                sink,
                coding,
                exchange,
                request: None,
                is_request: false,
            };
        }
    }

    fn body(&mut self, half: usize, data: &[u8], out: &mut Vec<HttpEvent>) -> usize {
        let limits = self.limits;
        let max_message = limits.max_message_bytes;
        let State::Body {
            framing,
            sink,
            coding,
            exchange,
            request,
            is_request,
        } = &mut self.halves[half].state
        else {
            return 0;
        };
        let mut ctx = Feed {
            limits,
            exchange: if *is_request { None } else { *exchange },
            too_large: false,
            undecodable: None,
        };
        let progress = match framing {
            Framing::None => Ok((0, true)),
            Framing::Length(remaining) => {
                let take = (*remaining).min(data.len() as u64) as usize;
                feed(coding, sink, &data[..take], &mut ctx, out);
                *remaining -= take as u64;
                Ok((take, *remaining == 0))
            }
            Framing::UntilClose | Framing::Delimited => {
                feed(coding, sink, data, &mut ctx, out);
                Ok((data.len(), false))
            }
            Framing::Chunked(decoder) => {
                let status = decoder
                    .push(data, &mut |bytes: &[u8]| {
                        feed(coding, sink, bytes, &mut ctx, out)
                    })
                    .map(|status| (status.consumed, status.done));
                let anomalies = decoder.take_anomalies();
                if anomalies != 0 {
                    if let Some(head) = request.as_mut().filter(|_| *is_request) {
                        head.lenient = true;
                    }
                    for reason in chunked::anomalies(anomalies) {
                        out.push(HttpEvent::Anomaly {
                            exchange: ctx.exchange,
                            reason,
                        });
                    }
                }
                status
            }
        };
        if ctx.too_large {
            out.push(HttpEvent::Error(HttpError::MessageTooLarge));
        }
        if let Some(reason) = ctx.undecodable {
            out.push(HttpEvent::Undecodable {
                exchange: ctx.exchange,
                reason,
            });
        }
        let expected = match framing {
            Framing::Length(remaining) => *remaining,
            Framing::Chunked(decoder) => decoder.chunk_remaining(),
            Framing::None | Framing::UntilClose | Framing::Delimited => 0,
        };
        if coding.is_none() {
            sink.reserve_hint(expected, max_message);
        }
        let mut held = Vec::new();
        let (used, end) = match progress {
            Ok((used, true)) => (used, BodyEnd::Complete),
            Ok((used, false)) => return used,
            Err(_) => {
                out.push(HttpEvent::Error(HttpError::BadChunk));
                // Resync looks from where the broken framing began: a message that starts
                // there (a server that cut a body short) is read, as in the next segment.
                // A size line begun in earlier segments is scanned from its first byte.
                let (failed_at, carried) = match framing {
                    Framing::Chunked(decoder) => (decoder.failed_at(), decoder.take_carried()),
                    _ => (data.len(), Vec::new()),
                };
                held = carried;
                (failed_at.min(data.len()), BodyEnd::Aborted)
            }
        };
        let next = if end == BodyEnd::Complete {
            State::Idle
        } else {
            State::Resync
        };
        self.end_body(half, end, next, out);
        if end == BodyEnd::Aborted {
            // Resync starts where the failing step began: a message may start there.
            self.halves[half].enter_resync(false);
        }
        if used == 0 && !held.is_empty() {
            self.refeed(half, &held, out);
        }
        if used == 0 {
            // The framing broke at this segment's first byte: resync reads it from there.
            self.read_again_unless_ignored(half);
        }
        used
    }

    /// The body ended: hands what its decoders still hold to the sink.
    fn drain_coding(
        &self,
        coding: &mut Option<Box<BodyDecoder>>,
        sink: &mut Sink,
        exchange: Option<u64>,
        out: &mut Vec<HttpEvent>,
    ) {
        let Some(mut decoder) = coding.take() else {
            return;
        };
        let mut ctx = Feed {
            limits: self.limits,
            exchange,
            too_large: false,
            undecodable: None,
        };
        let result = decoder.finish(&mut |bytes: &[u8]| feed_sink(sink, bytes, &mut ctx, out));
        if ctx.too_large {
            out.push(HttpEvent::Error(HttpError::MessageTooLarge));
        }
        if let Err(reason) = result {
            *sink = Sink::Undecodable;
            out.push(HttpEvent::Undecodable { exchange, reason });
        }
    }

    /// Ends the body open in half `half` as `end`, leaving the half in state `next`: a request
    /// is emitted whole (when complete), a response's end is reported.
    fn end_body(&mut self, half: usize, end: BodyEnd, next: State, out: &mut Vec<HttpEvent>) {
        let state = std::mem::replace(&mut self.halves[half].state, next);
        if let State::Body {
            mut sink,
            mut coding,
            exchange,
            request,
            is_request,
            ..
        } = state
        {
            if end == BodyEnd::Complete {
                let feed_exchange = if is_request { None } else { exchange };
                self.drain_coding(&mut coding, &mut sink, feed_exchange, out);
            }
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
                self.finish_body(sink, exchange, end, out);
            }
        }
    }

    /// Emits the end of a response body (requests are emitted whole, never ended); `exchange`
    /// is set when the exchange is kept.
    fn finish_body(
        &mut self,
        sink: Sink,
        exchange: Option<u64>,
        mut end: BodyEnd,
        out: &mut Vec<HttpEvent>,
    ) {
        let Some(ex) = exchange else { return };
        // A body read until the server closed is as complete as a framed one.
        let complete = matches!(end, BodyEnd::Complete | BodyEnd::ServerClosed);
        match sink {
            Sink::Json(body) if complete && !body.is_empty() => {
                out.push(HttpEvent::ResponseJson { exchange: ex, body })
            }
            Sink::Sse(mut parser) => {
                if parser.overflows() > 0 && complete {
                    // An event over the size cap was dropped (it may have been the answer):
                    // the stream cannot count as one that ended empty.
                    end = BodyEnd::Aborted;
                }
                parser.recycle();
                self.spare_sse = Some(parser);
            }
            // Its answer could not be read: the body cannot count as an empty stream.
            Sink::Undecodable if complete => end = BodyEnd::Aborted,
            _ => {}
        }
        out.push(HttpEvent::ResponseEnd { exchange: ex, end });
    }

    /// Bytes held for messages in progress (heads, JSON bodies, SSE events, decoders), each
    /// half's head buffer as allocated (kept between heads) and the spare SSE parser's
    /// buffers, for the pipeline's memory budget.
    pub fn buffered_bytes(&self) -> usize {
        let spare = self.spare_sse.as_ref().map_or(0, |p| p.buffered_bytes());
        spare
            + self.pending.held_bytes()
            + self
                .halves
                .iter()
                .map(|h| {
                    h.head_buf.capacity()
                        + match &h.state {
                            State::Body {
                                framing,
                                sink,
                                coding,
                                request,
                                ..
                            } => {
                                // A kept request's head waits here for its body.
                                request.as_ref().map_or(0, |r| {
                                    std::mem::size_of::<RequestHead>() + r.heap_bytes()
                                }) + match framing {
                                    Framing::Chunked(decoder) => decoder.buffered_bytes(),
                                    _ => 0,
                                } + coding.as_ref().map_or(0, |c| c.memory())
                                    + match sink {
                                        Sink::Json(b) => b.capacity(),
                                        Sink::Sse(p) => p.buffered_bytes(),
                                        _ => 0,
                                    }
                            }
                            _ => 0,
                        }
                })
                .sum::<usize>()
    }
}

/// What one feed of body bytes needs and reports.
struct Feed {
    limits: HttpLimits,
    /// The kept response the bytes belong to (None for requests).
    exchange: Option<u64>,
    too_large: bool,
    undecodable: Option<UndecodableReason>,
}

/// Passes body bytes through the decoders (if any) to the sink.
fn feed(
    coding: &mut Option<Box<BodyDecoder>>,
    sink: &mut Sink,
    bytes: &[u8],
    ctx: &mut Feed,
    out: &mut Vec<HttpEvent>,
) {
    let Some(decoder) = coding else {
        return feed_sink(sink, bytes, ctx, out);
    };
    if matches!(sink, Sink::Discard | Sink::Undecodable) {
        // Nothing will use the decoded bytes (e.g. over the size cap): do not decode them.
        return;
    }
    let result = decoder.push(bytes, &mut |decoded: &[u8]| {
        feed_sink(sink, decoded, ctx, out)
    });
    if let Err(reason) = result {
        *coding = None;
        *sink = Sink::Undecodable;
        ctx.undecodable = Some(reason);
    }
}

/// Hands decoded body bytes to the sink.
fn feed_sink(sink: &mut Sink, bytes: &[u8], ctx: &mut Feed, out: &mut Vec<HttpEvent>) {
    if let Sink::Sniff = sink {
        let Some(first) = bytes.iter().find(|b| !b.is_ascii_whitespace()) else {
            return;
        };
        *sink = if matches!(first, b'{' | b'[') {
            Sink::Json(Vec::new())
        } else {
            Sink::Sse(Box::new(SseParser::new(ctx.limits.max_sse_event_bytes)))
        };
    }
    match sink {
        Sink::Discard | Sink::Sniff | Sink::Undecodable => {}
        Sink::Json(buf) => {
            if buf.len() + bytes.len() > ctx.limits.max_message_bytes {
                ctx.too_large = true;
                *sink = Sink::Discard;
            } else {
                buf.extend_from_slice(bytes);
            }
        }
        Sink::Sse(parser) => {
            let overflows = parser.overflows();
            let exchange = ctx.exchange;
            parser.push_each(bytes, |item| {
                if let Some(exchange) = exchange {
                    out.push(HttpEvent::ResponseSse { exchange, item });
                }
            });
            if parser.overflows() > overflows {
                // An event beyond the size cap was dropped.
                ctx.too_large = true;
            }
        }
    }
}

/// The codings a body was encoded with, in the order applied: content codings first, then the
/// transfer codings other than the final chunked.
#[derive(Debug, Clone, Copy, Default)]
struct Codings {
    content: CodingList,
    transfer: CodingList,
}

/// What the framing headers of one head said besides the framing itself.
#[derive(Debug, Default)]
struct HeadFacts {
    codings: Codings,
    /// Counted problems that do not stop the message (TE with CL, unknown coding, ...).
    notes: [Option<HttpError>; 3],
    /// Bits of [`DuplicateHeader`] seen more than once.
    duplicates: u16,
    bare_lf: bool,
    /// The head had obs-fold continuation lines and was parsed unfolded.
    obs_fold: bool,
}

impl HeadFacts {
    fn note(&mut self, e: HttpError) {
        if let Some(slot) = self.notes.iter_mut().find(|n| n.is_none()) {
            *slot = Some(e);
        }
    }

    /// Emits the counted facts; returns whether the head needed leniency.
    fn emit(&self, out: &mut Vec<HttpEvent>) -> bool {
        for e in self.notes.iter().flatten() {
            out.push(HttpEvent::Error(*e));
        }
        if self.duplicates != 0 {
            for &header in DuplicateHeader::ALL {
                if self.duplicates & (1 << header as u16) != 0 {
                    out.push(HttpEvent::DuplicateHeader { header });
                }
            }
        }
        if self.bare_lf {
            out.push(HttpEvent::Anomaly {
                exchange: None,
                reason: FramingAnomaly::BareLf,
            });
        }
        if self.obs_fold {
            out.push(HttpEvent::Anomaly {
                exchange: None,
                reason: FramingAnomaly::ObsFold,
            });
        }
        self.bare_lf || self.obs_fold
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
    /// A head that parsed but whose body cannot be delimited (RFC 9112 §6.3: an invalid or
    /// conflicting Content-Length, a request whose final transfer coding is not chunked).
    Rejected {
        reason: HttpError,
        len: usize,
        /// Problems counted on the way (Transfer-Encoding with Content-Length, ...).
        notes: [Option<HttpError>; 3],
    },
    Request {
        head: Box<RequestHead>,
        len: usize,
        framing: Framing,
        facts: HeadFacts,
    },
    Response {
        head: Box<ResponseHead>,
        len: usize,
        framing: Framing,
        switching: bool,
        facts: HeadFacts,
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

/// Whether a line of the head `buf[..len]` ends in a bare LF: a line feed with no carriage
/// return before it anywhere in the head (every line feed of a parsed head ends a line).
fn head_has_bare_lf(buf: &[u8], len: usize) -> bool {
    let head = buf.get(..len).unwrap_or_default();
    if head.first() == Some(&b'\n') {
        return true;
    }
    // Each byte pair `(a, b)` where `b` is a bare line feed; sixteen pairs at a time,
    // branch-free (vector compares), the last window moved back to end at the end.
    let bare_in = |w: &[u8; LF_WINDOW]| {
        let mut hit = false;
        for k in 0..LF_WINDOW - 1 {
            hit |= (w[k + 1] == b'\n') & (w[k] != b'\r');
        }
        hit
    };
    let bare = if head.len() < LF_WINDOW {
        head.windows(2).any(|p| p[1] == b'\n' && p[0] != b'\r')
    } else {
        let mut at = 0;
        loop {
            let start = at.min(head.len() - LF_WINDOW);
            let window: Option<&[u8; LF_WINDOW]> = head
                .get(start..start + LF_WINDOW)
                .and_then(|w| w.try_into().ok());
            if window.is_some_and(bare_in) {
                break true;
            }
            if start == head.len() - LF_WINDOW {
                break false;
            }
            at += LF_WINDOW - 1;
        }
    };
    bare || !head.ends_with(b"\r\n")
}

/// Bytes [`head_has_bare_lf`] looks at together: 16 pairs.
const LF_WINDOW: usize = 17;

/// Parses a head; one that httparse rejects for obs-fold continuation lines (which h11 and
/// llhttp accept) is parsed again unfolded, and marked so.
fn parse_head(buf: &[u8], interest: &Interest) -> HeadParse {
    let first = parse_head_once(buf, interest);
    if !matches!(
        first,
        HeadParse::Invalid {
            in_headers: true,
            ..
        }
    ) {
        return first;
    }
    match unfold(buf) {
        Unfolded::NoFold => first,
        // The fold may be answered by more lines: wait for the end of the head.
        Unfolded::Incomplete => HeadParse::Partial,
        Unfolded::Head { bytes, len } => match parse_head_once(&bytes, interest) {
            HeadParse::Request {
                head,
                framing,
                mut facts,
                ..
            } => {
                facts.obs_fold = true;
                HeadParse::Request {
                    head,
                    len,
                    framing,
                    facts,
                }
            }
            HeadParse::Response {
                head,
                framing,
                switching,
                mut facts,
                ..
            } => {
                facts.obs_fold = true;
                HeadParse::Response {
                    head,
                    len,
                    framing,
                    switching,
                    facts,
                }
            }
            HeadParse::Rejected { reason, notes, .. } => HeadParse::Rejected { reason, len, notes },
            _ => first,
        },
    }
}

/// A head with its obs-fold continuation lines joined.
enum Unfolded {
    /// No continuation line before the end of the head (or of the data).
    NoFold,
    /// A continuation line, but the head does not end in the data yet.
    Incomplete,
    /// The head up to its empty line, unfolded, and its length in the original bytes.
    Head { bytes: Vec<u8>, len: usize },
}

/// Joins each line break followed by SP or HT to the line before it with one space (RFC 9112
/// §5.2), up to the empty line that ends the head. A continuation that reads like a header
/// field of its own (`Content-Length: 38` behind a space) is not unfolded: that is a smuggling
/// shape, and llhttp rejects it too. Nor is a head with a line that is neither a field nor a
/// continuation (the unfolded head would fail there as well), and the scan stops at that line.
fn unfold(buf: &[u8]) -> Unfolded {
    // Grown as lines are taken, not sized to `buf`: most heads given here are broken, not
    // folded, and stop within their first lines; a buffer the size of the rest of a 256 KB
    // segment for each was allocator work in proportion to the segment.
    let mut out = Vec::new();
    let mut folded = false;
    let mut line_start = 0;
    // The current line continues a folded one: an empty remainder is not the end of the head.
    let mut continuing = false;
    while let Some(nl) = memchr::memchr(b'\n', buf.get(line_start..).unwrap_or_default()) {
        let at = line_start + nl;
        let line = buf.get(line_start..at).unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() && line_start > 0 && !continuing {
            if !folded {
                return Unfolded::NoFold;
            }
            out.extend_from_slice(b"\r\n");
            return Unfolded::Head {
                bytes: out,
                len: at + 1,
            };
        }
        if continuing && looks_like_field(line) {
            return Unfolded::NoFold;
        }
        if !continuing && line_start > 0 && !looks_like_field(line) {
            // Neither a field nor a continuation: no unfolding makes this head valid. Stopping
            // here keeps the scan within the head: a segment of heads each broken in its first
            // field, with no empty line after them, was scanned to its end once per head.
            return Unfolded::NoFold;
        }
        out.extend_from_slice(line);
        let next = at + 1;
        if (line_start > 0 || continuing) && matches!(buf.get(next), Some(b' ' | b'\t')) {
            folded = true;
            out.push(b' ');
            let mut j = next;
            while matches!(buf.get(j), Some(b' ' | b'\t')) {
                j += 1;
            }
            line_start = j;
            continuing = true;
            continue;
        }
        out.extend_from_slice(b"\r\n");
        line_start = next;
        continuing = false;
    }
    if folded {
        Unfolded::Incomplete
    } else {
        Unfolded::NoFold
    }
}

/// `token ":"` at the start of a line: a header field.
fn looks_like_field(line: &[u8]) -> bool {
    let name_len = line
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
        .count();
    name_len > 0 && line.get(name_len) == Some(&b':')
}

fn parse_head_once(buf: &[u8], interest: &Interest) -> HeadParse {
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
                // Boxed here: it moves through the parse by pointer.
                let mut head = Box::new(ResponseHead {
                    status,
                    ..Default::default()
                });
                // Validated once, as a request head is: its values are then read as slices.
                let within = HeadStr::of(buf.get(..len).unwrap_or_default());
                let (length, mut facts) = scan_headers(resp.headers, |name, value| {
                    note_response_header(&mut head, interest, name, value, within)
                });
                facts.bare_lf = head_has_bare_lf(buf, len);
                let no_body = (100..200).contains(&status);
                let framing = if no_body {
                    Ok(Framing::None)
                } else {
                    decide_framing(length, false, &mut facts)
                };
                match framing {
                    Ok(framing) => HeadParse::Response {
                        head,
                        len,
                        framing,
                        switching: status == 101,
                        facts,
                    },
                    Err(reason) => HeadParse::Rejected {
                        reason,
                        len,
                        notes: facts.notes,
                    },
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
                let mut head = Box::new(RequestHead::new(
                    req.method.unwrap_or(""),
                    req.path.unwrap_or(""),
                ));
                let within = HeadStr::of(buf.get(..len).unwrap_or_default());
                let (length, mut facts) = scan_headers(req.headers, |name, value| {
                    note_request_header(&mut head, interest, name, value, within)
                });
                facts.bare_lf = head_has_bare_lf(buf, len);
                match decide_framing(length, true, &mut facts) {
                    Ok(framing) => HeadParse::Request {
                        head,
                        len,
                        framing,
                        facts,
                    },
                    Err(reason) => HeadParse::Rejected {
                        reason,
                        len,
                        notes: facts.notes,
                    },
                }
            }
        }
    }
}

/// What the Content-Length headers of a head say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    Absent,
    Valid(u64),
    /// Not one decimal number below 2^64, or a list of differing values.
    Invalid,
    /// Headers with different values.
    Conflicting,
}

/// One Content-Length header value: `1*DIGIT`, or a list of identical ones (`4, 4`, which
/// RFC 9110 §8.6 allows a recipient to accept).
fn parse_content_length(value: &[u8]) -> Option<u64> {
    let mut found: Option<u64> = None;
    for member in value.split(|b| *b == b',') {
        let member = member.trim_ascii();
        if member.is_empty() || !member.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = member.iter().try_fold(0u64, |acc, d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        if found.is_some_and(|f| f != n) {
            return None;
        }
        found = Some(n);
    }
    found
}

/// Reads the framing headers (Content-Length, every Transfer-Encoding, Content-Encoding),
/// passing every other header to `visit`, which says when one is a counted duplicate.
fn scan_headers(
    headers: &[httparse::Header<'_>],
    mut visit: impl FnMut(&str, &[u8]) -> Option<DuplicateHeader>,
) -> (Length, HeadFacts) {
    let mut facts = HeadFacts::default();
    let mut length = Length::Absent;
    let mut seen = 0u16;
    let mut note = |facts: &mut HeadFacts, h: DuplicateHeader| {
        let bit = 1 << h as u16;
        if seen & bit != 0 {
            facts.duplicates |= bit;
        }
        seen |= bit;
    };
    for h in headers {
        // One comparison per header, chosen by the length of its name.
        match h.name.len() {
            17 if eq_ignore_case(h.name, "transfer-encoding") => {
                note(&mut facts, DuplicateHeader::TransferEncoding);
                facts.codings.transfer.add_header(h.value);
            }
            14 if eq_ignore_case(h.name, "content-length") => {
                note(&mut facts, DuplicateHeader::ContentLength);
                length = match (length, parse_content_length(h.value)) {
                    (Length::Invalid, _) | (_, None) => Length::Invalid,
                    (Length::Absent, Some(n)) => Length::Valid(n),
                    (Length::Valid(a), Some(b)) if a == b => Length::Valid(a),
                    (Length::Valid(_) | Length::Conflicting, Some(_)) => Length::Conflicting,
                };
            }
            16 if eq_ignore_case(h.name, "content-encoding") => {
                note(&mut facts, DuplicateHeader::ContentEncoding);
                facts.codings.content.add_header(h.value);
            }
            _ => {
                if let Some(dup) = visit(h.name, h.value) {
                    facts.duplicates |= 1 << dup as u16;
                }
            }
        }
    }
    (length, facts)
}

/// The body's framing by RFC 9112 §6.3, or why it cannot be delimited. The transfer codings
/// left in `facts` are those to decode after de-chunking.
fn decide_framing(
    length: Length,
    request: bool,
    facts: &mut HeadFacts,
) -> Result<Framing, HttpError> {
    let te = facts.codings.transfer;
    if te.present {
        if length != Length::Absent {
            // Transfer-Encoding overrides Content-Length.
            facts.note(HttpError::TeWithContentLength);
        }
        if te.is_empty() || te.iter().any(|c| c == Coding::Unknown) {
            facts.note(HttpError::UnknownTransferCoding);
        }
        let chunked = te.iter().filter(|c| *c == Coding::Chunked).count();
        // RFC 9112 §6.3: the final coding decides; chunked applied twice is a sender's error
        // that peers (hyper) still decode as one chunked body.
        let final_chunked = chunked >= 1 && te.last() == Some(Coding::Chunked) && !te.overflow;
        if final_chunked {
            let mut rest = CodingList::default();
            for c in te
                .iter()
                .filter(|c| !matches!(c, Coding::Chunked | Coding::Identity))
            {
                rest.push(c);
            }
            facts.codings.transfer = rest;
            return Ok(Framing::Chunked(ChunkedDecoder::new()));
        }
        if request {
            return Err(HttpError::ChunkedNotFinal);
        }
        if chunked > 0 {
            facts.note(HttpError::ChunkedNotFinal);
        }
        let mut rest = CodingList::default();
        rest.overflow = te.overflow;
        for c in te.iter().filter(|c| *c != Coding::Identity) {
            rest.push(c);
        }
        facts.codings.transfer = rest;
        return Ok(Framing::UntilClose);
    }
    match length {
        Length::Invalid => Err(HttpError::InvalidContentLength),
        Length::Conflicting => Err(HttpError::ConflictingContentLength),
        Length::Valid(0) => Ok(Framing::None),
        Length::Valid(n) => Ok(Framing::Length(n)),
        Length::Absent if request => Ok(Framing::None),
        Length::Absent => Ok(Framing::UntilClose),
    }
}

/// Below this, a head's first segment cannot hold more than [`MAX_HEADERS`] header lines
/// (each at least `a:` and a line feed).
const SHORT_FIRST_SEGMENT: usize = 3 * MAX_HEADERS;

/// Whether `bytes` hold the empty line that ends a head (`\n\n` or `\n\r\n`).
fn holds_head_end(bytes: Option<&[u8]>) -> bool {
    let bytes = bytes.unwrap_or_default();
    // A line feed followed by a line feed, or by CR LF, at start `k`.
    let ends_at = |b: &[u8], k: usize| {
        b.get(k) == Some(&b'\n')
            && (b.get(k + 1) == Some(&b'\n')
                || (b.get(k + 1) == Some(&b'\r') && b.get(k + 2) == Some(&b'\n')))
    };
    let len = bytes.len();
    if len < WINDOW {
        return (0..len).any(|k| ends_at(bytes, k));
    }
    // Sixteen starts at a time, branch-free, so that the compiler makes vector compares of it;
    // the last window is moved back to end at the end (overlapping the one before).
    let window_has_end = |w: &[u8; WINDOW]| {
        let mut hit = false;
        for k in 0..WINDOW - 2 {
            let (a, b, c) = (w[k], w[k + 1], w[k + 2]);
            hit |= (a == b'\n') & ((b == b'\n') | ((b == b'\r') & (c == b'\n')));
        }
        hit
    };
    let mut at = 0;
    loop {
        let start = at.min(len - WINDOW);
        if let Some(w) = bytes
            .get(start..start + WINDOW)
            .and_then(|w| w.try_into().ok())
            && window_has_end(w)
        {
            return true;
        }
        if start == len - WINDOW {
            // The one start the windows leave out: LF LF as the last two bytes.
            return ends_at(bytes, len - 2);
        }
        at += WINDOW - 2;
    }
}

/// Bytes [`holds_head_end`] looks at together: 16 starts and the two bytes after the last.
const WINDOW: usize = 18;

/// What a connection whose first bytes are not HTTP/1.1 carries, as far as they tell.
fn classify_non_http(data: &[u8]) -> UndecodableFlowReason {
    const TLS_RECORD_TYPES: std::ops::RangeInclusive<u8> = 0x14..=0x17;
    match data {
        [t, 0x03, v, ..] if TLS_RECORD_TYPES.contains(t) && *v <= 0x04 => {
            UndecodableFlowReason::Tls
        }
        _ if data.starts_with(b"PRI * HTTP/2") => UndecodableFlowReason::H2c,
        _ => UndecodableFlowReason::NotHttp,
    }
}

/// What a `101 Switching Protocols` switched to, by the request's `Upgrade` header.
fn switched_to(upgrade: Option<&str>) -> UndecodableFlowReason {
    let upgrade = upgrade.unwrap_or_default().to_ascii_lowercase();
    if upgrade.contains("h2c") {
        UndecodableFlowReason::H2c
    } else if upgrade.contains("websocket") {
        UndecodableFlowReason::Websocket
    } else {
        UndecodableFlowReason::Upgrade
    }
}

/// Longest extension method taken as a request start (`UPDATEREDIRECTREF` is 17).
const MAX_METHOD: usize = 24;

/// What the bytes at a message boundary say about a message starting there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartSniff {
    Http,
    NotHttp,
    /// They end before telling: the beginning of a start, or a token that may be a method.
    Undecided,
}

/// Whether `data` starts an HTTP message: a response, a request by a known method, or
/// with `any_method` (the request direction of an HTTP connection) any method token and a
/// space (RFC 9112 §3.1). Looks at most [`MAX_METHOD`] + 1 bytes, once per message.
fn sniff_start(data: &[u8], any_method: bool) -> StartSniff {
    match start_token(data, None) {
        StartToken::Yes => return StartSniff::Http,
        StartToken::Maybe => return StartSniff::Undecided,
        StartToken::No if !any_method => return StartSniff::NotHttp,
        StartToken::No => {}
    }
    let is_tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    let head = data
        .get(..data.len().min(MAX_METHOD + 1))
        .unwrap_or_default();
    match head.iter().position(|b| !is_tchar(b)) {
        Some(i) if i > 0 && head.get(i) == Some(&b' ') => StartSniff::Http,
        Some(_) => StartSniff::NotHttp,
        None if head.len() <= MAX_METHOD => StartSniff::Undecided,
        None => StartSniff::NotHttp,
    }
}

/// The longest message start [`start_token`] looks for (`OPTIONS `).
const START_TOKEN_MAX: usize = 8;

/// What the bytes at a line start say about a message starting there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartToken {
    /// They begin with a request method or `HTTP/1.`, as `want_response` asks.
    Yes,
    /// Too few to tell: they are the beginning of one.
    Maybe,
    No,
}

fn start_token(line: &[u8], want_response: Option<bool>) -> StartToken {
    let requests = want_response != Some(true);
    let tokens = (want_response != Some(false))
        .then_some(&b"HTTP/1."[..])
        .into_iter()
        .chain(METHODS.iter().copied().filter(|_| requests));
    let mut answer = StartToken::No;
    for token in tokens {
        if line.starts_with(token) {
            return StartToken::Yes;
        }
        if line.len() < token.len() && token.starts_with(line) {
            answer = StartToken::Maybe;
        }
    }
    answer
}

/// Finds the offset of the next plausible message start at a line beginning. `want_response`
/// narrows the search once the direction is known.
fn find_message_start(data: &[u8], want_response: Option<bool>) -> Option<usize> {
    let mut line_start = 0;
    loop {
        let rest = data.get(line_start..)?;
        if start_token(rest, want_response) == StartToken::Yes {
            return Some(line_start);
        }
        let nl = memchr::memchr(b'\n', rest)?;
        line_start += nl + 1;
    }
}

#[cfg(test)]
mod tests;
