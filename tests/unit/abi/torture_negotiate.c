/* Two-way ABI negotiation through dlopen of fixture plugins, the struct_size growth rules,
 * host-side minimum checks, logging through the host callback and wsync_strerror. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture_abi_v2.h"
#include "wsync_error.h"
#include "wsync_client.h"
#include "wsync_log.h"
#include "wsync_negotiate.h"

/* ------------------------------------------------------------ host logger */

typedef struct captured_log {
    int count;
    wsync_log_level_t level;
    char text[512];
} captured_log_t;

static void capture_log(void *user, wsync_log_level_t level, const char *file, int line,
                        const char *fmt, ...)
{
    captured_log_t *c = user;
    va_list ap;
    (void)file;
    (void)line;
    c->count++;
    c->level = level;
    va_start(ap, fmt);
    vsnprintf(c->text, sizeof(c->text), fmt, ap);
    va_end(ap);
}

static wsync_host_t host_with(captured_log_t *c, wsync_log_level_t level)
{
    wsync_host_t h = {
        .struct_size = sizeof(h), .log = capture_log, .log_user = c, .log_level = level};
    return h;
}

/* ------------------------------------------------------------ loading */

typedef struct fixture {
    void *dl;
    wsync_plugin_init_fn_t init;
} fixture_t;

static fixture_t load(const char *name)
{
    char path[512];
    fixture_t f;
    snprintf(path, sizeof(path), "%s/libwsync_fixture_%s.so", WSYNC_ABI_FIXTURE_DIR, name);
    f.dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (f.dl == NULL)
        print_error("dlopen %s: %s\n", path, dlerror());
    assert_non_null(f.dl);
    *(void **)&f.init = dlsym(f.dl, WSYNC_PLUGIN_INIT_SYMBOL);
    assert_non_null(f.init);
    return f;
}

/* The host side of the negotiation, as engine-shims/common/wsync_loader.c does it: offer
 * host_max, then accept the answer only within [host_min, host_max]. */
static wsync_result_t host_negotiate(fixture_t *f, uint32_t host_min, uint32_t host_max,
                                     const wsync_host_t *host, const wsync_plugin_t **out,
                                     uint32_t *answered, wsync_error_t *err)
{
    uint32_t v = host_max;
    *out = NULL;
    wsync_result_t r = f->init(&v, host, out, err);
    *answered = v;
    if (r != WSYNC_OK)
        return r;
    if (v < host_min || v > host_max || *out == NULL || (*out)->abi_version != v) {
        *out = NULL;
        return WSYNC_FAIL(err, WSYNC_ERR_INCOMPATIBLE,
                          "plugin answered ABI %u, host accepts %u..%u", v, host_min, host_max);
    }
    return WSYNC_OK;
}

static void test_v1_plugin_v1_host(void **state)
{
    (void)state;
    fixture_t f = load("v1");
    const wsync_plugin_t *p = NULL;
    uint32_t v = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    captured_log_t log = {0};
    wsync_host_t host = host_with(&log, WSYNC_LOG_DEBUG);
    assert_int_equal(host_negotiate(&f, 1, 1, &host, &p, &v, &err), WSYNC_OK);
    assert_int_equal(v, 1);
    assert_non_null(p);
    assert_int_equal(p->struct_size, sizeof(wsync_plugin_v1_t));
    assert_int_equal(p->abi_version, 1);
    assert_string_equal(p->name, "v1");
    assert_non_null(p->consumer);
    assert_int_equal(p->consumer->struct_size, sizeof(wsync_consumer_ops_v1_t));
    assert_int_equal(err.code, WSYNC_OK);
    /* The plugin logged through our callback, and only there. */
    assert_true(log.count >= 1);
    assert_int_equal(log.level, WSYNC_LOG_INFO);
    assert_string_equal(log.text, "fixture v1 answers ABI 1");
    /* Members report through err with a where. */
    struct wsync_consumer *c = NULL;
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_t, p->consumer, create));
    assert_int_equal(p->consumer->create(NULL, &c, &err), WSYNC_ERR_NOT_SUPPORTED);
    assert_string_equal(err.where, "fixture_create");
    assert_string_equal(err.message, "fixture v1 has no consumer");
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_t, p->consumer, copy_weights));
    assert_null(p->producer);
    /* The version script hides everything but the init symbol. */
    assert_null(dlsym(f.dl, "wsync_negotiate"));
    assert_null(dlsym(f.dl, "wsync_fail"));
    assert_null(dlsym(f.dl, "fixture_create"));
    dlclose(f.dl);
}

