/* wsync-bench-cuda --fp8 (see wsync_bench_fp8.h). */
#include "wsync_bench_fp8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "wsync_fp8.h"

#define WF_WHO "wsync-bench-cuda --fp8"
#define WF_WARMUP 2
#define WF_EP 8

/* One engine parameter: FP8 (e4m3fn rows x cols, scales ceil(rows / 128) x ceil(cols / 128)
 * floats) or a bf16 allocation of the group's bytes. */
typedef struct wf_group {
    int fp8;
    int64_t rows, cols;
    unsigned char *w;
    unsigned char *scales;
    uint64_t scale_pitch, scale_rows;
} wf_group_t;

typedef struct wf_call {
    wb_engine_t *E;
    wsync_handle_t *h;
    uint64_t gen;
    wsync_copy_op_t *ops;
    wsync_quant_t *q;
    size_t n;
    uint32_t flags;
    void *a, *b; /* the limit's buffers */
    uint64_t bytes;
} wf_call_t;

/* name -> tensor index, for an expert's local slot */
typedef struct wf_named {
    const char *name;
    size_t t;
} wf_named_t;

static int wf_by_name(const void *a, const void *b)
{
    return strcmp(((const wf_named_t *)a)->name, ((const wf_named_t *)b)->name);
}

/* A linear layer's weight: what FP8 checkpoints quantize (not the router, norms, embeddings). */
static int wf_linear(const char *name)
{
    static const char *const sfx[] = {".q_proj.weight",   ".k_proj.weight",    ".v_proj.weight",
                                      ".o_proj.weight",   ".gate_proj.weight", ".up_proj.weight",
                                      ".down_proj.weight"};
    const size_t n = strlen(name);
    for (size_t k = 0; k < sizeof(sfx) / sizeof(sfx[0]); k++) {
        const size_t m = strlen(sfx[k]);
        if (n > m && strcmp(name + n - m, sfx[k]) == 0)
            return 1;
    }
    return 0;
}

/* 128 x 128 blocks over n rows or columns */
static uint64_t wf_blocks(int64_t n)
{
    return ((uint64_t)n + WSYNC_FP8_BLOCK - 1) / WSYNC_FP8_BLOCK;
}

/* An engine keeps tensor x in FP8: a linear layer's matrix. */
static int wf_is_fp8(const wb_tensor_t *x)
{
    return wf_linear(x->name) && x->rows > 1;
}

/* The bytes an engine slot of tensor x's shape takes: FP8 bytes and their block scales, or bf16. */
static uint64_t wf_written(const wb_tensor_t *x)
{
    return wf_is_fp8(x) ? x->bytes / 2u + wf_blocks(x->rows) * wf_blocks(x->cols) * 4u : x->bytes;
}

/* The layer and expert of an expert's tensor, and the rest of its name; 0 if it is none. */
static int wf_expert(const char *name, unsigned *layer, long long *e, const char **rest)
{
    int n = 0;
    if (sscanf(name, "model.layers.%u.mlp.experts.%lld.%n", layer, e, &n) != 2 || n == 0)
        return 0;
    *rest = name + n;
    return 1;
}

static void wf_copy(void *a, cudaStream_t s)
{
    wf_call_t *x = a;
    WB_OK(x->E->p->consumer->copy_quantized(x->E->c, x->h, s, x->gen, x->ops, x->q, x->n, x->flags,
                                            err));
}

static void wf_memcpy(void *a, cudaStream_t s)
{
    wf_call_t *x = a;
    WB_CK(cudaMemcpyAsync(x->b, x->a, x->bytes, cudaMemcpyDeviceToDevice, s));
}

static double wf_time(wb_engine_t *E, unsigned iters, wh_timed_fn fn, void *arg)
{
    return wh_time_events(WF_WHO, E->e0, E->e1, E->st, WF_WARMUP, iters, fn, arg);
}

/* The consumer's first one-pass calls, each timed alone as it comes (call to done, ms): on an
 * H100 the first five ran 1.0-4.7 ms over the steady call, the producer's first stages too
 * (docs/PERFORMANCE.md), so they are printed apart and the medians time the calls after them. */
