/* Fuzz target: wsync_manifest_parse, then the emit round trip.
 * Invariants checked on every manifest the parser accepts (the promises of wsync_manifest.h):
 * names non-empty, unique, <= WSYNC_MANIFEST_MAX_NAME; nbytes == dtype size x prod(shape);
 * offset + nbytes <= buffer bytes without overflow; ndim <= WSYNC_MAX_DIMS; then
 * emit(parse(x)) parses back to an equal manifest and emits the same text again. */
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_fuzz.h"
#include "wsync_manifest.h"

static void check_contract(const wsync_manifest_t *m)
{
    const wsync_buffer_desc_t *b = &m->buffer;
    WSYNC_FUZZ_CHECK(m->generation >= 1);
    WSYNC_FUZZ_CHECK(b->kind == WSYNC_BUFFER_CUDA_IPC || b->kind == WSYNC_BUFFER_HOST_SHM ||
                     b->kind == WSYNC_BUFFER_CUDA_VMM_FD);
    WSYNC_FUZZ_CHECK(b->handle_len >= 1 && b->handle_len <= WSYNC_HANDLE_MAX);
    WSYNC_FUZZ_CHECK(b->kind != WSYNC_BUFFER_CUDA_IPC || b->handle_len == 64);
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
        WSYNC_FUZZ_CHECK(end <= b->bytes);
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
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wsync_manifest_owned_t *m = NULL, *m2 = NULL, *m3 = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};

    wsync_result_t r = wsync_manifest_parse((const char *)data, size, &m, &err);
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

    /* A prefix of valid JSON must be refused cleanly (truncated transport). */
    size_t cut = strlen(text) / 2;
    WSYNC_FUZZ_CHECK(wsync_manifest_parse(text, cut, &m3, NULL) != WSYNC_OK && m3 == NULL);

    free(text);
    free(text2);
    wsync_manifest_free(m2);
    wsync_manifest_free(m);
    return 0;
}
