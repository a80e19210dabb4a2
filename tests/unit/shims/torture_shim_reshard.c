/* Resharding plans (engine-shims/common/wsync_reshard.c), executed on the CPU: trainer TP
 * {1, 2, 4} x FSDP {1, 2} (and PP 2, DP 2 replicas) hold their shards of the synthetic dense and
 * MoE models in per-rank segments; each engine rank of SGLang, vLLM and LMDeploy at TP {1, 2, 4}
 * is planned and its ops run with memcpy. Every engine parameter then equals the reference
 * engine's expected bytes (wsync_ref_expected, computed from the whole tensors: the gather), every
 * destination byte was written exactly once, replicas were read from the same GPU when one holds
 * them, and bad layouts are refused naming the tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "wsync_ref_layout.h"
#include "wsync_reshard.h"
#include "wsync_shim.h"

typedef struct eng {
    wsync_ref_layout_t l;
    unsigned char *arena;
    uint32_t rank, size;
} eng_t;

static int param_cb(void *user, const char *name, wsync_param_info_t *out)
{
    eng_t *e = user;
    long i = wsync_ref_layout_find(&e->l, name);
    if (i < 0)
        return -1;
    const wsync_ref_param_t *p = &e->l.params[i];
    out->ptr = e->arena + p->offset;
    out->dtype = WSYNC_DTYPE_BF16;
    out->ndim = p->ndim;
    memset(out->shape, 0, sizeof(out->shape));
    memcpy(out->shape, p->shape, sizeof(p->shape));
    return 0;
}

static void tp_cb(void *user, uint32_t *rank, uint32_t *size)
{
    *rank = ((eng_t *)user)->rank;
    *size = ((eng_t *)user)->size;
}

static void dims_cb(void *user, wsync_model_dims_t *out)
{
    *out = ((eng_t *)user)->l.dims;
}

/* The model's tensors as descriptors (names point into m). */
static wsync_tensor_desc_t *descs(const wsync_model_t *m)
{
    wsync_tensor_desc_t *t = calloc(m->n, sizeof(*t));
    assert_non_null(t);
    for (size_t i = 0; i < m->n; i++) {
        const wsync_model_tensor_t *x = &m->tensors[i];
        t[i] = (wsync_tensor_desc_t){.struct_size = sizeof(t[i]),
                                     .name = x->name,
                                     .dtype = x->dtype,
                                     .ndim = x->ndim,
                                     .nbytes = x->nbytes};
        memcpy(t[i].shape, x->shape, sizeof(x->shape));
    }
    return t;
}

/* Each trainer rank's segment, filled with its pieces of version `version`. */
static unsigned char **fill_segments(const wsync_model_t *m, const wsync_reshard_piece_t *p,
                                     size_t np, const uint64_t *seg, uint32_t world,
                                     uint64_t version)
{
    unsigned char **s = calloc(world, sizeof(*s));
    unsigned char *whole = malloc(m->max_nbytes);
    assert_non_null(s);
    assert_non_null(whole);
    for (uint32_t r = 0; r < world; r++)
        assert_non_null(s[r] = malloc(seg[r] ? seg[r] : 1));
    for (size_t k = 0; k < np; k++) {
        const wsync_model_tensor_t *x = &m->tensors[p[k].tensor];
        const int64_t cols = x->ndim == 1 ? x->shape[0] : x->shape[1];
        wsync_model_fill(x, version, whole);
        for (int64_t r = 0; r < p[k].rows; r++)
            memcpy(s[p[k].rank] + p[k].offset + (uint64_t)r * p[k].pitch,
                   whole + ((uint64_t)(p[k].r0 + r) * (uint64_t)cols + (uint64_t)p[k].c0) * 2u,
                   (uint64_t)p[k].cols * 2u);
    }
    free(whole);
    return s;
}

