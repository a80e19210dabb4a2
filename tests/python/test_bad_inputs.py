"""Bad inputs through Python raise a clear exception naming the offending value, and every
engine parameter stays exactly as it was (torch.equal before and after). CPU plugin; trainer
and engine in one process (the CPU plugin's shared memory and futexes work within one too)."""

from __future__ import annotations

import json
import os

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from wsync import errors

ENGINE = "sglang"


@pytest.fixture
def setup():
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"))
    prod = wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu"))
    prod.sync(sd, lambda m: [w.handle(m)])  # a good first sync
    before = {k: v.clone() for k, v in params.items()}
    yield model, sd, params, w, prod, before
    w.release()
    prod.close()
    w.close()


def unchanged(params, before):
    w_drained = [name for name in before if not torch.equal(params[name], before[name])]
    assert not w_drained, f"parameters changed by a refused request: {w_drained[:3]}"


def refused(w, msg, exc, needle):
    with pytest.raises(exc) as e:
        w.apply(msg)
    assert needle in str(e.value), str(e.value)
    w.drain()


def lands(w, prod, model, params, step: int, **kw) -> None:
    """The trainer's next good sync (of models.step(model, step)) lands bit-exact."""
    sd = models.step(model, step)
    prod.sync(sd, lambda m: [w.handle(m)], **kw)
    want = models.engine_layout(sd, ENGINE, 0, 1)
    assert all(torch.equal(params[k], want[k]) for k in want)


def test_wrong_dtype(setup):
    model, sd, params, w, prod, before = setup
    name = "model.layers.0.self_attn.q_proj.weight"
    (msg,) = prod.stage_bucket([(name, sd[name].float())], finished=True)
    refused(w, msg, errors.LayoutMismatch, name)
    unchanged(params, before)


def test_wrong_shape(setup):
    model, sd, params, w, prod, before = setup
    name = "model.layers.1.mlp.down_proj.weight"
    (msg,) = prod.stage_bucket([(name, sd[name][:, :-1].contiguous())], finished=True)
    refused(w, msg, errors.LayoutMismatch, name)
    unchanged(params, before)


def test_unknown_name(setup):
    model, sd, params, w, prod, before = setup
    good = "model.norm.weight"
    (msg,) = prod.stage_bucket([(good, sd[good] + 1), ("model.layers.0.mlp.no_such.weight", sd[good])],
                               finished=True)
    refused(w, msg, errors.NotFound, "model.layers.0.mlp.no_such.weight")
    unchanged(params, before)  # the good tensor of the same bucket was not written either


