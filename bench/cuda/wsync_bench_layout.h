/* Model layouts of the CUDA benchmark (Qwen3-8B dense, Qwen3-30B-A3B MoE shapes) and their
 * split into staging buckets. Deterministic: producer and consumer compute the same plan. */
#ifndef WSYNC_BENCH_LAYOUT_H
#define WSYNC_BENCH_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct wb_tensor {
    char name[96];
    int64_t rows, cols; /* bf16, row-major; 1-D tensors have rows = 1 */
    uint64_t bytes;
    uint64_t offset; /* in a packed buffer (256-byte aligned) */
    size_t group;    /* the engine parameter allocation holding it (wb_layout_group) */
    uint64_t goff;   /* its byte offset in that allocation */
} wb_tensor_t;

typedef struct wb_layout {
    wb_tensor_t *t;
    size_t n;
    uint64_t payload;      /* sum of bytes */
    uint64_t packed;       /* packed buffer size */
    uint64_t *group_bytes; /* per engine parameter allocation (wb_layout_group); owned */
    size_t n_groups;
} wb_layout_t;

/* A piece of a tensor in a bucket: rows [r0, r0 + rows). */
typedef struct wb_piece {
    size_t tensor;
    int64_t r0, rows;
} wb_piece_t;

typedef struct wb_bucket {
    size_t first, count; /* into the plan's pieces */
} wb_bucket_t;

typedef struct wb_plan {
    wb_piece_t *p;
    size_t np;
    size_t *at; /* per bucket slot k: the piece the manifest's k-th tensor is (SIZE_MAX: not
                 * yet seen; the producer packs in its own order, wb_plan_learn) */
    wb_bucket_t *b;
    size_t nb;
} wb_plan_t;

/* kind "dense" or "moe"; layers 0 = the model's own (36 / 12); scale divides every row count;
 * grouped (moe): the trainer's order puts gate and up of every expert, then every down, instead
 * of gate, up, down of each expert in turn. */
int wb_layout_build(const char *kind, unsigned layers, unsigned scale, int grouped,
                    wb_layout_t *out);
void wb_layout_free(wb_layout_t *l);
/* Fills group / goff / group_bytes as an engine holds its parameters. fused = 0: one allocation
 * per tensor. fused = 1: per layer one qkv_proj (q, k, v), one gate_up_proj (dense gate, up), one
 * w13 (each expert's gate then up, expert after expert) and one w2 (each expert's down); members
 * packed in layout order without padding; every other tensor alone. Callable again; -1 if out of
 * memory (the layout is then left without groups). */
int wb_layout_group(wb_layout_t *l, int fused);
/* Buckets of at most bucket_bytes (each piece 256-byte aligned in it); big tensors are split by
 * rows. With ramp r > 0 the first r buckets hold at most bucket_bytes / growth^r, / growth^(r-1),
 * ... / growth (a tensor that opens one still whole); r = 3, growth 2 (1/8, 1/4, 1/2) is how
 * Producer(direct=True) plans: the GPU starts on a small bucket while the host works on the
 * larger ones. */
int wb_plan_build(const wb_layout_t *l, uint64_t bucket_bytes, unsigned ramp, double growth,
                  wb_plan_t *out);
void wb_plan_free(wb_plan_t *p);
/* The name a piece is staged under: the tensor's, with "@r0" for a slice from row r0 > 0 or a
 * slice that is not the whole tensor. */
void wb_piece_name(const wb_layout_t *l, const wb_piece_t *pc, char *buf, size_t cap);
/* Learns at[] of bucket b from the manifest's names (count of them: n); -1 naming the first name
 * that is no piece of the bucket, in why. */
int wb_plan_learn(const wb_layout_t *l, wb_plan_t *p, size_t b, const char *const *names, size_t n,
                  char *why, size_t cap);

#endif
