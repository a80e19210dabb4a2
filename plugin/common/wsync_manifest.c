/* Manifest schema v1: parse with complete validation (docs/DESIGN.md §2), and emit.
 *
 * Parsing is one pass over the tensors array: every field is checked, names are deduplicated
 * with an open-addressing table over the jansson strings, then all names are copied into one
 * allocation. Messages name the field path ("tensors[3].shape[1]") and the offending value. */
#include "wsync_manifest.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_base64.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_manifest_parts.h"
#include "wsync_nixl_buffer.h"
#include "wsync_torch_handle.h"

/* ------------------------------------------------------------- buffer kinds */

const char *wsync_buffer_kind_name(wsync_buffer_kind_t k)
{
    switch (k) {
    case WSYNC_BUFFER_CUDA_IPC:
        return "cuda_ipc";
    case WSYNC_BUFFER_HOST_SHM:
        return "host_shm";
    case WSYNC_BUFFER_CUDA_VMM_FD:
        return "cuda_vmm_fd";
    case WSYNC_BUFFER_TORCH_EXPANDABLE:
        return "torch_expandable";
    case WSYNC_BUFFER_HOST_PID:
        return "host_pid";
    case WSYNC_BUFFER_CUDA_VMM_RUN:
        return "cuda_vmm_run";
    case WSYNC_BUFFER_NIXL:
        return "nixl";
    case WSYNC_BUFFER_INVALID:
        break;
    }
    return "invalid";
}

wsync_buffer_kind_t wsync_buffer_kind_from_name(const char *name)
{
    if (name == NULL)
        return WSYNC_BUFFER_INVALID;
    if (strcmp(name, "cuda_ipc") == 0)
        return WSYNC_BUFFER_CUDA_IPC;
    if (strcmp(name, "host_shm") == 0)
        return WSYNC_BUFFER_HOST_SHM;
    if (strcmp(name, "cuda_vmm_fd") == 0)
        return WSYNC_BUFFER_CUDA_VMM_FD;
    if (strcmp(name, "torch_expandable") == 0)
        return WSYNC_BUFFER_TORCH_EXPANDABLE;
    if (strcmp(name, "host_pid") == 0)
        return WSYNC_BUFFER_HOST_PID;
    if (strcmp(name, "cuda_vmm_run") == 0)
        return WSYNC_BUFFER_CUDA_VMM_RUN;
    if (strcmp(name, "nixl") == 0)
        return WSYNC_BUFFER_NIXL;
    return WSYNC_BUFFER_INVALID;
}

/* ------------------------------------------------------------ field paths */

/* A field path, formatted only when an error is reported: obj[index].field[sub]. */
typedef struct wsync_mpath {
    const char *obj; /* NULL: top level */
    long index;      /* < 0: none */
    const char *field;
    long sub; /* < 0: none */
} wsync_mpath_t;

static const char *wsync_mpath_str(const wsync_mpath_t *p, char *buf, size_t cap)
{
    int n = 0;
    buf[0] = '\0';
    if (p->obj)
        n += snprintf(buf + n, cap - (size_t)n, "%s", p->obj);
    if (p->index >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "[%ld]", p->index);
    if (p->field && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "%s%s", p->obj ? "." : "", p->field);
    if (p->sub >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "[%ld]", p->sub);
    return buf;
}

#define WSYNC_MPATH_LEN 96
#define MPATH(p) wsync_mpath_str((p), pathbuf, sizeof(pathbuf))

static const char *wsync_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "real";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

/* -------------------------------------------------------------- field readers */

