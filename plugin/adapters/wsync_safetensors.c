/* safetensors reader (mmap + complete header validation) and a small writer. */
#include "wsync_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wsync_dtype.h"
#include "wsync_error.h"

struct wsync_safetensors {
    void *map; /* NULL for an in-memory image */
    size_t map_len;
    const uint8_t *data; /* first byte after the header */
    uint64_t data_len;
    size_t n;
    wsync_st_tensor_t *tensors; /* sorted by data offset */
    json_t *header;             /* owns every name string */
    json_t *metadata;           /* borrowed from header, may be NULL */
};

/* safetensors spells dtypes in upper case; only these spellings are accepted on disk. */
static const struct {
    const char *name;
    wsync_dtype_t dt;
} wsync_st_dtypes[] = {
    {"BF16", WSYNC_DTYPE_BF16}, {"F16", WSYNC_DTYPE_F16},         {"F32", WSYNC_DTYPE_F32},
    {"F64", WSYNC_DTYPE_F64},   {"I8", WSYNC_DTYPE_I8},           {"U8", WSYNC_DTYPE_U8},
    {"I16", WSYNC_DTYPE_I16},   {"I32", WSYNC_DTYPE_I32},         {"I64", WSYNC_DTYPE_I64},
    {"BOOL", WSYNC_DTYPE_BOOL}, {"F8_E4M3", WSYNC_DTYPE_F8_E4M3}, {"F8_E5M2", WSYNC_DTYPE_F8_E5M2},
};
#define WSYNC_N_ST_DTYPES (sizeof(wsync_st_dtypes) / sizeof(wsync_st_dtypes[0]))

static wsync_dtype_t wsync_st_dtype_parse(const char *s)
{
    for (size_t i = 0; i < WSYNC_N_ST_DTYPES; i++)
        if (strcmp(s, wsync_st_dtypes[i].name) == 0)
            return wsync_st_dtypes[i].dt;
    return WSYNC_DTYPE_INVALID;
}

static const char *wsync_st_dtype_name(wsync_dtype_t dt)
{
    for (size_t i = 0; i < WSYNC_N_ST_DTYPES; i++)
        if (wsync_st_dtypes[i].dt == dt)
            return wsync_st_dtypes[i].name;
    return NULL;
}

static int wsync_st_cmp_offset(const void *a, const void *b)
{
    const wsync_st_tensor_t *x = a, *y = b;
    const uint8_t *px = x->data, *py = y->data;
    if (px != py)
        return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : (x->nbytes > y->nbytes);
}

/* Validate one header entry and fill *t. `label` names the file in messages. */
static wsync_result_t wsync_st_entry(wsync_safetensors_t *st, const char *label, const char *name,
                                     json_t *v, wsync_st_tensor_t *t, wsync_error_t *err)
{
    if (!json_is_object(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": header entry is not an object", label, name);
    json_t *jdt = json_object_get(v, "dtype");
    json_t *jshape = json_object_get(v, "shape");
    json_t *joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": \"dtype\" missing or not a string", label, name);
    t->dtype = wsync_st_dtype_parse(json_string_value(jdt));
    if (t->dtype == WSYNC_DTYPE_INVALID)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": unknown dtype \"%s\" (known: BF16 F16 F32 F64 I8 U8 "
                          "I16 I32 I64 BOOL F8_E4M3 F8_E5M2)",
                          label, name, json_string_value(jdt));
    if (!json_is_array(jshape) || json_array_size(jshape) > WSYNC_MAX_DIMS)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": \"shape\" must be an array of at most %d integers",
                          label, name, WSYNC_MAX_DIMS);
    t->ndim = (uint32_t)json_array_size(jshape);
    for (uint32_t d = 0; d < t->ndim; d++) {
        json_t *e = json_array_get(jshape, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                              "%s: tensor \"%s\": shape[%u] is not a non-negative integer", label,
                              name, d);
        t->shape[d] = json_integer_value(e);
    }
    if (!json_is_array(joff) || json_array_size(joff) != 2 ||
        !json_is_integer(json_array_get(joff, 0)) || !json_is_integer(json_array_get(joff, 1)))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] integers",
                          label, name);
    json_int_t begin = json_integer_value(json_array_get(joff, 0));
    json_int_t end = json_integer_value(json_array_get(joff, 1));
    if (begin < 0 || end < begin || (uint64_t)end > st->data_len)
        return WSYNC_FAIL(
            err, WSYNC_ERR_OUT_OF_BOUNDS,
            "%s: tensor \"%s\": data_offsets [%lld, %lld] outside the %llu data bytes", label, name,
            (long long)begin, (long long)end, (unsigned long long)st->data_len);
    uint64_t want;
    if (wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, &want) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": shape overflows 64-bit byte counts", label, name);
    if ((uint64_t)(end - begin) != want)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: tensor \"%s\": data_offsets [%lld, %lld] hold %llu bytes but %s x "
                          "shape needs %llu",
                          label, name, (long long)begin, (long long)end,
                          (unsigned long long)(end - begin), json_string_value(jdt),
                          (unsigned long long)want);
    t->name = name;
    t->data = st->data + begin;
    t->nbytes = want;
    return WSYNC_OK;
}

