/* Manifest parse cost, full vs cached, in one run: bench_manifest [iterations]
 * Buckets of 504 tensors (a LoRA adapter) and 4 719 tensors (an MoE model), emitted in the
 * canonical form with digests, a new generation and new digests every sync as a producer sends
 * them. Prints the mean time per parse and the ratio. Then a direct bucket's host work on both
 * sides: 590 tensors each in its own segment (one of the MoE's 2 GiB buckets when the trainer
 * holds each tensor in an allocation of its own), and 4 719 (the whole MoE in one bucket):
 * wsync_direct_stage of the steady bucket with a locate that answers at once (the first a build),
 * its emit (the head and the kept tail), the full and the cached parse.
 * Not a test: no assertion on speed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wsync_direct.h"
#include "wsync_manifest.h"
#include "wsync_manifest_cache.h"

#define BENCH_GENERATIONS 8

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* The bucket's manifest for one generation; names and shapes like a real checkpoint's. */
static char *bench_emit(size_t n, uint64_t generation)
{
    wsync_tensor_desc_t *t = calloc(n, sizeof(*t));
    char *names = calloc(n, 96);
    char *text = NULL;
    if (t == NULL || names == NULL)
        goto out;
    for (size_t i = 0; i < n; i++) {
        char *name = names + 96 * i;
        snprintf(name, 96, "model.layers.%zu.mlp.experts.%zu.%s.weight", i / 96, i % 96 / 3,
                 (const char *[]){"gate_proj", "up_proj", "down_proj"}[i % 3]);
        t[i] = (wsync_tensor_desc_t){.struct_size = sizeof(t[i]),
                                     .name = name,
                                     .dtype = WSYNC_DTYPE_BF16,
                                     .ndim = 2,
                                     .shape = {768, 2048},
                                     .offset = (uint64_t)i * 768 * 2048 * 2,
                                     .nbytes = 768 * 2048 * 2,
                                     .digest = generation * 0x9E3779B97F4A7C15ull ^ i,
                                     .has_digest = 1};
    }
    wsync_manifest_t v = {.struct_size = sizeof(v),
                          .schema = 1,
                          .generation = generation,
                          .n_tensors = n,
                          .tensors = t};
    v.buffer.struct_size = sizeof(v.buffer);
    v.buffer.kind = WSYNC_BUFFER_CUDA_IPC;
    v.buffer.handle_len = 64;
    v.buffer.bytes = (uint64_t)n * 768 * 2048 * 2;
    v.buffer.pid = 4711;
    strcpy(v.buffer.device, "GPU-8f2c1d3e-0000-4a5b-9c6d-7e8f90a1b2c3");
    v.buffer.has_ready = v.buffer.has_consumed = 1;
    v.buffer.ready_len = v.buffer.consumed_len = 64;
    if (wsync_manifest_emit(&v, &text, NULL) != WSYNC_OK)
        text = NULL;
out:
    free(names);
    free(t);
    return text;
}

/* Mean microseconds per parse over `iters` parses cycling through the generations. */
static double bench_parse(wsync_manifest_cache_t *cache, char **texts, int iters)
{
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        const char *s = texts[i % BENCH_GENERATIONS];
        wsync_manifest_owned_t *m = NULL;
        if (wsync_manifest_parse_cached(cache, s, strlen(s), &m, NULL) != WSYNC_OK) {
            fprintf(stderr, "bench_manifest: parse failed\n");
            exit(1);
        }
        wsync_manifest_free(m);
    }
    return (now_us() - t0) / iters;
}

/* Tensor i lives alone in the 16 MiB segment at (i + 1) << 24, as a cudaMalloc each. */
static wsync_result_t bench_locate(void *user, const char *name, const void *src, uint64_t nbytes,
                                   wsync_buffer_desc_t *seg, uint64_t *offset, wsync_error_t *err)
{
    (void)user;
    (void)name;
    (void)nbytes;
    (void)err;
    const uint64_t at = (uint64_t)(uintptr_t)src, id = at >> 24;
    seg->kind = WSYNC_BUFFER_CUDA_IPC;
    memset(seg->handle, 0x5a, 64);
    memcpy(seg->handle + 16, &id, 8); /* IPC handles differ a few bytes in */
    memcpy(seg->handle + 64, &id, 8); /* the allocation id */
    seg->handle_len = 72;
    seg->bytes = 1u << 24;
    seg->pid = 4711;
    strcpy(seg->device, "GPU-8f2c1d3e-0000-4a5b-9c6d-7e8f90a1b2c3");
    *offset = at & ((1u << 24) - 1);
    return WSYNC_OK;
}

