//! Detectors: every alert decision, over what the session layer finished.
//!
//! The session layer ([`crate::mcp`]) keeps state and hands over finished handshakes, answers
//! and unanswered requests through its [`Detector`] interface; [`Detectors`] implements it and
//! returns alert values. Per-session detection state (how the server answers each method) is
//! a [`ModeTracker`], stored in the session.

use crate::mcp::session::heap_block_bytes;
use crate::mcp::transactions::{AnswerShape, StreamContent};
use crate::mcp::{
    AnswerReview, AnswerVerdict, DeclarationReview, Detector, DiscoverReview, DowngradeReview,
    HandshakeReview, HandshakeVerdict, HeapBytes, MismatchReview, UnansweredReview,
};
use crate::model::{
    AlertKind, CapabilityChange, ClientNarrowing, Divergence, DivergenceReason, Downgrade,
    DowngradeReason, EmptyReason, EmptyResult, Mismatch, PathDiff,
};

/// mcptap's detectors: capability narrowing and widening, content-type divergence, empty tool
/// results. The fields are the `[detect]` settings of the configuration.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Detectors {
    /// JSON-RPC error responses take part in content-type mode elimination. Off by default:
    /// errors are every SDK's early-exit path and are often answered as plain JSON by servers
    /// that stream their results.
    pub errors_decide_mode: bool,
}

impl Detector for Detectors {
    type SessionState = ModeTracker;

    fn handshake(&self, review: &HandshakeReview<'_>) -> HandshakeVerdict {
        let (Some(base), Some(diff), true) = (review.baseline, review.diff, review.accepted) else {
            return HandshakeVerdict::default();
        };
        let change = CapabilityChange::new(
            review.seq,
            &diff.server,
            &diff.client,
            base.server_caps(),
            review.server_capabilities.clone(),
        );
        // One handshake, one alert: a loss outweighs a gain (the change lists both).
        let alert = if !diff.server.removed.is_empty() {
            Some(AlertKind::CapabilityNarrowing(change))
        } else if !diff.server.added.is_empty() {
            Some(AlertKind::CapabilityWidening(change))
        } else {
            None
        };
        HandshakeVerdict {
            client_near_miss: diff.server.is_empty() && !diff.client.removed.is_empty(),
            alert,
        }
    }

    fn answer(&self, modes: &mut ModeTracker, review: &AnswerReview<'_>) -> AnswerVerdict {
        if !(200..300).contains(&review.http_status) || review.on_other_stream || review.ambiguous {
            // Errors at the HTTP level, answers on a GET stream and ambiguous answers (peers
            // disagree on their Content-Type) say nothing about the POST's response mode.
            return AnswerVerdict::default();
        }
        if review.is_error && !self.errors_decide_mode {
            return AnswerVerdict::default();
        }
        let key = ModeKey {
            method: review.method,
            tool: review.tool,
            progress: review.progress_requested,
        };
        let seen = modes.observe_in(
            key,
            review.shape,
            review.streaming_negotiated,
            review.accept,
            review.capability_changes,
        );
        AnswerVerdict {
            alert: seen.finding.map(|f| {
                AlertKind::ContentTypeDivergence(Divergence {
                    method: review.method.to_string(),
                    request_id: review.request_id.clone(),
                    tool: review.tool.map(str::to_string),
                    expected: f.expected,
                    observed: f.observed,
                    reason: f.reason,
                    also: f.also,
                })
            }),
            untracked: seen.untracked,
        }
    }

    fn merge_state(&self, ours: &mut ModeTracker, theirs: ModeTracker) {
        ours.merge(theirs);
    }

    fn declaration(&self, review: &DeclarationReview<'_>) -> Option<AlertKind> {
        // A narrowed set counts once it is declared again (one request may be an outlier);
        // a lineage alternating between sets is several conversations, not a narrowing.
        if review.diff.removed.is_empty()
            || !review.repeated
            || review.multiplexed
            || review.already_alerted
        {
            return None;
        }
        Some(AlertKind::ClientCapabilityNarrowing(ClientNarrowing {
            method: review.method.to_string(),
            declaration_seq: review.seq,
            removed: review.diff.removed.clone(),
            added: review.diff.added.clone(),
            previous: review.previous_value(),
            current: review.current_value(),
        }))
    }

    fn discover(&self, review: &DiscoverReview<'_>) -> Vec<AlertKind> {
        let mut alerts = Vec::new();
        if !review.diff.removed.is_empty() && !review.paths_alerted {
            alerts.push(AlertKind::CapabilityNarrowing(CapabilityChange::new(
                review.seq,
                review.diff,
                &PathDiff::default(),
                review.previous.clone(),
                review.current.clone(),
            )));
        }
        if !review.removed_versions.is_empty() && !review.versions_alerted {
            alerts.push(AlertKind::ProtocolDowngrade(Downgrade {
                reason: DowngradeReason::SupportedVersionsShrank,
                before: Vec::new(),
                requested_version: None,
                removed_versions: review.removed_versions.to_vec(),
                supported_versions: review.supported_versions.to_vec(),
            }));
        }
        alerts
    }

    fn downgrade(&self, review: &DowngradeReview<'_>) -> Option<AlertKind> {
        review.modern_ok.then(|| {
            AlertKind::ProtocolDowngrade(Downgrade {
                reason: DowngradeReason::InitializeAfterModern,
                before: review.before.to_vec(),
                requested_version: review.requested_version.map(str::to_string),
                removed_versions: Vec::new(),
                supported_versions: Vec::new(),
            })
        })
    }

    fn header_mismatch(&self, review: &MismatchReview<'_>) -> Option<AlertKind> {
        // The server did its job when it refused (400, -32020); only an accepted mismatch
        // means a component acted on the header while the server acted on the body.
        let accepted = (200..300).contains(&review.http_status) && review.error_code.is_none();
        let (first, rest) = review.findings.split_first()?;
        accepted.then(|| {
            AlertKind::HeaderMismatch(Mismatch {
                header: first.header,
                header_name: first.header_name.clone(),
                header_value: first.header_value.clone(),
                body_value: first.body_value.clone(),
                method: review.method.to_string(),
                tool: review.tool.map(str::to_string),
                request_id: review.request_id.clone(),
                http_status: review.http_status,
                also: rest.iter().map(|f| f.header).collect(),
            })
        })
    }

