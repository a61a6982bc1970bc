//! Typed outputs of the pipeline.
//!
//! [`Event`]s are the product: one NDJSON line each (`handshake`, `alert`, `exchange`,
//! `session_end`). [`Telemetry`] values describe the monitor's own health (gaps, drops, parse
//! errors); sinks turn both into log lines and counters.

use serde::{Serialize, Serializer};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;

/// Defines a reason enum whose variants are metric label values (snake_case, fixed set).
macro_rules! label_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, for metrics that pre-register their label sets.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The metric label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let label = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == label)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown {}: {label}", stringify!($name))))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// Packet time in nanoseconds since the Unix epoch. Never the wall clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn from_secs(s: i64) -> Self {
        Timestamp(s.saturating_mul(1_000_000_000))
    }

    /// Milliseconds from `earlier` to `self`, never negative.
    pub fn millis_since(self, earlier: Timestamp) -> f64 {
        (self.0.saturating_sub(earlier.0)).max(0) as f64 / 1e6
    }

    /// RFC 3339, UTC, microseconds: `2026-11-30T17:25:46.123456Z`.
    pub fn rfc3339(self) -> String {
        match self.rfc3339_bytes() {
            Some(b) => String::from_utf8_lossy(&b).into_owned(),
            // Unreachable for nanoseconds in an i64 (years 1677 to 2262), kept total.
            None => format!("@{}", self.0),
        }
    }

    /// [`Timestamp::rfc3339`] in a fixed-size buffer: every event carries one or two
    /// timestamps, and `format!` costs thousands of instructions each.
    pub fn rfc3339_bytes(self) -> Option<[u8; 27]> {
        let secs = self.0.div_euclid(1_000_000_000);
        let micros = (self.0.rem_euclid(1_000_000_000) / 1000) as u32;
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        let year = u32::try_from(year).ok().filter(|y| *y <= 9999)?;
        let of_day = secs.rem_euclid(86_400) as u32;
        let mut b = *b"0000-00-00T00:00:00.000000Z";
        put_pair(&mut b[0..2], year / 100);
        put_pair(&mut b[2..4], year % 100);
        put_pair(&mut b[5..7], month);
        put_pair(&mut b[8..10], day);
        put_pair(&mut b[11..13], of_day / 3600);
        put_pair(&mut b[14..16], of_day / 60 % 60);
        put_pair(&mut b[17..19], of_day % 60);
        put_pair(&mut b[20..22], micros / 10_000);
        put_pair(&mut b[22..24], micros / 100 % 100);
        put_pair(&mut b[24..26], micros % 100);
        Some(b)
    }
}

/// The proleptic Gregorian (year, month, day) of a day counted from 1970-01-01 (Howard
/// Hinnant's `civil_from_days`: the year taken to start in March, so the leap day ends it).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097); // [0, 146096]
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153; // [0, 11]
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Every two-digit number's digits.
const DIGIT_PAIRS: [[u8; 2]; 100] = {
    let mut table = [[0u8; 2]; 100];
    let mut v = 0;
    while v < 100 {
        table[v] = [b'0' + (v / 10) as u8, b'0' + (v % 10) as u8];
        v += 1;
    }
    table
};

/// Writes `v` (below 100) as two digits into `dst` (two bytes).
fn put_pair(dst: &mut [u8], v: u32) {
    if let (Some(pair), Some(dst)) = (DIGIT_PAIRS.get(v as usize), dst.get_mut(..2)) {
        dst.copy_from_slice(pair);
    }
}

fn push_byte(buf: &mut [u8], len: &mut usize, b: u8) {
    if let Some(dst) = buf.get_mut(*len) {
        *dst = b;
    }
    *len += 1;
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.rfc3339_bytes() {
            Some(b) => s.serialize_str(std::str::from_utf8(&b).unwrap_or_default()),
            None => s.serialize_str(&self.rfc3339()),
        }
    }
}

/// `a.b.c.d:port` without the formatting machinery for IPv4 (most endpoints); IPv6 through
/// `Display`.
fn addr<S: Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
    match a {
        SocketAddr::V4(v4) => s.serialize_str(Ipv4Text::new(*v4.ip(), Some(v4.port())).as_str()),
        SocketAddr::V6(_) => s.collect_str(a),
    }
}

/// An IPv4 address (`a.b.c.d`) or endpoint (`a.b.c.d:port`) as `Display` writes it, without
/// the formatting machinery, which costs several times more: addresses are written for every
/// event and request.
pub struct Ipv4Text {
    /// Room beyond the longest text (21 bytes) for the word-sized writes below.
    buf: [u8; 24],
    len: usize,
}

/// Each octet's digits followed by a dot, as a little-endian word, and the text's length.
const OCTET_DOT: [(u32, u8); 256] = {
    let mut table = [(0u32, 0u8); 256];
    let mut v = 0;
    while v < 256 {
        let (h, t, o) = ((v / 100) as u32, (v / 10 % 10) as u32, (v % 10) as u32);
        let (b0, b1, b2) = (48 + h, 48 + t, 48 + o);
        let dot = b'.' as u32;
        table[v] = if v >= 100 {
            (b0 | b1 << 8 | b2 << 16 | dot << 24, 4)
        } else if v >= 10 {
            (b1 | b2 << 8 | dot << 16, 3)
        } else {
            (b2 | dot << 8, 2)
        };
        v += 1;
    }
    table
};

