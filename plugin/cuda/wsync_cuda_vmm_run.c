/* Direct mode's cuda_vmm_run segments: see wsync_cuda_vmm.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "wsync_cuda.h"
#include "wsync_cuda_vmm.h"
#include "wsync_cuda_vmm_api.h"
#include "wsync_direct.h"
#include "wsync_error.h"

#define WSYNC_CUDA_VMM_RUN_MAX (1u << 22) /* chunks of one run (8 PiB of 2 MiB chunks) */

/* The cuMem mapping holding p: its start, size, physical allocation and device. */
static int chunk_at(uintptr_t p, uintptr_t *base, uint64_t *size, uint64_t *block, int *ordinal)
{
    unsigned long long b = 0, sz = 0, id = 0;
    int ord = -1;
    int attrs[4] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                    CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[4] = {&b, &sz, &id, &ord};
    if (!wsync_cuda_pointer_attrs((const void *)p, 4, attrs, data) || sz == 0 || b == 0 || p < b ||
        p - b >= sz)
        return 0;
    *base = (uintptr_t)b;
    *size = sz;
    *block = id;
    *ordinal = ord;
    return 1;
}

wsync_result_t wsync_cuda_vmm_run_probe(const char *name, uintptr_t at, uint64_t nbytes, int device,
                                        wsync_cuda_vmm_run_t *out, wsync_error_t *err)
{
    memset(out, 0, sizeof(*out));
    out->list_fd = -1;
    uintptr_t base;
    uint64_t chunk, block;
    int ordinal;
    if (!chunk_at(at, &base, &chunk, &block, &ordinal))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "tensor \"%.80s\" at %p is neither a cudaMalloc segment nor a cuMem "
                          "mapping the driver can describe: stage this tensor instead",
                          name, (void *)at);
    if (ordinal != device)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\" is on device %d, this staging on device %d", name,
                          ordinal, device);
    const uint64_t span = (uint64_t)(at - base) + (nbytes ? nbytes : 1);
    const uint64_t n = (span + chunk - 1) / chunk;
    if (n > WSYNC_CUDA_VMM_RUN_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "tensor \"%.80s\" spans %llu cuMem chunks of %llu bytes (at most %u)",
                          name, (unsigned long long)n, (unsigned long long)chunk,
                          WSYNC_CUDA_VMM_RUN_MAX);
    out->blocks = malloc(n * sizeof(*out->blocks));
    if (out->blocks == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %llu chunk ids",
                          (unsigned long long)n);
    out->base = base;
    out->chunk = chunk;
    out->n = (uint32_t)n;
    out->blocks[0] = block;
    for (uint32_t k = 1; k < out->n; k++) {
        const uintptr_t q = base + (uintptr_t)k * chunk;
        uintptr_t b2 = 0;
        uint64_t c2 = 0;
        int o2 = -1;
        if (!chunk_at(q, &b2, &c2, &out->blocks[k], &o2) || b2 != q || c2 != chunk ||
            o2 != device) {
            wsync_cuda_vmm_run_free(out);
            return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                              "tensor \"%.80s\": its cuMem memory is not one run of equal "
                              "chunks (%llu bytes from %p, then at +%llu %s): stage this tensor "
                              "instead",
                              name, (unsigned long long)chunk, (void *)base,
                              (unsigned long long)((uint64_t)k * chunk),
                              b2 != q ? "no chunk starts" : "a chunk of another size or device");
        }
    }
    return WSYNC_OK;
}

int wsync_cuda_vmm_run_same(const wsync_cuda_vmm_run_t *a, const wsync_cuda_vmm_run_t *b)
{
    return a->base == b->base && a->chunk == b->chunk && a->n == b->n &&
           memcmp(a->blocks, b->blocks, a->n * sizeof(*a->blocks)) == 0;
}

