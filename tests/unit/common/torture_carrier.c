/* The stream-carrier table both backends share: one entry per stream, pending entries in table
 * order, an idle entry evicted (and reported for draining) only when the table is full, BUSY
 * (NULL) when every entry is pending, forget keeps the rest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "wsync_carrier.h"

static void *stream(uintptr_t i)
{
    return (void *)(i + 1);
}

static void test_one_entry_per_stream(void **state)
{
    (void)state;
    wsync_carriers_t t = {0};
    wsync_carrier_t ev;
    wsync_carrier_t *a = wsync_carriers_use(&t, stream(0), &ev);
    assert_non_null(a);
    assert_null(ev.stream);
    assert_null(a->event); /* new: the backend makes its event */
    a->event = (void *)0x100;
    a->pending = 1;
    a->mark = 7;
    assert_ptr_equal(wsync_carriers_use(&t, stream(0), &ev), a);
    assert_int_equal(a->mark, 7); /* found entries keep their state */
    assert_int_equal(t.n, 1);
}

static void test_pending_in_order_and_settle(void **state)
{
    (void)state;
    wsync_carriers_t t = {0};
    wsync_carrier_t ev, *out[WSYNC_CARRIER_MAX];
    for (uintptr_t i = 0; i < 5; i++)
        wsync_carriers_use(&t, stream(i), &ev)->pending = (i % 2 == 0);
    assert_int_equal(wsync_carriers_pending(&t, out), 3);
    assert_ptr_equal(out[0]->stream, stream(0));
    assert_ptr_equal(out[1]->stream, stream(2));
    assert_ptr_equal(out[2]->stream, stream(4));
    wsync_carriers_settle(&t);
    assert_int_equal(wsync_carriers_pending(&t, out), 0);
    assert_int_equal(t.n, 5);
}

static void test_full_table_evicts_idle_then_busy(void **state)
{
    (void)state;
    wsync_carriers_t t = {0};
    wsync_carrier_t ev;
    for (uintptr_t i = 0; i < WSYNC_CARRIER_MAX; i++) {
        wsync_carrier_t *u = wsync_carriers_use(&t, stream(i), &ev);
        u->event = (void *)(0x1000 + i);
        u->mark = 100 + i;
        u->pending = i != 3; /* only stream 3 is idle */
    }
    wsync_carrier_t *u = wsync_carriers_use(&t, stream(99), &ev);
    assert_non_null(u);
    assert_ptr_equal(ev.stream, stream(3)); /* reported so the backend drains it */
    assert_int_equal(ev.mark, 103);
    assert_ptr_equal(u->event, (void *)0x1003); /* the slot keeps its event */
    assert_ptr_equal(u->stream, stream(99));
    assert_int_equal(u->pending, 0);
    u->pending = 1;
    assert_null(wsync_carriers_use(&t, stream(100), &ev)); /* all pending: BUSY */
    assert_int_equal(t.n, WSYNC_CARRIER_MAX);
}

static void test_forget(void **state)
{
    (void)state;
    wsync_carriers_t t = {0};
    wsync_carrier_t ev;
    for (uintptr_t i = 0; i < 3; i++)
        wsync_carriers_use(&t, stream(i), &ev)->event = (void *)(0x10 + i);
    assert_ptr_equal(wsync_carriers_forget(&t, stream(0)), (void *)0x10);
    assert_null(wsync_carriers_forget(&t, stream(0)));
    assert_int_equal(t.n, 2);
    assert_ptr_equal(wsync_carriers_use(&t, stream(1), &ev)->event, (void *)0x11);
    assert_ptr_equal(wsync_carriers_use(&t, stream(2), &ev)->event, (void *)0x12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_entry_per_stream),
        cmocka_unit_test(test_pending_in_order_and_settle),
        cmocka_unit_test(test_full_table_evicts_idle_then_busy),
        cmocka_unit_test(test_forget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
