/* libwsync_cpu.so exports exactly one function, wsync_plugin_init (the version script hides
 * the rest). Checked with `nm -D --defined-only`, like jansson's symbol test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static void check_exports(const char *lib)
{
    char cmd[4096], line[1024];
    int init_seen = 0, lines = 0;

    snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s/%s' 2>&1", WSYNC_TEST_PLUGIN_DIR, lib);
    FILE *fp = popen(cmd, "r");
    assert_non_null(fp);
    while (fgets(line, sizeof(line), fp) != NULL) {
        char addr[64], type[8], name[512];
        lines++;
        if (sscanf(line, "%63s %7s %511s", addr, type, name) != 3)
            fail_msg("%s: unexpected nm output: %s", lib, line);
        if (strcmp(type, "A") == 0)
            continue; /* version node (WSYNC_1), not a symbol of code or data */
        char *at = strchr(name, '@');
        if (at != NULL)
            *at = '\0';
        if (strcmp(name, "wsync_plugin_init") != 0)
            fail_msg("%s exports %s (type %s); only wsync_plugin_init may be exported", lib, name,
                     type);
        assert_true(strcmp(type, "T") == 0);
        init_seen++;
    }
    assert_int_equal(pclose(fp), 0);
    assert_true(lines > 0);
    assert_int_equal(init_seen, 1);
}

static void test_host_exports_only_init(void **state)
{
    (void)state;
    check_exports("libwsync_cpu.so");
}

static void test_broken_fixture_exports_only_init(void **state)
{
    (void)state;
    check_exports("libwsync_cpu_broken.so");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_exports_only_init),
        cmocka_unit_test(test_broken_fixture_exports_only_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
