//! The sans-IO pipeline: packets and their timestamps in, outputs out.
//!
//! decode → flow table + reassembly → HTTP → session layer (JSON-RPC, MCP, detectors).
//! Replay and live capture drive this same type, so they behave identically.

use crate::decode::{self, Decoded, SkipReason, TcpSegment};
use crate::detect::{Detectors, ModeTracker};
use crate::flow_unit::{FlowPhase, FlowUnit, PacketAt};
use crate::http::{BodyEnd, Connection, HttpEvent, Spent};
use crate::mcp::{FlowCtx, SessionLimits, Tracker};
use crate::model::Output;
use crate::model::{FlowCloseReason, FlowEvictReason, Telemetry, Timestamp};
use crate::reassembly::{GapReason, PushReport, Reassembler, StreamConsumer};
use crate::table_hash::HashMap;
use crate::usage::SharedUsage;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

pub use crate::limits::Limits;

/// One piece of an HTTP conversation, for [`Pipeline::handle_http`]: what a gateway that
/// terminates HTTP itself sees. Bodies come without transfer coding; every request and
/// response ends with its `…End`, except interim (1xx) responses.
#[derive(Debug, Clone, Copy)]
pub enum HttpMessage<'a> {
    RequestHead {
        method: &'a str,
        path: &'a str,
        headers: &'a [(&'a str, &'a [u8])],
    },
    RequestBody(&'a [u8]),
    RequestEnd,
    ResponseHead {
        status: u16,
        headers: &'a [(&'a str, &'a [u8])],
    },
    ResponseBody(&'a [u8]),
    ResponseEnd,
    /// The connection closed: a response body still open ends here (read until close).
    Closed,
    /// The client closed its side (a FIN) while the server's side stays open: the answer still
    /// coming and those still owed are ones it stopped waiting for (the 2026-07-28 revision
    /// makes closing a response stream the request's cancellation). `Closed` follows.
    ClientClosed,
}

/// Packet-level counters (kept as plain numbers: they are bumped on the hot path).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PacketStats {
    pub packets: u64,
    pub bytes: u64,
    pub skipped_unsupported_link: u64,
    pub skipped_not_ip: u64,
    pub skipped_not_tcp: u64,
    pub skipped_ip_fragment: u64,
    pub skipped_malformed: u64,
    /// TCP segments the capture's snaplen cut short (their missing bytes become a gap).
    pub truncated_segments: u64,
}

impl PacketStats {
    fn count_skip(&mut self, reason: SkipReason) {
        let slot = match reason {
            SkipReason::UnsupportedLink => &mut self.skipped_unsupported_link,
            SkipReason::NotIp => &mut self.skipped_not_ip,
            SkipReason::NotTcp => &mut self.skipped_not_tcp,
            SkipReason::IpFragment => &mut self.skipped_ip_fragment,
            SkipReason::Malformed => &mut self.skipped_malformed,
        };
        *slot += 1;
    }

    /// Adds another pipeline's counts (one pipeline per worker).
    pub fn merge(&mut self, other: &PacketStats) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.skipped_unsupported_link += other.skipped_unsupported_link;
        self.skipped_not_ip += other.skipped_not_ip;
        self.skipped_not_tcp += other.skipped_not_tcp;
        self.skipped_ip_fragment += other.skipped_ip_fragment;
        self.skipped_malformed += other.skipped_malformed;
        self.truncated_segments += other.truncated_segments;
    }

    /// (reason label, count) pairs for metrics and the summary.
    pub fn skipped(&self) -> [(&'static str, u64); 5] {
        [
            (
                SkipReason::UnsupportedLink.as_str(),
                self.skipped_unsupported_link,
            ),
            (SkipReason::NotIp.as_str(), self.skipped_not_ip),
            (SkipReason::NotTcp.as_str(), self.skipped_not_tcp),
            (SkipReason::IpFragment.as_str(), self.skipped_ip_fragment),
            (SkipReason::Malformed.as_str(), self.skipped_malformed),
        ]
    }
}

/// Canonical flow key: the lower endpoint first, so both directions find the same flow.
/// Both endpoints of a connection, the lower first.
/// The third field packs two IPv4 endpoints into one integer (0 for other pairs), so that the
/// order, the hash and the comparisons of a flow lookup on every packet are integer ones.
#[derive(Debug, Clone, Copy)]
struct FlowKey(SocketAddr, SocketAddr, u128);

/// Set in a packed key: it holds two IPv4 endpoints.
const PACKED_V4: u128 = 1 << 127;

impl FlowKey {
    #[inline]
    fn of(a: SocketAddr, b: SocketAddr) -> FlowKey {
        match (a, b) {
            (SocketAddr::V4(x), SocketAddr::V4(y)) => {
                // Ordered as `SocketAddr` orders them: address, then port.
                let (kx, ky) = (endpoint_bits(&x), endpoint_bits(&y));
                let (lo, hi, klo, khi) = if kx <= ky {
                    (a, b, kx, ky)
                } else {
                    (b, a, ky, kx)
                };
                FlowKey(
                    lo,
                    hi,
                    PACKED_V4 | (u128::from(klo) << 48) | u128::from(khi),
                )
            }
            _ if a <= b => FlowKey(a, b, 0),
            _ => FlowKey(b, a, 0),
        }
    }
}

/// An IPv4 endpoint as 48 bits: the address above the port.
#[inline]
fn endpoint_bits(e: &std::net::SocketAddrV4) -> u64 {
    (u64::from(u32::from(*e.ip())) << 16) | u64::from(e.port())
}

impl PartialEq for FlowKey {
    #[inline]
    fn eq(&self, other: &FlowKey) -> bool {
        self.2 == other.2 && (self.2 != 0 || (self.0 == other.0 && self.1 == other.1))
    }
}

impl Eq for FlowKey {}

/// Hashed as packed integers (see [`hash_endpoint_pair`]).
impl Hash for FlowKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        if self.2 != 0 {
            state.write_u128(self.2);
        } else {
            hash_endpoint_pair(self.0, self.1, state);
        }
    }
}

/// Hashes two endpoints as packed integers: the derived hash of two `SocketAddr`s is a dozen
/// calls into the hasher, on every packet; two IPv4 endpoints are one 128-bit write (foldhash
/// mixes that at once, where smaller writes are first shifted into a buffer). Equal pairs hash
/// equally (a v6 scope id only refines equality). For flow tables keyed by a connection's
/// endpoints.
#[inline]
pub fn hash_endpoint_pair<H: Hasher>(a: SocketAddr, b: SocketAddr, state: &mut H) {
    let ports = (u32::from(a.port()) << 16) | u32::from(b.port());
    match (a.ip(), b.ip()) {
        (IpAddr::V4(x), IpAddr::V4(y)) => {
            let ips = (u64::from(u32::from(x)) << 32) | u64::from(u32::from(y));
            state.write_u128((u128::from(ips) << 64) | u128::from(ports));
        }
        (x, y) => {
            state.write_u128(ip_bits(x));
            state.write_u128(ip_bits(y));
            state.write_u32(ports);
        }
    }
}

fn ip_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

struct Flow {
    id: u64,
    key: FlowKey,
    /// Index 0 carries bytes from `key.0` to `key.1`; index 1 the other way.
    streams: [Reassembler; 2],
    http: Connection,
    last_seen: Timestamp,
    /// Buffered bytes last charged to the pipeline's memory account.
    charged: usize,
    /// The half whose SYN opened the flow: the client's, before any HTTP says so.
    syn_half: Option<u8>,
    /// Segments held back per half because they acknowledge bytes of the other half the
    /// capture has not delivered yet (taps merged with clock skew): TCP order, not timestamps,
    /// says what came first. Boxed: almost every flow holds none.
    held: Option<Box<Held>>,
}

/// Segments of a flow waiting for the other direction to catch up.
#[derive(Default)]
struct Held {
    halves: [VecDeque<HeldSegment>; 2],
    bytes: usize,
}

/// An owned copy of a held segment.
struct HeldSegment {
    ts: Timestamp,
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: crate::decode::TcpFlags,
    payload: Vec<u8>,
    truncated: bool,
}

impl HeldSegment {
    fn of(ts: Timestamp, seg: &TcpSegment<'_>) -> HeldSegment {
        HeldSegment {
            ts,
            src: seg.src,
            dst: seg.dst,
            seq: seg.seq,
            ack: seg.ack,
            flags: seg.flags,
            payload: seg.payload.to_vec(),
            truncated: seg.truncated,
        }
    }

    fn view(&self) -> TcpSegment<'_> {
        TcpSegment {
            src: self.src,
            dst: self.dst,
            seq: self.seq,
            ack: self.ack,
            flags: self.flags,
            payload: &self.payload,
            truncated: self.truncated,
        }
    }
}

/// What one tracked flow costs besides its buffers: the boxed struct (plus allocator
/// rounding) and its hash-table slot, counted twice because the table keeps up to half of its
/// buckets free (power-of-two capacity, load at most 7/8). Flows are boxed so that the free
/// buckets hold a pointer, not a whole flow.
/// Plus its entry in the eviction queue, counted twice for the stale entries the queue may
/// hold before it is compacted.
const FLOW_OVERHEAD: usize = std::mem::size_of::<Flow>()
    + 16
    + 2 * (std::mem::size_of::<(FlowKey, Box<Flow>)>() + 1)
    + 2 * std::mem::size_of::<QueuedFlow>();

/// A flow in the eviction queue: its id (a key can be reused by a later flow) and its
/// `last_seen` when it was queued.
#[derive(Debug, Clone, Copy)]
struct QueuedFlow {
    key: FlowKey,
    id: u64,
    seen: Timestamp,
}

/// The share of the memory budget sessions may take, so that flows always keep room.
fn session_budget(limits: &Limits) -> usize {
    limits.memory_budget_bytes / 4 * 3
}

impl Flow {
    fn buffered(&self) -> usize {
        self.streams[0].buffered_bytes()
            + self.streams[1].buffered_bytes()
            + self.http.buffered_bytes()
            + self.held.as_ref().map_or(0, |h| h.bytes)
    }

    /// The first held segment to process now: the other direction has caught up with it, or
    /// it has waited [`MAX_HOLD_NS`] (the bytes it acknowledges were lost, not delayed).
    fn releasable(&self, now: Timestamp) -> Option<usize> {
        let held = self.held.as_ref()?;
        (0..2).find(|&half| {
            held.halves[half].front().is_some_and(|seg| {
                !self.streams[1 - half].acks_undelivered(seg.ack)
                    || now.0.saturating_sub(seg.ts.0) > MAX_HOLD_NS
            })
        })
    }

