/* See reshard_fixture.h. */
#include "reshard_fixture.h"

#include <stdlib.h>
#include <string.h>

int engine_open(eng_t *e, const char *engine, const wsync_model_config_t *cfg, uint32_t rank,
                uint32_t size, uint32_t ep, char *why, size_t len)
{
    memset(e, 0, sizeof(*e));
    if (wsync_ref_layout_build(&e->l, engine, cfg, rank, size, why, len) != 0)
        return -1;
    const uint32_t ep_rank = ep > 1 ? rank / (size / ep) : 0;
    if (ep > 1 && (wsync_ref_layout_ep(&e->l, ep_rank, ep) != 0 ||
                   wsync_ref_layout_build(&e->whole, engine, cfg, rank % (size / ep), size / ep,
                                          why, len) != 0)) {
        wsync_ref_layout_free(&e->l);
        return -1;
    }
    e->view = (wsync_ref_view_t){.l = &e->l,
                                 .arena = calloc(1, e->l.arena_bytes),
                                 .ep_rank = ep_rank,
                                 .ep_size = ep > 1 ? ep : 1};
    if (e->view.arena == NULL) {
        wsync_ref_layout_free(&e->l);
        return -1;
    }
    e->ops = wsync_ref_view_ops(&e->view);
    return 0;
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
