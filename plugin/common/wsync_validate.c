/* Edge validation of copy ops and generations (docs/DESIGN.md §2: validate completely before any
 * byte is written). Pure functions, thread safe, except that a consumer's memo (wsync_validate.h)
 * takes one caller at a time. */
#include "wsync_validate.h"

#include "wsync_fp8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_cache.h"

#include <stdio.h>

#include "wsync_error.h"

/* Byte just past the last one a 2-D region touches: start + (rows-1)*pitch + row_bytes. */
static int wsync_region_end(uint64_t start, uint64_t rows, uint64_t pitch, uint64_t row_bytes,
                            uint64_t *end)
{
    uint64_t span;
    if (__builtin_mul_overflow(rows - 1, pitch, &span) ||
        __builtin_add_overflow(span, row_bytes, &span) || __builtin_add_overflow(start, span, end))
        return -1;
    return 0;
}

static wsync_result_t wsync_validate_op(const wsync_copy_op_t *op, size_t i, uint64_t src_bytes,
                                        wsync_error_t *err)
{
    uint64_t end;

    if (op->rows == 0 || op->row_bytes == 0)
        return WSYNC_OK; /* moves nothing: an empty tensor */
    if (op->dst == NULL)
        return WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, i,
                             "op %zu: dst is NULL but the op moves %llu x %llu bytes", i,
                             (unsigned long long)op->rows, (unsigned long long)op->row_bytes);
    uint64_t src_pitch = op->rows > 1 ? op->src_pitch : op->row_bytes;
    uint64_t dst_pitch = op->rows > 1 ? op->dst_pitch : op->row_bytes;
    if (src_pitch < op->row_bytes || dst_pitch < op->row_bytes)
        return WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, i,
                             "op %zu: src_pitch %llu / dst_pitch %llu smaller than row_bytes %llu "
                             "with %llu rows; rows would overlap",
                             i, (unsigned long long)op->src_pitch,
                             (unsigned long long)op->dst_pitch, (unsigned long long)op->row_bytes,
                             (unsigned long long)op->rows);

    if (wsync_region_end(op->src_offset, op->rows, src_pitch, op->row_bytes, &end) != 0)
        return WSYNC_FAIL_OP(
            err, WSYNC_ERR_OUT_OF_BOUNDS, i,
            "op %zu: src_offset %llu + (rows %llu - 1) x src_pitch %llu + row_bytes "
            "%llu overflows 64 bits",
            i, (unsigned long long)op->src_offset, (unsigned long long)op->rows,
            (unsigned long long)src_pitch, (unsigned long long)op->row_bytes);
    if (end > src_bytes)
        return WSYNC_FAIL_OP(err, WSYNC_ERR_OUT_OF_BOUNDS, i,
                             "op %zu: source bytes [%llu, %llu) exceed the buffer's %llu bytes "
                             "(src_offset %llu, rows %llu, src_pitch %llu, row_bytes %llu)",
                             i, (unsigned long long)op->src_offset, (unsigned long long)end,
                             (unsigned long long)src_bytes, (unsigned long long)op->src_offset,
                             (unsigned long long)op->rows, (unsigned long long)src_pitch,
                             (unsigned long long)op->row_bytes);

    if (wsync_region_end(0, op->rows, dst_pitch, op->row_bytes, &end) != 0)
        return WSYNC_FAIL_OP(err, WSYNC_ERR_OUT_OF_BOUNDS, i,
                             "op %zu: (rows %llu - 1) x dst_pitch %llu + row_bytes %llu overflows "
                             "64 bits",
                             i, (unsigned long long)op->rows, (unsigned long long)dst_pitch,
                             (unsigned long long)op->row_bytes);
    if (end > op->dst_extent)
        return WSYNC_FAIL_OP(
            err, WSYNC_ERR_OUT_OF_BOUNDS, i,
            "op %zu: writes %llu bytes from dst but dst_extent is %llu (rows %llu, "
            "dst_pitch %llu, row_bytes %llu); the destination parameter is too "
            "small",
            i, (unsigned long long)end, (unsigned long long)op->dst_extent,
            (unsigned long long)op->rows, (unsigned long long)dst_pitch,
            (unsigned long long)op->row_bytes);
    return WSYNC_OK;
}

