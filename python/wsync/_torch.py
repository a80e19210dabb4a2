"""What the package needs from torch: dtype names, data pointers, the stream a caller means."""

from __future__ import annotations

import contextlib
import ctypes as C
import operator
from typing import Any, Iterable, Mapping, Optional, Tuple, Union

import torch

from . import _abi
from .errors import InvalidArgument

_second = operator.itemgetter(1)
NamedTensors = Union[Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]]


def items(named: NamedTensors) -> list:
    """(name, tensor) pairs of a state_dict, named_parameters() or an iterator of pairs."""
    pairs = list(named.items()) if isinstance(named, Mapping) else list(named)
    plain = torch.Tensor  # isinstance on Parameter runs a metaclass hook: ~10x a type check
    if set(map(type, map(_second, pairs))) <= {plain}:  # a state_dict: the pairs as they are
        return pairs
    return [(n, t if type(t) is plain else t.data if isinstance(t, torch.nn.Parameter) else t) for n, t in pairs]


def dtype_name(dtype: torch.dtype) -> str:
    """torch's name of a dtype as the manifest spells it ("bfloat16")."""
    return str(dtype).removeprefix("torch.")


def dtype_code(name: str, t: torch.Tensor) -> int:
    """The ABI's wsync_dtype_t for tensor `name`, or InvalidArgument naming it."""
    code = _abi.DTYPES.get(dtype_name(t.dtype))
    if code is None:
        raise InvalidArgument(
            1, "dtype", f"tensor {name}: dtype {t.dtype} has no wsync type; "
            f"use one of {', '.join(sorted(_abi.DTYPES))}"
        )
    return code


def shape_of(name: str, t: torch.Tensor) -> Tuple[int, Any]:
    if t.dim() > _abi.MAX_DIMS:
        raise InvalidArgument(1, "shape", f"tensor {name}: {t.dim()} dims, wsync takes at most {_abi.MAX_DIMS}")
    arr = (C.c_int64 * _abi.MAX_DIMS)(*t.shape)
    return t.dim(), arr


# torch's current stream as its cudaStream_t, without a torch.cuda.Stream object (what
# torch.compile's generated code calls per launch); torch.cuda.current_stream where it is missing
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device, stream: Optional[Any]) -> Optional[int]:
    """The cudaStream_t to pass: the given torch stream's, else torch's current stream on
    `device` (0, the legacy default stream, is passed as such); None for CPU tensors (the host
    plugin's own queue)."""
    if device.type != "cuda":
        return None
    if stream is not None:
        return int(stream.cuda_stream) or None
    if _raw_stream is not None and torch.cuda.is_initialized():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(_raw_stream(index)) or None
    return int(torch.cuda.current_stream(device).cuda_stream) or None


def on_stream(stream: Optional[Any]) -> Any:
    """A context that runs torch work on `stream` (a torch stream), or on the current stream when
    it is None."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def device_uuid(device: torch.device) -> str:
    """The "GPU-<uuid>" a manifest names, or "cpu"."""
    if device.type != "cuda":
        return "cpu"
    return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)


def normalize(device: torch.device | str) -> torch.device:
    """A device with its index (cuda -> cuda:<current>), as tensors report theirs."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d
