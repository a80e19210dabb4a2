/* The shims' mapping tables against the fusion table (plugin/common/wsync_fusion.h), its one
 * owner: every rule of every shim that fills a part of a fused parameter names an HF tensor the
 * fusion table puts in that kind of parameter at that part, and every rule of a whole parameter
 * one it leaves alone; and every tensor the fusion table fuses has a rule in each shim. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_fusion.h"
#include "wsync_mapping.h"
#include "wsync_shim.h"

/* The fusion table's answer a rule's part stands for. */
static void part_of(wsync_map_part_t p, wsync_fuse_t *kind, int *part)
{
    static const struct {
        wsync_map_part_t p;
        wsync_fuse_t kind;
        int part;
    } map[] = {{WSYNC_PART_Q, WSYNC_FUSE_QKV, 0},         {WSYNC_PART_K, WSYNC_FUSE_QKV, 1},
               {WSYNC_PART_V, WSYNC_FUSE_QKV, 2},         {WSYNC_PART_GATE, WSYNC_FUSE_GATE_UP, 0},
               {WSYNC_PART_UP, WSYNC_FUSE_GATE_UP, 1},    {WSYNC_PART_EXPERT_W1, WSYNC_FUSE_W13, 0},
               {WSYNC_PART_EXPERT_W3, WSYNC_FUSE_W13, 1}, {WSYNC_PART_EXPERT_W2, WSYNC_FUSE_W2, 0}};
    *kind = WSYNC_FUSE_NONE;
    *part = 0;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (map[i].p == p)
            *kind = map[i].kind, *part = map[i].part;
}

/* An HF name a rule's suffix matches: in layer 3, expert 5. */
static void name_of(const char *suffix, char *out, size_t cap)
{
    const char *hash = strchr(suffix, '#');
    if (strncmp(suffix, "model.", 6) == 0 || strncmp(suffix, "lm_head", 7) == 0)
        snprintf(out, cap, "%s", suffix);
    else if (hash != NULL)
        snprintf(out, cap, "model.layers.3.%.*s5%s", (int)(hash - suffix), suffix, hash + 1);
    else
        snprintf(out, cap, "model.layers.3.%s", suffix);
}

static void test_rules_agree_with_the_fusion_table(void **state)
{
    (void)state;
    static const char *const engines[] = {"sglang", "vllm", "lmdeploy"};
    for (size_t e = 0; e < 3; e++) {
        const wsync_shim_t *s = wsync_shim_find(engines[e]);
        assert_non_null(s);
        size_t checked = 0;
        for (const wsync_map_table_t *t = s->map; t != NULL; t = t->next)
            for (size_t i = 0; i < t->n_rules; i++) {
                const wsync_map_rule_t *r = &t->rules[i];
                char name[256];
                name_of(r->hf_suffix, name, sizeof(name));
                wsync_fuse_t kind;
                int part;
                part_of(r->part, &kind, &part);
                const wsync_fusion_t f = wsync_fusion_of(name);
                if (f.kind != kind || f.part != part)
                    fail_msg("%s: rule %s (%s) is part %d of fused kind %d; the fusion table says "
                             "part %d of kind %d",
                             engines[e], r->hf_suffix, name, part, kind, f.part, f.kind);
                checked++;
            }
        assert_true(checked >= 15);
        /* every tensor the fusion table fuses has a rule here */
        static const char *const fused[] = {"model.layers.3.self_attn.q_proj.weight",
                                            "model.layers.3.self_attn.k_proj.weight",
                                            "model.layers.3.self_attn.v_proj.weight",
                                            "model.layers.3.mlp.gate_proj.weight",
                                            "model.layers.3.mlp.up_proj.weight",
                                            "model.layers.3.mlp.experts.5.gate_proj.weight",
                                            "model.layers.3.mlp.experts.5.up_proj.weight",
                                            "model.layers.3.mlp.experts.5.down_proj.weight"};
        for (size_t k = 0; k < sizeof(fused) / sizeof(fused[0]); k++) {
            wsync_map_target_t tg;
            wsync_error_t err = {.struct_size = sizeof(err)};
            if (wsync_map_resolve(s->map, fused[k], &tg, &err) != WSYNC_OK)
                fail_msg("%s has no rule for %s, which the fusion table fuses", engines[e],
                         fused[k]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rules_agree_with_the_fusion_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
