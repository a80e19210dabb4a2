/* Host streams: order, host callbacks, synchronize, joins, and the error rules (a failed
 * wait-ready skips the copies behind it; digest mismatches are reported, not hidden). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_stream.h"
#include "wsync_digest.h"

typedef struct order_log {
    int values[2048];
    _Atomic int n;
} order_log_t;

typedef struct order_item {
    order_log_t *log;
    int value;
} order_item_t;

static void append_fn(void *user)
{
    order_item_t *it = user;
    int k = atomic_fetch_add(&it->log->n, 1);
    it->log->values[k] = it->value;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_order_and_synchronize(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    static order_log_t log;
    static order_item_t items[1000];

    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    for (int i = 0; i < 1000; i++) {
        items[i] = (order_item_t){.log = &log, .value = i};
        assert_int_equal(wsync_cpu_stream_host_fn(s, append_fn, &items[i], NULL, NULL), WSYNC_OK);
    }
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(atomic_load(&log.n), 1000);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(log.values[i], i);
    wsync_cpu_stream_destroy(s);
}

typedef struct slow_flag {
    unsigned ms;
    _Atomic int done;
} slow_flag_t;

static void slow_fn(void *user)
{
    slow_flag_t *f = user;
    sleep_ms(f->ms);
    atomic_store(&f->done, 1);
}

static void test_synchronize_waits_and_wait_seq(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    slow_flag_t a = {.ms = 60}, b = {.ms = 60};
    uint64_t seq_a = 0, seq_b = 0;

    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(s, slow_fn, &a, &seq_a, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(s, slow_fn, &b, &seq_b, NULL), WSYNC_OK);
    assert_true(seq_b == seq_a + 1);
    /* Enqueue returned at once: the work is still in flight. */
    assert_int_equal(atomic_load(&a.done), 0);
    wsync_cpu_stream_wait(s, seq_a);
    assert_int_equal(atomic_load(&a.done), 1);
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(atomic_load(&b.done), 1);
    wsync_cpu_stream_destroy(s);
}

typedef struct check_bytes {
    const uint8_t *dst, *want;
    size_t n;
    int equal;
} check_bytes_t;

static void check_fn(void *user)
{
    check_bytes_t *c = user;
    c->equal = memcmp(c->dst, c->want, c->n) == 0;
}

