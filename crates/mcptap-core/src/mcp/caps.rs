//! Capability objects as sets of dotted paths, and their differences.
//!
//! `{"tools": {"listChanged": true, "streaming": false}, "logging": {}}` is the set
//! `{logging, tools, tools.listChanged}`: an object (even empty) is a capability, `true` is one,
//! `false` and `null` are not. Other scalars count as present, so a changed value elsewhere
//! still shows up as presence.

use serde_json::Value;

/// A capability set: sorted, distinct paths. A boxed slice of boxed strings, because every
/// tracked session keeps two of these: a few hundred bytes instead of a tree of nodes.
/// Shared: a fleet's sessions hold the same few sets (see `session::HandshakeCache`).
pub type CapPaths = std::sync::Arc<[Box<str>]>;

/// Depth beyond which nested capability objects are not expanded (bounded work on hostile input).
const MAX_DEPTH: usize = 8;
/// At most this many paths per capability object.
pub(crate) const MAX_PATHS: usize = 512;
/// Keys longer than this are not capabilities anyone declares: they are skipped.
const MAX_KEY_BYTES: usize = 128;
/// At most this many bytes of paths per capability object (a path repeats its ancestors).
const MAX_PATH_BYTES: usize = 32 * 1024;
/// At most this many members are looked at per capability object (`false` ones too).
const MAX_VISITS: usize = 4 * MAX_PATHS;

/// The capability set of `caps`, within the bounds above.
pub fn paths(caps: &Value) -> CapPaths {
    bounded_paths(caps).0
}

/// The capability set of `caps` and whether a bound cut it short (a key too long, too many
/// paths or path bytes): one hostile `initialize` must not cost gigabytes of path strings.
pub fn bounded_paths(caps: &Value) -> (CapPaths, bool) {
    let mut walk = Walk::default();
    if let Value::Object(map) = caps {
        for (k, v) in map {
            walk.visit(k, v, 1);
        }
    }
    // Sorted once at the end: cheaper than a tree kept sorted, for a set of a few paths. Only
    // keys with dots in them can repeat a path (`{"a.b": 1, "a": {"b": 1}}`); such a path is
    // kept once, and the bounds count it each time.
    let mut out = walk.out;
    out.sort_unstable();
    out.dedup();
    (out.into(), walk.truncated)
}

#[derive(Default)]
struct Walk {
    out: Vec<Box<str>>,
    /// The path of the member being visited: one buffer for the whole walk, so a path costs
    /// one allocation, when it is kept.
    path: String,
    bytes: usize,
    visits: usize,
    truncated: bool,
}

impl Walk {
    fn visit(&mut self, key: &str, v: &Value, depth: usize) {
        self.visits += 1;
        let full = self.out.len() >= MAX_PATHS || self.bytes >= MAX_PATH_BYTES;
        if full || self.visits > MAX_VISITS || key.len() > MAX_KEY_BYTES {
            self.truncated = true;
            return;
        }
        let parent = self.path.len();
        if parent > 0 {
            self.path.push('.');
        }
        self.path.push_str(key);
        match v {
            Value::Bool(false) | Value::Null => {}
            Value::Object(map) => {
                if depth < MAX_DEPTH {
                    for (k, child) in map {
                        self.visit(k, child, depth + 1);
                    }
                } else if !map.is_empty() {
                    self.truncated = true;
                }
                self.insert();
            }
            _ => self.insert(),
        }
        self.path.truncate(parent);
    }

    fn insert(&mut self) {
        if self.out.len() >= MAX_PATHS || self.bytes + self.path.len() > MAX_PATH_BYTES {
            self.truncated = true;
            return;
        }
        self.bytes += self.path.len();
        self.out.push(self.path.as_str().into());
    }
}

