/* Direct mode, producer side: contract in wsync_direct.h. */
#include "wsync_direct.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_manifest.h"

static int wsync_direct_same(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return a->kind == b->kind && a->handle_len == b->handle_len &&
           memcmp(a->handle, b->handle, a->handle_len) == 0 && a->bytes == b->bytes;
}

/* FNV-1a over what makes two descriptors one segment. */
static uint64_t wsync_direct_hash(const wsync_buffer_desc_t *b)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)b->kind ^ (b->bytes << 8);
    for (uint32_t i = 0; i < b->handle_len; i++)
        h = (h ^ b->handle[i]) * 1099511628211ull;
    return h;
}

/* The segments found so far, by descriptor: an open-addressing table of indices + 1 (0 empty),
 * twice the tensors' count rounded up to a power of two, so a bucket of thousands of segments
 * costs a hash per tensor rather than a scan of every segment before it. */
typedef struct wsync_direct_index {
    uint32_t *slot;
    size_t mask;
} wsync_direct_index_t;

/* The index of `seg` in d->segments, adding it when new; -1 past WSYNC_MANIFEST_MAX_SEGMENTS. */
static long wsync_direct_intern(wsync_direct_t *d, wsync_direct_index_t *x,
                                const wsync_buffer_desc_t *seg)
{
    size_t i = (size_t)wsync_direct_hash(seg) & x->mask;
    for (; x->slot[i] != 0; i = (i + 1) & x->mask)
        if (wsync_direct_same(&d->segments[x->slot[i] - 1], seg))
            return (long)x->slot[i] - 1;
    if (d->n_segments == WSYNC_MANIFEST_MAX_SEGMENTS)
        return -1;
    d->segments[d->n_segments] = *seg;
    x->slot[i] = (uint32_t)++d->n_segments;
    return (long)d->n_segments - 1;
}

void wsync_direct_free(wsync_direct_t *d)
{
    if (d == NULL)
        return;
    wsync_layout_free(&d->layout);
    free(d->segments);
    free(d->tensor_segment);
    free(d->src);
    free(d->tail);
    memset(d, 0, sizeof(*d));
}

/* Whether two segments emit the same text: every member wsync_manifest_emit writes of them. */
static int wsync_direct_same_text(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return wsync_direct_same(a, b) && a->pid == b->pid && a->base_offset == b->base_offset &&
           a->has_ready == b->has_ready && a->has_consumed == b->has_consumed &&
           (!a->has_ready ||
            (a->ready_len == b->ready_len && memcmp(a->ready, b->ready, a->ready_len) == 0)) &&
           (!a->has_consumed || (a->consumed_len == b->consumed_len &&
                                 memcmp(a->consumed, b->consumed, a->consumed_len) == 0)) &&
           strncmp(a->device, b->device, sizeof(a->device)) == 0 &&
           strncmp(a->control, b->control, sizeof(a->control)) == 0;
}

static int wsync_direct_same_tensor(const wsync_tensor_desc_t *a, const wsync_tensor_desc_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->offset != b->offset ||
        a->nbytes != b->nbytes || a->has_digest != b->has_digest ||
        (a->has_digest && a->digest != b->digest) || strcmp(a->name, b->name) != 0)
        return 0;
    for (uint32_t k = 0; k < a->ndim; k++)
        if (a->shape[k] != b->shape[k])
            return 0;
    return 1;
}

/* Whether a and b emit the same segments and tensors text. */
static int wsync_direct_same_bucket(const wsync_direct_t *a, const wsync_direct_t *b)
{
    if (a->layout.n != b->layout.n || a->n_segments != b->n_segments ||
        memcmp(a->tensor_segment, b->tensor_segment, a->layout.n * sizeof(*a->tensor_segment)))
        return 0;
    for (size_t k = 0; k < a->n_segments; k++)
        if (!wsync_direct_same_text(&a->segments[k], &b->segments[k]))
            return 0;
    for (size_t i = 0; i < a->layout.n; i++)
        if (!wsync_direct_same_tensor(&a->layout.tensors[i], &b->layout.tensors[i]))
            return 0;
    return 1;
}

/* Whether `t` is the input d was built from: the same count, and tensor for tensor the same
 * name, dtype, source dtype, shape and pointer (so its validation and layout are d's). */
