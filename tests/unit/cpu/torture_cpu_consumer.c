/* The CPU plugin's consumer and producer tables in one process: cached opens, verified copies,
 * refused manifests and ops that leave the destination untouched, the retire handshake, bounded
 * waits, digest mismatches and multi-stream records. */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_test_util.h"

static wsync_test_plugin_t P;

/* A host_shm segment: the control block (plugin/common/wsync_control.h), then the data. */
#define WSYNC_TEST_CONTROL_SIZE 4096u

#define NT 3
static const int64_t shapes[NT] = {1024, 333, 4096}; /* float32 elements */

typedef struct fixture {
    wsync_consumer_t *c;
    wsync_staging_t *s;
    void *src[NT];
    void *dst[NT];
    const wsync_manifest_t *m;
    wsync_handle_t *h;
    uint64_t gen;
} fixture_t;

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

static wsync_staging_t *new_staging(uint64_t bytes, uint32_t flags, uint32_t timeout_ms)
{
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = bytes, .flags = flags, .timeout_ms = timeout_ms};
    wsync_staging_t *s = NULL;
    assert_int_equal(P.p->create(&cfg, &s, NULL), WSYNC_OK);
    return s;
}

static void stage_gen(fixture_t *f, wsync_staging_t *s, uint64_t g)
{
    wsync_stage_tensor_t t[NT];
    for (int i = 0; i < NT; i++) {
        char *name = malloc(32);
        snprintf(name, 32, "layer.%d.weight", i);
        wsync_test_fill(f->src[i], (size_t)shapes[i] * 4, g, (uint64_t)i);
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = name,
                                      .dtype = WSYNC_DTYPE_F32,
                                      .ndim = 1,
                                      .shape = {shapes[i]},
                                      .src = f->src[i]};
    }
    assert_int_equal(P.p->stage(s, NULL, t, NT, NULL), WSYNC_OK);
    for (int i = 0; i < NT; i++)
        free((void *)t[i].name);
}

/* Stage + publish generation g, parse the manifest (replacing f->m). */
static void publish_gen(fixture_t *f, uint64_t g)
{
    const char *json = NULL;
    uint64_t gen = 0;
    stage_gen(f, f->s, g);
    assert_int_equal(P.p->publish(f->s, NULL, 0, &json, &gen, NULL), WSYNC_OK);
    assert_int_equal(gen, g);
    if (f->m != NULL)
        P.c->manifest_free(f->c, f->m);
    assert_int_equal(P.c->parse_manifest(f->c, json, strlen(json), &f->m, NULL), WSYNC_OK);
    assert_int_equal(f->m->generation, g);
    assert_int_equal(f->m->n_tensors, NT);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 2000};
    assert_int_equal(P.c->create(&cc, &f->c, NULL), WSYNC_OK);
    f->s = new_staging(1 << 20, WSYNC_STAGING_FIXED_LAYOUT, 2000);
    for (int i = 0; i < NT; i++) {
        f->src[i] = malloc((size_t)shapes[i] * 4);
        assert_int_equal(P.c->mem_alloc(f->c, (size_t)shapes[i] * 4, &f->dst[i], NULL), WSYNC_OK);
        memset(f->dst[i], 0xAB, (size_t)shapes[i] * 4);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    if (f->h != NULL)
        assert_int_equal(P.c->close_handle(f->c, f->h, NULL), WSYNC_OK);
    if (f->m != NULL)
        P.c->manifest_free(f->c, f->m);
    for (int i = 0; i < NT; i++) {
        free(f->src[i]);
        P.c->mem_free(f->c, f->dst[i], NULL);
    }
    if (f->s != NULL)
        assert_int_equal(P.p->retire(f->s, NULL), WSYNC_OK);
    assert_int_equal(P.c->finalize(f->c, NULL), WSYNC_OK);
    free(f);
    return 0;
}

/* Lines of /proc/self/maps that map shared memory `name`. */
static int count_maps(const char *name)
{
    char line[1024];
    int n = 0;
    FILE *fp = fopen("/proc/self/maps", "r");
    assert_non_null(fp);
    while (fgets(line, sizeof(line), fp) != NULL)
        n += strstr(line, name) != NULL;
    fclose(fp);
    return n;
}

static int count_fds(void)
{
    char path[64];
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n += access(path, F_OK) == 0;
    }
    return n;
}

