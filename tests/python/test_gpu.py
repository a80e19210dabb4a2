"""CUDA: the Python layer on the CUDA plugin. Skipped with the reason on machines without a GPU.

- the Qwen3 syncs of test_sync_cpu on CUDA (sglang and vllm layouts, TP 1 and 2 on one GPU);
- torch's own handles (reduce_tensor's _share_cuda_) with both allocator settings, bit-exact;
- the stream-0 case: engine work queued on torch's default stream runs before the copy;
- a busy engine stream (torch.cuda._sleep) with the trainer restaging at once, 1 000 buckets,
  0 torn.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import models
import pytest
import torch
import wsync
from conftest import child, plugin_for, recv
from test_sync_cpu import _run
from wsync.export import TorchExport

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gpu_sync(engine_ranks, engine, tp):
    _run(engine_ranks, engine, "moe", tp, device="cuda")


@child
def _exporter(conn, expandable: bool) -> None:
    os.environ["TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC"] = "1"
    torch.cuda.memory._set_allocator_settings(f"expandable_segments:{expandable}")
    model = models.tiny_model("dense").cuda()
    sd = models.step(model, 7)
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in sd.values()])  # one trainer storage
    views, at = [], 0
    for name, t in sd.items():
        n = t.numel() * t.element_size()
        views.append((name, flat[at : at + n].view(t.dtype).view(t.shape)))
        at += n
    (msg,) = TorchExport("sglang").messages(views)
    conn.send((msg, {k: v.cpu() for k, v in sd.items()}))
    conn.recv()  # keep the storage alive until the engine is done


@pytest.mark.parametrize("expandable", [False, True], ids=["cudaMalloc", "expandable_segments"])
def test_gpu_torch_handles(expandable):
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_exporter, args=(b, expandable), daemon=True)
    p.start()
    msg, sd = recv(a, p)
    import json

    kind_bytes = json.loads(msg)["serialized_named_tensors"][0]
    # torch's handle bytes as parse_manifest reads them: a cudaMalloc segment's 64 IPC bytes, or
    # the expandable segments' payload
    assert ("torch_expandable" if expandable else "cuda_ipc") in json.dumps(kind_bytes)
    model = models.tiny_model("dense")
    want = models.engine_layout(sd, "sglang", 0, 1)
    params = {k: torch.zeros_like(v, device="cuda") for k, v in want.items()}
    with wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cuda")) as w:
        w.apply(msg)
        w.drain()
        bad = [k for k in want if not torch.equal(params[k].cpu(), want[k])]
        assert not bad, bad[:3]
        w.release()
    a.send("done")
    p.join(30)


@child
def _trainer(conn, n_buckets: int, numel: int) -> None:
    t = torch.empty(numel, dtype=torch.float32, device="cuda")
    with wsync.Producer("sglang", bucket_bytes=numel * 4 + 4096, device="cuda", plugin=plugin_for("cuda")) as prod:
        for k in range(n_buckets):
            t.fill_(float(k))  # queued on torch's current stream: stage runs after it
            (msg,) = prod.stage_bucket([("model.norm.weight", t)], finished=True)
            conn.send(msg)
            conn.recv()  # the engine's reply; the next stage_bucket waits for consumed
        prod.wait()
        conn.send("end")
        conn.recv()


def _engine_for(numel: int):
    cfg = {"hidden_size": numel, "num_attention_heads": 1, "vocab_size": 8}
    param = torch.zeros(numel, dtype=torch.float32, device="cuda")
    return param, wsync.EngineWorker({"model.norm.weight": param}, engine="sglang", config=cfg, plugin=plugin_for("cuda"))


def test_gpu_stream0():
    """Poison queued on torch's default stream (cuda_stream 0) behind a long sleep, then a copy
    with the default stream current: every byte must be the trainer's."""
    numel = 1 << 22
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_trainer, args=(b, 3, numel), daemon=True)
    p.start()
    param, w = _engine_for(numel)
    assert torch.cuda.current_stream().cuda_stream == 0
    for k in range(3):
        msg = recv(a, p)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of the default stream
        param.fill_(-1.0)  # the engine's own earlier work on its stream
        w.apply(msg)
        torch.cuda.synchronize()
        assert torch.equal(param, torch.full_like(param, float(k))), f"bucket {k}: the copy ran before the poison"
        a.send("ok")
    assert recv(a, p) == "end"
    w.release()
    a.send("bye")
    p.join(30)
    w.close()


def test_gpu_busy_stream_1000_buckets():
    numel = 1 << 18
    n = 1000
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_trainer, args=(b, n, numel), daemon=True)
    p.start()
    param, w = _engine_for(numel)
    s = torch.cuda.Stream()
    w.stream = s
    torn = torch.zeros((), dtype=torch.int64, device="cuda")
    with torch.cuda.stream(s):
        for k in range(n):
            msg = recv(a, p)
            torch.cuda._sleep(200_000)  # the engine's stream is busy when the request lands
            w.handle(msg)  # copies enqueued behind the sleep; no drain before the reply
            torn += (param != float(k)).any().to(torch.int64)
            a.send("ok")
    torch.cuda.synchronize()
    assert recv(a, p) == "end"
    assert int(torn) == 0, f"{int(torn)} of {n} buckets torn"
    w.release()
    a.send("bye")
    p.join(30)
    w.close()
