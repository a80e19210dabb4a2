/* SGLang shim. Mirrors Engine.update_weights_from_tensor(UpdateWeightsFromTensorReqInput):
 *   {"method": "update_weights_from_tensor",
 *    "serialized_named_tensors": [<bucket of TP rank 0>, <rank 1>, ...],   (or one for all)
 *    "load_format": "flattened_bucket", "flush_cache": true, "weight_version": "step-7"}
 * where a bucket is a FlattenedTensorBucket (wsync_request.h), as any SGLang trainer sends it;
 * or, with "load_format": "wsync_manifest" (what wsync's own encoder sends), each rank's entry is
 * the manifest text publish returned, handed to the plugin as is (no decode, rebuild and
 * re-parse of every tensor's description: docs/PERFORMANCE.md). Names are HF checkpoint names;
 * the engine maps them with its stacked_params_mapping (q/k/v -> qkv_proj, gate/up ->
 * gate_up_proj) and expert_params_mapping (experts -> w13_weight / w2_weight), then narrows for
 * its TP rank. flush_cache runs the engine's flush hook after the copies are done.
 *
 * LoRA (LoadLoRAAdapterReqInput, LoadLoRAAdapterFromTensorsReqInput, UnLoadLoRAAdapterReqInput):
 *   {"method": "load_lora_adapter", "lora_name": n, "lora_path": "<PEFT dir>"}
 *   {"method": "load_lora_adapter_from_tensors", "lora_name": n, "config_dict": {...},
 *    "serialized_tensors": [<bucket of TP rank 0>, ...], "load_format": "flattened_bucket"}
 *   {"method": "unload_lora_adapter", "lora_name": n}
 * Loading an already loaded name upserts it (shadow copy, then switch). */
#include <string.h>

#include "wsync_adapter_req.h"
#include "wsync_error.h"
#include "wsync_map_rules.h"
#include "wsync_request.h"
#include "wsync_shim.h"

static const wsync_map_table_t wsync_sglang_map = {
    .engine = "sglang", .rules = NULL, .n_rules = 0, .next = &wsync_map_fused_moe_w13};

static wsync_result_t wsync_sglang_update(wsync_shim_ctx_t *ctx, json_t *req, json_t **extra,
                                          wsync_error_t *err)
{
    const char *version = json_string_value(json_object_get(req, "weight_version"));
    const char *fmt = json_string_value(json_object_get(req, "load_format"));
    json_t *bucket, *manifest;
    uint64_t gen = 0;
    wsync_result_t rc;
    int flush_cache = 1; /* SGLang's default is flush_cache=True */

    if (wsync_req_get_bool(req, "flush_cache", 1, &flush_cache, err) !=
        0) /* its buckets go back unread */
        wsync_driver_refuse(ctx->driver, WSYNC_ERR_BAD_REQUEST, err != NULL ? err->message : "");
    if (fmt != NULL && strcmp(fmt, WSYNC_SHIM_MANIFEST_FORMAT) == 0) {
        rc = wsync_shim_apply_rank_manifest(ctx, json_object_get(req, "serialized_named_tensors"),
                                            "serialized_named_tensors", &gen, err);
    } else {
        rc = wsync_shim_flat_bucket(ctx, req, "serialized_named_tensors", 1, &bucket, err);
        if (rc == WSYNC_OK)
            rc = wsync_req_bucket_decode(bucket, NULL, 0, &manifest, err);
        if (rc == WSYNC_OK)
            rc = wsync_shim_apply(ctx, &manifest, 1, &gen, err);
    }
    if (rc != WSYNC_OK)
        return rc;
    if (flush_cache) {
        rc = wsync_shim_commit(ctx, err); /* a version's last bucket flushes: it commits here */
        if (rc != WSYNC_OK)
            return rc;
        wsync_driver_flush_cache(ctx->driver);
    }
    if (version != NULL)
        json_object_set_new(ctx->state, "weight_version", json_string(version));
    *extra = json_pack("{s:I, s:O?}", "generation", (json_int_t)gen, "weight_version",
                       json_object_get(ctx->state, "weight_version"));
    return WSYNC_OK;
}

