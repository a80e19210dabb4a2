"""ctypes mirrors of ``abi/wsync_abi_v1.h`` and ``engine-shims/common/wsync_registry.h``.

Layouts only: every rule lives in the C plugin and shims. Field order and types follow the
frozen header exactly; ``tests/python/test_abi_layout.py`` checks the sizes against the C
compiler's.
"""

from __future__ import annotations

import ctypes as C

MAX_DIMS = 8
HANDLE_MAX = 128
DEVICE_MAX = 64
PLAN_ID_MAX = 64  # a manifest's plan id (0.1.10)
ERROR_MESSAGE_LEN = 320
ERROR_WHERE_LEN = 64
ABI_VERSION = 1

COPY_VERIFY = 0x1
COPY_QUANT_ONE_PASS = 0x2  # copy_quantized: the NaN check rides in the quantizing pass (0.1.4)
STAGING_FIXED_LAYOUT = 0x1
STAGING_NO_DIGESTS = 0x2
STAGING_DIRECT = 0x4
STAGING_NIXL = 0x8  # appended in 0.1.9: the buckets are pulled over NIXL

# wsync_dtype_t: values fixed by the ABI.
DTYPES = {
    "bfloat16": 1,
    "float16": 2,
    "float32": 3,
    "float64": 4,
    "int8": 5,
    "uint8": 6,
    "int16": 7,
    "int32": 8,
    "int64": 9,
    "bool": 10,
    "float8_e4m3fn": 11,
    "float8_e5m2": 12,
}


class Error(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("code", C.c_int),
        ("where", C.c_char * ERROR_WHERE_LEN),
        ("message", C.c_char * ERROR_MESSAGE_LEN),
        ("op", C.c_uint64),  # appended in 0.1.8: the failing op's index, when op_valid
        ("op_valid", C.c_uint32),
    ]

    @classmethod
    def new(cls) -> Error:
        e = cls()
        e.struct_size = C.sizeof(cls)
        return e


LogFn = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_char_p, C.c_int, C.c_char_p)


class Host(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("log", C.c_void_p),
        ("log_user", C.c_void_p),
        ("log_level", C.c_int),
    ]


class StagingConfig(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("bytes", C.c_uint64),
        ("device_ordinal", C.c_int),
        ("flags", C.c_uint32),
        ("timeout_ms", C.c_uint32),
    ]


class StageTensor(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("name", C.c_char_p),
        ("dtype", C.c_int),
        ("ndim", C.c_uint32),
        ("shape", C.c_int64 * MAX_DIMS),
        ("src", C.c_void_p),
        ("src_dtype", C.c_int),  # 0.1.5: the dtype at src, converted by the stage (0: dtype)
    ]


_R = C.c_int  # wsync_result_t
_P = C.c_void_p
_E = C.POINTER(Error)


class ProducerOps(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("abi_version", C.c_uint32),
        ("create", C.CFUNCTYPE(_R, C.POINTER(StagingConfig), C.POINTER(_P), _E)),
        ("stage", C.CFUNCTYPE(_R, _P, _P, C.POINTER(StageTensor), C.c_size_t, _E)),
        (
            "publish",
            C.CFUNCTYPE(_R, _P, _P, C.c_int, C.POINTER(C.c_char_p), C.POINTER(C.c_uint64), _E),
        ),
        ("wait_consumed", C.CFUNCTYPE(_R, _P, _P, C.c_uint64, _E)),
        ("retire", C.CFUNCTYPE(_R, _P, _E)),
        ("stream_create", C.CFUNCTYPE(_R, _P, C.POINTER(_P), _E)),
        ("stream_destroy", C.CFUNCTYPE(_R, _P, _P, _E)),
        ("stream_synchronize", C.CFUNCTYPE(_R, _P, _P, _E)),
        ("read_back", C.CFUNCTYPE(_R, _P, C.c_uint64, _P, C.c_size_t, _E)),
        ("register_host", C.CFUNCTYPE(_R, _P, _P, C.c_uint64, _E)),  # 0.1.5
        ("unregister_host", C.CFUNCTYPE(_R, _P, _P, _E)),  # 0.1.5
    ]


class CopyOp(C.Structure):
    _fields_ = [
        ("src_offset", C.c_uint64),
        ("src_pitch", C.c_uint64),
        ("dst", C.c_void_p),
        ("dst_pitch", C.c_uint64),
        ("dst_extent", C.c_uint64),
        ("rows", C.c_uint64),
        ("row_bytes", C.c_uint64),
        ("digest", C.c_uint64),
        ("has_digest", C.c_int),
    ]


class ConsumerConfig(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("device_ordinal", C.c_int),
        ("timeout_ms", C.c_uint32),
        ("max_manifest_bytes", C.c_uint64),
        ("max_manifest_tensors", C.c_uint64),
    ]


