/* FP8 e4m3fn on the host: the conversion from float that PyTorch's `.to(torch.float8_e4m3fn)`
 * performs (round to nearest even, saturating at +-448, NaN to 0x7f / 0xff), and the 128 x 128
 * block quantizer of the DeepSeek-V3 / Qwen3-FP8 checkpoint layout, as DeepGEMM's
 * per_block_cast_to_fp8 defines it (the reference vLLM's and SGLang's FP8 tests use): per block,
 * amax = max |x| in float, clamped to at least 1e-4 (an all-zero block), each value x * (448 /
 * amax) cast to e4m3fn, 448 / amax computed as torch does it, (1 / amax) x 448 in float, and the
 * block's scale (weight_scale_inv) amax / 448 as torch computes it on a CUDA tensor, the way the
 * engines run it: amax x (1 / 448), the reciprocal rounded to float (a division by a scalar is a
 * multiplication by its reciprocal there; on the CPU torch divides, which differs in the last bit
 * for about half the blocks). Bit-identical to that reference (tests/unit/common/fp8_vectors.py).
 * Pure functions; thread safe. */
#ifndef WSYNC_COMMON_FP8_H
#define WSYNC_COMMON_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

#define WSYNC_FP8_E4M3_MAX 448.0f
#define WSYNC_FP8_E4M3_INV_MAX (1.0f / 448.0f) /* rounded to float, as torch's host code does */
#define WSYNC_FP8_BLOCK 128
#define WSYNC_FP8_CHANNEL_MIN_SCALE (1.0f / (448.0f * 512.0f)) /* vLLM's min_scaling_factor */

uint8_t wsync_fp8_e4m3fn(float f);

/* Quantize src (rows x cols, row-major, bf16, f16 or f32) into dst (rows x cols e4m3fn bytes) and
 * scales (ceil(rows / block) x ceil(cols / block) floats, row-major). Returns 0, or -1 when a
 * value is NaN or infinite, with *bad its element index (nothing is promised about dst then). */
int wsync_fp8_quantize_blocks(const void *src, wsync_dtype_t dtype, int64_t rows, int64_t cols,
                              int64_t block, uint8_t *dst, float *scales, int64_t *bad);

/* The first NaN or infinite value of rows x cols elements at src (rows src_pitch bytes apart):
 * -1 with its row and column, else 0. */
int wsync_fp8_find_bad(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                       int64_t cols, int64_t *bad_row, int64_t *bad_col);
/* The block quantizer over pitched memory: rows x cols at src (src_pitch bytes apart) into dst
 * (dst_pitch apart) and each block's float scale at scales + (row block) x scale_pitch + (column
 * block) x 4 (unaligned stores). A block holding a NaN or infinite value is left as it was: -1
 * with the first such value's row and column (row-major), else 0. */
int wsync_fp8_quantize_2d(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                          int64_t cols, int64_t block, uint8_t *dst, uint64_t dst_pitch,
                          unsigned char *scales, uint64_t scale_pitch, int64_t *bad_row,
                          int64_t *bad_col);

/* vLLM's per-channel (dynamic per-token) quantizer over rows x cols at src into dst, one float
 * scale per row at scales + row x scale_pitch: scale = max(amax / 448, 1 / (448 x 512)), each
 * value fmaxf(-448, fminf(x / scale, 448)) cast. A row holding a NaN or infinite value is left as
 * it was: -1 with the first such value's row and column, else 0. */
int wsync_fp8_quantize_rows(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                            int64_t cols, uint8_t *dst, uint64_t dst_pitch, unsigned char *scales,
                            uint64_t scale_pitch, int64_t *bad_row, int64_t *bad_col);
/* vLLM's per-tensor quantizer (dynamic scaled_fp8_quant), in its pieces, for a tensor of several
 * regions: *amax raised to max |x| over rows x cols at src (-1 with the first non-finite value's
 * row and column, *amax then unchanged); the scale amax / 448; each value fmaxf(-448, fminf(x x
 * (1 / scale), 448)) cast (scale 0, an all-zero tensor: every byte 0x7e, as vLLM's kernel). */
int wsync_fp8_amax(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                   int64_t cols, float *amax, int64_t *bad_row, int64_t *bad_col);
float wsync_fp8_tensor_scale(float amax);
void wsync_fp8_quantize_tensor(const void *src, uint64_t src_pitch, wsync_dtype_t dtype,
                               int64_t rows, int64_t cols, float scale, uint8_t *dst,
                               uint64_t dst_pitch);

/* What a NaN leaves unwritten, for messages: "the 128 x 128 block", "the row" (CHANNEL), "the
 * tensor (every op sharing its scale)" (TENSOR). */
const char *wsync_fp8_unit(uint32_t kind);

/* Every quantized op of a copy_quantized call (wsync_quant_v1_t; plain ops skipped), sources at
 * src_base + op.src_offset, in one pass: a 128 x 128 block, a row (CHANNEL) or a whole tensor (the
 * TENSOR ops sharing a scale_dst, found by sorting) holding a NaN or infinity is left as it was.
 * -1 with the least such op index and that op's row and column, else 0. scratch: n entries. */
typedef struct wsync_fp8_ref {
    uintptr_t scale;
    size_t op;
} wsync_fp8_ref_t;
/* qsort order of wsync_fp8_ref_t: by scale, then op (the ops of one per-tensor scale together) */
int wsync_fp8_ref_cmp(const void *a, const void *b);
int wsync_fp8_quantize_ops(const uint8_t *src_base, const wsync_copy_op_t *ops,
                           const wsync_quant_t *quant, size_t n, wsync_fp8_ref_t *scratch,
                           size_t *bad_op, int64_t *bad_row, int64_t *bad_col);

#endif
