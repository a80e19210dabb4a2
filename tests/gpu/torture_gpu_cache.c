/* Mapping cache and retire handshake of the CUDA plugin, across two processes:
 * a second open of the same buffer opens nothing; 10 000 open/close cycles on a held mapping open
 * nothing and 1 000 full open/close cycles leave no mapping and no device memory behind; retire is
 * refused (BUSY) while the consumer holds a mapping and succeeds once it closed. */
#include <stdlib.h>
#include <string.h>

#include "wsync_gpu_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#define CACHE_BYTES (1u << 20)

static int producer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = CACHE_BYTES};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    void *src;
    WG_CK(cudaMalloc(&src, 4096));
    WG_CK(wh_fill(src, 4096, 99, 0));
    WG_CK(cudaStreamSynchronize(0));
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "t",
                              .dtype = WSYNC_DTYPE_U8,
                              .ndim = 1,
                              .shape = {4096},
                              .src = src};
    WG_OK(p->producer->stage(s, NULL, &t, 1, err));
    const char *json;
    uint64_t gen;
    WG_OK(p->producer->publish(s, NULL, 1, &json, &gen, err));
    WG_CHECK(wh_send_str(fd, json) == 0, "send");
    for (;;) {
        char *m;
        if (wh_recv(fd, &m, NULL) != 0)
            return 1;
        int quit = strcmp(m, "quit") == 0;
        wh_free(m);
        if (quit)
            return 0;
        wsync_error_t e = {.struct_size = sizeof(e)};
        wsync_result_t r = p->producer->retire(s, &e);
        WG_CHECK(wh_send_str(fd, r == WSYNC_OK         ? "OK"
                                 : r == WSYNC_ERR_BUSY ? "BUSY"
                                                       : e.message) == 0,
                 "send");
        if (r == WSYNC_OK)
            return 0;
    }
}

static void stats(const wsync_plugin_t *p, wsync_consumer_t *c, wsync_handle_t *h)
{
    WG_OK(p->consumer->record_consumed(c, h, 0, err)); /* logs the counters */
    WG_CHECK(wh_stats.seen, "no stats line from the plugin");
}

static int consumer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 1);
    wsync_consumer_t *c = wg_consumer(p, 0);
    char *json;
    size_t len;
    WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest");
    const wsync_manifest_t *m;
    WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));

    wsync_handle_t *h1, *h2;
    WG_OK(p->consumer->open_handle(c, &m->buffer, &h1, err));
    stats(p, c, h1);
    WG_CHECK(wh_stats.ipc_mem_opens == 1, "first open: %llu IPC opens", wh_stats.ipc_mem_opens);
    WG_OK(p->consumer->open_handle(c, &m->buffer, &h2, err));
    stats(p, c, h2);
    WG_CHECK(wh_stats.ipc_mem_opens == 1, "second open opened again (%llu opens)",
             wh_stats.ipc_mem_opens);
    /* the second handle works */
    unsigned char *dst;
    WG_CK(cudaMalloc((void **)&dst, 4096));
    wsync_copy_op_t op = {.src_offset = m->tensors[0].offset,
                          .src_pitch = 4096,
                          .dst = dst,
                          .dst_pitch = 4096,
                          .dst_extent = 4096,
                          .rows = 1,
                          .row_bytes = 4096,
                          .digest = m->tensors[0].digest,
                          .has_digest = 1};
    WG_OK(p->consumer->copy_weights(c, h2, NULL, m->generation, &op, 1, WSYNC_COPY_VERIFY, err));
    WG_OK(p->consumer->record_consumed(c, h2, 1, err));

    size_t free0, free1, total;
    WG_CK(cudaMemGetInfo(&free0, &total));
    for (int i = 0; i < 10000; i++) {
        wsync_handle_t *h;
        WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        WG_OK(p->consumer->close_handle(c, h, err));
    }
    stats(p, c, h1);
    WG_CHECK(wh_stats.ipc_mem_opens == 1 && wh_stats.ipc_mem_closes == 0,
             "10000 cached cycles: %llu opens, %llu closes", wh_stats.ipc_mem_opens,
             wh_stats.ipc_mem_closes);

    WG_CHECK(wh_send_str(fd, "retire") == 0, "send");
    char *ans;
    WG_CHECK(wh_recv(fd, &ans, NULL) == 0, "no retire answer");
    WG_CHECK(strcmp(ans, "BUSY") == 0, "retire while mapped answered %s", ans);
    wh_free(ans);

    WG_OK(p->consumer->close_handle(c, h1, err));
    WG_OK(p->consumer->close_handle(c, h2, err));
    for (int i = 0; i < 1000; i++) { /* full open/close: the mapping really goes each time */
        wsync_handle_t *h;
        WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        if (i == 999)
            stats(p, c, h);
        WG_OK(p->consumer->close_handle(c, h, err));
    }
    WG_CHECK(wh_stats.ipc_mem_opens == 1001 && wh_stats.ipc_mem_closes == 1000,
             "1000 full cycles: %llu opens, %llu closes (1 still open before the last close)",
             wh_stats.ipc_mem_opens, wh_stats.ipc_mem_closes);
    WG_CK(cudaMemGetInfo(&free1, &total));
    WG_CHECK(free1 + (4u << 20) >= free0, "device memory shrank by %zu bytes", free0 - free1);

    WG_CHECK(wh_send_str(fd, "retire") == 0, "send");
    WG_CHECK(wh_recv(fd, &ans, NULL) == 0, "no retire answer");
    WG_CHECK(strcmp(ans, "OK") == 0, "retire after close answered %s", ans);
    wh_free(ans);
    p->consumer->manifest_free(c, m);
    wh_free(json);
    WG_OK(p->consumer->finalize(c, err));
    return 0;
}

static void test_cache_and_retire(void **state)
{
    (void)state;
    assert_true(wg_pair_passes(producer, consumer, (void *)WG_PLUGIN));
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cache_and_retire)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
