/* The pieces of the manifest parser that the parse cache (wsync_manifest_cache.c) reuses, so a
 * cached parse checks the same things in the same order and reports the same messages as a full
 * parse. Private to plugin/common: it exposes jansson types. */
#ifndef WSYNC_COMMON_MANIFEST_PARTS_H
#define WSYNC_COMMON_MANIFEST_PARTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "wsync_manifest.h"

/* The top-level "digests" member: base64 of n little-endian uint64 wsync64 digests, one per
 * tensor in array order. Decoded by parse_head; its length is checked by apply_digests. */
typedef struct wsync_manifest_blob {
    uint8_t *bytes; /* malloc'd; NULL when absent */
    size_t len;     /* decoded bytes */
    size_t chars;   /* base64 characters */
    int present;
} wsync_manifest_blob_t;

void wsync_manifest_blob_free(wsync_manifest_blob_t *b);

/* Segments a full parse already read from a text's cached tail. */
typedef struct wsync_manifest_segs {
    const wsync_buffer_desc_t *at;
    size_t n;
} wsync_manifest_segs_t;

/* Every member except "tensors", in the full parse's order: root is an object, wsync,
 * generation, finished, buffer, segments, digests (syntax only). With `segs` (root then has no
 * "segments"), those segments take the place of root's, with the checks that read the rest of
 * the head. Fills m->view; on success *blob owns the decoded digests (free with
 * wsync_manifest_blob_free, also after an error). */
wsync_result_t wsync_manifest_parse_head(const json_t *root, const wsync_manifest_segs_t *segs,
                                         wsync_manifest_owned_t *m, wsync_manifest_blob_t *blob,
                                         wsync_error_t *err);

/* The value of "digests" (s: n characters, NUL-terminated) decoded into *blob, with the
 * messages of the full parse. */
wsync_result_t wsync_manifest_decode_digests(const char *s, size_t n, wsync_manifest_blob_t *blob,
                                             wsync_error_t *err);

/* tensors[i]: offset + nbytes <= buffer_bytes without overflow (OUT_OF_BOUNDS otherwise). */
wsync_result_t wsync_manifest_check_extent(const wsync_tensor_desc_t *t, size_t i,
                                           uint64_t buffer_bytes, wsync_error_t *err);

/* tensors[i]'s segment index k names one of m's segments (BAD_MANIFEST otherwise). */
wsync_result_t wsync_manifest_check_segment(const wsync_manifest_t *m, const wsync_tensor_desc_t *t,
                                            size_t i, uint64_t k, wsync_error_t *err);

/* After the tensors: the blob (if present) holds exactly 8 bytes per tensor and no tensor also
 * has its own "digest"; then every tensor takes its digest from the blob. */
wsync_result_t wsync_manifest_apply_digests(wsync_manifest_owned_t *m,
                                            const wsync_manifest_blob_t *blob, wsync_error_t *err);

/* wsync_manifest_parse, also reporting the number of members of the root object and whether it
 * had a "digests" blob (both only on success; either pointer may be NULL). */
wsync_result_t wsync_manifest_parse_ex(const char *json, size_t len, wsync_manifest_owned_t **out,
                                       size_t *root_members, int *had_blob, wsync_error_t *err);

/* A staged manifest's tensors (no segments): their byte ranges must not overlap (nbytes 0
 * excepted). BAD_MANIFEST naming both tensors. */
wsync_result_t wsync_manifest_check_disjoint(const wsync_tensor_desc_t *t, size_t n,
                                             wsync_error_t *err);

#endif
