/* FP8 e4m3fn on the host (plugin/common/wsync_fp8.h) against what PyTorch computes
 * (fp8_vectors.h, written by fp8_vectors.py with torch): every scalar conversion byte for byte,
 * and the 128 x 128 block quantizer (DeepGEMM's per_block_cast_to_fp8) on a matrix cycling
 * through all-zero, tiny, ordinary, huge and +-448 blocks: the same fp8 bytes and every scale's
 * bits; vLLM's per-channel and per-tensor quantizers on the same matrix (fp8_vectors.py writes them
 * in torch), a per-tensor scale over several ops; NaN and infinity refused naming the element. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fp8_vectors.h"
#include "wsync_fp8.h"

static void test_scalars_equal_torch(void **state)
{
    (void)state;
    size_t bad = 0;
    for (size_t i = 0; i < WSYNC_FP8_SCALARS; i++) {
        float f;
        memcpy(&f, &wsync_fp8_in[i], 4);
        uint8_t got = wsync_fp8_e4m3fn(f);
        if (got != wsync_fp8_out[i] && bad++ < 5)
            print_error("0x%08x (%g): got 0x%02x, torch 0x%02x\n", wsync_fp8_in[i], (double)f, got,
                        wsync_fp8_out[i]);
    }
    assert_int_equal(bad, 0);
}

static uint64_t lcg(uint64_t x)
{
    return x * 6364136223846793005ull + 1442695040888963407ull;
}

/* fp8_vectors.py's block_matrix, bit for bit */
static void block_matrix(uint16_t *v, int64_t rows, int64_t cols, int64_t block)
{
    const int64_t bcols = (cols + block - 1) / block;
    uint64_t x = 987654321ull;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            x = lcg(x);
            const int64_t cls = ((r / block) * bcols + c / block) % 5;
            const uint16_t sign = (uint16_t)((x >> 63) << 15), mant = (uint16_t)((x >> 20) & 0x7f);
            uint16_t b;
            if (cls == 0)
                b = sign;
            else if (cls == 1)
                b = (uint16_t)(sign | ((127 - 30 + (x >> 40) % 10) << 7) | mant);
            else if (cls == 2)
                b = (uint16_t)(sign | ((127 - 8 + (x >> 40) % 11) << 7) | mant);
            else if (cls == 3)
                b = (uint16_t)(sign | ((127 + 20 + (x >> 40) % 10) << 7) | mant);
            else
                b = (x >> 40) % 7 == 0 ? (uint16_t)(sign | 0x43e0)
                                       : (uint16_t)(sign | ((127 - 3 + (x >> 40) % 8) << 7) | mant);
            v[r * cols + c] = b;
        }
}

static void test_blocks_equal_the_reference(void **state)
{
    (void)state;
    const int64_t R = WSYNC_FP8_ROWS, Cn = WSYNC_FP8_COLS, B = WSYNC_FP8_BLOCK;
    uint16_t *src = malloc((size_t)(R * Cn) * 2);
    uint8_t *dst = malloc((size_t)(R * Cn));
    const size_t ns = sizeof(wsync_fp8_scales) / sizeof(wsync_fp8_scales[0]);
    float scales[16];
    assert_true(ns == (size_t)(((R + B - 1) / B) * ((Cn + B - 1) / B)) && ns <= 16);
    block_matrix(src, R, Cn, B);
    int64_t bad = -1;
    assert_int_equal(wsync_fp8_quantize_blocks(src, WSYNC_DTYPE_BF16, R, Cn, B, dst, scales, &bad),
                     0);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < R * Cn; i++)
        h = (h ^ dst[i]) * 0x100000001b3ull;
    assert_int_equal(h, WSYNC_FP8_BLOCKS_FNV);
    for (size_t k = 0; k < ns; k++) {
        uint32_t u;
        memcpy(&u, &scales[k], 4);
        assert_int_equal(u, wsync_fp8_scales[k]);
    }
    /* NaN and infinity are refused, naming the element */
    src[7 * Cn + 11] = 0x7fc0;
    assert_int_equal(wsync_fp8_quantize_blocks(src, WSYNC_DTYPE_BF16, R, Cn, B, dst, scales, &bad),
                     -1);
    assert_int_equal(bad, 7 * Cn + 11);
    src[7 * Cn + 11] = 0xff80; /* -inf */
    assert_int_equal(wsync_fp8_quantize_blocks(src, WSYNC_DTYPE_BF16, R, Cn, B, dst, scales, &bad),
                     -1);
    free(src);
    free(dst);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* vLLM's per-channel quantizer: one scale per row of the cycling matrix, bytes and scales */
