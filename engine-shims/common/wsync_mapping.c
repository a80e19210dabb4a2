/* Mapping and TP narrowing. Contract in wsync_mapping.h. */
#include "wsync_mapping.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_error.h"

/* Does `name` (from its start) match `pat` exactly? '#' matches [0-9]+ and stores the value. */
static int wsync_map_match(const char *name, const char *pat, int64_t *expert)
{
    if (strcmp(pat, "*") == 0)
        return 1;
    while (*pat != '\0') {
        if (*pat == '#') {
            char *end;
            if (!isdigit((unsigned char)*name))
                return 0;
            *expert = strtoll(name, &end, 10);
            name = end;
            pat++;
            continue;
        }
        if (*name != *pat)
            return 0;
        name++;
        pat++;
    }
    return *name == '\0';
}

/* Try every '.'-boundary suffix of hf_name against one rule. */
static int wsync_map_rule_matches(const wsync_map_rule_t *r, const char *hf_name, size_t *prefix,
                                  int64_t *expert)
{
    for (size_t p = 0; hf_name[p] != '\0'; p++) {
        if (p != 0 && hf_name[p - 1] != '.')
            continue;
        *expert = -1;
        if (wsync_map_match(hf_name + p, r->hf_suffix, expert)) {
            *prefix = p;
            return 1;
        }
    }
    return 0;
}

wsync_result_t wsync_map_resolve(const wsync_map_table_t *table, const char *hf_name,
                                 wsync_map_target_t *out, wsync_error_t *err)
{
    const char *engine = table != NULL ? table->engine : "?";

    for (const wsync_map_table_t *t = table; t != NULL; t = t->next) {
        for (size_t i = 0; i < t->n_rules; i++) {
            size_t prefix;
            int64_t expert;
            if (!wsync_map_rule_matches(&t->rules[i], hf_name, &prefix, &expert))
                continue;
            /* "*" matched at the name's start: the engine name is the HF name. */
            if (snprintf(out->engine_name, sizeof(out->engine_name), "%.*s%s", (int)prefix, hf_name,
                         strcmp(t->rules[i].hf_suffix, "*") == 0
                             ? hf_name
                             : t->rules[i].engine_suffix) >= (int)sizeof(out->engine_name))
                return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                    "tensor \"%s\": engine name longer than %d bytes", hf_name,
                                    WSYNC_MAP_NAME_MAX - 1);
            out->rule = &t->rules[i];
            out->expert = expert;
            return WSYNC_OK;
        }
    }
    return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                        "unknown tensor \"%s\": no %s mapping rule matches it; send HF "
                        "checkpoint names the engine's model has",
                        hf_name, engine);
}

/* Geometry of one planned copy, in elements, before it becomes bytes. */
typedef struct wsync_map_geom {
    int64_t hf_rows, hf_cols; /* the shape the HF tensor must have */
    int64_t src_row, src_col; /* first source element read */
    int64_t rows, cols;       /* block copied */
    int64_t dst_base;         /* element offset of the destination block in the parameter */
    int64_t dst_cols;         /* row length of the destination */
    int64_t param_rows;       /* rows of the parameter's 2-D view the block lands in */
    int64_t dst_row;          /* row offset inside that view */
} wsync_map_geom_t;

static int64_t wsync_map_elems(const wsync_param_info_t *p)
{
    int64_t n = 1;
    for (uint32_t i = 0; i < p->ndim; i++)
        n *= p->shape[i];
    return n;
}

#define WSYNC_MAP_REQUIRE(cond, ...)                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, __VA_ARGS__);                     \
    } while (0)

/* Rows of part `part` for this rank: how many, where the rank's range starts in the HF tensor,
 * and where it lands in the fused parameter. */
