/* Reference trainer; see wsync_ref_trainer.h. */
#include "wsync_ref_trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

/* Buckets planned by the shims' planner (wsync_map_plan_buckets: the engine's order, greedy,
 * with the staging's alignment). */
static int wsync_ref_trainer_plan(wsync_ref_trainer_t *t, char *why, size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const char **names = calloc(t->model.n + 1, sizeof(*names));
    uint64_t *nbytes = calloc(t->model.n + 1, sizeof(*nbytes));

    t->order = calloc(t->model.n + 1, sizeof(*t->order));
    t->bucket_first = calloc(t->model.n + 1, sizeof(*t->bucket_first));
    if (t->bucket_first == NULL || t->order == NULL || names == NULL || nbytes == NULL) {
        free(names);
        free(nbytes);
        return snprintf(why, len, "out of memory"), -1;
    }
    for (size_t i = 0; i < t->model.n; i++) {
        names[i] = t->model.tensors[i].name;
        nbytes[i] = t->model.tensors[i].nbytes;
    }
    wsync_result_t rc =
        wsync_map_plan_buckets(t->shim->map, names, nbytes, t->model.n, t->cfg.bucket_bytes, 0,
                               t->order, t->bucket_first, &t->nbuckets, &err);
    free(names);
    free(nbytes);
    if (rc != WSYNC_OK)
        return snprintf(why, len, "%s", err.message), -1;
    return 0;
}

int wsync_ref_trainer_open(wsync_ref_trainer_t *t, const wsync_ref_trainer_config_t *cfg, char *why,
                           size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = cfg->timeout_ms};
    wsync_staging_config_t sc = {
        .struct_size = sizeof(sc), .bytes = cfg->bucket_bytes, .timeout_ms = cfg->timeout_ms};

    memset(t, 0, sizeof(*t));
    t->cfg = *cfg;
    t->shim = wsync_shim_find(cfg->engine);
    if (t->shim == NULL)
        return snprintf(why, len, "unknown engine \"%s\"", cfg->engine ? cfg->engine : "?"), -1;
    if (cfg->ranks == 0 || cfg->ranks > WSYNC_REF_MAX_RANKS)
        return snprintf(why, len, "%u ranks (1..%d)", cfg->ranks, WSYNC_REF_MAX_RANKS), -1;
    if (wsync_loader_open(&t->loader, cfg->plugin, NULL, &err) != WSYNC_OK)
        return snprintf(why, len, "trainer plugin: %s", err.message), -1;
    t->cops = t->loader.plugin->consumer;
    t->pops = t->loader.plugin->producer;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, mem_alloc) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, mem_copy)) {
        snprintf(why, len, "plugin %s lacks mem_alloc/mem_copy", t->loader.path);
        goto fail;
    }
    if (wsync_model_build(&t->model, &cfg->model, why, len) != 0 ||
        wsync_ref_trainer_plan(t, why, len) != 0)
        goto fail;
    if (t->cops->create(&cc, &t->mem, &err) != WSYNC_OK ||
        t->cops->mem_alloc(t->mem, t->model.packed_bytes, &t->params, &err) != WSYNC_OK) {
        snprintf(why, len, "trainer memory: %s", err.message);
        goto fail;
    }
    t->stage = calloc(t->model.n, sizeof(*t->stage));
    if (t->stage == NULL) {
        snprintf(why, len, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < t->model.n; i++) {
        const wsync_model_tensor_t *m = &t->model.tensors[t->order[i]];
        t->stage[i] = (wsync_stage_tensor_t){.struct_size = sizeof(wsync_stage_tensor_t),
                                             .name = m->name,
                                             .dtype = m->dtype,
                                             .ndim = m->ndim,
                                             .src = (const char *)t->params + m->offset};
        memcpy(t->stage[i].shape, m->shape, sizeof(m->shape));
    }
    for (uint32_t r = 0; r < cfg->ranks; r++)
        if (t->pops->create(&sc, &t->staging[r], &err) != WSYNC_OK) {
            snprintf(why, len, "staging create for rank %u: %s", r, err.message);
            goto fail;
        }
    return 0;
fail:
    wsync_ref_trainer_close(t);
    return -1;
}

void wsync_ref_trainer_close(wsync_ref_trainer_t *t)
{
    for (uint32_t r = 0; r < WSYNC_REF_MAX_RANKS; r++)
        if (t->staging[r] != NULL) {
            wsync_error_t err = {.struct_size = sizeof(err)};
            if (t->pops->retire(t->staging[r], &err) != WSYNC_OK)
                fprintf(stderr, "wsync trainer: retire of rank %u's staging: %s\n", r, err.message);
        }
    if (t->params != NULL && WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, mem_free))
        t->cops->mem_free(t->mem, t->params, NULL);
    if (t->mem != NULL)
        t->cops->finalize(t->mem, NULL);
    free(t->stage);
    free(t->order);
    free(t->bucket_first);
    wsync_model_free(&t->model);
    wsync_loader_close(&t->loader);
    memset(t, 0, sizeof(*t));
}

void wsync_ref_trainer_new_peer(wsync_ref_trainer_t *t)
{
    memset(t->sent_buffer, 0, sizeof(t->sent_buffer));
}

