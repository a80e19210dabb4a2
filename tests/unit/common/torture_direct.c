/* Direct mode's stage (wsync_direct_stage): a steady bucket -- the same tensors at the same
 * pointers, still in the same allocations -- keeps its layout and the text of its last emit, and
 * the manifest it then emits is byte for byte what a fresh build and a full emit write; an
 * allocation re-made under a tensor, a tensor moved or reshaped, or the same tensors in another
 * order, are staged again (the text a fresh build gives); a locate error names the tensor and
 * leaves the staged bucket as it was. */
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

static void stage_ok(wsync_direct_t *d, int *have, const wsync_stage_tensor_t *t, world_t *w)
{
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    if (wsync_direct_stage(d, have, t, N, world_locate, w, &err) != WSYNC_OK)
        fail_msg("stage: %s", err.message);
}

/* Stage t into d, emit at `generation`, and compare with a fresh build's text. *kept: whether d
 * kept its layout. */
static void stage_and_compare(wsync_direct_t *d, int *have, const wsync_stage_tensor_t *t,
                              world_t *w, uint64_t generation, int *kept)
{
    const wsync_tensor_desc_t *before = *have ? d->layout.tensors : NULL;
    stage_ok(d, have, t, w);
    *kept = before != NULL && d->layout.tensors == before;
    char *ours = emit(d, generation);
    char *want = fresh(t, w, generation);
    assert_string_equal(ours, want);
    real_free(ours);
    real_free(want);
}

static void test_steady_bucket_keeps_its_layout_and_text(void **state)
{
    (void)state;
    wsync_stage_tensor_t t[N];
    tensors(t);
    world_t w = {.ids = {11, 12, 13, 14}};
    wsync_direct_t d;
    int have = 0, kept = 0;
    stage_and_compare(&d, &have, t, &w, 1, &kept);
    assert_true(have);
    assert_false(kept);
    assert_non_null(d.tail);
    for (uint64_t g = 2; g <= 4; g++) {
        w.locates = 0;
        const wsync_tensor_desc_t *layout = d.layout.tensors;
        const char *tail = d.tail;
        stage_ok(&d, &have, t, &w);
        assert_int_equal(w.locates, N); /* every tensor checked once: still where it was */
        assert_ptr_equal(d.layout.tensors, layout);
        assert_ptr_equal(d.tail, tail);
        char *ours = emit(&d, g), *want = fresh(t, &w, g);
        assert_string_equal(ours, want);
        real_free(ours);
        real_free(want);
    }
    wsync_direct_free(&d);
}

static void test_changes_are_staged_again(void **state)
{
    (void)state;
    wsync_stage_tensor_t t[N];
    tensors(t);
    world_t w = {.ids = {11, 12, 13, 14}};
    wsync_direct_t d;
    int have = 0, kept = 0;
    stage_and_compare(&d, &have, t, &w, 1, &kept);
    char *first = emit(&d, 2);

    /* the allocation under segment 2 freed and made again at its address: a new id */
    w.ids[2] = 99;
    stage_and_compare(&d, &have, t, &w, 2, &kept);
    assert_false(kept);
    char *now = emit(&d, 2);
    assert_string_not_equal(now, first);
    real_free(now);
    stage_and_compare(&d, &have, t, &w, 3, &kept); /* and steady again */
    assert_true(kept);

    /* a tensor moved within its segment, one reshaped at the same address */
    t[5].src = (const char *)t[5].src + 256;
    stage_and_compare(&d, &have, t, &w, 4, &kept);
    assert_false(kept);
    t[7].shape[0] = 8;
    t[7].shape[1] = 256;
    stage_and_compare(&d, &have, t, &w, 5, &kept);
    assert_false(kept);
    char *shaped = emit(&d, 6);
    assert_non_null(strstr(shaped, "\"shape\":[8,256]"));
    real_free(shaped);

    /* the same tensors in another order: built again, the same bucket, so the text stays */
    wsync_stage_tensor_t swapped[N];
    memcpy(swapped, t, sizeof(swapped));
    swapped[0] = t[1];
    swapped[1] = t[0];
    const char *tail = d.tail;
    stage_ok(&d, &have, swapped, &w);
    assert_ptr_equal(d.tail, tail);
    real_free(first);
    wsync_direct_free(&d);
}

static void test_locate_error_names_the_tensor_and_keeps_the_bucket(void **state)
{
    (void)state;
    wsync_stage_tensor_t t[N];
    tensors(t);
    world_t w = {.ids = {11, 12, 13, 14}};
    wsync_direct_t d;
    int have = 0, kept = 0;
    stage_and_compare(&d, &have, t, &w, 1, &kept);
    char *before = emit(&d, 2);
    const wsync_tensor_desc_t *layout = d.layout.tensors;
    w.gone[1] = 1; /* segment 1 freed for good */
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_direct_stage(&d, &have, t, N, world_locate, &w, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "is not memory"));
    assert_non_null(strstr(err.message, "model.layers."));
    assert_ptr_equal(d.layout.tensors, layout); /* the staged bucket as it was */
    char *after = emit(&d, 2);
    assert_string_equal(after, before);
    real_free(before);
    real_free(after);
    wsync_direct_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady_bucket_keeps_its_layout_and_text),
        cmocka_unit_test(test_changes_are_staged_again),
        cmocka_unit_test(test_locate_error_names_the_tensor_and_keeps_the_bucket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
