/* Manifest schema v1 (docs/DESIGN.md §2): parse with complete validation, and emit. */
#ifndef WSYNC_COMMON_MANIFEST_H
#define WSYNC_COMMON_MANIFEST_H

#include "wsync_abi.h"
#include "wsync_torch_handle.h" /* WSYNC_CUDA_IPC_HANDLE_BYTES */

#define WSYNC_MANIFEST_SCHEMA 1u
/* A plan replay (wsync_manifest_t.replay): schema 2, so that a reader without plans refuses it
 * instead of taking it for an empty bucket. */
#define WSYNC_MANIFEST_SCHEMA_REPLAY 2u
#define WSYNC_MANIFEST_MAX_TENSORS (1u << 20) /* a bigger array is refused, not parsed */
#define WSYNC_MANIFEST_MAX_NAME 1024          /* bytes in one tensor name */
#define WSYNC_MANIFEST_MAX_SEGMENTS 65536u    /* segments of one direct manifest */

/* A parsed manifest and the storage behind its view. `view` is first, so the pointer handed out
 * through the ABI (&m->view) converts back with wsync_manifest_owned_from_view. */
typedef struct wsync_manifest_owned {
    wsync_manifest_t view;
    wsync_tensor_desc_t *tensors;
    char *names; /* every name, NUL-separated; view.tensors[i].name points in here */
    wsync_buffer_desc_t *segments;    /* direct mode; NULL otherwise */
    uint32_t *segment_of;             /* view.tensor_segment */
    char plan[WSYNC_PLAN_ID_MAX + 1]; /* view.plan points here when set */
} wsync_manifest_owned_t;

/* The plan forms of `text`, a manifest as publish returned it: id, its plan id (a wsync64 digest
 * of the segments and tensors members and their length: the same text of them, the same id);
 * *full, the text with "plan": id (the engine validates it and keeps the plan); *replay, the
 * schema-2 text naming it with the same head and segments and no tensors (both malloc'd).
 * NOT_SUPPORTED for a manifest with digests (each sync's own), INVALID_ARGUMENT for a text not
 * in the canonical form. */
wsync_result_t wsync_manifest_plan_forms(const char *text, size_t len,
                                         char id[WSYNC_PLAN_ID_MAX + 1], char **full, char **replay,
                                         wsync_error_t *err);

/* A plan replay carries no tensors and no digests (BAD_MANIFEST naming what it carries). */
wsync_result_t wsync_manifest_check_replay(const wsync_manifest_t *m, int had_digests,
                                           wsync_error_t *err);

/* Parse `len` bytes of JSON. On success every field has been checked: schema, generation >= 1,
 * known buffer kind, handle/event base64 (cuda_ipc handle exactly 64 bytes), bytes > 0, each
 * tensor's name (non-empty, unique, <= WSYNC_MANIFEST_MAX_NAME), dtype, shape (<= WSYNC_MAX_DIMS,
 * non-negative), nbytes == dtype size x prod(shape), offset + nbytes <= buffer bytes (no
 * overflow), digest syntax. Digests come either per tensor ("digest": "wsync64:<hex>") or in a
 * top-level "digests" blob of exactly 8 x n bytes; a tensor with both is refused. Members may come
 * in any order. Unknown fields are ignored. Errors are WSYNC_ERR_BAD_MANIFEST (or
 * OUT_OF_BOUNDS for extents, OUT_OF_MEMORY) with a message naming the field and value, e.g.
 * `tensors[3] ("model.norm.weight"): offset 96 + nbytes 8192 exceeds buffer bytes 4096`. */
wsync_result_t wsync_manifest_parse(const char *json, size_t len, wsync_manifest_owned_t **out,
                                    wsync_error_t *err);

/* A parse costs about 40 ns a byte and 1.3 KiB a tensor (measured: 262 144 tensors, 34 MB, in
 * 1.3 s and +315 MiB): the defaults bound one to about 0.35 s and 85 MiB. A bucket that needs
 * more raises them (the consumer config; EngineWorker(max_manifest_bytes=, max_manifest_tensors=)).
 */
