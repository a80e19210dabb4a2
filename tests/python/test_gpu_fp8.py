"""CUDA: FP8 engine parameters quantized inside the CUDA plugin's copy (copy_quantized), each
engine rank in its own process. Skipped with the reason on machines without a GPU.

- a bf16 Qwen3 into SGLang's and vLLM's FP8 block layout at TP 1 and 2: every fp8 byte and every
  block scale equal to torch's per_block_cast_to_fp8 of the same tensor, 2 syncs;
- partial blocks (a hidden size of 200: blocks of 72 rows or columns): the same, every byte;
- a NaN in one tensor: refused naming it, with its row and column, nothing written, and the next
  sync (the buffer given back) lands whole;
- the same with fp8_one_pass (the check inside the quantizing pass): only the NaN's block is left
  as it was, the rest of the bucket is the new version, the error names it.
"""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from test_fp8 import _bytes_equal, _fp8_layout, _model, _with_nan

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gpu_fp8_block_quantized_sync_equals_torch(engine_ranks, engine, tp):
    model = _model().cuda()
    ranks = engine_ranks(engine, "test_fp8:fp8_engine", tp, device="cuda")
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=256 << 10, device="cuda", plugin=plugin_for("cuda")) as prod:
        for k in (1, 2):
            sd = models.step(model, k)
            prod.sync(sd, ranks.send)
            for r, (got, same) in enumerate(ranks.state()):
                assert same, "an engine parameter moved"
                want = _fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, engine, r, tp))
                bad = [n for n in want if not _bytes_equal(got[n], want[n])]
                assert not bad, f"sync {k}, rank {r}: {bad[:4]}"
        ranks.release()


def test_gpu_fp8_partial_blocks_equal_torch(engine_ranks):
    """A hidden size of 200: qkv_proj [768, 200] and gate_up_proj [512, 200] end in blocks of 72
    columns, o_proj [200, 256] and down_proj [200, 256] in blocks of 72 rows; the quantizer reads
    and writes only inside them."""
    model = _model(hidden=200).cuda()
    ranks = engine_ranks("sglang", "test_fp8:fp8_engine_partial", 1, device="cuda")
    with wsync.Producer("sglang", bucket_bytes=256 << 10, device="cuda", plugin=plugin_for("cuda")) as prod:
        for k in (1, 2):
            sd = models.step(model, k)
            prod.sync(sd, ranks.send)
            ((got, same),) = ranks.state()
            assert same, "an engine parameter moved"
            want = _fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, "sglang", 0, 1))
            bad = [n for n in want if not _bytes_equal(got[n], want[n])]
            assert not bad, f"sync {k}: {bad[:4]}"
        ranks.release()


def test_gpu_fp8_nan_refused_nothing_written(engine_ranks):
    model = _model().cuda()
    ranks = engine_ranks("sglang", "test_fp8:fp8_engine", 1, device="cuda")
    with wsync.Producer("sglang", bucket_bytes=4 << 20, device="cuda", plugin=plugin_for("cuda")) as prod:
        prod.sync(models.step(model, 1), ranks.send)
        ((before, _),) = ranks.state()
        sd, name = _with_nan(models.step(model, 2))
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, ranks.send)
        assert name in str(e.value) and "row 3, column 5" in str(e.value), str(e.value)
        ((after, _),) = ranks.state()
        assert all(_bytes_equal(after[n], before[n]) for n in before), "the refused bucket wrote"
        sd = models.step(model, 3)
        prod.sync(sd, ranks.send)  # the refused bucket's buffer was given back
        ((got, _),) = ranks.state()
        want = _fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, "sglang", 0, 1))
        assert all(_bytes_equal(got[n], want[n]) for n in want)
        ranks.release()


def test_gpu_fp8_one_pass_nan_leaves_its_block(engine_ranks):
    model = _model().cuda()
    ranks = engine_ranks("sglang", "test_fp8:fp8_engine", 1, device="cuda", fp8_one_pass=True)
    with wsync.Producer("sglang", bucket_bytes=4 << 20, device="cuda", plugin=plugin_for("cuda")) as prod:
        prod.sync(models.step(model, 1), ranks.send)
        ((before, _),) = ranks.state()
        sd, name = _with_nan(models.step(model, 2))
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, ranks.send)
        assert name in str(e.value) and "row 3, column 5" in str(e.value) and "left as it was" in str(e.value)
        ((got, _),) = ranks.state()
        clean = {n: t.cpu() for n, t in sd.items()}
        clean[name] = clean[name].nan_to_num(0.0)
        want = _fp8_layout(models.engine_layout(clean, "sglang", 0, 1))
        q, old, new = got[name].view(torch.uint8), before[name].view(torch.uint8), want[name].view(torch.uint8)
        assert torch.equal(q[:128, :128], old[:128, :128]), "the NaN block was written"
        assert torch.equal(q[:, 128:], new[:, 128:]) and torch.equal(q[128:, :128], new[128:, :128])
        scale = name[: -len("weight")] + "weight_scale_inv"
        others = [n for n in want if n not in (name, scale)]
        assert all(_bytes_equal(got[n], want[n]) for n in others), "the rest of the bucket did not land"
        sd = models.step(model, 3)
        prod.sync(sd, ranks.send)
        ((got, _),) = ranks.state()
        want = _fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, "sglang", 0, 1))
        assert all(_bytes_equal(got[n], want[n]) for n in want)
        ranks.release()
