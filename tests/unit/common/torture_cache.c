/* Mapping cache: a second acquire maps nothing, refcounts, unmap at zero, distinct keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_cache.h"

typedef struct fake_backend {
    int maps;
    int unmaps;
    int fail_next;
    void *last_unmapped;
    int tokens[16];
} fake_backend_t;

static wsync_result_t fake_map(void *user, const wsync_buffer_desc_t *desc, void **mapping,
                               wsync_error_t *err)
{
    fake_backend_t *b = user;
    (void)desc;
    if (b->fail_next) {
        b->fail_next = 0;
        if (err && err->code == WSYNC_OK) {
            err->code = WSYNC_ERR_SYSTEM;
            strcpy(err->message, "fake map failed");
        }
        return WSYNC_ERR_SYSTEM;
    }
    *mapping = &b->tokens[b->maps % 16];
    b->maps++;
    return WSYNC_OK;
}

static void fake_unmap(void *user, void *mapping)
{
    fake_backend_t *b = user;
    b->unmaps++;
    b->last_unmapped = mapping;
}

static wsync_buffer_desc_t desc(uint8_t first_byte, int64_t pid, const char *device)
{
    wsync_buffer_desc_t d;
    memset(&d, 0, sizeof(d));
    d.struct_size = sizeof(d);
    d.kind = WSYNC_BUFFER_CUDA_IPC;
    d.handle_len = 64;
    for (int i = 0; i < 64; i++)
        d.handle[i] = (uint8_t)(first_byte + i);
    d.bytes = 4096;
    d.pid = pid;
    strcpy(d.device, device);
    return d;
}

static void test_second_acquire_maps_nothing(void **state)
{
    (void)state;
    fake_backend_t b = {0};
    wsync_cache_t *c = wsync_cache_create(fake_map, fake_unmap, &b);
    assert_non_null(c);
    wsync_buffer_desc_t d = desc(1, 100, "GPU-a");
    wsync_cache_entry_t *e1 = NULL, *e2 = NULL;
    int hit = -1;
    assert_int_equal(wsync_cache_acquire(c, &d, &e1, &hit, NULL), WSYNC_OK);
    assert_int_equal(hit, 0);
    assert_int_equal(b.maps, 1);
    assert_int_equal(wsync_cache_maps(c), 1);
    assert_int_equal(e1->refs, 1);
    assert_int_equal(e1->opens, 1);
    assert_ptr_equal(e1->mapping, &b.tokens[0]);
    assert_int_equal(e1->last_generation, 0);

    /* A copy of the desc with different non-key fields (bytes, events) is the same buffer. */
    wsync_buffer_desc_t d2 = d;
    d2.bytes = 8192;
    d2.has_ready = 1;
    assert_int_equal(wsync_cache_acquire(c, &d2, &e2, &hit, NULL), WSYNC_OK);
    assert_int_equal(hit, 1);
    assert_ptr_equal(e1, e2);
    assert_int_equal(b.maps, 1);
    assert_int_equal(wsync_cache_maps(c), 1);
    assert_int_equal(e1->refs, 2);
    assert_int_equal(e1->opens, 2);
    assert_int_equal(wsync_cache_size(c), 1);
    /* hit may be NULL. */
    assert_int_equal(wsync_cache_acquire(c, &d, &e2, NULL, NULL), WSYNC_OK);
    assert_int_equal(e1->refs, 3);

    assert_int_equal(wsync_cache_release(c, e1), 2);
    assert_int_equal(wsync_cache_release(c, e1), 1);
    assert_int_equal(b.unmaps, 0);
    assert_int_equal(wsync_cache_release(c, e1), 0);
    assert_int_equal(b.unmaps, 1);
    assert_ptr_equal(b.last_unmapped, &b.tokens[0]);
    assert_int_equal(wsync_cache_size(c), 0);

    /* After the last release a new acquire maps again. */
    assert_int_equal(wsync_cache_acquire(c, &d, &e1, &hit, NULL), WSYNC_OK);
    assert_int_equal(hit, 0);
    assert_int_equal(wsync_cache_maps(c), 2);
    wsync_cache_destroy(c);
    assert_int_equal(b.unmaps, 2);
}