static void test_newer_plugin_v1_host(void **state)
{
    (void)state;
    fixture_t f = load("newer");
    const wsync_plugin_t *p = NULL;
    uint32_t v = 0;
    assert_int_equal(host_negotiate(&f, 1, 1, NULL, &p, &v, NULL), WSYNC_OK);
    assert_int_equal(v, 1);
    assert_int_equal(p->abi_version, 1);
    /* v1 tables: the appended v2 member is not visible to a v1 reader. */
    assert_int_equal(p->consumer->abi_version, 1);
    assert_int_equal(p->consumer->struct_size, sizeof(wsync_consumer_ops_v1_t));
    const fixture_consumer_v2_t *c2 = (const fixture_consumer_v2_t *)(const void *)p->consumer;
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &c2->v1, create));
    assert_true(c2->v1.struct_size <
                offsetof(fixture_consumer_v2_t, future_op) + sizeof(c2->future_op));
    dlclose(f.dl);
}

static void test_newer_plugin_v2_host(void **state)
{
    (void)state;
    fixture_t f = load("newer");
    const wsync_plugin_t *p = NULL;
    uint32_t v = 0;
    assert_int_equal(host_negotiate(&f, 1, 2, NULL, &p, &v, NULL), WSYNC_OK);
    assert_int_equal(v, 2);
    assert_int_equal(p->abi_version, 2);
    const fixture_consumer_v2_t *c2 = (const fixture_consumer_v2_t *)(const void *)p->consumer;
    assert_int_equal(c2->v1.struct_size, sizeof(fixture_consumer_v2_t));
    /* The WSYNC_HAS_OP rule, spelled out: the v2 member lies inside struct_size. */
    assert_true(c2->v1.struct_size >=
                offsetof(fixture_consumer_v2_t, future_op) + sizeof(c2->future_op));
    assert_non_null(c2->future_op);
    assert_int_equal(c2->future_op(42), WSYNC_OK);
    dlclose(f.dl);
}

static void test_incompatible_plugin(void **state)
{
    (void)state;
    fixture_t f = load("min2");
    const wsync_plugin_t *p = (const wsync_plugin_t *)(uintptr_t)1;
    uint32_t v = 1;
    wsync_error_t err = {.struct_size = sizeof(err)};
    captured_log_t log = {0};
    wsync_host_t host = host_with(&log, WSYNC_LOG_ERROR);
    assert_int_equal(f.init(&v, &host, &p, &err), WSYNC_ERR_INCOMPATIBLE);
    assert_int_equal(v, 2); /* the plugin's minimum, written back */
    assert_int_equal(err.code, WSYNC_ERR_INCOMPATIBLE);
    assert_string_equal(err.where, "wsync_negotiate");
    assert_non_null(strstr(err.message, "plugin min2 supports ABI versions 2..2 but the host "
                                        "offers at most 1"));
    /* The error went to the host's logger too, at ERROR. */
    assert_int_equal(log.count, 1);
    assert_int_equal(log.level, WSYNC_LOG_ERROR);
    assert_non_null(strstr(log.text, "supports ABI versions 2..2"));
    /* Nothing handed out. */
    assert_ptr_equal(p, (const wsync_plugin_t *)(uintptr_t)1);

    /* A host that speaks 2 gets it. */
    uint32_t answered = 0;
    assert_int_equal(host_negotiate(&f, 1, 2, NULL, &p, &answered, NULL), WSYNC_OK);
    assert_int_equal(answered, 2);
    dlclose(f.dl);
}