    /// Whether a segment of half `half` costing `cost` may wait for the other direction: not
    /// while the other direction waits itself (each would wait for the other), not beyond the
    /// byte and count bounds, not when the oldest held segment has waited too long already.
    fn can_hold(&self, half: usize, now: Timestamp, cost: usize, max_bytes: usize) -> bool {
        let Some(held) = self.held.as_ref() else {
            return cost <= max_bytes;
        };
        let oldest = held
            .halves
            .iter()
            .filter_map(|q| q.front())
            .map(|s| s.ts)
            .min();
        held.halves[1 - half].is_empty()
            && held.halves[half].len() < MAX_HELD_SEGMENTS
            && held.bytes + cost <= max_bytes
            && oldest.is_none_or(|t| now.0.saturating_sub(t.0) <= MAX_HOLD_NS)
    }

    fn take_held(&mut self, half: usize) -> Option<HeldSegment> {
        let held = self.held.as_mut()?;
        let seg = held.halves[half].pop_front()?;
        held.bytes -= HELD_OVERHEAD + seg.payload.len();
        if held.halves.iter().all(VecDeque::is_empty) {
            self.held = None;
        }
        Some(seg)
    }

    /// Every held segment, both halves interleaved by time.
    fn take_all_held(&mut self) -> Vec<HeldSegment> {
        let Some(held) = self.held.take() else {
            return Vec::new();
        };
        let [a, b] = held.halves;
        let mut all: Vec<HeldSegment> = a.into_iter().chain(b).collect();
        all.sort_by_key(|s| s.ts);
        all
    }

    /// The server of a connection that showed undecodable bytes in half `half`: the side the
    /// SYN or the first request did not come from; failing both, the receiver of those bytes
    /// (a TLS ClientHello goes to the server).
    fn server_seen_from(&self, half: usize) -> SocketAddr {
        let client = self
            .http
            .client_half()
            .or(self.syn_half.map(usize::from))
            .unwrap_or(half);
        if client == 0 { self.key.1 } else { self.key.0 }
    }

    fn ctx(&self) -> Option<FlowCtx> {
        let client_half = self.http.client_half()?;
        let (client, server) = if client_half == 0 {
            (self.key.0, self.key.1)
        } else {
            (self.key.1, self.key.0)
        };
        Some(FlowCtx {
            flow: self.id,
            client,
            server,
        })
    }
}

/// Why a flow leaves the table; decides how its open messages end.
#[derive(Debug, Clone, Copy)]
enum Removal {
    Fin,
    Rst,
    Idle,
    Evicted(FlowEvictReason),
    CaptureEnd,
}

impl Removal {
    /// A closed connection ends its bodies; anything else leaves them unfinished.
    fn body_end(self) -> BodyEnd {
        match self {
            Removal::Fin | Removal::Rst => BodyEnd::Aborted,
            _ => BodyEnd::Unfinished,
        }
    }

    /// Holes left at a close or a timeout are declared as gaps; evictions just drop.
    fn gap(self) -> Option<GapReason> {
        match self {
            Removal::Fin | Removal::Rst => Some(GapReason::Closed),
            Removal::Idle => Some(GapReason::Timeout),
            Removal::Evicted(_) | Removal::CaptureEnd => None,
        }
    }
}

/// Feeds reassembled bytes of one direction into the HTTP parser.
struct HttpFeed<'a> {
    conn: &'a mut Connection,
    half: usize,
    events: &'a mut Vec<HttpEvent>,
}

impl StreamConsumer for HttpFeed<'_> {
    fn on_data(&mut self, data: &[u8]) {
        self.conn.on_data(self.half, data, self.events);
    }
    fn on_gap(&mut self, _len: u64) {
        self.conn.on_gap(self.half, self.events);
    }
}

/// What a pipeline costs beyond what it tracks: the free pages its thread's allocator keeps
/// after evictions, and its tables' spare capacity (measured under the flood with four
/// workers sharing one budget: 5-10 MiB each). A 32nd of the budget, at most this, charged to
/// the session share.
const PIPELINE_SLACK: usize = 8 << 20;

/// Longest a segment waits for the bytes of the other direction it acknowledges: skew
/// between merged taps is milliseconds; beyond this the bytes were lost, not delayed.
const MAX_HOLD_NS: i64 = 1_000_000_000;
/// Most segments one flow holds at once.
const MAX_HELD_SEGMENTS: usize = 256;
/// What a held segment costs besides its payload (its copy's header and allocation).
const HELD_OVERHEAD: usize = std::mem::size_of::<HeldSegment>() + 32;

/// Packets in a row, all far ahead of the clock, that make it follow them.
const JUMP_CONFIRMATIONS: usize = 3;

/// How often (in packet time) idle flows and sessions are swept.
const SWEEP_INTERVAL_NS: i64 = 1_000_000_000;

/// The packet clock: the latest packet time seen, never backwards, and not moved by a lone
/// far-future timestamp; and when the last sweep was. A pipeline has one, and so does a
/// [`crate::flow_shard::FlowDispatcher`] for the flow shards it feeds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PacketClock {
    pub(crate) now: Timestamp,
    /// Packets that jumped ahead of the clock, not judged yet: how many, and their times.
    pending: (usize, [i64; JUMP_CONFIRMATIONS]),
    pub(crate) last_sweep: Timestamp,
}

impl Default for PacketClock {
    fn default() -> Self {
        PacketClock {
            now: Timestamp(i64::MIN),
            pending: (0, [i64::MIN; JUMP_CONFIRMATIONS]),
            last_sweep: Timestamp(i64::MIN),
        }
    }
}

impl PacketClock {
    /// Moves the clock to `ts`. A time more than `jump_ns` ahead is ignored, unless
    /// [`JUMP_CONFIRMATIONS`] packets in a row jump and go on forward (a real gap in a rotated
    /// set of files, a link quiet for a while): then the clock follows. Ignored packets are
    /// counted once time comes back from them (see `observe_jump`).
    #[inline]
    pub(crate) fn observe(&mut self, ts: Timestamp, jump_ns: i64, out: &mut Vec<Output>) {
        if ts <= self.now {
            return;
        }
        // Nearly every packet: a little ahead of the clock, no jump pending.
        if self.pending.0 == 0 && ts.0.saturating_sub(self.now.0) <= jump_ns {
            self.now = ts;
            return;
        }
        self.observe_jump(ts, jump_ns, out);
    }

    /// A packet far ahead of the clock, or one after such packets. Those are judged only once
    /// it is known what follows them, so that a quiet link (a gateway idle for minutes) is no
    /// jump: a packet that time does not come back from (no later packet is stamped more than
    /// `jump` before it) is right. Once [`JUMP_CONFIRMATIONS`] are pending, none contradicted,
    /// the clock follows to the earliest (one [`Telemetry::ClockJump`] `followed`), and those
    /// still far ahead of it stay pending: a wrong stamp among a burst after a gap does not
    /// carry the clock along. A packet that time comes back from is counted as refused. Those
    /// the input ends with are left unjudged: every packet was read, and the end ends every
    /// flow and session whatever the clock says.
    #[cold]
    fn observe_jump(&mut self, ts: Timestamp, jump: i64, out: &mut Vec<Output>) {
        let ahead = ts.0.saturating_sub(self.now.0);
        if self.now.0 == i64::MIN || ahead <= jump {
            // Back near the clock: the packets that jumped were stamped wrong.
            self.refuse_where(|_| true, out);
            self.now = ts;
            return;
        }
        // Time came back from these: they were stamped wrong.
        self.refuse_where(|t| ts.0 < t.saturating_sub(jump), out);
        let (count, times) = &mut self.pending;
        if let Some(slot) = times.get_mut(*count) {
            *slot = ts.0;
            *count += 1;
        }
        if self.pending.0 < JUMP_CONFIRMATIONS {
            return;
        }
        let earliest = self.pending.1.iter().copied().min().unwrap_or(ts.0);
        out.push(Output::Telemetry(Telemetry::ClockJump {
            ahead_ns: earliest.saturating_sub(self.now.0),
            followed: true,
        }));
        // As time passing to the earliest: never back, and those it catches up with were right.
        self.advance(Timestamp(earliest), jump);
    }

    /// Time passes without packets (a quiet live link): the clock moves to `ts` (never back),
    /// and pending packets it caught up with were stamped right.
    pub(crate) fn advance(&mut self, ts: Timestamp, jump: i64) {
        if ts > self.now {
            self.now = ts;
        }
        let now = self.now.0;
        let (count, times) = &mut self.pending;
        let mut kept = 0;
        for at in 0..*count {
            let t = times[at];
            if t.saturating_sub(now) > jump {
                times[kept] = t;
                kept += 1;
            }
        }
        *count = kept;
    }

    /// Counts the pending packets `wrong` picks as refused (each by how far ahead it was) and
    /// forgets them.
    fn refuse_where(&mut self, wrong: impl Fn(i64) -> bool, out: &mut Vec<Output>) {
        let now = self.now.0;
        let (count, times) = &mut self.pending;
        let mut kept = 0;
        for at in 0..*count {
            let t = times[at];
            if wrong(t) {
                out.push(Output::Telemetry(Telemetry::ClockJump {
                    ahead_ns: t.saturating_sub(now),
                    followed: false,
                }));
            } else {
                times[kept] = t;
                kept += 1;
            }
        }
        *count = kept;
    }

    /// Whether a sweep is due: once per [`SWEEP_INTERVAL_NS`] of packet time.
    #[inline]
    pub(crate) fn sweep_due(&self) -> bool {
        self.now.0.saturating_sub(self.last_sweep.0) >= SWEEP_INTERVAL_NS
    }
}

/// How a pipeline analyses what it reads: the detector settings and who is who.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    pub detectors: Detectors,
    pub identities: crate::mcp::identity::Identities,
}

impl From<Detectors> for Analysis {
    fn from(detectors: Detectors) -> Self {
        Analysis {
            detectors,
            identities: Default::default(),
        }
    }
}

