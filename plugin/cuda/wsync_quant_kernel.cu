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

/* Block b's amax and first non-finite element, and the writes when it has none. */
typedef struct wsync_q_block {
    uint32_t r0, c0, r1, c1;
} wsync_q_block_t;

static __device__ __forceinline__ unsigned long long wsync_q_key(uint32_t i, uint32_t r, uint32_t c)
{
    return ((unsigned long long)i << 44) | ((unsigned long long)r << 22) | (unsigned long long)c;
}

/* amax over the CTA (every thread gets it) and whether any thread saw a non-finite value. */
static __device__ __forceinline__ float wsync_q_reduce(float amax, int bad, float *smax, int *sbad)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    bad = __any_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31u) == 0) {
        smax[threadIdx.x / 32] = amax;
        sbad[threadIdx.x / 32] = bad;
    }
    __syncthreads();
    amax = smax[0];
    bad = sbad[0];
#pragma unroll
    for (int w = 1; w < WSYNC_Q_THREADS / 32; w++) {
        amax = fmaxf(amax, smax[w]);
        bad |= sbad[w];
    }
    __syncthreads(); /* smax / sbad are reused by the next block */
    return bad ? -1.0f : amax;
}

/* (1 / amax) x 448 as torch computes 448 / amax; amax at least 1e-4 (an all-zero block). */
static __device__ __forceinline__ float wsync_q_inv(float amax)
{
    return __fmul_rn(__fdiv_rn(1.0f, fmaxf(amax, 1e-4f)), 448.0f);
}

static __device__ __forceinline__ void wsync_q_scale(const wsync_cuda_qop_t &op,
                                                     const wsync_q_block_t &k, float amax)
{
    if (threadIdx.x == 0) {
        /* amax / 448 as torch computes it on the GPU: times the reciprocal (wsync_fp8.h) */
        const float scale = __fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f);
        memcpy(op.scales + (uint64_t)(k.r0 / WSYNC_Q_BLOCK) * op.scale_pitch +
                   4u * (k.c0 / WSYNC_Q_BLOCK),
               &scale, 4);
    }
}

/* vLLM's clamp before the cast: fmaxf(-448, fminf(y, 448)), a NaN y (0 x inf) becoming 448 */
static __device__ __forceinline__ float wsync_q_clamp(float y)
{
    return fmaxf(-448.0f, fminf(y, 448.0f));
}

/* Any layout, one element per thread and step: the thread's largest |x| of block k, and *bad
 * (with first_bad lowered) when one of its values is not finite. */
static __device__ float wsync_q_scalar_amax(const wsync_cuda_qop_t &op, uint32_t i,
                                            const wsync_q_block_t &k, unsigned long long *first_bad,
                                            int *bad)
{
    float amax = 0.0f;
    *bad = 0;
    for (uint32_t e = threadIdx.x; e < WSYNC_Q_BLOCK * WSYNC_Q_BLOCK; e += WSYNC_Q_THREADS) {
        const uint32_t r = k.r0 + e / WSYNC_Q_BLOCK, c = k.c0 + e % WSYNC_Q_BLOCK;
        if (r >= k.r1 || c >= k.c1)
            continue;
        const float x = wsync_q_load(op.src + (uint64_t)r * op.src_pitch, op.src_dtype, c);
        if (!isfinite(x)) {
            if (!*bad && first_bad != NULL)
                atomicMin(first_bad, wsync_q_key(i, r, c));
            *bad = 1;
        }
        amax = fmaxf(amax, fabsf(x));
    }
    return amax;
}

/* Block k's values, one per thread and step, as kClamp ? clamp(x x inv) : x x inv, cast. */
template <int kClamp>
static __device__ void wsync_q_scalar_store(const wsync_cuda_qop_t &op, const wsync_q_block_t &k,
                                            float inv)
{
    for (uint32_t e = threadIdx.x; e < WSYNC_Q_BLOCK * WSYNC_Q_BLOCK; e += WSYNC_Q_THREADS) {
        const uint32_t r = k.r0 + e / WSYNC_Q_BLOCK, c = k.c0 + e % WSYNC_Q_BLOCK;
        if (r >= k.r1 || c >= k.c1)
            continue;
        const float x = wsync_q_load(op.src + (uint64_t)r * op.src_pitch, op.src_dtype, c);
        const float y = kClamp ? wsync_q_clamp(__fmul_rn(x, inv)) : __fmul_rn(x, inv);
        op.dst[(uint64_t)r * op.dst_pitch + c] =
            (unsigned char)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
    }
}

