/* Resharding plans (engine-shims/common/wsync_reshard.c), executed on the CPU: trainer TP
 * {1, 2, 4} x FSDP {1, 2} (and PP 2, DP 2 replicas) hold their shards of the synthetic dense and
 * MoE models in per-rank segments; each engine rank of SGLang, vLLM and LMDeploy at TP {1, 2, 4}
 * (SGLang's MoE also with EP 2 and 4 inside its TP group) is planned and its ops run with
 * memcpy. Every engine parameter then equals the reference
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

#include "reshard_fixture.h"
#include "wsync_reshard.h"
#include "wsync_shim.h"

/* Each trainer rank's segment, filled with its pieces of version `version`. */
static unsigned char **fill_segments(const wsync_model_t *m, const wsync_reshard_piece_t *p,
                                     size_t np, const uint64_t *seg, uint32_t world,
                                     uint64_t version)
{
    unsigned char **s = calloc(world, sizeof(*s));
    assert_non_null(s);
    for (uint32_t r = 0; r < world; r++) {
        assert_non_null(s[r] = malloc(seg[r] ? seg[r] : 1));
        assert_int_equal(segment_fill(m, p, np, r, version, s[r]), 0);
    }
    return s;
}

/* Runs one engine rank's plan and checks it against the reference engine. */
/* Plans the opened engine rank e (on GPU gpu, node 0), runs its ops and checks every parameter
 * against the reference, each byte written once; engine_close(e) after. */
