/* Cross-GPU IPC: the producer stages on GPU a, the consumer (engine) runs on GPU b and copies
 * out of the producer's buffer over peer access (NVLink). The consumer resolves the manifest's
 * buffer.device ("GPU-<uuid>") to an ordinal, enables peer access (wsync_cuda_peer_enable) and
 * then lets libwsync_cuda.so open, copy (a whole tensor and a 2-D row-parallel slice) and record
 * *consumed*; every byte is compared with the producer's pattern. Both directions, three
 * generations each through the same retained staging buffer. Measures nothing.
 * Fewer than 2 GPUs: "SKIPPED: torture_gpu_peer needs 2 GPUs, found M", exit 77. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda_peer.h"
#include "wsync_gpu_multi.h"
#include "wsync_gpu_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

wsync_result_t wsync_cuda_device_uuid(int device, char *out, wsync_error_t *err);

#define PEER_GENS 3
#define PEER_ROWS 2048
#define PEER_COLS 1536 /* bytes per row */
#define PEER_BYTES ((uint64_t)PEER_ROWS * PEER_COLS)
#define PEER_COL0 320 /* slice: columns [320, 320 + 256) of every row */
#define PEER_SLICE 256

typedef struct peer_arg {
    int producer_dev, consumer_dev;
} peer_arg_t;

static uint64_t peer_seed(uint64_t g)
{
    return 0x5eed0000ull + 977 * g;
}

static int peer_producer(int fd, void *arg)
{
    const peer_arg_t *a = arg;
    const wsync_plugin_t *p = wg_load(WG_PLUGIN, 0);
    WG_CK(cudaSetDevice(a->producer_dev));
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg),
                                  .bytes = 16u << 20,
                                  .device_ordinal = a->producer_dev,
                                  .flags = WSYNC_STAGING_FIXED_LAYOUT};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *trainer;
    WG_CK(cudaMalloc((void **)&trainer, PEER_BYTES));
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "model.layers.0.self_attn.o_proj.weight",
                              .dtype = WSYNC_DTYPE_U8,
                              .ndim = 2,
                              .shape = {PEER_ROWS, PEER_COLS},
                              .src = trainer};
    uint64_t last = 0;
    for (uint64_t g = 1; g <= PEER_GENS; g++) {
        if (last)
            WG_OK(p->producer->wait_consumed(s, st, last, err));
        WG_CK(wh_fill(trainer, PEER_BYTES, peer_seed(g), st));
        WG_OK(p->producer->stage(s, st, &t, 1, err));
        const char *json;
        WG_OK(p->producer->publish(s, st, g == PEER_GENS, &json, &last, err));
        WG_CHECK(wh_send_str(fd, json) == 0, "send manifest");
        char *ack;
        WG_CHECK(wh_recv(fd, &ack, NULL) == 0, "no ack for generation %llu", (unsigned long long)g);
        wh_free(ack);
    }
    wg_close_and_retire(p, s, fd);
    return 0;
}

