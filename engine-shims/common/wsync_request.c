/* Shared request plumbing. Contract in wsync_request.h. */
#include "wsync_request.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_base64.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_client.h"

json_t *wsync_req_manifest_new(json_t *buffer, uint64_t generation, int finished)
{
    return json_pack("{s:i, s:I, s:b, s:O, s:[]}", "wsync", 1, "generation", (json_int_t)generation,
                     "finished", finished, "buffer", buffer, "tensors");
}

static uint64_t wsync_req_buffer_bytes(json_t *manifest)
{
    json_t *b = json_object_get(json_object_get(manifest, "buffer"), "bytes");
    return json_is_integer(b) && json_integer_value(b) > 0 ? (uint64_t)json_integer_value(b) : 0;
}

wsync_result_t wsync_req_add_tensor(json_t *manifest, const char *name, const char *dtype,
                                    json_t *shape, int64_t numel, uint64_t start, uint64_t end,
                                    json_t *digest, wsync_error_t *err)
{
    wsync_dtype_t dt = wsync_dtype_from_name(dtype);
    uint64_t bytes = wsync_req_buffer_bytes(manifest);
    int64_t prod = 1;
    size_t i;
    json_t *d, *t;

    if (dt == WSYNC_DTYPE_INVALID)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "tensor \"%s\": unknown dtype \"%s\"; use a PyTorch dtype name", name,
                            dtype);
    if (!json_is_array(shape) || json_array_size(shape) > WSYNC_MAX_DIMS)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "tensor \"%s\": shape must be an array of at most %d integers", name,
                            WSYNC_MAX_DIMS);
    json_array_foreach(shape, i, d)
    {
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            (json_integer_value(d) > 0 && prod > INT64_MAX / json_integer_value(d)))
            return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                                "tensor \"%s\": shape[%zu] is not a valid dimension", name, i);
        prod *= json_integer_value(d);
    }
    if (numel >= 0 && numel != prod)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "tensor \"%s\": numel %" PRId64 " but its shape holds %" PRId64
                            " elements",
                            name, numel, prod);
    if (end < start || end - start != (uint64_t)prod * wsync_dtype_size(dt))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "tensor \"%s\": byte range [%" PRIu64 ", %" PRIu64
                            ") does not hold %" PRId64 " x %s (%" PRIu64 " bytes); fix the size",
                            name, start, end, prod, dtype, (uint64_t)prod * wsync_dtype_size(dt));
    if (start >= bytes && end > start)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_BOUNDS,
                            "offset past the buffer: tensor \"%s\" starts at byte %" PRIu64
                            ", but the buffer holds %" PRIu64 " bytes",
                            name, start, bytes);
    if (end > bytes)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "truncated bucket: tensor \"%s\" ends at byte %" PRIu64
                            ", but the buffer holds only %" PRIu64
                            " bytes; the sender cut the bucket short",
                            name, end, bytes);
    t = json_pack("{s:s, s:s, s:O, s:I, s:I}", "name", name, "dtype", dtype, "shape", shape,
                  "offset", (json_int_t)start, "nbytes", (json_int_t)(end - start));
    if (t == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "tensor \"%s\": out of memory", name);
    if (json_is_string(digest))
        json_object_set(t, "digest", digest);
    json_array_append_new(json_object_get(manifest, "tensors"), t);
    return WSYNC_OK;
}

int wsync_req_tensor_bytes(const char *dtype, json_t *shape, uint64_t *out)
{
    wsync_dtype_t dt = wsync_dtype_from_name(dtype ? dtype : "");
    int64_t dims[WSYNC_MAX_DIMS];
    size_t i, n = json_array_size(shape);
    json_t *d;

    if (dt == WSYNC_DTYPE_INVALID || !json_is_array(shape) || n > WSYNC_MAX_DIMS)
        return -1;
    json_array_foreach(shape, i, d)
    {
        if (!json_is_integer(d))
            return -1;
        dims[i] = json_integer_value(d);
    }
    return wsync_tensor_nbytes(dt, (uint32_t)n, dims, out);
}

