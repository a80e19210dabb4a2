/* Hugging Face configs to tensor lists. Names and shapes follow transformers' modeling files
 * for each family as a transformers model's state_dict holds them (read at transformers 5.24,
 * its fused experts split back per expert as wsync.checkpoint does): weights [out, in], q/k/v
 * biases on Qwen2 (all four with Llama's attention_bias), q_norm / k_norm of head_dim on Qwen3,
 * the router as mlp.gate and experts as mlp.experts.N.{gate,up,down}_proj for every MoE family
 * (transformers 5 names Mixtral's experts so too; Mixtral checkpoints on disk still say
 * block_sparse_moe.experts.N.w1/w3/w2), Qwen2-MoE's shared expert and its gate, and no lm_head
 * when embeddings are tied. */
#include "wsync_hf_config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"

static int64_t wsync_hf_int(const json_t *root, const char *key, int64_t dflt)
{
    const json_t *v = json_object_get(root, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

int wsync_hf_read(const json_t *root, wsync_hf_dims_t *d, char *why, size_t len)
{
    static const char *const known[] = {"llama", "mistral",   "qwen2",  "qwen2_moe",
                                        "qwen3", "qwen3_moe", "mixtral"};
    memset(d, 0, sizeof(*d));
    const char *type = json_string_value(json_object_get(root, "model_type"));
    size_t k = 0;
    while (type != NULL && k < sizeof(known) / sizeof(known[0]) && strcmp(type, known[k]) != 0)
        k++;
    if (type == NULL || k == sizeof(known) / sizeof(known[0])) {
        snprintf(why, len,
                 "config model_type \"%.40s\" is not one wsync derives tensors for (llama, "
                 "mistral, qwen2, qwen2_moe, qwen3, qwen3_moe, mixtral)",
                 type != NULL ? type : "(missing)");
        return -1;
    }
    snprintf(d->model_type, sizeof(d->model_type), "%s", type);
    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));
    if (dt == NULL)
        dt = json_string_value(json_object_get(root, "dtype"));
    d->dtype = dt != NULL ? wsync_dtype_from_name(dt) : WSYNC_DTYPE_BF16;
    if (d->dtype == WSYNC_DTYPE_INVALID) {
        snprintf(why, len, "config dtype \"%.40s\" is not a dtype wsync knows", dt);
        return -1;
    }
    d->hidden = wsync_hf_int(root, "hidden_size", 0);
    d->layers = wsync_hf_int(root, "num_hidden_layers", 0);
    d->heads = wsync_hf_int(root, "num_attention_heads", 0);
    d->kv_heads = wsync_hf_int(root, "num_key_value_heads", d->heads);
    d->head_dim = wsync_hf_int(root, "head_dim", d->heads > 0 ? d->hidden / d->heads : 0);
    d->intermediate = wsync_hf_int(root, "intermediate_size", 0);
    d->vocab = wsync_hf_int(root, "vocab_size", 0);
    const json_t *tie = json_object_get(root, "tie_word_embeddings");
    d->tied = json_is_true(tie);
    d->mixtral = strcmp(type, "mixtral") == 0;
    d->qk_norm = strncmp(type, "qwen3", 5) == 0;
    /* Qwen2 always biases q, k and v; Llama-style attention_bias biases all four */
    d->o_bias =
        !strncmp(type, "qwen2", 5) ? 0 : json_is_true(json_object_get(root, "attention_bias"));
    d->qkv_bias = strncmp(type, "qwen2", 5) == 0 || d->o_bias;
    /* the expert count is num_experts (Qwen's configs on the Hub) or num_local_experts
     * (Mixtral's, and what transformers 5 writes for Qwen3-MoE) */
    const int64_t experts =
        wsync_hf_int(root, "num_experts", wsync_hf_int(root, "num_local_experts", 0));
    if (d->mixtral) {
        d->experts = experts;
        d->moe_intermediate = d->intermediate;
    } else if (strstr(type, "_moe") != NULL) {
        d->experts = experts;
        d->moe_intermediate = wsync_hf_int(root, "moe_intermediate_size", 0);
        d->shared_intermediate = wsync_hf_int(root, "shared_expert_intermediate_size", 0);
        d->sparse_step = wsync_hf_int(root, "decoder_sparse_step", 1);
        d->mlp_only_layers = json_object_get(root, "mlp_only_layers");
    }
    const struct {
        const char *key;
        int64_t v;
    } need[] = {{"hidden_size", d->hidden},
                {"num_hidden_layers", d->layers},
                {"num_attention_heads", d->heads},
                {"num_key_value_heads", d->kv_heads},
                {"head_dim", d->head_dim},
                {"intermediate_size", d->intermediate},
                {"vocab_size", d->vocab},
                {"num_experts (or num_local_experts)",
                 strstr(type, "moe") != NULL || d->mixtral ? d->experts : 1},
                {"moe_intermediate_size", strstr(type, "_moe") != NULL ? d->moe_intermediate : 1}};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
        if (need[i].v <= 0) {
            snprintf(why, len, "config %s: %s is missing or not a positive integer", type,
                     need[i].key);
            return -1;
        }
    if (d->sparse_step <= 0)
        d->sparse_step = 1;
    return 0;
}

