/* Manifest emit (docs/DESIGN.md §2). The whole text is written directly, byte for byte as
 * jansson's compact dump of the same members in the same order writes it: 300 tensors in tens of
 * microseconds instead of half a millisecond, and a direct manifest's segments at about a
 * microsecond each instead of ten (docs/PERFORMANCE.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_base64.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_manifest.h"
#include "wsync_nixl_buffer.h"
#include "wsync_text.h"
#include "wsync_utf8.h"

#define WSYNC_JSON_INT_MAX ((uint64_t)INT64_MAX)

/* ------------------------------------------------------------- text buffer */

static void wsync_text_str(wsync_text_t *t, const char *s)
{
    wsync_text_put(t, s, strlen(s));
}

/* Decimal, as "%lld" writes it (snprintf costs more than the rest of a tensor's text). */
static void wsync_text_int(wsync_text_t *t, long long v)
{
    char buf[24];
    char *w = buf + sizeof(buf);
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--w = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0)
        *--w = '-';
    wsync_text_put(t, w, (size_t)(buf + sizeof(buf) - w));
}

/* A JSON string as jansson dumps it (no ASCII forcing, '/' as is, \uXXXX upper case). 0 when s
 * is not valid UTF-8. */
static int wsync_text_json_str(wsync_text_t *t, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    wsync_text_put(t, "\"", 1);
    size_t run = 0; /* bytes copied as they are, pending */
    while (u[run] != '\0') {
        const unsigned char c = u[run];
        if (c >= 0x20 && c != '"' && c != '\\') {
            size_t n = wsync_utf8_len(u + run);
            if (n == 0)
                return 0;
            run += n;
            continue;
        }
        wsync_text_put(t, (const char *)u, run);
        /* the short escapes JSON has, else \u00XX */
        static const char from[] = "\"\\\b\f\n\r\t", to[] = "\"\\bfnrt";
        const char *hit = memchr(from, c, sizeof(from) - 1);
        char esc[8] = {'\\', hit != NULL ? to[hit - from] : 'u', '\0'};
        if (hit == NULL)
            snprintf(esc, sizeof(esc), "\\u%04X", c);
        wsync_text_str(t, esc);
        u += run + 1;
        run = 0;
    }
    wsync_text_put(t, (const char *)u, run);
    wsync_text_put(t, "\"", 1);
    return 1;
}

/* ----------------------------------------------------------------- checks */

/* The buffer (segment < 0) or segments[segment]: a known kind, handle lengths, JSON ranges. */
static wsync_result_t wsync_check_buffer(const wsync_buffer_desc_t *b, long segment,
                                         wsync_error_t *err)
{
    char what[32] = "buffer";
    if (segment >= 0)
        snprintf(what, sizeof(what), "segments[%ld]", segment);
    if (wsync_buffer_kind_from_name(wsync_buffer_kind_name(b->kind)) == WSYNC_BUFFER_INVALID)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "%s.kind %d is not a known kind", what,
                          (int)b->kind);
    if (b->handle_len == 0 || b->handle_len > WSYNC_HANDLE_MAX ||
        (b->has_ready && b->ready_len > WSYNC_HANDLE_MAX) ||
        (b->has_consumed && b->consumed_len > WSYNC_HANDLE_MAX))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "%s handle lengths must be 1..%d bytes (handle %u)", what,
                          WSYNC_HANDLE_MAX, b->handle_len);
    if (b->bytes > WSYNC_JSON_INT_MAX || b->base_offset > WSYNC_JSON_INT_MAX || b->pid < 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "%s bytes %llu / offset %llu / pid %lld out of the JSON range", what,
                          (unsigned long long)b->bytes, (unsigned long long)b->base_offset,
                          (long long)b->pid);
    return WSYNC_OK;
}

/* What the head writes: the generation and the buffer. */
static wsync_result_t wsync_check_head(const wsync_manifest_t *m, wsync_error_t *err)
{
    if (m->generation == 0 || m->generation > WSYNC_JSON_INT_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "generation %llu must be in 1..INT64_MAX",
                          (unsigned long long)m->generation);
    return wsync_check_buffer(&m->buffer, -1, err);
}

