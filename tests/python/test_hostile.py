"""Hostile messages into EngineWorker.handle, as an engine's RPC would hand them over: a trainer's
own valid bucket, spoiled one field (or the text) at a time by a fixed-seed generator, for every
engine. For each one:

- handle() answers (never raises, never crashes, never hangs past the consumer's timeout);
- a refusal names something (a non-empty message with its code);
- a refusal changed nothing at all; an accepted message wrote only the bucket's true values, or
  (counted apart, and only when the spoiled field places bytes: an offset, an index array's
  order) bytes read from elsewhere in the trainer's own buffer, the one harm that only digests
  can tell (docs/RELIABILITY.md, "What verify buys");
- the trainer's own message sent after it lands or is refused as stale (its generation was given
  back), so the trainer is never jammed;
- after all of them, the same Producer's full sync lands bit-exact.

The counts per class and outcome are printed as the table in docs/RELIABILITY.md ("Hostile
messages"). CPU plugin."""

from __future__ import annotations

import collections
import json
import os
import random
import time

import models
import pytest
import torch
import wsync
from conftest import plugin_for

SEED = 50
PER_ENGINE = int(os.environ.get("WSYNC_HOSTILE_PER_ENGINE", "1000"))
NAMES = ("model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight")
HOSTILE = [-1, 0, 1, 2**31, 2**63, 2**64 + 7, -(2**63), 1.5, float("nan"), "", "x", "A" * 5000, None,
           True, False, [], {}, [1, 2], {"a": 1}]
TENSOR_KEYS = {"tensors", "metadata", "names", "dtype_names", "shapes", "offsets"}


def _decode(x):
    """The request with every string that is itself a JSON object decoded (SGLang's manifests),
    marked so that _encode puts them back as strings."""
    if isinstance(x, dict):
        return {k: _decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, str) and x.startswith("{"):
        try:
            return {"__json__": _decode(json.loads(x))}
        except ValueError:
            return x
    return x


def _encode(x):
    if isinstance(x, dict):
        if set(x) == {"__json__"}:
            return json.dumps(_encode(x["__json__"]))
        return {k: _encode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_encode(v) for v in x]
    return x


def _paths(x, at=()):
    """Every (container, key, path) below x."""
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "__json__":
                yield from _paths(v, at)
                continue
            yield x, k, at + (k,)
            yield from _paths(v, at + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield x, i, at + (i,)
            yield from _paths(v, at + (i,))


def _class(path) -> str:
    keys = {p for p in path if isinstance(p, str)}
    if keys & {"buffer", "flattened_tensor", "packed_buffers", "segments"}:
        return "buffer fields"
    if keys & TENSOR_KEYS:
        return "tensor fields"
    if keys & {"generation", "digests", "wsync", "finished"} and len(path) > 1:
        return "manifest head"
    return "request fields"


PLACEMENT = {"offset", "offsets", "start_idx", "end_idx"}


def spoil(msg: str, rng: random.Random):
    """One hostile variant of msg, its class, and whether it moved a tensor's bytes within the
    buffer (an offset changed, parallel arrays reordered): the harm only digests can tell."""
    if rng.random() < 0.15:
        how = rng.randrange(3)
        if how == 0:
            return msg[: rng.randrange(len(msg))], "text", False
        if how == 1:
            i = rng.randrange(len(msg))
            return msg[:i] + chr(rng.randrange(32, 127)) + msg[i + 1:], "text", True  # a digit of an offset
        return rng.choice(["", "null", "[]", "42", "{}", "\x00" * 8]), "text", False
    req = _decode(json.loads(msg))
    container, key, path = rng.choice(list(_paths(req)))
    what = rng.randrange(4)
    moved = bool(set(p for p in path if isinstance(p, str)) & (PLACEMENT | TENSOR_KEYS))
    if what == 0 and isinstance(container, dict):
        del container[key]
    elif what == 1 and isinstance(container[key], int) and not isinstance(container[key], bool):
        container[key] = container[key] + rng.choice([-1, 1, 8, 1 << 20, -(1 << 20)])
    elif what == 2 and isinstance(container, list) and len(container) > 1:
        container.reverse()
    else:
        container[key] = rng.choice(HOSTILE)
    return json.dumps(_encode(req)), _class(path), moved


def _run_engine(engine: str, counts: collections.Counter, rng: random.Random) -> int:
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, engine, 0, 1))
    w = wsync.EngineWorker(params, engine=engine, config=model.config, plugin=plugin_for("cpu"), timeout_ms=2000)
    tried = 0
    with wsync.Producer(engine, bucket_bytes=1 << 20, plugin=plugin_for("cpu"), timeout_ms=5000) as prod:
        prod.sync(sd, lambda m: [w.handle(m)])
        for k in range(PER_ENGINE):
            before = {n: t.clone() for n, t in params.items()}
            pairs = [(n, sd[n] + (k + 1)) for n in NAMES]
            want = models.engine_layout(dict(sd, **dict(pairs)), engine, 0, 1)
            msgs = prod.stage_bucket(pairs, finished=True)
            target = max(range(len(msgs)), key=lambda i: len(msgs[i]))  # the one naming the bucket
            for i, m in enumerate(msgs):
                if i != target:
                    w.handle(m)
                    continue
                bad, cls, placement = spoil(m, rng)
                t0 = time.monotonic()
                reply = json.loads(w.handle(bad))
                assert time.monotonic() - t0 < 10, f"{cls}: handle took {time.monotonic() - t0:.1f} s"
                tried += 1
                moved = [n for n in params if not torch.equal(params[n], before[n])]
                if reply["ok"]:
                    wrong = [n for n in moved if not torch.equal(params[n], want[n])]
                    # the one harm left: a tensor's bytes read from elsewhere in its own bucket (an
                    # offset moved, parallel arrays reordered), which only digests can tell
                    assert not wrong or placement, f"{cls}: accepted {bad[-700:]!r} and wrote wrong bytes into {wrong}"
                    counts[(cls, "accepted, bytes misplaced" if wrong else "accepted")] += 1
                else:
                    counts[(cls, reply["error"])] += 1
                    assert reply["message"], reply
                    assert not moved, f"{cls}: refused ({reply['message']}) but wrote {moved}"
                again = json.loads(w.handle(m))  # the trainer's own message
                assert again["ok"] or again["error"] in ("stale generation", "busy"), (cls, reply, again)
            prod.wait()
        w.drain()
        final = models.step(model, 99)
        prod.sync(final, lambda m: [w.handle(m)])
        want = models.engine_layout(final, engine, 0, 1)
        bad = [n for n in want if not torch.equal(params[n], want[n])]
        assert not bad, f"{engine}: the sync after the hostile messages left {bad[:3]} wrong"
        w.release()
    w.close()
    return tried


@pytest.mark.parametrize("engine", ["sglang", "vllm", "lmdeploy"])
def test_hostile_messages_change_nothing_and_jam_nothing(engine):
    rng = random.Random(f"{SEED}-{engine}")
    counts: collections.Counter = collections.Counter()
    t0 = time.monotonic()
    tried = _run_engine(engine, counts, rng)
    print(f"\n{engine}: {tried} hostile messages in {time.monotonic() - t0:.1f} s (seed {SEED})")
    for cls in sorted({c for c, _ in counts}):
        row = ", ".join(f"{o} {n}" for (c, o), n in sorted(counts.items()) if c == cls)
        print(f"  {cls}: {sum(n for (c, _), n in counts.items() if c == cls)} -> {row}")
    assert tried == PER_ENGINE
