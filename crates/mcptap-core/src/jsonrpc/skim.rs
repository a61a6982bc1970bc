//! Splits JSON text into the raw members of an object or the raw elements of an array,
//! stepping over each value without decoding or validating it.
//!
//! serde_json validates every string byte by byte (eight at a time) to find where a value
//! ends; a tool result is mostly one long string, so that scan dominated the whole pipeline.
//! Here a string's end is found with `memchr` (the next quote, escaped or not), and containers by
//! counting brackets outside strings. Only the small members MCP reads are then given to
//! serde_json. The text inside skipped values is not checked: a monitor only needs to know
//! where they end.
//!
//! Iterative, so nesting depth costs no stack; every index is bounds-checked.

use memchr::memchr;

/// Members of the object `text` as (raw key with its quotes, raw value), in order.
/// `None` if `text` is not one well-formed object at the top level.
pub fn object_members(text: &str) -> Option<Vec<(&str, &str)>> {
    object_members_measured(text, |_, _| None)
}

/// [`object_members`], where `measure` may step over a value itself: given the raw key and the
/// text from the value's first byte, it returns the value's length, or `None` to have it
/// skimmed as usual. (A caller that validates a value anyway walks it once, not twice.)
pub fn object_members_measured<'a>(
    text: &'a str,
    measure: impl FnMut(&str, &'a str) -> Option<usize>,
) -> Option<Vec<(&'a str, &'a str)>> {
    let mut list = Listed {
        measure,
        members: Vec::with_capacity(8),
    };
    visit_object(text, &mut list)?;
    Some(list.members)
}

/// What reads an object's members as they are stepped over.
pub trait MemberVisitor<'a> {
    /// The length of the value at the start of `rest` (member `key`, raw with its quotes), or
    /// `None` to have it skimmed.
    fn measure(&mut self, key: &str, rest: &'a str) -> Option<usize>;
    /// One member: raw key with its quotes, raw value.
    fn member(&mut self, key: &'a str, value: &'a str);
}

/// Members into a list, with a measuring closure.
struct Listed<'a, M> {
    measure: M,
    members: Vec<(&'a str, &'a str)>,
}

impl<'a, M: FnMut(&str, &'a str) -> Option<usize>> MemberVisitor<'a> for Listed<'a, M> {
    fn measure(&mut self, key: &str, rest: &'a str) -> Option<usize> {
        (self.measure)(key, rest)
    }

    fn member(&mut self, key: &'a str, value: &'a str) {
        self.members.push((key, value));
    }
}

/// Gives `visitor` the members of the object `text` is (whitespace around it allowed), in
/// order, without collecting them. `None` if `text` is not one well-formed object at the top
/// level; the members before the fault were visited all the same.
// Not inlined: inlined into the envelope's parser it made that too large for its own callees
// (the key reader) to be inlined, a net loss.
#[inline(never)]
pub fn visit_object<'a>(text: &'a str, visitor: &mut impl MemberVisitor<'a>) -> Option<()> {
    let b = text.as_bytes();
    let i = skip_ws(b, 0);
    let len = visit_leading_object(text.get(i..)?, visitor)?;
    end(b, i + len).then_some(())
}

/// The members of the object that `text` starts with (no whitespace before it), and the
/// object's length: what follows it is not looked at.
pub fn leading_object_members<'a>(
    text: &'a str,
    measure: impl FnMut(&str, &'a str) -> Option<usize>,
) -> Option<(Vec<(&'a str, &'a str)>, usize)> {
    // A JSON-RPC envelope has up to five members, a result's object a few more: one
    // allocation instead of one per doubling.
    let mut list = Listed {
        measure,
        members: Vec::with_capacity(8),
    };
    let len = visit_leading_object(text, &mut list)?;
    Some((list.members, len))
}

