/* UTF-8 validation (see wsync_utf8.h). */
#include "wsync_utf8.h"
#include "wsync_swar.h"

#include <stdint.h>
#include <string.h>

/* Length of the UTF-8 sequence at s (1-4), or 0 when it is not valid UTF-8: the rules of
 * jansson's own check (no overlong forms, no surrogates, nothing above U+10FFFF). */
size_t wsync_utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    size_t n;
    uint32_t v;
    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0)
        n = 2, v = c & 0x1F;
    else if (c < 0xF0)
        n = 3, v = c & 0x0F;
    else if (c < 0xF5)
        n = 4, v = c & 0x07;
    else
        return 0;
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && v < 0x10000) || v > 0x10FFFF ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    return n;
}

size_t wsync_utf8_invalid_n(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (len - i >= 8) {
            const uint64_t x = wsync_swar_load(u + i);
            if ((wsync_swar_high(x) | wsync_swar_eq(x, 0)) == 0) { /* eight ASCII bytes, none NUL */
                i += 8;
                continue;
            }
        }
        if (u[i] == '\0')
            return i;
        unsigned char seq[4] = {0, 0, 0, 0}; /* a sequence cut by the end reads NULs: invalid */
        memcpy(seq, u + i, len - i < 4 ? len - i : 4);
        const size_t n = wsync_utf8_len(seq);
        if (n == 0)
            return i;
        i += n;
    }
    return (size_t)-1;
}

size_t wsync_utf8_invalid_at(const char *s)
{
    return wsync_utf8_invalid_n(s, strlen(s));
}
