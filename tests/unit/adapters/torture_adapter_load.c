/* hot load into an engine slot: padding, scaling rules, packed targets, conversions, refusals
 * that leave every slot byte untouched, unload, and a reader racing repeated upserts. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <jansson.h>

#include "adapter_fixture.h"
#include "wsync_error.h"
#include "wsync_adapter_load.h"
#include "wsync_dtype.h"
#include "wsync_safetensors.h"

#define L0 "model.layers.0.self_attn."
#define M0 "model.layers.0.mlp."

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    fx_tempdir(g_dir, sizeof(g_dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fx_rmtree(g_dir);
    return 0;
}

static wsync_result_t load_dir(fx_slot_t *s, const char *dir, wsync_error_t *err)
{
    wsync_adapter_source_t src = {
        .struct_size = sizeof(src), .kind = WSYNC_ADAPTER_FROM_DIR, .path = dir};
    return wsync_adapter_hot_load(&src, &s->slot, NULL, NULL, NULL, err);
}

static void load_dir_ok(fx_slot_t *s, const char *dir)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (load_dir(s, dir, &err) != WSYNC_OK)
        fail_msg("load refused: %s", err.message);
}

/* A fresh adapter directory under g_dir. */
static const char *make_dir(const char *name, const char *config, const fx_module_t *m, size_t n)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    fx_rmtree(path);
    assert_int_equal(mkdir(path, 0700), 0);
    fx_write_text(path, "adapter_config.json", config);
    if (n > 0)
        fx_write_adapter(path, m, n);
    return path;
}

/* Place module m's A rows at rank column c0 and its B at rows [row0, row0 + out), scaled. */
typedef struct want {
    double *a, *b;
    int64_t in, out;
    uint32_t R;
} want_t;

static void want_init(want_t *e, int64_t in, int64_t out, uint32_t R)
{
    e->in = in;
    e->out = out;
    e->R = R;
    e->a = calloc((size_t)(R * in), sizeof(double));
    e->b = calloc((size_t)(out * R), sizeof(double));
}

static void want_place(want_t *e, const fx_module_t *m, int64_t c0, int64_t row0, double k)
{
    for (int64_t r = 0; r < m->r; r++)
        for (int64_t i = 0; i < m->in; i++)
            e->a[(c0 + r) * e->in + i] = fx_value(m->seed, (uint64_t)(r * m->in + i));
    for (int64_t o = 0; o < m->out; o++)
        for (int64_t r = 0; r < m->r; r++)
            e->b[(row0 + o) * e->R + c0 + r] = k * fx_value(m->seed + 1, (uint64_t)(o * m->r + r));
}

/* Every element of copy c of target t equals the expectation; frees e. */
static void want_check(const fx_slot_t *s, size_t t, int c, want_t *e)
{
    const wsync_adapter_target_t *g = &s->targets[t];
    for (int64_t i = 0; i < e->R * e->in; i++)
        if (fx_load(g->lora_a[c], g->dtype, (uint64_t)i) != e->a[i])
            fail_msg("%s A[%lld][%lld] = %g, want %g", g->module, (long long)(i / e->in),
                     (long long)(i % e->in), fx_load(g->lora_a[c], g->dtype, (uint64_t)i), e->a[i]);
    for (int64_t i = 0; i < e->out * e->R; i++)
        if (fx_load(g->lora_b[c], g->dtype, (uint64_t)i) != e->b[i])
            fail_msg("%s B[%lld][%lld] = %g, want %g", g->module, (long long)(i / e->R),
                     (long long)(i % e->R), fx_load(g->lora_b[c], g->dtype, (uint64_t)i), e->b[i]);
    free(e->a);
    free(e->b);
}

static int all_bytes(const void *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)p)[i] != v)
            return 0;
    return 1;
}

/* r=8 into max_rank 16, f32 and bf16 tensors, a target the adapter does not train. */
static void test_padding(void **state)
{
    (void)state;
    fx_module_t m[] = {{L0 "q_proj", 8, 32, 32, WSYNC_DTYPE_F32, 100},
                       {L0 "v_proj", 8, 32, 16, WSYNC_DTYPE_BF16, 200}};
    const char *dir = make_dir("pad",
                               "{\"r\":8,\"lora_alpha\":16,\"target_modules\":"
                               "[\"q_proj\",\"v_proj\"],\"bias\":\"none\"}",
                               m, 2);
    fx_target_spec_t t[] = {{L0 "q_proj", 32, 32, WSYNC_DTYPE_F32, 0, {{0}}},
                            {L0 "v_proj", 32, 16, WSYNC_DTYPE_BF16, 0, {{0}}},
                            {L0 "o_proj", 32, 32, WSYNC_DTYPE_F16, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "pad", 16, t, 3);
    load_dir_ok(&s, dir);
    assert_int_equal(s.active, 1);
    want_t e;
    want_init(&e, 32, 32, 16);
    want_place(&e, &m[0], 0, 0, 1.0);
    want_check(&s, 0, 1, &e); /* rows 8..15 of A and columns 8..15 of B are zero */
    want_init(&e, 32, 16, 16);
    want_place(&e, &m[1], 0, 0, 1.0);
    want_check(&s, 1, 1, &e);
    want_init(&e, 32, 32, 16);
    want_check(&s, 2, 1, &e); /* untrained target: all zero */
    assert_int_equal(s.targets[0].rank[1], 8);
    assert_true(s.targets[0].scaling[1] == 2.0f);
    assert_int_equal(s.targets[2].rank[1], 0);
    assert_true(s.targets[2].scaling[1] == 0.0f);
    /* the active copy at load time (0) was not touched */
    for (int i = 0; i < 3; i++) {
        assert_true(all_bytes(s.targets[i].lora_a[0], s.a_bytes[i], 0xA5));
        assert_true(all_bytes(s.targets[i].lora_b[0], s.b_bytes[i], 0xA5));
        assert_int_equal(s.targets[i].rank[0], 777);
    }
    /* a second load goes to copy 0 */
    load_dir_ok(&s, dir);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.targets[0].rank[0], 8);
    want_init(&e, 32, 32, 16);
    want_place(&e, &m[0], 0, 0, 1.0);
    want_check(&s, 0, 0, &e);
    fx_slot_free(&s);
}

