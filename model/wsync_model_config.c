/* Tensor lists from configs; see wsync_model_config.h. */
#include "wsync_model_config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_hf_config.h"

/* The built-in layouts are configs of the model layer: the public configs of Qwen3-8B and
 * Qwen3-30B-A3B, shrunk by `scale` before the tensor list is derived from them. */
static const char wsync_model_dense_config[] =
    "{\"model_type\":\"qwen3\",\"hidden_size\":4096,\"num_hidden_layers\":36,"
    "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":128,"
    "\"intermediate_size\":12288,\"vocab_size\":151936,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\"}";
static const char wsync_model_moe_config[] =
    "{\"model_type\":\"qwen3_moe\",\"hidden_size\":2048,\"num_hidden_layers\":48,"
    "\"num_attention_heads\":32,\"num_key_value_heads\":4,\"head_dim\":128,"
    "\"intermediate_size\":6144,\"moe_intermediate_size\":768,\"num_experts\":128,"
    "\"num_experts_per_tok\":8,\"decoder_sparse_step\":1,\"mlp_only_layers\":[],"
    "\"vocab_size\":151936,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}";

/* Large dims shrink with the scale; small ones (head_dim, expert counts) are structure. */
static int64_t wsync_model_dim(int64_t d, unsigned scale)
{
    if (d < 512)
        return d;
    int64_t s = d / (int64_t)scale;
    return s < 1 ? 1 : s;
}

/* A built-in layout's dims at `scale`: hidden, intermediate and vocab sizes of 512 or more
 * divided; attention keeps whole heads (at least one kv head, q heads a multiple of them). */
static void wsync_model_shrink(wsync_hf_dims_t *d, unsigned scale)
{
    int64_t kv = d->kv_heads / (int64_t)scale, q = d->heads / (int64_t)scale;
    if (kv < 1)
        kv = 1;
    q = q / kv * kv;
    d->heads = q < kv ? kv : q;
    d->kv_heads = kv;
    d->hidden = wsync_model_dim(d->hidden, scale);
    d->intermediate = wsync_model_dim(d->intermediate, scale);
    d->moe_intermediate = wsync_model_dim(d->moe_intermediate, scale);
    d->vocab = wsync_model_dim(d->vocab, scale);
}

static int wsync_model_make(wsync_model_t *m, const char *json, size_t json_len, unsigned scale,
                            unsigned layers, const char *label, char *why, size_t len)
{
    memset(m, 0, sizeof(*m));
    json_error_t jerr;
    json_t *root = json_loadb(json, json_len, 0, &jerr);
    if (root == NULL || !json_is_object(root)) {
        snprintf(why, len, "config is not a JSON object: %s (line %d)",
                 root ? "another value" : jerr.text, root ? 0 : jerr.line);
        json_decref(root);
        return -1;
    }
    wsync_hf_dims_t d;
    int rc = wsync_hf_read(root, &d, why, len);
    if (rc == 0) {
        if (scale > 1)
            wsync_model_shrink(&d, scale);
        if (layers > 0)
            d.layers = layers;
        snprintf(m->layout, sizeof(m->layout), "%s", label ? label : d.model_type);
        rc = wsync_hf_tensors(&d, m) == 0 && wsync_model_finish(m) == 0 ? 0 : -1;
        if (rc != 0)
            snprintf(why, len, "out of memory building the %s tensor list", d.model_type);
    }
    json_decref(root);
    if (rc != 0)
        wsync_model_free(m);
    return rc;
}

int wsync_model_from_config(wsync_model_t *m, const char *json, size_t json_len, char *why,
                            size_t len)
{
    return wsync_model_make(m, json, json_len, 1, 0, NULL, why, len);
}

int wsync_model_from_layout(wsync_model_t *m, const char *layout, unsigned scale, unsigned layers,
                            char *why, size_t len)
{
    memset(m, 0, sizeof(*m));
    if (scale < 1) {
        snprintf(why, len, "scale %u must be >= 1", scale);
        return -1;
    }
    const char *json = strcmp(layout, "dense") == 0 ? wsync_model_dense_config
                       : strcmp(layout, "moe") == 0 ? wsync_model_moe_config
                                                    : NULL;
    if (json == NULL) {
        snprintf(why, len, "unknown layout '%s'; use dense or moe", layout);
        return -1;
    }
    return wsync_model_make(m, json, strlen(json), scale, layers, layout, why, len);
}
