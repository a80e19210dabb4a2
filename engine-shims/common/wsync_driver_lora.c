/* LoRA adapters through the driver (wsync_driver.h). */
#include "wsync_driver_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_client.h"
#include "wsync_error.h"
#include "wsync_manifest.h"

static wsync_result_t wsync_driver_lora_ready(wsync_driver_t *d, wsync_error_t *err)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (!WSYNC_HAS_FIELD(wsync_engine_ops_t, e, lora_slot) || e->lora_slot == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "this engine has no LoRA slots (enable LoRA in the engine)");
    if (d->ops == NULL || !WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, hot_load_adapter))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "LoRA hot-load needs a wsync plugin with hot_load_adapter (%s); "
                            "use the engine's own adapter loader",
                            d->ops == NULL ? d->native_why : d->loader.path);
    return WSYNC_OK;
}

/* FROM_MANIFEST: parse, check the generation against what this engine took from the buffer,
 * open (or reuse) its mapping, hot-load, remember the generation. */
static wsync_result_t wsync_driver_load_from_manifest(wsync_driver_t *d,
                                                      wsync_adapter_source_t *src,
                                                      wsync_adapter_slot_t *slot, const char *json,
                                                      size_t len, wsync_error_t *err)
{
    const wsync_manifest_t *m = NULL;
    wsync_driver_buffer_t *b = NULL;
    char bname[64];
    wsync_result_t rc = wsync_driver_parse(d, json, len, &m, err);

    if (rc == WSYNC_OK) {
        b = wsync_driver_find(d, &m->buffer);
        if (b != NULL && m->generation <= b->last_generation) {
            wsync_driver_buffer_name(&m->buffer, bname, sizeof(bname));
            rc = WSYNC_RECORD(err, WSYNC_ERR_STALE_GENERATION,
                              "stale adapter generation %" PRIu64 " for buffer %s: this "
                              "engine already took generation %" PRIu64 " from it",
                              m->generation, bname, b->last_generation);
        } else if ((b = wsync_driver_remember(d, &m->buffer)) == NULL) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: out of memory");
        }
    }
    if (rc == WSYNC_OK && b->handle == NULL)
        rc = d->ops->open_handle(d->consumer, &m->buffer, &b->handle, err);
    if (rc == WSYNC_OK) {
        src->kind = WSYNC_ADAPTER_FROM_MANIFEST;
        src->handle = b->handle;
        src->manifest = m;
        rc = d->ops->hot_load_adapter(d->consumer, src, slot, wsync_driver_stream(d), err);
    }
    if (rc == WSYNC_OK)
        b->last_generation = m->generation;
    wsync_driver_free_manifest(d, m);
    return rc;
}

wsync_result_t wsync_driver_load_adapter(wsync_driver_t *d, const char *name, const char *path,
                                         const char *manifest, size_t manifest_len,
                                         const char *config, int *reloaded, wsync_error_t *err)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    wsync_adapter_source_t src = {.struct_size = sizeof(src), .adapter_config_json = config};
    wsync_adapter_slot_t *slot;
    wsync_result_t rc = wsync_driver_lora_ready(d, err);

    if (rc != WSYNC_OK)
        return rc;
    if (name == NULL || name[0] == '\0' || (path == NULL) == (manifest == NULL) ||
        (manifest != NULL && config == NULL))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "an adapter load needs a name and either a path or a manifest "
                            "with its adapter_config.json");
    slot = e->lora_slot(e->user, name, 0);
    if (reloaded != NULL)
        *reloaded = slot != NULL;
    if (slot == NULL && (slot = e->lora_slot(e->user, name, 1)) == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_BUSY,
                            "no free LoRA slot for adapter \"%s\"; unload one first", name);
    /* The engine's earlier work (requests reading the shadow copy) first. */
    rc = wsync_driver_drain(d, err);
    if (rc == WSYNC_OK && path != NULL) {
        src.kind = WSYNC_ADAPTER_FROM_DIR;
        src.path = path;
        rc = d->ops->hot_load_adapter(d->consumer, &src, slot, wsync_driver_stream(d), err);
    } else if (rc == WSYNC_OK) {
        rc = wsync_driver_load_from_manifest(d, &src, slot, manifest, manifest_len, err);
    }
    if (rc == WSYNC_OK && WSYNC_HAS_FIELD(wsync_engine_ops_t, e, lora_loaded) &&
        e->lora_loaded != NULL)
        e->lora_loaded(e->user, name, slot);
    if (rc != WSYNC_OK)
        wsync_driver_log(d, WSYNC_LOG_ERROR, "wsync: adapter \"%s\" refused: %s: %s", name,
                         wsync_strerror(rc), err != NULL ? err->message : "");
    return rc;
}

wsync_result_t wsync_driver_unload_adapter(wsync_driver_t *d, const char *name, wsync_error_t *err)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    wsync_adapter_slot_t *slot;
    wsync_result_t rc = wsync_driver_lora_ready(d, err);

    if (rc != WSYNC_OK)
        return rc;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, unload_adapter))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED, "plugin %s has no unload_adapter",
                            d->loader.path);
    slot = name != NULL ? e->lora_slot(e->user, name, 0) : NULL;
    if (slot == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND, "adapter \"%s\" is not loaded",
                            name ? name : "(null)");
    rc = wsync_driver_drain(d, err);
    if (rc == WSYNC_OK)
        rc = d->ops->unload_adapter(d->consumer, slot, err);
    if (rc == WSYNC_OK && WSYNC_HAS_FIELD(wsync_engine_ops_t, e, lora_unloaded) &&
        e->lora_unloaded != NULL)
        e->lora_unloaded(e->user, name);
    return rc;
}

void wsync_driver_reset_prefix_cache(wsync_driver_t *d, const char *name)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, reset_prefix_cache) && e->reset_prefix_cache != NULL)
        e->reset_prefix_cache(e->user, name);
}
