"""The trainer side: a :class:`Producer` takes torch tensors by HF name, plans buckets in the
engine's order (the C planner), stages each bucket into retained staging buffers (one per engine
TP rank), publishes the plugin's manifests, encodes them into the engine's request messages (the
C shims) and waits for *consumed* before a buffer is reused.

Streams: stage and publish run on the torch stream given, else torch's current stream of the
tensors' device, never another (the ABI's stream rule), so staging reads what the trainer's
queued kernels wrote.

Direct mode (``direct=True``): no staging buffer and no staging copy. Each sync names the
trainer's own tensors where they live (the plugin finds the allocation that holds each one and
exports it once), and the engine copies straight from them in one launch. The rule that comes
with it: the trainer must not write those tensors until the engine has consumed the sync;
:meth:`Producer.sync` returns only then, and :meth:`Producer.guard` makes an optimizer's
``step()`` wait for a sync still in flight (``sync(..., wait=False)``) instead of racing it.
"""

from __future__ import annotations

import contextlib
import ctypes as C
import gc
from collections import deque
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from . import _abi, _modes, _native, _torch, messages
from .checkpoint import checkpoint_tensors
from .errors import InvalidArgument, UnknownPlan, check_reply

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
                  with_buffer: bool = True, direct: bool = False) -> List[str]:
    """`engine`'s request messages (JSON text, in send order) for published manifests, one per
    engine rank (or one for all), by the C shim of that engine. `direct`: the manifests were
    published by a direct-mode Producer (they name the trainer's own tensors)."""
    shim = _native.shim()
    err = _abi.Error.new()
    arr = _native.c_strings(list(manifests))
    p = shim.encode_bucket_lines(engine.encode(), arr, len(manifests), int(first), int(finished),
                                 weight_version.encode() if weight_version else None, int(packed),
                                 int(with_buffer), int(direct), C.byref(err))
    text = shim.take_string(p)
    if text is None:
        _native.check(err.code or 16, err)
    return text.split("\n")  # each message's compact JSON text as the shim wrote it


def begin_message(version: int, pairs: Sequence[tuple], cast_to: Optional[torch.dtype] = None) -> str:
    """The request that opens update transaction `version` on every engine rank, declaring the
    tensors (HF names) and bytes the sync will send (floats as ``cast_to`` where given)."""
    return _begin_text(version, *_expect(pairs, cast_to))


def _expect(pairs: Sequence[tuple], cast_to: Optional[torch.dtype]) -> Tuple[List[str], int]:
    """The names and bytes a transaction over `pairs` declares."""
    def size(t: torch.Tensor) -> int:
        cast = cast_to is not None and t.dtype.is_floating_point
        return t.numel() * (cast_to.itemsize if cast else t.element_size())
    return [n for n, _ in pairs], sum(size(t) for _, t in pairs)


def _begin_text(version: int, names: List[str], nbytes: int, pid: Optional[int] = None) -> str:
    return messages.begin(version, names, nbytes, pid)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic collector held off while a sync runs (as timeit does): a sync of thousands
    of tensors makes tens of thousands of short-lived tuples, each 700 of which would start a
    collection that walks the young objects (and, often enough, every object the trainer holds):
    5-7x the sync's own Python time on a 4 719-tensor model. Collections resume after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _signature(ts: list) -> tuple:
    """What a bucket's StageTensor arrays depend on: each tensor's storage address, dtype, shape
    and contiguity (a contiguous tensor's strides follow from its shape; its device from its
    address). Built with C-level maps: about 0.3 us a tensor."""
    T = torch.Tensor
    return (list(map(T.data_ptr, ts)), [t.dtype for t in ts], [t.shape for t in ts],
            list(map(T.is_contiguous, ts)))


