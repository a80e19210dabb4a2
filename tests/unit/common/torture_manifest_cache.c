/* Manifest parse cache: a hit gives exactly the full parse's result, every text the full parse
 * refuses is refused with the same code and message, the cache stays bounded, two threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* Library results are malloc'd; cmocka replaces free() with its checker below this point. */
static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#include "wsync_base64.h"
#include "wsync_manifest.h"
#include "wsync_manifest_cache.h"

enum { DIGESTS_NONE, DIGESTS_ALL, DIGESTS_SOME };

/* 64 zero bytes in base64: the digests blob of 8 tensors. */
#define B64_64                                                                                     \
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="

/* The bucket's buffer: a cuda_ipc handle that changes with the generation. */
static void test_buffer(wsync_buffer_desc_t *b, uint64_t generation, uint64_t bytes)
{
    b->struct_size = sizeof(*b);
    b->kind = WSYNC_BUFFER_CUDA_IPC;
    b->handle_len = 64;
    for (int i = 0; i < 64; i++)
        b->handle[i] = (uint8_t)(i + generation);
    b->bytes = bytes;
    b->pid = 4711;
    strcpy(b->device, "GPU-0123");
}

/* A bucket of n tensors "model.layers.<i>.<suffix>", bf16 [16,16] at i * 512, emitted with the
 * given generation, digest seed and mode. `bytes` 0: exactly n * 512. Returns malloc'd text
 * (free with real_free). */
static char *emit(size_t n, const char *suffix, uint64_t generation, uint64_t seed, int mode,
                  uint64_t bytes)
{
    wsync_tensor_desc_t *t = calloc(n ? n : 1, sizeof(*t));
    char *names = calloc(n ? n : 1, 160);
    assert_non_null(t);
    assert_non_null(names);
    for (size_t i = 0; i < n; i++) {
        char *name = names + 160 * i;
        snprintf(name, 160, "model.layers.%zu.%s", i, suffix);
        t[i] = (wsync_tensor_desc_t){.struct_size = sizeof(t[i]),
                                     .name = name,
                                     .dtype = WSYNC_DTYPE_BF16,
                                     .ndim = 2,
                                     .shape = {16, 16},
                                     .offset = i * 512,
                                     .nbytes = 512,
                                     .digest = seed * 0x9E3779B97F4A7C15ull + i,
                                     .has_digest = mode == DIGESTS_ALL ||
                                                   (mode == DIGESTS_SOME && i % 2 == 0)};
    }
    wsync_manifest_t v = {.struct_size = sizeof(v),
                          .schema = 1,
                          .generation = generation,
                          .finished = generation % 2 == 0,
                          .n_tensors = n,
                          .tensors = t};
    test_buffer(&v.buffer, generation, bytes ? bytes : (n ? n * 512 : 1));
    v.buffer.has_ready = 1;
    v.buffer.ready_len = 64;
    memset(v.buffer.ready, (int)generation, 64);
    char *text = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_OK);
    free(names);
    free(t);
    return text;
}

/* A direct bucket: n tensors as in emit(), tensor i in segment i % nseg at offset (i / nseg) *
 * 512, every segment seg_bytes; the buffer is the small synchronisation object. */
static char *emit_direct(size_t n, uint64_t generation, size_t nseg, uint64_t seg_bytes)
{
    wsync_tensor_desc_t *t = calloc(n ? n : 1, sizeof(*t));
    uint32_t *ts = calloc(n ? n : 1, sizeof(*ts));
    wsync_buffer_desc_t *segs = calloc(nseg, sizeof(*segs));
    char *names = calloc(n ? n : 1, 160);
    assert_non_null(t);
    assert_non_null(ts);
    assert_non_null(segs);
    assert_non_null(names);
    for (size_t i = 0; i < n; i++) {
        char *name = names + 160 * i;
        snprintf(name, 160, "model.layers.%zu.direct", i);
        t[i] = (wsync_tensor_desc_t){.struct_size = sizeof(t[i]),
                                     .name = name,
                                     .dtype = WSYNC_DTYPE_BF16,
                                     .ndim = 2,
                                     .shape = {16, 16},
                                     .offset = (i / nseg) * 512,
                                     .nbytes = 512};
        ts[i] = (uint32_t)(i % nseg);
    }
    for (size_t k = 0; k < nseg; k++) {
        segs[k].struct_size = sizeof(segs[k]);
        segs[k].kind = WSYNC_BUFFER_CUDA_IPC;
        segs[k].handle_len = 72;
        for (int b = 0; b < 72; b++)
            segs[k].handle[b] = (uint8_t)(b + k);
        segs[k].bytes = seg_bytes;
        segs[k].pid = 4711;
        strcpy(segs[k].device, "GPU-0123");
    }
    wsync_manifest_t v = {.struct_size = sizeof(v),
                          .schema = 1,
                          .generation = generation,
                          .n_tensors = n,
                          .tensors = t,
                          .n_segments = nseg,
                          .segments = segs,
                          .tensor_segment = ts};
    test_buffer(&v.buffer, generation, 64);
    char *text = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_manifest_emit(&v, &text, &err), WSYNC_OK);
    free(names);
    free(segs);
    free(ts);
    free(t);
    return text;
}

