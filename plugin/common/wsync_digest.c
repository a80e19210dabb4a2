/* wsync64 on the host. The streaming and one-shot paths compute the same function for any split
 * of the input: word j is always the j-th 8-byte little-endian word of the whole stream. */
#include "wsync_digest.h"

#include <stdio.h>
#include <string.h>

static inline uint64_t wsync_load_le64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof(w));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* Sum of mix(w_j ^ j*G) over the n/8 whole words of p, the first being word index j0. */
static uint64_t wsync64_sum_words(const unsigned char *p, size_t nwords, uint64_t j0)
{
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint64_t k = j0 * WSYNC64_GOLDEN;
    const uint64_t g = WSYNC64_GOLDEN;
    size_t i = 0;

    for (; i + 4 <= nwords; i += 4, p += 32) {
        s0 += wsync_mix64(wsync_load_le64(p) ^ k);
        s1 += wsync_mix64(wsync_load_le64(p + 8) ^ (k + g));
        s2 += wsync_mix64(wsync_load_le64(p + 16) ^ (k + 2 * g));
        s3 += wsync_mix64(wsync_load_le64(p + 24) ^ (k + 3 * g));
        k += 4 * g;
    }
    for (; i < nwords; i++, p += 8) {
        s0 += wsync_mix64(wsync_load_le64(p) ^ k);
        k += g;
    }
    return s0 + s1 + s2 + s3;
}

void wsync64_init(wsync64_state_t *s)
{
    memset(s, 0, sizeof(*s));
}

void wsync64_update(wsync64_state_t *s, const void *data, size_t n)
{
    const unsigned char *p = data;

    /* Finish an incomplete word first. */
    while (s->npartial != 0 && n > 0) {
        s->partial |= (uint64_t)*p << (8 * s->npartial);
        s->npartial++;
        s->nbytes++;
        p++;
        n--;
        if (s->npartial == 8) {
            uint64_t j = s->nbytes / 8 - 1;
            s->sum += wsync_mix64(s->partial ^ (j * WSYNC64_GOLDEN));
            s->partial = 0;
            s->npartial = 0;
        }
    }
    if (n == 0)
        return;

    /* Here s->nbytes is a multiple of 8. */
    size_t nwords = n / 8;
    s->sum += wsync64_sum_words(p, nwords, s->nbytes / 8);
    s->nbytes += (uint64_t)nwords * 8;
    p += nwords * 8;
    n -= nwords * 8;

    for (size_t i = 0; i < n; i++)
        s->partial |= (uint64_t)p[i] << (8 * i);
    s->npartial = (unsigned)n;
    s->nbytes += n;
}

uint64_t wsync64_final(const wsync64_state_t *s)
{
    uint64_t sum = s->sum;
    if (s->npartial != 0) {
        uint64_t j = s->nbytes / 8; /* index of the incomplete word */
        sum += wsync_mix64(s->partial ^ (j * WSYNC64_GOLDEN));
    }
    return wsync_mix64(sum ^ s->nbytes);
}

uint64_t wsync64(const void *p, size_t n)
{
    wsync64_state_t s;
    wsync64_init(&s);
    wsync64_update(&s, p, n);
    return wsync64_final(&s);
}

void wsync64_format(uint64_t d, char *buf)
{
    snprintf(buf, 25, "wsync64:%016llx", (unsigned long long)d);
}

int wsync64_parse(const char *text, uint64_t *out)
{
    uint64_t v = 0;

    if (text == NULL || strncmp(text, "wsync64:", 8) != 0)
        return -1;
    text += 8;
    for (int i = 0; i < 16; i++) {
        char c = text[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return -1;
        v = (v << 4) | d;
    }
    if (text[16] != '\0')
        return -1;
    *out = v;
    return 0;
}
