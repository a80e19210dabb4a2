/* Fault injection on the CPU backend (docs/RELIABILITY.md, "Faults"). Trainer and engine run in
 * separate processes (this executable re-executed in a child role) and one of them is SIGKILLed
 * in the middle of a bucket. The commit rule under test: a bucket's copies start only after the
 * producer's *ready* for that generation, and the staging segment stays mapped in the consumer
 * even when its producer dies — so an engine ends with every parameter of the old generation or
 * every parameter of the new one, never a mix, and says why within its timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* Buffers cross the plugin and harness boundary (allocated there, freed here): real allocator. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#include "rel_harness.h"
#include "wsync_test_publish.h"
#include "wsync_client.h"

#define N_TENSORS 16
#define TENSOR_BYTES (4u << 20) /* 64 MiB per bucket: staging takes long enough to interrupt */
#define TIMEOUT_MS 2000u
#define SLACK_MS 1500

static rel_plugin_t plugin;

/* ------------------------------------------------------------ child roles */

/* Trainer: commands "bucket" (stage + publish, replies the manifest), "wait <g>" (replies "OK" or
 * "ERR <code> <message>"), "exit" (exit without retiring). */
static int role_producer(int fd, int argc, char **argv)
{
    rel_producer_t p;
    (void)argc;
    (void)argv;
    rel_plugin_load(&plugin);
    rel_producer_create(&p, &plugin, N_TENSORS, TENSOR_BYTES, TIMEOUT_MS);
    for (;;) {
        char *cmd = rel_recv(fd, 60000);
        wsync_error_t err = rel_err();
        if (cmd == NULL || strcmp(cmd, "exit") == 0) {
            free(cmd);
            _exit(0);
        }
        if (strcmp(cmd, "bucket") == 0) {
            wsync_result_t r = rel_producer_bucket(&p, &err);
            /* Reply once *ready* has fired, so the parent knows the bucket is committed. */
            if (r == WSYNC_OK && p.stream != NULL &&
                WSYNC_HAS_OP(wsync_producer_ops_t, plugin.P, stream_synchronize))
                r = plugin.P->stream_synchronize(p.s, p.stream, &err);
            if (r == WSYNC_OK)
                rel_send(fd, p.manifest, strlen(p.manifest));
            else
                rel_sendf(fd, "ERR %d %s", (int)r, err.message);
        } else if (strncmp(cmd, "wait ", 5) == 0) {
            wsync_result_t r =
                plugin.P->wait_consumed(p.s, p.stream, strtoull(cmd + 5, NULL, 10), &err);
            if (r == WSYNC_OK)
                rel_sendf(fd, "OK");
            else
                rel_sendf(fd, "ERR %d %s", (int)r, err.message);
        }
        free(cmd);
    }
}

/* Engine: for every manifest received: parse, open, copy (VERIFY), reply "copying"; then on
 * "record": record_consumed(wait), check the weights, close, reply "OK" or "ERR ...". On EOF:
 * finalize and exit 0. */
static int role_engine(int fd, int argc, char **argv)
{
    rel_engine_t e;
    (void)argc;
    (void)argv;
    rel_plugin_load(&plugin);
    rel_engine_create(&e, &plugin, N_TENSORS, TENSOR_BYTES, TIMEOUT_MS, NULL);
    for (;;) {
        char *json = rel_recv(fd, 60000);
        if (json == NULL)
            break;
        wsync_error_t err = rel_err();
        const wsync_manifest_t *m = NULL;
        wsync_handle_t *h = NULL;
        wsync_result_t r = plugin.C->parse_manifest(e.c, json, strlen(json), &m, &err);
        if (r == WSYNC_OK)
            r = plugin.C->open_handle(e.c, &m->buffer, &h, &err);
        if (r == WSYNC_OK) {
            wsync_copy_op_t *ops = rel_engine_ops(&e, m);
            r = plugin.C->copy_weights(e.c, h, NULL, m->generation, ops, m->n_tensors,
                                       WSYNC_COPY_VERIFY, &err);
            free(ops);
        }
        rel_sendf(fd, "copying");
        char *cmd = rel_recv(fd, 60000);
        if (r == WSYNC_OK && cmd != NULL && strcmp(cmd, "record") == 0)
            r = plugin.C->record_consumed(e.c, h, 1, &err);
        if (r == WSYNC_OK && !rel_engine_is_gen(&e, m->generation))
            r = WSYNC_ERR_DIGEST_MISMATCH;
        if (h != NULL)
            plugin.C->close_handle(e.c, h, &err);
        if (r == WSYNC_OK)
            rel_sendf(fd, "OK");
        else
            rel_sendf(fd, "ERR %d %s", (int)r, err.message);
        if (m != NULL)
            plugin.C->manifest_free(e.c, m);
        free(cmd);
        free(json);
    }
    rel_engine_destroy(&e);
    return 0;
}

