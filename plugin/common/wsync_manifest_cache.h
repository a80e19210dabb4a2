/* Manifest parse cache: a full parse once per bucket layout, then only the head of the text.
 *
 * Within a run the tensors array of a bucket is byte-identical from sync to sync (the producer
 * emits the canonical form, wsync_manifest_emit); only generation, finished, buffer and the
 * "digests" blob change. After a successful full parse of a text that ends with
 * `,"tensors":<value>}` the cache keeps that tail and its validated tensor table. A later text
 * that ends with the same tail bytes (length + memcmp) is parsed as head + "}" only; the result
 * equals what wsync_manifest_parse gives for the whole text, and every error is the one the full
 * parse would report (same code, same message). Texts in any other form take the full parse.
 *
 * Bounded: at most WSYNC_MANIFEST_CACHE_MAX_ENTRIES tails and WSYNC_MANIFEST_CACHE_MAX_BYTES of
 * tails and tables, least recently used evicted first. Thread safe (one mutex; the jansson work
 * runs outside it). Owned by one consumer: create with it, destroy at its finalize. */
#ifndef WSYNC_COMMON_MANIFEST_CACHE_H
#define WSYNC_COMMON_MANIFEST_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_manifest.h"

#define WSYNC_MANIFEST_CACHE_MAX_ENTRIES 64
#define WSYNC_MANIFEST_CACHE_MAX_BYTES ((size_t)64 << 20)

typedef struct wsync_manifest_cache wsync_manifest_cache_t;

typedef struct wsync_manifest_cache_stats {
    size_t entries; /* tails held now */
    size_t bytes;   /* their tail, descriptor and name bytes */
    uint64_t hits;  /* parses that took the head-only path */
    uint64_t misses;
} wsync_manifest_cache_stats_t;

/* NULL when out of memory. */
wsync_manifest_cache_t *wsync_manifest_cache_create(void);
/* A manifest cache with the size limits of a consumer's config (those of its fields that the
 * caller's struct_size covers; 0 or absent: the defaults). NULL when out of memory. */
wsync_manifest_cache_t *wsync_manifest_cache_for(const wsync_consumer_config_t *config);
/* The size limits every parse through `c` checks first (wsync_manifest_check_limits; a hit
 * scans only the head, its tail's objects counted when it was stored); the
 * defaults until set. Not thread safe with parses: set it at consumer create. */
void wsync_manifest_cache_set_limits(wsync_manifest_cache_t *c, const wsync_manifest_limits_t *lim);
/* Frees every entry. No parse may be running on `c`. NULL is a no-op. */
void wsync_manifest_cache_destroy(wsync_manifest_cache_t *c);

/* wsync_manifest_parse through the cache, after the size limits (c NULL: the default limits and
 * a plain full parse). *out is freed with
 * wsync_manifest_free and does not depend on the cache (descriptors and names are copied). */
wsync_result_t wsync_manifest_parse_cached(wsync_manifest_cache_t *c, const char *json, size_t len,
                                           wsync_manifest_owned_t **out, wsync_error_t *err);

void wsync_manifest_cache_stats(wsync_manifest_cache_t *c, wsync_manifest_cache_stats_t *out);

#endif
