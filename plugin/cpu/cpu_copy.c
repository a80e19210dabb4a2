/* copy_weights and record_consumed: validate everything, then enqueue wait-ready and the copies
 * on the caller's stream; record *consumed* on the stream(s) that carried them, joined. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_nixl.h"
#include "wsync_error.h"
#include "wsync_validate.h"

/* Note that `s` carried copies from h up to task `seq`; an idle carrier evicted for it is
 * drained first, so close_handle's waits still cover its copies. Caller holds h->lock. */
static wsync_result_t wsync_cpu_note_carrier(struct wsync_handle *h, wsync_cpu_stream_t *s,
                                             uint64_t seq, wsync_error_t *err)
{
    wsync_carrier_t evicted;
    wsync_carrier_t *u = wsync_carriers_use(&h->carriers, s, &evicted);
    if (u == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                          "%d streams copied from this buffer without record_consumed; call "
                          "record_consumed before using more streams",
                          WSYNC_CARRIER_MAX);
    if (evicted.stream != NULL)
        wsync_cpu_stream_wait(evicted.stream, evicted.mark);
    u->mark = seq;
    u->pending = 1;
    return WSYNC_OK;
}

/* Under h's lock: the generation rule (several calls may carry one bucket, e.g. on several
 * streams, until it is recorded), wait-ready, the copies (from h's mapping, or with remote_pid
 * from that process's memory: ops' src_offset are its addresses), the carrier note. */
static wsync_result_t wsync_cpu_enqueue(struct wsync_consumer *c, struct wsync_handle *h,
                                        wsync_stream_t stream, uint64_t generation,
                                        const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                        size_t n_ops, uint32_t flags, int64_t remote_pid,
                                        wsync_error_t *err)
{
    wsync_result_t r = WSYNC_OK;
    uint64_t seq = 0;
    wsync_cpu_stream_t *s = wsync_cpu_consumer_stream(c, stream);
    pthread_mutex_lock(&h->lock);
    if (h->pending_generation == 0 || generation != h->pending_generation)
        r = wsync_validate_generation(wsync_cpu_handle_last_generation(h), generation, err);
    /* a nixl buffer's plain ops land straight in their destinations; quantized or verified
     * ones are pulled into the landing region and copied from there */
    const int into = h->nixl == NULL                                     ? 0
                     : remote_pid < 0                                    ? 2
                     : quant == NULL && (flags & WSYNC_COPY_VERIFY) == 0 ? 1
                                                                         : 0;
    if (r == WSYNC_OK && h->nixl != NULL)
        r = wsync_cpu_nixl_pull(c, h, s, ops, n_ops, generation, into, err);
    if (r == WSYNC_OK && h->control != NULL)
        r = wsync_control_check_published(h->control, generation, h->shm.name, err);
    if (r != WSYNC_OK)
        goto out;
    r = wsync_cpu_stream_wait_ready(s, h->control, generation, c->timeout_ms, h->peer_pid, &h->sink,
                                    NULL, err);
    if (r == WSYNC_OK)
        r = remote_pid > 0 ? wsync_cpu_stream_copy_remote(s, remote_pid, ops, n_ops, generation,
                                                          &h->sink, &seq, err)
                           : wsync_cpu_stream_copy(s, h->data, ops, quant, into ? 0 : n_ops, flags,
                                                   generation, &h->sink, &seq, err);
    if (r == WSYNC_OK)
        r = wsync_cpu_note_carrier(h, s, seq, err);
    if (r != WSYNC_OK) {
        /* Out of memory after a wait was queued: the wait alone writes nothing. Make sure a
         * later close still waits for whatever was queued. */
        wsync_cpu_stream_synchronize(s);
        goto out;
    }
    h->entry->last_generation = generation;
    h->pending_generation = generation;
out:
    pthread_mutex_unlock(&h->lock);
    return r;
}

