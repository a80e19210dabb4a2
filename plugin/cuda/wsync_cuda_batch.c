/* The copy engines' path: planned flat ops as one cudaMemcpyBatchAsync (each lane's share; kernel
 * variants 7 and 8 of the tunable build), and the lane that carries the copy engines' share of a
 * batch (wsync_cuda_split) beside the caller's stream. */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"

wsync_result_t wsync_cuda_batch_memcpy(const wsync_cuda_op_t *t, size_t n, int overlap, int per_op,
                                       cudaStream_t s, const char *who, wsync_error_t *err)
{
    void **dst = malloc((n ? n : 1) * sizeof(*dst));
    const void **src = malloc((n ? n : 1) * sizeof(*src));
    size_t *sizes = malloc((n ? n : 1) * sizeof(*sizes));
    size_t k = 0;
    cudaError_t e = cudaSuccess;
    /* per_op (an experiment, wsync_cuda_tuning.h): one cudaMemcpyAsync per op, as torch's
     * per-tensor copy_ loop issues them (docs/PERFORMANCE.md compares both on legacy-IPC memory).
     */
    const int loop = per_op;
    if (dst && src && sizes) {
        for (size_t i = 0; i < n; i++)
            if (t[i].chunk_end > t[i].chunk_begin) {
                dst[k] = t[i].dst;
                src[k] = t[i].src;
                sizes[k++] = t[i].row_bytes;
            }
#if CUDART_VERSION >= 12080
        if (loop) {
            for (size_t i = 0; i < k && e == cudaSuccess; i++)
                e = cudaMemcpyAsync(dst[i], src[i], sizes[i], cudaMemcpyDeviceToDevice, s);
            k = 0;
        }
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
        (void)loop;
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

cudaError_t wsync_cuda_lane_create(wsync_cuda_lane_t *l)
{
    cudaError_t e = cudaEventCreateWithFlags(&l->fork, cudaEventDisableTiming);
    for (int k = 0; k < WSYNC_CUDA_MAX_LANES && e == cudaSuccess; k++) {
        e = cudaStreamCreateWithFlags(&l->stream[k], cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&l->join[k], cudaEventDisableTiming);
    }
    return e;
}

void wsync_cuda_lane_destroy(wsync_cuda_lane_t *l)
{
    for (int k = 0; k < WSYNC_CUDA_MAX_LANES; k++) {
        if (l->stream[k])
            cudaStreamDestroy(l->stream[k]);
        if (l->join[k])
            cudaEventDestroy(l->join[k]);
    }
    if (l->fork)
        cudaEventDestroy(l->fork);
    memset(l, 0, sizeof(*l));
}

wsync_result_t wsync_cuda_lane_split(wsync_cuda_lane_t *l, wsync_cuda_op_t *table, size_t n,
                                     const wsync_cuda_split_cfg_t *cfg, cudaStream_t s,
                                     const char *who, wsync_cuda_split_t *sp, wsync_error_t *err)
{
    wsync_result_t rc = wsync_cuda_split(table, n, cfg, sp, err);
    if (rc != WSYNC_OK || sp->n_ce == 0)
        return rc;
    cudaError_t e = cudaEventRecord(l->fork, s);
    if (e != cudaSuccess) {
        wsync_cuda_lane_drop(sp);
        return wsync_cuda_fail(err, e, who, "forking the copy engines' share");
    }
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_lane_run(wsync_cuda_lane_t *l, wsync_cuda_split_t *sp, int per_op,
                                   const char *who, wsync_error_t *err)
{
    if (sp->n_ce == 0)
        return WSYNC_OK;
    wsync_result_t rc = WSYNC_OK;
    cudaError_t e = cudaSuccess;
    const wsync_cuda_op_t *ops = sp->ce;
    for (int k = 0; k < WSYNC_CUDA_MAX_LANES && e == cudaSuccess && rc == WSYNC_OK; k++) {
        if (sp->lane_n[k] == 0)
            continue;
        e = cudaStreamWaitEvent(l->stream[k], l->fork, 0);
        if (e == cudaSuccess)
            rc = wsync_cuda_batch_memcpy(ops, sp->lane_n[k], 1, per_op, l->stream[k], who, err);
        /* joined even when the batch failed: copies before the failing one may be enqueued */
        if (e == cudaSuccess)
            e = cudaEventRecord(l->join[k], l->stream[k]);
        ops += sp->lane_n[k];
    }
    if (rc == WSYNC_OK && e != cudaSuccess)
        rc = wsync_cuda_fail(err, e, who, "enqueueing the copy engines' share");
    free(sp->ce);
    sp->ce = NULL;
    return rc;
}

void wsync_cuda_lane_drop(wsync_cuda_split_t *sp)
{
    free(sp->ce);
    sp->ce = NULL;
    sp->n_ce = 0;
    memset(sp->lane_n, 0, sizeof(sp->lane_n));
}

cudaError_t wsync_cuda_lane_join(const wsync_cuda_lane_t *l, const wsync_cuda_split_t *sp,
                                 cudaStream_t s)
{
    cudaError_t e = cudaSuccess;
    for (int k = 0; k < WSYNC_CUDA_MAX_LANES && e == cudaSuccess; k++)
        if (sp->lane_n[k] > 0) /* all 0 when there is no share, or it was dropped */
            e = cudaStreamWaitEvent(s, l->join[k], 0);
    return e;
}
