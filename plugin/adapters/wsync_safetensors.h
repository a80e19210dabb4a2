/* Read-only access to a .safetensors file: an 8-byte little-endian header length N, N bytes of
 * JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
 * then the data; offsets are relative to the first byte after the header.
 *
 * wsync_safetensors_open maps the file read-only and validates the whole header against the file
 * size before returning; nothing of the file is trusted afterwards without that check. */
#ifndef WSYNC_ADAPTERS_SAFETENSORS_H
#define WSYNC_ADAPTERS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "wsync_abi.h"
#include "wsync_tensor_view.h"

#define WSYNC_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u) /* bigger headers are refused */

typedef struct wsync_safetensors wsync_safetensors_t;

/* One tensor. Pointers stay valid until wsync_safetensors_close; `data` points into the
 * read-only mapping (not aligned: read it with memcpy). */
typedef wsync_tensor_view_t wsync_st_tensor_t;

/* Map `path` and validate it: header length within the file and <= WSYNC_SAFETENSORS_MAX_HEADER,
 * header a JSON object without duplicate keys, every entry with a known dtype, a shape of at most
 * WSYNC_MAX_DIMS non-negative integers, data_offsets [begin, end] with begin <= end <= data size
 * and end - begin == dtype size x prod(shape), entries neither overlapping nor leaving holes
 * (the safetensors format requires the data to be fully indexed), __metadata__ an object of
 * strings. Errors: NOT_FOUND (no file), SYSTEM (open/mmap), BAD_ADAPTER (format),
 * OUT_OF_BOUNDS (offsets), OUT_OF_MEMORY. *out is owned by the caller. Blocking (file I/O). */
wsync_result_t wsync_safetensors_open(const char *path, wsync_safetensors_t **out,
                                      wsync_error_t *err);

/* Validate an in-memory image (same rules). `bytes` is borrowed and must outlive *out. */
wsync_result_t wsync_safetensors_open_memory(const void *bytes, size_t len, const char *label,
                                             wsync_safetensors_t **out, wsync_error_t *err);

/* Unmap and free. Safe with NULL. Every pointer obtained from `st` becomes invalid. */
void wsync_safetensors_close(wsync_safetensors_t *st);

/* The file's whole read-only mapping (page aligned; for an in-memory image, the image): what a
 * producer registers to stage straight from the file (register_host). */
void wsync_safetensors_mapping(const wsync_safetensors_t *st, const void **base, size_t *len);

/* Number of tensors (the __metadata__ entry is not one). */
size_t wsync_safetensors_count(const wsync_safetensors_t *st);

/* All count tensors, an array in ascending data offset order (NULL when there are none). */
const wsync_st_tensor_t *wsync_safetensors_tensors(const wsync_safetensors_t *st);

/* The i-th tensor in ascending data offset order; NULL when i >= count. */
const wsync_st_tensor_t *wsync_safetensors_at(const wsync_safetensors_t *st, size_t i);

/* The tensor called `name`, or NULL. */
const wsync_st_tensor_t *wsync_safetensors_lookup(const wsync_safetensors_t *st, const char *name);

/* Value of __metadata__[key], or NULL. */
const char *wsync_safetensors_metadata(const wsync_safetensors_t *st, const char *key);

/* A tensor to write: `data` holds nbytes = dtype size x prod(shape) bytes. */
typedef struct wsync_st_write_tensor {
    const char *name;
    wsync_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS];
    const void *data;
} wsync_st_write_tensor_t;

/* Write a safetensors file (tests and tools). `metadata` may be NULL, else an object of strings
 * (borrowed). Tensors are laid out in the given order. Blocking. */
wsync_result_t wsync_safetensors_write(const char *path, const wsync_st_write_tensor_t *tensors,
                                       size_t n, const json_t *metadata, wsync_error_t *err);

#endif
