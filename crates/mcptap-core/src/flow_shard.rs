//! The flow layer sharded by connection (`docs/sharding.md`, step 3): a [`FlowDispatcher`]
//! numbers the packets, keeps the one packet clock and decides the sweeps, and sends each
//! packet to the shard of its connection (a symmetric hash of its endpoints); each shard is a
//! split [`Pipeline`] fed with [`Pipeline::shard_packet`]. Every shard marks where the staged
//! steps of each packet, swept flow and ended flow end ([`FlowUnit`]); [`merge_rounds`] puts
//! the units of all shards and the dispatcher's own back in one pipeline's order. The session
//! layer downstream cannot tell the difference: the outputs are one pipeline's, in the same
//! order, unless a limit is hit (each shard evicts its own flows).
//!
//! A flow's id is the number of the packet that opened it, so ids follow the flows' order
//! across shards whatever their number. The threads are the adapter's.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::decode;
pub use crate::flow_unit::{FlowPhase, FlowUnit, PacketAt};
use crate::model::{Output, Timestamp};
use crate::pipeline::{Limits, PacketClock, Pipeline, SessionInput, Staged};
use crate::usage::SharedUsage;

/// The steps one shard (or the dispatcher) staged in a round, and where each unit ends.
#[derive(Debug, Default)]
pub struct FlowRound {
    pub staged: Vec<Staged>,
    pub marks: Vec<(usize, FlowUnit)>,
}

impl FlowRound {
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }
}

impl Pipeline {
    /// Flow shard: the steps staged since the last call, with the marks of their units;
    /// `spare` (emptied) is reused.
    pub fn take_flow_round(&mut self, spare: FlowRound) -> FlowRound {
        let FlowRound {
            mut staged,
            mut marks,
        } = spare;
        staged.clear();
        marks.clear();
        self.swap_flow_marks(&mut marks);
        FlowRound {
            staged: self.take_staged(staged),
            marks,
        }
    }
}

/// What the dispatcher decided for one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatched {
    /// The flow shard that takes the packet.
    pub shard: usize,
    pub at: PacketAt,
    /// A sweep is due after this packet, as of this time: every shard sweeps its flows
    /// ([`Pipeline::shard_sweep`] with `at.seq`).
    pub sweep: Option<Timestamp>,
}

/// The part of one pipeline that sees every packet: the packet numbers, the clock, the
/// sweeps, and which shard takes each packet.
#[derive(Debug)]
pub struct FlowDispatcher {
    shards: usize,
    clock: PacketClock,
    clock_jump_ns: i64,
    seq: u64,
    finished: bool,
    usage: Arc<SharedUsage>,
    /// Its own units: the clock's telemetry and the session layer's sweeps.
    round: FlowRound,
    out: Vec<Output>,
}

