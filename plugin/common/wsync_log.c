/* Logging through the host's callback. The callback, its user pointer and the level are copied
 * once at init (wsync_log_set_host), before worker threads start; readers never lock. */
#include "wsync_log.h"

#include <stdarg.h>
#include <stdio.h>

static wsync_log_fn_t wsync_log_fn;
static void *wsync_log_user;
static wsync_log_level_t wsync_log_max = WSYNC_LOG_ERROR;

void wsync_log_set_host(const wsync_host_t *host)
{
    wsync_log_fn = NULL;
    wsync_log_user = NULL;
    wsync_log_max = WSYNC_LOG_ERROR;
    if (!WSYNC_HAS_FIELD(wsync_host_t, host, log) || host->log == NULL)
        return;
    wsync_log_user = WSYNC_HAS_FIELD(wsync_host_t, host, log_user) ? host->log_user : NULL;
    /* An older host without log_level gets errors and warnings. */
    wsync_log_max =
        WSYNC_HAS_FIELD(wsync_host_t, host, log_level) ? host->log_level : WSYNC_LOG_WARN;
    wsync_log_fn = host->log;
}

void wsync_log_emit(wsync_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    wsync_log_fn_t fn = wsync_log_fn;

    if (fn == NULL || level > wsync_log_max)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fn(wsync_log_user, level, file, line, "%s", buf);
}
