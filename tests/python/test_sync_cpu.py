"""A trainer holding a real transformers Qwen3 (dense and MoE) pushes its state_dict through the
Producer into engine processes that hold the model in each engine's fused layout; after every
one of 3 syncs every engine parameter equals the torch-computed reference, and every data_ptr()
is unchanged. CPU plugin, CPU torch."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for


def _run(engine_ranks, engine: str, layout: str, tp: int, device: str = "cpu") -> None:
    model = models.tiny_model(layout).to(device)
    ranks = engine_ranks(engine, layout, tp, device=device)
    backend = "cpu " if device == "cpu" else "cuda "
    assert all(b.startswith(backend) for b in ranks.backends), ranks.backends
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=96 << 10, device=device, plugin=plugin_for(device)) as prod:
        for k in range(3):
            sd = models.step(model, k)
            n = prod.sync(sd, ranks.send, weight_version=f"step-{k}")
            assert n > 1  # several buckets through the retained buffers
            for r, (got, same_ptrs) in enumerate(ranks.state()):
                want = models.engine_layout({k: v.cpu() for k, v in sd.items()}, engine, r, tp)
                assert set(got) == set(want)
                bad = [name for name in want if not torch.equal(got[name], want[name])]
                assert not bad, f"sync {k}, rank {r}: {len(bad)} parameters differ, e.g. {bad[:3]}"
                assert same_ptrs, "an engine parameter moved"
        ranks.release()


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_sync(engine_ranks, layout, tp):
    _run(engine_ranks, "sglang", layout, tp)


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_sync(engine_ranks, layout, tp):
    _run(engine_ranks, "vllm", layout, tp)


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_lmdeploy_sync(engine_ranks, layout, tp):
    _run(engine_ranks, "lmdeploy", layout, tp)
