/* Host side of plugin loading, shared by every shim, the CLI and the reference engine:
 * dlopen, resolve wsync_plugin_init, negotiate, check our minimum. Never aborts: on any failure it
 * returns an error (and logs why) so the caller can fall back to the engine's native loader. */
#ifndef WSYNC_LOADER_H
#define WSYNC_LOADER_H

#include <limits.h>
#include "wsync_abi.h"

typedef struct wsync_loader {
    void *dl;
    const wsync_plugin_t *plugin;
    uint32_t abi_version; /* negotiated */
    char path[PATH_MAX];  /* what was actually loaded */
} wsync_loader_t;

/* Load `path` (a file path or a bare soname). NULL: $WSYNC_PLUGIN if set, else the default —
 * libwsync_cuda.so when it initialises (a GPU is present), else libwsync_cpu.so — searched in
 * $WSYNC_PLUGIN_DIR, then <dir of the running executable>/../lib, then the dynamic linker path.
 * `host` may be NULL (no logging). On failure *l is zeroed and the error says which library,
 * which step (dlopen / symbol / negotiation / init) and why. */
wsync_result_t wsync_loader_open(wsync_loader_t *l, const char *path, const wsync_host_t *host,
                                 wsync_error_t *err);
void wsync_loader_close(wsync_loader_t *l);

#endif