impl Ipv4Text {
    pub fn new(ip: std::net::Ipv4Addr, port: Option<u16>) -> Self {
        let mut buf = [0u8; 24];
        let mut len = 0;
        // Each octet and its dot as one 4-byte write (the next one covers what is left over);
        // the last dot is then dropped or covered by the colon.
        for octet in ip.octets() {
            let (word, n) = OCTET_DOT[usize::from(octet)];
            if let Some(dst) = buf.get_mut(len..len + 4) {
                dst.copy_from_slice(&word.to_le_bytes());
            }
            len += usize::from(n);
        }
        len -= 1;
        if let Some(port) = port {
            push_byte(&mut buf, &mut len, b':');
            // Five digits, zero-padded, shifted so that the leading zeros fall off, written as
            // one word.
            let v = u32::from(port);
            let digits = match v {
                0..=9 => 1,
                10..=99 => 2,
                100..=999 => 3,
                1000..=9999 => 4,
                _ => 5,
            };
            let (high, low) = (v / 10_000, v % 10_000);
            let [a, b] = DIGIT_PAIRS[(low / 100) as usize];
            let [c, d] = DIGIT_PAIRS[(low % 100) as usize];
            let five = u64::from_le_bytes([b'0' + high as u8, a, b, c, d, 0, 0, 0]);
            let word = five >> (8 * (5 - digits));
            if let Some(dst) = buf.get_mut(len..len + 8) {
                dst.copy_from_slice(&word.to_le_bytes());
            }
            len += digits;
        }
        Ipv4Text { buf, len }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// The text's bytes: ASCII digits, dots and a colon.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

/// The event schema version, `v` on every event. 1: events without `v` (before eras); 2: eras,
/// lineages, `server/discover` and `_meta` declarations, three new alert kinds.
pub const SCHEMA_VERSION: u32 = 2;

/// Serializes as [`SCHEMA_VERSION`]: the `v` field of every event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchemaVersion;

impl Serialize for SchemaVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(SCHEMA_VERSION)
    }
}

label_enum! {
    /// Which generation of MCP over HTTP an exchange belongs to.
    Era {
        /// Per-request `_meta` declarations, no session (2026-07-28 and later).
        Modern => "modern",
        /// Streamable HTTP with `initialize` (2025-03-26 to 2025-11-25), with or without a
        /// session id.
        Legacy => "legacy",
        /// The deprecated HTTP+SSE transport (2024-11-05): a GET stream and its POST endpoint.
        HttpSse => "http+sse",
    }
}

label_enum! {
    /// What a `handshake` event reports.
    HandshakeSource {
        /// An `initialize` exchange (legacy, HTTP+SSE).
        Initialize => "initialize",
        /// A capability set a modern request declared in `params._meta`, first seen.
        RequestMeta => "request_meta",
        /// A `server/discover` result, first seen or changed.
        Discover => "discover",
    }
}

label_enum! {
    /// Which direction a JSON-RPC request went.
    Direction {
        ClientToServer => "client_to_server",
        /// A server's request (`roots/list`, `sampling/createMessage`, `elicitation/create`)
        /// on an SSE stream, answered by a client POST (legacy revisions).
        ServerToClient => "server_to_client",
    }
}

label_enum! {
    /// A request header that mirrors a body field (2026-07-28) and disagreed with it.
    MismatchHeader {
        McpMethod => "mcp-method",
        McpName => "mcp-name",
        McpProtocolVersion => "mcp-protocol-version",
        McpParam => "mcp-param",
    }
}

label_enum! {
    /// Why a `protocol_downgrade` alert fired.
    DowngradeReason {
        /// A lineage that had a 2xx modern answer from a server sent it `initialize`.
        InitializeAfterModern => "initialize_after_modern",
        /// A server's `server/discover` lost versions of its first `supportedVersions`.
        SupportedVersionsShrank => "supported_versions_shrank",
    }
}

fn is_client_to_server(d: &Direction) -> bool {
    *d == Direction::ClientToServer
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Handshake(Box<Handshake>),
    Alert(Box<Alert>),
    Exchange(Box<Exchange>),
    SessionEnd(SessionEnd),
}

impl Event {
    pub fn ts(&self) -> Timestamp {
        match self {
            Event::Handshake(h) => h.ts,
            Event::Alert(a) => a.ts,
            Event::Exchange(e) => e.ts,
            Event::SessionEnd(e) => e.ts,
        }
    }

    pub fn session_id(&self) -> Option<&str> {
        match self {
            Event::Handshake(h) => h.session_id.as_deref(),
            Event::Alert(a) => a.session_id.as_deref(),
            Event::Exchange(e) => e.session_id.as_deref(),
            Event::SessionEnd(e) => e.session_id.as_deref(),
        }
    }

    pub fn server(&self) -> SocketAddr {
        match self {
            Event::Handshake(h) => h.server,
            Event::Alert(a) => a.server,
            Event::Exchange(e) => e.server,
            Event::SessionEnd(e) => e.server,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected => "rejected",
        }
    }
}

/// A JSON value with its compact text, rendered once and shared: a fleet's handshakes repeat a
/// few SDKs' values (see `session::HandshakeCache`), and every handshake's event and log line
/// write them. Serialized as that text (a serde_json raw value: the same bytes serde_json
/// writes for the value), so that a line copies it rather than walking the tree again.
#[derive(Debug, Clone)]
pub struct SharedJson(Arc<JsonWithText>);