    fn unanswered(&self, review: &UnansweredReview<'_>) -> Option<AlertKind> {
        let streamed = review.media_type == Some("text/event-stream");
        let ended_by = review.ended_by?;
        if review.method != "tools/call" || !streamed || !(200..300).contains(&review.http_status) {
            return None;
        }
        Some(AlertKind::EmptyToolResult(EmptyResult {
            request_id: review.request_id.clone(),
            tool: review.tool.map(str::to_string),
            reason: empty_result_reason(review.stream),
            sse_events: review.stream.items,
            ended_by,
        }))
    }
}

/// Server modes that can produce an answer of this shape.
fn fits(shape: AnswerShape) -> u8 {
    match shape {
        AnswerShape::Json => JSON | AUTO,
        AnswerShape::SseResultOnly => SSE,
        AnswerShape::SseAfterMessages => SSE | AUTO,
    }
}

fn describe(shape: AnswerShape) -> &'static str {
    match shape {
        AnswerShape::Json => "application/json",
        AnswerShape::SseResultOnly => "text/event-stream with only the result",
        AnswerShape::SseAfterMessages => "text/event-stream with messages before the result",
    }
}

// Server response modes: always streams, never streams, JSON unless messages precede the result.
const SSE: u8 = 1;
const JSON: u8 = 2;
const AUTO: u8 = 4;

fn expectation(mask: u8) -> &'static str {
    match mask {
        SSE => "text/event-stream",
        m if m & SSE == 0 && m & JSON != 0 => "application/json",
        m if m & SSE == 0 => "application/json unless messages precede the result",
        m if m & JSON == 0 => "text/event-stream (json only without messages before the result)",
        _ => "any",
    }
}

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct ModeState {
    /// Modes consistent with every answer seen so far; all three at first.
    modes: u8,
    /// Reasons already alerted for this record, so a steady state alerts once.
    alerted: Vec<DivergenceReason>,
    /// The session's capability changes at its latest answer (`None`: a record from before
    /// they were counted, never judged across them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last: Option<u32>,
    /// A method record: its change across a capability change was alerted at this count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    changed_at: Option<u32>,
    /// A method record: its kinds were answered differently with no capability change between.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    varies: bool,
}

impl ModeState {
    fn new(changes: u32) -> Self {
        ModeState {
            modes: SSE | JSON | AUTO,
            alerted: Vec::new(),
            last: Some(changes),
            changed_at: None,
            varies: false,
        }
    }

    /// Narrows the modes by one answer. A contradiction starts over from this answer (so a
    /// lasting change alerts once, not on every call); the modes it contradicted are returned.
    fn narrow(&mut self, shape: AnswerShape, changes: u32) -> Option<u8> {
        self.last = Some(changes);
        let remaining = self.modes & fits(shape);
        if remaining != 0 {
            self.modes = remaining;
            return None;
        }
        let contradicted = self.modes;
        self.modes = fits(shape);
        Some(contradicted)
    }
}

/// The finding of an answer of `shape` that no mode in `contradicted` explains.
fn contradiction(contradicted: u8, shape: AnswerShape) -> DivergenceFinding {
    DivergenceFinding {
        expected: expectation(contradicted).to_string(),
        observed: describe(shape).to_string(),
        reason: DivergenceReason::ModeContradiction,
        also: Vec::new(),
    }
}

/// A divergence to alert on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DivergenceFinding {
    pub expected: String,
    pub observed: String,
    pub reason: DivergenceReason,
    /// Further reasons the same answer showed.
    pub also: Vec<DivergenceReason>,
}

/// Per-session record of how the server answers each kind of request ([`ModeKey`]) and each
/// method as a whole.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ModeTracker {
    /// A handful of records per session: a linear search beats a map. Each is kept under a
    /// digest of what it is of ([`Record::key`]): nothing to allocate or compare but a word.
    methods: Vec<(RecordKey, ModeState)>,
    /// An answer found the table full already ([`ModeObservation::untracked`] is said once
    /// per table, so that a session past the bound is one count, not one per answer).
    #[serde(skip)]
    full_said: bool,
}

/// What a server may choose its response mode by, so what one mode is tracked for: the
/// method, the tool a `tools/call` names, and whether the request asked for progress
/// notifications (`_meta.progressToken`). The specification lets a server answer each request
/// with JSON or a stream; servers that stream only some tools, or only when progress was asked
/// for, are common and conformant. A change within one of these is what the incident shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeKey<'a> {
    pub method: &'a str,
    pub tool: Option<&'a str>,
    pub progress: bool,
}

impl<'a> ModeKey<'a> {
    /// The method alone (no tool, no progress asked for).
    pub fn method(method: &'a str) -> Self {
        ModeKey {
            method,
            tool: None,
            progress: false,
        }
    }
}

impl<'a> From<&'a str> for ModeKey<'a> {
    fn from(method: &'a str) -> Self {
        ModeKey::method(method)
    }
}

/// A record of the table: one kind of request, or a method as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record<'a> {
    Kind(ModeKey<'a>),
    Method(&'a str),
}

/// A record's key: a digest of what it is of, its lowest bit set for a method's record. Two
/// names of one session that share a digest share a record, nothing more: the names come from
/// that session's own peers. Records written by releases that kept a method's name as text
/// were the method's whole record, and are read as its method record (see [`KeptKey`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "KeptKey", into = "u64")]
struct RecordKey(u64);

/// A key as stored: a digest, or a method's name as releases before kinds kept it.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum KeptKey {
    Digest(u64),
    Name(String),
}

impl From<KeptKey> for RecordKey {
    fn from(kept: KeptKey) -> Self {
        match kept {
            KeptKey::Digest(d) => RecordKey(d),
            KeptKey::Name(name) => Record::Method(&name).key(),
        }
    }
}

impl From<RecordKey> for u64 {
    fn from(key: RecordKey) -> Self {
        key.0
    }
}

