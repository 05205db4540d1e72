#!/bin/sh
# Build onnxq_host into BUILD_DIR (the program is BUILD_DIR/onnxq_host).
#
#   examples/host/build.sh BUILD_DIR
#
# Links the onnxruntime shared library that the onnxruntime Python wheel ships (found with
# $PYTHON, default python3 then python), or $ONNXRUNTIME_LIBRARY. The C API headers come from
# $ONNXRUNTIME_INCLUDE_DIR, the ones the onnxq build already fetched (ops/build/ort), or Debian's
# libonnxruntime-dev, fetched into BUILD_DIR/ort by ops/fetch_ort_headers.sh.
set -eu
BUILD=${1:?usage: examples/host/build.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
fail() { echo "build.sh: $*" >&2; exit 1; }

command -v cmake >/dev/null 2>&1 || fail "cmake not found"

LIB=${ONNXRUNTIME_LIBRARY:-}
if [ -z "$LIB" ]; then
    PY=${PYTHON:-}
    if [ -z "$PY" ]; then
        PY=python3
        command -v "$PY" >/dev/null 2>&1 || PY=python
    fi
    CAPI=$("$PY" -c "import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))") \
        || fail "cannot import onnxruntime with $PY (install it, or set ONNXRUNTIME_LIBRARY)"
    LIB=$(ls "$CAPI"/libonnxruntime.so.* "$CAPI"/libonnxruntime.*.dylib 2>/dev/null | head -n 1 || true)
    [ -n "$LIB" ] || fail "no libonnxruntime.so.* in $CAPI"
fi
[ -f "$LIB" ] || fail "onnxruntime library not found: $LIB"

INC=${ONNXRUNTIME_INCLUDE_DIR:-}
if [ -z "$INC" ]; then
    for h in "$ROOT/ops/build/ort" "$BUILD/ort"; do
        f=$(find "$h" -name onnxruntime_c_api.h 2>/dev/null | head -n 1 || true)
        if [ -n "$f" ]; then INC=$(dirname "$f"); break; fi
    done
fi
if [ -z "$INC" ]; then
    echo "build.sh: fetching the onnxruntime headers (Debian libonnxruntime-dev)" >&2
    INC=$(sh "$ROOT/ops/fetch_ort_headers.sh" "$BUILD/ort") || INC=""
    INC=$(printf '%s\n' "$INC" | tail -n 1)
    [ -n "$INC" ] || fail "no onnxruntime headers (fetching them failed): set ONNXRUNTIME_INCLUDE_DIR"
fi
[ -f "$INC/onnxruntime_c_api.h" ] || fail "no onnxruntime headers: no onnxruntime_c_api.h in $INC"

cmake -S "$HERE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    "-DONNXRUNTIME_LIBRARY=$LIB" "-DONNXRUNTIME_INCLUDE_DIR=$INC" >&2
cmake --build "$BUILD" -j 4 >&2
echo "$BUILD/onnxq_host"