static void run_opened(eng_t *e_, const char *engine, const wsync_reshard_src_t *src,
                       unsigned char *const *seg, uint32_t gpu, uint64_t version, uint64_t *local)
{
    eng_t e = *e_;
    const uint32_t rank = e.l.rank, size = e.l.size;
    const wsync_shim_t *shim = wsync_shim_find(engine);
    assert_non_null(shim);
    unsigned char *hits = calloc(1, e.l.arena_bytes);
    assert_non_null(hits);
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    const wsync_reshard_place_t where = {.gpu = gpu, .node = 0};
    if (wsync_reshard_plan(shim->map, &e.ops, where, src, &plan, &n, &err) != WSYNC_OK)
        fail_msg("%s rank %u/%u: %s", engine, rank, size, err.message);
    for (size_t i = 0; i < n; i++) {
        const wsync_copy_op_t *o = &plan[i].op;
        for (uint64_t r = 0; r < o->rows; r++) {
            unsigned char *d = (unsigned char *)o->dst + r * o->dst_pitch;
            const uint64_t at = (uint64_t)(d - e.view.arena);
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
        assert_int_equal(engine_expected(&e, p, version, want), 0);
        if (memcmp(e.view.arena + p->offset, want, p->nbytes) != 0)
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
    engine_close(e_);
}

/* Engine rank `rank` of `size` (EP ep inside its TP group), on GPU rank: run_opened. */
static void run_engine_rank(const char *engine, const wsync_model_config_t *cfg,
                            const wsync_reshard_src_t *src, unsigned char *const *seg,
                            uint32_t rank, uint32_t size, uint32_t ep, uint64_t version,
                            uint64_t *local)
{
    eng_t e;
    char why[256];
    if (engine_open(&e, engine, cfg, rank, size, ep, why, sizeof(why)) != 0)
        fail_msg("%s rank %u/%u: %s", engine, rank, size, why);
    run_opened(&e, engine, src, seg, rank, version, local);
}

/* Every engine rank of `engines` (n_engines of sglang, vllm, lmdeploy) at TP 1, 2 and 4. */
/* A trainer of layout t on GPUs 0.. of one node holding version 7 of a 2-layer model in its
 * segments (pieces laid out with SGLang's rules). */
typedef struct tworld {
    wsync_model_config_t cfg;
    wsync_model_t m;
    wsync_tensor_desc_t *td;
    wsync_reshard_piece_t *p;
    size_t np;
    uint64_t *seg;
    wsync_reshard_place_t *place;
    unsigned char **s;
    uint32_t world;
    wsync_reshard_src_t src;
} tworld_t;

static void tworld_open(tworld_t *w, const char *layout, const wsync_reshard_trainer_t *t)
{
    char why[256];
    wsync_error_t err = {.struct_size = sizeof(err)};
    memset(w, 0, sizeof(*w));
    w->cfg = (wsync_model_config_t){.layout = layout, .scale = 8, .layers = 2};
    assert_int_equal(wsync_model_build(&w->m, &w->cfg, why, sizeof(why)), 0);
    assert_non_null(w->td = model_descs(&w->m));
    w->world = t->tp * t->fsdp * t->dp * t->pp;
    w->seg = calloc(w->world, sizeof(*w->seg));
    w->place = calloc(w->world, sizeof(*w->place));
    if (wsync_reshard_trainer_layout(wsync_shim_find("sglang")->map, t, w->td, w->m.n, &w->p,
                                     &w->np, w->seg, &err) != WSYNC_OK)
        fail_msg("trainer layout: %s", err.message);
    for (uint32_t r = 0; r < w->world; r++)
        w->place[r] = (wsync_reshard_place_t){.gpu = r, .node = 0};
    w->s = fill_segments(&w->m, w->p, w->np, w->seg, w->world, 7);
    w->src = (wsync_reshard_src_t){.tensors = w->td,
                                   .n_tensors = w->m.n,
                                   .pieces = w->p,
                                   .n_pieces = w->np,
                                   .place = w->place,
                                   .n_ranks = w->world};
}

static void tworld_close(tworld_t *w)
{
    for (uint32_t r = 0; r < w->world; r++)
        free(w->s[r]);
    free(w->s);
    wsync_reshard_free(w->p);
    free(w->seg);
    free(w->place);
    model_descs_free(w->td);
    wsync_model_free(&w->m);
}

/* Every engine rank of `engines` (n_engines of sglang, vllm, lmdeploy) at TP 1, 2 and 4. */
static void reshard_case(const char *layout, const wsync_reshard_trainer_t *t, int n_engines)
{
    tworld_t w;
    tworld_open(&w, layout, t);
    const wsync_model_config_t cfg = w.cfg;
    const wsync_reshard_src_t src = w.src;
    unsigned char **s = w.s;
    const char *engines[] = {"sglang", "vllm", "lmdeploy"};
    for (int k = 0; k < n_engines; k++)
        for (uint32_t tp = 1; tp <= 4; tp *= 2) {
            uint64_t local = 0;
            for (uint32_t r = 0; r < tp; r++)
                run_engine_rank(engines[k], &cfg, &src, s, r, tp, 1, 7, &local);
            /* the engine and the trainer alike: every byte comes from its own GPU */
            if (tp == t->tp && t->fsdp == 1 && t->pp == 1 && t->dp == 1)
                assert_true(local > 0);
            /* SGLang with expert parallelism inside its TP group: EP = TP (each rank its whole
             * experts) and, at TP 4, EP 2 (experts split over MoE TP 2) */
            for (uint32_t ep = 2; k == 0 && strcmp(layout, "moe") == 0 && ep <= tp; ep *= 2)
                for (uint32_t r = 0; r < tp; r++)
                    run_engine_rank(engines[k], &cfg, &src, s, r, tp, ep, 7, &local);
        }
    tworld_close(&w);
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

/* EP across replicas (DP attention): SGLang TP 2 in 2 replicas on the trainer's 4 GPUs, the
 * experts spread over all 4 (GPU g holds EP rank g's, expert TP 1). */
static void test_ep_across_replicas(void **state)
{
    (void)state;
    const wsync_reshard_trainer_t t = {.tp = 2, .fsdp = 2, .dp = 1, .pp = 1};
    tworld_t w;
    tworld_open(&w, "moe", &t);
    char why[256];
    uint64_t local = 0;
    for (uint32_t g = 0; g < 4; g++) {
        eng_t e;
        if (engine_open_ep(&e, "sglang", &w.cfg, g % 2, 2, g, 4, 1, why, sizeof(why)) != 0)
            fail_msg("GPU %u: %s", g, why);
        run_opened(&e, "sglang", &w.src, w.s, g, 7, &local);
    }
    tworld_close(&w);
}

static void test_pp_and_replicas(void **state)
{
    (void)state;
    const wsync_reshard_trainer_t pp = {.tp = 2, .fsdp = 1, .dp = 1, .pp = 2};
    reshard_case("dense", &pp, 1);
    const wsync_reshard_trainer_t dp = {.tp = 1, .fsdp = 2, .dp = 2, .pp = 1};
    reshard_case("moe", &dp, 1);
    /* trainer expert parallelism: EP 2 over the fsdp ranks (each expert on half of them) */
    const wsync_reshard_trainer_t ep = {.tp = 2, .fsdp = 2, .dp = 1, .pp = 1, .ep = 2};
    reshard_case("moe", &ep, 1);
    const wsync_reshard_trainer_t ep4 = {.tp = 1, .fsdp = 4, .dp = 1, .pp = 1, .ep = 2};
    reshard_case("moe", &ep4, 1);
}

/* A one-layer dense model, trainer t's pieces of it (laid out with `engine`'s rules) and that
 * engine's rank 0 of 1. */
typedef struct small {
    wsync_model_config_t cfg;
    wsync_model_t m;
    wsync_tensor_desc_t *td;
    wsync_reshard_piece_t *p;
    size_t np;
    eng_t e; /* the engine's rank 0 of 1 */
} small_t;

static void small_open(small_t *s, const char *engine, const wsync_reshard_trainer_t *t)
{
    char why[256];
    wsync_error_t err = {.struct_size = sizeof(err)};
    s->cfg = (wsync_model_config_t){.layout = "dense", .scale = 8, .layers = 1};
    assert_int_equal(wsync_model_build(&s->m, &s->cfg, why, sizeof(why)), 0);
    assert_non_null(s->td = model_descs(&s->m));
    assert_int_equal(wsync_reshard_trainer_layout(wsync_shim_find(engine)->map, t, s->td, s->m.n,
                                                  &s->p, &s->np, NULL, &err),
                     WSYNC_OK);
    assert_int_equal(engine_open(&s->e, engine, &s->cfg, 0, 1, 1, why, sizeof(why)), 0);
}

static void small_close(small_t *s)
{
    engine_close(&s->e);
    wsync_reshard_free(s->p);
    model_descs_free(s->td);
    wsync_model_free(&s->m);
}

/* A replica on the engine's own GPU is chosen over the same bytes elsewhere. */
static void test_nearest_replica(void **state)
{
    (void)state;
    const wsync_reshard_trainer_t t = {.tp = 1, .fsdp = 1, .dp = 4, .pp = 1};
    small_t sm;
    small_open(&sm, "vllm", &t);
    wsync_error_t err = {.struct_size = sizeof(err)};
    /* ranks 0, 1 on node 0; 2, 3 on node 1; the engine on GPU 3 */
    const wsync_reshard_place_t place[4] = {{0, 0}, {1, 0}, {2, 1}, {3, 1}};
    const wsync_reshard_src_t src = {sm.td, sm.m.n, sm.p, sm.np, place, 4};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("vllm")->map, &sm.e.ops,
                                        (wsync_reshard_place_t){3, 1}, &src, &plan, &n, &err),
                     WSYNC_OK);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(plan[i].src_rank, 3);
        assert_int_equal(plan[i].link, WSYNC_LINK_LOCAL);
    }
    wsync_reshard_free(plan);
    /* on GPU 5 of node 1 (no trainer there): one of its node's, number 5 mod 2 */
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("vllm")->map, &sm.e.ops,
                                        (wsync_reshard_place_t){5, 1}, &src, &plan, &n, &err),
                     WSYNC_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(plan[i].src_rank, 3);
        assert_int_equal(plan[i].link, WSYNC_LINK_NVLINK);
    }
    wsync_reshard_bytes_t in = {0};
    wsync_reshard_count(plan, n, &in, NULL);
    assert_int_equal(in.link[WSYNC_LINK_NVLINK], sm.m.payload_bytes);
    assert_int_equal(in.link[WSYNC_LINK_NET] + in.link[WSYNC_LINK_LOCAL], 0);
    wsync_reshard_free(plan);
    small_close(&sm);
}

