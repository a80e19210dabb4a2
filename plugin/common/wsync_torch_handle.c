/* See wsync_torch_handle.h. */
#include "wsync_torch_handle.h"

#include <string.h>

#include "wsync_error.h"

int wsync_torch_handle_is(const uint8_t *h, uint32_t len)
{
    return len >= 2 && h[0] == WSYNC_TORCH_HANDLE_VERSION &&
           (h[1] == WSYNC_TORCH_TYPE_CUDA_MALLOC || h[1] == WSYNC_TORCH_TYPE_EXPANDABLE);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

wsync_result_t wsync_torch_segments_decode(const uint8_t *in, uint32_t len,
                                           wsync_torch_segments_t *out, wsync_error_t *err)
{
    if (len < WSYNC_TORCH_SEGMENTS_HEADER)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "torch expandable-segment handle: %u bytes after the type byte, the "
                          "header alone is %u",
                          len, WSYNC_TORCH_SEGMENTS_HEADER);
    wsync_torch_segments_t s = {.pid = le32(in), .segment_size = le64(in + 8)};
    uint64_t n = le64(in + 16);
    if (n == 0 || n > WSYNC_TORCH_SEGMENTS_MAX)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "torch expandable-segment handle names %llu segments; wsync takes 1 to "
                          "%u (the ABI's %d handle bytes): export a smaller storage, or stage "
                          "through wsync's producer",
                          (unsigned long long)n, WSYNC_TORCH_SEGMENTS_MAX, WSYNC_HANDLE_MAX);
    if ((uint64_t)len != WSYNC_TORCH_SEGMENTS_HEADER + 4 * n)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "torch expandable-segment handle: header says %llu segments (%llu "
                          "bytes), got %u bytes",
                          (unsigned long long)n,
                          (unsigned long long)(WSYNC_TORCH_SEGMENTS_HEADER + 4 * n), len);
    if (s.pid <= 0 || s.segment_size == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "torch expandable-segment handle: pid %d, segment_size %llu (both must "
                          "be > 0)",
                          (int)s.pid, (unsigned long long)s.segment_size);
    s.n = (uint32_t)n;
    for (uint32_t i = 0; i < s.n; i++) {
        s.fds[i] = le32(in + WSYNC_TORCH_SEGMENTS_HEADER + 4 * i);
        if (s.fds[i] < 0)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "torch expandable-segment handle: fd %u is %d", i, (int)s.fds[i]);
    }
    *out = s;
    return WSYNC_OK;
}

wsync_result_t wsync_torch_handle_decode(const uint8_t *in, uint32_t len, const char *field,
                                         wsync_buffer_desc_t *d, wsync_error_t *err)
{
    if (len < 2 || in[0] != WSYNC_TORCH_HANDLE_VERSION)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: byte 0 of a torch handle is its version, %u; got %s%u (this "
                          "wsync reads torch's version %u handles)",
                          field, WSYNC_TORCH_HANDLE_VERSION, len < 1 ? "no byte, length " : "",
                          len < 1 ? len : in[0], WSYNC_TORCH_HANDLE_VERSION);
    if (len < 2 || (in[1] != WSYNC_TORCH_TYPE_CUDA_MALLOC && in[1] != WSYNC_TORCH_TYPE_EXPANDABLE))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "%s: byte 1 of a torch handle is its type, 'c' (0x63) or 'e' (0x65); "
                          "got 0x%02x",
                          field, len < 2 ? 0u : in[1]);
    if (in[1] == WSYNC_TORCH_TYPE_CUDA_MALLOC) {
        if (len != 2 + WSYNC_CUDA_IPC_HANDLE_BYTES)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "%s: a torch 'c' handle is 66 bytes (version, type, the 64-byte "
                              "cudaIpcMemHandle_t), got %u",
                              field, len);
        d->kind = WSYNC_BUFFER_CUDA_IPC;
        memmove(d->handle, in + 2, WSYNC_CUDA_IPC_HANDLE_BYTES);
        d->handle_len = WSYNC_CUDA_IPC_HANDLE_BYTES;
        return WSYNC_OK;
    }
    wsync_torch_segments_t s;
    wsync_result_t r = wsync_torch_segments_decode(in + 2, len - 2, &s, err);
    if (r != WSYNC_OK)
        return r;
    d->kind = WSYNC_BUFFER_TORCH_EXPANDABLE;
    memmove(d->handle, in + 2, len - 2);
    d->handle_len = len - 2;
    return WSYNC_OK;
}
