/* wsync-bench-cuda: throughput of libwsync_cuda.so against the limits measured in the same run.
 *
 *   wsync-bench-cuda [--layout dense|moe|both] [--iters N] [--plugin PATH] [--layers L]
 *                    [--scale S] [--bucket-mib M] [--params fused|separate] [--order hf|grouped]
 *   wsync-bench-cuda --lora [--iters N] [--plugin PATH] [--layers L]   (wsync_bench_lora.h)
 *   wsync-bench-cuda --pingpong [--iters N]                             (wsync_bench_pingpong.h)
 *   wsync-bench-cuda --lanes [--layout L] [--iters N]                   (wsync_bench_lanes.h)
 *   wsync-bench-cuda --digest [--layout L] [--iters N] [--plugin PATH]  (wsync_bench_digest.h)
 *   wsync-bench-cuda --fp8 [--layout L] [--iters N] [--params P]        (wsync_bench_fp8.h)
 *
 * One consumer process per layout measures, with CUDA events (median of N after warm-up):
 *   (a) one cudaMemcpyAsync of the whole packed payload (the limit),
 *   (b) one cudaMemcpyAsync per tensor,
 *   the plugin's copy_weights from a staging buffer exported by a producer process into engine
 *   parameters, without and with verification: --params fused (default) holds them as SGLang,
 *   vLLM and LMDeploy do (per layer one qkv_proj, one gate_up_proj or, for MoE, one w13 and one
 *   w2 over all experts; wb_layout_group), --params separate one cudaMalloc per tensor; the
 *   trainer's MoE tensors come in HF module order (--order hf, default) or grouped as Megatron
 *   holds its experts (--order grouped: every expert's gate and up, then every down),
 *   the bare kernel at each launch variant,
 *   (c) a full colocated sync, trainer params -> 1 GiB staging (reused) -> engine params,
 *   through the plugin in two processes (ms per sync, wall clock until the engine stream is
 *   done), (d) IPC opens per sync in steady state (the plugin's stats line), and (e) direct
 *   syncs (wsync_bench_direct.h): the engine copies straight from the trainer's allocations,
 *   one cudaMalloc per tensor, one for all, or one cuMem range (torch's expandable segments),
 *   end to end and on the GPU alone.
 * The producer is this program re-executed with --role producer. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "wsync_abi.h"
#include "wsync_client.h"
#include "wsync_bench_digest.h"
#include "wsync_bench_direct.h"
#include "wsync_bench_engine.h"
#include "wsync_bench_fp8.h"
#include "wsync_bench_lanes.h"
#include "wsync_bench_layout.h"
#include "wsync_bench_lora.h"
#include "wsync_bench_pingpong.h"
#include "wsync_copy_kernel.h"
#include "wsync_cuda_harness.h"

#define WB_WARMUP 3
#define WB_MAX_BUF 4 /* (c) is measured with 1, 2 and 4 staging buffers */
#define WB_TL_MAX 64 /* buckets of a sync's host timeline */

typedef struct wb_opts {
    const char *layout;
    const char *plugin;
    const char *role;
    int fd;
    unsigned iters, layers, scale;
    uint64_t bucket;
    int lora;
    int pingpong;
    int lanes;
    int digest;
    int fp8; /* --fp8: the quantizing copy's rows (f) only, wsync_bench_fp8.h */
    const char *dir;
    const char *params; /* "fused" | "separate": the consumer's engine parameters */
    int grouped;        /* --order grouped: the trainer's MoE experts grouped (see the layout) */
} wb_opts_t;

static char wb_self[PATH_MAX];

/* ------------------------------------------------------------------ producer */

typedef struct wb_stage_arg {
    const wsync_plugin_t *p;
    wsync_staging_t *s;
    const wb_layout_t *l;
    const wb_plan_t *plan;
    unsigned char *trainer;
    double host_ms; /* summed over the calls */
    unsigned calls;
} wb_stage_arg_t;

static void wb_stage_all(void *a, cudaStream_t st)
{
    wb_stage_arg_t *x = a;
    double t0 = wh_now_ms();
    for (size_t b = 0; b < x->plan->nb; b++)
        wb_stage_pieces(x->p, x->s, st, x->l, x->plan, b, x->trainer, NULL);
    x->host_ms += wh_now_ms() - t0;
    x->calls++;
}

/* Messages: consumer -> producer "retire" | "sync" | "quit"; producer -> consumer manifests,
 * "retired", "synced". */
