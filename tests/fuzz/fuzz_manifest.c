/* Fuzz target: wsync_manifest_parse, then the emit round trip.
 * Invariants checked on every manifest the parser accepts (the promises of wsync_manifest.h):
 * names non-empty, unique, <= WSYNC_MANIFEST_MAX_NAME; nbytes == dtype size x prod(shape);
 * offset + nbytes <= buffer bytes (direct: its segment's bytes) without overflow; ndim <=
 * WSYNC_MAX_DIMS; then emit(parse(x)) parses back to an equal manifest (segments included) and
 * emits the same text again, the same bytes as jansson's own compact dump of that text.
 * Differential (wsync_manifest_cache.h): the cached parse gives the full parse's code, message
 * and manifest for x, for x used as the head in front of a cached canonical tail (a staged one,
 * and a direct one from its "segments" on), and, once x itself is cached, for a canonical head
 * in front of x's tail. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "wsync_dtype.h"
#include "wsync_fuzz.h"
#include "wsync_manifest.h"
#include "wsync_manifest_cache.h"
#include "wsync_torch_handle.h"

static void check_contract(const wsync_manifest_t *m)
{
    const wsync_buffer_desc_t *b = &m->buffer;
    WSYNC_FUZZ_CHECK(m->generation >= 1);
    WSYNC_FUZZ_CHECK(b->kind == WSYNC_BUFFER_CUDA_IPC || b->kind == WSYNC_BUFFER_HOST_SHM ||
                     b->kind == WSYNC_BUFFER_CUDA_VMM_FD ||
                     b->kind == WSYNC_BUFFER_TORCH_EXPANDABLE);
    WSYNC_FUZZ_CHECK(b->handle_len >= 1 && b->handle_len <= WSYNC_HANDLE_MAX);
    WSYNC_FUZZ_CHECK(b->kind != WSYNC_BUFFER_CUDA_IPC || b->handle_len == 64);
    /* a torch expandable-segment share always decodes: header, 1..25 segments, fds >= 0 */
    wsync_torch_segments_t seg;
    WSYNC_FUZZ_CHECK(
        b->kind != WSYNC_BUFFER_TORCH_EXPANDABLE ||
        (wsync_torch_segments_decode(b->handle, b->handle_len, &seg, NULL) == WSYNC_OK &&
         seg.n >= 1 && seg.n <= WSYNC_TORCH_SEGMENTS_MAX));
    WSYNC_FUZZ_CHECK(b->bytes > 0);
    WSYNC_FUZZ_CHECK(memchr(b->device, '\0', sizeof(b->device)) != NULL);
    WSYNC_FUZZ_CHECK(memchr(b->control, '\0', sizeof(b->control)) != NULL);
    WSYNC_FUZZ_CHECK(m->n_tensors == 0 || m->tensors != NULL);
    for (size_t i = 0; i < m->n_tensors; i++) {
        const wsync_tensor_desc_t *t = &m->tensors[i];
        size_t n = strlen(t->name);
        WSYNC_FUZZ_CHECK(n >= 1 && n <= WSYNC_MANIFEST_MAX_NAME);
        WSYNC_FUZZ_CHECK(t->ndim <= WSYNC_MAX_DIMS);
        uint64_t expect, end;
        WSYNC_FUZZ_CHECK(wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, &expect) == 0);
        WSYNC_FUZZ_CHECK(expect == t->nbytes);
        WSYNC_FUZZ_CHECK(!__builtin_add_overflow(t->offset, t->nbytes, &end));
        if (m->n_segments > 0) { /* direct: inside its segment */
            WSYNC_FUZZ_CHECK(m->tensor_segment != NULL && m->tensor_segment[i] < m->n_segments);
            WSYNC_FUZZ_CHECK(end <= m->segments[m->tensor_segment[i]].bytes);
        } else {
            WSYNC_FUZZ_CHECK(end <= b->bytes);
        }
        /* Uniqueness: quadratic, so only on small manifests. */
        for (size_t j = 0; m->n_tensors <= 256 && j < i; j++)
            WSYNC_FUZZ_CHECK(strcmp(m->tensors[j].name, t->name) != 0);
    }
}

