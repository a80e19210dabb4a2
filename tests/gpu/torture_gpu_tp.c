/* Tensor-parallel colocated sync on several GPUs: for TP = n (2, 4, 8 where the machine has the
 * GPUs), n trainer/engine pairs run at once, pair r on GPU r (both processes see only that GPU,
 * as engine workers do: CUDA_VISIBLE_DEVICES set per child before CUDA starts, so the reference
 * engine's device 0 is physical GPU r). Each engine is the reference engine at TP rank r of n,
 * reached through its shim (so the shims' TP narrowing runs for real) and libwsync_cuda.so; each
 * trainer is the reference trainer staging the full HF tensors. Three versions are synced and
 * every engine parameter of every rank is compared bit-exactly with the expected shard.
 * Fewer than 2 GPUs: "SKIPPED: ... needs 2 GPUs, found M", exit 77; a TP size above the GPU
 * count is skipped with its own line. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wsync_driver.h"
#include "wsync_gpu_multi.h"
#include "wsync_gpu_test.h"
#include "wsync_ref_engine.h"
#include "wsync_ref_trainer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* The children hand buffers between the reference engine/trainer libraries and this file; they
 * must use the real allocator, not cmocka's leak-checking one. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#define TP_VERSIONS 3
#define TP_CHILD_SECONDS 240 /* a hung child is killed instead of hanging ctest */

static int tp_gpus;

typedef struct tp_run {
    const char *shim;
    const char *layout;
    uint32_t n;
    int fds[8][2]; /* [r][0] trainer end, [r][1] engine end */
} tp_run_t;

static wsync_model_config_t tp_model(const char *layout)
{
    /* Scale 4 keeps heads (8 q / 2 kv dense, 8 / 1 moe), vocab and intermediate divisible by 8. */
    return (wsync_model_config_t){.layout = layout, .scale = 4, .layers = 1};
}

static void tp_close_others(tp_run_t *t, int keep)
{
    for (uint32_t r = 0; r < t->n; r++)
        for (int s = 0; s < 2; s++)
            if (t->fds[r][s] != keep)
                close(t->fds[r][s]);
}

static int tp_engine(uint32_t r, tp_run_t *t)
{
    const int fd = t->fds[r][1];
    tp_close_others(t, fd);
    wgm_pin_to_gpu((int)r);
    alarm(TP_CHILD_SECONDS);
    wsync_ref_engine_config_t cfg = {.engine = t->shim,
                                     .plugin = WG_PLUGIN,
                                     .model = tp_model(t->layout),
                                     .rank = r,
                                     .size = t->n,
                                     .timeout_ms = 20000};
    wsync_ref_engine_t e;
    char why[256];
    const char *native = NULL;
    if (wsync_ref_engine_open(&e, &cfg, why, sizeof(why)) != 0) {
        fprintf(stderr, "engine tp %u/%u: %s\n", r, t->n, why);
        return 1;
    }
    if (wsync_driver_native(e.driver, &native)) {
        fprintf(stderr, "engine tp %u/%u fell back to the native loader: %s\n", r, t->n,
                native ? native : "?");
        wsync_ref_engine_close(&e);
        return 1;
    }
    int stop = 0;
    while (!stop) {
        char *buf = NULL;
        size_t len = 0;
        if (wh_recv(fd, &buf, &len) != 0)
            break;
        wsync_result_t rc = WSYNC_OK;
        char *reply = wsync_ref_engine_handle(&e, buf, len, &rc, &stop);
        wh_free(buf);
        int sent = reply != NULL && wh_send_str(fd, reply) == 0;
        free(reply);
        if (!sent)
            break;
    }
    wsync_ref_engine_close(&e);
    close(fd);
    return stop ? 0 : 1;
}

static int tp_send(void *user, uint32_t rank, const char *msg)
{
    (void)rank; /* one engine rank per trainer rank */
    return wh_send_str(*(int *)user, msg);
}

static char *tp_recv(void *user, uint32_t rank)
{
    (void)rank;
    char *buf = NULL;
    size_t len = 0;
    if (wh_recv(*(int *)user, &buf, &len) != 0)
        return NULL;
    char *copy = strdup(buf); /* the trainer frees replies with free() */
    wh_free(buf);
    return copy;
}

/* One engine-level request; returns the single reply (new reference) or NULL. */
static json_t *tp_call(wsync_ref_trainer_t *tr, const wsync_ref_transport_t *tp, json_t *req)
{
    json_t *replies = wsync_ref_trainer_exchange(tr, tp, req);
    json_decref(req);
    json_t *one = replies ? json_incref(json_array_get(replies, 0)) : NULL;
    json_decref(replies);
    return one;
}

