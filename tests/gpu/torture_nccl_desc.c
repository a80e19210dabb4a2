/* The manifest's buffer.nccl object (plugin/cuda/nccl/wsync_nccl_desc.h), without a device: emit
 * and parse round-trip, the manifest parser ignores the object (no schema change), absence is not
 * an error, and every malformed field is refused with a message naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_manifest.h"
#include "wsync_nccl_desc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* Texts come from jansson's allocator: free them with the real free(). */
#undef malloc
#undef calloc
#undef realloc
#undef free

static char *plain_manifest(void)
{
    wsync_tensor_desc_t t = {.struct_size = sizeof(t),
                             .name = "model.norm.weight",
                             .dtype = WSYNC_DTYPE_F32,
                             .ndim = 1,
                             .shape = {1000},
                             .offset = 512,
                             .nbytes = 4000};
    wsync_manifest_t m = {.struct_size = sizeof(m),
                          .schema = WSYNC_MANIFEST_SCHEMA,
                          .generation = 7,
                          .n_tensors = 1,
                          .tensors = &t};
    m.buffer = (wsync_buffer_desc_t){.struct_size = sizeof(m.buffer),
                                     .kind = WSYNC_BUFFER_CUDA_IPC,
                                     .handle_len = 64,
                                     .bytes = 1 << 20,
                                     .pid = 4711};
    strcpy(m.buffer.device, "GPU-00000000-0000-0000-0000-000000000001");
    char *out = NULL;
    assert_int_equal(wsync_manifest_emit(&m, &out, NULL), WSYNC_OK);
    wsync_manifest_owned_t *back = NULL;
    assert_int_equal(wsync_manifest_parse(out, strlen(out), &back, NULL), WSYNC_OK);
    assert_int_equal(wsync_nccl_bucket_count(&back->view), 4512);
    wsync_manifest_free(back);
    return out;
}

static wsync_nccl_desc_t sample_desc(void)
{
    wsync_nccl_desc_t d = {.nranks = 5, .root = 0, .count = 4512};
    for (int i = 0; i < WSYNC_NCCL_UNIQUE_ID_BYTES; i++)
        d.uid.internal[i] = (char)(i * 37 + 1);
    return d;
}

static void test_round_trip(void **state)
{
    (void)state;
    char *plain = plain_manifest();
    wsync_nccl_desc_t d = sample_desc(), back;
    char *with = NULL;
    assert_int_equal(wsync_nccl_desc_emit(plain, strlen(plain), &d, &with, NULL), WSYNC_OK);
    int present = 0;
    assert_int_equal(wsync_nccl_desc_parse(with, strlen(with), &back, &present, NULL), WSYNC_OK);
    assert_int_equal(present, 1);
    assert_memory_equal(back.uid.internal, d.uid.internal, WSYNC_NCCL_UNIQUE_ID_BYTES);
    assert_int_equal(back.nranks, 5);
    assert_int_equal(back.root, 0);
    assert_int_equal(back.count, 4512);
    assert_int_equal(wsync_nccl_engine_rank(3), 4);
    /* the manifest parser ignores the object: same view as without it */
    wsync_manifest_owned_t *m = NULL;
    assert_int_equal(wsync_manifest_parse(with, strlen(with), &m, NULL), WSYNC_OK);
    assert_int_equal(m->view.generation, 7);
    assert_int_equal(m->view.n_tensors, 1);
    wsync_manifest_free(m);
    free(with);
    free(plain);
}

static void test_absent(void **state)
{
    (void)state;
    char *plain = plain_manifest();
    wsync_nccl_desc_t d;
    int present = 1;
    assert_int_equal(wsync_nccl_desc_parse(plain, strlen(plain), &d, &present, NULL), WSYNC_OK);
    assert_int_equal(present, 0);
    free(plain);
}

/* Replace buffer.nccl.<key> with `value` (JSON) in a valid text and expect `code`. */
static void expect_refused(const char *key, const char *value, wsync_result_t code,
                           const char *needle)
{
    char *plain = plain_manifest();
    wsync_nccl_desc_t d = sample_desc();
    char *with = NULL;
    assert_int_equal(wsync_nccl_desc_emit(plain, strlen(plain), &d, &with, NULL), WSYNC_OK);
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    char *at = strstr(with, pat);
    assert_non_null(at);
    char *end = at + strlen(pat);
    if (*end == '"')
        end = strchr(end + 1, '"') + 1;
    else
        while (*end != ',' && *end != '}')
            end++;
    size_t n = strlen(with) + strlen(value) + 1;
    char *bad = calloc(1, n);
    assert_non_null(bad);
    snprintf(bad, n, "%.*s%s%s", (int)(at - with + strlen(pat)), with, value, end);
    wsync_error_t err = {.struct_size = sizeof(err)};
    int present = 0;
    assert_int_equal(wsync_nccl_desc_parse(bad, strlen(bad), &d, &present, &err), code);
    assert_int_equal(present, 0);
    assert_non_null(strstr(err.message, needle));
    free(bad);
    free(with);
    free(plain);
}

static void test_refused(void **state)
{
    (void)state;
    expect_refused("uid", "\"AAAA\"", WSYNC_ERR_BAD_MANIFEST, "nccl.uid");
    expect_refused("uid", "\"not base64!\"", WSYNC_ERR_BAD_MANIFEST, "nccl.uid");
    expect_refused("uid", "7", WSYNC_ERR_BAD_MANIFEST, "nccl.uid");
    expect_refused("nranks", "0", WSYNC_ERR_BAD_MANIFEST, "nranks 0");
    expect_refused("nranks", "-1", WSYNC_ERR_BAD_MANIFEST, "nccl.nranks");
    expect_refused("root", "2", WSYNC_ERR_BAD_MANIFEST, "root 2");
    expect_refused("count", "1048577", WSYNC_ERR_OUT_OF_BOUNDS, "count 1048577");
    expect_refused("count", "\"12\"", WSYNC_ERR_BAD_MANIFEST, "nccl.count");
}

static void test_emit_refuses(void **state)
{
    (void)state;
    wsync_nccl_desc_t d = sample_desc();
    char *out = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_nccl_desc_emit("{\"wsync\":1}", 11, &d, &out, &err),
                     WSYNC_ERR_BAD_MANIFEST);
    assert_null(out);
    char *plain = plain_manifest();
    d.root = 1;
    assert_int_equal(wsync_nccl_desc_emit(plain, strlen(plain), &d, &out, NULL),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_null(out);
    free(plain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_absent),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_emit_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
