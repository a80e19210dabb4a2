"""SGLang: ``load_weights`` is a ``custom_weight_loader``.

As read in SGLang 0.5.23 (``sglang/srt/model_executor/model_runner_components/weight_updater.py``
and ``sglang/srt/managers/scheduler_components/weight_updater.py``): with
``--custom-weight-loader wsync.integrations.sglang.load_weights``, a call of
``update_weights_from_tensor(named_tensors, load_format="wsync.integrations.sglang.load_weights")``
reaches ``dynamic_import(load_format)(model, named_tensors)`` on every TP rank, with the tensors
moved to its device. The scheduler refuses it outside a weight-update session: the trainer calls
``begin_weight_update()`` (SGLang restores every layer's weights to their loading format) before
the sync and ``end_weight_update()`` (SGLang's post-processing: repacking, quantization) after it.
The trainer puts one wsync request (the C SGLang shim's ``update_weights_from_tensor`` message,
one FlattenedTensorBucket per rank naming the trainer's staging buffer) into a single uint8
tensor named :data:`REQUEST_NAME` (:func:`request_tensors`); no weight bytes travel through
SGLang's serializer. Since ``begin_weight_update`` may give a layer new storage, the loader
checks that every parameter it serves still lives where it did, and serves the new ones if not.

:func:`check_weights` is wsync's counterpart of SGLang's own weight checker
(``Engine.check_weights`` / ``WeightChecker``, which snapshots and compares on the engine alone):
it answers a ``wsync.checker`` request with this rank's digests, for the trainer to compare with
its own tensors.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ..engine import EngineWorker
from ..errors import InvalidArgument
from . import _WORKER_ATTR, worker_for

REQUEST_NAME = "wsync.request"
LOAD_FORMAT = "wsync.integrations.sglang.load_weights"


def request_tensors(message: str) -> List[Tuple[str, torch.Tensor]]:
    """Trainer side: `named_tensors` for ``update_weights_from_tensor`` carrying one message."""
    data = bytearray(message.encode())
    return [(REQUEST_NAME, torch.frombuffer(data, dtype=torch.uint8).clone())]


def load_weights(model: torch.nn.Module, named_tensors: Sequence[Tuple[str, torch.Tensor]],
                 *, plugin: Optional[str] = None) -> None:
    """SGLang's custom loader: serve the wsync request in `named_tensors` into `model`'s own
    parameters (in place); raises the request's WsyncError when it is refused."""
    reqs = [t for n, t in named_tensors if n == REQUEST_NAME]
    if len(reqs) != 1 or len(named_tensors) != 1:
        names = [n for n, _ in named_tensors][:3]
        raise InvalidArgument(1, "load_weights", f"expected one tensor named {REQUEST_NAME}, got {names}")
    msg = bytes(reqs[0].cpu().numpy().tobytes()).decode()
    rank, size = _tp()
    w = worker_for(model, "sglang", tp_rank=rank, tp_size=size, plugin=plugin)
    if moved(w, model):  # the session gave parameters new storage: serve the model as it is now
        w.release()
        w.close()
        object.__delattr__(model, _WORKER_ATTR)
        w = worker_for(model, "sglang", tp_rank=rank, tp_size=size, plugin=plugin)
    # Non-blocking: the weights come from the trainer's staging buffer, whose reuse waits for
    # *consumed* (recorded after the copies), and the request's flush_cache drains at the end.
    w.apply(msg)


def moved(w: EngineWorker, model: torch.nn.Module) -> bool:
    """Does any parameter of `model` that `w` serves live elsewhere (or have another shape or
    dtype) than when `w` was made?"""
    now = dict(model.named_parameters())
    return any(n not in now or now[n].data_ptr() != t.data_ptr() or now[n].shape != t.shape
               or now[n].dtype != t.dtype for n, t in w.params.items())


def check_weights(model: torch.nn.Module, message: str, *, plugin: Optional[str] = None) -> str:
    """Serve one ``wsync.checker`` request (``{"method": "wsync_check", ...}``) on this rank:
    the reply JSON with the digests of where each named HF tensor lives in `model`."""
    rank, size = _tp()
    return worker_for(model, "sglang", tp_rank=rank, tp_size=size, plugin=plugin).handle(message)


def _tp() -> Tuple[int, int]:
    try:
        from sglang.srt.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:
        return 0, 1
