"""Expert parallelism (docs/SHIMS.md): engine ranks of EP size 2, 4 and 8 hold only their share
of a Qwen3-MoE's experts in the linear placement vLLM and SGLang use by default (with a
remainder: 6 experts over 4 ranks), by local index in their fused w13 / w2, with TP inside the
EP group where SGLang runs it (tp 4 = ep 2 x moe_tp 2). Every rank equals the torch reference
after each sync, the bytes each rank holds of the experts (the plan the copies use, read back
through the weight checker) are exactly its share, and together the ranks hold every expert byte
once. A Producer told the EP size stages each rank only the experts it owns (sglang, vllm, lmdeploy) (its manifests' bytes
are the dense tensors plus its share) and a versioned sync commits on every rank. An engine whose
expert parameter holds another rank's count is refused naming it, with nothing written. CPU
plugin, in-process ranks."""

from __future__ import annotations

import json

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync.checker import check, check_message
from wsync.checkpoint import checkpoint_tensors


def _model(experts: int):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
        head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=experts,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
        dtype="bfloat16",
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def _share(experts: int, ep_rank: int, ep: int):
    b, m = divmod(experts, ep)
    return ep_rank * b + min(ep_rank, m), b + (1 if ep_rank < m else 0)


def _reference(sd, engine, rank, tp, ep, experts):
    """What rank `rank` of tp holds with EP size ep (moe_tp = tp // ep, SGLang's grouping)."""
    mts = tp // ep
    ep_rank, mtr = divmod(rank, mts)
    first, count = _share(experts, ep_rank, ep)
    dense = models.engine_layout(sd, engine, rank, tp)
    moe = models.engine_layout(sd, engine, mtr, mts)
    return {n: (moe[n][first : first + count].clone() if ".experts." in n else t) for n, t in dense.items()}


def _ranks(model, engine, experts, tp, ep):
    """tp in-process engine ranks (zeroed parameters) with EP size ep, and a send to all."""
    mts = tp // ep
    refs = [_reference(dict(model.state_dict()), engine, r, tp, ep, experts) for r in range(tp)]
    params = [models.zeros_like_layout(ref) for ref in refs]
    workers = [
        wsync.EngineWorker(params[r], engine=engine, config=model.config, tp_rank=r, tp_size=tp,
                           ep_rank=r // mts, ep_size=ep, moe_tp_rank=r % mts, moe_tp_size=mts,
                           plugin=plugin_for("cpu"))
        for r in range(tp)
    ]
    return params, workers, lambda m: [w.handle(m) for w in workers]


CASES = [(8, 2, 2), (8, 4, 4), (8, 8, 8), (6, 4, 4), (8, 4, 2)]  # experts, tp, ep


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("experts,tp,ep", CASES, ids=[f"{e}experts-tp{t}-ep{p}" for e, t, p in CASES])
def test_ep_ranks_hold_exactly_their_experts(engine, experts, tp, ep):
    model = _model(experts)
    mts = tp // ep
    params, workers, send = _ranks(model, engine, experts, tp, ep)
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        for k in range(3):
            sd = models.step(model, k)
            prod.sync(sd, send)
            for r in range(tp):
                want = _reference(sd, engine, r, tp, ep, experts)
                bad = [n for n in want if not torch.equal(params[r][n], want[n])]
                assert not bad, f"sync {k}, rank {r}: {bad[:3]}"
        assert check(sd, send, plugin=plugin_for("cpu")).ok
        # the bytes each rank holds of the experts: its share, and every expert byte once overall
        pairs = [(n, t) for n, t in checkpoint_tensors(sd) if ".experts." in n]  # HF names
        per_expert = sum(t.numel() * t.element_size() for _, t in pairs) // experts
        replies = [json.loads(x) for x in send(check_message(pairs))]
        assert all(rep["ok"] for rep in replies), replies[0]["message"]
        held = [sum(c["rows"] * c["row_bytes"] for c in rep["check"]) for rep in replies]
        for r in range(tp):
            _, count = _share(experts, r // mts, ep)
            assert held[r] == count * per_expert // mts, (r, held[r], count)
        assert sum(held) == per_expert * experts
        for w in workers:
            w.release()
            w.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm", "lmdeploy"])
@pytest.mark.parametrize("experts,tp,ep", [(8, 4, 4), (6, 4, 4), (8, 4, 2)], ids=["8-tp4-ep4", "6-tp4-ep4", "8-tp4-ep2"])
def test_ep_producer_stages_each_rank_only_its_experts(engine, experts, tp, ep):
    model = _model(experts)
    mts = tp // ep
    params, workers, send = _ranks(model, engine, experts, tp, ep)
    staged = [0] * tp
    with wsync.Producer(engine, tp_size=tp, ep_size=ep, bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        encode = prod.encode

        def counting(manifests, **kw):
            for r, text in enumerate(manifests):
                staged[r] += sum(t["nbytes"] for t in json.loads(text)["tensors"])
            return encode(manifests, **kw)

        prod.encode = counting
        for k in (1, 2):
            staged = [0] * tp
            sd = models.step(model, k)
            prod.sync(sd, send, version=k)
            for r in range(tp):
                want = _reference(sd, engine, r, tp, ep, experts)
                bad = [n for n in want if not torch.equal(params[r][n], want[n])]
                assert not bad, f"sync {k}, rank {r}: {bad[:3]}"
                st = workers[r].state()
                assert st["state"] == "consistent" and st["committed"] == k, (r, st)
        hf = list(checkpoint_tensors(sd))
        expert_bytes = sum(t.numel() * t.element_size() for n, t in hf if ".experts." in n)
        dense_bytes = sum(t.numel() * t.element_size() for n, t in hf if ".experts." not in n)
        for r in range(tp):
            _, count = _share(experts, r // mts, ep)
            assert staged[r] == dense_bytes + expert_bytes // experts * count, (r, staged[r])
        for w in workers:
            w.release()
            w.close()


def test_ep_producer_refuses_an_ep_size_that_does_not_divide_tp():
    with pytest.raises(wsync.errors.InvalidArgument) as e:
        wsync.Producer("sglang", tp_size=4, ep_size=3, plugin=plugin_for("cpu"))
    assert "ep_size=3" in str(e.value) and "tp_size=4" in str(e.value)


def test_ep_refuses_an_expert_count_that_is_not_the_ranks_share():
    model = _model(8)
    sd = models.step(model, 1)
    ref = _reference(dict(model.state_dict()), "sglang", 1, 4, 4, 8)  # rank 1 owns experts 2, 3
    name = "model.layers.0.mlp.experts.w13_weight"
    ref[name] = torch.zeros((3,) + tuple(ref[name].shape[1:]), dtype=ref[name].dtype)  # 3, not 2
    params = models.zeros_like_layout(ref)
    before = {n: t.clone() for n, t in params.items()}
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, tp_rank=1, tp_size=4, ep_rank=1,
                           ep_size=4, plugin=plugin_for("cpu"))
    with wsync.Producer("sglang", tp_size=4, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, lambda m: [w.handle(m)] * 4)
        w.release()
    msg = str(e.value)
    assert name in msg and "holds 3 experts" in msg and "EP rank 1 of 4 owns 2" in msg, msg
    assert all(torch.equal(params[n], before[n]) for n in params)
    w.close()
