/* wsync bench: the plugin's consumer copy against the baselines measured in the same run — one
 * memcpy of the whole payload (the memory system's limit) and a per-tensor memcpy loop (what
 * engines do today). One process; the CUDA plugin has its own program, wsync-bench-cuda. */
#define _GNU_SOURCE
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_cli.h"
#include "wsync_model_opt.h"

typedef struct wsync_bench_options {
    const char *plugin;
    wsync_model_config_t model; /* layout: dense, moe or both; layers: moe's, 0 = 12 */
    unsigned iters;
} wsync_bench_options_t;

typedef struct wsync_bench {
    const wsync_bench_options_t *o;
    wsync_loader_t l;
    const wsync_consumer_ops_t *cops;
    const wsync_producer_ops_t *pops;
    wsync_consumer_t *c;
    wsync_stream_t cstream;
} wsync_bench_t;

static void wsync_bench_usage(FILE *out)
{
    fprintf(out, "usage: wsync bench [--plugin PATH] [--layout dense|moe|both] [--iters N]\n"
                 "                   [--scale S] [--layers L]\n"
                 "  --iters   timed iterations per method, the median is reported (default 5)\n"
                 "  --scale   divide large dims by S (default 8; 1 = the real 16 GB models)\n"
                 "  --layers  MoE layers (default 12: 4 719 tensors)\n"
                 "With the cuda plugin this runs wsync-bench-cuda with the same arguments.\n");
}

