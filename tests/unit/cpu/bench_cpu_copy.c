/* Benchmark (not a test): the host copy path against one plain memcpy of the same payload, for a
 * dense layout (~400 tensors, a few hundred MB). Prints the ratio; target >= 0.8.
 * Usage: bench_cpu_copy [tensors] [tensor_kib] [rounds] [verify] */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cpu_test_util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if ((x) != WSYNC_OK) {                                                                     \
            fprintf(stderr, "failed: %s\n", #x);                                                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 399;
    size_t kib = argc > 2 ? strtoul(argv[2], NULL, 0) : 1024;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    uint32_t flags = argc > 4 && atoi(argv[4]) ? WSYNC_COPY_VERIFY : 0;
    size_t tb = kib * 1024, total = n * tb;
    wsync_test_plugin_t P;
    wsync_staging_t *s;
    wsync_consumer_t *c;
    wsync_handle_t *h;
    const wsync_manifest_t *m = NULL;

    if (wsync_test_load(&P, WSYNC_TEST_HOST_LIB) != 0)
        return 1;
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = n * (tb + 256)};
    CHECK(P.p->create(&cfg, &s, NULL));
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc)};
    CHECK(P.c->create(&cc, &c, NULL));
    uint8_t *src = malloc(total), *dst;
    memset(src, 0x5a, total);
    CHECK(P.c->mem_alloc(c, total, (void **)&dst, NULL));
    memset(dst, 0, total);
    wsync_stage_tensor_t *t = calloc(n, sizeof(*t));
    char(*names)[48] = calloc(n, 48);
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], 48, "model.layers.%zu.weight", i);
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = names[i],
                                      .dtype = WSYNC_DTYPE_BF16,
                                      .ndim = 2,
                                      .shape = {(int64_t)(tb / 2048), 1024},
                                      .src = src + i * tb};
    }
    CHECK(P.p->stage(s, NULL, t, n, NULL));
    wsync_copy_op_t *ops = calloc(n, sizeof(*ops));
    void **dsts = calloc(n, sizeof(*dsts));
    for (size_t i = 0; i < n; i++)
        dsts[i] = dst + i * tb;

    double best_path = 1e9;
    for (int r = 0; r <= rounds; r++) {
        const char *json;
        uint64_t g;
        CHECK(P.p->publish(s, NULL, 0, &json, &g, NULL));
        if (m != NULL)
            P.c->manifest_free(c, m);
        CHECK(P.c->parse_manifest(c, json, strlen(json), &m, NULL));
        if (r == 0)
            CHECK(P.c->open_handle(c, &m->buffer, &h, NULL));
        wsync_test_ops(m, dsts, ops);
        double t0 = now_s();
        CHECK(P.c->copy_weights(c, h, NULL, g, ops, n, flags, NULL));
        CHECK(P.c->record_consumed(c, h, 1, NULL));
        double dt = now_s() - t0;
        if (r > 0 && dt < best_path) /* round 0 warms up */
            best_path = dt;
        CHECK(P.p->wait_consumed(s, NULL, g, NULL));
    }

    /* Baseline: one memcpy of the same payload out of the same shared mapping. */
    char name[WSYNC_HANDLE_MAX + 1];
    memcpy(name, m->buffer.handle, m->buffer.handle_len);
    name[m->buffer.handle_len] = '\0';
    int fd = shm_open(name, O_RDONLY, 0);
    size_t seg = 4096u /* WSYNC_CONTROL_SIZE */ + cfg.bytes;
    uint8_t *map = mmap(NULL, seg, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    double best_memcpy = 1e9;
    for (int r = 0; r <= rounds; r++) {
        double t0 = now_s();
        memcpy(dst, map + 4096u /* WSYNC_CONTROL_SIZE */, total);
        double dt = now_s() - t0;
        if (r > 0 && dt < best_memcpy)
            best_memcpy = dt;
    }
    munmap(map, seg);
    printf("tensors %zu x %zu KiB = %.1f MB, verify %s\n", n, kib, total / 1e6,
           flags ? "on" : "off");
    printf("copy path  %.2f GB/s\nmemcpy     %.2f GB/s\nratio      %.3f\n", total / best_path / 1e9,
           total / best_memcpy / 1e9, best_memcpy / best_path);
    P.c->manifest_free(c, m);
    CHECK(P.c->close_handle(c, h, NULL));
    CHECK(P.p->retire(s, NULL));
    P.c->mem_free(c, dst, NULL);
    CHECK(P.c->finalize(c, NULL));
    free(src);
    free(t);
    free(names);
    free(ops);
    free(dsts);
    return 0;
}
