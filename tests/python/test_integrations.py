"""The engine integrations, driven as each engine drives them. vLLM, SGLang and LMDeploy are not
installable beside CPU torch here, so each engine is a stand-in that mirrors the classes and
calls the integration uses (named in each test); the model is a torch module holding the fused
engine layout, the trainer a transformers Qwen3 through wsync.Producer."""

from __future__ import annotations

import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

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


def _fake_vllm():
    """Stand-in for vllm.distributed.weight_transfer.{base,factory} as read in vLLM main
    (commit 02f250b): the engine base class and the lazy factory registry."""

    TI, TU = TypeVar("TI"), TypeVar("TU")

    class WeightTransferEngine(ABC, Generic[TI, TU]):
        def __init__(self, config, vllm_config, device, model):
            self.config, self.vllm_config, self.device, self.model = config, vllm_config, device, model
            self.model_config = getattr(vllm_config, "model_config", None)

        def parse_init_info(self, d):
            return self.init_info_cls(**d)

        def parse_update_info(self, d):
            return self.update_info_cls(**d)

        def update_weights(self, update_info):
            self.receive_weights(self.parse_update_info(update_info))

        @abstractmethod
        def receive_weights(self, info): ...

    @dataclass
    class WeightTransferInitInfo:
        pass

    @dataclass
    class WeightTransferUpdateInfo:
        pass

    class WeightTransferEngineFactory:
        _registry: dict = {}

        @classmethod
        def register_engine(cls, name, module_path, class_name=None):
            import importlib

            cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)

        @classmethod
        def create_engine(cls, config, vllm_config, device, model):
            return cls._registry[config.backend]()(config, vllm_config, device, model)

    base = types.ModuleType("vllm.distributed.weight_transfer.base")
    base.WeightTransferEngine = WeightTransferEngine
    base.WeightTransferInitInfo = WeightTransferInitInfo
    base.WeightTransferUpdateInfo = WeightTransferUpdateInfo
    factory = types.ModuleType("vllm.distributed.weight_transfer.factory")
    factory.WeightTransferEngineFactory = WeightTransferEngineFactory
    for name in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[base.__name__] = base
    sys.modules[factory.__name__] = factory
    return WeightTransferEngineFactory


def _vllm_factory():
    """vLLM's own factory when vLLM imports here (the test command installs vllm==0.33.0 with
    --no-deps beside CPU torch when it can), else the stand-in."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

        print("vllm: testing against vLLM's own WeightTransferEngineFactory")
        return WeightTransferEngineFactory
    except ImportError as e:
        print(f"vllm: not importable here ({e}); testing against the stand-in")
        return _fake_vllm()


def test_vllm_weight_transfer_backend():
    factory = _vllm_factory()
    from wsync.integrations import vllm as wv

    try:  # vLLM's own plugin loader runs the package's vllm.general_plugins entry point
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    except ImportError:
        wv.register()  # what that entry point runs
    assert "wsync" in factory._registry
    hf, sd, em = _setup("vllm", "moe")
    try:  # --weight-transfer-config '{"backend": "wsync"}'
        from vllm.config.weight_transfer import WeightTransferConfig

        cfg = WeightTransferConfig(backend="wsync")
    except ImportError:
        cfg = types.SimpleNamespace(backend="wsync")
    vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf.config),
                                        parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
    eng = factory.create_engine(cfg, vllm_config, torch.device("cpu"), em)
    eng.init_transfer_engine(eng.parse_init_info({"plugin": plugin_for("cpu")}))
    with wsync.Producer("vllm", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        for k in range(3):
            sd = models.step(hf, k)
            eng.trainer_send_weights(hf.state_dict().items(), {"producer": prod, "update_weights": eng.update_weights,
                                                              "start": eng.start_weight_update,
                                                              "finish": eng.finish_weight_update})
            _check(em, {n: t for n, t in sd.items()}, "vllm")
        eng.shutdown()


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


def test_lmdeploy_update_params():
    from wsync.integrations import lmdeploy as wl

    hf, sd, em = _setup("lmdeploy", "moe")
    loaded = []
    with wsync.Producer("lmdeploy", bucket_bytes=64 << 10, plugin=plugin_for("cpu")) as prod:
        wl.worker_for(em, "lmdeploy", plugin=plugin_for("cpu"), on_post_load=lambda: loaded.append(1))
        for k in range(3):
            sd = models.step(hf, k)
            prod.sync(sd, lambda m: [wl.update_params(em, wl.request(m))])  # UpdateParamsRequest fields
            _check(em, sd, "lmdeploy")
        assert len(loaded) == 3  # the post-load hook once per finished weight version
        em._wsync_worker.release()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmdeploy"])
def test_direct_mode_through_the_integrations(engine):
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
            from wsync.integrations import lmdeploy as wl

            wl.worker_for(em, "lmdeploy", plugin=plugin_for("cpu"))
            send = lambda m: [wl.update_params(em, wl.request(m))]  # noqa: E731
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
