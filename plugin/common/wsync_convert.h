/* Element conversions among bf16, f16, f32 and f64 for the host executor, and the reference the
 * CUDA kernel must reproduce bit for bit: every conversion rounds to nearest, ties to even, once
 * (no double rounding through an intermediate type); subnormals are kept, overflow gives inf,
 * NaN stays NaN (quiet, sign kept). Pure functions, thread safe. */
#ifndef WSYNC_CONVERT_H
#define WSYNC_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

/* 1 when the host executor converts `dt` (bf16, f16, f32, f64). */
int wsync_convert_is_float(wsync_dtype_t dt);

uint16_t wsync_f32_to_bf16(float x);
float wsync_bf16_to_f32(uint16_t h);
uint16_t wsync_f32_to_f16(float x);
float wsync_f16_to_f32(uint16_t h);
/* f64 → bf16 / f16 bits, rounded once. */
uint16_t wsync_f64_to_bf16(double x);
uint16_t wsync_f64_to_f16(double x);

/* Convert `n` elements from src (src_dt) to dst (dst_dt), multiplying by `scale` first (the
 * product is taken in double, then rounded once) unless scale == 1.0. Both float types; src and
 * dst may be unaligned; they must not overlap. */
void wsync_convert_row(void *dst, wsync_dtype_t dst_dt, const void *src, wsync_dtype_t src_dt,
                       size_t n, double scale);

#endif
