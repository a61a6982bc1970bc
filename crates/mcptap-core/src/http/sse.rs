//! Incremental, sans-IO `text/event-stream` parser.
//!
//! Implements the WHATWG HTML "Parsing an event stream" and "Interpreting an
//! event stream" algorithms over de-chunked body bytes that arrive in
//! arbitrary pieces. Feeding a stream in any split produces exactly the same
//! items as feeding it at once.
//!
//! Differences from a browser `EventSource`, chosen for a passive monitor:
//! - `SseEvent::id` is the `id` field seen in the dispatched block itself,
//!   not the persistent "last event ID" (which the caller can track).
//! - An empty `event:` value is reported as `None`, which is what it means
//!   per spec (type "message").
//! - Blocks with fields but no `data` are reported as [`SseItem::NoData`]
//!   and every comment line as [`SseItem::Comment`], so callers can count
//!   priming blocks and keep-alives.
//! - `retry` values that overflow `u64` are ignored.

use memchr::{memchr, memchr2};
use std::borrow::Cow;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Capacity kept for the partial-line buffer after an overflow, so one huge
/// event does not pin its memory for the rest of the stream.
const RETAINED_LINE_CAPACITY: usize = 1024;

/// Most capacity carried over to the next event's data buffer.
const RETAINED_DATA_CAPACITY: usize = 64 << 10;

/// Most capacity an event's type or id buffer keeps for the next event.
const RETAINED_FIELD_CAPACITY: usize = 256;

/// Most items [`SseParser::push_each`]'s buffer keeps between pushes.
const RETAINED_ITEMS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// `event` field; `None` when absent, empty or `message` (the default type).
    pub event_type: Option<String>,
    /// `data` values joined with '\n', as sent: decoded by [`SseEvent::text`] where it is
    /// read (the session layer), not on the thread that frames the stream.
    pub data: Vec<u8>,
    /// `id` field of this block; `None` if the block had none.
    pub id: Option<String>,
    /// `retry` field of this block, if valid.
    pub retry: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A dispatched event (a block that had at least one `data` field; `data:` with an empty value counts, giving data "").
    Event(SseEvent),
    /// A block ended by a blank line that had fields (id/event/retry/unknown) but no `data` field: not dispatched per spec, reported so callers can count priming blocks.
    NoData { id: Option<String> },
    /// One comment line (starts with ':').
    Comment,
}

/// Fields collected for the block (event) currently being parsed. Buffers
/// are reused across blocks to avoid per-line allocations.
#[derive(Debug, Default)]
struct Block {
    /// `data` values joined with '\n' (no trailing newline).
    data: Vec<u8>,
    has_data: bool,
    event_type: Vec<u8>,
    id: Vec<u8>,
    has_id: bool,
    retry: Option<u64>,
    /// Any field line (known or unknown) was seen.
    has_fields: bool,
}

impl Block {
    fn buffered_bytes(&self) -> usize {
        self.data.len() + self.event_type.len() + self.id.len()
    }

    fn reset(&mut self) {
        self.data.clear();
        self.has_data = false;
        // An event's type and id are short; a long one's room is not kept for the stream.
        for field in [&mut self.event_type, &mut self.id] {
            if field.capacity() > RETAINED_FIELD_CAPACITY {
                *field = Vec::new();
            } else {
                field.clear();
            }
        }
        self.has_id = false;
        self.retry = None;
        self.has_fields = false;
    }
}

#[derive(Debug)]
pub struct SseParser {
    max_event_bytes: usize,
    /// Start of a line whose terminator has not arrived yet. Empty in the
    /// common case where a line is complete within one `push`.
    partial_line: Vec<u8>,
    /// No byte of the stream has been interpreted yet, so a BOM may follow.
    at_stream_start: bool,
    /// How many BOM bytes have been matched at the stream start (a BOM can
    /// be split across pushes).
    bom_matched: usize,
    /// The previous push ended with a CR, which already terminated a line;
    /// a LF at the start of the next push completes that CRLF.
    pending_cr: bool,
    /// An event overflowed; input is dropped until the next blank line.
    discarding: bool,
    /// While discarding: the current line has bytes (so it is not blank).
    discard_line_nonempty: bool,
    block: Block,
    /// The unterminated line is a `data` field whose value is appended straight to the event's
    /// data buffer as it arrives (instead of into `partial_line` and then copied): tool results
    /// are long single `data:` lines spanning many segments.
    data_line: Option<DataLine>,
    overflows: u64,
    events_dispatched: u64,
    /// Items of the push under way in [`SseParser::push_each`], kept empty between pushes:
    /// a keep-alive comment per packet must not allocate a vector per packet.
    items: Vec<SseItem>,
}

