/* The request driver (engine-shims/common/wsync_driver.c) in native-fallback mode: a missing
 * plugin is logged and the engine's native loader serves; every bucket of a request is validated
 * before the first copy; generations must increase per buffer. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake_engine.h"
#include "wsync_driver.h"
#include "wsync_map_rules.h"

static fake_engine_t eng;
static uint8_t source[4096]; /* what the "buffer" holds: byte i = i & 0xff */
static unsigned native_calls;
static char logged[2048];

static wsync_result_t native_copy(void *user, const wsync_buffer_desc_t *b, uint64_t generation,
                                  const wsync_copy_op_t *ops, size_t n, wsync_error_t *err)
{
    (void)user;
    (void)b;
    (void)generation;
    (void)err;
    native_calls++;
    for (size_t i = 0; i < n; i++)
        for (uint64_t r = 0; r < ops[i].rows; r++)
            memcpy((uint8_t *)ops[i].dst + r * ops[i].dst_pitch,
                   source + ops[i].src_offset + r * ops[i].src_pitch, ops[i].row_bytes);
    return WSYNC_OK;
}

static void capture(void *user, wsync_log_level_t level, const char *file, int line,
                    const char *fmt, ...)
{
    va_list ap;
    size_t len = strlen(logged);
    (void)user;
    (void)level;
    (void)file;
    (void)line;
    va_start(ap, fmt);
    vsnprintf(logged + len, sizeof(logged) - len, fmt, ap);
    va_end(ap);
}

static wsync_engine_ops_t ops = {.struct_size = sizeof(wsync_engine_ops_t),
                                 .user = &eng,
                                 .param = fake_param_cb,
                                 .tp = fake_tp_cb,
                                 .dims = fake_dims_cb,
                                 .native_copy = native_copy};

/* A manifest over buffer `shm` holding model.norm.weight at 0 and `second` at 256. */
static char *manifest(const char *shm_b64, uint64_t gen, const char *second)
{
    char *out = malloc(1024);
    if (out == NULL ||
        snprintf(out, 1024,
                 "{\"wsync\":1,\"generation\":%llu,\"buffer\":{\"kind\":\"host_shm\","
                 "\"handle\":\"%s\",\"bytes\":4096,\"pid\":1,\"device\":\"cpu\"},"
                 "\"tensors\":[{\"name\":\"model.norm.weight\",\"dtype\":\"bfloat16\","
                 "\"shape\":[8],\"offset\":0,\"nbytes\":16},"
                 "{\"name\":\"%s\",\"dtype\":\"bfloat16\",\"shape\":[8],\"offset\":256,"
                 "\"nbytes\":16}]}",
                 (unsigned long long)gen, shm_b64, second) >= 1024)
        return NULL;
    return out;
}

static wsync_driver_t *open_native(void)
{
    wsync_driver_config_t cfg = {.plugin_path = "/nonexistent/libwsync_none.so",
                                 .engine = &ops,
                                 .map = &wsync_map_dense,
                                 .log = capture,
                                 .log_level = WSYNC_LOG_DEBUG};
    wsync_driver_t *d = NULL;
    assert_int_equal(wsync_driver_open(&cfg, &d, NULL), WSYNC_OK);
    return d;
}

static int setup(void **state)
{
    (void)state;
    fake_engine_init(&eng, 0, 1);
    for (size_t i = 0; i < sizeof(source); i++)
        source[i] = (uint8_t)i;
    native_calls = 0;
    logged[0] = '\0';
    return 0;
}

static void test_fallback_logged(void **state)
{
    const char *why = NULL;
    wsync_driver_t *d = open_native();
    (void)state;

    assert_true(wsync_driver_native(d, &why));
    assert_non_null(strstr(why, "no such file"));
    assert_non_null(strstr(logged, "falling back to the engine's native loader"));
    assert_null(wsync_driver_plugin(d));
    wsync_driver_close(d);
}

