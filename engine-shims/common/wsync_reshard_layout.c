/* The trainer layouts of wsync_reshard_trainer_layout (see wsync_reshard.h): TP as the mapping's
 * rule for each tensor splits it, FSDP2 chunks of dim 0, PP stages of layers, DP replicas. */
#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_reshard.h"

/* The decoder layer of an HF name ("model.layers.<n>."), or -1. */
static long layer_of(const char *name)
{
    const char *at = strstr(name, "layers.");
    if (at == NULL)
        return -1;
    char *end = NULL;
    long n = strtol(at + 7, &end, 10);
    return end != at + 7 && *end == '.' ? n : -1;
}

/* The stage of `layer` when `layers` layers run over pp stages in contiguous runs; a tensor
 * outside the layers: embeddings on the first stage, everything else on the last. */
static uint32_t stage_of(const char *name, long layer, long layers, uint32_t pp)
{
    if (layer < 0)
        return strstr(name, "embed_tokens") != NULL ? 0 : pp - 1;
    for (uint32_t s = 0; s + 1 < pp; s++)
        if (layer < (long)(((int64_t)(s + 1) * layers) / pp))
            return s;
    return pp - 1;
}

typedef struct pieces {
    wsync_reshard_piece_t *p;
    size_t n, cap;
} pieces_t;

static int push(pieces_t *v, const wsync_reshard_piece_t *x)
{
    if (v->n == v->cap) {
        const size_t cap = v->cap ? 2 * v->cap : 1024;
        wsync_reshard_piece_t *g = realloc(v->p, cap * sizeof(*g));
        if (g == NULL)
            return -1;
        v->p = g, v->cap = cap;
    }
    v->p[v->n++] = *x;
    return 0;
}

/* The TP shard of rank tp_i of a rows x cols tensor split as `split` says: *r0, *nr, *c0, *nc. */
static wsync_result_t tp_shard(const wsync_map_target_t *tg, const char *name, int64_t rows,
                               int64_t cols, const wsync_reshard_trainer_t *t, uint32_t tp_i,
                               int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc,
                               wsync_error_t *err)
{
    const uint32_t tp = t->tp;
    *r0 = 0, *nr = rows, *c0 = 0, *nc = cols;
    if (tp == 1 || tg->rule->split == WSYNC_TP_REPLICATED)
        return WSYNC_OK;
    const int kv = tg->rule->part == WSYNC_PART_K || tg->rule->part == WSYNC_PART_V;
    if (kv && t->kv_heads > 0 && t->kv_heads % tp != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "reshard: tensor %s: trainer tp %u does not divide its %lld kv heads "
                            "(Megatron splits whole query groups)",
                            name, tp, (long long)t->kv_heads);
    if (tg->rule->split == WSYNC_TP_COLUMN) {
        if (rows % tp != 0)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "reshard: tensor %s: trainer tp %u does not divide its %lld rows",
                                name, tp, (long long)rows);
        *nr = rows / tp, *r0 = (int64_t)tp_i * *nr;
    } else {
        if (cols % tp != 0)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "reshard: tensor %s: trainer tp %u does not divide its %lld "
                                "columns",
                                name, tp, (long long)cols);
        *nc = cols / tp, *c0 = (int64_t)tp_i * *nc;
    }
    return WSYNC_OK;
}

/* FSDP2's chunk f of n (ceil(n / fsdp) each; the last ones shorter or empty): [*start, +*len). */
static void fsdp_chunk(int64_t n, uint32_t fsdp, uint32_t f, int64_t *start, int64_t *len)
{
    const int64_t chunk = (n + fsdp - 1) / fsdp, s = (int64_t)f * chunk;
    *start = s < n ? s : n;
    *len = s + chunk < n ? chunk : n - *start;
}

