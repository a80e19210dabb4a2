/* copy_weights and record_consumed: the consumer's hot path. One validated, stream-ordered launch
 * per call; *consumed* recorded on the stream(s) that carried the copies, never another. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_digest.h"
#include "wsync_quant_kernel.h"
#include "wsync_error.h"
#include "wsync_fp8.h"
#include "wsync_log.h"
#include "wsync_validate.h"

static wsync_result_t check_handle(struct wsync_consumer *c, struct wsync_handle *h,
                                   const char *where, wsync_error_t *err)
{
    if (c == NULL || h == NULL || h->magic != WSYNC_CUDA_HANDLE_MAGIC)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, where,
                          "handle %p is not an open handle (open_handle first; closed handles "
                          "cannot be reused)",
                          (void *)h);
    return WSYNC_OK;
}

/* The carrier entry of `s` in m: a new one gets its event; an idle one evicted for it is drained
 * first, so close_handle's wait on the slot's event still covers the evicted stream's copies. */
static wsync_result_t stream_use(wsync_cuda_mapping_t *m, cudaStream_t s, wsync_carrier_t **out,
                                 wsync_error_t *err)
{
    wsync_carrier_t evicted;
    wsync_carrier_t *u = wsync_carriers_use(&m->carriers, (void *)s, &evicted);
    if (u == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                          "%d streams copied from this buffer without record_consumed; call "
                          "record_consumed before using more streams",
                          WSYNC_CARRIER_MAX);
    if (u->event == NULL) {
        cudaEvent_t ev;
        cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)wsync_carriers_forget(&m->carriers, (void *)s);
            return wsync_cuda_fail(err, e, __func__, "cudaEventCreateWithFlags");
        }
        u->event = ev;
    } else if (evicted.stream != NULL) {
        WSYNC_CUDA_TRY(err, cudaEventSynchronize((cudaEvent_t)u->event));
    }
    *out = u;
    return WSYNC_OK;
}

/* The copy kernel's shape (docs/PERFORMANCE.md): the measured default for the source, contiguous
 * chunk ranges for cuda_vmm_fd mappings (they read like local memory), interleaved chunks for
 * legacy IPC mappings; an experiment's variant in the tunable build (wsync_cuda_tuning.h), where
 * variant 7 is cudaMemcpyBatchAsync and 8 the same asking for the copy engines
 * (cudaMemcpyFlagPreferOverlapWithCompute), both for flat ops without verification only. */
static void launch_cfg(wsync_cuda_launch_cfg_t *cfg, const wsync_cuda_tuning_t *tu, int is_vmm)
{
    cfg->variant = tu->kernel_variant >= 0 ? tu->kernel_variant
                   : is_vmm                ? WSYNC_CUDA_VMM_VARIANT
                                           : WSYNC_CUDA_DEFAULT_VARIANT;
    cfg->blocks_per_sm = tu->blocks_per_sm;
    cfg->flat = 0;
}

/* One launch of `ops` whose sources are src_base + src_offset, ordered after h's *ready*: the
 * ops are validated (copy_weights: against h; copy_segments: each against its segment, with
 * src_base 0 and absolute source addresses). */
/* A control block's *ready* on the host: the manifest normally arrives after ready was
 * recorded; this only bounds a replay. (A ready event is waited for on the stream.) */
static wsync_result_t host_ready(struct wsync_consumer *c, wsync_cuda_mapping_t *m,
                                 uint64_t generation, wsync_error_t *err)
{
    if (m->control == NULL || atomic_load(&m->control->ready_generation) >= generation)
        return WSYNC_OK;
    return wsync_control_wait_ready(m->control, generation, c->timeout_ms, m->control->producer_pid,
                                    err);
}

/* More work of the same call, enqueued on s before the copies (after the copy engines' fork) and
 * before the events that *consumed* and close_handle wait on (copy_quantized's quantizing
 * kernel). */
typedef struct copy_extra {
    cudaError_t (*fn)(void *arg, cudaStream_t s);
    void *arg;
} copy_extra_t;

static wsync_result_t copy_locked_with(struct wsync_consumer *c, struct wsync_handle *h,
                                       cudaStream_t s, uint64_t generation,
                                       const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                       uintptr_t src_base, wsync_cuda_slot_t **launched,
                                       const copy_extra_t *extra, wsync_error_t *err);

static wsync_result_t copy_locked(struct wsync_consumer *c, struct wsync_handle *h, cudaStream_t s,
                                  uint64_t generation, const wsync_copy_op_t *ops, size_t n_ops,
                                  uint32_t flags, uintptr_t src_base, wsync_cuda_slot_t **launched,
                                  wsync_error_t *err)
{
    return copy_locked_with(c, h, s, generation, ops, n_ops, flags, src_base, launched, NULL, err);
}

