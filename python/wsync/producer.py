"""The trainer side: a :class:`Producer` takes torch tensors by HF name, plans buckets in the
engine's order (the C planner), stages each bucket into retained staging buffers (one per engine
TP rank), publishes the plugin's manifests, encodes them into the engine's request messages (the
C shims) and waits for *consumed* before a buffer is reused.

Streams: stage and publish run on the torch stream given, else torch's current stream of the
tensors' device, never another (the ABI's stream rule), so staging reads what the trainer's
queued kernels wrote.
"""

from __future__ import annotations

import ctypes as C
import json
from collections import deque
from typing import Any, Callable, List, Optional, Sequence, Union

import torch

from . import _abi, _native, _torch
from .checkpoint import checkpoint_tensors
from .errors import InvalidArgument, check_reply

#: The engine ranks' reply texts to one request (one each), or a callable that returns them
#: later (the request is in flight: a Ray ObjectRef's ``ray.get``, a future's ``result``).
Replies = Union[str, bytes, Sequence[str], Callable[[], Union[str, bytes, Sequence[str]]]]
#: Delivers one request message to every engine rank; returns their replies (Replies).
Send = Callable[[str], Replies]


def check_replies(replies: Union[str, Sequence[str]]) -> List[dict]:
    """Parse engine replies; raise the WsyncError of the first that failed."""
    return [check_reply(t) for t in ([replies] if isinstance(replies, (str, bytes)) else replies)]


def encode_bucket(engine: str, manifests: Sequence[str], *, first: bool, finished: bool,
                  weight_version: Optional[str] = None, packed: bool = True,
                  with_buffer: bool = True) -> List[str]:
    """`engine`'s request messages (JSON text, in send order) for published manifests, one per
    engine rank (or one for all), by the C shim of that engine."""
    shim = _native.shim()
    err = _abi.Error.new()
    arr = _native.c_strings(list(manifests))
    p = shim.encode_bucket(engine.encode(), arr, len(manifests), int(first), int(finished),
                           weight_version.encode() if weight_version else None, int(packed),
                           int(with_buffer), C.byref(err))
    text = shim.take_string(p)
    if text is None:
        _native.check(err.code or 16, err)
    return [json.dumps(m, separators=(",", ":")) for m in json.loads(text)]


class _Buffers:
    """One set of staging buffers (one per engine rank) and what was published through it."""

    def __init__(self) -> None:
        self.staging: List[int] = []
        self.published: List[int] = []
        self.waited: List[int] = []
        self.sent = False  # the engines have seen these buffers (LMDeploy's flattened tensor)
        self.keep: list = []  # the sources of the last bucket, alive until consumed


