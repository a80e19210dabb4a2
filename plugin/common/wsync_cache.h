/* Consumer-side mapping cache, shared by every backend. Keyed by (kind, handle bytes, pid,
 * device); refcounted; the backend supplies map/unmap callbacks. Thread safe (one mutex). */
#ifndef WSYNC_COMMON_CACHE_H
#define WSYNC_COMMON_CACHE_H

#include <stddef.h>
#include "wsync_abi.h"

typedef struct wsync_cache wsync_cache_t;

typedef struct wsync_cache_entry {
    wsync_buffer_desc_t key; /* copy of the desc that first opened it */
    void *mapping;           /* backend payload returned by map */
    unsigned refs;
    uint64_t opens;           /* how many times acquire returned this entry */
    uint64_t last_generation; /* highest generation copied from this buffer (0 = none) */
    struct wsync_cache_entry *next;
} wsync_cache_entry_t;

/* map: create the backend mapping for desc; called with the cache lock held, at most once per
 * key while the entry lives. unmap: release it; called once, when refs drop to 0. */
typedef wsync_result_t (*wsync_cache_map_fn)(void *user, const wsync_buffer_desc_t *desc,
                                             void **mapping, wsync_error_t *err);
typedef void (*wsync_cache_unmap_fn)(void *user, void *mapping);

wsync_cache_t *wsync_cache_create(wsync_cache_map_fn map, wsync_cache_unmap_fn unmap, void *user);
/* Find or map. *hit is set to 1 when nothing was mapped (may be NULL). */
wsync_result_t wsync_cache_acquire(wsync_cache_t *c, const wsync_buffer_desc_t *desc,
                                   wsync_cache_entry_t **out, int *hit, wsync_error_t *err);
/* Drop one reference; unmaps at zero. Returns the references left. */
unsigned wsync_cache_release(wsync_cache_t *c, wsync_cache_entry_t *e);
/* Number of live mappings. */
size_t wsync_cache_size(wsync_cache_t *c);
/* Total map calls made since create (a test of "second open maps nothing"). */
uint64_t wsync_cache_maps(wsync_cache_t *c);
/* Unmap everything still held, then free the cache. */
void wsync_cache_destroy(wsync_cache_t *c);
/* Same key? (kind, handle bytes, pid, device) */
int wsync_cache_key_equal(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b);

#endif