static void shm_name_of(const wsync_manifest_t *m, char *name)
{
    memcpy(name, m->buffer.handle, m->buffer.handle_len);
    name[m->buffer.handle_len] = '\0';
}

static void test_open_twice_maps_once(void **state)
{
    fixture_t *f = *state;
    char name[128];
    wsync_handle_t *h1, *h2;

    publish_gen(f, 1);
    shm_name_of(f->m, name);
    assert_int_equal(f->m->buffer.kind, WSYNC_BUFFER_HOST_SHM);
    assert_string_equal(f->m->buffer.device, "cpu");
    assert_int_equal(f->m->buffer.pid, (int64_t)getpid());
    int base_maps = count_maps(name); /* the producer's own mapping */
    assert_int_equal(base_maps, 1);
    int base_fds = count_fds();

    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &h1, NULL), WSYNC_OK);
    assert_int_equal(count_maps(name), 2);
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &h2, NULL), WSYNC_OK);
    assert_ptr_equal(h1, h2);
    assert_int_equal(count_maps(name), 2);
    assert_int_equal(P.c->close_handle(f->c, h2, NULL), WSYNC_OK);
    assert_int_equal(count_maps(name), 2);
    assert_int_equal(P.c->close_handle(f->c, h1, NULL), WSYNC_OK);
    assert_int_equal(count_maps(name), base_maps);

    /* 10 000 syncs' worth of open/close with one long-lived reference: nothing grows. */
    wsync_handle_t *keep;
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &keep, NULL), WSYNC_OK);
    for (int i = 0; i < 10000; i++) {
        wsync_handle_t *h;
        assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &h, NULL), WSYNC_OK);
        assert_ptr_equal(h, keep);
        assert_int_equal(P.c->close_handle(f->c, h, NULL), WSYNC_OK);
        if (i % 2500 == 0)
            assert_int_equal(count_maps(name), 2);
    }
    assert_int_equal(count_maps(name), 2);
    assert_int_equal(P.c->close_handle(f->c, keep, NULL), WSYNC_OK);
    /* ... and full open/close cycles map and unmap without leaking mappings or fds. */
    for (int i = 0; i < 2000; i++) {
        wsync_handle_t *h;
        assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &h, NULL), WSYNC_OK);
        assert_int_equal(P.c->close_handle(f->c, h, NULL), WSYNC_OK);
    }
    assert_int_equal(count_maps(name), base_maps);
    assert_int_equal(count_fds(), base_fds);
}

static void test_copy_verify(void **state)
{
    fixture_t *f = *state;
    wsync_copy_op_t ops[NT];
    wsync_error_t err = {.struct_size = sizeof(err)};

    for (uint64_t g = 1; g <= 3; g++) {
        if (g > 1)
            assert_int_equal(P.p->wait_consumed(f->s, NULL, g - 1, NULL), WSYNC_OK);
        publish_gen(f, g);
        if (f->h == NULL)
            assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
        for (size_t i = 0; i < NT; i++)
            assert_int_equal(f->m->tensors[i].has_digest, 1);
        wsync_test_ops(f->m, f->dst, ops);
        assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, g, ops, NT, WSYNC_COPY_VERIFY, &err),
                         WSYNC_OK);
        assert_int_equal(P.c->record_consumed(f->c, f->h, 1, &err), WSYNC_OK);
        for (int i = 0; i < NT; i++)
            assert_int_equal(wsync_test_check(f->dst[i], (size_t)shapes[i] * 4, g, (uint64_t)i), 0);
    }
    assert_int_equal(P.p->wait_consumed(f->s, NULL, 3, NULL), WSYNC_OK);
    /* read_back returns the staged bytes. */
    void *back = malloc((size_t)shapes[2] * 4);
    assert_int_equal(
        P.p->read_back(f->s, f->m->tensors[2].offset, back, (size_t)shapes[2] * 4, NULL), WSYNC_OK);
    assert_int_equal(wsync_test_check(back, (size_t)shapes[2] * 4, 3, 2), 0);
    free(back);
    assert_int_equal(P.p->read_back(f->s, (1 << 20) - 4, back, 8, &err), WSYNC_ERR_OUT_OF_BOUNDS);
}

