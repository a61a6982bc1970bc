#!/usr/bin/env bash
# Where `mcptap replay` spends its time, per reference capture: the top functions by self
# cost, each with its heaviest caller.
#
# Uses `perf record` when hardware counters work (`perf stat -e instructions true`), else
# valgrind's callgrind (instruction counts in user space; exact and repeatable, but ~50x
# slower, hence the small captures of `scripts/bench.sh --quick` by default). PROFILER=perf
# forces perf (sampling the cpu-clock software event when there are no hardware counters:
# this one also shows the kernel's share, e.g. copying the file in read()).
#
#   scripts/bench/profile.sh                      # quick captures (mixed 100 MB, all-MCP 25 MB)
#   scripts/bench/profile.sh --full               # the full-size ones (perf recommended)
#   PROFILER=perf scripts/bench/profile.sh --full
#   TOP=20 scripts/bench/profile.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TOP="${TOP:-10}"
SIZE=--quick
[ "${1:-}" = --full ] && SIZE=
mapfile -t FILES < <(scripts/bench.sh $SIZE --generate-only | tail -2)
BIN="$ROOT/target/release/mcptap"
OUT="$ROOT/target/bench-profile"
mkdir -p "$OUT"

EVENT=cpu-clock
if command -v perf >/dev/null && perf stat -x, -e instructions true 2>&1 >/dev/null | grep -q '^[0-9]'; then
  EVENT=cycles
  TOOL="${PROFILER:-perf}"
else
  TOOL="${PROFILER:-callgrind}"
fi
case "$TOOL" in
  perf) command -v perf >/dev/null || { echo "profile.sh: perf not found" >&2; exit 1; }
        echo "profiler: $(perf --version), event $EVENT" ;;
  callgrind) command -v valgrind >/dev/null || { echo "profile.sh: valgrind not found" >&2; exit 1; }
        echo "profiler: callgrind ($(valgrind --version))" ;;
  *) echo "profile.sh: PROFILER must be perf or callgrind" >&2; exit 2 ;;
esac

for f in "${FILES[@]}"; do
  name="$(basename "$f" .pcap)"
  echo
  echo "== $name ($(stat -c %s "$f") bytes): top $TOP functions by self cost =="
  if [ "$TOOL" = perf ]; then
    perf record -q -e "$EVENT" -F 4999 -o "$OUT/$name.perf.data" \
      "$BIN" replay "$f" --events /dev/null --log-level error > /dev/null 2>&1
    echo "time by object: $(perf report -i "$OUT/$name.perf.data" --no-children --stdio --sort dso 2>/dev/null \
      | awk '/^ +[0-9.]+%/{printf "%s%s %s", sep, $2, $1; sep=", "}')"
    echo "| # | self % | function ([k] = kernel) |"
    echo "|---|--------|-------------------------|"
    perf report -i "$OUT/$name.perf.data" --no-children --stdio --sort sym 2>/dev/null \
      | awk -v top="$TOP" '/^ +[0-9.]+%/ && ++n <= top {
          pct=$1; sub(/%/, "", pct); $1=""; sub(/^ +/, ""); sub(/ +-? +-? *$/, "")
          printf "| %d | %s | `%s` |\n", n, pct, $0 }'
  else
    valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.callgrind" \
      "$BIN" replay "$f" --events /dev/null --log-level error > /dev/null 2> "$OUT/$name.valgrind.log"
    total="$(grep -E '^(summary|totals):' "$OUT/$name.callgrind" | tail -1 | awk '{print $2}')"
    echo "total: $total instructions ($(awk -v t="$total" -v s="$(stat -c %s "$f")" 'BEGIN{printf "%.1f", t/s}') per capture byte)"
    callgrind_annotate --threshold=100 --inclusive=no --tree=caller "$OUT/$name.callgrind" 2>/dev/null \
      | python3 -c '
import re, sys
top = int(sys.argv[1])
blocks, cur = [], []
for line in sys.stdin:
    if not line.strip():
        if cur: blocks.append(cur)
        cur = []
    else:
        cur.append(line.rstrip("\n"))
if cur: blocks.append(cur)
pat = re.compile(r"^\s*([\d,]+) \(\s*([\d.]+)%\)\s+([<*>])\s+(.*)$")
def short(fn):
    fn = re.sub(r" \[[^]]*\]$", "", fn)        # object file
    fn = re.sub(r"^(\?\?\?|\S+\.[chS]):", "", fn)  # source file
    return fn
by_name = {}
rows = []
for b in blocks:
    me = None
    callers = []
    for l in b:
        m = pat.match(l)
        if not m: continue
        if m.group(3) == "*": me = m
        elif m.group(3) == "<": callers.append(m)
    if me:
        name = short(me.group(4))
        cs = [(re.sub(r" \(\d[\d,]*x\)$", "", short(c.group(4))), int(c.group(1).replace(",", ""))) for c in callers]
        by_name[name] = cs
        rows.append((int(me.group(1).replace(",", "")), float(me.group(2)), name))
def chain(name):
    """Heaviest callers, up to the first mcptap function (at most 6 hops)."""
    out, seen = [], {name}
    for _ in range(6):
        cs = [c for c in by_name.get(name, []) if c[0] not in seen]
        if not cs: break
        total = sum(c[1] for c in by_name.get(name, []))
        c = max(cs, key=lambda c: c[1])
        out.append(f"`{c[0]}` ({100.0 * c[1] / total:.0f}%)")
        name = c[0]
        seen.add(name)
        if name.startswith(("mcptap::", "<mcptap::")):
            break
    return " <- ".join(out) or "-"
rows.sort(key=lambda r: -r[0])
print("| # | self % | function | called from (heaviest caller chain, share of calls) |")
print("|---|--------|----------|-----------------------------------------------------|")
for i, (cost, pct, name) in enumerate(rows[:top], 1):
    print(f"| {i} | {pct:.1f} | `{name}` | {chain(name)} |")
' "$TOP"
  fi
done
