/* Plugin loading for hosts (shims, CLI, tests). Contract in wsync_loader.h. Not thread safe with
 * itself (dlopen/dlerror); call from start-up code. */
#define _GNU_SOURCE
#include "wsync_loader.h"

#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <link.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_error.h"
#include "wsync_client.h"

#define WSYNC_LOADER_CUDA_NAME "libwsync_cuda.so"
#define WSYNC_LOADER_HOST_NAME "libwsync_cpu.so"

static void wsync_loader_log(const wsync_host_t *host, wsync_log_level_t level, const char *fmt,
                             ...) __attribute__((format(printf, 3, 4)));

static void wsync_loader_log(const wsync_host_t *host, wsync_log_level_t level, const char *fmt,
                             ...)
{
    char msg[WSYNC_ERROR_MESSAGE_LEN + PATH_MAX];
    va_list ap;

    if (host == NULL || !WSYNC_HAS_FIELD(wsync_host_t, host, log_level) || host->log == NULL ||
        level > host->log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    host->log(host->log_user, level, __FILE__, __LINE__, "%s", msg);
}

/* The default probe of the CUDA plugin fails on every machine without a GPU, and the plugin
 * reports that at ERROR. While probing, its messages reach the host's logger demoted to INFO
 * (the loader's own line says what happened); afterwards they pass unchanged. The plugin keeps
 * the logger it was given for the life of the process, so this forwarder is static. */
static struct {
    wsync_host_t host;
    _Atomic int probing;
} wsync_probe;

static void wsync_loader_probe_log(void *user, wsync_log_level_t level, const char *file, int line,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void wsync_loader_probe_log(void *user, wsync_log_level_t level, const char *file, int line,
                                   const char *fmt, ...)
{
    char msg[WSYNC_ERROR_MESSAGE_LEN + PATH_MAX];
    va_list ap;

    (void)user;
    if (atomic_load(&wsync_probe.probing) && level < WSYNC_LOG_INFO)
        level = WSYNC_LOG_INFO;
    if (level > wsync_probe.host.log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    wsync_probe.host.log(wsync_probe.host.log_user, level, file, line, "%s", msg);
}

/* Record the file the dynamic linker actually mapped (resolves bare sonames). */
static void wsync_loader_record_path(wsync_loader_t *l, const char *fallback)
{
    struct link_map *map = NULL;
    const char *name = fallback;

    if (dlinfo(l->dl, RTLD_DI_LINKMAP, &map) == 0 && map != NULL && map->l_name != NULL &&
        map->l_name[0] != '\0')
        name = map->l_name;
    if (realpath(name, l->path) == NULL)
        snprintf(l->path, sizeof(l->path), "%s", name);
}

/* dlopen one file or soname; on failure err names it and carries dlerror(). */
static wsync_result_t wsync_loader_dlopen(wsync_loader_t *l, const char *path, wsync_error_t *err)
{
    const char *why;

    dlerror();
    l->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (l->dl != NULL) {
        wsync_loader_record_path(l, path);
        return WSYNC_OK;
    }
    why = dlerror();
    if (strchr(path, '/') != NULL && access(path, F_OK) != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                            "dlopen %s: no such file (%s); pass an existing plugin path or set "
                            "WSYNC_PLUGIN",
                            path, why ? why : strerror(errno));
    return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                        "dlopen %s failed: %s; check the path, WSYNC_PLUGIN_DIR or "
                        "LD_LIBRARY_PATH",
                        path, why ? why : "unknown dlerror");
}

/* Resolve the symbol, negotiate and check the returned tables. On failure the library stays
 * open; the caller closes it. */
static wsync_result_t wsync_loader_init(wsync_loader_t *l, const wsync_host_t *host,
                                        wsync_error_t *err)
{
    wsync_plugin_init_fn_t init;
    const wsync_plugin_t *plugin = NULL;
    wsync_error_t perr = {.struct_size = sizeof(perr)};
    uint32_t version = WSYNC_ABI_VERSION;
    wsync_result_t rc;
    void *sym;

    dlerror();
    sym = dlsym(l->dl, WSYNC_PLUGIN_INIT_SYMBOL);
    if (sym == NULL) {
        const char *why = dlerror();
        return WSYNC_RECORD(err, WSYNC_ERR_INCOMPATIBLE,
                            "%s is not a wsync plugin: symbol %s not found (%s)", l->path,
                            WSYNC_PLUGIN_INIT_SYMBOL, why ? why : "NULL symbol");
    }
    memcpy(&init, &sym, sizeof(init));

    rc = init(&version, host, &plugin, &perr);
    if (rc == WSYNC_ERR_INCOMPATIBLE)
        return WSYNC_RECORD(err, rc,
                            "%s: no common ABI version: this host speaks %u..%u, the plugin "
                            "answered %u (%s)",
                            l->path, WSYNC_ABI_VERSION_MIN, WSYNC_ABI_VERSION, version,
                            perr.code != WSYNC_OK ? perr.message : "no detail");
    if (rc != WSYNC_OK)
        return WSYNC_RECORD(err, rc, "%s: %s failed: %s: %s", l->path, WSYNC_PLUGIN_INIT_SYMBOL,
                            wsync_strerror(rc), perr.code != WSYNC_OK ? perr.message : "no detail");
    if (version < WSYNC_ABI_VERSION_MIN || version > WSYNC_ABI_VERSION)
        return WSYNC_RECORD(err, WSYNC_ERR_INCOMPATIBLE,
                            "%s negotiated ABI version %u, but this host accepts %u..%u; use "
                            "a plugin built for ABI %u",
                            l->path, version, WSYNC_ABI_VERSION_MIN, WSYNC_ABI_VERSION,
                            WSYNC_ABI_VERSION);
    if (plugin == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INCOMPATIBLE,
                            "%s: %s returned success but no plugin table", l->path,
                            WSYNC_PLUGIN_INIT_SYMBOL);
    if (plugin->struct_size < offsetof(wsync_plugin_t, producer) + sizeof(plugin->producer))
        return WSYNC_RECORD(err, WSYNC_ERR_INCOMPATIBLE,
                            "%s: plugin table struct_size %zu is smaller than the %zu bytes "
                            "ABI %u requires",
                            l->path, plugin->struct_size,
                            offsetof(wsync_plugin_t, producer) + sizeof(plugin->producer), version);
    if (plugin->consumer == NULL || plugin->producer == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INCOMPATIBLE, "%s: plugin table has a NULL %s table",
                            l->path, plugin->consumer == NULL ? "consumer" : "producer");
    if (plugin->consumer->struct_size == 0 || plugin->producer->struct_size == 0)
        return WSYNC_RECORD(err, WSYNC_ERR_INCOMPATIBLE, "%s: %s table has struct_size 0", l->path,
                            plugin->consumer->struct_size == 0 ? "consumer" : "producer");
    l->plugin = plugin;
    l->abi_version = version;
    return WSYNC_OK;
}

/* Open and initialise exactly `path`; *l is zeroed on failure. */
static wsync_result_t wsync_loader_try(wsync_loader_t *l, const char *path,
                                       const wsync_host_t *host, wsync_error_t *err)
{
    wsync_result_t rc = wsync_loader_dlopen(l, path, err);
    if (rc == WSYNC_OK)
        rc = wsync_loader_init(l, host, err);
    if (rc != WSYNC_OK) {
        wsync_loader_close(l);
        return rc;
    }
    wsync_loader_log(host, WSYNC_LOG_INFO, "wsync: loaded plugin %s (%s %s, ABI %u)", l->path,
                     l->plugin->name ? l->plugin->name : "?",
                     l->plugin->version ? l->plugin->version : "?", l->abi_version);
    return WSYNC_OK;
}

/* <dir of /proc/self/exe>/../lib into out; 0 on success. */
static int wsync_loader_exe_libdir(char *out, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

    if (n <= 0)
        return -1;
    exe[n] = '\0';
    return snprintf(out, len, "%s/../lib", dirname(exe)) < (int)len ? 0 : -1;
}

/* Search `name` in $WSYNC_PLUGIN_DIR, <exe>/../lib, then the dynamic linker path. Only a file
 * that exists in a directory is tried there; a file that exists but fails to load is reported
 * (it is the one the user meant), not skipped. */
static wsync_result_t wsync_loader_search(wsync_loader_t *l, const char *name,
                                          const wsync_host_t *host, wsync_error_t *err)
{
    char dirs[2][PATH_MAX];
    char candidate[PATH_MAX];
    const char *env = getenv("WSYNC_PLUGIN_DIR");
    int ndirs = 0;

    if (env != NULL && env[0] != '\0')
        snprintf(dirs[ndirs++], PATH_MAX, "%s", env);
    if (wsync_loader_exe_libdir(dirs[ndirs], PATH_MAX) == 0)
        ndirs++;
    for (int i = 0; i < ndirs; i++) {
        if (snprintf(candidate, sizeof(candidate), "%s/%s", dirs[i], name) >=
            (int)sizeof(candidate))
            continue;
        if (access(candidate, F_OK) == 0)
            return wsync_loader_try(l, candidate, host, err);
    }
    return wsync_loader_try(l, name, host, err);
}

/* The default: CUDA when it initialises here, else host. */
static wsync_result_t wsync_loader_default(wsync_loader_t *l, const wsync_host_t *host,
                                           wsync_error_t *err)
{
    wsync_error_t cerr = {.struct_size = sizeof(cerr)};
    wsync_host_t probe_host;
    const wsync_host_t *cuda_host = host;

    if (host != NULL && WSYNC_HAS_FIELD(wsync_host_t, host, log_level) && host->log != NULL) {
        wsync_probe.host = *host;
        wsync_probe.host.struct_size = sizeof(wsync_probe.host);
        probe_host = wsync_probe.host;
        probe_host.log = wsync_loader_probe_log;
        probe_host.log_user = NULL;
        cuda_host = &probe_host;
    }
    atomic_store(&wsync_probe.probing, 1);
    wsync_result_t rc = wsync_loader_search(l, WSYNC_LOADER_CUDA_NAME, cuda_host, &cerr);
    atomic_store(&wsync_probe.probing, 0);

    if (rc == WSYNC_OK)
        return WSYNC_OK;
    wsync_loader_log(host,
                     rc == WSYNC_ERR_NO_DEVICE || rc == WSYNC_ERR_NOT_FOUND ? WSYNC_LOG_INFO
                                                                            : WSYNC_LOG_WARN,
                     "wsync: CUDA plugin not used (%s: %s); falling back to %s", wsync_strerror(rc),
                     cerr.message, WSYNC_LOADER_HOST_NAME);
    return wsync_loader_search(l, WSYNC_LOADER_HOST_NAME, host, err);
}

wsync_result_t wsync_loader_open(wsync_loader_t *l, const char *path, const wsync_host_t *host,
                                 wsync_error_t *err)
{
    wsync_error_t local = {.struct_size = sizeof(local)};
    const char *env;
    wsync_result_t rc;

    if (l == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "loader is NULL");
    memset(l, 0, sizeof(*l));
    env = getenv("WSYNC_PLUGIN");
    if (path == NULL && env != NULL && env[0] != '\0')
        path = env;

    if (path == NULL)
        rc = wsync_loader_default(l, host, &local);
    else if (strchr(path, '/') != NULL)
        rc = wsync_loader_try(l, path, host, &local);
    else
        rc = wsync_loader_search(l, path, host, &local);

    if (rc != WSYNC_OK) {
        memset(l, 0, sizeof(*l));
        wsync_loader_log(host, WSYNC_LOG_WARN, "wsync: plugin not loaded: %s", local.message);
        wsync_error_record(err, rc, "wsync_loader_open", "%s", local.message);
    }
    return rc;
}

void wsync_loader_close(wsync_loader_t *l)
{
    if (l == NULL)
        return;
    if (l->dl != NULL)
        dlclose(l->dl);
    memset(l, 0, sizeof(*l));
}
