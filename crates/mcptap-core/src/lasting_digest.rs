//! Digests that outlive the process: snapshot files and the fleet store keep them, and another
//! build, release or host must compute the same value. So they come from a specified algorithm
//! (XXH3-64, chained: each part hashed with the digest so far as its seed), never from the
//! table hasher, whose output may change with its version. Tables and shard choice, which live
//! in one process, keep foldhash.

/// A digest built part by part. XXH3 mixes each part's length into its output, and each part
/// is seeded by the ones before, so `("ab", "c")` and `("a", "bc")` differ.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub(crate) struct LastingDigest(u64);

impl LastingDigest {
    /// A digest of one purpose: the seed keeps different purposes' digests apart.
    pub(crate) const fn new(purpose: u64) -> Self {
        LastingDigest(purpose)
    }

    pub(crate) fn part(self, bytes: &[u8]) -> Self {
        LastingDigest(xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0))
    }

    /// An optional part: present and absent (and absent and empty) differ.
    pub(crate) fn optional(self, bytes: Option<&[u8]>) -> Self {
        match bytes {
            Some(b) => self.part(&[1]).part(b),
            None => self.part(&[0]),
        }
    }

    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// The digest of one text.
pub(crate) fn lasting_digest_of(purpose: u64, bytes: &[u8]) -> u64 {
    LastingDigest::new(purpose).part(bytes).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values are part of the snapshot and fleet formats: pinned here, so that a change
    /// of algorithm or crate version that moves them fails a test instead of every stored key.
    #[test]
    fn digests_are_pinned() {
        assert_eq!(
            lasting_digest_of(0, b""),
            xxhash_rust::xxh3::xxh3_64(b""),
            "seed 0 is plain XXH3-64"
        );
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(lasting_digest_of(7, b"tools/call"), PINNED_TOOLS_CALL);
        let chained = LastingDigest::new(7).part(b"tools/").part(b"call").finish();
        assert_eq!(chained, PINNED_CHAINED);
    }

    const PINNED_TOOLS_CALL: u64 = 0xd57e_e804_272b_d07d;
    const PINNED_CHAINED: u64 = 0xd098_f8ef_578b_a553;

    #[test]
    fn parts_are_not_concatenated() {
        let ab_c = LastingDigest::new(1).part(b"ab").part(b"c").finish();
        let a_bc = LastingDigest::new(1).part(b"a").part(b"bc").finish();
        assert_ne!(ab_c, a_bc);
        let none = LastingDigest::new(1).optional(None).finish();
        let empty = LastingDigest::new(1).optional(Some(b"")).finish();
        assert_ne!(none, empty);
        assert_ne!(lasting_digest_of(1, b"x"), lasting_digest_of(2, b"x"));
    }
}
