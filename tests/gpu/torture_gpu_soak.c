/* Soak of the CUDA plugin (docs/RELIABILITY.md, "CUDA plugin (GPU)"): 10 000 full sync cycles of
 * a small bucket (8 tensors, 1 MiB in all) between a producer and a consumer process, through
 * one reused staging buffer. Each cycle: wait_consumed, fill, stage, publish, manifest over a
 * socket, parse_manifest, open_handle (a cache hit: the consumer holds one handle for the whole
 * run, as an engine does), copy_weights (VERIFY), record_consumed, close_handle, ack.
 * From the warm-up (cycle 500) on, every 1 000 cycles each process checks that device memory in
 * use did not grow (cudaMemGetInfo, 2 MiB tolerance), that its open fds and /proc/self/maps lines
 * did not change, and that VmRSS grew by at most 2 MiB; the consumer also checks that every
 * parameter holds exactly the generation just synced. Both print their figures in one line.
 * The staging kind is the plugin's default; WSYNC_CUDA_STAGING_KIND=ipc|vmm in the environment
 * soaks the other one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* Buffers cross the harness boundary (allocated there, freed here): the real allocator. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#include "rel_proc.h"
#include "wsync_gpu_rel.h"

#define SOAK_CYCLES 10000u
#define SOAK_WARMUP 500u
#define SOAK_EVERY 1000u
#define SOAK_N 8
#define SOAK_TENSOR (128u << 10) /* 8 x 128 KiB = 1 MiB per bucket */
#define SOAK_GPU_TOL (2ull << 20)
#define SOAK_RSS_TOL_KB 2048L
#define SOAK_ALARM_S 240u

/* What one process samples; checked against the warm-up sample. */
typedef struct soak_meter {
    const char *who;
    size_t gpu_free_warm, gpu_free_min, gpu_free_end;
    long rss_warm, rss_max, rss_end;
    int fds_warm, maps_warm;
    long t0;
} soak_meter_t;

static void meter_sample(soak_meter_t *m, uint64_t g)
{
    static char warm_maps[1 << 20], now_maps[1 << 20]; /* static: a snapshot maps nothing */
    size_t free_b = 0, total = 0;
    WG_CK(cudaMemGetInfo(&free_b, &total));
    int maps = wr_maps_snapshot(g == SOAK_WARMUP ? warm_maps : now_maps, sizeof(warm_maps));
    long rss = rel_proc_rss_kb();
    int fds = rel_proc_count_fds();
    if (g == SOAK_WARMUP) {
        m->gpu_free_warm = m->gpu_free_min = free_b;
        m->rss_warm = m->rss_max = rss;
        m->fds_warm = fds;
        m->maps_warm = maps;
        return;
    }
    if (free_b < m->gpu_free_min)
        m->gpu_free_min = free_b;
    if (rss > m->rss_max)
        m->rss_max = rss;
    m->gpu_free_end = free_b;
    m->rss_end = rss;
    if (maps != m->maps_warm)
        wr_maps_diff(warm_maps, now_maps, 20);
    WG_CHECK(maps == m->maps_warm, "%s, cycle %llu: %d lines in /proc/self/maps, %d at the warm-up",
             m->who, (unsigned long long)g, maps, m->maps_warm);
    WG_CHECK(fds == m->fds_warm, "%s, cycle %llu: %d open fds, %d at the warm-up", m->who,
             (unsigned long long)g, fds, m->fds_warm);
    WG_CHECK(free_b + SOAK_GPU_TOL >= m->gpu_free_warm,
             "%s, cycle %llu: device free memory %zu bytes, %zu at the warm-up (%lld bytes more "
             "in use; tolerance %llu)",
             m->who, (unsigned long long)g, free_b, m->gpu_free_warm,
             (long long)m->gpu_free_warm - (long long)free_b, SOAK_GPU_TOL);
    WG_CHECK(rss - m->rss_warm <= SOAK_RSS_TOL_KB,
             "%s, cycle %llu: VmRSS %ld kB, %ld kB at the warm-up (+%ld kB; tolerance %ld kB)",
             m->who, (unsigned long long)g, rss, m->rss_warm, rss - m->rss_warm, SOAK_RSS_TOL_KB);
}

