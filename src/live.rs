//! Live capture adapter: libpcap handles on dedicated threads, feeding batches of packets to
//! the same sans-IO pipeline that `replay` uses. It knows neither the config file nor the
//! sinks: the daemon hands it a [`CaptureSetup`] and a callback for pcap's drop counts.

use mcptap_core::decode::{self, TcpFlags};
use nix::poll::{PollFd, PollFlags, poll};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Packets handed from a capture thread to the pipeline in one message (amortises channel cost).
#[derive(Debug, Default)]
pub struct Batch {
    pub linktype: u32,
    pub data: Vec<u8>,
    /// (timestamp ns, offset into `data`, length)
    pub packets: Vec<(i64, usize, usize)>,
}

impl Batch {
    /// Appends one packet (a copy of `frame`, captured at `ts` ns).
    #[inline]
    pub fn push(&mut self, ts: i64, frame: &[u8]) {
        let off = self.data.len();
        self.data.extend_from_slice(frame);
        self.packets.push((ts, off, frame.len()));
    }

    /// Whether the batch is due to be sent (512 packets or 4 MiB).
    #[inline]
    pub fn is_full(&self) -> bool {
        self.packets.len() >= BATCH_PACKETS || self.data.len() >= BATCH_BYTES
    }

    pub fn iter(&self) -> impl Iterator<Item = (i64, &[u8])> {
        self.packets
            .iter()
            .filter_map(|&(ts, off, len)| self.data.get(off..off + len).map(|d| (ts, d)))
    }
}

/// What to open: interfaces, filter and libpcap handle options.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureSetup {
    /// Interfaces to capture on; `any` captures all (Linux cooked SLL2).
    pub interfaces: Vec<String>,
    /// BPF filter.
    pub filter: String,
    pub snaplen: u32,
    pub promiscuous: bool,
    /// Kernel capture buffer per interface, bytes.
    pub buffer_bytes: u32,
    /// Read timeout in ms: packets are delivered in batches (TPACKET_V3 stays on).
    pub read_timeout_ms: u32,
}

pub struct OpenCapture {
    pub interface: String,
    pub linktype: u32,
    cap: pcap::Capture<pcap::Active>,
}

fn permission_hint(interface: &str, err: &str) -> String {
    format!(
        "cannot capture on {interface}: permission denied ({err}); mcptap needs CAP_NET_RAW and CAP_NET_ADMIN: run as root, use the systemd unit, or `setcap cap_net_raw,cap_net_admin=eip $(command -v mcptap)`"
    )
}

/// Opens every interface with the configured filter; errors are one clear line each.
pub fn open(cfg: &CaptureSetup) -> Result<Vec<OpenCapture>, String> {
    if cfg.interfaces.is_empty() {
        return Err("no interface to capture on: give --interface NAME (or `any`)".into());
    }
    let devices = pcap::Device::list().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let mut opened = Vec::new();
    for name in &cfg.interfaces {
        let Some(device) = devices.iter().find(|d| &d.name == name).cloned() else {
            let known: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            return Err(format!(
                "no such interface: {name} (available: {})",
                known.join(", ")
            ));
        };
        let inactive = pcap::Capture::from_device(device)
            .map_err(|e| format!("cannot capture on {name}: {e}"))?
            .snaplen(i32::try_from(cfg.snaplen).unwrap_or(i32::MAX))
            .promisc(cfg.promiscuous)
            .buffer_size(i32::try_from(cfg.buffer_bytes).unwrap_or(i32::MAX))
            // Non-immediate with a short timeout: the kernel hands over blocks (TPACKET_V3).
            .immediate_mode(false)
            .timeout(i32::try_from(cfg.read_timeout_ms).unwrap_or(100));
        let cap = inactive.open().map_err(|e| {
            let msg = e.to_string();
            let lower = msg.to_ascii_lowercase();
            if lower.contains("permission") || lower.contains("not permitted") {
                permission_hint(name, &msg)
            } else if lower.contains("no such device") {
                format!("no such interface: {name}")
            } else {
                format!("cannot capture on {name}: {msg}")
            }
        })?;
        let mut cap = cap
            .setnonblock()
            .map_err(|e| format!("cannot capture on {name}: {e}"))?;
        cap.filter(&cfg.filter, true)
            .map_err(|e| format!("bad capture filter {:?}: {e}", cfg.filter))?;
        let linktype = u32::try_from(cap.get_datalink().0).unwrap_or(u32::MAX);
        opened.push(OpenCapture {
            interface: name.clone(),
            linktype,
            cap,
        });
    }
    Ok(opened)
}

/// State shared between capture threads and the health endpoint.
#[derive(Debug, Default)]
pub struct CaptureHealth {
    /// Capture threads currently running.
    pub running: AtomicUsize,
    /// A capture thread failed (the daemon is not ready).
    pub failed: AtomicBool,
}

impl CaptureHealth {
    /// Ready when all `opened` capture threads run and none failed; else why not, in one line.
    pub fn readiness(&self, opened: usize) -> Result<(), String> {
        let running = self.running.load(Ordering::SeqCst);
        if self.failed.load(Ordering::SeqCst) || running < opened {
            Err(format!("{running}/{opened} captures running"))
        } else {
            Ok(())
        }
    }
}

/// New drops reported by pcap_stats since the previous report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drops {
    /// Dropped by the kernel (buffer full).
    pub kernel: u64,
    /// Dropped by the interface or its driver.
    pub interface: u64,
}

impl Drops {
    /// The sources that dropped packets in this report, by their `source` label.
    pub fn by_source(self) -> [(&'static str, u64); 2] {
        [("kernel", self.kernel), ("interface", self.interface)]
    }
}

/// Which drop sources of one interface were warned about: one WARN per source, the first time
/// it drops (the counter and the alert rule take it from there).
#[derive(Debug, Default)]
pub struct DropWarnings {
    warned: [bool; 2],
}

impl DropWarnings {
    /// The sources of `drops` to warn about now, with their counts.
    pub fn first(&mut self, drops: Drops) -> Vec<(&'static str, u64)> {
        let mut now = Vec::new();
        for (warned, (source, n)) in self.warned.iter_mut().zip(drops.by_source()) {
            if n > 0 && !std::mem::replace(warned, true) {
                now.push((source, n));
            }
        }
        now
    }
}

/// pcap's counters (received, dropped) are u32 and wrap; this widens them into running u64
/// deltas and a u64 total.
#[derive(Debug, Default, Clone, Copy)]
pub struct DropCounter {
    last: Option<u32>,
    total: u64,
}

impl DropCounter {
    /// New counts since the previous reading.
    pub fn delta(&mut self, now: u32) -> u64 {
        let d = match self.last {
            Some(prev) => u64::from(now.wrapping_sub(prev)),
            None => u64::from(now),
        };
        self.last = Some(now);
        self.total += d;
        d
    }

