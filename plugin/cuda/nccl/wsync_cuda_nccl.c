/* See wsync_cuda_nccl.h. */
#include <stdlib.h>
#include <string.h>

#include "wsync_copy_kernel.h"
#include "wsync_cuda.h"
#include "wsync_cuda_nccl.h"
#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_validate.h"

struct wsync_nccl_link {
    const wsync_nccl_api_t *api;
    wsync_nccl_comm_t comm;
    int device, rank, sm_count;
    uint32_t nranks;
    unsigned char *recv; /* retained receive buffer (NULL on a root without loopback) */
    uint64_t recv_bytes;
    cudaStream_t nccl_stream; /* carries the broadcasts into recv */
    cudaEvent_t arrived;      /* on nccl_stream, after the broadcast of the current bucket */
    cudaEvent_t consumed;     /* on the engine stream, after the scatter out of recv */
    cudaEvent_t issued;       /* on the engine stream at recv: the broadcast follows its work */
    int consumed_recorded;
    wsync_cuda_op_t *table_host; /* pinned */
    wsync_cuda_op_t *table_dev;
    size_t table_cap;
    cudaEvent_t table_done; /* after the last launch that read table_dev */
    int table_used;
    uint64_t last_generation;
};

wsync_result_t wsync_nccl_unique_id(wsync_nccl_unique_id_t *out, wsync_error_t *err)
{
    const wsync_nccl_api_t *api = NULL;
    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "nccl_unique_id needs an out pointer");
    wsync_result_t rc = wsync_nccl_load(&api, err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_nccl_result_t r = api->get_unique_id(out);
    if (r != WSYNC_NCCL_SUCCESS)
        return wsync_nccl_fail(err, api, r, __func__, "ncclGetUniqueId");
    return WSYNC_OK;
}

static void link_free(wsync_nccl_link_t *l)
{
    if (l->table_used)
        cudaEventSynchronize(l->table_done);
    if (l->nccl_stream)
        cudaStreamSynchronize(l->nccl_stream);
    if (l->consumed_recorded)
        cudaEventSynchronize(l->consumed);
    if (l->table_host)
        cudaFreeHost(l->table_host);
    if (l->table_dev)
        cudaFree(l->table_dev);
    if (l->recv)
        cudaFree(l->recv);
    if (l->arrived)
        cudaEventDestroy(l->arrived);
    if (l->consumed)
        cudaEventDestroy(l->consumed);
    if (l->table_done)
        cudaEventDestroy(l->table_done);
    if (l->issued)
        cudaEventDestroy(l->issued);
    if (l->nccl_stream)
        cudaStreamDestroy(l->nccl_stream);
    free(l);
}

