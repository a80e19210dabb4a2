/* The CPU backend's nixl buffers (WSYNC_BUFFER_NIXL): a consumer's handle is a landing region of
 * host memory that each copy first pulls from the producer, then copies from as from a mapping;
 * a producer's staging segment is registered for its consumers (wsync_nixl_buffer.h). */
#ifndef WSYNC_CPU_NIXL_H
#define WSYNC_CPU_NIXL_H

#include "cpu_internal.h"

/* The cache's map for a nixl desc: a handle whose data is the landing region. */
wsync_result_t wsync_cpu_nixl_map(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                  void **mapping, wsync_error_t *err);
void wsync_cpu_nixl_unmap(struct wsync_handle *h);

/* Under h's lock, before anything of `generation` is enqueued on stream s: pull what ops read
 * and mark the generation published and ready in the handle's own control block. With `into`,
 * straight into the destinations after the work queued on s (the copy that follows has no op;
 * 2: ops of a direct manifest, whose src_offset are the producer's addresses); else into the
 * landing region, once no stream reads it. */
wsync_result_t wsync_cpu_nixl_pull(struct wsync_consumer *c, struct wsync_handle *h,
                                   wsync_cpu_stream_t *s, const wsync_copy_op_t *ops, size_t n_ops,
                                   uint64_t generation, int into, wsync_error_t *err);

#endif
