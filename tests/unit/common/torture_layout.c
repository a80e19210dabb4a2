/* Producer packing: alignment, capacity, refusals, and the retained-layout comparison. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_layout.h"
#include "wsync_manifest.h"

static char src_mem[1 << 16];

static wsync_stage_tensor_t st(const char *name, wsync_dtype_t dt, uint32_t ndim, int64_t d0,
                               int64_t d1)
{
    wsync_stage_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.struct_size = sizeof(t);
    t.name = name;
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.src = src_mem;
    return t;
}

static void expect_build_fail_at(const wsync_stage_tensor_t *t, size_t n, uint64_t cap,
                                 wsync_result_t code, const char *needle, int line)
{
    wsync_layout_t l;
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    memset(&l, 0x5A, sizeof(l));
    wsync_result_t r = wsync_layout_build(t, n, cap, &l, &err);
    if (r != code || strstr(err.message, needle) == NULL)
        print_error("line %d: got %d \"%s\", want %d with \"%s\"\n", line, r, err.message, code,
                    needle);
    assert_int_equal(r, code);
    assert_non_null(strstr(err.message, needle));
    assert_null(l.tensors);
    assert_null(l.names);
    assert_int_equal(l.n, 0);
}
#define expect_build_fail(t, n, cap, code, needle)                                                 \
    expect_build_fail_at((t), (n), (cap), (code), (needle), __LINE__)

static void test_packing(void **state)
{
    (void)state;
    char name0[] = "w0";
    wsync_stage_tensor_t t[5] = {
        st(name0, WSYNC_DTYPE_BF16, 2, 3, 5),   /* 30 bytes at 0 */
        st("w1", WSYNC_DTYPE_F32, 1, 64, 0),    /* 256 bytes at 256 */
        st("empty", WSYNC_DTYPE_F32, 1, 0, 0),  /* 0 bytes at 512 */
        st("scalar", WSYNC_DTYPE_F64, 0, 0, 0), /* 8 bytes at 512 */
        st("w4", WSYNC_DTYPE_U8, 1, 257, 0),    /* 257 bytes at 768 */
    };
    t[2].src = NULL; /* allowed for an empty tensor */
    wsync_layout_t l;
    assert_int_equal(wsync_layout_build(t, 5, 1025, &l, NULL), WSYNC_OK);
    assert_int_equal(l.n, 5);
    const uint64_t offsets[] = {0, 256, 512, 512, 768};
    const uint64_t sizes[] = {30, 256, 0, 8, 257};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(l.tensors[i].offset, offsets[i]);
        assert_int_equal(l.tensors[i].offset % WSYNC_LAYOUT_ALIGN, 0);
        assert_int_equal(l.tensors[i].nbytes, sizes[i]);
        assert_int_equal(l.tensors[i].has_digest, 0);
        assert_int_equal(l.tensors[i].dtype, t[i].dtype);
        assert_int_equal(l.tensors[i].ndim, t[i].ndim);
        assert_string_equal(l.tensors[i].name, t[i].name);
    }
    assert_int_equal(l.tensors[0].shape[1], 5);
    assert_int_equal(l.used, 768 + 257);
    /* Names are owned copies. */
    name0[1] = 'X';
    assert_string_equal(l.tensors[0].name, "w0");
    wsync_layout_free(&l);
    assert_null(l.tensors);

    /* Capacity exactly used is enough; one byte less is not. */
    name0[1] = '0';
    assert_int_equal(wsync_layout_build(t, 5, 1025, &l, NULL), WSYNC_OK);
    wsync_layout_free(&l);
    expect_build_fail(t, 5, 1024, WSYNC_ERR_OUT_OF_BOUNDS,
                      "needs 1025 bytes (packed at 256) but the staging buffer holds 1024");

    /* An empty bucket. */
    assert_int_equal(wsync_layout_build(NULL, 0, 0, &l, NULL), WSYNC_OK);
    assert_int_equal(l.n, 0);
    assert_int_equal(l.used, 0);
    wsync_layout_free(&l);
}

