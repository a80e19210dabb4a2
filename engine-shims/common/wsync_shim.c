/* Shim dispatch and the helpers shims share. Contract in wsync_shim.h. */
#include "wsync_shim.h"
#include "wsync_utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_request.h"

const wsync_shim_t *wsync_shim_find(const char *engine)
{
    static const wsync_shim_t *const all[] = {&wsync_shim_sglang, &wsync_shim_vllm,
                                              &wsync_shim_lmdeploy};
    for (size_t i = 0; engine != NULL && i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(all[i]->engine, engine) == 0)
            return all[i];
    return NULL;
}

void wsync_shim_ctx_init(wsync_shim_ctx_t *ctx, wsync_driver_t *d, uint32_t rank, uint32_t size)
{
    ctx->driver = d;
    ctx->tp_rank = rank;
    ctx->tp_size = size ? size : 1;
    ctx->state = json_object();
    ctx->unfed = NULL;
    ctx->unfed_user = NULL;
}

/* A committed version that left engine parameters unfed: the error naming them. */
static wsync_result_t wsync_shim_check_fed(wsync_shim_ctx_t *ctx, wsync_error_t *err)
{
    json_t *names = ctx->unfed != NULL ? ctx->unfed(ctx->unfed_user) : NULL;
    const size_t n = json_array_size(names);
    wsync_result_t rc = WSYNC_OK;
    if (n > 0) {
        char *list = json_dumps(names, JSON_COMPACT);
        rc = WSYNC_RECORD(err, WSYNC_ERR_LAYOUT_MISMATCH,
                          "%zu engine parameter(s) fed by no tensor of any sync so far: %.300s; "
                          "they hold what the engine loaded at start. Send them (a checkpoint "
                          "with tie_word_embeddings has no lm_head tensor: send "
                          "model.embed_tokens.weight under lm_head.weight too, or let the engine "
                          "share one storage for both)",
                          n, list != NULL ? list : "?");
        free(list);
    }
    json_decref(names);
    return rc;
}

void wsync_shim_ctx_free(wsync_shim_ctx_t *ctx)
{
    json_decref(ctx->state);
    ctx->state = NULL;
}

/* The weight checker: {"method": "wsync_check", "tensors": [{"name", "dtype", "shape"}, ...]}
 * answers {"check": [...]} (wsync_driver_check_tensors). */
static wsync_result_t wsync_shim_check(wsync_shim_ctx_t *ctx, json_t *req, json_t **extra,
                                       wsync_error_t *err)
{
    json_t *list = json_object_get(req, "tensors"), *e;
    size_t n = json_array_size(list), i;
    if (!json_is_array(list))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                            "wsync_check needs \"tensors\": [{\"name\", \"dtype\", \"shape\"}]");
    wsync_tensor_desc_t *t = calloc(n ? n : 1, sizeof(*t));
    if (t == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "wsync_check: %zu tensors", n);
    wsync_result_t rc = WSYNC_OK;
    json_array_foreach(list, i, e)
    {
        json_t *shape = json_object_get(e, "shape"), *dim;
        size_t k;
        t[i].struct_size = sizeof(t[i]);
        t[i].name = json_string_value(json_object_get(e, "name"));
        t[i].dtype = wsync_dtype_from_name(json_string_value(json_object_get(e, "dtype")));
        t[i].ndim = (uint32_t)json_array_size(shape);
        if (t[i].name == NULL || t[i].dtype == WSYNC_DTYPE_INVALID || !json_is_array(shape) ||
            t[i].ndim > WSYNC_MAX_DIMS) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                              "wsync_check: tensors[%zu] needs a name, a known dtype and a shape "
                              "of at most %d dimensions",
                              i, WSYNC_MAX_DIMS);
            break;
        }
        json_array_foreach(shape, k, dim) t[i].shape[k] = json_integer_value(dim);
        if (wsync_tensor_nbytes(t[i].dtype, t[i].ndim, t[i].shape, &t[i].nbytes) != 0) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                              "wsync_check: tensors[%zu] (\"%.80s\"): "
                              "a bad shape",
                              i, t[i].name);
            break;
        }
    }
    json_t *out = NULL;
    if (rc == WSYNC_OK)
        rc = wsync_driver_check_tensors(ctx->driver, t, n, &out, err);
    free(t);
    if (rc == WSYNC_OK)
        *extra = json_pack("{s:o}", "check", out);
    return rc;
}

