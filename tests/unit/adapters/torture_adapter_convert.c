/* Float conversions against independent references: nearest representable value found by
 * comparing neighbours in double, ties to the even encoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_convert.h"

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Value of a bf16 encoding, computed without the library. */
static double ref_bf16_value(uint16_t h)
{
    return (double)bits_f32((uint32_t)h << 16);
}

/* Value of an f16 encoding from its definition. */
static double ref_f16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -24);
    else
        v = ldexp((double)(m + 1024), e - 25);
    return s ? -v : v;
}

/* Reference rounding of finite x to a 16-bit format by a search over encodings: the two
 * neighbours of x among the finite values, the nearest one, ties to even mantissa; beyond the
 * largest finite value by half an ulp → inf. */
static uint16_t ref_round(double x, double (*value)(uint16_t), uint16_t max_finite,
                          uint16_t inf_bits)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    /* binary search the largest encoding with value <= a (positive encodings are monotonic) */
    uint32_t lo = 0, hi = max_finite;
    if (a >= value(max_finite)) {
        double ulp = value(max_finite) - value((uint16_t)(max_finite - 1));
        if (a >= value(max_finite) + ulp / 2)
            return sign | inf_bits;
        return sign | max_finite;
    }
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double dl = a - value((uint16_t)lo), du = value((uint16_t)(lo + 1)) - a;
    uint16_t pick = (dl < du || (dl == du && (lo & 1) == 0)) ? (uint16_t)lo : (uint16_t)(lo + 1);
    return sign | pick;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static void check_f32_to_bf16(uint32_t u)
{
    float f = bits_f32(u);
    uint16_t got = wsync_f32_to_bf16(f);
    if (isnan(f)) {
        assert_true((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0);
        assert_int_equal(got >> 15, u >> 31);
        return;
    }
    uint16_t want = isinf(f) ? (uint16_t)((u >> 16)) : ref_round(f, ref_bf16_value, 0x7f7f, 0x7f80);
    if (got != want)
        fail_msg("f32 %a (0x%08x) -> bf16 0x%04x, want 0x%04x", (double)f, u, got, want);
    /* the f64 path must agree (one rounding, no double rounding) */
    assert_int_equal(wsync_f64_to_bf16((double)f), want);
}

static void test_f32_to_bf16(void **state)
{
    (void)state;
    /* ties, both parities, around every exponent, subnormals, inf boundary, NaN */
    uint32_t special[] = {0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0x00008000,
                          0x00018000, 0x00000001, 0x807fffff, 0x7f7fffff, 0x7f7f8000,
                          0x7f7f7fff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000,
                          0x7f800001, 0xffc00001, 0,          0x80000000, 0x3f800000};
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
        check_f32_to_bf16(special[i]);
    for (int i = 0; i < 200000; i++)
        check_f32_to_bf16(rnd32());
    for (uint32_t e = 0; e < 256; e++) /* exact ties at every exponent */
        check_f32_to_bf16((e << 23) | 0x8000u | ((e & 1) << 16));
}

static void test_f16(void **state)
{
    (void)state;
    /* f16 → f32 exhaustively against the definition; f32 → f16 gives the encoding back */
    for (uint32_t h = 0; h < 65536; h++) {
        double want = ref_f16_value((uint16_t)h);
        float got = wsync_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(got));
            assert_true((wsync_f32_to_f16(got) & 0x7fff) > 0x7c00);
            continue;
        }
        if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("f16 0x%04x -> %a, want %a", h, (double)got, want);
        assert_int_equal(wsync_f32_to_f16(got), h);
    }
    /* f32 → f16 rounding, including subnormal results and overflow, against the search */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rnd32();
        /* concentrate on the f16 range: exponents 2^-26 .. 2^17 */
        u = (u & 0x807fffffu) | ((uint32_t)(101 + (u % 44)) << 23);
        float f = bits_f32(u);
        uint16_t want = ref_round(f, ref_f16_value, 0x7bff, 0x7c00);
        uint16_t got = wsync_f32_to_f16(f);
        if (got != want)
            fail_msg("f32 %a -> f16 0x%04x, want 0x%04x", (double)f, got, want);
    }
    assert_int_equal(wsync_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(wsync_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(wsync_f32_to_f16(65520.0f), 0x7c00); /* halfway to 2^16 rounds to inf */
    assert_int_equal(wsync_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(wsync_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie to even: 0 */
    assert_int_equal(wsync_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(wsync_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 ulp: tie → even 2 */
    assert_int_equal(wsync_f32_to_f16(-0.0f), 0x8000);
}

/* f64 → bf16 must round once: a value just above a bf16 tie that f32 would round onto the tie. */
static void test_f64_single_rounding(void **state)
{
    (void)state;
    double tie = 1.0 + ldexp(1.0, -8);    /* halfway between bf16 1.0 and 1.0078125 */
    double above = tie + ldexp(1.0, -40); /* rounds to the tie in f32 */
    assert_int_equal(wsync_f32_to_bf16((float)above), 0x3f80); /* double rounding goes down */
    assert_int_equal(wsync_f64_to_bf16(above), 0x3f81);        /* single rounding goes up */
    assert_int_equal(wsync_f64_to_bf16(tie), 0x3f80);
    assert_int_equal(wsync_f64_to_f16(1.0 + ldexp(1.0, -11) + ldexp(1.0, -40)), 0x3c01);
}

static void test_convert_row(void **state)
{
    (void)state;
    float src[5] = {1.0f, -2.5f, 0.1f, 3.0e38f, -0.0f};
    uint16_t bf[5];
    wsync_convert_row(bf, WSYNC_DTYPE_BF16, src, WSYNC_DTYPE_F32, 5, 1.0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(bf[i], wsync_f32_to_bf16(src[i]));
    double d[5];
    wsync_convert_row(d, WSYNC_DTYPE_F64, bf, WSYNC_DTYPE_BF16, 5, 1.0);
    for (int i = 0; i < 5; i++)
        assert_true(d[i] == (double)wsync_bf16_to_f32(bf[i]));
    uint16_t h[5];
    wsync_convert_row(h, WSYNC_DTYPE_F16, src, WSYNC_DTYPE_F32, 5, 2.0);
    assert_int_equal(h[0], 0x4000); /* 2.0 */
    assert_int_equal(h[1], 0xc500); /* -5.0 */
    assert_int_equal(h[3], 0x7c00); /* overflow → inf */
    assert_int_equal(h[4], 0x8000); /* -0 */
    float back[5];
    wsync_convert_row(back, WSYNC_DTYPE_F32, h, WSYNC_DTYPE_F16, 5, 1.0);
    assert_true(back[1] == -5.0f);
    assert_int_equal(f32_bits(back[4]), 0x80000000u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_to_bf16),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_f64_single_rounding),
        cmocka_unit_test(test_convert_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
