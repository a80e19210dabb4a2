/* The two ends of a nixl buffer (WSYNC_BUFFER_NIXL), shared by the backends: the producer
 * registers its staging segment (control block and data) and names it in the manifest with its
 * agent's metadata; the consumer pulls the bytes its ops read into a landing region of its own,
 * checks the producer's control block around the pull, and writes *consumed* back into it.
 * Backends own only the memory (host or device) of the landing region. */
#ifndef WSYNC_COMMON_NIXL_BUFFER_H
#define WSYNC_COMMON_NIXL_BUFFER_H

#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_control.h"
#include "wsync_nixl.h"

/* ------------------------------------------------------------------ producer */

/* Register `bytes` at `segment` (a control block, then the data at data_offset) and make
 * `d` (kind, handle) name it for peers. */
typedef struct wsync_nixl_export {
    wsync_nixl_reg_t *reg;
    uint64_t control;
    uint64_t data;
} wsync_nixl_export_t;
wsync_result_t wsync_nixl_export(void *segment, uint64_t bytes, uint64_t data_offset,
                                 wsync_nixl_export_t *x, wsync_error_t *err);
void wsync_nixl_export_end(wsync_nixl_export_t *x);
/* Fill d's kind and handle for x; pid 0 (the producer may be on another host). */
void wsync_nixl_export_desc(const wsync_nixl_export_t *x, wsync_buffer_desc_t *d);
/* Direct mode: a segment of the producer's own memory at `start` (`bytes`), registered once (the
 * set keeps every registration until wsync_nixl_ranges_end), and `seg` rewritten to name it as
 * a nixl segment (handle: its address, 0 for the control block, the agent's name; pid 0). */
wsync_result_t wsync_nixl_segment(wsync_nixl_ranges_t *set, uint64_t start, uint64_t bytes,
                                  wsync_buffer_desc_t *seg, wsync_error_t *err);

/* The agent's metadata as base64 text for the manifest (malloc'd; the caller frees it). */
wsync_result_t wsync_nixl_export_peer(char **b64, wsync_error_t *err);

/* ------------------------------------------------------------------ consumer */

typedef struct wsync_nixl_buffer {
    char peer[WSYNC_NIXL_NAME_MAX];
    uint64_t remote_data;
    uint64_t remote_control; /* 0: a segment of a direct manifest (no control block) */
    uint8_t *landing;        /* the backend's: host or device memory of `bytes` */
    uint64_t bytes;
    int vram;
    wsync_nixl_reg_t *landing_reg;
    wsync_control_t *seen; /* host: the producer's control block as last read, then ... */
    uint64_t *word;        /* ... the consumed generation written back from here */
    wsync_nixl_reg_t *host_reg;
    char what[160];           /* "the bucket buffer at <address> of <peer>" in messages */
    wsync_nixl_ranges_t dsts; /* destinations pulled into, kept registered until close */
} wsync_nixl_buffer_t;

/* Decode d's handle (BAD_MANIFEST naming the field), check its peer is known (the manifest's
 * parse loaded it: NOT_FOUND otherwise) and register the landing region (none for a segment:
 * landing NULL). */
wsync_result_t wsync_nixl_buffer_open(const wsync_buffer_desc_t *d, void *landing, int vram,
                                      wsync_nixl_buffer_t *b, wsync_error_t *err);
void wsync_nixl_buffer_close(wsync_nixl_buffer_t *b);

/* Pull what ops read of `generation` into the landing region (their source bytes, at the same
 * offsets), after checking the producer published it, and check again after the pull that the
 * buffer still holds it (a producer that moved on tore the bytes: refused, nothing copied). */
wsync_result_t wsync_nixl_buffer_pull(wsync_nixl_buffer_t *b, const wsync_copy_op_t *ops, size_t n,
                                      uint64_t generation, uint32_t timeout_ms, wsync_error_t *err);

/* The same, straight into the ops' destinations (host memory unless the buffer's landing is
 * vram): no landing region, no copy after. Each destination's range up to dst + dst_extent is
 * registered on first use and kept until close. The ops must have been validated. */
wsync_result_t wsync_nixl_buffer_pull_into(wsync_nixl_buffer_t *b, const wsync_copy_op_t *ops,
                                           size_t n, uint64_t generation, uint32_t timeout_ms,
                                           wsync_error_t *err);
/* The same for a direct manifest's ops: their src_offset is an address in the producer (its
 * segments', validated), b the bucket's buffer (its control block, and the peer). */
wsync_result_t wsync_nixl_buffer_pull_segments(wsync_nixl_buffer_t *b, const wsync_copy_op_t *ops,
                                               size_t n, uint64_t generation, uint32_t timeout_ms,
                                               wsync_error_t *err);

/* Tell the producer `generation` is consumed: its buffer may be staged again. */
wsync_result_t wsync_nixl_buffer_consumed(wsync_nixl_buffer_t *b, uint64_t generation,
                                          uint32_t timeout_ms, wsync_error_t *err);

/* Load the peer metadata of a manifest's buffer `d` (base64 text of the "peer" field) into this
 * process's agent; `field` names it in messages. Nothing is loaded when d names this process's
 * own agent (NIXL moves bytes within one agent as well). */
wsync_result_t wsync_nixl_buffer_peer(const char *b64, const wsync_buffer_desc_t *d,
                                      const char *field, wsync_error_t *err);

#endif
