/* Experimental copy kernels of wsync-bench-cuda --lanes (not the plugin's): one contiguous
 * buffer, `blocks` blocks of 512 threads, each a contiguous share. C-callable. */
#ifndef WSYNC_BENCH_KERNELS_H
#define WSYNC_BENCH_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* unroll 4, 8 or 16 (16-byte words per thread in flight); hint 0 plain, 1 loads with an L2
 * 256-byte prefetch, 2 the same non-coherent without L1 allocation, 3 = 2 with streaming
 * stores, 4 = 2 with stores that skip L1. bytes: a multiple of 16. */
cudaError_t wb_kernel_copy(int unroll, int hint, const void *src, void *dst, uint64_t bytes,
                           int blocks, cudaStream_t s);
/* Reads every byte (one direction of HBM); sink: one 16-byte device word. */
cudaError_t wb_kernel_read(const void *src, uint64_t bytes, void *sink, int blocks, cudaStream_t s);
/* Writes every byte (plain 16-byte stores). */
cudaError_t wb_kernel_write(void *dst, uint64_t bytes, int blocks, cudaStream_t s);

/* Reads src_bytes (a multiple of 16) and writes half as many: per 16-bit value its high byte
 * (cast 0) or its bf16 value cast to e4m3fn (cast 1) -- the FP8 copy's read/write mix. */
cudaError_t wb_kernel_mix(int cast, const void *src, uint64_t src_bytes, void *dst, int blocks,
                          cudaStream_t s);

/* The FP8 block quantizer's memory pattern on a bf16 [rows, cols] matrix (both multiples of
 * 128) into an 8-bit [rows, cols] one, `blocks` CTAs of 256 threads: mode 0 a cast alone, 1 with
 * each block's amax over the CTA, 2 the same with the next block's loads issued first; cs bit 0:
 * the plugin's streaming loads and stores instead of plain ones, bit 1: CTA c takes blocks c,
 * c + blocks, ... instead of a contiguous run. */
cudaError_t wb_kernel_blockq(int mode, int cs, const void *src, uint64_t rows, uint64_t cols,
                             void *dst, int blocks, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