static wsync_result_t wsync_map_column_part(wsync_map_part_t part, const wsync_model_dims_t *d,
                                            uint32_t r, uint32_t n, const char *pname,
                                            int64_t *hf_rows, int64_t *src_row, int64_t *rows,
                                            int64_t *dst_row, wsync_error_t *err)
{
    int64_t q, kvpr, head0, inter;

    switch (part) {
    case WSYNC_PART_Q:
    case WSYNC_PART_K:
    case WSYNC_PART_V:
        WSYNC_MAP_REQUIRE(d->heads % n == 0 && d->kv_heads > 0 &&
                              (d->kv_heads % n == 0 || n % d->kv_heads == 0),
                          "%s: tp %u does not divide heads %" PRId64 " / kv_heads %" PRId64, pname,
                          n, d->heads, d->kv_heads);
        q = d->heads / n * d->head_dim;
        kvpr = d->kv_heads >= n ? d->kv_heads / n : 1;
        head0 = d->kv_heads >= n ? (int64_t)r * kvpr : (int64_t)r / (n / d->kv_heads);
        if (part == WSYNC_PART_Q) {
            *hf_rows = d->heads * d->head_dim, *src_row = r * q, *rows = q, *dst_row = 0;
        } else {
            *hf_rows = d->kv_heads * d->head_dim;
            *src_row = head0 * d->head_dim;
            *rows = kvpr * d->head_dim;
            *dst_row = q + (part == WSYNC_PART_V ? *rows : 0);
        }
        return WSYNC_OK;
    case WSYNC_PART_GATE:
    case WSYNC_PART_UP:
    case WSYNC_PART_EXPERT_W1:
    case WSYNC_PART_EXPERT_W3:
        inter = (part == WSYNC_PART_GATE || part == WSYNC_PART_UP) ? d->intermediate
                                                                   : d->moe_intermediate;
        WSYNC_MAP_REQUIRE(inter % n == 0, "%s: tp %u does not divide intermediate %" PRId64, pname,
                          n, inter);
        *hf_rows = inter;
        *rows = inter / n;
        *src_row = r * *rows;
        *dst_row = (part == WSYNC_PART_UP || part == WSYNC_PART_EXPERT_W3) ? *rows : 0;
        return WSYNC_OK;
    default:
        return WSYNC_RECORD(err, WSYNC_ERR_INTERNAL, "%s: part %d is not a column part", pname,
                            (int)part);
    }
}

static wsync_result_t wsync_map_geometry(const wsync_map_target_t *tg, const wsync_param_info_t *p,
                                         const wsync_model_dims_t *d, uint32_t r, uint32_t n,
                                         wsync_map_geom_t *g, wsync_error_t *err)
{
    const char *pname = tg->engine_name;
    int expert = WSYNC_MAP_IS_EXPERT(tg->rule->part);
    uint32_t base = expert ? 1 : 0; /* dims before the 2-D view */

    memset(g, 0, sizeof(*g));
    if (expert) {
        WSYNC_MAP_REQUIRE(p->ndim == 3, "%s: expert parameter must be 3-D, the engine has %u-D",
                          pname, p->ndim);
        if (tg->expert < 0 || tg->expert >= p->shape[0])
            return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                                "expert %" PRId64 " does not exist in %s (%" PRId64
                                " experts); send expert ids below %" PRId64,
                                tg->expert, pname, p->shape[0], p->shape[0]);
        g->dst_base = tg->expert * p->shape[1] * p->shape[2];
    }

    if (tg->rule->split == WSYNC_TP_REPLICATED) {
        /* Whole tensor, any rank: viewed as one row. */
        g->hf_rows = -1; /* shape compared dimension by dimension by the caller */
        g->rows = 1;
        g->cols = wsync_map_elems(p);
        g->dst_cols = g->cols;
        g->param_rows = 1;
        return WSYNC_OK;
    }
    WSYNC_MAP_REQUIRE(p->ndim == base + 2, "%s: a %s-parallel parameter must be %u-D, it is %u-D",
                      pname, tg->rule->split == WSYNC_TP_COLUMN ? "column" : "row", base + 2,
                      p->ndim);
    g->param_rows = p->shape[base];
    g->dst_cols = p->shape[base + 1];

    if (tg->rule->split == WSYNC_TP_ROW) {
        g->hf_rows = p->shape[base];
        g->hf_cols = p->shape[base + 1] * n;
        g->rows = p->shape[base];
        g->cols = p->shape[base + 1];
        g->src_col = (int64_t)r * g->cols;
        return WSYNC_OK;
    }
    /* Column-parallel. */
    g->hf_cols = g->cols = p->shape[base + 1];
    if (tg->rule->part == WSYNC_PART_WHOLE ||
        (tg->rule->part == WSYNC_PART_VOCAB && d->vocab <= 0)) {
        g->rows = p->shape[base];
        g->hf_rows = g->rows * n;
        g->src_row = (int64_t)r * g->rows;
        return WSYNC_OK;
    }
    if (tg->rule->part == WSYNC_PART_VOCAB) {
        const int64_t per_rank = p->shape[base];
        WSYNC_MAP_REQUIRE(per_rank * (int64_t)n >= d->vocab,
                          "%s holds %" PRId64 " vocabulary rows per rank, %" PRId64
                          " over %u ranks, fewer than the model's vocab_size %" PRId64,
                          pname, per_rank, per_rank * (int64_t)n, n, d->vocab);
        g->hf_rows = d->vocab;
        g->src_row = (int64_t)r * per_rank;
        g->rows = d->vocab - g->src_row;
        g->rows = g->rows < 0 ? 0 : (g->rows > per_rank ? per_rank : g->rows);
        return WSYNC_OK;
    }
    return wsync_map_column_part(tg->rule->part, d, r, n, pname, &g->hf_rows, &g->src_row, &g->rows,
                                 &g->dst_row, err);
}