class _SyncCheck:
    """A cached sync plan's check, bucket by bucket: the caller's tensors (indices into the
    sync's pairs) each bucket reads, and their signature when the plan was made. A steady sync
    checks a bucket just before it is staged, so the first bucket leaves after its own tensors'
    check instead of the whole model's, and the rest is checked while the engines copy."""

    def __init__(self, raw: list, pairs: list, owner: List[int], bucket_pairs: List[list]) -> None:
        """`pairs`: the sync's checkpoint tensors, `owner[k]` the index in `raw` that pairs[k]
        comes from; `bucket_pairs`: the plan's buckets of those pairs."""
        pos = {n: k for k, (n, _) in enumerate(pairs)}
        self.bucket_names = [[n for n, _ in bp] for bp in bucket_pairs]
        self.idx = [sorted({owner[pos[n]] for n in names}) for names in self.bucket_names]
        seen = {i for ix in self.idx for i in ix}
        if self.idx:  # a tensor no bucket reads (no checkpoint tensors) is checked with the first
            self.idx[0] = sorted(set(self.idx[0]) | (set(range(len(raw))) - seen))
        self.names = [n for n, _ in raw]
        self.sig = [_signature([raw[i][1] for i in ix]) for ix in self.idx]

    def holds(self, b: int, raw: list) -> bool:
        """Whether bucket b's tensors are where, and as, they were."""
        return _signature([raw[i][1] for i in self.idx[b]]) == self.sig[b]


class _SyncPlan:
    """One sync's buckets, ready to stage: per bucket the (StageTensor array, count) of every
    engine rank with the tensors made for it (contiguous copies, cast buffers), and (when not
    from the cache) its (name, tensor) pairs; the names and bytes a transaction declares. Holds
    no tensor once cached (direct mode keeps none between syncs)."""

    def __init__(self, buckets: list, pairs: Optional[list], names: List[str], nbytes: int) -> None:
        self.buckets, self.pairs, self.names, self.nbytes = buckets, pairs, names, nbytes


