//! An in-memory conversation simulator in the spirit of quinn-proto's test `Pair`: clients,
//! servers and an optional proxy exchange application writes over modelled TCP connections
//! ([`crate::tcp::Conn`]) on a virtual clock, through impairments (loss, reordering,
//! duplication of data segments), producing timestamped frames and, on request, a pcap.
//!
//! ```
//! use mcptap_testkit::mcp::{Answer, Conversation, FULL_CLIENT_CAPS};
//! use mcptap_testkit::sim::{Impairments, Sim};
//! use mcptap_testkit::tcp::Endpoint;
//!
//! let mut talk = Conversation::new("s-1");
//! talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
//!     .tools_call("ok", Answer::Sse);
//! let mut sim = Sim::new(7)
//!     .with_segment_sizes(vec![5, 300])
//!     .with_impairments(Impairments { duplication: 0.1, ..Impairments::default() });
//! let client = Endpoint::new([10, 0, 0, 2], 40000);
//! let server = Endpoint::new([10, 0, 0, 1], 8080);
//! let conn = sim.connect(client, server, talk.take_writes());
//! sim.run(vec![conn]);
//! assert!(sim.frames().len() > 10);
//! let _pcap: Vec<u8> = sim.pcap();
//! ```

use std::path::Path;

use mcptap_core::model::{Output, Timestamp};
use mcptap_core::pipeline::{Limits, Pipeline};

use crate::capture::{Frame, pcap_bytes};
use crate::rng::SplitMix64;
use crate::segment::Segment;
use crate::tcp::{AppWrite, Conn, Endpoint, Pool};
use crate::wire::Link;

/// 2026-01-15T09:00:00Z, where every simulation's clock starts.
pub const START_NS: i64 = 1_768_467_600 * 1_000_000_000;

/// What happens to data-carrying segments on the way to the capture point. Handshakes, bare
/// ACKs and FINs always get through, so every connection stays visible.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Impairments {
    /// Probability that a data segment is lost (a gap in its stream).
    pub loss: f64,
    /// Probability that a data segment is captured twice (a retransmission).
    pub duplication: f64,
    /// Probability that a data segment is held back behind the next frame.
    pub reordering: f64,
    /// Data segments (counted from 0 over the whole simulation) that are always lost.
    pub drop_data_segments: Vec<usize>,
}

/// What the impairments did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub frames: usize,
    pub data_segments: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub reordered: usize,
}

/// The simulation: a virtual clock, the connections' settings and the captured frames.
pub struct Sim {
    now: i64,
    step_ns: i64,
    rng: SplitMix64,
    pool: Pool,
    link: Link,
    segment_sizes: Vec<usize>,
    impairments: Impairments,
    frames: Vec<Frame>,
    /// A frame held back by reordering, emitted after the next one.
    held: Option<Vec<u8>>,
    stats: SimStats,
}

impl Sim {
    /// A simulation whose randomness (sequence numbers, impairments, random bodies) comes
    /// from `seed`: untagged Ethernet, [`crate::tcp::MSS`]-sized segments, 10 µs between
    /// packets, no impairments.
    pub fn new(seed: u64) -> Self {
        Sim {
            now: START_NS,
            step_ns: 10_000,
            rng: SplitMix64(seed),
            pool: Pool::new(seed),
            link: Link::default(),
            segment_sizes: Vec::new(),
            impairments: Impairments::default(),
            frames: Vec::new(),
            held: None,
            stats: SimStats::default(),
        }
    }

