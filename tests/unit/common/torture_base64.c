/* Strict RFC 4648 base64: known vectors, round trips, every rejection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_base64.h"

static void test_rfc4648_vectors(void **state)
{
    (void)state;
    static const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        size_t n = strlen(plain[i]);
        char out[16];
        uint8_t back[16];
        assert_int_equal(wsync_base64_encoded_size(n), strlen(enc[i]) + 1);
        wsync_base64_encode((const uint8_t *)plain[i], n, out);
        assert_string_equal(out, enc[i]);
        assert_int_equal(wsync_base64_decode(enc[i], back, sizeof(back)), (long)n);
        assert_memory_equal(back, plain[i], n);
    }
}

static void test_round_trip_all_bytes(void **state)
{
    (void)state;
    uint8_t in[256], back[256];
    char text[400];
    for (int i = 0; i < 256; i++)
        in[i] = (uint8_t)(255 - i);
    for (size_t n = 0; n <= sizeof(in); n++) {
        assert_true(wsync_base64_encoded_size(n) <= sizeof(text));
        wsync_base64_encode(in, n, text);
        assert_int_equal(strlen(text) + 1, wsync_base64_encoded_size(n));
        memset(back, 0xAA, sizeof(back));
        assert_int_equal(wsync_base64_decode(text, back, n), (long)n);
        assert_memory_equal(back, in, n);
    }
}

static void test_rejects_malformed(void **state)
{
    (void)state;
    uint8_t out[64];
    static const char *bad[] = {
        "Zg=",               /* length not a multiple of 4 */
        "Zg",                /* unpadded */
        "Z===",              /* three pads */
        "====",              /* only padding */
        "Zg==Zg==",          /* padding in the middle */
        "Z=g=",              /* data after padding */
        "Zm9v!A==",          /* bad character */
        "Zm9v YQ=",          /* space */
        "Zm9v\nYQ=", "Zh==", /* non-zero bits under the padding (not canonical) */
        "Zm9=",              /* non-zero bits under the padding */
        "Zm-v",              /* base64url alphabet */
        "Zm_v",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        long r = wsync_base64_decode(bad[i], out, sizeof(out));
        if (r != -1)
            print_error("\"%s\" decoded to %ld\n", bad[i], r);
        assert_int_equal(r, -1);
    }
    assert_int_equal(wsync_base64_decode(NULL, out, sizeof(out)), -1);
}

static void test_capacity(void **state)
{
    (void)state;
    uint8_t out[8];
    memset(out, 0x5A, sizeof(out));
    assert_int_equal(wsync_base64_decode("Zm9vYmFy", out, 5), -2);
    assert_int_equal(wsync_base64_decode("Zm9vYmFy", out, 6), 6);
    assert_int_equal(wsync_base64_decode("Zm9vYg==", out, 3), -2);
    assert_int_equal(wsync_base64_decode("Zm9vYg==", out, 4), 4);
    assert_int_equal(wsync_base64_decode("", out, 0), 0);
    /* -2 must not have written past cap. */
    memset(out, 0x5A, sizeof(out));
    assert_int_equal(wsync_base64_decode("Zm9vYmFy", out, 2), -2);
    assert_int_equal(out[2], 0x5A);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc4648_vectors),
        cmocka_unit_test(test_round_trip_all_bytes),
        cmocka_unit_test(test_rejects_malformed),
        cmocka_unit_test(test_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
