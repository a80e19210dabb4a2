/* Resharding plans (see wsync_reshard.h). */
#include "wsync_reshard.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_error.h"

/* A rectangle of a tensor, in elements. */
typedef struct rect {
    int64_t r0, rows, c0, cols;
} rect_t;

static int64_t rect_area(const rect_t *a)
{
    return a->rows * a->cols;
}

static rect_t rect_meet(const rect_t *a, const rect_t *b)
{
    const int64_t r0 = a->r0 > b->r0 ? a->r0 : b->r0, c0 = a->c0 > b->c0 ? a->c0 : b->c0;
    const int64_t r1 = a->r0 + a->rows < b->r0 + b->rows ? a->r0 + a->rows : b->r0 + b->rows;
    const int64_t c1 = a->c0 + a->cols < b->c0 + b->cols ? a->c0 + a->cols : b->c0 + b->cols;
    rect_t m = {r0, r1 > r0 ? r1 - r0 : 0, c0, c1 > c0 ? c1 - c0 : 0};
    if (m.rows == 0 || m.cols == 0)
        m.rows = m.cols = 0;
    return m;
}

static int same_rect(const wsync_reshard_piece_t *a, const wsync_reshard_piece_t *b)
{
    return a->r0 == b->r0 && a->c0 == b->c0 && a->rows == b->rows && a->cols == b->cols;
}

static rect_t piece_rect(const wsync_reshard_piece_t *p)
{
    return (rect_t){p->r0, p->rows, p->c0, p->cols};
}

/* A tensor as rows x cols elements (a 1-D tensor is one row); 0 for more than two dims. */
static int tensor_dims(const wsync_tensor_desc_t *t, int64_t *rows, int64_t *cols)
{
    if (t->ndim == 1) {
        *rows = 1, *cols = t->shape[0];
        return 1;
    }
    if (t->ndim == 2) {
        *rows = t->shape[0], *cols = t->shape[1];
        return 1;
    }
    return 0;
}

static wsync_reshard_link_t link_of(wsync_reshard_place_t a, wsync_reshard_place_t b)
{
    return a.gpu == b.gpu     ? WSYNC_LINK_LOCAL
           : a.node == b.node ? WSYNC_LINK_NVLINK
                              : WSYNC_LINK_NET;
}

static int piece_cmp(const void *x, const void *y)
{
    const wsync_reshard_piece_t *a = *(const wsync_reshard_piece_t *const *)x;
    const wsync_reshard_piece_t *b = *(const wsync_reshard_piece_t *const *)y;
    const int64_t ka[5] = {(int64_t)a->tensor, a->r0, a->c0, a->rows, a->cols};
    const int64_t kb[5] = {(int64_t)b->tensor, b->r0, b->c0, b->rows, b->cols};
    for (int i = 0; i < 5; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

struct wsync_reshard_index {
    const wsync_reshard_piece_t **sorted; /* by tensor, rectangle, rank */
    size_t *first;                        /* tensor t's: sorted[first[t] .. first[t + 1]) */
};

/* The pieces sorted by tensor, rectangle and rank; first[t]..first[t + 1] are tensor t's. */
static wsync_result_t index_pieces(const wsync_reshard_src_t *src,
                                   const wsync_reshard_piece_t ***sorted, size_t **first,
                                   wsync_error_t *err)
{
    const wsync_reshard_piece_t **s = malloc((src->n_pieces + 1) * sizeof(*s));
    size_t *f = calloc(src->n_tensors + 1, sizeof(*f));
    if (s == NULL || f == NULL) {
        free(s);
        free(f);
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "reshard: %zu pieces", src->n_pieces);
    }
    for (size_t i = 0; i < src->n_pieces; i++) {
        const wsync_reshard_piece_t *p = &src->pieces[i];
        int64_t rows = 0, cols = 0;
        if (p->tensor >= src->n_tensors || p->rank >= src->n_ranks ||
            !tensor_dims(&src->tensors[p->tensor], &rows, &cols) || p->r0 < 0 || p->c0 < 0 ||
            p->rows < 0 || p->cols < 0 || p->r0 + p->rows > rows || p->c0 + p->cols > cols) {
            free(s);
            free(f);
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "reshard: piece %zu (rank %u, tensor %zu) lies outside its tensor "
                                "or names no tensor or rank",
                                i, p->rank, p->tensor);
        }
        s[i] = p;
        f[p->tensor + 1]++;
    }
    qsort(s, src->n_pieces, sizeof(*s), piece_cmp);
    for (size_t t = 0; t < src->n_tensors; t++)
        f[t + 1] += f[t];
    *sorted = s;
    *first = f;
    return WSYNC_OK;
}

typedef struct plan_out {
    wsync_reshard_op_t *ops;
    size_t n, cap;
} plan_out_t;

static wsync_result_t emit(plan_out_t *o, const wsync_reshard_op_t *op, wsync_error_t *err)
{
    if (o->n == o->cap) {
        const size_t cap = o->cap ? 2 * o->cap : 256;
        wsync_reshard_op_t *g = realloc(o->ops, cap * sizeof(*g));
        if (g == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "reshard: %zu ops", cap);
        o->ops = g, o->cap = cap;
    }
    o->ops[o->n++] = *op;
    return WSYNC_OK;
}