static void test_rows_equal_the_reference(void **state)
{
    (void)state;
    const int64_t R = WSYNC_FP8_ROWS, Cn = WSYNC_FP8_COLS;
    uint16_t *src = malloc((size_t)(R * Cn) * 2);
    uint8_t *dst = malloc((size_t)(R * Cn));
    float *scales = malloc((size_t)R * 4);
    int64_t br = -1, bc = -1;
    block_matrix(src, R, Cn, WSYNC_FP8_BLOCK);
    assert_int_equal(wsync_fp8_quantize_rows(src, 2u * (uint64_t)Cn, WSYNC_DTYPE_BF16, R, Cn, dst,
                                             (uint64_t)Cn, (unsigned char *)scales, 4, &br, &bc),
                     0);
    assert_int_equal(fnv(0xcbf29ce484222325ull, dst, (size_t)(R * Cn)), WSYNC_FP8_CHANNEL_FNV);
    assert_int_equal(fnv(0xcbf29ce484222325ull, scales, (size_t)R * 4),
                     WSYNC_FP8_CHANNEL_SCALES_FNV);
    /* a NaN leaves its row as it was, names it, and every other row is written */
    uint8_t *want = malloc((size_t)(R * Cn));
    memcpy(want, dst, (size_t)(R * Cn));
    memset(dst, 0xaa, (size_t)(R * Cn));
    src[9 * Cn + 4] = 0x7fc0;
    assert_int_equal(wsync_fp8_quantize_rows(src, 2u * (uint64_t)Cn, WSYNC_DTYPE_BF16, R, Cn, dst,
                                             (uint64_t)Cn, (unsigned char *)scales, 4, &br, &bc),
                     -1);
    assert_true(br == 9 && bc == 4);
    for (int64_t c = 0; c < Cn; c++)
        assert_int_equal(dst[9 * Cn + c], 0xaa);
    assert_memory_equal(dst, want, (size_t)(9 * Cn));
    assert_memory_equal(dst + 10 * Cn, want + 10 * Cn, (size_t)((R - 10) * Cn));
    free(want);
    free(src);
    free(dst);
    free(scales);
}

/* vLLM's per-tensor quantizer on each 128 x 128 tile as a tensor and on the whole matrix, and
 * wsync_fp8_quantize_ops: one scale for every TENSOR op naming it, a NaN in any of them leaving
 * all of them as they were */