/// The core's driver: packets ([`Pipeline::handle_packet`]) or HTTP messages
/// ([`Pipeline::handle_http`]) with their timestamps in, [`Output`]s out. Time only advances
/// with the timestamps given (and [`Pipeline::advance_time`]); call [`Pipeline::finish`] at the
/// end of the input.
pub struct Pipeline {
    limits: Limits,
    flows: HashMap<FlowKey, Box<Flow>>,
    next_flow_id: u64,
    tracker: Tracker<Detectors>,
    stats: PacketStats,
    clock: PacketClock,
    http_events: Vec<HttpEvent>,
    /// Sum of `Flow::charged` over all flows.
    buffered: usize,
    /// Totals that the limits apply to: this pipeline's alone, or shared with the other
    /// workers of the process.
    usage: Arc<SharedUsage>,
    /// Flow bytes (overhead and buffers) this pipeline last added to `usage`.
    published_flow_bytes: usize,
    /// A removed flow's held segments are being replayed (see [`Pipeline::fit_budget`]).
    replaying_held: bool,
    /// Charged for what the pipeline costs beyond what it tracks (see [`PIPELINE_SLACK`]).
    slack: usize,
    /// Split off (see [`Pipeline::split`]): what the session layer is to do, in order, instead
    /// of calling it.
    staged: Option<Vec<Staged>>,
    /// Bytes staged since the last [`Pipeline::take_staged`] (counted in
    /// [`SharedUsage::staged_bytes`] from the hand-over until the session stage has done them).
    staged_bytes: usize,
    /// Of `staged_bytes`, those not yet added to [`SharedUsage::staged_bytes`]: added at the
    /// hand-over, once per batch rather than once per step.
    staged_unpublished: usize,
    /// Split: the session side's bytes as last read, which this flow side's budget counts,
    /// and the budget checks since (see [`Pipeline::memory_total`]).
    session_bytes_seen: usize,
    checks_since_session_read: u32,
    /// Flows in the order they were queued, oldest first: every flow once, plus stale entries
    /// of flows since removed. Eviction takes flows from the front, re-queueing those seen since
    /// they were queued ("second chance"), so it costs O(1) per flow amortised instead of a scan
    /// of the table: a SYN flood must not slow the pipeline down.
    eviction_queue: VecDeque<QueuedFlow>,
    /// Flow shard: where each unit of the staged steps ends (see [`Pipeline::shard_packet`]).
    flow_marks: Vec<(usize, FlowUnit)>,
    /// Flow shard: the flows it may hold itself, its share of `max_flows` (see
    /// [`Pipeline::split_flows`]).
    flow_share: Option<usize>,
}

impl Pipeline {
    /// A pipeline within `limits`. Sessions count against the memory budget and may take at
    /// most 3/4 of it.
    pub fn new(limits: Limits) -> Self {
        Self::with_usage(limits, Arc::default())
    }

    /// A pipeline whose limits (`max_flows`, `max_sessions`, the memory budget) are totals over
    /// every pipeline that shares `usage`: one per worker thread of a process. Over a total,
    /// a pipeline evicts its own least recently seen flows and sessions.
    pub fn with_usage(limits: Limits, usage: Arc<SharedUsage>) -> Self {
        Self::configured(limits, Detectors::default(), usage)
    }

    /// A pipeline with explicit detector settings (the `[detect]` configuration) and
    /// identities (`[servers]`, `[identity]`), its limits totals over `usage` as in
    /// [`Pipeline::with_usage`].
    pub fn configured(
        limits: Limits,
        analysis: impl Into<Analysis>,
        usage: Arc<SharedUsage>,
    ) -> Self {
        let Analysis {
            detectors,
            identities,
        } = analysis.into();
        let session = SessionLimits {
            max_session_bytes: session_budget(&limits).min(limits.session.max_session_bytes),
            ..limits.session
        };
        // Charged to the session share: sessions then give way first, flows keep their room.
        let slack = (limits.memory_budget_bytes / 32).min(PIPELINE_SLACK);
        usage.republish_session_bytes(0, slack);
        Pipeline {
            limits,
            flows: HashMap::default(),
            next_flow_id: 0,
            tracker: {
                let mut t = Tracker::with_usage(session, detectors, usage.clone());
                t.set_identities(identities);
                t
            },
            stats: PacketStats::default(),
            clock: PacketClock::default(),
            http_events: Vec::new(),
            buffered: 0,
            usage,
            published_flow_bytes: 0,
            replaying_held: false,
            slack,
            staged: None,
            staged_bytes: 0,
            staged_unpublished: 0,
            session_bytes_seen: 0,
            checks_since_session_read: 0,
            eviction_queue: VecDeque::new(),
            flow_marks: Vec::new(),
            flow_share: None,
        }
    }

    /// The flow layer and the session layer apart, for two threads: the [`Pipeline`] decodes,
    /// reassembles and parses HTTP, and instead of calling the session layer it stages what
    /// that layer is to do, with its own outputs in their places
    /// ([`Pipeline::take_staged`]); the [`SessionStage`] does it in that order. The outputs
    /// are those of one pipeline, in the same order; only where a memory limit is reached can
    /// the two differ (the session side sees the flows' memory a batch late, the flow side the
    /// sessions' up to 64 packets late, and at once near the budget).
    pub fn split(
        limits: Limits,
        analysis: impl Into<Analysis>,
        usage: Arc<SharedUsage>,
    ) -> (Pipeline, SessionStage) {
        let mut flows = Pipeline::configured(limits, analysis, usage.clone());
        // Never called: the flow side stages every session-layer call.
        let placeholder = Tracker::with_usage(
            SessionLimits {
                max_sessions: 1,
                ..limits.session
            },
            Detectors::default(),
            usage.clone(),
        );
        let tracker = std::mem::replace(&mut flows.tracker, placeholder);
        flows.staged = Some(Vec::new());
        // The session layer's thread has an allocator of its own: its slack too.
        let slack = flows.slack;
        usage.republish_session_bytes(0, slack);
        let sessions = SessionStage {
            tracker,
            usage,
            published_exchange_bytes: 0,
            staged_done: 0,
            slack,
        };
        (flows, sessions)
    }

    /// [`Pipeline::split`] with the session layer in `shards` stages (at least one), each a
    /// shard of its own thread's (see [`crate::shard`]). Limits and the budget stay those of
    /// one pipeline: the stages share `usage`.
    pub fn split_shards(
        limits: Limits,
        analysis: impl Into<Analysis>,
        usage: Arc<SharedUsage>,
        shards: usize,
    ) -> (Pipeline, Vec<SessionStage>) {
        let analysis = analysis.into();
        let (flows, first) = Pipeline::split(limits, analysis.clone(), usage.clone());
        let mut stages = vec![first];
        for _ in 1..shards {
            let Analysis {
                detectors,
                identities,
            } = analysis.clone();
            let mut tracker = Tracker::with_usage(flows.tracker_limits(), detectors, usage.clone());
            tracker.set_identities(identities);
            let slack = flows.slack;
            usage.republish_session_bytes(0, slack);
            stages.push(SessionStage {
                tracker,
                usage: usage.clone(),
                published_exchange_bytes: 0,
                staged_done: 0,
                slack,
            });
        }
        (flows, stages)
    }

    /// [`Pipeline::split_shards`] with the flow layer in `flow_shards` pipelines too (at least
    /// one), each fed its flows' packets by a [`crate::flow_shard::FlowDispatcher`] and merged
    /// back into one pipeline's staged steps by [`crate::flow_shard::FlowMerge`] (or, whole
    /// rounds at a time, [`crate::flow_shard::merge_rounds`]).
    pub fn split_flows(
        limits: Limits,
        analysis: impl Into<Analysis>,
        usage: Arc<SharedUsage>,
        flow_shards: usize,
        session_shards: usize,
    ) -> (Vec<Pipeline>, Vec<SessionStage>) {
        let analysis = analysis.into();
        let (first, stages) =
            Pipeline::split_shards(limits, analysis.clone(), usage.clone(), session_shards);
        let mut flows = vec![first];
        for _ in 1..flow_shards {
            // Its session stage goes unused (and gives its charge back as it drops).
            let (more, _) = Pipeline::split(limits, analysis.clone(), usage.clone());
            flows.push(more);
        }
        // Each shard holds its share of the flows: a count summed over shards that are at
        // different points of the input would evict where one pipeline does not, and not
        // the same flows from one run to the next. The connections spread evenly (a hash).
        // The total still counts (it is a process's, over every worker's pipelines), but
        // within one flow layer the shares fill first: shards each below their share hold
        // fewer than `max_flows` together.
        let share = limits.max_flows.max(1).div_ceil(flows.len());
        for f in &mut flows {
            f.flow_share = Some(share);
        }
        (flows, stages)
    }

    /// The session limits a pipeline's tracker gets from `limits` (see [`Pipeline::configured`]).
    fn tracker_limits(&self) -> SessionLimits {
        SessionLimits {
            max_session_bytes: session_budget(&self.limits)
                .min(self.limits.session.max_session_bytes),
            ..self.limits.session
        }
    }

    /// Split pipeline: moves what is left in `out` behind the steps staged so far; returns how
    /// many steps are staged and the bytes they hold (so that the caller can bound what waits
    /// between the threads). A whole pipeline stages nothing: `out` alone has its outputs.
    pub fn stage_outputs(&mut self, out: &mut Vec<Output>) -> (usize, usize) {
        let Some(mine) = self.staged.as_mut() else {
            return (0, 0);
        };
        stage_behind(mine, out);
        (mine.len(), self.staged_bytes)
    }

    /// Split pipeline: the bytes of the session inputs staged since the last
    /// [`Pipeline::take_staged`].
    #[inline]
    pub fn staged_bytes(&self) -> usize {
        self.staged_bytes
    }

    /// Split pipeline: the steps staged so far, in order (call [`Pipeline::stage_outputs`]
    /// first); `spare` (an empty vector, e.g. one the session side has done) takes their place.
    pub fn take_staged(&mut self, spare: Vec<Staged>) -> Vec<Staged> {
        self.publish_usage();
        self.staged_bytes = 0;
        self.usage
            .republish_staged_bytes(0, std::mem::take(&mut self.staged_unpublished));
        match self.staged.as_mut() {
            Some(mine) => std::mem::replace(mine, spare),
            None => spare,
        }
    }

    /// Split pipeline with a sharded session layer: a copy of staged `input` for one more
    /// shard (the inputs every shard takes: sweeps, the end, closed connections, PROXY
    /// headers), counted as a staged step until a stage has done it.
    pub fn stage_copy(&mut self, input: &SessionInput) -> SessionInput {
        let bytes = input.cost();
        self.usage.republish_staged_bytes(0, bytes);
        self.staged_bytes += bytes;
        input.clone()
    }

    /// Hands `input` to the session layer, or stages it after the outputs so far.
    #[inline]
    fn ask_sessions(&mut self, input: SessionInput, out: &mut Vec<Output>) {
        match self.staged.as_mut() {
            None => self.tracker_do(input, out),
            Some(staged) => {
                stage_behind(staged, out);
                // Waiting steps are counted until the session stage has done them, apart from
                // the budget: the queues between the threads bound them, and evicting flows
                // would not free them.
                let bytes = input.cost();
                self.staged_bytes += bytes;
                self.staged_unpublished += bytes;
                staged.push(Staged::Input(input));
            }
        }
    }

    fn tracker_do(&mut self, input: SessionInput, out: &mut Vec<Output>) {
        let _ = run_session_input(&mut self.tracker, input, out);
    }

    /// Fleet mode: sessions this pipeline has not seen are asked of a shared store first
    /// (see [`crate::model::SharedRequest`]); answer with [`Pipeline::on_shared_state`].
    pub fn enable_fleet(&mut self) {
        self.tracker.enable_fleet();
    }

    /// The store's answer to a [`crate::model::SharedRequest::Lookup`] of `key`.
    pub fn on_shared_state(&mut self, key: &str, record: Option<&str>, out: &mut Vec<Output>) {
        let now = self.clock.now;
        self.tracker.on_shared_state(key, record, now, out);
    }

