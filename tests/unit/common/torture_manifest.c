/* Manifest parse: every malformed case gets its own code and message; emit round-trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Library results are malloc'd; cmocka replaces free() with its checker below this point. */
static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#include "wsync_base64.h"
#include "wsync_digest.h"
#include "wsync_error.h"
#include "wsync_manifest.h"

/* 64 bytes 0..63 in base64, and a 16-byte handle. */
#define H64                                                                                        \
    "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw=="
#define H16 "AAECAwQFBgcICQoLDA0ODw=="
/* 128 and 132 zero bytes. */
#define A128                                                                                       \
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" \
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
#define A132                                                                                       \
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" \
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

#define BUF_OK                                                                                     \
    "{\"kind\":\"cuda_ipc\",\"handle\":\"" H64 "\",\"bytes\":4096,\"pid\":4711,"                   \
    "\"device\":\"GPU-0123\"}"
#define T0 "{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[4,8],\"offset\":0,\"nbytes\":64}"
#define T1 "{\"name\":\"b\",\"dtype\":\"float32\",\"shape\":[16],\"offset\":256,\"nbytes\":64}"

/* A manifest with the given buffer and tensors JSON. */
static char *doc(const char *buffer, const char *tensors)
{
    static char text[1 << 16];
    snprintf(text, sizeof(text), "{\"wsync\":1,\"generation\":3,\"buffer\":%s,\"tensors\":[%s]}",
             buffer, tensors);
    return text;
}

static wsync_result_t parse_str(const char *json, wsync_manifest_owned_t **m, wsync_error_t *err)
{
    memset(err, 0, sizeof(*err));
    err->struct_size = sizeof(*err);
    return wsync_manifest_parse(json, strlen(json), m, err);
}

/* Parse `json`, expect `code` and `needle` in the message, and nothing handed out. */
static void expect_fail_at(const char *json, wsync_result_t code, const char *needle, int line)
{
    wsync_error_t err;
    wsync_manifest_owned_t *m = (wsync_manifest_owned_t *)(uintptr_t)1;
    wsync_result_t r = parse_str(json, &m, &err);
    if (r != code || strstr(err.message, needle) == NULL)
        print_error("line %d: got %d \"%s\", want %d with \"%s\"\n  json: %.300s\n", line, r,
                    err.message, code, needle, json);
    assert_int_equal(r, code);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.message, needle));
    assert_string_equal(err.where[0] ? "set" : "empty", "set");
    assert_null(m);
}
#define expect_fail(json, code, needle) expect_fail_at((json), (code), (needle), __LINE__)
#define BAD WSYNC_ERR_BAD_MANIFEST
#define OOB WSYNC_ERR_OUT_OF_BOUNDS

static wsync_manifest_owned_t *expect_ok(const char *json)
{
    wsync_error_t err;
    wsync_manifest_owned_t *m = NULL;
    wsync_result_t r = parse_str(json, &m, &err);
    if (r != WSYNC_OK)
        print_error("unexpected failure %d: %s\n", r, err.message);
    assert_int_equal(r, WSYNC_OK);
    assert_non_null(m);
    return m;
}

static void test_valid(void **state)
{
    (void)state;
    const char *json =
        "{\"wsync\":1,\"generation\":42,\"finished\":true,\"buffer\":{\"kind\":\"cuda_ipc\","
        "\"handle\":\"" H64 "\",\"bytes\":4096,\"pid\":4711,\"device\":\"GPU-abc\",\"ready\":\"" H64
        "\",\"consumed\":\"" H64 "\",\"offset\":512,\"control\":\"/wsync-ctl-1\"},\"tensors\":[" T0
        ",{\"name\":\"b\",\"dtype\":\"torch.float32\",\"shape\":[16],\"offset\":256,"
        "\"nbytes\":64,\"digest\":\"wsync64:0123456789abcdef\"},"
        "{\"name\":\"s\",\"dtype\":\"F64\",\"shape\":[],\"offset\":4088,\"nbytes\":8},"
        "{\"name\":\"e\",\"dtype\":\"int8\",\"shape\":[0,5],\"offset\":4096,\"nbytes\":0}]}";
    wsync_manifest_owned_t *m = expect_ok(json);
    const wsync_manifest_t *v = &m->view;
    assert_ptr_equal(wsync_manifest_owned_from_view(v), m);
    assert_int_equal(v->struct_size, sizeof(*v));
    assert_int_equal(v->schema, 1);
    assert_int_equal(v->generation, 42);
    assert_int_equal(v->finished, 1);
    assert_int_equal(v->buffer.kind, WSYNC_BUFFER_CUDA_IPC);
    assert_int_equal(v->buffer.handle_len, 64);
    for (int i = 0; i < 64; i++)
        assert_int_equal(v->buffer.handle[i], i);
    assert_int_equal(v->buffer.bytes, 4096);
    assert_int_equal(v->buffer.base_offset, 512);
    assert_int_equal(v->buffer.pid, 4711);
    assert_string_equal(v->buffer.device, "GPU-abc");
    assert_true(v->buffer.has_ready);
    assert_int_equal(v->buffer.ready_len, 64);
    assert_true(v->buffer.has_consumed);
    assert_string_equal(v->buffer.control, "/wsync-ctl-1");
    assert_int_equal(v->n_tensors, 4);
    assert_string_equal(v->tensors[0].name, "a");
    assert_int_equal(v->tensors[0].dtype, WSYNC_DTYPE_BF16);
    assert_int_equal(v->tensors[0].ndim, 2);
    assert_int_equal(v->tensors[0].shape[0], 4);
    assert_int_equal(v->tensors[0].shape[1], 8);
    assert_int_equal(v->tensors[0].nbytes, 64);
    assert_false(v->tensors[0].has_digest);
    assert_int_equal(v->tensors[1].dtype, WSYNC_DTYPE_F32);
    assert_true(v->tensors[1].has_digest);
    assert_int_equal(v->tensors[1].digest, 0x0123456789abcdefull);
    assert_int_equal(v->tensors[1].offset, 256);
    assert_int_equal(v->tensors[2].ndim, 0);
    assert_int_equal(v->tensors[2].nbytes, 8);
    assert_int_equal(v->tensors[3].nbytes, 0);
    assert_int_equal(v->tensors[3].offset, 4096);
    wsync_manifest_free(m);
}

