/* Manifest emit: the hand-written tensors array is byte for byte what jansson's compact dump
 * writes (names with every kind of escape, any UTF-8), names that are not UTF-8 are refused
 * naming the tensor, and emit and parse round-trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Library results are malloc'd; cmocka replaces free() with its checker below this point. */
static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#include "wsync_manifest.h"

static wsync_manifest_t manifest(wsync_tensor_desc_t *t, size_t n)
{
    wsync_manifest_t v = {
        .struct_size = sizeof(v), .schema = 1, .generation = 9, .n_tensors = n, .tensors = t};
    v.buffer.struct_size = sizeof(v.buffer);
    v.buffer.kind = WSYNC_BUFFER_HOST_SHM;
    memcpy(v.buffer.handle, "/wsync-7", 8);
    v.buffer.handle_len = 8;
    v.buffer.bytes = 1ull << 40;
    v.buffer.pid = 4242;
    strcpy(v.buffer.device, "cpu");
    return v;
}

static wsync_tensor_desc_t tensor(const char *name, uint64_t offset, int digest)
{
    wsync_tensor_desc_t t = {.struct_size = sizeof(t),
                             .name = name,
                             .dtype = WSYNC_DTYPE_BF16,
                             .ndim = 3,
                             .shape = {2, 3, 4},
                             .offset = offset,
                             .nbytes = 48,
                             .digest = 0x0123456789abcdefull ^ offset,
                             .has_digest = digest};
    return t;
}

/* Our text, loaded by jansson and dumped again compact in order, is the same text. */
static void expect_jansson_identical(const char *text)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (root == NULL)
        print_error("jansson cannot load %s: %s\n", text, je.text);
    assert_non_null(root);
    char *again = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_non_null(again);
    if (strcmp(again, text) != 0)
        print_error("ours:    %s\njansson: %s\n", text, again);
    assert_string_equal(again, text);
    real_free(again);
    json_decref(root);
}

static void test_same_bytes_as_jansson(void **state)
{
    (void)state;
    static const char *const names[] = {
        "model.layers.0.mlp.experts.7.gate_proj.weight",
        "quote\"back\\slash/slash",
        "ctl\b\f\n\r\t\x01\x1f\x7f end",
        "utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf",
        "x",
    };
    enum { N = sizeof(names) / sizeof(names[0]) };
    wsync_tensor_desc_t t[N];
    for (int digests = 0; digests < 3; digests++) { /* none, all (blob), some (per tensor) */
        for (size_t i = 0; i < N; i++)
            t[i] = tensor(names[i], 256 * i, digests == 1 || (digests == 2 && i % 2 == 0));
        wsync_manifest_t v = manifest(t, N);
        v.finished = digests == 1;
        char *text = NULL;
        assert_int_equal(wsync_manifest_emit(&v, &text, NULL), WSYNC_OK);
        expect_jansson_identical(text);
        assert_non_null(strstr(text, "\\u0001\\u001F\x7f end"));
        assert_true((strstr(text, "\"digests\":") != NULL) == (digests == 1));
        assert_true((strstr(text, "\"digest\":\"wsync64:") != NULL) == (digests == 2));
        /* and it parses back to the same manifest */
        wsync_manifest_owned_t *m = NULL;
        assert_int_equal(wsync_manifest_parse(text, strlen(text), &m, NULL), WSYNC_OK);
        assert_int_equal(m->view.n_tensors, N);
        for (size_t i = 0; i < N; i++) {
            assert_string_equal(m->view.tensors[i].name, names[i]);
            assert_int_equal(m->view.tensors[i].offset, 256 * i);
            assert_int_equal(m->view.tensors[i].has_digest, t[i].has_digest);
            if (t[i].has_digest)
                assert_int_equal(m->view.tensors[i].digest, t[i].digest);
        }
        wsync_manifest_free(m);
        real_free(text);
    }
    /* no tensors at all */
    wsync_manifest_t v = manifest(NULL, 0);
    char *text = NULL;
    assert_int_equal(wsync_manifest_emit(&v, &text, NULL), WSYNC_OK);
    expect_jansson_identical(text);
    assert_non_null(strstr(text, ",\"tensors\":[]}"));
    real_free(text);
}

static void test_names_not_utf8(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "lone \x80 continuation",
        "overlong \xc0\xaf",
        "overlong \xe0\x80\xaf",
        "surrogate \xed\xa0\x80",
        "above U+10FFFF \xf4\x90\x80\x80",
        "cut \xe2\x82",
        "byte \xff",
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        wsync_tensor_desc_t t[2] = {tensor("fine", 0, 1), tensor(bad[k], 256, 1)};
        wsync_manifest_t v = manifest(t, 2);
        char *text = (char *)"unchanged";
        wsync_error_t err;
        memset(&err, 0, sizeof(err));
        assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.message, "tensors[1]: name is not valid UTF-8"));
        assert_null(text);
        /* jansson agrees that it is no string */
        assert_null(json_string(bad[k]));
    }
}

static void test_many_tensors(void **state)
{
    (void)state;
    enum { N = 5000 };
    wsync_tensor_desc_t *t = calloc(N, sizeof(*t));
    char(*names)[64] = calloc(N, sizeof(*names));
    assert_non_null(t);
    assert_non_null(names);
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "model.layers.%zu.mlp.experts.%zu.up_proj.weight",
                 i / 128, i % 128);
        t[i] = tensor(names[i], 256 * i, 1);
    }
    wsync_manifest_t v = manifest(t, N);
    char *text = NULL;
    assert_int_equal(wsync_manifest_emit(&v, &text, NULL), WSYNC_OK);
    expect_jansson_identical(text);
    real_free(text);
    free(names);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bytes_as_jansson),
        cmocka_unit_test(test_names_not_utf8),
        cmocka_unit_test(test_many_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
