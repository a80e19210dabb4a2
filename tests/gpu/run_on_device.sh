#!/usr/bin/env bash
# Everything the CUDA backend needs a GPU for, in one go (the device tool's one call):
# configure + build (Release), ctest -L gpu, compute-sanitizer memcheck of the copy kernel,
# wsync-bench-cuda --layout both. Logs go to $OUT (or ./device-out) and to stdout.
#   usage: tests/gpu/run_on_device.sh [build-dir]   (env ITERS, default 20)
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/device-out}
BUILD=${1:-$ROOT/build-device}
ITERS=${ITERS:-20}
mkdir -p "$OUT"
if [ -d "$ROOT/.deps/root" ]; then # jansson/cmocka/pkg-config unpacked next to the tree
  D=$ROOT/.deps/root
  export PATH=$D/usr/bin:$PATH LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export PKG_CONFIG_SYSROOT_DIR=$D PKG_CONFIG_LIBDIR=$D/usr/lib/x86_64-linux-gnu/pkgconfig
fi
export PATH=/usr/local/cuda/bin:$PATH
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; date -u; } \
  2>&1 | tee "$OUT/machine.log"
status=0
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${WSYNC_CMAKE_ARGS:-} 2>&1 | tee "$OUT/build.log" || status=1
if [ $status -eq 0 ]; then
  # only what this script runs, so unrelated parts of the tree cannot stop it (ALL=1: everything)
  targets="--target wsync_cuda wsync_cuda_broken wsync-bench-cuda torture_gpu_torn torture_gpu_cache"
  targets="$targets torture_gpu_sync torture_gpu_digest torture_cuda_init"
  [ "${ALL:-0}" = 1 ] && targets=
  cmake --build "$BUILD" -j16 $targets 2>&1 | tail -40 | tee -a "$OUT/build.log" || status=1
fi
if [ $status -ne 0 ]; then echo "BUILD FAILED"; exit 1; fi
(cd "$BUILD" && ctest -L "gpu|cuda" -R "torture_(gpu|cuda)_" --timeout 120 --output-on-failure 2>&1) | tee "$OUT/ctest.log" || status=1
if command -v compute-sanitizer >/dev/null; then
  timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/torture_gpu_digest" 2>&1 \
    | tail -30 | tee "$OUT/sanitizer.log" || status=1
else
  echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"
fi
timeout 240 "$BUILD/bin/wsync-bench-cuda" --layout both --iters "$ITERS" 2>&1 | tee "$OUT/bench.log" || status=1
echo "run_on_device.sh: status $status"
grep -hE "summary|tests passed|tests failed|ERROR SUMMARY" "$OUT"/ctest.log "$OUT"/sanitizer.log "$OUT"/bench.log
exit $status