class Producer:
    """Retained staging buffers of ``bucket_bytes`` each: ``buffers`` sets (default 2: the engine
    copies bucket k while the trainer stages bucket k+1), one buffer per engine TP rank in each
    (on ``devices[r]``, default: ``device`` for all), speaking to ``engine`` ("sglang", "vllm",
    "lmdeploy")."""

    def __init__(
        self,
        engine: str = "sglang",
        *,
        bucket_bytes: int = 1 << 30,
        tp_size: int = 1,
        device: Union[str, torch.device, None] = None,
        devices: Optional[Sequence[Union[str, torch.device]]] = None,
        plugin: Optional[str] = None,
        digests: bool = True,
        timeout_ms: int = 0,
        packed: bool = True,
        buffers: int = 2,
    ) -> None:
        if buffers < 1:
            raise InvalidArgument(1, "Producer", f"buffers={buffers}: at least 1")
        self.engine = engine
        self.bucket_bytes = int(bucket_bytes)
        self.plugin = _native.load_plugin(plugin)
        self._shim = _native.shim()
        self._ops = self.plugin.producer
        dev = _torch.normalize(device) if device is not None else torch.device("cpu")
        self.devices = [_torch.normalize(d) for d in devices] if devices else [dev] * tp_size
        self.packed = packed
        self._sets: List[_Buffers] = []
        self._turn = 0
        self._first = True
        self._plan_cache: Optional[tuple] = None
        # per bucket (its names): the tensors' signature and the StageTensor array built for it
        self._stage_cache: dict = {}
        try:
            for _ in range(buffers):
                b = _Buffers()
                self._sets.append(b)
                for d in self.devices:
                    cfg = _abi.StagingConfig(
                        struct_size=C.sizeof(_abi.StagingConfig),
                        bytes=self.bucket_bytes,
                        device_ordinal=(d.index or 0) if d.type == "cuda" else 0,
                        flags=0 if digests else _abi.STAGING_NO_DIGESTS,
                        timeout_ms=timeout_ms,
                    )
                    st = C.c_void_p()
                    err = _abi.Error.new()
                    _native.check(self._ops.create(C.byref(cfg), C.byref(st), C.byref(err)), err)
                    b.staging.append(st.value)
                    b.published.append(0)
                    b.waited.append(0)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- planning

    def plan(self, named: _torch.NamedTensors) -> List[List[str]]:
        """Bucket plan: lists of names in the engine's order, each list fitting one bucket. The
        last plan is kept: a trainer syncing the same tensors again plans nothing."""
        pairs = _torch.items(named)
        names = [n for n, _ in pairs]
        sizes = [t.numel() * t.element_size() for _, t in pairs]
        key = (tuple(names), tuple(sizes))
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return [list(b) for b in self._plan_cache[1]]
        nbytes = (C.c_uint64 * max(len(pairs), 1))(*sizes)
        order = (C.c_size_t * max(len(pairs), 1))()
        first = (C.c_size_t * (len(pairs) + 1))()
        nb = C.c_size_t()
        err = _abi.Error.new()
        arr = _native.c_strings(names)
        rc = self._shim.plan(self.engine.encode(), arr, nbytes, len(pairs), self.bucket_bytes,
                             order, first, C.byref(nb), C.byref(err))
        _native.check(rc, err)
        out = [[names[order[i]] for i in range(first[b], first[b + 1])] for b in range(nb.value)]
        self._plan_cache = (key, out)
        self._stage_cache.clear()
        return [list(b) for b in out]

    # ------------------------------------------------------------------ buckets

    def _wait_set(self, b: _Buffers, stream: Optional[Any]) -> None:
        for r, st in enumerate(b.staging):
            g = b.published[r]
            if g > b.waited[r]:
                err = _abi.Error.new()
                sh = _torch.stream_handle(self.devices[r], stream)
                _native.check(self._ops.wait_consumed(st, sh, g, C.byref(err)), err)
                b.waited[r] = g
        b.keep = []

    def wait(self, stream: Optional[Any] = None) -> None:
        """Wait until every engine rank has consumed every published bucket (call after their
        acks). Raises Timeout or PeerGone when an engine stalls or dies."""
        for b in self._sets:
            self._wait_set(b, stream)

    def _stage_array(self, pairs: list) -> tuple:
        """The StageTensor array of a bucket and the tensors it points into. Rebuilt only when a
        tensor's storage, dtype, shape or layout changed since the last sync of these names (a
        trainer's parameters stay put, so a steady sync builds nothing)."""
        names = tuple(n for n, _ in pairs)
        sig = tuple((t.data_ptr(), t.dtype, t.shape, t.device, t.is_contiguous()) for _, t in pairs)
        hit = self._stage_cache.get(names)
        if hit is not None and hit[0] == sig:
            return hit[1], hit[2]
        arr = (_abi.StageTensor * len(pairs))()
        keep = []
        for i, (name, t) in enumerate(pairs):
            if (t.device.type == "cuda") != (self.plugin.name == "cuda"):
                raise InvalidArgument(
                    1, "stage_bucket", f"tensor {name} is on {t.device}, the {self.plugin.name} plugin "
                    f"({self.plugin.path}) stages {'CUDA' if self.plugin.name == 'cuda' else 'CPU'} memory"
                )
            if t.device != self.devices[0] and len(set(self.devices)) == 1:
                raise InvalidArgument(1, "stage_bucket", f"tensor {name} is on {t.device}, the staging on {self.devices[0]}")
            src = t.detach()
            if not src.is_contiguous():
                src = src.contiguous()
            keep.append(src)
            ndim, shape = _torch.shape_of(name, src)
            arr[i] = _abi.StageTensor(
                struct_size=C.sizeof(_abi.StageTensor),
                name=name.encode(),
                dtype=_torch.dtype_code(name, src),
                ndim=ndim,
                shape=shape,
                src=src.data_ptr() or None,
            )
        if all(x[4] for x in sig):  # .contiguous() copies are new storage every time
            self._stage_cache[names] = (sig, arr, keep)
        return arr, keep

    def stage_bucket(
        self,
        tensors: _torch.NamedTensors,
        *,
        finished: bool = False,
        weight_version: Optional[str] = None,
        stream: Optional[Any] = None,
    ) -> List[str]:
        """Stage one bucket into every rank's buffer of the next set, publish, and return the
        request messages (JSON text, in send order) that carry it to the engine. Waits first for
        *consumed* of the bucket that set carried before (its acks must have come back)."""
        pairs = _torch.items(tensors)
        if not pairs:
            raise InvalidArgument(1, "stage_bucket", "an empty bucket")
        b = self._sets[self._turn]
        self._wait_set(b, stream)
        arr, keep = self._stage_array(pairs)
        manifests = []
        for r, st in enumerate(b.staging):
            sh = _torch.stream_handle(self.devices[r], stream)
            err = _abi.Error.new()
            _native.check(self._ops.stage(st, sh, arr, len(pairs), C.byref(err)), err)
            text = C.c_char_p()
            gen = C.c_uint64()
            _native.check(self._ops.publish(st, sh, int(finished), C.byref(text), C.byref(gen), C.byref(err)), err)
            b.published[r] = gen.value
            manifests.append(text.value.decode())
        b.keep = keep  # the sources stay alive until the engine consumed them
        # LMDeploy's update_params names its persistent buffer only with a bucket that carries
        # it: with several buffer sets every bucket names its own.
        with_buffer = not b.sent or len(self._sets) > 1
        msgs = self.encode(manifests, first=self._first, finished=finished,
                           weight_version=weight_version, with_buffer=with_buffer)
        b.sent = True
        self._first = finished
        self._turn = (self._turn + 1) % len(self._sets)
        return msgs

    def encode(self, manifests: Sequence[str], *, first: bool, finished: bool,
               weight_version: Optional[str] = None, with_buffer: bool = True) -> List[str]:
        """The engine's request messages for published manifests (one per rank)."""
        return encode_bucket(self.engine, manifests, first=first, finished=finished,
                             weight_version=weight_version, packed=self.packed, with_buffer=with_buffer)

    def sync(
        self,
        named: _torch.NamedTensors,
        send: Send,
        *,
        weight_version: Optional[str] = None,
        stream: Optional[Any] = None,
    ) -> int:
        """One whole weight sync: plan, then per bucket stage, deliver every message through
        ``send`` (to all engine ranks), check the replies, and wait for *consumed*. Returns the
        number of buckets. Tensors go under their HF checkpoint names (checkpoint_tensors).

        ``send`` may return the replies, or a callable (or a future: its ``result``) that returns
        them once they arrive: the
        trainer then stages the next bucket into the other buffer set while the engines copy
        this one, and checks each set's replies before the set is reused (a refused bucket
        raises there, before anything else is written into that buffer). An engine gives a
        bucket it refused back as consumed (the shims' driver does), so the next sync goes on."""
        pairs = list(checkpoint_tensors(named))
        by_name = dict(pairs)
        plan = self.plan(pairs)
        pending: deque = deque()  # (buffer set, replies to check), oldest first
        try:
            for b, names in enumerate(plan):
                while pending and (len(pending) >= len(self._sets) or pending[0][0] == self._turn):
                    check_replies(pending.popleft()[1]())
                turn = self._turn
                msgs = self.stage_bucket([(n, by_name[n]) for n in names], finished=b == len(plan) - 1,
                                         weight_version=weight_version, stream=stream)
                for m in msgs:
                    r = send(m)
                    if callable(r):
                        pending.append((turn, r))
                    elif callable(getattr(r, "result", None)):  # a concurrent.futures.Future
                        pending.append((turn, r.result))
                    else:
                        check_replies(r)
            while pending:
                check_replies(pending.popleft()[1]())
        finally:
            for _, r in pending:  # a failure above: collect what is still in flight, quietly
                try:
                    r()
                except Exception:
                    pass
        self.wait(stream)
        return len(plan)

    def close(self) -> None:
        """Retire every staging buffer (the engines must have released their mappings first:
        EngineWorker.release). Raises Busy while an engine still maps one."""
        for b in self._sets:
            while b.staging:
                err = _abi.Error.new()
                _native.check(self._ops.retire(b.staging[-1], C.byref(err)), err)
                b.staging.pop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:  # keep the first error; the buffers go with the process
            try:
                self.close()
            except Exception:
                pass
