#!/usr/bin/env bash
# Installs the Debian packages listed in scripts/system-packages.txt, when this
# is a root shell with apt-get (CI's machine); otherwise says what it skipped.
set -euo pipefail
cd "$(dirname "$0")"
mapfile -t packages < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' system-packages.txt)
if [ "${#packages[@]}" -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "system-packages: not root with apt-get; tests needing ${packages[*]} will skip" >&2
    exit 0
fi
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -eq 0 ]; then exit 0; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
