/* The cuda_vmm_fd buffer kind: staging memory made with cuMemCreate (POSIX file descriptor
 * handle type, recommended granularity, at least 2 MiB), exported as an fd; the consumer takes
 * the fd out of the producer process with pidfd_open + pidfd_getfd (same uid, or ptrace
 * permission over the producer) and maps it with cuMemImportFromShareableHandle +
 * cuMemAddressReserve + cuMemMap + cuMemSetAccess. The driver API is reached through
 * cudaGetDriverEntryPointByVersion (no link against libcuda).
 *
 * Handle bytes in the manifest: wsync_cuda_vmm_handle_t (little-endian host layout; producer and
 * consumer share the machine). The nonce makes the bytes unique per allocation, so a cache key
 * never matches a later allocation that reuses the fd number. Thread safe. */
#ifndef WSYNC_CUDA_VMM_H
#define WSYNC_CUDA_VMM_H

#include <stdint.h>

#include "wsync_abi.h"

#define WSYNC_CUDA_VMM_MAGIC 0x4d4d5657u /* "WVMM" */
#define WSYNC_CUDA_VMM_MIN_GRANULARITY (2u << 20)

typedef struct wsync_cuda_vmm_handle {
    uint32_t magic;
    int32_t fd;     /* descriptor number in the producer process */
    uint64_t size;  /* bytes of the allocation (a multiple of the granularity) */
    uint64_t nonce; /* unique per allocation */
} wsync_cuda_vmm_handle_t;

/* One allocation mapped into this process. */
typedef struct wsync_cuda_vmm {
    unsigned long long handle; /* CUmemGenericAllocationHandle (producer only; 0 after map) */
    unsigned long long ptr;    /* CUdeviceptr of the mapping */
    uint64_t size;
    int fd; /* producer: the exported descriptor; -1 otherwise */
    uint64_t nonce;
    uint64_t seg_size; /* torch expandable segments: size of each mapped segment (0: one map) */
    uint32_t n_seg;    /* torch expandable segments: segments mapped back to back */
} wsync_cuda_vmm_t;

/* Producer: allocate at least `bytes` on `device`, map it here, export an fd. */
wsync_result_t wsync_cuda_vmm_create(int device, uint64_t bytes, wsync_cuda_vmm_t *out,
                                     wsync_error_t *err);
/* Handle bytes for the manifest (sizeof(wsync_cuda_vmm_handle_t) bytes into out). */
void wsync_cuda_vmm_handle(const wsync_cuda_vmm_t *v, uint8_t *out, uint32_t *len);
/* Consumer: import the allocation named by the handle bytes from process `pid` and map it on
 * `device`. Errors: BAD_MANIFEST (handle bytes), PERMISSION (pidfd_getfd refused), PEER_GONE
 * (no such process or fd), NOT_SUPPORTED (kernel or driver without the calls), SYSTEM. */
wsync_result_t wsync_cuda_vmm_import(const uint8_t *handle, uint32_t len, int64_t pid, int device,
                                     wsync_cuda_vmm_t *out, wsync_error_t *err);
/* Consumer: import a torch expandable-segment share (kind torch_expandable: the header and
 * fds of wsync_torch_handle.h) from its exporter and map its segments back to back on `device`,
 * as torch's own import does. Errors as wsync_cuda_vmm_import. */
wsync_result_t wsync_cuda_vmm_import_torch(const uint8_t *handle, uint32_t len, int device,
                                           wsync_cuda_vmm_t *out, wsync_error_t *err);
/* Unmap, free the address range and release the allocation (closes the producer's fd). The
 * caller guarantees no work still uses the memory. Safe on a zeroed struct. */
void wsync_cuda_vmm_destroy(wsync_cuda_vmm_t *v);

/* Direct mode's cuda_vmm_run segment (wsync_cuda_vmm_run.c): the run of equal-size cuMem
 * chunks that holds a tensor (PyTorch's expandable segments map their memory this way), found
 * from the tensor's pointer and identified by each chunk's physical allocation
 * (CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID). Exported once: one POSIX fd per chunk, and a memfd
 * listing their numbers, so the handle stays 32 bytes however many chunks the run has. The
 * consumer takes the list and every fd with pidfd_getfd and maps the chunks back to back. */
#define WSYNC_CUDA_VMM_RUN_MAGIC 0x524d5657u /* "WVMR" */

typedef struct wsync_cuda_vmm_run_handle {
    uint32_t magic;
    int32_t list_fd; /* the producer's memfd of n int32 fd numbers */
    uint64_t chunk;  /* bytes of each chunk */
    uint32_t n;      /* chunks */
    uint32_t reserved;
    uint64_t nonce; /* unique per export */
} wsync_cuda_vmm_run_handle_t;

typedef struct wsync_cuda_vmm_run {
    uintptr_t base; /* the first chunk's address in the producer */
    uint64_t chunk;
    uint32_t n;
    uint64_t *blocks;            /* each chunk's CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID */
    unsigned long long *handles; /* exported: each chunk's retained allocation handle */
    int *fds;                    /* exported: each chunk's fd */
    int list_fd;
    uint64_t nonce;
} wsync_cuda_vmm_run_t;

/* Producer: the run holding [at, at + nbytes) of tensor `name` on `device` (not exported). Errors
 * name the tensor: memory that is no cuMem mapping, chunks of unequal sizes, another device. */
wsync_result_t wsync_cuda_vmm_run_probe(const char *name, uintptr_t at, uint64_t nbytes, int device,
                                        wsync_cuda_vmm_run_t *out, wsync_error_t *err);
/* 1 when a and b name the same chunks of the same physical allocations. */
int wsync_cuda_vmm_run_same(const wsync_cuda_vmm_run_t *a, const wsync_cuda_vmm_run_t *b);
/* Export a probed run (fds, list, nonce). An allocation made without the POSIX fd handle type is
 * refused naming the tensor (PyTorch: TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=1). */
wsync_result_t wsync_cuda_vmm_run_export(const char *name, wsync_cuda_vmm_run_t *r,
                                         wsync_error_t *err);
void wsync_cuda_vmm_run_handle(const wsync_cuda_vmm_run_t *r, uint8_t *out, uint32_t *len);
/* Close the fds and release the handles; safe on a probed-only or zeroed run. */
void wsync_cuda_vmm_run_free(wsync_cuda_vmm_run_t *r);
/* Consumer: import a cuda_vmm_run segment of process `pid` and map it on `device`. Errors as
 * wsync_cuda_vmm_import. */
wsync_result_t wsync_cuda_vmm_import_run(const uint8_t *handle, uint32_t len, int64_t pid,
                                         int device, wsync_cuda_vmm_t *out, wsync_error_t *err);

/* Which kind the producer makes: `asked` (WSYNC_CUDA_STAGING_KIND=vmm|ipc, read by
 * wsync_cuda_tuning_read) when not 0; else cuda_vmm_fd, unless Yama's kernel.yama.ptrace_scope is
 * non-zero (consumers could not take the fd): then ipc. */
wsync_buffer_kind_t wsync_cuda_staging_kind(wsync_buffer_kind_t asked);

#endif
