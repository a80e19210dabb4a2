/* wsync-bench-cuda --lanes (see wsync_bench_lanes.h). */
#define _GNU_SOURCE /* qsort_r */
#include "wsync_bench_lanes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "wsync_bench_kernels.h"
#include "wsync_bench_layout.h"
#include "wsync_copy_kernel.h"
#include "wsync_cuda_harness.h"
#include "wsync_quant_kernel.h"

#define WL_MAX_LANES 8
#define WL_WARMUP 2

#define WL_CK(call) WH_CK("wsync-bench-cuda --lanes", call)

typedef struct wl_ce {
    const void *src;
    void *dst;
    uint64_t bytes; /* per row */
    int lane;
    uint64_t rows, spitch, dpitch; /* rows > 1: one cudaMemcpy2DAsync */
} wl_ce_t;

/* One way of moving a batch: copy-engine ops per lane and the kernel's table. */
typedef struct wl_plan {
    wl_ce_t *ce;
    size_t n_ce;
    int lanes;
    int batch; /* one cudaMemcpyBatchAsync per lane instead of a cudaMemcpyAsync per op */
    size_t n_k;
    uint64_t chunks;
    uint64_t ce_bytes;
} wl_plan_t;

typedef struct wl_env {
    cudaStream_t s0, lane[WL_MAX_LANES];
    cudaEvent_t fork, join[WL_MAX_LANES], e0, e1;
    int sm;
    size_t rejected;              /* strided copies the driver refused */
    int64_t max_pitch;            /* cudaDevAttrMaxPitch: the largest stride of one strided copy */
    wsync_cuda_op_t *hops, *dops; /* kernel table, host and device */
    size_t cap;
    unsigned iters;
} wl_env_t;

/* The kernel goes first, so the GPU starts while the host still enqueues the copy engines'
 * ops (a few microseconds each). */
static void wl_enqueue(wl_env_t *x, const wl_plan_t *p)
{
    if (p->n_ce > 0)
        WL_CK(cudaEventRecord(x->fork, x->s0));
    if (p->n_k > 0) {
        const wsync_cuda_launch_cfg_t cfg = {.variant = WSYNC_CUDA_VMM_VARIANT, .flat = 1};
        WL_CK(wsync_cuda_launch_copy(x->dops, (uint32_t)p->n_k, p->chunks, NULL, 0, x->sm, &cfg,
                                     x->s0));
    }
    if (p->n_ce > 0) {
        for (int k = 0; k < p->lanes; k++)
            WL_CK(cudaStreamWaitEvent(x->lane[k], x->fork, 0));
        if (p->batch) {
            void **d = malloc(p->n_ce * sizeof(*d));
            const void **s = malloc(p->n_ce * sizeof(*s));
            size_t *b = malloc(p->n_ce * sizeof(*b));
            for (int k = 0; k < p->lanes; k++) {
                size_t m = 0;
                for (size_t i = 0; i < p->n_ce; i++)
                    if (p->ce[i].lane == k) {
                        d[m] = p->ce[i].dst;
                        s[m] = p->ce[i].src;
                        b[m++] = p->ce[i].bytes;
                    }
                if (m == 0)
                    continue;
                struct cudaMemcpyAttributes a;
                memset(&a, 0, sizeof(a));
                a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
                a.flags = cudaMemcpyFlagPreferOverlapWithCompute;
                size_t idx = 0;
                WL_CK(cudaMemcpyBatchAsync((void *const *)d, (const void *const *)s, b, m, &a, &idx,
                                           1, x->lane[k]));
            }
            free(d);
            free(s);
            free(b);
        } else {
            for (size_t i = 0; i < p->n_ce; i++) {
                const wl_ce_t *c = &p->ce[i];
                if (c->rows > 1)
                    WL_CK(cudaMemcpy2DAsync(c->dst, c->dpitch, c->src, c->spitch, c->bytes, c->rows,
                                            cudaMemcpyDeviceToDevice, x->lane[c->lane]));
                else
                    WL_CK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice,
                                          x->lane[c->lane]));
            }
        }
        for (int k = 0; k < p->lanes; k++)
            WL_CK(cudaEventRecord(x->join[k], x->lane[k]));
    }
    if (p->n_ce > 0)
        for (int k = 0; k < p->lanes; k++)
            WL_CK(cudaStreamWaitEvent(x->s0, x->join[k], 0));
}

/* Median ms of one enqueue function over iters runs after warm-up. */
static double wl_time_fn(wl_env_t *x, wh_timed_fn fn, void *arg)
{
    return wh_time_events("wsync-bench-cuda --lanes", x->e0, x->e1, x->s0, WL_WARMUP,
                          x->iters > 64 ? 64 : x->iters, fn, arg);
}

