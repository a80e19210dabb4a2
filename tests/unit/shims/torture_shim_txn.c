/* Update transactions (engine-shims/common/wsync_txn.h): commit only with everything declared,
 * missing names named, older versions refused, abort and abandonment leave a version partial
 * only when it wrote, a resent tensor counted once, undeclared tensors refused. */
#include "wsync_txn.h" /* jansson's stdlib.h before cmocka's allocator macros */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static const char *const names[] = {"a.weight", "b.weight", "c.weight"};
/* the same three as a manifest's tensors */
static const wsync_tensor_desc_t descs[] = {{.name = "a.weight", .nbytes = 10},
                                            {.name = "b.weight", .nbytes = 20},
                                            {.name = "c.weight", .nbytes = 30}};

static void test_commit_needs_everything(void **state)
{
    (void)state;
    wsync_txn_t t;
    wsync_txn_init(&t);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_txn_begin(&t, 1, 3, 60, names, 3, &err), WSYNC_OK);
    wsync_txn_applied(&t, descs, 2, 1, 1234);
    assert_int_equal(wsync_txn_commit(&t, 1, &err), WSYNC_ERR_BAD_REQUEST);
    assert_non_null(strstr(err.message, "2 of 3 tensors and 30 of 60 bytes"));
    assert_non_null(strstr(err.message, "\"c.weight\""));
    assert_int_equal(t.phase, WSYNC_TXN_UPDATING);
    assert_int_equal(t.committed, 0);
    wsync_txn_applied(&t, descs, 1, 1, 1234); /* a.weight again: counted once */
    assert_int_equal(t.tensors, 2);
    wsync_txn_applied(&t, descs + 2, 1, 1, 1234);
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_txn_commit(&t, 1, &err), WSYNC_OK);
    assert_int_equal(t.committed, 1);
    assert_int_equal(t.phase, WSYNC_TXN_CONSISTENT);
    wsync_txn_free(&t);
}

static void test_versions_and_undeclared(void **state)
{
    (void)state;
    wsync_txn_t t;
    wsync_txn_init(&t);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_txn_begin(&t, 5, 0, 0, names, 2, &err), WSYNC_OK);
    assert_int_equal(wsync_txn_check(&t, descs + 2, 1, &err), WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "\"c.weight\" is not part of version 5"));
    wsync_txn_applied(&t, descs, 2, 1, 1);
    assert_int_equal(wsync_txn_commit(&t, 5, NULL), WSYNC_OK);
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_txn_begin(&t, 5, 0, 0, NULL, 0, &err), WSYNC_ERR_STALE_GENERATION);
    assert_non_null(strstr(err.message, "not newer than the committed version 5"));
    assert_int_equal(wsync_txn_begin(&t, 7, 0, 0, NULL, 0, NULL), WSYNC_OK);
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_txn_begin(&t, 6, 0, 0, NULL, 0, &err), WSYNC_ERR_STALE_GENERATION);
    assert_non_null(strstr(err.message, "older than version 7"));
    const char *dup[] = {"x", "x"};
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_txn_begin(&t, 8, 0, 0, dup, 2, &err), WSYNC_ERR_BAD_REQUEST);
    assert_non_null(strstr(err.message, "\"x\" is declared twice"));
    wsync_txn_free(&t);
}

static void test_abort_and_abandon(void **state)
{
    (void)state;
    wsync_txn_t t;
    wsync_txn_init(&t);
    assert_int_equal(wsync_txn_begin(&t, 1, 0, 0, NULL, 0, NULL), WSYNC_OK);
    assert_int_equal(wsync_txn_abort(&t, "aborted"), 1); /* nothing written */
    assert_int_equal(t.phase, WSYNC_TXN_CONSISTENT);
    assert_int_equal(wsync_txn_begin(&t, 2, 0, 0, NULL, 0, NULL), WSYNC_OK);
    wsync_txn_applied(&t, descs, 1, 1, 1);
    assert_int_equal(wsync_txn_begin(&t, 3, 0, 0, NULL, 0, NULL), WSYNC_OK); /* abandons 2 */
    wsync_txn_applied(&t, descs, 1, 1, 1);
    assert_int_equal(wsync_txn_abort(&t, "left unfinished"), 1);
    assert_int_equal(t.phase, WSYNC_TXN_PARTIAL);
    assert_non_null(strstr(t.reason, "version 3 left unfinished after 1 bucket"));
    json_t *s = wsync_txn_state(&t);
    assert_string_equal(json_string_value(json_object_get(s, "state")), "partial");
    assert_true(json_is_false(json_object_get(s, "consistent")));
    assert_int_equal(json_integer_value(json_object_get(s, "committed")), 0);
    json_decref(s);
    assert_int_equal(wsync_txn_commit(&t, 3, NULL), WSYNC_ERR_INVALID_ARGUMENT);
    wsync_txn_begin_implicit(&t);
    assert_int_equal(t.version, 4);
    assert_int_equal(wsync_txn_commit(&t, 0, NULL), WSYNC_OK);
    assert_int_equal(t.committed, 4);
    wsync_txn_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_needs_everything),
        cmocka_unit_test(test_versions_and_undeclared),
        cmocka_unit_test(test_abort_and_abandon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