    /// The store refused an update of `key` (another instance changed it): `stored` is its
    /// record now.
    pub fn on_shared_conflict(&mut self, key: &str, stored: &str, out: &mut Vec<Output>) {
        let now = self.clock.now;
        self.tracker.on_shared_conflict(key, stored, now, out);
    }

    /// The session layer's lasting state (see [`crate::mcp::snapshot`]), for a snapshot file.
    pub fn export_state(&self) -> crate::mcp::snapshot::StateSnapshot<ModeTracker> {
        self.tracker.export_state()
    }

    /// Loads exported state as of `now` (wall-clock nanoseconds for a live start).
    pub fn import_state(
        &mut self,
        snap: crate::mcp::snapshot::StateSnapshot<ModeTracker>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) -> crate::mcp::snapshot::ImportReport {
        self.tracker.import_state(snap, now, out)
    }

    /// Flow overhead and buffers held by this pipeline.
    fn flow_bytes(&self) -> usize {
        self.flows.len() * FLOW_OVERHEAD + self.buffered + self.tracker.exchange_bytes()
    }

    /// Everything charged against the memory budget, all pipelines sharing the usage
    /// together: this pipeline's flow bytes as they are now, the others' as published.
    fn memory_total(&mut self) -> usize {
        let now = self.flow_bytes();
        // Published only once it moved by more than the lag this pipeline's slack covers: a
        // locked add on every packet waited each time for the stores before it to drain.
        if now.abs_diff(self.published_flow_bytes) > self.slack / PUBLISH_LAG_SHARE {
            self.publish_flow_bytes(now);
        }
        // Ours as it is now, the other pipelines' as published.
        let flows = self
            .usage
            .flow_bytes()
            .saturating_sub(self.published_flow_bytes)
            .saturating_add(now);
        if self.staged.is_none() {
            return flows.saturating_add(self.usage.session_bytes());
        }
        // Split: the session thread writes its figure on every request, and reading it here on
        // every packet took its cache line from that thread each time. It is read every
        // SESSION_READ_INTERVAL checks, and at every check once the total comes near the budget,
        // where a figure read late could let the budget be exceeded.
        self.checks_since_session_read += 1;
        let near = flows.saturating_add(self.session_bytes_seen)
            >= self.limits.memory_budget_bytes - self.limits.memory_budget_bytes / 8;
        if near || self.checks_since_session_read >= SESSION_READ_INTERVAL {
            self.session_bytes_seen = self.usage.session_bytes();
            self.checks_since_session_read = 0;
        }
        flows.saturating_add(self.session_bytes_seen)
    }

    /// Moves this pipeline's figure in [`SharedUsage::flow_bytes`] to `now`.
    fn publish_flow_bytes(&mut self, now: usize) {
        self.usage
            .republish_flow_bytes(self.published_flow_bytes, now);
        self.published_flow_bytes = now;
    }

    /// Publishes this pipeline's flow bytes in the shared usage exactly; otherwise they are
    /// published once they moved by more than a 64th of what the pipeline is charged for its
    /// untracked costs.
    pub fn publish_usage(&mut self) {
        self.publish_flow_bytes(self.flow_bytes());
    }

    /// Estimated bytes held by flows, their buffers and sessions, as counted against the budget.
    pub fn memory_in_use(&self) -> usize {
        self.flow_bytes() + self.tracker.session_bytes()
    }

    /// The totals the limits apply to (shared with other pipelines, see [`Pipeline::with_usage`]).
    pub fn usage(&self) -> &SharedUsage {
        &self.usage
    }

    pub fn stats(&self) -> &PacketStats {
        &self.stats
    }

    pub fn active_flows(&self) -> usize {
        self.flows.len()
    }

    pub fn active_sessions(&self) -> usize {
        self.tracker.active_sessions()
    }

    /// Processes one captured frame of link type `linktype` (a LINKTYPE_* value, see
    /// [`decode::dlt`]) captured at `ts`; what it completes is appended to `out`.
    ///
    /// ```
    /// use etherparse::PacketBuilder;
    /// use mcptap_core::decode::dlt;
    /// use mcptap_core::model::{Event, Output, Timestamp};
    /// use mcptap_core::pipeline::{Limits, Pipeline};
    ///
    /// // One TCP segment from 127.0.0.2:50000 to 127.0.0.3:8080 (or back) as an Ethernet frame.
    /// fn frame(to_server: bool, seq: u32, flags: &str, payload: &[u8]) -> Vec<u8> {
    ///     let (client, server) = ([127, 0, 0, 2], [127, 0, 0, 3]);
    ///     let (src, dst, sport, dport) = if to_server {
    ///         (client, server, 50000, 8080)
    ///     } else {
    ///         (server, client, 8080, 50000)
    ///     };
    ///     let mut tcp = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
    ///         .ipv4(src, dst, 64)
    ///         .tcp(sport, dport, seq, 65535);
    ///     if flags.contains('S') {
    ///         tcp = tcp.syn();
    ///     }
    ///     let mut out = Vec::new();
    ///     tcp.write(&mut out, payload).unwrap();
    ///     out
    /// }
    ///
    /// let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"agent","version":"1"}}}"#;
    /// let request = format!(
    ///     "POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
    ///     body.len()
    /// );
    /// let result = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"tools","version":"1"}}}"#;
    /// let response = format!(
    ///     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s-1\r\nContent-Length: {}\r\n\r\n{result}",
    ///     result.len()
    /// );
    /// let mut pipeline = Pipeline::new(Limits::default());
    /// let mut out = Vec::new();
    /// let packets = [
    ///     frame(true, 100, "S", b""),
    ///     frame(true, 101, "", request.as_bytes()),
    ///     frame(false, 500, "", response.as_bytes()),
    /// ];
    /// for (i, packet) in packets.iter().enumerate() {
    ///     let ts = Timestamp(1_700_000_000_000_000_000 + i as i64 * 1_000_000);
    ///     pipeline.handle_packet(ts, dlt::EN10MB, packet, &mut out);
    /// }
    /// pipeline.finish(&mut out);
    /// let handshake = out.iter().find_map(|o| match o {
    ///     Output::Event(Event::Handshake(h)) => Some(h),
    ///     _ => None,
    /// });
    /// assert_eq!(handshake.and_then(|h| h.session_id.as_deref()), Some("s-1"));
    /// ```
    pub fn handle_packet(
        &mut self,
        ts: Timestamp,
        linktype: u32,
        frame: &[u8],
        out: &mut Vec<Output>,
    ) {
        self.stats.packets += 1;
        self.stats.bytes += frame.len() as u64;
        self.observe_time(ts, out);
        // At its own time, also while the clock holds it pending (far ahead of the packets
        // before it). Most such packets are right: the first ones after a quiet link's gap,
        // whose flows, sessions and deadlines need their real times (handled at the old clock,
        // the sweep right after the clock followed ended the flows they had just touched, and
        // a stream they ended lost its resumption window). A stamp the clock refuses later
        // does no lasting harm: sweeps take a flow or session seen after the clock as seen now.
        self.decode_and_handle(ts, linktype, frame, out);
        self.sweep_if_due(out);
    }

    /// One frame down to its flow (or counted as skipped, and why).
    #[inline]
    fn decode_and_handle(
        &mut self,
        ts: Timestamp,
        linktype: u32,
        frame: &[u8],
        out: &mut Vec<Output>,
    ) {
        match decode::decode(linktype, frame) {
            Decoded::Tcp(seg) => {
                self.stats.truncated_segments += u64::from(seg.truncated);
                self.handle_segment(ts, &seg, out)
            }
            Decoded::Skipped(reason) => self.stats.count_skip(reason),
        }
    }

    #[inline]
    fn observe_time(&mut self, ts: Timestamp, out: &mut Vec<Output>) {
        self.clock.observe(ts, self.limits.clock_jump_ns, out);
    }

    /// Sweeps idle flows and sessions once per [`SWEEP_INTERVAL_NS`] of packet time.
    #[inline]
    fn sweep_if_due(&mut self, out: &mut Vec<Output>) {
        if self.clock.sweep_due() {
            self.sweep_now(out);
        }
    }

    /// Out of line: once a second of packet time, while its check runs on every packet.
    #[cold]
    #[inline(never)]
    fn sweep_now(&mut self, out: &mut Vec<Output>) {
        self.clock.last_sweep = self.clock.now;
        self.sweep(out);
    }

    #[inline]
    fn handle_segment(&mut self, ts: Timestamp, seg: &TcpSegment<'_>, out: &mut Vec<Output>) {
        let key = FlowKey::of(seg.src, seg.dst);
        if self.segment(ts, key, seg, true, out) {
            self.release_held(key, out);
        }
    }

    /// Processes held segments of flow `key` whose other direction has caught up, in turn.
    fn release_held(&mut self, key: FlowKey, out: &mut Vec<Output>) {
        loop {
            let Some(flow) = self.flows.get_mut(&key) else {
                return;
            };
            let now = self.clock.now;
            let Some(seg) = flow.releasable(now).and_then(|half| flow.take_held(half)) else {
                return;
            };
            self.segment(seg.ts, key, &seg.view(), false, out);
        }
    }

