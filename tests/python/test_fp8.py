"""FP8 engine parameters (docs/SHIMS.md, "FP8 parameters"): a bf16 trainer syncs into an engine
whose linear weights are e4m3fn with 128 x 128 block scales (weight_scale_inv, the DeepSeek-V3 /
Qwen3-FP8 layout that SGLang and vLLM load). Every fp8 byte and every scale equals torch's own
quantization of the same tensor (DeepGEMM's per_block_cast_to_fp8, written here in torch), at TP 1
and 2, and the bf16 parameters are exact, also where a weight ends in partial blocks (a hidden size
of 200: 72-wide edge blocks); the same for a Qwen3-MoE's fused experts (w13 / w2 and
their per-expert scales) with expert parallelism 1 and 2. Bad inputs: a NaN in one tensor, a TP size whose blocks
would straddle two ranks, a missing scale parameter are refused naming the tensor, and every
engine parameter (fp8 bytes, scales, bf16) is as it was. CPU plugin."""

from __future__ import annotations

import math

import models
import pytest
import torch
import wsync
from conftest import plugin_for

FP8 = ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight")


def _model(intermediate: int = 256, hidden: int = 256):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=128, intermediate_size=intermediate,
                      tie_word_embeddings=False, dtype="bfloat16")
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


# amax / 448 as torch computes it on a CUDA tensor, where the engines quantize: a division by a
# scalar is a multiplication by its reciprocal rounded to float (aten's div_true_kernel_cuda)
INV_448 = torch.tensor(1.0) / 448.0


def per_block_cast_to_fp8(x: torch.Tensor):
    """DeepGEMM's reference quantizer (torch, as it runs on the GPU): e4m3fn values and one float
    scale per 128 x 128."""
    m, n = x.shape
    xp = torch.zeros((math.ceil(m / 128) * 128, math.ceil(n / 128) * 128), dtype=x.dtype)
    xp[:m, :n] = x
    xv = xp.view(-1, 128, xp.size(1) // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (xv * (448.0 / amax)).to(torch.float8_e4m3fn)
    return q.view_as(xp)[:m, :n].contiguous(), (amax * INV_448).view(xv.size(0), xv.size(2))


def _fp8_layout(ref):
    """The engine's parameters: the FP8 linear weights as e4m3fn with their block scales."""
    out = {}
    for n, t in ref.items():
        if n.endswith(FP8):
            q, s = per_block_cast_to_fp8(t)
            out[n], out[n[: -len("weight")] + "weight_scale_inv"] = q, s
        else:
            out[n] = t
    return out


def _with_nan(sd):
    """The step's tensors with a NaN at row 3, column 5 of one down_proj (cloned), and its name."""
    sd = dict(sd)
    name = "model.layers.1.mlp.down_proj.weight"
    sd[name] = sd[name].clone()
    sd[name][3, 5] = float("nan")
    return sd, name


def _zeros(layout):
    return {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in layout.items()}


def _bytes_equal(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype == torch.float8_e4m3fn else torch.equal(a, b)


def fp8_engine(engine, rank, tp, hidden: int = 256):
    """An engine rank's zeroed FP8 parameters (conftest's EngineRanks layout "test_fp8:fp8_engine")."""
    model = _model(hidden=hidden)
    return model, _zeros(_fp8_layout(models.engine_layout(dict(model.state_dict()), engine, rank, tp)))


def fp8_engine_partial(engine, rank, tp):
    """fp8_engine with a hidden size of 200: the last block of every linear weight's columns
    (qkv_proj, gate_up_proj) or rows (o_proj, down_proj) is 72 wide."""
    return fp8_engine(engine, rank, tp, hidden=200)


def _ranks(model, engine, tp, **kw):
    params = [_zeros(_fp8_layout(models.engine_layout(dict(model.state_dict()), engine, r, tp))) for r in range(tp)]
    workers = [wsync.EngineWorker(params[r], engine=engine, config=model.config, tp_rank=r, tp_size=tp,
                                  plugin=plugin_for("cpu"), **kw) for r in range(tp)]
    return params, workers, lambda m: [w.handle(m) for w in workers]


def _close(workers):
    for w in workers:
        w.release()
        w.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_block_quantized_sync_equals_torch(engine, tp):
    model = _model()
    params, workers, send = _ranks(model, engine, tp)
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=256 << 10, plugin=plugin_for("cpu")) as prod:
        for k in (1, 2):
            sd = models.step(model, k)
            prod.sync(sd, send)
            for r in range(tp):
                want = _fp8_layout(models.engine_layout(sd, engine, r, tp))
                assert sum(t.dtype == torch.float8_e4m3fn for t in want.values()) == 4 * 2
                bad = [n for n in want if not _bytes_equal(params[r][n], want[n])]
                assert not bad, f"sync {k}, rank {r}: {bad[:4]}"
        _close(workers)


def test_fp8_partial_blocks_equal_torch():
    """A hidden size of 200: the last block of qkv_proj's and gate_up_proj's columns and of
    o_proj's and down_proj's rows is 72 wide; every fp8 byte and scale equals torch's."""
    model = _model(hidden=200)
    params, workers, send = _ranks(model, "sglang", 1)
    with wsync.Producer("sglang", bucket_bytes=256 << 10, plugin=plugin_for("cpu")) as prod:
        for k in (1, 2):
            sd = models.step(model, k)
            prod.sync(sd, send)
            want = _fp8_layout(models.engine_layout(sd, "sglang", 0, 1))
            assert any(t.dtype == torch.float8_e4m3fn and t.shape[1] % 128 == 72 for t in want.values())
            bad = [n for n in want if not _bytes_equal(params[0][n], want[n])]
            assert not bad, f"sync {k}: {bad[:4]}"
        _close(workers)


def test_fp8_nan_refused_naming_the_tensor_nothing_written():
    model = _model()
    params, workers, send = _ranks(model, "sglang", 1)
    with wsync.Producer("sglang", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), send)
        before = {n: t.clone() for n, t in params[0].items()}
        sd, name = _with_nan(models.step(model, 2))
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, send)
        assert name in str(e.value) and "NaN" in str(e.value) and "row 3, column 5" in str(e.value), str(e.value)
        assert all(_bytes_equal(params[0][n], before[n]) for n in before), "the refused bucket wrote"
        sd = models.step(model, 3)
        prod.sync(sd, send)  # the refused bucket's buffer came back: the next sync lands whole
        want = _fp8_layout(models.engine_layout(sd, "sglang", 0, 1))
        assert all(_bytes_equal(params[0][n], want[n]) for n in want)
        _close(workers)


