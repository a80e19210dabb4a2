/* See wsync_shim_api.h. Each entry point forwards to the shims' own code. */
#include "wsync_shim_api.h"

#include "wsync_client.h"
#include "wsync_dtype.h"
#include "wsync_manifest.h"
#include "wsync_ckpt_plan.h"
#include "wsync_model_config.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_driver.h"
#include "wsync_error.h"
#include "wsync_loader.h"
#include "wsync_map_rules.h"
#include "wsync_request.h"
#include "wsync_shim.h"
#include "wsync_torch_msg.h"
#include "wsync_txn_msg.h"

#define WSYNC_SHIM_API __attribute__((visibility("default")))

struct wsync_shim_worker {
    const wsync_shim_t *shim;
    wsync_driver_t *driver;
    wsync_shim_ctx_t ctx;
    const wsync_engine_ops_t *engine; /* the engine's own ops */
    wsync_engine_ops_t ops;           /* what the driver calls: the table, then the engine's */
    wsync_shim_param_t *params;       /* sorted by name; names owned */
    size_t n_params;
    uint8_t *fed;              /* fed[i]: some request named a tensor that maps to params[i] */
    uint32_t tp_rank, tp_size; /* with a table: asked once at open (fixed for its life) */
    wsync_model_dims_t dims;
    uint32_t ep_rank, ep_size, moe_tp_rank, moe_tp_size; /* the same, when the engine has moe */
};

static int param_cmp(const void *a, const void *b)
{
    return strcmp(((const wsync_shim_param_t *)a)->name, ((const wsync_shim_param_t *)b)->name);
}

static int table_param(void *user, const char *name, wsync_param_info_t *out)
{
    const wsync_shim_worker_t *w = user;
    wsync_shim_param_t key = {.name = name};
    const wsync_shim_param_t *p = bsearch(&key, w->params, w->n_params, sizeof(key), param_cmp);
    if (p == NULL)
        return w->engine->param != NULL ? w->engine->param(w->engine->user, name, out) : -1;
    w->fed[p - w->params] = 1;
    *out = p->info;
    return 0;
}

/* The table's parameters no request has fed (wsync_shim_ctx_t.unfed); one that shares its
 * storage with a fed parameter (tied weights held under both names) counts as fed. */
static json_t *table_unfed(void *user)
{
    const wsync_shim_worker_t *w = user;
    json_t *names = json_array();
    for (size_t i = 0; names != NULL && i < w->n_params; i++) {
        int fed = w->fed[i];
        for (size_t j = 0; !fed && j < w->n_params; j++)
            fed = w->fed[j] && w->params[j].info.ptr == w->params[i].info.ptr;
        if (!fed)
            json_array_append_new(names, json_string(w->params[i].name));
    }
    return names;
}

/* A worker with a parameter table is a fixed model: its TP and EP places and dimensions are
 * asked once, at open, instead of once per tensor (a callback into Python each time: 4 608 of
 * them per sync of a 128-expert MoE, ~23 ms). */
static void fwd_tp(void *u, uint32_t *r, uint32_t *s)
{
    const wsync_shim_worker_t *w = u;
    *r = w->tp_rank;
    *s = w->tp_size;
}
static void fwd_dims(void *u, wsync_model_dims_t *d)
{
    const wsync_shim_worker_t *w = u;
    *d = w->dims;
}

/* The engine's other callbacks, called with the engine's own user pointer. */
static wsync_stream_t fwd_stream(void *u)
{
    const wsync_shim_worker_t *w = u;
    return w->engine->stream(w->engine->user);
}
static void fwd_flush(void *u)
{
    const wsync_shim_worker_t *w = u;
    w->engine->flush_cache(w->engine->user);
}
static void fwd_post_load(void *u)
{
    const wsync_shim_worker_t *w = u;
    w->engine->post_load(w->engine->user);
}

static wsync_result_t fwd_native_copy(void *u, const wsync_buffer_desc_t *b, uint64_t g,
                                      const wsync_copy_op_t *ops, size_t n, wsync_error_t *err)
{
    const wsync_shim_worker_t *w = u;
    return w->engine->native_copy(w->engine->user, b, g, ops, n, err);
}
static wsync_adapter_slot_t *fwd_lora_slot(void *u, const char *name, int assign)
{
    const wsync_shim_worker_t *w = u;
    return w->engine->lora_slot(w->engine->user, name, assign);
}
static void fwd_lora_loaded(void *u, const char *name, wsync_adapter_slot_t *slot)
{
    const wsync_shim_worker_t *w = u;
    w->engine->lora_loaded(w->engine->user, name, slot);
}
static void fwd_lora_unloaded(void *u, const char *name)
{
    const wsync_shim_worker_t *w = u;
    w->engine->lora_unloaded(w->engine->user, name);
}
static void fwd_reset_prefix(void *u, const char *name)
{
    const wsync_shim_worker_t *w = u;
    w->engine->reset_prefix_cache(w->engine->user, name);
}

