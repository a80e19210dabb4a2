"""Host-time benchmark (a program, not a test): what one FP8 request costs an engine on the CPU,
outside the quantizing itself. The MoE layout of bench_fp8.py (12 layers, 128 experts, 4 719
tensors) with every dimension scaled down, so the quantization is a small part, into SGLang's fused
FP8 parameters with per-channel or per-tensor (weight_scale) scales (block scales need 128-row
experts, whose quantizing on the CPU then dominates);
``EngineWorker.apply`` of one request naming every tensor, timed on the wall clock, median of N.
CPU plugin; no GPU needed. ``WSYNC_DRIVER_TIMING=1`` breaks each request down by phase.

  usage: python bench/python/bench_fp8_request.py [--requests N] [--dim D]
                                                        [--scales channel,tensor]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_fp8 as F  # noqa: E402  (the MoE layout and the scale parameters)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--dim", type=int, default=16,
                    help="hidden size (block scales need a multiple of 256, whose quantizing then dominates)")
    ap.add_argument("--scales", default="channel,tensor")
    args = ap.parse_args()
    import wsync

    d = args.dim
    F.MOE.update({"H": d, "NH": 2, "KV": 1, "HD": d // 2, "I": d // 2, "V": 1024})
    cfg = dict(F.MOE_CFG, hidden_size=d, num_attention_heads=2, num_key_value_heads=1, head_dim=d // 2,
               intermediate_size=2 * d, moe_intermediate_size=d // 2, vocab_size=1024)
    hf, _, shapes = F.placement("moe")
    plugin = os.path.join(str(wsync._native.lib_dir()), "libwsync_cpu.so")
    src = {k: torch.randn(s).to(torch.bfloat16) for k, s in hf.items()}
    print(f"EngineWorker.apply host time, one SGLang request of {len(src)} tensors into FP8 parameters "
          f"(hidden {d}; median of {args.requests}, CPU plugin):")
    for scheme in [x for x in args.scales.split(",") if x]:
        eng = {}
        for n, s in shapes.items():
            if n.endswith(F.FP8_SUFFIX):
                eng[n] = torch.zeros(s, dtype=torch.float8_e4m3fn)
                eng[F.scale_name(n, scheme)] = torch.zeros(F.scale_shape(s, scheme), dtype=torch.float32)
            else:
                eng[n] = torch.zeros(s, dtype=torch.bfloat16)
        w = wsync.EngineWorker(eng, engine="sglang", config=cfg, plugin=plugin, fp8_one_pass=True)
        times = []
        with wsync.Producer("sglang", bucket_bytes=1 << 30, plugin=plugin, digests=False) as prod:
            for _ in range(args.requests + 2):
                (msg,) = prod.stage_bucket(list(src.items()), finished=True)
                t = time.perf_counter()
                w.apply(msg)
                w.drain()
                times.append((time.perf_counter() - t) * 1e3)
            w.release()
        w.close()
        print(f"  {scheme:8s} apply + drain {statistics.median(times[2:]):8.2f} ms")


if __name__ == "__main__":
    main()