static void test_rslora(void **state)
{
    (void)state;
    fx_module_t m[] = {{L0 "q_proj", 8, 16, 16, WSYNC_DTYPE_F32, 1}};
    const char *dir = make_dir("rs",
                               "{\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\"],"
                               "\"use_rslora\":true}",
                               m, 1);
    fx_target_spec_t t[] = {{L0 "q_proj", 16, 16, WSYNC_DTYPE_F32, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "rs", 8, t, 1);
    load_dir_ok(&s, dir);
    assert_true(s.targets[0].scaling[1] == (float)(16.0 / sqrt(8.0)));
    assert_int_equal(s.targets[0].rank[1], 8);
    fx_slot_free(&s);
}

static void test_patterns(void **state)
{
    (void)state;
    fx_module_t m[] = {{L0 "q_proj", 8, 16, 16, WSYNC_DTYPE_F32, 1},
                       {L0 "v_proj", 4, 16, 16, WSYNC_DTYPE_F32, 3},
                       {"model.layers.1.self_attn.q_proj", 2, 16, 16, WSYNC_DTYPE_F32, 5}};
    const char *dir =
        make_dir("pat",
                 "{\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\",\"v_proj\"],"
                 "\"rank_pattern\":{\"v_proj\":4,\"model.layers.1.self_attn.q_proj\":2},"
                 "\"alpha_pattern\":{\"layers.0.self_attn.q_proj\":32}}",
                 m, 3);
    fx_target_spec_t t[] = {{L0 "q_proj", 16, 16, WSYNC_DTYPE_F32, 0, {{0}}},
                            {L0 "v_proj", 16, 16, WSYNC_DTYPE_F32, 0, {{0}}},
                            {"model.layers.1.self_attn.q_proj", 16, 16, WSYNC_DTYPE_F32, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "pat", 8, t, 3);
    load_dir_ok(&s, dir);
    assert_int_equal(s.targets[0].rank[1], 8);
    assert_true(s.targets[0].scaling[1] == 4.0f); /* 32 / 8 */
    assert_int_equal(s.targets[1].rank[1], 4);
    assert_true(s.targets[1].scaling[1] == 4.0f); /* 16 / 4 */
    assert_int_equal(s.targets[2].rank[1], 2);
    assert_true(s.targets[2].scaling[1] == 8.0f); /* 16 / 2 */
    want_t e;
    want_init(&e, 16, 16, 8);
    want_place(&e, &m[1], 0, 0, 1.0);
    want_check(&s, 1, 1, &e);
    fx_slot_free(&s);
}

/* y = B·A·x computed from the slot equals the concatenation of every part's B_k·A_k·x. */
static void check_packed_math(const fx_slot_t *s, size_t t, const fx_module_t *parts[],
                              const int64_t *rows0, size_t np, const double *kscale)
{
    const wsync_adapter_target_t *g = &s->targets[t];
    uint32_t R = s->slot.max_rank;
    double x[64], ax[64], y[128], want[128] = {0};
    for (int64_t i = 0; i < g->in_features; i++)
        x[i] = fx_value(999, (uint64_t)i);
    for (uint32_t r = 0; r < R; r++) {
        ax[r] = 0;
        for (int64_t i = 0; i < g->in_features; i++)
            ax[r] +=
                fx_load(g->lora_a[1], g->dtype, r * (uint64_t)g->in_features + (uint64_t)i) * x[i];
    }
    for (int64_t o = 0; o < g->out_features; o++) {
        y[o] = 0;
        for (uint32_t r = 0; r < R; r++)
            y[o] += fx_load(g->lora_b[1], g->dtype, (uint64_t)o * R + r) * ax[r];
    }
    for (size_t k = 0; k < np; k++) {
        const fx_module_t *m = parts[k];
        for (int64_t o = 0; o < m->out; o++)
            for (int64_t r = 0; r < m->r; r++) {
                double a = 0;
                for (int64_t i = 0; i < m->in; i++)
                    a += fx_value(m->seed, (uint64_t)(r * m->in + i)) * x[i];
                want[rows0[k] + o] +=
                    kscale[k] * fx_value(m->seed + 1, (uint64_t)(o * m->r + r)) * a;
            }
    }
    for (int64_t o = 0; o < g->out_features; o++)
        if (fabs(y[o] - want[o]) > 1e-9)
            fail_msg("%s y[%lld] = %g, want %g", g->module, (long long)o, y[o], want[o]);
}

static void test_packed(void **state)
{
    (void)state;
    fx_module_t m[] = {{L0 "q_proj", 4, 16, 32, WSYNC_DTYPE_F32, 10},
                       {L0 "k_proj", 4, 16, 8, WSYNC_DTYPE_BF16, 20},
                       {L0 "v_proj", 4, 16, 8, WSYNC_DTYPE_F32, 30},
                       {M0 "gate_proj", 4, 16, 32, WSYNC_DTYPE_F32, 40}};
    const char *dir = make_dir("packed",
                               "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\","
                               "\"k_proj\",\"v_proj\",\"gate_proj\",\"up_proj\"]}",
                               m, 4);
    fx_target_spec_t t[] = {
        {L0 "qkv_proj",
         16,
         48,
         WSYNC_DTYPE_F32,
         3,
         {{"q_proj", 0, 32}, {L0 "k_proj", 32, 8}, {"v_proj", 40, 8}}},
        {M0 "gate_up_proj",
         16,
         64,
         WSYNC_DTYPE_BF16,
         2,
         {{"gate_proj", 0, 32}, {"up_proj", 32, 32}}},
    };
    fx_slot_t s;
    fx_slot_init(&s, "packed", 16, t, 2);
    load_dir_ok(&s, dir);
    assert_int_equal(s.targets[0].rank[1], 12);
    assert_true(s.targets[0].scaling[1] == 2.0f);
    assert_int_equal(s.targets[1].rank[1], 4);
    want_t e;
    want_init(&e, 16, 48, 16);
    want_place(&e, &m[0], 0, 0, 1.0);
    want_place(&e, &m[1], 4, 32, 1.0);
    want_place(&e, &m[2], 8, 40, 1.0);
    want_check(&s, 0, 1, &e);
    want_init(&e, 16, 64, 16);
    want_place(&e, &m[3], 0, 0, 1.0); /* up_proj absent: rows 32..63 zero */
    want_check(&s, 1, 1, &e);
    const fx_module_t *parts[] = {&m[0], &m[1], &m[2]};
    int64_t rows0[] = {0, 32, 40};
    double ks[] = {1, 1, 1};
    check_packed_math(&s, 0, parts, rows0, 3, ks);
    fx_slot_free(&s);
}

/* Parts with different scaling: the target scaling is 1 and each B carries its own. */
static void test_packed_mixed_scaling(void **state)
{
    (void)state;
    fx_module_t m[] = {{L0 "q_proj", 4, 16, 32, WSYNC_DTYPE_F32, 10},
                       {L0 "k_proj", 2, 16, 8, WSYNC_DTYPE_F32, 20},
                       {L0 "v_proj", 4, 16, 8, WSYNC_DTYPE_F32, 30}};
    const char *dir = make_dir("mixed",
                               "{\"r\":4,\"lora_alpha\":16,\"target_modules\":[\"q_proj\","
                               "\"k_proj\",\"v_proj\"],\"rank_pattern\":{\"k_proj\":2},"
                               "\"alpha_pattern\":{\"k_proj\":4}}",
                               m, 3);
    fx_target_spec_t t[] = {{L0 "qkv_proj",
                             16,
                             48,
                             WSYNC_DTYPE_F32,
                             3,
                             {{"q_proj", 0, 32}, {"k_proj", 32, 8}, {"v_proj", 40, 8}}}};
    fx_slot_t s;
    fx_slot_init(&s, "mixed", 10, t, 1);
    load_dir_ok(&s, dir);
    assert_int_equal(s.targets[0].rank[1], 10);
    assert_true(s.targets[0].scaling[1] == 1.0f);
    want_t e;
    want_init(&e, 16, 48, 10);
    want_place(&e, &m[0], 0, 0, 4.0);  /* 16 / 4 */
    want_place(&e, &m[1], 4, 32, 2.0); /* 4 / 2 */
    want_place(&e, &m[2], 6, 40, 4.0);
    want_check(&s, 0, 1, &e);
    fx_slot_free(&s);
}

/* Independent reference: nearest bf16 by distance, ties to the even encoding. */
static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    uint32_t ul = (uint32_t)lo << 16, uh = (uint32_t)hi << 16;
    float fl, fh;
    memcpy(&fl, &ul, 4);
    memcpy(&fh, &uh, 4);
    double dl = fabs((double)f - fl), dh = isinf(fh) ? INFINITY : fabs((double)fh - f);
    if (isinf(fh) && (u & 0xffff) >= 0x8000 && (lo & 1))
        return hi; /* tie/above at the top rounds to inf */
    return (dl < dh || (dl == dh && (lo & 1) == 0)) ? lo : hi;
}

static void test_f32_to_bf16_exact(void **state)
{
    (void)state;
    enum { R = 8, IN = 64, OUT = 48 };
    static float a[R * IN], b[OUT * R];
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < R * IN + OUT * R; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t u = (uint32_t)x;
        u = (u & 0x80ffffffu) | (((u >> 24) % 20 + 110) << 23); /* normal range, any mantissa */
        if (i % 7 == 0)
            u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        float f;
        memcpy(&f, &u, 4);
        if (i < R * IN)
            a[i] = f;
        else
            b[i - R * IN] = f;
    }
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/conv", g_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    fx_write_text(dir, "adapter_config.json",
                  "{\"r\":8,\"lora_alpha\":8,\"target_modules\":[\"o_proj\"]}");
    wsync_st_write_tensor_t t[2] = {{.name = "base_model.model." L0 "o_proj.lora_A.weight",
                                     .dtype = WSYNC_DTYPE_F32,
                                     .ndim = 2,
                                     .shape = {R, IN},
                                     .data = a},
                                    {.name = "base_model.model." L0 "o_proj.lora_B.weight",
                                     .dtype = WSYNC_DTYPE_F32,
                                     .ndim = 2,
                                     .shape = {OUT, R},
                                     .data = b}};
    char path[600];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_safetensors_write(path, t, 2, NULL, &err), WSYNC_OK);
    fx_target_spec_t spec[] = {{L0 "o_proj", IN, OUT, WSYNC_DTYPE_BF16, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "conv", 16, spec, 1);
    load_dir_ok(&s, dir);
    const uint16_t *A = s.targets[0].lora_a[1], *B = s.targets[0].lora_b[1];
    for (size_t i = 0; i < R * IN; i++)
        if (A[i] != ref_bf16(a[i]))
            fail_msg("A[%zu] %a -> 0x%04x, want 0x%04x", i, (double)a[i], A[i], ref_bf16(a[i]));
    for (size_t i = R * IN; i < 16 * IN; i++)
        assert_int_equal(A[i], 0);
    for (size_t o = 0; o < OUT; o++)
        for (size_t r = 0; r < 16; r++) {
            uint16_t want = r < R ? ref_bf16(b[o * R + r]) : 0;
            if (B[o * 16 + r] != want)
                fail_msg("B[%zu][%zu] = 0x%04x, want 0x%04x", o, r, B[o * 16 + r], want);
        }
    fx_slot_free(&s);
}