static int wsync_direct_same_input(const wsync_direct_t *d, const wsync_stage_tensor_t *t, size_t n)
{
    if (d->src == NULL || d->layout.n != n)
        return 0;
    for (size_t k = 0; k < n; k++) {
        const wsync_tensor_desc_t *x = &d->layout.tensors[k];
        const wsync_stage_tensor_t *s = &t[d->layout.from[k]];
        if (s->src != d->src[k] || s->dtype != x->dtype || wsync_stage_src_dtype(s) != s->dtype ||
            s->ndim != x->ndim || s->name == NULL || strcmp(s->name, x->name) != 0)
            return 0;
        for (uint32_t j = 0; j < x->ndim; j++)
            if (s->shape[j] != x->shape[j])
                return 0;
    }
    return 1;
}

/* Locate every tensor of d again, in the build's order: *same is 1 when each is in the segment
 * and at the offset d names. A locate error is returned as the build would return it. */
static wsync_result_t wsync_direct_relocate(const wsync_direct_t *d, wsync_direct_locate_fn locate,
                                            void *user, int *same, wsync_error_t *err)
{
    *same = 0;
    for (size_t k = 0; k < d->layout.n; k++) {
        const wsync_tensor_desc_t *x = &d->layout.tensors[k];
        if (x->nbytes == 0)
            continue;
        wsync_buffer_desc_t seg;
        memset(&seg, 0, sizeof(seg));
        seg.struct_size = sizeof(seg);
        uint64_t offset = 0;
        wsync_result_t r = locate(user, x->name, d->src[k], x->nbytes, &seg, &offset, err);
        if (r != WSYNC_OK)
            return r;
        if (offset != x->offset ||
            !wsync_direct_same_text(&d->segments[d->tensor_segment[k]], &seg))
            return WSYNC_OK;
    }
    *same = 1;
    return WSYNC_OK;
}

wsync_result_t wsync_direct_stage(wsync_direct_set_t *set, const wsync_stage_tensor_t *t, size_t n,
                                  wsync_direct_locate_fn locate, void *user, wsync_error_t *err)
{
    if (set->at == NULL && (set->at = calloc(WSYNC_DIRECT_KEEP, sizeof(*set->at))) == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for direct buckets");
    size_t k = 0;
    while (k < set->n && !(set->at[k].tail != NULL && wsync_direct_same_input(&set->at[k], t, n)))
        k++;
    if (k < set->n) {
        int same = 0;
        wsync_result_t r = wsync_direct_relocate(&set->at[k], locate, user, &same, err);
        if (r != WSYNC_OK)
            return r;
        if (same) {
            set->current = k, set->have = 1;
            return WSYNC_OK;
        }
    }
    wsync_direct_t next;
    wsync_result_t r = wsync_direct_build(t, n, locate, user, &next, err);
    if (r != WSYNC_OK)
        return r;
    if (k == set->n) /* the kept bucket of the same first tensor, when there is one */
        for (k = 0; k < set->n; k++)
            if (strcmp(set->at[k].layout.tensors[0].name, next.layout.tensors[0].name) == 0)
                break;
    if (k == set->n && set->n == WSYNC_DIRECT_KEEP) { /* full: the oldest goes */
        wsync_direct_free(&set->at[0]);
        memmove(&set->at[0], &set->at[1], (set->n - 1) * sizeof(*set->at));
        k = --set->n;
    }
    if (k < set->n) {
        wsync_direct_t *old = &set->at[k];
        if (old->tail != NULL && wsync_direct_same_bucket(old, &next)) { /* the same text */
            next.tail = old->tail, next.tail_len = old->tail_len;
            old->tail = NULL;
        }
        wsync_direct_free(old);
    } else {
        set->n++;
    }
    set->at[k] = next;
    set->current = k, set->have = 1;
    return WSYNC_OK;
}

wsync_direct_t *wsync_direct_current(wsync_direct_set_t *set)
{
    return set->have ? &set->at[set->current] : NULL;
}

void wsync_direct_set_free(wsync_direct_set_t *set)
{
    for (size_t k = 0; k < set->n; k++)
        wsync_direct_free(&set->at[k]);
    free(set->at);
    memset(set, 0, sizeof(*set));
}

wsync_result_t wsync_direct_build(const wsync_stage_tensor_t *t, size_t n,
                                  wsync_direct_locate_fn locate, void *user, wsync_direct_t *out,
                                  wsync_error_t *err)
{
    memset(out, 0, sizeof(*out));
    wsync_result_t r = wsync_layout_build(t, n, UINT64_MAX, &out->layout, err);
    if (r != WSYNC_OK)
        return r;
    out->segments = calloc(n ? n : 1, sizeof(*out->segments));
    out->tensor_segment = calloc(n ? n : 1, sizeof(*out->tensor_segment));
    out->src = calloc(n ? n : 1, sizeof(*out->src));
    wsync_direct_index_t index = {NULL, 1};
    while (index.mask < 2 * n)
        index.mask <<= 1;
    index.slot = calloc(index.mask, sizeof(*index.slot));
    index.mask--;
    if (out->segments == NULL || out->tensor_segment == NULL || out->src == NULL ||
        index.slot == NULL) {
        free(index.slot);
        wsync_direct_free(out);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu direct tensors", n);
    }
    for (size_t k = 0; k < out->layout.n; k++) {
        wsync_tensor_desc_t *d = &out->layout.tensors[k];
        const wsync_stage_tensor_t *src = &t[out->layout.from[k]];
        d->offset = 0;
        out->src[k] = src->src;
        if (wsync_stage_src_dtype(src) != src->dtype) {
            r = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                           "tensor \"%.80s\": src_dtype %s differs from dtype %s; direct mode "
                           "reads tensors where they are, so it converts nothing (stage it, or "
                           "cast it into a tensor of dtype %s)",
                           src->name, wsync_dtype_name(wsync_stage_src_dtype(src)),
                           wsync_dtype_name(src->dtype), wsync_dtype_name(src->dtype));
            free(index.slot);
            wsync_direct_free(out);
            return r;
        }
        if (d->nbytes == 0)
            continue;
        wsync_buffer_desc_t seg;
        memset(&seg, 0, sizeof(seg));
        seg.struct_size = sizeof(seg);
        r = locate(user, d->name, src->src, d->nbytes, &seg, &d->offset, err);
        if (r != WSYNC_OK) {
            free(index.slot);
            wsync_direct_free(out);
            return r;
        }
        /* consecutive tensors mostly share a segment: the last one first */
        long j = k > 0 && out->n_segments > 0 &&
                         wsync_direct_same(&out->segments[out->tensor_segment[k - 1]], &seg)
                     ? (long)out->tensor_segment[k - 1]
                     : wsync_direct_intern(out, &index, &seg);
        if (j < 0) {
            free(index.slot);
            wsync_direct_free(out);
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensor \"%.80s\" would be in segment %u: a direct bucket names at "
                              "most %u; split it",
                              src->name, WSYNC_MANIFEST_MAX_SEGMENTS + 1,
                              WSYNC_MANIFEST_MAX_SEGMENTS);
        }
        out->tensor_segment[k] = (uint32_t)j;
    }
    free(index.slot);
    /* room for a segment per tensor was taken; a kept bucket holds only what it names */
    void *fit = out->n_segments > 0
                    ? realloc(out->segments, out->n_segments * sizeof(*out->segments))
                    : NULL;
    if (fit != NULL)
        out->segments = fit;
    if (out->n_segments == 0) {
        wsync_direct_free(out);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "a direct bucket of %zu tensors without bytes names no memory; send at "
                          "least one tensor with bytes",
                          n);
    }
    return WSYNC_OK;
}

