/* vLLM shim. Mirrors the native weight-transfer protocol (IPC backend):
 *   {"method": "start_weight_update", "is_checkpoint_format": true}
 *   {"method": "update_weights", "update_info": {
 *        "names": [...], "dtype_names": [...], "shapes": [[...], ...], "generation": g,
 *        "packed": true,  "packed_buffers": [{"buffer": {...}} per TP rank], "offsets": [...]
 *      | "packed": false, "tensor_handles": [[{"buffer": {...}, "offset": o} per TP rank]
 *                                         per tensor]
 *      | "manifests": [manifest text per TP rank] (wsync's encoder, for direct buckets, whose
 *                      segments only the manifest carries, and for ranks whose buckets hold
 *                      different tensors: expert parallelism) }}   (one or more times)
 *   {"method": "finish_weight_update"}
 * Per-tensor handles that name the same allocation are grouped into one bucket, so the mapping
 * is opened once and the copies go out as one batch. finish_weight_update drains the copies, runs
 * the post-load hook (process_weights_after_loading) and resets the prefix cache. vLLM names
 * fused experts w13_weight / w2_weight, like SGLang.
 *
 * LoRA (LoRARequest from a PEFT directory):
 *   {"method": "add_lora", "lora_request": {"lora_name": n, "lora_int_id": i, "lora_path": p}}
 *   {"method": "remove_lora", "lora_int_id": i}
 * Adding a loaded name again upserts it without a gap (shadow copy, then switch) and resets the
 * prefix cache for it: blocks computed with the old adapter must not serve the new one. */
#include <stdlib.h>
#include <string.h>

#include "wsync_adapter_req.h"
#include "wsync_error.h"
#include "wsync_map_rules.h"
#include "wsync_request.h"
#include "wsync_shim.h"

static const wsync_map_table_t wsync_vllm_map = {
    .engine = "vllm", .rules = NULL, .n_rules = 0, .next = &wsync_map_fused_moe_w13};

/* Add tensor i of update_info to the manifest of its buffer (created on first use). */
static wsync_result_t wsync_vllm_add(json_t *groups, json_t *info, size_t i, json_t *buffer,
                                     uint64_t offset, uint64_t gen, wsync_error_t *err)
{
    const char *name = json_string_value(json_array_get(json_object_get(info, "names"), i));
    const char *dtype = json_string_value(json_array_get(json_object_get(info, "dtype_names"), i));
    json_t *shape = json_array_get(json_object_get(info, "shapes"), i), *m = NULL, *g;
    uint64_t nbytes = 0;
    size_t k;

    if (name == NULL || dtype == NULL || shape == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "update_info: names, dtype_names and shapes must have an entry "
                            "for tensor %zu",
                            i);
    if (!json_is_object(buffer))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST, "update_info: tensor \"%s\" has no buffer",
                            name);
    json_array_foreach(groups, k, g) if (json_equal(json_object_get(g, "buffer"), buffer)) m = g;
    if (m == NULL) {
        m = wsync_req_manifest_new(buffer, gen, 0);
        json_array_append_new(groups, m);
    }
    wsync_req_tensor_bytes(dtype, shape, &nbytes);
    return wsync_req_add_tensor(m, name, dtype, shape, -1, offset, offset + nbytes, NULL, err);
}