static void test_refusals(void **state)
{
    (void)state;
    wsync_stage_tensor_t t[3] = {st("a", WSYNC_DTYPE_BF16, 1, 4, 0),
                                 st("b", WSYNC_DTYPE_BF16, 1, 4, 0),
                                 st("c", WSYNC_DTYPE_BF16, 1, 4, 0)};
    const uint64_t cap = 1 << 20;
    t[1].name = "";
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT, "tensor 1: name is empty");
    t[1].name = NULL;
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT, "tensor 1: name is NULL");
    /* names travel as JSON strings: refused at stage, before a byte is written */
    t[1].name = "caf\xc3\xa9.\xc0\xaf";
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT,
                      "tensor 1: name is not valid UTF-8 (byte 0xc0 at 6)");
    t[1].name = "surrogate \xed\xa0\x80";
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT, "(byte 0xed at 10)");
    t[1].name = "b";
    t[2].name = "a";
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT,
                      "tensor 2: name \"a\" duplicates tensor 0");
    t[2].name = "c";
    t[2].dtype = (wsync_dtype_t)42;
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT, "tensor 2 (\"c\"): unknown dtype 42");
    t[2].dtype = WSYNC_DTYPE_BF16;
    t[0].shape[0] = -4;
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT,
                      "tensor 0 (\"a\"): shape [-4] has a negative dimension");
    t[0].shape[0] = 4;
    t[0].ndim = 9;
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT, "ndim 9 exceeds the limit 8");
    t[0].ndim = 2;
    t[0].shape[0] = INT64_MAX;
    t[0].shape[1] = INT64_MAX;
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT, "overflows 64 bits");
    t[0].ndim = 1;
    t[0].shape[0] = 4;
    t[1].src = NULL;
    expect_build_fail(t, 3, cap, WSYNC_ERR_INVALID_ARGUMENT,
                      "tensor 1 (\"b\"): src is NULL but the tensor has 8 bytes");
    t[1].src = src_mem;
    /* The packed offset itself overflowing. */
    t[0].dtype = WSYNC_DTYPE_U8;
    t[0].shape[0] = INT64_MAX;
    t[1].dtype = WSYNC_DTYPE_U8;
    t[1].shape[0] = INT64_MAX;
    t[2].dtype = WSYNC_DTYPE_U8;
    t[2].shape[0] = INT64_MAX;
    expect_build_fail(t, 3, UINT64_MAX, WSYNC_ERR_OUT_OF_BOUNDS,
                      "tensor 2 (\"c\"): packed offset overflows 64 bits");

    char long_name[WSYNC_MANIFEST_MAX_NAME + 2];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    wsync_stage_tensor_t one = st(long_name, WSYNC_DTYPE_U8, 1, 1, 0);
    expect_build_fail(&one, 1, cap, WSYNC_ERR_INVALID_ARGUMENT, "is 1025 bytes, the limit is 1024");

    wsync_layout_t l;
    assert_int_equal(wsync_layout_build(NULL, 2, cap, &l, NULL), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(wsync_layout_build(t, 1, cap, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT);
}

static void test_many_duplicates_reported_once(void **state)
{
    (void)state;
    enum { N = 2000 };
    static wsync_stage_tensor_t t[N];
    static char names[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "layer.%d", i);
        t[i] = st(names[i], WSYNC_DTYPE_U8, 1, 1, 0);
    }
    wsync_layout_t l;
    assert_int_equal(wsync_layout_build(t, N, UINT64_MAX, &l, NULL), WSYNC_OK);
    assert_int_equal(l.used, (uint64_t)(N - 1) * 256 + 1);
    wsync_layout_free(&l);
    t[1500].name = names[33];
    expect_build_fail(t, N, UINT64_MAX, WSYNC_ERR_INVALID_ARGUMENT,
                      "tensor 1500: name \"layer.33\" duplicates tensor 33");
}

static void build(wsync_layout_t *l, const wsync_stage_tensor_t *t, size_t n)
{
    assert_int_equal(wsync_layout_build(t, n, 1 << 20, l, NULL), WSYNC_OK);
}

static void expect_mismatch_at(const wsync_layout_t *a, const wsync_layout_t *b, const char *needle,
                               int line)
{
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    wsync_result_t r = wsync_layout_compare(a, b, &err);
    if (r != WSYNC_ERR_LAYOUT_MISMATCH || strstr(err.message, needle) == NULL)
        print_error("line %d: got %d \"%s\", want \"%s\"\n", line, r, err.message, needle);
    assert_int_equal(r, WSYNC_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.message, needle));
}
#define expect_mismatch(a, b, needle) expect_mismatch_at((a), (b), (needle), __LINE__)

static void test_compare(void **state)
{
    (void)state;
    wsync_stage_tensor_t t[2] = {st("q", WSYNC_DTYPE_BF16, 2, 4, 8),
                                 st("k", WSYNC_DTYPE_BF16, 2, 2, 8)};
    wsync_layout_t retained, next;
    build(&retained, t, 2);

    /* Same layout, other source pointers: equal. */
    t[0].src = src_mem + 4096;
    build(&next, t, 2);
    assert_int_equal(wsync_layout_compare(&retained, &next, NULL), WSYNC_OK);
    wsync_layout_free(&next);

    build(&next, t, 1);
    expect_mismatch(&retained, &next, "bucket has 1 tensors but the retained layout has 2");
    wsync_layout_free(&next);

    t[1].name = "v";
    build(&next, t, 2);
    expect_mismatch(&retained, &next, "tensor 1: name \"v\" differs from the retained \"k\"");
    wsync_layout_free(&next);
    t[1].name = "k";

    t[0].dtype = WSYNC_DTYPE_F16;
    build(&next, t, 2);
    expect_mismatch(&retained, &next,
                    "tensor 0 (\"q\"): dtype float16 differs from the retained bfloat16");
    wsync_layout_free(&next);
    t[0].dtype = WSYNC_DTYPE_BF16;

    t[1].shape[1] = 16;
    build(&next, t, 2);
    expect_mismatch(&retained, &next,
                    "tensor 1 (\"k\"): shape [2, 16] differs from the retained "
                    "[2, 8]");
    wsync_layout_free(&next);

    /* Same element count, other rank. */
    t[1] = st("k", WSYNC_DTYPE_BF16, 1, 16, 0);
    build(&next, t, 2);
    expect_mismatch(&retained, &next, "shape [16] differs from the retained [2, 8]");
    wsync_layout_free(&next);

    assert_int_equal(wsync_layout_compare(NULL, &retained, NULL), WSYNC_ERR_INVALID_ARGUMENT);
    wsync_layout_free(&retained);
    wsync_layout_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packing),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_many_duplicates_reported_once),
        cmocka_unit_test(test_compare),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
