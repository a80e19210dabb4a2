"""A checkpoint staged from host memory (docs/PYTHON.md, "Checkpoints"): a transformers model saved
in float32 by ``save_pretrained`` (the ``safetensors`` library writes the file), read back as CPU
tensors, pushed with ``Producer(cast_to=torch.bfloat16)`` into bf16 engines: the stage converts
each element in its copy (ABI 0.1.5 ``src_dtype``), and every engine parameter equals torch's own
``.to(torch.bfloat16)`` of the file's tensors, at TP 1 and 2, for sglang and vllm. On the GPU the
CUDA plugin reads the CPU tensors in place over PCIe (registered with ``register_host``, or
pinned); pageable memory it cannot read is refused naming the tensor, the engine unchanged."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for


def _f32_checkpoint(tmp_path, layout: str = "dense"):
    from safetensors.torch import load_file

    model = models.tiny_model(layout).float()
    models.step(model, 7)
    model.save_pretrained(tmp_path, safe_serialization=True)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert files, "save_pretrained wrote no safetensors file"
    sd = {}
    for f in files:
        sd.update(load_file(str(f)))
    assert all(t.dtype == torch.float32 for t in sd.values())
    return sd


def _equal(ranks, sd, engine, tp):
    want_sd = {n: t.to(torch.bfloat16) for n, t in sd.items()}
    for r, (got, same) in enumerate(ranks.state()):
        want = models.engine_layout(want_sd, engine, r, tp)
        bad = [n for n in want if not torch.equal(got[n].cpu(), want[n])]
        assert not bad, f"rank {r}: {len(bad)} parameters differ from torch's conversion, e.g. {bad[:3]}"
        assert same, "an engine parameter moved"


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp", [1, 2])
def test_checkpoint_f32_staged_into_bf16(engine_ranks, tmp_path, engine, tp):
    sd = _f32_checkpoint(tmp_path)
    ranks = engine_ranks(engine, "dense", tp)
    with wsync.Producer(engine, tp_size=tp, cast_to=torch.bfloat16, bucket_bytes=256 << 10,
                        plugin=plugin_for("cpu")) as prod:
        for t in sd.values():
            prod.register_host(t)  # the CPU plugin needs none; taken all the same
        for k in range(3):
            assert prod.sync(sd, ranks.send, weight_version=f"ckpt-{k}") > 1
            _equal(ranks, sd, engine, tp)
        ranks.release()


def test_cast_to_must_be_a_float_dtype():
    with pytest.raises(wsync.errors.InvalidArgument) as e:
        wsync.Producer("sglang", cast_to=torch.int32, plugin=plugin_for("cpu"))
    assert "cast_to=torch.int32" in str(e.value)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_gpu_checkpoint_from_host_memory(engine_ranks, tmp_path, engine):
    """CUDA: registered CPU tensors (and one pinned) staged in place, converted in the stage."""
    sd = _f32_checkpoint(tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    sd[name] = sd[name].pin_memory()
    ranks = engine_ranks(engine, "dense", 2, device="cuda")
    with wsync.Producer(engine, tp_size=2, device="cuda", cast_to=torch.bfloat16, bucket_bytes=256 << 10,
                        plugin=plugin_for("cuda")) as prod:
        for n, t in sd.items():
            if n != name:
                prod.register_host(t)
        for k in range(3):
            prod.sync(sd, ranks.send, weight_version=f"ckpt-{k}")
            _equal(ranks, sd, engine, 2)
        ranks.release()


@pytest.mark.gpu
def test_gpu_pageable_host_tensor_refused(engine_ranks, tmp_path):
    sd = _f32_checkpoint(tmp_path)
    ranks = engine_ranks("sglang", "dense", 1, device="cuda")
    with wsync.Producer("sglang", device="cuda", cast_to=torch.bfloat16, plugin=plugin_for("cuda")) as prod:
        for t in sd.values():
            prod.register_host(t)
        prod.sync(sd, ranks.send)
        before, _ = ranks.state()[0]
        bad = dict(sd)
        name = "model.layers.1.self_attn.o_proj.weight"
        bad[name] = sd[name] + 1.0  # new values, in pageable memory that is not registered
        with pytest.raises(wsync.errors.InvalidArgument) as e:
            prod.sync(bad, ranks.send)
        assert name in str(e.value) and "pageable" in str(e.value)
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
        ranks.release()
