/* See wsync_nccl_api.h: dlopen of libnccl.so.2 and symbol resolution, once per process. */
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_nccl_api.h"

static pthread_mutex_t wsync_nccl_lock = PTHREAD_MUTEX_INITIALIZER;
static wsync_nccl_api_t wsync_nccl_table;
static int wsync_nccl_loaded;

/* Site-packages of the nvidia-nccl-cu12/cu13 wheels, under the usual Python prefixes. */
static const char *const wsync_nccl_globs[] = {
    "%s/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2", /* $VIRTUAL_ENV, $CONDA_PREFIX */
    "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
    "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
    "/usr/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
    "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
    "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
    "%s/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2", /* $HOME */
    "/usr/local/cuda/lib*/libnccl.so.2", /* toolkits that ship NCCL beside cudart */
};

static void *try_open(const char *path, char *tried, size_t cap)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    size_t used = strlen(tried);
    if (h == NULL && used + 4 < cap)
        snprintf(tried + used, cap - used, "%s%s", used ? ", " : "", path);
    return h;
}

static void *try_glob(const char *pattern, char *path, size_t path_cap, char *tried, size_t cap)
{
    glob_t g;
    void *h = NULL;
    if (glob(pattern, 0, NULL, &g) != 0)
        return NULL;
    for (size_t i = g.gl_pathc; i > 0 && h == NULL; i--) { /* newest Python first */
        h = try_open(g.gl_pathv[i - 1], tried, cap);
        if (h != NULL)
            snprintf(path, path_cap, "%s", g.gl_pathv[i - 1]);
    }
    globfree(&g);
    return h;
}

static void *open_library(char *path, size_t path_cap, char *tried, size_t cap)
{
    const char *env = getenv("WSYNC_NCCL_LIB");
    void *h = NULL;
    if (env != NULL && env[0] != '\0') {
        snprintf(path, path_cap, "%s", env);
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL); /* an explicit choice is not second-guessed */
        if (h == NULL) {
            const char *why = dlerror();
            snprintf(tried, cap, "WSYNC_NCCL_LIB=%s: %s", env, why ? why : "dlopen failed");
        }
        return h;
    }
    snprintf(path, path_cap, "libnccl.so.2");
    if ((h = try_open("libnccl.so.2", tried, cap)) != NULL)
        return h;
    const char *prefixes[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX"), getenv("HOME")};
    for (size_t i = 0; i < sizeof(wsync_nccl_globs) / sizeof(wsync_nccl_globs[0]); i++) {
        char pattern[512];
        const char *g = wsync_nccl_globs[i];
        if (strstr(g, "%s") != NULL) {
            for (size_t p = 0; p < 3; p++) {
                int home = strstr(g, ".local") != NULL;
                if (prefixes[p] == NULL || (home != (p == 2)))
                    continue;
                snprintf(pattern, sizeof(pattern), g, prefixes[p]);
                if ((h = try_glob(pattern, path, path_cap, tried, cap)) != NULL)
                    return h;
            }
            continue;
        }
        if ((h = try_glob(g, path, path_cap, tried, cap)) != NULL)
            return h;
    }
    return NULL;
}

#define WSYNC_NCCL_SYM(field, name)                                                                \
    do {                                                                                           \
        *(void **)(&t.field) = dlsym(h, name);                                                     \
        if (t.field == NULL) {                                                                     \
            missing = name;                                                                        \
            goto bad;                                                                              \
        }                                                                                          \
    } while (0)

wsync_result_t wsync_nccl_load(const wsync_nccl_api_t **out, wsync_error_t *err)
{
    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "nccl_load needs an out pointer");
    pthread_mutex_lock(&wsync_nccl_lock);
    if (wsync_nccl_loaded) {
        pthread_mutex_unlock(&wsync_nccl_lock);
        *out = &wsync_nccl_table;
        return WSYNC_OK;
    }
    wsync_nccl_api_t t;
    memset(&t, 0, sizeof(t));
    char tried[1024] = "";
    const char *missing = NULL;
    void *h = open_library(t.path, sizeof(t.path), tried, sizeof(tried));
    if (h == NULL) {
        pthread_mutex_unlock(&wsync_nccl_lock);
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "NCCL not found (tried %s): install nvidia-nccl-cu13 or point "
                          "WSYNC_NCCL_LIB at libnccl.so.2",
                          tried);
    }
    WSYNC_NCCL_SYM(get_unique_id, "ncclGetUniqueId");
    WSYNC_NCCL_SYM(comm_init_rank, "ncclCommInitRank");
    WSYNC_NCCL_SYM(broadcast, "ncclBroadcast");
    WSYNC_NCCL_SYM(group_start, "ncclGroupStart");
    WSYNC_NCCL_SYM(group_end, "ncclGroupEnd");
    WSYNC_NCCL_SYM(comm_destroy, "ncclCommDestroy");
    WSYNC_NCCL_SYM(comm_abort, "ncclCommAbort");
    WSYNC_NCCL_SYM(get_error_string, "ncclGetErrorString");
    wsync_nccl_table = t;
    wsync_nccl_loaded = 1;
    pthread_mutex_unlock(&wsync_nccl_lock);
    WSYNC_LOG_INFO("nccl transport: loaded %s", t.path);
    *out = &wsync_nccl_table;
    return WSYNC_OK;
bad:
    dlclose(h);
    pthread_mutex_unlock(&wsync_nccl_lock);
    return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                      "%s lacks %s (NCCL older than 2.7?): point WSYNC_NCCL_LIB at a newer "
                      "libnccl.so.2",
                      t.path, missing);
}

wsync_result_t wsync_nccl_fail(wsync_error_t *err, const wsync_nccl_api_t *api,
                               wsync_nccl_result_t r, const char *where, const char *what)
{
    const char *text = api && api->get_error_string ? api->get_error_string(r) : NULL;
    return wsync_fail(err, WSYNC_ERR_SYSTEM, where, "%s failed: %s (ncclResult_t %d)", what,
                      text ? text : "unknown NCCL error", r);
}
