/* A view of one tensor's bytes, as a safetensors file and an adapter both describe it: name,
 * dtype, row-major packed shape, and `data` (not necessarily aligned: read it with memcpy). */
#ifndef WSYNC_ADAPTERS_TENSOR_VIEW_H
#define WSYNC_ADAPTERS_TENSOR_VIEW_H

#include <stdint.h>

#include "wsync_abi.h"

typedef struct wsync_tensor_view {
    const char *name;
    wsync_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wsync_tensor_view_t;

#endif
