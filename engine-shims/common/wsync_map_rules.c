/* The shared mapping tables. Data only. */
#include "wsync_map_rules.h"

static const wsync_map_rule_t wsync_dense_rules[] = {
    {"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", WSYNC_PART_Q, WSYNC_TP_COLUMN},
    {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", WSYNC_PART_K, WSYNC_TP_COLUMN},
    {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", WSYNC_PART_V, WSYNC_TP_COLUMN},
    {"self_attn.o_proj.weight", "self_attn.o_proj.weight", WSYNC_PART_WHOLE, WSYNC_TP_ROW},
    {"self_attn.q_norm.weight", "self_attn.q_norm.weight", WSYNC_PART_WHOLE, WSYNC_TP_REPLICATED},
    {"self_attn.k_norm.weight", "self_attn.k_norm.weight", WSYNC_PART_WHOLE, WSYNC_TP_REPLICATED},
    {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", WSYNC_PART_GATE, WSYNC_TP_COLUMN},
    {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", WSYNC_PART_UP, WSYNC_TP_COLUMN},
    {"mlp.down_proj.weight", "mlp.down_proj.weight", WSYNC_PART_WHOLE, WSYNC_TP_ROW},
    {"mlp.gate.weight", "mlp.gate.weight", WSYNC_PART_WHOLE, WSYNC_TP_REPLICATED},
    {"input_layernorm.weight", "input_layernorm.weight", WSYNC_PART_WHOLE, WSYNC_TP_REPLICATED},
    {"post_attention_layernorm.weight", "post_attention_layernorm.weight", WSYNC_PART_WHOLE,
     WSYNC_TP_REPLICATED},
    {"model.norm.weight", "model.norm.weight", WSYNC_PART_WHOLE, WSYNC_TP_REPLICATED},
    {"model.embed_tokens.weight", "model.embed_tokens.weight", WSYNC_PART_VOCAB, WSYNC_TP_COLUMN},
    {"lm_head.weight", "lm_head.weight", WSYNC_PART_VOCAB, WSYNC_TP_COLUMN},
};

const wsync_map_table_t wsync_map_dense = {
    .engine = "dense",
    .rules = wsync_dense_rules,
    .n_rules = sizeof(wsync_dense_rules) / sizeof(wsync_dense_rules[0]),
    .next = NULL,
};

static const wsync_map_rule_t wsync_fused_moe_rules[] = {
    {"mlp.experts.#.gate_proj.weight", "mlp.experts.w13_weight", WSYNC_PART_EXPERT_W1,
     WSYNC_TP_COLUMN},
    {"mlp.experts.#.up_proj.weight", "mlp.experts.w13_weight", WSYNC_PART_EXPERT_W3,
     WSYNC_TP_COLUMN},
    {"mlp.experts.#.down_proj.weight", "mlp.experts.w2_weight", WSYNC_PART_EXPERT_W2, WSYNC_TP_ROW},
};

const wsync_map_table_t wsync_map_fused_moe_w13 = {
    .engine = "fused-moe",
    .rules = wsync_fused_moe_rules,
    .n_rules = sizeof(wsync_fused_moe_rules) / sizeof(wsync_fused_moe_rules[0]),
    .next = &wsync_map_dense,
};

/* The checkpoint layout: every HF tensor lands whole in the parameter of its own name. For
 * engines that load through their own loaders (vLLM's layerwise reload): the shim fills
 * checkpoint-shaped tensors, and the engine's loader maps, narrows and processes them. */
static const wsync_map_rule_t wsync_checkpoint_rules[] = {
    {"*", "", WSYNC_PART_WHOLE, WSYNC_TP_REPLICATED},
};

const wsync_map_table_t wsync_map_checkpoint = {
    .engine = "checkpoint",
    .rules = wsync_checkpoint_rules,
    .n_rules = 1,
    .next = NULL,
};
