/* The copy engines' share of a batch (plugin/cuda/wsync_cuda_split.c), without a device: the
 * largest contiguous ops first up to the share, none under the minimum, 2-D and empty ops always
 * left to the kernel, the kernel's ops compacted in order with their chunk spans kept, and the
 * copy engines' ops dealt over the lanes by bytes, each lane in op order; consecutive ops that
 * continue each other (tensors landing in one fused engine parameter) joined into one copy,
 * never across two allocations. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* the split's arrays come from the real allocator */
#undef malloc
#undef calloc
#undef realloc
#undef free

#define MIB (1ull << 20)

typedef struct shape {
    uint64_t rows, row_bytes; /* rows > 1: a 2-D op with pitch 2 * row_bytes */
} shape_t;

/* Plan ops of the given shapes at distinct, aligned fake addresses; returns the chunk total. */
static uint64_t plan(const shape_t *sh, size_t n, wsync_cuda_op_t *t)
{
    uint64_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t pitch = sh[i].rows > 1 ? 2 * sh[i].row_bytes : sh[i].row_bytes;
        const void *src = (const void *)(uintptr_t)(0x100000000ull * (i + 1));
        void *dst = (void *)(uintptr_t)(0x10000000000ull * (i + 1));
        chunks += wsync_cuda_plan_op(&t[i], src, dst, pitch, pitch, sh[i].rows, sh[i].row_bytes, 0,
                                     chunks);
    }
    return chunks;
}

static wsync_result_t split(wsync_cuda_op_t *t, size_t n, double share, uint64_t min_bytes,
                            int lanes, wsync_cuda_alloc_range_fn range, wsync_cuda_split_t *sp,
                            wsync_error_t *err)
{
    const wsync_cuda_split_cfg_t cfg = {share, min_bytes, lanes, range, 0};
    return wsync_cuda_split(t, n, &cfg, sp, err);
}

/* The kernel's ops are a compacted, in-order subsequence with consecutive chunk ranges. */
static void assert_compacted(const wsync_cuda_op_t *before, size_t n, const wsync_cuda_op_t *t,
                             const wsync_cuda_split_t *sp)
{
    uint64_t next = 0;
    size_t j = 0;
    for (size_t k = 0; k < sp->n_kernel; k++) {
        while (j < n && before[j].dst != t[k].dst)
            j++;
        assert_true(j < n); /* found, and after the previous one */
        assert_int_equal(t[k].chunk_begin, next);
        assert_int_equal(t[k].chunk_end - t[k].chunk_begin,
                         before[j].chunk_end - before[j].chunk_begin);
        assert_int_equal(t[k].row_bytes, before[j].row_bytes);
        assert_int_equal(t[k].flags, before[j].flags);
        next = t[k].chunk_end;
        j++;
    }
    assert_int_equal(sp->chunks, next);
    assert_int_equal(sp->n_kernel + sp->ce_ops, n);
}

static void test_share_zero_keeps_everything(void **state)
{
    (void)state;
    const shape_t sh[] = {{1, 1024 * MIB}, {1, 100 * MIB}, {1, 4096}};
    wsync_cuda_op_t t[3];
    const uint64_t chunks = plan(sh, 3, t);
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, 3, 0.0, 0, 1, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_kernel, 3);
    assert_int_equal(sp.n_ce, 0);
    assert_null(sp.ce);
    assert_int_equal(sp.chunks, chunks);
}

static void test_largest_first_up_to_the_share(void **state)
{
    (void)state;
    /* 100 MiB comes first in op order, but the 1 GiB op alone covers 10% */
    const shape_t sh[] = {{1, 100 * MIB}, {1, 1024 * MIB}, {1, 8 * MIB}, {4, 16 * MIB}};
    wsync_cuda_op_t t[4], before[4];
    plan(sh, 4, t);
    memcpy(before, t, sizeof(t));
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, 4, 0.1, 64 * MIB, 1, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 1);
    assert_ptr_equal(sp.ce[0].dst, before[1].dst);
    assert_int_equal(sp.ce[0].row_bytes, 1024 * MIB);
    assert_int_equal(sp.ce_bytes, 1024 * MIB);
    assert_compacted(before, 4, t, &sp);
    free(sp.ce);
}