/* A non-negative JSON integer (jansson itself refuses integers beyond int64). */
static wsync_result_t wsync_read_uint(const json_t *v, const wsync_mpath_t *p, uint64_t *out,
                                      wsync_error_t *err)
{
    char pathbuf[WSYNC_MPATH_LEN];
    if (v == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: missing (required integer)", MPATH(p));
    if (json_is_real(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: %.17g must be a JSON integer, not a real number", MPATH(p),
                          json_real_value(v));
    if (!json_is_integer(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: must be an integer, got %s", MPATH(p),
                          wsync_json_type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: %lld is negative", MPATH(p),
                          (long long)i);
    *out = (uint64_t)i;
    return WSYNC_OK;
}

/* A string field; *out borrows jansson's storage. `required` 0 leaves *out NULL when absent. */
static wsync_result_t wsync_read_string(const json_t *v, const wsync_mpath_t *p, int required,
                                        const char **out, size_t *len, wsync_error_t *err)
{
    char pathbuf[WSYNC_MPATH_LEN];
    *out = NULL;
    if (v == NULL) {
        if (!required)
            return WSYNC_OK;
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: missing (required string)", MPATH(p));
    }
    if (!json_is_string(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: must be a string, got %s", MPATH(p),
                          wsync_json_type_name(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (strlen(s) != n)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: contains a NUL character", MPATH(p));
    *out = s;
    if (len)
        *len = n;
    return WSYNC_OK;
}

/* A base64 string decoded into out[cap]; optional when `required` is 0 (*present = 0). */
static wsync_result_t wsync_read_base64(const json_t *v, const wsync_mpath_t *p, int required,
                                        uint8_t *out, uint32_t *out_len, int *present,
                                        wsync_error_t *err)
{
    char pathbuf[WSYNC_MPATH_LEN];
    const char *s;
    size_t n;
    wsync_result_t r = wsync_read_string(v, p, required, &s, &n, err);
    if (r != WSYNC_OK)
        return r;
    if (present)
        *present = s != NULL;
    if (s == NULL)
        return WSYNC_OK;
    long got = wsync_base64_decode(s, out, WSYNC_HANDLE_MAX);
    if (got == -2)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: decodes to more than %d bytes (%zu base64 characters)", MPATH(p),
                          WSYNC_HANDLE_MAX, n);
    if (got < 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: \"%.40s%s\" is not valid base64 (RFC 4648, padded)", MPATH(p), s,
                          n > 40 ? "..." : "");
    if (got == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: is empty", MPATH(p));
    *out_len = (uint32_t)got;
    return WSYNC_OK;
}

/* ------------------------------------------------------------------ buffer */

/* The manifest's "buffer" (segment < 0) or its segments[segment] (direct mode). */
static wsync_result_t wsync_parse_buffer(const json_t *b, long segment, wsync_buffer_desc_t *d,
                                         wsync_error_t *err)
{
    wsync_mpath_t p = {segment < 0 ? "buffer" : "segments", segment, NULL, -1};
    char what[40];
    if (segment < 0)
        snprintf(what, sizeof(what), "buffer");
    else
        snprintf(what, sizeof(what), "segments[%ld]", segment);
    wsync_result_t r;
    const char *s;
    size_t n;

    d->struct_size = sizeof(*d);
    if (b == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: missing (required object)", what);
    if (!json_is_object(b))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s: must be an object, got %s", what,
                          wsync_json_type_name(b));

    p.field = "kind";
    if ((r = wsync_read_string(json_object_get(b, "kind"), &p, 1, &s, &n, err)) != WSYNC_OK)
        return r;
    /* "torch": torch's _share_cuda_ handle bytes verbatim (wsync_torch_handle.h) */
    int torch = strcmp(s, "torch") == 0;
    d->kind = torch ? WSYNC_BUFFER_CUDA_IPC : wsync_buffer_kind_from_name(s);
    if (d->kind == WSYNC_BUFFER_INVALID)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s.kind: unknown kind \"%.64s\" (expected cuda_ipc, host_shm, "
                          "cuda_vmm_fd, torch, torch_expandable, host_pid, cuda_vmm_run or nixl)",
                          what, s);

    p.field = "handle";
    if ((r = wsync_read_base64(json_object_get(b, "handle"), &p, 1, d->handle, &d->handle_len, NULL,
                               err)) != WSYNC_OK)
        return r;
    /* torch's 66-byte 'c' form is accepted as a cuda_ipc handle too: it names the same memory */
    if (torch ||
        (d->kind == WSYNC_BUFFER_CUDA_IPC && d->handle_len == 2 + WSYNC_CUDA_IPC_HANDLE_BYTES &&
         wsync_torch_handle_is(d->handle, d->handle_len))) {
        char field[48];
        snprintf(field, sizeof(field), "%s.handle", what);
        if ((r = wsync_torch_handle_decode(d->handle, d->handle_len, field, d, err)) != WSYNC_OK)
            return r;
    } else if (d->kind == WSYNC_BUFFER_TORCH_EXPANDABLE) { /* its payload, named directly */
        wsync_torch_segments_t seg;
        if ((r = wsync_torch_segments_decode(d->handle, d->handle_len, &seg, err)) != WSYNC_OK)
            return r;
    }
    if (d->kind == WSYNC_BUFFER_HOST_PID && (segment < 0 || d->handle_len != 8))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: a host_pid buffer is a segment of a direct manifest whose handle is "
                          "its 8-byte address, got %s with %u handle bytes",
                          what, segment < 0 ? "the buffer" : "a segment", d->handle_len);
    if (d->kind == WSYNC_BUFFER_CUDA_VMM_RUN && segment < 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: a cuda_vmm_run buffer is a segment of a direct manifest, not a "
                          "bucket's buffer",
                          what);
    /* a segment's cuda_ipc handle may carry the producer's allocation id after the 64 bytes */
    if (d->kind == WSYNC_BUFFER_CUDA_IPC && d->handle_len != WSYNC_CUDA_IPC_HANDLE_BYTES &&
        !(segment >= 0 && d->handle_len == WSYNC_CUDA_IPC_HANDLE_BYTES + 8))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s.handle: a cuda_ipc handle is 64 bytes, got %u (torch's 66-byte "
                          "form is version 2, 'c', then the 64)",
                          what, d->handle_len);

    p.field = "bytes";
    if ((r = wsync_read_uint(json_object_get(b, "bytes"), &p, &d->bytes, err)) != WSYNC_OK)
        return r;
    if (d->bytes == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "%s.bytes: must be > 0, got 0", what);

    uint64_t pid;
    p.field = "pid";
    if ((r = wsync_read_uint(json_object_get(b, "pid"), &p, &pid, err)) != WSYNC_OK)
        return r;
    d->pid = (int64_t)pid;

    p.field = "device";
    if ((r = wsync_read_string(json_object_get(b, "device"), &p, 1, &s, &n, err)) != WSYNC_OK)
        return r;
    if (n == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s.device: is empty (expected \"GPU-<uuid>\" or \"cpu\")", what);
    if (n >= WSYNC_DEVICE_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s.device: \"%.40s...\" is %zu bytes, the limit is %d", what, s, n,
                          WSYNC_DEVICE_MAX - 1);
    memcpy(d->device, s, n + 1);

    p.field = "ready";
    if ((r = wsync_read_base64(json_object_get(b, "ready"), &p, 0, d->ready, &d->ready_len,
                               &d->has_ready, err)) != WSYNC_OK)
        return r;
    p.field = "consumed";
    if ((r = wsync_read_base64(json_object_get(b, "consumed"), &p, 0, d->consumed, &d->consumed_len,
                               &d->has_consumed, err)) != WSYNC_OK)
        return r;
    if (d->kind == WSYNC_BUFFER_CUDA_IPC && d->has_ready &&
        d->ready_len != WSYNC_CUDA_IPC_HANDLE_BYTES)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s.ready: a cuda_ipc event handle is 64 bytes, got %u", what,
                          d->ready_len);
    if (d->kind == WSYNC_BUFFER_CUDA_IPC && d->has_consumed &&
        d->consumed_len != WSYNC_CUDA_IPC_HANDLE_BYTES)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s.consumed: a cuda_ipc event handle is 64 bytes, got %u", what,
                          d->consumed_len);

    const json_t *off = json_object_get(b, "offset");
    if (off != NULL) {
        p.field = "offset";
        if ((r = wsync_read_uint(off, &p, &d->base_offset, err)) != WSYNC_OK)
            return r;
        uint64_t end;
        if (__builtin_add_overflow(d->base_offset, d->bytes, &end))
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                              "%s: offset %llu + bytes %llu overflows 64 bits", what,
                              (unsigned long long)d->base_offset, (unsigned long long)d->bytes);
    }

    p.field = "control";
    if ((r = wsync_read_string(json_object_get(b, "control"), &p, 0, &s, &n, err)) != WSYNC_OK)
        return r;
    if (s != NULL) {
        if (n >= WSYNC_HANDLE_MAX)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "%s.control: \"%.40s...\" is %zu bytes, the limit is %d", what, s, n,
                              WSYNC_HANDLE_MAX - 1);
        memcpy(d->control, s, n + 1);
    }
    if (d->kind == WSYNC_BUFFER_NIXL && segment < 0) { /* its agent, loaded for open_handle */
        p.field = "peer";
        if ((r = wsync_read_string(json_object_get(b, "peer"), &p, 1, &s, &n, err)) != WSYNC_OK)
            return r;
        if ((r = wsync_nixl_buffer_peer(s, d, "buffer.peer", err)) != WSYNC_OK)
            return r;
    }
    return WSYNC_OK;
}

/* ------------------------------------------------------------------ tensors */

/* Open-addressing set of tensor indices keyed by name; detects duplicates in one pass. */
typedef struct wsync_name_set {
    uint32_t *slots; /* index + 1; 0 = empty */
    size_t mask;
} wsync_name_set_t;

static uint64_t wsync_name_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return wsync_mix64(h);
}

