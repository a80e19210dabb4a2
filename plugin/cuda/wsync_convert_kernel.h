/* The adapter executor's kernel: one launch runs a table of 2-D ops, each a zero fill, a plain
 * copy or a dtype conversion (bf16, f16, f32, f64; optional scale), with round-to-nearest-even
 * results bit-identical to plugin/common/wsync_convert.c. Work is dealt in tiles of
 * WSYNC_CUDA_CONV_TILE units (a prefix sum over the ops gives each op its first tile) over a
 * persistent grid. C-callable; no state; thread safe. */
#ifndef WSYNC_CONVERT_KERNEL_H
#define WSYNC_CONVERT_KERNEL_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "wsync_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WSYNC_CUDA_CONV_TILE 4096u

enum { WSYNC_CUDA_CONV_ZERO = 0, WSYNC_CUDA_CONV_COPY = 1, WSYNC_CUDA_CONV_CONVERT = 2 };
#define WSYNC_CUDA_CONV_SRC_UNALIGNED 0x1u /* convert: load elements byte by byte */
#define WSYNC_CUDA_CONV_DST_UNALIGNED 0x2u /* convert: store elements byte by byte */

/* One planned op (device-resident table); built by wsync_cuda_conv_plan_* only. A unit is
 * `unit` bytes (zero/copy: the widest access that alignment allows) or one element (convert). */
typedef struct wsync_cuda_conv_op {
    const unsigned char *src;
    unsigned char *dst;
    uint64_t src_pitch, dst_pitch; /* bytes */
    uint64_t rows, units_per_row;
    uint64_t tile_begin, tile_end;
    double scale;
    uint32_t unit;
    uint8_t mode, src_dtype, dst_dtype, flags;
} wsync_cuda_conv_op_t;

/* Plan `rows` x `cols` elements converted src_dtype -> dst_dtype (times scale unless 1.0), both
 * float dtypes. Returns the op's tile count. */
uint64_t wsync_cuda_conv_plan_copy(wsync_cuda_conv_op_t *op, const void *src, wsync_dtype_t src_dt,
                                   uint64_t src_pitch, void *dst, wsync_dtype_t dst_dt,
                                   uint64_t dst_pitch, uint64_t rows, uint64_t cols, double scale,
                                   uint64_t tile_begin);
/* Plan `rows` x `row_bytes` zero bytes. Returns the op's tile count. */
uint64_t wsync_cuda_conv_plan_zero(wsync_cuda_conv_op_t *op, void *dst, uint64_t dst_pitch,
                                   uint64_t rows, uint64_t row_bytes, uint64_t tile_begin);

/* Enqueue the ops (device table, total_tiles = the last op's tile_end) on `stream`. */
cudaError_t wsync_cuda_launch_convert(const wsync_cuda_conv_op_t *ops, uint32_t n_ops,
                                      uint64_t total_tiles, int sm_count, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
