//! The session layer's lasting state as plain data, so that an adapter can keep it across a
//! restart (a snapshot file) and hand it back: sessions' and lineages' baselines, handshake
//! sequence numbers, response-mode state, modern declarations, discover results and records
//! of ended sessions. Never bodies, arguments or results; nothing in flight.

use super::modern::ParamHeader;
use super::session::{CapsRecord, EraState, MethodDeclarations, Session, SessionKey};
use crate::model::Era;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The snapshot format's version: a snapshot of another version is refused, not guessed at,
/// except older files read with what they keep under older encodings dropped
/// ([`StateSnapshot::upgrade`]). Version 3 takes route buckets from XXH3-64
/// (`Identities::route_bucket`), version 2 took them from SHA-256; version 2 keeps digests
/// as XXH3-64 (`lasting_digest`), version 1 kept them as the table hasher's, which nothing
/// can compute again. Fleet store lineage records of another version are ignored (session
/// records carry no version: their route buckets are named apart, see
/// [`SessionEntry::route`]).
pub const SNAPSHOT_VERSION: u32 = 3;

/// The oldest version read (without its digests and route buckets).
pub const SNAPSHOT_VERSION_1: u32 = 1;

/// The version whose route buckets were SHA-256, written as `route` and `lineage_route`: its
/// files are read without them.
pub const SNAPSHOT_VERSION_2: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound(deserialize = "D: serde::de::DeserializeOwned"))]
pub struct StateSnapshot<D> {
    pub v: u32,
    pub sessions: Vec<SessionEntry<D>>,
    pub ended: Vec<EndedEntry>,
}

impl<D> Default for StateSnapshot<D> {
    fn default() -> Self {
        StateSnapshot {
            v: SNAPSHOT_VERSION,
            sessions: Vec::new(),
            ended: Vec::new(),
        }
    }
}

impl<D: Default> StateSnapshot<D> {
    /// Whether a file of version `v` can be read ([`StateSnapshot::upgrade`] makes it current).
    pub fn reads_version(v: u32) -> bool {
        (SNAPSHOT_VERSION_1..=SNAPSHOT_VERSION).contains(&v)
    }

    /// An older snapshot made current: what it keeps in an encoding this version no longer
    /// computes goes, the rest stays.
    /// - Route buckets (before version 3): read as absent, since they were written under
    ///   other names (see [`SessionEntry::route`]). A session's record goes where its id
    ///   routes, a lineage's to every shard, and each takes its bucket again from its next
    ///   request.
    /// - Digests (version 1): content-type mode record keys, declarations seen and logged, a
    ///   server's discover answer came from a hasher nothing can compute again. Baselines,
    ///   handshake counts, lineage records and the rest stay; detection learns the modes
    ///   again from the next answers (an answer before that cannot diverge from them).
    pub fn upgrade(&mut self) {
        if self.v == SNAPSHOT_VERSION_1 {
            self.forget_version_1_digests();
        }
        self.v = SNAPSHOT_VERSION;
    }

    fn forget_version_1_digests(&mut self) {
        for entry in &mut self.sessions {
            entry.detection = D::default();
            if let Some(era) = entry.era_state.as_mut() {
                era.logged.clear();
                era.discover_digest = None;
                for d in &mut era.declarations {
                    d.seen.clear();
                    d.first_digest = 0;
                    d.last_digest = 0;
                }
            }
        }
    }
}

impl<D> StateSnapshot<D> {
    /// Adds another snapshot's entries (one per pipeline worker).
    pub fn merge(&mut self, other: StateSnapshot<D>) {
        self.sessions.extend(other.sessions);
        self.ended.extend(other.ended);
    }

    /// Keeps only the entries of servers `keep` says yes to (one worker's share).
    pub fn split_off(&mut self, keep: impl Fn(SocketAddr) -> bool) -> StateSnapshot<D> {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sessions)
            .into_iter()
            .partition(|e| keep(e.server));
        self.sessions = rest;
        let (ended_mine, ended_rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ended)
            .into_iter()
            .partition(|e| keep(e.server));
        self.ended = ended_rest;
        StateSnapshot {
            v: self.v,
            sessions: mine,
            ended: ended_mine,
        }
    }
}

