/* wsync-bench-multigpu: per-GPU throughput of the multi-GPU paths, as ratios to limits measured
 * in the same run (docs/PERFORMANCE.md, "Several GPUs").
 *
 *   wsync-bench-multigpu [--mode tp|nccl|both] [--gpus N] [--mib M] [--tensors T] [--iters K]
 *                        [--plugin PATH]
 *
 * tp:   N trainer/engine pairs at once, pair r on GPU r (both processes see only that GPU). The
 *       producer stages M MiB (T tensors) into its retained staging buffer; the engine copies
 *       them into T separate allocations through libwsync_cuda.so (copy_weights +
 *       record_consumed). Per GPU: GB/s of the copy (median of K) and its ratio to one
 *       cudaMemcpyAsync of M MiB on that GPU (the local limit), measured in the same process.
 * nccl: producer on GPU 0 (rank 0), engines on GPUs 1..N-1. Per engine GPU: GB/s of the nccl
 *       path (broadcast into the retained receive buffer + scatter into T allocations) and its
 *       ratio to a plain ncclBroadcast of the same M MiB between the same ranks (the link's
 *       limit), both medians of K. NCCL is dlopened (WSYNC_NCCL_LIB names it).
 * Fewer than 2 GPUs: prints why and exits 0 (nothing to measure). Prints ratios; asserts nothing.
 * Every process is forked before it touches CUDA. */
#define _GNU_SOURCE
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "wsync_abi.h"
#include "wsync_client.h"
#include "wsync_cuda_harness.h"
#include "wsync_cuda_nccl.h"

#define MG_MAX 8
#define MG_WARMUP 3

typedef struct mg_opts {
    const char *mode;
    const char *plugin;
    int gpus;
    uint64_t bytes;
    unsigned tensors, iters;
    int fds[MG_MAX][2];
    int results[2]; /* [0] read by the parent, [1] written by children */
} mg_opts_t;

#define MG_CK(call) WH_CK("wsync-bench-multigpu", call)

#define MG_OK(call)                                                                                \
    do {                                                                                           \
        wsync_error_t err_ = {.struct_size = sizeof(err_)};                                        \
        wsync_error_t *err = &err_;                                                                \
        wsync_result_t r_ = (call);                                                                \
        if (r_ != WSYNC_OK) {                                                                      \
            fprintf(stderr, "wsync-bench-multigpu: %s:%d %s: %s\n", __FILE__, __LINE__,            \
                    wsync_strerror(r_), err_.message);                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double mg_gbps(uint64_t bytes, double ms)
{
    return ms > 0 ? (double)bytes / (ms * 1e6) : 0;
}

/* Children report "label gbps limit_gbps" lines to the parent through a pipe. */
static void mg_report(mg_opts_t *o, const char *label, double gbps, double limit)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "%s %.1f %.1f\n", label, gbps, limit);
    if (write(o->results[1], line, (size_t)n) != n)
        fprintf(stderr, "wsync-bench-multigpu: lost a result line\n");
}

static void mg_pin(int r)
{
    char buf[16];
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v != NULL && v[0] != '\0') {
        const char *p = v;
        for (int i = 0; i < r && p != NULL; i++)
            if ((p = strchr(p, ',')) != NULL)
                p++;
        if (p != NULL) {
            snprintf(buf, sizeof(buf), "%.*s", (int)strcspn(p, ","), p);
            setenv("CUDA_VISIBLE_DEVICES", buf, 1);
            return;
        }
    }
    snprintf(buf, sizeof(buf), "%d", r);
    setenv("CUDA_VISIBLE_DEVICES", buf, 1);
}

/* Rank r's process: pinned to its GPU, the plugin loaded (or exit). */
static const wsync_plugin_t *mg_load(const mg_opts_t *o, int r)
{
    mg_pin(r);
    const wsync_plugin_t *p = NULL;
    char why[256];
    if (wh_load(o->plugin, &p, why, sizeof(why)) != WSYNC_OK) {
        fprintf(stderr, "wsync-bench-multigpu: %s\n", why);
        exit(1);
    }
    return p;
}

/* ------------------------------------------------------------------ tp */

