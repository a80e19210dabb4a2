/* wsync plan CONFIG.json: the resharding plan of a trainer and an engine with different
 * parallelism (engine-shims/common/wsync_reshard.h), on paper: bytes per link kind, per rank,
 * the minimum off-GPU bytes and the lower bound on the sync's time from the links' bandwidths.
 * No GPU and no weights: the model is the config's tensor list, the engine's parameters the
 * reference engine's layout of it (testbed/engine/wsync_ref_layout.h). docs/RESHARD.md. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wsync_cli.h"
#include "wsync_plan_fanout.h"
#include "wsync_ref_layout.h"
#include "wsync_reshard.h"
#include "wsync_shim.h"

typedef struct plan_opts {
    const char *config, *engine;
    wsync_reshard_trainer_t trainer;
    uint32_t etp, eep, gpn;
    double nvlink_gbs, net_gbs, hbm_gbs;
    int json;
} plan_opts_t;

/* An engine rank's parameters (the reference layout) as its registry answers for them; planning
 * only: the arena is a base address that is never written. */
typedef struct plan_engine {
    wsync_ref_layout_t l;
    wsync_ref_view_t view;
} plan_engine_t;

/* The engine rank on GPU g: TP rank g mod tp; EP inside its TP group when ep <= tp, else EP rank
 * g mod ep across replicas (expert TP 1). */
static int engine_build(plan_engine_t *e, const plan_opts_t *o, const wsync_model_config_t *cfg,
                        uint32_t g, char *why, size_t len)
{
    memset(e, 0, sizeof(*e));
    const uint32_t rank = g % o->etp;
    const int inside = o->eep <= o->etp;
    const uint32_t ep_rank = inside ? rank / (o->etp / o->eep) : g % o->eep;
    const uint32_t mtp = inside ? o->etp / o->eep : 1;
    if (wsync_ref_layout_build(&e->l, o->engine, cfg, rank, o->etp, why, len) != 0)
        return -1;
    if (o->eep > 1 && wsync_ref_layout_ep(&e->l, ep_rank, o->eep, mtp) != 0)
        return snprintf(why, len, "ep %u and tp %u do not fit", o->eep, o->etp), -1;
    e->view = (wsync_ref_view_t){.l = &e->l,
                                 .arena = (unsigned char *)(uintptr_t)4096u,
                                 .ep_rank = ep_rank,
                                 .ep_size = o->eep,
                                 .mtp_size = mtp};
    return 0;
}

static void engine_free(plan_engine_t *e)
{
    wsync_ref_layout_free(&e->l);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s != NULL && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s != NULL)
        s[n] = '\0';
    fclose(f);
    return s;
}

static int parse_trainer(const char *arg, wsync_reshard_trainer_t *t)
{
    *t = (wsync_reshard_trainer_t){.tp = 1, .fsdp = 1, .dp = 1, .pp = 1};
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", arg);
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        unsigned v = 0;
        if (sscanf(tok, "tp=%u", &v) == 1)
            t->tp = v;
        else if (sscanf(tok, "fsdp=%u", &v) == 1)
            t->fsdp = v;
        else if (sscanf(tok, "dp=%u", &v) == 1)
            t->dp = v;
        else if (sscanf(tok, "pp=%u", &v) == 1)
            t->pp = v;
        else if (sscanf(tok, "ep=%u", &v) == 1)
            t->ep = v;
        else
            return -1;
        if (v == 0)
            return -1;
    }
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: wsync plan CONFIG.json --trainer tp=T,fsdp=F,dp=D,pp=P[,ep=X]\n"
            "                  --engine sglang|vllm|lmdeploy --engine-tp N [--engine-ep E]\n"
            "                  [--gpus-per-node G] [--nvlink-gbs B] [--net-gbs B] [--hbm-gbs B]\n"
            "                  [--json]\n"
            "       wsync plan --fanout ... (wsync plan --fanout --help)\n"
            "  The resharding plan of a Hugging Face config.json's model (bf16) from a trainer\n"
            "  of T x F x D x P ranks (rank r on GPU r; ep=X: expert parallelism over the F\n"
            "  ranks) into engine replicas of N ranks over the same GPUs (replica j's rank i on\n"
            "  GPU j N + i), EP E inside each replica's TP group when E <= N, else across\n"
            "  replicas (GPU g holds EP rank g mod E's experts, expert TP 1: DP attention):\n"
            "  bytes per link (the same GPU, NVLink inside a node of G GPUs, the network between\n"
            "  nodes), per rank, the minimum off-GPU bytes, and the lower bound on the time from\n"
            "  the links' bandwidths (GB/s per GPU, defaults 450, 50 and 4000); --json\n"
            "  adds the exact numbers as one JSON line at the end.\n");
}