static void test_defaults_and_unknown_fields(void **state)
{
    (void)state;
    const char *json = "{\"wsync\":1,\"generation\":1,\"future\":{\"x\":[1,2]},\"buffer\":{"
                       "\"kind\":\"host_shm\",\"handle\":\"" H16 "\",\"bytes\":1,\"pid\":0,"
                       "\"device\":\"cpu\",\"colour\":\"blue\"},\"tensors\":[{\"name\":\"x\","
                       "\"dtype\":\"uint8\",\"shape\":[1],\"offset\":0,\"nbytes\":1,\"extra\":null}"
                       "]}";
    wsync_manifest_owned_t *m = expect_ok(json);
    assert_int_equal(m->view.finished, 0);
    assert_int_equal(m->view.buffer.kind, WSYNC_BUFFER_HOST_SHM);
    assert_int_equal(m->view.buffer.handle_len, 16);
    assert_int_equal(m->view.buffer.base_offset, 0);
    assert_false(m->view.buffer.has_ready);
    assert_false(m->view.buffer.has_consumed);
    assert_string_equal(m->view.buffer.control, "");
    wsync_manifest_free(m);

    m = expect_ok(doc(BUF_OK, ""));
    assert_int_equal(m->view.n_tensors, 0);
    wsync_manifest_free(m);
}