/* A plan enqueued each time, or (ge) the graph made of it launched. */
typedef struct wl_run_arg {
    wl_env_t *x;
    const wl_plan_t *p;
    cudaGraphExec_t ge;
} wl_run_arg_t;

static void wl_run_fn(void *arg, cudaStream_t s)
{
    const wl_run_arg_t *r = arg;
    if (r->ge != NULL)
        WL_CK(cudaGraphLaunch(r->ge, s));
    else
        wl_enqueue(r->x, r->p);
}

/* The plan's kernel table must be in x->dops. */
static double wl_time_runs(wl_env_t *x, const wl_plan_t *p, cudaGraphExec_t ge)
{
    wl_run_arg_t r = {x, p, ge};
    return wl_time_fn(x, wl_run_fn, &r);
}

static double wl_time(wl_env_t *x, const wl_plan_t *p)
{
    return wl_time_runs(x, p, NULL);
}

/* The same, captured once into a CUDA graph and launched as one; *inst_ms: capture plus
 * instantiation, host time. */
static double wl_time_graph(wl_env_t *x, const wl_plan_t *p, double *inst_ms)
{
    const double t0 = wh_now_ms();
    cudaGraph_t g;
    cudaGraphExec_t ge;
    WL_CK(cudaStreamBeginCapture(x->s0, cudaStreamCaptureModeThreadLocal));
    wl_enqueue(x, p);
    WL_CK(cudaStreamEndCapture(x->s0, &g));
    WL_CK(cudaGraphInstantiate(&ge, g, 0));
    *inst_ms = wh_now_ms() - t0;
    const double ms = wl_time_runs(x, p, ge);
    WL_CK(cudaGraphExecDestroy(ge));
    WL_CK(cudaGraphDestroy(g));
    return ms;
}

/* ---------------------------------------------------------------- planning */

typedef struct wl_batch {
    const unsigned char **src;
    unsigned char **dst;
    uint64_t *bytes;
    size_t n;
    uint64_t payload;
} wl_batch_t;

static int wl_cmp_desc(const void *a, const void *b, void *ctx)
{
    const uint64_t *by = ctx;
    const size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return by[i] < by[j] ? 1 : by[i] > by[j] ? -1 : (i > j) - (i < j);
}

/* Largest ops of at least min_bytes, up to share of the payload, to the copy engines (head:
 * that fraction of each such op, the tail to the kernel), balanced over `lanes` by bytes; the
 * rest to the kernel table (uploaded). share 0: kernel only; min_bytes 0 and share 1 and head
 * 1: copy engines only. */
static void wl_plan(wl_env_t *x, const wl_batch_t *b, uint64_t min_bytes, double share, double head,
                    int lanes, int batch, wl_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->lanes = lanes;
    p->batch = batch;
    p->ce = calloc(b->n ? b->n : 1, sizeof(*p->ce));
    size_t *order = malloc((b->n ? b->n : 1) * sizeof(*order));
    char *taken = calloc(b->n ? b->n : 1, 1);
    uint64_t *ce_head = calloc(b->n ? b->n : 1, sizeof(*ce_head));
    for (size_t i = 0; i < b->n; i++)
        order[i] = i;
    qsort_r(order, b->n, sizeof(*order), wl_cmp_desc, b->bytes);
    const uint64_t target = share >= 1 ? b->payload : (uint64_t)((double)b->payload * share);
    uint64_t load[WL_MAX_LANES] = {0};
    for (size_t r = 0; r < b->n && p->ce_bytes < target && share > 0; r++) {
        const size_t i = order[r];
        if (b->bytes[i] < min_bytes || b->bytes[i] == 0)
            continue;
        uint64_t h = head >= 1 ? b->bytes[i] : ((uint64_t)((double)b->bytes[i] * head)) & ~4095ull;
        if (h == 0)
            continue;
        int best = 0;
        for (int k = 1; k < lanes; k++)
            if (load[k] < load[best])
                best = k;
        load[best] += h;
        taken[i] = 1;
        ce_head[i] = h;
        p->ce[p->n_ce++] = (wl_ce_t){b->src[i], b->dst[i], h, best, 1, h, h};
        p->ce_bytes += h;
    }
    /* copy-engine ops in op order per lane (the order of the original batch) */
    for (size_t i = 0; i < b->n; i++) {
        const uint64_t off = taken[i] ? ce_head[i] : 0;
        if (off >= b->bytes[i])
            continue;
        p->chunks += wsync_cuda_plan_op(&x->hops[p->n_k++], b->src[i] + off, b->dst[i] + off,
                                        b->bytes[i] - off, b->bytes[i] - off, 1, b->bytes[i] - off,
                                        0, p->chunks);
    }
    if (p->n_k > 0)
        WL_CK(cudaMemcpy(x->dops, x->hops, p->n_k * sizeof(*x->hops), cudaMemcpyHostToDevice));
    free(order);
    free(taken);
    free(ce_head);
}

