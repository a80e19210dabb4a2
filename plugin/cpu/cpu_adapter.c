/* LoRA hot-load on the CPU backend (docs/DESIGN.md §6). The adapter layer (plugin/adapters/)
 * validates the adapter against the slot and plans every byte; this file orders the load after the
 * engine's earlier work and the producer's *ready*, and signals *consumed* for an IPC source once
 * the shadow copy is written and switched. */
#include "cpu_internal.h"
#include "wsync_adapter_load.h"
#include "wsync_error.h"
#include "wsync_validate.h"

/* FROM_MANIFEST: the manifest must describe the buffer behind `h`, and its generation must be
 * newer than the last one taken from it. Returns the usable base of the mapping. */
static wsync_result_t wsync_cpu_adapter_source(struct wsync_consumer *c,
                                               const wsync_adapter_source_t *src,
                                               const uint8_t **base, wsync_error_t *err)
{
    struct wsync_handle *h = src->handle;
    const wsync_manifest_t *m = src->manifest;
    if (h == NULL || h->consumer != c)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "adapter source FROM_MANIFEST needs an open handle of this consumer "
                          "(handle %p)",
                          (void *)h);
    wsync_result_t r = wsync_validate_adapter_manifest(m, &h->entry->key, h->bytes,
                                                       wsync_cpu_handle_last_generation(h), err);
    if (r != WSYNC_OK)
        return r;
    r = wsync_control_wait_ready(h->control, m->generation, c->timeout_ms, h->peer_pid, err);
    if (r != WSYNC_OK)
        return r;
    *base = h->data;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_hot_load_adapter(struct wsync_consumer *c,
                                          const wsync_adapter_source_t *src,
                                          wsync_adapter_slot_t *slot, wsync_stream_t stream,
                                          wsync_error_t *err)
{
    wsync_result_t arg = wsync_validate_adapter_call(c, src, slot, err);
    if (arg != WSYNC_OK)
        return arg;
    /* The engine's earlier work on this stream (e.g. requests reading the shadow copy) first. */
    wsync_cpu_stream_synchronize(wsync_cpu_consumer_stream(c, stream));

    const uint8_t *base = NULL;
    wsync_result_t r = WSYNC_OK;
    if (src->kind == WSYNC_ADAPTER_FROM_MANIFEST)
        r = wsync_cpu_adapter_source(c, src, &base, err);
    if (r == WSYNC_OK)
        r = wsync_adapter_hot_load(src, slot, base, NULL, NULL, err);
    if (r == WSYNC_OK && src->kind == WSYNC_ADAPTER_FROM_MANIFEST) {
        /* Every byte is read: the producer may refresh its retained export in place. */
        src->handle->entry->last_generation = src->manifest->generation;
        wsync_control_signal_consumed(src->handle->control, src->manifest->generation);
    }
    return r;
}

wsync_result_t wsync_cpu_unload_adapter(struct wsync_consumer *c, wsync_adapter_slot_t *slot,
                                        wsync_error_t *err)
{
    if (c == NULL || slot == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "consumer %p and slot %p must be "
                          "non-NULL",
                          (void *)c, (void *)slot);
    return wsync_adapter_unload(slot, NULL, NULL, NULL, NULL, err);
}