static void check_equal(const wsync_manifest_t *a, const wsync_manifest_t *b)
{
    WSYNC_FUZZ_CHECK(a->schema == b->schema);
    WSYNC_FUZZ_CHECK(a->generation == b->generation);
    WSYNC_FUZZ_CHECK(!a->finished == !b->finished);
    const wsync_buffer_desc_t *x = &a->buffer, *y = &b->buffer;
    WSYNC_FUZZ_CHECK(x->kind == y->kind);
    WSYNC_FUZZ_CHECK(x->handle_len == y->handle_len);
    WSYNC_FUZZ_CHECK(memcmp(x->handle, y->handle, x->handle_len) == 0);
    WSYNC_FUZZ_CHECK(x->bytes == y->bytes && x->base_offset == y->base_offset);
    WSYNC_FUZZ_CHECK(x->pid == y->pid);
    WSYNC_FUZZ_CHECK(strcmp(x->device, y->device) == 0);
    WSYNC_FUZZ_CHECK(!x->has_ready == !y->has_ready && !x->has_consumed == !y->has_consumed);
    if (x->has_ready)
        WSYNC_FUZZ_CHECK(x->ready_len == y->ready_len &&
                         memcmp(x->ready, y->ready, x->ready_len) == 0);
    if (x->has_consumed)
        WSYNC_FUZZ_CHECK(x->consumed_len == y->consumed_len &&
                         memcmp(x->consumed, y->consumed, x->consumed_len) == 0);
    WSYNC_FUZZ_CHECK(strcmp(x->control, y->control) == 0);
    WSYNC_FUZZ_CHECK(a->n_tensors == b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        const wsync_tensor_desc_t *s = &a->tensors[i], *t = &b->tensors[i];
        WSYNC_FUZZ_CHECK(strcmp(s->name, t->name) == 0);
        WSYNC_FUZZ_CHECK(s->dtype == t->dtype && s->ndim == t->ndim);
        WSYNC_FUZZ_CHECK(memcmp(s->shape, t->shape, s->ndim * sizeof(s->shape[0])) == 0);
        WSYNC_FUZZ_CHECK(s->offset == t->offset && s->nbytes == t->nbytes);
        WSYNC_FUZZ_CHECK(!s->has_digest == !t->has_digest);
        WSYNC_FUZZ_CHECK(!s->has_digest || s->digest == t->digest);
    }
    WSYNC_FUZZ_CHECK(a->n_segments == b->n_segments);
    for (size_t k = 0; k < a->n_segments; k++)
        WSYNC_FUZZ_CHECK(memcmp(&a->segments[k], &b->segments[k], sizeof(a->segments[k])) == 0);
    WSYNC_FUZZ_CHECK((a->tensor_segment == NULL) == (b->tensor_segment == NULL));
    for (size_t i = 0; a->tensor_segment != NULL && i < a->n_tensors; i++)
        WSYNC_FUZZ_CHECK(a->tensor_segment[i] == b->tensor_segment[i]);
}

/* Full and cached parse of text[0, len) agree. */
static void check_cached(wsync_manifest_cache_t *c, const char *text, size_t len)
{
    wsync_error_t e1 = {.struct_size = sizeof(e1)}, e2 = {.struct_size = sizeof(e2)};
    wsync_manifest_owned_t *full = NULL, *cached = NULL;
    wsync_result_t r1 = wsync_manifest_parse(text, len, &full, &e1);
    wsync_result_t r2 = wsync_manifest_parse_cached(c, text, len, &cached, &e2);
    WSYNC_FUZZ_CHECK(r1 == r2);
    WSYNC_FUZZ_CHECK(strcmp(e1.message, e2.message) == 0);
    WSYNC_FUZZ_CHECK((full == NULL) == (cached == NULL));
    if (r1 == WSYNC_OK) {
        check_contract(&cached->view);
        check_equal(&full->view, &cached->view);
    }
    wsync_manifest_free(full);
    wsync_manifest_free(cached);
}