static void assert_untouched(fixture_t *f)
{
    assert_int_equal(P.c->stream_synchronize(f->c, NULL, NULL), WSYNC_OK);
    for (int i = 0; i < NT; i++) {
        const uint8_t *p = f->dst[i];
        for (size_t k = 0; k < (size_t)shapes[i] * 4; k++)
            if (p[k] != 0xAB)
                fail_msg("dst[%d][%zu] = 0x%02x was written by a refused call", i, k, p[k]);
    }
}

static void test_bad_ops_leave_destination_untouched(void **state)
{
    fixture_t *f = *state;
    wsync_copy_op_t ops[NT];
    wsync_error_t err;

    publish_gen(f, 1);
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    uint64_t bytes = f->m->buffer.bytes;

    /* Past the source: the last op reads one byte beyond the buffer. */
    wsync_test_ops(f->m, f->dst, ops);
    ops[2].src_offset = bytes - ops[2].row_bytes + 1;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0, &err),
                     WSYNC_ERR_OUT_OF_BOUNDS);
    assert_non_null(strstr(err.message, "op 2")); /* names the op */
    assert_untouched(f);

    /* Past dst_extent. */
    wsync_test_ops(f->m, f->dst, ops);
    ops[1].dst_extent = ops[1].row_bytes - 1;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0, &err),
                     WSYNC_ERR_OUT_OF_BOUNDS);
    assert_untouched(f);

    /* 2-D op whose rows x pitch overflows 64 bits. */
    wsync_test_ops(f->m, f->dst, ops);
    ops[0].rows = UINT64_MAX / 2;
    ops[0].src_pitch = 4;
    ops[0].dst_pitch = 4;
    ops[0].row_bytes = 4;
    ops[0].dst_extent = UINT64_MAX;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0, &err),
                     WSYNC_ERR_OUT_OF_BOUNDS);
    assert_non_null(strstr(err.message, "overflows"));
    assert_untouched(f);

    /* Two ops writing a common destination byte: the second starts on the last byte of the
     * first, inside tensor 0's parameter (so an unchecked copy would stay in bounds). */
    wsync_test_ops(f->m, f->dst, ops);
    ops[1].row_bytes = 1;
    ops[1].dst = (char *)ops[0].dst + ops[0].row_bytes - 1;
    ops[1].dst_extent = 1;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "op 0 and op 1 write overlapping destination bytes"));
    assert_untouched(f);

    /* Unknown flag. */
    wsync_test_ops(f->m, f->dst, ops);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0x80, NULL),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_untouched(f);

    /* The refused calls consumed nothing: generation 1 still copies. */
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, WSYNC_COPY_VERIFY, NULL),
                     WSYNC_OK);
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, NULL), WSYNC_OK);
    for (int i = 0; i < NT; i++)
        assert_int_equal(wsync_test_check(f->dst[i], (size_t)shapes[i] * 4, 1, (uint64_t)i), 0);
}

static void test_stale_generation_refused(void **state)
{
    fixture_t *f = *state;
    wsync_copy_op_t ops[NT];
    wsync_error_t err = {.struct_size = sizeof(err)};

    publish_gen(f, 1);
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    wsync_test_ops(f->m, f->dst, ops);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0, NULL), WSYNC_OK);
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, NULL), WSYNC_OK);
    for (int i = 0; i < NT; i++)
        memset(f->dst[i], 0xAB, (size_t)shapes[i] * 4);

    /* A replay of generation 1, and generation 0, are refused and write nothing. */
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, 0, &err),
                     WSYNC_ERR_STALE_GENERATION);
    assert_int_equal(err.code, WSYNC_ERR_STALE_GENERATION);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 0, ops, NT, 0, NULL),
                     WSYNC_ERR_STALE_GENERATION);
    assert_untouched(f);

    /* Nothing copied since the last record: record has nothing to do. */
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, NULL), WSYNC_ERR_INVALID_ARGUMENT);

    /* A second open of the same buffer shares the generation history. */
    wsync_handle_t *h2;
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &h2, NULL), WSYNC_OK);
    assert_int_equal(P.c->copy_weights(f->c, h2, NULL, 1, ops, NT, 0, NULL),
                     WSYNC_ERR_STALE_GENERATION);
    assert_int_equal(P.c->close_handle(f->c, h2, NULL), WSYNC_OK);
    assert_untouched(f);
}

