//! Capability objects as sets of dotted paths, and their differences.
//!
//! `{"tools": {"listChanged": true, "streaming": false}, "logging": {}}` is the set
//! `{logging, tools, tools.listChanged}`: an object (even empty) is a capability, `true` is one,
//! `false` and `null` are not. Other scalars count as present, so a changed value elsewhere
//! still shows up as presence.

use serde_json::Value;
use std::collections::BTreeSet;

/// A capability set: sorted, distinct paths. A boxed slice of boxed strings, because every
/// tracked session keeps two of these: a few hundred bytes instead of a tree of nodes.
pub type CapPaths = Box<[Box<str>]>;

/// Depth beyond which nested capability objects are not expanded (bounded work on hostile input).
const MAX_DEPTH: usize = 8;
/// At most this many paths per capability object.
const MAX_PATHS: usize = 512;

pub fn paths(caps: &Value) -> CapPaths {
    let mut out = BTreeSet::new();
    if let Value::Object(map) = caps {
        for (k, v) in map {
            walk(k.clone(), v, 1, &mut out);
        }
    }
    out.into_iter().map(String::into_boxed_str).collect()
}

fn walk(path: String, v: &Value, depth: usize, out: &mut BTreeSet<String>) {
    if out.len() >= MAX_PATHS {
        return;
    }
    match v {
        Value::Bool(false) | Value::Null => {}
        Value::Object(map) => {
            if depth < MAX_DEPTH {
                for (k, child) in map {
                    walk(format!("{path}.{k}"), child, depth + 1, out);
                }
            }
            out.insert(path);
        }
        _ => {
            out.insert(path);
        }
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
        assert!(paths(&json!({ "deep": v })).len() <= MAX_DEPTH);
        let wide: serde_json::Map<String, Value> =
            (0..5000).map(|i| (format!("k{i}"), json!(true))).collect();
        assert_eq!(paths(&Value::Object(wide)).len(), MAX_PATHS);
    }
}
