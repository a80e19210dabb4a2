/* Manifest parse cost, full vs cached, in one run: bench_manifest [iterations]
 * Buckets of 504 tensors (a LoRA adapter) and 4 719 tensors (an MoE model), emitted in the
 * canonical form with digests, a new generation and new digests every sync as a producer sends
 * them. Prints the mean time per parse and the ratio. Not a test: no assertion on speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    return 0;
}
