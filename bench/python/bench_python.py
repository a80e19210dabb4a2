"""Python benchmark (a program, not a test): a Qwen3-8B-shaped dense model (399 bf16 tensors,
16.4 GB) from torch trainer tensors into torch engine parameters (SGLang's fused layout) on one
GPU, two processes. Prints ratios against baselines run in the same processes:

  foreign path (trainer storage exported with torch's handle, one wsync copy into 399 engine
  parameters) against one flat copy_ of the same bytes (one cudaMemcpyAsync: the physical limit)
  and torch's per-tensor param.copy_(view) loop over the same imported storage;
  staged sync (Producer -> EngineWorker, wall clock on the trainer, with the host time it spends
  staging and waiting for replies), for the bucket sizes and buffer sets in STAGED;
  direct sync (Producer(direct=True) -> EngineWorker: the engine copies straight from the
  trainer's own parameters, one pass over HBM; wall clock on the trainer, request to consumed);
  the C path (wsync-bench-cuda's dense sync, $WSYNC_BENCH_CUDA) in the same run, first, while
  this program holds no GPU memory (both fit one 80 GB card that way), and again at the end with
  that memory freed: the Python syncs are compared with each C run and with their mean, so a
  card that slows as the run goes on shows instead of landing on one side.

  usage: python bench/python/bench_python.py [--iters N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import statistics
import time

import torch

L, H, NH, KV, HD, FF, V = 36, 4096, 32, 8, 128, 12288, 151936


def attention_shapes(p, h, nh, kv, hd):
    """A Qwen3 layer's attention and norms (prefix p = "model.layers.<i>.")."""
    return {p + "self_attn.q_proj.weight": (nh * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
            p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, nh * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}


def hf_shapes():
    s = {"model.embed_tokens.weight": (V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        s |= attention_shapes(p, H, NH, KV, HD)
        s |= {p + "mlp.gate_proj.weight": (FF, H), p + "mlp.up_proj.weight": (FF, H), p + "mlp.down_proj.weight": (H, FF)}
    s |= {"model.norm.weight": (H,), "lm_head.weight": (V, H)}
    return s


def flat_views(flat, shapes):
    """(name, view) of each tensor of `shapes` packed one after another in the 1-D tensor flat."""
    views, at = [], 0
    for n, s in shapes.items():
        k = torch.Size(s).numel()
        views.append((n, flat[at: at + k].view(s)))
        at += k
    return views


def engine_shapes():
    s = {}
    for n, sh in hf_shapes().items():
        if n.endswith("q_proj.weight"):
            s[n.replace("q_proj", "qkv_proj")] = ((NH + 2 * KV) * HD, H)
        elif n.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        elif n.endswith("gate_proj.weight"):
            s[n.replace("gate_proj", "gate_up_proj")] = (2 * FF, H)
        else:
            s[n] = sh
    return s


# HF name -> (engine name, row offset) for the per-tensor copy_ loop baseline
def hf_to_engine(n):
    for a, b, off in (("q_proj", "qkv_proj", 0), ("k_proj", "qkv_proj", NH * HD), ("v_proj", "qkv_proj", (NH + KV) * HD),
                      ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", FF)):
        if n.endswith(a + ".weight"):
            return n.replace(a, b), off
    return n, 0


CFG = {"hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": HD,
       "intermediate_size": FF, "vocab_size": V}


# the foreign path under the plugin's copy settings (docs/PERFORMANCE.md): default, kernel only,
# every op on the copy engines
FOREIGN_ENV = ({}, {"WSYNC_CUDA_CE_SHARE": "0"}, {"WSYNC_CUDA_CE_MIN_BYTES": "0"},
               {"WSYNC_CUDA_CE_MIN_BYTES": "0", "WSYNC_CUDA_CE_PER_OP": "1"},
               {"WSYNC_CUDA_CE_MIN_BYTES": "0", "WSYNC_CUDA_CE_PER_OP": "1", "WSYNC_CUDA_CE_LANES": "1"})
# staged syncs measured: (bucket MiB, buffer sets)
STAGED = ((2048, 2), (2048, 3), (1280, 3), (1280, 4))
C_BUCKET_MIB = 2048
STAGED_MS = []  # (bucket MiB, sets, the buckets' order (--probe-orders) or None, median ms), filled by main
DIRECT = (1024, 2048, 0)  # direct syncs measured: bucket MiB (0: the whole model in one request)
# ... each under these copy settings of the engine (docs/PERFORMANCE.md)
# GPU_ONLY: the engine queues its copies behind a ~50 ms sleep on its stream and times them from
# the sleep's end to the last one: the copies' GPU time without the host's work
DIRECT_ENV = ({}, {"WSYNC_CUDA_CE_SHARE": "0"}, {"GPU_ONLY": "1"})
DIRECT_MS = []  # (what, median ms) of the direct syncs, filled by main
BASE_MS = {}  # the flat copy and the copy_ loop, for the direct sync's ratios


def plugin():
    """The benchmarks' build of the CUDA plugin (it reads the WSYNC_CUDA_CE_* settings this program
    changes between syncs; plugin/cuda/wsync_cuda_tuning.h), else the product's."""
    import wsync

    lib = str(wsync._native.lib_dir())
    tunable = os.path.join(lib, "libwsync_cuda_tunable.so")
    return tunable if os.path.exists(tunable) else os.path.join(lib, "libwsync_cuda.so")


# --staged-probe: the staged sync (2048 MiB buckets, 2 sets) three ways, to find where it loses
# to the C path: as trainers hold parameters (one allocation each), with every parameter a view of
# one storage (as the C path's trainer holds them), and with the trainer and the engine each on a
# side stream instead of the legacy default stream; with every copy of the trainer's stage (then
# also of the engine's copy) on the copy engines (WSYNC_CUDA_CE_MIN_BYTES=0 in that process: a
# copy engine runs beside another process's kernels, where two processes' kernels take turns);
# each with the last sync's per-bucket timeline
PROBE = ("allocations", "one storage", "side streams", "stage on copy engines", "both on copy engines")
ALL_CE = {"WSYNC_CUDA_CE_MIN_BYTES": "0", "WSYNC_CUDA_CE_SHARE": "1"}


def trainer(conn, iters, skip_staged=False, probe=(), probe_sets=2, orders=(None,)):
    from wsync.export import TorchExport

    shapes = hf_shapes()
    total = sum(torch.Size(s).numel() for s in shapes.values()) * 2
    flat = torch.randn(total // 2, dtype=torch.bfloat16, device="cuda")  # one storage for the foreign path
    views = flat_views(flat, shapes)
    exp = TorchExport("sglang")
    msgs = [exp.messages(views)[0] for _ in range((2 * iters + 1) * len(FOREIGN_ENV))]  # a generation per copy
    from torch.multiprocessing.reductions import reduce_tensor
    conn.send(("foreign", msgs, reduce_tensor(flat), total))
    conn.recv()
    # staged sync: separate trainer tensors, as a trainer's parameters
    params = {n: torch.randn(s, device="cuda").to(torch.bfloat16) for n, s in shapes.items()}
    torch.cuda.synchronize()
    if probe:
        del flat
        for variant in probe:
            conn.send(("variant", variant, None, None))
            conn.recv()
            ps, side = params, None
            if variant == "one storage":
                one = torch.empty(total // 2, dtype=torch.bfloat16, device="cuda")
                ps, at = {}, 0
                for n, t in params.items():
                    ps[n] = one[at: at + t.numel()].view(t.shape)
                    ps[n].copy_(t)
                    at += t.numel()
                torch.cuda.synchronize()
            elif variant == "side streams":
                side = torch.cuda.Stream()
            if variant.endswith("on copy engines"):
                os.environ.update(ALL_CE)  # the tunable plugin reads it per call
            for order in orders:
                staged(conn, ps, 2048, probe_sets, iters, stream=side, order=order)
        conn.send(("done", None, None, None))
        return
    for bucket_mib, nbuf in () if skip_staged else STAGED:
        staged(conn, params, bucket_mib, nbuf, iters)
    for mib in DIRECT:
        for env in DIRECT_ENV:
            conn.send(("env", env, None, None))
            conn.recv()
            direct(conn, params, iters, mib)
    conn.send(("done", None, None, None))


def direct(conn, params, iters, bucket_mib):
    """Timed direct syncs: the engine reads the trainer's parameters in place; buckets of
    bucket_mib (0: one request) pipeline the engine's host work with the GPU's copies."""
    import wsync

    nbytes = (bucket_mib << 20) if bucket_mib else sum(t.numel() * t.element_size() for t in params.values())
    with wsync.Producer("sglang", device="cuda", direct=True, bucket_bytes=nbytes, plugin=plugin()) as prod:
        times = timed_syncs(conn, prod, params, iters)
    conn.send(("direct", (bucket_mib, times[1:]), None, None))
    conn.recv()


def timed_syncs(conn, prod, params, iters, mark=False):
    """iters + 1 syncs of params through prod, each request sent down conn and its reply read back
    when the Producer needs it; then ("release", None) and its answer. mark: each sync's start on
    the host clock sent first, as ("t0", seconds). Each sync's wall clock, ms."""
    times = []

    def send(m):
        conn.send_bytes(m.encode())
        return lambda: [conn.recv_bytes().decode()]
    for k in range(iters + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mark:
            conn.send(("t0", t0))
        prod.sync(params, send, weight_version=str(k))
        times.append((time.perf_counter() - t0) * 1e3)
    conn.send(("release", None))
    conn.recv()
    return times


class GpuClock:
    """A stream's GPU times on the host's perf_counter clock (one clock for both processes): an
    event recorded and waited for at the start anchors the stream's timeline (~10 us)."""

    def __init__(self, stream=None):
        self.stream = stream or torch.cuda.current_stream()
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record(self.stream)
        self.base.synchronize()
        self.t0 = time.perf_counter()
        self.events = []

    def mark(self, what):
        e = torch.cuda.Event(enable_timing=True)
        e.record(self.stream)
        self.events.append((what, e))

    def times(self):
        torch.cuda.synchronize()
        return [(w, self.t0 + self.base.elapsed_time(e) / 1e3) for w, e in self.events]


def staged(conn, params, bucket_mib, nbuf, iters, stream=None, order=None):
    """Timed syncs through a Producer; the host time spent staging and waiting for replies, and
    the last sync's timeline (perf_counter: one clock for both processes)."""
    import wsync

    times, parts = [], []
    spent = {"stage": 0.0, "send": 0.0}
    marks = []  # (what, perf_counter) of the current sync
    with wsync.Producer("sglang", bucket_bytes=bucket_mib << 20, device="cuda", digests=False,
                        buffers=nbuf, plugin=plugin()) as prod:
        if order:  # the order a sync stages and sends its buckets (Producer(stage_first=))
            prod.stage_first = order == "stage-first"
        stage_set, publish_set = prod._stage_set, prod._publish_set  # each bucket's, inside sync()

        clock = [None]

        def timed_stage(*a, **k):
            t = time.perf_counter()
            marks.append(("stage", t))
            clock[0].mark("gpu stage")
            try:
                return stage_set(*a, **k)
            finally:
                spent["stage"] += time.perf_counter() - t

        def timed_publish(*a, **k):
            t = time.perf_counter()
            try:
                return publish_set(*a, **k)
            finally:
                spent["stage"] += time.perf_counter() - t
                marks.append(("staged", time.perf_counter()))
                clock[0].mark("gpu staged")
        prod._stage_set, prod._publish_set = timed_stage, timed_publish

        def send(m):  # the replies are read when the Producer needs them (a deferred reply)
            t = time.perf_counter()
            conn.send_bytes(m.encode())
            spent["send"] += time.perf_counter() - t
            marks.append(("sent", time.perf_counter()))

            def replies():
                t = time.perf_counter()
                r = [conn.recv_bytes().decode()]
                spent["send"] += time.perf_counter() - t
                marks.append(("reply", time.perf_counter()))
                return r
            return replies
        for k in range(iters + 1):
            spent["stage"] = spent["send"] = 0.0
            marks.clear()
            clock[0] = GpuClock(stream)
            t0 = time.perf_counter()
            marks.append(("sync", t0))
            prod.sync(params, send, weight_version=str(k), stream=stream)
            times.append((time.perf_counter() - t0) * 1e3)
            marks.append(("done", time.perf_counter()))
            marks.extend(clock[0].times())
            parts.append((spent["stage"] * 1e3, spent["send"] * 1e3))
        conn.send(("release", None))
        conn.recv()
    conn.send(("staged", (bucket_mib, nbuf, times[1:], parts[1:], list(marks), order), None, None))
    conn.recv()


def event_ms(fn, iters):
    out = []
    for _ in range(iters + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--foreign-only", action="store_true", help="skip the staged sync")
    ap.add_argument("--skip-staged", action="store_true", help="foreign and direct syncs only")
    ap.add_argument("--staged-probe", action="store_true", help="the staged sync three ways, with timelines (PROBE)")
    ap.add_argument("--probe-sets", type=int, default=2, help="--staged-probe: the Producer's buffer sets")
    ap.add_argument("--probe-orders", default="",
                    help="--staged-probe: each variant with the Producer's buckets in these orders, comma "
                         "separated: stage-first (the default), send-first (Producer(stage_first=False))")
    ap.add_argument("--probe-variants", default=",".join(PROBE),
                    help="--staged-probe: the variants to run, comma separated (default: all of PROBE)")
    args = ap.parse_args()
    iters = args.iters
    variants = tuple(v for v in args.probe_variants.split(",") if v) if args.staged_probe else ()
    bad = [v for v in variants if v not in PROBE]
    if bad:
        ap.error(f"--probe-variants: {bad[0]!r} is none of {', '.join(PROBE)}")
    orders = tuple(args.probe_orders.split(",")) if args.probe_orders else (None,)
    bad = [o for o in orders if o not in (None, "stage-first", "send-first")]
    if bad:
        ap.error(f"--probe-orders: {bad[0]!r} is neither stage-first nor send-first")
    import wsync

    c_out = c_path_run(iters)  # first, while this process holds no GPU memory (an 80 GB card)
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=trainer, args=(b, iters, args.skip_staged, variants, args.probe_sets, orders),
                    daemon=True)
    p.start()
    eng = {n: torch.zeros(s, dtype=torch.bfloat16, device="cuda") for n, s in engine_shapes().items()}
    w = wsync.EngineWorker(eng, engine="sglang", config=CFG, plugin=plugin())
    _, msgs, red, total = a.recv()
    it = iter(msgs)
    src = red[0](*red[1])  # torch's own import of the trainer's storage

    if not args.staged_probe:  # the foreign path
        flat_dst = torch.empty_like(src)
        host = []

        def apply_drain():
            t = time.perf_counter()
            w.apply(next(it))
            host.append((time.perf_counter() - t) * 1e3)
            w.drain()
        def gpu_only():  # the host's work hidden behind a sleeping stream: the copy's GPU time
            torch.cuda._sleep(200_000_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            w.apply(next(it))
            b.record()
            w.drain()
            return a.elapsed_time(b)
        foreign = []
        for env in FOREIGN_ENV:
            os.environ.update(env)
            host.clear()
            ms = event_ms(apply_drain, iters)
            g = statistics.median(gpu_only() for _ in range(iters))
            foreign.append((env, ms, statistics.median(host[1:]), g))
            for k in env:
                del os.environ[k]
        wsync_ms = foreign[0][1]
        flat_ms = event_ms(lambda: flat_dst.copy_(src), iters)
        pairs = []
        for n, v in flat_views(src, hf_shapes()):
            en, off = hf_to_engine(n)
            pairs.append((eng[en][off: off + v.shape[0]] if off or en != n else eng[en], v))

        def loop():
            for d, s in pairs:
                d.copy_(s)
        loop_ms = event_ms(loop, iters)
        BASE_MS.update(flat=flat_ms, loop=loop_ms)
        gb = total / 1e9
        print(f"foreign path, {gb:.1f} GB, 399 tensors into {len(eng)} engine parameters (median of {iters}):")
        print(f"  one flat copy_ (cudaMemcpyAsync)  {flat_ms:8.2f} ms  {gb / flat_ms * 1e3:7.0f} GB/s")
        print(f"  torch per-tensor copy_ loop        {loop_ms:8.2f} ms  {gb / loop_ms * 1e3:7.0f} GB/s")
        for env, ms, host_ms, g in foreign:
            what = " ".join(f"{k}={v}" for k, v in env.items()) or "default settings"
            print(f"  wsync EngineWorker (Python), {what}: {ms:8.2f} ms  {gb / ms * 1e3:7.0f} GB/s "
                  f"(apply {host_ms:.2f} ms host, copy alone on the GPU {g:.2f} ms)")
        print(f"  ratio wsync / flat copy: {flat_ms / wsync_ms:.3f} of the limit; "
              f"{loop_ms / wsync_ms:.2f}x faster than the copy_ loop")
        if args.foreign_only:
            p.kill()
            return
    a.send("go")
    handle_ms = []
    direct_env, gpu_only, gpu_ms, gpu_start = "", False, [], None
    side, variant, emarks, eclock = None, "", [], None  # --staged-probe: the engine's stream, timelines
    while True:
        if not a.poll(120):
            print("the trainer process sent nothing for 120 s: stopping")
            break
        try:
            data = a.recv_bytes()
        except EOFError:
            print("the trainer process is gone")
            break
        # a request travels as its JSON bytes (as the C path's do), the program's own messages pickled
        op, m = ("msg", data) if data[:1] == b"{" else pickle.loads(data)[:2]
        if op == "msg":
            if gpu_only and gpu_start is None:
                torch.cuda._sleep(100_000_000)  # ~50 ms: every request of the sync lands behind it
                gpu_start = torch.cuda.Event(enable_timing=True)
                gpu_start.record()
            t = time.perf_counter()
            if eclock is not None:
                eclock.mark("gpu copy")
            if side is not None:
                with torch.cuda.stream(side):
                    reply = w.handle(m)
            else:
                reply = w.handle(m)
            if eclock is not None:
                eclock.mark("gpu copied")
            a.send_bytes(reply.encode())
            handle_ms.append((time.perf_counter() - t) * 1e3)
            emarks.append((t, time.perf_counter()))
            if gpu_only and b'"flush_cache":true' in m:  # the sync's last bucket (SGLang drains it)
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                end.synchronize()
                gpu_ms.append(gpu_start.elapsed_time(end))
                gpu_start = None
        elif op == "release":
            w.release()
            a.send("ok")
        elif op == "env":
            for k in ("WSYNC_CUDA_CE_SHARE",):
                os.environ.pop(k, None)
            gpu_only = m.get("GPU_ONLY") == "1"
            os.environ.update({k: v for k, v in m.items() if k != "GPU_ONLY"})
            direct_env = " ".join(f"{k}={v}" for k, v in m.items() if k != "GPU_ONLY")
            direct_env = "" if gpu_only else direct_env
            gpu_ms, gpu_start = [], None
            a.send("ok")
        elif op == "direct":
            mib, times = m
            ms = statistics.median(times)
            what = (f"{mib} MiB buckets" if mib else "one request") + (f", {direct_env}" if direct_env else "")
            if gpu_only:
                print(f"direct sync, {what}: the copies' GPU time alone, median {statistics.median(gpu_ms[1:]):.2f} ms "
                      f"over {len(gpu_ms) - 1} syncs")
                handle_ms.clear()
                a.send("ok")
                continue
            DIRECT_MS.append((what, ms))
            print(f"direct sync (Producer(direct=True) -> EngineWorker, {what}, 399 trainer tensors in "
                  f"place): median {ms:.2f} ms over {len(times)} syncs ({', '.join(f'{x:.1f}' for x in times)}); "
                  f"engine handle() {statistics.median(handle_ms):.2f} ms median over {len(handle_ms)} requests")
            if BASE_MS:
                print(f"  direct sync / one flat copy: {ms / BASE_MS['flat']:.3f}x; "
                      f"copy_ loop / direct sync: {BASE_MS['loop'] / ms:.3f}x")
            handle_ms.clear()
            a.send("ok")
        elif op == "variant":
            variant, emarks = m, []
            for k in ALL_CE:
                os.environ.pop(k, None)
            if variant == "both on copy engines":
                os.environ.update(ALL_CE)
            side = torch.cuda.Stream() if m == "side streams" else None
            eclock = GpuClock(side)
            a.send("ok")
        elif op == "staged":
            mib, nbuf, times, parts, marks, order = m
            STAGED_MS.append((mib, nbuf, order, statistics.median(times)))
            if variant:
                print(f"--- staged probe: {variant}")
                t0 = marks[0][1]
                last = [(x - t0, y - t0) for x, y in emarks if x >= t0]
                host = [(k, t) for k, t in marks[1:] if not k.startswith("gpu")]
                print("  last sync's timeline, ms from sync(): trainer " + " ".join(
                    f"{k}@{(t - t0) * 1e3:.2f}" for k, t in host))
                print("  engine handle() start-end: " + " ".join(f"{x * 1e3:.2f}-{y * 1e3:.2f}" for x, y in last))
                g = [t - t0 for k, t in marks if k.startswith("gpu")]
                print("  trainer stream, each stage_bucket's work (stream reached - done): " + " ".join(
                    f"{x * 1e3:.2f}-{y * 1e3:.2f}" for x, y in zip(g[::2], g[1::2])))
                e = [t - t0 for _, t in eclock.times() if t >= t0]
                print("  engine stream, each handle()'s work (stream reached - done): " + " ".join(
                    f"{x * 1e3:.2f}-{y * 1e3:.2f}" for x, y in zip(e[::2], e[1::2])))
                emarks = []
            n_msgs = len(handle_ms)
            how = f", {order}" if order else ""
            print(f"staged sync (Python Producer -> EngineWorker, {mib} MiB buckets, {nbuf} buffer set"
                  f"{'s' if nbuf > 1 else ''}{how}, no digests): median {statistics.median(times):.2f} ms over "
                  f"{len(times)} syncs ({', '.join(f'{x:.1f}' for x in times)})")
            print(f"  trainer host ms per sync: stage_bucket {statistics.median(p[0] for p in parts):.2f}, "
                  f"send + waiting for replies {statistics.median(p[1] for p in parts):.2f}; engine handle() "
                  f"{sum(handle_ms) / max(n_msgs, 1):.3f} ms per request over {n_msgs} requests")
            handle_ms.clear()
            a.send("ok")
        else:
            break
    p.join(60)
    if p.is_alive():
        p.kill()
        p.join(10)
    # the C path again, now that this program's GPU memory is freed: a card that runs slower as
    # the run goes on (clocks, heat) shows as a gap between the two C runs, and the Python syncs
    # between them are compared with each and with their mean. Whatever the run left in a
    # reference cycle goes with a collection (an EngineWorker was one, holding the parameters).
    import gc

    w.close()
    w = eng = src = flat_dst = pairs = red = msgs = it = eclock = side = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    free, total_mem = torch.cuda.mem_get_info()
    print(f"GPU memory before the second C run: {free / 2**30:.1f} of {total_mem / 2**30:.1f} GiB free "
          f"({torch.cuda.memory_reserved() / 2**30:.1f} GiB still reserved by this program)")
    c_path_report(c_out, c_path_run(iters))


def c_path_run(iters):
    """The C path in the same run: wsync-bench-cuda's dense sync (C trainer and engine, the same
    2 GiB buckets, two staging buffers, no digests); its output, or None without the binary."""
    import subprocess

    exe = os.environ.get("WSYNC_BENCH_CUDA")
    if not exe or not os.path.exists(exe):
        return None
    run = subprocess.run([exe, "--layout", "dense", "--iters", str(iters), "--plugin", plugin(),
                          "--bucket-mib", str(C_BUCKET_MIB)],
                         capture_output=True, text=True, timeout=540)
    why = f"{exe} exited {run.returncode}: {run.stderr.strip()[-400:]}" if run.returncode != 0 else ""
    return run.stdout, why


def c_path_ms(c_out):
    """The C path's staged sync (2 buffers, no digests) in ms from its output, or None."""
    import re

    m = re.search(r"producer without digests \(WSYNC_STAGING_NO_DIGESTS\): median ([0-9.]+) ms", c_out[0])
    return float(m.group(1)) if m else None


def c_path_report(c_out, c_after=None):
    """The C path's rows next to this program's figures: against the C run before the Python
    syncs and, when given, the one after them and the mean of both."""
    if c_out is None:
        print("C path: set WSYNC_BENCH_CUDA to the wsync-bench-cuda binary to run it here")
        return
    runs = [("before", c_out)] + ([("after", c_after)] if c_after is not None else [])
    for when, (out, why) in runs:
        if why:
            print(f"C path ({when}): {why}")
        for line in out.splitlines():
            if any(k in line for k in ("(c) full sync", "summary", "producer host ms", "timeline")):
                print(f"C path ({when}): " + line.strip())
    ms = [(when, c_path_ms(o)) for when, o in runs]
    ms = [(when, x) for when, x in ms if x is not None]
    if not ms:
        return
    for when, x in ms:
        print(f"C path dense sync ({when} the Python syncs), {C_BUCKET_MIB} MiB buckets, 2 buffers, no digests: "
              f"{x:.2f} ms")
    mean = statistics.mean(x for _, x in ms)
    both = len(ms) > 1
    for mib, nbuf, order, py in STAGED_MS:
        each = ", ".join(f"{py / x:.3f}x the C run {when}" for when, x in ms)
        of = f"{py / mean:.3f}x their mean ({each})" if both else f"{py / mean:.3f}x"
        how = f", {order}" if order else ""
        print(f"  Python staged sync, {mib} MiB buckets, {nbuf} sets{how} / C path: {of}")
    for what, py in DIRECT_MS:
        print(f"  Python direct sync, {what} / C path (staged{', mean' if both else ''}): {py / mean:.3f}x "
              f"({mean / py:.2f}x faster)")


if __name__ == "__main__":
    main()
