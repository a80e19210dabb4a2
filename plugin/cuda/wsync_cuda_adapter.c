/* See wsync_cuda_adapter.h. The adapter layer validates the adapter against the slot and plans
 * every byte; this file runs the plan on the engine's stream and orders it after the producer's
 * *ready* (FROM_MANIFEST) or stages the file's bytes through pinned memory (FROM_DIR). */
#include <stdlib.h>
#include <string.h>

#include "wsync_adapter_load.h"
#include "wsync_cuda.h"
#include "wsync_cuda_adapter.h"
#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_validate.h"

typedef struct exec_ctx {
    struct wsync_consumer *c;
    cudaStream_t stream;
} exec_ctx_t;

static size_t dt_size(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F64 ? 8 : dt == WSYNC_DTYPE_F32 ? 4 : 2;
}

static wsync_result_t table_reserve(wsync_cuda_adapter_state_t *s, size_t n, wsync_error_t *err)
{
    if (n <= s->table_cap)
        return WSYNC_OK;
    for (int k = 0; k < 2; k++) {
        if (s->used[k])
            WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->done[k]));
        cudaFreeHost(s->table_host[k]);
        cudaFree(s->table_dev[k]);
        s->table_host[k] = NULL;
        s->table_dev[k] = NULL;
    }
    s->table_cap = 0;
    size_t cap = n < 1024 ? 1024 : n;
    for (int k = 0; k < 2; k++) {
        WSYNC_CUDA_TRY(err,
                       cudaHostAlloc((void **)&s->table_host[k], cap * sizeof(wsync_cuda_conv_op_t),
                                     cudaHostAllocDefault));
        WSYNC_CUDA_TRY(err,
                       cudaMalloc((void **)&s->table_dev[k], cap * sizeof(wsync_cuda_conv_op_t)));
    }
    s->table_cap = cap;
    return WSYNC_OK;
}

static wsync_result_t data_reserve(wsync_cuda_adapter_state_t *s, size_t bytes, wsync_error_t *err)
{
    if (bytes <= s->data_cap)
        return WSYNC_OK;
    for (int k = 0; k < 2; k++) {
        if (s->used[k])
            WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->done[k]));
        cudaFreeHost(s->data_host[k]);
        cudaFree(s->data_dev[k]);
        s->data_host[k] = NULL;
        s->data_dev[k] = NULL;
    }
    s->data_cap = 0;
    for (int k = 0; k < 2; k++) {
        WSYNC_CUDA_TRY(err, cudaHostAlloc((void **)&s->data_host[k], bytes, cudaHostAllocDefault));
        WSYNC_CUDA_TRY(err, cudaMalloc((void **)&s->data_dev[k], bytes));
    }
    s->data_cap = bytes;
    return WSYNC_OK;
}

static wsync_result_t events_ready(wsync_cuda_adapter_state_t *s, wsync_error_t *err)
{
    for (int k = 0; k < 2; k++)
        if (s->done[k] == NULL)
            WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&s->done[k], cudaEventDisableTiming));
    return WSYNC_OK;
}

void wsync_cuda_adapter_state_free(wsync_cuda_adapter_state_t *s)
{
    for (int k = 0; k < 2; k++) {
        if (s->used[k])
            cudaEventSynchronize(s->done[k]);
        if (s->done[k])
            cudaEventDestroy(s->done[k]);
        cudaFreeHost(s->table_host[k]);
        cudaFree(s->table_dev[k]);
        cudaFreeHost(s->data_host[k]);
        cudaFree(s->data_dev[k]);
    }
    memset(s, 0, sizeof(*s));
}

/* Upload table k (n ops) and launch it on the stream; records done[k]. */
static wsync_result_t launch_table(struct wsync_consumer *c, cudaStream_t st, int k, size_t n,
                                   uint64_t tiles, wsync_error_t *err)
{
    wsync_cuda_adapter_state_t *s = &c->adapter;
    if (n > 0 && tiles > 0) {
        WSYNC_CUDA_TRY(err, cudaMemcpyAsync(s->table_dev[k], s->table_host[k],
                                            n * sizeof(wsync_cuda_conv_op_t),
                                            cudaMemcpyHostToDevice, st));
        WSYNC_CUDA_TRY(
            err, wsync_cuda_launch_convert(s->table_dev[k], (uint32_t)n, tiles, c->sm_count, st));
    }
    WSYNC_CUDA_TRY(err, cudaEventRecord(s->done[k], st));
    s->used[k] = 1;
    return WSYNC_OK;
}

