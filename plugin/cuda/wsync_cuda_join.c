/* The copy engines' candidates of a batch (see wsync_cuda.h): consecutive ops that continue each
 * other in both source and destination (the trainer's tensors packed in order, landing in one
 * fused engine parameter: q, k, v in qkv_proj; gate, up in gate_up_proj) become one copy, cut
 * where an allocation ends on either side: the driver refuses a copy that spans two. One pass in
 * table order, no sorting: the planning time of thousands of ops stays small beside the copy. */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"

/* Allocation queries per call at most; past it, ops are not joined (bounds the host time when
 * every op lies in its own allocation). */
#define WSYNC_CUDA_JOIN_QUERIES 256

static int flat(const wsync_cuda_op_t *op)
{
    return op->rows == 1 && op->chunk_end > op->chunk_begin;
}

static void add_group(wsync_cuda_groups_t *g, const wsync_cuda_op_t *t, size_t first, size_t count)
{
    wsync_cuda_group_t *x = &g->g[g->n++];
    x->first = g->n_member;
    x->count = count;
    x->order = first;
    for (size_t k = 0; k < count; k++)
        g->member[g->n_member++] = first + k;
    if (count == 1) {
        x->op = t[first];
        return;
    }
    const wsync_cuda_op_t *z = &t[first + count - 1];
    const uint64_t bytes = (uint64_t)(z->src + z->row_bytes - t[first].src);
    wsync_cuda_plan_op(&x->op, t[first].src, t[first].dst, bytes, bytes, 1, bytes, 0, 0);
}

/* Ops [i, j) continue each other; group them, cut where an allocation ends. */
static void cut(wsync_cuda_groups_t *g, const wsync_cuda_op_t *t, size_t i, size_t j,
                wsync_cuda_alloc_range_fn range, unsigned *queries)
{
    while (i < j) {
        uintptr_t sb, db;
        size_t ss, ds;
        size_t e = i + 1;
        if (*queries + 2 <= WSYNC_CUDA_JOIN_QUERIES) {
            *queries += 2;
            if (range(t[i].src, &sb, &ss) && range(t[i].dst, &db, &ds))
                while (e < j && (uintptr_t)t[e].src + t[e].row_bytes <= sb + ss &&
                       (uintptr_t)t[e].dst + t[e].row_bytes <= db + ds)
                    e++;
        }
        add_group(g, t, i, e - i);
        i = e;
    }
}

/* Whether joining ops [i, j) can give the copy engines more: the whole reaches min_bytes and
 * some op alone does not (ops that qualify alone cost the copy engines only a few microseconds
 * more apart, less than the allocation queries of a join). */
static int worth_joining(const wsync_cuda_op_t *t, size_t i, size_t j, uint64_t min_bytes)
{
    uint64_t total = 0;
    int small = 0;
    for (size_t k = i; k < j; k++) {
        total += t[k].row_bytes;
        small |= t[k].row_bytes < min_bytes;
    }
    return small && total >= min_bytes;
}

wsync_result_t wsync_cuda_groups(const wsync_cuda_op_t *t, size_t n,
                                 wsync_cuda_alloc_range_fn range, uint64_t min_bytes,
                                 wsync_cuda_groups_t *g, wsync_error_t *err)
{
    memset(g, 0, sizeof(*g));
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += flat(&t[i]);
    if (m == 0)
        return WSYNC_OK;
    g->g = malloc(m * sizeof(*g->g));
    g->member = malloc(m * sizeof(*g->member));
    if (g->g == NULL || g->member == NULL) {
        wsync_cuda_groups_free(g);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to group %zu copy ops", m);
    }
    unsigned queries = 0;
    for (size_t i = 0; i < n;) {
        if (!flat(&t[i])) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (range != NULL && j < n && flat(&t[j]) &&
               t[j].src == t[j - 1].src + t[j - 1].row_bytes &&
               t[j].dst == t[j - 1].dst + t[j - 1].row_bytes)
            j++;
        if (j - i > 1 && worth_joining(t, i, j, min_bytes))
            cut(g, t, i, j, range, &queries);
        else
            for (size_t k = i; k < j; k++)
                add_group(g, t, k, 1);
        i = j;
    }
    return WSYNC_OK;
}

void wsync_cuda_groups_free(wsync_cuda_groups_t *g)
{
    free(g->g);
    free(g->member);
    memset(g, 0, sizeof(*g));
}