/// Where a `data` line being streamed sits in `Block::data`.
#[derive(Debug, Clone, Copy)]
struct DataLine {
    /// Index in `Block::data` where this line's value starts.
    start: usize,
    /// Bytes before the value in the raw line: `data:` or `data: `.
    prefix: usize,
    /// A separating `\n` was pushed before the value (the block already had data).
    separator: bool,
}

impl SseParser {
    /// Bytes held for the event being assembled, as allocated (for memory accounting): the
    /// buffers keep their room between events, and a spare parser between streams (see
    /// [`SseParser::recycle`]).
    pub fn buffered_bytes(&self) -> usize {
        self.partial_line.capacity()
            + self.block.data.capacity()
            + self.block.event_type.capacity()
            + self.block.id.capacity()
    }

    /// `max_event_bytes`: cap on the bytes buffered for one event (sum of field values + current partial line). When exceeded, the event is dropped, `overflows()` increments, and the parser discards input until the next blank line; memory stays bounded no matter how long a line is (think a 50 MB line without newline).
    ///
    /// The check uses the raw length of the current line, whatever its
    /// kind, so an over-long comment line also drops the current event;
    /// this keeps the result independent of how the input is split.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            partial_line: Vec::new(),
            at_stream_start: true,
            bom_matched: 0,
            pending_cr: false,
            discarding: false,
            discard_line_nonempty: false,
            block: Block::default(),
            data_line: None,
            overflows: 0,
            events_dispatched: 0,
            items: Vec::new(),
        }
    }

    /// Feed de-chunked body bytes; appends completed items to `out`. Never panics on any input.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<SseItem>) {
        if !self.at_stream_start {
            self.feed(input, out);
            return;
        }
        // Match a (possibly split) BOM at the very start of the stream.
        let mut used = 0;
        for &byte in input {
            match BOM.get(self.bom_matched) {
                Some(&expected) if byte == expected => {
                    self.bom_matched += 1;
                    used += 1;
                }
                _ => break,
            }
        }
        let rest = input.get(used..).unwrap_or_default();
        if self.bom_matched == BOM.len() {
            self.at_stream_start = false;
            self.feed(rest, out);
        } else if !rest.is_empty() {
            // Not a BOM after all: the matched bytes are ordinary content.
            self.at_stream_start = false;
            let matched = BOM.get(..self.bom_matched).unwrap_or_default();
            self.feed(matched, out);
            self.feed(rest, out);
        }
        // Otherwise all input was a BOM prefix: wait for more.
    }

    /// As [`SseParser::push`], handing each completed item to `each` through a buffer the
    /// parser keeps, so that a push allocates nothing for its items.
    pub fn push_each(&mut self, input: &[u8], mut each: impl FnMut(SseItem)) {
        let mut items = std::mem::take(&mut self.items);
        self.push(input, &mut items);
        items.drain(..).for_each(&mut each);
        items.shrink_to(RETAINED_ITEMS);
        self.items = items;
    }

    /// End of stream. A partial event (no terminating blank line) is discarded per spec; returns true if something partial was discarded.
    ///
    /// "Something partial" means an unterminated line, fields of an
    /// unterminated block, or an overflowed event still being skipped.
    /// Afterwards the parser is reset for a new stream (counters are kept).
    pub fn finish(&mut self) -> bool {
        let discarded = !self.partial_line.is_empty()
            || self.data_line.is_some()
            || self.discarding
            || self.block.has_fields
            || (self.at_stream_start && self.bom_matched > 0);
        self.partial_line.clear();
        self.data_line = None;
        self.at_stream_start = true;
        self.bom_matched = 0;
        self.pending_cr = false;
        self.discarding = false;
        self.discard_line_nonempty = false;
        self.block.reset();
        discarded
    }

    /// About `expected` more bytes of the stream are announced (the rest of an HTTP chunk):
    /// if they continue a data line being streamed, make room for them in the event's buffer
    /// (within the event size cap) instead of regrowing it as they come.
    pub fn reserve_hint(&mut self, expected: usize) {
        if self.data_line.is_some() {
            let room = self
                .max_event_bytes
                .saturating_sub(self.block.buffered_bytes());
            super::buffer::grow_for(&mut self.block.data, expected.min(room));
        }
    }

    /// Resets the parser for the next stream of the same connection, keeping buffers of at
    /// most `RETAINED_DATA_CAPACITY` each: a fresh parser per response would regrow its line
    /// buffer (and recopy the line) on every long event.
    pub fn recycle(&mut self) {
        self.finish();
        self.partial_line.shrink_to(RETAINED_DATA_CAPACITY);
        self.block.data.shrink_to(RETAINED_DATA_CAPACITY);
    }

    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    /// Number of dispatched events so far.
    pub fn events_dispatched(&self) -> u64 {
        self.events_dispatched
    }

    /// Splits `input` into lines (CRLF, LF or CR terminated) and processes
    /// them; an unterminated tail is kept for the next push.
    fn feed(&mut self, mut input: &[u8], out: &mut Vec<SseItem>) {
        if self.pending_cr
            && let Some((&first, rest)) = input.split_first()
        {
            self.pending_cr = false;
            if first == b'\n' {
                input = rest;
            }
        }
        while let Some(pos) = memchr2(b'\n', b'\r', input) {
            let (line, rest) = input.split_at(pos);
            let Some((&terminator, rest)) = rest.split_first() else {
                break; // unreachable: memchr2 found a byte at `pos`
            };
            self.complete_line(line, out);
            input = rest;
            if terminator == b'\r' {
                match input.split_first() {
                    Some((b'\n', after_lf)) => input = after_lf,
                    Some(_) => {}
                    // The LF of a CRLF may arrive in the next push.
                    None => self.pending_cr = true,
                }
            }
        }
        self.append_partial(input);
    }

    /// Would the event exceed the cap with a current line `line_len` raw bytes long? The
    /// bytes of a streamed data line already in the block count as part of the line.
    fn exceeds_cap(&self, line_len: usize) -> bool {
        let mut held = self.block.buffered_bytes();
        if let Some(dl) = self.data_line {
            held = dl.start - usize::from(dl.separator)
                + self.block.event_type.len()
                + self.block.id.len();
        }
        held.saturating_add(line_len) > self.max_event_bytes
    }

    /// Raw length of the unterminated line so far.
    fn partial_len(&self) -> usize {
        match self.data_line {
            Some(dl) => dl.prefix + (self.block.data.len() - dl.start),
            None => self.partial_line.len(),
        }
    }

    /// Buffers the unterminated tail of the input.
    fn append_partial(&mut self, tail: &[u8]) {
        if tail.is_empty() {
            return;
        }
        if self.discarding {
            self.discard_line_nonempty = true;
            return;
        }
        if self.exceeds_cap(self.partial_len().saturating_add(tail.len())) {
            self.overflow(true);
            return;
        }
        if self.data_line.is_some() {
            self.block.data.extend_from_slice(tail);
            return;
        }
        self.partial_line.extend_from_slice(tail);
        self.start_data_line();
    }

    /// Once the unterminated line is known to be a `data` field (its name and the byte after
    /// the colon have arrived), moves its value into the block and streams the rest there.
    fn start_data_line(&mut self) {
        let Some(rest) = self.partial_line.strip_prefix(b"data:") else {
            return;
        };
        let Some(&first) = rest.first() else {
            return; // is a space after the colon coming? Wait for the next byte.
        };
        let prefix = 5 + usize::from(first == b' ');
        let block = &mut self.block;
        block.has_fields = true;
        let separator = block.has_data;
        if separator {
            block.data.push(b'\n');
        }
        block.has_data = true;
        let start = block.data.len();
        block
            .data
            .extend_from_slice(self.partial_line.get(prefix..).unwrap_or_default());
        self.partial_line.clear();
        self.data_line = Some(DataLine {
            start,
            prefix,
            separator,
        });
    }

    /// `tail` is the rest of a line whose terminator was just found.
    fn complete_line(&mut self, tail: &[u8], out: &mut Vec<SseItem>) {
        if self.discarding {
            let blank = !self.discard_line_nonempty && tail.is_empty();
            self.discard_line_nonempty = false;
            if blank {
                // The blank line ends the dropped event.
                self.discarding = false;
            }
            return;
        }
        if self.data_line.is_some() {
            // The rest of a streamed data line: its value is already in the block.
            if self.exceeds_cap(self.partial_len().saturating_add(tail.len())) {
                self.overflow(false);
                return;
            }
            self.block.data.extend_from_slice(tail);
            self.data_line = None;
            return;
        }
        if self.partial_line.is_empty() {
            // Common case: the whole line is in this push; no copy.
            if self.exceeds_cap(tail.len()) {
                self.overflow(false);
            } else {
                self.process_line(tail, out);
            }
            return;
        }
        if self.exceeds_cap(self.partial_line.len().saturating_add(tail.len())) {
            self.overflow(false);
            return;
        }
        let mut line = std::mem::take(&mut self.partial_line);
        line.extend_from_slice(tail);
        self.process_line(&line, out);
        line.clear();
        self.partial_line = line;
    }

    /// Drops the current event and skips input until the next blank line.
    fn overflow(&mut self, line_in_progress: bool) {
        self.overflows += 1;
        self.data_line = None;
        self.block.reset();
        // The event's data grew to the cap: what the stream keeps of it is what any stream
        // keeps between events.
        self.block.data.shrink_to(RETAINED_DATA_CAPACITY);
        self.partial_line.clear();
        self.partial_line.shrink_to(RETAINED_LINE_CAPACITY);
        self.discarding = true;
        self.discard_line_nonempty = line_in_progress;
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseItem>) {
        match line.first() {
            None => self.end_block(out),
            Some(b':') => out.push(SseItem::Comment),
            Some(_) => {
                let (name, value) = match memchr(b':', line) {
                    Some(colon) => {
                        let (name, rest) = line.split_at(colon);
                        let value = rest.get(1..).unwrap_or_default();
                        (name, value.strip_prefix(b" ").unwrap_or(value))
                    }
                    None => (line, &[][..]),
                };
                self.process_field(name, value);
            }
        }
    }

    fn process_field(&mut self, name: &[u8], value: &[u8]) {
        let block = &mut self.block;
        block.has_fields = true;
        match name {
            b"data" => {
                if block.has_data {
                    block.data.push(b'\n');
                }
                block.data.extend_from_slice(value);
                block.has_data = true;
            }
            b"event" => {
                block.event_type.clear();
                block.event_type.extend_from_slice(value);
            }
            // Per spec an id containing NUL is ignored entirely.
            b"id" if memchr(0, value).is_none() => {
                block.id.clear();
                block.id.extend_from_slice(value);
                block.has_id = true;
            }
            // An invalid retry value is ignored, keeping any earlier one.
            b"retry" => {
                if let Some(retry) = parse_retry(value) {
                    block.retry = Some(retry);
                }
            }
            _ => {}
        }
    }

    /// Handles a blank line: dispatch the event or report a data-less block.
    fn end_block(&mut self, out: &mut Vec<SseItem>) {
        let block = &mut self.block;
        let id = block.has_id.then(|| lossy(&block.id));
        if block.has_data {
            let event = SseEvent {
                // The default type, named or not, is no text to allocate per event.
                event_type: (!block.event_type.is_empty() && block.event_type != b"message")
                    .then(|| lossy(&block.event_type)),
                // The data buffer becomes the event's data without a copy. The next event's
                // buffer is allocated by its first data, at that size (or the HTTP chunk's,
                // see `reserve_hint`): one allocated now at this event's size would be written
                // long after (memory gone cold) and carried half empty by a smaller event.
                data: std::mem::take(&mut block.data),
                id,
                retry: block.retry,
            };
            self.events_dispatched += 1;
            out.push(SseItem::Event(event));
        } else if block.has_fields {
            out.push(SseItem::NoData { id });
        }
        self.block.reset();
    }
}

