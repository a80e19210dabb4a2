/* Plugin side of the ABI negotiation: answer the highest common version or our minimum. */
#include "wsync_negotiate.h"

#include "wsync_error.h"
#include "wsync_log.h"

wsync_result_t wsync_negotiate(uint32_t *abi_version, uint32_t plugin_min, uint32_t plugin_max,
                               const char *plugin_name, wsync_error_t *err)
{
    const char *name = plugin_name ? plugin_name : "?";

    if (abi_version == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "plugin %s: abi_version is NULL; pass the host's highest ABI version",
                          name);
    if (plugin_min == 0 || plugin_min > plugin_max)
        return WSYNC_FAIL(err, WSYNC_ERR_INTERNAL, "plugin %s: bad supported range %u..%u", name,
                          plugin_min, plugin_max);
    uint32_t host_max = *abi_version;
    if (host_max < plugin_min) {
        *abi_version = plugin_min;
        return WSYNC_FAIL(err, WSYNC_ERR_INCOMPATIBLE,
                          "plugin %s supports ABI versions %u..%u but the host offers at most %u; "
                          "use an older plugin or a newer host",
                          name, plugin_min, plugin_max, host_max);
    }
    *abi_version = host_max < plugin_max ? host_max : plugin_max;
    WSYNC_LOG_DEBUG("plugin %s: host offers ABI %u, plugin supports %u..%u, using %u", name,
                    host_max, plugin_min, plugin_max, *abi_version);
    return WSYNC_OK;
}
