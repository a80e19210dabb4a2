/* A minimal plugin for the negotiation tests, built several times with different supported
 * ranges (FIXTURE_MIN..FIXTURE_MAX) and names. Version 2 is a hypothetical future ABI whose
 * consumer table appends one member: given a v1 host, the plugin must hand out its v1 tables. */
#include <stddef.h>

#include "fixture_abi_v2.h"
#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_negotiate.h"

static wsync_result_t fixture_create(const wsync_consumer_config_v1_t *config,
                                     struct wsync_consumer **out, wsync_error_v1_t *err)
{
    (void)config;
    (void)out;
    return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED, "fixture %s has no consumer", FIXTURE_NAME);
}

static wsync_result_t fixture_future_op(int x)
{
    return x == 42 ? WSYNC_OK : WSYNC_ERR_INVALID_ARGUMENT;
}

static const wsync_consumer_ops_v1_t fixture_consumer_v1 = {
    .struct_size = sizeof(wsync_consumer_ops_v1_t),
    .abi_version = 1,
    .create = fixture_create,
};

static const fixture_consumer_v2_t fixture_consumer_v2 = {
    .v1 = {.struct_size = sizeof(fixture_consumer_v2_t),
           .abi_version = 2,
           .create = fixture_create},
    .future_op = fixture_future_op,
};

static const wsync_plugin_v1_t fixture_plugin_v1 = {
    .struct_size = sizeof(wsync_plugin_v1_t),
    .abi_version = 1,
    .name = FIXTURE_NAME,
    .version = "0.0.1",
    .consumer = &fixture_consumer_v1,
    .producer = NULL,
};

static const wsync_plugin_v1_t fixture_plugin_v2 = {
    .struct_size = sizeof(wsync_plugin_v1_t),
    .abi_version = 2,
    .name = FIXTURE_NAME,
    .version = "0.0.1",
    .consumer = &fixture_consumer_v2.v1,
    .producer = NULL,
};

__attribute__((visibility("default"))) wsync_result_t
wsync_plugin_init(uint32_t *abi_version, const wsync_host_v1_t *host, const wsync_plugin_v1_t **out,
                  wsync_error_v1_t *err)
{
    wsync_log_set_host(host);
    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "out is NULL");
    wsync_result_t r = wsync_negotiate(abi_version, FIXTURE_MIN, FIXTURE_MAX, FIXTURE_NAME, err);
    if (r != WSYNC_OK)
        return r;
    *out = *abi_version >= 2 ? &fixture_plugin_v2 : &fixture_plugin_v1;
    WSYNC_LOG_INFO("fixture %s answers ABI %u", FIXTURE_NAME, *abi_version);
    return WSYNC_OK;
}
