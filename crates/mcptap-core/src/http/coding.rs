//! Content codings and transfer codings other than chunked, decoded in streaming fashion for
//! the bodies HTTP keeps (JSON and SSE): gzip, deflate (zlib-wrapped or raw, told apart by the
//! first two bytes), br and zstd.
//!
//! Bounds, each counted when hit ([`UndecodableReason`]): at most [`MAX_CODINGS`] stacked
//! codings per body; decompressed output at most [`MAX_RATIO`] times the compressed input
//! (after a first [`RATIO_GRACE`] bytes), the bomb guard; zstd windows at most
//! 2^[`ZSTD_WINDOW_LOG_MAX`] bytes. A body has one decoder per coding, and a connection at most
//! one body open per direction, so a connection holds at most `2 × MAX_CODINGS` decoders;
//! their memory ([`BodyDecoder::memory`]) is charged to the pipeline's budget through
//! `Connection::buffered_bytes`, so the budget bounds how many are live in total. The size cap
//! on what the decoded bytes become is the sink's (`max_message_bytes`, `max_sse_event_bytes`).

use crate::model::UndecodableReason;
use std::io::Write;

/// Most codings decoded on one body (e.g. `Transfer-Encoding: gzip, chunked` plus
/// `Content-Encoding: br`).
pub const MAX_CODINGS: usize = 3;
/// Decompressed bytes allowed per compressed byte, once past [`RATIO_GRACE`].
pub const MAX_RATIO: u64 = 200;
/// Decompressed bytes always allowed before the ratio guard applies.
pub const RATIO_GRACE: u64 = 1 << 20;
/// Largest zstd window accepted (8 MiB, RFC 9659's limit for HTTP).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;
/// Input fed to a decoder at once, so that one write's output stays small.
const INPUT_SLICE: usize = 4096;

/// One coding of a `Transfer-Encoding` or `Content-Encoding` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Chunked,
    Gzip,
    Deflate,
    Br,
    Zstd,
    Unknown,
}

impl Coding {
    /// The coding a list member names (case-insensitive, parameters ignored).
    pub fn parse(member: &[u8]) -> Coding {
        let name = member
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        const NAMES: &[(&[u8], Coding)] = &[
            (b"chunked", Coding::Chunked),
            (b"gzip", Coding::Gzip),
            (b"x-gzip", Coding::Gzip),
            (b"deflate", Coding::Deflate),
            (b"br", Coding::Br),
            (b"zstd", Coding::Zstd),
            (b"identity", Coding::Identity),
        ];
        NAMES
            .iter()
            .find(|(n, _)| name.eq_ignore_ascii_case(n))
            .map_or(Coding::Unknown, |(_, c)| *c)
    }
}

/// The codings of a list, in the order they were applied (the order listed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodingList {
    items: [Option<Coding>; MAX_CODINGS + 1],
    len: usize,
    /// More members than fit.
    pub overflow: bool,
    /// At least one member (even an empty or unknown one) was seen.
    pub present: bool,
}

impl CodingList {
    /// Adds the members of one header value (`gzip, chunked`).
    pub fn add_header(&mut self, value: &[u8]) {
        self.present = true;
        for member in value.split(|b| *b == b',') {
            if member.trim_ascii().is_empty() {
                continue;
            }
            self.push(Coding::parse(member));
        }
    }

