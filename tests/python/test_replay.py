"""Plan once, replay (docs/DESIGN.md, "Plan once, replay"): a steady sync sends each bucket as
the replay of the plan its first sync recorded, and every change is detected. CPU plugin;
trainer and engine in one process. The oracle is the engine layout built with torch from the
trainer's own tensors (models.engine_layout), compared bit for bit after every sync."""

from __future__ import annotations

import json
import random

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync import errors
from wsync.producer import encode_bucket

ENGINE = "sglang"


class Engine:
    """One engine rank in this process, and what each request carried: per manifest, its plan
    id and whether it was the full manifest or the replay."""

    def __init__(self, model, rank: int = 0, tp: int = 1, **kw) -> None:
        self.model, self.rank, self.tp = model, rank, tp
        ref = models.engine_layout(dict(model.state_dict()), ENGINE, rank, tp)
        self.params = models.zeros_like_layout(ref)
        self.w = wsync.EngineWorker(self.params, engine=ENGINE, config=model.config, tp_rank=rank,
                                    tp_size=tp, plugin=plugin_for("cpu"), **kw)
        self.seen: list = []
        self.segments: set = set()  # (handle, bytes) of every segment the requests named

    def handle(self, msg: str) -> str:
        texts = json.loads(msg).get("serialized_named_tensors", [])
        for m in texts[self.rank:self.rank + 1] if len(texts) == self.tp else texts:  # this rank's
            man = json.loads(m)
            self.seen.append(("replay", man["replay"]) if "replay" in man else ("full", man.get("plan")))
            self.segments |= {(g["handle"], g["bytes"]) for g in man.get("segments", [])}
        return self.w.handle(msg)

    def equals(self, sd) -> None:
        want = models.engine_layout(sd, ENGINE, self.rank, self.tp)
        bad = [n for n in want if not torch.equal(self.params[n], want[n])]
        assert not bad, f"{len(bad)} engine parameters differ from the oracle, e.g. {bad[:3]}"

    def close(self) -> None:
        self.w.release()
        self.w.close()


def new_values(sd, rng: random.Random) -> None:
    """A training step: new values in every tensor, in place."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    with torch.no_grad():
        for t in sd.values():
            t.copy_(torch.randint(-64, 64, t.shape, generator=g).to(t.dtype))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
def test_replay_1000_steps_with_changes(direct):
    """1 000 syncs. A steady one sends every bucket as a replay; at random steps a tensor is
    re-allocated, every tensor is (a re-made arena: every segment another), or a tensor's dtype
    changes. Direct mode: the first two change the buckets' plans, which go in full (new plan
    ids) and are replayed from the next step on; staged, the staging layout and so the plans stay
    (the trainer re-reads the tensors where they now are). A changed dtype is a new plan, refused
    naming the tensor with nothing written, and the next sync lands. Bit-exact every step."""
    rng = random.Random(53)
    model = models.tiny_model("dense")
    sd = {n: t.clone() for n, t in model.state_dict().items()}
    eng = Engine(model)
    kinds = {"steady": 0, "realloc": 0, "remade": 0, "dtype": 0}
    kept: list = []
    with wsync.Producer(ENGINE, direct=direct, digests=False, bucket_bytes=256 << 10,
                        plugin=plugin_for("cpu")) as prod:
        for step in range(1000):
            r = rng.random()
            kind = "realloc" if r < 0.04 else "remade" if r < 0.06 else "dtype" if r < 0.08 else "steady"
            kind = kind if step > 1 else "steady"
            kinds[kind] += 1
            new_values(sd, rng)
            name = rng.choice(sorted(sd))
            if kind == "realloc":
                kept.append(sd[name])  # kept alive: no later tensor takes its address
                sd[name] = sd[name].clone()
            elif kind == "remade":
                kept.append(sd)
                sd = {n: t.clone() for n, t in sd.items()}
            eng.seen.clear()
            segments_before, eng.segments = eng.segments, set()
            if kind == "dtype":
                bad = dict(sd)
                bad[name] = sd[name].float()
                with pytest.raises(errors.LayoutMismatch) as e:
                    prod.sync(bad, lambda m: [eng.handle(m)])
                assert name in str(e.value), str(e.value)
                assert any(k == "full" for k, _ in eng.seen), f"a changed dtype is a new plan: {eng.seen}"
                eng.seen.clear()
            n_buckets = prod.sync(sd, lambda m: [eng.handle(m)])
            eng.equals(sd)
            full = [p for k, p in eng.seen if k == "full"]
            assert len(eng.seen) == n_buckets and all(p is not None for _, p in eng.seen), eng.seen
            if step == 0:
                assert len(full) == n_buckets, "the first sync records every bucket's plan"
            elif not direct:
                assert not full, f"step {step} ({kind}): {len(full)} bucket(s) in full, none expected"
            elif kind == "steady":  # only where a segment changed: the CPU plugin's segment is the
                # memory mapping holding the tensor, and the heap's grows as the trainer allocates
                assert not full or not eng.segments <= segments_before, f"step {step}: {eng.seen}"
            elif kind == "realloc":  # its bucket's plan changed (others too where its segment grew)
                assert full, f"step {step}: the re-allocated tensor's bucket replayed: {eng.seen}"
            elif kind == "remade":
                assert len(full) == n_buckets, f"step {step}: every bucket's segments changed: {eng.seen}"
        assert min(kinds.values()) >= 10, kinds
        eng.close()


def _bucket(prod, sd, names):
    """One bucket staged and published by prod's own stage_bucket; its manifest text."""
    (msg,) = prod.stage_bucket([(n, sd[n]) for n in names], finished=True)
    (text,) = json.loads(msg)["serialized_named_tensors"]
    return text