static int wb_producer_main(const wb_opts_t *o)
{
    wb_layout_t l;
    char why[512];
    const wsync_plugin_t *p;
    if (wb_layout_build(o->layout, o->layers, o->scale, o->grouped, &l) != 0)
        return 1;
    if (wh_load(o->plugin, &p, why, sizeof(why)) != WSYNC_OK) {
        fprintf(stderr, "wsync-bench-cuda producer: %s\n", why);
        return 1;
    }
    WB_CK(cudaSetDevice(0));
    unsigned char *trainer;
    WB_CK(cudaMalloc((void **)&trainer, l.packed));
    WB_CK(wh_fill_mask(trainer, l.packed, WB_SEED, WB_FILL_MASK, 0));
    WB_CK(cudaDeviceSynchronize()); /* benchmark set-up only, never on the plugin's path */
    cudaStream_t st;
    WB_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* The raw trainer buffer too, so the consumer can time plain copies from IPC memory. */
    cudaIpcMemHandle_t th;
    WB_CK(cudaIpcGetMemHandle(&th, trainer));
    wh_send(o->fd, &th, sizeof(th));

    /* Phase 1: the whole layout in one staging buffer, for the copy measurements. */
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = l.packed};
    wsync_staging_t *whole;
    WB_OK(p->producer->create(&cfg, &whole, err));
    wb_plan_t one;
    if (wb_plan_build(&l, l.packed, 0, 2.0, &one) != 0 || one.nb != 1)
        return 1;
    char *m;
    /* the engine asks once its own copies are timed: the two never share the GPU's time */
    wb_recv_expect(o->fd, "stage", &m);
    free(m);
    wb_stage_pieces(p, whole, st, &l, &one, 0, trainer, NULL);
    const char *json;
    uint64_t gen;
    WB_OK(p->producer->publish(whole, st, 1, &json, &gen, err));
    wh_send_str(o->fd, json);
    wb_recv_expect(o->fd, "retire", &m);
    free(m);
    wsync_error_t e = {.struct_size = sizeof(e)};
    wsync_result_t rr = p->producer->retire(whole, &e);
    wh_send_str(o->fd, rr == WSYNC_OK ? "retired" : e.message);

    /* Phase 2: 1 GiB buckets through one reused staging buffer. */
    wb_plan_t plan;
    if (wb_plan_build(&l, o->bucket, 0, 2.0, &plan) != 0)
        return 1;
    cfg.bytes = o->bucket;
    cfg.flags = 0;
    /* sg[0..]: staging with digests ("syncN"); sg[WB_MAX_BUF..]: WSYNC_STAGING_NO_DIGESTS
     * ("fastN"), whose publish never waits for the stage kernel. */
    wsync_staging_t *sg[2 * WB_MAX_BUF];
    uint64_t last[2 * WB_MAX_BUF] = {0};
    for (int k = 0; k < 2 * WB_MAX_BUF; k++) {
        cfg.flags = k < WB_MAX_BUF ? 0 : WSYNC_STAGING_NO_DIGESTS;
        WB_OK(p->producer->create(&cfg, &sg[k], err));
    }
    double tw = 0, ts = 0, tp = 0, ta = 0;
    unsigned syncs = 0;
    /* the last 2-buffer sync without digests, per bucket: wait_consumed called, returned, stage
     * returned, publish returned, sent (ms, CLOCK_MONOTONIC: one clock for both processes) */
    double tl[WB_TL_MAX][5];
    size_t tl_n = 0;
    for (;;) {
        /* "syncN": N staging buffers used in turn (N = 1: one reused for every bucket) */
        wb_recv_expect(o->fd, "sync", &m);
        if (strncmp(m, "direct-", 7) == 0) { /* (e): direct syncs from this trainer's memory */
            wb_direct_serve(p, o->fd, st, &l, o->bucket, trainer, m);
            free(m);
            continue;
        }
        int quit = strcmp(m, "quit") == 0;
        /* "fastkN": the no-digest set staged by the kernel alone (no copy-engine share) */
        int kernel_only = strncmp(m, "fastk", 5) == 0;
        int fast = strncmp(m, "fast", 4) == 0;
        int nbuf = strncmp(m, "sync", 4) == 0 || fast ? atoi(m + (kernel_only ? 5 : 4)) : 1;
        if (kernel_only)
            setenv("WSYNC_CUDA_CE_SHARE", "0", 1);
        else
            unsetenv("WSYNC_CUDA_CE_SHARE");
        if (nbuf < 1 || nbuf > WB_MAX_BUF)
            nbuf = 1;
        free(m);
        const int set = fast ? WB_MAX_BUF : 0;
        if (quit)
            break;
        syncs++;
        const int timeline = fast && !kernel_only && nbuf == 2;
        for (size_t b = 0; b < plan.nb; b++) {
            wsync_staging_t *s = sg[set + b % nbuf];
            uint64_t *lg = &last[set + b % nbuf];
            double t0 = wh_now_ms();
            if (*lg > 0) /* the consumer acked that generation: order the reuse after it */
                WB_OK(p->producer->wait_consumed(s, st, *lg, err));
            double t1 = wh_now_ms();
            wb_stage_pieces(p, s, st, &l, &plan, b, trainer, NULL);
            double t2 = wh_now_ms();
            WB_OK(p->producer->publish(s, st, b + 1 == plan.nb, &json, lg, err));
            double t3 = wh_now_ms();
            wh_send_str(o->fd, json);
            const double t_sent = wh_now_ms();
            if (nbuf == 1 || b + 1 == plan.nb) {
                wb_recv_expect(o->fd, "ack", &m);
                free(m);
            }
            double t4 = wh_now_ms();
            tw += t1 - t0, ts += t2 - t1, tp += t3 - t2, ta += t4 - t3;
            if (timeline && b < WB_TL_MAX) {
                const double row[5] = {t0, t1, t2, t3, t_sent};
                memcpy(tl[b], row, sizeof(row));
                tl_n = b + 1;
            }
        }
        if (nbuf > 1)
            for (size_t b = 0; b + 1 < plan.nb; b++) {
                wb_recv_expect(o->fd, "ack", &m);
                free(m);
            }
    }
    if (syncs)
        printf("  producer host ms per sync: wait_consumed %.2f, stage %.2f, publish (waits for "
               "the stage kernel) %.2f, send + ack %.2f\n",
               tw / syncs, ts / syncs, tp / syncs, ta / syncs);
    if (tl_n > 0) {
        printf("  timeline producer (last sync, 2 buffers, no digests), CLOCK_MONOTONIC ms per "
               "bucket: wait_consumed called-returned, stage returned, publish returned, sent:");
        for (size_t b = 0; b < tl_n; b++)
            printf(" b%zu %.3f-%.3f %.3f %.3f %.3f", b, tl[b][0], tl[b][1], tl[b][2], tl[b][3],
                   tl[b][4]);
        printf("\n");
    }
    /* The stage alone, once the engine has stopped using the GPU (it waits for this process):
     * the whole layout into one buffer, and every bucket in turn into one 1 GiB buffer (a stage
     * may follow a stage before a publish), event-timed. */
    for (int w = 0; w < 2; w++) {
        wsync_staging_t *one_s;
        cfg.bytes = w == 0 ? l.packed : o->bucket;
        cfg.flags = 0;
        WB_OK(p->producer->create(&cfg, &one_s, err));
        wb_stage_arg_t sa = {
            .p = p, .s = one_s, .l = &l, .plan = w == 0 ? &one : &plan, .trainer = trainer};
        cudaEvent_t se0, se1;
        WB_CK(cudaEventCreate(&se0));
        WB_CK(cudaEventCreate(&se1));
        const double ms = wh_time_events("wsync-bench-cuda producer", se0, se1, st, WB_WARMUP, 5,
                                         wb_stage_all, &sa);
        printf("  producer: stage alone (kernel with digests), %s: %.3f ms, %.1f GB/s (host time "
               "of its stage calls %.3f ms)\n",
               w == 0 ? "whole layout in one call" : "bucket after bucket into one 1 GiB buffer",
               ms, l.payload / ms / 1e6, sa.host_ms / sa.calls);
        WB_CK(cudaEventDestroy(se0));
        WB_CK(cudaEventDestroy(se1));
        WB_OK(p->producer->retire(one_s, err));
    }
    fflush(stdout);
    WB_CK(cudaStreamSynchronize(st));
    for (int k = 0; k < 2 * WB_MAX_BUF; k++) {
        wsync_result_t r2;
        do { /* the consumer closes its handles before quitting; wait for its close */
            e.code = WSYNC_OK;
            r2 = p->producer->retire(sg[k], &e);
            if (r2 == WSYNC_ERR_BUSY)
                usleep(1000);
        } while (r2 == WSYNC_ERR_BUSY);
    }
    cudaFree(trainer);
    wb_plan_free(&one);
    wb_plan_free(&plan);
    wb_layout_free(&l);
    return 0;
}