/* wsync's own transaction methods, the same for every engine:
 *   {"method": "wsync_begin", "version": v, "pid": producer pid,
 *    "expect": {"tensors": n, "bytes": b, "names": [...]}}
 *   {"method": "wsync_commit", "version": v}   {"method": "wsync_abort", "reason": "..."}
 *   {"method": "wsync_state"}                  (each reply carries "txn": the state) */
static wsync_result_t wsync_shim_txn(wsync_shim_ctx_t *ctx, const char *method, json_t *req,
                                     json_t **extra, wsync_error_t *err)
{
    wsync_driver_t *d = ctx->driver;
    wsync_result_t rc = WSYNC_OK;
    uint64_t version = 0;
    json_t *v = json_object_get(req, "version");
    if (v != NULL && (!json_is_integer(v) || json_integer_value(v) <= 0))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "%s: \"version\" must be an integer >= 1",
                            method);
    version = v != NULL ? (uint64_t)json_integer_value(v) : 0;
    if (strcmp(method, "wsync_begin") == 0) {
        json_t *expect = json_object_get(req, "expect");
        json_t *names = json_object_get(expect, "names");
        json_t *nt = json_object_get(expect, "tensors"), *nb = json_object_get(expect, "bytes");
        if (version == 0 || (expect != NULL && !json_is_object(expect)) ||
            (names != NULL && !json_is_array(names)) || (nt != NULL && !json_is_integer(nt)) ||
            (nb != NULL && !json_is_integer(nb)))
            return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                                "wsync_begin needs \"version\" (>= 1) and an optional \"expect\": "
                                "{\"tensors\": int, \"bytes\": int, \"names\": [string]}");
        size_t n = json_array_size(names);
        const char **list = n > 0 ? calloc(n, sizeof(*list)) : NULL;
        if (n > 0 && list == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "wsync_begin: %zu names", n);
        for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
            if ((list[i] = json_string_value(json_array_get(names, i))) == NULL)
                rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                                  "wsync_begin: names[%zu] is not a "
                                  "string",
                                  i);
        json_t *pid = json_object_get(req, "pid"); /* its producer: gone, the version ends */
        json_t *bad = (nt != NULL && json_integer_value(nt) < 0)   ? nt
                      : (nb != NULL && json_integer_value(nb) < 0) ? nb
                      : (pid != NULL && (!json_is_integer(pid) || json_integer_value(pid) < 1))
                          ? pid
                          : NULL;
        if (rc == WSYNC_OK && bad != NULL) {
            char *shown = wsync_req_show(bad);
            rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "wsync_begin: %s must be %s, got %s",
                              bad == nt   ? "expect.tensors"
                              : bad == nb ? "expect.bytes"
                                          : "pid",
                              bad == pid ? "the producer's process id (an integer >= 1)"
                                         : "an integer >= 0",
                              shown != NULL ? shown : "?");
            free(shown);
        }
        if (rc == WSYNC_OK)
            rc = wsync_driver_begin(d, version, nt ? (uint64_t)json_integer_value(nt) : 0,
                                    nb ? (uint64_t)json_integer_value(nb) : 0, list, n, err);
        if (rc == WSYNC_OK && pid != NULL)
            wsync_driver_set_producer(d, (int64_t)json_integer_value(pid));
        free(list);
    } else if (strcmp(method, "wsync_commit") == 0) {
        rc = wsync_driver_drain(d, err); /* committed means copied */
        if (rc == WSYNC_OK)
            rc = wsync_driver_commit(d, version, err);
    } else if (strcmp(method, "wsync_abort") == 0) {
        const char *why = json_string_value(json_object_get(req, "reason"));
        wsync_driver_abort(d, why != NULL ? why : "aborted by its producer");
    } else if (strcmp(method, "wsync_check") == 0) {
        return wsync_shim_check(ctx, req, extra, err);
    } else if (strcmp(method, "wsync_state") != 0) {
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "unknown method \"%s\"; wsync's own are wsync_begin, wsync_commit, "
                            "wsync_abort, wsync_state and wsync_check",
                            method);
    }
    if (rc == WSYNC_OK)
        *extra = json_pack("{s:o}", "txn", wsync_driver_state(d));
    return rc;
}

