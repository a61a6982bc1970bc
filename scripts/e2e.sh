#!/usr/bin/env bash
# End-to-end test of mcptap: live capture on loopback, a real Prometheus scraping it with the
# shipped alert rules, real MCP traffic (official Python SDK pairs and the scripted incident).
#
#   scripts/e2e.sh            (root: live capture on lo)
#
# Steps: venv + release build; start `mcptap run -i lo` and a throw-away Prometheus (1s
# scrape/evaluation, job "mcptap", alerts/mcptap.rules.yml); drive traffic on loopback:
#   sdk_pair.py --mode sse (healthy, SSE answers)    sdk_pair.py --mode json (healthy, JSON)
#   scenarios.py incident  (narrowing re-initialize, SSE -> JSON; capture port P only)
#   scenarios.py empty_stream (empty SSE tool results)
# then assert on Prometheus' HTTP API (metrics and firing alerts), `promtool check metrics` on a
# live scrape, `dashboards/exprs.py --require-data`, SIGHUP reopening of the events file,
# SIGTERM shutdown (exit 0 within 3 s) and the NDJSON events themselves (and that the
# Authorization header value never leaks). Alert latency: mcptap also writes its events to
# standard output (--events-stdout), where a small reader stamps each line with the wall-clock
# time it arrived; every alert must arrive within 1 s of its packet's timestamp (`ts`).
#
# Prints PASS/FAIL lines and ends with exactly one line `e2e: N passed, M failed`; the exit
# status is non-zero if anything failed. Everything after the build is bounded by E2E_TIMEOUT
# seconds (default 240; every wait has its own, smaller timeout too); the release build has
# its own bound (E2E_BUILD_TIMEOUT, default 1200 s: a cold release build takes minutes on two
# cores). All processes started here are stopped on any exit, by pid.
#
# Environment:
#   E2E_TIMEOUT=240        hard cap in seconds for everything after the build
#   E2E_BUILD_TIMEOUT=1200 bound on `cargo build --release`
#   E2E_KEEP=1             keep the temp dir (logs, events, Prometheus data) and print its path
#   E2E_MCPTAP=PATH        test this mcptap binary instead of building target/release/mcptap
#
# Needs: root, prometheus + promtool (Debian package `prometheus`), curl, jq, python3 >= 3.10
# with venv (scripts/venv.sh), PyPI access the first time.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CAP="${E2E_TIMEOUT:-240}"
BUILD_TIMEOUT="${E2E_BUILD_TIMEOUT:-1200}"
T0=$(date +%s)
BUILD_S=""

PASSED=0
FAILED=0
FAILED_NAMES=()
pass() { echo "PASS: $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL: $1"; FAILED=$((FAILED + 1)); FAILED_NAMES+=("$1"); }
indent() { sed 's/^/    /'; }
log() { echo "--- $* ($(($(date +%s) - T0)) s)"; }

WORK="$(mktemp -d -t mcptap-e2e.XXXXXX)"
MCPTAP_PID=""
PROM_PID=""
WATCHDOG_PID=""
BG_PIDS=()
SUMMARY_DONE=0

# Stop one process we started: SIGTERM, up to 2 s grace, then SIGKILL.
stop_pid() {
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 20); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

show_logs() {
  local f
  for f in "$WORK"/mcptap.err "$WORK"/prometheus.log "$WORK"/traffic-*.out; do
    [ -s "$f" ] || continue
    echo "  --- tail of ${f#"$WORK"/}"
    tail -n 25 "$f" | sed 's/\x1b\[[0-9;]*m//g' | indent
  done
}

summary() {
  [ "$SUMMARY_DONE" = 1 ] && return
  SUMMARY_DONE=1
  if [ "$FAILED" -gt 0 ]; then
    echo "failed checks:"
    printf '  %s\n' "${FAILED_NAMES[@]}"
    show_logs
  fi
  echo "e2e: took $(($(date +%s) - T0)) s${BUILD_S:+ (plus ${BUILD_S} s venv + build)}"
  echo "e2e: $PASSED passed, $FAILED failed"
}

cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  [ -n "$WATCHDOG_PID" ] && kill "$WATCHDOG_PID" 2>/dev/null && wait "$WATCHDOG_PID" 2>/dev/null
  for p in "${BG_PIDS[@]}"; do stop_pid "$p"; done
  stop_pid "$MCPTAP_PID"
  stop_pid "$PROM_PID"
  if [ "${E2E_KEEP:-0}" = 1 ]; then echo "e2e: kept $WORK"; else rm -rf "$WORK"; fi
  summary # last line of output: `e2e: N passed, M failed`
  [ "$FAILED" -gt 0 ] && exit 1
  exit "$rc"
}
trap cleanup EXIT
trap 'fail "interrupted (signal or time cap of ${CAP}s)"; exit 1' INT TERM

# abort REASON: a step the rest depends on failed; record it and stop here.
abort() { fail "$1"; exit 1; }

