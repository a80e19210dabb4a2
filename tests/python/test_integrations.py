"""The engine integrations, driven as each engine drives them: vLLM's own weight-transfer
classes and factories (vllm 0.33.0 installed --no-deps beside CPU torch), with the model a torch
module holding the fused engine layout (a stand-in for a served model: tests/real_vllm runs the
real vLLM end to end) and the trainer a transformers Qwen3."""

from __future__ import annotations

import json
import types

import models
import pytest
import torch
import wsync
from conftest import plugin_for


class EngineModel(torch.nn.Module):
    """An engine's model: its fused parameters under engine names (dots kept via a ParameterDict
    per name), with the HF config."""

    def __init__(self, layout, config):
        super().__init__()
        self.config = config
        self._p = {k: torch.nn.Parameter(torch.zeros_like(v), requires_grad=False) for k, v in layout.items()}
        for i, p in enumerate(self._p.values()):
            self.register_parameter(f"p{i}", p)

    def named_parameters(self, *a, **k):  # engine names, as the engines' modules report them
        return iter(self._p.items())


def _setup(engine, layout="dense"):
    hf = models.tiny_model(layout)
    sd = models.step(hf, 0)
    em = EngineModel(models.engine_layout(sd, engine, 0, 1), hf.config)
    return hf, sd, em


def _check(em, sd, engine):
    want = models.engine_layout(sd, engine, 0, 1)
    bad = [k for k, p in em._p.items() if not torch.equal(p.data, want[k])]
    assert not bad, bad[:3]


class _EngineClient:
    """A VLLMWeightSyncClient whose calls land on one engine in this process, as vLLM's worker
    makes them (vllm/v1/worker/gpu_worker.py: parse then init; start; update_weights with this
    rank's dict; finish): the RPC hop to a worker process is the one thing not real here
    (tests/real_vllm runs the whole engine)."""

    def __init__(self, eng):
        self.eng = eng

    def init_weight_transfer_engine(self, init_info):
        self.eng.init_transfer_engine(self.eng.parse_init_info(init_info))

    def start_weight_update(self):
        self.eng.start_weight_update()

    def update_weights(self, update_info):
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        # what vLLM's HTTP client sends, through JSON, then the worker's pick of its rank
        wire = json.loads(json.dumps(_json_safe_update_payload(update_info)))
        self.eng.update_weights(wire[0] if isinstance(wire, list) else wire)

    def finish_weight_update(self, weight_version=None):
        self.eng.finish_weight_update()


class _Source:
    """A WeightSource over the trainer model's state_dict (vLLM 0.33.0's iter_full)."""

    def __init__(self, model):
        self.model = model

    def iter_full(self):
        return iter(self.model.state_dict().items())


def _vllm_engine(hf, em, backend="wsync"):
    pytest.importorskip("vllm.distributed.weight_transfer.factory",
                        reason="vLLM's weight-transfer classes are installed by tests/run.sh (vllm==0.33.0 --no-deps)")
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory
    from wsync.integrations.vllm import register

    register()  # what the package's vllm.general_plugins entry point runs
    vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf.config),
                                        parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
    return WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=backend), vllm_config,
                                                     torch.device("cpu"), em)


def test_vllm_backend_both_sides_through_vllms_factories():
    """vLLM 0.33.0's own factories: the engine from WeightTransferEngineFactory, the trainer from
    WeightTransferTrainerFactory.trainer_init with the wsync init info; three steps written in
    place (mode in_place: the stand-in model computes with its weights as loaded), every
    parameter equal to the torch oracle."""
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from wsync.integrations.vllm_trainer import WsyncTrainerInitInfo

    hf, sd, em = _setup("vllm", "moe")
    eng = _vllm_engine(hf, em)
    abstract = {n for n, f in vars(WeightTransferEngine).items() if getattr(f, "__isabstractmethod__", False)}
    assert abstract and not (abstract & getattr(type(eng), "__abstractmethods__", set())), abstract
    info = WsyncTrainerInitInfo(rank=0, device="cpu", bucket_bytes=64 << 10, plugin=plugin_for("cpu"),
                                mode="in_place")
    trainer = WeightTransferTrainerFactory.trainer_init(info, client=_EngineClient(eng), source=_Source(hf))
    assert eng.mode() == "in_place"
    for k in range(3):
        sd = models.step(hf, k)
        trainer.send_weights(version=k + 1)
        _check(em, sd, "vllm")
    eng.shutdown()
    trainer.producer.close()


