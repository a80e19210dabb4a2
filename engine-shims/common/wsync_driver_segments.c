/* Direct mode: the segments a manifest names, held open across syncs (wsync_driver.h). */
#include "wsync_driver_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_manifest.h"
#include "wsync_shm_sweep.h"

void wsync_driver_close_segments(wsync_driver_t *d, wsync_driver_buffer_t *e)
{
    for (size_t k = 0; k < e->n_segs; k++)
        if (e->segs[k] != NULL && d->ops != NULL)
            d->ops->close_handle(d->consumer, e->segs[k], NULL);
    free(e->segs);
    free(e->seg_keys);
    free(e->seg_epoch);
    e->segs = NULL;
    e->seg_keys = NULL;
    e->seg_epoch = NULL;
    e->n_segs = e->cap_segs = 0;
}

/* The same segment: the same memory over the same range (a host_pid segment is a mapping of the
 * producer's, which grows in place: a larger one is opened anew, the old closed by the sweep). */
int wsync_driver_same_segment(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return wsync_driver_same_buffer(a, b) && a->bytes == b->bytes &&
           a->base_offset == b->base_offset;
}

/* The held handle of segment `key`, opening (and holding) it when it is new. */
static wsync_result_t wsync_driver_segment(wsync_driver_t *d, wsync_driver_buffer_t *e,
                                           const wsync_buffer_desc_t *key, size_t *at,
                                           struct wsync_handle **out, wsync_error_t *err)
{
    /* a steady trainer names its segments in the same order every time: try *at first (where
     * the one after the last found sits), then all */
    size_t j = *at;
    if (j >= e->n_segs || !wsync_driver_same_segment(&e->seg_keys[j], key))
        for (j = 0; j < e->n_segs && !wsync_driver_same_segment(&e->seg_keys[j], key); j++)
            ;
    if (j < e->n_segs) {
        e->seg_epoch[j] = e->epoch;
        *out = e->segs[j];
        *at = j + 1;
        return WSYNC_OK;
    }
    if (e->n_segs == e->cap_segs) {
        size_t cap = e->cap_segs ? 2 * e->cap_segs : 64;
        void *a = realloc(e->segs, cap * sizeof(*e->segs));
        if (a != NULL)
            e->segs = a;
        void *b = realloc(e->seg_keys, cap * sizeof(*e->seg_keys));
        if (b != NULL)
            e->seg_keys = b;
        void *c = realloc(e->seg_epoch, cap * sizeof(*e->seg_epoch));
        if (c != NULL)
            e->seg_epoch = c;
        if (a == NULL || b == NULL || c == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: %zu segments", cap);
        e->cap_segs = cap;
    }
    wsync_result_t rc = d->ops->open_handle(d->consumer, key, out, err);
    d->opens++;
    if (rc != WSYNC_OK)
        return rc;
    e->segs[e->n_segs] = *out;
    e->seg_keys[e->n_segs] = *key;
    e->seg_epoch[e->n_segs] = e->epoch;
    e->n_segs++;
    *at = e->n_segs;
    return WSYNC_OK;
}

/* After the last bucket of a weight version: close every held segment no manifest of that
 * version named (memory the producer freed or re-made elsewhere); their copies are behind the
 * ones just enqueued on the same stream, and close_handle waits for them. */
static void wsync_driver_sweep_segments(wsync_driver_t *d, wsync_driver_buffer_t *e)
{
    size_t kept = 0;
    for (size_t j = 0; j < e->n_segs; j++) {
        if (e->seg_epoch[j] != e->epoch) {
            d->ops->close_handle(d->consumer, e->segs[j], NULL);
            continue;
        }
        e->segs[kept] = e->segs[j];
        e->seg_keys[kept] = e->seg_keys[j];
        e->seg_epoch[kept] = e->seg_epoch[j];
        kept++;
    }
    e->n_segs = kept;
    e->epoch++;
}

/* Direct mode, one bucket: the segments it names (held across buckets and syncs: 0 opens in
 * the steady state), every tensor in one copy_segments. */
wsync_result_t wsync_driver_copy_direct(wsync_driver_t *d, wsync_driver_buffer_t *e,
                                        const wsync_manifest_t *m, const wsync_copy_op_t *ops,
                                        wsync_error_t *err)
{
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, copy_segments))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "a direct bucket (%zu segments) needs a plugin with copy_segments; %s "
                            "has none",
                            m->n_segments, d->loader.path);
    const size_t n = m->n_segments;
    struct wsync_handle **segs = calloc(n, sizeof(*segs));
    wsync_result_t rc = WSYNC_OK;
    if (segs == NULL)
        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: %zu segments", n);
    size_t at = 0;
    for (size_t k = 0; rc == WSYNC_OK && k < n; k++)
        rc = wsync_driver_segment(d, e, &m->segments[k], &at, &segs[k], err);
    if (rc == WSYNC_OK)
        rc = d->ops->copy_segments(d->consumer, e->handle, segs, n, wsync_driver_stream(d),
                                   m->generation, ops, m->tensor_segment, m->n_tensors,
                                   d->cfg.copy_flags & ~WSYNC_COPY_QUANT_ONE_PASS, err);
    free(segs);
    if (rc == WSYNC_OK && m->finished)
        wsync_driver_sweep_segments(d, e);
    return rc;
}
