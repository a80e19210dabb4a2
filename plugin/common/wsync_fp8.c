/* FP8 e4m3fn quantization on the host. Contract in wsync_fp8.h. */
#include "wsync_fp8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint8_t wsync_fp8_e4m3fn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) /* NaN */
        return (uint8_t)(sign | 0x7fu);
    if (u >= 0x43e00000u) /* 448 and above, infinity included: saturate */
        return (uint8_t)(sign | 0x7eu);
    if (u < 0x3c800000u) { /* below 2^-6: a subnormal m x 2^-9 (m = 8 is the smallest normal) */
        float a;
        memcpy(&a, &u, sizeof(a));
        return (uint8_t)(sign | (uint8_t)nearbyintf(a * 512.0f)); /* exact scaling; RNE */
    }
    const int e = (int)(u >> 23) - 127; /* -6 .. 8 */
    uint32_t keep = (u & 0x7fffffu) >> 20, rest = u & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u)))
        keep++; /* a carry runs into the exponent */
    uint32_t v = ((uint32_t)(e + 7) << 3) + keep;
    return (uint8_t)(sign | (v > 0x7eu ? 0x7eu : v));
}

static float wsync_fp8_load(const void *src, wsync_dtype_t dtype, int64_t i)
{
    if (dtype == WSYNC_DTYPE_F32) {
        float f;
        memcpy(&f, (const unsigned char *)src + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const unsigned char *)src + 2 * i, 2);
    if (dtype == WSYNC_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    /* f16, exactly */
    const uint32_t s = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (ex == 0)
        return (s ? -1.0f : 1.0f) * ldexpf((float)m, -24);
    uint32_t u = s | (ex == 31 ? (0xffu << 23) | (m << 13) : ((ex + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static size_t wsync_fp8_esize(wsync_dtype_t dtype)
{
    return dtype == WSYNC_DTYPE_F32 ? 4u : 2u;
}

int wsync_fp8_find_bad(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                       int64_t cols, int64_t *bad_row, int64_t *bad_col)
{
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)src + (uint64_t)r * src_pitch;
        for (int64_t c = 0; c < cols; c++)
            if (!isfinite(wsync_fp8_load(row, dtype, c))) {
                *bad_row = r;
                *bad_col = c;
                return -1;
            }
    }
    return 0;
}

int wsync_fp8_quantize_2d(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                          int64_t cols, int64_t block, uint8_t *dst, uint64_t dst_pitch,
                          unsigned char *scales, uint64_t scale_pitch, int64_t *bad_row,
                          int64_t *bad_col)
{
    const int64_t brows = (rows + block - 1) / block, bcols = (cols + block - 1) / block;
    const unsigned char *s0 = src;
    int found = 0;
    for (int64_t br = 0; br < brows; br++)
        for (int64_t bc = 0; bc < bcols; bc++) {
            const int64_t r1 = br * block + block < rows ? br * block + block : rows;
            const int64_t c1 = bc * block + block < cols ? bc * block + block : cols;
            float amax = 0.0f;
            int bad = 0;
            for (int64_t r = br * block; r < r1; r++)
                for (int64_t c = bc * block; c < c1; c++) {
                    const float x = wsync_fp8_load(s0 + (uint64_t)r * src_pitch, dtype, c);
                    if (!isfinite(x) && !bad) {
                        bad = 1; /* the block's first, row-major; the least over blocks kept */
                        if (!found || r < *bad_row || (r == *bad_row && c < *bad_col))
                            *bad_row = r, *bad_col = c;
                        found = 1;
                    }
                    amax = fabsf(x) > amax ? fabsf(x) : amax;
                }
            if (bad)
                continue; /* left as it was */
            if (amax < 1e-4f)
                amax = 1e-4f;
            /* torch computes 448.0 / amax as amax.reciprocal() * 448 (Tensor.__rtruediv__) */
            const float inv = (1.0f / amax) * WSYNC_FP8_E4M3_MAX;
            for (int64_t r = br * block; r < r1; r++)
                for (int64_t c = bc * block; c < c1; c++)
                    dst[(uint64_t)r * dst_pitch + (uint64_t)c] = wsync_fp8_e4m3fn(
                        wsync_fp8_load(s0 + (uint64_t)r * src_pitch, dtype, c) * inv);
            /* torch on CUDA divides by a scalar as a multiplication by its reciprocal */
            const float scale = amax * WSYNC_FP8_E4M3_INV_MAX;
            memcpy(scales + (uint64_t)br * scale_pitch + 4u * (uint64_t)bc, &scale, 4);
        }
    return found ? -1 : 0;
}

int wsync_fp8_quantize_blocks(const void *src, wsync_dtype_t dtype, int64_t rows, int64_t cols,
                              int64_t block, uint8_t *dst, float *scales, int64_t *bad)
{
    int64_t br, bc;
    const uint64_t pitch = (uint64_t)cols * wsync_fp8_esize(dtype);
    if (wsync_fp8_find_bad(src, pitch, dtype, rows, cols, &br, &bc) != 0) {
        *bad = br * cols + bc;
        return -1;
    }
    const int64_t bcols = (cols + block - 1) / block;
    return wsync_fp8_quantize_2d(src, pitch, dtype, rows, cols, block, dst, (uint64_t)cols,
                                 (unsigned char *)scales, 4u * (uint64_t)bcols, &br, &bc);
}

/* vLLM's clamp before the cast: fmaxf(-448, fminf(y, 448)); a NaN y (0 x inf) becomes 448 */
static float wsync_fp8_clamp(float y)
{
    return fmaxf(-WSYNC_FP8_E4M3_MAX, fminf(y, WSYNC_FP8_E4M3_MAX));
}

int wsync_fp8_quantize_rows(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                            int64_t cols, uint8_t *dst, uint64_t dst_pitch, unsigned char *scales,
                            uint64_t scale_pitch, int64_t *bad_row, int64_t *bad_col)
{
    int found = 0;
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)src + (uint64_t)r * src_pitch;
        float amax = 0.0f;
        int64_t bad = -1;
        for (int64_t c = 0; c < cols && bad < 0; c++) {
            const float x = wsync_fp8_load(row, dtype, c);
            if (!isfinite(x))
                bad = c;
            amax = fabsf(x) > amax ? fabsf(x) : amax;
        }
        if (bad >= 0) {
            if (!found)
                *bad_row = r, *bad_col = bad, found = 1; /* rows in order: the first is least */
            continue;                                    /* left as it was */
        }
        const float scale = fmaxf(amax / WSYNC_FP8_E4M3_MAX, WSYNC_FP8_CHANNEL_MIN_SCALE);
        for (int64_t c = 0; c < cols; c++)
            dst[(uint64_t)r * dst_pitch + (uint64_t)c] =
                wsync_fp8_e4m3fn(wsync_fp8_clamp(wsync_fp8_load(row, dtype, c) / scale));
        memcpy(scales + (uint64_t)r * scale_pitch, &scale, 4);
    }
    return found ? -1 : 0;
}

int wsync_fp8_amax(const void *src, uint64_t src_pitch, wsync_dtype_t dtype, int64_t rows,
                   int64_t cols, float *amax, int64_t *bad_row, int64_t *bad_col)
{
    float m = *amax;
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)src + (uint64_t)r * src_pitch;
        for (int64_t c = 0; c < cols; c++) {
            const float x = wsync_fp8_load(row, dtype, c);
            if (!isfinite(x)) {
                *bad_row = r, *bad_col = c;
                return -1;
            }
            m = fabsf(x) > m ? fabsf(x) : m;
        }
    }
    *amax = m;
    return 0;
}