    /// Everything counted so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

const BATCH_PACKETS: usize = 512;
const POLL_TIMEOUT_MS: u16 = 100;

/// How long part-filled batches may wait for more packets once the ring has run dry. Each
/// hand-over wakes a worker (a futex call: microseconds on a VM), and at line rate the ring
/// runs dry after every block the kernel retires, thousands of times a second; a full batch
/// still goes at once. Packets wait in the kernel's block for up to `read_timeout_ms` anyway.
const FLUSH_LINGER: Duration = Duration::from_millis(2);

/// When the capture thread hands over its part-filled batches (see [`FLUSH_LINGER`]).
#[derive(Debug, Default)]
struct FlushTimer {
    /// When the ring first ran dry with packets held since the last hand-over.
    held_since: Option<Instant>,
}

/// What the capture thread does when the ring has nothing more for now.
#[derive(Debug, PartialEq)]
enum WhenDry {
    /// Hand the held packets over, then wait for the ring.
    Flush,
    /// Wait for the ring at most this long; flush then if nothing came.
    Linger(Duration),
}

impl FlushTimer {
    fn dry(&mut self, holding: bool, now: Instant) -> WhenDry {
        if !holding {
            self.held_since = None;
            return WhenDry::Flush;
        }
        let since = *self.held_since.get_or_insert(now);
        match FLUSH_LINGER.checked_sub(now.saturating_duration_since(since)) {
            Some(left) if !left.is_zero() => WhenDry::Linger(left),
            _ => {
                self.held_since = None;
                WhenDry::Flush
            }
        }
    }
}

/// A pipeline worker's queue as the capture threads see it: its sender and the gauges of
/// what waits in it (the worker takes batches off `depth` as it receives them).
#[derive(Debug, Clone)]
pub struct WorkerQueue {
    tx: SyncSender<Batch>,
    /// Emptied batches the worker handed back ([`WorkerInbox::recycle`]); shared by every
    /// capture thread that feeds this worker.
    recycled: Arc<Mutex<Vec<Batch>>>,
    /// Batches queued for the worker.
    pub depth: prometheus::IntGauge,
    /// Packets whose batch found the queue full: the capture thread waited for the worker.
    pub waited_packets: prometheus::IntCounter,
}

/// The worker's end of a [`WorkerQueue`].
pub struct WorkerInbox {
    rx: Receiver<Batch>,
    recycled: Arc<Mutex<Vec<Batch>>>,
}

/// Emptied batches that wait to be filled again, per worker. Two cover the steady state (one
/// being filled while the worker parses the last); the rest absorb jitter. Beyond it a batch
/// is freed, so the memory they hold stays under `RECYCLED_BATCHES * 2 * BATCH_BYTES`.
const RECYCLED_BATCHES: usize = 4;

/// A queue of `batches` batches from a capture thread to one worker, and the way back for
/// emptied ones. Recycled, a batch is refilled in memory that is already mapped and warm: a
/// fresh one costs the capture thread a page fault every 4 KiB it writes, and the worker the
/// free of a large block.
pub fn worker_queue(
    batches: usize,
    depth: prometheus::IntGauge,
    waited_packets: prometheus::IntCounter,
) -> (WorkerQueue, WorkerInbox) {
    let (tx, rx) = sync_channel(batches);
    let recycled = Arc::new(Mutex::new(Vec::with_capacity(RECYCLED_BATCHES)));
    (
        WorkerQueue {
            tx,
            recycled: recycled.clone(),
            depth,
            waited_packets,
        },
        WorkerInbox { rx, recycled },
    )
}

impl WorkerInbox {
    /// The next batch, waiting at most `wait`.
    pub fn recv_timeout(&self, wait: Duration) -> Result<Batch, RecvTimeoutError> {
        self.rx.recv_timeout(wait)
    }

    /// The next batch; `None` once the capture side is gone and the queue is empty.
    pub fn recv(&self) -> Option<Batch> {
        self.rx.recv().ok()
    }

    /// Hands a parsed batch back to be filled again. One that grew past what a full batch
    /// needs (a frame beyond the byte limit) is freed instead, as are batches beyond
    /// [`RECYCLED_BATCHES`].
    pub fn recycle(&self, mut batch: Batch) {
        if batch.data.capacity() > 2 * BATCH_BYTES || batch.packets.capacity() > BATCH_PACKETS {
            return;
        }
        batch.data.clear();
        batch.packets.clear();
        let mut pool = self.recycled.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < RECYCLED_BATCHES {
            pool.push(batch);
        }
    }
}

/// A pipeline worker ended while its capture still ran: it panicked (its panic message is
/// on standard error just before), and the capture stops rather than feed the others alone.
fn worker_gone(interface: &str) {
    tracing::error!(
        interface,
        "a pipeline worker stopped (it panicked): capture stopped, /readyz fails"
    );
}

/// Hands a full or pending batch to the pipeline; false when the pipeline is gone.
pub fn send(queue: &WorkerQueue, batch: &mut Batch, linktype: u32) -> bool {
    // The next batch is one the worker handed back, or a new one with the room of this one:
    // grown from empty, a batch of 512 full-size frames is copied about twice over by its
    // reallocations (half the capture thread's instructions per packet). The room only grows
    // when a batch needs more than any before, and never beyond what a full batch can take
    // (the last frame may pass the byte limit).
    let recycled = queue
        .recycled
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop();
    let next = match recycled {
        Some(recycled) => Batch {
            linktype,
            ..recycled
        },
        None => Batch {
            linktype,
            data: Vec::with_capacity(batch.data.capacity().min(2 * BATCH_BYTES)),
            packets: Vec::with_capacity(batch.packets.capacity().min(BATCH_PACKETS)),
        },
    };
    let out = std::mem::replace(batch, next);
    let sent = match queue.tx.try_send(out) {
        Ok(()) => true,
        // The pipeline is behind: block rather than drop (the kernel buffer absorbs the
        // burst and pcap_stats counts what it cannot), and say so in a counter.
        Err(TrySendError::Full(b)) => {
            queue.waited_packets.inc_by(b.packets.len() as u64);
            queue.tx.send(b).is_ok()
        }
        Err(TrySendError::Disconnected(_)) => false,
    };
    if sent {
        queue.depth.inc();
    }
    sent
}
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// A bounded map in two generations: a hit in the old generation moves the entry to the young
/// one; when the young one is full it becomes the old one and the old one is dropped (counted).
/// So entries used within the last `cap` insertions stay, at O(1) per operation, and the map
/// never holds more than `2 * cap` entries.
#[derive(Debug, Clone)]
struct Generations<K, V> {
    young: HashMap<K, V, foldhash::fast::RandomState>,
    old: HashMap<K, V, foldhash::fast::RandomState>,
    cap: usize,
    evicted: u64,
    /// Times the young generation became the old one: an entry put in the young one at
    /// `swaps == n` is still there, unchanged by lookups, while `swaps == n` (unless removed).
    swaps: u64,
}

impl<K: std::hash::Hash + Eq + Copy, V: Copy> Generations<K, V> {
    fn new(cap: usize) -> Self {
        Generations {
            young: HashMap::default(),
            old: HashMap::default(),
            cap: cap.max(1),
            evicted: 0,
            swaps: 0,
        }
    }

    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    fn get(&mut self, k: &K) -> Option<V> {
        if let Some(v) = self.young.get(k) {
            return Some(*v);
        }
        let v = self.old.remove(k)?;
        self.insert(*k, v);
        Some(v)
    }

