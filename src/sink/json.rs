//! Compact JSON into a byte buffer, byte for byte what `serde_json::to_writer` writes, with
//! cheaper strings: serde_json looks every byte of every key and value up in its escape
//! table and hands each run to the writer; here a string is checked a word (8 bytes) at a time
//! and, when nothing in it needs an escape (nearly always: keys, ids, addresses, times), copied
//! whole into the `Vec`. Numbers are formatted by serde_json's own formatter, so they cannot
//! drift. serde_json's raw values are copied as they are, as serde_json copies them. What this
//! serializer does not handle (map keys other than strings, integers and bools) is an
//! [`Unsupported`] error, on which the caller falls back to serde_json, which writes or rejects
//! it as always.

use mcptap_core::model::{
    Direction, Event, Exchange, Handshake, Ipv4Text, SchemaVersion, SessionEnd, Timestamp,
};
use serde::ser::{self, Serialize};
use serde_json::ser::{CompactFormatter, Formatter};
use std::fmt;
use std::net::SocketAddr;

/// What [`to_vec`] could not write; the buffer then holds a partial line.
#[derive(Debug)]
pub struct Unsupported(String);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsupported {}

impl ser::Error for Unsupported {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Unsupported(msg.to_string())
    }
}

type Result<T = ()> = std::result::Result<T, Unsupported>;

/// Appends `value` as compact JSON to `out`.
pub fn to_vec<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result {
    value.serialize(&mut Serializer { out })
}

/// Appends `event` as compact JSON to `out`: exchange, handshake and session_end events (the
/// lines of a busy gateway) by writers of their own, alerts by [`to_vec`].
pub fn event_to_vec(event: &Event, out: &mut Vec<u8>) -> Result {
    match event {
        Event::Exchange(e) => write_exchange(e, out),
        Event::Handshake(h) => write_handshake(h, out),
        Event::SessionEnd(e) => write_session_end(e, out),
        other => to_vec(other, out),
    }
}

/// A handshake event, as [`write_exchange`] writes an exchange.
fn write_handshake(h: &Handshake, out: &mut Vec<u8>) -> Result {
    let Handshake {
        v,
        ts,
        session_id,
        seq,
        outcome,
        http_status,
        error_code,
        error_message,
        client,
        server,
        host,
        path,
        protocol_version_requested,
        protocol_version,
        client_info,
        server_info,
        client_capabilities,
        server_capabilities,
        diff,
        client_near_miss,
        predecessor_session_id,
        lineage,
        era,
        source,
        lineage_id,
        method,
        supported_versions,
    } = h;
    write_start(out, b"handshake", v, *ts, session_id.as_deref(), 1024)?;
    out.extend_from_slice(b",\"seq\":");
    let _ = CompactFormatter.write_u32(out, *seq);
    out.extend_from_slice(b",\"outcome\":");
    outcome.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"http_status\":");
    let _ = CompactFormatter.write_u16(out, *http_status);
    out.extend_from_slice(b",\"error_code\":");
    write_opt_i64(out, *error_code);
    out.extend_from_slice(b",\"error_message\":");
    write_opt_str(out, error_message.as_deref());
    out.extend_from_slice(b",\"client\":");
    write_addr(out, client);
    out.extend_from_slice(b",\"server\":");
    write_addr(out, server);
    out.extend_from_slice(b",\"host\":");
    write_opt_str(out, host.as_deref());
    out.extend_from_slice(b",\"path\":");
    write_str(out, path);
    out.extend_from_slice(b",\"protocol_version_requested\":");
    write_opt_str(out, protocol_version_requested.as_deref());
    out.extend_from_slice(b",\"protocol_version\":");
    write_opt_str(out, protocol_version.as_deref());
    // Each value's JSON text, copied as serde_json copies a raw value.
    out.extend_from_slice(b",\"client_info\":");
    out.extend_from_slice(client_info.text().as_bytes());
    out.extend_from_slice(b",\"server_info\":");
    out.extend_from_slice(server_info.text().as_bytes());
    out.extend_from_slice(b",\"client_capabilities\":");
    out.extend_from_slice(client_capabilities.text().as_bytes());
    out.extend_from_slice(b",\"server_capabilities\":");
    out.extend_from_slice(server_capabilities.text().as_bytes());
    out.extend_from_slice(b",\"diff\":");
    diff.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"client_near_miss\":");
    write_bool(out, *client_near_miss);
    out.extend_from_slice(b",\"predecessor_session_id\":");
    write_opt_str(out, predecessor_session_id.as_deref());
    out.extend_from_slice(b",\"lineage\":");
    lineage.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"era\":");
    write_label(out, era.as_str());
    out.extend_from_slice(b",\"source\":");
    write_label(out, source.as_str());
    out.extend_from_slice(b",\"lineage_id\":");
    write_opt_str(out, lineage_id.as_deref());
    if let Some(method) = method {
        out.extend_from_slice(b",\"method\":");
        write_str(out, method);
    }
    if let Some(versions) = supported_versions {
        out.extend_from_slice(b",\"supported_versions\":");
        versions.serialize(&mut Serializer { out: &mut *out })?;
    }
    out.push(b'}');
    Ok(())
}