impl FlowDispatcher {
    /// A dispatcher for `shards` flow shards (at least one) charging to `usage`, the budget
    /// the shards share.
    pub fn new(limits: &Limits, shards: usize, usage: Arc<SharedUsage>) -> FlowDispatcher {
        FlowDispatcher {
            shards: shards.max(1),
            clock: PacketClock::default(),
            clock_jump_ns: limits.clock_jump_ns,
            seq: 0,
            finished: false,
            usage,
            round: FlowRound::default(),
            out: Vec::new(),
        }
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The packet clock now.
    pub fn now(&self) -> Timestamp {
        self.clock.now
    }

    /// Numbers the next packet, moves the clock and picks its shard. Frames that are not TCP
    /// (or cannot be read) go to shard 0, which counts why they were skipped.
    #[inline]
    pub fn dispatch(&mut self, ts: Timestamp, linktype: u32, frame: &[u8]) -> Dispatched {
        self.seq += 1;
        let seq = self.seq;
        self.clock.observe(ts, self.clock_jump_ns, &mut self.out);
        if !self.out.is_empty() {
            self.stage_outputs(seq, FlowPhase::Clock);
        }
        let shard = self.shard_of(linktype, frame);
        let now = self.clock.now;
        let sweep = if self.clock.sweep_due() {
            self.clock.last_sweep = now;
            self.stage(seq, SessionInput::Sweep { now });
            Some(now)
        } else {
            None
        };
        Dispatched {
            shard,
            at: PacketAt { seq, ts, now },
            sweep,
        }
    }

    /// Time passes without packets (a quiet live link), as [`Pipeline::advance_time`]: the
    /// clock moves, and when a sweep is due it is a step of its own, numbered as a packet
    /// would be, so that its units follow everything before it. Every shard then sweeps its
    /// flows ([`Pipeline::shard_sweep`] with the number returned).
    pub fn advance(&mut self, now: Timestamp) -> Option<(u64, Timestamp)> {
        self.clock.advance(now, self.clock_jump_ns);
        if !self.clock.sweep_due() {
            return None;
        }
        self.seq += 1;
        let (seq, now) = (self.seq, self.clock.now);
        self.clock.last_sweep = now;
        self.stage(seq, SessionInput::Sweep { now });
        Some((seq, now))
    }

    /// The shard of a frame's connection: both directions hash alike.
    #[inline]
    pub fn shard_of(&self, linktype: u32, frame: &[u8]) -> usize {
        if self.shards == 1 {
            return 0;
        }
        let Some(ends) = decode::tcp_endpoints(linktype, frame) else {
            return 0;
        };
        let (a, b) = if ends.src <= ends.dst {
            (ends.src, ends.dst)
        } else {
            (ends.dst, ends.src)
        };
        let mut hasher = foldhash::fast::FixedState::with_seed(0x464c_4f57_5348).build_hasher();
        crate::pipeline::hash_endpoint_pair(a, b, &mut hasher);
        let hash = std::hash::Hasher::finish(&hasher);
        // Scaled by multiplying: the high bits of the hash pick the shard.
        ((u128::from(hash) * self.shards as u128) >> 64) as usize
    }

    /// The end of the input: every shard ends its flows ([`Pipeline::shard_finish`] with the
    /// time returned), then the session layer ends.
    pub fn finish(&mut self) -> Timestamp {
        let now = self.clock.now;
        self.finished = true;
        self.stage(u64::MAX, SessionInput::Finish { now });
        now
    }

    /// Every unit of the packets (and sweeps) numbered so far is before this one, its own
    /// and the shards': what a source that has done all of them has passed ([`FlowMerge`]).
    pub fn passed(&self) -> FlowUnit {
        if self.finished {
            FlowUnit::END
        } else {
            FlowUnit::first_of(self.seq.saturating_add(1))
        }
    }

    /// Its own units since the last call; `spare` (emptied) takes their place.
    pub fn take_round(&mut self, spare: FlowRound) -> FlowRound {
        let mut spare = spare;
        spare.staged.clear();
        spare.marks.clear();
        std::mem::replace(&mut self.round, spare)
    }

    fn stage_outputs(&mut self, seq: u64, phase: FlowPhase) {
        crate::pipeline::stage_behind(&mut self.round.staged, &mut self.out);
        let unit = FlowUnit {
            seq,
            phase,
            flow: 0,
        };
        self.round.marks.push((self.round.staged.len(), unit));
    }

    /// A session-layer input of its own, counted as every staged step is.
    fn stage(&mut self, seq: u64, input: SessionInput) {
        self.usage.republish_staged_bytes(0, input.cost());
        self.round.staged.push(Staged::Input(input));
        let unit = FlowUnit {
            seq,
            phase: FlowPhase::Sessions,
            flow: 0,
        };
        self.round.marks.push((self.round.staged.len(), unit));
    }
}

/// Moves the steps of one round of every shard (and the dispatcher's round, among them) into
/// `into`, unit by unit in [`FlowUnit`] order: one pipeline's order. Steps after a round's
/// last mark (none, when every unit was marked) follow its units.
pub fn merge_rounds(rounds: &mut [FlowRound], into: &mut Vec<Staged>) {
    into.reserve(rounds.iter().map(|r| r.staged.len()).sum());
    // Per round: the next mark and where its unit starts.
    let mut next: Vec<(usize, usize)> = vec![(0, 0); rounds.len()];
    let mut steps: Vec<std::vec::Drain<'_, Staged>> = Vec::with_capacity(rounds.len());
    let mut marks: Vec<&[(usize, FlowUnit)]> = Vec::with_capacity(rounds.len());
    for round in rounds.iter_mut() {
        marks.push(&round.marks);
        steps.push(round.staged.drain(..));
    }
    loop {
        let mut best: Option<(usize, FlowUnit)> = None;
        for (i, (mark, _)) in next.iter().enumerate() {
            if let Some((_, unit)) = marks[i].get(*mark)
                && best.is_none_or(|(_, b)| *unit < b)
            {
                best = Some((i, *unit));
            }
        }
        let Some((i, _)) = best else { break };
        let (mark, start) = next[i];
        let end = marks[i][mark].0;
        into.extend(steps[i].by_ref().take(end.saturating_sub(start)));
        next[i] = (mark + 1, end.max(start));
    }
    for rest in steps {
        into.extend(rest);
    }
    for round in rounds.iter_mut() {
        round.marks.clear();
    }
}

/// Merges the staged steps of several sources (the flow shards and the dispatcher) as they
/// come, in parts of any size, into one pipeline's order: a unit goes once it is before every
/// source's watermark (the unit every later one of that source is at or after), so no unit
/// still to come can precede it. Unit keys are unique over the sources, so the order is
/// [`merge_rounds`]'s whatever the parts (a source that sent its whole round has passed every
/// packet of it), and a shard far ahead of another need not wait for whole rounds.
#[derive(Debug, Default)]
pub struct FlowMerge {
    sources: Vec<MergeSource>,
}

#[derive(Debug)]
struct MergeSource {
    parts: VecDeque<MergePart>,
    passed: FlowUnit,
    /// The source's latest unit pushed, for steps a part leaves unmarked.
    last: FlowUnit,
}

#[derive(Debug)]
struct MergePart {
    steps: VecDeque<Staged>,
    marks: Vec<(usize, FlowUnit)>,
    /// The next mark, and the steps taken before it.
    mark: usize,
    taken: usize,
}

impl FlowMerge {
    pub fn new(sources: usize) -> FlowMerge {
        FlowMerge {
            sources: (0..sources)
                .map(|_| MergeSource {
                    parts: VecDeque::new(),
                    passed: FlowUnit::START,
                    last: FlowUnit::START,
                })
                .collect(),
        }
    }

