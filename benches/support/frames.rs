//! Frames kept for a bench's timed loop.

/// Many frames back to back: one allocation, an index of (timestamp, start, end).
#[derive(Default)]
pub struct FrameStore {
    data: Vec<u8>,
    index: Vec<(i64, usize, usize)>,
}

impl FrameStore {
    pub fn push(&mut self, ts: i64, frame: &[u8]) {
        let start = self.data.len();
        self.data.extend_from_slice(frame);
        self.index.push((ts, start, self.data.len()));
    }

    pub fn frames(&self) -> impl Iterator<Item = (i64, &[u8])> {
        self.index
            .iter()
            .filter_map(|&(ts, s, e)| self.data.get(s..e).map(|f| (ts, f)))
    }

    /// Bytes of all frames.
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64
    }

    pub fn packets(&self) -> usize {
        self.index.len()
    }
}
