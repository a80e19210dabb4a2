/* Direct mode, producer side, for every backend (WSYNC_STAGING_DIRECT): a bucket's tensors named
 * where they live. The backend says which segment (an allocation it exported, as a buffer
 * descriptor) holds each tensor and where in it; this module validates the tensors as stage
 * does, gathers the distinct segments, and emits the manifest with segments. */
#ifndef WSYNC_COMMON_DIRECT_H
#define WSYNC_COMMON_DIRECT_H

#include "wsync_abi.h"
#include "wsync_layout.h"

/* The segment holding [src, src + nbytes) of tensor `name`: a descriptor (kind, handle, bytes,
 * pid, device; equal descriptors are one segment) and the tensor's offset in it. An error names
 * the tensor (e.g. memory the backend cannot export). *segment arrives zeroed, struct_size set. */
typedef wsync_result_t (*wsync_direct_locate_fn)(void *user, const char *name, const void *src,
                                                 uint64_t nbytes, wsync_buffer_desc_t *segment,
                                                 uint64_t *offset, wsync_error_t *err);

typedef struct wsync_direct {
    wsync_layout_t layout; /* the tensors, in packing order; offsets into their segments */
    wsync_buffer_desc_t *segments;
    size_t n_segments;
    uint32_t *tensor_segment; /* per layout tensor */
    const void **src;         /* per layout tensor: the caller's pointer it was located at */
    char *tail;               /* the last emit's text from its segments on (malloc'd), or NULL */
    size_t tail_len;
} wsync_direct_t;

/* Validate `t` (as wsync_layout_build: names, dtypes, shapes) and locate every tensor with bytes;
 * a tensor without bytes goes in segment 0 at offset 0. INVALID_ARGUMENT when no tensor has
 * bytes. On error *out is empty. */
wsync_result_t wsync_direct_build(const wsync_stage_tensor_t *t, size_t n,
                                  wsync_direct_locate_fn locate, void *user, wsync_direct_t *out,
                                  wsync_error_t *err);
/* The buckets a direct staging has staged (a sync of several buckets stages each through the one
 * staging, sync after sync), kept to stage them again cheaply: at most WSYNC_DIRECT_KEEP, the
 * one staged last named by `current`. Zero-initialised is empty. */
#define WSYNC_DIRECT_KEEP 64
typedef struct wsync_direct_set {
    wsync_direct_t *at;
    size_t n;
    size_t current;
    int have; /* at[current] is the bucket the next publish names */
} wsync_direct_set_t;

/* Stage `t` into the set. A steady trainer's bucket -- `t` the very input a kept bucket was built
 * from (names, dtypes, shapes, pointers), and locate still giving each tensor the same segment
 * and offset (for CUDA: the same allocation id) -- is that bucket again, with the text of its
 * last emit: no layout is built and the next emit writes only the manifest's head
 * (wsync_manifest_emit_with_tail). Otherwise a new build takes the place of the kept bucket of
 * the same first tensor (or of the oldest). Errors are wsync_direct_build's, in the same order,
 * and leave the set as it was. */
wsync_result_t wsync_direct_stage(wsync_direct_set_t *set, const wsync_stage_tensor_t *t, size_t n,
                                  wsync_direct_locate_fn locate, void *user, wsync_error_t *err);
/* The bucket staged last, or NULL. */
wsync_direct_t *wsync_direct_current(wsync_direct_set_t *set);
void wsync_direct_set_free(wsync_direct_set_t *set);
/* The manifest of `d` whose buffer (the synchronisation object) is `sync`. *json is malloc'd,
 * byte for byte wsync_manifest_emit's text; d keeps its tail for the next emit. */
wsync_result_t wsync_direct_emit(wsync_direct_t *d, const wsync_buffer_desc_t *sync,
                                 uint64_t generation, int finished, char **json,
                                 wsync_error_t *err);
void wsync_direct_free(wsync_direct_t *d);

/* Engines read a direct producer's memory through ptrace access (process_vm_readv, pidfd_getfd).
 * Under Yama's ptrace_scope 1 only an ancestor may; a producer that opts into direct mode lets
 * its engines (any process of this user) do so. Scopes 2 and 3 forbid it: the engine reports
 * PERMISSION. */
void wsync_direct_allow_readers(void);
/* Yama's kernel.yama.ptrace_scope: 0 without Yama, 1 when the setting cannot be read. */
int wsync_yama_ptrace_scope(void);

#endif
