/* The torch-handle manifest (wsync_torch_msg.h). */
#include "wsync_torch_msg.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_manifest.h"
#include "wsync_torch_handle.h"

/* tensors[i] from the arrays (dims from *at on); -1 with err set on a bad value. */
static int torch_msg_tensor(const char *name, const char *dtype, uint32_t ndim, const int64_t *dims,
                            uint64_t offset, size_t i, wsync_tensor_desc_t *t, wsync_error_t *err)
{
    *t = (wsync_tensor_desc_t){.struct_size = sizeof(*t), .name = name, .offset = offset};
    t->dtype = dtype != NULL ? wsync_dtype_from_name(dtype) : WSYNC_DTYPE_INVALID;
    if (name == NULL || t->dtype == WSYNC_DTYPE_INVALID || ndim > WSYNC_MAX_DIMS ||
        (ndim > 0 && dims == NULL)) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                     "tensors[%zu] (%.80s): dtype \"%.32s\" and %u dims; want a name, a dtype "
                     "wsync knows and at most %d dims",
                     i, name != NULL ? name : "no name", dtype != NULL ? dtype : "", ndim,
                     WSYNC_MAX_DIMS);
        return -1;
    }
    uint64_t numel = 1;
    t->ndim = ndim;
    for (uint32_t k = 0; k < ndim; k++) {
        if (dims[k] < 0 || __builtin_mul_overflow(numel, (uint64_t)dims[k], &numel)) {
            WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "tensors[%zu] (%.80s): dim %u is %lld", i,
                         name, k, (long long)dims[k]);
            return -1;
        }
        t->shape[k] = dims[k];
    }
    t->nbytes = numel * wsync_dtype_size(t->dtype);
    return 0;
}

char *wsync_torch_msg_manifest(const uint8_t *handle, uint32_t handle_len, uint64_t bytes,
                               uint64_t offset, int64_t pid, const char *device,
                               uint64_t generation, int finished, const char *const *names,
                               const char *const *dtypes, const uint32_t *ndims,
                               const int64_t *dims, const uint64_t *offsets, size_t n,
                               wsync_error_t *err)
{
    wsync_manifest_t m = {.struct_size = sizeof(m),
                          .schema = WSYNC_MANIFEST_SCHEMA,
                          .generation = generation,
                          .finished = finished != 0};
    wsync_buffer_desc_t *b = &m.buffer;
    b->struct_size = sizeof(*b);
    if (handle == NULL || device == NULL || strlen(device) >= WSYNC_DEVICE_MAX ||
        (n > 0 && (names == NULL || dtypes == NULL || ndims == NULL || offsets == NULL))) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                     "torch manifest: the handle, a device name (< %d bytes) and the tensors' "
                     "names, dtypes, ndims and offsets are needed",
                     WSYNC_DEVICE_MAX);
        return NULL;
    }
    /* torch's bytes become the buffer's kind and handle as parse_manifest decodes them */
    if (wsync_torch_handle_decode(handle, handle_len, "buffer.handle", b, err) != WSYNC_OK)
        return NULL;
    b->bytes = bytes;
    b->base_offset = offset;
    b->pid = pid;
    memcpy(b->device, device, strlen(device) + 1);
    wsync_tensor_desc_t *t = calloc(n ? n : 1, sizeof(*t));
    if (t == NULL) {
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu tensors", n);
        return NULL;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (torch_msg_tensor(names[i], dtypes[i], ndims[i], dims != NULL ? dims + at : NULL,
                             offsets[i], i, &t[i], err) != 0) {
            free(t);
            return NULL;
        }
        at += ndims[i];
    }
    m.tensors = t;
    m.n_tensors = n;
    char *json = NULL;
    wsync_error_t e = {.struct_size = sizeof(e)};
    if (wsync_manifest_emit(&m, &json, &e) != WSYNC_OK)
        WSYNC_RECORD(err, e.code, "torch manifest: %s", e.message);
    free(t);
    return json;
}
