//! The modern revision (2026-07-28) on the wire: per-request `_meta` declarations, the headers
//! that mirror body fields, and `x-mcp-header` tool parameters. Pure parsing, no state.

use crate::http::RequestHead;
use crate::model::MismatchHeader;
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::sync::Arc;

/// The first modern revision; later ones are later dates.
pub const MODERN_SINCE: &str = "2026-07-28";

/// The `_meta` key prefix of the modern declarations.
const META_MARKER: &str = "io.modelcontextprotocol/";

/// Whether a protocol version string names a modern revision (`YYYY-MM-DD` dates compare as
/// text).
pub fn is_modern_version(v: &str) -> bool {
    v.len() == MODERN_SINCE.len() && v >= MODERN_SINCE && v.as_bytes()[4] == b'-'
}

/// Whether a request's params may carry modern declarations: a byte search before any parse,
/// so legacy requests pay almost nothing.
pub fn may_declare(params: &str) -> bool {
    // `str::contains` needs no searcher built per call (memmem's would cost more than the
    // search on small params).
    params.contains(META_MARKER)
}

/// Longest value text kept in a finding (header and body values may be large or secret-ish).
const MAX_VALUE_BYTES: usize = 256;

/// What a modern request's params declare and name.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Declaration {
    pub protocol_version: Option<Box<str>>,
    /// `io.modelcontextprotocol/clientCapabilities` as its JSON text.
    pub capabilities: Option<Box<str>>,
    pub client_name: Option<Box<str>>,
    pub client_version: Option<Box<str>>,
    /// `io.modelcontextprotocol/clientInfo` as its JSON text.
    pub client_info: Option<Box<str>>,
    /// A digest of the three declared members' text: equal declarations, equal digests.
    pub digest: u64,
}

impl Declaration {
    pub fn heap_bytes(&self) -> usize {
        let t = |s: &Option<Box<str>>| s.as_ref().map_or(0, |s| s.len());
        t(&self.protocol_version)
            + t(&self.capabilities)
            + t(&self.client_name)
            + t(&self.client_version)
            + t(&self.client_info)
    }

    pub fn capabilities_value(&self) -> Value {
        self.capabilities
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(Value::Null)
    }

    pub fn client_info_value(&self) -> Value {
        self.client_info
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(Value::Null)
    }
}

/// What a request's params hold for the monitor: the declaration and the fields headers mirror.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RequestFacts {
    /// Shared: one reading of a `_meta` text serves every request that sends it.
    pub declaration: Option<Arc<Declaration>>,
    /// `params.name` or `params.uri` (what `Mcp-Name` mirrors).
    pub name_or_uri: Option<String>,
    /// `tools/call` arguments as JSON text, kept only when `Mcp-Param-*` checks need them.
    pub arguments: Option<Box<str>>,
    /// The request retries an `InputRequiredResult` (MRTR).
    pub input_responses: bool,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<Meta<'a>>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(rename = "inputResponses", borrow, default)]
    input_responses: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow, default)]
    protocol_version: Option<&'a RawValue>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities", borrow, default)]
    capabilities: Option<&'a RawValue>,
    #[serde(rename = "io.modelcontextprotocol/clientInfo", borrow, default)]
    client_info: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Info<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    version: Option<Cow<'a, str>>,
}

/// [`Meta`] as JSON text, however it was read.
struct MetaText<'a> {
    protocol_version: Option<&'a str>,
    capabilities: Option<&'a str>,
    client_info: Option<&'a str>,
}

impl<'a> MetaText<'a> {
    fn of(m: Meta<'a>) -> Self {
        MetaText {
            protocol_version: m.protocol_version.map(RawValue::get),
            capabilities: m.capabilities.map(RawValue::get),
            client_info: m.client_info.map(RawValue::get),
        }
    }

