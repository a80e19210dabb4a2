/* Producer table: a retained staging buffer exported once (legacy CUDA IPC from cudaMalloc, or
 * cuda_vmm_fd from cuMemCreate: WSYNC_CUDA_STAGING_KIND), filled by the batched copy kernel with
 * fused digests, published with a *ready* event record. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_convert_kernel.h"
#include "wsync_cuda.h"
#include "wsync_cuda_direct.h"
#include "wsync_cuda_vmm.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_host_ranges.h"
#include "wsync_layout.h"
#include "wsync_log.h"
#include "wsync_manifest.h"

struct wsync_staging {
    int device;
    int sm_count;
    uint32_t flags;
    uint32_t timeout_ms;
    unsigned char *dev; /* the staging buffer */
    uint64_t bytes;
    wsync_buffer_kind_t kind; /* CUDA_IPC or CUDA_VMM_FD */
    cudaIpcMemHandle_t mem_handle;
    wsync_cuda_vmm_t vmm; /* CUDA_VMM_FD: the allocation */
    /* *ready* only: *consumed* travels in the control block (see wait_consumed) */
    cudaEvent_t ready;
    cudaIpcEventHandle_t ready_handle;
    char uuid[WSYNC_DEVICE_MAX];
    wsync_shm_t control_shm;
    wsync_control_t *control;
    /* the stage kernel's table: pinned [ops | zero sums] and [sums read back]; device the same */
    unsigned char *table_host;
    unsigned char *table_dev;
    size_t cap;
    /* converting stages (0.1.5 src_dtype): the convert kernel's table, pinned and device, and
     * per packed tensor the sums slot holding its digest */
    wsync_cuda_conv_op_t *conv_host, *conv_dev;
    size_t *slot;
    wsync_cuda_host_op_t *hops; /* the bucket's tensors in registered host memory */
    wsync_cuda_bounce_t bounce; /* their copy-engine path */
    cudaEvent_t staged;         /* recorded after the stage kernel and the sums read-back */
    wsync_cuda_lane_t lane;     /* the copy engines' share of a stage without digests */
    int have_table_use;
    wsync_layout_t retained; /* the fixed layout (WSYNC_STAGING_FIXED_LAYOUT) */
    int have_retained;
    wsync_layout_t current;     /* the bucket staged, not yet published */
    wsync_cuda_tuning_t tuning; /* read at create (wsync_cuda_tuning.h) */
    int have_current;
    uint64_t generation; /* last published */
    uint64_t waited;     /* last generation wait_consumed returned OK for */
    char *manifest_json;
    wsync_direct_set_t direct;    /* WSYNC_STAGING_DIRECT: the buckets named in place */
    wsync_cuda_exports_t exports; /* direct mode: every segment exported, for life */
};

/* A direct staging's own buffer holds no tensor: a consumer that ignored the manifest's segments
 * is refused (out of bounds), never fed other bytes. */
#define WSYNC_CUDA_DIRECT_BYTES 256u

/* The stage's tables (ops and sums, conversions, slots, host ops), pinned and device. */
static void tables_free(struct wsync_staging *s)
{
    if (s->table_host)
        cudaFreeHost(s->table_host);
    if (s->table_dev)
        cudaFree(s->table_dev);
    if (s->conv_host)
        cudaFreeHost(s->conv_host);
    if (s->conv_dev)
        cudaFree(s->conv_dev);
    free(s->slot);
    free(s->hops);
    s->table_host = s->table_dev = NULL;
    s->conv_host = s->conv_dev = NULL;
    s->slot = NULL;
    s->hops = NULL;
    s->cap = 0;
}

