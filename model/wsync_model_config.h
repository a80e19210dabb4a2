/* Tensor lists from Hugging Face configs: a config.json's text, or one of the two built-in
 * layouts (configs of Qwen3-8B and Qwen3-30B-A3B, shrunk by a scale). See wsync_model.h. */
#ifndef WSYNC_MODEL_CONFIG_H
#define WSYNC_MODEL_CONFIG_H

#include <stddef.h>

#include "wsync_model.h"

/* The tensor list of a Hugging Face config (config.json text, json_len bytes). -1 with `why`
 * naming what is wrong: not JSON, an unknown model_type (named), a size missing. */
int wsync_model_from_config(wsync_model_t *m, const char *json, size_t json_len, char *why,
                            size_t len);
/* A built-in layout ("dense" or "moe") at `scale`, `layers` (0: the real model's). */
int wsync_model_from_layout(wsync_model_t *m, const char *layout, unsigned scale, unsigned layers,
                            char *why, size_t len);

#endif
