/* Fuzz target: the safetensors header validator, from memory (wsync_safetensors_open_memory).
 * Invariants on every accepted image: each tensor's bytes lie inside the image after the header,
 * nbytes == dtype size x prod(shape), tensors come in ascending offset order without overlap,
 * and lookup by name finds each one. Reading every byte of every tensor must stay inside the
 * input (ASan checks the reads). */
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_fuzz.h"
#include "wsync_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wsync_safetensors_t *st = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};

    /* A private copy, exactly `size` bytes: any read past the end is an ASan finding. */
    uint8_t *img = malloc(size ? size : 1);
    WSYNC_FUZZ_CHECK(img != NULL);
    memcpy(img, data, size);
    wsync_result_t r = wsync_safetensors_open_memory(img, size, "fuzz", &st, &err);
    if (r != WSYNC_OK) {
        WSYNC_FUZZ_CHECK(st == NULL);
        WSYNC_FUZZ_CHECK(err.code == r && err.message[0] != '\0');
        free(img);
        return 0;
    }
    size_t n = wsync_safetensors_count(st);
    const uint8_t *prev_end = NULL;
    uint64_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        const wsync_st_tensor_t *t = wsync_safetensors_at(st, i);
        WSYNC_FUZZ_CHECK(t != NULL && t->name != NULL);
        WSYNC_FUZZ_CHECK(t->ndim <= WSYNC_MAX_DIMS);
        uint64_t expect;
        WSYNC_FUZZ_CHECK(wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, &expect) == 0);
        WSYNC_FUZZ_CHECK(expect == t->nbytes);
        const uint8_t *p = t->data;
        if (t->nbytes > 0) {
            WSYNC_FUZZ_CHECK(p >= img + 8 && p + t->nbytes <= img + size);
            WSYNC_FUZZ_CHECK(prev_end == NULL || p >= prev_end);
            prev_end = p + t->nbytes;
            for (uint64_t k = 0; k < t->nbytes; k += 61)
                sink += p[k];
            sink += p[t->nbytes - 1];
        }
        WSYNC_FUZZ_CHECK(wsync_safetensors_lookup(st, t->name) == t);
    }
    WSYNC_FUZZ_CHECK(wsync_safetensors_at(st, n) == NULL);
    (void)wsync_safetensors_metadata(st, "format");
    wsync_safetensors_close(st);
    free(img);
    return (int)(sink & 0); /* keep the reads */
}