static void assert_views_equal(const wsync_manifest_t *a, const wsync_manifest_t *b)
{
    assert_int_equal(a->schema, b->schema);
    assert_int_equal(a->generation, b->generation);
    assert_int_equal(!a->finished, !b->finished);
    assert_memory_equal(&a->buffer, &b->buffer, sizeof(a->buffer));
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        const wsync_tensor_desc_t *x = &a->tensors[i], *y = &b->tensors[i];
        assert_int_equal(x->struct_size, y->struct_size);
        assert_string_equal(x->name, y->name);
        assert_ptr_not_equal(x->name, y->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        assert_memory_equal(x->shape, y->shape, sizeof(x->shape));
        assert_int_equal(x->offset, y->offset);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_int_equal(x->has_digest, y->has_digest);
        assert_int_equal(x->digest, y->digest);
    }
    assert_int_equal(a->n_segments, b->n_segments);
    for (size_t k = 0; k < a->n_segments; k++)
        assert_memory_equal(&a->segments[k], &b->segments[k], sizeof(a->segments[k]));
    assert_int_equal(a->tensor_segment == NULL, b->tensor_segment == NULL);
    if (a->tensor_segment != NULL)
        assert_memory_equal(a->tensor_segment, b->tensor_segment,
                            a->n_tensors * sizeof(*a->tensor_segment));
}

static wsync_manifest_cache_stats_t stats(wsync_manifest_cache_t *c)
{
    wsync_manifest_cache_stats_t s;
    wsync_manifest_cache_stats(c, &s);
    return s;
}

/* Parse `text` with and without the cache; both must give `code` (and the same message), and on
 * success equal views. Returns the cached result's code. */
static wsync_result_t differential_at(wsync_manifest_cache_t *c, const char *text, size_t len,
                                      wsync_result_t code, int line)
{
    wsync_error_t e1 = {.struct_size = sizeof(e1)}, e2 = {.struct_size = sizeof(e2)};
    wsync_manifest_owned_t *full = NULL, *cached = NULL;
    wsync_result_t r1 = wsync_manifest_parse(text, len, &full, &e1);
    wsync_result_t r2 = wsync_manifest_parse_cached(c, text, len, &cached, &e2);
    if (r1 != code || r2 != code || strcmp(e1.message, e2.message) != 0)
        print_error("line %d: want %d, full %d \"%s\", cached %d \"%s\"\n", line, code, r1,
                    e1.message, r2, e2.message);
    assert_int_equal(r1, code);
    assert_int_equal(r2, code);
    assert_string_equal(e1.message, e2.message);
    assert_string_equal(e1.where, e2.where);
    if (code == WSYNC_OK)
        assert_views_equal(&full->view, &cached->view);
    else
        assert_null(cached);
    wsync_manifest_free(full);
    wsync_manifest_free(cached);
    return r2;
}
#define differential(c, text, code) differential_at((c), (text), strlen(text), (code), __LINE__)

/* The head of an emitted text: everything before its `,"tensors":`. Out of line: inlined at
 * -O2, GCC 12's -Wdangling-pointer misreads the difference as a use of a dead pointer. */
static __attribute__((noinline)) size_t head_len(const char *text)
{
    const char *k = strstr(text, ",\"tensors\":");
    if (k == NULL)
        fail_msg("no \",\"tensors\":\" in %.80s", text);
    return (size_t)(k - text);
}

/* head (given) + the tail of `from`. malloc'd with cmocka's allocator. */
static char *splice(const char *head, const char *from)
{
    const char *tail = from + head_len(from);
    char *s = malloc(strlen(head) + strlen(tail) + 1);
    assert_non_null(s);
    strcpy(s, head);
    strcat(s, tail);
    return s;
}

