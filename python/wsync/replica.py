"""Replicas that serve replicas (docs/DESIGN.md, "Beyond one host"): one engine rank's parameters,
as they are, pulled over NIXL into the same rank of another replica of the same engine, TP size
and layout. A replica that joins mid-training takes the committed version from a replica that
holds it, and the trainer is not involved; in a fan-out (``wsync plan --fanout``) the replicas
fed by the trainer serve the next ones the same way.

The serving rank names its parameters in place (a direct, nixl Producer over them, under their
engine names); the joining rank takes each one whole into its parameter of the same name (an
:class:`EngineWorker` with ``mapping="checkpoint"``). Every rule of a sync holds: the joiner
checks every name, dtype, shape and extent before a byte is written, and with ``version`` the
push is one update transaction, committed only when every parameter arrived. The server must not
write its parameters until the push returns (its engine serves requests meanwhile: reading is
fine)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from .engine import EngineWorker
from .producer import Producer, Send


def serve(params: Mapping[str, torch.Tensor], send: Send, *, engine: str, version: Optional[int] = None,
          plugin: Optional[str] = None, bucket_bytes: int = 1 << 30, timeout_ms: int = 0) -> int:
    """Push this rank's `params` (engine names) through `send` (to the joining replica's rank of
    the same index) and wait until it consumed them. Returns the number of buckets."""
    with Producer(engine, direct=True, transport="nixl", plugin=plugin, bucket_bytes=bucket_bytes,
                  timeout_ms=timeout_ms) as prod:
        return prod.sync(dict(params), send, version=version)


def sink(params: Mapping[str, torch.Tensor], *, engine: str, config: Any, plugin: Optional[str] = None,
         **worker_kw: Any) -> EngineWorker:
    """The joining rank's side: a worker that fills `params` (engine names, the server's shapes
    and dtypes) whole from :func:`serve`'s requests (``worker.handle(msg)``)."""
    devices = {t.device for t in params.values()}
    if len(devices) != 1:
        raise ValueError(f"sink: parameters on {len(devices)} devices; give one rank's")
    w = EngineWorker({}, engine=engine, config=config, mapping="checkpoint", device=devices.pop(), plugin=plugin,
                     **worker_kw)
    w.params = dict(params)
    return w
