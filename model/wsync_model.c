/* The built-in layouts and HF configs as tensor lists; see wsync_model.h. */
#include "wsync_model.h"

#include <jansson.h>

#include "wsync_adapter_convert.h"
#include "wsync_checkpoint.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"
#include "wsync_hf_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

uint64_t wsync_model_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

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

static int wsync_model_index(wsync_model_t *m)
{
    m->nslots = 1;
    while (m->nslots < 2 * m->n)
        m->nslots <<= 1;
    m->slots = calloc(m->nslots, sizeof(*m->slots));
    if (m->slots == NULL)
        return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t s = wsync_model_hash(m->tensors[i].name) & (m->nslots - 1);
        while (m->slots[s] != 0)
            s = (s + 1) & (m->nslots - 1);
        m->slots[s] = i + 1;
    }
    return 0;
}

/* Offsets in the packed image, totals and the name index of m's tensor list. */
static int wsync_model_finish(wsync_model_t *m)
{
    uint64_t off = 0;
    if (wsync_model_index(m) != 0)
        return -1;
    for (size_t i = 0; i < m->n; i++) {
        wsync_model_tensor_t *t = &m->tensors[i];
        off = (off + WSYNC_MODEL_ALIGN - 1) / WSYNC_MODEL_ALIGN * WSYNC_MODEL_ALIGN;
        t->offset = off;
        off += t->nbytes;
        m->payload_bytes += t->nbytes;
        if (t->nbytes > m->max_nbytes)
            m->max_nbytes = t->nbytes;
    }
    m->packed_bytes = off;
    return 0;
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

/* The tensor list and bytes of a model directory's checkpoint. */
static int wsync_model_from_dir(wsync_model_t *m, const char *dir, wsync_dtype_t dtype, char *why,
                                size_t len)
{
    wsync_checkpoint_t *c = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_checkpoint_open(dir, &c, &err) != WSYNC_OK) {
        snprintf(why, len, "%s", err.message);
        return -1;
    }
    const wsync_model_t *src = wsync_checkpoint_model(c);
    snprintf(m->layout, sizeof(m->layout), "%s", src->layout);
    m->tensors = malloc((src->n ? src->n : 1) * sizeof(*m->tensors));
    if (m->tensors == NULL) {
        wsync_checkpoint_close(c);
        snprintf(why, len, "out of memory for %zu tensors", src->n);
        return -1;
    }
    m->n = src->n;
    for (size_t i = 0; i < src->n; i++) {
        const wsync_ckpt_tensor_t *t = wsync_checkpoint_tensor(c, i);
        m->tensors[i] = src->tensors[i];
        m->tensors[i].data = t->data;
        m->tensors[i].file_dtype = t->file_dtype;
        if (dtype != WSYNC_DTYPE_INVALID && wsync_convert_is_float(t->file_dtype)) {
            m->tensors[i].dtype = dtype; /* converted on the way (wsync_model_fill) */
            m->tensors[i].nbytes =
                t->file_nbytes / wsync_dtype_size(t->file_dtype) * wsync_dtype_size(dtype);
        }
    }
    m->checkpoint = c;
    if (wsync_model_finish(m) != 0) {
        wsync_model_free(m);
        snprintf(why, len, "out of memory indexing %zu tensors", src->n);
        return -1;
    }
    return 0;
}

int wsync_model_build(wsync_model_t *m, const wsync_model_config_t *cfg, char *why, size_t len)
{
    memset(m, 0, sizeof(*m));
    if (cfg->model_dir != NULL)
        return wsync_model_from_dir(m, cfg->model_dir, cfg->dtype, why, len);
    if (cfg->config_json != NULL)
        return wsync_model_from_config(m, cfg->config_json, strlen(cfg->config_json), why, len);
    if (cfg->scale < 1) {
        snprintf(why, len, "scale %u must be >= 1", cfg->scale);
        return -1;
    }
    const char *json = strcmp(cfg->layout, "dense") == 0 ? wsync_model_dense_config
                       : strcmp(cfg->layout, "moe") == 0 ? wsync_model_moe_config
                                                         : NULL;
    if (json == NULL) {
        snprintf(why, len, "unknown layout '%s'; use dense or moe", cfg->layout);
        return -1;
    }
    return wsync_model_make(m, json, strlen(json), cfg->scale, cfg->layers, cfg->layout, why, len);
}

void wsync_model_free(wsync_model_t *m)
{
    wsync_checkpoint_close(m->checkpoint);
    free(m->tensors);
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

long wsync_model_find(const wsync_model_t *m, const char *name)
{
    size_t s;

    if (m->nslots == 0 || name == NULL)
        return -1;
    s = wsync_model_hash(name) & (m->nslots - 1);
    while (m->slots[s] != 0) {
        if (strcmp(m->tensors[m->slots[s] - 1].name, name) == 0)
            return (long)(m->slots[s] - 1);
        s = (s + 1) & (m->nslots - 1);
    }
    return -1;
}

/* Word i of (name, version) is the splitmix64 sequence seeded by both: every tensor and every
 * version differ, and a moved or stale word is visible. */
void wsync_model_fill(const wsync_model_tensor_t *t, uint64_t version, void *dst)
{
    if (t->data != NULL) { /* a checkpoint's bytes */
        const size_t n = t->nbytes / wsync_dtype_size(t->dtype);
        if (t->file_dtype == t->dtype)
            memcpy(dst, t->data, t->nbytes);
        else
            wsync_convert_row(dst, t->dtype, t->data, t->file_dtype, n, 1.0);
        return;
    }
    uint64_t seed = wsync_mix64(wsync_model_hash(t->name) ^ (version * WSYNC64_GOLDEN));
    unsigned char *p = dst;
    uint64_t nwords = t->nbytes / 8;
    uint64_t i;

    for (i = 0; i < nwords; i++) {
        uint64_t w = wsync_mix64(seed + i * WSYNC64_GOLDEN);
        memcpy(p + 8 * i, &w, 8);
    }
    if (t->nbytes % 8 != 0) {
        uint64_t w = wsync_mix64(seed + i * WSYNC64_GOLDEN);
        memcpy(p + 8 * i, &w, t->nbytes % 8);
    }
}