    /// `_meta` (valid JSON) as serde_json reads it into [`Meta`]: an object's members are
    /// listed by the validating pass (cheaper than serde_json's walk); anything else, or an
    /// object of very many members, is read by serde_json, which reads a struct from an array
    /// too. `None` where serde_json fails.
    fn read(meta: &'a str) -> Option<Self> {
        let fields = crate::jsonrpc::object_fields(
            meta,
            [
                "io.modelcontextprotocol/protocolVersion",
                "io.modelcontextprotocol/clientCapabilities",
                "io.modelcontextprotocol/clientInfo",
            ],
        );
        match fields {
            None => serde_json::from_str::<Meta<'_>>(meta)
                .ok()
                .map(MetaText::of),
            Some(fields) => {
                let [protocol_version, capabilities, client_info] = fields.ok()?;
                Some(MetaText {
                    protocol_version,
                    capabilities,
                    client_info,
                })
            }
        }
    }
}

/// [`Params`] with its members as JSON text, however they were read.
struct Fields<'a> {
    meta: Option<MetaText<'a>>,
    name: Option<&'a str>,
    uri: Option<&'a str>,
    arguments: Option<&'a str>,
    input_responses: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn of(p: Params<'a>) -> Self {
        Fields {
            meta: p.meta.map(MetaText::of),
            name: p.name.map(RawValue::get),
            uri: p.uri.map(RawValue::get),
            arguments: p.arguments.map(RawValue::get),
            input_responses: p.input_responses.map(RawValue::get),
        }
    }
}

fn raw_str(raw: Option<&str>) -> Option<String> {
    raw.and_then(|r| serde_json::from_str::<Cow<'_, str>>(r).ok())
        .map(Cow::into_owned)
}

/// A declaration's lasting digest (lineage records keep it).
fn digest_of(parts: [Option<&str>; 3]) -> u64 {
    parts
        .into_iter()
        .fold(
            crate::lasting_digest::LastingDigest::new(0x6d63_7074_6170_6465),
            |digest, part| digest.optional(part.map(str::as_bytes)),
        )
        .finish()
}

/// The facts of one request's params (`None`: not an object the monitor can read).
/// `keep_arguments`: keep `arguments` text for `Mcp-Param-*` checks.
pub fn request_facts(
    params: &crate::jsonrpc::Params<'_>,
    keep_arguments: bool,
) -> Option<RequestFacts> {
    request_facts_with(params, keep_arguments, &mut |meta| {
        read_meta(meta).map(|d| d.map(Arc::new))
    })
}

/// [`request_facts`], with `_meta` (when the pass that validated the params found it) read
/// by `read`: [`read_meta`], or a cache of its answers (a lineage declares the same set with
/// every request).
pub fn request_facts_with(
    params: &crate::jsonrpc::Params<'_>,
    keep_arguments: bool,
    read: &mut dyn FnMut(&str) -> Option<Option<Arc<Declaration>>>,
) -> Option<RequestFacts> {
    let (declaration, p) =
        match params.fields(["_meta", "name", "uri", "arguments", "inputResponses"]) {
            // The members were found while validating: only `_meta` is read further.
            Some(fields) => {
                let [meta, name, uri, arguments, input_responses] = fields.ok()?;
                let declaration = match meta {
                    Some(meta) => read(meta)?,
                    None => None,
                };
                let p = Fields {
                    meta: None,
                    name,
                    uri,
                    arguments,
                    input_responses,
                };
                (declaration, p)
            }
            None => {
                let mut p = Fields::of(serde_json::from_str(params.get()).ok()?);
                (p.meta.take().and_then(declaration_of).map(Arc::new), p)
            }
        };
    Some(RequestFacts {
        declaration,
        name_or_uri: raw_str(p.name).or_else(|| raw_str(p.uri)),
        arguments: keep_arguments.then(|| p.arguments.map(Box::from)).flatten(),
        input_responses: p.input_responses.is_some(),
    })
}

/// What `_meta` (valid JSON) declares; `Some(None)`: nothing. `None` where serde_json cannot
/// read it (then the request has no facts). A function of the text alone.
pub fn read_meta(meta: &str) -> Option<Option<Declaration>> {
    Some(declaration_of(MetaText::read(meta)?))
}

/// The declaration of `_meta`'s members, if it makes one.
fn declaration_of(m: MetaText<'_>) -> Option<Declaration> {
    if m.protocol_version.is_none() && m.capabilities.is_none() && m.client_info.is_none() {
        return None;
    }
    let info: Option<Info<'_>> = m.client_info.and_then(|i| serde_json::from_str(i).ok());
    let (client_name, client_version) = info
        .map(|i| {
            (
                i.name.map(|n| Box::from(n.as_ref())),
                i.version.map(|v| Box::from(v.as_ref())),
            )
        })
        .unwrap_or_default();
    Some(Declaration {
        protocol_version: raw_str(m.protocol_version).map(String::into_boxed_str),
        capabilities: m.capabilities.map(Box::from),
        client_name,
        client_version,
        client_info: m.client_info.map(Box::from),
        digest: digest_of([m.protocol_version, m.capabilities, m.client_info]),
    })
}

/// Decodes a `=?base64?...?=` header value (2026-07-28 value encoding); plain values as is.
/// `None`: the sentinel is there but its content is not base64 of UTF-8.
pub fn decode_header_value(value: &str) -> Option<String> {
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        None => Some(value.to_string()),
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()?;
            String::from_utf8(bytes).ok()
        }
    }
}

