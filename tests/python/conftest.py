"""Fixtures: engine ranks in child processes (each holding its torch parameters and an
EngineWorker), fed over pipes, and the GPU skip with its visible reason."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import sys
from typing import List

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def plugin_for(device: str) -> str:
    """The plugin file for tensors on `device` (the default would pick CUDA on a GPU machine)."""
    import wsync

    name = "libwsync_cpu.so" if device == "cpu" else "libwsync_cuda.so"
    return os.path.join(os.path.dirname(str(wsync._native.shim().path)), name)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    why = "no CUDA device on this machine (torch.cuda.is_available() is False)"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


def child(fn):
    """Run fn(conn, ...) in a child process; an exception goes back to the parent as text."""

    @functools.wraps(fn)
    def run(conn, *args):
        try:
            fn(conn, *args)
        except BaseException:
            import traceback

            conn.send(("child-error", traceback.format_exc()))
            raise

    return run


def recv(conn, proc, timeout: float = 120.0):
    """A child's next message, or a failure naming why (it died, failed, or said nothing)."""
    if not conn.poll(timeout):
        raise AssertionError(f"child {proc.pid} sent nothing in {timeout} s (alive: {proc.is_alive()}, exit {proc.exitcode})")
    m = conn.recv()
    if isinstance(m, tuple) and m and m[0] == "child-error":
        raise AssertionError("child failed:\n" + m[1])
    return m


@child
def _engine_main(conn, engine: str, layout: str, rank: int, tp: int, device: str, worker_kw: dict) -> None:
    import importlib

    import models
    import wsync
    import wsync.replica

    if ":" in layout:  # "module:function": function(engine, rank, tp) -> (model, zeroed params)
        mod, fn = layout.split(":")
        model, params = getattr(importlib.import_module(mod), fn)(engine, rank, tp)
        params = {k: v.to(device) for k, v in params.items()}
    else:
        model = models.tiny_model(layout)
        ref = models.engine_layout(dict(model.state_dict()), engine, rank, tp)
        params = models.zeros_like_layout(ref, device)
    ptrs = {k: v.data_ptr() for k, v in params.items()}
    w = wsync.EngineWorker(
        params, engine=engine, config=model.config, tp_rank=rank, tp_size=tp, plugin=plugin_for(device), **worker_kw
    )
    conn.send(("ready", w.backend))
    joining = None  # wsync.replica.sink over the same parameters, made by the first "join"

    def relay(msg):  # "serve": each request goes to the parent, which hands it to the joiner
        conn.send(("send", msg))
        return conn.recv()

    while True:
        op, arg = conn.recv()
        if op == "msg":
            conn.send(w.handle(arg))
        elif op == "serve":  # push these parameters to another replica's rank (over NIXL)
            conn.send(("served", wsync.replica.serve(params, relay, engine=engine, version=arg,
                                                      plugin=plugin_for(device))))
        elif op == "join":  # a request of a serving replica's push
            if joining is None:
                joining = wsync.replica.sink(params, engine=engine, config=model.config, plugin=plugin_for(device))
            conn.send(joining.handle(arg))
        elif op == "state":
            w.drain()
            if device != "cpu":
                torch.cuda.synchronize()
            same = all(params[k].data_ptr() == p for k, p in ptrs.items())
            conn.send(({k: v.detach().to("cpu", copy=True) for k, v in params.items()}, same))
        elif op == "release":
            w.release()
            conn.send("released")
        elif op == "opens":
            conn.send(w.opens)
        elif op == "txn":
            conn.send(w.state())
        elif op == "joined_txn":
            conn.send(joining.state())
        else:
            if joining is not None:
                joining.close()
            w.close()
            conn.send("bye")
            return


class EngineRanks:
    """tp engine ranks of `engine`, each in its own process; `layout` "dense", "moe", or
    "module:function" naming a function(engine, rank, tp) -> (model, zeroed params)."""

    def __init__(self, engine: str, layout: str, tp: int, device: str = "cpu", **worker_kw):
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        for r in range(tp):
            a, b = ctx.Pipe()
            dev = device if device == "cpu" else f"cuda:{r if torch.cuda.device_count() > r else 0}"
            p = ctx.Process(target=_engine_main, args=(b, engine, layout, r, tp, dev, worker_kw), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)
        self.backends = [recv(c, p)[1] for c, p in zip(self.conns, self.procs)]

    def send(self, msg: str) -> List[str]:
        for c in self.conns:
            c.send(("msg", msg))
        return [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def send_deferred(self, msg: str):
        """Send to every rank now; the replies are read when the returned callable is called
        (the Producer stages the next bucket meanwhile)."""
        for c in self.conns:
            c.send(("msg", msg))
        return lambda: [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def state(self):
        for c in self.conns:
            c.send(("state", None))
        return [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def opens(self) -> List[int]:
        """Buffers and direct segments each rank has opened so far."""
        for c in self.conns:
            c.send(("opens", None))
        return [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def txn(self) -> List[dict]:
        """Each rank's update state (EngineWorker.state())."""
        for c in self.conns:
            c.send(("txn", None))
        return [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def serve_to(self, joiner: EngineRanks, version=None) -> None:
        """Each rank pushes its parameters, as they are, into the same rank of `joiner` (a replica
        of the same engine and TP size) over NIXL (wsync.replica); this process relays."""
        for r, (c, p) in enumerate(zip(self.conns, self.procs)):
            c.send(("serve", version))
            while True:
                m = recv(c, p)
                if m[0] == "served":
                    break
                joiner.conns[r].send(("join", m[1]))
                c.send([recv(joiner.conns[r], joiner.procs[r])])

    def joined_txn(self) -> List[dict]:
        """Each rank's update state of the pushes it took from another replica (serve_to)."""
        for c in self.conns:
            c.send(("joined_txn", None))
        return [recv(c, p) for c, p in zip(self.conns, self.procs)]

    def release(self) -> None:
        for c in self.conns:
            c.send(("release", None))
        for c, p in zip(self.conns, self.procs):
            recv(c, p)

    def close(self) -> None:
        for c in self.conns:
            c.send(("close", None))
        for c, p in zip(self.conns, self.procs):
            recv(c, p, 30)
        for p in self.procs:
            p.join(30)


@pytest.fixture
def engine_ranks():
    made = []

    def make(*args, **kw):
        e = EngineRanks(*args, **kw)
        made.append(e)
        return e

    yield make
    failed = []
    for e in made:
        try:
            e.close()
        except Exception as exc:  # every rank is still stopped; the failure is reported below
            for p in e.procs:
                p.kill()
            failed.append(f"{exc}")
        else:
            failed += [f"engine rank pid {p.pid} exited with {p.exitcode}" for p in e.procs if p.exitcode not in (0, None)]
    if failed:
        pytest.fail("closing the engine ranks failed:\n" + "\n".join(failed), pytrace=False)
