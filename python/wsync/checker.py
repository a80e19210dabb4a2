"""The whole-model weight checker (docs/PYTHON.md): every engine rank digests, with the plugin on
its own device, the bytes each HF tensor occupies in it (wsync64, as a copy's digests are), and
says which region of the HF tensor those bytes are (the C mapping's plan: one implementation for
copies and checks); the trainer digests the same region of its own tensor with the same plugin
and compares. A single flipped byte on either side names the tensor and the rank."""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from . import _abi, _native, _torch, messages
from .checkpoint import checkpoint_tensors
from .errors import InvalidArgument, NotSupported
from .producer import _resolve, check_replies


@dataclass
class CheckReport:
    """``ok`` when every engine rank holds exactly the trainer's bytes. ``mismatches``:
    (rank, HF name, engine digest, trainer digest). ``model`` / ``trainer_model``: one wsync64
    over every (rank, name, digest) line of the engines' digests and of the trainer's: equal
    when ok. ``unfed``: (rank, engine parameter) that no tensor of any sync has fed (they hold
    what the engine loaded at start: a tied ``lm_head`` kept apart, a parameter the mapping does
    not know); not ok when any."""

    ok: bool
    tensors: int
    ranks: int
    mismatches: List[tuple] = field(default_factory=list)
    unfed: List[tuple] = field(default_factory=list)
    model: str = ""
    trainer_model: str = ""


class _Digester:
    """A consumer of `plugin` on `device`, used only for digest_regions."""

    def __init__(self, plugin: _native.LoadedPlugin, device: torch.device) -> None:
        self.ops = plugin.consumer
        if not self.ops.digest_regions:
            raise NotSupported(4, "check", f"{plugin.path} has no digest_regions (a plugin older than 0.1.2)")
        cfg = _abi.ConsumerConfig(struct_size=C.sizeof(_abi.ConsumerConfig),
                                  device_ordinal=(device.index or 0) if device.type == "cuda" else 0)
        c = C.c_void_p()
        err = _abi.Error.new()
        _native.check(self.ops.create(C.byref(cfg), C.byref(c), C.byref(err)), err)
        self.c = c.value
        self.device = device

    def digests(self, regions: List[_abi.CopyOp], stream: Optional[Any]) -> List[int]:
        arr = (_abi.CopyOp * max(len(regions), 1))(*regions)
        out = (C.c_uint64 * max(len(regions), 1))()
        err = _abi.Error.new()
        sh = _torch.stream_handle(self.device, stream)
        _native.check(self.ops.digest_regions(self.c, sh, arr, len(regions), out, C.byref(err)), err)
        return list(out[: len(regions)])

    def close(self) -> None:
        if self.c is not None:
            self.ops.finalize(self.c, None)
            self.c = None


def check_message(pairs: List[tuple]) -> str:
    """The request asking every engine rank for its digests of these HF tensors."""
    return messages.check([(n, _torch.dtype_name(t.dtype), list(t.shape)) for n, t in pairs])


def check(named: _torch.NamedTensors, send: Any, *, plugin: Optional[str] = None,
          stream: Optional[Any] = None) -> CheckReport:
    """Compare every engine rank's weights with the trainer's tensors `named` (HF names), through
    ``send`` (as for Producer.sync: one request to every rank, their replies)."""
    pairs = list(checkpoint_tensors(named))
    if not pairs:
        raise InvalidArgument(1, "check", "no tensors to check")
    by = dict(pairs)
    replies = check_replies(_resolve(send(check_message(pairs))))
    dev = pairs[0][1].device
    lp = _native.load_plugin(plugin if plugin is not None else None)
    dg = _Digester(lp, dev)
    try:
        mismatches, rows, mine_rows = [], [], []
        unfed = [(rank, name) for rank, rep in enumerate(replies) for name in rep.get("unfed", [])]
        for rank, rep in enumerate(replies):
            entries = rep["check"]
            regions = []
            for e in entries:
                t = by[e["name"]].detach()
                if not t.is_contiguous():
                    t = t.contiguous()
                    by[e["name"]] = t
                regions.append(_abi.CopyOp(dst=(t.data_ptr() + int(e["offset"])) or None,
                                           dst_pitch=int(e["pitch"]), rows=int(e["rows"]),
                                           row_bytes=int(e["row_bytes"])))
            mine = dg.digests(regions, stream)
            for e, d in zip(entries, mine):
                want = f"wsync64:{d:016x}"
                rows.append(f"{rank} {e['name']} {e['digest']}")
                mine_rows.append(f"{rank} {e['name']} {want}")
                if e["digest"] != want:
                    mismatches.append((rank, e["name"], e["digest"], want))
        model, trainer_model = (_lines_digest(dg, r, dev, stream) for r in (rows, mine_rows))
        return CheckReport(ok=not mismatches and not unfed, tensors=len(pairs), ranks=len(replies),
                           mismatches=mismatches, unfed=unfed, model=model, trainer_model=trainer_model)
    finally:
        dg.close()


def _lines_digest(dg: _Digester, lines: List[str], dev: torch.device, stream: Optional[Any]) -> str:
    """wsync64 of the lines' text, by the plugin (on the tensors' device)."""
    text = "\n".join(lines).encode()
    buf = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(dev)
    (d,) = dg.digests([_abi.CopyOp(dst=buf.data_ptr(), dst_pitch=len(text), rows=1, row_bytes=len(text))], stream)
    return f"wsync64:{d:016x}"


def engine_digests(reply: Dict[str, Any]) -> Dict[str, str]:
    """{HF name: digest} of one rank's wsync_check reply."""
    return {e["name"]: e["digest"] for e in reply["check"]}
