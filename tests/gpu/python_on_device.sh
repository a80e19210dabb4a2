#!/usr/bin/env bash
# The Python layer on the GPU in one go: build the plugins and libwsync_shim.so, the stream-0 C
# test on this code (and, with $OLD_PATCH, on the code before the stream fix, where it must
# fail), the pytest suite (gpu tests included), the Python benchmark. Logs under $OUT.
#   usage: tests/gpu/python_on_device.sh   env: OLD_PATCH (a patch that restores the old plugin),
#   STEPS ("build test digest bench fp8 probe ckpt", default all but probe and ckpt: run them in
#   separate calls on a warm machine; fp8: wsync-bench-cuda --fp8 and bench/python/bench_fp8.py; probe:
#   bench_python.py --staged-probe; ckpt: the converting stage from host memory, wsync demo
#   --model of an f32 checkpoint on the CUDA plugin, bench/python/bench_checkpoint.py;
#   stage: bench/python/bench_stage.py and the C benchmark's stage lines; direct: the C
#   direct sync, wsync-bench-cuda's (e) rows, for DIRECT_PARAMS; pydirect: the Python direct sync
#   of the dense and MoE models, bench/python/bench_direct.py; nsys: an Nsight Systems kernel
#   and copy trace of the staged probe, as CSV); fp8 and probe also sample the card's clocks, power
#   and throttle reasons into $OUT/smi-*.log and print a line of them; PROBE_ARGS: more
#   bench_python.py options for probe (e.g. --probe-variants allocations)
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
if [ -d "$ROOT/.deps/root" ]; then
  D=$ROOT/.deps/root
  export PATH=$D/usr/bin:$PATH LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export PKG_CONFIG_SYSROOT_DIR=$D PKG_CONFIG_LIBDIR=$D/usr/lib/x86_64-linux-gnu/pkgconfig
fi
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi -L | tee "$OUT/machine.log"; python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$OUT/machine.log"
B=$ROOT/build-py
STEPS=${STEPS:-build test digest bench fp8}
# The card's SM clock, power and throttle reasons every 50 ms while a benchmark runs (nvidia-smi,
# into $1), then one line of the samples that were not idle: the SM clock's range, the power's
# peak, and every throttle reason seen besides idle (a card that slows down as a run goes on).
watch_start() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 >"$1" 2>&1 &
  WATCH=$!
}
watch_end() {
  kill "$WATCH" 2>/dev/null; wait "$WATCH" 2>/dev/null
  awk -F', *' 'NF >= 5 && $5 != "0x0000000000000001" {
      n++; c = $2 + 0; w = $4 + 0
      if (n == 1 || c < lo) lo = c; if (c > hi) hi = c; if (w > pw) pw = w
      if ($5 != "0x0000000000000000" && !($5 in r)) { r[$5] = 1; why = why " " $5 } }
    END { printf "%s: %d busy samples, SM clock %d-%d MHz, power at most %.0f W, throttle reasons besides idle:%s\n",
          FILENAME, n, lo, hi, pw, (why == "" ? " none" : why) }' "$1"
}
status=0
if [[ " $STEPS " == *" build "* ]]; then
cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j16 --target wsync_cuda wsync_cuda_broken wsync_cuda_tunable wsync_cpu wsync_shim wsync-bench-cuda \
    torture_gpu_stream0 torture_gpu_torn torture_gpu_sync torture_gpu_cache torture_cuda_init torture_gpu_digest \
    conformance_stage_cuda wsync wsync-engine \
    >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built: $SECONDS s"
fi
export WSYNC_PLUGIN_DIR=$B/lib PYTHONPATH=$ROOT/python PYTHONUNBUFFERED=1
if [[ " $STEPS " == *" test "* ]]; then
(cd "$B" && ctest -R "torture_gpu_stream0|torture_gpu_torn|torture_gpu_sync|torture_gpu_cache|torture_cuda_init|torture_gpu_digest" --output-on-failure) 2>&1 | tee "$OUT/ctest.log" | tail -15 || status=1
if [ -n "${OLD_PATCH:-}" ]; then
  rm -rf /tmp/old && cp -r "$ROOT" /tmp/old && (cd /tmp/old && patch -R -p1 -s <"$OLD_PATCH") &&
  cmake -S /tmp/old -B /tmp/old/b -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1 &&
  cmake --build /tmp/old/b -j16 --target wsync_cuda torture_gpu_stream0 >/dev/null 2>&1 &&
  (echo "=== the stream-0 test on the plugin before the fix (must FAIL):"; /tmp/old/b/tests/torture_gpu_stream0 2>&1 | tail -6) | tee "$OUT/stream0-old.log"