    fn insert(&mut self, k: K, v: V) {
        if self.young.len() >= self.cap && !self.young.contains_key(&k) {
            self.old.remove(&k);
            self.evicted += self.old.len() as u64;
            std::mem::swap(&mut self.young, &mut self.old);
            self.young.clear();
            self.swaps += 1;
        }
        self.young.insert(k, v);
    }

    fn remove(&mut self, k: &K) {
        self.young.remove(k);
        self.old.remove(k);
    }
}

/// Learned server endpoints kept per generation (the directory holds at most twice as many).
pub const LEARNED_SERVERS: usize = 4096;
/// Flows first seen midstream, with no known server, kept per generation.
pub const PINNED_FLOWS: usize = 16_384;

/// What a [`ServerDirectory`] holds and has evicted, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    /// Server endpoints learned from SYN / SYN-ACK and still held.
    pub learned: usize,
    /// Learned server endpoints evicted (unused for the longest).
    pub learned_evicted: u64,
    /// Flows first seen midstream with no known server, pinned to their fallback endpoint.
    pub pinned: usize,
    /// Pinned flows evicted.
    pub pinned_evicted: u64,
}

/// Which endpoint of a TCP segment is the server, from TCP header flags and ports only (the
/// capture thread parses no payload):
///
/// 1. a configured server endpoint (`[servers]`), either side;
/// 2. a SYN's destination, a SYN-ACK's source — learned into a bounded set;
/// 3. a learned endpoint, either side;
/// 4. else (a flow never seen from its start, to no known server) the endpoint with the lower
///    port, the lower address on equal ports — pinned for the rest of the flow, so that a
///    server learned later does not move a flow already under way to another worker.
///
/// Every frame of a flow, in both directions, gets the same answer, and so does every flow to
/// one server once its server is known. This is the first stage of a later two-stage sharding
/// (flows by their symmetric 5-tuple, MCP state by server and client identity): it answers the
/// server identity of a frame.
#[derive(Debug, Clone)]
pub struct ServerDirectory {
    configured: HashSet<EndpointKey, foldhash::fast::RandomState>,
    learned: Generations<EndpointKey, ()>,
    pinned: Generations<FlowPairKey, PinnedServer>,
}

/// An endpoint packed into integers for the directory's maps: comparing and hashing it are a
/// few integer operations on every packet, where a `SocketAddr`'s go through its variants (and
/// a v6 flow label and scope id, which are not on the wire). `port` carries the family above
/// its 16 port bits, so a v4 endpoint never equals a v4-mapped v6 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointKey {
    ip_hi: u64,
    ip_lo: u64,
    port: u32,
}

const V6_FAMILY: u32 = 1 << 16;

impl EndpointKey {
    #[inline]
    fn v4(a: std::net::SocketAddrV4) -> Self {
        EndpointKey {
            ip_hi: 0,
            ip_lo: u64::from(a.ip().to_bits()),
            port: u32::from(a.port()),
        }
    }

    #[inline]
    fn of(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(a) => EndpointKey::v4(a),
            SocketAddr::V6(a) => {
                let bits = a.ip().to_bits();
                EndpointKey {
                    ip_hi: (bits >> 64) as u64,
                    ip_lo: bits as u64,
                    port: u32::from(a.port()) | V6_FAMILY,
                }
            }
        }
    }

    #[inline]
    fn is_v4(&self) -> bool {
        self.port & V6_FAMILY == 0
    }

    /// Whether this endpoint, not `other`, is the one a flow nobody saw start is attributed
    /// to: the lower port (clients usually use ephemeral ports), the lower address on equal
    /// ports, ordered as `SocketAddr`s are (v4 before v6). Symmetric in its arguments.
    #[inline]
    fn is_lower_port_than(&self, other: &EndpointKey) -> bool {
        match (self.port & 0xffff).cmp(&(other.port & 0xffff)) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => (!self.is_v4(), self) <= (!other.is_v4(), other),
        }
    }
}

impl Hash for EndpointKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        // One word for v4. Workers are chosen from this hash: keep it as it was for
        // `SocketAddr`s, so a server keeps its worker across versions.
        if self.is_v4() {
            state.write_u64((self.ip_lo << 16) | u64::from(self.port));
        } else {
            state.write_u128((u128::from(self.ip_hi) << 64) | u128::from(self.ip_lo));
            state.write_u16(self.port as u16);
        }
    }
}

/// A [`ServerDirectory`]'s answer for one segment.
#[derive(Debug, Clone, Copy)]
struct Route {
    /// The server is the segment's source (else its destination).
    server_is_src: bool,
    /// A segment the other way round gets the same server (all but a flow between two
    /// configured servers, where the destination wins).
    either_way: bool,
}

/// Both endpoints of a flow, the lower first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowPairKey(EndpointKey, EndpointKey);

impl FlowPairKey {
    /// The pair and whether `a` is its lower endpoint.
    #[inline]
    fn of(a: EndpointKey, b: EndpointKey) -> (Self, bool) {
        if a <= b {
            (FlowPairKey(a, b), true)
        } else {
            (FlowPairKey(b, a), false)
        }
    }
}

impl Hash for FlowPairKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (a, b) = (&self.0, &self.1);
        if a.is_v4() && b.is_v4() {
            state.write_u64((a.ip_lo << 32) | b.ip_lo);
        } else {
            state.write_u128((u128::from(a.ip_hi) << 64) | u128::from(a.ip_lo));
            state.write_u128((u128::from(b.ip_hi) << 64) | u128::from(b.ip_lo));
        }
        state.write_u64((u64::from(a.port) << 32) | u64::from(b.port));
    }
}

/// Which endpoint of a pinned flow is its server: the pair's lower one or its upper one (a
/// byte, where the address would take 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PinnedServer {
    Lower,
    Upper,
}

impl Default for ServerDirectory {
    fn default() -> Self {
        Self::new([])
    }
}

impl ServerDirectory {
    /// A directory that knows `configured` server endpoints and learns the rest.
    pub fn new(configured: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self::with_capacity(configured, LEARNED_SERVERS, PINNED_FLOWS)
    }

