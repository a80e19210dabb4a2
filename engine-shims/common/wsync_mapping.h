/* HF checkpoint names -> engine parameters, table-driven (the "stacked params mapping" of SGLang
 * and vLLM, LMDeploy's params_mapping), and tensor-parallel narrowing. One rule per HF suffix;
 * a shim's table is its own rules chained to the shared ones (wsync_map_rules.h).
 *
 * Planning turns one HF tensor of a manifest into exactly one copy op into the engine parameter
 * it belongs to, for this worker's TP rank:
 *   column-parallel (qkv, gate_up, experts w1/w3, vocab rows): a contiguous dim-0 range, 1-D op;
 *   row-parallel (o_proj, down_proj, experts w2): a dim-1 slice, a 2-D op with pitches;
 *   replicated (norms, router): the whole tensor;
 *   k/v heads: split when tp <= kv_heads, replicated (rank r takes head r / (tp / kv_heads))
 *   when tp > kv_heads;
 *   experts under expert parallelism: only the rank's own (wsync_map_ep_share), split over its
 *   MoE TP group; another rank's expert plans to an empty op.
 * Pure functions of their inputs; thread safe. */
#ifndef WSYNC_MAPPING_H
#define WSYNC_MAPPING_H

#include <stddef.h>
#include "wsync_abi.h"
#include "wsync_registry.h"

#define WSYNC_MAP_NAME_MAX 256

/* Where an HF tensor lands inside its engine parameter (the shard id). */
typedef enum wsync_map_part {
    WSYNC_PART_WHOLE = 0,     /* the engine parameter is this tensor (narrowed for TP) */
    WSYNC_PART_Q = 1,         /* qkv_proj rows [0, q) */
    WSYNC_PART_K = 2,         /* qkv_proj rows [q, q + kv) */
    WSYNC_PART_V = 3,         /* qkv_proj rows [q + kv, q + 2 kv) */
    WSYNC_PART_GATE = 4,      /* gate_up_proj rows [0, i) */
    WSYNC_PART_UP = 5,        /* gate_up_proj rows [i, 2 i) */
    WSYNC_PART_EXPERT_W1 = 6, /* w13[e] rows [0, mi) (gate_proj of expert e) */
    WSYNC_PART_EXPERT_W3 = 7, /* w13[e] rows [mi, 2 mi) (up_proj of expert e) */
    WSYNC_PART_EXPERT_W2 = 8, /* w2[e] (down_proj of expert e), row-parallel */
    /* embed_tokens / lm_head: vocabulary rows, column-parallel over a padded vocabulary. Each
     * rank holds param rows = padded vocab / tp (vLLM and SGLang pad to a multiple of 64 before
     * the split: VocabParallelEmbedding); rank r takes the real rows [r x rows, (r + 1) x rows)
     * below dims.vocab, and its padding rows are never written. */
    WSYNC_PART_VOCAB = 9
} wsync_map_part_t;

/* Is `part` one expert's share of a fused expert parameter? */
#define WSYNC_MAP_IS_EXPERT(part) ((part) >= WSYNC_PART_EXPERT_W1 && (part) <= WSYNC_PART_EXPERT_W2)

typedef enum wsync_tp_split {
    WSYNC_TP_REPLICATED = 0,
    WSYNC_TP_COLUMN = 1, /* narrow dim 0 */
    WSYNC_TP_ROW = 2     /* narrow dim 1 */
} wsync_tp_split_t;

/* `hf_suffix` matches the end of an HF name at a '.' boundary; '#' in it matches one decimal
 * index (the expert id). The engine name is the matched prefix + `engine_suffix`. The suffix
 * "*" matches every name, and its engine name is the HF name itself (the checkpoint layout). */
typedef struct wsync_map_rule {
    const char *hf_suffix;
    const char *engine_suffix;
    wsync_map_part_t part;
    wsync_tp_split_t split;
} wsync_map_rule_t;

/* Rules are tried in order, then `next`'s: put specific rules (experts) before general ones. */
typedef struct wsync_map_table {
    const char *engine; /* "sglang", ... (messages) */
    const wsync_map_rule_t *rules;
    size_t n_rules;
    const struct wsync_map_table *next;
} wsync_map_table_t;

/* The engine parameter an HF name maps to. */
typedef struct wsync_map_target {
    const wsync_map_rule_t *rule;
    char engine_name[WSYNC_MAP_NAME_MAX];
    int64_t expert; /* -1 unless the rule captured '#' */
} wsync_map_target_t;

/* Find the rule for `hf_name`. NOT_FOUND (naming the tensor and the engine) when none matches. */
wsync_result_t wsync_map_resolve(const wsync_map_table_t *table, const char *hf_name,
                                 wsync_map_target_t *out, wsync_error_t *err);

/* Plan the copy of tensor `t` (offsets relative to its buffer's usable region) into the engine:
 * resolve, look the parameter up through `eng`, check dtype and the HF shape the parameter
 * implies, and fill *op (dst_extent = bytes of the parameter from op->dst). Nothing is written
 * anywhere but *op. Errors: NOT_FOUND (no rule, or the engine lacks the parameter),
 * LAYOUT_MISMATCH (shape or dtype; the message says which), INVALID_ARGUMENT (dims that the TP
 * size does not divide). */
