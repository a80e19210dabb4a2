/* See wsync_cuda_vmm.h. */
#define _GNU_SOURCE
#include "wsync_cuda_vmm.h"
#include "wsync_cuda_vmm_api.h"
#include "wsync_direct.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_torch_handle.h"

static wsync_cuda_vmm_api_t api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void *entry(const char *name, int *ok)
{
    void *f = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || f == NULL)
        *ok = 0;
    return f;
}

static void api_load(void)
{
    int ok = 1;
    api.granularity = entry("cuMemGetAllocationGranularity", &ok);
    api.create = entry("cuMemCreate", &ok);
    api.export_fd = entry("cuMemExportToShareableHandle", &ok);
    api.import_fd = entry("cuMemImportFromShareableHandle", &ok);
    api.reserve = entry("cuMemAddressReserve", &ok);
    api.map = entry("cuMemMap", &ok);
    api.set_access = entry("cuMemSetAccess", &ok);
    api.unmap = entry("cuMemUnmap", &ok);
    api.address_free = entry("cuMemAddressFree", &ok);
    api.release = entry("cuMemRelease", &ok);
    api.error_name = entry("cuGetErrorName", &ok);
    api.retain = entry("cuMemRetainAllocationHandle", &ok);
    api.ok = ok;
}

static wsync_result_t need_api(wsync_error_t *err)
{
    pthread_once(&api_once, api_load);
    if (!api.ok)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "the CUDA driver does not provide the cuMem* virtual memory calls "
                          "(driver entry points missing): use WSYNC_CUDA_STAGING_KIND=ipc");
    return WSYNC_OK;
}

uint64_t wsync_cuda_vmm_nonce(void)
{
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)getpid() << 40) ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)ts.tv_nsec ^
           (atomic_fetch_add(&counter, 1) << 56);
}

const wsync_cuda_vmm_api_t *wsync_cuda_vmm_api(wsync_error_t *err)
{
    return need_api(err) == WSYNC_OK ? &api : NULL;
}

wsync_result_t wsync_cuda_vmm_cu_fail(wsync_error_t *err, int r, const char *where,
                                      const char *what)
{
    const char *name = "?";
    if (api.error_name)
        api.error_name(r, &name);
    return wsync_fail(err,
                      r == CUDA_ERROR_OUT_OF_MEMORY ? WSYNC_ERR_OUT_OF_MEMORY : WSYNC_ERR_SYSTEM,
                      where, "%s failed: %s (CUresult %d)", what, name, (int)r);
}

#define CU_TRY(call, what)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            rc = wsync_cuda_vmm_cu_fail(err, r_, __func__, what);                                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static void prop_init(CUmemAllocationProp *p, int device)
{
    memset(p, 0, sizeof(*p));
    p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = device;
    p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Read/write access for `device` over [p, p + size). */
int wsync_cuda_vmm_rw(unsigned long long p, size_t size, int device)
{
    CUmemAccessDesc a;
    memset(&a, 0, sizeof(a));
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return api.set_access(p, size, &a, 1);
}

/* Reserve, map and enable read/write access for `device`; on success v->ptr is set. */
static wsync_result_t map_here(wsync_cuda_vmm_t *v, CUmemGenericAllocationHandle h, int device,
                               size_t align, wsync_error_t *err)
{
    wsync_result_t rc = WSYNC_OK;
    CUdeviceptr p = 0;
    int mapped = 0;
    CU_TRY(api.reserve(&p, v->size, align, 0, 0), "cuMemAddressReserve");
    CU_TRY(api.map(p, v->size, 0, h, 0), "cuMemMap");
    mapped = 1;
    CU_TRY(wsync_cuda_vmm_rw(p, v->size, device), "cuMemSetAccess");
    v->ptr = p;
    return WSYNC_OK;
fail:
    if (mapped)
        api.unmap(p, v->size);
    if (p)
        api.address_free(p, v->size);
    return rc;
}

size_t wsync_cuda_vmm_granularity(int device, wsync_error_t *err, wsync_result_t *rc)
{
    CUmemAllocationProp prop;
    prop_init(&prop, device);
    size_t g = 0;
    CUresult r = api.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS) {
        *rc = wsync_cuda_vmm_cu_fail(err, r, __func__, "cuMemGetAllocationGranularity");
        return 0;
    }
    while (g < WSYNC_CUDA_VMM_MIN_GRANULARITY)
        g *= 2;
    return g;
}

