#!/usr/bin/env bash
# Replays each capture REPS times (one thread, events to /dev/null) and prints its size and
# the wall and user seconds of each run: scripts/attack/time/timeit.sh [-r REPS] [-b BIN] PCAP...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/mcptap"
REPS=2
while [ $# -gt 0 ]; do
  case "$1" in
    -r) REPS="$2"; shift 2 ;;
    -b) BIN="$2"; shift 2 ;;
    *) break ;;
  esac
done
for f in "$@"; do
  line="$(basename "$f") $(( $(stat -c %s "$f") / 1000 ))KB"
  for _ in $(seq "$REPS"); do
    t=$(/usr/bin/time -f '%e %U' "$BIN" replay "$f" --threads 1 --quiet --log-level error \
          --events /dev/null 2>&1 >/dev/null | tail -1)
    line="$line | $t"
  done
  echo "$line"
done
