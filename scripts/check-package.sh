#!/usr/bin/env bash
# Checks the Debian package end to end ON THIS MACHINE, as root: builds it (scripts/package.sh),
# installs it with dpkg, checks what it installed, enables the unit, fakes what a first start of
# the unit would create, purges it and checks that nothing is left but the event log the README
# says stays. An mcptap package already installed is purged first.
#
#   scripts/check-package.sh
#
# Runs on a fresh Debian (12+) with only the Rust toolchain; installs what it needs (through
# scripts/setup.sh --test and scripts/package.sh). Every check runs even if an earlier one
# failed; the exit status is non-zero if any failed. The package is purged on any exit.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "check-package: must run as root (dpkg -i)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
WORK="$(mktemp -d -t check-package.XXXXXX)"
installed() { dpkg-query -W -f='${Status}' mcptap 2>/dev/null | grep -q 'install ok installed'; }
# Installed, or removed with its conffiles left: dpkg knows it.
known_to_dpkg() { dpkg-query -W -f='${db:Status-Status}' mcptap 2>/dev/null | grep -qvx 'not-installed'; }
SIMULATED=()
cleanup() {
    if known_to_dpkg; then dpkg --purge mcptap >/dev/null 2>&1; fi
    local p
    for p in "${SIMULATED[@]}"; do rm -rf "$p"; done
    rm -rf "$WORK"
}
trap cleanup EXIT

PASSED=0
FAILED=0
FAILED_NAMES=()
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

scripts/setup.sh --test
if known_to_dpkg; then
    echo "check-package: purging the mcptap package already on this machine" >&2
    dpkg --purge mcptap >/dev/null || exit 1
fi
# Every path named mcptap on the system before the install, to compare with after the purge.
mcptap_paths() {
    find /etc /usr /var /opt /srv -xdev -path '*mcptap*' 2>/dev/null | LC_ALL=C sort
}
mcptap_paths > "$WORK/before"

echo "=== scripts/package.sh"
T0=$(date +%s)
if ! scripts/package.sh > "$WORK/package.log" 2>&1; then
    sed 's/^/  /' "$WORK/package.log"
    echo "check-package: scripts/package.sh failed"
    exit 1
fi
DEB=$(tail -n1 "$WORK/package.log")
echo "  $DEB ($(du -k "$DEB" | cut -f1) KiB, built in $(( $(date +%s) - T0 )) s)"
VERSION=$(dpkg-deb -f "$DEB" Version)
# The package's paths, and which of them exist before the install (shared directories).
dpkg-deb -c "$DEB" | awk '{print $6}' | sed 's|^\./|/|; s|/$||' | grep -v '^$' | grep -vx '/' > "$WORK/paths"
while read -r p; do [ -e "$p" ] || [ -L "$p" ] && echo "$p"; done < "$WORK/paths" > "$WORK/preexisting"

# ------------------------------------------------------------------ install
dpkg_install() {
    # --path-include: a minimal image's dpkg.cfg.d may path-exclude man pages and docs.
    dpkg -i --path-include='/usr/share/man/man1/mcptap*' --path-include='/usr/share/doc/mcptap/*' \
        "$DEB" > "$WORK/dpkg-i.log" 2>&1 || { sed 's/^/  /' "$WORK/dpkg-i.log"; return 1; }
    installed || { echo "  not installed after dpkg -i"; return 1; }
    echo "  mcptap $VERSION installed"
}

