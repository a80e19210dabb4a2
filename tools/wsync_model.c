/* Synthetic layouts; see wsync_model.h. */
#include "wsync_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WSYNC_MODEL_GOLDEN 0x9E3779B97F4A7C15ull

typedef struct wsync_model_builder {
    wsync_model_t *m;
    size_t cap;
    unsigned scale;
    int failed;
} wsync_model_builder_t;

static uint64_t wsync_model_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t wsync_model_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Large dims shrink with the scale; small ones (head_dim 128, expert count) are structure. */
static int64_t wsync_model_dim(const wsync_model_builder_t *b, int64_t d)
{
    int64_t s;
    if (d < 512)
        return d;
    s = d / (int64_t)b->scale;
    return s < 1 ? 1 : s;
}

#define WSYNC_MODEL_HEAD_DIM 128

/* Attention widths stay whole heads of WSYNC_MODEL_HEAD_DIM at any scale: the head counts
 * shrink (at least one kv head, q heads a multiple of the kv heads), never head_dim. */
static void wsync_model_heads(const wsync_model_builder_t *b, int64_t q_heads, int64_t kv_heads,
                              int64_t *q_out, int64_t *kv_out)
{
    int64_t kv = kv_heads / (int64_t)b->scale, q = q_heads / (int64_t)b->scale;
    if (kv < 1)
        kv = 1;
    q = q / kv * kv;
    if (q < kv)
        q = kv;
    *q_out = q * WSYNC_MODEL_HEAD_DIM;
    *kv_out = kv * WSYNC_MODEL_HEAD_DIM;
}

/* Add a tensor; dims are scaled with wsync_model_dim unless `exact` (attention widths, already
 * whole heads). */