float wsync_fp8_tensor_scale(float amax)
{
    return amax / WSYNC_FP8_E4M3_MAX;
}

void wsync_fp8_quantize_tensor(const void *src, uint64_t src_pitch, wsync_dtype_t dtype,
                               int64_t rows, int64_t cols, float scale, uint8_t *dst,
                               uint64_t dst_pitch)
{
    const float inv = 1.0f / scale; /* inf for scale 0: every value then clamps to 448 */
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)src + (uint64_t)r * src_pitch;
        for (int64_t c = 0; c < cols; c++)
            dst[(uint64_t)r * dst_pitch + (uint64_t)c] =
                wsync_fp8_e4m3fn(wsync_fp8_clamp(wsync_fp8_load(row, dtype, c) * inv));
    }
}

const char *wsync_fp8_unit(uint32_t kind)
{
    return kind == WSYNC_QUANT_FP8_CHANNEL  ? "the row"
           : kind == WSYNC_QUANT_FP8_TENSOR ? "the tensor (every op sharing its scale)"
                                            : "the 128 x 128 block";
}

/* Op i's source geometry as the quantizers take it. */
static uint64_t wsync_fp8_src_pitch(const wsync_copy_op_t *o)
{
    return o->rows > 1 ? o->src_pitch : o->row_bytes;
}

static uint64_t wsync_fp8_dst_pitch(const wsync_copy_op_t *o, const wsync_quant_t *q)
{
    return o->rows > 1 ? o->dst_pitch : q->cols;
}