# What goes where (README, "Install from the Debian package").
UNIT=/usr/lib/systemd/system/mcptap.service
installed_files() {
    local bad=0 f
    for f in /usr/bin/mcptap "$UNIT" /etc/mcptap/mcptap.toml /etc/logrotate.d/mcptap \
             /usr/share/mcptap/alerts/mcptap.rules.yml /usr/share/mcptap/alerts/mcptap.rules.test.yml \
             /usr/share/mcptap/dashboards/mcptap.json \
             /usr/share/mcptap/dashboards/provisioning/dashboards.yml \
             /usr/share/mcptap/dashboards/provisioning/datasource.yml \
             /usr/share/man/man1/mcptap.1.gz \
             /usr/share/bash-completion/completions/mcptap /usr/share/zsh/vendor-completions/_mcptap \
             /usr/share/fish/vendor_completions.d/mcptap.fish /usr/share/doc/mcptap/README.md; do
        if [ -f "$f" ]; then echo "  $(stat -c '%A %U' "$f") $f"; else echo "  missing: $f"; bad=1; fi
    done
    [ -x /usr/bin/mcptap ] || { echo "  /usr/bin/mcptap is not executable"; bad=1; }
    cmp -s mcptap.example.toml /etc/mcptap/mcptap.toml || { echo "  /etc/mcptap/mcptap.toml is not mcptap.example.toml"; bad=1; }
    local conffiles
    conffiles=$(dpkg-query -W -f='${Conffiles}\n' mcptap | awk 'NF {print $1}' | sort | tr '\n' ' ')
    echo "  conffiles: $conffiles"
    [ "$conffiles" = "/etc/logrotate.d/mcptap /etc/mcptap/mcptap.toml " ] || { echo "  unexpected conffiles"; bad=1; }
    # Every file the package holds is one of the above, a man page or the copyright file.
    dpkg -L mcptap | while read -r f; do
        [ -f "$f" ] || continue
        case "$f" in
            /usr/share/man/man1/mcptap*.1.gz|/usr/share/doc/mcptap/copyright) ;;
            /usr/bin/mcptap|"$UNIT"|/etc/mcptap/mcptap.toml|/etc/logrotate.d/mcptap) ;;
            /usr/share/mcptap/*|/usr/share/bash-completion/*|/usr/share/zsh/*|/usr/share/fish/*) ;;
            /usr/share/doc/mcptap/README.md) ;;
            *) echo "  unexpected file: $f"; exit 1 ;;
        esac
    done || bad=1
    return $bad
}

mcptap_version() {
    local out want
    out=$(/usr/bin/mcptap --version) || return 1
    want="mcptap ${VERSION%-*}"
    echo "  $out"
    [ "$out" = "$want" ] || { echo "  want: $want"; return 1; }
    /usr/bin/mcptap check-config /etc/mcptap/mcptap.toml > /dev/null || { echo "  the installed config does not validate"; return 1; }
    echo "  mcptap check-config /etc/mcptap/mcptap.toml: ok"
}

# The subcommands, from the installed binary's own help (so new ones are checked without edits).
subcommands() {
    /usr/bin/mcptap --help | awk '/^Commands:/ {on=1; next} on && /^[^ ]/ {on=0} on && NF {print $1}' | grep -vx help
}

man_page() {
    local bad=0 s subs
    subs=$(subcommands)
    [ -n "$subs" ] || { echo "  no subcommands in mcptap --help"; return 1; }
    [ "$(man -w mcptap 2>/dev/null)" = /usr/share/man/man1/mcptap.1.gz ] \
        || { echo "  man -w mcptap: $(man -w mcptap 2>&1)"; bad=1; }
    # Renders without warnings from groff.
    local warn
    warn=$(MANWIDTH=100 man --warnings -l /usr/share/man/man1/mcptap.1.gz 2>&1 >"$WORK/mcptap.txt")
    [ -z "$warn" ] || { printf '%s\n' "$warn" | sed 's/^/  groff: /'; bad=1; }
    grep -q "mcptap ${VERSION%-*}" "$WORK/mcptap.txt" || { echo "  the man page names no version ${VERSION%-*}"; bad=1; }
    for s in $subs; do
        if ! grep -q "mcptap-$s(1)" "$WORK/mcptap.txt"; then echo "  mcptap(1) does not list $s"; bad=1; fi
        if [ ! -f "/usr/share/man/man1/mcptap-$s.1.gz" ]; then echo "  missing mcptap-$s(1)"; bad=1; continue; fi
        zcat "/usr/share/man/man1/mcptap-$s.1.gz" | grep -q '^\.SH OPTIONS' || { echo "  mcptap-$s(1) has no OPTIONS"; bad=1; }
    done
    # The packaging entry point is no subcommand, so no page and no completion mentions it.
    if grep -rq generate-assets "$WORK/mcptap.txt" /usr/share/man/man1/mcptap*; then echo "  generate-assets leaked"; bad=1; fi
    echo "  subcommands: $(echo $subs); pages: $(ls /usr/share/man/man1/mcptap*.1.gz | xargs -n1 basename | tr '\n' ' ')"
    return $bad
}

completions() {
    local bad=0 s f subs
    subs=$(subcommands)
    for f in /usr/share/bash-completion/completions/mcptap /usr/share/zsh/vendor-completions/_mcptap \
             /usr/share/fish/vendor_completions.d/mcptap.fish; do
        for s in $subs; do grep -qw -- "$s" "$f" || { echo "  $f does not mention $s"; bad=1; }; done
        if grep -q generate-assets "$f"; then echo "  $f mentions generate-assets"; bad=1; fi
    done
    bash -n /usr/share/bash-completion/completions/mcptap || bad=1
    # What bash offers after `mcptap <TAB>` and `mcptap run --<TAB>`.
    local offered
    offered=$(bash -c 'source /usr/share/bash-completion/completions/mcptap
        fn=$(complete -p mcptap | sed -n "s/.*-F \([^ ]*\).*/\1/p")
        COMP_WORDS=(mcptap ""); COMP_CWORD=1; COMP_LINE="mcptap "; COMP_POINT=${#COMP_LINE}
        "$fn" mcptap "" mcptap; echo "${COMPREPLY[*]}"
        COMP_WORDS=(mcptap run --); COMP_CWORD=2; COMP_LINE="mcptap run --"; COMP_POINT=${#COMP_LINE}
        "$fn" mcptap -- run; echo "${COMPREPLY[*]}"')
    for s in $subs; do
        grep -qw -- "$s" <<<"$(sed -n 1p <<<"$offered")" || { echo "  bash does not offer $s"; bad=1; }
    done
    grep -qw -- --interface <<<"$(sed -n 2p <<<"$offered")" || { echo "  bash does not offer run --interface"; bad=1; }
    echo "  bash offers: $(sed -n 1p <<<"$offered")"
    return $bad
}

# The installed unit: systemd-analyze verify is clean (any output counts as a failure, as in
# check-ops.sh), ExecStart is the packaged binary, and it is systemd/mcptap.service otherwise
# (the hardening that check-ops.sh scores), header comment aside.
installed_unit() {
    local out rc
    out=$(SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no "$UNIT" 2>&1); rc=$?
    if [ $rc -ne 0 ] || [ -n "$out" ]; then
        printf '%s\n' "$out" | sed 's/^/  /'; echo "  systemd-analyze verify: rc=$rc"; return 1
    fi
    echo "  systemd-analyze verify $UNIT: clean"
    grep -qxF 'ExecStart=/usr/bin/mcptap run --config /etc/mcptap/mcptap.toml' "$UNIT" \
        || { echo "  ExecStart is not /usr/bin/mcptap"; return 1; }
    diff <(grep -v '^#' systemd/mcptap.service | sed 's|/usr/local/bin/mcptap|/usr/bin/mcptap|') \
         <(grep -v '^#' "$UNIT") | sed 's/^/  /'
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "  the installed unit differs from systemd/mcptap.service"; return 1; }
    systemctl is-enabled mcptap.service >/dev/null 2>&1 && { echo "  enabled on install"; return 1; }
    echo "  same directives as systemd/mcptap.service; not enabled"
    logrotate -d -s "$WORK/logrotate.state" /etc/logrotate.d/mcptap >/dev/null 2>&1 \
        || { echo "  logrotate -d /etc/logrotate.d/mcptap failed"; return 1; }
}

