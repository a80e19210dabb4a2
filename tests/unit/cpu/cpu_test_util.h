/* Helpers shared by the CPU backend's tests: loading a plugin build from WSYNC_TEST_PLUGIN_DIR,
 * framed messages over a socket (the "RPC" that carries manifests and acks), and the expected
 * byte patterns of a generation. Header-only: each test is one executable. */
#ifndef WSYNC_CPU_TEST_UTIL_H
#define WSYNC_CPU_TEST_UTIL_H

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_abi.h"

#define WSYNC_TEST_HOST_LIB "libwsync_cpu.so"
#define WSYNC_TEST_BROKEN_LIB "libwsync_cpu_broken.so"

typedef struct wsync_test_plugin {
    void *dl;
    const wsync_plugin_t *plugin;
    const wsync_consumer_ops_t *c;
    const wsync_producer_ops_t *p;
} wsync_test_plugin_t;

/* Load WSYNC_TEST_PLUGIN_DIR/<lib> and negotiate ABI v1. Returns 0 on success. */
static inline int wsync_test_load(wsync_test_plugin_t *t, const char *lib)
{
    char path[4096];
    uint32_t v = WSYNC_ABI_VERSION;
    wsync_error_t err = {.struct_size = sizeof(err)};

    memset(t, 0, sizeof(*t));
    snprintf(path, sizeof(path), "%s/%s", WSYNC_TEST_PLUGIN_DIR, lib);
    t->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (t->dl == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    wsync_plugin_init_fn_t init = (wsync_plugin_init_fn_t)dlsym(t->dl, WSYNC_PLUGIN_INIT_SYMBOL);
    if (init == NULL || init(&v, NULL, &t->plugin, &err) != WSYNC_OK || v != 1) {
        fprintf(stderr, "init of %s failed: %s\n", path, err.message);
        return -1;
    }
    t->c = t->plugin->consumer;
    t->p = t->plugin->producer;
    return 0;
}

static inline void wsync_test_unload(wsync_test_plugin_t *t)
{
    if (t->dl != NULL)
        dlclose(t->dl);
    memset(t, 0, sizeof(*t));
}

/* Framed message: 8-byte length, then the bytes. Returns 0 on success. */
static inline int wsync_test_write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static inline int wsync_test_read_all(int fd, void *p, size_t n)
{
    char *b = p;
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static inline int wsync_test_send(int fd, const void *p, uint64_t n)
{
    if (wsync_test_write_all(fd, &n, sizeof(n)) != 0)
        return -1;
    return n ? wsync_test_write_all(fd, p, (size_t)n) : 0;
}

/* *out is malloc'd and NUL-terminated (caller frees). */
static inline int wsync_test_recv(int fd, char **out, uint64_t *n)
{
    if (wsync_test_read_all(fd, n, sizeof(*n)) != 0 || *n > (1u << 30))
        return -1;
    *out = malloc((size_t)*n + 1);
    if (*out == NULL)
        return -1;
    if (*n && wsync_test_read_all(fd, *out, (size_t)*n) != 0) {
        free(*out);
        *out = NULL;
        return -1;
    }
    (*out)[*n] = '\0';
    return 0;
}

/* The 8-byte word `i` of tensor `t` in generation `g`. */
static inline uint64_t wsync_test_word(uint64_t g, uint64_t t, uint64_t i)
{
    return (g << 40) ^ (t << 24) ^ (i * 0x9E3779B1u);
}

static inline void wsync_test_fill(void *p, size_t nbytes, uint64_t g, uint64_t t)
{
    uint64_t *w = p;
    for (size_t i = 0; i < nbytes / 8; i++)
        w[i] = wsync_test_word(g, t, i);
}

/* Number of words that differ from the pattern (0 = intact). */
static inline size_t wsync_test_check(const void *p, size_t nbytes, uint64_t g, uint64_t t)
{
    const uint64_t *w = p;
    size_t bad = 0;
    for (size_t i = 0; i < nbytes / 8; i++)
        bad += w[i] != wsync_test_word(g, t, i);
    return bad;
}

/* One 1-D op per manifest tensor, destinations dst[i] of the tensor's size. */
static inline void wsync_test_ops(const wsync_manifest_t *m, void *const *dst, wsync_copy_op_t *ops)
{
    for (size_t i = 0; i < m->n_tensors; i++) {
        const wsync_tensor_desc_t *t = &m->tensors[i];
        ops[i] = (wsync_copy_op_t){.src_offset = t->offset,
                                   .src_pitch = t->nbytes,
                                   .dst = dst[i],
                                   .dst_pitch = t->nbytes,
                                   .dst_extent = t->nbytes,
                                   .rows = 1,
                                   .row_bytes = t->nbytes,
                                   .digest = t->digest,
                                   .has_digest = t->has_digest};
    }
}

#endif