/* ---------------------------------------------------------------- refusals */

typedef struct refusal {
    const char *label;
    const char *config;     /* NULL: the good one */
    const char *raw_header; /* non-NULL: write this header instead of real tensors */
    uint64_t hlen_override;
    size_t raw_data;
    fx_module_t mods[2];
    size_t n_mods;
    wsync_result_t code;
    const char *needle;
} refusal_t;

#define GOODCFG "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\"]}"
#define QMOD                                                                                       \
    {                                                                                              \
        L0 "q_proj", 4, 16, 16, WSYNC_DTYPE_F32, 7                                                 \
    }
#define QA_NAME "base_model.model." L0 "q_proj.lora_A.weight"

static const refusal_t refusals[] = {
    {"header past EOF",
     NULL,
     "{}",
     1u << 20,
     0,
     {{0}},
     0,
     WSYNC_ERR_OUT_OF_BOUNDS,
     "runs past the end"},
    {"non-JSON header", NULL, "{\"a\":", 0, 0, {{0}}, 0, WSYNC_ERR_BAD_ADAPTER, "not valid JSON"},
    {"overlap",
     NULL,
     "{\"" QA_NAME "\":{\"dtype\":\"F32\",\"shape\":[4,16],\"data_offsets\":[0,256]},"
     "\"x\":{\"dtype\":\"F32\",\"shape\":[4,16],\"data_offsets\":[128,384]}}",
     0,
     384,
     {{0}},
     0,
     WSYNC_ERR_OUT_OF_BOUNDS,
     "overlap"},
    {"offsets out of range",
     NULL,
     "{\"" QA_NAME "\":{\"dtype\":\"F32\",\"shape\":[4,16],\"data_offsets\":[0,256]}}",
     0,
     100,
     {{0}},
     0,
     WSYNC_ERR_OUT_OF_BOUNDS,
     "outside the 100 data bytes"},
    {"size mismatch",
     NULL,
     "{\"" QA_NAME "\":{\"dtype\":\"BF16\",\"shape\":[4,16],\"data_offsets\":[0,256]}}",
     0,
     256,
     {{0}},
     0,
     WSYNC_ERR_BAD_ADAPTER,
     "needs 128"},
    {"duplicate names",
     NULL,
     "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     0,
     8,
     {{0}},
     0,
     WSYNC_ERR_BAD_ADAPTER,
     "duplicate"},
    {"config not JSON",
     "{\"r\":",
     NULL,
     0,
     0,
     {QMOD},
     1,
     WSYNC_ERR_BAD_ADAPTER,
     "adapter_config.json is not valid JSON"},
    {"config r=0",
     "{\"r\":0,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}",
     NULL,
     0,
     0,
     {QMOD},
     1,
     WSYNC_ERR_BAD_ADAPTER,
     "\"r\" must be an integer > 0"},
    {"config dora",
     "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"use_dora\":true}",
     NULL,
     0,
     0,
     {QMOD},
     1,
     WSYNC_ERR_NOT_SUPPORTED,
     "use_dora"},
    {"config modules_to_save",
     "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"modules_to_save\":[\"lm_head\"]}",
     NULL,
     0,
     0,
     {QMOD},
     1,
     WSYNC_ERR_NOT_SUPPORTED,
     "modules_to_save [\"lm_head\"] is not supported: "},
    {"config bias",
     "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"bias\":\"all\"}",
     NULL,
     0,
     0,
     {QMOD},
     1,
     WSYNC_ERR_NOT_SUPPORTED,
     "bias \"all\""},
    {"rank differs from config",
     "{\"r\":8,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}",
     NULL,
     0,
     0,
     {QMOD},
     1,
     WSYNC_ERR_BAD_ADAPTER,
     "rank 8"},
    {"unknown module",
     NULL,
     NULL,
     0,
     0,
     {QMOD, {L0 "k_proj", 4, 16, 16, WSYNC_DTYPE_F32, 9}},
     2,
     WSYNC_ERR_NOT_FOUND,
     "\"" L0 "k_proj\" has no target"},
    {"rank over max_rank",
     "{\"r\":32,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}",
     NULL,
     0,
     0,
     {{L0 "q_proj", 32, 16, 16, WSYNC_DTYPE_F32, 7}},
     1,
     WSYNC_ERR_LAYOUT_MISMATCH,
     "rank 32 exceeds the slot's max_rank 16"},
    {"A in_features",
     NULL,
     NULL,
     0,
     0,
     {{L0 "q_proj", 4, 24, 16, WSYNC_DTYPE_F32, 7}},
     1,
     WSYNC_ERR_LAYOUT_MISMATCH,
     "lora_A [4, 24]"},
    {"B out_features",
     NULL,
     NULL,
     0,
     0,
     {{L0 "q_proj", 4, 16, 20, WSYNC_DTYPE_F32, 7}},
     1,
     WSYNC_ERR_LAYOUT_MISMATCH,
     "lora_B [20, 4]"},
};

