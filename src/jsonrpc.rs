//! JSON-RPC 2.0 messages as MCP uses them: single messages and batches.
//!
//! Parsing is zero-copy: a message borrows its `params` and the result members MCP looks at as
//! raw JSON text from the body, and only the few places that need more (the `initialize`
//! handshake, a tool name) parse further. Tool results can be large: they are scanned exactly
//! once, in the pass that finds the end of the message, and never turned into a `Value` tree.

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A request id, kept as its JSON text so `1` and `"1"` stay distinct.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub String);

impl Id {
    /// Strings are re-encoded so that equal strings with different escapes are one id.
    fn from_raw(raw: &RawValue) -> Option<Id> {
        let text = raw.get().trim();
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
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Clone)]
pub enum Message<'a> {
    Request {
        id: Id,
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    Notification {
        method: Cow<'a, str>,
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
        match self {
            ParseError::InvalidJson => "invalid_json",
            ParseError::NotJsonRpc => "not_jsonrpc",
        }
    }
}

/// The fields of a JSON-RPC object, borrowed from the input.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<ResultFields<'a>>,
    #[serde(borrow, default)]
    error: Option<ErrorObject<'a>>,
}

/// The members of a result that MCP monitoring reads, as raw JSON, picked out in the same pass
/// that finds the end of the message (a large tool result is scanned once, not again for each
/// question asked of it). Other members are skipped; of duplicate members the first counts.
#[derive(Debug, Clone, Default)]
pub struct ResultFields<'a> {
    /// False for a result that is not an object (MCP results always are).
    pub is_object: bool,
    pub content: Option<&'a RawValue>,
    pub structured_content: Option<&'a RawValue>,
    pub capabilities: Option<&'a RawValue>,
    pub protocol_version: Option<&'a RawValue>,
    pub server_info: Option<&'a RawValue>,
}

impl ResultFields<'_> {
    /// A `tools/call` result with nothing in it: `content` empty (or absent) and no
    /// `structuredContent`.
    pub fn is_empty_tool_content(&self) -> bool {
        // `[]` with any whitespace inside, decided from the raw text.
        let content_empty = is_null(self.content)
            || self.content.is_some_and(|c| {
                c.get()
                    .trim()
                    .strip_prefix('[')
                    .is_some_and(|rest| rest.trim_start().starts_with(']'))
            });
        self.is_object && content_empty && is_null(self.structured_content)
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

/// An object key, borrowed unless it has escapes.
#[derive(Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for ResultFields<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = ResultFields<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC result")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut r = ResultFields {
                    is_object: true,
                    ..ResultFields::default()
                };
                while let Some(Key(key)) = map.next_key()? {
                    let slot = match key.as_ref() {
                        "content" => &mut r.content,
                        "structuredContent" => &mut r.structured_content,
                        "capabilities" => &mut r.capabilities,
                        "protocolVersion" => &mut r.protocol_version,
                        "serverInfo" => &mut r.server_info,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    let value: &'de RawValue = map.next_value()?;
                    slot.get_or_insert(value);
                }
                Ok(r)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ResultFields::default())
            }

            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(ResultFields::default())
            }

            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(ResultFields::default())
            }

            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(ResultFields::default())
            }

            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(ResultFields::default())
            }

            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(ResultFields::default())
            }
        }
        d.deserialize_any(Fields)
    }
}

#[derive(Deserialize)]
struct ErrorObject<'a> {
    #[serde(default)]
    code: Option<i64>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

/// Parses a body or SSE `data` payload: one message or a batch. Elements of a batch that are
/// not JSON-RPC are skipped; the whole payload is an error only if nothing in it is.
pub fn parse(bytes: &[u8]) -> Result<Vec<Message<'_>>, ParseError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::InvalidJson)?;
    parse_str(text)
}

/// [`parse`] for text already known to be UTF-8 (an SSE event's data), skipping a second
/// validation pass.
pub fn parse_str(text: &str) -> Result<Vec<Message<'_>>, ParseError> {
    if text.trim_start().starts_with('[') {
        let items: Vec<&RawValue> =
            serde_json::from_str(text).map_err(|_| ParseError::InvalidJson)?;
        let msgs: Vec<Message<'_>> = items
            .into_iter()
            .filter_map(|raw| serde_json::from_str::<Envelope<'_>>(raw.get()).ok())
            .filter_map(classify)
            .collect();
        return if msgs.is_empty() {
            Err(ParseError::NotJsonRpc)
        } else {
            Ok(msgs)
        };
    }
    let envelope: Envelope<'_> = serde_json::from_str(text).map_err(|e| {
        if e.is_data() {
            ParseError::NotJsonRpc
        } else {
            ParseError::InvalidJson
        }
    })?;
    classify(envelope)
        .map(|m| vec![m])
        .ok_or(ParseError::NotJsonRpc)
}

fn is_null(raw: Option<&RawValue>) -> bool {
    raw.is_none_or(|r| r.get().trim() == "null")
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
            None => Message::Notification { method },
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
pub fn to_value(raw: Option<&RawValue>) -> Result<Value, ParseError> {
    match raw {
        None => Ok(Value::Null),
        Some(r) => serde_json::from_str(r.get()).map_err(|_| ParseError::InvalidJson),
    }
}

/// `params.name` of a `tools/call`.
pub fn tool_name(params: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize)]
    struct Named<'a> {
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
    }
    let named: Named<'_> = serde_json::from_str(params?.get()).ok()?;
    named.name.map(Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).expect("raw")
    }

    #[test]
    fn single_messages() {
        let m = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#)
            .unwrap();
        let Message::Request { id, method, params } = &m[0] else {
            panic!("{m:?}")
        };
        assert_eq!((id.0.as_str(), method.as_ref()), ("1", "tools/call"));
        assert_eq!(tool_name(*params).as_deref(), Some("x"));
        let m = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(
            matches!(&m[0], Message::Notification { method } if method == "notifications/initialized")
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
        assert_ne!(Id::from_raw(&raw("1")), Id::from_raw(&raw("\"1\"")));
        assert_eq!(Id::from_raw(&raw("null")), None);
        assert_eq!(Id("\"x\"".into()).to_value(), Value::from("x"));
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
}
