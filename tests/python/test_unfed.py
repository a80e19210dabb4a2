"""Every engine parameter accounted for: an engine parameter that no tensor of any sync feeds
(here a tied checkpoint's lm_head that the engine keeps apart) is named in the error of the
request that commits the sync and in the checker's report, never left silently; once a sync
feeds it, both are clean."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync.checker import check


def _tied():
    hf = models.tiny_model("dense")
    hf.config.tie_word_embeddings = True
    hf.tie_weights()
    return hf


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmdeploy"])
def test_a_parameter_no_tensor_feeds_is_named(engine):
    hf = _tied()
    sd = models.step(hf, 0)
    layout = models.engine_layout(sd, engine, 0, 1)  # the state_dict has lm_head: the engine holds it apart
    assert "lm_head.weight" in layout
    params = models.zeros_like_layout(layout)
    w = wsync.EngineWorker(params, engine=engine, config=hf.config, plugin=plugin_for("cpu"))
    send = lambda m: [w.handle(m)]  # noqa: E731
    without = {n: t for n, t in hf.named_parameters()}  # what a trainer's parameters are: no lm_head
    assert "lm_head.weight" not in without
    with wsync.Producer(engine, bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError, match=r'fed by no tensor.*"lm_head.weight"'):
            prod.sync(without, send, version=1)
        assert torch.equal(params["lm_head.weight"], torch.zeros_like(layout["lm_head.weight"]))
        rep = check(without, send, plugin=plugin_for("cpu"))
        assert not rep.ok and rep.unfed == [(0, "lm_head.weight")] and not rep.mismatches, rep
        # the trainer sends the tied weight under lm_head too (its state_dict does): all fed
        prod.sync(dict(hf.state_dict()), send, version=2)
        want = models.engine_layout(dict(hf.state_dict()), engine, 0, 1)
        assert all(torch.equal(params[k], want[k]) for k in want)
        rep = check(dict(hf.state_dict()), send, plugin=plugin_for("cpu"))
        assert rep.ok and not rep.unfed, rep
        w.release()
    w.close()


def test_tied_weights_held_once_count_as_fed():
    """An engine that shares one storage between embed_tokens and lm_head (as vLLM and SGLang
    tie them) is fed by embed_tokens alone."""
    hf = _tied()
    sd = models.step(hf, 1)
    layout = models.engine_layout(sd, "sglang", 0, 1)
    params = models.zeros_like_layout(layout)
    params["lm_head.weight"] = params["model.embed_tokens.weight"]
    w = wsync.EngineWorker(params, engine="sglang", config=hf.config, plugin=plugin_for("cpu"))
    with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(dict(hf.named_parameters()), lambda m: [w.handle(m)], version=1)
        assert torch.equal(params["lm_head.weight"], layout["model.embed_tokens.weight"])
        w.release()
    w.close()