static void test_apply_native(void **state)
{
    wsync_driver_t *d = open_native();
    char *m = manifest("L2E=", 1, "model.layers.0.input_layernorm.weight");
    size_t len = strlen(m);
    uint64_t gen = 0;
    (void)state;

    assert_int_equal(wsync_driver_apply(d, (const char *const *)&m, &len, 1, &gen, NULL), WSYNC_OK);
    assert_int_equal(gen, 1);
    assert_int_equal(native_calls, 1);
    assert_memory_equal(fake_mem(&eng, "model.norm.weight"), source, 16);
    assert_memory_equal(fake_mem(&eng, "model.layers.0.input_layernorm.weight"), source + 256, 16);
    free(m);
    wsync_driver_close(d);
}

/* Bucket 0 is valid, bucket 1 names an unknown tensor: nothing at all is copied. */
static void test_validate_all_before_copy(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_driver_t *d = open_native();
    char *m[2] = {manifest("L2E=", 1, "model.layers.0.input_layernorm.weight"),
                  manifest("L2I=", 1, "model.layers.0.self_attn.bogus.weight")};
    size_t lens[2] = {strlen(m[0]), strlen(m[1])};
    uint8_t zero[16] = {0};
    (void)state;

    assert_int_equal(wsync_driver_apply(d, (const char *const *)m, lens, 2, NULL, &err),
                     WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "model.layers.0.self_attn.bogus.weight"));
    assert_int_equal(native_calls, 0);
    assert_memory_equal(fake_mem(&eng, "model.norm.weight"), zero, 16);
    free(m[0]);
    free(m[1]);
    wsync_driver_close(d);
}

static void test_generations(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_driver_t *d = open_native();
    char *a2 = manifest("L2E=", 2, "model.norm.weight");
    char *dup[2] = {manifest("L2E=", 3, "model.layers.0.input_layernorm.weight"),
                    manifest("L2E=", 4, "model.layers.0.input_layernorm.weight")};
    char *a1 = manifest("L2E=", 1, "model.layers.0.input_layernorm.weight");
    char *b1 = manifest("L2I=", 1, "model.layers.0.input_layernorm.weight");
    size_t len;
    (void)state;

    /* Duplicate names inside one bucket are the plugin's parser's business. */
    len = strlen(a2);
    assert_int_not_equal(wsync_driver_apply(d, (const char *const *)&a2, &len, 1, NULL, &err),
                         WSYNC_OK);
    err = (wsync_error_t){.struct_size = sizeof(err)};
    len = strlen(dup[0]);
    assert_int_equal(wsync_driver_apply(d, (const char *const *)&dup[0], &len, 1, NULL, &err),
                     WSYNC_OK);
    len = strlen(a1);
    assert_int_equal(wsync_driver_apply(d, (const char *const *)&a1, &len, 1, NULL, &err),
                     WSYNC_ERR_STALE_GENERATION);
    assert_non_null(strstr(err.message, "stale generation 1"));
    assert_non_null(strstr(err.message, "already consumed generation 3"));
    /* Another buffer has its own sequence. */
    len = strlen(b1);
    assert_int_equal(wsync_driver_apply(d, (const char *const *)&b1, &len, 1, NULL, NULL),
                     WSYNC_OK);
    /* Two buckets of one request on the same buffer are refused. */
    err = (wsync_error_t){.struct_size = sizeof(err)};
    char *same[2] = {manifest("L2M=", 1, "model.layers.0.input_layernorm.weight"),
                     manifest("L2M=", 2, "model.layers.0.input_layernorm.weight")};
    size_t lens[2] = {strlen(same[0]), strlen(same[1])};
    assert_int_equal(wsync_driver_apply(d, (const char *const *)same, lens, 2, NULL, &err),
                     WSYNC_ERR_BAD_MANIFEST);
    free(same[0]);
    free(same[1]);
    assert_non_null(strstr(err.message, "same buffer"));
    assert_int_equal(native_calls, 2);
    free(a2);
    free(a1);
    free(b1);
    free(dup[0]);
    free(dup[1]);
    wsync_driver_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fallback_logged, setup),
        cmocka_unit_test_setup(test_apply_native, setup),
        cmocka_unit_test_setup(test_validate_all_before_copy, setup),
        cmocka_unit_test_setup(test_generations, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