/* Any layout. kQuantize 0: the check alone (the scan). */
template <int kQuantize>
static __device__ void wsync_q_block_scalar(const wsync_cuda_qop_t &op, uint32_t i,
                                            const wsync_q_block_t &k, unsigned long long *first_bad,
                                            float *smax, int *sbad)
{
    int bad;
    float amax = wsync_q_scalar_amax(op, i, k, first_bad, &bad);
    if (!kQuantize)
        return;
    amax = wsync_q_reduce(amax, bad, smax, sbad);
    if (amax < 0.0f)
        return; /* a NaN or infinity: the block is left as it was */
    wsync_q_scalar_store<0>(op, k, wsync_q_inv(amax));
    wsync_q_scale(op, k, amax);
}

static __device__ __forceinline__ int wsync_q_vectors(const wsync_cuda_qop_t &op)
{
    return wsync_cuda_qop_vectors(&op);
}

#define WSYNC_Q_VECS (WSYNC_Q_BLOCK * WSYNC_Q_BLOCK / 8 / WSYNC_Q_THREADS)
typedef struct wsync_q_vecs {
    uint4 v[WSYNC_Q_VECS];
} wsync_q_vecs_t;

/* Thread's vector j of block k: its row and vector column, and whether it is inside the op. */
static __device__ __forceinline__ int wsync_q_at(const wsync_q_block_t &k, int j, uint32_t *r,
                                                 uint32_t *cv)
{
    const uint32_t e = threadIdx.x + (uint32_t)j * WSYNC_Q_THREADS;
    *r = k.r0 + e / 16u;
    *cv = e % 16u;
    return *r < k.r1 && *cv < (k.c1 - k.c0) / 8u;
}

static __device__ __forceinline__ void wsync_q_vload(const wsync_cuda_qop_t &op,
                                                     const wsync_q_block_t &k, wsync_q_vecs_t *x)
{
#pragma unroll
    for (int j = 0; j < WSYNC_Q_VECS; j++) {
        uint32_t r, cv;
        x->v[j] = make_uint4(0, 0, 0, 0);
        if (wsync_q_at(k, j, &r, &cv))
            x->v[j] = __ldcs(reinterpret_cast<const uint4 *>(op.src + (uint64_t)r * op.src_pitch +
                                                             2u * (k.c0 + 8u * cv)));
    }
}

/* The first non-finite value among the thread's vectors, read again from the source (rare: out
 * of the hot loop, so the vectors stay in registers). */
static __device__ __noinline__ void wsync_q_vreport(const wsync_cuda_qop_t &op,
                                                    const wsync_q_block_t &k, uint32_t i,
                                                    uint32_t inf, unsigned long long *first_bad)
{
    for (int j = 0; j < WSYNC_Q_VECS; j++) {
        uint32_t r, cv;
        if (!wsync_q_at(k, j, &r, &cv))
            continue;
        const unsigned short *x = reinterpret_cast<const unsigned short *>(
            op.src + (uint64_t)r * op.src_pitch + 2u * (k.c0 + 8u * cv));
        for (uint32_t h = 0; h < 8; h++)
            if ((x[h] & 0x7fffu) >= inf) {
                atomicMin(first_bad, wsync_q_key(i, r, k.c0 + 8u * cv + h));
                return;
            }
    }
}

/* The thread's largest |x| (as a float) of the loaded vectors; *bad when one is not finite. */
static __device__ __forceinline__ float wsync_q_vcheck(const wsync_cuda_qop_t &op, uint32_t i,
                                                       const wsync_q_block_t &k,
                                                       const wsync_q_vecs_t *x,
                                                       unsigned long long *first_bad, int *bad)
{
    const uint32_t inf = op.src_dtype == WSYNC_Q_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    uint32_t top = 0;
#pragma unroll
    for (int j = 0; j < WSYNC_Q_VECS; j++) {
        const uint32_t w[4] = {x->v[j].x, x->v[j].y, x->v[j].z, x->v[j].w};
#pragma unroll
        for (int h = 0; h < 8; h++)
            top = max(top, (w[h / 2] >> (16 * (h % 2))) & 0x7fffu);
    }
    *bad = top >= inf; /* the largest magnitude is the one that reaches the all-ones exponent */
    if (*bad && first_bad != NULL)
        wsync_q_vreport(op, k, i, inf, first_bad);
    return op.src_dtype == WSYNC_Q_DTYPE_BF16 ? __uint_as_float(top << 16)
                                              : __half2float(__ushort_as_half((unsigned short)top));
}