wsync_result_t wsync_req_dump(json_t *manifest, char **text, size_t *len, wsync_error_t *err)
{
    *text = json_dumps(manifest, JSON_COMPACT);
    if (*text == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "manifest serialization failed");
    *len = strlen(*text);
    return WSYNC_OK;
}

/* A canonical manifest carries its digests in the top-level "digests" blob (wsync_manifest_emit):
 * hand them on per tensor, as the request metadata carries them. 0, or -1 when the blob is not
 * base64 of 8 bytes per tensor. */
static int wsync_req_blob_digests(json_t *m, json_t *meta)
{
    json_t *blob = json_object_get(m, "digests");
    size_t n = json_array_size(meta), i;
    json_t *e;
    if (blob == NULL)
        return 0;
    const char *text = json_string_value(blob);
    uint8_t *raw = text ? malloc(strlen(text) / 4 * 3 + 1) : NULL;
    long got = raw ? wsync_base64_decode(text, raw, strlen(text) / 4 * 3) : -1;
    if (got < 0 || (size_t)got != 8 * n) {
        free(raw);
        return -1;
    }
    json_array_foreach(meta, i, e)
    {
        uint64_t d = 0;
        char buf[32];
        for (int k = 7; k >= 0; k--)
            d = d << 8 | raw[8 * i + (size_t)k];
        wsync64_format(d, buf);
        if (e != NULL && json_object_get(e, "digest") == NULL)
            json_object_set_new(e, "digest", json_string(buf));
    }
    free(raw);
    return 0;
}

json_t *wsync_req_bucket_encode(const char *manifest_json, int with_buffer, wsync_error_t *err)
{
    json_error_t jerr;
    json_t *m = json_loads(manifest_json, 0, &jerr), *meta, *out, *t;
    size_t i;

    if (m == NULL) {
        WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST, "manifest is not JSON: %s (line %d)", jerr.text,
                     jerr.line);
        return NULL;
    }
    meta = json_array();
    json_array_foreach(json_object_get(m, "tensors"), i, t)
    {
        json_int_t off = json_integer_value(json_object_get(t, "offset"));
        json_int_t nb = json_integer_value(json_object_get(t, "nbytes"));
        json_int_t numel = 1;
        size_t j;
        json_t *d;
        json_array_foreach(json_object_get(t, "shape"), j, d) numel *= json_integer_value(d);
        json_t *e =
            json_pack("{s:O, s:O, s:O, s:I, s:I, s:I}", "name", json_object_get(t, "name"), "shape",
                      json_object_get(t, "shape"), "dtype", json_object_get(t, "dtype"),
                      "start_idx", off, "end_idx", off + nb, "numel", numel);
        if (e != NULL && json_object_get(t, "digest") != NULL)
            json_object_set(e, "digest", json_object_get(t, "digest"));
        json_array_append_new(meta, e);
    }
    if (wsync_req_blob_digests(m, meta) != 0) {
        json_decref(meta);
        json_decref(m);
        WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                     "manifest \"digests\" is not base64 of 8 bytes per tensor; pass what "
                     "publish returned");
        return NULL;
    }
    out = json_pack("{s:o, s:O}", "metadata", meta, "generation", json_object_get(m, "generation"));
    if (out != NULL && with_buffer)
        json_object_set_new(out, "flattened_tensor",
                            json_pack("{s:O}", "buffer", json_object_get(m, "buffer")));
    json_decref(m);
    if (out == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                     "manifest lacks generation or buffer; pass what publish returned");
    return out;
}

