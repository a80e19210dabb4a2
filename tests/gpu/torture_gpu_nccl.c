/* The nccl transport (plugin/cuda/nccl/wsync_cuda_nccl.h): libnccl.so.2 found at run time
 * ($WSYNC_NCCL_LIB, the loader's path, the nvidia-nccl wheels), the manifest's buffer.nccl
 * object carrying the communicator id, and buckets broadcast from the producer's staging into
 * each engine's retained receive buffer, then scattered (whole tensors and a per-rank TP row
 * range) into engine parameters on the engine's stream; every byte is compared with the
 * producer's pattern, three generations through the same buffers.
 *   one_rank: a 1-rank communicator on GPU 0 (loopback: the root receives into its own buffer),
 *             plus refused requests (replayed generation, op outside the bucket) — 1 GPU.
 *   ranks:    producer on GPU 0 (rank 0), one engine per other GPU (rank r + 1) — 2+ GPUs.
 * Skips with "SKIPPED: ..." and exit 77 without a GPU or without NCCL; `ranks` skips alone on
 * one GPU. Measures nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsync_cuda_nccl.h"
#include "wsync_gpu_multi.h"
#include "wsync_gpu_test.h"
#include "wsync_manifest.h"
#include "wsync_nccl_desc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* Manifest texts come from the library's allocator: free them with the real free(). */
#undef malloc
#undef calloc
#undef realloc
#undef free

#define NC_GENS 3
#define NC_STAGING (8u << 20)
#define NC_ROWS 1024
#define NC_COLS 2048 /* bytes per row of tensor 0 */
#define NC_T0 ((uint64_t)NC_ROWS * NC_COLS)
#define NC_T1 12345u /* odd-sized tensor 1, right after tensor 0 (offset 256-aligned) */
#define NC_T1_OFF ((NC_T0 + 255) & ~(uint64_t)255)
#define NC_MAX_ENGINES 7

static int nc_gpus;

static uint64_t nc_seed(uint64_t g)
{
    return 0xacc0000ull + 31 * g;
}

/* The manifest of bucket g with its buffer.nccl object (malloc'd text). */
static char *nc_manifest(uint64_t g, const wsync_nccl_unique_id_t *uid, uint32_t nranks)
{
    wsync_tensor_desc_t t[2] = {
        {.struct_size = sizeof(t[0]),
         .name = "model.layers.0.mlp.gate_up_proj.weight",
         .dtype = WSYNC_DTYPE_U8,
         .ndim = 2,
         .shape = {NC_ROWS, NC_COLS},
         .offset = 0,
         .nbytes = NC_T0},
        {.struct_size = sizeof(t[1]),
         .name = "model.norm.weight",
         .dtype = WSYNC_DTYPE_U8,
         .ndim = 1,
         .shape = {NC_T1},
         .offset = NC_T1_OFF,
         .nbytes = NC_T1},
    };
    wsync_manifest_t m = {.struct_size = sizeof(m),
                          .schema = WSYNC_MANIFEST_SCHEMA,
                          .generation = g,
                          .finished = g == NC_GENS,
                          .n_tensors = 2,
                          .tensors = t};
    m.buffer = (wsync_buffer_desc_t){.struct_size = sizeof(m.buffer),
                                     .kind = WSYNC_BUFFER_CUDA_IPC,
                                     .handle_len = 64,
                                     .bytes = NC_STAGING,
                                     .pid = getpid()};
    snprintf(m.buffer.device, sizeof(m.buffer.device), "GPU-producer");
    char *plain = NULL, *with = NULL;
    WG_OK(wsync_manifest_emit(&m, &plain, err));
    wsync_nccl_desc_t d = {.uid = *uid, .nranks = nranks, .count = wsync_nccl_bucket_count(&m)};
    WG_OK(wsync_nccl_desc_emit(plain, strlen(plain), &d, &with, err));
    free(plain);
    return with;
}

/* Engine side of one bucket: parse (both parsers), plan ops for TP rank r of n, receive and
 * scatter, then check every byte. */