def _request(text: str) -> str:
    (msg,) = encode_bucket(ENGINE, [text], first=False, finished=True, direct=True)
    return msg


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
def test_hostile_plan_ids(direct):
    """Replays this engine cannot trust are refused naming the plan, with nothing written: an
    unknown id, another engine's, one dropped with the engine's mappings (stale), one whose
    segment changed. Those leave the bucket unconsumed, so the same bucket sent in full lands.
    Malformed replays (tensors in a replay, the wrong schema, a bad id) are refused as bad
    manifests, and the next bucket's replay lands."""
    model = models.tiny_model("dense")
    a, b = Engine(model), Engine(model)
    step = iter(range(100))
    with wsync.Producer(ENGINE, direct=direct, digests=False, buffers=1, plugin=plugin_for("cpu")) as prod:

        def bucket():
            sd = models.step(model, next(step))
            text = _bucket(prod, sd, sorted(sd))
            return (sd, *wsync.messages.plan_forms(text), text)

        def refused(txt, exc, *needles):
            before = {n: t.clone() for n, t in a.params.items()}
            with pytest.raises(exc) as e:
                a.w.apply(_request(txt))
            for needle in needles:
                assert needle in str(e.value), str(e.value)
            a.w.drain()
            assert all(torch.equal(before[n], a.params[n]) for n in before), "a refused replay wrote"

        def lands(txt, sd, *engines):
            for e in engines:
                e.w.apply(_request(txt))
                e.w.drain()
                e.equals(sd)

        with wsync.Producer(ENGINE, direct=direct, digests=False, buffers=1, plugin=plugin_for("cpu")) as other:
            sd = models.step(model, 99)  # b's own trainer: the same tensors, the same plan id
            pid, full, _ = wsync.messages.plan_forms(_bucket(other, sd, sorted(sd)))
            lands(full, sd, b)
            b.w.release()
        sd, pid2, full, replay, text = bucket()
        assert pid2 == pid
        refused(replay, errors.UnknownPlan, pid, "another engine")  # b's plan, not a's
        refused(replay.replace(pid, "deadbeef-1"), errors.UnknownPlan, "deadbeef-1")
        lands(full, sd, a)  # the bucket in full: the refusals left it unconsumed

        sd, pid2, full, replay, text = bucket()
        assert pid2 == pid, "the same tensors at the same places: the same plan"
        if direct:  # a segment that is not the recorded one: memory re-made or moved
            man = json.loads(replay)
            man["segments"][0]["bytes"] += 64
            refused(json.dumps(man, separators=(",", ":")), errors.UnknownPlan, "segment 0")
        lands(replay, sd, a)

        # malformed replays of the bucket just taken: refused at parse, before any other check
        refused(replay.replace('"tensors":[]', text[text.index('"tensors":'):-1]), errors.BadManifest, "no tensors")
        refused(replay.replace('"wsync":2', '"wsync":1'), errors.BadManifest, "replay")
        refused(replay.replace(pid, "bad id!"), errors.BadManifest, "not a plan id")
        sd, _, full, replay, text = bucket()
        lands(replay, sd, a)

        a.w.release()  # the mappings go, and the plans with them: a later replay is stale
        sd, _, full, replay, text = bucket()
        refused(replay, errors.UnknownPlan, "released")
        lands(full, sd, a)
        a.close()
        b.close()


def test_replay_falls_back_when_a_rank_lost_its_plans():
    """TP 2: rank 1 is re-created (its plans gone) while rank 0 keeps them. The next sync's
    replays are refused by rank 1 alone; the Producer sends each such bucket in full, rank 0 takes
    it once (it replayed it already) and rank 1 records it; the sync after is all replays."""
    model = models.tiny_model("dense")
    ranks = [Engine(model, r, 2) for r in range(2)]

    def send(m):
        return [e.handle(m) for e in ranks]

    with wsync.Producer(ENGINE, tp_size=2, digests=False, bucket_bytes=256 << 10, plugin=plugin_for("cpu")) as prod:
        for k in range(2):
            sd = models.step(model, k)
            prod.sync(sd, send)
        ranks[1].close()
        ranks[1] = Engine(model, 1, 2)
        for e in ranks:
            e.seen.clear()
        sd = models.step(model, 2)
        n = prod.sync(sd, send, version=10)
        for e in ranks:
            e.equals(sd)
            kinds = [k for k, _ in e.seen]
            # the first replay refused by rank 1 sends that bucket in full, and the rest of the
            # sync goes in full (the trainer forgets its plans): every rank records them again
            assert kinds[0] == "replay" and kinds.count("full") >= n, kinds
            assert e.w.state()["committed"] == 10, e.w.state()
        sd = models.step(model, 3)
        for e in ranks:
            e.seen.clear()
        prod.sync(sd, send, version=11)
        for e in ranks:
            e.equals(sd)
            assert {k for k, _ in e.seen} == {"replay"}, e.seen
        for e in ranks:
            e.close()