#define WSYNC_MANIFEST_DEFAULT_MAX_BYTES (16ull << 20)
#define WSYNC_MANIFEST_DEFAULT_MAX_TENSORS (1ull << 16)

/* What a consumer accepts before it parses (wsync_consumer_config_t; 0: the defaults above). */
typedef struct wsync_manifest_limits {
    uint64_t max_bytes;
    uint64_t max_tensors;
} wsync_manifest_limits_t;

/* Refuse (BAD_MANIFEST, naming the size and the limit) a text longer than lim->max_bytes or
 * holding more JSON objects than lim->max_tensors plus the root's and the buffer's, counted in one
 * pass over the bytes outside strings: nothing is allocated, so a hostile manifest costs a scan,
 * not a parse. NULL lim: the defaults. The last `tail_len` bytes are known to hold
 * `tail_objects` objects (a cached tail, counted when stored; 0 and 0 for a text seen whole), so
 * only the bytes before them are scanned, with the answer a whole scan gives. */
wsync_result_t wsync_manifest_check_limits(const char *json, size_t len, size_t tail_len,
                                           uint64_t tail_objects,
                                           const wsync_manifest_limits_t *lim, wsync_error_t *err);
/* JSON objects ('{' outside strings) in json[0, len) that starts and ends outside a string. */
uint64_t wsync_manifest_objects(const char *json, size_t len);
void wsync_manifest_free(wsync_manifest_owned_t *m);

/* tensors[i] of m lies inside its buffer, or, with segments, inside segments[segment]
 * (OUT_OF_BOUNDS naming both otherwise). */
wsync_result_t wsync_manifest_check_tensor_extent(const wsync_manifest_t *m,
                                                  const wsync_tensor_desc_t *t, size_t i,
                                                  uint32_t segment, wsync_error_t *err);

static inline wsync_manifest_owned_t *wsync_manifest_owned_from_view(const wsync_manifest_t *v)
{
    return (wsync_manifest_owned_t *)(void *)v;
}

/* Emit `m` as compact JSON; *out is malloc'd (caller frees). The result parses back to an equal
 * manifest. Canonical form: members in the order wsync, generation, finished, buffer, digests,
 * tensors ("tensors" last, so the text ends with `,"tensors":[...]}`). When every tensor has a
 * digest they go in the top-level "digests" blob (base64 of n little-endian uint64, in tensor
 * order) and not in the tensor objects, so the tensors text of a bucket does not change between
 * generations (wsync_manifest_cache.h); otherwise each tensor with has_digest has its own
 * "digest" field and there is no blob. */
wsync_result_t wsync_manifest_emit(const wsync_manifest_t *m, char **out, wsync_error_t *err);
/* wsync_manifest_emit, and in *tail_at where its tail begins: the text from ",\"segments\":" on
 * (a direct manifest's segments and tensors, what a steady trainer repeats byte for byte), or
 * from ",\"tensors\":" on when m has no segments. */
wsync_result_t wsync_manifest_emit_split(const wsync_manifest_t *m, char **out, size_t *tail_at,
                                         wsync_error_t *err);
/* The text wsync_manifest_emit writes for `m`, given `tail` (tail_len bytes): what it wrote from
 * tail_at on for a manifest of the same segments and tensors. Writes m's head only (generation,
 * finished, buffer) and appends the tail, so m's segments and tensors are not read again; m's
 * tensors must still say whether they carry digests (a blob is part of the head). */
wsync_result_t wsync_manifest_emit_with_tail(const wsync_manifest_t *m, const char *tail,
                                             size_t tail_len, char **out, wsync_error_t *err);

/* Wire names of buffer kinds: "cuda_ipc", "host_shm", "cuda_vmm_fd". */
const char *wsync_buffer_kind_name(wsync_buffer_kind_t k);
wsync_buffer_kind_t wsync_buffer_kind_from_name(const char *name);

#endif