/* Load a directory for every refusal into a slot that already serves an adapter; the slot's
 * bytes, ranks, scalings and *active must be exactly as before. */
static void test_refusals_leave_slot_untouched(void **state)
{
    (void)state;
    fx_module_t good[] = {QMOD};
    fx_target_spec_t t[] = {{L0 "q_proj", 16, 16, WSYNC_DTYPE_BF16, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "refuse", 16, t, 1);
    load_dir_ok(&s, make_dir("good", GOODCFG, good, 1));
    assert_int_equal(s.active, 1);
    fx_snapshot_t snap;
    fx_snapshot_take(&s, &snap);
    static uint8_t zeros[1024];
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        const refusal_t *r = &refusals[i];
        char name[32];
        snprintf(name, sizeof(name), "bad%zu", i);
        const char *dir = make_dir(name, r->config ? r->config : GOODCFG, r->mods, r->n_mods);
        if (r->raw_header) {
            char path[700];
            snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
            fx_write_raw_safetensors(path, r->raw_header, r->hlen_override, zeros, r->raw_data);
        }
        wsync_error_t err = {.struct_size = sizeof(err)};
        wsync_result_t rc = load_dir(&s, dir, &err);
        if (rc != r->code || !strstr(err.message, r->needle))
            fail_msg("%s: rc %d (want %d), message \"%s\"", r->label, rc, r->code, err.message);
        if (!fx_snapshot_equal(&s, &snap))
            fail_msg("%s: the slot changed although the load was refused", r->label);
    }
    /* .bin only */
    const char *bin = make_dir("binonly", GOODCFG, NULL, 0);
    fx_write_text(bin, "adapter_model.bin", "pickle");
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(load_dir(&s, bin, &err), WSYNC_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(err.message, "adapter_model.bin (pickle) is not supported; save with "
                                        "safe_serialization=True"));
    assert_true(fx_snapshot_equal(&s, &snap));
    fx_snapshot_free(&snap);
    fx_slot_free(&s);
}