impl SseEvent {
    /// The data as the spec decodes it: UTF-8, invalid sequences replaced. Decoding per field
    /// value gives the same result as decoding the whole stream first, because invalid
    /// sequences never swallow the ASCII delimiters (':', CR, LF).
    pub fn text(&self) -> Cow<'_, str> {
        // simdutf8 validates several times faster than std; this is one pass over every event.
        match simdutf8::basic::from_utf8(&self.data) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(&self.data),
        }
    }
}

fn lossy(bytes: &[u8]) -> String {
    // Valid UTF-8 is the norm: check it with the fast validator, fall back to lossy.
    match simdutf8::basic::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `retry` is honoured only if it is non-empty and all ASCII digits.
fn parse_retry(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |acc, &byte| {
        if byte.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(byte - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 1 << 20;

    fn parse_all(input: &[u8], cap: usize) -> (Vec<SseItem>, bool, u64) {
        let mut parser = SseParser::new(cap);
        let mut out = Vec::new();
        parser.push(input, &mut out);
        let partial = parser.finish();
        (out, partial, parser.overflows())
    }

    fn items(input: &[u8]) -> Vec<SseItem> {
        parse_all(input, CAP).0
    }

    fn event(data: &str) -> SseEvent {
        SseEvent {
            data: data.as_bytes().to_vec(),
            ..SseEvent::default()
        }
    }

    fn ev(data: &str) -> SseItem {
        SseItem::Event(event(data))
    }

    #[test]
    fn multi_line_data_is_joined_with_lf() {
        assert_eq!(
            items(b"data: a\ndata: b\ndata:\ndata: c\n\n"),
            vec![ev("a\nb\n\nc")]
        );
    }

    #[test]
    fn comments_only_stream() {
        let (out, partial, _) = parse_all(b": hello\n:\n: keep-alive\n\n", CAP);
        assert_eq!(out, vec![SseItem::Comment; 3]);
        assert!(!partial);
    }

    #[test]
    fn push_each_gives_the_items_of_push_and_keeps_a_small_buffer() {
        let input = format!("{}data: x\n\n: tail\n", ": keep-alive\n".repeat(100));
        let mut parser = SseParser::new(CAP);
        let mut got = Vec::new();
        for piece in input.as_bytes().chunks(7) {
            parser.push_each(piece, |item| got.push(item));
        }
        let mut expected = vec![SseItem::Comment; 100];
        expected.extend([ev("x"), SseItem::Comment]);
        assert_eq!(got, expected);
        // One push of many items: the buffer does not keep their room.
        parser.push_each(input.as_bytes(), |_| {});
        assert!(parser.items.is_empty());
        assert!(parser.items.capacity() <= RETAINED_ITEMS);
    }

    #[test]
    fn empty_priming_event_is_dispatched() {
        let out = items(b"id: 1\ndata:\n\n");
        assert_eq!(
            out,
            vec![SseItem::Event(SseEvent {
                id: Some("1".into()),
                ..event("")
            })]
        );
    }

    #[test]
    fn block_without_data_is_reported_as_no_data() {
        let mut parser = SseParser::new(CAP);
        let mut out = Vec::new();
        parser.push(b"id: 7\n\nevent: x\nretry: 5\nfoo: bar\n\n\n\n", &mut out);
        assert_eq!(
            out,
            vec![
                SseItem::NoData {
                    id: Some("7".into())
                },
                SseItem::NoData { id: None },
            ]
        );
        assert_eq!(parser.events_dispatched(), 0);
    }

    #[test]
    fn retry_requires_ascii_digits() {
        let out = items(
            b"retry: 3000\ndata: a\n\n\
              retry: 30a0\ndata: b\n\n\
              retry:\ndata: c\n\n\
              retry: 99999999999999999999999\ndata: d\n\n\
              retry: 1\nretry: x\ndata: e\n\n",
        );
        let retries: Vec<_> = out
            .iter()
            .map(|item| match item {
                SseItem::Event(e) => e.retry,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(retries, vec![Some(3000), None, None, None, Some(1)]);
    }

    #[test]
    fn line_ending_mixes() {
        assert_eq!(
            items(b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r"),
            vec![ev("a\nb\nc"), ev("d")]
        );
        assert_eq!(items(b"data: x\n\r\n"), vec![ev("x")]);
        assert_eq!(items(b"data: x\r\n\r\n"), vec![ev("x")]);
        assert_eq!(items(b"data: x\n\rdata: y\n\n"), vec![ev("x"), ev("y")]);
    }

    #[test]
    fn crlf_split_across_pushes_is_one_line_end() {
        let mut parser = SseParser::new(CAP);
        let mut out = Vec::new();
        for piece in [&b"data: x\r"[..], b"\ndata: y\r", b"\n\r", b"", b"\n"] {
            parser.push(piece, &mut out);
        }
        assert_eq!(out, vec![ev("x\ny")]);
    }

    #[test]
    fn lone_cr_then_other_byte_in_next_push() {
        let mut parser = SseParser::new(CAP);
        let mut out = Vec::new();
        parser.push(b"data: x\r", &mut out);
        parser.push(b"data: y\r", &mut out);
        parser.push(b"\r", &mut out);
        assert_eq!(out, vec![ev("x\ny")]);
    }

    #[test]
    fn bom_at_start_is_ignored_once() {
        assert_eq!(items(b"\xEF\xBB\xBFdata: x\n\n"), vec![ev("x")]);
        // A second BOM is part of the field name, making it unknown.
        assert_eq!(
            items(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"),
            vec![SseItem::NoData { id: None }]
        );
        // A BOM later in the stream is content.
        assert_eq!(
            items(b"data: x\n\n\xEF\xBB\xBFdata: y\n\n"),
            vec![ev("x"), SseItem::NoData { id: None }]
        );
        // A truncated BOM is content too (lossily decoded).
        assert_eq!(items(b"\xEF\xBB:c\n\n"), vec![SseItem::NoData { id: None }]);
        assert_eq!(items(b"\xEF:c\ndata\n\n"), vec![ev("")]);
    }

    #[test]
    fn bom_split_across_pushes() {
        let mut parser = SseParser::new(CAP);
        let mut out = Vec::new();
        for piece in [&b"\xEF"[..], b"", b"\xBB", b"\xBFda", b"ta: x\n\n"] {
            parser.push(piece, &mut out);
        }
        assert_eq!(out, vec![ev("x")]);

        let mut parser = SseParser::new(CAP);
        let mut out = Vec::new();
        parser.push(b"\xEF\xBB", &mut out);
        assert!(parser.finish(), "a dangling BOM prefix is partial content");
    }

    #[test]
    fn field_parsing_rules() {
        // No colon: field name with empty value.
        assert_eq!(items(b"data\ndata\n\n"), vec![ev("\n")]);
        // Only one leading space is stripped; no space is fine.
        assert_eq!(items(b"data:x\n\n"), vec![ev("x")]);
        assert_eq!(items(b"data:  x \n\n"), vec![ev(" x ")]);
        // Only the first colon separates.
        assert_eq!(items(b"data: a:b: c\n\n"), vec![ev("a:b: c")]);
        // Field names are case-sensitive; unknown fields are ignored.
        assert_eq!(items(b"Data: x\nfoo: y\ndata: z\n\n"), vec![ev("z")]);
    }

    #[test]
    fn event_type_and_id_are_per_block() {
        let out = items(
            b"event: foo\nid: 1\nid: 2\ndata: a\n\ndata: b\n\nevent:\ndata: c\n\nevent: message\ndata: d\n\nevent: messages\ndata: e\n\nevent: Message\ndata: f\n\n",
        );
        assert_eq!(
            out,
            vec![
                SseItem::Event(SseEvent {
                    event_type: Some("foo".into()),
                    id: Some("2".into()),
                    ..event("a")
                }),
                ev("b"),
                ev("c"),
                // The default type, named: no type, as when absent.
                ev("d"),
                SseItem::Event(SseEvent {
                    event_type: Some("messages".into()),
                    ..event("e")
                }),
                // Types are case-sensitive.
                SseItem::Event(SseEvent {
                    event_type: Some("Message".into()),
                    ..event("f")
                }),
            ]
        );
    }

    #[test]
    fn id_with_nul_is_ignored_and_empty_id_is_kept() {
        assert_eq!(items(b"id: a\0b\ndata: x\n\n"), vec![ev("x")]);
        assert_eq!(
            items(b"id: 1\nid: a\0b\ndata: x\n\n"),
            vec![SseItem::Event(SseEvent {
                id: Some("1".into()),
                ..event("x")
            })]
        );
        assert_eq!(
            items(b"id\ndata: x\n\n"),
            vec![SseItem::Event(SseEvent {
                id: Some(String::new()),
                ..event("x")
            })]
        );
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let out = items(b"data: \xFF\xE2\x82\nevent: \xC3\n\n");
        assert_eq!(
            out,
            vec![SseItem::Event(SseEvent {
                event_type: Some("\u{FFFD}".into()),
                data: b"\xFF\xE2\x82".to_vec(),
                ..SseEvent::default()
            })]
        );
        // The data is decoded where it is read, with the same replacement.
        let [SseItem::Event(e)] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(e.text(), "\u{FFFD}\u{FFFD}");
        assert!(matches!(
            event("h\u{e9}llo").text(),
            Cow::Borrowed("h\u{e9}llo")
        ));
    }

    #[test]
    fn overflow_with_huge_line_stays_bounded_and_recovers() {
        const MAX: usize = 4096;
        let mut parser = SseParser::new(MAX);
        let mut out = Vec::new();
        parser.push(b"data: before\n\ndata: ", &mut out);
        let filler = vec![b'a'; 64 * 1024];
        for _ in 0..(50 * 1024 * 1024 / filler.len()) {
            parser.push(&filler, &mut out);
            assert!(parser.partial_line.capacity() <= 2 * MAX);
            assert!(parser.block.buffered_bytes() <= MAX);
        }
        // The rest of the dropped event, then a normal one.
        parser.push(b"\ndata: more of the dropped event\n", &mut out);
        parser.push(b"\ndata: after\n\n", &mut out);
        assert_eq!(out, vec![ev("before"), ev("after")]);
        assert_eq!(parser.overflows(), 1);
        assert_eq!(parser.events_dispatched(), 2);
        assert!(!parser.finish());
    }

    #[test]
    fn an_overflowed_event_leaves_no_more_room_than_any_event() {
        // The event's data grows to the cap before it is dropped; the stream goes on.
        const MAX: usize = 4 << 20;
        let mut parser = SseParser::new(MAX);
        let mut out = Vec::new();
        parser.push(b"data: ", &mut out);
        let filler = vec![b'a'; 64 * 1024];
        for _ in 0..(MAX / filler.len() + 1) {
            parser.push(&filler, &mut out);
        }
        assert_eq!(parser.overflows(), 1);
        parser.push(b"\n\n", &mut out);
        // What it holds is charged as allocated, and is what a stream keeps between events.
        let held = parser.buffered_bytes();
        assert!(
            held <= RETAINED_DATA_CAPACITY + RETAINED_LINE_CAPACITY + 64,
            "{held}"
        );
        assert!(held >= parser.block.data.capacity());
        parser.push(b"data: after\n\n", &mut out);
        assert_eq!(out, vec![ev("after")]);
    }

    #[test]
    fn overflow_from_many_small_data_lines() {
        let mut input = Vec::new();
        for _ in 0..100 {
            input.extend_from_slice(b"data: 0123456789\n");
        }
        input.extend_from_slice(b"\ndata: ok\n\n");
        let (out, partial, overflows) = parse_all(&input, 256);
        assert_eq!(out, vec![ev("ok")]);
        assert!(!partial);
        assert_eq!(overflows, 1);
    }

    #[test]
    fn event_exactly_at_cap_is_kept() {
        // Line "data:xxxx" is 9 bytes; buffered value is 4 bytes.
        assert_eq!(parse_all(b"data:xxxx\n\n", 9).0, vec![ev("xxxx")]);
        let (out, _, overflows) = parse_all(b"data:xxxx\n\n", 8);
        assert!(out.is_empty());
        assert_eq!(overflows, 1);
    }

    #[test]
    fn finish_discards_partial_event() {
        let mut parser = SseParser::new(CAP);
        let mut out = Vec::new();
        parser.push(b"data: x\n\ndata: y", &mut out);
        assert_eq!(out, vec![ev("x")]);
        assert!(parser.finish());
        assert!(!parser.finish());

        parser.push(b"data: y\n", &mut out);
        assert!(parser.finish(), "fields without a terminating blank line");

        parser.push(b"data: z\n\n: comment\n", &mut out);
        assert!(!parser.finish());
        assert_eq!(out, vec![ev("x"), ev("z"), SseItem::Comment]);
        assert_eq!(parser.events_dispatched(), 2);
    }

    /// A stream exercising every feature, including a multi-byte UTF-8
    /// character, BOM, all line endings, and a trailing partial event.
    const STREAM: &[u8] = b"\xEF\xBB\xBF: welcome\r\n\
        id: 1\ndata:\n\n\
        retry: 2500\r\n\r\n\
        event: message\rid: 42\rdata: {\"a\":\"h\xC3\xA9llo \xE2\x82\xAC\"}\rdata:second\r\r\
        : ping\n\
        foo\nid: 7\n\n\
        data: bad \xFF utf8\r\n\
        id: x\0y\r\n\r\n\
        data: 0123456789012345678901234567890123456789\n\
        data: overflow when capped\n\n\
        data\r\n\r\n\
        event: tail\ndata: partial";

    fn run_split(input: &[u8], cuts: &[usize], cap: usize) -> (Vec<SseItem>, bool, u64, u64) {
        let mut parser = SseParser::new(cap);
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            parser.push(&input[start..cut], &mut out);
            start = cut;
        }
        let partial = parser.finish();
        (out, partial, parser.overflows(), parser.events_dispatched())
    }

    #[test]
    fn representative_stream_parses_as_expected() {
        let (out, partial, overflows, dispatched) = run_split(STREAM, &[], CAP);
        assert!(partial);
        assert_eq!(overflows, 0);
        assert_eq!(dispatched, 5);
        assert_eq!(out.len(), 9);
        assert_eq!(
            out[3],
            SseItem::Event(SseEvent {
                // `message` is the default type: read as no type at all.
                event_type: None,
                id: Some("42".into()),
                ..event("{\"a\":\"h\u{e9}llo \u{20ac}\"}\nsecond")
            })
        );

        let (capped, _, overflows, dispatched) = run_split(STREAM, &[], 64);
        assert_eq!(overflows, 1);
        assert_eq!(dispatched, 4);
        assert_eq!(capped.len(), 8);
    }

    #[test]
    fn reserve_hint_makes_room_for_a_streamed_data_line_within_the_cap() {
        let mut p = SseParser::new(1000);
        let mut out = Vec::new();
        p.reserve_hint(500);
        assert_eq!(p.buffered_bytes(), 0, "no data line yet: nothing reserved");
        p.push(b"data: {\"a\":", &mut out);
        p.reserve_hint(500);
        assert!(p.block.data.capacity() >= p.block.data.len() + 500);
        p.reserve_hint(1 << 30);
        assert!(
            p.block.data.capacity() <= 2 * 1000,
            "capped by the event size"
        );
        p.push(b"1}\n\n", &mut out);
        assert_eq!(out, vec![SseItem::Event(event("{\"a\":1}"))]);
    }

    #[test]
    fn every_single_split_position_matches_whole() {
        for cap in [CAP, 64, 20] {
            let whole = run_split(STREAM, &[], cap);
            for cut in 0..=STREAM.len() {
                assert_eq!(run_split(STREAM, &[cut], cap), whole, "cap {cap} cut {cut}");
            }
        }
    }

    #[test]
    fn every_pair_of_split_positions_matches_whole() {
        for cap in [CAP, 64] {
            let whole = run_split(STREAM, &[], cap);
            for first in 0..=STREAM.len() {
                for second in first..=STREAM.len() {
                    assert_eq!(
                        run_split(STREAM, &[first, second], cap),
                        whole,
                        "cap {cap} cuts {first},{second}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_byte_at_a_time_matches_whole() {
        for cap in [CAP, 64, 20, 0] {
            let cuts: Vec<usize> = (1..STREAM.len()).collect();
            assert_eq!(
                run_split(STREAM, &cuts, cap),
                run_split(STREAM, &[], cap),
                "cap {cap}"
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let alphabet = b"\r\n:: datidevntry\0\xEF\xBB\xBF\xFF0123";
        for _ in 0..2000 {
            let mut input = Vec::new();
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                input.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let cut = (state % 65) as usize;
            assert_eq!(run_split(&input, &[cut], 16), run_split(&input, &[], 16));
        }
    }
}
