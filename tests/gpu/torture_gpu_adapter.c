/* LoRA hot-load on the GPU: FROM_DIR and FROM_MANIFEST loads into device slots must equal, byte
 * for byte, the host executor's load of the same directory (dtype conversions with rounding,
 * per-part scaling of a packed target, rank padding, untrained targets zeroed); a refused load
 * writes nothing; unload zeroes the slot. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "wsync_adapter_load.h"
#include "wsync_cuda_lora.h"
#include "wsync_gpu_test.h"
#include "wsync_client.h"
#include "wsync_safetensors.h"

#define MAX_RANK 16
#define L0 "model.layers.0."
#define CONFIG                                                                                     \
    "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\",\"k_proj\","  \
    "\"v_proj\",\"o_proj\"],\"rank_pattern\":{\"o_proj\":8},\"alpha_pattern\":{\"k_proj\":16}}"

static char g_dir[256];

static const wl_module_t g_mods[] = {
    {L0 "self_attn.q_proj", 4, 64, 64, WSYNC_DTYPE_F32},
    {L0 "self_attn.k_proj", 4, 64, 32, WSYNC_DTYPE_BF16},
    {L0 "self_attn.v_proj", 4, 64, 32, WSYNC_DTYPE_F64},
    {L0 "self_attn.o_proj", 8, 64, 64, WSYNC_DTYPE_F16},
};

/* qkv packed (bf16), o_proj (f32), down_proj untrained (f16). in_qkv lets a test break it. */
static void targets(wl_target_t t[3], int64_t in_qkv)
{
    memset(t, 0, 3 * sizeof(*t));
    snprintf(t[0].module, sizeof(t[0].module), L0 "self_attn.qkv_proj");
    t[0].in = in_qkv;
    t[0].out = 128;
    t[0].dtype = WSYNC_DTYPE_BF16;
    t[0].n_parts = 3;
    const char *parts[3] = {"q_proj", "k_proj", "v_proj"};
    const int64_t off[3] = {0, 64, 96}, out[3] = {64, 32, 32};
    for (int p = 0; p < 3; p++) {
        snprintf(t[0].part_names[p], sizeof(t[0].part_names[p]), "%s", parts[p]);
        t[0].part_offset[p] = off[p];
        t[0].part_out[p] = out[p];
    }
    snprintf(t[1].module, sizeof(t[1].module), L0 "self_attn.o_proj");
    t[1].in = 64;
    t[1].out = 64;
    t[1].dtype = WSYNC_DTYPE_F32;
    snprintf(t[2].module, sizeof(t[2].module), L0 "mlp.down_proj");
    t[2].in = 128;
    t[2].out = 64;
    t[2].dtype = WSYNC_DTYPE_F16;
}

/* The host executor's load of g_dir: the reference. */
static void reference(wl_slot_t *host)
{
    wl_target_t t[3];
    targets(t, 64);
    WG_CHECK(wl_slot_init(host, "ref", MAX_RANK, t, 3, 0) == 0, "host slot");
    wsync_adapter_source_t src = {
        .struct_size = sizeof(src), .kind = WSYNC_ADAPTER_FROM_DIR, .path = g_dir};
    WG_OK(wsync_adapter_hot_load(&src, &host->slot, NULL, NULL, NULL, err));
    WG_CHECK(host->active == 1, "host load switched to %d", host->active);
}

static int from_dir_child(void)
{
    const wsync_plugin_t *p = wg_load(WG_PLUGIN, 0);
    wsync_consumer_t *c = wg_consumer(p, 0);
    WG_CHECK(WSYNC_HAS_OP(wsync_consumer_ops_t, p->consumer, unload_adapter),
             "unload_adapter missing");
    wl_slot_t host, dev, bad;
    reference(&host);
    wl_target_t t[3];
    targets(t, 64);
    WG_CHECK(wl_slot_init(&dev, "ref", MAX_RANK, t, 3, 1) == 0, "device slot");
    wsync_adapter_source_t src = {
        .struct_size = sizeof(src), .kind = WSYNC_ADAPTER_FROM_DIR, .path = g_dir};
    WG_OK(p->consumer->hot_load_adapter(c, &src, &dev.slot, NULL, err));
    WG_CHECK(dev.active == 1, "active %d after the load", dev.active);
    char why[512] = "";
    uint64_t diff = wl_slot_compare(&dev, &host, 1, why, sizeof(why));
    WG_CHECK(diff == 0, "FROM_DIR differs from the host executor: %s", why);
    WG_CHECK(wl_slot_all(&dev, 0, 0xA5), "the active copy was written");
    printf("FROM_DIR: device slot equals the host executor's, %u/%u/%u ranks\n",
           dev.targets[0].rank[1], dev.targets[1].rank[1], dev.targets[2].rank[1]);

    /* a slot that does not fit (qkv in_features 32): refused, nothing written */
    targets(t, 32);
    WG_CHECK(wl_slot_init(&bad, "bad", MAX_RANK, t, 3, 1) == 0, "device slot");
    wsync_error_t e = {.struct_size = sizeof(e)};
    wsync_result_t r = p->consumer->hot_load_adapter(c, &src, &bad.slot, NULL, &e);
    WG_CHECK(r == WSYNC_ERR_LAYOUT_MISMATCH, "mismatched slot: %s (%s)", wsync_strerror(r),
             e.message);
    WG_CHECK(bad.active == 0 && wl_slot_all(&bad, 0, 0xA5) && wl_slot_all(&bad, 1, 0xA5),
             "a refused load wrote into the slot");

    /* unload: rank 0, zero A/B in the copy switched to */
    WG_OK(p->consumer->unload_adapter(c, &dev.slot, err));
    WG_CHECK(dev.targets[0].rank[0] == 0 && dev.targets[0].rank[1] == 0, "rank after unload");
    WG_CHECK(wl_slot_all(&dev, dev.active, 0), "unload left bytes in the active copy");
    wl_slot_free(&bad);
    wl_slot_free(&dev);
    wl_slot_free(&host);
    WG_OK(p->consumer->finalize(c, err));
    return 0;
}

