/* Reference engine LoRA slots; see wsync_ref_lora.h. The expected bytes below share nothing with
 * plugin/adapters/wsync_adapter_plan.c: they are the independent check. */
#include "wsync_ref_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_digest.h"

/* One HF module a target receives: its path, B row offset and rows. */
typedef struct wsync_ref_lora_part {
    char module[WSYNC_REF_NAME_MAX];
    int64_t out_offset, out;
} wsync_ref_lora_part_t;

static void *wsync_ref_lora_alloc(wsync_ref_lora_t *r, size_t bytes)
{
    return r->mem.alloc != NULL ? r->mem.alloc(r->mem.user, bytes) : calloc(1, bytes);
}

static void wsync_ref_lora_release(wsync_ref_lora_t *r, void *p)
{
    if (p != NULL && r->mem.free != NULL)
        r->mem.free(r->mem.user, p);
    else
        free(p);
}

static int wsync_ref_lora_read(wsync_ref_lora_t *r, void *dst, const void *src, size_t bytes)
{
    if (r->mem.read != NULL)
        return r->mem.read(r->mem.user, dst, src, bytes);
    memcpy(dst, src, bytes);
    return 0;
}

static unsigned wsync_ref_lora_layers(const wsync_ref_layout_t *l)
{
    char name[WSYNC_REF_NAME_MAX];
    unsigned n = 0;
    for (;; n++) {
        snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight", n);
        if (wsync_model_find(&l->model, name) < 0)
            return n;
    }
}

int wsync_ref_lora_build(wsync_ref_lora_t *r, const wsync_ref_layout_t *l,
                         const wsync_ref_lora_mem_t *mem, char *why, size_t len)
{
    const wsync_model_dims_t *d = &l->dims;
    int64_t q = d->heads * d->head_dim, kv = d->kv_heads * d->head_dim;
    unsigned layers = wsync_ref_lora_layers(l);

    memset(r, 0, sizeof(*r));
    if (mem != NULL)
        r->mem = *mem;
    if (d->experts != 0 || l->size != 1 || layers == 0)
        return 0; /* LoRA slots for the dense layout at TP size 1 only */
    r->qkv_parts[0] = (wsync_adapter_part_v1_t){"q_proj", 0, q};
    r->qkv_parts[1] = (wsync_adapter_part_v1_t){"k_proj", q, kv};
    r->qkv_parts[2] = (wsync_adapter_part_v1_t){"v_proj", q + kv, kv};
    r->gate_up_parts[0] = (wsync_adapter_part_v1_t){"gate_proj", 0, d->intermediate};
    r->gate_up_parts[1] = (wsync_adapter_part_v1_t){"up_proj", d->intermediate, d->intermediate};
    r->n_targets = 4u * layers;
    r->names = calloc(r->n_targets, sizeof(*r->names));
    if (r->names == NULL)
        goto oom;
    for (size_t s = 0; s < WSYNC_REF_LORA_SLOTS; s++) {
        wsync_ref_lora_slot_t *slot = &r->slots[s];
        slot->targets = calloc(r->n_targets, sizeof(*slot->targets));
        if (slot->targets == NULL)
            goto oom;
        r->n_slots++;
        for (unsigned li = 0; li < layers; li++) {
            static const char *const fmt[4] = {
                "model.layers.%u.self_attn.qkv_proj", "model.layers.%u.self_attn.o_proj",
                "model.layers.%u.mlp.gate_up_proj", "model.layers.%u.mlp.down_proj"};
            const int64_t in[4] = {d->hidden, q, d->hidden, d->intermediate};
            const int64_t out[4] = {q + 2 * kv, d->hidden, 2 * d->intermediate, d->hidden};
            for (int k = 0; k < 4; k++) {
                size_t ti = 4u * li + (size_t)k;
                wsync_adapter_target_t *t = &slot->targets[ti];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
                snprintf(r->names[ti], sizeof(r->names[ti]), fmt[k], li);
#pragma GCC diagnostic pop
                t->struct_size = sizeof(*t);
                t->module = r->names[ti];
                t->dtype = WSYNC_DTYPE_BF16;
                t->in_features = in[k];
                t->out_features = out[k];
                t->n_parts = k == 0 ? 3 : k == 2 ? 2 : 0;
                t->parts = k == 0 ? r->qkv_parts : k == 2 ? r->gate_up_parts : NULL;
                for (int c = 0; c < 2; c++) {
                    t->lora_a[c] =
                        wsync_ref_lora_alloc(r, 2u * WSYNC_REF_LORA_MAX_RANK * (size_t)in[k]);
                    t->lora_b[c] =
                        wsync_ref_lora_alloc(r, 2u * WSYNC_REF_LORA_MAX_RANK * (size_t)out[k]);
                    if (t->lora_a[c] == NULL || t->lora_b[c] == NULL)
                        goto oom;
                }
            }
        }
        slot->slot = (wsync_adapter_slot_t){.struct_size = sizeof(slot->slot),
                                            .adapter_name = slot->name,
                                            .max_rank = WSYNC_REF_LORA_MAX_RANK,
                                            .n_targets = r->n_targets,
                                            .targets = slot->targets,
                                            .active = &slot->active};
    }
    return 0;
oom:
    snprintf(why, len, "out of memory for %zu LoRA targets", r->n_targets);
    wsync_ref_lora_free(r);
    return -1;
}