# What the operator and a first start would add: `systemctl enable` (works without systemd
# running) and the DynamicUser StateDirectory=/LogsDirectory= (private dirs + symlinks), made
# here by hand unless this machine already has them.
simulate_use() {
    systemctl enable mcptap.service >/dev/null 2>&1 || { echo "  systemctl enable failed"; return 1; }
    [ -L /etc/systemd/system/multi-user.target.wants/mcptap.service ] || { echo "  not enabled"; return 1; }
    local d
    for d in lib log; do
        if [ -e "/var/$d/mcptap" ] || [ -e "/var/$d/private/mcptap" ]; then
            echo "  /var/$d/mcptap exists on this machine: not faking a first start"; return 0
        fi
    done
    for d in lib log; do
        [ -e "/var/$d/private" ] || SIMULATED+=("/var/$d/private")
        SIMULATED+=("/var/$d/private/mcptap" "/var/$d/mcptap")
        install -d -m 0700 "/var/$d/private"
        install -d -m 0755 "/var/$d/private/mcptap"
        ln -s private/mcptap "/var/$d/mcptap"
    done
    echo '{"event":"alert"}' > /var/log/private/mcptap/events.ndjson
    echo '{"event":"alert"}' | gzip > /var/log/private/mcptap/events.ndjson.2.gz
    echo "  enabled; faked /var/lib/mcptap and /var/log/mcptap (with an events file)"
}