wsync_result_t wsync_req_bucket_decode(json_t *bucket, json_t *buffer, int finished,
                                       json_t **manifest, wsync_error_t *err)
{
    json_t *meta = json_object_get(bucket, "metadata"), *e, *m;
    uint64_t gen;
    size_t i;

    *manifest = NULL;
    if (buffer == NULL)
        buffer = json_object_get(json_object_get(bucket, "flattened_tensor"), "buffer");
    if (!json_is_object(buffer))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "bucket has no flattened_tensor.buffer and no persistent buffer "
                            "is known; send the flattened tensor with the first bucket");
    if (!json_is_array(meta))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST, "bucket has no metadata array");
    if (wsync_req_get_u64(bucket, "generation", &gen, err) != 0)
        return err != NULL ? err->code : WSYNC_ERR_BAD_MANIFEST;
    m = wsync_req_manifest_new(buffer, gen, finished);
    if (m == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "bucket decode: out of memory");
    json_array_foreach(meta, i, e)
    {
        const char *name = wsync_req_get_str(e, "name", err);
        const char *dtype = name ? wsync_req_get_str(e, "dtype", err) : NULL;
        uint64_t start, end, numel;
        wsync_result_t rc = WSYNC_ERR_BAD_MANIFEST;
        if (dtype != NULL && wsync_req_get_u64(e, "start_idx", &start, err) == 0 &&
            wsync_req_get_u64(e, "end_idx", &end, err) == 0 &&
            wsync_req_get_u64(e, "numel", &numel, err) == 0)
            rc = wsync_req_add_tensor(m, name, dtype, json_object_get(e, "shape"), (int64_t)numel,
                                      start, end, json_object_get(e, "digest"), err);
        if (rc != WSYNC_OK) {
            json_decref(m);
            return rc;
        }
    }
    *manifest = m;
    return WSYNC_OK;
}

json_t *wsync_req_pick_rank(json_t *list, uint32_t rank, uint32_t size, const char *what,
                            wsync_error_t *err)
{
    size_t n = json_array_size(list);
    if (n == size && rank < n)
        return json_array_get(list, rank);
    if (n == 1)
        return json_array_get(list, 0);
    WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                 "%s has %zu entries; a tp-%u engine needs one per rank (or one for all)", what, n,
                 size);
    return NULL;
}

int wsync_req_get_u64(json_t *obj, const char *key, uint64_t *out, wsync_error_t *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "field \"%s\" must be a non-negative integer",
                     key);
        return -1;
    }
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

char *wsync_req_show(const json_t *v)
{
    char *text = v != NULL ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (text != NULL && strlen(text) > 80)
        strcpy(text + 77, "...");
    return text != NULL ? text : strdup("(none)");
}

int wsync_req_get_bool(json_t *obj, const char *key, int dflt, int *out, wsync_error_t *err)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) {
        char *shown = wsync_req_show(v);
        WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "field \"%s\" must be true or false, got %s", key,
                     shown != NULL ? shown : "?");
        free(shown);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

const char *wsync_req_get_str(json_t *obj, const char *key, wsync_error_t *err)
{
    const char *s = json_string_value(json_object_get(obj, key));
    if (s == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "field \"%s\" must be a string", key);
    return s;
}

json_t *wsync_req_reply_ok(const char *method, json_t *extra)
{
    json_t *r = json_pack("{s:b, s:s}", "ok", 1, "method", method);
    if (r != NULL && extra != NULL)
        json_object_update(r, extra);
    json_decref(extra);
    return r;
}

json_t *wsync_req_reply_error(const char *method, wsync_result_t rc, const wsync_error_t *err)
{
    /* Messages quote request bytes (shm names, names cut at the message length): keep the reply
     * valid JSON text by replacing anything outside printable ASCII. */
    char msg[WSYNC_ERROR_MESSAGE_LEN];
    const char *src = err != NULL && err->code != WSYNC_OK ? err->message : wsync_strerror(rc);
    size_t i;

    for (i = 0; src[i] != '\0' && i + 1 < sizeof(msg); i++)
        msg[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    msg[i] = '\0';
    return json_pack("{s:b, s:s, s:s, s:i, s:s}", "ok", 0, "method", method ? method : "?", "error",
                     wsync_strerror(rc), "code", (int)rc, "message", msg);
}