void wsync_ref_lora_free(wsync_ref_lora_t *r)
{
    for (size_t s = 0; s < r->n_slots; s++) {
        for (size_t t = 0; r->slots[s].targets != NULL && t < r->n_targets; t++)
            for (int c = 0; c < 2; c++) {
                wsync_ref_lora_release(r, r->slots[s].targets[t].lora_a[c]);
                wsync_ref_lora_release(r, r->slots[s].targets[t].lora_b[c]);
            }
        free(r->slots[s].targets);
    }
    free(r->names);
    memset(r, 0, sizeof(*r));
}

wsync_ref_lora_slot_t *wsync_ref_lora_find(wsync_ref_lora_t *r, const char *name)
{
    for (size_t s = 0; name != NULL && s < r->n_slots; s++)
        if (strcmp(r->slots[s].name, name) == 0)
            return &r->slots[s];
    return NULL;
}

wsync_adapter_slot_t *wsync_ref_lora_slot(void *user, const char *name, int assign)
{
    wsync_ref_lora_t *r = user;
    wsync_ref_lora_slot_t *s = wsync_ref_lora_find(r, name);
    if (s != NULL)
        return &s->slot;
    for (size_t i = 0; assign && name != NULL && i < r->n_slots; i++)
        if (r->slots[i].name[0] == '\0')
            return &r->slots[i].slot;
    return NULL;
}

void wsync_ref_lora_loaded(void *user, const char *name, wsync_adapter_slot_t *slot)
{
    wsync_ref_lora_t *r = user;
    for (size_t i = 0; i < r->n_slots; i++)
        if (&r->slots[i].slot == slot)
            snprintf(r->slots[i].name, sizeof(r->slots[i].name), "%s", name);
}

void wsync_ref_lora_unloaded(void *user, const char *name)
{
    wsync_ref_lora_slot_t *s = wsync_ref_lora_find(user, name);
    if (s != NULL)
        s->name[0] = '\0';
}

void wsync_ref_lora_reset(void *user, const char *name)
{
    wsync_ref_lora_t *r = user;
    r->prefix_resets++;
    snprintf(r->last_reset, sizeof(r->last_reset), "%s", name ? name : "");
}

/* The HF modules target t receives, in stacking order. */
static size_t wsync_ref_lora_parts(const wsync_adapter_target_t *t, wsync_ref_lora_part_t *p)
{
    if (t->n_parts == 0) {
        snprintf(p[0].module, sizeof(p[0].module), "%s", t->module);
        p[0].out_offset = 0;
        p[0].out = t->out_features;
        return 1;
    }
    const char *dot = strrchr(t->module, '.');
    for (size_t k = 0; k < t->n_parts; k++) {
        snprintf(p[k].module, sizeof(p[k].module), "%.*s.%s", (int)(dot - t->module), t->module,
                 t->parts[k].hf_module);
        p[k].out_offset = t->parts[k].out_offset;
        p[k].out = t->parts[k].out_features;
    }
    return t->n_parts;
}

static long wsync_ref_lora_module(const wsync_lora_t *a, const char *module)
{
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->modules[i].module, module) == 0)
            return (long)i;
    return -1;
}

