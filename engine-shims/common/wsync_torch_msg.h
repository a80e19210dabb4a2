/* The manifest of tensors that live in one torch CUDA storage, named by torch's own IPC handle
 * (UntypedStorage._share_cuda_, plugin/common/wsync_torch_handle.h): no staging copy, the
 * engine's copy reads the trainer's storage. Encoded here, from what the trainer's torch gives,
 * so the manifest's text has one writer (wsync_manifest_emit). */
#ifndef WSYNC_TORCH_MSG_H
#define WSYNC_TORCH_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

/* handle: torch's bytes verbatim ('c' or 'e' form); bytes: the shared range's size; offset: the
 * storage's offset in it; pid: the exporter; device: "GPU-<uuid>". Tensors: names, torch dtype
 * names, ndims and the dims concatenated, byte offsets from the storage's start. The manifest
 * JSON (malloc'd), or NULL with err naming the bad value (a handle that is not torch's, an
 * unknown dtype, more dims than WSYNC_MAX_DIMS). */
char *wsync_torch_msg_manifest(const uint8_t *handle, uint32_t handle_len, uint64_t bytes,
                               uint64_t offset, int64_t pid, const char *device,
                               uint64_t generation, int finished, const char *const *names,
                               const char *const *dtypes, const uint32_t *ndims,
                               const int64_t *dims, const uint64_t *offsets, size_t n,
                               wsync_error_t *err);

#endif
