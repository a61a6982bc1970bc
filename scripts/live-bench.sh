#!/usr/bin/env bash
# Live-capture benchmark: `tcpreplay --topspeed` pushes the mixed reference capture through the
# loopback interface while `mcptap run -i lo` captures it; reports the achieved rate and whether
# the kernel dropped anything (pcap_stats).
#
#   scripts/live-bench.sh                  # mixed 1 GB capture, 30 s, default threads then --threads 1
#   scripts/live-bench.sh --quick          # the 100 MB mixed capture instead
#   options: --duration S (default 30)  --threads N (one run with N; repeatable; `auto` is the
#            default layout: one worker sharded over the cores)  --capture FILE (skip scripts/bench.sh)
#            --buffer-bytes N (passed to mcptap)  --port P (metrics port, default: a free one)
#            --config FILE (passed to mcptap, e.g. a [fleet] section: the fleet-mode run)
#            --preload (tcpreplay -K: capture loaded into RAM first; a faster sender)
#            --keep (keep the temp dir with logs and events)
#            --filter EXPR (the capture filter, default 'tcp and net 127.10.0.0/16'; e.g. the
#            gateway-shaped capture's upstreams: 'tcp and (host 127.0.0.5 or host 127.0.0.6)')
#
# Before anything is sent, scripts/loopback-guard.sh refuses a capture with any non-loopback
# address or a destination MAC that lo would take as its own.
# Per run: start `mcptap run -i lo -f 'tcp and net 127.10.0.0/16'` (every frame of the reference
# captures is TCP to or from a server in 127.10.0.0/16, clients in other 127.x subnets, so
# mcptap counts exactly the replayed packets and no other loopback traffic), wait for /readyz, run `tcpreplay --intf1=lo --topspeed --loop 0
# --duration S` (tcpreplay 4.4 checks --duration only between loops, so it also gets SIGINT
# after S seconds: it stops and prints its statistics), wait until mcptap's packet counter
# settles, read /metrics, stop mcptap with SIGTERM and print:
#   * achieved rate (packets/s, MB/s, from tcpreplay's own report)
#   * pcap_stats drops: kernel (ps_drop) and interface (ps_ifdrop), from
#     mcptap_capture_drops_total{source=...}; ps_recv from mcptap's "capture stopped" log line
#   * packets mcptap processed (mcptap_packets_total) vs packets tcpreplay sent
#   * softnet backlog drops (/proc/net/softnet_stat): loopback frames the kernel dropped before
#     any capture socket saw them (pcap_stats cannot count those)
#   * alerts (events file), CPU seconds of mcptap's capture and pipeline threads, load average
# and a PASS/FAIL line for "no kernel drops" per run. Exit status 0 either way (2 on a setup
# error). The frames carry loopback addresses (127.0.0.0/8, never 127.0.0.1) and locally
# administered destination MACs (02:…): on lo the kernel marks them PACKET_OTHERHOST and drops
# them after the capture taps, before IP, so no local service answers and nothing leaves lo.
#
# Needs: root (capture and injection on lo), cargo, curl, python3; tcpreplay is installed with
# apt-get if missing.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
DURATION=30
THREADS=()
CAPTURE=""
PORT=""
KEEP=0
FILTER=""
EXTRA=()
PRELOAD=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --duration) DURATION="$2"; shift ;;
    --threads) THREADS+=("$2"); shift ;;
    --capture) CAPTURE="$2"; shift ;;
    --buffer-bytes) EXTRA+=(--buffer-bytes "$2"); shift ;;
    --config) EXTRA+=(--config "$2"); shift ;;
    --port) PORT="$2"; shift ;;
    --keep) KEEP=1 ;;
    --preload) PRELOAD=(--preload-pcap) ;;
    --filter) FILTER="$2"; shift ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "live-bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#THREADS[@]} -gt 0 ] || THREADS=(auto 1)

