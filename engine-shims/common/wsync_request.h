/* Request plumbing the three shims share: building wsync manifests from an engine's tensor
 * metadata (with the bucket checks every format needs), the FlattenedTensorBucket codec that
 * SGLang and LMDeploy both use, TP-rank selection and replies. JSON through jansson.
 *
 * Ownership: functions returning json_t* return a new reference (caller decrefs); json_t*
 * arguments are borrowed. Thread safe (no shared state). */
#ifndef WSYNC_REQUEST_H
#define WSYNC_REQUEST_H

#include <jansson.h>
#include <stdint.h>
#include "wsync_abi.h"

/* A manifest under construction: {"wsync":1,"generation":g,"finished":f,"buffer":buffer,
 * "tensors":[]}. `buffer` is the wsync buffer object (as a producer publishes it). */
json_t *wsync_req_manifest_new(json_t *buffer, uint64_t generation, int finished);

/* Append one tensor after the checks that tell apart the ways a bucket can be wrong:
 *   numel != prod(shape)                               -> BAD_MANIFEST "numel"
 *   byte length != numel x dtype size                   -> BAD_MANIFEST "size"
 *   starts at or past the end of the buffer             -> OUT_OF_BOUNDS "offset past the buffer"
 *   starts inside but ends past the end                 -> BAD_MANIFEST "truncated bucket"
 * `numel` < 0: not given by the format (skip that check). `digest` may be NULL. */
wsync_result_t wsync_req_add_tensor(json_t *manifest, const char *name, const char *dtype,
                                    json_t *shape, int64_t numel, uint64_t start, uint64_t end,
                                    json_t *digest, wsync_error_t *err);

/* Bytes of a tensor of `dtype` and `shape` (a JSON array); 0 on success, -1 when either is
 * invalid (the later wsync_req_add_tensor says why). */
int wsync_req_tensor_bytes(const char *dtype, json_t *shape, uint64_t *out);

/* json_loadb of an engine request, with its long strings (a manifest's text, a base64 blob:
 * WSYNC_REQ_LONG_STRING bytes and more, top-level values or top-level arrays of them) copied
 * out by a scan for the closing quote instead of jansson's character-by-character string
 * parser, which costs more than the rest of a request together. The same object as json_loadb
 * gives; a long string with a \u escape, or any text the scan does not take, goes through
 * json_loadb whole. NULL (err filled) where json_loadb fails. */
#define WSYNC_REQ_LONG_STRING 512
json_t *wsync_req_loadb(const char *text, size_t len, json_error_t *err);

/* json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY), byte for byte, with long strings of printable
 * ASCII (a manifest's text: WSYNC_REQ_LONG_STRING bytes and more, up to four levels down)
 * escaped by a scan instead of jansson's per-character string writer. malloc'd; NULL when
 * json_dumps would fail or out of memory. */
char *wsync_req_dumps(const json_t *v);

/* Serialize a manifest for the driver; *text is malloc'd. */
wsync_result_t wsync_req_dump(json_t *manifest, char **text, size_t *len, wsync_error_t *err);

/* FlattenedTensorBucket (SGLang, LMDeploy): one flattened byte tensor and per-tensor metadata
 *   {"flattened_tensor": {"buffer": {...}}, "generation": g,
 *    "metadata": [{"name", "shape", "dtype", "start_idx", "end_idx", "numel", "digest"?}]}
 * start_idx / end_idx are byte offsets (a multi-dtype bucket is flattened as bytes).
 * Encode: from a manifest the producer published (JSON text); with_buffer 0 omits
 * flattened_tensor (a persistent staging buffer the engine already holds). */
json_t *wsync_req_bucket_encode(const char *manifest_json, int with_buffer, wsync_error_t *err);
/* Decode to a manifest. `buffer` overrides/fills in the flattened tensor (NULL: the bucket must
 * carry it). */
wsync_result_t wsync_req_bucket_decode(json_t *bucket, json_t *buffer, int finished,
                                       json_t **manifest, wsync_error_t *err);

/* The entry of a per-TP-rank list this worker reads: list[rank] when it has `size` entries,
 * list[0] when it has one (the same payload for every rank). BAD_MANIFEST otherwise. */
json_t *wsync_req_pick_rank(json_t *list, uint32_t rank, uint32_t size, const char *what,
                            wsync_error_t *err);

/* Typed field access with messages naming the field: 0 on success. */
int wsync_req_get_u64(json_t *obj, const char *key, uint64_t *out, wsync_error_t *err);
const char *wsync_req_get_str(json_t *obj, const char *key, wsync_error_t *err);
/* An optional boolean: `dflt` when absent, BAD_REQUEST naming the field and its value when it is
 * anything but true or false (a string "false" must not mean false, nor 0 mean true). */
int wsync_req_get_bool(json_t *obj, const char *key, int dflt, int *out, wsync_error_t *err);
/* A JSON value as text for a message (malloc'd, at most 80 characters). */
char *wsync_req_show(const json_t *v);

/* Replies: {"ok":true,"method":m,...extra} / {"ok":false,"method":m,"error":"<strerror>",
 * "code":n,"message":"..."}. `extra` (may be NULL) is merged and stolen. */
json_t *wsync_req_reply_ok(const char *method, json_t *extra);
json_t *wsync_req_reply_error(const char *method, wsync_result_t rc, const wsync_error_t *err);

#endif
