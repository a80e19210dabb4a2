/* wsync demo --lora: an adapter-only sync (docs/DESIGN.md §1.3, §6). The base weights stay frozen
 * in the engine; only a rank-R adapter moves. The trainer keeps ONE retained FIXED_LAYOUT staging
 * holding the adapter tensors under their PEFT names and refreshes it in place each sync (after
 * wait_consumed of the previous generation, docs/DESIGN.md §1.2); the engine hot-loads it into its
 * adapter slot (shadow copy, then switch) and reads the active copy back to check it against the
 * content that version must have.
 *
 * Messages (trainer -> engine): {"type":"lora","version":k,"config":"<adapter_config.json>"}
 * then the manifest; engine -> trainer {"type":"ack","generation":g,"ok":true}, then
 * {"type":"verified","ok":n,"total":N}; {"type":"end"} -> {"type":"closed"}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_cli.h"
#include "wsync_demo.h"
#include "wsync_digest.h"
#include "wsync_lora.h"
#include "wsync_wire.h"

/* What both processes share: the plugin, a consumer (the engine's, or the trainer's memory
 * helper), the model and the adapter. */
typedef struct wsync_lora_side {
    const wsync_demo_options_t *o;
    const char *who;
    wsync_loader_t l;
    wsync_host_t host;
    const wsync_consumer_ops_t *cops;
    const wsync_producer_ops_t *pops;
    wsync_consumer_t *c;
    wsync_model_t model;
    wsync_lora_t lora;
    uint16_t *scratch[2];
    int listen_fd, fd;
} wsync_lora_side_t;

static int wsync_lora_setup(wsync_lora_side_t *s, const wsync_demo_options_t *o, const char *who)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_consumer_config_t cfg = {.struct_size = sizeof(cfg),
                                   .timeout_ms = (uint32_t)o->timeout_ms};
    char why[160];
    wsync_result_t rc;
    size_t max = 0;

    s->o = o;
    s->who = who;
    wsync_cli_host(&s->host, who);
    if (wsync_cli_load(&s->l, o->plugin, &s->host) != 0)
        return 1;
    s->cops = s->l.plugin->consumer;
    s->pops = s->l.plugin->producer;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, s->cops, mem_alloc) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, s->cops, mem_copy) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, s->cops, hot_load_adapter)) {
        fprintf(stderr, "wsync %s: plugin %s lacks mem_alloc/mem_copy/hot_load_adapter\n", who,
                s->l.path);
        return 1;
    }
    if (wsync_model_build(&s->model, &o->model, why, sizeof(why)) != 0 ||
        wsync_lora_build(&s->lora, &s->model, o->lora_rank, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync %s: %s\n", who, why);
        return 1;
    }
    for (size_t m = 0; m < s->lora.n; m++) {
        size_t a = (size_t)o->lora_max_rank * (size_t)s->lora.modules[m].in;
        size_t b = (size_t)o->lora_max_rank * (size_t)s->lora.modules[m].out;
        max = a > max ? a : max;
        max = b > max ? b : max;
    }
    s->scratch[0] = malloc(2 * max);
    s->scratch[1] = malloc(2 * max);
    if (s->scratch[0] == NULL || s->scratch[1] == NULL) {
        fprintf(stderr, "wsync %s: out of host memory\n", who);
        return 1;
    }
    rc = s->cops->create(&cfg, &s->c, &err);
    return rc == WSYNC_OK ? 0 : wsync_cli_report(who, "consumer create", rc, &err);
}

static void wsync_lora_teardown(wsync_lora_side_t *s)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (s->fd >= 0)
        close(s->fd);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->c != NULL)
        s->cops->finalize(s->c, &err);
    free(s->scratch[0]);
    free(s->scratch[1]);
    wsync_lora_free(&s->lora);
    wsync_model_free(&s->model);
    wsync_loader_close(&s->l);
}

/* ------------------------------------------------------------------ trainer */

typedef struct wsync_lora_trainer {
    wsync_lora_side_t s;
    wsync_staging_t *staging;
    void *params; /* the adapter tensors, plugin memory: A then B of every module */
    wsync_stage_tensor_t *stage;
    uint64_t *expected; /* wsync64 of each staged tensor for the current version */
    char *config;
    uint64_t generation; /* last published */
} wsync_lora_trainer_t;

