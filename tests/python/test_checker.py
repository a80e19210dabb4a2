"""The whole-model weight checker (wsync.checker): after a sync every engine rank's digests of
where each HF tensor lives equal the trainer's digests of the same bytes, at TP 1 and 2 for every
engine; one flipped byte in one engine parameter, or in one trainer tensor, is caught and named
with its rank; the model digest is the same on both sides when they agree."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync.checker import check
from wsync.checkpoint import checkpoint_tensors


@pytest.mark.parametrize("engine", ["sglang", "vllm", "lmdeploy"])
@pytest.mark.parametrize("tp", [1, 2])
def test_checker_agrees_then_catches_one_flipped_byte(engine_ranks, engine, tp):
    model = models.tiny_model("moe")
    ranks = engine_ranks(engine, "moe", tp)
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 1)
        prod.sync(sd, ranks.send)
        rep = check(sd, ranks.send, plugin=plugin_for("cpu"))
        assert rep.ok and rep.ranks == tp and rep.tensors == len(list(checkpoint_tensors(sd))), rep.mismatches[:3]
        assert rep.model.startswith("wsync64:") and rep.model == rep.trainer_model
        again = check(sd, ranks.send, plugin=plugin_for("cpu"))
        assert again.model == rep.model
        # one flipped byte in the trainer's copy of one tensor: that tensor, on every rank
        name = "model.layers.1.self_attn.k_proj.weight"
        bad = dict(sd)
        bad[name] = sd[name].clone()
        bad[name].view(torch.uint8).view(-1)[-1] ^= 0x01
        rep = check(bad, ranks.send, plugin=plugin_for("cpu"))
        assert not rep.ok and {m[1] for m in rep.mismatches} == {name}, rep.mismatches
        assert rep.model == again.model and rep.trainer_model != rep.model
        ranks.release()


def test_checker_catches_a_flipped_byte_in_the_engine():
    model = models.tiny_model("dense")
    ref = models.engine_layout(dict(model.state_dict()), "sglang", 0, 1)
    params = models.zeros_like_layout(ref)
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 1)
        prod.sync(sd, lambda m: [w.handle(m)])
        assert check(sd, lambda m: [w.handle(m)], plugin=plugin_for("cpu")).ok
        # the v part of layer 0's fused qkv_proj: only v_proj differs
        qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
        qkv.view(torch.uint8).view(-1)[-3] ^= 0x80
        rep = check(sd, lambda m: [w.handle(m)], plugin=plugin_for("cpu"))
        assert [m[1] for m in rep.mismatches] == ["model.layers.0.self_attn.v_proj.weight"], rep.mismatches
        w.release()
    w.close()


def test_checker_names_an_unknown_tensor():
    model = models.tiny_model("dense")
    ref = models.engine_layout(dict(model.state_dict()), "sglang", 0, 1)
    w = wsync.EngineWorker(models.zeros_like_layout(ref), engine="sglang", config=model.config,
                           plugin=plugin_for("cpu"))
    with pytest.raises(wsync.WsyncError) as e:
        check({"model.nonexistent.weight": torch.zeros(4)}, lambda m: [w.handle(m)], plugin=plugin_for("cpu"))
    assert "model.nonexistent.weight" in str(e.value)
    w.close()
