/* The cuMem driver calls and fd helpers shared by wsync_cuda_vmm.c (staging allocations, torch's
 * expandable shares) and wsync_cuda_vmm_run.c (direct mode's runs of cuMem chunks). Private to
 * plugin/cuda. */
#ifndef WSYNC_CUDA_VMM_API_H
#define WSYNC_CUDA_VMM_API_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "wsync_abi.h"
#include "wsync_cuda_vmm.h"

typedef struct wsync_cuda_vmm_api {
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                          unsigned long long);
    CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*error_name)(CUresult, const char **);
    CUresult (*retain)(CUmemGenericAllocationHandle *, void *);
    int ok;
} wsync_cuda_vmm_api_t;

/* The driver's entry points, loaded once; NULL (err set, NOT_SUPPORTED) when any is missing. */
const wsync_cuda_vmm_api_t *wsync_cuda_vmm_api(wsync_error_t *err);
/* A value unique per export in this process (the nonce that makes an export's handle bytes, so a
 * cache key, new even where fd numbers are reused). */
uint64_t wsync_cuda_vmm_nonce(void);
/* SYSTEM (OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY) naming the call and CUresult r. */
wsync_result_t wsync_cuda_vmm_cu_fail(wsync_error_t *err, int r, const char *where,
                                      const char *what);
/* Read/write access for `device` over [p, p + size): a CUresult. */
int wsync_cuda_vmm_rw(unsigned long long p, size_t size, int device);
/* The recommended mapping granularity on `device` (at least 2 MiB); 0 with *rc set on error. */
size_t wsync_cuda_vmm_granularity(int device, wsync_error_t *err, wsync_result_t *rc);
/* pidfd_open(pid) of an fd-based handle's exporter; pidfd_getfd of its descriptor `remote`. */
wsync_result_t wsync_cuda_vmm_pidfd(int64_t pid, int *out, wsync_error_t *err);
wsync_result_t wsync_cuda_vmm_take_fd(int pidfd, int64_t pid, int remote, int *out,
                                      wsync_error_t *err);
/* Take n descriptors (fds[], the exporter's numbers) through pidfd, import each and map them back
 * to back, seg_size bytes each, on `device`: out->ptr, size, seg_size, n_seg. */
wsync_result_t wsync_cuda_vmm_map_fds(int pidfd, int64_t pid, const int32_t *fds, uint32_t n,
                                      uint64_t seg_size, int device, wsync_cuda_vmm_t *out,
                                      wsync_error_t *err);

#endif