static int wsync_lora_trainer_setup(wsync_lora_trainer_t *t)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_lora_side_t *s = &t->s;
    uint64_t off = 0;
    wsync_result_t rc;

    t->stage = calloc(2 * s->lora.n, sizeof(*t->stage));
    t->expected = calloc(2 * s->lora.n, sizeof(*t->expected));
    t->config = wsync_lora_config_json(&s->lora);
    if (t->stage == NULL || t->expected == NULL || t->config == NULL)
        return wsync_cli_report("trainer", "allocate", WSYNC_ERR_OUT_OF_MEMORY, NULL);
    rc = s->cops->mem_alloc(s->c, s->lora.bytes, &t->params, &err);
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "mem_alloc of the adapter", rc, &err);
    for (size_t m = 0; m < s->lora.n; m++) {
        const wsync_lora_module_t *mod = &s->lora.modules[m];
        for (int b = 0; b < 2; b++) {
            wsync_stage_tensor_t *x = &t->stage[2 * m + (size_t)b];
            x->struct_size = sizeof(*x);
            x->name = b ? mod->name_b : mod->name_a;
            x->dtype = WSYNC_DTYPE_BF16;
            x->ndim = 2;
            x->shape[0] = b ? mod->out : s->lora.rank;
            x->shape[1] = b ? s->lora.rank : mod->in;
            x->src = (char *)t->params + off;
            off += 2u * (uint64_t)(x->shape[0] * x->shape[1]);
        }
    }
    /* One allocation for the process lifetime; FIXED_LAYOUT: every refresh must match it. */
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg),
                                  .bytes = s->lora.bytes + 512u * 2 * s->lora.n,
                                  .flags = WSYNC_STAGING_FIXED_LAYOUT,
                                  .timeout_ms = (uint32_t)s->o->timeout_ms};
    rc = s->pops->create(&cfg, &t->staging, &err);
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "staging create", rc, &err);
    s->fd = wsync_wire_connect(s->o->socket_path, s->o->timeout_ms, &err);
    if (s->fd < 0)
        return wsync_cli_report("trainer", "connect to the engine", err.code, &err);
    printf("trainer: plugin %s %s, adapter rank %u on %zu modules (all-linear), adapter bytes "
           "%llu (%.2f MiB); base model %.1f MiB stays in the engine\n",
           s->l.plugin->name, s->l.plugin->version, s->lora.rank, s->lora.n,
           (unsigned long long)s->lora.bytes, (double)s->lora.bytes / (1 << 20),
           (double)s->model.payload_bytes / (1 << 20));
    fflush(stdout);
    return 0;
}

/* "Training": write version k of the adapter into the trainer's tensors. */
static int wsync_lora_trainer_fill(wsync_lora_trainer_t *t, uint64_t version)
{
    wsync_lora_side_t *s = &t->s;
    for (size_t i = 0; i < 2 * s->lora.n; i++) {
        wsync_error_t err = {.struct_size = sizeof(err)};
        const wsync_stage_tensor_t *x = &t->stage[i];
        size_t bytes = 2u * (size_t)(x->shape[0] * x->shape[1]);
        wsync_lora_fill(&s->lora, i / 2, (int)(i % 2), version, s->scratch[0]);
        t->expected[i] = wsync64(s->scratch[0], bytes);
        wsync_result_t rc = s->cops->mem_copy(s->c, (void *)x->src, s->scratch[0], bytes, 0, &err);
        if (rc != WSYNC_OK)
            return wsync_cli_report("trainer", "mem_copy into the adapter", rc, &err);
    }
    return 0;
}

