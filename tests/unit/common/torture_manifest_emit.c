/* Manifest emit: the hand-written text is byte for byte what jansson's compact dump writes
 * (names with every kind of escape, any UTF-8; the buffer and a direct manifest's segments with
 * every optional member), names that are not UTF-8 are refused naming the tensor, a bad segment
 * naming the segment, and emit and parse round-trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Library results are malloc'd; cmocka replaces free() with its checker below this point. */
static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#include "wsync_manifest.h"
#include "wsync_utf8.h"

static wsync_manifest_t manifest(wsync_tensor_desc_t *t, size_t n)
{
    wsync_manifest_t v = {
        .struct_size = sizeof(v), .schema = 1, .generation = 9, .n_tensors = n, .tensors = t};
    v.buffer.struct_size = sizeof(v.buffer);
    v.buffer.kind = WSYNC_BUFFER_HOST_SHM;
    memcpy(v.buffer.handle, "/wsync-7", 8);
    v.buffer.handle_len = 8;
    v.buffer.bytes = 1ull << 40;
    v.buffer.pid = 4242;
    strcpy(v.buffer.device, "cpu");
    return v;
}

static wsync_tensor_desc_t tensor(const char *name, uint64_t offset, int digest)
{
    wsync_tensor_desc_t t = {.struct_size = sizeof(t),
                             .name = name,
                             .dtype = WSYNC_DTYPE_BF16,
                             .ndim = 3,
                             .shape = {2, 3, 4},
                             .offset = offset,
                             .nbytes = 48,
                             .digest = 0x0123456789abcdefull ^ offset,
                             .has_digest = digest};
    return t;
}

/* Our text, loaded by jansson and dumped again compact in order, is the same text. */
static void expect_jansson_identical(const char *text)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (root == NULL)
        print_error("jansson cannot load %s: %s\n", text, je.text);
    assert_non_null(root);
    char *again = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_non_null(again);
    if (strcmp(again, text) != 0)
        print_error("ours:    %s\njansson: %s\n", text, again);
    assert_string_equal(again, text);
    real_free(again);
    json_decref(root);
}

static void test_same_bytes_as_jansson(void **state)
{
    (void)state;
    static const char *const names[] = {
        "model.layers.0.mlp.experts.7.gate_proj.weight",
        "quote\"back\\slash/slash",
        "ctl\b\f\n\r\t\x01\x1f\x7f end",
        "utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf",
        "x",
    };
    enum { N = sizeof(names) / sizeof(names[0]) };
    wsync_tensor_desc_t t[N];
    for (int digests = 0; digests < 3; digests++) { /* none, all (blob), some (per tensor) */
        for (size_t i = 0; i < N; i++)
            t[i] = tensor(names[i], 256 * i, digests == 1 || (digests == 2 && i % 2 == 0));
        wsync_manifest_t v = manifest(t, N);
        v.finished = digests == 1;
        char *text = NULL;
        assert_int_equal(wsync_manifest_emit(&v, &text, NULL), WSYNC_OK);
        expect_jansson_identical(text);
        assert_non_null(strstr(text, "\\u0001\\u001F\x7f end"));
        assert_true((strstr(text, "\"digests\":") != NULL) == (digests == 1));
        assert_true((strstr(text, "\"digest\":\"wsync64:") != NULL) == (digests == 2));
        /* and it parses back to the same manifest */
        wsync_manifest_owned_t *m = NULL;
        assert_int_equal(wsync_manifest_parse(text, strlen(text), &m, NULL), WSYNC_OK);
        assert_int_equal(m->view.n_tensors, N);
        for (size_t i = 0; i < N; i++) {
            assert_string_equal(m->view.tensors[i].name, names[i]);
            assert_int_equal(m->view.tensors[i].offset, 256 * i);
            assert_int_equal(m->view.tensors[i].has_digest, t[i].has_digest);
            if (t[i].has_digest)
                assert_int_equal(m->view.tensors[i].digest, t[i].digest);
        }
        wsync_manifest_free(m);
        real_free(text);
    }
    /* no tensors at all */
    wsync_manifest_t v = manifest(NULL, 0);
    char *text = NULL;
    assert_int_equal(wsync_manifest_emit(&v, &text, NULL), WSYNC_OK);
    expect_jansson_identical(text);
    assert_non_null(strstr(text, ",\"tensors\":[]}"));
    real_free(text);
}