static wsync_result_t wsync_check_emit(const wsync_manifest_t *m, wsync_error_t *err)
{
    wsync_result_t r;
    if ((r = wsync_check_head(m, err)) != WSYNC_OK)
        return r;
    if (m->n_tensors > 0 && m->tensors == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "%zu tensors but tensors is NULL",
                          m->n_tensors);
    const int direct = WSYNC_HAS_FIELD(wsync_manifest_t, m, tensor_segment) && m->n_segments > 0;
    if (direct && (m->segments == NULL || m->tensor_segment == NULL ||
                   m->n_segments > WSYNC_MANIFEST_MAX_SEGMENTS))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "%zu segments (at most %u) need segments and tensor_segment",
                          m->n_segments, WSYNC_MANIFEST_MAX_SEGMENTS);
    for (size_t k = 0; direct && k < m->n_segments; k++)
        if ((r = wsync_check_buffer(&m->segments[k], (long)k, err)) != WSYNC_OK)
            return r;
    for (size_t i = 0; direct && i < m->n_tensors; i++)
        if (m->tensor_segment[i] >= m->n_segments)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "tensors[%zu]: segment %u of %zu", i,
                              m->tensor_segment[i], m->n_segments);
    for (size_t i = 0; i < m->n_tensors; i++) {
        const wsync_tensor_desc_t *t = &m->tensors[i];
        if (t->name == NULL || t->ndim > WSYNC_MAX_DIMS || wsync_dtype_size(t->dtype) == 0 ||
            t->offset > WSYNC_JSON_INT_MAX || t->nbytes > WSYNC_JSON_INT_MAX)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensors[%zu]: NULL name, ndim %u, dtype %d or an offset/nbytes "
                              "beyond INT64_MAX",
                              i, t->ndim, (int)t->dtype);
    }
    return WSYNC_OK;
}

/* ------------------------------------------------------------------- head */

/* A JSON string of at most n bytes of s (a fixed-size field, NUL-terminated or full). */
static int wsync_text_json_strn(wsync_text_t *t, const char *s, size_t n)
{
    char buf[WSYNC_HANDLE_MAX + 1];
    const size_t len = strnlen(s, n < WSYNC_HANDLE_MAX ? n : WSYNC_HANDLE_MAX);
    memcpy(buf, s, len);
    buf[len] = '\0';
    return wsync_text_json_str(t, buf);
}

/* "key":"<base64 of p[0, n)>" after a comma. */
static void wsync_text_base64(wsync_text_t *t, const char *key, const uint8_t *p, uint32_t n)
{
    char buf[WSYNC_HANDLE_MAX / 3 * 4 + 8];
    wsync_base64_encode(p, n, buf);
    wsync_text_str(t, key);
    wsync_text_put(t, "\"", 1);
    wsync_text_str(t, buf);
    wsync_text_put(t, "\"", 1);
}

/* A buffer object (the manifest's buffer, or a segment) in jansson's member order; 0 when its
 * device or control is not valid UTF-8. */