/* Runs one engine rank's plan and checks it against the reference engine. */
static void run_engine_rank(const char *engine, const wsync_model_config_t *cfg,
                            const wsync_reshard_src_t *src, unsigned char *const *seg,
                            uint32_t rank, uint32_t size, uint64_t version, uint64_t *local)
{
    const wsync_shim_t *shim = wsync_shim_find(engine);
    assert_non_null(shim);
    eng_t e = {.rank = rank, .size = size};
    char why[256];
    if (wsync_ref_layout_build(&e.l, engine, cfg, rank, size, why, sizeof(why)) != 0)
        fail_msg("%s rank %u/%u: %s", engine, rank, size, why);
    e.arena = calloc(1, e.l.arena_bytes);
    unsigned char *hits = calloc(1, e.l.arena_bytes);
    assert_non_null(e.arena);
    assert_non_null(hits);
    wsync_engine_ops_t ops = {
        .struct_size = sizeof(ops), .user = &e, .param = param_cb, .tp = tp_cb, .dims = dims_cb};
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    /* engine rank r runs on GPU r, the trainer's rank r there too: one node */
    const wsync_reshard_place_t where = {.gpu = rank, .node = 0};
    if (wsync_reshard_plan(shim->map, &ops, where, src, &plan, &n, &err) != WSYNC_OK)
        fail_msg("%s rank %u/%u: %s", engine, rank, size, err.message);
    for (size_t i = 0; i < n; i++) {
        const wsync_copy_op_t *o = &plan[i].op;
        for (uint64_t r = 0; r < o->rows; r++) {
            unsigned char *d = (unsigned char *)o->dst + r * o->dst_pitch;
            const uint64_t at = (uint64_t)(d - e.arena);
            assert_true(at + o->row_bytes <= e.l.arena_bytes);
            memcpy(d, seg[plan[i].src_rank] + o->src_offset + r * o->src_pitch, o->row_bytes);
            for (uint64_t b = 0; b < o->row_bytes; b++)
                hits[at + b]++;
        }
        if (plan[i].link == WSYNC_LINK_LOCAL)
            *local += o->rows * o->row_bytes;
    }
    unsigned char *want = malloc(1);
    for (size_t i = 0; i < e.l.n; i++) {
        const wsync_ref_param_t *p = &e.l.params[i];
        want = realloc(want, p->nbytes);
        wsync_ref_expected(&e.l, p, version, want);
        if (memcmp(e.arena + p->offset, want, p->nbytes) != 0)
            fail_msg("%s rank %u/%u: parameter %s differs from the reference", engine, rank, size,
                     p->name);
        for (uint64_t b = 0; b < p->nbytes; b++)
            if (hits[p->offset + b] != 1)
                fail_msg("%s rank %u/%u: byte %llu of %s written %u times", engine, rank, size,
                         (unsigned long long)b, p->name, hits[p->offset + b]);
    }
    free(want);
    wsync_reshard_free(plan);
    free(hits);
    free(e.arena);
    wsync_ref_layout_free(&e.l);
}

/* Every engine rank of `engines` (n_engines of sglang, vllm, lmdeploy) at TP 1, 2 and 4. */
static void reshard_case(const char *layout, const wsync_reshard_trainer_t *t, int n_engines)
{
    const wsync_model_config_t cfg = {.layout = layout, .scale = 8, .layers = 2};
    wsync_model_t m;
    char why[256];
    assert_int_equal(wsync_model_build(&m, &cfg, why, sizeof(why)), 0);
    wsync_tensor_desc_t *td = descs(&m);
    const uint32_t world = t->tp * t->fsdp * t->dp * t->pp;
    uint64_t *seg = calloc(world, sizeof(*seg));
    wsync_reshard_place_t *place = calloc(world, sizeof(*place));
    wsync_reshard_piece_t *p = NULL;
    size_t np = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_reshard_trainer_layout(wsync_shim_find("sglang")->map, t, td, m.n, &p, &np, seg,
                                     &err) != WSYNC_OK)
        fail_msg("trainer layout: %s", err.message);
    for (uint32_t r = 0; r < world; r++)
        place[r] = (wsync_reshard_place_t){.gpu = r, .node = 0};
    unsigned char **s = fill_segments(&m, p, np, seg, world, 7);
    const wsync_reshard_src_t src = {.tensors = td,
                                     .n_tensors = m.n,
                                     .pieces = p,
                                     .n_pieces = np,
                                     .place = place,
                                     .n_ranks = world};
    const char *engines[] = {"sglang", "vllm", "lmdeploy"};
    for (int k = 0; k < n_engines; k++)
        for (uint32_t tp = 1; tp <= 4; tp *= 2) {
            uint64_t local = 0;
            for (uint32_t r = 0; r < tp; r++)
                run_engine_rank(engines[k], &cfg, &src, s, r, tp, 7, &local);
            /* the engine and the trainer alike: every byte comes from its own GPU */
            if (tp == t->tp && t->fsdp == 1 && t->pp == 1 && t->dp == 1)
                assert_true(local > 0);
        }
    for (uint32_t r = 0; r < world; r++)
        free(s[r]);
    free(s);
    wsync_reshard_free(p);
    free(seg);
    free(place);
    free(td);
    wsync_model_free(&m);
}

