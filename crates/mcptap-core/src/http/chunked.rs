//! Push-style decoder for the HTTP/1.1 chunked transfer coding
//! (RFC 9112 §7.1).
//!
//! Input can be split anywhere. Chunk data is never buffered: it is handed
//! to the sink as slices of the caller's input. Only a partial chunk-size
//! line is buffered (bounded), and trailer fields are skipped, never stored.
//!
//! Leniency: wherever CRLF is required (after the chunk-size line, after
//! chunk data, after trailer lines and as the final empty line) a bare LF is
//! accepted too, because real servers emit it. A CR not followed by LF is
//! still an error after chunk data and in the chunk-size line.

use crate::model::FramingAnomaly;
use memchr::memchr;

/// Bits of [`ChunkedDecoder::take_anomalies`].
const BARE_LF: u8 = 1;
const SIZE_WHITESPACE: u8 = 2;
const EXTENSION_MALFORMED: u8 = 4;

/// The anomalies a bit set from [`ChunkedDecoder::take_anomalies`] names.
pub fn anomalies(bits: u8) -> impl Iterator<Item = FramingAnomaly> {
    [
        (BARE_LF, FramingAnomaly::BareLf),
        (SIZE_WHITESPACE, FramingAnomaly::ChunkSizeWhitespace),
        (EXTENSION_MALFORMED, FramingAnomaly::ChunkExtensionMalformed),
    ]
    .into_iter()
    .filter(move |(bit, _)| bits & bit != 0)
    .map(|(_, a)| a)
}

/// Longest accepted chunk-size line, including extensions and the CRLF.
const MAX_SIZE_LINE: usize = 4096;
/// Most room the size-line buffer keeps between chunks.
const KEPT_SIZE_LINE: usize = 64;
/// Most bytes accepted for the trailer section, including its final CRLF.
const MAX_TRAILERS: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedError {
    /// The chunk-size line is not `1*HEXDIG [ext] CRLF` or the size exceeds 64 bits.
    BadChunkSize,
    /// The chunk-size line exceeds 4096 bytes.
    SizeLineTooLong,
    /// Chunk data is not followed by CRLF (or LF).
    BadChunkTerminator,
    /// The trailer section exceeds 8192 bytes.
    TrailersTooLarge,
}

impl ChunkedError {
    /// snake_case name, for metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BadChunkSize => "bad_chunk_size",
            Self::SizeLineTooLong => "size_line_too_long",
            Self::BadChunkTerminator => "bad_chunk_terminator",
            Self::TrailersTooLarge => "trailers_too_large",
        }
    }
}

impl std::fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for ChunkedError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedStatus {
    /// Bytes of the input consumed by this push.
    pub consumed: usize,
    /// The whole chunked body, including trailers, has been decoded.
    pub done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk-size line (partial bytes are in `size_line`).
    SizeLine,
    /// Inside chunk data; `remaining` is never zero.
    Data {
        remaining: u64,
    },
    /// Chunk data ended; expecting CR (or a lenient bare LF).
    DataCr,
    /// Saw the CR after chunk data; expecting LF.
    DataLf,
    /// After the last chunk: skipping trailer lines up to an empty line.
    Trailers,
    Done,
    Failed(ChunkedError),
}