static wsync_result_t wsync_vllm_update(wsync_shim_ctx_t *ctx, json_t *req, json_t **extra,
                                        wsync_error_t *err)
{
    json_t *info = json_object_get(req, "update_info"), *groups, *names;
    int packed = json_is_true(json_object_get(info, "packed"));
    wsync_result_t rc = WSYNC_OK;
    uint64_t gen = 0;
    size_t n;

    if (!json_is_true(json_object_get(ctx->state, "updating")))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "update_weights outside an update; call start_weight_update "
                            "first");
    names = json_object_get(info, "names");
    if (!json_is_array(names) || wsync_req_get_u64(info, "generation", &gen, err) != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                            "update_info needs a names array and a generation");
    n = json_array_size(names);
    if (json_object_get(info, "manifests") != NULL) {
        rc = wsync_shim_apply_rank_manifest(ctx, json_object_get(info, "manifests"),
                                            "update_info.manifests", &gen, err);
        if (rc == WSYNC_OK)
            *extra = json_pack("{s:I}", "generation", (json_int_t)gen);
        return rc;
    }
    groups = json_array();
    if (packed) {
        json_t *pb = wsync_req_pick_rank(json_object_get(info, "packed_buffers"), ctx->tp_rank,
                                         ctx->tp_size, "packed_buffers", err);
        json_t *offsets = json_object_get(info, "offsets");
        if (pb == NULL)
            rc = WSYNC_ERR_BAD_REQUEST;
        else if (json_array_size(offsets) != n)
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "update_info: %zu offsets for %zu names",
                              json_array_size(offsets), n);
        for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
            rc = wsync_vllm_add(groups, info, i, json_object_get(pb, "buffer"),
                                (uint64_t)json_integer_value(json_array_get(offsets, i)), gen, err);
    } else {
        json_t *handles = json_object_get(info, "tensor_handles");
        if (json_array_size(handles) != n)
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                              "update_info: %zu tensor_handles for %zu names",
                              json_array_size(handles), n);
        for (size_t i = 0; i < n && rc == WSYNC_OK; i++) {
            json_t *h = wsync_req_pick_rank(json_array_get(handles, i), ctx->tp_rank, ctx->tp_size,
                                            "tensor_handles[i]", err);
            rc = h == NULL
                     ? WSYNC_ERR_BAD_REQUEST
                     : wsync_vllm_add(groups, info, i, json_object_get(h, "buffer"),
                                      (uint64_t)json_integer_value(json_object_get(h, "offset")),
                                      gen, err);
        }
    }
    if (rc == WSYNC_OK) {
        size_t ng = json_array_size(groups);
        json_t **m = calloc(ng ? ng : 1, sizeof(*m));
        for (size_t i = 0; m != NULL && i < ng; i++)
            m[i] = json_incref(json_array_get(groups, i));
        rc = m == NULL ? WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "update_weights: OOM")
                       : wsync_shim_apply(ctx, m, ng, &gen, err);
        free(m);
    }
    json_decref(groups);
    if (rc == WSYNC_OK)
        *extra = json_pack("{s:I}", "generation", (json_int_t)gen);
    return rc;
}

/* lora_int_id -> lora_name of the loaded adapters (ctx->state["loras"]). */
static json_t *wsync_vllm_loras(wsync_shim_ctx_t *ctx)
{
    json_t *l = json_object_get(ctx->state, "loras");
    if (l == NULL) {
        l = json_object();
        json_object_set_new(ctx->state, "loras", l);
    }
    return l;
}

static wsync_result_t wsync_vllm_lora(wsync_shim_ctx_t *ctx, const char *method, json_t *req,
                                      json_t **extra, wsync_error_t *err)
{
    json_t *lr = strcmp(method, "add_lora") == 0 ? json_object_get(req, "lora_request") : req;
    json_t *id = json_object_get(lr, "lora_int_id");
    const char *name = json_string_value(json_object_get(lr, "lora_name"));
    char key[32];
    wsync_result_t rc;

    if (!json_is_integer(id) || json_integer_value(id) <= 0)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST, "%s needs a positive integer lora_int_id",
                            method);
    snprintf(key, sizeof(key), "%lld", (long long)json_integer_value(id));
    const char *known = json_string_value(json_object_get(wsync_vllm_loras(ctx), key));
    if (strcmp(method, "remove_lora") == 0) {
        if (known == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND, "no LoRA with lora_int_id %s", key);
        rc = wsync_adapter_req_unload(ctx, known, extra, err);
        if (rc == WSYNC_OK)
            json_object_del(wsync_vllm_loras(ctx), key);
        return rc;
    }
    if (known != NULL && name != NULL && strcmp(known, name) != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "lora_int_id %s is adapter \"%s\", not \"%s\"; ids are unique "
                            "per adapter",
                            key, known, name);
    const char *path = json_string_value(json_object_get(lr, "lora_path"));
    if (path == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "add_lora needs lora_request.lora_path (a PEFT directory)");
    rc = wsync_adapter_req_load(ctx, name, path, NULL, NULL, 1, extra, err);
    if (rc == WSYNC_OK)
        json_object_set_new(wsync_vllm_loras(ctx), key, json_string(name));
    return rc;
}