static int wsync_text_buffer(wsync_text_t *t, const wsync_buffer_desc_t *b)
{
    wsync_text_str(t, "{\"kind\":\"");
    wsync_text_str(t, wsync_buffer_kind_name(b->kind));
    wsync_text_put(t, "\"", 1);
    wsync_text_base64(t, ",\"handle\":", b->handle, b->handle_len);
    wsync_text_str(t, ",\"bytes\":");
    wsync_text_int(t, (long long)b->bytes);
    wsync_text_str(t, ",\"pid\":");
    wsync_text_int(t, (long long)b->pid);
    wsync_text_str(t, ",\"device\":");
    if (!wsync_text_json_strn(t, b->device, WSYNC_DEVICE_MAX))
        return 0;
    if (b->has_ready)
        wsync_text_base64(t, ",\"ready\":", b->ready, b->ready_len);
    if (b->has_consumed)
        wsync_text_base64(t, ",\"consumed\":", b->consumed, b->consumed_len);
    if (b->base_offset != 0) {
        wsync_text_str(t, ",\"offset\":");
        wsync_text_int(t, (long long)b->base_offset);
    }
    if (b->control[0] != '\0') {
        wsync_text_str(t, ",\"control\":");
        if (!wsync_text_json_strn(t, b->control, WSYNC_HANDLE_MAX))
            return 0;
    }
    if (b->kind == WSYNC_BUFFER_NIXL) { /* the agent's metadata now: it names every region */
        char *peer = NULL;
        if (wsync_nixl_export_peer(&peer, NULL) != WSYNC_OK)
            return 0;
        wsync_text_str(t, ",\"peer\":\"");
        wsync_text_str(t, peer);
        wsync_text_put(t, "\"", 1);
        free(peer);
    }
    wsync_text_put(t, "}", 1);
    return 1;
}

/* ,"digests":"<base64 of n little-endian uint64 digests in tensor order>" */
static void wsync_text_digest_blob(wsync_text_t *t, const wsync_manifest_t *m)
{
    const size_t n = m->n_tensors;
    char *w = wsync_text_room(t, 13 + wsync_base64_encoded_size(8 * n));
    uint8_t *raw = malloc(8 * n);
    if (w == NULL || raw == NULL) {
        free(raw);
        t->bad = 1;
        return;
    }
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 8; k++)
            raw[8 * i + (size_t)k] = (uint8_t)(m->tensors[i].digest >> (8 * k));
    memcpy(w, ",\"digests\":\"", 12);
    wsync_base64_encode(raw, 8 * n, w + 12);
    t->len += 12 + strlen(w + 12);
    free(raw);
    wsync_text_put(t, "\"", 1);
}

/* ,"segments":[...] (direct mode), after the head: the text from there on -- the part a steady
 * trainer repeats byte for byte -- is one tail for the consumers' parse cache and for
 * wsync_manifest_emit_with_tail. 0 when a device or control name is not valid UTF-8. */
static int wsync_text_segments(wsync_text_t *t, const wsync_manifest_t *m)
{
    wsync_text_str(t, ",\"segments\":[");
    for (size_t k = 0; k < m->n_segments; k++) {
        if (k > 0)
            wsync_text_put(t, ",", 1);
        if (!wsync_text_buffer(t, &m->segments[k]))
            return 0;
    }
    wsync_text_put(t, "]", 1);
    return 1;
}

/* Every member before the segments: wsync, generation, finished, buffer, digests (the blob). 0
 * when the buffer's device or control name is not valid UTF-8. */
static int wsync_text_head(wsync_text_t *t, const wsync_manifest_t *m, int blob)
{
    wsync_text_str(t, "{\"wsync\":");
    wsync_text_int(t, WSYNC_MANIFEST_SCHEMA);
    wsync_text_str(t, ",\"generation\":");
    wsync_text_int(t, (long long)m->generation);
    wsync_text_str(t, m->finished ? ",\"finished\":true" : ",\"finished\":false");
    wsync_text_str(t, ",\"buffer\":");
    if (!wsync_text_buffer(t, &m->buffer))
        return 0;
    if (blob)
        wsync_text_digest_blob(t, m);
    return 1;
}

/* ---------------------------------------------------------------- tensors */

/* {"name":..,"dtype":..,"shape":[..],"offset":..,"nbytes":..[,"digest":..]}; 0 on a name that
 * is not valid UTF-8. */