static void test_emit_canonical(void **state)
{
    (void)state;
    char *all = emit(3, "w", 5, 1, DIGESTS_ALL, 0);
    assert_non_null(strstr(all, "\"buffer\":{"));
    assert_true(strstr(all, ",\"digests\":\"") < strstr(all, ",\"tensors\":["));
    assert_null(strstr(all, "\"digest\":"));
    assert_string_equal(all + strlen(all) - 2, "]}");
    char *some = emit(3, "w", 5, 1, DIGESTS_SOME, 0);
    assert_null(strstr(some, "\"digests\""));
    assert_non_null(strstr(some, "\"digest\":\"wsync64:"));
    char *none = emit(0, "w", 5, 1, DIGESTS_ALL, 0);
    assert_null(strstr(none, "\"digests\""));

    /* The blob decodes to the digests, little-endian, in tensor order. */
    wsync_manifest_owned_t *m = NULL;
    assert_int_equal(wsync_manifest_parse(all, strlen(all), &m, NULL), WSYNC_OK);
    for (size_t i = 0; i < 3; i++) {
        assert_true(m->view.tensors[i].has_digest);
        assert_int_equal(m->view.tensors[i].digest, 0x9E3779B97F4A7C15ull + i);
    }
    wsync_manifest_free(m);
    real_free(all);
    real_free(some);
    real_free(none);
}

static void test_hit_equals_full(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    assert_non_null(c);
    char *g1 = emit(5000, "mlp.experts.w", 1, 1, DIGESTS_ALL, 0);
    char *g2 = emit(5000, "mlp.experts.w", 2, 2, DIGESTS_ALL, 0);
    /* Only the head differs between generations. */
    assert_string_equal(g1 + head_len(g1), g2 + head_len(g2));
    assert_string_not_equal(g1, g2);

    differential(c, g1, WSYNC_OK);
    assert_int_equal(stats(c).misses, 1);
    assert_int_equal(stats(c).hits, 0);
    assert_int_equal(stats(c).entries, 1);
    differential(c, g2, WSYNC_OK);
    assert_int_equal(stats(c).hits, 1);
    differential(c, g1, WSYNC_OK);
    assert_int_equal(stats(c).hits, 2);

    /* A result outlives the cache: it owns its descriptors and names. */
    wsync_manifest_owned_t *m = NULL;
    assert_int_equal(wsync_manifest_parse_cached(c, g2, strlen(g2), &m, NULL), WSYNC_OK);
    assert_int_equal(stats(c).hits, 3);
    wsync_manifest_cache_destroy(c);
    assert_int_equal(m->view.generation, 2);
    assert_string_equal(m->view.tensors[4999].name, "model.layers.4999.mlp.experts.w");
    assert_int_equal(m->view.tensors[4999].digest, 2 * 0x9E3779B97F4A7C15ull + 4999);
    wsync_manifest_free(m);

    /* Per-tensor digests in the array (some tensors only): cached with them. */
    c = wsync_manifest_cache_create();
    char *s1 = emit(100, "w", 1, 1, DIGESTS_SOME, 0);
    char *s2 = emit(100, "w", 3, 1, DIGESTS_SOME, 0);
    differential(c, s1, WSYNC_OK);
    differential(c, s2, WSYNC_OK);
    assert_int_equal(stats(c).hits, 1);
    /* The same head with a different buffer size (still large enough) hits too. */
    char *big = emit(100, "w", 4, 1, DIGESTS_SOME, 1 << 20);
    differential(c, big, WSYNC_OK);
    assert_int_equal(stats(c).hits, 2);
    wsync_manifest_cache_destroy(c);
    real_free(g1);
    real_free(g2);
    real_free(s1);
    real_free(s2);
    real_free(big);
}

static void test_changed_table_misses(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char *a = emit(64, "w", 1, 1, DIGESTS_ALL, 0);
    char *b = emit(64, "v", 2, 1, DIGESTS_ALL, 0);
    char *d = emit(63, "w", 3, 1, DIGESTS_ALL, 0);
    differential(c, a, WSYNC_OK);
    differential(c, b, WSYNC_OK);
    differential(c, d, WSYNC_OK);
    assert_int_equal(stats(c).hits, 0);
    assert_int_equal(stats(c).misses, 3);
    assert_int_equal(stats(c).entries, 3);
    /* One byte of the array changed: a miss, and the full parse's answer. */
    char *e = malloc(strlen(a) + 1);
    assert_non_null(e);
    strcpy(e, a);
    char *shape = strstr(e + head_len(e), "[16,16]");
    shape[2] = '8'; /* [18,16]: nbytes no longer matches */
    differential(c, e, WSYNC_ERR_BAD_MANIFEST);
    assert_int_equal(stats(c).hits, 0);
    free(e);
    wsync_manifest_cache_destroy(c);
    real_free(a);
    real_free(b);
    real_free(d);
}

