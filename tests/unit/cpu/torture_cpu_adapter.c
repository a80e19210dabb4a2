/* LoRA hot-load through libwsync_cpu.so's tables (dlopen, ABI v1 only): FROM_DIR (a PEFT
 * directory written here), FROM_MANIFEST (a retained FIXED_LAYOUT staging refreshed in place, the
 * exporter-storage rule of docs/DESIGN.md §1.2), the producer's BUSY refusal before *consumed*,
 * stale manifests, layout changes and unload. Slot contents are checked against a reference built
 * here from the generator, independent of the adapters library's plan. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_test_util.h"
#include "wsync_digest.h"
#include "wsync_safetensors.h"
#include "wsync_client.h"

#define IN 64
#define MAXR 32
#define R 8
#define ALPHA 16.0

static wsync_test_plugin_t P;

/* HF modules the adapter trains; out features of each. q/k/v land in the packed qkv_proj. */
static const char *const modules[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
static const int64_t outs[] = {32, 16, 16, 32};
#define NMOD 4
#define LAYER "model.layers.0.self_attn."

typedef struct fixture {
    wsync_consumer_t *c;
    wsync_adapter_part_v1_t parts[3];
    wsync_adapter_target_t targets[2]; /* 0: qkv_proj (packed), 1: o_proj */
    wsync_adapter_slot_t slot;
    volatile int active;
    void *buf[2][2][2]; /* [target][copy][A, B] */
    char dir[64];
} fixture_t;

static size_t a_bytes(int t)
{
    (void)t;
    return (size_t)MAXR * IN * 2;
}
static size_t b_bytes(int t)
{
    return (size_t)(t == 0 ? 64 : 32) * MAXR * 2;
}

/* Element i of module m's A (ab 0) or B (ab 1) for version v: exact in bf16. */
static float value(int m, int ab, size_t i, uint64_t v)
{
    return (float)((int)((i * 7 + (size_t)m * 13 + (size_t)ab * 5 + v * 3) % 64) - 32) / 16.0f;
}

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact: every value() has at most 6 significant bits */
}

static void fill_module(int m, int ab, uint64_t v, wsync_dtype_t dt, void *dst)
{
    size_t n = ab == 0 ? (size_t)R * IN : (size_t)outs[m] * R;
    for (size_t i = 0; i < n; i++) {
        float f = value(m, ab, i, v);
        if (dt == WSYNC_DTYPE_F32)
            memcpy((char *)dst + 4 * i, &f, 4);
        else {
            uint16_t h = bf16_of(f);
            memcpy((char *)dst + 2 * i, &h, 2);
        }
    }
}

/* The slot content version v must give: parts stacked along the rank, zero padding. */
static void expected(int t, int ab, uint64_t v, uint16_t *out)
{
    size_t n = ab == 0 ? a_bytes(t) / 2 : b_bytes(t) / 2;
    memset(out, 0, n * 2);
    int first = t == 0 ? 0 : 3, last = t == 0 ? 3 : 4;
    int64_t row0 = 0;
    for (int m = first; m < last; m++) {
        int64_t c0 = (int64_t)(m - first) * R;
        for (int64_t r = 0; r < R; r++)
            for (int64_t x = 0; x < (ab == 0 ? IN : outs[m]); x++) {
                if (ab == 0)
                    out[(c0 + r) * IN + x] = bf16_of(value(m, 0, (size_t)(r * IN + x), v));
                else
                    out[(row0 + x) * MAXR + c0 + r] = bf16_of(value(m, 1, (size_t)(x * R + r), v));
            }
        row0 += outs[m];
    }
}

/* Number of targets whose active copy differs from version v. */
static int slot_mismatches(fixture_t *f, uint64_t v)
{
    int bad = 0, a = f->active;
    uint16_t *ref = malloc(64 * MAXR * 2 > MAXR * IN * 2 ? 64 * MAXR * 2 : MAXR * IN * 2);
    for (int t = 0; t < 2; t++)
        for (int ab = 0; ab < 2; ab++) {
            expected(t, ab, v, ref);
            bad += memcmp(f->buf[t][a][ab], ref, ab == 0 ? a_bytes(t) : b_bytes(t)) != 0;
        }
    free(ref);
    return bad;
}

/* wsync64 over both copies, ranks, scalings and *active: "the slot unchanged". */
static uint64_t slot_digest(fixture_t *f)
{
    uint64_t d = (uint64_t)f->active;
    for (int t = 0; t < 2; t++) {
        for (int k = 0; k < 2; k++) {
            d = d * 31 + wsync64(f->buf[t][k][0], a_bytes(t));
            d = d * 31 + wsync64(f->buf[t][k][1], b_bytes(t));
            d = d * 31 + f->targets[t].rank[k];
            d = d * 31 + wsync64(&f->targets[t].scaling[k], sizeof(float));
        }
    }
    return d;
}