/* ------------------------------------------------------------------ consumer */

/* --fp8: the producer's phase 1 (the whole layout in one staging buffer) quantized into FP8
 * engine parameters (wb_fp8_run), then the producer told to retire it and quit. */
static int wb_fp8_consumer(wb_engine_t *E, int fd, pid_t prod, const wb_opts_t *o)
{
    char *msg;
    size_t len;
    if (wh_recv(fd, &msg, &len) != 0) /* the trainer's IPC handle: the (a') rows only */
        return 1;
    free(msg);
    if (wb_layout_group(&E->l, strcmp(o->params, "fused") == 0) != 0)
        return 1;
    wh_send_str(fd, "stage");
    if (wh_recv(fd, &msg, &len) != 0)
        return 1;
    const wsync_manifest_t *m;
    WB_OK(E->p->consumer->parse_manifest(E->c, msg, len, &m, err));
    wsync_handle_t *h;
    WB_OK(E->p->consumer->open_handle(E->c, &m->buffer, &h, err));
    wb_plan_t one;
    if (wb_plan_build(&E->l, E->l.packed, 0, 2.0, &one) != 0)
        return 1;
    const unsigned long long bad = wb_fp8_run(E, h, m, &one, o->iters);
    WB_OK(E->p->consumer->close_handle(E->c, h, err));
    E->p->consumer->manifest_free(E->c, m);
    free(msg);
    wb_plan_free(&one);
    wh_send_str(fd, "retire");
    wb_recv_expect(fd, "retired", &msg);
    free(msg);
    wh_send_str(fd, "quit");
    int st = 0;
    waitpid(prod, &st, 0);
    WB_OK(E->p->consumer->finalize(E->c, err));
    wb_layout_free(&E->l);
    return bad == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static double wb_time_events(wb_engine_t *E, unsigned iters, wh_timed_fn fn, void *arg)
{
    return wh_time_events("wsync-bench-cuda", E->e0, E->e1, E->st, WB_WARMUP, iters, fn, arg);
}

typedef struct wb_copy_arg {
    wb_engine_t *E;
    void *src, *dst;
    wsync_handle_t *h;
    wsync_copy_op_t *ops;
    size_t n_ops;
    uint64_t gen;
    uint32_t flags;
    wsync_cuda_op_t *kops;
    uint64_t chunks;
    wsync_cuda_launch_cfg_t cfg;
    int sm;
    cudaStream_t st2; /* wb_mixed_copy: the copy-engine share */
    cudaEvent_t fork, join;
    uint64_t ce_bytes;
} wb_copy_arg_t;

static void wb_memcpy_whole(void *a, cudaStream_t s)
{
    wb_copy_arg_t *x = a;
    WB_CK(cudaMemcpyAsync(x->dst, x->src, x->E->l.packed, cudaMemcpyDeviceToDevice, s));
}

static void wb_memcpy_each(void *a, cudaStream_t s)
{
    wb_copy_arg_t *x = a;
    for (size_t i = 0; i < x->E->l.n; i++)
        WB_CK(cudaMemcpyAsync(x->E->dst[i], (unsigned char *)x->src + x->E->l.t[i].offset,
                              x->E->l.t[i].bytes, cudaMemcpyDeviceToDevice, s));
}

static void wb_plugin_copy(void *a, cudaStream_t s)
{
    wb_copy_arg_t *x = a;
    WB_OK(
        x->E->p->consumer->copy_weights(x->E->c, x->h, s, x->gen, x->ops, x->n_ops, x->flags, err));
}

static void wb_kernel_copy(void *a, cudaStream_t s)
{
    wb_copy_arg_t *x = a;
    WB_CK(
        wsync_cuda_launch_copy(x->kops, (uint32_t)x->n_ops, x->chunks, NULL, 0, x->sm, &x->cfg, s));
}

static void wb_mixed_copy(void *a, cudaStream_t s)
{
    wb_copy_arg_t *x = a;
    WB_CK(cudaEventRecord(x->fork, s));
    WB_CK(cudaStreamWaitEvent(x->st2, x->fork, 0));
    WB_CK(cudaMemcpyAsync(x->dst, x->src, x->ce_bytes, cudaMemcpyDeviceToDevice, x->st2));
    WB_CK(cudaEventRecord(x->join, x->st2));
    WB_CK(wsync_cuda_launch_copy(x->kops, 1, x->chunks, NULL, 0, x->sm, &x->cfg, s));
    WB_CK(cudaStreamWaitEvent(s, x->join, 0));
}

static void wb_row(const char *what, double ms, uint64_t bytes, double limit_ms, double each_ms)
{
    printf("  %-34s %9.3f %9.1f %10.3f %12.3f\n", what, ms, bytes / ms / 1e6, limit_ms / ms,
           each_ms / ms);
}

/* One full sync: ask the producer, copy every bucket as it arrives. Returns wall ms until the
 * engine stream has finished the last copy. */
static double wb_ct[6]; /* consumer host ms: recv, parse, open, copy, record, close+ack */
/* the last sync's host timeline when asked (wb_tl_on): its request sent, and per bucket the
 * manifest received, copy_weights returned, ack sent; then its end (ms, CLOCK_MONOTONIC) */
static int wb_tl_on;
static size_t wb_tl_n;
static double wb_tl_t0, wb_tl_end, wb_tl[WB_TL_MAX][3];

static double wb_sync(wb_engine_t *E, int fd, wb_plan_t *plan, uint32_t flags, int nbuf,
                      wsync_handle_t **keep, int *digest_failures, const char *kind)
{
    double t0 = wh_now_ms();
    char req[16];
    snprintf(req, sizeof(req), "%s%d", kind, nbuf);
    wh_send_str(fd, req);
    for (size_t b = 0; b < plan->nb; b++) {
        char *json;
        size_t len;
        double q0 = wh_now_ms();
        if (wh_recv(fd, &json, &len) != 0)
            exit(1);
        double q1 = wh_now_ms();
        const wsync_manifest_t *m;
        WB_OK(E->p->consumer->parse_manifest(E->c, json, len, &m, err));
        double q2 = wh_now_ms();
        wsync_handle_t *h;
        WB_OK(E->p->consumer->open_handle(E->c, &m->buffer, &h, err));
        if (keep[b % nbuf] == NULL) /* the engine keeps a reference: the mapping stays cached */
            WB_OK(E->p->consumer->open_handle(E->c, &m->buffer, &keep[b % nbuf], err));
        wsync_copy_op_t *ops = wb_bucket_ops(E, plan, b, m);
        double q3 = wh_now_ms();
        WB_OK(E->p->consumer->copy_weights(E->c, h, E->st, m->generation, ops, m->n_tensors, flags,
                                           err));
        double q4 = wh_now_ms();
        wsync_error_t e = {.struct_size = sizeof(e)};
        wsync_result_t r = E->p->consumer->record_consumed(E->c, h, flags != 0, &e);
        double q5 = wh_now_ms();
        if (r == WSYNC_ERR_DIGEST_MISMATCH)
            (*digest_failures)++;
        else if (r != WSYNC_OK) {
            fprintf(stderr, "wsync-bench-cuda: record_consumed: %s\n", e.message);
            exit(1);
        }
        WB_OK(E->p->consumer->close_handle(E->c, h, err));
        E->p->consumer->manifest_free(E->c, m);
        free(ops);
        free(json);
        wh_send_str(fd, "ack");
        double q6 = wh_now_ms();
        wb_ct[0] += q1 - q0, wb_ct[1] += q2 - q1, wb_ct[2] += q3 - q2, wb_ct[3] += q4 - q3;
        wb_ct[4] += q5 - q4, wb_ct[5] += q6 - q5;
        if (wb_tl_on && b < WB_TL_MAX) {
            wb_tl[b][0] = q1, wb_tl[b][1] = q4, wb_tl[b][2] = q6;
            wb_tl_n = b + 1;
        }
    }
    WB_CK(cudaStreamSynchronize(E->st));
    const double end = wh_now_ms();
    if (wb_tl_on)
        wb_tl_t0 = t0, wb_tl_end = end;
    return end - t0;
}

static int wb_spawn_producer(const wb_opts_t *o, int fd, pid_t *pid)
{
    char fds[16], iters[16], layers[16], scale[16], bucket[32];
    snprintf(fds, sizeof(fds), "%d", fd);
    snprintf(iters, sizeof(iters), "%u", o->iters);
    snprintf(layers, sizeof(layers), "%u", o->layers);
    snprintf(scale, sizeof(scale), "%u", o->scale);
    snprintf(bucket, sizeof(bucket), "%llu", (unsigned long long)(o->bucket >> 20));
    *pid = fork();
    if (*pid == 0) {
        execl(wb_self, wb_self, "--role", "producer", "--fd", fds, "--layout", o->layout,
              "--plugin", o->plugin, "--iters", iters, "--layers", layers, "--scale", scale,
              "--bucket-mib", bucket, "--order", o->grouped ? "grouped" : "hf", (char *)NULL);
        _exit(127);
    }
    return *pid > 0 ? 0 : -1;
}

static int wb_consumer_main(const wb_opts_t *o)
{
    wb_engine_t E;
    memset(&E, 0, sizeof(E));
    char why[512];
    if (wb_layout_build(o->layout, o->layers, o->scale, o->grouped, &E.l) != 0)
        return 1;
    int sv[2];
    pid_t prod;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    int child_fd = dup(sv[1]); /* without CLOEXEC: the producer inherits it */
    if (wb_spawn_producer(o, child_fd, &prod) != 0)
        return 1;
    close(child_fd);
    close(sv[1]);
    int fd = sv[0];

    setenv("WSYNC_CUDA_STATS", "1", 1);
    if (wh_load(o->plugin, &E.p, why, sizeof(why)) != WSYNC_OK) {
        fprintf(stderr, "wsync-bench-cuda: %s\n", why);
        return 1;
    }
    WB_CK(cudaSetDevice(0));
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .device_ordinal = 0};
    WB_OK(E.p->consumer->create(&cc, &E.c, err));
    WB_CK(cudaStreamCreateWithFlags(&E.st, cudaStreamNonBlocking));
    WB_CK(cudaEventCreate(&E.e0));
    WB_CK(cudaEventCreate(&E.e1));
    int sm = 0;
    WB_CK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
    struct cudaDeviceProp prop;
    WB_CK(cudaGetDeviceProperties(&prop, 0));
    if (o->fp8) {
        printf("wsync-bench-cuda --fp8: layout %s on %s (%d SMs): %zu tensors, %.2f GB payload, "
               "%u iters (median, CUDA events), %s engine parameters\n",
               o->layout, prop.name, sm, E.l.n, E.l.payload / 1e9, o->iters, o->params);
        fflush(stdout);
        return wb_fp8_consumer(&E, fd, prod, o);
    }

    void *src, *whole;
    WB_CK(cudaMalloc(&src, E.l.packed));
    WB_CK(cudaMalloc(&whole, E.l.packed));
    const int fused = strcmp(o->params, "fused") == 0;
    if (wb_params_alloc(&E, fused) != 0) {
        fprintf(stderr, "wsync-bench-cuda: out of host memory for the engine parameters\n");
        return 1;
    }
    WB_CK(wh_fill_mask(src, E.l.packed, WB_SEED, WB_FILL_MASK, E.st));
    unsigned long long *bad_dev;
    WB_CK(cudaMalloc((void **)&bad_dev, sizeof(*bad_dev)));
    WB_CK(cudaStreamSynchronize(E.st));

    wb_copy_arg_t A = {.E = &E, .src = src, .dst = whole, .sm = sm};
    double ms_whole = wb_time_events(&E, o->iters, wb_memcpy_whole, &A);
    double ms_each = wb_time_events(&E, o->iters, wb_memcpy_each, &A);

    /* The bare kernel on the local buffers, per launch variant (tuning record). */
    wsync_cuda_op_t *kops_h = malloc(E.l.n * sizeof(*kops_h));
    uint64_t chunks = 0;
    for (size_t i = 0; i < E.l.n; i++)
        chunks += wsync_cuda_plan_op(&kops_h[i], (unsigned char *)src + E.l.t[i].offset, E.dst[i],
                                     E.l.t[i].bytes, E.l.t[i].bytes, 1, E.l.t[i].bytes, 0, chunks);
    WB_CK(cudaMalloc((void **)&A.kops, E.l.n * sizeof(*kops_h)));
    WB_CK(cudaMemcpy(A.kops, kops_h, E.l.n * sizeof(*kops_h), cudaMemcpyHostToDevice));
    A.n_ops = E.l.n;
    A.chunks = chunks;
    A.cfg.flat = 1;
    for (size_t i = 0; i < E.l.n; i++)
        A.cfg.flat &= wsync_cuda_op_is_flat(&kops_h[i]);
#define WB_NVAR 9 /* 7, 8: cudaMemcpyBatchAsync inside copy_weights (no bare kernel) */
#define WB_BARE(v) ((v) != 7 && (v) != 8)
    double ms_var[WB_NVAR], ms_var_ipc[WB_NVAR], ms_plugin_var[WB_NVAR];
    for (int v = 0; v < WB_NVAR; v++) {
        A.cfg.variant = v;
        ms_var[v] = WB_BARE(v) ? wb_time_events(&E, o->iters, wb_kernel_copy, &A) : 0;
    }
    /* The bare kernel over the whole payload as one op, into one allocation: what the kernel
     * does where (a) does, without per-tensor destinations. */
    wsync_cuda_op_t whole_op;
    wsync_cuda_op_t *whole_dev;
    uint64_t whole_chunks =
        wsync_cuda_plan_op(&whole_op, src, whole, E.l.packed, E.l.packed, 1, E.l.packed, 0, 0);
    WB_CK(cudaMalloc((void **)&whole_dev, sizeof(whole_op)));
    WB_CK(cudaMemcpy(whole_dev, &whole_op, sizeof(whole_op), cudaMemcpyHostToDevice));
    wb_copy_arg_t W = A;
    W.kops = whole_dev;
    W.n_ops = 1;
    W.chunks = whole_chunks;
    W.cfg.variant = WSYNC_CUDA_VARIANT_CONTIGUOUS;
    W.cfg.flat = 1;
    const double ms_kernel_whole = wb_time_events(&E, o->iters, wb_kernel_copy, &W);
    /* The copy engines and the kernel together: a share f of the payload as one
     * cudaMemcpyAsync on a second stream, the rest by the kernel, joined. */
    static const double fr[] = {0.25, 0.4, 0.5, 0.6, 0.75};
    double ms_mixed[sizeof(fr) / sizeof(fr[0])];
    WB_CK(cudaStreamCreateWithFlags(&W.st2, cudaStreamNonBlocking));
    WB_CK(cudaEventCreateWithFlags(&W.fork, cudaEventDisableTiming));
    WB_CK(cudaEventCreateWithFlags(&W.join, cudaEventDisableTiming));
    W.kops = NULL;
    for (size_t k = 0; k < sizeof(fr) / sizeof(fr[0]); k++) {
        W.ce_bytes = ((uint64_t)(E.l.packed * fr[k])) & ~(uint64_t)(WSYNC_CUDA_CHUNK_BYTES - 1);
        wsync_cuda_op_t rest;
        W.chunks = wsync_cuda_plan_op(&rest, (unsigned char *)src + W.ce_bytes,
                                      (unsigned char *)whole + W.ce_bytes, E.l.packed - W.ce_bytes,
                                      E.l.packed - W.ce_bytes, 1, E.l.packed - W.ce_bytes, 0, 0);
        WB_CK(cudaMemcpy(whole_dev, &rest, sizeof(rest), cudaMemcpyHostToDevice));
        W.kops = whole_dev;
        ms_mixed[k] = wb_time_events(&E, o->iters, wb_mixed_copy, &W);
    }
    /* The same from memory another process exported (legacy IPC), like the staging buffer. */
    cudaIpcMemHandle_t th;
    char *thb;
    size_t thl;
    if (wh_recv(fd, &thb, &thl) != 0 || thl != sizeof(th))
        return 1;
    memcpy(&th, thb, sizeof(th));
    free(thb);
    void *ipc_src;
    WB_CK(cudaIpcOpenMemHandle(&ipc_src, th, cudaIpcMemLazyEnablePeerAccess));
    A.src = ipc_src;
    double ms_whole_ipc = wb_time_events(&E, o->iters, wb_memcpy_whole, &A);
    for (size_t i = 0; i < E.l.n; i++)
        kops_h[i].src = (const unsigned char *)ipc_src + E.l.t[i].offset;
    WB_CK(cudaMemcpy(A.kops, kops_h, E.l.n * sizeof(*kops_h), cudaMemcpyHostToDevice));
    for (int v = 0; v < WB_NVAR; v++) {
        A.cfg.variant = v;
        ms_var_ipc[v] = WB_BARE(v) ? wb_time_events(&E, o->iters, wb_kernel_copy, &A) : 0;
    }
    A.src = src;

    /* The plugin's copy from the producer's exported staging buffer. */
    wh_send_str(fd, "stage");
    char *json;
    size_t len;
    if (wh_recv(fd, &json, &len) != 0)
        return 1;
    const wsync_manifest_t *m;
    WB_OK(E.p->consumer->parse_manifest(E.c, json, len, &m, err));
    wsync_handle_t *h;
    WB_OK(E.p->consumer->open_handle(E.c, &m->buffer, &h, err));
    const char *staging_kind =
        m->buffer.kind == WSYNC_BUFFER_CUDA_VMM_FD ? "cuda_vmm_fd" : "cuda_ipc";
    wb_plan_t one;
    if (wb_plan_build(&E.l, E.l.packed, 0, 2.0, &one) != 0)
        return 1;
    A.h = h;
    A.ops = wb_bucket_ops(&E, &one, 0, m);
    A.n_ops = m->n_tensors;
    A.gen = m->generation;
    A.flags = 0;
    setenv("WSYNC_CUDA_CE_SHARE", "0", 1); /* the kernel variants alone */
    for (int v = 0; v < WB_NVAR; v++) {    /* the plugin reads its tuning knobs per call */
        char vs[8];
        snprintf(vs, sizeof(vs), "%d", v);
        setenv("WSYNC_CUDA_KERNEL_VARIANT", vs, 1);
        ms_plugin_var[v] = wb_time_events(&E, o->iters, wb_plugin_copy, &A);
    }
    unsetenv("WSYNC_CUDA_KERNEL_VARIANT");
    /* The copy engines' share of copy_weights (WSYNC_CUDA_CE_SHARE, _MIN_BYTES, _LANES), default
     * variant; NULL = the default. */
    static const struct {
        const char *share, *min, *lanes;
    } shs[] = {{"0", NULL, NULL},   {NULL, NULL, NULL},       {NULL, NULL, "1"},
               {NULL, NULL, "3"},   {NULL, "67108864", NULL}, {NULL, "1048576", NULL},
               {"0.5", NULL, NULL}, {"0.3", "67108864", "1"}};
#define WB_NSH (sizeof(shs) / sizeof(shs[0]))
    double ms_share[WB_NSH];
    for (size_t k = 0; k < WB_NSH; k++) {
        const char *names[3] = {"WSYNC_CUDA_CE_SHARE", "WSYNC_CUDA_CE_MIN_BYTES",
                                "WSYNC_CUDA_CE_LANES"};
        const char *vals[3] = {shs[k].share, shs[k].min, shs[k].lanes};
        for (int j = 0; j < 3; j++)
            vals[j] ? setenv(names[j], vals[j], 1) : unsetenv(names[j]);
        ms_share[k] = wb_time_events(&E, o->iters, wb_plugin_copy, &A);
        for (int j = 0; j < 3; j++)
            unsetenv(names[j]);
    }
    double ms_plugin = wb_time_events(&E, o->iters, wb_plugin_copy, &A);
    A.flags = WSYNC_COPY_VERIFY;
    double ms_verify = wb_time_events(&E, o->iters, wb_plugin_copy, &A);
    wsync_error_t e = {.struct_size = sizeof(e)};
    wsync_result_t r = E.p->consumer->record_consumed(E.c, h, 1, &e);
    unsigned long long bad = wb_count_bad(&E, bad_dev);
    printf("wsync-bench-cuda: layout %s on %s (%d SMs): %zu tensors, %.2f GB payload, %u "
           "iters (median, CUDA events)\n",
           o->layout, prop.name, sm, E.l.n, E.l.payload / 1e9, o->iters);
    wb_params_print(&E, fused);
    printf("  staging buffer kind: %s\n", staging_kind);
    printf("  copy check: digests %s%s, %llu wrong words in engine params\n",
           r == WSYNC_OK ? "ok" : "FAILED: ", r == WSYNC_OK ? "" : e.message, bad);
    WB_OK(E.p->consumer->close_handle(E.c, h, err));
    E.p->consumer->manifest_free(E.c, m);
    free(json);
    free(A.ops);
    wb_plan_free(&one);
    wh_send_str(fd, "retire");
    char *ans;
    wb_recv_expect(fd, "retired", &ans);
    printf("  retire after close: %s\n", ans);
    free(ans);

    printf("  %-34s %9s %9s %10s %12s\n", "method", "ms", "GB/s", "vs memcpy", "vs per-tensor");
    wb_row("(a) cudaMemcpyAsync, whole payload", ms_whole, E.l.payload, ms_whole, ms_each);
    wb_row("(b) cudaMemcpyAsync per tensor", ms_each, E.l.payload, ms_whole, ms_each);
    wb_row("copy_weights", ms_plugin, E.l.payload, ms_whole, ms_each);
    wb_row("copy_weights + verify", ms_verify, E.l.payload, ms_whole, ms_each);
    wb_row("(a') cudaMemcpyAsync, from IPC memory", ms_whole_ipc, E.l.payload, ms_whole, ms_each);
    wb_row("kernel variant 0, whole as one op", ms_kernel_whole, E.l.payload, ms_whole, ms_each);
    for (size_t k = 0; k < sizeof(fr) / sizeof(fr[0]); k++) {
        char what[64];
        snprintf(what, sizeof(what), "whole: %.0f%% memcpy + kernel", fr[k] * 100);
        wb_row(what, ms_mixed[k], E.l.payload, ms_whole, ms_each);
    }
    for (int v = 0; v < WB_NVAR; v++) {
        char what[64];
        if (WB_BARE(v)) {
            snprintf(what, sizeof(what), "kernel variant %d, local src", v);
            wb_row(what, ms_var[v], E.l.payload, ms_whole, ms_each);
            snprintf(what, sizeof(what), "kernel variant %d, IPC src", v);
            wb_row(what, ms_var_ipc[v], E.l.payload, ms_whole, ms_each);
        }
        snprintf(what, sizeof(what), "copy_weights, variant %d", v);
        wb_row(what, ms_plugin_var[v], E.l.payload, ms_whole, ms_each);
    }
    for (size_t k = 0; k < WB_NSH; k++) {
        char what[80];
        snprintf(what, sizeof(what), "copy_weights, CE share %s, >= %s MiB, %s lane%s",
                 shs[k].share ? shs[k].share : "1",
                 shs[k].min ? (shs[k].min[0] == '6' ? "64" : "1") : "16",
                 shs[k].lanes ? shs[k].lanes : "2",
                 shs[k].lanes && strcmp(shs[k].lanes, "1") == 0 ? "" : "s");
        wb_row(what, ms_share[k], E.l.payload, ms_whole, ms_each);
    }

    /* (c) + (d): full syncs through 1 GiB buckets: one staging buffer reused for every bucket,
     * then two used alternately (stage of bucket b+1 overlaps the copy of bucket b). */
    wb_plan_t plan;
    if (wb_plan_build(&E.l, o->bucket, 0, 2.0, &plan) != 0)
        return 1;
    wsync_handle_t *keep[WB_MAX_BUF] = {NULL};
    int failures = 0;
    double *t = calloc(o->iters, sizeof(*t));
    double ms_sync[WB_MAX_BUF + 1] = {0};
    unsigned long long opens_per[WB_MAX_BUF + 1] = {0};
    for (int nbuf = 1; nbuf <= WB_MAX_BUF; nbuf *= 2) {
        unsigned long long opens0 = 0;
        memset(wb_ct, 0, sizeof(wb_ct));
        for (unsigned i = 0; i < WB_WARMUP + o->iters; i++) {
            if (i == WB_WARMUP)
                opens0 = wh_stats.ipc_mem_opens;
            double ms = wb_sync(&E, fd, &plan, 0, nbuf, keep, &failures, "sync");
            if (i >= WB_WARMUP)
                t[i - WB_WARMUP] = ms;
        }
        opens_per[nbuf] = wh_stats.ipc_mem_opens - opens0;
        ms_sync[nbuf] = wh_median(t, o->iters);
        unsigned nsync = WB_WARMUP + o->iters;
        printf("  (c) full sync, %zu buckets of <= %llu MiB through %d staging buffer%s, %.2f GB: "
               "median %.2f ms, %.1f GB/s end to end\n",
               plan.nb, (unsigned long long)(o->bucket >> 20), nbuf, nbuf > 1 ? "s" : "",
               E.l.payload / 1e9, ms_sync[nbuf], E.l.payload / ms_sync[nbuf] / 1e6);
        printf("      consumer host ms per sync: recv wait %.2f, parse %.2f, open %.2f, "
               "copy_weights %.2f, record_consumed %.2f, close + ack %.2f\n",
               wb_ct[0] / nsync, wb_ct[1] / nsync, wb_ct[2] / nsync, wb_ct[3] / nsync,
               wb_ct[4] / nsync, wb_ct[5] / nsync);
        printf("  (d) IPC opens per sync in steady state: %.3f (%llu opens over %u syncs; %s)\n",
               (double)opens_per[nbuf] / o->iters, opens_per[nbuf], o->iters,
               wh_stats.seen ? "plugin stats" : "NO stats line seen");
    }
    /* Producer staging without digests: publish does not wait for the stage kernel. */
    wsync_handle_t *keep_fast[WB_MAX_BUF] = {NULL};
    wb_tl_on = 1;
    for (unsigned i = 0; i < WB_WARMUP + o->iters; i++) {
        double ms = wb_sync(&E, fd, &plan, 0, 2, keep_fast, &failures, "fast");
        if (i >= WB_WARMUP)
            t[i - WB_WARMUP] = ms;
    }
    wb_tl_on = 0;
    double ms_fast = wh_median(t, o->iters);
    printf("  (c) full sync, %zu buckets through 2 staging buffers, producer without digests "
           "(WSYNC_STAGING_NO_DIGESTS): median %.2f ms, %.1f GB/s end to end\n",
           plan.nb, ms_fast, E.l.payload / ms_fast / 1e6);
    printf("  timeline consumer (last sync, 2 buffers, no digests), CLOCK_MONOTONIC ms: request "
           "%.3f, per bucket manifest received, copy_weights returned, ack sent:",
           wb_tl_t0);
    for (size_t b = 0; b < wb_tl_n; b++)
        printf(" b%zu %.3f %.3f %.3f", b, wb_tl[b][0], wb_tl[b][1], wb_tl[b][2]);
    printf("; stream synchronized %.3f\n", wb_tl_end);
    /* The copy engines' share on either side: "0" = the consumer's kernel alone; "fastk" =
     * the producer's kernel alone (a stage with digests always runs on the kernel alone). */
    static const struct {
        const char *kind;
        int nbuf;
        const char *variant;
        const char *what;
    } xs[] = {
        {"sync", 2, "0", "digests, both kernels alone"},
        {"fastk", 2, "0", "no digests, both kernels alone"},
        {"fastk", 2, NULL, "no digests, stage kernel alone, copy with copy-engine share"},
        {"fast", 4, NULL, "no digests, publish never waits: the trainer 3 buckets ahead"},
    };
    double ms_x[sizeof(xs) / sizeof(xs[0])];
    for (size_t x = 0; x < sizeof(xs) / sizeof(xs[0]); x++) {
        if (xs[x].variant)
            setenv("WSYNC_CUDA_CE_SHARE", xs[x].variant, 1);
        wsync_handle_t **kp = strcmp(xs[x].kind, "sync") == 0 ? keep : keep_fast;
        for (unsigned i = 0; i < WB_WARMUP + o->iters; i++) {
            double ms = wb_sync(&E, fd, &plan, 0, xs[x].nbuf, kp, &failures, xs[x].kind);
            if (i >= WB_WARMUP)
                t[i - WB_WARMUP] = ms;
        }
        unsetenv("WSYNC_CUDA_CE_SHARE");
        ms_x[x] = wh_median(t, o->iters);
        printf("  (c) full sync, %d buffer%s, %s (%s%d, consumer CE share %s): median %.2f ms\n",
               xs[x].nbuf, xs[x].nbuf > 1 ? "s" : "", xs[x].what, xs[x].kind, xs[x].nbuf,
               xs[x].variant ? xs[x].variant : "default", ms_x[x]);
        fflush(stdout);
    }
    /* The copy engines' shares on both sides move every byte: poison, sync, check. */
    WB_CK(cudaMemsetAsync(bad_dev, 0, sizeof(*bad_dev), E.st));
    for (size_t i = 0; i < E.l.n; i++)
        WB_CK(cudaMemsetAsync(E.dst[i], 0xA5, E.l.t[i].bytes, E.st));
    wb_sync(&E, fd, &plan, 0, 2, keep_fast, &failures, "fast");
    unsigned long long bad_fast = wb_count_bad(&E, bad_dev);
    printf("  unverified sync with the copy engines' shares (2 buffers, no digests): %llu wrong "
           "words in engine params\n",
           bad_fast);
    for (int k = 0; k < WB_MAX_BUF; k++)
        if (keep_fast[k] != NULL)
            WB_OK(E.p->consumer->close_handle(E.c, keep_fast[k], err));
    WB_CK(cudaMemsetAsync(bad_dev, 0, sizeof(*bad_dev), E.st));
    for (size_t i = 0; i < E.l.n; i++) /* poison, so the verified sync must rewrite it all */
        WB_CK(cudaMemsetAsync(E.dst[i], 0xA5, E.l.t[i].bytes, E.st));
    wb_sync(&E, fd, &plan, WSYNC_COPY_VERIFY, 2, keep, &failures, "sync");
    bad = wb_count_bad(&E, bad_dev);
    for (unsigned i = 0; i < WB_WARMUP + o->iters; i++) {
        double ms = wb_sync(&E, fd, &plan, WSYNC_COPY_VERIFY, 2, keep, &failures, "sync");
        if (i >= WB_WARMUP)
            t[i - WB_WARMUP] = ms;
    }
    const double ms_vsync = wh_median(t, o->iters);
    printf("  verified sync (2 buffers; record_consumed waits for each bucket's check, the trainer "
           "stages the next meanwhile): median %.2f ms, %d digest failures in %u syncs, %llu wrong "
           "words in engine params after the first\n",
           ms_vsync, failures, WB_WARMUP + o->iters + 1, bad);
    printf("  summary %s (%s, %s params, %s order): copy_weights %.3fx memcpy, verify %.3fx, sync "
           "%.2f ms "
           "(1 buffer) %.2f ms (2 buffers) %.2f ms (4 buffers) %.2f ms (2 buffers, no digests) "
           "%.2f ms (2 buffers, verified), opens/sync %.3f\n",
           o->layout, staging_kind, o->params, o->grouped ? "grouped" : "hf", ms_whole / ms_plugin,
           ms_whole / ms_verify, ms_sync[1], ms_sync[2], ms_sync[4], ms_fast, ms_vsync,
           (double)(opens_per[1] + opens_per[2] + opens_per[4]) / (3 * o->iters));
    fflush(stdout);
    for (int k = 0; k < WB_MAX_BUF; k++)
        if (keep[k])
            WB_OK(E.p->consumer->close_handle(E.c, keep[k], err));
    WB_CK(cudaIpcCloseMemHandle(ipc_src)); /* (e) maps the same allocation as a segment */
    /* the baselines' buffers: (e) needs room for the trainer's separate tensors (an 80 GB card) */
    WB_CK(cudaFree(src));
    WB_CK(cudaFree(whole));
    const unsigned long long bad_direct =
        wb_direct_run(&E, fd, o->bucket, o->iters, ms_whole, ms_fast, bad_dev);
    wh_send_str(fd, "quit");
    int st = 0;
    waitpid(prod, &st, 0);
    WB_OK(E.p->consumer->finalize(E.c, err));
    wb_params_free(&E);
    free(t);
    wb_plan_free(&plan);
    wb_layout_free(&E.l);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && failures == 0 && bad == 0 && bad_fast == 0 &&
                   bad_direct == 0
               ? 0
               : 1;
}

