/* Planned flat ops as one cudaMemcpyBatchAsync: the copy engines' path, shared by the consumer
 * (WSYNC_CUDA_KERNEL_VARIANT 7 and 8) and the producer's stage (WSYNC_CUDA_STAGE_ENGINE=ce). */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"

wsync_result_t wsync_cuda_batch_memcpy(const wsync_cuda_op_t *t, size_t n, int overlap,
                                       cudaStream_t s, const char *who, wsync_error_t *err)
{
    void **dst = malloc((n ? n : 1) * sizeof(*dst));
    const void **src = malloc((n ? n : 1) * sizeof(*src));
    size_t *sizes = malloc((n ? n : 1) * sizeof(*sizes));
    size_t k = 0;
    cudaError_t e = cudaSuccess;
    if (dst && src && sizes) {
        for (size_t i = 0; i < n; i++)
            if (t[i].chunk_end > t[i].chunk_begin) {
                dst[k] = t[i].dst;
                src[k] = t[i].src;
                sizes[k++] = t[i].row_bytes;
            }
#if CUDART_VERSION >= 12080
        struct cudaMemcpyAttributes a;
        memset(&a, 0, sizeof(a));
        a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        /* ask for the copy engines, so the copy can run beside another context's kernels */
        a.flags = overlap ? cudaMemcpyFlagPreferOverlapWithCompute : 0;
        size_t idx = 0;
        if (k > 0)
            e = cudaMemcpyBatchAsync((void *const *)dst, (const void *const *)src, sizes, k, &a,
                                     &idx, 1, s);
#else
        (void)overlap;
        for (size_t i = 0; i < k && e == cudaSuccess; i++)
            e = cudaMemcpyAsync(dst[i], src[i], sizes[i], cudaMemcpyDeviceToDevice, s);
#endif
    }
    free(dst);
    free(src);
    free(sizes);
    if (!(dst && src && sizes))
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu batch entries", n);
    if (e != cudaSuccess)
        return wsync_cuda_fail(err, e, who, "cudaMemcpyBatchAsync");
    return WSYNC_OK;
}
