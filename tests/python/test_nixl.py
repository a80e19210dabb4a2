"""A trainer and engine replicas as separate processes, the buckets pulled over NIXL (NIXL 1.5.1,
UCX picking its own lanes: on one host shared memory or CMA, across hosts TCP or RDMA through the
same calls). The trainer stages each bucket once; every rank of every replica pulls the bytes it
needs (its TP rows, its experts) with one-sided READs and writes *consumed* back. After every
version every engine parameter equals the torch-computed layout of the trainer's tensors; each
fault is refused naming the peer, with the engine's weights unchanged, and the next good sync
lands. CPU plugin, CPU torch."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

import models
import pytest
import torch
import wsync
from conftest import EngineRanks, child, plugin_for, recv

pytestmark = pytest.mark.skipif(
    wsync._native.find_nixl() is None,
    reason="NIXL is not installed (pip install nixl-cu12): the nixl transport cannot be tested",
)

ENGINE = "sglang"


@child
def _trainer_main(conn, layout: str, bucket_bytes: int, direct: bool) -> None:
    """A trainer process: syncs version k of the model when told, relaying each request through
    the parent (the engines' RPC)."""
    model = models.tiny_model(layout)

    def send(msg: str):
        conn.send(("send", msg))
        return conn.recv()

    with wsync.Producer(ENGINE, bucket_bytes=bucket_bytes, plugin=plugin_for("cpu"), transport="nixl",
                        direct=direct) as prod:
        conn.send(("ready", None))
        while True:
            op, k = conn.recv()
            if op == "stop":
                conn.send(("stopped", None))
                return
            sd = models.step(model, k)
            n = prod.sync(sd, send, weight_version=f"step-{k}", version=k + 1)
            conn.send(("synced", n))


class Trainer:
    """The trainer process and the relay of its requests to the engine ranks that are alive."""

    def __init__(self, layout: str, bucket_bytes: int = 96 << 10, direct: bool = False):
        ctx = mp.get_context("spawn")
        self.conn, b = ctx.Pipe()
        self.proc = ctx.Process(target=_trainer_main, args=(b, layout, bucket_bytes, direct), daemon=True)
        self.proc.start()
        assert recv(self.conn, self.proc)[0] == "ready"
        self.sent: list = []

    def sync(self, k: int, replicas, on_send=None) -> int:
        """Version k to every rank of `replicas`; on_send(i, msg) may act before request i goes."""
        self.conn.send(("sync", k))
        while True:
            op, arg = recv(self.conn, self.proc)
            if op == "synced":
                return arg
            self.sent.append(arg)
            if on_send is not None and on_send(len(self.sent) - 1, arg) == "stop":
                return -1
            replies = []
            for r in replicas:
                replies += r.send(arg)
            self.conn.send(replies)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("stop", None))
            assert recv(self.conn, self.proc)[0] == "stopped"
        self.proc.join(30)


def _check(replica: EngineRanks, sd, tp: int, what: str) -> None:
    for r, (got, same_ptrs) in enumerate(replica.state()):
        want = models.engine_layout({k: v.cpu() for k, v in sd.items()}, ENGINE, r, tp)
        assert set(got) == set(want)
        bad = [n for n in want if not torch.equal(got[n], want[n])]
        assert not bad, f"{what}, rank {r} of tp {tp}: {len(bad)} parameters differ, e.g. {bad[:3]}"
        assert same_ptrs, "an engine parameter moved"


def _snapshot(replica: EngineRanks):
    return [got for got, _ in replica.state()]


def _unchanged(replica: EngineRanks, before, what: str) -> None:
    for r, (got, _) in enumerate(replica.state()):
        bad = [n for n in got if not torch.equal(got[n], before[r][n])]
        assert not bad, f"{what}: rank {r} changed {len(bad)} parameters, e.g. {bad[:3]}"