wsync_result_t wsync_cpu_copy_weights(struct wsync_consumer *c, struct wsync_handle *h,
                                      wsync_stream_t stream, uint64_t generation,
                                      const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                      wsync_error_t *err)
{
    wsync_result_t r;

    if (c == NULL || h == NULL || h->consumer != c)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is not an open handle of consumer %p", (void *)h, (void *)c);
    if (h->is_segment)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is a segment of a direct manifest: copy with copy_segments "
                          "and the manifest buffer's handle",
                          (void *)h);
    if ((r = wsync_validate_copy_args(ops, n_ops, flags, err)) != WSYNC_OK)
        return r;
    if ((r = wsync_validate_copy_ops(ops, n_ops, h->bytes, err)) != WSYNC_OK)
        return r;

    return wsync_cpu_enqueue(c, h, stream, generation, ops, NULL, n_ops, flags, 0, err);
}

/* copy_quantized's and copy_segments' first checks: an open buffer handle (not a segment) of
 * c, and the ops' arguments. */
static wsync_result_t wsync_cpu_buffer_call(struct wsync_consumer *c, struct wsync_handle *h,
                                            const wsync_copy_op_t *ops, size_t n_ops,
                                            uint32_t flags, wsync_error_t *err)
{
    if (c == NULL || h == NULL || h->consumer != c || h->is_segment)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is not an open buffer handle of consumer %p", (void *)h,
                          (void *)c);
    return wsync_validate_copy_args(ops, n_ops, flags, err);
}

wsync_result_t wsync_cpu_copy_quantized(struct wsync_consumer *c, struct wsync_handle *h,
                                        wsync_stream_t stream, uint64_t generation,
                                        const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                        size_t n_ops, uint32_t flags, wsync_error_t *err)
{
    wsync_result_t r =
        wsync_cpu_buffer_call(c, h, ops, n_ops, flags & ~WSYNC_COPY_QUANT_ONE_PASS, err);
    if (r != WSYNC_OK)
        return r;
    if ((r = wsync_validate_quant_ops(ops, quant, n_ops, h->bytes, err)) != WSYNC_OK)
        return r;
    r = wsync_cpu_enqueue(c, h, stream, generation, ops, quant, n_ops, flags, 0, err);
    if (r != WSYNC_OK || (flags & WSYNC_COPY_QUANT_ONE_PASS))
        return r;
    /* The ABI's rule: a NaN or infinite source refuses the call itself, nothing written. The
     * check runs on the stream, after *ready*, before any op writes: wait for it, as the CUDA
     * plugin reads its check's answer before returning. */
    wsync_cpu_stream_synchronize(wsync_cpu_consumer_stream(c, stream));
    return wsync_cpu_sink_take(&h->sink, err);
}

typedef struct cpu_segs {
    struct wsync_consumer *c;
    struct wsync_handle *h;
    struct wsync_handle *const *segs;
} cpu_segs_t;

static int cpu_segment(void *user, size_t k, uint64_t *bytes, uint64_t *base)
{
    const cpu_segs_t *x = user;
    const struct wsync_handle *s = x->segs[k];
    if (s == NULL || s->consumer != x->c || !s->is_segment || s->peer_pid != x->h->peer_pid)
        return -1;
    *bytes = s->bytes;
    *base = s->remote;
    return 0;
}