static void test_host_newer(void **state)
{
    (void)state;
    fixture_t f = load("v1");
    const wsync_plugin_t *p = NULL;
    uint32_t v = 0;
    /* Host offers 3, plugin answers 1, host's minimum is 1: accepted. */
    assert_int_equal(host_negotiate(&f, 1, 3, NULL, &p, &v, NULL), WSYNC_OK);
    assert_int_equal(v, 1);
    assert_int_equal(p->abi_version, 1);
    /* A newer host talking to the 1..2 plugin gets 2. */
    fixture_t g = load("newer");
    assert_int_equal(host_negotiate(&g, 1, 3, NULL, &p, &v, NULL), WSYNC_OK);
    assert_int_equal(v, 2);
    dlclose(g.dl);
    dlclose(f.dl);
}

static void test_host_minimum_refuses_old_plugin(void **state)
{
    (void)state;
    fixture_t f = load("v1");
    const wsync_plugin_t *p = NULL;
    uint32_t v = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    /* The plugin itself succeeds (it answers 1); the host's minimum of 2 refuses. */
    assert_int_equal(host_negotiate(&f, 2, 3, NULL, &p, &v, &err), WSYNC_ERR_INCOMPATIBLE);
    assert_int_equal(v, 1);
    assert_null(p);
    assert_non_null(strstr(err.message, "plugin answered ABI 1, host accepts 2..3"));
    dlclose(f.dl);
}

static void test_negotiate_unit(void **state)
{
    (void)state;
    uint32_t v;
    wsync_error_t err = {0};
    v = 5;
    assert_int_equal(wsync_negotiate(&v, 1, 3, "p", NULL), WSYNC_OK);
    assert_int_equal(v, 3);
    v = 2;
    assert_int_equal(wsync_negotiate(&v, 1, 3, "p", NULL), WSYNC_OK);
    assert_int_equal(v, 2);
    v = 1;
    assert_int_equal(wsync_negotiate(&v, 1, 3, "p", NULL), WSYNC_OK);
    assert_int_equal(v, 1);
    v = 0;
    assert_int_equal(wsync_negotiate(&v, 1, 3, "p", &err), WSYNC_ERR_INCOMPATIBLE);
    assert_int_equal(v, 1);
    assert_non_null(strstr(err.message, "plugin p supports ABI versions 1..3 but the host offers "
                                        "at most 0"));
    assert_int_equal(wsync_negotiate(NULL, 1, 1, "p", NULL), WSYNC_ERR_INVALID_ARGUMENT);
    v = 1;
    assert_int_equal(wsync_negotiate(&v, 2, 1, "p", NULL), WSYNC_ERR_INTERNAL);
    assert_int_equal(v, 1);
}

/* ------------------------------------------------------------ growth rules */

static wsync_result_t stub_copy(struct wsync_consumer *c, struct wsync_handle *h, wsync_stream_t s,
                                uint64_t g, const wsync_copy_op_v1_t *o, size_t n, uint32_t f,
                                wsync_error_v1_t *e)
{
    (void)c, (void)h, (void)s, (void)g, (void)o, (void)n, (void)f, (void)e;
    return WSYNC_OK;
}

static wsync_result_t stub_record(struct wsync_consumer *c, struct wsync_handle *h, int w,
                                  wsync_error_v1_t *e)
{
    (void)c, (void)h, (void)w, (void)e;
    return WSYNC_OK;
}

