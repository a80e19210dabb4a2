"""CUDA direct mode: the engine copies straight from the trainer's own memory (cudaMalloc segments
and cuMem chunks).
Skipped with the reason on machines without a GPU.

- Qwen3 (MoE) syncs into SGLang's and vLLM's fused layouts at TP 1 and 2, every parameter equal
  to the torch reference after each of 3 syncs, no engine parameter moved, and no buffer or
  segment opened after the first sync;
- a segment freed and re-made at the same address between two syncs is opened again, and the
  engine holds the new bytes (the old mapping would still show the old ones);
- a segment freed before the engine opened it is refused naming what is wrong, every engine
  parameter unchanged;
- a trainer in PyTorch's expandable segments (cuMem memory) syncs bit-exact through cuda_vmm_run
  segments, opens nothing in the steady state, and memory re-made at the same address is opened
  again.
"""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import child, plugin_for

pytestmark = pytest.mark.gpu


def _equal(ranks, sd, engine, tp, k):
    for r, (got, same) in enumerate(ranks.state()):
        want = models.engine_layout({n: v.cpu() for n, v in sd.items()}, engine, r, tp)
        bad = [n for n in want if not torch.equal(got[n], want[n])]
        assert not bad, f"sync {k}, rank {r}: {len(bad)} parameters differ, e.g. {bad[:3]}"
        assert same, "an engine parameter moved"


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gpu_direct_sync(engine_ranks, engine, tp):
    model = models.tiny_model("moe").cuda()
    ranks = engine_ranks(engine, "moe", tp, device="cuda")
    with wsync.Producer(engine, tp_size=tp, device="cuda", direct=True, plugin=plugin_for("cuda")) as prod:
        opens = None
        for k in range(3):
            sd = models.step(model, k)
            assert prod.sync(sd, ranks.send, weight_version=f"step-{k}") == 1
            _equal(ranks, sd, engine, tp, k)
            if k == 0:
                opens = ranks.opens()
                assert all(n >= 2 for n in opens), opens  # the synchronisation buffer and segments
        assert ranks.opens() == opens, "a steady direct sync opened a buffer or segment again"
        ranks.release()


def _own_segment(like: torch.Tensor, pad: int = 32 << 20) -> torch.Tensor:
    """A tensor shaped like `like` at the start of a segment of its own (a large allocation)."""
    n = like.numel() * like.element_size()
    store = torch.empty(max(n, pad), dtype=torch.uint8, device="cuda")
    return store[:n].view(like.dtype).view(like.shape)


def test_gpu_direct_segment_remade_at_the_same_address(engine_ranks):
    model = models.tiny_model("dense").cuda()
    name = "model.embed_tokens.weight"
    ranks = engine_ranks("sglang", "dense", 1, device="cuda")
    with wsync.Producer("sglang", device="cuda", direct=True, plugin=plugin_for("cuda")) as prod:
        sd = dict(models.step(model, 0))
        t = _own_segment(sd[name])
        t.copy_(sd[name])
        sd[name] = t
        prod.sync(sd, ranks.send)
        _equal(ranks, sd, "sglang", 1, 0)
        opens = ranks.opens()[0]
        addr = t.data_ptr()
        del sd[name], t
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the segment goes back to the driver (cudaFree)
        t2 = _own_segment(model.state_dict()[name])
        if t2.data_ptr() != addr:
            pytest.skip(f"the driver gave the new segment another address ({t2.data_ptr():#x}, was {addr:#x})")
        sd = dict(models.step(model, 1))
        t2.copy_(sd[name])
        sd[name] = t2
        prod.sync(sd, ranks.send)
        _equal(ranks, sd, "sglang", 1, 1)  # the old mapping would show step 0's embeddings
        assert ranks.opens()[0] > opens, "the re-made segment was not opened again"
        ranks.release()


def test_gpu_direct_segment_gone_before_the_engine_opened_it(engine_ranks):
    model = models.tiny_model("dense").cuda()
    name = "model.embed_tokens.weight"
    ranks = engine_ranks("sglang", "dense", 1, device="cuda")
    with wsync.Producer("sglang", device="cuda", direct=True, plugin=plugin_for("cuda"), timeout_ms=5000) as prod:
        sd = models.step(model, 0)
        prod.sync(sd, ranks.send)
        before, _ = ranks.state()[0]
        sd = dict(models.step(model, 1))
        t = _own_segment(sd[name])
        t.copy_(sd[name])
        sd[name] = t
        msgs = prod.stage_bucket(list(sd.items()), finished=True)
        del sd[name], t
        prod._sets[0].keep = []  # a trainer breaking the rule: it frees what it published
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the published segment is gone
        import json

        replies = [json.loads(r) for m in msgs for r in ranks.send(m)]
        bad = [r for r in replies if not r["ok"]]
        assert bad and "cudaIpcOpenMemHandle" in bad[0]["message"], replies
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
        ranks.release()


def _forward(a, p, ranks, on_synced):
    """Serve a trainer child: forward its messages to the engine ranks and answer its checks."""
    from conftest import recv

    while True:
        m = recv(a, p, 120)
        if m[0] == "msg":
            a.send(ranks.send(m[1]))
        elif m[0] == "synced":
            a.send(on_synced(*m[1:]))
        else:
            return m