static void test_hostile_heads(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char *ref = emit(8, "w", 1, 1, DIGESTS_ALL, 0);
    differential(c, ref, WSYNC_OK);
    char buf[] = "\"buffer\":{\"kind\":\"cuda_ipc\",\"handle\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGB"
                 "kaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw==\",\"bytes\":4096,"
                 "\"pid\":1,\"device\":\"d\"}";
    char head[1024];
    static const struct {
        const char *fmt; /* %s = the buffer member */
        wsync_result_t code;
    } cases[] = {
        /* members in another order, an unknown member: a hit */
        {"{\"x\":[1,{\"y\":2}],%s,\"finished\":true,\"generation\":7,\"wsync\":1", WSYNC_OK},
        {"{\"wsync\":1,\"generation\":2,%s ", WSYNC_OK},
        /* a second "tensors" in the head */
        {"{\"wsync\":1,\"tensors\":[],\"generation\":2,%s", WSYNC_ERR_BAD_MANIFEST},
        /* ends inside a string: the tail would be read as the string's continuation */
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":\"\\", WSYNC_ERR_BAD_MANIFEST},
        /* unbalanced: the tail would close an inner object */
        {"{\"wsync\":1,\"generation\":2,\"buffer\":{\"kind\":\"host_shm\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":{\"y\":1", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":[1", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s}", WSYNC_ERR_BAD_MANIFEST},
        {"[{\"wsync\":1,\"generation\":2,%s", WSYNC_ERR_BAD_MANIFEST},
        {"{", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":tru", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"x\":1e", WSYNC_ERR_BAD_MANIFEST},
        /* duplicates and field errors in the head: the full parse's messages */
        {"{\"wsync\":1,\"generation\":2,\"generation\":3,%s", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":2,\"generation\":2,%s", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":0,%s", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,\"finished\":1,%s", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":7", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":\"A===\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":\"\"", WSYNC_ERR_BAD_MANIFEST},
        /* a head ending in `,"digests":"..."` (decoded without jansson when plain base64) */
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":\"" B64_64 "\"", WSYNC_OK},
        {"{\"digests\":\"" B64_64 "\",\"wsync\":1,\"generation\":2,%s,\"digests\":\"" B64_64 "\"",
         WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":\"\\u0041" B64_64 "\"",
         WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":\"\\/" B64_64 "\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"digests\":\"" B64_64 "*\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"y\":{\"z\":1,\"digests\":\"" B64_64 "\"",
         WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":1,\"generation\":2,%s,\"y\":\"q,\"digests\":\"" B64_64 "\"",
         WSYNC_ERR_BAD_MANIFEST},
        {"{,\"digests\":\"" B64_64 "\"", WSYNC_ERR_BAD_MANIFEST},
        {"{\"wsync\":2,\"generation\":2,%s,\"digests\":\"" B64_64 "\"", WSYNC_ERR_BAD_MANIFEST},
    };
    uint64_t hits = stats(c).hits;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(head, sizeof(head), cases[i].fmt, buf);
        char *text = splice(head, ref);
        differential(c, text, cases[i].code);
        free(text);
    }
    assert_int_equal(stats(c).hits, hits + sizeof(cases) / sizeof(cases[0]));

    /* A NUL byte in the head: jansson stops there; both refuse. */
    snprintf(head, sizeof(head), "{\"wsync\":1,\"generation\":2,%s,\"x\":1", buf);
    char *text = splice(head, ref);
    size_t len = strlen(text);
    text[strlen(head) - 2] = '\0';
    differential_at(c, text, len, WSYNC_ERR_BAD_MANIFEST, __LINE__);
    free(text);
    wsync_manifest_cache_destroy(c);
    real_free(ref);
}

static void test_out_of_bounds(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char *ref = emit(100, "w", 1, 1, DIGESTS_ALL, 0);
    char *small = emit(100, "w", 2, 1, DIGESTS_ALL, 100 * 512 - 1);
    char *tiny = emit(100, "w", 3, 1, DIGESTS_ALL, 1000);
    differential(c, ref, WSYNC_OK);
    uint64_t hits = stats(c).hits;
    assert_int_equal(differential(c, small, WSYNC_ERR_OUT_OF_BOUNDS), WSYNC_ERR_OUT_OF_BOUNDS);
    assert_int_equal(differential(c, tiny, WSYNC_ERR_OUT_OF_BOUNDS), WSYNC_ERR_OUT_OF_BOUNDS);
    assert_int_equal(stats(c).hits, hits + 2);

    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_manifest_owned_t *m = NULL;
    assert_int_equal(wsync_manifest_parse_cached(c, small, strlen(small), &m, &err),
                     WSYNC_ERR_OUT_OF_BOUNDS);
    assert_null(m);
    assert_non_null(strstr(err.message, "tensors[99] (\"model.layers.99.w\"): offset 50688 + "
                                        "nbytes 512 exceeds buffer bytes 51199"));
    wsync_manifest_cache_destroy(c);
    real_free(ref);
    real_free(small);
    real_free(tiny);
}