/// [`leading_object_members`] into `visitor`: the object's length.
fn visit_leading_object<'a>(text: &'a str, visitor: &mut impl MemberVisitor<'a>) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = 0;
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = text.get(i..key_end)?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        let measured = text
            .get(start..)
            .and_then(|rest| visitor.measure(key, rest));
        let value_end = match measured {
            Some(len) => start.checked_add(len)?,
            None => skip_value(b, start)?,
        };
        visitor.member(key, text.get(start..value_end)?);
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Elements of the array `text` as raw values, in order. `None` if `text` is not one
/// well-formed array at the top level.
pub fn array_elements(text: &str) -> Option<Vec<&str>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_ws(b, i + 1);
    let mut elements = Vec::new();
    if b.get(i) == Some(&b']') {
        return end(b, i + 1).then_some(elements);
    }
    loop {
        let value_end = skip_value(b, i)?;
        elements.push(text.get(i..value_end)?);
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b']') => return end(b, i + 1).then_some(elements),
            _ => return None,
        }
    }
}

/// Only whitespace after the top-level value.
fn end(b: &[u8], i: usize) -> bool {
    skip_ws(b, i) == b.len()
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// `b[i]` is the opening quote; returns the index just past the closing one.
///
/// Searches for quotes only: text is full of escapes (`\n`, `\"` in embedded JSON) but has
/// few quotes, so stopping at every escape made a search per line of a tool result. A quote
/// preceded by an odd run of backslashes is escaped; each run is counted once, so the scan stays
/// linear.
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let body = i + 1;
    let mut pos = body;
    loop {
        let at = pos + memchr(b'"', b.get(pos..)?)?;
        let backslashes = b
            .get(body..at)?
            .iter()
            .rev()
            .take_while(|&&c| c == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Some(at + 1);
        }
        pos = at + 1;
    }
}

/// Index just past the value starting at `b[i]`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => skip_container(b, i),
        _ => {
            // A number or a literal: up to the next delimiter.
            let len = b
                .get(i..)?
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(b.len() - i);
            (len > 0).then_some(i + len)
        }
    }
}

