/* Shared CLI helpers; see wsync_cli.h. */
#define _GNU_SOURCE
#include "wsync_cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wsync_wire.h"
#include "wsync_client.h"

static pthread_mutex_t wsync_cli_log_lock = PTHREAD_MUTEX_INITIALIZER;

static void wsync_cli_log(void *user, wsync_log_level_t level, const char *file, int line,
                          const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    va_list ap;

    pthread_mutex_lock(&wsync_cli_log_lock);
    fprintf(stderr, "[%s %s] ", (const char *)user, (unsigned)level < 4 ? names[level] : "?");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (level >= WSYNC_LOG_DEBUG)
        fprintf(stderr, " (%s:%d)", file, line);
    fputc('\n', stderr);
    pthread_mutex_unlock(&wsync_cli_log_lock);
}

void wsync_cli_host(wsync_host_t *host, const char *who)
{
    const char *env = getenv("WSYNC_LOG_LEVEL");

    memset(host, 0, sizeof(*host));
    host->struct_size = sizeof(*host);
    host->log = wsync_cli_log;
    host->log_user = (void *)who;
    host->log_level = WSYNC_LOG_WARN;
    if (env == NULL)
        return;
    if (strcmp(env, "error") == 0)
        host->log_level = WSYNC_LOG_ERROR;
    else if (strcmp(env, "info") == 0)
        host->log_level = WSYNC_LOG_INFO;
    else if (strcmp(env, "debug") == 0)
        host->log_level = WSYNC_LOG_DEBUG;
}

int wsync_cli_load(wsync_loader_t *l, const char *path, const wsync_host_t *host)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_host_t quiet = *host;
    wsync_result_t rc;

    /* The failure is printed below; the loader's own warning would say it twice. */
    if (quiet.log_level == WSYNC_LOG_WARN)
        quiet.log_level = WSYNC_LOG_ERROR;
    rc = wsync_loader_open(l, path, &quiet, &err);
    if (rc == WSYNC_OK)
        return 0;
    fprintf(stderr, "wsync: cannot load plugin %s: %s: %s\n",
            path ? path : "(default: $WSYNC_PLUGIN, libwsync_cuda.so, libwsync_cpu.so)",
            wsync_strerror(rc), err.message);
    return 1;
}

double wsync_cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int wsync_cli_report(const char *who, const char *what, wsync_result_t rc, const wsync_error_t *err)
{
    fprintf(stderr, "wsync %s: %s failed: %s%s%s\n", who, what, wsync_strerror(rc),
            err && err->code != WSYNC_OK ? ": " : "",
            err && err->code != WSYNC_OK ? err->message : "");
    return 1;
}

int wsync_cli_send_json(int fd, json_t *msg, const char *who)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    wsync_result_t rc;

    json_decref(msg);
    if (text == NULL) {
        fprintf(stderr, "wsync %s: cannot encode a control message\n", who);
        return 1;
    }
    rc = wsync_wire_send(fd, text, strlen(text), &err);
    free(text);
    if (rc != WSYNC_OK)
        return wsync_cli_report(who, "send", rc, &err);
    return 0;
}

json_t *wsync_cli_recv_json(int fd, const char *type, int timeout_ms, const char *who)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_error_t jerr;
    char *text = NULL;
    size_t len = 0;
    json_t *msg, *ok;
    const char *got;
    wsync_result_t rc = wsync_wire_recv(fd, &text, &len, timeout_ms, &err);

    if (rc != WSYNC_OK) {
        char what[64];
        snprintf(what, sizeof(what), "waiting for '%s'", type);
        wsync_cli_report(who, what, rc, &err);
        return NULL;
    }
    msg = json_loadb(text, len, 0, &jerr);
    free(text);
    if (msg == NULL || !json_is_object(msg)) {
        fprintf(stderr, "wsync %s: expected a '%s' message, got non-JSON: %s\n", who, type,
                jerr.text);
        json_decref(msg);
        return NULL;
    }
    got = json_string_value(json_object_get(msg, "type"));
    if (got == NULL || strcmp(got, type) != 0) {
        fprintf(stderr, "wsync %s: expected a '%s' message, got '%s'\n", who, type,
                got ? got : "(no type)");
        json_decref(msg);
        return NULL;
    }
    ok = json_object_get(msg, "ok");
    if (ok != NULL && json_is_false(ok)) {
        const char *why = json_string_value(json_object_get(msg, "error"));
        fprintf(stderr, "wsync %s: the peer reports failure in '%s': %s\n", who, type,
                why ? why : "(no detail)");
        json_decref(msg);
        return NULL;
    }
    return msg;
}

int wsync_cli_exe_dir(char *out, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

    if (n <= 0)
        return -1;
    exe[n] = '\0';
    return snprintf(out, len, "%s", dirname(exe)) < (int)len ? 0 : -1;
}

int wsync_cli_sibling(char *out, size_t len, const char *name)
{
    char dir[PATH_MAX];

    if (wsync_cli_exe_dir(dir, sizeof(dir)) != 0)
        return -1;
    return snprintf(out, len, "%s/%s", dir, name) < (int)len ? 0 : -1;
}

void wsync_cli_exec(const char *path, const char *sub, int argc, char **argv)
{
    char **args = calloc((size_t)argc + 2, sizeof(*args));
    int n = 0, saved;

    if (args == NULL) {
        errno = ENOMEM;
        return;
    }
    args[n++] = (char *)path;
    if (sub != NULL)
        args[n++] = (char *)sub;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    fflush(stdout);
    execv(path, args);
    saved = errno;
    free(args);
    errno = saved;
}