/* Inserts tensor i; returns the index of an earlier tensor with the same name, or -1. */
static long wsync_name_set_insert(wsync_name_set_t *set, const wsync_tensor_desc_t *t, size_t i,
                                  size_t len)
{
    size_t h = (size_t)wsync_name_hash(t[i].name, len) & set->mask;
    for (;;) {
        uint32_t s = set->slots[h];
        if (s == 0) {
            set->slots[h] = (uint32_t)i + 1;
            return -1;
        }
        if (strcmp(t[s - 1].name, t[i].name) == 0)
            return (long)(s - 1);
        h = (h + 1) & set->mask;
    }
}

wsync_result_t wsync_manifest_check_extent(const wsync_tensor_desc_t *t, size_t i,
                                           uint64_t buffer_bytes, wsync_error_t *err)
{
    uint64_t end;
    if (__builtin_add_overflow(t->offset, t->nbytes, &end))
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "tensors[%zu] (\"%.80s\"): offset %llu + nbytes %llu overflows 64 bits",
                          i, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
    if (end > buffer_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "tensors[%zu] (\"%.80s\"): offset %llu + nbytes %llu exceeds buffer "
                          "bytes %llu",
                          i, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                          (unsigned long long)buffer_bytes);
    return WSYNC_OK;
}

