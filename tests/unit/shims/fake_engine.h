/* A tiny engine for the shim unit tests: dims hidden 8, 4 heads / 2 kv heads of 2, intermediate
 * 8, 2 experts of intermediate 4, vocab 8; parameters in engine layout for (rank, size) set by
 * fake_engine_init. Header-only; each test includes it once. */
#ifndef WSYNC_FAKE_ENGINE_H
#define WSYNC_FAKE_ENGINE_H

#include <stdint.h>
#include <string.h>

#include "wsync_registry.h"

typedef struct fake_param {
    const char *name;
    uint32_t ndim;
    int64_t shape[3];
    uint8_t *mem;
} fake_param_t;

typedef struct fake_engine {
    uint32_t rank, size;
    wsync_dtype_t dtype;
    fake_param_t params[8];
    size_t n;
    uint8_t arena[4096];
} fake_engine_t;

static int64_t fake_elems(const fake_param_t *p)
{
    int64_t n = 1;
    for (uint32_t i = 0; i < p->ndim; i++)
        n *= p->shape[i];
    return n;
}

static void fake_engine_init(fake_engine_t *e, uint32_t rank, uint32_t size)
{
    int64_t n = size, kvpr = 2 >= n ? 2 / n : 1;
    const fake_param_t p[] = {
        {"model.layers.0.self_attn.qkv_proj.weight", 2, {(4 / n + 2 * kvpr) * 2, 8, 0}, NULL},
        {"model.layers.0.self_attn.o_proj.weight", 2, {8, 8 / n, 0}, NULL},
        {"model.layers.0.mlp.gate_up_proj.weight", 2, {2 * 8 / n, 8, 0}, NULL},
        {"model.layers.0.mlp.experts.w13_weight", 3, {2, 2 * 4 / n, 8}, NULL},
        {"model.layers.0.mlp.experts.w2_weight", 3, {2, 8, 4 / n}, NULL},
        {"model.embed_tokens.weight", 2, {8 / n, 8, 0}, NULL},
        {"model.layers.0.input_layernorm.weight", 1, {8, 0, 0}, NULL},
        {"model.norm.weight", 1, {8, 0, 0}, NULL},
    };
    size_t off = 0;

    memset(e, 0, sizeof(*e));
    e->rank = rank;
    e->size = size;
    e->dtype = WSYNC_DTYPE_BF16;
    e->n = sizeof(p) / sizeof(p[0]);
    for (size_t i = 0; i < e->n; i++) {
        e->params[i] = p[i];
        e->params[i].mem = e->arena + off;
        off += (size_t)fake_elems(&p[i]) * 2;
    }
}

static int fake_param_cb(void *user, const char *name, wsync_param_info_t *out)
{
    fake_engine_t *e = user;
    for (size_t i = 0; i < e->n; i++) {
        if (strcmp(e->params[i].name, name) != 0)
            continue;
        memset(out, 0, sizeof(*out));
        out->ptr = e->params[i].mem;
        out->dtype = e->dtype;
        out->ndim = e->params[i].ndim;
        memcpy(out->shape, e->params[i].shape, sizeof(e->params[i].shape));
        return 0;
    }
    return -1;
}

static void fake_tp_cb(void *user, uint32_t *rank, uint32_t *size)
{
    fake_engine_t *e = user;
    *rank = e->rank;
    *size = e->size;
}

static void fake_dims_cb(void *user, wsync_model_dims_t *d)
{
    (void)user;
    *d = (wsync_model_dims_t){.hidden = 8,
                              .heads = 4,
                              .kv_heads = 2,
                              .head_dim = 2,
                              .intermediate = 8,
                              .experts = 2,
                              .moe_intermediate = 4,
                              .vocab = 8};
}

static uint8_t *fake_mem(fake_engine_t *e, const char *name)
{
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->params[i].name, name) == 0)
            return e->params[i].mem;
    return NULL;
}

#endif
