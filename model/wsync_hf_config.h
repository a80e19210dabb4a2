/* Hugging Face configs to tensor lists: the families RL users train most, with the names,
 * dtypes and shapes transformers gives their checkpoints. Contract in
 * wsync_model_config.h (wsync_model_from_config); this header is the layer's private interface
 * between the config reader and the list builder. */
#ifndef WSYNC_HF_CONFIG_H
#define WSYNC_HF_CONFIG_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "wsync_model.h"

/* What the tensor list depends on, read from config.json (already scaled for the built-ins). */
typedef struct wsync_hf_dims {
    char model_type[32];
    wsync_dtype_t dtype;
    int64_t hidden, layers, heads, kv_heads, head_dim, intermediate, vocab;
    int64_t experts, moe_intermediate, shared_intermediate; /* 0: dense, no shared expert */
    int64_t sparse_step;                                    /* every n-th layer is sparse */
    const json_t *mlp_only_layers;                          /* borrowed; may be NULL */
    int tied, qk_norm, qkv_bias, o_bias, mixtral;
} wsync_hf_dims_t;

/* Read `root` into *d: model_type must be one of llama, mistral, qwen2, qwen2_moe, qwen3,
 * qwen3_moe, mixtral (-1 and `why` naming it otherwise); every size a positive integer. */
int wsync_hf_read(const json_t *root, wsync_hf_dims_t *d, char *why, size_t len);
/* The tensor list of *d into m (tensors and n only). -1 on out of memory. */
int wsync_hf_tensors(const wsync_hf_dims_t *d, wsync_model_t *m);

#endif