static void mg_tp_producer(mg_opts_t *o, int r, int fd)
{
    const wsync_plugin_t *p = mg_load(o, r);
    const uint64_t per = o->bytes / o->tensors;
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = o->bytes + 256u * o->tensors, .device_ordinal = 0};
    wsync_staging_t *s;
    MG_OK(p->producer->create(&cfg, &s, err));
    cudaStream_t st;
    MG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *params;
    MG_CK(cudaMalloc((void **)&params, o->bytes));
    MG_CK(wh_fill(params, o->bytes, 7, st));
    wsync_stage_tensor_t *t = calloc(o->tensors, sizeof(*t));
    char(*names)[48] = calloc(o->tensors, 48);
    for (unsigned k = 0; k < o->tensors; k++) {
        snprintf(names[k], 48, "model.layers.%u.weight", k);
        t[k] = (wsync_stage_tensor_t){.struct_size = sizeof(t[k]),
                                      .name = names[k],
                                      .dtype = WSYNC_DTYPE_U8,
                                      .ndim = 1,
                                      .shape = {(int64_t)per},
                                      .src = params + k * per};
    }
    uint64_t last = 0;
    for (unsigned i = 0; i < MG_WARMUP + o->iters; i++) {
        if (last)
            MG_OK(p->producer->wait_consumed(s, st, last, err));
        MG_OK(p->producer->stage(s, st, t, o->tensors, err));
        const char *json;
        MG_OK(p->producer->publish(s, st, 1, &json, &last, err));
        MG_CK(cudaStreamSynchronize(st)); /* the engine's measurement holds the copy only */
        if (wh_send_str(fd, json) != 0)
            exit(1);
        char *ack;
        if (wh_recv(fd, &ack, NULL) != 0)
            exit(1);
        wh_free(ack);
    }
    char *bye;
    if (wh_recv(fd, &bye, NULL) == 0)
        wh_free(bye);
    MG_OK(p->producer->retire(s, err));
    exit(0);
}

static void mg_tp_engine(mg_opts_t *o, int r, int fd)
{
    const wsync_plugin_t *p = mg_load(o, r);
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc)};
    wsync_consumer_t *c;
    MG_OK(p->consumer->create(&cc, &c, err));
    wsync_stream_t st;
    MG_OK(p->consumer->stream_create(c, &st, err));
    const uint64_t per = o->bytes / o->tensors;
    void **dst = calloc(o->tensors, sizeof(void *));
    for (unsigned k = 0; k < o->tensors; k++)
        MG_OK(p->consumer->mem_alloc(c, per, &dst[k], err));
    wsync_copy_op_t *ops = calloc(o->tensors, sizeof(*ops));
    double *ms = calloc(o->iters, sizeof(double));
    wsync_handle_t *h = NULL;
    for (unsigned i = 0; i < MG_WARMUP + o->iters; i++) {
        char *json;
        size_t len;
        if (wh_recv(fd, &json, &len) != 0)
            exit(1);
        const wsync_manifest_t *m;
        MG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
        if (h == NULL)
            MG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        for (unsigned k = 0; k < o->tensors; k++)
            ops[k] = (wsync_copy_op_t){.src_offset = m->tensors[k].offset,
                                       .src_pitch = per,
                                       .dst = dst[k],
                                       .dst_pitch = per,
                                       .dst_extent = per,
                                       .rows = 1,
                                       .row_bytes = per};
        double t0 = wh_now_ms();
        MG_OK(p->consumer->copy_weights(c, h, st, m->generation, ops, o->tensors, 0, err));
        MG_OK(p->consumer->record_consumed(c, h, 1, err));
        double t1 = wh_now_ms();
        if (i >= MG_WARMUP)
            ms[i - MG_WARMUP] = t1 - t0;
        p->consumer->manifest_free(c, m);
        wh_free(json);
        if (wh_send_str(fd, "{\"ack\":1}") != 0)
            exit(1);
    }
    MG_OK(p->consumer->close_handle(c, h, err));
    wh_send_str(fd, "{\"closed\":1}");
    /* the local limit: one cudaMemcpyAsync of the same bytes on this GPU */
    void *a, *b;
    MG_CK(cudaMalloc(&a, o->bytes));
    MG_CK(cudaMalloc(&b, o->bytes));
    cudaEvent_t e0, e1;
    MG_CK(cudaEventCreate(&e0));
    MG_CK(cudaEventCreate(&e1));
    double *lim = calloc(o->iters, sizeof(double));
    for (unsigned i = 0; i < MG_WARMUP + o->iters; i++) {
        MG_CK(cudaEventRecord(e0, st));
        MG_CK(cudaMemcpyAsync(b, a, o->bytes, cudaMemcpyDeviceToDevice, st));
        MG_CK(cudaEventRecord(e1, st));
        MG_CK(cudaEventSynchronize(e1));
        float f = 0;
        MG_CK(cudaEventElapsedTime(&f, e0, e1));
        if (i >= MG_WARMUP)
            lim[i - MG_WARMUP] = f;
    }
    char label[64];
    snprintf(label, sizeof(label), "tp=%d/gpu%d", o->gpus, r);
    mg_report(o, label, mg_gbps(o->bytes, wh_median(ms, o->iters)),
              mg_gbps(o->bytes, wh_median(lim, o->iters)));
    MG_OK(p->consumer->finalize(c, err));
    exit(0);
}