impl RecordKey {
    fn is_method(self) -> bool {
        self.0 & 1 == 1
    }
}

impl Record<'_> {
    /// The record's key, a lasting digest (snapshots keep it): no two different records write
    /// the same parts.
    fn key(&self) -> RecordKey {
        let digest = crate::lasting_digest::LastingDigest::new(0x6d6f_6465_6b65_7973);
        let (digest, method_bit) = match self {
            Record::Kind(k) => (
                digest
                    .part(k.method.as_bytes())
                    .optional(k.tool.map(str::as_bytes))
                    .part(&[u8::from(k.progress)]),
                0,
            ),
            Record::Method(m) => (digest.part(m.as_bytes()).part(b"method"), 1),
        };
        RecordKey(digest.finish() & !1 | method_bit)
    }
}

/// Bounds on the records kept per session (method and tool names come from the wire): methods
/// and kinds apart, so that one method's many tools cannot crowd the others' methods out.
const MAX_METHOD_RECORDS: usize = 64;
const MAX_KIND_RECORDS: usize = 128;

impl HeapBytes for ModeTracker {
    /// The table's room and, per record, its alerted reasons.
    fn heap_bytes(&self) -> usize {
        let block = |bytes: usize| {
            if bytes == 0 {
                0
            } else {
                heap_block_bytes(bytes)
            }
        };
        let table = block(self.methods.capacity() * std::mem::size_of::<(RecordKey, ModeState)>());
        let per_record: usize = self
            .methods
            .iter()
            .map(|(_, state)| {
                block(state.alerted.capacity() * std::mem::size_of::<DivergenceReason>())
            })
            .sum();
        table + per_record
    }
}

/// What one answer showed, and whether the table had room to record it.
#[derive(Debug, Default)]
pub struct ModeObservation {
    pub finding: Option<DivergenceFinding>,
    /// The session's method or kind records were full ([`Limit::ModeRecords`]): the answer
    /// was judged by less than it would have been. Said for the table's first such answer.
    ///
    /// [`Limit::ModeRecords`]: crate::model::Limit::ModeRecords
    pub untracked: bool,
}

impl ModeTracker {
    /// Another instance's record of the same session: a mode fits now only if it fits every
    /// answer either saw; reasons alerted by either count as alerted.
    pub fn merge(&mut self, theirs: ModeTracker) {
        for (key, state) in theirs.methods {
            let at = self.methods.iter().position(|(k, _)| *k == key);
            let room = at.is_none() && self.has_room(key.is_method());
            match at.and_then(|at| self.methods.get_mut(at)) {
                Some((_, mine)) => {
                    let both = mine.modes & state.modes;
                    // Disjoint views mean the change was seen (and alerted) on one side.
                    if both != 0 {
                        mine.modes = both;
                        // The later answer, and none when either does not know its own.
                        mine.last = mine.last.zip(state.last).map(|(a, b)| a.max(b));
                    }
                    mine.changed_at = mine.changed_at.max(state.changed_at);
                    mine.varies |= state.varies;
                    for r in state.alerted {
                        if !mine.alerted.contains(&r) {
                            mine.alerted.push(r);
                        }
                    }
                }
                None if room => {
                    // Each reason once, as this session's own record holds them: a record from
                    // elsewhere may repeat them without end.
                    let mut state = state;
                    let mut alerted = Vec::new();
                    for r in std::mem::take(&mut state.alerted) {
                        if !alerted.contains(&r) {
                            alerted.push(r);
                        }
                    }
                    state.alerted = alerted;
                    self.methods.push((key, state));
                }
                None => {}
            }
        }
    }

    fn has_room(&self, method_record: bool) -> bool {
        let held = self
            .methods
            .iter()
            .filter(|(k, _)| k.is_method() == method_record)
            .count();
        held < if method_record {
            MAX_METHOD_RECORDS
        } else {
            MAX_KIND_RECORDS
        }
    }