    /// As [`ServerDirectory::new`], with the generation sizes given (tests).
    pub fn with_capacity(
        configured: impl IntoIterator<Item = SocketAddr>,
        learned: usize,
        pinned: usize,
    ) -> Self {
        ServerDirectory {
            configured: configured.into_iter().map(EndpointKey::of).collect(),
            learned: Generations::new(learned),
            pinned: Generations::new(pinned),
        }
    }

    /// The server endpoint of a segment from `src` to `dst` with `flags`.
    pub fn server_of(&mut self, src: SocketAddr, dst: SocketAddr, flags: TcpFlags) -> SocketAddr {
        if self
            .route(EndpointKey::of(src), EndpointKey::of(dst), flags)
            .server_is_src
        {
            src
        } else {
            dst
        }
    }

    /// [`ServerDirectory::server_of`] on packed endpoints, as the capture thread asks on every
    /// frame.
    fn route(&mut self, src: EndpointKey, dst: EndpointKey, flags: TcpFlags) -> Route {
        let decided = |server_is_src| Route {
            server_is_src,
            either_way: true,
        };
        if !self.configured.is_empty() {
            if self.configured.contains(&dst) {
                // Both configured: the destination wins, so the other way round the other does.
                return Route {
                    server_is_src: false,
                    either_way: !self.configured.contains(&src),
                };
            }
            if self.configured.contains(&src) {
                return decided(true);
            }
        }
        let (flow, src_is_lower) = FlowPairKey::of(src, dst);
        // The pin of a flow whose server is `src` (or `dst`).
        let pin_of = |server_is_src: bool| {
            if server_is_src == src_is_lower {
                PinnedServer::Lower
            } else {
                PinnedServer::Upper
            }
        };
        if flags.syn {
            // A SYN-ACK comes from the server, a SYN goes to it.
            let server_is_src = flags.ack;
            self.learned
                .insert(if server_is_src { src } else { dst }, ());
            // A new connection on the 5-tuple: its server is decided for its lifetime.
            self.pinned.insert(flow, pin_of(server_is_src));
            return decided(server_is_src);
        }
        // Once decided, a flow keeps its server (and so its worker) whatever is learned or
        // evicted later; its pin goes with the connection's end.
        if let Some(pin) = self.pinned.get(&flow) {
            if flags.fin || flags.rst {
                self.pinned.remove(&flow);
            }
            return decided((pin == PinnedServer::Lower) == src_is_lower);
        }
        let server_is_src = match (
            self.learned.get(&dst).is_some(),
            self.learned.get(&src).is_some(),
        ) {
            (true, false) => false,
            (false, true) => true,
            (true, true) | (false, false) => src.is_lower_port_than(&dst),
        };
        if !(flags.fin || flags.rst) {
            self.pinned.insert(flow, pin_of(server_is_src));
        }
        decided(server_is_src)
    }

    /// Changes whenever a pinned flow may have left the young generation (where a lookup
    /// changes nothing): a route answered at one epoch holds while it stays.
    fn pin_epoch(&self) -> u64 {
        self.pinned.swaps
    }

    pub fn stats(&self) -> DirectoryStats {
        DirectoryStats {
            learned: self.learned.len(),
            learned_evicted: self.learned.evicted,
            pinned: self.pinned.len(),
            pinned_evicted: self.pinned.evicted,
        }
    }
}

/// The worker of a server endpoint: every flow to one server meets in one worker, so its
/// sessions, which span connections, stay whole. The same for every capture thread and replay.
pub fn worker_of_server(server: SocketAddr, workers: usize) -> usize {
    worker_of_key(EndpointKey::of(server), workers)
}

#[inline]
fn worker_of_key(server: EndpointKey, workers: usize) -> usize {
    if workers <= 1 {
        return 0;
    }
    let h = foldhash::fast::FixedState::with_seed(0x6d63_7074_6170).hash_one(server);
    // The hash scaled to 0..workers (its high bits): a multiply, where `%` is a division.
    ((u128::from(h) * workers as u128) >> 64) as usize
}

/// Which pipeline worker a frame goes to: decodes the link, IP and TCP headers only (no
/// payload), asks its [`ServerDirectory`] for the server endpoint and hashes that. One per
/// capture thread; `replay --worker-threads` uses the same.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    directory: ServerDirectory,
    workers: usize,
    /// Recent flows and their workers, while the directory is sure to answer their next
    /// frames alike (see [`Dispatcher::worker_of`]); direct-mapped by the flow's endpoints.
    routes: Box<[CachedRoute]>,
}

/// Flows a [`Dispatcher`] remembers the worker of: a power of two, 64 bytes each (128 KiB,
/// within a core's L2 cache). Enough for the flows active at once on a busy gateway; a flow
/// whose slot another took asks the directory again (the answer is the same, only slower).
const CACHED_ROUTES: usize = 2048;

/// A flow's worker as the directory last answered it, with what makes that answer hold.
#[derive(Debug, Clone, Copy)]
struct CachedRoute {
    flow: FlowPairKey,
    /// The directory's pin epoch when answered ([`ServerDirectory::pin_epoch`]); `u64::MAX`:
    /// an empty slot.
    epoch: u64,
    worker: u32,
    /// A frame the other way round goes to the same worker (all but a flow between two
    /// configured servers, where the destination wins).
    either_way: bool,
    /// The answered frame's source was the pair's lower endpoint.
    src_was_lower: bool,
}

const EMPTY_ROUTE: CachedRoute = CachedRoute {
    flow: FlowPairKey(
        EndpointKey {
            ip_hi: 0,
            ip_lo: 0,
            port: 0,
        },
        EndpointKey {
            ip_hi: 0,
            ip_lo: 0,
            port: 0,
        },
    ),
    epoch: u64::MAX,
    worker: 0,
    either_way: false,
    src_was_lower: false,
};

impl FlowPairKey {
    /// The flow's slot among [`CACHED_ROUTES`]: a multiplicative hash of its endpoints (not
    /// keyed: a crafted collision only sends those flows to the directory, as without a cache).
    #[inline]
    fn route_slot(&self) -> usize {
        const K1: u64 = 0x9e37_79b9_7f4a_7c15;
        const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
        let (a, b) = (&self.0, &self.1);
        let x = (a.ip_lo ^ a.ip_hi.rotate_left(32) ^ (u64::from(a.port) << 48)).wrapping_mul(K1);
        let y = (b.ip_lo ^ b.ip_hi.rotate_left(32) ^ (u64::from(b.port) << 48)).wrapping_mul(K2);
        ((x ^ y.rotate_left(23)).wrapping_mul(K1) >> (64 - CACHED_ROUTES.trailing_zeros())) as usize
    }
}

