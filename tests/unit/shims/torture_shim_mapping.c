/* Mapping rules and TP narrowing (engine-shims/common/wsync_mapping.c): the ops planned for each
 * kind of HF tensor, checked against offsets worked out by hand for a tiny model. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "fake_engine.h"
#include "wsync_map_rules.h"
#include "wsync_mapping.h"

static fake_engine_t eng;
static wsync_engine_ops_t ops = {.struct_size = sizeof(wsync_engine_ops_t),
                                 .user = &eng,
                                 .param = fake_param_cb,
                                 .tp = fake_tp_cb,
                                 .dims = fake_dims_cb};

static wsync_tensor_desc_t tensor(const char *name, int64_t d0, int64_t d1, uint64_t offset)
{
    wsync_tensor_desc_t t = {.struct_size = sizeof(t),
                             .name = name,
                             .dtype = WSYNC_DTYPE_BF16,
                             .ndim = d1 > 0 ? 2 : 1,
                             .offset = offset};
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.nbytes = 2u * (uint64_t)d0 * (uint64_t)(d1 > 0 ? d1 : 1);
    return t;
}

static void test_resolve(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_map_target_t tg;
    (void)state;

    assert_int_equal(wsync_map_resolve(&wsync_map_fused_moe_w13,
                                       "model.layers.3.self_attn.k_proj.weight", &tg, &err),
                     WSYNC_OK);
    assert_string_equal(tg.engine_name, "model.layers.3.self_attn.qkv_proj.weight");
    assert_int_equal(tg.rule->part, WSYNC_PART_K);
    assert_int_equal(wsync_map_resolve(&wsync_map_fused_moe_w13,
                                       "model.layers.0.mlp.experts.17.up_proj.weight", &tg, &err),
                     WSYNC_OK);
    assert_string_equal(tg.engine_name, "model.layers.0.mlp.experts.w13_weight");
    assert_int_equal(tg.expert, 17);
    assert_int_equal(tg.rule->part, WSYNC_PART_EXPERT_W3);
    /* "norm.weight" rules match only at a '.' boundary: input_layernorm keeps its own name. */
    assert_int_equal(
        wsync_map_resolve(&wsync_map_dense, "model.layers.0.input_layernorm.weight", &tg, &err),
        WSYNC_OK);
    assert_string_equal(tg.engine_name, "model.layers.0.input_layernorm.weight");
    /* Dense down_proj is not an expert. */
    assert_int_equal(wsync_map_resolve(&wsync_map_fused_moe_w13,
                                       "model.layers.0.mlp.down_proj.weight", &tg, &err),
                     WSYNC_OK);
    assert_int_equal(tg.expert, -1);
    assert_int_equal(
        wsync_map_resolve(&wsync_map_dense, "model.layers.0.self_attn.rope.inv_freq", &tg, &err),
        WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "unknown tensor"));
}

/* tp 4, rank 3, kv_heads 2 < tp: rank 3 reads kv head 3 / (4 / 2) = 1. */
static void test_qkv_kv_replicated(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    uint8_t *qkv;
    (void)state;

    fake_engine_init(&eng, 3, 4);
    qkv = fake_mem(&eng, "model.layers.0.self_attn.qkv_proj.weight"); /* [6, 8] */
    wsync_tensor_desc_t q = tensor("model.layers.0.self_attn.q_proj.weight", 8, 8, 1024);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &q, &op, &err), WSYNC_OK);
    assert_int_equal(op.rows, 1);
    assert_int_equal(op.row_bytes, 2 * 8 * 2);             /* 2 rows of 8 */
    assert_int_equal(op.src_offset, 1024 + 3 * 2 * 8 * 2); /* rows 6..7 */
    assert_ptr_equal(op.dst, qkv);
    assert_int_equal(op.dst_extent, 6 * 8 * 2);

    wsync_tensor_desc_t k = tensor("model.layers.0.self_attn.k_proj.weight", 4, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &k, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 1 * 2 * 8 * 2); /* kv head 1 = rows 2..3 */
    assert_int_equal(op.row_bytes, 2 * 8 * 2);
    assert_ptr_equal(op.dst, qkv + 2 * 8 * 2); /* after this rank's 2 q rows */

    wsync_tensor_desc_t v = tensor("model.layers.0.self_attn.v_proj.weight", 4, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &v, &op, &err), WSYNC_OK);
    assert_ptr_equal(op.dst, qkv + 4 * 8 * 2);
    assert_int_equal(op.dst_extent, 2 * 8 * 2);
}