    /// Records one 2xx answer to a request of kind `key` and returns the divergences it shows,
    /// for a session whose capabilities never changed (see [`ModeTracker::observe_in`]).
    pub fn observe<'k>(
        &mut self,
        key: impl Into<ModeKey<'k>>,
        shape: AnswerShape,
        streaming_negotiated: bool,
        accept: Option<&str>,
    ) -> Option<DivergenceFinding> {
        self.observe_in(key.into(), shape, streaming_negotiated, accept, 0)
            .finding
    }

    /// Records one 2xx answer to a request of kind `key` and returns the divergences it shows.
    /// `streaming_negotiated`: the session's current handshake has `tools.streaming: true`.
    /// `accept`: the request's Accept header, if any. `changes`: the session's handshakes that
    /// changed its capabilities so far.
    ///
    /// An answer contradicting earlier answers of its own kind alerts. One contradicting only
    /// the method's other kinds (another tool, progress asked for or not) alerts when it is
    /// the method's first answer since a capability change and the method's answers agreed
    /// before: a replayed `initialize` changed how the method is answered, whatever tool the
    /// agent calls next (the incident). Kinds answered differently with no change between are
    /// the server's choice, and from then on only each kind is judged.
    pub fn observe_in(
        &mut self,
        key: ModeKey<'_>,
        shape: AnswerShape,
        streaming_negotiated: bool,
        accept: Option<&str>,
        changes: u32,
    ) -> ModeObservation {
        let (method_at, own) = self.slots(Record::Method(key.method), Record::Kind(key), changes);
        let full = method_at.is_none() || own.is_none();
        let untracked = full && !self.full_said;
        self.full_said |= full;
        ModeObservation {
            finding: self.judge(
                key.method,
                (method_at, own),
                shape,
                streaming_negotiated,
                accept,
                changes,
            ),
            untracked,
        }
    }

    /// What one answer shows, against its method's record and its kind's (`slots`: where
    /// they are, [`Self::slots`]).
    fn judge(
        &mut self,
        method: &str,
        (method_at, own): (Option<usize>, Option<usize>),
        shape: AnswerShape,
        streaming_negotiated: bool,
        accept: Option<&str>,
        changes: u32,
    ) -> Option<DivergenceFinding> {
        let own_contradiction = own.and_then(|at| self.methods[at].1.narrow(shape, changes));
        let mut method_contradiction = None;
        let mut fits_alerted_change = false;
        if let Some(at) = method_at {
            let state = &mut self.methods[at].1;
            // The method's first answer since the latest capability change.
            let first_since_change = state.last.is_some_and(|last| last < changes);
            let contradiction = state.narrow(shape, changes);
            fits_alerted_change = contradiction.is_none() && state.changed_at == Some(changes);
            let by_design = state.varies;
            // Kinds disagreeing with one another, not one kind changing.
            state.varies |= contradiction.is_some()
                && !first_since_change
                && own.is_some()
                && own_contradiction.is_none();
            // A kind without a record of its own (the table full) is judged by its method's
            // alone, as every method was before kinds were told apart, unless the method's
            // kinds are known to differ.
            let judged = !by_design && (own.is_none() || first_since_change);
            method_contradiction = contradiction.filter(|_| judged);
            if method_contradiction.is_some() {
                state.changed_at = Some(changes);
            }
        }
        let mut found = Vec::new();
        match (method_contradiction, own_contradiction) {
            (Some(modes), _) => found.push(contradiction(modes, shape)),
            // The method's change since the latest capability change was alerted, and this
            // answer fits it: the same change, seen on another kind.
            (None, Some(_)) if fits_alerted_change => {}
            (None, Some(modes)) => found.push(contradiction(modes, shape)),
            (None, None) => {}
        }
        // Reasons that are not about one kind alert once per method.
        if let Some(at) = method_at.or(own) {
            let state = &mut self.methods[at].1;
            if method == "tools/call" && streaming_negotiated && shape == AnswerShape::Json {
                push_once(
                    state,
                    &mut found,
                    DivergenceFinding {
                        expected: "text/event-stream".into(),
                        observed: describe(shape).into(),
                        reason: DivergenceReason::StreamingNegotiated,
                        also: Vec::new(),
                    },
                );
            }
            if let Some(accept) = accept
                && !accepts(accept, shape.media_type())
            {
                push_once(
                    state,
                    &mut found,
                    DivergenceFinding {
                        expected: accept.to_string(),
                        observed: shape.media_type().into(),
                        reason: DivergenceReason::NotAccepted,
                        also: Vec::new(),
                    },
                );
            }
        }
        // One answer, one alert: the first reason (the strongest) names it, the others ride
        // along and count as alerted.
        let mut found = found.into_iter();
        let mut first = found.next()?;
        first.also = found.map(|f| f.reason).collect();
        Some(first)
    }

    /// Where a method's record and one of its kinds' are, each made if new (`None` when its
    /// part of the table is full); one pass over the table for both (this runs per answer).
    fn slots(
        &mut self,
        method: Record<'_>,
        kind: Record<'_>,
        changes: u32,
    ) -> (Option<usize>, Option<usize>) {
        let (method_key, kind_key) = (method.key(), kind.key());
        let (mut method_at, mut kind_at) = (None, None);
        for (at, (key, _)) in self.methods.iter().enumerate() {
            if *key == method_key {
                method_at = Some(at);
            } else if *key == kind_key {
                kind_at = Some(at);
            }
        }
        let mut make = |key: RecordKey| {
            if !self.has_room(key.is_method()) {
                return None;
            }
            self.methods.push((key, ModeState::new(changes)));
            Some(self.methods.len() - 1)
        };
        if method_at.is_none() {
            method_at = make(method_key);
        }
        if kind_at.is_none() {
            kind_at = make(kind_key);
        }
        (method_at, kind_at)
    }
}

fn push_once(state: &mut ModeState, found: &mut Vec<DivergenceFinding>, f: DivergenceFinding) {
    if !state.alerted.contains(&f.reason) {
        state.alerted.push(f.reason);
        found.push(f);
    }
}

/// Whether an Accept header value admits `media_type` (case-insensitive, parameters ignored,
/// wildcards honoured, `q=0` excluded).
pub fn accepts(accept: &str, media_type: &str) -> bool {
    // The value the specification asks every client to send admits both answer types.
    if accept == "application/json, text/event-stream"
        && matches!(media_type, "application/json" | "text/event-stream")
    {
        return true;
    }
    let (want_type, want_sub) = media_type.split_once('/').unwrap_or((media_type, ""));
    // Bytes, without allocating: this runs on every answer of every session. Cut at ASCII
    // delimiters, each piece is still UTF-8 text.
    const REFUSALS: [&[u8]; 4] = [b"q=0", b"q=0.0", b"q=0.00", b"q=0.000"];
    accept.as_bytes().split(|b| *b == b',').any(|range| {
        let mut parts = range.split(|b| *b == b';');
        let mt = trimmed(parts.next().unwrap_or_default());
        let refused = parts.any(|p| {
            let squeezed = trimmed(p).iter().filter(|b| **b != b' ');
            REFUSALS.iter().any(|r| squeezed.clone().eq(r.iter()))
        });
        if refused || mt.is_empty() {
            return false;
        }
        let (t, s) = match mt.iter().position(|b| *b == b'/') {
            Some(at) => (
                mt.get(..at).unwrap_or_default(),
                mt.get(at + 1..).unwrap_or_default(),
            ),
            None => (mt, &[][..]),
        };
        (t == b"*" || t.eq_ignore_ascii_case(want_type.as_bytes()))
            && (s == b"*" || s.eq_ignore_ascii_case(want_sub.as_bytes()))
    })
}

/// A piece of an Accept value trimmed as `str::trim` trims it (it is UTF-8: cut from a `str`
/// at ASCII delimiters).
fn trimmed(text: &[u8]) -> &[u8] {
    crate::http::trim_like_str(text).unwrap_or_default()
}

