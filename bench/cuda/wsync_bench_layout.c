/* Benchmark layouts and bucket plans. See wsync_bench_layout.h. */
#include "wsync_bench_layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_fusion.h"

#define WB_ALIGN 256u

static uint64_t wb_align(uint64_t x)
{
    return (x + WB_ALIGN - 1) & ~(uint64_t)(WB_ALIGN - 1);
}

typedef struct wb_builder {
    wb_layout_t *l;
    size_t cap;
    unsigned scale;
} wb_builder_t;

static int wb_add(wb_builder_t *b, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int wb_add(wb_builder_t *b, int64_t rows, int64_t cols, const char *fmt, ...)
{
    wb_layout_t *l = b->l;
    if (l->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 512;
        wb_tensor_t *t = realloc(l->t, cap * sizeof(*t));
        if (t == NULL)
            return -1;
        l->t = t;
        b->cap = cap;
    }
    wb_tensor_t *t = &l->t[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    if (rows > 1 && b->scale > 1)
        rows = rows / b->scale > 0 ? rows / b->scale : 1;
    t->rows = rows;
    t->cols = cols;
    t->bytes = (uint64_t)rows * (uint64_t)cols * 2u;
    t->offset = l->packed;
    l->packed = wb_align(l->packed + t->bytes);
    l->payload += t->bytes;
    return 0;
}

int wb_layout_build(const char *kind, unsigned layers, unsigned scale, int grouped,
                    wb_layout_t *out)
{
    memset(out, 0, sizeof(*out));
    wb_builder_t b = {.l = out, .scale = scale};
    const int moe = strcmp(kind, "moe") == 0;
    const int64_t vocab = 151936, hd = 128;
    const int64_t hidden = moe ? 2048 : 4096, heads = 32, kv = moe ? 4 : 8;
    const int64_t inter = 12288, moe_inter = 768, experts = 128;
    if (layers == 0)
        layers = moe ? 12 : 36;
    int rc = wb_add(&b, vocab, hidden, "model.embed_tokens.weight");
    for (unsigned i = 0; i < layers && rc == 0; i++) {
        const char *p = "model.layers";
        rc |= wb_add(&b, heads * hd, hidden, "%s.%u.self_attn.q_proj.weight", p, i);
        rc |= wb_add(&b, kv * hd, hidden, "%s.%u.self_attn.k_proj.weight", p, i);
        rc |= wb_add(&b, kv * hd, hidden, "%s.%u.self_attn.v_proj.weight", p, i);
        rc |= wb_add(&b, hidden, heads * hd, "%s.%u.self_attn.o_proj.weight", p, i);
        rc |= wb_add(&b, 1, hd, "%s.%u.self_attn.q_norm.weight", p, i);
        rc |= wb_add(&b, 1, hd, "%s.%u.self_attn.k_norm.weight", p, i);
        if (moe) {
            rc |= wb_add(&b, experts, hidden, "%s.%u.mlp.gate.weight", p, i);
            /* hf: gate, up, down of each expert in turn (HF module order); grouped: gate and
             * up of every expert, then every down (Megatron's grouped experts: fc1 of each
             * local expert, then fc2) */
            for (int64_t e = 0; e < experts && rc == 0; e++) {
                rc |= wb_add(&b, moe_inter, hidden, "%s.%u.mlp.experts.%lld.gate_proj.weight", p, i,
                             (long long)e);
                rc |= wb_add(&b, moe_inter, hidden, "%s.%u.mlp.experts.%lld.up_proj.weight", p, i,
                             (long long)e);
                if (!grouped)
                    rc |= wb_add(&b, hidden, moe_inter, "%s.%u.mlp.experts.%lld.down_proj.weight",
                                 p, i, (long long)e);
            }
            for (int64_t e = 0; grouped && e < experts && rc == 0; e++)
                rc |= wb_add(&b, hidden, moe_inter, "%s.%u.mlp.experts.%lld.down_proj.weight", p, i,
                             (long long)e);
        } else {
            rc |= wb_add(&b, inter, hidden, "%s.%u.mlp.gate_proj.weight", p, i);
            rc |= wb_add(&b, inter, hidden, "%s.%u.mlp.up_proj.weight", p, i);
            rc |= wb_add(&b, hidden, inter, "%s.%u.mlp.down_proj.weight", p, i);
        }
        rc |= wb_add(&b, 1, hidden, "%s.%u.input_layernorm.weight", p, i);
        rc |= wb_add(&b, 1, hidden, "%s.%u.post_attention_layernorm.weight", p, i);
    }
    if (rc == 0)
        rc |= wb_add(&b, 1, hidden, "model.norm.weight");
    if (rc == 0)
        rc |= wb_add(&b, vocab, hidden, "lm_head.weight");
    if (rc != 0)
        wb_layout_free(out);
    return rc;
}

void wb_layout_free(wb_layout_t *l)
{
    free(l->t);
    free(l->group_bytes);
    memset(l, 0, sizeof(*l));
}

/* Kinds of fused engine parameters (one of each per layer at most): the fusion table's
 * (plugin/common/wsync_fusion.h), less its NONE. */
#define WB_FUSE_KINDS (WSYNC_FUSE_KINDS - 1)

/* The fused parameter a tensor of wb_layout_build belongs to (a wsync_fuse_t less one), and its
 * layer; -1: stands alone. */
static int wb_fuse_kind(const char *name, unsigned *layer)
{
    int n = 0;
    if (sscanf(name, "model.layers.%u.%n", layer, &n) != 1 || n == 0)
        return -1;
    const wsync_fusion_t f = wsync_fusion_of(name);
    return f.kind == WSYNC_FUSE_NONE ? -1 : (int)f.kind - 1;
}

/* The group of tensor i: a fused one from open[layer][kind] (opened at its first member), or a
 * new one. */
static size_t wb_group_of(wb_layout_t *l, size_t i, int fused, size_t *open, unsigned layers)
{
    unsigned layer = 0;
    const int kind = fused ? wb_fuse_kind(l->t[i].name, &layer) : -1;
    size_t *slot = kind >= 0 && layer < layers ? &open[(size_t)layer * WB_FUSE_KINDS + kind] : NULL;
    if (slot != NULL && *slot != SIZE_MAX)
        return *slot;
    l->group_bytes[l->n_groups] = 0;
    if (slot != NULL)
        *slot = l->n_groups;
    return l->n_groups++;
}

int wb_layout_group(wb_layout_t *l, int fused)
{
    free(l->group_bytes);
    l->group_bytes = NULL;
    l->n_groups = 0;
    unsigned layers = 0;
    for (size_t i = 0; fused && i < l->n; i++) {
        unsigned layer;
        if (wb_fuse_kind(l->t[i].name, &layer) >= 0 && layer >= layers)
            layers = layer + 1;
    }
    size_t *open = malloc(((size_t)layers * WB_FUSE_KINDS + 1) * sizeof(*open));
    l->group_bytes = malloc((l->n + 1) * sizeof(*l->group_bytes));
    if (open == NULL || l->group_bytes == NULL) {
        free(open);
        free(l->group_bytes);
        l->group_bytes = NULL;
        return -1;
    }
    for (size_t k = 0; k < (size_t)layers * WB_FUSE_KINDS; k++)
        open[k] = SIZE_MAX;
    for (size_t i = 0; i < l->n; i++) {
        wb_tensor_t *t = &l->t[i];
        t->group = wb_group_of(l, i, fused, open, layers);
        t->goff = l->group_bytes[t->group];
        l->group_bytes[t->group] += t->bytes;
    }
    free(open);
    return 0;
}

int wb_plan_build(const wb_layout_t *l, uint64_t bucket_bytes, unsigned ramp, double growth,
                  wb_plan_t *out)
{
    memset(out, 0, sizeof(*out));
    size_t capp = l->n * 2 + 16, capb = 64;
    out->p = malloc(capp * sizeof(*out->p));
    out->b = malloc(capb * sizeof(*out->b));
    if (!out->p || !out->b)
        goto oom;
    uint64_t used = 0;
    out->b[0] = (wb_bucket_t){0, 0};
    out->nb = 1;
    for (size_t i = 0; i < l->n; i++) {
        const wb_tensor_t *t = &l->t[i];
        const uint64_t row_bytes = (uint64_t)t->cols * 2u;
        int64_t r0 = 0;
        while (r0 < t->rows || (t->rows == 0 && r0 == 0)) {
            int64_t rows = t->rows - r0;
            const size_t b = out->nb - 1; /* a ramp bucket's cap; a whole tensor opens one whole */
            uint64_t cap = bucket_bytes;
            for (size_t k = b; k < ramp; k++)
                cap = (uint64_t)((double)cap / growth);
            if (used == 0 && (uint64_t)rows * row_bytes <= bucket_bytes &&
                (uint64_t)rows * row_bytes > cap)
                cap = (uint64_t)rows * row_bytes;
            uint64_t room = cap > used ? cap - used : 0;
            if ((uint64_t)rows * row_bytes > room) {
                int64_t fit = (int64_t)(room / row_bytes);
                if (fit == 0 && used == 0)
                    goto oom; /* one row is larger than a bucket */
                if (fit == 0 || (uint64_t)rows * row_bytes <= bucket_bytes) {
                    /* next bucket (whole tensors stay whole when they fit one) */
                    if (out->nb == capb) {
                        capb *= 2;
                        wb_bucket_t *nb = realloc(out->b, capb * sizeof(*nb));
                        if (!nb)
                            goto oom;
                        out->b = nb;
                    }
                    out->b[out->nb++] = (wb_bucket_t){out->np, 0};
                    used = 0;
                    continue;
                }
                rows = fit;
            }
            if (out->np == capp) {
                capp *= 2;
                wb_piece_t *np = realloc(out->p, capp * sizeof(*np));
                if (!np)
                    goto oom;
                out->p = np;
            }
            out->p[out->np++] = (wb_piece_t){i, r0, rows};
            out->b[out->nb - 1].count++;
            used = wb_align(used + (uint64_t)rows * row_bytes);
            r0 += rows;
            if (t->rows == 0)
                break;
        }
    }
    return 0;
oom:
    wb_plan_free(out);
    return -1;
}

void wb_plan_free(wb_plan_t *p)
{
    free(p->at);
    free(p->p);
    free(p->b);
    memset(p, 0, sizeof(*p));
}

void wb_piece_name(const wb_layout_t *l, const wb_piece_t *pc, char *buf, size_t cap)
{
    const wb_tensor_t *x = &l->t[pc->tensor];
    if (pc->r0 == 0 && pc->rows == x->rows)
        snprintf(buf, cap, "%s", x->name);
    else
        snprintf(buf, cap, "%s@%lld", x->name, (long long)pc->r0);
}

typedef struct wb_named {
    char name[128];
    size_t piece;
} wb_named_t;

static int wb_by_name(const void *a, const void *b)
{
    return strcmp(((const wb_named_t *)a)->name, ((const wb_named_t *)b)->name);
}

int wb_plan_learn(const wb_layout_t *l, wb_plan_t *p, size_t b, const char *const *names, size_t n,
                  char *why, size_t cap)
{
    const wb_bucket_t *bk = &p->b[b];
    if (n != bk->count) {
        snprintf(why, cap, "bucket %zu has %zu tensors, the manifest %zu", b, bk->count, n);
        return -1;
    }
    if (p->at == NULL) {
        p->at = malloc((p->np ? p->np : 1) * sizeof(*p->at));
        if (p->at == NULL) {
            snprintf(why, cap, "no memory for %zu pieces", p->np);
            return -1;
        }
        memset(p->at, 0xFF, (p->np ? p->np : 1) * sizeof(*p->at));
    }
    wb_named_t *s = calloc(n ? n : 1, sizeof(*s));
    if (s == NULL) {
        snprintf(why, cap, "no memory for %zu names", n);
        return -1;
    }
    for (size_t j = 0; j < n; j++) {
        wb_piece_name(l, &p->p[bk->first + j], s[j].name, sizeof(s[j].name));
        s[j].piece = bk->first + j;
    }
    qsort(s, n, sizeof(*s), wb_by_name);
    int rc = 0;
    for (size_t k = 0; k < n && rc == 0; k++) {
        wb_named_t key;
        snprintf(key.name, sizeof(key.name), "%s", names[k]);
        const wb_named_t *hit = bsearch(&key, s, n, sizeof(*s), wb_by_name);
        if (hit == NULL) {
            snprintf(why, cap, "manifest tensor %s is no piece of bucket %zu", names[k], b);
            rc = -1;
        } else {
            p->at[bk->first + k] = hit->piece;
        }
    }
    free(s);
    return rc;
}
