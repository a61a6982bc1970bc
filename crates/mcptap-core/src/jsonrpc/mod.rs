//! JSON-RPC 2.0 messages as MCP uses them: single messages and batches.
//!
//! Parsing is zero-copy: `skim` splits a message into its raw members, stepping over large
//! values (tool results) without decoding them; only the small members MCP reads (`jsonrpc`,
//! `id`, `method`, `error`, the handshake's capabilities) are parsed by serde_json, and only the
//! few places that need more (the `initialize` handshake, a tool name) parse further. Tool
//! results are never validated or turned into a `Value` tree: a monitor needs to know where
//! they end and whether they are empty.

mod skim;
mod valid;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A request id, kept as its JSON text so `1` and `"1"` stay distinct.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub String);

impl Id {
    /// Strings are re-encoded so that equal strings with different escapes are one id.
    /// `text` is valid JSON.
    fn from_raw(text: &str) -> Option<Id> {
        let text = text.trim();
        if plain_string(text).is_some() {
            // Re-encoding a string without escapes or control characters gives it back.
            return Some(Id(text.to_string()));
        }
        match text.as_bytes().first()? {
            b'"' => serde_json::from_str::<Cow<'_, str>>(text)
                .ok()
                .and_then(|s| serde_json::to_string(&s).ok())
                .map(Id),
            b'-' | b'0'..=b'9' => Some(Id(text.to_string())),
            _ => None,
        }
    }

    /// The id as a JSON value again, for output.
    pub fn to_value(&self) -> Value {
        // The ids clients send, without serde_json's reader: once per answered request.
        let text = self.0.as_str();
        if let Some(inner) = plain_string(text) {
            return Value::String(inner.to_owned());
        }
        if plain_integer(text) {
            // As serde_json reads them: u64 when not negative, i64 when negative; `-0` and
            // what does not fit become floats there, so they go to it.
            if text.starts_with('-') {
                if let Ok(n) = text.parse::<i64>()
                    && n != 0
                {
                    return Value::from(n);
                }
            } else if let Ok(n) = text.parse::<u64>() {
                return Value::from(n);
            }
        }
        serde_json::from_str(text).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Clone)]
pub enum Message<'a> {
    Request {
        id: Id,
        method: Cow<'a, str>,
        params: Option<Params<'a>>,
    },
    Notification {
        method: Cow<'a, str>,
        params: Option<Params<'a>>,
    },
    Result {
        id: Id,
        result: ResultFields<'a>,
    },
    Error {
        id: Option<Id>,
        code: i64,
        message: String,
    },
}

impl Message<'_> {
    /// True for server-to-client traffic that is not the answer itself (progress, logs,
    /// sampling requests): what "auto" mode servers stream before a result.
    pub fn is_request_or_notification(&self) -> bool {
        matches!(self, Message::Request { .. } | Message::Notification { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    InvalidJson,
    NotJsonRpc,
}

impl ParseError {
    pub fn as_str(self) -> &'static str {
        crate::model::JsonRpcError::from(self).as_str()
    }
}

impl From<ParseError> for crate::model::JsonRpcError {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::InvalidJson => crate::model::JsonRpcError::InvalidJson,
            ParseError::NotJsonRpc => crate::model::JsonRpcError::NotJsonRpc,
        }
    }
}

/// JSON text known to be valid (checked by serde_json or by the validating pass), borrowed
/// from a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Json<'a>(&'a str);

impl<'a> Json<'a> {
    /// `text` if it is one JSON value with no whitespace around it.
    fn checked(text: &'a str) -> Result<Self, ParseError> {
        if valid::whole_value(text) {
            return Ok(Json(text));
        }
        // serde_json says why not (or, should the pass above refuse valid JSON, accepts it).
        serde_json::from_str::<&RawValue>(text)
            .map(|raw| Json(raw.get()))
            .map_err(|e| parse_error(&e))
    }

    /// The JSON text.
    pub fn get(self) -> &'a str {
        self.0
    }
}

/// A request's `params`: valid JSON text, and its top-level members when it is an object read
/// by the pass that validated it.
#[derive(Debug, Clone)]
pub struct Params<'a> {
    text: &'a str,
    members: Option<Vec<(&'a str, &'a str)>>,
    /// The deepest nesting of objects and arrays, when the validating pass read it.
    deepest: Option<usize>,
}

impl<'a> Params<'a> {
    /// Params serde_json has validated (no members read).
    fn checked(raw: &'a RawValue) -> Self {
        Params {
            text: raw.get(),
            members: None,
            deepest: None,
        }
    }

    /// `text` read both ways a message's params are: with its members found while validating
    /// (for a valid object) and validated by serde_json alone.
    #[cfg(test)]
    pub(crate) fn both_ways(text: &'a str) -> Vec<Params<'a>> {
        let mut ways = Vec::new();
        if let Some(valid) = valid::leading_container(text).filter(|v| v.len == text.len()) {
            ways.push(Params {
                text,
                members: valid.members,
                deepest: Some(valid.deepest),
            });
        }
        if let Ok(raw) = serde_json::from_str::<&RawValue>(text) {
            ways.push(Params::checked(raw));
        }
        ways
    }

    /// The JSON text.
    pub fn get(&self) -> &'a str {
        self.text
    }

    /// The deepest nesting of objects and arrays in it, when the pass that validated it
    /// measured that.
    pub fn deepest(&self) -> Option<usize> {
        self.deepest
    }

    /// The members of an object, as (raw key with its quotes, raw value), when they were read
    /// while validating (`None` says nothing about the type).
    pub fn members(&self) -> Option<&[(&'a str, &'a str)]> {
        self.members.as_deref()
    }

    /// The raw values of the members named `names`, read as serde_json reads a struct of
    /// optional fields: unknown members are ignored, `null` is absent, and a name given twice
    /// fails the struct. `None` when the members were not read: serde_json must read the text.
    pub fn fields<const N: usize>(
        &self,
        names: [&str; N],
    ) -> Option<Result<[Option<&'a str>; N], RepeatedField>> {
        Some(pick_fields(self.members()?, names))
    }
}