static void test_minimum_and_2d_stay_with_the_kernel(void **state)
{
    (void)state;
    const shape_t sh[] = {{1, 100 * MIB}, {1, 1 * MIB}, {8, 64 * MIB}, {1, 0}, {1, 300 * MIB}};
    wsync_cuda_op_t t[5], before[5];
    plan(sh, 5, t);
    memcpy(before, t, sizeof(t));
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, 5, 1.0, 64 * MIB, 1, NULL, &sp, &err), WSYNC_OK);
    /* the 300 MiB and 100 MiB ops; not the 1 MiB one (minimum), the 2-D one or the empty one */
    assert_int_equal(sp.n_ce, 2);
    assert_ptr_equal(sp.ce[0].dst, before[0].dst); /* CE ops keep op order */
    assert_ptr_equal(sp.ce[1].dst, before[4].dst);
    assert_int_equal(sp.ce_bytes, 400 * MIB);
    assert_compacted(before, 5, t, &sp);
    for (size_t k = 0; k < sp.n_kernel; k++)
        assert_true(t[k].rows > 1 || t[k].row_bytes < 64 * MIB ||
                    t[k].chunk_end == t[k].chunk_begin);
    free(sp.ce);
}

static void test_everything_contiguous_with_no_minimum(void **state)
{
    (void)state;
    const shape_t sh[] = {{1, 28}, {1, 12345}, {4096, 128}, {1, 8 * MIB}};
    wsync_cuda_op_t t[4], before[4];
    plan(sh, 4, t);
    memcpy(before, t, sizeof(t));
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, 4, 1.0, 0, 1, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 3);
    assert_int_equal(sp.n_kernel, 1);
    assert_int_equal(t[0].rows, 4096); /* only the 2-D op is left */
    assert_compacted(before, 4, t, &sp);
    free(sp.ce);
}