#define WF_FIRST 6
static void wf_first_calls(wb_engine_t *E, wf_call_t *c)
{
    /* WSYNC_BENCH_FP8_SETTLE_MS: the host sleeps that long first (the GPU idle), to tell work of
     * the driver's after the setup's frees and allocations from the calls' own */
    const char *settle = getenv("WSYNC_BENCH_FP8_SETTLE_MS");
    const int settle_ms = settle != NULL ? atoi(settle) : 0;
    if (settle_ms > 0) {
        struct timespec ts = {.tv_sec = settle_ms / 1000, .tv_nsec = settle_ms % 1000 * 1000000L};
        nanosleep(&ts, NULL);
        printf("      (the host slept %d ms before the first call)\n", settle_ms);
    }
    printf("      the consumer's first %d calls (one pass, call to done, not in the medians):",
           WF_FIRST);
    double ms[WF_FIRST];
    wh_time_each(WF_WHO, E->e0, E->e1, E->st, WF_FIRST, wf_copy, c, ms);
    for (int i = 0; i < WF_FIRST; i++)
        printf(" %.3f", ms[i]);
    printf(" ms\n");
}

/* Call to done with the GPU busy just before (wh_time_events_busy). */
static double wf_time_busy(wb_engine_t *E, unsigned iters, wh_timed_fn fn, void *arg)
{
    return wh_time_events_busy(WF_WHO, E->e0, E->e1, E->st, WF_WARMUP, iters, WH_BUSY_NS, fn, arg);
}

/* The GPU time alone: the call's host work done while a kernel spins ahead of it. */
static double wf_time_gpu(wb_engine_t *E, unsigned iters, wh_timed_fn fn, void *arg)
{
    return wh_time_events_gpu(WF_WHO, E->e0, E->e1, E->st, WF_WARMUP, iters, WH_GPU_ALONE_SPIN_NS,
                              fn, arg);
}

/* The result of the timed calls (a one-pass call reports a NaN here); ends the program on one. */
static void wf_consumed(const wf_call_t *x)
{
    wsync_error_t e = {.struct_size = sizeof(e)};
    if (x->E->p->consumer->record_consumed(x->E->c, x->h, 1, &e) != WSYNC_OK) {
        fprintf(stderr, WF_WHO ": record_consumed: %s\n", e.message);
        exit(1);
    }
}

/* Groups of E->l as FP8 or bf16 engine parameters; -1 (printed) where a fused member would
 * start inside a 128-row block. */
static int wf_groups(const wb_layout_t *l, wf_group_t *G)
{
    for (size_t g = 0; g < l->n_groups; g++)
        G[g].fp8 = -1;
    for (size_t i = 0; i < l->n; i++) {
        const wb_tensor_t *x = &l->t[i];
        wf_group_t *g = &G[x->group];
        const int fp8 = wf_is_fp8(x);
        if (g->fp8 < 0) {
            g->fp8 = fp8;
            g->cols = x->cols;
        }
        if (g->fp8 != fp8 || (fp8 && g->cols != x->cols)) {
            fprintf(stderr, WF_WHO ": %s: its fused parameter mixes FP8 and bf16 members\n",
                    x->name);
            return -1;
        }
        if (fp8 && (x->goff / (2u * (uint64_t)x->cols)) % WSYNC_FP8_BLOCK != 0) {
            fprintf(stderr,
                    WF_WHO ": %s starts at row %llu of its fused parameter: a 128-row block "
                           "would straddle it\n",
                    x->name, (unsigned long long)(x->goff / (2u * (uint64_t)x->cols)));
            return -1;
        }
    }
    for (size_t g = 0; g < l->n_groups; g++) {
        wf_group_t *G1 = &G[g];
        if (G1->fp8 == 1) {
            G1->rows = (int64_t)(l->group_bytes[g] / (2u * (uint64_t)G1->cols));
            G1->scale_rows = wf_blocks(G1->rows);
            G1->scale_pitch = wf_blocks(G1->cols) * 4u;
            WB_CK(cudaMalloc((void **)&G1->w, (uint64_t)G1->rows * (uint64_t)G1->cols));
            WB_CK(cudaMalloc((void **)&G1->scales, G1->scale_rows * G1->scale_pitch));
            WB_CK(cudaMemset(G1->w, 0, (uint64_t)G1->rows * (uint64_t)G1->cols));
            WB_CK(cudaMemset(G1->scales, 0, G1->scale_rows * G1->scale_pitch));
        } else {
            WB_CK(cudaMalloc((void **)&G1->w, l->group_bytes[g] ? l->group_bytes[g] : 1));
            WB_CK(cudaMemset(G1->w, 0, l->group_bytes[g]));
        }
    }
    /* written once, as an engine's loaded weights are before its first sync: the timed calls
     * are not the first writes to this memory */
    WB_CK(cudaDeviceSynchronize());
    return 0;
}