static void test_digest_blob(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char *ref = emit(4, "w", 1, 1, DIGESTS_ALL, 0);
    char *some = emit(4, "w", 1, 1, DIGESTS_SOME, 0);
    differential(c, ref, WSYNC_OK);
    differential(c, some, WSYNC_OK);

    char head[512], blob[64];
    uint8_t raw[40] = {0};
    const char *lead = "{\"wsync\":1,\"generation\":2,\"buffer\":{\"kind\":\"host_shm\","
                       "\"handle\":\"eA==\",\"bytes\":4096,\"pid\":1,\"device\":\"cpu\"}";
    for (size_t n = 0; n <= 5; n++) {
        wsync_base64_encode(raw, 8 * n, blob);
        snprintf(head, sizeof(head), "%s,\"digests\":\"%s\"", lead, blob);
        char *text = splice(head, ref);
        differential(c, text, n == 4 ? WSYNC_OK : WSYNC_ERR_BAD_MANIFEST);
        if (n != 4) {
            wsync_error_t err = {.struct_size = sizeof(err)};
            wsync_manifest_owned_t *m = NULL;
            char want[128];
            snprintf(want, sizeof(want), "digests: decodes to %zu bytes", 8 * n);
            assert_int_equal(wsync_manifest_parse_cached(c, text, strlen(text), &m, &err),
                             WSYNC_ERR_BAD_MANIFEST);
            assert_non_null(strstr(err.message, want));
            assert_non_null(strstr(err.message, "x 4 tensors = 32 bytes"));
        }
        free(text);
        /* A blob and per-tensor digests for the same tensor. */
        text = splice(head, some);
        differential(c, text, WSYNC_ERR_BAD_MANIFEST);
        free(text);
    }
    char *text = splice(lead, some); /* no blob: the per-tensor digests only */
    differential(c, text, WSYNC_OK);
    free(text);
    wsync_manifest_cache_destroy(c);
    real_free(ref);
    real_free(some);
}

/* "tensors" not last, or not the only member after the head: never cached, still parsed. */
static void test_other_orders(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    const char *buffer = "\"buffer\":{\"kind\":\"host_shm\",\"handle\":\"eA==\",\"bytes\":4096,"
                         "\"pid\":1,\"device\":\"cpu\"}";
    const char *tensors = "\"tensors\":[{\"name\":\"a\",\"dtype\":\"uint8\",\"shape\":[4],"
                          "\"offset\":0,\"nbytes\":4}]";
    char text[1024];
    snprintf(text, sizeof(text), "{%s,\"wsync\":1,\"generation\":1,%s}", tensors, buffer);
    differential(c, text, WSYNC_OK);
    snprintf(text, sizeof(text), "{\"wsync\":1,%s,\"generation\":1,%s}", tensors, buffer);
    differential(c, text, WSYNC_OK);
    snprintf(text, sizeof(text), "{\"wsync\":1,%s,%s,\"generation\":1}", buffer, tensors);
    differential(c, text, WSYNC_OK);
    assert_int_equal(stats(c).entries, 0);
    /* Were the last one cached, this head would smuggle a duplicate "generation" past it. */
    snprintf(text, sizeof(text), "{\"wsync\":1,\"generation\":5,%s,%s,\"generation\":1}", buffer,
             tensors);
    differential(c, text, WSYNC_ERR_BAD_MANIFEST);
    /* Nested "tensors" keys inside the array are fine; the top-level one is found. */
    snprintf(text, sizeof(text),
             "{\"wsync\":1,\"generation\":1,%s,\"tensors\":[{\"name\":\"a\",\"x\":{\"q\":1,"
             "\"tensors\":2},\"dtype\":\"uint8\",\"shape\":[4],\"offset\":0,\"nbytes\":4}]}",
             buffer);
    differential(c, text, WSYNC_OK);
    assert_int_equal(stats(c).entries, 1);
    text[strlen("{\"wsync\":1,\"generation\":")] = '2';
    uint64_t hits = stats(c).hits;
    differential(c, text, WSYNC_OK);
    assert_int_equal(stats(c).hits, hits + 1);
    wsync_manifest_cache_destroy(c);
}

