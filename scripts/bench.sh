#!/usr/bin/env bash
# End-to-end throughput of `mcptap replay` against tshark on the same reference captures.
#
# Builds mcptap (release), generates the two reference captures if missing (deterministic:
# same seed and sizes -> same bytes; their sha256 is printed), then for each capture:
#   * mcptap replay FILE (events to /dev/null), RUNS times on one thread (--threads 1); the
#     median wall time is reported, the peak RSS is the largest of the runs. In the same rounds
#     with --threads 2 and at the default (no --threads: one thread per core). One more
#     untimed run writes the events for the facts check.
#   * tshark once, extracting at HTTP level the same facts (for every tools/call response:
#     the request's Mcp-Session-Id and the response's media type).
# and prints the machine, a table (wall time, MB/s, packets/s, peak RSS, ratios) and where
# mcptap stands against the project's targets. This script is the single source of the figures.
#
#   scripts/bench.sh                 # full size: mixed 1024 MB + all-MCP 256 MB + gateway-shaped
#                                    # 110,000 conversations (5.4 M packets; tshark: minutes)
#   scripts/bench.sh --quick         # mixed 100 MB + all-MCP 25 MB + gateway 11,000
#   scripts/bench.sh --no-tshark     # mcptap only
#   scripts/bench.sh --generate-only # build and make sure the captures exist, print their paths
#   scripts/bench.sh --flood         # only the full-scale flood check (scripts/flood.sh): 1M SYN
#                                    # flows + 100k session ids, default limits, asserts peak RSS,
#                                    # evictions and the faulty session's alerts (~3 min)
#   options: --seed N (default 1), --data DIR (default target/bench-data), --runs N (default 5),
#            --keep-cache (time the captures in the page cache as found; see "page cache" below),
#            --mixed-mb N / --mcp-mb N (capture sizes; a small pair makes a smoke run),
#            --gateway-sessions N (conversations of the gateway-shaped capture; 0 skips it)
#
# Every capture is also read by `tcpdump -r FILE -w /dev/null` (the cost of reading the file,
# the reference of the gateway target: mcptap within 2x). The gateway capture is replayed with
# its events to a file at the default log level (the product's contract: handshakes at INFO),
# plus once with --log-level warn and once with --log-format json, to price the logging; its
# incidents must raise exactly the alerts the generator wrote next to it (FILE.alerts). It is
# also replayed by two one-thread processes at once, against one alone in the same rounds: what
# this machine gives a second thread at all, the ceiling of the two-thread target here.
#
# A/B against another binary (the acceptance check of a change: old and new on the same
# captures in the same run, so both meet the same machine load):
#   scripts/bench.sh --no-tshark --baseline /tmp/mcptap-old   # e.g. built from the old commit
#   --baseline PATH  the old binary; each capture is replayed RUNS times by each binary,
#                    alternating (new/old, then old/new, ...), and both medians are reported with
#                    the ratio new/old; both binaries' events are compared byte for byte.
#   --bin PATH       the new binary instead of building target/release/mcptap.
#   --callgrind      also count each binary's instructions once per capture with valgrind's
#                    callgrind (load-independent: the figure to use when the machine's noise
#                    exceeds the difference looked for), with the ratio new/old; and the log
#                    cost on the gateway capture in instructions too.
#
# Two in-process benches run first, in every mode (--quick: fewer passes, smaller traffic):
#   * benches/allocations.rs: allocation calls of the core pipeline per packet on the skip path
#     (not TCP, fragments, TLS and undecodable flows, an SSE stream's keep-alives and ACKs; must
#     be 0 once warm) and per exchange (legacy and modern tools/call, initialize; bounded). It
#     fails, and so does this script, when either is exceeded.
#   * benches/capture_thread.rs: the live capture thread's ns per packet without libpcap
#     (dispatch, batch copy, worker queues; goal <= 150 ns of its own CPU time, its wall time
#     beside), median of several passes; never failed on time. With --callgrind, its instructions per packet (callgrind, `full_pass`).
#   scripts/bench.sh --micro-only [--quick] [--callgrind]   # only these two
#
# Needs: cargo, tshark, /usr/bin/time (Debian package `time`), python3, sha256sum; valgrind for
# --callgrind.
# The captures are never committed: they live under target/ (ignored by git).
set -euo pipefail
# $EPOCHREALTIME and awk must agree on the decimal point.
export LC_ALL=C

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
GENERATE_ONLY=0
MICRO_ONLY=0
TSHARK=1
FLOOD=0
KEEP_CACHE=0
SEED=1
RUNS=5
DATA="$ROOT/target/bench-data"
MIXED_MB=""
MCP_MB=""
GATEWAY_SESSIONS=""
BASELINE=""
BIN=""
CALLGRIND=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-tshark) TSHARK=0 ;;
    --generate-only) GENERATE_ONLY=1 ;;
    --micro-only) MICRO_ONLY=1 ;;
    --flood) FLOOD=1 ;;
    --keep-cache) KEEP_CACHE=1 ;;
    --seed) SEED="$2"; shift ;;
    --runs) RUNS="$2"; shift ;;
    --data) DATA="$2"; shift ;;
    --mixed-mb) MIXED_MB="$2"; shift ;;
    --mcp-mb) MCP_MB="$2"; shift ;;
    --gateway-sessions) GATEWAY_SESSIONS="$2"; shift ;;
    --baseline) BASELINE="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --callgrind) CALLGRIND=1 ;;
    -h|--help) sed -n '2,56p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$FLOOD" = 1 ]; then exec "$ROOT/scripts/flood.sh" --seed "$SEED" --data "$DATA"; fi