static void test_tensors_equal_the_reference(void **state)
{
    (void)state;
    const int64_t R = WSYNC_FP8_ROWS, Cn = WSYNC_FP8_COLS, B = WSYNC_FP8_BLOCK;
    uint16_t *src = malloc((size_t)(R * Cn) * 2);
    uint8_t *dst = malloc((size_t)(R * Cn));
    block_matrix(src, R, Cn, B);
    uint64_t h = 0xcbf29ce484222325ull, hs = 0xcbf29ce484222325ull;
    for (int64_t t = 0; t <= ((R + B - 1) / B) * ((Cn + B - 1) / B); t++) {
        const int64_t bcols = (Cn + B - 1) / B, whole = t == ((R + B - 1) / B) * bcols;
        const int64_t r0 = whole ? 0 : t / bcols * B, c0 = whole ? 0 : t % bcols * B;
        const int64_t r1 = whole || r0 + B > R ? R : r0 + B,
                      c1 = whole || c0 + B > Cn ? Cn : c0 + B;
        const uint16_t *s0 = src + r0 * Cn + c0;
        float amax = 0.0f;
        int64_t br, bc;
        assert_int_equal(wsync_fp8_amax(s0, 2u * (uint64_t)Cn, WSYNC_DTYPE_BF16, r1 - r0, c1 - c0,
                                        &amax, &br, &bc),
                         0);
        const float scale = wsync_fp8_tensor_scale(amax);
        wsync_fp8_quantize_tensor(s0, 2u * (uint64_t)Cn, WSYNC_DTYPE_BF16, r1 - r0, c1 - c0, scale,
                                  dst, (uint64_t)(c1 - c0));
        h = fnv(h, dst, (size_t)((r1 - r0) * (c1 - c0)));
        hs = fnv(hs, &scale, 4);
    }
    assert_int_equal(h, WSYNC_FP8_TENSOR_FNV);
    assert_int_equal(hs, WSYNC_FP8_TENSOR_SCALES_FNV);

    /* the matrix as three ops of one tensor (rows 0-99, 100-199, 200-299) beside a plain op: the
     * same bytes and scale as the whole matrix quantized at once */
    uint8_t *one = malloc((size_t)(R * Cn)), *parts = malloc((size_t)(R * Cn));
    float s_one = 0.0f, s_parts = -1.0f, amax = 0.0f;
    int64_t br, bc;
    assert_int_equal(
        wsync_fp8_amax(src, 2u * (uint64_t)Cn, WSYNC_DTYPE_BF16, R, Cn, &amax, &br, &bc), 0);
    s_one = wsync_fp8_tensor_scale(amax);
    wsync_fp8_quantize_tensor(src, 2u * (uint64_t)Cn, WSYNC_DTYPE_BF16, R, Cn, s_one, one,
                              (uint64_t)Cn);
    wsync_copy_op_t ops[4];
    wsync_quant_t q[4];
    memset(ops, 0, sizeof(ops));
    memset(q, 0, sizeof(q));
    for (int k = 0; k < 3; k++) {
        ops[k] = (wsync_copy_op_t){.src_offset = (uint64_t)(k * 100 * Cn) * 2,
                                   .src_pitch = 2u * (uint64_t)Cn,
                                   .dst = parts + k * 100 * Cn,
                                   .dst_pitch = (uint64_t)Cn,
                                   .rows = 100,
                                   .row_bytes = 2u * (uint64_t)Cn};
        q[k] = (wsync_quant_t){.kind = WSYNC_QUANT_FP8_TENSOR,
                               .src_dtype = WSYNC_DTYPE_BF16,
                               .cols = (uint64_t)Cn,
                               .scale_dst = &s_parts,
                               .scale_extent = 4};
    }
    ops[3] = (wsync_copy_op_t){.rows = 0}; /* a plain op, skipped */
    wsync_fp8_ref_t done[4];
    size_t bad_op = 99;
    assert_int_equal(
        wsync_fp8_quantize_ops((const uint8_t *)src, ops, q, 4, done, &bad_op, &br, &bc), 0);
    assert_memory_equal(one, parts, (size_t)(R * Cn));
    assert_memory_equal(&s_one, &s_parts, 4);
    /* a NaN in the last part: no part written, the scale kept, the op and element named */
    memset(parts, 0xaa, (size_t)(R * Cn));
    s_parts = -1.0f;
    src[(200 + 5) * Cn + 6] = 0xffc0;
    assert_int_equal(
        wsync_fp8_quantize_ops((const uint8_t *)src, ops, q, 4, done, &bad_op, &br, &bc), -1);
    assert_true(bad_op == 2 && br == 5 && bc == 6);
    for (int64_t i = 0; i < R * Cn; i++)
        assert_int_equal(parts[i], 0xaa);
    assert_true(s_parts == -1.0f);
    free(src);
    free(dst);
    free(one);
    free(parts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars_equal_torch),
        cmocka_unit_test(test_blocks_equal_the_reference),
        cmocka_unit_test(test_rows_equal_the_reference),
        cmocka_unit_test(test_tensors_equal_the_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
