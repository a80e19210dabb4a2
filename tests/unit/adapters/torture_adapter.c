/* Adapter description from a PEFT directory and from named tensors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "adapter_fixture.h"
#include "wsync_adapter.h"
#include "wsync_safetensors.h"

static const char *CFG = "{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":16,"
                         "\"target_modules\":[\"q_proj\",\"v_proj\"],\"rank_pattern\":"
                         "{\"v_proj\":4},\"alpha_pattern\":{\"v_proj\":2}}";

static void test_from_dir(void **state)
{
    (void)state;
    char dir[256];
    fx_tempdir(dir, sizeof(dir));
    fx_module_t mods[] = {
        {"model.layers.1.self_attn.v_proj", 4, 16, 8, WSYNC_DTYPE_BF16, 10},
        {"model.layers.0.self_attn.q_proj", 8, 16, 16, WSYNC_DTYPE_F32, 20},
    };
    fx_write_adapter(dir, mods, 2);
    fx_write_text(dir, "adapter_config.json", CFG);
    wsync_adapter_t *a = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_adapter_from_dir(dir, &a, &err) != WSYNC_OK)
        fail_msg("%s", err.message);
    assert_int_equal(a->memory, WSYNC_ADAPTER_MEM_HOST);
    assert_int_equal(a->n_modules, 2);
    assert_string_equal(a->modules[0].hf_module, "model.layers.0.self_attn.q_proj");
    const wsync_adapter_module_t *q = wsync_adapter_find(a, "model.layers.0.self_attn.q_proj");
    const wsync_adapter_module_t *v = wsync_adapter_find(a, "model.layers.1.self_attn.v_proj");
    assert_non_null(q);
    assert_non_null(v);
    assert_null(wsync_adapter_find(a, "model.layers.0.self_attn.k_proj"));
    assert_int_equal(q->rank, 8);
    assert_true(q->scaling == 2.0);
    assert_int_equal(v->rank, 4);
    assert_true(v->alpha == 2.0 && v->scaling == 0.5);
    assert_int_equal(q->a.dtype, WSYNC_DTYPE_F32);
    assert_int_equal(q->a.shape[0], 8);
    assert_int_equal(q->a.shape[1], 16);
    assert_int_equal(q->b.shape[0], 16);
    assert_int_equal(v->b.dtype, WSYNC_DTYPE_BF16);
    for (uint64_t i = 0; i < 8 * 16; i++)
        assert_true(fx_load(q->a.data, WSYNC_DTYPE_F32, i) == fx_value(20, i));
    for (uint64_t i = 0; i < 8 * 4; i++)
        assert_true(fx_load(v->b.data, WSYNC_DTYPE_BF16, i) == fx_value(11, i));
    wsync_adapter_free(a);
    fx_rmtree(dir);
}

static void expect_dir_error(const char *dir, wsync_result_t code, const char *needle)
{
    wsync_adapter_t *a = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t rc = wsync_adapter_from_dir(dir, &a, &err);
    if (rc != code || a != NULL || strstr(err.message, needle) == NULL)
        fail_msg("rc %d (want %d), message \"%s\" (want \"%s\")", rc, code, err.message, needle);
}

static void test_dir_refusals(void **state)
{
    (void)state;
    char dir[256];
    fx_tempdir(dir, sizeof(dir));
    expect_dir_error(dir, WSYNC_ERR_NOT_FOUND, "adapter_config.json is missing");
    fx_write_text(dir, "adapter_config.json", CFG);
    expect_dir_error(dir, WSYNC_ERR_NOT_FOUND, "no adapter_model.safetensors");
    fx_write_text(dir, "adapter_model.bin", "\x80\x02}q\x00.");
    expect_dir_error(dir, WSYNC_ERR_NOT_SUPPORTED,
                     "adapter_model.bin (pickle) is not supported; save with "
                     "safe_serialization=True");
    fx_write_text(dir, "adapter_config.json",
                  "{\"r\":8,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],"
                  "\"modules_to_save\":[\"lm_head\"]}");
    expect_dir_error(dir, WSYNC_ERR_NOT_SUPPORTED,
                     "modules_to_save [\"lm_head\"] is not supported");
    char file[300];
    snprintf(file, sizeof(file), "%s/adapter_config.json", dir);
    expect_dir_error(file, WSYNC_ERR_NOT_FOUND, "is not a directory");
    fx_rmtree(dir);
}

static wsync_adapter_tensor_t tensor(const char *name, wsync_dtype_t dt, int64_t r, int64_t c,
                                     const void *data)
{
    wsync_adapter_tensor_t t = {
        .name = name, .dtype = dt, .ndim = 2, .shape = {r, c}, .data = data};
    t.nbytes = (uint64_t)(r * c) * (dt == WSYNC_DTYPE_F32 ? 4 : dt == WSYNC_DTYPE_F64 ? 8 : 2);
    return t;
}

static void expect_tensors_error(const wsync_adapter_tensor_t *t, size_t n, wsync_result_t code,
                                 const char *needle)
{
    wsync_adapter_t *a = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    const char *cfg = "{\"r\":2,\"lora_alpha\":4,\"target_modules\":[\"q_proj\",\"k_proj\"]}";
    wsync_result_t rc =
        wsync_adapter_from_tensors(cfg, strlen(cfg), t, n, WSYNC_ADAPTER_MEM_BUFFER, &a, &err);
    if (rc != code || a != NULL || strstr(err.message, needle) == NULL)
        fail_msg("rc %d (want %d), message \"%s\" (want \"%s\")", rc, code, err.message, needle);
}

static void test_from_tensors(void **state)
{
    (void)state;
    static float buf[64];
    const char *QA = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    const char *QB = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    wsync_adapter_tensor_t ok[2] = {tensor(QA, WSYNC_DTYPE_F32, 2, 8, buf),
                                    tensor(QB, WSYNC_DTYPE_F32, 4, 2, buf)};
    const char *cfg = "{\"r\":2,\"lora_alpha\":4,\"target_modules\":[\"q_proj\"],"
                      "\"use_rslora\":true}";
    wsync_adapter_t *a = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(
        wsync_adapter_from_tensors(cfg, strlen(cfg), ok, 2, WSYNC_ADAPTER_MEM_BUFFER, &a, &err),
        WSYNC_OK);
    assert_int_equal(a->memory, WSYNC_ADAPTER_MEM_BUFFER);
    assert_int_equal(a->n_modules, 1);
    assert_ptr_equal(a->modules[0].a.data, buf);
    assert_true(a->modules[0].scaling > 2.8284 && a->modules[0].scaling < 2.8285); /* 4/sqrt(2) */
    wsync_adapter_free(a);

    wsync_adapter_tensor_t only_a[1] = {ok[0]};
    expect_tensors_error(only_a, 1, WSYNC_ERR_BAD_ADAPTER, "lora_B.weight is missing");
    wsync_adapter_tensor_t dup[3] = {
        ok[0], ok[1],
        tensor("model.layers.0.self_attn.q_proj.lora_A.weight", WSYNC_DTYPE_F32, 2, 8, buf)};
    expect_tensors_error(dup, 3, WSYNC_ERR_BAD_ADAPTER, "two lora_A tensors");
    wsync_adapter_tensor_t head[3] = {
        ok[0], ok[1], tensor("base_model.model.lm_head.weight", WSYNC_DTYPE_F32, 4, 2, buf)};
    expect_tensors_error(head, 3, WSYNC_ERR_BAD_ADAPTER,
                         "\"base_model.model.lm_head.weight\" is not a LoRA weight");
    wsync_adapter_tensor_t emb[1] = {
        tensor("base_model.model.model.embed_tokens.lora_embedding_A", WSYNC_DTYPE_F32, 2, 8, buf)};
    expect_tensors_error(emb, 1, WSYNC_ERR_NOT_SUPPORTED, "embeddings");
    wsync_adapter_tensor_t dora[3] = {
        ok[0], ok[1],
        tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
               WSYNC_DTYPE_F32, 1, 4, buf)};
    expect_tensors_error(dora, 3, WSYNC_ERR_NOT_SUPPORTED, "DoRA");
    wsync_adapter_tensor_t rank[2] = {tensor(QA, WSYNC_DTYPE_F32, 3, 8, buf),
                                      tensor(QB, WSYNC_DTYPE_F32, 4, 3, buf)};
    expect_tensors_error(rank, 2, WSYNC_ERR_BAD_ADAPTER, "do not have rank 2");
    wsync_adapter_tensor_t untargeted[2] = {
        tensor("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", WSYNC_DTYPE_F32, 2, 8,
               buf),
        tensor("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight", WSYNC_DTYPE_F32, 4, 2,
               buf)};
    expect_tensors_error(untargeted, 2, WSYNC_ERR_BAD_ADAPTER,
                         "\"model.layers.0.mlp.up_proj\" has LoRA tensors but");
    wsync_adapter_tensor_t badsize[2] = {ok[0], ok[1]};
    badsize[1].nbytes = 12;
    expect_tensors_error(badsize, 2, WSYNC_ERR_BAD_ADAPTER, "nbytes 12");
    expect_tensors_error(NULL, 0, WSYNC_ERR_BAD_ADAPTER, "no tensors");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_dir),
        cmocka_unit_test(test_dir_refusals),
        cmocka_unit_test(test_from_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
