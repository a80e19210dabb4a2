"""Direct sync benchmark (a program, not a test): the engine reads the trainer's own torch
parameters in place (Producer(direct=True) -> EngineWorker), for the Qwen3-8B-shaped dense model
(399 tensors) and the Qwen3-30B-A3B-shaped MoE (4 719 tensors), each trainer tensor its own torch
allocation as a trainer holds parameters (torch's caching allocator gives the 3 MB experts 20 MB
segments, six to a segment; the large ones a cudaMalloc each), the engine's parameters in SGLang's
fused layout (qkv_proj, gate_up_proj, w13/w2). Two processes, one GPU. Prints, in the same run:

  one flat copy_ of the same bytes (one cudaMemcpyAsync: the limit) and torch's per-tensor
  param.copy_(view) loop into the engine's parameters (what frameworks do), both in the engine
  process from one local tensor of the same bytes;
  the staged sync (Producer -> EngineWorker, 2 GiB buckets, 2 buffer sets, no digests);
  the direct sync with 1 and 2 GiB buckets: the trainer's wall clock from sync() to *consumed* of
  the last bucket, the engine's handle() time per sync (the median of the steady syncs, and the
  first, which opens every segment, apart), and the copies' GPU time alone (every request
  queued behind a sleep on the engine's stream); and each direct run's last sync as a timeline,
  ms from the trainer's sync(): every handle() on the engine's host, every request's work on its
  stream, and the GPU's idle time between requests.

With --alloc expandable the trainer's allocator runs with expandable_segments:True (torch maps
its parameters into cuMem chunks of 20 MiB, which the engine maps from fds instead of legacy
CUDA IPC handles); the default, cudamalloc, is torch's default allocator.

  usage: python bench/python/bench_direct.py [--iters N] [--layout dense|moe|both]
                                                   [--alloc cudamalloc|expandable]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch
from bench_fp8 import MOE_CFG, placement
from bench_python import CFG, GpuClock, event_ms, flat_views, plugin, timed_syncs

RUNS = (("staged", 2048), ("direct", 1024), ("direct", 2048), ("direct gpu", 1024))


def segments(params) -> int:
    """How many of torch's allocator segments hold the trainer's parameters."""
    ptrs = sorted(t.data_ptr() for t in params.values())
    segs = sorted((s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot())
    held, k = set(), 0
    for p in ptrs:
        while k < len(segs) and segs[k][1] <= p:
            k += 1
        if k < len(segs) and segs[k][0] <= p:
            held.add(k)
    return len(held)


def trainer(conn, layout, iters, alloc="cudamalloc"):
    import wsync

    if alloc == "expandable":  # before the first allocation of this process
        setting = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # the older name warns on torch 2.11
        (setting or torch.cuda.memory._set_allocator_settings)("expandable_segments:True")
    hf, _, _ = placement(layout)
    params = {n: torch.randn(s, device="cuda", dtype=torch.bfloat16) for n, s in hf.items()}
    torch.cuda.synchronize()
    conn.send(("segments", segments(params)))
    for what, mib in RUNS:
        conn.send(("run", what))
        conn.recv()
        kw = dict(direct=True) if what.startswith("direct") else dict(digests=False, buffers=2)
        with wsync.Producer("sglang", device="cuda", bucket_bytes=mib << 20, plugin=plugin(), **kw) as prod:
            times = timed_syncs(conn, prod, params, iters, mark=True)
        conn.send(("done", (mib, times[1:])))
        conn.recv()
    conn.send(("end", None))


def timeline(t0, marks, clock):
    """The last sync of a run, ms from the trainer's sync(): each handle() on the host, and on
    the engine's stream each request's work (stream reached - done), with the GPU's idle gaps."""
    host = [(x - t0, y - t0) for x, y in marks if x >= t0]
    gpu = [t - t0 for _, t in clock.times() if t >= t0]
    work = list(zip(gpu[::2], gpu[1::2]))
    idle = sum(max(0.0, b[0] - a[1]) for a, b in zip(work, work[1:]))
    print("    last sync, ms from sync(): engine handle() start-end " +
          " ".join(f"{x * 1e3:.2f}-{y * 1e3:.2f}" for x, y in host))
    print("    engine stream, each request's work (reached - done) " +
          " ".join(f"{x * 1e3:.2f}-{y * 1e3:.2f}" for x, y in work))
    if work:
        print(f"    first copy reached {work[0][0] * 1e3:.2f} ms after sync(), GPU idle between requests "
              f"{idle * 1e3:.2f} ms, last done {work[-1][1] * 1e3:.2f} ms")


