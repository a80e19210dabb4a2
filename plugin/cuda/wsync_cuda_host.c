/* register_host / unregister_host (ABI 0.1.5): host memory a stage reads over PCIe, a mapped
 * checkpoint shard most often, and the stage's copy-engine path for it (wsync_cuda_bounce_stage).
 * Page-locked and mapped for the device with cudaHostRegister (read-only where the device supports
 * it, so a read-only file mapping registers too), kept in the process-wide table of
 * plugin/common/wsync_host_ranges.h. */
#include <stdlib.h>
#include <string.h>

#include "wsync_convert_kernel.h"
#include "wsync_cuda.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_host_ranges.h"

wsync_result_t wsync_cuda_register_host(struct wsync_staging *s, const void *ptr, uint64_t bytes,
                                        wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "register_host: staging is NULL");
    wsync_result_t rc = wsync_host_ranges_check(ptr, bytes, err);
    if (rc != WSYNC_OK)
        return rc;
    int dev = 0, read_only = 0;
    WSYNC_CUDA_TRY(err, cudaGetDevice(&dev));
    WSYNC_CUDA_TRY(
        err, cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, dev));
    const unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped |
                           (read_only ? cudaHostRegisterReadOnly : 0u);
    cudaError_t e = cudaHostRegister((void *)(uintptr_t)ptr, (size_t)bytes, flags);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM,
                          "register_host(%p, %llu): cudaHostRegister(flags 0x%x) failed: %s (%d)",
                          ptr, (unsigned long long)bytes, flags, cudaGetErrorString(e), (int)e);
    }
    const wsync_host_range_t r = {.host = (uintptr_t)ptr, .bytes = bytes};
    rc = wsync_host_ranges_add(&r, err);
    if (rc != WSYNC_OK)
        cudaHostUnregister((void *)(uintptr_t)ptr);
    return rc;
}

wsync_result_t wsync_cuda_unregister_host(struct wsync_staging *s, const void *ptr,
                                          wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "unregister_host: staging is NULL");
    wsync_result_t rc = wsync_host_ranges_remove(ptr, err);
    if (rc != WSYNC_OK)
        return rc;
    /* a stage still reading it finishes first: the caller's stream work is not ours to know */
    WSYNC_CUDA_TRY(err, cudaDeviceSynchronize());
    WSYNC_CUDA_TRY(err, cudaHostUnregister((void *)(uintptr_t)ptr));
    return WSYNC_OK;
}

/* The copy engines' side of a stage from host memory: every host tensor's bytes cross PCIe as a
 * cudaMemcpyAsync on the bounce's own stream (the DMA engines reach the link's rate, which the
 * SMs' zero-copy reads do not); a tensor of the same dtype lands in the staging directly, a
 * converting one in chunks through two device bounce buffers, each chunk converted by the
 * convert kernel on the stage's stream while the next crosses the link. */
#define WSYNC_CUDA_BOUNCE_CHUNK (64u << 20)

static wsync_result_t bounce_make(wsync_cuda_bounce_t *b, wsync_error_t *err)
{
    if (b->made)
        return WSYNC_OK;
    WSYNC_CUDA_TRY(err, cudaStreamCreateWithFlags(&b->cs, cudaStreamNonBlocking));
    WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&b->fork, cudaEventDisableTiming));
    WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&b->join, cudaEventDisableTiming));
    for (int k = 0; k < 2; k++) {
        WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&b->h2d[k], cudaEventDisableTiming));
        WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&b->conv[k], cudaEventDisableTiming));
        WSYNC_CUDA_TRY(err, cudaMalloc(&b->buf[k], WSYNC_CUDA_BOUNCE_CHUNK));
    }
    b->made = 1;
    return WSYNC_OK;
}

void wsync_cuda_bounce_free(wsync_cuda_bounce_t *b)
{
    if (b->cs)
        cudaStreamSynchronize(b->cs);
    for (int k = 0; k < 2; k++) {
        if (b->buf[k])
            cudaFree(b->buf[k]);
        if (b->h2d[k])
            cudaEventDestroy(b->h2d[k]);
        if (b->conv[k])
            cudaEventDestroy(b->conv[k]);
    }
    if (b->fork)
        cudaEventDestroy(b->fork);
    if (b->join)
        cudaEventDestroy(b->join);
    if (b->cs)
        cudaStreamDestroy(b->cs);
    if (b->tab_host)
        cudaFreeHost(b->tab_host);
    if (b->tab_dev)
        cudaFree(b->tab_dev);
    free(b->tiles);
    memset(b, 0, sizeof(*b));
}

