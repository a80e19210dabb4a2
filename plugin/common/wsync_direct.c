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
    memset(d, 0, sizeof(*d));
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
    wsync_direct_index_t index = {NULL, 1};
    while (index.mask < 2 * n)
        index.mask <<= 1;
    index.slot = calloc(index.mask, sizeof(*index.slot));
    index.mask--;
    if (out->segments == NULL || out->tensor_segment == NULL || index.slot == NULL) {
        free(index.slot);
        wsync_direct_free(out);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu direct tensors", n);
    }
    for (size_t k = 0; k < out->layout.n; k++) {
        wsync_tensor_desc_t *d = &out->layout.tensors[k];
        const wsync_stage_tensor_t *src = &t[out->layout.from[k]];
        d->offset = 0;
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
    if (out->n_segments == 0) {
        wsync_direct_free(out);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "a direct bucket of %zu tensors without bytes names no memory; send at "
                          "least one tensor with bytes",
                          n);
    }
    return WSYNC_OK;
}

wsync_result_t wsync_direct_emit(const wsync_direct_t *d, const wsync_buffer_desc_t *sync,
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
    return wsync_manifest_emit(&m, json, err);
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
