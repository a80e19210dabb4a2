/* See wsync_convert_kernel.h. The conversions below mirror plugin/common/wsync_convert.c
 * operation for operation (frexp/ldexp/rint in double are exact), so results match bit for bit. */
#include "wsync_convert_kernel.h"
#include "wsync_kernel_search.cuh"

#include <string.h>

#define WSYNC_CONV_THREADS 256

static __device__ __forceinline__ uint32_t wsync_d_round_small(double a, int mant, int bias,
                                                               int exp_max_field)
{
    int e;
    (void)frexp(a, &e);
    int unbiased = e - 1;
    if (a == 0.0)
        return 0;
    if (unbiased < 1 - bias)
        return (uint32_t)rint(ldexp(a, bias - 1 + mant));
    double m = rint(ldexp(a, mant - unbiased));
    if (m >= ldexp(1.0, mant + 1)) {
        m = ldexp(1.0, mant);
        unbiased++;
    }
    if (unbiased + bias >= exp_max_field)
        return (uint32_t)exp_max_field << mant;
    return ((uint32_t)(unbiased + bias) << mant) | ((uint32_t)m - (1u << mant));
}

static __device__ __forceinline__ uint16_t wsync_d_half_like(double x, int mant, int bias,
                                                             int exp_max_field)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x))
        return (uint16_t)(sign | ((uint32_t)exp_max_field << mant) | (1u << (mant - 1)));
    if (isinf(x))
        return (uint16_t)(sign | ((uint32_t)exp_max_field << mant));
    return (uint16_t)(sign | wsync_d_round_small(fabs(x), mant, bias, exp_max_field));
}

static __device__ __forceinline__ uint16_t wsync_d_f32_to_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float wsync_d_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f)
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    float f = exp == 0 ? ldexpf((float)mant, -24) : ldexpf((float)(mant | 0x400u), (int)exp - 25);
    return sign ? -f : f;
}

/* n (2, 4 or 8) bytes from src to dst: one access, or byte by byte where either side is not
 * aligned (`bytewise`). */
static __device__ __forceinline__ void wsync_d_move(void *dst, const void *src, int n,
                                                    bool bytewise)
{
    unsigned char *o = (unsigned char *)dst;
    const unsigned char *p = (const unsigned char *)src;
    if (!bytewise) {
        if (n == 2)
            *(uint16_t *)o = *(const uint16_t *)p;
        else if (n == 4)
            *(uint32_t *)o = *(const uint32_t *)p;
        else
            *(uint64_t *)o = *(const uint64_t *)p;
        return;
    }
    for (int i = 0; i < n; i++)
        o[i] = p[i];
}

static __device__ __forceinline__ int wsync_d_size(int dt)
{
    return dt == WSYNC_DTYPE_F64 ? 8 : dt == WSYNC_DTYPE_F32 ? 4 : 2;
}

static __device__ void wsync_d_convert(const wsync_cuda_conv_op_t &op, const unsigned char *s,
                                       unsigned char *d)
{
    const bool su = (op.flags & WSYNC_CUDA_CONV_SRC_UNALIGNED) != 0;
    const bool du = (op.flags & WSYNC_CUDA_CONV_DST_UNALIGNED) != 0;
    const int sdt = op.src_dtype, ddt = op.dst_dtype;
    if (op.scale == 1.0 && sdt == WSYNC_DTYPE_F32 && ddt == WSYNC_DTYPE_BF16) {
        float f;
        wsync_d_move(&f, s, 4, su);
        uint16_t h = wsync_d_f32_to_bf16(f);
        wsync_d_move(d, &h, 2, du);
        return;
    }
    double v;
    uint16_t h;
    float f;
    switch (sdt) {
    case WSYNC_DTYPE_BF16:
        wsync_d_move(&h, s, 2, su);
        v = __uint_as_float((uint32_t)h << 16);
        break;
    case WSYNC_DTYPE_F16:
        wsync_d_move(&h, s, 2, su);
        v = wsync_d_f16_to_f32(h);
        break;
    case WSYNC_DTYPE_F32:
        wsync_d_move(&f, s, 4, su);
        v = f;
        break;
    default:
        wsync_d_move(&v, s, 8, su);
        break;
    }
    if (op.scale != 1.0)
        v = v * op.scale;
    switch (ddt) {
    case WSYNC_DTYPE_BF16:
        h = wsync_d_half_like(v, 7, 127, 255);
        wsync_d_move(d, &h, 2, du);
        break;
    case WSYNC_DTYPE_F16:
        h = wsync_d_half_like(v, 10, 15, 31);
        wsync_d_move(d, &h, 2, du);
        break;
    case WSYNC_DTYPE_F32:
        f = __double2float_rn(v);
        wsync_d_move(d, &f, 4, du);
        break;
    default:
        wsync_d_move(d, &v, 8, du);
        break;
    }
}