/// An `x-mcp-header` parameter of a tool: the header's name part (lowercased) and the property
/// path to the argument.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParamHeader {
    pub name: Box<str>,
    pub path: Vec<Box<str>>,
}

/// Most tools with `x-mcp-header` parameters remembered per server, and parameters per tool.
pub const MAX_PARAM_TOOLS: usize = 256;
pub const MAX_PARAMS_PER_TOOL: usize = 16;
const MAX_SCHEMA_DEPTH: usize = 8;

#[derive(Deserialize)]
struct Tool {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "inputSchema", default)]
    input_schema: Option<Value>,
}

/// Tools with their `x-mcp-header` parameters.
pub type ToolParams = Vec<(Box<str>, Vec<ParamHeader>)>;

/// The `x-mcp-header` parameters of a `tools/list` result's `tools` (JSON text), per tool that
/// has any; `truncated` when a bound cut them short. Only statically reachable properties
/// (chains of `properties` keys) count, as the revision requires.
pub fn param_headers(tools: &str) -> (ToolParams, bool) {
    if memchr::memmem::find(tools.as_bytes(), b"x-mcp-header").is_none() {
        return (Vec::new(), false);
    }
    let Ok(list) = serde_json::from_str::<Vec<Tool>>(tools) else {
        return (Vec::new(), false);
    };
    let mut out = Vec::new();
    let mut truncated = false;
    for tool in list {
        let (Some(name), Some(schema)) = (tool.name, tool.input_schema) else {
            continue;
        };
        let mut params = Vec::new();
        collect_params(&schema, &mut Vec::new(), &mut params, &mut truncated);
        if params.is_empty() {
            continue;
        }
        if out.len() >= MAX_PARAM_TOOLS {
            truncated = true;
            break;
        }
        out.push((name.into_boxed_str(), params));
    }
    (out, truncated)
}

fn collect_params(
    schema: &Value,
    path: &mut Vec<Box<str>>,
    out: &mut Vec<ParamHeader>,
    truncated: &mut bool,
) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    if path.len() >= MAX_SCHEMA_DEPTH {
        *truncated = true;
        return;
    }
    for (key, prop) in props {
        path.push(key.as_str().into());
        if let Some(h) = prop.get("x-mcp-header").and_then(Value::as_str)
            && !h.is_empty()
        {
            if out.len() < MAX_PARAMS_PER_TOOL {
                out.push(ParamHeader {
                    name: h.to_ascii_lowercase().into_boxed_str(),
                    path: path.clone(),
                });
            } else {
                *truncated = true;
            }
        }
        collect_params(prop, path, out, truncated);
        path.pop();
    }
}

/// One header that disagreed with the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderFinding {
    pub header: MismatchHeader,
    pub header_name: String,
    pub header_value: Option<String>,
    pub body_value: Option<String>,
}

fn cut(s: &str) -> String {
    let mut at = s.len().min(MAX_VALUE_BYTES);
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s[..at].to_string()
}

/// Methods whose `Mcp-Name` mirrors `params.name` or `params.uri`.
fn named_method(method: &str) -> bool {
    matches!(method, "tools/call" | "resources/read" | "prompts/get")
}