/* Runs of equal-size ops whose sources and destinations each advance by one constant stride
 * (at least the size) become one strided copy-engine copy (rows = the run's length); runs of at
 * least min_bytes, largest first up to share of the payload, go to the lanes, balanced by
 * bytes; the rest to the kernel. *n_runs: how many runs the batch has. */
static void wl_plan_runs(wl_env_t *x, const wl_batch_t *b, uint64_t min_bytes, double share,
                         int lanes, wl_plan_t *p, size_t *n_runs)
{
    memset(p, 0, sizeof(*p));
    p->lanes = lanes;
    const size_t n1 = b->n ? b->n : 1;
    p->ce = calloc(n1, sizeof(*p->ce));
    size_t *first = malloc(n1 * sizeof(*first)), *len = malloc(n1 * sizeof(*len));
    uint64_t *ub = malloc(n1 * sizeof(*ub)), *sst = malloc(n1 * sizeof(*sst));
    uint64_t *dst_st = malloc(n1 * sizeof(*dst_st));
    char *taken = calloc(n1, 1);
    size_t nu = 0;
    for (size_t i = 0; i < b->n;) {
        size_t j = i + 1;
        int64_t ss = 0, ds = 0;
        if (j < b->n && b->bytes[j] == b->bytes[i]) {
            ss = b->src[j] - b->src[i];
            ds = b->dst[j] - b->dst[i];
            if (ss >= (int64_t)b->bytes[i] && ds >= (int64_t)b->bytes[i] && ss <= x->max_pitch &&
                ds <= x->max_pitch) {
                while (j + 1 < b->n && b->bytes[j + 1] == b->bytes[i] &&
                       b->src[j + 1] - b->src[j] == ss && b->dst[j + 1] - b->dst[j] == ds)
                    j++;
                j++;
            }
        }
        if (j - i > 1) { /* does the driver take this strided copy? (not across unmapped gaps) */
            cudaError_t e = cudaMemcpy2DAsync(b->dst[i], (size_t)ds, b->src[i], (size_t)ss,
                                              b->bytes[i], j - i, cudaMemcpyDeviceToDevice, x->s0);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                if (x->rejected++ < 3)
                    fprintf(stderr,
                            "  strided copy refused (%s): %zu rows of %llu B, pitches %lld / "
                            "%lld\n",
                            cudaGetErrorString(e), j - i, (unsigned long long)b->bytes[i],
                            (long long)ss, (long long)ds);
                j = i + 1;
                ss = ds = 0;
            }
        }
        first[nu] = i;
        len[nu] = j - i;
        sst[nu] = (uint64_t)ss;
        dst_st[nu] = (uint64_t)ds;
        ub[nu++] = b->bytes[i] * (j - i);
        i = j;
    }
    *n_runs = nu;
    size_t *order = malloc(n1 * sizeof(*order));
    for (size_t u = 0; u < nu; u++)
        order[u] = u;
    qsort_r(order, nu, sizeof(*order), wl_cmp_desc, ub);
    const uint64_t target = share >= 1 ? b->payload : (uint64_t)((double)b->payload * share);
    uint64_t load[WL_MAX_LANES] = {0};
    for (size_t r = 0; r < nu && p->ce_bytes < target && share > 0; r++) {
        const size_t u = order[r];
        if (ub[u] < min_bytes || ub[u] == 0)
            continue;
        int best = 0;
        for (int k = 1; k < lanes; k++)
            if (load[k] < load[best])
                best = k;
        load[best] += ub[u];
        taken[u] = 1;
        const size_t i = first[u];
        p->ce[p->n_ce++] =
            (wl_ce_t){b->src[i], b->dst[i], b->bytes[i], best, len[u], sst[u], dst_st[u]};
        p->ce_bytes += ub[u];
    }
    for (size_t u = 0; u < nu; u++)
        for (size_t i = first[u]; i < first[u] + len[u] && !taken[u]; i++)
            p->chunks += wsync_cuda_plan_op(&x->hops[p->n_k++], b->src[i], b->dst[i], b->bytes[i],
                                            b->bytes[i], 1, b->bytes[i], 0, p->chunks);
    if (p->n_k > 0)
        WL_CK(cudaMemcpy(x->dops, x->hops, p->n_k * sizeof(*x->hops), cudaMemcpyHostToDevice));
    free(first);
    free(len);
    free(ub);
    free(sst);
    free(dst_st);
    free(taken);
    free(order);
}

