#!/usr/bin/env bash
# Checks the mcptap operations files: alerts/, dashboards/, systemd/.
#
#   bash scripts/check-ops.sh
#
# Runs on a fresh Debian (12+) machine or container as root, without systemd as PID 1; installs
# what it needs (prometheus/promtool, systemd for systemd-analyze, jq, logrotate, python3).
# Every check runs even if an earlier one failed; the exit status is non-zero if any failed.
#
# Environment:
#   CHECK_OPS_MAX_EXPOSURE   highest acceptable `systemd-analyze security` score (default 2.0)
#   CHECK_OPS_SKIP_LIVE=1    skip the checks against a live, throw-away Prometheus
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MAX_EXPOSURE="${CHECK_OPS_MAX_EXPOSURE:-2.0}"
UNIT=systemd/mcptap.service
RULES=alerts/mcptap.rules.yml
RULE_TESTS=alerts/mcptap.rules.test.yml
DASH=dashboards/mcptap.json

WORK="$(mktemp -d -t check-ops.XXXXXX)"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
PROM_URL=
trap cleanup EXIT

PASSED=0
FAILED=0
FAILED_NAMES=()
# check NAME CMD...: run one check, record the result, never abort the script.
check() {
    local name="$1"; shift
    echo "=== $name"
    if "$@"; then
        echo "--- ok: $name"
        PASSED=$((PASSED + 1))
    else
        echo "--- FAILED: $name"
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("$name")
    fi
}

# ------------------------------------------------------------------ dependencies
APT_UPDATED=0
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ "$(id -u)" != 0 ]; then
        echo "missing packages ($*) and not root: install them first" >&2
        return 1
    fi
    # `apt-get update` only when needed: no package lists yet, or the install failed with the
    # lists we have.
    if [ "$APT_UPDATED" = 0 ] && ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
        apt-get update -qq && APT_UPDATED=1
    fi
    if ! apt-get install -y -qq --no-install-recommends "$@"; then
        [ "$APT_UPDATED" = 1 ] && return 1
        apt-get update -qq && APT_UPDATED=1
        apt-get install -y -qq --no-install-recommends "$@"
    fi
}

PY=python3
ensure_tools() {
    local missing=() cmd pkg
    for pair in promtool:prometheus prometheus:prometheus systemd-analyze:systemd jq:jq \
                logrotate:logrotate python3:python3; do
        cmd="${pair%%:*}"; pkg="${pair##*:}"
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    done
    # /bin/kill (procps) is the unit's ExecReload binary; bash's builtin kill does not count.
    [ -x /bin/kill ] || missing+=(procps)
    if [ "${#missing[@]}" -gt 0 ]; then
        # shellcheck disable=SC2046
        apt_install $(printf '%s\n' "${missing[@]}" | sort -u) || return 1
    fi
    # The YAML checks need PyYAML. If the python3 on PATH (e.g. a pyenv one) lacks it, use
    # Debian's python3 with python3-yaml.
    if ! python3 -c 'import yaml' 2>/dev/null; then
        if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
            apt_install python3-yaml || return 1
        fi
        PY=/usr/bin/python3
    fi
    echo "promtool:        $(promtool --version 2>&1 | head -n1)"
    echo "systemd-analyze: $(systemd-analyze --version | head -n1)"
    echo "jq:              $(jq --version)"
    echo "python3:         $($PY --version 2>&1) ($PY)"
}

# ------------------------------------------------------------------ alerts
promtool_check_rules() { promtool check rules "$RULES"; }
promtool_test_rules() { promtool test rules "$RULE_TESTS"; }