/* The destination bytes of one op: rows of row_bytes, pitch apart, from start (validated). */
typedef struct wsync_dst_span {
    uint64_t start, end, pitch, rows, row_bytes;
    size_t op;
} wsync_dst_span_t;

static int wsync_span_cmp(const void *a, const void *b)
{
    const wsync_dst_span_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : (x->op > y->op) - (x->op < y->op);
}

/* Does row interval [lo, hi) meet any row of s? The rows k with a byte in [lo, hi) satisfy
 * s.start + k pitch < hi and lo < s.start + k pitch + row_bytes. */
static int wsync_span_meets(const wsync_dst_span_t *s, uint64_t lo, uint64_t hi)
{
    if (hi <= s->start || lo >= s->end)
        return 0;
    if (s->rows == 1 || s->pitch == s->row_bytes)
        return 1; /* contiguous: the extents meet */
    /* first row that may end after lo, last row that starts before hi */
    uint64_t k0 = lo + 1 > s->start + s->row_bytes
                      ? (lo + 1 - s->start - s->row_bytes + s->pitch - 1) / s->pitch
                      : 0;
    uint64_t k1 = (hi - 1 - s->start) / s->pitch;
    if (k1 >= s->rows)
        k1 = s->rows - 1;
    return k0 <= k1;
}

/* Do two spans with meeting extents write a common byte? Walk the rows of the one with fewer. */
static int wsync_spans_overlap(const wsync_dst_span_t *a, const wsync_dst_span_t *b)
{
    if (a->rows > b->rows) {
        const wsync_dst_span_t *t = a;
        a = b;
        b = t;
    }
    for (uint64_t k = 0; k < a->rows; k++) {
        uint64_t lo = a->start + k * a->pitch;
        if (lo >= b->end)
            break;
        if (wsync_span_meets(b, lo, lo + a->row_bytes))
            return 1;
    }
    return 0;
}

/* A span array for n ops holding the first m of kept (equal to the spans built so far). */
static wsync_dst_span_t *wsync_spans_from(const wsync_dst_span_t *kept, size_t m, size_t n)
{
    wsync_dst_span_t *s = malloc(n * sizeof(*s));
    if (s != NULL && m > 0)
        memcpy(s, kept, m * sizeof(*s));
    return s;
}

/* The slot kept for spans whose first is x (NULL: none). */
static wsync_validate_kept_t *wsync_memo_find(wsync_validate_memo_t *memo,
                                              const wsync_dst_span_t *x)
{
    for (unsigned k = 0; k < WSYNC_VALIDATE_MEMO_SLOTS; k++) {
        wsync_validate_kept_t *slot = &memo->slot[k];
        if (slot->n > 0 && memcmp(slot->spans, x, sizeof(*x)) == 0)
            return slot;
    }
    return NULL;
}

/* slot holds a copy of s[0..m), not yet valid (n = 0); -1 without memory. */
static int wsync_memo_keep(wsync_validate_kept_t *slot, const wsync_dst_span_t *s, size_t m)
{
    slot->n = 0;
    if (m > slot->cap) {
        void *p = realloc(slot->spans, m * sizeof(*s));
        if (p == NULL)
            return -1;
        slot->spans = p;
        slot->cap = m;
    }
    memcpy(slot->spans, s, m * sizeof(*s));
    return 0;
}

void wsync_validate_memo_free(wsync_validate_memo_t *memo)
{
    if (memo == NULL)
        return;
    for (unsigned k = 0; k < WSYNC_VALIDATE_MEMO_SLOTS; k++) {
        free(memo->slot[k].spans);
        free(memo->call[k].in);
    }
    free(memo->scratch);
    memset(memo, 0, sizeof(*memo));
}

/* No two ops write a common destination byte (on a GPU the result would be undefined). Sorted by
 * start, each op is compared exactly with the earlier ops whose extent reaches it, which for the
 * ops of real plans (disjoint parameters and row ranges) is none. */