static void test_shrunken_struct_size(void **state)
{
    (void)state;
    wsync_consumer_ops_v1_t t;
    memset(&t, 0, sizeof(t));
    t.copy_weights = stub_copy;
    t.record_consumed = stub_record;
    t.struct_size = sizeof(t);
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, copy_weights));
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, record_consumed));
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, hot_load_adapter)); /* NULL member */

    /* A table built before record_consumed existed: ends right before it. */
    t.struct_size = offsetof(wsync_consumer_ops_v1_t, record_consumed);
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, copy_weights));
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, record_consumed));
    /* Ending in the middle of a member hides it too. */
    t.struct_size = offsetof(wsync_consumer_ops_v1_t, record_consumed) + sizeof(void *) - 1;
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, record_consumed));
    t.struct_size = offsetof(wsync_consumer_ops_v1_t, record_consumed) + sizeof(void *);
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, record_consumed));
    /* Too small even for copy_weights. */
    t.struct_size = offsetof(wsync_consumer_ops_v1_t, copy_weights);
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, copy_weights));
    t.struct_size = 0;
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, &t, copy_weights));
    const wsync_consumer_ops_v1_t *none = NULL;
    assert_false(WSYNC_HAS_OP(wsync_consumer_ops_v1_t, none, copy_weights));
}

static void test_has_field(void **state)
{
    (void)state;
    captured_log_t log = {0};
    wsync_host_t h = host_with(&log, WSYNC_LOG_DEBUG);
    assert_true(WSYNC_HAS_FIELD(wsync_host_t, &h, log));
    assert_true(WSYNC_HAS_FIELD(wsync_host_t, &h, log_level));
    h.struct_size = offsetof(wsync_host_t, log_level);
    assert_true(WSYNC_HAS_FIELD(wsync_host_t, &h, log));
    assert_true(WSYNC_HAS_FIELD(wsync_host_t, &h, log_user));
    assert_false(WSYNC_HAS_FIELD(wsync_host_t, &h, log_level));
    h.struct_size = offsetof(wsync_host_t, log);
    assert_false(WSYNC_HAS_FIELD(wsync_host_t, &h, log));
    const wsync_host_t *none = NULL;
    assert_false(WSYNC_HAS_FIELD(wsync_host_t, none, log));
}

/* The plugin's logger reads only the fields the host's struct_size covers. */
static void test_logging_respects_host_struct(void **state)
{
    (void)state;
    captured_log_t log = {0};
    wsync_host_t h = host_with(&log, WSYNC_LOG_DEBUG);

    wsync_log_set_host(&h);
    WSYNC_LOG_DEBUG("debug %d", 1);
    assert_int_equal(log.count, 1);
    assert_int_equal(log.level, WSYNC_LOG_DEBUG);
    assert_string_equal(log.text, "debug 1");

    /* Level filter. */
    h.log_level = WSYNC_LOG_WARN;
    wsync_log_set_host(&h);
    WSYNC_LOG_INFO("info");
    WSYNC_LOG_DEBUG("debug");
    assert_int_equal(log.count, 1);
    WSYNC_LOG_WARN("warn %s", "x");
    assert_int_equal(log.count, 2);
    assert_string_equal(log.text, "warn x");

    /* An older host without log_level (and a garbage value there) gets WARN and above. */
    h.log_level = (wsync_log_level_t)99;
    h.struct_size = offsetof(wsync_host_t, log_level);
    wsync_log_set_host(&h);
    WSYNC_LOG_INFO("info");
    assert_int_equal(log.count, 2);
    WSYNC_LOG_ERROR("error");
    assert_int_equal(log.count, 3);

    /* A host struct too small to hold log: silence. */
    h.struct_size = offsetof(wsync_host_t, log);
    wsync_log_set_host(&h);
    WSYNC_LOG_ERROR("nobody hears this");
    assert_int_equal(log.count, 3);
    /* NULL host, NULL log: silence. */
    wsync_log_set_host(NULL);
    WSYNC_LOG_ERROR("nobody");
    h = host_with(&log, WSYNC_LOG_DEBUG);
    h.log = NULL;
    wsync_log_set_host(&h);
    WSYNC_LOG_ERROR("nobody");
    assert_int_equal(log.count, 3);

    /* A '%' in the formatted text reaches the host verbatim (passed through "%s"). */
    h = host_with(&log, WSYNC_LOG_DEBUG);
    wsync_log_set_host(&h);
    WSYNC_LOG_INFO("%s", "100%d");
    assert_string_equal(log.text, "100%d");
    wsync_log_set_host(NULL);
}

