/* Direct mode's stage (wsync_direct_stage): a steady bucket -- the same tensors at the same
 * pointers, still in the same allocations -- keeps its layout and the text of its last emit, and
 * the manifest it then emits is byte for byte what a fresh build and a full emit write, also
 * when a sync's several buckets go through the one staging in turn; an allocation re-made under
 * a tensor, a tensor moved or reshaped, or the same tensors in another order, are staged again
 * (the text a fresh build gives); a locate error names the tensor and leaves the staged bucket
 * as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Library results are malloc'd; cmocka replaces free() with its checker below this point. */
static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#include "wsync_direct.h"
#include "wsync_error.h"

enum { N = 96, SEGS = 4, SEG_SHIFT = 24 };

/* Segment k is the 16 MiB at (k + 1) << 24, its allocation id ids[k] (a re-made allocation takes
 * a new id, as CUDA's buffer ids do); gone[k]: freed, a locate there fails. */
typedef struct world {
    uint64_t ids[SEGS];
    int gone[SEGS];
    size_t locates;
} world_t;

static wsync_result_t world_locate(void *user, const char *name, const void *src, uint64_t nbytes,
                                   wsync_buffer_desc_t *seg, uint64_t *offset, wsync_error_t *err)
{
    world_t *w = user;
    const uint64_t at = (uint64_t)(uintptr_t)src;
    const uint64_t k = (at >> SEG_SHIFT) - 1;
    w->locates++;
    if (k >= SEGS || w->gone[k])
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "tensor \"%s\": %p is not memory", name,
                          src);
    (void)nbytes;
    seg->kind = WSYNC_BUFFER_CUDA_IPC;
    memset(seg->handle, 0x5a, 64);
    memcpy(seg->handle + 8, &k, 8);
    memcpy(seg->handle + 64, &w->ids[k], 8);
    seg->handle_len = 72;
    seg->bytes = 1u << SEG_SHIFT;
    seg->pid = 4711;
    strcpy(seg->device, "GPU-0123");
    *offset = at & ((1u << SEG_SHIFT) - 1);
    return WSYNC_OK;
}

static char names[N][64];

static void tensors(wsync_stage_tensor_t *t)
{
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "model.layers.%zu.mlp.experts.%zu.%s.weight", i / 24,
                 i % 24 / 3, (const char *[]){"gate_proj", "up_proj", "down_proj"}[i % 3]);
        const uint64_t at = ((uint64_t)(i % SEGS + 1) << SEG_SHIFT) + 8192 * (i / SEGS);
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = names[i],
                                      .dtype = WSYNC_DTYPE_BF16,
                                      .ndim = 2,
                                      .shape = {16, 128},
                                      .src = (const void *)(uintptr_t)at};
    }
}

static wsync_buffer_desc_t sync_buffer(void)
{
    wsync_buffer_desc_t b = {.struct_size = sizeof(b), .kind = WSYNC_BUFFER_CUDA_IPC};
    b.handle_len = 64;
    b.bytes = 64;
    b.pid = 4711;
    strcpy(b.device, "GPU-0123");
    b.has_ready = 1;
    b.ready_len = 64;
    return b;
}

static char *emit(wsync_direct_t *d, uint64_t generation)
{
    const wsync_buffer_desc_t b = sync_buffer();
    char *text = NULL;
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    if (wsync_direct_emit(d, &b, generation, generation % 2, &text, &err) != WSYNC_OK)
        fail_msg("emit: %s", err.message);
    return text;
}

/* The text of a fresh build of t at `generation`: a full emit. */
static char *fresh(const wsync_stage_tensor_t *t, world_t *w, uint64_t generation)
{
    wsync_direct_t f;
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    if (wsync_direct_build(t, N, world_locate, w, &f, &err) != WSYNC_OK)
        fail_msg("build: %s", err.message);
    assert_null(f.tail);
    char *text = emit(&f, generation);
    wsync_direct_free(&f);
    return text;
}

static wsync_direct_t *stage_n(wsync_direct_set_t *set, const wsync_stage_tensor_t *t, size_t n,
                               world_t *w)
{
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    if (wsync_direct_stage(set, t, n, world_locate, w, &err) != WSYNC_OK)
        fail_msg("stage: %s", err.message);
    wsync_direct_t *d = wsync_direct_current(set);
    assert_non_null(d);
    return d;
}

static wsync_direct_t *stage_ok(wsync_direct_set_t *set, const wsync_stage_tensor_t *t, world_t *w)
{
    return stage_n(set, t, N, w);
}

/* Stage t into the set, emit at `generation`, and compare with a fresh build's text. *kept:
 * whether the bucket kept its layout. */
static void stage_and_compare(wsync_direct_set_t *set, const wsync_stage_tensor_t *t, world_t *w,
                              uint64_t generation, int *kept)
{
    const wsync_direct_t *was = wsync_direct_current(set);
    const wsync_tensor_desc_t *before = was != NULL ? was->layout.tensors : NULL;
    wsync_direct_t *d = stage_ok(set, t, w);
    *kept = before != NULL && d->layout.tensors == before;
    char *ours = emit(d, generation);
    char *want = fresh(t, w, generation);
    assert_string_equal(ours, want);
    real_free(ours);
    real_free(want);
}

/* The tensors, their world, and the set with them staged once (and checked against a fresh
 * build): where each test starts. */
typedef struct fixture {
    wsync_stage_tensor_t t[N];
    world_t w;
    wsync_direct_set_t set;
} fixture_t;

