"""Host-time benchmark (a program, not a test): what an engine's ``EngineWorker.handle`` costs on
the CPU for one SGLang request naming every tensor of the Qwen3-8B-shaped dense list (399 names,
tensors scaled down so the copy itself is negligible), in the two formats the SGLang shim serves,
measured in the same process: ``wsync_manifest`` (the manifest text as published, what wsync's
encoder sends) and ``flattened_bucket`` (SGLang's FlattenedTensorBucket, as other trainers send
it), and a direct bucket (``Producer(direct=True)``: the same tensors named where they live, the
copy itself running on the plugin's queue after the call). CPU plugin; no GPU needed.

  usage: python bench/python/bench_request.py [--requests N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_python as B  # noqa: E402  (the model's shapes)

SCALE = 64


def flattened(msg: str) -> str:
    """The same bucket as SGLang's FlattenedTensorBucket, by the C encoder (packed=False)."""
    import wsync

    manifest = json.loads(msg)["serialized_named_tensors"][0]
    return wsync.producer.encode_bucket("sglang", [manifest], first=True, finished=True, packed=False)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    n = ap.parse_args().requests
    import wsync

    plugin = os.path.join(str(wsync._native.lib_dir()), "libwsync_cpu.so")
    B.H, B.HD, B.FF, B.V = B.H // SCALE, B.HD // SCALE, B.FF // SCALE, B.V // SCALE
    cfg = dict(B.CFG, hidden_size=B.H, head_dim=B.HD, intermediate_size=B.FF, vocab_size=B.V)
    eng = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in B.engine_shapes().items()}
    params = {k: torch.randn(s).to(torch.bfloat16) for k, s in B.hf_shapes().items()}
    w = wsync.EngineWorker(eng, engine="sglang", config=cfg, plugin=plugin)
    out = {}
    with wsync.Producer("sglang", bucket_bytes=1 << 30, plugin=plugin, digests=False) as prod:
        for fmt in ("wsync_manifest", "flattened_bucket", "wsync_manifest"):
            times = []
            for _ in range(n + 5):
                (msg,) = prod.stage_bucket(list(params.items()), finished=True)
                if fmt == "flattened_bucket":
                    msg = flattened(msg)
                t = time.perf_counter()
                w.apply(msg)
                times.append((time.perf_counter() - t) * 1e3)
                w.drain()
            out.setdefault(fmt, []).append(statistics.median(times[5:]))
        w.release()
    with wsync.Producer("sglang", bucket_bytes=1 << 30, plugin=plugin, direct=True) as prod:
        times = []
        for _ in range(n + 5):  # a direct bucket: the same tensors named where they live
            msgs = prod.stage_bucket(list(params.items()), finished=True)
            t = time.perf_counter()
            for m in msgs:
                w.apply(m)
            times.append((time.perf_counter() - t) * 1e3)
            w.drain()
            prod.wait()
        out["direct"] = [statistics.median(times[5:])]
        w.release()
    w.close()
    a, b = min(out["wsync_manifest"]), out["flattened_bucket"][0]
    print(f"EngineWorker.handle host time, one SGLang request of {len(params)} tensors "
          f"(median of {n}, CPU plugin):")
    print(f"  load_format wsync_manifest    {a:7.3f} ms")
    print(f"  load_format flattened_bucket  {b:7.3f} ms")
    print(f"  direct bucket (wsync_manifest) {out['direct'][0]:7.3f} ms")
    print(f"  ratio flattened / manifest: {b / a:.2f}x")


if __name__ == "__main__":
    main()
