/* See reshard_fixture.h. */
#include "reshard_fixture.h"

#include <stdlib.h>
#include <string.h>

int engine_open(eng_t *e, const char *engine, const wsync_model_config_t *cfg, uint32_t rank,
                uint32_t size, char *why, size_t len)
{
    memset(e, 0, sizeof(*e));
    if (wsync_ref_layout_build(&e->l, engine, cfg, rank, size, why, len) != 0)
        return -1;
    e->view = (wsync_ref_view_t){.l = &e->l, .arena = calloc(1, e->l.arena_bytes)};
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
