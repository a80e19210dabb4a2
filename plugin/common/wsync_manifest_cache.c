/* Manifest parse cache. Contract in wsync_manifest_cache.h.
 *
 * Why a head-only parse is exact. An entry holds a tail X = `,"tensors":` ... taken from a text
 * T0 = H0 + X that the full parser accepted, stored only when
 *   (a) H0 + "}" parses (jansson, duplicates rejected) as a non-empty object without "tensors",
 *   (b) the root object of T0 has exactly one member more than that object.
 * For a new text T = H + X the fast path requires (a) of H. A complete JSON document whose root
 * is an object ends with the root's closing brace, so H + "}" being one means that after H the
 * parser is inside the root object, right after a complete member (non-empty), outside any
 * string, with the root as its only open container -- the same state as after H0 (the last
 * token of either head ends at the ',' of X as it ended at '}'). JSON parsing is deterministic
 * from that state, so X is read in T exactly as in T0: it is valid, adds the members it added to
 * T0 -- by (b) the single member "tensors", with the same array value -- and closes the root.
 * Hence T is a valid document whose members are those of H + "}" plus "tensors": X's array, and
 * no key is duplicated because H has no "tensors". The full parse of T would check the head
 * members with the same functions (wsync_manifest_parse_head), and the array exactly as it did
 * for T0; the only checks of the array that depend on anything outside it are each tensor's
 * extent against buffer.bytes and the digests blob, which the fast path repeats in the full
 * parse's order (wsync_manifest_check_extent, wsync_manifest_apply_digests). A direct manifest's
 * tail starts one member earlier, X = `,"segments":` ... `,"tensors":` ...: the canonical emit
 * writes "segments" last before "tensors", and a steady trainer repeats both byte for byte. The
 * same argument holds with two members: stored only when the root of T0 has exactly two members
 * more than H0 + "}" and H0 has neither "segments" nor "tensors" (so the tail's two members are
 * those), served only to heads H without either. The entry keeps the segments and each
 * tensor's index; the one check of "segments" that reads the head (the buffer is not a torch
 * share) runs where the full parse runs it (wsync_manifest_parse_head with the cached segments),
 * and per tensor the full parse's two segment checks are repeated in its order
 * (wsync_manifest_check_segment, wsync_manifest_check_tensor_extent). A staged tail serves a
 * head with "segments" never (that pair is the full parse's error, worded by it). When H + "}"
 * is not such an object (not JSON, a NUL byte, empty, or has "tensors") the text takes the full
 * parse, so its error, if any, is the full parse's own.
 *
 * The digests blob. jansson reads a long string at ~16 ns a byte, and a canonical head ends with
 * `,"digests":"B"` where B (~11 bytes a tensor) is nearly all of it. When the head ends that way
 * and B holds only base64 characters (letters, digits, '+', '/', '='; no quote, backslash or
 * control byte, so B is a JSON string literal whose value is B itself), jansson reads only the
 * rest H' and B is decoded directly. By the same argument as above, H' + "}" being a non-empty
 * object without "tensors" and without "digests" means H + "}" is that object plus the member
 * "digests": B, with no duplicate; so the result is again the full parse's. Condition (a) on H0
 * at store time is checked the same way (the blob counted as one member for (b)). */
#define _GNU_SOURCE /* memmem, memrchr */
#include "wsync_manifest_cache.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_manifest_parts.h"

#define WSYNC_MC_KEY ",\"tensors\":"
#define WSYNC_MC_KEY_LEN (sizeof(WSYNC_MC_KEY) - 1)
#define WSYNC_MC_SEG_KEY ",\"segments\":"
#define WSYNC_MC_SEG_KEY_LEN (sizeof(WSYNC_MC_SEG_KEY) - 1)

/* A validated tail and its tensor table, as the array alone defines it (digests from a blob
 * excluded). Immutable once inserted; freed when the last reference goes. */
