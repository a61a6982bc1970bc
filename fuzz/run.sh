#!/usr/bin/env bash
# Runs the mcptap fuzz targets with cargo-fuzz (libFuzzer + AddressSanitizer).
#
#   fuzz/run.sh [SECONDS] [TARGET...]      default: 600 s each, every target
#   JOBS=2 fuzz/run.sh 900                 run two targets at a time
#   FUZZ_ARGS="-rss_limit_mb=4096" ...     extra libFuzzer flags
#   SANITIZER=address fuzz/run.sh          AddressSanitizer (default: none, see below)
#
# mcptap has one `unsafe` block (mapping capture files, src/capture/mapped.rs, which
# pipeline_capture reaches) and the fuzz drivers none, so the default is no sanitizer: that is
# several times faster, and panics, integer overflows (debug assertions are on), timeouts
# and out-of-memory are still caught. Installs cargo-fuzz if missing. Works on a stable toolchain: RUSTC_BOOTSTRAP=1 lets it
# accept the -Z sanitizer flags cargo-fuzz passes. Each target's working corpus is
# fuzz/corpus/<target> (not committed), started from the committed seeds in
# fuzz/seeds/<target>; crashes land in fuzz/artifacts/<target>/ and logs in fuzz/logs/.
# Ends with one summary line per target (runs, execs/s, coverage, features, crashes) and
# exits non-zero if any target found a crash.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

seconds="${1:-600}"
shift || true
all_targets=(http_sse jsonrpc_mcp pipeline_capture pipeline_frames)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
jobs="${JOBS:-1}"
sanitizer="${SANITIZER:-none}"

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

dict_for() {
    case "$1" in
        jsonrpc_mcp) echo "$here/dicts/json.dict" ;;
        *) echo "$here/dicts/http.dict" ;;
    esac
}

cargo fuzz build --sanitizer "$sanitizer"
mkdir -p logs

run_one() {
    local t="$1"
    mkdir -p "corpus/$t" "artifacts/$t"
    # -max_len: large enough for whole fixture captures (~30 KB).
    cargo fuzz run --sanitizer "$sanitizer" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=20 -rss_limit_mb=3072 \
        -dict="$(dict_for "$t")" -print_final_stats=1 ${FUZZ_ARGS:-} \
        >"logs/$t.log" 2>&1
}

pids=()
status=0
for t in "${targets[@]}"; do
    echo "fuzzing $t for ${seconds}s (log: fuzz/logs/$t.log)" >&2
    run_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait "${pids[0]}" || true
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do wait "$p" || true; done

echo
printf '%-18s %12s %10s %8s %9s %8s  %s\n' target runs exec/s cov ft corpus crashes
for t in "${targets[@]}"; do
    log="logs/$t.log"
    runs=$(grep -a 'stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -1)
    speed=$(grep -a 'stat::average_exec_per_sec' "$log" | awk '{print $2}' | tail -1)
    last=$(grep -aE '^#[0-9]+' "$log" | grep -a 'cov:' | tail -1)
    cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
    ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$last")
    corp=$(sed -nE 's/.*corp: ([0-9]+\/[0-9a-zA-Z]+).*/\1/p' <<<"$last")
    crashes=$(find "artifacts/$t" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) | wc -l)
    printf '%-18s %12s %10s %8s %9s %8s  %s\n' "$t" "${runs:-?}" "${speed:-?}" "${cov:-?}" \
        "${ft:-?}" "${corp:-?}" "$crashes"
    if [ "$crashes" -gt 0 ]; then
        status=1
        find "artifacts/$t" -type f | sed 's/^/    /'
    fi
done
exit "$status"
