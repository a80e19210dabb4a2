/* copy_quantized's check, the host work before the GPU starts, in one run: bench_validate [iters]
 * The ops of the MoE layout's FP8 sync (Qwen3-30B-A3B with 12 layers): 4 656 bf16 expert
 * matrices quantized into e4m3fn with 128 x 128 block scales, 63 plain ops. Mean microseconds
 * per check without a memo, with a consumer's memo on a call it has not seen (the first of a
 * new sync plan), and on a repeated call (a steady sync), and the ratios to the first.
 * Not a test: no assertion on speed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "wsync_validate.h"

enum { BV_QUANT = 4656, BV_PLAIN = 63, BV_N = BV_QUANT + BV_PLAIN };

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Expert k: w13 [1536, 2048] (as two 768-row halves) and w2 [2048, 768], at addresses that only
 * need to be disjoint (nothing is written); then the plain ops. Returns the source bytes. */
static uint64_t bv_ops(wsync_copy_op_t *ops, wsync_quant_t *q, uint64_t shift)
{
    uintptr_t dst = (uintptr_t)1 << 40, scales = (uintptr_t)1 << 44;
    uint64_t src = 0;
    for (size_t k = 0; k < BV_N; k++) {
        const int quant = k < BV_QUANT, down = k % 3 == 2;
        const uint64_t rows = quant ? (down ? 2048 : 768) : 1,
                       cols = quant ? (down ? 768 : 2048) : 4096;
        const uint64_t sbytes = (rows + 127) / 128 * ((cols + 127) / 128) * 4;
        ops[k] = (wsync_copy_op_t){.src_offset = src,
                                   .src_pitch = cols * 2,
                                   .dst = (void *)(dst + shift),
                                   .dst_pitch = quant ? cols : cols * 2,
                                   .dst_extent = rows * (quant ? cols : cols * 2),
                                   .rows = rows,
                                   .row_bytes = cols * 2};
        q[k] = quant ? (wsync_quant_t){.kind = WSYNC_QUANT_FP8_BLOCK,
                                       .src_dtype = WSYNC_DTYPE_BF16,
                                       .cols = cols,
                                       .scale_dst = (void *)scales,
                                       .scale_pitch = (cols + 127) / 128 * 4,
                                       .scale_extent = sbytes}
                     : (wsync_quant_t){.kind = WSYNC_QUANT_NONE};
        src += rows * cols * 2;
        dst += ops[k].dst_extent;
        scales += quant ? sbytes : 0;
    }
    return src;
}

/* Mean microseconds per check; plans[i % n_plans] each time. Exits on a refused check. */
static double bv_time(wsync_validate_memo_t *memo, wsync_copy_op_t **plans, wsync_quant_t *q,
                      int n_plans, uint64_t src_bytes, int iters)
{
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        wsync_error_t err = {.struct_size = sizeof(err)};
        if (wsync_validate_quant_ops_memo(memo, plans[i % n_plans], q, BV_N, src_bytes, &err) !=
            WSYNC_OK) {
            fprintf(stderr, "bench_validate: refused: %s\n", err.message);
            exit(1);
        }
    }
    return (now_us() - t0) / iters;
}

int main(int argc, char **argv)
{
    const int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (iters < 1) {
        fprintf(stderr, "bench_validate: iterations must be at least 1, got %s\n", argv[1]);
        return 1;
    }
    enum { PLANS = WSYNC_VALIDATE_MEMO_SLOTS + 1 }; /* one more than the memo holds: never seen */
    wsync_copy_op_t *plans[PLANS];
    wsync_quant_t *q = calloc(BV_N, sizeof(*q));
    uint64_t src_bytes = 0;
    for (int p = 0; p < PLANS; p++) {
        plans[p] = calloc(BV_N, sizeof(wsync_copy_op_t));
        if (plans[p] == NULL || q == NULL) {
            fprintf(stderr, "bench_validate: out of memory\n");
            return 1;
        }
        src_bytes = bv_ops(plans[p], q, (uint64_t)p << 36); /* each plan's engine elsewhere */
    }
    wsync_validate_memo_t memo = {0};
    const double none = bv_time(NULL, plans, q, 1, src_bytes, iters);
    const double fresh = bv_time(&memo, plans, q, PLANS, src_bytes, iters);
    const double steady = bv_time(&memo, plans, q, 1, src_bytes, iters);
    printf("copy_quantized check, %d ops (%d quantized), mean of %d: without a memo %.1f us; with "
           "a consumer's memo, a call not seen %.1f us (%.2fx), a repeated call %.1f us (%.3fx)\n",
           BV_N, BV_QUANT, iters, none, fresh, fresh / none, steady, steady / none);
    wsync_validate_memo_free(&memo);
    for (int p = 0; p < PLANS; p++)
        free(plans[p]);
    free(q);
    return 0;
}
