/* Fuzz target: adapter_config.json (wsync_peft_config_parse) and the queries an adapter load
 * makes on it. Invariants on every accepted config: rank > 0 for every module it targets, alpha
 * and scaling finite; queries with odd module paths never crash. */
#include <math.h>
#include <string.h>

#include "wsync_fuzz.h"
#include "wsync_peft_config.h"

static const char *const modules[] = {
    "model.layers.0.self_attn.q_proj",
    "model.layers.1.self_attn.k_proj",
    "model.layers.10.mlp.down_proj",
    "model.layers.3.mlp.experts.7.w1",
    "lm_head",
    "q_proj",
    "",
    "model..layers.",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wsync_peft_config_t *cfg = NULL;
    wsync_error_t err = {.struct_size = sizeof(err)};

    wsync_result_t r = wsync_peft_config_parse((const char *)data, size, &cfg, &err);
    if (r != WSYNC_OK) {
        WSYNC_FUZZ_CHECK(cfg == NULL);
        WSYNC_FUZZ_CHECK(err.code == r && err.message[0] != '\0');
        return 0;
    }
    WSYNC_FUZZ_CHECK(cfg != NULL);
    (void)wsync_peft_config_use_rslora(cfg);
    for (size_t i = 0; i < sizeof(modules) / sizeof(modules[0]); i++) {
        int t = wsync_peft_config_targets(cfg, modules[i]);
        uint32_t rank = wsync_peft_config_rank(cfg, modules[i]);
        double alpha = wsync_peft_config_alpha(cfg, modules[i]);
        WSYNC_FUZZ_CHECK(isfinite(alpha));
        if (t && rank > 0)
            WSYNC_FUZZ_CHECK(isfinite(wsync_peft_config_scaling(cfg, rank, alpha)));
    }
    wsync_peft_config_free(cfg);
    return 0;
}
