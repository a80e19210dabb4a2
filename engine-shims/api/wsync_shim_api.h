/* The engine shims as one shared library (libwsync_shim.so) for engines and trainers written in
 * other languages (the Python package binds it with ctypes). It adds no rule of its own: each
 * call is the C shims' code (mapping, request handling, encoding, planning order), so a Python
 * engine and a C engine behave identically.
 *
 * Exported: exactly the functions below (cmake/wsync_shim.map). Errors as everywhere in wsync:
 * a wsync_result_t and an optional caller-owned wsync_error_t (first error wins). Strings this
 * library returns are malloc'd; free them with wsync_shim_api_free. */
#ifndef WSYNC_SHIM_API_H
#define WSYNC_SHIM_API_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_registry.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WSYNC_SHIM_API_VERSION 1u

/* This library's API version (WSYNC_SHIM_API_VERSION). */
uint32_t wsync_shim_api_version(void);
/* The name of result code `code` ("STALE_GENERATION"), NULL past the last one this library
 * knows (wsync_result_name): bindings take their names and exception classes from it. */
const char *wsync_shim_result_name(int code);

typedef struct wsync_shim_worker wsync_shim_worker_t;

/* One engine parameter by engine name, for a worker's parameter table. */
typedef struct wsync_shim_param {
    const char *name;
    wsync_param_info_t info;
} wsync_shim_param_t;

typedef struct wsync_shim_worker_config {
    size_t struct_size;
    const char *engine;            /* "sglang", "vllm", "lmdeploy" */
    const char *plugin_path;       /* NULL: $WSYNC_PLUGIN, else the default search */
    const wsync_engine_ops_t *ops; /* borrowed for the worker's life */
    int device_ordinal;            /* CUDA ordinal of the engine's parameters */
    uint32_t timeout_ms;           /* consumer waits (0: the plugin's default) */
    uint32_t copy_flags;           /* WSYNC_COPY_VERIFY: check wsync64 digests in the copy */
    wsync_log_fn_t log;            /* NULL: silent */
    void *log_user;
    wsync_log_level_t log_level;
    /* Optional: the engine's parameters as a table (copied at open; n_params entries). When
     * given, the worker answers the mapping's parameter look-ups itself (a binary search, no
     * call into the engine per tensor) and ops->param may be NULL; the addresses must stay fixed
     * for the worker's life, as with ops->param. Such a worker is a fixed model: ops->tp,
     * ops->dims and ops->moe are asked once, at open. */
    const wsync_shim_param_t *params;
    size_t n_params;
    /* Optional: the parameter layout the mapping fills. NULL or "": the engine's own (fused,
     * narrowed for the worker's TP rank); "checkpoint": every HF tensor whole, in the parameter
     * of its own name (for an engine that runs its own loaders on them: vLLM's layerwise
     * reload). */
    const char *mapping;
    /* Optional: the manifest limits the consumer enforces before it parses (0: the plugin's
     * defaults, 16 MiB of text and 65 536 tensors a manifest). */
    uint64_t max_manifest_bytes;
    uint64_t max_manifest_tensors;
} wsync_shim_worker_config_t;

/* One engine worker (one TP rank): the shim of cfg->engine over a request driver. When no plugin
 * can be used (missing, incompatible, no device) the worker still opens and *native is set
 * (wsync_shim_worker_backend says why); requests then go to ops->native_copy, or fail with
 * NOT_SUPPORTED without one. NOT_FOUND for an unknown engine name. Blocking. */
wsync_result_t wsync_shim_worker_open(const wsync_shim_worker_config_t *cfg,
                                      wsync_shim_worker_t **out, wsync_error_t *err);
/* Release every mapping, finalize the consumer, unload the plugin. NULL is a no-op. */
void wsync_shim_worker_close(wsync_shim_worker_t *w);

/* The plugin in use ("host 0.1.10"), or "native: <why>" (malloc'd). */
char *wsync_shim_worker_backend(const wsync_shim_worker_t *w, int *native);

/* Handle one request message (JSON text of the engine's API, wsync_shim.h) and return the reply
 * JSON text ({"ok": true, ...} or {"ok": false, "code", "error", "message"}); *rc gets the
 * result. A refused request leaves every engine parameter as it was. Copies are enqueued on
 * ops->stream (non-blocking) unless the shim drains (flush, finish). */
char *wsync_shim_worker_serve(wsync_shim_worker_t *w, const char *text, size_t len,
                              wsync_result_t *rc, wsync_error_t *err);
