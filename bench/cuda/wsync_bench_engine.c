/* See wsync_bench_engine.h. */
#include "wsync_bench_engine.h"

#include <string.h>

void wb_recv_expect(int fd, const char *what, char **out)
{
    char *m = NULL;
    if (wh_recv(fd, &m, NULL) != 0) {
        fprintf(stderr, "wsync-bench-cuda: peer closed while waiting for %s\n", what);
        exit(1);
    }
    *out = m;
}

void wb_stage_pieces(const wsync_plugin_t *p, wsync_staging_t *s, cudaStream_t st,
                     const wb_layout_t *l, const wb_plan_t *plan, size_t b, unsigned char *trainer,
                     unsigned char *const *bases)
{
    const wb_bucket_t *bk = &plan->b[b];
    wsync_stage_tensor_t *t = calloc(bk->count, sizeof(*t));
    char(*names)[128] = calloc(bk->count, sizeof(*names));
    for (size_t k = 0; k < bk->count; k++) {
        const wb_piece_t *pc = &plan->p[bk->first + k];
        const wb_tensor_t *x = &l->t[pc->tensor];
        wb_piece_name(l, pc, names[k], sizeof(names[k]));
        t[k].struct_size = sizeof(t[k]);
        t[k].name = names[k];
        t[k].dtype = WSYNC_DTYPE_BF16;
        t[k].ndim = 2;
        t[k].shape[0] = pc->rows;
        t[k].shape[1] = x->cols;
        t[k].src = (bases ? bases[pc->tensor] : trainer + x->offset) +
                   (uint64_t)pc->r0 * (uint64_t)x->cols * 2u;
    }
    WB_OK(p->producer->stage(s, st, t, bk->count, err));
    free(t);
    free(names);
}

unsigned long long wb_count_bad(wb_engine_t *E, unsigned long long *bad_dev)
{
    WB_CK(cudaMemsetAsync(bad_dev, 0, sizeof(*bad_dev), E->st));
    for (size_t i = 0; i < E->l.n; i++)
        WB_CK(wh_count_bad_mask(E->dst[i], E->l.t[i].bytes, WB_SEED + E->l.t[i].offset / 8,
                                WB_FILL_MASK, bad_dev, E->st));
    unsigned long long bad = 0;
    WB_CK(cudaMemcpyAsync(&bad, bad_dev, sizeof(bad), cudaMemcpyDeviceToHost, E->st));
    WB_CK(cudaStreamSynchronize(E->st));
    return bad;
}

/* ops of bucket b of `plan` against the parsed manifest m: the producer packs in its own order
 * (the engine's fused parameters side by side), so pieces are found by name on a bucket's first
 * sight and checked after */
wsync_copy_op_t *wb_bucket_ops(wb_engine_t *E, wb_plan_t *plan, size_t b, const wsync_manifest_t *m)
{
    const wb_bucket_t *bk = &plan->b[b];
    char why[256];
    if (m->n_tensors != bk->count || plan->at == NULL ||
        (bk->count > 0 && plan->at[bk->first] == SIZE_MAX)) {
        const char **names = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*names));
        for (size_t k = 0; names != NULL && k < m->n_tensors; k++)
            names[k] = m->tensors[k].name;
        int rc = names != NULL
                     ? wb_plan_learn(&E->l, plan, b, names, m->n_tensors, why, sizeof(why))
                     : (snprintf(why, sizeof(why), "no memory"), -1);
        free(names);
        if (rc != 0) {
            fprintf(stderr, "wsync-bench-cuda: %s\n", why);
            exit(1);
        }
    }
    wsync_copy_op_t *ops = calloc(bk->count, sizeof(*ops));
    for (size_t k = 0; k < bk->count; k++) {
        const wb_piece_t *pc = &plan->p[plan->at[bk->first + k]];
        const wb_tensor_t *x = &E->l.t[pc->tensor];
        if (strncmp(m->tensors[k].name, x->name, strlen(x->name)) != 0) {
            fprintf(stderr, "wsync-bench-cuda: manifest tensor %s is not %s\n", m->tensors[k].name,
                    x->name);
            exit(1);
        }
        uint64_t skip = (uint64_t)pc->r0 * (uint64_t)x->cols * 2u;
        ops[k].src_offset = m->tensors[k].offset;
        ops[k].rows = 1;
        ops[k].row_bytes = m->tensors[k].nbytes;
        ops[k].src_pitch = ops[k].dst_pitch = ops[k].row_bytes;
        ops[k].dst = (unsigned char *)E->dst[pc->tensor] + skip;
        ops[k].dst_extent = x->bytes - skip;
        ops[k].digest = m->tensors[k].digest;
        ops[k].has_digest = m->tensors[k].has_digest;
    }
    return ops;
}

int wb_params_alloc(wb_engine_t *E, int fused)
{
    if (wb_layout_group(&E->l, fused) != 0)
        return -1;
    E->groups = calloc(E->l.n_groups, sizeof(*E->groups));
    E->dst = calloc(E->l.n, sizeof(*E->dst));
    if (E->groups == NULL || E->dst == NULL)
        return -1;
    for (size_t g = 0; g < E->l.n_groups; g++)
        WB_CK(cudaMalloc(&E->groups[g], E->l.group_bytes[g] ? E->l.group_bytes[g] : 1));
    for (size_t i = 0; i < E->l.n; i++)
        E->dst[i] = (unsigned char *)E->groups[E->l.t[i].group] + E->l.t[i].goff;
    return 0;
}

void wb_params_free(wb_engine_t *E)
{
    for (size_t g = 0; g < E->l.n_groups; g++)
        WB_CK(cudaFree(E->groups[g]));
    free(E->groups);
    free(E->dst);
    E->groups = NULL;
    E->dst = NULL;
}

void wb_params_print(const wb_engine_t *E, int fused)
{
    if (fused)
        printf("  engine parameters: fused (qkv, gate_up, experts w13/w2 per layer): %zu "
               "allocations for %zu tensors\n",
               E->l.n_groups, E->l.n);
    else
        printf("  engine parameters: separate: one cudaMalloc per tensor (%zu)\n", E->l.n_groups);
}