static void staging_free(struct wsync_staging *s)
{
    if (s->have_table_use)
        cudaEventSynchronize(s->staged);
    if (s->staged)
        cudaEventDestroy(s->staged);
    if (s->ready)
        cudaEventDestroy(s->ready);
    wsync_cuda_lane_destroy(&s->lane);
    tables_free(s);
    wsync_cuda_bounce_free(&s->bounce);
    if (s->kind == WSYNC_BUFFER_CUDA_VMM_FD)
        wsync_cuda_vmm_destroy(&s->vmm);
    else if (s->dev)
        cudaFree(s->dev);
    if (s->control_shm.addr) {
        wsync_shm_unlink(&s->control_shm);
        wsync_shm_close(&s->control_shm);
    }
    if (s->have_retained)
        wsync_layout_free(&s->retained);
    if (s->have_current)
        wsync_layout_free(&s->current);
    free(s->manifest_json);
    wsync_direct_set_free(&s->direct);
    wsync_cuda_exports_free(&s->exports);
    free(s);
}

static wsync_result_t staging_create(const wsync_staging_config_t *config,
                                     struct wsync_staging **out, wsync_error_t *err)
{
    if (config == NULL || out == NULL ||
        !WSYNC_HAS_FIELD(wsync_staging_config_t, config, timeout_ms) ||
        (config->bytes == 0 && !(config->flags & WSYNC_STAGING_DIRECT)))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "create needs a config (struct_size >= %zu, bytes > 0) and out",
                          sizeof(wsync_staging_config_v1_t));
    if (config->flags & WSYNC_STAGING_NIXL)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "staging flags 0x%x: WSYNC_STAGING_NIXL (0x8) is implemented by the CPU "
                          "plugin only; the CUDA plugin does not register device memory with "
                          "NIXL yet",
                          config->flags);
    if ((config->flags &
         ~(WSYNC_STAGING_FIXED_LAYOUT | WSYNC_STAGING_NO_DIGESTS | WSYNC_STAGING_DIRECT)) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "staging flags 0x%x: only WSYNC_STAGING_FIXED_LAYOUT (0x1), "
                          "WSYNC_STAGING_NO_DIGESTS (0x2) and WSYNC_STAGING_DIRECT (0x4) are "
                          "defined",
                          config->flags);
    wsync_result_t rc = wsync_cuda_use_device(config->device_ordinal, err);
    if (rc != WSYNC_OK)
        return rc;
    struct wsync_staging *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a staging buffer");
    s->device = config->device_ordinal;
    s->flags = config->flags;
    s->timeout_ms = config->timeout_ms ? config->timeout_ms : WSYNC_CUDA_DEFAULT_TIMEOUT_MS;
    s->bytes = (config->flags & WSYNC_STAGING_DIRECT) ? WSYNC_CUDA_DIRECT_BYTES : config->bytes;
    cudaError_t e;