typedef struct wsync_mc_entry {
    char *tail;
    size_t tail_len;
    uint64_t tail_objects; /* its JSON objects, for the size limits of a hit's head */
    wsync_tensor_desc_t *tensors;
    size_t n;
    char *names;                   /* NUL-separated; tensors[i].name points in here */
    uint32_t *segment_of;          /* direct manifests: each tensor's segment index; else NULL */
    wsync_buffer_desc_t *segments; /* direct manifests: the tail's "segments" */
    size_t n_segments;
    size_t names_len;
    size_t bytes;  /* accounted against WSYNC_MANIFEST_CACHE_MAX_BYTES */
    unsigned refs; /* the cache's own + parses using it; guarded by the cache lock */
} wsync_mc_entry_t;

struct wsync_manifest_cache {
    pthread_mutex_t lock;
    wsync_mc_entry_t *lru[WSYNC_MANIFEST_CACHE_MAX_ENTRIES]; /* [0] most recently used */
    size_t count, bytes;
    uint64_t hits, misses;
    wsync_manifest_limits_t limits;
};

static void wsync_mc_entry_free(wsync_mc_entry_t *e)
{
    free(e->tail);
    free(e->tensors);
    free(e->names);
    free(e->segment_of);
    free(e->segments);
    free(e);
}

/* Caller holds c->lock. */
static void wsync_mc_unref_locked(wsync_mc_entry_t *e)
{
    if (--e->refs == 0)
        wsync_mc_entry_free(e);
}

wsync_manifest_cache_t *wsync_manifest_cache_create(void)
{
    wsync_manifest_cache_t *c = calloc(1, sizeof(*c));
    if (c != NULL)
        pthread_mutex_init(&c->lock, NULL);
    return c;
}

wsync_manifest_cache_t *wsync_manifest_cache_for(const wsync_consumer_config_t *config)
{
    wsync_manifest_limits_t lim = {0, 0};
    if (WSYNC_HAS_FIELD(wsync_consumer_config_t, config, max_manifest_bytes))
        lim.max_bytes = config->max_manifest_bytes;
    if (WSYNC_HAS_FIELD(wsync_consumer_config_t, config, max_manifest_tensors))
        lim.max_tensors = config->max_manifest_tensors;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    wsync_manifest_cache_set_limits(c, &lim);
    return c;
}

void wsync_manifest_cache_set_limits(wsync_manifest_cache_t *c, const wsync_manifest_limits_t *lim)
{
    if (c != NULL && lim != NULL)
        c->limits = *lim;
}

void wsync_manifest_cache_destroy(wsync_manifest_cache_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->count; i++)
        wsync_mc_unref_locked(c->lru[i]);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void wsync_manifest_cache_stats(wsync_manifest_cache_t *c, wsync_manifest_cache_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    out->entries = c->count;
    out->bytes = c->bytes;
    out->hits = c->hits;
    out->misses = c->misses;
    pthread_mutex_unlock(&c->lock);
}

#define WSYNC_MC_BLOB_KEY ",\"digests\":\""
#define WSYNC_MC_BLOB_KEY_LEN (sizeof(WSYNC_MC_BLOB_KEY) - 1)

static int wsync_mc_is_base64(unsigned char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
           ch == '+' || ch == '/' || ch == '=';
}

/* When head[0, hlen) ends with `,"digests":"B"`, B of base64 characters only: the length of
 * what precedes it, and B. Otherwise hlen, and *blob NULL. */
static size_t wsync_mc_split_blob(const char *head, size_t hlen, const char **blob,
                                  size_t *blob_len)
{
    *blob = NULL;
    *blob_len = 0;
    if (hlen < WSYNC_MC_BLOB_KEY_LEN + 1 || head[hlen - 1] != '"')
        return hlen;
    const char *open = memrchr(head, '"', hlen - 1);
    if (open == NULL || (size_t)(open - head) + 1 < WSYNC_MC_BLOB_KEY_LEN)
        return hlen;
    const char *key = open + 1 - WSYNC_MC_BLOB_KEY_LEN;
    if (memcmp(key, WSYNC_MC_BLOB_KEY, WSYNC_MC_BLOB_KEY_LEN) != 0)
        return hlen;
    for (const char *p = open + 1; p < head + hlen - 1; p++)
        if (!wsync_mc_is_base64((unsigned char)*p))
            return hlen;
    *blob = open + 1;
    *blob_len = (size_t)(head + hlen - 1 - *blob);
    return (size_t)(key - head);
}