def baselines(hf, where, eng, iters):
    """One flat copy_ of the model's bytes and torch's per-tensor copy_ loop into eng, both from
    one local tensor holding every trainer tensor (median ms each)."""
    src = torch.randn(sum(torch.Size(s).numel() for s in hf.values()), dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    flat_ms = event_ms(lambda: dst.copy_(src), iters)
    pairs = []
    for n, v in flat_views(src, hf):
        e, idx, off = where[n]
        d = eng[e] if idx is None else eng[e][idx]
        pairs.append((d[off: off + v.shape[0]] if d.shape != v.shape else d, v))

    def loop():
        for d, s in pairs:
            d.copy_(s)
    return flat_ms, event_ms(loop, iters)


def run_layout(layout, iters, alloc="cudamalloc"):
    import wsync

    hf, where, shapes = placement(layout)
    eng = {n: torch.zeros(s, dtype=torch.bfloat16, device="cuda") for n, s in shapes.items()}
    total = sum(torch.Size(s).numel() for s in hf.values())
    flat_ms, loop_ms = baselines(hf, where, eng, iters)
    torch.cuda.empty_cache()
    gb = total * 2 / 1e9
    print(f"=== {layout}: {len(hf)} trainer tensors, {gb:.2f} GB, into {len(eng)} engine parameters "
          f"(SGLang's layout), trainer allocator {alloc}, median of {iters}")
    print(f"  one flat copy_ (cudaMemcpyAsync)  {flat_ms:8.2f} ms  {gb / flat_ms * 1e3:6.0f} GB/s")
    print(f"  torch per-tensor copy_ loop       {loop_ms:8.2f} ms  ({flat_ms / loop_ms:.3f} of the flat copy)")

    w = wsync.EngineWorker(eng, engine="sglang", config=CFG if layout == "dense" else MOE_CFG, plugin=plugin())
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=trainer, args=(b, layout, iters, alloc), daemon=True)
    p.start()
    what, handle_ms, gpu_ms, start, cur = "", [], [], None, 0.0
    t0, marks, clock = 0.0, [], None  # the timeline of a run's last sync
    rows = {}
    while a.poll(300):
        op, m = a.recv()
        if op == "msg":
            if what == "direct gpu" and start is None:
                torch.cuda._sleep(100_000_000)  # ~50 ms: every request of the sync lands behind it
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            if clock is not None:
                clock.mark("reached")
            reply = w.handle(m)
            if clock is not None:
                clock.mark("done")
            marks.append((t, time.perf_counter()))
            a.send(reply)
            cur += (time.perf_counter() - t) * 1e3
            if '"flush_cache":true' in m:  # the sync's last bucket: one sync's handle() time
                handle_ms.append(cur)
                cur = 0.0
            if start is not None and '"flush_cache":true' in m:  # the sync's last bucket
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                end.synchronize()
                gpu_ms.append(start.elapsed_time(end))
                start = None
        elif op == "t0":
            t0 = m
        elif op == "segments":
            print(f"  the trainer's parameters lie in {m} torch allocator segments")
        elif op == "run":
            what, handle_ms, gpu_ms, marks = m, [], [], []
            clock = GpuClock() if what == "direct" else None
            a.send("ok")
        elif op == "release":
            w.release()
            a.send("ok")
        elif op == "done":
            mib, times = m
            ms = statistics.median(times)
            # the first sync opens every segment; the steady ones open none
            first, steady = handle_ms[0], statistics.median(handle_ms[1:])
            if what == "direct gpu":
                g = statistics.median(gpu_ms[1:])
                print(f"  direct, {mib} MiB buckets: the copies' GPU time alone {g:8.2f} ms "
                      f"({flat_ms / g:.3f} of the flat copy)")
            else:
                rows[(what, mib)] = ms
                print(f"  {what:6s}, {mib} MiB buckets: sync() to consumed {ms:8.2f} ms ({flat_ms / ms:.3f} of the "
                      f"flat copy, {loop_ms / ms:.2f}x the copy_ loop); engine handle() per sync {steady:.2f} ms "
                      f"steady, {first:.2f} ms the first")
                if clock is not None:
                    timeline(t0, marks, clock)
                    clock = None
            a.send("ok")
        elif op == "end":
            break
    p.join(60)
    staged = rows.get(("staged", 2048))
    best = min((ms for (k, _), ms in rows.items() if k == "direct"), default=None)
    if staged and best:
        print(f"  best direct / staged: {best / staged:.3f}x ({staged / best:.2f}x faster)")
    w.close()
    del eng, w
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--layout", default="both", choices=("dense", "moe", "both"))
    ap.add_argument("--alloc", default="cudamalloc", choices=("cudamalloc", "expandable"))
    args = ap.parse_args()
    for layout in ("dense", "moe"):
        if args.layout in (layout, "both"):
            run_layout(layout, args.iters, args.alloc)


if __name__ == "__main__":
    main()
