/* wsync-bench-cuda --pingpong: what two processes taking turns on one GPU cost, without the
 * plugin. The sync's two passes (trainer params -> staging, staging -> engine params) are each
 * one bandwidth-bound copy kernel per 1 GiB bucket; here each process copies within its own
 * memory (so no mapping kind is involved) and the hand-off between them, through two shared
 * host words (*ready*, *consumed*), is driven:
 *   gpu:    on the GPU, by stream memory operations on the words (cuStreamWaitValue32 /
 *           cuStreamWriteValue32): no host in the loop at all;
 *   host:   by the host, as the protocol did before the engine's stream wrote *consumed* itself:
 *           the producer waits for its kernel and bumps *ready*, the consumer spins on it and
 *           launches; *consumed* from a host function;
 *   signal: the GPU writes both words (cuStreamWriteValue32 after each copy) and each host spins
 *           on the other side's word before it enqueues: no stream synchronize, no host function
 *           (the protocol's *consumed* now travels this way);
 *   half:   the producer as in gpu (enqueues everything ahead, its stream waits on *consumed*),
 *           the consumer as in signal (its host spins on the GPU-written *ready*);
 * gpu and host with 1 and 2 buffers, signal and half with 2, against the same 2 x 16 copies run
 * by one process (no turn-taking); and with each copy done by the copy engines (one
 * cudaMemcpyAsync) instead of the kernel, to see whether two contexts' copies still take turns
 * when no SM work is involved. */
#define _GNU_SOURCE
#include "wsync_bench_pingpong.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "wsync_copy_kernel.h"
#include "wsync_cuda_harness.h"

#define WP_BUCKET (1ull << 30)
#define WP_NB 16
#define WP_TRIALS 10 /* hand-off x buffer count x engine */

/* Who waits for and who signals each hand-off (the file's header comment). */
typedef enum wp_mode { WP_GPU, WP_HOST, WP_SIGNAL, WP_HALF } wp_mode_t;

typedef struct wp_shared {
    _Atomic uint32_t ready;    /* producer: last bucket staged (trial base + b + 1) */
    _Atomic uint32_t consumed; /* consumer: last bucket copied */
    _Atomic uint32_t go;       /* trial number + 1 the producer should run */
    _Atomic uint32_t done;     /* trial number + 1 the producer finished */
    _Atomic uint32_t quit;
} wp_shared_t;

