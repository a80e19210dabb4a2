/* See wsync_bench_direct.h. Messages: consumer -> producer "direct-separate <ramp>" |
 * "direct-one <ramp>" | "direct-vmm <ramp>" | "direct-torch <ramp>" (answered "ready"; ramp
 * "steps:growth"), then "dsync" (a sync not timed by the trainer) or "dsync-t" (timed), each
 * answered by the bucket manifests and closed by the consumer's "ack", then "dend" (answered
 * "dended <trainer ms> <stage ms> <publish ms> <syncs>").
 */
#include "wsync_bench_direct.h"

#include <string.h>
#include <unistd.h>

#include "wsync_bench_pool.h"
#include "wsync_bench_vmm.h"

#define WB_WARMUP_DIRECT 3

/* The direct plan's smaller first buckets (wb_plan_build): by default 3 of them at 1/8, 1/4, 1/2
 * of the bucket size, as Producer(direct=True) plans. WSYNC_BENCH_DIRECT_RAMP="steps:growth,..."
 * (e.g. "3:2,8:1.4") runs the separate trainer's rows once per ramp, the one-allocation rows with
 * the first; the engine process reads it and names each ramp to the trainer in its request. */
typedef struct wb_ramp {
    unsigned steps;
    double growth;
} wb_ramp_t;

#define WB_MAX_RAMPS 8

static int wb_ramp_parse(const char *v, wb_ramp_t *r)
{
    return sscanf(v, "%u:%lf", &r->steps, &r->growth) == 2 && r->steps <= 32 && r->growth >= 1.0;
}

static size_t wb_direct_ramps(wb_ramp_t *out)
{
    out[0] = (wb_ramp_t){3, 2.0};
    const char *v = getenv("WSYNC_BENCH_DIRECT_RAMP");
    if (v == NULL || *v == '\0')
        return 1;
    size_t n = 0;
    for (const char *at = v; at != NULL && n < WB_MAX_RAMPS; n++) {
        if (!wb_ramp_parse(at, &out[n])) {
            fprintf(stderr,
                    "wsync-bench-cuda: WSYNC_BENCH_DIRECT_RAMP=\"%s\": want steps:growth[,...], "
                    "steps <= 32, growth >= 1, at most %d\n",
                    v, WB_MAX_RAMPS);
            exit(2);
        }
        at = strchr(at, ',');
        at = at ? at + 1 : NULL;
    }
    return n;
}

/* The payload bytes of bucket b. */
static uint64_t wb_bucket_bytes(const wb_layout_t *l, const wb_plan_t *p, size_t b)
{
    uint64_t n = 0;
    for (size_t k = p->b[b].first; k < p->b[b].first + p->b[b].count; k++)
        n += (uint64_t)p->p[k].rows * (uint64_t)l->t[p->p[k].tensor].cols * 2u;
    return n;
}

/* How the trainer named in an (e) row holds its tensors. */
static const char *wb_trainer_what(const char *trainer)
{
    if (strcmp(trainer, "separate") == 0)
        return "one cudaMalloc per tensor";
    if (strcmp(trainer, "vmm") == 0)
        return "every tensor in one cuMem range of 20 MiB chunks, as torch's expandable segments";
    if (strcmp(trainer, "torch") == 0)
        return "in cudaMalloc segments as torch's default caching allocator places them";
    return "every tensor in one allocation";
}

/* ------------------------------------------------------------------ producer */

static unsigned char **wb_separate_alloc(const wb_layout_t *l, cudaStream_t st)
{
    unsigned char **bases = calloc(l->n, sizeof(*bases));
    if (bases == NULL)
        return NULL;
    for (size_t i = 0; i < l->n; i++) {
        WB_CK(cudaMalloc((void **)&bases[i], l->t[i].bytes ? l->t[i].bytes : 1));
        /* the pattern the packed trainer holds at this tensor's offset */
        WB_CK(
            wh_fill_mask(bases[i], l->t[i].bytes, WB_SEED + l->t[i].offset / 8, WB_FILL_MASK, st));
    }
    WB_CK(cudaStreamSynchronize(st));
    return bases;
}