static int group_setup(void **state)
{
    (void)state;
    return wsync_test_load(&P, WSYNC_TEST_HOST_LIB);
}

static int group_teardown(void **state)
{
    (void)state;
    wsync_test_unload(&P);
    return 0;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 2000};
    assert_int_equal(P.c->create(&cc, &f->c, NULL), WSYNC_OK);
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 2; k++) {
            assert_int_equal(P.c->mem_alloc(f->c, a_bytes(t), &f->buf[t][k][0], NULL), WSYNC_OK);
            assert_int_equal(P.c->mem_alloc(f->c, b_bytes(t), &f->buf[t][k][1], NULL), WSYNC_OK);
            memset(f->buf[t][k][0], 0x5A, a_bytes(t));
            memset(f->buf[t][k][1], 0x5A, b_bytes(t));
        }
    f->parts[0] = (wsync_adapter_part_v1_t){"q_proj", 0, 32};
    f->parts[1] = (wsync_adapter_part_v1_t){"k_proj", 32, 16};
    f->parts[2] = (wsync_adapter_part_v1_t){"v_proj", 48, 16};
    static const char *const names[2] = {LAYER "qkv_proj", LAYER "o_proj"};
    for (int t = 0; t < 2; t++) {
        wsync_adapter_target_t *x = &f->targets[t];
        x->struct_size = sizeof(*x);
        x->module = names[t];
        x->dtype = WSYNC_DTYPE_BF16;
        x->in_features = IN;
        x->out_features = t == 0 ? 64 : 32;
        for (int k = 0; k < 2; k++) {
            x->lora_a[k] = f->buf[t][k][0];
            x->lora_b[k] = f->buf[t][k][1];
        }
        x->n_parts = t == 0 ? 3 : 0;
        x->parts = t == 0 ? f->parts : NULL;
    }
    f->slot = (wsync_adapter_slot_t){.struct_size = sizeof(f->slot),
                                     .adapter_name = "policy",
                                     .max_rank = MAXR,
                                     .n_targets = 2,
                                     .targets = f->targets,
                                     .active = &f->active};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 2; k++)
            for (int ab = 0; ab < 2; ab++)
                P.c->mem_free(f->c, f->buf[t][k][ab], NULL);
    assert_int_equal(P.c->finalize(f->c, NULL), WSYNC_OK);
    if (f->dir[0] != '\0') {
        char p[128];
        snprintf(p, sizeof(p), "%s/adapter_config.json", f->dir);
        unlink(p);
        snprintf(p, sizeof(p), "%s/adapter_model.safetensors", f->dir);
        unlink(p);
        rmdir(f->dir);
    }
    free(f);
    return 0;
}

static char *config_json(int rslora, const char *extra_target)
{
    char *s = malloc(512);
    snprintf(s, 512,
             "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %g, \"use_rslora\": %s, "
             "\"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"%s%s%s], "
             "\"bias\": \"none\"}",
             R, ALPHA, rslora ? "true" : "false", extra_target ? ", \"" : "",
             extra_target ? extra_target : "", extra_target ? "\"" : "");
    return s;
}

/* PEFT names and the module's buffers (caller frees names and data). */
typedef struct adapter_tensors {
    char name[NMOD * 2][96];
    void *data[NMOD * 2];
    int64_t shape[NMOD * 2][2];
} adapter_tensors_t;

static void make_tensors(adapter_tensors_t *a, uint64_t v, wsync_dtype_t dt)
{
    size_t es = dt == WSYNC_DTYPE_F32 ? 4 : 2;
    for (int m = 0; m < NMOD; m++)
        for (int ab = 0; ab < 2; ab++) {
            int i = 2 * m + ab;
            snprintf(a->name[i], sizeof(a->name[i]), "base_model.model." LAYER "%s.lora_%s.weight",
                     modules[m], ab == 0 ? "A" : "B");
            a->shape[i][0] = ab == 0 ? R : outs[m];
            a->shape[i][1] = ab == 0 ? IN : R;
            a->data[i] = malloc((size_t)(a->shape[i][0] * a->shape[i][1]) * es);
            fill_module(m, ab, v, dt, a->data[i]);
        }
}

static void free_tensors(adapter_tensors_t *a)
{
    for (int i = 0; i < NMOD * 2; i++)
        free(a->data[i]);
}