/// `b[i]` opens an object or array; returns the index just past its matching close. Brackets
/// must pair up by kind; strings inside are stepped over.
fn skip_container(b: &[u8], i: usize) -> Option<usize> {
    // Open brackets as a bit stack (1 = object): the first 64 levels in a word, deeper ones
    // in words on the heap, so depth is unbounded and the usual value allocates nothing.
    let mut shallow = 0u64;
    let mut deep: Vec<u64> = Vec::new();
    let mut depth = 0usize;
    let mut pos = i;
    loop {
        match *b.get(pos)? {
            b'"' => {
                pos = skip_string(b, pos)?;
                continue;
            }
            open @ (b'{' | b'[') => {
                let (word, bit) = (depth / 64, depth % 64);
                let w = if word == 0 {
                    &mut shallow
                } else {
                    if deep.len() < word {
                        deep.push(0);
                    }
                    deep.get_mut(word - 1)?
                };
                if open == b'{' {
                    *w |= 1 << bit;
                } else {
                    *w &= !(1 << bit);
                }
                depth += 1;
            }
            close @ (b'}' | b']') => {
                depth = depth.checked_sub(1)?;
                let word = match depth / 64 {
                    0 => shallow,
                    w => *deep.get(w - 1)?,
                };
                let is_object = word >> (depth % 64) & 1 == 1;
                if is_object != (close == b'}') {
                    return None;
                }
                if depth == 0 {
                    return Some(pos + 1);
                }
            }
            _ => {}
        }
        pos += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_elements() {
        let text = r#" { "a" : 1 , "b\"q" : "x\\\"}" , "c" : [ {"d": "]"}, [] ] , "e":null } "#;
        assert_eq!(
            object_members(text).unwrap(),
            vec![
                (r#""a""#, "1"),
                (r#""b\"q""#, r#""x\\\"}""#),
                (r#""c""#, r#"[ {"d": "]"}, [] ]"#),
                (r#""e""#, "null"),
            ]
        );
        assert_eq!(object_members("{}").unwrap(), vec![]);
        assert_eq!(
            array_elements(r#"[1, "a", {"b": [2]}, true]"#).unwrap(),
            vec!["1", r#""a""#, r#"{"b": [2]}"#, "true"]
        );
        assert_eq!(array_elements(" [ ] ").unwrap(), Vec::<&str>::new());
    }

    #[test]
    fn malformed_structure_is_refused() {
        for bad in [
            "",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":[1}",
            "{\"a\":{1]}",
            "{\"a\":\"unterminated}",
            "{\"a\":\"ends in escape\\",
            "{\"a\":1} x",
            "{a:1}",
            "[1,]",
            "[1 2]",
        ] {
            assert!(object_members(bad).is_none(), "{bad}");
            assert!(array_elements(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn deep_nesting_is_iterative() {
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(200_000), "]".repeat(200_000));
        let members = object_members(&deep).unwrap();
        assert_eq!(members.len(), 1);
        let unbalanced = format!("{{\"a\":{}{}}}", "[".repeat(200_000), "]".repeat(199_999));
        assert!(object_members(&unbalanced).is_none());
    }

    #[test]
    fn bracket_kinds_pair_up_beyond_the_first_word_of_the_stack() {
        // Objects and arrays alternating 120 deep (serde_json stops at 128): the stack spills
        // past its first 64 levels.
        let (mut open, mut close) = (String::new(), String::new());
        for level in 0..120 {
            if level % 2 == 0 {
                open.push_str("{\"k\":");
                close.insert(0, '}');
            } else {
                open.push('[');
                close.insert(0, ']');
            }
        }
        let good = format!("{{\"a\":{open}1{close},\"b\":2}}");
        let members = object_members(&good).unwrap();
        assert_eq!(members.len(), 2);
        assert!(serde_json::from_str::<serde_json::Value>(&good).is_ok());
        // One close of the wrong kind at level 100 is refused.
        let mut bad: Vec<char> = close.chars().collect();
        let at = 120 - 1 - 100;
        bad[at] = if bad[at] == '}' { ']' } else { '}' };
        let bad: String = bad.into_iter().collect();
        assert!(object_members(&format!("{{\"a\":{open}1{bad}}}")).is_none());
    }

    #[test]
    fn agrees_with_serde_json_on_where_values_end() {
        // Random JSON documents: the skimmed members re-parse to the serde_json members.
        let mut state = 0x2545_F491_4F6C_DD1D_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        fn value(next: &mut dyn FnMut() -> u64, depth: u32) -> serde_json::Value {
            use serde_json::json;
            match next() % if depth > 3 { 5 } else { 7 } {
                0 => json!(null),
                1 => json!(next().is_multiple_of(2)),
                2 => json!((next() % 2_000_000) as i64 - 1_000_000),
                3 => json!(f64::from((next() % 1000) as u32) / 8.0),
                4 => {
                    let pieces = ["a", "\"", "\\", "}", "]", "\u{e9}", "\n", "\u{1}", " ", "x"];
                    let n = next() % 12;
                    json!(
                        (0..n)
                            .map(|_| pieces[(next() % 10) as usize])
                            .collect::<String>()
                    )
                }
                5 => serde_json::Value::Array(
                    (0..next() % 4).map(|_| value(next, depth + 1)).collect(),
                ),
                _ => serde_json::Value::Object(
                    (0..next() % 4)
                        .map(|i| (format!("k{i}\"}}"), value(next, depth + 1)))
                        .collect(),
                ),
            }
        }
        for _ in 0..3000 {
            let mut doc = serde_json::Map::new();
            for i in 0..(next() % 5) {
                doc.insert(format!("m{i}"), value(&mut next, 0));
            }
            for text in [
                serde_json::to_string(&doc).unwrap(),
                serde_json::to_string_pretty(&doc).unwrap(),
            ] {
                let members = object_members(&text).expect(&text);
                assert_eq!(members.len(), doc.len());
                for ((key, raw), (k, v)) in members.iter().zip(doc.iter()) {
                    assert_eq!(serde_json::from_str::<String>(key).unwrap(), *k);
                    assert_eq!(&serde_json::from_str::<serde_json::Value>(raw).unwrap(), v);
                }
            }
        }
    }
}
