/* A trainer's memory as PyTorch's default caching allocator lays it out (no
 * PYTORCH_CUDA_ALLOC_CONF), for tensors allocated one after another and never freed, as a
 * model's parameters are: constants and rules of c10/cuda/CUDACachingAllocator.cpp (PyTorch
 * 2.11). A request is rounded up to 512 bytes; one of at most 1 MiB comes from the small pool,
 * whose segments are 2 MiB; one below 10 MiB from the large pool's 20 MiB segments; a larger one
 * gets a segment of its own, rounded up to 2 MiB. Each request takes the smallest free block of
 * its pool that holds it (best fit), split when what is left is a block the pool keeps (in the
 * small pool 512 bytes or more, in the large pool more than 1 MiB; else the request keeps the
 * whole block), or a new segment. */
#ifndef WSYNC_BENCH_POOL_H
#define WSYNC_BENCH_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct wb_pool {
    size_t n_seg;
    uint64_t *seg_bytes;  /* per segment: its cudaMalloc size */
    size_t *seg;          /* per tensor: its segment */
    uint64_t *offset;     /* per tensor: its offset in that segment */
    unsigned char **base; /* per segment, once allocated (wb_pool_alloc) */
} wb_pool_t;

/* Places n tensors of bytes[i] in allocation order; -1 if out of host memory. */
int wb_pool_place(const uint64_t *bytes, size_t n, wb_pool_t *out);
/* cudaMalloc of every segment; per tensor its address (malloc'd, n of them), NULL on failure. */
unsigned char **wb_pool_alloc(wb_pool_t *p, size_t n);
void wb_pool_free(wb_pool_t *p);

#endif