int wb_direct_serve(const wsync_plugin_t *p, int fd, cudaStream_t st, const wb_layout_t *l,
                    uint64_t bucket, unsigned char *packed, const char *m)
{
    unsigned char **bases = NULL;
    if (strncmp(m, "direct-separate ", 16) == 0 && (bases = wb_separate_alloc(l, st)) == NULL) {
        fprintf(stderr, "wsync-bench-cuda producer: no host memory for %zu tensors\n", l->n);
        exit(1);
    }
    wb_pool_t pool = {0};
    if (strncmp(m, "direct-torch ", 13) == 0) {
        uint64_t *bytes = calloc(l->n ? l->n : 1, sizeof(*bytes));
        for (size_t i = 0; bytes != NULL && i < l->n; i++)
            bytes[i] = l->t[i].bytes;
        if (bytes == NULL || wb_pool_place(bytes, l->n, &pool) != 0 ||
            (bases = wb_pool_alloc(&pool, l->n)) == NULL) {
            fprintf(stderr, "wsync-bench-cuda producer: no memory for torch's segments\n");
            exit(1);
        }
        free(bytes);
        printf("      trainer: torch's default allocator places the %zu tensors in %zu segments\n",
               l->n, pool.n_seg);
        fflush(stdout);
        for (size_t i = 0; i < l->n; i++)
            WB_CK(wh_fill_mask(bases[i], l->t[i].bytes, WB_SEED + l->t[i].offset / 8, WB_FILL_MASK,
                               st));
        WB_CK(cudaStreamSynchronize(st));
    }
    wb_vmm_t vmm = {0};
    if (strncmp(m, "direct-vmm ", 11) == 0) { /* the packed layout again, in cuMem chunks */
        packed = wb_vmm_alloc(l->packed, &vmm);
        WB_CK(wh_fill_mask(packed, l->packed, WB_SEED, WB_FILL_MASK, st));
        WB_CK(cudaStreamSynchronize(st));
    }
    wb_plan_t plan;
    wb_ramp_t ramp;
    const char *rs = strchr(m, ' ');
    if (rs == NULL || !wb_ramp_parse(rs + 1, &ramp)) {
        fprintf(stderr, "wsync-bench-cuda producer: request \"%s\": no ramp\n", m);
        exit(1);
    }
    if (wb_plan_build(l, bucket, ramp.steps, ramp.growth, &plan) != 0)
        exit(1);
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .flags = WSYNC_STAGING_DIRECT, .timeout_ms = 30000};
    wsync_staging_t *s;
    WB_OK(p->producer->create(&cfg, &s, err));
    wh_send_str(fd, "ready");
    double *t = NULL, stage_ms = 0, publish_ms = 0;
    unsigned nt = 0, cap = 0;
    for (;;) {
        char *req;
        wb_recv_expect(fd, "dsync", &req);
        const int end = strcmp(req, "dend") == 0, timed = strcmp(req, "dsync-t") == 0;
        free(req);
        if (end)
            break;
        const double t0 = wh_now_ms();
        double st_ms = 0, pub_ms = 0;
        uint64_t gen = 0;
        for (size_t b = 0; b < plan.nb; b++) {
            const double a = wh_now_ms();
            wb_stage_pieces(p, s, st, l, &plan, b, packed, bases);
            const double c = wh_now_ms();
            const char *json;
            WB_OK(p->producer->publish(s, st, b + 1 == plan.nb, &json, &gen, err));
            wh_send_str(fd, json);
            st_ms += c - a;
            pub_ms += wh_now_ms() - c;
        }
        char *ack;
        wb_recv_expect(fd, "ack", &ack);
        free(ack);
        /* the trainer may write its parameters again once this returns */
        WB_OK(p->producer->wait_consumed(s, st, gen, err));
        if (timed) {
            if (nt == cap) {
                cap = cap ? 2 * cap : 64;
                if ((t = realloc(t, cap * sizeof(*t))) == NULL)
                    exit(1);
            }
            t[nt++] = wh_now_ms() - t0;
            stage_ms += st_ms;
            publish_ms += pub_ms;
        }
    }
    wsync_error_t e = {.struct_size = sizeof(e)};
    wsync_result_t r;
    while ((r = p->producer->retire(s, &e)) == WSYNC_ERR_BUSY) { /* the consumer closes first */
        e.code = WSYNC_OK;
        usleep(1000);
    }
    if (r != WSYNC_OK) {
        fprintf(stderr, "wsync-bench-cuda producer: retire (direct): %s\n", e.message);
        exit(1);
    }
    char msg[128];
    snprintf(msg, sizeof(msg), "dended %.3f %.3f %.3f %u", nt ? wh_median(t, nt) : 0.0,
             nt ? stage_ms / nt : 0.0, nt ? publish_ms / nt : 0.0, nt);
    for (size_t i = 0; bases != NULL && pool.n_seg == 0 && i < l->n; i++)
        WB_CK(cudaFree(bases[i]));
    free(bases);
    wb_pool_free(&pool);
    wb_vmm_free(&vmm);
    free(t);
    wb_plan_free(&plan);
    wh_send_str(fd, msg);
    return 0;
}

