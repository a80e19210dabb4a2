/* The consumer's ring of op tables (pinned host image + device image per slot). */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_digest.h"
#include "wsync_error.h"
#include "wsync_log.h"

size_t wsync_cuda_slot_ops_bytes(size_t n)
{
    return (n * sizeof(wsync_cuda_op_t) + 255u) & ~(size_t)255u;
}

static void slot_release_memory(wsync_cuda_slot_t *s)
{
    if (s->host)
        cudaFreeHost(s->host);
    if (s->dev)
        cudaFree(s->dev);
    free(s->expected);
    free(s->nbytes);
    free(s->op_index);
    s->host = s->dev = NULL;
    s->expected = s->nbytes = NULL;
    s->op_index = NULL;
    s->cap_ops = 0;
}

static wsync_result_t slot_grow(wsync_cuda_slot_t *s, size_t n, wsync_error_t *err)
{
    size_t cap = s->cap_ops * 2;
    if (cap < n)
        cap = n;
    if (cap < 1024)
        cap = 1024;
    slot_release_memory(s);
    size_t ops = wsync_cuda_slot_ops_bytes(cap);
    cudaError_t e =
        cudaHostAlloc((void **)&s->host, ops + 2 * cap * sizeof(uint64_t), cudaHostAllocDefault);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->dev, ops + cap * sizeof(uint64_t));
    if (e != cudaSuccess) {
        slot_release_memory(s);
        return wsync_cuda_fail(err, e, __func__,
                               "allocating an op table (cudaHostAlloc/cudaMalloc)");
    }
    s->expected = malloc(cap * sizeof(uint64_t));
    s->nbytes = malloc(cap * sizeof(uint64_t));
    s->op_index = malloc(cap * sizeof(size_t));
    if (!s->expected || !s->nbytes || !s->op_index) {
        slot_release_memory(s);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no host memory for an op table of %zu ops",
                          cap);
    }
    s->cap_ops = cap;
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_slot_check(wsync_cuda_slot_t *s, wsync_error_t *err)
{
    wsync_result_t rc = WSYNC_OK;
    if (s->owner == NULL)
        return WSYNC_OK;
    const uint64_t *sums =
        (const uint64_t *)(s->host + wsync_cuda_slot_ops_bytes(s->cap_ops)) + s->cap_ops;
    for (size_t k = 0; k < s->n_ops; k++) {
        if (s->nbytes[k] == WSYNC_CUDA_NO_DIGEST)
            continue;
        uint64_t got = wsync_mix64(sums[k] ^ s->nbytes[k]);
        if (got != s->expected[k]) {
            rc = WSYNC_FAIL_OP(err, WSYNC_ERR_DIGEST_MISMATCH, s->op_index[k],
                               "generation %llu, op %zu (%llu bytes): copied bytes have wsync64 "
                               "%016llx, the manifest says %016llx; the staging buffer changed "
                               "during the copy or the producer staged other bytes",
                               (unsigned long long)s->generation, s->op_index[k],
                               (unsigned long long)s->nbytes[k], (unsigned long long)got,
                               (unsigned long long)s->expected[k]);
            break;
        }
    }
    s->owner = NULL;
    return rc;
}

wsync_result_t wsync_cuda_ring_take(wsync_cuda_ring_t *r, size_t n, wsync_cuda_slot_t **out,
                                    wsync_error_t *err)
{
    wsync_cuda_slot_t *s = &r->slot[r->next];
    r->next = (r->next + 1) % WSYNC_CUDA_RING_SLOTS;
    if (s->used) {
        /* Eight launches ago: normally long finished, so this returns at once. */
        WSYNC_CUDA_TRY(err, cudaEventSynchronize(s->done));
    } else if (s->done == NULL) {
        WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
    }
    if (s->owner != NULL) {
        /* kept for record_consumed; an earlier failure it has not reported yet stays */
        (void)wsync_cuda_slot_check(s, &s->owner->deferred);
    }
    if (s->cap_ops < n) {
        wsync_result_t rc = slot_grow(s, n, err);
        if (rc != WSYNC_OK)
            return rc;
    }
    s->uses++;
    *out = s;
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_ring_reserve(wsync_cuda_ring_t *r, size_t n, wsync_error_t *err)
{
    for (unsigned i = 0; i < WSYNC_CUDA_RING_SLOTS; i++) {
        wsync_cuda_slot_t *s = &r->slot[i];
        if (s->done == NULL)
            WSYNC_CUDA_TRY(err, cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
        if (s->cap_ops < n) {
            wsync_result_t rc = slot_grow(s, n, err);
            if (rc != WSYNC_OK)
                return rc;
        }
    }
    return WSYNC_OK;
}

void wsync_cuda_ring_free(wsync_cuda_ring_t *r)
{
    for (unsigned i = 0; i < WSYNC_CUDA_RING_SLOTS; i++) {
        wsync_cuda_slot_t *s = &r->slot[i];
        if (s->used)
            cudaEventSynchronize(s->done);
        if (s->done)
            cudaEventDestroy(s->done);
        slot_release_memory(s);
        memset(s, 0, sizeof(*s));
    }
}