if [ "$QUICK" = 1 ]; then : "${MIXED_MB:=100}" "${MCP_MB:=25}" "${GATEWAY_SESSIONS:=11000}"; else : "${MIXED_MB:=1024}" "${MCP_MB:=256}" "${GATEWAY_SESSIONS:=110000}"; fi
MODE="$([ "$QUICK" = 1 ] && echo quick || echo full)"
case "$MIXED_MB/$MCP_MB" in
  1024/256|100/25) ;;
  *) MODE="custom: mixed $MIXED_MB MB, all-MCP $MCP_MB MB" ;;
esac

die() { echo "bench.sh: $*" >&2; exit 1; }
# The build needs libpcap-dev; setup.sh installs what is missing (a fresh machine has none).
"$ROOT/scripts/setup.sh"
[ "$MICRO_ONLY" = 1 ] && TSHARK=0
[ -x /usr/bin/time ] || die "/usr/bin/time not found (apt-get install time)"
command -v tcpdump >/dev/null || die "tcpdump not found (apt-get install tcpdump)"
command -v python3 >/dev/null || die "python3 not found"
if [ "$TSHARK" = 1 ]; then
  command -v tshark >/dev/null || die "tshark not found (apt-get install tshark), or pass --no-tshark"
fi
if [ "$CALLGRIND" = 1 ]; then
  command -v valgrind >/dev/null || die "valgrind not found (apt-get install valgrind)"
fi
BASE_ONE=()
if [ -n "$BASELINE" ]; then
  [ -x "$BASELINE" ] || die "--baseline $BASELINE: not an executable"
  BASELINE="$(cd "$(dirname "$BASELINE")" && pwd)/$(basename "$BASELINE")"
  # A baseline with threads is timed on one, as the new binary is.
  if "$BASELINE" replay --help 2>/dev/null | grep -q -- '--threads'; then BASE_ONE=(--threads 1); fi
fi

mkdir -p "$DATA"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mcptap-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# ------------------------------------------------------------------ in-process benches
# micro_benches: the allocation check (dies when it fails) and the capture thread's cost per
# packet; sets R[alloc] and R[capture] (their verdict lines) for the targets.
micro_benches() {
  echo
  echo "== core allocations (cargo bench --bench allocations) =="
  cargo bench --quiet --bench allocations 2>&1 | tee "$WORK/allocations.out" \
    || die "the allocation check failed (above)"
  R[alloc]="$(grep '^allocations:' "$WORK/allocations.out" | tr '\n' ' ')"
  echo
  echo "== live capture thread (cargo bench --bench capture_thread) =="
  local quick=(); [ "$QUICK" = 1 ] && quick=(--quick)
  cargo bench --quiet --bench capture_thread -- "${quick[@]}" 2>&1 | tee "$WORK/capture.out" \
    || die "the capture thread bench failed (above)"
  R[capture]="$(grep '^capture thread:' "$WORK/capture.out")"
  if [ "$CALLGRIND" = 1 ]; then
    local exe ir packets
    exe="$(cargo bench --bench capture_thread --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)"
    [ -x "$exe" ] || die "cannot find the capture_thread bench executable"
    # Only `full_pass` is counted: the frames are generated and the directory warmed outside it.
    valgrind --tool=callgrind --callgrind-out-file="$WORK/capture.callgrind" --collect-atstart=no \
      --toggle-collect='*full_pass*' "$exe" --callgrind-pass "${quick[@]}" \
      > "$WORK/capture-callgrind.out" 2> "$WORK/capture-callgrind.log" \
      || die "callgrind failed on the capture thread bench (see $WORK/capture-callgrind.log)"
    ir="$(grep -E '^(summary|totals):' "$WORK/capture.callgrind" | tail -1 | awk '{print $2}')"
    packets="$(sed -n 's/^packets: //p' "$WORK/capture-callgrind.out")"
    R[capture.ir]="$(awk -v i="$ir" -v p="$packets" 'BEGIN{printf "%.0f", i/p}')"
    echo "capture thread, callgrind: $ir instructions in full_pass for $packets packets (2 workers): ${R[capture.ir]} per packet"
  fi
}

declare -A R
if [ "$MICRO_ONLY" = 1 ]; then
  echo "== machine =="
  echo "date:    $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu:     $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo) ($(nproc) cores online)"
  echo "kernel:  $(uname -sr)"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the runs)"
  echo "rustc:   $(rustc --version)"
  micro_benches
  echo
  echo "targets:"
  echo "  ${R[alloc]}"
  echo "  ${R[capture]}"
  [ -n "${R[capture.ir]:-}" ] && echo "  capture thread: ${R[capture.ir]} instructions per packet (callgrind)"
  exit 0
fi

# ------------------------------------------------------------------ build + captures
if [ -n "$BIN" ]; then
  [ -x "$BIN" ] || die "--bin $BIN: not an executable"
  BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
else
  echo "== building (release) =="
  cargo build --release --quiet
  BIN="$ROOT/target/release/mcptap"
fi

