/* A Hugging Face model directory's tensor plan for one engine, nothing moved: each tensor the
 * config derives (model/wsync_checkpoint.h), the engine parameter the shim's mapping puts it in,
 * its dtypes, shape, bytes and shard. One builder for `wsync inspect` and
 * wsync_shim_checkpoint_plan. */
#ifndef WSYNC_CKPT_PLAN_H
#define WSYNC_CKPT_PLAN_H

#include <jansson.h>

#include "wsync_model.h"
#include "wsync_shim.h"

/* {"model_type", "tensors", "bytes", "shards", "plan": [{"name", "dtype", "file_dtype",
 * "shape", "bytes", "shard", "engine_param" (absent when the engine has none), "expert"}]};
 * NULL with err naming what is wrong (the checkpoint reader's errors). */
json_t *wsync_ckpt_plan(const char *dir, const wsync_shim_t *shim, wsync_error_t *err);

/* A tensor's shape as a JSON array. */
json_t *wsync_ckpt_shape(const wsync_model_tensor_t *t);

#endif