def test_vllm_auto_mode_reloads_on_cpu():
    """auto: vLLM's CPU build repacks linear weights after loading, so updates go through the
    layerwise reload there; the reason names the device."""
    from wsync.integrations.vllm_engine import choose_mode, reload_reason

    hf, sd, em = _setup("vllm")
    assert choose_mode(em, torch.device("cpu"), "auto") == "reload"
    assert "cpu" in reload_reason(em, torch.device("cpu"))
    assert choose_mode(em, torch.device("cpu"), "in_place") == "in_place"


def test_vllm_refuses_a_bad_mode_naming_it():
    pytest.importorskip("vllm.distributed.weight_transfer.base", reason="vLLM's weight-transfer classes")
    from wsync.integrations.vllm_engine import WsyncInitInfo
    from wsync.integrations.vllm_trainer import WsyncTrainerInitInfo

    with pytest.raises(ValueError, match="'inplace'"):
        WsyncInitInfo(mode="inplace")
    with pytest.raises(ValueError, match="tp_size must be a positive integer, got 0"):
        WsyncTrainerInitInfo(rank=0, tp_size=0)


def test_vllm_draft_model_retarget():
    """start_draft_weight_update: vLLM's worker retargets the engine at the draft model
    (set_weight_update_target) for the session; the draft takes the update, the main model
    keeps its weights, and reset_weight_update_target sends the next session to the main one."""
    from wsync.integrations.vllm_trainer import WsyncTrainerInitInfo, WsyncTrainerWeightTransferEngine

    hf, sd, em = _setup("vllm")
    draft = EngineModel(models.engine_layout(sd, "vllm", 0, 1), hf.config)
    eng = _vllm_engine(hf, em)
    info = WsyncTrainerInitInfo(rank=0, device="cpu", bucket_bytes=64 << 10, plugin=plugin_for("cpu"),
                                mode="in_place")
    t = WsyncTrainerWeightTransferEngine.trainer_init(info, client=_EngineClient(eng), source=_Source(hf))
    main_before = {k: p.clone() for k, p in em._p.items()}
    sd = models.step(hf, 5)
    eng.set_weight_update_target(draft, types.SimpleNamespace(hf_config=hf.config))
    t.send_weights()
    eng.reset_weight_update_target()
    _check(draft, sd, "vllm")
    assert all(torch.equal(p, main_before[k]) for k, p in em._p.items())
    sd = models.step(hf, 6)
    t.send_weights()
    _check(em, sd, "vllm")
    eng.shutdown()
    t.producer.close()