die() { echo "live-bench.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (capture and injection on lo)"
for c in cargo curl python3; do command -v "$c" >/dev/null || die "$c not found"; done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mcptap-live-bench.XXXXXX")"
MCPTAP_PID=""
TCPREPLAY_PID=""
cleanup() {
  local p
  for p in "$TCPREPLAY_PID" "$MCPTAP_PID"; do
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && { kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; }
  done
  if [ "$KEEP" = 1 ]; then echo "live-bench.sh: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ prerequisites
if ! command -v tcpreplay >/dev/null; then
  echo "== installing tcpreplay (apt-get) =="
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends tcpreplay >/dev/null; } \
    || die "cannot install tcpreplay"
fi

echo "== building (release) =="
cargo build --release --quiet || die "cargo build --release failed"
BIN="$ROOT/target/release/mcptap"

if [ -z "$CAPTURE" ]; then
  echo "== reference capture (scripts/bench.sh --generate-only) =="
  args=(--generate-only --no-tshark)
  [ "$QUICK" = 1 ] && args+=(--quick)
  out="$(scripts/bench.sh "${args[@]}")" || die "scripts/bench.sh --generate-only failed"
  CAPTURE="$(grep -E '/mixed-[^/]*\.pcap$' <<<"$out" | tail -n 1)"
fi
[ -f "$CAPTURE" ] || die "no capture file ${CAPTURE:-?}"
# Never push a capture that could reach a real address or the local stack.
scripts/loopback-guard.sh --bin "$BIN" --interface lo "$CAPTURE" || exit 2

[ -n "$PORT" ] || PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
MURL="http://127.0.0.1:$PORT"
[ -n "$FILTER" ] || FILTER='tcp and net 127.10.0.0/16'

echo
echo "== machine =="
echo "date:      $(date -u +%Y-%m-%dT%H:%MZ)"
echo "cpu:       $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo) ($(nproc) cores online)"
echo "kernel:    $(uname -sr)"
echo "load:      $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the runs; the machine may be shared)"
echo "mcptap:    $("$BIN" --version)"
echo "tcpreplay: $(tcpreplay --version 2>&1 | awk '/tcpreplay version/{print $3; exit}')"
echo "capture:   $CAPTURE ($(stat -c %s "$CAPTURE") bytes)"
echo "filter:    $FILTER; duration ${DURATION} s; lo mtu $(cat /sys/class/net/lo/mtu);" \
     "net.core.netdev_max_backlog $(cat /proc/sys/net/core/netdev_max_backlog)"

# ------------------------------------------------------------------ helpers
# metric NAME [LABEL-MATCH]: sum of the samples of NAME (optionally only lines containing
# LABEL-MATCH) in the scrape $WORK/scrape.txt; 0 when absent.
metric() {
  awk -v n="$1" -v m="${2:-}" '
    $1 == n || index($1, n "{") == 1 { if (m == "" || index($1, m) > 0) s += $NF }
    END { printf "%.0f\n", s }' "$WORK/scrape.txt"
}
scrape() { curl -fsS --max-time 5 "$MURL/metrics" >"$WORK/scrape.txt"; }
# softnet_drops: frames dropped at the per-CPU backlog (2nd column, hex), summed over CPUs.
softnet_drops() { python3 -c 'print(sum(int(l.split()[1], 16) for l in open("/proc/net/softnet_stat")))'; }
# thread_cpu PID: "name=seconds" for each thread of PID (utime + stime).
thread_cpu() {
  local t hz
  hz=$(getconf CLK_TCK)
  for t in /proc/"$1"/task/*; do
    awk -v hz="$hz" '{ s = $0; sub(/^[^)]*\) /, "", s); split(s, f, " ");
      n = $0; sub(/^[^(]*\(/, "", n); sub(/\).*/, "", n);
      printf "%s=%.2f\n", n, (f[12] + f[13]) / hz }' "$t/stat" 2>/dev/null
  done | sort
}
# cpu_delta BEFORE AFTER: per-thread-name CPU seconds used between two thread_cpu snapshots.
cpu_delta() {
  awk -F= 'NR == FNR { b[$1] += $2; next } { a[$1] += $2 }
    END { for (k in a) printf "%s %.2f s; ", k, a[k] - b[k] }' <(echo "$1") <(echo "$2") | sed 's/; $//'
}

