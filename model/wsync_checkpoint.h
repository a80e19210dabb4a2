/* A Hugging Face model directory as the model layer reads it: config.json (the tensor list,
 * wsync_model.h) and the weights, model.safetensors or the shards model.safetensors.index.json
 * names, each mapped read-only with every offset checked (plugin/adapters/wsync_safetensors.h).
 * Every tensor the config derives is found in its shard and checked against the config's shape
 * before anything uses it: a tensor missing, of another shape, or of a dtype that would need an
 * integer or bool conversion is refused naming it. A floating-point tensor of another width
 * (an f32 checkpoint for a bf16 engine) is accepted and marked, so the copy converts it. */
#ifndef WSYNC_CHECKPOINT_H
#define WSYNC_CHECKPOINT_H

#include <stddef.h>

#include "wsync_abi.h"
#include "wsync_model.h"

typedef struct wsync_checkpoint wsync_checkpoint_t;

/* One tensor: the config's entry, where its bytes are (in the mapping), their dtype in the file
 * (may differ from the config's when both are floating point) and the shard's file name. */
typedef struct wsync_ckpt_tensor {
    const wsync_model_tensor_t *want;
    const void *data;
    wsync_dtype_t file_dtype;
    uint64_t file_nbytes;
    const char *shard;
} wsync_ckpt_tensor_t;

/* Open and validate `dir`. Errors: NOT_FOUND (no config.json, no weights, a tensor the config
 * needs that no shard holds: named), BAD_ADAPTER (a malformed file or index), INVALID_ARGUMENT
 * (an unknown model_type, a shape that disagrees with config.json, an integer or bool dtype
 * that differs: named), SYSTEM. */
wsync_result_t wsync_checkpoint_open(const char *dir, wsync_checkpoint_t **out, wsync_error_t *err);
void wsync_checkpoint_close(wsync_checkpoint_t *c);

/* The config's tensor list, and tensor i of it with its bytes. */
const wsync_model_t *wsync_checkpoint_model(const wsync_checkpoint_t *c);
const wsync_ckpt_tensor_t *wsync_checkpoint_tensor(const wsync_checkpoint_t *c, size_t i);
size_t wsync_checkpoint_shards(const wsync_checkpoint_t *c);
/* Shard k's whole read-only mapping (every tensor's data of that shard lies inside it). */
void wsync_checkpoint_shard_mapping(const wsync_checkpoint_t *c, size_t k, const void **base,
                                    size_t *len);

/* m (memset by the caller) as the tensor list of `dir`'s checkpoint with its bytes; the model
 * owns the open checkpoint and wsync_model_free closes it. With dtype set, floating-point
 * tensors are held as it (converted by wsync_model_fill). 0, or -1 with `why`. */
int wsync_checkpoint_load_model(wsync_model_t *m, const char *dir, wsync_dtype_t dtype, char *why,
                                size_t len);

/* The checkpoint a model loaded by wsync_checkpoint_load_model holds, else NULL. */
wsync_checkpoint_t *wsync_checkpoint_of(const wsync_model_t *m);

#endif
