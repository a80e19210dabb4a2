/* NIXL's C API reached through dlopen (wsync_nixl.h). The prototypes below are those of NIXL
 * 1.5.1's libnixl_capi.so (src/bindings/rust/wrapper.h of NIXL): opaque handles, a status whose
 * 0 is success and 1 "in progress", memory types DRAM 0 and VRAM 1, operations READ 0 and
 * WRITE 1. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wsync_clock.h"
#include "wsync_error.h"
#include "wsync_nixl.h"

typedef int capi_status_t;
typedef void *capi_obj_t;
#define CAPI_OK 0
#define CAPI_IN_PROG 1
#define CAPI_NOT_FOUND (-6)
#define CAPI_DRAM 0
#define CAPI_VRAM 1

/* The members of NIXL's C API that wsync calls. */
typedef struct capi {
    capi_status_t (*create_agent)(const char *, capi_obj_t *);
    capi_status_t (*get_plugin_params)(capi_obj_t, const char *, capi_obj_t *, capi_obj_t *);
    capi_status_t (*destroy_mem_list)(capi_obj_t);
    capi_status_t (*destroy_params)(capi_obj_t);
    capi_status_t (*create_backend)(capi_obj_t, const char *, capi_obj_t, capi_obj_t *);
    capi_status_t (*get_local_md)(capi_obj_t, void **, size_t *);
    capi_status_t (*load_remote_md)(capi_obj_t, const void *, size_t, char **);
    capi_status_t (*invalidate_remote_md)(capi_obj_t, const char *);
    capi_status_t (*create_reg_dlist)(int, capi_obj_t *);
    capi_status_t (*reg_dlist_add_desc)(capi_obj_t, uintptr_t, size_t, uint64_t, const void *,
                                        size_t);
    capi_status_t (*destroy_reg_dlist)(capi_obj_t);
    capi_status_t (*register_mem)(capi_obj_t, capi_obj_t, capi_obj_t);
    capi_status_t (*deregister_mem)(capi_obj_t, capi_obj_t, capi_obj_t);
    capi_status_t (*create_xfer_dlist)(int, capi_obj_t *);
    capi_status_t (*xfer_dlist_add_desc)(capi_obj_t, uintptr_t, size_t, uint64_t);
    capi_status_t (*destroy_xfer_dlist)(capi_obj_t);
    capi_status_t (*create_xfer_req)(capi_obj_t, int, capi_obj_t, capi_obj_t, const char *,
                                     capi_obj_t *, capi_obj_t);
    capi_status_t (*post_xfer_req)(capi_obj_t, capi_obj_t, capi_obj_t);
    capi_status_t (*get_xfer_status)(capi_obj_t, capi_obj_t);
    capi_status_t (*release_xfer_req)(capi_obj_t, capi_obj_t);
    capi_status_t (*destroy_xfer_req)(capi_obj_t);
} capi_t;

struct wsync_nixl_reg {
    capi_obj_t dlist;
};

/* A peer whose metadata the agent holds, and the bytes it was loaded from. */
typedef struct nixl_peer {
    char name[WSYNC_NIXL_NAME_MAX];
    uint8_t *md;
    size_t len;
} nixl_peer_t;

#define NIXL_PEERS_MAX 256u