static void test_lanes_balanced_by_bytes(void **state)
{
    (void)state;
    /* largest first to the least loaded lane: 400 -> 0, 300 -> 1, 200 -> 1, 100 -> 0 */
    const shape_t sh[] = {
        {1, 100 * MIB}, {1, 300 * MIB}, {1, 1 * MIB}, {1, 400 * MIB}, {1, 200 * MIB}};
    wsync_cuda_op_t t[5], before[5];
    plan(sh, 5, t);
    memcpy(before, t, sizeof(t));
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, 5, 1.0, 16 * MIB, 2, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 4);
    assert_int_equal(sp.lane_n[0], 2);
    assert_int_equal(sp.lane_n[1], 2);
    assert_int_equal(sp.lane_n[2] + sp.lane_n[3], 0);
    assert_ptr_equal(sp.ce[0].dst, before[0].dst); /* lane 0: 100, 400 in op order */
    assert_ptr_equal(sp.ce[1].dst, before[3].dst);
    assert_ptr_equal(sp.ce[2].dst, before[1].dst); /* lane 1: 300, 200 */
    assert_ptr_equal(sp.ce[3].dst, before[4].dst);
    for (size_t k = 0; k < sp.n_ce; k++) /* no transient marks left behind */
        assert_int_equal(sp.ce[k].flags, before[0].flags);
    assert_int_equal(sp.n_kernel, 1);
    assert_int_equal(t[0].flags, before[2].flags);
    assert_compacted(before, 5, t, &sp);
    free(sp.ce);
    /* more lanes than allowed are clamped; one lane takes everything in op order */
    plan(sh, 5, t);
    assert_int_equal(split(t, 5, 1.0, 16 * MIB, 99, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.lane_n[0] + sp.lane_n[1] + sp.lane_n[2] + sp.lane_n[3], 4);
    for (int k = 0; k < WSYNC_CUDA_MAX_LANES; k++)
        assert_true(sp.lane_n[k] <= 1);
    free(sp.ce);
    plan(sh, 5, t);
    assert_int_equal(split(t, 5, 1.0, 16 * MIB, 0, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.lane_n[0], 4);
    assert_ptr_equal(sp.ce[0].dst, before[0].dst);
    assert_ptr_equal(sp.ce[3].dst, before[4].dst);
    free(sp.ce);
}

/* Fake allocations for the joins: the one holding p. */
typedef struct fake_alloc {
    uintptr_t base;
    uint64_t size;
} fake_alloc_t;
static fake_alloc_t fake_allocs[8];
static size_t n_fake_allocs;
static unsigned fake_queries;

static int fake_range(const void *p, uintptr_t *base, size_t *size)
{
    fake_queries++;
    for (size_t k = 0; k < n_fake_allocs; k++) {
        const fake_alloc_t *a = &fake_allocs[k];
        if ((uintptr_t)p >= a->base && (uintptr_t)p < a->base + a->size) {
            *base = a->base;
            *size = a->size;
            return 1;
        }
    }
    return 0;
}

#define STAGING 0x7f0000000000ull
#define QKV 0x7e0000000000ull
#define W13 0x7d0000000000ull
#define EXPERTS 8

/* Op k: `bytes` from staging offset s to dst. */
static uint64_t op_at(wsync_cuda_op_t *t, uint64_t s, uintptr_t dst, uint64_t bytes, uint64_t c)
{
    return wsync_cuda_plan_op(t, (const void *)(uintptr_t)(STAGING + s), (void *)dst, bytes, bytes,
                              1, bytes, 0, c);
}

/* A bucket as the trainer packs it (q 16 MiB, k and v 4 MiB; then per expert gate and up, 3 MiB
 * each) into an engine that fuses qkv_proj and w13 (gate_e, up_e one after the other). */
static size_t fused_bucket(wsync_cuda_op_t *t)
{
    uint64_t c = 0, s = 0;
    size_t n = 0;
    const uint64_t qkv[3] = {16 * MIB, 4 * MIB, 4 * MIB};
    for (int k = 0; k < 3; s += qkv[k], k++)
        c += op_at(&t[n++], s, QKV + s, qkv[k], c);
    for (uint64_t e = 0; e < 2 * EXPERTS; e++, s += 3 * MIB)
        c += op_at(&t[n++], s, W13 + 3 * MIB * e, 3 * MIB, c);
    return n;
}

static void fake_allocs_fused(void)
{
    n_fake_allocs = 0;
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){STAGING, 1024 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){QKV, 24 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){W13, 6 * MIB * EXPERTS};
}

static void test_ops_that_continue_each_other_join(void **state)
{
    (void)state;
    wsync_cuda_op_t t[3 + 2 * EXPERTS], before[3 + 2 * EXPERTS];
    const size_t n = fused_bucket(t);
    memcpy(before, t, sizeof(t));
    fake_allocs_fused();
    fake_queries = 0;
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, n, 1.0, 16 * MIB, 2, fake_range, &sp, &err), WSYNC_OK);
    /* q, k, v: one 24 MiB copy; the 16 expert matrices: one 48 MiB copy */
    assert_int_equal(sp.n_ce, 2);
    assert_int_equal(sp.ce_ops, n);
    assert_int_equal(sp.n_kernel, 0);
    assert_int_equal(sp.ce_bytes, 72 * MIB);
    assert_int_equal(fake_queries, 4); /* two per joined run */
    for (size_t k = 0; k < 2; k++) {
        const int is_qkv = (uintptr_t)sp.ce[k].dst == QKV;
        assert_true(is_qkv || (uintptr_t)sp.ce[k].dst == W13);
        assert_int_equal(sp.ce[k].rows, 1);
        assert_int_equal(sp.ce[k].row_bytes, is_qkv ? 24 * MIB : 48 * MIB);
        assert_ptr_equal(sp.ce[k].src,
                         (const void *)(uintptr_t)(STAGING + (is_qkv ? 0 : 24 * MIB)));
    }
    free(sp.ce);
    /* every op reaches the minimum alone: no join is worth its allocation queries */
    memcpy(t, before, sizeof(t));
    fake_queries = 0;
    assert_int_equal(split(t, n, 1.0, 2 * MIB, 2, fake_range, &sp, &err), WSYNC_OK);
    assert_int_equal(fake_queries, 0);
    assert_int_equal(sp.n_ce, n);
    free(sp.ce);
    /* without the allocation oracle nothing is joined: q alone is large enough */
    memcpy(t, before, sizeof(t));
    assert_int_equal(split(t, n, 1.0, 16 * MIB, 2, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 1);
    assert_int_equal(sp.ce[0].row_bytes, 16 * MIB);
    assert_int_equal(sp.n_kernel, n - 1);
    assert_compacted(before, n, t, &sp);
    free(sp.ce);
}

