/* Mapping tables the shims share. Engines differ mostly in how they name fused MoE experts, so a
 * shim's table is its expert rules chained (->next) to wsync_map_dense. */
#ifndef WSYNC_MAP_RULES_H
#define WSYNC_MAP_RULES_H

#include "wsync_mapping.h"

/* Llama/Qwen-style decoder: q/k/v -> qkv_proj (shards q, k, v), gate/up -> gate_up_proj (shards
 * 0, 1), o_proj / down_proj row-parallel, embed_tokens / lm_head vocab-parallel, norms (including
 * Qwen3 q_norm / k_norm) and the MoE router mlp.gate replicated. */
extern const wsync_map_table_t wsync_map_dense;

/* Fused MoE experts as SGLang and vLLM name them (expert_params_mapping):
 * experts.<e>.gate_proj -> experts.w13_weight[e] shard w1, up_proj -> shard w3,
 * down_proj -> experts.w2_weight[e]; chained to wsync_map_dense. */
extern const wsync_map_table_t wsync_map_fused_moe_w13;

/* The checkpoint layout: each HF tensor whole, in the parameter of its own name, on every rank. */
extern const wsync_map_table_t wsync_map_checkpoint;

#endif
