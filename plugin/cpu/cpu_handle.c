/* Opening and closing producer buffers: the host_shm mapping behind a cache entry, the mapped
 * count in the control block (the retire handshake), and draining streams before an unmap. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "cpu_nixl.h"
#include "wsync_error.h"

/* The shm name in a desc: handle bytes, no NUL inside, shorter than WSYNC_SHM_NAME_MAX. */
static wsync_result_t wsync_cpu_desc_name(const wsync_buffer_desc_t *d, char *name,
                                          wsync_error_t *err)
{
    if (d->kind != WSYNC_BUFFER_HOST_SHM)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "buffer kind %d is not host_shm; the CPU plugin maps only POSIX "
                          "shared memory (load libwsync_cuda.so for cuda_ipc)",
                          (int)d->kind);
    if (d->handle_len == 0 || d->handle_len >= WSYNC_SHM_NAME_MAX ||
        memchr(d->handle, '\0', d->handle_len) != NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "host_shm handle of %u bytes is not a shared memory name (1..%d bytes, "
                          "no NUL)",
                          d->handle_len, WSYNC_SHM_NAME_MAX - 1);
    memcpy(name, d->handle, d->handle_len);
    name[d->handle_len] = '\0';
    if (d->control[0] != '\0' && strncmp(d->control, name, WSYNC_HANDLE_MAX) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "host_shm buffer %s names control segment \"%.64s\"; for host_shm the "
                          "control block is the head of the buffer's own segment",
                          name, d->control);
    return WSYNC_OK;
}

/* Check the mapped control block against the desc. */
static wsync_result_t wsync_cpu_check_mapping(const wsync_buffer_desc_t *d, const wsync_shm_t *shm,
                                              const wsync_control_t *ctl, wsync_error_t *err)
{
    wsync_result_t r = wsync_control_check(ctl, err);
    uint64_t end;

    if (r != WSYNC_OK)
        return r;
    if (ctl->data_offset < WSYNC_CONTROL_SIZE ||
        __builtin_add_overflow(ctl->data_offset, ctl->data_bytes, &end) || end > shm->size)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "segment %s: control says data at %llu + %llu bytes, segment is %zu "
                          "bytes; the segment is corrupt",
                          shm->name, (unsigned long long)ctl->data_offset,
                          (unsigned long long)ctl->data_bytes, shm->size);
    if (__builtin_add_overflow(d->base_offset, d->bytes, &end) || end > ctl->data_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "manifest buffer base_offset %llu + bytes %llu exceeds the %llu data "
                          "bytes of segment %s",
                          (unsigned long long)d->base_offset, (unsigned long long)d->bytes,
                          (unsigned long long)ctl->data_bytes, shm->name);
    if (d->pid != ctl->producer_pid) /* pid 0 too: the check is never off */
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "manifest says producer pid %lld, segment %s was created by pid %lld",
                          (long long)d->pid, shm->name, (long long)ctl->producer_pid);
    if (atomic_load(&ctl->retired))
        return WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                          "segment %s was retired by its producer; ask for a new manifest",
                          shm->name);
    return WSYNC_OK;
}

void wsync_cpu_handle_register(struct wsync_consumer *c, struct wsync_handle *h)
{
    pthread_mutex_init(&h->lock, NULL);
    wsync_cpu_sink_init(&h->sink);
    pthread_mutex_lock(&c->lock);
    h->next = c->handles;
    c->handles = h;
    pthread_mutex_unlock(&c->lock);
}