/* A direct bucket of n tensors: mean microseconds of build, emit, full parse, cached parse. */
static int bench_direct(size_t n, int iters)
{
    wsync_stage_tensor_t *t = calloc(n, sizeof(*t));
    char *names = calloc(n, 96);
    if (t == NULL || names == NULL)
        return 1;
    for (size_t i = 0; i < n; i++) {
        snprintf(names + 96 * i, 96, "model.layers.%zu.mlp.experts.%zu.%s.weight", i / 384,
                 i % 384 / 3, (const char *[]){"gate_proj", "up_proj", "down_proj"}[i % 3]);
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = names + 96 * i,
                                      .dtype = WSYNC_DTYPE_BF16,
                                      .ndim = 2,
                                      .shape = {768, 2048},
                                      .src = (const void *)(uintptr_t)((uint64_t)(i + 1) << 24)};
    }
    wsync_buffer_desc_t sync = {.struct_size = sizeof(sync), .kind = WSYNC_BUFFER_CUDA_IPC};
    sync.handle_len = 64;
    sync.bytes = 64;
    sync.pid = 4711;
    strcpy(sync.device, "GPU-8f2c1d3e-0000-4a5b-9c6d-7e8f90a1b2c3");
    sync.has_ready = sync.has_consumed = 1;
    sync.ready_len = sync.consumed_len = 64;
    wsync_manifest_cache_t *cache = wsync_manifest_cache_create();
    double us[4] = {0, 0, 0, 0};
    wsync_direct_set_t set = {0}; /* the staging's buckets, staged into as a producer does */
    for (int it = 0; it <= iters; it++) { /* the first round warms up (and fills the cache) */
        char *text = NULL;
        wsync_manifest_owned_t *full = NULL, *cached = NULL;
        double t0 = now_us();
        if (wsync_direct_stage(&set, t, n, bench_locate, NULL, NULL) != WSYNC_OK)
            return 1;
        wsync_direct_t *d = wsync_direct_current(&set);
        double t1 = now_us();
        if (wsync_direct_emit(d, &sync, (uint64_t)it + 1, 1, &text, NULL) != WSYNC_OK)
            return 1;
        double t2 = now_us();
        if (wsync_manifest_parse(text, strlen(text), &full, NULL) != WSYNC_OK)
            return 1;
        double t3 = now_us();
        if (wsync_manifest_parse_cached(cache, text, strlen(text), &cached, NULL) != WSYNC_OK)
            return 1;
        double t4 = now_us();
        if (it > 0) {
            us[0] += t1 - t0;
            us[1] += t2 - t1;
            us[2] += t3 - t2;
            us[3] += t4 - t3;
        }
        if (it == iters)
            printf("direct   %10zu segments %zu: stage (steady) %.1f us, emit (steady) %.1f us, "
                   "full parse %.1f us, "
                   "cached parse %.1f us (%zu tensors)\n",
                   strlen(text), d->n_segments, us[0] / iters, us[1] / iters, us[2] / iters,
                   us[3] / iters, n);
        wsync_manifest_free(full);
        wsync_manifest_free(cached);
        free(text);
    }
    wsync_direct_set_free(&set);
    wsync_manifest_cache_destroy(cache);
    free(names);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 40;
    const size_t sizes[] = {504, 4719};
    if (iters < 1)
        iters = 1;
    printf("%-8s %10s %10s %10s %10s %8s\n", "tensors", "bytes", "full_us", "miss_us", "cached_us",
           "ratio");
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        char *texts[BENCH_GENERATIONS];
        for (int g = 0; g < BENCH_GENERATIONS; g++)
            if ((texts[g] = bench_emit(sizes[s], (uint64_t)g + 1)) == NULL) {
                fprintf(stderr, "bench_manifest: emit failed\n");
                return 1;
            }
        wsync_manifest_cache_t *cache = wsync_manifest_cache_create();
        bench_parse(NULL, texts, 2); /* warm the allocator */
        double full = bench_parse(NULL, texts, iters);
        double miss = bench_parse(cache, texts, 1); /* the one miss that fills the cache */
        double cached = bench_parse(cache, texts, iters);
        wsync_manifest_cache_stats_t st;
        wsync_manifest_cache_stats(cache, &st);
        printf("%-8zu %10zu %10.1f %10.1f %10.1f %7.1fx  (hits %llu, misses %llu)\n", sizes[s],
               strlen(texts[0]), full, miss, cached, full / cached, (unsigned long long)st.hits,
               (unsigned long long)st.misses);
        wsync_manifest_cache_destroy(cache);
        for (int g = 0; g < BENCH_GENERATIONS; g++)
            free(texts[g]);
    }
    if (bench_direct(590, iters) != 0 || bench_direct(4719, iters < 10 ? iters : 10) != 0) {
        fprintf(stderr, "bench_manifest: a direct bucket failed\n");
        return 1;
    }
    return 0;
}