static void wl_row(const char *what, double ms, const wl_batch_t *b, double whole, double loop)
{
    printf("  %-46s %8.3f ms %8.1f GB/s %7.3f %8.3f\n", what, ms, b->payload / ms / 1e6, whole / ms,
           loop / ms);
}

static double wl_run(wl_env_t *x, const wl_batch_t *b, uint64_t min_bytes, double share,
                     double head, int lanes, int batch)
{
    wl_plan_t p;
    wl_plan(x, b, min_bytes, share, head, lanes, batch, &p);
    double ms = wl_time(x, &p);
    free(p.ce);
    return ms;
}

static double wl_run_graph(wl_env_t *x, const wl_batch_t *b, uint64_t min_bytes, double share,
                           int lanes, double *inst_ms)
{
    wl_plan_t p;
    wl_plan(x, b, min_bytes, share, 1, lanes, 0, &p);
    double ms = wl_time_graph(x, &p, inst_ms);
    free(p.ce);
    return ms;
}

/* Graph rows: copy engines only, and the mixes that need many copy-engine ops. */
static void wl_graph_rows(wl_env_t *x, const wl_batch_t *b, double whole, double loop)
{
    static const struct {
        uint64_t min;
        double share;
        int lanes;
    } g[] = {{0, 1, 1},
             {0, 1, 2},
             {0, 1, 4},
             {0, 1, 8},
             {2ull << 20, 0.5, 2},
             {2ull << 20, 0.5, 4},
             {2ull << 20, 0.9, 2},
             {2ull << 20, 0.9, 4},
             {16ull << 20, 0.9, 2},
             {0, 0, 1}};
    char name[96];
    for (size_t k = 0; k < sizeof(g) / sizeof(g[0]); k++) {
        double inst;
        const double ms = wl_run_graph(x, b, g[k].min, g[k].share, g[k].lanes, &inst);
        if (g[k].share == 0)
            snprintf(name, sizeof(name), "graph: kernel alone");
        else
            snprintf(name, sizeof(name), "graph: ops >= %llu MiB, %.0f%%, %d str (inst %.0f ms)",
                     (unsigned long long)(g[k].min >> 20), g[k].share * 100, g[k].lanes, inst);
        wl_row(name, ms, b, whole, loop);
    }
}

static void wl_env_init(wl_env_t *x, size_t cap, unsigned iters)
{
    memset(x, 0, sizeof(*x));
    x->iters = iters;
    WL_CK(cudaDeviceGetAttribute(&x->sm, cudaDevAttrMultiProcessorCount, 0));
    int mp = 0;
    WL_CK(cudaDeviceGetAttribute(&mp, cudaDevAttrMaxPitch, 0));
    x->max_pitch = mp;
    WL_CK(cudaStreamCreateWithFlags(&x->s0, cudaStreamNonBlocking));
    for (int k = 0; k < WL_MAX_LANES; k++) {
        WL_CK(cudaStreamCreateWithFlags(&x->lane[k], cudaStreamNonBlocking));
        WL_CK(cudaEventCreateWithFlags(&x->join[k], cudaEventDisableTiming));
    }
    WL_CK(cudaEventCreateWithFlags(&x->fork, cudaEventDisableTiming));
    WL_CK(cudaEventCreate(&x->e0));
    WL_CK(cudaEventCreate(&x->e1));
    x->cap = cap;
    x->hops = calloc(cap, sizeof(*x->hops));
    WL_CK(cudaMalloc((void **)&x->dops, cap * sizeof(*x->dops)));
}

static void wl_env_free(wl_env_t *x)
{
    cudaStreamDestroy(x->s0);
    for (int k = 0; k < WL_MAX_LANES; k++) {
        cudaStreamDestroy(x->lane[k]);
        cudaEventDestroy(x->join[k]);
    }
    cudaEventDestroy(x->fork);
    cudaEventDestroy(x->e0);
    cudaEventDestroy(x->e1);
    free(x->hops);
    cudaFree(x->dops);
}

static void wl_header(void)
{
    printf("  %-46s %11s %13s %7s %8s\n", "", "time", "", "/whole", "/loop");
}