/// [`Params::fields`] of the object `text` starts with, validated and its members listed in
/// one pass. `None` if it is not a valid object of at most [`MAX_MEMBERS`] members
/// (serde_json must read it).
pub fn object_fields<'a, const N: usize>(
    text: &'a str,
    names: [&str; N],
) -> Option<Result<[Option<&'a str>; N], RepeatedField>> {
    let object = valid::leading_container(text).filter(|c| c.len == text.len())?;
    Some(pick_fields(&object.members?, names))
}

fn pick_fields<'a, const N: usize>(
    members: &[(&'a str, &'a str)],
    names: [&str; N],
) -> Result<[Option<&'a str>; N], RepeatedField> {
    let mut found: [Option<&'a str>; N] = [None; N];
    let mut seen = [false; N];
    for (key, value) in members {
        // Keys were validated: decoding cannot fail.
        let Some(key) = key_text(key) else {
            return Err(RepeatedField);
        };
        let Some(at) = names.iter().position(|n| *n == key) else {
            continue;
        };
        if std::mem::replace(&mut seen[at], true) {
            return Err(RepeatedField);
        }
        found[at] = (*value != "null").then_some(*value);
    }
    Ok(found)
}

/// A struct's field given twice, which serde_json refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedField;

/// The fields of a JSON-RPC object, borrowed from the input.
#[derive(Debug, Default)]
struct Envelope<'a> {
    jsonrpc: Option<Cow<'a, str>>,
    /// Valid JSON text.
    id: Option<&'a str>,
    method: Option<Cow<'a, str>>,
    params: Option<Params<'a>>,
    result: Option<ResultFields<'a>>,
    error: Option<ErrorObject<'a>>,
}

/// A string member, borrowed unless it has escapes.
#[derive(Deserialize)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

/// The content of a JSON string written without escapes or control characters, which is the
/// string itself: serde would borrow it unchanged. `None` for anything else (serde decides).
fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    let plain = inner.bytes().all(|b| b >= 0x20 && b != b'\\' && b != b'"');
    plain.then_some(inner)
}