# Every alert named in the brief exists, with severity and summary/description/runbook, and
# every one has at least one firing and one quiet case in the unit tests.
rules_contract() {
    "$PY" - "$RULES" "$RULE_TESTS" <<'EOF'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
want = {"McpCapabilityNarrowing": "critical", "McpContentTypeDivergence": "critical",
        "McpEmptyToolResults": "warning", "McpEmptyToolResult": "warning",
        "McpCapabilityWidening": "warning",
        "McptapCaptureDrops": None, "McptapReassemblyGaps": None,
        "McptapTargetDown": None, "McptapNoPackets": None,
        "McptapUndecodableTraffic": "warning", "McptapLimitsHit": "warning",
        "McptapFlowsEvicted": "warning", "McptapSnapshotSaveFailing": "warning"}
bad = []
groups = {g["name"]: g for g in rules["groups"]}
if "mcptap" not in groups:
    bad.append("no rule group named mcptap")
got = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
for name, sev in want.items():
    r = got.get(name)
    if r is None:
        bad.append(f"{name}: missing"); continue
    s = r.get("labels", {}).get("severity")
    if s not in ("critical", "warning", "info") or (sev and s != sev):
        bad.append(f"{name}: severity {s!r}, want {sev or 'critical|warning|info'}")
    for a in ("summary", "description", "runbook"):
        if not r.get("annotations", {}).get(a, "").strip():
            bad.append(f"{name}: annotation {a} missing")
fires, quiet = set(), set()
for t in tests["tests"]:
    for c in t.get("alert_rule_test", []):
        (fires if c.get("exp_alerts") else quiet).add(c["alertname"])
for name in got:
    if name not in fires: bad.append(f"{name}: no test case where it fires")
    if name not in quiet: bad.append(f"{name}: no test case where it stays quiet")
for b in bad: print("  " + b)
print(f"  {len(got)} alerts; tests: {len(fires)} with firing cases, {len(quiet)} with quiet cases")
sys.exit(1 if bad else 0)
EOF
}

# The jq one-liners in the runbooks must at least compile (templates rendered with dummy labels).
runbook_jq_compiles() {
    "$PY" - "$RULES" > "$WORK/jq-programs" <<'EOF' || return 1
import re, sys, yaml, json
rules = yaml.safe_load(open(sys.argv[1]))
n = 0
for g in rules["groups"]:
    for r in g["rules"]:
        for line in r.get("annotations", {}).get("runbook", "").splitlines():
            line = re.sub(r"\{\{[^}]*\}\}", "X", line)
            for m in re.finditer(r"\bjq -c((?: --arg \w+ '[^']*')*) '([^']*)'", line):
                args = re.findall(r"--arg (\w+) '([^']*)'", m.group(1))
                print(json.dumps({"alert": r["alert"], "args": args, "program": m.group(2)}))
                n += 1
if n == 0:
    sys.exit("no jq commands found in runbooks")
EOF
    local rc=0 line alert prog args
    while IFS= read -r line; do
        alert=$(jq -r .alert <<<"$line")
        prog=$(jq -r .program <<<"$line")
        mapfile -t args < <(jq -r '.args[] | "--arg", .[0], .[1]' <<<"$line")
        if ! jq -n "${args[@]}" "$prog" >/dev/null 2>"$WORK/jq-err"; then
            echo "  $alert: jq program does not compile: $prog"; sed 's/^/    /' "$WORK/jq-err"; rc=1
        fi
    done < "$WORK/jq-programs"
    echo "  $(wc -l < "$WORK/jq-programs") runbook jq programs compile"
    return $rc
}