/* 8 16-bit values (a 16-byte vector of src_dtype) as kClamp ? clamp(x op s) : x op s, cast to
 * e4m3fn: 8 bytes. kDiv: x / s (CHANNEL), else x x s. */
template <int kClamp, int kDiv>
static __device__ __forceinline__ uint2 wsync_q_cvt8(uint4 v, uint32_t dtype, float s)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (int h = 0; h < 8; h += 2) {
        float2 f;
        if (dtype == WSYNC_Q_DTYPE_BF16) {
            f.x = __uint_as_float((w[h / 2] & 0xffffu) << 16);
            f.y = __uint_as_float(w[h / 2] & 0xffff0000u);
        } else {
            f.x = __half2float(__ushort_as_half((unsigned short)(w[h / 2] & 0xffffu)));
            f.y = __half2float(__ushort_as_half((unsigned short)(w[h / 2] >> 16)));
        }
        f.x = kDiv ? __fdiv_rn(f.x, s) : __fmul_rn(f.x, s);
        f.y = kDiv ? __fdiv_rn(f.y, s) : __fmul_rn(f.y, s);
        if (kClamp) {
            f.x = wsync_q_clamp(f.x);
            f.y = wsync_q_clamp(f.y);
        }
        const uint32_t q = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
        out[h / 4] |= q << (16 * ((h / 2) % 2));
    }
    return make_uint2(out[0], out[1]);
}

template <int kClamp>
static __device__ __forceinline__ void wsync_q_vstore(const wsync_cuda_qop_t &op,
                                                      const wsync_q_block_t &k,
                                                      const wsync_q_vecs_t *x, float inv)
{
#pragma unroll
    for (int j = 0; j < WSYNC_Q_VECS; j++) {
        uint32_t r, cv;
        if (!wsync_q_at(k, j, &r, &cv))
            continue;
        __stcs(reinterpret_cast<uint2 *>(op.dst + (uint64_t)r * op.dst_pitch + k.c0 + 8u * cv),
               wsync_q_cvt8<kClamp, 0>(x->v[j], op.src_dtype, inv));
    }
}

/* 16-bit sources in 16-byte vectors (8 values), the whole block held in registers: the source is
 * read once. |x| of bf16 / f16 orders as its bits with the sign cleared, and a value is NaN or
 * infinite exactly when those bits reach the exponent's all-ones pattern. */
template <int kQuantize>
static __device__ __forceinline__ void
wsync_q_block_held(const wsync_cuda_qop_t &op, uint32_t i, const wsync_q_block_t &k,
                   const wsync_q_vecs_t *x, unsigned long long *first_bad, float *smax, int *sbad)
{
    int bad;
    const float mine = wsync_q_vcheck(op, i, k, x, first_bad, &bad);
    if (!kQuantize)
        return;
    const float amax = wsync_q_reduce(mine, bad, smax, sbad);
    if (amax < 0.0f)
        return;
    wsync_q_vstore<0>(op, k, x, wsync_q_inv(amax));
    wsync_q_scale(op, k, amax);
}

template <int kQuantize>
static __device__ void wsync_q_block_vec(const wsync_cuda_qop_t &op, uint32_t i,
                                         const wsync_q_block_t &k, unsigned long long *first_bad,
                                         float *smax, int *sbad)
{
    wsync_q_vecs_t x;
    wsync_q_vload(op, k, &x);
    wsync_q_block_held<kQuantize>(op, i, k, &x, first_bad, smax, sbad);
}

/* A 128 x 128 block of a TENSOR op. kQuantize 0 (the scan): its amax into the group's entry (or
 * the group marked bad); 1: its values with the group's scale, read from that entry. */