wsync_result_t wsync_cpu_copy_segments(struct wsync_consumer *c, struct wsync_handle *h,
                                       struct wsync_handle *const *segs, size_t n_segs,
                                       wsync_stream_t stream, uint64_t generation,
                                       const wsync_copy_op_t *ops, const uint32_t *op_segment,
                                       size_t n_ops, uint32_t flags, wsync_error_t *err)
{
    wsync_result_t r = wsync_cpu_buffer_call(c, h, ops, n_ops, flags, err);
    if (r != WSYNC_OK)
        return r;
    for (size_t k = 0; segs != NULL && k < n_segs; k++) {
        const struct wsync_handle *g = segs[k];
        if (g != NULL && g->consumer == c && g->is_segment &&
            ((g->nixl != NULL) != (h->nixl != NULL) ||
             (h->nixl != NULL && strcmp(g->nixl->peer, h->nixl->peer) != 0)))
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "segment %zu is memory of %s, but the manifest's buffer is %s's: a "
                              "direct bucket reads only its producer",
                              k, g->nixl != NULL ? g->nixl->peer : "a local process",
                              h->nixl != NULL ? h->nixl->peer : "a local process");
    }
    for (size_t k = 0; segs != NULL && k < n_segs; k++)
        if (segs[k] != NULL && segs[k]->consumer == c && segs[k]->is_segment &&
            segs[k]->peer_pid != h->peer_pid)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "segment %zu names producer pid %lld, but the manifest's buffer was "
                              "published by pid %lld: a direct bucket reads only its producer",
                              k, (long long)segs[k]->peer_pid, (long long)h->peer_pid);
    cpu_segs_t sg = {.c = c, .h = h, .segs = segs};
    wsync_copy_op_t *moved = NULL;
    if ((r = wsync_validate_segments(NULL, ops, op_segment, n_ops, segs != NULL ? n_segs : 0,
                                     cpu_segment, &sg, "an open host_pid segment of its producer",
                                     &moved, err)) != WSYNC_OK)
        return r;
    /* a nixl bucket's segments are read through its peer (remote_pid -1: pulled by address) */
    r = wsync_cpu_enqueue(c, h, stream, generation, moved, NULL, n_ops, 0,
                          h->nixl != NULL ? -1 : h->peer_pid, err);
    free(moved);
    return r;
}

wsync_result_t wsync_cpu_record_consumed(struct wsync_consumer *c, struct wsync_handle *h, int wait,
                                         wsync_error_t *err)
{
    wsync_cpu_stream_t *primary = NULL;
    wsync_cpu_stream_t *others[WSYNC_CARRIER_MAX];
    wsync_carrier_t *pend[WSYNC_CARRIER_MAX];
    uint64_t seq = 0;
    wsync_result_t r = WSYNC_OK;

    if (c == NULL || h == NULL || h->consumer != c)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is not an open handle of consumer %p", (void *)h, (void *)c);
    pthread_mutex_lock(&h->lock);
    uint64_t generation = h->pending_generation;
    if (generation == 0) {
        pthread_mutex_unlock(&h->lock);
        r = wsync_cpu_sink_take(&h->sink, err);
        if (r != WSYNC_OK)
            return r;
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nothing to record: no copy_weights on this handle since the last "
                          "record_consumed (last generation %llu)",
                          (unsigned long long)h->entry->last_generation);
    }
    const size_t n = wsync_carriers_pending(&h->carriers, pend);
    primary = n > 0 ? pend[0]->stream : c->default_stream; /* none: its carrier was destroyed */
    const size_t n_others = n > 0 ? n - 1 : 0;
    for (size_t i = 0; i < n_others; i++)
        others[i] = pend[i + 1]->stream;
    r = wsync_cpu_stream_join(primary, others, n_others, err);
    if (r == WSYNC_OK)
        r = wsync_cpu_stream_signal_consumed(primary, h->control, generation, &h->sink, &seq, err);
    if (r == WSYNC_OK)
        r = wsync_cpu_note_carrier(h, primary, seq, err);
    if (r == WSYNC_OK && h->nixl != NULL) /* pulled already: the producer may stage again */
        r = wsync_nixl_buffer_consumed(h->nixl, generation, c->timeout_ms, err);
    if (r == WSYNC_OK) {
        wsync_carriers_settle(&h->carriers);
        h->pending_generation = 0;
    }
    pthread_mutex_unlock(&h->lock);
    if (r != WSYNC_OK)
        return r;
    if (wait)
        wsync_cpu_stream_wait(primary, seq);
    return wsync_cpu_sink_take(&h->sink, err);
}
