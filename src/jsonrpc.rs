//! JSON-RPC 2.0 messages as MCP uses them: single messages and batches.

use serde_json::Value;

/// A request id, kept as its JSON text so `1` and `"1"` stay distinct.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub String);

impl Id {
    fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::String(_) | Value::Number(_) => Some(Id(v.to_string())),
            _ => None,
        }
    }

    /// The id as a JSON value again, for output.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request {
        id: Id,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Result {
        id: Id,
        result: Value,
    },
    Error {
        id: Option<Id>,
        code: i64,
        message: String,
    },
}

impl Message {
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

/// Parses a body or SSE `data` payload: one message or a batch. Elements of a batch that are
/// not JSON-RPC are skipped; the whole payload is an error only if nothing in it is.
pub fn parse(bytes: &[u8]) -> Result<Vec<Message>, ParseError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|_| ParseError::InvalidJson)?;
    match value {
        Value::Array(items) => {
            let msgs: Vec<Message> = items.into_iter().filter_map(classify).collect();
            if msgs.is_empty() {
                Err(ParseError::NotJsonRpc)
            } else {
                Ok(msgs)
            }
        }
        other => classify(other)
            .map(|m| vec![m])
            .ok_or(ParseError::NotJsonRpc),
    }
}

fn classify(value: Value) -> Option<Message> {
    let Value::Object(mut obj) = value else {
        return None;
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return None;
    }
    let id = obj.get("id").and_then(Id::from_value);
    if let Some(Value::String(method)) = obj.remove("method") {
        let params = obj.remove("params").unwrap_or(Value::Null);
        return Some(match id {
            Some(id) => Message::Request { id, method, params },
            None => Message::Notification { method, params },
        });
    }
    if let Some(err) = obj.get("error") {
        return Some(Message::Error {
            id,
            code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        });
    }
    let result = obj.remove("result")?;
    Some(Message::Result { id: id?, result })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_messages() {
        let m = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#)
            .unwrap();
        assert!(
            matches!(&m[0], Message::Request { id, method, .. } if id.0 == "1" && method == "tools/call")
        );
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
        assert_eq!(
            m[0],
            Message::Error {
                id: Some(Id("2".into())),
                code: -32600,
                message: "Invalid Request".into()
            }
        );
    }

    #[test]
    fn batches_keep_order_and_skip_junk() {
        let m = parse(
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},7,{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":1,"result":{}}]"#,
        )
        .unwrap();
        assert_eq!(m.len(), 3);
        assert!(m[1].is_request_or_notification());
        assert_eq!(parse(b"[]"), Err(ParseError::NotJsonRpc));
    }

    #[test]
    fn errors() {
        assert_eq!(parse(b"{not json"), Err(ParseError::InvalidJson));
        assert_eq!(
            parse(br#"{"id":1,"method":"x"}"#),
            Err(ParseError::NotJsonRpc)
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","result":{}}"#),
            Err(ParseError::NotJsonRpc)
        );
        assert_eq!(parse(b"\xff\xfe"), Err(ParseError::InvalidJson));
    }

    #[test]
    fn ids_keep_their_type() {
        assert_ne!(
            Id::from_value(&Value::from(1)),
            Id::from_value(&Value::from("1"))
        );
        assert_eq!(Id("\"x\"".into()).to_value(), Value::from("x"));
    }
}