wsync_result_t wsync_manifest_check_segment(const wsync_manifest_t *m, const wsync_tensor_desc_t *t,
                                            size_t i, uint64_t k, wsync_error_t *err)
{
    if (k >= m->n_segments)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\").segment: %llu, the manifest has %zu "
                          "segments",
                          i, t->name, (unsigned long long)k, m->n_segments);
    return WSYNC_OK;
}

wsync_result_t wsync_manifest_check_tensor_extent(const wsync_manifest_t *m,
                                                  const wsync_tensor_desc_t *t, size_t i,
                                                  uint32_t segment, wsync_error_t *err)
{
    if (m->n_segments == 0)
        return wsync_manifest_check_extent(t, i, m->buffer.bytes, err);
    uint64_t end;
    const uint64_t bytes = m->segments[segment].bytes;
    if (__builtin_add_overflow(t->offset, t->nbytes, &end) || end > bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "tensors[%zu] (\"%.80s\"): offset %llu + nbytes %llu exceeds the %llu "
                          "bytes of segments[%u]",
                          i, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                          (unsigned long long)bytes, segment);
    return WSYNC_OK;
}

static wsync_result_t wsync_parse_tensor(const json_t *jt, size_t i, const wsync_manifest_t *mv,
                                         wsync_tensor_desc_t *t, uint32_t *segment,
                                         size_t *name_len, wsync_error_t *err)
{
    wsync_mpath_t p = {"tensors", (long)i, NULL, -1};
    wsync_result_t r;
    const char *s;
    size_t n;

    t->struct_size = sizeof(*t);
    if (!json_is_object(jt))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "tensors[%zu]: must be an object, got %s", i,
                          wsync_json_type_name(jt));

    p.field = "name";
    if ((r = wsync_read_string(json_object_get(jt, "name"), &p, 1, &s, &n, err)) != WSYNC_OK)
        return r;
    if (n == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "tensors[%zu].name: is empty", i);
    if (n > WSYNC_MANIFEST_MAX_NAME)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu].name: \"%.40s...\" is %zu bytes, the limit is %d", i, s, n,
                          WSYNC_MANIFEST_MAX_NAME);
    t->name = s;
    *name_len = n;

    p.field = "dtype";
    if ((r = wsync_read_string(json_object_get(jt, "dtype"), &p, 1, &s, &n, err)) != WSYNC_OK)
        return r;
    t->dtype = wsync_dtype_from_name(s);
    if (t->dtype == WSYNC_DTYPE_INVALID)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\").dtype: unknown dtype \"%.40s\"", i, t->name, s);

    const json_t *shape = json_object_get(jt, "shape");
    if (shape == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\").shape: missing (required array)", i, t->name);
    if (!json_is_array(shape))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\").shape: must be an array, got %s", i, t->name,
                          wsync_json_type_name(shape));
    size_t ndim = json_array_size(shape);
    if (ndim > WSYNC_MAX_DIMS)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\").shape: %zu dimensions, the limit is %d", i,
                          t->name, ndim, WSYNC_MAX_DIMS);
    t->ndim = (uint32_t)ndim;
    p.field = "shape";
    for (size_t d = 0; d < ndim; d++) {
        uint64_t dim;
        p.sub = (long)d;
        if ((r = wsync_read_uint(json_array_get(shape, d), &p, &dim, err)) != WSYNC_OK)
            return r;
        t->shape[d] = (int64_t)dim;
    }
    p.sub = -1;

    p.field = "offset";
    if ((r = wsync_read_uint(json_object_get(jt, "offset"), &p, &t->offset, err)) != WSYNC_OK)
        return r;
    p.field = "nbytes";
    if ((r = wsync_read_uint(json_object_get(jt, "nbytes"), &p, &t->nbytes, err)) != WSYNC_OK)
        return r;

    uint64_t expect;
    if (wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, &expect) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\"): %s x shape overflows 64 bits", i, t->name,
                          wsync_dtype_name(t->dtype));
    if (expect != t->nbytes)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\"): nbytes %llu != %s (%zu bytes) x shape = %llu",
                          i, t->name, (unsigned long long)t->nbytes, wsync_dtype_name(t->dtype),
                          wsync_dtype_size(t->dtype), (unsigned long long)expect);
    const size_t es = wsync_dtype_size(t->dtype);
    if (mv->n_segments == 0 && es > 1 && t->offset % es != 0) /* staged: aligned by its stage */
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors[%zu] (\"%.80s\").offset: %llu is not a multiple of its %s "
                          "element (%zu bytes)",
                          i, t->name, (unsigned long long)t->offset, wsync_dtype_name(t->dtype),
                          es);

    const json_t *sg = json_object_get(jt, "segment");
    if (sg != NULL || mv->n_segments > 0) {
        uint64_t k;
        p.field = "segment";
        if (mv->n_segments == 0)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "tensors[%zu] (\"%.80s\").segment: this manifest has no segments", i,
                              t->name);
        if ((r = wsync_read_uint(sg, &p, &k, err)) != WSYNC_OK)
            return r;
        if ((r = wsync_manifest_check_segment(mv, t, i, k, err)) != WSYNC_OK)
            return r;
        *segment = (uint32_t)k;
    }
    if ((r = wsync_manifest_check_tensor_extent(mv, t, i, *segment, err)) != WSYNC_OK)
        return r;

    const json_t *dg = json_object_get(jt, "digest");
    if (dg != NULL) {
        p.field = "digest";
        if ((r = wsync_read_string(dg, &p, 1, &s, &n, err)) != WSYNC_OK)
            return r;
        if (wsync64_parse(s, &t->digest) != 0)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "tensors[%zu] (\"%.80s\").digest: \"%.40s\" is not "
                              "\"wsync64:<16 lowercase hex digits>\"",
                              i, t->name, s);
        t->has_digest = 1;
    }
    return WSYNC_OK;
}