/* Integer tensors and slot defects are refused before any write. */
static void test_plan_refusals(void **state)
{
    (void)state;
    fx_module_t good[] = {QMOD};
    const char *dir = make_dir("planref", GOODCFG, good, 1);
    fx_target_spec_t t[] = {
        {L0 "q_proj", 16, 16, WSYNC_DTYPE_F32, 0, {{0}}},
        {L0 "qkv_proj", 16, 48, WSYNC_DTYPE_F32, 2, {{"k_proj", 0, 32}, {"v_proj", 16, 32}}}};
    fx_slot_t s;
    fx_slot_init(&s, "plan", 16, t, 2);
    fx_snapshot_t snap;
    fx_snapshot_take(&s, &snap);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(load_dir(&s, dir, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "parts \"k_proj\" and \"v_proj\" overlap"));
    assert_true(fx_snapshot_equal(&s, &snap));
    fx_snapshot_free(&snap);
    fx_slot_free(&s);

    /* the two copies share memory */
    fx_slot_init(&s, "plan", 16, t, 1);
    void *keep = s.targets[0].lora_b[1];
    s.targets[0].lora_b[1] = s.targets[0].lora_a[0]; /* same size as B here */
    fx_snapshot_take(&s, &snap);
    wsync_error_clear(&err);
    assert_int_equal(load_dir(&s, dir, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "slot buffers overlap"));
    assert_true(fx_snapshot_equal(&s, &snap));
    fx_snapshot_free(&snap);
    s.targets[0].lora_b[1] = keep;

    /* int32 tensors cannot be converted */
    int32_t ia[4 * 16] = {0}, ib[16 * 4] = {0};
    wsync_st_write_tensor_t w[2] = {
        {.name = QA_NAME, .dtype = WSYNC_DTYPE_I32, .ndim = 2, .shape = {4, 16}, .data = ia},
        {.name = "base_model.model." L0 "q_proj.lora_B.weight",
         .dtype = WSYNC_DTYPE_I32,
         .ndim = 2,
         .shape = {16, 4},
         .data = ib}};
    char path[700];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    assert_int_equal(wsync_safetensors_write(path, w, 2, NULL, &err), WSYNC_OK);
    fx_snapshot_take(&s, &snap);
    wsync_error_clear(&err);
    assert_int_equal(load_dir(&s, dir, &err), WSYNC_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(err.message, "lora_A int32"));
    assert_true(fx_snapshot_equal(&s, &snap));
    /* an f8 slot cannot hold LoRA weights */
    s.targets[0].dtype = WSYNC_DTYPE_F8_E4M3;
    wsync_error_clear(&err);
    assert_int_equal(load_dir(&s, make_dir("planref2", GOODCFG, good, 1), &err),
                     WSYNC_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(err.message, "dtype float8_e4m3fn cannot hold"));
    assert_true(fx_snapshot_equal(&s, &snap));
    s.targets[0].dtype = WSYNC_DTYPE_F32;
    /* *active must be 0 or 1 */
    s.active = 2;
    wsync_error_clear(&err);
    assert_int_equal(load_dir(&s, dir, &err), WSYNC_ERR_INVALID_ARGUMENT);
    s.active = 0;
    fx_snapshot_free(&snap);
    fx_slot_free(&s);
}

