#!/usr/bin/env bash
# Everything the CUDA backend needs a GPU for, in one go (the device tool's one call):
# configure + build (Release, sm_90), ctest -L 'gpu|cuda' (the conformance suite's cuda runs
# included when it builds) with each staging kind (legacy IPC, then cuda_vmm_fd),
# compute-sanitizer memcheck of the copy and convert kernels,
# wsync-bench-cuda --layout both for each staging kind (engine parameters fused, as engines hold
# them), --layout moe --params separate once (one cudaMalloc per tensor; bench-moe-separate.log),
# --layout moe --order grouped once (the trainer's experts grouped; bench-moe-grouped.log),
# --lora, --pingpong and --lanes, and the fault
# test's per-trial figures for each staging kind. Logs go to $OUT (or
# ./device-out) and to stdout.
#   usage: tests/gpu/run_on_device.sh [build-dir]
#   env: ITERS (default 20), KINDS (staging kinds benchmarked, default "ipc vmm"),
#        ALL=1 (build every target), WSYNC_CMAKE_ARGS
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/device-out}
BUILD=${1:-$ROOT/build-device}
ITERS=${ITERS:-20}
KINDS=${KINDS:-ipc vmm}
mkdir -p "$OUT"
if [ -d "$ROOT/.deps/root" ]; then # jansson/cmocka/pkg-config unpacked next to the tree
  D=$ROOT/.deps/root
  export PATH=$D/usr/bin:$PATH LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export PKG_CONFIG_SYSROOT_DIR=$D PKG_CONFIG_LIBDIR=$D/usr/lib/x86_64-linux-gnu/pkgconfig
fi
export PATH=/usr/local/cuda/bin:$PATH
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; date -u; uname -r
  echo "yama ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 'none (no Yama: default staging kind cuda_vmm_fd)')"; } \
  2>&1 | tee "$OUT/machine.log"
status=0
t0=$(date +%s)
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${WSYNC_CMAKE_ARGS:-} >"$OUT/build.log" 2>&1 || status=1
if [ $status -eq 0 ]; then
  # only what this script runs, so unrelated parts of the tree cannot stop it (ALL=1: everything)
  targets="--target wsync_cuda wsync_cuda_broken wsync-bench-cuda torture_gpu_torn torture_gpu_cache"
  targets="$targets torture_gpu_sync torture_gpu_moe_order torture_gpu_digest torture_gpu_adapter torture_cuda_init"
  targets="$targets torture_gpu_soak torture_gpu_fault"
  [ "${ALL:-0}" = 1 ] && targets=
  cmake --build "$BUILD" -j16 $targets >>"$OUT/build.log" 2>&1 || status=1
fi
tail -5 "$OUT/build.log"
if [ $status -ne 0 ]; then tail -60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; fi
# other suites labelled gpu (conformance x cuda) run when they build
excl=
if [ "${ALL:-0}" != 1 ] && ! cmake --build "$BUILD" -j16 --target wsync_conformance >>"$OUT/build.log" 2>&1; then
  echo "wsync_conformance did not build: its gpu tests are left out"; excl="-E conformance"
fi
echo "build: $(( $(date +%s) - t0 )) s"
: >"$OUT/ctest.log"
for kind in ipc vmm; do
  echo "=== ctest, WSYNC_CUDA_STAGING_KIND=$kind" | tee -a "$OUT/ctest.log"
  (cd "$BUILD" && WSYNC_CUDA_STAGING_KIND=$kind ctest -L "gpu|cuda" $excl --timeout 300 \
    --output-on-failure 2>&1) >>"$OUT/ctest.log" || status=1
  grep -E "tests passed|tests failed|Failed|Not Run|\*\*\*|buckets torn|equals" "$OUT/ctest.log" | tail -12
  (cd "$BUILD" && WSYNC_CUDA_STAGING_KIND=$kind ./tests/torture_gpu_torn 2>&1 | grep -E "torn|PASSED|FAILED") | tee -a "$OUT/ctest.log"