static struct {
    pthread_mutex_t lock;
    int tried;
    wsync_result_t started; /* the answer of the first start */
    char why[WSYNC_ERROR_MESSAGE_LEN];
    capi_t f;
    capi_obj_t agent;
    char self[WSYNC_NIXL_NAME_MAX];
    nixl_peer_t peers[NIXL_PEERS_MAX];
    size_t n_peers;
} g_nixl = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int nixl_bind(void *lib, capi_t *f)
{
#define WSYNC_NIXL_SYM(member)                                                                     \
    if ((*(void **)&f->member = dlsym(lib, "nixl_capi_" #member)) == NULL)                         \
        return -1;
    WSYNC_NIXL_SYM(create_agent)
    WSYNC_NIXL_SYM(get_plugin_params)
    WSYNC_NIXL_SYM(destroy_mem_list)
    WSYNC_NIXL_SYM(destroy_params)
    WSYNC_NIXL_SYM(create_backend)
    WSYNC_NIXL_SYM(get_local_md)
    WSYNC_NIXL_SYM(load_remote_md)
    WSYNC_NIXL_SYM(invalidate_remote_md)
    WSYNC_NIXL_SYM(create_reg_dlist)
    WSYNC_NIXL_SYM(reg_dlist_add_desc)
    WSYNC_NIXL_SYM(destroy_reg_dlist)
    WSYNC_NIXL_SYM(register_mem)
    WSYNC_NIXL_SYM(deregister_mem)
    WSYNC_NIXL_SYM(create_xfer_dlist)
    WSYNC_NIXL_SYM(xfer_dlist_add_desc)
    WSYNC_NIXL_SYM(destroy_xfer_dlist)
    WSYNC_NIXL_SYM(create_xfer_req)
    WSYNC_NIXL_SYM(post_xfer_req)
    WSYNC_NIXL_SYM(get_xfer_status)
    WSYNC_NIXL_SYM(release_xfer_req)
    WSYNC_NIXL_SYM(destroy_xfer_req)
#undef WSYNC_NIXL_SYM
    return 0;
}

/* The agent with its UCX backend. Caller holds the lock; sets g_nixl.why on failure. */
static int nixl_make_agent(void)
{
    char host[64] = "host";
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL) ^ (unsigned)clock();
    (void)gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    snprintf(g_nixl.self, sizeof(g_nixl.self), "wsync-%.40s-%ld-%08x", host, (long)getpid(),
             (unsigned)rand_r(&seed));
    capi_obj_t mems = NULL, params = NULL, backend = NULL;
    capi_status_t s = g_nixl.f.create_agent(g_nixl.self, &g_nixl.agent);
    if (s != CAPI_OK) {
        snprintf(g_nixl.why, sizeof(g_nixl.why), "NIXL could not make agent %s (status %d)",
                 g_nixl.self, s);
        return -1;
    }
    s = g_nixl.f.get_plugin_params(g_nixl.agent, "UCX", &mems, &params);
    if (s == CAPI_OK)
        s = g_nixl.f.create_backend(g_nixl.agent, "UCX", params, &backend);
    if (mems != NULL)
        g_nixl.f.destroy_mem_list(mems);
    if (params != NULL)
        g_nixl.f.destroy_params(params);
    if (s != CAPI_OK) {
        snprintf(g_nixl.why, sizeof(g_nixl.why),
                 "NIXL has no UCX backend here (status %d); install the nixl-cu12 or nixl-cu13 "
                 "wheel, which carries it",
                 s);
        return -1;
    }
    /* The backend lives as long as the agent: its handle is never destroyed. */
    return 0;
}

wsync_result_t wsync_nixl_start(wsync_error_t *err)
{
    pthread_mutex_lock(&g_nixl.lock);
    if (!g_nixl.tried) {
        g_nixl.tried = 1;
        g_nixl.started = WSYNC_ERR_NOT_SUPPORTED;
        const char *path = getenv("WSYNC_NIXL_LIB");
        if (path == NULL || path[0] == '\0')
            path = "libnixl_capi.so";
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL)
            snprintf(g_nixl.why, sizeof(g_nixl.why),
                     "NIXL's C API %s could not be loaded (%.160s); install nixl-cu12 or "
                     "nixl-cu13, or set WSYNC_NIXL_LIB to its libnixl_capi.so",
                     path, dlerror());
        else if (nixl_bind(lib, &g_nixl.f) != 0)
            snprintf(g_nixl.why, sizeof(g_nixl.why),
                     "%s lacks a member of NIXL's C API that wsync calls (NIXL 1.5.1 has them)",
                     path);
        else if (nixl_make_agent() == 0)
            g_nixl.started = WSYNC_OK;
    }
    wsync_result_t r = g_nixl.started;
    pthread_mutex_unlock(&g_nixl.lock);
    if (r != WSYNC_OK)
        return WSYNC_FAIL(err, r, "%s", g_nixl.why);
    return WSYNC_OK;
}

const char *wsync_nixl_self(void)
{
    return g_nixl.self;
}

wsync_result_t wsync_nixl_register(void *addr, uint64_t bytes, int vram, uint64_t dev,
                                   wsync_nixl_reg_t **out, wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_start(err);
    if (r != WSYNC_OK)
        return r;
    wsync_nixl_reg_t *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a NIXL registration");
    pthread_mutex_lock(&g_nixl.lock);
    capi_status_t s = g_nixl.f.create_reg_dlist(vram ? CAPI_VRAM : CAPI_DRAM, &reg->dlist);
    if (s == CAPI_OK)
        s = g_nixl.f.reg_dlist_add_desc(reg->dlist, (uintptr_t)addr, (size_t)bytes, dev, NULL, 0);
    if (s == CAPI_OK)
        s = g_nixl.f.register_mem(g_nixl.agent, reg->dlist, NULL);
    if (s != CAPI_OK && reg->dlist != NULL)
        g_nixl.f.destroy_reg_dlist(reg->dlist);
    pthread_mutex_unlock(&g_nixl.lock);
    if (s != CAPI_OK) {
        free(reg);
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM,
                          "NIXL refused to register %llu bytes of %s memory at %p (status %d)",
                          (unsigned long long)bytes, vram ? "device" : "host", addr, s);
    }
    *out = reg;
    return WSYNC_OK;
}

