//! The core is a library for others to embed: no capture, async, HTTP-server, metrics, CLI or
//! logging crate may enter its dependency tree (what `cargo tree -p mcptap-core -e normal`
//! shows), read here from its manifest and the lock file.

use std::collections::{BTreeSet, HashMap};

const FORBIDDEN: &[&str] = &[
    "pcap",
    "pcap-parser",
    "tokio",
    "hyper",
    "hyper-util",
    "prometheus",
    "clap",
    "nix",
    "tracing",
    "tracing-subscriber",
    "mimalloc",
    "libmimalloc-sys",
];

fn read(path: &str) -> toml::Table {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    text.parse().unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_core_depends_on_no_adapter_crate() {
    let manifest = read("crates/mcptap-core/Cargo.toml");
    let direct: Vec<String> = manifest["dependencies"]
        .as_table()
        .expect("[dependencies]")
        .keys()
        .cloned()
        .collect();
    let lock = read("Cargo.lock");
    // name -> dependency names (a lock entry names a dependency "name" or "name version").
    let mut deps: HashMap<String, Vec<String>> = HashMap::new();
    for pkg in lock["package"].as_array().expect("[[package]]") {
        let name = pkg["name"].as_str().expect("name").to_string();
        let of = deps.entry(name).or_default();
        for d in pkg
            .get("dependencies")
            .and_then(|d| d.as_array())
            .into_iter()
            .flatten()
        {
            let d = d.as_str().expect("dependency");
            of.push(d.split(' ').next().unwrap_or(d).to_string());
        }
    }
    let mut seen = BTreeSet::new();
    let mut todo = direct.clone();
    while let Some(name) = todo.pop() {
        if seen.insert(name.clone()) {
            todo.extend(deps.get(&name).cloned().unwrap_or_default());
        }
    }
    assert!(seen.contains("serde_json"), "walked {seen:?}");
    let found: Vec<&&str> = FORBIDDEN.iter().filter(|f| seen.contains(**f)).collect();
    assert!(found.is_empty(), "mcptap-core depends on {found:?}");
}
