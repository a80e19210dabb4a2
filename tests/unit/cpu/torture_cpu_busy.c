/* The staging-reuse stress test (docs/DESIGN.md §1.1). The engine's copy stream is busy — a host
 * callback sleeps 2-5 ms right before each update — while the trainer reuses ONE staging buffer
 * and overwrites it the moment wait_consumed returns. With *consumed* recorded in stream order no
 * tensor may ever be torn. The same run against libwsync_cpu_broken.so (consumed recorded from
 * the calling thread, the early-consumed failure) must find torn tensors: proof that this test can
 * fail. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_test_util.h"

#define BUCKETS 200
#define TENSORS 8
#define TENSOR_BYTES (32u * 1024u)

typedef struct producer_args {
    const wsync_test_plugin_t *P;
    int fd;
    int status; /* 0 = every step succeeded */
} producer_args_t;

static void *producer_main(void *arg)
{
    producer_args_t *a = arg;
    const wsync_test_plugin_t *P = a->P;
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg),
                                  .bytes = TENSORS * TENSOR_BYTES,
                                  .flags = WSYNC_STAGING_FIXED_LAYOUT,
                                  .timeout_ms = 10000};
    wsync_staging_t *s;
    static uint64_t src[TENSORS][TENSOR_BYTES / 8];
    char names[TENSORS][32];
    wsync_stage_tensor_t t[TENSORS];

    a->status = 1;
    if (P->p->create(&cfg, &s, NULL) != WSYNC_OK)
        return NULL;
    for (int i = 0; i < TENSORS; i++) {
        snprintf(names[i], sizeof(names[i]), "layers.%d.mlp.weight", i);
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = names[i],
                                      .dtype = WSYNC_DTYPE_BF16,
                                      .ndim = 2,
                                      .shape = {TENSOR_BYTES / 256, 128},
                                      .src = src[i]};
    }
    for (uint64_t g = 1; g <= BUCKETS; g++) {
        const char *json;
        char *ack;
        uint64_t len;
        for (int i = 0; i < TENSORS; i++)
            wsync_test_fill(src[i], TENSOR_BYTES, g, (uint64_t)i);
        /* Overwrites the staging buffer right away: wait_consumed(g - 1) just returned. */
        if (P->p->stage(s, NULL, t, TENSORS, NULL) != WSYNC_OK ||
            P->p->publish(s, NULL, g == BUCKETS, &json, NULL, NULL) != WSYNC_OK ||
            wsync_test_send(a->fd, json, strlen(json)) != 0)
            return NULL;
        if (wsync_test_recv(a->fd, &ack, &len) != 0)
            return NULL;
        free(ack);
        if (P->p->wait_consumed(s, NULL, g, NULL) != WSYNC_OK)
            return NULL;
    }
    if (wsync_test_send(a->fd, NULL, 0) != 0)
        return NULL;
    char *closed;
    uint64_t len;
    if (wsync_test_recv(a->fd, &closed, &len) != 0)
        return NULL;
    free(closed);
    if (P->p->retire(s, NULL) != WSYNC_OK)
        return NULL;
    a->status = 0;
    return NULL;
}

static void busy_fn(void *user)
{
    unsigned ms = (unsigned)(uintptr_t)user;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs the whole exchange against `lib`; returns the number of torn tensors seen. */
static size_t run_busy(const char *lib)
{
    wsync_test_plugin_t P;
    wsync_consumer_t *c;
    wsync_handle_t *h = NULL;
    int sv[2];
    pthread_t thread;
    size_t torn = 0, buckets = 0;
    void *dst[TENSORS];

    assert_int_equal(wsync_test_load(&P, lib), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    producer_args_t args = {.P = &P, .fd = sv[1]};
    assert_int_equal(pthread_create(&thread, NULL, producer_main, &args), 0);

    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 10000};
    assert_int_equal(P.c->create(&cc, &c, NULL), WSYNC_OK);
    for (int i = 0; i < TENSORS; i++)
        assert_int_equal(P.c->mem_alloc(c, TENSOR_BYTES, &dst[i], NULL), WSYNC_OK);
    for (;;) {
        char *json = NULL;
        uint64_t len = 0;
        const wsync_manifest_t *m;
        wsync_copy_op_t ops[TENSORS];

        assert_int_equal(wsync_test_recv(sv[0], &json, &len), 0);
        if (len == 0) {
            free(json);
            break;
        }
        assert_int_equal(P.c->parse_manifest(c, json, len, &m, NULL), WSYNC_OK);
        free(json);
        assert_int_equal(m->n_tensors, TENSORS);
        if (h == NULL)
            assert_int_equal(P.c->open_handle(c, &m->buffer, &h, NULL), WSYNC_OK);
        uint64_t g = m->generation;
        /* The engine's stream is busy with other work when the update arrives. */
        uintptr_t ms = 2 + g % 4;
        assert_int_equal(P.c->enqueue_host_fn(c, NULL, busy_fn, (void *)ms, NULL), WSYNC_OK);
        wsync_test_ops(m, dst, ops);
        assert_int_equal(P.c->copy_weights(c, h, NULL, g, ops, TENSORS, 0, NULL), WSYNC_OK);
        assert_int_equal(P.c->record_consumed(c, h, 0, NULL), WSYNC_OK);
        assert_int_equal(wsync_test_send(sv[0], &g, 8), 0); /* ack: the trainer may go on */
        assert_int_equal(P.c->stream_synchronize(c, NULL, NULL), WSYNC_OK);
        for (int i = 0; i < TENSORS; i++)
            torn += wsync_test_check(dst[i], TENSOR_BYTES, g, (uint64_t)i) != 0;
        buckets++;
        P.c->manifest_free(c, m);
    }
    assert_int_equal(P.c->close_handle(c, h, NULL), WSYNC_OK);
    assert_int_equal(wsync_test_send(sv[0], "closed", 6), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(args.status, 0);
    assert_int_equal(buckets, BUCKETS);
    for (int i = 0; i < TENSORS; i++)
        P.c->mem_free(c, dst[i], NULL);
    assert_int_equal(P.c->finalize(c, NULL), WSYNC_OK);
    wsync_test_unload(&P);
    close(sv[0]);
    close(sv[1]);
    printf("%s: %zu torn tensors in %d buckets x %d tensors\n", lib, torn, BUCKETS, TENSORS);
    return torn;
}

static void test_busy_stream_no_torn_tensors(void **state)
{
    (void)state;
    assert_int_equal(run_busy(WSYNC_TEST_HOST_LIB), 0);
}

static void test_broken_fixture_is_caught(void **state)
{
    (void)state;
    assert_true(run_busy(WSYNC_TEST_BROKEN_LIB) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_busy_stream_no_torn_tensors),
        cmocka_unit_test(test_broken_fixture_is_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
