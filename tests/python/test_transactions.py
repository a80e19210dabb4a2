"""Update transactions (docs/SHIMS.md): a sync with a version commits only when every declared
tensor arrived; an older version is refused before anything is written; a trainer killed
between buckets leaves the engine `partial`, that version never committed, and the engine's
update_end hook told so; a newer version then syncs cleanly. CPU plugin, every engine."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import re
import weakref

import models
import pytest
import torch
import wsync
from conftest import child, plugin_for, recv

ENGINES = ["sglang", "vllm", "lmdeploy"]


def _worker(engine: str, layout: str = "dense"):
    model = models.tiny_model(layout)
    ref = models.engine_layout(dict(model.state_dict()), engine, 0, 1)
    params = models.zeros_like_layout(ref)
    events = []
    w = wsync.EngineWorker(params, engine=engine, config=model.config, plugin=plugin_for("cpu"),
                           on_update_begin=lambda v: events.append(("begin", v)),
                           on_update_end=lambda v, ok: events.append(("end", v, ok)))
    return model, params, w, events


def _send(w):
    return lambda m: [w.handle(m)]


def _buckets(prod, w, pairs, version):
    """Every planned bucket of `pairs` to `w`, the last one finishing the version; the replies."""
    plan, by, out = prod.plan(pairs), dict(pairs), []
    for b, names in enumerate(plan):
        for m in prod.stage_bucket([(n, by[n]) for n in names], finished=b == len(plan) - 1,
                                   weight_version=str(version)):
            out.append(json.loads(w.handle(m)))
        prod.wait()
    return out


def _same(params, want):
    return all(torch.equal(params[n], want[n]) for n in want)


@pytest.mark.parametrize("engine", ENGINES)
def test_versions_commit_and_older_is_refused(engine):
    model, params, w, events = _worker(engine)
    with wsync.Producer(engine, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        for v in (1, 2):
            sd = models.step(model, v)
            assert prod.sync(sd, _send(w), version=v) > 1
            st = w.state()
            assert st["state"] == "consistent" and st["consistent"] and st["committed"] == v, st
            assert _same(params, models.engine_layout(sd, engine, 0, 1))
        assert events == [("begin", 1), ("end", 1, True), ("begin", 2), ("end", 2, True)]
        before = {n: t.clone() for n, t in params.items()}
        for stale in (2, 1):
            with pytest.raises(wsync.errors.StaleGeneration) as e:
                prod.sync(models.step(model, 9), _send(w), version=stale)
            assert f"version {stale}" in str(e.value) and "committed version 2" in str(e.value)
            assert _same(params, before)
        assert w.state()["committed"] == 2
        w.release()
        w.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_commit_refused_naming_what_is_missing(engine):
    model, params, w, events = _worker(engine)
    with wsync.Producer(engine, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), _send(w), version=1)
        sd = models.step(model, 2)
        pairs = list(sd.items())
        missing = "model.layers.1.mlp.down_proj.weight"
        from wsync.producer import begin_message, check_replies

        check_replies([w.handle(begin_message(2, pairs))])
        sent = [(n, t) for n, t in pairs if n != missing]  # a bucket lost on the way
        replies = _buckets(prod, w, sent, 2)
        bad = [r for r in replies if not r["ok"]]
        assert bad and "commit of version 2 refused" in bad[0]["message"] and missing in bad[0]["message"], replies
        st = w.state()
        assert st["committed"] == 1 and not st["consistent"] and st["state"] == "updating", st
        assert st["update"]["tensors"] == len(pairs) - 1 and st["update"]["expect_tensors"] == len(pairs)
        # a newer version restarts cleanly and commits
        sd = models.step(model, 3)
        prod.sync(sd, _send(w), version=3)
        st = w.state()
        assert st["state"] == "consistent" and st["committed"] == 3, st
        assert _same(params, models.engine_layout(sd, engine, 0, 1))
        assert ("end", 2, False) in events and events[-1] == ("end", 3, True)
        w.release()
        w.close()


def test_undeclared_tensor_refused_before_writing():
    model, params, w, _ = _worker("sglang")
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), _send(w), version=1)
        before = {n: t.clone() for n, t in params.items()}
        from wsync.producer import begin_message, check_replies

        pairs = list(models.step(model, 2).items())
        check_replies([w.handle(begin_message(2, pairs[1:]))])  # declares all but the first
        reply = json.loads(w.handle(prod.stage_bucket(pairs[:3], finished=True)[0]))
        assert not reply["ok"] and pairs[0][0] in reply["message"] and "not part of version 2" in reply["message"]
        assert _same(params, before)
        w.release()
        w.close()


@child
def _trainer(conn, engine: str, buckets_before_death: int) -> None:
    model = models.tiny_model("dense")

    def send(m):
        conn.send(m)
        return [conn.recv()]

    with wsync.Producer(engine, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(model, 1), send, version=1)
        conn.send(("synced", None))
        sd = models.step(model, 2)
        pairs = list(sd.items())
        from wsync.producer import begin_message

        send(begin_message(2, pairs))
        plan = prod.plan(pairs)
        by = dict(pairs)
        for names in plan[:buckets_before_death]:
            for m in prod.stage_bucket([(n, by[n]) for n in names], finished=False, weight_version="2"):
                send(m)
            prod.wait()
        conn.send(("dying", len(plan)))
        os._exit(1)  # killed between buckets: no retire, no commit


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("killed_after", [0, 1, 3])
def test_trainer_killed_between_buckets(engine, killed_after):
    model, params, w, events = _worker(engine)
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_trainer, args=(b, engine, killed_after), daemon=True)
    p.start()
    shm = set()
    while True:
        m = recv(a, p)
        if isinstance(m, tuple):
            if m[0] == "dying":
                break
            continue
        shm.update(re.findall(r"wsync-[0-9]+-[0-9]+-[0-9]+-[0-9a-f]+-[0-9a-f]+", m))  # its staging segments
        a.send(w.handle(m))
    p.join(30)
    assert p.exitcode == 1
    st = w.state()  # the producer is gone: the open version ends here
    assert st["committed"] == 1, st
    if killed_after == 0:  # begun, nothing written: still all of version 1
        assert st["state"] == "consistent" and st["consistent"], st
    else:
        assert st["state"] == "partial" and not st["consistent"], st
        assert st["update"]["version"] == 2 and st["update"]["buckets"] == killed_after, st
        assert "producer" in st["reason"] and "gone" in st["reason"], st
    assert events[-2:] == [("begin", 2), ("end", 2, False)], events
    # a newer version from a new trainer syncs cleanly
    with wsync.Producer(engine, bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 3)
        prod.sync(sd, _send(w), version=3)
        assert w.state()["committed"] == 3, (w.state(), events)
        assert _same(params, models.engine_layout(sd, engine, 0, 1))
        w.release()
    w.close()
    for name in shm:  # the killed trainer could not retire its staging
        try:
            os.unlink("/dev/shm/" + name)
        except FileNotFoundError:
            pass


@pytest.mark.parametrize("group", ["all", "norms"])
def test_rollback_mode_trainer_killed(group):
    """Rollback mode: the shadowed parameters are written through shadows that the commit
    copies into place. A trainer killed mid-version leaves them exactly at the last committed
    version (all shadowed: the engine stays consistent); a later version commits them."""
    model = models.tiny_model("dense")
    ref = models.engine_layout(dict(model.state_dict()), "sglang", 0, 1)
    params = models.zeros_like_layout(ref)
    names = list(params) if group == "all" else [n for n in params if n.endswith("norm.weight")]
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"),
                           rollback=True if group == "all" else names)
    ptrs = {n: t.data_ptr() for n, t in params.items()}
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_trainer, args=(b, "sglang", 2), daemon=True)
    p.start()
    shm, v1 = set(), None
    while True:
        m = recv(a, p)
        if isinstance(m, tuple):
            if m[0] == "synced":
                v1 = {n: t.clone() for n, t in params.items()}
                assert _same(params, models.engine_layout(models.step(models.tiny_model("dense"), 1), "sglang", 0, 1))
            if m[0] == "dying":
                break
            continue
        shm.update(re.findall(r"wsync-[0-9]+-[0-9]+-[0-9]+-[0-9a-f]+-[0-9a-f]+", m))
        a.send(w.handle(m))
    p.join(30)
    st = w.state()
    assert st["committed"] == 1, st
    if group == "all":
        assert st["state"] == "consistent" and st["consistent"], st  # nothing live was written
        assert _same(params, v1)
    else:
        assert st["state"] == "partial", st
        assert all(torch.equal(params[n], v1[n]) for n in names)  # the norms are still version 1
    with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
        sd = models.step(model, 3)
        prod.sync(sd, _send(w), version=3)
        assert w.state()["committed"] == 3
        assert _same(params, models.engine_layout(sd, "sglang", 0, 1))
        assert all(params[n].data_ptr() == q for n, q in ptrs.items())
        w.release()
    w.close()
    for name in shm:
        try:
            os.unlink("/dev/shm/" + name)
        except FileNotFoundError:
            pass


def test_dropped_worker_frees_itself_and_its_shadows_without_a_collection():
    """The worker's C callbacks hold it weakly: its last reference closes and frees it, with the
    rollback shadows it made, while the cyclic collector is off (an engine that rebuilds its
    worker gets the memory back at once). Its update callbacks still run."""
    model = models.tiny_model("dense")
    params = models.zeros_like_layout(models.engine_layout(dict(model.state_dict()), "sglang", 0, 1))
    events = []
    gc.disable()
    try:
        w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"),
                               rollback=True, on_update_begin=lambda v: events.append(("begin", v)),
                               on_update_end=lambda v, ok: events.append(("end", v, ok)))
        sd = models.step(model, 1)
        with wsync.Producer("sglang", bucket_bytes=96 << 10, plugin=plugin_for("cpu")) as prod:
            prod.sync(sd, _send(w), version=1)
            w.release()
        assert events == [("begin", 1), ("end", 1, True)]
        assert _same(params, models.engine_layout(sd, "sglang", 0, 1))
        shadow, worker = weakref.ref(next(iter(w._shadows.values()))), weakref.ref(w)
        del w
        assert worker() is None, "the worker outlived its last reference"
        assert shadow() is None, "a rollback shadow outlived its worker"
    finally:
        gc.enable()


def test_a_dead_trainer_left_as_a_zombie_is_taken_for_dead():
    """The trainer-alive check holds the producer as a pidfd from when its pid was first seen:
    a producer that exited but was never reaped (a zombie, which kill(pid, 0) still finds) ends
    its open version (here before any bucket: nothing written, so the weights stay consistent),
    instead of leaving it updating for good; the next version lands."""
    import os
    import subprocess

    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, "sglang", 0, 1))
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    begin = {"method": "wsync_begin", "version": 3, "pid": child.pid, "expect": {"tensors": 1, "bytes": 128}}
    w.apply(json.dumps(begin))
    st = w.state()
    assert st["state"] == "consistent" and f"producer (pid {child.pid}) is gone" in st["reason"], st
    child.wait()
    with wsync.Producer("sglang", bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, lambda m: [w.handle(m)], version=4)
        assert w.state()["state"] == "consistent" and w.state()["committed"] == 4
        w.release()
    w.close()


def test_own_messages_come_from_the_library_and_the_engine_serves_them():
    """wsync's own requests are the C shim library's texts (wsync.messages); an engine serves
    each: begin opens the version, state reports it, abort ends it uncommitted, commit of a
    version never begun is refused naming it, and a bad argument is refused before any text."""
    from wsync import errors, messages

    model, params, w, events = _worker("sglang")
    sd = dict(models.step(model, 1))
    names = list(sd)
    text = messages.begin(3, names, 1234)
    doc = json.loads(text)
    assert doc == {"method": "wsync_begin", "version": 3, "pid": os.getpid(),
                   "expect": {"tensors": len(names), "bytes": 1234, "names": names}}
    assert json.loads(w.handle(text))["txn"]["state"] == "updating"
    assert json.loads(w.handle(messages.state()))["txn"]["update"]["version"] == 3
    st = json.loads(w.handle(messages.abort("trainer stopped")))["txn"]
    assert st["state"] != "updating" and st.get("committed") != 3, st  # nothing arrived: nothing to mark
    refused = json.loads(w.handle(messages.commit(9)))
    assert not refused["ok"] and "9" in refused["message"], refused
    with pytest.raises(errors.InvalidArgument, match="version 0"):
        messages.begin(0, names, 1)
    check = json.loads(messages.check([("a.weight", "bfloat16", [2, 3]), ("b", "float32", [])]))
    assert check == {"method": "wsync_check", "tensors": [
        {"name": "a.weight", "dtype": "bfloat16", "shape": [2, 3]}, {"name": "b", "dtype": "float32", "shape": []}]}
    w.close()