static void test_not_json(void **state)
{
    (void)state;
    expect_fail("", BAD, "not valid JSON");
    expect_fail("{\"wsync\":1,\"generation\":", BAD, "not valid JSON");
    char *truncated = strdup(doc(BUF_OK, T0));
    truncated[strlen(truncated) - 5] = '\0';
    expect_fail(truncated, BAD, "not valid JSON");
    real_free(truncated);
    expect_fail("{\"wsync\":1,\"wsync\":1}", BAD, "duplicate");
    expect_fail("[1,2]", BAD, "root must be a JSON object, got array");
    expect_fail("\"text\"", BAD, "not valid JSON");
    expect_fail("{\"wsync\":1} trailing", BAD, "not valid JSON");

    wsync_error_t err;
    wsync_manifest_owned_t *m;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_manifest_parse(NULL, 3, &m, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(wsync_manifest_parse("{}", 2, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT);
}

static void test_top_level_fields(void **state)
{
    (void)state;
    char j[1024];
#define TOP(fmt) (snprintf(j, sizeof(j), fmt, BUF_OK, T0), j)
    expect_fail(TOP("{\"generation\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD, "wsync: missing");
    expect_fail(TOP("{\"wsync\":3,\"generation\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "unsupported schema version 3");
    /* schema 2 is a plan replay: it names its plan and carries no tensors */
    expect_fail(TOP("{\"wsync\":2,\"generation\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "replay: missing");
    expect_fail(TOP("{\"wsync\":2,\"generation\":1,\"buffer\":%s,\"replay\":\"p-1\","
                    "\"tensors\":[%s]}"),
                BAD, "a replay names no tensors");
    expect_fail(TOP("{\"wsync\":1,\"generation\":1,\"buffer\":%s,\"replay\":\"p-1\","
                    "\"tensors\":[%s]}"),
                BAD, "replay: not a member of a schema 1 manifest");
    expect_fail(TOP("{\"wsync\":0,\"generation\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "unsupported schema version 0");
    expect_fail(TOP("{\"wsync\":\"1\",\"generation\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "wsync: must be an integer, got string");
    expect_fail(TOP("{\"wsync\":1.0,\"generation\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "wsync: 1 must be a JSON integer");
    expect_fail(TOP("{\"wsync\":1,\"buffer\":%s,\"tensors\":[%s]}"), BAD, "generation: missing");
    expect_fail(TOP("{\"wsync\":1,\"generation\":0,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "generation: must be >= 1, got 0");
    expect_fail(TOP("{\"wsync\":1,\"generation\":-7,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "generation: -7 is negative");
    expect_fail(TOP("{\"wsync\":1,\"generation\":2.5,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "generation: 2.5 must be a JSON integer");
    expect_fail(TOP("{\"wsync\":1,\"generation\":null,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "generation: must be an integer, got null");
    expect_fail(TOP("{\"wsync\":1,\"generation\":true,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
                "generation: must be an integer, got true");
    expect_fail(
        TOP("{\"wsync\":1,\"generation\":18446744073709551616,\"buffer\":%s,\"tensors\":[%s]}"),
        BAD, "too big integer");
    expect_fail(
        TOP("{\"wsync\":1,\"generation\":9223372036854775808,\"buffer\":%s,\"tensors\":[%s]}"), BAD,
        "too big integer");
    expect_fail(TOP("{\"wsync\":1,\"generation\":1,\"finished\":1,\"buffer\":%s,\"tensors\":[%s]}"),
                BAD, "finished: must be true or false, got integer");
    expect_fail(TOP("{\"wsync\":1,\"generation\":1,\"buffer\":%s,\"tensorz\":[%s]}"), BAD,
                "tensors: missing");
    expect_fail(TOP("{\"wsync\":1,\"generation\":1,\"buffer\":%s,\"tensors\":{\"a\":%s}}"), BAD,
                "tensors: must be an array, got object");
#undef TOP
    expect_fail("{\"wsync\":1,\"generation\":1,\"tensors\":[]}", BAD, "buffer: missing");
    expect_fail("{\"wsync\":1,\"generation\":1,\"buffer\":[],\"tensors\":[]}", BAD,
                "buffer: must be an object, got array");

    /* INT64_MAX itself is a valid generation. */
    wsync_manifest_owned_t *m = expect_ok(
        "{\"wsync\":1,\"generation\":9223372036854775807,\"buffer\":" BUF_OK ",\"tensors\":[]}");
    assert_int_equal(m->view.generation, (uint64_t)INT64_MAX);
    wsync_manifest_free(m);
}

static void test_buffer_fields(void **state)
{
    (void)state;
#define B(fields) doc("{" fields "}", T0)
#define HANDLE "\"handle\":\"" H64 "\""
#define REST "\"bytes\":4096,\"pid\":1,\"device\":\"GPU-1\""
    expect_fail(B(HANDLE "," REST), BAD, "buffer.kind: missing");
    expect_fail(B("\"kind\":7," HANDLE "," REST), BAD,
                "buffer.kind: must be a string, got integer");
    expect_fail(B("\"kind\":\"nvlink\"," HANDLE "," REST), BAD,
                "buffer.kind: unknown kind \"nvlink\"");
    expect_fail(B("\"kind\":\"\"," HANDLE "," REST), BAD, "buffer.kind: unknown kind \"\"");
    expect_fail(B("\"kind\":\"cuda_ipc\"," REST), BAD, "buffer.handle: missing");
    expect_fail(B("\"kind\":\"cuda_ipc\",\"handle\":\"" H16 "\"," REST), BAD,
                "a cuda_ipc handle is 64 bytes, got 16");
    expect_fail(B("\"kind\":\"cuda_ipc\",\"handle\":\"!!!!\"," REST), BAD,
                "buffer.handle: \"!!!!\" is not valid base64");
    expect_fail(B("\"kind\":\"cuda_ipc\",\"handle\":\"AAE\"," REST), BAD, "is not valid base64");
    expect_fail(B("\"kind\":\"host_shm\",\"handle\":\"\"," REST), BAD, "buffer.handle: is empty");
    expect_fail(B("\"kind\":\"host_shm\",\"handle\":[1]," REST), BAD,
                "buffer.handle: must be a string, got array");
    expect_fail(B("\"kind\":\"host_shm\",\"handle\":\"" A132 "\"," REST), BAD,
                "buffer.handle: decodes to more than 128 bytes");
    /* 128 bytes exactly is the limit. */
    wsync_manifest_owned_t *m = expect_ok(B("\"kind\":\"host_shm\",\"handle\":\"" A128 "\"," REST));
    assert_int_equal(m->view.buffer.handle_len, 128);
    wsync_manifest_free(m);
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"pid\":1,\"device\":\"d\""), BAD,
                "buffer.bytes: missing");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":0,\"pid\":1,\"device\":\"d\""), BAD,
                "buffer.bytes: must be > 0, got 0");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":-1,\"pid\":1,\"device\":\"d\""), BAD,
                "buffer.bytes: -1 is negative");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":\"4096\",\"pid\":1,\"device\":\"d\""),
                BAD, "buffer.bytes: must be an integer, got string");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096e0,\"pid\":1,\"device\":\"d\""),
                BAD, "buffer.bytes: 4096 must be a JSON integer");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"device\":\"d\""), BAD,
                "buffer.pid: missing");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"pid\":-5,\"device\":\"d\""),
                BAD, "buffer.pid: -5 is negative");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"pid\":1"), BAD,
                "buffer.device: missing");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"pid\":1,\"device\":\"\""), BAD,
                "buffer.device: is empty");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"pid\":1,\"device\":0"), BAD,
                "buffer.device: must be a string, got integer");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"pid\":1,\"device\":"
                  "\"GPU-0123456789012345678901234567890123456789012345678901234567890\""),
                BAD, "buffer.device: \"GPU-");
    expect_fail(
        B("\"kind\":\"cuda_ipc\"," HANDLE ",\"bytes\":4096,\"pid\":1,\"device\":\"a\\u0000b\""),
        BAD, "\\u0000 is not allowed");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE "," REST ",\"ready\":\"" H16 "\""), BAD,
                "buffer.ready: a cuda_ipc event handle is 64 bytes, got 16");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE "," REST ",\"consumed\":\"" H16 "\""), BAD,
                "buffer.consumed: a cuda_ipc event handle is 64 bytes, got 16");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE "," REST ",\"ready\":\"@@@@\""), BAD,
                "buffer.ready: \"@@@@\" is not valid base64");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE "," REST ",\"consumed\":false"), BAD,
                "buffer.consumed: must be a string, got false");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE "," REST ",\"offset\":-256"), BAD,
                "buffer.offset: -256 is negative");
    expect_fail(B("\"kind\":\"cuda_ipc\"," HANDLE "," REST ",\"offset\":\"0\""), BAD,
                "buffer.offset: must be an integer, got string");
