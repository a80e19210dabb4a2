/* Cross-process sync: a forked producer stages many buckets through ONE reused staging buffer;
 * this process consumes them with verified copies into its own memory. Manifests and acks
 * travel over a socketpair, as they would over an engine's RPC. Every tensor is checked
 * bit-exact against the pattern of its generation. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_test_util.h"
#include "wsync_test_publish.h"

#define BUCKETS 40
#define STAGING_BYTES (4u << 20)

/* Bucket b holds 1 + b % 7 tensors of varied sizes; names change per bucket. */
static size_t bucket_tensors(int b)
{
    return 1 + (size_t)(b % 7);
}

static int64_t tensor_elems(int b, size_t t)
{
    return 1 + (int64_t)((b * 7919 + (int)t * 104729) % 60000);
}

/* The producer process. Returns its exit status: 0 when every step succeeded. */
static int run_producer(int fd)
{
    wsync_test_plugin_t P;
    wsync_staging_t *s = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = STAGING_BYTES, .timeout_ms = 10000};
    void *src[8] = {0};
    char names[8][64];

    if (wsync_test_load(&P, WSYNC_TEST_HOST_LIB) != 0)
        return 10;
    if (P.p->create(&cfg, &s, &err) != WSYNC_OK)
        return 11;
    for (int b = 0; b < BUCKETS; b++) {
        uint64_t g = (uint64_t)b + 1, got;
        size_t n = bucket_tensors(b);
        wsync_stage_tensor_t t[8];
        const char *json;
        for (size_t i = 0; i < n; i++) {
            size_t bytes = (size_t)tensor_elems(b, i) * 8;
            src[i] = realloc(src[i], bytes);
            wsync_test_fill(src[i], bytes, g, i);
            snprintf(names[i], sizeof(names[i]), "bucket%d.t%zu", b, i);
            t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                          .name = names[i],
                                          .dtype = WSYNC_DTYPE_I64,
                                          .ndim = 1,
                                          .shape = {tensor_elems(b, i)},
                                          .src = src[i]};
        }
        if (P.p->stage(s, NULL, t, n, &err) != WSYNC_OK)
            return 12;
        if (P.p->publish(s, NULL, b == BUCKETS - 1, &json, &got, &err) != WSYNC_OK || got != g)
            return 13;
        if (wsync_test_send(fd, json, strlen(json)) != 0)
            return 14;
        char *ack;
        uint64_t len;
        if (wsync_test_recv(fd, &ack, &len) != 0 || len != 8 || memcmp(ack, &g, 8) != 0)
            return 15;
        free(ack);
        /* Reuse only after the consumer's copies are done. */
        if (P.p->wait_consumed(s, NULL, g, &err) != WSYNC_OK)
            return 16;
    }
    if (wsync_test_send(fd, NULL, 0) != 0)
        return 17;
    char *closed;
    uint64_t len;
    if (wsync_test_recv(fd, &closed, &len) != 0)
        return 18;
    free(closed);
    /* The consumer closed its handle: retire must now succeed. */
    if (P.p->retire(s, &err) != WSYNC_OK)
        return 19;
    for (int i = 0; i < 8; i++)
        free(src[i]);
    wsync_test_unload(&P);
    return 0;
}

static void test_cross_process_buckets(void **state)
{
    (void)state;
    int sv[2];
    wsync_test_plugin_t P;
    wsync_consumer_t *c;
    wsync_handle_t *h = NULL;
    const wsync_buffer_desc_t *first = NULL;
    wsync_buffer_desc_t first_desc;
    size_t tensors_checked = 0;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(sv[0]);
        _exit(run_producer(sv[1]));
    }
    close(sv[1]);

    assert_int_equal(wsync_test_load(&P, WSYNC_TEST_HOST_LIB), 0);
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 10000};
    assert_int_equal(P.c->create(&cc, &c, NULL), WSYNC_OK);
    for (;;) {
        char *json = NULL;
        uint64_t len = 0;
        const wsync_manifest_t *m;
        wsync_error_t err = {.struct_size = sizeof(err)};
        assert_int_equal(wsync_test_recv(sv[0], &json, &len), 0);
        if (len == 0) {
            free(json);
            break;
        }
        assert_int_equal(P.c->parse_manifest(c, json, len, &m, &err), WSYNC_OK);
        free(json);
        assert_int_equal(m->buffer.pid, (int64_t)child);
        if (h == NULL) {
            assert_int_equal(P.c->open_handle(c, &m->buffer, &h, &err), WSYNC_OK);
            first_desc = m->buffer;
            first = &first_desc;
        } else {
            /* One reused staging buffer: same key, the cached handle serves every bucket. */
            wsync_handle_t *again;
            assert_int_equal(P.c->open_handle(c, &m->buffer, &again, NULL), WSYNC_OK);
            assert_ptr_equal(again, h);
            assert_int_equal(P.c->close_handle(c, again, NULL), WSYNC_OK);
            assert_int_equal(memcmp(first->handle, m->buffer.handle, m->buffer.handle_len), 0);
        }
        void *dst[8];
        wsync_copy_op_t ops[8];
        assert_true(m->n_tensors <= 8);
        for (size_t i = 0; i < m->n_tensors; i++)
            assert_int_equal(P.c->mem_alloc(c, m->tensors[i].nbytes, &dst[i], NULL), WSYNC_OK);
        wsync_test_ops(m, dst, ops);
        assert_int_equal(P.c->copy_weights(c, h, NULL, m->generation, ops, m->n_tensors,
                                           WSYNC_COPY_VERIFY, &err),
                         WSYNC_OK);
        assert_int_equal(P.c->record_consumed(c, h, 1, &err), WSYNC_OK);
        uint64_t g = m->generation;
        assert_int_equal(wsync_test_send(sv[0], &g, 8), 0);
        for (size_t i = 0; i < m->n_tensors; i++) {
            assert_int_equal(m->tensors[i].nbytes % 8, 0);
            assert_int_equal(wsync_test_check(dst[i], m->tensors[i].nbytes, g, i), 0);
            tensors_checked++;
            P.c->mem_free(c, dst[i], NULL);
        }
        P.c->manifest_free(c, m);
    }
    assert_int_equal(P.c->close_handle(c, h, NULL), WSYNC_OK);
    assert_int_equal(wsync_test_send(sv[0], "closed", 6), 0);
    int status = -1;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    size_t want = 0;
    for (int b = 0; b < BUCKETS; b++)
        want += bucket_tensors(b);
    assert_int_equal(tensors_checked, want);
    assert_int_equal(P.c->finalize(c, NULL), WSYNC_OK);
    wsync_test_unload(&P);
    close(sv[0]);
}