wsync_result_t wsync_cuda_vmm_create(int device, uint64_t bytes, wsync_cuda_vmm_t *out,
                                     wsync_error_t *err)
{
    wsync_result_t rc = need_api(err);
    if (rc != WSYNC_OK)
        return rc;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    (void)cudaFree(0); /* the runtime's primary context must exist for the driver calls */
    size_t g = wsync_cuda_vmm_granularity(device, err, &rc);
    if (g == 0)
        return rc;
    out->size = (bytes + g - 1) / g * g;
    CUmemAllocationProp prop;
    prop_init(&prop, device);
    CUmemGenericAllocationHandle h = 0;
    CU_TRY(api.create(&h, out->size, &prop, 0), "cuMemCreate(POSIX_FILE_DESCRIPTOR)");
    out->handle = h;
    int fd = -1;
    CU_TRY(api.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)");
    out->fd = fd;
    rc = map_here(out, h, device, g, err);
    if (rc != WSYNC_OK)
        goto fail;
    out->nonce = wsync_cuda_vmm_nonce();
    return WSYNC_OK;
fail:
    wsync_cuda_vmm_destroy(out);
    return rc;
}

void wsync_cuda_vmm_handle(const wsync_cuda_vmm_t *v, uint8_t *out, uint32_t *len)
{
    wsync_cuda_vmm_handle_t h = {
        .magic = WSYNC_CUDA_VMM_MAGIC, .fd = v->fd, .size = v->size, .nonce = v->nonce};
    memcpy(out, &h, sizeof(h));
    *len = sizeof(h);
}

/* pidfd_open(pid): the exporter of an fd-based handle. */
wsync_result_t wsync_cuda_vmm_pidfd(int64_t pid, int *out, wsync_error_t *err)
{
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pidfd < 0) {
        int e = errno;
        return WSYNC_FAIL(err, e == ENOSYS ? WSYNC_ERR_NOT_SUPPORTED : WSYNC_ERR_PEER_GONE,
                          "pidfd_open(producer pid %lld): %s; the producer must be alive on this "
                          "machine (Linux >= 5.6 for fd handles; else WSYNC_CUDA_STAGING_KIND=ipc)",
                          (long long)pid, strerror(e));
    }
    *out = pidfd;
    return WSYNC_OK;
}

/* pidfd_getfd: a copy of the producer's descriptor `remote` in this process. */
wsync_result_t wsync_cuda_vmm_take_fd(int pidfd, int64_t pid, int remote, int *out,
                                      wsync_error_t *err)
{
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, remote, 0);
    int e = errno;
    if (fd >= 0) {
        *out = fd;
        return WSYNC_OK;
    }
    if (e == EPERM || e == EACCES)
        return WSYNC_FAIL(err, WSYNC_ERR_PERMISSION,
                          "pidfd_getfd(pid %lld, fd %d): %s: taking the producer's fd needs the "
                          "same uid as the producer and ptrace permission over it (Yama "
                          "kernel.yama.ptrace_scope <= 1 with the producer a descendant, or "
                          "CAP_SYS_PTRACE); else set WSYNC_CUDA_STAGING_KIND=ipc in the "
                          "producer (torch: expandable_segments:False)",
                          (long long)pid, remote, strerror(e));
    return WSYNC_FAIL(err, e == ENOSYS ? WSYNC_ERR_NOT_SUPPORTED : WSYNC_ERR_PEER_GONE,
                      "pidfd_getfd(pid %lld, fd %d): %s (Linux >= 5.6 needed; is the "
                      "producer's allocation still alive?)",
                      (long long)pid, remote, strerror(e));
}

wsync_result_t wsync_cuda_vmm_import(const uint8_t *handle, uint32_t len, int64_t pid, int device,
                                     wsync_cuda_vmm_t *out, wsync_error_t *err)
{
    wsync_cuda_vmm_handle_t h;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (len != sizeof(h))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "cuda_vmm_fd handle has %u bytes, expected %zu", len, sizeof(h));
    memcpy(&h, handle, sizeof(h));
    if (h.magic != WSYNC_CUDA_VMM_MAGIC || h.fd < 0 || h.size == 0 || pid <= 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "cuda_vmm_fd handle is not one wsync made (magic %08x, fd %d, size %llu, "
                          "pid %lld)",
                          h.magic, h.fd, (unsigned long long)h.size, (long long)pid);
    wsync_result_t rc = need_api(err);
    if (rc != WSYNC_OK)
        return rc;
    int pidfd = -1, fd = -1;
    rc = wsync_cuda_vmm_pidfd(pid, &pidfd, err);
    if (rc != WSYNC_OK)
        return rc;
    rc = wsync_cuda_vmm_take_fd(pidfd, pid, h.fd, &fd, err);
    close(pidfd);
    if (rc != WSYNC_OK)
        return rc;
    (void)cudaFree(0);
    CUmemGenericAllocationHandle mh = 0;
    out->size = h.size;
    out->nonce = h.nonce;
    CU_TRY(api.import_fd(&mh, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           "cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)");
    close(fd);
    fd = -1;
    size_t g = wsync_cuda_vmm_granularity(device, err, &rc);
    if (g == 0)
        goto fail;
    rc = map_here(out, mh, device, g, err);
    api.release(mh); /* the mapping keeps the allocation alive until it is unmapped */
    mh = 0;
    if (rc != WSYNC_OK)
        goto fail;
    return WSYNC_OK;
fail:
    if (fd >= 0)
        close(fd);
    if (mh)
        api.release(mh);
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    return rc;
}

