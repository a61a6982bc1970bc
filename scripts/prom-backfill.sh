#!/usr/bin/env bash
# Backfill an OpenMetrics file into a Prometheus data directory, as the tests need (a throw-away
# Prometheus with some history of `up`).
#
#   scripts/prom-backfill.sh FILE.om DATA_DIR
#
# promtool's block writer preallocates a 512 MiB chunk segment before it writes the few KB a
# test block holds, so on a machine with little free disk the backfill fails with ENOSPC
# (seen in CI). The block is therefore written in a scratch tmpfs (memory; mounted here when
# root may mount, else /dev/shm when it has room) and only the finished block is moved into
# DATA_DIR. Without either, it writes in place and says why if that fails.
set -uo pipefail
om="$1"
data="$2"
need_kib=$((600 * 1024))
mkdir -p "$data"

scratch=""
mounted=0
cleanup() {
  if [ "$mounted" = 1 ]; then umount "$scratch" 2>/dev/null; fi
  if [ -n "$scratch" ]; then rm -rf "$scratch"; fi
}
trap cleanup EXIT

free_kib() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }

scratch="$(mktemp -d -t mcptap-backfill.XXXXXX)"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=768m,mode=0700 mcptap-backfill "$scratch" 2>/dev/null; then
  mounted=1
elif [ -d /dev/shm ] && [ "$(free_kib /dev/shm || echo 0)" -ge "$need_kib" ]; then
  rm -rf "$scratch"
  scratch="$(mktemp -d -p /dev/shm mcptap-backfill.XXXXXX)"
else
  rm -rf "$scratch"
  scratch=""
fi

if [ -z "$scratch" ]; then
  if ! out=$(promtool tsdb create-blocks-from openmetrics -q "$om" "$data" 2>&1); then
    echo "$out" >&2
    echo "prom-backfill: promtool needs about 512 MiB free for its chunk segment; free on $data: $(free_kib "$data") KiB (no tmpfs could be used)" >&2
    exit 1
  fi
  exit 0
fi

if ! out=$(promtool tsdb create-blocks-from openmetrics -q "$om" "$scratch" 2>&1); then
  echo "$out" >&2
  exit 1
fi
# Blocks are directories named by ULID; promtool leaves nothing else worth keeping.
moved=0
for block in "$scratch"/*/; do
  [ -f "$block/meta.json" ] || continue
  mv "$block" "$data/" || exit 1
  moved=$((moved + 1))
done
if [ "$moved" = 0 ]; then
  echo "prom-backfill: promtool wrote no block from $om" >&2
  exit 1
fi