static wsync_result_t copy_locked_with(struct wsync_consumer *c, struct wsync_handle *h,
                                       cudaStream_t s, uint64_t generation,
                                       const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                       uintptr_t src_base, wsync_cuda_slot_t **launched,
                                       const copy_extra_t *extra, wsync_error_t *err)
{
    wsync_cache_entry_t *entry = h->entry;
    wsync_cuda_mapping_t *m = entry->mapping;
    const int verify = (flags & WSYNC_COPY_VERIFY) != 0;
    wsync_result_t rc;
    /* Several calls (e.g. one per stream) may carry one generation until it is recorded. */
    rc = wsync_validate_generation(wsync_cuda_last_generation(entry, m, generation), generation,
                                   err);
    if (rc == WSYNC_OK && m->control != NULL)
        rc = wsync_control_check_published(m->control, generation, m->control_shm.name, err);
    if (rc != WSYNC_OK)
        return rc;
    if ((rc = host_ready(c, m, generation, err)) != WSYNC_OK)
        return rc;
    wsync_carrier_t *use = NULL;
    rc = stream_use(m, s, &use, err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_cuda_slot_t *slot = NULL;
    rc = wsync_cuda_ring_take(&c->ring, n_ops, &slot, err);
    if (rc != WSYNC_OK)
        return rc;

    wsync_cuda_op_t *table = (wsync_cuda_op_t *)slot->host;
    const size_t ops_bytes = wsync_cuda_slot_ops_bytes(n_ops);
    uint64_t chunks = 0;
    int flat = 1;
    for (size_t i = 0; i < n_ops; i++) {
        const wsync_copy_op_t *o = &ops[i];
        const int dig = verify && o->has_digest;
        chunks +=
            wsync_cuda_plan_op(&table[i], (unsigned char *)(src_base + o->src_offset), o->dst,
                               o->src_pitch, o->dst_pitch, o->rows, o->row_bytes, dig, chunks);
        flat &= wsync_cuda_op_is_flat(&table[i]);
        if (verify) {
            slot->expected[i] = o->digest;
            slot->nbytes[i] = dig ? o->rows * o->row_bytes : WSYNC_CUDA_NO_DIGEST;
            slot->op_index[i] = i;
        }
    }
    if (verify)
        memset(slot->host + ops_bytes, 0, n_ops * sizeof(uint64_t));
    unsigned long long *sums = (unsigned long long *)(slot->dev + ops_bytes);

    if (m->has_ready)
        WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(s, m->ready, 0));
    const wsync_cuda_tuning_t *tu = wsync_cuda_tuning_now(&c->tuning);
    wsync_cuda_launch_cfg_t cfg;
    launch_cfg(&cfg, tu, m->is_vmm);
    cfg.flat = flat;
#ifdef WSYNC_CUDA_TUNABLE /* variants 7 and 8: the copy engines alone, an experiment */
    const int batch = cfg.variant == WSYNC_CUDA_VARIANT_BATCH_MEMCPY ||
                      cfg.variant == WSYNC_CUDA_VARIANT_BATCH_OVERLAP;
    if (n_ops > 0 && batch && flat && !verify) {
        rc = wsync_cuda_batch_memcpy(table, n_ops, cfg.variant == WSYNC_CUDA_VARIANT_BATCH_OVERLAP,
                                     tu->ce_per_op, s, "copy_weights", err);
        if (rc != WSYNC_OK)
            return rc;
    } else
#endif
        if (n_ops > 0) {
        /* Without verification the copy engines take a share of the large ops (digests are
         * summed by the kernel only). */
        wsync_cuda_split_t sp = {.n_kernel = n_ops, .chunks = chunks};
        if (!verify) {
            rc = wsync_cuda_lane_split(&c->lane, table, n_ops, &tu->split, s, "copy_weights", &sp,
                                       err);
            if (rc != WSYNC_OK)
                return rc;
        }
        const size_t n_k = sp.n_kernel;
        /* with verify, n_k == n_ops and the zeroed sums follow the table */
        const size_t up =
            verify ? ops_bytes + n_ops * sizeof(uint64_t) : wsync_cuda_slot_ops_bytes(n_k);
        /* more work of the call (the quantizing kernel, the call's largest) first: queued behind
         * the copy engines' share it started 0.6-1.2 ms late (docs/PERFORMANCE.md); the fork is
         * recorded, so the copy engines' share does not wait for it */
        cudaError_t xe = cudaSuccess;
        if (extra != NULL)
            xe = extra->fn(extra->arg, s);
        extra = NULL;
        if (xe != cudaSuccess) {
            wsync_cuda_lane_drop(&sp);
            return wsync_cuda_fail(err, xe, "copy_quantized", "launching the quantizing kernel");
        }
        cudaError_t e = cudaSuccess;
        if (n_k > 0) {
            e = cudaMemcpyAsync(slot->dev, slot->host, up, cudaMemcpyHostToDevice, s);
            if (e == cudaSuccess)
                e = wsync_cuda_launch_copy((const wsync_cuda_op_t *)slot->dev, (uint32_t)n_k,
                                           sp.chunks, sums, verify, c->sm_count, &cfg, s);
        }
        if (e != cudaSuccess) {
            wsync_cuda_lane_drop(&sp);
            return wsync_cuda_fail(err, e, "copy_weights", "launching the copy kernel");
        }
        /* the copy engines' share after the kernel's launch, so the GPU starts at once */
        rc = wsync_cuda_lane_run(&c->lane, &sp, tu->ce_per_op, "copy_weights", err);
        /* the caller's stream carries both shares from here on, whatever was enqueued */
        e = wsync_cuda_lane_join(&c->lane, &sp, s);
        if (rc != WSYNC_OK)
            return rc;
        if (e != cudaSuccess)
            return wsync_cuda_fail(err, e, "copy_weights", "joining the copy engines' share");
        atomic_fetch_add(&wsync_cuda_stats.launches, 1);
        if (verify) {
            unsigned char *back =
                slot->host + wsync_cuda_slot_ops_bytes(slot->cap_ops) + slot->cap_ops * 8u;
            WSYNC_CUDA_TRY(err, cudaMemcpyAsync(back, sums, n_ops * sizeof(uint64_t),
                                                cudaMemcpyDeviceToHost, s));
            slot->owner = m;
            slot->n_ops = n_ops;
            slot->generation = generation;
        }
    }
    if (extra != NULL) {
        cudaError_t e = extra->fn(extra->arg, s);
        if (e != cudaSuccess)
            return wsync_cuda_fail(err, e, "copy_quantized", "launching the quantizing kernel");
    }
    WSYNC_CUDA_TRY(err, cudaEventRecord(slot->done, s));
    slot->used = 1;
    if (launched != NULL)
        *launched = slot;
    WSYNC_CUDA_TRY(err, cudaEventRecord((cudaEvent_t)use->event, s));
    use->pending = 1;
    entry->last_generation = generation;
    m->copied_generation = generation;
    m->recorded = 0;
    atomic_fetch_add(&wsync_cuda_stats.copy_calls, 1);
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_copy_weights(struct wsync_consumer *c, struct wsync_handle *h,
                                       wsync_stream_t stream, uint64_t generation,
                                       const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                       wsync_error_t *err)
{
    wsync_result_t rc = check_handle(c, h, __func__, err);
    if (rc != WSYNC_OK)
        return rc;
    if ((rc = wsync_validate_copy_args(ops, n_ops, flags, err)) != WSYNC_OK)
        return rc;
    wsync_cuda_range_push("wsync:copy_weights");
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    if (h->segment)
        rc = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                        "handle %p is a segment of a direct manifest: copy with copy_segments and "
                        "the manifest buffer's handle",
                        (void *)h);
    else if ((rc = wsync_validate_copy_ops_memo(&c->valid, ops, n_ops, h->bytes, err)) == WSYNC_OK)
        rc = copy_locked(
            c, h, wsync_cuda_stream(stream), generation, ops, n_ops, flags,
            (uintptr_t)(((wsync_cuda_mapping_t *)h->entry->mapping)->base + h->base_offset), NULL,
            err);
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    return rc;
}

