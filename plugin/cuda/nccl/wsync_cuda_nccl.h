/* The nccl transport (docs/MULTIGPU.md): for engines whose trainer is on another GPU or host,
 * where CUDA IPC cannot reach. One communicator per (producer, engine group): the producer is
 * rank 0 and broadcasts each bucket from its staging buffer; engine TP rank r (NCCL rank r + 1)
 * receives into its own retained receive buffer (allocated once, at open) and scatters it into
 * its parameters with the same validated, batched copy kernel as copy_weights, on the engine's
 * stream; *consumed* is recorded on that same stream, and the next broadcast into the receive
 * buffer waits for it. NCCL is dlopened (wsync_nccl_api.h); NVLink SHARP (NVLS) is kept off:
 * NCCL_NVLS_ENABLE=0 unless the caller set it.
 *
 * Not part of ABI v1: reached through this C API by tests and benchmarks; docs/MULTIGPU.md says
 * how it will appear in the ABI. A link is not thread safe; distinct links are independent. */
#ifndef WSYNC_CUDA_NCCL_H
#define WSYNC_CUDA_NCCL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "wsync_abi.h"
#include "wsync_nccl_api.h"

typedef struct wsync_nccl_link wsync_nccl_link_t;

/* Producer: a fresh communicator id to publish in the manifest's buffer.nccl.uid. Starts NCCL's
 * bootstrap listener in this process, which must then open rank 0. Blocking. */
wsync_result_t wsync_nccl_unique_id(wsync_nccl_unique_id_t *out, wsync_error_t *err);

typedef struct wsync_nccl_link_config {
    int device;             /* CUDA ordinal this rank runs on (made current) */
    uint32_t nranks;        /* 1 + engine ranks */
    int rank;               /* 0: producer; r + 1: engine TP rank r */
    uint64_t recv_bytes;    /* receive buffer capacity (>= the producer's staging bytes) */
    int alloc_recv_on_root; /* rank 0 also gets a receive buffer (loopback, 1-rank tests) */
} wsync_nccl_link_config_t;

/* Join the communicator `uid`: a collective, blocking until every rank has called it (bounded
 * by NCCL's own bootstrap timeout). Allocates the receive buffer and events once. Errors:
 * NOT_SUPPORTED (no NCCL), INVALID_ARGUMENT (rank outside [0, nranks)), OUT_OF_MEMORY, SYSTEM. */
wsync_result_t wsync_nccl_link_open(const wsync_nccl_link_config_t *cfg,
                                    const wsync_nccl_unique_id_t *uid, wsync_nccl_link_t **out,
                                    wsync_error_t *err);

/* Producer (rank 0): broadcast `count` bytes of `staging` (device memory of this rank's GPU) on
 * `stream`. Non-blocking; the staging buffer may be refilled by work enqueued after it on
 * `stream` (NCCL reads it in stream order). Every engine rank must call wsync_nccl_recv for the
 * same bucket, in the same order. */
wsync_result_t wsync_nccl_send(wsync_nccl_link_t *l, const void *staging, uint64_t count,
                               cudaStream_t stream, wsync_error_t *err);

/* Engine (rank > 0; or rank 0 with alloc_recv_on_root, then root_src is the staging): receive
 * `count` bytes of bucket `generation` into the retained receive buffer (the broadcast is
 * ordered after the work enqueued on `stream` before this call and after the previous bucket's
 * scatter), then run `ops`
 * (src_offset relative to the receive buffer) on `stream` in one launch and record *consumed*
 * on `stream`. Everything (ops against count, count against the buffer, generation newer than
 * the last) is validated before anything is enqueued; on error nothing is received or written
 * (the caller must then abort the communicator: the other ranks are inside the broadcast).
 * Non-blocking. WSYNC_COPY_VERIFY is not supported here (NOT_SUPPORTED). */
wsync_result_t wsync_nccl_recv(wsync_nccl_link_t *l, const void *root_src, uint64_t generation,
                               uint64_t count, const wsync_copy_op_t *ops, size_t n_ops,
                               cudaStream_t stream, uint32_t flags, wsync_error_t *err);

/* Plain broadcast of `count` bytes from send (root) into recv (every rank), on `stream`: the
 * benchmark's link peak. Non-blocking. */
wsync_result_t wsync_nccl_broadcast_raw(wsync_nccl_link_t *l, const void *send, void *recv,
                                        uint64_t count, cudaStream_t stream, wsync_error_t *err);

/* Block until the last recv's scatter is done (tests, shutdown). */
wsync_result_t wsync_nccl_wait_consumed(wsync_nccl_link_t *l, wsync_error_t *err);

/* The receive buffer (device memory, recv_bytes) or NULL; valid until close. */
void *wsync_nccl_recv_buffer(const wsync_nccl_link_t *l);

/* Leave the communicator and free everything. abort != 0: ncclCommAbort (after an error, when
 * peers may be stuck); else ncclCommDestroy, which waits for outstanding work. Blocking. */
void wsync_nccl_link_close(wsync_nccl_link_t *l, int abort);

#endif