/* ------------------------------------------------------------------ nccl */

static void mg_nccl_rank(mg_opts_t *o, int rank)
{
    const int dev = rank; /* rank 0: producer on GPU 0; rank r: engine on GPU r */
    const int n_eng = o->gpus - 1;
    MG_CK(cudaSetDevice(dev));
    wsync_nccl_unique_id_t uid;
    if (rank == 0) {
        MG_OK(wsync_nccl_unique_id(&uid, err));
        for (int e = 0; e < n_eng; e++)
            if (wh_send(o->fds[e][0], &uid, sizeof(uid)) != 0)
                exit(1);
    } else {
        char *b;
        size_t len;
        if (wh_recv(o->fds[rank - 1][1], &b, &len) != 0 || len != sizeof(uid))
            exit(1);
        memcpy(&uid, b, sizeof(uid));
        wh_free(b);
    }
    wsync_nccl_link_config_t cfg = {
        .device = dev, .nranks = (uint32_t)o->gpus, .rank = rank, .recv_bytes = o->bytes};
    wsync_nccl_link_t *l;
    MG_OK(wsync_nccl_link_open(&cfg, &uid, &l, err));
    cudaStream_t st;
    MG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *buf, *raw_dst;
    MG_CK(cudaMalloc((void **)&buf, o->bytes));
    MG_CK(cudaMalloc((void **)&raw_dst, o->bytes));
    const uint64_t per = o->bytes / o->tensors;
    wsync_copy_op_t *ops = calloc(o->tensors, sizeof(*ops));
    for (unsigned k = 0; rank > 0 && k < o->tensors; k++) {
        void *d;
        MG_CK(cudaMalloc(&d, per));
        ops[k] = (wsync_copy_op_t){.src_offset = k * per,
                                   .src_pitch = per,
                                   .dst = d,
                                   .dst_pitch = per,
                                   .dst_extent = per,
                                   .rows = 1,
                                   .row_bytes = per};
    }
    double *raw = calloc(o->iters, sizeof(double)), *path = calloc(o->iters, sizeof(double));
    /* Same order on every rank: warm-up and K plain broadcasts, then warm-up and K buckets.
     * Each rank times its own part until its stream is done (wall clock). */
    for (int phase = 0; phase < 2; phase++)
        for (unsigned i = 0; i < MG_WARMUP + o->iters; i++) {
            double t0 = wh_now_ms();
            if (phase == 0)
                MG_OK(wsync_nccl_broadcast_raw(l, rank == 0 ? buf : NULL, raw_dst, o->bytes, st,
                                               err));
            else if (rank == 0)
                MG_OK(wsync_nccl_send(l, buf, o->bytes, st, err));
            else
                MG_OK(wsync_nccl_recv(l, NULL, i + 1, o->bytes, ops, o->tensors, st, 0, err));
            MG_CK(cudaStreamSynchronize(st));
            double t1 = wh_now_ms();
            if (i >= MG_WARMUP)
                (phase == 0 ? raw : path)[i - MG_WARMUP] = t1 - t0;
        }
    if (rank > 0) {
        char label[64];
        snprintf(label, sizeof(label), "nccl/gpu0->gpu%d", rank);
        mg_report(o, label, mg_gbps(o->bytes, wh_median(path, o->iters)),
                  mg_gbps(o->bytes, wh_median(raw, o->iters)));
    }
    wsync_nccl_link_close(l, 0);
    exit(0);
}

/* ------------------------------------------------------------------ driver */

static int mg_count_gpus(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0;
        ssize_t w = write(fds[1], &n, sizeof(n));
        _exit(w == sizeof(n) ? 0 : 1);
    }
    close(fds[1]);
    int n = 0;
    if (read(fds[0], &n, sizeof(n)) != sizeof(n))
        n = 0;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    return n;
}

static int mg_wait_all(pid_t *pids, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st = 0;
        if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    return bad;
}

static void mg_print_results(mg_opts_t *o, const char *limit_name)
{
    char buf[8192];
    ssize_t got = read(o->results[0], buf, sizeof(buf) - 1);
    buf[got > 0 ? got : 0] = '\0';
    printf("  %-22s %12s %12s %8s\n", "path", "GB/s", limit_name, "ratio");
    for (char *line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char label[64];
        double g = 0, lim = 0;
        if (sscanf(line, "%63s %lf %lf", label, &g, &lim) == 3)
            printf("  %-22s %12.1f %12.1f %8.3f\n", label, g, lim, lim > 0 ? g / lim : 0);
    }
}