typedef struct cuda_segs {
    struct wsync_consumer *c;
    struct wsync_handle *const *segs;
} cuda_segs_t;

static int cuda_segment(void *user, size_t k, uint64_t *bytes, uint64_t *base)
{
    const cuda_segs_t *x = user;
    struct wsync_handle *s = x->segs[k];
    if (check_handle(x->c, s, "copy_segments", NULL) != WSYNC_OK || !s->segment)
        return -1;
    const wsync_cuda_mapping_t *m = s->entry->mapping;
    *bytes = s->bytes;
    *base = (uint64_t)(uintptr_t)(m->base + s->base_offset);
    return 0;
}

/* Direct mode: every op of every segment in one launch after h's *ready*; each segment's mapping
 * notes the launch (so unmapping it waits for these copies), h carries *consumed*. */
wsync_result_t wsync_cuda_copy_segments(struct wsync_consumer *c, struct wsync_handle *h,
                                        struct wsync_handle *const *segs, size_t n_segs,
                                        wsync_stream_t stream, uint64_t generation,
                                        const wsync_copy_op_t *ops, const uint32_t *op_segment,
                                        size_t n_ops, uint32_t flags, wsync_error_t *err)
{
    wsync_result_t rc = check_handle(c, h, __func__, err);
    if (rc != WSYNC_OK)
        return rc;
    if (h->segment || n_segs == 0 || segs == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "copy_segments needs the manifest buffer's handle and its %zu segments' "
                          "handles",
                          n_segs);
    if ((rc = wsync_validate_copy_args(ops, n_ops, flags, err)) != WSYNC_OK)
        return rc;
    const wsync_cuda_mapping_t *hm = h->entry->mapping;
    for (size_t k = 0; k < n_segs; k++) {
        if (check_handle(c, segs[k], __func__, NULL) != WSYNC_OK || !segs[k]->segment)
            continue; /* wsync_validate_segments names it */
        const wsync_cuda_mapping_t *sm = segs[k]->entry->mapping;
        if (sm->peer_pid != 0 && sm->peer_pid != hm->peer_pid)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "segment %zu names producer pid %lld, but the manifest's buffer was "
                              "published by pid %lld: a direct bucket reads only its producer",
                              k, (long long)sm->peer_pid, (long long)hm->peer_pid);
    }
    cuda_segs_t sg = {.c = c, .segs = segs};
    wsync_copy_op_t *moved = NULL;
    wsync_cuda_range_push("wsync:copy_segments");
    cudaSetDevice(c->device);
    const cudaStream_t s = wsync_cuda_stream(stream);
    pthread_mutex_lock(&c->lock);
    wsync_cuda_slot_t *slot = NULL;
    rc = wsync_validate_segments(&c->valid, ops, op_segment, n_ops, n_segs, cuda_segment, &sg,
                                 "the open handle of a direct manifest's segment", &moved, err);
    if (rc == WSYNC_OK)
        rc = copy_locked(c, h, s, generation, moved, n_ops, flags, 0, &slot, err);
    for (size_t k = 0; rc == WSYNC_OK && k < n_segs; k++) {
        wsync_cuda_mapping_t *sm = segs[k]->entry->mapping;
        sm->guard = slot; /* the unmap waits for this launch (the slot's done event) */
        sm->guard_uses = slot != NULL ? slot->uses : 0;
    }
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    free(moved);
    return rc;
}

