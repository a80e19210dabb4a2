"""FP8 engine parameters with vLLM's per-channel and per-tensor scales (docs/SHIMS.md, "FP8
parameters"): a bf16 trainer syncs into an engine whose linear weights are e4m3fn with a
`weight_scale` beside each one, [R, 1] (one scale per output channel) or [1] (one per tensor: the
whole fused qkv_proj / gate_up_proj of the rank), for fused experts [E, R, 1] or [E]. Every fp8 byte
and scale equals vLLM's own quantizers written here in torch (its dynamic per-token and per-tensor
`scaled_fp8_quant`, whose test references compute exactly these operations), at TP 1 and 2, with
random, all-zero, tiny, huge and +-448 values; the bf16 parameters are exact. Bad inputs, each
refused with every engine parameter as it was: a bucket bringing only part of a per-tensor
parameter, a scale of another shape, a NaN (named by tensor, row and column; in one-pass mode only
its row, or its tensor, is left as it was). CPU plugin; tests/python/test_gpu_fp8.py runs the same
on the CUDA plugin."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from test_fp8 import FP8, _bytes_equal, _close, _model, _zeros, sync_fp8_experts

F448 = torch.tensor(448.0)
MIN_SCALE = torch.tensor(1.0) / (F448 * torch.tensor(512.0))  # vLLM's min_scaling_factor


def _clamp_cast(y: torch.Tensor) -> torch.Tensor:
    """vLLM's fmaxf(-448, fminf(y, 448)) (a NaN becomes 448), then the cast."""
    return torch.fmax(torch.fmin(y, F448), -F448).to(torch.float8_e4m3fn)


def per_channel_cast_to_fp8(x: torch.Tensor):
    """vLLM's dynamic per-token quantization of the rows of x: scale [R, 1]."""
    amax = x.abs().float().amax(dim=-1, keepdim=True)
    scale = torch.maximum(amax / F448, MIN_SCALE)
    return _clamp_cast(x.float() / scale), scale


def per_tensor_cast_to_fp8(x: torch.Tensor):
    """vLLM's dynamic per-tensor scaled_fp8_quant: scale [1] (0 for an all-zero tensor, whose
    bytes are then all 448: 0 x inf is NaN, which fminf takes to 448)."""
    scale = x.abs().float().max() / F448
    return _clamp_cast(x.float() * (torch.tensor(1.0) / scale)), scale.view(1)


CAST = {"channel": per_channel_cast_to_fp8, "tensor": per_tensor_cast_to_fp8}


def fp8_layout(ref, scheme: str):
    """The engine's parameters: the FP8 linear weights as e4m3fn with vLLM's weight_scale."""
    out = {}
    for n, t in ref.items():
        if n.endswith(FP8):
            q, s = CAST[scheme](t)
            out[n], out[n[: -len("weight")] + "weight_scale"] = q, s
        else:
            out[n] = t
    return out


def _engine(engine, rank, tp, scheme, dtype=torch.bfloat16):
    model = _model().to(dtype)
    return model, _zeros(fp8_layout(models.engine_layout(dict(model.state_dict()), engine, rank, tp), scheme))


# conftest's EngineRanks layouts "test_fp8_scales:<name>" (tests/python/test_gpu_fp8_scales.py)
def fp8_channel_engine(engine, rank, tp):
    return _engine(engine, rank, tp, "channel")


def fp8_tensor_engine(engine, rank, tp):
    return _engine(engine, rank, tp, "tensor")


def fp8_channel_engine_f32(engine, rank, tp):
    return _engine(engine, rank, tp, "channel", torch.float32)


def fp8_tensor_engine_f32(engine, rank, tp):
    return _engine(engine, rank, tp, "tensor", torch.float32)


def _ranks(model, engine, tp, scheme, **kw):
    params = [_zeros(fp8_layout(models.engine_layout(dict(model.state_dict()), engine, r, tp), scheme))
              for r in range(tp)]
    workers = [wsync.EngineWorker(params[r], engine=engine, config=model.config, tp_rank=r, tp_size=tp,
                                  plugin=plugin_for("cpu"), **kw) for r in range(tp)]
    return params, workers, lambda m: [w.handle(m) for w in workers]


def edge_values(sd):
    """The step's tensors with the edge cases the quantizers must agree on: an all-zero tensor,
    a tiny one (below the per-channel floor of 1 / (448 x 512)), huge values, exact +-448 and the
    values just around it, an all-zero row."""
    sd = {n: t.clone() for n, t in sd.items()}
    sd["model.layers.0.mlp.down_proj.weight"].zero_()
    sd["model.layers.0.self_attn.o_proj.weight"].mul_(1e-30)
    sd["model.layers.1.self_attn.k_proj.weight"][:4].mul_(1e30)
    g = sd["model.layers.1.mlp.gate_proj.weight"]
    g[0, :3] = torch.tensor([448.0, -448.0, 464.0])
    g[1].fill_(448.0)
    g[2].zero_()
    g[3, :2] = torch.tensor([-2.0**-20, 2.0**-9])
    return sd