def test_fp8_one_pass_nan_leaves_its_block_and_names_it():
    """fp8_one_pass: the NaN check rides in the quantizing pass. The block holding the NaN keeps
    its old fp8 bytes and scale, every other block and tensor of the bucket is the new version,
    the request fails naming the tensor, row and column, and the version is not committed."""
    model = _model()
    params, workers, send = _ranks(model, "sglang", 1, fp8_one_pass=True)
    with wsync.Producer("sglang", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), send)
        before = {n: t.clone() for n, t in params[0].items()}
        sd, name = _with_nan(models.step(model, 2))
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, send)
        msg = str(e.value)
        assert name in msg and "row 3, column 5" in msg and "left as it was" in msg, msg
        got = params[0]
        clean = dict(sd)
        clean[name] = sd[name].nan_to_num(0.0)
        want = _fp8_layout(models.engine_layout(clean, "sglang", 0, 1))
        scale = name[: -len("weight")] + "weight_scale_inv"
        q, s = got[name].view(torch.uint8), got[scale]
        assert torch.equal(q[:128, :128], before[name].view(torch.uint8)[:128, :128]), "the NaN block was written"
        assert torch.equal(s[0, 0], before[scale][0, 0])
        assert torch.equal(q[:, 128:], want[name].view(torch.uint8)[:, 128:]) and torch.equal(
            q[128:, :128], want[name].view(torch.uint8)[128:, :128]), "the other blocks are not the new version"
        assert torch.equal(s.flatten()[1:], want[scale].flatten()[1:])
        others = [n for n in want if n not in (name, scale)]
        assert all(_bytes_equal(got[n], want[n]) for n in others), "the rest of the bucket did not land"
        assert workers[0].state()["state"] != "consistent"
        sd = models.step(model, 3)
        prod.sync(sd, send)  # the next sync lands whole
        want = _fp8_layout(models.engine_layout(sd, "sglang", 0, 1))
        assert all(_bytes_equal(got[n], want[n]) for n in want)
        _close(workers)


