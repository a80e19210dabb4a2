/* Direct mode on the CUDA backend (WSYNC_STAGING_DIRECT): a bucket's tensors named where they
 * live, in the caller's cudaMalloc segments (a PyTorch caching-allocator segment, a Megatron
 * buffer). Each segment is found from a tensor's pointer (cuMemGetAddressRange), identified by
 * the driver's process-wide allocation id (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused) and
 * exported once with cudaIpcGetMemHandle; the export is cached by base address and id, so a
 * steady trainer exports nothing per sync and memory freed and re-made at the same address is
 * exported again under its new id, in the entry of that address (the cache holds one entry per
 * address in use). Per stage call a known segment costs one driver query (its id, at the first
 * tensor in it: the entry is found by binary search on the address) and every other tensor in it
 * none. cuMem (VMM) memory, e.g. PyTorch's expandable segments, has no legacy IPC
 * handle: the run of chunks holding the tensor is exported instead (one fd per chunk,
 * wsync_cuda_vmm.h), cached by address and the chunks' physical allocations. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_cuda.h"
#include "wsync_cuda_direct.h"
#include "wsync_error.h"

typedef struct locate_ctx locate_ctx_t;
static wsync_result_t describe(const locate_ctx_t *ctx, const wsync_cuda_export_t *e, uintptr_t at,
                               wsync_buffer_desc_t *seg, uint64_t *offset);

/* Where base goes in x->order: the first entry whose base is not below it. */
static size_t export_lower(const wsync_cuda_exports_t *x, uintptr_t base)
{
    size_t lo = 0, hi = x->n;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (x->at[x->order[mid]].base < base)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry of the segment at `base` (the memory there now, or what was there before). */
static wsync_cuda_export_t *export_at_base(const wsync_cuda_exports_t *x, uintptr_t base)
{
    const size_t k = export_lower(x, base);
    return k < x->n && x->at[x->order[k]].base == base ? &x->at[x->order[k]] : NULL;
}

/* A new entry for `base`, its place in the order kept; NULL when out of memory. */
static wsync_cuda_export_t *export_add(wsync_cuda_exports_t *x, uintptr_t base)
{
    if (x->n == x->cap) {
        const size_t cap = x->cap ? 2 * x->cap : 64;
        void *p = realloc(x->at, cap * sizeof(*x->at));
        if (p == NULL)
            return NULL;
        x->at = p;
        if ((p = realloc(x->order, cap * sizeof(*x->order))) == NULL)
            return NULL;
        x->order = p;
        x->cap = cap;
    }
    const size_t k = export_lower(x, base);
    memmove(&x->order[k + 1], &x->order[k], (x->n - k) * sizeof(*x->order));
    x->order[k] = x->n;
    wsync_cuda_export_t *e = &x->at[x->n++];
    memset(e, 0, sizeof(*e));
    e->base = base;
    return e;
}

struct locate_ctx {
    wsync_cuda_exports_t *exports;
    int device;
    const char *uuid;
    size_t uuid_len;    /* without its NUL, cut to a device name's room as snprintf would */
    uint64_t stamp;     /* this build: an entry of that stamp needs no driver call for its tensors
                           (the memory does not change within one stage call) */
    size_t *found_runs; /* indices into exports->runs */
    size_t n_found_runs;
};

/* The entry whose segment holds [at, at + nbytes), as the exports last knew it; NULL if none. */
static wsync_cuda_export_t *export_holding(const wsync_cuda_exports_t *x, uintptr_t at,
                                           uint64_t nbytes)
{
    const size_t k = export_lower(x, at + 1); /* the first entry above at */
    if (k == 0)
        return NULL;
    wsync_cuda_export_t *e = &x->at[x->order[k - 1]];
    return at - e->base <= e->size && nbytes <= e->size - (at - e->base) ? e : NULL;
}

static void describe_run(const locate_ctx_t *ctx, const wsync_cuda_vmm_run_t *r, uintptr_t at,
                         wsync_buffer_desc_t *seg, uint64_t *offset)
{
    seg->kind = WSYNC_BUFFER_CUDA_VMM_RUN;
    wsync_cuda_vmm_run_handle(r, seg->handle, &seg->handle_len);
    seg->bytes = r->chunk * r->n;
    seg->pid = (int64_t)getpid();
    memcpy(seg->device, ctx->uuid, ctx->uuid_len); /* seg was zeroed: the NUL is there */
    *offset = (uint64_t)(at - r->base);
}

/* cuMem memory: the run of chunks holding the tensor, exported once per physical memory. */
static wsync_result_t locate_run(locate_ctx_t *ctx, const char *name, uintptr_t at, uint64_t nbytes,
                                 wsync_buffer_desc_t *seg, uint64_t *offset, wsync_error_t *err)
{
    wsync_cuda_exports_t *x = ctx->exports;
    for (size_t i = 0; i < ctx->n_found_runs; i++) {
        const wsync_cuda_vmm_run_t *r = &x->runs[ctx->found_runs[i]];
        const uint64_t size = r->chunk * r->n;
        if (at >= r->base && at - r->base <= size && nbytes <= size - (at - r->base)) {
            describe_run(ctx, r, at, seg, offset);
            return WSYNC_OK;
        }
    }
    wsync_cuda_vmm_run_t probe;
    wsync_result_t rc = wsync_cuda_vmm_run_probe(name, at, nbytes, ctx->device, &probe, err);
    if (rc != WSYNC_OK)
        return rc;
    size_t k = 0;
    while (k < x->n_runs && !(x->runs[k].base == probe.base && x->runs[k].n == probe.n))
        k++;
    if (k < x->n_runs && wsync_cuda_vmm_run_same(&x->runs[k], &probe)) {
        wsync_cuda_vmm_run_free(&probe);
    } else {
        if (k < x->n_runs) { /* other memory at that address now: the old export is stale */
            wsync_cuda_vmm_run_free(&x->runs[k]);
        } else if (x->n_runs == x->cap_runs) {
            size_t cap = x->cap_runs ? 2 * x->cap_runs : 16;
            void *p = realloc(x->runs, cap * sizeof(*x->runs));
            if (p == NULL) {
                wsync_cuda_vmm_run_free(&probe);
                return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu runs", cap);
            }
            x->runs = p;
            x->cap_runs = cap;
        }
        rc = wsync_cuda_vmm_run_export(name, &probe, err);
        if (rc != WSYNC_OK) /* a freed slot stays zeroed (base 0 matches no tensor) */
            return rc;
        x->runs[k] = probe;
        if (k == x->n_runs)
            x->n_runs++;
    }
    ctx->found_runs[ctx->n_found_runs++] = k;
    describe_run(ctx, &x->runs[k], at, seg, offset);
    return WSYNC_OK;
}

static wsync_result_t locate(void *user, const char *name, const void *src, uint64_t nbytes,
                             wsync_buffer_desc_t *seg, uint64_t *offset, wsync_error_t *err)
{
    locate_ctx_t *ctx = user;
    const uintptr_t at = (uintptr_t)src;
    wsync_cuda_export_t *held = export_holding(ctx->exports, at, nbytes);
    if (held != NULL && held->stamp == ctx->stamp)
        return describe(ctx, held, at, seg, offset);
    /* A segment exported before: one driver query says whether the memory at `at` is still
     * that allocation (ids are never reused, so the same id is the same base, size, device). */
    unsigned long long now_id = 0;
    if (held != NULL && wsync_cuda_pointer_attr(src, CU_POINTER_ATTRIBUTE_BUFFER_ID, &now_id) &&
        now_id == held->id) {
        held->stamp = ctx->stamp;
        return describe(ctx, held, at, seg, offset);
    }
    unsigned long long base = 0, size = 0, id = 0;
    int ordinal = -1, legacy = 0;
    int attrs[5] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                    CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    void *data[5] = {&base, &size, &id, &ordinal, &legacy};
    if (!wsync_cuda_pointer_attrs(src, 5, attrs, data) || size == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\": %p is not device memory the driver knows (freed, or "
                          "host memory?)",
                          name, src);
    if (ordinal != ctx->device)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\" is on device %d, this staging on device %d", name,
                          ordinal, ctx->device);
    if (at - base > size || nbytes > size - (at - base))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\": its %llu bytes run past the end of their allocation "
                          "(%llu bytes from %p)",
                          name, (unsigned long long)nbytes, size, (void *)(uintptr_t)base);
    if (!legacy)
        return locate_run(ctx, name, at, nbytes, seg, offset, err);
    /* one entry per address: memory re-made at a known address takes its entry's new export */
    wsync_cuda_export_t *e = export_at_base(ctx->exports, base);
    if (e == NULL || e->id != id) {
        cudaIpcMemHandle_t h;
        cudaError_t ce = cudaIpcGetMemHandle(&h, (void *)base);
        if (ce != cudaSuccess)
            return wsync_cuda_fail(err, ce, "stage", "cudaIpcGetMemHandle(direct segment)");
        if (e == NULL && (e = export_add(ctx->exports, base)) == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu exports",
                              ctx->exports->n + 1);
        e->handle = h;
        e->size = size;
        e->id = id;
    }
    e->stamp = ctx->stamp;
    return describe(ctx, e, at, seg, offset);
}