static void test_copy_then_host_fn_sees_bytes(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    uint8_t src[4096], dst[4096];
    wsync_cpu_sink_t sink;

    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 7 + 1);
    memset(dst, 0, sizeof(dst));
    wsync_cpu_sink_init(&sink);
    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    /* Two ops: a 2-D strided one (16 rows of 64 bytes, pitch 128) and a 1-D one. */
    wsync_copy_op_t ops[2] = {
        {.src_offset = 0,
         .src_pitch = 128,
         .dst = dst,
         .dst_pitch = 128,
         .dst_extent = 2048,
         .rows = 16,
         .row_bytes = 64},
        {.src_offset = 2048,
         .src_pitch = 2048,
         .dst = dst + 2048,
         .dst_pitch = 2048,
         .dst_extent = 2048,
         .rows = 1,
         .row_bytes = 2048},
    };
    slow_flag_t delay = {.ms = 30};
    check_bytes_t chk = {.dst = dst + 2048, .want = src + 2048, .n = 2048};
    assert_int_equal(wsync_cpu_stream_host_fn(s, slow_fn, &delay, NULL, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_copy(s, src, ops, NULL, 2, 0, 1, &sink, NULL, NULL),
                     WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(s, check_fn, &chk, NULL, NULL), WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(chk.equal, 1);
    for (int r = 0; r < 16; r++) {
        assert_memory_equal(dst + r * 128, src + r * 128, 64);
        for (int k = 64; k < 128; k++)
            assert_int_equal(dst[r * 128 + k], 0); /* the gap between rows is not written */
    }
    assert_int_equal(wsync_cpu_sink_take(&sink, NULL), WSYNC_OK);
    wsync_cpu_stream_destroy(s);
    wsync_cpu_sink_destroy(&sink);
}

static wsync_control_t *new_control(void)
{
    wsync_control_t *c = test_calloc(1, sizeof(*c));
    wsync_control_init(c, WSYNC_CONTROL_SIZE, 0);
    return c;
}

static void test_wait_ready_timeout_skips_copies(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    wsync_cpu_sink_t sink;
    wsync_error_t err = {.struct_size = sizeof(err)};
    uint8_t src[256], dst[256];
    wsync_control_t *ctl = new_control();

    memset(src, 0x5a, sizeof(src));
    memset(dst, 0x11, sizeof(dst));
    wsync_cpu_sink_init(&sink);
    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    wsync_copy_op_t op = {.src_pitch = 256,
                          .dst = dst,
                          .dst_pitch = 256,
                          .dst_extent = 256,
                          .rows = 1,
                          .row_bytes = 256};
    assert_int_equal(wsync_cpu_stream_wait_ready(s, ctl, 1, 50, 0, &sink, NULL, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_copy(s, src, &op, NULL, 1, 0, 1, &sink, NULL, NULL),
                     WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_signal_consumed(s, ctl, 1, &sink, NULL, NULL), WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    for (size_t i = 0; i < sizeof(dst); i++)
        assert_int_equal(dst[i], 0x11);
    assert_int_equal(atomic_load(&ctl->consumed_generation), 0);
    assert_int_equal(wsync_cpu_sink_take(&sink, &err), WSYNC_ERR_TIMEOUT);
    assert_int_equal(err.code, WSYNC_ERR_TIMEOUT);
    assert_non_null(strstr(err.message, "generation 1"));
    /* Taken: the sink is clean again. */
    assert_int_equal(wsync_cpu_sink_take(&sink, NULL), WSYNC_OK);

    /* The next generation, once ready, goes through. */
    wsync_control_signal_ready(ctl, 2);
    assert_int_equal(wsync_cpu_stream_wait_ready(s, ctl, 2, 1000, 0, &sink, NULL, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_copy(s, src, &op, NULL, 1, 0, 2, &sink, NULL, NULL),
                     WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_signal_consumed(s, ctl, 2, &sink, NULL, NULL), WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    assert_memory_equal(dst, src, sizeof(src));
    assert_int_equal(atomic_load(&ctl->consumed_generation), 2);
    assert_int_equal(wsync_cpu_sink_take(&sink, NULL), WSYNC_OK);
    wsync_cpu_stream_destroy(s);
    wsync_cpu_sink_destroy(&sink);
    test_free(ctl);
}

static void test_wait_ready_blocks_until_signal(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    wsync_cpu_sink_t sink;
    uint8_t src[64], dst[64];
    wsync_control_t *ctl = new_control();

    memset(src, 0x77, sizeof(src));
    memset(dst, 0, sizeof(dst));
    wsync_cpu_sink_init(&sink);
    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    wsync_copy_op_t op = {
        .src_pitch = 64, .dst = dst, .dst_pitch = 64, .dst_extent = 64, .rows = 1, .row_bytes = 64};
    assert_int_equal(wsync_cpu_stream_wait_ready(s, ctl, 3, 5000, 0, &sink, NULL, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_copy(s, src, &op, NULL, 1, 0, 3, &sink, NULL, NULL),
                     WSYNC_OK);
    sleep_ms(40);
    wsync_control_signal_ready(ctl, 2); /* not enough */
    sleep_ms(20);
    assert_int_equal(dst[0], 0);
    wsync_control_signal_ready(ctl, 3);
    wsync_cpu_stream_synchronize(s);
    assert_memory_equal(dst, src, sizeof(src));
    assert_int_equal(wsync_cpu_sink_take(&sink, NULL), WSYNC_OK);
    wsync_cpu_stream_destroy(s);
    wsync_cpu_sink_destroy(&sink);
    test_free(ctl);
}

/* Stores a generation the way a GPU's stream memory write does: the word alone, no futex wake. */
static void *store_consumed_later(void *arg)
{
    wsync_control_t *ctl = arg;
    sleep_ms(5);
    atomic_store(&ctl->consumed_generation, 1); /* within the wait's spinning span */
    sleep_ms(60);
    atomic_store(&ctl->consumed_generation, 2); /* past it: seen through the sleeping slices */
    return NULL;
}

static void test_wait_sees_a_store_without_wake(void **state)
{
    (void)state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_control_t *ctl = new_control();
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, store_consumed_later, ctl), 0);
    assert_int_equal(wsync_control_wait_consumed(ctl, 1, 5000, 0, &err), WSYNC_OK);
    assert_int_equal(wsync_control_wait_consumed(ctl, 2, 5000, 0, &err), WSYNC_OK);
    assert_int_equal(atomic_load(&ctl->consumed_seq), 0); /* nobody woke the futex */
    assert_int_equal(pthread_join(t, NULL), 0);
    /* and a generation nobody stores still times out, naming it */
    assert_int_equal(wsync_control_wait_consumed(ctl, 3, 30, 0, &err), WSYNC_ERR_TIMEOUT);
    assert_non_null(strstr(err.message, "generation 3"));
    test_free(ctl);
}

static void test_peer_gone(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    wsync_cpu_sink_t sink;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_control_t *ctl = new_control();

    pid_t child = fork();
    if (child == 0)
        _exit(0);
    assert_true(child > 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    wsync_cpu_sink_init(&sink);
    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_wait_ready(s, ctl, 1, 10000, child, &sink, NULL, NULL),
                     WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(wsync_cpu_sink_take(&sink, &err), WSYNC_ERR_PEER_GONE);
    assert_non_null(strstr(err.message, "exited"));
    wsync_cpu_stream_destroy(s);
    wsync_cpu_sink_destroy(&sink);
    test_free(ctl);
}

static void test_digest_mismatch_reported(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    wsync_cpu_sink_t sink;
    wsync_error_t err = {.struct_size = sizeof(err)};
    enum { N = 300000 }; /* several verify chunks, odd tail */
    uint8_t *src = malloc(N), *dst = calloc(1, N);

    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)(i ^ (i >> 9));
    wsync_cpu_sink_init(&sink);
    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    wsync_copy_op_t ops[3] = {
        {.src_offset = 0,
         .src_pitch = 1000,
         .dst = dst,
         .dst_pitch = 1000,
         .dst_extent = 100000,
         .rows = 100,
         .row_bytes = 999},
        {.src_offset = 100000,
         .src_pitch = 100001,
         .dst = dst + 100000,
         .dst_pitch = 100001,
         .dst_extent = 100001,
         .rows = 1,
         .row_bytes = 100001},
        {.src_offset = 200001,
         .src_pitch = 99999,
         .dst = dst + 200001,
         .dst_pitch = 99999,
         .dst_extent = 99999,
         .rows = 1,
         .row_bytes = 99999},
    };
    /* Digests of the bytes each op reads, rows concatenated. */
    for (int k = 0; k < 3; k++) {
        wsync64_state_t st;
        wsync64_init(&st);
        for (uint64_t r = 0; r < ops[k].rows; r++)
            wsync64_update(&st, src + ops[k].src_offset + r * ops[k].src_pitch, ops[k].row_bytes);
        ops[k].digest = wsync64_final(&st);
        ops[k].has_digest = 1;
    }
    assert_int_equal(
        wsync_cpu_stream_copy(s, src, ops, NULL, 3, WSYNC_COPY_VERIFY, 1, &sink, NULL, NULL),
        WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(wsync_cpu_sink_take(&sink, NULL), WSYNC_OK);

    ops[1].digest ^= 1;
    memset(dst, 0, N);
    assert_int_equal(
        wsync_cpu_stream_copy(s, src, ops, NULL, 3, WSYNC_COPY_VERIFY, 2, &sink, NULL, NULL),
        WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(wsync_cpu_sink_take(&sink, &err), WSYNC_ERR_DIGEST_MISMATCH);
    assert_non_null(strstr(err.message, "op 1"));
    assert_non_null(strstr(err.message, "1 of 3"));
    /* The bytes are written anyway (documented: verify reports, it does not roll back). */
    assert_memory_equal(dst + 100000, src + 100000, 100001);

    /* Without the flag, digests are not checked. */
    assert_int_equal(wsync_cpu_stream_copy(s, src, ops, NULL, 3, 0, 3, &sink, NULL, NULL),
                     WSYNC_OK);
    wsync_cpu_stream_synchronize(s);
    assert_int_equal(wsync_cpu_sink_take(&sink, NULL), WSYNC_OK);
    wsync_cpu_stream_destroy(s);
    wsync_cpu_sink_destroy(&sink);
    free(src);
    free(dst);
}

static void test_join(void **state)
{
    (void)state;
    wsync_cpu_stream_t *a, *b, *w;
    slow_flag_t fa = {.ms = 50}, fb = {.ms = 80};
    static order_log_t log;
    order_item_t after = {.log = &log, .value = 42};

    assert_int_equal(wsync_cpu_stream_create(&a, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_create(&b, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_create(&w, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(a, slow_fn, &fa, NULL, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(b, slow_fn, &fb, NULL, NULL), WSYNC_OK);
    wsync_cpu_stream_t *others[2] = {a, b};
    assert_int_equal(wsync_cpu_stream_join(w, others, 2, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(w, append_fn, &after, NULL, NULL), WSYNC_OK);
    wsync_cpu_stream_synchronize(w);
    /* w ran past the join only after both a and b had finished their work. */
    assert_int_equal(atomic_load(&fa.done), 1);
    assert_int_equal(atomic_load(&fb.done), 1);
    assert_int_equal(atomic_load(&log.n), 1);
    wsync_cpu_stream_destroy(a);
    wsync_cpu_stream_destroy(b);
    wsync_cpu_stream_destroy(w);
}

static void test_destroy_drains(void **state)
{
    (void)state;
    wsync_cpu_stream_t *s;
    slow_flag_t f = {.ms = 30};

    assert_int_equal(wsync_cpu_stream_create(&s, NULL), WSYNC_OK);
    assert_int_equal(wsync_cpu_stream_host_fn(s, slow_fn, &f, NULL, NULL), WSYNC_OK);
    wsync_cpu_stream_destroy(s);
    assert_int_equal(atomic_load(&f.done), 1);
    wsync_cpu_stream_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_synchronize),
        cmocka_unit_test(test_synchronize_waits_and_wait_seq),
        cmocka_unit_test(test_copy_then_host_fn_sees_bytes),
        cmocka_unit_test(test_wait_ready_timeout_skips_copies),
        cmocka_unit_test(test_wait_ready_blocks_until_signal),
        cmocka_unit_test(test_wait_sees_a_store_without_wake),
        cmocka_unit_test(test_peer_gone),
        cmocka_unit_test(test_digest_mismatch_reported),
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_destroy_drains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
