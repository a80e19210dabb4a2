"""CUDA: FP8 engine parameters quantized inside the CUDA plugin's copy (copy_quantized), each
engine rank in its own process. Skipped with the reason on machines without a GPU.

- a bf16 Qwen3 into SGLang's and vLLM's FP8 block layout at TP 1 and 2: every fp8 byte and every
  block scale equal to torch's per_block_cast_to_fp8 of the same tensor, 2 syncs;
- a NaN in one tensor: refused naming it, with its row and column, nothing written, and the next
  sync (the buffer given back) lands whole.
"""

from __future__ import annotations

import multiprocessing as mp

import models
import pytest
import torch
import wsync
from conftest import child, plugin_for, recv
from test_fp8 import _bytes_equal, _fp8_layout, _model, _zeros

pytestmark = pytest.mark.gpu


@child
def _engine(conn, engine: str, rank: int, tp: int) -> None:
    model = _model()
    params = {n: t.cuda() for n, t in _zeros(_fp8_layout(models.engine_layout(dict(model.state_dict()), engine,
                                                                               rank, tp))).items()}
    w = wsync.EngineWorker(params, engine=engine, config=model.config, tp_rank=rank, tp_size=tp,
                           plugin=plugin_for("cuda"))
    conn.send("ready")
    while True:
        op, arg = conn.recv()
        if op == "msg":
            conn.send(w.handle(arg))
        elif op == "state":
            w.drain()
            torch.cuda.synchronize()
            conn.send({n: t.cpu() for n, t in params.items()})
        else:
            w.release()
            w.close()
            conn.send("bye")
            return


class _Ranks:
    def __init__(self, engine: str, tp: int):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for r in range(tp):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_engine, args=(b, engine, r, tp), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)
        for c, p in zip(self.conns, self.procs):
            assert recv(c, p) == "ready"

    def ask(self, op, arg=None):
        for c in self.conns:
            c.send((op, arg))
        return [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def send(self, msg):
        return self.ask("msg", msg)

    def close(self):
        self.ask("close")
        for p in self.procs:
            p.join(30)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gpu_fp8_block_quantized_sync_equals_torch(engine, tp):
    model = _model().cuda()
    ranks = _Ranks(engine, tp)
    try:
        with wsync.Producer(engine, tp_size=tp, bucket_bytes=256 << 10, device="cuda", plugin=plugin_for("cuda")) as prod:
            for k in (1, 2):
                sd = models.step(model, k)
                prod.sync(sd, ranks.send)
                for r, got in enumerate(ranks.ask("state")):
                    want = _fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, engine, r, tp))
                    bad = [n for n in want if not _bytes_equal(got[n], want[n])]
                    assert not bad, f"sync {k}, rank {r}: {bad[:4]}"
    finally:
        ranks.close()


def test_gpu_fp8_nan_refused_nothing_written():
    model = _model().cuda()
    ranks = _Ranks("sglang", 1)
    try:
        with wsync.Producer("sglang", bucket_bytes=4 << 20, device="cuda", plugin=plugin_for("cuda")) as prod:
            prod.sync(models.step(model, 1), ranks.send)
            (before,) = ranks.ask("state")
            sd = dict(models.step(model, 2))
            name = "model.layers.1.mlp.down_proj.weight"
            sd[name] = sd[name].clone()
            sd[name][3, 5] = float("nan")
            with pytest.raises(wsync.WsyncError) as e:
                prod.sync(sd, ranks.send)
            assert name in str(e.value) and "row 3, column 5" in str(e.value), str(e.value)
            (after,) = ranks.ask("state")
            assert all(_bytes_equal(after[n], before[n]) for n in before), "the refused bucket wrote"
            sd = models.step(model, 3)
            prod.sync(sd, ranks.send)  # the refused bucket's buffer was given back
            (got,) = ranks.ask("state")
            want = _fp8_layout(models.engine_layout({n: t.cpu() for n, t in sd.items()}, "sglang", 0, 1))
            assert all(_bytes_equal(got[n], want[n]) for n in want)
    finally:
        ranks.close()