/// Whether `raw` is a JSON integer as clients write ids: `-?(0|[1-9][0-9]*)`, which needs no
/// further validation.
fn plain_integer(raw: &str) -> bool {
    let digits = raw.strip_prefix('-').unwrap_or(raw).as_bytes();
    match digits {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// A member's key without its quotes, decoded only if it has escapes. Inlined: called for
/// every member, and the call cost more than the plain key's check.
#[inline(always)]
fn key_text(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    // A plain loop: keys are a few bytes, shorter than a memchr call is worth.
    if inner.bytes().any(|b| b == b'\\') {
        serde_json::from_str::<Str<'_>>(raw).ok().map(|k| k.0)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

fn parse_error(e: &serde_json::Error) -> ParseError {
    if e.is_data() {
        ParseError::NotJsonRpc
    } else {
        ParseError::InvalidJson
    }
}

impl<'a> Envelope<'a> {
    /// The envelope of one message; of duplicate members the first counts. `IN_PASS`: whether `params` and `result` are read in the pass that
    /// steps over them (false only in a test that holds both ways to the same answer);
    /// `read_params`: [`leading_container`] or a cache of its answers.
    fn parse_reading<const IN_PASS: bool>(
        text: &'a str,
        read_params: &mut dyn FnMut(&'a str, Option<&str>) -> Option<Container<'a>>,
    ) -> Result<Envelope<'a>, ParseError> {
        let mut reader = EnvelopeReader::<'a, '_, IN_PASS> {
            env: Envelope::default(),
            checked_params: None,
            read_result: None,
            error: None,
            read_params,
        };
        if skim::visit_object(text, &mut reader).is_none() {
            // Not an object: valid JSON of another type is not JSON-RPC.
            let json = !text.trim_start().starts_with('{')
                && serde_json::from_str::<IgnoredAny>(text).is_ok();
            return Err(if json {
                ParseError::NotJsonRpc
            } else {
                ParseError::InvalidJson
            });
        }
        match reader.error {
            Some(e) => Err(e),
            None => Ok(reader.env),
        }
    }
}

/// Reads an envelope's members as the skim steps over them (no list of them is made). A
/// member that cannot be read is the message's error, unless the object turns out malformed
/// further on (then that is); members after it are not read.
struct EnvelopeReader<'a, 'r, const IN_PASS: bool> {
    env: Envelope<'a>,
    read_params: &'r mut dyn FnMut(&'a str, Option<&str>) -> Option<Container<'a>>,
    // `params` is validated as serde_json would, in the pass that finds its end and its
    // members, so that it is walked once (not skimmed, then validated, then read). Only a
    // container: serde and the skim end a number or literal differently. Where that fails
    // the skim steps over it and serde's validation below reports the error as before.
    // Likewise a `result` object is read for its members in the pass that steps over it.
    checked_params: Option<Params<'a>>,
    read_result: Option<(ResultFields<'a>, &'a str)>,
    error: Option<ParseError>,
}

impl<'a, const IN_PASS: bool> skim::MemberVisitor<'a> for EnvelopeReader<'a, '_, IN_PASS> {
    fn measure(&mut self, key: &str, rest: &'a str) -> Option<usize> {
        match key {
            _ if !IN_PASS => None,
            "\"params\"" if self.checked_params.is_none() => {
                let valid = (self.read_params)(rest, self.env.method.as_deref())?;
                self.checked_params = Some(Params {
                    text: rest.get(..valid.len)?,
                    members: valid.members,
                    deepest: Some(valid.deepest),
                });
                Some(valid.len)
            }
            "\"result\"" if self.read_result.is_none() => {
                let (fields, len) = ResultFields::leading_object(rest)?;
                self.read_result = Some((fields, rest.get(..len)?));
                Some(len)
            }
            _ => None,
        }
    }

    fn member(&mut self, key: &'a str, raw: &'a str) {
        if self.error.is_none()
            && let Err(e) = self.read(key, raw)
        {
            self.error = Some(e);
        }
    }
}

impl<'a, const IN_PASS: bool> EnvelopeReader<'a, '_, IN_PASS> {
    /// One member, raw key with its quotes and raw value; of duplicate members the first
    /// counts.
    fn read(&mut self, key: &'a str, raw: &'a str) -> Result<(), ParseError> {
        let Some(key) = key_text(key) else {
            return Err(ParseError::InvalidJson);
        };
        let raw_member =
            |raw: &'a str| serde_json::from_str::<&'a RawValue>(raw).map_err(|e| parse_error(&e));
        // The members every message has are read without serde when they are plain (a serde
        // call costs hundreds of instructions; these are a few bytes).
        let str_member = |raw: &'a str| match plain_string(raw) {
            Some(text) => Ok(Cow::Borrowed(text)),
            None => serde_json::from_str::<Str<'a>>(raw)
                .map(|s| s.0)
                .map_err(|e| parse_error(&e)),
        };
        let id_member = |raw: &'a str| {
            if plain_integer(raw) || plain_string(raw).is_some() {
                Ok(raw)
            } else {
                raw_member(raw).map(RawValue::get)
            }
        };
        let env = &mut self.env;
        match key.as_ref() {
            "jsonrpc" if env.jsonrpc.is_none() => env.jsonrpc = Some(str_member(raw)?),
            "id" if env.id.is_none() => env.id = Some(id_member(raw)?),
            "method" if env.method.is_none() => env.method = Some(str_member(raw)?),
            "params" if env.params.is_none() => {
                env.params = Some(match self.checked_params.take() {
                    Some(checked) if std::ptr::eq(checked.text, raw) => checked,
                    _ => Params::checked(raw_member(raw)?),
                });
            }
            "result" if env.result.is_none() => {
                env.result = match self.read_result.take() {
                    Some((fields, text)) if std::ptr::eq(text, raw) => Some(fields),
                    _ => ResultFields::parse(raw)?,
                };
            }
            "error" if env.error.is_none() => {
                env.error = serde_json::from_str::<Option<ErrorObject<'a>>>(raw)
                    .map_err(|e| parse_error(&e))?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The members of a result that MCP monitoring reads, as raw JSON, picked out in the same pass
/// that finds the end of the message (a large tool result is scanned once, not again for each
/// question asked of it). Other members are skipped; of duplicate members the first counts.
#[derive(Debug, Clone, Default)]
pub struct ResultFields<'a> {
    /// False for a result that is not an object (MCP results always are).
    pub is_object: bool,
    /// Raw JSON text, never parsed: the bulk of a tool result.
    pub content: Option<&'a str>,
    /// Raw JSON text, never parsed.
    pub structured_content: Option<&'a str>,
    pub capabilities: Option<Json<'a>>,
    pub protocol_version: Option<Json<'a>>,
    pub server_info: Option<Json<'a>>,
    /// `server/discover`: `supportedVersions`.
    pub supported_versions: Option<Json<'a>>,
    /// `_meta` (a discover result's serverInfo lives there).
    pub meta: Option<Json<'a>>,
    /// An `InputRequiredResult`'s `inputRequests` (MRTR).
    pub input_requests: Option<Json<'a>>,
    /// `tools/list`: `tools`, raw JSON text, parsed only when it names `x-mcp-header`.
    pub tools: Option<&'a str>,
}

impl ResultFields<'_> {
    /// A `tools/call` result with nothing in it: `content` empty (or absent) and no
    /// `structuredContent`.
    pub fn is_empty_tool_content(&self) -> bool {
        // `[]` with any whitespace inside, decided from the raw text.
        let content_empty = is_null_text(self.content)
            || self.content.is_some_and(|c| {
                c.trim()
                    .strip_prefix('[')
                    .is_some_and(|rest| rest.trim_start().starts_with(']'))
            });
        self.is_object && content_empty && is_null_text(self.structured_content)
    }

    /// The `initialize` members as a `Value` object (only these are ever kept whole).
    /// Nesting beyond serde_json's recursion limit is an error.
    pub fn initialize_value(&self) -> Result<Value, ParseError> {
        let mut object = serde_json::Map::new();
        for (key, raw) in [
            ("protocolVersion", self.protocol_version),
            ("capabilities", self.capabilities),
            ("serverInfo", self.server_info),
        ] {
            if let Some(raw) = raw {
                object.insert(key.to_string(), to_value(Some(raw))?);
            }
        }
        Ok(Value::Object(object))
    }
}

impl<'a> ResultFields<'a> {
    /// The members of a raw `result`; `None` for `null` (no result).
    fn parse(raw: &'a str) -> Result<Option<ResultFields<'a>>, ParseError> {
        let text = raw.trim();
        if text == "null" {
            return Ok(None);
        }
        if !text.starts_with('{') {
            return Ok(Some(ResultFields::default()));
        }
        let members = skim::object_members(text).ok_or(ParseError::InvalidJson)?;
        Self::of_members(members, &[]).map(Some)
    }

    /// The members of the object `text` starts with, and its length; `None` where [`Self::parse`]
    /// would fail.
    fn leading_object(text: &'a str) -> Option<(ResultFields<'a>, usize)> {
        // The members read as JSON are validated in the pass that steps over them, not
        // skimmed and then validated (plain keys; others are validated below as before).
        let mut validated: [&'a str; MAX_VALIDATED_IN_PASS] = [""; MAX_VALIDATED_IN_PASS];
        let mut count = 0;
        let (members, len) = skim::leading_object_members(text, |key, rest| {
            if !matches!(
                key,
                "\"capabilities\""
                    | "\"protocolVersion\""
                    | "\"serverInfo\""
                    | "\"supportedVersions\""
                    | "\"_meta\""
                    | "\"inputRequests\""
            ) {
                return None;
            }
            let slot = validated.get_mut(count)?;
            let len = valid::leading_value_len(rest)?;
            *slot = rest.get(..len)?;
            count += 1;
            Some(len)
        })?;
        let validated = validated.get(..count).unwrap_or_default();
        // A malformed literal holding a quote or an opening bracket (`x{`) ends where the
        // member grammar says, but the envelope's bracket count would not have ended the
        // object there: such text is left to the old path, which rejects it.
        let odd_literal = members.iter().any(|(_, value)| match value.as_bytes() {
            [b'"' | b'{' | b'[', ..] => false,
            literal => literal.iter().any(|b| matches!(b, b'"' | b'{' | b'[')),
        });
        if odd_literal {
            return None;
        }
        Some((Self::of_members(members, validated).ok()?, len))
    }

    /// `validated`: member values already known to be valid JSON.
    fn of_members(
        members: Vec<(&'a str, &'a str)>,
        validated: &[&'a str],
    ) -> Result<ResultFields<'a>, ParseError> {
        let mut r = ResultFields {
            is_object: true,
            ..ResultFields::default()
        };
        for (key, value) in members {
            let Some(key) = key_text(key) else {
                return Err(ParseError::InvalidJson);
            };
            let parsed = || {
                if validated.iter().any(|v| std::ptr::eq(*v, value)) {
                    Ok(Json(value))
                } else {
                    Json::checked(value)
                }
            };
            match key.as_ref() {
                "content" => {
                    r.content.get_or_insert(value);
                }
                "structuredContent" => {
                    r.structured_content.get_or_insert(value);
                }
                "capabilities" if r.capabilities.is_none() => r.capabilities = Some(parsed()?),
                "protocolVersion" if r.protocol_version.is_none() => {
                    r.protocol_version = Some(parsed()?)
                }
                "serverInfo" if r.server_info.is_none() => r.server_info = Some(parsed()?),
                "supportedVersions" if r.supported_versions.is_none() => {
                    r.supported_versions = Some(parsed()?)
                }
                "_meta" if r.meta.is_none() => r.meta = Some(parsed()?),
                "inputRequests" if r.input_requests.is_none() => r.input_requests = Some(parsed()?),
                "tools" => {
                    r.tools.get_or_insert(value);
                }
                _ => {}
            }
        }
        Ok(r)
    }
}

/// Most result members validated while skimming (the six names, a few repeated).
const MAX_VALIDATED_IN_PASS: usize = 8;

#[derive(Debug, Deserialize)]
struct ErrorObject<'a> {
    #[serde(default)]
    code: Option<i64>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

/// Parses a body or SSE `data` payload: one message or a batch. Elements of a batch that are
/// not JSON-RPC are skipped; the whole payload is an error only if nothing in it is.
pub fn parse(bytes: &[u8]) -> Result<Vec<Message<'_>>, ParseError> {
    parse_with(bytes, &mut |rest, _| leading_container(rest))
}

/// [`parse`], with a request's `params` read by `read_params` (given the text from the params
/// on and the method, when the message named it before them): [`leading_container`], or a
/// cache of its answers (a fleet's clients send the same params thousands of times). Where it
/// answers, it must answer as [`leading_container`] does.
pub fn parse_with<'a>(
    bytes: &'a [u8],
    read_params: &mut dyn FnMut(&'a str, Option<&str>) -> Option<Container<'a>>,
) -> Result<Vec<Message<'a>>, ParseError> {
    // simdutf8: the whole body is validated here, the one pass over it besides the skim.
    let text = simdutf8::basic::from_utf8(bytes).map_err(|_| ParseError::InvalidJson)?;
    parse_str_with(text, read_params)
}

/// [`parse`] for text already known to be UTF-8 (an SSE event's data), skipping a second
/// validation pass.
pub fn parse_str(text: &str) -> Result<Vec<Message<'_>>, ParseError> {
    parse_str_with(text, &mut |rest, _| leading_container(rest))
}

fn parse_str_with<'a>(
    text: &'a str,
    read_params: &mut dyn FnMut(&'a str, Option<&str>) -> Option<Container<'a>>,
) -> Result<Vec<Message<'a>>, ParseError> {
    if text.trim_start().starts_with('[') {
        let items = skim::array_elements(text).ok_or(ParseError::InvalidJson)?;
        let msgs: Vec<Message<'_>> = items
            .into_iter()
            .filter_map(|raw| Envelope::parse_reading::<true>(raw, read_params).ok())
            .filter_map(classify)
            .collect();
        return if msgs.is_empty() {
            Err(ParseError::NotJsonRpc)
        } else {
            Ok(msgs)
        };
    }
    classify(Envelope::parse_reading::<true>(text, read_params)?)
        .map(|m| vec![m])
        .ok_or(ParseError::NotJsonRpc)
}

