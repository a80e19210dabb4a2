"""Direct mode (docs/PYTHON.md): the engine copies straight from the trainer's own tensors, no
staging buffer. CPU plugin here (the trainer's memory read across processes); the CUDA case is
in test_gpu.py. After each of 3 syncs every engine parameter equals the torch reference and no
engine parameter moved; bad inputs are refused naming what is wrong and change nothing."""

from __future__ import annotations

import ctypes
import json
import os

import models
import pytest
import torch
import wsync
from conftest import child, plugin_for


def _check(ranks, sd, engine, tp, k):
    for r, (got, same_ptrs) in enumerate(ranks.state()):
        want = models.engine_layout({n: v.cpu() for n, v in sd.items()}, engine, r, tp)
        assert set(got) == set(want)
        bad = [n for n in want if not torch.equal(got[n], want[n])]
        assert not bad, f"sync {k}, rank {r}: {len(bad)} parameters differ, e.g. {bad[:3]}"
        assert same_ptrs, "an engine parameter moved"


@pytest.mark.parametrize("engine", ["sglang", "vllm", "lmdeploy"])
@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_direct_sync(engine_ranks, engine, layout, tp):
    model = models.tiny_model(layout)
    ranks = engine_ranks(engine, layout, tp)
    with wsync.Producer(engine, tp_size=tp, direct=True, plugin=plugin_for("cpu")) as prod:
        for k in range(3):
            sd = models.step(model, k)
            assert prod.sync(sd, ranks.send, weight_version=f"step-{k}") == 1  # one request
            _check(ranks, sd, engine, tp, k)
        ranks.release()