#undef B
#undef HANDLE
#undef REST
}

static void test_buffer_offset_overflow(void **state)
{
    (void)state;
    /* base_offset + bytes past 2^64 cannot happen with both <= INT64_MAX; it is refused anyway by
     * the JSON range. Two values at INT64_MAX sum to 2^64 - 2: accepted as a range. */
    wsync_manifest_owned_t *m = expect_ok(doc("{\"kind\":\"host_shm\",\"handle\":\"" H16
                                              "\",\"bytes\":9223372036854775807,\"pid\":1,"
                                              "\"device\":\"cpu\",\"offset\":9223372036854775807}",
                                              ""));
    assert_int_equal(m->view.buffer.base_offset, (uint64_t)INT64_MAX);
    wsync_manifest_free(m);
    expect_fail(doc("{\"kind\":\"host_shm\",\"handle\":\"" H16 "\",\"bytes\":1,\"pid\":1,"
                    "\"device\":\"cpu\",\"control\":7}",
                    ""),
                BAD, "buffer.control: must be a string, got integer");
    char ctl[300];
    memset(ctl, 'c', sizeof(ctl));
    ctl[sizeof(ctl) - 1] = '\0';
    char buf[1024];
    snprintf(buf, sizeof(buf),
             "{\"kind\":\"host_shm\",\"handle\":\"" H16 "\",\"bytes\":1,\"pid\":1,"
             "\"device\":\"cpu\",\"control\":\"%s\"}",
             ctl);
    expect_fail(doc(buf, ""), BAD, "buffer.control: \"cccc");
}

static void test_tensor_fields(void **state)
{
    (void)state;
#define T(x) doc(BUF_OK, x)
    expect_fail(T("7"), BAD, "tensors[0]: must be an object, got integer");
    expect_fail(T(T0 ",[]"), BAD, "tensors[1]: must be an object, got array");
    expect_fail(T("{\"dtype\":\"bfloat16\",\"shape\":[1],\"offset\":0,\"nbytes\":2}"), BAD,
                "tensors[0].name: missing");
    expect_fail(T("{\"name\":\"\",\"dtype\":\"bfloat16\",\"shape\":[1],\"offset\":0,\"nbytes\":2}"),
                BAD, "tensors[0].name: is empty");
    expect_fail(T("{\"name\":5,\"dtype\":\"bfloat16\",\"shape\":[1],\"offset\":0,\"nbytes\":2}"),
                BAD, "tensors[0].name: must be a string, got integer");
    expect_fail(T("{\"name\":\"a\\u0000b\",\"dtype\":\"bfloat16\",\"shape\":[1],\"offset\":0,"
                  "\"nbytes\":2}"),
                BAD, "\\u0000 is not allowed");
    expect_fail(T(T0 "," T0), BAD, "tensors[1].name: \"a\" duplicates tensors[0]");
    expect_fail(T(T0 "," T1 ",{\"name\":\"b\",\"dtype\":\"uint8\",\"shape\":[1],\"offset\":0,"
                     "\"nbytes\":1}"),
                BAD, "tensors[2].name: \"b\" duplicates tensors[1]");
    expect_fail(T("{\"name\":\"a\",\"shape\":[1],\"offset\":0,\"nbytes\":2}"), BAD,
                "tensors[0].dtype: missing");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"complex64\",\"shape\":[1],\"offset\":0,"
                  "\"nbytes\":2}"),
                BAD, "tensors[0] (\"a\").dtype: unknown dtype \"complex64\"");
    expect_fail(T("{\"name\":\"a\",\"dtype\":1,\"shape\":[1],\"offset\":0,\"nbytes\":2}"), BAD,
                "tensors[0].dtype: must be a string, got integer");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"offset\":0,\"nbytes\":2}"), BAD,
                "tensors[0] (\"a\").shape: missing");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":4,\"offset\":0,\"nbytes\":2}"),
                BAD, "tensors[0] (\"a\").shape: must be an array, got integer");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"offset\":0,\"nbytes\":1}"),
                BAD, "tensors[0] (\"a\").shape: 9 dimensions, the limit is 8");
    expect_fail(T(T0 "," T1 ",{\"name\":\"c\",\"dtype\":\"bfloat16\",\"shape\":[2,-4],"
                     "\"offset\":0,\"nbytes\":2}"),
                BAD, "tensors[2].shape[1]: -4 is negative");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2,\"4\"],\"offset\":0,"
                  "\"nbytes\":16}"),
                BAD, "tensors[0].shape[1]: must be an integer, got string");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2.0],\"offset\":0,"
                  "\"nbytes\":4}"),
                BAD, "tensors[0].shape[0]: 2 must be a JSON integer");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"nbytes\":4}"), BAD,
                "tensors[0].offset: missing");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":-8,"
                  "\"nbytes\":4}"),
                BAD, "tensors[0].offset: -8 is negative");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":0.5,"
                  "\"nbytes\":4}"),
                BAD, "tensors[0].offset: 0.5 must be a JSON integer");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":0}"), BAD,
                "tensors[0].nbytes: missing");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":0,"
                  "\"nbytes\":-4}"),
                BAD, "tensors[0].nbytes: -4 is negative");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[4,8],\"offset\":0,"
                  "\"nbytes\":32}"),
                BAD, "nbytes 32 != bfloat16 (2 bytes) x shape = 64");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"float32\",\"shape\":[4611686018427387904,4],"
                  "\"offset\":0,\"nbytes\":0}"),
                BAD, "tensors[0] (\"a\"): float32 x shape overflows 64 bits");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":0,"
                  "\"nbytes\":4,\"digest\":\"sha256:00\"}"),
                BAD, "tensors[0] (\"a\").digest: \"sha256:00\" is not");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":0,"
                  "\"nbytes\":4,\"digest\":\"wsync64:0123456789ABCDEF\"}"),
                BAD, "digest: \"wsync64:0123456789ABCDEF\" is not");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[2],\"offset\":0,"
                  "\"nbytes\":4,\"digest\":12}"),
                BAD, "tensors[0].digest: must be a string, got integer");
