/* safetensors reader: round trip, a hand-written file, and every malformed case refused with a
 * message naming the tensor and the values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "adapter_fixture.h"
#include "wsync_error.h"
#include "wsync_safetensors.h"

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    fx_tempdir(g_dir, sizeof(g_dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fx_rmtree(g_dir);
    return 0;
}

static void test_round_trip(void **state)
{
    (void)state;
    float a[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.125f, 7.0f};
    uint16_t b[4] = {0x3f80, 0xbf80, 0x4000, 0x0000}; /* bf16 1, -1, 2, 0 */
    wsync_st_write_tensor_t t[2] = {
        {.name = "x.lora_A.weight",
         .dtype = WSYNC_DTYPE_F32,
         .ndim = 2,
         .shape = {2, 3},
         .data = a},
        {.name = "x.lora_B.weight",
         .dtype = WSYNC_DTYPE_BF16,
         .ndim = 2,
         .shape = {4, 1},
         .data = b},
    };
    char path[512];
    snprintf(path, sizeof(path), "%s/rt.safetensors", g_dir);
    json_t *meta = json_pack("{s:s, s:s}", "format", "pt", "note", "hello");
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_safetensors_write(path, t, 2, meta, &err), WSYNC_OK);
    json_decref(meta);

    wsync_safetensors_t *st = NULL;
    assert_int_equal(wsync_safetensors_open(path, &st, &err), WSYNC_OK);
    assert_int_equal(wsync_safetensors_count(st), 2);
    assert_string_equal(wsync_safetensors_metadata(st, "format"), "pt");
    assert_string_equal(wsync_safetensors_metadata(st, "note"), "hello");
    assert_null(wsync_safetensors_metadata(st, "absent"));
    const wsync_st_tensor_t *x = wsync_safetensors_lookup(st, "x.lora_A.weight");
    assert_non_null(x);
    assert_int_equal(x->dtype, WSYNC_DTYPE_F32);
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 2);
    assert_int_equal(x->shape[1], 3);
    assert_int_equal(x->nbytes, sizeof(a));
    assert_memory_equal(x->data, a, sizeof(a));
    const wsync_st_tensor_t *y = wsync_safetensors_lookup(st, "x.lora_B.weight");
    assert_non_null(y);
    assert_int_equal(y->dtype, WSYNC_DTYPE_BF16);
    assert_memory_equal(y->data, b, sizeof(b));
    assert_ptr_equal(wsync_safetensors_at(st, 0), x); /* offset order */
    assert_ptr_equal(wsync_safetensors_at(st, 1), y);
    assert_null(wsync_safetensors_at(st, 2));
    assert_null(wsync_safetensors_lookup(st, "nope"));
    wsync_safetensors_close(st);
}

/* A file written by hand from the format description, with a space-padded header and a scalar. */
static void test_hand_written(void **state)
{
    (void)state;
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[4,12]},"
                    "\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}   ";
    uint8_t data[12] = {0x00, 0x3c, 0x00, 0xc0, 42, 0, 0, 0, 0, 0, 0, 0};
    char path[512];
    snprintf(path, sizeof(path), "%s/hand.safetensors", g_dir);
    fx_write_raw_safetensors(path, h, 0, data, sizeof(data));
    wsync_safetensors_t *st = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_safetensors_open(path, &st, &err), WSYNC_OK);
    const wsync_st_tensor_t *b = wsync_safetensors_lookup(st, "b");
    assert_non_null(b);
    assert_int_equal(b->ndim, 0);
    assert_int_equal(b->nbytes, 8);
    assert_int_equal(((const uint8_t *)b->data)[0], 42);
    const wsync_st_tensor_t *a = wsync_safetensors_lookup(st, "a");
    assert_int_equal(a->dtype, WSYNC_DTYPE_F16);
    assert_memory_equal(a->data, data, 4);
    wsync_safetensors_close(st);
}

typedef struct bad_case {
    const char *label;
    const char *header;
    uint64_t hlen_override;
    size_t data_len;
    wsync_result_t code;
    const char *needle1, *needle2;
} bad_case_t;