    /// Frames of `link` for connections made from now on.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = link;
        self
    }

    /// Data segment sizes, cycled, for connections made from now on (empty: MSS).
    pub fn with_segment_sizes(mut self, sizes: Vec<usize>) -> Self {
        self.segment_sizes = sizes;
        self
    }

    /// Impairments applied from now on.
    pub fn with_impairments(mut self, impairments: Impairments) -> Self {
        self.impairments = impairments;
        self
    }

    /// Virtual time between two packets.
    pub fn with_step(mut self, step_ns: i64) -> Self {
        self.step_ns = step_ns;
        self
    }

    /// The virtual clock (ns since the epoch).
    pub fn now(&self) -> i64 {
        self.now
    }

    /// Moves the clock forward (an idle period between conversations).
    pub fn advance(&mut self, ns: i64) {
        self.now += ns;
    }

    /// The link type of the frames.
    pub fn linktype(&self) -> u32 {
        self.link.linktype()
    }

    /// A connection from `client` to `server` carrying `writes`, with the simulation's link
    /// and segment sizes; run it with [`Sim::run`].
    pub fn connect(&mut self, client: Endpoint, server: Endpoint, writes: Vec<AppWrite>) -> Conn {
        Conn::new(client, server, &mut self.rng, writes)
            .with_link(self.link.clone())
            .with_segment_sizes(self.segment_sizes.clone())
    }

    /// Runs connections to completion, their packets interleaved round-robin, one clock step
    /// per packet.
    pub fn run(&mut self, mut conns: Vec<Conn>) {
        let mut buf = Vec::with_capacity(2048);
        while !conns.is_empty() {
            conns.retain_mut(|conn| {
                if conn.next_packet(&self.pool, self.now, &mut buf) {
                    self.capture(&buf);
                    self.now += self.step_ns;
                    true
                } else {
                    false
                }
            });
        }
        self.flush_held();
    }

    /// The same writes through a proxy: client → proxy and proxy → server, the two legs'
    /// packets in lockstep (each exchange appears on both legs).
    pub fn run_via_proxy(
        &mut self,
        client: Endpoint,
        proxy: Endpoint,
        server: Endpoint,
        writes: Vec<AppWrite>,
    ) {
        let downstream = self.connect(client, proxy, writes.clone());
        let upstream = self.connect(proxy, server, writes);
        self.run(vec![downstream, upstream]);
    }

    fn push(&mut self, data: Vec<u8>) {
        self.frames.push(Frame {
            ts_nanos: self.now,
            data,
        });
        self.stats.frames += 1;
    }

    fn flush_held(&mut self) {
        if let Some(held) = self.held.take() {
            self.push(held);
        }
    }

    fn capture(&mut self, frame: &[u8]) {
        let carries_data = Segment::decode(self.now, self.link.linktype(), frame)
            .is_some_and(|s| !s.payload.is_empty());
        if !carries_data {
            self.push(frame.to_vec());
            self.flush_held();
            return;
        }
        let index = self.stats.data_segments;
        self.stats.data_segments += 1;
        let imp = &self.impairments;
        let (loss, duplication, reordering) = (imp.loss, imp.duplication, imp.reordering);
        if imp.drop_data_segments.contains(&index) || (loss > 0.0 && self.rng.chance(loss)) {
            self.stats.lost += 1;
            return;
        }
        let copies = if duplication > 0.0 && self.rng.chance(duplication) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        if self.held.is_none() && reordering > 0.0 && self.rng.chance(reordering) {
            self.stats.reordered += 1;
            self.held = Some(frame.to_vec());
            for _ in 1..copies {
                self.push(frame.to_vec());
            }
            return;
        }
        for _ in 0..copies {
            self.push(frame.to_vec());
        }
        self.flush_held();
    }

    /// The captured frames, in capture order (timestamps non-decreasing).
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// What the impairments did so far.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// The capture as a nanosecond pcap file.
    pub fn pcap(&self) -> Vec<u8> {
        pcap_bytes(self.link.linktype(), &self.frames)
    }

    /// Writes [`Sim::pcap`] to `path`.
    pub fn write_pcap(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.pcap())
    }

    /// Every output of the captured frames through one core pipeline with `limits`, as a
    /// replay of [`Sim::pcap`] would give.
    pub fn outputs(&self, limits: Limits) -> Vec<Output> {
        replay_frames(self.link.linktype(), &self.frames, Pipeline::new(limits))
    }

    /// The events of [`Sim::outputs`] with the default limits, as NDJSON values.
    pub fn events(&self) -> Vec<serde_json::Value> {
        events_of(&self.outputs(Limits::default()))
    }
}

/// Feeds `frames` of `linktype` into `pipeline` and finishes it.
pub fn replay_frames(linktype: u32, frames: &[Frame], mut pipeline: Pipeline) -> Vec<Output> {
    let mut out = Vec::new();
    for f in frames {
        pipeline.handle_packet(Timestamp(f.ts_nanos), linktype, &f.data, &mut out);
    }
    pipeline.finish(&mut out);
    out
}

/// The events among `outputs`, serialised as NDJSON values.
pub fn events_of(outputs: &[Output]) -> Vec<serde_json::Value> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => serde_json::to_value(e).ok(),
            Output::Telemetry(_) | Output::Shared(_) => None,
        })
        .collect()
}
