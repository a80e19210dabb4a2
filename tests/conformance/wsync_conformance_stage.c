/* The producer's converting stage and host sources (ABI 0.1.5), the same program for every
 * plugin (WSYNC_TEST_LIB names the .so; the CUDA one skips with exit 77 where there is no
 * device): a stage whose tensors' src_dtype differs from their dtype writes each element
 * converted once, bit for bit as plugin/common/wsync_convert.c (the reference), and publishes
 * digests of the converted bytes; sources may be plugin memory, host memory given to
 * register_host, or a read-only file mapping. Bad inputs (an integer conversion, a converting
 * tensor in direct mode, overlapping or unknown ranges) are refused naming the value, and the
 * staged bytes stay as they were. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "../unit/cpu/cpu_test_util.h"
#include "wsync_convert.h"
#include "wsync_digest.h"
#include "wsync_dtype.h"

static wsync_test_plugin_t P;
static wsync_consumer_t *C;

/* What a bucket stages: per tensor its dtypes, element count and the source bytes. */
#define NT 6
typedef struct case_tensor {
    const char *name;
    wsync_dtype_t dtype, src_dtype;
    int64_t elems;
} case_tensor_t;
static const case_tensor_t T[NT] = {
    {"model.layers.0.self_attn.q_proj.weight", WSYNC_DTYPE_BF16, WSYNC_DTYPE_F32, 33 * 70},
    {"model.layers.0.input_layernorm.weight", WSYNC_DTYPE_BF16, WSYNC_DTYPE_BF16, 128},
    {"model.layers.0.self_attn.k_proj.weight", WSYNC_DTYPE_F16, WSYNC_DTYPE_F32, 5},
    {"model.layers.0.self_attn.v_proj.weight", WSYNC_DTYPE_BF16, WSYNC_DTYPE_F64, 4099},
    {"model.norm.weight", WSYNC_DTYPE_F32, WSYNC_DTYPE_BF16, 40},
    {"lm_head.weight", WSYNC_DTYPE_BF16, WSYNC_DTYPE_F32, 70001},
};

/* Source elements: the rounding cases (ties, subnormals, overflow, infinities, NaN, signed
 * zero) first, then pseudo-random bit patterns of each width. */
static void fill_source(void *dst, wsync_dtype_t dt, int64_t n, uint64_t seed)
{
    static const float f32_special[] = {
        0.0f,   -0.0f,   1.0f,     -1.5f,    1.00390625f, 1.01171875f,  3.3895314e38f,
        1e-40f, -1e-45f, 65504.0f, 65520.0f, 1e30f,       5.9604645e-8f};
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const size_t k = (size_t)i;
        if (dt == WSYNC_DTYPE_F32) {
            float v;
            if (k < sizeof(f32_special) / sizeof(f32_special[0]))
                v = f32_special[k];
            else if (k == 20)
                v = 1.0f / 0.0f;
            else if (k == 21)
                v = -(0.0f / 0.0f);
            else {
                uint32_t b = (uint32_t)x;
                memcpy(&v, &b, 4);
            }
            memcpy((char *)dst + 4 * k, &v, 4);
        } else if (dt == WSYNC_DTYPE_F64) {
            double v = (double)(int64_t)(x >> 11) * 1e-15 * ((k & 1) ? -1 : 1);
            if (k == 3)
                v = 1.0 + 1.0 / 256.0 + 1e-12; /* just above a bf16 tie */
            memcpy((char *)dst + 8 * k, &v, 8);
        } else {
            uint16_t b = (uint16_t)x;
            memcpy((char *)dst + 2 * k, &b, 2);
        }
    }
}

typedef struct bucket {
    void *host[NT]; /* the source bytes, in host memory */
    void *src[NT];  /* what the stage reads (plugin memory or host) */
    void *want[NT]; /* the reference result */
    uint64_t nbytes[NT];
    wsync_stage_tensor_t st[NT];
} bucket_t;

static void bucket_make(bucket_t *b, uint64_t seed)
{
    memset(b, 0, sizeof(*b));
    for (int i = 0; i < NT; i++) {
        const size_t sbytes = (size_t)T[i].elems * wsync_dtype_size(T[i].src_dtype);
        b->nbytes[i] = (uint64_t)T[i].elems * wsync_dtype_size(T[i].dtype);
        b->host[i] = malloc(sbytes);
        b->want[i] = malloc((size_t)b->nbytes[i]);
        fill_source(b->host[i], T[i].src_dtype, T[i].elems, seed + (uint64_t)i);
        if (T[i].src_dtype == T[i].dtype)
            memcpy(b->want[i], b->host[i], sbytes);
        else
            wsync_convert_row(b->want[i], T[i].dtype, b->host[i], T[i].src_dtype,
                              (size_t)T[i].elems, 1.0);
        b->st[i] = (wsync_stage_tensor_t){.struct_size = sizeof(wsync_stage_tensor_t),
                                          .name = T[i].name,
                                          .dtype = T[i].dtype,
                                          .ndim = 1,
                                          .shape = {T[i].elems},
                                          .src_dtype = T[i].src_dtype};
    }
}

