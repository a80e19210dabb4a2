/* The control segment every producer buffer carries in shared memory (host_shm: the head of the
 * staging segment; cuda_ipc: a small segment named by the manifest's buffer.control). It holds
 * the ready/consumed generations with futex words for bounded waits, the count of consumers that
 * hold a mapping (the retire handshake), and both pids (liveness checks). Lock-free; every field
 * is accessed with C11 atomics; safe across processes. */
#ifndef WSYNC_COMMON_CONTROL_H
#define WSYNC_COMMON_CONTROL_H

#include <stdatomic.h>
#include <stdint.h>
#include "wsync_abi.h"

#define WSYNC_CONTROL_MAGIC 0x434e5953u /* "SYNC" */
#define WSYNC_CONTROL_VERSION 1u
#define WSYNC_CONTROL_SIZE 4096u /* bytes reserved; data of a host_shm segment starts after */
#define WSYNC_CONTROL_MAX_MAPPERS 64u

typedef struct wsync_control {
    uint32_t magic;
    uint32_t version;
    int64_t producer_pid;
    _Atomic int64_t consumer_pid; /* last consumer that mapped the buffer; 0 = none */
    _Atomic uint64_t ready_generation;
    _Atomic uint64_t consumed_generation;
    _Atomic uint32_t ready_seq;    /* futex word: bumped after every ready_generation store */
    _Atomic uint32_t consumed_seq; /* futex word: bumped after every consumed_generation store */
    _Atomic uint32_t mapped;       /* consumers currently holding a mapping */
    _Atomic uint32_t retired;      /* producer retired the buffer: consumers must close */
    uint64_t data_offset;          /* host_shm: offset of the data region in the segment */
    uint64_t data_bytes;
    /* One slot per open mapping: the pid holding it, 0 = free. Lets retire tell a consumer that
     * still maps the buffer from one that crashed while mapping it. */
    _Atomic int64_t mapper_pid[WSYNC_CONTROL_MAX_MAPPERS];
    /* The last generation whose manifest the producer made (set before publish returns it); 0
     * from a producer that predates the field. A manifest of a newer generation was never
     * published: refused at once instead of waited for. */
    _Atomic uint64_t published_generation;
} wsync_control_t;

/* Initialise a freshly created (zeroed) control block. */
void wsync_control_init(wsync_control_t *c, uint64_t data_offset, uint64_t data_bytes);
/* Check magic/version of a mapped one (BAD_MANIFEST with a message when it is not a control). */
wsync_result_t wsync_control_check(const wsync_control_t *c, wsync_error_t *err);

/* A consumer that maps the buffer attaches (takes a mapper slot with its pid, bumps `mapped`);
 * it detaches when it unmaps. BUSY when every slot is held by a live process. */
wsync_result_t wsync_control_attach(wsync_control_t *c, wsync_error_t *err);
void wsync_control_detach(wsync_control_t *c);
/* Mappings still held by live processes; slots of exited processes are reclaimed (and `mapped`
 * lowered), so a consumer that crashed while mapping does not block retire forever. *a_pid (may
 * be NULL) receives one live holder's pid for messages. */
uint32_t wsync_control_live_mappers(wsync_control_t *c, int64_t *a_pid);
/* The producer's retire handshake: BUSY, naming the buffer `name` and a live holder, while
 * live consumers map it; otherwise marks it retired (consumers must close) and returns OK. */
wsync_result_t wsync_control_retire(wsync_control_t *c, const char *name, wsync_error_t *err);

/* Store `generation` (monotonic max) and wake every waiter. */
void wsync_control_signal_ready(wsync_control_t *c, uint64_t generation);
void wsync_control_signal_consumed(wsync_control_t *c, uint64_t generation);

/* Block until ready/consumed generation >= `generation`, up to timeout_ms: a yielding spin for
 * the first 20 ms (a GPU's stream memory write wakes no futex), then 1 ms futex slices. TIMEOUT
 * names the generation waited for and the last one seen; PEER_GONE when `peer_pid` (if > 0) no
 * longer exists. */
wsync_result_t wsync_control_wait_ready(wsync_control_t *c, uint64_t generation,
                                        uint32_t timeout_ms, int64_t peer_pid, wsync_error_t *err);
wsync_result_t wsync_control_wait_consumed(wsync_control_t *c, uint64_t generation,
                                           uint32_t timeout_ms, int64_t peer_pid,
                                           wsync_error_t *err);

/* Producer: generation g's manifest exists (call before handing it out). */
void wsync_control_publish(wsync_control_t *c, uint64_t generation);
/* Consumer, before anything is enqueued: BAD_MANIFEST naming both generations when `generation`
 * is newer than the last published in buffer `name`. Its manifest cannot be the producer's (the
 * text exists only once publish made it); waiting for it would hold the engine until its timeout
 * and then make the producer's real generation look stale, jamming the trainer. */
wsync_result_t wsync_control_check_published(wsync_control_t *c, uint64_t generation,
                                             const char *name, wsync_error_t *err);

#endif