/* ------------------------------------------------------------ errors */

static void test_strerror_covers_every_code(void **state)
{
    (void)state;
    const char *seen[WSYNC_ERR_UNKNOWN_PLAN + 1];
    for (int r = WSYNC_OK; r <= WSYNC_ERR_UNKNOWN_PLAN; r++) {
        const char *s = wsync_strerror((wsync_result_t)r);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown wsync result");
        for (int k = 0; k < r; k++)
            assert_string_not_equal(s, seen[k]);
        seen[r] = s;
    }
    assert_string_equal(wsync_strerror(WSYNC_OK), "success");
    assert_string_equal(wsync_strerror(WSYNC_ERR_INCOMPATIBLE), "incompatible ABI version");
    assert_string_equal(wsync_strerror(WSYNC_ERR_PERMISSION), "permission denied");
    assert_string_equal(wsync_strerror((wsync_result_t)(WSYNC_ERR_UNKNOWN_PLAN + 1)),
                        "unknown wsync result");
    assert_string_equal(wsync_strerror((wsync_result_t)-1), "unknown wsync result");
    /* Values are fixed forever. */
    assert_int_equal(WSYNC_ERR_BAD_MANIFEST, 6);
    assert_int_equal(WSYNC_ERR_INTERNAL, 16);
    assert_int_equal(WSYNC_ERR_PERMISSION, 17);
    assert_int_equal(WSYNC_ERR_BAD_REQUEST, 18);
    assert_int_equal(WSYNC_ERR_BAD_ADAPTER, 19);
}

static void test_fail_first_error_wins(void **state)
{
    (void)state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(WSYNC_FAIL(&err, WSYNC_ERR_BUSY, "first %d", 1), WSYNC_ERR_BUSY);
    assert_int_equal(WSYNC_FAIL(&err, WSYNC_ERR_TIMEOUT, "second"), WSYNC_ERR_TIMEOUT);
    assert_int_equal(err.code, WSYNC_ERR_BUSY);
    assert_string_equal(err.message, "first 1");
    assert_string_equal(err.where, "test_fail_first_error_wins");
    assert_int_equal(err.struct_size, sizeof(err));
    wsync_error_clear(&err);
    assert_int_equal(err.code, WSYNC_OK);
    assert_int_equal(err.struct_size, sizeof(err));
    assert_string_equal(err.message, "");
    wsync_error_clear(NULL);
    assert_int_equal(WSYNC_FAIL(NULL, WSYNC_ERR_SYSTEM, "no err"), WSYNC_ERR_SYSTEM);

    /* Long messages and function names are truncated, NUL-terminated. */
    char longer[1000];
    memset(longer, 'm', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    assert_int_equal(wsync_fail(&err, WSYNC_ERR_INTERNAL,
                                "a_function_name_much_longer_than_the_sixty_four_bytes_of_where_"
                                "in_the_error_struct",
                                "%s", longer),
                     WSYNC_ERR_INTERNAL);
    assert_int_equal(strlen(err.message), WSYNC_ERROR_MESSAGE_LEN - 1);
    assert_int_equal(strlen(err.where), WSYNC_ERROR_WHERE_LEN - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_plugin_v1_host),
        cmocka_unit_test(test_newer_plugin_v1_host),
        cmocka_unit_test(test_newer_plugin_v2_host),
        cmocka_unit_test(test_incompatible_plugin),
        cmocka_unit_test(test_host_newer),
        cmocka_unit_test(test_host_minimum_refuses_old_plugin),
        cmocka_unit_test(test_negotiate_unit),
        cmocka_unit_test(test_shrunken_struct_size),
        cmocka_unit_test(test_has_field),
        cmocka_unit_test(test_logging_respects_host_struct),
        cmocka_unit_test(test_strerror_covers_every_code),
        cmocka_unit_test(test_fail_first_error_wins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