static wsync_result_t wsync_st_metadata(wsync_safetensors_t *st, const char *label, json_t *meta,
                                        wsync_error_t *err)
{
    if (!json_is_object(meta))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: \"__metadata__\" must be an object of strings", label);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v)
    {
        if (!json_is_string(v))
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                              "%s: \"__metadata__\" value of \"%s\" is not a string", label, k);
    }
    st->metadata = meta;
    return WSYNC_OK;
}

/* Sorted by offset, each tensor must start where the previous one ended; the last must end at
 * the end of the data. Empty tensors take no bytes and are exempt. */
static wsync_result_t wsync_st_check_extents(wsync_safetensors_t *st, const char *label,
                                             wsync_error_t *err)
{
    qsort(st->tensors, st->n, sizeof(*st->tensors), wsync_st_cmp_offset);
    uint64_t pos = 0;
    const wsync_st_tensor_t *prev = NULL;
    for (size_t i = 0; i < st->n; i++) {
        const wsync_st_tensor_t *t = &st->tensors[i];
        if (t->nbytes == 0)
            continue;
        uint64_t b = (uint64_t)((const uint8_t *)t->data - st->data);
        if (b < pos)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                              "%s: tensor \"%s\" bytes [%llu, %llu) overlap tensor \"%s\" bytes "
                              "[.., %llu)",
                              label, t->name, (unsigned long long)b,
                              (unsigned long long)(b + t->nbytes), prev->name,
                              (unsigned long long)pos);
        if (b > pos)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                              "%s: bytes [%llu, %llu) before tensor \"%s\" belong to no tensor "
                              "(safetensors data must be fully indexed)",
                              label, (unsigned long long)pos, (unsigned long long)b, t->name);
        pos = b + t->nbytes;
        prev = t;
    }
    if (pos != st->data_len)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: data is %llu bytes but tensors end at byte %llu (trailing bytes "
                          "belong to no tensor)",
                          label, (unsigned long long)st->data_len, (unsigned long long)pos);
    return WSYNC_OK;
}

static wsync_result_t wsync_st_parse(wsync_safetensors_t *st, const uint8_t *bytes, size_t len,
                                     const char *label, wsync_error_t *err)
{
    if (len < 8)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: %zu bytes is too short for a safetensors file (8-byte header "
                          "length missing)",
                          label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | bytes[i];
    if (hlen > WSYNC_SAFETENSORS_MAX_HEADER)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: header length %llu exceeds the %u-byte limit (corrupt file?)", label,
                          (unsigned long long)hlen, WSYNC_SAFETENSORS_MAX_HEADER);
    if (hlen > len - 8)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "%s: header length %llu runs past the end of the %zu-byte file", label,
                          (unsigned long long)hlen, len);
    st->data = bytes + 8 + hlen;
    st->data_len = len - 8 - hlen;

    json_error_t jerr;
    st->header = json_loadb((const char *)bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (st->header == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: header is not valid JSON (%s at byte %d)", label, jerr.text,
                          jerr.position);
    if (!json_is_object(st->header))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, "%s: header is not a JSON object", label);

    size_t cap = json_object_size(st->header);
    st->tensors = calloc(cap ? cap : 1, sizeof(*st->tensors));
    if (st->tensors == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%s: %zu header entries", label, cap);
    const char *k;
    json_t *v;
    json_object_foreach(st->header, k, v)
    {
        wsync_result_t rc;
        if (strcmp(k, "__metadata__") == 0)
            rc = wsync_st_metadata(st, label, v, err);
        else
            rc = wsync_st_entry(st, label, k, v, &st->tensors[st->n++], err);
        if (rc != WSYNC_OK)
            return rc;
    }
    return wsync_st_check_extents(st, label, err);
}

wsync_result_t wsync_safetensors_open_memory(const void *bytes, size_t len, const char *label,
                                             wsync_safetensors_t **out, wsync_error_t *err)
{
    if (out == NULL || (bytes == NULL && len > 0))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "bytes/out must not be NULL");
    *out = NULL;
    wsync_safetensors_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "safetensors reader");
    wsync_result_t rc = wsync_st_parse(st, bytes, len, label ? label : "safetensors", err);
    if (rc != WSYNC_OK) {
        wsync_safetensors_close(st);
        return rc;
    }
    *out = st;
    return WSYNC_OK;
}