static int wsync_bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double wsync_bench_median(double *t, unsigned n)
{
    qsort(t, n, sizeof(*t), wsync_bench_cmp);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* The CUDA plugin is measured by its own program (device buffers, events). */
static int wsync_bench_exec_cuda(int argc, char **argv)
{
    char path[PATH_MAX + 32];

    if (wsync_cli_sibling(path, sizeof(path), "wsync-bench-cuda") != 0) {
        fprintf(stderr, "wsync bench: cannot find the directory of this executable\n");
        return 1;
    }
    if (access(path, X_OK) != 0) {
        fprintf(stderr,
                "wsync bench: the loaded plugin is 'cuda', which is benchmarked by %s, and that "
                "program is missing; build with -DWSYNC_WITH_CUDA=ON, or pass --plugin "
                "libwsync_cpu.so to bench the CPU plugin\n",
                path);
        return 1;
    }
    printf("wsync bench: plugin is cuda; running %s\n", path);
    wsync_cli_exec(path, NULL, argc, argv);
    fprintf(stderr, "wsync bench: exec %s failed\n", path);
    return 1;
}

/* Per-layout buffers. src/dst: host baselines; psrc/pdst: plugin memory. */
typedef struct wsync_bench_run {
    wsync_model_t m;
    unsigned char *src, *dst;
    void *psrc, *pdst;
    wsync_staging_t *s;
    wsync_stream_t pstream;
    int have_pstream;
    wsync_handle_t *h;
    wsync_copy_op_t *ops;
    wsync_stage_tensor_t *stage;
    uint64_t gen;
} wsync_bench_run_t;

static double wsync_bench_memcpy_one(wsync_bench_run_t *r)
{
    double t0 = wsync_cli_now();
    memcpy(r->dst, r->src, r->m.packed_bytes);
    return wsync_cli_now() - t0;
}

static double wsync_bench_memcpy_loop(wsync_bench_run_t *r)
{
    double t0 = wsync_cli_now();
    for (size_t i = 0; i < r->m.n; i++) {
        const wsync_model_tensor_t *t = &r->m.tensors[i];
        memcpy(r->dst + t->offset, r->src + t->offset, t->nbytes);
    }
    return wsync_cli_now() - t0;
}

/* One whole-model bucket: stage + publish + parse (not timed), then copy_weights +
 * record_consumed(wait=1) timed. Returns seconds, or -1 on failure (printed). */
static double wsync_bench_plugin_once(wsync_bench_t *b, wsync_bench_run_t *r, uint32_t flags)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_manifest_t *man = NULL;
    const char *json = NULL;
    wsync_result_t rc;
    double t0, dt;

    if (r->gen != 0 && (rc = b->pops->wait_consumed(r->s, r->pstream, r->gen, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "wait_consumed", rc, &err), -1;
    if ((rc = b->pops->stage(r->s, r->pstream, r->stage, r->m.n, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "stage", rc, &err), -1;
    if ((rc = b->pops->publish(r->s, r->pstream, 1, &json, &r->gen, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "publish", rc, &err), -1;
    if (r->have_pstream && WSYNC_HAS_OP(wsync_producer_ops_t, b->pops, stream_synchronize) &&
        (rc = b->pops->stream_synchronize(r->s, r->pstream, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "producer stream_synchronize", rc, &err), -1;
    if ((rc = b->cops->parse_manifest(b->c, json, strlen(json), &man, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "parse_manifest", rc, &err), -1;
    if (man->n_tensors != r->m.n) {
        fprintf(stderr, "wsync bench: manifest has %zu tensors, expected %zu\n", man->n_tensors,
                r->m.n);
        b->cops->manifest_free(b->c, man);
        return -1;
    }
    if (r->h == NULL && (rc = b->cops->open_handle(b->c, &man->buffer, &r->h, &err)) != WSYNC_OK) {
        b->cops->manifest_free(b->c, man);
        return wsync_cli_report("bench", "open_handle", rc, &err), -1;
    }
    for (size_t i = 0; i < man->n_tensors; i++) {
        /* by name, as an engine does: the plugin packs in its own order (docs/ABI.md) */
        const wsync_tensor_desc_t *d = &man->tensors[i];
        long idx = wsync_model_find(&r->m, d->name);
        if (idx < 0 || r->m.tensors[idx].nbytes != d->nbytes) {
            fprintf(stderr, "wsync bench: manifest tensor %s is no model tensor of %llu bytes\n",
                    d->name, (unsigned long long)d->nbytes);
            b->cops->manifest_free(b->c, man);
            return -1;
        }
        const wsync_model_tensor_t *t = &r->m.tensors[idx];
        r->ops[i] = (wsync_copy_op_t){.src_offset = d->offset,
                                      .src_pitch = d->nbytes,
                                      .dst = (char *)r->pdst + t->offset,
                                      .dst_pitch = t->nbytes,
                                      .dst_extent = t->nbytes,
                                      .rows = 1,
                                      .row_bytes = d->nbytes,
                                      .digest = d->digest,
                                      .has_digest = d->has_digest};
    }
    b->cops->manifest_free(b->c, man);

    t0 = wsync_cli_now();
    rc = b->cops->copy_weights(b->c, r->h, b->cstream, r->gen, r->ops, r->m.n, flags, &err);
    if (rc == WSYNC_OK)
        rc = b->cops->record_consumed(b->c, r->h, 1, &err);
    dt = wsync_cli_now() - t0;
    if (rc != WSYNC_OK)
        return wsync_cli_report("bench", "copy_weights/record_consumed", rc, &err), -1;
    return dt;
}

static int wsync_bench_setup_run(wsync_bench_t *b, wsync_bench_run_t *r, const char *layout)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_model_config_t cfg = {
        .layout = layout,
        .scale = b->o->model.scale,
        .layers = strcmp(layout, "moe") == 0 ? (b->o->model.layers ? b->o->model.layers : 12) : 0,
        .model_dir = b->o->model.model_dir};
    wsync_staging_config_t scfg = {.struct_size = sizeof(scfg), .timeout_ms = 60000};
    char why[160];
    wsync_result_t rc;
    unsigned char *scratch;

    if (wsync_model_build(&r->m, &cfg, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync bench: %s\n", why);
        return 1;
    }
    r->src = aligned_alloc(4096, (r->m.packed_bytes + 4095) / 4096 * 4096);
    r->dst = aligned_alloc(4096, (r->m.packed_bytes + 4095) / 4096 * 4096);
    r->ops = calloc(r->m.n, sizeof(*r->ops));
    r->stage = calloc(r->m.n, sizeof(*r->stage));
    if (r->src == NULL || r->dst == NULL || r->ops == NULL || r->stage == NULL) {
        fprintf(stderr, "wsync bench: out of host memory for %llu-byte buffers\n",
                (unsigned long long)r->m.packed_bytes);
        return 1;
    }
    memset(r->src, 0, r->m.packed_bytes);
    memset(r->dst, 0, r->m.packed_bytes);
    for (size_t i = 0; i < r->m.n; i++)
        wsync_model_fill(&r->m.tensors[i], 1, r->src + r->m.tensors[i].offset);
    scratch = r->dst; /* zeros, to fault in the plugin's destination */
    if ((rc = b->cops->mem_alloc(b->c, r->m.packed_bytes, &r->psrc, &err)) != WSYNC_OK ||
        (rc = b->cops->mem_alloc(b->c, r->m.packed_bytes, &r->pdst, &err)) != WSYNC_OK ||
        (rc = b->cops->mem_copy(b->c, r->psrc, r->src, r->m.packed_bytes, 0, &err)) != WSYNC_OK ||
        (rc = b->cops->mem_copy(b->c, r->pdst, scratch, r->m.packed_bytes, 0, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "mem_alloc/mem_copy", rc, &err);
    for (size_t i = 0; i < r->m.n; i++) {
        const wsync_model_tensor_t *t = &r->m.tensors[i];
        r->stage[i] = (wsync_stage_tensor_t){.struct_size = sizeof(r->stage[i]),
                                             .name = t->name,
                                             .dtype = t->dtype,
                                             .ndim = t->ndim,
                                             .src = (char *)r->psrc + t->offset};
        memcpy(r->stage[i].shape, t->shape, sizeof(t->shape));
    }
    scfg.bytes = r->m.packed_bytes + (1u << 20);
    if ((rc = b->pops->create(&scfg, &r->s, &err)) != WSYNC_OK)
        return wsync_cli_report("bench", "staging create", rc, &err);
    if (WSYNC_HAS_OP(wsync_producer_ops_t, b->pops, stream_create)) {
        if ((rc = b->pops->stream_create(r->s, &r->pstream, &err)) != WSYNC_OK)
            return wsync_cli_report("bench", "producer stream_create", rc, &err);
        r->have_pstream = 1;
    }
    return 0;
}

static void wsync_bench_teardown_run(wsync_bench_t *b, wsync_bench_run_t *r)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (r->h != NULL)
        b->cops->close_handle(b->c, r->h, &err);
    if (r->have_pstream)
        b->pops->stream_destroy(r->s, r->pstream, &err);
    if (r->s != NULL && b->pops->retire(r->s, &err) != WSYNC_OK)
        wsync_cli_report("bench", "retire", err.code, &err);
    if (WSYNC_HAS_OP(wsync_consumer_ops_t, b->cops, mem_free)) {
        if (r->psrc != NULL)
            b->cops->mem_free(b->c, r->psrc, &err);
        if (r->pdst != NULL)
            b->cops->mem_free(b->c, r->pdst, &err);
    }
    free(r->src);
    free(r->dst);
    free(r->ops);
    free(r->stage);
    wsync_model_free(&r->m);
}

static void wsync_bench_row(const char *what, double s, uint64_t bytes, double base_s,
                            double loop_s)
{
    printf("  %-28s %9.2f %9.2f %10.3fx %12.3fx\n", what, s * 1e3, (double)bytes / s / 1e9,
           base_s / s, loop_s / s);
}

/* Content check of the plugin path: the destination must equal the source image. */
static int wsync_bench_check(wsync_bench_t *b, wsync_bench_run_t *r)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t rc = b->cops->mem_copy(b->c, r->dst, r->pdst, r->m.packed_bytes, 1, &err);

    if (rc != WSYNC_OK)
        return wsync_cli_report("bench", "mem_copy back", rc, &err);
    for (size_t i = 0; i < r->m.n; i++) {
        const wsync_model_tensor_t *t = &r->m.tensors[i];
        if (memcmp(r->dst + t->offset, r->src + t->offset, t->nbytes) != 0) {
            fprintf(stderr, "wsync bench: plugin copy of %s is wrong\n", t->name);
            return 1;
        }
    }
    return 0;
}

static int wsync_bench_layout(wsync_bench_t *b, const char *layout)
{
    unsigned n = b->o->iters;
    double *t[4];
    double med[4];
    wsync_bench_run_t r;
    int rc;

    memset(&r, 0, sizeof(r));
    for (int k = 0; k < 4; k++)
        t[k] = calloc(n, sizeof(double));
    rc = (t[0] && t[1] && t[2] && t[3]) ? wsync_bench_setup_run(b, &r, layout) : 1;
    /* One untimed warm-up of every method, then n timed rounds interleaved. */
    for (unsigned i = 0; rc == 0 && i <= n; i++) {
        double x[4];
        x[0] = wsync_bench_memcpy_one(&r);
        x[1] = wsync_bench_memcpy_loop(&r);
        x[2] = wsync_bench_plugin_once(b, &r, 0);
        x[3] = x[2] < 0 ? -1 : wsync_bench_plugin_once(b, &r, WSYNC_COPY_VERIFY);
        if (x[2] < 0 || x[3] < 0)
            rc = 1;
        for (int k = 0; rc == 0 && i > 0 && k < 4; k++)
            t[k][i - 1] = x[k];
    }
    if (rc == 0)
        rc = wsync_bench_check(b, &r);
    if (rc == 0) {
        for (int k = 0; k < 4; k++)
            med[k] = wsync_bench_median(t[k], n);
        printf("%s: %zu tensors, %.1f MiB payload\n", b->o->model.model_dir ? r.m.layout : layout,
               r.m.n, (double)r.m.payload_bytes / (1 << 20));
        printf("  %-28s %9s %9s %11s %13s\n", "method", "ms", "GB/s", "vs memcpy", "vs per-tensor");
        wsync_bench_row("memcpy, one call", med[0], r.m.packed_bytes, med[0], med[1]);
        wsync_bench_row("memcpy, per tensor", med[1], r.m.payload_bytes, med[0], med[1]);
        wsync_bench_row("copy_weights", med[2], r.m.payload_bytes, med[0], med[1]);
        wsync_bench_row("copy_weights + verify", med[3], r.m.payload_bytes, med[0], med[1]);
        if (strcmp(layout, "dense") == 0)
            printf("  target copy_weights >= 0.80x memcpy: %s (%.3fx)\n",
                   med[0] / med[2] >= 0.8 ? "met" : "NOT met", med[0] / med[2]);
        fflush(stdout);
    }
    wsync_bench_teardown_run(b, &r);
    for (int k = 0; k < 4; k++)
        free(t[k]);
    return rc;
}

static int wsync_bench_parse(int argc, char **argv, wsync_bench_options_t *o)
{
    static const struct option longopts[] = {{"plugin", required_argument, NULL, 'p'},
                                             WSYNC_MODEL_LONGOPTS,
                                             {"iters", required_argument, NULL, 'i'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int c;

    *o = (wsync_bench_options_t){.model = {.layout = "both", .scale = 8}, .iters = 5};
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (wsync_model_option(&o->model, c, optarg))
            continue;
        switch (c) {
        case 'p':
            o->plugin = optarg;
            break;
        case 'i':
            o->iters = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'h':
            wsync_bench_usage(stdout);
            return 1;
        default:
            wsync_bench_usage(stderr);
            return 2;
        }
    }
    if (optind != argc || o->iters < 1 || o->model.scale < 1 ||
        (strcmp(o->model.layout, "dense") != 0 && strcmp(o->model.layout, "moe") != 0 &&
         strcmp(o->model.layout, "both") != 0)) {
        fprintf(stderr,
                "wsync bench: bad arguments (layout dense|moe|both, iters and scale >= 1)\n");
        wsync_bench_usage(stderr);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_consumer_config_t cfg = {.struct_size = sizeof(cfg), .timeout_ms = 60000};
    wsync_bench_options_t o;
    wsync_bench_t b;
    wsync_host_t host;
    wsync_result_t r;
    int rc = wsync_bench_parse(argc, argv, &o);

    if (rc != 0)
        return rc == 1 ? 0 : rc;
    memset(&b, 0, sizeof(b));
    b.o = &o;
    wsync_cli_host(&host, "bench");
    if (wsync_cli_load(&b.l, o.plugin, &host) != 0)
        return 1;
    if (b.l.plugin->name != NULL && strcmp(b.l.plugin->name, "cuda") == 0) {
        wsync_loader_close(&b.l);
        return wsync_bench_exec_cuda(argc, argv);
    }
    b.cops = b.l.plugin->consumer;
    b.pops = b.l.plugin->producer;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, b.cops, mem_alloc) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, b.cops, mem_copy)) {
        fprintf(stderr, "wsync bench: plugin %s lacks mem_alloc/mem_copy\n", b.l.path);
        wsync_loader_close(&b.l);
        return 1;
    }
    if ((r = b.cops->create(&cfg, &b.c, &err)) != WSYNC_OK) {
        wsync_loader_close(&b.l);
        return wsync_cli_report("bench", "consumer create", r, &err);
    }
    printf("wsync bench: plugin %s %s (%s), ABI %u, scale %u, median of %u iterations\n",
           b.l.plugin->name, b.l.plugin->version, b.l.path, b.l.abi_version, o.model.scale,
           o.iters);
    if (o.model.model_dir != NULL) /* a checkpoint: its own tensor list, once */
        rc = wsync_bench_layout(&b, "dense");
    else {
        if (strcmp(o.model.layout, "moe") != 0)
            rc = wsync_bench_layout(&b, "dense");
        if (rc == 0 && strcmp(o.model.layout, "dense") != 0)
            rc = wsync_bench_layout(&b, "moe");
    }
    b.cops->finalize(b.c, &err);
    wsync_loader_close(&b.l);
    return rc;
}
