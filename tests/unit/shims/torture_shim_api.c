/* libwsync_shim.so's API (engine-shims/api/wsync_shim_api.h), as the Python package calls it:
 * the plugin loader, the planner, a worker with a parameter table serving the SGLang shim's
 * request for a bucket the CPU plugin's producer staged (bytes land in the engine's memory), a
 * replayed request refused as stale with the weights unchanged, and the argument checks: an
 * unknown engine, a duplicated or unnamed table entry, no parameter look-up at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_engine.h"
#include "wsync_shim_api.h"

static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#define HOST_PLUGIN WSYNC_TEST_PLUGIN_DIR "/libwsync_cpu.so"

static const wsync_plugin_t *plugin(void)
{
    const wsync_plugin_t *p = NULL;
    char path[512];
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_shim_plugin_open(HOST_PLUGIN, &p, path, sizeof(path), &err), WSYNC_OK);
    assert_non_null(strstr(path, "libwsync_cpu.so"));
    return p;
}

/* The engine's ops without a parameter callback: the table answers every look-up. */
static wsync_engine_ops_t table_ops(fake_engine_t *e)
{
    return (wsync_engine_ops_t){.struct_size = sizeof(wsync_engine_ops_t),
                                .user = e,
                                .tp = fake_tp_cb,
                                .dims = fake_dims_cb};
}

static size_t table_of(fake_engine_t *e, wsync_shim_param_t *t)
{
    for (size_t i = 0; i < e->n; i++) {
        t[i].name = e->params[i].name;
        assert_int_equal(fake_param_cb(e, e->params[i].name, &t[i].info), 0);
    }
    return e->n;
}

static void test_plan_in_engine_order(void **state)
{
    (void)state;
    const char *names[] = {"model.layers.0.self_attn.v_proj.weight", "model.norm.weight",
                           "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.0.self_attn.k_proj.weight"};
    uint64_t nbytes[] = {64, 16, 128, 64};
    size_t order[4], first[5], nb = 0;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(
        wsync_shim_plan("sglang", names, nbytes, 4, 1 << 20, 0, order, first, &nb, &err), WSYNC_OK);
    assert_int_equal(nb, 1);
    /* q, k, v side by side in qkv_proj's order, where its first tensor came; the norm stays */
    assert_string_equal(names[order[0]], "model.layers.0.self_attn.q_proj.weight");
    assert_string_equal(names[order[1]], "model.layers.0.self_attn.k_proj.weight");
    assert_string_equal(names[order[2]], "model.layers.0.self_attn.v_proj.weight");
    assert_string_equal(names[order[3]], "model.norm.weight");
    /* a tensor larger than a bucket is named */
    assert_int_equal(wsync_shim_plan("sglang", names, nbytes, 4, 100, 0, order, first, &nb, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "q_proj"));
    wsync_error_t e2 = {.struct_size = sizeof(e2)};
    assert_int_equal(wsync_shim_plan("tgi", names, nbytes, 4, 1 << 20, 0, order, first, &nb, &e2),
                     WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(e2.message, "\"tgi\""));
}

