/* hot_load_adapter / unload_adapter semantics, backend-neutral. */
#include "wsync_adapter_load.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_log.h"

static wsync_result_t wsync_exec_host(const wsync_adapter_plan_t *plan, void *user,
                                      wsync_error_t *err)
{
    (void)user;
    return wsync_adapter_plan_exec_host(plan, err);
}

/* Adapter tensors of a manifest, pointing into the mapped buffer. */
static wsync_result_t wsync_adapter_from_manifest(const wsync_adapter_source_t *src,
                                                  const void *base, wsync_adapter_t **out,
                                                  wsync_error_t *err)
{
    const wsync_manifest_t *m = src->manifest;
    if (m == NULL || src->adapter_config_json == NULL || base == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "FROM_MANIFEST needs manifest, adapter_config_json and a mapped buffer");
    if (m->n_tensors > 0 && m->tensors == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "manifest has %zu tensors but none "
                          "listed",
                          m->n_tensors);
    wsync_adapter_tensor_t *t = calloc(m->n_tensors + 1, sizeof(*t));
    if (t == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu manifest tensors", m->n_tensors);
    wsync_result_t rc = WSYNC_OK;
    for (size_t i = 0; i < m->n_tensors && rc == WSYNC_OK; i++) {
        const wsync_tensor_desc_t *d = &m->tensors[i];
        if (d->offset > m->buffer.bytes || d->nbytes > m->buffer.bytes - d->offset ||
            d->ndim > WSYNC_MAX_DIMS)
            rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                            "manifest tensor \"%s\": offset %llu + nbytes %llu outside buffer "
                            "bytes %llu",
                            d->name ? d->name : "", (unsigned long long)d->offset,
                            (unsigned long long)d->nbytes, (unsigned long long)m->buffer.bytes);
        t[i].name = d->name;
        t[i].dtype = d->dtype;
        t[i].ndim = d->ndim <= WSYNC_MAX_DIMS ? d->ndim : 0;
        memcpy(t[i].shape, d->shape, sizeof(t[i].shape));
        t[i].data = (const uint8_t *)base + d->offset;
        t[i].nbytes = d->nbytes;
    }
    if (rc == WSYNC_OK)
        rc = wsync_adapter_from_tensors(src->adapter_config_json, strlen(src->adapter_config_json),
                                        t, m->n_tensors, WSYNC_ADAPTER_MEM_BUFFER, out, err);
    /* The adapter copied the tensor views; it keeps pointers to names and bytes only. */
    free(t);
    return rc;
}

static wsync_result_t wsync_adapter_source(const wsync_adapter_source_t *src, const void *base,
                                           wsync_adapter_t **out, wsync_error_t *err)
{
    if (src == NULL || !WSYNC_HAS_FIELD(wsync_adapter_source_t, src, kind))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "adapter source is NULL or too small");
    switch (src->kind) {
    case WSYNC_ADAPTER_FROM_DIR:
        if (!WSYNC_HAS_FIELD(wsync_adapter_source_t, src, path) || src->path == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "FROM_DIR source has no path");
        return wsync_adapter_from_dir(src->path, out, err);
    case WSYNC_ADAPTER_FROM_MANIFEST:
        if (!WSYNC_HAS_FIELD(wsync_adapter_source_t, src, adapter_config_json))
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "FROM_MANIFEST source struct_size %zu is too small",
                              src->struct_size);
        return wsync_adapter_from_manifest(src, base, out, err);
    }
    return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "unknown adapter source kind %d",
                      (int)src->kind);
}

wsync_result_t wsync_adapter_hot_load(const wsync_adapter_source_t *src, wsync_adapter_slot_t *slot,
                                      const void *buffer_base, wsync_adapter_exec_fn_t exec,
                                      void *exec_user, wsync_error_t *err)
{
    wsync_adapter_t *a = NULL;
    wsync_adapter_plan_t *plan = NULL;
    wsync_result_t rc = wsync_adapter_source(src, buffer_base, &a, err);
    if (rc == WSYNC_OK)
        rc = wsync_adapter_plan_build(a, slot, &plan, err);
    if (rc == WSYNC_OK)
        rc = (exec ? exec : wsync_exec_host)(plan, exec_user, err);
    if (rc == WSYNC_OK)
        rc = wsync_adapter_commit(slot, plan, err);
    if (rc == WSYNC_OK)
        WSYNC_LOG_INFO("adapter \"%s\": %zu modules loaded into copy %d",
                       slot->adapter_name ? slot->adapter_name : "", a->n_modules, plan->shadow);
    wsync_adapter_plan_free(plan);
    wsync_adapter_free(a);
    return rc;
}

wsync_result_t wsync_adapter_unload(wsync_adapter_slot_t *slot, wsync_adapter_exec_fn_t exec,
                                    void *exec_user, wsync_adapter_drain_fn_t drain,
                                    void *drain_user, wsync_error_t *err)
{
    wsync_adapter_plan_t *plan = NULL;
    wsync_result_t rc = wsync_adapter_plan_build_empty(slot, &plan, err);
    if (rc == WSYNC_OK)
        rc = (exec ? exec : wsync_exec_host)(plan, exec_user, err);
    if (rc == WSYNC_OK)
        rc = wsync_adapter_commit(slot, plan, err);
    if (rc == WSYNC_OK && drain != NULL)
        rc = drain(drain_user, err);
    if (rc == WSYNC_OK) {
        int old = 1 - plan->shadow;
        for (size_t i = 0; i < slot->n_targets; i++) {
            slot->targets[i].rank[old] = 0;
            slot->targets[i].scaling[old] = 0.0f;
        }
    }
    wsync_adapter_plan_free(plan);
    return rc;
}
