/* register_host / unregister_host (ABI 0.1.5): host memory a stage reads over PCIe, a mapped
 * checkpoint shard most often. Page-locked and mapped for the device with cudaHostRegister
 * (read-only where the device supports it, so a read-only file mapping registers too), kept in
 * the process-wide table of plugin/common/wsync_host_ranges.h with its device address. */
#include "wsync_cuda.h"
#include "wsync_error.h"
#include "wsync_host_ranges.h"

/* The device address of the source [p, p + bytes) for a stage: a registered range's alias, or p
 * itself (device memory, or pinned host memory that UVA maps at its host address). */
const void *wsync_cuda_stage_source(const void *p, uint64_t bytes, int *host)
{
    wsync_host_range_t r;
    *host = 0;
    if (p == NULL || !wsync_host_ranges_find(p, bytes, &r))
        return p;
    *host = 1;
    return (const void *)(r.device + ((uintptr_t)p - r.host));
}

wsync_result_t wsync_cuda_register_host(struct wsync_staging *s, const void *ptr, uint64_t bytes,
                                        wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "register_host: staging is NULL");
    wsync_result_t rc = wsync_host_ranges_check(ptr, bytes, err);
    if (rc != WSYNC_OK)
        return rc;
    int dev = 0, read_only = 0;
    WSYNC_CUDA_TRY(err, cudaGetDevice(&dev));
    WSYNC_CUDA_TRY(
        err, cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, dev));
    const unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped |
                           (read_only ? cudaHostRegisterReadOnly : 0u);
    cudaError_t e = cudaHostRegister((void *)(uintptr_t)ptr, (size_t)bytes, flags);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM,
                          "register_host(%p, %llu): cudaHostRegister(flags 0x%x) failed: %s (%d)",
                          ptr, (unsigned long long)bytes, flags, cudaGetErrorString(e), (int)e);
    }
    void *device = NULL;
    e = cudaHostGetDevicePointer(&device, (void *)(uintptr_t)ptr, 0);
    const wsync_host_range_t r = {
        .host = (uintptr_t)ptr, .device = (uintptr_t)device, .bytes = bytes};
    if (e == cudaSuccess)
        rc = wsync_host_ranges_add(&r, err);
    else
        rc = wsync_cuda_fail(err, e, "register_host", "cudaHostGetDevicePointer");
    if (rc != WSYNC_OK)
        cudaHostUnregister((void *)(uintptr_t)ptr);
    return rc;
}

wsync_result_t wsync_cuda_unregister_host(struct wsync_staging *s, const void *ptr,
                                          wsync_error_t *err)
{
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "unregister_host: staging is NULL");
    wsync_host_range_t r;
    wsync_result_t rc = wsync_host_ranges_remove(ptr, &r, err);
    if (rc != WSYNC_OK)
        return rc;
    /* a stage still reading it finishes first: the caller's stream work is not ours to know */
    WSYNC_CUDA_TRY(err, cudaDeviceSynchronize());
    WSYNC_CUDA_TRY(err, cudaHostUnregister((void *)(uintptr_t)ptr));
    return WSYNC_OK;
}
