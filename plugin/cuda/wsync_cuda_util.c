/* CUDA error text, device identity, NVTX ranges and process-wide counters. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "wsync_cuda.h"
#include "wsync_error.h"
#include "wsync_log.h"

wsync_cuda_stats_t wsync_cuda_stats;

/* Driver calls found through the runtime (no link against libcuda), looked up once. */
typedef int (*wsync_cu_mem_get_address_range_fn)(unsigned long long *base, size_t *size,
                                                 unsigned long long ptr);
typedef int (*wsync_cu_write64_fn)(cudaStream_t s, unsigned long long addr,
                                   unsigned long long value, unsigned int flags);
typedef int (*wsync_cu_pointer_attr_fn)(void *data, int attribute, unsigned long long ptr);
typedef int (*wsync_cu_pointer_attrs_fn)(unsigned n, int *attributes, void **data,
                                         unsigned long long ptr);
static wsync_cu_pointer_attrs_fn wsync_cu_attrs;
static wsync_cu_mem_get_address_range_fn wsync_cu_range;
static wsync_cu_pointer_attr_fn wsync_cu_attr;
static wsync_cu_write64_fn wsync_cu_write64;
static pthread_once_t wsync_cu_once = PTHREAD_ONCE_INIT;

static void *wsync_cu_entry(const char *name)
{
    enum cudaDriverEntryPointQueryResult q;
    void *f = NULL;
    if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return f;
}

static void wsync_cu_find(void)
{
    wsync_cu_range = (wsync_cu_mem_get_address_range_fn)wsync_cu_entry("cuMemGetAddressRange");
    wsync_cu_write64 = (wsync_cu_write64_fn)wsync_cu_entry("cuStreamWriteValue64");
    wsync_cu_attr = (wsync_cu_pointer_attr_fn)wsync_cu_entry("cuPointerGetAttribute");
    wsync_cu_attrs = (wsync_cu_pointer_attrs_fn)wsync_cu_entry("cuPointerGetAttributes");
}

int wsync_cuda_pointer_attrs(const void *p, unsigned n, int *attributes, void **out)
{
    pthread_once(&wsync_cu_once, wsync_cu_find);
    return wsync_cu_attrs != NULL &&
           wsync_cu_attrs(n, attributes, out, (unsigned long long)(uintptr_t)p) == 0;
}

int wsync_cuda_pointer_attr(const void *p, int attribute, void *out)
{
    pthread_once(&wsync_cu_once, wsync_cu_find);
    return wsync_cu_attr != NULL &&
           wsync_cu_attr(out, attribute, (unsigned long long)(uintptr_t)p) == 0;
}

cudaError_t wsync_cuda_write_value64(cudaStream_t s, void *p, uint64_t v)
{
    pthread_once(&wsync_cu_once, wsync_cu_find);
    if (wsync_cu_write64 == NULL)
        return cudaErrorNotSupported;
    return wsync_cu_write64(s, (unsigned long long)(uintptr_t)p, v, 0) == 0 ? cudaSuccess
                                                                            : cudaErrorNotSupported;
}

int wsync_cuda_alloc_range(const void *p, uintptr_t *base, size_t *size)
{
    pthread_once(&wsync_cu_once, wsync_cu_find);
    unsigned long long b = 0;
    size_t n = 0;
    if (wsync_cu_range == NULL || wsync_cu_range(&b, &n, (unsigned long long)(uintptr_t)p) != 0)
        return 0;
    *base = (uintptr_t)b;
    *size = n;
    return 1;
}

wsync_result_t wsync_cuda_fail(wsync_error_t *err, cudaError_t e, const char *where,
                               const char *what)
{
    wsync_result_t code = WSYNC_ERR_SYSTEM;
    if (e == cudaErrorMemoryAllocation)
        code = WSYNC_ERR_OUT_OF_MEMORY;
    else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        code = WSYNC_ERR_NO_DEVICE;
    (void)cudaGetLastError(); /* clear a sticky launch error so the next call is not blamed */
    return wsync_fail(err, code, where, "%s failed: %s (%s, CUDA error %d)", what,
                      cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
}

wsync_result_t wsync_cuda_use_device(int device, wsync_error_t *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return wsync_cuda_fail(err, e, __func__, "cudaGetDeviceCount");
    if (device < 0 || device >= n)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "device_ordinal %d is not a CUDA device here (this process sees %d); "
                          "pass an ordinal in [0, %d)",
                          device, n, n);
    WSYNC_CUDA_TRY(err, cudaSetDevice(device));
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_device_uuid(int device, char *out, wsync_error_t *err)
{
    struct cudaDeviceProp p;
    WSYNC_CUDA_TRY(err, cudaGetDeviceProperties(&p, device));
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out, WSYNC_DEVICE_MAX,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    return WSYNC_OK;
}

void wsync_cuda_range_push(const char *name)
{
    nvtxRangePushA(name);
}

void wsync_cuda_range_pop(void)
{
    nvtxRangePop();
}

void wsync_cuda_stats_log(int enabled)
{
    if (!enabled)
        return;
    WSYNC_LOG_INFO("wsync-cuda stats ipc_mem_opens=%llu ipc_mem_closes=%llu ipc_event_opens=%llu "
                   "launches=%llu copy_calls=%llu records=%llu",
                   (unsigned long long)atomic_load(&wsync_cuda_stats.ipc_mem_opens),
                   (unsigned long long)atomic_load(&wsync_cuda_stats.ipc_mem_closes),
                   (unsigned long long)atomic_load(&wsync_cuda_stats.ipc_event_opens),
                   (unsigned long long)atomic_load(&wsync_cuda_stats.launches),
                   (unsigned long long)atomic_load(&wsync_cuda_stats.copy_calls),
                   (unsigned long long)atomic_load(&wsync_cuda_stats.records));
}