wsync_result_t wsync_shim_commit(wsync_shim_ctx_t *ctx, wsync_error_t *err)
{
    wsync_result_t rc = wsync_driver_drain(ctx->driver, err);
    if (rc != WSYNC_OK)
        return rc;
    int updating = 0;
    (void)wsync_driver_committed(ctx->driver, &updating);
    return updating ? wsync_driver_commit(ctx->driver, 0, err) : WSYNC_OK;
}

char *wsync_shim_serve(const wsync_shim_t *s, wsync_shim_ctx_t *ctx, const char *text, size_t len,
                       wsync_result_t *rc_out, wsync_error_t *err)
{
    wsync_error_t local = {.struct_size = sizeof(local)};
    wsync_error_t *e = err != NULL ? err : &local;
    json_error_t jerr;
    const double t0 = wsync_driver_timing() ? wsync_driver_us() : 0;
    /* A request carries at most one manifest per rank: past that it is refused unread, so its
     * size costs nothing (the manifests' own limits are the plugin's). */
    const uint64_t cap =
        ((uint64_t)ctx->tp_size + 1) * wsync_driver_max_manifest_bytes(ctx->driver);
    if (len > cap) {
        wsync_result_t big = WSYNC_RECORD(e, WSYNC_ERR_BAD_REQUEST,
                                          "%s request of %zu bytes: over the limit of %llu (%u "
                                          "rank(s) + 1 times max_manifest_bytes); send smaller "
                                          "buckets or raise max_manifest_bytes",
                                          s->engine, len, (unsigned long long)cap, ctx->tp_size);
        json_t *r = wsync_req_reply_error(NULL, big, e);
        char *o = r != NULL ? json_dumps(r, JSON_COMPACT) : NULL;
        json_decref(r);
        if (rc_out != NULL)
            *rc_out = big;
        return o;
    }
    json_t *req = wsync_req_loadb(text, len, &jerr), *extra = NULL, *reply;
    const double t1 = t0 > 0 ? wsync_driver_us() : 0;
    const char *method = NULL;
    wsync_result_t rc;
    char *out;

    if (req == NULL)
        rc = WSYNC_RECORD(e, WSYNC_ERR_BAD_REQUEST, "%s request is not JSON: %s (line %d)",
                          s->engine, jerr.text, jerr.line);
    else if ((method = json_string_value(json_object_get(req, "method"))) == NULL)
        rc = WSYNC_RECORD(e, WSYNC_ERR_BAD_REQUEST, "%s request has no \"method\" string",
                          s->engine);
    else if (strncmp(method, "wsync_", 6) == 0) {
        rc = wsync_shim_txn(ctx, method, req, &extra, e);
        json_t *names = rc == WSYNC_OK && strcmp(method, "wsync_check") == 0 && ctx->unfed != NULL
                            ? ctx->unfed(ctx->unfed_user)
                            : NULL;
        if (json_array_size(names) > 0 && json_is_object(extra))
            json_object_set(extra, "unfed", names);
        json_decref(names);
    } else {
        const uint64_t before = wsync_driver_committed(ctx->driver, NULL);
        wsync_driver_check(ctx->driver); /* a version whose producer died ends here */
        rc = s->handle(ctx, method, req, &extra, e);
        wsync_driver_refuse(ctx->driver, WSYNC_OK, NULL); /* a refusal no apply took */
        const uint64_t after = wsync_driver_committed(ctx->driver, NULL);
        if (rc == WSYNC_OK && after != before) { /* this request committed a version */
            if (extra == NULL)
                extra = json_object();
            json_object_set_new(extra, "committed", json_integer((json_int_t)after));
            rc = wsync_shim_check_fed(ctx, e);
        }
    }
    const double t2 = t0 > 0 ? wsync_driver_us() : 0;
    reply =
        rc == WSYNC_OK ? wsync_req_reply_ok(method, extra) : wsync_req_reply_error(method, rc, e);
    if (rc != WSYNC_OK)
        json_decref(extra);
    out = reply != NULL ? json_dumps(reply, JSON_COMPACT) : NULL;
    if (t0 > 0)
        fprintf(stderr,
                "wsync serve: %s request of %zu bytes: JSON parse %.0f us, handling %.0f us, "
                "reply %.0f us\n",
                method != NULL ? method : "?", len, t1 - t0, t2 - t1, wsync_driver_us() - t2);
    json_decref(reply);
    json_decref(req);
    if (rc_out != NULL)
        *rc_out = rc;
    return out;
}