static void write_dir(fixture_t *f, uint64_t v, int rslora)
{
    adapter_tensors_t a;
    wsync_st_write_tensor_t w[NMOD * 2];
    char p[128];
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (f->dir[0] == '\0') {
        snprintf(f->dir, sizeof(f->dir), "/tmp/wsync-adapter-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
    }
    make_tensors(&a, v, WSYNC_DTYPE_F32);
    for (int i = 0; i < NMOD * 2; i++)
        w[i] = (wsync_st_write_tensor_t){.name = a.name[i],
                                         .dtype = WSYNC_DTYPE_F32,
                                         .ndim = 2,
                                         .shape = {a.shape[i][0], a.shape[i][1]},
                                         .data = a.data[i]};
    snprintf(p, sizeof(p), "%s/adapter_model.safetensors", f->dir);
    assert_int_equal(wsync_safetensors_write(p, w, NMOD * 2, NULL, &err), WSYNC_OK);
    free_tensors(&a);
    char *cfg = config_json(rslora, NULL);
    snprintf(p, sizeof(p), "%s/adapter_config.json", f->dir);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs(cfg, fp);
    fclose(fp);
    free(cfg);
}

static wsync_result_t load_dir(fixture_t *f, wsync_error_t *err)
{
    wsync_adapter_source_t src = {
        .struct_size = sizeof(src), .kind = WSYNC_ADAPTER_FROM_DIR, .path = f->dir};
    return P.c->hot_load_adapter(f->c, &src, &f->slot, NULL, err);
}

/* f32 on disk into a bf16 slot, rank 8 padded to 32 (q/k/v stacked to 24), scaling alpha/r;
 * then rslora: alpha/sqrt(r). */
static void test_from_dir(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};

    write_dir(f, 1, 0);
    assert_int_equal(load_dir(f, &err), WSYNC_OK);
    assert_int_equal(f->active, 1);
    assert_int_equal(slot_mismatches(f, 1), 0);
    assert_int_equal(f->targets[0].rank[1], 3 * R);
    assert_int_equal(f->targets[1].rank[1], R);
    assert_float_equal(f->targets[0].scaling[1], ALPHA / R, 1e-6);
    assert_float_equal(f->targets[1].scaling[1], ALPHA / R, 1e-6);

    write_dir(f, 2, 1);
    assert_int_equal(load_dir(f, &err), WSYNC_OK);
    assert_int_equal(f->active, 0);
    assert_int_equal(slot_mismatches(f, 2), 0);
    assert_float_equal(f->targets[1].scaling[0], ALPHA / sqrt(R), 1e-5);
    /* The previous copy is untouched by the second load (it was the active one). */
    uint16_t *ref = malloc(a_bytes(1));
    expected(1, 0, 1, ref);
    assert_memory_equal(f->buf[1][1][0], ref, a_bytes(1));
    free(ref);
}

/* A bad directory (tensors of modules the config does not target) is refused and leaves the slot
 * unchanged. */
static void test_from_dir_refused(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};
    char p[128];

    write_dir(f, 1, 0);
    assert_int_equal(load_dir(f, &err), WSYNC_OK);
    uint64_t before = slot_digest(f);
    snprintf(p, sizeof(p), "%s/adapter_config.json", f->dir);
    FILE *fp = fopen(p, "w");
    fputs("{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}", fp);
    fclose(fp);
    wsync_result_t r = load_dir(f, &err);
    print_message("refused: %s: %s\n", wsync_strerror(r), err.message);
    assert_int_not_equal(r, WSYNC_OK);
    assert_non_null(strstr(err.message, "_proj"));
    assert_int_equal(slot_digest(f), before);
}

/* Producer side of the colocated path. */
typedef struct producer {
    wsync_staging_t *s;
    adapter_tensors_t a;
    wsync_stage_tensor_t t[NMOD * 2];
    char *config;
} producer_t;

static void producer_open(producer_t *pr)
{
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg),
                                  .bytes = 1 << 20,
                                  .flags = WSYNC_STAGING_FIXED_LAYOUT,
                                  .timeout_ms = 2000};
    memset(pr, 0, sizeof(*pr));
    assert_int_equal(P.p->create(&cfg, &pr->s, NULL), WSYNC_OK);
    make_tensors(&pr->a, 0, WSYNC_DTYPE_BF16);
    for (int i = 0; i < NMOD * 2; i++)
        pr->t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(pr->t[i]),
                                          .name = pr->a.name[i],
                                          .dtype = WSYNC_DTYPE_BF16,
                                          .ndim = 2,
                                          .shape = {pr->a.shape[i][0], pr->a.shape[i][1]},
                                          .src = pr->a.data[i]};
    pr->config = config_json(0, NULL);
}