template <int kQuantize>
static __device__ void wsync_q_tensor_block(const wsync_cuda_qop_t &op, uint32_t i,
                                            const wsync_q_block_t &k, unsigned long long *first_bad,
                                            unsigned int *amax, float *smax, int *sbad)
{
    const int vec = wsync_q_vectors(op);
    wsync_q_vecs_t x;
    if (!kQuantize) {
        int bad;
        float mine;
        if (vec) {
            wsync_q_vload(op, k, &x);
            mine = wsync_q_vcheck(op, i, k, &x, first_bad, &bad);
        } else {
            mine = wsync_q_scalar_amax(op, i, k, first_bad, &bad);
        }
        const float a = wsync_q_reduce(mine, bad, smax, sbad);
        if (threadIdx.x == 0)
            atomicMax(amax + op.group, a < 0.0f ? WSYNC_CUDA_QUANT_BAD_GROUP : __float_as_uint(a));
        return;
    }
    const unsigned int bits = amax[op.group];
    if (bits == WSYNC_CUDA_QUANT_BAD_GROUP)
        return; /* the tensor holds a NaN or infinity: left as it was */
    /* vLLM's scaled_fp8_quant: scale = amax / 448, each value x x (1 / scale) */
    const float scale = __fdiv_rn(__uint_as_float(bits), 448.0f);
    const float inv = __fdiv_rn(1.0f, scale);
    if (vec) {
        wsync_q_vload(op, k, &x);
        wsync_q_vstore<1>(op, k, &x, inv);
    } else {
        wsync_q_scalar_store<1>(op, k, inv);
    }
    if (op.first && k.r0 == 0 && k.c0 == 0 && threadIdx.x == 0)
        memcpy(op.scales, &scale, 4);
}

/* The first non-finite value of row r among this thread's vectors (t-th of nt threads on the
 * row; rare, out of the hot loop). */
static __device__ __noinline__ void wsync_q_row_report(const wsync_cuda_qop_t &op, uint32_t i,
                                                       uint32_t r, uint32_t t, uint32_t nt,
                                                       uint32_t inf, unsigned long long *first_bad)
{
    const unsigned short *x =
        reinterpret_cast<const unsigned short *>(op.src + (uint64_t)r * op.src_pitch);
    for (uint32_t j = 0; j < WSYNC_CUDA_QROW_VECS; j++) {
        const uint32_t v = t + j * nt;
        if (v >= op.cols / 8u)
            return;
        for (uint32_t h = 0; h < 8; h++)
            if ((x[8u * v + h] & 0x7fffu) >= inf) {
                atomicMin(first_bad, wsync_q_key(i, r, 8u * v + h));
                return;
            }
    }
}

/* vLLM's per-token scale of a row: max(amax / 448, 1 / (448 x 512)) */
static __device__ __forceinline__ float wsync_q_row_scale(float amax)
{
    return fmaxf(__fdiv_rn(amax, 448.0f), 1.0f / (448.0f * 512.0f));
}

/* Unit u of a CHANNEL op with row_warps w: rows u x (8 / w) .. +8 / w, w warps each, the row held
 * in registers. Each value x / scale. kQuantize 0: the check alone. A row holding a NaN is left as
 * it was. Every thread reaches both barriers. */
template <int kQuantize>
static __device__ void wsync_q_rows_vec(const wsync_cuda_qop_t &op, uint32_t i, uint32_t u,
                                        unsigned long long *first_bad, float *smax, int *sbad)
{
    const uint32_t w = op.row_warps, warp = threadIdx.x / 32u, sub = warp / w;
    const uint32_t r = u * (WSYNC_Q_THREADS / 32u / w) + sub;
    const uint32_t t = (warp % w) * 32u + threadIdx.x % 32u, nt = 32u * w, nv = op.cols / 8u;
    const uint32_t inf = op.src_dtype == WSYNC_Q_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    const int live = r < op.rows;
    const unsigned char *row = op.src + (uint64_t)r * op.src_pitch;
    uint4 v[WSYNC_CUDA_QROW_VECS];
    uint32_t top = 0;
#pragma unroll
    for (uint32_t j = 0; j < WSYNC_CUDA_QROW_VECS; j++) {
        const uint32_t c = t + j * nt;
        v[j] = live && c < nv ? __ldcs(reinterpret_cast<const uint4 *>(row) + c)
                              : make_uint4(0, 0, 0, 0);
        const uint32_t x[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int h = 0; h < 8; h++)
            top = max(top, (x[h / 2] >> (16 * (h % 2))) & 0x7fffu);
    }
    int bad = top >= inf;
    if (bad && first_bad != NULL)
        wsync_q_row_report(op, i, r, t, nt, inf, first_bad);
    if (!kQuantize)
        return; /* the whole CTA: no barrier follows */
    float amax = op.src_dtype == WSYNC_Q_DTYPE_BF16
                     ? __uint_as_float(top << 16)
                     : __half2float(__ushort_as_half((unsigned short)top));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    bad = __any_sync(0xffffffffu, bad);
    if (threadIdx.x % 32u == 0) {
        smax[warp] = amax;
        sbad[warp] = bad;
    }
    __syncthreads();
    for (uint32_t k = sub * w; k < sub * w + w; k++) {
        amax = fmaxf(amax, smax[k]);
        bad |= sbad[k];
    }
    __syncthreads(); /* smax / sbad are reused by the next unit */
    if (!live || bad)
        return;
    const float scale = wsync_q_row_scale(amax);
    unsigned char *out = op.dst + (uint64_t)r * op.dst_pitch;
#pragma unroll
    for (uint32_t j = 0; j < WSYNC_CUDA_QROW_VECS; j++) {
        const uint32_t c = t + j * nt;
        if (c < nv)
            __stcs(reinterpret_cast<uint2 *>(out) + c,
                   wsync_q_cvt8<1, 1>(v[j], op.src_dtype, scale));
    }
    if (t == 0)
        memcpy(op.scales + (uint64_t)r * op.scale_pitch, &scale, 4);
}