now_ms() { echo $(($(date +%s%N) / 1000000)); }
DEADLINE_MS=""
# Seconds left before the global cap, at most $1.
bounded() {
  local want=$1 left
  [ -n "$DEADLINE_MS" ] || { echo "$want"; return; }
  left=$(((DEADLINE_MS - $(now_ms)) / 1000))
  [ "$left" -lt 1 ] && left=1
  [ "$left" -lt "$want" ] && want=$left
  echo "$want"
}

# eventually SECONDS NAME CMD...: retry CMD until it succeeds or SECONDS pass (never beyond the
# global cap); PASS or FAIL with the output of its last attempt.
eventually() {
  local secs name end out
  secs=$(bounded "$1"); name=$2; shift 2
  end=$(($(now_ms) + secs * 1000))
  while :; do
    if out=$("$@" 2>&1); then
      pass "$name"
      [ -n "$out" ] && indent <<<"$out"
      return 0
    fi
    [ "$(now_ms)" -ge "$end" ] && break
    sleep 0.5
  done
  fail "$name (after ${secs}s)"
  [ -n "$out" ] && indent <<<"$out"
  return 1
}

# check NAME CMD...: run CMD once; PASS or FAIL with its output.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    pass "$name"
    [ -n "$out" ] && indent <<<"$out"
    return 0
  fi
  fail "$name"
  [ -n "$out" ] && indent <<<"$out"
  return 1
}