static void test_names_not_utf8(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "lone \x80 continuation",
        "overlong \xc0\xaf",
        "overlong \xe0\x80\xaf",
        "surrogate \xed\xa0\x80",
        "above U+10FFFF \xf4\x90\x80\x80",
        "cut \xe2\x82",
        "byte \xff",
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        wsync_tensor_desc_t t[2] = {tensor("fine", 0, 1), tensor(bad[k], 256, 1)};
        wsync_manifest_t v = manifest(t, 2);
        char *text = (char *)"unchanged";
        wsync_error_t err;
        memset(&err, 0, sizeof(err));
        assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.message, "tensors[1]: name is not valid UTF-8"));
        assert_null(text);
        /* jansson agrees that it is no string */
        assert_null(json_string(bad[k]));
    }
}

/* A direct manifest: segments (every optional member, a UTF-8 device) after the digests blob
 * and right before "tensors", as jansson would dump them, and back through the parse. */
static void test_direct_same_bytes_as_jansson(void **state)
{
    (void)state;
    enum { N = 6, S = 3 };
    static char names[N][32];
    wsync_tensor_desc_t t[N];
    uint32_t ts[N];
    wsync_buffer_desc_t segs[S];
    memset(segs, 0, sizeof(segs));
    for (size_t k = 0; k < S; k++) {
        segs[k].struct_size = sizeof(segs[k]);
        segs[k].kind = k == 2 ? WSYNC_BUFFER_CUDA_VMM_RUN : WSYNC_BUFFER_CUDA_IPC;
        segs[k].handle_len = k == 1 ? 64 : 72 - (uint32_t)k; /* every base64 padding */
        for (uint32_t b = 0; b < segs[k].handle_len; b++)
            segs[k].handle[b] = (uint8_t)(37 * b + k);
        segs[k].bytes = (1ull << 30) + k;
        segs[k].pid = 4242;
        strcpy(segs[k].device, k == 1 ? "GPU-\xc3\xa9\"q\"" : "GPU-0123");
        segs[k].base_offset = k == 1 ? 4096 : 0;
        segs[k].has_ready = k == 0;
        segs[k].ready_len = 64;
        segs[k].has_consumed = k == 0;
        segs[k].consumed_len = 64;
        if (k == 2)
            strcpy(segs[k].control, "/wsync-ctl");
    }
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "model.layers.%zu.w", i);
        t[i] = tensor(names[i], 256 * (i / S), 1);
        ts[i] = (uint32_t)(i % S);
    }
    wsync_manifest_t v = manifest(t, N);
    v.n_segments = S;
    v.segments = segs;
    v.tensor_segment = ts;
    v.buffer.has_ready = 1;
    v.buffer.ready_len = 64;
    char *text = NULL;
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    if (wsync_manifest_emit(&v, &text, &err) != WSYNC_OK)
        fail_msg("%s", err.message);
    expect_jansson_identical(text);
    const char *dig = strstr(text, ",\"digests\":"), *sg = strstr(text, ",\"segments\":[");
    assert_non_null(dig);
    assert_non_null(sg);
    assert_true(dig < sg);
    assert_ptr_equal(strstr(sg, "]"), strstr(text, "],\"tensors\":[")); /* then "tensors" */
    wsync_manifest_owned_t *m = NULL;
    if (wsync_manifest_parse(text, strlen(text), &m, &err) != WSYNC_OK)
        fail_msg("%s", err.message);
    assert_int_equal(m->view.n_segments, S);
    for (size_t k = 0; k < S; k++) {
        const wsync_buffer_desc_t *g = &m->view.segments[k];
        assert_int_equal(g->kind, segs[k].kind);
        assert_int_equal(g->handle_len, segs[k].handle_len);
        assert_memory_equal(g->handle, segs[k].handle, segs[k].handle_len);
        assert_int_equal(g->bytes, segs[k].bytes);
        assert_int_equal(g->base_offset, segs[k].base_offset);
        assert_string_equal(g->device, segs[k].device);
        assert_string_equal(g->control, segs[k].control);
        assert_int_equal(g->has_ready, segs[k].has_ready);
    }
    for (size_t i = 0; i < N; i++)
        assert_int_equal(m->view.tensor_segment[i], ts[i]);
    wsync_manifest_free(m);
    real_free(text);

    /* a bad segment is refused naming it; a device that is not UTF-8 too */
    segs[1].handle_len = 0;
    text = (char *)"unchanged";
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "segments[1] handle lengths must be 1..128 bytes"));
    assert_null(text);
    segs[1].handle_len = 8;
    strcpy(segs[2].device, "GPU-\xff");
    text = (char *)"unchanged";
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "not valid UTF-8"));
    assert_null(text);
}

