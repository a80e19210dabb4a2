/* The copy-engine share of a batch of planned ops (see wsync_cuda.h): the largest contiguous
 * copies first (ops joined into copies by wsync_cuda_groups), so the copy engines get few, long
 * copies and the kernel keeps the rest; the copies are dealt over the lanes so each carries about
 * the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"

#define WSYNC_CUDA_OP_CE 0x100u /* transient mark while splitting */

typedef struct by_size {
    uint64_t bytes;
    size_t i;
} by_size_t;

static int larger_first(const void *a, const void *b)
{
    const by_size_t *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (x->i > y->i) - (x->i < y->i);
}

static uint64_t group_bytes(const wsync_cuda_group_t *g)
{
    return g->op.rows * g->op.row_bytes;
}

/* The taken groups (lane[k] >= 0) dealt over the lanes, largest first to the least loaded lane;
 * -1 without memory. */
static int deal(const wsync_cuda_groups_t *g, int *lane, size_t n_ce, int lanes,
                wsync_cuda_split_t *out)
{
    by_size_t *v = malloc(n_ce * sizeof(*v));
    if (v == NULL)
        return -1;
    size_t m = 0;
    for (size_t i = 0; i < g->n; i++)
        if (lane[i] >= 0)
            v[m++] = (by_size_t){group_bytes(&g->g[i]), i};
    qsort(v, m, sizeof(*v), larger_first);
    uint64_t load[WSYNC_CUDA_MAX_LANES] = {0};
    for (size_t r = 0; r < m; r++) {
        int k = 0;
        for (int j = 1; j < lanes; j++)
            k = load[j] < load[k] ? j : k;
        load[k] += v[r].bytes;
        out->lane_n[k]++;
        lane[v[r].i] = k;
    }
    free(v);
    return 0;
}

/* Take groups by size class, largest first (within one, in order), up to target bytes; lane[i]
 * becomes 0 for a taken group. Returns the count. */
static size_t take(const wsync_cuda_groups_t *g, int *lane, uint64_t target, uint64_t min_bytes,
                   uint64_t *taken)
{
    static const uint64_t classes[] = {
        256ull << 20, 64ull << 20, 16ull << 20, 4ull << 20, 1ull << 20, 256ull << 10, 0};
    size_t n_ce = 0;
    for (size_t k = 0; k < sizeof(classes) / sizeof(classes[0]) && *taken < target; k++) {
        const uint64_t floor = classes[k] > min_bytes ? classes[k] : min_bytes;
        for (size_t i = 0; i < g->n && *taken < target; i++) {
            const uint64_t b = group_bytes(&g->g[i]);
            if (lane[i] >= 0 || b < floor)
                continue;
            lane[i] = 0;
            *taken += b;
            n_ce++;
        }
        if (floor == min_bytes)
            break;
    }
    return n_ce;
}

/* Group x goes to the copy engines: its table ops marked and counted. */
static void mark(const wsync_cuda_groups_t *g, const wsync_cuda_group_t *x, wsync_cuda_op_t *table,
                 wsync_cuda_split_t *out)
{
    for (size_t c = 0; c < x->count; c++)
        table[g->member[x->first + c]].flags |= WSYNC_CUDA_OP_CE;
    out->ce_ops += x->count;
}

/* The copy engines' copies lane after lane (each lane in group order), their table ops marked. */
static void place(const wsync_cuda_groups_t *g, const int *lane, wsync_cuda_op_t *table,
                  wsync_cuda_split_t *out)
{
    size_t at[WSYNC_CUDA_MAX_LANES];
    for (int k = 0, sum = 0; k < WSYNC_CUDA_MAX_LANES; sum += (int)out->lane_n[k], k++)
        at[k] = (size_t)sum;
    for (size_t i = 0; i < g->n; i++) {
        if (lane[i] < 0)
            continue;
        const wsync_cuda_group_t *x = &g->g[i];
        out->ce[at[lane[i]]++] = x->op;
        out->n_ce++;
        mark(g, x, table, out);
    }
}

/* The taken groups' copies in op order filling lane after lane, each lane to total / lanes bytes
 * (rounded up to 1 MiB), a 1-D copy cut at a 1 MiB multiple where its lane is full (the last lane
 * takes what is left); their table ops marked. -1 without memory. */
