"""LoRA slots of a Python engine: the adapter buffers the C plugin hot-loads into (two copies of
every target's A [max_rank, in] and B [out, max_rank], the engine's ``*active`` switch), as
``abi/wsync_abi_v1.h`` defines them. The engine describes its LoRA modules (engine names;
packed modules list their HF parts); loading, validation against the slot, dtype conversion,
rank padding and the shadow-then-switch upsert are the plugin's and the shims'.
"""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import _abi, _torch


@dataclass
class LoraTarget:
    """One engine LoRA module: `module` (engine name, e.g. "model.layers.0.self_attn.qkv_proj"),
    its in/out features, and for a packed module its HF parts (suffix, out_offset, out_features)."""

    module: str
    in_features: int
    out_features: int
    parts: Sequence[Tuple[str, int, int]] = field(default_factory=tuple)


class LoraSlots:
    """`n_slots` adapter slots over `targets`, buffers of `dtype` on `device` (engine memory)."""

    def __init__(
        self,
        targets: Sequence[LoraTarget],
        *,
        max_rank: int = 64,
        n_slots: int = 2,
        dtype: torch.dtype = torch.bfloat16,
        device: str = "cpu",
        on_reset_prefix_cache: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.targets = list(targets)
        self.max_rank = max_rank
        self.names: List[str] = [""] * n_slots
        self.on_reset = on_reset_prefix_cache
        key = _torch.dtype_name(dtype)
        self.a: List[List[torch.Tensor]] = []
        self.b: List[List[torch.Tensor]] = []
        self._slots = []
        self._keep: list = []
        for _ in range(n_slots):
            arr = (_abi.AdapterTarget * len(self.targets))()
            a_s, b_s = [], []
            for i, t in enumerate(self.targets):
                a = torch.zeros((2, max_rank, t.in_features), dtype=dtype, device=device)
                b = torch.zeros((2, t.out_features, max_rank), dtype=dtype, device=device)
                a_s.append(a)
                b_s.append(b)
                parts = (_abi.AdapterPart * max(len(t.parts), 1))()
                for k, (suffix, off, n) in enumerate(t.parts):
                    parts[k] = _abi.AdapterPart(suffix.encode(), off, n)
                self._keep += [parts, t.module.encode()]
                arr[i] = _abi.AdapterTarget(
                    struct_size=C.sizeof(_abi.AdapterTarget),
                    module=self._keep[-1],
                    dtype=_abi.DTYPES[key],
                    in_features=t.in_features,
                    out_features=t.out_features,
                    n_parts=len(t.parts),
                    parts=C.cast(parts, C.POINTER(_abi.AdapterPart)) if t.parts else None,
                )
                arr[i].lora_a[0], arr[i].lora_a[1] = a[0].data_ptr(), a[1].data_ptr()
                arr[i].lora_b[0], arr[i].lora_b[1] = b[0].data_ptr(), b[1].data_ptr()
            active = C.c_int(0)
            name_buf = C.create_string_buffer(256)
            slot = _abi.AdapterSlot(
                struct_size=C.sizeof(_abi.AdapterSlot),
                adapter_name=C.cast(name_buf, C.c_char_p),
                max_rank=max_rank,
                n_targets=len(self.targets),
                targets=C.cast(arr, C.POINTER(_abi.AdapterTarget)),
                active=C.pointer(active),
            )
            self._keep += [arr, active, name_buf]
            self._slots.append((slot, active, arr))
            self.a.append(a_s)
            self.b.append(b_s)

    # registry callbacks (wsync_registry.h)
    def _slot(self, _u: int, name: bytes, assign: int) -> Optional[int]:
        n = name.decode()
        for i, have in enumerate(self.names):
            if have == n:
                return C.addressof(self._slots[i][0])
        if assign:
            for i, have in enumerate(self.names):
                if have == "":
                    return C.addressof(self._slots[i][0])
        return None

    def _loaded(self, _u: int, name: bytes, slot: int) -> None:
        for i, (s, _, _) in enumerate(self._slots):
            if C.addressof(s) == slot:
                self.names[i] = name.decode()

    def _unloaded(self, _u: int, name: bytes) -> None:
        self.names = ["" if n == name.decode() else n for n in self.names]

    def _reset(self, _u: int, name: bytes) -> None:
        if self.on_reset is not None:
            self.on_reset(name.decode())

    def active(self, name: str) -> Optional[Dict[str, Tuple[torch.Tensor, torch.Tensor, float, int]]]:
        """The active copy of adapter `name` per module: (A, B, scaling, rank), or None."""
        if name not in self.names:
            return None
        i = self.names.index(name)
        slot, active, arr = self._slots[i]
        c = active.value
        return {t.module: (self.a[i][k][c], self.b[i][k][c], arr[k].scaling[c], arr[k].rank[c])
                for k, t in enumerate(self.targets)}