wsync_result_t wsync_map_plan(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                              const wsync_tensor_desc_t *t, wsync_copy_op_t *op,
                              wsync_error_t *err);

/* Expert parallelism, the linear placement (vLLM's determine_expert_map "linear", its default,
 * as read in vLLM 0.11-0.33; SGLang's EP MoE with the expert count divisible by the EP size):
 * with b = experts / ep_size and m = experts % ep_size, rank r owns experts [first, first +
 * count) with count = b + (r < m) and first = r * b + min(r, m); its local index is e - first.
 * Planning skips an expert another rank owns: an empty op (nothing read, nothing written). */
void wsync_map_ep_share(int64_t experts, uint32_t ep_rank, uint32_t ep_size, int64_t *first,
                        int64_t *count);
/* The EP rank of ep_size that owns expert e (0 <= e < experts) in that placement. */
uint32_t wsync_map_ep_owner(int64_t experts, uint32_t ep_size, int64_t e);
/* The expert index of HF tensor `name` (a rule's '#'), or -1 for every other tensor. */
int64_t wsync_map_expert_of(const wsync_map_table_t *table, const char *name);
/* 0 when HF tensor `name` is an expert that another EP rank of `eng` owns; 1 otherwise (every
 * other tensor, names no rule matches included: planning reports those). */
int wsync_map_owned(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                    const char *name);
/* 1 when `eng` runs with expert parallelism (its moe member reports an EP size above 1). */
int wsync_map_ep_active(const wsync_engine_ops_t *eng);

/* wsync_map_plan, and an fp8 (e4m3fn) engine parameter fed from a bf16, f16 or f32 tensor: a
 * quantizing op (*quant) that writes the parameter and its scales: the parameter's
 * `..._scale_inv` (128 x 128 block scales, kind WSYNC_QUANT_FP8_BLOCK), else its `..._scale`
 * (vLLM's per-channel [R, 1] or per-tensor [1]: kinds WSYNC_QUANT_FP8_CHANNEL, _TENSOR;
 * docs/SHIMS.md, "FP8 parameters"). *tensor_rows (optional): for a per-tensor op, the rows of the
 * parameter (of its expert) that its one scale covers, which one bucket must bring whole; else 0.
 * Every other tensor plans as wsync_map_plan does, with quant->kind WSYNC_QUANT_NONE. Refused
 * naming the tensor: a slice whose 128 x 128 blocks would straddle two tensors or two TP ranks
 * (INVALID_ARGUMENT), a missing or mis-shaped scale parameter (LAYOUT_MISMATCH), an fp8 parameter
 * that is not a 2-D weight (NOT_SUPPORTED). */
wsync_result_t wsync_map_plan_quant(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                                    const wsync_tensor_desc_t *t, wsync_copy_op_t *op,
                                    wsync_quant_t *quant, uint64_t *tensor_rows,
                                    wsync_error_t *err);

/* The order the engine holds `names` in, as indices into names (order: n entries): tensors of one
 * engine parameter next to each other, in the parameter's own order (q, k, v in qkv_proj; gate,
 * up in gate_up_proj; gate_e, up_e expert after expert in w13, down_e in w2), each parameter where
 * its first tensor came; names no rule matches keep their place among the parameters. A trainer
 * that stages a bucket in this order lets copies into fused parameters continue each other, which
 * the CUDA plugin joins into a few long copy-engine copies (docs/PERFORMANCE.md: MoE experts in
 * HF module order copy at 0.88-0.90 of one memcpy, in this order at 0.95-0.98). */
wsync_result_t wsync_map_order(const wsync_map_table_t *table, const char *const *names, size_t n,
                               size_t *order, wsync_error_t *err);

/* The staging buffer's packing alignment (the producers' 256 bytes). */
#define WSYNC_MAP_ALIGN 256u

/* Plan buckets of at most bucket_bytes for n tensors (names, nbytes): the engine's order
 * (wsync_map_order into order, n entries), cut greedily with WSYNC_MAP_ALIGN alignment; the
 * tensors of one engine parameter (of one expert in fused experts) stay in one bucket when they
 * fit one (the bucket before then ends early), so only a parameter larger than a bucket is cut.
 * Bucket b holds order[bucket_first[b] .. bucket_first[b + 1]); *n_buckets buckets (bucket_first
 * needs n + 1 entries). INVALID_ARGUMENT naming the tensor when one does not fit a bucket.
 * `ramp` (0: none; at most 16): bucket j < ramp holds at most bucket_bytes >> (ramp - j), or the
 * largest tensor from its start on when that is more (tensors stay whole), so a pipelined sync
 * (direct mode: the engine's host work on bucket k + 1 beside its copies of bucket k) starts on
 * a small bucket: 3 gives 1/8, 1/4, 1/2, then whole buckets. */
wsync_result_t wsync_map_plan_buckets(const wsync_map_table_t *table, const char *const *names,
                                      const uint64_t *nbytes, size_t n, uint64_t bucket_bytes,
                                      unsigned ramp, size_t *order, size_t *bucket_first,
                                      size_t *n_buckets, wsync_error_t *err);

#endif