/* The ops of tensor `i` for rectangle `want` (placed by `dst`): the nearest replica of each
 * distinct piece that meets it, checked to cover it exactly. */
static wsync_result_t plan_tensor(const wsync_reshard_src_t *src,
                                  const wsync_reshard_piece_t *const *p, size_t np, size_t i,
                                  const rect_t *want, const wsync_copy_op_t *dst, size_t es,
                                  wsync_reshard_place_t where, plan_out_t *out, wsync_error_t *err)
{
    const char *name = src->tensors[i].name;
    const uint64_t dpitch = dst->rows > 1 ? dst->dst_pitch : dst->row_bytes;
    int64_t covered = 0;
    for (size_t k = 0; k < np;) {
        size_t end = k + 1; /* replicas: the same rectangle, ranks ascending */
        while (end < np && same_rect(p[end], p[k]))
            end++;
        const rect_t pr = piece_rect(p[k]), m = rect_meet(&pr, want);
        if (rect_area(&m) > 0) {
            /* the nearest replicas; among them the engine ranks take turns (by GPU), so no
             * one replica serves every rank */
            wsync_reshard_link_t near = WSYNC_LINK_NET;
            size_t count = 0;
            for (size_t j = k; j < end; j++) {
                const wsync_reshard_link_t l = link_of(src->place[p[j]->rank], where);
                if (l < near)
                    near = l, count = 0;
                count += l == near;
            }
            size_t pick = where.gpu % count, best = k;
            for (size_t j = k; j < end; j++)
                if (link_of(src->place[p[j]->rank], where) == near && pick-- == 0) {
                    best = j;
                    break;
                }
            const wsync_reshard_piece_t *b = p[best];
            wsync_reshard_op_t op = {
                .src_rank = b->rank,
                .tensor = i,
                .link = link_of(src->place[b->rank], where),
                .op = {.src_offset = b->offset + (uint64_t)(m.r0 - b->r0) * b->pitch +
                                     (uint64_t)(m.c0 - b->c0) * es,
                       .src_pitch = b->pitch,
                       .dst = (unsigned char *)dst->dst + (uint64_t)(m.r0 - want->r0) * dpitch +
                              (uint64_t)(m.c0 - want->c0) * es,
                       .dst_pitch = dpitch,
                       .rows = (uint64_t)m.rows,
                       .row_bytes = (uint64_t)m.cols * es}};
            op.op.dst_extent = dst->dst_extent -
                               (uint64_t)((unsigned char *)op.op.dst - (unsigned char *)dst->dst);
            wsync_result_t rc = emit(out, &op, err);
            if (rc != WSYNC_OK)
                return rc;
            covered += rect_area(&m);
        }
        k = end;
    }
    if (covered != rect_area(want))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "reshard: tensor %s: the engine rank needs rows [%lld, %lld) x "
                            "columns [%lld, %lld); the trainer's pieces cover %lld of its %lld "
                            "elements%s",
                            name, (long long)want->r0, (long long)(want->r0 + want->rows),
                            (long long)want->c0, (long long)(want->c0 + want->cols),
                            (long long)covered, (long long)rect_area(want),
                            covered > rect_area(want) ? " (pieces overlap)" : "");
    return WSYNC_OK;
}

/* Distinct pieces of one tensor that overlap without being equal: refused naming the tensor.
 * Replicas (equal rectangles) sit next to each other in the sorted order; pieces are sorted by
 * first row, so the scan after piece a stops at the first that starts below a's last row. */
static wsync_result_t check_disjoint(const wsync_reshard_src_t *src,
                                     const wsync_reshard_piece_t *const *p, size_t np,
                                     wsync_error_t *err)
{
    for (size_t a = 0; a < np; a++) {
        if (a > 0 && same_rect(p[a - 1], p[a]))
            continue;
        const rect_t ra = piece_rect(p[a]);
        for (size_t b = a + 1; b < np && p[b]->r0 < p[a]->r0 + p[a]->rows; b++) {
            if (p[a]->rows == 1 && p[b]->r0 == p[a]->r0 && p[b]->c0 >= p[a]->c0 + p[a]->cols)
                break; /* one row: sorted by column, nothing later meets a */
            const rect_t rb = piece_rect(p[b]), m = rect_meet(&ra, &rb);
            if (rect_area(&m) > 0 && !same_rect(p[a], p[b]))
                return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                    "reshard: tensor %s: the pieces of trainer ranks %u and %u "
                                    "overlap without being the same rectangle",
                                    src->tensors[p[a]->tensor].name, p[a]->rank, p[b]->rank);
        }
    }
    return WSYNC_OK;
}

