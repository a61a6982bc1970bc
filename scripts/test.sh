#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit and pipeline tests, the
# operations checks (alert rules, dashboard, systemd unit), the Debian package (built, installed,
# purged on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
# Free disk first: a machine short of it fails late and obscurely (promtool, the linker).
df -h . "${TMPDIR:-/tmp}" | sed 's/^/test: /'
scripts/setup.sh --test
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzz harness lives in its own workspace: make sure it still builds against the crate.
cargo check --locked --manifest-path fuzz/Cargo.toml --all-targets
cargo test --workspace --locked
# The core is a library for others to embed: its docs build without warnings.
RUSTDOCFLAGS="-D warnings" cargo doc --locked -p mcptap-core --no-deps --quiet
scripts/e2e.sh
# Process-wide limits: the full-scale flood through the daemon's worker path (4 workers) stays
# within the memory budget + 64 MiB, evicts, and still alerts on the one faulty session.
scripts/flood.sh --worker-threads 4
scripts/attack/charges.sh
scripts/attack/charges.sh --threads 1
if [[ -x scripts/check-ops.sh ]]; then scripts/check-ops.sh; fi
scripts/check-package.sh