static const bad_case_t bad_cases[] = {
    {"header past EOF", "{}", 4096, 0, WSYNC_ERR_OUT_OF_BOUNDS, "header length 4096",
     "past the end"},
    {"absurd header", "{}", 200u * 1024 * 1024, 0, WSYNC_ERR_BAD_ADAPTER, "209715200", "limit"},
    {"non-JSON", "{not json", 0, 0, WSYNC_ERR_BAD_ADAPTER, "not valid JSON", ""},
    {"not an object", "[1,2]", 0, 0, WSYNC_ERR_BAD_ADAPTER, "not a JSON object", ""},
    {"duplicate names",
     "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     0, 8, WSYNC_ERR_BAD_ADAPTER, "duplicate", "not valid JSON"},
    {"overlap",
     "{\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     0, 12, WSYNC_ERR_OUT_OF_BOUNDS, "\"q\"", "overlap tensor \"p\""},
    {"offset out of range", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0,
     8, WSYNC_ERR_OUT_OF_BOUNDS, "\"t\"", "[0, 16] outside the 8 data bytes"},
    {"begin > end", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 0, 8,
     WSYNC_ERR_OUT_OF_BOUNDS, "\"t\"", "[8, 4]"},
    {"negative offset", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 0, 8,
     WSYNC_ERR_OUT_OF_BOUNDS, "\"t\"", "[-4, 0]"},
    {"size mismatch", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
     WSYNC_ERR_BAD_ADAPTER, "\"t\"", "hold 8 bytes but F32 x shape needs 12"},
    {"unknown dtype", "{\"t\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 0, 8,
     WSYNC_ERR_BAD_ADAPTER, "\"t\"", "unknown dtype \"C64\""},
    {"torch dtype spelling", "{\"t\":{\"dtype\":\"float32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     0, 4, WSYNC_ERR_BAD_ADAPTER, "\"t\"", "unknown dtype \"float32\""},
    {"negative shape", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 0, 4,
     WSYNC_ERR_BAD_ADAPTER, "\"t\"", "shape[0]"},
    {"float shape", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 0, 4,
     WSYNC_ERR_BAD_ADAPTER, "\"t\"", "shape[0]"},
    {"three offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 0, 8,
     WSYNC_ERR_BAD_ADAPTER, "\"t\"", "data_offsets"},
    {"missing dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4, WSYNC_ERR_BAD_ADAPTER,
     "\"t\"", "dtype"},
    {"metadata not strings",
     "{\"__metadata__\":{\"format\":1},\"t\":{\"dtype\":\"F32\",\"shape\":[1],"
     "\"data_offsets\":[0,4]}}",
     0, 4, WSYNC_ERR_BAD_ADAPTER, "__metadata__", "\"format\" is not a string"},
    {"metadata not object", "{\"__metadata__\":[]}", 0, 0, WSYNC_ERR_BAD_ADAPTER, "__metadata__",
     "object of strings"},
    {"hole", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, 8,
     WSYNC_ERR_BAD_ADAPTER, "bytes [0, 4) before tensor \"t\"", "fully indexed"},
    {"trailing bytes", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 8,
     WSYNC_ERR_BAD_ADAPTER, "data is 8 bytes", "end at byte 4"},
    {"entry not object", "{\"t\":5}", 0, 0, WSYNC_ERR_BAD_ADAPTER, "\"t\"", "not an object"},
};

static void test_malformed(void **state)
{
    (void)state;
    uint8_t zeros[64] = {0};
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const bad_case_t *c = &bad_cases[i];
        char path[512];
        snprintf(path, sizeof(path), "%s/bad%zu.safetensors", g_dir, i);
        fx_write_raw_safetensors(path, c->header, c->hlen_override, zeros, c->data_len);
        wsync_safetensors_t *st = (wsync_safetensors_t *)(uintptr_t)1;
        wsync_error_t err = {.struct_size = sizeof(err)};
        wsync_result_t rc = wsync_safetensors_open(path, &st, &err);
        if (rc != c->code || st != NULL || !strstr(err.message, c->needle1) ||
            !strstr(err.message, c->needle2) || !strstr(err.message, path))
            fail_msg("case \"%s\": rc %d (want %d), message \"%s\"", c->label, rc, c->code,
                     err.message);
    }
}

static void test_short_and_missing(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/short.safetensors", g_dir);
    fx_write_text(g_dir, "short.safetensors", "abc");
    wsync_safetensors_t *st = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_safetensors_open(path, &st, &err), WSYNC_ERR_BAD_ADAPTER);
    assert_non_null(strstr(err.message, "too short"));
    wsync_error_clear(&err);
    snprintf(path, sizeof(path), "%s/none.safetensors", g_dir);
    assert_int_equal(wsync_safetensors_open(path, &st, &err), WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "none.safetensors"));
    /* In-memory images follow the same rules. */
    static const uint8_t img[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    wsync_error_clear(&err);
    assert_int_equal(wsync_safetensors_open_memory(img, sizeof(img), "img", &st, &err), WSYNC_OK);
    assert_int_equal(wsync_safetensors_count(st), 0);
    wsync_safetensors_close(st);
    assert_int_equal(wsync_safetensors_open_memory(img, 5, "img", &st, &err),
                     WSYNC_ERR_BAD_ADAPTER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hand_written),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_short_and_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