static void wsync_map_shape_str(const int64_t *shape, uint32_t ndim, char *buf, size_t len)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, len - off, "[");
    for (uint32_t i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
}

static wsync_result_t wsync_map_check_shape(const wsync_tensor_desc_t *t,
                                            const wsync_map_target_t *tg,
                                            const wsync_param_info_t *p, const wsync_map_geom_t *g,
                                            wsync_error_t *err)
{
    int64_t want[WSYNC_MAX_DIMS];
    uint32_t ndim;
    char got_s[128], want_s[128];

    if (g->hf_rows < 0) {
        ndim = p->ndim;
        memcpy(want, p->shape, sizeof(want));
    } else {
        ndim = 2;
        want[0] = g->hf_rows;
        want[1] = g->hf_cols;
    }
    int ok = t->ndim == ndim;
    for (uint32_t i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == want[i];
    if (ok)
        return WSYNC_OK;
    wsync_map_shape_str(t->shape, t->ndim, got_s, sizeof(got_s));
    wsync_map_shape_str(want, ndim, want_s, sizeof(want_s));
    return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                        "wrong shape for tensor \"%s\": got %s, the engine parameter %s needs "
                        "%s; send the unsharded HF tensor",
                        t->name, got_s, tg->engine_name, want_s);
}

void wsync_map_ep_share(int64_t experts, uint32_t ep_rank, uint32_t ep_size, int64_t *first,
                        int64_t *count)
{
    const int64_t b = experts / ep_size, m = experts % ep_size, r = ep_rank;
    *count = b + (r < m ? 1 : 0);
    *first = r * b + (r < m ? r : m);
}

/* The engine's moe member, when it has one: 1 and its answer, else 0. */
static int wsync_map_moe(const wsync_engine_ops_t *eng, uint32_t *ep_rank, uint32_t *ep_size,
                         uint32_t *mr, uint32_t *ms)
{
    if (!WSYNC_HAS_FIELD(wsync_engine_ops_t, eng, moe) || eng->moe == NULL)
        return 0;
    eng->moe(eng->user, ep_rank, ep_size, mr, ms);
    return 1;
}

uint32_t wsync_map_ep_owner(int64_t experts, uint32_t ep_size, int64_t e)
{
    uint32_t r = 0;
    int64_t first, count;
    for (wsync_map_ep_share(experts, r, ep_size, &first, &count); e >= first + count;)
        wsync_map_ep_share(experts, ++r, ep_size, &first, &count);
    return r;
}

int64_t wsync_map_expert_of(const wsync_map_table_t *table, const char *name)
{
    wsync_map_target_t tg;
    if (wsync_map_resolve(table, name, &tg, NULL) != WSYNC_OK ||
        !WSYNC_MAP_IS_EXPERT(tg.rule->part))
        return -1;
    return tg.expert;
}

int wsync_map_ep_active(const wsync_engine_ops_t *eng)
{
    uint32_t ep_rank = 0, ep_size = 1, mr = 0, ms = 1;
    return wsync_map_moe(eng, &ep_rank, &ep_size, &mr, &ms) && ep_size > 1;
}