/* 4 GiB in ops of S bytes (one buffer, consecutive), a cudaMemcpyAsync each over K lanes. */
static void wl_size_sweep(unsigned iters)
{
    const uint64_t total = 4ull << 30;
    unsigned char *a, *c;
    WL_CK(cudaMalloc((void **)&a, total));
    WL_CK(cudaMalloc((void **)&c, total));
    WL_CK(cudaMemset(a, 0x5a, total));
    static const uint64_t sizes[] = {1ull << 20, 3ull << 20, 16ull << 20, 96ull << 20, 1ull << 30};
    wl_env_t x;
    wl_env_init(&x, total >> 20, iters);
    printf("wsync-bench-cuda --lanes: 4 GiB in ops of S bytes, a cudaMemcpyAsync each over K "
           "streams\n");
    wl_batch_t one = {0};
    const unsigned char *one_src = a;
    unsigned char *one_dst = c;
    uint64_t one_bytes = total;
    one = (wl_batch_t){&one_src, &one_dst, &one_bytes, 1, total};
    const double whole = wl_run(&x, &one, 0, 1, 1, 1, 0);
    printf("  one cudaMemcpyAsync of 4 GiB: %.3f ms (%.1f GB/s)\n", whole, total / whole / 1e6);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        const size_t n = total / sizes[s];
        wl_batch_t b = {malloc(n * sizeof(void *)), malloc(n * sizeof(void *)),
                        malloc(n * sizeof(uint64_t)), n, total};
        for (size_t i = 0; i < n; i++) {
            b.src[i] = a + i * sizes[s];
            b.dst[i] = c + i * sizes[s];
            b.bytes[i] = sizes[s];
        }
        printf("  S = %4llu MiB (%5zu ops):", (unsigned long long)(sizes[s] >> 20), n);
        static const int lanes[] = {1, 2, 4, 8};
        for (int k = 0; k < 4; k++)
            printf("  K=%d %.3f", lanes[k], whole / wl_run(&x, &b, 0, 1, 1, lanes[k], 0));
        double inst;
        printf("  | batch K=1 %.3f K=4 %.3f | graph K=1 %.3f K=4 %.3f\n",
               whole / wl_run(&x, &b, 0, 1, 1, 1, 1), whole / wl_run(&x, &b, 0, 1, 1, 4, 1),
               whole / wl_run_graph(&x, &b, 0, 1, 1, &inst),
               whole / wl_run_graph(&x, &b, 0, 1, 4, &inst));
        free(b.src);
        free(b.dst);
        free(b.bytes);
    }
    wl_env_free(&x);
    cudaFree(a);
    cudaFree(c);
}

typedef struct wl_karg {
    unsigned char *a, *c;
    uint64_t bytes;
    int what; /* 0 memcpy, 1 memset, 2 read kernel, 3 write kernel, 4 copy kernel, 5 the
               * plugin's kernel (variant 0, table in dops), 6 the 2:1 mix kernel (unroll:
               * its cast), 7 the block-quantizer pattern (unroll: its mode, hint: cs, cols), 8 the
               * plugin's block quantizer (one op, table in qops) */
    uint64_t cols;
    const wsync_cuda_qop_t *qops;
    int unroll, hint, blocks;
    const wsync_cuda_op_t *dops;
    uint64_t chunks;
} wl_karg_t;

static void wl_kfn(void *arg, cudaStream_t s)
{
    const wl_karg_t *k = arg;
    if (k->what == 0)
        WL_CK(cudaMemcpyAsync(k->c, k->a, k->bytes, cudaMemcpyDeviceToDevice, s));
    else if (k->what == 1)
        WL_CK(cudaMemsetAsync(k->c, 0x5a, k->bytes, s));
    else if (k->what == 2)
        WL_CK(wb_kernel_read(k->a, k->bytes - 4096, k->c + k->bytes - 4096, k->blocks, s));
    else if (k->what == 3)
        WL_CK(wb_kernel_write(k->c, k->bytes, k->blocks, s));
    else if (k->what == 4)
        WL_CK(wb_kernel_copy(k->unroll, k->hint, k->a, k->c, k->bytes, k->blocks, s));
    else if (k->what == 6)
        WL_CK(wb_kernel_mix(k->unroll, k->a, k->bytes, k->c, k->blocks, s));
    else if (k->what == 7)
        WL_CK(wb_kernel_blockq(k->unroll, k->hint, k->a, k->bytes / 2 / k->cols, k->cols, k->c,
                               k->blocks, s));
    else if (k->what == 8)
        WL_CK(wsync_cuda_quant_blocks(k->qops, 1, k->bytes / 2 / k->cols / 128 * (k->cols / 128),
                                      NULL, NULL, (uint32_t)k->hint, s));
    else {
        const wsync_cuda_launch_cfg_t cfg = {.variant = WSYNC_CUDA_VMM_VARIANT, .flat = 1};
        WL_CK(wsync_cuda_launch_copy(k->dops, 1, k->chunks, NULL, 0, k->blocks, &cfg, s));
    }
}

/* The plugin's block quantizer on the same matrix (one BLOCK op, bf16 in, its scales past the
 * FP8 output), beside the pattern rows: what the plugin's own kernel adds to the pattern. */