static wsync_result_t wsync_sglang_lora(wsync_shim_ctx_t *ctx, const char *method, json_t *req,
                                        json_t **extra, wsync_error_t *err)
{
    const char *name = json_string_value(json_object_get(req, "lora_name"));
    if (strcmp(method, "unload_lora_adapter") == 0)
        return wsync_adapter_req_unload(ctx, name, extra, err);
    if (strcmp(method, "load_lora_adapter") == 0) {
        const char *path = json_string_value(json_object_get(req, "lora_path"));
        if (path == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                                "load_lora_adapter needs lora_path (a PEFT directory)");
        return wsync_adapter_req_load(ctx, name, path, NULL, NULL, 0, extra, err);
    }
    json_t *bucket;
    wsync_result_t rc = wsync_shim_flat_bucket(ctx, req, "serialized_tensors", 0, &bucket, err);
    if (rc != WSYNC_OK)
        return rc;
    return wsync_adapter_req_load(ctx, name, NULL, bucket, json_object_get(req, "config_dict"), 0,
                                  extra, err);
}

static wsync_result_t wsync_sglang_handle(wsync_shim_ctx_t *ctx, const char *method, json_t *req,
                                          json_t **extra, wsync_error_t *err)
{
    if (strcmp(method, "update_weights_from_tensor") == 0)
        return wsync_sglang_update(ctx, req, extra, err);
    if (strcmp(method, "load_lora_adapter") == 0 ||
        strcmp(method, "load_lora_adapter_from_tensors") == 0 ||
        strcmp(method, "unload_lora_adapter") == 0)
        return wsync_sglang_lora(ctx, method, req, extra, err);
    if (strcmp(method, "get_weight_version") == 0) {
        *extra =
            json_pack("{s:O?}", "weight_version", json_object_get(ctx->state, "weight_version"));
        return WSYNC_OK;
    }
    return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                        "sglang shim: unknown method \"%s\"; use update_weights_from_tensor, "
                        "load_lora_adapter[_from_tensors] or unload_lora_adapter",
                        method);
}

/* packed (the default): each rank's manifest as published, load_format "wsync_manifest";
 * packed 0: SGLang's own FlattenedTensorBucket, as its trainers send it. */
static wsync_result_t wsync_sglang_encode(const wsync_shim_encode_t *in, json_t **msgs,
                                          wsync_error_t *err)
{
    /* a direct bucket's segments travel only in the manifest text */
    const int texts = in->packed || wsync_shim_is_direct(in);
    json_t *buckets = texts ? wsync_shim_rank_texts(in, err) : wsync_shim_rank_buckets(in, 1, err);
    if (buckets == NULL)
        return err != NULL ? err->code : WSYNC_ERR_BAD_MANIFEST;
    *msgs = json_pack("[{s:s, s:o, s:s, s:b, s:s?}]", "method", "update_weights_from_tensor",
                      "serialized_named_tensors", buckets, "load_format",
                      texts ? WSYNC_SHIM_MANIFEST_FORMAT : "flattened_bucket", "flush_cache",
                      in->finished, "weight_version", in->weight_version);
    return *msgs != NULL ? WSYNC_OK
                         : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "sglang encode: OOM");
}

static wsync_result_t wsync_sglang_encode_lora(const wsync_shim_lora_t *in, json_t **msg,
                                               wsync_error_t *err)
{
    if (in->unload)
        *msg = json_pack("{s:s, s:s}", "method", "unload_lora_adapter", "lora_name", in->name);
    else if (in->path != NULL)
        *msg = json_pack("{s:s, s:s, s:s}", "method", "load_lora_adapter", "lora_name", in->name,
                         "lora_path", in->path);
    else {
        wsync_shim_encode_t enc = {.manifests = in->manifests, .n_ranks = in->n_ranks};
        json_t *config = wsync_adapter_req_config(in->config, err);
        json_t *buckets = config != NULL ? wsync_shim_rank_buckets(&enc, 1, err) : NULL;
        if (buckets == NULL) {
            json_decref(config);
            return err != NULL ? err->code : WSYNC_ERR_BAD_MANIFEST;
        }
        *msg = json_pack("{s:s, s:s, s:o, s:o, s:s}", "method", "load_lora_adapter_from_tensors",
                         "lora_name", in->name, "config_dict", config, "serialized_tensors",
                         buckets, "load_format", "flattened_bucket");
    }
    return *msg != NULL ? WSYNC_OK
                        : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "sglang encode: OOM");
}

const wsync_shim_t wsync_shim_sglang = {
    .engine = "sglang",
    .map = &wsync_sglang_map,
    .handle = wsync_sglang_handle,
    .encode = wsync_sglang_encode,
    .encode_lora = wsync_sglang_encode_lora,
};