static wsync_result_t wsync_parse_tensors(const json_t *arr, wsync_manifest_owned_t *m,
                                          wsync_error_t *err)
{
    wsync_result_t r = WSYNC_OK;
    wsync_name_set_t set = {NULL, 0};
    size_t *lens = NULL;
    size_t total = 0;

    if (arr == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "tensors: missing (required array)");
    if (!json_is_array(arr))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "tensors: must be an array, got %s",
                          wsync_json_type_name(arr));
    size_t n = json_array_size(arr);
    if (n > WSYNC_MANIFEST_MAX_TENSORS)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "tensors: %zu entries, the limit is %u; split the bucket", n,
                          WSYNC_MANIFEST_MAX_TENSORS);

    size_t cap = 16;
    uint32_t zero = 0;
    while (cap < 2 * n)
        cap <<= 1;
    m->tensors = calloc(n ? n : 1, sizeof(*m->tensors));
    if (m->view.n_segments > 0 && (m->segment_of = calloc(n ? n : 1, sizeof(uint32_t))) == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu segment indices", n);
        goto out;
    }
    lens = malloc((n ? n : 1) * sizeof(*lens));
    set.slots = calloc(cap, sizeof(*set.slots));
    set.mask = cap - 1;
    if (m->tensors == NULL || lens == NULL || set.slots == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu tensor descriptors", n);
        goto out;
    }

    for (size_t i = 0; i < n; i++) {
        r = wsync_parse_tensor(json_array_get(arr, i), i, &m->view, &m->tensors[i],
                               m->segment_of != NULL ? &m->segment_of[i] : &zero, &lens[i], err);
        if (r != WSYNC_OK)
            goto out;
        long dup = wsync_name_set_insert(&set, m->tensors, i, lens[i]);
        if (dup >= 0) {
            r = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                           "tensors[%zu].name: \"%.200s\" duplicates tensors[%ld]; names must "
                           "be unique",
                           i, m->tensors[i].name, dup);
            goto out;
        }
        total += lens[i] + 1;
    }

    /* The names still point into the JSON tree: copy them into one block. */
    m->names = malloc(total ? total : 1);
    if (m->names == NULL) {
        r = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of tensor names",
                       total);
        goto out;
    }
    char *w = m->names;
    for (size_t i = 0; i < n; i++) {
        memcpy(w, m->tensors[i].name, lens[i] + 1);
        m->tensors[i].name = w;
        w += lens[i] + 1;
    }
    m->view.n_tensors = n;
    m->view.tensors = m->tensors;
    m->view.tensor_segment = m->segment_of;
    if (m->view.n_segments == 0)
        r = wsync_manifest_check_disjoint(m->tensors, n, err);