#define STAGING_TRY(call)                                                                          \
    do {                                                                                           \
        if ((e = (call)) != cudaSuccess) {                                                         \
            rc = wsync_cuda_fail(err, e, "create", #call);                                         \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    STAGING_TRY(cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, s->device));
    wsync_cuda_tuning_read(&s->tuning);
    s->kind = wsync_cuda_staging_kind(s->tuning.staging_kind);
    s->vmm.fd = -1;
    if (s->kind == WSYNC_BUFFER_CUDA_VMM_FD) {
        rc = wsync_cuda_vmm_create(s->device, s->bytes, &s->vmm, err);
        if (rc != WSYNC_OK)
            goto fail;
        s->dev = (unsigned char *)(uintptr_t)s->vmm.ptr;
    } else {
        STAGING_TRY(cudaMalloc((void **)&s->dev, s->bytes));
        STAGING_TRY(cudaIpcGetMemHandle(&s->mem_handle, s->dev));
    }
    STAGING_TRY(
        cudaEventCreateWithFlags(&s->ready, cudaEventInterprocess | cudaEventDisableTiming));
    STAGING_TRY(cudaIpcGetEventHandle(&s->ready_handle, s->ready));
    STAGING_TRY(cudaEventCreateWithFlags(&s->staged, cudaEventDisableTiming));
    STAGING_TRY(wsync_cuda_lane_create(&s->lane));
#undef STAGING_TRY
    rc = wsync_cuda_device_uuid(s->device, s->uuid, err);
    if (rc != WSYNC_OK)
        goto fail;
    rc = wsync_shm_create(&s->control_shm, "cuda", WSYNC_CONTROL_SIZE, err);
    if (rc != WSYNC_OK)
        goto fail;
    s->control = s->control_shm.addr;
    wsync_control_init(s->control, 0, s->bytes);
    WSYNC_LOG_INFO("cuda staging of %llu bytes (%s) on %s, control %s",
                   (unsigned long long)s->bytes,
                   s->kind == WSYNC_BUFFER_CUDA_VMM_FD ? "cuda_vmm_fd" : "cuda_ipc", s->uuid,
                   s->control_shm.name);
    *out = s;
    return WSYNC_OK;
fail:
    staging_free(s);
    return rc;
}

static wsync_result_t table_reserve(struct wsync_staging *s, size_t n, wsync_error_t *err)
{
    if (s->have_table_use) /* the previous stage's upload must be done before the rewrite */
        WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->staged));
    if (n <= s->cap)
        return WSYNC_OK;
    size_t cap = n < 256 ? 256 : n * 2;
    tables_free(s);
    size_t ops = wsync_cuda_slot_ops_bytes(cap);
    WSYNC_CUDA_TRY(err, cudaHostAlloc((void **)&s->table_host, ops + 2 * cap * sizeof(uint64_t),
                                      cudaHostAllocDefault));
    WSYNC_CUDA_TRY(err, cudaMalloc((void **)&s->table_dev, ops + cap * sizeof(uint64_t)));
    WSYNC_CUDA_TRY(err, cudaHostAlloc((void **)&s->conv_host, cap * sizeof(*s->conv_host),
                                      cudaHostAllocDefault));
    WSYNC_CUDA_TRY(err, cudaMalloc((void **)&s->conv_dev, cap * sizeof(*s->conv_dev)));
    s->slot = malloc(cap * sizeof(*s->slot));
    s->hops = malloc(cap * sizeof(*s->hops));
    if (s->slot == NULL || s->hops == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu stage slots", cap);
    s->cap = cap;
    return WSYNC_OK;
}

static uint64_t *sums_back(struct wsync_staging *s)
{
    return (uint64_t *)(s->table_host + wsync_cuda_slot_ops_bytes(s->cap)) + s->cap;
}

static wsync_result_t stage_body(struct wsync_staging *s, cudaStream_t st,
                                 const wsync_stage_tensor_t *t, size_t n, wsync_error_t *err)
{
    wsync_layout_t lay;
    wsync_result_t rc = wsync_layout_build(t, n, s->bytes, &lay, err);
    if (rc != WSYNC_OK)
        return rc;
    if ((s->flags & WSYNC_STAGING_FIXED_LAYOUT) && s->have_retained) {
        rc = wsync_layout_compare(&s->retained, &lay, err);
        if (rc != WSYNC_OK)
            goto out;
    }
    rc = table_reserve(s, n, err);
    if (rc != WSYNC_OK)
        goto out;
    wsync_cuda_op_t *table = (wsync_cuda_op_t *)s->table_host;
    const int digests = (s->flags & WSYNC_STAGING_NO_DIGESTS) == 0;
    /* The copy kernel takes the plain tensors in plugin memory, ops [0, np); a tensor in plugin
     * memory whose src_dtype differs is the convert kernel's (one launch); a tensor in
     * registered host memory crosses PCIe on the copy engines (wsync_cuda_bounce_stage),
     * converted behind them when its dtype differs. With digests, every tensor the copy kernel
     * does not write gets a digest op of its staged bytes at [np, n), summed once all landed. */
    uint64_t chunks = 0, tiles = 0;
    size_t np = 0, nc = 0, nh = 0;
    for (size_t i = 0; i < n; i++) {
        const wsync_stage_tensor_t *x = &t[lay.from[i]];
        const wsync_dtype_t sdt = wsync_stage_src_dtype(x);
        const uint64_t nbytes = lay.tensors[i].nbytes;
        const uint64_t elems = nbytes / wsync_dtype_size(x->dtype);
        const int host =
            x->src != NULL && wsync_host_ranges_hold(x->src, elems * wsync_dtype_size(sdt));
        const void *src = x->src;
        unsigned char *dst = s->dev + lay.tensors[i].offset;
        s->slot[i] = SIZE_MAX;
        if (host && nbytes > 0)
            s->hops[nh++] = (wsync_cuda_host_op_t){
                .src = x->src, .dst = dst, .elems = elems, .src_dtype = sdt, .dst_dtype = x->dtype};
        else if (sdt == x->dtype) {
            s->slot[i] = np;
            chunks +=
                wsync_cuda_plan_op(&table[np++], src, dst, nbytes, nbytes, 1, nbytes, 1, chunks);
        } else {
            tiles += wsync_cuda_conv_plan_copy(&s->conv_host[nc++], src, sdt,
                                               elems * wsync_dtype_size(sdt), dst, x->dtype, nbytes,
                                               1, elems, 1.0, tiles);
        }
    }
    uint64_t dchunks = 0;
    size_t nd = 0;
    for (size_t i = 0; i < n && digests && np < n; i++) {
        if (s->slot[i] != SIZE_MAX)
            continue;
        unsigned char *dst = s->dev + lay.tensors[i].offset;
        const uint64_t nbytes = lay.tensors[i].nbytes;
        s->slot[i] = np + nd;
        dchunks +=
            wsync_cuda_plan_op(&table[np + nd++], dst, dst, nbytes, nbytes, 1, nbytes, 1, dchunks);
    }
    const size_t ops = wsync_cuda_slot_ops_bytes(n);
    memset(s->table_host + ops, 0, n * sizeof(uint64_t));
    unsigned long long *sums = (unsigned long long *)(s->table_dev + ops);
    cudaError_t e = cudaSuccess;
    if (nh > 0) {
        rc = wsync_cuda_bounce_stage(&s->bounce, st, s->hops, nh, s->sm_count, err);
        if (rc != WSYNC_OK)
            goto out;
    }
    if (nc > 0) {
        e = cudaMemcpyAsync(s->conv_dev, s->conv_host, nc * sizeof(*s->conv_dev),
                            cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess && tiles > 0)
            e = wsync_cuda_launch_convert(s->conv_dev, (uint32_t)nc, tiles, s->sm_count, st);
        if (e != cudaSuccess) {
            rc = wsync_cuda_fail(err, e, "stage", "enqueueing the converting copies");
            goto out;
        }
    }
    /* Without digests the copy engines take a share of the large tensors, as in copy_weights
     * (the kernel alone sums digests): forked from st, joined back before *staged*. */
    wsync_cuda_split_t sp = {.n_kernel = np, .chunks = chunks};
    if (np > 0 && !digests) {
        rc = wsync_cuda_lane_split(&s->lane, table, np, &wsync_cuda_tuning_now(&s->tuning)->split,
                                   st, "stage", &sp, err);
        if (rc != WSYNC_OK)
            goto out;
    }
    if (sp.n_kernel > 0 || nd > 0) {
        e = cudaMemcpyAsync(s->table_dev, s->table_host,
                            digests ? ops + n * sizeof(uint64_t)
                                    : wsync_cuda_slot_ops_bytes(sp.n_kernel),
                            cudaMemcpyHostToDevice, st);
        /* local memory: contiguous chunk ranges measured fastest (docs/PERFORMANCE.md) */
        const wsync_cuda_launch_cfg_t cfg = {.variant = WSYNC_CUDA_STAGE_VARIANT};
        if (e == cudaSuccess && sp.n_kernel > 0)
            e = wsync_cuda_launch_copy((const wsync_cuda_op_t *)s->table_dev, (uint32_t)sp.n_kernel,
                                       sp.chunks, sums, digests, s->sm_count, &cfg, st);
        if (e == cudaSuccess && nd > 0)
            e = wsync_cuda_launch_digest((const wsync_cuda_op_t *)s->table_dev + np, (uint32_t)nd,
                                         dchunks, sums + np, s->sm_count, 0, st);
        if (e == cudaSuccess && digests)
            e = cudaMemcpyAsync(sums_back(s), sums, n * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                st);
    }
    if (e != cudaSuccess)
        wsync_cuda_lane_drop(&sp);
    /* the copy engines' share after the kernel's launch, so the GPU starts at once; joined
     * whatever was enqueued */
    if (e == cudaSuccess) {
        rc = wsync_cuda_lane_run(&s->lane, &sp, s->tuning.ce_per_op, "stage", err);
        e = wsync_cuda_lane_join(&s->lane, &sp, st);
        if (rc != WSYNC_OK)
            goto out;
    }
    if (e == cudaSuccess)
        e = cudaEventRecord(s->staged, st);
    if (e != cudaSuccess) {
        rc = wsync_cuda_fail(err, e, "stage", "enqueueing the stage copy");
        goto out;
    }
    s->have_table_use = 1;
    atomic_fetch_add(&wsync_cuda_stats.launches, 1);
    if ((s->flags & WSYNC_STAGING_FIXED_LAYOUT) && !s->have_retained) {
        /* keep the first bucket's layout for life; the current one is a second build */
        s->retained = lay;
        s->have_retained = 1;
        rc = wsync_layout_build(t, n, s->bytes, &lay, err);
        if (rc != WSYNC_OK)
            return rc;
    }
    if (s->have_current)
        wsync_layout_free(&s->current);
    s->current = lay;
    s->have_current = 1;
    return WSYNC_OK;
out:
    wsync_layout_free(&lay);
    return rc;
}

static wsync_result_t staging_stage(struct wsync_staging *s, wsync_stream_t stream,
                                    const wsync_stage_tensor_t *t, size_t n, wsync_error_t *err)
{
    if (s == NULL || (t == NULL && n > 0) || n > UINT32_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "stage needs a staging and tensors");
    wsync_result_t sizes = wsync_stage_sizes_check(t, n, err);
    if (sizes != WSYNC_OK)
        return sizes;
    /* Direct mode: no storage of ours is reused, so several buckets of one sync may be in flight
     * (the caller waits for consumed before it writes its tensors). */
    if (s->flags & WSYNC_STAGING_DIRECT) {
        cudaSetDevice(s->device);
        return wsync_cuda_direct_stage(&s->exports, s->device, s->uuid, t, n, &s->direct, err);
    }
    /* The exporter-storage rule (docs/DESIGN.md §1.2): never overwrite storage a consumer may still
     * read. */
    if (s->waited < s->generation)
        return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                          "generation %llu of %s published but not yet consumed (waited for "
                          "%llu); call wait_consumed after the consumer's ack before staging "
                          "again",
                          (unsigned long long)s->generation, s->control_shm.name,
                          (unsigned long long)s->waited);
    wsync_cuda_range_push("wsync:stage");
    cudaSetDevice(s->device);
    cudaStream_t st = wsync_cuda_stream(stream);
    /* No stream wait is needed: wait_consumed returned only after the consumer's stream had
     * passed its copies of the previous generation (the control word moves in stream order). */
    wsync_result_t rc = stage_body(s, st, t, n, err);
    wsync_cuda_range_pop();
    return rc;
}

