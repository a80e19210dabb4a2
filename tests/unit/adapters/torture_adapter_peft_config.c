/* adapter_config.json: accepted forms, PEFT's matching rules, and each refused field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_peft_config.h"
#include "wsync_error.h"
#include "wsync_pyregex.h"

static wsync_peft_config_t *parse_ok(const char *json)
{
    wsync_peft_config_t *cfg = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t rc = wsync_peft_config_parse(json, strlen(json), &cfg, &err);
    if (rc != WSYNC_OK)
        fail_msg("config refused: %s", err.message);
    return cfg;
}

static void test_list_targets(void **state)
{
    (void)state;
    wsync_peft_config_t *cfg = parse_ok(
        "{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\","
        "\"self_attn.v_proj\",\"model.layers.3.mlp.down_proj\"],\"bias\":\"none\","
        "\"modules_to_save\":null,\"use_dora\":false,\"fan_in_fan_out\":false,"
        "\"task_type\":\"CAUSAL_LM\",\"lora_dropout\":0.05,\"some_future_key\":{\"x\":1}}");
    assert_true(wsync_peft_config_targets(cfg, "model.layers.0.self_attn.q_proj"));
    assert_true(wsync_peft_config_targets(cfg, "q_proj"));
    assert_true(wsync_peft_config_targets(cfg, "model.layers.7.self_attn.v_proj"));
    assert_true(wsync_peft_config_targets(cfg, "model.layers.3.mlp.down_proj"));
    assert_false(wsync_peft_config_targets(cfg, "model.layers.4.mlp.down_proj"));
    assert_false(wsync_peft_config_targets(cfg, "model.layers.0.self_attn.xq_proj"));
    assert_false(wsync_peft_config_targets(cfg, "model.layers.0.cross_attn.v_proj.x"));
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.0.self_attn.q_proj"), 8);
    assert_true(wsync_peft_config_alpha(cfg, "model.layers.0.self_attn.q_proj") == 16.0);
    assert_true(wsync_peft_config_scaling(cfg, 8, 16.0) == 2.0);
    wsync_peft_config_free(cfg);
}

static void test_regex_and_all_linear(void **state)
{
    (void)state;
    wsync_peft_config_t *cfg =
        parse_ok("{\"r\":4,\"lora_alpha\":8,\"target_modules\":"
                 "\".*\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.(q|v)_proj\",\"use_rslora\":true}");
    assert_true(wsync_peft_config_targets(cfg, "model.layers.12.self_attn.q_proj"));
    assert_true(wsync_peft_config_targets(cfg, "model.layers.0.self_attn.v_proj"));
    assert_false(wsync_peft_config_targets(cfg, "model.layers.0.self_attn.k_proj"));
    assert_false(wsync_peft_config_targets(cfg, "model.layers.x.self_attn.q_proj"));
    /* fullmatch: a match of a prefix is not enough */
    assert_false(wsync_peft_config_targets(cfg, "model.layers.0.self_attn.q_proj.base"));
    assert_true(fabs(wsync_peft_config_scaling(cfg, 4, 8.0) - 4.0) < 1e-12); /* 8/sqrt(4) */
    assert_true(wsync_peft_config_use_rslora(cfg));
    wsync_peft_config_free(cfg);

    cfg = parse_ok("{\"r\":4,\"lora_alpha\":8,\"target_modules\":\"all-linear\","
                   "\"exclude_modules\":[\"down_proj\"]}");
    assert_true(wsync_peft_config_targets(cfg, "model.layers.0.mlp.up_proj"));
    assert_false(wsync_peft_config_targets(cfg, "model.layers.0.mlp.down_proj"));
    assert_false(wsync_peft_config_targets(cfg, "lm_head"));
    wsync_peft_config_free(cfg);
}

/* PEFT picks the first key K (file order) with re.match(rf"(.*\.)?({K})$", name). */
static void test_patterns(void **state)
{
    (void)state;
    wsync_peft_config_t *cfg =
        parse_ok("{\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\",\"v_proj\",\"o_proj\"],"
                 "\"rank_pattern\":{\"model.layers.1.self_attn.q_proj\":2,\"q_proj\":4,"
                 "\"layers\\\\.[23]\\\\..*v_proj\":32},"
                 "\"alpha_pattern\":{\"v_proj\":64.5}}");
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.1.self_attn.q_proj"), 2);
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.0.self_attn.q_proj"), 4);
    /* suffix must start at a dot: "xq_proj" does not match "q_proj" */
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.0.self_attn.xq_proj"), 8);
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.2.self_attn.v_proj"), 32);
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.4.self_attn.v_proj"), 8);
    /* "model.layers.11..." also ends in ".layers.1..." only with the dot prefix: no */
    assert_int_equal(wsync_peft_config_rank(cfg, "model.layers.11.self_attn.q_proj"), 4);
    assert_true(wsync_peft_config_alpha(cfg, "model.layers.0.self_attn.v_proj") == 64.5);
    assert_true(wsync_peft_config_alpha(cfg, "model.layers.0.self_attn.o_proj") == 16.0);
    wsync_peft_config_free(cfg);
}

