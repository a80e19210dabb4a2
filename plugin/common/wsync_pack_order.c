/* The order a bucket is packed in (see wsync_pack_order.h). */
#include "wsync_pack_order.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_log.h"

enum { WSYNC_PACK_ALONE, WSYNC_PACK_QKV, WSYNC_PACK_GATE_UP, WSYNC_PACK_W13, WSYNC_PACK_W2 };

typedef struct wsync_pack_key {
    wsync_order_place_t at; /* first: sorted by wsync_order_place_cmp */
    const char *name;
    size_t plen;        /* the group's prefix: name[0, plen) */
    int cls;            /* WSYNC_PACK_*; ALONE: the whole name is the group */
    const char *suffix; /* after the projection's name ("weight", "bias", ...) */
} wsync_pack_key_t;

typedef struct wsync_pack_proj {
    const char *name;
    int cls, part;
} wsync_pack_proj_t;

static const wsync_pack_proj_t wsync_pack_dense[] = {
    {"q_proj", WSYNC_PACK_QKV, 0},      {"k_proj", WSYNC_PACK_QKV, 1},
    {"v_proj", WSYNC_PACK_QKV, 2},      {"gate_proj", WSYNC_PACK_GATE_UP, 0},
    {"up_proj", WSYNC_PACK_GATE_UP, 1},
};
static const wsync_pack_proj_t wsync_pack_expert[] = {
    {"gate_proj", WSYNC_PACK_W13, 0}, {"w1", WSYNC_PACK_W13, 0},
    {"up_proj", WSYNC_PACK_W13, 1},   {"w3", WSYNC_PACK_W13, 1},
    {"down_proj", WSYNC_PACK_W2, 0},  {"w2", WSYNC_PACK_W2, 0},
};

/* The component at c (up to the next '.' or the end) in table, or NULL. */
static const wsync_pack_proj_t *wsync_pack_find(const char *c, const wsync_pack_proj_t *table,
                                                size_t n)
{
    size_t len = strcspn(c, ".");
    for (size_t i = 0; i < n; i++)
        if (strlen(table[i].name) == len && memcmp(c, table[i].name, len) == 0)
            return &table[i];
    return NULL;
}

/* Digits only, at most 9 of them, ended by '.': the expert's number, else -1. */
static int64_t wsync_pack_expert_no(const char *c)
{
    size_t len = strcspn(c, ".");
    if (len == 0 || len > 9 || c[len] != '.' || strspn(c, "0123456789") != len)
        return -1;
    return strtoll(c, NULL, 10);
}

static void wsync_pack_parse(wsync_pack_key_t *k)
{
    const char *name = k->name;
    k->cls = WSYNC_PACK_ALONE;
    k->plen = strlen(name);
    k->suffix = "";
    k->at.expert = -1;
    k->at.part = 0;
    for (const char *c = name; c != NULL && *c != '\0';) {
        const char *dot = strchr(c, '.');
        const wsync_pack_proj_t *p = NULL;
        int64_t e = -1;
        const char *proj = c;
        if (dot != NULL && (size_t)(dot - c) == strlen("experts") &&
            memcmp(c, "experts", strlen("experts")) == 0 &&
            (e = wsync_pack_expert_no(dot + 1)) >= 0) {
            proj = strchr(dot + 1, '.') + 1;
            p = wsync_pack_find(proj, wsync_pack_expert,
                                sizeof(wsync_pack_expert) / sizeof(wsync_pack_expert[0]));
        } else if (dot != NULL) {
            p = wsync_pack_find(c, wsync_pack_dense,
                                sizeof(wsync_pack_dense) / sizeof(wsync_pack_dense[0]));
        }
        if (p != NULL) {
            const char *end = proj + strlen(p->name);
            k->cls = p->cls;
            k->at.part = p->part;
            k->at.expert = e;
            k->plen = (size_t)(c - name);
            k->suffix = *end == '.' ? end + 1 : end;
            return;
        }
        c = dot != NULL ? dot + 1 : NULL;
    }
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
    return x->cls != WSYNC_PACK_ALONE && x->cls == y->cls && x->plen == y->plen &&
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