/* Check the digests of every finished (or, with wait, every) copy from m. */
static wsync_result_t check_digests(struct wsync_consumer *c, wsync_cuda_mapping_t *m, int wait,
                                    wsync_error_t *err)
{
    wsync_result_t rc = WSYNC_OK;
    for (unsigned i = 0; i < WSYNC_CUDA_RING_SLOTS; i++) {
        wsync_cuda_slot_t *s = &c->ring.slot[i];
        if (s->owner != m)
            continue;
        if (wait) {
            cudaError_t e = cudaEventSynchronize(s->done);
            if (e != cudaSuccess)
                return wsync_cuda_fail(err, e, __func__, "cudaEventSynchronize(copy done)");
        } else if (cudaEventQuery(s->done) != cudaSuccess) {
            continue; /* surfaces at the next record */
        }
        wsync_result_t r = wsync_cuda_slot_check(s, err);
        if (rc == WSYNC_OK)
            rc = r;
    }
    if (m->deferred.code != WSYNC_OK) {
        wsync_result_t r = WSYNC_FAIL_FROM(err, &m->deferred, "%s", m->deferred.message);
        wsync_error_clear(&m->deferred);
        if (rc == WSYNC_OK)
            rc = r;
    }
    return rc;
}

static wsync_result_t record_locked(struct wsync_consumer *c, struct wsync_handle *h, int wait,
                                    wsync_error_t *err)
{
    wsync_cuda_mapping_t *m = h->entry->mapping;
    wsync_result_t rc;
    wsync_carrier_t *pend[WSYNC_CARRIER_MAX];
    const size_t n = wsync_carriers_pending(&m->carriers, pend);
    for (size_t i = 1; i < n; i++) /* join: the first copy stream waits for every other one */
        WSYNC_CUDA_TRY(err, cudaStreamWaitEvent((cudaStream_t)pend[0]->stream,
                                                (cudaEvent_t)pend[i]->event, 0));
    wsync_carriers_settle(&m->carriers);
    if (n > 0) {
        cudaStream_t first = (cudaStream_t)pend[0]->stream;
        cudaEvent_t last = (cudaEvent_t)pend[0]->event;
        rc = wsync_cuda_signal_consumed(m, first, err);
        if (rc != WSYNC_OK)
            return rc;
        WSYNC_CUDA_TRY(err, cudaEventRecord(last, first));
        m->recorded = 1;
        if (wait)
            WSYNC_CUDA_TRY(err, cudaEventSynchronize(last));
    }
    atomic_fetch_add(&wsync_cuda_stats.records, 1);
    return check_digests(c, m, wait, err);
}