def test_gpu_direct_expandable_segments(engine_ranks):
    """A trainer whose tensors live in PyTorch's expandable segments (cuMem memory): each
    tensor's run of chunks is exported as fds once; 3 syncs bit-exact with no open after the
    first; then a tensor re-made at the same address in new physical memory is opened again
    and read new."""
    import multiprocessing as mp

    ranks = engine_ranks("sglang", "dense", 1, device="cuda")
    seen = []

    def synced(k, sd, same_addr):
        _equal(ranks, sd, "sglang", 1, k)
        seen.append((k, ranks.opens()[0], same_addr))
        return "ok"

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_expandable_trainer, args=(b, True), daemon=True)
    p.start()
    end = _forward(a, p, ranks, synced)
    p.join(30)
    assert end[0] == "done", end
    assert [k for k, _, _ in seen] == [0, 1, 2, 3, 4], seen
    assert seen[0][1] >= 2 and seen[1][1] == seen[0][1] == seen[2][1], seen  # steady: no open
    if seen[4][2]:  # same address, new physical memory: opened again (and read new, above)
        assert seen[4][1] > seen[3][1], seen
    ranks.release()


def test_gpu_direct_expandable_segments_without_ipc_handles(engine_ranks):
    """Without TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC torch may make its cuMem memory without a
    shareable handle type: then the stage is refused naming the tensor and the setting;
    otherwise it syncs bit-exact."""
    import multiprocessing as mp

    ranks = engine_ranks("sglang", "dense", 1, device="cuda")
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_expandable_trainer, args=(b, False), daemon=True)
    p.start()
    before, _ = ranks.state()[0]
    end = _forward(a, p, ranks, lambda k, sd, _s: (_equal(ranks, sd, "sglang", 1, k), "ok")[1])
    p.join(30)
    if end[0] != "done":
        kind, msg = end
        assert kind == "NotSupported" and "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC" in msg and "model." in msg, end
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
    ranks.release()


def test_gpu_direct_segment_of_a_third_process_is_refused(engine_ranks):
    """A direct manifest whose cuMem segments name a third process (not the one that published
    the manifest's buffer): the engine would take that process's descriptors (pidfd_getfd).
    Refused before any is taken, naming the pid and the producers this engine verified; the
    third process is untouched and every engine parameter keeps the last sync's value."""
    import json
    import multiprocessing as mp
    import subprocess

    third = subprocess.Popen(["sleep", "600"])
    ranks = engine_ranks("sglang", "dense", 1, device="cuda")
    synced_once = []

    def synced(k, sd, _same):
        _equal(ranks, sd, "sglang", 1, k)
        synced_once.append(k)
        return "ok"

    def spoil(m: str) -> str:
        req = json.loads(m)
        mans = [json.loads(x) for x in req["serialized_named_tensors"]]
        for man in mans:
            for seg in man.get("segments", []):
                seg["pid"] = third.pid
        req["serialized_named_tensors"] = [json.dumps(x) for x in mans]
        return json.dumps(req)

    from conftest import recv

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_expandable_trainer, args=(b, True), daemon=True)
    p.start()
    try:
        while True:
            m = recv(a, p, 120)
            if m[0] == "msg":
                a.send(ranks.send(spoil(m[1]) if synced_once else m[1]))
            elif m[0] == "synced":
                before, _ = ranks.state()[0]
                a.send(synced(*m[1:]))
            else:
                break
        p.join(30)
        assert m[0] == "BadManifest", m
        assert f"buffer names producer pid {third.pid}, which published no buffer this engine maps" in m[1], m
        assert third.poll() is None  # untouched
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
        ranks.release()
    finally:
        third.kill()


@child
def _expandable_trainer(conn, ipc: bool) -> None:
    import os

    if ipc:
        os.environ["TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC"] = "1"
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    model = models.tiny_model("dense").cuda()

    def send(m):
        conn.send(("msg", m))
        return conn.recv()

    name = "model.embed_tokens.weight"
    try:
        with wsync.Producer("sglang", device="cuda", direct=True, plugin=plugin_for("cuda")) as prod:
            for k in range(3):
                sd = models.step(model, k)
                prod.sync(sd, send)
                conn.send(("synced", k, {n: v.cpu() for n, v in sd.items()}, False))
                conn.recv()
            if not ipc:
                conn.send(("done",))
                return
            # a tensor in chunks of its own, synced, freed, and re-made at the same address
            addr, held = None, []
            for k in (3, 4):
                sd = dict(models.step(model, k))
                if held:
                    held.clear()
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()  # expandable segments unmap the freed chunks
                held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
                n = sd[name].numel() * sd[name].element_size()
                sd[name] = held[0][:n].view(sd[name].dtype).view(sd[name].shape).copy_(sd[name])
                prod.sync(sd, send)
                now = held[0].data_ptr()
                conn.send(("synced", k, {n: x.cpu() for n, x in sd.items()}, now == addr))
                conn.recv()
                addr = now
                del sd
            conn.send(("done",))
    except wsync.WsyncError as e:
        conn.send((type(e).__name__, str(e)))


def test_gpu_direct_busy_stream_1000_syncs():
    """CUDA: the engine's stream is held busy (torch.cuda._sleep) when each direct request lands,
    and the trainer rewrites its tensor the moment sync() returns: 1 000 syncs, 0 torn."""
    from test_direct import run_writer_against_a_busy_engine

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torn = run_writer_against_a_busy_engine("cuda", 1000, 1 << 18, lambda: torch.cuda._sleep(200_000))
    torch.cuda.synchronize()
    assert torn == 0, f"{torn} of 1000 syncs torn"