# Regenerate when the generator changed since the captures were written.
GEN_HASH="$(cat benches/gen_capture.rs benches/support/*.rs crates/mcptap-testkit/src/*.rs | sha256sum | cut -c1-16)"
MIXED="$DATA/mixed-${MIXED_MB}MB-seed${SEED}.pcap"
MCP="$DATA/mcp-${MCP_MB}MB-seed${SEED}.pcap"
STAMP="$DATA/gen-${MIXED_MB}-${MCP_MB}-seed${SEED}.stamp"
if [ ! -f "$MIXED" ] || [ ! -f "$MCP" ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$GEN_HASH" ]; then
  echo "== generating captures (seed $SEED) =="
  rm -f "$MIXED" "$MCP"
  cargo bench --quiet --bench gen_capture -- --out "$DATA" --seed "$SEED" \
    --mixed-mb "$MIXED_MB" --mcp-mb "$MCP_MB"
  echo "$GEN_HASH" > "$STAMP"
fi
GATEWAY=""
NAMES=(mixed mcp)
if [ "$GATEWAY_SESSIONS" != 0 ]; then
  GATEWAY="$DATA/gateway-${GATEWAY_SESSIONS}s-seed${SEED}.pcap"
  GSTAMP="$DATA/gateway-${GATEWAY_SESSIONS}s-seed${SEED}.stamp"
  if [ ! -f "$GATEWAY" ] || [ ! -f "${GATEWAY%.pcap}.alerts" ] || [ "$(cat "$GSTAMP" 2>/dev/null || true)" != "$GEN_HASH" ]; then
    echo "== generating the gateway-shaped capture (seed $SEED) =="
    rm -f "$GATEWAY"
    cargo bench --quiet --bench gen_capture -- --out "$DATA" --seed "$SEED" --gateway "$GATEWAY_SESSIONS"
    echo "$GEN_HASH" > "$GSTAMP"
  fi
  NAMES+=(gateway)
fi
if [ "$GENERATE_ONLY" = 1 ]; then
  echo "$MIXED"
  echo "$MCP"
  [ -n "$GATEWAY" ] && echo "$GATEWAY"
  exit 0
fi

# ------------------------------------------------------------------ machine
echo
echo "== machine =="
cpu="$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)"
mem="$(awk '/^MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "date:    $(date -u +%Y-%m-%dT%H:%MZ)"
echo "cpu:     ${cpu:-unknown} ($(nproc) cores online)"
echo "memory:  $mem"
echo "kernel:  $(uname -sr)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the runs)"
echo "rustc:   $(rustc --version)"
echo "mcptap:  $("$BIN" --version) ($BIN, sha256 $(sha256sum "$BIN" | cut -c1-16))"
[ -n "$BASELINE" ] && echo "base:    $("$BASELINE" --version) ($BASELINE, sha256 $(sha256sum "$BASELINE" | cut -c1-16))"
[ "$TSHARK" = 1 ] && echo "tshark:  $(tshark --version 2>/dev/null | head -1)"
echo "mode:    $MODE, seed $SEED, mcptap runs per capture: $RUNS (median wall)$([ -n "$BASELINE" ] && echo ", alternating with the baseline")"
echo
echo "== captures =="
for f in "$MIXED" "$MCP" $GATEWAY; do
  echo "$(sha256sum "$f" | cut -d' ' -f1)  $(basename "$f")  $(stat -c %s "$f") bytes"
done

micro_benches

# ------------------------------------------------------------------ page cache
# Replay is timed with the capture in the page cache, but in which state depends on history:
# read from disk (readahead caches a file in huge folios on recent kernels, mapped by mcptap a
# huge page per fault) or left by the generator's writes and later memory pressure (often 4 KiB
# pages: ~4x the page faults, 0.1-0.25 s more per GB). So just before its timed runs, each
# capture is evicted and read back once, as a capture copied from a sensor is, and every run
# starts from that same state. --keep-cache skips this and measures the cache as found.
recache() { # FILE
  [ "$KEEP_CACHE" = 1 ] && return 0
  sync "$1"
  python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)' "$1"
  local t0 t1
  t0="$EPOCHREALTIME"; cat "$1" > /dev/null; t1="$EPOCHREALTIME"
  awk -v a="$t0" -v b="$t1" -v s="$(stat -c %s "$1")" \
    'BEGIN{d = b - a; if (d <= 0) d = 1e-6; printf "page cache: evicted and read back in %.2f s (%.0f MB/s from disk); ", d, s/1e6/d}'
  awk '/^FileHugePages/{printf "%.0f MiB of the page cache in huge pages\n", $2/1024}' /proc/meminfo
}

# ------------------------------------------------------------------ measurements
# run_timed OUT_PREFIX CMD...: runs CMD under /usr/bin/time -v; stdout to OUT_PREFIX.out,
# stderr to OUT_PREFIX.err; prints "wall_seconds peak_rss_kib cpu_seconds" (user + system).
# CPU time the hypervisor gave other guests (all CPUs, /proc/stat's steal column), in ticks:
# on a VM it stretches wall times whatever the binary does, so the timed runs report it.
CLK_TCK="$(getconf CLK_TCK)"
steal_ticks() { awk '/^cpu /{print $9; exit}' /proc/stat; }
steal_of() { cat "$1.steal" 2>/dev/null || echo "?"; }

run_timed() {
  local prefix="$1"; shift
  local t0 t1 s0 s1
  s0="$(steal_ticks)"
  t0="$EPOCHREALTIME"
  /usr/bin/time -v -o "$prefix.time" "$@" > "$prefix.out" 2> "$prefix.err" \
    || { echo "bench.sh: failed: $* (see $prefix.err)" >&2; tail -5 "$prefix.err" >&2; exit 1; }
  t1="$EPOCHREALTIME"
  s1="$(steal_ticks)"
  awk -v a="$s0" -v b="$s1" -v hz="$CLK_TCK" 'BEGIN{printf "%.2f\n", (b-a)/hz}' > "$prefix.steal"
  local rss cpu
  rss="$(awk -F': ' '/Maximum resident set size/{print $2}' "$prefix.time")"
  cpu="$(awk -F': ' '/User time|System time/{s += $2} END{printf "%.3f", s}' "$prefix.time")"
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}') $rss $cpu"
}

