#!/usr/bin/env bash
# Regenerate the packet-capture fixtures in tests/fixtures/.
#
# For each fixture: start tcpdump on lo for the fixture's client-facing port
# only, run the traffic (official MCP Python SDK pair, or a scripted scenario
# from scripts/fixtures/scenarios.py) against 127.0.0.1, stop tcpdump and move
# the pcap into place. A pcap is replaced only when its traffic run succeeded.
#
# Needs: root (tcpdump on lo), tcpdump, python3 >= 3.10, PyPI access the first
# time (a venv is made at .venv-fixtures); optionally node + npm (npm registry
# the first time) for the TypeScript SDK fixture. Idempotent; every step is
# bounded.
#
#   scripts/gen-fixtures.sh            # all fixtures
#   scripts/gen-fixtures.sh incident   # only the named ones
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/scripts/fixtures"
OUT="$ROOT/tests/fixtures"
VENV="$ROOT/.venv-fixtures"
PYTHON="${PYTHON:-python3}"
STEP_TIMEOUT=60       # seconds for one traffic run
MAX_FIXTURE=102400    # bytes: each pcap stays well under 100 KB
MAX_TOTAL=1048576     # bytes: all pcaps together

die() { echo "gen-fixtures: $*" >&2; exit 1; }

command -v tcpdump >/dev/null || die "tcpdump not found (apt-get install tcpdump)"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "need Python >= 3.10 for mcp"

# Keep the venv out of git (append only if no line names it yet).
if ! grep -qsE '^/?\.venv-fixtures/?$' "$ROOT/.gitignore"; then
  # Do not glue our line onto a last line that lacks its newline.
  if [ -s "$ROOT/.gitignore" ] && [ -n "$(tail -c1 "$ROOT/.gitignore")" ]; then
    echo >> "$ROOT/.gitignore"
  fi
  echo '/.venv-fixtures/' >> "$ROOT/.gitignore"
fi

# Venv: (re)install only when requirements.txt changed since the last install.
PY="$(PYTHON="$PYTHON" "$ROOT/scripts/venv.sh")" || die "venv setup failed"

# Optional: the TypeScript SDK pair (ts_sdk_sse.pcap) when node and npm exist.
# Pinned 1.x SDK, installed into the (git-ignored) venv folder, not the repo.
TS_PACKAGES="@modelcontextprotocol/sdk@1.32.2 zod@3.25.76"
NODE_DIR="$VENV/node"
HAVE_TS=0
if command -v node >/dev/null && command -v npm >/dev/null; then
  if [ "$(cat "$NODE_DIR/.packages" 2>/dev/null || true)" != "$TS_PACKAGES" ]; then
    mkdir -p "$NODE_DIR"
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    timeout 600 npm install --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error $TS_PACKAGES \
      || die "npm install failed"
    echo "$TS_PACKAGES" > "$NODE_DIR/.packages"
  fi
  HAVE_TS=1
else
  echo "gen-fixtures: node/npm not found, skipping ts_sdk_sse.pcap" >&2
fi