/* The block-scale region of op i, with op i's checks, its messages naming "the scales of op i". */
static wsync_result_t wsync_validate_scales(const wsync_copy_op_t *scales, size_t i,
                                            wsync_error_t *err)
{
    wsync_error_t local = {.struct_size = sizeof(local)};
    wsync_result_t r = wsync_validate_op(scales, i, UINT64_MAX, &local);
    if (r == WSYNC_OK)
        return r;
    char head[32];
    const int h = snprintf(head, sizeof(head), "op %zu: ", i);
    const char *rest =
        strncmp(local.message, head, (size_t)h) == 0 ? local.message + h : local.message;
    return WSYNC_FAIL_OP(err, r, i, "the scales of op %zu: %s", i, rest);
}

/* Region k of a disjointness check: op k, or (k >= n_ops) the block scales of op k - n_ops. */
static void wsync_region_name(size_t k, size_t n_ops, char *buf, size_t cap)
{
    if (k < n_ops)
        snprintf(buf, cap, "op %zu", k);
    else
        snprintf(buf, cap, "the scales of op %zu", k - n_ops);
}

static wsync_result_t wsync_validate_disjoint(const wsync_copy_op_t *ops, size_t n, size_t n_ops,
                                              wsync_validate_memo_t *memo, wsync_error_t *err)
{
    if (n < 2)
        return WSYNC_OK;
    /* The spans as built are compared with those kept for the same first span while they
     * agree: no array is made for a call whose spans all equal them. */
    wsync_validate_kept_t *slot = NULL;
    const wsync_dst_span_t *kept = NULL;
    size_t n_kept = 0;
    wsync_dst_span_t *s = NULL;
    size_t m = 0;
    int sorted = 1;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        const wsync_copy_op_t *o = &ops[i];
        if (o->rows == 0 || o->row_bytes == 0)
            continue;
        uint64_t pitch = o->rows > 1 ? o->dst_pitch : o->row_bytes, end = 0;
        uint64_t start = (uint64_t)(uintptr_t)o->dst;
        (void)wsync_region_end(start, o->rows, pitch, o->row_bytes, &end); /* validated */
        const wsync_dst_span_t x = {start, end, pitch, o->rows, o->row_bytes, i};
        if (m == 0 && memo != NULL && (slot = wsync_memo_find(memo, &x)) != NULL) {
            kept = slot->spans;
            n_kept = slot->n;
        }
        sorted &= m == 0 || prev <= start;
        prev = start;
        if (s == NULL && m < n_kept && memcmp(&kept[m], &x, sizeof(x)) == 0) {
            m++;
            continue;
        }
        if (s == NULL && (s = wsync_spans_from(kept, m, n)) == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to check %zu ops", n);
        s[m++] = x;
    }
    if (m == 0 || (s == NULL && m == n_kept))
        return WSYNC_OK; /* no bytes written, or the spans a memo slot found disjoint */
    if (s == NULL && (s = wsync_spans_from(kept, m, n)) == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to check %zu ops", n);
    /* a slot takes these spans in their built order (the one of the same first span, else the
     * next in turn), valid once they pass */
    if (memo != NULL && slot == NULL)
        slot = &memo->slot[memo->next++ % WSYNC_VALIDATE_MEMO_SLOTS];
    if (slot != NULL && wsync_memo_keep(slot, s, m) != 0)
        slot = NULL; /* no memory to keep them (the slot stays invalid) */
    if (!sorted)
        qsort(s, m, sizeof(*s), wsync_span_cmp);
    wsync_result_t rc = WSYNC_OK;
    uint64_t reach = 0; /* the largest end of the spans before */
    for (size_t i = 1; i < m && rc == WSYNC_OK; i++) {
        reach = s[i - 1].end > reach ? s[i - 1].end : reach;
        if (s[i].start >= reach)
            continue; /* nothing before reaches it */
        for (size_t j = i; j-- > 0 && rc == WSYNC_OK;) {
            if (s[j].end > s[i].start && wsync_spans_overlap(&s[j], &s[i])) {
                const size_t a = s[j].op < s[i].op ? s[j].op : s[i].op;
                const size_t b = s[j].op < s[i].op ? s[i].op : s[j].op;
                char na[48], nb[48];
                wsync_region_name(a, n_ops, na, sizeof(na));
                wsync_region_name(b, n_ops, nb, sizeof(nb));
                rc = WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, a < n_ops ? a : a - n_ops,
                                   "%s and %s write overlapping destination bytes (dst %p and %p); "
                                   "each destination byte takes one op",
                                   na, nb, ops[a].dst, ops[b].dst);
            }
        }
    }
    free(s);
    if (slot != NULL && rc == WSYNC_OK)
        slot->n = m;
    return rc;
}