/* ------------------------------------------------------- executor, manifest */

typedef struct exec_probe {
    int calls;
    int fail;
    wsync_adapter_memory_t seen;
} exec_probe_t;

static wsync_result_t probe_exec(const wsync_adapter_plan_t *plan, void *user, wsync_error_t *err)
{
    exec_probe_t *p = user;
    p->calls++;
    p->seen = plan->src_memory;
    wsync_result_t rc = wsync_adapter_plan_exec_host(plan, err);
    if (rc == WSYNC_OK && p->fail)
        return wsync_fail(err, WSYNC_ERR_SYSTEM, "probe_exec", "device copy failed (test)");
    return rc;
}

static void test_from_manifest(void **state)
{
    (void)state;
    enum { R = 4, IN = 16, OUT = 16 };
    static uint8_t buffer[4096];
    wsync_tensor_desc_t d[2] = {{.struct_size = sizeof(d[0]),
                                 .name = QA_NAME,
                                 .dtype = WSYNC_DTYPE_F32,
                                 .ndim = 2,
                                 .shape = {R, IN},
                                 .offset = 256,
                                 .nbytes = R * IN * 4},
                                {.struct_size = sizeof(d[0]),
                                 .name = "base_model.model." L0 "q_proj.lora_B.weight",
                                 .dtype = WSYNC_DTYPE_BF16,
                                 .ndim = 2,
                                 .shape = {OUT, R},
                                 .offset = 1024,
                                 .nbytes = OUT * R * 2}};
    for (int i = 0; i < R * IN; i++)
        fx_store(buffer + 256, WSYNC_DTYPE_F32, (uint64_t)i, fx_value(7, (uint64_t)i));
    for (int i = 0; i < OUT * R; i++)
        fx_store(buffer + 1024, WSYNC_DTYPE_BF16, (uint64_t)i, fx_value(8, (uint64_t)i));
    wsync_manifest_t m = {.struct_size = sizeof(m),
                          .schema = 1,
                          .generation = 1,
                          .buffer = {.struct_size = sizeof(m.buffer),
                                     .kind = WSYNC_BUFFER_HOST_SHM,
                                     .bytes = sizeof(buffer)},
                          .n_tensors = 2,
                          .tensors = d};
    wsync_adapter_source_t src = {.struct_size = sizeof(src),
                                  .kind = WSYNC_ADAPTER_FROM_MANIFEST,
                                  .manifest = &m,
                                  .adapter_config_json = GOODCFG};
    fx_target_spec_t t[] = {{L0 "q_proj", IN, OUT, WSYNC_DTYPE_F32, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "ipc", 8, t, 1);
    exec_probe_t probe = {0};
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_adapter_hot_load(&src, &s.slot, buffer, probe_exec, &probe, &err) != WSYNC_OK)
        fail_msg("%s", err.message);
    assert_int_equal(probe.calls, 1);
    assert_int_equal(probe.seen, WSYNC_ADAPTER_MEM_BUFFER);
    assert_int_equal(s.active, 1);
    fx_module_t mod = QMOD;
    want_t e;
    want_init(&e, IN, OUT, 8);
    want_place(&e, &mod, 0, 0, 1.0);
    want_check(&s, 0, 1, &e);

    fx_snapshot_t snap;
    fx_snapshot_take(&s, &snap);
    /* a tensor past the buffer: refused before exec */
    d[1].offset = sizeof(buffer) - 64;
    probe.calls = 0;
    wsync_error_clear(&err);
    assert_int_equal(wsync_adapter_hot_load(&src, &s.slot, buffer, probe_exec, &probe, &err),
                     WSYNC_ERR_OUT_OF_BOUNDS);
    assert_int_equal(probe.calls, 0);
    assert_true(fx_snapshot_equal(&s, &snap));
    d[1].offset = 1024;
    /* no mapped base */
    wsync_error_clear(&err);
    assert_int_equal(wsync_adapter_hot_load(&src, &s.slot, NULL, probe_exec, &probe, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_true(fx_snapshot_equal(&s, &snap));
    /* the executor fails: *active and the active copy stay as they were */
    probe.fail = 1;
    wsync_error_clear(&err);
    assert_int_equal(wsync_adapter_hot_load(&src, &s.slot, buffer, probe_exec, &probe, &err),
                     WSYNC_ERR_SYSTEM);
    assert_int_equal(s.active, 1);
    assert_int_equal(s.targets[0].rank[0], 777);
    want_init(&e, IN, OUT, 8);
    want_place(&e, &mod, 0, 0, 1.0);
    want_check(&s, 0, 1, &e);
    fx_snapshot_free(&snap);
    fx_slot_free(&s);
}

static int g_drains;
static wsync_result_t count_drain(void *user, wsync_error_t *err)
{
    (void)user;
    (void)err;
    g_drains++;
    return WSYNC_OK;
}

static void test_unload(void **state)
{
    (void)state;
    fx_module_t good[] = {QMOD};
    fx_target_spec_t t[] = {{L0 "q_proj", 16, 16, WSYNC_DTYPE_F32, 0, {{0}}}};
    fx_slot_t s;
    fx_slot_init(&s, "unload", 8, t, 1);
    load_dir_ok(&s, make_dir("unl", GOODCFG, good, 1));
    assert_int_equal(s.targets[0].rank[1], 4);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_adapter_unload(&s.slot, NULL, NULL, count_drain, NULL, &err), WSYNC_OK);
    assert_int_equal(g_drains, 1);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.targets[0].rank[0], 0);
    assert_int_equal(s.targets[0].rank[1], 0);
    assert_true(s.targets[0].scaling[0] == 0.0f && s.targets[0].scaling[1] == 0.0f);
    assert_true(all_bytes(s.targets[0].lora_a[0], s.a_bytes[0], 0));
    assert_true(all_bytes(s.targets[0].lora_b[0], s.b_bytes[0], 0));
    fx_slot_free(&s);
}

