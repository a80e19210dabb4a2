/* Error reporting shared by every backend: fills a caller-owned wsync_error_t (first error wins)
 * and logs the same text through the host's logger. Never allocates. */
#ifndef WSYNC_COMMON_ERROR_H
#define WSYNC_COMMON_ERROR_H

#include <stdint.h>

#include "wsync_abi.h"

/* `where` in a wsync_error_t is the wsync function that detected the error (its C name, e.g.
 * "wsync_cuda_copy_weights" or "copy_weights"); the message names the offending value and what
 * to do. */

/* Record `code` with a printf-style message into err (if non-NULL and still WSYNC_OK) and log it
 * at ERROR level through the host's logger with the caller's file and line. Returns `code` so
 * callers can write `return wsync_fail(...)`. */
wsync_result_t wsync_fail_at(wsync_error_t *err, wsync_result_t code, const char *where,
                             const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
#define wsync_fail(err, code, where, ...)                                                          \
    wsync_fail_at((err), (code), (where), __FILE__, __LINE__, __VA_ARGS__)
#define WSYNC_FAIL(err, code, ...)                                                                 \
    wsync_fail_at((err), (code), __func__, __FILE__, __LINE__, __VA_ARGS__)

/* wsync_fail_at for a failure of one op: err's op (wsync_error_t.op) is set to `op` with the
 * message, when err was still OK. */
wsync_result_t wsync_fail_op_at(wsync_error_t *err, wsync_result_t code, uint64_t op,
                                const char *where, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
#define wsync_fail_op(err, code, op, where, ...)                                                   \
    wsync_fail_op_at((err), (code), (op), (where), __FILE__, __LINE__, __VA_ARGS__)
#define WSYNC_FAIL_OP(err, code, op, ...)                                                          \
    wsync_fail_op_at((err), (code), (op), __func__, __FILE__, __LINE__, __VA_ARGS__)

/* src's failure recorded again into err (its code, and its op when it has one) with a message
 * of its own (src's, say, with what the caller knows prefixed), logged as wsync_fail_at. */
wsync_result_t wsync_fail_from_at(wsync_error_t *err, const wsync_error_t *src, const char *where,
                                  const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
#define wsync_fail_from(err, src, where, ...)                                                      \
    wsync_fail_from_at((err), (src), (where), __FILE__, __LINE__, __VA_ARGS__)
#define WSYNC_FAIL_FROM(err, src, ...)                                                             \
    wsync_fail_from_at((err), (src), __func__, __FILE__, __LINE__, __VA_ARGS__)

/* Copy src's failure (code, where, message, op) into err when err is still OK, writing only the
 * members err's struct_size covers. */
void wsync_error_copy(wsync_error_t *err, const wsync_error_t *src);

/* Record only, no log: for host-side code (loader, shims, wire) that reports through its own
 * logger or its caller. Same rules: NULL allowed, first error wins, nothing allocated. */
wsync_result_t wsync_error_record(wsync_error_t *err, wsync_result_t code, const char *where,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define WSYNC_RECORD(err, code, ...) wsync_error_record((err), (code), __func__, __VA_ARGS__)

/* Reset err to WSYNC_OK (keeps struct_size). Safe with NULL. */
void wsync_error_clear(wsync_error_t *err);

#endif