/* The op (and its quant) that writes tensor t's engine slot from src_offset; returns the bytes
 * it writes (FP8 bytes and its scales, or the bf16 bytes). */
static uint64_t wf_op(const wb_layout_t *l, const wf_group_t *G, size_t t, uint64_t src_offset,
                      wsync_copy_op_t *op, wsync_quant_t *q)
{
    const wb_tensor_t *x = &l->t[t];
    const wf_group_t *g = &G[x->group];
    memset(op, 0, sizeof(*op));
    memset(q, 0, sizeof(*q));
    op->src_offset = src_offset;
    q->src_dtype = WSYNC_DTYPE_BF16;
    if (!g->fp8) {
        op->rows = 1;
        op->row_bytes = op->src_pitch = op->dst_pitch = x->bytes;
        op->dst = g->w + x->goff;
        op->dst_extent = l->group_bytes[x->group] - x->goff;
        q->kind = WSYNC_QUANT_NONE;
        return x->bytes;
    }
    const uint64_t cols = (uint64_t)x->cols, r0 = x->goff / (2u * cols);
    op->rows = (uint64_t)x->rows;
    op->row_bytes = op->src_pitch = 2u * cols;
    op->dst = g->w + r0 * cols;
    op->dst_pitch = cols;
    op->dst_extent = ((uint64_t)g->rows - r0) * cols;
    q->kind = WSYNC_QUANT_FP8_BLOCK;
    q->cols = cols;
    q->scale_dst = g->scales + r0 / WSYNC_FP8_BLOCK * g->scale_pitch;
    q->scale_pitch = g->scale_pitch;
    q->scale_extent = (g->scale_rows - r0 / WSYNC_FP8_BLOCK) * g->scale_pitch;
    return wf_written(x);
}

/* Tensor src's quantization (its source regenerated from the trainer's fill) against what op/q
 * wrote, byte for byte, weight and scales; 1 when they differ. */
static int wf_check_fp8(wb_engine_t *E, size_t src, const wsync_copy_op_t *op,
                        const wsync_quant_t *q, void *scratch)
{
    const wb_tensor_t *x = &E->l.t[src];
    const uint64_t rows = (uint64_t)x->rows, cols = (uint64_t)x->cols;
    const uint64_t srows = wf_blocks(x->rows), spitch = wf_blocks(x->cols) * 4u;
    WB_CK(wh_fill_mask(scratch, x->bytes, WB_SEED + x->offset / 8, WB_FILL_MASK, E->st));
    WB_CK(cudaStreamSynchronize(E->st));
    unsigned char *in = malloc(x->bytes), *ref = malloc(rows * cols), *got = malloc(rows * cols);
    unsigned char *rs = malloc(srows * spitch), *gs = malloc(srows * spitch);
    if (!in || !ref || !got || !rs || !gs) {
        fprintf(stderr, WF_WHO ": no host memory for the check of %s\n", x->name);
        exit(1);
    }
    WB_CK(cudaMemcpy(in, scratch, x->bytes, cudaMemcpyDeviceToHost));
    WB_CK(cudaMemcpy2D(got, cols, op->dst, op->dst_pitch, cols, rows, cudaMemcpyDeviceToHost));
    WB_CK(cudaMemcpy2D(gs, spitch, q->scale_dst, q->scale_pitch, spitch, srows,
                       cudaMemcpyDeviceToHost));
    int64_t br = 0, bc = 0;
    const int bad =
        wsync_fp8_quantize_2d(in, 2u * cols, WSYNC_DTYPE_BF16, (int64_t)rows, (int64_t)cols,
                              WSYNC_FP8_BLOCK, ref, cols, rs, spitch, &br, &bc) != 0 ||
        memcmp(ref, got, rows * cols) != 0 || memcmp(rs, gs, srows * spitch) != 0;
    if (bad)
        fprintf(stderr,
                WF_WHO ": %s: the engine's FP8 bytes or scales differ from the host "
                       "reference\n",
                x->name);
    free(in);
    free(ref);
    free(got);
    free(rs);
    free(gs);
    return bad;
}