static void bucket_free(bucket_t *b)
{
    for (int i = 0; i < NT; i++) {
        free(b->host[i]);
        free(b->want[i]);
    }
}

/* Sources in plugin memory (device memory on CUDA). */
static void to_plugin_memory(bucket_t *b)
{
    for (int i = 0; i < NT; i++) {
        const size_t sbytes = (size_t)T[i].elems * wsync_dtype_size(T[i].src_dtype);
        assert_int_equal(P.c->mem_alloc(C, sbytes, &b->src[i], NULL), WSYNC_OK);
        assert_int_equal(P.c->mem_copy(C, b->src[i], b->host[i], sbytes, 0, NULL), WSYNC_OK);
        b->st[i].src = b->src[i];
    }
}

static void free_plugin_memory(bucket_t *b)
{
    for (int i = 0; i < NT; i++)
        assert_int_equal(P.c->mem_free(C, b->src[i], NULL), WSYNC_OK);
}

static wsync_staging_t *staging(uint32_t flags)
{
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = 4u << 20, .flags = flags, .timeout_ms = 5000};
    wsync_staging_t *s = NULL;
    assert_int_equal(P.p->create(&cfg, &s, NULL), WSYNC_OK);
    return s;
}

/* Publish, then check every staged tensor against the reference, and its digest. */
static void check_published(wsync_staging_t *s, const bucket_t *b)
{
    const char *json = NULL;
    uint64_t gen = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(P.p->publish(s, NULL, 1, &json, &gen, &err), WSYNC_OK);
    const wsync_manifest_t *m = NULL;
    assert_int_equal(P.c->parse_manifest(C, json, strlen(json), &m, &err), WSYNC_OK);
    assert_int_equal(m->n_tensors, NT);
    for (size_t k = 0; k < m->n_tensors; k++) {
        const wsync_tensor_desc_t *d = &m->tensors[k];
        int i = 0;
        while (i < NT && strcmp(T[i].name, d->name) != 0)
            i++;
        assert_true(i < NT);
        assert_int_equal(d->dtype, T[i].dtype);
        assert_int_equal(d->nbytes, b->nbytes[i]);
        unsigned char *got = malloc((size_t)d->nbytes);
        assert_int_equal(P.p->read_back(s, d->offset, got, (size_t)d->nbytes, &err), WSYNC_OK);
        if (memcmp(got, b->want[i], (size_t)d->nbytes) != 0) {
            size_t at = 0;
            while (got[at] == ((const unsigned char *)b->want[i])[at])
                at++;
            fail_msg("%s (%s -> %s): byte %zu is 0x%02x, the reference 0x%02x", T[i].name,
                     wsync_dtype_name(T[i].src_dtype), wsync_dtype_name(T[i].dtype), at, got[at],
                     ((const unsigned char *)b->want[i])[at]);
        }
        assert_true(d->has_digest);
        assert_int_equal(d->digest, wsync64(b->want[i], (size_t)d->nbytes));
        free(got);
    }
    P.c->manifest_free(C, m);
}

static void converts_from_plugin_memory(void **state)
{
    (void)state;
    bucket_t b;
    bucket_make(&b, 1);
    to_plugin_memory(&b);
    wsync_staging_t *s = staging(0);
    assert_int_equal(P.p->stage(s, NULL, b.st, NT, NULL), WSYNC_OK);
    check_published(s, &b);
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    free_plugin_memory(&b);
    bucket_free(&b);
}

/* Host sources: malloc'd memory and a read-only file mapping (a checkpoint shard), each
 * registered (CUDA: they cross on the copy engines, converted through the bounce buffers). */
