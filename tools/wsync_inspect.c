/* wsync inspect DIR [--engine E]: the tensor plan of a Hugging Face model directory (HF name ->
 * engine parameter, dtype in the file and in the model, shape, shard, bytes): the plan
 * wsync_ckpt_plan builds (also wsync_shim_checkpoint_plan's), printed; nothing is moved. */
#include <stdio.h>
#include <string.h>

#include "wsync_ckpt_plan.h"
#include "wsync_cli.h"

int wsync_cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL, *engine = "sglang";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--engine") == 0 && i + 1 < argc)
            engine = argv[++i];
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: wsync inspect DIR [--engine sglang|vllm|lmdeploy]\n"
                   "  the tensor plan of a Hugging Face model directory (config.json and\n"
                   "  model.safetensors or its shards): HF name -> engine parameter, dtypes,\n"
                   "  shape, shard, bytes. Nothing is moved.\n");
            return 0;
        } else if (dir == NULL)
            dir = argv[i];
        else {
            fprintf(stderr, "wsync inspect: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    const wsync_shim_t *shim = wsync_shim_find(engine);
    if (dir == NULL || shim == NULL) {
        fprintf(stderr, "wsync inspect: %s\n",
                dir == NULL ? "name a model directory" : "--engine is sglang, vllm or lmdeploy");
        return 2;
    }
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_t *doc = wsync_ckpt_plan(dir, shim, &err);
    if (doc == NULL) {
        fprintf(stderr, "wsync inspect: %s\n", err.message);
        return 1;
    }
    printf("%-56s %-44s %-9s %-9s %-16s %12s  %s\n", "HF name", "engine parameter", "file", "model",
           "shape", "bytes", "shard");
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(doc, "plan"), i, t)
    {
        json_t *shape = json_object_get(t, "shape");
        const char *param = json_string_value(json_object_get(t, "engine_param"));
        const json_int_t expert = json_integer_value(json_object_get(t, "expert"));
        char dims[48], target[WSYNC_MAP_NAME_MAX + 64];
        snprintf(dims, sizeof(dims), json_array_size(shape) > 1 ? "[%lld, %lld]" : "[%lld]",
                 (long long)json_integer_value(json_array_get(shape, 0)),
                 (long long)json_integer_value(json_array_get(shape, 1)));
        if (param == NULL)
            snprintf(target, sizeof(target), "(no %s parameter)", engine);
        else if (expert >= 0)
            snprintf(target, sizeof(target), "%s [expert %lld]", param, (long long)expert);
        else
            snprintf(target, sizeof(target), "%s", param);
        printf("%-56s %-44s %-9s %-9s %-16s %12lld  %s\n",
               json_string_value(json_object_get(t, "name")), target,
               json_string_value(json_object_get(t, "file_dtype")),
               json_string_value(json_object_get(t, "dtype")), dims,
               (long long)json_integer_value(json_object_get(t, "bytes")),
               json_string_value(json_object_get(t, "shard")));
    }
    printf("%s: %lld tensors, %.3f GB in %lld shard(s), for %s\n",
           json_string_value(json_object_get(doc, "model_type")),
           (long long)json_integer_value(json_object_get(doc, "tensors")),
           (double)json_integer_value(json_object_get(doc, "bytes")) / 1e9,
           (long long)json_integer_value(json_object_get(doc, "shards")), engine);
    json_decref(doc);
    return 0;
}
