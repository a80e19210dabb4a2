/* wsync-bench-cuda's direct syncs (WSYNC_STAGING_DIRECT): the engine copies straight from the
 * trainer's own allocations, no staging buffer, each segment exported once and held mapped by
 * the engine across syncs. Three trainers: "separate" (one cudaMalloc per tensor, as PyTorch's
 * caching allocator holds every large parameter), "one" (every tensor a view of one
 * allocation, as Megatron's contiguous parameter buffers hold them) and "vmm" (the packed layout
 * in one cuMem range of 20 MiB chunks, as PyTorch's expandable segments hold it; exported as
 * fds, no legacy IPC). */
#ifndef WSYNC_BENCH_DIRECT_H
#define WSYNC_BENCH_DIRECT_H

#include "wsync_bench_engine.h"

/* Producer side: serve the session the consumer opened with message `m` ("direct-separate",
 * "direct-one" or "direct-vmm") until "dend": each "dsync" stages every bucket of `bucket` bytes in
 * place, publishes it, then waits for the consumer's "ack" and *consumed* of the last generation.
 * packed: the trainer's layout in one allocation (filled with the pattern). Returns 0. */
int wb_direct_serve(const wsync_plugin_t *p, int fd, cudaStream_t st, const wb_layout_t *l,
                    uint64_t bucket, unsigned char *packed, const char *m);

/* Consumer side: the three trainers, each timed end to end (request to the engine stream's last
 * copy, and the trainer's wall clock to *consumed*) and on the GPU alone, against ms_flat (one
 * cudaMemcpyAsync of the payload) and ms_staged (the staged sync of the same run). Prints its
 * rows; returns the wrong words found in the engine parameters after a checked sync. */
unsigned long long wb_direct_run(wb_engine_t *E, int fd, uint64_t bucket, unsigned iters,
                                 double ms_flat, double ms_staged, unsigned long long *bad_dev);

#endif
