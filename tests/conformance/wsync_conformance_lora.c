/* The conformance suite's LoRA case (docs/DESIGN.md §6), for the shim and plugin under test: an
 * adapter (model/wsync_lora.h, all-linear on the dense layout) loaded through the shim's own
 * messages into the reference engine's slots (packed qkv_proj / gate_up_proj), checked bit-exact
 * against wsync_ref_lora.c's independent expectation; a same-name reload (the upsert; vLLM resets
 * the prefix cache); bad adapters refused with a clear error and both copies unchanged; the
 * colocated tensors path (SGLang; CPU plugin: the producer runs in this process); unload. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_conformance.h"
#include "wsync_loader.h"
#include "wsync_lora.h"
#include "wsync_client.h"

#define CONF_LORA_RANK 8

typedef struct conf_lora {
    conf_t *c;
    wsync_ref_engine_t e;
    const wsync_shim_t *shim;
    wsync_lora_t a;
    char dir[64];
} conf_lora_t;

/* Send one message through the engine; returns the result, message into msg. */
static wsync_result_t conf_lora_send(conf_lora_t *l, json_t *req, char *msg, size_t len)
{
    char *text = json_dumps(req, JSON_COMPACT), *reply;
    wsync_result_t rc = WSYNC_ERR_OUT_OF_MEMORY;
    int stop = 0;

    json_decref(req);
    if (text == NULL)
        return rc;
    reply = wsync_ref_engine_handle(&l->e, text, strlen(text), &rc, &stop);
    json_t *r = reply != NULL ? json_loads(reply, 0, NULL) : NULL;
    snprintf(msg, len, "%s", json_string_value(json_object_get(r, "message")) ?: "");
    json_decref(r);
    free(reply);
    free(text);
    return rc;
}

static wsync_result_t conf_lora_encode_send(conf_lora_t *l, const wsync_shim_lora_t *in, char *msg,
                                            size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_t *req = NULL;
    wsync_result_t rc = l->shim->encode_lora(in, &req, &err);
    if (rc != WSYNC_OK) {
        snprintf(msg, len, "%s", err.message);
        return rc;
    }
    return conf_lora_send(l, req, msg, len);
}

/* The PEFT directory of adapter `a` at `version` (model/wsync_lora.h). */
static int conf_lora_write(conf_lora_t *l, const wsync_lora_t *a, uint64_t version,
                           wsync_dtype_t dtype, const char *extra)
{
    char why[WSYNC_ERROR_MESSAGE_LEN], module[96];
    snprintf(module, sizeof(module), "model.layers.0.mlp.%s", extra ? extra : "");
    if (wsync_lora_write_dir(a, version, l->dir, dtype, extra ? module : NULL, why, sizeof(why)) ==
        0)
        return 0;
    conf_fail(l->c, "lora: writing the adapter into %s: %s", l->dir, why);
    return -1;
}

static int conf_lora_check(conf_lora_t *l, const char *name, uint64_t version, const char *what)
{
    char bad[WSYNC_REF_NAME_MAX];
    size_t ok = wsync_ref_lora_verify(&l->e.lora, name, &l->a, version, bad, sizeof(bad));
    if (ok == 2 * l->e.lora.n_targets) {
        conf_pass(l->c, "lora %s: %zu/%zu slot tensors bit-exact (rank %u, max rank %u)", what, ok,
                  ok, l->a.rank, WSYNC_REF_LORA_MAX_RANK);
        return 0;
    }
    conf_fail(l->c, "lora %s: %zu/%zu slot tensors bit-exact, first mismatch %s", what, ok,
              2 * l->e.lora.n_targets, bad);
    return -1;
}