static void producer_close(producer_t *pr)
{
    assert_int_equal(P.p->retire(pr->s, NULL), WSYNC_OK);
    free_tensors(&pr->a);
    free(pr->config);
}

/* Refresh the retained export in place with version v and publish it. */
static const char *producer_refresh(producer_t *pr, uint64_t v, uint64_t *gen)
{
    const char *json = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    for (int m = 0; m < NMOD; m++)
        for (int ab = 0; ab < 2; ab++)
            fill_module(m, ab, v, WSYNC_DTYPE_BF16, pr->a.data[2 * m + ab]);
    assert_int_equal(P.p->stage(pr->s, NULL, pr->t, NMOD * 2, &err), WSYNC_OK);
    assert_int_equal(P.p->publish(pr->s, NULL, 1, &json, gen, &err), WSYNC_OK);
    return json;
}

static wsync_result_t load_manifest(fixture_t *f, wsync_handle_t *h, const wsync_manifest_t *m,
                                    const char *config, wsync_error_t *err)
{
    wsync_adapter_source_t src = {.struct_size = sizeof(src),
                                  .kind = WSYNC_ADAPTER_FROM_MANIFEST,
                                  .handle = h,
                                  .manifest = m,
                                  .adapter_config_json = config};
    return P.c->hot_load_adapter(f->c, &src, &f->slot, NULL, err);
}

/* 50 refreshes of one retained export: the same storage (shm name) in every manifest, every
 * version visible in the slot, *consumed* signalled so wait_consumed returns. */
static void test_from_manifest_refresh(void **state)
{
    fixture_t *f = *state;
    producer_t pr;
    wsync_handle_t *h = NULL;
    uint8_t handle0[WSYNC_HANDLE_MAX];
    uint32_t handle0_len = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};

    producer_open(&pr);
    for (uint64_t v = 1; v <= 50; v++) {
        uint64_t gen = 0;
        const char *json = producer_refresh(&pr, v, &gen);
        const wsync_manifest_t *m = NULL;
        assert_int_equal(gen, v);
        assert_int_equal(P.c->parse_manifest(f->c, json, strlen(json), &m, &err), WSYNC_OK);
        assert_int_equal(m->buffer.kind, WSYNC_BUFFER_HOST_SHM);
        if (v == 1) {
            handle0_len = m->buffer.handle_len;
            memcpy(handle0, m->buffer.handle, handle0_len);
            assert_int_equal(P.c->open_handle(f->c, &m->buffer, &h, &err), WSYNC_OK);
        }
        assert_int_equal(m->buffer.handle_len, handle0_len);
        assert_memory_equal(m->buffer.handle, handle0, handle0_len);
        assert_int_equal(load_manifest(f, h, m, pr.config, &err), WSYNC_OK);
        assert_int_equal(slot_mismatches(f, v), 0);
        assert_int_equal(f->targets[0].rank[f->active], 3 * R);
        assert_int_equal(P.p->wait_consumed(pr.s, NULL, gen, &err), WSYNC_OK);
        P.c->manifest_free(f->c, m);
    }
    assert_int_equal(P.c->close_handle(f->c, h, NULL), WSYNC_OK);
    producer_close(&pr);
}

/* Staging again before the consumer consumed the last generation is refused (BUSY), nothing
 * written; a changed shape is refused (LAYOUT_MISMATCH); a replayed manifest is STALE. Each
 * refusal leaves the slot byte-for-byte unchanged. */