def test_truncated_manifest(setup):
    model, sd, params, w, prod, before = setup
    name = "model.norm.weight"
    (msg,) = prod.stage_bucket([(name, sd[name] + 1)], finished=True)
    refused(w, msg[: len(msg) // 2], errors.BadRequest, "not JSON")
    unchanged(params, before)


def test_request_without_method(setup):
    """A request the shim cannot read is BadRequest, told apart from a bad manifest inside it."""
    model, sd, params, w, prod, before = setup
    name = "model.norm.weight"
    (msg,) = prod.stage_bucket([(name, sd[name] + 1)], finished=True)
    req = json.loads(msg)
    req.pop("method")
    refused(w, json.dumps(req), errors.BadRequest, '"method"')
    unchanged(params, before)


def test_bad_tensor_in_good_request(setup):
    """The request reads, one tensor's description in its manifest does not: BadManifest naming
    the value, from the plugin's own parse of the manifest the request carries."""
    model, sd, params, w, prod, before = setup
    name = "model.norm.weight"
    (msg,) = prod.stage_bucket([(name, sd[name] + 1)], finished=True)
    req = json.loads(msg)
    assert req["load_format"] == "wsync_manifest"
    manifest = req["serialized_named_tensors"][0]
    assert '"bfloat16"' in manifest
    req["serialized_named_tensors"][0] = manifest.replace('"bfloat16"', '"bfloat17"', 1)
    refused(w, json.dumps(req), errors.BadManifest, "bfloat17")
    unchanged(params, before)


def flattened_request(msg: str, end_delta: int = 0) -> str:
    """The same bucket as any SGLang trainer sends it: a FlattenedTensorBucket (metadata with
    start_idx / end_idx / numel, the buffer in flattened_tensor), by the C encoder (packed=False),
    each tensor's end_idx moved by `end_delta`."""
    manifest = json.loads(msg)["serialized_named_tensors"][0]
    (flat,) = wsync.producer.encode_bucket("sglang", [manifest], first=True, finished=True, packed=False)
    req = json.loads(flat)
    assert req["load_format"] == "flattened_bucket"
    for t in req["serialized_named_tensors"][0]["metadata"]:
        t["end_idx"] += end_delta
    return json.dumps(req)


def test_flattened_bucket_request(setup):
    """SGLang's own FlattenedTensorBucket format is still served (a trainer that is not wsync's)."""
    model, sd, params, w, prod, before = setup
    name = "model.norm.weight"
    (msg,) = prod.stage_bucket([(name, sd[name] + 1)], finished=True)
    w.apply(flattened_request(msg))
    w.drain()
    assert torch.equal(params[name], sd[name] + 1)


def test_flattened_bucket_truncated(setup):
    """A FlattenedTensorBucket whose byte range does not hold its tensor: BadManifest naming it,
    nothing written."""
    model, sd, params, w, prod, before = setup
    name = "model.norm.weight"
    (msg,) = prod.stage_bucket([(name, sd[name] + 1)], finished=True)
    refused(w, flattened_request(msg, end_delta=2), errors.BadManifest, name)
    unchanged(params, before)


def test_stale_generation(setup):
    model, sd, params, w, prod, before = setup
    name = "model.norm.weight"
    (msg1,) = prod.stage_bucket([(name, sd[name] + 1)], finished=True)
    w.apply(msg1)
    w.drain()
    prod.wait()
    after_first = {k: v.clone() for k, v in params.items()}
    refused(w, msg1, errors.StaleGeneration, "generation")  # replayed
    unchanged(params, after_first)


def test_missing_plugin():
    model = models.tiny_model("dense")
    params = {"model.norm.weight": torch.zeros(64, dtype=torch.bfloat16)}
    with pytest.raises(errors.PluginUnavailable) as e:
        wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin="/nonexistent/libwsync_x.so")
    assert "/nonexistent/libwsync_x.so" in str(e.value)
    assert torch.equal(params["model.norm.weight"], torch.zeros(64, dtype=torch.bfloat16))


def test_incompatible_plugin():
    """A library without wsync_plugin_init (the shim library itself) is refused by name."""
    model = models.tiny_model("dense")
    lib = os.path.join(os.path.dirname(wsync._native.shim().path), "libwsync_shim.so")
    params = {"model.norm.weight": torch.ones(64, dtype=torch.bfloat16)}
    with pytest.raises(errors.PluginUnavailable) as e:
        wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=lib)
    assert "wsync_plugin_init" in str(e.value)
    assert torch.equal(params["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))


def test_unknown_engine():
    prod = wsync.Producer("tgi", bucket_bytes=1 << 16, plugin=plugin_for("cpu"))
    with pytest.raises(errors.NotFound) as e:
        prod.plan({"model.norm.weight": torch.zeros(4)})
    assert '"tgi"' in str(e.value)
    prod.close()


def test_unsupported_dtype():
    prod = wsync.Producer(ENGINE, bucket_bytes=1 << 16, plugin=plugin_for("cpu"))
    with pytest.raises(errors.InvalidArgument) as e:
        prod.stage_bucket([("model.norm.weight", torch.zeros(4, dtype=torch.complex64))])
    assert "complex64" in str(e.value)
    prod.close()


def test_vllm_refused_first_bucket_does_not_wedge_the_next_sync():
    """vLLM's protocol opens an update with start_weight_update: a sync whose first bucket is
    refused (nothing written, no version open) must not leave it open, or every later sync
    would be BUSY. The next whole sync lands; the refusal names the tensor and wrote nothing."""
    model = models.tiny_model("dense")
    sd = models.step(model, 1)
    params = models.zeros_like_layout(models.engine_layout(sd, "vllm", 0, 1))
    w = wsync.EngineWorker(params, engine="vllm", config=model.config, plugin=plugin_for("cpu"))
    send = lambda m: [w.handle(m)]  # noqa: E731
    with wsync.Producer("vllm", bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, send)
        before = {k: v.clone() for k, v in params.items()}
        name = "model.layers.0.self_attn.q_proj.weight"
        bad = dict(models.step(model, 2))
        bad[name] = bad[name].float()
        with pytest.raises(errors.LayoutMismatch) as e:
            prod.sync(bad, send)
        assert name in str(e.value), str(e.value)
        unchanged(params, before)
        sd = models.step(model, 3)
        prod.sync(sd, send)  # no abort needed: the refused update held nothing
        want = models.engine_layout(sd, "vllm", 0, 1)
        assert all(torch.equal(params[n], want[n]) for n in want)
        w.release()
    w.close()


def _bad_nbytes(msg: str) -> str:
    """The staged bucket's manifest with one tensor's nbytes disagreeing with its shape: refused
    while the manifest is parsed (BAD_MANIFEST)."""
    req = json.loads(msg)
    man = json.loads(req["serialized_named_tensors"][0])
    man["tensors"][0]["nbytes"] += 2
    req["serialized_named_tensors"][0] = json.dumps(man)
    return json.dumps(req)


def _offsets(how: str):
    """The staged bucket's manifest with tensors[1]'s offset moved: onto tensors[0]'s bytes
    ("into"), or the two offsets swapped ("swap"; both tensors are the same size, so the byte
    ranges stay disjoint and only the digests can tell)."""
    def spoil(msg: str) -> str:
        req = json.loads(msg)
        man = json.loads(req["serialized_named_tensors"][0])
        a, b = man["tensors"][0], man["tensors"][1]
        if how == "into":
            b["offset"] = a["offset"]
        else:
            a["offset"], b["offset"] = b["offset"], a["offset"]
        req["serialized_named_tensors"][0] = json.dumps(man)
        return json.dumps(req)
    return spoil


NORMS = ("model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight")


def _buffer_pid(pid):
    """The staged bucket's manifest naming `pid` as its producer: refused when the engine maps
    the segment (its control block says who created it); the creator check is never off."""
    def spoil(msg: str) -> str:
        req = json.loads(msg)
        man = json.loads(req["serialized_named_tensors"][0])
        man["buffer"]["pid"] = pid() if callable(pid) else pid
        req["serialized_named_tensors"][0] = json.dumps(man)
        return json.dumps(req)
    return spoil


def _third_process() -> int:
    """A live process that is neither trainer nor engine (killed at exit)."""
    import atexit
    import subprocess

    p = subprocess.Popen(["sleep", "600"])
    atexit.register(p.kill)
    return p.pid


REFUSALS = {  # class -> (the bad bucket's tensors, how its message is spoiled, the error, a needle)
    "offset into another tensor": (lambda sd: [(n, sd[n] + 1) for n in NORMS], _offsets("into"),
                                   errors.BadManifest, "overlaps tensors[0]"),

    "bad manifest": (lambda sd: [("model.norm.weight", sd["model.norm.weight"] + 1)], _bad_nbytes,
                     errors.BadManifest, "nbytes"),
    "wrong dtype": (lambda sd: [("model.norm.weight", sd["model.norm.weight"].float())], None,
                    errors.LayoutMismatch, "model.norm.weight"),
    "unknown name": (lambda sd: [("model.layers.0.mlp.no_such.weight", sd["model.norm.weight"])], None,
                     errors.NotFound, "no_such"),
    "wrong shape": (lambda sd: [("model.layers.1.mlp.down_proj.weight",
                                 sd["model.layers.1.mlp.down_proj.weight"][:, :-1].contiguous())], None,
                    errors.LayoutMismatch, "down_proj"),
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_after_any_refusal_the_next_good_sync_lands(kind):
    """One refused request of each class: the message names the offending value, no engine
    parameter changes, and the same Producer's next good sync lands bit-exact at once (the
    refused bucket is given back as consumed, a refusal at parse included: before, that one
    jammed the trainer until its timeout)."""
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu"), timeout_ms=5000, buffers=1) as prod:
        prod.sync(sd, lambda m: [w.handle(m)])
        before = {k: v.clone() for k, v in params.items()}
        tensors, spoil, exc, needle = REFUSALS[kind]
        (msg,) = prod.stage_bucket(tensors(sd), finished=True)
        refused(w, spoil(msg) if spoil else msg, exc, needle)
        unchanged(params, before)
        lands(w, prod, model, params, 1)
        w.release()
    w.close()


@pytest.mark.parametrize("pid", ["0", "third process"])
def test_a_manifest_naming_another_producer_is_refused(pid):
    """A manifest's buffer.pid must be the pid that created its segment (written in the
    segment's control block by its creator); 0 no longer turns the check off. Such a text is
    not a bucket any trainer published as it stands, so nothing is given back for it (its
    producer's wait for that buffer ends in its timeout); the engine's weights are unchanged,
    the process it named is untouched, and the next trainer's sync lands."""
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, lambda m: [w.handle(m)])
        before = {k: v.clone() for k, v in params.items()}
        named = 0 if pid == "0" else _third_process()
        (msg,) = prod.stage_bucket([("model.norm.weight", sd["model.norm.weight"] + 1)], finished=True)
        refused(w, _buffer_pid(named)(msg), errors.BadManifest,
                f"manifest says producer pid {named}, segment /wsync-")
        unchanged(params, before)
        if named:
            os.kill(named, 0)  # untouched, still running
        w.release()
    with wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        lands(w, prod, model, params, 1)
        w.release()
    w.close()


@pytest.mark.parametrize("field, value, needle", [
    ("tensors", -1, 'expect.tensors must be an integer >= 0, got -1'),
    ("bytes", -5, 'expect.bytes must be an integer >= 0, got -5'),
    ("pid", 0, "pid must be the producer's process id (an integer >= 1), got 0"),
    ("pid", -1, "pid must be the producer's process id (an integer >= 1), got -1"),
    ("pid", "1234", "pid must be the producer's process id (an integer >= 1), got \"1234\""),
])
def test_begin_fields_that_would_wrap_are_refused(setup, field, value, needle):
    """wsync_begin's expect counts and pid: a negative count would wrap (the version could never
    commit) and a pid that is no process id would turn the trainer-alive check off."""
    model, sd, params, w, prod, before = setup
    req = {"method": "wsync_begin", "version": 7, "pid": os.getpid(), "expect": {"tensors": 1, "bytes": 128}}
    if field == "pid":
        req["pid"] = value
    else:
        req["expect"][field] = value
    refused(w, json.dumps(req), errors.BadRequest, needle)
    assert w.state()["state"] == "consistent"
    unchanged(params, before)


@pytest.mark.parametrize("engine, field", [("sglang", "flush_cache"), ("lmdeploy", "finished")])
@pytest.mark.parametrize("value", ["false", 0, 1, None])
def test_booleans_that_are_not_booleans_are_refused(engine, field, value):
    """SGLang's flush_cache and LMDeploy's finished must be true or false: the string "false"
    meant false, and so did 1. Refused naming the value, nothing written, and the trainer's next
    good sync lands."""
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, engine, 0, 1))
    w = wsync.EngineWorker(params, engine=engine, config=model.config, plugin=plugin_for("cpu"))
    with wsync.Producer(engine, bucket_bytes=1 << 20, plugin=plugin_for("cpu"), timeout_ms=5000) as prod:
        (msg,) = prod.stage_bucket([("model.norm.weight", sd["model.norm.weight"] + 1)], finished=True)
        req = json.loads(msg)
        req[field] = value
        before = {k: v.clone() for k, v in params.items()}
        refused(w, json.dumps(req), errors.BadRequest, f'field "{field}" must be true or false, got {json.dumps(value)}')
        unchanged(params, before)
        prod.sync(sd, lambda m: [w.handle(m)])
        want = models.engine_layout(sd, engine, 0, 1)
        assert all(torch.equal(params[k], want[k]) for k in want)
        w.release()
    w.close()