/// A session_end event, as [`write_exchange`] writes an exchange.
fn write_session_end(e: &SessionEnd, out: &mut Vec<u8>) -> Result {
    let SessionEnd {
        v,
        ts,
        session_id,
        server,
        reason,
        handshakes,
        requests,
        alerts,
        lineage_id,
    } = e;
    write_start(out, b"session_end", v, *ts, session_id.as_deref(), 256)?;
    out.extend_from_slice(b",\"server\":");
    write_addr(out, server);
    out.extend_from_slice(b",\"reason\":");
    reason.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"handshakes\":");
    let _ = CompactFormatter.write_u32(out, *handshakes);
    out.extend_from_slice(b",\"requests\":");
    let _ = CompactFormatter.write_u64(out, *requests);
    out.extend_from_slice(b",\"alerts\":");
    let _ = CompactFormatter.write_u32(out, *alerts);
    if let Some(lineage_id) = lineage_id {
        out.extend_from_slice(b",\"lineage_id\":");
        write_str(out, lineage_id);
    }
    out.push(b'}');
    Ok(())
}

/// An exchange event, byte for byte as its derived `Serialize` (tagged by `Event`) writes it,
/// without serde's field-by-field calls: each key with its punctuation is one copy, and only
/// the values go through the serializer. The struct is destructured whole, so that a new
/// field does not compile until it is written here; tests hold the output to serde_json's.
fn write_exchange(e: &Exchange, out: &mut Vec<u8>) -> Result {
    let Exchange {
        v,
        ts,
        session_id,
        server,
        client,
        method,
        request_id,
        tool,
        protocol_version,
        http_status,
        media_type,
        sse_events,
        duration_ms,
        answered,
        error_code,
        empty_content,
        cancelled,
        framing,
        ambiguous,
        era,
        lineage_id,
        direction,
        input_required,
    } = e;
    write_start(out, b"exchange", v, *ts, session_id.as_deref(), 512)?;
    out.extend_from_slice(b",\"server\":");
    write_addr(out, server);
    out.extend_from_slice(b",\"client\":");
    write_addr(out, client);
    out.extend_from_slice(b",\"method\":");
    write_str(out, method);
    out.extend_from_slice(b",\"request_id\":");
    request_id.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"tool\":");
    write_opt_str(out, tool.as_deref());
    out.extend_from_slice(b",\"protocol_version\":");
    write_opt_str(out, protocol_version.as_deref());
    out.extend_from_slice(b",\"http_status\":");
    let _ = CompactFormatter.write_u16(out, *http_status);
    out.extend_from_slice(b",\"media_type\":");
    write_label(out, media_type);
    out.extend_from_slice(b",\"sse_events\":");
    let _ = CompactFormatter.write_u32(out, *sse_events);
    out.extend_from_slice(b",\"duration_ms\":");
    duration_ms.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"answered\":");
    write_bool(out, *answered);
    out.extend_from_slice(b",\"error_code\":");
    write_opt_i64(out, *error_code);
    if let Some(empty) = empty_content {
        out.extend_from_slice(b",\"empty_content\":");
        write_bool(out, *empty);
    }
    if *cancelled {
        out.extend_from_slice(b",\"cancelled\":true");
    }
    out.extend_from_slice(b",\"framing\":");
    framing.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"ambiguous\":");
    write_bool(out, *ambiguous);
    out.extend_from_slice(b",\"era\":");
    write_label(out, era.as_str());
    out.extend_from_slice(b",\"lineage_id\":");
    write_opt_str(out, lineage_id.as_deref());
    if *direction != Direction::ClientToServer {
        out.extend_from_slice(b",\"direction\":");
        write_label(out, direction.as_str());
    }
    if let Some(input) = input_required {
        out.extend_from_slice(b",\"input_required\":");
        input.serialize(&mut Serializer { out: &mut *out })?;
    }
    out.push(b'}');
    Ok(())
}