/* A bad adapter: refused with `want`, a message naming `needle`, both copies unchanged. */
static void conf_lora_bad(conf_lora_t *l, const char *what, const wsync_lora_t *a,
                          wsync_dtype_t dtype, const char *extra, wsync_result_t want,
                          const char *needle)
{
    wsync_ref_lora_slot_t *s = wsync_ref_lora_find(&l->e.lora, "policy");
    wsync_shim_lora_t in = {.name = "policy", .int_id = 1, .path = l->dir};
    char msg[WSYNC_ERROR_MESSAGE_LEN + 64];

    if (s == NULL || conf_lora_write(l, a, 7, dtype, extra) != 0) {
        conf_fail(l->c, "lora bad %s: no loaded slot to protect", what);
        return;
    }
    uint64_t before = wsync_ref_lora_digest(&l->e.lora, s);
    wsync_result_t rc = conf_lora_encode_send(l, &in, msg, sizeof(msg));
    uint64_t after = wsync_ref_lora_digest(&l->e.lora, s);
    if (rc != want || strstr(msg, needle) == NULL)
        conf_fail(l->c, "lora bad %s: got %s \"%s\", want %s naming \"%s\"", what,
                  wsync_strerror(rc), msg, wsync_strerror(want), needle);
    else if (before != after)
        conf_fail(l->c, "lora bad %s: refused, but the slot changed", what);
    else
        conf_pass(l->c, "lora bad %s: %s (%s); both copies unchanged", what, wsync_strerror(rc),
                  msg);
}

/* SGLang's load_lora_adapter_from_tensors: a retained FIXED_LAYOUT export refreshed in place. */
static void conf_lora_tensors(conf_lora_t *l)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t ld;
    wsync_staging_t *st = NULL;
    wsync_consumer_t *mem = NULL;
    void *src = NULL;
    char msg[WSYNC_ERROR_MESSAGE_LEN + 64];
    char *config = wsync_lora_config_json(&l->a);
    wsync_stage_tensor_t *t = calloc(2 * l->a.n, sizeof(*t));
    wsync_shim_lora_t in = {.name = "colocated", .n_ranks = 1, .config = config};

    if (strcmp(l->shim->engine, "sglang") != 0) {
        const char *none = "{}";
        in.manifests = &none;
        wsync_result_t rc = conf_lora_encode_send(l, &in, msg, sizeof(msg));
        if (rc == WSYNC_ERR_NOT_SUPPORTED)
            conf_pass(l->c, "lora tensors: not offered by this engine's API (%s)", msg);
        else
            conf_fail(l->c, "lora tensors: %s: %s, want NOT_SUPPORTED", wsync_strerror(rc), msg);
        free(config);
        free(t);
        return;
    }
    if (!l->c->host_kind) {
        printf("SKIPPED: [%s] lora tensors: the in-process producer needs the CPU plugin\n",
               l->c->shim);
        free(config);
        free(t);
        return;
    }
    if (wsync_loader_open(&ld, l->c->plugin, NULL, &err) != WSYNC_OK) {
        conf_fail(l->c, "lora tensors: load %s: %s", l->c->plugin, err.message);
        free(config);
        free(t);
        return;
    }
    const wsync_producer_ops_t *P = ld.plugin->producer;
    const wsync_consumer_ops_t *C = ld.plugin->consumer;
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc)};
    wsync_staging_config_t sc = {.struct_size = sizeof(sc),
                                 .bytes = l->a.bytes + 512u * 2 * l->a.n,
                                 .flags = WSYNC_STAGING_FIXED_LAYOUT,
                                 .timeout_ms = 10000};
    wsync_result_t rc = C->create(&cc, &mem, &err);
    if (rc == WSYNC_OK)
        rc = C->mem_alloc(mem, l->a.bytes, &src, &err);
    if (rc == WSYNC_OK)
        rc = P->create(&sc, &st, &err);
    uint64_t off = 0;
    for (size_t i = 0; rc == WSYNC_OK && i < 2 * l->a.n; i++) {
        const wsync_lora_module_t *m = &l->a.modules[i / 2];
        int b = (int)(i % 2);
        t[i] = (wsync_stage_tensor_t){.struct_size = sizeof(t[i]),
                                      .name = b ? m->name_b : m->name_a,
                                      .dtype = WSYNC_DTYPE_BF16,
                                      .ndim = 2,
                                      .shape = {b ? m->out : l->a.rank, b ? l->a.rank : m->in},
                                      .src = (char *)src + off};
        off += 2u * (uint64_t)(t[i].shape[0] * t[i].shape[1]);
    }
    for (uint64_t v = 3; rc == WSYNC_OK && v <= 4; v++) {
        const char *json = NULL;
        uint64_t gen = 0;
        for (size_t i = 0; i < 2 * l->a.n; i++)
            wsync_lora_fill(&l->a, i / 2, (int)(i % 2), v, (uint16_t *)t[i].src);
        rc = P->stage(st, NULL, t, 2 * l->a.n, &err);
        if (rc == WSYNC_OK)
            rc = P->publish(st, NULL, 1, &json, &gen, &err);
        if (rc != WSYNC_OK)
            break;
        in.manifests = &json;
        rc = conf_lora_encode_send(l, &in, msg, sizeof(msg));
        if (rc != WSYNC_OK) {
            conf_fail(l->c, "lora tensors v%llu: %s: %s", (unsigned long long)v, wsync_strerror(rc),
                      msg);
            break;
        }
        char what[64];
        snprintf(what, sizeof(what), "from tensors (refresh %llu)", (unsigned long long)v - 2);
        conf_lora_check(l, "colocated", v, what);
        /* *consumed* fired once the slot switched: the export may be refreshed. */
        rc = P->wait_consumed(st, NULL, gen, &err);
    }
    if (rc != WSYNC_OK && err.message[0] != '\0')
        conf_fail(l->c, "lora tensors: %s: %s", wsync_strerror(rc), err.message);
    /* Retire handshake: the engine closes its mapping first. */
    conf_lora_send(l, json_pack("{s:s}", "method", "wsync.release"), msg, sizeof(msg));
    if (st != NULL && P->retire(st, &err) != WSYNC_OK)
        conf_fail(l->c, "lora tensors: retire: %s", err.message);
    if (src != NULL)
        C->mem_free(mem, src, NULL);
    if (mem != NULL)
        C->finalize(mem, NULL);
    wsync_loader_close(&ld);
    free(config);
    free(t);
}

