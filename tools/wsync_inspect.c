/* wsync inspect DIR [--engine E]: the tensor plan of a Hugging Face model directory (HF name ->
 * engine parameter, dtype in the file and in the model, shape, shard, bytes), by the model
 * layer's checkpoint reader and the engine shim's mapping; nothing is moved. */
#include <stdio.h>
#include <string.h>

#include "wsync_checkpoint.h"
#include "wsync_cli.h"
#include "wsync_dtype.h"
#include "wsync_shim.h"

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
    wsync_checkpoint_t *c = NULL;
    if (wsync_checkpoint_open(dir, &c, &err) != WSYNC_OK) {
        fprintf(stderr, "wsync inspect: %s\n", err.message);
        return 1;
    }
    const wsync_model_t *m = wsync_checkpoint_model(c);
    uint64_t bytes = 0;
    printf("%-56s %-44s %-9s %-9s %-16s %12s  %s\n", "HF name", "engine parameter", "file", "model",
           "shape", "bytes", "shard");
    for (size_t i = 0; i < m->n; i++) {
        const wsync_ckpt_tensor_t *t = wsync_checkpoint_tensor(c, i);
        wsync_map_target_t to;
        wsync_error_t local = {.struct_size = sizeof(local)};
        char shape[48], target[WSYNC_MAP_NAME_MAX + 64];
        snprintf(shape, sizeof(shape), t->want->ndim > 1 ? "[%lld, %lld]" : "[%lld]",
                 (long long)t->want->shape[0], (long long)t->want->shape[1]);
        if (wsync_map_resolve(shim->map, t->want->name, &to, &local) != WSYNC_OK)
            snprintf(target, sizeof(target), "(no %s parameter)", engine);
        else if (to.expert >= 0)
            snprintf(target, sizeof(target), "%s [expert %lld]", to.engine_name,
                     (long long)to.expert);
        else
            snprintf(target, sizeof(target), "%s", to.engine_name);
        printf("%-56s %-44s %-9s %-9s %-16s %12llu  %s\n", t->want->name, target,
               wsync_dtype_name(t->file_dtype), wsync_dtype_name(t->want->dtype), shape,
               (unsigned long long)t->file_nbytes, t->shard);
        bytes += t->file_nbytes;
    }
    printf("%s: %zu tensors, %.3f GB in %zu shard(s), for %s\n", m->layout, m->n, bytes / 1e9,
           wsync_checkpoint_shards(c), engine);
    wsync_checkpoint_close(c);
    return 0;
}