/* Expected A ([max_rank, in]) and B ([out, max_rank]) of target t; returns the rank. */
static uint32_t wsync_ref_lora_expect(const wsync_adapter_target_t *t, const wsync_lora_t *a,
                                      uint64_t version, uint16_t *ea, uint16_t *eb, uint16_t *tmp)
{
    wsync_ref_lora_part_t parts[3];
    size_t np = wsync_ref_lora_parts(t, parts);
    const int64_t mr = WSYNC_REF_LORA_MAX_RANK, R = a->rank;
    int64_t c = 0;

    memset(ea, 0, 2u * (size_t)(mr * t->in_features));
    memset(eb, 0, 2u * (size_t)(mr * t->out_features));
    for (size_t k = 0; k < np; k++) {
        long m = wsync_ref_lora_module(a, parts[k].module);
        if (m < 0 || c + R > mr)
            continue;
        wsync_lora_fill(a, (size_t)m, 0, version, tmp); /* A_k [R, in] */
        memcpy(ea + c * t->in_features, tmp, 2u * (size_t)(R * t->in_features));
        wsync_lora_fill(a, (size_t)m, 1, version, tmp); /* B_k [out_k, R] */
        for (int64_t row = 0; row < parts[k].out; row++)
            memcpy(eb + (parts[k].out_offset + row) * mr + c, tmp + row * R, 2u * (size_t)R);
        c += R;
    }
    return (uint32_t)c;
}

size_t wsync_ref_lora_verify(wsync_ref_lora_t *r, const char *name, const wsync_lora_t *a,
                             uint64_t version, char *first_bad, size_t len)
{
    wsync_ref_lora_slot_t *s = wsync_ref_lora_find(r, name);
    size_t ok = 0, max = 0;

    if (first_bad != NULL && len > 0)
        snprintf(first_bad, len, "%s", s == NULL ? "(adapter not loaded)" : "");
    if (s == NULL)
        return 0;
    for (size_t t = 0; t < r->n_targets; t++) {
        size_t n = (size_t)(WSYNC_REF_LORA_MAX_RANK *
                            (s->targets[t].in_features > s->targets[t].out_features
                                 ? s->targets[t].in_features
                                 : s->targets[t].out_features));
        max = n > max ? n : max;
    }
    uint16_t *buf[5];
    for (int i = 0; i < 5; i++)
        buf[i] = malloc(2 * max);
    int act = s->active;
    for (size_t t = 0; buf[4] != NULL && buf[3] != NULL && t < r->n_targets; t++) {
        const wsync_adapter_target_t *x = &s->targets[t];
        size_t abytes = 2u * WSYNC_REF_LORA_MAX_RANK * (size_t)x->in_features;
        size_t bbytes = 2u * WSYNC_REF_LORA_MAX_RANK * (size_t)x->out_features;
        uint32_t rank = wsync_ref_lora_expect(x, a, version, buf[0], buf[1], buf[4]);
        float scaling = rank ? (float)(a->alpha / a->rank) : 0.0f;
        int meta = x->rank[act] == rank && fabsf(x->scaling[act] - scaling) <= 1e-6f;
        int good_a = meta && wsync_ref_lora_read(r, buf[2], x->lora_a[act], abytes) == 0 &&
                     memcmp(buf[0], buf[2], abytes) == 0;
        int good_b = meta && wsync_ref_lora_read(r, buf[3], x->lora_b[act], bbytes) == 0 &&
                     memcmp(buf[1], buf[3], bbytes) == 0;
        ok += (size_t)good_a + (size_t)good_b;
        if (!(good_a && good_b) && first_bad != NULL && first_bad[0] == '\0')
            snprintf(first_bad, len, "%s.lora_%s%s", x->module, good_a ? "B" : "A",
                     meta ? "" : " (rank/scaling)");
    }
    for (int i = 0; i < 5; i++)
        free(buf[i]);
    return ok;
}

uint64_t wsync_ref_lora_digest(wsync_ref_lora_t *r, const wsync_ref_lora_slot_t *s)
{
    uint64_t d = (uint64_t)s->active;
    for (size_t t = 0; t < r->n_targets; t++) {
        const wsync_adapter_target_t *x = &s->targets[t];
        size_t abytes = 2u * WSYNC_REF_LORA_MAX_RANK * (size_t)x->in_features;
        size_t bbytes = 2u * WSYNC_REF_LORA_MAX_RANK * (size_t)x->out_features;
        void *tmp = malloc(abytes > bbytes ? abytes : bbytes);
        for (int c = 0; tmp != NULL && c < 2; c++) {
            if (wsync_ref_lora_read(r, tmp, x->lora_a[c], abytes) == 0)
                d = d * 0x100000001b3ull + wsync64(tmp, abytes);
            if (wsync_ref_lora_read(r, tmp, x->lora_b[c], bbytes) == 0)
                d = d * 0x100000001b3ull + wsync64(tmp, bbytes);
            d = d * 0x100000001b3ull + x->rank[c];
            d = d * 0x100000001b3ull + wsync64(&x->scaling[c], sizeof(float));
        }
        free(tmp);
    }
    return d;
}