/* Sources in device memory (a mapped producer buffer): every op in one launch. */
static wsync_result_t exec_device(struct wsync_consumer *c, cudaStream_t st,
                                  const wsync_adapter_plan_t *plan, wsync_error_t *err)
{
    wsync_cuda_adapter_state_t *s = &c->adapter;
    const size_t n = plan->n_copies + plan->n_zeros;
    wsync_result_t rc = table_reserve(s, n, err);
    if (rc != WSYNC_OK)
        return rc;
    if (s->used[0])
        WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->done[0]));
    wsync_cuda_conv_op_t *t = s->table_host[0];
    uint64_t tiles = 0;
    for (size_t i = 0; i < plan->n_copies; i++) {
        const wsync_adapter_copy_op_t *o = &plan->copies[i];
        tiles += wsync_cuda_conv_plan_copy(&t[i], o->src, o->src_dtype, o->src_pitch, o->dst,
                                           o->dst_dtype, o->dst_pitch, o->rows, o->cols, o->scale,
                                           tiles);
    }
    for (size_t i = 0; i < plan->n_zeros; i++) {
        const wsync_adapter_zero_op_t *z = &plan->zeros[i];
        tiles += wsync_cuda_conv_plan_zero(&t[plan->n_copies + i], z->dst, z->dst_pitch, z->rows,
                                           z->row_bytes, tiles);
    }
    return launch_table(c, st, 0, n, tiles, err);
}

/* Sources in host memory (the mmapped safetensors file): packed into pinned chunks, copied to
 * the device and converted there; packing chunk k+1 overlaps the transfer and kernel of k. */
static wsync_result_t exec_host(struct wsync_consumer *c, cudaStream_t st,
                                const wsync_adapter_plan_t *plan, wsync_error_t *err)
{
    wsync_cuda_adapter_state_t *s = &c->adapter;
    size_t need = WSYNC_CUDA_ADAPTER_CHUNK;
    for (size_t i = 0; i < plan->n_copies; i++) { /* one row must fit a chunk */
        size_t row = (size_t)(plan->copies[i].cols * dt_size(plan->copies[i].src_dtype));
        if (row + 16 > need)
            need = row + 16;
    }
    wsync_result_t rc = data_reserve(s, need, err);
    if (rc == WSYNC_OK)
        rc = table_reserve(s, plan->n_copies + plan->n_zeros, err);
    if (rc != WSYNC_OK)
        return rc;
    /* zero fills first: device only, one launch */
    int k = 0;
    if (plan->n_zeros > 0) {
        if (s->used[k])
            WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->done[k]));
        uint64_t tiles = 0;
        for (size_t i = 0; i < plan->n_zeros; i++) {
            const wsync_adapter_zero_op_t *z = &plan->zeros[i];
            tiles += wsync_cuda_conv_plan_zero(&s->table_host[k][i], z->dst, z->dst_pitch, z->rows,
                                               z->row_bytes, tiles);
        }
        rc = launch_table(c, st, k, plan->n_zeros, tiles, err);
        if (rc != WSYNC_OK)
            return rc;
        k ^= 1;
    }
    size_t i = 0;
    uint64_t row0 = 0; /* first row of op i not yet staged */
    while (i < plan->n_copies) {
        if (s->used[k])
            WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->done[k]));
        size_t used = 0, n = 0;
        uint64_t tiles = 0;
        while (i < plan->n_copies && n < s->table_cap) {
            const wsync_adapter_copy_op_t *o = &plan->copies[i];
            const uint64_t rb = o->cols * dt_size(o->src_dtype);
            const size_t off = (used + 15u) & ~(size_t)15u;
            uint64_t fit = rb == 0 ? o->rows - row0 : (s->data_cap - off) / rb;
            if (off >= s->data_cap || fit == 0)
                break;
            uint64_t rows = o->rows - row0 < fit ? o->rows - row0 : fit;
            const unsigned char *from = (const unsigned char *)o->src + row0 * o->src_pitch;
            if (o->src_pitch == rb) {
                memcpy(s->data_host[k] + off, from, rows * rb);
            } else {
                for (uint64_t r = 0; r < rows; r++)
                    memcpy(s->data_host[k] + off + r * rb, from + r * o->src_pitch, rb);
            }
            tiles += wsync_cuda_conv_plan_copy(
                &s->table_host[k][n], s->data_dev[k] + off, o->src_dtype, rb,
                (unsigned char *)o->dst + row0 * o->dst_pitch, o->dst_dtype, o->dst_pitch, rows,
                o->cols, o->scale, tiles);
            n++;
            used = off + rows * rb;
            row0 += rows;
            if (row0 >= o->rows) {
                i++;
                row0 = 0;
            }
        }
        if (used > 0)
            WSYNC_CUDA_TRY(err, cudaMemcpyAsync(s->data_dev[k], s->data_host[k], used,
                                                cudaMemcpyHostToDevice, st));
        rc = launch_table(c, st, k, n, tiles, err);
        if (rc != WSYNC_OK)
            return rc;
        k ^= 1;
    }
    return WSYNC_OK;
}