/* Checks after the EP 1 call: every bf16 parameter against the fill (on the GPU), the FP8
 * tensors of the first and last layer (for MoE their first and last expert) on the host. */
static unsigned long long wf_check(wb_engine_t *E, const wf_group_t *G, const size_t *tensor_of,
                                   const wf_call_t *c, unsigned layers, long long experts,
                                   void *scratch, unsigned long long *bad_dev, size_t *n_fp8)
{
    const wb_layout_t *l = &E->l;
    WB_CK(cudaMemsetAsync(bad_dev, 0, sizeof(*bad_dev), E->st));
    for (size_t i = 0; i < l->n; i++)
        if (!G[l->t[i].group].fp8)
            WB_CK(wh_count_bad_mask(G[l->t[i].group].w + l->t[i].goff, l->t[i].bytes,
                                    WB_SEED + l->t[i].offset / 8, WB_FILL_MASK, bad_dev, E->st));
    unsigned long long bad = 0;
    WB_CK(cudaMemcpyAsync(&bad, bad_dev, sizeof(bad), cudaMemcpyDeviceToHost, E->st));
    WB_CK(cudaStreamSynchronize(E->st));
    *n_fp8 = 0;
    for (size_t k = 0; k < c->n; k++) {
        const size_t t = tensor_of[k];
        unsigned layer = 0;
        long long e = -1;
        const char *rest;
        if (c->q[k].kind != WSYNC_QUANT_FP8_BLOCK ||
            sscanf(l->t[t].name, "model.layers.%u.", &layer) != 1 ||
            (layer != 0 && layer + 1 != layers))
            continue;
        if (wf_expert(l->t[t].name, &layer, &e, &rest) && e != 0 && e + 1 != experts)
            continue;
        bad += (unsigned long long)wf_check_fp8(E, t, &c->ops[k], &c->q[k], scratch);
        ++*n_fp8;
    }
    return bad;
}

