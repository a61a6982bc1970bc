//! ASCII checks a word (8 bytes) at a time, for the short texts every message has: header
//! names compared without regard to case (each head's names against the dozen a monitor
//! reads; `eq_ignore_ascii_case` folds both sides a byte at a time) and session ids checked as
//! visible ASCII.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// `word` with its ASCII capitals in lower case. Every byte must be below 0x80, so that the
/// additions cannot carry from one byte into the next.
#[inline]
fn fold(word: u64) -> u64 {
    // A byte is a capital when adding 0x3f sets its high bit (>= 'A') and adding 0x25 does not
    // (<= 'Z'); its 0x20 bit then makes it lower case.
    let capitals = word.wrapping_add(ONES * 0x3f) & !word.wrapping_add(ONES * 0x25) & HIGHS;
    word | (capitals >> 2)
}

#[inline]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..)
        .and_then(|rest| rest.first_chunk::<8>())
        .map_or(0, |w| u64::from_le_bytes(*w))
}

/// Whether `name` and `other` are equal ignoring ASCII case, exactly as
/// `str::eq_ignore_ascii_case`.
#[inline]
pub(crate) fn eq_ignore_case(name: &str, other: &str) -> bool {
    let (a, b) = (name.as_bytes(), other.as_bytes());
    let len = a.len();
    if len != b.len() {
        return false;
    }
    if len < 8 {
        return a.eq_ignore_ascii_case(b);
    }
    let mut at = 0;
    loop {
        // The last word overlaps the one before it when the length is not a multiple of 8.
        let word = at.min(len - 8);
        let (x, y) = (word_at(a, word), word_at(b, word));
        if (x | y) & HIGHS != 0 {
            // Not ASCII (never in a token): compared as the standard library compares.
            return a.eq_ignore_ascii_case(b);
        }
        if fold(x) != fold(y) {
            return false;
        }
        at += 8;
        if at >= len {
            return true;
        }
    }
}

/// Whether every byte is visible ASCII (0x21..=0x7e), a word at a time: every request and
/// response with a session id asks.
pub(crate) fn all_visible(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let w = word_at(word, 0);
        // A byte below 0x21 borrows into its high bit; one from 0x7f up has it set, itself or
        // once 1 is added (carries out of a 0xff byte only add to what is already found).
        let below = w.wrapping_sub(ONES * 0x21) & !w;
        let above = w.wrapping_add(ONES) | w;
        if (below | above) & HIGHS != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|b| (0x21..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_matches_the_standard_library_on_every_byte_pair() {
        for x in 0..=255u8 {
            for y in 0..=255u8 {
                // One differing byte at each position of a word-and-a-half name.
                for at in [0, 7, 8, 11, 13] {
                    let mut a = *b"content-leNGTH";
                    let mut b = *b"Content-Length";
                    a[at] = x;
                    b[at] = y;
                    let (Ok(a), Ok(b)) = (std::str::from_utf8(&a), std::str::from_utf8(&b)) else {
                        continue;
                    };
                    assert_eq!(
                        eq_ignore_case(a, b),
                        a.eq_ignore_ascii_case(b),
                        "{a:?} {b:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn lengths_and_non_ascii() {
        let names = [
            "",
            "a",
            "Host",
            "ACCEPT",
            "user-agent",
            "Mcp-Session-Id",
            "mcp-session-id",
            "MCP-Protocol-Version",
            "mcp-protocol-versioN",
            "mcp-protocol-versiom",
            "x-forwarded-for",
            "tränsfer-encoding",
            "TRÄNSFER-ENCODING",
            "transfer-encoding",
            "transfer-encodinG",
            "12345678",
            "1234567@",
            "1234567`",
        ];
        for a in names {
            for b in names {
                assert_eq!(
                    eq_ignore_case(a, b),
                    a.eq_ignore_ascii_case(b),
                    "{a:?} {b:?}"
                );
            }
        }
    }

    #[test]
    fn visible_word_by_word_as_byte_by_byte() {
        let plain = |b: &[u8]| b.iter().all(|b| (0x21..=0x7e).contains(b));
        for len in 1..=20 {
            for at in 0..len {
                for byte in 0..=255u8 {
                    for fill in [b'a', b'~', b'!'] {
                        let mut id = vec![fill; len];
                        id[at] = byte;
                        assert_eq!(all_visible(&id), plain(&id), "{id:?}");
                        if at + 1 < len {
                            id[at + 1] = 0xff;
                            assert_eq!(all_visible(&id), plain(&id), "{id:?}");
                        }
                    }
                }
            }
        }
        assert!(all_visible(b""));
        assert!(!crate::mcp::session::is_valid_session_id("", 64));
        assert!(!crate::mcp::session::is_valid_session_id("a b", 64));
        assert!(crate::mcp::session::is_valid_session_id(
            "00000003-0003-4a5e-9c1d-c0715a485def",
            64
        ));
        assert!(!crate::mcp::session::is_valid_session_id(
            "00000003-0003-4a5e-9c1d-c0715a485def",
            35
        ));
    }
}
