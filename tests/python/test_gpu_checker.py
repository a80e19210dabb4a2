"""CUDA: the weight checker's digest pass on the GPU. Skipped with the reason on machines
without a GPU.

- the CUDA plugin's wsync64 of device regions (1-D, 2-D with a pitch, misaligned, a short tail)
  equals the CPU plugin's of the same bytes on the host;
- after a CUDA sync (Qwen3 MoE, sglang and vllm, TP 2 on one GPU) the check agrees, and one
  flipped byte in the trainer's tensor is named.
"""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync import _abi, _native
from wsync.checker import _Digester, check

pytestmark = pytest.mark.gpu


def test_gpu_digests_equal_the_cpu_plugin():
    g = torch.Generator().manual_seed(5)
    host = torch.randint(0, 256, (3 << 20,), generator=g, dtype=torch.uint8)
    dev = host.cuda()
    cuda = _Digester(_native.load_plugin(plugin_for("cuda")), dev.device)
    cpu = _Digester(_native.load_plugin(plugin_for("cpu")), host.device)
    try:
        shapes = [(0, 1, 3 << 20, 0), (16, 1, 1 << 20, 0), (3, 1, 100_003, 0), (0, 700, 1024, 4096),
                  (5, 333, 90, 257), (0, 1, 7, 0)]

        def regions(t):
            return [_abi.CopyOp(dst=t.data_ptr() + off, rows=rows, row_bytes=rb, dst_pitch=pitch or rb)
                    for off, rows, rb, pitch in shapes]
        got = cuda.digests(regions(dev), None)
        want = cpu.digests(regions(host), None)
        assert got == want
    finally:
        cuda.close()
        cpu.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_gpu_check_after_sync(engine_ranks, engine):
    model = models.tiny_model("moe").cuda()
    ranks = engine_ranks(engine, "moe", 2, device="cuda")
    with wsync.Producer(engine, tp_size=2, bucket_bytes=96 << 10, device="cuda", plugin=plugin_for("cuda")) as prod:
        sd = models.step(model, 1)
        prod.sync(sd, ranks.send)
        rep = check(sd, ranks.send, plugin=plugin_for("cuda"))
        assert rep.ok and rep.ranks == 2, rep.mismatches[:3]
        name = "model.layers.0.mlp.gate.weight"
        bad = dict(sd)
        bad[name] = sd[name].clone()
        bad[name].view(torch.uint8).view(-1)[0] ^= 0x10
        rep = check(bad, ranks.send, plugin=plugin_for("cuda"))
        assert {m[1] for m in rep.mismatches} == {name}, rep.mismatches
        ranks.release()