static void test_from_dir(void **state)
{
    (void)state;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        _exit(from_dir_child());
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Producer: stage the directory's tensors as they are (PEFT names, file dtypes), publish. */
static int producer(int fd, void *arg)
{
    (void)arg;
    const wsync_plugin_t *p = wg_load(WG_PLUGIN, 0);
    WG_CK(cudaSetDevice(0));
    char path[512];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", g_dir);
    wsync_safetensors_t *st;
    WG_OK(wsync_safetensors_open(path, &st, err));
    size_t n = wsync_safetensors_count(st);
    wsync_stage_tensor_t *t = calloc(n, sizeof(*t));
    void **dev = calloc(n, sizeof(*dev));
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const wsync_st_tensor_t *x = wsync_safetensors_at(st, i);
        WG_CK(cudaMalloc(&dev[i], x->nbytes));
        WG_CK(cudaMemcpy(dev[i], x->data, x->nbytes, cudaMemcpyHostToDevice));
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = x->name,
                                      .dtype = x->dtype,
                                      .ndim = x->ndim,
                                      .src = dev[i]};
        memcpy(t[i].shape, x->shape, sizeof(t[i].shape));
        total += x->nbytes + 256;
    }
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg), .bytes = total};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    WG_OK(p->producer->stage(s, NULL, t, n, err));
    const char *json;
    uint64_t gen;
    WG_OK(p->producer->publish(s, NULL, 1, &json, &gen, err));
    WG_CHECK(wh_send_str(fd, json) == 0, "send");
    char *ack;
    WG_CHECK(wh_recv(fd, &ack, NULL) == 0, "no ack");
    wh_free(ack);
    WG_OK(p->producer->wait_consumed(s, NULL, gen, err));
    wg_close_and_retire(p, s, fd);
    for (size_t i = 0; i < n; i++)
        cudaFree(dev[i]);
    free(dev);
    free(t);
    wsync_safetensors_close(st);
    return 0;
}

static int consumer(int fd, void *arg)
{
    (void)arg;
    const wsync_plugin_t *p = wg_load(WG_PLUGIN, 0);
    wsync_consumer_t *c = wg_consumer(p, 0);
    wl_slot_t host, dev;
    reference(&host);
    wl_target_t t[3];
    targets(t, 64);
    WG_CHECK(wl_slot_init(&dev, "ref", MAX_RANK, t, 3, 1) == 0, "device slot");
    char *json;
    size_t len;
    WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest");
    const wsync_manifest_t *m;
    WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
    wsync_handle_t *h;
    WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
    wsync_adapter_source_t src = {.struct_size = sizeof(src),
                                  .kind = WSYNC_ADAPTER_FROM_MANIFEST,
                                  .handle = h,
                                  .manifest = m,
                                  .adapter_config_json = CONFIG};
    WG_OK(p->consumer->hot_load_adapter(c, &src, &dev.slot, NULL, err));
    /* the same generation again is a replay: refused, nothing written */
    wsync_error_t e = {.struct_size = sizeof(e)};
    wsync_result_t r = p->consumer->hot_load_adapter(c, &src, &dev.slot, NULL, &e);
    WG_CHECK(r != WSYNC_OK && dev.active == 1, "replayed manifest accepted");
    WG_CHECK(wh_send_str(fd, "ack") == 0, "ack");
    char why[512] = "";
    uint64_t diff = wl_slot_compare(&dev, &host, 1, why, sizeof(why));
    WG_CHECK(diff == 0, "FROM_MANIFEST differs from the host executor: %s", why);
    printf("FROM_MANIFEST (%s): device slot equals the host executor's\n",
           m->buffer.kind == WSYNC_BUFFER_CUDA_VMM_FD ? "cuda_vmm_fd" : "cuda_ipc");
    WG_OK(p->consumer->close_handle(c, h, err));
    p->consumer->manifest_free(c, m);
    wh_free(json);
    WG_CHECK(wh_send_str(fd, "closed") == 0, "send");
    wl_slot_free(&dev);
    wl_slot_free(&host);
    WG_OK(p->consumer->finalize(c, err));
    return 0;
}

static void test_from_manifest(void **state)
{
    (void)state;
    assert_true(wg_pair_passes(producer, consumer, NULL));
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    snprintf(g_dir, sizeof(g_dir), "%s/wsync-gpu-adapter-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char why[256];
    if (wl_write_dir(g_dir, CONFIG, g_mods, sizeof(g_mods) / sizeof(g_mods[0]), 42, why,
                     sizeof(why)) != 0) {
        fprintf(stderr, "%s\n", why);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_dir),
        cmocka_unit_test(test_from_manifest),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return rc;
}