    /// A part of `source`'s steps, in its order, all of whose units are before `passed`,
    /// which every later unit of that source is at or after. Steps after the part's last
    /// mark follow the source's units so far.
    pub fn push(&mut self, source: usize, part: FlowRound, passed: FlowUnit) -> Option<FlowRound> {
        let Some(s) = self.sources.get_mut(source) else {
            return Some(part);
        };
        s.passed = s.passed.max(passed);
        let FlowRound { staged, mut marks } = part;
        if staged.is_empty() {
            marks.clear();
            return Some(FlowRound { staged, marks });
        }
        match marks.last_mut() {
            Some(m) => m.0 = m.0.max(staged.len()),
            None => marks.push((staged.len(), s.last)),
        }
        s.last = marks.last().map_or(s.last, |m| m.1);
        s.parts.push_back(MergePart {
            steps: staged.into(),
            marks,
            mark: 0,
            taken: 0,
        });
        None
    }

    /// The lowest watermark: every unit before it is final.
    pub fn passed(&self) -> FlowUnit {
        self.sources
            .iter()
            .map(|s| s.passed)
            .min()
            .unwrap_or(FlowUnit::END)
    }

    /// Moves every unit before every source's watermark into `into`, in order, or stops
    /// after the unit that brings the session inputs moved to `max_bytes` (so that what
    /// waits for the session layer comes in bounded pieces); returns whether it stopped so.
    /// The parts done with go to `spent` (with their source), to be filled again.
    pub fn merge(
        &mut self,
        into: &mut Vec<Staged>,
        max_bytes: usize,
        spent: &mut dyn FnMut(usize, FlowRound),
    ) -> bool {
        let bound = self.passed();
        let mut bytes = 0usize;
        loop {
            if bytes >= max_bytes {
                return true;
            }
            let mut best: Option<(usize, FlowUnit)> = None;
            for (i, s) in self.sources.iter().enumerate() {
                let head = s.parts.front().and_then(|p| p.marks.get(p.mark));
                if let Some(&(_, unit)) = head
                    && unit < bound
                    && best.is_none_or(|(_, b)| unit < b)
                {
                    best = Some((i, unit));
                }
            }
            let Some((i, _)) = best else { break };
            let s = &mut self.sources[i];
            let Some(part) = s.parts.front_mut() else {
                break;
            };
            let end = part.marks.get(part.mark).map_or(part.taken, |m| m.0);
            let n = end.saturating_sub(part.taken).min(part.steps.len());
            for step in part.steps.drain(..n) {
                if let Staged::Input(input) = &step {
                    bytes = bytes.saturating_add(input.cost());
                }
                into.push(step);
            }
            part.taken = end.max(part.taken);
            part.mark += 1;
            if part.mark >= part.marks.len()
                && let Some(done) = s.parts.pop_front()
            {
                // Marks past the steps (none when well formed) have nothing left.
                let mut marks = done.marks;
                marks.clear();
                let mut staged = Vec::from(done.steps);
                into.append(&mut staged);
                spent(i, FlowRound { staged, marks });
            }
        }
        false
    }