#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    /// Partial chunk-size line spanning pushes; at most `MAX_SIZE_LINE` bytes.
    size_line: Vec<u8>,
    /// Trailer-section bytes seen so far.
    trailer_bytes: usize,
    /// Length of the current trailer line so far, excluding its LF.
    trailer_line_len: usize,
    /// The current trailer line started with CR (so "\r\n" counts as empty).
    trailer_line_starts_with_cr: bool,
    body_bytes: u64,
    /// Leniency used since the last [`ChunkedDecoder::take_anomalies`] (bits).
    anomalies: u8,
    /// Where in the failing push's input the step that failed began (see [`Self::failed_at`]).
    failed_at: u32,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self {
            state: State::SizeLine,
            size_line: Vec::new(),
            trailer_bytes: 0,
            trailer_line_len: 0,
            trailer_line_starts_with_cr: false,
            body_bytes: 0,
            anomalies: 0,
            failed_at: 0,
        }
    }

    /// After a push that failed: the offset in its input where the step that failed began
    /// (a chunk-size line, a chunk's terminator or a trailer line), so that the caller can
    /// look there for the next message rather than skip the rest of the input.
    pub fn failed_at(&self) -> usize {
        self.failed_at as usize
    }

    /// After a push that failed in a chunk-size line begun by earlier pushes: that line's
    /// bytes from them (they come just before the failing push's input, and `failed_at` is
    /// then 0), for the caller to scan as it scans the input. Empty otherwise.
    pub fn take_carried(&mut self) -> Vec<u8> {
        match self.state {
            State::Failed(_) => std::mem::take(&mut self.size_line),
            _ => Vec::new(),
        }
    }

    /// Decode from `input`. Body data is passed to `sink` as slices borrowed from `input` (zero-copy; one call per contiguous data run). Returns how many bytes of `input` were consumed. Once the last-chunk (size 0), any trailer fields and the final CRLF have been consumed, `done` is true and NO further bytes are consumed (the rest belongs to the next pipelined message). On error, the decoder is poisoned (further pushes return the same error).
    ///
    /// # Errors
    ///
    /// A [`ChunkedError`] when the input violates the chunked framing or a
    /// size bound; the body is unusable from that point.
    pub fn push(
        &mut self,
        input: &[u8],
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<ChunkedStatus, ChunkedError> {
        let mut consumed = 0;
        loop {
            let rest = input.get(consumed..).unwrap_or_default();
            match self.state {
                State::Failed(error) => return Err(error),
                State::Done => {
                    return Ok(ChunkedStatus {
                        consumed,
                        done: true,
                    });
                }
                _ if rest.is_empty() => {
                    return Ok(ChunkedStatus {
                        consumed,
                        done: false,
                    });
                }
                _ => {}
            }
            // Each step consumes at least one byte of the non-empty `rest`.
            match self.step(rest, sink) {
                Ok(used) => consumed += used,
                Err(error) => {
                    // A failing size line's bytes from earlier pushes stay for `take_carried`.
                    self.state = State::Failed(error);
                    self.failed_at = u32::try_from(consumed).unwrap_or(u32::MAX);
                    return Err(error);
                }
            }
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The leniency this decoder used since the last call (bare LF, chunk-size whitespace,
    /// malformed extensions), as bits for [`anomalies`]; each kind is reported once per call.
    pub fn take_anomalies(&mut self) -> u8 {
        std::mem::take(&mut self.anomalies)
    }

    /// Bytes held for a size line that spans segments, as allocated (for the memory budget).
    pub fn buffered_bytes(&self) -> usize {
        self.size_line.capacity()
    }

    /// Data bytes still to come in the current chunk (0 between chunks).
    pub fn chunk_remaining(&self) -> u64 {
        match self.state {
            State::Data { remaining } => remaining,
            _ => 0,
        }
    }

    /// Total body (de-chunked) bytes delivered so far.
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// Consumes a prefix of the non-empty `rest` and returns its length.
    fn step(&mut self, rest: &[u8], sink: &mut dyn FnMut(&[u8])) -> Result<usize, ChunkedError> {
        match self.state {
            State::SizeLine => self.read_size_line(rest),
            State::Data { remaining } => {
                // A chunk larger than usize (32-bit targets) is capped by the input length anyway.
                let len = usize::try_from(remaining).map_or(rest.len(), |r| r.min(rest.len()));
                let data = rest.get(..len).unwrap_or_default();
                if !data.is_empty() {
                    sink(data);
                }
                let len64 = len as u64;
                self.body_bytes = self.body_bytes.saturating_add(len64);
                let remaining = remaining.saturating_sub(len64);
                self.state = if remaining == 0 {
                    State::DataCr
                } else {
                    State::Data { remaining }
                };
                Ok(len)
            }
            State::DataCr => {
                self.state = match rest.first() {
                    Some(b'\r') => State::DataLf,
                    Some(b'\n') => {
                        self.anomalies |= BARE_LF; // lenient bare LF
                        State::SizeLine
                    }
                    _ => return Err(ChunkedError::BadChunkTerminator),
                };
                Ok(1)
            }
            State::DataLf => match rest.first() {
                Some(b'\n') => {
                    self.state = State::SizeLine;
                    Ok(1)
                }
                _ => Err(ChunkedError::BadChunkTerminator),
            },
            State::Trailers => self.skip_trailers(rest),
            // `push` never steps in these states.
            State::Done | State::Failed(_) => Ok(0),
        }
    }

    fn read_size_line(&mut self, rest: &[u8]) -> Result<usize, ChunkedError> {
        // Reject garbage at once instead of buffering up to the line limit.
        if self.size_line.is_empty() && !rest.first().is_some_and(u8::is_ascii_hexdigit) {
            return Err(ChunkedError::BadChunkSize);
        }
        let Some(lf) = memchr(b'\n', rest) else {
            if self.size_line.len() + rest.len() > MAX_SIZE_LINE {
                return Err(ChunkedError::SizeLineTooLong);
            }
            self.size_line.extend_from_slice(rest);
            return Ok(rest.len());
        };
        let line_len = lf + 1;
        if self.size_line.len() + line_len > MAX_SIZE_LINE {
            return Err(ChunkedError::SizeLineTooLong);
        }
        let line = rest.get(..line_len).unwrap_or_default();
        let size = if self.size_line.is_empty() && line.ends_with(b"\r\n") {
            // Common case: the whole line is in this push; no copy.
            self.anomalies |= size_line_anomalies(line);
            parse_size_line(line)?
        } else {
            let carried = self.size_line.len();
            self.size_line.extend_from_slice(line);
            if !self.size_line.ends_with(b"\r\n") {
                // Lenient bare LF: httparse insists on CRLF.
                self.anomalies |= BARE_LF;
                self.size_line.pop();
                self.size_line.extend_from_slice(b"\r\n");
            }
            self.anomalies |= size_line_anomalies(&self.size_line);
            let size = parse_size_line(&self.size_line);
            if size.is_err() {
                // Only the bytes of earlier pushes are kept (see `take_carried`).
                self.size_line.truncate(carried);
            } else if self.size_line.capacity() > KEPT_SIZE_LINE {
                // Size lines are a few bytes: a long one's room (up to MAX_SIZE_LINE) is not kept.
                self.size_line = Vec::new();
            } else {
                self.size_line.clear();
            }
            size?
        };
        self.state = if size == 0 {
            self.trailer_bytes = 0;
            self.trailer_line_len = 0;
            self.trailer_line_starts_with_cr = false;
            State::Trailers
        } else {
            State::Data { remaining: size }
        };
        Ok(line_len)
    }

    /// Skips trailer lines without storing them; an empty line ends the body.
    fn skip_trailers(&mut self, rest: &[u8]) -> Result<usize, ChunkedError> {
        let (content, used, line_ended) = match memchr(b'\n', rest) {
            Some(lf) => (rest.get(..lf).unwrap_or_default(), lf + 1, true),
            None => (rest, rest.len(), false),
        };
        self.trailer_bytes += used;
        if self.trailer_bytes > MAX_TRAILERS {
            return Err(ChunkedError::TrailersTooLarge);
        }
        if self.trailer_line_len == 0
            && let Some(&first) = content.first()
        {
            self.trailer_line_starts_with_cr = first == b'\r';
        }
        self.trailer_line_len += content.len();
        if line_ended
            && !content.ends_with(b"\r")
            && !(content.is_empty()
                && self.trailer_line_starts_with_cr
                && self.trailer_line_len == 1)
        {
            self.anomalies |= BARE_LF;
        }
        if line_ended {
            // Empty means "\r\n" or (lenient) a bare "\n".
            let empty = self.trailer_line_len == 0
                || (self.trailer_line_len == 1 && self.trailer_line_starts_with_cr);
            self.trailer_line_len = 0;
            self.trailer_line_starts_with_cr = false;
            if empty {
                self.state = State::Done;
            }
        }
        Ok(used)
    }
}

/// The leniency a complete chunk-size line ending in CRLF needs: whitespace after the size
/// with no extension, or an extension that is empty, nameless or has unbalanced quotes
/// (RFC 9112 §7.1.1: `chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )`).
fn size_line_anomalies(line: &[u8]) -> u8 {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = line.get(digits..).unwrap_or_default();
    if rest.first() == Some(&b'\r') {
        return 0; // the common, strict case
    }
    let rest = rest.strip_suffix(b"\r\n").unwrap_or(rest);
    let after_ws = rest.trim_ascii_start();
    if after_ws.is_empty() {
        return if rest.is_empty() { 0 } else { SIZE_WHITESPACE };
    }
    if after_ws.first() != Some(&b';') {
        return 0; // not a chunk-size line httparse accepts: it reports the error
    }
    let quotes = after_ws.iter().filter(|b| **b == b'"').count();
    let nameless = after_ws
        .split(|b| *b == b';')
        .skip(1)
        .any(|ext| ext.trim_ascii().is_empty() || ext.trim_ascii_start().starts_with(b"="));
    if quotes % 2 == 1 || nameless {
        EXTENSION_MALFORMED
    } else {
        0
    }
}

/// Parses a complete chunk-size line ending in CRLF.
fn parse_size_line(line: &[u8]) -> Result<u64, ChunkedError> {
    // httparse accepts an empty size (e.g. "\r\n" or " \r\n") as 0, which
    // would end the body early; the grammar requires at least one HEXDIG.
    if !line.first().is_some_and(u8::is_ascii_hexdigit) {
        return Err(ChunkedError::BadChunkSize);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((used, size))) if used == line.len() => Ok(size),
        _ => Err(ChunkedError::BadChunkSize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multi-chunk body with extensions, lenient LFs and trailers, followed
    /// by the start of a pipelined message.
    const BODY: &[u8] = b"5;name=val\r\nhello\r\n\
        1A ; a=\"quoted;x\" ;b\r\n, this is twenty-six bytes\r\n\
        3\nabc\n\
        00000001\r\n!\r\n\
        0;last=1\r\n\
        X-Trailer: one\r\n\
        X-Other: \r two\n\
        \r\n";
    const NEXT: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";
    const DECODED: &[u8] = b"hello, this is twenty-six bytesabc!";

    struct Outcome {
        body: Vec<u8>,
        leftover: Vec<u8>,
        done: bool,
        body_bytes: u64,
    }

    /// Feeds `input` split at `cuts`, re-feeding nothing: once done, the
    /// unconsumed rest of each piece is collected as leftover.
    fn run_split(input: &[u8], cuts: &[usize]) -> Result<Outcome, ChunkedError> {
        let mut decoder = ChunkedDecoder::new();
        let mut body = Vec::new();
        let mut leftover = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            let piece = &input[start..cut];
            start = cut;
            let status = decoder.push(piece, &mut |data| body.extend_from_slice(data))?;
            if status.done {
                leftover.extend_from_slice(&piece[status.consumed..]);
            } else {
                assert_eq!(status.consumed, piece.len(), "must consume all until done");
            }
            assert_eq!(status.done, decoder.is_done());
        }
        Ok(Outcome {
            body,
            leftover,
            done: decoder.is_done(),
            body_bytes: decoder.body_bytes(),
        })
    }

    fn full_input() -> Vec<u8> {
        [BODY, NEXT].concat()
    }

    fn assert_complete(outcome: &Outcome, context: &str) {
        assert_eq!(outcome.body, DECODED, "{context}");
        assert_eq!(outcome.leftover, NEXT, "{context}");
        assert!(outcome.done, "{context}");
        assert_eq!(outcome.body_bytes, DECODED.len() as u64, "{context}");
    }

    #[test]
    fn decodes_whole_body_and_leaves_pipelined_bytes() {
        let input = full_input();
        let outcome = run_split(&input, &[]).unwrap();
        assert_complete(&outcome, "whole");
    }

    #[test]
    fn every_single_split_position() {
        let input = full_input();
        for cut in 0..=input.len() {
            let outcome = run_split(&input, &[cut]).unwrap();
            assert_complete(&outcome, &format!("cut {cut}"));
        }
    }

    #[test]
    fn random_pairs_of_split_positions() {
        let input = full_input();
        let mut state = 0x2545_F491_4F6C_DD1D_u64;
        for _ in 0..5000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let a = (state % (input.len() as u64 + 1)) as usize;
            let b = ((state >> 32) % (input.len() as u64 + 1)) as usize;
            let cuts = [a.min(b), a.max(b)];
            let outcome = run_split(&input, &cuts).unwrap();
            assert_complete(&outcome, &format!("cuts {cuts:?}"));
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        let input = full_input();
        let cuts: Vec<usize> = (1..input.len()).collect();
        let outcome = run_split(&input, &cuts).unwrap();
        assert_complete(&outcome, "bytewise");
    }

    #[test]
    fn one_sink_call_per_contiguous_run() {
        let mut decoder = ChunkedDecoder::new();
        let mut calls = Vec::new();
        let status = decoder
            .push(b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n", &mut |data| {
                calls.push(data.to_vec())
            })
            .unwrap();
        assert_eq!(calls, vec![b"hello".to_vec(), b"abc".to_vec()]);
        assert_eq!(
            status,
            ChunkedStatus {
                consumed: 23,
                done: true
            }
        );
    }

    #[test]
    fn nothing_consumed_after_done() {
        let mut decoder = ChunkedDecoder::new();
        let mut sink = |_: &[u8]| panic!("no data expected");
        let status = decoder.push(b"0\r\n\r\nGET / HTTP/1.1", &mut sink).unwrap();
        assert_eq!(
            status,
            ChunkedStatus {
                consumed: 5,
                done: true
            }
        );
        let status = decoder.push(b"more", &mut sink).unwrap();
        assert_eq!(
            status,
            ChunkedStatus {
                consumed: 0,
                done: true
            }
        );
    }

    #[test]
    fn bare_lf_everywhere_is_accepted() {
        let outcome = run_split(b"5\nhello\n0\n\nNEXT", &[]).unwrap();
        assert_eq!(outcome.body, b"hello");
        assert_eq!(outcome.leftover, b"NEXT");
        assert!(outcome.done);
    }

    #[test]
    fn incomplete_body_is_not_done() {
        for input in [
            &b"5\r\nhel"[..],
            b"5\r\nhello\r",
            b"0\r\n",
            b"0\r\nX: y\r\n\r",
        ] {
            let outcome = run_split(input, &[]).unwrap();
            assert!(!outcome.done, "{input:?}");
        }
    }

    fn error_of(input: &[u8]) -> ChunkedError {
        match run_split(input, &[]) {
            Ok(_) => panic!("expected an error for {input:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn bad_chunk_sizes() {
        for input in [
            &b"zz\r\n"[..],
            b"\r\n",
            b" 5\r\n",
            b"-1\r\n",
            b";ext\r\n",
            b"5 5\r\n",
            b"5\rX\r\n",
            b"5;a\rb\r\n",
            b"10000000000000000\r\n", // 17 hex digits overflows u64
            b"5\r\nhello\r\nxyz\r\n",
        ] {
            assert_eq!(error_of(input), ChunkedError::BadChunkSize, "{input:?}");
        }
    }

    #[test]
    fn bad_chunk_terminators() {
        for input in [&b"5\r\nhelloX"[..], b"5\r\nhello\rX", b"5\r\nhello\r\r\n"] {
            assert_eq!(
                error_of(input),
                ChunkedError::BadChunkTerminator,
                "{input:?}"
            );
        }
    }

    #[test]
    fn size_line_too_long_even_when_split() {
        let mut line = b"5;".to_vec();
        line.resize(MAX_SIZE_LINE + 10, b'a');
        assert_eq!(error_of(&line), ChunkedError::SizeLineTooLong);
        let cuts: Vec<usize> = (1..line.len()).step_by(100).collect();
        assert_eq!(
            run_split(&line, &cuts).err(),
            Some(ChunkedError::SizeLineTooLong)
        );

        // Exactly at the limit (including CRLF) is fine.
        let mut ok = b"5;".to_vec();
        ok.resize(MAX_SIZE_LINE - 2, b'a');
        ok.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        let cuts: Vec<usize> = (1..ok.len()).step_by(7).collect();
        assert_eq!(run_split(&ok, &cuts).unwrap().body, b"hello");
    }

    #[test]
    fn trailers_too_large() {
        let mut input = b"0\r\n".to_vec();
        for _ in 0..1000 {
            input.extend_from_slice(b"X-Pad: 0123456789\r\n");
        }
        assert_eq!(error_of(&input), ChunkedError::TrailersTooLarge);
        // A single endless trailer line is bounded too.
        let mut endless = b"0\r\nX: ".to_vec();
        endless.resize(MAX_TRAILERS + 100, b'a');
        let cuts: Vec<usize> = (1..endless.len()).step_by(1000).collect();
        assert_eq!(
            run_split(&endless, &cuts).err(),
            Some(ChunkedError::TrailersTooLarge)
        );
    }

    #[test]
    fn a_failed_push_says_where_the_step_that_failed_began() {
        let mut sink = |_: &[u8]| {};
        let mut decoder = ChunkedDecoder::new();
        let input = b"2\r\n{}\r\nHTTP/1.1 200 OK\r\n";
        assert_eq!(
            decoder.push(input, &mut sink),
            Err(ChunkedError::BadChunkSize)
        );
        assert_eq!(&input[decoder.failed_at()..], b"HTTP/1.1 200 OK\r\n");
        let mut decoder = ChunkedDecoder::new();
        assert_eq!(
            decoder.push(b"5\r\nhelloXX", &mut sink),
            Err(ChunkedError::BadChunkTerminator)
        );
        assert_eq!(decoder.failed_at(), 8);
    }

    #[test]
    fn a_size_line_that_failed_after_spanning_pushes_hands_back_its_first_bytes() {
        let mut sink = |_: &[u8]| {};
        // Bad at its end of line, and too long: the earlier pushes' bytes come back once.
        for (first, second, error) in [
            (
                &b"D"[..],
                &b"ELETE /mcp HTTP/1.1\r\n"[..],
                ChunkedError::BadChunkSize,
            ),
            (b"DE", b"LETE /mcp\n", ChunkedError::BadChunkSize),
            (
                b"a",
                &[b'0'; MAX_SIZE_LINE][..],
                ChunkedError::SizeLineTooLong,
            ),
        ] {
            let mut decoder = ChunkedDecoder::new();
            let status = decoder.push(first, &mut sink).map(|s| s.consumed);
            assert_eq!(status, Ok(first.len()));
            assert!(decoder.take_carried().is_empty(), "not failed yet");
            assert_eq!(decoder.push(second, &mut sink), Err(error));
            assert_eq!(decoder.failed_at(), 0);
            assert_eq!(decoder.take_carried(), first);
            assert!(decoder.take_carried().is_empty());
            assert_eq!(decoder.buffered_bytes(), 0);
        }
        // A size line within the failing push has nothing carried.
        let mut decoder = ChunkedDecoder::new();
        let failed = decoder.push(b"2\r\n{}\r\nzz\r\n", &mut sink);
        assert_eq!(failed, Err(ChunkedError::BadChunkSize));
        assert!(decoder.take_carried().is_empty());
    }

    #[test]
    fn errors_poison_the_decoder() {
        let mut decoder = ChunkedDecoder::new();
        let mut sink = |_: &[u8]| {};
        assert_eq!(
            decoder.push(b"5\r\nhelloXX", &mut sink),
            Err(ChunkedError::BadChunkTerminator)
        );
        assert_eq!(
            decoder.push(b"0\r\n\r\n", &mut sink),
            Err(ChunkedError::BadChunkTerminator)
        );
        assert_eq!(
            decoder.push(b"", &mut sink),
            Err(ChunkedError::BadChunkTerminator)
        );
        assert!(!decoder.is_done());
        assert_eq!(decoder.body_bytes(), 5);
    }

    #[test]
    fn huge_chunk_size_streams_without_allocation() {
        let mut decoder = ChunkedDecoder::new();
        let mut received = 0usize;
        let mut sink = |data: &[u8]| received += data.len();
        let status = decoder.push(b"ffffffffffffffff\r\n", &mut sink).unwrap();
        assert_eq!(status.consumed, 18);
        assert_eq!(
            decoder.state,
            State::Data {
                remaining: u64::MAX
            }
        );
        let chunk = [b'x'; 1000];
        for _ in 0..10 {
            let status = decoder.push(&chunk, &mut sink).unwrap();
            assert_eq!(status.consumed, chunk.len());
            assert!(!status.done);
        }
        assert_eq!(received, 10_000);
        assert_eq!(decoder.body_bytes(), 10_000);
        assert_eq!(
            decoder.state,
            State::Data {
                remaining: u64::MAX - 10_000
            }
        );
        assert_eq!(decoder.size_line.capacity(), 0, "nothing was buffered");
    }

    #[test]
    fn split_size_line_and_crlf() {
        let outcome = run_split(
            b"1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n",
            &[1, 3, 31, 32],
        )
        .unwrap();
        assert_eq!(outcome.body, b"abcdefghijklmnopqrstuvwxyz");
        assert!(outcome.done);
    }

    #[test]
    fn error_labels() {
        assert_eq!(ChunkedError::BadChunkSize.as_str(), "bad_chunk_size");
        assert_eq!(ChunkedError::SizeLineTooLong.as_str(), "size_line_too_long");
        assert_eq!(
            ChunkedError::BadChunkTerminator.as_str(),
            "bad_chunk_terminator"
        );
        assert_eq!(
            ChunkedError::TrailersTooLarge.as_str(),
            "trailers_too_large"
        );
        assert_eq!(
            ChunkedError::TrailersTooLarge.to_string(),
            "trailers_too_large"
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let alphabet = b"0123456789abcdefABCDEF;= \t\r\n\"xyz\xFF";
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..5000 {
            let mut input = Vec::new();
            for _ in 0..48 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                input.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let cut = (state % 49) as usize;
            let whole = run_split(&input, &[]).map(|o| (o.body, o.leftover, o.done));
            let split = run_split(&input, &[cut]).map(|o| (o.body, o.leftover, o.done));
            // Output must not depend on the split, except that an error
            // may surface with fewer bytes delivered first.
            match (whole, split) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{input:?} cut {cut}"),
                (Err(a), Err(b)) => assert_eq!(a, b, "{input:?} cut {cut}"),
                (a, b) => panic!("{input:?} cut {cut}: {a:?} vs {b:?}"),
            }
        }
    }
}
