/* LoRA hot-load on the host backend. Not implemented yet: this file is the single place that
 * will hold it (DESIGN.md §6), so the rest of the backend does not change when it lands. */
#include "host_internal.h"
#include "wsync_error.h"

wsync_result_t wsync_host_hot_load_adapter(struct wsync_consumer *c,
                                           const wsync_adapter_source_t *src,
                                           wsync_adapter_slot_t *slot, wsync_stream_t stream,
                                           wsync_error_t *err)
{
    (void)c;
    (void)src;
    (void)stream;
    return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                      "the host plugin cannot hot-load LoRA adapters yet (adapter \"%.64s\"); "
                      "copy the adapter tensors with copy_weights or load the adapter through "
                      "the engine's own loader",
                      slot != NULL && slot->adapter_name != NULL ? slot->adapter_name : "?");
}
