//! Validates a JSON object or array as serde_json reads it, finding an object's top-level
//! members in the same pass.
//!
//! A request's `params` must be valid JSON (a message whose params are not is invalid JSON),
//! and the monitor then reads a member or two of it (a tool name, `_meta`). serde_json's raw
//! value check walks the text token by token through its generic reader; here strings are
//! scanned eight bytes at a time and every other token is one `match`, and the members come
//! out of the same walk, so that nothing reads the params a second time.
//!
//! The grammar is RFC 8259's, exactly as serde_json 1.x accepts it: no depth limit for a raw
//! value, any `\u` escape of four hex digits (a lone surrogate too), no control characters in
//! strings. Anything refused here is refused by serde_json as well; callers that get `None`
//! ask serde_json, so an input this module might wrongly refuse would only cost time. The
//! tests hold both to each other on generated and mutated text.
//!
//! Iterative, so nesting depth costs no stack; every index is bounds-checked.

/// A valid object or array at the start of some text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container<'a> {
    /// Its length: the text up to and including the closing bracket.
    pub len: usize,
    /// An object's top-level members as (raw key with its quotes, raw value), in order;
    /// `None` for an array, and for an object of more than [`MAX_MEMBERS`] (callers read
    /// those the slower way).
    pub members: Option<Vec<(&'a str, &'a str)>>,
    /// The deepest nesting of objects and arrays in it (1 for a container of scalars).
    pub deepest: usize,
}

/// Most members recorded: params name a handful, and a hostile object of millions of tiny
/// members must not become a list several times its size.
pub const MAX_MEMBERS: usize = 64;

/// The object or array `text` starts with (no whitespace before it), if it is valid JSON up to
/// its closing bracket; what follows is not looked at.
pub fn leading_container(text: &str) -> Option<Container<'_>> {
    container(text, true)
}

/// Whether `text` is one valid JSON value and nothing else (no whitespace around it either),
/// as serde_json reads a raw value.
pub fn whole_value(text: &str) -> bool {
    let b = text.as_bytes();
    let end = match b.first() {
        Some(b'{' | b'[') => container(text, false).map(|c| c.len),
        Some(b'"') => string_end(b, 0),
        Some(b'-' | b'0'..=b'9') => number_end(b, 0),
        Some(b't') => literal_end(b, 0, b"true"),
        Some(b'f') => literal_end(b, 0, b"false"),
        Some(b'n') => literal_end(b, 0, b"null"),
        _ => None,
    };
    end == Some(b.len())
}

/// The length of the object, array or string `text` starts with, if it is valid JSON (for
/// these the skim ends a value where serde_json does); `None` for anything else.
pub fn leading_value_len(text: &str) -> Option<usize> {
    match text.as_bytes().first()? {
        b'{' | b'[' => container(text, false).map(|c| c.len),
        b'"' => string_end(text.as_bytes(), 0),
        _ => None,
    }
}

