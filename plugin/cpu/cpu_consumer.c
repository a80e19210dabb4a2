/* Consumer lifecycle, manifests, streams, host callbacks and memory helpers of the CPU backend. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "wsync_digest.h"
#include "wsync_error.h"
#include "wsync_validate.h"
#include "wsync_manifest.h"

wsync_result_t wsync_cpu_consumer_create(const wsync_consumer_config_t *config,
                                         struct wsync_consumer **out, wsync_error_t *err)
{
    wsync_result_t r;

    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "out is NULL; pass a consumer pointer");
    *out = NULL;
    if (config != NULL && config->struct_size < sizeof(size_t))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "config->struct_size %zu is too small; set it to sizeof(config)",
                          config->struct_size);
    struct wsync_consumer *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a consumer");
    c->timeout_ms = WSYNC_CPU_DEFAULT_TIMEOUT_MS;
    if (WSYNC_HAS_FIELD(wsync_consumer_config_t, config, timeout_ms) && config->timeout_ms != 0)
        c->timeout_ms = config->timeout_ms;
    pthread_mutex_init(&c->lock, NULL);
    c->cache = wsync_cache_create(wsync_cpu_handle_map, wsync_cpu_handle_unmap, c);
    if (c->cache == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the mapping cache");
        goto fail;
    }
    c->manifests = wsync_manifest_cache_for(config);
    if (c->manifests == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the manifest parse cache");
        goto fail;
    }
    if ((r = wsync_cpu_stream_create(&c->default_stream, err)) != WSYNC_OK)
        goto fail;
    *out = c;
    return WSYNC_OK;
fail:
    if (c->cache != NULL)
        wsync_cache_destroy(c->cache);
    wsync_manifest_cache_destroy(c->manifests);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return r;
}

wsync_result_t wsync_cpu_consumer_finalize(struct wsync_consumer *c, wsync_error_t *err)
{
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "consumer is NULL");
    /* Nothing may still read a mapping when the cache unmaps it. */
    wsync_cpu_stream_synchronize(c->default_stream);
    for (size_t i = 0; i < c->n_streams; i++)
        wsync_cpu_stream_synchronize(c->streams[i]);
    wsync_cache_destroy(c->cache);
    for (size_t i = 0; i < c->n_streams; i++)
        wsync_cpu_stream_destroy(c->streams[i]);
    wsync_cpu_stream_destroy(c->default_stream);
    free(c->streams);
    wsync_manifest_cache_destroy(c->manifests);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_parse_manifest(struct wsync_consumer *c, const char *json, size_t len,
                                        const wsync_manifest_t **out, wsync_error_t *err)
{
    wsync_manifest_owned_t *m = NULL;

    if (json == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "json and out must not be NULL");
    *out = NULL;
    wsync_result_t r = wsync_manifest_parse_cached(c ? c->manifests : NULL, json, len, &m, err);
    if (r != WSYNC_OK)
        return r;
    *out = &m->view;
    return WSYNC_OK;
}

void wsync_cpu_manifest_free(struct wsync_consumer *c, const wsync_manifest_t *m)
{
    (void)c;
    if (m != NULL)
        wsync_manifest_free(wsync_manifest_owned_from_view(m));
}

wsync_result_t wsync_cpu_enqueue_host_fn(struct wsync_consumer *c, wsync_stream_t stream,
                                         wsync_host_fn_t fn, void *user, wsync_error_t *err)
{
    if (c == NULL || fn == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "consumer and fn must not be NULL");
    return wsync_cpu_stream_host_fn(wsync_cpu_consumer_stream(c, stream), fn, user, NULL, err);
}

/* ---------------------------------------------------------------- streams */

