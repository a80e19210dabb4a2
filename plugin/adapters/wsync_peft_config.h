/* PEFT's adapter_config.json for LoRA: the fields that decide what the adapter's tensors mean.
 *
 * Supported: r, lora_alpha, use_rslora, target_modules (list of names or full paths, a regex
 * string, or "all-linear"), exclude_modules, rank_pattern, alpha_pattern. Refused by name:
 * bias other than "none", non-empty modules_to_save, use_dora, fan_in_fan_out, lora_bias,
 * layer_replication, target_parameters, peft_type other than LORA. Other keys are ignored. */
#ifndef WSYNC_ADAPTERS_PEFT_CONFIG_H
#define WSYNC_ADAPTERS_PEFT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

typedef struct wsync_peft_config wsync_peft_config_t;

/* Parse and validate `len` bytes of JSON. Errors: BAD_ADAPTER naming the field and value,
 * NOT_SUPPORTED for a valid PEFT feature wsync cannot serve, OUT_OF_MEMORY. *out is owned by
 * the caller (wsync_peft_config_free). */
wsync_result_t wsync_peft_config_parse(const char *json, size_t len, wsync_peft_config_t **out,
                                       wsync_error_t *err);
void wsync_peft_config_free(wsync_peft_config_t *cfg);

/* True when PEFT would have put a LoRA layer on `module` (its path relative to the base model,
 * e.g. "model.layers.0.self_attn.q_proj"): list entries match the whole path or its last
 * dot-separated components; a string is matched against the whole path (re.fullmatch);
 * "all-linear" matches everything but "lm_head"; exclude_modules wins over target_modules. */
int wsync_peft_config_targets(const wsync_peft_config_t *cfg, const char *module);

/* Rank and alpha of `module`: the first rank_pattern / alpha_pattern key K (in file order) for
 * which the path matches (.*\.)?(K) as a whole, as PEFT's get_pattern_key does; else r and
 * lora_alpha. */
uint32_t wsync_peft_config_rank(const wsync_peft_config_t *cfg, const char *module);
double wsync_peft_config_alpha(const wsync_peft_config_t *cfg, const char *module);

/* alpha / rank, or alpha / sqrt(rank) with use_rslora. rank must be > 0. */
double wsync_peft_config_scaling(const wsync_peft_config_t *cfg, uint32_t rank, double alpha);

int wsync_peft_config_use_rslora(const wsync_peft_config_t *cfg);

#endif