    pub fn push(&mut self, coding: Coding) {
        match self.items.get_mut(self.len) {
            Some(slot) => {
                *slot = Some(coding);
                self.len += 1;
            }
            None => self.overflow = true,
        }
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Coding> + '_ {
        self.items.iter().take(self.len).flatten().copied()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn last(&self) -> Option<Coding> {
        self.iter().next_back()
    }
}

/// A writer that keeps at most `limit` bytes: beyond, it fails the write (and remembers it),
/// which stops the decoder writing into it.
#[derive(Debug, Default)]
struct Capped {
    buf: Vec<u8>,
    limit: usize,
    over: bool,
}

impl Write for Capped {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.over = true;
            return Err(std::io::Error::other("decompressed output over the limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

type Brotli = brotli::DecompressorWriter<Capped>;

enum Stage {
    /// The first bytes, until the decoder's kind or memory can be told from them.
    Sniff {
        coding: Coding,
        prefix: Vec<u8>,
        out: Capped,
    },
    Gzip(flate2::write::MultiGzDecoder<Capped>),
    Zlib(flate2::write::ZlibDecoder<Capped>),
    Raw(flate2::write::DeflateDecoder<Capped>),
    Br(Box<Brotli>, usize),
    Zstd(zstd::stream::write::Decoder<'static, Capped>, usize),
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Stage::Sniff { .. } => "sniff",
            Stage::Gzip(_) => "gzip",
            Stage::Zlib(_) => "zlib",
            Stage::Raw(_) => "deflate",
            Stage::Br(..) => "br",
            Stage::Zstd(..) => "zstd",
        };
        f.write_str(name)
    }
}

/// Bytes a flate2 inflater holds (32 KiB window plus state), with the 32 KiB buffer of its
/// writer.
const INFLATE_MEMORY: usize = (48 << 10) + (32 << 10);
/// What a gzip member's header may add for the decoder's life: flate2 keeps its FEXTRA, FNAME
/// and FCOMMENT fields, up to 64 KiB each.
const GZIP_HEADER_MEMORY: usize = 3 * (64 << 10);
/// The most a brotli decoder's Huffman tables and context maps take besides its window:
/// a stream may declare 256 trees of each kind, about 2.7 MiB, whatever the window it
/// declares.
const BROTLI_TABLES_MEMORY: usize = 3 << 20;

impl Stage {
    fn out(&mut self) -> &mut Capped {
        match self {
            Stage::Sniff { out, .. } => out,
            Stage::Gzip(d) => d.get_mut(),
            Stage::Zlib(d) => d.get_mut(),
            Stage::Raw(d) => d.get_mut(),
            Stage::Br(d, _) => d.get_mut(),
            Stage::Zstd(d, _) => d.get_mut(),
        }
    }

    fn memory(&self) -> usize {
        match self {
            Stage::Sniff { prefix, out, .. } => prefix.capacity() + out.buf.capacity(),
            Stage::Gzip(d) => INFLATE_MEMORY + GZIP_HEADER_MEMORY + d.get_ref().buf.capacity(),
            Stage::Zlib(d) => INFLATE_MEMORY + d.get_ref().buf.capacity(),
            Stage::Raw(d) => INFLATE_MEMORY + d.get_ref().buf.capacity(),
            Stage::Br(d, window) => window + d.get_ref().buf.capacity(),
            // A later frame may declare a larger window than the first: charge the cap.
            Stage::Zstd(d, window) => {
                (*window).max(1usize << ZSTD_WINDOW_LOG_MAX) + d.get_ref().buf.capacity()
            }
        }
    }

    /// Prefix bytes needed to choose the decoder.
    fn wanted(coding: Coding) -> usize {
        match coding {
            Coding::Deflate => 2,
            Coding::Br => 1,
            Coding::Zstd => 6,
            _ => 0,
        }
    }

    /// Builds the decoder for `coding` from its first bytes.
    fn build(coding: Coding, prefix: &[u8], out: Capped) -> Result<Stage, UndecodableReason> {
        Ok(match coding {
            Coding::Gzip => Stage::Gzip(flate2::write::MultiGzDecoder::new(out)),
            Coding::Deflate => {
                // RFC 9110 says zlib; some servers send raw deflate. A zlib header is CM 8 and a
                // header checksum that is a multiple of 31.
                let zlib = match prefix {
                    [cmf, flg, ..] => {
                        cmf & 0x0f == 8 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0
                    }
                    _ => false,
                };
                if zlib {
                    Stage::Zlib(flate2::write::ZlibDecoder::new(out))
                } else {
                    Stage::Raw(flate2::write::DeflateDecoder::new(out))
                }
            }
            Coding::Br => {
                let window = brotli_window(prefix.first().copied().unwrap_or(0));
                Stage::Br(
                    Box::new(Brotli::new(out, 4096)),
                    window + (64 << 10) + BROTLI_TABLES_MEMORY,
                )
            }
            Coding::Zstd => {
                let window = zstd_window(prefix)?;
                let mut raw =
                    zstd::stream::raw::Decoder::new().map_err(|_| UndecodableReason::Corrupt)?;
                raw.set_parameter(zstd::stream::raw::DParameter::WindowLogMax(
                    ZSTD_WINDOW_LOG_MAX,
                ))
                .map_err(|_| UndecodableReason::Corrupt)?;
                Stage::Zstd(
                    zstd::stream::write::Decoder::with_decoder(out, raw),
                    window + (128 << 10),
                )
            }
            Coding::Identity | Coding::Chunked | Coding::Unknown => {
                return Err(UndecodableReason::UnknownCoding);
            }
        })
    }

    /// Decodes `input` into this stage's output buffer.
    fn write(&mut self, input: &[u8]) -> Result<(), UndecodableReason> {
        if let Stage::Sniff {
            coding,
            prefix,
            out,
        } = self
        {
            let want = Self::wanted(*coding);
            let take = want.saturating_sub(prefix.len()).min(input.len());
            prefix.extend_from_slice(input.get(..take).unwrap_or_default());
            if prefix.len() < want {
                return Ok(());
            }
            let prefix = std::mem::take(prefix);
            let stage = Self::build(*coding, &prefix, std::mem::take(out))?;
            *self = stage;
            self.write(&prefix)?;
            return self.write(input.get(take..).unwrap_or_default());
        }
        if input.is_empty() {
            return Ok(());
        }
        let result = match self {
            Stage::Gzip(d) => d.write_all(input).and_then(|()| d.flush()),
            Stage::Zlib(d) => d.write_all(input).and_then(|()| d.flush()),
            Stage::Raw(d) => d.write_all(input).and_then(|()| d.flush()),
            Stage::Br(d, _) => d.write_all(input).and_then(|()| d.flush()),
            Stage::Zstd(d, _) => d.write_all(input).and_then(|()| d.flush()),
            Stage::Sniff { .. } => Ok(()),
        };
        result.map_err(|_| {
            if self.out().over {
                UndecodableReason::ExpansionRatio
            } else {
                UndecodableReason::Corrupt
            }
        })
    }

    /// The body ended: a stage still sniffing builds its decoder from what it has.
    fn finish(&mut self) -> Result<(), UndecodableReason> {
        if let Stage::Sniff {
            coding,
            prefix,
            out,
        } = self
        {
            if prefix.is_empty() {
                return Ok(());
            }
            let prefix = std::mem::take(prefix);
            *self = Self::build(*coding, &prefix, std::mem::take(out))?;
            self.write(&prefix)?;
        }
        Ok(())
    }
}

/// Window a brotli stream declares in its first byte (RFC 7932 §9.1), in bytes.
fn brotli_window(first: u8) -> usize {
    let bits = if first & 1 == 0 {
        16
    } else if (first >> 1) & 7 != 0 {
        17 + u32::from((first >> 1) & 7)
    } else if (first >> 4) & 7 != 0 {
        8 + u32::from((first >> 4) & 7)
    } else {
        17
    };
    1usize << bits.min(24)
}

/// Window a zstd frame declares (RFC 8878 §3.1.1.1.2), in bytes, at most the limit.
fn zstd_window(prefix: &[u8]) -> Result<usize, UndecodableReason> {
    let max = 1usize << ZSTD_WINDOW_LOG_MAX;
    let (Some(&fhd), Some(&wd)) = (prefix.get(4), prefix.get(5)) else {
        return Ok(max);
    };
    if fhd & 0x20 != 0 {
        // Single segment: the window is the content size, not declared here.
        return Ok(max);
    }
    let log = 10 + u32::from(wd >> 3);
    if log > ZSTD_WINDOW_LOG_MAX {
        return Err(UndecodableReason::WindowTooLarge);
    }
    let base = 1usize << log;
    Ok((base + (base / 8) * usize::from(wd & 7)).min(max))
}

/// Most output the decoders may flush when a body ends (what they buffered internally).
const FINISH_OUTPUT: usize = 1 << 20;

/// The decoders of one body, in decoding order (the reverse of the order applied).
#[derive(Debug)]
pub struct BodyDecoder {
    stages: Vec<Stage>,
    input: u64,
    output: u64,
}

impl BodyDecoder {
    /// Decoders for a body encoded with `applied` codings, in the order applied (content
    /// codings first, then transfer codings). Identity is skipped.
    ///
    /// # Errors
    ///
    /// An unknown coding, or more than [`MAX_CODINGS`].
    pub fn new(applied: &[Coding]) -> Result<Self, UndecodableReason> {
        let mut stages = Vec::new();
        for &coding in applied.iter().rev() {
            match coding {
                Coding::Identity => continue,
                Coding::Chunked | Coding::Unknown => return Err(UndecodableReason::UnknownCoding),
                _ => {}
            }
            if stages.len() == MAX_CODINGS {
                return Err(UndecodableReason::TooManyCodings);
            }
            stages.push(Stage::Sniff {
                coding,
                prefix: Vec::new(),
                out: Capped::default(),
            });
        }
        Ok(BodyDecoder {
            stages,
            input: 0,
            output: 0,
        })
    }

    /// Nothing to decode (only identity codings).
    pub fn is_identity(&self) -> bool {
        self.stages.is_empty()
    }

    /// Decodes `input`, handing the decoded bytes to `sink`.
    ///
    /// # Errors
    ///
    /// Corrupt data, or output beyond the ratio guard: the body is unusable from here.
    pub fn push(
        &mut self,
        input: &[u8],
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<(), UndecodableReason> {
        for piece in input.chunks(INPUT_SLICE) {
            self.input = self.input.saturating_add(piece.len() as u64);
            self.run(piece, false, sink)?;
        }
        Ok(())
    }

    /// The body ended: hands over what the decoders still hold.
    ///
    /// # Errors
    ///
    /// As [`BodyDecoder::push`].
    pub fn finish(&mut self, sink: &mut dyn FnMut(&[u8])) -> Result<(), UndecodableReason> {
        self.run(&[], true, sink)
    }

    fn run(
        &mut self,
        piece: &[u8],
        finish: bool,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<(), UndecodableReason> {
        let allowed = self
            .input
            .saturating_mul(MAX_RATIO)
            .max(RATIO_GRACE)
            .saturating_sub(self.output);
        // Per slice too: a bomb after a stretch of honest input must not decode into one huge
        // uncharged buffer before the ratio over the whole body catches up.
        let step = if finish {
            FINISH_OUTPUT
        } else {
            piece
                .len()
                .saturating_mul(usize::try_from(MAX_RATIO).unwrap_or(usize::MAX))
                .saturating_add(64 << 10)
        };
        let limit = usize::try_from(allowed).unwrap_or(usize::MAX).min(step);
        let mut carry: Vec<u8> = Vec::new();
        let mut first = true;
        for stage in &mut self.stages {
            stage.out().limit = limit;
            let input: &[u8] = if first { piece } else { &carry };
            stage.write(input)?;
            if finish {
                stage.finish()?;
            }
            first = false;
            let out = stage.out();
            carry.clear();
            carry.extend_from_slice(&out.buf);
            out.buf.clear();
            if out.buf.capacity() > 64 << 10 {
                out.buf = Vec::new();
            }
        }
        let produced = if first { piece } else { &carry[..] };
        self.output = self.output.saturating_add(produced.len() as u64);
        if !produced.is_empty() {
            sink(produced);
        }
        Ok(())
    }

    /// Bytes the decoders hold (windows, state, buffers), for the memory budget.
    pub fn memory(&self) -> usize {
        self.stages.iter().map(Stage::memory).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(applied: &[Coding], data: &[u8], cut: usize) -> Result<Vec<u8>, UndecodableReason> {
        let mut d = BodyDecoder::new(applied)?;
        let mut out = Vec::new();
        let (a, b) = data.split_at(cut.min(data.len()));
        d.push(a, &mut |x| out.extend_from_slice(x))?;
        d.push(b, &mut |x| out.extend_from_slice(x))?;
        d.finish(&mut |x| out.extend_from_slice(x))?;
        Ok(out)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn decoders_are_charged_for_what_a_stream_can_make_them_hold() {
        // brotli: its tables take megabytes whatever small window the stream declares.
        let mut br = BodyDecoder::new(&[Coding::Br]).expect("br");
        br.push(&[0x0b], &mut |_| {}).expect("window byte");
        assert!(br.memory() >= BROTLI_TABLES_MEMORY, "{}", br.memory());
        // gzip: a member's header fields are kept for the decoder's life.
        let mut gz = BodyDecoder::new(&[Coding::Gzip]).expect("gzip");
        let body = gzip(b"{}");
        gz.push(&body[..4], &mut |_| {}).expect("gzip start");
        assert!(
            gz.memory() >= INFLATE_MEMORY + GZIP_HEADER_MEMORY,
            "{}",
            gz.memory()
        );
    }

    #[test]
    fn every_coding_decodes_at_every_split() {
        let text = br#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tools":{}}}}"#.repeat(20);
        let zlib = {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&text).unwrap();
            e.finish().unwrap()
        };
        let raw = {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&text).unwrap();
            e.finish().unwrap()
        };
        let br = {
            let mut out = Vec::new();
            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 20);
            w.write_all(&text).unwrap();
            drop(w);
            out
        };
        let zstd = zstd::encode_all(&text[..], 3).unwrap();
        let cases: [(&[Coding], Vec<u8>); 5] = [
            (&[Coding::Gzip], gzip(&text)),
            (&[Coding::Deflate], zlib),
            (&[Coding::Deflate], raw),
            (&[Coding::Br], br),
            (&[Coding::Zstd], zstd),
        ];
        for (codings, data) in cases {
            for cut in 0..=data.len() {
                assert_eq!(
                    decode(codings, &data, cut).unwrap(),
                    text,
                    "{codings:?} {cut}"
                );
            }
        }
        let stacked = gzip(&gzip(&text));
        assert_eq!(
            decode(&[Coding::Gzip, Coding::Gzip], &stacked, 7).unwrap(),
            text
        );
    }

    #[test]
    fn bombs_unknown_codings_and_corrupt_data_are_refused() {
        let bomb = gzip(&vec![0u8; 64 << 20]);
        assert_eq!(
            decode(&[Coding::Gzip], &bomb, 0),
            Err(UndecodableReason::ExpansionRatio)
        );
        assert_eq!(
            BodyDecoder::new(&[Coding::Unknown]).err(),
            Some(UndecodableReason::UnknownCoding)
        );
        assert_eq!(
            BodyDecoder::new(&[Coding::Gzip; 4]).err(),
            Some(UndecodableReason::TooManyCodings)
        );
        assert_eq!(
            decode(&[Coding::Gzip], b"not gzip at all", 3),
            Err(UndecodableReason::Corrupt)
        );
        // A zstd frame declaring a 1 GiB window.
        let frame = [0x28, 0xb5, 0x2f, 0xfd, 0x00, (30 - 10) << 3, 0, 0];
        assert_eq!(
            decode(&[Coding::Zstd], &frame, 8),
            Err(UndecodableReason::WindowTooLarge)
        );
        assert!(BodyDecoder::new(&[Coding::Identity]).unwrap().is_identity());
    }
}