/// What every event starts with: `{"event":"<tag>","v":..,"ts":..,"session_id":..`, with room
/// for `capacity` bytes of the line.
fn write_start(
    out: &mut Vec<u8>,
    tag: &[u8],
    v: &SchemaVersion,
    ts: Timestamp,
    session_id: Option<&str>,
    capacity: usize,
) -> Result {
    out.reserve(capacity);
    out.extend_from_slice(b"{\"event\":\"");
    out.extend_from_slice(tag);
    out.extend_from_slice(b"\",\"v\":");
    v.serialize(&mut Serializer { out: &mut *out })?;
    out.extend_from_slice(b",\"ts\":");
    write_time(out, ts)?;
    out.extend_from_slice(b",\"session_id\":");
    write_opt_str(out, session_id);
    Ok(())
}

/// A time as its `Serialize` writes it: digits and punctuation, copied quoted.
fn write_time(out: &mut Vec<u8>, ts: Timestamp) -> Result {
    match ts.rfc3339_bytes() {
        Some(text) => write_plain(out, &text),
        None => ts.serialize(&mut Serializer { out: &mut *out })?,
    }
    Ok(())
}

fn write_opt_i64(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => {
            let _ = CompactFormatter.write_i64(out, v);
        }
        None => out.extend_from_slice(b"null"),
    }
}

fn write_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_bool(out: &mut Vec<u8>, v: bool) {
    out.extend_from_slice(if v { b"true" } else { b"false" });
}

/// An endpoint as the model's `addr` writes it: IPv4 without the formatting machinery.
fn write_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    match a {
        SocketAddr::V4(v4) => write_plain(out, Ipv4Text::new(*v4.ip(), Some(v4.port())).as_bytes()),
        SocketAddr::V6(_) => write_str(out, &a.to_string()),
    }
}

/// A label of the model's (`json`, `legacy`, ...): nothing in it to escape.
fn write_label(out: &mut Vec<u8>, label: &'static str) {
    debug_assert!(
        !any_escape(label.as_bytes()),
        "label {label:?} needs escaping"
    );
    write_plain(out, label.as_bytes());
}

/// Text made of digits and punctuation that JSON does not escape (times, addresses), quoted.
fn write_plain(out: &mut Vec<u8>, text: &[u8]) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text);
    out.push(b'"');
}

/// The struct and field name serde_json's `RawValue` serializes its text under.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// serde_json's escapes: 0 for bytes written as they are.
const ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Whether any byte of `word` is a control character, `"` or `\` (exact for "any": the
/// classic has-less-than and has-zero-byte tests, bytes from 0x80 up never match).
#[inline]
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x;
    (below_space | zero_in(quote) | zero_in(backslash)) & HIGHS != 0
}

/// `s` as a JSON string, quotes included.
#[inline]
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if any_escape(bytes) {
        return write_escaping(out, bytes);
    }
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    out.extend_from_slice(bytes);
    out.push(b'"');
}

/// Whether any byte of `bytes` needs an escape, a word at a time.
#[inline]
fn any_escape(bytes: &[u8]) -> bool {
    any_word(bytes, needs_escape)
}

/// Whether `bytes` are printable ASCII (0x20 to 0x7e) other than `"` and `\`: text that a
/// JSON string and Rust's `Debug` both write as it is.
pub(crate) fn plain_printable(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte from 0x7f up has its high bit set, itself or once 1 is added (a carry out of a
    // 0xff byte only adds to what is already found).
    !any_word(bytes, |w| {
        needs_escape(w) || (w | w.wrapping_add(ONES)) & HIGHS != 0
    })
}

/// Whether `test` finds anything in a word of `bytes`: the last word overlaps the one before
/// it, or is padded with spaces (which no test finds) when `bytes` is shorter than a word.
#[inline]
fn any_word(bytes: &[u8], test: impl Fn(u64) -> bool) -> bool {
    let word_at = |at: usize| {
        let mut w = [0; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    if bytes.len() < 8 {
        let mut padded = u64::from_le_bytes([b' '; 8]);
        for (i, &b) in bytes.iter().enumerate() {
            padded = (padded & !(0xff << (8 * i))) | (u64::from(b) << (8 * i));
        }
        return test(padded);
    }
    let mut at = 0;
    while at + 8 < bytes.len() {
        if test(word_at(at)) {
            return true;
        }
        at += 8;
    }
    test(word_at(bytes.len() - 8))
}

/// [`write_str`] for a string with something to escape: byte by byte.
#[cold]
fn write_escaping(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    escape_contents(out, bytes);
    out.push(b'"');
}

/// `bytes` (UTF-8) as the contents of a JSON string, without its quotes, escaped as serde_json
/// escapes them.
pub(crate) fn escape_contents(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut run_start = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let escape = ESCAPE[usize::from(byte)];
        if escape != 0 {
            out.extend_from_slice(&bytes[run_start..at]);
            write_escape(out, byte, escape);
            run_start = at + 1;
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
}

fn write_escape(out: &mut Vec<u8>, byte: u8, escape: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    if escape == b'u' {
        out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(byte >> 4)],
            HEX[usize::from(byte & 0x0f)],
        ]);
    } else {
        out.extend_from_slice(&[b'\\', escape]);
    }
}

pub struct Serializer<'a> {
    out: &'a mut Vec<u8>,
}