static void fwd_update_begin(void *u, uint64_t version)
{
    const wsync_shim_worker_t *w = u;
    w->engine->update_begin(w->engine->user, version);
}
static void fwd_update_end(void *u, uint64_t version, int committed)
{
    const wsync_shim_worker_t *w = u;
    w->engine->update_end(w->engine->user, version, committed);
}

static void fwd_moe(void *u, uint32_t *ep_rank, uint32_t *ep_size, uint32_t *mr, uint32_t *ms)
{
    const wsync_shim_worker_t *w = u;
    *ep_rank = w->ep_rank;
    *ep_size = w->ep_size;
    *mr = w->moe_tp_rank;
    *ms = w->moe_tp_size;
}

static void params_free(wsync_shim_worker_t *w)
{
    for (size_t i = 0; i < w->n_params; i++)
        free((char *)w->params[i].name);
    free(w->params);
    free(w->fed);
}

/* Copy and sort the parameter table; route the driver's look-ups through it. */
static wsync_result_t params_take(wsync_shim_worker_t *w, const wsync_shim_worker_config_t *cfg,
                                  wsync_error_t *err)
{
    const wsync_engine_ops_t *e = cfg->ops;
    w->engine = e;
    if (cfg->n_params == 0) {
        if (e->param == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "worker_open needs ops->param or a parameter table");
        w->ops = *e;
        return WSYNC_OK;
    }
    if (cfg->params == NULL || e->tp == NULL || e->dims == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "worker_open: a table of %zu parameters at NULL, or no tp/dims",
                            cfg->n_params);
    w->params = calloc(cfg->n_params, sizeof(*w->params));
    w->fed = calloc(cfg->n_params, 1);
    if (w->params == NULL || w->fed == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu parameters",
                            cfg->n_params);
    for (size_t i = 0; i < cfg->n_params; i++, w->n_params++) {
        w->params[i] = cfg->params[i];
        if (cfg->params[i].name == NULL ||
            (w->params[i].name = strdup(cfg->params[i].name)) == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "parameter %zu of the table has no name (or no memory)", i);
    }
    qsort(w->params, w->n_params, sizeof(*w->params), param_cmp);
    e->tp(e->user, &w->tp_rank, &w->tp_size);
    memset(&w->dims, 0, sizeof(w->dims));
    e->dims(e->user, &w->dims);
    for (size_t i = 1; i < w->n_params; i++)
        if (strcmp(w->params[i - 1].name, w->params[i].name) == 0)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "parameter %s appears twice in the table", w->params[i].name);
    w->ops =
        (wsync_engine_ops_t){.struct_size = sizeof(w->ops),
                             .user = w,
                             .param = table_param,
                             .tp = fwd_tp,
                             .dims = fwd_dims,
                             .stream = e->stream ? fwd_stream : NULL,
                             .flush_cache = e->flush_cache ? fwd_flush : NULL,
                             .post_load = e->post_load ? fwd_post_load : NULL,
                             .native_copy = e->native_copy ? fwd_native_copy : NULL,
                             .lora_slot = e->lora_slot ? fwd_lora_slot : NULL,
                             .lora_loaded = e->lora_loaded ? fwd_lora_loaded : NULL,
                             .lora_unloaded = e->lora_unloaded ? fwd_lora_unloaded : NULL,
                             .reset_prefix_cache = e->reset_prefix_cache ? fwd_reset_prefix : NULL};
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, update_end)) {
        w->ops.update_begin = e->update_begin ? fwd_update_begin : NULL;
        w->ops.update_end = e->update_end ? fwd_update_end : NULL;
    }
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, moe) && e->moe != NULL) {
        e->moe(e->user, &w->ep_rank, &w->ep_size, &w->moe_tp_rank, &w->moe_tp_size);
        w->ops.moe = fwd_moe;
    }
    return WSYNC_OK;
}

