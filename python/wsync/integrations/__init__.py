"""Registration of wsync in the real engines by a config flag, no fork:

- vLLM: the weight-transfer backend ``wsync`` (``--weight-transfer-config '{"backend": "wsync"}'``),
  registered through vLLM's ``vllm.general_plugins`` entry point (:mod:`wsync.integrations.vllm`),
  and a worker extension for ``--worker-extension-cls`` where that registry is missing;
- SGLang: a ``custom_weight_loader`` (:mod:`wsync.integrations.sglang`);
- LMDeploy: its ``update_params`` request (:mod:`wsync.integrations.lmdeploy`).

Each one only hands the engine's model to an :class:`wsync.EngineWorker`; the messages are the C
shims' (``engine-shims/``), produced on the trainer side by :class:`wsync.Producer`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..engine import EngineWorker

_WORKER_ATTR = "_wsync_worker"


def worker_for(
    model: torch.nn.Module,
    engine: str,
    *,
    config: Any = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    plugin: Optional[str] = None,
    verify: bool = False,
    on_post_load: Optional[Callable[[], None]] = None,
) -> EngineWorker:
    """The EngineWorker serving `model` (made on first use and kept on the model: the mapping
    cache and the parameter table live as long as the model)."""
    w = getattr(model, _WORKER_ATTR, None)
    if w is None:
        cfg = config if config is not None else getattr(model, "config", None)
        w = EngineWorker(
            model, engine=engine, config=cfg, tp_rank=tp_rank, tp_size=tp_size, plugin=plugin, verify=verify,
            on_post_load=on_post_load,
        )
        object.__setattr__(model, _WORKER_ATTR, w)
    return w