def test_a_direct_segment_of_another_process_is_refused():
    """Direct mode: a segment's pid is the process the engine reads (process_vm_readv). A manifest
    whose segment names another process than the one that published its buffer is refused
    before anything is read, naming both pids; nothing of the third process is read, the weights
    are unchanged, and the trainer's next sync lands."""
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"))
    third = _third_process()
    with wsync.Producer(ENGINE, direct=True, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, lambda m: [w.handle(m)])
        before = {k: v.clone() for k, v in params.items()}
        sd = models.step(model, 1)
        msgs = []
        with pytest.raises(errors.BadManifest) as e:
            prod.sync(sd, lambda m: msgs.append(m) or [w.handle(_segment_pid(m, third))])
        assert f"names producer pid {third}, but the manifest's buffer was published by pid {os.getpid()}" in str(e.value)
        unchanged(params, before)
        lands(w, prod, model, params, 2)
        w.release()
    w.close()


def _segment_pid(msg: str, pid: int) -> str:
    req = json.loads(msg)
    man = json.loads(req["serialized_named_tensors"][0])
    man["segments"][0]["pid"] = pid
    req["serialized_named_tensors"][0] = json.dumps(man)
    return json.dumps(req)


@pytest.mark.parametrize("verify", [False, True])
def test_swapped_offsets_are_caught_only_by_verify(verify):
    """Two same-size tensors whose offsets were swapped: disjoint byte ranges, so only the
    digests can tell. verify=True: DIGEST_MISMATCH naming the tensor, found as the bytes pass
    through the copy, so that bucket's parameters may be written: the engine reports itself not
    consistent (the version stays open, never committed), and the next version lands. verify=False (the default) writes
    the swapped bytes and commits (docs/RELIABILITY.md, "What verify buys")."""
    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"), verify=verify)
    from wsync.producer import begin_message, check_replies

    with wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu"), buffers=1) as prod:
        prod.sync(sd, lambda m: [w.handle(m)], version=1)
        pairs = [(n, sd[n] + 1) for n in NORMS]
        check_replies([w.handle(begin_message(2, pairs))])
        (msg,) = prod.stage_bucket(pairs, finished=True, weight_version="2")
        if verify:
            refused(w, _offsets("swap")(msg), errors.DigestMismatch, NORMS[0])
            st = w.state()
            assert st["committed"] == 1 and st["state"] == "updating" and not st["consistent"], st
        else:
            w.apply(_offsets("swap")(msg))
            assert w.state()["committed"] == 2
            assert torch.equal(params[NORMS[0]], pairs[1][1]) and torch.equal(params[NORMS[1]], pairs[0][1])
        lands(w, prod, model, params, 3, version=3)
        st = w.state()
        assert st["state"] == "consistent" and st["committed"] == 3, st
        w.release()
    w.close()