#[derive(Debug)]
struct JsonWithText {
    value: Value,
    text: Box<serde_json::value::RawValue>,
}

impl SharedJson {
    pub fn new(value: Value) -> Self {
        let text = serde_json::to_string(&value)
            .ok()
            .and_then(|t| serde_json::value::RawValue::from_string(t).ok())
            // Unreachable: a value always renders, and its rendering is JSON.
            .unwrap_or_else(|| {
                debug_assert!(false, "a rendered value is not JSON");
                serde_json::value::RawValue::NULL.to_owned()
            });
        SharedJson(Arc::new(JsonWithText { value, text }))
    }

    pub fn value(&self) -> &Value {
        &self.0.value
    }

    /// The value's compact JSON.
    pub fn text(&self) -> &str {
        self.0.text.get()
    }

    /// Both hold the one rendering (not merely equal values).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl Default for SharedJson {
    fn default() -> Self {
        SharedJson::new(Value::Null)
    }
}

impl std::ops::Deref for SharedJson {
    type Target = Value;
    fn deref(&self) -> &Value {
        &self.0.value
    }
}

impl PartialEq for SharedJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.value == other.0.value
    }
}

impl From<Value> for SharedJson {
    fn from(value: Value) -> Self {
        SharedJson::new(value)
    }
}

impl Serialize for SharedJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.text.serialize(s)
    }
}

/// One `initialize` exchange, first or later, with everything negotiated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Handshake {
    pub v: SchemaVersion,
    pub ts: Timestamp,
    pub session_id: Option<String>,
    /// 1 for the session's first handshake, then 2, 3, ...
    pub seq: u32,
    pub outcome: Outcome,
    pub http_status: u16,
    pub error_code: Option<i64>,
    pub error_message: Option<String>,
    #[serde(serialize_with = "addr")]
    pub client: SocketAddr,
    #[serde(serialize_with = "addr")]
    pub server: SocketAddr,
    pub host: Option<String>,
    pub path: String,
    pub protocol_version_requested: Option<String>,
    pub protocol_version: Option<String>,
    /// Shared: a fleet's handshakes repeat a few SDKs' values (see `session::HandshakeCache`).
    pub client_info: SharedJson,
    pub server_info: SharedJson,
    pub client_capabilities: SharedJson,
    pub server_capabilities: SharedJson,
    /// For seq > 1: paths removed and added per side against the session's first handshake.
    pub diff: Option<HandshakeDiff>,
    /// The client declared fewer capabilities but the server kept its first answer.
    pub client_near_miss: bool,
    /// Lineage: the rejected, expired or deleted session this client came from.
    pub predecessor_session_id: Option<String>,
    pub lineage: Option<HandshakeDiff>,
    pub era: Era,
    pub source: HandshakeSource,
    /// The client lineage (server, client and its name and version), a stable short hash.
    pub lineage_id: Option<String>,
    /// `request_meta`: the request's method (capabilities are declared per request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// `discover`: the server's `supportedVersions`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supported_versions: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    pub v: SchemaVersion,
    pub ts: Timestamp,
    pub session_id: Option<String>,
    #[serde(serialize_with = "addr")]
    pub server: SocketAddr,
    #[serde(serialize_with = "addr")]
    pub client: SocketAddr,
    #[serde(flatten)]
    pub kind: AlertKind,
    /// How the exchange the alert is about was framed: `lenient` when its HTTP framing needed
    /// leniency a strict peer (Node's llhttp) rejects, so that peer saw a transport error.
    pub framing: FramingMode,
    pub era: Era,
    pub protocol_version: Option<String>,
    pub lineage_id: Option<String>,
}

/// Whether an exchange's HTTP framing was strictly conformant (RFC 9112) or needed leniency
/// (bare LF, chunk-size whitespace, malformed chunk extensions) that h11 accepts and llhttp
/// rejects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FramingMode {
    #[default]
    Strict,
    Lenient,
}

impl FramingMode {
    /// `lenient` when `lenient` is true, else `strict`.
    pub fn of(lenient: bool) -> Self {
        if lenient {
            FramingMode::Lenient
        } else {
            FramingMode::Strict
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AlertKind {
    CapabilityNarrowing(CapabilityChange),
    CapabilityWidening(CapabilityChange),
    ContentTypeDivergence(Divergence),
    EmptyToolResult(EmptyResult),
    ClientCapabilityNarrowing(ClientNarrowing),
    ProtocolDowngrade(Downgrade),
    HeaderMismatch(Mismatch),
}

impl AlertKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            AlertKind::CapabilityNarrowing(_) => "capability_narrowing",
            AlertKind::CapabilityWidening(_) => "capability_widening",
            AlertKind::ContentTypeDivergence(_) => "content_type_divergence",
            AlertKind::EmptyToolResult(_) => "empty_tool_result",
            AlertKind::ClientCapabilityNarrowing(_) => "client_capability_narrowing",
            AlertKind::ProtocolDowngrade(_) => "protocol_downgrade",
            AlertKind::HeaderMismatch(_) => "header_mismatch",
        }
    }

    pub const ALL: [&'static str; 7] = [
        "capability_narrowing",
        "capability_widening",
        "content_type_divergence",
        "empty_tool_result",
        "client_capability_narrowing",
        "protocol_downgrade",
        "header_mismatch",
    ];
}

