#!/usr/bin/env bash
# Issue 11's exhaustion cases as a benchmark: peak RSS and wall time of `mcptap replay` on each
# hostile capture, against the RSS limit (memory budget + 64 MiB), optionally next to an older
# binary. The regression tests with their bounds are tests/exhaustion.rs; this script gives the
# figures (it is a benchmark, not a test: CI does not run it).
#
# Builds mcptap (release) unless --bin is given, generates the captures if missing or if the
# generator changed (benches/gen_capture.rs --adversarial all, benches/support/adversarial.rs;
# ~930 MB under target/bench-data, never committed), then replays each one
#   mcptap replay CAPTURE --memory-budget-bytes BUDGET --log-level error   (events to /dev/null)
# under /usr/bin/time -f '%M %e', and prints a table: case, capture size, peak RSS, wall time,
# PASS/FAIL against the RSS limit (and exit status 0), and with --baseline the same for the old
# binary side by side, then the new binary's summary counters per case.
#
# Every run, the new binary's too, is guarded: `timeout` (default 120 s) and an address-space cap
# (`ulimit -v`, default 8 GiB). A run stopped by either is reported ("killed at the 8 GiB cap",
# "timed out after 120 s") with the peak RSS it had reached, instead of being waited for.
#
#   scripts/exhaustion-bench.sh                              # new binary only, 64 MiB budget
#   scripts/exhaustion-bench.sh --baseline /path/to/old/mcptap
#   options: --bin PATH (new binary instead of building), --budget-mib N (default 64),
#            --cases a,b,... (default all), --timeout SECS (default 120), --vmem-gib N (default 8),
#            --seed N (default 1), --data DIR (default target/bench-data)
#
# Exit status 1 when a case of the new binary fails (over the limit, killed, timed out or a
# non-zero exit); the baseline's failures are what it is there to show and do not count.
# Needs: cargo, /usr/bin/time (Debian package `time`), timeout (coreutils), sha256sum.
set -euo pipefail
export LC_ALL=C

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BIN=""
BASELINE=""
BUDGET_MIB=64
CASES="all"
TIMEOUT=120
VMEM_GIB=8
SEED=1
DATA="$ROOT/target/bench-data"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift ;;
    --baseline) BASELINE="$2"; shift ;;
    --budget-mib) BUDGET_MIB="$2"; shift ;;
    --cases) CASES="$2"; shift ;;
    --timeout) TIMEOUT="$2"; shift ;;
    --vmem-gib) VMEM_GIB="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --data) DATA="$2"; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "exhaustion-bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "exhaustion-bench.sh: $*" >&2; exit 2; }
[ -x /usr/bin/time ] || die "/usr/bin/time not found (apt-get install time)"
command -v timeout >/dev/null || die "timeout not found (coreutils)"
[[ "$BUDGET_MIB" =~ ^[0-9]+$ ]] && [ "$BUDGET_MIB" -gt 0 ] || die "bad --budget-mib $BUDGET_MIB"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "bad --timeout $TIMEOUT"
[[ "$VMEM_GIB" =~ ^[0-9]+$ ]] || die "bad --vmem-gib $VMEM_GIB"
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || die "baseline $BASELINE is not an executable"

# Must match benches/support/adversarial.rs (CASES).
ALL_CASES=(huge-initialize unanswered-initializes pipelined-heads lineage-client-info
  batch-64k batch-90k open-requests-10k open-requests-40k)
if [ "$CASES" = all ]; then
  RUN_CASES=("${ALL_CASES[@]}")
else
  IFS=, read -r -a RUN_CASES <<< "$CASES"
  for c in "${RUN_CASES[@]}"; do
    [[ " ${ALL_CASES[*]} " == *" $c "* ]] || die "unknown case $c (${ALL_CASES[*]})"
  done
fi

BUDGET_BYTES=$((BUDGET_MIB << 20))
LIMIT_KIB=$(((BUDGET_MIB + 64) * 1024))
VMEM_KIB=$((VMEM_GIB << 20))

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mcptap-exbench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

if [ -z "$BIN" ]; then
  echo "== building (release) =="
  cargo build --release --quiet
  BIN="$ROOT/target/release/mcptap"
fi
[ -x "$BIN" ] || die "$BIN is not an executable"

# Regenerate when the generator changed since the captures were written.
mkdir -p "$DATA"
GEN_HASH="$(cat benches/gen_capture.rs benches/support/*.rs crates/mcptap-testkit/src/*.rs | sha256sum | cut -c1-16)"
STAMP="$DATA/adv-seed${SEED}.stamp"
missing=0
for c in "${ALL_CASES[@]}"; do
  [ -f "$DATA/adv-$c-seed$SEED.pcap" ] || missing=1