wsync_result_t wsync_validate_copy_ops(const wsync_copy_op_t *ops, size_t n, uint64_t src_bytes,
                                       wsync_error_t *err)
{
    return wsync_validate_copy_ops_memo(NULL, ops, n, src_bytes, err);
}

wsync_result_t wsync_validate_copy_ops_memo(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                                            size_t n, uint64_t src_bytes, wsync_error_t *err)
{
    if (n > 0 && ops == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "ops is NULL but n_ops is %zu", n);
    for (size_t i = 0; i < n; i++) {
        wsync_result_t r = wsync_validate_op(&ops[i], i, src_bytes, err);
        if (r != WSYNC_OK)
            return r;
    }
    return wsync_validate_disjoint(ops, n, n, memo, err);
}

static size_t wsync_quant_src_size(wsync_dtype_t d)
{
    return d == WSYNC_DTYPE_F32 ? 4u : d == WSYNC_DTYPE_BF16 || d == WSYNC_DTYPE_F16 ? 2u : 0u;
}

/* 1 for a TENSOR op that moves bytes (its scale is one float, maybe shared with other ops). */
static int wsync_quant_tensor_op(const wsync_copy_op_t *o, const wsync_quant_t *q)
{
    return q->kind == WSYNC_QUANT_FP8_TENSOR && o->rows > 0 && o->row_bytes > 0;
}

/* shared[i] = 1 for a TENSOR op whose scale an earlier TENSOR op of the call names, else 0
 * (sorted, not compared pairwise: a MoE bucket has thousands). -1 when out of memory. */
static int wsync_quant_shared_scales(const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                     size_t n, uint8_t *shared)
{
    size_t m = 0;
    memset(shared, 0, n);
    for (size_t i = 0; i < n; i++)
        m += wsync_quant_tensor_op(&ops[i], &quant[i]);
    if (m < 2)
        return 0;
    wsync_fp8_ref_t *by = malloc(m * sizeof(*by));
    if (by == NULL)
        return -1;
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (wsync_quant_tensor_op(&ops[i], &quant[i]))
            by[m++] = (wsync_fp8_ref_t){(uintptr_t)quant[i].scale_dst, i};
    qsort(by, m, sizeof(*by), wsync_fp8_ref_cmp);
    for (size_t j = 1; j < m; j++)
        shared[by[j].op] = by[j].scale == by[j - 1].scale;
    free(by);
    return 0;
}

/* The call's 2n destinations and n scale flags: the memo's scratch (grown when short; a
 * consumer's steady calls allocate nothing), or a fresh allocation without a memo. NULL when
 * out of memory. */
static void *wsync_quant_scratch(wsync_validate_memo_t *memo, size_t n)
{
    const size_t bytes = 2 * n * sizeof(wsync_copy_op_t) + n + 1;
    if (memo == NULL)
        return malloc(bytes);
    if (bytes > memo->scratch_cap) {
        void *p = realloc(memo->scratch, bytes);
        if (p == NULL)
            return NULL;
        memo->scratch = p;
        memo->scratch_cap = bytes;
    }
    return memo->scratch;
}

wsync_result_t wsync_validate_quant_ops(const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                        size_t n, uint64_t src_bytes, wsync_error_t *err)
{
    return wsync_validate_quant_ops_memo(NULL, ops, quant, n, src_bytes, err);
}

