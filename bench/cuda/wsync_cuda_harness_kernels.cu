/* Device helpers of the harness: pattern fill, pattern check, spin. */
#include "wsync_cuda_harness.h"

static __device__ __forceinline__ unsigned long long wh_mix(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void wh_fill_kernel(unsigned char *p, size_t bytes, unsigned long long seed,
                               unsigned long long mask)
{
    size_t words = bytes / 8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long w = wh_mix(seed + i) & mask;
        if ((((uintptr_t)p) & 7u) == 0) {
            reinterpret_cast<unsigned long long *>(p)[i] = w;
        } else {
            for (int b = 0; b < 8; b++)
                p[i * 8 + b] = (unsigned char)(w >> (8 * b));
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long w = wh_mix(seed + words) & mask;
        for (size_t b = words * 8; b < bytes; b++)
            p[b] = (unsigned char)(w >> (8 * (b - words * 8)));
    }
}

__global__ void wh_check_kernel(const unsigned char *p, size_t bytes, unsigned long long seed,
                                unsigned long long mask, unsigned long long *bad)
{
    size_t words = (bytes + 7) / 8;
    unsigned long long n = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long w = wh_mix(seed + i) & mask;
        size_t nb = bytes - i * 8 < 8 ? bytes - i * 8 : 8;
        for (size_t b = 0; b < nb; b++)
            if (p[i * 8 + b] != (unsigned char)(w >> (8 * b))) {
                n++;
                break;
            }
    }
    if (n)
        atomicAdd(bad, n);
}

__global__ void wh_spin_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" cudaError_t wh_fill_mask(void *p, size_t bytes, uint64_t seed, uint64_t mask,
                                    cudaStream_t s)
{
    if (bytes == 0)
        return cudaSuccess;
    wh_fill_kernel<<<1024, 256, 0, s>>>((unsigned char *)p, bytes, seed, mask);
    return cudaGetLastError();
}

extern "C" cudaError_t wh_fill(void *p, size_t bytes, uint64_t seed, cudaStream_t s)
{
    return wh_fill_mask(p, bytes, seed, ~0ull, s);
}

extern "C" cudaError_t wh_count_bad_mask(const void *p, size_t bytes, uint64_t seed, uint64_t mask,
                                         unsigned long long *bad, cudaStream_t s)
{
    if (bytes == 0)
        return cudaSuccess;
    wh_check_kernel<<<1024, 256, 0, s>>>((const unsigned char *)p, bytes, seed, mask, bad);
    return cudaGetLastError();
}

extern "C" cudaError_t wh_count_bad(const void *p, size_t bytes, uint64_t seed,
                                    unsigned long long *bad, cudaStream_t s)
{
    return wh_count_bad_mask(p, bytes, seed, ~0ull, bad, s);
}

extern "C" cudaError_t wh_spin(uint64_t ns, cudaStream_t s)
{
    wh_spin_kernel<<<1, 32, 0, s>>>(ns);
    return cudaGetLastError();
}
