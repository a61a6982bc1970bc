#!/usr/bin/env bash
# CPU time an attacker could make mcptap spend beyond linear in its input (an attacker's pass
# of 2026-12-07): each scenario's generator (scripts/attack/time/g_*.py) writes captures of
# size N, 2N and 4N, each replayed on one thread (best user seconds of REPS runs). A scenario
# is SUPERLINEAR when 4N takes more than 6 times N's time and over half a second. Before the
# fixes (2d49b85, 1d32b38, 1facec6, d0af7fd) batch, ooo, badheads and parked were quadratic.
# Each capture is written and deleted in turn (the largest, badheads' 4N, is 66 MB).
# Captures go to a temporary directory and are deleted; nothing is sent anywhere.
#
#   scripts/attack/time.sh [--bin PATH] [--reps N] [SCENARIO...]
#   scenarios: batch ooo badheads parked slowhead pipeline sse json caps syn refeed refeedchain (default: all)
# Exit status 1 when a scenario is superlinear. Needs python3, /usr/bin/time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GEN="$ROOT/scripts/attack/time"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/mcptap"
REPS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    *) break ;;
  esac
done
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --locked --bin mcptap)
# name: generator and its arguments for N, 2N and 4N (separated by |)
declare -A ARGS=(
  [batch]="g_batch.py 20000 4|g_batch.py 40000 4|g_batch.py 80000 4"     # a batch answered in order
  [ooo]="g_ooo_split.py 2500 48|g_ooo_split.py 5000 48|g_ooo_split.py 10000 48" # one segment over K one-byte ones
  [badheads]="g_badheads.py 64000 16384000|g_badheads.py 128000 32768000|g_badheads.py 256000 65536000" # 256 segments of bad heads
  [parked]="g_parked.py 256 8000|g_parked.py 512 16000|g_parked.py 1024 32000" # parked batches, then unanswered POSTs
  [slowhead]="g_slowhead.py 16000 16|g_slowhead.py 32000 16|g_slowhead.py 64000 16" # heads one byte per segment
  [pipeline]="g_pipeline.py 40000 2|g_pipeline.py 80000 2|g_pipeline.py 160000 2"  # pipelined requests
  [sse]="g_sse.py 250000 16 16 data|g_sse.py 500000 16 16 data|g_sse.py 1000000 16 16 data" # long SSE lines in 16-byte chunks
  [json]="g_json.py 250000 32 wide|g_json.py 500000 32 wide|g_json.py 1000000 32 wide" # params of many members
  [caps]="g_caps.py 250000 4000000 wide|g_caps.py 500000 8000000 wide|g_caps.py 1000000 16000000 wide" # wide capabilities
  [syn]="g_syn.py 50000|g_syn.py 100000|g_syn.py 200000"                    # many connections (under max_flows)
  [refeed]="g_refeed.py 60000 16000000|g_refeed.py 60000 32000000|g_refeed.py 60000 64000000" # spanning heads broken late
  [refeedchain]="g_refeed_chain.py 60000 8000000|g_refeed_chain.py 60000 16000000|g_refeed_chain.py 60000 32000000" # start lines scanned again
)
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(batch ooo badheads parked slowhead pipeline sse json caps syn refeed refeedchain)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failed=0
best_user() {
  local best=""
  for _ in $(seq "$REPS"); do
    local t
    t=$(/usr/bin/time -f '%U' "$BIN" replay "$1" --threads 1 --quiet --log-level error \
          --events /dev/null 2>&1 >/dev/null | tail -1)
    if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; fi
  done
  echo "$best"
}
printf '%-9s %28s %22s %7s  %s\n' scenario "capture MB (N, 2N, 4N)" "user s (N, 2N, 4N)" "4N/N" verdict
for name in "${SCENARIOS[@]}"; do
  [ -n "${ARGS[$name]:-}" ] || { echo "time.sh: unknown scenario $name" >&2; exit 2; }
  IFS='|' read -r -a sizes <<< "${ARGS[$name]}"
  mbs=(); secs=()
  for i in 0 1 2; do
    read -r script rest <<< "${sizes[$i]}"
    # shellcheck disable=SC2086
    python3 "$GEN/$script" "$WORK/$name.pcap" $rest > /dev/null
    mbs+=("$(awk "BEGIN{printf \"%.1f\", $(stat -c %s "$WORK/$name.pcap") / 1e6}")")
    secs+=("$(best_user "$WORK/$name.pcap")")
    rm -f "$WORK/$name.pcap"
  done
  ratio=$(awk "BEGIN{printf \"%.1f\", ${secs[2]} / (${secs[0]} > 0.01 ? ${secs[0]} : 0.01)}")
  verdict=linear
  if awk "BEGIN{exit !($ratio > 6 && ${secs[2]} > 0.5)}"; then verdict=SUPERLINEAR; failed=1; fi
  printf '%-9s %28s %22s %7s  %s\n' "$name" "${mbs[*]}" "${secs[*]}" "$ratio" "$verdict"
done
exit "$failed"