int wsync_map_owned(const wsync_map_table_t *table, const wsync_engine_ops_t *eng, const char *name)
{
    uint32_t ep_rank = 0, ep_size = 1, mr = 0, ms = 1;
    const int64_t e = wsync_map_expert_of(table, name);
    if (e < 0 || !wsync_map_moe(eng, &ep_rank, &ep_size, &mr, &ms))
        return 1;
    wsync_model_dims_t d;
    memset(&d, 0, sizeof(d));
    eng->dims(eng->user, &d);
    if (ep_size <= 1 || ep_rank >= ep_size || d.experts <= 0 || e >= d.experts)
        return 1;
    return wsync_map_ep_owner(d.experts, ep_size, e) == ep_rank;
}

/* An expert part under expert parallelism: the expert's local index on this rank, or *skip when
 * another EP rank owns it; *rank / *size become the MoE TP group's. */
static wsync_result_t wsync_map_experts(const wsync_engine_ops_t *eng, const wsync_model_dims_t *d,
                                        const wsync_param_info_t *p, const char *name,
                                        wsync_map_target_t *tg, uint32_t *rank, uint32_t *size,
                                        int *skip, wsync_error_t *err)
{
    uint32_t ep_rank = 0, ep_size = 1, mr = *rank, ms = *size;
    if (!wsync_map_moe(eng, &ep_rank, &ep_size, &mr, &ms))
        return WSYNC_OK;
    if (ep_size == 0 || ep_rank >= ep_size || ms == 0 || mr >= ms)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "engine reports EP rank %u of %u, MoE TP rank %u of %u", ep_rank,
                            ep_size, mr, ms);
    *rank = mr;
    *size = ms;
    if (ep_size == 1)
        return WSYNC_OK;
    if (d->experts <= 0)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "tensor \"%s\": EP size %u needs the model's expert count (its "
                            "dims report %" PRId64 ")",
                            name, ep_size, d->experts);
    if (tg->expert >= d->experts)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                            "tensor \"%s\": expert %" PRId64
                            " does not exist, the model has %" PRId64 " experts",
                            name, tg->expert, d->experts);
    int64_t first, count;
    wsync_map_ep_share(d->experts, ep_rank, ep_size, &first, &count);
    if (p->ndim != 3 || p->shape[0] != count)
        return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                            "%s holds %" PRId64 " experts, but EP rank %u of %u owns %" PRId64
                            " (experts %" PRId64 "..%" PRId64 " of %" PRId64 ")",
                            tg->engine_name, p->ndim == 3 ? p->shape[0] : -1, ep_rank, ep_size,
                            count, first, first + count - 1, d->experts);
    *skip = tg->expert < first || tg->expert >= first + count;
    tg->expert = *skip ? 0 : tg->expert - first;
    return WSYNC_OK;
}

static int wsync_map_quantizable(wsync_dtype_t src, wsync_dtype_t dst)
{
    return dst == WSYNC_DTYPE_F8_E4M3 &&
           (src == WSYNC_DTYPE_BF16 || src == WSYNC_DTYPE_F16 || src == WSYNC_DTYPE_F32);
}

#define WSYNC_MAP_FP8_BLOCK 128

/* The scale parameter beside fp8 parameter `param` (its name ends in "weight") that `suffix`
 * names ("_scale_inv", "_scale"): 0 and *sc filled, else -1. */
static int wsync_map_fp8_scale(const wsync_engine_ops_t *eng, const char *param, const char *suffix,
                               char *sname, wsync_param_info_t *sc)
{
    memset(sc, 0, sizeof(*sc));
    if (snprintf(sname, WSYNC_MAP_NAME_MAX, "%s%s", param, suffix) >= WSYNC_MAP_NAME_MAX)
        return -1;
    return eng->param(eng->user, sname, sc) == 0 ? 0 : -1;
}

/* vLLM's weight_scale: per channel [R, 1] or [R] (R > 1), per tensor [1] or [] (one float); an
 * expert dimension first for fused experts ([E, R, 1], [E, R]; [E], [E, 1]). The kind, else NONE.
 */