wsync_result_t wsync_direct_emit(wsync_direct_t *d, const wsync_buffer_desc_t *sync,
                                 uint64_t generation, int finished, char **json, wsync_error_t *err)
{
    wsync_manifest_t m;
    memset(&m, 0, sizeof(m));
    m.struct_size = sizeof(m);
    m.schema = WSYNC_MANIFEST_SCHEMA;
    m.generation = generation;
    m.finished = finished != 0;
    m.buffer = *sync;
    m.n_tensors = d->layout.n;
    m.tensors = d->layout.tensors;
    m.n_segments = d->n_segments;
    m.segments = d->segments;
    m.tensor_segment = d->tensor_segment;
    if (d->tail != NULL)
        return wsync_manifest_emit_with_tail(&m, d->tail, d->tail_len, json, err);
    size_t at = 0;
    wsync_result_t r = wsync_manifest_emit_split(&m, json, &at, err);
    if (r != WSYNC_OK)
        return r;
    const size_t len = strlen(*json + at);
    if ((d->tail = malloc(len + 1)) != NULL) { /* without it, the next emit writes it all */
        memcpy(d->tail, *json + at, len + 1);
        d->tail_len = len;
    }
    return WSYNC_OK;
}

int wsync_yama_ptrace_scope(void)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    int scope = 0;
    if (f == NULL)
        return 0; /* no Yama LSM */
    if (fscanf(f, "%d", &scope) != 1)
        scope = 1;
    fclose(f);
    return scope;
}

void wsync_direct_allow_readers(void)
{
    if (wsync_yama_ptrace_scope() == 1)
        (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}
