/* Batched 2-D copy with an optional fused wsync64 digest. See wsync_copy_kernel.h. */
#include "wsync_copy_kernel.h"
#include "wsync_kernel_search.cuh"

#include <string.h>

#define WSYNC_K_GOLDEN 0x9E3779B97F4A7C15ull
#define WSYNC_K_UNROLL_2D 4

static __device__ __forceinline__ unsigned long long wsync_k_mix(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <bool STREAM> static __device__ __forceinline__ uint4 wsync_k_load(const unsigned char *p)
{
    const uint4 *q = reinterpret_cast<const uint4 *>(p);
    if (STREAM)
        return __ldcs(q);
    return *q;
}

template <bool STREAM>
static __device__ __forceinline__ void wsync_k_store(unsigned char *p, uint4 v)
{
    uint4 *q = reinterpret_cast<uint4 *>(p);
    if (STREAM)
        __stcs(q, v);
    else
        *q = v;
}

/* Digest contribution of one 16-byte vector whose first 8-byte word is logical word j, given
 * jg = j * G (mod 2^64; the next word's is jg + G). */
static __device__ __forceinline__ unsigned long long wsync_k_vec_sum_jg(uint4 v,
                                                                        unsigned long long jg)
{
    unsigned long long w0 = (unsigned long long)v.x | ((unsigned long long)v.y << 32);
    unsigned long long w1 = (unsigned long long)v.z | ((unsigned long long)v.w << 32);
    return wsync_k_mix(w0 ^ jg) + wsync_k_mix(w1 ^ (jg + WSYNC_K_GOLDEN));
}

/* The same for the vector whose first byte is logical byte `l` (16-aligned). */
static __device__ __forceinline__ unsigned long long wsync_k_vec_sum(uint4 v, unsigned long long l)
{
    return wsync_k_vec_sum_jg(v, (l >> 3) * WSYNC_K_GOLDEN);
}

/* Several short rows in one chunk (a row-parallel slice): index math per vector. Kept out of
 * line so that the registers of the 1-D loop stay few. */
template <bool DIG, bool STREAM, bool STORE = true>
static __device__ __noinline__ void
wsync_k_rows(const wsync_cuda_op_t &op, const unsigned char *sbase, unsigned char *dbase,
             unsigned long long lbase, uint32_t segv, uint32_t nv, unsigned long long &acc)
{
    const uint32_t tid = threadIdx.x;
    const uint32_t nt = WSYNC_CUDA_BLOCK_THREADS;
    for (uint32_t base = tid; base < nv; base += nt * WSYNC_K_UNROLL_2D) {
        uint4 v[WSYNC_K_UNROLL_2D];
#pragma unroll
        for (int u = 0; u < WSYNC_K_UNROLL_2D; u++) {
            const uint32_t idx = base + (uint32_t)u * nt;
            const uint32_t r = idx / segv;
            const uint32_t cv = idx - r * segv;
            if (idx < nv)
                v[u] =
                    wsync_k_load<STREAM>(sbase + (uint64_t)r * op.src_pitch + (uint64_t)cv * 16u);
        }
#pragma unroll
        for (int u = 0; u < WSYNC_K_UNROLL_2D; u++) {
            const uint32_t idx = base + (uint32_t)u * nt;
            const uint32_t r = idx / segv;
            const uint32_t cv = idx - r * segv;
            if (idx < nv) {
                if (STORE)
                    wsync_k_store<STREAM>(dbase + (uint64_t)r * op.dst_pitch + (uint64_t)cv * 16u,
                                          v[u]);
                if (DIG)
                    acc += wsync_k_vec_sum(v[u], lbase + (unsigned long long)r * op.row_bytes +
                                                     (unsigned long long)cv * 16u);
            }
        }
    }
}

/* One chunk of a vector-path op: nrows rows of [c0, c1) bytes each. */
template <bool DIG, bool STREAM, int U, bool STORE = true>
static __device__ __forceinline__ void wsync_k_chunk_vec(const wsync_cuda_op_t &op, uint64_t k,
                                                         unsigned long long &acc)
{
    const uint64_t cpr = op.chunks_per_row;
    const uint64_t rg = cpr == 1 ? k : k / cpr;
    const uint64_t part = k - rg * cpr;
    const uint64_t row0 = rg * op.rows_per_chunk;
    const uint64_t rows_left = op.rows - row0;
    const uint32_t nrows = rows_left < op.rows_per_chunk ? (uint32_t)rows_left : op.rows_per_chunk;
    const uint64_t c0 = part * WSYNC_CUDA_CHUNK_BYTES;
    const uint64_t c1 = min(op.row_bytes, c0 + WSYNC_CUDA_CHUNK_BYTES);
    const uint32_t seg = (uint32_t)(c1 - c0);
    const uint32_t segv = seg >> 4;
    const uint32_t nv = nrows * segv;
    const unsigned char *sbase = op.src + row0 * op.src_pitch + c0;
    unsigned char *dbase = op.dst + row0 * op.dst_pitch + c0;
    const unsigned long long lbase = row0 * op.row_bytes + c0;
    const uint32_t tid = threadIdx.x;
    const uint32_t nt = WSYNC_CUDA_BLOCK_THREADS; /* compile-time: immediate address offsets */

    if (nrows == 1) {
        /* The common case: one contiguous run, U independent 16-byte loads in flight. Vector idx
         * starts at logical word (lbase >> 3) + 2 idx: its j * G advances by a constant per
         * unrolled step and per loop turn, so the digest needs no multiply for it. */
        const unsigned long long step = 2ull * nt * WSYNC_K_GOLDEN; /* one unrolled step (nt) */
        unsigned long long jg = DIG ? ((lbase >> 3) + 2ull * tid) * WSYNC_K_GOLDEN : 0;
        for (uint32_t base = tid; base < nv; base += nt * U, jg += (unsigned long long)U * step) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint32_t idx = base + (uint32_t)u * nt;
                if (idx < nv)
                    v[u] = wsync_k_load<STREAM>(sbase + (uint64_t)idx * 16u);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint32_t idx = base + (uint32_t)u * nt;
                if (idx < nv) {
                    if (STORE)
                        wsync_k_store<STREAM>(dbase + (uint64_t)idx * 16u, v[u]);
                    if (DIG)
                        acc += wsync_k_vec_sum_jg(v[u], jg + (unsigned long long)u * step);
                }
            }
        }
    } else {
        wsync_k_rows<DIG, STREAM, STORE>(op, sbase, dbase, lbase, segv, nv, acc);
    }
    /* A 1-D op whose length is not a multiple of 16 ends in a short tail. */
    const uint32_t tail = seg & 15u;
    if (tail != 0 && tid == 0) {
        const unsigned char *s = sbase + (uint64_t)segv * 16u;
        unsigned char *d = dbase + (uint64_t)segv * 16u;
        unsigned long long w[2] = {0, 0};
        for (uint32_t b = 0; b < tail; b++) {
            unsigned char x = s[b];
            if (STORE)
                d[b] = x;
            w[b >> 3] |= (unsigned long long)x << (8u * (b & 7u));
        }
        if (DIG) {
            unsigned long long j = (lbase + (unsigned long long)segv * 16u) >> 3;
            acc += wsync_k_mix(w[0] ^ (j * WSYNC_K_GOLDEN));
            if (tail > 8)
                acc += wsync_k_mix(w[1] ^ ((j + 1) * WSYNC_K_GOLDEN));
        }
    }
}