    /// One segment into its flow. With `may_hold`, a data segment acknowledging bytes of the
    /// other direction not delivered yet is held back instead (see [`Flow::held`]). Returns
    /// whether the flow may have held segments to release now.
    fn segment(
        &mut self,
        ts: Timestamp,
        key: FlowKey,
        seg: &TcpSegment<'_>,
        may_hold: bool,
        out: &mut Vec<Output>,
    ) -> bool {
        let half = usize::from(seg.src != key.0);
        // One hash lookup per packet of a known flow; new flows take a second one.
        let Some(flow) = self.flows.get_mut(&key) else {
            // Only a SYN or data opens a flow; stray ACKs and RSTs of unknown flows don't.
            let opens = seg.flags.syn || !seg.payload.is_empty();
            if seg.flags.rst || !opens {
                return false;
            }
            // A SYN names its sender the client; a SYN-ACK (first when taps are skewed) names
            // the other side.
            let client = match (seg.flags.syn, seg.flags.ack) {
                (true, false) => Some(half as u8),
                (true, true) => Some(1 - half as u8),
                _ => None,
            };
            self.open_flow(key, ts, client, out);
            return self.segment(ts, key, seg, may_hold, out);
        };
        // A held segment replayed later keeps the flow's latest time.
        flow.last_seen = flow.last_seen.max(ts);
        let carries = !seg.payload.is_empty() || seg.flags.fin;
        let cost = HELD_OVERHEAD + seg.payload.len();
        if may_hold
            && carries
            && seg.flags.ack
            && !seg.flags.rst
            && !flow.http.is_ignored()
            && flow.streams[1 - half].acks_undelivered(seg.ack)
            && flow.can_hold(half, ts, cost, self.limits.max_flow_buffer_bytes)
        {
            let held = flow.held.get_or_insert_with(Box::default);
            held.bytes += cost;
            held.halves[half].push_back(HeldSegment::of(ts, seg));
            let now_buffered = flow.buffered();
            self.buffered = self.buffered + now_buffered - flow.charged;
            flow.charged = now_buffered;
            self.fit_budget(0, out);
            return false;
        }
        let may_release = flow.held.is_some();
        if flow.http.is_ignored() {
            // Not HTTP: skip reassembly entirely, only watch for the end of the flow.
            if seg.flags.rst || seg.flags.fin {
                let why = if seg.flags.rst {
                    Removal::Rst
                } else {
                    Removal::Fin
                };
                self.remove_flow(key, why, out);
            }
            return false;
        }
        // A held segment that waited in vain (or whose flow ends): the peer got bytes of the
        // other direction the capture lost, so the hole before them is declared now.
        let skips_hole = !may_hold && seg.flags.ack && flow.streams[1 - half].hole_acked(seg.ack);
        if seg.payload.is_empty()
            && !(seg.flags.syn || seg.flags.fin || seg.flags.rst || seg.truncated)
            && !skips_hole
            && flow.streams[half].ignores_empty_push()
        {
            // A pure acknowledgement: no bytes, no state, no events; only the budget is fitted
            // as after any segment.
            self.fit_budget(0, out);
            return may_release;
        }
        let mut report = PushReport::default();
        let mut events = std::mem::take(&mut self.http_events);
        if skips_hole {
            let mut feed = HttpFeed {
                conn: &mut flow.http,
                half: 1 - half,
                events: &mut events,
            };
            flow.streams[1 - half].skip_acked_hole(&mut feed, &mut report);
            // A lost tail declared up to the FIN ends that direction as the FIN would have.
            if flow.streams[1 - half].is_finished() {
                flow.http
                    .on_close(1 - half, BodyEnd::ServerClosed, &mut events);
            }
        }
        {
            if seg.flags.syn && seg.flags.ack {
                // The SYN-ACK acknowledges the client's SYN: its stream starts at `ack`, even
                // when a skewed tap shows the SYN later (or not at all).
                flow.streams[1 - half].on_syn(seg.ack.wrapping_sub(1));
            }
            let stream = &mut flow.streams[half];
            if seg.flags.syn {
                stream.on_syn(seg.seq);
            }
            let mut feed = HttpFeed {
                conn: &mut flow.http,
                half,
                events: &mut events,
            };
            if seg.truncated {
                stream.push_cut(seg.seq, seg.payload, seg.flags.fin, &mut feed, &mut report);
            } else {
                stream.push(seg.seq, seg.payload, seg.flags.fin, &mut feed, &mut report);
            }
            if stream.is_finished() && !seg.flags.rst {
                flow.http.on_close(half, BodyEnd::ServerClosed, &mut events);
            }
        }
        report_telemetry(&report, out);
        let now_buffered = flow.buffered();
        self.buffered = self.buffered + now_buffered - flow.charged;
        flow.charged = now_buffered;
        let ctx = flow.ctx();
        let flow_id = flow.id;
        let seen_from = [flow.server_seen_from(0), flow.server_seen_from(1)];
        let both_done = flow.streams.iter().all(Reassembler::is_finished);
        self.deliver(flow_id, ctx, seen_from, ts, &mut events, out);
        self.http_events = events;
        if seg.flags.rst {
            self.remove_flow(key, Removal::Rst, out);
        } else if both_done {
            self.remove_flow(key, Removal::Fin, out);
        }
        self.fit_budget(0, out);
        may_release
    }

    /// Starts tracking the connection `key`, making room for it first.
    /// `syn_half`: the flow was seen from its SYN, sent by this half (the client).
    fn open_flow(
        &mut self,
        key: FlowKey,
        ts: Timestamp,
        syn_half: Option<u8>,
        out: &mut Vec<Output>,
    ) {
        let synchronised = syn_half.is_some();
        self.make_room(out);
        let flow = Box::new(Flow {
            id: self.next_flow_id,
            key,
            streams: [
                Reassembler::new(self.limits.max_flow_buffer_bytes),
                Reassembler::new(self.limits.max_flow_buffer_bytes),
            ],
            http: Connection::new(synchronised, self.limits.http, crate::mcp::HTTP_INTEREST),
            last_seen: ts,
            charged: 0,
            syn_half,
            held: None,
        });
        self.eviction_queue.push_back(QueuedFlow {
            key,
            id: flow.id,
            seen: ts,
        });
        self.next_flow_id += 1;
        self.flows.insert(key, flow);
        self.usage.add_flows(1);
        self.compact_eviction_queue();
        out.push(Output::Telemetry(Telemetry::FlowOpened));
    }

    /// Feeds one piece of an HTTP conversation between `client` and `server`, for callers that
    /// terminate HTTP themselves (a gateway) instead of capturing packets. A conversation fed
    /// this way gives the same events as its packets would.
    ///
    /// ```
    /// use mcptap_core::model::{Event, Output, Timestamp};
    /// use mcptap_core::pipeline::{HttpMessage, Limits, Pipeline};
    ///
    /// let client = "127.0.0.1:50000".parse().unwrap();
    /// let server = "127.0.0.1:8080".parse().unwrap();
    /// let mut pipeline = Pipeline::new(Limits::default());
    /// let mut out = Vec::new();
    /// let request = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"agent","version":"1"}}}"#;
    /// let response = br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"tools","version":"1"}}}"#;
    /// let json: &[u8] = b"application/json";
    /// let mut feed = |ms: i64, msg: HttpMessage<'_>| {
    ///     pipeline.handle_http(Timestamp(ms * 1_000_000), client, server, msg, &mut out)
    /// };
    /// feed(0, HttpMessage::RequestHead {
    ///     method: "POST",
    ///     path: "/mcp",
    ///     headers: &[("Content-Type", json), ("Accept", b"application/json, text/event-stream")],
    /// });
    /// feed(0, HttpMessage::RequestBody(request));
    /// feed(0, HttpMessage::RequestEnd);
    /// feed(5, HttpMessage::ResponseHead {
    ///     status: 200,
    ///     headers: &[("Content-Type", json), ("Mcp-Session-Id", b"s-1")],
    /// });
    /// feed(5, HttpMessage::ResponseBody(response));
    /// feed(5, HttpMessage::ResponseEnd);
    /// feed(9, HttpMessage::Closed);
    /// pipeline.finish(&mut out);
    /// let handshake = out.iter().find_map(|o| match o {
    ///     Output::Event(Event::Handshake(h)) => Some(h),
    ///     _ => None,
    /// });
    /// assert_eq!(handshake.and_then(|h| h.session_id.as_deref()), Some("s-1"));
    /// ```
    pub fn handle_http(
        &mut self,
        ts: Timestamp,
        client: SocketAddr,
        server: SocketAddr,
        msg: HttpMessage<'_>,
        out: &mut Vec<Output>,
    ) {
        // At its own time, as in `handle_packet`.
        self.observe_time(ts, out);
        let key = FlowKey::of(client, server);
        let client_half = usize::from(client != key.0);
        let server_half = 1 - client_half;
        if !self.flows.contains_key(&key) {
            if matches!(msg, HttpMessage::Closed | HttpMessage::ClientClosed) {
                return;
            }
            self.open_flow(key, ts, Some(client_half as u8), out);
        }
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        flow.last_seen = ts;
        let mut events = std::mem::take(&mut self.http_events);
        let http = &mut flow.http;
        match msg {
            HttpMessage::RequestHead {
                method,
                path,
                headers,
            } => http.on_request_head(client_half, method, path, headers, &mut events),
            HttpMessage::RequestBody(chunk) => http.on_body(client_half, chunk, &mut events),
            HttpMessage::RequestEnd => http.on_message_end(client_half, &mut events),
            HttpMessage::ResponseHead { status, headers } => {
                http.on_response_head(server_half, status, headers, &mut events)
            }
            HttpMessage::ResponseBody(chunk) => http.on_body(server_half, chunk, &mut events),
            HttpMessage::ResponseEnd => http.on_message_end(server_half, &mut events),
            HttpMessage::Closed => http.on_close(server_half, BodyEnd::ServerClosed, &mut events),
            // As a client's FIN on the wire.
            HttpMessage::ClientClosed => {
                http.on_close(client_half, BodyEnd::ServerClosed, &mut events)
            }
        }
        let now_buffered = flow.buffered();
        self.buffered = self.buffered + now_buffered - flow.charged;
        flow.charged = now_buffered;
        let ctx = flow.ctx();
        let flow_id = flow.id;
        let seen_from = [flow.server_seen_from(0), flow.server_seen_from(1)];
        self.deliver(flow_id, ctx, seen_from, ts, &mut events, out);
        self.http_events = events;
        if matches!(msg, HttpMessage::Closed) {
            self.remove_flow(key, Removal::Fin, out);
        }
        self.fit_budget(0, out);
        self.sweep_if_due(out);
    }