wsync_result_t wsync_cpu_consumer_stream_create(struct wsync_consumer *c, wsync_stream_t *out,
                                                wsync_error_t *err)
{
    wsync_cpu_stream_t *s;

    if (c == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "consumer and out must not be NULL");
    wsync_result_t r = wsync_cpu_stream_create(&s, err);
    if (r != WSYNC_OK)
        return r;
    pthread_mutex_lock(&c->lock);
    if (c->n_streams == c->cap_streams) {
        size_t cap = c->cap_streams ? 2 * c->cap_streams : 4;
        void *p = realloc(c->streams, cap * sizeof(*c->streams));
        if (p == NULL) {
            pthread_mutex_unlock(&c->lock);
            wsync_cpu_stream_destroy(s);
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to track %zu streams", cap);
        }
        c->streams = p;
        c->cap_streams = cap;
    }
    c->streams[c->n_streams++] = s;
    pthread_mutex_unlock(&c->lock);
    *out = s;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_consumer_stream_destroy(struct wsync_consumer *c, wsync_stream_t st,
                                                 wsync_error_t *err)
{
    wsync_cpu_stream_t *s = st;
    size_t i;

    if (c == NULL || s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "consumer and stream must not be NULL (the default stream lives until "
                          "finalize)");
    pthread_mutex_lock(&c->lock);
    for (i = 0; i < c->n_streams && c->streams[i] != s; i++)
        ;
    if (i == c->n_streams) {
        pthread_mutex_unlock(&c->lock);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "stream %p was not created by this consumer's stream_create", st);
    }
    c->streams[i] = c->streams[--c->n_streams];
    pthread_mutex_unlock(&c->lock);
    /* Drain before the handles forget it, so a later close never misses copies in flight. */
    wsync_cpu_stream_synchronize(s);
    wsync_cpu_handles_forget_stream(c, s);
    wsync_cpu_stream_destroy(s);
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_consumer_stream_synchronize(struct wsync_consumer *c, wsync_stream_t s,
                                                     wsync_error_t *err)
{
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "consumer is NULL");
    wsync_cpu_stream_synchronize(wsync_cpu_consumer_stream(c, s));
    return WSYNC_OK;
}

/* ---------------------------------------------------------------- memory */

wsync_result_t wsync_cpu_mem_alloc(struct wsync_consumer *c, size_t bytes, void **out,
                                   wsync_error_t *err)
{
    void *p = NULL;

    (void)c;
    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int rc = posix_memalign(&p, WSYNC_CPU_MEM_ALIGN, bytes ? bytes : 1);
    if (rc != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes: %s", bytes,
                          strerror(rc));
    *out = p;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_mem_free(struct wsync_consumer *c, void *p, wsync_error_t *err)
{
    (void)c;
    (void)err;
    free(p);
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_digest_regions(struct wsync_consumer *c, wsync_stream_t stream,
                                        const wsync_copy_op_t *regions, size_t n, uint64_t *out,
                                        wsync_error_t *err)
{
    wsync_result_t vr = wsync_validate_regions(c, regions, n, out, err);
    if (vr != WSYNC_OK)
        return vr;
    /* the caller's CPU work is done when it calls; copies queued on the stream are not */
    wsync_cpu_stream_synchronize(wsync_cpu_consumer_stream(c, stream));
    for (size_t i = 0; i < n; i++) {
        wsync64_state_t st;
        wsync64_init(&st);
        for (uint64_t r = 0; r < regions[i].rows && regions[i].row_bytes > 0; r++)
            wsync64_update(&st, (const uint8_t *)regions[i].dst + r * regions[i].dst_pitch,
                           (size_t)regions[i].row_bytes);
        out[i] = wsync64_final(&st);
    }
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_mem_copy(struct wsync_consumer *c, void *dst, const void *src,
                                  size_t bytes, int kind, wsync_error_t *err)
{
    (void)c;
    if (kind != 0 && kind != 1)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "mem_copy kind %d; use 0 (host to plugin) or 1 (plugin to host)", kind);
    if (bytes != 0 && (dst == NULL || src == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "mem_copy of %zu bytes with a NULL pointer", bytes);
    if (bytes != 0)
        memmove(dst, src, bytes);
    return WSYNC_OK;
}