/* Row r of a CHANNEL op of another layout (row_warps 0), a row per CTA: its amax, then its values
 * read again (from L2). */
template <int kQuantize>
static __device__ void wsync_q_row_scalar(const wsync_cuda_qop_t &op, uint32_t i, uint32_t r,
                                          unsigned long long *first_bad, float *smax, int *sbad)
{
    const unsigned char *row = op.src + (uint64_t)r * op.src_pitch;
    float amax = 0.0f;
    int bad = 0;
    for (uint32_t c = threadIdx.x; c < op.cols; c += WSYNC_Q_THREADS) {
        const float x = wsync_q_load(row, op.src_dtype, c);
        if (!isfinite(x)) {
            if (!bad && first_bad != NULL)
                atomicMin(first_bad, wsync_q_key(i, r, c));
            bad = 1;
        }
        amax = fmaxf(amax, fabsf(x));
    }
    if (!kQuantize)
        return;
    amax = wsync_q_reduce(amax, bad, smax, sbad);
    if (amax < 0.0f)
        return;
    const float scale = wsync_q_row_scale(amax);
    unsigned char *out = op.dst + (uint64_t)r * op.dst_pitch;
    for (uint32_t c = threadIdx.x; c < op.cols; c += WSYNC_Q_THREADS)
        out[c] = (unsigned char)__nv_cvt_float_to_fp8(
            wsync_q_clamp(__fdiv_rn(wsync_q_load(row, op.src_dtype, c), scale)), __NV_SATFINITE,
            __NV_E4M3);
    if (threadIdx.x == 0)
        memcpy(op.scales + (uint64_t)r * op.scale_pitch, &scale, 4);
}

/* Block b of op (whose blocks start at op.block_begin): its rows and columns. */
static __device__ __forceinline__ wsync_q_block_t wsync_q_geom(const wsync_cuda_qop_t &op,
                                                               uint64_t b)
{
    /* below 2^30: rows and cols below 2^22, so a 32-bit division */
    const uint32_t kb = (uint32_t)(b - op.block_begin);
    const uint32_t bcols = op.bcols;
    wsync_q_block_t k;
    k.r0 = kb / bcols * WSYNC_Q_BLOCK;
    k.c0 = kb % bcols * WSYNC_Q_BLOCK;
    k.r1 = min(op.rows, k.r0 + WSYNC_Q_BLOCK);
    k.c1 = min(op.cols, k.c0 + WSYNC_Q_BLOCK);
    return k;
}

/* A CTA's contiguous run of blocks [b, end), so the op it is in changes rarely: op i holds the
 * block last sought, and is looked up again only when the run crosses into the next op. */
typedef struct wsync_q_run {
    uint64_t b, end, next;
    uint32_t i;
} wsync_q_run_t;

static __device__ __forceinline__ void wsync_q_seek(const wsync_cuda_qop_t *ops, uint32_t n,
                                                    uint64_t b, wsync_q_run_t *r)
{
    r->i = wsync_q_find(ops, n, b);
    r->next = r->i + 1 < n ? ops[r->i + 1].block_begin : ~0ull;
}

