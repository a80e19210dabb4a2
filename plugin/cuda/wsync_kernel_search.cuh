/* Device-side search shared by the copy and convert kernels: the op a work unit (chunk, tile)
 * belongs to, in a table sorted by each op's first unit. */
#ifndef WSYNC_KERNEL_SEARCH_CUH
#define WSYNC_KERNEL_SEARCH_CUH

#include <stdint.h>

/* Index of the last of ops[0..n_ops) whose first unit (op.*BEGIN) is <= u; n_ops > 0. */
template <typename OP, uint64_t OP::*BEGIN>
static __device__ __forceinline__ uint32_t wsync_k_last_begin(const OP *__restrict__ ops,
                                                              uint32_t n_ops, uint64_t u)
{
    uint32_t lo = 0, hi = n_ops - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) >> 1;
        if (ops[mid].*BEGIN <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

#endif