/* One chunk of a byte-path op: logical bytes [k*CHUNK, ...) of the rows concatenated, one 8-byte
 * logical word per thread step. Slow, for misaligned sources or destinations only. */
template <bool DIG, bool STORE = true>
static __device__ __noinline__ void wsync_k_chunk_bytes(const wsync_cuda_op_t &op, uint64_t k,
                                                        unsigned long long &acc)
{
    const uint64_t total = op.rows * op.row_bytes;
    const uint64_t l0 = k * WSYNC_CUDA_CHUNK_BYTES;
    const uint64_t l1 = min(total, l0 + WSYNC_CUDA_CHUNK_BYTES);
    const uint32_t nw = (uint32_t)((l1 - l0 + 7) >> 3);
    for (uint32_t w = threadIdx.x; w < nw; w += blockDim.x) {
        const uint64_t l = l0 + 8ull * w;
        const uint32_t n = (uint32_t)min(8ull, (unsigned long long)(l1 - l));
        uint64_t r = l / op.row_bytes;
        uint64_t col = l - r * op.row_bytes;
        unsigned long long word = 0;
        for (uint32_t b = 0; b < n; b++) {
            unsigned char x = op.src[r * op.src_pitch + col];
            if (STORE)
                op.dst[r * op.dst_pitch + col] = x;
            word |= (unsigned long long)x << (8u * b);
            if (++col == op.row_bytes) {
                col = 0;
                r++;
            }
        }
        if (DIG)
            acc += wsync_k_mix(word ^ ((l >> 3) * WSYNC_K_GOLDEN));
    }
}

