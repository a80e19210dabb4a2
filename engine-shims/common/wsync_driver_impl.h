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
    char last_plan[WSYNC_PLAN_ID_MAX + 1]; /* the plan last_generation was applied under, or "" */
} wsync_driver_buffer_t;

/* A bucket's validated copy plan, kept under its id (wsync_driver_plan.c): what a replay of it
 * copies, and what the replay's own fields are checked against. */
typedef struct wsync_plan {
    char id[WSYNC_PLAN_ID_MAX + 1];
    size_t n;                     /* ops, one per tensor in manifest order */
    wsync_copy_op_t *ops;         /* mapped and validated (shadow redirects applied) */
    wsync_quant_t *quant;         /* per op; NULL when none quantizes */
    wsync_tensor_desc_t *tensors; /* name and nbytes (the transaction's), names in `names` */
    char *names;
    uint32_t *tensor_segment; /* direct mode */
    wsync_buffer_desc_t *segments;
    size_t n_segments;
    wsync_buffer_kind_t kind; /* of the bucket's buffer */
    uint64_t need;            /* staged: the buffer bytes the ops read */
    int live;                 /* writes a parameter outside every shadow */
    uint64_t used;            /* least recently used goes first */
    size_t bytes;
} wsync_plan_t;

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
    wsync_plan_t *plans; /* recorded plans (wsync_driver_plan.c) */
    size_t n_plans, cap_plans, plan_bytes;
    uint64_t plan_clock;
};

/* wsync_driver_plan.c. The plan manifest m replays, checked against m's own fields (the same
 * buffer kind, room for what the plan reads, the same segments); *view is m with the plan's
 * tensors. UNKNOWN_PLAN naming the id and what differs otherwise (the bucket stays unconsumed). */
wsync_result_t wsync_driver_plan_find(wsync_driver_t *d, const wsync_manifest_t *m,
                                      wsync_manifest_t *view, const wsync_plan_t **out,
                                      wsync_error_t *err);
/* After a bucket recording a plan (m->plan, not a replay) was applied: keep its ops under the id,
 * replacing one of the same id; the least recently used go past the table's bounds. Best effort:
 * a plan not kept is one the next replay finds unknown. */
void wsync_driver_plan_record(wsync_driver_t *d, const wsync_manifest_t *m,
                              const wsync_copy_op_t *ops, const wsync_quant_t *quant, int live);
/* Forget every plan (the engine's mappings or shadows changed). */
void wsync_driver_plans_clear(wsync_driver_t *d);
/* The plan id of m, or NULL (a field a plugin before 0.1.10 does not fill). */
const char *wsync_driver_plan_of(const wsync_manifest_t *m, int *replay);

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
int wsync_driver_same_segment(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b);
wsync_result_t wsync_driver_copy_direct(wsync_driver_t *d, wsync_driver_buffer_t *e,
                                        const wsync_manifest_t *m, const wsync_copy_op_t *ops,
                                        wsync_error_t *err);

#endif