# ------------------------------------------------------------------ 0. prerequisites
[ "$(id -u)" = 0 ] || abort "must run as root (live capture on lo)"
missing=()
for c in prometheus promtool curl jq python3 flock; do command -v "$c" >/dev/null || missing+=("$c"); done
[ ${#missing[@]} -eq 0 ] || abort "missing tools: ${missing[*]} (scripts/setup.sh --test)"

# ------------------------------------------------------------------ 1. venv + build
log "venv"
PY="$(scripts/venv.sh)" || abort "scripts/venv.sh"
if [ -n "${E2E_MCPTAP:-}" ]; then
  MCPTAP="$E2E_MCPTAP"
  log "using E2E_MCPTAP=$MCPTAP (no build)"
else
  log "cargo build --release"
  timeout "$BUILD_TIMEOUT" cargo build --release --quiet || abort "cargo build --release"
  MCPTAP="$ROOT/target/release/mcptap"
fi
[ -x "$MCPTAP" ] || abort "no executable $MCPTAP"
BUILD_S=$(($(date +%s) - T0))

# The time cap starts now. The watchdog signals this shell; every long step below runs in the
# background and is waited for with `wait`, which a trapped signal interrupts at once.
DEADLINE_MS=$(($(now_ms) + CAP * 1000))
T0=$(date +%s)
(
  trap 'kill "$sp" 2>/dev/null; exit 0' TERM
  sleep "$CAP" &
  sp=$!
  wait "$sp"
  echo "e2e: time cap of ${CAP}s reached" >&2
  kill -TERM $$ 2>/dev/null
) &
WATCHDOG_PID=$!

# start_bg SECONDS OUTFILE CMD...: start CMD in the background under `timeout` (pid in BG_PID,
# stopped by the EXIT trap if still running).
start_bg() {
  local secs out
  secs=$(bounded "$1"); out=$2; shift 2
  timeout -k 2 "$secs" "$@" >"$out" 2>&1 &
  BG_PID=$!
  BG_PIDS+=("$BG_PID")
}
# run_bg SECONDS OUTFILE CMD...: start_bg and wait; the exit status is CMD's (124 on timeout).
# `wait` is interrupted by the watchdog's signal at once.
run_bg() {
  local rc
  start_bg "$@"
  wait "$BG_PID"; rc=$?
  forget_bg "$BG_PID"
  return $rc
}
# forget_bg PID: it has been waited for; never signal that pid again (it may be reused).
forget_bg() {
  local p keep=()
  for p in "${BG_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  BG_PIDS=("${keep[@]}")
}
# jqc JQ-ARGS...: a jq program that prints description lines (-r) and finally true/false; prints
# the descriptions, succeeds if the last line is `true`.
jqc() {
  local out
  out=$(jq -r "$@") || { echo "$out"; return 1; }
  [ "$(wc -l <<<"$out")" -gt 1 ] && head -n -1 <<<"$out"
  [ "$(tail -n 1 <<<"$out")" = true ]
}

# ------------------------------------------------------------------ ports
# Eight consecutive free loopback ports, below the ephemeral range:
#   B sse, B+1 json, B+2 incident proxy (B+3 its upstream server, not captured), B+4 empty_stream,
#   B+5 post-SIGHUP traffic, B+6 mcptap metrics, B+7 Prometheus.
BASE=$(python3 - <<'EOF'
import random, socket, sys
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(100):
    b = random.randrange(20000, 29990)
    if all(free(b + i) for i in range(8)):
        print(b); sys.exit(0)
sys.exit(1)
EOF
) || abort "no free ports"
P_SSE=$BASE; P_JSON=$((BASE + 1)); P_INC=$((BASE + 2)); P_EMPTY=$((BASE + 4)); P_HUP=$((BASE + 5))
P_METRICS=$((BASE + 6)); P_PROM=$((BASE + 7))
S_SSE="127.0.0.1:$P_SSE"; S_JSON="127.0.0.1:$P_JSON"; S_INC="127.0.0.1:$P_INC"
S_EMPTY="127.0.0.1:$P_EMPTY"; S_HUP="127.0.0.1:$P_HUP"
MURL="http://127.0.0.1:$P_METRICS"
PROM="http://127.0.0.1:$P_PROM"
echo "ports: sse $P_SSE, json $P_JSON, incident $P_INC (upstream $((P_INC + 1))), empty_stream $P_EMPTY," \
     "sighup $P_HUP, metrics $P_METRICS, prometheus $P_PROM; temp dir $WORK"

# ------------------------------------------------------------------ 2. mcptap
log "start mcptap"
EVENTS="$WORK/events.ndjson"
FILTER="tcp port $P_SSE or tcp port $P_JSON or tcp port $P_INC or tcp port $P_EMPTY or tcp port $P_HUP"
# mcptap's standard output (--events-stdout) goes through a FIFO to a reader that writes each
# line prefixed with the wall-clock time it arrived (`epoch_ns<TAB>line`): the alert latency
# check compares that with the event's packet timestamp. The reader ends when mcptap does.
STAMPED="$WORK/events-stdout.tsv"
mkfifo "$WORK/events-stdout.fifo" || abort "mkfifo"
python3 -c '
import sys, time
out = sys.stdout.buffer
for line in iter(sys.stdin.buffer.readline, b""):
    out.write(b"%d\t" % time.time_ns() + line)
    out.flush()
' <"$WORK/events-stdout.fifo" >"$STAMPED" 2>"$WORK/stamper.err" &
STAMPER_PID=$!
BG_PIDS+=("$STAMPER_PID")
"$MCPTAP" run -i lo -f "$FILTER" --listen "127.0.0.1:$P_METRICS" --events "$EVENTS" --events-stdout \
  >"$WORK/events-stdout.fifo" 2>"$WORK/mcptap.err" &
MCPTAP_PID=$!

http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1"; }
readyz_200() { local c; c=$(http_code "$MURL/readyz"); echo "readyz: $c"; [ "$c" = 200 ] || { kill -0 "$MCPTAP_PID" 2>/dev/null || echo "mcptap exited"; return 1; }; }
eventually 15 "mcptap /readyz returns 200" readyz_200 || abort "mcptap did not become ready"
healthz_200() { local c; c=$(http_code "$MURL/healthz"); echo "healthz: $c"; [ "$c" = 200 ]; }
check "mcptap /healthz returns 200" healthz_200

# ------------------------------------------------------------------ 3. Prometheus
log "start prometheus"
mkdir -p "$WORK/prom/data"
# Test copy of the rules: every `for:` is reduced to 0s so that an alert that would fire
# (or is pending) in the seconds this test runs is visible as firing; the real `for:`
# durations (McpEmptyToolResults 5m, McptapReassemblyGaps 5m, McptapTargetDown 2m,
# McptapNoPackets 2m) are covered by the promtool unit tests (alerts/mcptap.rules.test.yml).
# The exprs themselves are used unchanged.
sed -E 's/^([[:space:]]*for:[[:space:]]*)[0-9]+[smhdwy]+[[:space:]]*$/\10s/' \
  alerts/mcptap.rules.yml >"$WORK/prom/mcptap.rules.yml"
cat >"$WORK/prom/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $WORK/prom/mcptap.rules.yml
scrape_configs:
  - job_name: mcptap
    static_configs:
      - targets: ["127.0.0.1:$P_METRICS"]
EOF
check "promtool check config (rules: for: reduced to 0s)" \
  promtool check config "$WORK/prom/prometheus.yml" || abort "prometheus config"

# The McpCapabilityNarrowing / McpContentTypeDivergence / McpCapabilityWidening rules catch a
# counter series whose FIRST sample is already 1 (server first seen and alerted within one
# scrape: the incident scenario does both within ~100 ms) only if Prometheus was already
# scraping the target 5 minutes earlier (`and on(job, instance) (up offset 5m)`), so that a
# freshly started Prometheus does not page for old events. A production Prometheus has that
# history; this throw-away one gets it by backfilling `up{job="mcptap", instance=...} 1` for
# the last 10 minutes (scripts/prom-backfill.sh: promtool tsdb create-blocks-from openmetrics) before it starts. The
# alerts then fire whichever branch of the rule applies, without depending on scrape timing.
python3 - "$P_METRICS" >"$WORK/prom/up-history.om" <<'EOF'
import sys, time
now = int(time.time())
for t in range(now - 600, now - 2, 5):
    print(f'up{{job="mcptap",instance="127.0.0.1:{sys.argv[1]}"}} 1 {t}')
print("# EOF")
EOF
check "backfill up{job=\"mcptap\"} history (10 min)" \
  timeout 30 scripts/prom-backfill.sh "$WORK/prom/up-history.om" "$WORK/prom/data" \
  || abort "backfill"

prometheus --config.file="$WORK/prom/prometheus.yml" --storage.tsdb.path="$WORK/prom/data" \
  --web.listen-address="127.0.0.1:$P_PROM" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
prom_ready() { local c; c=$(http_code "$PROM/-/ready"); echo "/-/ready: $c"; [ "$c" = 200 ]; }
eventually 30 "prometheus ready" prom_ready || abort "prometheus did not start"

# The target's health from the targets API (not `up`: that is backfilled).
target_up() {
  local t
  t=$(curl -fsS --max-time 3 "$PROM/api/v1/targets") || { echo "targets query failed"; return 1; }
  jqc --arg t "127.0.0.1:$P_METRICS" '[.data.activeTargets[] | select(.labels.job == "mcptap" and .labels.instance == $t)]
      | (.[] | "target \(.scrapeUrl): \(.health) \(.lastError)"), (length == 1 and .[0].health == "up")' <<<"$t"
}
eventually 30 "prometheus scrapes mcptap (job mcptap, target up)" target_up || abort "target not up"
rules_loaded() {
  local r
  r=$(curl -fsS --max-time 3 "$PROM/api/v1/rules") || { echo "rules query failed"; return 1; }
  # health is "unknown" until the first evaluation, then "ok" or "err".
  jqc '[.data.groups[].rules[] | select(.type == "alerting")] as $r
       | [$r[] | select(.health != "ok")] as $bad
       | "\($r | length) alerting rules, \($bad | length) not ok: \($bad | map("\(.name): \(.health) \(.lastError // "")"))",
         (($r | length) >= 8 and ($bad | length) == 0)' <<<"$r"
}
eventually 15 "prometheus loaded alerts/mcptap.rules.yml (all rules healthy)" rules_loaded

# ------------------------------------------------------------------ 4. traffic
log "traffic"
# All four at once (different ports, independent sessions).
start_bg 60 "$WORK/traffic-sdk-sse.out" "$PY" scripts/fixtures/sdk_pair.py --mode sse --port "$P_SSE"
T_SSE=$BG_PID
start_bg 60 "$WORK/traffic-sdk-json.out" "$PY" scripts/fixtures/sdk_pair.py --mode json --port "$P_JSON"
T_JSON=$BG_PID
start_bg 60 "$WORK/traffic-incident.out" "$PY" scripts/fixtures/scenarios.py incident --port "$P_INC"
T_INC=$BG_PID
start_bg 60 "$WORK/traffic-empty-stream.out" "$PY" scripts/fixtures/scenarios.py empty_stream --port "$P_EMPTY"
T_EMPTY=$BG_PID
for pair in "sdk_pair.py --mode sse:$T_SSE" "sdk_pair.py --mode json:$T_JSON" \
            "scenarios.py incident:$T_INC" "scenarios.py empty_stream:$T_EMPTY"; do
  wait "${pair##*:}"; rc=$?
  forget_bg "${pair##*:}"
  if [ "$rc" = 0 ]; then pass "traffic: ${pair%:*} exited 0"; else fail "traffic: ${pair%:*} exited $rc (124: timeout)"; fi
done

# ------------------------------------------------------------------ 5. Prometheus assertions
log "prometheus assertions"
# q EXPR: the result vector of an instant query, as compact JSON.
q() { curl -fsS --max-time 5 -G "$PROM/api/v1/query" --data-urlencode "query=$1" | jq -ce '.data.result'; }
# v EXPR: the value of a single-series result, "absent" for none.
v() {
  q "$1" | jq -r 'if length == 0 then "absent" elif length > 1 then "multiple series: \(map(.metric))" else .[0].value[1] end'
}
J='job="mcptap"'
# expect EXPR OP WANT: OP is eq (numeric equality), gt, or none (0 or absent).
expect() {
  local expr=$1 op=$2 want=${3:-} got
  got=$(v "$expr") || { echo "query failed: $expr"; return 1; }
  echo "$expr = $got"
  case "$op" in
    eq) [ "$got" != absent ] && awk -v a="$got" -v b="$want" 'BEGIN { exit !(a + 0 == b + 0) }' ;;
    gt) [ "$got" != absent ] && awk -v a="$got" -v b="$want" 'BEGIN { exit !(a + 0 > b + 0) }' ;;
    none) [ "$got" = absent ] || awk -v a="$got" 'BEGIN { exit !(a + 0 == 0) }' ;;
  esac
}
# all_of CMD... ; CMD... : each ;-separated command must succeed (all are run, for the output).
all_of() {
  local rc=0 cmd=()
  for a in "$@" ";"; do
    if [ "$a" = ";" ]; then
      [ ${#cmd[@]} -gt 0 ] && { "${cmd[@]}" || rc=1; }
      cmd=()
    else
      cmd+=("$a")
    fi
  done
  return $rc
}

# Wait until Prometheus has a scrape in which mcptap had processed all traffic: every session
# ended (each generator ends with DELETE). Every counter below is final from then on, so the
# "0 or absent" checks cannot pass just because a scrape was early.
eventually 30 "all traffic processed: one ended session per server, none active" all_of \
  expect "sum(mcptap_sessions_ended_total{$J,server=\"$S_SSE\"})" eq 1 \; \
  expect "sum(mcptap_sessions_ended_total{$J,server=\"$S_JSON\"})" eq 1 \; \
  expect "sum(mcptap_sessions_ended_total{$J,server=\"$S_INC\"})" eq 1 \; \
  expect "sum(mcptap_sessions_ended_total{$J,server=\"$S_EMPTY\"})" eq 1 \; \
  expect "sum(mcptap_sessions_active{$J})" none \; \
  expect "sum(mcptap_flows_active{$J})" none
eventually 10 "packets counted (mcptap_packets_total > 100)" \
  expect "sum(mcptap_packets_total{$J})" gt 100
eventually 20 "handshakes: one initial accepted handshake per server (sse, json, incident, empty_stream)" all_of \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_SSE\",kind=\"initial\",outcome=\"accepted\"})" eq 1 \; \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_JSON\",kind=\"initial\",outcome=\"accepted\"})" eq 1 \; \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_INC\",kind=\"initial\",outcome=\"accepted\"})" eq 1 \; \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_EMPTY\",kind=\"initial\",outcome=\"accepted\"})" eq 1
eventually 20 "handshakes: the incident's re-initialize (accepted), none on the healthy servers" all_of \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_INC\",kind=\"reinitialize\",outcome=\"accepted\"})" eq 1 \; \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_SSE\",kind=\"reinitialize\"})" none \; \
  expect "sum(mcptap_handshakes_total{$J,server=\"$S_JSON\",kind=\"reinitialize\"})" none
eventually 20 "sessions started: one per server" all_of \
  expect "sum(mcptap_sessions_started_total{$J,server=\"$S_SSE\"})" eq 1 \; \
  expect "sum(mcptap_sessions_started_total{$J,server=\"$S_JSON\"})" eq 1 \; \
  expect "sum(mcptap_sessions_started_total{$J,server=\"$S_INC\"})" eq 1 \; \
  expect "sum(mcptap_sessions_started_total{$J,server=\"$S_EMPTY\"})" eq 1
eventually 20 "alerts_total{kind=capability_narrowing}: 1 for incident, 0/absent for the SDK servers" all_of \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_INC\",kind=\"capability_narrowing\"})" eq 1 \; \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_SSE\",kind=\"capability_narrowing\"})" none \; \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_JSON\",kind=\"capability_narrowing\"})" none \; \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_EMPTY\",kind=\"capability_narrowing\"})" none
eventually 20 "alerts_total{kind=content_type_divergence}: 1 for incident, 0/absent elsewhere" all_of \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_INC\",kind=\"content_type_divergence\"})" eq 1 \; \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_SSE\",kind=\"content_type_divergence\"})" none \; \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_JSON\",kind=\"content_type_divergence\"})" none \; \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_EMPTY\",kind=\"content_type_divergence\"})" none
eventually 20 "no alerts of any kind counted for the SDK servers" all_of \
  expect "sum(mcptap_alerts_total{$J,server=~\"$S_SSE|$S_JSON\"})" none \; \
  expect "sum(mcptap_capability_changes_total{$J,server=~\"$S_SSE|$S_JSON\"})" none \; \
  expect "sum(mcptap_empty_tool_results_total{$J,server=~\"$S_SSE|$S_JSON\"})" none
eventually 20 "tool_calls_total media types: sse for SDK sse, json for SDK json, both for incident" all_of \
  expect "sum(mcptap_tool_calls_total{$J,server=\"$S_SSE\",media_type=\"sse\"})" gt 0 \; \
  expect "sum(mcptap_tool_calls_total{$J,server=\"$S_SSE\",media_type!=\"sse\"})" none \; \
  expect "sum(mcptap_tool_calls_total{$J,server=\"$S_JSON\",media_type=\"json\"})" gt 0 \; \
  expect "sum(mcptap_tool_calls_total{$J,server=\"$S_JSON\",media_type!=\"json\"})" none \; \
  expect "sum(mcptap_tool_calls_total{$J,server=\"$S_INC\",media_type=\"sse\"})" gt 0 \; \
  expect "sum(mcptap_tool_calls_total{$J,server=\"$S_INC\",media_type=\"json\"})" gt 0
eventually 20 "empty_stream: 3 empty_tool_result alerts (no_events, only_priming, only_notifications)" all_of \
  expect "sum(mcptap_alerts_total{$J,server=\"$S_EMPTY\",kind=\"empty_tool_result\"})" eq 3 \; \
  expect "sum(mcptap_empty_tool_results_total{$J,server=\"$S_EMPTY\",reason=\"no_events\"})" eq 1 \; \
  expect "sum(mcptap_empty_tool_results_total{$J,server=\"$S_EMPTY\",reason=\"only_priming\"})" eq 1 \; \
  expect "sum(mcptap_empty_tool_results_total{$J,server=\"$S_EMPTY\",reason=\"only_notifications\"})" eq 1
eventually 20 "request_duration_seconds: tools/call latencies observed on every server" all_of \
  expect "sum(mcptap_request_duration_seconds_count{$J,server=\"$S_SSE\",method=\"tools/call\"})" gt 0 \; \
  expect "sum(mcptap_request_duration_seconds_count{$J,server=\"$S_JSON\",method=\"tools/call\"})" gt 0 \; \
  expect "sum(mcptap_request_duration_seconds_count{$J,server=\"$S_INC\",method=\"tools/call\"})" gt 0 \; \
  expect "sum(mcptap_request_duration_seconds_bucket{$J,server=\"$S_SSE\",method=\"tools/call\",le=\"+Inf\"})" gt 0
eventually 10 "capture health: no drops, no TCP gaps, no parse errors" all_of \
  expect "sum(mcptap_capture_drops_total{$J})" none \; \
  expect "sum(mcptap_tcp_gaps_total{$J})" none \; \
  expect "sum(mcptap_http_parse_errors_total{$J})" none \; \
  expect "sum(mcptap_jsonrpc_parse_errors_total{$J})" none

# Alerts from /api/v1/alerts.
alerts() { curl -fsS --max-time 5 "$PROM/api/v1/alerts" | jq -ce '.data.alerts'; }
alert_firing() { # ALERTNAME SERVER
  local a
  a=$(alerts) || { echo "alerts query failed"; return 1; }
  jq -r '.[] | "\(.state) \(.labels.alertname) server=\(.labels.server // "-") job=\(.labels.job // "-") instance=\(.labels.instance // "-") severity=\(.labels.severity // "-")"' <<<"$a"
  jq -e --arg n "$1" --arg s "$2" --arg i "127.0.0.1:$P_METRICS" \
    'any(.[]; .labels.alertname == $n and .state == "firing" and .labels.server == $s
              and .labels.job == "mcptap" and .labels.instance == $i and .labels.severity == "critical")' <<<"$a" >/dev/null
}
eventually 30 "alert McpCapabilityNarrowing firing for the incident server ($S_INC)" \
  alert_firing McpCapabilityNarrowing "$S_INC"
eventually 15 "alert McpContentTypeDivergence firing for the incident server ($S_INC)" \
  alert_firing McpContentTypeDivergence "$S_INC"
# Negative checks: a few more evaluations after the positive ones, then nothing may be pending
# or firing for the healthy servers, and nothing unexpected anywhere (allowed: the two incident
# alerts, and McpEmptyToolResult(s) for the empty_stream server, which sits at its threshold).
sleep 3
no_unexpected_alerts() {
  local a
  a=$(alerts) || { echo "alerts query failed"; return 1; }
  jq -r --arg sse "$S_SSE" --arg json "$S_JSON" --arg inc "$S_INC" --arg empty "$S_EMPTY" '
    def allowed:
      ((.labels.alertname == "McpCapabilityNarrowing" or .labels.alertname == "McpContentTypeDivergence")
        and .labels.server == $inc)
      or ((.labels.alertname == "McpEmptyToolResults" or .labels.alertname == "McpEmptyToolResult")
          and .labels.server == $empty);
    .[] | select(.labels.server == $sse or .labels.server == $json or (allowed | not))
    | "unexpected: \(.state) \(.labels.alertname) \(.labels | del(.alertname))"' <<<"$a" | grep . && return 1
  echo "$(jq length <<<"$a") alerts active, none for $S_SSE / $S_JSON, none unexpected"
}
check "no alert pending/firing for the healthy SDK servers, none unexpected" no_unexpected_alerts

# ------------------------------------------------------------------ 6. promtool check metrics
log "promtool check metrics"
promtool_metrics() {
  curl -fsS --max-time 5 "$MURL/metrics" >"$WORK/scrape.txt" || { echo "scrape failed"; return 1; }
  local out rc
  out=$(timeout 20 promtool check metrics <"$WORK/scrape.txt" 2>&1); rc=$?
  echo "$(grep -vc '^#' "$WORK/scrape.txt") samples scraped; promtool exit $rc"
  [ -n "$out" ] && echo "$out"
  [ "$rc" = 0 ] && [ -z "$out" ]
}
check "promtool check metrics on a live /metrics scrape" promtool_metrics

# ------------------------------------------------------------------ 7. dashboard exprs
log "dashboards/exprs.py"
if run_bg 90 "$WORK/exprs.out" python3 dashboards/exprs.py --prometheus "$PROM" --require-data; then
  pass "dashboards/exprs.py --require-data: every expr parses, required ones have data"
  tail -n 3 "$WORK/exprs.out" | indent
else
  fail "dashboards/exprs.py --require-data"
  tail -n 40 "$WORK/exprs.out" | indent
fi

# ------------------------------------------------------------------ 8. SIGHUP reopen
log "SIGHUP"
ROTATED="$WORK/events.rotated.ndjson"
if mv "$EVENTS" "$ROTATED" 2>/dev/null; then
  kill -HUP "$MCPTAP_PID"
  reopened() {
    grep -q 'events file reopened' "$WORK/mcptap.err" || { echo "no 'events file reopened' in the log"; return 1; }
    [ -e "$EVENTS" ] || { echo "no new $EVENTS"; return 1; }
  }
  eventually 10 "SIGHUP: mcptap reopens the events file (logged, new file created)" reopened
  if run_bg 60 "$WORK/traffic-sighup.out" "$PY" scripts/fixtures/sdk_pair.py --mode json --port "$P_HUP"; then
    pass "traffic after SIGHUP: sdk_pair.py --mode json exited 0"
  else
    fail "traffic after SIGHUP: sdk_pair.py --mode json failed"
  fi
  new_file_has_events() {
    [ -s "$EVENTS" ] || { echo "new events file empty or missing"; return 1; }
    echo "new file: $(wc -l <"$EVENTS") events"
    jq -se --arg s "$S_HUP" 'any(.[]; .event == "handshake" and .server == $s)
                             and any(.[]; .event == "session_end" and .server == $s)' "$EVENTS" >/dev/null
  }
  eventually 15 "SIGHUP: post-SIGHUP session (handshake + session_end) written to the new events file" new_file_has_events
  check "SIGHUP: nothing of the post-SIGHUP session went to the moved-away file" \
    bash -c "! grep -qF '\"server\":\"$S_HUP\"' '$ROTATED'"
else
  fail "SIGHUP: events file $EVENTS missing, cannot rotate"
fi

# ------------------------------------------------------------------ 9. SIGTERM
log "SIGTERM"
check "mcptap still running before SIGTERM" kill -0 "$MCPTAP_PID"
kill -TERM "$MCPTAP_PID" 2>/dev/null
t_term=$(now_ms)
while kill -0 "$MCPTAP_PID" 2>/dev/null && [ $(($(now_ms) - t_term)) -lt 3000 ]; do sleep 0.05; done
if kill -0 "$MCPTAP_PID" 2>/dev/null; then
  fail "SIGTERM: mcptap still running after 3 s"
  stop_pid "$MCPTAP_PID"
else
  wait "$MCPTAP_PID"; rc=$?
  if [ "$rc" = 0 ]; then
    pass "SIGTERM: mcptap exited 0 after $(($(now_ms) - t_term)) ms"
  else
    fail "SIGTERM: mcptap exit status $rc"
  fi
fi
MCPTAP_PID=""
check "SIGTERM: summary printed on stderr" grep -q '^mcptap summary:' "$WORK/mcptap.err"
no_errors_logged() {
  ! sed 's/\x1b\[[0-9;]*m//g' "$WORK/mcptap.err" | grep -E 'panicked|ERROR'
}
check "mcptap logged no panic and no ERROR" no_errors_logged

# ------------------------------------------------------------------ events files
log "events"
ALL_EVENTS="$WORK/all-events.ndjson"
cat "$ROTATED" "$EVENTS" >"$ALL_EVENTS" 2>/dev/null
check "events: every line is a JSON object with event, ts, session_id (null only in the totals)" \
  jqc -s 'length as $n | "\($n) events (moved-away + new file)",
          (all(.[]; type == "object" and (.event | type) == "string" and (.ts | type) == "string"
                   and ((.session_id | type) == "string" or (.event == "summary" or .event == "stats")))
           and $n > 0)' "$ALL_EVENTS"
check "events: one summary, the last line, counting the alerts and no drops" \
  jqc -s '([.[] | select(.event == "alert")] | length) as $alerts
          | [.[] | select(.event == "summary")] as $s
          | "\($s | length) summary; alerts written \($alerts), counted \($s[0].alerts | add)",
            ($s | length == 1) and (.[-1].event == "summary") and ($s[0].alerts | add) == $alerts
            and $s[0].capture_drops == 0 and $s[0].packets > 0' "$ALL_EVENTS"
events_handshakes() {
  jqc -s --arg sse "$S_SSE" --arg json "$S_JSON" --arg inc "$S_INC" --arg empty "$S_EMPTY" --arg hup "$S_HUP" '
    def hs($s): [.[] | select(.event == "handshake" and .server == $s)];
    [hs($sse), hs($json), hs($inc), hs($empty), hs($hup)] as $all
    | ($all | map(map("\(.session_id)#\(.seq)") | join(","))) as $desc
    | "handshakes (session#seq) sse: \($desc[0]); json: \($desc[1]); incident: \($desc[2]); empty_stream: \($desc[3]); sighup: \($desc[4])",
      (
        (hs($sse) | length == 1 and .[0].seq == 1)
        and (hs($json) | length == 1 and .[0].seq == 1)
        and (hs($inc) | map(.seq) == [1, 2] and (map(.session_id) | unique | length == 1))
        and (hs($empty) | length == 1 and .[0].seq == 1)
        and (hs($hup) | length == 1 and .[0].seq == 1)
        and all(.[] | select(.event == "handshake"); (.seq | type) == "number")
        and ([$all[][0].session_id] | unique | length == 5)
      )' "$ALL_EVENTS"
}
check "events: handshake events with seq for every session (incident: seq 1 and 2 on one session)" events_handshakes
events_alerts() {
  jqc -s --arg inc "$S_INC" --arg empty "$S_EMPTY" '
    ([.[] | select(.event == "handshake" and .server == $inc) | .session_id] | first) as $isid
    | [.[] | select(.event == "alert")] as $a
    | ($a | map("\(.kind)@\(.server)/\(.session_id)") | group_by(.) | map("\(.[0]) x\(length)") | join(", ")) as $desc
    | "alerts: \($desc)",
      (
        ($a | map(select(.kind == "capability_narrowing")) | length == 1 and all(.[]; .session_id == $isid and .server == $inc))
        and ($a | map(select(.kind == "content_type_divergence")) | length >= 1 and all(.[]; .session_id == $isid and .server == $inc))
        and ($a | map(select(.kind == "empty_tool_result")) | length == 3 and all(.[]; .server == $empty))
        and ($a | all(.[]; .server == $inc or .server == $empty))
        and ($a | all(.[]; .server != $inc or .kind == "capability_narrowing" or .kind == "content_type_divergence"))
      )' "$ALL_EVENTS"
}
check "events: capability_narrowing + content_type_divergence only for the incident session, no alerts for healthy sessions" events_alerts
check "events: session_end for every session" \
  jqc -s '([.[] | select(.event == "handshake") | .session_id] | unique) as $h
          | ([.[] | select(.event == "session_end") | .session_id] | unique) as $e
          | "\($h | length) sessions, \($e | length) ended", ($h - $e | length == 0)' "$ALL_EVENTS"
no_secret() {
  local f hit=0
  for f in "$ROTATED" "$EVENTS" "$STAMPED" "$WORK/mcptap.err" "$WORK/scrape.txt"; do
    [ -e "$f" ] || continue
    if grep -qF fixture-secret-token "$f"; then echo "found in ${f#"$WORK"/}"; hit=1; fi
  done
  # Sanity: both generators still send `Authorization: Bearer fixture-secret-token` on every
  # request, so the token really was on the wire and this check means something.
  for f in scripts/fixtures/scenarios.py scripts/fixtures/sdk_pair.py; do
    grep -qF fixture-secret-token "$f" || { echo "$f no longer sends the token"; hit=1; }
  done
  return $hit
}
check "events/logs/metrics never contain the Authorization token (fixture-secret-token)" no_secret

# Alert latency (live mode): each alert event must reach the events output within 1 s of the
# packet that caused it. `ts` is that packet's capture timestamp (kernel, wall clock); the
# arrival time is when the line came out of mcptap's standard output (stamped by the reader),
# so this bounds capture batching + pipeline + flush + pipe. mcptap has exited by now: the
# reader has (or soon has) seen end of file.
for _ in $(seq 30); do kill -0 "$STAMPER_PID" 2>/dev/null || break; sleep 0.1; done
alert_latency() {
  python3 - "$STAMPED" "$ALL_EVENTS" <<'EOF'
import datetime, json, statistics, sys
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
def ns(ts):  # RFC 3339, UTC, microseconds -> epoch ns (exact, no float)
    t = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return (t - EPOCH) // datetime.timedelta(microseconds=1) * 1000
rows = []
for raw in open(sys.argv[1], encoding="utf-8"):
    arrival, _, line = raw.rstrip("\n").partition("\t")
    ev = json.loads(line)
    if ev.get("event") == "alert":
        rows.append((ev["kind"], ev.get("server"), (int(arrival) - ns(ev["ts"])) / 1e6))
in_files = sum(1 for l in open(sys.argv[2], encoding="utf-8") if json.loads(l).get("event") == "alert")
for kind, server, ms in rows:
    print(f"{kind} @ {server}: {ms:.1f} ms")
lat = [ms for _, _, ms in rows]
if lat:
    print(f"{len(lat)} alerts on stdout ({in_files} in the events files): latency min {min(lat):.1f} ms,"
          f" median {statistics.median(lat):.1f} ms, max {max(lat):.1f} ms (limit 1000 ms)")
else:
    print(f"no alert on stdout ({in_files} in the events files)")
# >= 5: narrowing + divergence (incident) + 3 empty results; -100 ms: clock sanity margin.
ok = len(lat) >= 5 and len(lat) == in_files and all(-100 <= ms <= 1000 for ms in lat)
sys.exit(0 if ok else 1)
EOF
}
check "latency: every alert reached the events output within 1 s of its packet (ts)" alert_latency

exit 0