    /// Hands HTTP events to the session layer. `server_seen_from[half]` names the server of a
    /// connection reported undecodable from that half, known before any request is.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        flow_id: u64,
        ctx: Option<FlowCtx>,
        server_seen_from: [SocketAddr; 2],
        ts: Timestamp,
        events: &mut Vec<HttpEvent>,
        out: &mut Vec<Output>,
    ) {
        // Most segments (acknowledgements, body bytes a parser holds) give no event.
        if events.is_empty() {
            return;
        }
        for ev in events.drain(..) {
            match (ctx, ev) {
                (_, HttpEvent::Error(e)) => {
                    out.push(Output::Telemetry(Telemetry::HttpError { reason: e }))
                }
                (_, HttpEvent::NotDecodable { half, reason }) => {
                    let server = server_seen_from[half.min(1)];
                    out.push(Output::Telemetry(Telemetry::UndecodableFlow {
                        server,
                        reason,
                    }))
                }
                // Sent before the first request: the flow's client side is not known yet.
                (_, HttpEvent::ProxyHeader { half, source }) => {
                    let server = server_seen_from[half.min(1)];
                    self.ask_sessions(
                        SessionInput::ProxyHeader {
                            flow: flow_id,
                            server,
                            source,
                        },
                        out,
                    );
                }
                (Some(ctx), event) => {
                    if self.staged.is_none() {
                        // The body is freed here, on the thread that allocated it.
                        let _ = self.tracker.on_http(ctx, ts, event, out);
                    } else {
                        self.ask_sessions(SessionInput::Http { ctx, ts, event }, out)
                    }
                }
                (None, _) => {}
            }
        }
    }

    /// Ends a flow: open bodies end as `end`, out-of-order leftovers are dropped.
    fn remove_flow(&mut self, key: FlowKey, why: Removal, out: &mut Vec<Output>) {
        // Held segments are data the flow carried: deliver them before it goes (they may end
        // it themselves, then the flow is gone already).
        if let Some(flow) = self.flows.get_mut(&key)
            && flow.held.is_some()
        {
            let id = flow.id;
            let outer = std::mem::replace(&mut self.replaying_held, true);
            for seg in flow.take_all_held() {
                if self.flows.get(&key).is_none_or(|f| f.id != id) {
                    break;
                }
                self.segment(seg.ts, key, &seg.view(), false, out);
            }
            self.replaying_held = outer;
        }
        let (end, flush) = (why.body_end(), why.gap());
        let Some(mut flow) = self.flows.remove(&key) else {
            return;
        };
        self.usage.sub_flows(1);
        self.buffered -= flow.charged;
        let mut events = std::mem::take(&mut self.http_events);
        for half in 0..2 {
            let mut report = PushReport::default();
            if let Some(reason) = flush {
                let mut feed = HttpFeed {
                    conn: &mut flow.http,
                    half,
                    events: &mut events,
                };
                flow.streams[half].flush(reason, &mut feed, &mut report);
            }
            report_telemetry(&report, out);
            flow.http.on_close(half, end, &mut events);
        }
        let ctx = flow.ctx();
        let flow_id = flow.id;
        let seen_from = [flow.server_seen_from(0), flow.server_seen_from(1)];
        // A connection its own segment closed ends at that segment's time, also one the clock
        // holds pending (the first packets after a gap); any other removal at the clock's.
        let ts = match why {
            Removal::Fin | Removal::Rst => flow.last_seen.max(self.clock.now),
            _ => self.clock.now,
        };
        self.deliver(flow_id, ctx, seen_from, ts, &mut events, out);
        self.http_events = events;
        self.ask_sessions(SessionInput::FlowClosed { flow: flow.id }, out);
        let telemetry = match why {
            Removal::Fin => Some(Telemetry::FlowClosed {
                reason: FlowCloseReason::Fin,
            }),
            Removal::Rst => Some(Telemetry::FlowClosed {
                reason: FlowCloseReason::Rst,
            }),
            Removal::Idle => Some(Telemetry::FlowEvicted {
                reason: FlowEvictReason::Idle,
            }),
            Removal::Evicted(reason) => Some(Telemetry::FlowEvicted { reason }),
            Removal::CaptureEnd => None,
        };
        out.extend(telemetry.map(Output::Telemetry));
    }

    /// Keeps the flow table under its cap, with room for one more flow, by evicting the least
    /// recently seen flows.
    fn make_room(&mut self, out: &mut Vec<Output>) {
        let full = self.usage.flows() >= self.limits.max_flows.max(1)
            || self
                .flow_share
                .is_some_and(|share| self.flows.len() >= share);
        if full {
            self.evict_oldest(FlowEvictReason::FlowLimit, out);
        }
        self.fit_budget(FLOW_OVERHEAD, out);
    }

    /// Evicts flows until the memory in use plus `room` fits the budget (or no flow is left).
    #[inline]
    fn fit_budget(&mut self, room: usize, out: &mut Vec<Output>) {
        // After nearly every packet all fits: that case is [`Pipeline::memory_total`] worked
        // out here, inline, where it has nothing to publish or to read late.
        if self.staged.is_none() && !self.replaying_held {
            let now = self.flow_bytes();
            if now.abs_diff(self.published_flow_bytes) <= self.slack / PUBLISH_LAG_SHARE {
                let total = self
                    .usage
                    .flow_bytes()
                    .saturating_sub(self.published_flow_bytes)
                    .saturating_add(now)
                    .saturating_add(self.usage.session_bytes());
                if total.saturating_add(room) <= self.limits.memory_budget_bytes {
                    return;
                }
            }
        }
        self.fit_budget_slowly(room, out);
    }

    /// [`Pipeline::fit_budget`] when the total may not fit, or must be published first.
    #[inline(never)]
    fn fit_budget_slowly(&mut self, room: usize, out: &mut Vec<Output>) {
        if self.replaying_held {
            // A flow being removed replays what it held; evicting others from inside that
            // would recurse once per flow. The removal's caller fits the budget after it.
            return;
        }
        while self.memory_total().saturating_add(room) > self.limits.memory_budget_bytes
            && self.evict_oldest(FlowEvictReason::Memory, out) > 0
        {}
    }

    /// Evicts a batch (1/64) of the least recently seen flows: from the front of the queue,
    /// giving a flow seen since it was queued a second chance at the back.
    /// Returns how many were evicted.
    fn evict_oldest(&mut self, reason: FlowEvictReason, out: &mut Vec<Output>) -> usize {
        let batch = (self.flows.len() / 64).max(1);
        let mut left = batch;
        while left > 0 {
            let Some(q) = self.eviction_queue.pop_front() else {
                break;
            };
            let Some(flow) = self.flows.get(&q.key).filter(|f| f.id == q.id) else {
                continue; // stale: that flow is gone
            };
            if flow.last_seen > q.seen {
                self.eviction_queue.push_back(QueuedFlow {
                    seen: flow.last_seen,
                    ..q
                });
                continue;
            }
            self.remove_flow(q.key, Removal::Evicted(reason), out);
            left -= 1;
        }
        batch - left
    }

    /// Drops the stale entries once they outnumber the live ones (flows that ended on their
    /// own leave one behind), keeping the queue's order.
    fn compact_eviction_queue(&mut self) {
        if self.eviction_queue.len() <= 2 * self.flows.len() + 1024 {
            return;
        }
        let flows = &self.flows;
        self.eviction_queue
            .retain(|q| flows.get(&q.key).is_some_and(|f| f.id == q.id));
    }

    fn sweep(&mut self, out: &mut Vec<Output>) {
        let now = self.clock.now;
        self.sweep_flows(None, out);
        self.ask_sessions(SessionInput::Sweep { now }, out);
        self.shrink_tables();
    }

    /// Idle flows go, then held segments that waited too long go on: each flow's outputs a
    /// unit of the sweep after packet `seq` when this is a flow shard (`Some(seq)`).
    fn sweep_flows(&mut self, seq: Option<u64>, out: &mut Vec<Output>) {
        let now = self.clock.now;
        let timeout = self.limits.flow_idle_timeout_ns;
        let mut idle: Vec<(u64, FlowKey)> = self
            .flows
            .values_mut()
            .filter_map(|f| {
                // Seen after the clock (a stamp it refused, or one still pending): seen now,
                // and a segment held since then has waited from now.
                f.last_seen = f.last_seen.min(now);
                if let Some(held) = f.held.as_mut() {
                    for seg in held.halves.iter_mut().flatten() {
                        seg.ts = seg.ts.min(now);
                    }
                }
                (now.0.saturating_sub(f.last_seen.0) > timeout).then_some((f.id, f.key))
            })
            .collect();
        // Flow ids, not hash order, decide the order of outputs: replays stay deterministic.
        idle.sort_unstable_by_key(|(id, _)| *id);
        for (id, key) in idle {
            self.remove_flow(key, Removal::Idle, out);
            self.end_unit(seq, FlowPhase::Idle, id, out);
        }
        // Segments that waited too long for the other direction go on without it.
        let mut waiting: Vec<(u64, FlowKey)> = self
            .flows
            .values()
            .filter(|f| f.held.is_some())
            .map(|f| (f.id, f.key))
            .collect();
        waiting.sort_unstable_by_key(|(id, _)| *id);
        for (id, key) in waiting {
            self.release_held(key, out);
            self.end_unit(seq, FlowPhase::Held, id, out);
        }
    }

    /// Flow shard: the outputs so far are one unit (`phase` of flow `flow`, at packet `seq`)
    /// for the flow shards' merge ([`crate::flow_shard::FlowMerge`]). A whole pipeline (`seq` is
    /// `None`) marks nothing.
    #[inline]
    fn end_unit(&mut self, seq: Option<u64>, phase: FlowPhase, flow: u64, out: &mut Vec<Output>) {
        let (Some(seq), Some(staged)) = (seq, self.staged.as_mut()) else {
            return;
        };
        stage_behind(staged, out);
        // Most packets stage nothing: no mark for an empty unit.
        if self.flow_marks.last().map_or(0, |m| m.0) < staged.len() {
            self.flow_marks
                .push((staged.len(), FlowUnit { seq, phase, flow }));
        }
    }

    /// Flow shard (see [`crate::flow_shard`]): packet `at.seq` of the whole input, which the
    /// dispatcher's clock put at `at.now`. The flow it opens, if any, takes `at.seq` as its
    /// id: ids then follow the flows' order over all shards, as one pipeline's counter does.
    pub fn shard_packet(
        &mut self,
        at: PacketAt,
        linktype: u32,
        frame: &[u8],
        out: &mut Vec<Output>,
    ) {
        self.stats.packets += 1;
        self.stats.bytes += frame.len() as u64;
        self.clock.now = self.clock.now.max(at.now);
        self.next_flow_id = at.seq;
        // At its own time, as in `handle_packet`.
        self.decode_and_handle(at.ts, linktype, frame, out);
        self.end_unit(Some(at.seq), FlowPhase::Packet, 0, out);
    }

    /// Flow shard: the sweep after packet `seq`, at `now`. Only the flows' part: the
    /// dispatcher stages the sessions' sweep once for all shards.
    pub fn shard_sweep(&mut self, seq: u64, now: Timestamp, out: &mut Vec<Output>) {
        self.clock.now = self.clock.now.max(now);
        self.sweep_flows(Some(seq), out);
        self.shrink_tables();
    }

    /// Flow shard: the end of the input, the flows' part (see [`Pipeline::shard_sweep`]).
    pub fn shard_finish(&mut self, now: Timestamp, out: &mut Vec<Output>) {
        self.clock.now = self.clock.now.max(now);
        self.remove_all(Some(u64::MAX), out);
    }

    /// Flow shard: the marks of the units staged since the last call, for `marks` (empty).
    pub(crate) fn swap_flow_marks(&mut self, marks: &mut Vec<(usize, FlowUnit)>) {
        std::mem::swap(marks, &mut self.flow_marks);
    }

    /// Every flow ends with the input, in id order.
    fn remove_all(&mut self, seq: Option<u64>, out: &mut Vec<Output>) {
        let mut keys: Vec<(u64, FlowKey)> = self.flows.values().map(|f| (f.id, f.key)).collect();
        keys.sort_unstable_by_key(|(id, _)| *id);
        for (id, key) in keys {
            self.remove_flow(key, Removal::CaptureEnd, out);
            self.end_unit(seq, FlowPhase::Idle, id, out);
        }
    }

    /// Tables never shrink by themselves: a worker that once held most of the process's flows
    /// would keep their slots while another worker's flows fill the budget.
    fn shrink_tables(&mut self) {
        let floor = 1024;
        if self.flows.capacity() > 4 * self.flows.len().max(floor) {
            self.flows.shrink_to(2 * self.flows.len());
        }
        if self.eviction_queue.capacity() > 4 * self.eviction_queue.len().max(floor) {
            self.eviction_queue.shrink_to(2 * self.eviction_queue.len());
        }
    }

    /// Lets time pass without packets (live capture on a quiet link), so timeouts still fire.
    pub fn advance_time(&mut self, ts: Timestamp, out: &mut Vec<Output>) {
        self.clock.advance(ts, self.limits.clock_jump_ns);
        self.sweep_if_due(out);
    }

    /// End of input: open streams were cut off by the end of the capture, not ended.
    pub fn finish(&mut self, out: &mut Vec<Output>) {
        self.remove_all(None, out);
        let now = self.clock.now;
        self.ask_sessions(SessionInput::Finish { now }, out);
    }
}