static void meter_print(const soak_meter_t *m, const char *extra)
{
    double s = (double)(wr_now_ms() - m->t0) / 1000.0;
    printf("soak %s: cycles=%u seconds=%.2f gpu_free_MiB warm=%.2f end=%.2f min=%.2f "
           "(in use %+lld bytes) rss_kB warm=%ld max=%ld end=%ld (%+ld) fds=%d maps=%d%s\n",
           m->who, SOAK_CYCLES, s, (double)m->gpu_free_warm / 1048576.0,
           (double)m->gpu_free_end / 1048576.0, (double)m->gpu_free_min / 1048576.0,
           (long long)m->gpu_free_warm - (long long)m->gpu_free_end, m->rss_warm, m->rss_max,
           m->rss_end, m->rss_max - m->rss_warm, m->fds_warm, m->maps_warm, extra);
    fflush(stdout);
}

static int producer(int fd, void *arg)
{
    wr_watchdog("soak producer", SOAK_ALARM_S);
    wr_phase("load");
    const wsync_plugin_t *p = wg_load(arg, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg),
                                  .bytes = SOAK_N * SOAK_TENSOR,
                                  .flags = WSYNC_STAGING_FIXED_LAYOUT,
                                  .timeout_ms = 10000};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *trainer;
    WG_CK(cudaMalloc((void **)&trainer, SOAK_N * SOAK_TENSOR));
    char names[SOAK_N][32];
    wsync_stage_tensor_t t[SOAK_N];
    for (size_t k = 0; k < SOAK_N; k++) {
        snprintf(names[k], sizeof(names[k]), "layers.%zu.weight", k);
        t[k] = (wsync_stage_tensor_t){.struct_size = sizeof(t[k]),
                                      .name = names[k],
                                      .dtype = WSYNC_DTYPE_U8,
                                      .ndim = 1,
                                      .shape = {SOAK_TENSOR},
                                      .src = trainer + k * SOAK_TENSOR};
    }
    soak_meter_t m = {.who = "producer", .t0 = wr_now_ms()};
    for (uint64_t g = 1; g <= SOAK_CYCLES; g++) {
        wr_phase("cycle %llu", (unsigned long long)g);
        if (g > 1)
            WG_OK(p->producer->wait_consumed(s, st, g - 1, err));
        for (size_t k = 0; k < SOAK_N; k++)
            WG_CK(wh_fill(trainer + k * SOAK_TENSOR, SOAK_TENSOR, wr_seed(g, k), st));
        WG_OK(p->producer->stage(s, st, t, SOAK_N, err));
        const char *json;
        uint64_t gen = 0;
        WG_OK(p->producer->publish(s, st, g == SOAK_CYCLES, &json, &gen, err));
        WG_CHECK(gen == g, "publish returned generation %llu at cycle %llu",
                 (unsigned long long)gen, (unsigned long long)g);
        WG_CHECK(wh_send_str(fd, json) == 0, "cycle %llu: sending the manifest failed",
                 (unsigned long long)g);
        char *ack;
        WG_CHECK(wh_recv(fd, &ack, NULL) == 0,
                 "cycle %llu: the consumer closed the socket instead of acking (see its message)",
                 (unsigned long long)g);
        WG_CHECK(strcmp(ack, "ack") == 0, "cycle %llu: consumer answered \"%s\"",
                 (unsigned long long)g, ack);
        wh_free(ack);
        if (g >= SOAK_WARMUP && (g == SOAK_WARMUP || g % SOAK_EVERY == 0))
            meter_sample(&m, g);
    }
    wr_phase("retire");
    WG_OK(p->producer->wait_consumed(s, st, SOAK_CYCLES, err));
    wg_close_and_retire(p, s, fd);
    meter_print(&m, "");
    return 0;
}