fi
for t in ${PYTESTS:-test_gpu_stream0 test_gpu_torch_handles test_gpu_busy_stream_1000_buckets test_gpu_sync test_gpu_direct test_gpu_fp8}; do
  (cd "$ROOT" && timeout -s INT ${PYT:-70} python3 -m pytest -q -rs -x --tb=short -o faulthandler_timeout=${FHT:-60} \
    tests/python/test_gpu.py tests/python/test_gpu_direct.py tests/python/test_gpu_checker.py \
    tests/python/test_gpu_transactions.py tests/python/test_gpu_fp8.py tests/python/test_gpu_fp8_scales.py \
    tests/python/test_checkpoint_stage.py -k $t 2>&1) >"$OUT/pytest-$t.log"; echo "$t: rc $?"; tail -3 "$OUT/pytest-$t.log"
done
bash "$ROOT/tests/gpu/check_no_device_skips.sh" "$OUT"/ctest.log "$OUT"/pytest-*.log "$B/Testing/Temporary/LastTest.log" || status=1
[ "${HOST_TESTS:-1}" = 1 ] && { (cd "$ROOT" && timeout 150 python3 -m pytest -q -rfEs --tb=line -m "not gpu" tests/python 2>&1) | tee "$OUT/pytest.log" | tail -8 || status=1; }
fi
if [[ " $STEPS " == *" digest "* ]]; then  # the weight checker's digest pass vs read bandwidth
  for v in ${DIGEST_VARIANTS:-0}; do
    echo "=== WSYNC_CUDA_DIGEST_VARIANT=$v"
    WSYNC_CUDA_DIGEST_VARIANT=$v timeout ${BENCH_T:-300} "$B/bin/wsync-bench-cuda" --digest --layout dense --iters ${ITERS:-10} 2>&1
  done | tee "$OUT/bench-digest.log"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  export WSYNC_BENCH_CUDA=${WSYNC_BENCH_CUDA-$B/bin/wsync-bench-cuda}  # empty: skip the C path
  (cd "$ROOT" && timeout ${BENCH_T:-560} python3 bench/python/bench_python.py --iters ${ITERS:-5} ${BENCH_ARGS:-} 2>&1) | tee "$OUT/bench-python.log" | tail -30
fi
if [[ " $STEPS " == *" fp8 "* ]]; then  # the quantizing copy vs the bandwidth limit and torch's loop
  watch_start "$OUT/smi-fp8-c.log"
  timeout ${BENCH_T:-300} "$B/bin/wsync-bench-cuda" --fp8 --layout both --iters ${ITERS:-5} 2>&1 |
    tee "$OUT/bench-fp8-c.log" | grep -E "summary|limit|copy_quantized|busy|EP 8 rank [07]|checked|error|FAIL"
  watch_end "$OUT/smi-fp8-c.log"
  (cd "$ROOT/bench/python" && timeout ${BENCH_T:-560} python3 bench_fp8.py --iters ${ITERS:-5} ${FP8_ARGS:-} 2>&1) |
    tee "$OUT/bench-fp8.log" | tail -30
