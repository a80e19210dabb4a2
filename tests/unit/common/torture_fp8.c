/* FP8 e4m3fn on the host (plugin/common/wsync_fp8.h) against what PyTorch computes
 * (fp8_vectors.h, written by fp8_vectors.py with torch): every scalar conversion byte for byte,
 * and the 128 x 128 block quantizer (DeepGEMM's per_block_cast_to_fp8) on a matrix cycling
 * through all-zero, tiny, ordinary, huge and +-448 blocks: the same fp8 bytes and every scale's
 * bits; NaN and infinity refused naming the element. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars_equal_torch),
        cmocka_unit_test(test_blocks_equal_the_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