wsync_result_t wsync_ref_trainer_fill(wsync_ref_trainer_t *t, uint64_t version, wsync_error_t *err)
{
    unsigned char *scratch = malloc(t->model.max_nbytes ? t->model.max_nbytes : 1);
    wsync_result_t rc = WSYNC_OK;

    if (scratch == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "fill: out of memory");
    for (size_t i = 0; i < t->model.n && rc == WSYNC_OK; i++) {
        const wsync_model_tensor_t *m = &t->model.tensors[i];
        wsync_model_fill(m, version, scratch);
        rc = t->cops->mem_copy(t->mem, (char *)t->params + m->offset, scratch, m->nbytes, 0, err);
    }
    free(scratch);
    t->version = version;
    return rc;
}

wsync_result_t wsync_ref_trainer_publish(wsync_ref_trainer_t *t, size_t b, json_t **msgs,
                                         wsync_error_t *err)
{
    size_t first = t->bucket_first[b], n = t->bucket_first[b + 1] - first;
    char *manifests[WSYNC_REF_MAX_RANKS] = {0};
    char version[32];
    int with_buffer = 1;
    wsync_result_t rc = WSYNC_OK;

    *msgs = NULL;
    for (uint32_t r = 0; r < t->cfg.ranks && rc == WSYNC_OK; r++) {
        const char *json = NULL;
        rc = t->pops->stage(t->staging[r], NULL, &t->stage[first], n, err);
        if (rc == WSYNC_OK)
            rc = t->pops->publish(t->staging[r], NULL, b + 1 == t->nbuckets, &json,
                                  &t->generation[r], err);
        if (rc == WSYNC_OK && t->mutate != NULL) {
            json_t *m = json_loads(json, 0, NULL);
            if (m != NULL)
                t->mutate(t->mutate_user, m);
            manifests[r] = m != NULL ? json_dumps(m, JSON_COMPACT) : NULL;
            json_decref(m);
        } else if (rc == WSYNC_OK) {
            manifests[r] = strdup(json);
        }
        if (rc == WSYNC_OK && manifests[r] == NULL)
            rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "publish: out of memory");
        with_buffer = with_buffer && !t->sent_buffer[r];
    }
    if (rc == WSYNC_OK) {
        snprintf(version, sizeof(version), "%llu", (unsigned long long)t->version);
        wsync_shim_encode_t in = {.manifests = (const char *const *)manifests,
                                  .n_ranks = t->cfg.ranks,
                                  .first = b == 0,
                                  .finished = b + 1 == t->nbuckets,
                                  .weight_version = version,
                                  .packed = t->cfg.packed,
                                  .with_buffer = with_buffer};
        rc = t->shim->encode(&in, msgs, err);
    }
    for (uint32_t r = 0; r < t->cfg.ranks; r++) {
        free(manifests[r]);
        if (rc == WSYNC_OK)
            t->sent_buffer[r] = 1;
    }
    return rc;
}

wsync_result_t wsync_ref_trainer_wait(wsync_ref_trainer_t *t, wsync_error_t *err)
{
    for (uint32_t r = 0; r < t->cfg.ranks; r++) {
        wsync_result_t rc = t->pops->wait_consumed(t->staging[r], NULL, t->generation[r], err);
        if (rc != WSYNC_OK)
            return rc;
    }
    return WSYNC_OK;
}

json_t *wsync_ref_trainer_exchange(wsync_ref_trainer_t *t, const wsync_ref_transport_t *tr,
                                   json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    json_t *replies = json_array();

    for (uint32_t r = 0; text != NULL && r < t->cfg.ranks; r++)
        if (tr->send(tr->user, r, text) != 0) {
            free(text);
            json_decref(replies);
            return NULL;
        }
    free(text);
    for (uint32_t r = 0; r < t->cfg.ranks; r++) {
        char *reply = tr->recv(tr->user, r);
        json_t *j = reply != NULL ? json_loads(reply, 0, NULL) : NULL;
        free(reply);
        if (j == NULL) {
            json_decref(replies);
            return NULL;
        }
        json_array_append_new(replies, j);
    }
    return replies;
}

int wsync_ref_trainer_sync(wsync_ref_trainer_t *t, uint64_t version,
                           const wsync_ref_transport_t *tr)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (wsync_ref_trainer_fill(t, version, &err) != WSYNC_OK) {
        fprintf(stderr, "wsync trainer: fill: %s\n", err.message);
        return 1;
    }
    for (size_t b = 0; b < t->nbuckets; b++) {
        json_t *msgs = NULL, *msg;
        size_t i;
        if (wsync_ref_trainer_publish(t, b, &msgs, &err) != WSYNC_OK) {
            fprintf(stderr, "wsync trainer: bucket %zu: %s\n", b, err.message);
            return 1;
        }
        json_array_foreach(msgs, i, msg)
        {
            json_t *replies = wsync_ref_trainer_exchange(t, tr, msg), *rep;
            size_t r;
            int bad = replies == NULL;
            json_array_foreach(replies, r, rep) if (!json_is_true(json_object_get(rep, "ok")))
            {
                fprintf(stderr, "wsync trainer: rank %zu refused %s: %s\n", r,
                        json_string_value(json_object_get(msg, "method")),
                        json_string_value(json_object_get(rep, "message")));
                bad = 1;
            }
            if (replies == NULL)
                fprintf(stderr, "wsync trainer: transport failed on bucket %zu\n", b);
            json_decref(replies);
            if (bad) {
                json_decref(msgs);
                return 1;
            }
        }
        json_decref(msgs);
        if (wsync_ref_trainer_wait(t, &err) != WSYNC_OK) {
            fprintf(stderr, "wsync trainer: wait_consumed: %s\n", err.message);
            return 1;
        }
    }
    return 0;
}
