/* wsync-bench-cuda --digest (see wsync_bench_digest.h). */
#include "wsync_bench_digest.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "wsync_bench_kernels.h"
#include "wsync_bench_layout.h"
#include "wsync_copy_kernel.h"
#include "wsync_cuda_harness.h"

#define WD_WHO "wsync-bench-cuda --digest"
#define WD_CK(call) WH_CK(WD_WHO, call)
#define WD_WARMUP 2

typedef struct wd_env {
    const wsync_plugin_t *p;
    struct wsync_consumer *c;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    int sm;
    void *flat, *flat2, *sink;
    uint64_t bytes;
    wsync_copy_op_t *regions;
    size_t n;
    uint64_t *out;
    wsync_cuda_op_t *dops; /* the regions planned as the plugin plans them (bare kernel rows) */
    uint64_t chunks;
    unsigned long long *sums;
    int variant;
} wd_env_t;

static void wd_read(void *a, cudaStream_t s)
{
    wd_env_t *x = a;
    WD_CK(wb_kernel_read(x->flat, x->bytes & ~15ull, x->sink, x->sm * 4, s));
}

static void wd_memcpy(void *a, cudaStream_t s)
{
    wd_env_t *x = a;
    WD_CK(cudaMemcpyAsync(x->flat2, x->flat, x->bytes, cudaMemcpyDeviceToDevice, s));
}

static void wd_bare(void *a, cudaStream_t s)
{
    wd_env_t *x = a;
    WD_CK(cudaMemsetAsync(x->sums, 0, x->n * sizeof(*x->sums), s));
    WD_CK(wsync_cuda_launch_digest(x->dops, (uint32_t)x->n, x->chunks, x->sums, x->sm, x->variant,
                                   s));
}

/* Host-timed: what a caller waits for, launch to result on the host. */
static double wd_host_read(wd_env_t *x)
{
    const double t0 = wh_now_ms();
    wd_read(x, x->s);
    WD_CK(cudaStreamSynchronize(x->s));
    return wh_now_ms() - t0;
}

static int wd_digest(wd_env_t *x, double *ms)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const double t0 = wh_now_ms();
    wsync_result_t r =
        x->p->consumer->digest_regions(x->c, (wsync_stream_t)x->s, x->regions, x->n, x->out, &err);
    *ms = wh_now_ms() - t0;
    if (r != WSYNC_OK)
        fprintf(stderr, WD_WHO ": digest_regions: %s (%s)\n", err.message, err.where);
    return r == WSYNC_OK ? 0 : -1;
}