/* This CTA's run of total_blocks; 0 when it has none. */
static __device__ __forceinline__ int wsync_q_run(const wsync_cuda_qop_t *ops, uint32_t n,
                                                  uint64_t total_blocks, wsync_q_run_t *r)
{
    const uint64_t per = (total_blocks + gridDim.x - 1) / gridDim.x;
    r->b = (uint64_t)blockIdx.x * per;
    r->end = min(total_blocks, r->b + per);
    if (r->b >= r->end)
        return 0;
    wsync_q_seek(ops, n, r->b, r);
    return 1;
}

/* The op holding block b, from op r->i on: b moves forward only, so a few steps of a linear walk
 * before the binary search. */
static __device__ __forceinline__ void wsync_q_advance(const wsync_cuda_qop_t *ops, uint32_t n,
                                                       uint64_t b, wsync_q_run_t *r)
{
#pragma unroll 1
    for (int s = 0; s < 4; s++) {
        if (b < r->next)
            return;
        r->i++;
        r->next = r->i + 1 < n ? ops[r->i + 1].block_begin : ~0ull;
    }
    if (b >= r->next)
        wsync_q_seek(ops, n, b, r);
}

/* This CTA's first block, into r (0 when it has none), and its step: kStrided 0 a contiguous run
 * of blocks, 1 blocks blockIdx.x, + gridDim.x, ... */
template <int kStrided>
static __device__ __forceinline__ int wsync_q_start(const wsync_cuda_qop_t *ops, uint32_t n,
                                                    uint64_t total_blocks, wsync_q_run_t *r,
                                                    uint64_t *step)
{
    *step = kStrided ? gridDim.x : 1;
    if (!kStrided)
        return wsync_q_run(ops, n, total_blocks, r);
    r->b = blockIdx.x;
    r->end = total_blocks;
    if (r->b >= r->end)
        return 0;
    wsync_q_seek(ops, n, r->b, r);
    return 1;
}

/* r->i made the op holding block b, the CTA's next. */
template <int kStrided>
static __device__ __forceinline__ void wsync_q_to(const wsync_cuda_qop_t *ops, uint32_t n,
                                                  uint64_t b, wsync_q_run_t *r)
{
    if (kStrided)
        wsync_q_advance(ops, n, b, r);
    else if (b >= r->next)
        wsync_q_seek(ops, n, b, r);
}

/* Every unit of the table; kStrided as wsync_q_start. */
template <int kQuantize, int kStrided>
__global__ void __launch_bounds__(WSYNC_Q_THREADS, 4)
    wsync_q_kernel(const wsync_cuda_qop_t *__restrict__ ops, uint32_t n, uint64_t total_blocks,
                   unsigned long long *first_bad, unsigned int *amax)
{
    __shared__ float smax[WSYNC_Q_THREADS / 32];
    __shared__ int sbad[WSYNC_Q_THREADS / 32];
    wsync_q_run_t r;
    uint64_t step;
    if (!wsync_q_start<kStrided>(ops, n, total_blocks, &r, &step))
        return;
    for (uint64_t b = r.b; b < r.end; b += step) {
        wsync_q_to<kStrided>(ops, n, b, &r);
        const uint32_t i = r.i;
        const wsync_cuda_qop_t &op = ops[i];
        if (op.kind == WSYNC_QUANT_FP8_CHANNEL) {
            const uint32_t u = (uint32_t)(b - op.block_begin);
            if (op.row_warps != 0)
                wsync_q_rows_vec<kQuantize>(op, i, u, first_bad, smax, sbad);
            else
                wsync_q_row_scalar<kQuantize>(op, i, u, first_bad, smax, sbad);
            continue;
        }
        const wsync_q_block_t k = wsync_q_geom(op, b);
        if (op.kind == WSYNC_QUANT_FP8_TENSOR)
            wsync_q_tensor_block<kQuantize>(op, i, k, first_bad, amax, smax, sbad);
        else if (wsync_q_vectors(op))
            wsync_q_block_vec<kQuantize>(op, i, k, first_bad, smax, sbad);
        else
            wsync_q_block_scalar<kQuantize>(op, i, k, first_bad, smax, sbad);
    }
}

/* A full 128 x 128 bf16 block, the common case: no bounds, no dtype tests. The thread's
 * vectors are rows tid / 16 + 16 j, vector column tid % 16 (as wsync_q_at). */