# ------------------------------------------------------------------ dashboard
dashboard_json() {
    jq -e . "$DASH" >/dev/null || { echo "  not valid JSON"; return 1; }
    local errs
    errs=$(jq -r '
      def panels: .panels[]? | (., (.panels[]?));
      [
        (if .uid != "mcptap-overview" then "uid is \(.uid), want mcptap-overview" else empty end),
        (if .id != null then "id must be null" else empty end),
        (if (.schemaVersion // 0) < 36 then "schemaVersion \(.schemaVersion) too old" else empty end),
        (if ([.templating.list[]? | select(.name == "datasource" and .type == "datasource"
                                            and .query == "prometheus")] | length) != 1
           then "no datasource variable (name datasource, type datasource, query prometheus)" else empty end),
        (.templating.list[]? | select(.name == "server")
           | if (.multi != true or .includeAll != true) then "server variable must be multi + includeAll"
             elif ((.definition // "") | test("label_values\\(\\s*mcptap_handshakes_total\\s*,\\s*server\\s*\\)") | not)
               then "server variable must be label_values(mcptap_handshakes_total, server)"
             elif .datasource.uid != "${datasource}" then "server variable datasource must be ${datasource}"
             else empty end),
        (if ([.templating.list[]? | select(.name == "server")] | length) != 1 then "no server variable" else empty end),
        ([panels | .id] | if length != (unique | length) then "duplicate panel ids" else empty end),
        (panels | select(.type != "row") |
          (if (.targets | length) == 0 then "panel \(.title): no targets" else empty end),
          (if .datasource.uid != "${datasource}" then "panel \(.title): datasource not ${datasource}" else empty end),
          (if .gridPos == null then "panel \(.title): no gridPos" else empty end),
          (.targets[]? |
            (if ((.expr // "") | length) == 0 then "panel \(.title) target \(.refId): no expr" else empty end),
            (if .datasource.uid != "${datasource}" then "panel target \(.refId): datasource not ${datasource}" else empty end)))
      ] | .[]' "$DASH") || return 1
    if [ -n "$errs" ]; then
        sed 's/^/  /' <<<"$errs"
        return 1
    fi
    echo "  $(jq '[.panels[]? | select(.type != "row")] | length' "$DASH") panels," \
         "$(jq '[.. | objects | select(has("expr")) ] | length' "$DASH") exprs, uid $(jq -r .uid "$DASH")"
    # Panels the brief asks for, by title keyword.
    local t missing=0
    for t in "Handshakes" "Re-initializes" "narrowing" "Capability changes" "Content-Type divergence" \
             "media-type mix" "Empty tool results by reason" "Active sessions" "Sessions started" \
             "Sessions ended" "latency p50 / p95 / p99" "Packets/s" "Bytes/s" "drops" \
             "TCP reassembly gaps" "parse errors" "Flows active" "evicted"; do
        jq -e --arg t "$t" '[.panels[]? | .title | select(contains($t))] | length > 0' "$DASH" >/dev/null \
            || { echo "  no panel titled *$t*"; missing=1; }
    done
    return $missing
}

dashboard_provisioning() {
    "$PY" - <<'EOF'
import yaml, sys
d = yaml.safe_load(open("dashboards/provisioning/dashboards.yml"))
s = yaml.safe_load(open("dashboards/provisioning/datasource.yml"))
ok = d.get("apiVersion") == 1 and d["providers"][0]["type"] == "file" and "path" in d["providers"][0]["options"]
ok = ok and s.get("apiVersion") == 1 and s["datasources"][0]["type"] == "prometheus"
print("  provisioning files parse" if ok else "  provisioning files incomplete")
sys.exit(0 if ok else 1)
EOF
}

exprs_list() {
    python3 dashboards/exprs.py --list > "$WORK/exprs.txt" || return 1
    local n
    n=$(wc -l < "$WORK/exprs.txt")
    echo "  $n distinct exprs"
    [ "$n" -ge 30 ] || { echo "  expected at least 30 exprs"; return 1; }
    if grep -n '\$' "$WORK/exprs.txt"; then echo "  unsubstituted variable left"; return 1; fi
    if grep -vnE 'mcptap_|ALERTS|process_' "$WORK/exprs.txt"; then echo "  expr without mcptap metric"; return 1; fi
    python3 dashboards/exprs.py --lint
}

# ------------------------------------------------------------------ live Prometheus
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_prometheus DIR CONFIG: start a throw-away Prometheus on a free loopback port, wait until
# it is ready and set PROM_URL. Not to be called in $(...): the PID must reach the EXIT trap.
start_prometheus() {
    local dir="$1" config="$2" port i
    PROM_URL=""
    port=$(free_port)
    prometheus --config.file="$config" --storage.tsdb.path="$dir/data" \
        --web.listen-address="127.0.0.1:$port" --log.level=warn >"$dir/prometheus.log" 2>&1 &
    PIDS+=("$!")
    for i in $(seq 100); do
        if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/-/ready', timeout=1)" 2>/dev/null; then
            PROM_URL="http://127.0.0.1:$port"; return 0
        fi
        sleep 0.2
    done
    echo "prometheus did not become ready:" >&2; cat "$dir/prometheus.log" >&2
    return 1
}

# Every dashboard expr must parse on a real Prometheus with no targets at all.
live_exprs_parse() {
    local dir="$WORK/prom-empty" url
    mkdir -p "$dir"
    printf 'global:\n  scrape_interval: 15s\n' > "$dir/prometheus.yml"
    start_prometheus "$dir" "$dir/prometheus.yml" || return 1
    url="$PROM_URL"
    python3 dashboards/exprs.py --prometheus "$url"
}

# A fake mcptap /metrics (static text in the contract's format, served by python's http.server)
# scraped every second by a Prometheus that also loads the alert rules: the rules must load and
# evaluate without errors, and `exprs.py --require-data` must find data for its required subset.
live_fake_target() {
    local dir="$WORK/prom-fake" url port i
    mkdir -p "$dir/www"
    cat > "$dir/www/metrics" <<'EOF'
# TYPE mcptap_build_info gauge
mcptap_build_info{version="0.0.0-check"} 1
# TYPE mcptap_packets_total counter
mcptap_packets_total 123456
# TYPE mcptap_bytes_total counter
mcptap_bytes_total 98765432
# TYPE mcptap_packets_skipped_total counter
mcptap_packets_skipped_total{reason="not_tcp"} 12
# TYPE mcptap_capture_drops_total counter
mcptap_capture_drops_total{source="kernel"} 0
mcptap_capture_drops_total{source="interface"} 0
# TYPE mcptap_flows_active gauge
mcptap_flows_active 7
# TYPE mcptap_flows_opened_total counter
mcptap_flows_opened_total 40
# TYPE mcptap_flows_evicted_total counter
mcptap_flows_evicted_total{reason="idle"} 3
# TYPE mcptap_flows_closed_total counter
mcptap_flows_closed_total{reason="fin"} 30
# TYPE mcptap_tcp_gaps_total counter
mcptap_tcp_gaps_total{reason="timeout"} 1
# TYPE mcptap_tcp_gap_bytes_total counter
mcptap_tcp_gap_bytes_total 1460
# TYPE mcptap_tcp_overlaps_total counter
mcptap_tcp_overlaps_total{kind="identical"} 2
# TYPE mcptap_http_parse_errors_total counter
mcptap_http_parse_errors_total{reason="unmatched_response"} 1
# TYPE mcptap_http_responses_total counter
mcptap_http_responses_total{server="10.0.0.5:8080",status="200"} 50
mcptap_http_responses_total{server="10.0.0.5:8080",status="502"} 1
# TYPE mcptap_jsonrpc_parse_errors_total counter
mcptap_jsonrpc_parse_errors_total{reason="invalid_json"} 0
# TYPE mcptap_sessions_active gauge
mcptap_sessions_active{server="10.0.0.5:8080"} 2
# TYPE mcptap_sessions_started_total counter
mcptap_sessions_started_total{server="10.0.0.5:8080",baseline="handshake"} 3
# TYPE mcptap_sessions_ended_total counter
mcptap_sessions_ended_total{server="10.0.0.5:8080",reason="deleted"} 1
# TYPE mcptap_handshakes_total counter
mcptap_handshakes_total{server="10.0.0.5:8080",outcome="accepted",kind="initial"} 3
mcptap_handshakes_total{server="10.0.0.5:8080",outcome="accepted",kind="reinitialize"} 1
# TYPE mcptap_requests_total counter
mcptap_requests_total{server="10.0.0.5:8080",method="tools/call"} 20
mcptap_requests_total{server="10.0.0.5:8080",method="initialize"} 4
mcptap_requests_total{server="10.0.0.5:8080",method="tools/call",era="modern"} 3
# TYPE mcptap_responses_total counter
mcptap_responses_total{server="10.0.0.5:8080",method="tools/call",media_type="sse"} 12
mcptap_responses_total{server="10.0.0.5:8080",method="tools/call",media_type="json"} 8
# TYPE mcptap_tool_calls_total counter
mcptap_tool_calls_total{server="10.0.0.5:8080",media_type="sse"} 12
mcptap_tool_calls_total{server="10.0.0.5:8080",media_type="json"} 8
# TYPE mcptap_alerts_total counter
mcptap_alerts_total{server="10.0.0.5:8080",kind="capability_narrowing"} 0
mcptap_alerts_total{server="10.0.0.5:8080",kind="capability_widening"} 0
mcptap_alerts_total{server="10.0.0.5:8080",kind="content_type_divergence"} 1
mcptap_alerts_total{server="10.0.0.5:8080",kind="empty_tool_result"} 8
mcptap_alerts_total{server="10.0.0.5:8080",kind="client_capability_narrowing",era="modern"} 0
mcptap_alerts_total{server="10.0.0.5:8080",kind="protocol_downgrade",era="modern"} 0
mcptap_alerts_total{server="10.0.0.5:8080",kind="header_mismatch",era="modern"} 0
# TYPE mcptap_header_mismatches_total counter
mcptap_header_mismatches_total{server="10.0.0.5:8080",header="mcp-param"} 1
# TYPE mcptap_capability_changes_total counter
mcptap_capability_changes_total{server="10.0.0.5:8080",direction="narrowing",side="server",scope="tools"} 1
mcptap_capability_changes_total{server="10.0.0.5:8080",direction="narrowing",side="client",scope="roots"} 1
# TYPE mcptap_client_capability_near_misses_total counter
mcptap_client_capability_near_misses_total{server="10.0.0.5:8080"} 0
# TYPE mcptap_lineage_capability_losses_total counter
mcptap_lineage_capability_losses_total{server="10.0.0.5:8080"} 0
# TYPE mcptap_empty_tool_results_total counter
mcptap_empty_tool_results_total{server="10.0.0.5:8080",reason="no_events"} 8
# TYPE mcptap_empty_tool_content_total counter
mcptap_empty_tool_content_total{server="10.0.0.5:8080"} 0
# TYPE mcptap_request_duration_seconds histogram
mcptap_request_duration_seconds_bucket{server="10.0.0.5:8080",method="tools/call",le="0.1"} 5
mcptap_request_duration_seconds_bucket{server="10.0.0.5:8080",method="tools/call",le="1"} 18
mcptap_request_duration_seconds_bucket{server="10.0.0.5:8080",method="tools/call",le="+Inf"} 20
mcptap_request_duration_seconds_sum{server="10.0.0.5:8080",method="tools/call"} 7.5
mcptap_request_duration_seconds_count{server="10.0.0.5:8080",method="tools/call"} 20
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 12345678
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
EOF
    port=$(free_port)
    python3 -m http.server --bind 127.0.0.1 --directory "$dir/www" "$port" >"$dir/http.log" 2>&1 &
    PIDS+=("$!")
    cp "$RULES" "$dir/mcptap.rules.yml"
    cat > "$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - mcptap.rules.yml
scrape_configs:
  - job_name: mcptap
    static_configs:
      - targets: ["127.0.0.1:$port"]
EOF
    promtool check config "$dir/prometheus.yml" >/dev/null || return 1
    start_prometheus "$dir" "$dir/prometheus.yml" || return 1
    url="$PROM_URL"
    # wait for a few scrapes (rate() over 1m needs two samples) and rule evaluations
    for i in $(seq 60); do
        python3 - "$url" <<'EOF' && break
import json, sys, urllib.request, urllib.parse
q = urllib.parse.urlencode({"query": 'count_over_time(up{job="mcptap"}[1m]) >= 3 and up{job="mcptap"} == 1'})
r = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/query?" + q, timeout=2))
sys.exit(0 if r["data"]["result"] else 1)
EOF
        sleep 0.5
    done
    # The incident: the narrowing counter (pre-initialised to 0) goes to 1. With no `for:`,
    # McpCapabilityNarrowing must be firing within a few evaluations.
    sed -i 's/^\(mcptap_alerts_total{server="10.0.0.5:8080",kind="capability_narrowing"}\) 0$/\1 1/' \
        "$dir/www/metrics"
    local firing=""
    for i in $(seq 60); do
        firing=$(python3 - "$url" <<'EOF'
import json, sys, urllib.request
r = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/alerts", timeout=2))
print(" ".join(sorted(f'{a["labels"]["alertname"]}{{server={a["labels"].get("server", "")}}}'
                      for a in r["data"]["alerts"] if a["state"] == "firing")))
EOF
)
        case "$firing" in *McpCapabilityNarrowing*) break ;; esac
        sleep 0.5
    done
    echo "  firing after the narrowing counter went 0 -> 1: ${firing:-nothing}"
    case "$firing" in *"McpCapabilityNarrowing{server=10.0.0.5:8080}"*) ;; *) return 1 ;; esac
    case "$firing" in *McpCapabilityWidening*|*McptapTargetDown*) echo "  unexpected alert"; return 1 ;; esac
    python3 dashboards/exprs.py --prometheus "$url" --require-data || return 1
    # the rules loaded and evaluate cleanly
    python3 - "$url" <<'EOF'
import json, sys, urllib.request
r = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/rules", timeout=5))
rules = [x for g in r["data"]["groups"] for x in g["rules"]]
bad = [x["name"] for x in rules if x.get("health") not in ("ok", "unknown") or x.get("lastError")]
print(f"  live Prometheus loaded {len(rules)} rules; unhealthy: {bad or 'none'}")
sys.exit(1 if bad or len(rules) < 8 else 0)
EOF
}

# ------------------------------------------------------------------ systemd
# `systemd-analyze verify` needs the ExecStart/ExecReload binaries to exist. Rather than editing
# the unit (or creating /usr/local/bin/mcptap on this machine), verify the UNCHANGED unit with
# --root pointing at a throw-away tree that holds a stub /usr/local/bin/mcptap, a copy of
# /bin/kill and the distribution's unit files (for sysinit.target & co). verify exits 0 even for
# unknown keys or unparsable values, so any diagnostic output counts as a failure.
systemd_verify() {
    local r="$WORK/sysroot" out
    mkdir -p "$r/usr/local/bin" "$r/usr/bin" "$r/usr/lib/systemd" "$r/etc/systemd/system"
    ln -s usr/bin "$r/bin"
    printf '#!/bin/sh\nexit 0\n' > "$r/usr/local/bin/mcptap"
    chmod 0755 "$r/usr/local/bin/mcptap"
    cp "$(readlink -f /bin/kill)" "$r/usr/bin/kill"
    local sysunits=/usr/lib/systemd/system
    [ -d "$sysunits" ] || sysunits=/lib/systemd/system
    cp -a "$sysunits" "$r/usr/lib/systemd/"
    cp "$UNIT" "$r/etc/systemd/system/mcptap.service"
    out=$(SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no --root="$r" \
            "$r/etc/systemd/system/mcptap.service" 2>&1)
    local rc=$?
    if [ $rc -ne 0 ] || [ -n "$out" ]; then
        printf '%s\n' "$out" | sed 's/^/  /'
        echo "  systemd-analyze verify: rc=$rc"
        return 1
    fi
    echo "  systemd-analyze verify: clean"
}

# Directives the unit must (not) carry.
systemd_directives() {
    local bad=0 d
    for d in 'Type=simple' 'ExecStart=/usr/local/bin/mcptap run --config /etc/mcptap/mcptap.toml' \
             'ExecReload=/bin/kill -HUP $MAINPID' 'Restart=on-failure' 'RestartSec=2' 'LimitNOFILE=' \
             'DynamicUser=yes' 'AmbientCapabilities=CAP_NET_RAW CAP_NET_ADMIN' \
             'CapabilityBoundingSet=CAP_NET_RAW CAP_NET_ADMIN' 'NoNewPrivileges=yes' \
             'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' 'PrivateDevices=yes' \
             'ProtectKernelTunables=yes' 'ProtectKernelModules=yes' 'ProtectKernelLogs=yes' \
             'ProtectControlGroups=yes' 'ProtectClock=yes' 'ProtectHostname=yes' 'ProtectProc=invisible' \
             'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET' \
             'RestrictNamespaces=yes' 'RestrictRealtime=yes' 'RestrictSUIDSGID=yes' 'LockPersonality=yes' \
             'MemoryDenyWriteExecute=yes' 'SystemCallArchitectures=native' 'SystemCallFilter=@system-service' \
             'UMask=0077' 'StateDirectory=mcptap' 'LogsDirectory=mcptap' 'ConfigurationDirectory=mcptap'; do
        grep -qxF -- "$d" "$UNIT" || grep -qx -- "${d}[0-9]*" "$UNIT" || { echo "  missing: $d"; bad=1; }
    done
    for d in PrivateNetwork PrivateUsers ProcSubset; do
        if grep -qE "^[[:space:]]*$d=" "$UNIT"; then echo "  must not be set: $d="; bad=1; fi
    done
    return $bad
}

# `systemd-analyze security --offline=true` (systemd >= 250) scores a unit file without a
# running service manager, so it works in a container without systemd as PID 1.
systemd_security() {
    if ! systemd-analyze --help 2>&1 | grep -q -- '--offline'; then
        echo "  systemd-analyze $(systemd-analyze --version | head -n1) has no --offline (needs systemd >= 250;"
        echo "  Debian 12 ships 252). Without it the score needs a running systemd: run"
        echo "  'systemd-analyze security mcptap.service' on a host where the unit is installed."
        return 1
    fi
    local out score threshold
    out=$(SYSTEMD_LOG_COLOR=0 systemd-analyze security --offline=true --no-pager "$UNIT" 2>&1)
    printf '%s\n' "$out" | grep -E '^✗|^\S*✗' | sed 's/^/  /'
    score=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' | tail -n1)
    if [ -z "$score" ]; then
        printf '%s\n' "$out" | sed 's/^/  /'
        echo "  could not read the exposure score"
        return 1
    fi
    echo "  systemd $(systemd-analyze --version | head -n1 | awk '{print $2}'): exposure score $score (max $MAX_EXPOSURE)"
    # --threshold takes tenths: 2.0 -> 20
    threshold=$(awk -v m="$MAX_EXPOSURE" 'BEGIN { printf "%d", m * 10 + 0.5 }')
    systemd-analyze security --offline=true --threshold="$threshold" --no-pager "$UNIT" >/dev/null 2>&1 || {
        echo "  score $score is above $MAX_EXPOSURE"; return 1; }
    awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }'
}

logrotate_config() {
    local conf="$WORK/logrotate.mcptap"
    install -m 0644 systemd/logrotate.mcptap "$conf"
    grep -q 'postrotate' "$conf" && grep -q 'try-reload-or-restart mcptap.service' "$conf" \
        || { echo "  postrotate must reload mcptap (SIGHUP)"; return 1; }
    local out
    out=$(logrotate -d -s "$WORK/logrotate.state" "$conf" 2>&1) || { printf '%s\n' "$out"; return 1; }
    if grep -qiE '^error' <<<"$out"; then printf '%s\n' "$out" | grep -iE '^error' | sed 's/^/  /'; return 1; fi
    echo "  logrotate -d: ok"
}

# ------------------------------------------------------------------ run
if ! check "tools installed" ensure_tools; then
    echo "cannot continue without tools"; exit 1
fi
check "promtool check rules" promtool_check_rules
check "promtool test rules" promtool_test_rules
check "alert rules contract" rules_contract
check "runbook jq commands compile" runbook_jq_compiles
check "dashboard JSON" dashboard_json
check "dashboard provisioning examples" dashboard_provisioning
check "exprs.py --list / --lint" exprs_list
if [ "${CHECK_OPS_SKIP_LIVE:-0}" != 1 ]; then
    check "exprs parse on an empty Prometheus" live_exprs_parse
    check "rules + exprs --require-data on a Prometheus scraping a fake mcptap" live_fake_target
else
    echo "=== live Prometheus checks skipped (CHECK_OPS_SKIP_LIVE=1)"
fi
check "systemd-analyze verify" systemd_verify
check "systemd unit directives" systemd_directives
check "systemd-analyze security (offline)" systemd_security
check "logrotate config" logrotate_config

echo
echo "check-ops: $PASSED passed, $FAILED failed"
if [ "$FAILED" -gt 0 ]; then
    printf '  failed: %s\n' "${FAILED_NAMES[@]}"
    exit 1
fi
