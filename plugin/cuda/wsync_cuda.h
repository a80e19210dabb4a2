/* Internal state of the CUDA backend (libwsync_cuda.so). Not part of the ABI.
 *
 * Threading: a consumer serialises copy_weights / record_consumed / close_handle with its mutex
 * (the launch ring and per-mapping stream lists are shared state); open_handle goes through the
 * cache's own lock. Lock order: consumer mutex, then cache lock. */
#ifndef WSYNC_CUDA_H
#define WSYNC_CUDA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "wsync_abi.h"
#include "wsync_cache.h"
#include "wsync_carrier.h"
#include "wsync_control.h"
#include "wsync_copy_kernel.h"
#include "wsync_cuda_adapter.h"
#include "wsync_cuda_tuning.h"
#include "wsync_cuda_vmm.h"
#include "wsync_manifest_cache.h"
#include "wsync_peers.h"
#include "wsync_shm.h"
#include "wsync_validate.h"

/* op tables in flight per consumer (copy_quantized takes two a call) */
#define WSYNC_CUDA_RING_SLOTS 8
#define WSYNC_CUDA_DEFAULT_TIMEOUT_MS 30000u
#define WSYNC_CUDA_NO_DIGEST UINT64_MAX /* slot nbytes[] value: op has no digest to check */

/* Fail with the CUDA error's name and text; `what` names the call and its arguments. */
wsync_result_t wsync_cuda_fail(wsync_error_t *err, cudaError_t e, const char *where,
                               const char *what);
