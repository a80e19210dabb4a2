/* Request plumbing shared by the shims (engine-shims/common/wsync_request.c): the flattened
 * bucket codec and the checks that tell a truncated bucket from an offset past the buffer. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
/* what the libraries malloc'd (before cmocka.h turns free into its own) */
static void lib_free(void *p)
{
    free(p);
}

#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "wsync_request.h"

static const char *manifest_text =
    "{\"wsync\":1,\"generation\":7,\"finished\":false,"
    "\"buffer\":{\"kind\":\"host_shm\",\"handle\":\"L3dzeW5jLXRlc3Q=\",\"bytes\":1024,"
    "\"pid\":42,\"device\":\"cpu\"},"
    "\"tensors\":[{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[4,8],\"offset\":0,"
    "\"nbytes\":64,\"digest\":\"wsync64:0123456789abcdef\"},"
    "{\"name\":\"b\",\"dtype\":\"float32\",\"shape\":[3],\"offset\":256,\"nbytes\":12}]}";

static void test_bucket_round_trip(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_t *bucket, *m, *orig, *meta;
    (void)state;

    bucket = wsync_req_bucket_encode(manifest_text, 1, &err);
    assert_non_null(bucket);
    meta = json_object_get(bucket, "metadata");
    assert_int_equal(json_array_size(meta), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(meta, 1), "start_idx")),
                     256);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(meta, 1), "end_idx")), 268);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(meta, 0), "numel")), 32);
    assert_int_equal(wsync_req_bucket_decode(bucket, NULL, 0, &m, &err), WSYNC_OK);
    orig = json_loads(manifest_text, 0, NULL);
    assert_true(json_equal(json_object_get(m, "tensors"), json_object_get(orig, "tensors")));
    assert_true(json_equal(json_object_get(m, "buffer"), json_object_get(orig, "buffer")));
    assert_int_equal(json_integer_value(json_object_get(m, "generation")), 7);
    json_decref(orig);
    json_decref(m);
    json_decref(bucket);
}

static void test_persistent_buffer(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_t *bucket = wsync_req_bucket_encode(manifest_text, 0, &err), *m = NULL, *buf;
    (void)state;

    assert_null(json_object_get(bucket, "flattened_tensor"));
    assert_int_equal(wsync_req_bucket_decode(bucket, NULL, 0, &m, &err), WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(err.message, "flattened_tensor"));
    buf = json_pack("{s:s, s:s, s:i, s:i, s:s}", "kind", "host_shm", "handle", "eA==", "bytes",
                    4096, "pid", 1, "device", "cpu");
    assert_int_equal(wsync_req_bucket_decode(bucket, buf, 1, &m, &(wsync_error_t){0}), WSYNC_OK);
    assert_true(json_equal(json_object_get(m, "buffer"), buf));
    assert_true(json_is_true(json_object_get(m, "finished")));
    json_decref(m);
    json_decref(buf);
    json_decref(bucket);
}

static wsync_result_t add(json_t *m, int64_t numel, uint64_t start, uint64_t end,
                          wsync_error_t *err)
{
    json_t *shape = json_pack("[i, i]", 4, 8);
    wsync_result_t rc =
        wsync_req_add_tensor(m, "t", "bfloat16", shape, numel, start, end, NULL, err);
    json_decref(shape);
    return rc;
}

static void test_bucket_errors(void **state)
{
    json_t *buf = json_pack("{s:i}", "bytes", 1024);
    json_t *m = wsync_req_manifest_new(buf, 1, 0);
    wsync_error_t err = {.struct_size = sizeof(err)};
    (void)state;

    assert_int_equal(add(m, 32, 960, 1024, &err), WSYNC_OK); /* exactly at the end */
    assert_int_equal(add(m, 32, 992, 1056, &err), WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(err.message, "truncated bucket"));
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(add(m, 32, 1024, 1088, &err), WSYNC_ERR_OUT_OF_BOUNDS);
    assert_non_null(strstr(err.message, "offset past the buffer"));
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(add(m, 31, 0, 64, &err), WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(err.message, "numel 31"));
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(add(m, 32, 0, 60, &err), WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(err.message, "does not hold"));
    assert_int_equal(json_array_size(json_object_get(m, "tensors")), 1);
    json_decref(m);
    json_decref(buf);
}

static void test_pick_rank(void **state)
{
    json_t *two = json_pack("[i, i]", 10, 11), *one = json_pack("[i]", 10),
           *three = json_pack("[i, i, i]", 1, 2, 3);
    wsync_error_t err = {.struct_size = sizeof(err)};
    (void)state;

    assert_int_equal(json_integer_value(wsync_req_pick_rank(two, 1, 2, "x", &err)), 11);
    assert_int_equal(json_integer_value(wsync_req_pick_rank(one, 3, 4, "x", &err)), 10);
    assert_null(wsync_req_pick_rank(three, 0, 2, "serialized_named_tensors", &err));
    assert_non_null(strstr(err.message, "serialized_named_tensors has 3 entries"));
    json_decref(two);
    json_decref(one);
    json_decref(three);
}

/* wsync_req_loadb against json_loadb: the same object, or both refusing, for requests with
 * long strings (plain, escaped, in arrays) and texts the fast path must leave to jansson. */