/* ------------------------------------------------------------------ consumer */

/* The segments of one bucket held open across syncs (0 opens in the steady state), as an
 * engine's driver holds them; reopened when the manifest names other memory. */
typedef struct wb_held {
    wsync_buffer_desc_t *desc;
    wsync_handle_t **h;
    size_t n;
    wsync_handle_t *buffer; /* a reference to the manifest's buffer: its mapping stays cached */
} wb_held_t;

typedef struct wb_direct {
    wb_engine_t *E;
    int fd;
    uint64_t bucket;
    wb_ramp_t ramp; /* the plan's first buckets */
    wb_plan_t plan;
    wb_held_t *held; /* per bucket */
    double host[4];  /* consumer host ms summed: recv wait, parse + segments, copy_segments,
                      * record_consumed + close */
    /* the timed syncs' GPU timeline: an event when the request goes out (the stream is idle
     * then, so it completes at once), and per bucket one before and one after copy_segments */
    cudaEvent_t req, *before, *after;
    double line[4];  /* summed ms: request to the first copy, idle between buckets, copies, last
                      * copy to the stream synced on the host */
    double first[2]; /* summed ms of the first bucket: request to its manifest received (the
                      * trainer's stage + publish and the send), then its parse + segments + ops */
} wb_direct_t;

static int wb_same_segment(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return a->kind == b->kind && a->handle_len == b->handle_len && a->bytes == b->bytes &&
           a->base_offset == b->base_offset && memcmp(a->handle, b->handle, a->handle_len) == 0;
}

static void wb_held_close(wb_engine_t *E, wb_held_t *hd)
{
    for (size_t k = 0; k < hd->n; k++)
        WB_OK(E->p->consumer->close_handle(E->c, hd->h[k], err));
    free(hd->h);
    free(hd->desc);
    hd->h = NULL;
    hd->desc = NULL;
    hd->n = 0;
}

static void wb_held_update(wb_engine_t *E, wb_held_t *hd, const wsync_manifest_t *m)
{
    int same = hd->n == m->n_segments;
    for (size_t k = 0; same && k < hd->n; k++)
        same = wb_same_segment(&hd->desc[k], &m->segments[k]);
    if (same)
        return;
    wb_held_close(E, hd);
    hd->h = calloc(m->n_segments ? m->n_segments : 1, sizeof(*hd->h));
    hd->desc = calloc(m->n_segments ? m->n_segments : 1, sizeof(*hd->desc));
    if (hd->h == NULL || hd->desc == NULL)
        exit(1);
    for (size_t k = 0; k < m->n_segments; k++) {
        WB_OK(E->p->consumer->open_handle(E->c, &m->segments[k], &hd->h[k], err));
        hd->desc[k] = m->segments[k];
    }
    hd->n = m->n_segments;
}