static int wsync_lora_trainer_sync(wsync_lora_trainer_t *t, unsigned k)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_lora_side_t *s = &t->s;
    const wsync_manifest_t *m = NULL;
    const char *json = NULL;
    uint64_t moved = 0;
    int bad = 0;
    wsync_result_t rc;
    json_t *rep;

    if (wsync_lora_trainer_fill(t, k) != 0)
        return 1;
    double t0 = wsync_cli_now();
    /* Refresh the retained export in place: the previous generation was consumed (below). */
    rc = s->pops->stage(t->staging, NULL, t->stage, 2 * s->lora.n, &err);
    if (rc == WSYNC_OK)
        rc = s->pops->publish(t->staging, NULL, 1, &json, &t->generation, &err);
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "stage/publish the adapter", rc, &err);
    /* The trainer's own check: what it publishes is what it meant to send. */
    rc = s->cops->parse_manifest(s->c, json, strlen(json), &m, &err);
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "parse_manifest of our own manifest", rc, &err);
    /* by name: the plugin packs the engine's fused modules side by side (wsync_pack_order) */
    bad += m->n_tensors != 2 * s->lora.n;
    for (size_t i = 0; i < m->n_tensors; i++) {
        size_t j = 0;
        while (j < 2 * s->lora.n && strcmp(m->tensors[i].name, t->stage[j].name) != 0)
            j++;
        moved += m->tensors[i].nbytes;
        bad += j == 2 * s->lora.n || !m->tensors[i].has_digest ||
               m->tensors[i].digest != t->expected[j];
    }
    s->cops->manifest_free(s->c, m);
    if (bad) {
        fprintf(stderr, "wsync trainer: %d published adapter tensors differ from their content\n",
                bad);
        return 1;
    }
    if (wsync_cli_send_json(s->fd,
                            json_pack("{s:s, s:I, s:s}", "type", "lora", "version", (json_int_t)k,
                                      "config", t->config),
                            "trainer") != 0)
        return 1;
    rc = wsync_wire_send(s->fd, json, strlen(json), &err);
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "send manifest", rc, &err);
    rep = wsync_cli_recv_json(s->fd, "ack", s->o->timeout_ms, "trainer");
    if (rep == NULL)
        return 1;
    json_decref(rep);
    /* After the ack: *consumed* of this generation, before the next refresh reuses the storage. */
    rc = s->pops->wait_consumed(t->staging, NULL, t->generation, &err);
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "wait_consumed", rc, &err);
    double dt = wsync_cli_now() - t0;
    rep = wsync_cli_recv_json(s->fd, "verified", s->o->timeout_ms * 4, "trainer");
    if (rep == NULL)
        return 1;
    long ok = (long)json_integer_value(json_object_get(rep, "ok"));
    long total = (long)json_integer_value(json_object_get(rep, "total"));
    json_decref(rep);
    bad = ok != total || total != (long)(2 * s->lora.n) || moved != s->lora.bytes;
    printf("lora sync %u/%u: %8.2f ms, bytes moved %llu vs model bytes %llu, verified %ld/%zu "
           "adapter tensors%s\n",
           k, s->o->syncs, dt * 1e3, (unsigned long long)moved,
           (unsigned long long)s->model.payload_bytes, ok, 2 * s->lora.n, bad ? " FAILED" : "");
    fflush(stdout);
    return bad;
}

static int wsync_lora_trainer_finish(wsync_lora_trainer_t *t)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_cli_send_json(t->s.fd, json_pack("{s:s}", "type", "end"), "trainer") != 0)
        return 1;
    json_t *closed = wsync_cli_recv_json(t->s.fd, "closed", t->s.o->timeout_ms, "trainer");
    if (closed == NULL)
        return 1;
    json_decref(closed);
    wsync_result_t rc = t->s.pops->retire(t->staging, &err);
    t->staging = NULL;
    if (rc != WSYNC_OK)
        return wsync_cli_report("trainer", "retire", rc, &err);
    printf("trainer: engine closed its mapping; adapter staging retired\n");
    return 0;
}

int wsync_demo_lora_trainer(const wsync_demo_options_t *o)
{
    wsync_lora_trainer_t t;
    wsync_error_t err = {.struct_size = sizeof(err)};

    memset(&t, 0, sizeof(t));
    t.s.fd = t.s.listen_fd = -1;
    int rc = wsync_lora_setup(&t.s, o, "trainer");
    if (rc == 0)
        rc = wsync_lora_trainer_setup(&t);
    for (unsigned k = 1; rc == 0 && k <= o->syncs; k++)
        rc = wsync_lora_trainer_sync(&t, k);
    if (rc == 0)
        rc = wsync_lora_trainer_finish(&t);
    if (t.staging != NULL)
        t.s.pops->retire(t.staging, &err);
    if (t.params != NULL && WSYNC_HAS_OP(wsync_consumer_ops_t, t.s.cops, mem_free))
        t.s.cops->mem_free(t.s.c, t.params, &err);
    free(t.stage);
    free(t.expected);
    free(t.config);
    wsync_lora_teardown(&t.s);
    return rc;
}

