/* The CUDA backend's settings, read once when a consumer or a staging buffer is created and kept
 * in it; nothing of the copy path reads the environment.
 *
 * A product build (libwsync_cuda.so) takes the measured defaults (docs/PERFORMANCE.md) and two
 * variables a user sets: WSYNC_CUDA_STAGING_KIND (vmm | ipc) and WSYNC_CUDA_STATS (1: log the
 * IPC-open and launch counters after each call, at info level). The benchmarks' build of the same
 * sources (libwsync_cuda_tunable.so, compiled with WSYNC_CUDA_TUNABLE, never installed) also
 * takes each experiment's variable (WSYNC_CUDA_KERNEL_VARIANT, _BLOCKS_PER_SM, _DIGEST_VARIANT,
 * _QUANT_ORDER, _QUANT_FAST, _QUANT_AHEAD, _CE_PER_OP, _CE_SHARE, _CE_MIN_BYTES, _CE_LANES,
 * _CE_JOIN, _CE_BALANCE, _CONSUMED) and reads them again at every call, so a benchmark
 * compares variants in one process; it holds the kernel variants the product does not ship. */
#ifndef WSYNC_CUDA_TUNING_H
#define WSYNC_CUDA_TUNING_H

#include <stdint.h>

#include "wsync_abi.h"

#define WSYNC_CUDA_MAX_LANES 4

typedef int (*wsync_cuda_alloc_range_fn)(const void *p, uintptr_t *base, size_t *size);

/* How the copy engines take a share of a batch (wsync_cuda_split). */
typedef struct wsync_cuda_split_cfg {
    double share;       /* of the bytes of ops of min_bytes or more; 0: the kernel alone */
    uint64_t min_bytes; /* smaller ops stay with the kernel */
    int lanes;          /* streams the copy engines' share is dealt over */
    wsync_cuda_alloc_range_fn range; /* joins copies inside one allocation; NULL: never */
    int balance;                     /* 1: lanes balanced by bytes, splitting ops */
} wsync_cuda_split_cfg_t;

typedef enum wsync_cuda_quant_order {
    WSYNC_CUDA_QUANT_ORDER_MEASURED = 0, /* strided with the look-ahead kernel, else runs */
    WSYNC_CUDA_QUANT_ORDER_RUNS = 1,
    WSYNC_CUDA_QUANT_ORDER_STRIDED = 2
} wsync_cuda_quant_order_t;

typedef struct wsync_cuda_tuning {
    int kernel_variant; /* wsync_cuda_variant_t; -1: the measured default for the source kind */
    int blocks_per_sm;  /* 0: the variant's */
    int digest_variant; /* 0: the plugin's digest kernel */
    wsync_cuda_quant_order_t quant_order;
    int quant_generic; /* 1: full bf16 blocks through the general path */
    int quant_ahead;   /* 1: the look-ahead kernel where every op allows it */
    int ce_per_op;     /* 1: one cudaMemcpyAsync per op instead of one batch */
    wsync_cuda_split_cfg_t split;
    int consumed_host; /* 1: *consumed* written by a host function, not by the stream */
    int stats;         /* 1: log the IPC and launch counters after each call */
    wsync_buffer_kind_t staging_kind; /* 0: the default for this machine (wsync_cuda_vmm.c) */
} wsync_cuda_tuning_t;

/* *t as the product runs: the measured defaults (the copy engines join copies inside one
 * allocation, found by wsync_cuda_alloc_range), WSYNC_CUDA_STAGING_KIND and WSYNC_CUDA_STATS; in
 * the tunable build, each experiment's variable over them. */
void wsync_cuda_tuning_read(wsync_cuda_tuning_t *t);

/* The settings a call runs with: *t itself; in the tunable build read again first. */
const wsync_cuda_tuning_t *wsync_cuda_tuning_now(wsync_cuda_tuning_t *t);

#endif
