"""The torch-handle manifest (wsync.export's foreign path) is written by the C shim library from
torch's handle bytes: a 'c' handle (a cudaMalloc segment) becomes a cuda_ipc buffer of the 64 IPC
bytes, an 'e' handle (expandable segments) a torch_expandable one, both as parse_manifest reads
torch's bytes; bad input is refused naming the value. Synthetic handle bytes: no GPU needed."""

from __future__ import annotations

import base64
import json
import struct

import pytest
import wsync
from wsync import messages

TENSORS = [("model.layers.0.self_attn.q_proj.weight", "bfloat16", [8, 4], 0),
           ("model.norm.weight", "float32", [4], 256)]


def test_cuda_malloc_handle():
    ipc = bytes(range(64))
    text = messages.torch_manifest(b"\x02c" + ipc, 4096, 512, "GPU-0000", 3, True, TENSORS, pid=1234)
    m = json.loads(text)
    b = m["buffer"]
    assert b["kind"] == "cuda_ipc" and base64.b64decode(b["handle"]) == ipc
    assert (b["bytes"], b["offset"], b["pid"], b["device"]) == (4096, 512, 1234, "GPU-0000")
    assert m["generation"] == 3 and m["finished"] is True
    assert [(t["name"], t["dtype"], t["shape"], t["offset"], t["nbytes"]) for t in m["tensors"]] == [
        ("model.layers.0.self_attn.q_proj.weight", "bfloat16", [8, 4], 0, 64),
        ("model.norm.weight", "float32", [4], 256, 16)]


def test_expandable_handle():
    payload = struct.pack("<iIQQ", 4321, 0, 1 << 21, 2) + struct.pack("<ii", 7, 8)
    m = json.loads(messages.torch_manifest(b"\x02e" + payload, 1 << 22, 0, "GPU-0000", 1, False, TENSORS[:1]))
    assert m["buffer"]["kind"] == "torch_expandable" and base64.b64decode(m["buffer"]["handle"]) == payload


@pytest.mark.parametrize("handle, tensors, needle", [
    (b"\x03c" + bytes(64), TENSORS, "version"),
    (b"\x02c" + bytes(10), TENSORS, "64"),
    (b"\x02c" + bytes(64), [("w", "float128", [2], 0)], "float128"),
])
def test_bad_input_is_named(handle, tensors, needle):
    with pytest.raises(wsync.WsyncError) as e:
        messages.torch_manifest(handle, 4096, 0, "GPU-0000", 1, True, tensors)
    assert needle in str(e.value), str(e.value)
