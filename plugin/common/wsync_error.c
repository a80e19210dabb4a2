/* Error reporting: caller-owned wsync_error_t, first error wins, logged at ERROR. */
#include "wsync_error.h"
#include "wsync_client.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "wsync_log.h"

static void wsync_copy_where(char *dst, const char *where)
{
    size_t n = where ? strlen(where) : 0;
    if (n >= WSYNC_ERROR_WHERE_LEN)
        n = WSYNC_ERROR_WHERE_LEN - 1;
    if (n)
        memcpy(dst, where, n);
    dst[n] = '\0';
}

/* Record into err when it is still OK (first error wins); nothing is formatted otherwise. */
static void wsync_error_vset(wsync_error_t *err, wsync_result_t code, const char *where,
                             const char *fmt, va_list ap)
{
    if (err == NULL || err->code != WSYNC_OK)
        return;
    if (err->struct_size == 0)
        err->struct_size = sizeof(*err);
    err->code = code;
    wsync_copy_where(err->where, where);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    wsync_error_clear_op(err);
}

wsync_result_t wsync_error_record(wsync_error_t *err, wsync_result_t code, const char *where,
                                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wsync_error_vset(err, code, where, fmt, ap);
    va_end(ap);
    return code;
}

static void wsync_fail_v(wsync_error_t *err, wsync_result_t code, const char *where,
                         const char *file, int line, const char *fmt, va_list ap)
{
    char message[WSYNC_ERROR_MESSAGE_LEN];
    vsnprintf(message, sizeof(message), fmt, ap);
    wsync_error_record(err, code, where, "%s", message);
    wsync_log_emit(WSYNC_LOG_ERROR, file ? file : "?", line, "%s: %s (%s)", where ? where : "?",
                   message, wsync_strerror(code));
}

wsync_result_t wsync_fail_at(wsync_error_t *err, wsync_result_t code, const char *where,
                             const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wsync_fail_v(err, code, where, file, line, fmt, ap);
    va_end(ap);
    return code;
}

wsync_result_t wsync_fail_op_at(wsync_error_t *err, wsync_result_t code, uint64_t op,
                                const char *where, const char *file, int line, const char *fmt, ...)
{
    const int fresh = err != NULL && err->code == WSYNC_OK;
    va_list ap;
    va_start(ap, fmt);
    wsync_fail_v(err, code, where, file, line, fmt, ap);
    va_end(ap);
    if (fresh)
        wsync_error_set_op(err, op);
    return code;
}

wsync_result_t wsync_fail_from_at(wsync_error_t *err, const wsync_error_t *src, const char *where,
                                  const char *file, int line, const char *fmt, ...)
{
    const int fresh = err != NULL && err->code == WSYNC_OK;
    uint64_t op;
    va_list ap;
    va_start(ap, fmt);
    wsync_fail_v(err, src->code, where, file, line, fmt, ap);
    va_end(ap);
    if (fresh && wsync_error_op(src, &op))
        wsync_error_set_op(err, op);
    return src->code;
}

void wsync_error_copy(wsync_error_t *err, const wsync_error_t *src)
{
    uint64_t op;
    if (err == NULL || src == NULL || err->code != WSYNC_OK || src->code == WSYNC_OK)
        return;
    err->code = src->code;
    memcpy(err->where, src->where, sizeof(err->where));
    memcpy(err->message, src->message, sizeof(err->message));
    if (wsync_error_op(src, &op))
        wsync_error_set_op(err, op);
    else
        wsync_error_clear_op(err);
}

void wsync_error_clear(wsync_error_t *err)
{
    if (err == NULL)
        return;
    err->code = WSYNC_OK;
    err->where[0] = '\0';
    err->message[0] = '\0';
    wsync_error_clear_op(err);
}
