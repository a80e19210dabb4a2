/* Adapter-only trainer; see wsync_ref_lora_trainer.h. */
#include "wsync_ref_lora_trainer.h"
#include "wsync_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int wsync_ref_lora_fail(char *why, size_t len, const char *what, const wsync_error_t *e)
{
    snprintf(why, len, "%s: %s", what, e->message);
    return -1;
}

/* SGLang: the retained export of the adapter tensors, named as PEFT saves them. */
static int wsync_ref_lora_trainer_staging(wsync_ref_lora_trainer_t *t, char *why, size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_consumer_ops_t *C = t->loader.plugin->consumer;
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = t->cfg.timeout_ms};
    wsync_staging_config_t sc = {.struct_size = sizeof(sc),
                                 .bytes = t->lora.bytes + 512u * 2 * t->lora.n,
                                 .flags = WSYNC_STAGING_FIXED_LAYOUT,
                                 .timeout_ms = t->cfg.timeout_ms};
    uint64_t off = 0;

    t->stage = calloc(2 * t->lora.n, sizeof(*t->stage));
    if (t->stage == NULL)
        return snprintf(why, len, "out of memory"), -1;
    if (C->create(&cc, &t->mem, &err) != WSYNC_OK)
        return wsync_ref_lora_fail(why, len, "consumer create (memory helpers)", &err);
    if (C->mem_alloc(t->mem, t->lora.bytes, &t->src, &err) != WSYNC_OK)
        return wsync_ref_lora_fail(why, len, "mem_alloc of the adapter", &err);
    if (t->loader.plugin->producer->create(&sc, &t->staging, &err) != WSYNC_OK)
        return wsync_ref_lora_fail(why, len, "staging create", &err);
    for (size_t i = 0; i < 2 * t->lora.n; i++) {
        const wsync_lora_module_t *m = &t->lora.modules[i / 2];
        int b = (int)(i % 2);
        t->stage[i] =
            (wsync_stage_tensor_t){.struct_size = sizeof(t->stage[i]),
                                   .name = b ? m->name_b : m->name_a,
                                   .dtype = WSYNC_DTYPE_BF16,
                                   .ndim = 2,
                                   .shape = {b ? m->out : t->lora.rank, b ? t->lora.rank : m->in},
                                   .src = (char *)t->src + off};
        off += 2u * (uint64_t)(t->stage[i].shape[0] * t->stage[i].shape[1]);
    }
    return 0;
}

int wsync_ref_lora_trainer_open(wsync_ref_lora_trainer_t *t,
                                const wsync_ref_lora_trainer_config_t *cfg, char *why, size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    memset(t, 0, sizeof(*t));
    t->cfg = *cfg;
    t->shim = wsync_shim_find(cfg->engine);
    if (t->shim == NULL || t->shim->encode_lora == NULL)
        return snprintf(why, len, "no LoRA request format for engine \"%s\"", cfg->engine), -1;
    if (wsync_model_build(&t->model, &cfg->model, why, len) != 0 ||
        wsync_lora_build(&t->lora, &t->model, cfg->rank, why, len) != 0)
        return -1;
    t->config = wsync_lora_config_json(&t->lora);
    t->host = (wsync_host_t){.struct_size = sizeof(wsync_host_t)};
    if (wsync_loader_open(&t->loader, cfg->plugin, &t->host, &err) != WSYNC_OK)
        return wsync_ref_lora_fail(why, len, "load the trainer's plugin", &err);
    if (strcmp(cfg->engine, "sglang") == 0)
        return wsync_ref_lora_trainer_staging(t, why, len);
    snprintf(t->dir, sizeof(t->dir), "/tmp/wsync-lora-XXXXXX");
    if (mkdtemp(t->dir) == NULL) {
        t->dir[0] = '\0';
        return snprintf(why, len, "mkdtemp failed"), -1;
    }
    return 0;
}