/* ------------------------------------------------------------------ tests */

static char *expect_reply(int fd, const char *prefix)
{
    char *msg = rel_recv(fd, 20000);
    if (msg == NULL)
        fail_msg("no reply from child (expected \"%s\")", prefix);
    if (strncmp(msg, prefix, strlen(prefix)) != 0)
        fail_msg("child replied \"%.300s\", expected \"%s\"", msg, prefix);
    return msg;
}

/* A new engine that has started copying p's current bucket, SIGKILLed mid-copy. */
static void engine_killed_mid_copy(const rel_producer_t *p)
{
    int fd;
    pid_t pid = rel_spawn("engine", &fd, NULL);
    rel_send(fd, p->manifest, strlen(p->manifest));
    free(expect_reply(fd, "copying"));
    rel_kill(pid);
    close(fd);
}

/* The engine on fd copies p's current bucket and records it consumed. */
static void engine_sync(int fd, const rel_producer_t *p)
{
    rel_send(fd, p->manifest, strlen(p->manifest));
    free(expect_reply(fd, "copying"));
    rel_sendf(fd, "record");
    free(expect_reply(fd, "OK"));
}

/* Producer SIGKILLed at a varying point of bucket 2 while the engine waits on it. */
static void test_producer_killed_mid_bucket(void **state)
{
    /* Delays after "bucket" before the kill (ms); -1: after the manifest came back. */
    static const int delays[] = {0, 0, 1, 2, 4, 8, 15, 30, -1};
    const size_t n_trials = sizeof(delays) / sizeof(delays[0]);
    int old_kept = 0, new_taken = 0;
    (void)state;

    rel_engine_t e;
    rel_engine_create(&e, &plugin, N_TENSORS, TENSOR_BYTES, TIMEOUT_MS, NULL);
    for (size_t trial = 0; trial < n_trials; trial++) {
        int fd;
        wsync_error_t err = rel_err();
        pid_t pid = rel_spawn("producer", &fd, NULL);

        /* Generation 1 completes normally. */
        rel_sendf(fd, "bucket");
        char *m1 = expect_reply(fd, "{");
        wsync_result_t r = rel_engine_sync(&e, m1, &err);
        if (r != WSYNC_OK)
            fail_msg("sync of generation 1: %s: %s", wsync_strerror(r), err.message);
        assert_true(rel_engine_is_gen(&e, 1));
        rel_sendf(fd, "wait 1");
        free(expect_reply(fd, "OK"));

        /* Generation 2: the engine enqueues its copies (they wait for ready), the trainer dies. */
        const wsync_manifest_t *m = NULL;
        wsync_handle_t *h = NULL;
        assert_int_equal(plugin.C->parse_manifest(e.c, m1, strlen(m1), &m, &err), WSYNC_OK);
        assert_int_equal(plugin.C->open_handle(e.c, &m->buffer, &h, &err), WSYNC_OK);
        wsync_copy_op_t *ops = rel_engine_ops(&e, m);
        for (size_t k = 0; k < m->n_tensors; k++)
            ops[k].has_digest = 0; /* the digests of generation 1 do not hold for 2 */
        char seg[WSYNC_HANDLE_MAX + 1];
        memcpy(seg, m->buffer.handle, m->buffer.handle_len);
        seg[m->buffer.handle_len] = '\0';
        assert_int_equal(wsync_test_mark_published(seg, 2), 0); /* its *ready* still to come */
        assert_int_equal(plugin.C->copy_weights(e.c, h, NULL, 2, ops, m->n_tensors, 0, &err),
                         WSYNC_OK);
        rel_sendf(fd, "bucket");
        if (delays[trial] < 0)
            free(expect_reply(fd, "{"));
        else if (delays[trial] > 0)
            usleep((useconds_t)delays[trial] * 1000u);
        rel_kill(pid);
        long t0 = rel_now_ms();
        r = plugin.C->record_consumed(e.c, h, 1, &err);
        long waited = rel_now_ms() - t0;

        assert_true(waited <= (long)TIMEOUT_MS + SLACK_MS);
        if (r == WSYNC_OK) {
            assert_true(rel_engine_is_gen(&e, 2));
            new_taken++;
        } else {
            print_message("trial %zu (kill after %d ms): %s: %s\n", trial, delays[trial],
                          wsync_strerror(r), err.message);
            assert_true(r == WSYNC_ERR_PEER_GONE || r == WSYNC_ERR_TIMEOUT);
            assert_true(err.message[0] != '\0');
            assert_true(rel_engine_is_gen(&e, 1));
            old_kept++;
        }
        if (delays[trial] < 0)
            assert_int_equal(r, WSYNC_OK); /* ready fired before the kill: the bucket commits */

        wsync_error_t cerr = rel_err();
        plugin.C->close_handle(e.c, h, &cerr);
        plugin.C->manifest_free(e.c, m);
        free(ops);
        free(m1);
        close(fd);
        rel_unlink_shm_of(pid); /* a SIGKILLed producer cannot unlink its segment */
    }
    print_message("producer killed in %zu buckets: %d kept the old generation, %d committed the "
                  "new one, 0 mixed\n",
                  n_trials, old_kept, new_taken);
    assert_true(old_kept >= 1 && new_taken >= 1);

    /* The engine is still usable: a restarted trainer syncs. */
    int fd;
    wsync_error_t err = rel_err();
    pid_t pid = rel_spawn("producer", &fd, NULL);
    rel_sendf(fd, "bucket");
    char *m1 = expect_reply(fd, "{");
    assert_int_equal(rel_engine_sync(&e, m1, &err), WSYNC_OK);
    assert_true(rel_engine_is_gen(&e, 1));
    free(m1);
    rel_sendf(fd, "exit");
    assert_int_equal(rel_wait_exit(pid, 10000), 0);
    close(fd);
    rel_engine_destroy(&e);
    rel_unlink_shm_of(pid); /* it exited without retiring (as a crashed trainer would) */
}