WSYNC_SHIM_API uint32_t wsync_shim_api_version(void)
{
    return WSYNC_SHIM_API_VERSION;
}

WSYNC_SHIM_API const char *wsync_shim_result_name(int code)
{
    return wsync_result_name((wsync_result_t)code);
}

static const wsync_shim_t *find_shim(const char *engine, wsync_error_t *err)
{
    const wsync_shim_t *s = wsync_shim_find(engine);
    if (s == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                     "unknown engine \"%.64s\": use sglang, vllm or lmdeploy",
                     engine ? engine : "(null)");
    return s;
}

WSYNC_SHIM_API wsync_result_t wsync_shim_worker_open(const wsync_shim_worker_config_t *cfg,
                                                     wsync_shim_worker_t **out, wsync_error_t *err)
{
    if (cfg == NULL || out == NULL || cfg->ops == NULL ||
        cfg->struct_size < offsetof(wsync_shim_worker_config_t, params))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "worker_open needs a config (struct_size %zu) with ops, and out",
                            sizeof(wsync_shim_worker_config_t));
    wsync_shim_worker_config_t c = {0};
    memcpy(&c, cfg, cfg->struct_size < sizeof(c) ? cfg->struct_size : sizeof(c));
    cfg = &c;
    const wsync_shim_t *s = find_shim(cfg->engine, err);
    if (s == NULL)
        return WSYNC_ERR_NOT_FOUND;
    const wsync_map_table_t *map = s->map;
    if (cfg->mapping != NULL && cfg->mapping[0] != '\0') {
        if (strcmp(cfg->mapping, "checkpoint") != 0)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "unknown mapping \"%.64s\": use \"checkpoint\", or none for "
                                "the engine's own layout",
                                cfg->mapping);
        map = &wsync_map_checkpoint;
    }
    wsync_shim_worker_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a shim worker");
    wsync_result_t rc = params_take(w, cfg, err);
    if (rc != WSYNC_OK) {
        params_free(w);
        free(w);
        return rc;
    }
    wsync_driver_config_t dc = {.plugin_path = cfg->plugin_path,
                                .engine = &w->ops,
                                .map = map,
                                .log = cfg->log,
                                .log_user = cfg->log_user,
                                .log_level = cfg->log_level,
                                .device_ordinal = cfg->device_ordinal,
                                .timeout_ms = cfg->timeout_ms,
                                .copy_flags = cfg->copy_flags,
                                .max_manifest_bytes = cfg->max_manifest_bytes,
                                .max_manifest_tensors = cfg->max_manifest_tensors};
    rc = wsync_driver_open(&dc, &w->driver, err);
    if (rc != WSYNC_OK) {
        params_free(w);
        free(w);
        return rc;
    }
    uint32_t rank = 0, size = 1;
    cfg->ops->tp(cfg->ops->user, &rank, &size);
    w->shim = s;
    wsync_shim_ctx_init(&w->ctx, w->driver, rank, size);
    if (w->n_params > 0) { /* a fixed model: every parameter of it must be fed */
        w->ctx.unfed = table_unfed;
        w->ctx.unfed_user = w;
    }
    *out = w;
    return WSYNC_OK;
}

WSYNC_SHIM_API void wsync_shim_worker_close(wsync_shim_worker_t *w)
{
    if (w == NULL)
        return;
    wsync_shim_ctx_free(&w->ctx);
    wsync_driver_release(w->driver, NULL);
    wsync_driver_close(w->driver);
    params_free(w);
    free(w);
}

WSYNC_SHIM_API char *wsync_shim_worker_backend(const wsync_shim_worker_t *w, int *native)
{
    const char *why = NULL;
    int nat = wsync_driver_native(w->driver, &why);
    const wsync_plugin_t *p = wsync_driver_plugin(w->driver);
    char buf[WSYNC_ERROR_MESSAGE_LEN + 32];
    if (nat || p == NULL)
        snprintf(buf, sizeof(buf), "native: %s", why ? why : "no plugin");
    else
        snprintf(buf, sizeof(buf), "%s %s", p->name, p->version);
    if (native != NULL)
        *native = nat || p == NULL;
    return strdup(buf);
}

WSYNC_SHIM_API char *wsync_shim_worker_serve(wsync_shim_worker_t *w, const char *text, size_t len,
                                             wsync_result_t *rc, wsync_error_t *err)
{
    if (w == NULL || text == NULL) {
        wsync_result_t r = WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                        "serve needs a worker and a request text");
        if (rc != NULL)
            *rc = r;
        return NULL;
    }
    return wsync_shim_serve(w->shim, &w->ctx, text, len, rc, err);
}