static void test_joins_cut_at_allocation_ends(void **state)
{
    (void)state;
    wsync_cuda_op_t t[3 + 2 * EXPERTS], before[3 + 2 * EXPERTS];
    size_t n = fused_bucket(t);
    memcpy(before, t, sizeof(t));
    fake_allocs_fused();
    /* w13 in two allocations of 4 experts each: two 24 MiB copies */
    fake_allocs[2].size = 6 * MIB * EXPERTS / 2;
    fake_allocs[n_fake_allocs++] =
        (fake_alloc_t){W13 + 6 * MIB * EXPERTS / 2, 6 * MIB * EXPERTS / 2};
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, n, 1.0, 16 * MIB, 1, fake_range, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 3);
    assert_int_equal(sp.ce_ops, n);
    for (size_t k = 0; k < sp.n_ce; k++)
        assert_int_equal(sp.ce[k].row_bytes, 24 * MIB);
    free(sp.ce);
    /* every matrix in its own allocation, adjacent ones touching: none joined */
    memcpy(t, before, sizeof(t));
    n_fake_allocs = 2;
    fake_allocs[1] = (fake_alloc_t){QKV, 16 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){QKV + 16 * MIB, 4 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){QKV + 20 * MIB, 4 * MIB};
    assert_int_equal(split(t, n, 1.0, 4 * MIB, 1, fake_range, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 3); /* q, k, v each; the experts lie in no allocation: alone */
    assert_int_equal(sp.n_kernel, 2 * EXPERTS);
    assert_compacted(before, n, t, &sp);
    free(sp.ce);
}

