/* Bulk copies for the host copy path. A bucket is usually far larger than the last-level cache,
 * so its destination lines are better written with non-temporal stores (no read-for-ownership,
 * no eviction of the engine's working set): one plain memcpy of the whole payload does that
 * inside libc, a per-tensor memcpy loop does not. */
#ifndef WSYNC_CPU_MEMCPY_H
#define WSYNC_CPU_MEMCPY_H

#include <stddef.h>
#include <stdint.h>

/* Tasks moving at least this many bytes use streaming stores. */
#define WSYNC_CPU_STREAMING_MIN_TASK (8u << 20)

/* Copy n bytes with streaming stores where the CPU has them (plain memcpy otherwise). Call
 * wsync_cpu_copy_fence once after the last one, before the bytes are published to anyone. */
void wsync_cpu_copy_streaming(void *dst, const void *src, size_t n);
void wsync_cpu_copy_fence(void);

#endif