# compare_layout NAME FILE LABEL: FILE (the events of another thread layout) against the
# one-thread events of capture NAME. Identical, or identical but for the summary's counts of
# limits hit, or different where a limit was hit (each run's limits_hit is printed); events
# that differ where neither run hit a limit stop the script.
compare_layout() {
  local one="$WORK/events-$1.ndjson" other="$2" label="$3"
  if cmp -s "$one" "$other"; then
    echo "events, $label vs 1: identical"
    return
  fi
  local hit_one hit_other
  hit_one="$(grep '"event":"summary"' "$one" | grep -o '"limits_hit":{[^}]*}' || true)"
  hit_other="$(grep '"event":"summary"' "$other" | grep -o '"limits_hit":{[^}]*}' || true)"
  if cmp -s <(grep -v '"event":"summary"' "$one") <(grep -v '"event":"summary"' "$other"); then
    echo "events, $label vs 1: identical but for the summary: 1 thread $hit_one, $label $hit_other"
  elif [ "$hit_one" != '"limits_hit":{}' ] || [ "$hit_other" != '"limits_hit":{}' ]; then
    echo "events, $label vs 1: differ from line $(cmp "$one" "$other" | awk '{print $NF}') of $(wc -l < "$one"); a limit was hit: 1 thread $hit_one, $label $hit_other"
  else
    die "$1: $label gave other events than one thread, and no limit was hit"
  fi
}