RESULTS=()
run_one() {
  local threads=$1 label tflag=() rc sd0 sd1 load0 load1 cpu0 cpu1 i last cur
  label="threads=$threads"
  [ "$threads" = auto ] && label="threads=auto (the default layout on $(nproc) cores)" || tflag=(--threads "$threads")
  echo
  echo "== run: $label =="
  local ev="$WORK/events-$threads.ndjson" err="$WORK/mcptap-$threads.err"
  "$BIN" run -i lo -f "$FILTER" --listen "127.0.0.1:$PORT" --events "$ev" "${tflag[@]}" "${EXTRA[@]}" \
    >"$WORK/mcptap-$threads.out" 2>"$err" &
  MCPTAP_PID=$!
  for i in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$MURL/readyz")" = 200 ] && break
    kill -0 "$MCPTAP_PID" 2>/dev/null || { tail -5 "$err" >&2; die "mcptap exited"; }
    sleep 0.1
  done
  sleep 0.5
  load0="$(cut -d' ' -f1-3 /proc/loadavg)"
  sd0=$(softnet_drops)
  cpu0="$(thread_cpu "$MCPTAP_PID")"
  echo "load before: $load0"
  echo "tcpreplay --intf1=lo --topspeed ${PRELOAD[*]}${PRELOAD:+ }--loop 0 --duration $DURATION $(basename "$CAPTURE") ..."
  # --preload-pcap reads the whole file first: the SIGINT deadline starts after that.
  local deadline=$DURATION
  [ ${#PRELOAD[@]} -gt 0 ] && deadline=$((DURATION + $(stat -c %s "$CAPTURE") / 200000000 + 2))
  timeout -s INT -k 10 "$deadline" \
    tcpreplay --intf1=lo --topspeed "${PRELOAD[@]}" --loop 0 --duration "$DURATION" "$CAPTURE" \
    >"$WORK/tcpreplay-$threads.out" 2>&1 &
  TCPREPLAY_PID=$!
  wait "$TCPREPLAY_PID"; rc=$?
  TCPREPLAY_PID=""
  load1="$(cut -d' ' -f1-3 /proc/loadavg)"
  # 124: stopped by the SIGINT deadline (normal)
  [ "$rc" = 0 ] || [ "$rc" = 124 ] || { tail -5 "$WORK/tcpreplay-$threads.out"; echo "tcpreplay exit status $rc"; }
  # Let the pipeline drain: wait until the packet counter holds still for a second (max 20 s).
  last=-1
  for i in $(seq 20); do
    scrape || break
    cur=$(metric mcptap_packets_total)
    [ "$cur" = "$last" ] && break
    last=$cur
    sleep 1
  done
  cpu1="$(thread_cpu "$MCPTAP_PID")"
  scrape || echo "scrape failed"
  sd1=$(softnet_drops)
  kill -TERM "$MCPTAP_PID" 2>/dev/null
  for i in $(seq 100); do kill -0 "$MCPTAP_PID" 2>/dev/null || break; sleep 0.1; done
  wait "$MCPTAP_PID" 2>/dev/null
  MCPTAP_PID=""

  # tcpreplay: "Actual: N packets (B bytes) sent in S seconds" / "Rated: X Bps, Y Mbps, Z pps"
  local sent bytes secs pps mbs
  read -r sent bytes secs < <(sed -n 's/.*Actual: \([0-9]*\) packets (\([0-9]*\) bytes) sent in \([0-9.]*\) seconds.*/\1 \2 \3/p' \
    "$WORK/tcpreplay-$threads.out" | tail -n 1)
  sent=${sent:-0}; bytes=${bytes:-0}; secs=${secs:-0}
  pps=$(awk -v n="$sent" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0) ? n / s : 0 }')
  mbs=$(awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.1f", (s > 0) ? b / s / 1e6 : 0 }')
  local packets mbytes kdrop idrop skipped gaps alerts ev_alerts recv stopline
  packets=$(metric mcptap_packets_total)
  mbytes=$(metric mcptap_bytes_total)
  kdrop=$(metric mcptap_capture_drops_total 'source="kernel"')
  idrop=$(metric mcptap_capture_drops_total 'source="interface"')
  skipped=$(metric mcptap_packets_skipped_total)
  gaps=$(metric mcptap_tcp_gaps_total)
  alerts=$(metric mcptap_alerts_total)
  ev_alerts=$(grep -c '"event":"alert"' "$ev" 2>/dev/null); ev_alerts=${ev_alerts:-0}
  stopline="$(sed 's/\x1b\[[0-9;]*m//g' "$err" | grep 'capture stopped (pcap_stats)' | tail -n 1)"
  recv="$(sed -n 's/.*received=\([0-9]*\).*/\1/p' <<<"$stopline")"
  local verdict="PASS"
  { [ "$kdrop" = 0 ] && [ "$idrop" = 0 ]; } || verdict="FAIL"
  [ "$sent" -gt 0 ] || verdict="FAIL (nothing sent)"
  [ -n "$stopline" ] || echo "warning: no 'capture stopped (pcap_stats)' line in the log (older mcptap?)"
  echo "tcpreplay:        $sent packets, $bytes bytes in $secs s: $pps packets/s, $mbs MB/s"
  echo "pcap_stats:       ps_recv ${recv:-?}, ps_drop (kernel) $kdrop, ps_ifdrop (interface) $idrop"
  echo "mcptap processed: $packets packets ($mbytes bytes) of $sent sent: $( [ "$packets" -ge "$sent" ] && echo all || echo "MISSING $((sent - packets))"); skipped $skipped, tcp gaps $gaps"
  echo "softnet drops:    $((sd1 - sd0)) (kernel backlog, all interfaces, during the run)"
  echo "alerts:           $ev_alerts alert events in the events file, mcptap_alerts_total $alerts"
  echo "mcptap CPU:       $(cpu_delta "$cpu0" "$cpu1")"
  echo "load:             $load0 before, $load1 at the end of the replay"
  echo "RESULT $label: no kernel drops: $verdict"
  RESULTS+=("$(printf '%-28s %9s pps %8s MB/s  ps_drop %-8s ps_ifdrop %-6s processed %s/%s  alerts %s  %s' \
    "$label" "$pps" "$mbs" "$kdrop" "$idrop" "$packets" "$sent" "$ev_alerts" "$verdict")")
}

for t in "${THREADS[@]}"; do run_one "$t"; done

echo
echo "== summary (no kernel drops while tcpreplay --topspeed replays $(basename "$CAPTURE") through lo for ${DURATION} s) =="
printf '%s\n' "${RESULTS[@]}"
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
exit 0