static void conf_lora_run(conf_lora_t *l)
{
    conf_t *c = l->c;
    char msg[WSYNC_ERROR_MESSAGE_LEN + 64], why[128];
    wsync_shim_lora_t in = {.name = "policy", .int_id = 1, .path = l->dir};
    wsync_result_t rc;

    /* Load, then a same-name reload of a newer version (the upsert). */
    for (uint64_t v = 1; v <= 2; v++) {
        unsigned resets = l->e.lora.prefix_resets;
        if (conf_lora_write(l, &l->a, v, WSYNC_DTYPE_F32, NULL) != 0)
            return;
        rc = conf_lora_encode_send(l, &in, msg, sizeof(msg));
        if (rc != WSYNC_OK) {
            conf_fail(c, "lora load v%llu from a PEFT directory: %s: %s", (unsigned long long)v,
                      wsync_strerror(rc), msg);
            return;
        }
        conf_lora_check(l, "policy", v, v == 1 ? "from a PEFT directory" : "same-name reload");
        int want = v == 2 && strcmp(c->shim, "vllm") == 0;
        if (l->e.lora.prefix_resets - resets != (unsigned)want)
            conf_fail(c, "lora v%llu: prefix-cache reset called %u times, want %d",
                      (unsigned long long)v, l->e.lora.prefix_resets - resets, want);
        else if (want)
            conf_pass(c, "lora same-name reload reset the prefix cache of \"%s\"",
                      l->e.lora.last_reset);
    }

    wsync_lora_t big;
    if (wsync_lora_build(&big, &l->e.layout.model, WSYNC_REF_LORA_MAX_RANK + 16, why,
                         sizeof(why)) == 0) {
        conf_lora_bad(l, "rank > max rank", &big, WSYNC_DTYPE_F32, NULL, WSYNC_ERR_LAYOUT_MISMATCH,
                      "max");
        wsync_lora_free(&big);
    }
    conf_lora_bad(l, "unknown module", &l->a, WSYNC_DTYPE_F32, "foo_proj", WSYNC_ERR_NOT_FOUND,
                  "foo_proj");
    conf_lora_bad(l, "dtype int32", &l->a, WSYNC_DTYPE_I32, NULL, WSYNC_ERR_NOT_SUPPORTED, "int32");
    /* A's or B's shape disagrees with the slot's module: refused naming the module. */
    for (int b = 0; b < 2 && l->a.n > 1; b++) {
        wsync_lora_t bad = l->a;
        bad.modules = malloc(l->a.n * sizeof(*bad.modules));
        if (bad.modules == NULL)
            break;
        memcpy(bad.modules, l->a.modules, l->a.n * sizeof(*bad.modules));
        wsync_lora_module_t *m = &bad.modules[b];
        if (b)
            m->out += 8; /* B [out + 8, r] */
        else
            m->in += 8; /* A [r, in + 8] */
        conf_lora_bad(l, b ? "wrong B shape" : "wrong A shape", &bad, WSYNC_DTYPE_F32, NULL,
                      WSYNC_ERR_LAYOUT_MISMATCH, m->module);
        free(bad.modules);
    }

    conf_lora_tensors(l);

    /* Unload: ranks zero in both copies, the name is gone; a second unload is NOT_FOUND. */
    wsync_ref_lora_slot_t *s = wsync_ref_lora_find(&l->e.lora, "policy");
    in.unload = 1;
    rc = conf_lora_encode_send(l, &in, msg, sizeof(msg));
    int zero = s != NULL;
    for (size_t t = 0; s != NULL && t < l->e.lora.n_targets; t++)
        zero &= s->targets[t].rank[0] == 0 && s->targets[t].rank[1] == 0;
    if (rc != WSYNC_OK || !zero || wsync_ref_lora_find(&l->e.lora, "policy") != NULL)
        conf_fail(c, "lora unload: %s: %s (ranks zero: %d)", wsync_strerror(rc), msg, zero);
    else if ((rc = conf_lora_encode_send(l, &in, msg, sizeof(msg))) != WSYNC_ERR_NOT_FOUND)
        conf_fail(c, "lora second unload: %s, want NOT_FOUND", wsync_strerror(rc));
    else
        conf_pass(c, "lora unload: every rank zero, a second unload is refused (%s)", msg);
}

void conf_lora(conf_t *c)
{
    conf_lora_t l = {.c = c};
    char why[128], path[128];

    if (conf_engine(c, &l.e, c->plugin, "dense", 0, 1, NULL) != 0)
        return;
    l.shim = wsync_shim_find(c->shim);
    snprintf(l.dir, sizeof(l.dir), "/tmp/wsync-conf-lora-XXXXXX");
    if (l.e.lora.n_slots == 0)
        conf_fail(c, "lora: the reference engine built no adapter slots");
    else if (wsync_lora_build(&l.a, &l.e.layout.model, CONF_LORA_RANK, why, sizeof(why)) != 0)
        conf_fail(c, "lora: %s", why);
    else if (mkdtemp(l.dir) == NULL)
        conf_fail(c, "lora: mkdtemp failed");
    else
        conf_lora_run(&l);
    wsync_ref_engine_close(&l.e);
    wsync_lora_free(&l.a);
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", l.dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/adapter_config.json", l.dir);
    unlink(path);
    rmdir(l.dir);
}
