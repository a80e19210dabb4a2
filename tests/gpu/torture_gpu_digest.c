/* The copy kernel's fused wsync64 equals the host wsync64 on the shared test vectors
 * (tests/unit/common/wsync64_vectors.h) on every kernel path: 16-byte vectors (with a short
 * tail), the byte path (misaligned source and destination) and 2-D ops with pitches; and the
 * copied bytes are exact. Runs under compute-sanitizer in tests/gpu/run_on_device.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../unit/common/wsync64_vectors.h"
#include "wsync_copy_kernel.h"
#include "wsync_digest.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NV (sizeof(wsync64_vectors) / sizeof(wsync64_vectors[0]))

static int sm_count;

/* Copy `rows` x `row_bytes` from src (pitch sp) to dst (pitch dp) with the kernel; returns the
 * digest. Several ops in one launch: the op is preceded by a large decoy op so that the op
 * index and chunk offsets are non-trivial. */
static uint64_t kernel_digest(const unsigned char *src, uint64_t sp, unsigned char *dst,
                              uint64_t dp, uint64_t rows, uint64_t row_bytes,
                              const wsync_cuda_launch_cfg_t *cfg)
{
    static unsigned char *decoy_src, *decoy_dst;
    const uint64_t decoy = (1u << 20) + 48;
    if (decoy_src == NULL) {
        assert_int_equal(cudaMalloc((void **)&decoy_src, decoy), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&decoy_dst, decoy), cudaSuccess);
        assert_int_equal(cudaMemset(decoy_src, 0x3c, decoy), cudaSuccess);
    }
    wsync_cuda_op_t ops[2];
    uint64_t chunks =
        wsync_cuda_plan_op(&ops[0], decoy_src, decoy_dst, decoy, decoy, 1, decoy, 1, 0);
    chunks += wsync_cuda_plan_op(&ops[1], src, dst, sp, dp, rows, row_bytes, 1, chunks);
    wsync_cuda_op_t *dops;
    unsigned long long *sums, host[2];
    assert_int_equal(cudaMalloc((void **)&dops, sizeof(ops)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&sums, sizeof(host)), cudaSuccess);
    assert_int_equal(cudaMemcpy(dops, ops, sizeof(ops), cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemset(sums, 0, sizeof(host)), cudaSuccess);
    assert_int_equal(wsync_cuda_launch_copy(dops, 2, chunks, sums, 1, sm_count, cfg, 0),
                     cudaSuccess);
    assert_int_equal(cudaMemcpy(host, sums, sizeof(host), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dops);
    cudaFree(sums);
    return wsync_mix64(host[1] ^ (rows * row_bytes));
}

static void check_vector(const wsync64_vector_t *v, const wsync_cuda_launch_cfg_t *cfg)
{
    size_t n = v->length;
    unsigned char *h = malloc(n + 64), *back = malloc(2 * n + 64);
    wsync64_vector_fill(v->pattern, h, n);
    assert_true(wsync64(h, n) == v->expected);
    unsigned char *src, *dst;
    size_t cap = 2 * n + 256;
    assert_int_equal(cudaMalloc((void **)&src, cap), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dst, cap), cudaSuccess);
    /* aligned: vector path */
    assert_int_equal(cudaMemcpy(src, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    assert_true(kernel_digest(src, n, dst, n, 1, n, cfg) == v->expected);
    assert_int_equal(cudaMemcpy(back, dst, n, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(back, h, n);
    /* misaligned: byte path */
    assert_int_equal(cudaMemcpy(src + 1, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    assert_true(kernel_digest(src + 1, n, dst + 3, n, 1, n, cfg) == v->expected);
    assert_int_equal(cudaMemcpy(back, dst + 3, n, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(back, h, n);
    /* 2-D: two rows with a 48-byte gap in the source and the destination */
    if (n >= 32 && n % 32 == 0) {
        uint64_t rb = n / 2, pitch = rb + 48;
        assert_int_equal(cudaMemcpy2D(src, pitch, h, rb, rb, 2, cudaMemcpyHostToDevice),
                         cudaSuccess);
        assert_true(kernel_digest(src, pitch, dst, pitch, 2, rb, cfg) == v->expected);
        assert_int_equal(cudaMemcpy2D(back, rb, dst, pitch, rb, 2, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_memory_equal(back, h, n);
    }
    cudaFree(src);
    cudaFree(dst);
    free(h);
    free(back);
}

static void test_vectors_all_paths(void **state)
{
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        wsync_cuda_launch_cfg_t cfg = {.variant = variant};
        for (size_t i = 0; i < NV; i++)
            check_vector(&wsync64_vectors[i], &cfg);
    }
}

/* Many short rows per chunk (rows_per_chunk > 1) and rows longer than a chunk. */
static void test_2d_shapes(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{4096, 128}, {3, 200000}, {1000, 16}, {7, 65536}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        uint64_t rows = shapes[s][0], rb = shapes[s][1], sp = rb + 64, dp = rb + 32;
        unsigned char *h = malloc(rows * rb), *back = malloc(rows * rb);
        for (uint64_t i = 0; i < rows * rb; i++)
            h[i] = (unsigned char)(wsync_mix64(i) >> 11);
        unsigned char *src, *dst;
        assert_int_equal(cudaMalloc((void **)&src, rows * sp), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&dst, rows * dp), cudaSuccess);
        assert_int_equal(cudaMemcpy2D(src, sp, h, rb, rb, rows, cudaMemcpyHostToDevice),
                         cudaSuccess);
        assert_true(kernel_digest(src, sp, dst, dp, rows, rb, NULL) == wsync64(h, rows * rb));
        assert_int_equal(cudaMemcpy2D(back, rb, dst, dp, rb, rows, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_memory_equal(back, h, rows * rb);
        cudaFree(src);
        cudaFree(dst);
        free(h);
        free(back);
    }
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_all_paths),
        cmocka_unit_test(test_2d_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