wsync_result_t wsync_safetensors_open(const char *path, wsync_safetensors_t **out,
                                      wsync_error_t *err)
{
    if (path == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "path/out must not be NULL");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return WSYNC_FAIL(err, errno == ENOENT ? WSYNC_ERR_NOT_FOUND : WSYNC_ERR_SYSTEM,
                          "open(%s): %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        close(fd);
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "%s: not a regular file (%s)", path, strerror(e));
    }
    size_t len = (size_t)sb.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "mmap(%s, %zu bytes): %s", path, len,
                              strerror(e));
        }
    }
    close(fd);
    wsync_safetensors_t *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        if (map)
            munmap(map, len);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "safetensors reader for %s", path);
    }
    st->map = map;
    st->map_len = len;
    wsync_result_t rc = wsync_st_parse(st, map, len, path, err);
    if (rc != WSYNC_OK) {
        wsync_safetensors_close(st);
        return rc;
    }
    *out = st;
    return WSYNC_OK;
}

void wsync_safetensors_close(wsync_safetensors_t *st)
{
    if (st == NULL)
        return;
    if (st->map != NULL)
        munmap(st->map, st->map_len);
    json_decref(st->header);
    free(st->tensors);
    free(st);
}

void wsync_safetensors_mapping(const wsync_safetensors_t *st, const void **base, size_t *len)
{
    if (st->map != NULL) {
        *base = st->map;
        *len = st->map_len;
    } else {
        *base = st->data;
        *len = (size_t)st->data_len;
    }
}

size_t wsync_safetensors_count(const wsync_safetensors_t *st)
{
    return st ? st->n : 0;
}

const wsync_st_tensor_t *wsync_safetensors_tensors(const wsync_safetensors_t *st)
{
    return st && st->n > 0 ? st->tensors : NULL;
}

const wsync_st_tensor_t *wsync_safetensors_at(const wsync_safetensors_t *st, size_t i)
{
    return (st && i < st->n) ? &st->tensors[i] : NULL;
}

const wsync_st_tensor_t *wsync_safetensors_lookup(const wsync_safetensors_t *st, const char *name)
{
    if (st == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < st->n; i++)
        if (strcmp(st->tensors[i].name, name) == 0)
            return &st->tensors[i];
    return NULL;
}

const char *wsync_safetensors_metadata(const wsync_safetensors_t *st, const char *key)
{
    if (st == NULL || st->metadata == NULL || key == NULL)
        return NULL;
    return json_string_value(json_object_get(st->metadata, key));
}

/* ------------------------------------------------------------------ writer */

static wsync_result_t wsync_st_build_header(const wsync_st_write_tensor_t *tensors, size_t n,
                                            const json_t *metadata, char **out, uint64_t *data_len,
                                            wsync_error_t *err)
{
    json_t *h = json_object();
    uint64_t pos = 0;
    if (h == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "safetensors header");
    if (metadata != NULL)
        json_object_set_new(h, "__metadata__", json_deep_copy(metadata));
    for (size_t i = 0; i < n; i++) {
        const wsync_st_write_tensor_t *t = &tensors[i];
        const char *dn = wsync_st_dtype_name(t->dtype);
        uint64_t nb;
        if (t->name == NULL || dn == NULL ||
            wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, &nb) != 0 ||
            (nb > 0 && t->data == NULL)) {
            json_decref(h);
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensors[%zu] (\"%s\"): bad name, dtype, shape or data", i,
                              t->name ? t->name : "(null)");
        }
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dn, "shape", shape, "data_offsets",
                              (json_int_t)pos, (json_int_t)(pos + nb));
        if (e == NULL || json_object_set_new(h, t->name, e) != 0) {
            json_decref(h);
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "safetensors header entry \"%s\"",
                              t->name);
        }
        pos += nb;
    }
    *out = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    *data_len = pos;
    if (*out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "safetensors header text");
    return WSYNC_OK;
}

wsync_result_t wsync_safetensors_write(const char *path, const wsync_st_write_tensor_t *tensors,
                                       size_t n, const json_t *metadata, wsync_error_t *err)
{
    if (path == NULL || (n > 0 && tensors == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "path/tensors must not be NULL");
    char *header = NULL;
    uint64_t data_len = 0;
    wsync_result_t rc = wsync_st_build_header(tensors, n, metadata, &header, &data_len, err);
    if (rc != WSYNC_OK)
        return rc;
    /* Pad with spaces so the data starts 8-byte aligned, as the reference writer does. */
    size_t hlen = strlen(header);
    size_t padded = (8 + hlen + 7) / 8 * 8 - 8;
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        free(header);
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "fopen(%s): %s", path, strerror(errno));
    }
    uint8_t lenbytes[8];
    for (int i = 0; i < 8; i++)
        lenbytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenbytes, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t nb = 0;
        wsync_tensor_nbytes(tensors[i].dtype, tensors[i].ndim, tensors[i].shape, &nb);
        ok = nb == 0 || fwrite(tensors[i].data, 1, nb, f) == nb;
    }
    free(header);
    if (fclose(f) != 0)
        ok = 0;
    if (!ok)
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "write(%s): %s", path, strerror(errno));
    return WSYNC_OK;
}