/* Buffers and direct segments this worker has opened (wsync_driver_opens): 0 more per steady
 * sync. */
uint64_t wsync_shim_worker_opens(const wsync_shim_worker_t *w);
/* The model layer (model/wsync_model.h): the HF tensor list of a Hugging Face config.json
 * (text, len bytes) as JSON text (malloc'd; free with wsync_shim_api_free): [{"name", "dtype",
 * "shape"}, ...] in the checkpoint's order. NULL with err naming what is wrong (an unknown
 * model_type, a size missing). */
char *wsync_shim_model_tensors(const char *config_json, size_t len, wsync_error_t *err);

/* A Hugging Face model directory's tensor plan (model/wsync_checkpoint.h), nothing moved: JSON
 * text (malloc'd) {"model_type", "tensors": n, "bytes", "shards": k, "plan": [{"name", "dtype",
 * "file_dtype", "shape", "bytes", "shard", "engine_param", "expert"}, ...]}, engine_param by
 * `engine`'s mapping (NULL engine: "sglang"). NULL with err naming what is wrong (a tensor
 * missing or of another shape, an unknown model_type, a file that is not safetensors). */
char *wsync_shim_checkpoint_plan(const char *dir, const char *engine, wsync_error_t *err);

/* Rollback mode (wsync_driver_set_shadows): copies into params[i] .. + bytes[i] go to shadows[i];
 * the engine fills each shadow when a version opens and copies it into place when the version
 * commits (its update_begin / update_end hooks). n = 0 turns it off. */
wsync_result_t wsync_shim_worker_shadows(wsync_shim_worker_t *w, void *const *params,
                                         void *const *shadows, const uint64_t *bytes, size_t n,
                                         wsync_error_t *err);
/* Wait for every copy enqueued on the engine's stream. Blocking. */
wsync_result_t wsync_shim_worker_drain(wsync_shim_worker_t *w, wsync_error_t *err);
/* Drain, then close every cached mapping (the engine's half of the retire handshake). */
wsync_result_t wsync_shim_worker_release(wsync_shim_worker_t *w, wsync_error_t *err);

/* Trainer side: the request messages (a JSON array, in send order) that carry one bucket to
 * `engine`, from what publish returned for each engine TP rank (n_ranks manifests, or one for
 * all). first / finished: first and last bucket of a weight version; weight_version may be NULL;
 * packed: vLLM's packed buckets (0: per-tensor handles), SGLang's manifest as published (0: its
 * FlattenedTensorBucket); with_buffer (LMDeploy): the first bucket a buffer carries; direct:
 * the manifests were published by a direct-mode buffer (WSYNC_STAGING_DIRECT). */
char *wsync_shim_encode_bucket(const char *engine, const char *const *manifests, size_t n_ranks,
                               int first, int finished, const char *weight_version, int packed,
                               int with_buffer, int direct, wsync_error_t *err);
/* The same messages, each as compact JSON text, joined by '\n' (compact JSON holds no raw
 * newline), so a caller takes each message's text as is instead of parsing the array. */
char *wsync_shim_encode_bucket_lines(const char *engine, const char *const *manifests,
                                     size_t n_ranks, int first, int finished,
                                     const char *weight_version, int packed, int with_buffer,
                                     int direct, wsync_error_t *err);

/* Trainer side: wsync's own requests, sent as they are to every engine rank (malloc'd text; free
 * with wsync_shim_api_free; NULL with err set). begin opens update transaction `version`
 * declaring the n tensors (HF names) and nbytes the sync will send, its producer `pid` (0: none);
 * commit ends it (version 0: the one begun); abort drops it with `reason`; state asks each rank
 * for its transaction's state; check asks each rank for its digests of n tensors (names[i] of
 * dtype dtypes[i], torch's name, and shape dims[off_i .. off_i + ndims[i]), the dims of the
 * tensors before it first). */
char *wsync_shim_encode_begin(uint64_t version, int64_t pid, const char *const *names, size_t n,
                              uint64_t nbytes, wsync_error_t *err);
char *wsync_shim_encode_commit(uint64_t version, wsync_error_t *err);
char *wsync_shim_encode_abort(const char *reason, wsync_error_t *err);
char *wsync_shim_encode_state(wsync_error_t *err);
char *wsync_shim_encode_check(const char *const *names, const char *const *dtypes,
                              const uint32_t *ndims, const int64_t *dims, size_t n,
                              wsync_error_t *err);

