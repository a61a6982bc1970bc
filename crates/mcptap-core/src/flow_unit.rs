//! The units of a flow shard's work (`crate::flow_shard`): where a packet stands in the
//! whole input, and the marks that put the shards' staged steps back in one pipeline's order.
//! Plain data, below both the pipeline that marks them and the dispatcher and merge that read
//! them.

use crate::model::Timestamp;

/// Where one packet stands in the whole input: its number (from 1), its own time and the
/// packet clock after it (which a shard's flows use, as one pipeline's do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketAt {
    pub seq: u64,
    pub ts: Timestamp,
    pub now: Timestamp,
}

/// What part of one pipeline's work a unit of staged steps is, in that pipeline's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FlowPhase {
    /// The clock's telemetry as the packet arrived (a jump).
    Clock,
    /// The packet itself.
    Packet,
    /// A sweep after the packet (or the end of the input): an idle or ended flow removed.
    Idle,
    /// A sweep after the packet: a flow's held segments released.
    Held,
    /// The session layer's sweep (or end), after every flow's.
    Sessions,
}

/// A unit of staged steps: its place in one pipeline's order is this key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlowUnit {
    pub seq: u64,
    pub phase: FlowPhase,
    pub flow: u64,
}

impl FlowUnit {
    /// Before every unit.
    pub const START: FlowUnit = FlowUnit {
        seq: 0,
        phase: FlowPhase::Clock,
        flow: 0,
    };
    /// After every unit, the end of the input's among them.
    pub const END: FlowUnit = FlowUnit {
        seq: u64::MAX,
        phase: FlowPhase::Sessions,
        flow: u64::MAX,
    };

    /// The first unit a packet numbered `seq` may give (the clock's, then the packet's).
    pub fn first_of(seq: u64) -> FlowUnit {
        FlowUnit {
            seq,
            phase: FlowPhase::Clock,
            flow: 0,
        }
    }
}