/// A modern client's declared capabilities for one method lost paths against that method's
/// first declaration, and the narrowed set was declared again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientNarrowing {
    pub method: String,
    /// The lineage's declaration (seq) that repeated the narrowed set.
    pub declaration_seq: u32,
    pub removed: Vec<String>,
    pub added: Vec<String>,
    /// The method's first declared capabilities, and the narrowed ones.
    pub previous: Value,
    pub current: Value,
}

/// One answer a lineage saw before it went back to `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedAnswer {
    pub method: String,
    pub http_status: u16,
    /// `json`, `sse`, `other` or `none`; `other` carries the media type in `content_type`.
    pub media_type: &'static str,
    pub content_type: Option<String>,
    pub error_code: Option<i64>,
}

/// A client or server stepped back from the modern era.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Downgrade {
    pub reason: DowngradeReason,
    /// `initialize_after_modern`: the lineage's failing answers just before (oldest first).
    pub before: Vec<FailedAnswer>,
    /// `initialize_after_modern`: the version the `initialize` asked for.
    pub requested_version: Option<String>,
    /// `supported_versions_shrank`: versions lost against the first discover result.
    pub removed_versions: Vec<String>,
    pub supported_versions: Vec<String>,
}

/// A header that mirrors a body field disagreed with it, and the server accepted the request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    pub header: MismatchHeader,
    /// The header as sent (`Mcp-Param-Region`).
    pub header_name: String,
    /// The header's value, decoded from `=?base64?...?=`, at most 256 bytes.
    pub header_value: Option<String>,
    /// The body's value, at most 256 bytes (`null`: absent).
    pub body_value: Option<String>,
    pub method: String,
    pub tool: Option<String>,
    pub request_id: Value,
    pub http_status: u16,
    /// Further headers the same request mismatched on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<MismatchHeader>,
}

/// A re-initialize that changed the server's capabilities against the first accepted one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapabilityChange {
    /// The handshake (seq) that changed them.
    pub handshake_seq: u32,
    pub removed: Vec<String>,
    pub added: Vec<String>,
    /// The server capabilities of the session's first accepted handshake.
    pub previous: Value,
    pub current: Value,
    /// What the client's own declaration lost or gained: usually the root cause.
    pub client_removed: Vec<String>,
    pub client_added: Vec<String>,
}

