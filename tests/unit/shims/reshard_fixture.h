/* What the resharding tests share: an engine rank of the reference engine's layout with its
 * parameters in a zeroed arena, and the model's tensors as descriptors. */
#ifndef RESHARD_FIXTURE_H
#define RESHARD_FIXTURE_H

#include "wsync_ref_layout.h"
#include "wsync_reshard.h"

typedef struct eng {
    wsync_ref_layout_t l;
    wsync_ref_layout_t whole; /* with EP: the MoE TP group's layout its experts come from */
    wsync_ref_view_t view;
    wsync_engine_ops_t ops;
} eng_t;

/* Engine rank `rank` of `size`, EP `ep` inside its TP group (1: none; EP rank rank / (size /
 * ep)): 0, or -1 with why. engine_close frees it. */
int engine_open(eng_t *e, const char *engine, const wsync_model_config_t *cfg, uint32_t rank,
                uint32_t size, uint32_t ep, char *why, size_t len);
/* The same with any EP arrangement: EP rank ep_rank of ep_size, MoE TP group of mtp_size. */
int engine_open_ep(eng_t *e, const char *engine, const wsync_model_config_t *cfg, uint32_t rank,
                   uint32_t size, uint32_t ep_rank, uint32_t ep_size, uint32_t mtp_size, char *why,
                   size_t len);
void engine_close(eng_t *e);
/* The bytes parameter p of e must hold after weight version `version`: the reference engine's,
 * and with EP its experts' share of the layout of its MoE TP group (rank % mtp_size of
 * mtp_size), computed from the whole tensors. */
int engine_expected(const eng_t *e, const wsync_ref_param_t *p, uint64_t version, void *dst);

/* Trainer rank `rank`'s pieces of version `version` of the model, written into its segment seg
 * where the pieces place them: 0, or -1 out of memory. */
int segment_fill(const wsync_model_t *m, const wsync_reshard_piece_t *p, size_t np, uint32_t rank,
                 uint64_t version, unsigned char *seg);

/* The model's tensors as descriptors (names point into m; model_descs_free them), NULL out of
 * memory. (Allocated here, outside the tests' cmocka allocator.) */
wsync_tensor_desc_t *model_descs(const wsync_model_t *m);
void model_descs_free(wsync_tensor_desc_t *t);

#endif