/* The TENSOR ops of g[0 .. m) (one scale): one amax over all of them, then each quantized with
 * its scale; a non-finite value leaves them all as they were (-1, *bad set). */
static int wsync_fp8_tensor_group(const uint8_t *src_base, const wsync_copy_op_t *ops,
                                  const wsync_quant_t *quant, const wsync_fp8_ref_t *g, size_t m,
                                  size_t *bad_op, int64_t *bad_row, int64_t *bad_col)
{
    float amax = 0.0f;
    for (size_t k = 0; k < m; k++) {
        const size_t j = g[k].op;
        if (wsync_fp8_amax(src_base + ops[j].src_offset, wsync_fp8_src_pitch(&ops[j]),
                           quant[j].src_dtype, (int64_t)ops[j].rows, (int64_t)quant[j].cols, &amax,
                           bad_row, bad_col) != 0) {
            *bad_op = j;
            return -1;
        }
    }
    const float scale = wsync_fp8_tensor_scale(amax);
    for (size_t k = 0; k < m; k++) {
        const size_t j = g[k].op;
        wsync_fp8_quantize_tensor(src_base + ops[j].src_offset, wsync_fp8_src_pitch(&ops[j]),
                                  quant[j].src_dtype, (int64_t)ops[j].rows, (int64_t)quant[j].cols,
                                  scale, ops[j].dst, wsync_fp8_dst_pitch(&ops[j], &quant[j]));
    }
    memcpy(quant[g[0].op].scale_dst, &scale, 4);
    return 0;
}

int wsync_fp8_ref_cmp(const void *a, const void *b)
{
    const wsync_fp8_ref_t *x = a, *y = b;
    return x->scale != y->scale ? (x->scale > y->scale) - (x->scale < y->scale)
                                : (x->op > y->op) - (x->op < y->op);
}

static void wsync_fp8_keep(int *found, size_t *bo, int64_t *br, int64_t *bc, size_t op, int64_t r,
                           int64_t c)
{
    if (!*found || op < *bo)
        *bo = op, *br = r, *bc = c;
    *found = 1;
}

int wsync_fp8_quantize_ops(const uint8_t *src_base, const wsync_copy_op_t *ops,
                           const wsync_quant_t *quant, size_t n, wsync_fp8_ref_t *scratch,
                           size_t *bad_op, int64_t *bad_row, int64_t *bad_col)
{
    int found = 0;
    size_t bo = 0, m = 0;
    int64_t br = 0, bc = 0;
    for (size_t i = 0; i < n; i++) {
        const wsync_copy_op_t *o = &ops[i];
        const wsync_quant_t *q = &quant[i];
        int64_t r = 0, c = 0;
        if (q->kind == WSYNC_QUANT_NONE || o->rows == 0)
            continue;
        if (q->kind == WSYNC_QUANT_FP8_TENSOR) {
            scratch[m++] = (wsync_fp8_ref_t){(uintptr_t)q->scale_dst, i}; /* below, by scale */
            continue;
        }
        const int rc =
            q->kind == WSYNC_QUANT_FP8_CHANNEL
                ? wsync_fp8_quantize_rows(src_base + o->src_offset, wsync_fp8_src_pitch(o),
                                          q->src_dtype, (int64_t)o->rows, (int64_t)q->cols, o->dst,
                                          wsync_fp8_dst_pitch(o, q), q->scale_dst, q->scale_pitch,
                                          &r, &c)
                : wsync_fp8_quantize_2d(src_base + o->src_offset, wsync_fp8_src_pitch(o),
                                        q->src_dtype, (int64_t)o->rows, (int64_t)q->cols,
                                        WSYNC_FP8_BLOCK, o->dst, wsync_fp8_dst_pitch(o, q),
                                        q->scale_dst, q->scale_pitch, &r, &c);
        if (rc != 0)
            wsync_fp8_keep(&found, &bo, &br, &bc, i, r, c);
    }
    /* the TENSOR ops, each scale's together (a call's copy tasks run one at a time) */
    qsort(scratch, m, sizeof(*scratch), wsync_fp8_ref_cmp);
    for (size_t k = 0; k < m;) {
        size_t e = k + 1, op = 0;
        int64_t r = 0, c = 0;
        while (e < m && scratch[e].scale == scratch[k].scale)
            e++;
        if (wsync_fp8_tensor_group(src_base, ops, quant, scratch + k, e - k, &op, &r, &c) != 0)
            wsync_fp8_keep(&found, &bo, &br, &bc, op, r, c);
        k = e;
    }
    if (found)
        *bad_op = bo, *bad_row = br, *bad_col = bc;
    return found ? -1 : 0;
}