impl Drop for Pipeline {
    /// What this pipeline held no longer counts against the shared totals.
    fn drop(&mut self) {
        self.usage.sub_flows(self.flows.len());
        self.usage
            .republish_flow_bytes(self.published_flow_bytes, 0);
        self.usage.republish_session_bytes(self.slack, 0);
    }
}

/// Budget checks (about one per packet) between a split flow side's reads of the session
/// side's bytes (see [`Pipeline::memory_total`]).
const SESSION_READ_INTERVAL: u32 = 64;

/// A pipeline's flow bytes in the shared usage may lag its own by a share of its slack: the
/// other pipelines sharing the usage see them that late (see [`Pipeline::memory_total`]).
const PUBLISH_LAG_SHARE: usize = 64;

/// Moves the outputs in `out` behind the steps in `staged`. Most packets have none, and the
/// drain's setup and teardown cost a split replay's flow thread more than the rest of staging.
#[inline]
pub(crate) fn stage_behind(staged: &mut Vec<Staged>, out: &mut Vec<Output>) {
    if !out.is_empty() {
        staged.extend(out.drain(..).map(Staged::Output));
    }
}

/// One step of a split pipeline's session layer (see [`Pipeline::split`]), or one of the flow
/// layer's outputs in its place.
// Unboxed: a box per HTTP event would cost more than the batches' slack.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Staged {
    Output(Output),
    Input(SessionInput),
}

/// What the flow layer asks of the session layer.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum SessionInput {
    Http {
        ctx: FlowCtx,
        ts: Timestamp,
        event: HttpEvent,
    },
    /// A PROXY protocol header opened connection `flow` (`source`: the client it names).
    ProxyHeader {
        flow: u64,
        server: SocketAddr,
        source: Option<SocketAddr>,
    },
    FlowClosed {
        flow: u64,
    },
    /// Idle sessions and lineages expire as of `now` (the flow layer's sweep).
    Sweep {
        now: Timestamp,
    },
    /// The end of the input.
    Finish {
        now: Timestamp,
    },
}

impl SessionInput {
    /// What the step holds while it waits, as counted in [`SharedUsage::staged_bytes`].
    pub(crate) fn cost(&self) -> usize {
        std::mem::size_of::<Staged>()
            + match self {
                SessionInput::Http { event, .. } => crate::mcp::held_cost(event),
                _ => 0,
            }
    }
}

/// Runs one session input; a body read and no longer needed comes back (see
/// [`Tracker::on_http`]).
fn run_session_input(
    tracker: &mut Tracker<Detectors>,
    input: SessionInput,
    out: &mut Vec<Output>,
) -> Option<Vec<u8>> {
    match input {
        SessionInput::Http { ctx, ts, event } => {
            return tracker.on_http(ctx, ts, event, out);
        }
        SessionInput::ProxyHeader {
            flow,
            server,
            source,
        } => tracker.on_proxy_header(flow, server, source, out),
        SessionInput::FlowClosed { flow } => tracker.on_flow_closed(flow),
        SessionInput::Sweep { now } => tracker.sweep(now, out),
        SessionInput::Finish { now } => tracker.finish(now, out),
    }
    None
}

/// The session layer of a split pipeline (see [`Pipeline::split`]): JSON-RPC, MCP sessions
/// and lineages, detection.
pub struct SessionStage {
    tracker: Tracker<Detectors>,
    usage: Arc<SharedUsage>,
    /// Open exchanges' bytes this stage last added to the flow side of `usage` (they count
    /// there in a whole pipeline too).
    published_exchange_bytes: usize,
    /// Bytes of the staged steps done since the last [`SessionStage::publish_usage`], still
    /// counted in [`SharedUsage::staged_bytes`].
    staged_done: usize,
    /// Charged for its thread's allocator (see [`PIPELINE_SLACK`]).
    slack: usize,
}

impl SessionStage {
    /// One staged step, in the order [`Pipeline::take_staged`] gave it.
    pub fn process(&mut self, staged: Staged, out: &mut Vec<Output>) {
        match staged {
            Staged::Output(o) => out.push(o),
            Staged::Input(input) => {
                self.staged_done += input.cost();
                if let Some(body) = run_session_input(&mut self.tracker, input, out) {
                    self.tracker.spend_body(body);
                }
            }
        }
    }

    /// From now on what this stage is done with of the flow layer's allocations (bodies and
    /// SSE events' data read, request and response heads) is kept for
    /// [`SessionStage::swap_spent`] instead of freed here: for a flow layer on another thread
    /// (see [`Spent`], [`Tracker::keep_spent`]). The caller takes it after every batch; it is
    /// no longer charged (bodies to [`SharedUsage::staged_bytes`], heads to the open
    /// exchanges' bytes).
    pub fn keep_spent(&mut self) {
        self.tracker.keep_spent();
    }

    /// What was kept since the last call (see [`SessionStage::keep_spent`]), with `spare`
    /// (emptied) keeping from now on. What waits to be taken is at most what the staged steps
    /// between two calls held.
    pub fn swap_spent(&mut self, spare: Spent) -> Spent {
        self.tracker.swap_spent(spare)
    }

    /// Sharded: hands out every server-scoped entry this stage holds (after a snapshot's
    /// load into this one shard).
    pub fn publish_server_entries(&mut self) {
        self.tracker.publish_server_entries();
    }

    /// Makes this stage one shard of a session layer sharded by client (see
    /// [`crate::mcp::ServerScope`]).
    pub fn share_server_scope(&mut self, scope: Box<dyn crate::mcp::ServerScope<ModeTracker>>) {
        self.tracker.share_server_scope(scope);
    }

    /// Sharded: where the units of the sweeps' and ends' outputs start in the `out` given to
    /// [`SessionStage::process`], with their keys, since the last call (see
    /// [`crate::shard::broadcast_order`]).
    pub fn take_group_marks(&mut self, into: &mut Vec<(usize, crate::mcp::GroupKey)>) {
        self.tracker.take_group_marks(into);
    }

    /// Publishes what open exchanges hold, for the flow layer's memory budget, and that the
    /// steps done no longer wait; after a batch.
    pub fn publish_usage(&mut self) {
        let now = self.tracker.exchange_bytes();
        self.usage
            .republish_flow_bytes(self.published_exchange_bytes, now);
        self.published_exchange_bytes = now;
        self.usage
            .republish_staged_bytes(std::mem::take(&mut self.staged_done), 0);
    }

    pub fn active_sessions(&self) -> usize {
        self.tracker.active_sessions()
    }

    pub fn memory_in_use(&self) -> usize {
        self.tracker.exchange_bytes() + self.tracker.session_bytes()
    }

    /// The session layer's lasting state, as [`Pipeline::export_state`].
    pub fn export_state(&self) -> crate::mcp::snapshot::StateSnapshot<ModeTracker> {
        self.tracker.export_state()
    }

    /// Loads exported state as of `now`, as [`Pipeline::import_state`].
    pub fn import_state(
        &mut self,
        snap: crate::mcp::snapshot::StateSnapshot<ModeTracker>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) -> crate::mcp::snapshot::ImportReport {
        self.tracker.import_state(snap, now, out)
    }
}

impl Drop for SessionStage {
    fn drop(&mut self) {
        self.usage
            .republish_flow_bytes(self.published_exchange_bytes, 0);
        self.usage.republish_session_bytes(self.slack, 0);
        self.usage.republish_staged_bytes(self.staged_done, 0);
    }
}

/// Counts what a push reported: gaps and overlaps (nearly always none, said inline).
#[inline]
fn report_telemetry(report: &PushReport, out: &mut Vec<Output>) {
    if !report.gaps.is_empty() || report.conflicting_overlaps != 0 || report.identical_overlaps != 0
    {
        report_push_anomalies(report, out);
    }
}