/* Refresh the retained export with version k and publish; *manifest is the plugin's. */
static int wsync_ref_lora_trainer_refresh(wsync_ref_lora_trainer_t *t, uint64_t k,
                                          const char **manifest, uint64_t *gen)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_consumer_ops_t *C = t->loader.plugin->consumer;
    const wsync_producer_ops_t *P = t->loader.plugin->producer;
    size_t max = 1;
    for (size_t i = 0; i < 2 * t->lora.n; i++)
        if ((size_t)(t->stage[i].shape[0] * t->stage[i].shape[1]) > max)
            max = (size_t)(t->stage[i].shape[0] * t->stage[i].shape[1]);
    uint16_t *tmp = malloc(2u * max);
    wsync_result_t rc = tmp != NULL ? WSYNC_OK : WSYNC_ERR_OUT_OF_MEMORY;

    for (size_t i = 0; rc == WSYNC_OK && i < 2 * t->lora.n; i++) {
        size_t bytes = 2u * (size_t)(t->stage[i].shape[0] * t->stage[i].shape[1]);
        wsync_lora_fill(&t->lora, i / 2, (int)(i % 2), k, tmp);
        rc = C->mem_copy(t->mem, (void *)t->stage[i].src, tmp, bytes, 0, &err);
    }
    free(tmp);
    if (rc == WSYNC_OK)
        rc = P->stage(t->staging, NULL, t->stage, 2 * t->lora.n, &err);
    if (rc == WSYNC_OK)
        rc = P->publish(t->staging, NULL, 1, manifest, gen, &err);
    if (rc != WSYNC_OK)
        fprintf(stderr, "wsync lora trainer: refresh: %s: %s\n", wsync_strerror(rc), err.message);
    return rc == WSYNC_OK ? 0 : -1;
}

int wsync_ref_lora_trainer_sync(wsync_ref_lora_trainer_t *t, const char *name, uint64_t k,
                                const wsync_ref_transport_t *tr, uint64_t *moved)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_shim_lora_t in = {.name = name, .int_id = 1, .n_ranks = 1, .config = t->config};
    const char *manifest = NULL;
    uint64_t gen = 0;
    char why[WSYNC_ERROR_MESSAGE_LEN];
    json_t *msg = NULL;

    if (t->staging != NULL) {
        if (wsync_ref_lora_trainer_refresh(t, k, &manifest, &gen) != 0)
            return -1;
        in.manifests = &manifest;
    } else {
        if (wsync_lora_write_dir(&t->lora, k, t->dir, WSYNC_DTYPE_BF16, NULL, why, sizeof(why)) !=
            0) {
            fprintf(stderr, "wsync lora trainer: %s\n", why);
            return -1;
        }
        in.path = t->dir;
    }
    if (t->shim->encode_lora(&in, &msg, &err) != WSYNC_OK) {
        fprintf(stderr, "wsync lora trainer: encode: %s\n", err.message);
        return -1;
    }
    char *text = json_dumps(msg, JSON_COMPACT), *reply = NULL;
    json_decref(msg);
    int rc =
        text != NULL && tr->send(tr->user, 0, text) == 0 && (reply = tr->recv(tr->user, 0)) != NULL
            ? 0
            : -1;
    free(text);
    json_t *r = reply != NULL ? json_loads(reply, 0, NULL) : NULL;
    free(reply);
    if (rc == 0 && !json_is_true(json_object_get(r, "ok"))) {
        fprintf(stderr, "wsync lora trainer: the engine refused the adapter: %s\n",
                json_string_value(json_object_get(r, "message")));
        rc = -1;
    }
    json_decref(r);
    /* After the ack: *consumed* before the next refresh reuses the export. */
    if (rc == 0 && t->staging != NULL &&
        t->loader.plugin->producer->wait_consumed(t->staging, NULL, gen, &err) != WSYNC_OK) {
        fprintf(stderr, "wsync lora trainer: wait_consumed: %s\n", err.message);
        rc = -1;
    }
    *moved = t->lora.bytes; /* the bf16 tensors, from the export or the file */
    return rc;
}

void wsync_ref_lora_trainer_close(wsync_ref_lora_trainer_t *t)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    char path[128];

    if (t->staging != NULL && t->loader.plugin->producer->retire(t->staging, &err) != WSYNC_OK)
        fprintf(stderr, "wsync lora trainer: retire: %s\n", err.message);
    if (t->src != NULL)
        t->loader.plugin->consumer->mem_free(t->mem, t->src, NULL);
    if (t->mem != NULL)
        t->loader.plugin->consumer->finalize(t->mem, NULL);
    if (t->dir[0] != '\0') {
        snprintf(path, sizeof(path), "%s/adapter_model.safetensors", t->dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/adapter_config.json", t->dir);
        unlink(path);
        rmdir(t->dir);
    }
    wsync_loader_close(&t->loader);
    free(t->stage);
    free(t->config);
    wsync_lora_free(&t->lora);
    wsync_model_free(&t->model);
    memset(t, 0, sizeof(*t));
}
