/* Fuzz target: wsync_base64_decode (strict) and its round trip with wsync_base64_encode.
 * Invariants: a decode never writes past `cap`; -2 only when the full output would not fit; a
 * successful decode re-encodes to exactly the input (canonical form); encode → decode is the
 * identity on any bytes. */
#include <string.h>

#include "wsync_base64.h"
#include "wsync_fuzz.h"

#define GUARD 16

static void check_decode(const char *text, size_t text_len, size_t cap)
{
    uint8_t *out = malloc(cap + GUARD);
    WSYNC_FUZZ_CHECK(out != NULL);
    memset(out, 0xA5, cap + GUARD);
    long n = wsync_base64_decode(text, out, cap);
    for (size_t i = 0; i < GUARD; i++)
        WSYNC_FUZZ_CHECK(out[cap + i] == 0xA5);
    WSYNC_FUZZ_CHECK(n >= -2);
    if (n >= 0) {
        WSYNC_FUZZ_CHECK((size_t)n <= cap);
        WSYNC_FUZZ_CHECK((size_t)n <= text_len / 4 * 3);
        char *again = malloc(wsync_base64_encoded_size((size_t)n));
        WSYNC_FUZZ_CHECK(again != NULL);
        wsync_base64_encode(out, (size_t)n, again);
        WSYNC_FUZZ_CHECK(strcmp(again, text) == 0);
        free(again);
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* As text: the decoder reads up to the first NUL. */
    char *text = malloc(size + 1);
    WSYNC_FUZZ_CHECK(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';
    size_t len = strlen(text);
    check_decode(text, len, len / 4 * 3);     /* always enough */
    check_decode(text, len, len / 4 * 3 / 2); /* often too small: must say -2, not overflow */
    check_decode(text, len, size ? data[0] % 8 : 0);
    free(text);

    /* As bytes: encode then decode must give them back. */
    size_t esz = wsync_base64_encoded_size(size);
    char *enc = malloc(esz);
    uint8_t *dec = malloc(size + 1);
    WSYNC_FUZZ_CHECK(enc != NULL && dec != NULL);
    wsync_base64_encode(data, size, enc);
    WSYNC_FUZZ_CHECK(strlen(enc) + 1 == esz);
    long n = wsync_base64_decode(enc, dec, size);
    WSYNC_FUZZ_CHECK(n == (long)size);
    WSYNC_FUZZ_CHECK(size == 0 || memcmp(dec, data, size) == 0);
    if (size > 0)
        WSYNC_FUZZ_CHECK(wsync_base64_decode(enc, dec, size - 1) == -2);
    free(enc);
    free(dec);
    return 0;
}
