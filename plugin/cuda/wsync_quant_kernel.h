/* The FP8 kernels of copy_quantized (wsync_abi_v1.h, wsync_quant_v1_t): a scan that finds the
 * first NaN or infinite value of the quantized sources (before anything is written, unless the
 * call asks for WSYNC_COPY_QUANT_ONE_PASS) and takes each per-tensor scale's amax, and the
 * quantizer, bit-identical to the host's (plugin/common/wsync_fp8.h): per 128 x 128 block amax,
 * (1 / amax) x 448 in float, each value cast to e4m3fn (nearest even, saturating), the scale amax
 * x (1 / 448); per row (CHANNEL) and per tensor (TENSOR) vLLM's arithmetic. C-callable. */
#ifndef WSYNC_QUANT_KERNEL_H
#define WSYNC_QUANT_KERNEL_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "wsync_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One quantizing op on the device. rows and cols below 2^22 (the scan's key). Its work units:
 * 128 x 128 blocks (BLOCK, TENSOR: brows x bcols of them), or rows (CHANNEL: brows = rows,
 * bcols = 1). */
typedef struct wsync_cuda_qop {
    const unsigned char *src;
    unsigned char *dst;
    unsigned char *scales; /* TENSOR: its one float, written by the op with `first` */
    uint64_t src_pitch, dst_pitch, scale_pitch;
    uint32_t rows, cols;
    uint32_t src_dtype; /* wsync_dtype_t: bf16, f16 or f32 */
    uint32_t brows, bcols;
    uint32_t kind;        /* WSYNC_QUANT_FP8_BLOCK, _CHANNEL, _TENSOR */
    uint32_t row_warps;   /* CHANNEL: warps per row (wsync_cuda_qop_row_warps), 0: one row a CTA */
    uint32_t group;       /* TENSOR: its scale's index in the launch's amax table */
    uint32_t first;       /* TENSOR: the first op of its group (writes the scale) */
    uint64_t block_begin; /* the op's first unit in the launch's flat unit index */
} wsync_cuda_qop_t;

#ifdef __CUDACC__
#define WSYNC_CUDA_QHD __host__ __device__
#else
#define WSYNC_CUDA_QHD
#endif

/* Whether op's rows are read in 16-byte vectors: a 16-bit source with 16-byte aligned rows, and
 * 8-byte aligned destination rows. */
static inline WSYNC_CUDA_QHD int wsync_cuda_qop_vectors(const wsync_cuda_qop_t *op)
{
    return (op->src_dtype == WSYNC_DTYPE_BF16 || op->src_dtype == WSYNC_DTYPE_F16) &&
           ((((uintptr_t)op->src | op->src_pitch) & 15u) |
            (((uintptr_t)op->dst | op->dst_pitch) & 7u) | (op->cols & 7u)) == 0;
}

/* A CTA of 8 warps quantizes 8 / w CHANNEL rows at once, w warps a row, each lane holding up to
 * 8 vectors of it in registers: w the least of 1, 2, 4, 8 that holds the row (up to 16 384
 * columns). 0 (a row per CTA, read twice, from L2 the second time) for other rows. */
#define WSYNC_CUDA_QROW_VECS 8u
static inline WSYNC_CUDA_QHD uint32_t wsync_cuda_qop_row_warps(const wsync_cuda_qop_t *op)
{
    if (!wsync_cuda_qop_vectors(op))
        return 0;
    const uint32_t nv = op->cols / 8u;
    for (uint32_t w = 1; w <= 8; w *= 2)
        if (nv <= w * 32u * WSYNC_CUDA_QROW_VECS)
            return w;
    return 0;
}

/* an amax table entry whose tensor is not finite */
#define WSYNC_CUDA_QUANT_BAD_GROUP 0xffffffffu

#define WSYNC_CUDA_QUANT_MAX_DIM (1u << 22)
#define WSYNC_CUDA_QUANT_NO_BAD 0xffffffffffffffffull

/* *first_bad (device, set to WSYNC_CUDA_QUANT_NO_BAD by the caller) becomes the least key
 * op << 44 | row << 22 | col of a NaN or infinite source value; each TENSOR op raises
 * amax[op.group] (float bits, zeroed by the caller) to its sources' max |x|, or sets it to
 * WSYNC_CUDA_QUANT_BAD_GROUP. A scan of the TENSOR ops alone (sorted first in the table) is the
 * amax pass of a one-pass call. */
cudaError_t wsync_cuda_quant_scan(const wsync_cuda_qop_t *ops, uint32_t n, uint64_t total_blocks,
                                  unsigned long long *first_bad, unsigned int *amax,
                                  cudaStream_t s);
/* flags of wsync_cuda_quant_blocks. VEC_BLOCKS: every op of the table is a BLOCK op whose rows are
 * read in vectors (wsync_cuda_qop_vectors); such a table runs the kernel that loads each block
 * while the one before it is reduced */
#define WSYNC_CUDA_QUANT_VEC_BLOCKS 1u
/* each CTA takes every grid-th unit instead of a contiguous run of them (either kernel) */
#define WSYNC_CUDA_QUANT_STRIDED 2u
/* with it: full bf16 blocks through the general path too (the fast path's reference) */
#define WSYNC_CUDA_QUANT_GENERIC 4u

/* Quantize every unit of every op (total_blocks = the last op's block_begin + its units) in one
 * pass over the sources (16-bit sources with 16-byte aligned rows and 8-byte aligned destination
 * rows are read once, in vectors; TENSOR ops with the scale of amax, which the scan took). A block
 * or row holding a NaN or infinite value is left as it was, and so is a TENSOR op whose group is
 * bad; first_bad (optional, as for the scan) then gets the least key of such a value. */
cudaError_t wsync_cuda_quant_blocks(const wsync_cuda_qop_t *ops, uint32_t n, uint64_t total_blocks,
                                    unsigned long long *first_bad, const unsigned int *amax,
                                    uint32_t flags, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
