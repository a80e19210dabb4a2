"""CUDA: FP8 engine parameters with vLLM's per-channel and per-tensor scales, quantized inside
the CUDA plugin's copy, each engine rank in its own process. Skipped with the reason on machines
without a GPU.

- a Qwen3 into vLLM's FP8 layout with weight_scale [R, 1] (per channel) or [1] (per tensor, one
  for each fused qkv_proj / gate_up_proj of a rank) at TP 1 and 2, from bf16 (16-byte vectors
  held in registers) and from f32 (the scalar paths): every fp8 byte and scale equal to vLLM's
  quantizers in torch (tests/python/test_fp8_scales.py), with random, all-zero, tiny, huge and
  +-448 values, 3 syncs;
- fp8_one_pass with a NaN: the row (per channel) or the whole fused parameter (per tensor)
  holding it is left as it was, the rest of the bucket is the new version, the error names it.
"""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from test_fp8 import _bytes_equal, _model
from test_fp8_scales import _nan, edge_values, fp8_layout

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gpu_fp8_scales_sync_equals_vllm_quantizers(engine_ranks, scheme, dtype, tp):
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    model = _model().to(dt).cuda()
    layout = f"test_fp8_scales:fp8_{scheme}_engine" + ("_f32" if dtype == "f32" else "")
    ranks = engine_ranks("vllm", layout, tp, device="cuda")
    with wsync.Producer("vllm", tp_size=tp, bucket_bytes=1 << 20, device="cuda", plugin=plugin_for("cuda")) as prod:
        for k in (1, 2, 3):
            sd = models.step(model, k)
            if k == 3:
                sd = edge_values(sd)
            prod.sync(sd, ranks.send)
            for r, (got, same) in enumerate(ranks.state()):
                assert same, "an engine parameter moved"
                want = fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, "vllm", r, tp), scheme)
                bad = [n for n in want if not _bytes_equal(got[n], want[n])]
                assert not bad, f"sync {k}, rank {r}: {bad[:4]}"
        ranks.release()


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
def test_gpu_fp8_scales_one_pass_nan_leaves_its_row_or_tensor(engine_ranks, scheme):
    model = _model().cuda()
    ranks = engine_ranks("vllm", f"test_fp8_scales:fp8_{scheme}_engine", 1, device="cuda", fp8_one_pass=True)
    with wsync.Producer("vllm", bucket_bytes=4 << 20, device="cuda", plugin=plugin_for("cuda")) as prod:
        prod.sync(models.step(model, 1), ranks.send)
        ((before, _),) = ranks.state()
        name = "model.layers.1.self_attn.v_proj.weight"
        sd = _nan(models.step(model, 2), name)
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, ranks.send)
        msg = str(e.value)
        assert name in msg and "row 3, column 5" in msg and "left as it was" in msg, msg
        ((got, _),) = ranks.state()
        clean = {n: t.cpu() for n, t in sd.items()}
        clean[name] = clean[name].nan_to_num(0.0)
        want = fp8_layout(models.engine_layout(clean, "vllm", 0, 1), scheme)
        qkv = "model.layers.1.self_attn.qkv_proj.weight"
        if scheme == "channel":
            keep = torch.zeros(want[qkv].shape[0], dtype=torch.bool)
            keep[256 + 256 + 3] = True  # v's row 3 (q and k 256 rows each)
            g8, w8, o8 = (t[qkv].view(torch.uint8) for t in (got, want, before))
            assert torch.equal(g8[keep], o8[keep]) and torch.equal(g8[~keep], w8[~keep])
        else:
            assert _bytes_equal(got[qkv], before[qkv]) and torch.equal(got[qkv + "_scale"], before[qkv + "_scale"])
        others = [n for n in want if n not in (qkv, qkv + "_scale")]
        assert all(_bytes_equal(got[n], want[n]) for n in others), "the rest of the bucket did not land"
        prod.abort(ranks.send, "a NaN in the step")
        sd = models.step(model, 3)
        prod.sync(sd, ranks.send)
        ((got, _),) = ranks.state()
        want = fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, "vllm", 0, 1), scheme)
        assert all(_bytes_equal(got[n], want[n]) for n in want)
        ranks.release()
