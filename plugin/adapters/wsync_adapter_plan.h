/* Validate an adapter against an engine slot and turn it into a backend-neutral plan: the
 * convert-copies and zero-fills that write the slot's SHADOW copy (index 1 - *active) and the
 * rank/scaling values of every target. A plan is only produced when everything checked out, so
 * an executor can write without further checks.
 *
 * Mapping rules:
 *   - A target with no parts receives the adapter module whose path equals target->module.
 *   - A packed target (n_parts > 0) receives one module per part: part->hf_module is a full path,
 *     or, without a '.', a sibling of target->module ("q_proj" next to
 *     "model.layers.0.self_attn.qkv_proj"). The parts are stacked along the rank: part k's A rows
 *     and B columns occupy [c_k, c_k + r_k) with c_k the sum of the ranks of the present parts
 *     before it, and its B rows are [out_offset, out_offset + out_features). B is thus block
 *     diagonal and B·A·x equals the concatenation of every part's own B_k·A_k·x. The sum of the
 *     present parts' ranks must fit in max_rank.
 *   - Every adapter module must land in exactly one target or part; every byte of the shadow A
 *     [max_rank, in] and B [out, max_rank] is written (zeros for padding, absent parts and
 *     targets the adapter does not train).
 *   - Target rank = sum of the present parts' ranks; scaling = the parts' common scaling, or 1.0
 *     with each part's B multiplied by its own scaling when they differ (alpha_pattern).
 *   - Float dtypes (bf16, f16, f32, f64) convert to each other; anything else is refused. */
#ifndef WSYNC_ADAPTERS_ADAPTER_PLAN_H
#define WSYNC_ADAPTERS_ADAPTER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_adapter.h"

/* rows x cols elements, converted from src_dtype to dst_dtype (times `scale`); pitches in bytes. */
typedef struct wsync_adapter_copy_op {
    const void *src;
    wsync_dtype_t src_dtype;
    uint64_t src_pitch;
    void *dst;
    wsync_dtype_t dst_dtype;
    uint64_t dst_pitch;
    uint64_t rows;
    uint64_t cols;
    double scale; /* 1.0: plain conversion */
} wsync_adapter_copy_op_t;

/* rows x row_bytes zero bytes at dst, dst_pitch bytes apart. */
typedef struct wsync_adapter_zero_op {
    void *dst;
    uint64_t dst_pitch;
    uint64_t rows;
    uint64_t row_bytes;
} wsync_adapter_zero_op_t;

/* Values written into target->rank[shadow] / scaling[shadow] at commit. */
typedef struct wsync_adapter_target_value {
    uint32_t rank;
    float scaling;
} wsync_adapter_target_value_t;

typedef struct wsync_adapter_plan {
    int shadow;                        /* the copy index the ops write: 1 - *active at build */
    wsync_adapter_memory_t src_memory; /* where every op's src lives */
    size_t n_copies;
    wsync_adapter_copy_op_t *copies;
    size_t n_zeros;
    wsync_adapter_zero_op_t *zeros;
    size_t n_targets; /* == slot->n_targets, same order */
    wsync_adapter_target_value_t *values;
} wsync_adapter_plan_t;

/* Check `slot` (pointers, sizes, parts inside out_features and disjoint, names unique, the two
 * copies' buffers disjoint from each other and from every other target's) and `a` against it,
 * and build the plan. Writes nothing into the slot. Errors name the module or target and the
 * values: NOT_FOUND (adapter module without a target), LAYOUT_MISMATCH (shapes, rank over
 * max_rank), NOT_SUPPORTED (dtypes), INVALID_ARGUMENT (a malformed slot), OUT_OF_MEMORY.
 * *out is owned by the caller. The adapter must outlive the plan (ops point into it). */
wsync_result_t wsync_adapter_plan_build(const wsync_adapter_t *a, const wsync_adapter_slot_t *slot,
                                        wsync_adapter_plan_t **out, wsync_error_t *err);

/* A plan that unloads: rank 0, scaling 0 and zeroed A/B for every target of the shadow copy. */
wsync_result_t wsync_adapter_plan_build_empty(const wsync_adapter_slot_t *slot,
                                              wsync_adapter_plan_t **out, wsync_error_t *err);

void wsync_adapter_plan_free(wsync_adapter_plan_t *plan);

/* Execute every op with the CPU (memset / wsync_convert_row). Destinations must be host
 * memory, sources host memory. Blocking; returns when every byte is written. */
wsync_result_t wsync_adapter_plan_exec_host(const wsync_adapter_plan_t *plan, wsync_error_t *err);

/* After the plan's ops are complete and visible: write rank/scaling of the shadow copy, then
 * switch *slot->active to it with a release store, so a reader that loads *active with acquire
 * semantics sees every byte of the new copy. Refuses (BUSY, nothing written) when *active changed
 * since the plan was built. Not thread safe per slot: one loader at a time. The previous copy is
 * still being read by requests that started before the switch: the engine must let them drain
 * before the next load writes it. */
wsync_result_t wsync_adapter_commit(wsync_adapter_slot_t *slot, const wsync_adapter_plan_t *plan,
                                    wsync_error_t *err);

#endif