static __device__ __forceinline__ void wsync_d_unit(const wsync_cuda_conv_op_t &op, uint64_t r,
                                                    uint64_t col)
{
    unsigned char *d = op.dst + r * op.dst_pitch + col * op.unit;
    if (op.mode == WSYNC_CUDA_CONV_CONVERT) {
        wsync_d_convert(op, op.src + r * op.src_pitch + col * wsync_d_size(op.src_dtype), d);
        return;
    }
    const unsigned char *s = op.src + r * op.src_pitch + col * op.unit;
    const bool zero = op.mode == WSYNC_CUDA_CONV_ZERO;
    switch (op.unit) {
    case 16:
        *(uint4 *)d = zero ? make_uint4(0, 0, 0, 0) : *(const uint4 *)s;
        break;
    case 8:
        *(uint2 *)d = zero ? make_uint2(0, 0) : *(const uint2 *)s;
        break;
    case 4:
        *(uint32_t *)d = zero ? 0u : *(const uint32_t *)s;
        break;
    case 2:
        *(uint16_t *)d = zero ? (uint16_t)0 : *(const uint16_t *)s;
        break;
    default:
        *d = zero ? (unsigned char)0 : *s;
        break;
    }
}

__global__ void __launch_bounds__(WSYNC_CONV_THREADS)
    wsync_convert_kernel(const wsync_cuda_conv_op_t *__restrict__ ops, uint32_t n_ops,
                         uint64_t total_tiles)
{
    __shared__ wsync_cuda_conv_op_t op;
    __shared__ uint32_t cur;
    if (threadIdx.x == 0)
        cur = 0xffffffffu;
    for (uint64_t t = blockIdx.x; t < total_tiles; t += gridDim.x) {
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t lo =
                wsync_k_last_begin<wsync_cuda_conv_op_t, &wsync_cuda_conv_op_t::tile_begin>(
                    ops, n_ops, t);
            while (lo + 1 < n_ops && ops[lo].tile_end <= t) /* skip empty ops */
                lo++;
            if (lo != cur) {
                op = ops[lo];
                cur = lo;
            }
        }
        __syncthreads();
        const uint64_t total = op.rows * op.units_per_row;
        const uint64_t u0 = (t - op.tile_begin) * WSYNC_CUDA_CONV_TILE;
        const uint64_t u1 = min(total, u0 + WSYNC_CUDA_CONV_TILE);
        if (total <= 0xffffffffull) {
            const uint32_t upr = (uint32_t)op.units_per_row;
            for (uint32_t u = (uint32_t)u0 + threadIdx.x; u < (uint32_t)u1;
                 u += WSYNC_CONV_THREADS) {
                const uint32_t r = u / upr;
                wsync_d_unit(op, r, u - r * upr);
            }
        } else {
            for (uint64_t u = u0 + threadIdx.x; u < u1; u += WSYNC_CONV_THREADS) {
                const uint64_t r = u / op.units_per_row;
                wsync_d_unit(op, r, u - r * op.units_per_row);
            }
        }
    }
}

static uint32_t wsync_widest_unit(uint64_t bits)
{
    uint32_t u = 16;
    while (u > 1 && (bits & (u - 1)) != 0)
        u >>= 1;
    return u;
}

static size_t wsync_cpu_dtype_size(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F64 ? 8 : dt == WSYNC_DTYPE_F32 ? 4 : 2;
}

static uint64_t wsync_tiles(wsync_cuda_conv_op_t *op, uint64_t tile_begin)
{
    const uint64_t units = op->rows * op->units_per_row;
    const uint64_t n = (units + WSYNC_CUDA_CONV_TILE - 1) / WSYNC_CUDA_CONV_TILE;
    op->tile_begin = tile_begin;
    op->tile_end = tile_begin + n;
    return n;
}

