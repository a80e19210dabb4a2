/* Producer side of the CPU backend: one POSIX shared memory segment per staging buffer
 * (control block, then the data region), filled in stream order, published with a manifest,
 * retired only once no consumer holds a mapping. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_direct.h"
#include "cpu_internal.h"
#include "cpu_unlink.h"
#include "wsync_direct.h"
#include "wsync_error.h"
#include "wsync_host_ranges.h"
#include "wsync_layout.h"
#include "wsync_manifest.h"
#include "wsync_nixl_buffer.h"

struct wsync_staging {
    pthread_mutex_t lock; /* serialises the members; the ABI calls them from one thread */
    wsync_shm_t shm;
    wsync_control_t *control;
    uint8_t *data;
    uint64_t capacity;
    uint32_t flags;
    uint32_t timeout_ms;
    wsync_layout_t layout; /* the current bucket; digests filled by its stage task */
    int has_layout;
    wsync_cpu_stream_t *stage_stream; /* where the current bucket's stage task runs */
    uint64_t stage_seq;
    uint64_t generation; /* last published */
    char *manifest;
    wsync_cpu_stream_t *default_stream;
    wsync_cpu_stream_t **streams;
    size_t n_streams, cap_streams;
    wsync_cpu_unlink_t unlink_node;
    wsync_direct_set_t direct;     /* WSYNC_STAGING_DIRECT: the buckets named in place */
    wsync_nixl_export_t nixl;      /* WSYNC_STAGING_NIXL: the segment as its consumers read it */
    wsync_nixl_ranges_t nixl_segs; /* ... and with DIRECT, the memory its buckets name */
};

/* A direct staging's segment holds only its control block and these few bytes: no tensor fits,
 * so a consumer that ignored the manifest's segments would be refused, not fed wrong bytes. */
#define WSYNC_CPU_DIRECT_BYTES 64u

static wsync_cpu_stream_t *wsync_cpu_staging_stream(struct wsync_staging *s, wsync_stream_t st)
{
    return st != NULL ? (wsync_cpu_stream_t *)st : s->default_stream;
}

wsync_result_t wsync_cpu_staging_create(const wsync_staging_config_t *config,
                                        struct wsync_staging **out, wsync_error_t *err)
{
    wsync_result_t r;
    size_t size;

    if (out == NULL || config == NULL || !WSYNC_HAS_FIELD(wsync_staging_config_t, config, bytes))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "config and out must not be NULL and config->struct_size must cover "
                          "bytes");
    *out = NULL;
    uint32_t flags = WSYNC_HAS_FIELD(wsync_staging_config_t, config, flags) ? config->flags : 0;
    const uint32_t known = WSYNC_STAGING_FIXED_LAYOUT | WSYNC_STAGING_NO_DIGESTS |
                           WSYNC_STAGING_DIRECT | WSYNC_STAGING_NIXL;
    if ((flags & ~known) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "unknown staging flags 0x%x; only WSYNC_STAGING_FIXED_LAYOUT (0x1), "
                          "WSYNC_STAGING_NO_DIGESTS (0x2), WSYNC_STAGING_DIRECT (0x4) and "
                          "WSYNC_STAGING_NIXL (0x8) are defined",
                          flags & ~known);
    const uint64_t bytes = (flags & WSYNC_STAGING_DIRECT) ? WSYNC_CPU_DIRECT_BYTES : config->bytes;
    if (flags & WSYNC_STAGING_DIRECT)
        wsync_direct_allow_readers();
    if (bytes == 0 || bytes > SIZE_MAX - WSYNC_CONTROL_SIZE)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "staging bytes %llu; ask for 1..%zu bytes",
                          (unsigned long long)config->bytes, SIZE_MAX - WSYNC_CONTROL_SIZE);
    size = WSYNC_CONTROL_SIZE + (size_t)bytes;

    struct wsync_staging *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a staging buffer");
    pthread_mutex_init(&s->lock, NULL);
    s->capacity = bytes;
    s->flags = flags;
    s->timeout_ms =
        WSYNC_HAS_FIELD(wsync_staging_config_t, config, timeout_ms) && config->timeout_ms != 0
            ? config->timeout_ms
            : WSYNC_CPU_DEFAULT_TIMEOUT_MS;
    if ((r = wsync_cpu_stream_create(&s->default_stream, err)) != WSYNC_OK)
        goto fail;
    if ((r = wsync_shm_create(&s->shm, "staging", size, err)) != WSYNC_OK)
        goto fail;
    s->control = s->shm.addr;
    s->data = (uint8_t *)s->shm.addr + WSYNC_CONTROL_SIZE;
    wsync_control_init(s->control, WSYNC_CONTROL_SIZE, s->capacity);
    if ((flags & WSYNC_STAGING_NIXL) &&
        (r = wsync_nixl_export(s->shm.addr, size, WSYNC_CONTROL_SIZE, &s->nixl, err)) != WSYNC_OK) {
        wsync_shm_unlink(&s->shm);
        wsync_shm_close(&s->shm);
        goto fail;
    }
    wsync_cpu_unlink_register(&s->unlink_node, s->shm.name);
    *out = s;
    return WSYNC_OK;