static __device__ __forceinline__ void wsync_k_flush(unsigned long long &acc,
                                                     unsigned long long *sums, uint32_t i)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31u) == 0 && acc != 0)
        atomicAdd(&sums[i], acc);
    acc = 0;
}

/* Index of the last op whose first chunk is <= c (ops are sorted by chunk_begin). */
__device__ __forceinline__ uint32_t wsync_k_find_op(const wsync_cuda_op_t *__restrict__ ops,
                                                    uint32_t n_ops, uint64_t c)
{
    return wsync_k_last_begin<wsync_cuda_op_t, &wsync_cuda_op_t::chunk_begin>(ops, n_ops, c);
}

/* STORE false: the digest pass of the weight checker (reads and sums, writes nothing). */
template <bool VERIFY, bool STREAM, int U, int MINB, bool STORE = true>
__global__ void __launch_bounds__(WSYNC_CUDA_BLOCK_THREADS, MINB)
    wsync_copy_kernel(const wsync_cuda_op_t *__restrict__ ops, uint32_t n_ops,
                      uint64_t total_chunks, unsigned long long *__restrict__ sums)
{
    /* Contiguous, equal ranges of chunks per block: balanced bytes, one op search per block. */
    uint64_t c = total_chunks * blockIdx.x / gridDim.x;
    const uint64_t c_end = total_chunks * (blockIdx.x + 1) / gridDim.x;
    if (c >= c_end)
        return;
    uint32_t lo = wsync_k_find_op(ops, n_ops, c);
    /* The current op lives in shared memory: read field by field, it costs no registers. */
    __shared__ wsync_cuda_op_t op;
    unsigned long long acc = 0;
    for (uint32_t i = lo;; i++) {
        __syncthreads();
        if (threadIdx.x == 0)
            op = ops[i];
        __syncthreads();
        const uint64_t stop = min(c_end, op.chunk_end);
        const bool dig = VERIFY && (op.flags & WSYNC_CUDA_OP_DIGEST) != 0;
        if (op.flags & WSYNC_CUDA_OP_VEC) {
            if (dig)
                for (; c < stop; c++)
                    wsync_k_chunk_vec<true, STREAM, U, STORE>(op, c - op.chunk_begin, acc);
            else
                for (; c < stop; c++)
                    wsync_k_chunk_vec<false, STREAM, U, STORE>(op, c - op.chunk_begin, acc);
        } else {
            if (dig)
                for (; c < stop; c++)
                    wsync_k_chunk_bytes<true, STORE>(op, c - op.chunk_begin, acc);
            else
                for (; c < stop; c++)
                    wsync_k_chunk_bytes<false, STORE>(op, c - op.chunk_begin, acc);
        }
        if (dig)
            wsync_k_flush(acc, sums, i);
        if (c >= c_end || i + 1 >= n_ops)
            break;
    }
}

/* Interleaved variant: block b takes chunks b, b + G, b + 2G, ... so that at any moment the
 * whole grid works inside one window of G chunks (DRAM pages and TLB entries shared by all
 * SMs). The op lives in registers (no barrier per op change: MoE ops span few chunks). */
