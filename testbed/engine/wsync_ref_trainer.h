/* The reference trainer: the synthetic model's HF tensors staged bucket by bucket into one
 * retained staging buffer per engine TP rank (what each colocated trainer rank exports), the
 * manifests encoded into the chosen engine's request format by its shim, and the
 * consumed handshake before each reuse. The transport is the caller's (socket or in-process).
 * Not thread safe. */
#ifndef WSYNC_REF_TRAINER_H
#define WSYNC_REF_TRAINER_H

#include <jansson.h>
#include <stdint.h>
#include "wsync_loader.h"
#include "wsync_model.h"
#include "wsync_shim.h"

#define WSYNC_REF_MAX_RANKS 16

typedef struct wsync_ref_trainer_config {
    const char *engine; /* request format */
    const char *plugin; /* NULL: $WSYNC_PLUGIN or the default */
    wsync_model_config_t model;
    uint32_t ranks;
    uint64_t bucket_bytes;
    uint32_t timeout_ms;
    int packed; /* vLLM: packed buckets instead of per-tensor handles */
} wsync_ref_trainer_config_t;

/* Transport: deliver `msg` to engine rank r / return its reply (malloc'd; NULL on failure). */
typedef struct wsync_ref_transport {
    int (*send)(void *user, uint32_t rank, const char *msg);
    char *(*recv)(void *user, uint32_t rank);
    void *user;
} wsync_ref_transport_t;

typedef struct wsync_ref_trainer {
    wsync_ref_trainer_config_t cfg;
    const wsync_shim_t *shim;
    wsync_loader_t loader;
    wsync_host_t host;
    const wsync_consumer_ops_t *cops;
    const wsync_producer_ops_t *pops;
    struct wsync_consumer *mem; /* memory helpers only */
    struct wsync_staging *staging[WSYNC_REF_MAX_RANKS];
    uint64_t generation[WSYNC_REF_MAX_RANKS]; /* last published, per staging */
    int sent_buffer[WSYNC_REF_MAX_RANKS];     /* LMDeploy: flattened tensor already sent */
    wsync_model_t model;
    void *params;                /* plugin memory, the model packed */
    wsync_stage_tensor_t *stage; /* in the engine's order (order[i]: its model tensor) */
    size_t *order;
    size_t *bucket_first;
    size_t nbuckets;
    uint64_t version;
    /* Optional, for tests: edit each manifest (parsed) before it is encoded. */
    void (*mutate)(void *user, json_t *manifest);
    void *mutate_user;
} wsync_ref_trainer_t;

int wsync_ref_trainer_open(wsync_ref_trainer_t *t, const wsync_ref_trainer_config_t *cfg, char *why,
                           size_t len);
void wsync_ref_trainer_close(wsync_ref_trainer_t *t);

/* The engines were replaced (a new engine worker): buffers they held must be described again
 * (LMDeploy sends the flattened tensor only with the first bucket an engine sees). */
void wsync_ref_trainer_new_peer(wsync_ref_trainer_t *t);

/* "Training": write weight version k into the trainer's parameters. Blocking. */
wsync_result_t wsync_ref_trainer_fill(wsync_ref_trainer_t *t, uint64_t version, wsync_error_t *err);
/* Stage bucket b into every rank's staging, publish, encode. *msgs: a JSON array of request
 * messages (new reference) to deliver in order to every rank. */
wsync_result_t wsync_ref_trainer_publish(wsync_ref_trainer_t *t, size_t b, json_t **msgs,
                                         wsync_error_t *err);
/* Wait for *consumed* of the last published generation on every staging (after the acks). */
wsync_result_t wsync_ref_trainer_wait(wsync_ref_trainer_t *t, wsync_error_t *err);

/* A whole sync of version k over `tr`: fill, then per bucket publish, deliver, check every
 * reply, wait. 0 on success; on failure prints why (stderr) and returns 1. */
int wsync_ref_trainer_sync(wsync_ref_trainer_t *t, uint64_t version,
                           const wsync_ref_transport_t *tr);
/* Send one message to every rank and collect replies (array, new reference; NULL on a
 * transport failure). */
json_t *wsync_ref_trainer_exchange(wsync_ref_trainer_t *t, const wsync_ref_transport_t *tr,
                                   json_t *msg);

#endif