wsync_result_t wsync_cuda_record_consumed(struct wsync_consumer *c, struct wsync_handle *h,
                                          int wait, wsync_error_t *err)
{
    wsync_result_t rc = check_handle(c, h, __func__, err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_cuda_range_push("wsync:record_consumed");
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    rc = record_locked(c, h, wait, err);
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    wsync_cuda_stats_log(c->tuning.stats);
    return rc;
}

/* The digest kernel's shape: 0, the plugin's; another of WSYNC_CUDA_DIGEST_VARIANTS in the
 * tunable build (wsync_cuda_tuning.h, docs/PERFORMANCE.md). */
static int digest_variant(struct wsync_consumer *c)
{
    const int k = wsync_cuda_tuning_now(&c->tuning)->digest_variant;
    return k >= 0 && k < WSYNC_CUDA_DIGEST_VARIANTS ? k : 0;
}

/* The weight checker: one digest pass (the copy kernel without its stores) over every region. */
wsync_result_t wsync_cuda_digest_regions(struct wsync_consumer *c, wsync_stream_t stream,
                                         const wsync_copy_op_t *regions, size_t n, uint64_t *out,
                                         wsync_error_t *err)
{
    wsync_result_t vr = wsync_validate_regions(c, regions, n, out, err);
    if (vr != WSYNC_OK)
        return vr;
    if (n == 0)
        return WSYNC_OK;
    wsync_cuda_range_push("wsync:digest_regions");
    cudaSetDevice(c->device);
    const cudaStream_t s = wsync_cuda_stream(stream);
    pthread_mutex_lock(&c->lock);
    wsync_cuda_slot_t *slot = NULL;
    wsync_result_t rc = wsync_cuda_ring_take(&c->ring, n, &slot, err);
    if (rc == WSYNC_OK) {
        wsync_cuda_op_t *table = (wsync_cuda_op_t *)slot->host;
        const size_t ops_bytes = wsync_cuda_slot_ops_bytes(n);
        uint64_t chunks = 0;
        for (size_t i = 0; i < n; i++) {
            const wsync_copy_op_t *r = &regions[i];
            const uint64_t pitch = r->rows > 1 ? r->dst_pitch : r->row_bytes;
            chunks += wsync_cuda_plan_op(&table[i], r->dst, r->dst, pitch, pitch, r->rows,
                                         r->row_bytes, 1, chunks);
        }
        memset(slot->host + ops_bytes, 0, n * sizeof(uint64_t));
        unsigned long long *sums = (unsigned long long *)(slot->dev + ops_bytes);
        unsigned char *back =
            slot->host + wsync_cuda_slot_ops_bytes(slot->cap_ops) + slot->cap_ops * 8u;
        cudaError_t e = cudaMemcpyAsync(slot->dev, slot->host, ops_bytes + n * sizeof(uint64_t),
                                        cudaMemcpyHostToDevice, s);
        if (e == cudaSuccess)
            e = wsync_cuda_launch_digest((const wsync_cuda_op_t *)slot->dev, (uint32_t)n, chunks,
                                         sums, c->sm_count, digest_variant(c), s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(back, sums, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess)
            e = cudaEventRecord(slot->done, s);
        if (e == cudaSuccess) {
            slot->used = 1;
            e = cudaEventSynchronize(slot->done);
        }
        if (e != cudaSuccess)
            rc = wsync_cuda_fail(err, e, "digest_regions", "the digest pass");
        const uint64_t *got = (const uint64_t *)back;
        for (size_t i = 0; rc == WSYNC_OK && i < n; i++)
            out[i] = wsync_mix64(got[i] ^ (regions[i].rows * regions[i].row_bytes));
    }
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    return rc;
}

/* ------------------------------------------------------------------ copy_quantized */

typedef struct quant_launch {
    const wsync_cuda_qop_t *dev;
    uint32_t n;
    uint64_t blocks;
    unsigned long long *flag; /* one pass: the first bad value's key (device) */
    unsigned int *amax;       /* per per-tensor scale: its amax (device), taken by the scan */
    uint32_t flags;           /* WSYNC_CUDA_QUANT_VEC_BLOCKS */
    wsync_cuda_slot_t *slot;  /* the ring slot holding dev */
} quant_launch_t;

/* The call's last use of its ring slot: reusable once the stream has passed here. */
static void quant_release(wsync_cuda_slot_t *slot, cudaStream_t s)
{
    if (slot != NULL && cudaEventRecord(slot->done, s) == cudaSuccess)
        slot->used = 1;
}

static cudaError_t quant_run(void *arg, cudaStream_t s)
{
    const quant_launch_t *q = arg;
    return wsync_cuda_quant_blocks(q->dev, q->n, q->blocks, q->flag, q->amax, q->flags, s);
}

/* WSYNC_CUDA_QUANT_VEC_BLOCKS when every op of the table is a BLOCK op read in vectors, unless
 * the tuning asks for the kernel without the look-ahead (quant_ahead 0). The look-ahead kernel
 * takes its blocks in strided order (quant_order RUNS: a contiguous run per CTA) and full bf16
 * blocks through its fast path (quant_generic: the general path); the kernel without look-ahead
 * (channel, tensor and mixed tables) takes contiguous runs unless quant_order STRIDED asks for
 * the strided order, which is not yet measured there; wsync_cuda_tuning.h, docs/PERFORMANCE.md. */
static uint32_t quant_flags(const wsync_cuda_tuning_t *tu, const wsync_cuda_qop_t *t, size_t n)
{
    const int runs = tu->quant_order == WSYNC_CUDA_QUANT_ORDER_RUNS;
    const int strided = tu->quant_order == WSYNC_CUDA_QUANT_ORDER_STRIDED;
    uint32_t f = tu->quant_generic ? WSYNC_CUDA_QUANT_GENERIC : 0u;
    int ahead = tu->quant_ahead;
    for (size_t k = 0; ahead && k < n; k++)
        if (t[k].kind != WSYNC_QUANT_FP8_BLOCK || !wsync_cuda_qop_vectors(&t[k]))
            ahead = 0;
    if (ahead)
        return f | WSYNC_CUDA_QUANT_VEC_BLOCKS | (runs ? 0u : WSYNC_CUDA_QUANT_STRIDED);
    return f | (strided ? WSYNC_CUDA_QUANT_STRIDED : 0u);
}

/* The call's quantized ops in launch order: the per-tensor ones first, each scale's ops together
 * (so the amax pass of a one-pass call is a scan of the table's head), then the rest in call
 * order. *n_tensor, *n_groups: how many per-tensor ops and scales. NULL when out of memory. */
static size_t *quant_order(const wsync_copy_op_t *ops, const wsync_quant_t *quant, size_t n_ops,
                           size_t nq, size_t *n_tensor, size_t *n_groups, uint32_t **group)
{
    size_t *order = calloc(nq ? nq : 1, sizeof(*order));
    uint32_t *g = calloc(nq ? nq : 1, sizeof(*g));
    wsync_fp8_ref_t *by = calloc(nq ? nq : 1, sizeof(*by));
    size_t nt = 0, k = 0, ng = 0;
    if (order == NULL || g == NULL || by == NULL) {
        free(order), free(g), free(by);
        return NULL;
    }
    for (size_t i = 0; i < n_ops; i++)
        if (quant[i].kind == WSYNC_QUANT_FP8_TENSOR && ops[i].rows > 0)
            by[nt++] = (wsync_fp8_ref_t){(uintptr_t)quant[i].scale_dst, i};
    qsort(by, nt, sizeof(*by), wsync_fp8_ref_cmp);
    for (size_t j = 0; j < nt; j++) {
        ng += j == 0 || by[j].scale != by[j - 1].scale;
        g[k] = (uint32_t)(ng - 1);
        order[k++] = by[j].op;
    }
    for (size_t i = 0; i < n_ops; i++)
        if (quant[i].kind != WSYNC_QUANT_NONE && quant[i].kind != WSYNC_QUANT_FP8_TENSOR &&
            ops[i].rows > 0)
            order[k++] = i;
    free(by);
    *n_tensor = nt, *n_groups = ng, *group = g;
    return order;
}

static wsync_result_t quant_bad(wsync_error_t *err, const size_t *from, unsigned long long bad,
                                const char *written)
{
    return WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, from[bad >> 44],
                         "op %zu: a NaN or infinite value at row %llu, column %llu of its source "
                         "cannot be quantized to fp8; %s",
                         from[bad >> 44], (bad >> 22) & 0x3fffffull, bad & 0x3fffffull, written);
}

/* The quantized ops on the device. Checked (without one_pass): their first NaN or infinity,
 * after *ready*, the host waiting for it, so nothing of the call is written before the answer.
 * from[k]: the call's op index of quantized op k (the caller frees it). */
static wsync_result_t quant_prepare(struct wsync_consumer *c, struct wsync_handle *h,
                                    cudaStream_t s, uint64_t generation, const wsync_copy_op_t *ops,
                                    const wsync_quant_t *quant, size_t n_ops, uintptr_t base,
                                    int one_pass, quant_launch_t *out, size_t **from_out,
                                    wsync_error_t *err)
{
    wsync_cuda_mapping_t *m = h->entry->mapping;
    size_t nq = 0, nt = 0, ng = 0;
    uint32_t *group = NULL;
    for (size_t i = 0; i < n_ops; i++)
        nq += quant[i].kind != WSYNC_QUANT_NONE && ops[i].rows > 0;
    wsync_cuda_qop_t *t = calloc(nq ? nq : 1, sizeof(*t));
    size_t *from = quant_order(ops, quant, n_ops, nq, &nt, &ng, &group);
    if (t == NULL || from == NULL) {
        free(t);
        free(from);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu quantizing ops", nq);
    }
    uint64_t blocks = 0, tensor_blocks = 0;
    wsync_result_t rc = WSYNC_OK;
    for (size_t k = 0; k < nq && rc == WSYNC_OK; k++) {
        const size_t i = from[k];
        const wsync_copy_op_t *o = &ops[i];
        const wsync_quant_t *q = &quant[i];
        if (o->rows >= WSYNC_CUDA_QUANT_MAX_DIM || q->cols >= WSYNC_CUDA_QUANT_MAX_DIM) {
            rc = WSYNC_FAIL_OP(err, WSYNC_ERR_NOT_SUPPORTED, i,
                               "op %zu: %llu x %llu elements; the CUDA quantizer takes fewer than "
                               "%u of each",
                               i, (unsigned long long)o->rows, (unsigned long long)q->cols,
                               WSYNC_CUDA_QUANT_MAX_DIM);
            break;
        }
        t[k] = (wsync_cuda_qop_t){
            .src = (const unsigned char *)(base + o->src_offset),
            .dst = o->dst,
            .scales = q->scale_dst,
            .src_pitch = o->rows > 1 ? o->src_pitch : o->row_bytes,
            .dst_pitch = o->rows > 1 ? o->dst_pitch : q->cols,
            .scale_pitch = q->scale_pitch,
            .rows = (uint32_t)o->rows,
            .cols = (uint32_t)q->cols,
            .src_dtype = (uint32_t)q->src_dtype,
            .brows =
                (uint32_t)(q->kind == WSYNC_QUANT_FP8_CHANNEL ? o->rows : (o->rows + 127) / 128),
            .bcols = (uint32_t)(q->kind == WSYNC_QUANT_FP8_CHANNEL ? 1 : (q->cols + 127) / 128),
            .kind = q->kind,
            .group = k < nt ? group[k] : 0,
            .first = k < nt && (k == 0 || group[k] != group[k - 1]),
            .block_begin = blocks};
        if (q->kind == WSYNC_QUANT_FP8_CHANNEL) { /* units of 8 / row_warps rows, or rows */
            t[k].row_warps = wsync_cuda_qop_row_warps(&t[k]);
            t[k].brows = t[k].row_warps
                             ? (uint32_t)((o->rows + 8 / t[k].row_warps - 1) / (8 / t[k].row_warps))
                             : (uint32_t)o->rows;
        }
        blocks += (uint64_t)t[k].brows * t[k].bcols;
        if (k < nt)
            tensor_blocks = blocks;
    }
    free(group);
    void *dev = NULL;
    wsync_cuda_slot_t *slot = NULL;
    unsigned long long bad = WSYNC_CUDA_QUANT_NO_BAD;
    const size_t table = nq * sizeof(*t);
    const size_t amax_bytes = ng * sizeof(unsigned int);
    if (rc == WSYNC_OK)
        rc = host_ready(c, m, generation, err);
    /* The table, the bad-value key and the amax entries in a slot of the op-table ring: pinned,
     * so the upload is queued behind the stream's work (an upload from pageable memory may wait
     * for it on the host), and reserved at consumer create (no allocation per call). */
    if (rc == WSYNC_OK)
        rc = wsync_cuda_ring_take(&c->ring,
                                  (table + sizeof(bad) + amax_bytes + sizeof(wsync_cuda_op_t) - 1) /
                                      sizeof(wsync_cuda_op_t),
                                  &slot, err);
    cudaError_t e = cudaSuccess;
    if (rc == WSYNC_OK) {
        dev = slot->dev;
        memcpy(slot->host, t, table);
        if (m->has_ready)
            e = cudaStreamWaitEvent(s, m->ready, 0);
    }
    if (rc == WSYNC_OK && e == cudaSuccess)
        e = cudaMemcpyAsync(dev, slot->host, table, cudaMemcpyHostToDevice, s);
    unsigned long long *flag = dev != NULL ? (unsigned long long *)((char *)dev + table) : NULL;
    unsigned int *amax = dev != NULL ? (unsigned int *)((char *)dev + table + sizeof(bad)) : NULL;
    if (rc == WSYNC_OK && e == cudaSuccess)
        e = cudaMemsetAsync(flag, 0xff, sizeof(bad), s);
    if (rc == WSYNC_OK && e == cudaSuccess && ng > 0)
        e = cudaMemsetAsync(amax, 0, amax_bytes, s);
    /* one pass: the per-tensor scales' amax first (a second read of those sources alone) */
    if (one_pass && nt > 0 && rc == WSYNC_OK && e == cudaSuccess)
        e = wsync_cuda_quant_scan(dev, (uint32_t)nt, tensor_blocks, flag, amax, s);
    if (!one_pass) {
        if (rc == WSYNC_OK && e == cudaSuccess)
            e = wsync_cuda_quant_scan(dev, (uint32_t)nq, blocks, flag, amax, s);
        if (rc == WSYNC_OK && e == cudaSuccess)
            e = cudaMemcpyAsync(&bad, flag, sizeof(bad), cudaMemcpyDeviceToHost, s);
        if (rc == WSYNC_OK && e == cudaSuccess)
            e = cudaStreamSynchronize(s);
    }
    if (rc == WSYNC_OK && e != cudaSuccess)
        rc = wsync_cuda_fail(err, e, "copy_quantized", "checking the sources for NaN");
    if (rc == WSYNC_OK && bad != WSYNC_CUDA_QUANT_NO_BAD)
        rc = quant_bad(err, from, bad, "nothing of the bucket was written");
    const uint32_t flags = quant_flags(wsync_cuda_tuning_now(&c->tuning), t, nq);
    free(t);
    if (rc != WSYNC_OK) {
        free(from);
        quant_release(slot, s);
        return rc;
    }
    *out = (quant_launch_t){.dev = dev,
                            .slot = slot,
                            .n = (uint32_t)nq,
                            .blocks = blocks,
                            .flag = one_pass ? flag : NULL,
                            .amax = amax,
                            .flags = flags};
    *from_out = from;
    return WSYNC_OK;
}

/* One pass: the quantizer's first bad value, once the call's work is done; reported by the
 * record_consumed that follows (the mapping's deferred error), as the call wrote the rest. */
static wsync_result_t quant_settle(wsync_cuda_mapping_t *m, const quant_launch_t *q,
                                   const size_t *from, const wsync_quant_t *quant, cudaStream_t s,
                                   wsync_error_t *err)
{
    unsigned long long bad = WSYNC_CUDA_QUANT_NO_BAD;
    cudaError_t e = cudaMemcpyAsync(&bad, q->flag, sizeof(bad), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
        return wsync_cuda_fail(err, e, "copy_quantized", "reading the quantizer's NaN check");
    if (bad != WSYNC_CUDA_QUANT_NO_BAD && m->deferred.code == WSYNC_OK) {
        char written[160];
        snprintf(written, sizeof(written),
                 "%s holding it was left as it was and the rest of the bucket written "
                 "(WSYNC_COPY_QUANT_ONE_PASS)",
                 wsync_fp8_unit(quant[from[bad >> 44]].kind));
        (void)quant_bad(&m->deferred, from, bad, written);
    }
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_copy_quantized(struct wsync_consumer *c, struct wsync_handle *h,
                                         wsync_stream_t stream, uint64_t generation,
                                         const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                         size_t n_ops, uint32_t flags, wsync_error_t *err)
{
    wsync_result_t rc = check_handle(c, h, __func__, err);
    if (rc != WSYNC_OK)
        return rc;
    const int one_pass = (flags & WSYNC_COPY_QUANT_ONE_PASS) != 0;
    flags &= ~WSYNC_COPY_QUANT_ONE_PASS;
    if ((rc = wsync_validate_copy_args(ops, n_ops, flags, err)) != WSYNC_OK)
        return rc;
    if (h->segment)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is a segment of a direct manifest: a direct bucket does not "
                          "quantize",
                          (void *)h);
    wsync_cuda_range_push("wsync:copy_quantized");
    cudaSetDevice(c->device);
    const cudaStream_t s = wsync_cuda_stream(stream);
    const uintptr_t base =
        (uintptr_t)(((wsync_cuda_mapping_t *)h->entry->mapping)->base + h->base_offset);
    pthread_mutex_lock(&c->lock);
    quant_launch_t q;
    size_t *from = NULL;
    wsync_copy_op_t *plain = NULL;
    size_t np = 0;
    rc = wsync_validate_quant_ops_memo(&c->valid, ops, quant, n_ops, h->bytes, err);
    if (rc == WSYNC_OK && (plain = calloc(n_ops ? n_ops : 1, sizeof(*plain))) == NULL)
        rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu ops", n_ops);
    for (size_t i = 0; rc == WSYNC_OK && i < n_ops; i++)
        if (quant[i].kind == WSYNC_QUANT_NONE)
            plain[np++] = ops[i];
    if (rc == WSYNC_OK)
        rc = quant_prepare(c, h, s, generation, ops, quant, n_ops, base, one_pass, &q, &from, err);
    if (rc == WSYNC_OK) {
        const copy_extra_t extra = {.fn = quant_run, .arg = &q};
        rc = copy_locked_with(c, h, s, generation, plain, np, flags, base, NULL, &extra, err);
        if (rc == WSYNC_OK && one_pass)
            rc = quant_settle(h->entry->mapping, &q, from, quant, s, err);
        quant_release(q.slot, s);
    }
    free(from);
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    free(plain);
    return rc;
}