@pytest.mark.parametrize("kw, needle", [
    ({"ep_rank": -1, "ep_size": 2}, "ep_rank must be an integer in [0, 2**32), got -1"),
    ({"tp_rank": -1}, "tp_rank must be an integer in [0, 2**32), got -1"),
    ({"moe_tp_size": 1.5}, "moe_tp_size must be an integer in [0, 2**32), got 1.5"),
    ({"ep_size": "2"}, "ep_size must be an integer in [0, 2**32), got '2'"),
])
def test_engine_ranks_that_would_wrap_are_refused_at_construction(kw, needle):
    """A rank or size that the engine table's uint32 cannot hold was reported as 4294967295 at
    the first request; now the worker refuses it when made, naming the field and the value."""
    model = models.tiny_model("moe")
    params = models.zeros_like_layout(models.engine_layout(models.step(model, 0), ENGINE, 0, 1))
    with pytest.raises(ValueError) as e:
        wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"), **kw)
    assert needle in str(e.value)


def test_engine_ranks_out_of_range_are_refused_naming_them():
    """The rank-against-size rule is the library's: EP rank 5 of 2 is refused naming both, and
    nothing is written."""
    model = models.tiny_model("moe")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"), ep_rank=5, ep_size=2)
    before = {k: v.clone() for k, v in params.items()}
    with wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(errors.InvalidArgument) as e:
            prod.sync(sd, lambda m: [w.handle(m)])
        assert "EP rank 5 of 2" in str(e.value)
        unchanged(params, before)
        w.release()
    w.close()