/// One entry of the session table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionEntry<D> {
    pub server: SocketAddr,
    /// The table key: a session id, or the internal key of a lineage, server or endpoint.
    pub key: String,
    pub client: SocketAddr,
    pub last_seen_ns: i64,
    pub lineage_id: Option<Box<str>>,
    pub era: Era,
    pub protocol_version: Option<Box<str>>,
    pub handshakes: u32,
    /// `Session::capability_changes`; absent from older snapshots.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub capability_changes: u32,
    pub baseline: Option<CapsRecord>,
    pub streaming_negotiated: bool,
    pub requests: u64,
    pub alerts: u32,
    pub detection: D,
    pub era_state: Option<EraRecord>,
    /// Fleet mode: the version of this record in the shared store (0: never stored).
    #[serde(default)]
    pub shared_version: u64,
    /// Where session shards keep it (`Session::route`); absent from older snapshots.
    /// Written as `bucket`: version 2 wrote SHA-256 buckets as `route`, and a record of a
    /// version 2 host (a file, or the fleet store, whose session records carry no version)
    /// must read as having none rather than one this version's router never names.
    #[serde(rename = "bucket", default, skip_serializing_if = "Option::is_none")]
    pub route: Option<u16>,
    /// Where its lineage's records are kept (`Session::lineage_route`); written as
    /// `lineage_bucket` (see `route`).
    #[serde(
        rename = "lineage_bucket",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub lineage_route: Option<u16>,
}

impl<D: Clone> SessionEntry<D> {
    /// The lasting state of session (or lineage, server, endpoint) entry `key`.
    pub fn of(key: &SessionKey, s: &Session<D>) -> Self {
        SessionEntry {
            server: key.0,
            key: key.1.clone(),
            client: s.client,
            last_seen_ns: s.last_seen.0,
            lineage_id: s.lineage_id.clone(),
            era: s.era,
            protocol_version: s.protocol_version.clone(),
            handshakes: s.handshakes,
            capability_changes: s.capability_changes,
            baseline: s.baseline.clone(),
            streaming_negotiated: s.streaming_negotiated,
            requests: s.requests,
            alerts: s.alerts,
            detection: s.detection.clone(),
            era_state: s.ext.as_deref().map(EraRecord::from),
            shared_version: s.shared_version,
            route: s.route,
            lineage_route: s.lineage_route,
        }
    }
}

/// What of [`EraState`] outlives a restart (not failures or waiting MRTR results: those are
/// about the moment).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EraRecord {
    pub declarations: Vec<MethodDeclarations>,
    pub logged: Vec<u64>,
    pub declaration_seq: u32,
    pub modern_ok: bool,
    pub discover_digest: Option<u64>,
    pub first_versions: Option<Vec<Box<str>>>,
    pub alerted_versions: Vec<Box<str>>,
    pub alerted_paths: Vec<Vec<String>>,
    pub param_tools: Vec<(Box<str>, Vec<ParamHeader>)>,
}

impl From<&EraState> for EraRecord {
    fn from(e: &EraState) -> Self {
        EraRecord {
            declarations: e.declarations.clone(),
            logged: e.logged.clone(),
            declaration_seq: e.declaration_seq,
            modern_ok: e.modern_ok,
            discover_digest: e.discover_digest,
            first_versions: e.first_versions.clone(),
            alerted_versions: e.alerted_versions.clone(),
            alerted_paths: e.alerted_paths.clone(),
            param_tools: e.param_tools.clone(),
        }
    }
}

impl EraRecord {
    /// Within the bounds an [`EraState`] keeps, whoever wrote it: a snapshot or a fleet store
    /// record from elsewhere may hold lists of any length, and each request compares against
    /// them (a discover result's versions against every alerted one: quadratic in the record).
    pub fn bounded(mut self) -> Self {
        use super::caps::{CapPaths, MAX_PATHS};
        use super::session::{MAX_DECLARED_METHODS, MAX_LOGGED_SETS, MAX_SETS_PER_METHOD};
        // A path list holds at most what one capability object gives (`caps::bounded_paths`).
        let cut_paths = |paths: &mut CapPaths| {
            if paths.len() > MAX_PATHS {
                *paths = paths.iter().take(MAX_PATHS).cloned().collect();
            }
        };
        self.declarations.truncate(MAX_DECLARED_METHODS);
        for d in &mut self.declarations {
            d.seen.truncate(MAX_SETS_PER_METHOD);
            d.alerted.truncate(MAX_SETS_PER_METHOD);
            for removed in &mut d.alerted {
                removed.truncate(MAX_PATHS);
            }
            cut_paths(&mut d.first_paths);
            cut_paths(&mut d.last_paths);
        }
        self.logged.truncate(MAX_LOGGED_SETS);
        if let Some(v) = self.first_versions.as_mut() {
            v.truncate(super::MAX_SUPPORTED_VERSIONS);
        }
        self.alerted_versions.truncate(MAX_LOGGED_SETS);
        self.alerted_paths.truncate(MAX_LOGGED_SETS);
        for removed in &mut self.alerted_paths {
            removed.truncate(MAX_PATHS);
        }
        self.param_tools.truncate(super::modern::MAX_PARAM_TOOLS);
        for (_, params) in &mut self.param_tools {
            params.truncate(super::modern::MAX_PARAMS_PER_TOOL);
        }
        self
    }
}

