#!/usr/bin/env bash
# Builds mcptap and replays the included capture of the incident: a client replays
# `initialize` after a 502, the session narrows, tools/call drifts from SSE to JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
exec target/release/mcptap replay "${@:-tests/fixtures/incident.pcap}"