/// The headers of a modern request that disagree with its body. `declared_version`: the
/// `_meta` protocol version; `params`: the tool's `x-mcp-header` parameters, when known.
pub fn header_findings(
    head: &RequestHead,
    method: &str,
    facts: Option<&RequestFacts>,
    params: Option<&[ParamHeader]>,
) -> Vec<HeaderFinding> {
    let mut found = Vec::new();
    if let Some(h) = super::headers::request_mcp_method(head)
        && h != method
    {
        found.push(HeaderFinding {
            header: MismatchHeader::McpMethod,
            header_name: "Mcp-Method".into(),
            header_value: Some(cut(h)),
            body_value: Some(cut(method)),
        });
    }
    let declared = facts
        .and_then(|f| f.declaration.as_ref())
        .and_then(|d| d.protocol_version.as_deref());
    if let (Some(h), Some(body)) = (super::headers::request_protocol_version(head), declared)
        && h != body
    {
        found.push(HeaderFinding {
            header: MismatchHeader::McpProtocolVersion,
            header_name: "MCP-Protocol-Version".into(),
            header_value: Some(cut(h)),
            body_value: Some(cut(body)),
        });
    }
    let body_name = facts.and_then(|f| f.name_or_uri.as_deref());
    if let Some(h) = super::headers::request_mcp_name(head)
        && named_method(method)
    {
        let decoded = decode_header_value(h);
        if decoded.as_deref() != body_name {
            found.push(HeaderFinding {
                header: MismatchHeader::McpName,
                header_name: "Mcp-Name".into(),
                header_value: Some(cut(decoded.as_deref().unwrap_or(h))),
                body_value: body_name.map(cut),
            });
        }
    }
    // Without every `Mcp-Param-*` header of the request, a parameter's header may be among
    // those not kept: no comparison (the caller counts it).
    if let Some(params) = params.filter(|_| !head.prefixed_truncated) {
        let args: Option<Value> = facts
            .and_then(|f| f.arguments.as_deref())
            .and_then(|a| serde_json::from_str(a).ok());
        for p in params {
            let sent = head.prefixed.iter().find(|(n, _)| {
                n.len() == super::headers::PARAM_PREFIX.len() + p.name.len()
                    && n[super::headers::PARAM_PREFIX.len()..].eq_ignore_ascii_case(&p.name)
            });
            let body = args.as_ref().and_then(|a| argument_at(a, &p.path));
            let header = sent.map(|(_, v)| decode_header_value(v));
            let agree = match (&header, &body) {
                (None, None) => true,
                (Some(Some(h)), Some(b)) => values_agree(h, b),
                _ => false,
            };
            if !agree {
                found.push(HeaderFinding {
                    header: MismatchHeader::McpParam,
                    header_name: sent
                        .map_or_else(|| format!("Mcp-Param-{}", p.name), |(n, _)| n.clone()),
                    header_value: sent
                        .map(|(_, v)| cut(&decode_header_value(v).unwrap_or_else(|| v.clone()))),
                    body_value: body.as_ref().map(|b| cut(&header_text(b))),
                });
            }
        }
    }
    found
}

/// The argument at a property path; `null` counts as absent.
fn argument_at<'v>(args: &'v Value, path: &[Box<str>]) -> Option<&'v Value> {
    let mut v = args;
    for key in path {
        v = v.get(&**key)?;
    }
    (!v.is_null()).then_some(v)
}