static int mg_run_tp(mg_opts_t *o)
{
    pid_t pids[2 * MG_MAX];
    for (int r = 0; r < o->gpus; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, o->fds[r]) != 0)
            return 1;
    if (pipe(o->results) != 0)
        return 1;
    fflush(stdout);
    for (int r = 0; r < o->gpus; r++) {
        if ((pids[2 * r] = fork()) == 0)
            mg_tp_producer(o, r, o->fds[r][0]);
        if ((pids[2 * r + 1] = fork()) == 0)
            mg_tp_engine(o, r, o->fds[r][1]);
    }
    for (int r = 0; r < o->gpus; r++) {
        close(o->fds[r][0]);
        close(o->fds[r][1]);
    }
    close(o->results[1]);
    int bad = mg_wait_all(pids, 2 * o->gpus);
    printf("TP=%d colocated sync, %llu MiB in %u tensors per rank, median of %u:\n", o->gpus,
           (unsigned long long)(o->bytes >> 20), o->tensors, o->iters);
    mg_print_results(o, "memcpy GB/s");
    close(o->results[0]);
    return bad != 0;
}

static int mg_run_nccl(mg_opts_t *o)
{
    pid_t pids[MG_MAX];
    for (int e = 0; e < o->gpus - 1; e++)
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, o->fds[e]) != 0)
            return 1;
    if (pipe(o->results) != 0)
        return 1;
    fflush(stdout);
    for (int r = 0; r < o->gpus; r++)
        if ((pids[r] = fork()) == 0)
            mg_nccl_rank(o, r);
    for (int e = 0; e < o->gpus - 1; e++) {
        close(o->fds[e][0]);
        close(o->fds[e][1]);
    }
    close(o->results[1]);
    int bad = mg_wait_all(pids, o->gpus);
    printf("nccl path, producer GPU 0 -> %d engine GPUs, %llu MiB in %u tensors, median of %u:\n",
           o->gpus - 1, (unsigned long long)(o->bytes >> 20), o->tensors, o->iters);
    mg_print_results(o, "bcast GB/s");
    close(o->results[0]);
    return bad != 0;
}

int main(int argc, char **argv)
{
    mg_opts_t o = {.mode = "both", .gpus = 0, .bytes = 1024ull << 20, .tensors = 64, .iters = 10};
    static const struct option opts[] = {{"mode", required_argument, NULL, 'm'},
                                         {"gpus", required_argument, NULL, 'g'},
                                         {"mib", required_argument, NULL, 'b'},
                                         {"tensors", required_argument, NULL, 't'},
                                         {"iters", required_argument, NULL, 'i'},
                                         {"plugin", required_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    int c;
    o.plugin = getenv("WSYNC_PLUGIN");
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            o.mode = optarg;
            break;
        case 'g':
            o.gpus = atoi(optarg);
            break;
        case 'b':
            o.bytes = strtoull(optarg, NULL, 10) << 20;
            break;
        case 't':
            o.tensors = (unsigned)atoi(optarg);
            break;
        case 'i':
            o.iters = (unsigned)atoi(optarg);
            break;
        case 'p':
            o.plugin = optarg;
            break;
        default:
            fprintf(stderr, "usage: wsync-bench-multigpu [--mode tp|nccl|both] [--gpus N] "
                            "[--mib M] [--tensors T] [--iters K] [--plugin PATH]\n");
            return 2;
        }
    }
    static char plugin[PATH_MAX + 64];
    o.plugin = wh_plugin_path(o.plugin, plugin, sizeof(plugin));
    int found = mg_count_gpus();
    if (o.gpus == 0)
        o.gpus = found > MG_MAX ? MG_MAX : found;
    if (o.gpus < 2 || o.gpus > found || o.gpus > MG_MAX) {
        printf("wsync-bench-multigpu: needs 2..%d GPUs, found %d (asked for %d): nothing to "
               "measure\n",
               MG_MAX, found, o.gpus);
        return 0;
    }
    if (o.tensors == 0 || o.iters == 0 || o.bytes < o.tensors * 4096ull) {
        fprintf(stderr, "wsync-bench-multigpu: need --tensors >= 1, --iters >= 1 and at least "
                        "4 KiB per tensor\n");
        return 2;
    }
    o.bytes = o.bytes / o.tensors / 256 * 256 * o.tensors; /* whole, aligned tensors */
    int bad = 0;
    if (strcmp(o.mode, "tp") == 0 || strcmp(o.mode, "both") == 0)
        bad |= mg_run_tp(&o);
    if (strcmp(o.mode, "nccl") == 0 || strcmp(o.mode, "both") == 0)
        bad |= mg_run_nccl(&o);
    return bad;
}