impl Dispatcher {
    pub fn new(directory: ServerDirectory, workers: usize) -> Self {
        Dispatcher {
            directory,
            workers: workers.max(1),
            routes: vec![EMPTY_ROUTE; CACHED_ROUTES].into_boxed_slice(),
        }
    }

    /// The worker of a frame. A frame without SYN, FIN or RST of a flow whose route is cached
    /// goes where the flow's last answered frame went without asking the directory (the other
    /// way round too, unless both ends are configured servers). That is the directory's answer
    /// all the same: that frame left the flow pinned in the young generation, where a lookup
    /// changes nothing, as long as no generation has turned since (the pin epoch), or had a
    /// configured server. A SYN (which pins anew), a FIN or an RST (which unpin) always asks.
    pub fn worker_of(&mut self, linktype: u32, frame: &[u8]) -> usize {
        if self.workers <= 1 {
            return 0;
        }
        // Plain IPv4 read straight into keys; anything else through the general decoder.
        let (src, dst, flags) = match decode::plain_v4_endpoints(linktype, frame) {
            Some(e) => (EndpointKey::v4(e.src), EndpointKey::v4(e.dst), e.flags),
            None => {
                let Some(seg) = decode::tcp_endpoints(linktype, frame) else {
                    return 0;
                };
                (
                    EndpointKey::of(seg.src),
                    EndpointKey::of(seg.dst),
                    seg.flags,
                )
            }
        };
        let (flow, src_is_lower) = FlowPairKey::of(src, dst);
        let slot = flow.route_slot();
        let epoch = self.directory.pin_epoch();
        let ends = flags.syn || flags.fin || flags.rst;
        if !ends
            && let Some(cached) = self.routes.get(slot)
            && cached.epoch == epoch
            && cached.flow == flow
            && (cached.either_way || cached.src_was_lower == src_is_lower)
        {
            return cached.worker as usize;
        }
        let route = self.directory.route(src, dst, flags);
        let server = if route.server_is_src { src } else { dst };
        let worker = worker_of_key(server, self.workers);
        if let Some(cached) = self.routes.get_mut(slot) {
            *cached = if flags.fin || flags.rst {
                EMPTY_ROUTE
            } else {
                CachedRoute {
                    flow,
                    // Read after the lookup, which may have turned a generation.
                    epoch: self.directory.pin_epoch(),
                    worker: worker as u32,
                    either_way: route.either_way,
                    src_was_lower: src_is_lower,
                }
            };
        }
        worker
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    pub fn stats(&self) -> DirectoryStats {
        self.directory.stats()
    }
}

/// Runs one capture handle on its own thread until `stop` is set. The thread only reads and
/// dispatches to the workers (`dispatcher`, one per capture thread, sized to `workers`); all
/// parsing happens there. `on_drops` hears pcap's drop counts and the dispatcher's directory
/// about once a second and at the end.
pub fn spawn(
    mut oc: OpenCapture,
    workers: Vec<WorkerQueue>,
    mut dispatcher: Dispatcher,
    stop: Arc<AtomicBool>,
    health: Arc<CaptureHealth>,
    mut on_drops: impl FnMut(Drops, DirectoryStats) + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("capture-{}", oc.interface))
        .spawn(move || {
            health.running.fetch_add(1, Ordering::SeqCst);
            let linktype = oc.linktype;
            let mut batches: Vec<Batch> = workers
                .iter()
                .map(|_| Batch {
                    linktype,
                    ..Batch::default()
                })
                .collect();
            let (mut kernel, mut iface) = (DropCounter::default(), DropCounter::default());
            // pcap's received counter wraps too; only logged when the capture stops.
            let mut received = DropCounter::default();
            let mut last_stats = Instant::now();
            let mut flush = FlushTimer::default();
            'capture: while !stop.load(Ordering::Relaxed) {
                // Drain what the kernel has; part-filled batches go when the ring stays dry
                // (at most FLUSH_LINGER after it first ran dry).
                loop {
                    match oc.cap.next_packet() {
                        Ok(p) => {
                            let ts = p.header.ts.tv_sec.saturating_mul(1_000_000_000)
                                + p.header.ts.tv_usec.saturating_mul(1000);
                            let w = dispatcher.worker_of(linktype, p.data);
                            let (Some(batch), Some(tx)) = (batches.get_mut(w), workers.get(w))
                            else {
                                continue;
                            };
                            batch.push(ts, p.data);
                            if batch.is_full() && !send(tx, batch, linktype) {
                                // A worker is gone: the capture cannot go on whole.
                                worker_gone(&oc.interface);
                                health.failed.store(true, Ordering::SeqCst);
                                break 'capture;
                            }
                        }
                        Err(pcap::Error::TimeoutExpired) => break,
                        Err(e) => {
                            tracing::error!(interface = %oc.interface, "capture failed: {e}");
                            health.failed.store(true, Ordering::SeqCst);
                            break 'capture;
                        }
                    }
                }
                let holding = batches.iter().any(|b| !b.packets.is_empty());
                let wait_ms = match flush.dry(holding, Instant::now()) {
                    WhenDry::Flush => {
                        for (batch, tx) in batches.iter_mut().zip(&workers) {
                            if !batch.packets.is_empty() && !send(tx, batch, linktype) {
                                worker_gone(&oc.interface);
                                health.failed.store(true, Ordering::SeqCst);
                                break 'capture;
                            }
                        }
                        POLL_TIMEOUT_MS
                    }
                    WhenDry::Linger(left) => {
                        u16::try_from(left.as_millis().max(1)).unwrap_or(POLL_TIMEOUT_MS)
                    }
                };
                if last_stats.elapsed() >= Duration::from_secs(1) {
                    last_stats = Instant::now();
                    if let Ok(s) = oc.cap.stats() {
                        received.delta(s.received);
                        on_drops(
                            Drops {
                                kernel: kernel.delta(s.dropped),
                                interface: iface.delta(s.if_dropped),
                            },
                            dispatcher.stats(),
                        );
                    }
                }
                // libpcap's own timeout never fires on an idle TPACKET_V3 socket, so wait here.
                let mut fds = [PollFd::new(oc.cap.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, wait_ms);
            }
            for (mut batch, queue) in batches.into_iter().zip(&workers) {
                if !batch.packets.is_empty() {
                    let _ = send(queue, &mut batch, linktype);
                }
            }
            if let Ok(s) = oc.cap.stats() {
                received.delta(s.received);
                on_drops(
                    Drops {
                        kernel: kernel.delta(s.dropped),
                        interface: iface.delta(s.if_dropped),
                    },
                    dispatcher.stats(),
                );
            }
            tracing::info!(
                interface = %oc.interface,
                received = received.total(),
                dropped = kernel.total(),
                if_dropped = iface.total(),
                "capture stopped (pcap_stats)"
            );
            health.running.fetch_sub(1, Ordering::SeqCst);
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_drop_source_is_warned_about_once_when_it_first_drops() {
        let mut w = DropWarnings::default();
        let drops = |kernel, interface| Drops { kernel, interface };
        assert!(w.first(drops(0, 0)).is_empty());
        assert_eq!(w.first(drops(3, 0)), [("kernel", 3)]);
        assert!(w.first(drops(5, 0)).is_empty());
        assert_eq!(w.first(drops(7, 2)), [("interface", 2)]);
        assert!(w.first(drops(1, 1)).is_empty());
    }

    #[test]
    fn drop_counter_survives_wraparound() {
        let mut c = DropCounter::default();
        assert_eq!(c.delta(10), 10);
        assert_eq!(c.delta(15), 5);
        assert_eq!(c.delta(u32::MAX - 1), u64::from(u32::MAX - 16));
        assert_eq!(c.delta(3), 5);
        assert_eq!(c.total(), 10 + 5 + u64::from(u32::MAX - 16) + 5);
    }

    fn frame(src: ([u8; 4], u16), dst: ([u8; 4], u16), syn: bool, ack: bool) -> Vec<u8> {
        let mut v = Vec::new();
        let b = etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src.0, dst.0, 64)
            .tcp(src.1, dst.1, 1, 100);
        let b = if syn { b.syn() } else { b };
        let b = if ack { b.ack(1) } else { b };
        b.write(&mut v, if syn { b"" } else { b"x" })
            .expect("frame");
        v
    }

    fn addr(e: ([u8; 4], u16)) -> SocketAddr {
        SocketAddr::from(e)
    }

    #[test]
    fn both_directions_and_all_clients_of_a_server_share_a_worker() {
        let server = ([10, 0, 0, 1], 8080);
        let mut d = Dispatcher::new(ServerDirectory::default(), 8);
        let w = d.worker_of(1, &frame(([10, 0, 0, 2], 40000), server, false, true));
        assert_eq!(w, worker_of_server(addr(server), 8));
        assert_eq!(
            d.worker_of(1, &frame(server, ([10, 0, 0, 2], 40000), false, true)),
            w
        );
        assert_eq!(
            d.worker_of(1, &frame(([10, 9, 9, 9], 51234), server, false, true)),
            w
        );
        assert_eq!(d.worker_of(1, b"junk"), 0);
        let mut one = Dispatcher::new(ServerDirectory::default(), 1);
        assert_eq!(
            one.worker_of(1, &frame(([10, 0, 0, 2], 40000), server, false, true)),
            0
        );
    }

    #[test]
    fn packed_endpoints_keep_families_apart_and_workers_where_they_were() {
        let v4: SocketAddr = "10.0.0.1:8080".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:8080".parse().unwrap();
        assert_ne!(EndpointKey::of(v4), EndpointKey::of(mapped));
        // A flow's pin answers the same endpoint from either direction, in both families.
        let ack = TcpFlags {
            ack: true,
            ..TcpFlags::default()
        };
        let v6_client: SocketAddr = "[2001:db8::2]:40000".parse().unwrap();
        let v6_server: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let mut d = ServerDirectory::default();
        assert_eq!(d.server_of(v6_client, v6_server, ack), v6_server);
        assert_eq!(d.server_of(v6_server, v6_client, ack), v6_server);
        // Workers come from the hash the directory used before it packed its keys: one
        // word `ip << 16 | port` for v4, so an upgrade moves no server to another worker.
        let old = foldhash::fast::FixedState::with_seed(0x6d63_7074_6170)
            .hash_one((0x0a00_0001u64 << 16) | 8080);
        let expected = ((u128::from(old) * 4) >> 64) as usize;
        assert_eq!(worker_of_server(v4, 4), expected);
    }

    /// The directory's four rules written plainly on `SocketAddr`s, with maps that never
    /// evict: what [`ServerDirectory`] must answer while its generations hold everything.
    #[derive(Default)]
    struct ReferenceDirectory {
        configured: HashSet<SocketAddr>,
        learned: HashSet<SocketAddr>,
        /// Flow (endpoints in order) -> its server.
        pinned: HashMap<(SocketAddr, SocketAddr), SocketAddr>,
    }

    impl ReferenceDirectory {
        fn server_of(&mut self, src: SocketAddr, dst: SocketAddr, flags: TcpFlags) -> SocketAddr {
            for e in [dst, src] {
                if self.configured.contains(&e) {
                    return e;
                }
            }
            let flow = (src.min(dst), src.max(dst));
            if flags.syn {
                let server = if flags.ack { src } else { dst };
                self.learned.insert(server);
                self.pinned.insert(flow, server);
                return server;
            }
            if let Some(&server) = self.pinned.get(&flow) {
                if flags.fin || flags.rst {
                    self.pinned.remove(&flow);
                }
                return server;
            }
            let server = match (self.learned.contains(&dst), self.learned.contains(&src)) {
                (true, false) => dst,
                (false, true) => src,
                _ if src.port() != dst.port() => {
                    if src.port() < dst.port() {
                        src
                    } else {
                        dst
                    }
                }
                _ => src.min(dst),
            };
            if !(flags.fin || flags.rst) {
                self.pinned.insert(flow, server);
            }
            server
        }
    }

    proptest::proptest! {
        /// Random segments among a few endpoints of both families (equal ports included),
        /// some configured: the packed directory answers as the reference does, and the
        /// dispatcher's worker is that server's.
        #[test]
        fn the_packed_directory_answers_as_its_rules_say(
            configured in proptest::collection::vec(0usize..12, 0..3),
            segments in proptest::collection::vec((0usize..12, 0usize..12, 0u8..16), 1..200),
        ) {
            let endpoints: Vec<SocketAddr> = [
                "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:40000", "10.0.0.4:443",
                "10.0.0.5:1024", "0.0.0.1:8080", "[::1]:8080", "[::2]:8080",
                "[2001:db8::1]:40000", "[::ffff:10.0.0.1]:8080", "[::a00:1]:8080",
                "[2001:db8::9]:1024",
            ]
            .iter()
            .map(|e| e.parse().expect("endpoint"))
            .collect();
            let configured: Vec<SocketAddr> = configured.iter().map(|&i| endpoints[i]).collect();
            let mut d = ServerDirectory::new(configured.iter().copied());
            let mut reference = ReferenceDirectory {
                configured: configured.into_iter().collect(),
                ..ReferenceDirectory::default()
            };
            for (s, t, bits) in segments {
                let (src, dst) = (endpoints[s], endpoints[t]);
                if src == dst || src.is_ipv4() != dst.is_ipv4() {
                    continue;
                }
                let flags = TcpFlags {
                    syn: bits & 1 != 0,
                    ack: bits & 2 != 0,
                    fin: bits & 4 != 0,
                    rst: bits & 8 != 0,
                };
                let expected = reference.server_of(src, dst, flags);
                proptest::prop_assert_eq!(d.server_of(src, dst, flags), expected);
            }
        }

        /// The same through the dispatcher, frame by frame, with trains of one flow (either
        /// direction, any flags) among them: every frame goes to its server's worker.
        #[test]
        fn the_dispatcher_sends_every_frame_to_its_servers_worker(
            configured in proptest::collection::vec(0usize..6, 0..3),
            segments in proptest::collection::vec((0usize..6, 0usize..6, 0u8..16, 0u8..4), 1..300),
        ) {
            let endpoints: Vec<SocketAddr> = [
                "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:40000", "[::1]:8080",
                "[::2]:8080", "[2001:db8::1]:40000",
            ]
            .iter()
            .map(|e| e.parse().expect("endpoint"))
            .collect();
            let configured: Vec<SocketAddr> = configured.iter().map(|&i| endpoints[i]).collect();
            let directory = ServerDirectory::new(configured.iter().copied());
            let mut dispatcher = Dispatcher::new(directory, 4);
            let mut reference = ReferenceDirectory {
                configured: configured.into_iter().collect(),
                ..ReferenceDirectory::default()
            };
            for (src, dst, flags) in segment_trains(&endpoints, segments) {
                let expected = worker_of_server(reference.server_of(src, dst, flags), 4);
                let frame = tcp_frame(src, dst, flags);
                proptest::prop_assert_eq!(dispatcher.worker_of(1, &frame), expected);
            }
        }

        /// With generations of two entries, so that pins are evicted and generations turn all
        /// the time: the dispatcher's remembered routes answer every frame as a directory
        /// asked on every frame does.
        #[test]
        fn remembered_routes_answer_as_the_directory_asked_each_time(
            configured in proptest::collection::vec(0usize..10, 0..3),
            segments in proptest::collection::vec((0usize..10, 0usize..10, 0u8..16, 0u8..4), 1..400),
        ) {
            let endpoints: Vec<SocketAddr> = [
                "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:40000", "10.0.0.4:40001",
                "10.0.0.5:443", "10.0.0.6:50000", "[::1]:8080", "[::2]:8080",
                "[2001:db8::1]:40000", "[2001:db8::2]:40001",
            ]
            .iter()
            .map(|e| e.parse().expect("endpoint"))
            .collect();
            let configured: Vec<SocketAddr> = configured.iter().map(|&i| endpoints[i]).collect();
            let directory = ServerDirectory::with_capacity(configured.iter().copied(), 2, 2);
            let mut reference = directory.clone();
            let mut dispatcher = Dispatcher::new(directory, 4);
            for (src, dst, flags) in segment_trains(&endpoints, segments) {
                let expected = worker_of_server(reference.server_of(src, dst, flags), 4);
                let frame = tcp_frame(src, dst, flags);
                proptest::prop_assert_eq!(dispatcher.worker_of(1, &frame), expected);
            }
        }
    }

    /// Segments from generated (source, destination, flag bits, train) tuples: half the time
    /// (train 0 or 1) the previous segment's flow again, one way or the other; pairs of one
    /// endpoint or of two families are left out.
    fn segment_trains(
        endpoints: &[SocketAddr],
        segments: Vec<(usize, usize, u8, u8)>,
    ) -> Vec<(SocketAddr, SocketAddr, TcpFlags)> {
        let mut out = Vec::new();
        let mut previous: Option<(SocketAddr, SocketAddr)> = None;
        for (s, t, bits, train) in segments {
            let (src, dst) = match (previous, train) {
                (Some((a, b)), 0) => (a, b),
                (Some((a, b)), 1) => (b, a),
                _ => (endpoints[s], endpoints[t]),
            };
            if src == dst || src.is_ipv4() != dst.is_ipv4() {
                continue;
            }
            previous = Some((src, dst));
            let flags = TcpFlags {
                syn: bits & 1 != 0,
                ack: bits & 2 != 0,
                fin: bits & 4 != 0,
                rst: bits & 8 != 0,
            };
            out.push((src, dst, flags));
        }
        out
    }

    /// An Ethernet frame of a TCP segment from `src` to `dst` with `flags` and a byte of data.
    fn tcp_frame(src: SocketAddr, dst: SocketAddr, flags: TcpFlags) -> Vec<u8> {
        let eth = etherparse::PacketBuilder::ethernet2([1; 6], [2; 6]);
        let ip = match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                eth.ipv4(s.ip().octets(), d.ip().octets(), 64)
            }
            (SocketAddr::V6(s), SocketAddr::V6(d)) => {
                eth.ipv6(s.ip().octets(), d.ip().octets(), 64)
            }
            _ => unreachable!("one family per segment"),
        };
        let mut b = ip.tcp(src.port(), dst.port(), 1, 100);
        if flags.syn {
            b = b.syn();
        }
        if flags.ack {
            b = b.ack(1);
        }
        if flags.fin {
            b = b.fin();
        }
        if flags.rst {
            b = b.rst();
        }
        let mut v = Vec::new();
        b.write(&mut v, b"x").expect("frame");
        v
    }

    #[test]
    fn a_server_on_a_high_port_is_learned_from_syn_and_syn_ack() {
        let server = ([10, 0, 0, 1], 64000);
        let (c1, c2) = (([10, 0, 0, 2], 1024), ([10, 0, 0, 3], 1025));
        let no = TcpFlags::default();
        let ack = TcpFlags { ack: true, ..no };
        let syn = TcpFlags { syn: true, ..no };
        let syn_ack = TcpFlags {
            syn: true,
            ack: true,
            ..no
        };
        let mut d = ServerDirectory::default();
        assert_eq!(d.server_of(addr(c1), addr(server), syn), addr(server));
        assert_eq!(d.server_of(addr(server), addr(c1), syn_ack), addr(server));
        for (src, dst) in [(c1, server), (server, c1), (c2, server), (server, c2)] {
            assert_eq!(d.server_of(addr(src), addr(dst), ack), addr(server));
        }
        // Only a SYN-ACK seen (the capture started between SYN and SYN-ACK): still learned.
        let other = ([10, 0, 0, 9], 50000);
        let mut d = ServerDirectory::default();
        assert_eq!(d.server_of(addr(other), addr(c1), syn_ack), addr(other));
        assert_eq!(d.server_of(addr(c1), addr(other), ack), addr(other));
        assert_eq!(d.stats().learned, 1);
    }

    #[test]
    fn configured_servers_win_and_midstream_flows_stay_where_they_started() {
        let server = addr(([10, 0, 0, 1], 64000));
        let client = addr(([10, 0, 0, 2], 1024));
        let ack = TcpFlags {
            ack: true,
            ..TcpFlags::default()
        };
        let syn = TcpFlags {
            syn: true,
            ..TcpFlags::default()
        };
        let mut d = ServerDirectory::new([server]);
        assert_eq!(d.server_of(client, server, ack), server);
        assert_eq!(d.server_of(server, client, ack), server);
        // Nobody saw this flow start and nothing is configured: the lower port, pinned.
        let mut d = ServerDirectory::default();
        assert_eq!(d.server_of(server, client, ack), client);
        // A second connection's SYN teaches the server...
        let client2 = addr(([10, 0, 0, 3], 40000));
        assert_eq!(d.server_of(client2, server, syn), server);
        assert_eq!(d.server_of(client2, server, ack), server);
        // ...but the flow under way keeps its worker (every flow is pinned once decided).
        assert_eq!(d.server_of(client, server, ack), client);
        assert_eq!(d.stats().pinned, 2);
        // Until that 5-tuple starts a new connection.
        assert_eq!(d.server_of(client, server, syn), server);
        assert_eq!(d.server_of(server, client, ack), server);
    }

    #[test]
    fn ipv6_flows_are_learned_and_pinned_like_ipv4_ones() {
        let server: SocketAddr = "[fd00::1]:64000".parse().expect("addr");
        let client: SocketAddr = "[fd00::2]:1024".parse().expect("addr");
        let other: SocketAddr = "[fd00::3]:1025".parse().expect("addr");
        let syn = TcpFlags {
            syn: true,
            ..TcpFlags::default()
        };
        let ack = TcpFlags {
            ack: true,
            ..TcpFlags::default()
        };
        let mut d = ServerDirectory::default();
        assert_eq!(d.server_of(client, server, syn), server);
        assert_eq!(d.server_of(server, client, ack), server);
        // Another client of the learned server, first seen midstream.
        assert_eq!(d.server_of(server, other, ack), server);
        assert_eq!(d.server_of(other, server, ack), server);
        assert_eq!(d.stats().learned, 1);
        assert_eq!(d.stats().pinned, 2);
        let mut configured = ServerDirectory::new([server]);
        assert_eq!(configured.server_of(server, client, ack), server);
    }

    #[test]
    fn learned_servers_are_bounded_and_evictions_counted() {
        let syn = TcpFlags {
            syn: true,
            ..TcpFlags::default()
        };
        let client = addr(([10, 0, 0, 2], 40000));
        let mut d = ServerDirectory::with_capacity([], 4, 4);
        let busy = addr(([10, 1, 0, 0], 9000));
        d.server_of(client, busy, syn);
        for port in 1..=100u16 {
            d.server_of(client, addr(([10, 0, 1, 1], port)), syn);
            // A server in use stays known.
            assert_eq!(
                d.server_of(addr(([10, 0, 0, 7], 1)), busy, TcpFlags::default()),
                busy
            );
        }
        let s = d.stats();
        assert!(s.learned <= 8, "{s:?}");
        assert!(s.learned_evicted >= 90, "{s:?}");
    }

    fn test_queue(batches: usize) -> (WorkerQueue, WorkerInbox) {
        let depth = prometheus::IntGauge::new("depth", "batches queued").expect("gauge");
        let waited = prometheus::IntCounter::new("waited", "packets waited").expect("counter");
        worker_queue(batches, depth, waited)
    }

    #[test]
    fn sent_batches_come_back_to_be_filled_again() {
        let (queue, inbox) = test_queue(4);
        let mut batch = Batch::default();
        batch.push(1, &[7; 1500]);
        assert!(send(&queue, &mut batch, 1));
        // Nothing handed back yet: the next batch is new, with the room of the sent one.
        assert!(batch.packets.is_empty() && batch.data.capacity() >= 1500);
        batch.push(2, &[8; 100]);
        let parsed = inbox.recv().expect("queued");
        let parsed_room = parsed.data.as_ptr();
        inbox.recycle(parsed);
        assert!(send(&queue, &mut batch, 113));
        // The next batch is the recycled one, emptied, with the link type of this send.
        assert_eq!(batch.data.as_ptr(), parsed_room);
        assert!(batch.data.is_empty() && batch.packets.is_empty());
        assert_eq!(batch.linktype, 113);
        let second = inbox.recv().expect("queued");
        assert_eq!(
            second.iter().collect::<Vec<_>>(),
            vec![(2, &[8u8; 100][..])]
        );
        assert_eq!(queue.depth.get(), 2);
    }

    #[test]
    fn recycling_is_bounded() {
        let (queue, inbox) = test_queue(64);
        // Handed back beyond the pool's room, batches are freed.
        for _ in 0..3 * RECYCLED_BATCHES {
            inbox.recycle(Batch {
                data: Vec::with_capacity(64),
                ..Batch::default()
            });
        }
        assert_eq!(queue.recycled.lock().expect("pool").len(), RECYCLED_BATCHES);
        // A batch that grew past what a full batch needs is freed, not kept.
        queue.recycled.lock().expect("pool").clear();
        inbox.recycle(Batch {
            data: Vec::with_capacity(2 * BATCH_BYTES + 1),
            ..Batch::default()
        });
        assert!(queue.recycled.lock().expect("pool").is_empty());
    }

    #[test]
    fn held_packets_wait_for_more_at_most_the_linger() {
        let mut t = FlushTimer::default();
        let t0 = Instant::now();
        // Nothing held: nothing to wait for.
        assert_eq!(t.dry(false, t0), WhenDry::Flush);
        // Held: wait for the ring, but no longer than the linger from the first dry moment.
        assert_eq!(t.dry(true, t0), WhenDry::Linger(FLUSH_LINGER));
        let half = FLUSH_LINGER / 2;
        assert_eq!(t.dry(true, t0 + half), WhenDry::Linger(FLUSH_LINGER - half));
        assert_eq!(t.dry(true, t0 + FLUSH_LINGER), WhenDry::Flush);
        // After a flush the next held packets start a linger of their own.
        let t1 = t0 + 3 * FLUSH_LINGER;
        assert_eq!(t.dry(true, t1), WhenDry::Linger(FLUSH_LINGER));
        // A full batch sent meanwhile leaves nothing held: the timer resets.
        assert_eq!(t.dry(false, t1 + half), WhenDry::Flush);
        assert_eq!(t.dry(true, t1 + half), WhenDry::Linger(FLUSH_LINGER));
    }

    #[test]
    fn batch_iterates_its_packets() {
        let b = Batch {
            linktype: 1,
            data: b"abcdef".to_vec(),
            packets: vec![(1, 0, 2), (2, 2, 4), (3, 5, 9)],
        };
        let v: Vec<(i64, &[u8])> = b.iter().collect();
        assert_eq!(v, vec![(1, &b"ab"[..]), (2, &b"cdef"[..])]);
    }
}