wsync_result_t wsync_reshard_trainer_layout(const wsync_map_table_t *table,
                                            const wsync_reshard_trainer_t *t,
                                            const wsync_tensor_desc_t *tensors, size_t n,
                                            wsync_reshard_piece_t **pieces, size_t *n_pieces,
                                            uint64_t *seg_bytes, wsync_error_t *err)
{
    if (table == NULL || t == NULL || (n > 0 && tensors == NULL) || pieces == NULL ||
        n_pieces == NULL || t->tp == 0 || t->fsdp == 0 || t->dp == 0 || t->pp == 0)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "reshard: a trainer layout needs tp, fsdp, dp and pp of at least 1");
    const uint32_t world = t->tp * t->fsdp * t->dp * t->pp;
    uint64_t *seg = calloc(world, sizeof(*seg));
    if (seg == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "reshard: %u ranks", world);
    const uint32_t ep = t->ep > 1 ? t->ep : 1;
    if (t->fsdp % ep != 0) {
        free(seg);
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "reshard: trainer ep %u does not divide fsdp %u (EP ranks are fsdp "
                            "ranks)",
                            ep, t->fsdp);
    }
    long layers = 0;
    int64_t experts = 0;
    for (size_t i = 0; i < n; i++) {
        if (layer_of(tensors[i].name) + 1 > layers)
            layers = layer_of(tensors[i].name) + 1;
        const int64_t x = ep > 1 ? wsync_map_expert_of(table, tensors[i].name) : -1;
        experts = x + 1 > experts ? x + 1 : experts;
    }
    pieces_t v = {0};
    wsync_result_t rc = WSYNC_OK;
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++) {
        const wsync_tensor_desc_t *x = &tensors[i];
        const size_t es = wsync_dtype_size(x->dtype);
        if ((x->ndim != 1 && x->ndim != 2) || es == 0) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                              "reshard: tensor %s has %u dims or dtype %d; trainer layouts take "
                              "1-D and 2-D tensors of a sized dtype",
                              x->name, x->ndim, (int)x->dtype);
            break;
        }
        wsync_map_target_t tg;
        if ((rc = wsync_map_resolve(table, x->name, &tg, err)) != WSYNC_OK)
            break;
        const int64_t rows = x->ndim == 1 ? 1 : x->shape[0];
        const int64_t cols = x->ndim == 1 ? x->shape[0] : x->shape[1];
        const uint32_t stage = stage_of(x->name, layer_of(x->name), layers, t->pp);
        const int64_t expert = ep > 1 ? wsync_map_expert_of(table, x->name) : -1;
        const uint32_t owner = expert >= 0 ? wsync_map_ep_owner(experts, ep, expert) : 0;
        /* an expert under EP: held by the fsdp ranks of its EP rank, chunked over them */
        const uint32_t chunks = expert >= 0 ? t->fsdp / ep : t->fsdp;
        for (uint32_t d = 0; d < t->dp && rc == WSYNC_OK; d++)
            for (uint32_t f = 0; f < t->fsdp && rc == WSYNC_OK; f++)
                for (uint32_t k = 0; k < t->tp && rc == WSYNC_OK; k++) {
                    if (expert >= 0 && f % ep != owner)
                        break;
                    const uint32_t chunk = expert >= 0 ? f / ep : f;
                    int64_t r0, nr, c0, nc, s, len;
                    if ((rc = tp_shard(&tg, x->name, rows, cols, t, k, &r0, &nr, &c0, &nc, err)) !=
                        WSYNC_OK)
                        break;
                    if (rows == 1) { /* a 1-D tensor: FSDP chunks its elements */
                        fsdp_chunk(nc, chunks, chunk, &s, &len);
                        c0 += s, nc = len;
                    } else {
                        fsdp_chunk(nr, chunks, chunk, &s, &len);
                        r0 += s, nr = len;
                    }
                    if (nr == 0 || nc == 0)
                        continue;
                    const uint32_t rank = k + t->tp * (f + t->fsdp * (d + t->dp * stage));
                    const uint64_t at =
                        (seg[rank] + WSYNC_MAP_ALIGN - 1) / WSYNC_MAP_ALIGN * WSYNC_MAP_ALIGN;
                    const wsync_reshard_piece_t pc = {.rank = rank,
                                                      .tensor = i,
                                                      .r0 = r0,
                                                      .rows = nr,
                                                      .c0 = c0,
                                                      .cols = nc,
                                                      .offset = at,
                                                      .pitch = (uint64_t)nc * es};
                    seg[rank] = at + (uint64_t)nr * (uint64_t)nc * es;
                    if (push(&v, &pc) != 0)
                        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "reshard: %zu pieces", v.n);
                }
    }
    if (rc == WSYNC_OK && seg_bytes != NULL)
        memcpy(seg_bytes, seg, world * sizeof(*seg));
    free(seg);
    if (rc != WSYNC_OK) {
        free(v.p);
        return rc;
    }
    *pieces = v.p;
    *n_pieces = v.n;
    return WSYNC_OK;
}
