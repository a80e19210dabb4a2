/* Standard base64 (RFC 4648) with padding; strict decoder. */
#include "wsync_base64.h"

static const char wsync_b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t wsync_base64_encoded_size(size_t n)
{
    return (n + 2) / 3 * 4 + 1;
}

void wsync_base64_encode(const uint8_t *in, size_t n, char *out)
{
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *out++ = wsync_b64_alphabet[(v >> 18) & 63];
        *out++ = wsync_b64_alphabet[(v >> 12) & 63];
        *out++ = wsync_b64_alphabet[(v >> 6) & 63];
        *out++ = wsync_b64_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        *out++ = wsync_b64_alphabet[(v >> 18) & 63];
        *out++ = wsync_b64_alphabet[(v >> 12) & 63];
        *out++ = '=';
        *out++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        *out++ = wsync_b64_alphabet[(v >> 18) & 63];
        *out++ = wsync_b64_alphabet[(v >> 12) & 63];
        *out++ = wsync_b64_alphabet[(v >> 6) & 63];
        *out++ = '=';
    }
    *out = '\0';
}

static int wsync_b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long wsync_base64_decode(const char *in, uint8_t *out, size_t cap)
{
    size_t len = 0, o = 0;

    if (in == NULL)
        return -1;
    while (in[len] != '\0')
        len++;
    if (len % 4 != 0)
        return -1;
    for (size_t i = 0; i < len; i += 4) {
        int last = i + 4 == len;
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            char c = in[i + k];
            if (c == '=' && last && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad != 0) {
                return -1; /* data after padding */
            } else {
                v[k] = wsync_b64_value(c);
                if (v[k] < 0)
                    return -1;
            }
        }
        uint32_t bits =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        /* Canonical form only: the bits dropped by padding must be zero. */
        if ((pad == 2 && (bits & 0xFFFF) != 0) || (pad == 1 && (bits & 0xFF) != 0))
            return -1;
        size_t nout = 3 - (size_t)pad;
        if (o + nout > cap)
            return -2;
        out[o++] = (uint8_t)(bits >> 16);
        if (nout > 1)
            out[o++] = (uint8_t)(bits >> 8);
        if (nout > 2)
            out[o++] = (uint8_t)bits;
    }
    return (long)o;
}
