"""Checkpoint names for a trainer's tensors. transformers 5 holds a MoE layer's experts fused in
memory (``mlp.experts.gate_up_proj`` [E, 2 I, H], ``mlp.experts.down_proj`` [E, H, I]); HF
checkpoints on disk, and the engines' loaders, name them per expert
(``mlp.experts.<e>.{gate,up,down}_proj.weight``). :func:`checkpoint_tensors` yields the
checkpoint names as zero-copy views, so the engine shims' mapping sees what a checkpoint holds.
"""

from __future__ import annotations

from typing import Iterator, Tuple

import torch

from . import _torch


def checkpoint_tensors(named: _torch.NamedTensors) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under HF checkpoint names; fused experts split into per-expert views."""
    for name, t in _torch.items(named):
        if name.endswith(".mlp.experts.gate_up_proj") and t.dim() == 3:
            base = name[: -len("gate_up_proj")]
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{base}{e}.gate_proj.weight", t[e, :half]
                yield f"{base}{e}.up_proj.weight", t[e, half:]
        elif name.endswith(".mlp.experts.down_proj") and t.dim() == 3:
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                yield f"{base}{e}.down_proj.weight", t[e]
        else:
            yield name, t