def test_fp8_tp_size_whose_blocks_straddle_ranks_is_refused():
    model = _model(intermediate=384)  # 192 rows per rank at tp 2: rank 1 starts inside a block
    params, workers, send = _ranks(model, "sglang", 2)
    before = [{n: t.clone() for n, t in p.items()} for p in params]
    with wsync.Producer("sglang", tp_size=2, bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(models.step(model, 1), send)
        msg = str(e.value)
        assert "mlp.gate_proj.weight" in msg and "fp8 blocks" in msg and "tp 2" in msg, msg
        for r in range(2):
            assert all(_bytes_equal(params[r][n], before[r][n]) for n in before[r])
        _close(workers)


def test_fp8_missing_scale_parameter_is_refused():
    model = _model()
    layout = _fp8_layout(models.engine_layout(dict(model.state_dict()), "sglang", 0, 1))
    gone = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    del layout[gone]
    params = _zeros(layout)
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer("sglang", bucket_bytes=4 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(models.step(model, 1), lambda m: [w.handle(m)])
        assert gone in str(e.value) and "o_proj.weight" in str(e.value), str(e.value)
        assert all(not t.view(torch.uint8).any() for t in params.values())
        w.release()
    w.close()


def _moe_model():
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=128, intermediate_size=256, moe_intermediate_size=128,
                         num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                         tie_word_embeddings=False, dtype="bfloat16")
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def _fp8_moe_layout(ref, first=0, count=None):
    """Attention and fused experts (w13, w2) in fp8 with block scales; experts [first, +count)."""
    out = {}
    for n, t in ref.items():
        if ".experts." in n:
            t = t[first : first + (count if count is not None else t.shape[0])]
            qs = [per_block_cast_to_fp8(e) for e in t]
            out[n] = torch.stack([q for q, _ in qs])
            out[n.replace("_weight", "_weight_scale_inv")] = torch.stack([s for _, s in qs])
        elif n.endswith(FP8[:2]):
            q, s = per_block_cast_to_fp8(t)
            out[n], out[n[: -len("weight")] + "weight_scale_inv"] = q, s
        else:
            out[n] = t
    return out


def sync_fp8_experts(engine, ep, layout):
    """A Qwen3-MoE into `engine`'s FP8 fused experts at EP = TP = ep, 2 syncs, each rank bit-exact
    against layout(its bf16 parameters with the full expert stacks, first expert, count): the
    rank's fp8 parameters and scales, only its experts."""
    model = _moe_model()

    def reference(sd, r):
        dense, full = models.engine_layout(sd, engine, r, ep), models.engine_layout(sd, engine, 0, 1)
        return layout({n: (full[n] if ".experts." in n else t) for n, t in dense.items()}, r * 4 // ep, 4 // ep)

    params = [_zeros(reference(dict(model.state_dict()), r)) for r in range(ep)]
    workers = [wsync.EngineWorker(params[r], engine=engine, config=model.config, tp_rank=r, tp_size=ep,
                                  ep_rank=r, ep_size=ep, plugin=plugin_for("cpu")) for r in range(ep)]
    send = lambda m: [w.handle(m) for w in workers]  # noqa: E731
    with wsync.Producer(engine, tp_size=ep, ep_size=ep, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        for k in (1, 2):
            sd = models.step(model, k)
            prod.sync(sd, send)
            for r in range(ep):
                want = reference(sd, r)
                assert sum(t.dtype == torch.float8_e4m3fn for t in want.values()) == 2 * 4
                bad = [n for n in want if not _bytes_equal(params[r][n], want[n])]
                assert not bad, f"sync {k}, rank {r}: {bad[:4]}"
        _close(workers)


@pytest.mark.parametrize("ep", [1, 2])
def test_fp8_fused_experts_with_expert_parallelism(ep):
    """Qwen3-MoE into SGLang's FP8 fused experts (w13_weight / w2_weight e4m3fn with
    w13_weight_scale_inv / w2_weight_scale_inv per expert), each EP rank only its experts."""
    sync_fp8_experts("sglang", ep, _fp8_moe_layout)


@pytest.mark.parametrize("case", ["rollback", "direct"])
def test_fp8_refused_where_it_cannot_quantize(case):
    """Rollback mode does not shadow fp8 parameters, and a direct bucket copies its segments as
    they are: both refused naming the tensor, nothing written."""
    model = _model()
    params = _zeros(_fp8_layout(models.engine_layout(dict(model.state_dict()), "sglang", 0, 1)))
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"),
                           rollback=case == "rollback")
    with wsync.Producer("sglang", bucket_bytes=4 << 20, plugin=plugin_for("cpu"), direct=case == "direct") as prod:
        with pytest.raises(wsync.errors.NotSupported) as e:
            prod.sync(models.step(model, 1), lambda m: [w.handle(m)])
        want = "rollback mode does not shadow fp8" if case == "rollback" else "not a direct one"
        assert "quantizes into an fp8 parameter" in str(e.value) and want in str(e.value), str(e.value)
        assert all(not t.view(torch.uint8).any() for t in params.values())
        w.release()
    w.close()
