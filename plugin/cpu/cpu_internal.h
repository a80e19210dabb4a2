/* The CPU backend's objects and members (docs/DESIGN.md §4): staging in POSIX shared memory,
 * ready/consumed as generations in the control block at the head of the segment, streams as
 * in-order queues served by worker threads (cpu_stream.h).
 *
 * Lock order: cache lock -> consumer lock -> handle lock -> sink lock. Stream workers take only
 * sink and stream locks, so waiting for a stream while holding a handle lock cannot deadlock. */
#ifndef WSYNC_CPU_INTERNAL_H
#define WSYNC_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cpu_stream.h"
#include "wsync_abi.h"
#include "wsync_cache.h"
#include "wsync_carrier.h"
#include "wsync_control.h"
#include "wsync_manifest_cache.h"
#include "wsync_nixl_buffer.h"
#include "wsync_shm.h"

#define WSYNC_CPU_DEFAULT_TIMEOUT_MS 30000u
#define WSYNC_CPU_MEM_ALIGN 256u

/* One mapped producer buffer; the cache entry's `mapping`. Shared by every open of the same key,
 * lives until the last close_handle. */
struct wsync_handle {
    struct wsync_consumer *consumer;
    wsync_cache_entry_t *entry; /* set by open_handle; its last_generation is ours */
    wsync_shm_t shm;
    wsync_control_t *control;
    uint8_t *data;               /* usable region: segment + data_offset + base_offset */
    uint64_t bytes;              /* usable bytes (desc->bytes) */
    int64_t peer_pid;            /* producer pid, for liveness checks in waits */
    pthread_mutex_t lock;        /* guards carriers and pending_generation */
    wsync_carriers_t carriers;   /* mark: the last task on that stream that reads the mapping */
    uint64_t pending_generation; /* copied, not yet recorded (0 = none) */
    wsync_cpu_sink_t sink;
    uint64_t remote;           /* host_pid segment: its address in peer_pid (no mapping) */
    int is_segment;            /* host_pid: no shm, no control block */
    wsync_nixl_buffer_t *nixl; /* nixl buffer: its peer; data is our landing region */
    struct wsync_handle *next; /* consumer's list of live handles */
};

struct wsync_consumer {
    uint32_t timeout_ms;
    wsync_cache_t *cache;
    wsync_manifest_cache_t *manifests; /* parse cache; thread safe on its own */
    wsync_cpu_stream_t *default_stream;
    pthread_mutex_t lock;         /* guards streams and handles */
    wsync_cpu_stream_t **streams; /* created by stream_create */
    size_t n_streams, cap_streams;
    struct wsync_handle *handles;
};

/* The newest generation taken from h's buffer: the cache entry's, or the control block's consumed
 * one, which survives close/reopen so a replayed manifest is refused after a reopen too. */
static inline uint64_t wsync_cpu_handle_last_generation(struct wsync_handle *h)
{
    uint64_t last = h->entry->last_generation;
    uint64_t consumed = atomic_load(&h->control->consumed_generation);
    return last > consumed ? last : consumed;
}

/* Resolve the NULL stream to the consumer's default. */
static inline wsync_cpu_stream_t *wsync_cpu_consumer_stream(struct wsync_consumer *c,
                                                            wsync_stream_t s)
{
    return s != NULL ? (wsync_cpu_stream_t *)s : c->default_stream;
}

/* Consumer members (cpu_consumer.c, cpu_handle.c, cpu_copy.c, cpu_adapter.c). */
wsync_result_t wsync_cpu_consumer_create(const wsync_consumer_config_t *config,
                                         struct wsync_consumer **out, wsync_error_t *err);
wsync_result_t wsync_cpu_parse_manifest(struct wsync_consumer *c, const char *json, size_t len,
                                        const wsync_manifest_t **out, wsync_error_t *err);
void wsync_cpu_manifest_free(struct wsync_consumer *c, const wsync_manifest_t *m);
wsync_result_t wsync_cpu_open_handle(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                     struct wsync_handle **out, wsync_error_t *err);
wsync_result_t wsync_cpu_close_handle(struct wsync_consumer *c, struct wsync_handle *h,
                                      wsync_error_t *err);
wsync_result_t wsync_cpu_copy_weights(struct wsync_consumer *c, struct wsync_handle *h,
                                      wsync_stream_t stream, uint64_t generation,
                                      const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                      wsync_error_t *err);
wsync_result_t wsync_cpu_copy_segments(struct wsync_consumer *c, struct wsync_handle *h,
                                       struct wsync_handle *const *segs, size_t n_segs,
                                       wsync_stream_t stream, uint64_t generation,
                                       const wsync_copy_op_t *ops, const uint32_t *op_segment,
                                       size_t n_ops, uint32_t flags, wsync_error_t *err);
