/* The order a bucket is packed in: the tensors an engine fuses into one parameter side by side,
 * in the order the engine holds them, so that the engine's copies continue each other. */
#ifndef WSYNC_COMMON_PACK_ORDER_H
#define WSYNC_COMMON_PACK_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

/* Where a tensor goes in an engine order: after every tensor of an earlier group (rank: the
 * group's first input index), then by expert (-1 outside an expert stack), by its part in the
 * fused parameter (q < k < v, gate < up), by input index. The first member of the sort keys of
 * both engine orders (this one, and wsync_map_order's for a whole model in engine-shims/). */
typedef struct wsync_order_place {
    size_t rank;
    int64_t expert;
    int part;
    size_t index;
} wsync_order_place_t;

/* qsort comparator for an array of structs whose first member is a wsync_order_place_t. */
int wsync_order_place_cmp(const void *a, const void *b);

/* Fills order[k] with the input index packed k-th. The tensors of one fused parameter (the
 * fusion table, wsync_fusion.h) are grouped where the first of them comes, in the engine's
 * order (q, k, v; gate, up; experts by expert, gate before up). Every other tensor keeps its
 * place among the groups. Stable and O(n log n).
 * WSYNC_PACK_ORDER=given keeps the caller's order (order[k] = k); any value other than "given"
 * or "engine" is named in a warning and the engine order is used.
 * INVALID_ARGUMENT for NULL arrays with n > 0; OUT_OF_MEMORY if the keys cannot be allocated. */
wsync_result_t wsync_pack_order(const wsync_stage_tensor_t *t, size_t n, size_t *order,
                                wsync_error_t *err);

#endif