static uint32_t wsync_map_fp8_scale_kind(const wsync_param_info_t *sc, uint32_t base, int64_t E,
                                         int64_t R)
{
    if (sc->dtype != WSYNC_DTYPE_F32 || (base == 1 && (sc->ndim < 1 || sc->shape[0] != E)))
        return WSYNC_QUANT_NONE;
    const uint32_t nd = sc->ndim - base; /* dims after the expert one */
    const int64_t *sh = sc->shape + base;
    if (R > 1 && ((nd == 2 && sh[0] == R && sh[1] == 1) || (nd == 1 && sh[0] == R)))
        return WSYNC_QUANT_FP8_CHANNEL;
    if (nd == 0 || (nd == 1 && sh[0] == 1))
        return WSYNC_QUANT_FP8_TENSOR;
    return WSYNC_QUANT_NONE;
}

/* An fp8 parameter's copy: the quantizing op into it and its scales. `<param>_scale_inv` holds
 * 128 x 128 block scales ([ceil(R / 128), ceil(C / 128)] floats, an expert dimension first for
 * fused experts): each op must then cover whole blocks of the parameter (a part starts at a block
 * row, and ends at one or at the parameter's end), and a TP rank's slice must start at a block of
 * the HF tensor, so no block straddles two tensors or two ranks. `<param>_scale` holds vLLM's
 * per-channel or per-tensor scales (wsync_map_fp8_scale_kind), of the rows this rank holds. */
