//! TCP stream reassembly for one direction of a connection.
//!
//! Sequence numbers are mapped to a 64-bit stream offset relative to the next expected byte,
//! so wraparound needs no special case. In-order data is handed to the consumer straight from
//! the packet (zero-copy); only out-of-order data is buffered, up to a byte cap. When the cap
//! is hit, or the stream ends with holes, the hole is declared as an explicit gap so the
//! consumer can resynchronise instead of waiting forever.

use std::collections::BTreeMap;

/// What the reassembler hands downstream, in stream order.
pub trait StreamConsumer {
    fn on_data(&mut self, data: &[u8]);
    /// `len` bytes of the stream will never be seen.
    fn on_gap(&mut self, len: u64);
}

pub use crate::model::GapReason;

/// Counts of noteworthy things seen while pushing segments; the caller turns them into
/// telemetry events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PushReport {
    pub gaps: Vec<(GapReason, u64)>,
    pub identical_overlaps: u32,
    pub conflicting_overlaps: u32,
}

/// What a buffered segment costs besides its bytes: its map entry (key and vector, in
/// B-tree nodes about two-thirds full), the vector's allocation rounded up, and that
/// allocation's header. A stream of one-byte segments is charged for what it holds.
const PENDING_SEGMENT_OVERHEAD: usize = 96;

#[derive(Debug)]
pub struct Reassembler {
    /// Sequence number of the next byte to deliver; None until the first segment or SYN.
    next_seq: Option<u32>,
    /// Stream offset of `next_seq` (bytes delivered or skipped so far).
    offset: u64,
    /// Out-of-order segments keyed by stream offset; ranges never overlap.
    pending: BTreeMap<u64, Vec<u8>>,
    /// Bytes of `pending`, each segment with [`PENDING_SEGMENT_OVERHEAD`].
    buffered: usize,
    max_buffered: usize,
    /// Stream offset of the FIN, once seen.
    fin_at: Option<u64>,
    finished: bool,
    /// Where a segment cut short by the capture ended: the bytes from here to the next
    /// segment were sent but never captured, so the next segment beyond it opens a gap at once
    /// instead of waiting in the buffer.
    cut_at: Option<u64>,
}

impl Reassembler {
    pub fn new(max_buffered: usize) -> Self {
        Reassembler {
            next_seq: None,
            offset: 0,
            pending: BTreeMap::new(),
            buffered: 0,
            max_buffered,
            fin_at: None,
            finished: false,
            cut_at: None,
        }
    }