impl CapabilityChange {
    pub fn new(
        seq: u32,
        server: &PathDiff,
        client: &PathDiff,
        previous: Value,
        current: Value,
    ) -> Self {
        CapabilityChange {
            handshake_seq: seq,
            removed: server.removed.clone(),
            added: server.added.clone(),
            previous,
            current,
            client_removed: client.removed.clone(),
            client_added: client.added.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    pub method: String,
    pub request_id: Value,
    pub tool: Option<String>,
    pub expected: String,
    pub observed: String,
    pub reason: DivergenceReason,
    /// Further reasons the same answer showed (one answer raises one alert).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<DivergenceReason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceReason {
    /// No server response mode (sse, json, auto) explains every answer of the session.
    ModeContradiction,
    /// `tools.streaming: true` was negotiated and the answer was JSON.
    StreamingNegotiated,
    /// The media type is not one the request's Accept listed.
    NotAccepted,
}

impl DivergenceReason {
    /// The name the events carry (`reason`), for log lines that must match them.
    pub fn as_str(self) -> &'static str {
        match self {
            DivergenceReason::ModeContradiction => "mode_contradiction",
            DivergenceReason::StreamingNegotiated => "streaming_negotiated",
            DivergenceReason::NotAccepted => "not_accepted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmptyResult {
    pub request_id: Value,
    pub tool: Option<String>,
    pub reason: EmptyReason,
    pub sse_events: u32,
    pub ended_by: StreamEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EmptyReason {
    NoEvents,
    OnlyPriming,
    OnlyNotifications,
}

impl EmptyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EmptyReason::NoEvents => "no_events",
            EmptyReason::OnlyPriming => "only_priming",
            EmptyReason::OnlyNotifications => "only_notifications",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamEnd {
    FinalChunk,
    ServerClosed,
}

impl StreamEnd {
    /// The name the events carry (`ended_by`).
    pub fn as_str(self) -> &'static str {
        match self {
            StreamEnd::FinalChunk => "final_chunk",
            StreamEnd::ServerClosed => "server_closed",
        }
    }
}

/// One JSON-RPC request and how it was answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exchange {
    pub v: SchemaVersion,
    /// Time of the request.
    pub ts: Timestamp,
    pub session_id: Option<String>,
    #[serde(serialize_with = "addr")]
    pub server: SocketAddr,
    #[serde(serialize_with = "addr")]
    pub client: SocketAddr,
    pub method: String,
    pub request_id: Value,
    pub tool: Option<String>,
    /// The request's `MCP-Protocol-Version` header.
    pub protocol_version: Option<String>,
    pub http_status: u16,
    /// `json`, `sse`, `other` or `none`.
    pub media_type: &'static str,
    /// Events on the response stream up to the answer (SSE only).
    pub sse_events: u32,
    pub duration_ms: f64,
    /// Whether a JSON-RPC response for the id was seen.
    pub answered: bool,
    pub error_code: Option<i64>,
    /// tools/call only: the result had an empty `content` array and no `structuredContent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_content: Option<bool>,
    /// The client cancelled the request before it was answered (`notifications/cancelled`
    /// naming its id): its stream ending without the answer is no empty result. Absent
    /// otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
    /// `lenient` when the request or response needed framing leniency (see [`FramingMode`]).
    pub framing: FramingMode,
    /// A header peers read differently (a differing duplicate Content-Type, Mcp-Session-Id,
    /// ...) was on the request or response: which answer a client saw depends on its parser.
    pub ambiguous: bool,
    pub era: Era,
    pub lineage_id: Option<String>,
    /// `server_to_client` for a server's request answered by a client POST; absent otherwise.
    #[serde(skip_serializing_if = "is_client_to_server")]
    pub direction: Direction,
    /// The answer was an `InputRequiredResult` (MRTR): what it asked for and whether the
    /// lineage retried with `inputResponses` within the lineage window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_required: Option<InputRequired>,
}

/// An `InputRequiredResult` and its fate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputRequired {
    /// The methods of its `inputRequests` (`elicitation/create`, `sampling/createMessage`).
    pub requests: Vec<String>,
    /// `true`: retried within the window; `false`: not; `null`: undecided (capture end, or
    /// the monitor dropped the lineage).
    pub retried: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    Deleted,
    Expired,
    Idle,
    Evicted,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Deleted => "deleted",
            EndReason::Expired => "expired",
            EndReason::Idle => "idle",
            EndReason::Evicted => "evicted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionEnd {
    pub v: SchemaVersion,
    pub ts: Timestamp,
    pub session_id: Option<String>,
    #[serde(serialize_with = "addr")]
    pub server: SocketAddr,
    pub reason: EndReason,
    pub handshakes: u32,
    pub requests: u64,
    pub alerts: u32,
    /// A lineage's state was dropped (no session id): which lineage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage_id: Option<String>,
}

label_enum! {
    /// How a flow ended on its own.
    FlowCloseReason {
        Fin => "fin",
        Rst => "rst",
    }
}

label_enum! {
    /// Why the monitor dropped a flow it was still tracking.
    FlowEvictReason {
        /// No packet for longer than the flow idle timeout.
        Idle => "idle",
        /// The flow table was full (`max_flows`).
        FlowLimit => "flow_limit",
        /// The memory budget was exhausted.
        Memory => "memory",
    }
}

label_enum! {
    /// Why bytes of a TCP stream were declared lost.
    GapReason {
        /// Out-of-order data beyond the per-direction buffer limit.
        BufferLimit => "buffer_limit",
        /// The connection closed with a hole still open.
        Closed => "closed",
        /// The flow timed out with a hole still open.
        Timeout => "timeout",
        /// The capture's snaplen cut a packet short: its tail was sent, never captured.
        Snaplen => "snaplen",
        /// The peer acknowledged bytes the capture never saw (a drop on the capture path).
        Lost => "lost",
    }
}

label_enum! {
    /// HTTP/1.1 parse and limit problems.
    HttpError {
        BadRequestHead => "bad_request_head",
        BadResponseHead => "bad_response_head",
        BadChunk => "bad_chunk",
        HeadTooLarge => "head_too_large",
        MessageTooLarge => "message_too_large",
        UnmatchedResponse => "unmatched_response",
        TooManyPending => "too_many_pending",
        TooManyHeaders => "too_many_headers",
        /// A Content-Length that is not one decimal number below 2^64 (`4 2`, `+4`, `0x10`),
        /// or a list of differing values in one header.
        InvalidContentLength => "invalid_content_length",
        /// Two Content-Length headers with different values (identical duplicates are fine).
        ConflictingContentLength => "conflicting_content_length",
        /// Transfer-Encoding and Content-Length together: Transfer-Encoding wins (RFC 9112
        /// §6.3), the classic request-smuggling shape.
        TeWithContentLength => "te_with_content_length",
        /// A transfer coding mcptap does not know (the body is read but not decoded).
        UnknownTransferCoding => "unknown_transfer_coding",
        /// `chunked` is not the final transfer coding (or is applied twice): a request cannot
        /// be framed (desynchronised), a response is read until close.
        ChunkedNotFinal => "chunked_not_final",
        /// Bytes that are not an HTTP message where one must start, on a direction that
        /// already carried HTTP: the pending exchanges are abandoned and parsing resynchronises.
        NotHttp => "not_http",
        /// A message start with an HTTP version other than 1.x (`HTTP/5.6`), handled as
        /// [`HttpError::NotHttp`].
        UnsupportedHttpVersion => "unsupported_http_version",
        /// Bytes of an open body were lost (a gap): the body is cut.
        TruncatedBody => "truncated_body",
        /// A connection started like a PROXY protocol header that is malformed: skipped.
        MalformedProxyHeader => "malformed_proxy_header",
    }
}

label_enum! {
    /// HTTP/1.1 framing a lenient peer (h11, httparse) accepts and a strict one (llhttp)
    /// rejects, or that RFC 9112 says to ignore; parsing goes on.
    FramingAnomaly {
        /// A line of a head, a chunk-size line or a chunk terminator ended in LF without CR.
        BareLf => "bare_lf",
        /// Whitespace after the chunk size with no extension following.
        ChunkSizeWhitespace => "chunk_size_whitespace",
        /// A chunk extension that is empty (`2;`), has no name or unbalanced quotes.
        ChunkExtensionMalformed => "chunk_extension_malformed",
        /// An empty line (CRLF or LF) before or between messages (RFC 9112 §2.2): ignored.
        EmptyLineBetweenMessages => "empty_line_between_messages",
        /// A header value continued on the next line (obs-fold, RFC 9112 §5.2): unfolded, as
        /// h11 and llhttp do.
        ObsFold => "obs_fold",
    }
}

label_enum! {
    /// Headers whose duplicates are counted: peers read them differently (undici and httpx
    /// join them with ", ", hyper and starlette take the first).
    DuplicateHeader {
        ContentType => "content-type",
        ContentLength => "content-length",
        TransferEncoding => "transfer-encoding",
        ContentEncoding => "content-encoding",
        Host => "host",
        Accept => "accept",
        McpSessionId => "mcp-session-id",
        McpProtocolVersion => "mcp-protocol-version",
        McpMethod => "mcp-method",
        McpName => "mcp-name",
        /// Another header the layer above asked HTTP to copy out.
        Other => "other",
    }
}

impl DuplicateHeader {
    /// The label for a header name the layer above extracts.
    pub fn of_extracted(name: &str) -> Self {
        if name.eq_ignore_ascii_case("mcp-session-id") {
            DuplicateHeader::McpSessionId
        } else if name.eq_ignore_ascii_case("mcp-protocol-version") {
            DuplicateHeader::McpProtocolVersion
        } else if name.eq_ignore_ascii_case("mcp-method") {
            DuplicateHeader::McpMethod
        } else if name.eq_ignore_ascii_case("mcp-name") {
            DuplicateHeader::McpName
        } else {
            DuplicateHeader::Other
        }
    }
}

label_enum! {
    /// Why a kept body (JSON or SSE) could not be decoded.
    UndecodableReason {
        /// A content or transfer coding mcptap does not decode (`compress`, `x-custom`, ...).
        UnknownCoding => "unknown_coding",
        /// More codings stacked than mcptap decodes (3).
        TooManyCodings => "too_many_codings",
        /// The compressed data is corrupt.
        Corrupt => "corrupt",
        /// Decompression expanded beyond the ratio guard (a compression bomb).
        ExpansionRatio => "expansion_ratio",
        /// A zstd frame asks for a window beyond the limit (8 MiB).
        WindowTooLarge => "window_too_large",
    }
}

label_enum! {
    /// Why HTTP gave up pairing a request with its response.
    AbandonReason {
        /// Bytes were lost on the request direction.
        Gap => "gap",
        /// More pipelined requests than `max_pending_requests`.
        TooManyPending => "too_many_pending",
        /// Bytes that are not HTTP, or a message that cannot be framed, at a message boundary.
        Desync => "desync",
    }
}

label_enum! {
    /// JSON-RPC problems in bodies and SSE data.
    JsonRpcError {
        InvalidJson => "invalid_json",
        NotJsonRpc => "not_jsonrpc",
        /// A response whose id matches no open request of its exchange or session.
        UnmatchedResponse => "unmatched_response",
    }
}

label_enum! {
    /// Why a connection is not decoded: it does not carry HTTP/1.1 (any more).
    UndecodableFlowReason {
        /// A TLS record: capture the plaintext leg (behind the TLS terminator).
        Tls => "tls",
        /// HTTP/2 cleartext: the prior-knowledge preface, or an `Upgrade: h2c` switched to.
        H2c => "h2c",
        /// A WebSocket the connection switched to (`101 Switching Protocols`).
        Websocket => "websocket",
        /// Another protocol a `101 Switching Protocols` switched to.
        Upgrade => "upgrade",
        /// Bytes that are no HTTP message, from the first byte (or none found while
        /// resynchronising a connection picked up midstream).
        NotHttp => "not_http",
    }
}

label_enum! {
    /// A bound of the session layer that refused or dropped something.
    Limit {
        /// A session id that is empty, too long or not visible ASCII.
        InvalidSessionId => "invalid_session_id",
        /// More open exchanges on one connection than `max_exchanges_per_flow`.
        ExchangesPerFlow => "exchanges_per_flow",
        /// A capability object beyond the path bounds (key length, path count or bytes): the
        /// handshake's capability set is cut short.
        CapabilityPaths => "capability_paths",
        /// Records of ended sessions beyond their byte bound: the oldest are dropped, and a
        /// client returning after that is not linked to its predecessor.
        LineageRecords => "lineage_records",
        /// More distinct methods or capability sets per lineage than tracked: later ones are
        /// counted, not compared.
        LineageDeclarations => "lineage_declarations",
        /// More `x-mcp-header` tools or parameters per server than tracked, or more
        /// `Mcp-Param-*` headers on a request than kept (its parameters are not compared).
        ParamHeaders => "param_headers",
        /// More HTTP+SSE endpoints announced than tracked at once, a second `endpoint` event
        /// on one stream, or an endpoint URL over 1 KiB: not bound.
        SseEndpoints => "sse_endpoints",
        /// More server requests awaiting the client's answer (or HTTP+SSE POSTs awaiting
        /// theirs) per session than tracked.
        ServerRequests => "server_requests",
        /// More connections with a PROXY protocol source than remembered at once.
        ProxiedFlows => "proxied_flows",
        /// Fleet mode: more held messages (per session 1 MiB, 16 MiB in all) or sessions
        /// waiting for the store (4096) than held: the session goes on with its local view.
        FleetHeld => "fleet_held",
        /// More MRTR results waiting for their retry per lineage than held (16).
        InputPending => "input_pending",
        /// A session layer sharded over threads (`replay --threads` 3 or more): more
        /// sessions' shards (`max_sessions`) or PROXY-named connections (`max_flows`) than
        /// remembered. A session whose route went on goes by its id, perhaps to another
        /// shard, which then lacks its state.
        ShardRoutes => "shard_routes",
        /// More HTTP+SSE POSTs awaiting their answers on the stream per session than held (64).
        ParkedPosts => "parked_posts",
        /// More requests of one session waiting for a resumed stream (`Last-Event-ID`) than
        /// held (64; those whose client closed the stream itself at most 32): the stream
        /// that ended concludes at once, and an answer on a resumed one is unmatched.
        ResumptionWaits => "resumption_waits",
        /// More methods (64) or kinds of request (method, tool, progress asked for: 128) per
        /// session, or per stateless endpoint, than their answers' content types are
        /// recorded for: a kind without a record is judged by its method's, a method without
        /// one only against what the session negotiated and the request accepted. Counted
        /// once per session (or endpoint) whose records fill.
        ModeRecords => "mode_records",
    }
}

/// Methods that get a label value of their own; any other is `other`, so that no client can
/// mint series.
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "notifications/initialized",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
    "server/discover",
];