static wsync_result_t wsync_vllm_handle(wsync_shim_ctx_t *ctx, const char *method, json_t *req,
                                        json_t **extra, wsync_error_t *err)
{
    if (strcmp(method, "add_lora") == 0 || strcmp(method, "remove_lora") == 0)
        return wsync_vllm_lora(ctx, method, req, extra, err);

    int updating = json_is_true(json_object_get(ctx->state, "updating"));
    /* the driver's weight version this update writes; when the driver has ended it (its
     * producer died, it was aborted, a newer version began) the update is over */
    const uint64_t open = wsync_driver_open_version(ctx->driver);
    json_t *writes = json_object_get(ctx->state, "version");
    if (updating && writes != NULL && (uint64_t)json_integer_value(writes) != open)
        updating = 0;
    wsync_result_t rc;
    if (strcmp(method, "update_weights") == 0) {
        rc = wsync_vllm_update(ctx, req, extra, err);
        /* a refused bucket inside an open version (which may have written, as a one-pass fp8
         * NaN does) keeps the update open too, until finish or wsync_abort */
        const uint64_t now = wsync_driver_open_version(ctx->driver);
        if (rc == WSYNC_OK || now != 0)
            json_object_set_new(ctx->state, "version", json_integer((json_int_t)now));
        return rc;
    }
    if (strcmp(method, "start_weight_update") == 0) {
        /* an update none of whose buckets landed (the first was refused, before anything was
         * written, outside any version) holds nothing: a new start replaces it */
        if (updating && writes != NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_BUSY,
                                "start_weight_update while an update is open; call "
                                "finish_weight_update first");
        json_object_set_new(ctx->state, "updating", json_true());
        json_object_del(ctx->state, "version");
        if (open != 0)
            json_object_set_new(ctx->state, "version", json_integer((json_int_t)open));
        return WSYNC_OK;
    }
    if (strcmp(method, "finish_weight_update") == 0) {
        if (!updating)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "finish_weight_update without start_weight_update");
        json_object_set_new(ctx->state, "updating", json_false());
        rc = wsync_shim_commit(ctx, err);
        if (rc != WSYNC_OK)
            return rc;
        wsync_driver_post_load(ctx->driver);
        wsync_driver_flush_cache(ctx->driver);
        return WSYNC_OK;
    }
    return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                        "vllm shim: unknown method \"%s\"; use start_weight_update, "
                        "update_weights, finish_weight_update, add_lora, remove_lora",
                        method);
}

/* vLLM's update_info names its tensors once for every rank: ranks whose buckets hold other
 * tensors, or the same ones elsewhere (expert parallelism stages each rank only its experts),
 * travel as one manifest text per rank instead. */
static int wsync_vllm_ranks_differ(const wsync_shim_encode_t *in, json_t *const *m)
{
    json_t *t0 = json_object_get(m[0], "tensors");
    for (size_t r = 1; r < in->n_ranks; r++) {
        json_t *tr = json_object_get(m[r], "tensors");
        if (json_array_size(tr) != json_array_size(t0))
            return 1;
        for (size_t i = 0; i < json_array_size(t0); i++) {
            json_t *a = json_array_get(t0, i), *b = json_array_get(tr, i);
            if (!json_equal(json_object_get(a, "name"), json_object_get(b, "name")) ||
                !json_equal(json_object_get(a, "offset"), json_object_get(b, "offset")) ||
                !json_equal(json_object_get(a, "shape"), json_object_get(b, "shape")))
                return 1;
        }
    }
    return 0;
}

/* update_info for one bucket: names, offsets and handles once for every rank when the ranks'
 * manifests hold the same tensors at the same offsets, else one manifest text per rank. */