fail:
    wsync_cpu_stream_destroy(s->default_stream);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return r;
}

/* The exporter-storage rule (docs/DESIGN.md §1.2): the last published generation may still be
 * read until its *consumed* fires. Caller holds s->lock. */
static wsync_result_t wsync_cpu_check_consumed(struct wsync_staging *s, wsync_error_t *err)
{
    uint64_t consumed = atomic_load(&s->control->consumed_generation);
    if (consumed < s->generation)
        return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                          "generation %llu of %s published but not yet consumed (consumed %llu); "
                          "call wait_consumed after the consumer's ack before staging again",
                          (unsigned long long)s->generation, s->shm.name,
                          (unsigned long long)consumed);
    return WSYNC_OK;
}

/* Direct mode: name the tensors where they are (the caller's CPU work is done when it calls). */
static wsync_result_t wsync_cpu_stage_direct(struct wsync_staging *s,
                                             const wsync_stage_tensor_t *tensors, size_t n,
                                             wsync_error_t *err)
{
    /* No storage of ours is reused, so no consumed to wait for: several buckets of one sync may
     * be in flight (the caller waits before it writes the tensors). */
    pthread_mutex_lock(&s->lock);
    wsync_result_t r = wsync_cpu_direct_stage(
        tensors, n, &s->direct, (s->flags & WSYNC_STAGING_NIXL) ? &s->nixl_segs : NULL, err);
    pthread_mutex_unlock(&s->lock);
    return r;
}

wsync_result_t wsync_cpu_stage(struct wsync_staging *s, wsync_stream_t stream,
                               const wsync_stage_tensor_t *tensors, size_t n, wsync_error_t *err)
{
    wsync_layout_t next;
    wsync_cpu_stage_copy_t *copies;
    wsync_result_t r;

    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "staging is NULL");
    if ((r = wsync_stage_sizes_check(tensors, n, err)) != WSYNC_OK)
        return r;
    if (s->flags & WSYNC_STAGING_DIRECT)
        return wsync_cpu_stage_direct(s, tensors, n, err);
    if ((r = wsync_layout_build(tensors, n, s->capacity, &next, err)) != WSYNC_OK)
        return r;
    pthread_mutex_lock(&s->lock);
    /* Reused storage may still be read by the consumer of the last published generation. */
    if ((r = wsync_cpu_check_consumed(s, err)) != WSYNC_OK)
        goto fail;
    if ((s->flags & WSYNC_STAGING_FIXED_LAYOUT) && s->has_layout &&
        (r = wsync_layout_compare(&s->layout, &next, err)) != WSYNC_OK)
        goto fail;
    copies = malloc((n ? n : 1) * sizeof(*copies));
    if (copies == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to stage %zu tensors", n);
        goto fail;
    }
    /* The previous bucket's stage task writes into the old layout: let it finish first. */
    if (s->has_layout) {
        wsync_cpu_stream_wait(s->stage_stream, s->stage_seq);
        wsync_layout_free(&s->layout);
    }
    s->layout = next;
    s->has_layout = 1;
    const int digests = (s->flags & WSYNC_STAGING_NO_DIGESTS) == 0;
    for (size_t i = 0; i < n; i++) {
        copies[i] = (wsync_cpu_stage_copy_t){
            .src = tensors[next.from[i]].src,
            .dst = s->data + next.tensors[i].offset,
            .nbytes = next.tensors[i].nbytes,
            .src_dtype = wsync_stage_src_dtype(&tensors[next.from[i]]),
            .dst_dtype = next.tensors[i].dtype,
            .digest = digests ? &s->layout.tensors[i].digest : NULL,
            .has_digest = digests ? &s->layout.tensors[i].has_digest : NULL};
    }
    s->stage_stream = wsync_cpu_staging_stream(s, stream);
    r = wsync_cpu_stream_stage(s->stage_stream, copies, n, &s->stage_seq, err);
    free(copies);
    if (r != WSYNC_OK) {
        wsync_layout_free(&s->layout);
        s->has_layout = 0;
    }
    pthread_mutex_unlock(&s->lock);
    return r;