/* Trainer side, LoRA: the one message that hot-loads adapter `name` into `engine` from the
 * tensors of a published buffer (manifests, one per rank or one for all, naming tensors as PEFT
 * saves them) with PEFT's adapter_config.json text `config`; or, with `path`, from a PEFT
 * directory. int_id: vLLM's lora_int_id (> 0). */
char *wsync_shim_encode_lora(const char *engine, const char *name, uint32_t int_id,
                             const char *path, const char *const *manifests, size_t n_ranks,
                             const char *config, int unload, wsync_error_t *err);

/* The manifest of tensors in one torch CUDA storage named by torch's own IPC handle (`handle`:
 * UntypedStorage._share_cuda_'s bytes; `bytes`, `offset`: its size and the storage's offset;
 * `pid`, `device`: the exporter and "GPU-<uuid>"), each tensor's name, torch dtype name, ndims
 * (dims concatenated) and byte offset in the storage (engine-shims/common/wsync_torch_msg.h).
 * Malloc'd JSON, or NULL with err set. */
/* The plan forms of a manifest as publish returned it (docs/DESIGN.md, "Plan once, replay"):
 * id (WSYNC_PLAN_ID_MAX + 1 bytes), its plan id; *full, the manifest recording that plan; *replay,
 * the manifest replaying it (both malloc'd, free with wsync_shim_api_free). NOT_SUPPORTED for a
 * manifest with digests (sent in full every time). */
wsync_result_t wsync_shim_plan_forms(const char *text, size_t len, char *id, char **full,
                                     char **replay, wsync_error_t *err);

char *wsync_shim_encode_torch_manifest(const uint8_t *handle, uint32_t handle_len, uint64_t bytes,
                                       uint64_t offset, int64_t pid, const char *device,
                                       uint64_t generation, int finished, const char *const *names,
                                       const char *const *dtypes, const uint32_t *ndims,
                                       const int64_t *dims, const uint64_t *offsets, size_t n,
                                       wsync_error_t *err);

/* The order `engine` holds the n HF `names` in (wsync_map_order): order[i] indexes names. A
 * trainer that plans buckets in this order cuts a fused parameter at most once. */
wsync_result_t wsync_shim_order(const char *engine, const char *const *names, size_t n,
                                size_t *order, wsync_error_t *err);

/* Trainer side: buckets of at most bucket_bytes for the n tensors (names, nbytes) in `engine`'s
 * order (wsync_map_plan_buckets): bucket b holds order[bucket_first[b] .. bucket_first[b + 1]).
 * order: n entries; bucket_first: n + 1. `ramp`: the first buckets smaller (0: none; 3: 1/8,
 * 1/4, 1/2 of bucket_bytes, as direct mode plans). INVALID_ARGUMENT naming a tensor that does not
 * fit. */
wsync_result_t wsync_shim_plan(const char *engine, const char *const *names, const uint64_t *nbytes,
                               size_t n, uint64_t bucket_bytes, unsigned ramp, size_t *order,
                               size_t *bucket_first, size_t *n_buckets, wsync_error_t *err);

/* Trainer side, expert parallelism: owner[i] = the EP rank of ep_size that owns HF tensor names[i]
 * (an expert, in the placement of the engines' mapping, docs/SHIMS.md), or -1 for a tensor every
 * rank takes (not an expert, or an index past the model, which the engines refuse). *experts: the
 * model's expert count; <= 0 on entry: the largest expert index named, plus one (0 without any). */
wsync_result_t wsync_shim_ep_owners(const char *engine, const char *const *names, size_t n,
                                    int64_t *experts, uint32_t ep_size, int32_t *owner,
                                    wsync_error_t *err);

/* Load a plugin through the shims' loader (wsync_loader.h: `path`, else $WSYNC_PLUGIN, else the
 * CUDA plugin when it finds a device, else the CPU plugin, searched in $WSYNC_PLUGIN_DIR first)
 * for a trainer's producer side. The plugin stays loaded for the life of the process; *out is
 * its table, loaded_path (cap bytes) the file that was loaded. Up to 8 calls per process (load
 * each plugin once and keep its table). Thread safe. Errors name the library, the step and why. */
wsync_result_t wsync_shim_plugin_open(const char *path, const wsync_plugin_t **out,
                                      char *loaded_path, size_t cap, wsync_error_t *err);

void wsync_shim_api_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
