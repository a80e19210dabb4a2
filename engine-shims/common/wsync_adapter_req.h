/* LoRA requests the three shims share (docs/DESIGN.md §6): loading an adapter by name from a PEFT
 * directory or from the tensors of a producer buffer (a FlattenedTensorBucket plus the
 * adapter_config.json), and unloading it. Each shim parses its own engine's message and calls
 * these; they end in the driver (wsync_driver_load_adapter), where the plugin loads the slot's
 * shadow copy and switches *active (an upsert without a gap).
 *
 * Ownership: json_t* arguments are borrowed; *extra (may stay NULL) is a new reference merged
 * into the OK reply. Not thread safe (one shim context per engine worker). */
#ifndef WSYNC_ADAPTER_REQ_H
#define WSYNC_ADAPTER_REQ_H

#include <jansson.h>
#include "wsync_shim.h"

/* Load `name`: from `path`, or from `bucket` (the FlattenedTensorBucket of this TP rank, tensors
 * named as PEFT saves them) with `config` (adapter_config.json as a JSON object or as its text).
 * With reset_on_reload, a same-name reload calls the engine's prefix-cache reset for `name`.
 * *extra gets {"lora_name", "reloaded"}. */
wsync_result_t wsync_adapter_req_load(wsync_shim_ctx_t *ctx, const char *name, const char *path,
                                      json_t *bucket, json_t *config, int reset_on_reload,
                                      json_t **extra, wsync_error_t *err);

/* Unload `name`. NOT_FOUND when it is not loaded. */
wsync_result_t wsync_adapter_req_unload(wsync_shim_ctx_t *ctx, const char *name, json_t **extra,
                                        wsync_error_t *err);

/* For encoders: the config text as a JSON object (new reference), or NULL with err. */
json_t *wsync_adapter_req_config(const char *config, wsync_error_t *err);

#endif