@pytest.mark.parametrize("mode", ["staged", "direct"])
@pytest.mark.parametrize("layout", ["dense", "moe"])
def test_nixl_trainer_and_two_replicas(engine_ranks, layout, mode):
    """Replica A (TP 1) and replica B (TP 2) pull three versions from one trainer process; a
    replica C that starts after version 2 takes version 3 like the others. Staged: A pulls the
    trainer's staging buffers straight into its parameters; B verifies every digest, so it pulls
    into a landing region and copies from there. Direct: every rank pulls the trainer's own
    tensors, registered where they live."""
    a = engine_ranks(ENGINE, layout, 1)
    b = engine_ranks(ENGINE, layout, 2, verify=True)
    assert all(x.startswith("cpu ") for x in a.backends + b.backends)
    trainer = Trainer(layout, direct=mode == "direct")
    model = models.tiny_model(layout)  # the oracle's copy of the trainer's model
    try:
        for k in range(3):
            replicas = [a, b]
            c = None
            if k == 2:
                c = engine_ranks(ENGINE, layout, 1)
                replicas.append(c)
            n = trainer.sync(k, replicas)
            assert n > 1  # several buckets through the retained buffers
            sd = models.step(model, k)
            _check(a, sd, 1, f"version {k}, replica A")
            _check(b, sd, 2, f"version {k}, replica B")
            if c is not None:
                _check(c, sd, 1, f"version {k}, replica C (joined after version 2)")
            for rep in replicas:
                assert all(t["committed"] == k + 1 and t["state"] == "consistent" for t in rep.txn()), rep.txn()
        manifests = [m for s in trainer.sent for m in _manifests(s)]
        assert manifests and all(m["buffer"]["kind"] == "nixl" and m["buffer"]["pid"] == 0 for m in manifests)
        if mode == "direct":
            assert all(s["kind"] == "nixl" for m in manifests for s in m["segments"])
    finally:
        trainer.stop()


def _manifests(msg: str) -> list:
    """The manifests a bucket request carries (none for begin and commit)."""
    req = json.loads(msg)
    found = []

    def walk(v):
        if isinstance(v, dict):
            if "buffer" in v and "generation" in v:
                found.append(v)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and v.startswith("{"):
            try:
                walk(json.loads(v))
            except ValueError:
                pass

    walk(req)
    return found


def _is_bucket(msg: str) -> bool:
    return bool(_manifests(msg))


def _reply_error(replies) -> str:
    texts = [r if isinstance(r, str) else json.dumps(r) for r in replies]
    bad = [t for t in texts if '"ok": false' in t.replace('":false', '": false') or "error" in t]
    return " | ".join(bad)


