/* See wsync_nccl_desc.h. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_base64.h"
#include "wsync_error.h"
#include "wsync_nccl_desc.h"

uint64_t wsync_nccl_bucket_count(const wsync_manifest_t *m)
{
    uint64_t end = 0;
    for (size_t i = 0; m != NULL && i < m->n_tensors; i++)
        if (m->tensors[i].offset + m->tensors[i].nbytes > end)
            end = m->tensors[i].offset + m->tensors[i].nbytes; /* validated: no overflow */
    return end;
}

static wsync_result_t check_desc(const wsync_nccl_desc_t *d, uint64_t buffer_bytes,
                                 wsync_error_t *err)
{
    if (d->nranks < 1 || d->nranks > WSYNC_NCCL_MAX_RANKS)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "buffer.nccl.nranks %u is outside [1, %d] (producer + engine ranks)",
                          d->nranks, WSYNC_NCCL_MAX_RANKS);
    if (d->root != WSYNC_NCCL_ROOT_RANK)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "buffer.nccl.root %u: the producer is always rank %d", d->root,
                          WSYNC_NCCL_ROOT_RANK);
    if (d->count > buffer_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "buffer.nccl.count %llu exceeds buffer.bytes %llu",
                          (unsigned long long)d->count, (unsigned long long)buffer_bytes);
    return WSYNC_OK;
}

wsync_result_t wsync_nccl_desc_emit(const char *json, size_t len, const wsync_nccl_desc_t *d,
                                    char **out, wsync_error_t *err)
{
    if (json == NULL || d == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "nccl_desc_emit needs json, d, out");
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    json_t *b = root ? json_object_get(root, "buffer") : NULL;
    if (!json_is_object(b)) {
        json_decref(root);
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "manifest has no buffer object to carry the nccl id (%s)",
                          root ? "buffer missing" : je.text);
    }
    json_int_t bytes = json_integer_value(json_object_get(b, "bytes"));
    wsync_result_t rc = check_desc(d, (uint64_t)bytes, err);
    if (rc != WSYNC_OK) {
        json_decref(root);
        return rc == WSYNC_ERR_BAD_MANIFEST ? WSYNC_ERR_INVALID_ARGUMENT : rc;
    }
    char uid[WSYNC_NCCL_UNIQUE_ID_BYTES * 2];
    wsync_base64_encode((const uint8_t *)d->uid.internal, sizeof(d->uid.internal), uid);
    json_t *n = json_pack("{s:s, s:I, s:I, s:I}", "uid", uid, "nranks", (json_int_t)d->nranks,
                          "root", (json_int_t)d->root, "count", (json_int_t)d->count);
    if (n == NULL || json_object_set_new(b, "nccl", n) != 0) {
        json_decref(root);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for buffer.nccl");
    }
    *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (*out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the manifest text");
    return WSYNC_OK;
}

static wsync_result_t read_uint(const json_t *o, const char *where, const char *key, uint64_t max,
                                uint64_t *v, wsync_error_t *err)
{
    const json_t *j = json_object_get(o, key);
    if (!json_is_integer(j) || json_integer_value(j) < 0 || (uint64_t)json_integer_value(j) > max)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s.%s must be an integer in [0, %llu]",
                          where, key, (unsigned long long)max);
    *v = (uint64_t)json_integer_value(j);
    return WSYNC_OK;
}

wsync_result_t wsync_nccl_desc_parse(const char *json, size_t len, wsync_nccl_desc_t *d,
                                     int *present, wsync_error_t *err)
{
    if (json == NULL || d == NULL || present == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "nccl_desc_parse needs json, d, present");
    *present = 0;
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (root == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "manifest JSON: %s at line %d", je.text,
                          je.line);
    const json_t *b = json_object_get(root, "buffer");
    const json_t *n = json_is_object(b) ? json_object_get(b, "nccl") : NULL;
    wsync_result_t rc = WSYNC_OK;
    uint64_t v = 0, bytes = 0;
    if (n == NULL)
        goto done;
    memset(d, 0, sizeof(*d));
    if (!json_is_object(n)) {
        rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "buffer.nccl must be an object");
        goto done;
    }
    const char *uid = json_string_value(json_object_get(n, "uid"));
    uint8_t raw[WSYNC_NCCL_UNIQUE_ID_BYTES + 4];
    long got = uid ? wsync_base64_decode(uid, raw, sizeof(raw)) : -1;
    if (got != WSYNC_NCCL_UNIQUE_ID_BYTES) {
        rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                        "buffer.nccl.uid must be base64 of %d bytes (an ncclUniqueId), got %ld",
                        WSYNC_NCCL_UNIQUE_ID_BYTES, got);
        goto done;
    }
    memcpy(d->uid.internal, raw, WSYNC_NCCL_UNIQUE_ID_BYTES);
    if ((rc = read_uint(n, "buffer.nccl", "nranks", UINT32_MAX, &v, err)) != WSYNC_OK)
        goto done;
    d->nranks = (uint32_t)v;
    if ((rc = read_uint(n, "buffer.nccl", "root", UINT32_MAX, &v, err)) != WSYNC_OK)
        goto done;
    d->root = (uint32_t)v;
    if ((rc = read_uint(n, "buffer.nccl", "count", INT64_MAX, &d->count, err)) != WSYNC_OK)
        goto done;
    if ((rc = read_uint(b, "buffer", "bytes", INT64_MAX, &bytes, err)) != WSYNC_OK)
        goto done;
    if ((rc = check_desc(d, bytes, err)) != WSYNC_OK)
        goto done;
    *present = 1;
done:
    json_decref(root);
    return rc;
}