static int wsync_emit_tensor(wsync_text_t *t, const wsync_tensor_desc_t *d, int with_digest,
                             long segment)
{
    wsync_text_str(t, "{\"name\":");
    if (!wsync_text_json_str(t, d->name))
        return 0;
    wsync_text_str(t, ",\"dtype\":\"");
    wsync_text_str(t, wsync_dtype_name(d->dtype));
    wsync_text_str(t, "\",\"shape\":[");
    for (uint32_t k = 0; k < d->ndim; k++) {
        if (k > 0)
            wsync_text_put(t, ",", 1);
        wsync_text_int(t, (long long)d->shape[k]);
    }
    if (segment >= 0) {
        wsync_text_str(t, "],\"segment\":");
        wsync_text_int(t, segment);
        wsync_text_str(t, ",\"offset\":");
    } else {
        wsync_text_str(t, "],\"offset\":");
    }
    wsync_text_int(t, (long long)d->offset);
    wsync_text_str(t, ",\"nbytes\":");
    wsync_text_int(t, (long long)d->nbytes);
    if (with_digest && d->has_digest) {
        char buf[32];
        wsync64_format(d->digest, buf);
        wsync_text_str(t, ",\"digest\":\"");
        wsync_text_str(t, buf);
        wsync_text_put(t, "\"", 1);
    }
    wsync_text_put(t, "}", 1);
    return 1;
}

/* Canonical form (parse caches rely on it, docs/DESIGN.md §2): "tensors" is the last member, and
 * when every tensor has a digest they travel in the top-level "digests" blob, so the text of the
 * tensors array stays byte-identical from one generation of a bucket to the next. */
static int wsync_emit_blob(const wsync_manifest_t *m)
{
    int blob = m->n_tensors > 0;
    for (size_t i = 0; blob && i < m->n_tensors; i++)
        blob = m->tensors[i].has_digest != 0;
    return blob;
}

wsync_result_t wsync_manifest_emit_with_tail(const wsync_manifest_t *m, const char *tail,
                                             size_t tail_len, char **out, wsync_error_t *err)
{
    wsync_result_t r;
    if (m == NULL || out == NULL || tail == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "manifest, tail and out must not be NULL");
    *out = NULL;
    if ((r = wsync_check_head(m, err)) != WSYNC_OK)
        return r;
    wsync_text_t t = {0};
    if (!wsync_text_head(&t, m, wsync_emit_blob(m))) {
        free(t.p);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "a device or control name of the buffer is not valid UTF-8, or its NIXL "
                          "agent gave no metadata");
    }
    wsync_text_put(&t, tail, tail_len);
    if (t.bad) {
        free(t.p);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot build the manifest JSON");
    }
    *out = t.p;
    return WSYNC_OK;
}

wsync_result_t wsync_manifest_emit(const wsync_manifest_t *m, char **out, wsync_error_t *err)
{
    size_t tail_at;
    return wsync_manifest_emit_split(m, out, &tail_at, err);
}

wsync_result_t wsync_manifest_emit_split(const wsync_manifest_t *m, char **out, size_t *tail_at,
                                         wsync_error_t *err)
{
    wsync_result_t r;

    if (m == NULL || out == NULL || tail_at == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "manifest and out must not be NULL");
    *out = NULL;
    if ((r = wsync_check_emit(m, err)) != WSYNC_OK)
        return r;

    const int blob = wsync_emit_blob(m);
    const int direct = WSYNC_HAS_FIELD(wsync_manifest_t, m, tensor_segment) && m->n_segments > 0;
    wsync_text_t t = {0};
    if (!wsync_text_head(&t, m, blob)) {
        free(t.p);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "a device or control name of the buffer or a segment is not valid UTF-8");
    }
    *tail_at = t.len;
    if (direct && !wsync_text_segments(&t, m)) {
        free(t.p);
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "a device or control name of the buffer or a segment is not valid UTF-8");
    }
    wsync_text_str(&t, ",\"tensors\":[");
    for (size_t i = 0; i < m->n_tensors; i++) {
        if (i > 0)
            wsync_text_put(&t, ",", 1);
        const long seg = direct ? (long)m->tensor_segment[i] : -1;
        if (!wsync_emit_tensor(&t, &m->tensors[i], !blob, seg)) {
            free(t.p);
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensors[%zu]: name is not valid UTF-8", i);
        }
    }
    wsync_text_str(&t, "]}");
    if (t.bad) {
        free(t.p);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot build the manifest JSON");
    }
    *out = t.p;
    return WSYNC_OK;
}