def _check(params, sd, engine, tp, scheme, label):
    for r in range(tp):
        want = fp8_layout(models.engine_layout(sd, engine, r, tp), scheme)
        assert sum(t.dtype == torch.float8_e4m3fn for t in want.values()) == 4 * 2
        bad = [n for n in want if not _bytes_equal(params[r][n], want[n])]
        assert not bad, f"{label}, rank {r}: {bad[:4]}"


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_scales_sync_equals_vllm_quantizers(scheme, engine, tp):
    model = _model()
    params, workers, send = _ranks(model, engine, tp, scheme)
    # buckets of 400 KB: greedy cuts would split qkv_proj and gate_up_proj; the planner keeps
    # each engine parameter in one bucket, which a per-tensor scale needs
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=400 << 10, plugin=plugin_for("cpu")) as prod:
        for k in (1, 2, 3):
            sd = models.step(model, k)
            if k == 3:
                sd = edge_values(sd)
            prod.sync(sd, send)
            _check(params, sd, engine, tp, scheme, f"sync {k}")
        # the all-zero tensor as vLLM's kernels leave it: per channel the floor scale and zeros,
        # per tensor scale 0 and every byte 448 (0x7e)
        zs, zq = (params[0]["model.layers.0.mlp.down_proj." + x] for x in ("weight_scale", "weight"))
        if scheme == "channel":
            assert torch.equal(zs, MIN_SCALE.expand_as(zs)) and not zq.view(torch.uint8).any()
        else:
            assert not zs.any() and bool((zq.view(torch.uint8) == 0x7E).all())
        _close(workers)


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
def test_fp8_scales_from_f32_tensors(scheme):
    model = _model().float()
    params, workers, send = _ranks(model, "vllm", 2, scheme)
    with wsync.Producer("vllm", tp_size=2, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        sd = edge_values(models.step(model, 1))
        prod.sync(sd, send)
        _check(params, sd, "vllm", 2, scheme, "f32")
        _close(workers)


def test_fp8_planner_keeps_each_parameter_in_one_bucket():
    model = _model()
    sd = models.step(model, 1)
    with wsync.Producer("vllm", bucket_bytes=400 << 10, plugin=plugin_for("cpu")) as prod:
        plan = prod.plan(sd)
    where = {n: b for b, names in enumerate(plan) for n in names}
    for layer in range(2):
        p = f"model.layers.{layer}."
        assert len({where[p + f"self_attn.{x}_proj.weight"] for x in "qkv"}) == 1, plan
        assert len({where[p + f"mlp.{x}_proj.weight"] for x in ("gate", "up")}) == 1, plan
    assert len(plan) > 3  # several buckets, so the rule was exercised


def test_fp8_per_tensor_part_of_a_parameter_is_refused():
    """A bucket bringing q and k but not v of a per-tensor qkv_proj: its one scale would be of
    a part. Refused naming the tensor, nothing written."""
    model = _model()
    params, workers, send = _ranks(model, "vllm", 1, "tensor")
    before = {n: t.clone() for n, t in params[0].items()}
    sd = models.step(model, 1)
    part = {n: sd[n] for n in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight")}
    with wsync.Producer("vllm", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(part, send)
        msg = str(e.value)
        assert "per-tensor" in msg and "self_attn.q_proj.weight" in msg and "768 rows" in msg, msg
        assert "brings 512" in msg, msg
        assert all(_bytes_equal(params[0][n], before[n]) for n in before), "the refused bucket wrote"
        prod.abort(send, "the trainer sent part of a parameter")  # vLLM's update stays open else
        prod.sync(models.step(model, 2), send)  # the buffer came back: a whole sync lands
        _check(params, models.step(model, 2), "vllm", 1, "tensor", "after the refusal")
        _close(workers)


@pytest.mark.parametrize("shape", [(768, 2), (2,), (3, 1)])
def test_fp8_scale_of_another_shape_is_refused(shape):
    model = _model()
    layout = fp8_layout(models.engine_layout(dict(model.state_dict()), "vllm", 0, 1), "channel")
    name = "model.layers.0.self_attn.qkv_proj.weight_scale"
    layout[name] = torch.zeros(shape)
    params = _zeros(layout)
    w = wsync.EngineWorker(params, engine="vllm", config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer("vllm", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(models.step(model, 1), lambda m: [w.handle(m)])
        msg = str(e.value)
        assert name in msg and "one per channel" in msg and "[768, 1]" in msg, msg
        assert all(not t.view(torch.uint8).any() for t in params.values())
        w.release()
    w.close()


def _nan(sd, name):
    sd = dict(sd)
    sd[name] = sd[name].clone()
    sd[name][3, 5] = float("nan")
    return sd


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
def test_fp8_scales_nan_refused_nothing_written(scheme):
    model = _model()
    params, workers, send = _ranks(model, "vllm", 1, scheme)
    with wsync.Producer("vllm", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), send)
        before = {n: t.clone() for n, t in params[0].items()}
        name = "model.layers.1.self_attn.v_proj.weight"
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(_nan(models.step(model, 2), name), send)
        msg = str(e.value)
        assert name in msg and "NaN" in msg and "row 3, column 5" in msg, msg
        assert all(_bytes_equal(params[0][n], before[n]) for n in before), "the refused bucket wrote"
        _close(workers)


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
def test_fp8_scales_one_pass_nan_leaves_its_row_or_tensor(scheme):
    """fp8_one_pass: a NaN in v_proj leaves the row holding it (per channel) or the whole
    qkv_proj and its scale (per tensor) as they were; everything else is the new version."""
    model = _model()
    params, workers, send = _ranks(model, "vllm", 1, scheme, fp8_one_pass=True)
    with wsync.Producer("vllm", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), send)
        before = {n: t.clone() for n, t in params[0].items()}
        name = "model.layers.1.self_attn.v_proj.weight"
        sd = _nan(models.step(model, 2), name)
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, send)
        msg = str(e.value)
        assert name in msg and "row 3, column 5" in msg and "left as it was" in msg, msg
        assert ("the row" if scheme == "channel" else "the tensor") in msg, msg
        clean = dict(sd)
        clean[name] = sd[name].nan_to_num(0.0)
        want = fp8_layout(models.engine_layout(clean, "vllm", 0, 1), scheme)
        qkv = "model.layers.1.self_attn.qkv_proj.weight"
        got, old = params[0], before
        if scheme == "channel":
            row = 256 + 256 + 3  # v row 3 in qkv_proj (q and k 256 rows each)
            keep = torch.zeros(got[qkv].shape[0], dtype=torch.bool)
            keep[row] = True
            g8, w8, o8 = (t[qkv].view(torch.uint8) for t in (got, want, old))
            assert torch.equal(g8[keep], o8[keep]) and torch.equal(g8[~keep], w8[~keep])
            s = qkv + "_scale"
            assert torch.equal(got[s][keep], old[s][keep]) and torch.equal(got[s][~keep], want[s][~keep])
            others = [n for n in want if n not in (qkv, qkv + "_scale")]
        else:
            assert _bytes_equal(got[qkv], old[qkv]) and torch.equal(got[qkv + "_scale"], old[qkv + "_scale"])
            others = [n for n in want if n not in (qkv, qkv + "_scale")]
        assert all(_bytes_equal(got[n], want[n]) for n in others), "the rest of the bucket did not land"
        assert workers[0].state()["state"] != "consistent"
        prod.abort(send, "a NaN in the step")
        sd = models.step(model, 3)
        prod.sync(sd, send)
        _check(params, sd, "vllm", 1, scheme, "the next sync")
        _close(workers)


def _fp8_moe_layout(ref, scheme, first=0, count=None):
    """Attention and fused experts (w13, w2) in fp8 with vLLM's scales: per expert [E, R, 1] or
    [E]."""
    out = {}
    for n, t in ref.items():
        if ".experts." in n:
            t = t[first : first + (count if count is not None else t.shape[0])]
            qs = [CAST[scheme](e) for e in t]
            out[n] = torch.stack([q for q, _ in qs])
            out[n.replace("_weight", "_weight_scale")] = torch.stack([s for _, s in qs]).reshape(
                (len(qs), -1, 1) if scheme == "channel" else (len(qs),))
        elif n.endswith(FP8[:2]):
            q, s = CAST[scheme](t)
            out[n], out[n[: -len("weight")] + "weight_scale"] = q, s
        else:
            out[n] = t
    return out


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
@pytest.mark.parametrize("ep", [1, 2])
def test_fp8_scales_fused_experts_with_expert_parallelism(scheme, ep):
    """Qwen3-MoE into vLLM's FP8 fused experts with per-channel [E, R, 1] or per-expert [E]
    weight_scale, each EP rank only its experts."""
    sync_fp8_experts("vllm", ep, lambda ref, first, count: _fp8_moe_layout(ref, scheme, first, count))