void wsync_nixl_deregister(wsync_nixl_reg_t *reg)
{
    if (reg == NULL)
        return;
    pthread_mutex_lock(&g_nixl.lock);
    (void)g_nixl.f.deregister_mem(g_nixl.agent, reg->dlist, NULL);
    g_nixl.f.destroy_reg_dlist(reg->dlist);
    pthread_mutex_unlock(&g_nixl.lock);
    free(reg);
}

wsync_result_t wsync_nixl_cover(wsync_nixl_ranges_t *set, uint64_t start, uint64_t end, int vram,
                                wsync_error_t *err)
{
    size_t at = 0, hi = set->n; /* at: the first range starting after `start` */
    while (at < hi) {
        const size_t mid = (at + hi) / 2;
        if (set->at[mid].start <= start)
            at = mid + 1;
        else
            hi = mid;
    }
    /* none nested, so the last range starting at or before `start` ends last among them */
    if (at > 0 && set->at[at - 1].end >= end)
        return WSYNC_OK;
    if (set->n == set->cap) {
        const size_t cap = set->cap ? 2 * set->cap : 64;
        void *p = realloc(set->at, cap * sizeof(*set->at));
        if (p == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu registrations", cap);
        set->at = p;
        set->cap = cap;
    }
    wsync_nixl_reg_t *reg = NULL;
    wsync_result_t r =
        wsync_nixl_register((void *)(uintptr_t)start, end - start, vram, 0, &reg, err);
    if (r != WSYNC_OK)
        return r;
    size_t k = 0; /* keep the ranges the new one does not hold */
    for (size_t i = 0; i < set->n; i++) {
        if (set->at[i].start >= start && set->at[i].end <= end)
            wsync_nixl_deregister(set->at[i].reg);
        else
            set->at[k++] = set->at[i];
    }
    set->n = k;
    for (at = 0; at < set->n && set->at[at].start <= start; at++)
        ;
    memmove(&set->at[at + 1], &set->at[at], (set->n - at) * sizeof(*set->at));
    set->at[at] = (wsync_nixl_range_t){start, end, reg};
    set->n++;
    return WSYNC_OK;
}

void wsync_nixl_ranges_end(wsync_nixl_ranges_t *set)
{
    for (size_t i = 0; i < set->n; i++)
        wsync_nixl_deregister(set->at[i].reg);
    free(set->at);
    *set = (wsync_nixl_ranges_t){0};
}

wsync_result_t wsync_nixl_metadata(uint8_t **md, size_t *len, wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_start(err);
    if (r != WSYNC_OK)
        return r;
    void *p = NULL;
    pthread_mutex_lock(&g_nixl.lock);
    capi_status_t s = g_nixl.f.get_local_md(g_nixl.agent, &p, len);
    pthread_mutex_unlock(&g_nixl.lock);
    if (s != CAPI_OK || p == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "NIXL gave no metadata for agent %s (status %d)",
                          g_nixl.self, s);
    *md = p; /* malloc'd by NIXL's C API */
    return WSYNC_OK;
}

static nixl_peer_t *nixl_peer_find(const char *name)
{
    for (size_t i = 0; i < g_nixl.n_peers; i++)
        if (strcmp(g_nixl.peers[i].name, name) == 0)
            return &g_nixl.peers[i];
    return NULL;
}

/* Remember (name, md); the oldest peer makes room when the table is full. Caller holds the
 * lock. */
static void nixl_peer_keep(const char *name, const uint8_t *md, size_t len)
{
    nixl_peer_t *p = nixl_peer_find(name);
    uint8_t *copy = malloc(len);
    if (copy == NULL)
        return; /* only the cache is lost: the next manifest loads the bytes again */
    memcpy(copy, md, len);
    if (p == NULL && g_nixl.n_peers == NIXL_PEERS_MAX) {
        free(g_nixl.peers[0].md);
        memmove(&g_nixl.peers[0], &g_nixl.peers[1], (NIXL_PEERS_MAX - 1) * sizeof(nixl_peer_t));
        g_nixl.n_peers--;
    }
    if (p == NULL) {
        p = &g_nixl.peers[g_nixl.n_peers++];
        snprintf(p->name, sizeof(p->name), "%s", name);
    }
    free(p->md);
    p->md = copy;
    p->len = len;
}

wsync_result_t wsync_nixl_peer(const uint8_t *md, size_t len, char name[WSYNC_NIXL_NAME_MAX],
                               wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_start(err);
    if (r != WSYNC_OK)
        return r;
    pthread_mutex_lock(&g_nixl.lock);
    for (size_t i = 0; i < g_nixl.n_peers; i++) {
        if (g_nixl.peers[i].len == len && memcmp(g_nixl.peers[i].md, md, len) == 0) {
            memcpy(name, g_nixl.peers[i].name, WSYNC_NIXL_NAME_MAX);
            pthread_mutex_unlock(&g_nixl.lock);
            return WSYNC_OK;
        }
    }
    char *loaded = NULL;
    capi_status_t s = g_nixl.f.load_remote_md(g_nixl.agent, md, len, &loaded);
    if (s == CAPI_OK && loaded != NULL && strlen(loaded) < WSYNC_NIXL_NAME_MAX) {
        snprintf(name, WSYNC_NIXL_NAME_MAX, "%s", loaded);
        nixl_peer_keep(loaded, md, len);
    } else if (s == CAPI_OK) {
        s = -1; /* a name wsync cannot carry in a handle */
    }
    pthread_mutex_unlock(&g_nixl.lock);
    free(loaded);
    if (s != CAPI_OK)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "NIXL refused the peer metadata of %zu bytes (status %d): not an "
                          "agent's metadata, or one whose name exceeds %u bytes",
                          len, s, WSYNC_NIXL_NAME_MAX - 1);
    return WSYNC_OK;
}

