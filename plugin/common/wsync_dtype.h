/* Element types: sizes and PyTorch wire names. */
#ifndef WSYNC_COMMON_DTYPE_H
#define WSYNC_COMMON_DTYPE_H

#include <stddef.h>
#include "wsync_abi.h"

/* 0 for WSYNC_DTYPE_INVALID or an unknown value. */
size_t wsync_dtype_size(wsync_dtype_t dt);
/* "bfloat16", "float32", ...; "invalid" for unknown values. */
const char *wsync_dtype_name(wsync_dtype_t dt);
/* Accepts PyTorch names ("bfloat16", "float16", "float32", "float64", "int8", "uint8", "int16",
 * "int32", "int64", "bool", "float8_e4m3fn", "float8_e5m2") and the "torch." prefixed forms, plus
 * safetensors names ("BF16", "F16", "F32", "F64", "I8", "U8", "I16", "I32", "I64", "BOOL",
 * "F8_E4M3", "F8_E5M2"). WSYNC_DTYPE_INVALID when unknown. */
wsync_dtype_t wsync_dtype_from_name(const char *name);

/* nbytes = size(dt) x prod(shape) with overflow checking. Returns 0 on success, -1 on overflow
 * or a negative dimension (*out untouched). ndim 0 is a scalar (one element). */
int wsync_tensor_nbytes(wsync_dtype_t dt, uint32_t ndim, const int64_t *shape, uint64_t *out);

#endif