template <bool VERIFY, bool STREAM>
__global__ void __launch_bounds__(WSYNC_CUDA_BLOCK_THREADS, 1)
    wsync_copy_kernel_il(const wsync_cuda_op_t *__restrict__ ops, uint32_t n_ops,
                         uint64_t total_chunks, unsigned long long *__restrict__ sums)
{
    uint64_t c = blockIdx.x;
    if (c >= total_chunks)
        return;
    uint32_t lo = wsync_k_find_op(ops, n_ops, c);
    uint32_t i = lo;
    wsync_cuda_op_t op = ops[i];
    unsigned long long acc = 0;
    for (; c < total_chunks; c += gridDim.x) {
        if (c >= op.chunk_end) {
            if (VERIFY && (op.flags & WSYNC_CUDA_OP_DIGEST))
                wsync_k_flush(acc, sums, i);
            do
                op = ops[++i];
            while (c >= op.chunk_end);
        }
        const bool dig = VERIFY && (op.flags & WSYNC_CUDA_OP_DIGEST) != 0;
        if (op.flags & WSYNC_CUDA_OP_VEC) {
            if (dig)
                wsync_k_chunk_vec<true, STREAM, 8>(op, c - op.chunk_begin, acc);
            else
                wsync_k_chunk_vec<false, STREAM, 8>(op, c - op.chunk_begin, acc);
        } else {
            if (dig)
                wsync_k_chunk_bytes<true>(op, c - op.chunk_begin, acc);
            else
                wsync_k_chunk_bytes<false>(op, c - op.chunk_begin, acc);
        }
    }
    if (VERIFY && (op.flags & WSYNC_CUDA_OP_DIGEST))
        wsync_k_flush(acc, sums, i);
}

/* Lean kernel for the common case where every op is one 16-byte aligned run (flat): no row
 * math, ~60 registers, so two blocks of 512 threads fit on an SM. IL: block b takes chunks
 * b, b + G, ... (the grid sweeps one window of G chunks at a time); otherwise a contiguous,
 * equal range of chunks per block. */
template <bool STREAM, bool IL>
__global__ void __launch_bounds__(WSYNC_CUDA_BLOCK_THREADS, 2)
    wsync_copy_kernel_flat(const wsync_cuda_op_t *__restrict__ ops, uint32_t n_ops,
                           uint64_t total_chunks)
{
    uint64_t c = IL ? blockIdx.x : total_chunks * blockIdx.x / gridDim.x;
    const uint64_t c_end = IL ? total_chunks : total_chunks * (blockIdx.x + 1) / gridDim.x;
    const uint64_t step = IL ? gridDim.x : 1;
    if (c >= c_end)
        return;
    uint32_t lo = wsync_k_find_op(ops, n_ops, c);
    uint32_t i = lo;
    const unsigned char *src = ops[i].src;
    unsigned char *dst = ops[i].dst;
    uint64_t cb = ops[i].chunk_begin, ce = ops[i].chunk_end, bytes = ops[i].row_bytes;
    const uint32_t tid = threadIdx.x;
    const uint32_t nt = WSYNC_CUDA_BLOCK_THREADS;
    for (; c < c_end; c += step) {
        while (c >= ce) {
            ++i;
            src = ops[i].src;
            dst = ops[i].dst;
            cb = ops[i].chunk_begin;
            ce = ops[i].chunk_end;
            bytes = ops[i].row_bytes;
        }
        const uint64_t off = (c - cb) * WSYNC_CUDA_CHUNK_BYTES;
        const uint32_t seg = (uint32_t)min((uint64_t)WSYNC_CUDA_CHUNK_BYTES, bytes - off);
        const uint32_t nv = seg >> 4;
        const unsigned char *s = src + off;
        unsigned char *d = dst + off;
        if (nv == WSYNC_CUDA_CHUNK_BYTES / 16) {
            constexpr int U = WSYNC_CUDA_CHUNK_BYTES / 16 / WSYNC_CUDA_BLOCK_THREADS;
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                v[u] = wsync_k_load<STREAM>(s + (uint64_t)(tid + (uint32_t)u * nt) * 16u);
#pragma unroll
            for (int u = 0; u < U; u++)
                wsync_k_store<STREAM>(d + (uint64_t)(tid + (uint32_t)u * nt) * 16u, v[u]);
        } else {
            for (uint32_t idx = tid; idx < nv; idx += nt)
                wsync_k_store<STREAM>(d + (uint64_t)idx * 16u,
                                      wsync_k_load<STREAM>(s + (uint64_t)idx * 16u));
            const uint32_t tail = seg & 15u;
            if (tid < tail)
                d[(uint64_t)nv * 16u + tid] = s[(uint64_t)nv * 16u + tid];
        }
    }
}

