/* Helpers of the GPU tests: skip when there is no device, run a producer and a consumer in two
 * forked processes (the test process itself never initialises CUDA, so it can fork for every
 * test), and checks that end a child with a message. */
#ifndef WSYNC_GPU_TEST_H
#define WSYNC_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "wsync_abi.h"
#include "wsync_client.h"
#include "wsync_cuda_harness.h"

#define WG_PLUGIN WSYNC_TEST_PLUGIN_DIR "/libwsync_cuda.so"
/* The benchmarks' build: the same code, plus the experiments' variables read at every call
 * (plugin/cuda/wsync_cuda_tuning.h), for a test that sets them between calls. */
#define WG_PLUGIN_TUNABLE WSYNC_TEST_PLUGIN_DIR "/libwsync_cuda_tunable.so"
#define WG_BROKEN WSYNC_TEST_PLUGIN_DIR "/libwsync_cuda_broken.so"

/* In a child: print and exit(1) when cond is false. */
#define WG_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define WG_CK(call) WG_CHECK((call) == cudaSuccess, "CUDA call failed")

/* Call a plugin member with a local error and check WSYNC_OK. */
#define WG_OK(call)                                                                                \
    do {                                                                                           \
        wsync_error_t err_ = {.struct_size = sizeof(err_)};                                        \
        wsync_error_t *err = &err_;                                                                \
        wsync_result_t r_ = (call);                                                                \
        WG_CHECK(r_ == WSYNC_OK, "%s: %s", wsync_strerror(r_), err_.message);                      \
    } while (0)

/* Exit 77 with "SKIPPED: no CUDA device (<reason>)" when the plugin cannot find a device. */
void wg_require_device(const char *plugin);

typedef int (*wg_role_fn)(int fd, void *arg);
/* Fork producer(fd) and consumer(fd) over a socketpair; returns the consumer's exit status and
 * stores the producer's in *producer_status (-1 when it did not exit normally). */
int wg_run_pair(wg_role_fn producer, wg_role_fn consumer, void *arg, int *producer_status);

/* wg_run_pair, and 1 when both children exited 0; otherwise prints both exit statuses (-1: killed
 * by a signal) and returns 0. */
int wg_pair_passes(wg_role_fn producer, wg_role_fn consumer, void *arg);

/* In a child: load `plugin` (stats logging on when stats != 0). */
const wsync_plugin_t *wg_load(const char *plugin, int stats);

/* In a child: a consumer on device 0 with the default config but timeout_ms (0: the default). */
wsync_consumer_t *wg_consumer(const wsync_plugin_t *p, uint32_t timeout_ms);

/* In a producer child: wait for the consumer's close message, then retire s. */
void wg_close_and_retire(const wsync_plugin_t *p, wsync_staging_t *s, int fd);

/* Host copy of the fill pattern: byte j of a buffer filled with `seed`. */
static inline unsigned char wg_pattern_byte(uint64_t seed, uint64_t j)
{
    uint64_t z = seed + j / 8;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (unsigned char)(z >> (8 * (j % 8)));
}

/* A test that leaves out part of its work (a kind that cannot run here, a TP size above the GPU
 * count) calls WG_SKIP instead of cmocka's skip(): the skip is counted, and wg_finish turns a
 * run that passed with skips into exit 77 (ctest: Skipped) after one "SKIPPED (partial): ..."
 * line, so a partial run never reports Passed. */
extern int wg_skipped;
#define WG_SKIP()                                                                                  \
    do {                                                                                           \
        wg_skipped++;                                                                              \
        skip();                                                                                    \
    } while (0)
/* cmocka_run_group_tests' result, made 77 when it passed with WG_SKIPs. */
int wg_finish(int rc, const char *test);

#endif
