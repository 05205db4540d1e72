#!/bin/sh
# Download onnxruntime's C API headers from Debian's libonnxruntime-dev (trixie) into DEST.
# Usage: ops/fetch_ort_headers.sh DEST
# Uses a throw-away apt state folder, so the system's apt configuration is left alone.
# Prints the include directory (the folder holding onnxruntime_c_api.h) on success.
set -eu
DEST=${1:?usage: fetch_ort_headers.sh DEST}
SUITE=${ONNXQ_DEBIAN_SUITE:-trixie}
MIRROR=${ONNXQ_DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v apt-get >/dev/null 2>&1 || { echo "fetch_ort_headers: apt-get not found" >&2; exit 1; }
command -v dpkg >/dev/null 2>&1 || { echo "fetch_ort_headers: dpkg not found" >&2; exit 1; }
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
STATE=$(mktemp -d)
trap 'rm -rf "$STATE"' EXIT
mkdir -p "$STATE/lists/partial" "$STATE/cache/archives/partial" "$STATE/etc/preferences.d"
echo "deb $MIRROR $SUITE main" > "$STATE/sources.list"
APT_OPTS="-o Dir::State::Lists=$STATE/lists -o Dir::State::status=/dev/null \
 -o Dir::Cache=$STATE/cache -o Dir::Etc::SourceList=$STATE/sources.list \
 -o Dir::Etc::SourceParts=/dev/null -o Dir::Etc::Preferences=/dev/null \
 -o Dir::Etc::PreferencesParts=$STATE/etc/preferences.d -o APT::Get::List-Cleanup=0 \
 -o Acquire::Languages=none -o Debug::NoLocking=1 -o APT::Sandbox::User=root"
# shellcheck disable=SC2086
apt-get $APT_OPTS update >&2
cd "$STATE"
# shellcheck disable=SC2086
apt-get $APT_OPTS download libonnxruntime-dev >&2
DEB=$(ls "$STATE"/libonnxruntime-dev_*.deb | head -n 1)
dpkg -x "$DEB" "$DEST/root"
HEADER=$(find "$DEST/root" -name onnxruntime_c_api.h | head -n 1)
[ -n "$HEADER" ] || { echo "fetch_ort_headers: no onnxruntime_c_api.h in $DEB" >&2; exit 1; }
dirname "$HEADER"