    /// Parts not merged yet.
    pub fn is_empty(&self) -> bool {
        self.sources.iter().all(|s| s.parts.is_empty())
    }
}

/// What the flow layer hands the session layer, whether one pipeline's flow side or the
/// merged flow shards.
pub trait StagedSteps {
    /// The steps staged so far, in order; `spare` (empty) takes their place.
    fn take_staged(&mut self, spare: Vec<Staged>) -> Vec<Staged>;
    /// A copy of `input` for one more session shard, charged to the budget.
    fn stage_copy(&mut self, input: &SessionInput) -> SessionInput;
}

impl StagedSteps for Pipeline {
    fn take_staged(&mut self, spare: Vec<Staged>) -> Vec<Staged> {
        Pipeline::take_staged(self, spare)
    }

    fn stage_copy(&mut self, input: &SessionInput) -> SessionInput {
        Pipeline::stage_copy(self, input)
    }
}

/// The merged steps of flow shards, waiting for the session layer.
#[derive(Debug)]
pub struct MergedSteps {
    pub steps: Vec<Staged>,
    usage: Arc<SharedUsage>,
}

impl MergedSteps {
    pub fn new(usage: Arc<SharedUsage>) -> MergedSteps {
        MergedSteps {
            steps: Vec::new(),
            usage,
        }
    }
}

impl StagedSteps for MergedSteps {
    fn take_staged(&mut self, spare: Vec<Staged>) -> Vec<Staged> {
        std::mem::replace(&mut self.steps, spare)
    }

    fn stage_copy(&mut self, input: &SessionInput) -> SessionInput {
        self.usage.republish_staged_bytes(0, input.cost());
        input.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Telemetry;

    fn unit(seq: u64, phase: FlowPhase, flow: u64) -> FlowUnit {
        FlowUnit { seq, phase, flow }
    }

    fn tagged(tags: &[i64]) -> Vec<Staged> {
        tags.iter()
            .map(|&t| {
                Staged::Output(Output::Telemetry(Telemetry::ClockJump {
                    ahead_ns: t,
                    followed: false,
                }))
            })
            .collect()
    }

    fn tags(steps: &[Staged]) -> Vec<i64> {
        steps
            .iter()
            .map(|s| match s {
                Staged::Output(Output::Telemetry(Telemetry::ClockJump { ahead_ns, .. })) => {
                    *ahead_ns
                }
                _ => i64::MAX,
            })
            .collect()
    }

    #[test]
    fn merge_puts_units_of_all_rounds_in_pipeline_order() {
        // Shard A: packet 1 (two steps), the sweep's idle flow 1 after packet 3, its held
        // flow 7. Shard B: packet 2, packet 3, the sweep's idle flow 2. Dispatcher: clock
        // telemetry before packet 3, the sessions' sweep after packet 3.
        let mut rounds = three_rounds();
        let mut merged = Vec::new();
        merge_rounds(&mut rounds, &mut merged);
        assert_eq!(tags(&merged), [10, 11, 20, 25, 30, 40, 50, 60, 70]);
        assert!(
            rounds
                .iter()
                .all(|r| r.staged.is_empty() && r.marks.is_empty())
        );
    }

    /// The rounds of [`merge_puts_units_of_all_rounds_in_pipeline_order`].
    fn three_rounds() -> Vec<FlowRound> {
        vec![
            FlowRound {
                staged: tagged(&[10, 11, 40, 60]),
                marks: vec![
                    (2, unit(1, FlowPhase::Packet, 0)),
                    (3, unit(3, FlowPhase::Idle, 1)),
                    (4, unit(3, FlowPhase::Held, 7)),
                ],
            },
            FlowRound {
                staged: tagged(&[20, 30, 50]),
                marks: vec![
                    (1, unit(2, FlowPhase::Packet, 0)),
                    (2, unit(3, FlowPhase::Packet, 0)),
                    (3, unit(3, FlowPhase::Idle, 2)),
                ],
            },
            FlowRound {
                staged: tagged(&[25, 70]),
                marks: vec![
                    (1, unit(3, FlowPhase::Clock, 0)),
                    (2, unit(3, FlowPhase::Sessions, 0)),
                ],
            },
        ]
    }

    /// Each unit of a round as a part of its own, with the watermark a shard answering then
    /// would give (the next unit's key; the round's end after the last).
    fn parts_of(round: FlowRound, end: FlowUnit) -> Vec<(FlowRound, FlowUnit)> {
        let mut parts = Vec::new();
        let mut steps = round.staged.into_iter();
        let mut start = 0;
        let keys: Vec<FlowUnit> = round
            .marks
            .iter()
            .map(|m| m.1)
            .skip(1)
            .chain([end])
            .collect();
        for ((at, u), passed) in round.marks.into_iter().zip(keys) {
            let staged: Vec<Staged> = steps.by_ref().take(at - start).collect();
            start = at;
            parts.push((
                FlowRound {
                    marks: vec![(staged.len(), u)],
                    staged,
                },
                passed,
            ));
        }
        parts
    }

    #[test]
    fn watermarks_merge_parts_in_pipeline_order_whatever_comes_first() {
        let end = FlowUnit::first_of(4);
        // Every order of the sources' parts (they stay in order within a source).
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1]] {
            let mut parts: Vec<VecDeque<(FlowRound, FlowUnit)>> = three_rounds()
                .into_iter()
                .map(|r| parts_of(r, end).into())
                .collect();
            let mut merge = FlowMerge::new(3);
            let mut merged = Vec::new();
            let mut spent = 0;
            let mut left = true;
            while left {
                left = false;
                for &source in &order {
                    if let Some((part, passed)) = parts[source].pop_front() {
                        left = true;
                        assert!(merge.push(source, part, passed).is_none());
                        merge.merge(&mut merged, usize::MAX, &mut |_, _| spent += 1);
                    }
                }
            }
            merge.merge(&mut merged, usize::MAX, &mut |_, _| spent += 1);
            assert_eq!(
                tags(&merged),
                [10, 11, 20, 25, 30, 40, 50, 60, 70],
                "{order:?}"
            );
            assert!(merge.is_empty());
            assert_eq!(spent, 8);
        }
    }

