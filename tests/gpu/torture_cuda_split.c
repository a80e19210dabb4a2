/* The copy engines' share of a batch (plugin/cuda/wsync_cuda_split.c), without a device: the
 * largest contiguous ops first up to the share, none under the minimum, 2-D and empty ops always
 * left to the kernel, the kernel's ops compacted in order with their chunk spans kept, and the
 * copy engines' ops dealt over the lanes by bytes, each lane in op order; ops that continue each
 * other joined, and equal ops at constant strides (a MoE layer's experts fused in one engine
 * parameter) joined into one 2-D copy, never across two allocations. */
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
                            int lanes, wsync_cuda_one_alloc_fn one_alloc, wsync_cuda_split_t *sp,
                            wsync_error_t *err)
{
    const wsync_cuda_split_cfg_t cfg = {share, min_bytes, lanes, one_alloc};
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

/* Fake allocations for the joins: one_alloc says whether lo..hi lie in one of them. */
typedef struct fake_alloc {
    uintptr_t base;
    uint64_t size;
} fake_alloc_t;
static fake_alloc_t fake_allocs[8];
static size_t n_fake_allocs;

static int fake_one_alloc(const void *lo, const void *hi)
{
    for (size_t k = 0; k < n_fake_allocs; k++) {
        const fake_alloc_t *a = &fake_allocs[k];
        if ((uintptr_t)lo >= a->base && (uintptr_t)lo < a->base + a->size)
            return (uintptr_t)hi >= (uintptr_t)lo && (uintptr_t)hi < a->base + a->size;
    }
    return 0;
}

#define STAGING 0x7f0000000000ull
#define W13 0x7e0000000000ull
#define W2 0x7d0000000000ull
#define ATTN 0x7c0000000000ull
#define EXPERTS 8

/* A MoE bucket as the trainer packs it (per expert gate, up, down, 3 MiB each, then a 20 MiB
 * attention matrix) into an engine that fuses experts: gate_e and up_e one after the other in
 * w13, down_e in w2. Returns the op count (3 * EXPERTS + 1). */
static size_t moe_bucket(wsync_cuda_op_t *t)
{
    uint64_t chunks = 0;
    size_t n = 0;
    for (uint64_t e = 0; e < EXPERTS; e++) {
        const uint64_t s = STAGING + 9 * MIB * e;
        const uintptr_t dst[3] = {W13 + 6 * MIB * e, W13 + 6 * MIB * e + 3 * MIB, W2 + 3 * MIB * e};
        for (int k = 0; k < 3; k++, n++)
            chunks += wsync_cuda_plan_op(&t[n], (const void *)(uintptr_t)(s + 3 * MIB * k),
                                         (void *)dst[k], 3 * MIB, 3 * MIB, 1, 3 * MIB, 0, chunks);
    }
    chunks +=
        wsync_cuda_plan_op(&t[n], (const void *)(uintptr_t)(STAGING + 9 * MIB * EXPERTS),
                           (void *)(uintptr_t)ATTN, 20 * MIB, 20 * MIB, 1, 20 * MIB, 0, chunks);
    return n + 1;
}

static void fake_allocs_moe(int split_w13)
{
    n_fake_allocs = 0;
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){STAGING, 1024 * MIB};
    if (split_w13) { /* experts 0-3 and 4-7 in two allocations */
        fake_allocs[n_fake_allocs++] = (fake_alloc_t){W13, 6 * MIB * EXPERTS / 2};
        fake_allocs[n_fake_allocs++] =
            (fake_alloc_t){W13 + 6 * MIB * EXPERTS / 2, 6 * MIB * EXPERTS / 2};
    } else {
        fake_allocs[n_fake_allocs++] = (fake_alloc_t){W13, 6 * MIB * EXPERTS};
    }
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){W2, 3 * MIB * EXPERTS};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){ATTN, 20 * MIB};
}

static void test_fused_experts_become_strided_copies(void **state)
{
    (void)state;
    wsync_cuda_op_t t[3 * EXPERTS + 1], before[3 * EXPERTS + 1];
    const size_t n = moe_bucket(t);
    memcpy(before, t, sizeof(t));
    fake_allocs_moe(0);
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(split(t, n, 1.0, 16 * MIB, 1, fake_one_alloc, &sp, &err), WSYNC_OK);
    /* w13: gate_e + up_e joined (6 MiB), 8 rows 9 MiB apart in staging, 6 MiB in w13; w2: 8 rows
     * of 3 MiB, 9 MiB and 3 MiB apart; the attention matrix alone. Nothing left to the kernel. */
    assert_int_equal(sp.n_ce, 3);
    assert_int_equal(sp.ce_ops, n);
    assert_int_equal(sp.n_kernel, 0);
    assert_int_equal(sp.chunks, 0);
    assert_int_equal(sp.ce_bytes, (9 * EXPERTS + 20) * MIB);
    int seen = 0;
    for (size_t k = 0; k < sp.n_ce; k++) {
        const wsync_cuda_op_t *c = &sp.ce[k];
        if ((uintptr_t)c->dst == W13) {
            assert_ptr_equal(c->src, (const void *)(uintptr_t)STAGING);
            assert_int_equal(c->rows, EXPERTS);
            assert_int_equal(c->row_bytes, 6 * MIB);
            assert_int_equal(c->src_pitch, 9 * MIB);
            assert_int_equal(c->dst_pitch, 6 * MIB);
            seen |= 1;
        } else if ((uintptr_t)c->dst == W2) {
            assert_ptr_equal(c->src, (const void *)(uintptr_t)(STAGING + 6 * MIB));
            assert_int_equal(c->rows, EXPERTS);
            assert_int_equal(c->row_bytes, 3 * MIB);
            assert_int_equal(c->src_pitch, 9 * MIB);
            assert_int_equal(c->dst_pitch, 3 * MIB);
            seen |= 2;
        } else {
            assert_int_equal((uintptr_t)c->dst, ATTN);
            assert_int_equal(c->rows, 1);
            assert_int_equal(c->row_bytes, 20 * MIB);
            seen |= 4;
        }
    }
    assert_int_equal(seen, 7);
    free(sp.ce);
}