/* ------------------------------------------------------------ concurrency */

enum { C_IN = 64, C_OUT = 48, C_R = 8, C_VERSIONS = 300 };

typedef struct race {
    fx_slot_t s;
    int in_use[2];
    int stop;
    long checks;
    long retries;
    char failure[256];
} race_t;

static uint32_t version_rank(int v)
{
    return 1 + (uint32_t)(v % C_R);
}

/* 0 when copy c is entirely version v's (v read from A[0][0]); else a description. */
static int check_copy(const fx_slot_t *s, int c, char *why, size_t len)
{
    const wsync_adapter_target_t *g = &s->targets[0];
    const float *A = g->lora_a[c], *B = g->lora_b[c];
    int v = (int)A[0];
    uint32_t r = version_rank(v);
    if (v < 1 || g->rank[c] != r || g->scaling[c] != (float)v / (float)r) {
        snprintf(why, len, "copy %d: A[0] says version %d, rank %u scaling %g", c, v, g->rank[c],
                 (double)g->scaling[c]);
        return 1;
    }
    for (uint32_t i = 0; i < C_R * C_IN; i++)
        if (A[i] != (i < r * C_IN ? (float)v : 0.0f)) {
            snprintf(why, len, "copy %d: version %d but A[%u] = %g", c, v, i, (double)A[i]);
            return 1;
        }
    for (uint32_t o = 0; o < C_OUT; o++)
        for (uint32_t k = 0; k < C_R; k++)
            if (B[o * C_R + k] != (k < r ? (float)-v : 0.0f)) {
                snprintf(why, len, "copy %d: version %d but B[%u][%u] = %g", c, v, o, k,
                         (double)B[o * C_R + k]);
                return 1;
            }
    return 0;
}