static void test_bounded(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char suffix[64];
    char *first = NULL;
    for (int i = 0; i < 10000; i++) {
        snprintf(suffix, sizeof(suffix), "layout%d", i);
        char *text = emit(2, suffix, 1, 1, DIGESTS_ALL, 0);
        wsync_manifest_owned_t *m = NULL;
        assert_int_equal(wsync_manifest_parse_cached(c, text, strlen(text), &m, NULL), WSYNC_OK);
        wsync_manifest_free(m);
        assert_true(stats(c).entries <= WSYNC_MANIFEST_CACHE_MAX_ENTRIES);
        if (i == 0)
            first = text;
        else
            real_free(text);
    }
    assert_int_equal(stats(c).entries, WSYNC_MANIFEST_CACHE_MAX_ENTRIES);
    assert_int_equal(stats(c).misses, 10000);
    /* The first layout was evicted long ago: a miss again, then a hit. */
    differential(c, first, WSYNC_OK);
    assert_int_equal(stats(c).misses, 10001);
    differential(c, first, WSYNC_OK);
    assert_int_equal(stats(c).hits, 1);
    real_free(first);

    /* The byte bound: about 3.7 MiB per layout (tail, descriptors, names). */
    for (int i = 0; i < 30; i++) {
        snprintf(suffix, sizeof(suffix), "big%d.mlp.experts.gate_up_proj.weight", i);
        char *text = emit(12000, suffix, 1, 1, DIGESTS_ALL, 0);
        wsync_manifest_owned_t *m = NULL;
        assert_int_equal(wsync_manifest_parse_cached(c, text, strlen(text), &m, NULL), WSYNC_OK);
        wsync_manifest_free(m);
        real_free(text);
        assert_true(stats(c).bytes <= WSYNC_MANIFEST_CACHE_MAX_BYTES);
    }
    assert_true(stats(c).entries < 30);
    assert_true(stats(c).bytes > WSYNC_MANIFEST_CACHE_MAX_BYTES / 2);
    wsync_manifest_cache_destroy(c);
}

