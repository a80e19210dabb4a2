"""The engine side: an :class:`EngineWorker` wraps one engine rank's torch parameters (by
engine name: ``qkv_proj``, ``gate_up_proj``, ``w13_weight`` ...) and serves the engine's weight
update requests through the C shim of that engine. Mapping HF names to engine parameters,
tensor-parallel narrowing and every validation are the C shims' (one implementation for C and
Python engines); this class only tells them where each parameter lives.

Copies run in place (every ``data_ptr()`` stays) on the torch stream given, else the current
stream of the parameters' device when the request arrives.
"""

from __future__ import annotations

import ctypes as C
import operator
import weakref
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch

from . import _abi, _native, _torch, messages
from .errors import InvalidArgument, PluginUnavailable, check_reply


def dims_from_config(config: Any) -> _abi.ModelDims:
    """Model dimensions from a transformers config (or a dict with the same keys)."""
    get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
    hidden = int(get("hidden_size"))
    heads = int(get("num_attention_heads"))
    head_dim = get("head_dim") or hidden // heads
    return _abi.ModelDims(
        hidden=hidden,
        heads=heads,
        kv_heads=int(get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate=int(get("intermediate_size") or 0),
        experts=int(get("num_experts") or get("num_local_experts") or 0),
        moe_intermediate=int(get("moe_intermediate_size") or 0),
        vocab=int(get("vocab_size")),
    )


def _param_info(info: Any, name: str, t: torch.Tensor) -> None:
    info.ptr = t.data_ptr() or None
    info.dtype = _torch.dtype_code(name, t)
    info.ndim = t.dim()
    for k, n in enumerate(t.shape):
        info.shape[k] = n


def _u32(field: str, value: Any) -> int:
    """A rank or size as the engine table carries it (uint32): a negative or non-integer value
    would wrap there and be reported as 4294967295; the library checks rank against size."""
    try:
        v = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        v = None
    if v is None or not 0 <= v < 1 << 32:
        raise ValueError(f"{field} must be an integer in [0, 2**32), got {value!r}")
    return v


class EngineWorker:
    """One engine rank: ``params`` (a module's ``named_parameters()``, a mapping, or pairs) by
    engine name, this rank's ``tp_rank`` of ``tp_size``, the model ``config`` the fused layouts
    depend on. ``plugin`` as for C engines (None: ``WSYNC_PLUGIN`` or the default). ``verify``
    checks every wsync64 digest inside the copy. ``fp8_one_pass``: FP8 parameters quantized in one
    pass over the source, each block checked for NaN / infinity as it is quantized (a block
    holding one is left unwritten, the rest of the bucket lands, the request fails naming it and
    the version stays uncommitted), instead of a check of the whole bucket before anything is
    written (a second read of the source; docs/SHIMS.md, "FP8 parameters"). ``on_flush`` / ``on_post_load`` are the
    engine's cache-flush and post-load hooks; ``lora`` (a :class:`wsync.lora.LoraSlots`) the
    adapter slots that LoRA requests hot-load into. ``on_update_begin(version)`` /
    ``on_update_end(version, committed)`` bracket each weight version (docs/SHIMS.md, "Update
    transactions"): from the first bucket on the weights are mixed, so stop serving; serve again
    only once a version ends committed. ``rollback`` (True, or parameter names): those
    parameters are written through shadow copies that a commit copies into place, so a version
    that never commits leaves them exactly as they were (for groups small enough to hold twice:
    norms, adapters, a draft model). ``ep_rank`` of ``ep_size``: expert parallelism, this rank
    holds its share of the experts in the linear placement vLLM and SGLang use by default
    (docs/SHIMS.md), its fused expert parameters by local index, and the others' experts are
    skipped unread; ``moe_tp_rank`` of ``moe_tp_size``: the TP group the rank's experts are split
    over (default: ``tp_rank`` of ``tp_size`` without EP, 0 of 1 with it, as vLLM runs EP;
    SGLang's is ``tp_size // ep_size``). ``max_manifest_bytes`` / ``max_manifest_tensors``: the
    manifest limits checked before anything is parsed (0: 16 MiB and 65 536 tensors; raise them
    for a bigger bucket; docs/RELIABILITY.md, "Costs a manifest can impose")."""

    def __init__(
        self,
        params: Union[torch.nn.Module, _torch.NamedTensors],
        *,
        engine: str,
        config: Any,
        tp_rank: int = 0,
        tp_size: int = 1,
        plugin: Optional[str] = None,
        verify: bool = False,
        fp8_one_pass: bool = False,
        timeout_ms: int = 0,
        max_manifest_bytes: int = 0,
        max_manifest_tensors: int = 0,
        stream: Optional[Any] = None,
        on_flush: Optional[Callable[[], None]] = None,
        on_post_load: Optional[Callable[[], None]] = None,
        lora: Optional[Any] = None,
        on_update_begin: Optional[Callable[[int], None]] = None,
        on_update_end: Optional[Callable[[int, bool], None]] = None,
        rollback: Union[bool, Sequence[str]] = False,
        ep_rank: int = 0,
        ep_size: int = 1,
        moe_tp_rank: Optional[int] = None,
        moe_tp_size: Optional[int] = None,
        mapping: Optional[str] = None,
        device: Optional[Union[str, torch.device]] = None,
    ) -> None:
        named = params.named_parameters() if isinstance(params, torch.nn.Module) else params
        self.params = dict(_torch.items(named))
        self.mapping = mapping
        if mapping == "checkpoint":
            # The checkpoint layout: each HF tensor whole, into the tensor of its own name that
            # the caller puts in self.params before each request (looked up per request).
            if device is None:
                raise InvalidArgument(1, "EngineWorker", "mapping='checkpoint' needs device=")
            self.params = {}
            devices = {torch.device(device)}
        elif mapping is not None:
            raise InvalidArgument(1, "EngineWorker", f"unknown mapping {mapping!r}: use 'checkpoint' or None")
        elif not self.params:
            raise InvalidArgument(1, "EngineWorker", "no parameters")
        else:
            devices = {t.device for t in self.params.values()}
        if len(devices) != 1:
            raise InvalidArgument(1, "EngineWorker", f"parameters on several devices: {sorted(map(str, devices))}")
        self.device = devices.pop()
        for name, t in self.params.items():
            if not t.is_contiguous():
                raise InvalidArgument(1, "EngineWorker", f"parameter {name} is not contiguous: copies are in place")
            _torch.dtype_code(name, t)  # a dtype wsync has no type for is named here
        self.engine = engine
        self.tp_rank, self.tp_size = _u32("tp_rank", tp_rank), _u32("tp_size", tp_size)
        self.ep_rank, self.ep_size = _u32("ep_rank", ep_rank), _u32("ep_size", ep_size)
        if moe_tp_size is None:
            moe_tp_rank, moe_tp_size = (self.tp_rank, self.tp_size) if self.ep_size == 1 else (0, 1)
        self.moe_tp_rank = _u32("moe_tp_rank", moe_tp_rank or 0)
        self.moe_tp_size = _u32("moe_tp_size", moe_tp_size)
        self.stream = stream
        self._dims = dims_from_config(config)
        self._shim = _native.shim()
        self._keep = []  # callbacks stay alive as long as the worker
        self._on_update = (on_update_begin, on_update_end)
        ops = _abi.EngineOps(
            struct_size=C.sizeof(_abi.EngineOps),
            param=self._cb(_abi.ParamFn, self._param_cb) if mapping else _abi.ParamFn(),
            tp=self._cb(_abi.TpFn, self._tp),
            dims=self._cb(_abi.DimsFn, self._dims_cb),
            stream=self._cb(_abi.StreamFn, self._stream_cb),
            flush_cache=self._cb(_abi.HookFn, lambda _u: on_flush and on_flush()),
            post_load=self._cb(_abi.HookFn, lambda _u: on_post_load and on_post_load()),
            update_begin=self._cb(_abi.UpdateBeginFn, self._begin_cb),
            update_end=self._cb(_abi.UpdateEndFn, self._end_cb),
            moe=self._cb(_abi.MoeFn, self._moe),
        )
        self._shadows: dict = {}  # rollback mode: parameter name -> its shadow
        self.lora = lora  # a wsync.lora.LoraSlots: adapter requests load into it
        if lora is not None:
            ops.lora_slot = self._cb(_abi.LoraSlotFn, lora._slot)
            ops.lora_loaded = self._cb(_abi.LoraLoadedFn, lora._loaded)
            ops.lora_unloaded = self._cb(_abi.LoraNameFn, lora._unloaded)
            ops.reset_prefix_cache = self._cb(_abi.LoraNameFn, lora._reset)
        self._ops = ops
        cfg = _abi.WorkerConfig(
            struct_size=C.sizeof(_abi.WorkerConfig),
            engine=engine.encode(),
            plugin_path=plugin.encode() if plugin else None,
            ops=C.pointer(ops),
            device_ordinal=(self.device.index or 0) if self.device.type == "cuda" else 0,
            timeout_ms=timeout_ms,
            copy_flags=(_abi.COPY_VERIFY if verify else 0) | (_abi.COPY_QUANT_ONE_PASS if fp8_one_pass else 0),
            max_manifest_bytes=max_manifest_bytes,
            max_manifest_tensors=max_manifest_tensors,
        )
        # The parameters as a table: the C worker answers every look-up of the mapping itself
        # (no call into Python per tensor; a name outside the table is unknown to the engine).
        table = (_abi.ShimParam * len(self.params))()
        for i, (name, t) in enumerate(self.params.items()):
            table[i].name = name.encode()
            _param_info(table[i].info, name, t)
        cfg.params = table
        cfg.n_params = len(self.params)
        cfg.mapping = mapping.encode() if mapping else None
        w = C.c_void_p()
        err = _abi.Error.new()
        _native.check(self._shim.worker_open(C.byref(cfg), C.byref(w), C.byref(err)), err)
        self._w = w.value
        native = C.c_int()
        self.backend = self._shim.take_string(self._shim.worker_backend(self._w, C.byref(native)))
        if native.value:
            self._shim.worker_close(self._w)
            self._w = None
            raise PluginUnavailable(4, "EngineWorker", f"no usable wsync plugin ({self.backend})")
        # rollback mode: the named parameters (True: all) are written through shadows that a
        # commit copies into place, so a version that never commits leaves them as they were
        names = list(self.params) if rollback is True else list(rollback or [])
        unknown = [n for n in names if n not in self.params]
        if unknown:
            self.close()
            raise InvalidArgument(1, "EngineWorker", f"rollback names parameters the engine does not have: {unknown[:3]}")
        self._shadows = {n: torch.empty_like(self.params[n]) for n in names}
        if self._shadows:
            k = len(self._shadows)
            err = _abi.Error.new()
            _native.check(self._shim.worker_shadows(
                self._w, (C.c_void_p * k)(*[self.params[n].data_ptr() for n in self._shadows]),
                (C.c_void_p * k)(*[t.data_ptr() for t in self._shadows.values()]),
                (C.c_uint64 * k)(*[t.numel() * t.element_size() for t in self._shadows.values()]),
                k, C.byref(err)), err)
        if self.backend.startswith("cuda ") != (self.device.type == "cuda"):
            self._shim.worker_close(self._w)
            self._w = None
            raise InvalidArgument(
                1, "EngineWorker", f"parameters on {self.device} but the plugin is {self.backend}: "
                "pass plugin= (libwsync_cpu.so for CPU memory, libwsync_cuda.so for CUDA)"
            )

    # ----------------------------------------------------------------- callbacks

    def _cb(self, kind: Any, fn: Callable[..., Any]) -> Any:
        """A C callback of `kind` calling fn. A method of this worker is held weakly: the callbacks
        live on the worker, and a strong reference back would make the worker (and the parameters
        and shadows it holds) a cycle that only a collection frees, not the last reference."""
        if getattr(fn, "__self__", None) is self:
            method = weakref.WeakMethod(fn)

            def call(*a: Any) -> Any:  # a collector that finalizes a user's cycle drops the ref first
                m = method()
                return m(*a) if m is not None else None
            f = kind(call)
        else:
            f = kind(fn)
        self._keep.append(f)
        return f

    def _begin_cb(self, _user: int, version: int) -> None:
        self._begin(int(version), self._on_update[0])

    def _end_cb(self, _user: int, version: int, committed: int) -> None:
        self._end(int(version), bool(committed), self._on_update[1])

    def _begin(self, version: int, user: Optional[Callable[[int], None]]) -> None:
        if self._shadows:  # bytes a version does not write carry over from the parameter
            with _torch.on_stream(self.stream if self.device.type == "cuda" else None):
                for n, sh in self._shadows.items():
                    sh.copy_(self.params[n])
        if user is not None:
            user(version)

    def _end(self, version: int, committed: bool, user: Optional[Callable[[int, bool], None]]) -> None:
        if committed and self._shadows:  # the flip: one copy per shadowed parameter
            with _torch.on_stream(self.stream if self.device.type == "cuda" else None):
                for n, sh in self._shadows.items():
                    self.params[n].copy_(sh)
        if user is not None:
            user(version, committed)

    def _param_cb(self, _user: int, name: bytes, out: Any) -> int:
        t = self.params.get(name.decode())
        if t is None:
            return -1
        _param_info(out[0], name.decode(), t)
        return 0

    def _tp(self, _user: int, rank: Any, size: Any) -> None:
        rank[0] = self.tp_rank
        size[0] = self.tp_size

    def _moe(self, _user: int, ep_rank: Any, ep_size: Any, mtp_rank: Any, mtp_size: Any) -> None:
        ep_rank[0], ep_size[0] = self.ep_rank, self.ep_size
        mtp_rank[0], mtp_size[0] = self.moe_tp_rank, self.moe_tp_size

    def _dims_cb(self, _user: int, out: Any) -> None:
        C.memmove(out, C.byref(self._dims), C.sizeof(_abi.ModelDims))

    def _stream_cb(self, _user: int) -> Optional[int]:
        return _torch.stream_handle(self.device, self.stream)

    # ------------------------------------------------------------------- requests

    def handle(self, message: Union[str, bytes]) -> str:
        """Serve one request message; returns the reply JSON text. A refused request replies
        {"ok": false, "code", "error", "message"} and leaves every parameter as it was."""
        if self._w is None:
            raise InvalidArgument(1, "handle", "the worker is closed")
        data = message.encode() if isinstance(message, str) else bytes(message)
        rc = C.c_int()
        err = _abi.Error.new()
        reply = self._shim.take_string(self._shim.worker_serve(self._w, data, len(data), C.byref(rc), C.byref(err)))
        if reply is None:
            _native.check(rc.value or 5, err)
        return reply

    def apply(self, message: Union[str, bytes]) -> dict:
        """Serve one request and return the parsed reply; raise its WsyncError when refused."""
        return check_reply(self.handle(message))

    @property
    def opens(self) -> int:
        """Buffers and direct segments this worker has opened so far (a steady sync adds 0)."""
        return int(self._shim.worker_opens(self._w)) if self._w is not None else 0

    def state(self) -> dict:
        """The update state: ``{"state": "consistent" | "updating" | "partial", "consistent",
        "committed", "update": {version, buckets, tensors, bytes, expect_tensors, expect_bytes},
        "reason"}``. A version whose producer died is ended here (partial, never committed)."""
        return self.apply(messages.state())["txn"]

    def drain(self) -> None:
        """Wait for every copy enqueued on the engine's stream."""
        err = _abi.Error.new()
        _native.check(self._shim.worker_drain(self._w, C.byref(err)), err)

    def release(self) -> None:
        """Drain and close every mapping (then the trainer may retire its staging)."""
        err = _abi.Error.new()
        _native.check(self._shim.worker_release(self._w, C.byref(err)), err)

    def close(self) -> None:
        if self._w is not None:
            self._shim.worker_close(self._w)
            self._w = None

    def __enter__(self) -> EngineWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
