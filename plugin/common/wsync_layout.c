/* Producer-side packing of a bucket and the retained-layout comparison. */
#include "wsync_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_manifest.h"
#include "wsync_pack_order.h"
#include "wsync_utf8.h"

/* "[4, 4096]" into buf; truncated with "..." if it does not fit. */
static const char *wsync_shape_str(uint32_t ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < ndim && d < WSYNC_MAX_DIMS && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

wsync_result_t wsync_stage_sizes_check(const wsync_stage_tensor_t *t, size_t n, wsync_error_t *err)
{
    for (size_t i = 0; i < n && t != NULL; i++)
        if (t[i].struct_size < WSYNC_STAGE_TENSOR_MIN_SIZE)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensors[%zu].struct_size %zu; set it to sizeof(wsync_stage_tensor_t)"
                              " (%zu)",
                              i, t[i].struct_size, sizeof(wsync_stage_tensor_t));
    return WSYNC_OK;
}

wsync_dtype_t wsync_stage_src_dtype(const wsync_stage_tensor_t *t)
{
    if (WSYNC_HAS_FIELD(wsync_stage_tensor_t, t, src_dtype) && t->src_dtype != WSYNC_DTYPE_INVALID)
        return t->src_dtype;
    return t->dtype;
}

int wsync_stage_converts(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32 ||
           dt == WSYNC_DTYPE_F64;
}

static wsync_result_t wsync_layout_check(const wsync_stage_tensor_t *t, size_t i, uint64_t *nbytes,
                                         wsync_error_t *err)
{
    char shape[128];

    if (t->name == NULL || t->name[0] == '\0')
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu: name is %s; every staged tensor needs a unique name", i,
                          t->name ? "empty" : "NULL");
    size_t len = strlen(t->name);
    if (len > WSYNC_MANIFEST_MAX_NAME)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu: name \"%.40s...\" is %zu bytes, the limit is %d", i, t->name,
                          len, WSYNC_MANIFEST_MAX_NAME);
    size_t bad = wsync_utf8_invalid_at(t->name);
    if (bad != (size_t)-1)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu: name is not valid UTF-8 (byte 0x%02x at %zu); names "
                          "travel as JSON strings",
                          i, (unsigned)(unsigned char)t->name[bad], bad);
    if (wsync_dtype_size(t->dtype) == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu (\"%.80s\"): unknown dtype %d", i, t->name, (int)t->dtype);
    const wsync_dtype_t sdt = wsync_stage_src_dtype(t);
    if (sdt != t->dtype && (!wsync_stage_converts(sdt) || !wsync_stage_converts(t->dtype)))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu (\"%.80s\"): src_dtype %s (%d) does not convert to dtype %s; "
                          "a stage converts only between bfloat16, float16, float32 and float64",
                          i, t->name, wsync_dtype_name(sdt), (int)sdt, wsync_dtype_name(t->dtype));
    if (t->ndim > WSYNC_MAX_DIMS)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu (\"%.80s\"): ndim %u exceeds the limit %d", i, t->name,
                          t->ndim, WSYNC_MAX_DIMS);
    if (wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, nbytes) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu (\"%.80s\"): shape %s has a negative dimension or its size "
                          "overflows 64 bits",
                          i, t->name, wsync_shape_str(t->ndim, t->shape, shape, sizeof(shape)));
    if (t->src == NULL && *nbytes != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor %zu (\"%.80s\"): src is NULL but the tensor has %llu bytes", i,
                          t->name, (unsigned long long)*nbytes);
    return WSYNC_OK;
}

/* Duplicate detection by sorting (name, index) pairs: O(n log n), no hashing. */
typedef struct wsync_name_ref {
    const char *name;
    size_t index;
} wsync_name_ref_t;

static int wsync_cmp_by_name(const void *a, const void *b)
{
    const wsync_name_ref_t *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->index < y->index ? -1 : x->index > y->index);
}

static wsync_result_t wsync_layout_dups(const wsync_stage_tensor_t *t, size_t n, wsync_error_t *err)
{
    wsync_result_t r = WSYNC_OK;
    wsync_name_ref_t *refs = malloc((n ? n : 1) * sizeof(*refs));
    if (refs == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu name references", n);
    for (size_t i = 0; i < n; i++) {
        refs[i].name = t[i].name;
        refs[i].index = i;
    }
    qsort(refs, n, sizeof(*refs), wsync_cmp_by_name);
    for (size_t k = 1; k < n; k++) {
        if (strcmp(refs[k - 1].name, refs[k].name) == 0) {
            r = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                           "tensor %zu: name \"%.200s\" duplicates tensor %zu; names must be "
                           "unique",
                           refs[k].index, refs[k].name, refs[k - 1].index);
            break;
        }
    }
    free(refs);
    return r;
}