static void test_retire_while_mapped_is_busy(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    char name[128];

    publish_gen(f, 1);
    shm_name_of(f->m, name);
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    assert_int_equal(P.p->retire(f->s, &err), WSYNC_ERR_BUSY);
    assert_non_null(strstr(err.message, "still mapped"));
    /* The staging is still fully usable after the refusal. */
    wsync_copy_op_t ops[NT];
    wsync_test_ops(f->m, f->dst, ops);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, WSYNC_COPY_VERIFY, NULL),
                     WSYNC_OK);
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, NULL), WSYNC_OK);
    assert_int_equal(P.c->close_handle(f->c, f->h, NULL), WSYNC_OK);
    f->h = NULL;
    assert_int_equal(P.p->retire(f->s, NULL), WSYNC_OK);
    f->s = NULL;
    /* Retire removed the segment. */
    errno = 0;
    assert_int_equal(shm_open(name, O_RDONLY, 0), -1);
    assert_int_equal(errno, ENOENT);
    /* A consumer that comes late is told the producer is gone. */
    wsync_handle_t *h;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &h, &err), WSYNC_ERR_PEER_GONE);
}

/* Staging over a published, unconsumed generation is refused (docs/DESIGN.md §1.2): BUSY, naming
 * the generation and what to call. */
static void stage_t_refused(fixture_t *f)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_stage_tensor_t t[NT];
    for (int i = 0; i < NT; i++)
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = f->m->tensors[i].name,
                                      .dtype = WSYNC_DTYPE_F32,
                                      .ndim = 1,
                                      .shape = {shapes[i]},
                                      .src = f->src[i]};
    assert_int_equal(P.p->stage(f->s, NULL, t, NT, &err), WSYNC_ERR_BUSY);
    assert_non_null(strstr(err.message, "not yet consumed"));
    assert_non_null(strstr(err.message, "wait_consumed"));
}

static void test_wait_consumed_timeout_keeps_staging(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t ops[NT];

    assert_int_equal(P.p->retire(f->s, NULL), WSYNC_OK);
    f->s = new_staging(1 << 20, 0, 100);
    publish_gen(f, 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(P.p->wait_consumed(f->s, NULL, 1, &err), WSYNC_ERR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_non_null(strstr(err.message, "100 ms"));
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(ms >= 90);
    /* Never-published generations are a caller error. */
    assert_int_equal(P.p->wait_consumed(f->s, NULL, 5, NULL), WSYNC_ERR_INVALID_ARGUMENT);

    /* Generation 1 is still unconsumed: the staging cannot be reused yet. */
    stage_t_refused(f);
    /* A (re)started consumer picks up from here: the staging is intact and usable. */
    /* It consumes generation 1, and the producer may then publish generation 2. */
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    for (uint64_t g = 1; g <= 2; g++) {
        if (g == 2)
            publish_gen(f, 2);
        wsync_test_ops(f->m, f->dst, ops);
        assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, g, ops, NT, WSYNC_COPY_VERIFY, NULL),
                         WSYNC_OK);
        assert_int_equal(P.c->record_consumed(f->c, f->h, 0, NULL), WSYNC_OK);
        assert_int_equal(P.p->wait_consumed(f->s, NULL, g, NULL), WSYNC_OK);
        for (int i = 0; i < NT; i++)
            assert_int_equal(wsync_test_check(f->dst[i], (size_t)shapes[i] * 4, g, (uint64_t)i), 0);
    }
}

static void test_digest_mismatch_detected(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t ops[NT];

    publish_gen(f, 1);
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    /* The producer's stage refuses to overwrite a published, unconsumed bucket... */
    stage_t_refused(f);
    /* ...so corrupt it behind the plugin's back (one byte of tensor 1 in the shared segment):
     * the manifest's digests no longer match the bytes. */
    char shm_name[WSYNC_HANDLE_MAX + 1] = {0};
    memcpy(shm_name, f->m->buffer.handle, f->m->buffer.handle_len);
    int fd = shm_open(shm_name, O_RDWR, 0);
    assert_true(fd >= 0);
    size_t seg = WSYNC_TEST_CONTROL_SIZE + (size_t)f->m->buffer.bytes;
    uint8_t *p = mmap(NULL, seg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(p != MAP_FAILED);
    p[WSYNC_TEST_CONTROL_SIZE + f->m->tensors[1].offset + 17] ^= 0x40;
    munmap(p, seg);
    wsync_test_ops(f->m, f->dst, ops);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, WSYNC_COPY_VERIFY, NULL),
                     WSYNC_OK);
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, &err), WSYNC_ERR_DIGEST_MISMATCH);
    assert_non_null(strstr(err.message, "op 1"));
    char want[32];
    snprintf(want, sizeof(want), "%016llx", (unsigned long long)f->m->tensors[1].digest);
    assert_non_null(strstr(err.message, want));
    /* The error was reported once; the consumed signal still fired (the bytes were read). */
    assert_int_equal(P.p->wait_consumed(f->s, NULL, 1, NULL), WSYNC_OK);

    /* Without WSYNC_COPY_VERIFY the same bytes copy without complaint. */
    const char *json;
    uint64_t g;
    assert_int_equal(P.p->publish(f->s, NULL, 1, &json, &g, NULL), WSYNC_OK);
    assert_int_equal(g, 2);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 2, ops, NT, 0, NULL), WSYNC_OK);
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, NULL), WSYNC_OK);
}