# ------------------------------------------------------------------ purge
dpkg_purge() {
    dpkg --purge mcptap > "$WORK/dpkg-purge.log" 2>&1 || { sed 's/^/  /' "$WORK/dpkg-purge.log"; return 1; }
    grep -v '^(Reading database' "$WORK/dpkg-purge.log" | sed 's/^/  /'
    ! known_to_dpkg || { echo "  still known to dpkg: $(dpkg-query -W -f='${Status}' mcptap)"; return 1; }
}

# After the purge: every path of the package that was not there before is gone, and the paths
# named mcptap are those of before plus the event log (README: it stays).
nothing_left() {
    local bad=0 p
    while read -r p; do
        grep -qxF -- "$p" "$WORK/preexisting" && continue
        if [ -e "$p" ] || [ -L "$p" ]; then echo "  left behind: $p"; bad=1; fi
    done < "$WORK/paths"
    mcptap_paths > "$WORK/after"
    local kept=()
    if [ -L /var/log/mcptap ] && [[ " ${SIMULATED[*]} " == *" /var/log/mcptap "* ]]; then
        kept=(/var/log/mcptap /var/log/private/mcptap /var/log/private/mcptap/events.ndjson
              /var/log/private/mcptap/events.ndjson.2.gz)
        [ -f /var/log/mcptap/events.ndjson ] || { echo "  the event log was removed"; bad=1; }
        [ ! -e /var/lib/mcptap ] && [ ! -L /var/lib/mcptap ] && [ ! -e /var/lib/private/mcptap ] \
            || { echo "  the state directory was not removed"; bad=1; }
    fi
    { cat "$WORK/before"; printf '%s\n' "${kept[@]}"; } | grep -v '^$' | LC_ALL=C sort -u > "$WORK/expected"
    if ! diff "$WORK/expected" "$WORK/after" > "$WORK/diff"; then
        sed 's/^/  /' "$WORK/diff"; echo "  ('>' is left behind, '<' went missing)"; bad=1
    fi
    echo "  left: ${kept[*]:-nothing}"
    return $bad
}

if check "dpkg -i" dpkg_install; then
    check "installed files and conffiles" installed_files
    check "mcptap --version" mcptap_version
    check "man pages" man_page
    check "shell completions" completions
    check "installed systemd unit" installed_unit
    check "enable + first-start directories" simulate_use
    check "dpkg --purge" dpkg_purge
    check "nothing left but the event log" nothing_left
fi

echo
echo "check-package: $PASSED passed, $FAILED failed"
if [ "$FAILED" -gt 0 ]; then
    printf '  failed: %s\n' "${FAILED_NAMES[@]}"
    exit 1
fi
