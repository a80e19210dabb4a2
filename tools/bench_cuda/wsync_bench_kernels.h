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

#ifdef __cplusplus
}
#endif

#endif