static void test_distinct_keys(void **state)
{
    (void)state;
    fake_backend_t b = {0};
    wsync_cache_t *c = wsync_cache_create(fake_map, fake_unmap, &b);
    wsync_buffer_desc_t keys[6];
    keys[0] = desc(1, 100, "GPU-a");
    keys[1] = desc(1, 101, "GPU-a"); /* pid */
    keys[2] = desc(1, 100, "GPU-b"); /* device */
    keys[3] = desc(2, 100, "GPU-a"); /* handle bytes */
    keys[4] = desc(1, 100, "GPU-a");
    keys[4].kind = WSYNC_BUFFER_HOST_SHM; /* kind */
    keys[5] = desc(1, 100, "GPU-a");
    keys[5].handle_len = 63; /* handle length */
    wsync_cache_entry_t *e[6];
    for (int i = 0; i < 6; i++) {
        int hit = -1;
        assert_int_equal(wsync_cache_acquire(c, &keys[i], &e[i], &hit, NULL), WSYNC_OK);
        assert_int_equal(hit, 0);
        for (int k = 0; k < i; k++) {
            assert_ptr_not_equal(e[i], e[k]);
            assert_false(wsync_cache_key_equal(&keys[i], &keys[k]));
        }
    }
    assert_int_equal(wsync_cache_size(c), 6);
    assert_int_equal(wsync_cache_maps(c), 6);
    /* Each key finds its own entry again. */
    for (int i = 5; i >= 0; i--) {
        wsync_cache_entry_t *again;
        int hit = 0;
        assert_int_equal(wsync_cache_acquire(c, &keys[i], &again, &hit, NULL), WSYNC_OK);
        assert_int_equal(hit, 1);
        assert_ptr_equal(again, e[i]);
        assert_true(wsync_cache_key_equal(&again->key, &keys[i]));
    }
    assert_int_equal(wsync_cache_maps(c), 6);
    /* Releasing one key's last references unmaps only that one. */
    void *mapping = e[3]->mapping;
    assert_int_equal(wsync_cache_release(c, e[3]), 1);
    assert_int_equal(wsync_cache_release(c, e[3]), 0);
    assert_int_equal(b.unmaps, 1);
    assert_ptr_equal(b.last_unmapped, mapping);
    assert_int_equal(wsync_cache_size(c), 5);
    /* Destroy unmaps the rest, each once. */
    wsync_cache_destroy(c);
    assert_int_equal(b.unmaps, 6);
}

static void test_map_failure(void **state)
{
    (void)state;
    fake_backend_t b = {0};
    wsync_cache_t *c = wsync_cache_create(fake_map, fake_unmap, &b);
    wsync_buffer_desc_t d = desc(9, 1, "GPU-z");
    wsync_cache_entry_t *e = (wsync_cache_entry_t *)(uintptr_t)1;
    wsync_error_t err = {0};
    b.fail_next = 1;
    assert_int_equal(wsync_cache_acquire(c, &d, &e, NULL, &err), WSYNC_ERR_SYSTEM);
    assert_null(e);
    assert_string_equal(err.message, "fake map failed");
    assert_int_equal(wsync_cache_size(c), 0);
    /* The failed key is not cached: the next acquire maps. */
    int hit = -1;
    assert_int_equal(wsync_cache_acquire(c, &d, &e, &hit, NULL), WSYNC_OK);
    assert_int_equal(hit, 0);
    assert_int_equal(b.maps, 1);
    assert_int_equal(wsync_cache_release(c, e), 0);
    wsync_cache_destroy(c);
    assert_int_equal(b.unmaps, 1);
}

static void test_many_syncs_no_growth(void **state)
{
    (void)state;
    fake_backend_t b = {0};
    wsync_cache_t *c = wsync_cache_create(fake_map, fake_unmap, &b);
    wsync_buffer_desc_t d = desc(3, 7, "GPU-q");
    wsync_cache_entry_t *held;
    assert_int_equal(wsync_cache_acquire(c, &d, &held, NULL, NULL), WSYNC_OK);
    for (int i = 0; i < 10000; i++) {
        wsync_cache_entry_t *e;
        assert_int_equal(wsync_cache_acquire(c, &d, &e, NULL, NULL), WSYNC_OK);
        assert_int_equal(wsync_cache_release(c, e), 1);
    }
    assert_int_equal(wsync_cache_maps(c), 1);
    assert_int_equal(held->opens, 10001);
    assert_int_equal(wsync_cache_size(c), 1);
    assert_int_equal(wsync_cache_release(c, held), 0);
    wsync_cache_destroy(c);
    assert_int_equal(b.unmaps, 1);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    fake_backend_t b = {0};
    assert_null(wsync_cache_create(NULL, fake_unmap, &b));
    assert_null(wsync_cache_create(fake_map, NULL, &b));
    wsync_cache_t *c = wsync_cache_create(fake_map, fake_unmap, &b);
    wsync_cache_entry_t *e;
    wsync_buffer_desc_t d = desc(1, 1, "x");
    wsync_error_t err = {0};
    assert_int_equal(wsync_cache_acquire(c, NULL, &e, NULL, &err), WSYNC_ERR_INVALID_ARGUMENT);
    d.handle_len = WSYNC_HANDLE_MAX + 1;
    assert_int_equal(wsync_cache_acquire(c, &d, &e, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT);
    assert_int_equal(wsync_cache_release(c, NULL), 0);
    assert_int_equal(b.maps, 0);
    wsync_cache_destroy(c);
    wsync_cache_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_acquire_maps_nothing),
        cmocka_unit_test(test_distinct_keys),
        cmocka_unit_test(test_map_failure),
        cmocka_unit_test(test_many_syncs_no_growth),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
