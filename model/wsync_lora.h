/* The synthetic LoRA adapter of the demo: rank R on every linear module of a wsync_model layout
 * ("all-linear": q/k/v/o_proj, gate/up/down_proj of every layer, not lm_head), PEFT tensor names
 * ("base_model.model.<module>.lora_A.weight" [R, in], ".lora_B.weight" [out, R]), bf16. Contents
 * are a pure function of (module, version) with values exact in bf16, so the engine can check a
 * slot against the content it must hold without trusting the plugin. */
#ifndef WSYNC_LORA_H
#define WSYNC_LORA_H

#include <stddef.h>
#include <stdint.h>
#include "wsync_model.h"

#define WSYNC_LORA_NAME_MAX 112

typedef struct wsync_lora_module {
    char module[WSYNC_MODEL_NAME_MAX]; /* "model.layers.0.self_attn.q_proj" */
    char name_a[WSYNC_LORA_NAME_MAX];  /* PEFT names */
    char name_b[WSYNC_LORA_NAME_MAX];
    int64_t in, out; /* of the base weight [out, in] */
} wsync_lora_module_t;

typedef struct wsync_lora {
    uint32_t rank;
    double alpha;
    wsync_lora_module_t *modules;
    size_t n;
    uint64_t bytes; /* sum of A and B bytes (bf16) */
} wsync_lora_t;

/* The modules of `model` that all-linear targets (2-D *_proj weights of the layers). 0, or -1
 * with `why`. */
int wsync_lora_build(wsync_lora_t *l, const wsync_model_t *model, uint32_t rank, char *why,
                     size_t len);
void wsync_lora_free(wsync_lora_t *l);

/* adapter_config.json text (malloc'd): r, lora_alpha, target_modules "all-linear". */
char *wsync_lora_config_json(const wsync_lora_t *l);

/* Version `version` of module m's A ([rank, in]) or B ([out, rank]) as bf16 into dst. */
void wsync_lora_fill(const wsync_lora_t *l, size_t m, int b, uint64_t version, uint16_t *dst);

/* The engine slot copy of module m for `version`: A [max_rank, in] / B [out, max_rank] with the
 * adapter's rank in the leading rows / columns and zeros elsewhere. */
void wsync_lora_expected(const wsync_lora_t *l, size_t m, int b, uint64_t version,
                         uint32_t max_rank, uint16_t *dst);

/* Write a PEFT directory into existing `dir`: adapter_config.json (target_modules listing the
 * modules' last components, plus that of `extra_module`) and adapter_model.safetensors with the
 * tensors of `version` as `dtype` (BF16 as generated; F32: the same values, exactly; I32: the F32
 * bit patterns as integers, for refusal tests). `extra_module` (may be NULL), a full module path,
 * adds one more A/B pair with module 0's shapes: a module the engine may lack. 0, or -1 with `why`.
 * Blocking (file I/O). */
int wsync_lora_write_dir(const wsync_lora_t *l, uint64_t version, const char *dir,
                         wsync_dtype_t dtype, const char *extra_module, char *why, size_t len);

#endif