fail:
    pthread_mutex_unlock(&s->lock);
    wsync_layout_free(&next);
    return r;
}

wsync_result_t wsync_cpu_publish(struct wsync_staging *s, wsync_stream_t stream, int finished,
                                 const char **manifest_json, uint64_t *generation,
                                 wsync_error_t *err)
{
    char *json = NULL;
    wsync_result_t r;

    if (s == NULL || manifest_json == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "staging and manifest_json must not be NULL");
    pthread_mutex_lock(&s->lock);
    if (!s->has_layout && !s->direct.have) {
        pthread_mutex_unlock(&s->lock);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nothing staged in %s; call stage before publish", s->shm.name);
    }
    /* The manifest carries the digests the stage task computes. */
    if (s->has_layout)
        wsync_cpu_stream_wait(s->stage_stream, s->stage_seq);
    uint64_t g = s->generation + 1;
    wsync_manifest_t m = {.struct_size = sizeof(m),
                          .schema = WSYNC_MANIFEST_SCHEMA,
                          .generation = g,
                          .finished = finished != 0,
                          .n_tensors = s->layout.n,
                          .tensors = s->layout.tensors};
    wsync_buffer_desc_t *b = &m.buffer;
    b->struct_size = sizeof(*b);
    b->kind = WSYNC_BUFFER_HOST_SHM;
    b->handle_len = (uint32_t)strlen(s->shm.name);
    memcpy(b->handle, s->shm.name, b->handle_len);
    b->bytes = s->capacity;
    b->base_offset = 0;
    b->pid = (int64_t)getpid();
    memcpy(b->device, "cpu", 4);
    memcpy(b->control, s->shm.name, b->handle_len + 1);
    if (s->flags & WSYNC_STAGING_NIXL)
        wsync_nixl_export_desc(&s->nixl, b);
    r = s->direct.have
            ? wsync_direct_emit(wsync_direct_current(&s->direct), b, g, finished, &json, err)
            : wsync_manifest_emit(&m, &json, err);
    if (r != WSYNC_OK)
        goto out;
    r = wsync_cpu_stream_signal_ready(wsync_cpu_staging_stream(s, stream), s->control, g, NULL,
                                      err);
    if (r != WSYNC_OK) {
        free(json);
        goto out;
    }
    wsync_control_publish(s->control, g);
    free(s->manifest);
    s->manifest = json;
    s->generation = g;
    *manifest_json = json;
    if (generation != NULL)
        *generation = g;
out:
    pthread_mutex_unlock(&s->lock);
    return r;
}

wsync_result_t wsync_cpu_wait_consumed(struct wsync_staging *s, wsync_stream_t stream,
                                       uint64_t generation, wsync_error_t *err)
{
    (void)stream; /* host: the calling thread blocks */
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "staging is NULL");
    pthread_mutex_lock(&s->lock);
    uint64_t last = s->generation;
    pthread_mutex_unlock(&s->lock);
    if (generation == 0 || generation > last)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "generation %llu of %s was never published (last published %llu)",
                          (unsigned long long)generation, s->shm.name, (unsigned long long)last);
    /* TIMEOUT or PEER_GONE leave the staging untouched: a restarted consumer can continue. */
    return wsync_control_wait_consumed(s->control, generation, s->timeout_ms,
                                       atomic_load(&s->control->consumer_pid), err);
}