static wsync_result_t bounce_reserve(wsync_cuda_bounce_t *b, size_t chunks, wsync_error_t *err)
{
    if (chunks <= b->tab_cap)
        return WSYNC_OK;
    size_t cap = chunks < 64 ? 64 : 2 * chunks;
    if (b->tab_host)
        cudaFreeHost(b->tab_host);
    if (b->tab_dev)
        cudaFree(b->tab_dev);
    free(b->tiles);
    b->tab_host = NULL, b->tab_dev = NULL, b->tiles = NULL, b->tab_cap = 0;
    WSYNC_CUDA_TRY(err, cudaHostAlloc((void **)&b->tab_host, cap * sizeof(*b->tab_host),
                                      cudaHostAllocDefault));
    WSYNC_CUDA_TRY(err, cudaMalloc((void **)&b->tab_dev, cap * sizeof(*b->tab_dev)));
    b->tiles = malloc(cap * sizeof(*b->tiles));
    if (b->tiles == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu stage chunks", cap);
    b->tab_cap = cap;
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_bounce_stage(wsync_cuda_bounce_t *b, cudaStream_t st,
                                       const wsync_cuda_host_op_t *ops, size_t n, int sm_count,
                                       wsync_error_t *err)
{
    wsync_result_t rc = bounce_make(b, err);
    if (rc != WSYNC_OK || n == 0)
        return rc;
    size_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t per = WSYNC_CUDA_BOUNCE_CHUNK / wsync_dtype_size(ops[i].src_dtype);
        if (ops[i].src_dtype != ops[i].dst_dtype)
            chunks += (size_t)((ops[i].elems + per - 1) / per);
    }
    if ((rc = bounce_reserve(b, chunks, err)) != WSYNC_OK)
        return rc;
    /* plan every chunk's conversion (source: its bounce buffer) and upload the table once */
    for (size_t i = 0, j = 0; i < n; i++) {
        const wsync_cuda_host_op_t *o = &ops[i];
        if (o->src_dtype == o->dst_dtype)
            continue;
        const uint64_t per = WSYNC_CUDA_BOUNCE_CHUNK / wsync_dtype_size(o->src_dtype);
        for (uint64_t e0 = 0; e0 < o->elems; e0 += per, j++) {
            const uint64_t e = o->elems - e0 < per ? o->elems - e0 : per;
            unsigned char *dst = (unsigned char *)o->dst + e0 * wsync_dtype_size(o->dst_dtype);
            b->tiles[j] = wsync_cuda_conv_plan_copy(
                &b->tab_host[j], b->buf[j % 2], o->src_dtype, e * wsync_dtype_size(o->src_dtype),
                dst, o->dst_dtype, e * wsync_dtype_size(o->dst_dtype), 1, e, 1.0, 0);
        }
    }
    if (chunks > 0)
        WSYNC_CUDA_TRY(err, cudaMemcpyAsync(b->tab_dev, b->tab_host, chunks * sizeof(*b->tab_dev),
                                            cudaMemcpyHostToDevice, st));
    /* the copies follow everything on st so far (the staging is free to overwrite) */
    WSYNC_CUDA_TRY(err, cudaEventRecord(b->fork, st));
    WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(b->cs, b->fork, 0));
    for (size_t i = 0, j = 0; i < n; i++) {
        const wsync_cuda_host_op_t *o = &ops[i];
        const size_t ss = wsync_dtype_size(o->src_dtype);
        if (o->src_dtype == o->dst_dtype) {
            WSYNC_CUDA_TRY(
                err, cudaMemcpyAsync(o->dst, o->src, o->elems * ss, cudaMemcpyHostToDevice, b->cs));
            continue;
        }
        const uint64_t per = WSYNC_CUDA_BOUNCE_CHUNK / ss;
        for (uint64_t e0 = 0; e0 < o->elems; e0 += per, j++) {
            const uint64_t e = o->elems - e0 < per ? o->elems - e0 : per;
            const int k = (int)(j % 2);
            if (j >= 2) /* bounce k is free once chunk j - 2's conversion read it */
                WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(b->cs, b->conv[k], 0));
            WSYNC_CUDA_TRY(err, cudaMemcpyAsync(b->buf[k], (const unsigned char *)o->src + e0 * ss,
                                                e * ss, cudaMemcpyHostToDevice, b->cs));
            WSYNC_CUDA_TRY(err, cudaEventRecord(b->h2d[k], b->cs));
            WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(st, b->h2d[k], 0));
            if (b->tiles[j] > 0)
                WSYNC_CUDA_TRY(
                    err, wsync_cuda_launch_convert(&b->tab_dev[j], 1, b->tiles[j], sm_count, st));
            WSYNC_CUDA_TRY(err, cudaEventRecord(b->conv[k], st));
        }
    }
    /* st goes on once every byte crossed (the direct copies included) */
    WSYNC_CUDA_TRY(err, cudaEventRecord(b->join, b->cs));
    WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(st, b->join, 0));
    return WSYNC_OK;
}
