"""The model layer from Python: the HF tensor list (names, dtypes, shapes in checkpoint order)
that a Hugging Face config derives, by the C model layer (model/wsync_model.h; the same list
the CLI and the reference engine use)."""

from __future__ import annotations

import ctypes as C
import json
import os
from typing import Any, List, Mapping, Tuple, Union

import torch

from . import _abi, _native


def tensors_from_config(config: Union[str, os.PathLike, Mapping[str, Any], Any]) -> List[Tuple[str, torch.dtype, tuple]]:
    """[(HF name, dtype, shape)] of `config`: a transformers config, a dict, a config.json path,
    or its text. Raises InvalidArgument naming an unknown model_type or a missing size."""
    if hasattr(config, "to_dict"):
        text = json.dumps(config.to_dict())
    elif isinstance(config, Mapping):
        text = json.dumps(dict(config))
    elif isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        p = os.path.join(config, "config.json") if os.path.isdir(config) else config
        with open(p) as f:
            text = f.read()
    else:
        text = str(config)
    shim = _native.shim()
    err = _abi.Error.new()
    data = text.encode()
    out = shim.take_string(shim.model_tensors(data, len(data), C.byref(err)))
    if out is None:
        _native.check(err.code or 1, err)
    return [(t["name"], getattr(torch, t["dtype"]), tuple(t["shape"]))
            for t in json.loads(out)]


def inspect(model_dir: Union[str, os.PathLike], engine: str = "sglang") -> dict:
    """The tensor plan of a Hugging Face model directory (config.json and its safetensors,
    sharded or not), by the C checkpoint reader, nothing moved: {"model_type", "tensors",
    "bytes", "shards", "plan": [{"name", "dtype", "file_dtype", "shape", "bytes", "shard",
    "engine_param", "expert"}]}. Raises naming a tensor missing or of another shape."""
    shim = _native.shim()
    err = _abi.Error.new()
    out = shim.take_string(shim.checkpoint_plan(os.fspath(model_dir).encode(), engine.encode(), C.byref(err)))
    if out is None:
        _native.check(err.code or 1, err)
    return json.loads(out)