static wsync_result_t publish_body(struct wsync_staging *s, cudaStream_t st, int finished,
                                   const char **json, uint64_t *generation, wsync_error_t *err)
{
    static const wsync_tensor_desc_t none;
    /* Direct mode, every write queued on st already done (a bucket after the first of a sync:
     * its stage queued nothing): *ready*'s last record, polled to completion by the publish
     * before, already follows them, so no new record. A new one would wait for this context's
     * turn on a GPU that the engine's copy of the bucket before holds (about 1.8 ms a bucket,
     * wsync-bench-cuda (e)). */
    const int settled = s->direct.have && !s->have_table_use && s->generation > 0 &&
                        cudaStreamQuery(st) == cudaSuccess;
    const int digests = (s->flags & WSYNC_STAGING_NO_DIGESTS) == 0;
    if (!settled) {
        /* ready follows the stage work even when publish uses another stream */
        if (s->have_table_use)
            WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(st, s->staged, 0));
        WSYNC_CUDA_TRY(err, cudaEventRecord(s->ready, st));
        /* Wait for *ready* itself (after the stage copy and the digests it summed, read back with
         * it) before the manifest exists: a manifest never precedes its bytes, and no record of the
         * interprocess event is still queued when a consumer can first wait on it, so a producer
         * that dies after publishing cannot leave an engine stream waiting on a *ready* that will
         * never fire. */
        if (s->have_table_use)
            WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->staged));
        /* *ready* follows *staged* on st; polled until done, so no record of it is still queued
         * when the manifest exists. */
        cudaError_t q;
        while ((q = cudaEventQuery(s->ready)) == cudaErrorNotReady)
            sched_yield();
        if (q != cudaSuccess)
            return wsync_cuda_fail(err, q, __func__, "cudaEventQuery(ready)");
    }
    wsync_manifest_t m;
    memset(&m, 0, sizeof(m));
    m.struct_size = sizeof(m);
    m.schema = WSYNC_MANIFEST_SCHEMA;
    m.generation = s->generation + 1;
    m.finished = finished != 0;
    wsync_buffer_desc_t *b = &m.buffer;
    b->struct_size = sizeof(*b);
    b->kind = s->kind;
    if (s->kind == WSYNC_BUFFER_CUDA_VMM_FD) {
        wsync_cuda_vmm_handle(&s->vmm, b->handle, &b->handle_len);
    } else {
        memcpy(b->handle, &s->mem_handle, sizeof(s->mem_handle));
        b->handle_len = sizeof(s->mem_handle);
    }
    b->bytes = s->bytes;
    b->pid = (int64_t)getpid();
    snprintf(b->device, sizeof(b->device), "%s", s->uuid);
    memcpy(b->ready, &s->ready_handle, sizeof(s->ready_handle));
    b->ready_len = sizeof(s->ready_handle);
    b->has_ready = 1;
    /* No *consumed* event: an engine killed with a record of an interprocess event still
     * queued leaves that event unable to complete, and every later record or wait on it, in
     * any process, hangs (found by torture_gpu_fault). The control block carries consumed. */
    snprintf(b->control, sizeof(b->control), "%s", s->control_shm.name);
    if (s->have_current) {
        const uint64_t *sums = sums_back(s);
        for (size_t i = 0; i < s->current.n && digests; i++) {
            s->current.tensors[i].digest =
                wsync_mix64(sums[s->slot[i]] ^ s->current.tensors[i].nbytes);
            s->current.tensors[i].has_digest = 1;
        }
        m.n_tensors = s->current.n;
        m.tensors = s->current.tensors;
    } else {
        m.tensors = &none;
    }
    char *text = NULL;
    wsync_result_t rc = s->direct.have ? wsync_direct_emit(wsync_direct_current(&s->direct), b,
                                                           m.generation, m.finished, &text, err)
                                       : wsync_manifest_emit(&m, &text, err);
    if (rc != WSYNC_OK)
        return rc;
    free(s->manifest_json);
    s->manifest_json = text;
    s->generation = m.generation;
    wsync_control_publish(s->control, s->generation);
    wsync_control_signal_ready(s->control, s->generation);
    if (s->have_current) {
        wsync_layout_free(&s->current);
        s->have_current = 0;
    }
    *json = s->manifest_json;
    if (generation)
        *generation = s->generation;
    return WSYNC_OK;
}