static void converts_from_registered_host_memory(void **state)
{
    (void)state;
    bucket_t b;
    bucket_make(&b, 2);
    char path[] = "/tmp/wsync_stage_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    const size_t lm_bytes = (size_t)T[NT - 1].elems * 4;
    assert_int_equal(write(fd, b.host[NT - 1], lm_bytes), (ssize_t)lm_bytes);
    void *map = mmap(NULL, lm_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(map != MAP_FAILED);
    close(fd);
    wsync_staging_t *s = staging(0);
    wsync_error_t err = {.struct_size = sizeof(err)};
    for (int i = 0; i < NT; i++) {
        b.st[i].src = i == NT - 1 ? map : b.host[i];
        const size_t sbytes = (size_t)T[i].elems * wsync_dtype_size(T[i].src_dtype);
        assert_int_equal(P.p->register_host(s, b.st[i].src, sbytes, &err), WSYNC_OK);
    }
    assert_int_equal(P.p->stage(s, NULL, b.st, NT, &err), WSYNC_OK);
    check_published(s, &b);
    for (int i = 0; i < NT; i++)
        assert_int_equal(P.p->unregister_host(s, b.st[i].src, &err), WSYNC_OK);
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    munmap(map, lm_bytes);
    bucket_free(&b);
}

static void refuses_integer_conversion(void **state)
{
    (void)state;
    bucket_t b;
    bucket_make(&b, 3);
    to_plugin_memory(&b);
    wsync_staging_t *s = staging(0);
    assert_int_equal(P.p->stage(s, NULL, b.st, NT, NULL), WSYNC_OK);
    unsigned char *before = malloc(1u << 20), *after = malloc(1u << 20);
    assert_int_equal(P.p->read_back(s, 0, before, 1u << 20, NULL), WSYNC_OK);
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_stage_tensor_t bad[NT];
    memcpy(bad, b.st, sizeof(bad));
    bad[2].src_dtype = WSYNC_DTYPE_I32;
    assert_int_equal(P.p->stage(s, NULL, bad, NT, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, T[2].name));
    assert_non_null(strstr(err.message, "int32"));
    assert_non_null(strstr(err.message, "float16"));
    assert_int_equal(P.p->read_back(s, 0, after, 1u << 20, NULL), WSYNC_OK);
    assert_memory_equal(before, after, 1u << 20);
    /* the bucket staged before the refusal is still the one published */
    check_published(s, &b);
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    free(before);
    free(after);
    free_plugin_memory(&b);
    bucket_free(&b);
}

/* A caller built against 0.1.4 (struct_size ends at src): src_dtype is not read; shorter still
 * is refused naming the index. */
static void old_struct_size(void **state)
{
    (void)state;
    bucket_t b;
    bucket_make(&b, 4);
    to_plugin_memory(&b);
    wsync_staging_t *s = staging(0);
    wsync_stage_tensor_t one = b.st[1]; /* the plain bf16 tensor */
    one.struct_size = offsetof(wsync_stage_tensor_t, src_dtype);
    one.src_dtype = (wsync_dtype_t)99;
    assert_int_equal(P.p->stage(s, NULL, &one, 1, NULL), WSYNC_OK);
    unsigned char got[256];
    assert_int_equal(P.p->read_back(s, 0, got, 256, NULL), WSYNC_OK);
    assert_memory_equal(got, b.want[1], 256);
    wsync_error_t err = {.struct_size = sizeof(err)};
    one.struct_size = offsetof(wsync_stage_tensor_t, src);
    assert_int_equal(P.p->stage(s, NULL, &one, 1, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tensors[0].struct_size"));
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    free_plugin_memory(&b);
    bucket_free(&b);
}

static void register_host_refuses_bad_ranges(void **state)
{
    (void)state;
    wsync_staging_t *s = staging(0);
    wsync_error_t err;
#define FRESH (err = (wsync_error_t){.struct_size = sizeof(err)}, &err)
    char *mem = malloc(1u << 16);
    assert_int_equal(P.p->register_host(s, NULL, 64, FRESH), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "register_host"));
    assert_int_equal(P.p->register_host(s, mem, 0, FRESH), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(P.p->register_host(s, mem, 1u << 16, FRESH), WSYNC_OK);
    assert_int_equal(P.p->register_host(s, mem + 4096, 4096, FRESH), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "may not overlap"));
    assert_int_equal(P.p->unregister_host(s, mem + 4096, FRESH), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "no range registered starts there"));
    assert_int_equal(P.p->unregister_host(s, mem, FRESH), WSYNC_OK);
    assert_int_equal(P.p->unregister_host(s, mem, FRESH), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    free(mem);
#undef FRESH
}

static void direct_refuses_conversion(void **state)
{
    (void)state;
    bucket_t b;
    bucket_make(&b, 5);
    to_plugin_memory(&b);
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .flags = WSYNC_STAGING_DIRECT, .timeout_ms = 5000};
    wsync_staging_t *s = NULL;
    assert_int_equal(P.p->create(&cfg, &s, NULL), WSYNC_OK);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(P.p->stage(s, NULL, b.st, NT, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "direct mode"));
    assert_non_null(strstr(err.message, "float32"));
    assert_int_equal(P.p->retire(s, NULL), WSYNC_OK);
    free_plugin_memory(&b);
    bucket_free(&b);
}

int main(void)
{
    const char *lib = getenv("WSYNC_TEST_LIB") ? getenv("WSYNC_TEST_LIB") : WSYNC_TEST_HOST_LIB;
    if (wsync_test_load(&P, lib) != 0) {
        printf("SKIPPED: %s does not initialise here (no CUDA device?)\n", lib);
        return strcmp(lib, WSYNC_TEST_HOST_LIB) == 0 ? 1 : 77;
    }
    if (!WSYNC_HAS_OP(wsync_producer_ops_t, P.p, register_host) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, P.c, mem_alloc)) {
        printf("%s lacks register_host or mem_alloc\n", lib);
        return 1;
    }
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 5000};
    if (P.c->create(&cc, &C, NULL) != WSYNC_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(converts_from_plugin_memory),
        cmocka_unit_test(converts_from_registered_host_memory),
        cmocka_unit_test(refuses_integer_conversion),
        cmocka_unit_test(old_struct_size),
        cmocka_unit_test(register_host_refuses_bad_ranges),
        cmocka_unit_test(direct_refuses_conversion),
    };
    const int rc = cmocka_run_group_tests_name(lib, tests, NULL, NULL);
    P.c->finalize(C, NULL);
    wsync_test_unload(&P);
    return rc;
}
