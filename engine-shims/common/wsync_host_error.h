/* Error reporting for host-side code (loader, wire): fills a caller-owned wsync_error_t with the
 * ABI's rules (NULL allowed, first error wins, no allocation). Host code has no plugin logger, so
 * this only records; callers that log do so themselves. Header-only so each static library that
 * includes it stays self-contained. */
#ifndef WSYNC_HOST_ERROR_H
#define WSYNC_HOST_ERROR_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "wsync_abi.h"

static inline wsync_result_t wsync_host_vfail(wsync_error_t *err, wsync_result_t code,
                                              const char *where, const char *fmt, va_list ap)
{
    if (err == NULL || err->code != WSYNC_OK)
        return code;
    if (err->struct_size == 0)
        err->struct_size = sizeof(*err);
    err->code = code;
    snprintf(err->where, sizeof(err->where), "%s", where);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    return code;
}

static inline wsync_result_t wsync_host_fail(wsync_error_t *err, wsync_result_t code,
                                             const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline wsync_result_t wsync_host_fail(wsync_error_t *err, wsync_result_t code,
                                             const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wsync_host_vfail(err, code, where, fmt, ap);
    va_end(ap);
    return code;
}

#define WSYNC_HOST_FAIL(err, code, ...) wsync_host_fail((err), (code), __func__, __VA_ARGS__)

#endif
