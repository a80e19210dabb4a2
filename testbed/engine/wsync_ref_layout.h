/* The reference engine's parameters: the synthetic model (model/wsync_model.h, HF names) in
 * ENGINE layout for one TP rank — fused qkv_proj and gate_up_proj, fused experts, vocab and
 * projection shards — and, written independently of the shims' mapping tables, the bytes each
 * parameter must hold after a sync of weight version k. The conformance suite and
 * `wsync-engine` check the shims against it. */
#ifndef WSYNC_REF_LAYOUT_H
#define WSYNC_REF_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include "wsync_model.h"
#include "wsync_registry.h"

#define WSYNC_REF_NAME_MAX 96

typedef enum wsync_ref_kind {
    WSYNC_REF_REPLICATED, /* norms, router: the HF tensor */
    WSYNC_REF_VOCAB,      /* embed_tokens, lm_head: rows of this rank */
    WSYNC_REF_QKV,
    WSYNC_REF_ROWSHARD, /* o_proj, down_proj: columns of this rank */
    WSYNC_REF_GATE_UP,
    WSYNC_REF_W13,
    WSYNC_REF_W2
} wsync_ref_kind_t;

typedef struct wsync_ref_param {
    char name[WSYNC_REF_NAME_MAX]; /* engine name */
    char hf[WSYNC_REF_NAME_MAX];   /* HF name (prefix for fused params: "model.layers.3.") */
    wsync_ref_kind_t kind;
    uint32_t ndim;
    int64_t shape[3];
    uint64_t nbytes;
    uint64_t offset; /* in the engine's parameter arena (256-byte aligned) */
} wsync_ref_param_t;

typedef struct wsync_ref_layout {
    wsync_model_t model; /* the HF side */
    wsync_model_dims_t dims;
    char engine[16];
    uint32_t rank, size;
    wsync_ref_param_t *params;
    size_t n;
    uint64_t arena_bytes;
    size_t *slots, nslots; /* name index (wsync_model_hash): param index + 1, 0 = empty */
} wsync_ref_layout_t;

/* Build for engine "sglang" | "vllm" | "lmdeploy", layout cfg, rank r of n. 0 or -1 with why. */
int wsync_ref_layout_build(wsync_ref_layout_t *l, const char *engine,
                           const wsync_model_config_t *cfg, uint32_t rank, uint32_t size, char *why,
                           size_t len);
void wsync_ref_layout_free(wsync_ref_layout_t *l);
long wsync_ref_layout_find(const wsync_ref_layout_t *l, const char *name);

/* Expert parallelism on a built layout (TP rank r of size n): the fused experts become EP rank
 * ep_rank's share of ep_size in the linear placement (rank r of s holds E / s experts, one more
 * when r < E mod s, in order: docs/SHIMS.md), by local index, split over a MoE TP group of
 * mtp_size ranks (rank r mod mtp_size of it): mtp_size n / ep_size is SGLang's EP inside its TP
 * group, 1 with EP across replicas (DP attention). Offsets and the arena are laid out again.
 * wsync_ref_expected does not know EP: an expert parameter's bytes are the MoE TP group's
 * layout's, experts [first, first + count). 0, or -1 when mtp_size does not divide n. */
int wsync_ref_layout_ep(wsync_ref_layout_t *l, uint32_t ep_rank, uint32_t ep_size,
                        uint32_t mtp_size);

/* A layout's parameters at `arena` as an engine's registry answers for them — param (bf16, the
 * layout's shapes), tp (the layout's rank and size) and dims: what the reference engine and the
 * tests plan against. wsync_ref_view_ops fills those three members, user = view. */
typedef struct wsync_ref_view {
    const wsync_ref_layout_t *l;
    unsigned char *arena;
    uint32_t ep_rank, ep_size, mtp_size; /* ep_size > 1 (wsync_ref_layout_ep): moe too */
} wsync_ref_view_t;
int wsync_ref_view_param(const wsync_ref_view_t *v, const char *name, wsync_param_info_t *out);
wsync_engine_ops_t wsync_ref_view_ops(wsync_ref_view_t *v);

/* The bytes parameter p must hold after weight version `version` (host memory, p->nbytes). */
void wsync_ref_expected(const wsync_ref_layout_t *l, const wsync_ref_param_t *p, uint64_t version,
                        void *dst);

#endif
