#!/usr/bin/env python3
"""Extract and check the PromQL expressions of the mcptap Grafana dashboard.

Every "expr" string anywhere in the dashboard JSON (panel targets, annotation queries) is
extracted and its Grafana variables are replaced so that plain Prometheus can run it:

    $server / ${server} / ${server:regex} / [[server]]  ->  .*      (All)
    $__rate_interval, $__interval                       ->  --interval (default 1m)
    $__range                                            ->  --range    (default 1h)
    $__range_s / $__range_ms / $__interval_ms           ->  the same, in s / ms

Any other variable is an error (the dashboard gained a variable this script does not know).

Usage:
    exprs.py --list                          print the substituted exprs, one per line
    exprs.py --list-required                 print the --require-data subset
    exprs.py --lint                          dashboard lint (server filter on server metrics)
    exprs.py --prometheus URL                query each expr via URL/api/v1/query; exit 1 if any
                                             fails (status "error": parse or execution error)
    exprs.py --prometheus URL --require-data also exit 1 if an expr of the required subset
                                             (default: see DEFAULT_REQUIRED; override with
                                             --require REGEX, repeatable) returns no series;
                                             the server variable's label_values() query must
                                             then return at least one server, too.
A bare URL argument is the same as --prometheus URL. Only the Python standard library is used.

Exit status: 0 ok, 1 check failed, 2 usage error / bad dashboard / Prometheus unreachable.
"""

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcptap.json")

# Exprs that must return data once mcptap has been scraped for a while and has observed the
# incident (a session whose client replays initialize with fewer capabilities): regexes matched
# against the substituted expr. The e2e test can narrow or widen this with --require.
DEFAULT_REQUIRED = [
    r"mcptap_packets_total",
    r"mcptap_bytes_total",
    r"mcptap_flows_active",
    r"mcptap_handshakes_total",
    r"mcptap_alerts_total",
    r"mcptap_tool_calls_total",
    r"mcptap_sessions_started_total",
    r"mcptap_requests_total",
]

# Metrics that carry a `server` label (metric contract); the dashboard must filter them by
# server=~"$server". Histograms are matched by their base name.
SERVER_METRICS = {
    "mcptap_http_responses_total",
    "mcptap_sessions_active",
    "mcptap_sessions_started_total",
    "mcptap_sessions_ended_total",
    "mcptap_handshakes_total",
    "mcptap_requests_total",
    "mcptap_responses_total",
    "mcptap_tool_calls_total",
    "mcptap_alerts_total",
    "mcptap_capability_changes_total",
    "mcptap_client_capability_near_misses_total",
    "mcptap_lineage_capability_losses_total",
    "mcptap_empty_tool_results_total",
    "mcptap_empty_tool_content_total",
    "mcptap_request_duration_seconds",
}

VAR_RE = re.compile(r"\$\{(\w+)(?::[\w-]+)?\}|\[\[(\w+)(?::[\w-]+)?\]\]|\$(\w+)")
DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")
UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(d):
    m = DURATION_RE.match(d)
    if not m:
        raise ValueError(f"bad duration {d!r} (want e.g. 30s, 1m, 2h)")
    return int(m.group(1)) * UNIT_SECONDS[m.group(2)]


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"exprs.py: cannot read dashboard {path}: {e}")


def walk(node, title, out):
    """Collect (title, refId, expr) for every "expr" string in the JSON, in document order."""
    if isinstance(node, dict):
        t = node.get("title") or node.get("name") or title
        expr = node.get("expr")
        if isinstance(expr, str) and expr.strip():
            out.append((t, node.get("refId", ""), expr))
        for v in node.values():
            walk(v, t, out)
    elif isinstance(node, list):
        for v in node:
            walk(v, title, out)