static void test_layout_mismatch(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};

    stage_gen(f, f->s, 1);
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "layer.0.weight",
                              .dtype = WSYNC_DTYPE_BF16,
                              .ndim = 1,
                              .shape = {1024},
                              .src = f->src[0]};
    assert_int_equal(P.p->stage(f->s, NULL, &t, 1, &err), WSYNC_ERR_LAYOUT_MISMATCH);
    /* The first stage's copies still read f->src: let them finish before teardown frees it. */
    assert_int_equal(P.p->stream_synchronize(f->s, NULL, NULL), WSYNC_OK);
    /* Too big for the buffer. */
    wsync_staging_t *small = new_staging(4096, 0, 100);
    t.shape[0] = 4096;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(P.p->stage(small, NULL, &t, 1, &err), WSYNC_ERR_OUT_OF_BOUNDS);
    const char *json;
    assert_int_equal(P.p->publish(small, NULL, 0, &json, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(P.p->retire(small, NULL), WSYNC_OK);
}

/* A tensor name that is not UTF-8 (names travel as JSON strings) is refused at stage, naming the
 * tensor and the byte, before anything is written: the staged bytes of the consumed generation
 * and the engine's copy of it stay as they were, and the next good stage publishes. */
static void test_bad_name_refused_at_stage(void **state)
{
    fixture_t *f = *state;
    wsync_copy_op_t ops[NT];
    wsync_error_t err = {.struct_size = sizeof(err)};

    publish_gen(f, 1);
    assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    wsync_test_ops(f->m, f->dst, ops);
    assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, 1, ops, NT, WSYNC_COPY_VERIFY, NULL),
                     WSYNC_OK);
    assert_int_equal(P.c->record_consumed(f->c, f->h, 1, NULL), WSYNC_OK);
    assert_int_equal(P.p->wait_consumed(f->s, NULL, 1, NULL), WSYNC_OK);
    const size_t n0 = (size_t)shapes[0] * 4;
    uint8_t *before = malloc(n0), *after = malloc(n0);
    assert_int_equal(P.p->read_back(f->s, f->m->tensors[0].offset, before, n0, NULL), WSYNC_OK);

    wsync_test_fill(f->src[0], n0, 2, 0); /* new bytes that must not reach the buffer */
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "layer.0.we\xc0\xafight",
                              .dtype = WSYNC_DTYPE_F32,
                              .ndim = 1,
                              .shape = {shapes[0]},
                              .src = f->src[0]};
    assert_int_equal(P.p->stage(f->s, NULL, &t, 1, &err), WSYNC_ERR_INVALID_ARGUMENT);
    print_message("bad name: %s\n", err.message);
    assert_non_null(strstr(err.message, "tensor 0: name is not valid UTF-8 (byte 0xc0 at 10)"));
    assert_int_equal(P.p->stream_synchronize(f->s, NULL, NULL), WSYNC_OK);
    assert_int_equal(P.p->read_back(f->s, f->m->tensors[0].offset, after, n0, NULL), WSYNC_OK);
    assert_memory_equal(before, after, n0);
    for (int i = 0; i < NT; i++) /* the engine's weights: still generation 1 */
        assert_int_equal(wsync_test_check(f->dst[i], (size_t)shapes[i] * 4, 1, (uint64_t)i), 0);
    free(before);
    free(after);

    publish_gen(f, 2); /* nothing was lost: the next good stage publishes */
}