/* Engine SIGKILLed while its copies run: the trainer's wait_consumed reports it within its
 * timeout, the staging buffer stays valid, and a restarted engine completes the sync. */
static void test_engine_killed_mid_copy(void **state)
{
    rel_producer_t p;
    wsync_error_t err = rel_err();
    int fd;
    (void)state;

    rel_producer_create(&p, &plugin, N_TENSORS, TENSOR_BYTES, TIMEOUT_MS);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    engine_killed_mid_copy(&p);

    long t0 = rel_now_ms();
    wsync_result_t r = plugin.P->wait_consumed(p.s, p.stream, 1, &err);
    long waited = rel_now_ms() - t0;
    print_message("engine killed mid-copy: wait_consumed after %ld ms: %s: %s\n", waited,
                  wsync_strerror(r), err.message);
    assert_true(r == WSYNC_ERR_TIMEOUT || r == WSYNC_ERR_PEER_GONE);
    assert_non_null(strstr(err.message, "generation 1"));
    assert_true(waited <= (long)TIMEOUT_MS + SLACK_MS);

    /* A restarted engine consumes the same, still valid, bucket; then the next one. */
    pid_t pid = rel_spawn("engine", &fd, NULL);
    engine_sync(fd, &p);
    err = rel_err();
    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 1, &err), WSYNC_OK);

    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    engine_sync(fd, &p);
    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 2, &err), WSYNC_OK);
    close(fd); /* the engine closes its handle and exits */
    assert_int_equal(rel_wait_exit(pid, 10000), 0);

    /* Retiring is test_retire_after_consumer_crash's subject: here just clean up. */
    err = rel_err();
    if (plugin.P->retire(p.s, &err) != WSYNC_OK)
        rel_unlink_shm_of(getpid());
    rel_producer_destroy(&p, 0);
}

/* A SIGKILLed engine never closes its mapping; once every live engine has closed, the trainer
 * must still be able to retire (not BUSY forever because of a dead process). */
static void test_retire_after_consumer_crash(void **state)
{
    rel_producer_t p;
    wsync_error_t err = rel_err();
    (void)state;

    rel_producer_create(&p, &plugin, 2, 4096, TIMEOUT_MS);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    engine_killed_mid_copy(&p);

    long t0 = rel_now_ms();
    wsync_result_t r;
    do {
        err = rel_err();
        r = plugin.P->retire(p.s, &err);
    } while (r == WSYNC_ERR_BUSY && rel_now_ms() - t0 < (long)TIMEOUT_MS + SLACK_MS &&
             usleep(50000) == 0);
    if (r != WSYNC_OK) {
        rel_unlink_shm_of(getpid());
        fail_msg("retire after the only consumer was SIGKILLed: %s: %s", wsync_strerror(r),
                 err.message);
    }
    rel_producer_destroy(&p, 0);
}

/* A manifest replayed with an old (or the same) generation is refused; weights stay. The engine
 * keeps its handle open across syncs when `keep_open`, else closes it after each (both are
 * legitimate: the generation record must not live only in the mapping). */