typedef struct worker {
    wsync_manifest_cache_t *cache;
    const char *texts[4];
    uint64_t generations[4];
    int start;
    int failures;
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    for (int it = 0; it < 300; it++) {
        int k = (it * 3 + w->start) % 4;
        wsync_manifest_owned_t *m = NULL;
        const char *t = w->texts[k];
        if (wsync_manifest_parse_cached(w->cache, t, strlen(t), &m, NULL) != WSYNC_OK ||
            m->view.generation != w->generations[k] || m->view.n_tensors != 300 ||
            !m->view.tensors[299].has_digest)
            w->failures++;
        wsync_manifest_free(m);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char *t[4] = {emit(300, "a", 1, 1, DIGESTS_ALL, 0), emit(300, "a", 2, 2, DIGESTS_ALL, 0),
                  emit(300, "b", 3, 3, DIGESTS_ALL, 0), emit(300, "b", 4, 4, DIGESTS_ALL, 0)};
    worker_t w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        w[i] = (worker_t){.cache = c, .start = i};
        for (int k = 0; k < 4; k++) {
            w[i].texts[k] = t[k];
            w[i].generations[k] = (uint64_t)k + 1;
        }
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(w[0].failures, 0);
    assert_int_equal(w[1].failures, 0);
    assert_int_equal(stats(c).entries, 2);
    assert_true(stats(c).hits >= 600 - 4);
    wsync_manifest_cache_destroy(c);
    for (int k = 0; k < 4; k++)
        real_free(t[k]);
}

static void test_null_cache(void **state)
{
    (void)state;
    char *ref = emit(3, "w", 1, 1, DIGESTS_ALL, 0);
    differential(NULL, ref, WSYNC_OK);
    wsync_manifest_cache_destroy(NULL);
    wsync_manifest_cache_stats_t s = stats(NULL);
    assert_int_equal(s.entries, 0);
    real_free(ref);
}

/* A text of n tensor objects, every one named the same (a parse would refuse it only at the
 * end): ~85 bytes a tensor. */
static char *hostile(size_t n, size_t *len)
{
    static const char head[] = "{\"wsync\":1,\"generation\":1,\"finished\":true,\"buffer\":"
                               "{\"kind\":\"host_shm\",\"handle\":\"L3dzeW5j\",\"bytes\":4096,"
                               "\"pid\":1,\"device\":\"cpu\"},\"tensors\":[";
    static const char one[] = "{\"name\":\"model.norm.weight\",\"dtype\":\"bfloat16\","
                              "\"shape\":[64],\"offset\":0,\"nbytes\":128},";
    const size_t cap = sizeof(head) + n * (sizeof(one) - 1) + 4;
    char *t = malloc(cap), *p = t;
    assert_non_null(t);
    memcpy(p, head, sizeof(head) - 1);
    p += sizeof(head) - 1;
    for (size_t i = 0; i < n; i++, p += sizeof(one) - 1)
        memcpy(p, one, sizeof(one) - 1);
    p[-1] = ']';
    *p++ = '}';
    *len = (size_t)(p - t);
    return t;
}

static long rss_kib(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* 10^6 tensors: refused by its size, then (with the byte limit raised) by its object count, each
 * in well under a second and without an allocation that shows in the peak RSS. */
static void test_huge_manifest_refused_before_parse(void **state)
{
    (void)state;
    size_t len = 0;
    char *text = hostile(1000000, &len);
    assert_true(len > WSYNC_MANIFEST_DEFAULT_MAX_BYTES);
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    const long rss0 = rss_kib();
    const wsync_manifest_limits_t limits[] = {{0, 0}, {1ull << 30, 0}};
    const char *needles[] = {"over this consumer's limit of 16777216 (max_manifest_bytes)",
                             "limit of 65536 tensors (max_manifest_tensors)"};
    for (int k = 0; k < 2; k++) {
        wsync_manifest_cache_set_limits(c, &limits[k]);
        wsync_error_t err = {.struct_size = sizeof(err)};
        wsync_manifest_owned_t *m = (wsync_manifest_owned_t *)1;
        const double t0 = now_s();
        assert_int_equal(wsync_manifest_parse_cached(c, text, len, &m, &err),
                         WSYNC_ERR_BAD_MANIFEST);
        const double dt = now_s() - t0;
        print_message("%zu-byte manifest of 10^6 tensors refused in %.1f ms: %s\n", len, dt * 1e3,
                      err.message);
        assert_null(m);
        assert_true(dt < 0.5);
        assert_non_null(strstr(err.message, needles[k]));
    }
    assert_true(rss_kib() - rss0 < 8 * 1024); /* no parse tree (a full parse grew ~1 GiB) */
    wsync_manifest_cache_destroy(c);
    free(text); /* cmocka's: hostile() allocated it below the include */
}

/* The consumer's limit on tensors: exactly the limit parses, one more is refused naming it;
 * braces inside strings are not objects. */
static void test_tensor_limit(void **state)
{
    (void)state;
    wsync_consumer_config_t cfg = {.struct_size = sizeof(cfg), .max_manifest_tensors = 3};
    wsync_manifest_cache_t *c = wsync_manifest_cache_for(&cfg);
    wsync_manifest_owned_t *m_unused = NULL;
    for (size_t n = 3; n <= 4; n++) {
        char *text = emit(n, "{weird}.weight", 1, 1, DIGESTS_NONE, 0);
        wsync_error_t err = {.struct_size = sizeof(err)};
        wsync_manifest_owned_t *m = NULL;
        wsync_result_t r = wsync_manifest_parse_cached(c, text, strlen(text), &m, &err);
        if (n == 3) {
            assert_int_equal(r, WSYNC_OK);
            assert_int_equal(m->view.n_tensors, 3);
            wsync_manifest_free(m);
        } else {
            assert_int_equal(r, WSYNC_ERR_BAD_MANIFEST);
            assert_non_null(strstr(err.message, "limit of 3 tensors"));
        }
        real_free(text);
    }
    /* A hit scans only its head, the tail's objects counted when it was stored: a head with one
     * more object tips the same 3-tensor text over, refused as a whole scan refuses it. */
    char *three = emit(3, "{weird}.weight", 2, 1, DIGESTS_NONE, 0);
    size_t tlen = strlen(three);
    char *more = calloc(1, tlen + 16);
    assert_non_null(more);
    memcpy(more, "{\"x\":{},", 8);
    memcpy(more + 8, three + 1, tlen - 1);
    wsync_error_t hit = {.struct_size = sizeof(hit)}, whole = {.struct_size = sizeof(whole)};
    wsync_manifest_limits_t three_tensors = {0, 3};
    assert_int_equal(wsync_manifest_parse_cached(c, more, strlen(more), &m_unused, &hit),
                     WSYNC_ERR_BAD_MANIFEST);
    assert_int_equal(wsync_manifest_check_limits(more, strlen(more), 0, 0, &three_tensors, &whole),
                     WSYNC_ERR_BAD_MANIFEST);
    assert_string_equal(hit.message, whole.message);
    wsync_manifest_cache_stats_t st;
    wsync_manifest_cache_stats(c, &st);
    assert_int_equal(st.entries, 1); /* the 3-tensor tail: the text above met it */
    free(more);
    real_free(three);
    /* a config too small to hold the fields keeps the defaults */
    wsync_consumer_config_t old = {.struct_size =
                                       offsetof(wsync_consumer_config_t, max_manifest_bytes)};
    wsync_manifest_cache_t *d = wsync_manifest_cache_for(&old);
    char *text = emit(4, "w", 1, 1, DIGESTS_NONE, 0);
    wsync_manifest_owned_t *m = NULL;
    assert_int_equal(wsync_manifest_parse_cached(d, text, strlen(text), &m, NULL), WSYNC_OK);
    wsync_manifest_free(m);
    real_free(text);
    wsync_manifest_cache_destroy(d);
    wsync_manifest_cache_destroy(c);
}

/* Direct manifests: the tail's segment indices are cached and checked against each head's
 * segments exactly as the full parse checks them; a staged tail never serves a direct head, nor
 * the reverse. */
static void test_direct_manifests(void **state)
{
    (void)state;
    wsync_manifest_cache_t *c = wsync_manifest_cache_create();
    char *d1 = emit_direct(400, 1, 40, 10 * 512);
    char *d2 = emit_direct(400, 2, 40, 10 * 512);
    assert_string_equal(d1 + head_len(d1), d2 + head_len(d2));
    differential(c, d1, WSYNC_OK);
    differential(c, d2, WSYNC_OK);
    assert_int_equal(stats(c).hits, 1);
    /* the cached tail starts at "segments" (the segments repeat byte for byte): a head naming
     * its own "segments" before it takes the full parse, and its error (a duplicate key) */
    const char *s1 = strstr(d1, ",\"segments\":[");
    assert_non_null(s1);
    assert_string_equal(s1, strstr(d2, ",\"segments\":["));
    char *dup = malloc(strlen(d2) + 32);
    assert_non_null(dup);
    snprintf(dup, strlen(d2) + 32, "{\"segments\":[],%s", d2 + 1);
    differential(c, dup, WSYNC_ERR_BAD_MANIFEST);
    free(dup);
    /* fewer segments: the first tensor naming a missing one, as the full parse */
    char *few = emit_direct(400, 3, 40, 10 * 512);
    char *cut = strstr(few, "\"segments\":[");
    assert_non_null(cut);
    char *last = strstr(cut, "},{");
    assert_non_null(last);
    /* keep only the first segment of the head */
    char *end_segs = strstr(cut, "}],");
    assert_non_null(end_segs);
    memmove(last + 1, end_segs + 1, strlen(end_segs + 1) + 1);
    differential(c, few, WSYNC_ERR_BAD_MANIFEST);
    /* smaller segments: the first tensor outside its segment */
    char *small = emit_direct(400, 4, 40, 9 * 512);
    assert_string_equal(small + head_len(small), d1 + head_len(d1));
    differential(c, small, WSYNC_ERR_OUT_OF_BOUNDS);
    /* a staged head on a direct tail: the full parse's own error */
    char *staged = emit(400, "direct", 5, 1, DIGESTS_NONE, 400 * 512);
    const size_t hl = head_len(staged);
    char *mixed = malloc(hl + strlen(d1 + head_len(d1)) + 1);
    assert_non_null(mixed);
    memcpy(mixed, staged, hl);
    strcpy(mixed + hl, d1 + head_len(d1));
    differential(c, mixed, WSYNC_ERR_BAD_MANIFEST);
    wsync_manifest_cache_destroy(c);
    real_free(d1);
    real_free(d2);
    real_free(few);
    real_free(small);
    real_free(staged);
    free(mixed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emit_canonical),
        cmocka_unit_test(test_hit_equals_full),
        cmocka_unit_test(test_changed_table_misses),
        cmocka_unit_test(test_hostile_heads),
        cmocka_unit_test(test_out_of_bounds),
        cmocka_unit_test(test_digest_blob),
        cmocka_unit_test(test_other_orders),
        cmocka_unit_test(test_bounded),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_null_cache),
        cmocka_unit_test(test_huge_manifest_refused_before_parse),
        cmocka_unit_test(test_tensor_limit),
        cmocka_unit_test(test_direct_manifests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