impl From<EraRecord> for EraState {
    fn from(r: EraRecord) -> Self {
        // Bounds hold for a snapshot from elsewhere too.
        let r = r.bounded();
        EraState {
            declarations: r.declarations,
            logged: r.logged,
            declaration_seq: r.declaration_seq,
            modern_ok: r.modern_ok,
            discover_digest: r.discover_digest,
            first_versions: r.first_versions,
            alerted_versions: r.alerted_versions,
            alerted_paths: r.alerted_paths,
            param_tools: r.param_tools,
            ..EraState::default()
        }
    }
}

/// A record of an ended session, for lineage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndedEntry {
    pub server: SocketAddr,
    pub lineage_id: Box<str>,
    pub ts_ns: i64,
    pub session_id: String,
    pub baseline: Option<CapsRecord>,
    /// Where session shards keep it (its lineage's client's route); absent from older
    /// snapshots. Written as `bucket` (see [`SessionEntry::route`]).
    #[serde(rename = "bucket", default, skip_serializing_if = "Option::is_none")]
    pub route: Option<u16>,
}

/// A lineage's record in the fleet store: its entry (modern declarations, a stateless
/// client's handshakes and modes) and its latest ended session (a predecessor for the next).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound(deserialize = "D: serde::de::DeserializeOwned"))]
pub struct LineageShare<D> {
    pub v: u32,
    pub shared_version: u64,
    pub entry: Option<SessionEntry<D>>,
    pub ended: Option<EndedEntry>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    pub sessions: usize,
    pub ended: usize,
    /// Entries older than their time to live, dropped.
    pub expired: usize,
    /// Entries refused: a bad key or a table that is full.
    pub refused: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::session::{MAX_LOGGED_SETS, MAX_SETS_PER_METHOD};

    /// A record from elsewhere with lists far past the bounds (a tampered fleet store record,
    /// a hand-made snapshot) is cut to them, installed or merged: a discover result compares
    /// every first version against every alerted one.
    #[test]
    fn era_records_from_elsewhere_are_cut_to_the_bounds() {
        let many = |n: usize| {
            (0..n)
                .map(|i| i.to_string().into())
                .collect::<Vec<Box<str>>>()
        };
        // Path lists longer than any capability object gives (512 paths).
        let paths: Vec<String> = (0..2_000).map(|i| format!("p{i}")).collect();
        let mut alerted = vec![vec!["a".to_string()]; 10_000];
        alerted[0] = paths.clone();
        let declaration: MethodDeclarations = serde_json::from_value(serde_json::json!({
            "method": "tools/list", "first_paths": paths, "first_caps": "{}", "first_digest": 1,
            "last_digest": 1, "last_paths": paths, "seen": (0..10_000).collect::<Vec<u64>>(),
            "multiplexed": false, "alerted": alerted,
        }))
        .expect("declaration");
        let mut alerted_paths = vec![vec!["a".to_string()]; 10_000];
        alerted_paths[0] = paths.clone();
        let record = EraRecord {
            declarations: vec![declaration; 100],
            logged: (0..10_000).collect(),
            first_versions: Some(many(10_000)),
            alerted_versions: many(10_000),
            alerted_paths,
            ..EraRecord::default()
        };
        let check = |e: &EraState| {
            assert!(e.declarations.len() <= super::super::session::MAX_DECLARED_METHODS);
            for d in &e.declarations {
                assert!(
                    d.seen.len() <= MAX_SETS_PER_METHOD && d.alerted.len() <= MAX_SETS_PER_METHOD
                );
                assert!(d.first_paths.len() <= 512 && d.last_paths.len() <= 512);
                assert!(d.alerted.iter().all(|removed| removed.len() <= 512));
            }
            assert!(e.alerted_paths.iter().all(|removed| removed.len() <= 512));
            assert!(e.logged.len() <= MAX_LOGGED_SETS);
            assert!(e.first_versions.as_ref().is_some_and(|v| v.len() <= 64));
            assert!(e.alerted_versions.len() <= MAX_LOGGED_SETS);
            assert!(e.alerted_paths.len() <= MAX_LOGGED_SETS);
        };
        check(&EraState::from(record.clone()));
        let mut merged = EraState::default();
        merged.merge(record);
        check(&merged);
    }
}