static void test_tp_fsdp_grid(void **state)
{
    (void)state;
    const char *layouts[] = {"dense", "moe"};
    for (int l = 0; l < 2; l++)
        for (uint32_t tp = 1; tp <= 4; tp *= 2)
            for (uint32_t f = 1; f <= 2; f++) {
                const wsync_reshard_trainer_t t = {.tp = tp, .fsdp = f, .dp = 1, .pp = 1};
                /* vLLM's and LMDeploy's layouts on one trainer layout of each model */
                reshard_case(layouts[l], &t, tp == 2 && f == 2 ? 3 : 1);
            }
}

static void test_pp_and_replicas(void **state)
{
    (void)state;
    const wsync_reshard_trainer_t pp = {.tp = 2, .fsdp = 1, .dp = 1, .pp = 2};
    reshard_case("dense", &pp, 1);
    const wsync_reshard_trainer_t dp = {.tp = 1, .fsdp = 2, .dp = 2, .pp = 1};
    reshard_case("moe", &dp, 1);
}

/* A replica on the engine's own GPU is chosen over the same bytes elsewhere. */
static void test_nearest_replica(void **state)
{
    (void)state;
    const wsync_model_config_t cfg = {.layout = "dense", .scale = 8, .layers = 1};
    wsync_model_t m;
    char why[256];
    assert_int_equal(wsync_model_build(&m, &cfg, why, sizeof(why)), 0);
    wsync_tensor_desc_t *td = descs(&m);
    const wsync_reshard_trainer_t t = {.tp = 1, .fsdp = 1, .dp = 4, .pp = 1};
    uint64_t seg[4];
    wsync_reshard_piece_t *p = NULL;
    size_t np = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(
        wsync_reshard_trainer_layout(wsync_shim_find("vllm")->map, &t, td, m.n, &p, &np, seg, &err),
        WSYNC_OK);
    /* ranks 0, 1 on node 0; 2, 3 on node 1; the engine on GPU 3 */
    const wsync_reshard_place_t place[4] = {{0, 0}, {1, 0}, {2, 1}, {3, 1}};
    const wsync_reshard_src_t src = {td, m.n, p, np, place, 4};
    eng_t e = {.rank = 0, .size = 1};
    assert_int_equal(wsync_ref_layout_build(&e.l, "vllm", &cfg, 0, 1, why, sizeof(why)), 0);
    e.arena = calloc(1, e.l.arena_bytes);
    wsync_engine_ops_t ops = {
        .struct_size = sizeof(ops), .user = &e, .param = param_cb, .tp = tp_cb, .dims = dims_cb};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("vllm")->map, &ops,
                                        (wsync_reshard_place_t){3, 1}, &src, &plan, &n, &err),
                     WSYNC_OK);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(plan[i].src_rank, 3);
        assert_int_equal(plan[i].link, WSYNC_LINK_LOCAL);
    }
    wsync_reshard_free(plan);
    /* on GPU 5 of node 1 (no trainer there): one of its node's, number 5 mod 2 */
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("vllm")->map, &ops,
                                        (wsync_reshard_place_t){5, 1}, &src, &plan, &n, &err),
                     WSYNC_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(plan[i].src_rank, 3);
        assert_int_equal(plan[i].link, WSYNC_LINK_NVLINK);
    }
    wsync_reshard_bytes_t in = {0};
    wsync_reshard_count(plan, n, &in, NULL);
    assert_int_equal(in.link[WSYNC_LINK_NVLINK], m.payload_bytes);
    assert_int_equal(in.link[WSYNC_LINK_NET] + in.link[WSYNC_LINK_LOCAL], 0);
    wsync_reshard_free(plan);
    free(e.arena);
    wsync_ref_layout_free(&e.l);
    wsync_reshard_free(p);
    free(td);
    wsync_model_free(&m);
}

