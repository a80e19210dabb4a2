/* The request driver's private parts, shared by its files (wsync_driver.c: opening, parsing,
 * validating and copying a request's buckets; _txn.c: update transactions and the producer's
 * watch; _segments.c: direct mode's segments; _fp8.c: quantized parameters' checks; _lora.c:
 * adapters; _shadows.c: rollback mode's shadow copies). Contract in wsync_driver.h. */
#ifndef WSYNC_DRIVER_IMPL_H
#define WSYNC_DRIVER_IMPL_H

#include "wsync_driver.h"
#include "wsync_loader.h"
#include "wsync_txn.h"

/* One producer buffer this engine has consumed from. */
typedef struct wsync_driver_buffer {
    wsync_buffer_desc_t key;
    struct wsync_handle *handle; /* NULL in native mode */
    uint64_t last_generation;
    /* Direct mode: the segments its manifests named, held open so each stays mapped across
     * syncs (0 opens in the steady state); one that a whole weight version no longer names is
     * closed after its last bucket. */
    wsync_buffer_desc_t *seg_keys;
    struct wsync_handle **segs;
    uint64_t *seg_epoch; /* the weight version (counted by finished buckets) that last named it */
    size_t n_segs, cap_segs;
    uint64_t epoch;
} wsync_driver_buffer_t;

struct wsync_driver {
    wsync_driver_config_t cfg;
    wsync_host_t host;
    wsync_loader_t loader;
    const wsync_consumer_ops_t *ops; /* NULL: native fallback */
    struct wsync_consumer *consumer;
    char native_why[WSYNC_ERROR_MESSAGE_LEN + 64];
    wsync_driver_buffer_t *buffers;
    size_t n_buffers, cap_buffers;
    uint64_t opens; /* open_handle calls: buffers and segments mapped (or found cached) */
    wsync_txn_t txn;
    wsync_shadow_t *shadows; /* rollback mode, sorted by param */
    size_t n_shadows;
    /* A refusal the shim found in the request's own fields (wsync_driver_refuse): the next
     * apply gives its buckets back unread and returns it. */
    wsync_result_t refusal;
    char refusal_msg[WSYNC_ERROR_MESSAGE_LEN];
    /* The open version's producer, held as a pidfd from when its pid was first seen: it reads
     * as ended once that process exits (a zombie included), and a later process given the same
     * pid is another one. -1: none (or pidfd_open unavailable: then kill(pid, 0) decides). */
    int producer_fd;
    int64_t producer_fd_pid;
};

/* wsync_driver_shadows.c: op's destination moved to its shadow (rollback mode); 1 when it was. */
int wsync_driver_redirect(const wsync_driver_t *d, wsync_copy_op_t *op);
/* wsync_driver_txn.c: the engine's update_begin hook; the open version's producer checked. */
void wsync_driver_hook_begin(wsync_driver_t *d, uint64_t version);
void wsync_driver_watch(wsync_driver_t *d);
/* wsync_driver.c: the engine's stream; the buffers consumed from, found, named, remembered;
 * a manifest parsed through the plugin and freed. */
wsync_stream_t wsync_driver_stream(const wsync_driver_t *d);
int wsync_driver_same_buffer(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b);
wsync_driver_buffer_t *wsync_driver_find(wsync_driver_t *d, const wsync_buffer_desc_t *b);
void wsync_driver_buffer_name(const wsync_buffer_desc_t *b, char *buf, size_t len);
wsync_result_t wsync_driver_parse(wsync_driver_t *d, const char *json, size_t len,
                                  const wsync_manifest_t **out, wsync_error_t *err);
void wsync_driver_free_manifest(wsync_driver_t *d, const wsync_manifest_t *m);
wsync_driver_buffer_t *wsync_driver_remember(wsync_driver_t *d, const wsync_buffer_desc_t *b);
/* wsync_driver_fp8.c: a bucket quantizing into `name` needs copy_quantized, a staged bucket and
 * no shadows; a per-tensor scale's rows all in one bucket. */
wsync_result_t wsync_driver_can_quantize(const wsync_driver_t *d, const wsync_manifest_t *m,
                                         const char *name, wsync_error_t *err);
wsync_result_t wsync_driver_check_tensor_scales(const wsync_manifest_t *m,
                                                const wsync_copy_op_t *ops,
                                                const wsync_quant_t *quant, const uint64_t *want,
                                                wsync_error_t *err);
/* wsync_driver_segments.c: a buffer's direct segments closed; a direct bucket copied. */
void wsync_driver_close_segments(wsync_driver_t *d, wsync_driver_buffer_t *e);
wsync_result_t wsync_driver_copy_direct(wsync_driver_t *d, wsync_driver_buffer_t *e,
                                        const wsync_manifest_t *m, const wsync_copy_op_t *ops,
                                        wsync_error_t *err);

#endif
