/* The copy engines' candidates of a batch (see wsync_cuda.h): ops that continue each other in
 * both source and destination become one copy, and equal copies at constant strides on both
 * sides become one 2-D copy, so the expert matrices an engine holds fused in one parameter (a
 * MoE layer's w13 and w2) cost the copy engines one copy instead of one per expert. Nothing is
 * joined across two allocations: the driver refuses a copy that spans two. */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"

/* cudaMemcpy2DAsync's pitch limit on the GPUs measured (cudaDevAttrMaxPitch) */
#define WSYNC_CUDA_MAX_RUN_PITCH ((1ull << 31) - 1)

typedef struct keyed {
    uintptr_t key;
    size_t i;
} keyed_t;

static int by_key(const void *a, const void *b)
{
    const keyed_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* A stretch of ops contiguous in source and destination: ks[first .. first + count). */
typedef struct unit {
    uintptr_t src, dst;
    uint64_t bytes;
    size_t first, count;
} unit_t;

static uint64_t op_bytes(const wsync_cuda_op_t *op)
{
    return op->chunk_end > op->chunk_begin ? op->rows * op->row_bytes : 0;
}

/* Units from the contiguous ops ks[0..m), sorted by source; joined only with one_alloc. */
static size_t make_units(const wsync_cuda_op_t *t, const keyed_t *ks, size_t m, int join, unit_t *u)
{
    size_t nu = 0;
    for (size_t k = 0; k < m; k++) {
        const wsync_cuda_op_t *op = &t[ks[k].i];
        const uintptr_t s = (uintptr_t)op->src, d = (uintptr_t)op->dst;
        unit_t *last = nu > 0 ? &u[nu - 1] : NULL;
        if (join && last != NULL && last->src + last->bytes == s && last->dst + last->bytes == d) {
            last->bytes += op_bytes(op);
            last->count++;
            continue;
        }
        u[nu++] = (unit_t){s, d, op_bytes(op), k, 1};
    }
    return nu;
}

/* How many units from r[0] on (r: units in destination order) form one strided run. */
static size_t run_length(const unit_t *const *r, size_t left)
{
    if (left < 2)
        return 1;
    const uint64_t b = r[0]->bytes;
    if (r[1]->bytes != b || r[1]->src <= r[0]->src || r[1]->dst <= r[0]->dst)
        return 1;
    const uint64_t sp = r[1]->src - r[0]->src, dp = r[1]->dst - r[0]->dst;
    if (sp < b || dp < b || sp > WSYNC_CUDA_MAX_RUN_PITCH || dp > WSYNC_CUDA_MAX_RUN_PITCH)
        return 1;
    size_t k = 2;
    while (k < left && r[k]->bytes == b && r[k]->src - r[k - 1]->src == sp &&
           r[k]->dst - r[k - 1]->dst == dp && r[k]->src > r[k - 1]->src &&
           r[k]->dst > r[k - 1]->dst)
        k++;
    return k;
}

/* Append a group of the units r[0..k) (as one copy), or of one op alone (unit NULL). */
static void add_group(wsync_cuda_groups_t *g, const wsync_cuda_op_t *t, const keyed_t *ks,
                      const unit_t *const *r, size_t k, size_t one)
{
    wsync_cuda_group_t *x = &g->g[g->n++];
    x->first = g->n_member;
    x->order = SIZE_MAX;
    if (r == NULL) {
        x->op = t[one];
        x->count = 1;
        x->order = one;
        g->member[g->n_member++] = one;
        return;
    }
    const uint64_t sp = k > 1 ? r[1]->src - r[0]->src : r[0]->bytes;
    const uint64_t dp = k > 1 ? r[1]->dst - r[0]->dst : r[0]->bytes;
    wsync_cuda_plan_op(&x->op, (const void *)r[0]->src, (void *)r[0]->dst, sp, dp, k, r[0]->bytes,
                       0, 0);
    x->count = 0;
    for (size_t j = 0; j < k; j++)
        for (size_t c = 0; c < r[j]->count; c++) {
            const size_t i = ks[r[j]->first + c].i;
            g->member[g->n_member++] = i;
            x->order = i < x->order ? i : x->order;
            x->count++;
        }
}

static int by_order(const void *a, const void *b)
{
    const wsync_cuda_group_t *x = a, *y = b;
    return (x->order > y->order) - (x->order < y->order);
}

/* Whether the first k units of r, as one copy, lie in one allocation on each side (a single op
 * always does). */
static int span_ok(const unit_t *const *r, size_t k, wsync_cuda_one_alloc_fn one_alloc)
{
    const unit_t *a = r[0], *z = r[k - 1];
    if (k == 1 && a->count == 1)
        return 1;
    return one_alloc((const void *)a->src, (const void *)(z->src + z->bytes - 1)) &&
           one_alloc((const void *)a->dst, (const void *)(z->dst + z->bytes - 1));
}

/* Each run of units becomes a group, cut where an allocation ends (the longest prefix that lies
 * in one allocation on each side, found by bisection); a unit that itself spans two allocations
 * gives its ops a group each. */
static void make_groups(wsync_cuda_groups_t *g, const wsync_cuda_op_t *t, const keyed_t *ks,
                        const unit_t *const *r, size_t nu, wsync_cuda_one_alloc_fn one_alloc)
{
    for (size_t j = 0; j < nu;) {
        size_t k = one_alloc != NULL ? run_length(r + j, nu - j) : 1;
        if (one_alloc != NULL && !span_ok(r + j, k, one_alloc)) {
            size_t lo = 0, hi = k; /* ok(lo) (0: trivially), !ok(hi) */
            while (hi - lo > 1) {
                const size_t mid = lo + (hi - lo) / 2;
                if (span_ok(r + j, mid, one_alloc))
                    lo = mid;
                else
                    hi = mid;
            }
            k = lo;
        }
        if (k == 0) {
            for (size_t c = 0; c < r[j]->count; c++)
                add_group(g, t, ks, NULL, 0, ks[r[j]->first + c].i);
            j++;
            continue;
        }
        add_group(g, t, ks, r + j, k, 0);
        j += k;
    }
}

wsync_result_t wsync_cuda_groups(const wsync_cuda_op_t *t, size_t n,
                                 wsync_cuda_one_alloc_fn one_alloc, wsync_cuda_groups_t *g,
                                 wsync_error_t *err)
{
    memset(g, 0, sizeof(*g));
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += t[i].rows == 1 && op_bytes(&t[i]) > 0;
    if (m == 0)
        return WSYNC_OK;
    keyed_t *ks = malloc(m * sizeof(*ks)), *kd = malloc(m * sizeof(*kd));
    unit_t *u = malloc(m * sizeof(*u));
    const unit_t **r = malloc(m * sizeof(*r));
    g->g = malloc(m * sizeof(*g->g));
    g->member = malloc(m * sizeof(*g->member));
    if (!ks || !kd || !u || !r || !g->g || !g->member) {
        free(ks), free(kd), free(u), free(r);
        wsync_cuda_groups_free(g);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to group %zu copy ops", m);
    }
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (t[i].rows == 1 && op_bytes(&t[i]) > 0)
            ks[m++] = (keyed_t){(uintptr_t)t[i].src, i};
    qsort(ks, m, sizeof(*ks), by_key);
    const size_t nu = make_units(t, ks, m, one_alloc != NULL, u);
    for (size_t j = 0; j < nu; j++)
        kd[j] = (keyed_t){u[j].dst, j};
    qsort(kd, nu, sizeof(*kd), by_key);
    for (size_t j = 0; j < nu; j++)
        r[j] = &u[kd[j].i];
    make_groups(g, t, ks, r, nu, one_alloc);
    qsort(g->g, g->n, sizeof(*g->g), by_order);
    free(ks), free(kd), free(u), free(r);
    return WSYNC_OK;
}

void wsync_cuda_groups_free(wsync_cuda_groups_t *g)
{
    free(g->g);
    free(g->member);
    memset(g, 0, sizeof(*g));
}