    /// True once the FIN has been reached (all bytes before it delivered or declared lost).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub fn buffered_bytes(&self) -> usize {
        self.buffered
    }

    /// Whether pushing a segment without payload or FIN would change nothing: the stream has
    /// started, is not finished, and waits on no FIN or cut (pure acknowledgements, a quarter
    /// of small-packet traffic, then need no push).
    pub fn ignores_empty_push(&self) -> bool {
        self.next_seq.is_some() && !self.finished && self.fin_at.is_none() && self.cut_at.is_none()
    }

    /// Whether an acknowledgement `ack` from the other direction covers bytes of this stream
    /// not delivered yet: the other side answered data the capture has not shown us so far.
    pub fn acks_undelivered(&self, ack: u32) -> bool {
        // Behind bytes the capture cut short the stream cannot catch up: nothing to wait for.
        // (A hole with later bytes buffered may still fill: a reordered segment.)
        let stalled = self.cut_at == Some(self.offset);
        match self.next_seq {
            Some(next) if !self.finished && !stalled => (ack.wrapping_sub(next) as i32) > 0,
            _ => false,
        }
    }

    /// Whether the peer's acknowledgement `ack` proves that the hole before this stream's
    /// buffered bytes, or before its FIN when nothing is buffered, was received by the peer:
    /// the capture lost it, and waiting is futile.
    pub fn hole_acked(&self, ack: u32) -> bool {
        let Some(next) = self.next_seq else {
            return false;
        };
        let acked = self.offset as i64 + i64::from(ack.wrapping_sub(next) as i32);
        match self.pending.first_key_value() {
            Some((&first, _)) => acked >= first as i64 && first > self.offset,
            // A lost tail (the last segments of a response, then the FIN): no bytes follow
            // the hole, and at the end of a capture nothing else would declare it.
            None => self
                .fin_at
                .is_some_and(|fin_at| fin_at > self.offset && acked >= fin_at as i64),
        }
    }

    /// Declares the hole before the buffered bytes (or the FIN) lost (see
    /// [`Reassembler::hole_acked`]) and delivers what follows it.
    pub fn skip_acked_hole(&mut self, consumer: &mut dyn StreamConsumer, report: &mut PushReport) {
        match self.fin_at {
            Some(fin_at) if self.pending.is_empty() && fin_at > self.offset => {
                self.declare_gap(fin_at - self.offset, GapReason::Lost, consumer, report);
            }
            _ => self.skip_to_first_pending(GapReason::Lost, consumer, report),
        }
        self.check_fin();
    }

    /// A SYN fixes the initial sequence number: data starts at `isn + 1`.
    pub fn on_syn(&mut self, isn: u32) {
        if self.next_seq.is_none() {
            self.next_seq = Some(isn.wrapping_add(1));
        }
    }

    /// Pushes one segment. `fin` marks the end of the stream after this payload.
    pub fn push(
        &mut self,
        seq: u32,
        payload: &[u8],
        fin: bool,
        consumer: &mut dyn StreamConsumer,
        report: &mut PushReport,
    ) {
        if self.finished {
            return;
        }
        let start = self.stream_offset(seq);
        if fin {
            let end = start + payload.len() as i64;
            if end >= self.offset as i64 && self.fin_at.is_none() {
                self.fin_at = Some(end as u64);
            }
        }
        if !payload.is_empty() {
            self.accept(start, payload, consumer, report);
        }
        // A FIN after a segment the capture cut short: the cut bytes are a gap up to it.
        if let (Some(cut), Some(fin_at)) = (self.cut_at, self.fin_at)
            && cut == self.offset
            && fin_at > cut
        {
            self.cut_at = None;
            self.declare_gap(fin_at - cut, GapReason::Snaplen, consumer, report);
        }
        self.check_fin();
    }

    /// Pushes a segment the capture cut short (snaplen): what follows its captured bytes is
    /// lost, and the next segment after them is delivered behind a gap.
    pub fn push_cut(
        &mut self,
        seq: u32,
        payload: &[u8],
        fin: bool,
        consumer: &mut dyn StreamConsumer,
        report: &mut PushReport,
    ) {
        let end = self.stream_offset(seq) + payload.len() as i64;
        self.push(seq, payload, fin, consumer, report);
        if end >= 0 {
            self.cut_at = Some(end as u64);
        }
    }

    /// Where sequence number `seq` falls in the stream (negative: before its start).
    /// Midstream pickup: the first segment seen defines the start of the stream.
    fn stream_offset(&mut self, seq: u32) -> i64 {
        let next = *self.next_seq.get_or_insert(seq);
        self.offset as i64 + i64::from(seq.wrapping_sub(next) as i32)
    }

    fn accept(
        &mut self,
        start: i64,
        payload: &[u8],
        consumer: &mut dyn StreamConsumer,
        report: &mut PushReport,
    ) {
        if let Some(cut) = self.cut_at
            && cut == self.offset
            && start > cut as i64
        {
            self.cut_at = None;
            self.declare_gap(start as u64 - cut, GapReason::Snaplen, consumer, report);
            self.drain(consumer, report);
        }
        let end = start + payload.len() as i64;
        let cur = self.offset as i64;
        if end <= cur {
            // Pure retransmission of delivered bytes: we keep no copy to compare with.
            report.identical_overlaps += 1;
            return;
        }
        let (start, payload) = if start < cur {
            report.identical_overlaps += 1;
            (cur, &payload[(cur - start) as usize..])
        } else {
            (start, payload)
        };
        if start == cur && self.pending.is_empty() {
            // Fast path: in-order data with nothing buffered goes straight through.
            self.deliver(payload, consumer);
            return;
        }
        // Through the buffer, so that bytes buffered earlier keep precedence (first copy wins).
        self.buffer(start as u64, payload, report);
        self.drain(consumer, report);
        if self.buffered > self.max_buffered {
            self.skip_to_first_pending(GapReason::BufferLimit, consumer, report);
        }
    }

    fn deliver(&mut self, data: &[u8], consumer: &mut dyn StreamConsumer) {
        if data.is_empty() {
            return;
        }
        consumer.on_data(data);
        self.advance(data.len() as u64);
    }

    /// `len` bytes at the current offset will never be seen: tell the consumer, count them,
    /// and move past them.
    fn declare_gap(
        &mut self,
        len: u64,
        reason: GapReason,
        consumer: &mut dyn StreamConsumer,
        report: &mut PushReport,
    ) {
        consumer.on_gap(len);
        report.gaps.push((reason, len));
        self.advance(len);
    }

    fn advance(&mut self, n: u64) {
        self.offset += n;
        if let Some(next) = self.next_seq.as_mut() {
            *next = next.wrapping_add(n as u32);
        }
    }

    /// Stores an out-of-order segment, keeping the first copy of every byte: the parts of it
    /// that fall between the buffered ranges it overlaps, found in one pass over those ranges
    /// in order (splitting a list of pieces once per overlapped range made a segment over
    /// thousands of one-byte ones quadratic).
    fn buffer(&mut self, start: u64, payload: &[u8], report: &mut PushReport) {
        let end = start + payload.len() as u64;
        // Only ranges that can intersect [start, end): the one starting before and those
        // inside; collected from the last back, so reversed to go in stream order.
        let mut overlapping: Vec<(u64, u64)> = self
            .pending
            .range(..end)
            .rev()
            .take_while(|(s, v)| **s + v.len() as u64 > start)
            .map(|(s, v)| (*s, *s + v.len() as u64))
            .collect();
        overlapping.reverse();
        let mut pieces: Vec<(u64, u64)> = Vec::with_capacity(overlapping.len() + 1);
        // Where the part of the segment not yet covered by a buffered range begins.
        let mut from = start;
        for (ps, pe) in overlapping {
            let os = ps.max(start);
            let oe = pe.min(end);
            let old = self
                .pending
                .get(&ps)
                .map(|v| &v[(os - ps) as usize..(oe - ps) as usize]);
            let new = &payload[(os - start) as usize..(oe - start) as usize];
            if old == Some(new) {
                report.identical_overlaps += 1;
            } else {
                report.conflicting_overlaps += 1;
            }
            if ps > from {
                pieces.push((from, ps));
            }
            from = from.max(pe);
        }
        if from < end {
            pieces.push((from, end));
        }
        for (s, e) in pieces {
            let bytes = payload[(s - start) as usize..(e - start) as usize].to_vec();
            self.buffered += bytes.len() + PENDING_SEGMENT_OVERHEAD;
            self.pending.insert(s, bytes);
        }
    }

    /// Delivers buffered segments that have become contiguous.
    fn drain(&mut self, consumer: &mut dyn StreamConsumer, report: &mut PushReport) {
        while let Some(entry) = self.pending.first_entry() {
            let start = *entry.key();
            if start > self.offset {
                break;
            }
            let bytes = entry.remove();
            self.buffered -= (bytes.len() + PENDING_SEGMENT_OVERHEAD).min(self.buffered);
            let end = start + bytes.len() as u64;
            if end <= self.offset {
                report.identical_overlaps += 1;
                continue;
            }
            let skip = (self.offset - start) as usize;
            self.deliver(&bytes[skip..], consumer);
        }
    }

    fn skip_to_first_pending(
        &mut self,
        reason: GapReason,
        consumer: &mut dyn StreamConsumer,
        report: &mut PushReport,
    ) {
        if let Some((&start, _)) = self.pending.first_key_value()
            && start > self.offset
        {
            self.declare_gap(start - self.offset, reason, consumer, report);
        }
        self.drain(consumer, report);
    }

    /// The stream is finished once every byte before the FIN has been delivered.
    fn check_fin(&mut self) {
        if let Some(fin_at) = self.fin_at
            && self.offset >= fin_at
        {
            self.finished = true;
            self.discard_pending();
        }
    }

    fn discard_pending(&mut self) {
        self.pending.clear();
        self.buffered = 0;
    }

    /// The connection is gone (RST, idle timeout, eviction, end of capture): whatever is
    /// buffered beyond a hole is delivered after an explicit gap.
    pub fn flush(
        &mut self,
        reason: GapReason,
        consumer: &mut dyn StreamConsumer,
        report: &mut PushReport,
    ) {
        while !self.pending.is_empty() {
            self.skip_to_first_pending(reason, consumer, report);
        }
        if let Some(fin_at) = self.fin_at
            && fin_at > self.offset
        {
            self.declare_gap(fin_at - self.offset, reason, consumer, report);
        }
        self.finished = self.fin_at.is_some();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hole_the_peer_acknowledged_is_declared_lost_at_once() {
        let mut r = Reassembler::new(1 << 20);
        r.on_syn(99);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        r.push(100, b"ab", false, &mut c, &mut rep);
        r.push(110, b"XY", false, &mut c, &mut rep);
        assert!(
            !r.hole_acked(105),
            "the peer has not acknowledged past the hole"
        );
        assert!(r.hole_acked(112));
        r.skip_acked_hole(&mut c, &mut rep);
        assert_eq!(c.bytes, b"ab????????XY");
        assert_eq!(rep.gaps, vec![(GapReason::Lost, 8)]);
        assert!(!r.hole_acked(200));
    }

    #[test]
    fn a_lost_tail_the_peer_acknowledged_before_the_fin_is_declared_lost() {
        // The last segment of a response was lost by the capture; the FIN and the peer's
        // acknowledgement of every byte were not.
        let mut r = Reassembler::new(1 << 20);
        r.on_syn(99);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        r.push(100, b"ab", false, &mut c, &mut rep);
        r.push(110, b"", true, &mut c, &mut rep);
        assert!(!r.is_finished());
        assert!(
            !r.hole_acked(105),
            "the peer has not acknowledged the whole hole"
        );
        assert!(r.hole_acked(110));
        assert!(r.hole_acked(111), "the FIN acknowledged too");
        r.skip_acked_hole(&mut c, &mut rep);
        assert_eq!(c.bytes, b"ab????????");
        assert_eq!(rep.gaps, vec![(GapReason::Lost, 8)]);
        assert!(r.is_finished());
        assert!(!r.hole_acked(111));
    }

    #[test]
    fn buffered_segments_are_charged_with_their_overhead() {
        // Room for 100 one-byte segments behind a hole, not the 100 x 100 that bytes alone
        // would let in.
        let mut r = Reassembler::new(100 * (1 + PENDING_SEGMENT_OVERHEAD));
        r.on_syn(99);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        for i in 0..100u32 {
            r.push(102 + 2 * i, b"x", false, &mut c, &mut rep);
        }
        assert_eq!(r.buffered_bytes(), 100 * (1 + PENDING_SEGMENT_OVERHEAD));
        assert!(rep.gaps.is_empty());
        r.push(302, b"x", false, &mut c, &mut rep);
        assert_eq!(rep.gaps.first(), Some(&(GapReason::BufferLimit, 2)));
        // The hole filled: delivered and no longer charged.
        r.push(100, &[b'y'; 400], false, &mut c, &mut rep);
        assert_eq!(r.buffered_bytes(), 0);
    }

    #[test]
    fn a_fin_after_a_cut_segment_finishes_the_stream_behind_a_gap() {
        let mut r = Reassembler::new(1 << 20);
        r.on_syn(99);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        r.push_cut(100, b"abcd", false, &mut c, &mut rep);
        assert!(!r.acks_undelivered(200), "a cut stream cannot catch up");
        r.push(110, b"", true, &mut c, &mut rep);
        assert!(r.is_finished());
        assert_eq!(rep.gaps, vec![(GapReason::Snaplen, 6)]);
    }

    #[test]
    fn acknowledgements_beyond_the_delivered_bytes_are_seen() {
        let mut r = Reassembler::new(1 << 20);
        assert!(!r.acks_undelivered(5));
        r.on_syn(u32::MAX - 1);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        assert!(!r.acks_undelivered(u32::MAX));
        assert!(r.acks_undelivered(3));
        r.push(u32::MAX, b"abcd", false, &mut c, &mut rep);
        assert!(!r.acks_undelivered(3));
        assert!(r.acks_undelivered(4));
    }

    #[test]
    fn a_segment_cut_by_the_snaplen_opens_a_gap_at_the_next_one() {
        let mut r = Reassembler::new(1 << 20);
        r.on_syn(99);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        // 10 bytes sent, 4 captured; the next segment starts where the 10 ended.
        r.push_cut(100, b"abcd", false, &mut c, &mut rep);
        r.push(110, b"XYZ", false, &mut c, &mut rep);
        assert_eq!(c.bytes, b"abcd??????XYZ");
        assert_eq!(rep.gaps, vec![(GapReason::Snaplen, 6)]);
        assert_eq!(r.buffered_bytes(), 0);
    }

    /// Where [`Reassembler::ignores_empty_push`] says so (the pipeline then skips the push),
    /// an empty push leaves the stream, the consumer and the report as they were; where it
    /// does not, one of them may change.
    #[test]
    fn an_empty_push_the_stream_ignores_changes_nothing() {
        type Step = fn(&mut Reassembler, &mut Collect, &mut PushReport);
        let steps: [(&str, Step, bool); 7] = [
            ("new", |_, _, _| {}, false),
            ("syn", |r, _, _| r.on_syn(99), true),
            ("data", |r, c, rep| r.push(100, b"abc", false, c, rep), true),
            ("hole", |r, c, rep| r.push(110, b"xyz", false, c, rep), true),
            (
                "cut",
                |r, c, rep| r.push_cut(103, b"de", false, c, rep),
                false,
            ),
            (
                "fin ahead",
                |r, c, rep| r.push(120, b"", true, c, rep),
                false,
            ),
            (
                "finished",
                |r, c, rep| r.flush(GapReason::Closed, c, rep),
                false,
            ),
        ];
        for end in 0..steps.len() {
            let mut r = Reassembler::new(1 << 20);
            let mut c = Collect::default();
            let mut rep = PushReport::default();
            for (_, step, _) in &steps[..=end] {
                step(&mut r, &mut c, &mut rep);
            }
            let (name, _, ignores) = steps[end];
            assert_eq!(r.ignores_empty_push(), ignores, "after {name}");
            if ignores {
                let before = (
                    format!("{r:?}"),
                    c.bytes.clone(),
                    c.gaps.clone(),
                    format!("{rep:?}"),
                );
                r.push(105, b"", false, &mut c, &mut rep);
                let after = (
                    format!("{r:?}"),
                    c.bytes.clone(),
                    c.gaps.clone(),
                    format!("{rep:?}"),
                );
                assert_eq!(before, after, "after {name}");
            }
        }
    }

    #[derive(Default)]
    struct Collect {
        bytes: Vec<u8>,
        gaps: Vec<u64>,
    }
    impl StreamConsumer for Collect {
        fn on_data(&mut self, data: &[u8]) {
            self.bytes.extend_from_slice(data);
        }
        fn on_gap(&mut self, len: u64) {
            self.gaps.push(len);
            self.bytes.extend(std::iter::repeat_n(b'?', len as usize));
        }
    }

    fn run(isn: u32, segs: &[(u32, &[u8])], cap: usize) -> (Collect, PushReport) {
        let mut r = Reassembler::new(cap);
        r.on_syn(isn);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        for (off, data) in segs {
            r.push(
                isn.wrapping_add(1).wrapping_add(*off),
                data,
                false,
                &mut c,
                &mut rep,
            );
        }
        r.flush(GapReason::Closed, &mut c, &mut rep);
        (c, rep)
    }

    #[test]
    fn in_order_and_out_of_order_deliver_the_same_bytes() {
        let (c, _) = run(100, &[(0, b"hello "), (6, b"world")], 1 << 20);
        assert_eq!(c.bytes, b"hello world");
        let (c, rep) = run(100, &[(6, b"world"), (0, b"hello ")], 1 << 20);
        assert_eq!(c.bytes, b"hello world");
        assert!(rep.gaps.is_empty());
    }

    #[test]
    fn sequence_wraparound() {
        let isn = u32::MAX - 3;
        let (c, rep) = run(isn, &[(4, b"defg"), (0, b"abcd"), (8, b"hij")], 1 << 20);
        assert_eq!(c.bytes, b"abcddefghij");
        assert!(rep.gaps.is_empty());
    }

    #[test]
    fn retransmissions_and_overlaps_first_copy_wins() {
        let (c, rep) = run(
            0,
            &[
                (0, b"abc"),
                (0, b"abc"),
                (5, b"fgh"),
                (4, b"XYZW"),
                (3, b"de"),
            ],
            1 << 20,
        );
        // "fgh" at 5 arrived first, so "XYZW" at 4 contributes only 'X' at 4, which in turn
        // beats the later 'e' at 4.
        assert_eq!(c.bytes, b"abcdXfgh");
        assert!(rep.identical_overlaps >= 1);
        assert_eq!(rep.conflicting_overlaps, 2);
    }

    /// A segment over many buffered one-byte segments keeps their bytes and fills the holes
    /// between them with its own, in time linear in their number (20,000 of them took seconds
    /// when each overlapped one split a list of all the pieces).
    #[test]
    fn a_segment_over_many_buffered_ones_fills_only_their_holes() {
        const N: u32 = 20_000;
        let odd: Vec<(u32, &[u8])> = (0..N).map(|i| (1 + 2 * i, &b"o"[..])).collect();
        let covering = vec![b'n'; 2 * N as usize + 3];
        // Behind a hole at 0, so that the pieces are buffered, not delivered, first.
        let mut segs = odd.clone();
        segs.push((1, &covering[1..]));
        segs.push((0, b"h"));
        let (c, rep) = run(0, &segs, 1 << 30);
        let mut want = vec![b'h'];
        for _ in 0..N {
            want.extend_from_slice(b"on");
        }
        want.extend_from_slice(b"nn");
        assert_eq!(c.bytes, want);
        assert!(rep.gaps.is_empty());
        assert_eq!(rep.conflicting_overlaps, N);
        // The same bytes again: identical overlaps only, and a range reaching past both ends.
        let mut r = Reassembler::new(1 << 30);
        r.on_syn(0);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        for (off, data) in &odd {
            r.push(1 + off, data, false, &mut c, &mut rep);
        }
        let same: Vec<u8> = (0..2 * N + 2)
            .map(|i| if i % 2 == 1 { b'o' } else { b'n' })
            .collect();
        r.push(1 + 1, &same[1..], false, &mut c, &mut rep);
        assert_eq!(rep.identical_overlaps, N);
        assert_eq!(rep.conflicting_overlaps, 0);
        assert_eq!(r.pending.len(), 2 * N as usize);
        r.push(1, b"n", false, &mut c, &mut rep);
        assert_eq!(c.bytes, same);
    }

    #[test]
    fn buffer_cap_declares_a_gap_and_resumes() {
        let (c, rep) = run(0, &[(10, b"0123456789"), (20, b"abcdefghij")], 15);
        assert_eq!(c.gaps, vec![10]);
        assert_eq!(&c.bytes[10..], b"0123456789abcdefghij");
        assert_eq!(rep.gaps, vec![(GapReason::BufferLimit, 10)]);
    }

    #[test]
    fn flush_declares_holes() {
        let (c, rep) = run(0, &[(0, b"ab"), (5, b"fg")], 1 << 20);
        assert_eq!(c.bytes, b"ab???fg");
        assert_eq!(rep.gaps, vec![(GapReason::Closed, 3)]);
    }

    #[test]
    fn midstream_pickup_starts_at_first_segment() {
        let mut r = Reassembler::new(1024);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        r.push(5000, b"xyz", false, &mut c, &mut rep);
        r.push(5003, b"!", true, &mut c, &mut rep);
        assert_eq!(c.bytes, b"xyz!");
        assert!(r.is_finished());
    }

    #[test]
    fn fin_before_missing_data_waits_for_it() {
        let mut r = Reassembler::new(1024);
        r.on_syn(0);
        let mut c = Collect::default();
        let mut rep = PushReport::default();
        r.push(4, b"de", true, &mut c, &mut rep);
        assert!(!r.is_finished());
        r.push(1, b"abc", false, &mut c, &mut rep);
        assert!(r.is_finished());
        assert_eq!(c.bytes, b"abcde");
    }
}