wsync_result_t wsync_layout_build(const wsync_stage_tensor_t *t, size_t n, uint64_t capacity,
                                  wsync_layout_t *out, wsync_error_t *err)
{
    wsync_result_t r;
    uint64_t used = 0;
    size_t names_len = 0;
    char *names = NULL;

    if (out == NULL || (n > 0 && t == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "tensors and out must not be NULL");
    memset(out, 0, sizeof(*out));

    wsync_tensor_desc_t *desc = calloc(n ? n : 1, sizeof(*desc));
    uint64_t *bytes = calloc(n ? n : 1, sizeof(*bytes));
    size_t *from = calloc(n ? n : 1, sizeof(*from));
    if (desc == NULL || bytes == NULL || from == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu descriptors", n);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) { /* checked in the caller's order: errors name its index */
        if ((r = wsync_layout_check(&t[i], i, &bytes[i], err)) != WSYNC_OK)
            goto fail;
        names_len += strlen(t[i].name) + 1;
    }
    if ((r = wsync_layout_dups(t, n, err)) != WSYNC_OK)
        goto fail;
    if ((r = wsync_pack_order(t, n, from, err)) != WSYNC_OK)
        goto fail;
    names = malloc(names_len ? names_len : 1);
    if (names == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of names",
                       names_len);
        goto fail;
    }
    char *w = names;
    for (size_t k = 0; k < n; k++) {
        const size_t i = from[k];
        uint64_t offset;
        if (__builtin_add_overflow(used, (uint64_t)WSYNC_LAYOUT_ALIGN - 1, &offset) ||
            __builtin_add_overflow(offset & ~(uint64_t)(WSYNC_LAYOUT_ALIGN - 1), bytes[i], &used)) {
            r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                           "tensor %zu (\"%.80s\"): packed offset overflows 64 bits", i, t[i].name);
            goto fail;
        }
        size_t len = strlen(t[i].name) + 1;
        memcpy(w, t[i].name, len);
        desc[k].struct_size = sizeof(desc[k]);
        desc[k].name = w;
        desc[k].dtype = t[i].dtype;
        desc[k].ndim = t[i].ndim;
        memcpy(desc[k].shape, t[i].shape, t[i].ndim * sizeof(t[i].shape[0]));
        desc[k].offset = offset & ~(uint64_t)(WSYNC_LAYOUT_ALIGN - 1);
        desc[k].nbytes = bytes[i];
        w += len;
    }
    if (used > capacity) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                       "bucket of %zu tensors needs %llu bytes (packed at %u) but the staging "
                       "buffer holds %llu; create it with bytes >= %llu or split the bucket",
                       n, (unsigned long long)used, WSYNC_LAYOUT_ALIGN,
                       (unsigned long long)capacity, (unsigned long long)used);
        goto fail;
    }
    free(bytes);
    out->n = n;
    out->tensors = desc;
    out->from = from;
    out->names = names;
    out->used = used;
    return WSYNC_OK;
fail:
    free(desc);
    free(bytes);
    free(from);
    free(names);
    return r;
}

wsync_result_t wsync_layout_compare(const wsync_layout_t *retained, const wsync_layout_t *next,
                                    wsync_error_t *err)
{
    char a[128], b[128];

    if (retained == NULL || next == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "layouts must not be NULL");
    if (retained->n != next->n)
        return WSYNC_FAIL(err, WSYNC_ERR_LAYOUT_MISMATCH,
                          "bucket has %zu tensors but the retained layout has %zu; a fixed "
                          "layout takes the same tensors every time",
                          next->n, retained->n);
    for (size_t i = 0; i < next->n; i++) {
        const wsync_tensor_desc_t *r = &retained->tensors[i], *t = &next->tensors[i];
        const size_t at = next->from != NULL ? next->from[i] : i; /* the caller's index */
        if (strcmp(r->name, t->name) != 0)
            return WSYNC_FAIL(err, WSYNC_ERR_LAYOUT_MISMATCH,
                              "tensor %zu: name \"%.100s\" differs from the retained \"%.100s\"",
                              at, t->name, r->name);
        if (r->dtype != t->dtype)
            return WSYNC_FAIL(err, WSYNC_ERR_LAYOUT_MISMATCH,
                              "tensor %zu (\"%.100s\"): dtype %s differs from the retained %s", at,
                              t->name, wsync_dtype_name(t->dtype), wsync_dtype_name(r->dtype));
        if (r->ndim != t->ndim || memcmp(r->shape, t->shape, t->ndim * sizeof(t->shape[0])) != 0)
            return WSYNC_FAIL(err, WSYNC_ERR_LAYOUT_MISMATCH,
                              "tensor %zu (\"%.100s\"): shape %s differs from the retained %s", at,
                              t->name, wsync_shape_str(t->ndim, t->shape, a, sizeof(a)),
                              wsync_shape_str(r->ndim, r->shape, b, sizeof(b)));
    }
    return WSYNC_OK;
}

void wsync_layout_free(wsync_layout_t *l)
{
    if (l == NULL)
        return;
    free(l->tensors);
    free(l->from);
    free(l->names);
    memset(l, 0, sizeof(*l));
}
