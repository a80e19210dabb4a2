/* Fan-out of one weight version from a trainer to many engine replicas (docs/DESIGN.md, "Beyond
 * one host"): who pulls what from whom so that the trainer's links are not the bottleneck, the
 * lower bound on the time, and the schedule's own time, simulated chunk by chunk.
 *
 * The model is `model_bytes` (as the engines hold it: FP8 is one byte a parameter). Each engine
 * replica is `tp` GPUs, GPU r holding 1/tp of the bytes; its GPUs pull in parallel, each at
 * `engine_gbs`. The trainer's `trainer_gpus` GPUs serve the version at `trainer_gbs` each (the
 * engines pull with one-sided READs; a trainer GPU serves the bytes it holds). Replicas that
 * hold the version serve it to the next, GPU r to GPU r, in chunks of `chunk_bytes` per GPU:
 * as many chains as the trainer can feed at a replica's full rate ("seeds"), each a pipelined
 * chain through the other replicas. A replica that joins later pulls the committed version from
 * any replica holding it, the trainer untouched. Pure functions. */
#ifndef WSYNC_FANOUT_H
#define WSYNC_FANOUT_H

#include <stdint.h>

typedef struct wsync_fanout_in {
    double model_bytes;
    uint32_t trainer_gpus;
    uint32_t replicas;
    uint32_t tp;
    double trainer_gbs; /* GB/s per trainer GPU out */
    double engine_gbs;  /* GB/s per engine GPU in, and out when it serves another replica */
    double chunk_bytes; /* per engine GPU */
} wsync_fanout_in_t;

typedef struct wsync_fanout {
    uint32_t seeds;        /* replicas the trainer feeds directly */
    uint32_t chain_len;    /* replicas in the longest chain, its seed included */
    uint64_t chunks;       /* per engine GPU */
    double bound_s;        /* max(the trainer's bytes over its links, one replica GPU's bytes) */
    const char *bound_why; /* which of the two */
    double seed_s;         /* per chunk, trainer to a seed */
    double hop_s;          /* per chunk, replica to replica */
    double time_s;         /* the schedule's time: the last replica's last chunk */
    double join_s;         /* a replica joining later, from a replica holding the version */
} wsync_fanout_t;

/* 0, or -1 when an input is zero or negative (the schedule is then not filled). */
int wsync_fanout_plan(const wsync_fanout_in_t *in, wsync_fanout_t *out);

/* Replica i's source: -1 the trainer, else the replica it pulls from. */
int64_t wsync_fanout_source(const wsync_fanout_t *f, uint32_t i);

#endif
