/* LoRA hot-load for the CUDA backend: the executor of the adapter layer's plans (plugin/adapters/
 * wsync_adapter_plan.h) and the consumer's hot_load_adapter / unload_adapter. Buffers used by
 * the executor belong to the consumer (wsync_cuda_adapter_state_t) and are reused per load. */
#ifndef WSYNC_CUDA_ADAPTER_H
#define WSYNC_CUDA_ADAPTER_H

#include <cuda_runtime_api.h>

#include "wsync_abi.h"
#include "wsync_convert_kernel.h"

#define WSYNC_CUDA_ADAPTER_CHUNK (16u << 20) /* staging of host sources: bytes per chunk */

typedef struct wsync_cuda_adapter_state {
    wsync_cuda_conv_op_t *table_host[2]; /* pinned op tables, one per chunk slot */
    wsync_cuda_conv_op_t *table_dev[2];
    size_t table_cap;
    unsigned char *data_host[2]; /* pinned packing buffers (host sources) */
    unsigned char *data_dev[2];
    size_t data_cap;
    cudaEvent_t done[2]; /* recorded after each slot's kernel */
    int used[2];
} wsync_cuda_adapter_state_t;

struct wsync_consumer;

/* Blocking: returns after the stream carrying the load is synchronized and the slot committed.
 * Holds the consumer's lock for the whole load, so copy_weights / record_consumed of other
 * threads on the same consumer wait (a FROM_DIR load of 175 MB takes ~30 ms). FROM_MANIFEST
 * records *consumed* on that stream and signals it through the control segment. */
wsync_result_t wsync_cuda_hot_load_adapter(struct wsync_consumer *c,
                                           const wsync_adapter_source_t *src,
                                           wsync_adapter_slot_t *slot, wsync_stream_t stream,
                                           wsync_error_t *err);
wsync_result_t wsync_cuda_unload_adapter(struct wsync_consumer *c, wsync_adapter_slot_t *slot,
                                         wsync_error_t *err);
/* Free the executor's buffers (waits for their last use). */
void wsync_cuda_adapter_state_free(wsync_cuda_adapter_state_t *s);

#endif