/* WSYNC_STAGING_NO_DIGESTS: the manifest carries no digest; unknown flags are refused. */
static void test_staging_without_digests(void **state)
{
    fixture_t *f = *state;
    wsync_staging_t *s = new_staging(1 << 20, WSYNC_STAGING_NO_DIGESTS, 100);
    const char *json = NULL;
    const wsync_manifest_t *m = NULL;
    stage_gen(f, s, 1);
    assert_int_equal(P.p->publish(s, NULL, 0, &json, NULL, NULL), WSYNC_OK);
    assert_int_equal(P.c->parse_manifest(f->c, json, strlen(json), &m, NULL), WSYNC_OK);
    assert_int_equal(m->n_tensors, NT);
    for (size_t i = 0; i < m->n_tensors; i++)
        assert_int_equal(m->tensors[i].has_digest, 0);
    assert_null(strstr(json, "digest"));
    P.c->manifest_free(f->c, m);
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    /* With digests (the fixture's staging), every tensor has one. */
    publish_gen(f, 1);
    for (size_t i = 0; i < f->m->n_tensors; i++)
        assert_int_equal(f->m->tensors[i].has_digest, 1);
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = 4096, .flags = 0x10};
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(P.p->create(&cfg, &s, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "0x10"));
}

/* Generation g published (after g - 1 was consumed), the handle open, ops for every tensor. */
static void next_gen(fixture_t *f, uint64_t g, wsync_copy_op_t *ops)
{
    if (g > 1)
        assert_int_equal(P.p->wait_consumed(f->s, NULL, g - 1, NULL), WSYNC_OK);
    publish_gen(f, g);
    if (f->h == NULL)
        assert_int_equal(P.c->open_handle(f->c, &f->m->buffer, &f->h, NULL), WSYNC_OK);
    wsync_test_ops(f->m, f->dst, ops);
}

typedef struct delay {
    unsigned ms;
} delay_t;

