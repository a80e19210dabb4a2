"""The foreign path: tensors that live in the trainer's own torch storage, exported with torch's
own IPC handles (``UntypedStorage._share_cuda_``, what ``reduce_tensor`` sends), described in a
wsync manifest written by the C shim library from torch's handle bytes (``wsync.messages``) and
encoded for the engine by the C shims. No staging
copy: the engine's one batched copy reads the trainer's memory directly. The CUDA plugin opens
both of torch's handle forms ('c' cudaMalloc segments, 'e' expandable segments).

Contract: the exported tensors must not be written until the engine replied (its copies are
done when a request that drains, e.g. SGLang's flush_cache or vLLM's finish, returns), and their
storage must outlive the engine's mapping (keep the tensors; the engine's release() closes it).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from . import _torch, messages
from .errors import InvalidArgument
from .producer import encode_bucket


class TorchExport:
    """Exports groups of CUDA tensors that share one storage (e.g. a flattened bucket or a
    parameter) and encodes them for `engine` (one manifest for every engine rank)."""

    def __init__(self, engine: str = "sglang", *, tp_size: int = 1) -> None:
        self.engine = engine
        self.tp_size = tp_size
        self._gen: Dict[Tuple[bytes, int], int] = {}

    def manifest(self, named: _torch.NamedTensors, *, finished: bool = True) -> str:
        """The manifest (JSON text) naming `named`, all views of one CUDA storage."""
        pairs = _torch.items(named)
        if not pairs:
            raise InvalidArgument(1, "export", "nothing to export")
        storage = pairs[0][1].untyped_storage()
        dev = pairs[0][1].device
        if dev.type != "cuda":
            raise InvalidArgument(1, "export", f"tensor {pairs[0][0]} is on {dev}: torch handles are CUDA only")
        for name, t in pairs:
            if t.untyped_storage().data_ptr() != storage.data_ptr():
                raise InvalidArgument(1, "export", f"tensor {name} lives in another storage; export one storage at a time")
            if not t.is_contiguous():
                raise InvalidArgument(1, "export", f"tensor {name} is not contiguous")
        torch.cuda.current_stream(dev).synchronize()  # the manifest never precedes its bytes
        share = storage._share_cuda_()
        handle, size, offset = share[1], int(share[2]), int(share[3])
        key = (bytes(handle), offset)
        gen = self._gen.get(key, 0) + 1
        self._gen[key] = gen
        base = storage.data_ptr()
        tensors = [(name, _torch.dtype_name(t.dtype), list(t.shape), t.data_ptr() - base) for name, t in pairs]
        return messages.torch_manifest(bytes(handle), size, offset, _torch.device_uuid(dev), gen, finished, tensors)

    def messages(self, named: _torch.NamedTensors, *, first: bool = True, finished: bool = True,
                 weight_version: Optional[str] = None) -> List[str]:
        """The engine's request messages carrying `named` (one storage) to every rank."""
        m = self.manifest(named, finished=finished)
        return encode_bucket(self.engine, [m], first=first, finished=finished, weight_version=weight_version)