/* 1 when the memo holds a call equal to this one byte for byte. */
static int wsync_call_seen(const wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                           const wsync_quant_t *quant, size_t n, uint64_t src_bytes)
{
    const size_t ob = n * sizeof(*ops);
    for (unsigned k = 0; k < WSYNC_VALIDATE_MEMO_SLOTS; k++) {
        const wsync_validate_call_t *c = &memo->call[k];
        if (c->n == n && c->src_bytes == src_bytes && memcmp(c->in, ops, ob) == 0 &&
            memcmp((const char *)c->in + ob, quant, n * sizeof(*quant)) == 0)
            return 1;
    }
    return 0;
}

/* The memo's next entry takes this call (found valid); without memory it holds none. */
static void wsync_call_keep(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                            const wsync_quant_t *quant, size_t n, uint64_t src_bytes)
{
    wsync_validate_call_t *c = &memo->call[memo->call_next++ % WSYNC_VALIDATE_MEMO_SLOTS];
    const size_t ob = n * sizeof(*ops), bytes = ob + n * sizeof(*quant);
    c->n = 0;
    if (bytes > c->cap) {
        void *p = realloc(c->in, bytes);
        if (p == NULL)
            return;
        c->in = p;
        c->cap = bytes;
    }
    memcpy(c->in, ops, ob);
    memcpy((char *)c->in + ob, quant, n * sizeof(*quant));
    c->n = n;
    c->src_bytes = src_bytes;
}

wsync_result_t wsync_validate_quant_ops_memo(wsync_validate_memo_t *memo,
                                             const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                             size_t n, uint64_t src_bytes, wsync_error_t *err)
{
    if (n > 0 && (ops == NULL || quant == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "copy_quantized needs ops and quant (n_ops %zu)", n);
    if (n > 0 && memo != NULL && wsync_call_seen(memo, ops, quant, n, src_bytes))
        return WSYNC_OK;
    /* each op's destination, then each quantized op's scales as op n + i */
    void *scratch = wsync_quant_scratch(memo, n);
    wsync_copy_op_t *dst = scratch;
    uint8_t *shared = scratch != NULL ? (uint8_t *)(dst + 2 * n) : NULL;
    if (scratch == NULL || wsync_quant_shared_scales(ops, quant, n, shared) != 0) {
        if (memo == NULL)
            free(scratch);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to check %zu ops", n);
    }
    wsync_result_t r = WSYNC_OK;
    for (size_t i = 0; i < n && r == WSYNC_OK; i++) {
        const wsync_copy_op_t *o = &ops[i];
        const wsync_quant_t *q = &quant[i];
        dst[i] = *o;
        dst[n + i] = (wsync_copy_op_t){0}; /* no scales (a plain or empty op) */
        if (q->kind == WSYNC_QUANT_NONE) {
            r = wsync_validate_op(o, i, src_bytes, err);
            continue;
        }
        const size_t es = wsync_quant_src_size(q->src_dtype);
        if (q->kind < WSYNC_QUANT_FP8_BLOCK || q->kind > WSYNC_QUANT_FP8_TENSOR || es == 0) {
            r = WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, i,
                              "op %zu: quant kind %u from dtype %d; wsync quantizes kinds %u-%u "
                              "(fp8 blocks, rows, tensors) from bf16, f16 or f32",
                              i, q->kind, (int)q->src_dtype, WSYNC_QUANT_FP8_BLOCK,
                              WSYNC_QUANT_FP8_TENSOR);
            break;
        }
        if (o->rows == 0 || o->row_bytes == 0)
            continue;
        if (q->cols == 0 || o->row_bytes != q->cols * es || q->scale_dst == NULL) {
            r = WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, i,
                              "op %zu: row_bytes %llu is not cols %llu x %zu source bytes, or no "
                              "scale_dst",
                              i, (unsigned long long)o->row_bytes, (unsigned long long)q->cols, es);
            break;
        }
        wsync_copy_op_t src = *o; /* the source side alone */
        src.dst_pitch = o->rows > 1 ? o->src_pitch : o->row_bytes;
        src.dst_extent = UINT64_MAX;
        r = wsync_validate_op(&src, i, src_bytes, err);
        /* the fp8 bytes: rows x cols at dst_pitch */
        dst[i].row_bytes = q->cols;
        dst[i].src_offset = 0;
        dst[i].src_pitch = q->cols;
        if (r == WSYNC_OK)
            r = wsync_validate_op(&dst[i], i, UINT64_MAX, err);
        /* the scales: a grid of blocks, a column of rows, or one float per tensor (counted once,
         * at the first op naming it) */
        const uint64_t brows = q->kind == WSYNC_QUANT_FP8_BLOCK     ? (o->rows + 127) / 128
                               : q->kind == WSYNC_QUANT_FP8_CHANNEL ? o->rows
                                                                    : 1;
        const uint64_t bcols = q->kind == WSYNC_QUANT_FP8_BLOCK ? (q->cols + 127) / 128 : 1;
        dst[n + i] = (wsync_copy_op_t){.dst = q->scale_dst,
                                       .rows = brows,
                                       .row_bytes = 4 * bcols,
                                       .dst_pitch = brows > 1 ? q->scale_pitch : 4 * bcols,
                                       .src_pitch = 4 * bcols,
                                       .dst_extent = q->scale_extent};
        if (r == WSYNC_OK && !shared[i])
            r = wsync_validate_scales(&dst[n + i], i, err);
    }
    if (r == WSYNC_OK) {
        for (size_t i = 0; i < n; i++)
            if (shared[i])
                dst[n + i].rows = 0; /* the same tensor's scale, counted at its first op */
        r = wsync_validate_disjoint(dst, 2 * n, n, memo, err);
    }
    if (memo == NULL)
        free(scratch);
    else if (r == WSYNC_OK && n > 0)
        wsync_call_keep(memo, ops, quant, n, src_bytes);
    return r;
}