    #[test]
    fn a_unit_waits_for_every_sources_watermark() {
        let mut merge = FlowMerge::new(2);
        let mut merged = Vec::new();
        let part = |t, u| FlowRound {
            staged: tagged(&[t]),
            marks: vec![(1, u)],
        };
        merge.push(
            0,
            part(2, unit(2, FlowPhase::Packet, 0)),
            FlowUnit::first_of(3),
        );
        merge.merge(&mut merged, usize::MAX, &mut |_, _| {});
        assert!(merged.is_empty(), "source 1 may still give packet 1");
        // Source 1 answers packet 1 and has passed packet 2 (not its own): both go.
        merge.push(
            1,
            part(1, unit(1, FlowPhase::Packet, 0)),
            FlowUnit::first_of(3),
        );
        merge.merge(&mut merged, usize::MAX, &mut |_, _| {});
        assert_eq!(tags(&merged), [1, 2]);
        // An empty part moves the watermark alone; unmarked steps follow the source's units.
        assert!(merge.push(1, FlowRound::default(), FlowUnit::END).is_some());
        merge.push(
            0,
            FlowRound {
                staged: tagged(&[3, 4]),
                marks: vec![(1, unit(5, FlowPhase::Packet, 0))],
            },
            FlowUnit::END,
        );
        merge.merge(&mut merged, usize::MAX, &mut |_, _| {});
        assert_eq!(tags(&merged), [1, 2, 3, 4]);
    }

    #[test]
    fn unmarked_steps_are_not_lost() {
        let mut rounds = vec![FlowRound {
            staged: tagged(&[1, 2, 3]),
            marks: vec![(1, unit(5, FlowPhase::Packet, 0))],
        }];
        let mut merged = Vec::new();
        merge_rounds(&mut rounds, &mut merged);
        assert_eq!(tags(&merged), [1, 2, 3]);
    }

    #[test]
    fn both_directions_of_a_connection_go_to_one_shard() {
        use crate::limits::Limits;
        let dispatcher = FlowDispatcher::new(&Limits::default(), 4, Arc::default());
        let mut seen = [0usize; 4];
        for port in 40000u16..40400 {
            let there = ipv4_tcp_frame([127, 0, 0, 1], port, [127, 0, 0, 2], 8080);
            let back = ipv4_tcp_frame([127, 0, 0, 2], 8080, [127, 0, 0, 1], port);
            let shard = dispatcher.shard_of(decode::dlt::RAW, &there);
            assert_eq!(shard, dispatcher.shard_of(decode::dlt::RAW, &back));
            seen[shard] += 1;
        }
        // One upstream, many client ports: every shard takes a share.
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
        // Not TCP: shard 0, which counts it.
        assert_eq!(dispatcher.shard_of(decode::dlt::RAW, &[0x45, 0, 0]), 0);
    }

    fn ipv4_tcp_frame(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut f = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        f
    }
}