WSYNC_SHIM_API wsync_result_t wsync_shim_worker_shadows(wsync_shim_worker_t *w, void *const *params,
                                                        void *const *shadows, const uint64_t *bytes,
                                                        size_t n, wsync_error_t *err)
{
    if (w == NULL || (n > 0 && (params == NULL || shadows == NULL || bytes == NULL)))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "worker_shadows: NULL arguments");
    wsync_shadow_t *t = calloc(n ? n : 1, sizeof(*t));
    if (t == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "worker_shadows: %zu shadows", n);
    for (size_t i = 0; i < n; i++)
        t[i] = (wsync_shadow_t){.param = params[i], .shadow = shadows[i], .bytes = bytes[i]};
    wsync_result_t rc = wsync_driver_set_shadows(w->driver, t, n, err);
    free(t);
    return rc;
}

WSYNC_SHIM_API char *wsync_shim_model_tensors(const char *config_json, size_t len,
                                              wsync_error_t *err)
{
    wsync_model_t m;
    char why[256];
    if (config_json == NULL) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "model_tensors needs a config text");
        return NULL;
    }
    if (wsync_model_from_config(&m, config_json, len, why, sizeof(why)) != 0) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "%s", why);
        return NULL;
    }
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < m.n; i++) {
        const wsync_model_tensor_t *t = &m.tensors[i];
        json_array_append_new(list,
                              json_pack("{s:s, s:s, s:o}", "name", t->name, "dtype",
                                        wsync_dtype_name(t->dtype), "shape", wsync_ckpt_shape(t)));
    }
    wsync_model_free(&m);
    char *text = list != NULL ? json_dumps(list, JSON_COMPACT) : NULL;
    json_decref(list);
    if (text == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "model_tensors: out of memory");
    return text;
}

WSYNC_SHIM_API char *wsync_shim_checkpoint_plan(const char *dir, const char *engine,
                                                wsync_error_t *err)
{
    const wsync_shim_t *s = find_shim(engine != NULL ? engine : "sglang", err);
    if (dir == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "checkpoint_plan needs a directory");
    json_t *doc = s != NULL && dir != NULL ? wsync_ckpt_plan(dir, s, err) : NULL;
    char *text = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
    if (doc != NULL && text == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "checkpoint_plan: out of memory");
    json_decref(doc);
    return text;
}

WSYNC_SHIM_API uint64_t wsync_shim_worker_opens(const wsync_shim_worker_t *w)
{
    return w != NULL ? wsync_driver_opens(w->driver) : 0;
}

WSYNC_SHIM_API wsync_result_t wsync_shim_worker_drain(wsync_shim_worker_t *w, wsync_error_t *err)
{
    return wsync_driver_drain(w->driver, err);
}

WSYNC_SHIM_API wsync_result_t wsync_shim_worker_release(wsync_shim_worker_t *w, wsync_error_t *err)
{
    return wsync_driver_release(w->driver, err);
}

/* JSON text (malloc'd) of `msgs` (stolen), or NULL with err set. */
static char *dump_stolen(json_t *msgs, wsync_error_t *err)
{
    char *out = wsync_req_dumps(msgs);
    json_decref(msgs);
    if (out == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the message text");
    return out;
}

static json_t *encode_bucket(const char *engine, const char *const *manifests, size_t n_ranks,
                             int first, int finished, const char *weight_version, int packed,
                             int with_buffer, int direct, wsync_error_t *err)
{
    const wsync_shim_t *s = find_shim(engine, err);
    if (s == NULL)
        return NULL;
    if (manifests == NULL || n_ranks == 0) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "encode_bucket needs manifests");
        return NULL;
    }
    wsync_shim_encode_t in = {.manifests = manifests,
                              .n_ranks = n_ranks,
                              .first = first,
                              .finished = finished,
                              .weight_version = weight_version,
                              .packed = packed,
                              .with_buffer = with_buffer,
                              .direct = direct};
    json_t *msgs = NULL;
    if (s->encode(&in, &msgs, err) != WSYNC_OK)
        return NULL;
    return msgs;
}