// Writing into a Vec cannot fail: the formatter's io::Result is always Ok.
macro_rules! number {
    ($out:expr, $method:ident, $value:expr) => {{
        let _ = CompactFormatter.$method($out, $value);
        Ok(())
    }};
}

/// The integer methods, each written by serde_json's formatter.
macro_rules! integers {
    ($($name:ident: $ty:ty => $method:ident),*) => {$(
        fn $name(self, v: $ty) -> Result {
            number!(self.out, $method, v)
        }
    )*};
}

impl<'a, 'b> ser::Serializer for &'b mut Serializer<'a> {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = Compound<'a, 'b>;
    type SerializeTuple = Compound<'a, 'b>;
    type SerializeTupleStruct = Compound<'a, 'b>;
    type SerializeTupleVariant = Compound<'a, 'b>;
    type SerializeMap = Compound<'a, 'b>;
    type SerializeStruct = Compound<'a, 'b>;
    type SerializeStructVariant = Compound<'a, 'b>;

    fn serialize_bool(self, v: bool) -> Result {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    integers!(
        serialize_i8: i8 => write_i8,
        serialize_i16: i16 => write_i16,
        serialize_i32: i32 => write_i32,
        serialize_i64: i64 => write_i64,
        serialize_i128: i128 => write_i128,
        serialize_u8: u8 => write_u8,
        serialize_u16: u16 => write_u16,
        serialize_u32: u32 => write_u32,
        serialize_u64: u64 => write_u64,
        serialize_u128: u128 => write_u128
    );
    fn serialize_f32(self, v: f32) -> Result {
        if v.is_finite() {
            number!(self.out, write_f32, v)
        } else {
            self.serialize_unit()
        }
    }
    fn serialize_f64(self, v: f64) -> Result {
        if v.is_finite() {
            number!(self.out, write_f64, v)
        } else {
            self.serialize_unit()
        }
    }
    fn serialize_char(self, v: char) -> Result {
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result {
        use ser::SerializeSeq;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for b in v {
            seq.serialize_element(b)?;
        }
        seq.end()
    }
    fn serialize_none(self) -> Result {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a, 'b>> {
        self.out.push(b'[');
        Ok(Compound::new(self, b"]"))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a, 'b>> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a, 'b>> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'b>> {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.extend_from_slice(b":[");
        Ok(Compound::new(self, b"]}"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a, 'b>> {
        self.out.push(b'{');
        Ok(Compound::new(self, b"}"))
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Compound<'a, 'b>> {
        if name == RAW_VALUE_TOKEN {
            // Its one field is its JSON text, written as it is.
            return Ok(Compound {
                raw: true,
                ..Compound::new(self, b"")
            });
        }
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'b>> {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.extend_from_slice(b":{");
        Ok(Compound::new(self, b"}}"))
    }
}

/// An array or object being written: a comma goes before every element but the first.
pub struct Compound<'a, 'b> {
    ser: &'b mut Serializer<'a>,
    first: bool,
    close: &'static [u8],
    /// A raw value: its field is JSON text to copy.
    raw: bool,
}

impl<'a, 'b> Compound<'a, 'b> {
    fn new(ser: &'b mut Serializer<'a>, close: &'static [u8]) -> Self {
        Compound {
            ser,
            first: true,
            close,
            raw: false,
        }
    }

    #[inline(always)]
    fn separate(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.ser.out.push(b',');
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result {
        self.separate();
        value.serialize(&mut *self.ser)
    }

    /// `key` is a struct's field name: an identifier (or a rename) of ours, with nothing to
    /// escape, so it is copied without the check (a test holds every fixture event to
    /// serde_json's output).
    #[inline(always)]
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result {
        if self.raw {
            return value.serialize(MapKey {
                out: &mut *self.ser.out,
                raw: true,
            });
        }
        debug_assert!(
            !any_escape(key.as_bytes()),
            "field name {key:?} needs escaping"
        );
        self.separate();
        let out = &mut *self.ser.out;
        out.reserve(key.len() + 3);
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        value.serialize(&mut *self.ser)
    }

    fn finish(self) -> Result {
        self.ser.out.extend_from_slice(self.close);
        Ok(())
    }
}

/// The array-like compounds: each element written after a separator.
macro_rules! array_like {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Compound<'_, '_> {
            type Ok = ();
            type Error = Unsupported;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result {
                self.element(value)
            }
            fn end(self) -> Result {
                self.finish()
            }
        }
    )*};
}

array_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result {
        self.separate();
        key.serialize(MapKey {
            out: &mut *self.ser.out,
            raw: false,
        })?;
        self.ser.out.push(b':');
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result {
        value.serialize(&mut *self.ser)
    }
    fn end(self) -> Result {
        self.finish()
    }
}

/// The struct-like compounds: each field written as a key and its value.
macro_rules! struct_like {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_, '_> {
            type Ok = ();
            type Error = Unsupported;
            #[inline(always)]
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result {
                self.field(key, value)
            }
            fn end(self) -> Result {
                self.finish()
            }
        }
    )*};
}

struct_like!(SerializeStruct, SerializeStructVariant);

/// A map key: strings as they are, integers and bools quoted (as serde_json writes them);
/// anything else is [`Unsupported`].
struct MapKey<'o> {
    out: &'o mut Vec<u8>,
    /// A raw value's text instead, copied as it is: only a string is one.
    raw: bool,
}