/// A method's metric label: the method when it is a known MCP method, else `other`.
pub fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

/// The monitor's own health, one typed value per noteworthy thing.
#[derive(Debug, Clone, PartialEq)]
pub enum Telemetry {
    FlowOpened,
    FlowClosed {
        reason: FlowCloseReason,
    },
    FlowEvicted {
        reason: FlowEvictReason,
    },
    TcpGap {
        reason: GapReason,
        bytes: u64,
    },
    TcpOverlap {
        conflicting: bool,
    },
    HttpError {
        reason: HttpError,
    },
    JsonRpcError {
        reason: JsonRpcError,
    },
    /// A response to an MCP request, for status counts (the 502 of the incident lands here).
    HttpResponse {
        server: SocketAddr,
        status: u16,
    },
    Request {
        server: SocketAddr,
        /// The method's label ([`method_label`]): a label value, never the wire's text.
        method: &'static str,
        era: Era,
    },
    SessionStarted {
        server: SocketAddr,
        midstream: bool,
    },
    /// Packets stamped more than `clock_jump_ns` ahead of the packet clock. `followed`: true,
    /// once for packets that went on forward (a quiet link, a gap between files): the clock
    /// followed them. false, once per packet, when time came back from them: they were
    /// stamped wrong and did not move the clock.
    ClockJump {
        ahead_ns: i64,
        followed: bool,
    },
    /// A connection mcptap does not decode (TLS, HTTP/2, a switched protocol, not HTTP): what
    /// it carries is not seen. Once per connection.
    UndecodableFlow {
        server: SocketAddr,
        reason: UndecodableFlowReason,
    },
    /// An empty result that waited for its stream's resumption and could not be concluded
    /// (the capture ended, or the monitor evicted the session, inside the window): neither
    /// answered nor alerted.
    ResumptionUnresolved {
        server: SocketAddr,
    },
    /// A value the session layer refused or dropped at one of its bounds.
    LimitHit {
        limit: Limit,
    },
    /// Framing a strict peer rejects, decoded leniently (or an ignored empty line).
    FramingAnomaly {
        reason: FramingAnomaly,
    },
    /// A header that peers read differently appeared more than once in one head.
    DuplicateHeader {
        server: SocketAddr,
        header: DuplicateHeader,
    },
    /// A kept body could not be decoded (unknown coding, corrupt, bomb guard).
    UndecodableBody {
        server: SocketAddr,
        reason: UndecodableReason,
    },
    /// A request HTTP will never pair with a response.
    ExchangeAbandoned {
        reason: AbandonReason,
    },
    /// A modern request's header disagreed with its body (counted whether or not the server
    /// rejected it; the alert needs the server to accept).
    HeaderMismatch {
        server: SocketAddr,
        header: MismatchHeader,
    },
    /// A capability set (modern `_meta`, `server/discover`) declared again: counted, not logged.
    DeclarationRepeated {
        server: SocketAddr,
    },
    /// A modern client declared fewer capabilities for a method than it first did.
    ClientCapabilityLoss {
        server: SocketAddr,
    },
    /// An `InputRequiredResult` its lineage never retried within the window.
    InputRequiredAbandoned {
        server: SocketAddr,
    },
    /// Fleet mode: the store answered a lookup (`found`: with a session's state).
    FleetState {
        found: bool,
    },
    /// Fleet mode: a stored record that does not parse (another version, garbage): ignored.
    FleetGarbage,
    /// A connection opened with a PROXY protocol header (`named_client`: it named one).
    ProxyHeader {
        server: SocketAddr,
        named_client: bool,
    },
}