wsync_result_t wsync_cuda_vmm_run_export(const char *name, wsync_cuda_vmm_run_t *r,
                                         wsync_error_t *err)
{
    const wsync_cuda_vmm_api_t *api = wsync_cuda_vmm_api(err);
    if (api == NULL)
        return err != NULL ? err->code : WSYNC_ERR_NOT_SUPPORTED;
    r->handles = calloc(r->n, sizeof(*r->handles));
    r->fds = malloc(r->n * sizeof(*r->fds));
    int32_t *list = malloc(r->n * sizeof(*list));
    wsync_result_t rc = WSYNC_OK;
    if (r->handles == NULL || r->fds == NULL || list == NULL) {
        free(list);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to export %u chunks", r->n);
    }
    for (uint32_t k = 0; k < r->n; k++)
        r->fds[k] = -1;
    for (uint32_t k = 0; k < r->n && rc == WSYNC_OK; k++) {
        CUmemGenericAllocationHandle h = 0;
        CUresult cr = api->retain(&h, (void *)(r->base + (uintptr_t)k * r->chunk));
        if (cr != CUDA_SUCCESS) {
            rc = wsync_cuda_vmm_cu_fail(err, cr, "stage", "cuMemRetainAllocationHandle");
            break;
        }
        r->handles[k] = h;
        int fd = -1;
        cr = api->export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (cr != CUDA_SUCCESS)
            rc = WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                            "tensor \"%.80s\": its cuMem memory cannot be exported as a POSIX "
                            "fd (cuMemExportToShareableHandle: CUresult %d): it was made without "
                            "that handle type; PyTorch makes its expandable segments exportable "
                            "when TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=1 is set before its first "
                            "CUDA allocation; else stage this tensor",
                            name, (int)cr);
        r->fds[k] = fd;
        list[k] = fd;
    }
    if (rc == WSYNC_OK) {
        r->list_fd = memfd_create("wsync-vmm-run", MFD_CLOEXEC);
        const size_t want = r->n * sizeof(*list);
        if (r->list_fd < 0 || write(r->list_fd, list, want) != (ssize_t)want)
            rc = WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "memfd for the fds of %u chunks: %s", r->n,
                            strerror(errno));
    }
    free(list);
    if (rc != WSYNC_OK) {
        wsync_cuda_vmm_run_free(r);
        return rc;
    }
    r->nonce = wsync_cuda_vmm_nonce();
    wsync_direct_allow_readers();
    return WSYNC_OK;
}

void wsync_cuda_vmm_run_handle(const wsync_cuda_vmm_run_t *r, uint8_t *out, uint32_t *len)
{
    wsync_cuda_vmm_run_handle_t h = {.magic = WSYNC_CUDA_VMM_RUN_MAGIC,
                                     .list_fd = r->list_fd,
                                     .chunk = r->chunk,
                                     .n = r->n,
                                     .nonce = r->nonce};
    memcpy(out, &h, sizeof(h));
    *len = sizeof(h);
}

void wsync_cuda_vmm_run_free(wsync_cuda_vmm_run_t *r)
{
    const wsync_cuda_vmm_api_t *api = r->handles != NULL ? wsync_cuda_vmm_api(NULL) : NULL;
    for (uint32_t k = 0; r->fds != NULL && k < r->n; k++)
        if (r->fds[k] >= 0)
            close(r->fds[k]);
    for (uint32_t k = 0; api != NULL && k < r->n; k++)
        if (r->handles[k] != 0)
            api->release(r->handles[k]);
    if (r->list_fd >= 0)
        close(r->list_fd);
    free(r->blocks);
    free(r->handles);
    free(r->fds);
    memset(r, 0, sizeof(*r));
    r->list_fd = -1;
}

wsync_result_t wsync_cuda_vmm_import_run(const uint8_t *handle, uint32_t len, int64_t pid,
                                         int device, wsync_cuda_vmm_t *out, wsync_error_t *err)
{
    wsync_cuda_vmm_run_handle_t h;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (len != sizeof(h))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "cuda_vmm_run handle has %u bytes, expected %zu", len, sizeof(h));
    memcpy(&h, handle, sizeof(h));
    if (h.magic != WSYNC_CUDA_VMM_RUN_MAGIC || h.list_fd < 0 || h.n == 0 ||
        h.n > WSYNC_CUDA_VMM_RUN_MAX || h.chunk == 0 || pid <= 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "cuda_vmm_run handle is not one wsync made (magic %08x, list fd %d, %u "
                          "chunks of %llu bytes, pid %lld)",
                          h.magic, h.list_fd, h.n, (unsigned long long)h.chunk, (long long)pid);
    int pidfd = -1, lfd = -1;
    wsync_result_t rc = wsync_cuda_vmm_pidfd(pid, &pidfd, err);
    if (rc != WSYNC_OK)
        return rc;
    int32_t *fds = malloc(h.n * sizeof(*fds));
    if (fds == NULL)
        rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %u fd numbers", h.n);
    if (rc == WSYNC_OK)
        rc = wsync_cuda_vmm_take_fd(pidfd, pid, h.list_fd, &lfd, err);
    if (rc == WSYNC_OK) {
        struct stat st;
        const size_t want = h.n * sizeof(*fds);
        if (fstat(lfd, &st) != 0 || (uint64_t)st.st_size != want ||
            pread(lfd, fds, want, 0) != (ssize_t)want)
            rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                            "cuda_vmm_run: the producer's list (fd %d of pid %lld) does not hold "
                            "the %u fd numbers the handle announces",
                            h.list_fd, (long long)pid, h.n);
        close(lfd);
    }
    if (rc == WSYNC_OK)
        rc = wsync_cuda_vmm_map_fds(pidfd, pid, fds, h.n, h.chunk, device, out, err);
    if (rc == WSYNC_OK)
        out->nonce = h.nonce;
    free(fds);
    close(pidfd);
    return rc;
}
