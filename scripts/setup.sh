#!/usr/bin/env bash
# Installs what mcptap's build and tests need on a fresh Debian machine that has only the Rust
# toolchain. Idempotent: installs only what is missing.
#   scripts/setup.sh          build deps (libpcap-dev)
#   scripts/setup.sh --test   plus test deps (promtool/prometheus, tcpdump, systemd-analyze, jq,
#                             dpkg-dev and man-db for the package check, redis-server for
#                             the fleet tests, chromium for the report rendering test)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
want() { for p in "$@"; do have_pkg "$p" || need+=("$p"); done; }

want libpcap-dev pkg-config
if [[ "${1:-}" == "--test" ]]; then
  want prometheus tcpdump jq curl python3-venv systemd logrotate time dpkg-dev man-db redis-server openssl chromium
fi
if ((${#need[@]})); then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "setup: installing ${need[*]}" >&2
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The downloaded .debs are not needed again; CI machines can be short of disk.
  $SUDO apt-get clean
fi