static void test_pyregex(void **state)
{
    (void)state;
    wsync_pyregex_t rx;
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_pyregex_compile(&rx, NULL, "a\\w+?[\\d_]\\.(?:x|y)\\S", "t", &err),
                     WSYNC_OK);
    assert_true(wsync_pyregex_match(&rx, "abc7.xZ"));
    assert_true(wsync_pyregex_match(&rx, "ab_.y-"));
    assert_false(wsync_pyregex_match(&rx, "ab7.x "));
    assert_false(wsync_pyregex_match(&rx, "ab7-xZ"));
    wsync_pyregex_free(&rx);
    assert_int_equal(wsync_pyregex_compile(&rx, NULL, "q_proj(?=x)", "t", &err),
                     WSYNC_ERR_BAD_ADAPTER);
    assert_non_null(strstr(err.message, "look-around"));
    wsync_error_clear(&err);
    assert_int_equal(wsync_pyregex_compile(&rx, NULL, "(a)\\1", "t", &err), WSYNC_ERR_BAD_ADAPTER);
    wsync_error_clear(&err);
    assert_int_equal(wsync_pyregex_compile(&rx, NULL, "a(b", "t", &err), WSYNC_ERR_BAD_ADAPTER);
    assert_non_null(strstr(err.message, "a(b"));
}

typedef struct bad_cfg {
    const char *json;
    wsync_result_t code;
    const char *needle;
} bad_cfg_t;

#define BASE "\"target_modules\":[\"q_proj\"]"
static const bad_cfg_t bad_cfgs[] = {
    {"{\"r\":8, \"lora_alpha\":16", WSYNC_ERR_BAD_ADAPTER, "not valid JSON"},
    {"[8]", WSYNC_ERR_BAD_ADAPTER, "not a JSON object"},
    {"{\"lora_alpha\":16," BASE "}", WSYNC_ERR_BAD_ADAPTER, "\"r\" is missing"},
    {"{\"r\":0,\"lora_alpha\":16," BASE "}", WSYNC_ERR_BAD_ADAPTER, "\"r\" must be an integer > 0"},
    {"{\"r\":\"8\",\"lora_alpha\":16," BASE "}", WSYNC_ERR_BAD_ADAPTER, "\"r\" must be"},
    {"{\"r\":8.5,\"lora_alpha\":16," BASE "}", WSYNC_ERR_BAD_ADAPTER, "non-integer 8.5"},
    {"{\"r\":8," BASE "}", WSYNC_ERR_BAD_ADAPTER, "\"lora_alpha\" is missing"},
    {"{\"r\":8,\"lora_alpha\":\"16\"," BASE "}", WSYNC_ERR_BAD_ADAPTER, "\"lora_alpha\" must"},
    {"{\"r\":8,\"lora_alpha\":16}", WSYNC_ERR_BAD_ADAPTER, "\"target_modules\" is missing"},
    {"{\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\",3]}", WSYNC_ERR_BAD_ADAPTER,
     "\"target_modules\"[1]"},
    {"{\"r\":8,\"lora_alpha\":16,\"target_modules\":{}}", WSYNC_ERR_BAD_ADAPTER,
     "\"target_modules\" must be a list"},
    {"{\"r\":8,\"lora_alpha\":16,\"target_modules\":\"(?!lm_head).*\"}", WSYNC_ERR_BAD_ADAPTER,
     "look-around"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"use_rslora\":1}", WSYNC_ERR_BAD_ADAPTER,
     "\"use_rslora\" must be a bool"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"bias\":\"all\"}", WSYNC_ERR_NOT_SUPPORTED,
     "bias \"all\" is not supported"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"bias\":\"lora_only\"}", WSYNC_ERR_NOT_SUPPORTED,
     "bias \"lora_only\""},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"modules_to_save\":[\"lm_head\"]}",
     WSYNC_ERR_NOT_SUPPORTED, "modules_to_save [\"lm_head\"] is not supported: "},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"use_dora\":true}", WSYNC_ERR_NOT_SUPPORTED,
     "use_dora true is not supported"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"fan_in_fan_out\":true}", WSYNC_ERR_NOT_SUPPORTED,
     "fan_in_fan_out true is not supported"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"lora_bias\":true}", WSYNC_ERR_NOT_SUPPORTED,
     "lora_bias true"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"peft_type\":\"IA3\"}", WSYNC_ERR_NOT_SUPPORTED,
     "peft_type IA3"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"layer_replication\":[[0,4]]}", WSYNC_ERR_NOT_SUPPORTED,
     "layer_replication"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"rank_pattern\":{\"q_proj\":0}}", WSYNC_ERR_BAD_ADAPTER,
     "rank_pattern[\"q_proj\"] must be an integer > 0"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"rank_pattern\":[]}", WSYNC_ERR_BAD_ADAPTER,
     "\"rank_pattern\" must be an object"},
    {"{\"r\":8,\"lora_alpha\":16," BASE ",\"alpha_pattern\":{\"q_proj\":\"x\"}}",
     WSYNC_ERR_BAD_ADAPTER, "alpha_pattern[\"q_proj\"] must be a finite number"},
    {"{\"r\":8,\"r\":4,\"lora_alpha\":16," BASE "}", WSYNC_ERR_BAD_ADAPTER, "duplicate"},
};

static void test_refused(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cfgs) / sizeof(bad_cfgs[0]); i++) {
        wsync_peft_config_t *cfg = (wsync_peft_config_t *)(uintptr_t)1;
        wsync_error_t err = {.struct_size = sizeof(err)};
        const char *j = bad_cfgs[i].json;
        wsync_result_t rc = wsync_peft_config_parse(j, strlen(j), &cfg, &err);
        if (rc != bad_cfgs[i].code || cfg != NULL || !strstr(err.message, bad_cfgs[i].needle))
            fail_msg("config %zu %s: rc %d (want %d), message \"%s\"", i, j, rc, bad_cfgs[i].code,
                     err.message);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_targets), cmocka_unit_test(test_regex_and_all_linear),
        cmocka_unit_test(test_patterns),     cmocka_unit_test(test_pyregex),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