static void staged_once(fixture_t *f)
{
    memset(f, 0, sizeof(*f));
    tensors(f->t);
    const world_t w = {.ids = {11, 12, 13, 14}};
    f->w = w;
    int kept = 1;
    stage_and_compare(&f->set, f->t, &f->w, 1, &kept);
    assert_false(kept);
}

static void test_steady_bucket_keeps_its_layout_and_text(void **state)
{
    (void)state;
    static fixture_t f;
    staged_once(&f);
    const wsync_stage_tensor_t *t = f.t;
    world_t w = f.w;
    wsync_direct_set_t set = f.set;
    assert_non_null(wsync_direct_current(&set)->tail);
    for (uint64_t g = 2; g <= 4; g++) {
        w.locates = 0;
        const wsync_direct_t *was = wsync_direct_current(&set);
        const wsync_tensor_desc_t *layout = was->layout.tensors;
        const char *tail = was->tail;
        wsync_direct_t *d = stage_ok(&set, t, &w);
        assert_int_equal(w.locates, N); /* every tensor checked once: still where it was */
        assert_ptr_equal(d->layout.tensors, layout);
        assert_ptr_equal(d->tail, tail);
        char *ours = emit(d, g), *want = fresh(t, &w, g);
        assert_string_equal(ours, want);
        real_free(ours);
        real_free(want);
    }
    wsync_direct_set_free(&set);
}

/* A sync of three buckets through the one staging, three times: from the second sync on each
 * bucket is its kept self (no build), and each text is a fresh build's. */
static void test_buckets_of_a_sync_in_turn(void **state)
{
    (void)state;
    wsync_stage_tensor_t t[N];
    tensors(t);
    world_t w = {.ids = {11, 12, 13, 14}};
    wsync_direct_set_t set = {0};
    const size_t cut[4] = {0, 40, 70, N};
    const wsync_tensor_desc_t *layouts[3] = {NULL, NULL, NULL};
    for (uint64_t sync = 0; sync < 3; sync++) {
        for (size_t b = 0; b < 3; b++) {
            const size_t n = cut[b + 1] - cut[b];
            wsync_direct_t *d = stage_n(&set, t + cut[b], n, &w);
            if (sync == 0)
                layouts[b] = d->layout.tensors;
            else
                assert_ptr_equal(d->layout.tensors, layouts[b]); /* kept, not built */
            char *ours = emit(d, 3 * sync + b + 1);
            wsync_direct_t f;
            assert_int_equal(wsync_direct_build(t + cut[b], n, world_locate, &w, &f, NULL),
                             WSYNC_OK);
            char *want = emit(&f, 3 * sync + b + 1);
            assert_string_equal(ours, want);
            wsync_direct_free(&f);
            real_free(ours);
            real_free(want);
        }
    }
    assert_int_equal(set.n, 3);
    wsync_direct_set_free(&set);
}

static void test_changes_are_staged_again(void **state)
{
    (void)state;
    static fixture_t f;
    staged_once(&f);
    wsync_stage_tensor_t *t = f.t;
    world_t *w = &f.w;
    wsync_direct_set_t *set = &f.set;
    int kept = 0;
    char *first = emit(wsync_direct_current(set), 2);

    /* the allocation under segment 2 freed and made again at its address: a new id */
    w->ids[2] = 99;
    stage_and_compare(set, t, w, 2, &kept);
    assert_false(kept);
    char *now = emit(wsync_direct_current(set), 2);
    assert_string_not_equal(now, first);
    real_free(now);
    stage_and_compare(set, t, w, 3, &kept); /* and steady again */
    assert_true(kept);

    /* a tensor moved within its segment, one reshaped at the same address */
    t[5].src = (const char *)t[5].src + 256;
    stage_and_compare(set, t, w, 4, &kept);
    assert_false(kept);
    t[7].shape[0] = 8;
    t[7].shape[1] = 256;
    stage_and_compare(set, t, w, 5, &kept);
    assert_false(kept);
    char *shaped = emit(wsync_direct_current(set), 6);
    assert_non_null(strstr(shaped, "\"shape\":[8,256]"));
    real_free(shaped);
    assert_int_equal(set->n, 1); /* each new build took the place of the bucket it replaces */

    /* the same tensors in another order: built again, the same bucket, so the text stays */
    wsync_stage_tensor_t swapped[N];
    memcpy(swapped, t, sizeof(swapped));
    swapped[0] = t[1];
    swapped[1] = t[0];
    const char *tail = wsync_direct_current(set)->tail;
    assert_ptr_equal(stage_ok(set, swapped, w)->tail, tail);
    real_free(first);
    wsync_direct_set_free(set);
}

static void test_locate_error_names_the_tensor_and_keeps_the_bucket(void **state)
{
    (void)state;
    static fixture_t f;
    staged_once(&f);
    wsync_direct_set_t *set = &f.set;
    char *before = emit(wsync_direct_current(set), 2);
    const wsync_tensor_desc_t *layout = wsync_direct_current(set)->layout.tensors;
    f.w.gone[1] = 1; /* segment 1 freed for good */
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_direct_stage(set, f.t, N, world_locate, &f.w, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "is not memory"));
    assert_non_null(strstr(err.message, "model.layers."));
    assert_ptr_equal(wsync_direct_current(set)->layout.tensors, layout); /* as it was */
    char *after = emit(wsync_direct_current(set), 2);
    assert_string_equal(after, before);
    real_free(before);
    real_free(after);
    wsync_direct_set_free(set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady_bucket_keeps_its_layout_and_text),
        cmocka_unit_test(test_buckets_of_a_sync_in_turn),
        cmocka_unit_test(test_changes_are_staged_again),
        cmocka_unit_test(test_locate_error_names_the_tensor_and_keeps_the_bucket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
