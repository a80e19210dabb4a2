/* wsync64: shared vectors, streaming == one-shot for any split, sensitivity to moves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wsync64_vectors.h"
#include "wsync_digest.h"

static unsigned char *filled(wsync64_pattern_t p, size_t n)
{
    unsigned char *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    wsync64_vector_fill(p, buf, n);
    return buf;
}

static void test_vectors_one_shot(void **state)
{
    (void)state;
    for (size_t i = 0; i < WSYNC64_N_VECTORS; i++) {
        const wsync64_vector_t *v = &wsync64_vectors[i];
        unsigned char *buf = filled(v->pattern, v->length);
        uint64_t d = wsync64(buf, v->length);
        if (d != v->expected)
            print_error("vector %zu (length %zu, pattern %d): got %016llx want %016llx\n", i,
                        v->length, (int)v->pattern, (unsigned long long)d,
                        (unsigned long long)v->expected);
        assert_int_equal(d, v->expected);
        free(buf);
    }
}

/* The vectors hold for an unaligned source too (the one-shot path loads words with memcpy). */
static void test_vectors_unaligned(void **state)
{
    (void)state;
    for (size_t i = 0; i < WSYNC64_N_VECTORS; i++) {
        const wsync64_vector_t *v = &wsync64_vectors[i];
        unsigned char *buf = malloc(v->length + 8);
        assert_non_null(buf);
        for (size_t shift = 1; shift < 8; shift += 3) {
            wsync64_vector_fill(v->pattern, buf + shift, v->length);
            assert_int_equal(wsync64(buf + shift, v->length), v->expected);
        }
        free(buf);
    }
}

static uint64_t digest_in_pieces(const unsigned char *buf, size_t n, unsigned seed)
{
    wsync64_state_t s;
    size_t off = 0;
    wsync64_init(&s);
    srand(seed);
    while (off < n) {
        /* Mostly tiny pieces, sometimes big ones, sometimes empty. */
        size_t piece = (size_t)rand() % 4 == 0 ? (size_t)rand() % 5000 : (size_t)rand() % 17;
        if (piece > n - off)
            piece = n - off;
        wsync64_update(&s, buf + off, piece);
        off += piece;
    }
    wsync64_update(&s, buf, 0);
    return wsync64_final(&s);
}

static void test_vectors_streaming_random_splits(void **state)
{
    (void)state;
    for (size_t i = 0; i < WSYNC64_N_VECTORS; i++) {
        const wsync64_vector_t *v = &wsync64_vectors[i];
        unsigned char *buf = filled(v->pattern, v->length);
        for (unsigned seed = 1; seed <= 5; seed++)
            assert_int_equal(digest_in_pieces(buf, v->length, seed * 7919u + (unsigned)i),
                             v->expected);
        free(buf);
    }
}

static void test_streaming_every_two_way_split(void **state)
{
    (void)state;
    unsigned char *buf = filled(WSYNC64_PAT_LCG, 67);
    for (size_t n = 0; n <= 67; n++) {
        uint64_t whole = wsync64(buf, n);
        for (size_t cut = 0; cut <= n; cut++) {
            wsync64_state_t s;
            wsync64_init(&s);
            wsync64_update(&s, buf, cut);
            wsync64_update(&s, buf + cut, n - cut);
            assert_int_equal(wsync64_final(&s), whole);
            assert_int_equal(s.nbytes, n);
        }
    }
    free(buf);
}

static void test_final_does_not_consume_state(void **state)
{
    (void)state;
    unsigned char *buf = filled(WSYNC64_PAT_MUL, 100);
    wsync64_state_t s;
    wsync64_init(&s);
    wsync64_update(&s, buf, 45);
    assert_int_equal(wsync64_final(&s), wsync64(buf, 45));
    wsync64_update(&s, buf + 45, 55);
    assert_int_equal(wsync64_final(&s), wsync64(buf, 100));
    free(buf);
}

static void test_detects_moves_and_length(void **state)
{
    (void)state;
    unsigned char a[64], b[64];
    wsync64_vector_fill(WSYNC64_PAT_LCG, a, sizeof(a));
    memcpy(b, a, sizeof(b));
    /* Swapping two words keeps the multiset of words: the index keying must notice. */
    memcpy(b, a + 8, 8);
    memcpy(b + 8, a, 8);
    assert_int_not_equal(wsync64(a, sizeof(a)), wsync64(b, sizeof(b)));
    /* A trailing zero byte changes nbytes only. */
    unsigned char z[9] = {0};
    assert_int_not_equal(wsync64(z, 8), wsync64(z, 9));
    /* A single flipped bit anywhere. */
    for (size_t bit = 0; bit < sizeof(a) * 8; bit += 13) {
        memcpy(b, a, sizeof(b));
        b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_int_not_equal(wsync64(a, sizeof(a)), wsync64(b, sizeof(b)));
    }
}

/* Order independence of the sum: digesting words in any order through the definition gives the
 * same value — the property the CUDA kernel relies on. */
static void test_definition_matches(void **state)
{
    (void)state;
    unsigned char buf[43];
    wsync64_vector_fill(WSYNC64_PAT_INDEX, buf, sizeof(buf));
    uint64_t sum = 0;
    for (size_t j = (sizeof(buf) + 7) / 8; j-- > 0;) {
        uint64_t w = 0;
        for (size_t k = 0; k < 8 && j * 8 + k < sizeof(buf); k++)
            w |= (uint64_t)buf[j * 8 + k] << (8 * k);
        sum += wsync_mix64(w ^ (j * WSYNC64_GOLDEN));
    }
    assert_int_equal(wsync64(buf, sizeof(buf)), wsync_mix64(sum ^ sizeof(buf)));
}

static void test_format_parse(void **state)
{
    (void)state;
    char buf[32];
    uint64_t v = 0;
    wsync64_format(0x0123456789abcdefull, buf);
    assert_string_equal(buf, "wsync64:0123456789abcdef");
    assert_int_equal(wsync64_parse(buf, &v), 0);
    assert_int_equal(v, 0x0123456789abcdefull);
    wsync64_format(0, buf);
    assert_string_equal(buf, "wsync64:0000000000000000");

    const char *bad[] = {
        "",
        "wsync64:",
        "wsync64:0123456789abcde",   /* 15 digits */
        "wsync64:0123456789abcdef0", /* 17 digits */
        "wsync64:0123456789ABCDEF",  /* uppercase */
        "wsync64:0123456789abcdeg",
        "sha256:0123456789abcdef",
        "WSYNC64:0123456789abcdef",
        " wsync64:0123456789abcdef",
        "wsync64:-123456789abcdef",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 42;
        assert_int_equal(wsync64_parse(bad[i], &v), -1);
        assert_int_equal(v, 42);
    }
    assert_int_equal(wsync64_parse(NULL, &v), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_one_shot),
        cmocka_unit_test(test_vectors_unaligned),
        cmocka_unit_test(test_vectors_streaming_random_splits),
        cmocka_unit_test(test_streaming_every_two_way_split),
        cmocka_unit_test(test_final_does_not_consume_state),
        cmocka_unit_test(test_detects_moves_and_length),
        cmocka_unit_test(test_definition_matches),
        cmocka_unit_test(test_format_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
