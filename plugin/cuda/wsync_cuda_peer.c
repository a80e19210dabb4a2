/* See wsync_cuda_peer.h. */
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_cuda_peer.h"
#include "wsync_error.h"
#include "wsync_log.h"

wsync_result_t wsync_cuda_peer_ordinal(const char *uuid, int *ordinal, wsync_error_t *err)
{
    if (uuid == NULL || ordinal == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "peer_ordinal needs a uuid and out");
    *ordinal = -1;
    int n = 0;
    WSYNC_CUDA_TRY(err, cudaGetDeviceCount(&n));
    for (int d = 0; d < n; d++) {
        char text[WSYNC_DEVICE_MAX];
        wsync_result_t rc = wsync_cuda_device_uuid(d, text, err);
        if (rc != WSYNC_OK)
            return rc;
        if (strncmp(text, uuid, WSYNC_DEVICE_MAX) == 0) {
            *ordinal = d;
            return WSYNC_OK;
        }
    }
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_peer_enable(int device, const char *producer_uuid, int *peer,
                                      wsync_error_t *err)
{
    if (peer)
        *peer = -1;
    if (producer_uuid == NULL || producer_uuid[0] == '\0' || strcmp(producer_uuid, "cpu") == 0)
        return WSYNC_OK;
    int p = -1;
    wsync_result_t rc = wsync_cuda_peer_ordinal(producer_uuid, &p, err);
    if (rc != WSYNC_OK)
        return rc;
    if (p < 0) {
        WSYNC_LOG_WARN("producer GPU %s is not visible to this process (CUDA_VISIBLE_DEVICES?); "
                       "peer access from device %d cannot be checked, the IPC open decides",
                       producer_uuid, device);
        return WSYNC_OK;
    }
    if (p == device)
        return WSYNC_OK;
    int can = 0;
    WSYNC_CUDA_TRY(err, cudaDeviceCanAccessPeer(&can, device, p));
    if (!can)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "device %d cannot access the producer's GPU %d (%s) as a peer: place the "
                          "engine rank and its trainer rank on GPUs with P2P (NVLink), or use the "
                          "nccl transport",
                          device, p, producer_uuid);
    WSYNC_CUDA_TRY(err, cudaSetDevice(device));
    cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError(); /* not sticky, but clear it so the next check is not blamed */
    else if (e != cudaSuccess)
        return wsync_cuda_fail(err, e, __func__, "cudaDeviceEnablePeerAccess(producer GPU)");
    WSYNC_LOG_DEBUG("peer access from device %d to producer GPU %d (%s)", device, p, producer_uuid);
    if (peer)
        *peer = p;
    return WSYNC_OK;
}