/* A 2-D byte region as zero/copy units: rows merged when contiguous, widest aligned unit. */
static uint64_t wsync_plan_bytes(wsync_cuda_conv_op_t *op, uint64_t rows, uint64_t row_bytes,
                                 uint64_t tile_begin)
{
    if (rows > 1 && op->dst_pitch == row_bytes &&
        (op->mode == WSYNC_CUDA_CONV_ZERO || op->src_pitch == row_bytes)) {
        row_bytes *= rows;
        rows = 1;
        op->src_pitch = op->dst_pitch = row_bytes;
    }
    uint64_t bits = (uint64_t)(uintptr_t)op->dst | row_bytes;
    if (op->mode == WSYNC_CUDA_CONV_COPY)
        bits |= (uint64_t)(uintptr_t)op->src;
    if (rows > 1)
        bits |= op->dst_pitch | (op->mode == WSYNC_CUDA_CONV_COPY ? op->src_pitch : 0);
    op->unit = wsync_widest_unit(bits);
    op->rows = rows;
    op->units_per_row = row_bytes / op->unit;
    return wsync_tiles(op, tile_begin);
}

extern "C" uint64_t wsync_cuda_conv_plan_copy(wsync_cuda_conv_op_t *op, const void *src,
                                              wsync_dtype_t src_dt, uint64_t src_pitch, void *dst,
                                              wsync_dtype_t dst_dt, uint64_t dst_pitch,
                                              uint64_t rows, uint64_t cols, double scale,
                                              uint64_t tile_begin)
{
    memset(op, 0, sizeof(*op));
    op->src = (const unsigned char *)src;
    op->dst = (unsigned char *)dst;
    op->src_pitch = src_pitch;
    op->dst_pitch = dst_pitch;
    op->scale = scale;
    op->src_dtype = (uint8_t)src_dt;
    op->dst_dtype = (uint8_t)dst_dt;
    if (rows == 0 || cols == 0) {
        op->mode = WSYNC_CUDA_CONV_ZERO;
        op->unit = 1;
        return wsync_tiles(op, tile_begin);
    }
    const size_t ss = wsync_cpu_dtype_size(src_dt), ds = wsync_cpu_dtype_size(dst_dt);
    if (src_dt == dst_dt && scale == 1.0) {
        op->mode = WSYNC_CUDA_CONV_COPY;
        return wsync_plan_bytes(op, rows, cols * ss, tile_begin);
    }
    op->mode = WSYNC_CUDA_CONV_CONVERT;
    op->unit = (uint32_t)ds;
    op->rows = rows;
    op->units_per_row = cols;
    if ((((uintptr_t)src) | (rows > 1 ? src_pitch : 0)) % ss != 0)
        op->flags |= WSYNC_CUDA_CONV_SRC_UNALIGNED;
    if ((((uintptr_t)dst) | (rows > 1 ? dst_pitch : 0)) % ds != 0)
        op->flags |= WSYNC_CUDA_CONV_DST_UNALIGNED;
    return wsync_tiles(op, tile_begin);
}

extern "C" uint64_t wsync_cuda_conv_plan_zero(wsync_cuda_conv_op_t *op, void *dst,
                                              uint64_t dst_pitch, uint64_t rows, uint64_t row_bytes,
                                              uint64_t tile_begin)
{
    memset(op, 0, sizeof(*op));
    op->dst = (unsigned char *)dst;
    op->dst_pitch = dst_pitch;
    op->mode = WSYNC_CUDA_CONV_ZERO;
    op->scale = 1.0;
    if (rows == 0 || row_bytes == 0) {
        op->unit = 1;
        return wsync_tiles(op, tile_begin);
    }
    return wsync_plan_bytes(op, rows, row_bytes, tile_begin);
}

extern "C" cudaError_t wsync_cuda_launch_convert(const wsync_cuda_conv_op_t *ops, uint32_t n_ops,
                                                 uint64_t total_tiles, int sm_count,
                                                 cudaStream_t stream)
{
    if (n_ops == 0 || total_tiles == 0)
        return cudaSuccess;
    uint64_t grid = (uint64_t)(sm_count > 0 ? sm_count : 1) * 8u;
    if (grid > total_tiles)
        grid = total_tiles;
    wsync_convert_kernel<<<(unsigned)grid, WSYNC_CONV_THREADS, 0, stream>>>(ops, n_ops,
                                                                            total_tiles);
    return cudaGetLastError();
}
