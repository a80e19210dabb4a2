/* LMDeploy shim. Mirrors the PyTorch engine's update_params(UpdateParamsRequest):
 *   {"method": "update_params",
 *    "serialized_named_tensors": [<bucket of TP rank 0>, ...],   (or one for all)
 *    "load_format": "flattened_bucket", "finished": false}
 * or, with "load_format": "wsync_manifest" (wsync's encoder, for direct buckets), each rank's
 * entry is the manifest text as published.
 * with a persistent staging buffer: the first bucket carries "flattened_tensor" (the buffer);
 * later buckets carry only metadata and a newer generation, and the engine reuses the mapping.
 * The ready/consumed ping-pong is the plugin's: copies wait for *ready*, and *consumed* is
 * recorded on the stream that did the copies (the fix for torn weights when the trainer reuses
 * the buffer). On "finished" the engine's post-load hook runs once the copies are done.
 * LMDeploy names fused experts experts.gate_up / experts.down.
 *
 * LoRA: LMDeploy takes adapters as {name: path} (the engine config's `adapters`):
 *   {"method": "load_adapters", "adapters": {"<name>": "<PEFT dir>", ...}}
 *   {"method": "unload_adapter", "adapter_name": n}
 * Entries load in order; a refusal stops there (earlier entries stay loaded) and names the
 * adapter. Loading a loaded name upserts it without a gap. */
#include <string.h>

#include "wsync_adapter_req.h"
#include "wsync_error.h"
#include "wsync_map_rules.h"
#include "wsync_request.h"
#include "wsync_shim.h"

static const wsync_map_rule_t wsync_lmdeploy_rules[] = {
    {"mlp.experts.#.gate_proj.weight", "mlp.experts.gate_up.weight", WSYNC_PART_EXPERT_W1,
     WSYNC_TP_COLUMN},
    {"mlp.experts.#.up_proj.weight", "mlp.experts.gate_up.weight", WSYNC_PART_EXPERT_W3,
     WSYNC_TP_COLUMN},
    {"mlp.experts.#.down_proj.weight", "mlp.experts.down.weight", WSYNC_PART_EXPERT_W2,
     WSYNC_TP_ROW},
};

static const wsync_map_table_t wsync_lmdeploy_map = {
    .engine = "lmdeploy",
    .rules = wsync_lmdeploy_rules,
    .n_rules = sizeof(wsync_lmdeploy_rules) / sizeof(wsync_lmdeploy_rules[0]),
    .next = &wsync_map_dense,
};

static wsync_result_t wsync_lmdeploy_update(wsync_shim_ctx_t *ctx, json_t *req, json_t **extra,
                                            wsync_error_t *err)
{
    int finished = 0;
    json_t *bucket, *fresh, *manifest;
    uint64_t gen = 0;
    wsync_result_t rc;
    const char *fmt = json_string_value(json_object_get(req, "load_format"));

    if (wsync_req_get_bool(req, "finished", 0, &finished, err) !=
        0) /* its buckets go back unread */
        wsync_driver_refuse(ctx->driver, WSYNC_ERR_BAD_REQUEST, err != NULL ? err->message : "");

    if (fmt != NULL && strcmp(fmt, WSYNC_SHIM_MANIFEST_FORMAT) == 0) {
        rc = wsync_shim_apply_rank_manifest(ctx, json_object_get(req, "serialized_named_tensors"),
                                            "serialized_named_tensors", &gen, err);
        if (rc == WSYNC_OK && finished) {
            rc = wsync_shim_commit(ctx, err);
            if (rc == WSYNC_OK)
                wsync_driver_post_load(ctx->driver);
        }
        if (rc == WSYNC_OK)
            *extra = json_pack("{s:I, s:b}", "generation", (json_int_t)gen, "finished", finished);
        return rc;
    }
    rc = wsync_shim_flat_bucket(ctx, req, "serialized_named_tensors", 1, &bucket, err);
    if (rc != WSYNC_OK)
        return rc;
    fresh = json_object_get(json_object_get(bucket, "flattened_tensor"), "buffer");
    rc = wsync_req_bucket_decode(bucket,
                                 fresh ? fresh : json_object_get(ctx->state, "persistent_buffer"),
                                 finished, &manifest, err);
    if (rc == WSYNC_OK)
        rc = wsync_shim_apply(ctx, &manifest, 1, &gen, err);
    if (rc != WSYNC_OK)
        return rc;
    /* Remember the buffer only once a bucket from it was accepted. */
    if (fresh != NULL)
        json_object_set(ctx->state, "persistent_buffer", fresh);
    if (finished) {
        rc = wsync_shim_commit(ctx, err);
        if (rc != WSYNC_OK)
            return rc;
        wsync_driver_post_load(ctx->driver);
    }
    *extra = json_pack("{s:I, s:b}", "generation", (json_int_t)gen, "finished", finished);
    return WSYNC_OK;
}