/* head[0, hlen) + "}" as a JSON object, or NULL unless it is a non-empty object without a
 * "tensors" member, nor, before a direct tail, a "segments" member (the precondition of the
 * soundness argument above). */
static json_t *wsync_mc_load_head(const char *head, size_t hlen, int direct)
{
    json_error_t jerr;
    if (memchr(head, '\0', hlen) != NULL)
        return NULL;
    char *buf = malloc(hlen + 1);
    if (buf == NULL)
        return NULL;
    memcpy(buf, head, hlen);
    buf[hlen] = '}';
    json_t *root = json_loadb(buf, hlen + 1, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (root != NULL &&
        (!json_is_object(root) || json_object_size(root) == 0 || json_object_get(root, "tensors") ||
         (direct && json_object_get(root, "segments")))) {
        json_decref(root);
        root = NULL;
    }
    return root;
}

/* The most recently used entry whose tail ends `json`, with a reference taken; or NULL. */
static wsync_mc_entry_t *wsync_mc_lookup(wsync_manifest_cache_t *c, const char *json, size_t len)
{
    wsync_mc_entry_t *hit = NULL;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->count; i++) {
        wsync_mc_entry_t *e = c->lru[i];
        if (e->tail_len < len && memcmp(json + len - e->tail_len, e->tail, e->tail_len) == 0) {
            memmove(&c->lru[1], &c->lru[0], i * sizeof(c->lru[0]));
            c->lru[0] = e;
            e->refs++;
            hit = e;
            break;
        }
    }
    if (hit)
        c->hits++;
    else
        c->misses++;
    pthread_mutex_unlock(&c->lock);
    return hit;
}

static void wsync_mc_release(wsync_manifest_cache_t *c, wsync_mc_entry_t *e)
{
    pthread_mutex_lock(&c->lock);
    wsync_mc_unref_locked(e);
    pthread_mutex_unlock(&c->lock);
}

/* Copies e's table into m and runs the checks that depend on the head. */
static wsync_result_t wsync_mc_fill(const wsync_mc_entry_t *e, wsync_manifest_owned_t *m,
                                    const wsync_manifest_blob_t *blob, wsync_error_t *err)
{
    m->tensors = malloc((e->n ? e->n : 1) * sizeof(*m->tensors));
    m->names = malloc(e->names_len ? e->names_len : 1);
    if (m->tensors == NULL || m->names == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu tensor descriptors",
                          e->n);
    memcpy(m->tensors, e->tensors, e->n * sizeof(*m->tensors));
    memcpy(m->names, e->names, e->names_len);
    if (e->segment_of != NULL) { /* a direct manifest: the head's segments, the tail's indices */
        if ((m->segment_of = malloc((e->n ? e->n : 1) * sizeof(*m->segment_of))) == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu segment indices",
                              e->n);
        memcpy(m->segment_of, e->segment_of, e->n * sizeof(*m->segment_of));
    }
    for (size_t i = 0; i < e->n; i++) {
        wsync_result_t r = WSYNC_OK;
        m->tensors[i].name = m->names + (e->tensors[i].name - e->names);
        /* the full parse's checks of tensor i that read the head, in its order */
        if (e->segment_of != NULL &&
            (r = wsync_manifest_check_segment(&m->view, &m->tensors[i], i, e->segment_of[i],
                                              err)) != WSYNC_OK)
            return r;
        r = wsync_manifest_check_tensor_extent(&m->view, &m->tensors[i], i,
                                               e->segment_of != NULL ? e->segment_of[i] : 0, err);
        if (r != WSYNC_OK)
            return r;
    }
    m->view.n_tensors = e->n;
    m->view.tensors = m->tensors;
    m->view.tensor_segment = m->segment_of;
    return wsync_manifest_apply_digests(m, blob, err);
}

/* The head-only parse. *fallback = 1 (and nothing else) when the head is not in the form the
 * soundness argument needs; the caller then runs the full parse. */
