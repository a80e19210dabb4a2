/* The batched copy kernel shared by the consumer copy and the producer stage: one launch moves
 * every op of a call. Work is split into fixed-size chunks (a prefix sum over the ops gives each
 * op its first chunk), and a persistent grid gives each block an equal, contiguous range of
 * chunks, so every SM gets the same number of bytes whatever the tensor sizes are. With `verify`
 * the wsync64 word sums of every op flagged WSYNC_CUDA_OP_DIGEST are accumulated into sums[op]
 * (atomics; the caller zeroes sums first and finishes with wsync_mix64(sum ^ nbytes)).
 * The grid is persistent (one block of 512 threads per SM by default); wsync_cuda_launch_cfg_t
 * picks how chunks are dealt to blocks (see below). C-callable; no state; thread safe. */
#ifndef WSYNC_COPY_KERNEL_H
#define WSYNC_COPY_KERNEL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WSYNC_CUDA_CHUNK_BYTES (64u << 10)
#define WSYNC_CUDA_BLOCK_THREADS 512

#define WSYNC_CUDA_OP_VEC 0x1u    /* 16-byte path: pointers, pitches and row bytes allow it */
#define WSYNC_CUDA_OP_DIGEST 0x2u /* accumulate the op's wsync64 sum when verifying */

/* One planned op (device-resident table). Built by wsync_cuda_plan_op only. */
typedef struct wsync_cuda_op {
    const unsigned char *src;
    unsigned char *dst;
    uint64_t src_pitch;
    uint64_t dst_pitch;
    uint64_t rows;
    uint64_t row_bytes;
    uint64_t chunk_begin;    /* first global chunk of this op */
    uint64_t chunk_end;      /* one past its last chunk */
    uint64_t chunks_per_row; /* > 1 when a row is split over several chunks */
    uint32_t rows_per_chunk; /* > 1 when several short rows share one chunk */
    uint32_t flags;          /* WSYNC_CUDA_OP_* */
} wsync_cuda_op_t;

/* Plan one 2-D op starting at global chunk `chunk_begin`: contiguous 2-D ops become 1-D, the
 * vector path is chosen when alignment allows. Returns the op's chunk count (0 for an empty op). */
uint64_t wsync_cuda_plan_op(wsync_cuda_op_t *op, const void *src, void *dst, uint64_t src_pitch,
                            uint64_t dst_pitch, uint64_t rows, uint64_t row_bytes, int digest,
                            uint64_t chunk_begin);

/* Launch tuning: the copy kernel's variants (WSYNC_CUDA_KERNEL_VARIANT takes the numbers).
 * The lean flat variants need `flat` (every op planned as one 16-byte aligned run, i.e.
 * wsync_cuda_op_is_flat) and no verify; otherwise they fall back to CONTIGUOUS and
 * INTERLEAVED_STREAMING. blocks_per_sm 0 = the variant's default. cfg NULL =
 * WSYNC_CUDA_DEFAULT_VARIANT. */
typedef enum wsync_cuda_variant {
    WSYNC_CUDA_VARIANT_CONTIGUOUS = 0,            /* a contiguous chunk range per block */
    WSYNC_CUDA_VARIANT_CONTIGUOUS_STREAMING = 1,  /* the same, evict-first loads and stores */
    WSYNC_CUDA_VARIANT_INTERLEAVED = 2,           /* block b takes chunks b, b + grid, ... */
    WSYNC_CUDA_VARIANT_INTERLEAVED_STREAMING = 3, /* interleaved and streaming */
    WSYNC_CUDA_VARIANT_UNROLLED = 4,              /* contiguous, 4-deep unroll, 2 blocks per SM */
    WSYNC_CUDA_VARIANT_LEAN_CONTIGUOUS = 5,       /* the lean flat kernel, contiguous ranges */
    WSYNC_CUDA_VARIANT_LEAN_INTERLEAVED = 6,      /* lean flat, interleaved, streaming */
    WSYNC_CUDA_VARIANT_BATCH_MEMCPY = 7,          /* the copy engines' batched memcpy (no kernel) */
    WSYNC_CUDA_VARIANT_BATCH_OVERLAP = 8          /* the same, overlapping its two halves */
} wsync_cuda_variant_t;
/* consumer: source in another process (IPC mapping) */
#define WSYNC_CUDA_DEFAULT_VARIANT WSYNC_CUDA_VARIANT_INTERLEAVED_STREAMING
/* consumer: source a cuda_vmm_fd mapping */
#define WSYNC_CUDA_VMM_VARIANT WSYNC_CUDA_VARIANT_CONTIGUOUS
/* producer stage: local source and destination */
#define WSYNC_CUDA_STAGE_VARIANT WSYNC_CUDA_VARIANT_CONTIGUOUS
typedef struct wsync_cuda_launch_cfg {
    int blocks_per_sm;
    int variant;
    int flat; /* every op satisfies wsync_cuda_op_is_flat */
} wsync_cuda_launch_cfg_t;

/* 1 when the planned op is empty or one contiguous run on the 16-byte vector path. */
static inline int wsync_cuda_op_is_flat(const wsync_cuda_op_t *op)
{
    return op->chunk_end == op->chunk_begin ||
           (op->rows <= 1 && (op->flags & WSYNC_CUDA_OP_VEC) != 0);
}

/* Enqueue the copy of `n_ops` planned ops (device table `ops`, `total_chunks` = the last op's
 * chunk_end) on `stream`. `sm_count` sizes the persistent grid. sums: device array of n_ops
 * zeroed words, used when verify is non-zero (may be NULL otherwise). Non-blocking. */
cudaError_t wsync_cuda_launch_copy(const wsync_cuda_op_t *ops, uint32_t n_ops,
                                   uint64_t total_chunks, unsigned long long *sums, int verify,
                                   int sm_count, const wsync_cuda_launch_cfg_t *cfg,
                                   cudaStream_t stream);

/* The weight checker's pass: the wsync64 sums of ops (planned with digest, src the region; dst
 * is not written) into the zeroed sums, one per op. variant 0 is the plugin's; 1..3 are tuning
 * shapes that wsync-bench-cuda --digest compares (wsync_copy_kernel.cu). Non-blocking. */
#define WSYNC_CUDA_DIGEST_VARIANTS 7
cudaError_t wsync_cuda_launch_digest(const wsync_cuda_op_t *ops, uint32_t n_ops,
                                     uint64_t total_chunks, unsigned long long *sums, int sm_count,
                                     int variant, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