/* The adapter layer's executor: returns once every byte is written (stream synchronized). */
static wsync_result_t exec_plan(const wsync_adapter_plan_t *plan, void *user, wsync_error_t *err)
{
    exec_ctx_t *x = user;
    wsync_result_t rc = events_ready(&x->c->adapter, err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_cuda_range_push("wsync:adapter_exec");
    if (plan->src_memory == WSYNC_ADAPTER_MEM_HOST)
        rc = exec_host(x->c, x->stream, plan, err);
    else
        rc = exec_device(x->c, x->stream, plan, err);
    cudaError_t e = cudaStreamSynchronize(x->stream);
    wsync_cuda_range_pop();
    if (rc == WSYNC_OK && e != cudaSuccess)
        rc = wsync_cuda_fail(err, e, __func__, "cudaStreamSynchronize(adapter load)");
    return rc;
}

/* FROM_MANIFEST: the manifest must describe the buffer behind `h` and be newer than the last
 * generation taken from it; the stream waits for *ready*. Returns the usable base. */
static wsync_result_t manifest_source(struct wsync_consumer *c, const wsync_adapter_source_t *src,
                                      cudaStream_t st, const void **base, wsync_error_t *err)
{
    struct wsync_handle *h = src->handle;
    const wsync_manifest_t *m = src->manifest;
    if (h == NULL || h->magic != WSYNC_CUDA_HANDLE_MAGIC ||
        ((wsync_cuda_mapping_t *)h->entry->mapping)->consumer != c)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "adapter source FROM_MANIFEST needs an open handle of this consumer "
                          "(handle %p)",
                          (void *)h);
    wsync_cuda_mapping_t *mp = h->entry->mapping;
    uint64_t last = m != NULL ? wsync_cuda_last_generation(h->entry, mp, m->generation) : 0;
    wsync_result_t rc = wsync_validate_adapter_manifest(m, &h->entry->key, h->bytes, last, err);
    if (rc != WSYNC_OK)
        return rc;
    if (mp->control != NULL && atomic_load(&mp->control->ready_generation) < m->generation) {
        rc = wsync_control_wait_ready(mp->control, m->generation, c->timeout_ms,
                                      mp->control->producer_pid, err);
        if (rc != WSYNC_OK)
            return rc;
    }
    if (mp->has_ready)
        WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(st, mp->ready, 0));
    *base = mp->base + h->base_offset;
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_hot_load_adapter(struct wsync_consumer *c,
                                           const wsync_adapter_source_t *src,
                                           wsync_adapter_slot_t *slot, wsync_stream_t stream,
                                           wsync_error_t *err)
{
    wsync_result_t arg = wsync_validate_adapter_call(c, src, slot, err);
    if (arg != WSYNC_OK)
        return arg;
    cudaStream_t st = wsync_cuda_stream(stream);
    wsync_cuda_range_push("wsync:hot_load_adapter");
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    const void *base = NULL;
    wsync_result_t rc = WSYNC_OK;
    if (src->kind == WSYNC_ADAPTER_FROM_MANIFEST)
        rc = manifest_source(c, src, st, &base, err);
    exec_ctx_t x = {.c = c, .stream = st};
    if (rc == WSYNC_OK)
        rc = wsync_adapter_hot_load(src, slot, base, exec_plan, &x, err);
    if (rc == WSYNC_OK && src->kind == WSYNC_ADAPTER_FROM_MANIFEST) {
        /* Every byte is read (the stream was synchronized): the producer may refresh. */
        wsync_cuda_mapping_t *mp = src->handle->entry->mapping;
        if (mp->has_consumed && mp->control == NULL)
            rc = cudaEventRecord(mp->consumed, st) == cudaSuccess
                     ? WSYNC_OK
                     : wsync_cuda_fail(err, cudaGetLastError(), __func__,
                                       "cudaEventRecord(consumed)");
        src->handle->entry->last_generation = src->manifest->generation;
        mp->copied_generation = src->manifest->generation;
        mp->recorded = 1;
        if (mp->control != NULL)
            wsync_control_signal_consumed(mp->control, src->manifest->generation);
    }
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    return rc;
}

wsync_result_t wsync_cuda_unload_adapter(struct wsync_consumer *c, wsync_adapter_slot_t *slot,
                                         wsync_error_t *err)
{
    if (c == NULL || slot == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "consumer %p and slot %p must be non-NULL", (void *)c, (void *)slot);
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    exec_ctx_t x = {.c = c, .stream = cudaStreamLegacy};
    wsync_result_t rc = wsync_adapter_unload(slot, exec_plan, &x, NULL, NULL, err);
    pthread_mutex_unlock(&c->lock);
    return rc;
}