/* Metadata of `peer` is loaded, or it is this agent. Caller holds the lock. */
static int nixl_known(const char *peer)
{
    return nixl_peer_find(peer) != NULL || strcmp(peer, g_nixl.self) == 0;
}

int wsync_nixl_knows(const char *peer)
{
    pthread_mutex_lock(&g_nixl.lock);
    const int known = nixl_known(peer);
    pthread_mutex_unlock(&g_nixl.lock);
    return known;
}

/* The two descriptor lists of a transfer. Caller holds the lock. */
static capi_status_t nixl_dlists(const wsync_nixl_span_t *spans, size_t n, int vram,
                                 capi_obj_t *local, capi_obj_t *remote)
{
    capi_status_t s = g_nixl.f.create_xfer_dlist(vram ? CAPI_VRAM : CAPI_DRAM, local);
    if (s == CAPI_OK)
        s = g_nixl.f.create_xfer_dlist(CAPI_DRAM, remote);
    for (size_t i = 0; s == CAPI_OK && i < n; i++) {
        s = g_nixl.f.xfer_dlist_add_desc(*local, (uintptr_t)spans[i].local, spans[i].bytes, 0);
        if (s == CAPI_OK)
            s = g_nixl.f.xfer_dlist_add_desc(*remote, (uintptr_t)spans[i].remote, spans[i].bytes,
                                             0);
    }
    return s;
}