static wsync_result_t describe(const locate_ctx_t *ctx, const wsync_cuda_export_t *e, uintptr_t at,
                               wsync_buffer_desc_t *seg, uint64_t *offset)
{
    seg->kind = WSYNC_BUFFER_CUDA_IPC;
    memcpy(seg->handle, &e->handle, sizeof(e->handle));
    for (int k = 0; k < 8; k++)
        seg->handle[sizeof(e->handle) + (size_t)k] = (uint8_t)(e->id >> (8 * k));
    seg->handle_len = WSYNC_CUDA_SEGMENT_HANDLE_BYTES;
    seg->bytes = e->size;
    seg->pid = (int64_t)getpid();
    memcpy(seg->device, ctx->uuid, ctx->uuid_len); /* seg was zeroed: the NUL is there */
    *offset = (uint64_t)(at - e->base);
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_direct_stage(wsync_cuda_exports_t *x, int device, const char *uuid,
                                       const wsync_stage_tensor_t *t, size_t n,
                                       wsync_direct_set_t *set, wsync_error_t *err)
{
    locate_ctx_t ctx = {.exports = x, .device = device, .uuid = uuid, .stamp = ++x->builds};
    ctx.uuid_len = strnlen(uuid, WSYNC_DEVICE_MAX - 1);
    ctx.found_runs = malloc((n ? n : 1) * sizeof(*ctx.found_runs));
    if (ctx.found_runs == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to locate %zu tensors", n);
    wsync_result_t rc = wsync_direct_stage(set, t, n, locate, &ctx, err);
    free(ctx.found_runs);
    return rc;
}

void wsync_cuda_exports_free(wsync_cuda_exports_t *x)
{
    free(x->order);
    for (size_t k = 0; k < x->n_runs; k++)
        wsync_cuda_vmm_run_free(&x->runs[k]);
    free(x->runs);
    free(x->at);
    memset(x, 0, sizeof(*x));
}