done
bash "$ROOT/tests/gpu/check_no_device_skips.sh" "$OUT/ctest.log" "$BUILD/Testing/Temporary/LastTest.log" || status=1
echo "ctest: $(( $(date +%s) - t0 )) s"
if command -v compute-sanitizer >/dev/null; then
  for t in torture_gpu_digest torture_gpu_adapter; do
    timeout 240 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
      "$BUILD/tests/$t" >"$OUT/sanitizer-$t.log" 2>&1 || status=1
    echo "$t: $(grep -c "ERROR SUMMARY: 0 errors" "$OUT/sanitizer-$t.log") clean summaries;" \
      "$(grep -E "ERROR SUMMARY" "$OUT/sanitizer-$t.log" | grep -vc " 0 errors") with errors;" \
      "$(grep -E "PASSED|FAILED" "$OUT/sanitizer-$t.log" | tail -2 | tr '\n' ' ')"
  done | tee "$OUT/sanitizer.log"
else
  echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"
fi
echo "sanitizer: $(( $(date +%s) - t0 )) s"
: >"$OUT/bench.log"
for kind in $KINDS; do
  echo "=== wsync-bench-cuda, WSYNC_CUDA_STAGING_KIND=$kind" | tee -a "$OUT/bench.log"
  WSYNC_CUDA_STAGING_KIND=$kind timeout 300 "$BUILD/bin/wsync-bench-cuda" --layout both \
    --iters "$ITERS" >>"$OUT/bench.log" 2>&1 || status=1
  echo "bench $kind: $(( $(date +%s) - t0 )) s"
done
# the MoE layout once more into one cudaMalloc per tensor instead of the fused w13/w2 (first kind)
read -r sep_kind _ <<<"$KINDS"
echo "=== wsync-bench-cuda --layout moe --params separate, WSYNC_CUDA_STAGING_KIND=${sep_kind:-default}" \
  "(bench-moe-separate.log)" | tee -a "$OUT/bench.log"
env ${sep_kind:+WSYNC_CUDA_STAGING_KIND=$sep_kind} timeout 300 "$BUILD/bin/wsync-bench-cuda" --layout moe \
  --params separate --iters "$ITERS" >"$OUT/bench-moe-separate.log" 2>&1 || status=1
echo "bench moe separate: $(( $(date +%s) - t0 )) s"
# and with the trainer's experts grouped as Megatron holds them (every gate and up, then downs)
echo "=== wsync-bench-cuda --layout moe --order grouped (bench-moe-grouped.log)" | tee -a "$OUT/bench.log"
env ${sep_kind:+WSYNC_CUDA_STAGING_KIND=$sep_kind} timeout 300 "$BUILD/bin/wsync-bench-cuda" --layout moe \
  --order grouped --iters "$ITERS" >"$OUT/bench-moe-grouped.log" 2>&1 || status=1
echo "bench moe grouped: $(( $(date +%s) - t0 )) s"
echo "=== wsync-bench-cuda --lora" | tee -a "$OUT/bench.log"
timeout 200 "$BUILD/bin/wsync-bench-cuda" --lora --iters "$ITERS" >>"$OUT/bench.log" 2>&1 || status=1
echo "=== wsync-bench-cuda --pingpong" | tee -a "$OUT/bench.log"
timeout 200 "$BUILD/bin/wsync-bench-cuda" --pingpong --iters "$ITERS" 2>&1 | tee -a "$OUT/bench.log" || status=1
echo "=== wsync-bench-cuda --lanes" | tee -a "$OUT/bench.log"
timeout 200 "$BUILD/bin/wsync-bench-cuda" --lanes --iters "$ITERS" >"$OUT/lanes.log" 2>&1 || status=1
grep -E "layout|kernel alone|\(a\)|\(b\)|only|lanes|K=" "$OUT/lanes.log" | head -40 | tee -a "$OUT/bench.log"
echo "=== torture_gpu_fault, both staging kinds (figures for docs/RELIABILITY.md)" | tee "$OUT/fault.log"
for kind in ipc vmm; do
  WSYNC_CUDA_STAGING_KIND=$kind timeout 200 "$BUILD/tests/torture_gpu_fault" >>"$OUT/fault.log" 2>&1 || status=1
done
grep -E "^\[(ipc|vmm)\]" "$OUT/fault.log" | grep -vE "^\[plugin" | tail -30
echo "run_on_device.sh: status $status, $(( $(date +%s) - t0 )) s"
grep -hE "summary|tests passed|tests failed|buckets torn" "$OUT"/ctest.log "$OUT"/bench.log \
  "$OUT"/bench-moe-separate.log "$OUT"/bench-moe-grouped.log
grep -hE "=== |copy_weights|kernel variant|\(a|\(b|\(c|\(d|FROM_|baseline|verified|wsync-bench-cuda" "$OUT/bench.log" >"$OUT/bench-short.log"
exit $status