static json_t *wsync_vllm_info(const wsync_shim_encode_t *in, json_t *const *m)
{
    json_t *tensors = json_object_get(m[0], "tensors"), *t;
    json_t *info =
        json_pack("{s:[], s:[], s:[], s:O, s:b}", "names", "dtype_names", "shapes", "generation",
                  json_object_get(m[0], "generation"), "packed", in->packed);
    json_t *offsets = json_array(), *handles = json_array(), *buffers = json_array();
    size_t i;

    json_array_foreach(tensors, i, t)
    {
        json_t *per_rank = json_array();
        json_array_append(json_object_get(info, "names"), json_object_get(t, "name"));
        json_array_append(json_object_get(info, "dtype_names"), json_object_get(t, "dtype"));
        json_array_append(json_object_get(info, "shapes"), json_object_get(t, "shape"));
        json_array_append(offsets, json_object_get(t, "offset"));
        for (size_t r = 0; r < in->n_ranks; r++) {
            json_t *rt = json_array_get(json_object_get(m[r], "tensors"), i);
            json_array_append_new(per_rank,
                                  json_pack("{s:O, s:O}", "buffer", json_object_get(m[r], "buffer"),
                                            "offset", json_object_get(rt, "offset")));
        }
        json_array_append_new(handles, per_rank);
    }
    for (size_t r = 0; r < in->n_ranks; r++)
        json_array_append_new(buffers,
                              json_pack("{s:O}", "buffer", json_object_get(m[r], "buffer")));
    if (wsync_shim_is_direct(in) || wsync_vllm_ranks_differ(in, m)) {
        /* direct: the segments travel only in the manifest text */
        json_object_set_new(info, "manifests", wsync_shim_rank_texts(in, NULL));
        json_decref(handles);
        json_decref(buffers);
        json_decref(offsets);
    } else if (in->packed) {
        json_object_set_new(info, "packed_buffers", buffers);
        json_object_set_new(info, "offsets", offsets);
        json_decref(handles);
    } else {
        json_object_set_new(info, "tensor_handles", handles);
        json_decref(buffers);
        json_decref(offsets);
    }
    return info;
}

static wsync_result_t wsync_vllm_encode(const wsync_shim_encode_t *in, json_t **msgs,
                                        wsync_error_t *err)
{
    json_t **m = calloc(in->n_ranks ? in->n_ranks : 1, sizeof(*m));
    wsync_result_t rc = WSYNC_OK;

    *msgs = json_array();
    for (size_t r = 0; r < in->n_ranks && rc == WSYNC_OK; r++) {
        json_error_t jerr;
        m[r] = json_loads(in->manifests[r], 0, &jerr);
        if (m[r] == NULL)
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST, "manifest %zu is not JSON: %s", r,
                              jerr.text);
    }
    if (rc == WSYNC_OK) {
        if (in->first)
            json_array_append_new(*msgs, json_pack("{s:s, s:b}", "method", "start_weight_update",
                                                   "is_checkpoint_format", 1));
        json_array_append_new(*msgs, json_pack("{s:s, s:o}", "method", "update_weights",
                                               "update_info", wsync_vllm_info(in, m)));
        if (in->finished)
            json_array_append_new(*msgs, json_pack("{s:s}", "method", "finish_weight_update"));
    }
    for (size_t r = 0; r < in->n_ranks; r++)
        json_decref(m[r]);
    free(m);
    if (rc != WSYNC_OK) {
        json_decref(*msgs);
        *msgs = NULL;
    }
    return rc;
}

static wsync_result_t wsync_vllm_encode_lora(const wsync_shim_lora_t *in, json_t **msg,
                                             wsync_error_t *err)
{
    if (in->unload)
        *msg =
            json_pack("{s:s, s:I}", "method", "remove_lora", "lora_int_id", (json_int_t)in->int_id);
    else if (in->path != NULL)
        *msg =
            json_pack("{s:s, s:{s:s, s:I, s:s}}", "method", "add_lora", "lora_request", "lora_name",
                      in->name, "lora_int_id", (json_int_t)in->int_id, "lora_path", in->path);
    else
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "vLLM's add_lora loads from a directory (lora_path); save the "
                            "adapter with safe_serialization=True and send its path");
    return *msg != NULL ? WSYNC_OK : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "vllm encode: OOM");
}

const wsync_shim_t wsync_shim_vllm = {
    .engine = "vllm",
    .map = &wsync_vllm_map,
    .handle = wsync_vllm_handle,
    .encode = wsync_vllm_encode,
    .encode_lora = wsync_vllm_encode_lora,
};
