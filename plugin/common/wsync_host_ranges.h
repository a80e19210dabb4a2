/* The host ranges a producer may stage from (register_host, ABI 0.1.5): one process-wide table per
 * plugin, so every staging of the plugin reads what any registered. Thread safe. */
#ifndef WSYNC_COMMON_HOST_RANGES_H
#define WSYNC_COMMON_HOST_RANGES_H

#include <stdint.h>

#include "wsync_abi.h"

typedef struct wsync_host_range {
    uintptr_t host;
    uint64_t bytes;
} wsync_host_range_t;

/* Check the arguments of register_host: INVALID_ARGUMENT for a NULL ptr or 0 bytes, a range that
 * wraps, or one that meets a registered range (both named). */
wsync_result_t wsync_host_ranges_check(const void *ptr, uint64_t bytes, wsync_error_t *err);
/* Add a checked range (OUT_OF_MEMORY, or the check's errors: it is repeated under the lock). */
wsync_result_t wsync_host_ranges_add(const wsync_host_range_t *r, wsync_error_t *err);
/* Remove the range that starts at ptr; INVALID_ARGUMENT when none does. */
wsync_result_t wsync_host_ranges_remove(const void *ptr, wsync_error_t *err);
/* 1 when one registered range holds all of [p, p + bytes), else 0. */
int wsync_host_ranges_hold(const void *p, uint64_t bytes);

#endif