/// Output of the session layer and everything below it.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Event(Event),
    Telemetry(Telemetry),
    /// Fleet mode: a request to the adapter's shared state store.
    Shared(SharedRequest),
}

/// What the session layer asks of a shared state store (fleet mode). Keys are fleet-wide:
/// (server identity, session id), never a host's own addresses.
#[derive(Debug, Clone, PartialEq)]
pub enum SharedRequest {
    /// The state of a session this instance has not seen; its messages wait for the answer
    /// (`Pipeline::on_shared_state`).
    Lookup { key: String },
    /// The session's state changed: store `record` (JSON) for `ttl_ns` if the stored version
    /// is still `base_version` (compare-and-set; 0: none stored). Otherwise answer with
    /// `Pipeline::on_shared_conflict`: the two views are merged and written again.
    /// `alerts` were raised by this change: each is published only if no instance of the
    /// fleet published the same one (its `dedup` key) before.
    Update {
        key: String,
        record: String,
        ttl_ns: i64,
        base_version: u64,
        version: u64,
        alerts: Vec<SharedAlert>,
    },
}

/// An alert held until the fleet agrees it is new.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedAlert {
    /// Names the alert fleet-wide: the session and what the alert is about, not which request
    /// or instance saw it.
    pub dedup: String,
    pub event: Event,
}

