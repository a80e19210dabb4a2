"""The ctypes mirrors (wsync/_abi.py) have the C compiler's sizes and member offsets."""

from __future__ import annotations

import ctypes as C
import os
import shutil
import subprocess

import pytest
from wsync import _abi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRUCTS = {
    "wsync_error_t": (_abi.Error, ["code", "where", "message", "op", "op_valid"]),
    "wsync_host_t": (_abi.Host, ["log", "log_user", "log_level"]),
    "wsync_staging_config_t": (_abi.StagingConfig, ["bytes", "device_ordinal", "flags", "timeout_ms"]),
    "wsync_stage_tensor_t": (_abi.StageTensor, ["name", "dtype", "ndim", "shape", "src"]),
    "wsync_producer_ops_t": (_abi.ProducerOps, ["stage", "publish", "wait_consumed", "retire", "read_back"]),
    "wsync_plugin_t": (_abi.Plugin, ["name", "version", "consumer", "producer"]),
    "wsync_copy_op_t": (_abi.CopyOp, ["src_offset", "dst", "rows", "row_bytes", "digest", "has_digest"]),
    "wsync_consumer_config_t": (_abi.ConsumerConfig, ["device_ordinal", "timeout_ms", "max_manifest_tensors"]),
    "wsync_consumer_ops_t": (_abi.ConsumerOps, ["create", "finalize", "mem_copy", "copy_segments", "digest_regions",
                                                  "copy_quantized"]),
    "wsync_param_info_t": (_abi.ParamInfo, ["ptr", "dtype", "ndim", "shape"]),
    "wsync_model_dims_t": (_abi.ModelDims, ["kv_heads", "vocab"]),
    "wsync_engine_ops_t": (_abi.EngineOps, ["param", "tp", "dims", "stream", "post_load", "reset_prefix_cache",
                                             "update_begin", "update_end", "moe"]),
    "wsync_shim_param_t": (_abi.ShimParam, ["name", "info"]),
    "wsync_shim_worker_config_t": (_abi.WorkerConfig, ["engine", "ops", "copy_flags", "log_level", "params", "n_params"]),
}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_layouts_match_the_c_headers(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "wsync_shim_api.h"', "int main(void) {"]
    for ctype, (_, members) in STRUCTS.items():
        lines.append(f'printf("{ctype} size %zu\\n", sizeof({ctype}));')
        for m in members:
            lines.append(f'printf("{ctype}.{m} %zu\\n", offsetof({ctype}, {m}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    inc = [f"-I{ROOT}/{d}" for d in ("abi", "engine-shims/common", "engine-shims/api")]
    subprocess.run(["cc", "-std=gnu11", *inc, str(src), "-o", str(exe)], check=True)
    got = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                               check=True).stdout.splitlines())
    for ctype, (py, members) in STRUCTS.items():
        assert int(got[f"{ctype} size"]) == C.sizeof(py), ctype
        for m in members:
            assert int(got[f"{ctype}.{m}"]) == getattr(py, m).offset, f"{ctype}.{m}"