wsync_result_t wsync_reshard_index_build(const wsync_reshard_src_t *src,
                                         wsync_reshard_index_t **out, wsync_error_t *err)
{
    if (src == NULL || out == NULL || (src->n_tensors > 0 && src->tensors == NULL) ||
        (src->n_pieces > 0 && src->pieces == NULL) || (src->n_ranks > 0 && src->place == NULL))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "reshard: NULL argument");
    wsync_reshard_index_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "reshard: out of memory");
    wsync_result_t rc = index_pieces(src, &x->sorted, &x->first, err);
    for (size_t i = 0; i < src->n_tensors && rc == WSYNC_OK; i++)
        rc = check_disjoint(src, x->sorted + x->first[i], x->first[i + 1] - x->first[i], err);
    if (rc != WSYNC_OK) {
        wsync_reshard_index_free(x);
        return rc;
    }
    *out = x;
    return WSYNC_OK;
}

void wsync_reshard_index_free(wsync_reshard_index_t *x)
{
    if (x == NULL)
        return;
    free(x->sorted);
    free(x->first);
    free(x);
}

wsync_result_t wsync_reshard_plan(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                                  wsync_reshard_place_t where, const wsync_reshard_src_t *src,
                                  wsync_reshard_op_t **ops, size_t *n_ops, wsync_error_t *err)
{
    wsync_reshard_index_t *x = NULL;
    wsync_result_t rc = wsync_reshard_index_build(src, &x, err);
    if (rc == WSYNC_OK)
        rc = wsync_reshard_plan_indexed(table, eng, where, src, x, ops, n_ops, err);
    wsync_reshard_index_free(x);
    return rc;
}

wsync_result_t wsync_reshard_plan_indexed(const wsync_map_table_t *table,
                                          const wsync_engine_ops_t *eng,
                                          wsync_reshard_place_t where,
                                          const wsync_reshard_src_t *src,
                                          const wsync_reshard_index_t *x, wsync_reshard_op_t **ops,
                                          size_t *n_ops, wsync_error_t *err)
{
    if (table == NULL || eng == NULL || src == NULL || x == NULL || ops == NULL || n_ops == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "reshard: NULL argument");
    *ops = NULL;
    *n_ops = 0;
    wsync_result_t rc = WSYNC_OK;
    plan_out_t out = {0};
    for (size_t i = 0; i < src->n_tensors && rc == WSYNC_OK; i++) {
        const wsync_tensor_desc_t *t = &src->tensors[i];
        int64_t rows = 0, cols = 0;
        const size_t es = wsync_dtype_size(t->dtype);
        if (!tensor_dims(t, &rows, &cols) || es == 0) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                              "reshard: tensor %s has %u dims or dtype %d; plans take 1-D and 2-D "
                              "tensors of a sized dtype",
                              t->name, t->ndim, (int)t->dtype);
            break;
        }
        if (!wsync_map_owned(table, eng, t->name))
            continue; /* another EP rank's expert: nothing of it is read */
        wsync_tensor_desc_t whole = *t;
        whole.offset = 0;
        whole.nbytes = (uint64_t)(rows * cols) * es;
        wsync_copy_op_t dst;
        if ((rc = wsync_map_plan(table, eng, &whole, &dst, err)) != WSYNC_OK)
            break;
        if (dst.rows == 0 || dst.row_bytes == 0)
            continue;
        const uint64_t pitch = (uint64_t)cols * es;
        if (dst.rows == 1 && dst.row_bytes > pitch) {
            /* a run of whole rows planned as one flat op (column-parallel): as rows */
            if (dst.src_offset % pitch != 0 || dst.row_bytes % pitch != 0) {
                rc = WSYNC_RECORD(err, WSYNC_ERR_INTERNAL,
                                  "reshard: tensor %s: a flat op of %llu bytes at %llu is not "
                                  "whole rows of %llu bytes",
                                  t->name, (unsigned long long)dst.row_bytes,
                                  (unsigned long long)dst.src_offset, (unsigned long long)pitch);
                break;
            }
            dst.rows = dst.row_bytes / pitch;
            dst.row_bytes = dst.dst_pitch = dst.src_pitch = pitch;
        }
        const rect_t want = {(int64_t)(dst.src_offset / pitch), (int64_t)dst.rows,
                             (int64_t)((dst.src_offset % pitch) / es),
                             (int64_t)(dst.row_bytes / es)};
        const wsync_reshard_piece_t *const *p = x->sorted + x->first[i];
        rc = plan_tensor(src, p, x->first[i + 1] - x->first[i], i, &want, &dst, es, where, &out,
                         err);
    }
    if (rc != WSYNC_OK) {
        free(out.ops);
        return rc;
    }
    *ops = out.ops;
    *n_ops = out.n;
    return WSYNC_OK;
}

void wsync_reshard_free(void *p)
{
    free(p);
}

void wsync_reshard_count(const wsync_reshard_op_t *ops, size_t n, wsync_reshard_bytes_t *in,
                         uint64_t (*out)[WSYNC_LINKS])
{
    for (size_t i = 0; i < n; i++) {
        const uint64_t b = ops[i].op.rows * ops[i].op.row_bytes;
        if (in != NULL) {
            in->link[ops[i].link] += b;
            in->ops++;
        }
        if (out != NULL)
            out[ops[i].src_rank][ops[i].link] += b;
    }
}