macro_rules! quoted_number {
    ($name:ident, $ty:ty, $method:ident) => {
        fn $name(self, v: $ty) -> Result {
            self.key_only()?;
            self.out.push(b'"');
            let _ = CompactFormatter.$method(self.out, v);
            self.out.push(b'"');
            Ok(())
        }
    };
}

fn unsupported_key() -> Unsupported {
    Unsupported("map key of an unsupported type".into())
}

impl MapKey<'_> {
    fn key_only(&self) -> Result {
        if self.raw {
            return Err(Unsupported("raw value that is not text".into()));
        }
        Ok(())
    }
}

impl ser::Serializer for MapKey<'_> {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = ser::Impossible<(), Unsupported>;
    type SerializeTuple = ser::Impossible<(), Unsupported>;
    type SerializeTupleStruct = ser::Impossible<(), Unsupported>;
    type SerializeTupleVariant = ser::Impossible<(), Unsupported>;
    type SerializeMap = ser::Impossible<(), Unsupported>;
    type SerializeStruct = ser::Impossible<(), Unsupported>;
    type SerializeStructVariant = ser::Impossible<(), Unsupported>;

    fn serialize_str(self, v: &str) -> Result {
        if self.raw {
            self.out.extend_from_slice(v.as_bytes());
        } else {
            write_str(self.out, v);
        }
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result {
        self.key_only()?;
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_bool(self, v: bool) -> Result {
        self.key_only()?;
        self.out
            .extend_from_slice(if v { b"\"true\"" } else { b"\"false\"" });
        Ok(())
    }
    quoted_number!(serialize_i8, i8, write_i8);
    quoted_number!(serialize_i16, i16, write_i16);
    quoted_number!(serialize_i32, i32, write_i32);
    quoted_number!(serialize_i64, i64, write_i64);
    quoted_number!(serialize_i128, i128, write_i128);
    quoted_number!(serialize_u8, u8, write_u8);
    quoted_number!(serialize_u16, u16, write_u16);
    quoted_number!(serialize_u32, u32, write_u32);
    quoted_number!(serialize_u64, u64, write_u64);
    quoted_number!(serialize_u128, u128, write_u128);
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result {
        self.key_only()?;
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result {
        value.serialize(self)
    }
    fn serialize_f32(self, _v: f32) -> Result {
        Err(unsupported_key())
    }
    fn serialize_f64(self, _v: f64) -> Result {
        Err(unsupported_key())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result {
        Err(unsupported_key())
    }
    fn serialize_none(self) -> Result {
        Err(unsupported_key())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result {
        Err(unsupported_key())
    }
    fn serialize_unit(self) -> Result {
        Err(unsupported_key())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result {
        Err(unsupported_key())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result {
        Err(unsupported_key())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq> {
        Err(unsupported_key())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple> {
        Err(unsupported_key())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct> {
        Err(unsupported_key())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant> {
        Err(unsupported_key())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap> {
        Err(unsupported_key())
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct> {
        Err(unsupported_key())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant> {
        Err(unsupported_key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn both<T: Serialize + ?Sized>(value: &T) -> (String, String) {
        let mut fast = Vec::new();
        to_vec(value, &mut fast).expect("supported");
        let slow = serde_json::to_vec(value).expect("serde_json");
        (
            String::from_utf8(fast).expect("utf-8"),
            String::from_utf8(slow).expect("utf-8"),
        )
    }

    #[test]
    fn strings_escape_as_serde_json_escapes_them() {
        let mut all_bytes = String::new();
        for c in (0u8..0x80).map(char::from) {
            all_bytes.push(c);
        }
        let cases = [
            String::new(),
            "plain".into(),
            "exactly8".into(),
            "sixteen bytes!!!".into(),
            "quote\" in the middle of a longer run of text".into(),
            "tail backslash\\".into(),
            "\u{1}\u{1f}\n\r\t\u{8}\u{c}".into(),
            "héllo wörld — ünïcode ✓ 日本語 \u{7f}".into(),
            all_bytes,
            format!("{}\"{}", "a".repeat(63), "b".repeat(65)),
        ];
        for s in &cases {
            let (fast, slow) = both(s.as_str());
            assert_eq!(fast, slow, "{s:?}");
        }
        // Every position of every escaped byte in strings shorter than, as long as and longer
        // than a word (the last word overlaps the one before, or is padded).
        for escaped in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
            for len in 0..=20 {
                for at in 0..=len {
                    let mut s = "x".repeat(len);
                    s.insert(at, escaped);
                    let (fast, slow) = both(s.as_str());
                    assert_eq!(fast, slow, "{s:?}");
                }
            }
        }
    }

    #[test]
    fn plain_printable_is_printable_ascii_without_quotes_and_backslashes() {
        let plain = |b: u8| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\';
        for len in 0..=20 {
            for at in 0..len.max(1) {
                for b in 0..=255u8 {
                    let mut s = vec![b'x'; len];
                    if let Some(slot) = s.get_mut(at) {
                        *slot = b;
                    }
                    assert_eq!(plain_printable(&s), s.iter().all(|&c| plain(c)), "{s:?}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_string_escapes_as_serde_json_escapes_it(s in "\\PC*|[\\x00-\\x7f]{0,40}") {
            let (fast, slow) = both(s.as_str());
            proptest::prop_assert_eq!(fast, slow);
        }
    }

    #[test]
    fn values_and_derived_types_write_as_serde_json_writes_them() {
        #[derive(serde::Serialize)]
        #[serde(tag = "event", rename_all = "snake_case")]
        enum Event {
            Thing {
                a: Option<u64>,
                b: Option<f64>,
                c: Vec<i32>,
                d: std::collections::BTreeMap<String, serde_json::Value>,
                e: Unit,
                f: (u8, bool),
                #[serde(flatten)]
                g: std::collections::BTreeMap<u16, char>,
            },
        }
        #[derive(serde::Serialize)]
        enum Unit {
            Only,
        }
        #[derive(serde::Serialize)]
        enum Shapes {
            New(u8),
            Tuple(u8, u8),
            Struct { x: f32 },
        }
        let value = json!({
            "n": null, "t": true, "f": false, "i": -17, "u": 18_446_744_073_709_551_615u64,
            "x": 1.28, "y": 5.0, "z": 1e21, "w": 0.1, "s": "a\"b", "arr": [1, "2", [], {}],
            "nested": {"k": {"k": [null]}},
        });
        let (fast, slow) = both(&value);
        assert_eq!(fast, slow);
        let event = Event::Thing {
            a: Some(3),
            b: Some(f64::NAN),
            c: vec![],
            d: [("k\n".to_string(), value)].into_iter().collect(),
            e: Unit::Only,
            f: (255, false),
            g: [(7, 'q')].into_iter().collect(),
        };
        let (fast, slow) = both(&event);
        assert_eq!(fast, slow);
        for shape in [
            Shapes::New(1),
            Shapes::Tuple(2, 3),
            Shapes::Struct { x: 0.5 },
        ] {
            let (fast, slow) = both(&shape);
            assert_eq!(fast, slow);
        }
        let (fast, slow) = both(&b"bytes"[..]);
        assert_eq!(fast, slow);
    }

    #[test]
    fn every_fixture_event_is_written_as_serde_json_writes_it() {
        let mut written = 0;
        for (path, event) in crate::replay::fixture_events() {
            let mut fast = Vec::new();
            if to_vec(&event, &mut fast).is_ok() {
                let slow = serde_json::to_vec(&event).expect("serde_json");
                assert_eq!(
                    String::from_utf8_lossy(&fast),
                    String::from_utf8_lossy(&slow),
                    "{path}"
                );
                written += 1;
            }
        }
        assert!(written > 100, "only {written} fixture events");
    }

    #[test]
    fn every_fixture_event_is_rendered_as_serde_json_writes_it() {
        let mut counts = [0usize; 3];
        for (path, event) in crate::replay::fixture_events() {
            let mut fast = Vec::new();
            if event_to_vec(&event, &mut fast).is_ok() {
                let slow = serde_json::to_vec(&event).expect("serde_json");
                assert_eq!(
                    String::from_utf8_lossy(&fast),
                    String::from_utf8_lossy(&slow),
                    "{path}"
                );
                match event {
                    Event::Exchange(_) => counts[0] += 1,
                    Event::Handshake(_) => counts[1] += 1,
                    Event::SessionEnd(_) => counts[2] += 1,
                    Event::Alert(_) => {}
                }
            }
        }
        assert!(
            counts.iter().all(|n| *n > 15),
            "fixture exchanges, handshakes, session ends: {counts:?}"
        );
    }

    fn exchange_strategy() -> impl proptest::strategy::Strategy<Value = Exchange> {
        use mcptap_core::model::{Era, FramingMode, InputRequired, Timestamp};
        use proptest::prelude::*;
        let text = "\\PC{0,12}|[\\x00-\\x7f]{0,20}";
        let addr = prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
            (any::<[u16; 8]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
        ];
        let id = prop_oneof![
            Just(serde_json::Value::Null),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            text.prop_map(serde_json::Value::from),
        ];
        let strings = (
            proptest::option::of(text),
            text,
            proptest::option::of(text),
            proptest::option::of(text),
            proptest::option::of(text),
        );
        let numbers = (
            any::<i64>(),
            any::<u16>(),
            any::<u32>(),
            prop_oneof![
                any::<f64>(),
                (0u32..100_000).prop_map(|n| f64::from(n) / 100.0)
            ],
            proptest::option::of(any::<i64>()),
        );
        let flags = (
            any::<bool>(),
            proptest::option::of(any::<bool>()),
            any::<bool>(),
            0..3usize,
            0..4usize,
            any::<bool>(),
            proptest::option::of((
                proptest::collection::vec(text, 0..3),
                proptest::option::of(any::<bool>()),
            )),
        );
        (addr.clone(), addr, id, strings, numbers, flags).prop_map(
            |(server, client, request_id, strings, numbers, flags)| {
                let (session_id, method, tool, protocol_version, lineage_id) = strings;
                let (ts, http_status, sse_events, duration_ms, error_code) = numbers;
                let (answered, empty_content, ambiguous, era, media, lenient, input) = flags;
                Exchange {
                    v: Default::default(),
                    ts: Timestamp(ts),
                    session_id,
                    server,
                    client,
                    method,
                    request_id,
                    tool,
                    protocol_version,
                    http_status,
                    media_type: ["json", "sse", "other", "none"][media],
                    sse_events,
                    duration_ms,
                    answered,
                    error_code,
                    empty_content,
                    cancelled: lenient && answered,
                    framing: FramingMode::of(lenient),
                    ambiguous,
                    era: Era::ALL[era],
                    lineage_id,
                    direction: if ambiguous {
                        Direction::ServerToClient
                    } else {
                        Direction::ClientToServer
                    },
                    input_required: input
                        .map(|(requests, retried)| InputRequired { requests, retried }),
                }
            },
        )
    }

    fn handshake_strategy() -> impl proptest::strategy::Strategy<Value = Handshake> {
        use mcptap_core::model::{
            Era, HandshakeDiff, HandshakeSource, Outcome, PathDiff, SharedJson,
        };
        use proptest::prelude::*;
        let text = "\\PC{0,12}|[\\x00-\\x7f]{0,20}";
        let opt = || proptest::option::of(text);
        let json = prop_oneof![
            Just(SharedJson::default()),
            text.prop_map(|t| SharedJson::new(serde_json::json!({ "name": t, "n": [1, 2.5] }))),
        ];
        let diff = proptest::option::of(
            (
                proptest::collection::vec(text, 0..3),
                proptest::collection::vec(text, 0..3),
            )
                .prop_map(|(removed, added)| HandshakeDiff {
                    client: PathDiff { removed, added },
                    server: PathDiff::default(),
                }),
        );
        let strings = (opt(), opt(), opt(), text, opt(), opt(), opt(), opt(), opt());
        let jsons = (json.clone(), json.clone(), json.clone(), json);
        let rest = (
            any::<i64>(),
            any::<u32>(),
            any::<u16>(),
            proptest::option::of(any::<i64>()),
            any::<bool>(),
            0..3usize,
            0..3usize,
            proptest::option::of(proptest::collection::vec(text, 0..3)),
            (diff.clone(), diff),
        );
        let addrs = (any::<[u8; 4]>(), any::<[u16; 8]>(), any::<u16>());
        (strings, jsons, rest, addrs).prop_map(|(strings, jsons, rest, addrs)| {
            let (
                session_id,
                error_message,
                host,
                path,
                requested,
                version,
                predecessor,
                lineage_id,
                method,
            ) = strings;
            let (client_info, server_info, client_capabilities, server_capabilities) = jsons;
            let (ts, seq, http_status, error_code, near_miss, era, source, supported, diffs) = rest;
            let (v4, v6, port) = addrs;
            Handshake {
                v: Default::default(),
                ts: Timestamp(ts),
                session_id,
                seq,
                outcome: if near_miss {
                    Outcome::Accepted
                } else {
                    Outcome::Rejected
                },
                http_status,
                error_code,
                error_message,
                client: SocketAddr::from((v4, port)),
                server: SocketAddr::from((v6, port)),
                host,
                path,
                protocol_version_requested: requested,
                protocol_version: version,
                client_info,
                server_info,
                client_capabilities,
                server_capabilities,
                diff: diffs.0,
                client_near_miss: near_miss,
                predecessor_session_id: predecessor,
                lineage: diffs.1,
                era: Era::ALL[era],
                source: HandshakeSource::ALL[source % HandshakeSource::ALL.len()],
                lineage_id,
                method,
                supported_versions: supported,
            }
        })
    }

    fn same_as_serde_json(
        event: &Event,
    ) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
        let mut fast = Vec::new();
        event_to_vec(event, &mut fast).expect("supported");
        let slow = serde_json::to_vec(event).expect("serde_json");
        proptest::prop_assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&slow)
        );
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn any_handshake_is_written_as_serde_json_writes_it(h in handshake_strategy()) {
            same_as_serde_json(&Event::Handshake(Box::new(h)))?;
        }

        #[test]
        fn any_session_end_is_written_as_serde_json_writes_it(
            ts in proptest::prelude::any::<i64>(),
            session_id in proptest::option::of("\\PC{0,12}"),
            v6 in proptest::prelude::any::<bool>(),
            counts in proptest::prelude::any::<(u32, u64, u32)>(),
            reason in 0..4usize,
            lineage_id in proptest::option::of("[\\x00-\\x7f]{0,20}"),
        ) {
            use mcptap_core::model::EndReason;
            let server = if v6 {
                SocketAddr::from(([0xfe80, 0, 0, 0, 0, 0, 0, 1], 8080))
            } else {
                SocketAddr::from(([10, 0, 0, 1], 443))
            };
            let reason = [EndReason::Deleted, EndReason::Expired, EndReason::Idle, EndReason::Evicted][reason];
            same_as_serde_json(&Event::SessionEnd(SessionEnd {
                v: Default::default(),
                ts: Timestamp(ts),
                session_id,
                server,
                reason,
                handshakes: counts.0,
                requests: counts.1,
                alerts: counts.2,
                lineage_id,
            }))?;
        }
    }

    proptest::proptest! {
        #[test]
        fn any_exchange_is_written_as_serde_json_writes_it(e in exchange_strategy()) {
            let event = Event::Exchange(Box::new(e));
            let mut fast = Vec::new();
            event_to_vec(&event, &mut fast).expect("supported");
            let slow = serde_json::to_vec(&event).expect("serde_json");
            proptest::prop_assert_eq!(
                String::from_utf8_lossy(&fast),
                String::from_utf8_lossy(&slow)
            );
        }
    }

    #[test]
    fn raw_values_are_copied_as_serde_json_copies_them() {
        let raw = serde_json::value::RawValue::from_string("{ \"a\" : [1, \"\\n\"] }".into())
            .expect("raw");
        let (fast, slow) = both(&raw);
        assert_eq!(fast, slow);
        let (fast, slow) = both(&json!({"inner": raw, "after": 1}));
        assert_eq!(fast, slow);
    }

    #[test]
    fn what_is_not_handled_is_an_error_for_the_caller_to_fall_back_on() {
        // A struct under the raw value's token whose field is not text.
        struct NotText;
        impl Serialize for NotText {
            fn serialize<S: ser::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                use ser::SerializeStruct;
                let mut st = s.serialize_struct(RAW_VALUE_TOKEN, 1)?;
                st.serialize_field(RAW_VALUE_TOKEN, &7u8)?;
                st.end()
            }
        }
        assert!(to_vec(&NotText, &mut Vec::new()).is_err());
        let float_keys: std::collections::BTreeMap<String, ()> = Default::default();
        assert!(to_vec(&float_keys, &mut Vec::new()).is_ok());
        let mut keyed_by_unit = std::collections::HashMap::new();
        keyed_by_unit.insert((), 1);
        assert!(to_vec(&keyed_by_unit, &mut Vec::new()).is_err());
    }
}
