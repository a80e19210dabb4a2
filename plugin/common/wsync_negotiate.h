/* Plugin side of the two-way ABI negotiation (see wsync_plugin_init in wsync_abi_v1.h). */
#ifndef WSYNC_COMMON_NEGOTIATE_H
#define WSYNC_COMMON_NEGOTIATE_H

#include "wsync_abi.h"

/* *abi_version in: the host's highest. Out: min(host, plugin_max) when >= plugin_min, else
 * plugin_min with WSYNC_ERR_INCOMPATIBLE (message names both ranges). */
wsync_result_t wsync_negotiate(uint32_t *abi_version, uint32_t plugin_min, uint32_t plugin_max,
                               const char *plugin_name, wsync_error_t *err);

#endif
