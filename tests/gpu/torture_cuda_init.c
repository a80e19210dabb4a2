/* libwsync_cuda.so loads on any machine; without a usable GPU or driver wsync_plugin_init says
 * so with WSYNC_ERR_NO_DEVICE and a message naming cudaGetDeviceCount, and with one it returns
 * the cuda tables. Runs everywhere (CI included): it needs no device to pass. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_abi.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static void test_init_or_no_device(void **state)
{
    (void)state;
    void *dl = dlopen(WSYNC_TEST_PLUGIN_DIR "/libwsync_cuda.so", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(dl);
    wsync_plugin_init_fn_t init = (wsync_plugin_init_fn_t)dlsym(dl, WSYNC_PLUGIN_INIT_SYMBOL);
    assert_non_null(init);
    assert_null(dlsym(dl, "wsync_cuda_copy_weights")); /* one exported symbol */
    uint32_t v = WSYNC_ABI_VERSION;
    const wsync_plugin_t *p = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t rc = init(&v, NULL, &p, &err);
    if (rc == WSYNC_ERR_NO_DEVICE) {
        printf("no device here: %s\n", err.message);
        assert_non_null(strstr(err.message, "cudaGetDeviceCount"));
        assert_non_null(strstr(err.message, "libwsync_cpu.so"));
        assert_null(p);
    } else {
        assert_int_equal(rc, WSYNC_OK);
        assert_string_equal(p->name, "cuda");
        assert_true(WSYNC_HAS_OP(wsync_consumer_ops_t, p->consumer, copy_weights));
        assert_true(WSYNC_HAS_OP(wsync_producer_ops_t, p->producer, retire));
    }
    assert_int_equal(v, WSYNC_ABI_VERSION_1);
    /* a host asking for version 0 is refused without touching the device */
    v = 0;
    err.code = WSYNC_OK;
    assert_int_equal(init(&v, NULL, &p, &err), WSYNC_ERR_INCOMPATIBLE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_init_or_no_device)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
