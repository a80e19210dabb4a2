"""A trainer holding a real transformers Qwen3 (dense and MoE) pushes its state_dict through the
Producer into engine processes that hold the model in each engine's fused layout; after every
one of 3 syncs every engine parameter equals the torch-computed reference, and every data_ptr()
is unchanged. CPU plugin, CPU torch."""

from __future__ import annotations

import time

import models
import pytest
import torch
import wsync
from conftest import plugin_for


def _run(engine_ranks, engine: str, layout: str, tp: int, device: str = "cpu", deferred: bool = False,
         stage_first: bool = True) -> None:
    model = models.tiny_model(layout).to(device)
    ranks = engine_ranks(engine, layout, tp, device=device)
    backend = "cpu " if device == "cpu" else "cuda "
    assert all(b.startswith(backend) for b in ranks.backends), ranks.backends
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=96 << 10, device=device, plugin=plugin_for(device),
                        stage_first=stage_first) as prod:
        for k in range(3):
            sd = models.step(model, k)
            n = prod.sync(sd, ranks.send_deferred if deferred else ranks.send, weight_version=f"step-{k}")
            assert n > 1  # several buckets through the retained buffers
            for r, (got, same_ptrs) in enumerate(ranks.state()):
                want = models.engine_layout({k: v.cpu() for k, v in sd.items()}, engine, r, tp)
                assert set(got) == set(want)
                bad = [name for name in want if not torch.equal(got[name], want[name])]
                assert not bad, f"sync {k}, rank {r}: {len(bad)} parameters differ, e.g. {bad[:3]}"
                assert same_ptrs, "an engine parameter moved"
        ranks.release()


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_sync(engine_ranks, layout, tp):
    _run(engine_ranks, "sglang", layout, tp)


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_sync(engine_ranks, layout, tp):
    _run(engine_ranks, "vllm", layout, tp)


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("tp", [1, 2])
def test_lmdeploy_sync(engine_ranks, layout, tp):
    _run(engine_ranks, "lmdeploy", layout, tp)


def test_sglang_sync_after_new_storage(engine_ranks):
    """The producer keeps each bucket's staging table between syncs; a tensor given new storage
    (an optimizer that rebinds, a trainer that reloads) is staged from the new storage."""
    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    name = "model.layers.0.mlp.down_proj.weight"
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 0)
        prod.sync(sd, ranks.send)
        sd = dict(sd)
        sd[name] = sd[name] + 1  # new storage, same name, shape and dtype
        prod.sync(sd, ranks.send)
        got, same_ptrs = ranks.state()[0]
        want = models.engine_layout(sd, "sglang", 0, 1)
        assert torch.equal(got[name], want[name]) and same_ptrs
        bad = [n for n in want if not torch.equal(got[n], want[n])]
        assert not bad, bad[:3]
        ranks.release()


def test_sglang_sync_future_replies(engine_ranks):
    """send returns a concurrent.futures.Future (a thread pool delivering to the engines)."""
    from concurrent.futures import ThreadPoolExecutor

    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    with ThreadPoolExecutor(1) as pool, wsync.Producer("sglang", bucket_bytes=96 << 10,
                                                       plugin=plugin_for("cpu")) as prod:
        for k in range(2):
            sd = models.step(model, k)
            assert prod.sync(sd, lambda m: pool.submit(ranks.send, m)) > 1
            got, same = ranks.state()[0]
            want = models.engine_layout(sd, "sglang", 0, 1)
            assert same and all(torch.equal(got[n], want[n]) for n in want)
        ranks.release()


@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_sync_deferred_replies(engine_ranks, tp):
    """send returns a callable: the trainer stages bucket k+1 while the engines copy bucket k,
    and every parameter still equals the reference after each sync."""
    _run(engine_ranks, "sglang", "moe", tp, deferred=True)


@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_sync_send_first(engine_ranks, tp):
    """Producer(stage_first=False): each bucket sent as soon as it is published; the same values."""
    _run(engine_ranks, "sglang", "moe", tp, deferred=True, stage_first=False)