typedef CUresult (*wp_wait_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*wp_write_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef struct wp_ctx {
    wp_shared_t *sh;
    CUdeviceptr d_ready, d_consumed; /* device views of sh->ready / sh->consumed */
    wp_wait_fn wait32;
    wp_write_fn write32;
    cudaStream_t st;
    int sm;
    unsigned char *src, *mid, *dst;     /* 16 buckets -> 2 buffers -> 16 buckets */
    wsync_cuda_op_t *ops[2];            /* device tables for 1 and 2 buffers (wp_ops) */
    wsync_cuda_op_t hops[2][2 * WP_NB]; /* their host images (the copy engines' pointers) */
} wp_ctx_t;

static wp_shared_t *wp_sh_for_cb; /* the host function's target (one per process) */

#define WP_CK(call) WH_CK("wsync-bench-cuda --pingpong", call)

/* Spins until *w reaches v; a peer that died or hangs ends the run after 20 s. */
static void wp_spin_until(_Atomic uint32_t *w, uint32_t v)
{
    const double end = wh_now_ms() + 20000;
    while ((int32_t)(atomic_load(w) - v) < 0) {
        if (wh_now_ms() > end) {
            fprintf(stderr, "wsync-bench-cuda --pingpong: the other process stopped\n");
            exit(1);
        }
        sched_yield();
    }
}

/* The device op table for nbuf (1 or 2): [0, NB) src bucket b -> mid buffer b % nbuf;
 * [NB, 2 NB) mid buffer b % nbuf -> dst bucket b. */
static wsync_cuda_op_t *wp_ops(wp_ctx_t *x, int nbuf)
{
    wsync_cuda_op_t *h = x->hops[nbuf - 1];
    for (int b = 0; b < WP_NB; b++) {
        unsigned char *m = x->mid + (uint64_t)(b % nbuf) * WP_BUCKET;
        wsync_cuda_plan_op(&h[b], x->src + (uint64_t)b * WP_BUCKET, m, WP_BUCKET, WP_BUCKET, 1,
                           WP_BUCKET, 0, 0);
        wsync_cuda_plan_op(&h[WP_NB + b], m, x->dst + (uint64_t)b * WP_BUCKET, WP_BUCKET, WP_BUCKET,
                           1, WP_BUCKET, 0, 0);
    }
    wsync_cuda_op_t *d;
    WP_CK(cudaMalloc((void **)&d, sizeof(x->hops[0])));
    WP_CK(cudaMemcpy(d, h, sizeof(x->hops[0]), cudaMemcpyHostToDevice));
    return d;
}

static void wp_setup(wp_ctx_t *x, wp_shared_t *sh)
{
    x->sh = sh;
    WP_CK(cudaSetDevice(0));
    WP_CK(cudaDeviceGetAttribute(&x->sm, cudaDevAttrMultiProcessorCount, 0));
    WP_CK(cudaStreamCreateWithFlags(&x->st, cudaStreamNonBlocking));
    WP_CK(cudaHostRegister(sh, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void *d;
    WP_CK(cudaHostGetDevicePointer(&d, (void *)&sh->ready, 0));
    x->d_ready = (CUdeviceptr)(uintptr_t)d;
    WP_CK(cudaHostGetDevicePointer(&d, (void *)&sh->consumed, 0));
    x->d_consumed = (CUdeviceptr)(uintptr_t)d;
    enum cudaDriverEntryPointQueryResult q;
    void *f = NULL;
    WP_CK(
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &f, 12000, cudaEnableDefault, &q));
    x->wait32 = (wp_wait_fn)f;
    WP_CK(
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &f, 12000, cudaEnableDefault, &q));
    x->write32 = (wp_write_fn)f;
    if (x->wait32 == NULL || x->write32 == NULL) {
        fprintf(stderr, "wsync-bench-cuda --pingpong: no stream memory operations\n");
        exit(1);
    }
    WP_CK(cudaMalloc((void **)&x->src, WP_NB * WP_BUCKET));
    WP_CK(cudaMalloc((void **)&x->mid, 2 * WP_BUCKET));
    WP_CK(cudaMalloc((void **)&x->dst, WP_NB * WP_BUCKET));
    WP_CK(cudaMemset(x->src, 0x5a, WP_NB * WP_BUCKET));
    wp_sh_for_cb = sh;
    for (int nbuf = 1; nbuf <= 2; nbuf++)
        x->ops[nbuf - 1] = wp_ops(x, nbuf);
}

/* Copy i of the table for nbuf: the kernel, or (ce) one cudaMemcpyAsync. */
static void wp_copy(wp_ctx_t *x, int nbuf, int i, int ce)
{
    const wsync_cuda_op_t *h = &x->hops[nbuf - 1][i];
    if (ce) {
        WP_CK(cudaMemcpyAsync(h->dst, h->src, WP_BUCKET, cudaMemcpyDeviceToDevice, x->st));
        return;
    }
    const wsync_cuda_launch_cfg_t cfg = {.variant = WSYNC_CUDA_VMM_VARIANT, .flat = 1};
    WP_CK(wsync_cuda_launch_copy(x->ops[nbuf - 1] + i, 1, WP_BUCKET / WSYNC_CUDA_CHUNK_BYTES, NULL,
                                 0, x->sm, &cfg, x->st));
}

static void CUDART_CB wp_signal(void *user)
{
    atomic_store(&wp_sh_for_cb->consumed, (uint32_t)(uintptr_t)user);
}

/* The stream waits until *w >= v (a stream memory operation; the host does not wait). */
static void wp_gpu_wait(wp_ctx_t *x, CUdeviceptr w, uint32_t v)
{
    if (x->wait32(x->st, w, v, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
        fprintf(stderr, "wsync-bench-cuda --pingpong: cuStreamWaitValue32 failed\n");
        exit(1);
    }
}

/* The stream writes v to *w once the work before it is done. */
static void wp_gpu_write(wp_ctx_t *x, CUdeviceptr w, uint32_t v)
{
    if (x->write32(x->st, w, v, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
        fprintf(stderr, "wsync-bench-cuda --pingpong: cuStreamWriteValue32 failed\n");
        exit(1);
    }
}

/* The producer's bucket b: wait until its buffer is free, stage, mark it ready. */
static void wp_produce(wp_ctx_t *x, wp_mode_t mode, int nbuf, int ce, uint32_t base, int b)
{
    /* buffer b % nbuf is free once bucket b - nbuf was copied */
    const uint32_t need = base + (uint32_t)(b >= nbuf ? b - nbuf + 1 : 0);
    const uint32_t ready = base + (uint32_t)b + 1;
    if (mode == WP_GPU || mode == WP_HALF)
        wp_gpu_wait(x, x->d_consumed, need);
    else
        wp_spin_until(&x->sh->consumed, need);
    wp_copy(x, nbuf, b, ce);
    if (mode == WP_HOST) {
        WP_CK(cudaStreamSynchronize(x->st));
        atomic_store(&x->sh->ready, ready);
    } else {
        wp_gpu_write(x, x->d_ready, ready);
    }
}

/* The consumer's bucket b: wait until it is staged, copy it out, mark it consumed. */
static void wp_consume(wp_ctx_t *x, wp_mode_t mode, int nbuf, int ce, uint32_t base, int b)
{
    const uint32_t v = base + (uint32_t)b + 1;
    if (mode == WP_GPU)
        wp_gpu_wait(x, x->d_ready, v);
    else
        wp_spin_until(&x->sh->ready, v);
    wp_copy(x, nbuf, WP_NB + b, ce);
    if (mode == WP_HOST)
        WP_CK(cudaLaunchHostFunc(x->st, wp_signal, (void *)(uintptr_t)v));
    else
        wp_gpu_write(x, x->d_consumed, v);
}

/* One side of one trial: producer (stage passes) or consumer (copy passes). */
static void wp_side(wp_ctx_t *x, int producer, wp_mode_t mode, int nbuf, int ce, uint32_t base)
{
    for (int b = 0; b < WP_NB; b++) {
        if (producer)
            wp_produce(x, mode, nbuf, ce, base, b);
        else
            wp_consume(x, mode, nbuf, ce, base, b);
    }
    WP_CK(cudaStreamSynchronize(x->st));
}

static const struct {
    wp_mode_t mode;
    int nbuf, ce;
} wp_trials[WP_TRIALS] = {{WP_GPU, 2, 0},    {WP_GPU, 1, 0},  {WP_HOST, 2, 0},   {WP_HOST, 1, 0},
                          {WP_GPU, 2, 1},    {WP_HOST, 2, 1}, {WP_SIGNAL, 2, 0}, {WP_HALF, 2, 0},
                          {WP_SIGNAL, 2, 1}, {WP_HALF, 2, 1}};

/* The hand-off of a mode, in words (the printed table). */
static const char *wp_mode_name(wp_mode_t mode)
{
    switch (mode) {
    case WP_GPU:
        return "GPU (stream memory operations)";
    case WP_HOST:
        return "host (stream synchronize, host function)";
    case WP_SIGNAL:
        return "host waits on GPU-written words";
    case WP_HALF:
        return "producer on the GPU, consumer's host waits on a GPU-written word";
    }
    return "?";
}

static int wp_producer(wp_shared_t *sh)
{
    wp_ctx_t x;
    wp_setup(&x, sh);
    for (uint32_t n = 1;; n++) {
        while (atomic_load(&sh->go) < n && !atomic_load(&sh->quit)) {
            if (getppid() == 1)
                return 1; /* the measuring process is gone */
            sched_yield();
        }
        if (atomic_load(&sh->quit))
            return 0;
        const uint32_t t = (n - 1) % WP_TRIALS;
        wp_side(&x, 1, wp_trials[t].mode, wp_trials[t].nbuf, wp_trials[t].ce, (n - 1) * 64u);
        atomic_store(&sh->done, n);
    }
}

typedef struct wp_one {
    wp_ctx_t *x;
    int ce;
} wp_one_t;

/* The 16 stage copies and 16 engine copies alternating on x's stream (s). */
static void wp_one_process(void *arg, cudaStream_t s)
{
    wp_one_t *o = arg;
    (void)s; /* wp_copy enqueues on o->x->st, which is s */
    for (int b = 0; b < WP_NB; b++) {
        wp_copy(o->x, 2, b, o->ce);
        wp_copy(o->x, 2, WP_NB + b, o->ce);
    }
}

int wb_pingpong_main(unsigned iters)
{
    wp_shared_t *sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    memset(sh, 0, sizeof(*sh));
    pid_t pid = fork(); /* before any CUDA call in either process */
    if (pid == 0)
        _exit(wp_producer(sh));
    wp_ctx_t x;
    wp_setup(&x, sh);
    cudaEvent_t e0, e1;
    WP_CK(cudaEventCreate(&e0));
    WP_CK(cudaEventCreate(&e1));
    /* one process: the 16 stage copies and 16 engine copies, alternating, no turn-taking;
     * by the kernel and by the copy engines */
    double one[2];
    for (int ce = 0; ce < 2; ce++) {
        wp_one_t arg = {&x, ce};
        one[ce] = wh_time_events("wsync-bench-cuda --pingpong", e0, e1, x.st, 2, iters,
                                 wp_one_process, &arg);
    }
    printf("wsync-bench-cuda --pingpong: 16 x 1 GiB stage copies + 16 x 1 GiB engine copies "
           "(median of %u after warm-up)\n",
           iters);
    printf("  one process, alternating on one stream, copy kernel: %.2f ms\n", one[0]);
    printf("  one process, alternating on one stream, copy engines: %.2f ms\n", one[1]);
    double *tk[WP_TRIALS], best[WP_TRIALS];
    for (int k = 0; k < WP_TRIALS; k++)
        tk[k] = calloc(iters, sizeof(double));
    uint32_t n = 0;
    for (unsigned i = 0; i < iters + 1; i++)
        for (int k = 0; k < WP_TRIALS; k++) {
            n++;
            const uint32_t base = (n - 1) * 64u;
            atomic_store(&sh->ready, base);
            atomic_store(&sh->consumed, base);
            double t0 = wh_now_ms();
            atomic_store(&sh->go, n);
            wp_side(&x, 0, wp_trials[k].mode, wp_trials[k].nbuf, wp_trials[k].ce, base);
            wp_spin_until(&sh->done, n);
            double ms = wh_now_ms() - t0;
            if (i > 0)
                tk[k][i - 1] = ms;
        }
    for (int k = 0; k < WP_TRIALS; k++) {
        best[k] = wh_median(tk[k], iters);
        free(tk[k]);
    }
    atomic_store(&sh->quit, 1);
    int st = 0;
    waitpid(pid, &st, 0);
    for (int k = 0; k < WP_TRIALS; k++)
        printf("  two processes, %s, hand-off: %s, %d buffer%s: %.2f ms (%.3fx one process)\n",
               wp_trials[k].ce ? "copy engines" : "copy kernel", wp_mode_name(wp_trials[k].mode),
               wp_trials[k].nbuf, wp_trials[k].nbuf > 1 ? "s" : "", best[k],
               best[k] / one[wp_trials[k].ce]);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