@pytest.mark.parametrize("engine", ["sglang", "vllm", "lmdeploy"])
def test_direct_sync_several_buckets_in_flight(engine_ranks, engine):
    """Buckets pipeline the engine's work: every bucket of a sync is sent before any reply is
    read, and all are in flight together."""
    model = models.tiny_model("moe")
    ranks = engine_ranks(engine, "moe", 2)
    with wsync.Producer(engine, tp_size=2, direct=True, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        for k in range(3):
            sd = models.step(model, k)
            assert prod.sync(sd, ranks.send_deferred, weight_version=f"step-{k}") > 1
            _check(ranks, sd, engine, 2, k)
        ranks.release()


def test_direct_plan_starts_with_smaller_buckets():
    """Direct mode's plan of several buckets: the first three at most 1/8, 1/4 and 1/2 of
    bucket_bytes (or the largest tensor then left, kept whole), the rest at most bucket_bytes;
    every tensor in exactly one bucket; the staged plan of the same tensors has no ramp; a model
    that fits one bucket is one bucket."""
    model = models.tiny_model("moe")
    sd = dict(wsync.checkpoint.checkpoint_tensors(model.state_dict()))
    size = {n: t.nbytes for n, t in sd.items()}
    bucket = 64 << 10
    with wsync.Producer("sglang", direct=True, bucket_bytes=bucket, plugin=plugin_for("cpu")) as prod:
        plan = prod.plan(sd)
    names = [n for b in plan for n in b]
    assert sorted(names) == sorted(sd) and len(names) == len(set(names))
    assert len(plan) > 4, [len(b) for b in plan]
    left = set(sd)
    for k, b in enumerate(plan):
        cap = max(bucket >> (3 - k), max(size[n] for n in left)) if k < 3 else bucket
        assert sum(size[n] for n in b) <= max(cap, max(size[n] for n in b)), (k, [size[n] for n in b])
        left -= set(b)
    assert sum(size[n] for n in plan[0]) < sum(size[n] for n in plan[3])
    with wsync.Producer("sglang", bucket_bytes=bucket, plugin=plugin_for("cpu")) as staged:
        assert len(staged.plan(sd)) < len(plan)
    # a sync that fits one bucket stays one request (validated whole before any write)
    with wsync.Producer("sglang", direct=True, bucket_bytes=64 << 20, plugin=plugin_for("cpu")) as one:
        assert one.plan(sd) == [sorted(sd, key=names.index)]


def test_direct_sync_casts_fp32_master_weights(engine_ranks):
    """A trainer holding fp32 weights into a bf16 engine: cast_to refreshes retained bf16
    buffers on each sync, which the engine reads in place."""
    model = models.tiny_model("dense")
    master = {n: t.float() for n, t in model.state_dict().items()}
    ranks = engine_ranks("sglang", "dense", 1)
    with wsync.Producer("sglang", direct=True, cast_to=torch.bfloat16, plugin=plugin_for("cpu")) as prod:
        for k in range(3):
            with torch.no_grad():
                for t in master.values():
                    t.add_(0.5 * (k + 1))
            prod.sync(master, ranks.send)
            _check(ranks, {n: t.to(torch.bfloat16) for n, t in master.items()}, "sglang", 1, k)
        ranks.release()


@pytest.mark.parametrize("direct", [True, False])
def test_steady_sync_checks_each_bucket_before_it_goes(engine_ranks, direct):
    """A steady sync checks each bucket's tensors just before the bucket is staged: when a tensor
    of a later bucket has new storage, the buckets before it go from the cached plan, the rest is
    planned again, and every tensor is sent exactly once and read from where it now is."""
    model = models.tiny_model("moe")
    ranks = engine_ranks("sglang", "moe", 1)
    names_sent = []
    planned = {}  # plan id -> the names its full manifest carried (a replay names none)

    def send(msg):
        for m in json.loads(msg).get("serialized_named_tensors", []):
            man = json.loads(m)
            names = [t["name"] for t in man["tensors"]]
            if "plan" in man:
                planned[man["plan"]] = names
            names_sent.extend(planned[man["replay"]] if "replay" in man else names)
        return ranks.send(msg)

    with wsync.Producer("sglang", direct=direct, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        for k in range(2):
            prod.sync(models.step(model, k), send)
        plan = prod.plan(dict(wsync.checkpoint.checkpoint_tensors(model.state_dict())))
        assert len(plan) >= 3, [len(b) for b in plan]
        late = plan[-1][0]  # a tensor of the last bucket (a per-expert view or a whole tensor)
        params = dict(model.named_parameters())
        experts = late.split(".mlp.experts.")[0] + ".mlp.experts."
        owner = late if late in params else next(  # the fused experts tensor it is a view of
            n for n in params if n.startswith(experts) and n.endswith("down_proj") == late.endswith("down_proj.weight"))
        params[owner].data = params[owner].data.clone() + 5  # new storage, new values
        names_sent.clear()
        sd = dict(model.state_dict())
        assert prod.sync(sd, send) == len(plan)
        _check(ranks, sd, "sglang", 1, 2)
        everything = list(wsync.checkpoint.checkpoint_tensors(sd))
        assert sorted(names_sent) == sorted(n for n, _ in everything), "a tensor sent twice or not at all"
        names_sent.clear()
        sd = dict(model.state_dict())  # steady again, from the plan made anew
        prod.sync(sd, send)
        _check(ranks, sd, "sglang", 1, 3)
        assert sorted(names_sent) == sorted(n for n, _ in everything)
        # a transaction checks every bucket before its begin declares the sync
        params[owner].data = params[owner].data.clone() - 1
        sd = dict(model.state_dict())
        assert prod.sync(sd, send, version=100) == len(plan)
        _check(ranks, sd, "sglang", 1, 4)
        ranks.release()


def test_direct_refuses_a_non_contiguous_tensor(engine_ranks):
    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    with wsync.Producer("sglang", direct=True, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 0)
        prod.sync(sd, ranks.send)
        before, _ = ranks.state()[0]
        bad = dict(models.step(model, 1))
        name = "model.layers.0.mlp.down_proj.weight"
        bad[name] = bad[name].t().contiguous().t()  # same shape, column-major
        with pytest.raises(wsync.errors.InvalidArgument) as e:
            prod.sync(bad, ranks.send)
        assert name in str(e.value) and "not contiguous" in str(e.value)
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
        ranks.release()


def test_direct_sync_follows_tensors_that_moved_or_changed_type(engine_ranks):
    """A steady sync reuses its plan and arrays only while every tensor is where, and as, it
    was: a parameter given new storage (``p.data = ...``) is read from there, and one whose bytes
    are reinterpreted in place (same address and shape, another dtype) is sent as that dtype and
    refused by the engine naming it, every parameter as it was."""
    model = models.tiny_model("moe")
    ranks = engine_ranks("sglang", "moe", 1)
    with wsync.Producer("sglang", direct=True, plugin=plugin_for("cpu")) as prod:
        for k in range(2):
            prod.sync(models.step(model, k), ranks.send)
        moved = "model.layers.0.self_attn.q_proj.weight"
        expert = "model.layers.1.mlp.experts.gate_up_proj"  # fused: sent as per-expert views
        params = dict(model.named_parameters())
        for n in (moved, expert):
            params[n].data = params[n].data.clone() + 3  # new storage, new values
        sd = dict(model.state_dict())
        prod.sync(sd, ranks.send)
        _check(ranks, sd, "sglang", 1, 2)
        before, _ = ranks.state()[0]
        bad = dict(sd)
        bad[moved] = bad[moved].view(torch.float16)  # the same bytes, another dtype
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(bad, ranks.send)
        assert moved in str(e.value) and "float16" in str(e.value), e.value
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
        ranks.release()


def test_direct_bad_manifest_changes_nothing(engine_ranks):
    """A direct manifest whose tensor names a segment that is not there: BadManifest naming it,
    and every engine parameter as it was."""
    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    with wsync.Producer("sglang", direct=True, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 0)
        prod.sync(sd, ranks.send)
        before, _ = ranks.state()[0]
        msgs = prod.stage_bucket(list(models.step(model, 1).items()), finished=True)
        doc = json.loads(msgs[-1])
        text = json.dumps(doc)
        assert '\\"segment\\":0' in text
        bad = text.replace('\\"segment\\":0', '\\"segment\\":99', 1)
        reply = json.loads(ranks.send(bad)[0])
        assert not reply["ok"] and "segment: 99" in reply["message"], reply
        after, same = ranks.state()[0]
        assert same and all(torch.equal(after[n], before[n]) for n in before)
        ranks.release()


def test_direct_step_waits_for_a_sync_in_flight(engine_ranks):
    """sync(wait=False) returns once sent; the optimizer step under guard() waits for the
    engine's consumed first (the engine holds exactly what was synced), and a refused sync
    raises from the step instead of letting the trainer run on."""
    model = models.tiny_model("dense").float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ranks = engine_ranks("sglang", "dense", 1)
    with wsync.Producer("sglang", direct=True, cast_to=torch.bfloat16, plugin=plugin_for("cpu")) as prod:
        hook = prod.guard(opt)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        sd = dict(model.state_dict())
        snap = {n: t.to(torch.bfloat16) for n, t in sd.items()}
        prod.sync(sd, ranks.send_deferred, wait=False)
        assert prod._inflight  # the replies are not read yet
        opt.step()  # waits for the sync, then writes the parameters
        assert not prod._inflight
        _check(ranks, snap, "sglang", 1, 0)
        # a sync the engine refuses (a wrong shape) raises from the next step
        bad = dict(model.state_dict())
        name = "model.layers.1.mlp.down_proj.weight"
        bad[name] = bad[name][:, :-1].contiguous()
        prod.sync(bad, ranks.send_deferred, wait=False)
        with pytest.raises(wsync.WsyncError) as e:
            opt.step()
        assert name in str(e.value)
        hook.remove()
        ranks.release()


@child
def _writer(conn, device: str, n: int, numel: int) -> None:
    """A direct trainer that rewrites its tensor right after each sync returns (consumed)."""
    t = torch.empty(numel, dtype=torch.float32, device=device)
    with wsync.Producer("sglang", device=device, direct=True, plugin=plugin_for(device)) as prod:
        def send(m):
            conn.send(m)
            return [conn.recv()]

        for k in range(n):
            t.fill_(float(k))  # on torch's current stream (CPU: at once)
            prod.sync({"model.norm.weight": t}, send)
            t.fill_(-1.0)  # the rule allows it now: the engine consumed the sync
        conn.send("end")
        conn.recv()


def run_writer_against_a_busy_engine(device: str, n: int, numel: int, busy) -> int:
    """The engine side: `busy()` holds the engine's stream before each request; returns how many
    of the n syncs left the engine with anything but that sync's value (torn)."""
    import multiprocessing as mp

    from conftest import recv

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_writer, args=(b, device, n, numel), daemon=True)
    p.start()
    cfg = {"hidden_size": numel, "num_attention_heads": 1, "vocab_size": 8}
    param = torch.zeros(numel, dtype=torch.float32, device=device)
    w = wsync.EngineWorker({"model.norm.weight": param}, engine="sglang", config=cfg, plugin=plugin_for(device))
    torn = torch.zeros((), dtype=torch.int64, device=device)
    for k in range(n):
        msg = recv(a, p)
        busy()
        reply = w.handle(msg)  # the copy queued behind the busy stream; consumed after it
        torn += (param != float(k)).any().to(torch.int64)  # queued after the copy
        a.send(reply)
    w.drain()
    assert recv(a, p) == "end"
    a.send("bye")
    p.join(30)
    w.release()
    w.close()
    return int(torn)


def test_direct_trainer_writes_right_after_consumed_1000_syncs():
    """CPU: the trainer overwrites its tensor as soon as sync() returns, 1 000 times; the engine
    must have copied each sync's bytes before that (consumed follows the copy): 0 torn."""
    assert run_writer_against_a_busy_engine("cpu", 1000, 1 << 14, lambda: None) == 0


@pytest.mark.parametrize("direct", [True, False])
def test_steady_sync_sees_a_tensor_of_another_dtype_at_the_same_address(direct):
    """The cached plan's check covers each tensor's dtype: a tensor re-viewed as another dtype of
    the same size (same storage, shape and strides) is planned anew, so its manifest says the new
    dtype and the engine refuses it (a bfloat16 parameter fed float16), naming the tensor; a plan that
    ignored the dtype would send the old one and the engine would take the bytes."""
    model = models.tiny_model("dense")
    sd = dict(models.step(model, 0))
    params = models.zeros_like_layout(models.engine_layout(sd, "sglang", 0, 1))
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    name = "model.norm.weight"
    assert sd[name].dtype == torch.bfloat16
    with wsync.Producer("sglang", direct=direct, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        for _ in range(2):
            prod.sync(sd, lambda m: [w.handle(m)])
        before = {k: v.clone() for k, v in params.items()}
        sd[name] = sd[name].view(torch.float16)  # same address, shape and strides
        with pytest.raises(wsync.errors.LayoutMismatch) as e:
            prod.sync(sd, lambda m: [w.handle(m)])
        assert name in str(e.value) and "float16" in str(e.value), str(e.value)
        assert all(torch.equal(params[k], before[k]) for k in before)
        w.release()
    w.close()


def test_a_segment_swept_and_named_again_is_opened_again():
    """Direct mode: after a version, the engine closes every segment that version did not name
    (memory the trainer freed or moved). A tensor whose storage moved away and then back to its
    first allocation names that segment again: the engine opens it anew (it never reuses the
    handle it closed) and reads the right bytes."""
    model = models.tiny_model("dense")
    sd = dict(models.step(model, 0))
    params = models.zeros_like_layout(models.engine_layout(sd, "sglang", 0, 1))
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    name = "model.embed_tokens.weight"
    # Two stores the CPU plugin cannot take for one segment: it takes a run of adjacent readable
    # mappings for one, so each store is fenced by an unreadable page at either end.
    page = os.sysconf("SC_PAGE_SIZE")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def fenced():
        store = torch.empty(1 << 21, dtype=torch.uint8).share_memory_()
        base = store.data_ptr()
        assert base % page == 0
        for at in (base, base + store.numel() - page):
            assert libc.mprotect(at, page, 0) == 0, os.strerror(ctypes.get_errno())
        return store[page:store.numel() - page]

    first, second = fenced(), fenced()
    n = sd[name].numel() * sd[name].element_size()

    def place(store, values):
        t = store[:n].view(values.dtype).view(values.shape)
        t.copy_(values)
        return t

    with wsync.Producer("sglang", direct=True, bucket_bytes=1 << 22, plugin=plugin_for("cpu")) as prod:
        opens = []
        for k, store in enumerate([first, second, first]):
            sd = dict(models.step(model, k))
            sd[name] = place(store, sd[name])
            prod.sync(sd, lambda m: [w.handle(m)], version=k + 1)
            want = models.engine_layout(sd, "sglang", 0, 1)
            bad = [p for p in want if not torch.equal(params[p], want[p])]
            assert not bad, f"version {k + 1}: {bad[:3]} wrong"
            opens.append(w.opens)
        assert opens[1] > opens[0] and opens[2] > opens[1], f"opens after each version: {opens}"
        w.release()
    w.close()
