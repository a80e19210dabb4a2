/* Logging through the host's callback only; silent when the host gave none. Thread safe: the
 * callback pointer is written once at init, before any worker thread starts. */
#ifndef WSYNC_COMMON_LOG_H
#define WSYNC_COMMON_LOG_H

#include "wsync_abi.h"

void wsync_log_set_host(const wsync_host_t *host);
void wsync_log_emit(wsync_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define WSYNC_LOG(level, ...) wsync_log_emit((level), __FILE__, __LINE__, __VA_ARGS__)
#define WSYNC_LOG_ERROR(...) WSYNC_LOG(WSYNC_LOG_ERROR, __VA_ARGS__)
#define WSYNC_LOG_WARN(...) WSYNC_LOG(WSYNC_LOG_WARN, __VA_ARGS__)
#define WSYNC_LOG_INFO(...) WSYNC_LOG(WSYNC_LOG_INFO, __VA_ARGS__)
#define WSYNC_LOG_DEBUG(...) WSYNC_LOG(WSYNC_LOG_DEBUG, __VA_ARGS__)

#endif