static void test_runs_cut_at_allocation_ends(void **state)
{
    (void)state;
    wsync_cuda_op_t t[3 * EXPERTS + 1], before[3 * EXPERTS + 1];
    size_t n = moe_bucket(t);
    memcpy(before, t, sizeof(t));
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    /* w13 in two allocations: its run is cut where the first ends, into two 2-D copies of 4
     * rows */
    fake_allocs_moe(1);
    assert_int_equal(split(t, n, 1.0, 16 * MIB, 1, fake_one_alloc, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 4);
    assert_int_equal(sp.ce_ops, n);
    int halves = 0;
    for (size_t k = 0; k < sp.n_ce; k++)
        if ((uintptr_t)sp.ce[k].dst == W13 ||
            (uintptr_t)sp.ce[k].dst == W13 + 6 * MIB * EXPERTS / 2) {
            assert_int_equal(sp.ce[k].rows, EXPERTS / 2);
            assert_int_equal(sp.ce[k].row_bytes, 6 * MIB);
            halves++;
        }
    assert_int_equal(halves, 2);
    free(sp.ce);
    /* no allocation oracle: nothing is joined */
    n = moe_bucket(t);
    assert_int_equal(split(t, n, 1.0, 16 * MIB, 1, NULL, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 1);
    assert_int_equal((uintptr_t)sp.ce[0].dst, ATTN);
    assert_int_equal(sp.n_kernel, 3 * EXPERTS);
    assert_compacted(before, n, t, &sp);
    free(sp.ce);
}

static void test_join_rules(void **state)
{
    (void)state;
    n_fake_allocs = 0;
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){STAGING, 1024 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){W13, 1024 * MIB};
    wsync_cuda_op_t t[4], before[4];
    wsync_cuda_split_t sp;
    wsync_error_t err = {.struct_size = sizeof(err)};
    uint64_t c = 0;
    /* two ops that continue each other on both sides (listed out of order): one 16 MiB copy */
    c += wsync_cuda_plan_op(&t[0], (const void *)(uintptr_t)(STAGING + 8 * MIB),
                            (void *)(uintptr_t)(W13 + 8 * MIB), 8 * MIB, 8 * MIB, 1, 8 * MIB, 0, c);
    c += wsync_cuda_plan_op(&t[1], (const void *)(uintptr_t)STAGING, (void *)(uintptr_t)W13,
                            8 * MIB, 8 * MIB, 1, 8 * MIB, 0, c);
    assert_int_equal(split(t, 2, 1.0, 16 * MIB, 1, fake_one_alloc, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 1);
    assert_int_equal(sp.ce[0].rows, 1);
    assert_int_equal(sp.ce[0].row_bytes, 16 * MIB);
    assert_ptr_equal(sp.ce[0].src, (const void *)(uintptr_t)STAGING);
    assert_int_equal(sp.ce_ops, 2);
    free(sp.ce);
    /* the same two ops in two allocations that happen to be adjacent: not joined */
    fake_allocs[1] = (fake_alloc_t){W13, 8 * MIB};
    fake_allocs[n_fake_allocs++] = (fake_alloc_t){W13 + 8 * MIB, 8 * MIB};
    memcpy(before, t, 2 * sizeof(*t));
    assert_int_equal(split(t, 2, 1.0, 16 * MIB, 1, fake_one_alloc, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 0);
    assert_int_equal(sp.n_kernel, 2);
    assert_compacted(before, 2, t, &sp);
    assert_int_equal(split(t, 2, 1.0, 8 * MIB, 1, fake_one_alloc, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 2);
    free(sp.ce);
    fake_allocs[1] = (fake_alloc_t){W13, 1024 * MIB};
    n_fake_allocs = 2;
    /* equal ops, destination strides constant but sources going backwards: no 2-D copy;
     * unequal sizes: none either */
    c = 0;
    for (uint64_t k = 0; k < 4; k++) {
        const uint64_t bytes = k == 3 ? 5 * MIB : 6 * MIB;
        c += wsync_cuda_plan_op(&t[k], (const void *)(uintptr_t)(STAGING + 64 * MIB - 9 * MIB * k),
                                (void *)(uintptr_t)(W13 + 8 * MIB * k), bytes, bytes, 1, bytes, 0,
                                c);
    }
    memcpy(before, t, sizeof(t));
    assert_int_equal(split(t, 4, 1.0, 16 * MIB, 1, fake_one_alloc, &sp, &err), WSYNC_OK);
    assert_int_equal(sp.n_ce, 0);
    assert_int_equal(sp.n_kernel, 4);
    assert_compacted(before, 4, t, &sp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share_zero_keeps_everything),
        cmocka_unit_test(test_largest_first_up_to_the_share),
        cmocka_unit_test(test_minimum_and_2d_stay_with_the_kernel),
        cmocka_unit_test(test_everything_contiguous_with_no_minimum),
        cmocka_unit_test(test_lanes_balanced_by_bytes),
        cmocka_unit_test(test_fused_experts_become_strided_copies),
        cmocka_unit_test(test_runs_cut_at_allocation_ends),
        cmocka_unit_test(test_join_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