static wsync_result_t staging_publish(struct wsync_staging *s, wsync_stream_t stream, int finished,
                                      const char **json, uint64_t *generation, wsync_error_t *err)
{
    if (s == NULL || json == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "publish needs a staging and json");
    wsync_cuda_range_push("wsync:publish");
    cudaSetDevice(s->device);
    wsync_result_t rc = publish_body(s, wsync_cuda_stream(stream), finished, json, generation, err);
    wsync_cuda_range_pop();
    return rc;
}

static wsync_result_t staging_wait_consumed(struct wsync_staging *s, wsync_stream_t stream,
                                            uint64_t generation, wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "wait_consumed(NULL)");
    if (generation == 0 || generation > s->generation)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "wait_consumed(%llu): only generations 1..%llu were published",
                          (unsigned long long)generation, (unsigned long long)s->generation);
    /* The consumer's stream bumps the control word once its copies are done (a stream memory
     * write after them, or a host function): this bounded host wait covers them, so any GPU work
     * enqueued after it is ordered after the copies, and it reports a consumer that died mid-copy
     * (PEER_GONE) or stalls (TIMEOUT). */
    (void)stream;
    wsync_result_t rc = wsync_control_wait_consumed(s->control, generation, s->timeout_ms,
                                                    atomic_load(&s->control->consumer_pid), err);
    if (rc != WSYNC_OK)
        return rc;
    if (generation > s->waited)
        s->waited = generation;
    return WSYNC_OK;
}

