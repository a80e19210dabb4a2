/* Error reporting shared by every backend: fills a caller-owned wsync_error_t (first error wins)
 * and logs the same text through the host's logger. Never allocates. */
#ifndef WSYNC_COMMON_ERROR_H
#define WSYNC_COMMON_ERROR_H

#include "wsync_abi.h"

/* Record `code` with a printf-style message into err (if non-NULL and still WSYNC_OK) and log it
 * at ERROR level. Returns `code` so callers can write `return wsync_fail(...)`. */
wsync_result_t wsync_fail(wsync_error_t *err, wsync_result_t code, const char *where,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Reset err to WSYNC_OK (keeps struct_size). Safe with NULL. */
void wsync_error_clear(wsync_error_t *err);

#define WSYNC_FAIL(err, code, ...) wsync_fail((err), (code), __func__, __VA_ARGS__)

#endif
