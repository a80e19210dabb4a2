#!/usr/bin/env bash
# Shared set-up for tools/demo.sh and tests/run.sh: install what is missing (Debian 12 packages),
# then configure and build into $WSYNC_BUILD (default: build/). Sourced, not run.
set -euo pipefail

WSYNC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WSYNC_BUILD="${WSYNC_BUILD:-$WSYNC_ROOT/build}"
WSYNC_PACKAGES=(build-essential cmake pkg-config libjansson-dev libcmocka-dev binutils)

wsync_install_missing() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "wsync: installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# wsync_build [extra cmake args...]
wsync_build() {
    wsync_install_missing "${WSYNC_PACKAGES[@]}"
    cmake -S "$WSYNC_ROOT" -B "$WSYNC_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    cmake --build "$WSYNC_BUILD" -j"$(nproc)"
}