static wsync_result_t staging_retire(struct wsync_staging *s, wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "retire(NULL)");
    wsync_result_t rc = wsync_control_retire(s->control, s->control_shm.name, err);
    if (rc != WSYNC_OK)
        return rc;
    cudaSetDevice(s->device);
    staging_free(s);
    return WSYNC_OK;
}

static wsync_result_t staging_stream_create(struct wsync_staging *s, wsync_stream_t *out,
                                            wsync_error_t *err)
{
    if (s == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "stream_create needs s and out");
    cudaSetDevice(s->device);
    cudaStream_t st;
    WSYNC_CUDA_TRY(err, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *out = st;
    return WSYNC_OK;
}

static wsync_result_t staging_stream_destroy(struct wsync_staging *s, wsync_stream_t st,
                                             wsync_error_t *err)
{
    if (s == NULL || st == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "stream_destroy needs a stream made by stream_create");
    WSYNC_CUDA_TRY(err, cudaStreamDestroy((cudaStream_t)st));
    return WSYNC_OK;
}

static wsync_result_t staging_stream_synchronize(struct wsync_staging *s, wsync_stream_t st,
                                                 wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "stream_synchronize(NULL)");
    WSYNC_CUDA_TRY(err, cudaStreamSynchronize(wsync_cuda_stream(st)));
    return WSYNC_OK;
}