static __device__ __forceinline__ int wsync_q_full(const wsync_cuda_qop_t &op,
                                                   const wsync_q_block_t &k)
{
    return op.src_dtype == WSYNC_Q_DTYPE_BF16 && k.r1 - k.r0 == WSYNC_Q_BLOCK &&
           k.c1 - k.c0 == WSYNC_Q_BLOCK;
}

static __device__ __forceinline__ void
wsync_q_vload_full(const wsync_cuda_qop_t &op, const wsync_q_block_t &k, wsync_q_vecs_t *x)
{
    const uint64_t pitch = op.src_pitch;
    const unsigned char *p = op.src + (uint64_t)(k.r0 + threadIdx.x / 16u) * pitch +
                             2u * (k.c0 + 8u * (threadIdx.x % 16u));
#pragma unroll
    for (int j = 0; j < WSYNC_Q_VECS; j++)
        x->v[j] = __ldcs(reinterpret_cast<const uint4 *>(p + (uint64_t)j * 16u * pitch));
}

static __device__ __forceinline__ void
wsync_q_block_full(const wsync_cuda_qop_t &op, uint32_t i, const wsync_q_block_t &k,
                   const wsync_q_vecs_t *x, unsigned long long *first_bad, float *smax, int *sbad)
{
    uint32_t top = 0;
#pragma unroll
    for (int j = 0; j < WSYNC_Q_VECS; j++) {
        const uint32_t w[4] = {x->v[j].x, x->v[j].y, x->v[j].z, x->v[j].w};
#pragma unroll
        for (int h = 0; h < 8; h++)
            top = max(top, (w[h / 2] >> (16 * (h % 2))) & 0x7fffu);
    }
    const int bad = top >= 0x7f80u;
    if (bad && first_bad != NULL)
        wsync_q_vreport(op, k, i, 0x7f80u, first_bad);
    const float amax = wsync_q_reduce(__uint_as_float(top << 16), bad, smax, sbad);
    if (amax < 0.0f)
        return;
    const float inv = wsync_q_inv(amax);
    const uint64_t pitch = op.dst_pitch;
    unsigned char *p =
        op.dst + (uint64_t)(k.r0 + threadIdx.x / 16u) * pitch + k.c0 + 8u * (threadIdx.x % 16u);
#pragma unroll
    for (int j = 0; j < WSYNC_Q_VECS; j++)
        __stcs(reinterpret_cast<uint2 *>(p + (uint64_t)j * 16u * pitch),
               wsync_q_cvt8<0, 0>(x->v[j], WSYNC_Q_DTYPE_BF16, inv));
    wsync_q_scale(op, k, amax);
}

/* Block k of op: loaded in the fast or the general form. */
template <int kFast>
static __device__ __forceinline__ void
wsync_q_vload_any(const wsync_cuda_qop_t &op, const wsync_q_block_t &k, wsync_q_vecs_t *x)
{
    if (kFast && wsync_q_full(op, k))
        wsync_q_vload_full(op, k, x);
    else
        wsync_q_vload(op, k, x);
}

/* A table of vectored BLOCK ops alone (WSYNC_CUDA_QUANT_VEC_BLOCKS): as wsync_q_kernel<1>, with
 * the CTA's next block loaded before this block's reduction, so its loads stay in flight across
 * the barriers; two register sets, two CTAs of 256 per SM. kStrided 0: each CTA a contiguous run
 * of blocks; 1: CTA c takes blocks c, c + grid, ... (the CTAs running at once read neighbouring
 * blocks). kFast: full bf16 blocks through the path without bounds or dtype tests. */