WSYNC_SHIM_API char *wsync_shim_encode_bucket(const char *engine, const char *const *manifests,
                                              size_t n_ranks, int first, int finished,
                                              const char *weight_version, int packed,
                                              int with_buffer, int direct, wsync_error_t *err)
{
    json_t *msgs = encode_bucket(engine, manifests, n_ranks, first, finished, weight_version,
                                 packed, with_buffer, direct, err);
    return msgs != NULL ? dump_stolen(msgs, err) : NULL;
}

WSYNC_SHIM_API char *wsync_shim_encode_bucket_lines(const char *engine,
                                                    const char *const *manifests, size_t n_ranks,
                                                    int first, int finished,
                                                    const char *weight_version, int packed,
                                                    int with_buffer, int direct, wsync_error_t *err)
{
    json_t *msgs = encode_bucket(engine, manifests, n_ranks, first, finished, weight_version,
                                 packed, with_buffer, direct, err);
    if (msgs == NULL)
        return NULL;
    size_t n = json_array_size(msgs), len = 0;
    char **each = calloc(n ? n : 1, sizeof(*each));
    char *out = NULL;
    int ok = each != NULL;
    for (size_t k = 0; ok && k < n; k++) {
        each[k] = wsync_req_dumps(json_array_get(msgs, k));
        ok = each[k] != NULL;
        len += ok ? strlen(each[k]) + 1 : 0;
    }
    if (ok && (out = malloc(len ? len : 1)) != NULL) {
        size_t at = 0;
        for (size_t k = 0; k < n; k++) {
            const size_t m = strlen(each[k]);
            memcpy(out + at, each[k], m);
            at += m;
            out[at++] = k + 1 < n ? '\n' : '\0';
        }
        if (n == 0)
            out[0] = '\0';
    }
    for (size_t k = 0; each != NULL && k < n; k++)
        free(each[k]);
    free(each);
    json_decref(msgs);
    if (out == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the message texts");
    return out;
}

WSYNC_SHIM_API char *wsync_shim_encode_begin(uint64_t version, int64_t pid,
                                             const char *const *names, size_t n, uint64_t nbytes,
                                             wsync_error_t *err)
{
    return wsync_txn_msg_begin(version, pid, names, n, nbytes, err);
}

WSYNC_SHIM_API char *wsync_shim_encode_commit(uint64_t version, wsync_error_t *err)
{
    return wsync_txn_msg_commit(version, err);
}

WSYNC_SHIM_API char *wsync_shim_encode_abort(const char *reason, wsync_error_t *err)
{
    return wsync_txn_msg_abort(reason, err);
}

WSYNC_SHIM_API char *wsync_shim_encode_state(wsync_error_t *err)
{
    return wsync_txn_msg_state(err);
}

WSYNC_SHIM_API char *wsync_shim_encode_check(const char *const *names, const char *const *dtypes,
                                             const uint32_t *ndims, const int64_t *dims, size_t n,
                                             wsync_error_t *err)
{
    return wsync_txn_msg_check(names, dtypes, ndims, dims, n, err);
}

WSYNC_SHIM_API wsync_result_t wsync_shim_plan_forms(const char *text, size_t len, char *id,
                                                    char **full, char **replay, wsync_error_t *err)
{
    if (id == NULL || full == NULL || replay == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "plan_forms: NULL out argument");
    return wsync_manifest_plan_forms(text, len, id, full, replay, err);
}

WSYNC_SHIM_API char *wsync_shim_encode_torch_manifest(
    const uint8_t *handle, uint32_t handle_len, uint64_t bytes, uint64_t offset, int64_t pid,
    const char *device, uint64_t generation, int finished, const char *const *names,
    const char *const *dtypes, const uint32_t *ndims, const int64_t *dims, const uint64_t *offsets,
    size_t n, wsync_error_t *err)
{
    return wsync_torch_msg_manifest(handle, handle_len, bytes, offset, pid, device, generation,
                                    finished, names, dtypes, ndims, dims, offsets, n, err);
}

WSYNC_SHIM_API char *wsync_shim_encode_lora(const char *engine, const char *name, uint32_t int_id,
                                            const char *path, const char *const *manifests,
                                            size_t n_ranks, const char *config, int unload,
                                            wsync_error_t *err)
{
    const wsync_shim_t *s = find_shim(engine, err);
    if (s == NULL)
        return NULL;
    if (name == NULL || (!unload && path == NULL && (manifests == NULL || n_ranks == 0))) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                     "encode_lora needs a name and a path or manifests");
        return NULL;
    }
    wsync_shim_lora_t in = {.name = name,
                            .int_id = int_id ? int_id : 1,
                            .path = path,
                            .manifests = manifests,
                            .n_ranks = n_ranks,
                            .config = config,
                            .unload = unload};
    json_t *msg = NULL;
    if (s->encode_lora(&in, &msg, err) != WSYNC_OK)
        return NULL;
    return dump_stolen(msg, err);
}