static void test_join_rules(void **state)
{
    (void)state;
    n_fake_allocs = 0;
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){STAGING, 1024 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){QKV, 1024 * MIB};
    wsync_cuda_op_t t[4], before[4];
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    /* the same two halves listed in reverse: only consecutive ops join */
    uint64_t c = op_at(&t[0], 8 * MIB, QKV + 8 * MIB, 8 * MIB, 0);
    op_at(&t[1], 0, QKV, 8 * MIB, c);
    memcpy(before, t, 2 * sizeof(*t));
    assert_int_equal(split(t, 2, 1.0, 16 * MIB, 1, fake_range, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 0);
    assert_compacted(before, 2, t, &sp);
    /* contiguous in the source, not in the destination (a gap): not joined; a 2-D op between
     * two that continue each other breaks the run */
    c = op_at(&t[0], 0, QKV, 8 * MIB, 0);
    c += op_at(&t[1], 8 * MIB, QKV + 8 * MIB + 4096, 8 * MIB, c);
    c += wsync_cuda_plan_op(&t[2], (const void *)(uintptr_t)(STAGING + 16 * MIB),
                            (void *)(uintptr_t)(QKV + 16 * MIB + 4096), 8192, 4096, 2, 4096, 0, c);
    op_at(&t[3], 16 * MIB + 8192, QKV + 16 * MIB + 4096 + 8192, 8 * MIB, c);
    memcpy(before, t, sizeof(t));
    assert_int_equal(split(t, 4, 1.0, 16 * MIB, 1, fake_range, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 0);
    assert_int_equal(sp.n_kernel, 4);
    assert_compacted(before, 4, t, &sp);
}

/* Balanced lanes (WSYNC_CUDA_CE_BALANCE=1): a trainer's first bucket, the 1.24 GB embedding
 * then the matrices of two layers, fills lane after lane in op order, each to half the bytes,
 * the embedding cut at a 1 MiB multiple; the pieces cover every copy's bytes once, in order. */
static void test_lanes_balanced_by_cutting(void **state)
{
    (void)state;
    enum { N = 15 };
    shape_t sh[N] = {{1, 1187 * MIB}};
    for (size_t i = 1; i < N; i++)
        sh[i] = (shape_t){1, (i % 3 ? 32 : 96) * MIB};
    sh[7] = (shape_t){1, 8 * MIB}; /* under the minimum: the kernel's */
    wsync_cuda_op_t t[N], before[N];
    for (int lanes = 2; lanes <= WSYNC_CUDA_MAX_LANES; lanes++) {
        plan(sh, N, t);
        memcpy(before, t, sizeof(t));
        const wsync_cuda_split_cfg_t cfg = {1.0, 16 * MIB, lanes, NULL, 1};
        wsync_cuda_split_t sp;
        wsync_error_t err = {.struct_size = sizeof(err)};
        assert_int_equal(wsync_cuda_split(t, N, &cfg, &sp, &err), WSYNC_OK);
        assert_int_equal(sp.ce_ops, N - 1);
        assert_int_equal(sp.n_kernel, 1);
        assert_ptr_equal(t[0].dst, before[7].dst);
        uint64_t load[WSYNC_CUDA_MAX_LANES] = {0}, sum = 0;
        size_t at = 0, op = 0;
        uint64_t done = 0; /* bytes of before[op] covered so far */
        for (int k = 0; k < WSYNC_CUDA_MAX_LANES; k++)
            for (size_t j = 0; j < sp.lane_n[k]; j++, at++) {
                const wsync_cuda_op_t *c = &sp.ce[at];
                if (op == 7)
                    op++;
                assert_ptr_equal(c->src, before[op].src + done); /* the next bytes, in order */
                assert_ptr_equal(c->dst, before[op].dst + done);
                assert_int_equal(c->rows, 1);
                assert_true(c->chunk_end > c->chunk_begin);
                done += c->row_bytes;
                assert_true(done <= before[op].row_bytes);
                if (done == before[op].row_bytes) {
                    op++;
                    done = 0;
                }
                load[k] += c->row_bytes;
                sum += c->row_bytes;
            }
        assert_int_equal(at, sp.n_ce);
        assert_int_equal(op, N);
        assert_int_equal(sum, sp.ce_bytes);
        assert_true(sp.n_ce <= N - 1 + (size_t)lanes - 1);
        const uint64_t share = (sum / (uint64_t)lanes + MIB - 1) / MIB * MIB;
        for (int k = 0; k < lanes; k++) /* each lane within one copy's cut of its share */
            assert_true(load[k] + MIB > share || k == lanes - 1);
        for (int k = 0; k < lanes - 1; k++)
            assert_true(load[k] <= share);
        free(sp.ce);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share_zero_keeps_everything),
        cmocka_unit_test(test_largest_first_up_to_the_share),
        cmocka_unit_test(test_minimum_and_2d_stay_with_the_kernel),
        cmocka_unit_test(test_everything_contiguous_with_no_minimum),
        cmocka_unit_test(test_lanes_balanced_by_bytes),
        cmocka_unit_test(test_lanes_balanced_by_cutting),
        cmocka_unit_test(test_ops_that_continue_each_other_join),
        cmocka_unit_test(test_joins_cut_at_allocation_ends),
        cmocka_unit_test(test_join_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