wsync_result_t wsync_nixl_transfer(int write, const char *peer, const wsync_nixl_span_t *spans,
                                   size_t n, int vram, uint32_t timeout_ms, const char *what,
                                   wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_start(err);
    if (r != WSYNC_OK || n == 0)
        return r;
    capi_obj_t local = NULL, remote = NULL, req = NULL;
    const char *step = "describe";
    pthread_mutex_lock(&g_nixl.lock);
    const int known = nixl_known(peer);
    capi_status_t s = nixl_dlists(spans, n, vram, &local, &remote);
    if (s == CAPI_OK) {
        step = "prepare";
        s = g_nixl.f.create_xfer_req(g_nixl.agent, write ? 1 : 0, local, remote, peer, &req, NULL);
    }
    if (s == CAPI_OK) {
        step = "post";
        s = g_nixl.f.post_xfer_req(g_nixl.agent, req, NULL);
    }
    const uint64_t deadline = wsync_now_ms() + (timeout_ms ? timeout_ms : 30000u);
    int timed_out = 0;
    while (s == CAPI_IN_PROG) {
        step = "transfer";
        pthread_mutex_unlock(&g_nixl.lock);
        if (wsync_now_ms() > deadline) {
            pthread_mutex_lock(&g_nixl.lock);
            timed_out = 1;
            break;
        }
        sched_yield();
        pthread_mutex_lock(&g_nixl.lock);
        s = g_nixl.f.get_xfer_status(g_nixl.agent, req);
    }
    /* A request still in flight cannot be released; NIXL keeps it (and its lists) until the
     * agent ends. */
    int released = req == NULL || g_nixl.f.release_xfer_req(g_nixl.agent, req) == CAPI_OK;
    if (req != NULL && released)
        g_nixl.f.destroy_xfer_req(req);
    if (released) {
        if (local != NULL)
            g_nixl.f.destroy_xfer_dlist(local);
        if (remote != NULL)
            g_nixl.f.destroy_xfer_dlist(remote);
    }
    pthread_mutex_unlock(&g_nixl.lock);
    const char *op = write ? "WRITE to" : "READ from";
    if (timed_out)
        return WSYNC_FAIL(err, WSYNC_ERR_TIMEOUT,
                          "NIXL %s peer %s for %s did not end within %u ms (%zu spans); the "
                          "peer may be gone or its link down",
                          op, peer, what, timeout_ms ? timeout_ms : 30000u, n);
    if (s == CAPI_OK)
        return WSYNC_OK;
    return WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                      "NIXL %s peer %s for %s failed (%s, status %d%s): the peer is gone, "
                      "unreachable, or no longer holds that memory; ask its producer for a new "
                      "manifest",
                      op, peer, what, step, s, known ? "" : ", peer unknown to this agent");
}