out:
    free(set.slots);
    free(lens);
    return r;
}

/* ------------------------------------------------------------------ manifest */

void wsync_manifest_blob_free(wsync_manifest_blob_t *b)
{
    free(b->bytes);
    memset(b, 0, sizeof(*b));
}

/* The "digests" blob: a base64 string; its length is checked against the tensors later. */
static wsync_result_t wsync_parse_digest_blob(const json_t *v, wsync_manifest_blob_t *blob,
                                              wsync_error_t *err)
{
    wsync_mpath_t p = {NULL, -1, "digests", -1};
    const char *s;
    size_t n;
    wsync_result_t r = wsync_read_string(v, &p, 0, &s, &n, err);
    if (r != WSYNC_OK || s == NULL)
        return r;
    return wsync_manifest_decode_digests(s, n, blob, err);
}

wsync_result_t wsync_manifest_decode_digests(const char *s, size_t n, wsync_manifest_blob_t *blob,
                                             wsync_error_t *err)
{
    size_t cap = n / 4 * 3;
    blob->bytes = malloc(cap ? cap : 1);
    if (blob->bytes == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "digests: cannot allocate %zu bytes", cap);
    long got = wsync_base64_decode(s, blob->bytes, cap);
    if (got < 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "digests: \"%.40s%s\" is not valid base64 (RFC 4648, padded)", s,
                          n > 40 ? "..." : "");
    blob->len = (size_t)got;
    blob->chars = n;
    blob->present = 1;
    return WSYNC_OK;
}

wsync_result_t wsync_manifest_apply_digests(wsync_manifest_owned_t *m,
                                            const wsync_manifest_blob_t *blob, wsync_error_t *err)
{
    size_t n = m->view.n_tensors;
    if (!blob->present)
        return WSYNC_OK;
    if (blob->len != 8 * n)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "digests: decodes to %zu bytes (%zu base64 characters), expected 8 "
                          "bytes per tensor x %zu tensors = %zu bytes",
                          blob->len, blob->chars, n, 8 * n);
    for (size_t i = 0; i < n; i++)
        if (m->tensors[i].has_digest)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "tensors[%zu] (\"%.80s\"): has its own \"digest\" and an entry in "
                              "the top-level \"digests\"; send one or the other",
                              i, m->tensors[i].name);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = blob->bytes + 8 * i;
        uint64_t d = 0;
        for (int k = 7; k >= 0; k--)
            d = d << 8 | b[k];
        m->tensors[i].digest = d;
        m->tensors[i].has_digest = 1;
    }
    return WSYNC_OK;
}

/* The checks of "segments" that do not read its entries: 1..WSYNC_MANIFEST_MAX_SEGMENTS of them,
 * and a buffer that is a synchronisation object; then room for them in m. */
static wsync_result_t wsync_segments_begin(size_t n, wsync_manifest_owned_t *m, wsync_error_t *err)
{
    if (n == 0 || n > WSYNC_MANIFEST_MAX_SEGMENTS)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "segments: %zu entries; a direct manifest names 1..%u", n,
                          WSYNC_MANIFEST_MAX_SEGMENTS);
    if (m->view.buffer.kind == WSYNC_BUFFER_TORCH_EXPANDABLE)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "segments: the buffer of a direct manifest is its producer's "
                          "synchronisation object, not a torch share");
    m->segments = calloc(n, sizeof(*m->segments));
    if (m->segments == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu segments", n);
    m->view.segments = m->segments;
    return WSYNC_OK;
}

/* "segments" (direct mode): 1..WSYNC_MANIFEST_MAX_SEGMENTS buffer objects, absent otherwise; or,
 * from the parse cache, segments a full parse of the same text already read (`cached`). */