def test_nixl_faults_keep_the_weights(engine_ranks):
    """Forged and stale manifests, a producer gone with its memory, a trainer killed mid-version,
    a replica killed mid-sync: each is refused naming the peer, the engine's weights stay as the
    last committed version left them, and the next good sync lands."""
    layout = "dense"
    a = engine_ranks(ENGINE, layout, 1)
    b = engine_ranks(ENGINE, layout, 2)
    model = models.tiny_model(layout)
    trainer = Trainer(layout)
    try:
        trainer.sync(0, [a, b])
        sd0 = models.step(model, 0)
        _check(a, sd0, 1, "version 0")
        bucket = next(s for s in trainer.sent if _is_bucket(s))
        peer = _manifests(bucket)[0]["buffer"]
        before = _snapshot(a)

        # 1. forged peer metadata: refused at parse, naming the field
        forged = bucket.replace(peer["peer"], "AAAA" + peer["peer"][4:])
        reply = a.send(forged)
        assert "buffer.peer" in _reply_error(reply) or "peer" in _reply_error(reply), reply
        _unchanged(a, before, "forged peer metadata")

        # 2. a generation the trainer never published: refused naming it, nothing copied
        m = _manifests(bucket)[0]
        ahead = bucket.replace(f'"generation":{m["generation"]}', f'"generation":{m["generation"] + 40}')
        ahead = ahead.replace(f'\\"generation\\":{m["generation"]}', f'\\"generation\\":{m["generation"] + 40}')
        reply = a.send(ahead)
        err = _reply_error(reply)
        assert "never published" in err and "wsync-" in err, reply
        _unchanged(a, before, "unpublished generation")

        # 3. the trainer killed mid-version: after its first bucket, the version stays open or
        # partial, never committed; then a new trainer's version lands
        def kill_after_first_bucket(i, msg):
            if _is_bucket(msg) and any(_is_bucket(s) for s in trainer.sent[:i]):
                os.kill(trainer.proc.pid, signal.SIGKILL)
                trainer.proc.join(30)
                return "stop"
            return None

        assert trainer.sync(1, [a, b], on_send=kill_after_first_bucket) == -1
        for t in a.txn() + b.txn():  # version 2 was never committed
            assert t["committed"] == 1 and t["state"] in ("updating", "partial"), t

        # 4. its memory is gone with it: the bucket it published but never delivered is
        # refused, naming the peer and the buffer, and nothing is written
        undelivered = trainer.sent[-1]
        assert _is_bucket(undelivered)
        before = _snapshot(a)
        err = _reply_error(a.send(undelivered))
        dead = _manifests(undelivered)[0]["buffer"]
        assert "peer gone" in err.lower() or "PEER_GONE" in err or '"code":15' in err, err
        assert "wsync-" in err and "bucket buffer" in err, err
        assert dead["kind"] == "nixl"
        _unchanged(a, before, "manifest of a dead trainer")

        trainer = Trainer(layout)
        trainer.sync(1, [a, b])
        sd1 = models.step(model, 1)
        _check(a, sd1, 1, "version 1 after the trainer restarted")
        _check(b, sd1, 2, "version 1 after the trainer restarted")

        # 5. a replica killed in the middle of a sync: the others go on, every later version lands
        def kill_b(i, msg):
            if _is_bucket(msg) and b.procs[1].is_alive():
                os.kill(b.procs[1].pid, signal.SIGKILL)
                b.procs[1].join(30)
            return None

        trainer.sync(2, [a], on_send=kill_b)
        trainer.sync(3, [a])
        _check(a, models.step(model, 3), 1, "version 3 after replica B died")
        b.conns, b.procs = b.conns[:1], b.procs[:1]  # its surviving rank closes normally
    finally:
        trainer.stop()


@pytest.mark.parametrize("layout, tp", [("dense", 2), ("moe", 1)])
def test_nixl_replica_joins_from_a_replica(engine_ranks, layout, tp):
    """A replica that starts after version 2 takes the committed version from a replica that
    holds it (each rank from the same rank, over NIXL, wsync.replica), with the trainer stopped:
    every parameter equals the serving replica's, the push is one committed transaction; then
    the trainer, started again, lands version 3 on both."""
    a = engine_ranks(ENGINE, layout, tp)
    model = models.tiny_model(layout)
    trainer = Trainer(layout)
    try:
        for k in range(2):
            trainer.sync(k, [a])
    finally:
        trainer.stop()
    assert not trainer.proc.is_alive()
    sd = models.step(model, 0)
    sd = models.step(model, 1)
    _check(a, sd, tp, "version 2, serving replica")
    c = engine_ranks(ENGINE, layout, tp)
    a.serve_to(c, version=2)
    _check(c, sd, tp, "version 2 taken from replica A")
    assert all(t["committed"] == 2 and t["state"] == "consistent" for t in c.joined_txn()), c.joined_txn()
    trainer = Trainer(layout)
    try:
        trainer.sync(2, [a, c])
        sd = models.step(model, 2)
        _check(a, sd, tp, "version 3, replica A")
        _check(c, sd, tp, "version 3, the joined replica")
    finally:
        trainer.stop()