fi
if [[ " $STEPS " == *" ckpt "* ]]; then  # checkpoints from host memory, converted in the stage
  (cd "$B" && ctest -R conformance_stage_cuda --output-on-failure) 2>&1 | tee "$OUT/ckpt.log" | tail -6
  (cd "$ROOT/tests/python" && python3 -c '
import sys, torch, models
for layout in ("dense", "moe"):
    cfg = models.tiny_config(layout)
    if layout == "moe":
        cfg.mlp_only_layers = []
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(f"/tmp/ckpt-{layout}")
') >>"$OUT/ckpt.log" 2>&1
  for m in dense moe; do
    for e in "" "--engine sglang --tp 2"; do
      echo "=== wsync demo --model /tmp/ckpt-$m --dtype bfloat16 $e (CUDA plugin)"
      timeout 120 "$B/bin/wsync" demo --plugin "$B/lib/libwsync_cuda.so" --model /tmp/ckpt-$m --dtype bfloat16 --syncs 3 $e 2>&1 | tail -5
    done
  done | tee -a "$OUT/ckpt.log"
  (cd "$ROOT/bench/python" && timeout ${BENCH_T:-300} python3 bench_checkpoint.py --gb ${CKPT_GB:-4} --iters ${ITERS:-5} 2>&1) |
    tee "$OUT/bench-checkpoint.log" | tail -12
fi
if [[ " $STEPS " == *" stage "* ]]; then  # the stage's GPU time per bucket, Python-planned and C
  (cd "$ROOT/bench/python" && timeout ${BENCH_T:-300} python3 bench_stage.py --iters ${ITERS:-5} 2>&1) |
    tee "$OUT/bench-stage.log" | tail -12
  timeout 300 "$B/bin/wsync-bench-cuda" --layout dense --iters ${ITERS:-5} --bucket-mib 2048 2>&1 |
    grep -E "stage alone|producer host ms|\(c\) full sync" | tee -a "$OUT/bench-stage.log"
fi
if [[ " $STEPS " == *" probe "* ]]; then  # where the staged Python sync loses to the C path
  export WSYNC_BENCH_CUDA=${WSYNC_BENCH_CUDA-$B/bin/wsync-bench-cuda}
  watch_start "$OUT/smi-probe.log"
  (cd "$ROOT" && timeout ${BENCH_T:-560} python3 bench/python/bench_python.py --staged-probe --iters ${ITERS:-5} \
    ${PROBE_ARGS:-} 2>&1) | tee "$OUT/bench-probe.log" | tail -40
  watch_end "$OUT/smi-probe.log"
fi
if [[ " $STEPS " == *" direct "* ]]; then  # the C direct sync (wsync-bench-cuda (e)) beside its staged sync
  for prm in ${DIRECT_PARAMS:-fused separate}; do
    echo "=== wsync-bench-cuda --layout ${DIRECT_LAYOUT:-both} --params $prm --bucket-mib ${DIRECT_MIB:-2048}"
    timeout ${BENCH_T:-560} "$B/bin/wsync-bench-cuda" --layout ${DIRECT_LAYOUT:-both} --params $prm --iters ${ITERS:-5} \
      --bucket-mib ${DIRECT_MIB:-2048} 2>&1 | grep -E "wsync-bench-cuda|\(a\) |copy_weights  |\(c\) full sync, [0-9]+ buckets through 2|\(e\)|      |summary|error|FAIL"
  done | tee "$OUT/bench-direct.log"
fi
if [[ " $STEPS " == *" pydirect "* ]]; then  # the Python direct sync, dense and MoE, beside the staged one
  (cd "$ROOT/bench/python" && timeout ${BENCH_T:-560} python3 bench_direct.py --iters ${ITERS:-5} ${PYDIRECT_ARGS:-} 2>&1) |
    tee "$OUT/bench-pydirect.log" | tail -30
fi
if [[ " $STEPS " == *" nsys "* ]]; then  # a timeline of the staged Python sync (kernels and copies of both processes)
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -z "$NSYS" ]; then echo "nsys: not found" | tee "$OUT/nsys.log"; else
    (cd "$ROOT" && WSYNC_BENCH_CUDA= timeout ${BENCH_T:-400} "$NSYS" profile -o /tmp/probe --force-overwrite true \
      --trace=cuda,nvtx --sample=none --cpuctxsw=none python3 bench/python/bench_python.py --staged-probe \
      --iters ${ITERS:-2}) >"$OUT/nsys.log" 2>&1
    "$NSYS" stats --report cuda_gpu_trace --format csv --output "$OUT/probe" /tmp/probe.nsys-rep >>"$OUT/nsys.log" 2>&1
    tail -5 "$OUT/nsys.log"; ls -la "$OUT"/probe* 2>/dev/null
  fi
fi
exit $status