static void wl_plugin_quant(wl_env_t *x, wl_karg_t *k, double copy)
{
    const uint64_t rows = k->bytes / 2 / k->cols;
    const wsync_cuda_qop_t op = {.src = k->a,
                                 .dst = k->c,
                                 .scales = k->c + k->bytes / 2,
                                 .src_pitch = 2 * k->cols,
                                 .dst_pitch = k->cols,
                                 .scale_pitch = 4 * (k->cols / 128),
                                 .rows = (uint32_t)rows,
                                 .cols = (uint32_t)k->cols,
                                 .src_dtype = WSYNC_DTYPE_BF16,
                                 .brows = (uint32_t)(rows / 128),
                                 .bcols = (uint32_t)(k->cols / 128),
                                 .kind = WSYNC_QUANT_FP8_BLOCK};
    wsync_cuda_qop_t *dev;
    WL_CK(cudaMalloc((void **)&dev, sizeof(op)));
    WL_CK(cudaMemcpy(dev, &op, sizeof(op), cudaMemcpyHostToDevice));
    wl_karg_t q = *k;
    q.what = 8;
    q.qops = dev;
    q.hint = 0;
    const double t = wl_time_fn(x, wl_kfn, &q);
    printf("  128 x 128 blocks, %llu columns, the plugin's block quantizer: %.3f ms (%.3f); with "
           "the next block loaded first:",
           (unsigned long long)k->cols, t, 0.75 * copy / t);
    static const struct {
        uint32_t flags;
        const char *what;
    } fl[] = {{WSYNC_CUDA_QUANT_VEC_BLOCKS | WSYNC_CUDA_QUANT_GENERIC, "runs, general path"},
              {WSYNC_CUDA_QUANT_VEC_BLOCKS, "runs, full-block path"},
              {WSYNC_CUDA_QUANT_VEC_BLOCKS | WSYNC_CUDA_QUANT_STRIDED | WSYNC_CUDA_QUANT_GENERIC,
               "strided, general path"},
              {WSYNC_CUDA_QUANT_VEC_BLOCKS | WSYNC_CUDA_QUANT_STRIDED, "strided, full-block path"}};
    for (size_t f = 0; f < sizeof(fl) / sizeof(fl[0]); f++) {
        q.hint = (int)fl[f].flags;
        const double ta = wl_time_fn(x, wl_kfn, &q);
        printf("  %s %.3f ms (%.3f)%s", fl[f].what, ta, 0.75 * copy / ta,
               f + 1 < sizeof(fl) / sizeof(fl[0]) ? ";" : "\n");
    }
    WL_CK(cudaFree(dev));
}