static void test_many_tensors(void **state)
{
    (void)state;
    enum { N = 5000 };
    wsync_tensor_desc_t *t = calloc(N, sizeof(*t));
    char(*names)[64] = calloc(N, sizeof(*names));
    assert_non_null(t);
    assert_non_null(names);
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "model.layers.%zu.mlp.experts.%zu.up_proj.weight",
                 i / 128, i % 128);
        t[i] = tensor(names[i], 256 * i, 1);
    }
    wsync_manifest_t v = manifest(t, N);
    char *text = NULL;
    assert_int_equal(wsync_manifest_emit(&v, &text, NULL), WSYNC_OK);
    expect_jansson_identical(text);
    real_free(text);
    free(names);
    free(t);
}

/* The oracle: one sequence at a time through wsync_utf8_len, to the NUL. */
static size_t ref_invalid_at(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; u[i] != '\0';) {
        const size_t n = wsync_utf8_len(u + i);
        if (n == 0)
            return i;
        i += n;
    }
    return (size_t)-1;
}

/* The length-bounded check (and the NUL-terminated one built on it) agrees with a walk one
 * sequence at a time on texts of ASCII runs (the eight-byte path) and every kind of sequence:
 * valid two to four bytes, overlong, surrogates, above U+10FFFF, stray continuations, and
 * sequences cut by the end. */
static void test_utf8_bounded_agrees(void **state)
{
    (void)state;
    static const char *const pieces[] = {"model.layers.",
                                         "0",
                                         "\"",
                                         "\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80",
                                         "\xc0\xaf",
                                         "\xed\xa0\x80",
                                         "\xf4\x90\x80\x80",
                                         "\x80",
                                         "\xc3",
                                         "\xe2\x82",
                                         "\xff",
                                         "\x7f",
                                         "abcdefghijklmnop"};
    const size_t np = sizeof(pieces) / sizeof(pieces[0]);
    uint64_t seed = 12345;
    char text[512];
    for (int round = 0; round < 20000; round++) {
        size_t len = 0;
        const int parts = 1 + round % 24;
        for (int k = 0; k < parts; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly ASCII, so the fast path runs and then meets a sequence at any alignment */
            const size_t p = (seed >> 33) % 8 < 6 ? ((seed >> 40) % 2 ? 0 : 14) : (seed >> 40) % np;
            const size_t n = strlen(pieces[p]);
            if (len + n >= sizeof(text))
                break;
            memcpy(text + len, pieces[p], n);
            len += n;
        }
        text[len] = '\0';
        assert_int_equal(wsync_utf8_invalid_n(text, len), ref_invalid_at(text));
        assert_int_equal(wsync_utf8_invalid_at(text), ref_invalid_at(text));
        /* the same text cut anywhere: a sequence cut by the end is invalid */
        const size_t cut = len ? (seed >> 20) % len : 0;
        char head[512];
        memcpy(head, text, cut);
        head[cut] = '\0';
        assert_int_equal(wsync_utf8_invalid_n(text, cut), ref_invalid_at(head));
    }
    assert_int_equal(wsync_utf8_invalid_n("ab\0cd", 5), 2); /* a NUL inside is invalid */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bytes_as_jansson),        cmocka_unit_test(test_names_not_utf8),
        cmocka_unit_test(test_direct_same_bytes_as_jansson), cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_utf8_bounded_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