static void *reader(void *arg)
{
    race_t *rc = arg;
    while (!__atomic_load_n(&rc->stop, __ATOMIC_ACQUIRE)) {
        int c = __atomic_load_n(rc->s.slot.active, __ATOMIC_ACQUIRE);
        __atomic_fetch_add(&rc->in_use[c], 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(rc->s.slot.active, __ATOMIC_SEQ_CST) != c) {
            __atomic_fetch_sub(&rc->in_use[c], 1, __ATOMIC_SEQ_CST);
            __atomic_fetch_add(&rc->retries, 1, __ATOMIC_RELAXED);
            continue;
        }
        char why[256];
        if (check_copy(&rc->s, c, why, sizeof(why)) && rc->failure[0] == '\0')
            snprintf(rc->failure, sizeof(rc->failure), "%s", why);
        __atomic_fetch_sub(&rc->in_use[c], 1, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&rc->checks, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* The engine's side of "requests drain": the shadow is written only once no reader is in it. */
static wsync_result_t drain_then_exec(const wsync_adapter_plan_t *plan, void *user,
                                      wsync_error_t *err)
{
    race_t *rc = user;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    while (__atomic_load_n(&rc->in_use[plan->shadow], __ATOMIC_SEQ_CST) != 0)
        sched_yield();
    return wsync_adapter_plan_exec_host(plan, err);
}

static wsync_result_t upsert(race_t *rc, int v, float *a, float *b)
{
    uint32_t r = version_rank(v);
    for (uint32_t i = 0; i < r * C_IN; i++)
        a[i] = (float)v;
    for (uint32_t i = 0; i < C_OUT * r; i++)
        b[i] = (float)-v;
    char cfg[160];
    snprintf(cfg, sizeof(cfg), "{\"r\":%u,\"lora_alpha\":%d,\"target_modules\":[\"q_proj\"]}", r,
             v);
    wsync_adapter_tensor_t t[2] = {{.name = QA_NAME,
                                    .dtype = WSYNC_DTYPE_F32,
                                    .ndim = 2,
                                    .shape = {r, C_IN},
                                    .data = a,
                                    .nbytes = r * C_IN * 4},
                                   {.name = "base_model.model." L0 "q_proj.lora_B.weight",
                                    .dtype = WSYNC_DTYPE_F32,
                                    .ndim = 2,
                                    .shape = {C_OUT, r},
                                    .data = b,
                                    .nbytes = C_OUT * r * 4}};
    wsync_tensor_desc_t d[2];
    for (int k = 0; k < 2; k++) {
        d[k] = (wsync_tensor_desc_t){.struct_size = sizeof(d[k]),
                                     .name = t[k].name,
                                     .dtype = t[k].dtype,
                                     .ndim = 2,
                                     .nbytes = t[k].nbytes};
        memcpy(d[k].shape, t[k].shape, sizeof(d[k].shape));
    }
    d[0].offset = 0;
    d[1].offset = (uint64_t)((uint8_t *)b - (uint8_t *)a);
    wsync_manifest_t m = {.struct_size = sizeof(m),
                          .schema = 1,
                          .generation = (uint64_t)v,
                          .buffer = {.struct_size = sizeof(m.buffer),
                                     .kind = WSYNC_BUFFER_HOST_SHM,
                                     .bytes = (uint64_t)(C_R * C_IN + C_OUT * C_R) * 4},
                          .n_tensors = 2,
                          .tensors = d};
    wsync_adapter_source_t src = {.struct_size = sizeof(src),
                                  .kind = WSYNC_ADAPTER_FROM_MANIFEST,
                                  .manifest = &m,
                                  .adapter_config_json = cfg};
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t res = wsync_adapter_hot_load(&src, &rc->s.slot, a, drain_then_exec, rc, &err);
    if (res != WSYNC_OK)
        fprintf(stderr, "upsert %d: %s\n", v, err.message);
    return res;
}

static void test_concurrent_reader(void **state)
{
    (void)state;
    static race_t rc;
    memset(&rc, 0, sizeof(rc));
    fx_target_spec_t t[] = {{L0 "q_proj", C_IN, C_OUT, WSYNC_DTYPE_F32, 0, {{0}}}};
    fx_slot_init(&rc.s, "race", C_R, t, 1);
    float *buf = calloc(C_R * C_IN + C_OUT * C_R, sizeof(float));
    float *a = buf, *b = buf + C_R * C_IN;
    assert_int_equal(upsert(&rc, 1, a, b), WSYNC_OK);
    char why[256];
    assert_int_equal(check_copy(&rc.s, rc.s.active, why, sizeof(why)), 0);
    /* the checker can fail: a copy with A of one version and B of another is caught */
    ((float *)rc.s.targets[0].lora_b[rc.s.active])[0] = -99.0f;
    assert_int_equal(check_copy(&rc.s, rc.s.active, why, sizeof(why)), 1);
    assert_int_equal(upsert(&rc, 2, a, b), WSYNC_OK);

    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader, &rc), 0);
    for (int v = 3; v <= C_VERSIONS; v++) {
        long seen = __atomic_load_n(&rc.checks, __ATOMIC_RELAXED);
        assert_int_equal(upsert(&rc, v, a, b), WSYNC_OK);
        /* let the readers look at every version at least once (two cores are shared) */
        while (__atomic_load_n(&rc.checks, __ATOMIC_RELAXED) < seen + 2)
            sched_yield();
    }
    __atomic_store_n(&rc.stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    free(buf);
    if (rc.failure[0])
        fail_msg("a reader saw a mixed adapter: %s", rc.failure);
    assert_true(rc.checks > 0);
    assert_int_equal((int)((const float *)rc.s.targets[0].lora_a[rc.s.active])[0], C_VERSIONS);
    printf("concurrent reader: %ld consistent reads, %ld retries over %d upserts\n", rc.checks,
           rc.retries, C_VERSIONS - 2);
    fx_slot_free(&rc.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_padding),
        cmocka_unit_test(test_rslora),
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_packed),
        cmocka_unit_test(test_packed_mixed_scaling),
        cmocka_unit_test(test_f32_to_bf16_exact),
        cmocka_unit_test(test_refusals_leave_slot_untouched),
        cmocka_unit_test(test_plan_refusals),
        cmocka_unit_test(test_from_manifest),
        cmocka_unit_test(test_unload),
        cmocka_unit_test(test_concurrent_reader),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
