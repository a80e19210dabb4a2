/* What an engine gives a shim: its parameter registry (name -> storage, dtype, shape), its tensor
 * parallel position, the model dimensions the fused layouts depend on, the stream weight copies
 * run on, and its hooks (cache flush, post-load, native loader). A struct of function pointers
 * plus one user pointer, so an engine written in any language can fill it.
 *
 * Lifetime: the engine owns the struct and everything its callbacks return; it must outlive the
 * driver that holds it. Callbacks are invoked from the thread that calls the driver, never
 * concurrently with each other. */
#ifndef WSYNC_REGISTRY_H
#define WSYNC_REGISTRY_H

#include <stdint.h>
#include "wsync_abi.h"

/* One engine parameter. `ptr` is plugin memory (device memory for CUDA); the address must stay
 * fixed for the life of the engine (updates are in place, CUDA graphs stay valid). */
typedef struct wsync_param_info {
    void *ptr;
    wsync_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS];
} wsync_param_info_t;

/* The unsharded model dimensions. The mapping derives fused-part row offsets (k inside qkv_proj,
 * up inside gate_up_proj) and the expected HF shapes from them. experts = 0: dense model. */
typedef struct wsync_model_dims {
    int64_t hidden;
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;
    int64_t intermediate;
    int64_t experts;
    int64_t moe_intermediate;
    int64_t vocab;
} wsync_model_dims_t;

typedef struct wsync_engine_ops {
    size_t struct_size;
    void *user;

    /* Engine parameter `name` (engine naming, e.g. "model.layers.0.self_attn.qkv_proj.weight").
     * Returns 0 and fills *out when known, -1 when the engine has no such parameter. Required. */
    int (*param)(void *user, const char *name, wsync_param_info_t *out);
    /* This engine worker's tensor-parallel rank and size (size >= 1). Required. */
    void (*tp)(void *user, uint32_t *rank, uint32_t *size);
    /* Model dimensions. Required. */
    void (*dims)(void *user, wsync_model_dims_t *out);
    /* The stream weight copies must run on (the engine's load stream, e.g. torch's current
     * stream); NULL = CUDA's legacy default stream (the ABI's stream rule). Optional. */
    wsync_stream_t (*stream)(void *user);
    /* Drop cached state derived from the weights (SGLang flush_cache, vLLM prefix-cache reset).
     * Called after the copies of a request are enqueued and the stream drained. Optional. */
    void (*flush_cache)(void *user);
    /* Post-processing once a weight version is complete (LMDeploy `finished`, vLLM
     * finish_weight_update). Called with the stream drained. Optional. */
    void (*post_load)(void *user);
    /* The engine's own loader, used when no plugin could be loaded. It receives ops the driver
     * validated and planned exactly as for the plugin (src offsets into `buffer`'s usable region,
     * dst inside engine parameters) and must perform them itself, including any ready/consumed
     * handshake the buffer carries. Blocking. Optional: without it a plugin failure makes
     * every request fail with NOT_SUPPORTED instead of falling back. */
    wsync_result_t (*native_copy)(void *user, const wsync_buffer_desc_t *buffer,
                                  uint64_t generation, const wsync_copy_op_t *ops, size_t n_ops,
                                  wsync_error_t *err);

    /* LoRA (appended; all optional: without lora_slot every adapter request fails with
     * NOT_SUPPORTED). The engine's adapter slot for `name` (wsync_abi_v1.h: targets with two
     * copies, max_rank, *active): the slot already holding `name`, else with `assign` non-zero a
     * free one (the engine records the name only once lora_loaded reports success), else NULL.
     * The slot and its buffers are the engine's and stay valid while the name is loaded. */
    wsync_adapter_slot_t *(*lora_slot)(void *user, const char *name, int assign);
    /* After a successful hot-load of `name` into `slot` (the slot now serves that name). */
    void (*lora_loaded)(void *user, const char *name, wsync_adapter_slot_t *slot);
    /* After unload_adapter: the slot of `name` is free again. */
    void (*lora_unloaded)(void *user, const char *name);
    /* Drop prefix-cache blocks computed with adapter `name` (vLLM's reset on a same-name
     * reload: the blocks were computed with the previous weights). */
    void (*reset_prefix_cache)(void *user, const char *name);

    /* Update transactions (appended; optional; docs/SHIMS.md). A weight version opened: from its
     * first bucket on the weights are mixed, so the engine stops serving (or serves knowing it).
     * Then it ends: committed (every expected tensor arrived and was copied; serve again) or not
     * (aborted, its producer gone, a newer version begun: the weights stay mixed until a version
     * commits, so keep refusing to serve). */
    void (*update_begin)(void *user, uint64_t version);
    void (*update_end)(void *user, uint64_t version, int committed);

    /* Expert parallelism (appended; optional; docs/SHIMS.md). This rank's place among the
     * engine's EP ranks (ep_size >= 1) and the tensor-parallel group its experts are split over
     * (moe_tp_size >= 1). The rank holds its share of the model's `experts` in the linear
     * placement vLLM and SGLang use by default (wsync_map_ep_share); its fused expert parameters
     * hold only those, by local index. Without this member: EP size 1 and the experts split over
     * the rank's TP group (`tp`). */
    void (*moe)(void *user, uint32_t *ep_rank, uint32_t *ep_size, uint32_t *moe_tp_rank,
                uint32_t *moe_tp_size);
} wsync_engine_ops_t;

#endif