static int parse(int argc, char **argv, plan_opts_t *o)
{
    *o = (plan_opts_t){.engine = "sglang",
                       .etp = 1,
                       .eep = 1,
                       .gpn = 8,
                       .nvlink_gbs = 450,
                       .net_gbs = 50,
                       .hbm_gbs = 4000};
    int have_trainer = 0;
    parse_trainer("tp=1", &o->trainer);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--trainer") == 0 && v && parse_trainer(v, &o->trainer) == 0)
            have_trainer = 1, i++;
        else if (strcmp(a, "--engine") == 0 && v)
            o->engine = v, i++;
        else if (strcmp(a, "--engine-tp") == 0 && v)
            o->etp = (uint32_t)atoi(v), i++;
        else if (strcmp(a, "--engine-ep") == 0 && v)
            o->eep = (uint32_t)atoi(v), i++;
        else if (strcmp(a, "--gpus-per-node") == 0 && v)
            o->gpn = (uint32_t)atoi(v), i++;
        else if (strcmp(a, "--nvlink-gbs") == 0 && v)
            o->nvlink_gbs = atof(v), i++;
        else if (strcmp(a, "--net-gbs") == 0 && v)
            o->net_gbs = atof(v), i++;
        else if (strcmp(a, "--hbm-gbs") == 0 && v)
            o->hbm_gbs = atof(v), i++;
        else if (strcmp(a, "--json") == 0)
            o->json = 1;
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (o->config == NULL && a[0] != '-')
            o->config = a;
        else {
            fprintf(stderr, "wsync plan: unexpected or incomplete argument '%s'\n", a);
            return -1;
        }
    }
    const uint32_t world = o->trainer.tp * o->trainer.fsdp * o->trainer.dp * o->trainer.pp;
    const int ep_fits =
        o->eep != 0 && o->etp != 0 &&
        (o->eep <= o->etp ? o->etp % o->eep == 0 : o->eep % o->etp == 0 && world % o->eep == 0);
    if (o->config == NULL || !have_trainer || o->etp == 0 || !ep_fits || o->gpn == 0 ||
        world % o->etp != 0 || o->nvlink_gbs <= 0 || o->net_gbs <= 0 || o->hbm_gbs <= 0) {
        fprintf(stderr,
                "wsync plan: name a config.json and --trainer; --engine-tp must divide the %u "
                "trainer ranks, --engine-ep divide the engine's tp or be a multiple of it that "
                "divides the ranks; bandwidths above 0\n",
                world);
        return -1;
    }
    return 0;
}

typedef struct plan_totals {
    wsync_reshard_bytes_t all;
    uint64_t (*in)[WSYNC_LINKS];  /* per engine rank (by GPU) */
    uint64_t (*out)[WSYNC_LINKS]; /* per trainer rank */
    uint64_t needed;              /* bytes every engine rank must write, summed */
} plan_totals_t;