/* A canonical manifest of 3 bf16 [4, 8] tensors with digests (in the blob), in a host_shm buffer;
 * direct: the tensors in 2 cuda_ipc segments, whose cached tail starts at `,"segments":`. */
static char *canonical_emit(int direct)
{
    static const char *names[2][3] = {
        {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"},
        {"model.layers.0.mlp.experts.0.up_proj.weight",
         "model.layers.0.mlp.experts.1.up_proj.weight", "model.norm.weight"}};
    wsync_tensor_desc_t t[3];
    uint32_t ts[3] = {0, 1, 0};
    for (int i = 0; i < 3; i++)
        t[i] = (wsync_tensor_desc_t){.struct_size = sizeof(t[i]),
                                     .name = names[direct][i],
                                     .dtype = WSYNC_DTYPE_BF16,
                                     .ndim = 2,
                                     .shape = {4, 8},
                                     .offset = direct ? (i == 2 ? 64 : 0) : 64 * (uint64_t)i,
                                     .nbytes = 64,
                                     .digest = 0x0123456789abcdefull * (uint64_t)(i + 1 + direct),
                                     .has_digest = 1};
    wsync_buffer_desc_t segs[2];
    for (int k = 0; k < 2; k++) {
        segs[k] = (wsync_buffer_desc_t){.struct_size = sizeof(segs[k]),
                                        .kind = WSYNC_BUFFER_CUDA_IPC,
                                        .handle_len = 72,
                                        .bytes = 4096,
                                        .pid = 1,
                                        .device = "GPU-fuzz"};
        memset(segs[k].handle, 'a' + k, 72);
    }
    wsync_manifest_t v = {.struct_size = sizeof(v),
                          .schema = 1,
                          .generation = 7,
                          .n_tensors = 3,
                          .tensors = t,
                          .n_segments = direct ? 2 : 0,
                          .segments = direct ? segs : NULL,
                          .tensor_segment = direct ? ts : NULL};
    v.buffer = (wsync_buffer_desc_t){.struct_size = sizeof(v.buffer),
                                     .kind = WSYNC_BUFFER_HOST_SHM,
                                     .handle = "/wsync-fuzz",
                                     .handle_len = 11,
                                     .bytes = direct ? 64 : 4096,
                                     .pid = 1,
                                     .device = "cpu"};
    char *text = NULL;
    WSYNC_FUZZ_CHECK(wsync_manifest_emit(&v, &text, NULL) == WSYNC_OK);
    return text;
}

static const char *canonical_text(void)
{
    static char *text;
    if (text == NULL)
        text = canonical_emit(0);
    return text;
}

static const char *canonical_direct_text(void)
{
    static char *text;
    if (text == NULL)
        text = canonical_emit(1);
    return text;
}

/* Where the tail of text starts as the parse cache takes it: at `,"segments":` when there is
 * one (a direct manifest), else at `,"tensors":`; len when neither. */
static size_t tail_start(const char *text, size_t len)
{
    const char *k = memmem(text, len, ",\"segments\":", 12);
    if (k == NULL)
        k = memmem(text, len, ",\"tensors\":", 11);
    return k ? (size_t)(k - text) : len;
}

/* a[0, alen) + b[0, blen), malloc'd. */
static char *concat(const char *a, size_t alen, const char *b, size_t blen)
{
    char *s = malloc(alen + blen + 1);
    WSYNC_FUZZ_CHECK(s != NULL);
    memcpy(s, a, alen);
    memcpy(s + alen, b, blen);
    s[alen + blen] = '\0';
    return s;
}

/* The input against one canonical text `canon` held in `warm` (its tail cached). */
static void check_against(wsync_manifest_cache_t *warm, const char *canon, const char *data,
                          size_t size, int parsed)
{
    size_t clen = strlen(canon), chead = tail_start(canon, clen);
    /* The input as the head in front of the cached canonical tail: always the head-only path. */
    char *y = concat(data, size, canon + chead, clen - chead);
    check_cached(warm, y, size + clen - chead);
    free(y);
    /* The input's own head (before its tail) in front of the canonical tail. */
    size_t t = tail_start(data, size);
    y = concat(data, t, canon + chead, clen - chead);
    check_cached(warm, y, t + clen - chead);
    free(y);

    if (!parsed)
        return;
    /* The input itself cached (when in the canonical form); then hit it, and put the canonical
     * head in front of its tail. */
    wsync_manifest_cache_t *self = wsync_manifest_cache_create();
    WSYNC_FUZZ_CHECK(self != NULL);
    check_cached(self, data, size);
    check_cached(self, data, size);
    char *z = concat(canon, chead, data + t, size - t);
    check_cached(self, z, chead + size - t);
    free(z);
    wsync_manifest_cache_destroy(self);
}

static void check_differential(const char *data, size_t size, int parsed)
{
    /* One cache for the whole run: warmed with the canonical manifests (staged and direct), and
     * it keeps the tails of earlier inputs too (bounded). */
    static wsync_manifest_cache_t *warm;
    const char *canon = canonical_text(), *direct = canonical_direct_text();
    if (warm == NULL) {
        WSYNC_FUZZ_CHECK((warm = wsync_manifest_cache_create()) != NULL);
        check_cached(warm, canon, strlen(canon));
        check_cached(warm, direct, strlen(direct));
    }
    check_cached(warm, data, size);
    check_against(warm, canon, data, size, parsed);
    check_against(warm, direct, data, size, parsed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wsync_manifest_owned_t *m = NULL, *m2 = NULL, *m3 = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};

    wsync_result_t r = wsync_manifest_parse((const char *)data, size, &m, &err);
    check_differential((const char *)data, size, r == WSYNC_OK);
    if (r != WSYNC_OK) {
        WSYNC_FUZZ_CHECK(m == NULL);
        WSYNC_FUZZ_CHECK(err.code == r && err.message[0] != '\0');
        WSYNC_FUZZ_CHECK(memchr(err.message, '\0', sizeof(err.message)) != NULL);
        return 0;
    }
    WSYNC_FUZZ_CHECK(m != NULL && err.code == WSYNC_OK);
    check_contract(&m->view);

    char *text = NULL, *text2 = NULL;
    WSYNC_FUZZ_CHECK(wsync_manifest_emit(&m->view, &text, &err) == WSYNC_OK);
    WSYNC_FUZZ_CHECK(wsync_manifest_parse(text, strlen(text), &m2, &err) == WSYNC_OK);
    check_equal(&m->view, &m2->view);
    WSYNC_FUZZ_CHECK(wsync_manifest_emit(&m2->view, &text2, &err) == WSYNC_OK);
    WSYNC_FUZZ_CHECK(strcmp(text, text2) == 0);
    /* The tensors array is written by hand: jansson, loading it and dumping it compact, must
     * write the same bytes. */
    json_t *jroot = json_loads(text, 0, NULL);
    WSYNC_FUZZ_CHECK(jroot != NULL);
    char *jtext = json_dumps(jroot, JSON_COMPACT | JSON_PRESERVE_ORDER);
    WSYNC_FUZZ_CHECK(jtext != NULL && strcmp(jtext, text) == 0);
    free(jtext);
    json_decref(jroot);

    /* A prefix of valid JSON must be refused cleanly (truncated transport). */
    size_t cut = strlen(text) / 2;
    WSYNC_FUZZ_CHECK(wsync_manifest_parse(text, cut, &m3, NULL) != WSYNC_OK && m3 == NULL);

    free(text);
    free(text2);
    wsync_manifest_free(m2);
    wsync_manifest_free(m);
    return 0;
}