static void nc_engine_bucket(wsync_nccl_link_t *l, const void *root_src, const char *json,
                             uint32_t r, uint32_t n, unsigned char *t0, unsigned char *t1,
                             cudaStream_t st, unsigned char *host)
{
    wsync_manifest_owned_t *m = NULL;
    WG_OK(wsync_manifest_parse(json, strlen(json), &m, err));
    wsync_nccl_desc_t d;
    int present = 0;
    WG_OK(wsync_nccl_desc_parse(json, strlen(json), &d, &present, err));
    WG_CHECK(present && d.nranks >= 1 && d.count == NC_T1_OFF + NC_T1, "nccl desc count %llu",
             (unsigned long long)d.count);
    const uint64_t g = m->view.generation;
    const uint64_t rows = NC_ROWS / n, row0 = r * rows;
    wsync_copy_op_t ops[2] = {
        {.src_offset = m->view.tensors[0].offset + row0 * NC_COLS,
         .src_pitch = NC_COLS,
         .dst = t0,
         .dst_pitch = NC_COLS,
         .dst_extent = rows * NC_COLS,
         .rows = rows,
         .row_bytes = NC_COLS},
        {.src_offset = m->view.tensors[1].offset,
         .src_pitch = NC_T1,
         .dst = t1,
         .dst_pitch = NC_T1,
         .dst_extent = NC_T1,
         .rows = 1,
         .row_bytes = NC_T1},
    };
    WG_OK(wsync_nccl_recv(l, root_src, g, d.count, ops, 2, st, 0, err));
    WG_OK(wsync_nccl_wait_consumed(l, err));
    WG_CK(cudaMemcpy(host, t0, rows * NC_COLS, cudaMemcpyDeviceToHost));
    for (uint64_t j = 0; j < rows * NC_COLS; j++)
        WG_CHECK(host[j] == wg_pattern_byte(nc_seed(g), row0 * NC_COLS + j),
                 "rank %u generation %llu: tensor 0 byte %llu differs", r, (unsigned long long)g,
                 (unsigned long long)j);
    WG_CK(cudaMemcpy(host, t1, NC_T1, cudaMemcpyDeviceToHost));
    for (uint64_t j = 0; j < NC_T1; j++)
        WG_CHECK(host[j] == wg_pattern_byte(nc_seed(g), NC_T1_OFF + j),
                 "rank %u generation %llu: tensor 1 byte %llu differs", r, (unsigned long long)g,
                 (unsigned long long)j);
    wsync_manifest_free(m);
}

/* ---------------------------------------------------------------- one rank */

static int nc_one_rank(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    WG_CK(cudaSetDevice(0));
    wsync_nccl_unique_id_t uid;
    WG_OK(wsync_nccl_unique_id(&uid, err));
    wsync_nccl_link_config_t cfg = {
        .device = 0, .nranks = 1, .rank = 0, .recv_bytes = NC_STAGING, .alloc_recv_on_root = 1};
    wsync_nccl_link_t *l;
    WG_OK(wsync_nccl_link_open(&cfg, &uid, &l, err));
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    WG_CHECK(nvls != NULL, "NCCL_NVLS_ENABLE was not set before ncclCommInitRank");
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *staging, *t0, *t1, *copy;
    WG_CK(cudaMalloc((void **)&staging, NC_STAGING));
    WG_CK(cudaMalloc((void **)&t0, NC_T0));
    WG_CK(cudaMalloc((void **)&t1, NC_T1));
    WG_CK(cudaMalloc((void **)&copy, NC_STAGING));
    unsigned char *host = malloc(NC_T0);
    WG_CHECK(host != NULL, "no host memory");

    /* A plain broadcast (the benchmark's peak) moves the bytes too. */
    WG_CK(wh_fill(staging, NC_STAGING, nc_seed(0), st));
    WG_OK(wsync_nccl_broadcast_raw(l, staging, copy, NC_STAGING, st, err));
    unsigned long long *bad_dev, bad = 1;
    WG_CK(cudaMalloc((void **)&bad_dev, sizeof(*bad_dev)));
    WG_CK(cudaMemsetAsync(bad_dev, 0, sizeof(*bad_dev), st));
    WG_CK(wh_count_bad(copy, NC_STAGING, nc_seed(0), bad_dev, st));
    WG_CK(cudaMemcpyAsync(&bad, bad_dev, sizeof(bad), cudaMemcpyDeviceToHost, st));
    WG_CK(cudaStreamSynchronize(st));
    WG_CHECK(bad == 0, "plain broadcast: %llu words differ", bad);

    for (uint64_t g = 1; g <= NC_GENS; g++) {
        WG_CK(wh_fill(staging, NC_STAGING, nc_seed(g), st));
        char *json = nc_manifest(g, &uid, 1);
        nc_engine_bucket(l, staging, json, 0, 1, t0, t1, st, host);
        free(json);
    }
    /* Refused before anything is received or written. */
    WG_CK(cudaMemset(t1, 0xab, NC_T1));
    wsync_copy_op_t op = {.src_offset = NC_STAGING - 8,
                          .src_pitch = 16,
                          .dst = t1,
                          .dst_pitch = 16,
                          .dst_extent = NC_T1,
                          .rows = 1,
                          .row_bytes = 16};
    wsync_error_t e = {.struct_size = sizeof(e)};
    WG_CHECK(wsync_nccl_recv(l, staging, NC_GENS + 1, NC_STAGING, &op, 1, st, 0, &e) ==
                 WSYNC_ERR_OUT_OF_BOUNDS,
             "op past the bucket accepted (%s)", e.message);
    e = (wsync_error_t){.struct_size = sizeof(e)};
    op.src_offset = 0;
    WG_CHECK(wsync_nccl_recv(l, staging, NC_GENS, NC_STAGING, &op, 1, st, 0, &e) ==
                 WSYNC_ERR_STALE_GENERATION,
             "replayed generation accepted (%s)", e.message);
    e = (wsync_error_t){.struct_size = sizeof(e)};
    WG_CHECK(wsync_nccl_recv(l, staging, NC_GENS + 1, NC_STAGING + 1, &op, 1, st, 0, &e) ==
                 WSYNC_ERR_OUT_OF_BOUNDS,
             "bucket larger than the receive buffer accepted (%s)", e.message);
    WG_CK(cudaMemcpy(host, t1, NC_T1, cudaMemcpyDeviceToHost));
    for (uint64_t j = 0; j < NC_T1; j++)
        WG_CHECK(host[j] == 0xab, "a refused request wrote byte %llu", (unsigned long long)j);
    wsync_nccl_link_close(l, 0);
    printf("nccl 1-rank loopback: %d generations bit-exact, bad requests refused\n", NC_GENS);
    free(host);
    return 0;
}

