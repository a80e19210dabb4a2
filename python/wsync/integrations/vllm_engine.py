"""The ``wsync`` weight-transfer engine class for vLLM (imported by vLLM's factory when the
backend is selected; see :mod:`wsync.integrations.vllm`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from . import worker_for
from .vllm import _tp, message, send_weights


@dataclass
class WsyncInitInfo(WeightTransferInitInfo):
    plugin: Optional[str] = None
    verify: bool = False


@dataclass
class WsyncUpdateInfo(WeightTransferUpdateInfo):
    names: List[str]
    dtype_names: List[str]
    shapes: List[List[int]]
    generation: int = 0
    packed: bool = True
    packed_buffers: Optional[List[Dict[str, Any]]] = None
    offsets: Optional[List[int]] = None
    ipc_handles: Optional[List[Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict)


class WsyncWeightTransferEngine(WeightTransferEngine[WsyncInitInfo, WsyncUpdateInfo]):
    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo

    def init_transfer_engine(self, init_info: WsyncInitInfo) -> None:
        rank, size = _tp()
        cfg = getattr(getattr(self, "model_config", None), "hf_config", None) or getattr(self.model, "config", None)
        self._worker = worker_for(self.model, "vllm", config=cfg, tp_rank=rank, tp_size=size,
                                  plugin=init_info.plugin, verify=init_info.verify)

    def start_weight_update(self) -> None:
        self._worker.apply(message("start_weight_update", is_checkpoint_format=True))

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        """vLLM's base class ends an update with a device-wide synchronize; wsync's copies are
        ordered on the engine's stream and *consumed* follows them, so a drain of that stream is
        all the next step needs (and the trainer's wait_consumed covers the buffer's reuse)."""
        self.receive_weights(self.parse_update_info(update_info))
        self._worker.drain()

    def receive_weights(self, update_info: WsyncUpdateInfo, *_: Any) -> None:
        info = {k: v for k, v in asdict(update_info).items() if v is not None and k != "extra"}
        self._worker.apply(message("update_weights", update_info=info))

    def finish_weight_update(self) -> None:
        self._worker.apply(message("finish_weight_update"))

    def shutdown(self) -> None:
        w = getattr(self, "_worker", None)
        if w is not None:
            w.release()

    @staticmethod
    def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
        """trainer_args: {"producer": wsync.Producer("vllm", ...), "update_weights": callable
        taking the update_info dict, "start" / "finish": optional callables}."""
        args = dict(trainer_args)
        send_weights(args["producer"], iterator, args["update_weights"], start=args.get("start"),
                     finish=args.get("finish"))
