/* The shape of a shim. Each engine shim is a table: its mapping rules, an engine-side handler
 * for its request messages and a trainer-side encoder producing them. What they share (manifest
 * building, bucket codec, the driver) lives in this folder; the tables live in
 * engine-shims/<engine>/.
 *
 * Messages are JSON objects with a "method" member naming the engine API they mirror
 * (e.g. "update_weights_from_tensor"); replies are {"ok": true|false, "method", ...}. */
#ifndef WSYNC_SHIM_H
#define WSYNC_SHIM_H

#include <jansson.h>
#include "wsync_driver.h"
#include "wsync_mapping.h"

/* Per-worker state of one shim. Owned by the engine; `state` is a JSON object the shim keeps
 * between requests (LMDeploy's persistent buffer, vLLM's open update), created by
 * wsync_shim_ctx_init and freed by wsync_shim_ctx_free. */
typedef struct wsync_shim_ctx {
    wsync_driver_t *driver;
    uint32_t tp_rank, tp_size;
    json_t *state;
    /* Optional: the engine parameters that no tensor a request named has fed since the worker
     * opened, as a JSON array of their names (a new reference; empty when every one was fed).
     * A request that commits a version while some remain fails, naming them: the version's
     * tensors landed, but those parameters hold whatever the engine loaded at start. A
     * wsync_check reply lists them as "unfed". */
    json_t *(*unfed)(void *user);
    void *unfed_user;
} wsync_shim_ctx_t;

/* Trainer-side input for one bucket. */
typedef struct wsync_shim_encode {
    const char *const *manifests; /* what publish returned, one per TP rank (or one for all) */
    size_t n_ranks;
    int first;                  /* first bucket of a weight version */
    int finished;               /* last bucket of a weight version */
    const char *weight_version; /* NULL: none */
    int packed;                 /* vLLM: packed bucket (1) or per-tensor IPC handles (0);
                                   SGLang: manifest as published (1) or FlattenedTensorBucket (0) */
    int with_buffer;            /* LMDeploy: send the flattened tensor (first use of a buffer) */
    int direct;                 /* the manifests name the trainer's own memory (published with
                                   WSYNC_STAGING_DIRECT): the caller says so, nobody reads it from the text */
} wsync_shim_encode_t;

/* Trainer side: the adapter a message loads, for the shims' encode_lora. */
typedef struct wsync_shim_lora {
    const char *name;
    uint32_t int_id;              /* vLLM's lora_int_id (> 0) */
    const char *path;             /* a PEFT directory, or NULL */
    const char *const *manifests; /* or what publish returned, one per TP rank (or one for all) */
    size_t n_ranks;
    const char *config; /* adapter_config.json text, with manifests */
    int unload;         /* the unload message for `name` / int_id instead */
} wsync_shim_lora_t;

typedef struct wsync_shim {
    const char *engine; /* "sglang", "vllm", "lmdeploy" */
    const wsync_map_table_t *map;
    /* Engine side: handle one request. *extra (may stay NULL) is merged into the OK reply. */
    wsync_result_t (*handle)(wsync_shim_ctx_t *ctx, const char *method, json_t *req, json_t **extra,
                             wsync_error_t *err);
    /* Trainer side: the messages for one bucket, to send in order (each gets a reply). */
    wsync_result_t (*encode)(const wsync_shim_encode_t *in, json_t **msgs, wsync_error_t *err);
    /* Trainer side, LoRA: the one message that loads (or unloads) an adapter.
     * NOT_SUPPORTED for a source the engine's API does not offer. */
    wsync_result_t (*encode_lora)(const wsync_shim_lora_t *in, json_t **msg, wsync_error_t *err);
} wsync_shim_t;

extern const wsync_shim_t wsync_shim_sglang;
extern const wsync_shim_t wsync_shim_vllm;
extern const wsync_shim_t wsync_shim_lmdeploy;

/* "sglang" / "vllm" / "lmdeploy" -> shim, NULL when unknown. */
const wsync_shim_t *wsync_shim_find(const char *engine);

void wsync_shim_ctx_init(wsync_shim_ctx_t *ctx, wsync_driver_t *d, uint32_t rank, uint32_t size);
void wsync_shim_ctx_free(wsync_shim_ctx_t *ctx);

/* Engine side, whole message: parse `text`, dispatch to the shim, return the reply as JSON text
 * (malloc'd, never NULL unless out of memory). *rc (may be NULL) gets the result. */
char *wsync_shim_serve(const wsync_shim_t *s, wsync_shim_ctx_t *ctx, const char *text, size_t len,
                       wsync_result_t *rc, wsync_error_t *err);

/* For shims, where an engine's API ends a weight version (SGLang's flush_cache, vLLM's
 * finish_weight_update, LMDeploy's finished): drain the copies (wsync_driver_drain), then commit
 * the open version (wsync_driver_commit), refused naming what is missing; the version commits
 * only when everything it declared arrived and was copied. OK when the copies drained and no
 * version is open. */
wsync_result_t wsync_shim_commit(wsync_shim_ctx_t *ctx, wsync_error_t *err);

/* For shims: hand decoded manifests (stolen) to the driver. *generation may be NULL. */
wsync_result_t wsync_shim_apply(wsync_shim_ctx_t *ctx, json_t **manifests, size_t n,
                                uint64_t *generation, wsync_error_t *err);

/* For shims: hand one manifest, as publish returned it (JSON text, borrowed), to the driver: no
 * decode and re-encode. *generation may be NULL. */
wsync_result_t wsync_shim_apply_text(wsync_shim_ctx_t *ctx, const char *text, size_t len,
                                     uint64_t *generation, wsync_error_t *err);

/* For FlattenedTensorBucket requests (SGLang, LMDeploy): checks req's "load_format" is
 * "flattened_bucket" (when `format_required` is 0 it may also be absent) and sets *bucket to this
 * rank's entry of req[key] (borrowed from req). NOT_SUPPORTED for another format, BAD_REQUEST
 * when req[key] has no entry for this rank; *bucket is untouched on failure. */
wsync_result_t wsync_shim_flat_bucket(const wsync_shim_ctx_t *ctx, json_t *req, const char *key,
                                      int format_required, json_t **bucket, wsync_error_t *err);

/* The load format whose entries are the manifests as published (one text per rank): what
 * wsync's encoders send when nothing else carries the bucket (direct mode's segments), and
 * SGLang's packed form. */
#define WSYNC_SHIM_MANIFEST_FORMAT "wsync_manifest"

/* For shims: this rank's entry of `list` (one for all, or one per rank) is a manifest text:
 * apply it (wsync_shim_apply_text). BAD_REQUEST naming `what` when there is no entry for this
 * rank or it is not a string. */
wsync_result_t wsync_shim_apply_rank_manifest(wsync_shim_ctx_t *ctx, json_t *list, const char *what,
                                              uint64_t *generation, wsync_error_t *err);

/* For encoders: the manifests' texts as a JSON array of strings (NULL and err on failure), and
 * whether they are direct-mode manifests (they name segments: only the manifest text itself
 * carries them). */
json_t *wsync_shim_rank_texts(const wsync_shim_encode_t *in, wsync_error_t *err);
int wsync_shim_is_direct(const wsync_shim_encode_t *in);

/* For encoders: a JSON array with `bucket_of(manifest)` for every rank. */
json_t *wsync_shim_rank_buckets(const wsync_shim_encode_t *in, int with_buffer, wsync_error_t *err);

#endif