/// The top-level capability a path belongs to, bounded to known names for metric labels.
pub fn scope(path: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "tools",
        "resources",
        "prompts",
        "logging",
        "completions",
        "sampling",
        "roots",
        "elicitation",
        "experimental",
    ];
    let top = path.split('.').next().unwrap_or("");
    KNOWN
        .iter()
        .find(|k| **k == top)
        .copied()
        .unwrap_or("other")
}

/// `tools.streaming: true` in a capability object.
pub fn streaming_enabled(caps: &Value) -> bool {
    caps.pointer("/tools/streaming") == Some(&Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PathDiff;
    use serde_json::json;
    use std::collections::BTreeSet;

    #[test]
    fn a_path_repeated_through_a_dotted_key_is_kept_once_in_order() {
        let caps = json!({"a.b": true, "a": {"b": true, "c": {}}, "A": 1});
        assert_eq!(paths(&caps), set(&["A", "a", "a.b", "a.c"]));
    }

    fn set(items: &[&str]) -> CapPaths {
        let sorted: BTreeSet<&str> = items.iter().copied().collect();
        sorted.into_iter().map(Box::from).collect()
    }

    #[test]
    fn objects_and_true_are_capabilities_false_is_not() {
        let caps =
            json!({"tools": {"listChanged": true, "streaming": false}, "logging": {}, "x": null});
        assert_eq!(
            paths(&caps),
            set(&["logging", "tools", "tools.listChanged"])
        );
        assert_eq!(paths(&json!(null)), set(&[]));
    }

    #[test]
    fn narrowing_streaming_true_to_false_or_absent() {
        let before = paths(&json!({"tools": {"streaming": true, "listChanged": true}}));
        for after in [
            json!({"tools": {"streaming": false, "listChanged": true}}),
            json!({"tools": {"listChanged": true}}),
        ] {
            let d = PathDiff::between(&before, &paths(&after));
            assert_eq!(d.removed, vec!["tools.streaming".to_string()]);
            assert!(d.added.is_empty());
        }
    }

    #[test]
    fn whole_object_removed_lists_every_path() {
        let before = paths(&json!({"resources": {"subscribe": true}, "tools": {}}));
        let d = PathDiff::between(&before, &paths(&json!({"tools": {}})));
        assert_eq!(d.removed, vec!["resources", "resources.subscribe"]);
        let d = PathDiff::between(&paths(&json!({"tools": {}})), &before);
        assert_eq!(d.added, vec!["resources", "resources.subscribe"]);
    }

    #[test]
    fn scopes_are_bounded() {
        assert_eq!(scope("tools.streaming"), "tools");
        assert_eq!(scope("vendorThing.x"), "other");
    }

    #[test]
    fn deep_or_wide_input_is_bounded() {
        let mut v = json!(true);
        for _ in 0..100 {
            v = json!({ "a": v });
        }
        let (deep, cut) = bounded_paths(&json!({ "deep": v }));
        assert!(deep.len() <= MAX_DEPTH && cut);
        let wide: serde_json::Map<String, Value> =
            (0..5000).map(|i| (format!("k{i}"), json!(true))).collect();
        let (wide, cut) = bounded_paths(&Value::Object(wide));
        assert!(wide.len() == MAX_PATHS && cut);
        // Long keys under long keys: bounded in bytes, not just in count.
        let long = "k".repeat(MAX_KEY_BYTES);
        let mut v = json!(true);
        for i in 0..7 {
            let children: serde_json::Map<String, Value> = (0..4)
                .map(|j| (format!("{long}{i}{j}")[2..].to_string(), v.clone()))
                .collect();
            v = Value::Object(children);
        }
        let (paths, cut) = bounded_paths(&json!({ "x": v }));
        let bytes: usize = paths.iter().map(|p| p.len()).sum();
        assert!(cut && bytes <= MAX_PATH_BYTES, "{bytes}");
        let (too_long, cut) = bounded_paths(&json!({ "k".repeat(MAX_KEY_BYTES + 1): {} }));
        assert!(too_long.is_empty() && cut);
        assert!(!bounded_paths(&json!({"tools": {"listChanged": true}})).1);
    }
}
