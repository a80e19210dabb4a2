/* The trainer side of an adapter-only sync through a shim (`wsync-engine demo --lora`): the
 * synthetic adapter of model/wsync_lora.h, version k per sync, delivered in the engine's own LoRA
 * request format to one reference engine (TP size 1). SGLang takes the tensors themselves: one
 * retained FIXED_LAYOUT staging, refreshed in place after wait_consumed of the previous
 * generation (docs/DESIGN.md §1.2). vLLM and LMDeploy load from a path: a PEFT directory (bf16)
 * rewritten per sync. Either way no base weight moves. Not thread safe. */
#ifndef WSYNC_REF_LORA_TRAINER_H
#define WSYNC_REF_LORA_TRAINER_H

#include "wsync_lora.h"
#include "wsync_ref_trainer.h"

typedef struct wsync_ref_lora_trainer_config {
    const char *engine; /* shim */
    const char *plugin; /* the trainer's plugin (its producer) */
    wsync_model_config_t model;
    uint32_t rank;
    uint32_t timeout_ms;
} wsync_ref_lora_trainer_config_t;

typedef struct wsync_ref_lora_trainer {
    wsync_ref_lora_trainer_config_t cfg;
    const wsync_shim_t *shim;
    wsync_loader_t loader;
    wsync_host_t host;
    wsync_consumer_t *mem; /* memory helpers */
    wsync_staging_t *staging;
    void *src;
    wsync_stage_tensor_t *stage;
    wsync_model_t model;
    wsync_lora_t lora;
    char *config;
    char dir[64];
} wsync_ref_lora_trainer_t;

int wsync_ref_lora_trainer_open(wsync_ref_lora_trainer_t *t,
                                const wsync_ref_lora_trainer_config_t *cfg, char *why, size_t len);
/* Deliver version k as adapter `name` to rank 0 and wait for the reply (and, for tensors, for
 * *consumed*). *moved gets the adapter bytes the engine read. 0, or -1 after printing why. */
int wsync_ref_lora_trainer_sync(wsync_ref_lora_trainer_t *t, const char *name, uint64_t k,
                                const wsync_ref_transport_t *tr, uint64_t *moved);
/* Retire the staging (after the engine released its mapping) and remove the directory. */
void wsync_ref_lora_trainer_close(wsync_ref_lora_trainer_t *t);

#endif
