/* The copy-engine share of a batch of planned ops (see wsync_cuda.h): largest contiguous ops
 * first, so the copy engines get few, long copies and the kernel keeps the rest; the copy
 * engines' ops are dealt over the lanes so each carries about the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"

#define WSYNC_CUDA_OP_CE 0x100u /* transient mark while splitting, the lane in the bits above */
#define WSYNC_CUDA_OP_LANE_SHIFT 9
#define WSYNC_CUDA_OP_SPLIT_MASK (0xffu << 8)

static uint64_t op_bytes(const wsync_cuda_op_t *op)
{
    return op->chunk_end > op->chunk_begin ? op->rows * op->row_bytes : 0;
}

typedef struct by_size {
    uint64_t bytes;
    size_t i;
} by_size_t;

static int larger_first(const void *a, const void *b)
{
    const by_size_t *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (x->i > y->i) - (x->i < y->i);
}

/* Deal the n_ce marked ops over the lanes, largest first to the least loaded lane (the lane
 * goes into the mark). -1 without memory. */
static int deal(wsync_cuda_op_t *table, size_t n, size_t n_ce, int lanes, wsync_cuda_split_t *out)
{
    by_size_t *v = malloc(n_ce * sizeof(*v));
    if (v == NULL)
        return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (table[i].flags & WSYNC_CUDA_OP_CE)
            v[m++] = (by_size_t){op_bytes(&table[i]), i};
    qsort(v, m, sizeof(*v), larger_first);
    uint64_t load[WSYNC_CUDA_MAX_LANES] = {0};
    for (size_t r = 0; r < m; r++) {
        int lane = 0;
        for (int k = 1; k < lanes; k++)
            lane = load[k] < load[lane] ? k : lane;
        load[lane] += v[r].bytes;
        out->lane_n[lane]++;
        table[v[r].i].flags |= (uint32_t)lane << WSYNC_CUDA_OP_LANE_SHIFT;
    }
    free(v);
    return 0;
}

wsync_result_t wsync_cuda_split(wsync_cuda_op_t *table, size_t n, double share, uint64_t min_bytes,
                                int lanes, wsync_cuda_split_t *out, wsync_error_t *err)
{
    lanes = lanes < 1 ? 1 : lanes > WSYNC_CUDA_MAX_LANES ? WSYNC_CUDA_MAX_LANES : lanes;
    memset(out, 0, sizeof(*out));
    out->n_kernel = n;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += op_bytes(&table[i]);
        out->chunks = table[i].chunk_end > out->chunks ? table[i].chunk_end : out->chunks;
    }
    if (!(share > 0) || total == 0)
        return WSYNC_OK;
    const uint64_t target = share >= 1 ? total : (uint64_t)((double)total * share);
    /* size classes, largest first; within one, op order */
    static const uint64_t classes[] = {
        256ull << 20, 64ull << 20, 16ull << 20, 4ull << 20, 1ull << 20, 256ull << 10, 0};
    uint64_t taken = 0;
    size_t n_ce = 0;
    for (size_t k = 0; k < sizeof(classes) / sizeof(classes[0]) && taken < target; k++) {
        const uint64_t floor = classes[k] > min_bytes ? classes[k] : min_bytes;
        for (size_t i = 0; i < n && taken < target; i++) {
            wsync_cuda_op_t *op = &table[i];
            const uint64_t b = op_bytes(op);
            if ((op->flags & WSYNC_CUDA_OP_CE) || op->rows != 1 || b < floor || b == 0)
                continue;
            op->flags |= WSYNC_CUDA_OP_CE;
            taken += b;
            n_ce++;
        }
        if (floor == min_bytes)
            break;
    }
    if (n_ce == 0)
        return WSYNC_OK;
    out->ce = malloc(n_ce * sizeof(*out->ce));
    if (out->ce != NULL && deal(table, n, n_ce, lanes, out) != 0) {
        free(out->ce);
        out->ce = NULL;
    }
    if (out->ce == NULL) {
        for (size_t i = 0; i < n; i++)
            table[i].flags &= ~WSYNC_CUDA_OP_SPLIT_MASK;
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu copy-engine ops", n_ce);
    }
    /* the copy engines' ops lane after lane, each lane in op order; compact: kernel ops keep
     * their order and get consecutive chunk numbers */
    size_t at[WSYNC_CUDA_MAX_LANES];
    for (int k = 0, sum = 0; k < WSYNC_CUDA_MAX_LANES; sum += (int)out->lane_n[k], k++)
        at[k] = (size_t)sum;
    size_t kk = 0;
    uint64_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        wsync_cuda_op_t op = table[i];
        if (op.flags & WSYNC_CUDA_OP_CE) {
            const unsigned lane = (op.flags >> WSYNC_CUDA_OP_LANE_SHIFT) & 0x7fu;
            op.flags &= ~WSYNC_CUDA_OP_SPLIT_MASK;
            out->ce[at[lane]++] = op;
            out->n_ce++;
            continue;
        }
        const uint64_t span = op.chunk_end - op.chunk_begin;
        op.chunk_begin = chunks;
        op.chunk_end = chunks + span;
        chunks += span;
        table[kk++] = op;
    }
    out->n_kernel = kk;
    out->chunks = chunks;
    out->ce_bytes = taken;
    return WSYNC_OK;
}

/* Measured on one H200 (docs/PERFORMANCE.md, wsync-bench-cuda --lanes). */
#define WSYNC_CUDA_CE_SHARE_DEFAULT 1.0
#define WSYNC_CUDA_CE_MIN_BYTES_DEFAULT (16ull << 20)
#define WSYNC_CUDA_CE_LANES_DEFAULT 2

double wsync_cuda_ce_share(void)
{
    const char *v = getenv("WSYNC_CUDA_CE_SHARE");
    if (v == NULL || *v == '\0')
        return WSYNC_CUDA_CE_SHARE_DEFAULT;
    double x = strtod(v, NULL);
    return x < 0 ? 0 : x > 1 ? 1 : x;
}

uint64_t wsync_cuda_ce_min_bytes(void)
{
    const char *v = getenv("WSYNC_CUDA_CE_MIN_BYTES");
    return v != NULL && *v != '\0' ? strtoull(v, NULL, 10) : WSYNC_CUDA_CE_MIN_BYTES_DEFAULT;
}

int wsync_cuda_ce_lanes(void)
{
    const char *v = getenv("WSYNC_CUDA_CE_LANES");
    if (v == NULL || *v == '\0')
        return WSYNC_CUDA_CE_LANES_DEFAULT;
    long x = strtol(v, NULL, 10);
    return x < 1 ? 1 : x > WSYNC_CUDA_MAX_LANES ? WSYNC_CUDA_MAX_LANES : (int)x;
}