wsync_result_t wsync_cuda_vmm_map_fds(int pidfd, int64_t pid, const int32_t *fds, uint32_t n,
                                      uint64_t seg_size, int device, wsync_cuda_vmm_t *out,
                                      wsync_error_t *err)
{
    wsync_result_t rc = need_api(err);
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (rc != WSYNC_OK)
        return rc;
    size_t g = 0;
    (void)cudaFree(0);
    if ((g = wsync_cuda_vmm_granularity(device, err, &rc)) == 0)
        return rc;
    if (n == 0 || seg_size == 0 || seg_size % g != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%u segments of %llu bytes: segments must be a non-zero multiple of "
                          "the device's %zu-byte granularity",
                          n, (unsigned long long)seg_size, g);
    CUmemGenericAllocationHandle *mh = calloc(n, sizeof(*mh));
    if (mh == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %u segment handles", n);
    uint32_t got = 0, mapped = 0;
    CUdeviceptr p = 0;
    for (; got < n; got++) {
        int fd = -1;
        if ((rc = wsync_cuda_vmm_take_fd(pidfd, pid, fds[got], &fd, err)) != WSYNC_OK)
            goto fail;
        CUresult r = api.import_fd(&mh[got], (void *)(uintptr_t)fd,
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        if (r != CUDA_SUCCESS) {
            rc =
                wsync_cuda_vmm_cu_fail(err, r, __func__, "cuMemImportFromShareableHandle(segment)");
            goto fail;
        }
    }
    out->seg_size = seg_size;
    out->size = seg_size * n;
    CU_TRY(api.reserve(&p, out->size, g, 0, 0), "cuMemAddressReserve");
    for (; mapped < n; mapped++)
        CU_TRY(api.map(p + mapped * seg_size, seg_size, 0, mh[mapped], 0), "cuMemMap(segment)");
    CU_TRY(wsync_cuda_vmm_rw(p, out->size, device), "cuMemSetAccess");
    for (uint32_t i = 0; i < n; i++)
        api.release(mh[i]); /* the mappings keep the allocations alive until unmapped */
    free(mh);
    out->ptr = p;
    out->n_seg = n;
    return WSYNC_OK;
fail:
    for (uint32_t i = 0; i < mapped; i++)
        api.unmap(p + i * seg_size, seg_size);
    if (p)
        api.address_free(p, out->size);
    for (uint32_t i = 0; i < got; i++)
        api.release(mh[i]);
    free(mh);
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    return rc;
}

wsync_result_t wsync_cuda_vmm_import_torch(const uint8_t *handle, uint32_t len, int device,
                                           wsync_cuda_vmm_t *out, wsync_error_t *err)
{
    wsync_torch_segments_t seg;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    wsync_result_t rc = wsync_torch_segments_decode(handle, len, &seg, err);
    if (rc != WSYNC_OK)
        return rc;
    int pidfd = -1;
    if ((rc = wsync_cuda_vmm_pidfd(seg.pid, &pidfd, err)) != WSYNC_OK)
        return rc;
    rc = wsync_cuda_vmm_map_fds(pidfd, seg.pid, seg.fds, seg.n, seg.segment_size, device, out, err);
    close(pidfd);
    return rc;
}

void wsync_cuda_vmm_destroy(wsync_cuda_vmm_t *v)
{
    if (v->ptr && v->n_seg > 0) {
        for (uint32_t i = 0; i < v->n_seg; i++)
            api.unmap(v->ptr + i * v->seg_size, v->seg_size);
        api.address_free(v->ptr, v->size);
    } else if (v->ptr) {
        api.unmap(v->ptr, v->size);
        api.address_free(v->ptr, v->size);
    }
    if (v->handle) { /* producer: the allocation and its exported descriptor */
        api.release(v->handle);
        if (v->fd >= 0)
            close(v->fd);
    }
    memset(v, 0, sizeof(*v));
    v->fd = -1;
}

wsync_buffer_kind_t wsync_cuda_staging_kind(wsync_buffer_kind_t asked)
{
    if (asked != 0)
        return asked;
    /* Default: cuda_vmm_fd (it reads at local speed, docs/PERFORMANCE.md) where a consumer of
     * the same uid may take the fd: no Yama LSM, or ptrace_scope 0. Under a stricter Yama
     * setting a sibling consumer would get EPERM from pidfd_getfd: stay with legacy IPC. */
    const int scope = wsync_yama_ptrace_scope();
    if (scope != 0) {
        WSYNC_LOG_INFO("kernel.yama.ptrace_scope is %d: staging uses legacy CUDA IPC (set "
                       "WSYNC_CUDA_STAGING_KIND=vmm when consumers may take the producer's fds)",
                       scope);
        return WSYNC_BUFFER_CUDA_IPC;
    }
    return WSYNC_BUFFER_CUDA_VMM_FD;
}