static wsync_result_t staging_read_back(struct wsync_staging *s, uint64_t offset, void *dst,
                                        size_t bytes, wsync_error_t *err)
{
    if (s == NULL || (dst == NULL && bytes > 0))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "read_back needs s and dst");
    if (offset > s->bytes || bytes > s->bytes - offset)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "read_back offset %llu + %zu bytes exceeds the staging size %llu",
                          (unsigned long long)offset, bytes, (unsigned long long)s->bytes);
    cudaSetDevice(s->device);
    if (s->have_table_use)
        WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->staged));
    WSYNC_CUDA_TRY(err, cudaMemcpy(dst, s->dev + offset, bytes, cudaMemcpyDeviceToHost));
    return WSYNC_OK;
}

const wsync_producer_ops_v1_t wsync_cuda_producer_ops = {
    .struct_size = sizeof(wsync_producer_ops_v1_t),
    .abi_version = WSYNC_ABI_VERSION_1,
    .create = staging_create,
    .stage = staging_stage,
    .publish = staging_publish,
    .wait_consumed = staging_wait_consumed,
    .retire = staging_retire,
    .stream_create = staging_stream_create,
    .stream_destroy = staging_stream_destroy,
    .stream_synchronize = staging_stream_synchronize,
    .read_back = staging_read_back,
    .register_host = wsync_cuda_register_host,
    .unregister_host = wsync_cuda_unregister_host,
};