static wsync_result_t wsync_parse_segments(const json_t *arr, const wsync_manifest_segs_t *cached,
                                           wsync_manifest_owned_t *m, wsync_error_t *err)
{
    wsync_result_t r;
    if (cached != NULL) {
        if ((r = wsync_segments_begin(cached->n, m, err)) != WSYNC_OK)
            return r;
        memcpy(m->segments, cached->at, cached->n * sizeof(*m->segments));
        m->view.n_segments = cached->n;
        return WSYNC_OK;
    }
    if (arr == NULL)
        return WSYNC_OK;
    if (!json_is_array(arr))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "segments: must be an array, got %s",
                          wsync_json_type_name(arr));
    size_t n = json_array_size(arr);
    if ((r = wsync_segments_begin(n, m, err)) != WSYNC_OK)
        return r;
    for (size_t k = 0; k < n; k++) {
        r = wsync_parse_buffer(json_array_get(arr, k), (long)k, &m->segments[k], err);
        if (r != WSYNC_OK)
            return r;
    }
    m->view.n_segments = n;
    return WSYNC_OK;
}

/* "plan" (schema 1) or "replay" (schema 2, where it is required): a plan id. */
static wsync_result_t wsync_parse_plan(const json_t *root, wsync_manifest_owned_t *m,
                                       wsync_error_t *err)
{
    const int replay = m->view.schema == WSYNC_MANIFEST_SCHEMA_REPLAY;
    const json_t *v = json_object_get(root, replay ? "replay" : "plan");
    const char *other = replay ? "plan" : "replay";
    if (json_object_get(root, other) != NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: not a member of a schema %u manifest (a full manifest records a "
                          "plan, \"wsync\": %u replays one)",
                          other, m->view.schema, WSYNC_MANIFEST_SCHEMA_REPLAY);
    const wsync_mpath_t p = {NULL, -1, replay ? "replay" : "plan", -1};
    const char *s;
    size_t n;
    wsync_result_t r = wsync_read_string(v, &p, replay, &s, &n, err);
    if (r != WSYNC_OK || s == NULL)
        return r;
    int ok = n >= 1 && n <= WSYNC_PLAN_ID_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
             (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '.' || s[i] == '_' || s[i] == ':' ||
             s[i] == '-';
    if (!ok)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: \"%.80s\" is not a plan id (1 to %d characters of "
                          "[0-9A-Za-z._:-])",
                          p.field, s, WSYNC_PLAN_ID_MAX);
    memcpy(m->plan, s, n + 1);
    m->view.plan = m->plan;
    m->view.replay = replay;
    return WSYNC_OK;
}

wsync_result_t wsync_manifest_check_replay(const wsync_manifest_t *m, int had_digests,
                                           wsync_error_t *err)
{
    if (!m->replay || (m->n_tensors == 0 && !had_digests))
        return WSYNC_OK;
    return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                      "replay \"%s\": a replay names no tensors and no digests (its plan holds "
                      "them), got %zu tensor(s)%s",
                      m->plan, m->n_tensors, had_digests ? " and digests" : "");
}

wsync_result_t wsync_manifest_parse_head(const json_t *root, const wsync_manifest_segs_t *segs,
                                         wsync_manifest_owned_t *m, wsync_manifest_blob_t *blob,
                                         wsync_error_t *err)
{
    wsync_mpath_t p = {NULL, -1, NULL, -1};
    wsync_result_t r;
    uint64_t schema;

    if (!json_is_object(root))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "manifest root must be a JSON object, got %s",
                          wsync_json_type_name(root));

    p.field = "wsync";
    if ((r = wsync_read_uint(json_object_get(root, "wsync"), &p, &schema, err)) != WSYNC_OK)
        return r;
    if (schema != WSYNC_MANIFEST_SCHEMA && schema != WSYNC_MANIFEST_SCHEMA_REPLAY)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "wsync: unsupported schema version %llu (this plugin reads %u and %u)",
                          (unsigned long long)schema, WSYNC_MANIFEST_SCHEMA,
                          WSYNC_MANIFEST_SCHEMA_REPLAY);
    m->view.schema = (uint32_t)schema;
    if ((r = wsync_parse_plan(root, m, err)) != WSYNC_OK)
        return r;

    p.field = "generation";
    if ((r = wsync_read_uint(json_object_get(root, "generation"), &p, &m->view.generation, err)) !=
        WSYNC_OK)
        return r;
    if (m->view.generation == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "generation: must be >= 1, got 0");

    const json_t *fin = json_object_get(root, "finished");
    if (fin != NULL && !json_is_boolean(fin))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST, "finished: must be true or false, got %s",
                          wsync_json_type_name(fin));
    m->view.finished = fin != NULL && json_is_true(fin);

    if ((r = wsync_parse_buffer(json_object_get(root, "buffer"), -1, &m->view.buffer, err)) !=
        WSYNC_OK)
        return r;
    if ((r = wsync_parse_segments(json_object_get(root, "segments"), segs, m, err)) != WSYNC_OK)
        return r;
    return wsync_parse_digest_blob(json_object_get(root, "digests"), blob, err);
}