static int wd_layout(wd_env_t *x, const char *kind, unsigned iters)
{
    wb_layout_t l;
    if (wb_layout_build(kind, 0, 1, 0, &l) != 0 || wb_layout_group(&l, 1) != 0) {
        fprintf(stderr, WD_WHO ": cannot build the %s layout\n", kind);
        return 1;
    }
    void **groups = calloc(l.n_groups, sizeof(*groups));
    x->regions = calloc(l.n, sizeof(*x->regions));
    x->out = calloc(l.n, sizeof(*x->out));
    uint64_t *first = calloc(l.n, sizeof(*first));
    double *t = calloc(iters, sizeof(*t)), *h = calloc(iters, sizeof(*h));
    if (groups == NULL || x->regions == NULL || x->out == NULL || first == NULL || t == NULL ||
        h == NULL) {
        fprintf(stderr, WD_WHO ": out of host memory\n");
        return 1;
    }
    for (size_t g = 0; g < l.n_groups; g++) {
        WD_CK(cudaMalloc(&groups[g], l.group_bytes[g] ? l.group_bytes[g] : 1));
        WD_CK(wh_fill(groups[g], l.group_bytes[g], 0x5eed + g, x->s));
    }
    /* Each HF tensor's region inside its engine parameter, as the checker digests them. */
    for (size_t i = 0; i < l.n; i++)
        x->regions[i] =
            (wsync_copy_op_t){.dst = (unsigned char *)groups[l.t[i].group] + l.t[i].goff,
                              .rows = 1,
                              .row_bytes = l.t[i].bytes,
                              .dst_pitch = l.t[i].bytes};
    x->n = l.n;
    x->bytes = l.payload;
    WD_CK(cudaMalloc(&x->flat, x->bytes));
    WD_CK(cudaMalloc(&x->flat2, x->bytes));
    WD_CK(wh_fill(x->flat, x->bytes, 7, x->s));
    WD_CK(cudaStreamSynchronize(x->s));

    wsync_cuda_op_t *hops = calloc(l.n, sizeof(*hops));
    if (hops == NULL)
        return 1;
    x->chunks = 0;
    for (size_t i = 0; i < l.n; i++)
        x->chunks += wsync_cuda_plan_op(&hops[i], x->regions[i].dst, x->regions[i].dst,
                                        x->regions[i].row_bytes, x->regions[i].row_bytes, 1,
                                        x->regions[i].row_bytes, 1, x->chunks);
    WD_CK(cudaMalloc((void **)&x->dops, l.n * sizeof(*hops)));
    WD_CK(cudaMalloc((void **)&x->sums, l.n * sizeof(*x->sums)));
    WD_CK(cudaMemcpy(x->dops, hops, l.n * sizeof(*hops), cudaMemcpyHostToDevice));
    free(hops);
    double bare[WSYNC_CUDA_DIGEST_VARIANTS];
    int rc = 0;
    unsigned long long *ref = calloc(2 * l.n, sizeof(*ref));
    if (ref == NULL)
        return 1;
    for (x->variant = 0; x->variant < WSYNC_CUDA_DIGEST_VARIANTS; x->variant++) {
        bare[x->variant] = wh_time_events(WD_WHO, x->e0, x->e1, x->s, WD_WARMUP, iters, wd_bare, x);
        unsigned long long *got = ref + (x->variant == 0 ? 0 : l.n);
        WD_CK(cudaMemcpy(got, x->sums, l.n * sizeof(*got), cudaMemcpyDeviceToHost));
        if (x->variant > 0 && memcmp(ref, got, l.n * sizeof(*got)) != 0) {
            fprintf(stderr, WD_WHO ": digest variant %d disagrees with variant 0\n", x->variant);
            rc = 1;
        }
    }
    free(ref);
    const double rd = wh_time_events(WD_WHO, x->e0, x->e1, x->s, WD_WARMUP, iters, wd_read, x);
    const double cp = wh_time_events(WD_WHO, x->e0, x->e1, x->s, WD_WARMUP, iters, wd_memcpy, x);
    double ms;
    for (unsigned k = 0; k < WD_WARMUP && rc == 0; k++)
        rc = wd_digest(x, &ms);
    memcpy(first, x->out, l.n * sizeof(*first));
    for (unsigned k = 0; k < iters && rc == 0; k++) {
        h[k] = wd_host_read(x);
        rc = wd_digest(x, &t[k]);
        if (rc == 0 && memcmp(first, x->out, l.n * sizeof(*first)) != 0) {
            fprintf(stderr,
                    WD_WHO ": the digests changed between two passes over the same bytes\n");
            rc = 1;
        }
    }
    if (rc == 0) {
        const double dg = wh_median(t, iters), hr = wh_median(h, iters);
        const double gb = (double)x->bytes / 1e9;
        printf("%s: %zu engine parameter regions in %zu allocations, %.2f GB, median of %u\n", kind,
               l.n, l.n_groups, gb, iters);
        printf("  read-only kernel, one buffer (events)      %8.3f ms  %7.1f GB/s  (limit)\n", rd,
               gb / rd * 1e3);
        printf("  read-only kernel, launch to host (wall)    %8.3f ms  %7.1f GB/s\n", hr,
               gb / hr * 1e3);
        printf("  one cudaMemcpyAsync, same bytes (events)   %8.3f ms  %7.1f GB/s read+write\n", cp,
               2 * gb / cp * 1e3);
        for (int v = 0; v < WSYNC_CUDA_DIGEST_VARIANTS; v++)
            printf(
                "  digest kernel variant %d%s (events)        %8.3f ms  %7.1f GB/s  %.3f of read\n",
                v, v == 0 ? " (plugin)" : "         ", bare[v], gb / bare[v] * 1e3, rd / bare[v]);
        printf("  digest_regions, per tensor (wall, blocking) %7.3f ms  %7.1f GB/s\n", dg,
               gb / dg * 1e3);
        printf("  digest / read bandwidth: %.3f of the read-only kernel (events), %.3f of it "
               "launch to host\n",
               rd / dg, hr / dg);
    }
    WD_CK(cudaFree(x->dops));
    WD_CK(cudaFree(x->sums));
    WD_CK(cudaFree(x->flat));
    WD_CK(cudaFree(x->flat2));
    for (size_t g = 0; g < l.n_groups; g++)
        WD_CK(cudaFree(groups[g]));
    free(groups);
    free(x->regions);
    free(x->out);
    free(first);
    free(t);
    free(h);
    wb_layout_free(&l);
    return rc;
}

int wb_digest_main(const char *plugin, const char *layout, unsigned iters)
{
    wd_env_t x;
    memset(&x, 0, sizeof(x));
    char why[512];
    if (wh_load(plugin, &x.p, why, sizeof(why)) != WSYNC_OK) {
        fprintf(stderr, WD_WHO ": %s\n", why);
        return 1;
    }
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, x.p->consumer, digest_regions)) {
        fprintf(stderr, WD_WHO ": %s has no digest_regions\n", plugin);
        return 1;
    }
    WD_CK(cudaSetDevice(0));
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .device_ordinal = 0};
    if (x.p->consumer->create(&cc, &x.c, &err) != WSYNC_OK) {
        fprintf(stderr, WD_WHO ": create: %s\n", err.message);
        return 1;
    }
    WD_CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
    WD_CK(cudaEventCreate(&x.e0));
    WD_CK(cudaEventCreate(&x.e1));
    WD_CK(cudaDeviceGetAttribute(&x.sm, cudaDevAttrMultiProcessorCount, 0));
    WD_CK(cudaMalloc(&x.sink, 16));
    printf("weight checker digest pass (wsync64 of every region, digest_regions) vs HBM read "
           "bandwidth\n");
    int rc = 0;
    if (strcmp(layout, "moe") != 0)
        rc |= wd_layout(&x, "dense", iters);
    if (strcmp(layout, "dense") != 0)
        rc |= wd_layout(&x, "moe", iters);
    x.p->consumer->finalize(x.c, &err);
    WD_CK(cudaFree(x.sink));
    return rc;
}
