/* The order an engine holds tensors in (see wsync_mapping.h, wsync_map_order). */
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_mapping.h"
#include "wsync_pack_order.h"

typedef struct wsync_order_key {
    wsync_order_place_t at; /* first: sorted by wsync_order_place_cmp; part: wsync_map_part_t */
    const char *param;      /* engine parameter name (resolved) or the HF name itself */
} wsync_order_key_t;

static int wsync_order_by_param(const void *a, const void *b)
{
    const wsync_order_key_t *x = *(const wsync_order_key_t *const *)a;
    const wsync_order_key_t *y = *(const wsync_order_key_t *const *)b;
    int c = strcmp(x->param, y->param);
    return c != 0 ? c : (x->at.index > y->at.index) - (x->at.index < y->at.index);
}

wsync_result_t wsync_map_order(const wsync_map_table_t *table, const char *const *names, size_t n,
                               size_t *order, wsync_error_t *err)
{
    if (n == 0)
        return WSYNC_OK;
    if (names == NULL || order == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "wsync_map_order: names %p, order %p for %zu tensors",
                            (const void *)names, (void *)order, n);
    wsync_order_key_t *k = calloc(n, sizeof(*k));
    wsync_order_key_t **by = calloc(n, sizeof(*by));
    char(*param)[WSYNC_MAP_NAME_MAX] = calloc(n, sizeof(*param));
    if (k == NULL || by == NULL || param == NULL) {
        free(k), free(by), free(param);
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to order %zu tensors", n);
    }
    for (size_t i = 0; i < n; i++) {
        wsync_map_target_t tg;
        wsync_error_t quiet = {.struct_size = sizeof(quiet)};
        k[i] = (wsync_order_key_t){.at = {.expert = -1, .index = i}, .param = names[i]};
        if (names[i] != NULL && wsync_map_resolve(table, names[i], &tg, &quiet) == WSYNC_OK) {
            memcpy(param[i], tg.engine_name, sizeof(param[i]));
            k[i].param = param[i];
            k[i].at.expert = tg.expert;
            k[i].at.part = (int)tg.rule->part;
        } else if (names[i] == NULL) {
            k[i].param = "";
        }
        by[i] = &k[i];
    }
    /* each parameter ranks where its first tensor came */
    qsort(by, n, sizeof(*by), wsync_order_by_param);
    for (size_t i = 0; i < n; i++)
        by[i]->at.rank = i > 0 && strcmp(by[i]->param, by[i - 1]->param) == 0 ? by[i - 1]->at.rank
                                                                              : by[i]->at.index;
    qsort(k, n, sizeof(*k), wsync_order_place_cmp);
    for (size_t i = 0; i < n; i++)
        order[i] = k[i].at.index;
    free(k), free(by), free(param);
    return WSYNC_OK;
}

/* The engine parameter (and expert) name i goes into: key (WSYNC_MAP_NAME_MAX bytes), *expert;
 * an empty key for a name no rule matches. */
static void wsync_map_group_of(const wsync_map_table_t *table, const char *name, char *key,
                               int64_t *expert)
{
    wsync_map_target_t tg;
    wsync_error_t quiet = {.struct_size = sizeof(quiet)};
    key[0] = '\0';
    *expert = -1;
    if (name != NULL && wsync_map_resolve(table, name, &tg, &quiet) == WSYNC_OK) {
        memcpy(key, tg.engine_name, WSYNC_MAP_NAME_MAX);
        *expert = tg.expert;
    }
}

/* Packed bytes of order[from .. to) from a bucket's start. */
static uint64_t wsync_map_packed(const uint64_t *nbytes, const size_t *order, size_t from,
                                 size_t to)
{
    uint64_t used = 0;
    for (size_t j = from; j < to; j++)
        used = (used + WSYNC_MAP_ALIGN - 1) / WSYNC_MAP_ALIGN * WSYNC_MAP_ALIGN + nbytes[order[j]];
    return used;
}

/* The capacity of bucket j when it starts at order[from] (tail[from]: the largest tensor from
 * there on; NULL without a ramp). */
static uint64_t wsync_map_cap(size_t j, size_t from, uint64_t bucket_bytes, unsigned ramp,
                              const uint64_t *tail)
{
    if (j >= ramp)
        return bucket_bytes;
    const uint64_t c = bucket_bytes >> (ramp - j);
    return c > tail[from] ? c : tail[from];
}

wsync_result_t wsync_map_plan_buckets(const wsync_map_table_t *table, const char *const *names,
                                      const uint64_t *nbytes, size_t n, uint64_t bucket_bytes,
                                      unsigned ramp, size_t *order, size_t *bucket_first,
                                      size_t *n_buckets, wsync_error_t *err)
{
    wsync_result_t rc = wsync_map_order(table, names, n, order, err);
    if (rc != WSYNC_OK)
        return rc;
    if (ramp > 16)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "a ramp of %u buckets; at most 16 (bucket j < ramp holds "
                            "bucket_bytes >> (ramp - j))",
                            ramp);
    uint64_t *tail = NULL;
    if (ramp > 0 && n > 0) {
        if ((tail = malloc((n + 1) * sizeof(*tail))) == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to plan %zu tensors", n);
        tail[n] = 0;
        for (size_t i = n; i-- > 0;)
            tail[i] = nbytes[order[i]] > tail[i + 1] ? nbytes[order[i]] : tail[i + 1];
    }
    char key[2][WSYNC_MAP_NAME_MAX];
    int64_t expert[2] = {-1, -1};
    uint64_t used = 0, cap = bucket_bytes;
    size_t nb = 0, group = 0; /* group: where the tensors of the current parameter begin */
    for (size_t i = 0; i < n; i++) {
        uint64_t b = nbytes[order[i]];
        uint64_t at = (used + WSYNC_MAP_ALIGN - 1) / WSYNC_MAP_ALIGN * WSYNC_MAP_ALIGN;
        char *k = key[i % 2];
        const char *prev = key[(i + 1) % 2];
        wsync_map_group_of(table, names[order[i]], k, &expert[i % 2]);
        if (i == 0 || k[0] == '\0' || strcmp(k, prev) != 0 || expert[i % 2] != expert[(i + 1) % 2])
            group = i;
        if (b > bucket_bytes) {
            free(tail);
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "tensor %s (%llu bytes) does not fit a %llu-byte bucket: "
                                "raise the bucket size",
                                names[order[i]], (unsigned long long)b,
                                (unsigned long long)bucket_bytes);
        }
        if (i == 0 || at + b > cap) {
            /* a parameter (an expert's part of one) that fits a bucket is not cut: the bucket
             * ends before its first tensor instead (an fp8 per-tensor scale needs it whole) */
            if (nb > 0 && group > bucket_first[nb - 1] &&
                wsync_map_packed(nbytes, order, group, i + 1) <=
                    wsync_map_cap(nb, group, bucket_bytes, ramp, tail)) {
                cap = wsync_map_cap(nb, group, bucket_bytes, ramp, tail);
                bucket_first[nb++] = group;
                at = wsync_map_packed(nbytes, order, group, i);
                at = (at + WSYNC_MAP_ALIGN - 1) / WSYNC_MAP_ALIGN * WSYNC_MAP_ALIGN;
            } else {
                cap = wsync_map_cap(nb, i, bucket_bytes, ramp, tail);
                bucket_first[nb++] = i;
                at = 0;
            }
        }
        used = at + b;
    }
    free(tail);
    bucket_first[nb] = n;
    *n_buckets = nb;
    return WSYNC_OK;
}
