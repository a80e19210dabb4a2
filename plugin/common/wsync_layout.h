/* Producer-side packing of a bucket into a staging buffer, and the retained-layout rule. */
#ifndef WSYNC_COMMON_LAYOUT_H
#define WSYNC_COMMON_LAYOUT_H

#include <stddef.h>

#include "wsync_abi.h"

#define WSYNC_LAYOUT_ALIGN 256u

typedef struct wsync_layout {
    size_t n;
    wsync_tensor_desc_t *tensors; /* in packing order, offsets rising at WSYNC_LAYOUT_ALIGN;
                                   * has_digest 0 */
    size_t *from;                 /* tensors[k] is the caller's tensor from[k] */
    char *names;                  /* owned copies of the names */
    uint64_t used;                /* bytes up to the end of the last tensor */
} wsync_layout_t;

/* A stage tensor's smallest struct_size: the v1 fields up to `src` (src_dtype was appended in
 * 0.1.5). */
#define WSYNC_STAGE_TENSOR_MIN_SIZE offsetof(wsync_stage_tensor_t, src_dtype)

/* INVALID_ARGUMENT naming the first tensor whose struct_size is below the minimum. */
wsync_result_t wsync_stage_sizes_check(const wsync_stage_tensor_t *t, size_t n, wsync_error_t *err);
/* The dtype of t's source elements: src_dtype where the caller set it (0.1.5), else dtype. */
wsync_dtype_t wsync_stage_src_dtype(const wsync_stage_tensor_t *t);
/* 1 for the floating-point dtypes a stage converts between (bf16, f16, f32, f64). */
int wsync_stage_converts(wsync_dtype_t dt);

/* Pack `t` back to back in wsync_pack_order's order (the engine's fused parameters side by
 * side). Refuses (clear message) empty/duplicate names, unknown dtypes, a src_dtype
 * that does not convert to dtype (both must be floating point), bad shapes, a NULL src with
 * non-zero size, and a bucket larger than `capacity`. */
wsync_result_t wsync_layout_build(const wsync_stage_tensor_t *t, size_t n, uint64_t capacity,
                                  wsync_layout_t *out, wsync_error_t *err);
/* WSYNC_ERR_LAYOUT_MISMATCH naming the first difference (count, name, dtype or shape). */
wsync_result_t wsync_layout_compare(const wsync_layout_t *retained, const wsync_layout_t *next,
                                    wsync_error_t *err);
void wsync_layout_free(wsync_layout_t *l);

#endif