static void test_worker_serves_a_staged_bucket(void **state)
{
    (void)state;
    const wsync_plugin_t *p = plugin();
    fake_engine_t e;
    fake_engine_init(&e, 0, 1);
    wsync_shim_param_t table[8];
    wsync_engine_ops_t ops = table_ops(&e);
    wsync_shim_worker_config_t cfg = {.struct_size = sizeof(cfg),
                                      .engine = "sglang",
                                      .plugin_path = HOST_PLUGIN,
                                      .ops = &ops,
                                      .params = table,
                                      .n_params = table_of(&e, table)};
    wsync_shim_worker_t *w = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_shim_worker_open(&cfg, &w, &err), WSYNC_OK);
    int native = 1;
    char *backend = wsync_shim_worker_backend(w, &native);
    assert_int_equal(native, 0);
    assert_non_null(strstr(backend, "cpu "));
    wsync_shim_api_free(backend);

    /* the trainer: one norm tensor staged and published by the CPU plugin */
    wsync_staging_config_t sc = {.struct_size = sizeof(sc), .bytes = 1 << 16};
    wsync_staging_t *s = NULL;
    assert_int_equal(p->producer->create(&sc, &s, &err), WSYNC_OK);
    uint16_t src[8];
    for (int i = 0; i < 8; i++)
        src[i] = (uint16_t)(0x3f80 + i);
    wsync_stage_tensor_t t = {.struct_size = sizeof(t),
                              .name = "model.norm.weight",
                              .dtype = WSYNC_DTYPE_BF16,
                              .ndim = 1,
                              .shape = {8},
                              .src = src};
    assert_int_equal(p->producer->stage(s, NULL, &t, 1, &err), WSYNC_OK);
    const char *manifest = NULL;
    uint64_t gen = 0;
    assert_int_equal(p->producer->publish(s, NULL, 1, &manifest, &gen, &err), WSYNC_OK);
    char *msgs = wsync_shim_encode_bucket("sglang", &manifest, 1, 1, 1, "v1", 1, 1, 0, &err);
    assert_non_null(msgs);
    /* the messages are a JSON array of one request: strip the brackets */
    size_t n = strlen(msgs);
    assert_true(n > 2 && msgs[0] == '[' && msgs[n - 1] == ']');
    wsync_result_t rc = WSYNC_ERR_INTERNAL;
    char *reply = wsync_shim_worker_serve(w, msgs + 1, n - 2, &rc, &err);
    /* the bucket lands, and the request that commits the version names the parameters of the
     * table that no tensor fed (every one but the norm) */
    assert_int_equal(rc, WSYNC_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(reply, "fed by no tensor"));
    assert_non_null(strstr(reply, "model.embed_tokens.weight"));
    assert_null(strstr(reply, "model.norm.weight"));
    wsync_shim_api_free(reply);
    assert_int_equal(wsync_shim_worker_drain(w, &err), WSYNC_OK);
    assert_memory_equal(fake_mem(&e, "model.norm.weight"), src, sizeof(src));
    assert_int_equal(p->producer->wait_consumed(s, NULL, gen, &err), WSYNC_OK);

    /* the same request again: stale, and the engine's bytes stay */
    uint8_t before[16];
    memcpy(before, fake_mem(&e, "model.norm.weight"), sizeof(before));
    wsync_error_t e2 = {.struct_size = sizeof(e2)};
    reply = wsync_shim_worker_serve(w, msgs + 1, n - 2, &rc, &e2);
    assert_int_equal(rc, WSYNC_ERR_STALE_GENERATION);
    assert_non_null(strstr(reply, "\"ok\":false"));
    wsync_shim_api_free(reply);
    assert_memory_equal(fake_mem(&e, "model.norm.weight"), before, sizeof(before));
    wsync_shim_api_free(msgs);

    assert_int_equal(wsync_shim_worker_release(w, &err), WSYNC_OK);
    assert_int_equal(p->producer->retire(s, &err), WSYNC_OK);
    wsync_shim_worker_close(w);
}

static void expect_open_refused(wsync_shim_worker_config_t *cfg, wsync_result_t code,
                                const char *needle)
{
    wsync_shim_worker_t *w = (wsync_shim_worker_t *)1;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_shim_worker_open(cfg, &w, &err), code);
    if (strstr(err.message, needle) == NULL)
        print_error("message \"%s\" lacks \"%s\"\n", err.message, needle);
    assert_non_null(strstr(err.message, needle));
}

static void test_worker_open_refusals(void **state)
{
    (void)state;
    fake_engine_t e;
    fake_engine_init(&e, 0, 1);
    wsync_shim_param_t table[8];
    wsync_engine_ops_t ops = table_ops(&e);
    size_t n = table_of(&e, table);
    wsync_shim_worker_config_t cfg = {.struct_size = sizeof(cfg),
                                      .engine = "tgi",
                                      .plugin_path = HOST_PLUGIN,
                                      .ops = &ops,
                                      .params = table,
                                      .n_params = n};
    expect_open_refused(&cfg, WSYNC_ERR_NOT_FOUND, "\"tgi\"");
    cfg.engine = "vllm";
    table[3].name = table[2].name;
    expect_open_refused(&cfg, WSYNC_ERR_INVALID_ARGUMENT, "appears twice");
    table[3].name = NULL;
    expect_open_refused(&cfg, WSYNC_ERR_INVALID_ARGUMENT, "parameter 3 of the table");
    cfg.n_params = 0; /* no table and no ops->param */
    expect_open_refused(&cfg, WSYNC_ERR_INVALID_ARGUMENT, "ops->param or a parameter table");
    cfg.struct_size = 8;
    expect_open_refused(&cfg, WSYNC_ERR_INVALID_ARGUMENT, "struct_size");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_in_engine_order),
        cmocka_unit_test(test_worker_serves_a_staged_bucket),
        cmocka_unit_test(test_worker_open_refusals),
    };
    (void)real_free;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