/* ------------------------------------------------------------------- engine */

typedef struct wsync_lora_engine {
    wsync_lora_side_t s;
    wsync_adapter_target_t *targets; /* one per adapter module, engine memory, allocated once */
    wsync_adapter_slot_t slot;
    volatile int active;
    wsync_handle_t *h; /* the trainer's staging, mapped once */
} wsync_lora_engine_t;

static int wsync_lora_engine_setup(wsync_lora_engine_t *e)
{
    wsync_lora_side_t *s = &e->s;
    wsync_error_t err = {.struct_size = sizeof(err)};
    uint32_t mr = s->o->lora_max_rank;

    e->targets = calloc(s->lora.n, sizeof(*e->targets));
    if (e->targets == NULL)
        return wsync_cli_report("engine", "allocate", WSYNC_ERR_OUT_OF_MEMORY, NULL);
    for (size_t m = 0; m < s->lora.n; m++) {
        const wsync_lora_module_t *mod = &s->lora.modules[m];
        wsync_adapter_target_t *x = &e->targets[m];
        x->struct_size = sizeof(*x);
        x->module = mod->module;
        x->dtype = WSYNC_DTYPE_BF16;
        x->in_features = mod->in;
        x->out_features = mod->out;
        for (int k = 0; k < 2; k++) {
            wsync_result_t rc =
                s->cops->mem_alloc(s->c, 2u * mr * (size_t)mod->in, &x->lora_a[k], &err);
            if (rc == WSYNC_OK)
                rc = s->cops->mem_alloc(s->c, 2u * mr * (size_t)mod->out, &x->lora_b[k], &err);
            if (rc != WSYNC_OK)
                return wsync_cli_report("engine", "mem_alloc of the adapter slot", rc, &err);
        }
    }
    e->slot = (wsync_adapter_slot_t){.struct_size = sizeof(e->slot),
                                     .adapter_name = "demo-policy",
                                     .max_rank = mr,
                                     .n_targets = s->lora.n,
                                     .targets = e->targets,
                                     .active = &e->active};
    s->fd = wsync_wire_accept(s->listen_fd, s->o->timeout_ms, &err);
    return s->fd < 0 ? wsync_cli_report("engine", "accept the trainer", err.code, &err) : 0;
}

/* Read the active copy back and compare with what version k must give: tensors that match. */
static long wsync_lora_engine_verify(wsync_lora_engine_t *e, uint64_t version)
{
    wsync_lora_side_t *s = &e->s;
    uint32_t mr = s->o->lora_max_rank;
    int a = e->active;
    long ok = 0;

    for (size_t m = 0; m < s->lora.n; m++) {
        const wsync_lora_module_t *mod = &s->lora.modules[m];
        for (int b = 0; b < 2; b++) {
            wsync_error_t err = {.struct_size = sizeof(err)};
            size_t bytes = 2u * mr * (size_t)(b ? mod->out : mod->in);
            void *src = b ? e->targets[m].lora_b[a] : e->targets[m].lora_a[a];
            if (s->cops->mem_copy(s->c, s->scratch[0], src, bytes, 1, &err) != WSYNC_OK)
                continue;
            wsync_lora_expected(&s->lora, m, b, version, mr, s->scratch[1]);
            ok += memcmp(s->scratch[0], s->scratch[1], bytes) == 0 &&
                  e->targets[m].rank[a] == s->lora.rank;
        }
    }
    return ok;
}