static wsync_result_t wsync_parse_root(const json_t *root, wsync_manifest_owned_t *m, int *had_blob,
                                       wsync_error_t *err)
{
    wsync_manifest_blob_t blob = {0};
    wsync_result_t r = wsync_manifest_parse_head(root, NULL, m, &blob, err);
    if (r == WSYNC_OK)
        r = wsync_parse_tensors(json_object_get(root, "tensors"), m, err);
    if (r == WSYNC_OK)
        r = wsync_manifest_apply_digests(m, &blob, err);
    if (r == WSYNC_OK)
        r = wsync_manifest_check_replay(&m->view, blob.present, err);
    *had_blob = blob.present;
    wsync_manifest_blob_free(&blob);
    return r;
}

/* Objects in json[0, len) (a span that starts outside a string), stopping once there are more than
 * `stop`. */
static uint64_t wsync_objects_upto(const char *json, size_t len, uint64_t stop)
{
    uint64_t objects = 0;
    int in_string = 0;
    for (size_t i = 0; i < len && objects <= stop; i++) {
        const char ch = json[i];
        if (in_string) {
            if (ch == '\\')
                i++; /* the escaped character is never a quote that ends the string */
            else if (ch == '"')
                in_string = 0;
        } else if (ch == '"') {
            in_string = 1;
        } else if (ch == '{') {
            objects++;
        }
    }
    return objects;
}

uint64_t wsync_manifest_objects(const char *json, size_t len)
{
    return wsync_objects_upto(json, len, UINT64_MAX);
}

wsync_result_t wsync_manifest_check_limits(const char *json, size_t len, size_t tail_len,
                                           uint64_t tail_objects,
                                           const wsync_manifest_limits_t *lim, wsync_error_t *err)
{
    const uint64_t max_bytes =
        lim && lim->max_bytes ? lim->max_bytes : WSYNC_MANIFEST_DEFAULT_MAX_BYTES;
    const uint64_t max_tensors =
        lim && lim->max_tensors ? lim->max_tensors : WSYNC_MANIFEST_DEFAULT_MAX_TENSORS;
    if ((uint64_t)len > max_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "manifest is %zu bytes, over this consumer's limit of %llu "
                          "(max_manifest_bytes); send smaller buckets or raise the limit",
                          len, (unsigned long long)max_bytes);
    const uint64_t max_objects = max_tensors + 2; /* the root and its buffer */
    if (tail_objects > max_objects ||
        wsync_objects_upto(json, len - tail_len, max_objects - tail_objects) >
            max_objects - tail_objects)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "manifest holds more than %llu JSON objects: over this consumer's limit "
                          "of %llu tensors (max_manifest_tensors); send smaller buckets or raise "
                          "the limit",
                          (unsigned long long)max_objects, (unsigned long long)max_tensors);
    return WSYNC_OK;
}

wsync_result_t wsync_manifest_parse(const char *json, size_t len, wsync_manifest_owned_t **out,
                                    wsync_error_t *err)
{
    return wsync_manifest_parse_ex(json, len, out, NULL, NULL, err);
}

wsync_result_t wsync_manifest_parse_ex(const char *json, size_t len, wsync_manifest_owned_t **out,
                                       size_t *root_members, int *had_blob, wsync_error_t *err)
{
    int blob = 0;
    json_error_t jerr;
    wsync_result_t r;

    if (out == NULL || (json == NULL && len != 0))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "json and out must not be NULL");
    *out = NULL;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "manifest is not valid JSON: %s (line %d, column %d)", jerr.text,
                          jerr.line, jerr.column);

    wsync_manifest_owned_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        json_decref(root);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate a manifest");
    }
    m->view.struct_size = sizeof(m->view);
    r = wsync_parse_root(root, m, &blob, err);
    if (root_members != NULL)
        *root_members = json_is_object(root) ? json_object_size(root) : 0;
    json_decref(root);
    if (r != WSYNC_OK) {
        wsync_manifest_free(m);
        return r;
    }
    if (had_blob != NULL)
        *had_blob = blob;
    *out = m;
    return WSYNC_OK;
}

void wsync_manifest_free(wsync_manifest_owned_t *m)
{
    if (m == NULL)
        return;
    free(m->tensors);
    free(m->names);
    free(m->segments);
    free(m->segment_of);
    free(m);
}
