#!/usr/bin/env bash
# Builds the Debian package: target/debian/mcptap_<version>-1_<arch>.deb.
#
#   scripts/package.sh
#
# Installs cargo-deb (pinned, into ~/.cargo/bin) and libpcap-dev/dpkg-dev if missing, builds the
# release binary, generates its assets into target/deb-assets/ (man pages and shell
# completions from the clap definition, the systemd unit with /usr/bin paths) and runs
# `cargo deb --no-build`. What goes where: [package.metadata.deb] in Cargo.toml and the README
# ("Install from the Debian package"). Prints the path of the .deb on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0

scripts/setup.sh
if ! dpkg-query -W -f='${Status}' dpkg-dev 2>/dev/null | grep -q 'install ok installed'; then
    # cargo-deb's "$auto" dependencies come from dpkg-shlibdeps.
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    echo "package: installing dpkg-dev" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends dpkg-dev >/dev/null
fi
if [[ "$(cargo deb --version 2>/dev/null)" != *" $CARGO_DEB_VERSION"* ]]; then
    echo "package: installing cargo-deb $CARGO_DEB_VERSION (once; cached in ~/.cargo/bin)" >&2
    cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --quiet
fi

cargo build --release --locked --bin mcptap
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
# Under ./target whatever CARGO_TARGET_DIR says: Cargo.toml names these paths relative to the crate.
ASSETS=target/deb-assets
rm -rf "$ASSETS"
"$TARGET_DIR/release/mcptap" generate-assets "$ASSETS"
mkdir -p "$ASSETS/systemd"
# -n: no name or timestamp in the gzip header, so the same sources give the same package.
gzip -9nf "$ASSETS"/man/*.1

# The unit as the package installs it: the binary is /usr/bin/mcptap, not /usr/local/bin.
# Everything else, the hardening included, is systemd/mcptap.service unchanged.
sed -e 's|/usr/local/bin/mcptap|/usr/bin/mcptap|g' \
    -e '\|^# Install: |,\|enable --now mcptap$|c\
# Installed by the mcptap Debian package, not enabled: set the interfaces in\
# /etc/mcptap/mcptap.toml, then `systemctl enable --now mcptap`. Local changes go in a drop-in\
# (`systemctl edit mcptap`), not in this file.' \
    systemd/mcptap.service > "$ASSETS/systemd/mcptap.service"
grep -qxF 'ExecStart=/usr/bin/mcptap run --config /etc/mcptap/mcptap.toml' "$ASSETS/systemd/mcptap.service" || {
    echo "package: systemd/mcptap.service has no ExecStart=/usr/local/bin/mcptap ... line to adapt" >&2
    exit 1
}
if grep -q /usr/local "$ASSETS/systemd/mcptap.service"; then
    echo "package: the packaged unit still names /usr/local" >&2
    exit 1
fi

# --no-build: the binary above, built --locked. cargo-deb strips it.
cargo deb --no-build --locked