impl AlertKind {
    /// What makes two alerts of one session the same finding (for fleet-wide deduplication).
    pub fn identity(&self) -> String {
        match self {
            AlertKind::CapabilityNarrowing(c) | AlertKind::CapabilityWidening(c) => format!(
                "{}:{}:{:?}:{:?}",
                self.as_str(),
                c.handshake_seq,
                c.removed,
                c.added
            ),
            AlertKind::ContentTypeDivergence(d) => {
                format!(
                    "{}:{}:{:?}:{}",
                    self.as_str(),
                    d.method,
                    d.reason,
                    d.observed
                )
            }
            AlertKind::EmptyToolResult(e) => format!("{}:{}", self.as_str(), e.request_id),
            AlertKind::ClientCapabilityNarrowing(c) => {
                format!("{}:{}:{:?}", self.as_str(), c.method, c.removed)
            }
            AlertKind::ProtocolDowngrade(d) => {
                format!("{}:{}:{:?}", self.as_str(), d.reason, d.removed_versions)
            }
            AlertKind::HeaderMismatch(m) => format!("{}:{}", self.as_str(), m.request_id),
        }
    }
}

/// What one side lost and gained between two handshakes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PathDiff {
    pub removed: Vec<String>,
    pub added: Vec<String>,
}

impl PathDiff {
    pub fn between(before: &[Box<str>], after: &[Box<str>]) -> PathDiff {
        // Both are sorted (see `paths`), so membership is a binary search.
        let missing = |from: &[Box<str>], to: &[Box<str>]| -> Vec<String> {
            from.iter()
                .filter(|p| to.binary_search(p).is_err())
                .map(|p| p.to_string())
                .collect()
        };
        PathDiff {
            removed: missing(before, after),
            added: missing(after, before),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }
}

/// Both sides' differences.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HandshakeDiff {
    pub client: PathDiff,
    pub server: PathDiff,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_label_is_a_known_method_or_other() {
        assert_eq!(method_label("tools/call"), "tools/call");
        assert_eq!(method_label("initialize"), "initialize");
        assert_eq!(method_label("server/discover"), "server/discover");
        for unknown in ["tools/call2", "TOOLS/CALL", "", "x/unknown"] {
            assert_eq!(method_label(unknown), "other", "{unknown:?}");
        }
    }

    /// The formatting the fast path replaced, as the reference.
    fn reference(ts: Timestamp) -> String {
        let secs = ts.0.div_euclid(1_000_000_000);
        let micros = ts.0.rem_euclid(1_000_000_000) / 1000;
        let t = time::OffsetDateTime::from_unix_timestamp(secs).expect("in range");
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            micros
        )
    }

    #[test]
    fn timestamps_format_like_the_reference() {
        let mut samples = vec![
            0,
            1,
            -1,
            999_999_999,
            1_764_523_546_123_456_789,
            i64::MIN, // 1677-09-21
            i64::MAX, // 2262-04-11
        ];
        let mut x: i64 = 0x0123_4567_89ab_cdef;
        for _ in 0..2000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            samples.push(x);
        }
        // Every day of the range, at its first and last microsecond: month ends, leap days
        // and century years.
        for day in -106_751..=106_750i64 {
            samples.push(day * 86_400_000_000_000);
            samples.push(day * 86_400_000_000_000 + 86_399_999_999_000);
        }
        for ns in samples {
            let ts = Timestamp(ns);
            assert_eq!(ts.rfc3339(), reference(ts), "{ns}");
            assert_eq!(
                serde_json::to_string(&ts).unwrap(),
                format!("\"{}\"", reference(ts))
            );
        }
    }

    #[test]
    fn addresses_format_like_display() {
        #[derive(Serialize)]
        struct A(#[serde(serialize_with = "addr")] SocketAddr);
        for a in [
            "0.0.0.0:0",
            "10.1.1.7:33000",
            "255.255.255.255:65535",
            "127.0.0.1:8080",
            "192.168.10.100:9",
            "[::1]:8080",
            "[2001:db8::1]:443",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(serde_json::to_string(&A(a)).unwrap(), format!("\"{a}\""));
        }
        // Every octet in every position, with and without a port.
        for octet in 0..=255u8 {
            for ip in [
                [octet, 0, 9, 255],
                [1, octet, 99, 100],
                [10, 200, octet, 7],
                [255, 255, 255, octet],
            ] {
                let ip = std::net::Ipv4Addr::from(ip);
                assert_eq!(Ipv4Text::new(ip, None).as_str(), ip.to_string());
                for port in [0, 9, 10, 80, 99, 100, 999, 1000, 8080, 9999, 10_000, 65_535] {
                    let a = std::net::SocketAddrV4::new(ip, port);
                    assert_eq!(Ipv4Text::new(ip, Some(port)).as_str(), a.to_string());
                }
            }
        }
    }
}