unsigned long long wb_fp8_run(wb_engine_t *E, wsync_handle_t *h, const wsync_manifest_t *m,
                              wb_plan_t *one, unsigned iters)
{
    const wb_layout_t *l = &E->l;
    char why[256];
    const char **names = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*names));
    for (size_t k = 0; names != NULL && k < m->n_tensors; k++)
        names[k] = m->tensors[k].name;
    if (names == NULL || wb_plan_learn(l, one, 0, names, m->n_tensors, why, sizeof(why)) != 0) {
        fprintf(stderr, WF_WHO ": %s\n", names ? why : "no memory");
        exit(1);
    }
    free(names);
    const size_t n = m->n_tensors;
    size_t *tensor_of = malloc(n * sizeof(*tensor_of));
    wf_group_t *G = calloc(l->n_groups, sizeof(*G));
    wsync_copy_op_t *ops = malloc(n * sizeof(*ops)), *eops = malloc(n * sizeof(*eops));
    wsync_quant_t *q = malloc(n * sizeof(*q)), *eq = malloc(n * sizeof(*eq));
    wf_named_t *byname = malloc(l->n * sizeof(*byname));
    size_t *esrc = malloc(n * sizeof(*esrc)); /* the source tensor of each EP op */
    if (!tensor_of || !esrc || !G || !ops || !eops || !q || !eq || !byname) {
        fprintf(stderr, WF_WHO ": no host memory for %zu ops\n", n);
        exit(1);
    }
    unsigned layers = 0;
    long long experts = 0;
    uint64_t biggest = 0;
    for (size_t i = 0; i < l->n; i++) {
        unsigned layer = 0;
        long long e;
        const char *rest;
        if (sscanf(l->t[i].name, "model.layers.%u.", &layer) == 1 && layer + 1 > layers)
            layers = layer + 1;
        if (wf_expert(l->t[i].name, &layer, &e, &rest) && e + 1 > experts)
            experts = e + 1;
        if (l->t[i].bytes > biggest)
            biggest = l->t[i].bytes;
        byname[i] = (wf_named_t){l->t[i].name, i};
    }
    qsort(byname, l->n, sizeof(*byname), wf_by_name);

    /* the limit first, before the engine parameters take their memory */
    uint64_t written = 0, fp8_params = 0;
    for (size_t k = 0; k < l->n; k++)
        written += wf_written(&l->t[k]);
    wf_call_t lim = {.E = E, .bytes = (l->payload + written) / 2 / 256 * 256};
    WB_CK(cudaMalloc(&lim.a, lim.bytes));
    WB_CK(cudaMalloc(&lim.b, lim.bytes));
    WB_CK(cudaMemsetAsync(lim.a, 0x3c, lim.bytes, E->st));
    const double ms_limit = wf_time(E, iters, wf_memcpy, &lim);
    const double busy_limit = wf_time_busy(E, iters, wf_memcpy, &lim);
    WB_CK(cudaFree(lim.a));
    WB_CK(cudaFree(lim.b));

    if (wf_groups(l, G) != 0)
        exit(1);
    for (size_t g = 0; g < l->n_groups; g++)
        fp8_params += (uint64_t)(G[g].fp8 == 1);
    wf_call_t c = {.E = E, .h = h, .gen = m->generation, .ops = ops, .q = q, .n = n};
    uint64_t w1 = 0;
    for (size_t k = 0; k < n; k++) {
        tensor_of[k] = one->p[one->at[k]].tensor;
        w1 += wf_op(l, G, tensor_of[k], m->tensors[k].offset, &ops[k], &q[k]);
    }
    printf("  (f) FP8 engine parameters: %zu bf16 tensors (%.2f GB) into %zu parameters, %llu of "
           "them e4m3fn with 128 x 128 block scales (weight_scale_inv); %.2f GB written\n",
           l->n, l->payload / 1e9, l->n_groups, (unsigned long long)fp8_params, w1 / 1e9);
    printf("      limit: one cudaMemcpyAsync of %.2f GB ((read + written) / 2) %8.3f ms\n",
           lim.bytes / 1e9, ms_limit);
    c.flags = WSYNC_COPY_QUANT_ONE_PASS;
    wf_first_calls(E, &c);
    const double ms_one = wf_time(E, iters, wf_copy, &c);
    const double gpu_one = wf_time_gpu(E, iters, wf_copy, &c);
    const double busy_one = wf_time_busy(E, iters, wf_copy, &c);
    c.flags = 0;
    const double ms_first = wf_time(E, iters, wf_copy, &c);
    const double gpu_first = wf_time_gpu(E, iters, wf_copy, &c);
    printf("      copy_quantized, one pass (WSYNC_COPY_QUANT_ONE_PASS): call to done %8.3f ms "
           "(%.3f of the limit), GPU alone %8.3f ms (%.3f)\n",
           ms_one, ms_limit / ms_one, gpu_one, ms_limit / gpu_one);
    printf("      copy_quantized, sources checked first:               call to done %8.3f ms "
           "(%.3f of the limit), GPU alone %8.3f ms (%.3f)\n",
           ms_first, ms_limit / ms_first, gpu_first, ms_limit / gpu_first);
    printf("      after a busy GPU (a %.0f ms kernel, the host waits for it, then the call): one "
           "pass, call to done %8.3f ms against the limit's %8.3f ms timed the same way (%.3f)\n",
           WH_BUSY_NS / 1e6, busy_one, busy_limit, busy_limit / busy_one);
    void *scratch;
    unsigned long long *bad_dev;
    WB_CK(cudaMalloc(&scratch, biggest));
    WB_CK(cudaMalloc((void **)&bad_dev, sizeof(*bad_dev)));
    size_t checked = 0;
    unsigned long long bad =
        wf_check(E, G, tensor_of, &c, layers, experts, scratch, bad_dev, &checked);
    printf(
        "      checked: every bf16 parameter against the trainer's fill, %zu FP8 tensors against "
        "the host reference quantizer: %llu wrong\n",
        checked, bad);

    double ms_ep_max = 0;
    if (experts > 0 && experts % WF_EP == 0) {
        const long long share = experts / WF_EP;
        for (int r = 0; r < WF_EP; r++) {
            size_t ne = 0;
            uint64_t wr = 0;
            size_t first = SIZE_MAX,
                   last = SIZE_MAX; /* ops of layer 0's first and last owned gate */
            for (size_t k = 0; k < n; k++) {
                const size_t t = tensor_of[k];
                unsigned layer;
                long long e;
                const char *rest;
                size_t dst = t;
                if (wf_expert(l->t[t].name, &layer, &e, &rest)) {
                    if (e / share != r)
                        continue;
                    char buf[160];
                    snprintf(buf, sizeof(buf), "model.layers.%u.mlp.experts.%lld.%s", layer,
                             e - r * share, rest);
                    const wf_named_t key = {buf, 0};
                    const wf_named_t *hit =
                        bsearch(&key, byname, l->n, sizeof(*byname), wf_by_name);
                    if (hit == NULL) {
                        fprintf(stderr, WF_WHO ": no local slot %s\n", buf);
                        exit(1);
                    }
                    dst = hit->t;
                    if (layer == 0 && strcmp(rest, "gate_proj.weight") == 0) {
                        if (first == SIZE_MAX)
                            first = ne;
                        last = ne;
                    }
                }
                wr += wf_op(l, G, dst, m->tensors[k].offset, &eops[ne], &eq[ne]);
                esrc[ne++] = t;
            }
            wf_call_t ec = {.E = E,
                            .h = h,
                            .gen = m->generation,
                            .ops = eops,
                            .q = eq,
                            .n = ne,
                            .flags = WSYNC_COPY_QUANT_ONE_PASS};
            const double ms = wf_time(E, iters, wf_copy, &ec);
            const double gms = wf_time_gpu(E, iters, wf_copy, &ec);
            if (ms > ms_ep_max)
                ms_ep_max = ms;
            /* the rank's first and last owned expert of layer 0, from their local slots */
            int rb = 0;
            const size_t at[2] = {first, last};
            for (int j = 0; j < 2; j++)
                rb += at[j] == SIZE_MAX ||
                      wf_check_fp8(E, esrc[at[j]], &eops[at[j]], &eq[at[j]], scratch);
            bad += (unsigned long long)rb;
            printf("      EP %d rank %d (experts %lld-%lld): %.2f GB written (%.3f of EP 1), "
                   "call to done %8.3f ms (%.3f of the EP 1 call), GPU alone %8.3f ms (%.3f); "
                   "its first and last expert %s\n",
                   WF_EP, r, r * share, (r + 1) * share - 1, wr / 1e9, (double)wr / (double)w1, ms,
                   ms / ms_one, gms, gms / gpu_one, rb ? "WRONG" : "equal to the host reference");
        }
    }
    wf_consumed(&c); /* once: every call above carries the manifest's one generation */
    printf("  summary fp8 %s: of the limit, one pass %.3f (GPU alone %.3f, after a busy GPU "
           "%.3f), sources checked first %.3f (GPU alone %.3f)",
           experts ? "moe" : "dense", ms_limit / ms_one, ms_limit / gpu_one, busy_limit / busy_one,
           ms_limit / ms_first, ms_limit / gpu_first);
    if (ms_ep_max > 0)
        printf(", EP %d slowest rank %.3f of the EP 1 call", WF_EP, ms_ep_max / ms_one);
    printf(", %llu wrong\n", bad);
    fflush(stdout);
    for (size_t g = 0; g < l->n_groups; g++) {
        WB_CK(cudaFree(G[g].w));
        if (G[g].scales)
            WB_CK(cudaFree(G[g].scales));
    }
    WB_CK(cudaFree(scratch));
    WB_CK(cudaFree(bad_dev));
    free(G);
    free(ops);
    free(eops);
    free(q);
    free(eq);
    free(byname);
    free(tensor_of);
    free(esrc);
    return bad;
}
