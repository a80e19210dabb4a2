/* The packing order: the engine's fused parameters side by side, everything else in place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_layout.h"
#include "wsync_pack_order.h"

static char src_mem[1 << 16];

static void fill(wsync_stage_tensor_t *t, const char *const *names, size_t n)
{
    memset(t, 0, n * sizeof(*t));
    for (size_t i = 0; i < n; i++) {
        t[i].struct_size = sizeof(t[i]);
        t[i].name = names[i];
        t[i].dtype = WSYNC_DTYPE_BF16;
        t[i].ndim = 1;
        t[i].shape[0] = (int64_t)(i + 1);
        t[i].src = src_mem + 64 * i;
    }
}

/* The names in packing order must be `want`. */
static void expect_order_at(const char *const *names, size_t n, const char *const *want, int line)
{
    wsync_stage_tensor_t t[32];
    size_t order[32];
    assert_true(n <= 32);
    fill(t, names, n);
    assert_int_equal(wsync_pack_order(t, n, order, NULL), WSYNC_OK);
    for (size_t k = 0; k < n; k++) {
        if (strcmp(names[order[k]], want[k]) != 0)
            print_error("line %d: position %zu is %s, want %s\n", line, k, names[order[k]],
                        want[k]);
        assert_string_equal(names[order[k]], want[k]);
    }
}
#define expect_order(names, want)                                                                  \
    expect_order_at((names), sizeof(names) / sizeof((names)[0]), (want), __LINE__)

#define E(e, p) "model.layers.0.mlp.experts." #e "." p ".weight"

static void test_experts_in_hf_module_order(void **state)
{
    (void)state;
    /* HF module order: gate, up, down of each expert in turn; the next layer's attention. */
    static const char *const in[] = {
        "model.layers.0.mlp.gate.weight",
        E(0, "gate_proj"),
        E(0, "up_proj"),
        E(0, "down_proj"),
        E(1, "gate_proj"),
        E(1, "up_proj"),
        E(1, "down_proj"),
        E(2, "gate_proj"),
        E(2, "up_proj"),
        E(2, "down_proj"),
        "model.layers.1.self_attn.q_proj.weight",
    };
    /* SGLang/vLLM w13 = [gate_e; up_e] expert after expert, w2 = down_e expert after expert */
    static const char *const want[] = {
        "model.layers.0.mlp.gate.weight",
        E(0, "gate_proj"),
        E(0, "up_proj"),
        E(1, "gate_proj"),
        E(1, "up_proj"),
        E(2, "gate_proj"),
        E(2, "up_proj"),
        E(0, "down_proj"),
        E(1, "down_proj"),
        E(2, "down_proj"),
        "model.layers.1.self_attn.q_proj.weight",
    };
    expect_order(in, want);
}

static void test_experts_any_order(void **state)
{
    (void)state;
    /* Sorted by name (some checkpoint writers): experts 10 after 1, ups before gates. */
    static const char *const in[] = {
        E(1, "down_proj"),  E(1, "gate_proj"),  E(1, "up_proj"),
        E(10, "down_proj"), E(10, "gate_proj"), E(10, "up_proj"),
        E(2, "down_proj"),  E(2, "gate_proj"),  E(2, "up_proj"),
    };
    static const char *const want[] = {
        E(1, "down_proj"), E(2, "down_proj"),  E(10, "down_proj"),
        E(1, "gate_proj"), E(1, "up_proj"),    E(2, "gate_proj"),
        E(2, "up_proj"),   E(10, "gate_proj"), E(10, "up_proj"),
    };
    expect_order(in, want);
}

static void test_mixtral_names(void **state)
{
    (void)state;
    static const char *const in[] = {
        "layers.3.block_sparse_moe.experts.0.w1.weight",
        "layers.3.block_sparse_moe.experts.0.w2.weight",
        "layers.3.block_sparse_moe.experts.0.w3.weight",
        "layers.3.block_sparse_moe.experts.1.w1.weight",
        "layers.3.block_sparse_moe.experts.1.w2.weight",
        "layers.3.block_sparse_moe.experts.1.w3.weight",
    };
    static const char *const want[] = {
        "layers.3.block_sparse_moe.experts.0.w1.weight",
        "layers.3.block_sparse_moe.experts.0.w3.weight",
        "layers.3.block_sparse_moe.experts.1.w1.weight",
        "layers.3.block_sparse_moe.experts.1.w3.weight",
        "layers.3.block_sparse_moe.experts.0.w2.weight",
        "layers.3.block_sparse_moe.experts.1.w2.weight",
    };
    expect_order(in, want);
}

