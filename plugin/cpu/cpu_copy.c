/* copy_weights and record_consumed: validate everything, then enqueue wait-ready and the copies
 * on the caller's stream; record *consumed* on the stream(s) that carried them, joined. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "wsync_error.h"
#include "wsync_validate.h"

/* Note that `s` carried copies from h up to task `seq`. Caller holds h->lock. */
static wsync_result_t wsync_cpu_note_carrier(struct wsync_handle *h, wsync_cpu_stream_t *s,
                                             uint64_t seq, wsync_error_t *err)
{
    for (size_t i = 0; i < h->n_carriers; i++) {
        if (h->carriers[i].stream == s) {
            h->carriers[i].last_seq = seq;
            h->carriers[i].pending = 1;
            return WSYNC_OK;
        }
    }
    if (h->n_carriers == h->cap_carriers) {
        size_t cap = h->cap_carriers ? 2 * h->cap_carriers : 4;
        void *p = realloc(h->carriers, cap * sizeof(*h->carriers));
        if (p == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to track %zu streams", cap);
        h->carriers = p;
        h->cap_carriers = cap;
    }
    h->carriers[h->n_carriers++] =
        (wsync_cpu_carrier_t){.stream = s, .last_seq = seq, .pending = 1};
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_copy_weights(struct wsync_consumer *c, struct wsync_handle *h,
                                      wsync_stream_t stream, uint64_t generation,
                                      const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                      wsync_error_t *err)
{
    wsync_result_t r;
    uint64_t seq = 0;

    if (c == NULL || h == NULL || h->consumer != c)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is not an open handle of consumer %p", (void *)h, (void *)c);
    if ((r = wsync_validate_copy_args(ops, n_ops, flags, err)) != WSYNC_OK)
        return r;
    if ((r = wsync_validate_copy_ops(ops, n_ops, h->bytes, err)) != WSYNC_OK)
        return r;

    wsync_cpu_stream_t *s = wsync_cpu_consumer_stream(c, stream);
    pthread_mutex_lock(&h->lock);
    /* Several calls may carry one bucket (e.g. on several streams) until it is recorded. */
    if (h->pending_generation == 0 || generation != h->pending_generation) {
        r = wsync_validate_generation(wsync_cpu_handle_last_generation(h), generation, err);
        if (r != WSYNC_OK)
            goto out;
    }
    r = wsync_cpu_stream_wait_ready(s, h->control, generation, c->timeout_ms, h->peer_pid, &h->sink,
                                    NULL, err);
    if (r == WSYNC_OK)
        r = wsync_cpu_stream_copy(s, h->data, ops, n_ops, flags, generation, &h->sink, &seq, err);
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

wsync_result_t wsync_cpu_record_consumed(struct wsync_consumer *c, struct wsync_handle *h, int wait,
                                         wsync_error_t *err)
{
    wsync_cpu_stream_t *primary = NULL;
    wsync_cpu_stream_t **others = NULL;
    size_t n_others = 0;
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
    others = malloc((h->n_carriers ? h->n_carriers : 1) * sizeof(*others));
    if (others == NULL) {
        pthread_mutex_unlock(&h->lock);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to join %zu streams",
                          h->n_carriers);
    }
    for (size_t i = 0; i < h->n_carriers; i++) {
        if (!h->carriers[i].pending)
            continue;
        if (primary == NULL)
            primary = h->carriers[i].stream;
        else
            others[n_others++] = h->carriers[i].stream;
    }
    if (primary == NULL) /* its only carrier was destroyed, and so drained */
        primary = c->default_stream;
    r = wsync_cpu_stream_join(primary, others, n_others, err);
    if (r == WSYNC_OK)
        r = wsync_cpu_stream_signal_consumed(primary, h->control, generation, &h->sink, &seq, err);
    if (r == WSYNC_OK)
        r = wsync_cpu_note_carrier(h, primary, seq, err);
    if (r == WSYNC_OK) {
        for (size_t i = 0; i < h->n_carriers; i++)
            h->carriers[i].pending = 0;
        h->pending_generation = 0;
    }
    pthread_mutex_unlock(&h->lock);
    if (r != WSYNC_OK) {
        free(others);
        return r;
    }
    if (wait)
        wsync_cpu_stream_wait(primary, seq);
    free(others);
    return wsync_cpu_sink_take(&h->sink, err);
}
