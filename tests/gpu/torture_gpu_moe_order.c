/* A MoE layer staged in HF module order (v, k, q as some checkpoints list them; each expert's
 * gate, up, down in turn) lands in fused engine parameters (qkv_proj; w13 = [gate; up] expert
 * after expert; w2 = the downs) through libwsync_cuda.so: the producer packs the bucket in the
 * engine's order (the manifest lists q, k, v, the router, every gate and up, then every down), so
 * the engine's copies continue each other and the copy engines take them joined. Three
 * generations: verified, unverified (joined copy-engine copies), and with WSYNC_PACK_ORDER=given
 * (the manifest in the trainer's order, nothing joined). Every destination byte is checked on the
 * GPU after each generation, and the destinations are poisoned before it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_gpu_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define MO_H 1024ull /* hidden size */
#define MO_I 256ull  /* expert intermediate size */
#define MO_KV 256ull /* k and v rows */
#define MO_E 32      /* experts: w13 32 MiB, w2 16 MiB, both past the copy engines' minimum */
#define MO_N (4 + 3 * MO_E)
#define MO_GENS 3
#define MO_GU (MO_I * MO_H * 2) /* bytes of one gate, up or down */

typedef struct mo_tensor {
    char name[96];
    uint64_t rows, cols, bytes;
    uint64_t trainer_off; /* in the trainer's buffer, HF module order */
    int alloc;            /* 0 qkv, 1 router, 2 w13, 3 w2 */
    uint64_t dst_off;     /* in that engine allocation */
} mo_tensor_t;

static mo_tensor_t T[MO_N];
static uint64_t trainer_bytes, alloc_bytes[4];

static void mo_add(size_t i, const char *name, uint64_t rows, uint64_t cols, int alloc,
                   uint64_t dst_off)
{
    snprintf(T[i].name, sizeof(T[i].name), "%s", name);
    T[i].rows = rows, T[i].cols = cols, T[i].bytes = rows * cols * 2;
    T[i].trainer_off = trainer_bytes;
    trainer_bytes += (T[i].bytes + 255) & ~255ull;
    T[i].alloc = alloc, T[i].dst_off = dst_off;
}

/* The trainer's order: v, k, q, the router, then gate, up, down of each expert in turn. */
static void mo_layout(void)
{
    const uint64_t q = MO_H * MO_H * 2, kv = MO_KV * MO_H * 2;
    mo_add(0, "model.layers.0.self_attn.v_proj.weight", MO_KV, MO_H, 0, q + kv);
    mo_add(1, "model.layers.0.self_attn.k_proj.weight", MO_KV, MO_H, 0, q);
    mo_add(2, "model.layers.0.self_attn.q_proj.weight", MO_H, MO_H, 0, 0);
    mo_add(3, "model.layers.0.mlp.gate.weight", MO_E, MO_H, 1, 0);
    for (int e = 0; e < MO_E; e++) {
        char n[96];
        snprintf(n, sizeof(n), "model.layers.0.mlp.experts.%d.gate_proj.weight", e);
        mo_add(4 + 3 * e, n, MO_I, MO_H, 2, (uint64_t)e * 2 * MO_GU);
        snprintf(n, sizeof(n), "model.layers.0.mlp.experts.%d.up_proj.weight", e);
        mo_add(5 + 3 * e, n, MO_I, MO_H, 2, (uint64_t)e * 2 * MO_GU + MO_GU);
        snprintf(n, sizeof(n), "model.layers.0.mlp.experts.%d.down_proj.weight", e);
        mo_add(6 + 3 * e, n, MO_H, MO_I, 3, (uint64_t)e * MO_GU);
    }
    alloc_bytes[0] = q + 2 * kv;
    alloc_bytes[1] = MO_E * MO_H * 2;
    alloc_bytes[2] = MO_E * 2 * MO_GU;
    alloc_bytes[3] = MO_E * MO_GU;
}

/* The engine's order, as the producer packs by default. */
static size_t mo_engine_order(size_t k)
{
    static const size_t head[] = {2, 1, 0, 3}; /* q, k, v, router */
    if (k < 4)
        return head[k];
    k -= 4;
    if (k < 2 * MO_E) /* gate, up of expert k / 2 */
        return 4 + 3 * (k / 2) + k % 2;
    return 6 + 3 * (k - 2 * MO_E); /* the downs */
}

static uint64_t mo_seed(uint64_t g)
{
    return 0x5e000000ull * g + 11;
}