#undef T
}

static void test_name_length_limit(void **state)
{
    (void)state;
    char name[WSYNC_MANIFEST_MAX_NAME + 2];
    char t[WSYNC_MANIFEST_MAX_NAME + 200];
    memset(name, 'n', sizeof(name));
    name[WSYNC_MANIFEST_MAX_NAME] = '\0';
    snprintf(t, sizeof(t),
             "{\"name\":\"%s\",\"dtype\":\"uint8\",\"shape\":[1],\"offset\":0,\"nbytes\":1}", name);
    wsync_manifest_owned_t *m = expect_ok(doc(BUF_OK, t));
    assert_int_equal(strlen(m->view.tensors[0].name), WSYNC_MANIFEST_MAX_NAME);
    wsync_manifest_free(m);
    name[WSYNC_MANIFEST_MAX_NAME] = 'n';
    name[WSYNC_MANIFEST_MAX_NAME + 1] = '\0';
    snprintf(t, sizeof(t),
             "{\"name\":\"%s\",\"dtype\":\"uint8\",\"shape\":[1],\"offset\":0,\"nbytes\":1}", name);
    expect_fail(doc(BUF_OK, t), BAD, "is 1025 bytes, the limit is 1024");
}

static void test_extents(void **state)
{
    (void)state;
#define T(x) doc(BUF_OK, x)
    expect_fail(T(T0 ",{\"name\":\"model.norm.weight\",\"dtype\":\"float32\",\"shape\":[2048],"
                     "\"offset\":96,\"nbytes\":8192}"),
                OOB,
                "tensors[1] (\"model.norm.weight\"): offset 96 + nbytes 8192 exceeds buffer "
                "bytes 4096");
    /* Ends exactly at the end: fine. One byte more: refused. */
    wsync_manifest_owned_t *m = expect_ok(
        T("{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[96],\"offset\":4000,\"nbytes\":96}"));
    wsync_manifest_free(m);
    expect_fail(
        T("{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[97],\"offset\":4000,\"nbytes\":97}"), OOB,
        "offset 4000 + nbytes 97 exceeds buffer bytes 4096");
    /* A zero-byte tensor past the end is still out of bounds. */
    expect_fail(
        T("{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[0],\"offset\":4097,\"nbytes\":0}"), OOB,
        "offset 4097 + nbytes 0 exceeds");
    /* offset + nbytes near 2^64 (both at INT64_MAX) must not wrap into range. */
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[9223372036854775807],"
                  "\"offset\":9223372036854775807,\"nbytes\":9223372036854775807}"),
                OOB, "offset 9223372036854775807 + nbytes 9223372036854775807 exceeds");
    expect_fail(T("{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[1],"
                  "\"offset\":18446744073709551615,\"nbytes\":1}"),
                BAD, "too big integer");
#undef T
}

static void test_too_many_tensors(void **state)
{
    (void)state;
    /* Build an array just over the limit out of tiny elements; refused before any is walked. */
    size_t n = WSYNC_MANIFEST_MAX_TENSORS + 1;
    size_t cap = n * 2 + 4096;
    char *json = malloc(cap);
    assert_non_null(json);
    size_t len = (size_t)snprintf(
        json, cap, "{\"wsync\":1,\"generation\":1,\"buffer\":" BUF_OK ",\"tensors\":[");
    for (size_t i = 0; i < n; i++) {
        json[len++] = '0';
        json[len++] = ',';
    }
    json[len - 1] = ']';
    json[len++] = '}';
    json[len] = '\0';
    expect_fail(json, BAD, "tensors: 1048577 entries, the limit is 1048576");
    free(json);
}