# log_instructions NAME ARGS...: user-space instructions of `mcptap ARGS` under callgrind,
# its standard error (the log) to a file as in the timed runs.
log_instructions() {
  local name="$1"; shift
  valgrind --tool=callgrind --callgrind-out-file="$WORK/log-$name.callgrind" "$BIN" "$@" \
    > /dev/null 2> "$WORK/log-$name.err" || die "callgrind failed on $BIN $* (see $WORK/log-$name.err)"
  grep -E '^(summary|totals):' "$WORK/log-$name.callgrind" | tail -1 | awk '{print $2}'
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

# instructions OUT BIN FILE: user-space instructions of one replay under callgrind (exact and
# repeatable, ~50x slower than a plain run).
instructions() {
  local one=("${BASE_ONE[@]}"); [ "$2" = "$BIN" ] && one=(--threads 1)
  valgrind --tool=callgrind --callgrind-out-file="$1" "$2" replay "$3" --events /dev/null \
    --log-level error "${one[@]}" > /dev/null 2> "$1.log" || die "callgrind failed on $2 (see $1.log)"
  grep -E '^(summary|totals):' "$1" | tail -1 | awk '{print $2}'
}

TSHARK_ARGS=(
  -n
  -o 'uat:custom_http_header_fields:"mcp-session-id","MCP session id"'
  -Y 'tcp.port == 8080 && http'
  -T fields -E separator='|'
  -e frame.number -e http.request.method -e http.request_in -e http.response.code
  -e http.content_type -e http.header.mcp-session-id -e json.member_with_value
)

file_of() { case "$1" in mixed) echo "$MIXED" ;; mcp) echo "$MCP" ;; gateway) echo "$GATEWAY" ;; esac; }
for name in "${NAMES[@]}"; do
  file="$(file_of "$name")"
  size="$(stat -c %s "$file")"
  # The gateway target is with events written to a file; the bulk ones to /dev/null.
  events_to=/dev/null; [ "$name" = gateway ] && events_to="$WORK/timed-events.ndjson"
  echo
  echo "== $name: $(basename "$file") =="
  recache "$file"
  tds=""
  for i in $(seq 1 "$RUNS"); do
    read -r wall _ _ < <(run_timed "$WORK/tcpdump-$name-$i" tcpdump -r "$file" -w /dev/null)
    tds+="$wall "
  done
  # shellcheck disable=SC2086
  R[$name.tcpdump.wall]="$(median $tds)"
  echo "tcpdump -r FILE -w /dev/null: median ${R[$name.tcpdump.wall]} s of $RUNS runs ($tds)"
  # Tools timed on this capture: the new binary, and the baseline when given, alternating so
  # that both meet the same load (new/old in odd rounds, old/new in even ones).
  tools=(mcptap); [ -n "$BASELINE" ] && tools+=(base)
  declare -A walls=() cpus=() rss_max=()
  for t in "${tools[@]}"; do walls[$t]=""; cpus[$t]=""; rss_max[$t]=0; done
  # The flow and session layers on two threads (--threads 2) are timed in the same rounds,
  # before the one-thread runs in even rounds and after them in odd ones: a load that comes
  # and goes meets both alike, so their ratio holds on a shared machine.
  splits=""; split_cpus=""; split_steals=""; one_steals=""
  defaults=""
  split_one() {
    read -r wall _ cpu < <(run_timed "$WORK/split-$name-$i" "$BIN" replay "$file" --events "$events_to" --threads 2)
    printf 'split  run %d: %s s wall, %s s CPU (--threads 2), steal %s s\n' "$i" "$wall" "$cpu" "$(steal_of "$WORK/split-$name-$i")"
    splits+="$wall "; split_cpus+="$cpu "; split_steals+="$(steal_of "$WORK/split-$name-$i") "
  }
  # As an operator runs it: no --threads, one thread per core (the same as --threads 2 on
  # a 2-core machine, timed all the same so that the figure says what it measured).
  default_one() {
    read -r wall _ _ < <(run_timed "$WORK/default-$name-$i" "$BIN" replay "$file" --events "$events_to")
    printf 'default run %d: %s s wall (no --threads: %s threads)\n' "$i" "$wall" "$(nproc)"
    defaults+="$wall "
  }
  # The two in turned-round order in even rounds: the second of two runs writing the same
  # events file may meet the first one's write-back.
  split_run() {
    if [ $((i % 2)) = 1 ]; then split_one; default_one; else default_one; split_one; fi
  }
  for i in $(seq 1 "$RUNS"); do
    order=("${tools[@]}")
    [ $((i % 2)) = 0 ] && [ "${#tools[@]}" = 2 ] && order=(base mcptap)
    if [ $((i % 2)) = 0 ]; then split_run; fi
    for t in "${order[@]}"; do
      # One worker: the new binary's default is a thread per core (a baseline that does not
      # know the flag runs on one thread anyway).
      bin="$BIN"; one=(--threads 1); [ "$t" = base ] && bin="$BASELINE" && one=("${BASE_ONE[@]}")
      read -r wall rss cpu < <(run_timed "$WORK/$t-$name-$i" "$bin" replay "$file" --events "$events_to" "${one[@]}")
      printf '%-6s run %d: %s s wall, %s s CPU, peak RSS %s KiB, steal %s s\n' "$t" "$i" "$wall" "$cpu" "$rss" "$(steal_of "$WORK/$t-$name-$i")"
      walls[$t]+="$wall "; cpus[$t]+="$cpu "; [ "$rss" -gt "${rss_max[$t]}" ] && rss_max[$t]="$rss"
      [ "$t" = mcptap ] && one_steals+="$(steal_of "$WORK/$t-$name-$i") "
    done
    if [ $((i % 2)) = 1 ]; then split_run; fi
  done
  # shellcheck disable=SC2086
  R[$name.split.wall]="$(median $splits)"
  # shellcheck disable=SC2086
  R[$name.split.cpu]="$(median $split_cpus)"
  # The same speed-up round by round (each round's one-thread and two-thread runs are
  # minutes apart at most): less moved by a machine whose speed drifts over the whole run.
  # shellcheck disable=SC2086
  R[$name.split.rounds]="$(median $(paste -d' ' <(tr ' ' '\n' <<< "${walls[mcptap]}" | grep .) <(tr ' ' '\n' <<< "$splits" | grep .) | awk '{print $1/$2}'))"
  # shellcheck disable=SC2086
  R[$name.default.wall]="$(median $defaults)"
  # shellcheck disable=SC2086
  echo "hypervisor steal during the timed runs (all CPUs): one thread median $(median $one_steals) s, --threads 2 median $(median $split_steals) s"

  summary="$(grep -E 'mcptap summary|alerts:|gaps:' "$WORK/mcptap-$name-1.err" | sed 's/^ */  /')"
  echo "$summary"
  packets="$(sed -n 's/.*mcptap summary: \([0-9]*\) packets.*/\1/p' "$WORK/mcptap-$name-1.err")"
  for t in "${tools[@]}"; do
    # shellcheck disable=SC2086 # the runs are one space-separated word list
    R[$name.$t.wall]="$(median ${walls[$t]})"
    # shellcheck disable=SC2086
    R[$name.$t.cpu]="$(median ${cpus[$t]})"
    R[$name.$t.rss]="${rss_max[$t]}"
  done
  R[$name.size]="$size"; R[$name.packets]="$packets"
  if [ "$name" = gateway ]; then
    # Its incidents raise exactly what the generator says; nothing else alerts.
    want="$(tr ' ' '\n' < "${GATEWAY%.pcap}.alerts" | sort | tr '\n' ' ')"
    got="$(sed -n 's/^ *alerts: //p' "$WORK/mcptap-$name-1.err" | tr ' ' '\n' | sort | tr '\n' ' ')"
    [ "$want" = "$got" ] || die "gateway capture: alerts '$got', expected '$want'"
    echo "incidents: the alerts expected ($want)"
    # What logging costs: the same replay without handshake lines, and with JSON lines,
    # against default runs timed in the same rounds (a load that comes and goes meets all
    # three alike).
    # The order turns round in even rounds, so that a machine whose speed drifts over the
    # rounds favours none of the three; each round's costs are kept too.
    lq=""; lj=""; ld=""; round_text=""; round_json=""
    for i in $(seq 1 "$RUNS"); do
      kinds=(quiet json text); [ $((i % 2)) = 0 ] && kinds=(text json quiet)
      for kind in "${kinds[@]}"; do
        case "$kind" in
          quiet) read -r q _ _ < <(run_timed "$WORK/quiet-$i" "$BIN" replay "$file" --events "$events_to" --log-level warn --threads 1) ;;
          json) read -r j _ _ < <(run_timed "$WORK/json-$i" "$BIN" --log-format json replay "$file" --events "$events_to" --threads 1) ;;
          text) read -r d _ _ < <(run_timed "$WORK/text-$i" "$BIN" replay "$file" --events "$events_to" --threads 1) ;;
        esac
      done
      lq+="$q "; lj+="$j "; ld+="$d "
      round_text+="$(awk -v a="$d" -v q="$q" 'BEGIN{print 100*(a-q)/a}') "
      round_json+="$(awk -v a="$j" -v q="$q" 'BEGIN{print 100*(a-q)/a}') "
    done
    # shellcheck disable=SC2086
    R[gateway.quiet.wall]="$(median $lq)"
    # shellcheck disable=SC2086
    R[gateway.json.wall]="$(median $lj)"
    # shellcheck disable=SC2086
    R[gateway.text.wall]="$(median $ld)"
    R[gateway.log.wall]="text $(awk -v a="${R[gateway.text.wall]}" -v q="${R[gateway.quiet.wall]}" 'BEGIN{printf "%.1f%%", 100*(a-q)/a}'), json $(awk -v a="${R[gateway.json.wall]}" -v q="${R[gateway.quiet.wall]}" 'BEGIN{printf "%.1f%%", 100*(a-q)/a}')"
    echo "log cost: ${R[gateway.log.wall]} of replay time ($(grep -c ' handshake ' "$WORK/mcptap-$name-1.err" || true) handshake lines; medians of the same rounds: default ${R[gateway.text.wall]} s, --log-level warn ${R[gateway.quiet.wall]} s, json ${R[gateway.json.wall]} s)"
    # shellcheck disable=SC2086
    echo "log cost, median of the rounds' own: text $(median $round_text | awk '{printf "%.1f%%", $1}'), json $(median $round_json | awk '{printf "%.1f%%", $1}')"
    if [ "$CALLGRIND" = 1 ]; then
      # The same three in instructions (callgrind): load-independent where the wall times
      # move with the machine's speed. The kernel's share of writing the lines (a write of
      # 64 KiB at a time) is not counted.
      ir_q="$(log_instructions quiet replay "$file" --events "$events_to" --log-level warn --threads 1)"
      ir_t="$(log_instructions text replay "$file" --events "$events_to" --threads 1)"
      ir_j="$(log_instructions json --log-format json replay "$file" --events "$events_to" --threads 1)"
      R[gateway.log.ir]="text $(awk -v a="$ir_t" -v q="$ir_q" 'BEGIN{printf "%.1f%%", 100*(a-q)/a}'), json $(awk -v a="$ir_j" -v q="$ir_q" 'BEGIN{printf "%.1f%%", 100*(a-q)/a}')"
      echo "log cost, instructions (callgrind): ${R[gateway.log.ir]} (--log-level warn $ir_q, default $ir_t, json $ir_j)"
    fi
  fi
  if [ "$name" = gateway ] && [ "$(nproc)" -ge 2 ]; then
    # What this machine gives a second thread at all: two independent one-thread replays at
    # once against one alone, in the same rounds (alternating which comes first). Their
    # slow-down bounds what --threads 2 can reach here (2 / slow-down), whatever mcptap does;
    # the CPU figures separate the machine's share of the two-thread overhead from mcptap's.
    pair_ratios=""; pair_cpu_ratios=""
    for i in $(seq 1 "$RUNS"); do
      alone_run() {
        read -r alone_wall _ alone_cpu < <(run_timed "$WORK/alone-$i" "$BIN" replay "$file" --events "$WORK/pair-a.ndjson" --threads 1)
      }
      [ $((i % 2)) = 1 ] && alone_run
      run_timed "$WORK/pair1-$i" "$BIN" replay "$file" --events "$WORK/pair-1.ndjson" --threads 1 > "$WORK/pair1-$i.res" &
      p1=$!
      run_timed "$WORK/pair2-$i" "$BIN" replay "$file" --events "$WORK/pair-2.ndjson" --threads 1 > "$WORK/pair2-$i.res" &
      p2=$!
      wait "$p1" "$p2"
      [ $((i % 2)) = 0 ] && alone_run
      read -r w1 _ c1 < "$WORK/pair1-$i.res"
      read -r w2 _ c2 < "$WORK/pair2-$i.res"
      printf 'pair   run %d: %s and %s s wall, %s and %s s CPU, at once (--threads 1 each; alone: %s s, %s s CPU)\n' \
        "$i" "$w1" "$w2" "$c1" "$c2" "$alone_wall" "$alone_cpu"
      pair_ratios+="$(awk -v a="$w1" -v b="$w2" -v o="$alone_wall" 'BEGIN{print (a>b?a:b)/o}') "
      pair_cpu_ratios+="$(awk -v a="$c1" -v b="$c2" -v o="$alone_cpu" 'BEGIN{print (a+b)/2/o}') "
    done
    rm -f "$WORK"/pair-*.ndjson
    # shellcheck disable=SC2086
    R[gateway.pair.slowdown]="$(median $pair_ratios)"
    # shellcheck disable=SC2086
    R[gateway.pair.cpu]="$(median $pair_cpu_ratios)"
  fi
  # Events for the facts check (not timed).
  "$BIN" replay "$file" --events "$WORK/events-$name.ndjson" --log-level error --threads 1 > /dev/null 2>&1
  "$BIN" replay "$file" --events "$WORK/events-split-$name.ndjson" --log-level error --threads 2 > /dev/null 2>&1
  if cmp -s "$WORK/events-$name.ndjson" "$WORK/events-split-$name.ndjson"; then
    echo "events, --threads 2 vs 1: identical ($(wc -l < "$WORK/events-$name.ndjson") lines)"
  else
    die "$name: --threads 2 gave other events than --threads 1"
  fi
  # The session layer in three shards by client, and the flow layer in two shards by
  # connection too (one session thread): the same events unless a limit is hit (each
  # shard's tables are bounded on their own), so reported, not required; but events that
  # differ with no limit hit in either run are a defect.
  "$BIN" replay "$file" --events "$WORK/events-shards-$name.ndjson" --log-level error --threads 4 > /dev/null 2>&1
  compare_layout "$name" "$WORK/events-shards-$name.ndjson" "--threads 4 (3 session shards)"
  "$BIN" replay "$file" --events "$WORK/events-flows-$name.ndjson" --log-level error --threads 4 --flow-threads 2 > /dev/null 2>&1
  compare_layout "$name" "$WORK/events-flows-$name.ndjson" "--threads 4 --flow-threads 2 (2 flow shards)"
  if [ -n "$BASELINE" ]; then
    "$BASELINE" replay "$file" --events "$WORK/events-base-$name.ndjson" --log-level error > /dev/null 2>&1
    n_new="$(wc -l < "$WORK/events-$name.ndjson")"
    if cmp -s "$WORK/events-$name.ndjson" "$WORK/events-base-$name.ndjson"; then
      R[$name.same]="identical ($n_new events)"
    else
      R[$name.same]="DIFFER ($n_new events new, $(wc -l < "$WORK/events-base-$name.ndjson") baseline)"
    fi
    echo "events, new vs baseline: ${R[$name.same]}"
  fi
  if [ "$CALLGRIND" = 1 ]; then
    for t in "${tools[@]}"; do
      bin="$BIN"; [ "$t" = base ] && bin="$BASELINE"
      R[$name.$t.ir]="$(instructions "$WORK/$t-$name.callgrind" "$bin" "$file")"
      echo "$t callgrind: ${R[$name.$t.ir]} instructions"
    done
  fi
  if [ "$TSHARK" = 1 ]; then
    echo "tshark (once; may take minutes) ..."
    read -r wall rss cpu < <(run_timed "$WORK/tshark-$name" tshark -r "$file" "${TSHARK_ARGS[@]}")
    echo "tshark: ${wall} s wall, ${cpu} s CPU, peak RSS ${rss} KiB, $(wc -l < "$WORK/tshark-$name.out") HTTP rows on port 8080"
    R[$name.tshark.wall]="$wall"; R[$name.tshark.rss]="$rss"; R[$name.tshark.cpu]="$cpu"
    facts="$(python3 scripts/bench/facts.py "$WORK/events-$name.ndjson" "$WORK/tshark-$name.out" || true)"
    echo "facts: $facts"
    R[$name.facts]="$facts"
  fi