extern "C" uint64_t wsync_cuda_plan_op(wsync_cuda_op_t *op, const void *src, void *dst,
                                       uint64_t src_pitch, uint64_t dst_pitch, uint64_t rows,
                                       uint64_t row_bytes, int digest, uint64_t chunk_begin)
{
    const uint64_t chunk = WSYNC_CUDA_CHUNK_BYTES;
    const uint64_t total = rows * row_bytes; /* validated: no overflow */
    uint64_t n;
    memset(op, 0, sizeof(*op));
    op->src = (const unsigned char *)src;
    op->dst = (unsigned char *)dst;
    op->chunk_begin = op->chunk_end = chunk_begin;
    op->flags = digest ? WSYNC_CUDA_OP_DIGEST : 0u;
    op->chunks_per_row = 1;
    op->rows_per_chunk = 1;
    if (total == 0)
        return 0;
    if (rows == 1 || (src_pitch == row_bytes && dst_pitch == row_bytes)) {
        rows = 1;
        row_bytes = total;
        src_pitch = dst_pitch = total;
    }
    op->rows = rows;
    op->row_bytes = row_bytes;
    op->src_pitch = src_pitch;
    op->dst_pitch = dst_pitch;
    const int aligned = (((uintptr_t)src | (uintptr_t)dst) & 15u) == 0 &&
                        (rows == 1 || ((row_bytes | src_pitch | dst_pitch) & 15u) == 0);
    if (!aligned) {
        op->chunks_per_row = (total + chunk - 1) / chunk;
        n = op->chunks_per_row;
    } else if (rows == 1 || row_bytes >= chunk) {
        op->flags |= WSYNC_CUDA_OP_VEC;
        op->chunks_per_row = (row_bytes + chunk - 1) / chunk;
        n = rows * op->chunks_per_row;
    } else {
        op->flags |= WSYNC_CUDA_OP_VEC;
        op->rows_per_chunk = (uint32_t)(chunk / row_bytes);
        n = (rows + op->rows_per_chunk - 1) / op->rows_per_chunk;
    }
    op->chunk_end = chunk_begin + n;
    return n;
}

extern "C" cudaError_t wsync_cuda_launch_copy(const wsync_cuda_op_t *ops, uint32_t n_ops,
                                              uint64_t total_chunks, unsigned long long *sums,
                                              int verify, int sm_count,
                                              const wsync_cuda_launch_cfg_t *cfg,
                                              cudaStream_t stream)
{
    if (n_ops == 0 || total_chunks == 0)
        return cudaSuccess;
    int variant = cfg ? cfg->variant : WSYNC_CUDA_DEFAULT_VARIANT;
    const int flat = cfg != NULL && cfg->flat && !verify;
    const int lean = variant == WSYNC_CUDA_VARIANT_LEAN_CONTIGUOUS ||
                     variant == WSYNC_CUDA_VARIANT_LEAN_INTERLEAVED;
    if (lean && !flat) /* the lean kernel handles flat ops only */
        variant = variant == WSYNC_CUDA_VARIANT_LEAN_CONTIGUOUS
                      ? WSYNC_CUDA_VARIANT_CONTIGUOUS
                      : WSYNC_CUDA_VARIANT_INTERLEAVED_STREAMING;
    int bps = (cfg && cfg->blocks_per_sm > 0) ? cfg->blocks_per_sm
              : (variant == WSYNC_CUDA_VARIANT_UNROLLED ||
                 variant == WSYNC_CUDA_VARIANT_LEAN_CONTIGUOUS ||
                 variant == WSYNC_CUDA_VARIANT_LEAN_INTERLEAVED)
                  ? 2
                  : 1;
    uint64_t grid = (uint64_t)(sm_count > 0 ? sm_count : 1) * (uint64_t)bps;
    if (grid > total_chunks)
        grid = total_chunks;
    dim3 g((unsigned)grid), b(WSYNC_CUDA_BLOCK_THREADS);
#define WSYNC_K_LAUNCH(S, U, M)                                                                    \
    (verify                                                                                        \
         ? wsync_copy_kernel<true, S, U, M><<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums)   \
         : wsync_copy_kernel<false, S, U, M><<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums))
