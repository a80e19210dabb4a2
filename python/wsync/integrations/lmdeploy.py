"""LMDeploy: its ``update_params`` request, as LMDeploy 0.18.0 ships it.

As read in LMDeploy 0.18.0 (``lmdeploy/pytorch/engine/model_agent/agent.py``,
``BaseModelAgent.update_params``; ``lmdeploy/serve/openai/protocol.py``, ``UpdateParamsRequest``:
``serialized_named_tensors``, ``load_format``, ``finished``): every worker base64-decodes
``serialized_named_tensors`` (its own entry of a per-rank list) and unpickles it with
``ForkingPickler``, loads the tensors it finds through the model's ``load_weights``, and with
``finished`` runs ``process_weights_after_loading`` on the model. There is no custom-loader hook;
unpickling is how a request runs code in the worker, as LMDeploy's own IPC handles do (an
unpickled handle calls ``rebuild_cuda_tensor``).

So :func:`request` pickles a wsync request (the C LMDeploy shim's ``update_params`` message) as
an object whose unpickling calls :func:`serve_in_worker`: in each worker, inside
``update_params``, it serves the request into that worker's model (the caller's
``patched_model.get_model()``, at its ``dist_ctx.tp_group`` rank), in place, and stands for no
tensor, so LMDeploy's loader has nothing to load. With the last bucket (``finished``) LMDeploy runs
its own post-processing. No weight bytes travel in the request, and nothing of LMDeploy is
patched. :func:`check_weights` answers a ``wsync.checker`` request on an engine's own model.
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..errors import InvalidArgument
from . import worker_for


class _Request:
    """A wsync request inside an UpdateParamsRequest: unpickled, it is served (serve_in_worker)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        return (serve_in_worker, (self.message,))


def request(message: str) -> Dict[str, Any]:
    """Trainer side: the UpdateParamsRequest fields carrying one wsync message to every worker
    (``engine.update_params(UpdateParamsRequest(**request(msg)))``)."""
    m = json.loads(message)
    if not isinstance(m, dict) or not isinstance(m.get("method"), str):
        raise InvalidArgument(1, "request", f"not a wsync request (no method): {message[:80]!r}")
    finished = m.get("finished", False)
    if not isinstance(finished, bool):
        raise InvalidArgument(1, "request", f"finished must be true or false, got {finished!r}")
    data = base64.b64encode(pickle.dumps(_Request(message))).decode()
    return {"serialized_named_tensors": data, "load_format": None, "finished": finished}


def serve_in_worker(message: str, *, plugin: Optional[str] = None) -> List[Any]:
    """Runs in an LMDeploy worker while ``update_params`` unpickles a :func:`request`: serves
    the message into the model of the model agent that called, and returns no tensor."""
    agent = _calling_agent()
    dist = agent.dist_ctx
    tp_rank = int(getattr(dist.tp_group, "rank", 0))
    tp_size = int(getattr(getattr(dist, "dist_config", None), "tp", 1) or 1)
    update_params(agent.patched_model.get_model(), message, tp_rank=tp_rank, tp_size=tp_size, plugin=plugin)
    return []


def _calling_agent() -> Any:
    """The LMDeploy model agent whose ``update_params`` is unpickling this request."""
    f = sys._getframe(1)
    while f is not None:
        agent = f.f_locals.get("self")
        if hasattr(agent, "patched_model") and hasattr(agent, "dist_ctx"):
            return agent
        f = f.f_back
    raise InvalidArgument(1, "serve_in_worker", "a wsync request was unpickled outside LMDeploy's "
                          "update_params (no model agent calls it)")


def update_params(model: torch.nn.Module, message: str, *, tp_rank: int = 0, tp_size: int = 1,
                  plugin: Optional[str] = None, post_load: Optional[Callable[[], None]] = None) -> str:
    """Serve one wsync LMDeploy-shim message into `model` (an engine's own agent); returns the
    reply JSON; raises the request's WsyncError when it is refused."""
    if not isinstance(message, str):
        raise InvalidArgument(1, "update_params", f"the wsync request text, got {type(message).__name__}")
    w = worker_for(model, "lmdeploy", tp_rank=tp_rank, tp_size=tp_size, plugin=plugin, on_post_load=post_load)
    return json.dumps(w.apply(message))  # the shim drains on finished


def check_weights(model: torch.nn.Module, message: str, *, tp_rank: int = 0, tp_size: int = 1,
                  plugin: Optional[str] = None) -> str:
    """Serve one ``wsync.checker`` request on this rank: the reply JSON with the digests of where
    each named HF tensor lives in `model`."""
    return worker_for(model, "lmdeploy", tp_rank=tp_rank, tp_size=tp_size, plugin=plugin).handle(message)
