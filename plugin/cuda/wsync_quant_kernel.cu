/* FP8 block quantization on the GPU. See wsync_quant_kernel.h. */
#include "wsync_quant_kernel.h"
#include "wsync_kernel_search.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define WSYNC_Q_BLOCK 128
#define WSYNC_Q_THREADS 256
#define WSYNC_Q_DTYPE_BF16 1u
#define WSYNC_Q_DTYPE_F16 2u

static __device__ __forceinline__ float wsync_q_load(const unsigned char *row, uint32_t dtype,
                                                     uint32_t c)
{
    if (dtype == WSYNC_Q_DTYPE_BF16)
        return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(row)[c]);
    if (dtype == WSYNC_Q_DTYPE_F16)
        return __half2float(reinterpret_cast<const __half *>(row)[c]);
    return reinterpret_cast<const float *>(row)[c];
}

/* The op holding flat block b (ops sorted by block_begin). */
static __device__ __forceinline__ uint32_t wsync_q_find(const wsync_cuda_qop_t *ops, uint32_t n,
                                                        uint64_t b)
{
    return wsync_k_last_begin<wsync_cuda_qop_t, &wsync_cuda_qop_t::block_begin>(ops, n, b);
}

__global__ void __launch_bounds__(WSYNC_Q_THREADS)
    wsync_q_scan(const wsync_cuda_qop_t *__restrict__ ops, uint32_t n, uint64_t total_blocks,
                 unsigned long long *first_bad)
{
    for (uint64_t b = blockIdx.x; b < total_blocks; b += gridDim.x) {
        const uint32_t i = wsync_q_find(ops, n, b);
        const wsync_cuda_qop_t &op = ops[i];
        const uint64_t k = b - op.block_begin;
        const uint32_t r0 = (uint32_t)(k / op.bcols) * WSYNC_Q_BLOCK;
        const uint32_t c0 = (uint32_t)(k % op.bcols) * WSYNC_Q_BLOCK;
        const uint32_t r1 = min(op.rows, r0 + WSYNC_Q_BLOCK), c1 = min(op.cols, c0 + WSYNC_Q_BLOCK);
        for (uint32_t e = threadIdx.x; e < WSYNC_Q_BLOCK * WSYNC_Q_BLOCK; e += WSYNC_Q_THREADS) {
            const uint32_t r = r0 + e / WSYNC_Q_BLOCK, c = c0 + e % WSYNC_Q_BLOCK;
            if (r >= r1 || c >= c1)
                continue;
            const float x = wsync_q_load(op.src + (uint64_t)r * op.src_pitch, op.src_dtype, c);
            if (!isfinite(x))
                atomicMin(first_bad, ((unsigned long long)i << 44) | ((unsigned long long)r << 22) |
                                         (unsigned long long)c);
        }
    }
}

__global__ void __launch_bounds__(WSYNC_Q_THREADS)
    wsync_q_blocks(const wsync_cuda_qop_t *__restrict__ ops, uint32_t n, uint64_t total_blocks)
{
    __shared__ float warp_max[WSYNC_Q_THREADS / 32];
    for (uint64_t b = blockIdx.x; b < total_blocks; b += gridDim.x) {
        const wsync_cuda_qop_t &op = ops[wsync_q_find(ops, n, b)];
        const uint64_t k = b - op.block_begin;
        const uint32_t r0 = (uint32_t)(k / op.bcols) * WSYNC_Q_BLOCK;
        const uint32_t c0 = (uint32_t)(k % op.bcols) * WSYNC_Q_BLOCK;
        const uint32_t r1 = min(op.rows, r0 + WSYNC_Q_BLOCK), c1 = min(op.cols, c0 + WSYNC_Q_BLOCK);
        float amax = 0.0f;
        for (uint32_t e = threadIdx.x; e < WSYNC_Q_BLOCK * WSYNC_Q_BLOCK; e += WSYNC_Q_THREADS) {
            const uint32_t r = r0 + e / WSYNC_Q_BLOCK, c = c0 + e % WSYNC_Q_BLOCK;
            if (r < r1 && c < c1)
                amax = fmaxf(amax, fabsf(wsync_q_load(op.src + (uint64_t)r * op.src_pitch,
                                                      op.src_dtype, c)));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if ((threadIdx.x & 31u) == 0)
            warp_max[threadIdx.x / 32] = amax;
        __syncthreads();
        amax = warp_max[0];
#pragma unroll
        for (int w = 1; w < WSYNC_Q_THREADS / 32; w++)
            amax = fmaxf(amax, warp_max[w]);
        __syncthreads(); /* warp_max is reused by the next block */
        amax = fmaxf(amax, 1e-4f);
        const float inv = __fmul_rn(__fdiv_rn(1.0f, amax), 448.0f); /* torch: reciprocal x 448 */
        for (uint32_t e = threadIdx.x; e < WSYNC_Q_BLOCK * WSYNC_Q_BLOCK; e += WSYNC_Q_THREADS) {
            const uint32_t r = r0 + e / WSYNC_Q_BLOCK, c = c0 + e % WSYNC_Q_BLOCK;
            if (r >= r1 || c >= c1)
                continue;
            const float x = wsync_q_load(op.src + (uint64_t)r * op.src_pitch, op.src_dtype, c);
            op.dst[(uint64_t)r * op.dst_pitch + c] =
                (unsigned char)__nv_cvt_float_to_fp8(__fmul_rn(x, inv), __NV_SATFINITE, __NV_E4M3);
        }
        if (threadIdx.x == 0) {
            const float scale = __fdiv_rn(amax, 448.0f);
            memcpy(op.scales + (uint64_t)(r0 / WSYNC_Q_BLOCK) * op.scale_pitch +
                       4u * (c0 / WSYNC_Q_BLOCK),
                   &scale, 4);
        }
    }
}

static unsigned wsync_q_grid(uint64_t total_blocks)
{
    return (unsigned)(total_blocks < 132u * 8u ? total_blocks : 132u * 8u);
}

extern "C" cudaError_t wsync_cuda_quant_scan(const wsync_cuda_qop_t *ops, uint32_t n,
                                             uint64_t total_blocks, unsigned long long *first_bad,
                                             cudaStream_t s)
{
    if (n == 0 || total_blocks == 0)
        return cudaSuccess;
    wsync_q_scan<<<wsync_q_grid(total_blocks), WSYNC_Q_THREADS, 0, s>>>(ops, n, total_blocks,
                                                                        first_bad);
    return cudaGetLastError();
}

extern "C" cudaError_t wsync_cuda_quant_blocks(const wsync_cuda_qop_t *ops, uint32_t n,
                                               uint64_t total_blocks, cudaStream_t s)
{
    if (n == 0 || total_blocks == 0)
        return cudaSuccess;
    wsync_q_blocks<<<wsync_q_grid(total_blocks), WSYNC_Q_THREADS, 0, s>>>(ops, n, total_blocks);
    return cudaGetLastError();
}