/// [`leading_container`]; `list_members`: whether an object's members are listed.
fn container(text: &str, list_members: bool) -> Option<Container<'_>> {
    let b = text.as_bytes();
    let top_is_object = match b.first()? {
        b'{' => true,
        b'[' => false,
        _ => return None,
    };
    let mut members = (top_is_object && list_members).then(|| Vec::with_capacity(8));
    let mut open = BracketStack::default();
    let mut deepest = 0;
    // The key and value start of the top-level member being read.
    let mut member: (usize, usize, usize) = (0, 0, 0);
    let mut i = 0;
    'value: loop {
        // At the first byte of a value (whitespace skipped).
        match *b.get(i)? {
            b'"' => i = string_end(b, i)?,
            c @ (b'{' | b'[') => {
                open.push(c == b'{')?;
                deepest = deepest.max(open.depth());
                i = skip_ws(b, i + 1);
                let close = if c == b'{' { b'}' } else { b']' };
                if b.get(i) == Some(&close) {
                    open.pop();
                    i += 1;
                } else {
                    if c == b'{' {
                        i = key_and_colon(b, i, open.depth(), &mut member)?;
                    }
                    continue 'value;
                }
            }
            b't' => i = literal_end(b, i, b"true")?,
            b'f' => i = literal_end(b, i, b"false")?,
            b'n' => i = literal_end(b, i, b"null")?,
            b'-' | b'0'..=b'9' => i = number_end(b, i)?,
            _ => return None,
        }
        // Just past a value: record it if it is a top-level member, then read separators and
        // closing brackets up to the next value.
        loop {
            let depth = open.depth();
            if depth == 0 {
                return Some(Container {
                    len: i,
                    members,
                    deepest,
                });
            }
            if depth == 1
                && let Some(list) = members.as_mut()
            {
                if list.len() == MAX_MEMBERS {
                    members = None;
                } else {
                    let (key_start, key_end, value_start) = member;
                    list.push((text.get(key_start..key_end)?, text.get(value_start..i)?));
                }
            }
            i = skip_ws(b, i);
            match *b.get(i)? {
                b',' => {
                    i = skip_ws(b, i + 1);
                    if open.top_is_object() {
                        i = key_and_colon(b, i, depth, &mut member)?;
                    }
                    continue 'value;
                }
                b'}' if open.top_is_object() => {}
                b']' if !open.top_is_object() => {}
                _ => return None,
            }
            open.pop();
            i += 1;
        }
    }
}

/// Reads `"key" :` and the whitespace after it from `b[i]`, returning the index of the value.
/// At `depth` 1 the key and value start are kept in `member`.
#[inline(always)]
fn key_and_colon(
    b: &[u8],
    i: usize,
    depth: usize,
    member: &mut (usize, usize, usize),
) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let key_end = string_end(b, i)?;
    let colon = skip_ws(b, key_end);
    if b.get(colon) != Some(&b':') {
        return None;
    }
    let value = skip_ws(b, colon + 1);
    if depth == 1 {
        *member = (i, key_end, value);
    }
    Some(value)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

