/* The reference engine's LoRA slots (docs/DESIGN.md §6): for the dense layout at TP size 1, a few
 * slots, each with one target per linear module of every layer in ENGINE layout: packed
 * qkv_proj (parts q/k/v_proj) and gate_up_proj (parts gate/up_proj), o_proj, down_proj; bf16,
 * max rank WSYNC_REF_LORA_MAX_RANK, two copies (the plugin loads the shadow, then switches
 * *active). Buffers come from the plugin's mem_alloc (engine memory).
 *
 * The expected slot bytes for an adapter of model/wsync_lora.h are computed here, independently
 * of the adapters library's plan: parts stacked along the rank, zero padding. Not thread safe. */
#ifndef WSYNC_REF_LORA_H
#define WSYNC_REF_LORA_H

#include <stddef.h>
#include <stdint.h>
#include "wsync_abi.h"
#include "wsync_lora.h"
#include "wsync_ref_layout.h"

#define WSYNC_REF_LORA_SLOTS 2
#define WSYNC_REF_LORA_MAX_RANK 64
#define WSYNC_REF_LORA_NAME_MAX 64

typedef struct wsync_ref_lora_slot {
    wsync_adapter_slot_t slot;
    wsync_adapter_target_t *targets;
    volatile int active;
    char name[WSYNC_REF_LORA_NAME_MAX]; /* "" = free */
} wsync_ref_lora_slot_t;

/* Memory helpers of the plugin (or malloc/memcpy when NULL). */
typedef struct wsync_ref_lora_mem {
    void *user;
    void *(*alloc)(void *user, size_t bytes); /* zero-filled */
    void (*free)(void *user, void *p);
    int (*read)(void *user, void *dst, const void *src, size_t bytes); /* engine -> host */
} wsync_ref_lora_mem_t;

typedef struct wsync_ref_lora {
    wsync_ref_lora_slot_t slots[WSYNC_REF_LORA_SLOTS];
    size_t n_slots; /* 0: this engine serves no LoRA (MoE layout or TP > 1) */
    size_t n_targets;
    char (*names)[WSYNC_REF_NAME_MAX];                      /* engine module name of each target */
    wsync_adapter_part_v1_t qkv_parts[3], gate_up_parts[2]; /* the same in every layer */
    wsync_ref_lora_mem_t mem;
    unsigned prefix_resets; /* reset_prefix_cache calls (tests) */
    char last_reset[WSYNC_REF_LORA_NAME_MAX];
} wsync_ref_lora_t;

/* 0, or -1 with why (out of memory). A layout without LoRA support builds zero slots. */
int wsync_ref_lora_build(wsync_ref_lora_t *r, const wsync_ref_layout_t *l,
                         const wsync_ref_lora_mem_t *mem, char *why, size_t len);
void wsync_ref_lora_free(wsync_ref_lora_t *r);

/* Registry callbacks (wsync_registry.h), user = the wsync_ref_lora_t. */
wsync_adapter_slot_t *wsync_ref_lora_slot(void *user, const char *name, int assign);
void wsync_ref_lora_loaded(void *user, const char *name, wsync_adapter_slot_t *slot);
void wsync_ref_lora_unloaded(void *user, const char *name);
void wsync_ref_lora_reset(void *user, const char *name);

/* The slot serving `name`, or NULL. */
wsync_ref_lora_slot_t *wsync_ref_lora_find(wsync_ref_lora_t *r, const char *name);

/* Tensors of `name`'s active copy (A and B of every target: 2 x n_targets in all) that equal
 * what adapter `a` at `version` must give, the target's rank and scaling included. *first_bad
 * (may be NULL) names the first mismatch. */
size_t wsync_ref_lora_verify(wsync_ref_lora_t *r, const char *name, const wsync_lora_t *a,
                             uint64_t version, char *first_bad, size_t len);

/* wsync64-based digest over both copies, ranks, scalings and *active of slot `s`. */
uint64_t wsync_ref_lora_digest(wsync_ref_lora_t *r, const wsync_ref_lora_slot_t *s);

#endif
