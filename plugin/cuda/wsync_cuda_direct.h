/* Direct mode on the CUDA backend: the producer's cudaMalloc segments as cuda_ipc segments of a
 * direct manifest (handle: the 64 IPC bytes, then the 8-byte allocation id), and its cuMem
 * memory (PyTorch's expandable segments) as cuda_vmm_run segments (wsync_cuda_vmm.h). */
#ifndef WSYNC_CUDA_DIRECT_H
#define WSYNC_CUDA_DIRECT_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "wsync_cuda_vmm.h"
#include "wsync_direct.h"

typedef struct wsync_cuda_export {
    uintptr_t base;
    size_t size;
    uint64_t id;    /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
    uint64_t stamp; /* the build that last found it here (wsync_cuda_exports_t.builds) */
    cudaIpcMemHandle_t handle;
} wsync_cuda_export_t;

/* A staging's exports, kept for its life (one per segment ever named; a cuMem run replaced when
 * its address holds other memory). */
typedef struct wsync_cuda_exports {
    wsync_cuda_export_t *at;
    size_t *order; /* indices into at, by base address (one entry per base: a binary search) */
    size_t n, cap;
    uint64_t builds; /* wsync_cuda_direct_stage calls so far */
    wsync_cuda_vmm_run_t *runs;
    size_t n_runs, cap_runs;
} wsync_cuda_exports_t;

/* Stage `t` (device memory on `device`) into `set` (wsync_direct_stage): every tensor located in
 * its segment, segments not seen before exported. Errors name the tensor: not device memory,
 * another device, cuMem memory that cannot be exported. */
wsync_result_t wsync_cuda_direct_stage(wsync_cuda_exports_t *x, int device, const char *uuid,
                                       const wsync_stage_tensor_t *t, size_t n,
                                       wsync_direct_set_t *set, wsync_error_t *err);
void wsync_cuda_exports_free(wsync_cuda_exports_t *x);

#endif