#define WSYNC_CUDA_TRY(err, call)                                                                  \
    do {                                                                                           \
        cudaError_t wsync_cuda_e_ = (call);                                                        \
        if (wsync_cuda_e_ != cudaSuccess)                                                          \
            return wsync_cuda_fail((err), wsync_cuda_e_, __func__, #call);                         \
    } while (0)

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of `device` into out (WSYNC_DEVICE_MAX). */
/* The copy engines' share of a batch (docs/PERFORMANCE.md): one cudaMemcpyAsync of a whole
 * payload (the copy engines) reads and writes HBM more efficiently than any SM copy kernel
 * measured, and both run at once, so the largest contiguous ops, up to `share` of the bytes
 * (none below min_bytes), go to the copy engines while the kernel moves the rest. */
typedef struct wsync_cuda_split {
    size_t n_kernel;     /* table[0..n_kernel): the kernel's ops, chunk numbers compacted */
    uint64_t chunks;     /* the kernel's chunk count */
    wsync_cuda_op_t *ce; /* malloc'd: the copy engines' copies (free it), NULL when none */
    size_t n_ce;         /* copies in ce (1-D) */
    size_t ce_ops;       /* table ops they stand for (n_kernel + ce_ops = the table's ops) */
    size_t lane_n[WSYNC_CUDA_MAX_LANES]; /* ce holds lane 0's lane_n[0] copies, then lane 1's */
    uint64_t ce_bytes;
} wsync_cuda_split_t;

/* cuStreamWriteValue64 (found through the runtime, no link against libcuda): v lands at the
 * device address p once s gets there, after everything before it on s. cudaErrorNotSupported
 * when the driver has no such call or refuses it. */
cudaError_t wsync_cuda_write_value64(cudaStream_t s, void *p, uint64_t v);

/* cuPointerGetAttribute(out, attribute, p) through the runtime's driver entry points: 1 when
 * the driver answered. */
int wsync_cuda_pointer_attr(const void *p, int attribute, void *out);
/* cuPointerGetAttributes: n attributes of p in one driver call (1 when it answered). */
int wsync_cuda_pointer_attrs(const void *p, unsigned n, int *attributes, void **out);
/* Start and size of the device allocation holding p (wsync_cuda_alloc_range_fn): 1, or 0 when
 * it cannot tell. The driver's answer (cuMemGetAddressRange). Thread safe. */
int wsync_cuda_alloc_range(const void *p, uintptr_t *base, size_t *size);

/* The copy engines' candidates of a table: every contiguous, non-empty op belongs to one group.
 * With range, consecutive ops that continue each other in source and destination are joined
 * into one copy when that lifts some of them to min_bytes, cut where an allocation ends on either
 * side (at most a few hundred allocation queries per call; past them, no join); without it every
 * op is a group of its own. Groups are
 * in table order. */
typedef struct wsync_cuda_group {
    wsync_cuda_op_t op;  /* what the copy engines copy (planned, 1-D) */
    size_t first, count; /* its table ops: member[first .. first + count) */
    size_t order;        /* its first table index */
} wsync_cuda_group_t;
typedef struct wsync_cuda_groups {
    wsync_cuda_group_t *g;
    size_t n;
    size_t *member;
    size_t n_member;
} wsync_cuda_groups_t;
wsync_result_t wsync_cuda_groups(const wsync_cuda_op_t *t, size_t n,
                                 wsync_cuda_alloc_range_fn range, uint64_t min_bytes,
                                 wsync_cuda_groups_t *g, wsync_error_t *err);
void wsync_cuda_groups_free(wsync_cuda_groups_t *g);

/* How a batch is split: up to `share` of the bytes, largest groups first, none under
 * min_bytes; lanes (clamped to [1, WSYNC_CUDA_MAX_LANES]): the copy engines' copies are dealt
 * largest first to the lane with the fewest bytes so far (one stream's copies run one after
 * another, with a gap between two; two streams fill each other's gaps); range NULL: no op is
 * joined with another; balance: the copies in op order fill the lanes one after another, each
 * to an equal share of the bytes, a copy cut (at a 1 MiB multiple) where a lane is full, so no
 * lane is left alone with one long copy (a trainer's embedding beside its layers' matrices).
 * wsync_cuda_split_cfg_t: wsync_cuda_tuning.h. */
wsync_result_t wsync_cuda_split(wsync_cuda_op_t *table, size_t n, const wsync_cuda_split_cfg_t *cfg,
                                wsync_cuda_split_t *out, wsync_error_t *err);

/* The copy engines' lanes of one consumer or staging buffer: a stream each, one fork event and
 * a join event each. */
typedef struct wsync_cuda_lane {
    cudaStream_t stream[WSYNC_CUDA_MAX_LANES];
    cudaEvent_t fork, join[WSYNC_CUDA_MAX_LANES];
} wsync_cuda_lane_t;
cudaError_t wsync_cuda_lane_create(wsync_cuda_lane_t *l);
void wsync_cuda_lane_destroy(wsync_cuda_lane_t *l); /* of a zeroed or partly made lane too */
/* Split table (as cfg says: share, minimum, lanes, joined copies) and
 * mark the fork point on s (everything on s so far). *sp then describes the kernel's ops, and
 * sp->ce the copy engines'. The caller launches the kernel first (the GPU starts while the host
 * enqueues the copy engines' ops, a few microseconds each), then wsync_cuda_lane_run enqueues the
 * copy engines' share on the lanes and frees sp->ce, and wsync_cuda_lane_join makes s wait for
 * the lanes (also after lane_run failed: part of the share may be enqueued); or, when the
 * kernel's launch failed, wsync_cuda_lane_drop forgets the share (nothing of it was enqueued).
 * `who` names the caller in errors. */
wsync_result_t wsync_cuda_lane_split(wsync_cuda_lane_t *l, wsync_cuda_op_t *table, size_t n,
                                     const wsync_cuda_split_cfg_t *cfg, cudaStream_t s,
                                     const char *who, wsync_cuda_split_t *sp, wsync_error_t *err);
wsync_result_t wsync_cuda_lane_run(wsync_cuda_lane_t *l, wsync_cuda_split_t *sp, int per_op,
                                   const char *who, wsync_error_t *err);
void wsync_cuda_lane_drop(wsync_cuda_split_t *sp);
cudaError_t wsync_cuda_lane_join(const wsync_cuda_lane_t *l, const wsync_cuda_split_t *sp,
                                 cudaStream_t s);

/* The planned flat ops t[0..n) as one cudaMemcpyBatchAsync on s (a cudaMemcpyAsync each before
 * CUDA 12.8); overlap asks for the copy engines; per_op: one cudaMemcpyAsync per op. Empty ops
 * are skipped. */
wsync_result_t wsync_cuda_batch_memcpy(const wsync_cuda_op_t *t, size_t n, int overlap, int per_op,
                                       cudaStream_t s, const char *who, wsync_error_t *err);
wsync_result_t wsync_cuda_device_uuid(int device, char *out, wsync_error_t *err);
/* Check the ordinal against cudaGetDeviceCount and make it current. */
wsync_result_t wsync_cuda_use_device(int device, wsync_error_t *err);

/* NVTX ranges ("wsync:<phase>"); no-ops unless a tool is attached. */
void wsync_cuda_range_push(const char *name);
void wsync_cuda_range_pop(void);

/* Process-wide counters. With WSYNC_CUDA_STATS=1 in the environment, record_consumed logs them
 * at INFO ("wsync-cuda stats ipc_mem_opens=..."), so benchmarks can read IPC opens per sync. */
typedef struct wsync_cuda_stats {
    _Atomic uint64_t ipc_mem_opens;
    _Atomic uint64_t ipc_mem_closes;
    _Atomic uint64_t ipc_event_opens;
    _Atomic uint64_t launches;
    _Atomic uint64_t copy_calls;
    _Atomic uint64_t records;
} wsync_cuda_stats_t;
extern wsync_cuda_stats_t wsync_cuda_stats;
void wsync_cuda_stats_log(int enabled);

/* -------------------------------------------------------------- launch ring */

/* One op table in flight. Pinned host image: [ops(n) | zero sums(n)] uploaded by one copy, and
 * at ops_bytes(cap) + cap words the sums read back; device image [ops(n) | sums(n)]. `done` is
 * recorded after the last device use, guarding reuse of both. A slot with an owner still holds
 * digests to compare (record_consumed checks them). */
typedef struct wsync_cuda_slot {
    unsigned char *host;
    unsigned char *dev;
    size_t cap_ops;
    cudaEvent_t done;
    int used;      /* done has been recorded at least once */
    uint64_t uses; /* times taken: a guard of an older use is past (take waited for it) */
    struct wsync_cuda_mapping *owner;
    size_t n_ops;
    uint64_t generation;
    uint64_t *expected; /* malloc'd, cap_ops entries */
    uint64_t *nbytes;
    size_t *op_index; /* index of each planned op in the caller's ops[] */
} wsync_cuda_slot_t;

#define WSYNC_CUDA_RING_RESERVE_OPS 8192u /* ops per slot reserved at consumer create */

typedef struct wsync_cuda_ring {
    wsync_cuda_slot_t slot[WSYNC_CUDA_RING_SLOTS];
    unsigned next;
} wsync_cuda_ring_t;

/* Take the next slot with room for n ops: waits for its previous use (normally long done),
 * finishes its pending digest check, grows it when needed. */
wsync_result_t wsync_cuda_ring_take(wsync_cuda_ring_t *r, size_t n, wsync_cuda_slot_t **out,
                                    wsync_error_t *err);
/* Compare a finished slot's digests; DIGEST_MISMATCH names the first bad op. Frees the owner. */
wsync_result_t wsync_cuda_slot_check(wsync_cuda_slot_t *s, wsync_error_t *err);
/* Give every slot its event and room for n ops now (consumer create), so copy_weights does not
 * allocate pinned or device memory (which can synchronize with work already on the GPU) unless
 * a call brings more ops than any before. */
wsync_result_t wsync_cuda_ring_reserve(wsync_cuda_ring_t *r, size_t n, wsync_error_t *err);
void wsync_cuda_ring_free(wsync_cuda_ring_t *r);
/* Layout of a slot image for n ops. */
size_t wsync_cuda_slot_ops_bytes(size_t n);

/* -------------------------------------------------------------- consumer */

/* One IPC mapping of a producer buffer (the cache entry's payload). */
typedef struct wsync_cuda_mapping {
    struct wsync_consumer *consumer;
    unsigned char *base; /* start of the allocation (IPC open or VMM mapping) */
    int is_vmm;          /* cuda_vmm_fd: base is vmm.ptr */
    wsync_cuda_vmm_t vmm;
    uint64_t alloc_bytes; /* allocation size when the driver tells it, else 0 */
    cudaEvent_t ready, consumed;
    int has_ready, has_consumed;
    wsync_shm_t control_shm;
    wsync_control_t *control;   /* NULL for foreign buffers */
    int64_t peer_pid;           /* control->producer_pid when control is mapped */
    int control_registered;     /* the control block is host-registered for the GPU */
    void *consumed_dev;         /* device view of control->consumed_generation, or NULL */
    wsync_carriers_t carriers;  /* event: recorded after the last copy on that stream */
    uint64_t copied_generation; /* last generation enqueued */
    int recorded;               /* copied_generation has been recorded consumed */
    /* A direct segment: the launch that last read it (its slot and that slot's use), so the unmap
     * waits for it without an event of its own per copy. */
    struct wsync_cuda_slot *guard;
    uint64_t guard_uses;
    /* A failure found outside record_consumed (a digest, a one-pass quantizer's NaN), with its
     * op: record_consumed reports it. */
    wsync_error_t deferred;
} wsync_cuda_mapping_t;

/* The generation a new copy of `generation` from this buffer must be newer than: the cache
 * entry's last one (a generation copied but not yet recorded may be copied again, by split
 * calls), or the control block's consumed one, which survives close/reopen, so a replayed
 * manifest is refused after a reopen too. */
static inline uint64_t wsync_cuda_last_generation(const wsync_cache_entry_t *entry,
                                                  const wsync_cuda_mapping_t *m,
                                                  uint64_t generation)
{
    uint64_t last = entry->last_generation;
    if (!m->recorded && last != 0 && generation == last)
        last = generation - 1;
    if (m->control != NULL) {
        uint64_t consumed = atomic_load(&m->control->consumed_generation);
        if (consumed > last)
            last = consumed;
    }
    return last;
}

/* The stream rule of the ABI: a NULL stream is CUDA's legacy default stream, as in every CUDA
 * API (work on it is ordered after everything the caller queued there, e.g. torch's default
 * stream, whose cuda_stream is 0); cudaStreamPerThread and cudaStreamLegacy pass through as the
 * handles they are. The plugin never substitutes a private stream. */
static inline cudaStream_t wsync_cuda_stream(wsync_stream_t s)
{
    return s != NULL ? (cudaStream_t)s : cudaStreamLegacy;
}

/* A direct manifest's cuda_ipc segment: the 64 IPC bytes, then the producer's 8-byte allocation
 * id (CU_POINTER_ATTRIBUTE_BUFFER_ID), so memory freed and re-made at one address is another
 * cache key and is opened again, never read through the old mapping. */
#define WSYNC_CUDA_SEGMENT_HANDLE_BYTES 72u

/* What open_handle returns: a view (base_offset, bytes) of a cached mapping. */
#define WSYNC_CUDA_HANDLE_MAGIC 0x57534844u
struct wsync_handle {
    uint32_t magic;
    wsync_cache_entry_t *entry;
    uint64_t base_offset;
    uint64_t bytes;
    int segment; /* a direct manifest's segment: read by copy_segments only */
};

struct wsync_consumer {
    int device;
    int sm_count;
    char uuid[WSYNC_DEVICE_MAX];
    uint32_t timeout_ms;
    wsync_cuda_lane_t lane; /* the copy engines' share of copy_weights */
    wsync_cache_t *cache;
    wsync_manifest_cache_t *manifests; /* parse cache; thread safe on its own */
    wsync_cuda_ring_t ring;
    wsync_cuda_adapter_state_t adapter; /* the adapter executor's buffers */
    wsync_validate_memo_t valid;        /* op sets found disjoint (used under lock) */
    wsync_peers_t peers;                /* producers whose control blocks are mapped */
    wsync_cuda_tuning_t tuning;         /* read at create (wsync_cuda_tuning.h) */
    pthread_mutex_t lock;
};

wsync_result_t wsync_cuda_open_handle(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                      struct wsync_handle **out, wsync_error_t *err);
wsync_result_t wsync_cuda_close_handle(struct wsync_consumer *c, struct wsync_handle *h,
                                       wsync_error_t *err);
wsync_result_t wsync_cuda_copy_weights(struct wsync_consumer *c, struct wsync_handle *h,
                                       wsync_stream_t stream, uint64_t generation,
                                       const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                       wsync_error_t *err);
wsync_result_t wsync_cuda_copy_segments(struct wsync_consumer *c, struct wsync_handle *h,
                                        struct wsync_handle *const *segs, size_t n_segs,
                                        wsync_stream_t stream, uint64_t generation,
                                        const wsync_copy_op_t *ops, const uint32_t *op_segment,
                                        size_t n_ops, uint32_t flags, wsync_error_t *err);
wsync_result_t wsync_cuda_copy_quantized(struct wsync_consumer *c, struct wsync_handle *h,
                                         wsync_stream_t stream, uint64_t generation,
                                         const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                         size_t n_ops, uint32_t flags, wsync_error_t *err);
wsync_result_t wsync_cuda_digest_regions(struct wsync_consumer *c, wsync_stream_t stream,
                                         const wsync_copy_op_t *regions, size_t n, uint64_t *out,
                                         wsync_error_t *err);
wsync_result_t wsync_cuda_record_consumed(struct wsync_consumer *c, struct wsync_handle *h,
                                          int wait, wsync_error_t *err);
/* Enqueue *consumed* of m's last copied generation on `stream`, the stream that carried the
 * copies (the others already joined into it): the foreign producer's event, or the control
 * block's generation (wsync_cuda_consumed.c). Its own object file: the early-consumed fixture
 * (tests/fixtures) replaces it at link time (--wrap) to record on a stream that never waited. */
wsync_result_t wsync_cuda_signal_consumed(wsync_cuda_mapping_t *m, cudaStream_t stream,
                                          wsync_error_t *err);
/* Cache callbacks (user = the consumer). */
wsync_result_t wsync_cuda_map(void *user, const wsync_buffer_desc_t *desc, void **mapping,
                              wsync_error_t *err);
void wsync_cuda_unmap(void *user, void *mapping);

/* Host sources of a stage (wsync_cuda_host.c): registered ranges (wsync_host_ranges_hold) cross
 * on the copy engines; other sources are device memory, or pinned host memory that UVA maps at
 * its host address, which the stage kernel reads in place. */
wsync_result_t wsync_cuda_register_host(struct wsync_staging *s, const void *ptr, uint64_t bytes,
                                        wsync_error_t *err);
/* One host-sourced tensor of a stage: `elems` elements of src_dtype at the host address `src`
 * (registered or pinned), written as dst_dtype at the device address `dst`. */
typedef struct wsync_cuda_host_op {
    const void *src;
    void *dst;
    uint64_t elems;
    wsync_dtype_t src_dtype, dst_dtype;
} wsync_cuda_host_op_t;
/* A staging's host-to-device machinery (made at its first host-sourced stage): a copy stream,
 * two device bounce buffers and their events, the chunks' convert table. */
typedef struct wsync_cuda_bounce {
    int made;
    cudaStream_t cs;
    cudaEvent_t fork, join, h2d[2], conv[2];
    void *buf[2];
    struct wsync_cuda_conv_op *tab_host, *tab_dev;
    uint64_t *tiles;
    size_t tab_cap;
} wsync_cuda_bounce_t;
/* Enqueue ops on the copy engines (after everything on st so far), their conversions on st;
 * st waits for all of it. The caller must not reuse the tables before st passed this point. */
wsync_result_t wsync_cuda_bounce_stage(wsync_cuda_bounce_t *b, cudaStream_t st,
                                       const wsync_cuda_host_op_t *ops, size_t n, int sm_count,
                                       wsync_error_t *err);
void wsync_cuda_bounce_free(wsync_cuda_bounce_t *b);
wsync_result_t wsync_cuda_unregister_host(struct wsync_staging *s, const void *ptr,
                                          wsync_error_t *err);

extern const wsync_consumer_ops_v1_t wsync_cuda_consumer_ops;
extern const wsync_producer_ops_v1_t wsync_cuda_producer_ops;

#endif