/* 5000 tensors: parses, names are unique and packed in one block. */
static char *big_manifest(size_t n, int dup_last)
{
    size_t cap = n * 160 + 1024;
    char *json = malloc(cap);
    assert_non_null(json);
    size_t len =
        (size_t)snprintf(json, cap,
                         "{\"wsync\":1,\"generation\":9,\"buffer\":{\"kind\":\"cuda_ipc\","
                         "\"handle\":\"" H64 "\",\"bytes\":%zu,\"pid\":1,\"device\":\"d\"},"
                         "\"tensors\":[",
                         n * 512);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len,
                                "%s{\"name\":\"model.layers.%zu.mlp.experts.w\",\"dtype\":"
                                "\"bfloat16\",\"shape\":[16,16],\"offset\":%zu,\"nbytes\":512}",
                                i ? "," : "", dup_last && i == n - 1 ? 17 : i, i * 512);
    snprintf(json + len, cap - len, "]}");
    return json;
}

static void test_many_tensors(void **state)
{
    (void)state;
    char *json = big_manifest(5000, 0);
    wsync_manifest_owned_t *m = expect_ok(json);
    assert_int_equal(m->view.n_tensors, 5000);
    char expect[64];
    for (size_t i = 0; i < 5000; i += 499) {
        snprintf(expect, sizeof(expect), "model.layers.%zu.mlp.experts.w", i);
        assert_string_equal(m->view.tensors[i].name, expect);
        assert_int_equal(m->view.tensors[i].offset, i * 512);
        /* Names live in the manifest's one block, not in the freed JSON tree. */
        assert_true(m->view.tensors[i].name >= m->names);
    }
    wsync_manifest_free(m);
    free(json);

    json = big_manifest(5000, 1);
    expect_fail(json, BAD,
                "tensors[4999].name: \"model.layers.17.mlp.experts.w\" duplicates "
                "tensors[17]");
    free(json);
}

static void test_first_error_wins(void **state)
{
    (void)state;
    wsync_error_t err;
    wsync_manifest_owned_t *m;
    memset(&err, 0, sizeof(err));
    err.code = WSYNC_ERR_TIMEOUT;
    strcpy(err.message, "earlier");
    const char *bad = "[]";
    assert_int_equal(wsync_manifest_parse(bad, strlen(bad), &m, &err), BAD);
    assert_int_equal(err.code, WSYNC_ERR_TIMEOUT);
    assert_string_equal(err.message, "earlier");
    /* NULL err is allowed. */
    assert_int_equal(wsync_manifest_parse(bad, strlen(bad), &m, NULL), BAD);
    assert_null(m);
}

static void assert_manifests_equal(const wsync_manifest_t *a, const wsync_manifest_t *b)
{
    assert_int_equal(a->schema, b->schema);
    assert_int_equal(a->generation, b->generation);
    assert_int_equal(a->finished, b->finished);
    assert_int_equal(a->buffer.kind, b->buffer.kind);
    assert_int_equal(a->buffer.handle_len, b->buffer.handle_len);
    assert_memory_equal(a->buffer.handle, b->buffer.handle, a->buffer.handle_len);
    assert_int_equal(a->buffer.bytes, b->buffer.bytes);
    assert_int_equal(a->buffer.base_offset, b->buffer.base_offset);
    assert_int_equal(a->buffer.pid, b->buffer.pid);
    assert_string_equal(a->buffer.device, b->buffer.device);
    assert_int_equal(a->buffer.has_ready, b->buffer.has_ready);
    assert_int_equal(a->buffer.ready_len, b->buffer.ready_len);
    assert_memory_equal(a->buffer.ready, b->buffer.ready, a->buffer.ready_len);
    assert_int_equal(a->buffer.has_consumed, b->buffer.has_consumed);
    assert_int_equal(a->buffer.consumed_len, b->buffer.consumed_len);
    assert_memory_equal(a->buffer.consumed, b->buffer.consumed, a->buffer.consumed_len);
    assert_string_equal(a->buffer.control, b->buffer.control);
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        const wsync_tensor_desc_t *x = &a->tensors[i], *y = &b->tensors[i];
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        assert_memory_equal(x->shape, y->shape, x->ndim * sizeof(x->shape[0]));
        assert_int_equal(x->offset, y->offset);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_int_equal(x->has_digest, y->has_digest);
        if (x->has_digest)
            assert_int_equal(x->digest, y->digest);
    }
}

static wsync_manifest_owned_t *reparse(const wsync_manifest_t *v)
{
    char *text = NULL;
    wsync_error_t err = {0};
    assert_int_equal(wsync_manifest_emit(v, &text, &err), WSYNC_OK);
    assert_non_null(text);
    assert_null(strchr(text, '\n')); /* compact */
    assert_null(strstr(text, ": "));
    wsync_manifest_owned_t *m = expect_ok(text);
    real_free(text);
    return m;
}

