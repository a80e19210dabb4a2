/* Shared LoRA request handling; contract in wsync_adapter_req.h. */
#include "wsync_adapter_req.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_request.h"

/* The manifest a bucket describes, as JSON text (malloc'd). */
static wsync_result_t wsync_adapter_req_manifest(json_t *bucket, char **text, size_t *len,
                                                 wsync_error_t *err)
{
    json_t *m = NULL;
    wsync_result_t rc = wsync_req_bucket_decode(bucket, NULL, 1, &m, err);
    if (rc == WSYNC_OK)
        rc = wsync_req_dump(m, text, len, err);
    json_decref(m);
    return rc;
}

wsync_result_t wsync_adapter_req_load(wsync_shim_ctx_t *ctx, const char *name, const char *path,
                                      json_t *bucket, json_t *config, int reset_on_reload,
                                      json_t **extra, wsync_error_t *err)
{
    char *manifest = NULL, *config_text = NULL;
    size_t len = 0;
    int reloaded = 0;
    wsync_result_t rc = WSYNC_OK;

    if (name == NULL || name[0] == '\0')
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST, "the request names no adapter");
    if ((path == NULL) == (bucket == NULL))
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                            "adapter \"%s\": give either a path or serialized tensors", name);
    if (bucket != NULL) {
        if (json_is_string(config))
            config_text = strdup(json_string_value(config));
        else if (json_is_object(config))
            config_text = json_dumps(config, JSON_COMPACT);
        else
            return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                                "adapter \"%s\" from tensors needs its adapter_config.json "
                                "(config_dict)",
                                name);
        if (config_text == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "adapter config: out of memory");
        rc = wsync_adapter_req_manifest(bucket, &manifest, &len, err);
    }
    if (rc == WSYNC_OK)
        rc = wsync_driver_load_adapter(ctx->driver, name, path, manifest, len, config_text,
                                       &reloaded, err);
    free(manifest);
    free(config_text);
    if (rc != WSYNC_OK)
        return rc;
    /* Blocks computed with the old adapter must not be served for the new one. */
    if (reloaded && reset_on_reload)
        wsync_driver_reset_prefix_cache(ctx->driver, name);
    *extra = json_pack("{s:s, s:b}", "lora_name", name, "reloaded", reloaded);
    return WSYNC_OK;
}

wsync_result_t wsync_adapter_req_unload(wsync_shim_ctx_t *ctx, const char *name, json_t **extra,
                                        wsync_error_t *err)
{
    wsync_result_t rc = wsync_driver_unload_adapter(ctx->driver, name, err);
    if (rc == WSYNC_OK)
        *extra = json_pack("{s:s}", "lora_name", name);
    return rc;
}

json_t *wsync_adapter_req_config(const char *config, wsync_error_t *err)
{
    json_error_t jerr;
    json_t *c = config != NULL ? json_loads(config, 0, &jerr) : NULL;
    if (!json_is_object(c)) {
        json_decref(c);
        WSYNC_RECORD(err, WSYNC_ERR_BAD_ADAPTER, "adapter_config.json is not a JSON object");
        return NULL;
    }
    return c;
}