static void replay_case(int keep_open)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    const wsync_manifest_t *m0 = NULL;
    wsync_handle_t *h0 = NULL;

    rel_producer_create(&p, &plugin, 4, 4096, TIMEOUT_MS);
    rel_engine_create(&e, &plugin, 4, 4096, TIMEOUT_MS, NULL);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    char *m1 = strdup(p.manifest);
    if (keep_open) {
        assert_int_equal(plugin.C->parse_manifest(e.c, m1, strlen(m1), &m0, &err), WSYNC_OK);
        assert_int_equal(plugin.C->open_handle(e.c, &m0->buffer, &h0, &err), WSYNC_OK);
    }
    assert_int_equal(rel_engine_sync(&e, m1, &err), WSYNC_OK);
    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 1, &err), WSYNC_OK);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    char *m2 = strdup(p.manifest);
    assert_int_equal(rel_engine_sync(&e, m2, &err), WSYNC_OK);
    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 2, &err), WSYNC_OK);
    assert_true(rel_engine_is_gen(&e, 2));

    const char *replays[] = {m1, m2};
    for (size_t i = 0; i < 2; i++) {
        err = rel_err();
        wsync_result_t r = rel_engine_sync(&e, replays[i], &err);
        print_message("replay of generation %zu (handle %s): %s: %s\n", i + 1,
                      keep_open ? "kept open" : "closed between syncs", wsync_strerror(r),
                      err.message);
        assert_int_equal(r, WSYNC_ERR_STALE_GENERATION);
        assert_true(err.message[0] != '\0');
        assert_true(rel_engine_is_gen(&e, 2));
    }
    if (keep_open) {
        assert_int_equal(plugin.C->close_handle(e.c, h0, &err), WSYNC_OK);
        plugin.C->manifest_free(e.c, m0);
    }
    free(m1);
    free(m2);
    rel_engine_destroy(&e);
    rel_producer_destroy(&p, 1);
}

static void test_replayed_manifest_refused(void **state)
{
    (void)state;
    replay_case(1);
}

static void test_replayed_manifest_refused_after_close(void **state)
{
    (void)state;
    replay_case(0);
}

/* retire is refused (BUSY) while the engine has the buffer mapped, and works once it closed. */
static void test_retire_while_mapped_busy(void **state)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    const wsync_manifest_t *m = NULL;
    wsync_handle_t *h = NULL;
    (void)state;

    int before = rel_count_shm(getpid());
    rel_producer_create(&p, &plugin, 2, 1024, 500);
    rel_engine_create(&e, &plugin, 2, 1024, TIMEOUT_MS, NULL);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    assert_int_equal(plugin.C->parse_manifest(e.c, p.manifest, strlen(p.manifest), &m, &err),
                     WSYNC_OK);
    assert_int_equal(plugin.C->open_handle(e.c, &m->buffer, &h, &err), WSYNC_OK);
    wsync_copy_op_t *ops = rel_engine_ops(&e, m);
    assert_int_equal(plugin.C->copy_weights(e.c, h, NULL, 1, ops, m->n_tensors, 0, &err), WSYNC_OK);
    assert_int_equal(plugin.C->record_consumed(e.c, h, 1, &err), WSYNC_OK);
    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 1, &err), WSYNC_OK);

    for (int attempt = 0; attempt < 2; attempt++) {
        err = rel_err();
        wsync_result_t r = plugin.P->retire(p.s, &err);
        print_message("retire while mapped: %s: %s\n", wsync_strerror(r), err.message);
        assert_int_equal(r, WSYNC_ERR_BUSY);
        assert_true(err.message[0] != '\0');
        assert_true(rel_shm_exists(m->buffer.handle, m->buffer.handle_len));
    }
    assert_int_equal(plugin.C->close_handle(e.c, h, &err), WSYNC_OK);
    assert_int_equal(plugin.P->retire(p.s, &err), WSYNC_OK);
    assert_false(rel_shm_exists(m->buffer.handle, m->buffer.handle_len));
    assert_int_equal(rel_count_shm(getpid()), before);
    plugin.C->manifest_free(e.c, m);
    free(ops);
    rel_producer_destroy(&p, 0);
    rel_engine_destroy(&e);
}

int main(int argc, char **argv)
{
    static const char *const roles[] = {"producer", "engine"};
    static const rel_role_fn fns[] = {role_producer, role_engine};
    int rc = rel_child_main(argc, argv, roles, fns, 2);
    if (rc >= 0)
        return rc;

    rel_plugin_load(&plugin);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replayed_manifest_refused),
        cmocka_unit_test(test_replayed_manifest_refused_after_close),
        cmocka_unit_test(test_retire_while_mapped_busy),
        cmocka_unit_test(test_engine_killed_mid_copy),
        cmocka_unit_test(test_retire_after_consumer_crash),
        cmocka_unit_test(test_producer_killed_mid_bucket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