/* SM copies of one 4 GiB buffer by bytes in flight and cache hints; one direction at a time. */
static void wl_kernel_sweep(unsigned iters)
{
    wl_karg_t k = {.bytes = 4ull << 30};
    WL_CK(cudaMalloc((void **)&k.a, k.bytes));
    WL_CK(cudaMalloc((void **)&k.c, k.bytes));
    WL_CK(cudaMemset(k.a, 0x5a, k.bytes));
    wl_env_t x;
    wl_env_init(&x, 1, iters);
    k.chunks = wsync_cuda_plan_op(&x.hops[0], k.a, k.c, k.bytes, k.bytes, 1, k.bytes, 0, 0);
    WL_CK(cudaMemcpy(x.dops, x.hops, sizeof(*x.hops), cudaMemcpyHostToDevice));
    k.dops = x.dops;
    /* clocks up first: a second of copies by the kernel and the copy engines */
    k.blocks = x.sm;
    for (int i = 0; i < 250; i++) {
        k.what = i & 1 ? 5 : 0;
        wl_kfn(&k, x.s0);
    }
    WL_CK(cudaStreamSynchronize(x.s0));
    k.what = 0;
    const double copy = wl_time_fn(&x, wl_kfn, &k);
    k.what = 1;
    const double set = wl_time_fn(&x, wl_kfn, &k);
    printf(
        "\nwsync-bench-cuda --lanes: SM kernels on one 4 GiB buffer (ratio to one cudaMemcpyAsync, "
        "%.3f ms = %.1f GB/s)\n",
        copy, k.bytes / copy / 1e6);
    printf("  cudaMemsetAsync (copy engines, write only): %.3f ms, %.1f GB/s of HBM traffic\n", set,
           k.bytes / set / 1e6);
    for (int m = 1; m <= 2; m++) {
        k.blocks = x.sm * m;
        k.what = 2;
        const double rd = wl_time_fn(&x, wl_kfn, &k);
        k.what = 3;
        const double wr = wl_time_fn(&x, wl_kfn, &k);
        printf("  %d blocks: read-only kernel %.1f GB/s, write-only kernel %.1f GB/s, copy (%.1f "
               "GB/s of traffic) as read + write at those rates would be %.3f\n",
               k.blocks, k.bytes / rd / 1e6, k.bytes / wr / 1e6, 2 * k.bytes / copy / 1e6,
               copy / (rd + wr));
    }
    /* what a copy that reads two bytes for each one it writes (bf16 in, FP8 out) can reach: the
     * limit for its traffic is a cudaMemcpyAsync of (reads + writes) / 2 = 3/4 of the buffer */
    k.what = 6;
    for (int m = 1; m <= 4; m *= 2) {
        k.blocks = x.sm * m;
        k.unroll = 0;
        const double pick = wl_time_fn(&x, wl_kfn, &k);
        k.unroll = 1;
        const double cast = wl_time_fn(&x, wl_kfn, &k);
        printf("  2:1 read/write mix (16 B read, 8 B written a step), %d blocks x 512: high byte "
               "%.3f ms (%.3f of one cudaMemcpyAsync of the same traffic), e4m3fn cast %.3f ms "
               "(%.3f)\n",
               k.blocks, pick, 0.75 * copy / pick, cast, 0.75 * copy / cast);
    }
    /* the same mix in the block quantizer's pattern: what its blocks, its reduction and its cache
     * hints each cost (docs/PERFORMANCE.md) */
    static const char *modes[] = {"cast alone", "+ block amax", "+ amax, next block loaded first"};
    static const uint64_t widths[] = {4096, 2048};
    for (int w = 0; w < 2; w++)
        for (int m = 0; m < 3; m++) {
            k.what = 7;
            k.cols = widths[w];
            k.unroll = m;
            k.blocks = x.sm * (m == 2 ? 2 : 4);
            printf("  128 x 128 blocks, %llu columns, %d CTAs x 256, %s:",
                   (unsigned long long)k.cols, k.blocks, modes[m]);
            for (int h = 0; h < 4; h++) { /* bit 0 streaming, bit 1 strided block order */
                k.hint = h;
                const double t = wl_time_fn(&x, wl_kfn, &k);
                printf("  %s%s %.3f ms (%.3f)", h & 1 ? "streaming" : "plain",
                       h & 2 ? " strided" : "", t, 0.75 * copy / t);
            }
            printf("\n");
            if (m == 1)
                wl_plugin_quant(&x, &k, copy);
        }
    k.what = 5;
    k.blocks = x.sm;
    printf("  the plugin's kernel (variant 0, 1 x 512 threads per SM): %.3f\n",
           copy / wl_time_fn(&x, wl_kfn, &k));
    k.what = 4;
    static const char *hints[] = {"plain", "L2::256B", "nc+L2::256B", "+st.cs", "+st.noL1"};
    for (int m = 1; m <= 2; m++)
        for (int u = 4; u <= 16; u *= 2) {
            k.blocks = x.sm * m;
            k.unroll = u;
            printf("  copy, %3d blocks x 512, %2d x 16 B in flight:", k.blocks, u);
            for (int h = 0; h < 5; h++) {
                k.hint = h;
                printf("  %s %.3f", hints[h], copy / wl_time_fn(&x, wl_kfn, &k));
            }
            printf("\n");
        }
    wl_env_free(&x);
    cudaFree(k.a);
    cudaFree(k.c);
}