done

# ------------------------------------------------------------------ table
echo
echo "== results ($MODE) =="
fmt_row() { # capture tool wall rss size packets cpu
  awk -v c="$1" -v t="$2" -v w="$3" -v r="$4" -v s="$5" -v p="$6" -v u="$7" 'BEGIN{
    printf "| %-7s | %-6s | %8.1f | %9.3f | %9.1f | %10.0f | %9.1f | %9.3f |\n", c, t, s/1e6, w, s/1e6/w, p/w, r/1024, u }'
}
echo "| capture | tool   | size MB  | wall s    | MB/s      | packets/s  | RSS MiB   | CPU s     |"
echo "|---------|--------|----------|-----------|-----------|------------|-----------|-----------|"
for name in "${NAMES[@]}"; do
  fmt_row "$name" tcpdump "${R[$name.tcpdump.wall]}" 0 "${R[$name.size]}" "${R[$name.packets]}" 0
  fmt_row "$name" mcptap "${R[$name.mcptap.wall]}" "${R[$name.mcptap.rss]}" "${R[$name.size]}" "${R[$name.packets]}" "${R[$name.mcptap.cpu]}"
  if [ -n "$BASELINE" ]; then
    fmt_row "$name" base "${R[$name.base.wall]}" "${R[$name.base.rss]}" "${R[$name.size]}" "${R[$name.packets]}" "${R[$name.base.cpu]}"
  fi
  if [ "$TSHARK" = 1 ]; then
    fmt_row "$name" tshark "${R[$name.tshark.wall]}" "${R[$name.tshark.rss]}" "${R[$name.size]}" "${R[$name.packets]}" "${R[$name.tshark.cpu]}"
  fi