static int consumer(int fd, void *arg)
{
    wr_watchdog("soak consumer", SOAK_ALARM_S);
    wr_phase("load");
    const wsync_plugin_t *p = wg_load(arg, 1);
    wsync_consumer_t *c = wg_consumer(p, 10000);
    wsync_stream_t st;
    WG_OK(p->consumer->stream_create(c, &st, err));
    unsigned char *dst[SOAK_N];
    for (size_t k = 0; k < SOAK_N; k++)
        WG_OK(p->consumer->mem_alloc(c, SOAK_TENSOR, (void **)&dst[k], err));
    wsync_handle_t *pin = NULL; /* held all run: per-cycle opens are cache hits */
    const char *kind = "?";
    soak_meter_t m = {.who = "consumer", .t0 = wr_now_ms()};
    for (uint64_t g = 1; g <= SOAK_CYCLES; g++) {
        wr_phase("cycle %llu", (unsigned long long)g);
        char *json;
        size_t len;
        WG_CHECK(wh_recv(fd, &json, &len) == 0,
                 "cycle %llu: no manifest (the producer exited; see its message)",
                 (unsigned long long)g);
        const wsync_manifest_t *man;
        WG_OK(p->consumer->parse_manifest(c, json, len, &man, err));
        WG_CHECK(man->generation == g && man->n_tensors == SOAK_N,
                 "cycle %llu: manifest of generation %llu with %zu tensors", (unsigned long long)g,
                 (unsigned long long)man->generation, (size_t)man->n_tensors);
        if (pin == NULL) {
            WG_OK(p->consumer->open_handle(c, &man->buffer, &pin, err));
            kind = man->buffer.kind == WSYNC_BUFFER_CUDA_VMM_FD ? "cuda_vmm_fd" : "cuda_ipc";
        }
        wsync_handle_t *h;
        WG_OK(p->consumer->open_handle(c, &man->buffer, &h, err));
        wsync_copy_op_t ops[SOAK_N];
        for (size_t k = 0; k < SOAK_N; k++) {
            const wsync_tensor_desc_t *td = &man->tensors[k];
            WG_CHECK(td->nbytes == SOAK_TENSOR && td->has_digest,
                     "cycle %llu: tensor %zu has %llu bytes, digest %d", (unsigned long long)g, k,
                     (unsigned long long)td->nbytes, td->has_digest);
            ops[k] = (wsync_copy_op_t){.src_offset = td->offset,
                                       .src_pitch = SOAK_TENSOR,
                                       .dst = dst[k],
                                       .dst_pitch = SOAK_TENSOR,
                                       .dst_extent = SOAK_TENSOR,
                                       .rows = 1,
                                       .row_bytes = SOAK_TENSOR,
                                       .digest = td->digest,
                                       .has_digest = 1};
        }
        WG_OK(p->consumer->copy_weights(c, h, st, g, ops, SOAK_N, WSYNC_COPY_VERIFY, err));
        WG_OK(p->consumer->record_consumed(c, h, 1, err));
        WG_OK(p->consumer->close_handle(c, h, err));
        p->consumer->manifest_free(c, man);
        wh_free(json);
        const int sample = g >= SOAK_WARMUP && (g == SOAK_WARMUP || g % SOAK_EVERY == 0);
        if (sample) { /* before the ack: the producer may not restage yet */
            for (size_t k = 0; k < SOAK_N; k++) {
                unsigned long long bad = wr_count_bad(dst[k], SOAK_TENSOR, wr_seed(g, k));
                WG_CHECK(bad == 0,
                         "cycle %llu: parameter %zu has %llu of %u words that differ "
                         "from generation %llu",
                         (unsigned long long)g, k, bad, SOAK_TENSOR / 8, (unsigned long long)g);
            }
        }
        WG_CHECK(wh_send_str(fd, "ack") == 0, "cycle %llu: sending the ack failed",
                 (unsigned long long)g);
        if (sample)
            meter_sample(&m, g);
    }
    wr_phase("close");
    WG_OK(p->consumer->close_handle(c, pin, err));
    WG_CHECK(wh_send_str(fd, "closed") == 0, "sending the close message failed");
    char extra[160];
    snprintf(extra, sizeof(extra), " kind=%s buffer_opens=%llu (1 expected: opens hit the cache)",
             kind, wh_stats.ipc_mem_opens);
    WG_CHECK(wh_stats.seen && wh_stats.ipc_mem_opens == 1,
             "the buffer was mapped %llu times in %u cycles (stats seen %d): open_handle on a held "
             "mapping must not map again",
             wh_stats.ipc_mem_opens, SOAK_CYCLES, wh_stats.seen);
    for (size_t k = 0; k < SOAK_N; k++)
        WG_OK(p->consumer->mem_free(c, dst[k], err));
    WG_OK(p->consumer->stream_destroy(c, st, err));
    WG_OK(p->consumer->finalize(c, err));
    meter_print(&m, extra);
    return 0;
}

static void test_soak(void **state)
{
    (void)state;
    int ps = -1;
    long t0 = wr_now_ms();
    int cs = wg_run_pair(producer, consumer, (void *)WG_PLUGIN, &ps);
    print_message("soak: consumer exit %d, producer exit %d, %.1f s wall (-1: killed by a "
                  "signal; 3: its watchdog fired, message above)\n",
                  cs, ps, (double)(wr_now_ms() - t0) / 1000.0);
    assert_int_equal(cs, 0);
    assert_int_equal(ps, 0);
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
