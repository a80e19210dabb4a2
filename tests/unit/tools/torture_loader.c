/* Loader: loading the CPU plugin, every failure step with a message naming the library, the
 * WSYNC_PLUGIN override and the CUDA -> host fallback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "wsync_loader.h"

#define HOST_PLUGIN WSYNC_TEST_PLUGIN_DIR "/libwsync_cpu.so"
#define FIXTURE FIXTURE_DIR "/libwsync_cuda.so"

static int setup(void **state)
{
    (void)state;
    unsetenv("WSYNC_PLUGIN");
    unsetenv("WSYNC_PLUGIN_DIR");
    unsetenv("WSYNC_FIXTURE_MODE");
    return 0;
}

static void require_host_plugin(void)
{
    if (access(HOST_PLUGIN, F_OK) != 0) {
        print_message("SKIPPED: %s not built\n", HOST_PLUGIN);
        skip();
    }
}

static void assert_zeroed(const wsync_loader_t *l)
{
    assert_null(l->dl);
    assert_null(l->plugin);
    assert_int_equal(l->abi_version, 0);
    assert_string_equal(l->path, "");
}

static void test_load_host(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;
    char real[PATH_MAX];

    (void)state;
    require_host_plugin();
    assert_int_equal(wsync_loader_open(&l, HOST_PLUGIN, NULL, &err), WSYNC_OK);
    assert_int_equal(err.code, WSYNC_OK);
    assert_non_null(l.plugin);
    assert_string_equal(l.plugin->name, "cpu");
    assert_int_equal(l.abi_version, WSYNC_ABI_VERSION);
    assert_non_null(l.plugin->consumer);
    assert_non_null(l.plugin->producer);
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_t, l.plugin->consumer, copy_weights));
    assert_non_null(realpath(HOST_PLUGIN, real));
    assert_string_equal(l.path, real);
    wsync_loader_close(&l);
    assert_zeroed(&l);
}

static void test_missing_path(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;

    (void)state;
    memset(&l, 0xab, sizeof(l));
    assert_int_equal(wsync_loader_open(&l, "/nonexistent/dir/libnope.so", NULL, &err),
                     WSYNC_ERR_NOT_FOUND);
    assert_zeroed(&l);
    assert_int_equal(err.code, WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "/nonexistent/dir/libnope.so"));
    assert_string_equal(err.where, "wsync_loader_open");
}

static void test_null_err_allowed(void **state)
{
    wsync_loader_t l;

    (void)state;
    assert_int_equal(wsync_loader_open(&l, "/nonexistent/x.so", NULL, NULL), WSYNC_ERR_NOT_FOUND);
    assert_zeroed(&l);
}

/* A real shared library that is not a plugin. */
static void test_not_a_plugin(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;

    (void)state;
    assert_int_equal(wsync_loader_open(&l, "libm.so.6", NULL, &err), WSYNC_ERR_INCOMPATIBLE);
    assert_zeroed(&l);
    assert_non_null(strstr(err.message, "wsync_plugin_init"));
    assert_non_null(strstr(err.message, "libm"));
}

static void expect_fixture(const char *mode, wsync_result_t want, const char *needle)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;

    setenv("WSYNC_FIXTURE_MODE", mode, 1);
    assert_int_equal(wsync_loader_open(&l, FIXTURE, NULL, &err), want);
    if (want == WSYNC_OK) {
        assert_string_equal(l.plugin->name, "fixture");
        wsync_loader_close(&l);
    } else {
        assert_zeroed(&l);
        assert_non_null(strstr(err.message, "libwsync_cuda.so"));
        assert_non_null(strstr(err.message, needle));
    }
}

static void test_negotiation(void **state)
{
    (void)state;
    expect_fixture("ok", WSYNC_OK, "");
    /* Below our minimum: both versions named. */
    expect_fixture("old", WSYNC_ERR_INCOMPATIBLE, "version 0");
    expect_fixture("incompatible", WSYNC_ERR_INCOMPATIBLE, "answered 7");
    expect_fixture("no_device", WSYNC_ERR_NO_DEVICE, "no usable device");
    expect_fixture("null_consumer", WSYNC_ERR_INCOMPATIBLE, "NULL consumer");
    expect_fixture("small", WSYNC_ERR_INCOMPATIBLE, "struct_size 8");
}

static void test_env_override(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;
    char real[PATH_MAX];

    (void)state;
    setenv("WSYNC_PLUGIN", "/nonexistent/override.so", 1);
    assert_int_equal(wsync_loader_open(&l, NULL, NULL, &err), WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "/nonexistent/override.so"));

    require_host_plugin();
    setenv("WSYNC_PLUGIN", HOST_PLUGIN, 1);
    assert_int_equal(wsync_loader_open(&l, NULL, NULL, NULL), WSYNC_OK);
    assert_non_null(realpath(HOST_PLUGIN, real));
    assert_string_equal(l.path, real);
    wsync_loader_close(&l);
    /* An explicit path wins over the environment. */
    setenv("WSYNC_PLUGIN", "/nonexistent/override.so", 1);
    assert_int_equal(wsync_loader_open(&l, HOST_PLUGIN, NULL, NULL), WSYNC_OK);
    wsync_loader_close(&l);
}

static int logged_info;

static void count_log(void *user, wsync_log_level_t level, const char *file, int line,
                      const char *fmt, ...)
{
    (void)user;
    (void)file;
    (void)line;
    if (level == WSYNC_LOG_INFO && strstr(fmt, "%s") != NULL)
        logged_info++;
}

/* A CUDA plugin that finds no GPU is skipped (logged at INFO) and the CPU plugin is used. */
static void test_default_falls_back_to_host(void **state)
{
    wsync_host_t host = {
        .struct_size = sizeof(host), .log = count_log, .log_level = WSYNC_LOG_INFO};
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;

    (void)state;
    require_host_plugin();
    setenv("WSYNC_PLUGIN_DIR", FIXTURE_DIR, 1); /* finds the fixture as libwsync_cuda.so */
    setenv("WSYNC_FIXTURE_MODE", "no_device", 1);
    logged_info = 0;
    /* The CPU plugin is not in FIXTURE_DIR: found through <exe>/../lib or fails clearly. */
    wsync_result_t rc = wsync_loader_open(&l, NULL, &host, &err);
    if (rc != WSYNC_OK) {
        assert_non_null(strstr(err.message, "libwsync_cpu.so"));
        setenv("WSYNC_PLUGIN_DIR", WSYNC_TEST_PLUGIN_DIR, 1);
        rc = wsync_loader_open(&l, NULL, &host, &err);
    }
    assert_int_equal(rc, WSYNC_OK);
    assert_string_equal(l.plugin->name, "cpu");
    assert_true(logged_info >= 1);
    wsync_loader_close(&l);

    /* With a working "cuda" plugin it is chosen. */
    setenv("WSYNC_FIXTURE_MODE", "ok", 1);
    assert_int_equal(wsync_loader_open(&l, NULL, NULL, NULL), WSYNC_OK);
    assert_string_equal(l.plugin->name, "fixture");
    wsync_loader_close(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_load_host, setup),
        cmocka_unit_test_setup(test_missing_path, setup),
        cmocka_unit_test_setup(test_null_err_allowed, setup),
        cmocka_unit_test_setup(test_not_a_plugin, setup),
        cmocka_unit_test_setup(test_negotiation, setup),
        cmocka_unit_test_setup(test_env_override, setup),
        cmocka_unit_test_setup(test_default_falls_back_to_host, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