mkdir -p "$OUT"
WORK="$(mktemp -d)"
TCPDUMP_PID=""
RUN_PID=""
cleanup() {
  # Only the processes this script started, by pid.
  [ -n "$RUN_PID" ] && kill "$RUN_PID" 2>/dev/null || true
  [ -n "$TCPDUMP_PID" ] && kill "$TCPDUMP_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# tcpdump drops privileges to its own user by default, which then cannot write
# into the repo; as root keep root.
ZFLAG=()
[ "$(id -u)" = 0 ] && ZFLAG=(-Z root)

start_capture() { # name port
  local name=$1 port=$2 log="$WORK/$1.tcpdump.log"
  : > "$log" # exists before tcpdump's redirect opens it, for the grep below
  # --immediate-mode: without it libpcap's ring buffer holds packets back and a
  # short run can end up with an empty pcap when tcpdump is stopped.
  # -B: with -s 0 each packet takes a large slot; the default 2 MiB buffer drops bursts.
  # CAPTURE_FILTER (set for one record call) records more than the client-facing port.
  tcpdump -i lo -U --immediate-mode -s 0 -B 16384 "${ZFLAG[@]}" -w "$WORK/$name.pcap" \
    "${CAPTURE_FILTER:-tcp port $port}" 2>"$log" &
  TCPDUMP_PID=$!
  # Ready once it has said "listening on" (the filter is attached by then).
  for _ in $(seq 100); do
    grep -q "listening on" "$log" && return 0
    kill -0 "$TCPDUMP_PID" 2>/dev/null || break
    sleep 0.05
  done
  cat "$log" >&2
  die "tcpdump did not start for $name"
}

stop_capture() { # name [nocheck]
  local log="$WORK/$1.tcpdump.log"
  kill -INT "$TCPDUMP_PID" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$TCPDUMP_PID" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$TCPDUMP_PID" 2>/dev/null && kill -KILL "$TCPDUMP_PID"
  wait "$TCPDUMP_PID" 2>/dev/null || true
  TCPDUMP_PID=""
  [ "${2:-}" = nocheck ] && return 0
  if grep -qE '^0 packets captured' "$log"; then
    cat "$log" >&2
    die "$1: nothing captured"
  fi
  if grep -qE '^[1-9][0-9]* packets? dropped by kernel' "$log"; then
    cat "$log" >&2
    die "$1: tcpdump dropped packets"
  fi
}

fail_run() { # name
  [ -n "$TCPDUMP_PID" ] && stop_capture "$1" nocheck
  cat "$WORK/$1.out" >&2
  die "$1: traffic run failed"
}

record() { # name port command...
  local name=$1 port=$2
  shift 2
  echo "== $name (tcp port $port)"
  start_capture "$name" "$port"
  timeout "$STEP_TIMEOUT" "$@" >"$WORK/$name.out" 2>&1 || fail_run "$name"
  sleep 0.3 # let the last segments (FIN/ACK) reach tcpdump
  stop_capture "$name"
  mv -f "$WORK/$name.pcap" "$OUT/$name.pcap"
}

# Like record, but the run keeps its last stream open and says so by creating a
# hold file; the capture is stopped while the stream is open, then the hold
# file is removed so the run can finish (empty_stream).
record_held() { # name port command... (command gets --hold-file)
  local name=$1 port=$2 hold="$WORK/$1.hold"
  shift 2
  echo "== $name (tcp port $port, capture stops while a stream is open)"
  start_capture "$name" "$port"
  timeout "$STEP_TIMEOUT" "$@" --hold-file "$hold" >"$WORK/$name.out" 2>&1 &
  RUN_PID=$!
  for _ in $(seq 400); do
    [ -e "$hold" ] && break
    kill -0 "$RUN_PID" 2>/dev/null || break
    sleep 0.05
  done
  [ -e "$hold" ] || { wait "$RUN_PID" || true; RUN_PID=""; fail_run "$name"; }
  sleep 0.3 # the open stream's first bytes are on the wire; let tcpdump write them
  stop_capture "$name"
  rm -f "$hold"
  wait "$RUN_PID" || { RUN_PID=""; fail_run "$name"; }
  RUN_PID=""
  mv -f "$WORK/$name.pcap" "$OUT/$name.pcap"
}

SELECTED=("$@")
want_fixture() { # name: named on the command line, or nothing named
  [ ${#SELECTED[@]} -eq 0 ] && return 0
  local n
  for n in "${SELECTED[@]}"; do [ "$n" = "$1" ] && return 0; done
  return 1
}

started=$(date +%s)

want_fixture sdk_sse && record sdk_sse 18101 "$PY" "$SRC/sdk_pair.py" --mode sse --port 18101
want_fixture sdk_json && record sdk_json 18102 "$PY" "$SRC/sdk_pair.py" --mode json --port 18102
if [ "$HAVE_TS" = 1 ] && want_fixture ts_sdk_sse; then
  record ts_sdk_sse 18103 node "$SRC/ts_sdk_pair.mjs" --port 18103 --node-modules "$NODE_DIR"
fi

# Scenario names and ports come from scenarios.py itself.
while read -r name port _; do
  want_fixture "$name" || continue
  if [ "$name" = empty_stream ]; then
    record_held "$name" "$port" "$PY" "$SRC/scenarios.py" "$name" --port "$port"
  else
    record "$name" "$port" "$PY" "$SRC/scenarios.py" "$name" --port "$port"
  fi
done < <("$PY" "$SRC/scenarios.py" --list)

# Era fixtures (modern 2026-07-28, legacy stateless, HTTP+SSE 2024-11-05).
# -- python-sdk-2x fixtures --
# mcp 2.3.0 (the dual-era 2.x SDK) gets its own venv, .venv-fixtures-v2, made like
# .venv-fixtures by scripts/venv.sh (idempotent, pip only when requirements-v2.txt changed);
# mcp 1.30.0 ($PY) serves the legacy end of the fallback and the HTTP+SSE pair.
if want_fixture modern_py_auto || want_fixture modern_py_json || want_fixture dual_era_fallback_py \
  || want_fixture sdk2_legacy || want_fixture sdk2_stateless || want_fixture sdk2_modern_behaviours; then
  if ! grep -qsE '^/?\.venv-fixtures-v2/?$' "$ROOT/.gitignore"; then
    if [ -s "$ROOT/.gitignore" ] && [ -n "$(tail -c1 "$ROOT/.gitignore")" ]; then
      echo >> "$ROOT/.gitignore"
    fi
    echo '/.venv-fixtures-v2/' >> "$ROOT/.gitignore"
  fi
  PY2="$(PYTHON="$PYTHON" "$ROOT/scripts/venv.sh" scripts/fixtures/requirements-v2.txt .venv-fixtures-v2)" \
    || die "venv setup failed (.venv-fixtures-v2)"
fi
want_fixture modern_py_auto && record modern_py_auto 18141 "$PY2" "$SRC/sdk2_pair.py" modern --mode auto --port 18141
want_fixture modern_py_json && record modern_py_json 18142 "$PY2" "$SRC/sdk2_pair.py" modern --mode json --port 18142
want_fixture dual_era_fallback_py && record dual_era_fallback_py 18143 \
  "$PY2" "$SRC/sdk2_pair.py" fallback --port 18143 --legacy-python "$PY"
want_fixture http_sse_py && record http_sse_py 18144 "$PY" "$SRC/sse_pair.py" --port 18144
# -- rmcp and typescript stateless fixtures --
# rmcp pair (official Rust SDK, rmcp =3.11.0, locked in scripts/fixtures/rmcp_pair/Cargo.lock):
# a standalone Cargo project (empty [workspace]) built into the git-ignored venv folder.
RMCP_TARGET="$VENV/rmcp-target"
if want_fixture rmcp_modern || want_fixture rmcp_stateless; then
  if command -v cargo >/dev/null; then
    (cd "$SRC/rmcp_pair" && CARGO_TARGET_DIR="$RMCP_TARGET" timeout 900 cargo build --release --locked -q) \
      || die "rmcp_pair build failed"
    if want_fixture rmcp_modern; then
      record rmcp_modern 18151 "$RMCP_TARGET/release/rmcp_pair" --mode modern --port 18151
    fi
    if want_fixture rmcp_stateless; then
      record rmcp_stateless 18152 "$RMCP_TARGET/release/rmcp_pair" --mode stateless --port 18152
    fi
  else
    echo "gen-fixtures: cargo not found, skipping rmcp_modern.pcap and rmcp_stateless.pcap" >&2
  fi
fi
# TypeScript SDK stateless Streamable HTTP (SSE / JSON answers) and deprecated HTTP+SSE.
if [ "$HAVE_TS" = 1 ]; then
  if want_fixture ts_stateless_sse; then
    record ts_stateless_sse 18153 node "$SRC/ts_stateless_pair.mjs" --mode sse --port 18153 --node-modules "$NODE_DIR"
  fi
  if want_fixture ts_stateless_json; then
    record ts_stateless_json 18154 node "$SRC/ts_stateless_pair.mjs" --mode json --port 18154 --node-modules "$NODE_DIR"
  fi
  if want_fixture ts_http_sse; then
    record ts_http_sse 18155 node "$SRC/ts_stateless_pair.mjs" --mode http-sse --port 18155 --node-modules "$NODE_DIR"
  fi
fi
# -- conformant behaviours of the official SDKs (the false-positive hunt) --
# sdk_behaviours.py: mcp 1.30.0 pair with an event store (pings both ways, server requests on
# POST and GET streams, list_changed, a polled stream resumed, a cancelled call, a new
# session); --scenario drop: the client's read timeout drops a stream it then resumes.
want_fixture sdk_behaviours && record sdk_behaviours 18191 "$PY" "$SRC/sdk_behaviours.py" --port 18191
want_fixture sdk_resume_drop && record sdk_resume_drop 18195 \
  "$PY" "$SRC/sdk_behaviours.py" --scenario drop --port 18195
# sdk2_behaviours.py: the same behaviours with mcp 2.3.0 on both ends: its legacy (initialize)
# mode with a session and an event store, stateless with SSE answers (a cancel on another
# connection, answered anyway), and the 2026-07-28 era (errors, a call cancelled by closing its
# stream, a subscriptions/listen stream).
want_fixture sdk2_legacy && record sdk2_legacy 18196 \
  "$PY2" "$SRC/sdk2_behaviours.py" --scenario legacy --port 18196
want_fixture sdk2_stateless && record sdk2_stateless 18197 \
  "$PY2" "$SRC/sdk2_behaviours.py" --scenario legacy-sse-stateless --port 18197
want_fixture sdk2_modern_behaviours && record sdk2_modern_behaviours 18198 \
  "$PY2" "$SRC/sdk2_behaviours.py" --scenario modern --port 18198
if [ "$HAVE_TS" = 1 ] && want_fixture ts_behaviours; then
  record ts_behaviours 18192 node "$SRC/ts_behaviours.mjs" --port 18192 --node-modules "$NODE_DIR"
fi
# nginx_proxy.py: Debian's nginx between an mcp 1.30.0 client and FastMCP server, gzip on (a
# real proxy's compressed SSE and JSON), a real 502 while the upstream is down, then the old
# session's 404 and a new session. Both legs recorded (nginx on 18201, upstream on 18202).
if want_fixture nginx_gzip; then
  if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then
    CAPTURE_FILTER="tcp port 18201 or tcp port 18202" record nginx_gzip 18201 \
      "$PY" "$SRC/nginx_proxy.py" --port 18201
  else
    echo "gen-fixtures: nginx not found (apt-get install nginx), skipping nginx_gzip.pcap" >&2
  fi
fi
# -- era scenarios --
# modern_scenarios.py: scripted 2026-07-28 scenarios (stdlib only, no install
# step); names and ports come from the script itself.
while read -r name port _; do
  want_fixture "$name" || continue
  record "$name" "$port" "$PY" "$SRC/modern_scenarios.py" "$name" --port "$port"
done < <("$PY" "$SRC/modern_scenarios.py" --list)
# legacy_scenarios.py: legacy 2025-11-25 scenarios (stateless servers, server-to-client
# requests, X-Forwarded-For behind a proxy) and the HTTP+SSE 2024-11-05 transport; stdlib
# only, no install step. Names and recorded ports come from the script itself
# (forwarded_client records the proxy->upstream leg; its clients use PORT+2, not recorded).
while read -r name port _; do
  want_fixture "$name" || continue
  record "$name" "$port" "$PY" "$SRC/legacy_scenarios.py" "$name" --port "$port"
done < <("$PY" "$SRC/legacy_scenarios.py" --list)

# Size limits: fixtures live in git.
total=0
for f in "$OUT"/*.pcap; do
  size=$(stat -c %s "$f")
  total=$((total + size))
  printf '%8d  %s\n' "$size" "${f#"$ROOT"/}"
  [ "$size" -lt "$MAX_FIXTURE" ] || die "$f is too big ($size bytes)"
done
[ "$total" -lt "$MAX_TOTAL" ] || die "fixtures total $total bytes"
echo "total $total bytes; took $(( $(date +%s) - started )) s"
