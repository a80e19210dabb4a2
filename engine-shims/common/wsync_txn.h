/* Model-level update transactions (docs/SHIMS.md, "Update transactions"). A weight version is
 * begun (with what it will hold: a tensor count, bytes, optionally the names), filled by buckets
 * and committed only when everything expected arrived; until then the engine is told its weights
 * are mixed, and a version left unfinished (aborted, its producer gone, a newer begin) is never
 * reported as committed. Pure bookkeeping: the driver feeds it, the shims map engine requests
 * onto it. Not thread safe (one per driver). */
#ifndef WSYNC_TXN_H
#define WSYNC_TXN_H

#include <jansson.h>
#include <stdint.h>

#include "wsync_abi.h"

typedef enum wsync_txn_phase {
    WSYNC_TXN_CONSISTENT = 0, /* every weight is of `committed` (or none was ever written) */
    WSYNC_TXN_UPDATING = 1,   /* `version` is open; buckets may have been written */
    WSYNC_TXN_PARTIAL = 2     /* `version` was left unfinished after writing: weights are mixed */
} wsync_txn_phase_t;

typedef struct wsync_txn {
    wsync_txn_phase_t phase;
    uint64_t committed; /* last committed version, 0: none */
    uint64_t version;   /* the open (or last unfinished) version */
    int implicit;       /* begun by an engine request without wsync_begin: nothing declared */
    uint64_t expect_tensors, expect_bytes; /* 0: not declared */
    char **names;                          /* declared names (sorted), or NULL */
    uint8_t *seen;                         /* per declared name */
    size_t n_names;
    uint64_t buckets, tensors, bytes; /* applied in this version */
    uint64_t written;                 /* buckets that wrote engine parameters in place */
    int64_t producer_pid;             /* of the last bucket applied, 0: none */
    char reason[256];                 /* why PARTIAL */
} wsync_txn_t;

void wsync_txn_init(wsync_txn_t *t);
void wsync_txn_free(wsync_txn_t *t);

/* Open `version` declaring what it holds (names may be NULL). STALE_GENERATION naming both when
 * version is not newer than the committed one or older than the open one; an open version is
 * left PARTIAL ("abandoned by version N") when it had written anything. */
wsync_result_t wsync_txn_begin(wsync_txn_t *t, uint64_t version, uint64_t expect_tensors,
                               uint64_t expect_bytes, const char *const *names, size_t n_names,
                               wsync_error_t *err);
/* Declared tensor `name` is held by another engine rank (expert parallelism): count it as
 * arrived, with no bytes; the version's byte count can no longer be checked here (its tensor
 * count and names still are). No-op for a name not declared. */
void wsync_txn_elsewhere(wsync_txn_t *t, const char *name);
/* An engine request with no open version: open the next one, declaring nothing. */
void wsync_txn_begin_implicit(wsync_txn_t *t);
/* Before a bucket is written: every tensor (a manifest's) must be one the open version declared
 * (NOT_FOUND naming it and the version). No-op without declared names. */
wsync_result_t wsync_txn_check(const wsync_txn_t *t, const wsync_tensor_desc_t *tensors, size_t n,
                               wsync_error_t *err);
/* After a bucket was copied; wrote_live: it wrote engine parameters in place (not only the
 * shadows of rollback mode), so the weights are now mixed until the version commits. */
void wsync_txn_applied(wsync_txn_t *t, const wsync_tensor_desc_t *tensors, size_t n, int wrote_live,
                       int64_t producer_pid);
/* A bucket's copy ran and then failed (a digest mismatch, a NaN found while quantizing): it may
 * have written engine parameters, so the weights count as mixed; none of its tensors arrived. */
void wsync_txn_wrote(wsync_txn_t *t);
/* Commit the open version: refused (BAD_REQUEST naming counts and up to 4 missing names) unless
 * everything declared arrived; the version then stays open. */
wsync_result_t wsync_txn_commit(wsync_txn_t *t, uint64_t version, wsync_error_t *err);
/* Leave the open version unfinished: PARTIAL when it wrote anything (reason kept), else
 * CONSISTENT. Returns 1 when a version was open. */
int wsync_txn_abort(wsync_txn_t *t, const char *reason);
/* The state as JSON: {"state", "consistent", "committed", "update": {...}, "reason"}. */
json_t *wsync_txn_state(const wsync_txn_t *t);

#endif