done
if [ "$missing" = 1 ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$GEN_HASH" ]; then
  echo "== generating the adversarial captures =="
  cargo bench --quiet --bench gen_capture -- --out "$DATA" --seed "$SEED" --adversarial all
  echo "$GEN_HASH" > "$STAMP"
fi

echo
echo "== machine =="
cpu="$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)"
mem="$(awk '/^MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "date:    $(date -u +%Y-%m-%dT%H:%MZ)"
echo "cpu:     ${cpu:-unknown} ($(nproc) cores online)"
echo "memory:  $mem"
echo "kernel:  $(uname -sr)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the runs)"
echo "mcptap:  $("$BIN" --version) ($BIN, sha256 $(sha256sum "$BIN" | cut -c1-16))"
[ -n "$BASELINE" ] && echo "base:    $("$BASELINE" --version) ($BASELINE, sha256 $(sha256sum "$BASELINE" | cut -c1-16))"
echo "budget:  $BUDGET_MIB MiB (--memory-budget-bytes $BUDGET_BYTES); RSS limit $((BUDGET_MIB + 64)) MiB"
echo "guard:   timeout ${TIMEOUT} s, ulimit -v ${VMEM_GIB} GiB per run"

# run BINARY CAPTURE TAG: replays under the guards; sets R_RSS (KiB), R_WALL (s), R_STATUS.
run() {
  local bin="$1" capture="$2" tag="$3" rc=0
  local tfile="$WORK/$tag.time" efile="$WORK/$tag.stderr"
  # /usr/bin/time outside timeout: it waits for timeout, which waits for mcptap, so %M is
  # mcptap's peak RSS even when it is killed. ulimit -v applies to the subshell's children.
  (
    ulimit -v "$VMEM_KIB"
    exec /usr/bin/time -o "$tfile" -f '%M %e' \
      timeout --kill-after=5 "$TIMEOUT" "$bin" replay "$capture" \
      --memory-budget-bytes "$BUDGET_BYTES" --log-level error
  ) > /dev/null 2> "$efile" || rc=$?
  read -r R_RSS R_WALL < <(grep -E '^[0-9]+ [0-9.]+$' "$tfile" | tail -n1 || echo "0 0")
  R_RSS="${R_RSS:-0}"
  R_WALL="${R_WALL:-0}"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    R_STATUS="TIMED OUT after ${TIMEOUT} s"
  elif grep -qi 'memory allocation of .* failed\|out of memory\|cannot allocate memory\|unable to allocate' "$efile"; then
    R_STATUS="KILLED at the ${VMEM_GIB} GiB cap"
  elif [ "$rc" != 0 ]; then
    R_STATUS="FAIL (exit $rc)"
  elif [ "$R_RSS" -lt "$LIMIT_KIB" ]; then
    R_STATUS="PASS"
  else
    R_STATUS="FAIL (over limit)"
  fi
}

mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }

FAILED=0
ROWS=()
NOTES=()
for c in "${RUN_CASES[@]}"; do
  capture="$DATA/adv-$c-seed$SEED.pcap"
  size="$(stat -c %s "$capture")"
  run "$BIN" "$capture" "new-$c"
  n_rss="$R_RSS" n_wall="$R_WALL" n_status="$R_STATUS"
  [ "$n_status" = PASS ] || FAILED=1
  summary="$(grep -E 'summary:|flows evicted|limits hit|http parse errors|elapsed:' "$WORK/new-$c.stderr" \
    | sed -e 's/^ *//' -e 's/^mcptap summary: //' | paste -sd ';' - | sed 's/;/; /g')"
  NOTES+=("$(printf '%-24s %s' "$c" "${summary:-(no summary)}")")
  row="$(printf '%-24s %9.1f MB | %11s %8ss  %-24s' "$c" "$(awk -v b="$size" 'BEGIN{print b/1e6}')" \
    "$(mib "$n_rss")" "$n_wall" "$n_status")"
  if [ -n "$BASELINE" ]; then
    run "$BASELINE" "$capture" "old-$c"
    row+="$(printf ' | %11s %8ss  %s' "$(mib "$R_RSS")" "$R_WALL" "$R_STATUS")"
  fi
  ROWS+=("$row")
  echo "  done: $c"
done

echo
echo "== exhaustion cases: budget $BUDGET_MIB MiB, RSS limit $((BUDGET_MIB + 64)) MiB =="
header="$(printf '%-24s %12s | %11s %9s  %-24s' case capture "peak RSS" wall "new")"
[ -n "$BASELINE" ] && header+="$(printf ' | %11s %9s  %s' "peak RSS" wall "baseline")"
echo "$header"
for r in "${ROWS[@]}"; do echo "$r"; done
echo
echo "== new binary: replay summary per case =="
for n in "${NOTES[@]}"; do echo "$n"; done
echo
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$FAILED"