done
if [ -n "$BASELINE" ]; then
  echo
  echo "A/B, new / baseline (medians of $RUNS alternating runs each; < 1 means the new binary is faster):"
  for name in "${NAMES[@]}"; do
    awk -v c="$name" -v nw="${R[$name.mcptap.wall]}" -v bw="${R[$name.base.wall]}" \
        -v nc="${R[$name.mcptap.cpu]}" -v bc="${R[$name.base.cpu]}" \
        -v nr="${R[$name.mcptap.rss]}" -v br="${R[$name.base.rss]}" 'BEGIN{
      printf "  %-6s wall %.3f / %.3f s = %.4f, CPU %.3f / %.3f s = %.4f, peak RSS %.4f\n", c, nw, bw, nw/bw, nc, bc, nc/bc, nr/br }'
    if [ "$CALLGRIND" = 1 ]; then
      awk -v c="$name" -v n="${R[$name.mcptap.ir]}" -v b="${R[$name.base.ir]}" 'BEGIN{
        printf "  %-6s instructions %.0f / %.0f = %.4f (callgrind)\n", c, n, b, n/b }'
    fi
    printf "  %-6s events %s\n" "$name" "${R[$name.same]}"
  done
elif [ "$CALLGRIND" = 1 ]; then
  echo
  for name in "${NAMES[@]}"; do
    awk -v c="$name" -v n="${R[$name.mcptap.ir]}" -v s="${R[$name.size]}" -v p="${R[$name.packets]}" 'BEGIN{
      printf "  %-7s instructions %.0f (callgrind), %.1f per capture byte, %.0f per packet\n", c, n, n/s, n/p }'
  done
fi
echo
echo "ratio mcptap/tcpdump (wall time of reading the same file; the gateway target is <= 2):"
for name in "${NAMES[@]}"; do
  awk -v c="$name" -v m="${R[$name.mcptap.wall]}" -v t="${R[$name.tcpdump.wall]}" 'BEGIN{
    printf "  %-7s %.2f (mcptap %.3f s, tcpdump %.3f s)\n", c, m/t, m, t }'
