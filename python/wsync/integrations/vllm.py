"""vLLM: the weight-transfer backend ``wsync``.

Mirrors vLLM's weight-transfer protocol as read in vLLM main (commit 02f250b,
``vllm/distributed/weight_transfer/base.py`` and ``factory.py``): an engine class with
``init_transfer_engine`` / ``start_weight_update`` / ``update_weights`` (-> ``receive_weights``) /
``finish_weight_update`` / ``shutdown`` and the static ``trainer_send_weights``, registered with
``WeightTransferEngineFactory.register_engine(name, module_path, class_name)``; the config's
``backend`` accepts any registered name. ``register`` is the ``vllm.general_plugins`` entry point
(pyproject.toml), so ``--weight-transfer-config '{"backend": "wsync"}'`` selects it.

update_info is what the C vLLM shim's ``update_weights`` carries: ``names``, ``dtype_names``,
``shapes`` (vLLM's own fields) plus ``generation``, ``packed`` and ``packed_buffers`` /
``offsets`` (packed buckets of a wsync staging buffer) or ``ipc_handles`` (per tensor).

For vLLM versions without the registry: ``--worker-extension-cls
wsync.integrations.vllm.WsyncWorkerExtension`` and ``collective_rpc("wsync_handle", args=(msg,))``.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import worker_for

BACKEND = "wsync"
ENGINE_MODULE = "wsync.integrations.vllm_engine"
ENGINE_CLASS = "WsyncWeightTransferEngine"


def register() -> None:
    """vLLM plugin entry point: register the ``wsync`` weight-transfer backend (lazily: the engine
    class is imported only when vLLM creates it). A vLLM without the registry is left alone."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    if BACKEND not in getattr(WeightTransferEngineFactory, "_registry", {}):
        WeightTransferEngineFactory.register_engine(BACKEND, ENGINE_MODULE, ENGINE_CLASS)


def message(method: str, **fields: Any) -> str:
    return json.dumps({"method": method, **fields}, separators=(",", ":"))


def send_weights(
    producer: Any,
    weights: Iterator[Tuple[str, torch.Tensor]],
    update_weights: Callable[[Dict[str, Any]], Any],
    *,
    start: Optional[Callable[[], Any]] = None,
    finish: Optional[Callable[[], Any]] = None,
) -> int:
    """Trainer side: push `weights` through `producer` (a wsync.Producer for engine "vllm") and
    call vLLM's control plane for each bucket: ``update_weights(update_info)`` (e.g.
    ``lambda info: llm.update_weights(dict(update_info=info))``), with ``start`` /
    ``finish`` around them. Returns the number of buckets."""
    def deliver(msg: str) -> List[str]:
        # the shim's start/finish messages go through vLLM's own start/finish calls instead
        req = json.loads(msg)
        if req.get("method") == "update_weights":
            update_weights(req["update_info"])
        return ['{"ok":true}']

    if start is not None:
        start()
    n = producer.sync(weights, deliver)
    if finish is not None:
        finish()
    return n


class WsyncWorkerExtension:
    """``--worker-extension-cls wsync.integrations.vllm.WsyncWorkerExtension``: methods on every
    vLLM worker, called with ``collective_rpc``. The worker's ``model_runner.model`` is served."""

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
        rank, size = _tp()
        return worker_for(model, "vllm", config=model.config, tp_rank=rank, tp_size=size, plugin=plugin, verify=verify)


def _tp() -> Sequence[int]:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:
        return 0, 1
