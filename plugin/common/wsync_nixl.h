/* NIXL, the transfer library, as the transport of buffers that cross processes and hosts
 * (docs/DESIGN.md, "Beyond one host"). wsync never moves these bytes itself: it registers memory
 * with the process's NIXL agent (UCX backend), hands peers the agent's metadata inside manifests,
 * and asks for one-sided READs and WRITEs; UCX picks the lanes (shared memory, TCP, RDMA,
 * cuda_ipc).
 *
 * The library is NIXL's C API, libnixl_capi.so (NIXL 1.5.1, the nixl-cu12 / nixl-cu13 wheels),
 * opened with dlopen on first use: from WSYNC_NIXL_LIB when set (the Python package sets it to
 * the installed wheel's copy), else by name. A process without it runs every other buffer kind;
 * a NIXL call then fails with NOT_SUPPORTED naming what was tried.
 *
 * One agent per process, named "wsync-<host>-<pid>-<random>", shared by the producer and the
 * consumer roles; every call into NIXL holds one lock (the agent is made without NIXL's own
 * thread safety). */
#ifndef WSYNC_COMMON_NIXL_H
#define WSYNC_COMMON_NIXL_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

#define WSYNC_NIXL_NAME_MAX 96u  /* bytes of an agent name, NUL included */
#define WSYNC_NIXL_MD_MAX 65536u /* bytes of an agent's metadata wsync accepts */
#define WSYNC_NIXL_HANDLE_HEAD                                                                     \
    16u /* handle bytes: data address, control address, then the name                              \
         */

typedef struct wsync_nixl_reg wsync_nixl_reg_t;

/* One piece of a transfer: `bytes` at local address `local` and the peer's address `remote`. */
typedef struct wsync_nixl_span {
    uint64_t local;
    uint64_t remote;
    uint64_t bytes;
} wsync_nixl_span_t;

/* Load the library and make this process's agent (once). NOT_SUPPORTED when the library or its
 * UCX backend is missing, naming the path tried. */
wsync_result_t wsync_nixl_start(wsync_error_t *err);

/* This process's agent name (valid after wsync_nixl_start). */
const char *wsync_nixl_self(void);

/* Register `bytes` at `addr` (host memory; vram: device memory of CUDA device `dev`) with the
 * agent, so that peers may read or write it. Kept until wsync_nixl_deregister. */
wsync_result_t wsync_nixl_register(void *addr, uint64_t bytes, int vram, uint64_t dev,
                                   wsync_nixl_reg_t **out, wsync_error_t *err);
void wsync_nixl_deregister(wsync_nixl_reg_t *reg);

/* Registered ranges [start, end), none inside another, sorted by start (so by end too): memory
 * registered once and kept, by a producer (its segments) or a consumer (its destinations). */
typedef struct wsync_nixl_range {
    uint64_t start, end;
    wsync_nixl_reg_t *reg;
} wsync_nixl_range_t;
typedef struct wsync_nixl_ranges {
    wsync_nixl_range_t *at;
    size_t n, cap;
} wsync_nixl_ranges_t;

/* Make [start, end) covered by one range of the set: nothing when one holds it, else register it
 * (host memory unless vram), dropping the ranges it holds (a run that grew, a wider range of
 * one parameter). */
wsync_result_t wsync_nixl_cover(wsync_nixl_ranges_t *set, uint64_t start, uint64_t end, int vram,
                                wsync_error_t *err);
/* Deregister every range; the set is empty after. */
void wsync_nixl_ranges_end(wsync_nixl_ranges_t *set);

/* The agent's metadata now (it changes with each registration): a malloc'd copy for the caller
 * to free. */
wsync_result_t wsync_nixl_metadata(uint8_t **md, size_t *len, wsync_error_t *err);

/* Make the peer whose metadata is `md` known to the agent, unless the same bytes were loaded
 * for it already; its name is written to `name`. BAD_MANIFEST when NIXL refuses the bytes. */
wsync_result_t wsync_nixl_peer(const uint8_t *md, size_t len, char name[WSYNC_NIXL_NAME_MAX],
                               wsync_error_t *err);

/* 1 when the agent holds metadata of `peer`. */
int wsync_nixl_knows(const char *peer);

/* Move the spans between this process and `peer` (write: local to remote; else remote to local)
 * and wait for the transfer to end, up to timeout_ms. Local memory is host memory unless vram.
 * Every failure names the peer and `what` (the bucket): PEER_GONE when NIXL reports the peer
 * unreachable or unknown, TIMEOUT when the wait ran out, SYSTEM for other NIXL errors. */
wsync_result_t wsync_nixl_transfer(int write, const char *peer, const wsync_nixl_span_t *spans,
                                   size_t n, int vram, uint32_t timeout_ms, const char *what,
                                   wsync_error_t *err);

#endif