/* A host_pid segment of a direct manifest: nothing to map; copies read it by address. */
static wsync_result_t wsync_cpu_segment_map(struct wsync_consumer *c,
                                            const wsync_buffer_desc_t *desc, void **mapping,
                                            wsync_error_t *err)
{
    if (desc->handle_len != 8 || desc->pid <= 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "host_pid segment: handle of %u bytes (want 8), pid %lld",
                          desc->handle_len, (long long)desc->pid);
    struct wsync_handle *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a handle");
    for (int k = 0; k < 8; k++)
        h->remote |= (uint64_t)desc->handle[k] << (8 * k);
    h->consumer = c;
    h->bytes = desc->bytes;
    h->peer_pid = desc->pid;
    h->is_segment = 1;
    wsync_cpu_handle_register(c, h);
    *mapping = h;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_handle_map(void *user, const wsync_buffer_desc_t *desc, void **mapping,
                                    wsync_error_t *err)
{
    struct wsync_consumer *c = user;
    char name[WSYNC_SHM_NAME_MAX];
    wsync_result_t r;

    if (desc->kind == WSYNC_BUFFER_HOST_PID)
        return wsync_cpu_segment_map(c, desc, mapping, err);
    if (desc->kind == WSYNC_BUFFER_NIXL)
        return wsync_cpu_nixl_map(c, desc, mapping, err);
    if ((r = wsync_cpu_desc_name(desc, name, err)) != WSYNC_OK)
        return r;
    struct wsync_handle *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a handle");
    if ((r = wsync_shm_open(&h->shm, name, WSYNC_CONTROL_SIZE, err)) != WSYNC_OK)
        goto fail;
    h->control = h->shm.addr;
    if ((r = wsync_cpu_check_mapping(desc, &h->shm, h->control, err)) != WSYNC_OK)
        goto fail;
    h->consumer = c;
    h->data = (uint8_t *)h->shm.addr + h->control->data_offset + desc->base_offset;
    h->bytes = desc->bytes;
    h->peer_pid = h->control->producer_pid;
    if ((r = wsync_control_attach(h->control, err)) != WSYNC_OK)
        goto fail;
    wsync_cpu_handle_register(c, h);
    *mapping = h;
    return WSYNC_OK;
fail:
    wsync_shm_close(&h->shm);
    free(h);
    return r;
}

void wsync_cpu_handle_unmap(void *user, void *mapping)
{
    struct wsync_consumer *c = user;
    struct wsync_handle *h = mapping;

    pthread_mutex_lock(&c->lock);
    for (struct wsync_handle **pp = &c->handles; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (h->nixl != NULL) {
        wsync_cpu_nixl_unmap(h);
    } else if (!h->is_segment) {
        wsync_control_detach(h->control);
        wsync_shm_close(&h->shm);
    }
    wsync_cpu_sink_destroy(&h->sink);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

wsync_result_t wsync_cpu_open_handle(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                     struct wsync_handle **out, wsync_error_t *err)
{
    wsync_cache_entry_t *e = NULL;

    if (c == NULL || desc == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "consumer, desc and out must not be NULL");
    *out = NULL;
    wsync_result_t r = wsync_cache_acquire(c->cache, desc, &e, NULL, err);
    if (r != WSYNC_OK)
        return r;
    struct wsync_handle *h = e->mapping;
    pthread_mutex_lock(&h->lock);
    h->entry = e;
    pthread_mutex_unlock(&h->lock);
    *out = h;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_close_handle(struct wsync_consumer *c, struct wsync_handle *h,
                                      wsync_error_t *err)
{
    if (c == NULL || h == NULL || h->consumer != c)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "handle %p is not an open handle of consumer %p", (void *)h, (void *)c);
    /* No copy may read the mapping after the unmap: wait for every stream that carried one. */
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < h->carriers.n; i++)
        wsync_cpu_stream_wait(h->carriers.at[i].stream, h->carriers.at[i].mark);
    wsync_cache_entry_t *e = h->entry;
    pthread_mutex_unlock(&h->lock);
    wsync_cache_release(c->cache, e);
    return WSYNC_OK;
}

void wsync_cpu_handles_forget_stream(struct wsync_consumer *c, wsync_cpu_stream_t *s)
{
    pthread_mutex_lock(&c->lock);
    for (struct wsync_handle *h = c->handles; h != NULL; h = h->next) {
        pthread_mutex_lock(&h->lock);
        (void)wsync_carriers_forget(&h->carriers, s);
        pthread_mutex_unlock(&h->lock);
    }
    pthread_mutex_unlock(&c->lock);
}
