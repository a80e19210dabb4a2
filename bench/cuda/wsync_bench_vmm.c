/* See wsync_bench_vmm.h. */
#include "wsync_bench_vmm.h"

#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

typedef struct wb_cu {
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*address_free)(CUdeviceptr, size_t);
} wb_cu_t;

static void *wb_cu_fn(const char *name)
{
    enum cudaDriverEntryPointQueryResult q;
    void *f = NULL;
    if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        f == NULL) {
        fprintf(stderr, "wsync-bench-cuda: the driver has no %s\n", name);
        exit(1);
    }
    return f;
}

static const wb_cu_t *wb_cu(void)
{
    static wb_cu_t cu;
    if (cu.create == NULL) {
        cu.reserve = wb_cu_fn("cuMemAddressReserve");
        cu.map = wb_cu_fn("cuMemMap");
        cu.set_access = wb_cu_fn("cuMemSetAccess");
        cu.unmap = wb_cu_fn("cuMemUnmap");
        cu.release = wb_cu_fn("cuMemRelease");
        cu.address_free = wb_cu_fn("cuMemAddressFree");
        cu.create = wb_cu_fn("cuMemCreate");
    }
    return &cu;
}

#define WB_CU(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "wsync-bench-cuda: %s:%d %s: CUresult %d\n", __FILE__, __LINE__,       \
                    #call, (int)r_);                                                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

unsigned char *wb_vmm_alloc(uint64_t bytes, wb_vmm_t *v)
{
    const wb_cu_t *cu = wb_cu();
    const size_t n = (size_t)((bytes + WB_VMM_CHUNK - 1) / WB_VMM_CHUNK);
    v->size = n * WB_VMM_CHUNK;
    v->chunks = calloc(n ? n : 1, sizeof(*v->chunks));
    if (v->chunks == NULL) {
        fprintf(stderr, "wsync-bench-cuda: no host memory for %zu chunks\n", n);
        exit(1);
    }
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr base = 0;
    WB_CU(cu->reserve(&base, v->size, 0, 0, 0));
    for (size_t k = 0; k < n; k++) {
        CUmemGenericAllocationHandle h;
        WB_CU(cu->create(&h, WB_VMM_CHUNK, &prop, 0));
        v->chunks[k] = (unsigned long long)h;
        WB_CU(cu->map(base + k * WB_VMM_CHUNK, WB_VMM_CHUNK, 0, h, 0));
    }
    const CUmemAccessDesc rw = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    WB_CU(cu->set_access(base, v->size, &rw, 1));
    v->base = (unsigned long long)base;
    return (unsigned char *)(uintptr_t)base;
}

void wb_vmm_free(wb_vmm_t *v)
{
    const wb_cu_t *cu = wb_cu();
    if (v->chunks == NULL)
        return;
    WB_CU(cu->unmap((CUdeviceptr)v->base, v->size));
    for (size_t k = 0; k < v->size / WB_VMM_CHUNK; k++)
        WB_CU(cu->release((CUmemGenericAllocationHandle)v->chunks[k]));
    WB_CU(cu->address_free((CUdeviceptr)v->base, v->size));
    free(v->chunks);
    v->chunks = NULL;
}
