/* The torn-weight test (docs/DESIGN.md §1.1). The engine's stream is kept busy by a spin kernel
 * when each update arrives; the producer reuses its staging buffer right after wait_consumed. With
 * the real plugin no bucket may be torn over 200 buckets; with the fixture plugin that records
 * *consumed* on another stream (libwsync_cuda_broken.so) the same test must find torn buckets. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_gpu_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#define TORN_BUCKETS 200
#define TORN_BYTES (4u << 20)
#define TORN_SPIN_NS 500000ull /* GPU busy: a spin kernel on the engine stream */
#define TORN_HOLD_US 2000      /* then the stream is held by a host callback, GPU left free */
#define TORN_EXIT 3            /* consumer exit status: torn buckets found */

static uint64_t seed_of(uint64_t g)
{
    return 0x1000000ull * g + 7;
}

/* Runs in stream order on the engine stream: the stream stays busy while the GPU is free, so
 * the producer's kernels (another process, another context) run meanwhile. Two processes'
 * kernels never overlap on one GPU without MPS: a spin kernel alone would let the GPU finish
 * the engine's work before switching to the producer, and hide the bug. */
static void hold_stream(void *user)
{
    (void)user;
    usleep(TORN_HOLD_US);
}

static int producer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = TORN_BYTES, .flags = WSYNC_STAGING_FIXED_LAYOUT};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *trainer;
    WG_CK(cudaMalloc(&trainer, TORN_BYTES));
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "w",
                              .dtype = WSYNC_DTYPE_BF16,
                              .ndim = 1,
                              .shape = {TORN_BYTES / 2},
                              .src = trainer};
    uint64_t last = 0;
    for (uint64_t g = 1; g <= TORN_BUCKETS; g++) {
        if (last)
            WG_OK(p->producer->wait_consumed(s, st, last, err));
        /* overwrite the trainer tensor and the staging buffer as early as allowed */
        WG_CK(wh_fill(trainer, TORN_BYTES, seed_of(g), st));
        WG_OK(p->producer->stage(s, st, &t, 1, err));
        const char *json;
        WG_OK(p->producer->publish(s, st, g == TORN_BUCKETS, &json, &last, err));
        WG_CHECK(last == g, "generation %llu", (unsigned long long)last);
        WG_CHECK(wh_send_str(fd, json) == 0, "send");
        char *ack;
        WG_CHECK(wh_recv(fd, &ack, NULL) == 0, "no ack for %llu", (unsigned long long)g);
        wh_free(ack);
    }
    wg_close_and_retire(p, s, fd);
    return 0;
}

static int consumer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    wsync_consumer_t *c = wg_consumer(p, 0);
    cudaStream_t engine;
    WG_CK(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking));
    unsigned char *dst;
    WG_CK(cudaMalloc((void **)&dst, (size_t)TORN_BUCKETS * TORN_BYTES));
    /* Like an engine, keep the mapping cached across buckets: close_handle of the last
     * reference waits for in-flight copies, which would order the reuse by itself and hide
     * an early *consumed*. */
    wsync_handle_t *keep = NULL;
    for (uint64_t g = 1; g <= TORN_BUCKETS; g++) {
        char *json;
        size_t len;
        WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest %llu", (unsigned long long)g);
        const wsync_manifest_t *m;
        WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
        WG_CHECK(m->n_tensors == 1 && m->tensors[0].nbytes == TORN_BYTES, "manifest");
        wsync_handle_t *h;
        WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        if (keep == NULL)
            WG_OK(p->consumer->open_handle(c, &m->buffer, &keep, err));
        WG_CK(wh_spin(TORN_SPIN_NS, engine)); /* the engine is busy when the update arrives */
        WG_OK(p->consumer->enqueue_host_fn(c, engine, hold_stream, NULL, err));
        wsync_copy_op_t op = {.src_offset = m->tensors[0].offset,
                              .src_pitch = TORN_BYTES,
                              .dst = dst + (g - 1) * TORN_BYTES,
                              .dst_pitch = TORN_BYTES,
                              .dst_extent = TORN_BYTES,
                              .rows = 1,
                              .row_bytes = TORN_BYTES};
        WG_OK(p->consumer->copy_weights(c, h, engine, m->generation, &op, 1, 0, err));
        WG_OK(p->consumer->record_consumed(c, h, 0, err)); /* no host wait, like an engine */
        WG_OK(p->consumer->close_handle(c, h, err));
        p->consumer->manifest_free(c, m);
        wh_free(json);
        WG_CHECK(wh_send_str(fd, "ack") == 0, "send ack");
    }
    unsigned long long *bad;
    WG_CK(cudaMalloc((void **)&bad, TORN_BUCKETS * sizeof(*bad)));
    WG_CK(cudaMemsetAsync(bad, 0, TORN_BUCKETS * sizeof(*bad), engine));
    for (uint64_t g = 1; g <= TORN_BUCKETS; g++)
        WG_CK(
            wh_count_bad(dst + (g - 1) * TORN_BYTES, TORN_BYTES, seed_of(g), &bad[g - 1], engine));
    unsigned long long host[TORN_BUCKETS];
    WG_CK(cudaMemcpyAsync(host, bad, sizeof(host), cudaMemcpyDeviceToHost, engine));
    WG_CK(cudaStreamSynchronize(engine));
    unsigned torn = 0;
    for (unsigned g = 0; g < TORN_BUCKETS; g++)
        torn += host[g] != 0;
    printf("%s: %u of %u buckets torn\n", (const char *)arg, torn, TORN_BUCKETS);
    WG_OK(p->consumer->close_handle(c, keep, err));
    WG_CHECK(wh_send_str(fd, "closed") == 0, "send");
    WG_OK(p->consumer->finalize(c, err));
    return torn == 0 ? 0 : TORN_EXIT;
}

static void test_no_torn_weights(void **state)
{
    (void)state;
    assert_true(wg_pair_passes(producer, consumer, (void *)WG_PLUGIN));
}

static void test_broken_fixture_is_caught(void **state)
{
    (void)state;
    int ps;
    int cs = wg_run_pair(producer, consumer, (void *)WG_BROKEN, &ps);
    assert_int_equal(cs, TORN_EXIT); /* the test can fail: early *consumed* tears weights */
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_torn_weights),
        cmocka_unit_test(test_broken_fixture_is_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
