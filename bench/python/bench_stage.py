"""Stage benchmark (a program, not a test): the GPU time of the CUDA plugin's stage of each 2 GiB
bucket of the dense model (399 bf16 tensors, 16.4 GB) as the Python Producer plans it, the engine
idle, against one cudaMemcpyAsync of the bucket's bytes in the same process. Trainer tensors held
three ways: one torch allocation each (as trainers hold parameters), views packed back to back in
one storage, and views in one storage at 256-byte aligned offsets (as the C benchmark's trainer
holds them); each with the copy engines' default share of the stage, with balanced copy-engine
lanes (WSYNC_CUDA_CE_BALANCE=1) and with the kernel alone (WSYNC_CUDA_CE_SHARE=0). Where the
staged Python sync's time goes (docs/PERFORMANCE.md).

  usage: python bench/python/bench_stage.py [--iters 5] [--bucket-mib 2048]
"""

from __future__ import annotations

import argparse
import os

import torch
from bench_checkpoint import stager
from bench_python import event_ms, flat_views, hf_shapes

# the stage's copy settings measured (read by the benchmarks' build of the plugin when each
# Producer is made; plugin/cuda/wsync_cuda_tuning.h)
SETTINGS = {
    "copy engines' default share": {},
    "copy engines, balanced lanes": {"WSYNC_CUDA_CE_BALANCE": "1"},
    "kernel alone": {"WSYNC_CUDA_CE_SHARE": "0"},
}
KNOBS = ("WSYNC_CUDA_CE_SHARE", "WSYNC_CUDA_CE_BALANCE")


def aligned_views(shapes):
    sizes = [torch.Size(s).numel() for s in shapes.values()]
    total = sum((k + 127) // 128 * 128 for k in sizes)
    flat = torch.empty(total, dtype=torch.bfloat16, device="cuda")
    out, at = [], 0
    for (n, s), k in zip(shapes.items(), sizes):
        out.append((n, flat[at: at + k].view(s)))
        at += (k + 127) // 128 * 128
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--bucket-mib", type=int, default=2048)
    args = ap.parse_args()
    import wsync

    shapes = hf_shapes()
    n = sum(torch.Size(s).numel() for s in shapes.values())
    variants = {
        "allocations": [(k, torch.empty(s, dtype=torch.bfloat16, device="cuda")) for k, s in shapes.items()],
        "one storage": flat_views(torch.empty(n, dtype=torch.bfloat16, device="cuda"), shapes),
        "one storage, 256-byte aligned": aligned_views(shapes),
    }
    with wsync.Producer("sglang", device="cuda", bucket_bytes=args.bucket_mib << 20) as planner:
        plan = planner.plan(variants["allocations"])
    print(f"dense: {len(shapes)} tensors, {n * 2 / 1e9:.2f} GB in {len(plan)} buckets of <= {args.bucket_mib} MiB")
    flat = torch.empty(args.bucket_mib << 19, dtype=torch.bfloat16, device="cuda")
    other = torch.empty_like(flat)
    for name, views in variants.items():
        by = dict(views)
        for what, env in SETTINGS.items():
            for k in KNOBS:
                os.environ.pop(k, None)
            os.environ.update(env)
            per, lim = [], []
            for names in plan:
                pairs = [(k, by[k]) for k in names]
                prod, stage, _ = stager(wsync, pairs, None, digests=False)
                nb = sum(t.numel() for _, t in pairs)
                per.append(event_ms(stage, args.iters))
                lim.append(event_ms(lambda nb=nb: other[:nb].copy_(flat[:nb]), args.iters))
                prod.close()
            print(f"  {name}, {what}: stage {sum(per):.2f} ms for all buckets = {sum(lim) / sum(per):.3f} of "
                  f"one cudaMemcpyAsync per bucket ({sum(lim):.2f} ms); per bucket "
                  + " ".join(f"{p:.2f}/{q:.2f}" for p, q in zip(per, lim)))
    for k in KNOBS:
        os.environ.pop(k, None)


if __name__ == "__main__":
    main()
