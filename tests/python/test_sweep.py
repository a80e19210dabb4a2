"""A SIGKILLed trainer cannot unlink its staging (the exit-time unlink never runs), and each such
segment holds its RAM until someone does. The engine sweeps a producer's segments when it notices
the producer is gone (its open version ends); a new Producer sweeps every dead producer's
segments of this uid and pid namespace (docs/RELIABILITY.md, "Segments of killed trainers").
CPU plugin."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import re
import signal

import models
import torch
import wsync
from conftest import child, plugin_for, recv

SEGMENT = re.compile(r"wsync-[0-9]+-([0-9]+)-[0-9]+-[0-9a-f]+-[0-9a-f]+")


def _segments(pids) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if (m := SEGMENT.fullmatch(n)) and int(m.group(1)) in pids]


@child
def _trainer(conn, version: int, versioned: bool) -> None:
    model = models.tiny_model("dense")

    def send(m):
        conn.send(m)
        return [conn.recv()]

    conn.send(("ready", os.getpid()))
    conn.recv()  # go
    prod = wsync.Producer("sglang", bucket_bytes=32 << 10, plugin=plugin_for("cpu"))
    n = prod.sync(models.step(model, version), send, version=version if versioned else None)
    conn.send(("done", n))
    conn.recv()  # killed here at the latest


def test_segments_of_killed_trainers_are_swept():
    model = models.tiny_model("dense")
    sd = models.step(model, 1)
    params = models.zeros_like_layout(models.engine_layout(sd, "sglang", 0, 1))
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer("sglang", bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, lambda m: [w.handle(m)], version=1)
        w.release()
    v1 = {n: t.clone() for n, t in params.items()}
    rng = random.Random(50)
    ctx = mp.get_context("spawn")
    kills = 10
    trainers = []
    for i in range(kills):  # started together: each pays for its imports once, in parallel
        a, b = ctx.Pipe()
        p = ctx.Process(target=_trainer, args=(b, 2 + i, i % 2 == 0), daemon=True)
        p.start()
        trainers.append((a, p))
    swept_by_engine, unversioned = 0, []
    for i, (a, p) in enumerate(trainers):
        assert recv(a, p)[0] == "ready"
        a.send("go")
        kill_at = rng.randrange(2, 7)  # (after its wsync_begin,) on a staged bucket it waits on
        for k in range(kill_at):
            m = recv(a, p)
            assert isinstance(m, str), f"the sync ended ({m}) before message {kill_at}"
            if k != kill_at - 1:
                a.send(w.handle(m))
        assert _segments({p.pid}), f"trainer {p.pid} staged nothing before its kill"
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        st = w.state()
        if i % 2:  # no version: the engine never learnt its pid; the next Producer (the next
            # trainer's, here) sweeps
            unversioned.append(p.pid)
            continue
        # with version=: the engine notices, the open version ends, its staging is swept
        assert f"producer (pid {p.pid}) is gone" in st["reason"], st
        assert st["committed"] == 1, st
        left = _segments({p.pid})
        assert not left, f"the engine noticed pid {p.pid} gone but left {left}"
        swept_by_engine += 1
    with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")):
        left = _segments(set(unversioned))
        assert not left, f"a new Producer left the killed trainers' {left}"
    print(f"{kills} trainers SIGKILLed mid-sync: {swept_by_engine} with version= swept by the engine "
          f"that noticed, {len(unversioned)} without swept by the next Producer; 0 segments left")
    # what was written of the killed versions is never reported as a new version
    assert w.state()["committed"] == 1
    sd = models.step(model, 50)
    with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, lambda m: [w.handle(m)], version=50)
        w.release()
    st = w.state()
    assert st["state"] == "consistent" and st["committed"] == 50, st
    want = models.engine_layout(sd, "sglang", 0, 1)
    assert all(torch.equal(params[n], want[n]) for n in want)
    assert any(not torch.equal(v1[n], want[n]) for n in want)
    w.close()


@child
def _stager(conn) -> None:
    prod = wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu"))
    model = models.tiny_model("dense")
    pairs = list(models.step(model, 1).items())
    prod.stage_bucket(pairs[:2], finished=False)
    conn.send(("staged", os.getpid()))
    conn.recv()  # killed here


def test_a_new_producer_sweeps_segments_nobody_noticed():
    """A trainer killed with no engine watching: the next Producer of this uid sweeps its
    segments; a live producer's segments are never touched."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_stager, args=(b,), daemon=True)
    p.start()
    assert recv(a, p)[0] == "staged"
    with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as live:
        live.stage_bucket(list(models.step(models.tiny_model("dense"), 1).items())[:1], finished=False)
        mine = _segments({os.getpid()})
        assert mine
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        left = _segments({p.pid})
        assert left, "the killed trainer's staging should still be there"
        with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as fresh:
            fresh.stage_bucket(list(models.step(models.tiny_model("dense"), 1).items())[:1], finished=False)
            assert not _segments({p.pid}), f"a new Producer left the dead trainer's {left}"
            assert set(mine) <= set(_segments({os.getpid()})), "a live producer's segment was swept"