static int wsync_lora_engine_sync(wsync_lora_engine_t *e, json_t *msg)
{
    wsync_lora_side_t *s = &e->s;
    wsync_error_t err = {.struct_size = sizeof(err)};
    uint64_t version = (uint64_t)json_integer_value(json_object_get(msg, "version"));
    const char *config = json_string_value(json_object_get(msg, "config"));
    const wsync_manifest_t *m = NULL;
    char *text = NULL;
    size_t len = 0;
    wsync_result_t rc = wsync_wire_recv(s->fd, &text, &len, s->o->timeout_ms, &err);

    if (rc == WSYNC_OK)
        rc = s->cops->parse_manifest(s->c, text, len, &m, &err);
    free(text);
    if (rc == WSYNC_OK && e->h == NULL)
        rc = s->cops->open_handle(s->c, &m->buffer, &e->h, &err);
    if (rc == WSYNC_OK) {
        wsync_adapter_source_t src = {.struct_size = sizeof(src),
                                      .kind = WSYNC_ADAPTER_FROM_MANIFEST,
                                      .handle = e->h,
                                      .manifest = m,
                                      .adapter_config_json = config};
        /* Signals *consumed* once the shadow copy is written and switched. */
        rc = s->cops->hot_load_adapter(s->c, &src, &e->slot, NULL, &err);
    }
    uint64_t gen = m != NULL ? m->generation : 0;
    if (m != NULL)
        s->cops->manifest_free(s->c, m);
    if (rc != WSYNC_OK) {
        wsync_cli_send_json(
            s->fd, json_pack("{s:s, s:b, s:s}", "type", "ack", "ok", 0, "error", err.message),
            "engine");
        return wsync_cli_report("engine", "hot_load_adapter", rc, &err);
    }
    if (wsync_cli_send_json(
            s->fd,
            json_pack("{s:s, s:I, s:b}", "type", "ack", "generation", (json_int_t)gen, "ok", 1),
            "engine") != 0)
        return 1;
    long ok = wsync_lora_engine_verify(e, version);
    return wsync_cli_send_json(s->fd,
                               json_pack("{s:s, s:I, s:I, s:I}", "type", "verified", "version",
                                         (json_int_t)version, "ok", (json_int_t)ok, "total",
                                         (json_int_t)(2 * s->lora.n)),
                               "engine");
}

static int wsync_lora_engine_loop(wsync_lora_engine_t *e)
{
    wsync_lora_side_t *s = &e->s;
    for (;;) {
        wsync_error_t err = {.struct_size = sizeof(err)};
        char *text = NULL;
        size_t len = 0;
        wsync_result_t wrc = wsync_wire_recv(s->fd, &text, &len, s->o->timeout_ms * 4, &err);
        if (wrc != WSYNC_OK)
            return wsync_cli_report("engine", "waiting for the trainer", wrc, &err);
        json_t *msg = json_loadb(text, len, 0, NULL);
        free(text);
        const char *type = json_string_value(json_object_get(msg, "type"));
        int rc;
        if (type != NULL && strcmp(type, "lora") == 0)
            rc = wsync_lora_engine_sync(e, msg);
        else if (type != NULL && strcmp(type, "end") == 0) {
            /* The engine's half of the retire handshake: close, then ack. */
            rc = e->h != NULL ? (s->cops->close_handle(s->c, e->h, &err) != WSYNC_OK) : 0;
            e->h = NULL;
            if (rc == 0)
                rc = wsync_cli_send_json(s->fd, json_pack("{s:s}", "type", "closed"), "engine");
            json_decref(msg);
            return rc;
        } else {
            fprintf(stderr, "wsync engine: unexpected message type '%s'\n", type ? type : "?");
            rc = 1;
        }
        json_decref(msg);
        if (rc != 0)
            return rc;
    }
}

int wsync_demo_lora_engine(const wsync_demo_options_t *o)
{
    wsync_lora_engine_t e;
    wsync_error_t err = {.struct_size = sizeof(err)};

    memset(&e, 0, sizeof(e));
    e.s.fd = -1;
    /* Listen first so the trainer's connect finds us while we load. */
    e.s.listen_fd = wsync_wire_listen(o->socket_path, &err);
    if (e.s.listen_fd < 0)
        return wsync_cli_report("engine", "listen", err.code, &err);
    int rc = wsync_lora_setup(&e.s, o, "engine");
    if (rc == 0)
        rc = wsync_lora_engine_setup(&e);
    if (rc == 0)
        rc = wsync_lora_engine_loop(&e);
    if (e.h != NULL)
        e.s.cops->close_handle(e.s.c, e.h, &err);
    for (size_t m = 0; e.targets != NULL && m < e.s.lora.n; m++)
        for (int k = 0; k < 2; k++) {
            if (e.targets[m].lora_a[k] != NULL)
                e.s.cops->mem_free(e.s.c, e.targets[m].lora_a[k], &err);
            if (e.targets[m].lora_b[k] != NULL)
                e.s.cops->mem_free(e.s.c, e.targets[m].lora_b[k], &err);
        }
    free(e.targets);
    wsync_lora_teardown(&e.s);
    return rc;
}
