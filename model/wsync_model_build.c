/* wsync_model_build: the tensor list from a checkpoint, a config or a built-in layout. The top of
 * the model layer: it reads both the checkpoint reader and the tensor lists, which do not read
 * each other. */
#include <string.h>

#include "wsync_checkpoint.h"
#include "wsync_model.h"
#include "wsync_model_config.h"

int wsync_model_build(wsync_model_t *m, const wsync_model_config_t *cfg, char *why, size_t len)
{
    memset(m, 0, sizeof(*m));
    if (cfg->model_dir != NULL)
        return wsync_checkpoint_load_model(m, cfg->model_dir, cfg->dtype, why, len);
    if (cfg->config_json != NULL)
        return wsync_model_from_config(m, cfg->config_json, strlen(cfg->config_json), why, len);
    return wsync_model_from_layout(m, cfg->layout, cfg->scale, cfg->layers, why, len);
}