def _many_tensors(msg: str, n: int, name_len: int = 40) -> str:
    """The staged bucket's request with a manifest of n one-byte tensors."""
    req = json.loads(msg)
    man = json.loads(req["serialized_named_tensors"][0])
    man.pop("digests", None)
    man["tensors"] = [{"name": (f"t{i:07d}").ljust(name_len, "x"), "dtype": "uint8", "shape": [1],
                       "offset": i, "nbytes": 1} for i in range(n)]
    req["serialized_named_tensors"][0] = json.dumps(man)
    return json.dumps(req)


def test_manifest_limits_bound_the_cost_and_can_be_raised():
    """A manifest over the consumer's limits (16 MiB of text, 65 536 tensors by default) is
    refused before it is parsed, naming the limit (the time left is the request's own handling);
    an EngineWorker made with
    higher limits parses it (and then refuses its unknown names). Nothing is written."""
    import time

    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, ENGINE, 0, 1))
    before = {k: v.clone() for k, v in params.items()}
    w = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"))
    big = wsync.EngineWorker(params, engine=ENGINE, config=model.config, plugin=plugin_for("cpu"),
                             max_manifest_tensors=1 << 17, max_manifest_bytes=64 << 20)
    with wsync.Producer(ENGINE, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        (msg,) = prod.stage_bucket([("model.norm.weight", sd["model.norm.weight"])], finished=True)
        many = _many_tensors(msg, 70000)
        long_names = _many_tensors(msg, 20000, 1000)  # 20 MB of names
        for text, needle in ((many, "limit of 65536 tensors (max_manifest_tensors)"),
                             (long_names, "over this consumer's limit of 16777216 (max_manifest_bytes)")):
            t0 = time.monotonic()
            reply = json.loads(w.handle(text))
            took = time.monotonic() - t0
            assert not reply["ok"] and needle in reply["message"], reply
            print(f"{len(text) / 1e6:.1f} MB request refused in {took * 1e3:.0f} ms: {reply['message'][:80]}")
            assert took < 1.0, f"refused in {took:.2f} s"
            reply = json.loads(big.handle(text))  # parsed: its names are no parameter's
            assert not reply["ok"] and "unknown tensor" in reply["message"], reply
        huge = _many_tensors(msg, 40000, 1000)  # a 42 MB request: refused before it is read
        t0 = time.monotonic()
        reply = json.loads(w.handle(huge))
        took = time.monotonic() - t0
        print(f"{len(huge) / 1e6:.1f} MB request refused in {took * 1e3:.0f} ms: {reply['message'][:90]}")
        assert not reply["ok"] and "over the limit of 33554432 (1 rank(s) + 1 times max_manifest_bytes)" in reply["message"]
        assert took < 0.1, f"refused in {took:.2f} s"
        unchanged(params, before)
        w.release()
        big.release()
    w.close()
    big.close()