/// A stream that ended without the response for its request: why it was empty.
pub fn empty_result_reason(content: StreamContent) -> EmptyReason {
    if content.messages > 0 {
        EmptyReason::OnlyNotifications
    } else if content.items > 0 {
        EmptyReason::OnlyPriming
    } else {
        EmptyReason::NoEvents
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StreamEnd;
    use AnswerShape::*;

    const D: Detectors = Detectors {
        errors_decide_mode: false,
    };

    /// The reasons of an answer's finding: the alert's, then the ones riding along.
    fn reasons(f: &Option<DivergenceFinding>) -> Vec<DivergenceReason> {
        f.iter()
            .flat_map(|f| std::iter::once(f.reason).chain(f.also.iter().copied()))
            .collect()
    }

    /// A record from elsewhere (a snapshot, another host) may repeat an alerted reason without
    /// end: merged in, each reason is held once, as the session's own record holds them.
    #[test]
    fn a_merged_record_holds_each_alerted_reason_once() {
        let mut theirs = ModeTracker::default();
        let _ = theirs.observe("tools/call", SseResultOnly, false, None);
        let _ = theirs.observe("tools/call", Json, false, None);
        let mut record = serde_json::to_value(&theirs).expect("json");
        for (_, state) in record["methods"]
            .as_array_mut()
            .expect("methods")
            .iter_mut()
            .filter_map(|m| m.as_array_mut().and_then(|kv| kv.split_first_mut()))
        {
            if let Some(state) = state.first_mut() {
                state["alerted"] = serde_json::json!(vec!["mode_contradiction"; 10_000]);
            }
        }
        let theirs: ModeTracker = serde_json::from_value(record).expect("record");
        assert!(
            theirs
                .methods
                .iter()
                .any(|(_, s)| s.alerted.len() == 10_000)
        );
        let mut ours = ModeTracker::default();
        D.merge_state(&mut ours, theirs);
        assert!(!ours.methods.is_empty());
        for (_, state) in &ours.methods {
            assert!(state.alerted.len() <= 1, "{:?}", state.alerted.len());
        }
    }

    #[test]
    fn sse_then_json_is_the_incident() {
        let mut t = ModeTracker::default();
        assert!(
            t.observe("tools/call", SseResultOnly, false, None)
                .is_none()
        );
        assert!(
            t.observe("tools/call", SseResultOnly, false, None)
                .is_none()
        );
        let f = t.observe("tools/call", Json, false, None);
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        assert_eq!(
            f.as_ref().map(|f| f.expected.as_str()),
            Some("text/event-stream")
        );
        assert_eq!(
            f.as_ref().map(|f| f.observed.as_str()),
            Some("application/json")
        );
        // The new state is established: no alert storm.
        assert!(t.observe("tools/call", Json, false, None).is_none());
    }

    #[test]
    fn json_then_result_only_sse_alerts_but_auto_mode_does_not() {
        let mut t = ModeTracker::default();
        t.observe("tools/call", Json, false, None);
        assert_eq!(
            reasons(&t.observe("tools/call", SseResultOnly, false, None)),
            vec![DivergenceReason::ModeContradiction]
        );
        let mut auto = ModeTracker::default();
        assert!(auto.observe("tools/call", Json, false, None).is_none());
        assert!(
            auto.observe("tools/call", SseAfterMessages, false, None)
                .is_none()
        );
        assert!(auto.observe("tools/call", Json, false, None).is_none());
        // Auto mode never streams a bare result.
        assert!(
            auto.observe("tools/call", SseResultOnly, false, None)
                .is_some()
        );
    }

    #[test]
    fn sse_server_with_progress_then_plain_sse_is_fine() {
        let mut t = ModeTracker::default();
        assert!(
            t.observe("tools/call", SseAfterMessages, false, None)
                .is_none()
        );
        assert!(
            t.observe("tools/call", SseResultOnly, false, None)
                .is_none()
        );
        assert!(t.observe("tools/call", Json, false, None).is_some());
    }

    #[test]
    fn records_cost_the_same_whatever_the_names_and_long_names_are_still_told_apart() {
        let mut t = ModeTracker::default();
        assert_eq!(t.heap_bytes(), 0);
        t.observe("tools/call", SseResultOnly, false, None);
        let one = t.heap_bytes();
        assert!(one > 0, "{one}");
        // Names of 60 KB cost what a short name costs, and are still tracked apart.
        let long_a = format!("{}a", "x".repeat(60_000));
        let long_b = format!("{}b", "x".repeat(60_000));
        assert!(
            t.observe(long_a.as_str(), SseResultOnly, false, None)
                .is_none()
        );
        assert!(t.observe(long_b.as_str(), Json, false, None).is_none());
        // Six records (a kind and a method each), in the table's room: no bytes per name.
        assert_eq!(t.methods.len(), 6);
        let room = heap_block_bytes(8 * std::mem::size_of::<(RecordKey, ModeState)>());
        assert!(t.heap_bytes() <= room, "{} > {room}", t.heap_bytes());
        assert_eq!(
            reasons(&t.observe(long_a.as_str(), Json, false, None)),
            vec![DivergenceReason::ModeContradiction]
        );
        assert!(t.observe(long_b.as_str(), Json, false, None).is_none());
        // A record from elsewhere merges into the same record.
        let mut theirs = ModeTracker::default();
        theirs.methods.push((
            Record::Method(&long_b).key(),
            ModeState {
                modes: JSON,
                alerted: vec![DivergenceReason::NotAccepted],
                ..ModeState::default()
            },
        ));
        let records = t.methods.len();
        t.merge(theirs);
        assert_eq!(t.methods.len(), records);
        assert!(
            t.observe(long_b.as_str(), Json, false, Some("text/event-stream"))
                .is_none()
        );
    }

    /// A 2xx answer of `shape` to a `tools/call` of `tool`, the session at `changes` capability
    /// changes (no streaming negotiated, no Accept).
    fn answer(
        t: &mut ModeTracker,
        tool: &str,
        progress: bool,
        shape: AnswerShape,
        changes: u32,
    ) -> Option<DivergenceFinding> {
        t.observe_in(call(tool, progress), shape, false, None, changes)
            .finding
    }

    fn call(tool: &str, progress: bool) -> ModeKey<'_> {
        ModeKey {
            method: "tools/call",
            tool: Some(tool),
            progress,
        }
    }

    #[test]
    fn a_server_that_streams_some_tools_or_only_when_progress_is_asked_is_quiet() {
        // One handshake, one session: tools answered each their own way, every time.
        let mut t = ModeTracker::default();
        for _ in 0..3 {
            assert!(answer(&mut t, "search", false, SseResultOnly, 0).is_none());
            assert!(answer(&mut t, "add", false, Json, 0).is_none());
            assert!(answer(&mut t, "search", true, SseAfterMessages, 0).is_none());
            assert!(answer(&mut t, "add", true, SseResultOnly, 0).is_none());
        }
        // A kind that changes how it is answered still alerts, once.
        let f = answer(&mut t, "search", false, Json, 0);
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        assert!(answer(&mut t, "search", false, Json, 0).is_none());
    }

    #[test]
    fn after_a_replayed_handshake_a_tool_not_called_before_still_shows_the_change() {
        let mut t = ModeTracker::default();
        assert!(answer(&mut t, "read_file", false, SseResultOnly, 0).is_none());
        assert!(answer(&mut t, "list_dir", false, SseResultOnly, 0).is_none());
        // A replayed handshake that changed the capabilities, then a tool never called before.
        let f = answer(&mut t, "get_ticket", false, Json, 1);
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        assert_eq!(f.map(|f| f.expected).as_deref(), Some("text/event-stream"));
        // The same change on a tool seen before: alerted already.
        assert!(answer(&mut t, "read_file", false, Json, 1).is_none());
        // A change of one kind after that, within the same handshake, is its own.
        assert!(answer(&mut t, "list_dir", false, Json, 1).is_none());
        assert!(answer(&mut t, "list_dir", false, SseResultOnly, 1).is_some());
    }

    #[test]
    fn a_server_that_answers_its_tools_differently_is_judged_per_tool_across_handshakes() {
        let mut t = ModeTracker::default();
        assert!(answer(&mut t, "search", false, SseResultOnly, 0).is_none());
        assert!(answer(&mut t, "add", false, Json, 0).is_none());
        // After a replayed handshake, a new tool's JSON answer fits what the server does.
        assert!(answer(&mut t, "fetch", false, Json, 1).is_none());
        // A tool that changed how it is answered still alerts.
        let f = answer(&mut t, "search", false, Json, 1);
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
    }

    #[test]
    fn records_are_keyed_apart_and_methods_marked() {
        let keys = [
            Record::Kind(call("search", true)).key(),
            Record::Kind(call("search", false)).key(),
            Record::Kind(call("searc", true)).key(),
            Record::Kind(ModeKey::method("tools/call")).key(),
            Record::Method("tools/call").key(),
            // Parts that would read alike run together.
            Record::Kind(ModeKey {
                method: "tools/callsearch",
                tool: None,
                progress: false,
            })
            .key(),
            Record::Kind(ModeKey {
                method: "tools/call",
                tool: Some(""),
                progress: false,
            })
            .key(),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert!(Record::Method("tools/call").key().is_method());
        assert!(!Record::Kind(call("search", true)).key().is_method());
        assert_eq!(Record::Kind(call("search", true)).key(), keys[0]);
    }

    #[test]
    fn records_kept_by_name_are_read_as_their_methods_record_and_round_trip() {
        let mut old: ModeTracker = serde_json::from_str(
            r#"{"methods":[["tools/call",{"modes":1,"alerted":["streaming_negotiated"]}]]}"#,
        )
        .expect("a record kept by name");
        assert_eq!(old.methods[0].0, Record::Method("tools/call").key());
        // What it alerted stays alerted.
        assert!(
            old.observe_in(call("t", false), SseResultOnly, true, None, 0)
                .finding
                .is_none()
        );
        let f = old
            .observe_in(call("t", false), Json, true, None, 0)
            .finding;
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        let mut t = ModeTracker::default();
        answer(&mut t, "search", true, SseResultOnly, 2);
        let text = serde_json::to_string(&t).expect("json");
        let back: ModeTracker = serde_json::from_str(&text).expect("read back");
        assert_eq!(format!("{:?}", back.methods), format!("{:?}", t.methods));
    }

    #[test]
    fn a_method_streamed_only_when_progress_is_asked_is_quiet() {
        let mut t = ModeTracker::default();
        let read = |progress| ModeKey {
            method: "resources/read",
            tool: None,
            progress,
        };
        for _ in 0..3 {
            assert!(
                t.observe_in(read(true), SseAfterMessages, false, None, 0)
                    .finding
                    .is_none()
            );
            assert!(
                t.observe_in(read(false), Json, false, None, 0)
                    .finding
                    .is_none()
            );
        }
    }

    #[test]
    fn records_that_do_not_know_when_they_started_are_never_judged_across_changes() {
        // A record from before capability changes were counted.
        let unknown_start = || {
            let mut t = ModeTracker::default();
            answer(&mut t, "search", false, SseResultOnly, 0);
            for (_, state) in &mut t.methods {
                state.last = None;
            }
            let text = serde_json::to_string(&t).expect("json");
            serde_json::from_str::<ModeTracker>(&text).expect("read back")
        };
        let mut t = unknown_start();
        assert!(answer(&mut t, "add", false, Json, 1).is_none());
        // Merged with one that knows: still not known.
        let mut known = ModeTracker::default();
        answer(&mut known, "search", false, SseResultOnly, 0);
        let mut unknown = unknown_start();
        unknown.merge(known.clone());
        assert!(answer(&mut unknown, "add", false, Json, 1).is_none());
        // Two that know merge to the later start.
        let mut later = ModeTracker::default();
        answer(&mut later, "search", false, SseResultOnly, 1);
        known.merge(later);
        assert!(answer(&mut known, "add", false, Json, 1).is_none());
    }

    #[test]
    fn a_table_full_of_one_methods_tools_still_judges_other_methods_and_new_tools() {
        let mut t = ModeTracker::default();
        let tools: Vec<String> = (0..MAX_KIND_RECORDS + 8)
            .map(|i| format!("tool{i}"))
            .collect();
        for (i, tool) in tools.iter().enumerate() {
            let seen = t.observe_in(call(tool, false), SseResultOnly, false, None, 0);
            assert!(seen.finding.is_none());
            // The first answer past the kinds' room says so (a limit counted by the caller).
            assert_eq!(seen.untracked, i == MAX_KIND_RECORDS, "{i}");
        }
        let read = ModeKey::method("resources/read");
        let seen = t.observe_in(read, SseResultOnly, false, None, 0);
        // Its kind finds no room (said once already), its method does.
        assert!(seen.finding.is_none() && !seen.untracked);
        // A method seen after the tools filled their part still has its method record.
        let f = t.observe_in(read, Json, false, None, 1).finding;
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        // A tool without a record of its own is judged by its method's, as before kinds.
        let late = tools.last().map(String::as_str).unwrap_or_default();
        let f = answer(&mut t, late, false, Json, 0);
        assert_eq!(reasons(&f), vec![DivergenceReason::ModeContradiction]);
        assert!(t.methods.len() <= MAX_KIND_RECORDS + MAX_METHOD_RECORDS);
    }

    #[test]
    fn a_new_tool_after_the_method_went_on_as_before_the_change_is_no_divergence() {
        let mut t = ModeTracker::default();
        answer(&mut t, "search", false, SseResultOnly, 0);
        // A capability change, and the server streams `search` as before.
        for _ in 0..3 {
            assert!(answer(&mut t, "search", false, SseResultOnly, 1).is_none());
        }
        assert!(answer(&mut t, "add", false, Json, 1).is_none());
    }

    #[test]
    fn tools_past_the_table_of_a_server_that_answers_them_differently_are_quiet() {
        let mut t = ModeTracker::default();
        for i in 0..MAX_KIND_RECORDS + 20 {
            let shape = if i % 2 == 0 { SseResultOnly } else { Json };
            let tool = format!("tool{i}");
            assert!(answer(&mut t, &tool, false, shape, 0).is_none(), "{i}");
        }
    }

    #[test]
    fn methods_are_independent() {
        let mut t = ModeTracker::default();
        t.observe("tools/call", SseResultOnly, false, None);
        assert!(t.observe("tools/list", Json, false, None).is_none());
    }

    #[test]
    fn streaming_negotiated_json_alerts_once() {
        let mut t = ModeTracker::default();
        let f = t.observe("tools/call", Json, true, None);
        assert_eq!(reasons(&f), vec![DivergenceReason::StreamingNegotiated]);
        assert!(t.observe("tools/call", Json, true, None).is_none());
        assert!(t.observe("tools/list", Json, true, None).is_none());
    }

    #[test]
    fn accept_header_is_honoured() {
        assert!(accepts(
            "application/json, text/event-stream",
            "text/event-stream"
        ));
        assert!(accepts(
            "Application/JSON; charset=utf-8",
            "application/json"
        ));
        assert!(accepts("*/*", "text/event-stream"));
        assert!(accepts("text/*", "text/event-stream"));
        assert!(!accepts("application/json", "text/event-stream"));
        assert!(!accepts(
            "text/event-stream;q=0, application/json",
            "text/event-stream"
        ));
        let mut t = ModeTracker::default();
        let f = t.observe("tools/call", SseResultOnly, false, Some("application/json"));
        assert_eq!(reasons(&f), vec![DivergenceReason::NotAccepted]);
    }

    #[test]
    fn accept_is_read_without_allocating_as_it_was_with() {
        // The reading before it stopped allocating, kept as the reference.
        fn allocating(accept: &str, media_type: &str) -> bool {
            let (want_type, want_sub) = media_type.split_once('/').unwrap_or((media_type, ""));
            accept.split(',').any(|range| {
                let mut parts = range.split(';');
                let mt = parts.next().unwrap_or("").trim().to_ascii_lowercase();
                let refused = parts.any(|p| {
                    let p = p.trim().replace(' ', "");
                    p == "q=0" || p == "q=0.0" || p == "q=0.00" || p == "q=0.000"
                });
                if refused || mt.is_empty() {
                    return false;
                }
                let (t, s) = mt.split_once('/').unwrap_or((mt.as_str(), ""));
                (t == "*" || t.eq_ignore_ascii_case(want_type))
                    && (s == "*" || s.eq_ignore_ascii_case(want_sub))
            })
        }
        let accepts_values = [
            "application/json, text/event-stream",
            "TEXT/EVENT-STREAM",
            "text/event-stream; q = 0",
            "text/event-stream;q=0.000",
            "text/event-stream;q=0.0001",
            "text/event-stream;Q=0",
            "text/event-stream;\tq=0\t",
            "text/event-stream;q=\t0",
            "text/event-stream;q=0.5, application/json;q=0",
            "*/*;q=0, text/*",
            "*",
            "text",
            "",
            " , ;q=1",
            "\u{a0}text/event-stream\u{a0}",
            "application/*; charset=utf-8",
        ];
        for accept in accepts_values {
            for mt in ["text/event-stream", "application/json", "text", ""] {
                assert_eq!(
                    accepts(accept, mt),
                    allocating(accept, mt),
                    "{accept:?} {mt:?}"
                );
            }
        }
    }

    fn review<'a>(
        accepted: bool,
        baseline: Option<&'a crate::mcp::session::CapsRecord>,
        diff: Option<&'a crate::model::HandshakeDiff>,
        caps: &'a serde_json::Value,
    ) -> HandshakeReview<'a> {
        HandshakeReview {
            seq: 2,
            accepted,
            baseline,
            diff,
            server_capabilities: caps,
        }
    }

    #[test]
    fn handshakes_alert_on_server_paths_lost_or_gained_against_the_baseline() {
        use crate::mcp::session::CapsRecord;
        use crate::model::{HandshakeDiff, PathDiff};
        use serde_json::json;
        let first = json!({"tools": {"streaming": true}});
        let base = CapsRecord::new(&json!({"sampling": {}}), &first);
        let now = json!({"tools": {}});
        let narrowed = HandshakeDiff {
            client: PathDiff {
                removed: vec!["sampling".into()],
                added: vec![],
            },
            server: PathDiff {
                removed: vec!["tools.streaming".into()],
                added: vec![],
            },
        };
        let v = D.handshake(&review(true, Some(&base), Some(&narrowed), &now));
        assert!(!v.client_near_miss);
        let Some(AlertKind::CapabilityNarrowing(change)) = &v.alert else {
            panic!("{:?}", v.alert);
        };
        assert_eq!(change.removed, vec!["tools.streaming".to_string()]);
        assert_eq!(change.client_removed, vec!["sampling".to_string()]);
        assert_eq!(change.previous, first);
        // A rejected handshake or a first one decides nothing.
        assert_eq!(
            D.handshake(&review(false, Some(&base), Some(&narrowed), &now)),
            HandshakeVerdict::default()
        );
        assert_eq!(
            D.handshake(&review(true, None, None, &now)),
            HandshakeVerdict::default()
        );
        // The client lost a capability, the server kept its answer: a near miss, no alert.
        let pinned = HandshakeDiff {
            server: PathDiff::default(),
            ..narrowed
        };
        let v = D.handshake(&review(true, Some(&base), Some(&pinned), &first));
        assert!(v.client_near_miss && v.alert.is_none());
    }

    #[test]
    fn only_2xx_answers_on_their_own_exchange_take_part_in_mode_elimination() {
        let id = serde_json::json!(1);
        let answer = |status, on_other_stream, shape| AnswerReview {
            method: "tools/call",
            tool: Some("t"),
            progress_requested: false,
            capability_changes: 0,
            requested_at: crate::model::Timestamp(0),
            request_id: &id,
            http_status: status,
            is_error: false,
            shape,
            on_other_stream,
            streaming_negotiated: false,
            accept: None,
            ambiguous: false,
        };
        let mut modes = ModeTracker::default();
        assert!(
            D.answer(&mut modes, &answer(200, false, SseResultOnly))
                .alert
                .is_none()
        );
        assert!(
            D.answer(&mut modes, &answer(500, false, Json))
                .alert
                .is_none()
        );
        assert!(
            D.answer(&mut modes, &answer(200, true, Json))
                .alert
                .is_none()
        );
        // Duplicated Content-Types: peers disagree on the answer, so it decides nothing.
        let ambiguous = AnswerReview {
            ambiguous: true,
            ..answer(200, false, Json)
        };
        assert!(D.answer(&mut modes, &ambiguous).alert.is_none());
        let alert = D.answer(&mut modes, &answer(200, false, Json)).alert;
        assert!(matches!(
            alert,
            Some(AlertKind::ContentTypeDivergence(d)) if d.reason == DivergenceReason::ModeContradiction
        ));
    }

    #[test]
    fn an_unanswered_tools_call_alerts_only_on_an_ended_2xx_event_stream() {
        let id = serde_json::json!(7);
        let end = |method, status, media, ended_by| UnansweredReview {
            method,
            tool: None,
            request_id: &id,
            http_status: status,
            media_type: media,
            stream: StreamContent::default(),
            ended_by,
        };
        let sse = Some("text/event-stream");
        let fin = Some(StreamEnd::FinalChunk);
        assert!(D.unanswered(&end("tools/call", 200, sse, fin)).is_some());
        assert!(D.unanswered(&end("tools/call", 200, sse, None)).is_none());
        assert!(D.unanswered(&end("tools/list", 200, sse, fin)).is_none());
        assert!(D.unanswered(&end("tools/call", 502, sse, fin)).is_none());
        assert!(
            D.unanswered(&end("tools/call", 200, Some("application/json"), fin))
                .is_none()
        );
    }

    #[test]
    fn one_answer_raises_one_alert_naming_every_reason() {
        let mut t = ModeTracker::default();
        t.observe("tools/call", SseResultOnly, true, None);
        let f = t.observe("tools/call", Json, true, Some("text/event-stream"));
        assert_eq!(
            reasons(&f),
            vec![
                DivergenceReason::ModeContradiction,
                DivergenceReason::StreamingNegotiated,
                DivergenceReason::NotAccepted
            ]
        );
        // The reasons that rode along count as alerted: the next JSON answer is quiet.
        assert!(
            t.observe("tools/call", Json, true, Some("text/event-stream"))
                .is_none()
        );
    }

    #[test]
    fn json_rpc_errors_decide_no_mode_unless_configured() {
        let id = serde_json::json!(1);
        let answer = |is_error, shape| AnswerReview {
            method: "tools/call",
            tool: None,
            progress_requested: false,
            capability_changes: 0,
            requested_at: crate::model::Timestamp(0),
            request_id: &id,
            http_status: 200,
            is_error,
            shape,
            on_other_stream: false,
            streaming_negotiated: true,
            accept: None,
            ambiguous: false,
        };
        let mut modes = ModeTracker::default();
        assert!(
            D.answer(&mut modes, &answer(false, SseResultOnly))
                .alert
                .is_none()
        );
        // An error answered as plain JSON in a streaming session: no alert, and no trace in
        // the modes (the next streamed result is fine).
        assert!(D.answer(&mut modes, &answer(true, Json)).alert.is_none());
        assert!(
            D.answer(&mut modes, &answer(false, SseResultOnly))
                .alert
                .is_none()
        );
        let strict = Detectors {
            errors_decide_mode: true,
        };
        let alert = strict.answer(&mut modes, &answer(true, Json)).alert;
        assert!(matches!(
            alert,
            Some(AlertKind::ContentTypeDivergence(d))
                if d.reason == DivergenceReason::ModeContradiction
                    && d.also == vec![DivergenceReason::StreamingNegotiated]
        ));
    }

    #[test]
    fn empty_reasons() {
        assert_eq!(
            empty_result_reason(StreamContent::default()),
            EmptyReason::NoEvents
        );
        assert_eq!(
            empty_result_reason(StreamContent {
                items: 2,
                messages: 0,
                ..StreamContent::default()
            }),
            EmptyReason::OnlyPriming
        );
        assert_eq!(
            empty_result_reason(StreamContent {
                items: 2,
                messages: 1,
                ..StreamContent::default()
            }),
            EmptyReason::OnlyNotifications
        );
    }
}