wsync_result_t wsync_nccl_link_open(const wsync_nccl_link_config_t *cfg,
                                    const wsync_nccl_unique_id_t *uid, wsync_nccl_link_t **out,
                                    wsync_error_t *err)
{
    if (cfg == NULL || uid == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "nccl_link_open needs cfg, uid, out");
    if (cfg->nranks < 1 || cfg->rank < 0 || (uint32_t)cfg->rank >= cfg->nranks)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nccl rank %d is outside [0, %u): the producer is rank 0, engine TP "
                          "rank r is r + 1",
                          cfg->rank, cfg->nranks);
    const int wants_recv = cfg->rank != 0 || cfg->alloc_recv_on_root;
    if (wants_recv && cfg->recv_bytes == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nccl rank %d needs recv_bytes > 0 (the producer's staging size)",
                          cfg->rank);
    const wsync_nccl_api_t *api = NULL;
    wsync_result_t rc = wsync_nccl_load(&api, err);
    if (rc != WSYNC_OK)
        return rc;
    rc = wsync_cuda_use_device(cfg->device, err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_nccl_link_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for an nccl link");
    l->api = api;
    l->device = cfg->device;
    l->rank = cfg->rank;
    l->nranks = cfg->nranks;
    cudaError_t e = cudaDeviceGetAttribute(&l->sm_count, cudaDevAttrMultiProcessorCount, l->device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&l->nccl_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&l->arrived, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&l->consumed, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&l->table_done, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&l->issued, cudaEventDisableTiming);
    if (e == cudaSuccess && wants_recv) {
        e = cudaMalloc((void **)&l->recv, cfg->recv_bytes);
        l->recv_bytes = cfg->recv_bytes;
    }
    if (e != cudaSuccess) {
        rc = wsync_cuda_fail(err, e, __func__, "nccl link streams, events or receive buffer");
        link_free(l);
        return rc;
    }
    /* NVLS (NVLink SHARP multicast) stays off: it reserves multicast memory per communicator
     * and is refused on machines lent without it; the broadcast does not need it. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    wsync_nccl_result_t r = api->comm_init_rank(&l->comm, (int)l->nranks, *uid, l->rank);
    if (r != WSYNC_NCCL_SUCCESS) {
        l->comm = NULL;
        rc = wsync_nccl_fail(err, api, r, __func__,
                             "ncclCommInitRank (same uid and nranks on every rank?)");
        link_free(l);
        return rc;
    }
    WSYNC_LOG_INFO("nccl link: rank %d of %u on device %d, receive buffer %llu bytes", l->rank,
                   l->nranks, l->device, (unsigned long long)l->recv_bytes);
    *out = l;
    return WSYNC_OK;
}

wsync_result_t wsync_nccl_broadcast_raw(wsync_nccl_link_t *l, const void *send, void *recv,
                                        uint64_t count, cudaStream_t stream, wsync_error_t *err)
{
    if (l == NULL || recv == NULL || (l->rank == WSYNC_NCCL_ROOT_RANK && send == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "broadcast_raw needs a link, recv, and send on the root");
    wsync_nccl_result_t r =
        l->api->broadcast(send ? send : recv, recv, (size_t)count, WSYNC_NCCL_UINT8,
                          WSYNC_NCCL_ROOT_RANK, l->comm, stream);
    if (r != WSYNC_NCCL_SUCCESS)
        return wsync_nccl_fail(err, l->api, r, __func__, "ncclBroadcast");
    return WSYNC_OK;
}

wsync_result_t wsync_nccl_send(wsync_nccl_link_t *l, const void *staging, uint64_t count,
                               cudaStream_t stream, wsync_error_t *err)
{
    if (l == NULL || staging == NULL || l->rank != WSYNC_NCCL_ROOT_RANK)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nccl_send is the producer's (rank 0) and needs its staging buffer");
    cudaSetDevice(l->device);
    /* Root sends from staging; recv == send keeps NCCL from copying into it locally. */
    return wsync_nccl_broadcast_raw(l, staging, (void *)(uintptr_t)staging, count, stream, err);
}

/* Room for n planned ops in the table; waits for the previous launch to have read it. */
static wsync_result_t table_reserve(wsync_nccl_link_t *l, size_t n, wsync_error_t *err)
{
    if (l->table_used)
        WSYNC_CUDA_TRY(err, cudaEventSynchronize(l->table_done));
    if (n <= l->table_cap)
        return WSYNC_OK;
    size_t cap = l->table_cap ? l->table_cap : 64;
    while (cap < n)
        cap *= 2;
    if (l->table_host)
        cudaFreeHost(l->table_host);
    if (l->table_dev)
        cudaFree(l->table_dev);
    l->table_host = NULL;
    l->table_dev = NULL;
    l->table_cap = 0;
    WSYNC_CUDA_TRY(err, cudaMallocHost((void **)&l->table_host, cap * sizeof(wsync_cuda_op_t)));
    WSYNC_CUDA_TRY(err, cudaMalloc((void **)&l->table_dev, cap * sizeof(wsync_cuda_op_t)));
    l->table_cap = cap;
    return WSYNC_OK;
}

wsync_result_t wsync_nccl_recv(wsync_nccl_link_t *l, const void *root_src, uint64_t generation,
                               uint64_t count, const wsync_copy_op_t *ops, size_t n_ops,
                               cudaStream_t stream, uint32_t flags, wsync_error_t *err)
{
    if (l == NULL || (n_ops > 0 && ops == NULL) || stream == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nccl_recv needs a link, ops and the engine's stream (not NULL)");
    if (l->recv == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nccl rank %d has no receive buffer (the producer sends; open rank 0 "
                          "with alloc_recv_on_root for a loopback)",
                          l->rank);
    if ((l->rank == WSYNC_NCCL_ROOT_RANK) != (root_src != NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "root_src must be the staging buffer on rank 0 and NULL on rank %d",
                          l->rank);
    if (flags & WSYNC_COPY_VERIFY)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "WSYNC_COPY_VERIFY is not supported on the nccl path yet; drop the "
                          "flag (NCCL transfers are checksummed by the fabric)");
    if (count > l->recv_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "bucket of %llu bytes exceeds the receive buffer of %llu bytes: open "
                          "the link with recv_bytes >= the producer's staging bytes",
                          (unsigned long long)count, (unsigned long long)l->recv_bytes);
    wsync_result_t rc = wsync_validate_copy_ops(ops, n_ops, count, err);
    if (rc == WSYNC_OK)
        rc = wsync_validate_generation(l->last_generation, generation, err);
    if (rc != WSYNC_OK)
        return rc;
    WSYNC_CUDA_TRY(err, cudaSetDevice(l->device));
    rc = table_reserve(l, n_ops, err);
    if (rc != WSYNC_OK)
        return rc;

    /* The broadcast follows the work the caller enqueued on `stream` (on a loopback root, the
     * staging fill) and the previous bucket's scatter (it read recv, which is overwritten). */
    WSYNC_CUDA_TRY(err, cudaEventRecord(l->issued, stream));
    WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(l->nccl_stream, l->issued, 0));
    if (l->consumed_recorded)
        WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(l->nccl_stream, l->consumed, 0));
    rc = wsync_nccl_broadcast_raw(l, root_src, l->recv, count, l->nccl_stream, err);
    if (rc != WSYNC_OK)
        return rc;
    WSYNC_CUDA_TRY(err, cudaEventRecord(l->arrived, l->nccl_stream));
    WSYNC_CUDA_TRY(err, cudaStreamWaitEvent(stream, l->arrived, 0));

    uint64_t chunks = 0;
    int flat = 1;
    for (size_t i = 0; i < n_ops; i++) {
        const wsync_copy_op_t *o = &ops[i];
        chunks += wsync_cuda_plan_op(&l->table_host[i], l->recv + o->src_offset, o->dst,
                                     o->src_pitch, o->dst_pitch, o->rows, o->row_bytes, 0, chunks);
        flat &= wsync_cuda_op_is_flat(&l->table_host[i]);
    }
    if (n_ops > 0 && chunks > 0) {
        wsync_cuda_launch_cfg_t cfg = {.variant = WSYNC_CUDA_STAGE_VARIANT, .flat = flat};
        WSYNC_CUDA_TRY(err,
                       cudaMemcpyAsync(l->table_dev, l->table_host, n_ops * sizeof(wsync_cuda_op_t),
                                       cudaMemcpyHostToDevice, stream));
        WSYNC_CUDA_TRY(err, wsync_cuda_launch_copy(l->table_dev, (uint32_t)n_ops, chunks, NULL, 0,
                                                   l->sm_count, &cfg, stream));
        WSYNC_CUDA_TRY(err, cudaEventRecord(l->table_done, stream));
        l->table_used = 1;
    }
    /* *consumed* on the stream that carried the copies: the next broadcast waits for it. */
    WSYNC_CUDA_TRY(err, cudaEventRecord(l->consumed, stream));
    l->consumed_recorded = 1;
    l->last_generation = generation;
    return WSYNC_OK;
}

wsync_result_t wsync_nccl_wait_consumed(wsync_nccl_link_t *l, wsync_error_t *err)
{
    if (l == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "nccl_wait_consumed(NULL)");
    if (l->consumed_recorded)
        WSYNC_CUDA_TRY(err, cudaEventSynchronize(l->consumed));
    return WSYNC_OK;
}

void *wsync_nccl_recv_buffer(const wsync_nccl_link_t *l)
{
    return l ? l->recv : NULL;
}

void wsync_nccl_link_close(wsync_nccl_link_t *l, int abort)
{
    if (l == NULL)
        return;
    cudaSetDevice(l->device);
    if (l->comm != NULL) {
        wsync_nccl_result_t r = abort ? l->api->comm_abort(l->comm) : l->api->comm_destroy(l->comm);
        if (r != WSYNC_NCCL_SUCCESS)
            WSYNC_LOG_WARN("nccl link close (rank %d): %s", l->rank, l->api->get_error_string(r));
    }
    link_free(l);
}
