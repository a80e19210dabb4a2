/* Direct mode on the CPU plugin (WSYNC_STAGING_DIRECT): a producer names tensors in its own
 * memory, the consumer reads them with one copy_segments from the manifest's host_pid segments.
 * The producer runs in a child process, so every read crosses processes. Bad inputs (a segment
 * index out of range, an op outside its segment, a copy_weights against the synchronisation
 * buffer, a segment handle passed to copy_weights) are refused and every destination byte stays. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_test_util.h"

static wsync_test_plugin_t P;

#define NT 3
static const int64_t rows[NT] = {64, 17, 300}; /* x 32 float32 each */
#define COLS 32

static int group_setup(void **state)
{
    (void)state;
    return wsync_test_load(&P, WSYNC_TEST_HOST_LIB);
}

static int group_teardown(void **state)
{
    (void)state;
    wsync_test_unload(&P);
    return 0;
}

/* Child: tensors in three separate allocations (one of them a big one of its own mapping),
 * filled for generation g; publishes `gens` generations, each after the parent's go byte, and
 * writes each manifest down the pipe (length, text). */
static void producer(int to_parent, int from_parent, int gens)
{
    void *src[NT];
    for (int i = 0; i < NT; i++)
        src[i] = malloc((size_t)rows[i] * COLS * 4 + (i == 2 ? (8u << 20) : 0));
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = 0, .flags = WSYNC_STAGING_DIRECT, .timeout_ms = 5000};
    wsync_staging_t *s = NULL;
    if (P.p->create(&cfg, &s, NULL) != WSYNC_OK)
        _exit(2);
    for (int g = 1; g <= gens; g++) {
        char go;
        if (read(from_parent, &go, 1) != 1)
            _exit(3);
        wsync_stage_tensor_t t[NT];
        char names[NT][32];
        for (int i = 0; i < NT; i++) {
            snprintf(names[i], sizeof(names[i]), "layers.%d.weight", i);
            wsync_test_fill(src[i], (size_t)rows[i] * COLS * 4, (uint64_t)g, (uint64_t)i);
            t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                          .name = names[i],
                                          .dtype = WSYNC_DTYPE_F32,
                                          .ndim = 2,
                                          .shape = {rows[i], COLS},
                                          .src = src[i]};
        }
        const char *json = NULL;
        uint64_t gen = 0;
        if (g > 1 && P.p->wait_consumed(s, NULL, (uint64_t)g - 1, NULL) != WSYNC_OK)
            _exit(4);
        if (P.p->stage(s, NULL, t, NT, NULL) != WSYNC_OK ||
            P.p->publish(s, NULL, 1, &json, &gen, NULL) != WSYNC_OK)
            _exit(5);
        uint32_t len = (uint32_t)strlen(json);
        if (write(to_parent, &len, 4) != 4 || write(to_parent, json, len) != (ssize_t)len)
            _exit(6);
    }
    char bye;
    if (read(from_parent, &bye, 1) != 1) /* the parent closed its handles */
        _exit(7);
    _exit(P.p->wait_consumed(s, NULL, (uint64_t)gens, NULL) == WSYNC_OK &&
                  P.p->retire(s, NULL) == WSYNC_OK
              ? 0
              : 8);
}

typedef struct run {
    pid_t pid;
    int rd, wr;
    wsync_consumer_t *c;
    void *dst[NT];
} run_t;

static void start(run_t *r, int gens)
{
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        close(up[0]);
        close(down[1]);
        producer(up[1], down[0], gens);
    }
    close(up[1]);
    close(down[0]);
    r->rd = up[0];
    r->wr = down[1];
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 5000};
    assert_int_equal(P.c->create(&cc, &r->c, NULL), WSYNC_OK);
    for (int i = 0; i < NT; i++) {
        r->dst[i] = malloc((size_t)rows[i] * COLS * 4);
        memset(r->dst[i], 0xAB, (size_t)rows[i] * COLS * 4);
    }
}

static char *next_manifest(run_t *r)
{
    char go = 'g';
    assert_int_equal(write(r->wr, &go, 1), 1);
    uint32_t len;
    assert_int_equal(read(r->rd, &len, 4), 4);
    char *json = malloc(len + 1);
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(r->rd, json + got, len - got);
        assert_true(k > 0);
        got += (size_t)k;
    }
    json[len] = '\0';
    return json;
}

