/* The fusion table: which Hugging Face tensors the engines (SGLang, vLLM, LMDeploy) fuse into one
 * parameter, and in which order. One owner of the rule, read by the packer (wsync_pack_order.h),
 * the benchmarks, and checked against the engine shims' mapping tables, which name the fused
 * parameters and their tensor-parallel splits (tests/unit/shims/torture_shim_fusion.c):
 *
 *   X.q_proj.S, X.k_proj.S, X.v_proj.S                 -> qkv:     q, k, v
 *   X.gate_proj.S, X.up_proj.S                         -> gate_up: gate, up
 *   X.experts.E.{gate_proj|w1, up_proj|w3}.S           -> w13:     per expert E, gate, up
 *   X.experts.E.{down_proj|w2}.S                       -> w2:      per expert E
 *
 * Pure functions on names; thread safe. */
#ifndef WSYNC_COMMON_FUSION_H
#define WSYNC_COMMON_FUSION_H

#include <stddef.h>
#include <stdint.h>

typedef enum wsync_fuse {
    WSYNC_FUSE_NONE = 0, /* the tensor is a parameter of its own */
    WSYNC_FUSE_QKV = 1,
    WSYNC_FUSE_GATE_UP = 2,
    WSYNC_FUSE_W13 = 3,
    WSYNC_FUSE_W2 = 4
} wsync_fuse_t;
#define WSYNC_FUSE_KINDS 5

/* Where a tensor goes: its fused parameter's kind, its part there (q 0, k 1, v 2; gate 0, up
 * 1), its expert (-1 outside a stack of experts), the group's prefix name[0, prefix_len) (X
 * above; the whole name when it stands alone) and what follows the projection's name (S:
 * "weight", "bias", ...; "" when it stands alone). */
typedef struct wsync_fusion {
    wsync_fuse_t kind;
    int part;
    int64_t expert;
    size_t prefix_len;
    const char *suffix;
} wsync_fusion_t;

/* The fusion of HF tensor `name` (never NULL). */
wsync_fusion_t wsync_fusion_of(const char *name);

#endif