wsync_result_t wsync_cpu_copy_quantized(struct wsync_consumer *c, struct wsync_handle *h,
                                        wsync_stream_t stream, uint64_t generation,
                                        const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                        size_t n_ops, uint32_t flags, wsync_error_t *err);
wsync_result_t wsync_cpu_digest_regions(struct wsync_consumer *c, wsync_stream_t stream,
                                        const wsync_copy_op_t *regions, size_t n, uint64_t *out,
                                        wsync_error_t *err);
wsync_result_t wsync_cpu_record_consumed(struct wsync_consumer *c, struct wsync_handle *h, int wait,
                                         wsync_error_t *err);
wsync_result_t wsync_cpu_hot_load_adapter(struct wsync_consumer *c,
                                          const wsync_adapter_source_t *src,
                                          wsync_adapter_slot_t *slot, wsync_stream_t stream,
                                          wsync_error_t *err);
wsync_result_t wsync_cpu_unload_adapter(struct wsync_consumer *c, wsync_adapter_slot_t *slot,
                                        wsync_error_t *err);
wsync_result_t wsync_cpu_enqueue_host_fn(struct wsync_consumer *c, wsync_stream_t stream,
                                         wsync_host_fn_t fn, void *user, wsync_error_t *err);
wsync_result_t wsync_cpu_consumer_finalize(struct wsync_consumer *c, wsync_error_t *err);
wsync_result_t wsync_cpu_consumer_stream_create(struct wsync_consumer *c, wsync_stream_t *out,
                                                wsync_error_t *err);
wsync_result_t wsync_cpu_consumer_stream_destroy(struct wsync_consumer *c, wsync_stream_t s,
                                                 wsync_error_t *err);
wsync_result_t wsync_cpu_consumer_stream_synchronize(struct wsync_consumer *c, wsync_stream_t s,
                                                     wsync_error_t *err);
wsync_result_t wsync_cpu_mem_alloc(struct wsync_consumer *c, size_t bytes, void **out,
                                   wsync_error_t *err);
wsync_result_t wsync_cpu_mem_free(struct wsync_consumer *c, void *p, wsync_error_t *err);
wsync_result_t wsync_cpu_mem_copy(struct wsync_consumer *c, void *dst, const void *src,
                                  size_t bytes, int kind, wsync_error_t *err);

/* Cache callbacks (cpu_handle.c); user is the consumer. */
wsync_result_t wsync_cpu_handle_map(void *user, const wsync_buffer_desc_t *desc, void **mapping,
                                    wsync_error_t *err);
void wsync_cpu_handle_unmap(void *user, void *mapping);
/* A new handle's lock and sink, and its place in the consumer's list of live handles. */
void wsync_cpu_handle_register(struct wsync_consumer *c, struct wsync_handle *h);
/* Forget `s` as a carrier of every live handle (stream_destroy, after draining s). */
void wsync_cpu_handles_forget_stream(struct wsync_consumer *c, wsync_cpu_stream_t *s);

/* Producer members (cpu_producer.c). */
wsync_result_t wsync_cpu_staging_create(const wsync_staging_config_t *config,
                                        struct wsync_staging **out, wsync_error_t *err);
wsync_result_t wsync_cpu_stage(struct wsync_staging *s, wsync_stream_t stream,
                               const wsync_stage_tensor_t *tensors, size_t n, wsync_error_t *err);
wsync_result_t wsync_cpu_publish(struct wsync_staging *s, wsync_stream_t stream, int finished,
                                 const char **manifest_json, uint64_t *generation,
                                 wsync_error_t *err);
wsync_result_t wsync_cpu_wait_consumed(struct wsync_staging *s, wsync_stream_t stream,
                                       uint64_t generation, wsync_error_t *err);
wsync_result_t wsync_cpu_retire(struct wsync_staging *s, wsync_error_t *err);
wsync_result_t wsync_cpu_staging_stream_create(struct wsync_staging *s, wsync_stream_t *out,
                                               wsync_error_t *err);
wsync_result_t wsync_cpu_staging_stream_destroy(struct wsync_staging *s, wsync_stream_t st,
                                                wsync_error_t *err);
wsync_result_t wsync_cpu_staging_stream_synchronize(struct wsync_staging *s, wsync_stream_t st,
                                                    wsync_error_t *err);
wsync_result_t wsync_cpu_read_back(struct wsync_staging *s, uint64_t offset, void *dst,
                                   size_t bytes, wsync_error_t *err);
wsync_result_t wsync_cpu_register_host(struct wsync_staging *s, const void *ptr, uint64_t bytes,
                                       wsync_error_t *err);
wsync_result_t wsync_cpu_unregister_host(struct wsync_staging *s, const void *ptr,
                                         wsync_error_t *err);

#endif
