/* The order a bucket is packed in (see wsync_pack_order.h). */
#include "wsync_pack_order.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_fusion.h"
#include "wsync_log.h"

typedef struct wsync_pack_key {
    wsync_order_place_t at; /* first: sorted by wsync_order_place_cmp */
    const char *name;
    size_t plen;        /* the group's prefix: name[0, plen) */
    int cls;            /* wsync_fuse_t; NONE: the whole name is the group */
    const char *suffix; /* after the projection's name ("weight", "bias", ...) */
} wsync_pack_key_t;

static void wsync_pack_parse(wsync_pack_key_t *k)
{
    const wsync_fusion_t f = wsync_fusion_of(k->name);
    k->cls = (int)f.kind;
    k->plen = f.prefix_len;
    k->suffix = f.suffix;
    k->at.expert = f.expert;
    k->at.part = f.part;
}

static int wsync_pack_by_group(const void *a, const void *b)
{
    const wsync_pack_key_t *x = *(const wsync_pack_key_t *const *)a;
    const wsync_pack_key_t *y = *(const wsync_pack_key_t *const *)b;
    size_t m = x->plen < y->plen ? x->plen : y->plen;
    int c = memcmp(x->name, y->name, m);
    if (c == 0 && x->plen != y->plen)
        c = x->plen < y->plen ? -1 : 1;
    if (c == 0 && x->cls != y->cls)
        c = x->cls < y->cls ? -1 : 1;
    if (c == 0)
        c = strcmp(x->suffix, y->suffix);
    return c != 0 ? c : (x->at.index > y->at.index) - (x->at.index < y->at.index);
}

static int wsync_pack_same_group(const wsync_pack_key_t *x, const wsync_pack_key_t *y)
{
    return x->cls != WSYNC_FUSE_NONE && x->cls == y->cls && x->plen == y->plen &&
           memcmp(x->name, y->name, x->plen) == 0 && strcmp(x->suffix, y->suffix) == 0;
}

int wsync_order_place_cmp(const void *a, const void *b)
{
    const wsync_order_place_t *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->expert != y->expert)
        return x->expert < y->expert ? -1 : 1;
    if (x->part != y->part)
        return x->part < y->part ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int wsync_pack_given(void)
{
    const char *v = getenv("WSYNC_PACK_ORDER");
    if (v == NULL || v[0] == '\0' || strcmp(v, "engine") == 0)
        return 0;
    if (strcmp(v, "given") == 0)
        return 1;
    WSYNC_LOG_WARN("WSYNC_PACK_ORDER=\"%s\" is neither \"engine\" nor \"given\": using engine", v);
    return 0;
}

wsync_result_t wsync_pack_order(const wsync_stage_tensor_t *t, size_t n, size_t *order,
                                wsync_error_t *err)
{
    if (n == 0)
        return WSYNC_OK;
    if (t == NULL || order == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "pack order: tensors %p, order %p for %zu tensors", (const void *)t,
                          (void *)order, n);
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    if (wsync_pack_given())
        return WSYNC_OK;
    wsync_pack_key_t *k = calloc(n, sizeof(*k));
    wsync_pack_key_t **by = calloc(n, sizeof(*by));
    if (k == NULL || by == NULL) {
        free(k), free(by);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to order %zu tensors", n);
    }
    for (size_t i = 0; i < n; i++) {
        k[i].name = t[i].name != NULL ? t[i].name : "";
        k[i].at.index = k[i].at.rank = i;
        wsync_pack_parse(&k[i]);
        by[i] = &k[i];
    }
    qsort(by, n, sizeof(*by), wsync_pack_by_group);
    for (size_t i = 1; i < n; i++)
        if (wsync_pack_same_group(by[i - 1], by[i]))
            by[i]->at.rank = by[i - 1]->at.rank; /* sorted by index within a group: the first's */
    qsort(k, n, sizeof(*k), wsync_order_place_cmp);
    for (size_t i = 0; i < n; i++)
        order[i] = k[i].at.index;
    free(k), free(by);
    return WSYNC_OK;
}