static void report(const plan_opts_t *o, const wsync_model_t *m, uint32_t world,
                   const plan_totals_t *t, double secs)
{
    static const char *const link[WSYNC_LINKS] = {"local", "nvlink", "network"};
    uint64_t in_max[WSYNC_LINKS] = {0}, out_max[WSYNC_LINKS] = {0};
    double bound = 0;
    const char *why = "";
    const double bw[WSYNC_LINKS] = {o->hbm_gbs / 2, o->nvlink_gbs, o->net_gbs};
    for (uint32_t g = 0; g < world; g++)
        for (int k = 0; k < WSYNC_LINKS; k++) {
            in_max[k] = t->in[g][k] > in_max[k] ? t->in[g][k] : in_max[k];
            out_max[k] = t->out[g][k] > out_max[k] ? t->out[g][k] : out_max[k];
            /* a local copy reads and writes HBM; a link carries the bytes once each way */
            const double ti = (double)t->in[g][k] / (bw[k] * 1e9);
            const double to = k == WSYNC_LINK_LOCAL ? 0 : (double)t->out[g][k] / (bw[k] * 1e9);
            if (ti > bound)
                bound = ti,
                why = k == 0 ? "an engine rank's local copies" : "an engine rank's receive";
            if (to > bound)
                bound = to, why = "a trainer rank's send";
        }
    const uint64_t off = t->all.link[WSYNC_LINK_NVLINK] + t->all.link[WSYNC_LINK_NET];
    printf("model: %zu tensors, %.1f GB in bf16 (%s)\n", m->n, (double)m->payload_bytes / 1e9,
           o->config);
    printf("trainer: tp %u x fsdp %u x dp %u x pp %u = %u GPUs on %u nodes of %u\n", o->trainer.tp,
           o->trainer.fsdp, o->trainer.dp, o->trainer.pp, world, (world + o->gpn - 1) / o->gpn,
           o->gpn);
    printf("engine: %s tp %u ep %u (%s), %u replicas; %" PRIu64 " copy ops, planned in %.1f s\n",
           o->engine, o->etp, o->eep, o->eep <= o->etp ? "inside each TP group" : "across replicas",
           world / o->etp, t->all.ops, secs);
    printf("bytes the engine ranks write: %.1f GB\n", (double)t->needed / 1e9);
    for (int k = 0; k < WSYNC_LINKS; k++)
        printf("  %-8s %10.1f GB  max per engine rank in %8.2f GB, per trainer rank out %8.2f GB\n",
               link[k], (double)t->all.link[k] / 1e9, (double)in_max[k] / 1e9,
               (double)out_max[k] / 1e9);
    printf("off-GPU bytes: %.1f GB, the minimum (every byte an engine rank needs that no trainer "
           "rank on its GPU holds; no byte moves twice, no tensor is gathered)\n",
           (double)off / 1e9);
    printf("lower bound on the sync's time: %.1f ms (%s; GB/s per GPU: NVLink %.0f, network "
           "%.0f, HBM %.0f)\n",
           bound * 1e3, why, o->nvlink_gbs, o->net_gbs, o->hbm_gbs);
    if (o->json) { /* the same numbers, exact, on the last line */
        printf("{\"tensors\":%zu,\"model_bytes\":%" PRIu64 ",\"gpus\":%u,\"engine_ranks\":%u,"
               "\"needed\":%" PRIu64 ",\"local\":%" PRIu64 ",\"nvlink\":%" PRIu64
               ",\"network\":%" PRIu64 ",\"ops\":%" PRIu64 ",\"max_in\":[%" PRIu64 ",%" PRIu64
               ",%" PRIu64 "],\"max_out\":[%" PRIu64 ",%" PRIu64 ",%" PRIu64
               "],\"bound_s\":%.9g}\n",
               m->n, m->payload_bytes, world, world, t->needed, t->all.link[0], t->all.link[1],
               t->all.link[2], t->all.ops, in_max[0], in_max[1], in_max[2], out_max[0], out_max[1],
               out_max[2], bound);
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--fanout") == 0)
            return wsync_plan_fanout(argc, argv);
    plan_opts_t o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    const wsync_shim_t *shim = wsync_shim_find(o.engine);
    char *json = read_text(o.config);
    if (shim == NULL || json == NULL) {
        fprintf(stderr, "wsync plan: %s\n",
                shim == NULL ? "--engine is sglang, vllm or lmdeploy" : "cannot read the config");
        free(json);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const wsync_model_config_t cfg = {.config_json = json};
    wsync_model_t m;
    char why[512];
    int rc = 1;
    wsync_tensor_desc_t *td = NULL;
    wsync_reshard_piece_t *pieces = NULL;
    wsync_reshard_place_t *place = NULL;
    wsync_reshard_index_t *idx = NULL;
    plan_engine_t *eng = NULL;
    plan_totals_t tot = {0};
    size_t np = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    const uint32_t world = o.trainer.tp * o.trainer.fsdp * o.trainer.dp * o.trainer.pp;
    if (wsync_model_build(&m, &cfg, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync plan: %s: %s\n", o.config, why);
        free(json);
        return 1;
    }
    td = calloc(m.n, sizeof(*td));
    place = calloc(world, sizeof(*place));
    eng = calloc(o.etp, sizeof(*eng));
    tot.in = calloc(world, sizeof(*tot.in));
    tot.out = calloc(world, sizeof(*tot.out));
    if (td == NULL || place == NULL || eng == NULL || tot.in == NULL || tot.out == NULL)
        goto out;
    for (size_t i = 0; i < m.n; i++) {
        const wsync_model_tensor_t *x = &m.tensors[i];
        td[i] = (wsync_tensor_desc_t){.struct_size = sizeof(td[i]),
                                      .name = x->name,
                                      .dtype = x->dtype,
                                      .ndim = x->ndim,
                                      .nbytes = x->nbytes};
        memcpy(td[i].shape, x->shape, sizeof(x->shape));
    }
    for (uint32_t r = 0; r < world; r++)
        place[r] = (wsync_reshard_place_t){.gpu = r, .node = r / o.gpn};
    if (wsync_reshard_trainer_layout(shim->map, &o.trainer, td, m.n, &pieces, &np, NULL, &err) !=
        WSYNC_OK) {
        fprintf(stderr, "wsync plan: trainer: %s\n", err.message);
        goto out;
    }
    const wsync_reshard_src_t src = {td, m.n, pieces, np, place, world};
    if (wsync_reshard_index_build(&src, &idx, &err) != WSYNC_OK) {
        fprintf(stderr, "wsync plan: trainer: %s\n", err.message);
        goto out;
    }
    /* EP inside the TP group: one layout per TP rank serves every replica; across replicas each
     * GPU's is its own, built in turn */
    const int per_gpu = o.eep > o.etp;
    for (uint32_t i = 0; !per_gpu && i < o.etp; i++)
        if (engine_build(&eng[i], &o, &cfg, i, why, sizeof(why)) != 0) {
            fprintf(stderr, "wsync plan: engine rank %u: %s\n", i, why);
            goto out;
        }
    for (uint32_t g = 0; g < world; g++) {
        const uint32_t i = g % o.etp;
        if (per_gpu && engine_build(&eng[i], &o, &cfg, g, why, sizeof(why)) != 0) {
            fprintf(stderr, "wsync plan: engine rank on GPU %u: %s\n", g, why);
            goto out;
        }
        const wsync_engine_ops_t ops = wsync_ref_view_ops(&eng[i].view);
        wsync_reshard_op_t *ops_out = NULL;
        size_t n = 0;
        wsync_result_t prc =
            wsync_reshard_plan_indexed(shim->map, &ops, place[g], &src, idx, &ops_out, &n, &err);
        if (per_gpu)
            engine_free(&eng[i]), memset(&eng[i], 0, sizeof(eng[i]));
        if (prc != WSYNC_OK) {
            fprintf(stderr, "wsync plan: engine rank on GPU %u: %s\n", g, err.message);
            goto out;
        }
        wsync_reshard_bytes_t in = {0};
        wsync_reshard_count(ops_out, n, &in, tot.out);
        for (int k = 0; k < WSYNC_LINKS; k++) {
            tot.in[g][k] += in.link[k];
            tot.all.link[k] += in.link[k];
            tot.needed += in.link[k];
        }
        tot.all.ops += in.ops;
        wsync_reshard_free(ops_out);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    report(&o, &m, world, &tot,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    rc = 0;
out:
    for (uint32_t i = 0; eng != NULL && i < o.etp; i++)
        engine_free(&eng[i]);
    free(eng);
    wsync_reshard_index_free(idx);
    wsync_reshard_free(pieces);
    free(place);
    free(td);
    free(tot.in);
    free(tot.out);
    wsync_model_free(&m);
    free(json);
    return rc;
}