@pytest.mark.parametrize("stage_first,buffers", [(True, 2), (False, 2), (True, 3), (True, 1)])
def test_bucket_order(engine_ranks, stage_first, buffers):
    """The order a sync stages, publishes and sends its buckets: with stage_first (and 2 or more
    buffer sets) bucket k+1 is staged before bucket k is sent; otherwise (or with one set, whose
    bucket is consumed only once sent) each bucket is sent before the next is staged."""
    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    events = []
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu"), buffers=buffers,
                        stage_first=stage_first) as prod:
        stage_set, publish_set = prod._stage_set, prod._publish_set

        def stage(k, *a, **kw):
            events.append(("stage", k))
            return stage_set(k, *a, **kw)

        def publish(k, *a, **kw):
            events.append(("publish", k))
            return publish_set(k, *a, **kw)

        def send(m):
            events.append(("send",))
            return ranks.send_deferred(m)
        prod._stage_set, prod._publish_set = stage, publish
        for step in range(2):
            events.clear()
            sd = models.step(model, step)
            n = prod.sync(sd, send)
            assert n > 2
            want = []
            for b in range(n):
                k = (step * n + b) % buffers
                if b == 0:
                    want.append(("stage", k))
                want.append(("publish", k))
                nxt = [("stage", (k + 1) % buffers)] if b + 1 < n else []
                first = stage_first and buffers > 1
                want += nxt + [("send",)] if first else [("send",)] + nxt
            assert events == want
            got, same = ranks.state()[0]
            ref = models.engine_layout(sd, "sglang", 0, 1)
            assert same and all(torch.equal(got[n], ref[n]) for n in ref)
        ranks.release()


def _good_sync_lands_at_once(prod, ranks, model, step: int) -> None:
    """A good sync after a failed one starts at once (it waits for no consumed that would never
    come), and every engine parameter equals the reference after it."""
    sd = models.step(model, step)
    t = time.monotonic()
    prod.sync(sd, ranks.send_deferred)
    assert time.monotonic() - t < 5
    got, same = ranks.state()[0]
    want = models.engine_layout(sd, "sglang", 0, 1)
    assert same and all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("stage_first", [True, False])
def test_failed_next_stage_still_delivers_the_published_bucket(engine_ranks, stage_first):
    """A tensor of the last bucket turned into a dtype wsync has no type for: the sync raises
    naming it while staging that bucket, after the bucket before was published. That bucket is
    still delivered (stage first stages the next before sending), so the next good sync waits
    for no consumed that would never come and lands whole."""
    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu"), timeout_ms=10000,
                        stage_first=stage_first) as prod:
        sd = models.step(model, 0)
        prod.sync(sd, ranks.send_deferred)
        last = prod.plan(sd)[-1][-1]
        bad = dict(models.step(model, 1))
        bad[last] = bad[last].to(torch.complex64)
        with pytest.raises(wsync.WsyncError, match=last.replace(".", r"\.")):
            prod.sync(bad, ranks.send_deferred)
        _good_sync_lands_at_once(prod, ranks, model, 2)
        ranks.release()


def test_deferred_refusal_raises_before_reuse(engine_ranks):
    """A bucket the engine refuses, its reply read late, raises from sync before the buffer
    set that carried it is written again; the engine's parameters keep the last good sync."""
    model = models.tiny_model("dense")
    ranks = engine_ranks("sglang", "dense", 1)
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu"), timeout_ms=10000) as prod:
        sd = models.step(model, 0)
        prod.sync(sd, ranks.send_deferred)
        good, _ = ranks.state()[0]
        bad_sd = dict(models.step(model, 1))
        name = "model.layers.1.mlp.down_proj.weight"
        bad_sd[name] = bad_sd[name][:, :-1].contiguous()  # the engine refuses this shape
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(bad_sd, ranks.send_deferred)
        assert name in str(e.value)
        got, same = ranks.state()[0]
        assert same
        assert torch.equal(got[name], good[name])  # the refused tensor was not written
        # the engine gave the refused bucket back as consumed: the next sync goes on at once
        _good_sync_lands_at_once(prod, ranks, model, 2)
        ranks.release()