static void test_producer_rules(void **state)
{
    fixture_t *f = *state;
    producer_t pr;
    wsync_handle_t *h = NULL;
    const wsync_manifest_t *m1 = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    uint64_t gen = 0;

    producer_open(&pr);
    const char *json = producer_refresh(&pr, 1, &gen);
    assert_int_equal(P.c->parse_manifest(f->c, json, strlen(json), &m1, &err), WSYNC_OK);

    /* Not consumed yet: stage must refuse and leave the published bytes alone. */
    uint8_t before[64], after[64];
    assert_int_equal(P.p->read_back(pr.s, 0, before, sizeof(before), NULL), WSYNC_OK);
    fill_module(0, 0, 9, WSYNC_DTYPE_BF16, pr.a.data[0]);
    assert_int_equal(P.p->stage(pr.s, NULL, pr.t, NMOD * 2, &err), WSYNC_ERR_BUSY);
    print_message("busy: %s\n", err.message);
    assert_non_null(strstr(err.message, "not yet consumed"));
    assert_non_null(strstr(err.message, "wait_consumed"));
    assert_int_equal(P.p->read_back(pr.s, 0, after, sizeof(after), NULL), WSYNC_OK);
    assert_memory_equal(before, after, sizeof(before));
    fill_module(0, 0, 1, WSYNC_DTYPE_BF16, pr.a.data[0]);

    assert_int_equal(P.c->open_handle(f->c, &m1->buffer, &h, &err), WSYNC_OK);
    assert_int_equal(load_manifest(f, h, m1, pr.config, &err), WSYNC_OK);
    assert_int_equal(slot_mismatches(f, 1), 0);
    assert_int_equal(P.p->wait_consumed(pr.s, NULL, gen, &err), WSYNC_OK);
    uint64_t d = slot_digest(f);

    /* Replay of the consumed generation. */
    memset(&err, 0, sizeof(err));
    err.struct_size = sizeof(err);
    assert_int_equal(load_manifest(f, h, m1, pr.config, &err), WSYNC_ERR_STALE_GENERATION);
    assert_int_equal(slot_digest(f), d);

    /* A changed shape: the retained layout refuses, nothing staged or published. */
    wsync_stage_tensor_t bad[NMOD * 2];
    memcpy(bad, pr.t, sizeof(bad));
    bad[0].shape[0] = R / 2;
    memset(&err, 0, sizeof(err));
    err.struct_size = sizeof(err);
    assert_int_equal(P.p->stage(pr.s, NULL, bad, NMOD * 2, &err), WSYNC_ERR_LAYOUT_MISMATCH);
    assert_int_equal(slot_digest(f), d);

    /* The retained layout still works afterwards. */
    json = producer_refresh(&pr, 2, &gen);
    const wsync_manifest_t *m2 = NULL;
    assert_int_equal(P.c->parse_manifest(f->c, json, strlen(json), &m2, &err), WSYNC_OK);
    assert_int_equal(load_manifest(f, h, m2, pr.config, &err), WSYNC_OK);
    assert_int_equal(slot_mismatches(f, 2), 0);
    assert_int_equal(P.p->wait_consumed(pr.s, NULL, gen, &err), WSYNC_OK);

    P.c->manifest_free(f->c, m1);
    P.c->manifest_free(f->c, m2);
    assert_int_equal(P.c->close_handle(f->c, h, NULL), WSYNC_OK);
    producer_close(&pr);
}

/* A manifest source with a module the slot lacks: NOT_FOUND naming it, slot unchanged, and no
 * *consumed* (the producer may not reuse what was never read). */
static void test_from_manifest_refused(void **state)
{
    fixture_t *f = *state;
    producer_t pr;
    wsync_handle_t *h = NULL;
    const wsync_manifest_t *m = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    uint64_t gen = 0;

    producer_open(&pr);
    snprintf(pr.a.name[6], sizeof(pr.a.name[6]), "base_model.model." LAYER "x_proj.lora_A.weight");
    snprintf(pr.a.name[7], sizeof(pr.a.name[7]), "base_model.model." LAYER "x_proj.lora_B.weight");
    free(pr.config);
    pr.config = config_json(0, "x_proj");
    const char *json = producer_refresh(&pr, 1, &gen);
    uint64_t d = slot_digest(f);
    assert_int_equal(P.c->parse_manifest(f->c, json, strlen(json), &m, &err), WSYNC_OK);
    assert_int_equal(P.c->open_handle(f->c, &m->buffer, &h, &err), WSYNC_OK);
    assert_int_equal(load_manifest(f, h, m, pr.config, &err), WSYNC_ERR_NOT_FOUND);
    print_message("refused: %s\n", err.message);
    assert_non_null(strstr(err.message, "x_proj"));
    assert_int_equal(slot_digest(f), d);
    P.c->manifest_free(f->c, m);
    assert_int_equal(P.c->close_handle(f->c, h, NULL), WSYNC_OK);
    producer_close(&pr);
}

static void test_unload(void **state)
{
    fixture_t *f = *state;
    wsync_error_t err = {.struct_size = sizeof(err)};

    write_dir(f, 3, 0);
    assert_int_equal(load_dir(f, &err), WSYNC_OK);
    assert_int_equal(f->targets[1].rank[f->active], R);
    assert_true(WSYNC_HAS_OP(wsync_consumer_ops_t, P.c, unload_adapter));
    assert_int_equal(P.c->unload_adapter(f->c, &f->slot, &err), WSYNC_OK);
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 2; k++) {
            assert_int_equal(f->targets[t].rank[k], 0);
            assert_float_equal(f->targets[t].scaling[k], 0.0, 0.0);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_from_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_from_dir_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_from_manifest_refresh, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_from_manifest_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unload, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