/* Bad layouts: a missing piece, and two pieces that overlap, each refused naming the tensor. */
static void test_bad_layouts(void **state)
{
    (void)state;
    const wsync_model_config_t cfg = {.layout = "dense", .scale = 8, .layers = 1};
    wsync_model_t m;
    char why[256];
    assert_int_equal(wsync_model_build(&m, &cfg, why, sizeof(why)), 0);
    wsync_tensor_desc_t *td = descs(&m);
    const wsync_reshard_trainer_t t = {.tp = 2, .fsdp = 1, .dp = 1, .pp = 1};
    uint64_t seg[2];
    wsync_reshard_piece_t *p = NULL;
    size_t np = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_reshard_trainer_layout(wsync_shim_find("sglang")->map, &t, td, m.n, &p,
                                                  &np, seg, &err),
                     WSYNC_OK);
    const wsync_reshard_place_t place[2] = {{0, 0}, {1, 0}};
    eng_t e = {.rank = 0, .size = 1};
    assert_int_equal(wsync_ref_layout_build(&e.l, "sglang", &cfg, 0, 1, why, sizeof(why)), 0);
    e.arena = calloc(1, e.l.arena_bytes);
    wsync_engine_ops_t ops = {
        .struct_size = sizeof(ops), .user = &e, .param = param_cb, .tp = tp_cb, .dims = dims_cb};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    /* drop the piece of rank 1 of the first tensor: half of it is missing */
    size_t k = 0;
    while (!(p[k].tensor == 0 && p[k].rank == 1))
        k++;
    wsync_reshard_piece_t *fewer = malloc(np * sizeof(*fewer));
    memcpy(fewer, p, k * sizeof(*p));
    memcpy(fewer + k, p + k + 1, (np - k - 1) * sizeof(*p));
    wsync_reshard_src_t src = {td, m.n, fewer, np - 1, place, 2};
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("sglang")->map, &ops,
                                        (wsync_reshard_place_t){0, 0}, &src, &plan, &n, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, m.tensors[0].name));
    assert_non_null(strstr(err.message, "cover"));
    /* rank 1's piece of tensor 0 grown by one row into rank 0's */
    memcpy(fewer, p, np * sizeof(*p));
    fewer[k].r0 -= 1, fewer[k].rows += 1;
    src.n_pieces = np;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("sglang")->map, &ops,
                                        (wsync_reshard_place_t){0, 0}, &src, &plan, &n, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, m.tensors[0].name));
    assert_non_null(strstr(err.message, "overlap"));
    /* a trainer tp that does not divide the kv heads (Megatron splits whole query groups) */
    const wsync_reshard_trainer_t odd = {.tp = 4, .fsdp = 1, .dp = 1, .pp = 1, .kv_heads = 2};
    wsync_reshard_piece_t *q = NULL;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_reshard_trainer_layout(wsync_shim_find("sglang")->map, &odd, td, m.n, &q,
                                                  &np, NULL, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    if (strstr(err.message, "k_proj") == NULL)
        fail_msg("%s", err.message);
    assert_non_null(strstr(err.message, "kv heads"));
    free(fewer);
    free(e.arena);
    wsync_ref_layout_free(&e.l);
    wsync_reshard_free(p);
    free(td);
    wsync_model_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_fsdp_grid),
        cmocka_unit_test(test_pp_and_replicas),
        cmocka_unit_test(test_nearest_replica),
        cmocka_unit_test(test_bad_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
