"""SGLang: ``load_weights`` is a ``custom_weight_loader``.

As read in SGLang main (``ModelRunner.update_weights_from_tensor``): with
``--custom-weight-loader wsync.integrations.sglang.load_weights`` and
``update_weights_from_tensor(named_tensors, load_format="wsync.integrations.sglang.load_weights")``
SGLang calls ``load_weights(model, named_tensors)`` on every TP rank with the tensors moved to
its device. The trainer puts one wsync request (the C SGLang shim's
``update_weights_from_tensor`` message, one FlattenedTensorBucket per rank naming the trainer's
staging buffer) into a single uint8 tensor named :data:`REQUEST_NAME` (:func:`request_tensors`);
no weight bytes travel through SGLang's serializer.

:func:`check_weights` is wsync's counterpart of SGLang's own weight checker
(``Engine.check_weights`` / ``WeightChecker``, which snapshots and compares on the engine alone):
it answers a ``wsync.checker`` request with this rank's digests, for the trainer to compare with
its own tensors.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ..errors import InvalidArgument
from . import worker_for

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
    # Non-blocking: the weights come from the trainer's staging buffer, whose reuse waits for
    # *consumed* (recorded after the copies), and the request's flush_cache drains at the end.
    w.apply(msg)


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