static int place_balanced(const wsync_cuda_groups_t *g, const int *lane, size_t n_ce, int lanes,
                          wsync_cuda_op_t *table, wsync_cuda_split_t *out)
{
    const uint64_t unit = 1ull << 20;
    out->ce = malloc((n_ce + (size_t)lanes) * sizeof(*out->ce)); /* lanes - 1 cuts at most */
    if (out->ce == NULL)
        return -1;
    uint64_t total = 0;
    for (size_t i = 0; i < g->n; i++)
        total += lane[i] >= 0 ? group_bytes(&g->g[i]) : 0;
    const uint64_t share = (total / (uint64_t)lanes + unit - 1) / unit * unit;
    int k = 0;
    uint64_t load = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (lane[i] < 0)
            continue;
        const wsync_cuda_group_t *x = &g->g[i];
        mark(g, x, table, out);
        wsync_cuda_op_t op = x->op;
        for (;;) {
            const uint64_t left = op.rows * op.row_bytes;
            const uint64_t room = share > load ? share - load : 0;
            if (k < lanes - 1 && room < unit) { /* this lane is full */
                k++;
                load = 0;
                continue;
            }
            if (k == lanes - 1 || op.rows != 1 || left <= room) { /* the rest of it here */
                out->ce[out->n_ce++] = op;
                out->lane_n[k]++;
                load += left;
                break;
            }
            wsync_cuda_op_t head = op; /* a 1-D copy cut where the lane is full */
            head.row_bytes = room / unit * unit;
            out->ce[out->n_ce++] = head;
            out->lane_n[k++]++;
            load = 0;
            op.src += head.row_bytes;
            op.dst += head.row_bytes;
            op.row_bytes -= head.row_bytes;
        }
    }
    return 0;
}

wsync_result_t wsync_cuda_split(wsync_cuda_op_t *table, size_t n, const wsync_cuda_split_cfg_t *cfg,
                                wsync_cuda_split_t *out, wsync_error_t *err)
{
    const int lanes = cfg->lanes < 1                      ? 1
                      : cfg->lanes > WSYNC_CUDA_MAX_LANES ? WSYNC_CUDA_MAX_LANES
                                                          : cfg->lanes;
    memset(out, 0, sizeof(*out));
    out->n_kernel = n;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += table[i].chunk_end > table[i].chunk_begin ? table[i].rows * table[i].row_bytes : 0;
        out->chunks = table[i].chunk_end > out->chunks ? table[i].chunk_end : out->chunks;
    }
    if (!(cfg->share > 0) || total == 0)
        return WSYNC_OK;
    const uint64_t target = cfg->share >= 1 ? total : (uint64_t)((double)total * cfg->share);
    wsync_cuda_groups_t g;
    wsync_result_t rc = wsync_cuda_groups(table, n, cfg->range, cfg->min_bytes, &g, err);
    if (rc != WSYNC_OK)
        return rc;
    int *lane = malloc((g.n ? g.n : 1) * sizeof(*lane));
    size_t n_ce = 0;
    if (lane != NULL) {
        for (size_t i = 0; i < g.n; i++)
            lane[i] = -1;
        n_ce = take(&g, lane, target, cfg->min_bytes, &out->ce_bytes);
    }
    if (lane != NULL && n_ce > 0 && cfg->balance && lanes > 1) {
        if (place_balanced(&g, lane, n_ce, lanes, table, out) != 0)
            out->ce = NULL;
    } else if (lane != NULL && n_ce > 0) {
        out->ce = malloc(n_ce * sizeof(*out->ce));
        if (out->ce != NULL && deal(&g, lane, n_ce, lanes, out) != 0) {
            free(out->ce);
            out->ce = NULL;
        }
        if (out->ce != NULL)
            place(&g, lane, table, out);
    }
    wsync_cuda_groups_free(&g);
    free(lane);
    if (lane == NULL || (n_ce > 0 && out->ce == NULL)) {
        memset(out->lane_n, 0, sizeof(out->lane_n));
        out->ce_bytes = 0;
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu copy-engine copies",
                          n_ce);
    }
    if (n_ce == 0) {
        out->ce_bytes = 0;
        return WSYNC_OK;
    }
    /* compact: kernel ops keep their order and get consecutive chunk numbers */
    size_t kk = 0;
    uint64_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        wsync_cuda_op_t op = table[i];
        if (op.flags & WSYNC_CUDA_OP_CE)
            continue;
        const uint64_t span = op.chunk_end - op.chunk_begin;
        op.chunk_begin = chunks;
        op.chunk_end = chunks + span;
        chunks += span;
        table[kk++] = op;
    }
    out->n_kernel = kk;
    out->chunks = chunks;
    return WSYNC_OK;
}
