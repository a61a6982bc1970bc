#!/usr/bin/env bash
# Make sure the fixture venv (.venv-fixtures) exists and has scripts/fixtures/requirements.txt
# installed, then print the venv's python path on stdout (all other output goes to stderr).
#
#   PY="$(scripts/venv.sh)"
#   PY2="$(scripts/venv.sh scripts/fixtures/requirements-v2.txt .venv-fixtures-v2)"
#
# Optional arguments: a requirements file and a venv folder (relative paths are taken from the
# repo root); without them: scripts/fixtures/requirements.txt into .venv-fixtures.
#
# Idempotent: the venv is created with `python3 -m venv` only if missing, and pip runs only when
# requirements.txt changed since the last successful install (a sha256 stamp in the venv) or the
# stamp is missing. Needs python3 >= 3.10 with the venv module (Debian: python3-venv) and PyPI
# access the first time. Bounded: pip gets at most 600 s.
#
# Environment: PYTHON  interpreter used to create the venv (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="${1:-scripts/fixtures/requirements.txt}"
VENV="${2:-.venv-fixtures}"
case "$REQ" in /*) ;; *) REQ="$ROOT/$REQ" ;; esac
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"

die() { echo "venv: $*" >&2; exit 1; }

[ -f "$REQ" ] || die "no requirements file $REQ"

command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "need Python >= 3.10 for mcp"

# Serialise concurrent callers (e.g. gen-fixtures.sh and e2e.sh at once).
mkdir -p "$VENV"
exec 9>"$VENV/.lock"
flock -w 660 9 || die "timed out waiting for another venv setup"

if [ ! -x "$VENV/bin/python" ]; then
  echo "venv: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
PY="$VENV/bin/python"

stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "venv: installing $(basename "$REQ")" >&2
  timeout 600 "$PY" -m pip install --disable-pip-version-check -q -r "$REQ" >&2 \
    || die "pip install failed"
  echo "$want" > "$stamp"
fi

echo "$PY"
