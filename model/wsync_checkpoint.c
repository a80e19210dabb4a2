/* A Hugging Face model directory. Contract in wsync_checkpoint.h. */
#include "wsync_checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wsync_convert.h"
#include "wsync_model_config.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_safetensors.h"

struct wsync_checkpoint {
    wsync_model_t model;
    wsync_ckpt_tensor_t *tensors;
    wsync_safetensors_t **shards;
    char **shard_names;
    size_t n_shards;
};

static char *wsync_ckpt_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n < (64l << 20) && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)n + 1)) != NULL) {
            *len = fread(buf, 1, (size_t)n, f);
            buf[*len] = '\0';
        }
    }
    fclose(f);
    return buf;
}

static int wsync_ckpt_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Index of shard `name` in c, opening it when new. */
static wsync_result_t wsync_ckpt_shard(wsync_checkpoint_t *c, const char *dir, const char *name,
                                       size_t *at, wsync_error_t *err)
{
    for (size_t i = 0; i < c->n_shards; i++)
        if (strcmp(c->shard_names[i], name) == 0) {
            *at = i;
            return WSYNC_OK;
        }
    if (strchr(name, '/') != NULL || strcmp(name, "..") == 0)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_ADAPTER,
                            "shard \"%.200s\" is not a file name inside the model directory", name);
    void *a = realloc(c->shards, (c->n_shards + 1) * sizeof(*c->shards));
    if (a != NULL)
        c->shards = a;
    void *b = realloc(c->shard_names, (c->n_shards + 1) * sizeof(*c->shard_names));
    if (b != NULL)
        c->shard_names = b;
    if (a == NULL || b == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "checkpoint: %zu shards", c->n_shards);
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    wsync_safetensors_t *st = NULL;
    wsync_result_t rc = wsync_safetensors_open(path, &st, err);
    if (rc != WSYNC_OK)
        return rc;
    c->shards[c->n_shards] = st;
    c->shard_names[c->n_shards] = strdup(name);
    *at = c->n_shards++;
    return WSYNC_OK;
}

static wsync_result_t wsync_ckpt_check(const wsync_model_tensor_t *want,
                                       const wsync_st_tensor_t *got, const char *shard,
                                       wsync_error_t *err)
{
    int same = got->ndim == want->ndim;
    for (uint32_t k = 0; same && k < want->ndim; k++)
        same = got->shape[k] == want->shape[k];
    if (!same)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "tensor \"%s\" in %s has shape [%lld%s%lld] (%u dims), config.json "
                            "says [%lld, %lld] (%u dims)",
                            want->name, shard, (long long)got->shape[0], got->ndim > 1 ? ", " : "",
                            got->ndim > 1 ? (long long)got->shape[1] : 0ll, got->ndim,
                            (long long)want->shape[0], (long long)want->shape[1], want->ndim);
    if (got->dtype != want->dtype &&
        !(wsync_convert_is_float(got->dtype) && wsync_convert_is_float(want->dtype)))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "tensor \"%s\" in %s is %s, the model holds %s: only floating-point "
                            "tensors convert, never integers or bools",
                            want->name, shard, wsync_dtype_name(got->dtype),
                            wsync_dtype_name(want->dtype));
    return WSYNC_OK;
}

