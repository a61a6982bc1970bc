#!/usr/bin/env bash
# Fleet mode's cost on many short sessions: two gateway hosts' captures of N sessions
# (`gen_capture --fleet-pair N`: host A saw each session start, host B each reconnect), a
# throwaway redis-server on loopback, and three replays: A writing its state, B reading it, B
# alone. Prints the added cost per first sighting and the lookup round trips (p50/p99/max).
#
#   scripts/fleet-bench.sh [SESSIONS]      # default 10000
#
# Needs: cargo, redis-server (Debian package redis-server). Everything stays on 127.0.0.1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N="${1:-10000}"
DATA="$ROOT/target/bench-data"
BIN="$ROOT/target/release/mcptap"
die() { echo "fleet-bench: $*" >&2; exit 1; }
command -v redis-server >/dev/null || die "redis-server not found (apt-get install redis-server)"
(cd "$ROOT" && cargo build --release --locked -q) || die "build failed"
A="$DATA/fleet-a-${N}s-seed1.pcap"; B="$DATA/fleet-b-${N}s-seed1.pcap"
if [ ! -s "$A" ] || [ ! -s "$B" ]; then
  (cd "$ROOT" && cargo bench --locked -q --bench gen_capture -- --out "$DATA" --seed 1 --fleet-pair "$N") >/dev/null
fi
WORK="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null &
REDIS=$!
trap 'kill $REDIS 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
URL="redis://127.0.0.1:$PORT/"
run() { # label args... -> prints elapsed seconds; stderr kept in $WORK/label.err
  local label=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" replay "$@" --log-level warn > "$WORK/$label.ndjson" 2> "$WORK/$label.err"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
ta=$(run a-write --fleet "$URL" --fleet-write "$A")
tb=$(run b-fleet --fleet "$URL" "$B")
t0=$(run b-alone "$B")
alerts_fleet=$(grep -c '"event":"alert"' "$WORK/b-fleet.ndjson" || true)
alerts_alone=$(grep -c '"event":"alert"' "$WORK/b-alone.ndjson" || true)
echo "== fleet mode, $N short sessions split over two hosts (redis-server $(redis-server --version | grep -o 'v=[^ ]*'))"
printf 'host A, writing its state:  %.3f s   %s\n' "$ta" "$(grep 'fleet store' "$WORK/a-write.err")"
printf 'host B, reading it:         %.3f s   %s\n' "$tb" "$(grep 'fleet store' "$WORK/b-fleet.err")"
printf 'host B alone:               %.3f s\n' "$t0"
printf 'added per first sighting:   %.1f µs\n' "$(echo "($tb - $t0) * 1000000 / $N" | bc -l)"
echo "alerts: host B with the fleet's state $alerts_fleet, alone $alerts_alone"
echo "store: $(redis-cli -p "$PORT" dbsize) keys, $(redis-cli -p "$PORT" info memory | grep -o 'used_memory_human:[^[:space:]]*')"
[ "$alerts_fleet" -eq 2 ] || die "expected the incident's 2 alerts on host B with the fleet's state"
[ "$alerts_alone" -eq 0 ] || die "host B alone should see nothing"