class ConsumerOps(C.Structure):
    """The members Python calls (the weight checker's digests), the others as pointers."""
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("abi_version", C.c_uint32),
        ("create", C.CFUNCTYPE(_R, C.POINTER(ConsumerConfig), C.POINTER(_P), _E)),
        ("parse_manifest", C.c_void_p),
        ("manifest_free", C.c_void_p),
        ("open_handle", C.c_void_p),
        ("close_handle", C.c_void_p),
        ("copy_weights", C.c_void_p),
        ("record_consumed", C.c_void_p),
        ("hot_load_adapter", C.c_void_p),
        ("enqueue_host_fn", C.c_void_p),
        ("finalize", C.CFUNCTYPE(_R, _P, _E)),
        ("stream_create", C.c_void_p),
        ("stream_destroy", C.c_void_p),
        ("stream_synchronize", C.c_void_p),
        ("unload_adapter", C.c_void_p),
        ("mem_alloc", C.c_void_p),
        ("mem_free", C.c_void_p),
        ("mem_copy", C.c_void_p),
        ("copy_segments", C.c_void_p),
        ("digest_regions", C.CFUNCTYPE(_R, _P, _P, C.POINTER(CopyOp), C.c_size_t, C.POINTER(C.c_uint64), _E)),
        ("copy_quantized", C.c_void_p),
    ]


class Plugin(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("abi_version", C.c_uint32),
        ("name", C.c_char_p),
        ("version", C.c_char_p),
        ("consumer", C.POINTER(ConsumerOps)),
        ("producer", C.POINTER(ProducerOps)),
    ]


PluginInit = C.CFUNCTYPE(_R, C.POINTER(C.c_uint32), C.POINTER(Host), C.POINTER(C.POINTER(Plugin)), _E)


# ------------------------------------------------------------------ engine registry


class ParamInfo(C.Structure):
    _fields_ = [
        ("ptr", C.c_void_p),
        ("dtype", C.c_int),
        ("ndim", C.c_uint32),
        ("shape", C.c_int64 * MAX_DIMS),
    ]


class ModelDims(C.Structure):
    _fields_ = [
        ("hidden", C.c_int64),
        ("heads", C.c_int64),
        ("kv_heads", C.c_int64),
        ("head_dim", C.c_int64),
        ("intermediate", C.c_int64),
        ("experts", C.c_int64),
        ("moe_intermediate", C.c_int64),
        ("vocab", C.c_int64),
    ]


class AdapterPart(C.Structure):
    _fields_ = [("hf_module", C.c_char_p), ("out_offset", C.c_int64), ("out_features", C.c_int64)]


class AdapterTarget(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("module", C.c_char_p),
        ("dtype", C.c_int),
        ("in_features", C.c_int64),
        ("out_features", C.c_int64),
        ("lora_a", C.c_void_p * 2),
        ("lora_b", C.c_void_p * 2),
        ("scaling", C.c_float * 2),
        ("rank", C.c_uint32 * 2),
        ("n_parts", C.c_size_t),
        ("parts", C.POINTER(AdapterPart)),
    ]


class AdapterSlot(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("adapter_name", C.c_char_p),
        ("max_rank", C.c_uint32),
        ("n_targets", C.c_size_t),
        ("targets", C.POINTER(AdapterTarget)),
        ("active", C.POINTER(C.c_int)),
    ]


LoraSlotFn = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_char_p, C.c_int)
LoraLoadedFn = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p, C.c_void_p)
LoraNameFn = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p)

ParamFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_char_p, C.POINTER(ParamInfo))
TpFn = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(C.c_uint32), C.POINTER(C.c_uint32))
DimsFn = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(ModelDims))
StreamFn = C.CFUNCTYPE(C.c_void_p, C.c_void_p)
HookFn = C.CFUNCTYPE(None, C.c_void_p)


UpdateBeginFn = C.CFUNCTYPE(None, C.c_void_p, C.c_uint64)
UpdateEndFn = C.CFUNCTYPE(None, C.c_void_p, C.c_uint64, C.c_int)
MoeFn = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(C.c_uint32), C.POINTER(C.c_uint32), C.POINTER(C.c_uint32),
                    C.POINTER(C.c_uint32))


class EngineOps(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("user", C.c_void_p),
        ("param", ParamFn),
        ("tp", TpFn),
        ("dims", DimsFn),
        ("stream", StreamFn),
        ("flush_cache", HookFn),
        ("post_load", HookFn),
        ("native_copy", C.c_void_p),
        ("lora_slot", LoraSlotFn),
        ("lora_loaded", LoraLoadedFn),
        ("lora_unloaded", LoraNameFn),
        ("reset_prefix_cache", LoraNameFn),
        ("update_begin", UpdateBeginFn),
        ("update_end", UpdateEndFn),
        ("moe", MoeFn),
    ]


class ShimParam(C.Structure):
    _fields_ = [("name", C.c_char_p), ("info", ParamInfo)]


class WorkerConfig(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("engine", C.c_char_p),
        ("plugin_path", C.c_char_p),
        ("ops", C.POINTER(EngineOps)),
        ("device_ordinal", C.c_int),
        ("timeout_ms", C.c_uint32),
        ("copy_flags", C.c_uint32),
        ("log", C.c_void_p),
        ("log_user", C.c_void_p),
        ("log_level", C.c_int),
        ("params", C.POINTER(ShimParam)),
        ("n_params", C.c_size_t),
        ("mapping", C.c_char_p),
        ("max_manifest_bytes", C.c_uint64),
        ("max_manifest_tensors", C.c_uint64),
    ]