static int wl_layout(const char *kind, unsigned iters)
{
    wb_layout_t l;
    if (wb_layout_build(kind, 0, 1, 0, &l) != 0)
        return 1;
    unsigned char *src, *big;
    WL_CK(cudaMalloc((void **)&src, l.packed));
    WL_CK(cudaMalloc((void **)&big, l.packed));
    WL_CK(cudaMemset(src, 0x5a, l.packed));
    wl_batch_t b = {malloc(l.n * sizeof(void *)), malloc(l.n * sizeof(void *)),
                    malloc(l.n * sizeof(uint64_t)), l.n, l.payload};
    for (size_t i = 0; i < l.n; i++) {
        b.src[i] = src + l.t[i].offset;
        WL_CK(cudaMalloc((void **)&b.dst[i], l.t[i].bytes));
        b.bytes[i] = l.t[i].bytes;
    }
    wl_env_t x;
    wl_env_init(&x, l.n, iters);
    const unsigned char *w_src = src;
    unsigned char *w_dst = big;
    uint64_t w_bytes = l.packed;
    const wl_batch_t whole_b = {&w_src, &w_dst, &w_bytes, 1, l.packed};
    const double whole = wl_run(&x, &whole_b, 0, 1, 1, 1, 0);
    const double loop = wl_run(&x, &b, 0, 1, 1, 1, 0);
    printf("\nwsync-bench-cuda --lanes: layout %s, %zu tensors, %.2f GB (median of %u)\n", kind,
           l.n, l.payload / 1e9, iters);
    wl_header();
    wl_row("(a) one cudaMemcpyAsync, whole payload", whole, &b, whole, loop);
    wl_row("(b) cudaMemcpyAsync per tensor, 1 stream", loop, &b, whole, loop);
    wl_row("kernel alone", wl_run(&x, &b, 0, 0, 1, 1, 0), &b, whole, loop);
    char name[96];
    static const int lanes[] = {2, 3, 4, 8};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof(name), "copy engines only, a memcpy each, %d streams", lanes[k]);
        wl_row(name, wl_run(&x, &b, 0, 1, 1, lanes[k], 0), &b, whole, loop);
    }
    static const int blanes[] = {1, 2, 4, 8};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof(name), "copy engines only, one batch per stream, %d", blanes[k]);
        wl_row(name, wl_run(&x, &b, 0, 1, 1, blanes[k], 1), &b, whole, loop);
    }
    wl_graph_rows(&x, &b, whole, loop);
    static const struct {
        uint64_t min;
        double share;
        int lanes;
    } rr[] = {{16ull << 20, 0.9, 2}, {16ull << 20, 1, 2}, {16ull << 20, 0.9, 3},
              {16ull << 20, 1, 3},   {64ull << 20, 1, 2}, {2ull << 20, 1, 2}};
    for (size_t k = 0; k < sizeof(rr) / sizeof(rr[0]); k++) {
        wl_plan_t p;
        size_t runs;
        wl_plan_runs(&x, &b, rr[k].min, rr[k].share, rr[k].lanes, &p, &runs);
        WL_CK(cudaStreamSynchronize(x.s0));
        snprintf(name, sizeof(name), "runs (%zu) >= %llu MiB, %.0f%% on %d str (%zu ce)", runs,
                 (unsigned long long)(rr[k].min >> 20), rr[k].share * 100, rr[k].lanes, p.n_ce);
        wl_row(name, wl_time(&x, &p), &b, whole, loop);
        free(p.ce);
    }
    printf("  strided copies refused by the driver: %zu\n", x.rejected);
    static const double small[] = {0.1, 0.2, 0.3, 0.4}; /* many small copy-engine ops */
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof(name), "ops >= 2 MiB up to %.0f%% on %d stream%s", small[s] * 100,
                     k + 1, k ? "s" : "");
            wl_row(name, wl_run(&x, &b, 2ull << 20, small[s], 1, k + 1, 0), &b, whole, loop);
        }
    static const uint64_t mins[] = {64ull << 20, 16ull << 20, 2ull << 20};
    static const double shares[] = {0.5, 0.8, 0.9, 1.0};
    static const int hl[] = {1, 2, 3};
    for (int m = 0; m < 3; m++)
        for (int s = 0; s < 4; s++)
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof(name), "ops >= %llu MiB up to %.0f%% on %d stream%s",
                         (unsigned long long)(mins[m] >> 20), shares[s] * 100, hl[k],
                         hl[k] > 1 ? "s" : "");
                wl_row(name, wl_run(&x, &b, mins[m], shares[s], 1, hl[k], 0), &b, whole, loop);
            }
    static const double heads[] = {0.5, 0.75, 0.875};
    for (int m = 0; m < 3; m += 2)
        for (int h = 0; h < 3; h++)
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof(name), "ops >= %llu MiB: %.1f%% head on %d stream%s",
                         (unsigned long long)(mins[m] >> 20), heads[h] * 100, hl[k],
                         hl[k] > 1 ? "s" : "");
                wl_row(name, wl_run(&x, &b, mins[m], 1, heads[h], hl[k], 0), &b, whole, loop);
            }
    wl_env_free(&x);
    for (size_t i = 0; i < l.n; i++)
        cudaFree(b.dst[i]);
    cudaFree(src);
    cudaFree(big);
    free(b.src);
    free(b.dst);
    free(b.bytes);
    wb_layout_free(&l);
    return 0;
}

int wb_lanes_main(const char *layout, unsigned iters)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* errors land next to the row they stopped */
    WL_CK(cudaSetDevice(0));
    int ce = 0;
    WL_CK(cudaDeviceGetAttribute(&ce, cudaDevAttrAsyncEngineCount, 0));
    printf("wsync-bench-cuda --lanes: asyncEngineCount %d\n", ce);
    wl_kernel_sweep(iters);
    if (strcmp(layout, "none") == 0) /* the one-buffer kernel rows alone */
        return 0;
    wl_size_sweep(iters);
    int rc = 0;
    if (strcmp(layout, "moe") != 0)
        rc |= wl_layout("dense", iters);
    if (strcmp(layout, "dense") != 0)
        rc |= wl_layout("moe", iters);
    return rc;
}