fn literal_end(b: &[u8], i: usize, literal: &[u8]) -> Option<usize> {
    let end = i.checked_add(literal.len())?;
    (b.get(i..end)? == literal).then_some(end)
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` from `b[i]`; the index just past it.
fn number_end(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |b: &[u8], i: usize| {
        i + b
            .get(i..)
            .unwrap_or_default()
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i + 1),
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        let end = digits(b, i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(b, i);
        if end == i {
            return None;
        }
        i = end;
    }
    Some(i)
}

const ONES: u64 = u64::from_le_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);

/// `b[i]` is an opening quote; the index just past the closing one, if every escape is one
/// JSON knows and no control character comes before it. Inlined: called per string, most of
/// which are a few bytes.
#[inline(always)]
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        // Eight bytes at a time while none is a quote, a backslash or a control character.
        while let Some(chunk) = b.get(j..j + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            // Little-endian: the lowest flagged byte is the first special one (a borrow only
            // flags bytes after a real one).
            let w = u64::from_le_bytes(word);
            let special = ((w ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES)
                | (w ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES)
                | w.wrapping_sub(ONES * 0x20))
                & !w
                & HIGHS;
            if special != 0 {
                j += (special.trailing_zeros() / 8) as usize;
                break;
            }
            j += 8;
        }
        match *b.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => match *b.get(j + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                b'u' => {
                    let hex = b.get(j + 2..j + 6)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    j += 6;
                }
                _ => return None,
            },
            0..0x20 => return None,
            _ => j += 1,
        }
    }
}

/// Open brackets as bits (1 = object): the first 64 levels in a word, deeper ones in words on
/// the heap, so depth is unbounded and the usual value allocates nothing.
#[derive(Default)]
struct BracketStack {
    shallow: u64,
    deep: Vec<u64>,
    depth: usize,
}

impl BracketStack {
    fn depth(&self) -> usize {
        self.depth
    }

    fn push(&mut self, object: bool) -> Option<()> {
        let (word, bit) = (self.depth / 64, self.depth % 64);
        let w = if word == 0 {
            &mut self.shallow
        } else {
            if self.deep.len() < word {
                self.deep.push(0);
            }
            self.deep.get_mut(word - 1)?
        };
        if object {
            *w |= 1 << bit;
        } else {
            *w &= !(1 << bit);
        }
        self.depth += 1;
        Some(())
    }

    fn pop(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    /// Whether the innermost open bracket is an object's (false when none is open).
    fn top_is_object(&self) -> bool {
        let Some(top) = self.depth.checked_sub(1) else {
            return false;
        };
        let word = match top / 64 {
            0 => self.shallow,
            w => self.deep.get(w - 1).copied().unwrap_or(0),
        };
        word >> (top % 64) & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    /// serde_json's answer for a container at the start of `text`: its length, as the
    /// envelope's stream read finds it.
    fn serde_len(text: &str) -> Option<usize> {
        let mut values = serde_json::Deserializer::from_str(text).into_iter::<&RawValue>();
        values.next()?.ok()?;
        Some(values.byte_offset())
    }

    fn check(text: &str) {
        let ours = leading_container(text);
        let theirs = text
            .starts_with(['{', '['])
            .then(|| serde_len(text))
            .flatten();
        assert_eq!(ours.as_ref().map(|c| c.len), theirs, "{text:?}");
        if text.trim_matches([' ', '\t', '\n', '\r']) == text {
            assert_eq!(
                whole_value(text),
                serde_json::from_str::<&RawValue>(text).is_ok(),
                "whole {text:?}"
            );
        }
        if let Some(c) = ours {
            let whole = &text[..c.len];
            let expected = whole
                .starts_with('{')
                .then(|| {
                    super::super::skim::object_members(whole)
                        .expect("members")
                        .to_vec()
                })
                .filter(|m| m.len() <= MAX_MEMBERS);
            assert_eq!(c.members, expected, "{text:?}");
        }
    }

    #[test]
    fn members_and_lengths() {
        let c = leading_container(r#"{ "a" : 1 , "b\"" : [ {"c": "]"} ] , "d":{} } tail"#)
            .expect("valid");
        assert_eq!(
            c.len,
            r#"{ "a" : 1 , "b\"" : [ {"c": "]"} ] , "d":{} }"#.len()
        );
        assert_eq!(
            c.members.expect("object"),
            vec![
                (r#""a""#, "1"),
                (r#""b\"""#, r#"[ {"c": "]"} ]"#),
                (r#""d""#, "{}")
            ]
        );
        let c = leading_container("[1, [], {}]x").expect("valid");
        assert_eq!((c.len, c.members, c.deepest), (11, None, 2));
        let c = leading_container(r#"{"a":"[[[","b":[{"c":[]}]}"#).expect("valid");
        assert_eq!(c.deepest, 4);
        assert_eq!(
            leading_container("{}").expect("valid").members,
            Some(vec![])
        );
    }

    #[test]
    fn members_beyond_the_cap_are_not_listed() {
        let object = |n: usize| {
            let body: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            format!("{{{}}}", body.join(","))
        };
        let at_cap = object(MAX_MEMBERS);
        let c = leading_container(&at_cap).expect("valid");
        assert_eq!(c.members.map(|m| m.len()), Some(MAX_MEMBERS));
        let over = object(MAX_MEMBERS + 1);
        let c = leading_container(&over).expect("valid");
        assert_eq!((c.len, c.members), (over.len(), None));
        check(&over);
        // Read the slower way, the facts are the same.
        let message = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}}"#,
            over.replacen("\"k0\":0", "\"name\":\"t\"", 1)
        );
        let parsed = super::super::parse_str(&message).expect("request");
        let Some(super::super::Message::Request { params, .. }) = parsed.first() else {
            panic!("{parsed:?}")
        };
        assert_eq!(params.as_ref().and_then(|p| p.members()), None);
        assert_eq!(
            super::super::tool_name(params.as_ref()).as_deref(),
            Some("t")
        );
    }

    #[test]
    fn what_serde_refuses_is_refused() {
        for bad in [
            "",
            "1",
            "\"s\"",
            "{",
            "[",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "[1,]",
            "[,]",
            "{,}",
            "[1 2]",
            "{\"a\":1 \"b\":2}",
            "{\"a\":[1}",
            "[01]",
            "[-]",
            "[1.]",
            "[.5]",
            "[1e]",
            "[1e+]",
            "[+1]",
            "[tru]",
            "[truex]",
            "[nul]",
            "[\"\\x\"]",
            "[\"\\u12g4\"]",
            "[\"\\u12\"]",
            "[\"a\u{1}\"]",
            "[\"a\nb\"]",
            "{a:1}",
            "{1:1}",
            "[NaN]",
            "[Infinity]",
            "[\"unterminated]",
            "[\"ends in escape\\",
        ] {
            assert_eq!(leading_container(bad), None, "{bad:?}");
            check(bad);
        }
        for (scalar, valid) in [
            ("\"s\"", true),
            ("\"\\u00e9\"", true),
            ("-0.5e-7", true),
            ("0", true),
            ("true", true),
            ("null", true),
            ("01", false),
            ("1.", false),
            ("tru", false),
            ("truex", false),
            ("\"a\u{1}\"", false),
            ("\"open", false),
            ("1 ", false),
            ("", false),
        ] {
            assert_eq!(whole_value(scalar), valid, "{scalar:?}");
            check(scalar);
        }
        for good in [
            "[-0.5e-7, 1E+2, 0, -12, 3.25]",
            "[\"\\u00e9\\ud800\\/\\b\\f\\n\\r\\t\\\\\\\"\"]",
            "{\"\u{e9}\":\"\u{1f600}\"}",
            " [ ]".trim_start(),
            "[true,false,null]",
            "{\"a\":{\"b\":{\"c\":[[[]]]}}}",
        ] {
            assert!(leading_container(good).is_some(), "{good:?}");
            check(good);
        }
    }

    #[test]
    fn deep_nesting_is_iterative_and_kinds_pair_up() {
        let deep = format!("[{}1{}]", "[{\"k\":".repeat(50_000), "}]".repeat(50_000));
        check(&deep);
        assert!(leading_container(&deep).is_some());
        let mut wrong = deep.clone().into_bytes();
        let at = wrong.len() - 1000;
        wrong[at] = if wrong[at] == b'}' { b']' } else { b'}' };
        let wrong = String::from_utf8(wrong).expect("ascii");
        assert_eq!(leading_container(&wrong), None);
        check(&wrong);
    }

    /// Pieces JSON is made of, valid and not: random sequences of them hit every branch.
    const PIECES: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        " ",
        "\n",
        "\"",
        "\"k\"",
        "\"v w\"",
        "\\",
        "\\\"",
        "\\u",
        "\\u00e9",
        "00",
        "0",
        "1",
        "-",
        "+",
        ".",
        "e",
        "E",
        "12.5",
        "true",
        "false",
        "null",
        "tru",
        "\u{1}",
        "\t",
        "x",
        "\u{e9}",
        "\"a\":",
        "[1,2]",
        "{\"a\":1}",
        "\"long string of \
         more than eight bytes\"",
    ];

    /// A JSON document from `seed`, written with varied whitespace, number forms and escapes;
    /// with `faults`, some tokens are replaced by near misses serde_json refuses.
    fn document(seed: u64, faults: bool) -> String {
        use super::super::tests::Rng;
        const WS: &[&str] = &["", "", " ", "\n  ", "\t", "\r\n"];
        const SCALARS: &[&str] = &[
            "0",
            "-0",
            "7",
            "-12",
            "3.25",
            "-0.5e-7",
            "1E+2",
            "6e0",
            "true",
            "false",
            "null",
            "\"\"",
            "\"plain text of some length\"",
            "\"\\u00e9\\ud800\\/\\b\\f\\n\\r\\t\\\\\\\"\"",
            "\"\u{e9}\u{1f600} and \\\" quotes\"",
        ];
        const NEAR_MISSES: &[&str] = &[
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "tru",
            "nul",
            "NaN",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}b\"",
            "\"a\nb\"",
            "\"open",
            "}",
            "]",
            ",",
            ":",
            "[",
            "{",
        ];
        fn value(r: &mut Rng, depth: usize, faults: bool, s: &mut String) {
            s.push_str(r.pick(WS));
            if faults && r.below(40) == 0 {
                s.push_str(r.pick(NEAR_MISSES));
            } else {
                match r.below(if depth > 4 { 3 } else { 5 }) {
                    0..=2 => s.push_str(r.pick(SCALARS)),
                    3 => {
                        s.push('[');
                        for i in 0..r.below(4) {
                            if i > 0 {
                                s.push(',');
                            }
                            value(r, depth + 1, faults, s);
                        }
                        s.push_str(r.pick(WS));
                        s.push(']');
                    }
                    _ => object(r, depth + 1, faults, s),
                }
            }
            s.push_str(r.pick(WS));
        }
        fn object(r: &mut Rng, depth: usize, faults: bool, s: &mut String) {
            s.push('{');
            for i in 0..r.below(5) {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(r.pick(WS));
                s.push_str(r.pick(&["\"name\"", "\"k\\\"q\"", "\"_meta\"", "\"\\u0061\""]));
                s.push_str(r.pick(WS));
                s.push(':');
                value(r, depth, faults, s);
            }
            s.push_str(r.pick(WS));
            s.push('}');
        }
        let mut r = Rng(seed | 1);
        let mut s = String::new();
        if r.below(4) == 0 {
            s.push('[');
            value(&mut r, 1, faults, &mut s);
            s.push(']');
        } else {
            object(&mut r, 0, faults, &mut s);
        }
        s.push_str(r.pick(&["", " tail", "}", ","]));
        s
    }

    #[test]
    fn generated_documents_are_mostly_valid_and_faulty_ones_mostly_not() {
        let valid = |faults| {
            (0..2000)
                .filter(|seed| leading_container(&document(*seed, faults)).is_some())
                .count()
        };
        assert_eq!(valid(false), 2000);
        let with_faults = valid(true);
        assert!((200..1800).contains(&with_faults), "{with_faults}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
        #[test]
        fn agrees_with_serde_on_random_pieces(
            picks in proptest::collection::vec(0..PIECES.len(), 0..40),
            open in 0..3usize,
        ) {
            // Containers, and scalars (for `whole_value`).
            let mut text = String::from(["{", "[", ""][open]);
            for p in picks {
                text.push_str(PIECES[p]);
            }
            check(&text);
        }

        #[test]
        fn agrees_with_serde_on_generated_documents(
            seed in proptest::prelude::any::<u64>(),
            faults in proptest::prelude::any::<bool>(),
        ) {
            check(&document(seed, faults));
        }

        #[test]
        fn agrees_with_serde_on_mutated_documents(
            seed in proptest::prelude::any::<u64>(),
            cut in 0usize..400,
            flip in 0usize..400,
            byte in proptest::prelude::any::<u8>(),
        ) {
            let doc = serde_json::json!({
                "name": format!("tool{seed}"),
                "arguments": {"q": "a \" } [ \\ \u{e9}", "n": [1, -2.5, 3e7, true, null]},
                "_meta": {"io.modelcontextprotocol/clientInfo": {"name": "c", "version": "1"}},
            });
            for text in [doc.to_string(), serde_json::to_string_pretty(&doc).expect("json")] {
                check(&text);
                let mut bytes = text.clone().into_bytes();
                let flip = flip % bytes.len();
                bytes[flip] = byte;
                if let Ok(mutated) = String::from_utf8(bytes) {
                    check(&mutated);
                }
                check(text.get(..cut.min(text.len())).unwrap_or_default());
            }
        }
    }
}