static void test_dense_projections(void **state)
{
    (void)state;
    /* Sorted by name: q, k, v land where the first of them was, in the engine's order; weights
     * and biases are separate parameters; two layers never mix. */
    static const char *const in[] = {
        "l.0.attn.k_proj.bias",   "l.0.attn.k_proj.weight",   "l.0.attn.o_proj.weight",
        "l.0.attn.q_proj.bias",   "l.0.attn.q_proj.weight",   "l.0.attn.v_proj.bias",
        "l.0.attn.v_proj.weight", "l.0.mlp.down_proj.weight", "l.0.mlp.up_proj.weight",
        "l.1.mlp.up_proj.weight", "l.0.mlp.gate_proj.weight", "l.1.mlp.gate_proj.weight",
    };
    static const char *const want[] = {
        "l.0.attn.q_proj.bias",   "l.0.attn.k_proj.bias",     "l.0.attn.v_proj.bias",
        "l.0.attn.q_proj.weight", "l.0.attn.k_proj.weight",   "l.0.attn.v_proj.weight",
        "l.0.attn.o_proj.weight", "l.0.mlp.down_proj.weight", "l.0.mlp.gate_proj.weight",
        "l.0.mlp.up_proj.weight", "l.1.mlp.gate_proj.weight", "l.1.mlp.up_proj.weight",
    };
    expect_order(in, want);
}

static void test_everything_else_in_place(void **state)
{
    (void)state;
    /* No group: a projection name as the last component, an expert index that is not a number,
     * already fused parameters, LoRA pieces of one module (A before B as given). */
    static const char *const in[] = {
        "z.weight",
        "m.up_proj",
        "m.gate_proj",
        "m.experts.x.down_proj.weight",
        "m.experts.x.gate_proj.weight",
        "m.gate_up_proj.weight",
        "a.weight",
        "m.experts.3",
        "m.experts.12345678901.gate_proj.weight",
    };
    expect_order(in, in);
    /* LoRA adapters: the A matrices of q, k, v side by side (SGLang stacks them), then the Bs */
    static const char *const lora[] = {
        "x.q_proj.lora_A.weight", "x.q_proj.lora_B.weight", "x.k_proj.lora_A.weight",
        "x.k_proj.lora_B.weight", "x.v_proj.lora_A.weight", "x.v_proj.lora_B.weight",
    };
    static const char *const lora_want[] = {
        "x.q_proj.lora_A.weight", "x.k_proj.lora_A.weight", "x.v_proj.lora_A.weight",
        "x.q_proj.lora_B.weight", "x.k_proj.lora_B.weight", "x.v_proj.lora_B.weight",
    };
    expect_order(lora, lora_want);
}

static void test_given_order_and_bad_input(void **state)
{
    (void)state;
    static const char *const in[] = {E(0, "gate_proj"), E(0, "down_proj"), E(0, "up_proj")};
    static const char *const engine[] = {E(0, "gate_proj"), E(0, "up_proj"), E(0, "down_proj")};
    setenv("WSYNC_PACK_ORDER", "given", 1);
    expect_order(in, in);
    setenv("WSYNC_PACK_ORDER", "sorted", 1); /* unknown: warned, the engine order */
    expect_order(in, engine);
    setenv("WSYNC_PACK_ORDER", "engine", 1);
    expect_order(in, engine);
    unsetenv("WSYNC_PACK_ORDER");

    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    size_t order[1];
    assert_int_equal(wsync_pack_order(NULL, 3, order, &err), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "for 3 tensors"));
    assert_int_equal(wsync_pack_order(NULL, 0, NULL, &err), WSYNC_OK);
}

static void test_layout_packs_in_that_order(void **state)
{
    (void)state;
    static const char *const in[] = {E(0, "gate_proj"), E(0, "up_proj"), E(0, "down_proj"),
                                     E(1, "gate_proj"), E(1, "up_proj"), E(1, "down_proj")};
    static const size_t from[] = {0, 1, 3, 4, 2, 5};
    wsync_stage_tensor_t t[6];
    fill(t, in, 6);
    wsync_layout_t l;
    assert_int_equal(wsync_layout_build(t, 6, 1 << 20, &l, NULL), WSYNC_OK);
    uint64_t end = 0;
    for (size_t k = 0; k < 6; k++) {
        assert_int_equal(l.from[k], from[k]);
        assert_string_equal(l.tensors[k].name, in[from[k]]);
        assert_int_equal(l.tensors[k].shape[0], (int64_t)from[k] + 1);
        assert_int_equal(l.tensors[k].nbytes, 2 * (from[k] + 1));
        assert_true(l.tensors[k].offset >= end); /* offsets rise in packing order */
        assert_int_equal(l.tensors[k].offset % WSYNC_LAYOUT_ALIGN, 0);
        end = l.tensors[k].offset + l.tensors[k].nbytes;
    }
    assert_int_equal(l.used, end);

    /* A fixed layout is compared in packing order; a mismatch names the caller's index. */
    wsync_layout_t next;
    t[2].shape[0] = 7; /* expert 0's down, packed fifth */
    assert_int_equal(wsync_layout_build(t, 6, 1 << 20, &next, NULL), WSYNC_OK);
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_layout_compare(&l, &next, &err), WSYNC_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.message, "tensor 2 (\"" E(0, "down_proj") "\"): shape [7]"));
    wsync_layout_free(&next);
    wsync_layout_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_in_hf_module_order),
        cmocka_unit_test(test_experts_any_order),
        cmocka_unit_test(test_mixtral_names),
        cmocka_unit_test(test_dense_projections),
        cmocka_unit_test(test_everything_else_in_place),
        cmocka_unit_test(test_given_order_and_bad_input),
        cmocka_unit_test(test_layout_packs_in_that_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
