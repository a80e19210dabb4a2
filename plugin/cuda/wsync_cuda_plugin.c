/* wsync_plugin_init: the only exported symbol of libwsync_cuda.so. */
#include "wsync_cuda.h"
#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_negotiate.h"

#ifndef WSYNC_PLUGIN_NAME /* a fixture build names itself (tests/fixtures) */
#define WSYNC_PLUGIN_NAME "cuda"
#endif

static const wsync_plugin_v1_t wsync_cuda_plugin = {
    .struct_size = sizeof(wsync_plugin_v1_t),
    .abi_version = WSYNC_ABI_VERSION_1,
    .name = WSYNC_PLUGIN_NAME,
    .version = WSYNC_VERSION_STRING,
    .consumer = &wsync_cuda_consumer_ops,
    .producer = &wsync_cuda_producer_ops,
};

__attribute__((visibility("default"))) wsync_result_t wsync_plugin_init(uint32_t *abi_version,
                                                                        const wsync_host_t *host,
                                                                        const wsync_plugin_t **out,
                                                                        wsync_error_t *err)
{
    if (abi_version == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "wsync_plugin_init needs abi_version and out");
    wsync_log_set_host(host);
    wsync_result_t rc = wsync_negotiate(abi_version, WSYNC_ABI_VERSION_1, WSYNC_ABI_VERSION_1,
                                        "libwsync_cuda.so", err);
    if (rc != WSYNC_OK)
        return rc;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_NO_DEVICE,
                          "libwsync_cuda.so: no usable CUDA device: cudaGetDeviceCount %s "
                          "(%s); load libwsync_cpu.so on machines without an NVIDIA GPU and "
                          "driver",
                          e != cudaSuccess ? cudaGetErrorName(e) : "found 0 devices",
                          e != cudaSuccess ? cudaGetErrorString(e) : "no device visible");
    *out = &wsync_cuda_plugin;
    return WSYNC_OK;
}
