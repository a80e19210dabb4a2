/* Streaming-store copy (SSE2 on x86-64; plain memcpy elsewhere). */
#include "cpu_memcpy.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

void wsync_cpu_copy_streaming(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16u - ((uintptr_t)d & 15u)) & 15u;

    if (n < 4096) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
}

void wsync_cpu_copy_fence(void)
{
    _mm_sfence();
}

#else

void wsync_cpu_copy_streaming(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

void wsync_cpu_copy_fence(void) {}

#endif