static wsync_result_t wsync_mc_hit(const wsync_mc_entry_t *e, const char *json, size_t len,
                                   wsync_manifest_owned_t **out, int *fallback, wsync_error_t *err)
{
    const char *blob_text;
    size_t blob_len;
    size_t hlen = wsync_mc_split_blob(json, len - e->tail_len, &blob_text, &blob_len);
    json_t *root = wsync_mc_load_head(json, hlen, e->segments != NULL);
    if (root != NULL && blob_text != NULL && json_object_get(root, "digests") != NULL) {
        json_decref(root);
        root = NULL;
    }
    if (root == NULL) {
        *fallback = 1;
        return WSYNC_OK;
    }
    wsync_manifest_blob_t blob = {0};
    char *blob_copy = NULL;
    wsync_result_t r;
    wsync_manifest_owned_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate a manifest");
        goto out;
    }
    m->view.struct_size = sizeof(m->view);
    const wsync_manifest_segs_t segs = {e->segments, e->n_segments};
    r = wsync_manifest_parse_head(root, e->segments != NULL ? &segs : NULL, m, &blob, err);
    if (r == WSYNC_OK && blob_text != NULL) {
        /* Where the full parse decodes "digests": last of the head members. */
        if ((blob_copy = malloc(blob_len + 1)) == NULL) {
            r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "digests: cannot allocate %zu bytes",
                           blob_len);
            goto out;
        }
        memcpy(blob_copy, blob_text, blob_len);
        blob_copy[blob_len] = '\0';
        r = wsync_manifest_decode_digests(blob_copy, blob_len, &blob, err);
    }
    /* A tail with segment indices serves only heads with segments, and one without them only
     * heads without: the other pairs are errors the full parse words itself. */
    if (r == WSYNC_OK && (m->view.n_segments > 0) != (e->segment_of != NULL)) {
        *fallback = 1;
        goto out;
    }
    if (r == WSYNC_OK)
        r = wsync_mc_fill(e, m, &blob, err);
    if (r == WSYNC_OK)
        r = wsync_manifest_check_replay(&m->view, blob.present, err);
out:
    free(blob_copy);
    wsync_manifest_blob_free(&blob);
    json_decref(root);
    if (r != WSYNC_OK || *fallback) {
        wsync_manifest_free(m);
        return r;
    }
    *out = m;
    return WSYNC_OK;
}

/* A new entry for the tail of `json` that `m` (its full parse) validated; NULL when the text is
 * not in the canonical form, (a) or (b) fails, it is too big, or memory is short. */
static wsync_mc_entry_t *wsync_mc_entry_new(const char *json, size_t len,
                                            const wsync_manifest_owned_t *m, size_t root_members,
                                            int had_blob)
{
    const int direct = m->view.n_segments > 0; /* then every tensor named its segment */
    const char *key = direct ? memmem(json, len, WSYNC_MC_SEG_KEY, WSYNC_MC_SEG_KEY_LEN)
                             : memmem(json, len, WSYNC_MC_KEY, WSYNC_MC_KEY_LEN);
    if (key == NULL)
        return NULL;
    size_t hlen = (size_t)(key - json);
    const char *blob_text;
    size_t blob_len;
    size_t core = wsync_mc_split_blob(json, hlen, &blob_text, &blob_len);
    json_t *head = wsync_mc_load_head(json, core, direct);
    size_t head_members = head ? json_object_size(head) + (blob_text != NULL) : 0;
    int ok = head != NULL && head_members + 1 + (size_t)direct == root_members &&
             (blob_text == NULL || json_object_get(head, "digests") == NULL);
    json_decref(head);
    if (!ok)
        return NULL;

    size_t n = m->view.n_tensors, names_len = 0;
    if (n > 0)
        names_len =
            (size_t)(m->tensors[n - 1].name - m->names) + strlen(m->tensors[n - 1].name) + 1;
    size_t tail_len = len - hlen;
    const size_t n_segs = m->view.n_segments;
    size_t bytes = tail_len + n * sizeof(*m->tensors) + names_len +
                   (direct ? n * sizeof(*m->segment_of) + n_segs * sizeof(*m->segments) : 0);
    if (bytes > WSYNC_MANIFEST_CACHE_MAX_BYTES)
        return NULL;

    wsync_mc_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->tail = malloc(tail_len);
    e->tensors = malloc((n ? n : 1) * sizeof(*e->tensors));
    e->names = malloc(names_len ? names_len : 1);
    e->segment_of = direct ? malloc((n ? n : 1) * sizeof(*e->segment_of)) : NULL;
    e->segments = direct ? malloc(n_segs * sizeof(*e->segments)) : NULL;
    if (e->tail == NULL || e->tensors == NULL || e->names == NULL ||
        (direct && (e->segment_of == NULL || e->segments == NULL))) {
        wsync_mc_entry_free(e);
        return NULL;
    }
    if (direct) {
        memcpy(e->segment_of, m->segment_of, n * sizeof(*e->segment_of));
        memcpy(e->segments, m->segments, n_segs * sizeof(*e->segments));
        e->n_segments = n_segs;
    }
    memcpy(e->tail, key, tail_len);
    memcpy(e->names, m->names, names_len);
    memcpy(e->tensors, m->tensors, n * sizeof(*e->tensors));
    for (size_t i = 0; i < n; i++) {
        e->tensors[i].name = e->names + (m->tensors[i].name - m->names);
        if (had_blob) { /* those digests came from the head, not from the array */
            e->tensors[i].digest = 0;
            e->tensors[i].has_digest = 0;
        }
    }
    e->tail_len = tail_len;
    e->tail_objects = wsync_manifest_objects(e->tail, tail_len);
    e->n = n;
    e->names_len = names_len;
    e->bytes = bytes;
    e->refs = 1;
    return e;
}

