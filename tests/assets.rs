//! `mcptap generate-assets DIR`: the Debian package's man pages and shell completions come from
//! the clap definition, cover every subcommand, and the packaging entry point itself shows up
//! in none of them (nor in `--help`).

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcptap"))
}

/// The subcommands `mcptap --help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let out = bin().arg("--help").output().expect("run mcptap");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("utf-8");
    assert!(!help.contains("generate-assets"), "{help}");
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .map(str::to_string)
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn man_pages_and_completions_cover_every_subcommand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = bin()
        .arg("generate-assets")
        .arg(dir.path())
        .output()
        .expect("run mcptap");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let subs = subcommands();
    assert!(subs.len() >= 4, "{subs:?}");

    let main = read(&dir.path().join("man/mcptap.1"));
    assert!(main.contains(".TH mcptap 1"), "{main}");
    assert!(main.contains(env!("CARGO_PKG_VERSION")));
    // More than --help's options: examples, files, signals and exit statuses.
    for section in ["Examples:", "Files:", "Signals (run):", "Exit status:"] {
        assert!(main.contains(section), "mcptap.1 lacks {section}");
    }
    assert!(main.contains("/etc/mcptap/mcptap.toml") && main.contains("SIGHUP"));
    for s in &subs {
        // roff escapes every hyphen of the page name: mcptap\-check\-config(1).
        let roff_name = format!("mcptap-{s}(1)").replace('-', "\\-");
        assert!(main.contains(&roff_name), "mcptap.1 lacks {s}");
        let page = read(&dir.path().join(format!("man/mcptap-{s}.1")));
        assert!(page.contains(".SH OPTIONS"), "mcptap-{s}.1");
    }
    let run = read(&dir.path().join("man/mcptap-run.1"));
    assert!(run.contains("\\-\\-interface"), "{run}");

    for file in ["mcptap.bash", "_mcptap", "mcptap.fish"] {
        let text = read(&dir.path().join("completions").join(file));
        for s in &subs {
            assert!(text.contains(s.as_str()), "{file} lacks {s}");
        }
        assert!(!text.contains("generate-assets"), "{file}");
    }
    let pages = std::fs::read_dir(dir.path().join("man")).expect("man dir");
    for page in pages {
        let page = page.expect("entry").path();
        assert!(!read(&page).contains("generate"), "{}", page.display());
    }
}

#[test]
fn generate_assets_needs_exactly_one_directory() {
    for args in [&["generate-assets"][..], &["generate-assets", "a", "b"]] {
        let out = bin().args(args).output().expect("run mcptap");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("usage: mcptap generate-assets DIR"), "{err}");
    }
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let out = bin()
        .arg("generate-assets")
        .arg(file.path())
        .output()
        .expect("run mcptap");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}