static void sleep_fn(void *user)
{
    delay_t *d = user;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)d->ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_record_joins_streams(void **state)
{
    fixture_t *f = *state;
    wsync_stream_t a, b;
    wsync_copy_op_t ops[NT];
    delay_t d = {.ms = 40};

    assert_int_equal(P.c->stream_create(f->c, &a, NULL), WSYNC_OK);
    assert_int_equal(P.c->stream_create(f->c, &b, NULL), WSYNC_OK);
    for (uint64_t g = 1; g <= 4; g++) {
        next_gen(f, g, ops);
        /* One bucket over two streams; the slow one is not the first carrier on odd g. */
        wsync_stream_t first = (g & 1) ? a : b, second = (g & 1) ? b : a;
        assert_int_equal(P.c->copy_weights(f->c, f->h, first, g, ops, 1, 0, NULL), WSYNC_OK);
        assert_int_equal(P.c->enqueue_host_fn(f->c, second, sleep_fn, &d, NULL), WSYNC_OK);
        assert_int_equal(P.c->copy_weights(f->c, f->h, second, g, ops + 1, NT - 1, 0, NULL),
                         WSYNC_OK);
        assert_int_equal(P.c->record_consumed(f->c, f->h, 0, NULL), WSYNC_OK);
        /* consumed fires only after both streams copied: every byte is there now. */
        assert_int_equal(P.p->wait_consumed(f->s, NULL, g, NULL), WSYNC_OK);
        for (int i = 0; i < NT; i++)
            assert_int_equal(wsync_test_check(f->dst[i], (size_t)shapes[i] * 4, g, (uint64_t)i), 0);
    }
    assert_int_equal(P.c->stream_destroy(f->c, a, NULL), WSYNC_OK);
    /* A stream of another kind is refused, the default stream cannot be destroyed. */
    assert_int_equal(P.c->stream_destroy(f->c, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(P.c->stream_destroy(f->c, b, NULL), WSYNC_OK);
}

/* What a host function on the NULL stream saw of the work queued before it on NULL. */
typedef struct seen {
    fixture_t *f;
    uint64_t g;
    _Atomic int slept;
    pthread_t caller;
    int ok;
} seen_t;

static void sleep_mark_fn(void *user)
{
    seen_t *x = user;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 20 * 1000000L};
    nanosleep(&ts, NULL);
    atomic_store(&x->slept, 1);
}

static void check_fn(void *user)
{
    seen_t *x = user;
    x->ok = atomic_load(&x->slept) && !pthread_equal(pthread_self(), x->caller); /* queued */
    for (int i = 0; i < NT; i++)
        x->ok &= wsync_test_check(x->f->dst[i], (size_t)shapes[i] * 4, x->g, (uint64_t)i) == 0;
}

/* The stream rule on the CPU backend: NULL is the consumer's one in-order queue. A slow host
 * function, the copies, then a check, all on NULL: the check runs after both, every time (a
 * backend that ran NULL-stream work anywhere else would run it while the first still sleeps). */
static void test_null_stream_is_one_queue(void **state)
{
    fixture_t *f = *state;
    wsync_copy_op_t ops[NT];
    for (uint64_t g = 1; g <= 3; g++) {
        next_gen(f, g, ops);
        seen_t x = {.f = f, .g = g, .caller = pthread_self()};
        assert_int_equal(P.c->enqueue_host_fn(f->c, NULL, sleep_mark_fn, &x, NULL), WSYNC_OK);
        assert_int_equal(P.c->copy_weights(f->c, f->h, NULL, g, ops, NT, 0, NULL), WSYNC_OK);
        assert_int_equal(P.c->enqueue_host_fn(f->c, NULL, check_fn, &x, NULL), WSYNC_OK);
        assert_int_equal(P.c->record_consumed(f->c, f->h, 0, NULL), WSYNC_OK);
        assert_int_equal(P.c->stream_synchronize(f->c, NULL, NULL), WSYNC_OK);
        assert_true(atomic_load(&x.slept));
        assert_true(x.ok);
    }
}

static void test_misc_members(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    char buf[16] = "abcdefghijklmno", out[16] = {0};

    assert_int_equal(P.c->mem_copy(f->c, out, buf, sizeof(buf), 0, NULL), WSYNC_OK);
    assert_memory_equal(out, buf, sizeof(buf));
    assert_int_equal(P.c->mem_copy(f->c, out, buf, sizeof(buf), 7, NULL),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(P.c->hot_load_adapter(f->c, NULL, NULL, NULL, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_true(strlen(err.message) > 10);
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_t, P.c, unload_adapter));
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_t, P.c, mem_copy));
    assert_true(WSYNC_HAS_OP(wsync_producer_ops_t, P.p, read_back));
    assert_string_equal(P.plugin->name, "cpu");
    /* A manifest naming a cuda_ipc buffer is not for this plugin. */
    publish_gen(f, 1);
    wsync_buffer_desc_t d = f->m->buffer;
    d.kind = WSYNC_BUFFER_CUDA_IPC;
    wsync_handle_t *h;
    assert_int_equal(P.c->open_handle(f->c, &d, &h, NULL), WSYNC_ERR_NOT_SUPPORTED);
    /* Usable bytes beyond the segment are refused at open. */
    d = f->m->buffer;
    d.bytes += 1;
    assert_int_equal(P.c->open_handle(f->c, &d, &h, NULL), WSYNC_ERR_OUT_OF_BOUNDS);
    /* A bad manifest is refused by parse. */
    const wsync_manifest_t *m = NULL;
    assert_int_equal(P.c->parse_manifest(f->c, "{", 1, &m, NULL), WSYNC_ERR_BAD_MANIFEST);
    assert_null(m);
}

static void test_negotiation(void **state)
{
    (void)state;
    wsync_plugin_init_fn_t init = (wsync_plugin_init_fn_t)dlsym(P.dl, WSYNC_PLUGIN_INIT_SYMBOL);
    const wsync_plugin_t *pl = NULL;
    uint32_t v = 7;
    assert_int_equal(init(&v, NULL, &pl, NULL), WSYNC_OK);
    assert_int_equal(v, 1);
    assert_ptr_equal(pl, P.plugin);
    assert_int_equal(pl->struct_size, sizeof(wsync_plugin_t));
    assert_int_equal(pl->consumer->struct_size, sizeof(wsync_consumer_ops_t));
    assert_int_equal(pl->producer->struct_size, sizeof(wsync_producer_ops_t));
    v = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(init(&v, NULL, &pl, &err), WSYNC_ERR_INCOMPATIBLE);
    assert_int_equal(v, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_twice_maps_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_ops_leave_destination_untouched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_generation_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retire_while_mapped_is_busy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_consumed_timeout_keeps_staging, setup, teardown),
        cmocka_unit_test_setup_teardown(test_digest_mismatch_detected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layout_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_name_refused_at_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_staging_without_digests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_joins_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_stream_is_one_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misc_members, setup, teardown),
        cmocka_unit_test(test_negotiation),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
