/* PyTorch's CUDA storage handles, as torch.multiprocessing.reductions.reduce_tensor (through
 * UntypedStorage._share_cuda_) produces them in torch 2.x (c10/cuda/CUDACachingAllocator.cpp,
 * read at v2.11: SHAREABLE_HANDLE_VERSION 2):
 *
 *   byte 0   version, 2
 *   byte 1   type: 'c' (a cudaMalloc segment) or 'e' (an expandable segment)
 *   'c'      the 64-byte cudaIpcMemHandle_t of the segment's base (66 bytes in all)
 *   'e'      a header {int32 pid; 4 bytes padding; uint64 segment_size; uint64 n} (little-endian,
 *            x86-64 layout) then n int32 POSIX fds, one cuMem allocation of segment_size bytes
 *            each, in the exporter `pid`, mapped back to back (26 + 4 n bytes in all).
 *
 * The storage's offset inside the shared range is the storage offset reduce_tensor returns; it
 * travels as the manifest's buffer "offset". Decoding happens once, in parse_manifest, for every
 * backend: a 'c' handle becomes kind cuda_ipc (64 bytes), an 'e' handle kind torch_expandable
 * (the bytes after the type byte). Pure functions; thread safe. */
#ifndef WSYNC_TORCH_HANDLE_H
#define WSYNC_TORCH_HANDLE_H

#include <stdint.h>

#include "wsync_abi.h"

/* Bytes of a cudaIpcMemHandle_t and of a cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE), which
 * every backend checks without including CUDA. */
#define WSYNC_CUDA_IPC_HANDLE_BYTES 64u

#define WSYNC_TORCH_HANDLE_VERSION 2u
#define WSYNC_TORCH_TYPE_CUDA_MALLOC 'c'
#define WSYNC_TORCH_TYPE_EXPANDABLE 'e'
#define WSYNC_TORCH_SEGMENTS_HEADER 24u /* pid, padding, segment_size, n */
/* The most segments whose torch handle (2 + 24 + 4 n bytes) fits WSYNC_HANDLE_MAX: 25. */
#define WSYNC_TORCH_SEGMENTS_MAX ((WSYNC_HANDLE_MAX - 2u - WSYNC_TORCH_SEGMENTS_HEADER) / 4u)

/* An expandable-segment share, decoded. */
typedef struct wsync_torch_segments {
    int32_t pid;
    uint64_t segment_size;
    uint32_t n;
    int32_t fds[WSYNC_TORCH_SEGMENTS_MAX];
} wsync_torch_segments_t;

/* Whether `h` (len bytes) starts like a torch handle (version byte 2, type 'c' or 'e'). */
int wsync_torch_handle_is(const uint8_t *h, uint32_t len);

/* Turn torch's handle bytes (in, len) into the descriptor's kind and handle: 'c' -> cuda_ipc
 * (the 64 IPC bytes), 'e' -> torch_expandable (the payload after the type byte, checked with
 * wsync_torch_segments_decode). `field` names the manifest field in errors. BAD_MANIFEST naming
 * the byte and its value for an unknown version or type or a wrong length; the descriptor is
 * untouched on failure. */
wsync_result_t wsync_torch_handle_decode(const uint8_t *in, uint32_t len, const char *field,
                                         wsync_buffer_desc_t *d, wsync_error_t *err);

/* Decode a torch_expandable payload (the header and fds). BAD_MANIFEST when the length does not
 * match the header's n, n is 0 or above WSYNC_TORCH_SEGMENTS_MAX, segment_size is 0, or pid
 * or an fd is negative. */
wsync_result_t wsync_torch_segments_decode(const uint8_t *in, uint32_t len,
                                           wsync_torch_segments_t *out, wsync_error_t *err);

#endif
