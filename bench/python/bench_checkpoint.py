"""Checkpoint benchmark (a program, not a test): a float32 checkpoint held on the host (the first
layers of the Qwen3-8B-shaped dense model, --gb of float32, one storage as a mapped file is)
staged onto the GPU for a bf16 engine. Prints ratios against baselines run in the same process:

  the limit: one cudaMemcpyAsync of the checkpoint's bytes from the same registered host memory
  into device memory (PCIe host to device);
  wsync: the Producer's stage (CUDA plugin) reading the registered host tensors in place and
  converting each element to bf16 in its one launch (ABI 0.1.5 src_dtype), with and without
  digests; and the same for a bf16 checkpoint (no conversion);
  what frameworks do today: torch's per-tensor ``param.copy_(cpu_tensor)`` loop into bf16
  parameters, from pageable memory (safetensors' load_file) and from the same pinned memory.

  usage: python bench/python/bench_checkpoint.py [--gb 4] [--iters 5]
"""

from __future__ import annotations

import argparse
import ctypes as C

import torch
from bench_python import event_ms, flat_views, hf_shapes, plugin


def shapes_of(gb):
    out, total = {}, 0
    for n, s in hf_shapes().items():
        k = torch.Size(s).numel() * 4
        if total + k > gb * 1e9 and out:
            break
        out[n] = s
        total += k
    return out


def stager(wsync, pairs, cast_to, digests, register=None):
    """A Producer whose stage of every tensor (one bucket) is timed alone: what a sync's trainer
    side costs (the engine's device-to-device copy is benchmarked in bench_python.py). `register`:
    the host storage to register first (registration is process-wide: once per storage)."""
    from wsync import _abi, _native
    from wsync import _torch as wt

    nbytes = sum(t.numel() for _, t in pairs) * 2 + (len(pairs) + 1) * 256
    prod = wsync.Producer("sglang", device="cuda", cast_to=cast_to, bucket_bytes=nbytes, digests=digests,
                          buffers=1, plugin=plugin())
    if register is not None:
        prod.register_host(register)
    arr, keep = prod._stage_array(pairs)
    st = prod._sets[0].staging[0]

    def stage():
        err = _abi.Error.new()
        sh = wt.stream_handle(torch.device("cuda"), None)
        _native.check(prod._ops.stage(st, sh, arr, len(pairs), C.byref(err)), err)
    return prod, stage, keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    import wsync

    shapes = shapes_of(args.gb)
    n = sum(torch.Size(s).numel() for s in shapes.values())
    host = torch.empty(n, dtype=torch.float32)
    host.uniform_(-1, 1)
    views = flat_views(host, shapes)
    host16 = host.to(torch.bfloat16)
    views16 = flat_views(host16, shapes)
    print(f"checkpoint: {len(shapes)} tensors, {n * 4 / 1e9:.2f} GB float32 ({n * 2 / 1e9:.2f} GB as bf16), "
          f"one host storage; device {torch.cuda.get_device_name()}")
    dev32 = torch.empty(n, dtype=torch.float32, device="cuda")
    dev16 = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    params = {k: torch.empty(s, dtype=torch.bfloat16, device="cuda") for k, s in shapes.items()}
    pageable = [(k, t.clone()) for k, t in views]  # what load_file gives: pageable CPU tensors

    def loop(src):
        def run():
            for k, t in src:
                params[k].copy_(t, non_blocking=True)
        return run

    torch_pageable = event_ms(loop(pageable), args.iters)
    rows = []
    prod, stage32, _ = stager(wsync, views, torch.bfloat16, digests=False, register=host)
    prod16, stage16, _ = stager(wsync, views16, None, digests=False, register=host16)
    limit32 = event_ms(lambda: dev32.copy_(host, non_blocking=True), args.iters)
    limit16 = event_ms(lambda: dev16.copy_(host16, non_blocking=True), args.iters)
    rows.append(("wsync stage f32 -> bf16 (converted in the stage), no digests", event_ms(stage32, args.iters), limit32))
    prod_d, stage32d, _ = stager(wsync, views, torch.bfloat16, digests=True)  # host: registered above
    rows.append(("wsync stage f32 -> bf16, with digests", event_ms(stage32d, args.iters), limit32))
    rows.append(("wsync stage bf16 -> bf16, no digests", event_ms(stage16, args.iters), limit16))
    torch_pinned = event_ms(loop(views), args.iters)
    # correctness of what was timed: the staged bf16 bytes equal torch's conversion
    import json

    from wsync import _abi

    st = prod_d._sets[0].staging[0]
    stage32d()
    text, gen, err = C.c_char_p(), C.c_uint64(), _abi.Error.new()
    prod_d._ops.publish(st, None, 1, C.byref(text), C.byref(gen), C.byref(err))
    torch.cuda.synchronize()
    by_name = dict(views)
    bad = 0
    for d in json.loads(text.value.decode())["tensors"]:
        back = torch.empty(d["nbytes"], dtype=torch.uint8)
        prod_d._ops.read_back(st, d["offset"], back.data_ptr(), d["nbytes"], C.byref(err))
        t = by_name[d["name"]]
        bad += int(not torch.equal(back.view(torch.bfloat16).view(t.shape), t.to(torch.bfloat16)))
    print(f"checked: {len(views) - bad}/{len(views)} staged tensors equal torch's .to(torch.bfloat16)")
    print(f"limit: one cudaMemcpyAsync host->device of {n * 4 / 1e9:.2f} GB from registered memory: "
          f"{limit32:.2f} ms ({n * 4 / limit32 / 1e6:.1f} GB/s); of the bf16 {n * 2 / 1e9:.2f} GB: {limit16:.2f} ms")
    for what, ms, lim in rows:
        print(f"  {what}: {ms:.2f} ms = {lim / ms:.3f} of the limit")
    best = rows[0][1]
    print(f"torch per-tensor param.copy_(cpu f32 tensor) loop, pageable memory: {torch_pageable:.2f} ms "
          f"(wsync {torch_pageable / best:.2f}x faster); from the pinned memory: {torch_pinned:.2f} ms "
          f"({torch_pinned / best:.2f}x)")
    prod.unregister_host(host)
    prod16.unregister_host(host16)
    for p in (prod, prod16):
        p.close()  # prod_d's published bucket was never consumed: it goes with the process


if __name__ == "__main__":
    main()