def substitute(expr, interval, rng):
    subs = {
        "server": ".*",
        "__rate_interval": interval,
        "__interval": interval,
        "__interval_ms": str(int(seconds(interval) * 1000)),
        "__range": rng,
        "__range_s": str(int(seconds(rng))),
        "__range_ms": str(int(seconds(rng) * 1000)),
    }
    unknown = []

    def rep(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in subs:
            unknown.append(name)
            return m.group(0)
        return subs[name]

    res = VAR_RE.sub(rep, expr)
    res = " ".join(res.split())  # one line
    return res, unknown


def extract(dash, interval, rng):
    raw = []
    walk(dash, "", raw)
    exprs, seen, errors = [], set(), []
    for title, ref, e in raw:
        s, unknown = substitute(e, interval, rng)
        if unknown:
            errors.append(f"{title} [{ref}]: unknown variable(s) {', '.join(sorted(set(unknown)))}: {e}")
        if s not in seen:
            seen.add(s)
            exprs.append((title, ref, e, s))
    return exprs, errors


def variable_checks(dash):
    """label_values(metric, label) variables -> PromQL that returns one series per value."""
    out = []
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*", q or "")
        if m:
            out.append((v["name"], f"group by ({m.group(2)}) ({m.group(1)})"))
    return out


def lint(dash, exprs):
    problems = []
    for title, ref, raw, _ in exprs:
        for m in re.finditer(r"\b(mcptap_[a-z0-9_]+)\s*(\{[^}]*\})?", raw):
            name, sel = m.group(1), m.group(2) or ""
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base in SERVER_METRICS and 'server=~"$server"' not in sel:
                problems.append(f"{title} [{ref}]: {name} without server=~\"$server\": {raw}")

    def ds_ok(node, where):
        ds = node.get("datasource")
        if not (isinstance(ds, dict) and ds.get("uid") == "${datasource}"):
            problems.append(f"{where}: datasource is {ds!r}, want uid ${{datasource}}")

    for p in iter_panels(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        ds_ok(p, f"panel {p.get('title')!r}")
        for t in p.get("targets", []):
            ds_ok(t, f"panel {p.get('title')!r} target {t.get('refId')}")
            if not t.get("expr", "").strip():
                problems.append(f"panel {p.get('title')!r} target {t.get('refId')}: empty expr")
    return problems


def iter_panels(panels):
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


def query(base, expr, timeout):
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as e:  # 400 bad_data / 422 execution error carry JSON too
        body = e.read()
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionError(f"{base}: {e}") from e
    try:
        return json.loads(body)
    except ValueError:
        return {"status": "error", "error": f"non-JSON answer: {body[:200]!r}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("url", nargs="?", help="Prometheus base URL (same as --prometheus)")
    ap.add_argument("--dashboard", default=DEFAULT_DASHBOARD)
    ap.add_argument("--list", action="store_true", help="print the exprs, one per line")
    ap.add_argument("--list-required", action="store_true", help="print the --require-data subset")
    ap.add_argument("--lint", action="store_true", help="lint the dashboard")
    ap.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--require-data", action="store_true", help="fail if a required expr returns no data")
    ap.add_argument("--require", metavar="REGEX", action="append",
                    help="required subset: exprs matching REGEX (repeatable; default: built-in list)")
    ap.add_argument("--interval", default="1m", help="value for $__rate_interval/$__interval (1m)")
    ap.add_argument("--range", default="1h", dest="rng", help="value for $__range (1h)")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every expr's result")
    a = ap.parse_args()

    base = a.prometheus or a.url
    if a.prometheus and a.url:
        ap.error("give the URL once")
    try:
        seconds(a.interval), seconds(a.rng)
    except ValueError as e:
        ap.error(str(e))
    if not (a.list or a.list_required or a.lint or base):
        a.list = True
    if a.require_data and not base:
        ap.error("--require-data needs --prometheus URL")

    dash = load(a.dashboard)
    exprs, errors = extract(dash, a.interval, a.rng)
    if not exprs:
        errors.append("no expr found in the dashboard")
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    if errors:
        return 2

    patterns = [re.compile(p) for p in (a.require or DEFAULT_REQUIRED)]
    required = [x for x in exprs if any(p.search(x[3]) for p in patterns)]

    if a.list:
        for x in exprs:
            print(x[3])
    if a.list_required:
        for x in required:
            print(x[3])
    rc = 0
    if a.lint:
        problems = lint(dash, exprs)
        for p in problems:
            print(f"LINT {p}", file=sys.stderr)
        if problems:
            rc = 1
    if not base:
        return rc

    checks = [(f"{t} [{r}]", s, any(s == q[3] for q in required)) for t, r, _, s in exprs]
    if a.require_data:
        checks += [(f"variable ${name}", e, True) for name, e in variable_checks(dash)]
    failed = nodata = 0
    for where, e, req in checks:
        try:
            res = query(base, e, a.timeout)
        except ConnectionError as err:
            print(f"ERROR cannot query Prometheus: {err}", file=sys.stderr)
            return 2
        if res.get("status") != "success":
            failed += 1
            print(f"FAIL   {where}: {res.get('errorType', '')} {res.get('error', '')}\n       {e}")
            continue
        data = res.get("data", {})
        n = len(data.get("result", [])) if data.get("resultType") in ("vector", "matrix") else 1
        if a.require_data and req and n == 0:
            nodata += 1
            print(f"NODATA {where}\n       {e}")
        elif a.verbose:
            print(f"ok     {n:4d} series{' (required)' if req and a.require_data else ''}  {where}: {e}")
    total = len(checks)
    print(f"exprs.py: {total} queries against {base}: {total - failed} parsed, {failed} failed"
          + (f", {nodata} of {sum(1 for c in checks if c[2])} required without data" if a.require_data else ""))
    return 1 if (failed or nodata or rc) else 0


if __name__ == "__main__":
    sys.exit(main())