static void test_emit_round_trip(void **state)
{
    (void)state;
    const char *json =
        "{\"wsync\":1,\"generation\":42,\"finished\":true,\"buffer\":{\"kind\":\"cuda_ipc\","
        "\"handle\":\"" H64 "\",\"bytes\":4096,\"pid\":4711,\"device\":\"GPU-abc\",\"ready\":\"" H64
        "\",\"offset\":512,\"control\":\"/ctl\"},\"tensors\":[" T0
        ",{\"name\":\"b \\\"quoted\\\" \\u00e9\",\"dtype\":\"F8_E5M2\",\"shape\":[16],\"offset\":"
        "256,\"nbytes\":16,\"digest\":\"wsync64:fedcba9876543210\"},{\"name\":\"s\",\"dtype\":"
        "\"int64\",\"shape\":[],\"offset\":512,\"nbytes\":8}]}";
    wsync_manifest_owned_t *a = expect_ok(json);
    wsync_manifest_owned_t *b = reparse(&a->view);
    assert_manifests_equal(&a->view, &b->view);
    wsync_manifest_owned_t *c = reparse(&b->view);
    assert_manifests_equal(&a->view, &c->view);
    wsync_manifest_free(a);
    wsync_manifest_free(b);
    wsync_manifest_free(c);

    char *big = big_manifest(5000, 0);
    a = expect_ok(big);
    b = reparse(&a->view);
    assert_manifests_equal(&a->view, &b->view);
    wsync_manifest_free(a);
    wsync_manifest_free(b);
    free(big);
}

static void test_emit_from_scratch_and_refusals(void **state)
{
    (void)state;
    wsync_tensor_desc_t t = {.struct_size = sizeof(t),
                             .name = "w",
                             .dtype = WSYNC_DTYPE_F16,
                             .ndim = 1,
                             .shape = {8},
                             .offset = 0,
                             .nbytes = 16,
                             .digest = 7,
                             .has_digest = 1};
    wsync_manifest_t v = {
        .struct_size = sizeof(v), .schema = 1, .generation = 5, .n_tensors = 1, .tensors = &t};
    v.buffer.struct_size = sizeof(v.buffer);
    v.buffer.kind = WSYNC_BUFFER_HOST_SHM;
    memcpy(v.buffer.handle, "/wsync-1", 8);
    v.buffer.handle_len = 8;
    v.buffer.bytes = 64;
    v.buffer.pid = 99;
    strcpy(v.buffer.device, "cpu");
    wsync_manifest_owned_t *m = reparse(&v);
    assert_manifests_equal(&v, &m->view);
    wsync_manifest_free(m);

    char *text = (char *)"unchanged";
    wsync_error_t err = {0};
    v.generation = 0;
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "generation 0"));
    assert_null(text);
    v.generation = 5;
    v.buffer.kind = WSYNC_BUFFER_INVALID;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "buffer.kind 0"));
    v.buffer.kind = WSYNC_BUFFER_HOST_SHM;
    t.offset = (uint64_t)INT64_MAX + 1;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tensors[0]"));
    assert_int_equal(wsync_manifest_emit(NULL, &text, NULL), WSYNC_ERR_INVALID_ARGUMENT);
}

/* Direct mode: segments and each tensor's segment; every malformed case refused by name; the
 * emit writes them back. */
#define H72                                                                                        \
    "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+"         \
    "PwABAgMEBQYH"
#define SEG_IPC                                                                                    \
    "{\"kind\":\"cuda_ipc\",\"handle\":\"" H72 "\",\"bytes\":1024,\"pid\":4711,"                   \
    "\"device\":\"GPU-0123\"}"
#define SEG_PID                                                                                    \
    "{\"kind\":\"host_pid\",\"handle\":\"AAECAwQFBgc=\",\"bytes\":512,\"pid\":4711,"               \
    "\"device\":\"cpu\"}"
#define TS0                                                                                        \
    "{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[4,8],\"segment\":1,\"offset\":0,"           \
    "\"nbytes\":64}"
#define TS1                                                                                        \
    "{\"name\":\"b\",\"dtype\":\"float32\",\"shape\":[16],\"segment\":0,\"offset\":900,"           \
    "\"nbytes\":64}"

static char *direct_doc(const char *segments, const char *tensors)
{
    static char text[1 << 14];
    snprintf(text, sizeof(text),
             "{\"wsync\":1,\"generation\":3,\"buffer\":" BUF_OK
             ",\"segments\":%s,\"tensors\":[%s]}",
             segments, tensors);
    return text;
}