static wsync_result_t wsync_lmdeploy_load_adapters(wsync_shim_ctx_t *ctx, json_t *req,
                                                   json_t **extra, wsync_error_t *err)
{
    json_t *adapters = json_object_get(req, "adapters"), *path, *loaded = json_array();
    const char *name;
    wsync_result_t rc = WSYNC_OK;

    if (!json_is_object(adapters) || json_object_size(adapters) == 0)
        rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                          "load_adapters needs \"adapters\": {name: PEFT directory, ...}");
    json_object_foreach(adapters, name, path)
    {
        json_t *one = NULL;
        if (rc != WSYNC_OK)
            break;
        if (!json_is_string(path))
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                              "adapters[\"%s\"] must be a directory path", name);
        else
            rc = wsync_adapter_req_load(ctx, name, json_string_value(path), NULL, NULL, 0, &one,
                                        err);
        json_decref(one);
        if (rc == WSYNC_OK)
            json_array_append_new(loaded, json_string(name));
    }
    if (rc == WSYNC_OK)
        *extra = json_pack("{s:o}", "loaded", loaded);
    else
        json_decref(loaded);
    return rc;
}

static wsync_result_t wsync_lmdeploy_encode_lora(const wsync_shim_lora_t *in, json_t **msg,
                                                 wsync_error_t *err)
{
    if (in->unload)
        *msg = json_pack("{s:s, s:s}", "method", "unload_adapter", "adapter_name", in->name);
    else if (in->path != NULL)
        *msg =
            json_pack("{s:s, s:{s:s}}", "method", "load_adapters", "adapters", in->name, in->path);
    else
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "LMDeploy loads adapters from a path; save the adapter with "
                            "safe_serialization=True and send its directory");
    return *msg != NULL ? WSYNC_OK
                        : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "lmdeploy encode: OOM");
}

static wsync_result_t wsync_lmdeploy_handle(wsync_shim_ctx_t *ctx, const char *method, json_t *req,
                                            json_t **extra, wsync_error_t *err)
{
    if (strcmp(method, "update_params") == 0)
        return wsync_lmdeploy_update(ctx, req, extra, err);
    if (strcmp(method, "load_adapters") == 0)
        return wsync_lmdeploy_load_adapters(ctx, req, extra, err);
    if (strcmp(method, "unload_adapter") == 0)
        return wsync_adapter_req_unload(
            ctx, json_string_value(json_object_get(req, "adapter_name")), extra, err);
    return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                        "lmdeploy shim: unknown method \"%s\"; use update_params, "
                        "load_adapters or unload_adapter",
                        method);
}

static wsync_result_t wsync_lmdeploy_encode(const wsync_shim_encode_t *in, json_t **msgs,
                                            wsync_error_t *err)
{
    /* a direct bucket's segments travel only in the manifest text */
    const int texts = wsync_shim_is_direct(in);
    json_t *buckets =
        texts ? wsync_shim_rank_texts(in, err) : wsync_shim_rank_buckets(in, in->with_buffer, err);
    if (buckets == NULL)
        return err != NULL ? err->code : WSYNC_ERR_BAD_MANIFEST;
    *msgs =
        json_pack("[{s:s, s:o, s:s, s:b}]", "method", "update_params", "serialized_named_tensors",
                  buckets, "load_format", texts ? WSYNC_SHIM_MANIFEST_FORMAT : "flattened_bucket",
                  "finished", in->finished);
    return *msgs != NULL ? WSYNC_OK
                         : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "lmdeploy encode: OOM");
}

const wsync_shim_t wsync_shim_lmdeploy = {
    .engine = "lmdeploy",
    .map = &wsync_lmdeploy_map,
    .handle = wsync_lmdeploy_handle,
    .encode = wsync_lmdeploy_encode,
    .encode_lora = wsync_lmdeploy_encode_lora,
};
