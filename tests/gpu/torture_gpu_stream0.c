/* The stream rule (docs/ABI.md): a NULL stream is CUDA's legacy default stream, as torch's
 * default stream (cuda_stream 0) is. The producer writes its source on the legacy stream behind a
 * long spin and stages with stream NULL: the stage must read the new bytes. The engine poisons its
 * destination on the legacy stream behind a long spin and copies with stream NULL: the copy must
 * land after the poison, so every destination byte is the producer's. Generation 2 does the same
 * on stream NULL again (the first calls allocate, which synchronizes the device and hides a
 * private stream), generation 3 on the per-thread default stream handle (cudaStreamPerThread).
 * A plugin that runs NULL-stream work on a private stream fails generation 2. */
#include <stdlib.h>
#include <string.h>

#include "wsync_gpu_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define S0_BYTES (64u << 20)
#define S0_SPIN_NS 200000000ull /* 200 ms: far longer than any copy of S0_BYTES */
#define S0_SEED(g) (1000u + (g))
#define S0_POISON 77u

#define S0_GENERATIONS 3

/* Generations 1 and 2 on stream NULL (the first call of each side allocates, and an allocation
 * synchronizes the whole device, which would hide a private stream: generation 2 is the one
 * that shows it), generation 3 on the per-thread default stream handle. */
static cudaStream_t s0_stream(uint64_t gen)
{
    return gen < S0_GENERATIONS ? (cudaStream_t)0 : cudaStreamPerThread;
}

static const char *s0_name(uint64_t gen)
{
    return gen < S0_GENERATIONS ? "stream NULL" : "cudaStreamPerThread";
}

static int producer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = S0_BYTES + 4096};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    void *src;
    WG_CK(cudaMalloc(&src, S0_BYTES));
    WG_CK(wh_fill(src, S0_BYTES, S0_POISON, 0));
    WG_CK(cudaDeviceSynchronize());
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "w",
                              .dtype = WSYNC_DTYPE_U8,
                              .ndim = 1,
                              .shape = {S0_BYTES},
                              .src = src};
    for (uint64_t g = 1; g <= S0_GENERATIONS; g++) {
        cudaStream_t st = s0_stream(g);
        /* The trainer's write of the new weights, still queued when stage is called. */
        WG_CK(wh_spin(S0_SPIN_NS, st));
        WG_CK(wh_fill(src, S0_BYTES, S0_SEED(g), st));
        WG_OK(p->producer->stage(s, st, &t, 1, err));
        const char *json;
        uint64_t gen;
        WG_OK(p->producer->publish(s, st, g == S0_GENERATIONS, &json, &gen, err));
        WG_CHECK(gen == g, "published generation %llu, expected %llu", (unsigned long long)gen,
                 (unsigned long long)g);
        WG_CHECK(wh_send_str(fd, json) == 0, "send");
        char *ack;
        WG_CHECK(wh_recv(fd, &ack, NULL) == 0, "no ack");
        wh_free(ack);
        WG_OK(p->producer->wait_consumed(s, st, g, err));
    }
    wg_close_and_retire(p, s, fd);
    return 0;
}

static int consumer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    wsync_consumer_t *c = wg_consumer(p, 0);
    void *dst;
    unsigned long long *bad_dev, bad = 0;
    WG_CK(cudaMalloc(&dst, S0_BYTES));
    WG_CK(cudaMalloc((void **)&bad_dev, sizeof(*bad_dev)));
    wsync_handle_t *h = NULL;
    for (uint64_t g = 1; g <= S0_GENERATIONS; g++) {
        cudaStream_t st = s0_stream(g);
        char *json;
        size_t len;
        WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest");
        const wsync_manifest_t *m;
        WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
        if (h == NULL)
            WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        WG_CHECK(m->n_tensors == 1 && m->tensors[0].nbytes == S0_BYTES, "manifest");
        wsync_copy_op_t op = {.src_offset = m->tensors[0].offset,
                              .dst = dst,
                              .dst_extent = S0_BYTES,
                              .rows = 1,
                              .row_bytes = S0_BYTES};
        /* The engine's own work on its stream, queued before the copy: the copy goes after it. */
        WG_CK(wh_spin(S0_SPIN_NS, st));
        WG_CK(wh_fill(dst, S0_BYTES, S0_POISON, st));
        WG_OK(p->consumer->copy_weights(c, h, g < S0_GENERATIONS ? NULL : (wsync_stream_t)st,
                                        m->generation, &op, 1, 0, err));
        WG_OK(p->consumer->record_consumed(c, h, 1, err));
        WG_CK(cudaDeviceSynchronize());
        WG_CK(cudaMemset(bad_dev, 0, sizeof(*bad_dev)));
        WG_CK(wh_count_bad(dst, S0_BYTES, S0_SEED(g), bad_dev, 0));
        WG_CK(cudaMemcpy(&bad, bad_dev, sizeof(bad), cudaMemcpyDeviceToHost));
        WG_CHECK(bad == 0,
                 "generation %llu (%s): %llu of %u words are not the producer's (a stage that "
                 "ran before the trainer's write, or a copy that ran before the engine's poison)",
                 (unsigned long long)g, s0_name(g), bad, S0_BYTES / 8);
        printf("stream0: generation %llu (%s): 0 of %u words wrong\n", (unsigned long long)g,
               s0_name(g), S0_BYTES / 8);
        p->consumer->manifest_free(c, m);
        wh_free(json);
        WG_CHECK(wh_send_str(fd, "ack") == 0, "send");
    }
    WG_OK(p->consumer->close_handle(c, h, err));
    WG_CHECK(wh_send_str(fd, "closed") == 0, "send");
    WG_OK(p->consumer->finalize(c, err));
    return 0;
}

static void test_null_stream_is_the_legacy_default_stream(void **state)
{
    (void)state;
    assert_true(wg_pair_passes(producer, consumer, (void *)WG_PLUGIN));
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_stream_is_the_legacy_default_stream)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