static int tp_trainer(uint32_t r, tp_run_t *t)
{
    int fd = t->fds[r][0];
    tp_close_others(t, fd);
    wgm_pin_to_gpu((int)r);
    alarm(TP_CHILD_SECONDS);
    wsync_ref_trainer_config_t cfg = {.engine = t->shim,
                                      .plugin = WG_PLUGIN,
                                      .model = tp_model(t->layout),
                                      .ranks = 1,
                                      .bucket_bytes = 96u
                                                      << 20, /* the scale-4 embedding is 78 MB */
                                      .timeout_ms = 20000};
    wsync_ref_trainer_t tr;
    wsync_ref_transport_t tp = {.send = tp_send, .recv = tp_recv, .user = &fd};
    char why[256];
    int bad = 0;
    if (wsync_ref_trainer_open(&tr, &cfg, why, sizeof(why)) != 0) {
        fprintf(stderr, "trainer for tp rank %u: %s\n", r, why);
        return 1;
    }
    for (uint64_t v = 1; v <= TP_VERSIONS && !bad; v++) {
        if (wsync_ref_trainer_sync(&tr, v, &tp) != 0) {
            fprintf(stderr, "%s %s tp %u/%u: sync of version %llu refused\n", t->shim, t->layout, r,
                    t->n, (unsigned long long)v);
            bad = 1;
            break;
        }
        json_t *rep = tp_call(
            &tr, &tp, json_pack("{s:s, s:I}", "method", "wsync.verify", "version", (json_int_t)v));
        json_int_t ok = json_integer_value(json_object_get(rep, "verified"));
        json_int_t total = json_integer_value(json_object_get(rep, "total"));
        if (rep == NULL || total <= 0 || ok != total ||
            json_is_true(json_object_get(rep, "native"))) {
            fprintf(stderr,
                    "%s %s tp %u/%u version %llu: %lld of %lld parameters bit-exact, first "
                    "mismatch %s%s\n",
                    t->shim, t->layout, r, t->n, (unsigned long long)v, (long long)ok,
                    (long long)total, json_string_value(json_object_get(rep, "mismatch")),
                    json_is_true(json_object_get(rep, "native")) ? " (native fallback)" : "");
            bad = 1;
        } else if (v == TP_VERSIONS) {
            printf("%s %s tp %u/%u on GPU %d: %lld/%lld parameters bit-exact after %d syncs\n",
                   t->shim, t->layout, r, t->n, (int)r, (long long)ok, (long long)total,
                   TP_VERSIONS);
        }
        json_decref(rep);
    }
    json_decref(tp_call(&tr, &tp, json_pack("{s:s}", "method", "wsync.release")));
    json_decref(tp_call(&tr, &tp, json_pack("{s:s}", "method", "wsync.shutdown")));
    wsync_ref_trainer_close(&tr); /* retire after the engine closed its mapping */
    close(fd);
    return bad;
}

static int tp_child(int i, void *arg)
{
    tp_run_t *t = arg;
    return (uint32_t)i < t->n ? tp_engine((uint32_t)i, t) : tp_trainer((uint32_t)i - t->n, t);
}

static void tp_run(uint32_t n, const char *shim, const char *layout)
{
    if (tp_gpus < (int)n) {
        printf("SKIPPED: tp=%u needs %u GPUs, found %d\n", n, n, tp_gpus);
        WG_SKIP();
    }
    tp_run_t t = {.shim = shim, .layout = layout, .n = n};
    int all[16];
    for (uint32_t r = 0; r < n; r++) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, t.fds[r]), 0);
        all[2 * r] = t.fds[r][0];
        all[2 * r + 1] = t.fds[r][1];
    }
    int failed = wgm_run_children((int)(2 * n), tp_child, &t, all, (int)(2 * n));
    assert_int_equal(failed, 0);
}

static void test_tp2(void **state)
{
    (void)state;
    tp_run(2, "sglang", "dense");
    tp_run(2, "vllm", "dense");
    tp_run(2, "lmdeploy", "dense");
    tp_run(2, "sglang", "moe");
}

static void test_tp4(void **state)
{
    (void)state;
    tp_run(4, "sglang", "dense");
    tp_run(4, "vllm", "moe");
}

static void test_tp8(void **state)
{
    (void)state;
    tp_run(8, "sglang", "dense");
    tp_run(8, "lmdeploy", "moe");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    tp_gpus = wgm_require_gpus(2, "torture_gpu_tp");
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2),
        cmocka_unit_test(test_tp4),
        cmocka_unit_test(test_tp8),
    };
    return wg_finish(cmocka_run_group_tests(tests, NULL, NULL), "torture_gpu_tp");
}