static void loads_as_jansson(const char *text)
{
    json_t *a = json_loadb(text, strlen(text), 0, NULL),
           *b = wsync_req_loadb(text, strlen(text), NULL);
    if ((a == NULL) != (b == NULL) || (a != NULL && !json_equal(a, b)))
        fail_msg("wsync_req_loadb and json_loadb disagree on: %.120s", text);
    json_decref(a);
    json_decref(b);
}

static void test_request_loader(void **state)
{
    (void)state;
    char *big = malloc(4096), *text = malloc(16384);
    memset(big, 'x', 4000);
    big[4000] = '\0';
    const char *forms[] = {
        "{\"method\":\"m\",\"s\":[\"%s\",\"short\"],\"f\":true}",
        "{\"s\":\"%s\\\"quoted\\\\ \\n tab\\t\"}",
        " { \"s\" : [ \"%s\" , \"b\" ] , \"n\" : [1, {\"k\": \"v\"}] } ",
        "{\"s\":[\"%s\" \"b\"]}", /* a missing comma */
        "{\"s\":[\"%s\",]}",      /* a trailing comma */
        "{\"s\":\"%s\",\"s\":1}", /* a key given twice */
        "{\"s\":\"%s\\u0041\"}",  /* a \\u escape: jansson's */
        "{\"s\":\"%s\\q\"}",      /* a bad escape */
        "{\"s\":\"%s\"} trailing",
        "{\"s\":\"%s\"",          /* unterminated */
        "[\"%s\"]",               /* not an object */
        "{\"s\":\"%s\xc3\xa9\"}", /* non-ASCII: jansson checks UTF-8 */
        "{\"s\":\"%s\xff\"}",
    };
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        snprintf(text, 16384, forms[i], big);
        loads_as_jansson(text);
    }
    /* escapes at every alignment of the eight-byte scan, and arrays of more long strings than
     * the scan remembers the ends of */
    static const char unit[] = "{\\\"name\\\":\\\"a.b\\\\c\\/d\\n\\\",\\\"n\\\":7}";
    for (size_t shift = 0; shift < 16; shift++) {
        size_t k = 0;
        for (; k < shift; k++)
            big[k] = 'y';
        while (k + sizeof(unit) < 4000) {
            memcpy(big + k, unit, sizeof(unit) - 1);
            k += sizeof(unit) - 1;
        }
        big[k] = '\0';
        snprintf(text, 16384, "{\"s\":\"%s\",\"t\":[\"%s\"]}", big, big);
        loads_as_jansson(text);
    }
    size_t k = (size_t)snprintf(text, 16384, "{\"s\":[");
    for (int i = 0; i < 11; i++)
        k += (size_t)snprintf(text + k, 16384 - k, "%s\"%.*s%d\"", i ? "," : "", 1200, big, i);
    snprintf(text + k, 16384 - k, "]}");
    loads_as_jansson(text);
    memset(big, 'x', 4000);
    big[4000] = '\0';
    /* the fast path really took the first form: the long string is there, whole */
    snprintf(text, 16384, forms[0], big);
    json_t *r = wsync_req_loadb(text, strlen(text), NULL);
    assert_non_null(r);
    assert_int_equal(json_string_length(json_array_get(json_object_get(r, "s"), 0)), 4000);
    json_decref(r);
    free(big);
    free(text);
}

/* wsync_req_dumps against json_dumps: the same text, byte for byte, for messages with long
 * strings (plain, with quotes and backslashes, non-ASCII, control characters) at every depth
 * the fast path takes, and for documents it leaves to jansson. */
static void dumps_as_jansson(json_t *v)
{
    char *a = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY), *b = wsync_req_dumps(v);
    if (a == NULL || b == NULL || strcmp(a, b) != 0)
        fail_msg("wsync_req_dumps and json_dumps disagree: %.120s | %.120s", a ? a : "(null)",
                 b ? b : "(null)");
    lib_free(a);
    lib_free(b);
    json_decref(v);
}

static void test_request_dumper(void **state)
{
    (void)state;
    char *big = malloc(8192);
    const char *tails[] = {"", "\"quoted\" \\ back", "\xc3\xa9 non-ASCII", "ctl \n\t\x01",
                           "del \x7f"};
    for (size_t t = 0; t < sizeof(tails) / sizeof(tails[0]); t++) {
        memset(big, 'x', 4000);
        big[0] = '"';
        big[1] = '\\';
        snprintf(big + 4000, 4000, "%s", tails[t]);
        dumps_as_jansson(json_string(big));
        dumps_as_jansson(json_pack("{s:s, s:[s, s], s:b, s:s?}", "method", "update", "list", big,
                                   "short", "flush", 1, "version", NULL));
        dumps_as_jansson(json_pack("[{s:[s], s:{s:i}}, {}, []]", "a", big, "b", "c", 7));
        dumps_as_jansson(json_pack("[[[[[s]]]]]", big)); /* deeper than the fast path goes */
    }
    dumps_as_jansson(json_pack("{s:s, s:i}", "short", "no long string", "n", 3));
    dumps_as_jansson(json_object());
    assert_null(wsync_req_dumps(NULL));
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_round_trip), cmocka_unit_test(test_persistent_buffer),
        cmocka_unit_test(test_bucket_errors),     cmocka_unit_test(test_pick_rank),
        cmocka_unit_test(test_request_loader),    cmocka_unit_test(test_request_dumper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
