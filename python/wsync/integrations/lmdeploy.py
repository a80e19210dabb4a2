"""LMDeploy: its ``update_params`` request.

LMDeploy's ``UpdateParamsRequest`` (lmdeploy/serve/openai/protocol.py as read:
``serialized_named_tensors: Union[str, List[str], Dict]``, ``finished: bool = False``) reaches every
worker's model agent. :func:`update_params` serves a wsync request carried in it: the C LMDeploy
shim's ``update_params`` message (flattened buckets of a persistent staging buffer, *consumed* on
the copy stream, the post-load hook on ``finished``), as JSON text in
``serialized_named_tensors``. :func:`check_weights` answers a ``wsync.checker`` request.

A stock LMDeploy never calls this: as read in LMDeploy 0.18.0
(``lmdeploy/pytorch/engine/model_agent/agent.py``), ``BaseModelAgent.update_params`` always
base64-decodes and unpickles ``serialized_named_tensors`` and loads the tensors it finds through
the model's own loader; it has no custom-loader hook. An LMDeploy build whose model agent passes
wsync's requests here serves them.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Optional

import torch

from ..errors import InvalidArgument
from . import worker_for


def request(message: str) -> Dict[str, Any]:
    """Trainer side: the UpdateParamsRequest fields carrying one wsync message."""
    m = json.loads(message)
    return {"serialized_named_tensors": message, "finished": bool(m.get("finished", False))}


def update_params(model: torch.nn.Module, req: Any, *, tp_rank: int = 0, tp_size: int = 1,
                  plugin: Optional[str] = None, post_load: Optional[Callable[[], None]] = None) -> str:
    """Serve one UpdateParamsRequest (an object with the fields, or a dict) into `model`;
    returns the reply JSON; raises the request's WsyncError when it is refused."""
    get = req.get if isinstance(req, dict) else (lambda k, d=None: getattr(req, k, d))
    text = get("serialized_named_tensors")
    if not isinstance(text, str):
        raise InvalidArgument(1, "update_params", "serialized_named_tensors must be the wsync request text")
    w = worker_for(model, "lmdeploy", tp_rank=tp_rank, tp_size=tp_size, plugin=plugin, on_post_load=post_load)
    return json.dumps(w.apply(text))  # the shim drains and runs the post-load hook on finished


def check_weights(model: torch.nn.Module, message: str, *, tp_rank: int = 0, tp_size: int = 1,
                  plugin: Optional[str] = None) -> str:
    """Serve one ``wsync.checker`` request on this rank: the reply JSON with the digests of where
    each named HF tensor lives in `model`."""
    return worker_for(model, "lmdeploy", tp_rank=tp_rank, tp_size=tp_size, plugin=plugin).handle(message)