#[inline(never)]
fn report_push_anomalies(report: &PushReport, out: &mut Vec<Output>) {
    for (reason, bytes) in &report.gaps {
        out.push(Output::Telemetry(Telemetry::TcpGap {
            reason: *reason,
            bytes: *bytes,
        }));
    }
    for _ in 0..report.conflicting_overlaps {
        out.push(Output::Telemetry(Telemetry::TcpOverlap {
            conflicting: true,
        }));
    }
    for _ in 0..report.identical_overlaps {
        out.push(Output::Telemetry(Telemetry::TcpOverlap {
            conflicting: false,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock's telemetry for packets at these seconds (the input then ends): `followed`
    /// per report, and where the clock is.
    fn clock_over(seconds: &[i64]) -> (Vec<bool>, i64) {
        let mut clock = PacketClock::default();
        let mut out = Vec::new();
        let jump = 60 * 1_000_000_000;
        for s in seconds {
            clock.observe(Timestamp(s * 1_000_000_000), jump, &mut out);
        }
        let reports = out
            .iter()
            .filter_map(|o| match o {
                Output::Telemetry(Telemetry::ClockJump { followed, .. }) => Some(*followed),
                _ => None,
            })
            .collect();
        (reports, clock.now.0 / 1_000_000_000)
    }

    #[test]
    fn a_quiet_link_moves_the_clock_and_a_wrong_stamp_does_not() {
        // Time passing without packets catches up with a pending one: it was right, and a
        // later follow never moves the clock back.
        let mut clock = PacketClock::default();
        let mut out = Vec::new();
        let s = 1_000_000_000;
        let jump = 60 * s;
        for t in [0, 1_000, 1_001] {
            clock.observe(Timestamp(t * s), jump, &mut out);
        }
        clock.advance(Timestamp(1_002 * s), jump);
        for t in [1_003, 1_004] {
            clock.observe(Timestamp(t * s), jump, &mut out);
        }
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(clock.now.0, 1_004 * s);
        // Keep-alive pairs 70 s apart on an otherwise quiet link: the clock follows, no
        // refusal (the last pair, not followed by anything, is left unjudged).
        assert_eq!(
            clock_over(&[0, 70, 70, 140, 140, 210, 210, 280, 280]),
            (vec![true, true, true], 210)
        );
        // A wrong stamp among the packets after a gap: the clock follows the gap, not it.
        assert_eq!(
            clock_over(&[0, 1, 120, 121, 36_000, 122, 123]),
            (vec![true, false], 123)
        );
        assert_eq!(
            clock_over(&[0, 1, 36_000, 120, 121, 122, 123]),
            (vec![false, true], 123)
        );
        // An exchange after ten quiet minutes: one gap followed.
        assert_eq!(clock_over(&[0, 1, 600, 600, 600, 601]), (vec![true], 601));
        // One packet stamped ten hours ahead among good ones: refused once time comes back.
        assert_eq!(clock_over(&[0, 1, 36_000, 2, 3]), (vec![false], 3));
        // Two of them, then good ones.
        assert_eq!(clock_over(&[0, 36_000, 36_001, 2]), (vec![false, false], 2));
        // Wrong stamps far apart never agree: each is refused.
        assert_eq!(
            clock_over(&[0, 36_000, 9_000, 72_000, 1]),
            (vec![false, false, false], 1)
        );
        // A stamp ahead at the end of the input is left unjudged.
        assert_eq!(clock_over(&[0, 1, 36_000]), (vec![], 1));
        // Within the window, nothing to report.
        assert_eq!(clock_over(&[0, 59, 118, 177]), (vec![], 177));
    }

    /// Flow keys put the lower endpoint first as `SocketAddr` orders them, are equal exactly
    /// when their endpoints are, and equal keys hash alike: IPv4 pairs (packed), IPv6 and
    /// mixed pairs, ports and addresses that tie.
    #[test]
    fn flow_keys_order_compare_and_hash_as_their_endpoints() {
        let addrs: Vec<SocketAddr> = [
            "10.0.0.1:80",
            "10.0.0.1:81",
            "10.0.0.2:80",
            "9.255.255.255:65535",
            "255.255.255.255:0",
            "0.0.0.0:0",
            "[::1]:80",
            "[::1]:81",
            "[::ffff:10.0.0.1]:80",
            "[fe80::1%2]:80",
        ]
        .iter()
        .map(|a| a.parse().expect("addr"))
        .collect();
        let hash = |k: &FlowKey| {
            std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::with_seed(7), k)
        };
        for &a in &addrs {
            for &b in &addrs {
                let k = FlowKey::of(a, b);
                let expected = if a <= b { (a, b) } else { (b, a) };
                assert_eq!((k.0, k.1), expected, "{a} {b}");
                assert_eq!(k, FlowKey::of(b, a));
                assert_eq!(hash(&k), hash(&FlowKey::of(b, a)));
                for &c in &addrs {
                    for &d in &addrs {
                        let other = FlowKey::of(c, d);
                        let same = expected == if c <= d { (c, d) } else { (d, c) };
                        assert_eq!(k == other, same, "{a} {b} {c} {d}");
                    }
                }
            }
        }
    }

    fn frame(client_port: u16, seq: u32, syn: bool, payload: &[u8]) -> Vec<u8> {
        let mut b = etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 2], [10, 0, 0, 1], 64)
            .tcp(client_port, 8080, seq, 1000);
        if syn {
            b = b.syn();
        }
        let mut v = Vec::new();
        b.write(&mut v, payload).expect("frame");
        v
    }

    #[test]
    fn flow_limit_evicts_the_least_recently_seen_flow_not_the_oldest() {
        let limits = Limits {
            max_flows: 4,
            ..Limits::default()
        };
        let mut p = Pipeline::new(limits);
        let mut out = Vec::new();
        let syn = |p: &mut Pipeline, port: u16, t: i64, out: &mut Vec<Output>| {
            p.handle_packet(Timestamp(t), 1, &frame(port, 0, true, b""), out)
        };
        for (i, port) in [1001, 1002, 1003, 1004].into_iter().enumerate() {
            syn(&mut p, port, i as i64, &mut out);
        }
        // 1001 and 1002 are seen again: 1003 is now the least recently seen.
        syn(&mut p, 1001, 10, &mut out);
        syn(&mut p, 1002, 11, &mut out);
        let open = |p: &Pipeline| -> Vec<u16> {
            let mut ports: Vec<u16> = p.flows.values().map(|f| f.key.1.port()).collect();
            ports.sort_unstable();
            ports
        };
        syn(&mut p, 1005, 12, &mut out);
        assert_eq!(open(&p), vec![1001, 1002, 1004, 1005]);
        syn(&mut p, 1006, 13, &mut out);
        assert_eq!(open(&p), vec![1001, 1002, 1005, 1006]);
        syn(&mut p, 1007, 14, &mut out);
        assert_eq!(open(&p), vec![1002, 1005, 1006, 1007]);
    }

    #[test]
    fn limits_are_totals_over_pipelines_that_share_a_usage() {
        let limits = Limits {
            max_flows: 4,
            ..Limits::default()
        };
        let usage = Arc::new(SharedUsage::default());
        let mut a = Pipeline::with_usage(limits, usage.clone());
        let mut b = Pipeline::with_usage(limits, usage.clone());
        let mut out = Vec::new();
        for port in [1001, 1002, 1003] {
            a.handle_packet(Timestamp(1), 1, &frame(port, 0, true, b""), &mut out);
        }
        b.handle_packet(Timestamp(2), 1, &frame(2001, 0, true, b""), &mut out);
        assert_eq!(usage.flows(), 4);
        // Over the total, b makes room among its own flows, not a's.
        b.handle_packet(Timestamp(3), 1, &frame(2002, 0, true, b""), &mut out);
        assert_eq!(
            (a.active_flows(), b.active_flows(), usage.flows()),
            (3, 1, 4)
        );
        assert!(usage.memory() >= a.memory_in_use() + b.memory_in_use());
        drop(b);
        assert_eq!(usage.flows(), 3);
        // Alone under the total, a behaves as a pipeline of its own.
        a.handle_packet(Timestamp(4), 1, &frame(1004, 0, true, b""), &mut out);
        assert_eq!(a.active_flows(), 4);
        let evicted = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Telemetry(Telemetry::FlowEvicted {
                        reason: FlowEvictReason::FlowLimit
                    })
                )
            })
            .count();
        assert_eq!(evicted, 1);
    }

    #[test]
    fn eviction_queue_stays_bounded_when_flows_end_on_their_own() {
        let mut p = Pipeline::new(Limits::default());
        let mut out = Vec::new();
        for port in 1000..40_000u16 {
            let ts = Timestamp(i64::from(port));
            p.handle_packet(ts, 1, &frame(port, 0, true, b""), &mut out);
            let mut rst = Vec::new();
            etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
                .ipv4([10, 0, 0, 2], [10, 0, 0, 1], 64)
                .tcp(port, 8080, 1, 1000)
                .rst()
                .write(&mut rst, b"")
                .expect("frame");
            p.handle_packet(ts, 1, &rst, &mut out);
            out.clear();
        }
        assert_eq!(p.active_flows(), 0);
        assert!(
            p.eviction_queue.len() <= 1024 + 1,
            "{}",
            p.eviction_queue.len()
        );
    }

    #[test]
    fn memory_budget_evicts_least_recently_seen_flows() {
        let limits = Limits {
            memory_budget_bytes: 2 * 1024 * 1024,
            ..Limits::default()
        };
        let mut p = Pipeline::new(limits);
        let mut out = Vec::new();
        let hole = vec![b'x'; 16 * 1024];
        for port in 1000..3000u16 {
            let ts = Timestamp(i64::from(port) * 1000);
            p.handle_packet(ts, 1, &frame(port, 0, true, b""), &mut out);
            // Data beyond a hole stays buffered until the hole fills or the cap is hit.
            p.handle_packet(
                ts,
                1,
                &frame(port, 100, false, b"POST / HTTP/1.1\r\n"),
                &mut out,
            );
            p.handle_packet(ts, 1, &frame(port, 10_000, false, &hole[..1400]), &mut out);
            assert!(
                p.memory_in_use() <= limits.memory_budget_bytes,
                "{}",
                p.memory_in_use()
            );
        }
        let evicted = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Telemetry(Telemetry::FlowEvicted {
                        reason: FlowEvictReason::Memory
                    })
                )
            })
            .count();
        assert!(evicted > 0);
        assert!(p.active_flows() < 2000);
    }

    /// A segment of the connection from 10.0.0.2:`client_port` to 10.0.0.1:8080, either way.
    fn segment(client_port: u16, to_server: bool, seq: u32, payload: &[u8]) -> Vec<u8> {
        let (src, dst, sport, dport) = if to_server {
            ([10, 0, 0, 2], [10, 0, 0, 1], client_port, 8080)
        } else {
            ([10, 0, 0, 1], [10, 0, 0, 2], 8080, client_port)
        };
        let mut v = Vec::new();
        etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src, dst, 64)
            .tcp(sport, dport, seq, 1000)
            .write(&mut v, payload)
            .expect("frame");
        v
    }

    #[test]
    fn sessions_count_against_the_memory_budget() {
        let limits = Limits {
            memory_budget_bytes: 200 * 1024,
            ..Limits::default()
        };
        let mut p = Pipeline::new(limits);
        let mut out = Vec::new();
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"tools":{"streaming":true}},"clientInfo":{"name":"a","version":"1"}}}"#;
        let result =
            r#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tools":{"streaming":true}}}}"#;
        for i in 0..300u16 {
            let port = 2000 + i;
            let ts = Timestamp(i64::from(i) * 1000);
            let req = format!(
                "POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{init}",
                init.len()
            );
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s-{i}\r\nContent-Length: {}\r\n\r\n{result}",
                result.len()
            );
            p.handle_packet(ts, 1, &frame(port, 0, true, b""), &mut out);
            p.handle_packet(ts, 1, &segment(port, true, 1, req.as_bytes()), &mut out);
            p.handle_packet(
                ts,
                1,
                &segment(port, false, 5000, resp.as_bytes()),
                &mut out,
            );
            // Connections stay open: flows and sessions pile up together.
            assert!(p.tracker.session_bytes() <= session_budget(&limits));
            assert!(
                p.memory_in_use() <= limits.memory_budget_bytes,
                "{}",
                p.memory_in_use()
            );
        }
        let count = |pred: &dyn Fn(&Output) -> bool| out.iter().filter(|o| pred(o)).count();
        let started = count(&|o| matches!(o, Output::Telemetry(Telemetry::SessionStarted { .. })));
        assert_eq!(started, 300);
        let evicted = count(&|o| {
            matches!(o, Output::Event(crate::model::Event::SessionEnd(e))
                if e.reason == crate::model::EndReason::Evicted)
        });
        // Each session here is charged about 1.1 KB: about 135 fit in 150 KiB, fewer once the
        // records of evicted sessions (kept for lineage, at most 1/8 of it) and the cached
        // capability record take their share (evictions free room in steps: 79 stay).
        assert!((70..=200).contains(&(300 - evicted)), "evicted {evicted}");
        let flows_evicted = count(&|o| {
            matches!(
                o,
                Output::Telemetry(Telemetry::FlowEvicted {
                    reason: FlowEvictReason::Memory
                })
            )
        });
        assert!(flows_evicted > 0);
    }
}
