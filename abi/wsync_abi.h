/*
 * wsync ABI — the current version. Include this; it aliases the newest frozen header.
 * Engines that must keep building against an older plugin include the frozen header they target.
 */
#ifndef WSYNC_ABI_H
#define WSYNC_ABI_H

#include "wsync_abi_v1.h"

#define WSYNC_ABI_VERSION WSYNC_ABI_VERSION_1     /* the newest version this header knows */
#define WSYNC_ABI_VERSION_MIN WSYNC_ABI_VERSION_1 /* the oldest one a host built on it accepts */

/* Sizes of the newest version. */
#define WSYNC_MAX_DIMS WSYNC_MAX_DIMS_V1
#define WSYNC_HANDLE_MAX WSYNC_HANDLE_MAX_V1
#define WSYNC_PLAN_ID_MAX WSYNC_PLAN_ID_MAX_V1
#define WSYNC_DEVICE_MAX WSYNC_DEVICE_MAX_V1
#define WSYNC_ERROR_MESSAGE_LEN WSYNC_ERROR_MESSAGE_LEN_V1
#define WSYNC_ERROR_WHERE_LEN WSYNC_ERROR_WHERE_LEN_V1

/* Tables and structs of the newest version: the frozen name less its version. The tables end in
 * _ops so that the opaque objects (wsync_consumer_t, wsync_staging_t) keep the plain names. */
typedef wsync_error_v1_t wsync_error_t;
typedef wsync_log_fn_v1_t wsync_log_fn_t;
typedef wsync_tensor_desc_v1_t wsync_tensor_desc_t;
typedef wsync_buffer_desc_v1_t wsync_buffer_desc_t;
typedef wsync_manifest_v1_t wsync_manifest_t;
typedef wsync_copy_op_v1_t wsync_copy_op_t;
typedef wsync_quant_v1_t wsync_quant_t;
typedef wsync_adapter_part_v1_t wsync_adapter_part_t;
typedef wsync_adapter_target_v1_t wsync_adapter_target_t;
typedef wsync_adapter_slot_v1_t wsync_adapter_slot_t;
typedef wsync_adapter_source_v1_t wsync_adapter_source_t;
typedef wsync_consumer_config_v1_t wsync_consumer_config_t;
typedef wsync_consumer_ops_v1_t wsync_consumer_ops_t;
typedef wsync_staging_config_v1_t wsync_staging_config_t;
typedef wsync_stage_tensor_v1_t wsync_stage_tensor_t;
typedef wsync_producer_ops_v1_t wsync_producer_ops_t;
typedef wsync_host_v1_t wsync_host_t;
typedef wsync_plugin_v1_t wsync_plugin_t;
typedef struct wsync_consumer wsync_consumer_t;
typedef struct wsync_handle wsync_handle_t;
typedef struct wsync_staging wsync_staging_t;

#endif /* WSYNC_ABI_H */