static float wb_gap(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    WB_CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* Adds one synced sync's timeline (its wall ms from the request to the stream synced) to
 * D->line. An event recorded while the stream is busy completes when the work before it does,
 * so before[b] - after[b - 1] is the time the GPU had nothing of this sync's to do. */
static void wb_direct_line(wb_direct_t *D, double wall)
{
    const size_t nb = D->plan.nb;
    const double first = wb_gap(D->req, D->before[0]);
    double idle = 0, copies = 0;
    for (size_t b = 0; b < nb; b++) {
        copies += wb_gap(D->before[b], D->after[b]);
        if (b > 0)
            idle += wb_gap(D->after[b - 1], D->before[b]);
    }
    D->line[0] += first, D->line[1] += idle, D->line[2] += copies;
    D->line[3] += wall - (double)wb_gap(D->req, D->after[nb - 1]);
}

/* One direct sync; returns wall ms from the request to the engine stream's last copy, and with
 * gpu_only the copies' GPU time alone in *gpu_ms (every bucket queued behind a ~50 ms spin). */
static double wb_direct_sync(wb_direct_t *D, const char *req, int gpu_only, double *gpu_ms)
{
    wb_engine_t *E = D->E;
    const int line = !gpu_only && D->req != NULL;
    if (gpu_only) {
        WB_CK(wh_spin(WH_GPU_ALONE_SPIN_NS, E->st));
        WB_CK(cudaEventRecord(E->e0, E->st));
    }
    const double t0 = wh_now_ms();
    if (line)
        WB_CK(cudaEventRecord(D->req, E->st));
    wh_send_str(D->fd, req);
    for (size_t b = 0; b < D->plan.nb; b++) {
        char *json;
        size_t len;
        const double q0 = wh_now_ms();
        if (wh_recv(D->fd, &json, &len) != 0)
            exit(1);
        const double q1 = wh_now_ms();
        const wsync_manifest_t *m;
        WB_OK(E->p->consumer->parse_manifest(E->c, json, len, &m, err));
        wb_held_t *hd = &D->held[b];
        wsync_handle_t *h;
        WB_OK(E->p->consumer->open_handle(E->c, &m->buffer, &h, err));
        if (hd->buffer == NULL)
            WB_OK(E->p->consumer->open_handle(E->c, &m->buffer, &hd->buffer, err));
        wb_held_update(E, hd, m);
        wsync_copy_op_t *ops = wb_bucket_ops(E, &D->plan, b, m);
        const double q2 = wh_now_ms();
        if (line)
            WB_CK(cudaEventRecord(D->before[b], E->st));
        WB_OK(E->p->consumer->copy_segments(E->c, h, hd->h, hd->n, E->st, m->generation, ops,
                                            m->tensor_segment, m->n_tensors, 0, err));
        if (line)
            WB_CK(cudaEventRecord(D->after[b], E->st));
        const double q3 = wh_now_ms();
        WB_OK(E->p->consumer->record_consumed(E->c, h, 0, err));
        WB_OK(E->p->consumer->close_handle(E->c, h, err));
        E->p->consumer->manifest_free(E->c, m);
        free(ops);
        free(json);
        D->host[0] += q1 - q0, D->host[1] += q2 - q1, D->host[2] += q3 - q2;
        if (b == 0 && line)
            D->first[0] += q1 - t0, D->first[1] += q2 - q1;
        D->host[3] += wh_now_ms() - q3;
    }
    wh_send_str(D->fd, "ack");
    if (gpu_only)
        WB_CK(cudaEventRecord(E->e1, E->st));
    WB_CK(cudaStreamSynchronize(E->st));
    const double ms = wh_now_ms() - t0;
    if (line)
        wb_direct_line(D, ms);
    if (gpu_only) {
        float g = 0;
        WB_CK(cudaEventElapsedTime(&g, E->e0, E->e1));
        *gpu_ms = g;
    }
    return ms;
}

static unsigned long long wb_direct_trainer(wb_direct_t *D, const char *trainer, unsigned iters,
                                            double ms_flat, double ms_staged,
                                            unsigned long long *bad_dev)
{
    wb_engine_t *E = D->E;
    char open[64], *ans;
    snprintf(open, sizeof(open), "direct-%s %u:%.17g", trainer, D->ramp.steps, D->ramp.growth);
    wh_send_str(D->fd, open);
    wb_recv_expect(D->fd, "ready", &ans);
    free(ans);
    for (size_t i = 0; i < E->l.n; i++) /* poison: the first sync must write every byte */
        WB_CK(cudaMemsetAsync(E->dst[i], 0xA5, E->l.t[i].bytes, E->st));
    double gpu = 0;
    const double cold = wb_direct_sync(D, "dsync", 0, &gpu);
    const unsigned long long bad = wb_count_bad(E, bad_dev);
    double *t = calloc(iters, sizeof(*t)), *g = calloc(iters, sizeof(*g));
    if (t == NULL || g == NULL)
        exit(1);
    for (unsigned i = 0; i < WB_WARMUP_DIRECT; i++)
        wb_direct_sync(D, "dsync", 0, &gpu);
    memset(D->host, 0, sizeof(D->host));
    memset(D->line, 0, sizeof(D->line));
    memset(D->first, 0, sizeof(D->first));
    const unsigned long long opens0 = wh_stats.ipc_mem_opens;
    for (unsigned i = 0; i < iters; i++)
        t[i] = wb_direct_sync(D, "dsync-t", 0, &gpu);
    const unsigned long long opens = wh_stats.ipc_mem_opens - opens0;
    double host[4];
    for (int k = 0; k < 4; k++)
        host[k] = D->host[k] / iters;
    for (unsigned i = 0; i < iters; i++)
        wb_direct_sync(D, "dsync", 1, &g[i]);
    for (size_t b = 0; b < D->plan.nb; b++) { /* the producer retires once these are closed */
        wb_held_close(E, &D->held[b]);
        if (D->held[b].buffer != NULL)
            WB_OK(E->p->consumer->close_handle(E->c, D->held[b].buffer, err));
        D->held[b].buffer = NULL;
    }
    wh_send_str(D->fd, "dend");
    wb_recv_expect(D->fd, "dended", &ans);
    double tr = 0, tr_stage = 0, tr_pub = 0;
    unsigned tn = 0;
    if (sscanf(ans, "dended %lf %lf %lf %u", &tr, &tr_stage, &tr_pub, &tn) != 4) {
        fprintf(stderr, "wsync-bench-cuda: producer answered \"%s\"\n", ans);
        exit(1);
    }
    free(ans);
    const double ms = wh_median(t, iters), gms = wh_median(g, iters);
    printf("  (e) direct sync, trainer %s (%s), %zu bucket%s of <= %llu MiB (the first %u "
           "growing %.2fx a bucket up to it), 0 staging bytes: "
           "median %.2f ms engine (request to its stream's last copy), %.2f ms trainer (first "
           "stage to *consumed*), first sync %.2f ms; GPU alone %.2f ms\n",
           trainer, wb_trainer_what(trainer), D->plan.nb, D->plan.nb > 1 ? "s" : "",
           (unsigned long long)(D->bucket >> 20), D->ramp.steps, D->ramp.growth, ms, tr, cold, gms);
    printf("      vs one flat cudaMemcpyAsync (%.2f ms): %.3f end to end (trainer), %.3f GPU "
           "alone; vs the staged sync (%.2f ms): %.2fx faster; IPC opens per sync %.3f (%s); "
           "%llu wrong words after the first sync\n",
           ms_flat, ms_flat / tr, ms_flat / gms, ms_staged, ms_staged / tr, (double)opens / iters,
           wh_stats.seen ? "plugin stats" : "NO stats line seen", bad);
    printf("      host ms per sync: trainer stage (locate + export lookups) %.2f, publish %.2f; "
           "engine recv wait %.2f, parse + segments + ops %.2f, copy_segments %.2f, "
           "record_consumed + close %.2f\n",
           tr_stage, tr_pub, host[0], host[1], host[2], host[3]);
    printf("      engine stream timeline, mean per sync: first copy queued %.3f ms after the "
           "request, GPU idle between buckets %.3f ms, copies %.3f ms, last copy to the stream "
           "synced on the host %.3f ms; the first bucket (%llu MiB): manifest received %.3f ms "
           "after the request, parsed + ops %.3f ms later\n",
           D->line[0] / iters, D->line[1] / iters, D->line[2] / iters, D->line[3] / iters,
           (unsigned long long)(wb_bucket_bytes(&E->l, &D->plan, 0) >> 20), D->first[0] / iters,
           D->first[1] / iters);
    fflush(stdout);
    free(t);
    free(g);
    return bad;
}

/* The (e) rows of one trainer with one ramp. */
static unsigned long long wb_direct_rows(wb_engine_t *E, int fd, uint64_t bucket, wb_ramp_t ramp,
                                         const char *trainer, unsigned iters, double ms_flat,
                                         double ms_staged, unsigned long long *bad_dev)
{
    wb_direct_t D = {.E = E, .fd = fd, .bucket = bucket, .ramp = ramp};
    if (wb_plan_build(&E->l, bucket, D.ramp.steps, D.ramp.growth, &D.plan) != 0 ||
        (D.held = calloc(D.plan.nb, sizeof(*D.held))) == NULL ||
        (D.before = calloc(D.plan.nb, sizeof(*D.before))) == NULL ||
        (D.after = calloc(D.plan.nb, sizeof(*D.after))) == NULL)
        exit(1);
    WB_CK(cudaEventCreate(&D.req));
    for (size_t b = 0; b < D.plan.nb; b++) {
        WB_CK(cudaEventCreate(&D.before[b]));
        WB_CK(cudaEventCreate(&D.after[b]));
    }
    const unsigned long long bad =
        wb_direct_trainer(&D, trainer, iters, ms_flat, ms_staged, bad_dev);
    for (size_t b = 0; b < D.plan.nb; b++) {
        WB_CK(cudaEventDestroy(D.before[b]));
        WB_CK(cudaEventDestroy(D.after[b]));
    }
    WB_CK(cudaEventDestroy(D.req));
    free(D.before);
    free(D.after);
    free(D.held);
    wb_plan_free(&D.plan);
    return bad;
}

unsigned long long wb_direct_run(wb_engine_t *E, int fd, uint64_t bucket, unsigned iters,
                                 double ms_flat, double ms_staged, unsigned long long *bad_dev)
{
    wb_ramp_t ramps[WB_MAX_RAMPS];
    const size_t nr = wb_direct_ramps(ramps);
    unsigned long long bad = 0;
    for (size_t r = 0; r < nr; r++)
        bad +=
            wb_direct_rows(E, fd, bucket, ramps[r], "separate", iters, ms_flat, ms_staged, bad_dev);
    bad += wb_direct_rows(E, fd, bucket, ramps[0], "torch", iters, ms_flat, ms_staged, bad_dev);
    bad += wb_direct_rows(E, fd, bucket, ramps[0], "one", iters, ms_flat, ms_staged, bad_dev);
    return bad + wb_direct_rows(E, fd, bucket, ramps[0], "vmm", iters, ms_flat, ms_staged, bad_dev);
}