WSYNC_SHIM_API wsync_result_t wsync_shim_order(const char *engine, const char *const *names,
                                               size_t n, size_t *order, wsync_error_t *err)
{
    const wsync_shim_t *s = find_shim(engine, err);
    if (s == NULL)
        return WSYNC_ERR_NOT_FOUND;
    return wsync_map_order(s->map, names, n, order, err);
}

WSYNC_SHIM_API wsync_result_t wsync_shim_plan(const char *engine, const char *const *names,
                                              const uint64_t *nbytes, size_t n,
                                              uint64_t bucket_bytes, unsigned ramp, size_t *order,
                                              size_t *bucket_first, size_t *n_buckets,
                                              wsync_error_t *err)
{
    const wsync_shim_t *s = find_shim(engine, err);
    if (s == NULL)
        return WSYNC_ERR_NOT_FOUND;
    if ((n > 0 && (names == NULL || nbytes == NULL || order == NULL)) || bucket_first == NULL ||
        n_buckets == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "plan needs names, nbytes, order, bucket_first and n_buckets");
    return wsync_map_plan_buckets(s->map, names, nbytes, n, bucket_bytes, ramp, order, bucket_first,
                                  n_buckets, err);
}

WSYNC_SHIM_API wsync_result_t wsync_shim_ep_owners(const char *engine, const char *const *names,
                                                   size_t n, int64_t *experts, uint32_t ep_size,
                                                   int32_t *owner, wsync_error_t *err)
{
    const wsync_shim_t *s = find_shim(engine, err);
    if (s == NULL)
        return WSYNC_ERR_NOT_FOUND;
    if ((n > 0 && (names == NULL || owner == NULL)) || experts == NULL || ep_size == 0)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "ep_owners needs names, owner, experts and an EP size >= 1 (got %u)",
                            ep_size);
    int64_t top = -1;
    for (size_t i = 0; i < n; i++) {
        const int64_t e = names[i] != NULL ? wsync_map_expert_of(s->map, names[i]) : -1;
        owner[i] = e < 0 ? -1 : (int32_t)(e < INT32_MAX ? e : INT32_MAX); /* the index, for now */
        top = e > top ? e : top;
    }
    if (*experts <= 0)
        *experts = top + 1;
    for (size_t i = 0; i < n; i++) /* an index past the model goes to every rank, which refuse it */
        if (owner[i] >= 0)
            owner[i] =
                owner[i] < *experts ? (int32_t)wsync_map_ep_owner(*experts, ep_size, owner[i]) : -1;
    return WSYNC_OK;
}

/* Plugins loaded for producers: kept for the life of the process (their tables stay valid),
 * one loader per distinct request. */
#define WSYNC_SHIM_MAX_PLUGINS 8
static wsync_loader_t plugin_loaders[WSYNC_SHIM_MAX_PLUGINS];
static size_t plugin_count;
static pthread_mutex_t plugin_lock = PTHREAD_MUTEX_INITIALIZER;

WSYNC_SHIM_API wsync_result_t wsync_shim_plugin_open(const char *path, const wsync_plugin_t **out,
                                                     char *loaded_path, size_t cap,
                                                     wsync_error_t *err)
{
    if (out == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "plugin_open needs out");
    pthread_mutex_lock(&plugin_lock);
    wsync_result_t rc = WSYNC_OK;
    if (plugin_count == WSYNC_SHIM_MAX_PLUGINS)
        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY,
                          "%d plugins are loaded already; load each one once",
                          WSYNC_SHIM_MAX_PLUGINS);
    else
        rc = wsync_loader_open(&plugin_loaders[plugin_count], path, NULL, err);
    if (rc == WSYNC_OK) {
        const wsync_loader_t *l = &plugin_loaders[plugin_count++];
        *out = l->plugin;
        if (loaded_path != NULL && cap > 0)
            snprintf(loaded_path, cap, "%s", l->path);
    }
    pthread_mutex_unlock(&plugin_lock);
    return rc;
}

WSYNC_SHIM_API void wsync_shim_api_free(void *p)
{
    free(p);
}