#define WSYNC_K_LAUNCH_IL(S)                                                                       \
    (verify ? wsync_copy_kernel_il<true, S><<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums)   \
            : wsync_copy_kernel_il<false, S><<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums))
    /* The product holds the measured defaults (contiguous, interleaved streaming); the other
     * variants exist in the tunable build only (wsync_cuda_tuning.h). */
    switch (variant) {
    case WSYNC_CUDA_VARIANT_INTERLEAVED_STREAMING:
        WSYNC_K_LAUNCH_IL(true);
        break;
#ifdef WSYNC_CUDA_TUNABLE
    case WSYNC_CUDA_VARIANT_CONTIGUOUS_STREAMING:
        WSYNC_K_LAUNCH(true, 8, 1);
        break;
    case WSYNC_CUDA_VARIANT_INTERLEAVED:
        WSYNC_K_LAUNCH_IL(false);
        break;
    case WSYNC_CUDA_VARIANT_UNROLLED:
        WSYNC_K_LAUNCH(false, 4, 2);
        break;
    case WSYNC_CUDA_VARIANT_LEAN_CONTIGUOUS:
        wsync_copy_kernel_flat<false, false><<<g, b, 0, stream>>>(ops, n_ops, total_chunks);
        break;
    case WSYNC_CUDA_VARIANT_LEAN_INTERLEAVED:
        wsync_copy_kernel_flat<true, true><<<g, b, 0, stream>>>(ops, n_ops, total_chunks);
        break;
#endif
    default:
        WSYNC_K_LAUNCH(false, 8, 1);
        break;
    }
#undef WSYNC_K_LAUNCH
#undef WSYNC_K_LAUNCH_IL
    return cudaGetLastError();
}

extern "C" cudaError_t wsync_cuda_launch_digest(const wsync_cuda_op_t *ops, uint32_t n_ops,
                                                uint64_t total_chunks, unsigned long long *sums,
                                                int sm_count, int variant, cudaStream_t stream)
{
    if (n_ops == 0 || total_chunks == 0)
        return cudaSuccess;
        /* variant 0 (the plugin's): the copy kernel's shape, 8 vectors in flight, one block of 512
         * threads per SM resident (2 per SM queued); 1: 4 in flight and at most 64 registers, so
         * two blocks share an SM; 2: as 1 with 4 blocks per SM queued; 3: as 1, 3 per SM; 4: as 1
         * with streaming loads; 5: 2 vectors in flight, two blocks per SM; 6: as 0 with streaming
         * loads. docs/PERFORMANCE.md has each one's figures. Only 0 outside the tunable build. */
#ifndef WSYNC_CUDA_TUNABLE
    variant = 0;
#endif
    const int per_sm = variant == 2 ? 4 : variant == 3 ? 3 : 2;
    uint64_t grid = (uint64_t)(sm_count > 0 ? sm_count : 1) * (uint64_t)per_sm;
    if (grid > total_chunks)
        grid = total_chunks;
    const dim3 g((unsigned)grid), b(WSYNC_CUDA_BLOCK_THREADS);
#ifdef WSYNC_CUDA_TUNABLE /* the other shapes exist in the tunable build only */
    if (variant == 4)
        wsync_copy_kernel<true, true, 4, 2, false>
            <<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums);
    else if (variant == 5)
        wsync_copy_kernel<true, false, 2, 2, false>
            <<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums);
    else if (variant == 6)
        wsync_copy_kernel<true, true, 8, 1, false>
            <<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums);
    else if (variant == 3)
        wsync_copy_kernel<true, false, 4, 3, false>
            <<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums);
    else if (variant != 0)
        wsync_copy_kernel<true, false, 4, 2, false>
            <<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums);
    else
#endif
        wsync_copy_kernel<true, false, 8, 1, false>
            <<<g, b, 0, stream>>>(ops, n_ops, total_chunks, sums);
    return cudaGetLastError();
}
