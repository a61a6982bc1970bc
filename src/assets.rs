//! `mcptap generate-assets DIR`: the man pages and shell completions of the Debian package
//! (`scripts/package.sh`), generated from the real clap definition so they cannot drift from it.
//!
//! It is recognised before clap parses the command line rather than being a hidden subcommand:
//! clap_complete's completion scripts list hidden subcommands too, and a packaging step has no
//! business in an operator's tab completion or man page.

use clap::CommandFactory;
use clap_complete::Shell;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

const SUBCOMMAND: &str = "generate-assets";

/// Runs `generate-assets` when it is the first argument; `None` for every other command line.
pub fn run_if_requested() -> Option<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().and_then(|a| a.to_str()) != Some(SUBCOMMAND) {
        return None;
    }
    let [_, dir] = args.as_slice() else {
        eprintln!("usage: mcptap {SUBCOMMAND} DIR");
        return Some(ExitCode::from(2));
    };
    Some(match generate(super::Cli::command(), Path::new(dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcptap {SUBCOMMAND}: {}: {e}", Path::new(dir).display());
            ExitCode::from(2)
        }
    })
}

/// Writes `DIR/man/mcptap.1` and one `mcptap-SUBCOMMAND.1` per subcommand, and
/// `DIR/completions/{mcptap.bash,_mcptap,mcptap.fish}`.
fn generate(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    let mut cmd = cmd;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, "mcptap", &completions)?;
    }
    Ok(())
}