/* tp 2: kv heads split, rank 1 owns kv head 1. */
static void test_qkv_kv_split(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    (void)state;

    fake_engine_init(&eng, 1, 2); /* qkv [(2 + 2) * 2, 8] = [8, 8] */
    wsync_tensor_desc_t v = tensor("model.layers.0.self_attn.v_proj.weight", 4, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &v, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 2 * 8 * 2);
    assert_ptr_equal(op.dst,
                     fake_mem(&eng, "model.layers.0.self_attn.qkv_proj.weight") + (4 + 2) * 8 * 2);
}

static void test_row_parallel(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    (void)state;

    fake_engine_init(&eng, 3, 4); /* o_proj [8, 2] of HF [8, 8] */
    wsync_tensor_desc_t o = tensor("model.layers.0.self_attn.o_proj.weight", 8, 8, 256);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &o, &op, &err), WSYNC_OK);
    assert_int_equal(op.rows, 8);
    assert_int_equal(op.row_bytes, 2 * 2);
    assert_int_equal(op.src_pitch, 8 * 2);
    assert_int_equal(op.dst_pitch, 2 * 2);
    assert_int_equal(op.src_offset, 256 + 3 * 2 * 2);
    assert_ptr_equal(op.dst, fake_mem(&eng, "model.layers.0.self_attn.o_proj.weight"));
}

static void test_experts_and_gate_up(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    (void)state;

    fake_engine_init(&eng, 3, 4); /* w13 [2, 2, 8], w2 [2, 8, 1], gate_up [4, 8] */
    wsync_tensor_desc_t up = tensor("model.layers.0.mlp.experts.1.up_proj.weight", 4, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ops, &up, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 3 * 8 * 2);
    assert_int_equal(op.row_bytes, 8 * 2);
    assert_ptr_equal(op.dst,
                     fake_mem(&eng, "model.layers.0.mlp.experts.w13_weight") + (16 + 8) * 2);

    wsync_tensor_desc_t down = tensor("model.layers.0.mlp.experts.1.down_proj.weight", 8, 4, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ops, &down, &op, &err), WSYNC_OK);
    assert_int_equal(op.rows, 8);
    assert_int_equal(op.row_bytes, 2);
    assert_int_equal(op.src_pitch, 4 * 2);
    assert_int_equal(op.src_offset, 3 * 2);
    assert_ptr_equal(op.dst, fake_mem(&eng, "model.layers.0.mlp.experts.w2_weight") + 8 * 2);

    wsync_tensor_desc_t gone = tensor("model.layers.0.mlp.experts.2.up_proj.weight", 4, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ops, &gone, &op, &err),
                     WSYNC_ERR_NOT_FOUND);

    wsync_tensor_desc_t g = tensor("model.layers.0.mlp.up_proj.weight", 8, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &g, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 3 * 2 * 8 * 2);
    assert_ptr_equal(op.dst, fake_mem(&eng, "model.layers.0.mlp.gate_up_proj.weight") + 2 * 8 * 2);
}

static void test_replicated_and_vocab(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    (void)state;

    fake_engine_init(&eng, 1, 4);
    wsync_tensor_desc_t n = tensor("model.norm.weight", 8, 0, 64);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &n, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 64);
    assert_int_equal(op.row_bytes, 16);
    wsync_tensor_desc_t e = tensor("model.embed_tokens.weight", 8, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &e, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 1 * 2 * 8 * 2);
    assert_int_equal(op.row_bytes, 2 * 8 * 2);
}