wsync_result_t wsync_checkpoint_open(const char *dir, wsync_checkpoint_t **out, wsync_error_t *err)
{
    char path[4096];
    size_t len = 0;
    *out = NULL;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *cfg = wsync_ckpt_read(path, &len);
    if (cfg == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                            "%s: no config.json (a Hugging Face model "
                            "directory has one)",
                            dir);
    wsync_checkpoint_t *c = calloc(1, sizeof(*c));
    char why[256];
    wsync_result_t rc = WSYNC_OK;
    if (c == NULL)
        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
    else if (wsync_model_from_config(&c->model, cfg, len, why, sizeof(why)) != 0)
        rc = WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "%s/config.json: %s", dir, why);
    free(cfg);
    json_t *map = NULL;
    if (rc == WSYNC_OK) {
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
        if (wsync_ckpt_exists(path)) {
            json_error_t jerr;
            json_t *idx = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
            map = json_incref(json_object_get(idx, "weight_map"));
            json_decref(idx);
            if (!json_is_object(map))
                rc = WSYNC_RECORD(err, WSYNC_ERR_BAD_ADAPTER, "%s: no \"weight_map\" object (%s)",
                                  path, idx ? "missing" : jerr.text);
        } else {
            snprintf(path, sizeof(path), "%s/model.safetensors", dir);
            if (!wsync_ckpt_exists(path))
                rc = WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                                  "%s: no model.safetensors and no model.safetensors.index.json",
                                  dir);
        }
    }
    if (rc == WSYNC_OK &&
        (c->tensors = calloc(c->model.n ? c->model.n : 1, sizeof(*c->tensors))) == NULL)
        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "checkpoint: %zu tensors", c->model.n);
    for (size_t i = 0; rc == WSYNC_OK && i < c->model.n; i++) {
        const wsync_model_tensor_t *want = &c->model.tensors[i];
        const char *shard =
            map != NULL ? json_string_value(json_object_get(map, want->name)) : "model.safetensors";
        if (shard == NULL) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                              "tensor \"%s\" (config.json's %s) is in no shard of %s's index",
                              want->name, c->model.layout, dir);
            break;
        }
        size_t at = 0;
        if ((rc = wsync_ckpt_shard(c, dir, shard, &at, err)) != WSYNC_OK)
            break;
        const wsync_st_tensor_t *got = wsync_safetensors_lookup(c->shards[at], want->name);
        if (got == NULL) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                              "tensor \"%s\" (config.json's %s) is missing from %s", want->name,
                              c->model.layout, shard);
            break;
        }
        if ((rc = wsync_ckpt_check(want, got, shard, err)) != WSYNC_OK)
            break;
        c->tensors[i] = (wsync_ckpt_tensor_t){.want = want,
                                              .data = got->data,
                                              .file_dtype = got->dtype,
                                              .file_nbytes = got->nbytes,
                                              .shard = c->shard_names[at]};
    }
    json_decref(map);
    if (rc != WSYNC_OK) {
        wsync_checkpoint_close(c);
        return rc;
    }
    *out = c;
    return WSYNC_OK;
}

void wsync_checkpoint_close(wsync_checkpoint_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_shards; i++) {
        wsync_safetensors_close(c->shards[i]);
        free(c->shard_names[i]);
    }
    free(c->shards);
    free(c->shard_names);
    free(c->tensors);
    wsync_model_free(&c->model);
    free(c);
}

const wsync_model_t *wsync_checkpoint_model(const wsync_checkpoint_t *c)
{
    return &c->model;
}

const wsync_ckpt_tensor_t *wsync_checkpoint_tensor(const wsync_checkpoint_t *c, size_t i)
{
    return i < c->model.n ? &c->tensors[i] : NULL;
}

size_t wsync_checkpoint_shards(const wsync_checkpoint_t *c)
{
    return c->n_shards;
}

void wsync_checkpoint_shard_mapping(const wsync_checkpoint_t *c, size_t k, const void **base,
                                    size_t *len)
{
    wsync_safetensors_mapping(c->shards[k], base, len);
}

static void wsync_checkpoint_release(void *c)
{
    wsync_checkpoint_close(c);
}

int wsync_checkpoint_load_model(wsync_model_t *m, const char *dir, wsync_dtype_t dtype, char *why,
                                size_t len)
{
    wsync_checkpoint_t *c = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_checkpoint_open(dir, &c, &err) != WSYNC_OK) {
        snprintf(why, len, "%s", err.message);
        return -1;
    }
    const wsync_model_t *src = wsync_checkpoint_model(c);
    snprintf(m->layout, sizeof(m->layout), "%s", src->layout);
    m->tensors = malloc((src->n ? src->n : 1) * sizeof(*m->tensors));
    if (m->tensors == NULL) {
        wsync_checkpoint_close(c);
        snprintf(why, len, "out of memory for %zu tensors", src->n);
        return -1;
    }
    m->n = src->n;
    for (size_t i = 0; i < src->n; i++) {
        const wsync_ckpt_tensor_t *t = wsync_checkpoint_tensor(c, i);
        m->tensors[i] = src->tensors[i];
        m->tensors[i].data = t->data;
        m->tensors[i].file_dtype = t->file_dtype;
        if (dtype != WSYNC_DTYPE_INVALID && wsync_convert_is_float(t->file_dtype)) {
            m->tensors[i].dtype = dtype; /* converted on the way (wsync_model_fill) */
            m->tensors[i].nbytes =
                t->file_nbytes / wsync_dtype_size(t->file_dtype) * wsync_dtype_size(dtype);
        }
    }
    m->owner = c;
    m->owner_close = wsync_checkpoint_release;
    if (wsync_model_finish(m) != 0) {
        wsync_model_free(m);
        snprintf(why, len, "out of memory indexing %zu tensors", src->n);
        return -1;
    }
    return 0;
}

wsync_checkpoint_t *wsync_checkpoint_of(const wsync_model_t *m)
{
    return m->owner_close == wsync_checkpoint_release ? m->owner : NULL;
}
