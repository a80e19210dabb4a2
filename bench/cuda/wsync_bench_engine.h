/* What the sides of wsync-bench-cuda share: error macros, the trainer's stage of a bucket's
 * pieces, and the engine's parameters (allocation, the ops of a bucket from its manifest, the
 * check of every word against the fill pattern). */
#ifndef WSYNC_BENCH_ENGINE_H
#define WSYNC_BENCH_ENGINE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "wsync_abi.h"
#include "wsync_bench_layout.h"
#include "wsync_client.h"
#include "wsync_cuda_harness.h"

#define WB_SEED 0x5eedu /* the trainer's fill: word i of the packed layout is mix(WB_SEED + i) */
/* ... ANDed with this: bit 14 of every bf16 cleared (exponent below 128), so every trainer value
 * is finite and the FP8 rows (wsync_bench_fp8.h) can quantize it */
#define WB_FILL_MASK 0xBFFFBFFFBFFFBFFFull

#define WB_CK(call) WH_CK("wsync-bench-cuda", call)

#define WB_OK(call)                                                                                \
    do {                                                                                           \
        wsync_error_t err_ = {.struct_size = sizeof(err_)};                                        \
        wsync_error_t *err = &err_;                                                                \
        wsync_result_t r_ = (call);                                                                \
        if (r_ != WSYNC_OK) {                                                                      \
            fprintf(stderr, "wsync-bench-cuda: %s:%d %s: %s: %s\n", __FILE__, __LINE__, #call,     \
                    wsync_strerror(r_), err_.message);                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Receive one message, or end the program naming what was awaited. */
void wb_recv_expect(int fd, const char *what, char **out);

/* Stage bucket b of `plan` into s on st: piece k of tensor i read from bases[i] (its own
 * allocation) or, with bases NULL, from trainer + the tensor's packed offset. */
void wb_stage_pieces(const wsync_plugin_t *p, wsync_staging_t *s, cudaStream_t st,
                     const wb_layout_t *l, const wb_plan_t *plan, size_t b, unsigned char *trainer,
                     unsigned char *const *bases);

typedef struct wb_engine {
    const wsync_plugin_t *p;
    wsync_consumer_t *c;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    wb_layout_t l;
    void **dst;    /* per tensor: where the engine holds it (a group base + goff) */
    void **groups; /* per engine parameter allocation (l.n_groups) */
} wb_engine_t;

/* One cudaMalloc per engine parameter (fused or not, as wb_layout_group grouped E->l); every
 * tensor's destination inside it. -1 when out of host memory. */
int wb_params_alloc(wb_engine_t *E, int fused);
void wb_params_free(wb_engine_t *E);
void wb_params_print(const wb_engine_t *E, int fused);
/* Words of the engine parameters that differ from the trainer's fill (blocking). */
unsigned long long wb_count_bad(wb_engine_t *E, unsigned long long *bad_dev);
/* The copy ops of bucket b of `plan` against its parsed manifest m (malloc'd; m->n_tensors of
 * them): pieces found by name on a bucket's first sight, checked after. Ends the program on a
 * name that is no piece of the bucket. */
wsync_copy_op_t *wb_bucket_ops(wb_engine_t *E, wb_plan_t *plan, size_t b,
                               const wsync_manifest_t *m);

#endif