static void test_segments(void **state)
{
    (void)state;
    wsync_manifest_owned_t *a = expect_ok(direct_doc("[" SEG_IPC "," SEG_PID "]", TS0 "," TS1));
    assert_int_equal(a->view.n_segments, 2);
    assert_int_equal(a->view.segments[0].handle_len, 72);
    assert_int_equal(a->view.segments[1].kind, WSYNC_BUFFER_HOST_PID);
    assert_int_equal(a->view.tensor_segment[0], 1);
    assert_int_equal(a->view.tensor_segment[1], 0);
    wsync_manifest_owned_t *b = reparse(&a->view);
    assert_int_equal(b->view.n_segments, 2);
    assert_int_equal(b->view.tensor_segment[0], 1);
    assert_memory_equal(b->view.segments[0].handle, a->view.segments[0].handle, 72);
    wsync_manifest_free(a);
    wsync_manifest_free(b);

    expect_fail(direct_doc("{}", TS0), BAD, "segments: must be an array, got object");
    expect_fail(direct_doc("[]", TS0), BAD, "segments: 0 entries; a direct manifest names 1..");
    expect_fail(direct_doc("[" SEG_PID "]", "{\"name\":\"a\",\"dtype\":\"bfloat16\",\"shape\":[4,"
                                            "8],\"offset\":0,\"nbytes\":64}"),
                BAD, "tensors[0].segment: missing");
    expect_fail(direct_doc("[" SEG_PID "]", TS0), BAD,
                "tensors[0] (\"a\").segment: 1, the manifest has 1 segments");
    expect_fail(
        direct_doc("[" SEG_IPC "," SEG_PID "]",
                   TS1 "," TS0 ",{\"name\":\"c\",\"dtype\":"
                       "\"uint8\",\"shape\":[200],\"segment\":0,\"offset\":900,\"nbytes\":200}"),
        OOB, "exceeds the 1024 bytes of segments[0]");
    expect_fail(direct_doc("[{\"kind\":\"host_pid\",\"handle\":\"" H16 "\",\"bytes\":8,\"pid\":1,"
                           "\"device\":\"cpu\"}]",
                           TS1),
                BAD,
                "segments[0]: a host_pid buffer is a segment of a direct manifest whose handle "
                "is its 8-byte address, got a segment with 16 handle bytes");
    /* a segment index in a manifest without segments, host_pid as the buffer, a 72-byte handle
     * outside segments */
    expect_fail(doc(BUF_OK, TS0), BAD, "tensors[0] (\"a\").segment: this manifest has no segments");
    expect_fail(doc("{\"kind\":\"host_pid\",\"handle\":\"AAECAwQFBgc=\",\"bytes\":8,\"pid\":1,"
                    "\"device\":\"cpu\"}",
                    T0),
                BAD, "buffer: a host_pid buffer is a segment of a direct manifest");
    expect_fail(doc("{\"kind\":\"cuda_ipc\",\"handle\":\"" H72 "\",\"bytes\":4096,"
                    "\"pid\":1,\"device\":\"GPU-0\"}",
                    T0),
                BAD, "buffer.handle: a cuda_ipc handle is 64 bytes, got 72");
    /* cuda_vmm_run: a segment kind (a run of cuMem chunks), never a bucket's buffer */
    wsync_manifest_owned_t *r =
        expect_ok(direct_doc("[{\"kind\":\"cuda_vmm_run\",\"handle\":\"" H16 "\",\"bytes\":"
                             "4194304,\"pid\":4711,\"device\":\"GPU-0123\"}]",
                             TS1));
    assert_int_equal(r->view.segments[0].kind, WSYNC_BUFFER_CUDA_VMM_RUN);
    wsync_manifest_owned_t *r2 = reparse(&r->view);
    assert_int_equal(r2->view.segments[0].kind, WSYNC_BUFFER_CUDA_VMM_RUN);
    wsync_manifest_free(r);
    wsync_manifest_free(r2);
    expect_fail(doc("{\"kind\":\"cuda_vmm_run\",\"handle\":\"" H16 "\",\"bytes\":4096,"
                    "\"pid\":1,\"device\":\"GPU-0\"}",
                    T0),
                BAD, "buffer: a cuda_vmm_run buffer is a segment of a direct manifest");
}

static void test_kind_names(void **state)
{
    (void)state;
    assert_string_equal(wsync_buffer_kind_name(WSYNC_BUFFER_CUDA_IPC), "cuda_ipc");
    assert_string_equal(wsync_buffer_kind_name(WSYNC_BUFFER_HOST_SHM), "host_shm");
    assert_string_equal(wsync_buffer_kind_name(WSYNC_BUFFER_CUDA_VMM_FD), "cuda_vmm_fd");
    assert_string_equal(wsync_buffer_kind_name(WSYNC_BUFFER_CUDA_VMM_RUN), "cuda_vmm_run");
    assert_int_equal(wsync_buffer_kind_from_name("cuda_vmm_run"), WSYNC_BUFFER_CUDA_VMM_RUN);
    assert_string_equal(wsync_buffer_kind_name(WSYNC_BUFFER_INVALID), "invalid");
    assert_int_equal(wsync_buffer_kind_from_name("cuda_ipc"), WSYNC_BUFFER_CUDA_IPC);
    assert_int_equal(wsync_buffer_kind_from_name("host_shm"), WSYNC_BUFFER_HOST_SHM);
    assert_int_equal(wsync_buffer_kind_from_name("cuda_vmm_fd"), WSYNC_BUFFER_CUDA_VMM_FD);
    assert_int_equal(wsync_buffer_kind_from_name("CUDA_IPC"), WSYNC_BUFFER_INVALID);
    assert_int_equal(wsync_buffer_kind_from_name(NULL), WSYNC_BUFFER_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_segments),
        cmocka_unit_test(test_defaults_and_unknown_fields),
        cmocka_unit_test(test_not_json),
        cmocka_unit_test(test_top_level_fields),
        cmocka_unit_test(test_buffer_fields),
        cmocka_unit_test(test_buffer_offset_overflow),
        cmocka_unit_test(test_tensor_fields),
        cmocka_unit_test(test_name_length_limit),
        cmocka_unit_test(test_extents),
        cmocka_unit_test(test_too_many_tensors),
        cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_first_error_wins),
        cmocka_unit_test(test_emit_round_trip),
        cmocka_unit_test(test_emit_from_scratch_and_refusals),
        cmocka_unit_test(test_kind_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