wsync_result_t wsync_validate_generation(uint64_t last, uint64_t generation, wsync_error_t *err)
{
    if (generation <= last)
        return WSYNC_FAIL(err, WSYNC_ERR_STALE_GENERATION,
                          "generation %llu is not newer than the last one copied from this "
                          "buffer (%llu); replayed or reordered manifest",
                          (unsigned long long)generation, (unsigned long long)last);
    return WSYNC_OK;
}

wsync_result_t wsync_validate_adapter_call(const void *consumer, const wsync_adapter_source_t *src,
                                           const wsync_adapter_slot_t *slot, wsync_error_t *err)
{
    if (consumer == NULL || src == NULL || slot == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "consumer %p, source %p and slot %p must all be non-NULL", consumer,
                          (const void *)src, (const void *)slot);
    return WSYNC_OK;
}

uint64_t wsync_copy_ops_bytes(const wsync_copy_op_t *ops, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; ops != NULL && i < n; i++) {
        uint64_t b;
        if (__builtin_mul_overflow(ops[i].rows, ops[i].row_bytes, &b) ||
            __builtin_add_overflow(total, b, &total))
            return UINT64_MAX;
    }
    return total;
}

wsync_result_t wsync_validate_adapter_manifest(const wsync_manifest_t *m,
                                               const wsync_buffer_desc_t *key, uint64_t bytes,
                                               uint64_t last_generation, wsync_error_t *err)
{
    if (m == NULL || key == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "adapter source FROM_MANIFEST needs the parsed manifest of an open "
                          "handle (manifest %p)",
                          (const void *)m);
    if (!wsync_cache_key_equal(&m->buffer, key) || m->buffer.bytes > bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "the adapter manifest (generation %llu, %llu bytes) names another "
                          "buffer than the handle it came with (%llu bytes); open the manifest's "
                          "buffer",
                          (unsigned long long)m->generation, (unsigned long long)m->buffer.bytes,
                          (unsigned long long)bytes);
    return wsync_validate_generation(last_generation, m->generation, err);
}

wsync_result_t wsync_validate_copy_args(const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                        wsync_error_t *err)
{
    if (n_ops != 0 && ops == NULL)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, "copy_weights",
                          "ops is NULL with n_ops %zu", n_ops);
    if ((flags & ~WSYNC_COPY_VERIFY) != 0)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, "copy_weights",
                          "unknown copy flags 0x%x; only WSYNC_COPY_VERIFY (0x1) is defined",
                          flags & ~WSYNC_COPY_VERIFY);
    if ((uint64_t)n_ops > UINT32_MAX)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, "copy_weights",
                          "%zu ops in one call; at most %u: split the bucket", n_ops, UINT32_MAX);
    return WSYNC_OK;
}