static int nc_child(int i, void *arg)
{
    (void)i;
    return nc_one_rank(-1, arg);
}

static void test_one_rank(void **state)
{
    (void)state;
    assert_int_equal(wgm_run_children(1, nc_child, NULL, NULL, 0), 0);
}

/* ---------------------------------------------------------------- several ranks */

typedef struct nc_group {
    int n_engines;
    int fds[NC_MAX_ENGINES][2]; /* [e][0] producer end, [e][1] engine end */
} nc_group_t;

static void nc_close_others(nc_group_t *gr, int keep_engine, int keep_side)
{
    for (int e = 0; e < gr->n_engines; e++)
        for (int s = 0; s < 2; s++)
            if (e != keep_engine || s != keep_side)
                close(gr->fds[e][s]);
}

static int nc_producer(nc_group_t *gr)
{
    for (int e = 0; e < gr->n_engines; e++)
        close(gr->fds[e][1]);
    alarm(240);
    WG_CK(cudaSetDevice(0));
    wsync_nccl_unique_id_t uid;
    WG_OK(wsync_nccl_unique_id(&uid, err));
    for (int e = 0; e < gr->n_engines; e++)
        WG_CHECK(wh_send(gr->fds[e][0], &uid, sizeof(uid)) == 0, "send uid to engine %d", e);
    const uint32_t nranks = (uint32_t)gr->n_engines + 1;
    wsync_nccl_link_config_t cfg = {.device = 0, .nranks = nranks, .rank = 0};
    wsync_nccl_link_t *l;
    WG_OK(wsync_nccl_link_open(&cfg, &uid, &l, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *staging;
    WG_CK(cudaMalloc((void **)&staging, NC_STAGING));
    for (uint64_t g = 1; g <= NC_GENS; g++) {
        /* stream order: the fill waits for the previous broadcast to have read the staging */
        WG_CK(wh_fill(staging, NC_STAGING, nc_seed(g), st));
        char *json = nc_manifest(g, &uid, nranks);
        for (int e = 0; e < gr->n_engines; e++)
            WG_CHECK(wh_send_str(gr->fds[e][0], json) == 0, "send manifest to engine %d", e);
        free(json);
        WG_OK(wsync_nccl_send(l, staging, NC_T1_OFF + NC_T1, st, err));
        for (int e = 0; e < gr->n_engines; e++) {
            char *ack;
            WG_CHECK(wh_recv(gr->fds[e][0], &ack, NULL) == 0, "no ack from engine %d", e);
            wh_free(ack);
        }
    }
    WG_CK(cudaStreamSynchronize(st));
    wsync_nccl_link_close(l, 0);
    return 0;
}

static int nc_engine(nc_group_t *gr, int e)
{
    const int fd = gr->fds[e][1];
    nc_close_others(gr, e, 1);
    alarm(240);
    const int dev = e + 1;
    WG_CK(cudaSetDevice(dev));
    char *uid_buf;
    size_t len;
    WG_CHECK(wh_recv(fd, &uid_buf, &len) == 0 && len == sizeof(wsync_nccl_unique_id_t), "no uid");
    wsync_nccl_unique_id_t uid;
    memcpy(&uid, uid_buf, sizeof(uid));
    wh_free(uid_buf);
    wsync_nccl_link_config_t cfg = {.device = dev,
                                    .nranks = (uint32_t)gr->n_engines + 1,
                                    .rank = wsync_nccl_engine_rank((uint32_t)e),
                                    .recv_bytes = NC_STAGING};
    wsync_nccl_link_t *l;
    WG_OK(wsync_nccl_link_open(&cfg, &uid, &l, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *t0, *t1;
    WG_CK(cudaMalloc((void **)&t0, NC_T0));
    WG_CK(cudaMalloc((void **)&t1, NC_T1));
    unsigned char *host = malloc(NC_T0);
    WG_CHECK(host != NULL, "no host memory");
    for (uint64_t g = 1; g <= NC_GENS; g++) {
        char *json;
        WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest for generation %llu",
                 (unsigned long long)g);
        nc_engine_bucket(l, NULL, json, (uint32_t)e, (uint32_t)gr->n_engines, t0, t1, st, host);
        wh_free(json);
        WG_CHECK(wh_send_str(fd, "{\"ack\":true}") == 0, "send ack");
    }
    wsync_nccl_link_close(l, 0);
    printf("nccl engine rank %d (GPU %d): %d generations bit-exact\n", e, dev, NC_GENS);
    free(host);
    return 0;
}

static int nc_group_child(int i, void *arg)
{
    nc_group_t *gr = arg;
    return i == 0 ? nc_producer(gr) : nc_engine(gr, i - 1);
}

static void test_ranks(void **state)
{
    (void)state;
    if (nc_gpus < 2) {
        printf("SKIPPED: nccl ranks needs 2 GPUs, found %d\n", nc_gpus);
        WG_SKIP();
    }
    nc_group_t gr = {.n_engines = nc_gpus - 1 > NC_MAX_ENGINES ? NC_MAX_ENGINES : nc_gpus - 1};
    int all[2 * NC_MAX_ENGINES];
    for (int e = 0; e < gr.n_engines; e++) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, gr.fds[e]), 0);
        all[2 * e] = gr.fds[e][0];
        all[2 * e + 1] = gr.fds[e][1];
    }
    assert_int_equal(wgm_run_children(gr.n_engines + 1, nc_group_child, &gr, all, 2 * gr.n_engines),
                     0);
}

/* NCCL present? Asked in a child so this process stays free of CUDA and NCCL state. */
static void nc_require_nccl(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        exit(1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        const wsync_nccl_api_t *api = NULL;
        wsync_error_t e = {.struct_size = sizeof(e)};
        int rc = wsync_nccl_load(&api, &e) == WSYNC_OK;
        const char *msg = rc ? api->path : e.message;
        ssize_t w = write(fds[1], msg, strlen(msg) + 1);
        _exit(rc && w > 0 ? 0 : 77);
    }
    close(fds[1]);
    char msg[WSYNC_ERROR_MESSAGE_LEN + 1] = "";
    ssize_t got = read(fds[0], msg, sizeof(msg) - 1);
    (void)got;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("SKIPPED: NCCL not available (%s)\n", msg);
        exit(77);
    }
    printf("nccl: %s\n", msg);
}

int main(void)
{
    nc_gpus = wgm_require_gpus(1, "torture_gpu_nccl");
    nc_require_nccl();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_ranks),
    };
    return wg_finish(cmocka_run_group_tests(tests, NULL, NULL), "torture_gpu_nccl");
}
