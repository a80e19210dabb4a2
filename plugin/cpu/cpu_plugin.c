/* Entry point of libwsync_cpu.so: ABI negotiation and the static member tables. */
#include "cpu_internal.h"
#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_negotiate.h"

#ifndef WSYNC_PLUGIN_NAME /* a fixture build names itself (tests/fixtures) */
#define WSYNC_PLUGIN_NAME "cpu"
#endif

#ifndef WSYNC_VERSION_STRING
#define WSYNC_VERSION_STRING "0.0.0"
#endif

static const wsync_consumer_ops_v1_t wsync_cpu_consumer_table = {
    .struct_size = sizeof(wsync_consumer_ops_v1_t),
    .abi_version = WSYNC_ABI_VERSION_1,
    .create = wsync_cpu_consumer_create,
    .parse_manifest = wsync_cpu_parse_manifest,
    .manifest_free = wsync_cpu_manifest_free,
    .open_handle = wsync_cpu_open_handle,
    .close_handle = wsync_cpu_close_handle,
    .copy_weights = wsync_cpu_copy_weights,
    .record_consumed = wsync_cpu_record_consumed,
    .hot_load_adapter = wsync_cpu_hot_load_adapter,
    .enqueue_host_fn = wsync_cpu_enqueue_host_fn,
    .finalize = wsync_cpu_consumer_finalize,
    .stream_create = wsync_cpu_consumer_stream_create,
    .stream_destroy = wsync_cpu_consumer_stream_destroy,
    .stream_synchronize = wsync_cpu_consumer_stream_synchronize,
    .unload_adapter = wsync_cpu_unload_adapter,
    .mem_alloc = wsync_cpu_mem_alloc,
    .mem_free = wsync_cpu_mem_free,
    .mem_copy = wsync_cpu_mem_copy,
    .copy_segments = wsync_cpu_copy_segments,
    .digest_regions = wsync_cpu_digest_regions,
    .copy_quantized = wsync_cpu_copy_quantized,
};

static const wsync_producer_ops_v1_t wsync_cpu_producer_table = {
    .struct_size = sizeof(wsync_producer_ops_v1_t),
    .abi_version = WSYNC_ABI_VERSION_1,
    .create = wsync_cpu_staging_create,
    .stage = wsync_cpu_stage,
    .publish = wsync_cpu_publish,
    .wait_consumed = wsync_cpu_wait_consumed,
    .retire = wsync_cpu_retire,
    .stream_create = wsync_cpu_staging_stream_create,
    .stream_destroy = wsync_cpu_staging_stream_destroy,
    .stream_synchronize = wsync_cpu_staging_stream_synchronize,
    .read_back = wsync_cpu_read_back,
    .register_host = wsync_cpu_register_host,
    .unregister_host = wsync_cpu_unregister_host,
};

static const wsync_plugin_v1_t wsync_cpu_plugin = {
    .struct_size = sizeof(wsync_plugin_v1_t),
    .abi_version = WSYNC_ABI_VERSION_1,
    .name = WSYNC_PLUGIN_NAME,
    .version = WSYNC_VERSION_STRING,
    .consumer = &wsync_cpu_consumer_table,
    .producer = &wsync_cpu_producer_table,
};

__attribute__((visibility("default"))) wsync_result_t
wsync_plugin_init(uint32_t *abi_version, const wsync_host_v1_t *host, const wsync_plugin_v1_t **out,
                  wsync_error_v1_t *err)
{
    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "out is NULL; pass where the plugin tables should be returned");
    *out = NULL;
    /* The logger first, so a failed negotiation is logged through it. */
    wsync_log_set_host(host);
    wsync_result_t r = wsync_negotiate(abi_version, WSYNC_ABI_VERSION_1, WSYNC_ABI_VERSION_1,
                                       WSYNC_PLUGIN_NAME, err);
    if (r != WSYNC_OK)
        return r;
    *out = &wsync_cpu_plugin;
    return WSYNC_OK;
}