static void wsync_mc_insert(wsync_manifest_cache_t *c, wsync_mc_entry_t *e)
{
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->count; i++) { /* another thread stored it meanwhile */
        const wsync_mc_entry_t *x = c->lru[i];
        if (x->tail_len == e->tail_len && memcmp(x->tail, e->tail, e->tail_len) == 0) {
            pthread_mutex_unlock(&c->lock);
            wsync_mc_entry_free(e);
            return;
        }
    }
    if (c->count == WSYNC_MANIFEST_CACHE_MAX_ENTRIES) {
        c->count--;
        c->bytes -= c->lru[c->count]->bytes;
        wsync_mc_unref_locked(c->lru[c->count]);
    }
    memmove(&c->lru[1], &c->lru[0], c->count * sizeof(c->lru[0]));
    c->lru[0] = e;
    c->count++;
    c->bytes += e->bytes;
    while (c->bytes > WSYNC_MANIFEST_CACHE_MAX_BYTES && c->count > 1) {
        c->count--;
        c->bytes -= c->lru[c->count]->bytes;
        wsync_mc_unref_locked(c->lru[c->count]);
    }
    pthread_mutex_unlock(&c->lock);
}

wsync_result_t wsync_manifest_parse_cached(wsync_manifest_cache_t *c, const char *json, size_t len,
                                           wsync_manifest_owned_t **out, wsync_error_t *err)
{
    if (json == NULL || out == NULL)
        return wsync_manifest_parse(json, len, out, err);
    *out = NULL;
    wsync_result_t r;
    if (c == NULL) {
        r = wsync_manifest_check_limits(json, len, 0, 0, NULL, err);
        return r == WSYNC_OK ? wsync_manifest_parse(json, len, out, err) : r;
    }

    /* The limits before any parse; a hit's tail was counted when it was stored. */
    wsync_mc_entry_t *e = wsync_mc_lookup(c, json, len);
    r = wsync_manifest_check_limits(json, len, e ? e->tail_len : 0, e ? e->tail_objects : 0,
                                    &c->limits, err);
    if (r == WSYNC_OK && e != NULL) {
        int fallback = 0;
        r = wsync_mc_hit(e, json, len, out, &fallback, err);
        if (!fallback) {
            wsync_mc_release(c, e);
            return r;
        }
    }
    if (e != NULL)
        wsync_mc_release(c, e);
    if (r != WSYNC_OK)
        return r;

    size_t members = 0;
    int had_blob = 0;
    wsync_manifest_owned_t *m = NULL;
    r = wsync_manifest_parse_ex(json, len, &m, &members, &had_blob, err);
    if (r != WSYNC_OK)
        return r;
    if (e == NULL) {
        wsync_mc_entry_t *fresh = wsync_mc_entry_new(json, len, m, members, had_blob);
        if (fresh != NULL)
            wsync_mc_insert(c, fresh);
    }
    *out = m;
    return WSYNC_OK;
}
