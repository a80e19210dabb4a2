/* Direct mode on the CUDA backend (WSYNC_STAGING_DIRECT): a bucket's tensors named where they
 * live, in the caller's cudaMalloc segments (a PyTorch caching-allocator segment, a Megatron
 * buffer). Each segment is found from a tensor's pointer (cuMemGetAddressRange), identified by
 * the driver's process-wide allocation id (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused) and
 * exported once with cudaIpcGetMemHandle; the export is cached by base address and id, so a
 * steady trainer exports nothing per sync and memory freed and re-made at the same address is
 * exported again under its new id. cuMem (VMM) memory, e.g. PyTorch's expandable segments,
 * has no legacy IPC handle: such a tensor is refused naming it (stage it instead). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_cuda.h"
#include "wsync_cuda_direct.h"
#include "wsync_error.h"

static wsync_cuda_export_t *export_find(wsync_cuda_exports_t *x, uintptr_t base, uint64_t id)
{
    for (size_t i = 0; i < x->n; i++)
        if (x->at[i].base == base && x->at[i].id == id)
            return &x->at[i];
    return NULL;
}

typedef struct locate_ctx {
    wsync_cuda_exports_t *exports;
    int device;
    const char *uuid;
} locate_ctx_t;

static wsync_result_t locate(void *user, const char *name, const void *src, uint64_t nbytes,
                             wsync_buffer_desc_t *seg, uint64_t *offset, wsync_error_t *err)
{
    locate_ctx_t *ctx = user;
    uintptr_t base = 0;
    size_t size = 0;
    unsigned long long id = 0;
    int ordinal = -1, legacy = 0;
    if (!wsync_cuda_alloc_range(src, &base, &size) ||
        !wsync_cuda_pointer_attr(src, CU_POINTER_ATTRIBUTE_BUFFER_ID, &id) ||
        !wsync_cuda_pointer_attr(src, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, &ordinal))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\": %p is not device memory the driver knows (freed, or "
                          "host memory?)",
                          name, src);
    if (ordinal != ctx->device)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\" is on device %d, this staging on device %d", name,
                          ordinal, ctx->device);
    if ((uintptr_t)src - base > size || nbytes > size - ((uintptr_t)src - base))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\": its %llu bytes run past the end of their allocation "
                          "(%zu bytes from %p)",
                          name, (unsigned long long)nbytes, size, (void *)base);
    if (!wsync_cuda_pointer_attr(src, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, &legacy) ||
        !legacy)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "tensor \"%.80s\" lives in memory without a legacy CUDA IPC handle "
                          "(cuMem/VMM memory, e.g. PyTorch's expandable segments): direct mode "
                          "exports cudaMalloc segments; stage this tensor instead",
                          name);
    wsync_cuda_export_t *e = export_find(ctx->exports, base, id);
    if (e == NULL) {
        if (ctx->exports->n == ctx->exports->cap) {
            size_t cap = ctx->exports->cap ? 2 * ctx->exports->cap : 64;
            void *p = realloc(ctx->exports->at, cap * sizeof(*ctx->exports->at));
            if (p == NULL)
                return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu exports", cap);
            ctx->exports->at = p;
            ctx->exports->cap = cap;
        }
        e = &ctx->exports->at[ctx->exports->n];
        memset(e, 0, sizeof(*e));
        cudaError_t ce = cudaIpcGetMemHandle(&e->handle, (void *)base);
        if (ce != cudaSuccess)
            return wsync_cuda_fail(err, ce, "stage", "cudaIpcGetMemHandle(direct segment)");
        e->base = base;
        e->size = size;
        e->id = id;
        ctx->exports->n++;
    }
    seg->kind = WSYNC_BUFFER_CUDA_IPC;
    memcpy(seg->handle, &e->handle, sizeof(e->handle));
    for (int k = 0; k < 8; k++)
        seg->handle[sizeof(e->handle) + (size_t)k] = (uint8_t)(e->id >> (8 * k));
    seg->handle_len = WSYNC_CUDA_SEGMENT_HANDLE_BYTES;
    seg->bytes = e->size;
    seg->pid = (int64_t)getpid();
    snprintf(seg->device, sizeof(seg->device), "%s", ctx->uuid);
    *offset = (uint64_t)((uintptr_t)src - base);
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_direct_build(wsync_cuda_exports_t *x, int device, const char *uuid,
                                       const wsync_stage_tensor_t *t, size_t n, wsync_direct_t *out,
                                       wsync_error_t *err)
{
    locate_ctx_t ctx = {.exports = x, .device = device, .uuid = uuid};
    return wsync_direct_build(t, n, locate, &ctx, out, err);
}

void wsync_cuda_exports_free(wsync_cuda_exports_t *x)
{
    free(x->at);
    memset(x, 0, sizeof(*x));
}