typedef struct wsync_hf_list {
    wsync_model_t *m;
    size_t cap;
    wsync_dtype_t dtype;
    int failed;
} wsync_hf_list_t;

static void wsync_hf_add(wsync_hf_list_t *b, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void wsync_hf_add(wsync_hf_list_t *b, int64_t d0, int64_t d1, const char *fmt, ...)
{
    wsync_model_t *m = b->m;
    if (b->failed)
        return;
    if (m->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 512;
        void *p = realloc(m->tensors, cap * sizeof(*m->tensors));
        if (p == NULL) {
            b->failed = 1;
            return;
        }
        m->tensors = p;
        b->cap = cap;
    }
    wsync_model_tensor_t *t = &m->tensors[m->n++];
    memset(t, 0, sizeof(*t));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->dtype = b->dtype;
    t->shape[0] = d0;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[1] = d1 > 0 ? d1 : 0;
    t->nbytes = wsync_dtype_size(b->dtype) * (uint64_t)d0 * (uint64_t)(d1 > 0 ? d1 : 1);
}

static int wsync_hf_sparse(const wsync_hf_dims_t *d, int64_t l)
{
    if (d->mixtral)
        return 1;
    if (d->experts == 0)
        return 0;
    for (size_t i = 0; i < json_array_size(d->mlp_only_layers); i++)
        if (json_integer_value(json_array_get(d->mlp_only_layers, i)) == l)
            return 0;
    return (l + 1) % d->sparse_step == 0;
}

int wsync_hf_tensors(const wsync_hf_dims_t *d, wsync_model_t *m)
{
    wsync_hf_list_t b = {.m = m, .dtype = d->dtype};
    const int64_t H = d->hidden, q = d->heads * d->head_dim, kv = d->kv_heads * d->head_dim;
    wsync_hf_add(&b, d->vocab, H, "model.embed_tokens.weight");
    for (int64_t l = 0; l < d->layers; l++) {
        const unsigned u = (unsigned)l;
        wsync_hf_add(&b, q, H, "model.layers.%u.self_attn.q_proj.weight", u);
        if (d->qkv_bias)
            wsync_hf_add(&b, q, 0, "model.layers.%u.self_attn.q_proj.bias", u);
        wsync_hf_add(&b, kv, H, "model.layers.%u.self_attn.k_proj.weight", u);
        if (d->qkv_bias)
            wsync_hf_add(&b, kv, 0, "model.layers.%u.self_attn.k_proj.bias", u);
        wsync_hf_add(&b, kv, H, "model.layers.%u.self_attn.v_proj.weight", u);
        if (d->qkv_bias)
            wsync_hf_add(&b, kv, 0, "model.layers.%u.self_attn.v_proj.bias", u);
        wsync_hf_add(&b, H, q, "model.layers.%u.self_attn.o_proj.weight", u);
        if (d->o_bias)
            wsync_hf_add(&b, H, 0, "model.layers.%u.self_attn.o_proj.bias", u);
        if (d->qk_norm) {
            wsync_hf_add(&b, d->head_dim, 0, "model.layers.%u.self_attn.q_norm.weight", u);
            wsync_hf_add(&b, d->head_dim, 0, "model.layers.%u.self_attn.k_norm.weight", u);
        }
        wsync_hf_add(&b, H, 0, "model.layers.%u.input_layernorm.weight", u);
        wsync_hf_add(&b, H, 0, "model.layers.%u.post_attention_layernorm.weight", u);
        if (!wsync_hf_sparse(d, l)) {
            wsync_hf_add(&b, d->intermediate, H, "model.layers.%u.mlp.gate_proj.weight", u);
            wsync_hf_add(&b, d->intermediate, H, "model.layers.%u.mlp.up_proj.weight", u);
            wsync_hf_add(&b, H, d->intermediate, "model.layers.%u.mlp.down_proj.weight", u);
            continue;
        }
        const int64_t I = d->moe_intermediate;
        wsync_hf_add(&b, d->experts, H, "model.layers.%u.mlp.gate.weight", u);
        for (unsigned e = 0; e < (unsigned)d->experts; e++) {
            wsync_hf_add(&b, I, H, "model.layers.%u.mlp.experts.%u.gate_proj.weight", u, e);
            wsync_hf_add(&b, I, H, "model.layers.%u.mlp.experts.%u.up_proj.weight", u, e);
            wsync_hf_add(&b, H, I, "model.layers.%u.mlp.experts.%u.down_proj.weight", u, e);
        }
        if (d->shared_intermediate > 0) {
            const int64_t S = d->shared_intermediate;
            wsync_hf_add(&b, S, H, "model.layers.%u.mlp.shared_expert.gate_proj.weight", u);
            wsync_hf_add(&b, S, H, "model.layers.%u.mlp.shared_expert.up_proj.weight", u);
            wsync_hf_add(&b, H, S, "model.layers.%u.mlp.shared_expert.down_proj.weight", u);
            wsync_hf_add(&b, 1, H, "model.layers.%u.mlp.shared_expert_gate.weight", u);
        }
    }
    wsync_hf_add(&b, H, 0, "model.norm.weight");
    if (!d->tied)
        wsync_hf_add(&b, d->vocab, H, "lm_head.weight");
    return b.failed ? -1 : 0;
}