static int producer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = 64u << 20};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *trainer;
    WG_CK(cudaMalloc((void **)&trainer, trainer_bytes));
    wsync_stage_tensor_t t[MO_N];
    for (size_t k = 0; k < MO_N; k++)
        t[k] = (wsync_stage_tensor_t){.struct_size = sizeof(t[k]),
                                      .name = T[k].name,
                                      .dtype = WSYNC_DTYPE_BF16,
                                      .ndim = 2,
                                      .shape = {(int64_t)T[k].rows, (int64_t)T[k].cols},
                                      .src = trainer + T[k].trainer_off};
    uint64_t last = 0;
    for (uint64_t g = 1; g <= MO_GENS; g++) {
        if (last)
            WG_OK(p->producer->wait_consumed(s, st, last, err));
        WG_CK(wh_fill(trainer, trainer_bytes, mo_seed(g), st));
        if (g == MO_GENS)
            setenv("WSYNC_PACK_ORDER", "given", 1);
        WG_OK(p->producer->stage(s, st, t, MO_N, err));
        unsetenv("WSYNC_PACK_ORDER");
        const char *json;
        WG_OK(p->producer->publish(s, st, g == MO_GENS, &json, &last, err));
        WG_CHECK(wh_send_str(fd, json) == 0, "send");
        char *ack;
        WG_CHECK(wh_recv(fd, &ack, NULL) == 0, "no ack");
        wh_free(ack);
    }
    WG_OK(p->producer->wait_consumed(s, st, last, err));
    wg_close_and_retire(p, s, fd);
    return 0;
}

static int consumer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    wsync_consumer_t *c = wg_consumer(p, 0);
    wsync_stream_t st;
    WG_OK(p->consumer->stream_create(c, &st, err));
    unsigned char *alloc[4];
    for (int a = 0; a < 4; a++) /* one allocation per fused parameter, as engines hold them */
        WG_OK(p->consumer->mem_alloc(c, alloc_bytes[a], (void **)&alloc[a], err));
    unsigned long long *bad_dev;
    WG_CK(cudaMalloc((void **)&bad_dev, sizeof(*bad_dev)));
    for (uint64_t g = 1; g <= MO_GENS; g++) {
        char *json;
        size_t len;
        const wsync_manifest_t *m;
        wsync_handle_t *h;
        WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest");
        WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
        WG_CHECK(m->n_tensors == MO_N, "%zu tensors", m->n_tensors);
        WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        for (int a = 0; a < 4; a++) /* poison: every byte must be written again */
            WG_CK(cudaMemsetAsync(alloc[a], 0xA5, alloc_bytes[a], (cudaStream_t)st));
        wsync_copy_op_t ops[MO_N];
        for (size_t k = 0; k < MO_N; k++) {
            /* the engine looks tensors up by name; the order is the producer's */
            size_t want = g < MO_GENS ? mo_engine_order(k) : k;
            WG_CHECK(strcmp(m->tensors[k].name, T[want].name) == 0,
                     "generation %llu: manifest tensor %zu is %s, want %s", (unsigned long long)g,
                     k, m->tensors[k].name, T[want].name);
            WG_CHECK(k == 0 || m->tensors[k].offset > m->tensors[k - 1].offset,
                     "offsets do not rise at %zu", k);
            const mo_tensor_t *x = &T[want];
            ops[k] = (wsync_copy_op_t){.src_offset = m->tensors[k].offset,
                                       .src_pitch = x->bytes,
                                       .dst = alloc[x->alloc] + x->dst_off,
                                       .dst_pitch = x->bytes,
                                       .dst_extent = x->bytes,
                                       .rows = 1,
                                       .row_bytes = x->bytes,
                                       .digest = m->tensors[k].digest,
                                       .has_digest = m->tensors[k].has_digest};
        }
        const uint32_t flags = g == 1 ? WSYNC_COPY_VERIFY : 0;
        WG_OK(p->consumer->copy_weights(c, h, st, m->generation, ops, MO_N, flags, err));
        WG_OK(p->consumer->record_consumed(c, h, flags != 0, err));
        WG_CK(cudaMemsetAsync(bad_dev, 0, sizeof(*bad_dev), (cudaStream_t)st));
        for (size_t i = 0; i < MO_N; i++)
            WG_CK(wh_count_bad(alloc[T[i].alloc] + T[i].dst_off, T[i].bytes,
                               mo_seed(g) + T[i].trainer_off / 8, bad_dev, (cudaStream_t)st));
        unsigned long long bad = 0;
        WG_CK(
            cudaMemcpyAsync(&bad, bad_dev, sizeof(bad), cudaMemcpyDeviceToHost, (cudaStream_t)st));
        WG_OK(p->consumer->stream_synchronize(c, st, err));
        WG_CHECK(bad == 0, "generation %llu: %llu wrong words in the engine's parameters",
                 (unsigned long long)g, bad);
        WG_OK(p->consumer->close_handle(c, h, err));
        p->consumer->manifest_free(c, m);
        wh_free(json);
        WG_CHECK(wh_send_str(fd, "ack") == 0, "send");
    }
    WG_CHECK(wh_send_str(fd, "closed") == 0, "send");
    WG_CK(cudaFree(bad_dev));
    WG_OK(p->consumer->stream_destroy(c, st, err));
    WG_OK(p->consumer->finalize(c, err));
    return 0;
}

static void test_moe_in_hf_order(void **state)
{
    (void)state;
    assert_true(wg_pair_passes(producer, consumer, (void *)WG_PLUGIN));
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    mo_layout();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_in_hf_order)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
