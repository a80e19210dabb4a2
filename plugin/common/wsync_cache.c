/* Consumer-side mapping cache: a mutex-protected singly-linked list. A consumer holds a handful
 * of staging buffers, so a list is enough; lookups compare the full key. */
#include "wsync_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

struct wsync_cache {
    pthread_mutex_t lock;
    wsync_cache_entry_t *head;
    size_t size;
    uint64_t maps;
    wsync_cache_map_fn map;
    wsync_cache_unmap_fn unmap;
    void *user;
};

int wsync_cache_key_equal(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return a->kind == b->kind && a->handle_len == b->handle_len && a->pid == b->pid &&
           a->handle_len <= WSYNC_HANDLE_MAX && memcmp(a->handle, b->handle, a->handle_len) == 0 &&
           strncmp(a->device, b->device, WSYNC_DEVICE_MAX) == 0 &&
           /* a host_pid segment is a range of the producer's memory, which can grow in place */
           (a->kind != WSYNC_BUFFER_HOST_PID || a->bytes == b->bytes);
}

wsync_cache_t *wsync_cache_create(wsync_cache_map_fn map, wsync_cache_unmap_fn unmap, void *user)
{
    if (map == NULL || unmap == NULL)
        return NULL;
    wsync_cache_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return NULL;
    }
    c->map = map;
    c->unmap = unmap;
    c->user = user;
    return c;
}

wsync_result_t wsync_cache_acquire(wsync_cache_t *c, const wsync_buffer_desc_t *desc,
                                   wsync_cache_entry_t **out, int *hit, wsync_error_t *err)
{
    wsync_result_t r = WSYNC_OK;

    if (c == NULL || desc == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "cache, desc and out must not be NULL");
    if (desc->handle_len > WSYNC_HANDLE_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "handle_len %u exceeds %d bytes",
                          desc->handle_len, WSYNC_HANDLE_MAX);
    *out = NULL;
    if (hit)
        *hit = 0;

    pthread_mutex_lock(&c->lock);
    for (wsync_cache_entry_t *e = c->head; e != NULL; e = e->next) {
        if (wsync_cache_key_equal(&e->key, desc)) {
            e->refs++;
            e->opens++;
            *out = e;
            if (hit)
                *hit = 1;
            goto out;
        }
    }

    wsync_cache_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate a cache entry");
        goto out;
    }
    e->key = *desc;
    c->maps++;
    r = c->map(c->user, desc, &e->mapping, err);
    if (r != WSYNC_OK) {
        free(e);
        goto out;
    }
    e->refs = 1;
    e->opens = 1;
    e->next = c->head;
    c->head = e;
    c->size++;
    *out = e;
out:
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* unmap runs under the lock, so a concurrent acquire of the same key cannot map the buffer a
 * second time while the old mapping is still being torn down. */
unsigned wsync_cache_release(wsync_cache_t *c, wsync_cache_entry_t *e)
{
    unsigned left;

    if (c == NULL || e == NULL)
        return 0;
    pthread_mutex_lock(&c->lock);
    if (e->refs == 0) {
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    left = --e->refs;
    if (left == 0) {
        wsync_cache_entry_t **pp = &c->head;
        while (*pp != NULL && *pp != e)
            pp = &(*pp)->next;
        if (*pp == e)
            *pp = e->next;
        c->size--;
        c->unmap(c->user, e->mapping);
        free(e);
    }
    pthread_mutex_unlock(&c->lock);
    return left;
}

size_t wsync_cache_size(wsync_cache_t *c)
{
    size_t n;
    pthread_mutex_lock(&c->lock);
    n = c->size;
    pthread_mutex_unlock(&c->lock);
    return n;
}

uint64_t wsync_cache_maps(wsync_cache_t *c)
{
    uint64_t n;
    pthread_mutex_lock(&c->lock);
    n = c->maps;
    pthread_mutex_unlock(&c->lock);
    return n;
}

void wsync_cache_destroy(wsync_cache_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    wsync_cache_entry_t *e = c->head;
    while (e != NULL) {
        wsync_cache_entry_t *next = e->next;
        c->unmap(c->user, e->mapping);
        free(e);
        e = next;
    }
    c->head = NULL;
    c->size = 0;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