wsync_result_t wsync_validate_segment_ops(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                                          const uint32_t *op_segment, size_t n,
                                          const uint64_t *seg_bytes, const uint64_t *seg_base,
                                          size_t n_segs, wsync_copy_op_t **out, wsync_error_t *err)
{
    *out = NULL;
    if (n > 0 && op_segment == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "%zu ops but op_segment is NULL", n);
    for (size_t i = 0; i < n; i++) {
        const uint32_t k = op_segment[i];
        if (k >= n_segs)
            return WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, i,
                                 "op %zu: op_segment %u, but %zu segments were given", i, k,
                                 n_segs);
        wsync_result_t r = wsync_validate_op(&ops[i], i, seg_bytes[k], err);
        if (r != WSYNC_OK)
            return r;
    }
    /* The destination rules across every op: the same check as one buffer's ops, on ops moved
     * to disjoint places of one virtual source (each segment after the one before). */
    wsync_copy_op_t *v = malloc((n ? n : 1) * sizeof(*v));
    uint64_t *start = malloc((n_segs ? n_segs : 1) * sizeof(*start));
    if (v == NULL || start == NULL) {
        free(v);
        free(start);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to check %zu ops", n);
    }
    uint64_t total = 0;
    for (size_t k = 0; k < n_segs; k++) {
        start[k] = total;
        total = seg_bytes[k] > UINT64_MAX - total ? UINT64_MAX : total + seg_bytes[k];
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = ops[i];
        v[i].src_offset += start[op_segment[i]];
    }
    wsync_result_t r = wsync_validate_copy_ops_memo(memo, v, n, total, err);
    for (size_t i = 0; r == WSYNC_OK && i < n; i++)
        v[i].src_offset = seg_base[op_segment[i]] + ops[i].src_offset;
    free(start);
    if (r != WSYNC_OK) {
        free(v);
        return r;
    }
    *out = v;
    return WSYNC_OK;
}

wsync_result_t wsync_validate_segments(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                                       const uint32_t *op_segment, size_t n, size_t n_segs,
                                       wsync_segment_fn seg, void *user, const char *what,
                                       wsync_copy_op_t **out, wsync_error_t *err)
{
    *out = NULL;
    if (n_segs == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "copy_segments needs the segments' handles (0 given)");
    uint64_t *bytes = malloc(n_segs * sizeof(*bytes)), *base = malloc(n_segs * sizeof(*base));
    wsync_result_t r = WSYNC_OK;
    if (bytes == NULL || base == NULL)
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu segments", n_segs);
    for (size_t k = 0; r == WSYNC_OK && k < n_segs; k++)
        if (seg(user, k, &bytes[k], &base[k]) != 0)
            r = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "segs[%zu] is not %s", k, what);
    if (r == WSYNC_OK)
        r = wsync_validate_segment_ops(memo, ops, op_segment, n, bytes, base, n_segs, out, err);
    free(bytes);
    free(base);
    return r;
}

wsync_result_t wsync_validate_regions(const void *consumer, const wsync_copy_op_t *regions,
                                      size_t n, const uint64_t *out, wsync_error_t *err)
{
    if (consumer == NULL || (n > 0 && (regions == NULL || out == NULL)) || n > UINT32_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "digest_regions needs a consumer, regions and out (at most 2^32)");
    for (size_t i = 0; i < n; i++)
        if (regions[i].rows > 0 && regions[i].row_bytes > 0 &&
            (regions[i].dst == NULL ||
             (regions[i].rows > 1 && regions[i].dst_pitch < regions[i].row_bytes)))
            return WSYNC_FAIL_OP(err, WSYNC_ERR_INVALID_ARGUMENT, i,
                                 "region %zu: dst %p, %llu rows of %llu bytes, pitch %llu", i,
                                 regions[i].dst, (unsigned long long)regions[i].rows,
                                 (unsigned long long)regions[i].row_bytes,
                                 (unsigned long long)regions[i].dst_pitch);
    return WSYNC_OK;
}