static void finish(run_t *r)
{
    char bye = 'b';
    assert_int_equal(write(r->wr, &bye, 1), 1);
    int status = 0;
    assert_int_equal(waitpid(r->pid, &status, 0), r->pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(P.c->finalize(r->c, NULL), WSYNC_OK);
    for (int i = 0; i < NT; i++)
        free(r->dst[i]);
    close(r->rd);
    close(r->wr);
}

/* ops of every tensor, by name, into r->dst */
static void plan(run_t *r, const wsync_manifest_t *m, wsync_copy_op_t *ops, uint32_t *seg)
{
    for (size_t k = 0; k < m->n_tensors; k++) {
        int i = m->tensors[k].name[7] - '0';
        ops[k] = (wsync_copy_op_t){.src_offset = m->tensors[k].offset,
                                   .rows = 1,
                                   .row_bytes = m->tensors[k].nbytes,
                                   .src_pitch = m->tensors[k].nbytes,
                                   .dst_pitch = m->tensors[k].nbytes,
                                   .dst = r->dst[i],
                                   .dst_extent = (uint64_t)rows[i] * COLS * 4};
        seg[k] = m->tensor_segment[k];
    }
}

static void check_dst(run_t *r, uint64_t g)
{
    for (int i = 0; i < NT; i++)
        assert_int_equal(wsync_test_check(r->dst[i], (size_t)rows[i] * COLS * 4, g, (uint64_t)i),
                         0);
}

static void assert_untouched(run_t *r)
{
    for (int i = 0; i < NT; i++)
        for (size_t b = 0; b < (size_t)rows[i] * COLS * 4; b++)
            if (((unsigned char *)r->dst[i])[b] != 0xAB)
                fail_msg("dst %d byte %zu written by a refused copy", i, b);
}

static void open_all(run_t *r, const wsync_manifest_t *m, wsync_handle_t **h, wsync_handle_t **segs)
{
    assert_int_equal(P.c->open_handle(r->c, &m->buffer, h, NULL), WSYNC_OK);
    for (size_t k = 0; k < m->n_segments; k++)
        assert_int_equal(P.c->open_handle(r->c, &m->segments[k], &segs[k], NULL), WSYNC_OK);
}

static void close_all(run_t *r, const wsync_manifest_t *m, wsync_handle_t *h, wsync_handle_t **segs)
{
    for (size_t k = 0; k < m->n_segments; k++)
        assert_int_equal(P.c->close_handle(r->c, segs[k], NULL), WSYNC_OK);
    assert_int_equal(P.c->close_handle(r->c, h, NULL), WSYNC_OK);
}

static void test_direct_syncs(void **state)
{
    (void)state;
    run_t r;
    start(&r, 3);
    for (uint64_t g = 1; g <= 3; g++) {
        char *json = next_manifest(&r);
        const wsync_manifest_t *m;
        assert_int_equal(P.c->parse_manifest(r.c, json, strlen(json), &m, NULL), WSYNC_OK);
        assert_int_equal(m->n_tensors, NT);
        assert_true(m->n_segments >= 1 && m->n_segments <= NT);
        assert_int_equal(m->segments[0].kind, WSYNC_BUFFER_HOST_PID);
        wsync_handle_t *h, *segs[NT];
        open_all(&r, m, &h, segs);
        wsync_copy_op_t ops[NT];
        uint32_t seg[NT];
        plan(&r, m, ops, seg);
        wsync_error_t err = {.struct_size = sizeof(err)};
        assert_int_equal(P.c->copy_segments(r.c, h, segs, m->n_segments, NULL, m->generation, ops,
                                            seg, NT, 0, &err),
                         WSYNC_OK);
        assert_int_equal(P.c->record_consumed(r.c, h, 1, &err), WSYNC_OK);
        check_dst(&r, g);
        close_all(&r, m, h, segs);
        P.c->manifest_free(r.c, m);
        free(json);
    }
    finish(&r);
}

static void test_direct_refusals(void **state)
{
    (void)state;
    run_t r;
    start(&r, 1);
    char *json = next_manifest(&r);
    const wsync_manifest_t *m;
    assert_int_equal(P.c->parse_manifest(r.c, json, strlen(json), &m, NULL), WSYNC_OK);
    wsync_handle_t *h, *segs[NT];
    open_all(&r, m, &h, segs);
    wsync_copy_op_t ops[NT];
    uint32_t seg[NT];
    plan(&r, m, ops, seg);
    wsync_error_t err = {.struct_size = sizeof(err)};

    /* an op outside its segment */
    wsync_copy_op_t bad[NT];
    memcpy(bad, ops, sizeof(bad));
    bad[1].src_offset = m->segments[seg[1]].bytes - 8;
    assert_int_equal(
        P.c->copy_segments(r.c, h, segs, m->n_segments, NULL, m->generation, bad, seg, NT, 0, &err),
        WSYNC_ERR_OUT_OF_BOUNDS);
    assert_non_null(strstr(err.message, "op 1"));
    /* a segment index beyond the handles given */
    uint32_t badseg[NT];
    memcpy(badseg, seg, sizeof(badseg));
    badseg[2] = (uint32_t)m->n_segments;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_segments(r.c, h, segs, m->n_segments, NULL, m->generation, ops,
                                        badseg, NT, 0, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "op 2: op_segment"));
    /* the tensors against the synchronisation buffer: out of bounds, never other bytes */
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_weights(r.c, h, NULL, m->generation, ops, NT, 0, &err),
                     WSYNC_ERR_OUT_OF_BOUNDS);
    /* a segment handle where copy_weights wants a buffer */
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_weights(r.c, segs[0], NULL, m->generation, ops, NT, 0, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "copy_segments"));
    assert_untouched(&r);
    /* then the good copy still goes through */
    assert_int_equal(
        P.c->copy_segments(r.c, h, segs, m->n_segments, NULL, m->generation, ops, seg, NT, 0, &err),
        WSYNC_OK);
    assert_int_equal(P.c->record_consumed(r.c, h, 1, &err), WSYNC_OK);
    check_dst(&r, 1);
    close_all(&r, m, h, segs);
    P.c->manifest_free(r.c, m);

    /* manifests: a tensor naming a segment that is not there, a segment in a plain manifest */
    const char *seg_key = "\"segment\":0";
    char *at = strstr(json, seg_key);
    assert_non_null(at);
    at[10] = '7';
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->parse_manifest(r.c, json, strlen(json), &m, &err),
                     WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(err.message, ".segment: 7, the manifest has"));
    free(json);
    finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct_syncs),
        cmocka_unit_test(test_direct_refusals),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
