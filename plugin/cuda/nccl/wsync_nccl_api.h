/* The part of NCCL's C API the nccl transport uses, declared here so that wsync builds without
 * NCCL: libnccl.so.2 is dlopened at run time (wsync_nccl_load). Values and layouts follow NCCL's
 * src/nccl.h.in: ncclResult_t ncclSuccess = 0; ncclDataType_t ncclUint8 = 1;
 * NCCL_UNIQUE_ID_BYTES 128; ncclComm_t an opaque pointer; ncclCommInitRank takes the id by value.
 * Thread safety: the table is filled once under a lock; afterwards read-only. */
#ifndef WSYNC_NCCL_API_H
#define WSYNC_NCCL_API_H

#include <cuda_runtime_api.h>

#include "wsync_abi.h"

#define WSYNC_NCCL_UNIQUE_ID_BYTES 128
#define WSYNC_NCCL_SUCCESS 0
#define WSYNC_NCCL_IN_PROGRESS 7
#define WSYNC_NCCL_UINT8 1
#define WSYNC_NCCL_ROOT_RANK 0 /* the producer */

typedef struct wsync_nccl_unique_id {
    char internal[WSYNC_NCCL_UNIQUE_ID_BYTES];
} wsync_nccl_unique_id_t;
typedef struct wsync_nccl_comm *wsync_nccl_comm_t; /* ncclComm_t */
typedef int wsync_nccl_result_t;                   /* ncclResult_t */

typedef struct wsync_nccl_api {
    wsync_nccl_result_t (*get_unique_id)(wsync_nccl_unique_id_t *id);
    wsync_nccl_result_t (*comm_init_rank)(wsync_nccl_comm_t *comm, int nranks,
                                          wsync_nccl_unique_id_t id, int rank);
    wsync_nccl_result_t (*broadcast)(const void *sendbuff, void *recvbuff, size_t count,
                                     int datatype, int root, wsync_nccl_comm_t comm,
                                     cudaStream_t stream);
    wsync_nccl_result_t (*group_start)(void);
    wsync_nccl_result_t (*group_end)(void);
    wsync_nccl_result_t (*comm_destroy)(wsync_nccl_comm_t comm);
    wsync_nccl_result_t (*comm_abort)(wsync_nccl_comm_t comm);
    const char *(*get_error_string)(wsync_nccl_result_t result);
    char path[512]; /* the library that was loaded */
} wsync_nccl_api_t;

/* Load NCCL once per process and return its table. Search order: $WSYNC_NCCL_LIB (a file), then
 * "libnccl.so.2" through the dynamic loader's path, then the nvidia-nccl Python wheels'
 * site-packages/nvidia/nccl/lib under the usual prefixes, then /usr/local/cuda/lib*. NOT_SUPPORTED
 * with every path tried when none loads or a symbol is missing. Blocking; thread safe. The library
 * stays loaded. */
wsync_result_t wsync_nccl_load(const wsync_nccl_api_t **out, wsync_error_t *err);

/* Fail with NCCL's error string for `r`; `what` names the call. */
wsync_result_t wsync_nccl_fail(wsync_error_t *err, const wsync_nccl_api_t *api,
                               wsync_nccl_result_t r, const char *where, const char *what);

#endif