def test_vllm_worker_extension():
    from wsync.integrations.vllm import WsyncWorkerExtension

    hf, sd, em = _setup("vllm")
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=em))
    ext = WsyncWorkerExtension.__new__(WsyncWorkerExtension)
    ext.__dict__.update(worker.__dict__)
    assert ext.wsync_init(plugin=plugin_for("cpu")).startswith("cpu ")
    with wsync.Producer("vllm", bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        # the vLLM shim's messages: start_weight_update, update_weights per bucket, finish_weight_update
        prod.sync(sd, lambda m: [ext.wsync_handle(m)])
        _check(em, sd, "vllm")
        em._wsync_worker.release()


def test_sglang_custom_weight_loader():
    from wsync.integrations import sglang as ws

    hf, sd, em = _setup("sglang", "moe")
    with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        # ModelRunner.update_weights_from_tensor(named_tensors, load_format=<custom loader>):
        # custom_loader(self.model, named_tensors)
        ws.worker_for(em, "sglang", plugin=plugin_for("cpu"))
        for k in range(3):
            sd = models.step(hf, k)
            prod.sync(sd, lambda m: (ws.load_weights(em, ws.request_tensors(m)), ['{"ok":true}'])[1])
            _check(em, sd, "sglang")
        em._wsync_worker.release()


class _PostLoadCounter(torch.nn.Module):
    """A module with LMDeploy's post-load hook (process_weights_after_loading, run by LMDeploy
    with the last bucket), counting its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def process_weights_after_loading(self):
        self.calls += 1


def _lmdeploy_send(em, monkeypatch, tp_rank=0, tp=1):
    """LMDeploy 0.18.0's own BaseModelAgent.update_params (installed --no-deps by tests/run.sh)
    on a model agent that holds `em`, the request made by UpdateParamsRequest(**request(msg)).
    Stand-ins, for what needs LMDeploy's GPU start: the agent's attributes that update_params
    reads (patched_model, spec_agent, dist_ctx), and torch.cuda.synchronize, which it calls
    with `finished` (a no-op here: the CPU has no device to wait for)."""
    agent_mod = pytest.importorskip("lmdeploy.pytorch.engine.model_agent.agent",
                                    reason="LMDeploy 0.18.0 is installed --no-deps by tests/run.sh")
    from wsync.integrations import lmdeploy as wl

    agent = agent_mod.BaseModelAgent.__new__(agent_mod.BaseModelAgent)
    agent.patched_model = types.SimpleNamespace(get_model=lambda: em)
    agent.spec_agent = types.SimpleNamespace(is_enabled=lambda: False, get_model=lambda: None)
    agent.dist_ctx = types.SimpleNamespace(tp_group=types.SimpleNamespace(rank=tp_rank),
                                           dist_config=types.SimpleNamespace(tp=tp))
    agent.device_ctx = None
    agent._update_params_ipc_event = agent._update_params_ipc_tensor = None
    wl.worker_for(em, "lmdeploy", plugin=plugin_for("cpu"))  # the CPU plugin, on a GPU machine too
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(agent_mod, "get_device_manager", lambda: types.SimpleNamespace(context=lambda c: _null()))
    monkeypatch.setattr(agent_mod, "get_dist_manager", lambda: types.SimpleNamespace(context=lambda c: _null()))

    def send(m):
        agent.update_params(agent_mod.UpdateParamsRequest(**wl.request(m)))
        return ['{"ok":true}']  # update_params returns nothing: a refusal raises
    send.agent = agent
    return send


def _null():
    import contextlib

    return contextlib.nullcontext()


def test_lmdeploy_update_params_as_it_ships(monkeypatch):
    hf, sd, em = _setup("lmdeploy", "moe")
    em.hook = _PostLoadCounter()
    send = _lmdeploy_send(em, monkeypatch)
    with wsync.Producer("lmdeploy", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        for k in range(3):
            sd = models.step(hf, k)
            prod.sync(sd, send)
            _check(em, sd, "lmdeploy")
        assert em.hook.calls == 3  # LMDeploy's post-processing once per finished weight version
        em._wsync_worker.release()


def test_lmdeploy_request_outside_update_params_is_refused():
    """Unpickled anywhere but inside a model agent's update_params, a request serves nothing."""
    import base64
    import pickle

    from wsync.integrations import lmdeploy as wl

    msg = '{"method":"update_params","serialized_named_tensors":[],"finished":false}'
    data = wl.request(msg)["serialized_named_tensors"]
    with pytest.raises(wsync.WsyncError, match="outside LMDeploy's update_params"):
        pickle.loads(base64.b64decode(data))
    with pytest.raises(wsync.WsyncError, match="finished must be true or false, got 'yes'"):
        wl.request(msg.replace("false", '"yes"'))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmdeploy"])
def test_direct_mode_through_the_integrations(engine, monkeypatch):
    """Producer(direct=True) through each engine's integration entry point: the engine reads
    the trainer's own tensors (no staging), every parameter equal after each of 3 syncs."""
    hf, sd, em = _setup(engine, "moe")
    with wsync.Producer(engine, direct=True, plugin=plugin_for("cpu")) as prod:
        if engine == "vllm":
            from wsync.integrations.vllm import WsyncWorkerExtension

            ext = WsyncWorkerExtension.__new__(WsyncWorkerExtension)
            ext.__dict__.update(types.SimpleNamespace(model_runner=types.SimpleNamespace(model=em)).__dict__)
            ext.wsync_init(plugin=plugin_for("cpu"))
            send = lambda m: [ext.wsync_handle(m)]  # noqa: E731
        elif engine == "sglang":
            from wsync.integrations import sglang as ws

            ws.worker_for(em, "sglang", plugin=plugin_for("cpu"))
            send = lambda m: (ws.load_weights(em, ws.request_tensors(m)), ['{"ok":true}'])[1]  # noqa: E731
        else:
            send = _lmdeploy_send(em, monkeypatch)
        for k in range(3):
            sd = models.step(hf, k)
            prod.sync(sd, send, version=k + 1)
            _check(em, sd, engine)
        em._wsync_worker.release()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmdeploy"])
def test_weight_checker_through_the_integrations(engine):
    """wsync.checker through each engine's entry point: the digests agree after a sync, and one
    flipped byte in an engine parameter is named, the rest still equal."""
    from wsync.checker import check
    from wsync.integrations import lmdeploy as wl
    from wsync.integrations import sglang as ws
    from wsync.integrations.vllm import WsyncWorkerExtension

    hf, sd, em = _setup(engine, "moe")
    if engine == "vllm":
        ext = WsyncWorkerExtension.__new__(WsyncWorkerExtension)
        ext.__dict__.update(model_runner=types.SimpleNamespace(model=em))
        ext.wsync_init(plugin=plugin_for("cpu"))
        send = lambda m: [ext.wsync_handle(m)]  # noqa: E731  (collective_rpc("wsync_handle"))
        ask = send
    else:
        mod = ws if engine == "sglang" else wl
        mod.worker_for(em, engine, plugin=plugin_for("cpu"))
        send = lambda m: [em._wsync_worker.handle(m)]  # noqa: E731
        ask = lambda m: [mod.check_weights(em, m)]  # noqa: E731
    with wsync.Producer(engine, bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(sd, send)
        rep = check(sd, ask, plugin=plugin_for("cpu"))
        assert rep.ok and rep.model == rep.trainer_model, rep.mismatches[:3]
        p = next(p for n, p in em.named_parameters() if "layers.1." in n and p.numel() > 64)
        with torch.no_grad():
            p.view(torch.uint8).view(-1)[7] ^= 0x04
        rep = check(sd, ask, plugin=plugin_for("cpu"))
        assert not rep.ok and len(rep.mismatches) == 1, rep.mismatches
        with torch.no_grad():
            p.view(torch.uint8).view(-1)[7] ^= 0x04
        assert check(sd, ask, plugin=plugin_for("cpu")).ok
        em._wsync_worker.release()


def test_sglang_session_gives_parameters_new_storage():
    """SGLang 0.5.23's begin_weight_update (restore_weights_before_loading) may give a layer new
    storage. Stand-in for that session (SGLang's scheduler and WeightUpdater need a GPU build to
    import: triton, tvm_ffi): one parameter re-made between syncs; the loader serves the new
    storage and the sync lands there."""
    from wsync.integrations import sglang as ws

    hf, sd, em = _setup("sglang")
    send = lambda m: (ws.load_weights(em, ws.request_tensors(m), plugin=plugin_for("cpu")), ['{"ok":true}'])[1]  # noqa: E731
    with wsync.Producer("sglang", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        prod.sync(models.step(hf, 0), send)
        name = next(k for k in em._p if "qkv_proj" in k)
        old = em._p[name]
        em._p[name] = torch.nn.Parameter(torch.zeros_like(old), requires_grad=False)  # the session's new storage
        sd = models.step(hf, 1)
        prod.sync(sd, send)
        _check(em, sd, "sglang")
        em._wsync_worker.release()


class _SGLangEngine:
    """Stand-in for ``sglang.Engine`` (SGLang's scheduler and WeightUpdater need its GPU build to
    import): the calls the README makes, with SGLang 0.5.23's session rule
    (``update_weights_from_tensor`` refused outside ``begin_weight_update`` /
    ``end_weight_update``) and the custom loader called as its WeightUpdater calls it."""

    def __init__(self, model):
        self.model, self.session, self.sessions = model, False, 0

    def begin_weight_update(self):
        assert not self.session, "a weight-update session is already open"
        self.session = True

    def end_weight_update(self):
        assert self.session, "no weight-update session is open"
        self.session, self.sessions = False, self.sessions + 1

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        if not self.session:
            return False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"
        import importlib

        module, func = load_format.rsplit(".", 1)
        getattr(importlib.import_module(module), func)(self.model, named_tensors)
        return True, "Success"


def test_sglang_readme_snippet():
    """The README's SGLang block, run as written but for this machine: tp_size 1 and the CPU
    (the stand-in engine is one rank in this process)."""
    from readme import snippet

    code = snippet("sglang").replace("tp_size=2", "tp_size=1").replace('device="cuda"', 'device="cpu"')
    hf, sd, em = _setup("sglang")
    engine = _SGLangEngine(em)
    ns = {"engine": engine, "model": hf, "step": 0}
    for k in range(2):
        sd = models.step(hf, k)
        ns["step"] = k
        exec(code, ns)
        _check(em, sd, "sglang")
    assert engine.sessions == 2
    em._wsync_worker.release()
    ns["producer"].close()


def test_lmdeploy_readme_snippet(monkeypatch):
    """The README's LMDeploy block, run as written but for this machine (tp_size 1, the CPU),
    with `engine` a stand-in whose update_params is the model agent's own (an LMDeploy engine
    hands the request to every worker's agent)."""
    from readme import snippet

    code = snippet("lmdeploy").replace("tp_size=2", "tp_size=1").replace('device="cuda"', 'device="cpu"')
    hf, sd, em = _setup("lmdeploy")
    agent = _lmdeploy_send(em, monkeypatch).agent
    ns = {"engine": types.SimpleNamespace(update_params=agent.update_params), "model": hf}
    for k in range(2):
        sd = models.step(hf, k)
        exec(code, ns)
        _check(em, sd, "lmdeploy")
        em._wsync_worker.release()
        ns["producer"].close()
