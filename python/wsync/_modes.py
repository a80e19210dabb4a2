"""How a :class:`wsync.Producer`'s buckets reach the engines: staged (copied into its retained
buffers, which the next bucket waits for) or direct (named where they live, nothing reused). The
Producer asks its mode at every point where the two differ; neither holds a rule of the
library's (planning, flags and messages are the C library's)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from . import _abi, _torch
from .errors import InvalidArgument

Plan = Callable[..., List[List[str]]]  # the C planner: (names, sizes, limit, ramp=0) -> buckets


class Staged:
    """Each bucket copied into the next set of retained staging buffers; a set is staged again
    once the engines consumed what it carried."""

    direct = False
    reuses_buffers = True  # a set's next stage waits for its consumed; replies checked before
    stage_casts = True  # cast_to is applied by the stage's copy

    def staging_flags(self, digests: bool) -> int:
        return 0 if digests else _abi.STAGING_NO_DIGESTS

    def buffer_sets(self, asked: int) -> int:
        return asked

    def plan(self, plan: Plan, names: List[str], sizes: List[int], bucket_bytes: int) -> List[List[str]]:
        return plan(names, sizes, bucket_bytes)

    def reads_host(self, plugin: str) -> bool:
        """CPU tensors staged by the CUDA plugin (pinned or registered)."""
        return plugin == "cuda"

    def source(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else t.contiguous()

    def cached_keep(self, keep: list) -> Optional[list]:
        """What a cached StageTensor array keeps alive between syncs: the contiguous copies."""
        return keep

    def keep_now(self, pairs: list) -> list:
        return []

    def before_stage(self, wait_set: Callable[[], None], pairs: Optional[list], stream: Optional[Any]) -> None:
        wait_set()

    def bucket_keep(self, old: list, new: list) -> list:
        return new

    def plan_cacheable(self) -> bool:
        return True


class Direct:
    """Each bucket names the trainer's tensors in place (or retained buffers of them cast to
    ``cast_to``): nothing is reused, so every bucket of a sync may be in flight at once."""

    direct = True
    reuses_buffers = False
    stage_casts = False

    def __init__(self, cast_to: Optional[torch.dtype]) -> None:
        self.cast_to = cast_to
        self.casts: Dict[str, torch.Tensor] = {}  # name -> its retained cast buffer

    def staging_flags(self, digests: bool) -> int:
        return _abi.STAGING_DIRECT

    def buffer_sets(self, asked: int) -> int:
        return 1  # nothing is staged: one synchronisation object per engine rank

    def plan(self, plan: Plan, names: List[str], sizes: List[int], bucket_bytes: int) -> List[List[str]]:
        # direct mode copies nothing on the trainer: buckets only pipeline the engine's work (its
        # host work on bucket k+1 runs while the GPU copies bucket k), so any tensor fits one, and
        # the C planner's ramp starts a sync of several buckets with smaller ones (1/8, 1/4, 1/2
        # of bucket_bytes, at least the largest tensor left) so the GPU starts on the first while
        # the host works on the larger ones. A sync that fits one bucket stays one request,
        # validated whole before any write.
        limit = max([bucket_bytes, *sizes])
        out = plan(names, sizes, limit)
        return plan(names, sizes, limit, ramp=3) if len(out) > 1 else out

    def reads_host(self, plugin: str) -> bool:
        return False

    def source(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """What the engine reads for `t`: `t` itself, or its retained cast buffer."""
        if not t.is_contiguous():
            raise InvalidArgument(
                1, "stage_bucket", f"tensor {name} is not contiguous (strides {tuple(t.stride())}): "
                "direct mode reads tensors where they are; pass a contiguous tensor or use a staged Producer"
            )
        if self.cast_to is None or t.dtype == self.cast_to or not t.dtype.is_floating_point:
            return t
        buf = self.casts.get(name)
        if buf is None or buf.shape != t.shape or buf.device != t.device:
            buf = torch.empty(t.shape, dtype=self.cast_to, device=t.device)
            self.casts[name] = buf
        return buf

    def cached_keep(self, keep: list) -> Optional[list]:
        return None  # no tensor held between syncs: a trainer that frees one gets its memory back

    def keep_now(self, pairs: list) -> list:
        """The bucket's own tensors and cast buffers, alive while it is in flight."""
        return [t for _, t in pairs] + [self.casts[n] for n, _ in pairs if n in self.casts]

    def before_stage(self, wait_set: Callable[[], None], pairs: Optional[list], stream: Optional[Any]) -> None:
        """Refresh every cast buffer of the bucket from its tensor, on the stream the publish
        records *ready* on (so the engine reads the new values)."""
        if not self.casts or pairs is None:
            return
        with _torch.on_stream(stream):
            for name, t in pairs:
                buf = self.casts.get(name)
                if buf is not None and t.dtype != self.cast_to:
                    buf.copy_(t.detach())

    def bucket_keep(self, old: list, new: list) -> list:
        return old + new  # every bucket of the sync may still be read

    def plan_cacheable(self) -> bool:
        return self.cast_to is None  # cast buffers are refreshed per sync
