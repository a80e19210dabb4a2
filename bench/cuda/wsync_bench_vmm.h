/* A trainer's memory as PyTorch's expandable segments hold it (PYTORCH_CUDA_ALLOC_CONF=
 * expandable_segments:True): one reserved address range mapped with cuMem chunks of 20 MiB, the
 * page the allocator maps for its large pool (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp,
 * Note [Expandable Segments]), each chunk exportable as a POSIX fd. The driver's entry points are
 * asked through the runtime, so the benchmark links no libcuda. */
#ifndef WSYNC_BENCH_VMM_H
#define WSYNC_BENCH_VMM_H

#include <stddef.h>
#include <stdint.h>

#define WB_VMM_CHUNK (20ull << 20)

typedef struct wb_vmm {
    unsigned long long base; /* CUdeviceptr */
    size_t size;
    unsigned long long *chunks; /* CUmemGenericAllocationHandle, size / WB_VMM_CHUNK of them */
} wb_vmm_t;

/* At least `bytes` of cuMem memory on device 0; the program ends naming the call on failure. */
unsigned char *wb_vmm_alloc(uint64_t bytes, wb_vmm_t *v);
void wb_vmm_free(wb_vmm_t *v);

#endif