/// A primitive argument as its header text.
fn header_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether a header value states a body value: strings as is, integers numerically, booleans
/// in lowercase.
fn values_agree(header: &str, body: &Value) -> bool {
    match body {
        Value::String(s) => header == s,
        Value::Bool(b) => header == if *b { "true" } else { "false" },
        Value::Number(n) => match (header.trim().parse::<f64>(), n.as_f64()) {
            (Ok(h), Some(b)) => h == b,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert!(is_modern_version("2026-07-28"));
        assert!(is_modern_version("2027-01-01"));
        assert!(!is_modern_version("2025-11-25"));
        assert!(!is_modern_version("2026-07-2"));
        assert!(!is_modern_version("DRAFT-2026"));
    }

    /// The facts of `params`, the same whichever way the params were read.
    fn facts(params: &str, keep_arguments: bool) -> Option<RequestFacts> {
        let ways = crate::jsonrpc::Params::both_ways(params);
        let facts: Vec<_> = ways
            .iter()
            .map(|p| request_facts(p, keep_arguments))
            .collect();
        assert!(!facts.is_empty(), "{params}");
        assert!(
            facts.windows(2).all(|f| f[0] == f[1]),
            "{params}: {facts:?}"
        );
        facts.into_iter().next().flatten()
    }

    #[test]
    fn declarations_and_digests() {
        let p = r#"{"name":"t","arguments":{"a":1},"_meta":{"progressToken":7,"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"}}}"#;
        assert!(may_declare(p));
        let f = facts(p, true).unwrap();
        let d = f.declaration.clone().unwrap();
        assert_eq!(d.protocol_version.as_deref(), Some("2026-07-28"));
        assert_eq!(d.capabilities.as_deref(), Some(r#"{"sampling":{}}"#));
        assert_eq!(d.client_name.as_deref(), Some("c"));
        assert_eq!(f.name_or_uri.as_deref(), Some("t"));
        assert_eq!(f.arguments.as_deref(), Some(r#"{"a":1}"#));
        // The progress token differs per request; the digest does not.
        let q = r#"{"name":"t","_meta":{"progressToken":8,"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"}}}"#;
        assert_eq!(
            facts(q, false).unwrap().declaration.unwrap().digest,
            d.digest
        );
        let legacy = r#"{"name":"t","arguments":{}}"#;
        assert!(!may_declare(legacy));
        assert_eq!(facts(legacy, false).unwrap().declaration, None);
        assert_eq!(facts("[1]", false), None);
    }

    #[test]
    fn members_read_while_validating_give_serdes_facts() {
        // Each shape serde's struct reading treats specially: nulls, repeats, escaped keys,
        // `_meta` of the wrong type or as an array, and unknown members.
        for params in [
            r#"{"name":null,"uri":"file:///a","arguments":null,"inputResponses":null}"#,
            r#"{"name":"a","name":"b"}"#,
            r#"{"name":"a","n\u0061me":"b"}"#,
            r#"{"_meta":null,"name":"x"}"#,
            r#"{"_meta":{},"_meta":{}}"#,
            r#"{"_meta":5,"name":"x"}"#,
            r#"{"_meta":["2026-07-28",{"tools":{}},{"name":"c"}],"name":"x"}"#,
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":null,"io.modelcontextprotocol/clientInfo":{"name":"c"}}}"#,
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"a","io.modelcontextprotocol/protocolVersion":"b"}}"#,
            r#"{"_meta":{"io.modelcontextprotocol/clientInfo":7}}"#,
            r#"{"other":[1,{"name":"inner"}],"name":"t\u00e9","inputResponses":{"r":{}}}"#,
            r#"{ "name" : "spaced" , "arguments" : { "a" : [ 1 , 2 ] } }"#,
            r#"{}"#,
        ] {
            facts(params, true);
        }
    }

    #[test]
    fn a_meta_of_many_members_is_read_as_serde_reads_it() {
        let many: Vec<String> = (0..70).map(|i| format!("\"k{i}\":{i}")).collect();
        let params = format!(
            "{{\"_meta\":{{{},\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}}",
            many.join(",")
        );
        let f = facts(&params, false).expect("facts");
        assert_eq!(
            f.declaration
                .and_then(|d| d.protocol_version.clone())
                .as_deref(),
            Some("2026-07-28")
        );
    }

    const KEYS: &[&str] = &[
        "name",
        "n\\u0061me",
        "uri",
        "arguments",
        "inputResponses",
        "_meta",
        "_met\\u0061",
        "other",
    ];
    const VALUES: &[&str] = &[
        "null",
        "\"t\"",
        "\"t\\u00e9\"",
        "7",
        "[1,{}]",
        "{}",
        "{\"a\":[1,2]}",
        "{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}",
        "{\"io.modelcontextprotocol/clientInfo\":{\"name\":\"c\"},\"progressToken\":1}",
        "{\"io.modelcontextprotocol/protocolVersion\":null}",
        "[\"2026-07-28\"]",
        "{\"io.modelcontextprotocol/protocolVersion\":\"a\",\"io.modelcontextprotocol/protocolVersion\":\"b\"}",
        "{\"io.modelcontextprotocol/protocolV\\u0065rsion\":\"2026-07-\\u00328\",\"x\":[{}]}",
        "{\"io.modelcontextprotocol/protocolVersion\":7,\"io.modelcontextprotocol/clientCapabilities\":{\"tools\":{}}}",
        "{ \"io.modelcontextprotocol/clientCapabilities\" : { \"a\" : 1 } , \"io.modelcontextprotocol/clientInfo\" : null }",
        "{\"io.modelcontextprotocol/clientInfo\":{\"name\":\"c\",\"name\":\"d\"}}",
    ];

    proptest::proptest! {
        #[test]
        fn facts_of_generated_params_agree_both_ways(
            members in proptest::collection::vec((0..KEYS.len(), 0..VALUES.len()), 0..6),
            keep in proptest::prelude::any::<bool>(),
        ) {
            let body: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("\"{}\" : {}", KEYS[*k], VALUES[*v]))
                .collect();
            facts(&format!("{{ {} }}", body.join(" , ")), keep);
        }
    }

    #[test]
    fn base64_sentinel() {
        assert_eq!(decode_header_value("plain").as_deref(), Some("plain"));
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8sIOS4lueVjA==?=").as_deref(),
            Some("Hello, 世界")
        );
        assert_eq!(decode_header_value("=?base64?!!?="), None);
    }

    #[test]
    fn x_mcp_header_params_and_findings() {
        let tools = r#"[{"name":"execute_sql","inputSchema":{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"},"opts":{"properties":{"n":{"type":"integer","x-mcp-header":"N"}}},"list":{"items":{"properties":{"x":{"x-mcp-header":"X"}}}}}}},{"name":"plain","inputSchema":{}}]"#;
        let (list, truncated) = param_headers(tools);
        assert!(!truncated);
        assert_eq!(list.len(), 1);
        let params = &list[0].1;
        assert_eq!(
            params.len(),
            2,
            "items is not statically reachable: {params:?}"
        );
        let mut head = RequestHead::default();
        head.prefixed = vec![
            ("Mcp-Param-Region".into(), "us-west1".into()),
            ("mcp-param-n".into(), "42".into()),
        ];
        let facts = |args: &str| RequestFacts {
            arguments: Some(args.into()),
            name_or_uri: Some("execute_sql".into()),
            ..RequestFacts::default()
        };
        let ok = facts(r#"{"region":"us-west1","opts":{"n":42.0}}"#);
        assert!(header_findings(&head, "tools/call", Some(&ok), Some(params)).is_empty());
        let bad = facts(r#"{"region":"eu-central1","opts":{"n":42}}"#);
        let f = header_findings(&head, "tools/call", Some(&bad), Some(params));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].header, MismatchHeader::McpParam);
        assert_eq!(f[0].body_value.as_deref(), Some("eu-central1"));
        // A value in the body without its header is a mismatch too.
        head.prefixed.remove(1);
        let f = header_findings(&head, "tools/call", Some(&ok), Some(params));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].header_value, None);
    }

    #[test]
    fn standard_header_findings() {
        let mut head = crate::mcp::headers::request_head(
            "POST",
            "/mcp",
            Some("application/json"),
            None,
            None,
            Some("2026-07-28"),
        );
        crate::mcp::headers::set_request_mcp_headers(
            &mut head,
            Some("tools/list"),
            Some("=?base64?ZGVsZXRlX2FsbA==?="),
        );
        let facts = RequestFacts {
            name_or_uri: Some("delete_all".into()),
            declaration: Some(Arc::new(Declaration {
                protocol_version: Some("2026-07-28".into()),
                ..Declaration::default()
            })),
            ..RequestFacts::default()
        };
        let f = header_findings(&head, "tools/call", Some(&facts), None);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].header, MismatchHeader::McpMethod);
    }
}