template <int kStrided, int kFast>
__global__ void __launch_bounds__(WSYNC_Q_THREADS, 2)
    wsync_q_ahead_kernel(const wsync_cuda_qop_t *__restrict__ ops, uint32_t n,
                         uint64_t total_blocks, unsigned long long *first_bad)
{
    __shared__ float smax[WSYNC_Q_THREADS / 32];
    __shared__ int sbad[WSYNC_Q_THREADS / 32];
    wsync_q_run_t r;
    uint64_t step;
    if (!wsync_q_start<kStrided>(ops, n, total_blocks, &r, &step))
        return;
    wsync_q_block_t k = wsync_q_geom(ops[r.i], r.b);
    wsync_q_vecs_t x, y;
    wsync_q_vload_any<kFast>(ops[r.i], k, &y);
    for (uint64_t b = r.b; b < r.end; b += step) {
        const uint32_t ci = r.i;
        const wsync_q_block_t ck = k;
        x = y;
        if (b + step < r.end) {
            wsync_q_to<kStrided>(ops, n, b + step, &r);
            k = wsync_q_geom(ops[r.i], b + step);
            wsync_q_vload_any<kFast>(ops[r.i], k, &y);
        }
        if (kFast && wsync_q_full(ops[ci], ck))
            wsync_q_block_full(ops[ci], ci, ck, &x, first_bad, smax, sbad);
        else
            wsync_q_block_held<1>(ops[ci], ci, ck, &x, first_bad, smax, sbad);
    }
}

/* Launch kernel<kQuantize> in one wave: as many CTAs as the device holds at once (each takes a
 * contiguous run of blocks, so any grid is correct). The CTAs per SM a kernel fits are asked
 * once; the SM count per call (its device). */
template <typename F> static int wsync_q_per_sm(F kernel, int fallback)
{
    int k = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, kernel, WSYNC_Q_THREADS, 0) !=
            cudaSuccess ||
        k <= 0) {
        (void)cudaGetLastError();
        k = fallback;
    }
    return k;
}

template <int kQuantize>
static cudaError_t wsync_q_launch(const wsync_cuda_qop_t *ops, uint32_t n, uint64_t total_blocks,
                                  unsigned long long *first_bad, unsigned int *amax, uint32_t flags,
                                  cudaStream_t s)
{
    /* asked once (function-local statics: initialised once, thread safe) */
    static const int per_sm = wsync_q_per_sm(wsync_q_kernel<kQuantize, 0>, 4);
    static const int per_sm_ahead = wsync_q_per_sm(wsync_q_ahead_kernel<0, 0>, 2);
    int dev = 0, sms = 0;
    if (n == 0 || total_blocks == 0)
        return cudaSuccess;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms <= 0) {
        (void)cudaGetLastError();
        sms = 132;
    }
    const int ahead = kQuantize && (flags & WSYNC_CUDA_QUANT_VEC_BLOCKS) != 0;
    const uint64_t wave = (uint64_t)sms * (uint64_t)(ahead ? per_sm_ahead : per_sm);
    const unsigned grid = (unsigned)(total_blocks < wave ? total_blocks : wave);
    const int strided = (flags & WSYNC_CUDA_QUANT_STRIDED) != 0;
    if (ahead) {
        const int fast = (flags & WSYNC_CUDA_QUANT_GENERIC) == 0;
#define WSYNC_Q_AHEAD(S, F)                                                                        \
    if (strided == S && fast == F)                                                                 \
        wsync_q_ahead_kernel<S, F>                                                                 \
            <<<grid, WSYNC_Q_THREADS, 0, s>>>(ops, n, total_blocks, first_bad);
        WSYNC_Q_AHEAD(0, 0)
        WSYNC_Q_AHEAD(0, 1)
        WSYNC_Q_AHEAD(1, 0)
        WSYNC_Q_AHEAD(1, 1)
#undef WSYNC_Q_AHEAD
    } else if (strided) {
        wsync_q_kernel<kQuantize, 1>
            <<<grid, WSYNC_Q_THREADS, 0, s>>>(ops, n, total_blocks, first_bad, amax);
    } else {
        wsync_q_kernel<kQuantize, 0>
            <<<grid, WSYNC_Q_THREADS, 0, s>>>(ops, n, total_blocks, first_bad, amax);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t wsync_cuda_quant_scan(const wsync_cuda_qop_t *ops, uint32_t n,
                                             uint64_t total_blocks, unsigned long long *first_bad,
                                             unsigned int *amax, cudaStream_t s)
{
    return wsync_q_launch<0>(ops, n, total_blocks, first_bad, amax, 0u, s);
}

extern "C" cudaError_t wsync_cuda_quant_blocks(const wsync_cuda_qop_t *ops, uint32_t n,
                                               uint64_t total_blocks, unsigned long long *first_bad,
                                               const unsigned int *amax, uint32_t flags,
                                               cudaStream_t s)
{
    return wsync_q_launch<1>(ops, n, total_blocks, first_bad, const_cast<unsigned int *>(amax),
                             flags, s);
}
