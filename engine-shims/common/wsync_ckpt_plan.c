/* A model directory's tensor plan. Contract in wsync_ckpt_plan.h. */
#include "wsync_ckpt_plan.h"

#include "wsync_checkpoint.h"
#include "wsync_dtype.h"
#include "wsync_error.h"

json_t *wsync_ckpt_shape(const wsync_model_tensor_t *t)
{
    json_t *shape = json_array();
    for (uint32_t k = 0; shape != NULL && k < t->ndim; k++)
        json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
    return shape;
}

json_t *wsync_ckpt_plan(const char *dir, const wsync_shim_t *shim, wsync_error_t *err)
{
    wsync_checkpoint_t *c = NULL;
    if (wsync_checkpoint_open(dir, &c, err) != WSYNC_OK)
        return NULL;
    const wsync_model_t *m = wsync_checkpoint_model(c);
    json_t *plan = json_array();
    uint64_t bytes = 0;
    for (size_t i = 0; plan != NULL && i < m->n; i++) {
        const wsync_ckpt_tensor_t *t = wsync_checkpoint_tensor(c, i);
        wsync_map_target_t to;
        wsync_error_t local = {.struct_size = sizeof(local)};
        const int mapped = wsync_map_resolve(shim->map, t->want->name, &to, &local) == WSYNC_OK;
        json_array_append_new(
            plan, json_pack("{s:s, s:s, s:s, s:o, s:I, s:s, s:s?, s:I}", "name", t->want->name,
                            "dtype", wsync_dtype_name(t->want->dtype), "file_dtype",
                            wsync_dtype_name(t->file_dtype), "shape", wsync_ckpt_shape(t->want),
                            "bytes", (json_int_t)t->file_nbytes, "shard", t->shard, "engine_param",
                            mapped ? to.engine_name : NULL, "expert",
                            (json_int_t)(mapped ? to.expert : -1)));
        bytes += t->file_nbytes;
    }
    json_t *doc = json_pack("{s:s, s:I, s:I, s:I, s:o}", "model_type", m->layout, "tensors",
                            (json_int_t)m->n, "bytes", (json_int_t)bytes, "shards",
                            (json_int_t)wsync_checkpoint_shards(c), "plan", plan);
    wsync_checkpoint_close(c);
    if (doc == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "checkpoint plan: out of memory");
    return doc;
}