done
if [ "$TSHARK" = 1 ]; then
  echo
  echo "ratio mcptap/tshark (wall time and peak RSS; < 1 means mcptap uses less):"
  for name in "${NAMES[@]}"; do
    awk -v c="$name" -v mw="${R[$name.mcptap.wall]}" -v tw="${R[$name.tshark.wall]}" \
        -v dw="${R[$name.default.wall]}" -v n="$(nproc)" \
        -v mr="${R[$name.mcptap.rss]}" -v tr="${R[$name.tshark.rss]}" 'BEGIN{
      printf "  %-6s wall %.4f (mcptap %.1fx faster on one thread, %.1fx at its default of %d threads), RSS %.3f\n", c, mw/tw, tw/mw, tw/dw, n, mr/tr }'
  done
  echo
  echo "facts (tools/call responses: session id + media type):"
  for name in "${NAMES[@]}"; do echo "  $name: ${R[$name.facts]}"; done
fi

echo
echo "two threads (--threads 2: flow layer and session layer apart) against one, medians:"
for name in "${NAMES[@]}"; do
  awk -v c="$name" -v one="${R[$name.mcptap.wall]}" -v two="${R[$name.split.wall]}" -v r="${R[$name.split.rounds]}" 'BEGIN{
    printf "  %-7s %.3f s vs %.3f s: %.2fx (median of the ratios of the rounds: %.2fx)\n", c, two, one, one/two, r }'
done
if [ -n "${R[gateway.pair.slowdown]:-}" ]; then
  awk -v s="${R[gateway.pair.slowdown]}" -v pc="${R[gateway.pair.cpu]}" \
      -v one="${R[gateway.mcptap.wall]}" -v two="${R[gateway.split.wall]}" \
      -v c1="${R[gateway.mcptap.cpu]}" -v c2="${R[gateway.split.cpu]}" 'BEGIN{
    printf "  this machine, gateway: two one-thread replays at once each take %.2fx the time of one alone\n", s
    printf "    (median of the ratios of the rounds), so 2 threads can reach at most %.2fx here; --threads 2\n", 2/s
    printf "    reached %.2fx, %.0f%% of that. CPU: a replay beside another takes %.2fx the CPU of one\n", one/two, 100*(one/two)/(2/s), pc
    printf "    alone; --threads 2 takes %.2fx the CPU of --threads 1 (medians of the same runs).\n", c2/c1 }'
fi
echo "the default (no --threads: $(nproc) threads on this machine) against one thread, medians:"
for name in "${NAMES[@]}"; do
  awk -v c="$name" -v one="${R[$name.mcptap.wall]}" -v d="${R[$name.default.wall]}" 'BEGIN{
    printf "  %-7s %.3f s vs %.3f s: %.2fx\n", c, d, one, one/d }'
done
echo
echo "targets:"
target() { # label value goal unit
  awk -v l="$1" -v v="$2" -v g="$3" -v u="$4" 'BEGIN{
    printf "  %-44s %9.1f %-4s (goal >= %s %s: %s, %.0f%% of goal)\n", l, v, u, g, u, (v>=g?"met":"NOT met"), 100*v/g }'
}
target "mixed: mcptap throughput" "$(awk -v s="${R[mixed.size]}" -v w="${R[mixed.mcptap.wall]}" 'BEGIN{print s/1e6/w}')" 1500 MB/s
target "all-MCP: mcptap throughput" "$(awk -v s="${R[mcp.size]}" -v w="${R[mcp.mcptap.wall]}" 'BEGIN{print s/1e6/w}')" 400 MB/s
if [ "$TSHARK" = 1 ]; then
  # Each tool as it runs by default (tshark on one thread, mcptap replay on one per core),
  # and mcptap on one thread besides.
  for name in mixed mcp; do
    target "$name: speed-up over tshark (default, $(nproc) thr.)" "$(awk -v m="${R[$name.default.wall]}" -v t="${R[$name.tshark.wall]}" 'BEGIN{print t/m}')" 100 x
    target "$name: speed-up over tshark (one thread)" "$(awk -v m="${R[$name.mcptap.wall]}" -v t="${R[$name.tshark.wall]}" 'BEGIN{print t/m}')" 100 x
  done
fi
if [ -n "$GATEWAY" ]; then
  # As a "higher is better" figure: tcpdump's time over mcptap's, goal 0.5 (within 2x).
  target "gateway: tcpdump time / mcptap time" "$(awk -v m="${R[gateway.mcptap.wall]}" -v t="${R[gateway.tcpdump.wall]}" 'BEGIN{print t/m}')" 0.5 x
  target "gateway: 2 threads' speed-up over one" "$(awk -v one="${R[gateway.mcptap.wall]}" -v two="${R[gateway.split.wall]}" 'BEGIN{print one/two}')" 1.6 x
  echo "  gateway: logging's cost (goal < 10% each): ${R[gateway.log.wall]:-?} of replay time (medians);" \
    "in instructions: ${R[gateway.log.ir]:-not counted (--callgrind counts them)}"
fi
echo "  ${R[alloc]}"
echo "  ${R[capture]}"
[ -n "${R[capture.ir]:-}" ] && echo "  capture thread: ${R[capture.ir]} instructions per packet (callgrind)"
printf "  MB/s = capture file size / wall time. mcptap MB per CPU-second (size / (user+sys),\n"
printf "  less sensitive to other load on the machine):"
for name in "${NAMES[@]}"; do
  awk -v c="$name" -v s="${R[$name.size]}" -v u="${R[$name.mcptap.cpu]}" 'BEGIN{
    printf " %s %.1f", c, s/1e6/u }'
done
echo
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