static void wsync_model_add_dims(wsync_model_builder_t *b, const char *name, int64_t d0, int64_t d1,
                                 int exact0, int exact1)
{
    wsync_model_t *m = b->m;
    wsync_model_tensor_t *t;

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
    t = &m->tensors[m->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->dtype = WSYNC_DTYPE_BF16;
    t->shape[0] = exact0 ? d0 : wsync_model_dim(b, d0);
    t->ndim = 1;
    if (d1 > 0) {
        t->shape[1] = exact1 ? d1 : wsync_model_dim(b, d1);
        t->ndim = 2;
    }
    t->nbytes = 2u * (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
}

static void wsync_model_add(wsync_model_builder_t *b, const char *name, int64_t d0, int64_t d1)
{
    wsync_model_add_dims(b, name, d0, d1, 0, 0);
}

static void wsync_model_addx(wsync_model_builder_t *b, int64_t d0, int64_t d1, int exact0,
                             int exact1, const char *fmt, unsigned a, unsigned e)
    __attribute__((format(printf, 6, 0)));

static void wsync_model_addx(wsync_model_builder_t *b, int64_t d0, int64_t d1, int exact0,
                             int exact1, const char *fmt, unsigned a, unsigned e)
{
    char name[WSYNC_MODEL_NAME_MAX];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(name, sizeof(name), fmt, a, e);
#pragma GCC diagnostic pop
    wsync_model_add_dims(b, name, d0, d1, exact0, exact1);
}

static void wsync_model_addf(wsync_model_builder_t *b, int64_t d0, int64_t d1, const char *fmt,
                             unsigned a, unsigned e) __attribute__((format(printf, 4, 0)));

static void wsync_model_addf(wsync_model_builder_t *b, int64_t d0, int64_t d1, const char *fmt,
                             unsigned a, unsigned e)
{
    wsync_model_addx(b, d0, d1, 0, 0, fmt, a, e);
}

/* Attention block shared by both layouts: q_heads / kv_heads heads of 128 before scaling. */
static void wsync_model_attention(wsync_model_builder_t *b, unsigned l, int64_t hidden,
                                  int64_t q_heads, int64_t kv_heads)
{
    int64_t q_out, kv_out;
    wsync_model_heads(b, q_heads, kv_heads, &q_out, &kv_out);
    wsync_model_addx(b, q_out, hidden, 1, 0, "model.layers.%u.self_attn.q_proj.weight", l, 0);
    wsync_model_addx(b, kv_out, hidden, 1, 0, "model.layers.%u.self_attn.k_proj.weight", l, 0);
    wsync_model_addx(b, kv_out, hidden, 1, 0, "model.layers.%u.self_attn.v_proj.weight", l, 0);
    wsync_model_addx(b, hidden, q_out, 0, 1, "model.layers.%u.self_attn.o_proj.weight", l, 0);
    wsync_model_addf(b, WSYNC_MODEL_HEAD_DIM, 0, "model.layers.%u.self_attn.q_norm.weight", l, 0);
    wsync_model_addf(b, WSYNC_MODEL_HEAD_DIM, 0, "model.layers.%u.self_attn.k_norm.weight", l, 0);
    wsync_model_addf(b, hidden, 0, "model.layers.%u.input_layernorm.weight", l, 0);
    wsync_model_addf(b, hidden, 0, "model.layers.%u.post_attention_layernorm.weight", l, 0);
}

/* Qwen3-8B: hidden 4096, 32 q heads / 8 kv heads of 128, intermediate 12288, vocab 151936. */
static void wsync_model_dense(wsync_model_builder_t *b, unsigned layers)
{
    wsync_model_add(b, "model.embed_tokens.weight", 151936, 4096);
    for (unsigned l = 0; l < layers; l++) {
        wsync_model_attention(b, l, 4096, 32, 8);
        wsync_model_addf(b, 12288, 4096, "model.layers.%u.mlp.gate_proj.weight", l, 0);
        wsync_model_addf(b, 12288, 4096, "model.layers.%u.mlp.up_proj.weight", l, 0);
        wsync_model_addf(b, 4096, 12288, "model.layers.%u.mlp.down_proj.weight", l, 0);
    }
    wsync_model_add(b, "model.norm.weight", 4096, 0);
    wsync_model_add(b, "lm_head.weight", 151936, 4096);
}

/* Qwen3-30B-A3B: hidden 2048, 32 q heads / 4 kv heads of 128, 128 experts of intermediate 768. */
static void wsync_model_moe(wsync_model_builder_t *b, unsigned layers)
{
    wsync_model_add(b, "model.embed_tokens.weight", 151936, 2048);
    for (unsigned l = 0; l < layers; l++) {
        wsync_model_attention(b, l, 2048, 32, 4);
        wsync_model_addf(b, 128, 2048, "model.layers.%u.mlp.gate.weight", l, 0);
        for (unsigned e = 0; e < 128; e++) {
            wsync_model_addf(b, 768, 2048, "model.layers.%u.mlp.experts.%u.gate_proj.weight", l, e);
            wsync_model_addf(b, 768, 2048, "model.layers.%u.mlp.experts.%u.up_proj.weight", l, e);
            wsync_model_addf(b, 2048, 768, "model.layers.%u.mlp.experts.%u.down_proj.weight", l, e);
        }
    }
    wsync_model_add(b, "model.norm.weight", 2048, 0);
    wsync_model_add(b, "lm_head.weight", 151936, 2048);
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

int wsync_model_build(wsync_model_t *m, const wsync_model_config_t *cfg, char *why, size_t len)
{
    wsync_model_builder_t b = {.m = m, .scale = cfg->scale};
    uint64_t off = 0;

    memset(m, 0, sizeof(*m));
    if (cfg->scale < 1) {
        snprintf(why, len, "scale %u must be >= 1", cfg->scale);
        return -1;
    }
    if (strcmp(cfg->layout, "dense") == 0)
        wsync_model_dense(&b, cfg->layers ? cfg->layers : 36);
    else if (strcmp(cfg->layout, "moe") == 0)
        wsync_model_moe(&b, cfg->layers ? cfg->layers : 48);
    else {
        snprintf(why, len, "unknown layout '%s'; use dense or moe", cfg->layout);
        return -1;
    }
    snprintf(m->layout, sizeof(m->layout), "%s", cfg->layout);
    if (b.failed || wsync_model_index(m) != 0) {
        snprintf(why, len, "out of memory building the '%s' layout", cfg->layout);
        wsync_model_free(m);
        return -1;
    }
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

void wsync_model_free(wsync_model_t *m)
{
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
    uint64_t seed = wsync_model_mix(wsync_model_hash(t->name) ^ (version * WSYNC_MODEL_GOLDEN));
    unsigned char *p = dst;
    uint64_t nwords = t->nbytes / 8;
    uint64_t i;

    for (i = 0; i < nwords; i++) {
        uint64_t w = wsync_model_mix(seed + i * WSYNC_MODEL_GOLDEN);
        memcpy(p + 8 * i, &w, 8);
    }
    if (t->nbytes % 8 != 0) {
        uint64_t w = wsync_model_mix(seed + i * WSYNC_MODEL_GOLDEN);
        memcpy(p + 8 * i, &w, t->nbytes % 8);
    }
}
