#!/usr/bin/env bash
# Guard for every script that pushes a capture onto an interface with tcpreplay: refuses, with
# one line on stderr and exit status 1, a capture holding any address outside 127.0.0.0/8 and
# ::1, an Ethernet destination the interface would take up its stack (its own MAC, broadcast,
# multicast), or frames it cannot check (non-Ethernet, non-IP, cut). Uses mcptap's own decoder
# (`mcptap endpoints --require-loopback`).
#
#   scripts/loopback-guard.sh [--bin MCPTAP] [--interface IF] CAPTURE...
#
# --interface (default lo) names the target: its MAC (/sys/class/net/IF/address) counts as local.
# --bin defaults to target/release/mcptap, built if missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=""
IFACE=lo
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --interface) IFACE="$2"; shift 2 ;;
    --) shift; break ;;
    -*) echo "loopback-guard.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "loopback-guard.sh: no capture given" >&2; exit 2; }
if [ -z "$BIN" ]; then
  BIN="$ROOT/target/release/mcptap"
  [ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --quiet) || exit 2
fi
mac="00:00:00:00:00:00"
[ -r "/sys/class/net/$IFACE/address" ] && mac="$(cat "/sys/class/net/$IFACE/address")"
[ -n "$mac" ] || mac="00:00:00:00:00:00"
exec "$BIN" endpoints --require-loopback --local-mac "$mac" --local-mac 00:00:00:00:00:00 "$@"
