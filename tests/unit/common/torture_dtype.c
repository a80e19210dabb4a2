/* Element types: sizes, names in both spellings, nbytes with overflow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "wsync_dtype.h"

static void test_sizes(void **state)
{
    (void)state;
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_BF16), 2);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_F16), 2);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_F32), 4);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_F64), 8);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_I8), 1);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_U8), 1);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_I16), 2);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_I32), 4);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_I64), 8);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_BOOL), 1);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_F8_E4M3), 1);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_F8_E5M2), 1);
    assert_int_equal(wsync_dtype_size(WSYNC_DTYPE_INVALID), 0);
    assert_int_equal(wsync_dtype_size((wsync_dtype_t)99), 0);
}

static void test_names_round_trip(void **state)
{
    (void)state;
    static const struct {
        wsync_dtype_t dt;
        const char *torch;
        const char *st;
    } t[] = {
        {WSYNC_DTYPE_BF16, "bfloat16", "BF16"},
        {WSYNC_DTYPE_F16, "float16", "F16"},
        {WSYNC_DTYPE_F32, "float32", "F32"},
        {WSYNC_DTYPE_F64, "float64", "F64"},
        {WSYNC_DTYPE_I8, "int8", "I8"},
        {WSYNC_DTYPE_U8, "uint8", "U8"},
        {WSYNC_DTYPE_I16, "int16", "I16"},
        {WSYNC_DTYPE_I32, "int32", "I32"},
        {WSYNC_DTYPE_I64, "int64", "I64"},
        {WSYNC_DTYPE_BOOL, "bool", "BOOL"},
        {WSYNC_DTYPE_F8_E4M3, "float8_e4m3fn", "F8_E4M3"},
        {WSYNC_DTYPE_F8_E5M2, "float8_e5m2", "F8_E5M2"},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char prefixed[64];
        snprintf(prefixed, sizeof(prefixed), "torch.%s", t[i].torch);
        assert_string_equal(wsync_dtype_name(t[i].dt), t[i].torch);
        assert_int_equal(wsync_dtype_from_name(t[i].torch), t[i].dt);
        assert_int_equal(wsync_dtype_from_name(t[i].st), t[i].dt);
        assert_int_equal(wsync_dtype_from_name(prefixed), t[i].dt);
    }
    assert_string_equal(wsync_dtype_name(WSYNC_DTYPE_INVALID), "invalid");
    assert_string_equal(wsync_dtype_name((wsync_dtype_t)77), "invalid");
}

static void test_unknown_names(void **state)
{
    (void)state;
    static const char *bad[] = {"",         "float",
                                "bf16",     "Float32",
                                "torch.",   "torch.BF16x",
                                "float32 ", "complex64",
                                "invalid",  "torch.torch.float32"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(wsync_dtype_from_name(bad[i]), WSYNC_DTYPE_INVALID);
    assert_int_equal(wsync_dtype_from_name(NULL), WSYNC_DTYPE_INVALID);
}

static void test_nbytes(void **state)
{
    (void)state;
    uint64_t n = 0;
    int64_t shape[WSYNC_MAX_DIMS] = {4096, 4096};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_BF16, 2, shape, &n), 0);
    assert_int_equal(n, 33554432u);
    /* Scalar. */
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_F64, 0, NULL, &n), 0);
    assert_int_equal(n, 8);
    /* Empty tensor. */
    int64_t empty[] = {3, 0, 5};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_F32, 3, empty, &n), 0);
    assert_int_equal(n, 0);
    /* Eight dims of 2. */
    int64_t eight[WSYNC_MAX_DIMS] = {2, 2, 2, 2, 2, 2, 2, 2};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_I16, 8, eight, &n), 0);
    assert_int_equal(n, 512);
}

static void test_nbytes_refusals(void **state)
{
    (void)state;
    uint64_t n = 12345;
    int64_t neg[] = {4, -1};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_F32, 2, neg, &n), -1);
    /* Negative times zero is still refused. */
    int64_t neg0[] = {0, -1};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_F32, 2, neg0, &n), -1);
    int64_t big[] = {INT64_MAX, 2};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_U8, 2, big, &n), 0);
    assert_int_equal(n, (uint64_t)INT64_MAX * 2);
    int64_t over[] = {INT64_MAX, 4};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_U8, 2, over, &n), -1);
    int64_t over2[] = {1ll << 32, 1ll << 31};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_I64, 2, over2, &n), -1);
    int64_t one[] = {1};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_INVALID, 1, one, &n), -1);
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(wsync_tensor_nbytes(WSYNC_DTYPE_U8, 9, nine, &n), -1);
    /* *out untouched on every refusal. */
    assert_int_equal(n, (uint64_t)INT64_MAX * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),           cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_unknown_names),   cmocka_unit_test(test_nbytes),
        cmocka_unit_test(test_nbytes_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