/* Bad layouts: a missing piece, and two pieces that overlap, each refused naming the tensor. */
static void test_bad_layouts(void **state)
{
    (void)state;
    const wsync_reshard_trainer_t t = {.tp = 2, .fsdp = 1, .dp = 1, .pp = 1};
    small_t sm;
    small_open(&sm, "sglang", &t);
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_reshard_place_t place[2] = {{0, 0}, {1, 0}};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    /* drop the piece of rank 1 of the first tensor: half of it is missing */
    size_t k = 0;
    while (!(sm.p[k].tensor == 0 && sm.p[k].rank == 1))
        k++;
    wsync_reshard_piece_t *fewer = malloc(sm.np * sizeof(*fewer));
    memcpy(fewer, sm.p, k * sizeof(*sm.p));
    memcpy(fewer + k, sm.p + k + 1, (sm.np - k - 1) * sizeof(*sm.p));
    wsync_reshard_src_t src = {sm.td, sm.m.n, fewer, sm.np - 1, place, 2};
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("sglang")->map, &sm.e.ops,
                                        (wsync_reshard_place_t){0, 0}, &src, &plan, &n, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, sm.m.tensors[0].name));
    assert_non_null(strstr(err.message, "cover"));
    /* rank 1's piece of tensor 0 grown by one row into rank 0's */
    memcpy(fewer, sm.p, sm.np * sizeof(*sm.p));
    fewer[k].r0 -= 1, fewer[k].rows += 1;
    src.n_pieces = sm.np;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_reshard_plan(wsync_shim_find("sglang")->map, &sm.e.ops,
                                        (wsync_reshard_place_t){0, 0}, &src, &plan, &n, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, sm.m.tensors[0].name));
    assert_non_null(strstr(err.message, "overlap"));
    /* a trainer tp that does not divide the kv heads (Megatron splits whole query groups) */
    const wsync_reshard_trainer_t odd = {.tp = 4, .fsdp = 1, .dp = 1, .pp = 1, .kv_heads = 2};
    wsync_reshard_piece_t *q = NULL;
    size_t nq = 0;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_reshard_trainer_layout(wsync_shim_find("sglang")->map, &odd, sm.td,
                                                  sm.m.n, &q, &nq, NULL, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    if (strstr(err.message, "k_proj") == NULL)
        fail_msg("%s", err.message);
    assert_non_null(strstr(err.message, "kv heads"));
    free(fewer);
    small_close(&sm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_fsdp_grid),       cmocka_unit_test(test_pp_and_replicas),
        cmocka_unit_test(test_ep_across_replicas), cmocka_unit_test(test_nearest_replica),
        cmocka_unit_test(test_bad_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