static wsync_result_t wsync_map_plan_fp8(const wsync_engine_ops_t *eng,
                                         const wsync_tensor_desc_t *t, const wsync_map_target_t *tg,
                                         const wsync_param_info_t *p, const wsync_map_geom_t *g,
                                         uint32_t rank, uint32_t size, wsync_copy_op_t *op,
                                         wsync_quant_t *q, uint64_t *tensor_rows,
                                         wsync_error_t *err)
{
    const int64_t B = WSYNC_MAP_FP8_BLOCK;
    const int expert = WSYNC_MAP_IS_EXPERT(tg->rule->part);
    const uint32_t base = expert ? 1 : 0;
    if (tg->rule->split == WSYNC_TP_REPLICATED || p->ndim != base + 2)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "tensor \"%s\": its engine parameter %s is fp8 but not a 2-D weight; "
                            "wsync quantizes linear weights",
                            t->name, tg->engine_name);
    const int64_t R = p->shape[base], C = p->shape[base + 1], E = expert ? p->shape[0] : 1;
    const size_t n = strlen(tg->engine_name);
    if (n < 6 || strcmp(tg->engine_name + n - 6, "weight") != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "fp8 parameter %s: its name does not end in \"weight\", so it has no "
                            "weight_scale_inv or weight_scale",
                            tg->engine_name);
    char sname[WSYNC_MAP_NAME_MAX];
    wsync_param_info_t sc;
    const int64_t SR = (R + B - 1) / B, SC = (C + B - 1) / B;
    uint32_t kind = WSYNC_QUANT_FP8_BLOCK;
    if (wsync_map_fp8_scale(eng, tg->engine_name, "_scale_inv", sname, &sc) == 0) {
        if (sc.dtype != WSYNC_DTYPE_F32 || sc.ndim != base + 2 || sc.shape[base] != SR ||
            sc.shape[base + 1] != SC || (expert && sc.shape[0] != E))
            return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                                "tensor \"%s\": the fp8 parameter %s needs its block scales %s as "
                                "float32 [%s%" PRId64 ", %" PRId64 "]; the engine has another one",
                                t->name, tg->engine_name, sname, expert ? "experts, " : "", SR, SC);
    } else if (wsync_map_fp8_scale(eng, tg->engine_name, "_scale", sname, &sc) == 0) {
        kind = wsync_map_fp8_scale_kind(&sc, base, E, R);
        if (kind == WSYNC_QUANT_NONE)
            return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                                "tensor \"%s\": the fp8 parameter %s has scales %s of a shape "
                                "wsync does not quantize to: float32 [%s%" PRId64
                                ", 1] is one per channel, [%s1] one per tensor",
                                t->name, tg->engine_name, sname, expert ? "experts, " : "", R,
                                expert ? "experts, " : "");
    } else {
        return WSYNC_RECORD(
            err, WSYNC_ERR_LAYOUT_MISMATCH,
            "tensor \"%s\": the fp8 parameter %s needs its block scales %s_scale_inv "
            "as float32 [%s%" PRId64 ", %" PRId64 "], or vLLM's %s (per channel "
            "[%s%" PRId64 ", 1], per tensor [%s1]); the engine has none",
            t->name, tg->engine_name, tg->engine_name, expert ? "experts, " : "", SR, SC, sname,
            expert ? "experts, " : "", R, expert ? "experts, " : "");
    }
    const int64_t src_start = tg->rule->split == WSYNC_TP_ROW ? g->src_col : g->src_row;
    if (kind == WSYNC_QUANT_FP8_BLOCK &&
        (g->dst_row % B != 0 || (g->dst_row + g->rows != R && (g->dst_row + g->rows) % B != 0) ||
         src_start % B != 0))
        return WSYNC_RECORD(
            err, WSYNC_ERR_INVALID_ARGUMENT,
            "tensor \"%s\": at tp %u (rank %u) its %s [%" PRId64 ", %" PRId64
            ") of %s do not start and end on 128 x 128 fp8 blocks: a block "
            "would straddle %s; use a TP size that keeps every slice "
            "block-aligned",
            t->name, size, rank, tg->rule->split == WSYNC_TP_ROW ? "HF columns" : "rows",
            tg->rule->split == WSYNC_TP_ROW ? src_start : g->dst_row,
            tg->rule->split == WSYNC_TP_ROW ? src_start + g->cols : g->dst_row + g->rows,
            tg->engine_name, src_start % B != 0 ? "two TP ranks" : "two tensors");
    const size_t ses = wsync_dtype_size(t->dtype);
    const int64_t e = expert ? tg->expert : 0;
    const uint64_t dst_off = (uint64_t)(g->dst_base + g->dst_row * C);
    const uint64_t s_off = kind == WSYNC_QUANT_FP8_BLOCK
                               ? 4u * (uint64_t)(e * SR * SC + g->dst_row / B * SC)
                           : kind == WSYNC_QUANT_FP8_CHANNEL ? 4u * (uint64_t)(e * R + g->dst_row)
                                                             : 4u * (uint64_t)e;
    memset(op, 0, sizeof(*op));
    op->dst = (uint8_t *)p->ptr + dst_off;
    op->dst_extent = (uint64_t)wsync_map_elems(p) - dst_off;
    op->rows = (uint64_t)g->rows;
    op->row_bytes = (uint64_t)g->cols * ses;
    op->dst_pitch = (uint64_t)C;
    if (tg->rule->split == WSYNC_TP_ROW) {
        op->src_pitch = (uint64_t)g->hf_cols * ses;
        op->src_offset = t->offset + (uint64_t)g->src_col * ses;
    } else {
        op->src_pitch = op->row_bytes;
        op->src_offset = t->offset + (uint64_t)(g->src_row * g->cols) * ses;
    }
    *q = (wsync_quant_t){.kind = kind,
                         .src_dtype = t->dtype,
                         .cols = (uint64_t)g->cols,
                         .scale_dst = (uint8_t *)sc.ptr + s_off,
                         .scale_pitch = kind == WSYNC_QUANT_FP8_BLOCK ? 4u * (uint64_t)SC : 4u,
                         .scale_extent = 4u * (uint64_t)wsync_map_elems(&sc) - s_off};
    if (tensor_rows != NULL)
        *tensor_rows = kind == WSYNC_QUANT_FP8_TENSOR ? (uint64_t)R : 0;
    return WSYNC_OK;
}

wsync_result_t wsync_map_plan(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                              const wsync_tensor_desc_t *t, wsync_copy_op_t *op, wsync_error_t *err)
{
    return wsync_map_plan_quant(table, eng, t, op, NULL, NULL, err);
}