/* A producer that dies before publishing ready: the consumer's wait ends with PEER_GONE (or
 * TIMEOUT) and no byte is written. */
static void test_producer_dies(void **state)
{
    (void)state;
    int sv[2];
    wsync_test_plugin_t P;
    wsync_consumer_t *c;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        wsync_test_plugin_t Q;
        wsync_staging_t *s;
        wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = 1 << 16};
        const char *json;
        static uint64_t data[512];
        wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                                  .name = "w",
                                  .dtype = WSYNC_DTYPE_I64,
                                  .ndim = 1,
                                  .shape = {512},
                                  .src = data};
        if (wsync_test_load(&Q, WSYNC_TEST_HOST_LIB) != 0 || Q.p->create(&cfg, &s, NULL) != 0 ||
            Q.p->stage(s, NULL, &t, 1, NULL) != 0 ||
            Q.p->publish(s, NULL, 0, &json, NULL, NULL) != 0)
            _exit(1);
        /* Announce generation 2, which this process will never make ready. */
        char *g2 = strdup(json);
        char *p = strstr(g2, "\"generation\":1");
        if (p == NULL)
            _exit(2);
        p[13] = '2';
        wsync_test_send(sv[1], g2, strlen(g2));
        char *go;
        uint64_t len;
        wsync_test_recv(sv[1], &go, &len); /* the consumer has mapped: die now */
        _exit(0);
    }
    close(sv[1]);
    assert_int_equal(wsync_test_load(&P, WSYNC_TEST_HOST_LIB), 0);
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 5000};
    assert_int_equal(P.c->create(&cc, &c, NULL), WSYNC_OK);
    char *json = NULL;
    uint64_t len = 0;
    const wsync_manifest_t *m;
    wsync_handle_t *h;
    assert_int_equal(wsync_test_recv(sv[0], &json, &len), 0);
    assert_int_equal(P.c->parse_manifest(c, json, len, &m, NULL), WSYNC_OK);
    free(json);
    assert_int_equal(m->generation, 2);
    assert_int_equal(P.c->open_handle(c, &m->buffer, &h, NULL), WSYNC_OK);
    char seg[WSYNC_HANDLE_MAX + 1];
    memcpy(seg, m->buffer.handle, m->buffer.handle_len);
    seg[m->buffer.handle_len] = '\0';
    /* never published: refused at once, nothing queued */
    wsync_copy_op_t none = {.dst = NULL};
    wsync_error_t early = {.struct_size = sizeof(early)};
    assert_int_equal(P.c->copy_weights(c, h, NULL, 2, &none, 0, 0, &early), WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(early.message, "generation 2 of buffer"));
    assert_non_null(strstr(early.message, "was never published (its producer's last is 1)"));
    assert_int_equal(wsync_test_mark_published(seg, 2), 0); /* published, ready still pending */
    assert_int_equal(wsync_test_send(sv[0], "go", 2), 0);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child); /* reaped: the pid is gone */
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    uint64_t dst[512];
    memset(dst, 0x3c, sizeof(dst));
    wsync_copy_op_t op = {.src_offset = m->tensors[0].offset,
                          .src_pitch = 4096,
                          .dst = dst,
                          .dst_pitch = 4096,
                          .dst_extent = 4096,
                          .rows = 1,
                          .row_bytes = 4096};
    assert_int_equal(P.c->copy_weights(c, h, NULL, 2, &op, 1, 0, NULL), WSYNC_OK);
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t r = P.c->record_consumed(c, h, 1, &err);
    assert_int_equal(r, WSYNC_ERR_PEER_GONE);
    for (size_t i = 0; i < 512; i++)
        assert_int_equal(dst[i], 0x3c3c3c3c3c3c3c3cull);
    assert_int_equal(P.c->close_handle(c, h, NULL), WSYNC_OK);
    /* The producer died with _exit (no exit handlers): the engine that saw it gone swept its
     * segment. */
    char name[WSYNC_HANDLE_MAX + 1];
    memcpy(name, m->buffer.handle, m->buffer.handle_len);
    name[m->buffer.handle_len] = '\0';
    assert_int_equal(shm_unlink(name), -1);
    assert_int_equal(errno, ENOENT);
    P.c->manifest_free(c, m);
    assert_int_equal(P.c->finalize(c, NULL), WSYNC_OK);
    wsync_test_unload(&P);
    close(sv[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_process_buckets),
        cmocka_unit_test(test_producer_dies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