static void test_shape_and_dtype_refused(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    (void)state;

    fake_engine_init(&eng, 0, 2);
    wsync_tensor_desc_t q = tensor("model.layers.0.self_attn.q_proj.weight", 4, 16, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &q, &op, &err),
                     WSYNC_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.message, "wrong shape"));
    assert_non_null(strstr(err.message, "[8, 8]"));

    err = (wsync_error_t){.struct_size = sizeof(err)};
    wsync_tensor_desc_t n = tensor("model.norm.weight", 8, 0, 0);
    n.dtype = WSYNC_DTYPE_F16;
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &n, &op, &err),
                     WSYNC_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.message, "wrong dtype"));

    err = (wsync_error_t){.struct_size = sizeof(err)};
    wsync_tensor_desc_t lm = tensor("lm_head.weight", 8, 8, 0); /* no lm_head in this engine */
    assert_int_equal(wsync_map_plan(&wsync_map_dense, &ops, &lm, &op, &err), WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "lm_head.weight"));
}

static void test_engine_order(void **state)
{
    (void)state;
    /* HF module order: per expert gate, up, down; a dense layer's q, k, v, o, gate, up, down */
    const char *names[] = {
        "model.layers.0.self_attn.q_proj.weight",        /* 0 */
        "model.layers.0.self_attn.k_proj.weight",        /* 1 */
        "model.layers.0.self_attn.v_proj.weight",        /* 2 */
        "model.layers.0.mlp.experts.0.gate_proj.weight", /* 3 */
        "model.layers.0.mlp.experts.0.up_proj.weight",   /* 4 */
        "model.layers.0.mlp.experts.0.down_proj.weight", /* 5 */
        "model.layers.0.mlp.experts.1.gate_proj.weight", /* 6 */
        "model.layers.0.mlp.experts.1.up_proj.weight",   /* 7 */
        "model.layers.0.mlp.experts.1.down_proj.weight", /* 8 */
        "something.else",                                /* 9: no rule */
        "model.layers.1.mlp.up_proj.weight",             /* 10: up before gate */
        "model.layers.1.mlp.gate_proj.weight",           /* 11 */
        "model.layers.1.self_attn.v_proj.weight",        /* 12: v, then q */
        "model.layers.1.self_attn.q_proj.weight",        /* 13 */
        "model.layers.0.mlp.experts.2.up_proj.weight",   /* 14: a late expert joins its stack */
    };
    const size_t n = sizeof(names) / sizeof(names[0]);
    /* w13 (from 3): gate0 up0 gate1 up1 up2; w2 (from 5): down0 down1; gate_up of layer 1 (from
     * 10): gate, up; qkv of layer 1 (from 12): q, v */
    const size_t want[] = {0, 1, 2, 3, 4, 6, 7, 14, 5, 8, 9, 11, 10, 13, 12};
    size_t order[sizeof(names) / sizeof(names[0])];
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_map_order(&wsync_map_fused_moe_w13, names, n, order, &err), WSYNC_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(order[i], want[i]);
    /* an order that already is the engine's stays as it is */
    const char *sorted[sizeof(names) / sizeof(names[0])];
    for (size_t i = 0; i < n; i++)
        sorted[i] = names[want[i]];
    assert_int_equal(wsync_map_order(&wsync_map_fused_moe_w13, sorted, n, order, &err), WSYNC_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(order[i], i);
    /* bad arguments are named */
    assert_int_equal(wsync_map_order(&wsync_map_fused_moe_w13, NULL, 3, order, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "3 tensors"));
    assert_int_equal(wsync_map_order(&wsync_map_fused_moe_w13, NULL, 0, NULL, &err), WSYNC_OK);
}

/* Expert parallelism: the linear placement's shares (with remainders), and planning on EP rank
 * 1 of 2 of a 4-expert model (experts 2, 3 here, local 0, 1; split over a MoE TP group of 4):
 * its own experts land at their local index, the others plan to empty ops; a parameter holding
 * another count is refused naming it. */
static void ep_dims_cb(void *user, wsync_model_dims_t *d)
{
    fake_dims_cb(user, d);
    d->experts = 4;
}
static uint32_t ep_size_now = 2;
static void ep_moe_cb(void *user, uint32_t *ep_rank, uint32_t *ep_size, uint32_t *mr, uint32_t *ms)
{
    (void)user;
    *ep_rank = 1;
    *ep_size = ep_size_now;
    *mr = 3;
    *ms = 4;
}

static void test_expert_parallel(void **state)
{
    int64_t first, count;
    (void)state;
    const int64_t want[][4] = {
        {8, 3, 0, 3}, {8, 3, 2, 2}, {6, 4, 1, 2}, {6, 4, 3, 1}, {4, 8, 5, 0}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        wsync_map_ep_share(want[i][0], (uint32_t)want[i][2], (uint32_t)want[i][1], &first, &count);
        assert_int_equal(count, want[i][3]);
    }
    wsync_map_ep_share(8, 2, 3, &first, &count);
    assert_int_equal(first, 6);
    wsync_map_ep_share(6, 3, 4, &first, &count);
    assert_int_equal(first, 5);
    /* the owner of each expert is the rank whose share holds it: 6 over 4 = 2, 2, 1, 1 */
    const uint32_t owner6[6] = {0, 0, 1, 1, 2, 3};
    for (int64_t e = 0; e < 6; e++)
        assert_int_equal(wsync_map_ep_owner(6, 4, e), owner6[e]);
    assert_int_equal(wsync_map_ep_owner(4, 8, 3), 3); /* more ranks than experts */
    assert_int_equal(wsync_map_expert_of(&wsync_map_fused_moe_w13,
                                         "model.layers.0.mlp.experts.17.up_proj.weight"),
                     17);
    assert_int_equal(wsync_map_expert_of(&wsync_map_fused_moe_w13, "model.norm.weight"), -1);

    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_copy_op_t op;
    wsync_engine_ops_t ep_ops = ops;
    ep_ops.dims = ep_dims_cb;
    ep_ops.moe = ep_moe_cb;
    ep_size_now = 2;
    fake_engine_init(&eng, 3, 4); /* w13 [2, 2, 8], w2 [2, 8, 1] */
    wsync_tensor_desc_t up = tensor("model.layers.0.mlp.experts.3.up_proj.weight", 4, 8, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ep_ops, &up, &op, &err), WSYNC_OK);
    assert_int_equal(op.src_offset, 3 * 8 * 2); /* MoE TP rank 3's row */
    assert_ptr_equal(op.dst,
                     fake_mem(&eng, "model.layers.0.mlp.experts.w13_weight") + (16 + 8) * 2);
    wsync_tensor_desc_t other = tensor("model.layers.0.mlp.experts.1.down_proj.weight", 8, 4, 64);
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ep_ops, &other, &op, &err),
                     WSYNC_OK);
    assert_int_equal(op.rows * op.row_bytes, 0); /* rank 0's expert: nothing read or written */
    wsync_tensor_desc_t bad = tensor("model.layers.0.mlp.experts.1.down_proj.weight", 8, 5, 0);
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ep_ops, &bad, &op, &err),
                     WSYNC_ERR_LAYOUT_MISMATCH); /* a skipped expert's shape is still checked */
    wsync_tensor_desc_t gone = tensor("model.layers.0.mlp.experts.4.up_proj.weight", 4, 8, 0);
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ep_ops, &gone, &op, &err),
                     WSYNC_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "expert 4 does not exist, the model has 4"));
    ep_size_now = 4; /* rank 1 of 4 owns 1 expert, the engine holds 2 */
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_map_plan(&wsync_map_fused_moe_w13, &ep_ops, &up, &op, &err),
                     WSYNC_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.message, "model.layers.0.mlp.experts.w13_weight holds 2 experts, "
                                        "but EP rank 1 of 4 owns 1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_qkv_kv_replicated),
        cmocka_unit_test(test_qkv_kv_split),
        cmocka_unit_test(test_row_parallel),
        cmocka_unit_test(test_experts_and_gate_up),
        cmocka_unit_test(test_replicated_and_vocab),
        cmocka_unit_test(test_shape_and_dtype_refused),
        cmocka_unit_test(test_engine_order),
        cmocka_unit_test(test_expert_parallel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
