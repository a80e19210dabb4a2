/* A stand-in plugin for the loader's negative paths. WSYNC_FIXTURE_MODE picks the behaviour:
 *   ok            valid empty tables          old           answers ABI version 0
 *   incompatible  returns INCOMPATIBLE        no_device     returns NO_DEVICE (a GPU-less CUDA)
 *   null_consumer consumer table NULL         small         plugin struct_size too small
 * Built as libwsync_cuda.so in its own directory so the default fallback can be tested. */
#include <stdlib.h>
#include <string.h>
#include "wsync_abi.h"

static const wsync_consumer_ops_t fixture_consumer = {.struct_size = sizeof(fixture_consumer),
                                                      .abi_version = 1};
static const wsync_producer_ops_t fixture_producer = {.struct_size = sizeof(fixture_producer),
                                                      .abi_version = 1};
static wsync_plugin_t fixture_plugin = {.struct_size = sizeof(fixture_plugin),
                                        .abi_version = 1,
                                        .name = "fixture",
                                        .version = "0.0.0",
                                        .consumer = &fixture_consumer,
                                        .producer = &fixture_producer};

__attribute__((visibility("default"))) wsync_result_t wsync_plugin_init(uint32_t *abi_version,
                                                                        const wsync_host_t *host,
                                                                        const wsync_plugin_t **out,
                                                                        wsync_error_t *err)
{
    const char *mode = getenv("WSYNC_FIXTURE_MODE");

    (void)host;
    (void)err;
    if (mode == NULL)
        mode = "ok";
    if (strcmp(mode, "incompatible") == 0) {
        *abi_version = 7;
        return WSYNC_ERR_INCOMPATIBLE;
    }
    if (strcmp(mode, "no_device") == 0)
        return WSYNC_ERR_NO_DEVICE;
    *abi_version = strcmp(mode, "old") == 0 ? 0 : 1;
    fixture_plugin.consumer = strcmp(mode, "null_consumer") == 0 ? NULL : &fixture_consumer;
    fixture_plugin.struct_size = strcmp(mode, "small") == 0 ? 8 : sizeof(fixture_plugin);
    *out = &fixture_plugin;
    return WSYNC_OK;
}
