#!/usr/bin/env bash
# Memory an attacker could make mcptap hold without charging it to the budget (an attacker's
# pass of 2026-12-07): each scenario's generator (scripts/attack/charges/g_*.py) writes a
# capture of connections that stay open after growing one buffer, which is replayed with a
# 64 MiB budget under /usr/bin/time; peak RSS must stay under the budget plus 64 MiB. Before
# the fixes (092a01f, 521eb63, 4991742) each took 168-508 MiB. Captures go to a temporary
# directory and are deleted; nothing is sent anywhere.
#
#   scripts/attack/charges.sh [--bin PATH] [--threads N] [SCENARIO...]
#   scenarios: reqhead pending chunk ooo sseid br gz inflight modes (default: all)
# Exit status 1 when a scenario goes over the limit. Needs python3, /usr/bin/time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GEN="$ROOT/scripts/attack/charges"
BIN="$ROOT/target/release/mcptap"
THREADS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --threads) THREADS=(--threads "$2"); shift 2 ;;
    *) break ;;
  esac
done
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --locked --bin mcptap)
BUDGET=$((64 << 20))
LIMIT_KIB=$(((64 + 64) * 1024))
# name: generator and its arguments (what each connection grows)
declare -A ARGS=(
  [reqhead]="g_reqhead.py 2400 60000"   # a request head with a 60 KB path waiting for its body
  [pending]="g_pending.py 12000 513 junk" # 513 pipelined requests, then a desync
  [chunk]="g_chunk.py 12000"            # a 4 KB chunk-size line across segments
  [ooo]="g_ooo.py 8 375000"             # one-byte segments behind a hole
  [sseid]="g_sseid.py 22 4194240"       # SSE blocks with a 4 MiB event type and id
  [br]="g_br.py 200 atk"                # brotli stream declaring 256 trees of each kind
  [gz]="g_gz.py 300 atk"                # stacked gzip members stalled in a long comment
  [inflight]="g_inflight.py 600 4096"   # a batch of 4096 requests in flight per session
  [modes]="g_modes.py 60 58000"         # 64 methods with 58 KB names per session
)
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(reqhead pending chunk ooo sseid br gz inflight modes)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failed=0
printf '%-9s %12s %14s  %s\n' scenario "capture MB" "peak RSS KiB" verdict
for name in "${SCENARIOS[@]}"; do
  [ -n "${ARGS[$name]:-}" ] || { echo "charges.sh: unknown scenario $name" >&2; exit 2; }
  read -r script rest <<< "${ARGS[$name]}"
  # shellcheck disable=SC2086
  python3 "$GEN/$script" "$WORK/$name.pcap" $rest > /dev/null
  size=$(( $(stat -c %s "$WORK/$name.pcap") >> 20 ))
  rss=$(/usr/bin/time -f '%M' "$BIN" replay "$WORK/$name.pcap" "${THREADS[@]}" \
        --memory-budget-bytes "$BUDGET" --log-level error --events /dev/null 2>&1 >/dev/null | tail -1)
  rm -f "$WORK/$name.pcap"
  verdict=PASS
  [ "$rss" -lt "$LIMIT_KIB" ] || { verdict="FAIL (limit $LIMIT_KIB)"; failed=1; }
  printf '%-9s %12s %14s  %s\n' "$name" "$size" "$rss" "$verdict"
done
exit "$failed"