static void wb_usage(FILE *f)
{
    fprintf(f, "usage: wsync-bench-cuda [--layout dense|moe|both] [--iters N] [--plugin PATH]\n"
               "                        [--layers L] [--scale S] [--bucket-mib M]\n"
               "                        [--params fused|separate] [--order hf|grouped]\n"
               "       wsync-bench-cuda --lora [--iters N] [--plugin PATH] [--layers L]\n"
               "       wsync-bench-cuda --pingpong [--iters N]\n"
               "       wsync-bench-cuda --lanes [--layout dense|moe|both|none] [--iters N]\n"
               "       wsync-bench-cuda --digest [--layout dense|moe|both] [--iters N]\n"
               "       wsync-bench-cuda --fp8 [--layout dense|moe|both] [--iters N] [--params P]\n"
               "  --params: the engine parameters the copies land in: fused (default; per layer\n"
               "            one qkv_proj, one gate_up_proj or MoE w13 + w2 over all experts, as\n"
               "            SGLang, vLLM and LMDeploy hold them) or separate (one cudaMalloc per\n"
               "            tensor)\n"
               "  --order:  the trainer's MoE tensor order: hf (default; gate, up, down of each\n"
               "            expert in turn, HF module order) or grouped (gate and up of every\n"
               "            expert, then every down, as Megatron's grouped experts hold them)\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"layout", required_argument, NULL, 'l'}, {"iters", required_argument, NULL, 'i'},
        {"plugin", required_argument, NULL, 'p'}, {"layers", required_argument, NULL, 'L'},
        {"scale", required_argument, NULL, 'S'},  {"bucket-mib", required_argument, NULL, 'b'},
        {"role", required_argument, NULL, 'r'},   {"fd", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},         {"lora", no_argument, NULL, 'o'},
        {"dir", required_argument, NULL, 'd'},    {"pingpong", no_argument, NULL, 'P'},
        {"lanes", no_argument, NULL, 'N'},        {"params", required_argument, NULL, 'm'},
        {"order", required_argument, NULL, 'O'},  {"digest", no_argument, NULL, 'D'},
        {"fp8", no_argument, NULL, 'F'},          {NULL, 0, NULL, 0}};
    wb_opts_t o = {.layout = "both",
                   .iters = 20,
                   .scale = 1,
                   .bucket = 1ull << 30,
                   .fd = -1,
                   .params = "fused"};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'l':
            o.layout = optarg;
            break;
        case 'i':
            o.iters = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'p':
            o.plugin = optarg;
            break;
        case 'L':
            o.layers = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'S':
            o.scale = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'b':
            o.bucket = strtoull(optarg, NULL, 10) << 20;
            break;
        case 'r':
            o.role = optarg;
            break;
        case 'f':
            o.fd = atoi(optarg);
            break;
        case 'o':
            o.lora = 1;
            break;
        case 'd':
            o.dir = optarg;
            break;
        case 'P':
            o.pingpong = 1;
            break;
        case 'N':
            o.lanes = 1;
            break;
        case 'D':
            o.digest = 1;
            break;
        case 'F':
            o.fp8 = 1;
            break;
        case 'm':
            o.params = optarg;
            break;
        case 'O':
            if (strcmp(optarg, "hf") != 0 && strcmp(optarg, "grouped") != 0) {
                fprintf(stderr, "wsync-bench-cuda: --order %s: expected hf or grouped\n", optarg);
                return 2;
            }
            o.grouped = strcmp(optarg, "grouped") == 0;
            break;
        case 'h':
            wb_usage(stdout);
            return 0;
        default:
            wb_usage(stderr);
            return 2;
        }
    }
    if (o.iters < 1 || o.scale < 1 || o.bucket == 0 ||
        (strcmp(o.layout, "dense") && strcmp(o.layout, "moe") && strcmp(o.layout, "both") &&
         !(o.lanes && strcmp(o.layout, "none") == 0)) ||
        (strcmp(o.params, "fused") && strcmp(o.params, "separate"))) {
        wb_usage(stderr);
        return 2;
    }
    ssize_t n = readlink("/proc/self/exe", wb_self, sizeof(wb_self) - 1);
    if (n <= 0)
        return 1;
    wb_self[n] = '\0';
    static char plugin[PATH_MAX + 64];
    /* The benchmarks' build of the plugin by default: the product's code and defaults, plus the
     * experiments' variables and kernel variants this program flips (wsync_cuda_tuning.h). */
    o.plugin =
        wh_plugin_path(o.plugin ? o.plugin : "libwsync_cuda_tunable.so", plugin, sizeof(plugin));
    if (o.role && strcmp(o.role, "producer") == 0)
        return wb_producer_main(&o);
    if (o.role && strcmp(o.role, "consumer") == 0)
        return wb_consumer_main(&o);
    if (o.role && strcmp(o.role, "lora-producer") == 0 && o.dir)
        return wb_lora_producer_main(o.plugin, o.fd, o.dir);

    if (o.pingpong) /* forks first: before anything in this process touches CUDA */
        return wb_pingpong_main(o.iters);
    char why[512];
    int pr = wh_probe(o.plugin, why, sizeof(why));
    if (pr != 0) {
        fprintf(stderr, "wsync-bench-cuda: %s: %s\n", pr == 77 ? "no CUDA device" : "cannot load",
                why);
        return pr;
    }
    if (o.lanes)
        return wb_lanes_main(o.layout, o.iters);
    if (o.digest)
        return wb_digest_main(o.plugin, o.layout, o.iters);
    if (o.lora)
        return wb_lora_main(wb_self, o.plugin, o.iters, o.layers);

    int rc = 0;
    const char *layouts[2] = {"dense", "moe"};
    for (int k = 0; k < 2; k++) {
        if (strcmp(o.layout, "both") != 0 && strcmp(o.layout, layouts[k]) != 0)
            continue;
        /* one fresh consumer process per layout */
        pid_t pid = fork();
        if (pid == 0) {
            char iters[16], layers[16], scale[16], bucket[32];
            snprintf(iters, sizeof(iters), "%u", o.iters);
            snprintf(layers, sizeof(layers), "%u", o.layers);
            snprintf(scale, sizeof(scale), "%u", o.scale);
            snprintf(bucket, sizeof(bucket), "%llu", (unsigned long long)(o.bucket >> 20));
            execl(wb_self, wb_self, "--role", "consumer", "--layout", layouts[k], "--plugin",
                  o.plugin, "--iters", iters, "--layers", layers, "--scale", scale, "--bucket-mib",
                  bucket, "--params", o.params, "--order", o.grouped ? "grouped" : "hf",
                  o.fp8 ? "--fp8" : (char *)NULL, (char *)NULL);
            _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "wsync-bench-cuda: layout %s failed\n", layouts[k]);
            rc = 1;
        }
    }
    return rc;
}
