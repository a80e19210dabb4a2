/* nixl buffers on the CPU backend (cpu_nixl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_nixl.h"
#include "wsync_error.h"

#define WSYNC_CPU_NIXL_ALIGN 4096u

wsync_result_t wsync_cpu_nixl_map(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                  void **mapping, wsync_error_t *err)
{
    /* a segment of a direct manifest names no control block (handle bytes 8..16 zero) */
    int segment = desc->handle_len > WSYNC_NIXL_HANDLE_HEAD;
    for (int k = 8; segment && k < 16; k++)
        segment = desc->handle[k] == 0;
    struct wsync_handle *h = calloc(1, sizeof(*h));
    wsync_nixl_buffer_t *b = calloc(1, sizeof(*b));
    wsync_control_t *ctl = segment ? NULL : calloc(1, sizeof(*ctl));
    void *landing = NULL;
    const size_t size =
        (desc->bytes + WSYNC_CPU_NIXL_ALIGN - 1) & ~(size_t)(WSYNC_CPU_NIXL_ALIGN - 1);
    if (h == NULL || b == NULL || (!segment && ctl == NULL) ||
        (!segment && posix_memalign(&landing, WSYNC_CPU_NIXL_ALIGN, size) != 0)) {
        free(h);
        free(b);
        free(ctl);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY,
                          "no memory for a landing region of %llu bytes for a nixl buffer",
                          (unsigned long long)desc->bytes);
    }
    wsync_result_t r = wsync_nixl_buffer_open(desc, landing, 0, b, err);
    if (r != WSYNC_OK) {
        free(landing);
        free(h);
        free(b);
        free(ctl);
        return r;
    }
    h->consumer = c;
    h->nixl = b;
    h->bytes = desc->bytes;
    snprintf(h->shm.name, sizeof(h->shm.name), "nixl:%.58s", b->peer);
    if (segment) { /* read by address, as a host_pid segment is */
        h->is_segment = 1;
        h->remote = b->remote_data;
    } else {
        /* The handle's own control block: ready and published follow the pulls, consumed the
         * records (the producer's is written through NIXL). */
        wsync_control_init(ctl, 0, desc->bytes);
        h->control = ctl;
        h->data = landing;
    }
    wsync_cpu_handle_register(c, h);
    *mapping = h;
    return WSYNC_OK;
}

void wsync_cpu_nixl_unmap(struct wsync_handle *h)
{
    wsync_nixl_buffer_close(h->nixl);
    free(h->nixl->landing);
    free(h->nixl);
    free(h->control);
}

wsync_result_t wsync_cpu_nixl_pull(struct wsync_consumer *c, struct wsync_handle *h,
                                   wsync_cpu_stream_t *s, const wsync_copy_op_t *ops, size_t n_ops,
                                   uint64_t generation, int into, wsync_error_t *err)
{
    wsync_result_t r;
    if (into) {
        wsync_cpu_stream_synchronize(s); /* the caller's work before the copy, in stream order */
        r = into > 1
                ? wsync_nixl_buffer_pull_segments(h->nixl, ops, n_ops, generation, c->timeout_ms,
                                                  err)
                : wsync_nixl_buffer_pull_into(h->nixl, ops, n_ops, generation, c->timeout_ms, err);
    } else {
        /* The last generation's copies may still read the landing region; a later call of the
         * same bucket (quantized ops after plain ones) pulls its own ranges, the same bytes
         * again where they meet. */
        if (h->pending_generation != generation)
            for (size_t i = 0; i < h->carriers.n; i++)
                wsync_cpu_stream_wait(h->carriers.at[i].stream, h->carriers.at[i].mark);
        r = wsync_nixl_buffer_pull(h->nixl, ops, n_ops, generation, c->timeout_ms, err);
    }
    if (r != WSYNC_OK)
        return r;
    wsync_control_publish(h->control, generation);
    wsync_control_signal_ready(h->control, generation);
    return WSYNC_OK;
}