pub use valid::{Container, MAX_MEMBERS};

/// The object or array `text` starts with, if it is valid JSON up to its closing bracket, with
/// an object's top-level members (see [`Container`]).
pub fn leading_container(text: &str) -> Option<Container<'_>> {
    valid::leading_container(text)
}

fn is_null_text(raw: Option<&str>) -> bool {
    raw.is_none_or(|r| r.trim() == "null")
}

fn classify(env: Envelope<'_>) -> Option<Message<'_>> {
    if env.jsonrpc.as_deref() != Some("2.0") {
        return None;
    }
    let id = env.id.and_then(Id::from_raw);
    if let Some(method) = env.method {
        return Some(match id {
            Some(id) => Message::Request {
                id,
                method,
                params: env.params,
            },
            None => Message::Notification {
                method,
                params: env.params,
            },
        });
    }
    if let Some(err) = env.error {
        return Some(Message::Error {
            id,
            code: err.code.unwrap_or(0),
            message: err.message.map(Cow::into_owned).unwrap_or_default(),
        });
    }
    // `"result": null` is absent (serde maps JSON null to `None`).
    Some(Message::Result {
        id: id?,
        result: env.result?,
    })
}

/// Raw JSON to a `Value`, for the rare places that keep a whole object (capabilities).
/// Absent is `Null`; nesting beyond serde_json's recursion limit is an error.
pub fn to_value(raw: Option<Json<'_>>) -> Result<Value, ParseError> {
    match raw {
        None => Ok(Value::Null),
        Some(r) => serde_json::from_str(r.get()).map_err(|_| ParseError::InvalidJson),
    }
}

/// The deepest array/object nesting of a JSON text (strings skipped, escapes honoured).
pub(crate) fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `params.name` of a `tools/call`.
pub fn tool_name(params: Option<&Params<'_>>) -> Option<String> {
    let params = params?;
    let text = params.get();
    if let Some(members) = params.members() {
        return named_member(members);
    }
    // `params` is valid JSON (serde checked it as a raw value): the skimmer finds `name`
    // without decoding the arguments beside it, which serde would walk byte by byte.
    let Some(members) = skim::object_members(text) else {
        return named_by_serde(text);
    };
    named_member(&members)
}

/// Whether a request's params ask for progress notifications: `_meta.progressToken` (a string
/// or a number) present and not null.
pub fn progress_requested(params: Option<&Params<'_>>) -> bool {
    let Some(params) = params else {
        return false;
    };
    let text = params.get();
    // Most requests name no token: one scan for the word settles them without reading members
    // (a modern request's `_meta` holds its whole capability declaration).
    if !names_progress_token(text.as_bytes()) {
        return false;
    }
    let meta = match params.fields(["_meta"]) {
        Some(fields) => fields,
        None => match object_fields(text, ["_meta"]) {
            Some(fields) => fields,
            None => return false,
        },
    };
    let Ok([Some(meta)]) = meta else {
        return false;
    };
    matches!(object_fields(meta, ["progressToken"]), Some(Ok([Some(_)])))
}

/// Whether `text` holds the word `progressToken`: found by its one capital (rare in JSON), as a
/// searcher built per call costs more than the scan on a request's few hundred bytes.
fn names_progress_token(text: &[u8]) -> bool {
    const WORD: &[u8] = b"progressToken";
    const CAPITAL_AT: usize = 8;
    memchr::memchr_iter(b'T', text).any(|at| {
        at.checked_sub(CAPITAL_AT)
            .and_then(|start| text.get(start..start + WORD.len()))
            == Some(WORD)
    })
}

/// The `requestId` a `notifications/cancelled` names (a string or a number), if its params
/// are an object with one.
pub fn cancelled_request_id(params: Option<&Params<'_>>) -> Option<Id> {
    let params = params?;
    let fields = match params.fields(["requestId"]) {
        Some(fields) => fields,
        None => object_fields(params.get(), ["requestId"])?,
    };
    let [Some(raw)] = fields.ok()? else {
        return None;
    };
    Id::from_raw(raw)
}

/// [`tool_name`] of an object's members.
fn named_member(members: &[(&str, &str)]) -> Option<String> {
    let mut names = members
        .iter()
        .filter(|(key, _)| key_text(key).as_deref() == Some("name"));
    let (_, value) = names.next()?;
    if names.next().is_some() {
        return None; // as serde: a duplicate field is an error
    }
    key_text(value).map(Cow::into_owned)
}

/// [`tool_name`] of params that are not an object (serde reads a struct from an array too).
fn named_by_serde(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Named<'a> {
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
    }
    let named: Named<'_> = serde_json::from_str(text).ok()?;
    named.name.map(Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64: the generated-text tests' choices, the same on every run.
    pub(super) struct Rng(pub(super) u64);

    impl Rng {
        pub(super) fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }

        pub(super) fn pick<'s>(&mut self, from: &[&'s str]) -> &'s str {
            from[self.below(from.len())]
        }
    }

    #[test]
    fn nesting_depth_skips_strings_and_escapes() {
        assert_eq!(nesting_depth(br#"{}"#), 1);
        assert_eq!(nesting_depth(br#"{"a":[{"b":[]}]}"#), 4);
        assert_eq!(nesting_depth(br#"{"a":"[[[{{{","b":"\"[[["}"#), 1);
        assert_eq!(nesting_depth(b"1"), 0);
    }

    #[test]
    fn tool_names_read_by_the_skimmer_are_serdes() {
        let cases = [
            (
                r#"{"name":"search","arguments":{"q":"a \" } ["}}"#,
                Some("search"),
            ),
            (
                r#"{"arguments":{"name":"inner"},"name":"outer"}"#,
                Some("outer"),
            ),
            (r#" { "name" : "x\u00e9\n" } "#, Some("x\u{e9}\n")),
            (r#"{"na\u006de":"escaped key"}"#, Some("escaped key")),
            (r#"{"name":"a","name":"b"}"#, None),
            (r#"{"name":7}"#, None),
            (r#"{"name":null}"#, None),
            (r#"{"arguments":{}}"#, None),
            (r#"{}"#, None),
            (r#"["from an array"]"#, Some("from an array")),
            (r#""text""#, None),
        ];
        for (params, expected) in cases {
            let raw = raw(params);
            let checked = Params::checked(&raw);
            assert_eq!(tool_name(Some(&checked)).as_deref(), expected, "{params}");
            // Read from the members the validating pass found, as the envelope does.
            let message = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{params}}}"#);
            let parsed = parse_str(&message).expect("request");
            let Some(Message::Request { params: read, .. }) = parsed.first() else {
                panic!("{parsed:?}")
            };
            assert_eq!(
                read.as_ref().and_then(Params::members).is_some(),
                params.trim_start().starts_with('{'),
                "{params}"
            );
            assert_eq!(tool_name(read.as_ref()).as_deref(), expected, "{params}");
            assert_eq!(
                named_by_serde(params).as_deref(),
                expected,
                "serde on {params}"
            );
        }
        assert_eq!(tool_name(None), None);
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).expect("raw")
    }

    #[test]
    fn progress_is_asked_for_by_a_token_in_meta() {
        let asks = |params: &str| {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#);
            match parse(body.as_bytes()).ok().and_then(|mut m| m.pop()) {
                Some(Message::Request { params, .. }) => progress_requested(params.as_ref()),
                other => panic!("{other:?}"),
            }
        };
        assert!(asks(r#"{"name":"t","_meta":{"progressToken":"p-1"}}"#));
        assert!(asks(r#"{"_meta":{"a":1,"progressToken":7},"name":"t"}"#));
        assert!(!asks(r#"{"name":"t"}"#));
        assert!(!asks(r#"{"name":"t","_meta":{"progressToken":null}}"#));
        assert!(!asks(r#"{"name":"t","_meta":{}}"#));
        // The word elsewhere is no token.
        assert!(!asks(r#"{"name":"t","arguments":{"progressToken":1}}"#));
        assert!(!asks(r#"{"name":"progressToken"}"#));
        assert!(!asks(r#"["progressToken"]"#));
        assert!(!progress_requested(None));
        for text in ["progressToken", "xprogressTokenx", "TT progressToken T"] {
            assert!(names_progress_token(text.as_bytes()), "{text}");
        }
        for text in [
            "",
            "T",
            "progressTok",
            "rogressToken",
            "progress Token",
            "Tokenprogress",
        ] {
            assert!(!names_progress_token(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn a_cancellation_names_its_request() {
        let id_of = |body: &[u8]| match parse(body).ok()?.pop()? {
            Message::Notification { params, .. } => cancelled_request_id(params.as_ref()),
            _ => None,
        };
        let cancel = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"x"}}}}"#
            )
        };
        assert_eq!(id_of(cancel("2").as_bytes()), Some(Id("2".into())));
        assert_eq!(
            id_of(cancel(r#""a-1""#).as_bytes()),
            Some(Id(r#""a-1""#.into()))
        );
        // The same string however it is escaped, as request ids are read.
        assert_eq!(
            id_of(cancel(r#""\u0061""#).as_bytes()),
            Some(Id(r#""a""#.into()))
        );
        for odd in ["null", "true", "{}", "[1]"] {
            assert_eq!(id_of(cancel(odd).as_bytes()), None, "{odd}");
        }
        let no_id =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"x"}}"#;
        assert_eq!(id_of(no_id), None);
        let twice = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"requestId":2}}"#;
        assert_eq!(id_of(twice), None);
        assert_eq!(
            id_of(br#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#),
            None
        );
    }

    #[test]
    fn single_messages() {
        let m = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#)
            .unwrap();
        let Message::Request { id, method, params } = &m[0] else {
            panic!("{m:?}")
        };
        assert_eq!((id.0.as_str(), method.as_ref()), ("1", "tools/call"));
        assert_eq!(tool_name(params.as_ref()).as_deref(), Some("x"));
        let m = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(
            matches!(&m[0], Message::Notification { method, .. } if method == "notifications/initialized")
        );
        let m = parse(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#).unwrap();
        assert!(matches!(&m[0], Message::Result { id, .. } if id.0 == "\"a\""));
        let m = parse(
            br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32600,"message":"Invalid Request"}}"#,
        )
        .unwrap();
        assert!(matches!(
            &m[0],
            Message::Error { id: Some(Id(id)), code: -32600, message } if id == "2" && message == "Invalid Request"
        ));
    }

    #[test]
    fn escaped_method_names_and_ids_are_decoded() {
        let m = parse(br#"{"jsonrpc":"2.0","id":"\u0061","method":"tools\/call"}"#).unwrap();
        let Message::Request { id, method, .. } = &m[0] else {
            panic!("{m:?}")
        };
        assert_eq!(method, "tools/call");
        assert_eq!(id, &Id("\"a\"".into()));
    }

    #[test]
    fn batches_keep_order_and_skip_junk() {
        let m = parse(
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},7,{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":1,"result":{}}]"#,
        )
        .unwrap();
        assert_eq!(m.len(), 3);
        assert!(m[1].is_request_or_notification());
        assert_eq!(parse(b"[]").err(), Some(ParseError::NotJsonRpc));
    }

    #[test]
    fn errors() {
        assert_eq!(parse(b"{not json").err(), Some(ParseError::InvalidJson));
        assert_eq!(
            parse(br#"{"id":1,"method":"x"}"#).err(),
            Some(ParseError::NotJsonRpc)
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","result":{}}"#).err(),
            Some(ParseError::NotJsonRpc)
        );
        assert_eq!(parse(b"\xff\xfe").err(), Some(ParseError::InvalidJson));
        assert_eq!(parse(b"42").err(), Some(ParseError::NotJsonRpc));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        // Rejected without recursing 100,000 deep (serde_json ignores raw values iteratively).
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn ids_keep_their_type() {
        assert_ne!(Id::from_raw("1"), Id::from_raw("\"1\""));
        assert_eq!(Id::from_raw("null"), None);
        assert_eq!(Id("\"x\"".into()).to_value(), Value::from("x"));
        // Equal strings written with different escapes are one id.
        assert_eq!(Id::from_raw("\"a/b\""), Id::from_raw("\"a\\/b\""));
    }

    #[test]
    fn an_id_becomes_the_value_serde_json_reads_from_it() {
        let ids = [
            "0",
            "-0",
            "1",
            "-1",
            "42",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "1.5",
            "1e3",
            "-0.0",
            "\"\"",
            "\"abc-1\"",
            "\"a\\\"b\"",
            "\"\\u00e9\"",
            "\"é\"",
        ];
        for raw in ids {
            let id = Id::from_raw(raw).unwrap();
            let serde: Value = serde_json::from_str(&id.0).unwrap();
            assert_eq!(id.to_value(), serde, "{raw}");
            // Written back alike too (a negative zero stays a float).
            assert_eq!(
                serde_json::to_string(&id.to_value()).unwrap(),
                serde_json::to_string(&serde).unwrap(),
                "{raw}"
            );
        }
    }

    #[test]
    fn plain_members_are_read_as_serde_reads_them() {
        // Every short string over a few telling bytes: the fast paths agree with serde where
        // they answer, and leave the rest to it.
        let bytes: &[u8] = b"\"\\-0a1\x01 e.\x7f";
        let mut candidates = vec![String::new()];
        for _ in 0..5 {
            let next: Vec<String> = candidates
                .iter()
                .flat_map(|c| bytes.iter().map(move |&b| format!("{c}{}", b as char)))
                .collect();
            candidates.extend(next);
        }
        let (mut strings, mut integers) = (0, 0);
        for raw in &candidates {
            if let Some(text) = plain_string(raw) {
                strings += 1;
                assert_eq!(
                    serde_json::from_str::<String>(raw).ok().as_deref(),
                    Some(text),
                    "{raw:?}"
                );
                let id = Id::from_raw(raw).map(|id| id.0);
                let by_serde = serde_json::from_str::<String>(raw)
                    .ok()
                    .and_then(|s| serde_json::to_string(&s).ok());
                assert_eq!(id, by_serde, "{raw:?}");
            }
            if plain_integer(raw) {
                integers += 1;
                assert!(serde_json::from_str::<&RawValue>(raw).is_ok(), "{raw:?}");
                assert!(
                    serde_json::from_str::<serde_json::Number>(raw).is_ok(),
                    "{raw:?}"
                );
            } else if raw.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                // Leading zeros, a lone minus: serde refuses them or reads them otherwise.
                let number = serde_json::from_str::<serde_json::Number>(raw);
                assert!(number.is_err() || raw.is_empty(), "{raw:?}");
            }
        }
        assert!(strings > 100 && integers > 10, "{strings} {integers}");
        // Through the whole envelope, escaped and plain members read alike.
        let plain = parse_str(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#).unwrap();
        let escaped = parse_str(r#"{"jsonrpc":"2\u002e0","id":7,"method":"tools\/list"}"#).unwrap();
        assert_eq!(format!("{plain:?}"), format!("{escaped:?}"));
        // A control character in a member is refused as before.
        assert!(parse_str("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\u{1}\"}").is_err());
        assert!(parse_str(r#"{"jsonrpc":"2.0","id":01,"method":"a"}"#).is_err());
    }

    fn result(json: &str) -> ResultFields<'_> {
        let m = parse_str(json).unwrap();
        match m.into_iter().next() {
            Some(Message::Result { result, .. }) => result,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn empty_tool_content() {
        let empty = |r: &str| {
            let json = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{r}}}"#);
            result(&json).is_empty_tool_content()
        };
        assert!(empty(r#"{"content": []}"#));
        assert!(empty(r#"{"content": [ ], "isError": false}"#));
        assert!(empty(r#"{}"#));
        assert!(empty(r#"{"content": null}"#));
        assert!(!empty(r#"{"content": [], "structuredContent": {"a": 1}}"#));
        assert!(!empty(r#"{"content": [{"type": "text", "text": "x"}]}"#));
        assert!(!empty(
            r#"{"con\u0074ent": [{"type": "text", "text": "x"}]}"#
        ));
        assert!(!empty(r#"[1, {"content": []}]"#));
        assert!(!empty(r#""text""#));
        // Of duplicate members the first counts.
        assert!(!empty(r#"{"content": [{"type": "text"}], "content": []}"#));
    }

    #[test]
    fn null_result_is_no_result() {
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":1,"result":null}"#).err(),
            Some(ParseError::NotJsonRpc)
        );
    }

    #[test]
    fn initialize_members_become_a_value_other_members_are_skipped() {
        let r = result(
            r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","instructions":"long text","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"s","version":"1"}}}"#,
        );
        assert_eq!(
            r.initialize_value().unwrap(),
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "s", "version": "1"},
            })
        );
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":0,"result":{{"capabilities":{}1{}}}}}"#,
            "[".repeat(1000),
            "]".repeat(1000)
        );
        assert_eq!(
            result(&deep).initialize_value().err(),
            Some(ParseError::InvalidJson)
        );
    }

    /// `params` and `result` are read in the pass that steps over them; where that reading
    /// fails or a member repeats, the outcome is what reading them afterwards gives.
    #[test]
    fn members_read_in_the_stepping_pass_agree_with_reading_them_after() {
        let params_of = |text: &str| match parse(text.as_bytes()) {
            Ok(m) => match m.first() {
                Some(Message::Request { params, .. }) => {
                    Ok(params.as_ref().map(|p| p.get().to_string()))
                }
                _ => Err(None),
            },
            Err(e) => Err(Some(e)),
        };
        let request = |params: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m",{params}}}"#);
        let cases = [
            (
                r#""params":{"a":[1,{"b":"}]\"{"}],"c":null}"#,
                Ok(Some(r#"{"a":[1,{"b":"}]\"{"}],"c":null}"#)),
            ),
            (r#""params" : [1, 2] "#, Ok(Some("[1, 2]"))),
            (r#""params":{"a":tru}"#, Err(Some(ParseError::InvalidJson))),
            (r#""params":{"a":1}}"#, Err(Some(ParseError::InvalidJson))),
            (r#""params":{"a":"\q"}"#, Err(Some(ParseError::InvalidJson))),
            (
                r#""par\u0061ms":{"x":1},"params":{"y":2}"#,
                Ok(Some(r#"{"x":1}"#)),
            ),
            (
                r#""params":{"x":1},"params":{"y":"#,
                Err(Some(ParseError::InvalidJson)),
            ),
            (
                r#""params":{"x":1},"params":{"y":2}"#,
                Ok(Some(r#"{"x":1}"#)),
            ),
            (r#""params":5"#, Ok(Some("5"))),
        ];
        for (params, want) in cases {
            let want = want.map(|p| p.map(str::to_string));
            assert_eq!(params_of(&request(params)), want, "{params}");
        }
        let deep = format!(r#""params":{}{}"#, "[".repeat(500), "]".repeat(500));
        let deep_raw = serde_json::from_str::<&RawValue>(&deep["\"params\":".len()..]).is_ok();
        assert_eq!(params_of(&request(&deep)).is_ok(), deep_raw);

        // Results: the first member counts, a malformed one fails as before.
        let r = result(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false},"result":{"content":[1]}}"#,
        );
        assert!(r.is_empty_tool_content());
        let r = result(
            r#"{"jsonrpc":"2.0","id":1,"resul\u0074":{"content":[1]},"result":{"content":[]}}"#,
        );
        assert!(!r.is_empty_tool_content());
        for bad in [
            r#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"a":}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]} x}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content" []}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"\x":1}}"#,
            // Literals that a bracket count and the member grammar end differently.
            r#"{"jsonrpc":"2.0","id":1,"result":{"a":x{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"a":1"}"}}"#,
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\" :{\"result\":{\"serverInfo\":\"\",\"params\"::,\"par\\u0061ms\":\"\"},\"result\":nul{l\r\n,\"structuredContent\":\"\u{1}\"}}",
        ] {
            assert_eq!(
                parse(bad.as_bytes()).err(),
                Some(ParseError::InvalidJson),
                "{bad}"
            );
        }
        assert_eq!(
            parse(br#"{"jsonrpc":"1.0","id":1,"result":{"a":x{}}"#).err(),
            Some(ParseError::InvalidJson)
        );
    }

    /// Envelopes from a small grammar, some with bytes inserted, removed or replaced: read
    /// with `params` and `result` taken in the stepping pass, and without, they are the same.
    #[test]
    fn reading_in_the_stepping_pass_changes_nothing_on_generated_envelopes() {
        const KEYS: &[&str] = &[
            r#""jsonrpc""#,
            r#""id""#,
            r#""method""#,
            r#""params""#,
            r#""params""#,
            r#""result""#,
            r#""result""#,
            r#""error""#,
            r#""par\u0061ms""#,
            r#""resul\u0074""#,
            r#""\x""#,
            r#""content""#,
            r#""capabilities""#,
            r#""structuredContent""#,
            r#""protocolVersion""#,
            r#""serverInfo""#,
            r#""_meta""#,
            r#""supportedVersions""#,
            r#""inputRequests""#,
            r#""capabilit\u0069es""#,
            r#""tools""#,
            r#""name""#,
            r#""a""#,
        ];
        const LITERALS: &[&str] = &[
            "true", "false", "tru", "nul", "1e", "-", "01", "1.5", "-0", "5x", "x{", "1\"", "7",
        ];
        const STRING_PARTS: &[&str] = &[
            "a", "\\\"", "\\\\", "}", "]", "{", "[", "é", "\\n", "\\u0061", "\\q", "\u{1}", ",",
            ":",
        ];
        const WHITESPACE: &[&str] = &["", "", "", " ", "\n", "\t ", "\r\n"];
        fn value(r: &mut Rng, depth: usize, s: &mut String) {
            match r.below(if depth > 3 { 7 } else { 10 }) {
                0 => s.push_str("null"),
                1 | 2 => s.push_str(r.pick(LITERALS)),
                3..=5 => {
                    s.push('"');
                    for _ in 0..r.below(4) {
                        s.push_str(r.pick(STRING_PARTS));
                    }
                    s.push('"');
                }
                6 => s.push_str(r.pick(&["", "}", "]", "{", "[", ",", ":"])),
                7 => {
                    s.push('[');
                    for i in 0..r.below(4) {
                        if i > 0 {
                            s.push(',');
                        }
                        s.push_str(r.pick(WHITESPACE));
                        value(r, depth + 1, s);
                    }
                    s.push(']');
                }
                _ => object(r, depth + 1, s),
            }
        }
        fn object(r: &mut Rng, depth: usize, s: &mut String) {
            s.push('{');
            if depth == 0 && r.below(3) > 0 {
                s.push_str(r#""jsonrpc":"2.0","id":1,"#);
            }
            for i in 0..r.below(if depth == 0 { 6 } else { 4 }) {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(r.pick(WHITESPACE));
                s.push_str(r.pick(KEYS));
                s.push_str(r.pick(WHITESPACE));
                s.push(':');
                s.push_str(r.pick(WHITESPACE));
                value(r, depth, s);
            }
            s.push('}');
        }
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut read, mut failed) = (0, 0);
        for _ in 0..60_000 {
            let mut text = String::new();
            object(&mut r, 0, &mut text);
            if r.below(3) == 0 {
                let mut chars: Vec<char> = text.chars().collect();
                for _ in 0..=r.below(3) {
                    let at = r.below(chars.len());
                    let c = r.pick(&["{", "}", "[", "]", "\"", "\\", ",", ":", " ", "x"]);
                    let c = c.chars().next().unwrap_or(' ');
                    match r.below(3) {
                        0 => {
                            chars.remove(at);
                        }
                        1 => chars.insert(at, c),
                        _ => chars[at] = c,
                    }
                    if chars.is_empty() {
                        break;
                    }
                }
                text = chars.into_iter().collect();
            }
            let mut in_pass =
                Envelope::parse_reading::<true>(&text, &mut |rest, _| leading_container(rest));
            // Members found while validating are the skimmer's members of the same text; the
            // other way does not read them.
            if let Ok(Envelope {
                params: Some(params),
                ..
            }) = &mut in_pass
                && let Some(deepest) = params.deepest.take()
            {
                assert_eq!(deepest, nesting_depth(params.text.as_bytes()), "{text:?}");
            }
            if let Ok(Envelope {
                params: Some(params),
                ..
            }) = &mut in_pass
                && let Some(members) = params.members.take()
            {
                assert_eq!(Some(members), skim::object_members(params.text), "{text:?}");
            }
            let in_pass = format!("{in_pass:?}");
            let after = format!(
                "{:?}",
                Envelope::parse_reading::<false>(&text, &mut |rest, _| leading_container(rest))
            );
            assert_eq!(in_pass, after, "{text:?}");
            if in_pass.starts_with("Ok") {
                read += 1;
            } else {
                failed += 1;
            }
        }
        // Both outcomes are well represented.
        assert!(
            read > 10_000 && failed > 10_000,
            "{read} read, {failed} failed"
        );
    }
}
