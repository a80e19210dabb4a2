"""Update transactions and rollback mode through engine processes, on the CPU plugin and (gpu
mark) the CUDA plugin: version 1 commits; version 2 is begun, half its buckets are applied, and
the producer aborts it; with rollback mode every engine parameter is still exactly version 1 (the
buckets wrote only shadows), the engine stays consistent at version 1, and version 3 then
commits with every data_ptr unchanged. Without rollback mode the same abort leaves the engine
`partial`, version 1 still the last committed."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync.producer import begin_message, check_replies

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _half_then_abort(prod, ranks, sd, version):
    pairs = list(sd.items())
    check_replies(ranks.send(begin_message(version, pairs)))
    plan, by = prod.plan(pairs), dict(pairs)
    assert len(plan) >= 3, [len(b) for b in plan]
    for names in plan[: len(plan) // 2]:
        for m in prod.stage_bucket([(n, by[n]) for n in names], weight_version=str(version)):
            check_replies(ranks.send(m))
        prod.wait()
    prod.abort(ranks.send, "trainer step failed")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rollback", [True, False], ids=["rollback", "no_rollback"])
def test_transaction_abort_mid_version(engine_ranks, device, rollback):
    model = models.tiny_model("dense")
    if device == "cuda":
        model = model.cuda()
    ranks = engine_ranks("sglang", "dense", 1, device=device, rollback=rollback)
    with wsync.Producer("sglang", bucket_bytes=32 << 10, device=device, plugin=plugin_for(device)) as prod:
        sd1 = models.step(model, 1)
        prod.sync(sd1, ranks.send, version=1)
        ((v1, same),) = ranks.state()
        want1 = models.engine_layout({k: t.cpu() for k, t in sd1.items()}, "sglang", 0, 1)
        assert same and all(torch.equal(v1[n], want1[n]) for n in want1)

        _half_then_abort(prod, ranks, models.step(model, 2), 2)
        ((st,),) = [ranks.txn()]
        assert st["committed"] == 1, st
        ((now, same),) = ranks.state()
        changed = [n for n in v1 if not torch.equal(now[n], v1[n])]
        if rollback:
            assert st["state"] == "consistent" and st["consistent"], st
            assert changed == [], changed[:5]  # exactly version 1: every byte
        else:
            assert st["state"] == "partial" and not st["consistent"], st
            assert changed, "half of version 2 was applied in place"

        sd3 = models.step(model, 3)
        prod.sync(sd3, ranks.send, version=3)
        ((st,),) = [ranks.txn()]
        assert st["state"] == "consistent" and st["committed"] == 3, st
        ((v3, same),) = ranks.state()
        want3 = models.engine_layout({k: t.cpu() for k, t in sd3.items()}, "sglang", 0, 1)
        assert same and all(torch.equal(v3[n], want3[n]) for n in want3)
        ranks.release()
