"""wsync's own request messages (the update transaction and the weight checker's request), as the
C shim library encodes them (``engine-shims/common/wsync_txn_msg.h``): the package writes no
message text itself."""

from __future__ import annotations

import ctypes as C
import os
from typing import Callable, List, Optional, Sequence, Tuple

from . import _abi, _native
from .errors import NotSupported


def _text(call: Callable[[C.c_void_p], Optional[int]]) -> str:
    shim = _native.shim()
    err = _abi.Error.new()
    text = shim.take_string(call(C.byref(err)))
    if text is None:
        _native.check(err.code or 16, err)
    return text


def _tensor_arrays(tensors: Sequence[tuple]) -> tuple:
    """The C arrays of ``(name, dtype name, shape, ...)`` tuples: names, dtypes, ndims and the
    dims concatenated."""
    shapes: List[int] = [int(d) for t in tensors for d in t[2]]
    return (_native.c_strings([t[0] for t in tensors]), _native.c_strings([t[1] for t in tensors]),
            (C.c_uint32 * max(len(tensors), 1))(*[len(t[2]) for t in tensors]),
            (C.c_int64 * max(len(shapes), 1))(*shapes))


def begin(version: int, names: Sequence[str], nbytes: int, pid: Optional[int] = None) -> str:
    """Open update transaction `version` on every engine rank, declaring the tensors (HF names)
    and bytes the sync will send; the producer's process (default: this one) ends the version
    when it dies."""
    arr = _native.c_strings(list(names))
    return _text(lambda e: _native.shim().encode_begin(int(version), os.getpid() if pid is None else int(pid),
                                                       arr, len(names), int(nbytes), e))


def commit(version: int = 0) -> str:
    """Commit update transaction `version` (0: the one begun)."""
    return _text(lambda e: _native.shim().encode_commit(int(version), e))


def abort(reason: str) -> str:
    """End the open update transaction unfinished (reported partial, never committed)."""
    return _text(lambda e: _native.shim().encode_abort(reason.encode(), e))


def state() -> str:
    """Ask each engine rank for its update state."""
    return _text(lambda e: _native.shim().encode_state(e))


def check(tensors: Sequence[tuple]) -> str:
    """Ask each engine rank for its digests of these tensors: ``(name, dtype name, shape)``."""
    names, dtypes, ndims, dims = _tensor_arrays(tensors)
    return _text(lambda e: _native.shim().encode_check(names, dtypes, ndims, dims, len(tensors), e))


def plan_forms(manifest: str) -> Optional[Tuple[str, str, str]]:
    """``(plan id, full, replay)`` of a manifest as publish returned it: `full` records the
    bucket's plan on the engine under the id, `replay` replays it (no tensors). None for a
    manifest with digests, which is sent in full every time."""
    shim = _native.shim()
    data = manifest.encode()
    ident = C.create_string_buffer(_abi.PLAN_ID_MAX + 1)
    full, replay = C.c_void_p(), C.c_void_p()
    err = _abi.Error.new()
    rc = shim.plan_forms(data, len(data), ident, C.byref(full), C.byref(replay), C.byref(err))
    if rc == NotSupported.code:
        return None
    _native.check(rc, err)
    return ident.value.decode(), shim.take_string(full.value), shim.take_string(replay.value)


def torch_manifest(handle: bytes, nbytes: int, offset: int, device: str, generation: int, finished: bool,
                   tensors: Sequence[tuple], pid: Optional[int] = None) -> str:
    """The manifest of tensors in one torch CUDA storage named by torch's own IPC `handle`
    (``UntypedStorage._share_cuda_``'s bytes; `nbytes`, `offset`: its shared range and the
    storage's offset in it): each tensor ``(name, dtype name, shape, byte offset)``."""
    names, dtypes, ndims, dims = _tensor_arrays(tensors)
    offs = (C.c_uint64 * max(len(tensors), 1))(*[int(t[3]) for t in tensors])
    return _text(lambda e: _native.shim().encode_torch_manifest(
        bytes(handle), len(handle), int(nbytes), int(offset), os.getpid() if pid is None else int(pid),
        device.encode(), int(generation), int(bool(finished)), names, dtypes, ndims, dims, offs, len(tensors), e))