def _resolve(r: Any) -> Any:
    """Replies now: a deferred reply (callable or future) is waited for."""
    if callable(r):
        return r()
    if callable(getattr(r, "result", None)):
        return r.result()
    return r


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
    "lmdeploy").

    ``stage_first`` (default): in :meth:`sync`, bucket k+1 is staged, once its buffer set is
    consumed, before bucket k's requests are sent. The engine's copy of bucket k is then queued
    while that stage runs instead of reaching an idle GPU beside it (docs/PYTHON.md, "The order
    of a sync's buckets"). ``stage_first=False`` sends each bucket as soon as it is published,
    for a transport whose latency exceeds a bucket's stage.

    ``transport``: "local" (default: the engines map the buffers, on this host), or "nixl": each
    buffer is also registered with this process's NIXL agent and the engines pull the buckets
    with one-sided READs, on this host or another (docs/DESIGN.md, "Beyond one host"). The
    engines need no setting: the manifests say how to read them. With ``direct``, the engines
    pull straight from the trainer's own tensors (registered where they live, once): no stage
    copy at all."""

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
        direct: bool = False,
        cast_to: Optional[torch.dtype] = None,
        ep_size: int = 1,
        experts: Optional[int] = None,
        stage_first: bool = True,
        transport: str = "local",
        replay: bool = True,
    ) -> None:
        if transport not in ("local", "nixl"):
            raise InvalidArgument(1, "Producer", f"transport={transport!r}: \"local\" or \"nixl\"")
        self.transport = transport
        if transport == "nixl":
            _native.find_nixl()
        if buffers < 1:
            raise InvalidArgument(1, "Producer", f"buffers={buffers}: at least 1")
        if ep_size < 1 or tp_size % ep_size != 0:
            raise InvalidArgument(1, "Producer", f"ep_size={ep_size}: must be >= 1 and divide tp_size={tp_size}")
        # expert parallelism: engine rank r is EP rank r // (tp_size // ep_size) and is staged only
        # the experts it owns (the engines' linear placement, docs/SHIMS.md); `experts`: the
        # model's expert count (None: the largest expert index the first sync names, plus one)
        self.ep_size, self.experts = int(ep_size), experts
        self._owner_cache: dict = {}  # bucket names -> each tensor's owning EP rank
        if cast_to is not None and (not cast_to.is_floating_point or cast_to.itemsize > 8):
            raise InvalidArgument(1, "Producer", f"cast_to={cast_to}: a floating-point dtype")
        self._mode = _modes.Direct(cast_to) if direct else _modes.Staged()
        # sync(): the next bucket staged (once its buffer set is consumed) before this one is
        # sent; False sends each bucket as soon as it is published
        self.stage_first = bool(stage_first)
        # tensors of another floating dtype are sent as this one (the trainer's fp32 master
        # weights, an f32 checkpoint, for a bf16 engine): staged, the stage converts each element
        # in its copy (src_dtype); direct, they are cast into retained buffers the engine reads
        self.cast_to = cast_to
        self._host: dict = {}  # registered CPU storages: data_ptr -> a tensor on it (kept alive)
        self._cast_code = _abi.DTYPES.get(_torch.dtype_name(cast_to)) if cast_to is not None else None
        self._inflight: list = []  # sync(wait=False): replies not yet checked
        buffers = self._mode.buffer_sets(buffers)
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
        # sync(): the last sync's _SyncPlan and its _SyncCheck, so a steady trainer's sync reads
        # each tensor's address, dtype and shape (bucket by bucket, as each goes) and builds nothing
        self._sync_cache: Optional[tuple] = None
        # sync(): a bucket whose plan the engines recorded goes as its replay (docs/DESIGN.md,
        # "Plan once, replay"); the plan ids sent in full so far
        # (over NIXL not yet: the engines pull the whole manifest's bytes there anyway)
        self.replay = bool(replay) and transport == "local"
        self._plans: set = set()
        self._full: Optional[tuple] = None  # _publish_set's fallback for _replayed
        try:
            for _ in range(buffers):
                b = _Buffers()
                self._sets.append(b)
                for d in self.devices:
                    cfg = _abi.StagingConfig(
                        struct_size=C.sizeof(_abi.StagingConfig),
                        bytes=self.bucket_bytes,
                        device_ordinal=(d.index or 0) if d.type == "cuda" else 0,
                        flags=self._mode.staging_flags(digests) | (_abi.STAGING_NIXL if transport == "nixl" else 0),
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

    @property
    def direct(self) -> bool:
        """Direct mode: the buckets name the trainer's tensors where they live."""
        return self._mode.direct

    # ----------------------------------------------------------------- planning

    def plan(self, named: _torch.NamedTensors) -> List[List[str]]:
        """Bucket plan: lists of names in the engine's order, each list fitting one bucket. The
        last plan is kept: a trainer syncing the same tensors again plans nothing."""
        pairs = _torch.items(named)
        names = [n for n, _ in pairs]
        sizes = [t.nbytes for _, t in pairs]
        key = (tuple(names), tuple(sizes))
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return [list(b) for b in self._plan_cache[1]]
        out = self._mode.plan(self._plan_names, names, sizes, self.bucket_bytes)
        self._plan_cache = (key, out)
        self._stage_cache.clear()
        return [list(b) for b in out]

    def _plan_names(self, names: List[str], sizes: List[int], limit: int, ramp: int = 0) -> List[List[str]]:
        """The C planner's buckets of at most `limit` bytes (the first `ramp` smaller), in the
        engine's order."""
        n = len(names)
        nbytes = (C.c_uint64 * max(n, 1))(*sizes)
        order = (C.c_size_t * max(n, 1))()
        first = (C.c_size_t * (n + 1))()
        nb = C.c_size_t()
        err = _abi.Error.new()
        rc = self._shim.plan(self.engine.encode(), _native.c_strings(names), nbytes, n, limit, ramp,
                             order, first, C.byref(nb), C.byref(err))
        _native.check(rc, err)
        return [[names[order[i]] for i in range(first[b], first[b + 1])] for b in range(nb.value)]

    # ------------------------------------------------------------------ buckets

    def _handles(self, stream: Optional[Any]) -> List[Optional[int]]:
        """Each engine rank's cudaStream_t for `stream` (the ABI's stream rule)."""
        return [_torch.stream_handle(d, stream) for d in self.devices]

    def _wait_set(self, b: _Buffers, handles: list) -> None:
        for r, st in enumerate(b.staging):
            g = b.published[r]
            if g > b.waited[r]:
                err = _abi.Error.new()
                _native.check(self._ops.wait_consumed(st, handles[r], g, C.byref(err)), err)
                b.waited[r] = g
        b.keep = []

    def _finish_inflight(self, stream: Optional[Any]) -> None:
        inflight, self._inflight = self._inflight, []
        for i, r in enumerate(inflight):
            try:
                check_replies(r())
            except BaseException:
                for rest in inflight[i + 1:]:
                    try:
                        rest()
                    except Exception:
                        pass
                raise
        if inflight:
            handles = self._handles(stream)
            for b in self._sets:
                self._wait_set(b, handles)

    def wait(self, stream: Optional[Any] = None) -> None:
        """Wait until every engine rank has consumed every published bucket (call after their
        acks; a sync sent with wait=False has its replies checked here first). Raises Timeout or
        PeerGone when an engine stalls or dies, the engine's error when it refused the sync."""
        self._finish_inflight(stream)
        handles = self._handles(stream)
        for b in self._sets:
            self._wait_set(b, handles)

    def abort(self, send: Send, reason: str = "aborted by its producer") -> None:
        """End the open update transaction on every engine rank unfinished (it is reported
        partial and never committed); a later sync with a newer version starts cleanly."""
        check_replies(_resolve(send(messages.abort(reason))))

    def guard(self, optimizer: Any) -> Any:
        """Make ``optimizer.step()`` wait until the engines consumed the last sync (direct mode:
        they read the trainer's tensors in place, so a step while a sync is in flight would race
        them). Raises from the step what :meth:`wait` raises. Returns the hook's handle
        (``.remove()`` undoes it)."""
        return optimizer.register_step_pre_hook(lambda *_a, **_k: self.wait())

    def _stage_array(self, pairs: list) -> tuple:
        """The StageTensor array of a bucket and the tensors it points into. Rebuilt only when a
        tensor's storage, dtype, shape or layout changed since the last sync of these names (a
        trainer's parameters stay put, so a steady sync builds nothing)."""
        names = tuple(n for n, _ in pairs)
        sig = tuple((t.data_ptr(), t.dtype, t.shape, t.device, t.is_contiguous()) for _, t in pairs)
        hit = self._stage_cache.get(names)
        if hit is not None and hit[0] == sig:
            # direct mode holds no tensor between syncs (a trainer that frees one gets its memory
            # back): the bucket's own tensors and cast buffers stay alive while it is in flight
            return hit[1], hit[2] if hit[2] is not None else self._mode.keep_now(pairs)
        arr = (_abi.StageTensor * len(pairs))()
        keep = []
        for i, (name, t) in enumerate(pairs):
            host = t.device.type == "cpu" and self._mode.reads_host(self.plugin.name)
            if host:
                self._check_host(name, t)
            elif (t.device.type == "cuda") != (self.plugin.name == "cuda"):
                raise InvalidArgument(
                    1, "stage_bucket", f"tensor {name} is on {t.device}, the {self.plugin.name} plugin "
                    f"({self.plugin.path}) stages {'CUDA' if self.plugin.name == 'cuda' else 'CPU'} memory"
                )
            if not host and t.device != self.devices[0] and len(set(self.devices)) == 1:
                raise InvalidArgument(1, "stage_bucket", f"tensor {name} is on {t.device}, the staging on {self.devices[0]}")
            src = self._mode.source(name, t.detach())
            keep.append(src)
            ndim, shape = _torch.shape_of(name, src)
            code = _torch.dtype_code(name, src)
            cast = (self._mode.stage_casts and self.cast_to is not None and src.dtype.is_floating_point
                    and src.dtype != self.cast_to)
            arr[i] = _abi.StageTensor(
                struct_size=C.sizeof(_abi.StageTensor),
                name=name.encode(),
                dtype=self._cast_code if cast else code,
                ndim=ndim,
                shape=shape,
                src=src.data_ptr() or None,
                src_dtype=code,
            )
        if all(x[4] for x in sig):  # .contiguous() copies are new storage every time
            self._stage_cache[names] = (sig, arr, self._mode.cached_keep(keep))
        return arr, keep

    def _check_host(self, name: str, t: torch.Tensor) -> None:
        """A CPU tensor staged by the CUDA plugin: its storage must be pinned or registered
        (register_host), else the GPU cannot read it."""
        if not t.is_contiguous():
            raise InvalidArgument(1, "stage_bucket", f"tensor {name} is a non-contiguous CPU tensor: the stage "
                                  "reads host tensors in place; pass it contiguous")
        st = t.untyped_storage()
        if st.data_ptr() in self._host or t.is_pinned():
            return
        raise InvalidArgument(
            1, "stage_bucket", f"tensor {name} is in pageable CPU memory ({t.device}), which the GPU cannot "
            "read: pin it (tensor.pin_memory()) or register its storage once (Producer.register_host)")

    def register_host(self, t: torch.Tensor) -> None:
        """Let the stages read CPU tensor ``t``'s whole storage in place (a checkpoint loaded or
        mapped on the host): the CUDA plugin page-locks it and maps it for the GPU, so each
        stage moves it over PCIe on the copy engines, converted behind them where ``cast_to`` asks
        (docs/PYTHON.md). Kept until :meth:`unregister_host` or close; the CPU plugin needs no
        registration, but takes it."""
        ops = self._ops
        if not (ops.struct_size >= _abi.ProducerOps.unregister_host.offset + C.sizeof(C.c_void_p)
                and ops.register_host):
            raise InvalidArgument(1, "register_host", f"plugin {self.plugin.path} has no register_host (ABI 0.1.5)")
        if t.device.type != "cpu":
            raise InvalidArgument(1, "register_host", f"a CPU tensor, not one on {t.device}")
        st = t.untyped_storage()
        if st.data_ptr() in self._host:
            return
        err = _abi.Error.new()
        _native.check(ops.register_host(self._sets[0].staging[0], st.data_ptr(), st.nbytes(), C.byref(err)), err)
        self._host[st.data_ptr()] = t
        self._forget()

    def unregister_host(self, t: torch.Tensor) -> None:
        """Undo :meth:`register_host` of ``t``'s storage (after the syncs that read it)."""
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self._host:
            raise InvalidArgument(1, "unregister_host", f"the storage at {ptr:#x} is not registered")
        self.wait()
        err = _abi.Error.new()
        _native.check(self._ops.unregister_host(self._sets[0].staging[0], ptr, C.byref(err)), err)
        del self._host[ptr]
        self._forget()

    def _forget(self) -> None:
        """Drop the cached StageTensor arrays: the checks they passed (a CPU tensor's pinning or
        registration) must run again."""
        self._stage_cache.clear()
        self._sync_cache = None

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
        *consumed* of the bucket that set carried before (its acks must have come back). Every
        rank's stage is enqueued before any is published, so the ranks' GPUs stage at once."""
        pairs = _torch.items(tensors)
        if not pairs:
            raise InvalidArgument(1, "stage_bucket", "an empty bucket")
        with _gc_paused():
            per_rank, keep = self._bucket_arrays(pairs)
            return self._stage_publish(per_rank, keep, pairs, finished=finished,
                                       weight_version=weight_version, stream=stream)

    def _bucket_arrays(self, pairs: list) -> Tuple[list, list]:
        """Per engine rank, the (StageTensor array, count) of the bucket it is staged; and the
        tensors those arrays point into, to keep alive while the bucket is in flight."""
        per_rank = self._ep_pairs(pairs)
        arrays = {}  # one StageTensor array per distinct tensor list
        keep: list = []
        for rp in {id(x): x for x in per_rank}.values():
            arr, kp = self._stage_array(rp) if rp else ((_abi.StageTensor * 1)(), [])
            arrays[id(rp)] = (arr, len(rp))
            keep += kp
        return [arrays[id(rp)] for rp in per_rank], keep

    def _stage_publish(self, per_rank: list, keep: list, pairs: Optional[list], *, finished: bool,
                       weight_version: Optional[str], stream: Optional[Any]) -> List[str]:
        """Stage and publish one bucket (per_rank from _bucket_arrays) into the next buffer set;
        its request messages. `pairs` (None: a cached plan with no casts) feeds direct mode's casts."""
        handles = self._handles(stream)
        self._stage_set(self._turn, per_rank, pairs, handles, stream)
        return self._publish_set(self._turn, keep, handles, finished=finished, weight_version=weight_version)

    def _stage_set(self, k: int, per_rank: list, pairs: Optional[list], handles: list,
                   stream: Optional[Any]) -> None:
        """Stage one bucket into buffer set k on `handles` (one stream per rank), once the set's
        last bucket is consumed (direct mode reuses nothing: its buckets may all be in flight)."""
        b = self._sets[k]
        self._mode.before_stage(lambda: self._wait_set(b, handles), pairs, stream)
        ops = self._ops
        for r, st in enumerate(b.staging):  # every rank's stage first: the GPUs work at once
            err = _abi.Error.new()
            arr, n = per_rank[r]
            _native.check(ops.stage(st, handles[r], arr, n, C.byref(err)), err)

    def _publish_set(self, k: int, keep: list, handles: list, *, finished: bool,
                     weight_version: Optional[str], replay: bool = False) -> List[str]:
        """Publish the bucket staged into set k; its request messages. The next bucket goes to
        the set after k. `replay` (sync()): the messages record the bucket's plan, or, once
        recorded, replay it; then self._full holds what sends the bucket in full instead."""
        b = self._sets[k]
        manifests = []
        for r, st in enumerate(b.staging):
            err = _abi.Error.new()
            text = C.c_char_p()
            gen = C.c_uint64()
            _native.check(self._ops.publish(st, handles[r], int(finished), C.byref(text), C.byref(gen),
                                            C.byref(err)), err)
            b.published[r] = gen.value
            manifests.append(text.value.decode())
        # the sources stay alive until the engine consumed them
        b.keep = self._mode.bucket_keep(b.keep, keep)
        # LMDeploy's update_params names its persistent buffer only with a bucket that carries
        # it: with several buffer sets every bucket names its own.
        with_buffer = not b.sent or len(self._sets) > 1
        forms = [messages.plan_forms(t) for t in manifests] if replay and self.replay else []
        self._full = None
        if forms and all(f is not None for f in forms):
            full = [f[1] for f in forms]
            args = dict(first=self._first, finished=finished, weight_version=weight_version,
                        with_buffer=with_buffer, texts=True)
            ids = [f[0] for f in forms]
            if all(i in self._plans for i in ids):
                msgs = self.encode([f[2] for f in forms], **args)
                self._full = (lambda: self.encode(full, **args), ids)
            else:  # the ids count as recorded once every rank took the bucket (_replayed)
                msgs = self.encode(full, **args)
                self._full = (None, ids)
        else:
            msgs = self.encode(manifests, first=self._first, finished=finished,
                               weight_version=weight_version, with_buffer=with_buffer)
        b.sent = True
        self._first = finished
        self._turn = (k + 1) % len(self._sets)
        return msgs

    def _sync_plan(self, raw: list) -> Tuple[_SyncPlan, Optional[_SyncCheck]]:
        """The buckets of a sync of `raw` (the caller's pairs): from the cache when the names are
        those of the last sync, with the check each bucket must pass before it is staged (every
        tensor it reads where, and as, it was); else planned and built (and cached when every
        tensor is contiguous and no direct-mode cast must be refreshed per sync), with no check."""
        hit = self._sync_cache
        if hit is not None and hit[1].names == [n for n, _ in raw]:
            return hit[0], hit[1]
        return self._sync_plan_new(raw), None

    def _sync_rest(self, plan: _SyncPlan, b: int, fresh: _SyncPlan, sent: set) -> _SyncPlan:
        """A sync whose cached plan failed its check at bucket b, after b buckets were sent: those,
        then the buckets of the plan made again (`fresh`) less the tensors already sent."""
        buckets, pairs = plan.buckets[:b], [None] * b
        for bp in fresh.pairs:
            rest = [(n, t) for n, t in bp if n not in sent]
            if rest:
                buckets.append(self._bucket_arrays(rest))
                pairs.append(rest)
        return _SyncPlan(buckets, pairs, fresh.names, fresh.nbytes)

    def _sync_plan_new(self, raw: list) -> _SyncPlan:
        self._sync_cache = None
        pairs, owner = [], []
        for i, item in enumerate(raw):
            for p in checkpoint_tensors([item]):
                pairs.append(p)
                owner.append(i)
        if self.ep_size > 1 and self.experts is None:
            self._ep_owners([n for n, _ in pairs])  # learns the expert count from the names
        by_name = dict(pairs)
        buckets, bucket_pairs = [], []
        for names in self.plan(pairs):
            bp = [(n, by_name[n]) for n in names]
            buckets.append(self._bucket_arrays(bp))
            bucket_pairs.append(bp)
        names, nbytes = _expect(pairs, self.cast_to)
        plan = _SyncPlan(buckets, bucket_pairs, names, nbytes)
        if self._mode.plan_cacheable() and all(t.is_contiguous() for _, t in raw) and all(t.is_contiguous() for _, t in pairs):
            # the arrays point into the callers' tensors only: a sync keeps those (`raw`) alive
            check = _SyncCheck(raw, pairs, owner, bucket_pairs)
            self._sync_cache = (_SyncPlan([(a, []) for a, _ in buckets], None, names, nbytes), check)
        return plan

    def _ep_owners(self, names: Sequence[str]) -> List[int]:
        """Per name, the EP rank that owns it (-1: every rank takes it), in the placement of the
        engines' own mapping (wsync_shim_ep_owners); sets self.experts when it is unknown."""
        experts = C.c_int64(self.experts if self.experts is not None else 0)
        owner = (C.c_int32 * max(len(names), 1))()
        err = _abi.Error.new()
        _native.check(self._shim.ep_owners(self.engine.encode(), _native.c_strings(list(names)), len(names),
                                           C.byref(experts), self.ep_size, owner, C.byref(err)), err)
        if self.experts is None and experts.value > 0:
            self.experts = experts.value
        return list(owner[: len(names)])

    def _ep_pairs(self, pairs: list) -> List[list]:
        """Per engine rank, the tensors of the bucket it is staged: all of them, or with expert
        parallelism every tensor but the experts other EP ranks own (the same list object for
        the ranks of one EP rank)."""
        n_ranks = len(self._sets[0].staging)
        if self.ep_size == 1:
            return [pairs] * n_ranks
        if self.experts is None:
            raise InvalidArgument(1, "stage_bucket", f"ep_size={self.ep_size}: the model's expert count is "
                                  "unknown (pass experts=, or sync() the whole model first)")
        key = tuple(n for n, _ in pairs)
        owners = self._owner_cache.get(key)
        if owners is None:
            owners = self._owner_cache[key] = self._ep_owners(key)
        groups = [[p for p, o in zip(pairs, owners) if o in (-1, e)] for e in range(self.ep_size)]
        mtp = n_ranks // self.ep_size
        return [groups[r // mtp] for r in range(n_ranks)]

    def encode(self, manifests: Sequence[str], *, first: bool, finished: bool,
               weight_version: Optional[str] = None, with_buffer: bool = True,
               texts: bool = False) -> List[str]:
        """The engine's request messages for published manifests (one per rank); `texts`: the
        manifests travel as their texts (plan forms, as direct ones do)."""
        return encode_bucket(self.engine, manifests, first=first, finished=finished,
                             weight_version=weight_version, packed=self.packed, with_buffer=with_buffer,
                             direct=self._mode.direct or texts)

    def _replayed(self, replies: Any, full: Optional[tuple], j: int, send: Send) -> Any:
        """The replies to message j of a bucket. `full`: (what sends the bucket in full, or
        None when it went in full; its plan ids), as _publish_set left it. When an engine rank
        held no plan for a replay (restarted, released its mappings), the bucket goes in full
        instead (the rank kept it unconsumed; a rank that replayed it takes it once)."""
        try:
            check_replies(replies)
        except UnknownPlan:
            if full is None or full[0] is None:
                raise
            self._plans.clear()
            replies = _resolve(send(full[0]()[j]))
            check_replies(replies)
        if full is not None:
            self._plans.update(full[1])
        return replies

    def sync(
        self,
        named: _torch.NamedTensors,
        send: Send,
        *,
        weight_version: Optional[str] = None,
        stream: Optional[Any] = None,
        wait: bool = True,
        version: Optional[int] = None,
    ) -> int:
        """One whole weight sync: plan, then per bucket stage, deliver every message through
        ``send`` (to all engine ranks), check the replies, and wait for *consumed*. Returns the
        number of buckets. Tensors go under their HF checkpoint names (checkpoint_tensors).

        ``send`` may return the replies, or a callable (or a future: its ``result``) that returns
        them once they arrive: the
        trainer then stages the next bucket into the other buffer set while the engines copy
        this one, and checks each set's replies before the set is reused (a refused bucket
        raises there, before anything else is written into that buffer). An engine gives a
        bucket it refused back as consumed (the shims' driver does), so the next sync goes on.

        ``wait=False`` (direct mode): return once every request is sent; :meth:`wait` (or an
        optimizer step under :meth:`guard`) then checks the replies and waits for *consumed*.

        ``version`` (an int, rising): the sync is one update transaction (docs/SHIMS.md): it
        begins by declaring every tensor name and byte it will send, and the engines commit it
        with its last bucket only when all of them arrived; a version not newer than the one
        committed is refused before anything is written."""
        with _gc_paused():
            return self._sync(_torch.items(named), send, weight_version, stream, wait, version)

    def _sync(self, raw: list, send: Send, weight_version: Optional[str], stream: Optional[Any],
              wait: bool, version: Optional[int]) -> int:
        self._finish_inflight(stream)
        if not wait and self._mode.reuses_buffers:
            raise InvalidArgument(1, "sync", "wait=False is for direct mode: staged buffers are reused within a sync")
        plan, check = self._sync_plan(raw)
        if check is not None and version is not None:  # a transaction declares the whole sync first
            if not all(check.holds(b, raw) for b in range(len(plan.buckets))):
                plan = self._sync_plan_new(raw)
            check = None
        if version is not None:
            pid = 0 if self.transport == "nixl" else None  # no liveness check of a remote trainer
            check_replies(_resolve(send(_begin_text(version, plan.names, plan.nbytes, pid))))
        pending: deque = deque()  # (buffer set, replies to check), oldest first
        try:
            plan = self._sync_buckets(raw, plan, check, send, weight_version, stream, pending)
            if not wait:
                self._inflight = [r for _, r in pending]
                pending.clear()
                return len(plan.buckets)
            while pending:
                check_replies(pending.popleft()[1]())
        finally:
            for _, r in pending:  # a failure above: collect what is still in flight, quietly
                try:
                    r()
                except Exception:
                    pass
        self.wait(stream)
        return len(plan.buckets)

    def _sync_buckets(self, raw: list, plan: _SyncPlan, check: Optional[_SyncCheck], send: Send,
                      weight_version: Optional[str], stream: Optional[Any], pending: deque) -> _SyncPlan:
        """Stage, publish and send every bucket of `plan` through the buffer sets in turn; the
        plan as it ended (a cached plan whose check failed is made again from that bucket on)."""
        nsets = len(self._sets)
        # stage_first: bucket b+1 is staged (once its set is consumed) before bucket b is sent;
        # one buffer set cannot (its bucket is consumed only once sent), nor direct mode (it
        # waits for no set)
        stage_first = self.stage_first and nsets > 1 and self._mode.reuses_buffers
        turn0 = self._turn
        sent: set = set()  # names of the cached plan's buckets staged so far (for _sync_rest)
        keeps: dict = {}
        handles = self._handles(stream)

        def stage(b: int) -> None:
            nonlocal plan, check
            if check is not None and not check.holds(b, raw):
                # a tensor of this bucket moved or changed: plan what is left afresh
                fresh = self._sync_plan_new(raw)
                plan = fresh if b == 0 else self._sync_rest(plan, b, fresh, sent)
                check = None
            k = (turn0 + b) % nsets
            # a staged set's replies are checked before the set is reused; direct buckets reuse
            # nothing, so their replies are read at the end
            while self._mode.reuses_buffers and pending and (len(pending) >= nsets or pending[0][0] == k):
                check_replies(pending.popleft()[1]())
            per_rank, keep = plan.buckets[b]
            bp = plan.pairs[b] if plan.pairs is not None else None
            self._stage_set(k, per_rank, bp, handles, stream)
            if check is not None:
                sent.update(check.bucket_names[b])
            # the sources are views of the caller's tensors (`raw`): alive until consumed
            keeps[b] = [raw, *keep] if b == 0 or self._mode.reuses_buffers else keep

        def publish_send(b: int, then: Optional[int]) -> None:
            k = (turn0 + b) % nsets
            msgs = self._publish_set(k, keeps.pop(b), handles, finished=b == len(plan.buckets) - 1,
                                     weight_version=weight_version, replay=True)
            full = self._full
            try:
                if then is not None:  # the next bucket staged before this one is sent
                    stage(then)
            finally:  # a published bucket is always delivered: its set then waits for its consumed
                for j, m in enumerate(msgs):
                    r = send(m)
                    get = r if callable(r) else getattr(r, "result", None)  # a Future's result
                    if callable(get):
                        pending.append((k, lambda get=get, j=j: self._replayed(get(), full, j, send)))
                    else:
                        self._replayed(r, full, j, send)

        stage(0)
        b = 0
        while b < len(plan.buckets):
            more = b + 1 < len(plan.buckets)
            publish_send(b, b + 1 if stage_first and more else None)
            if more and not stage_first:
                stage(b + 1)
            b += 1
        return plan

    def close(self) -> None:
        """Retire every staging buffer (the engines must have released their mappings first:
        EngineWorker.release). Raises Busy while an engine still maps one."""
        for ptr in list(getattr(self, "_host", {})):
            if self._sets and self._sets[0].staging:
                err = _abi.Error.new()
                _native.check(self._ops.unregister_host(self._sets[0].staging[0], ptr, C.byref(err)), err)
            del self._host[ptr]
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
