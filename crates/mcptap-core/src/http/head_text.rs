//! The header values a head keeps, copied into one buffer: one allocation per head rather than
//! one per value (a request keeps up to ten, and each allocation is a cache miss on a gateway's
//! many short exchanges).

/// Where one value lies in a [`HeadText`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    end: u32,
}

/// Values one after another; a [`Span`] names each.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeadText(String);

/// Room for a typical request's kept values (method, path, Host, Accept, Content-Type, the MCP
/// headers, User-Agent), so that the buffer is allocated once.
const TYPICAL_BYTES: usize = 256;

impl HeadText {
    pub(crate) fn for_head() -> Self {
        HeadText(String::with_capacity(TYPICAL_BYTES))
    }

    /// Appends `text` as it is.
    pub(crate) fn push_str(&mut self, text: &str) -> Span {
        let start = self.0.len();
        self.0.push_str(text);
        self.span(start)
    }

    /// Appends a header value as [`super::header_str`] reads it: trimmed as `str::trim` trims,
    /// invalid UTF-8 replaced. `head`: the head it is a slice of, as text if that is known.
    pub(crate) fn push_value(&mut self, value: &[u8], head: super::HeadStr<'_>) -> Span {
        let start = self.0.len();
        self.0.push_str(&super::value_text(value, head));
        self.span(start)
    }

    /// The span from `start` to the end. Heads are bounded far below 4 GiB; a longer text
    /// (unreachable) gives an empty span rather than a wrong one.
    fn span(&self, start: usize) -> Span {
        match (u32::try_from(start), u32::try_from(self.0.len())) {
            (Ok(start), Ok(end)) => Span { start, end },
            _ => Span::default(),
        }
    }

    pub(crate) fn get(&self, span: Span) -> &str {
        self.0
            .get(span.start as usize..span.end as usize)
            .unwrap_or_default()
    }

    /// Bytes held as allocated, for memory budgets.
    pub(crate) fn held_bytes(&self) -> usize {
        self.0.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::super::HeadStr;
    use super::*;

    #[test]
    fn values_are_kept_as_header_str_reads_them() {
        let mut text = HeadText::for_head();
        let values: [&[u8]; 5] = [b"  a b \t", b"", b"\xFF x ", b"\x0bv\x0b", "é ".as_bytes()];
        let spans: Vec<Span> = values
            .iter()
            .map(|v| text.push_value(v, HeadStr::default()))
            .collect();
        for (value, span) in values.iter().zip(spans) {
            assert_eq!(text.get(span), super::super::header_str(value));
        }
        // Read as slices of a head that is text: the same values.
        let head: Vec<u8> = values.concat();
        let within = HeadStr::of(&head);
        let mut at = 0;
        for value in values {
            let in_head = &head[at..at + value.len()];
            at += value.len();
            let span = text.push_value(in_head, within);
            assert_eq!(text.get(span), super::super::header_str(value));
        }
        // A slice cut inside a character, or not in the head at all, is validated on its own.
        let e_acute = "é".as_bytes();
        let cut = HeadStr::of("é".as_bytes());
        assert_eq!(cut.text_of(&e_acute[..1]), None);
        assert_eq!(within.text_of(b"elsewhere"), None);
        let s = text.push_str(" as is ");
        assert_eq!(text.get(s), " as is ");
        assert_eq!(text.get(Span::default()), "");
    }
}