static int peer_consumer(int fd, void *arg)
{
    const peer_arg_t *a = arg;
    const wsync_plugin_t *p = wg_load(WG_PLUGIN, 0);
    WG_CK(cudaSetDevice(a->consumer_dev));
    char own[WSYNC_DEVICE_MAX];
    WG_OK(wsync_cuda_device_uuid(a->consumer_dev, own, err));
    int bogus = 0;
    WG_OK(wsync_cuda_peer_ordinal("GPU-00000000-0000-0000-0000-000000000000", &bogus, err));
    WG_CHECK(bogus == -1, "a UUID no GPU has resolved to ordinal %d", bogus);

    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .device_ordinal = a->consumer_dev};
    wsync_consumer_t *c;
    WG_OK(p->consumer->create(&cc, &c, err));
    wsync_stream_t st;
    WG_OK(p->consumer->stream_create(c, &st, err));
    unsigned char *whole, *slice;
    WG_OK(p->consumer->mem_alloc(c, PEER_BYTES, (void **)&whole, err));
    WG_OK(p->consumer->mem_alloc(c, (uint64_t)PEER_ROWS * PEER_SLICE, (void **)&slice, err));
    unsigned long long *bad_dev;
    WG_CK(cudaMalloc((void **)&bad_dev, sizeof(*bad_dev)));
    unsigned char *host = malloc((size_t)PEER_ROWS * PEER_SLICE);
    WG_CHECK(host != NULL, "no host memory");
    wsync_handle_t *h = NULL;
    for (uint64_t g = 1; g <= PEER_GENS; g++) {
        char *json;
        size_t len;
        const wsync_manifest_t *m;
        WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest");
        WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
        WG_CHECK(strcmp(m->buffer.device, own) != 0,
                 "producer and consumer share GPU %s: the test needs two", own);
        int peer = -2;
        WG_OK(wsync_cuda_peer_enable(a->consumer_dev, m->buffer.device, &peer, err));
        WG_CHECK(peer == a->producer_dev, "producer GPU %s resolved to %d, expected %d",
                 m->buffer.device, peer, a->producer_dev);
        if (h == NULL)
            WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        const uint64_t off = m->tensors[0].offset;
        wsync_copy_op_t ops[2] = {
            {.src_offset = off,
             .src_pitch = PEER_BYTES,
             .dst = whole,
             .dst_pitch = PEER_BYTES,
             .dst_extent = PEER_BYTES,
             .rows = 1,
             .row_bytes = PEER_BYTES},
            {.src_offset = off + PEER_COL0,
             .src_pitch = PEER_COLS,
             .dst = slice,
             .dst_pitch = PEER_SLICE,
             .dst_extent = (uint64_t)PEER_ROWS * PEER_SLICE,
             .rows = PEER_ROWS,
             .row_bytes = PEER_SLICE},
        };
        WG_OK(p->consumer->copy_weights(c, h, st, m->generation, ops, 2, 0, err));
        WG_OK(p->consumer->record_consumed(c, h, 1, err));

        WG_CK(cudaMemset(bad_dev, 0, sizeof(*bad_dev)));
        WG_CK(wh_count_bad(whole, PEER_BYTES, peer_seed(g), bad_dev, NULL));
        unsigned long long bad = 0;
        WG_CK(cudaMemcpy(&bad, bad_dev, sizeof(bad), cudaMemcpyDeviceToHost));
        WG_CHECK(bad == 0, "GPU %d -> GPU %d generation %llu: %llu words differ", a->producer_dev,
                 a->consumer_dev, (unsigned long long)g, bad);
        WG_OK(p->consumer->mem_copy(c, host, slice, (size_t)PEER_ROWS * PEER_SLICE, 1, err));
        for (uint64_t r = 0; r < PEER_ROWS; r++)
            for (uint64_t b = 0; b < PEER_SLICE; b++) {
                unsigned char want = wg_pattern_byte(peer_seed(g), r * PEER_COLS + PEER_COL0 + b);
                WG_CHECK(host[r * PEER_SLICE + b] == want,
                         "slice row %llu byte %llu: %u, expected %u", (unsigned long long)r,
                         (unsigned long long)b, host[r * PEER_SLICE + b], want);
            }
        p->consumer->manifest_free(c, m);
        wh_free(json);
        WG_CHECK(wh_send_str(fd, "{\"ack\":true}") == 0, "send ack");
    }
    WG_OK(p->consumer->close_handle(c, h, err));
    WG_CHECK(wh_send_str(fd, "{\"closed\":true}") == 0, "send close");
    printf("GPU %d -> GPU %d: %d generations bit-exact over peer access\n", a->producer_dev,
           a->consumer_dev, PEER_GENS);
    free(host);
    WG_OK(p->consumer->finalize(c, err));
    return 0;
}

static void peer_run(int producer_dev, int consumer_dev)
{
    peer_arg_t a = {.producer_dev = producer_dev, .consumer_dev = consumer_dev};
    assert_true(wg_pair_passes(peer_producer, peer_consumer, &a));
}

static void test_peer_0_to_1(void **state)
{
    (void)state;
    peer_run(0, 1);
}

static void test_peer_1_to_0(void **state)
{
    (void)state;
    peer_run(1, 0);
}

int main(void)
{
    wgm_require_gpus(2, "torture_gpu_peer");
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_0_to_1),
        cmocka_unit_test(test_peer_1_to_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