wsync_result_t wsync_map_plan_quant(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                                    const wsync_tensor_desc_t *t, wsync_copy_op_t *op,
                                    wsync_quant_t *quant, uint64_t *tensor_rows, wsync_error_t *err)
{
    wsync_map_target_t tg;
    wsync_param_info_t p;
    wsync_model_dims_t d;
    wsync_map_geom_t g;
    uint32_t rank = 0, size = 1;
    size_t es;
    wsync_result_t rc;

    rc = wsync_map_resolve(table, t->name, &tg, err);
    if (rc != WSYNC_OK)
        return rc;
    memset(&p, 0, sizeof(p));
    if (eng->param(eng->user, tg.engine_name, &p) != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                            "unknown tensor \"%s\": it maps to engine parameter \"%s\", which "
                            "this %s engine does not have",
                            t->name, tg.engine_name, table->engine);
    if (quant != NULL)
        memset(quant, 0, sizeof(*quant));
    if (tensor_rows != NULL)
        *tensor_rows = 0;
    const int fp8 = quant != NULL && wsync_map_quantizable(t->dtype, p.dtype);
    if (t->dtype != p.dtype && !fp8)
        return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                            "wrong dtype for tensor \"%s\": got %s, the engine parameter %s is "
                            "%s; convert before sending (the engine does not cast; fp8 weights "
                            "quantize from bf16, f16 or f32)",
                            t->name, wsync_dtype_name(t->dtype), tg.engine_name,
                            wsync_dtype_name(p.dtype));
    memset(&d, 0, sizeof(d));
    eng->dims(eng->user, &d);
    eng->tp(eng->user, &rank, &size);
    if (size == 0 || rank >= size)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "engine reports tp rank %u of size %u",
                            rank, size);
    int skip = 0;
    if (WSYNC_MAP_IS_EXPERT(tg.rule->part)) {
        rc = wsync_map_experts(eng, &d, &p, t->name, &tg, &rank, &size, &skip, err);
        if (rc != WSYNC_OK)
            return rc;
    }
    rc = wsync_map_geometry(&tg, &p, &d, rank, size, &g, err);
    if (rc != WSYNC_OK)
        return rc;
    rc = wsync_map_check_shape(t, &tg, &p, &g, err);
    if (rc != WSYNC_OK)
        return rc;
    if (skip || g.rows == 0) { /* another EP rank's expert, or a rank past the vocabulary: checked,
                                  nothing to read or write here */
        memset(op, 0, sizeof(*op));
        op->dst = p.ptr;
        op->src_offset = t->offset;
        return WSYNC_OK;
    }
    if (g.cols != g.dst_cols && tg.rule->split != WSYNC_TP_ROW)
        return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                            "wrong shape for tensor \"%s\": %" PRId64
                            " columns, engine parameter %s has %" PRId64,
                            t->name, g.cols, tg.engine_name, g.dst_cols);
    if (g.dst_row + g.rows > g.param_rows && tg.rule->split == WSYNC_TP_COLUMN)
        return WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                            "tensor \"%s\" rows [%" PRId64 ", %" PRId64
                            ") fall outside engine parameter %s (%" PRId64
                            " rows); the engine's model dims disagree with its parameters",
                            t->name, g.dst_row, g.dst_row + g.rows, tg.engine_name, g.param_rows);

    if (fp8)
        return wsync_map_plan_fp8(eng, t, &tg, &p, &g, rank, size, op, quant, tensor_rows, err);
    es = wsync_dtype_size(p.dtype);
    uint64_t param_bytes = (uint64_t)wsync_map_elems(&p) * es;
    uint64_t dst_off = (uint64_t)(g.dst_base + g.dst_row * g.dst_cols) * es;
    memset(op, 0, sizeof(*op));
    op->dst = (uint8_t *)p.ptr + dst_off;
    op->dst_extent = param_bytes - dst_off;
    if (tg.rule->split == WSYNC_TP_ROW) {
        op->rows = (uint64_t)g.rows;
        op->row_bytes = (uint64_t)g.cols * es;
        op->src_pitch = (uint64_t)g.hf_cols * es;
        op->dst_pitch = (uint64_t)g.dst_cols * es;
        op->src_offset = t->offset + (uint64_t)g.src_col * es;
    } else {
        /* A contiguous range of whole rows: one 1-D op. */
        op->rows = 1;
        op->row_bytes = (uint64_t)(g.rows * g.cols) * es;
        op->src_pitch = op->dst_pitch = op->row_bytes;
        op->src_offset = t->offset + (uint64_t)(g.src_row * g.cols) * es;
    }
    if (t->has_digest && op->rows == 1 && op->row_bytes == t->nbytes) {
        op->digest = t->digest;
        op->has_digest = 1;
    }
    return WSYNC_OK;
}
