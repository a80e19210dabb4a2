/* The built-in layouts and HF configs as tensor lists; see wsync_model.h. */
#include "wsync_model.h"

#include "wsync_convert.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t wsync_model_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int wsync_model_index(wsync_model_t *m)
{
    m->nslots = 1;
    while (m->nslots < 2 * m->n)
        m->nslots <<= 1;
    m->slots = calloc(m->nslots, sizeof(*m->slots));
    if (m->slots == NULL)
        return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t s = wsync_model_hash(m->tensors[i].name) & (m->nslots - 1);
        while (m->slots[s] != 0)
            s = (s + 1) & (m->nslots - 1);
        m->slots[s] = i + 1;
    }
    return 0;
}

/* Offsets in the packed image, totals and the name index of m's tensor list. */
int wsync_model_finish(wsync_model_t *m)
{
    uint64_t off = 0;
    if (wsync_model_index(m) != 0)
        return -1;
    for (size_t i = 0; i < m->n; i++) {
        wsync_model_tensor_t *t = &m->tensors[i];
        off = (off + WSYNC_MODEL_ALIGN - 1) / WSYNC_MODEL_ALIGN * WSYNC_MODEL_ALIGN;
        t->offset = off;
        off += t->nbytes;
        m->payload_bytes += t->nbytes;
        if (t->nbytes > m->max_nbytes)
            m->max_nbytes = t->nbytes;
    }
    m->packed_bytes = off;
    return 0;
}

void wsync_model_free(wsync_model_t *m)
{
    if (m->owner_close != NULL)
        m->owner_close(m->owner);
    free(m->tensors);
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

long wsync_model_find(const wsync_model_t *m, const char *name)
{
    size_t s;

    if (m->nslots == 0 || name == NULL)
        return -1;
    s = wsync_model_hash(name) & (m->nslots - 1);
    while (m->slots[s] != 0) {
        if (strcmp(m->tensors[m->slots[s] - 1].name, name) == 0)
            return (long)(m->slots[s] - 1);
        s = (s + 1) & (m->nslots - 1);
    }
    return -1;
}

/* Word i of (name, version) is the splitmix64 sequence seeded by both: every tensor and every
 * version differ, and a moved or stale word is visible. */
void wsync_model_fill(const wsync_model_tensor_t *t, uint64_t version, void *dst)
{
    if (t->data != NULL) { /* a checkpoint's bytes */
        const size_t n = t->nbytes / wsync_dtype_size(t->dtype);
        if (t->file_dtype == t->dtype)
            memcpy(dst, t->data, t->nbytes);
        else
            wsync_convert_row(dst, t->dtype, t->data, t->file_dtype, n, 1.0);
        return;
    }
    uint64_t seed = wsync_mix64(wsync_model_hash(t->name) ^ (version * WSYNC64_GOLDEN));
    unsigned char *p = dst;
    uint64_t nwords = t->nbytes / 8;
    uint64_t i;

    for (i = 0; i < nwords; i++) {
        uint64_t w = wsync_mix64(seed + i * WSYNC64_GOLDEN);
        memcpy(p + 8 * i, &w, 8);
    }
    if (t->nbytes % 8 != 0) {
        uint64_t w = wsync_mix64(seed + i * WSYNC64_GOLDEN);
        memcpy(p + 8 * i, &w, t->nbytes % 8);
    }
}
