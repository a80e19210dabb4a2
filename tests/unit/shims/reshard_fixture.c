/* See reshard_fixture.h. */
#include "reshard_fixture.h"

#include <stdlib.h>
#include <string.h>

int engine_open_ep(eng_t *e, const char *engine, const wsync_model_config_t *cfg, uint32_t rank,
                   uint32_t size, uint32_t ep_rank, uint32_t ep_size, uint32_t mtp_size, char *why,
                   size_t len)
{
    memset(e, 0, sizeof(*e));
    if (wsync_ref_layout_build(&e->l, engine, cfg, rank, size, why, len) != 0)
        return -1;
    if (ep_size > 1 && (wsync_ref_layout_ep(&e->l, ep_rank, ep_size, mtp_size) != 0 ||
                        wsync_ref_layout_build(&e->whole, engine, cfg, rank % mtp_size, mtp_size,
                                               why, len) != 0)) {
        wsync_ref_layout_free(&e->l);
        return -1;
    }
    e->view = (wsync_ref_view_t){.l = &e->l,
                                 .arena = calloc(1, e->l.arena_bytes),
                                 .ep_rank = ep_size > 1 ? ep_rank : 0,
                                 .ep_size = ep_size > 1 ? ep_size : 1,
                                 .mtp_size = ep_size > 1 ? mtp_size : 1};
    if (e->view.arena == NULL) {
        engine_close(e);
        return -1;
    }
    e->ops = wsync_ref_view_ops(&e->view);
    return 0;
}

int engine_open(eng_t *e, const char *engine, const wsync_model_config_t *cfg, uint32_t rank,
                uint32_t size, uint32_t ep, char *why, size_t len)
{
    return ep > 1 ? engine_open_ep(e, engine, cfg, rank, size, rank / (size / ep), ep, size / ep,
                                   why, len)
                  : engine_open_ep(e, engine, cfg, rank, size, 0, 1, 1, why, len);
}

void engine_close(eng_t *e)
{
    free(e->view.arena);
    wsync_ref_layout_free(&e->l);
    wsync_ref_layout_free(&e->whole);
}

int engine_expected(const eng_t *e, const wsync_ref_param_t *p, uint64_t version, void *dst)
{
    if (e->view.ep_size <= 1 || (p->kind != WSYNC_REF_W13 && p->kind != WSYNC_REF_W2)) {
        wsync_ref_expected(&e->l, p, version, dst);
        return 0;
    }
    long i = wsync_ref_layout_find(&e->whole, p->name);
    if (i < 0)
        return -1;
    const wsync_ref_param_t *w = &e->whole.params[i];
    unsigned char *all = malloc(w->nbytes);
    if (all == NULL)
        return -1;
    wsync_ref_expected(&e->whole, w, version, all);
    /* the linear placement: E / ep experts each, one more for the first E mod ep ranks */
    const int64_t n = e->l.dims.experts, per = n / e->view.ep_size, extra = n % e->view.ep_size;
    const int64_t r = e->view.ep_rank, first = r * per + (r < extra ? r : extra);
    const uint64_t each = w->nbytes / (uint64_t)n;
    memcpy(dst, all + (uint64_t)first * each, p->nbytes);
    free(all);
    return 0;
}

int segment_fill(const wsync_model_t *m, const wsync_reshard_piece_t *p, size_t np, uint32_t rank,
                 uint64_t version, unsigned char *seg)
{
    unsigned char *whole = malloc(m->max_nbytes ? m->max_nbytes : 1);
    if (whole == NULL)
        return -1;
    for (size_t k = 0; k < np; k++) {
        if (p[k].rank != rank)
            continue;
        const wsync_model_tensor_t *x = &m->tensors[p[k].tensor];
        const int64_t cols = x->ndim == 1 ? x->shape[0] : x->shape[1];
        wsync_model_fill(x, version, whole);
        for (int64_t r = 0; r < p[k].rows; r++)
            memcpy(seg + p[k].offset + (uint64_t)r * p[k].pitch,
                   whole + ((uint64_t)(p[k].r0 + r) * (uint64_t)cols + (uint64_t)p[k].c0) * 2u,
                   (uint64_t)p[k].cols * 2u);
    }
    free(whole);
    return 0;
}

wsync_tensor_desc_t *model_descs(const wsync_model_t *m)
{
    wsync_tensor_desc_t *t = calloc(m->n ? m->n : 1, sizeof(*t));
    for (size_t i = 0; t != NULL && i < m->n; i++) {
        const wsync_model_tensor_t *x = &m->tensors[i];
        t[i] = (wsync_tensor_desc_t){.struct_size = sizeof(t[i]),
                                     .name = x->name,
                                     .dtype = x->dtype,
                                     .ndim = x->ndim,
                                     .nbytes = x->nbytes};
        memcpy(t[i].shape, x->shape, sizeof(x->shape));
    }
    return t;
}

void model_descs_free(wsync_tensor_desc_t *t)
{
    free(t);
}