wsync_result_t wsync_shim_apply(wsync_shim_ctx_t *ctx, json_t **manifests, size_t n,
                                uint64_t *generation, wsync_error_t *err)
{
    char **text = calloc(n ? n : 1, sizeof(*text));
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    wsync_result_t rc =
        text && lens ? WSYNC_OK : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "apply: OOM");

    for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
        rc = wsync_req_dump(manifests[i], &text[i], &lens[i], err);
    if (rc == WSYNC_OK)
        rc = wsync_driver_apply(ctx->driver, (const char *const *)text, lens, n, generation, err);
    for (size_t i = 0; i < n; i++) {
        if (text != NULL)
            free(text[i]);
        json_decref(manifests[i]);
    }
    free(text);
    free(lens);
    return rc;
}

wsync_result_t wsync_shim_apply_text(wsync_shim_ctx_t *ctx, const char *text, size_t len,
                                     uint64_t *generation, wsync_error_t *err)
{
    return wsync_driver_apply(ctx->driver, &text, &len, 1, generation, err);
}

wsync_result_t wsync_shim_apply_rank_manifest(wsync_shim_ctx_t *ctx, json_t *list, const char *what,
                                              uint64_t *generation, wsync_error_t *err)
{
    json_t *m = wsync_req_pick_rank(list, ctx->tp_rank, ctx->tp_size, what, err);
    if (m == NULL)
        return WSYNC_ERR_BAD_REQUEST;
    if (!json_is_string(m))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                            "%s: with load_format \"%s\" each entry is the manifest text publish "
                            "returned, not a JSON %s",
                            what, WSYNC_SHIM_MANIFEST_FORMAT,
                            json_is_object(m) ? "object" : "value of another type");
    return wsync_shim_apply_text(ctx, json_string_value(m), json_string_length(m), generation, err);
}

json_t *wsync_shim_rank_texts(const wsync_shim_encode_t *in, wsync_error_t *err)
{
    json_t *list = json_array();
    for (size_t r = 0; list != NULL && r < in->n_ranks; r++) {
        /* checked here once, by the plugin's own rule (jansson's), then taken as is */
        const char *t = in->manifests[r];
        const size_t n = t != NULL ? strlen(t) : 0;
        json_t *v = t != NULL && wsync_utf8_invalid_n(t, n) == (size_t)-1
                        ? json_stringn_nocheck(t, n)
                        : NULL;
        if (json_array_append_new(list, v) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    if (list == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                     "encode: a manifest is not UTF-8 text (or out of memory); pass what publish "
                     "returned");
    return list;
}

int wsync_shim_is_direct(const wsync_shim_encode_t *in)
{
    return in->direct != 0;
}

json_t *wsync_shim_rank_buckets(const wsync_shim_encode_t *in, int with_buffer, wsync_error_t *err)
{
    json_t *list = json_array();
    for (size_t r = 0; list != NULL && r < in->n_ranks; r++) {
        json_t *b = wsync_req_bucket_encode(in->manifests[r], with_buffer, err);
        if (b == NULL) {
            json_decref(list);
            return NULL;
        }
        json_array_append_new(list, b);
    }
    return list;
}

wsync_result_t wsync_shim_flat_bucket(const wsync_shim_ctx_t *ctx, json_t *req, const char *key,
                                      int format_required, json_t **bucket, wsync_error_t *err)
{
    const char *fmt = json_string_value(json_object_get(req, "load_format"));
    json_t *b;

    if ((fmt != NULL || format_required) && (fmt == NULL || strcmp(fmt, "flattened_bucket") != 0))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "load_format \"%s\" is not supported by the wsync path; send "
                            "load_format=\"flattened_bucket\"",
                            fmt ? fmt : "(none)");
    b = wsync_req_pick_rank(json_object_get(req, key), ctx->tp_rank, ctx->tp_size, key, err);
    if (b == NULL)
        return WSYNC_ERR_BAD_REQUEST;
    *bucket = b;
    return WSYNC_OK;
}
