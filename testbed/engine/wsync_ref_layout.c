/* Reference engine layout; see wsync_ref_layout.h. The expected-bytes code below deliberately
 * shares nothing with engine-shims/common/wsync_mapping.c: it is the independent check. */
#include "wsync_ref_layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WSYNC_REF_ALIGN 256u

static const int64_t *wsync_ref_shape(const wsync_model_t *m, const char *name)
{
    long i = wsync_model_find(m, name);
    return i < 0 ? NULL : m->tensors[i].shape;
}

static int wsync_ref_why(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int wsync_ref_why(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* Model dims from the HF tensor list. */
static int wsync_ref_dims(const wsync_model_t *m, wsync_model_dims_t *d, unsigned *layers,
                          char *why, size_t len)
{
    const int64_t *emb = wsync_ref_shape(m, "model.embed_tokens.weight");
    const int64_t *qn = wsync_ref_shape(m, "model.layers.0.self_attn.q_norm.weight");
    const int64_t *q = wsync_ref_shape(m, "model.layers.0.self_attn.q_proj.weight");
    const int64_t *k = wsync_ref_shape(m, "model.layers.0.self_attn.k_proj.weight");
    const int64_t *g = wsync_ref_shape(m, "model.layers.0.mlp.gate_proj.weight");
    const int64_t *router = wsync_ref_shape(m, "model.layers.0.mlp.gate.weight");
    const int64_t *eg = wsync_ref_shape(m, "model.layers.0.mlp.experts.0.gate_proj.weight");
    char name[WSYNC_REF_NAME_MAX];

    memset(d, 0, sizeof(*d));
    if (emb == NULL || qn == NULL || q == NULL || k == NULL || (g == NULL && eg == NULL))
        return wsync_ref_why(why, len, "model lacks the tensors the engine layout needs");
    d->vocab = emb[0];
    d->hidden = emb[1];
    d->head_dim = qn[0];
    if (q[0] % d->head_dim != 0 || k[0] % d->head_dim != 0)
        return wsync_ref_why(why, len,
                             "q_proj rows %lld / k_proj rows %lld are not whole heads of %lld "
                             "(scale too large for this layout)",
                             (long long)q[0], (long long)k[0], (long long)d->head_dim);
    d->heads = q[0] / d->head_dim;
    d->kv_heads = k[0] / d->head_dim;
    if (g != NULL)
        d->intermediate = g[0];
    if (router != NULL && eg != NULL) {
        d->experts = router[0];
        d->moe_intermediate = eg[0];
    }
    for (*layers = 0;; (*layers)++) {
        snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight", *layers);
        if (wsync_model_find(m, name) < 0)
            break;
    }
    return 0;
}

static int wsync_ref_check_tp(const wsync_model_dims_t *d, uint32_t n, char *why, size_t len)
{
    if (d->heads % n || d->vocab % n || (d->kv_heads % n && n % d->kv_heads) ||
        (d->intermediate && d->intermediate % n) || (d->experts && d->moe_intermediate % n))
        return wsync_ref_why(why, len,
                             "tp %u does not divide the model (heads %lld, kv heads %lld, vocab "
                             "%lld, intermediate %lld, expert intermediate %lld)",
                             n, (long long)d->heads, (long long)d->kv_heads, (long long)d->vocab,
                             (long long)d->intermediate, (long long)d->moe_intermediate);
    return 0;
}

typedef struct wsync_ref_builder {
    wsync_ref_layout_t *l;
    size_t cap;
    int failed;
} wsync_ref_builder_t;

static void wsync_ref_add(wsync_ref_builder_t *b, wsync_ref_kind_t kind, const char *name,
                          const char *hf, int64_t d0, int64_t d1, int64_t d2)
{
    wsync_ref_layout_t *l = b->l;
    wsync_ref_param_t *p;

    if (b->failed)
        return;
    if (l->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        void *np = realloc(l->params, cap * sizeof(*l->params));
        if (np == NULL) {
            b->failed = 1;
            return;
        }
        l->params = np;
        b->cap = cap;
    }
    p = &l->params[l->n++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->hf, sizeof(p->hf), "%s", hf);
    p->kind = kind;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->shape[2] = d2;
    p->ndim = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
    p->nbytes = 2u * (uint64_t)d0 * (uint64_t)(d1 > 0 ? d1 : 1) * (uint64_t)(d2 > 0 ? d2 : 1);
}

static void wsync_ref_layer(wsync_ref_builder_t *b, unsigned li, const char *engine)
{
    const wsync_model_dims_t *d = &b->l->dims;
    int64_t n = b->l->size, H = d->hidden, hd = d->head_dim;
    int64_t kvpr = d->kv_heads >= n ? d->kv_heads / n : 1;
    char pre[48], nm[WSYNC_REF_NAME_MAX], hf[WSYNC_REF_NAME_MAX];
    int lmdeploy = strcmp(engine, "lmdeploy") == 0;

    snprintf(pre, sizeof(pre), "model.layers.%u.", li);
#define WSYNC_REF_P(kind, suffix, hfsuffix, d0, d1, d2)                                            \
    do {                                                                                           \
        snprintf(nm, sizeof(nm), "%s%s", pre, suffix);                                             \
        snprintf(hf, sizeof(hf), "%s%s", pre, hfsuffix);                                           \
        wsync_ref_add(b, kind, nm, hf, d0, d1, d2);                                                \
    } while (0)
    WSYNC_REF_P(WSYNC_REF_QKV, "self_attn.qkv_proj.weight", "", (d->heads / n + 2 * kvpr) * hd, H,
                0);
    WSYNC_REF_P(WSYNC_REF_ROWSHARD, "self_attn.o_proj.weight", "self_attn.o_proj.weight", H,
                d->heads * hd / n, 0);
    WSYNC_REF_P(WSYNC_REF_REPLICATED, "self_attn.q_norm.weight", "self_attn.q_norm.weight", hd, 0,
                0);
    WSYNC_REF_P(WSYNC_REF_REPLICATED, "self_attn.k_norm.weight", "self_attn.k_norm.weight", hd, 0,
                0);
    WSYNC_REF_P(WSYNC_REF_REPLICATED, "input_layernorm.weight", "input_layernorm.weight", H, 0, 0);
    WSYNC_REF_P(WSYNC_REF_REPLICATED, "post_attention_layernorm.weight",
                "post_attention_layernorm.weight", H, 0, 0);
    if (d->experts == 0) {
        WSYNC_REF_P(WSYNC_REF_GATE_UP, "mlp.gate_up_proj.weight", "", 2 * d->intermediate / n, H,
                    0);
        WSYNC_REF_P(WSYNC_REF_ROWSHARD, "mlp.down_proj.weight", "mlp.down_proj.weight", H,
                    d->intermediate / n, 0);
    } else {
        int64_t mi = d->moe_intermediate / n;
        WSYNC_REF_P(WSYNC_REF_REPLICATED, "mlp.gate.weight", "mlp.gate.weight", d->experts, H, 0);
        WSYNC_REF_P(WSYNC_REF_W13,
                    lmdeploy ? "mlp.experts.gate_up.weight" : "mlp.experts.w13_weight", "",
                    d->experts, 2 * mi, H);
        WSYNC_REF_P(WSYNC_REF_W2, lmdeploy ? "mlp.experts.down.weight" : "mlp.experts.w2_weight",
                    "", d->experts, H, mi);
    }
#undef WSYNC_REF_P
}

/* Each parameter's offset in the arena (WSYNC_REF_ALIGN-aligned, in order) and the arena's size. */
static void wsync_ref_place(wsync_ref_layout_t *l)
{
    uint64_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        off = (off + WSYNC_REF_ALIGN - 1) / WSYNC_REF_ALIGN * WSYNC_REF_ALIGN;
        l->params[i].offset = off;
        off += l->params[i].nbytes;
    }
    l->arena_bytes = off;
}

int wsync_ref_layout_build(wsync_ref_layout_t *l, const char *engine,
                           const wsync_model_config_t *cfg, uint32_t rank, uint32_t size, char *why,
                           size_t len)
{
    wsync_ref_builder_t b = {.l = l};
    unsigned layers = 0;
    int64_t n = size;

    memset(l, 0, sizeof(*l));
    if (strcmp(engine, "sglang") && strcmp(engine, "vllm") && strcmp(engine, "lmdeploy"))
        return wsync_ref_why(why, len, "unknown engine \"%s\"; use sglang, vllm or lmdeploy",
                             engine);
    if (size == 0 || rank >= size)
        return wsync_ref_why(why, len, "tp rank %u of size %u", rank, size);
    if (wsync_model_build(&l->model, cfg, why, len) != 0)
        return -1;
    if (wsync_ref_dims(&l->model, &l->dims, &layers, why, len) != 0 ||
        wsync_ref_check_tp(&l->dims, size, why, len) != 0) {
        wsync_ref_layout_free(l);
        return -1;
    }
    snprintf(l->engine, sizeof(l->engine), "%s", engine);
    l->rank = rank;
    l->size = size;
    wsync_ref_add(&b, WSYNC_REF_VOCAB, "model.embed_tokens.weight", "model.embed_tokens.weight",
                  l->dims.vocab / n, l->dims.hidden, 0);
    for (unsigned i = 0; i < layers; i++)
        wsync_ref_layer(&b, i, engine);
    wsync_ref_add(&b, WSYNC_REF_REPLICATED, "model.norm.weight", "model.norm.weight",
                  l->dims.hidden, 0, 0);
    if (wsync_model_find(&l->model, "lm_head.weight") >= 0) /* none when embeddings are tied */
        wsync_ref_add(&b, WSYNC_REF_VOCAB, "lm_head.weight", "lm_head.weight", l->dims.vocab / n,
                      l->dims.hidden, 0);
    if (b.failed) {
        wsync_ref_layout_free(l);
        return wsync_ref_why(why, len, "out of memory");
    }
    wsync_ref_place(l);
    for (l->nslots = 16; l->nslots < 2 * l->n;)
        l->nslots *= 2;
    if ((l->slots = calloc(l->nslots, sizeof(*l->slots))) == NULL) {
        wsync_ref_layout_free(l);
        return wsync_ref_why(why, len, "out of memory");
    }
    for (size_t i = 0; i < l->n; i++) {
        size_t k = wsync_model_hash(l->params[i].name) & (l->nslots - 1);
        while (l->slots[k] != 0)
            k = (k + 1) & (l->nslots - 1);
        l->slots[k] = i + 1;
    }
    return 0;
}

int wsync_ref_layout_ep(wsync_ref_layout_t *l, uint32_t ep_rank, uint32_t ep_size,
                        uint32_t mtp_size)
{
    if (ep_size == 0 || mtp_size == 0 || l->size % mtp_size != 0 || ep_rank >= ep_size)
        return -1;
    const int64_t mtp = mtp_size, mi = l->dims.moe_intermediate;
    /* the linear placement, worked out here rather than asked of the mapping (the check) */
    const int64_t e = l->dims.experts, per = e / ep_size, extra = e % ep_size;
    const int64_t count = per + ((int64_t)ep_rank < extra);
    for (size_t i = 0; i < l->n; i++) {
        wsync_ref_param_t *p = &l->params[i];
        if (p->kind == WSYNC_REF_W13)
            p->shape[0] = count, p->shape[1] = 2 * mi / mtp;
        else if (p->kind == WSYNC_REF_W2)
            p->shape[0] = count, p->shape[2] = mi / mtp;
        else
            continue;
        p->nbytes = 2u * (uint64_t)(p->shape[0] * p->shape[1] * p->shape[2]);
    }
    wsync_ref_place(l);
    return 0;
}

void wsync_ref_layout_free(wsync_ref_layout_t *l)
{
    free(l->params);
    free(l->slots);
    wsync_model_free(&l->model);
    memset(l, 0, sizeof(*l));
}

long wsync_ref_layout_find(const wsync_ref_layout_t *l, const char *name)
{
    if (l->nslots == 0 || name == NULL)
        return -1;
    for (size_t k = wsync_model_hash(name) & (l->nslots - 1); l->slots[k] != 0;
         k = (k + 1) & (l->nslots - 1))
        if (strcmp(l->params[l->slots[k] - 1].name, name) == 0)
            return (long)(l->slots[k] - 1);
    return -1;
}

int wsync_ref_view_param(const wsync_ref_view_t *v, const char *name, wsync_param_info_t *out)
{
    long i = wsync_ref_layout_find(v->l, name);
    if (i < 0)
        return -1;
    const wsync_ref_param_t *p = &v->l->params[i];
    out->ptr = v->arena + p->offset;
    out->dtype = WSYNC_DTYPE_BF16;
    out->ndim = p->ndim;
    memset(out->shape, 0, sizeof(out->shape));
    memcpy(out->shape, p->shape, sizeof(p->shape));
    return 0;
}

static int wsync_ref_view_param_cb(void *user, const char *name, wsync_param_info_t *out)
{
    return wsync_ref_view_param(user, name, out);
}

static void wsync_ref_view_tp(void *user, uint32_t *rank, uint32_t *size)
{
    const wsync_ref_view_t *v = user;
    *rank = v->l->rank;
    *size = v->l->size;
}

static void wsync_ref_view_dims(void *user, wsync_model_dims_t *out)
{
    *out = ((const wsync_ref_view_t *)user)->l->dims;
}

/* EP inside the TP group: MoE TP over size / ep_size ranks. */
static void wsync_ref_view_moe(void *user, uint32_t *ep_rank, uint32_t *ep_size, uint32_t *mtp_rank,
                               uint32_t *mtp_size)
{
    const wsync_ref_view_t *v = user;
    *ep_rank = v->ep_rank;
    *ep_size = v->ep_size;
    *mtp_size = v->mtp_size;
    *mtp_rank = v->l->rank % v->mtp_size;
}

wsync_engine_ops_t wsync_ref_view_ops(wsync_ref_view_t *v)
{
    return (wsync_engine_ops_t){.struct_size = sizeof(wsync_engine_ops_t),
                                .user = v,
                                .param = wsync_ref_view_param_cb,
                                .tp = wsync_ref_view_tp,
                                .dims = wsync_ref_view_dims,
                                .moe = v->ep_size > 1 ? wsync_ref_view_moe : NULL};
}

/* HF tensor `prefix``suffix` of `version` into a fresh buffer (caller frees). */
static unsigned char *wsync_ref_hf(const wsync_ref_layout_t *l, const char *prefix,
                                   const char *suffix, uint64_t version)
{
    char name[WSYNC_REF_NAME_MAX * 2];
    long i;
    unsigned char *buf;

    snprintf(name, sizeof(name), "%s%s", prefix, suffix);
    i = wsync_model_find(&l->model, name);
    if (i < 0)
        return NULL;
    buf = malloc(l->model.tensors[i].nbytes);
    if (buf != NULL)
        wsync_model_fill(&l->model.tensors[i], version, buf);
    return buf;
}

/* Rows [row0, row0 + rows) of a row-major [*, cols] bf16 matrix. */
static unsigned char *wsync_ref_rows(unsigned char *dst, const unsigned char *src, int64_t row0,
                                     int64_t rows, int64_t cols)
{
    if (src != NULL)
        memcpy(dst, src + 2 * row0 * cols, (size_t)(2 * rows * cols));
    return dst + 2 * rows * cols;
}

/* Columns [col0, col0 + cols) of every row of a [rows, all_cols] bf16 matrix. */
static unsigned char *wsync_ref_cols(unsigned char *dst, const unsigned char *src, int64_t rows,
                                     int64_t all_cols, int64_t col0, int64_t cols)
{
    for (int64_t i = 0; src != NULL && i < rows; i++)
        memcpy(dst + 2 * i * cols, src + 2 * (i * all_cols + col0), (size_t)(2 * cols));
    return dst + 2 * rows * cols;
}

void wsync_ref_expected(const wsync_ref_layout_t *l, const wsync_ref_param_t *p, uint64_t version,
                        void *dst)
{
    const wsync_model_dims_t *d = &l->dims;
    int64_t r = l->rank, n = l->size, H = d->hidden, hd = d->head_dim;
    unsigned char *out = dst, *a, *b, *c;
    const char *pre = p->hf; /* fused parameters: "model.layers.<i>." */

    memset(dst, 0, p->nbytes);
    switch (p->kind) {
    case WSYNC_REF_REPLICATED:
        a = wsync_ref_hf(l, p->hf, "", version);
        if (a != NULL)
            memcpy(out, a, p->nbytes);
        free(a);
        return;
    case WSYNC_REF_VOCAB:
        a = wsync_ref_hf(l, p->hf, "", version);
        wsync_ref_rows(out, a, r * (d->vocab / n), d->vocab / n, H);
        free(a);
        return;
    case WSYNC_REF_QKV: {
        int64_t q = d->heads / n, kv = d->kv_heads >= n ? d->kv_heads / n : 1;
        int64_t head0 = d->kv_heads >= n ? r * kv : r * d->kv_heads / n;
        a = wsync_ref_hf(l, pre, "self_attn.q_proj.weight", version);
        b = wsync_ref_hf(l, pre, "self_attn.k_proj.weight", version);
        c = wsync_ref_hf(l, pre, "self_attn.v_proj.weight", version);
        out = wsync_ref_rows(out, a, r * q * hd, q * hd, H);
        out = wsync_ref_rows(out, b, head0 * hd, kv * hd, H);
        wsync_ref_rows(out, c, head0 * hd, kv * hd, H);
        free(a);
        free(b);
        free(c);
        return;
    }
    case WSYNC_REF_ROWSHARD:
        a = wsync_ref_hf(l, p->hf, "", version);
        wsync_ref_cols(out, a, p->shape[0], p->shape[1] * n, r * p->shape[1], p->shape[1]);
        free(a);
        return;
    case WSYNC_REF_GATE_UP: {
        int64_t i = d->intermediate / n;
        a = wsync_ref_hf(l, pre, "mlp.gate_proj.weight", version);
        b = wsync_ref_hf(l, pre, "mlp.up_proj.weight", version);
        out = wsync_ref_rows(out, a, r * i, i, H);
        wsync_ref_rows(out, b, r * i, i, H);
        free(a);
        free(b);
        return;
    }
    case WSYNC_REF_W13:
    case WSYNC_REF_W2: {
        int64_t mi = d->moe_intermediate / n;
        char e_pre[WSYNC_REF_NAME_MAX + 32];
        for (int64_t e = 0; e < d->experts; e++) {
            snprintf(e_pre, sizeof(e_pre), "%smlp.experts.%lld.", pre, (long long)e);
            if (p->kind == WSYNC_REF_W13) {
                a = wsync_ref_hf(l, e_pre, "gate_proj.weight", version);
                b = wsync_ref_hf(l, e_pre, "up_proj.weight", version);
                out = wsync_ref_rows(out, a, r * mi, mi, H);
                out = wsync_ref_rows(out, b, r * mi, mi, H);
                free(a);
                free(b);
            } else {
                a = wsync_ref_hf(l, e_pre, "down_proj.weight", version);
                out = wsync_ref_cols(out, a, H, d->moe_intermediate, r * mi, mi);
                free(a);
            }
        }
        return;
    }
    }
}
