/* Float conversions with round-to-nearest-even, shared reference for every executor. */
#include "wsync_convert.h"

#include <math.h>
#include <string.h>

int wsync_convert_is_float(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32 ||
           dt == WSYNC_DTYPE_F64;
}

/* Round |x| (finite, non-negative double) into a binary format with `mant` stored mantissa bits
 * and exponent bias `bias`; returns the bits without sign. Exact: scaling by powers of two is
 * exact in double and rint() rounds to nearest even in the default rounding mode. */
static uint32_t wsync_round_small_float(double a, int mant, int bias, int exp_max_field)
{
    int e;
    (void)frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int unbiased = e - 1;
    uint32_t bits;
    if (a == 0.0)
        return 0;
    if (unbiased < 1 - bias) {
        /* Subnormal range: units of 2^(1 - bias - mant). Reaching 2^mant yields the smallest
         * normal number, whose encoding is the same integer. */
        double m = rint(ldexp(a, bias - 1 + mant));
        return (uint32_t)m;
    }
    double m = rint(ldexp(a, mant - unbiased)); /* in [2^mant, 2^(mant+1)] */
    if (m >= ldexp(1.0, mant + 1)) {
        m = ldexp(1.0, mant);
        unbiased++;
    }
    if (unbiased + bias >= exp_max_field)
        return (uint32_t)exp_max_field << mant; /* overflow → inf */
    bits = ((uint32_t)(unbiased + bias) << mant) | ((uint32_t)m - (1u << mant));
    return bits;
}

static uint16_t wsync_f64_to_half_like(double x, int mant, int bias, int exp_max_field)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x))
        return (uint16_t)(sign | ((uint32_t)exp_max_field << mant) | (1u << (mant - 1)));
    if (isinf(x))
        return (uint16_t)(sign | ((uint32_t)exp_max_field << mant));
    return (uint16_t)(sign | wsync_round_small_float(fabs(x), mant, bias, exp_max_field));
}

uint16_t wsync_f64_to_bf16(double x)
{
    return wsync_f64_to_half_like(x, 7, 127, 255);
}

uint16_t wsync_f64_to_f16(double x)
{
    return wsync_f64_to_half_like(x, 10, 15, 31);
}

uint16_t wsync_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign and payload top, force quiet */
    u += 0x7fffu + ((u >> 16) & 1u);            /* carry into the exponent rounds up to inf */
    return (uint16_t)(u >> 16);
}

float wsync_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t wsync_f32_to_f16(float x)
{
    return wsync_f64_to_f16((double)x); /* f32 → f64 is exact: still one rounding */
}

float wsync_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float f;
    if (exp == 0x1f) {
        uint32_t u = sign | 0x7f800000u | (mant << 13);
        memcpy(&f, &u, 4);
        return f;
    }
    f = exp == 0 ? ldexpf((float)mant, -24) : ldexpf((float)(mant | 0x400u), (int)exp - 25);
    return sign ? -f : f;
}

static double wsync_load(const uint8_t *p, wsync_dtype_t dt)
{
    uint16_t h;
    float f;
    double d;
    switch (dt) {
    case WSYNC_DTYPE_BF16:
        memcpy(&h, p, 2);
        return wsync_bf16_to_f32(h);
    case WSYNC_DTYPE_F16:
        memcpy(&h, p, 2);
        return wsync_f16_to_f32(h);
    case WSYNC_DTYPE_F32:
        memcpy(&f, p, 4);
        return f;
    case WSYNC_DTYPE_F64:
        memcpy(&d, p, 8);
        return d;
    default:
        return 0.0;
    }
}

static void wsync_store(uint8_t *p, wsync_dtype_t dt, double v)
{
    uint16_t h;
    float f;
    switch (dt) {
    case WSYNC_DTYPE_BF16:
        h = wsync_f64_to_bf16(v);
        memcpy(p, &h, 2);
        break;
    case WSYNC_DTYPE_F16:
        h = wsync_f64_to_f16(v);
        memcpy(p, &h, 2);
        break;
    case WSYNC_DTYPE_F32:
        f = (float)v;
        memcpy(p, &f, 4);
        break;
    case WSYNC_DTYPE_F64:
        memcpy(p, &v, 8);
        break;
    default:
        break;
    }
}

static size_t wsync_fsize(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F64 ? 8 : dt == WSYNC_DTYPE_F32 ? 4 : 2;
}

void wsync_convert_row(void *dst, wsync_dtype_t dst_dt, const void *src, wsync_dtype_t src_dt,
                       size_t n, double scale)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t ds = wsync_fsize(dst_dt), ss = wsync_fsize(src_dt);
    if (scale == 1.0 && dst_dt == src_dt) {
        memcpy(d, s, n * ds);
        return;
    }
    if (scale == 1.0 && src_dt == WSYNC_DTYPE_F32 && dst_dt == WSYNC_DTYPE_BF16) {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, s + 4 * i, 4);
            uint16_t h = wsync_f32_to_bf16(f);
            memcpy(d + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        double v = wsync_load(s + i * ss, src_dt);
        wsync_store(d + i * ds, dst_dt, scale == 1.0 ? v : v * scale);
    }
}