wsync_result_t wsync_cpu_retire(struct wsync_staging *s, wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "staging is NULL");
    wsync_result_t rc = wsync_control_retire(s->control, s->shm.name, err);
    if (rc != WSYNC_OK)
        return rc;
    for (size_t i = 0; i < s->n_streams; i++)
        wsync_cpu_stream_destroy(s->streams[i]);
    wsync_cpu_stream_destroy(s->default_stream);
    if (s->flags & WSYNC_STAGING_NIXL) { /* a late pull finds the retired mark, or nothing */
        wsync_nixl_export_end(&s->nixl);
        wsync_nixl_ranges_end(&s->nixl_segs);
    }
    wsync_cpu_unlink_unregister(&s->unlink_node);
    wsync_shm_unlink(&s->shm);
    wsync_shm_close(&s->shm);
    if (s->has_layout)
        wsync_layout_free(&s->layout);
    wsync_direct_set_free(&s->direct);
    free(s->manifest);
    free(s->streams);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_staging_stream_create(struct wsync_staging *s, wsync_stream_t *out,
                                               wsync_error_t *err)
{
    wsync_cpu_stream_t *st;

    if (s == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "staging and out must not be NULL");
    wsync_result_t r = wsync_cpu_stream_create(&st, err);
    if (r != WSYNC_OK)
        return r;
    pthread_mutex_lock(&s->lock);
    if (s->n_streams == s->cap_streams) {
        size_t cap = s->cap_streams ? 2 * s->cap_streams : 4;
        void *p = realloc(s->streams, cap * sizeof(*s->streams));
        if (p == NULL) {
            pthread_mutex_unlock(&s->lock);
            wsync_cpu_stream_destroy(st);
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to track %zu streams", cap);
        }
        s->streams = p;
        s->cap_streams = cap;
    }
    s->streams[s->n_streams++] = st;
    pthread_mutex_unlock(&s->lock);
    *out = st;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_staging_stream_destroy(struct wsync_staging *s, wsync_stream_t st,
                                                wsync_error_t *err)
{
    size_t i;

    if (s == NULL || st == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "staging and stream must not be NULL (the default stream lives until "
                          "retire)");
    pthread_mutex_lock(&s->lock);
    for (i = 0; i < s->n_streams && s->streams[i] != st; i++)
        ;
    if (i == s->n_streams) {
        pthread_mutex_unlock(&s->lock);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "stream %p was not created by this staging's stream_create", st);
    }
    s->streams[i] = s->streams[--s->n_streams];
    if (s->stage_stream == st) {
        wsync_cpu_stream_wait(s->stage_stream, s->stage_seq);
        s->stage_stream = s->default_stream;
        s->stage_seq = 0;
    }
    pthread_mutex_unlock(&s->lock);
    wsync_cpu_stream_destroy(st);
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_staging_stream_synchronize(struct wsync_staging *s, wsync_stream_t st,
                                                    wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "staging is NULL");
    wsync_cpu_stream_synchronize(wsync_cpu_staging_stream(s, st));
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_read_back(struct wsync_staging *s, uint64_t offset, void *dst,
                                   size_t bytes, wsync_error_t *err)
{
    uint64_t end;

    if (s == NULL || (bytes != 0 && dst == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "staging and dst must not be NULL");
    if (__builtin_add_overflow(offset, (uint64_t)bytes, &end) || end > s->capacity)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "read_back of %zu bytes at offset %llu exceeds staging %s of %llu bytes",
                          bytes, (unsigned long long)offset, s->shm.name,
                          (unsigned long long)s->capacity);
    pthread_mutex_lock(&s->lock);
    if (s->has_layout)
        wsync_cpu_stream_wait(s->stage_stream, s->stage_seq);
    if (bytes != 0)
        memcpy(dst, s->data + offset, bytes);
    pthread_mutex_unlock(&s->lock);
    return WSYNC_OK;
}

/* Host memory is this plugin's memory: a registered range is only remembered, so the CPU and CUDA
 * plugins refuse the same overlapping or unknown ranges. */
wsync_result_t wsync_cpu_register_host(struct wsync_staging *s, const void *ptr, uint64_t bytes,
                                       wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "register_host: staging is NULL");
    wsync_result_t r = wsync_host_ranges_check(ptr, bytes, err);
    if (r != WSYNC_OK)
        return r;
    const wsync_host_range_t range = {.host = (uintptr_t)ptr, .bytes = bytes};
    return wsync_host_ranges_add(&range, err);
}

wsync_result_t wsync_cpu_unregister_host(struct wsync_staging *s, const void *ptr,
                                         wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "unregister_host: staging is NULL");
    return wsync_host_ranges_remove(ptr, err);
}
