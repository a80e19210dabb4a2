/* The "nccl" object of a manifest's buffer (docs/MULTIGPU.md):
 *   "buffer": { ..., "nccl": { "uid": "<base64 of the 128-byte ncclUniqueId>", "nranks": n + 1,
 *                               "root": 0, "count": <bytes broadcast for this bucket> } }
 * Rank layout: the producer is rank 0 (the root), engine TP rank r is NCCL rank r + 1. The
 * manifest parser ignores unknown fields, so this object needs no schema change: a consumer
 * that does not know it sees an ordinary cuda_ipc/cuda_vmm_fd manifest. Pure functions on
 * caller memory; thread safe. */
#ifndef WSYNC_NCCL_DESC_H
#define WSYNC_NCCL_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_nccl_api.h"

#define WSYNC_NCCL_MAX_RANKS 4096

typedef struct wsync_nccl_desc {
    wsync_nccl_unique_id_t uid;
    uint32_t nranks; /* 1 + engine ranks */
    uint32_t root;   /* always WSYNC_NCCL_ROOT_RANK */
    uint64_t count;  /* bytes of the staging buffer broadcast for this bucket */
} wsync_nccl_desc_t;

/* NCCL rank of engine TP rank r. */
static inline int wsync_nccl_engine_rank(uint32_t tp_rank)
{
    return (int)tp_rank + 1;
}

/* Bytes a bucket must broadcast: the end of its last tensor (max offset + nbytes). */
uint64_t wsync_nccl_bucket_count(const wsync_manifest_t *m);

/* Add d as buffer.nccl to the manifest text `json` (len bytes); *out is malloc'd compact JSON
 * (caller frees). BAD_MANIFEST when json has no buffer object; INVALID_ARGUMENT for a desc that
 * parse would refuse. */
wsync_result_t wsync_nccl_desc_emit(const char *json, size_t len, const wsync_nccl_desc_t *d,
                                    char **out, wsync_error_t *err);

/* Read buffer.nccl from the manifest text. *present = 0 and OK when there is none. Validates
 * completely: uid decodes to exactly 128 bytes, 1 <= nranks <= WSYNC_NCCL_MAX_RANKS, root == 0,
 * count <= buffer.bytes. BAD_MANIFEST names the field and value otherwise. */
wsync_result_t wsync_nccl_desc_parse(const char *json, size_t len, wsync_nccl_desc_t *d,
                                     int *present, wsync_error_t *err);

#endif
