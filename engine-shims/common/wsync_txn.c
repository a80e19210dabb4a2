/* Update transactions. Contract in wsync_txn.h. */
#include "wsync_txn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

void wsync_txn_init(wsync_txn_t *t)
{
    memset(t, 0, sizeof(*t));
}

static void wsync_txn_drop_names(wsync_txn_t *t)
{
    for (size_t i = 0; i < t->n_names; i++)
        free(t->names[i]);
    free(t->names);
    free(t->seen);
    t->names = NULL;
    t->seen = NULL;
    t->n_names = 0;
}

void wsync_txn_free(wsync_txn_t *t)
{
    wsync_txn_drop_names(t);
}

static int wsync_txn_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Index of `name` among the declared names, or -1. */
static long wsync_txn_find(const wsync_txn_t *t, const char *name)
{
    size_t lo = 0, hi = t->n_names;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(t->names[mid], name);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static void wsync_txn_open(wsync_txn_t *t, uint64_t version, int implicit)
{
    t->phase = WSYNC_TXN_UPDATING;
    t->version = version;
    t->implicit = implicit;
    t->expect_tensors = t->expect_bytes = 0;
    t->buckets = t->tensors = t->bytes = t->written = 0;
    t->producer_pid = 0; /* learnt from this version's first bucket */
    t->reason[0] = '\0';
}

int wsync_txn_abort(wsync_txn_t *t, const char *reason)
{
    if (t->phase != WSYNC_TXN_UPDATING)
        return 0;
    /* nothing written: the weights are still all of the committed version */
    t->phase = t->written > 0 ? WSYNC_TXN_PARTIAL : WSYNC_TXN_CONSISTENT;
    snprintf(t->reason, sizeof(t->reason),
             "version %" PRIu64 " %s after %" PRIu64 " bucket(s), %" PRIu64 " tensor(s)",
             t->version, reason ? reason : "aborted", t->buckets, t->tensors);
    wsync_txn_drop_names(t);
    return 1;
}

wsync_result_t wsync_txn_begin(wsync_txn_t *t, uint64_t version, uint64_t expect_tensors,
                               uint64_t expect_bytes, const char *const *names, size_t n_names,
                               wsync_error_t *err)
{
    if (version == 0 || version <= t->committed)
        return WSYNC_RECORD(err, WSYNC_ERR_STALE_GENERATION,
                            "begin of version %" PRIu64 ": not newer than the committed version "
                            "%" PRIu64,
                            version, t->committed);
    if (t->phase != WSYNC_TXN_CONSISTENT && version < t->version)
        return WSYNC_RECORD(err, WSYNC_ERR_STALE_GENERATION,
                            "begin of version %" PRIu64 ": older than version %" PRIu64
                            ", which this engine has already begun",
                            version, t->version);
    if (names != NULL && expect_tensors != 0 && n_names != expect_tensors)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                            "begin of version %" PRIu64 ": %zu names for %" PRIu64 " tensors",
                            version, n_names, expect_tensors);
    char **copy = NULL;
    uint8_t *seen = NULL;
    if (names != NULL && n_names > 0) {
        copy = calloc(n_names, sizeof(*copy));
        seen = calloc(n_names, 1);
        for (size_t i = 0; copy != NULL && seen != NULL && i < n_names; i++)
            if (names[i] == NULL || (copy[i] = strdup(names[i])) == NULL) {
                for (size_t j = 0; j < i; j++)
                    free(copy[j]);
                free(copy);
                copy = NULL;
            }
        if (copy == NULL || seen == NULL) {
            free(copy);
            free(seen);
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "begin: %zu names", n_names);
        }
        qsort(copy, n_names, sizeof(*copy), wsync_txn_cmp);
        for (size_t i = 1; i < n_names; i++)
            if (strcmp(copy[i - 1], copy[i]) == 0) {
                wsync_error_t e = {.struct_size = sizeof(e)};
                WSYNC_RECORD(err != NULL ? err : &e, WSYNC_ERR_BAD_REQUEST,
                             "begin of version %" PRIu64 ": \"%.200s\" is declared twice", version,
                             copy[i]);
                for (size_t j = 0; j < n_names; j++)
                    free(copy[j]);
                free(copy);
                free(seen);
                return WSYNC_ERR_BAD_REQUEST;
            }
    }
    if (t->phase == WSYNC_TXN_UPDATING) {
        char why[64];
        snprintf(why, sizeof(why), "abandoned by the begin of version %" PRIu64, version);
        wsync_txn_abort(t, why);
    }
    wsync_txn_drop_names(t);
    wsync_txn_open(t, version, 0);
    t->expect_tensors = names != NULL && expect_tensors == 0 ? n_names : expect_tensors;
    t->expect_bytes = expect_bytes;
    t->names = copy;
    t->seen = seen;
    t->n_names = copy != NULL ? n_names : 0;
    return WSYNC_OK;
}

void wsync_txn_elsewhere(wsync_txn_t *t, const char *name)
{
    long k = t->names != NULL ? wsync_txn_find(t, name) : -1;
    if (k < 0 || t->seen[k])
        return;
    t->seen[k] = 1;
    t->tensors++;
    t->expect_bytes = 0;
}

void wsync_txn_begin_implicit(wsync_txn_t *t)
{
    const uint64_t next = (t->version > t->committed ? t->version : t->committed) + 1;
    wsync_txn_drop_names(t);
    wsync_txn_open(t, next, 1);
}

wsync_result_t wsync_txn_check(const wsync_txn_t *t, const wsync_tensor_desc_t *tensors, size_t n,
                               wsync_error_t *err)
{
    if (t->phase != WSYNC_TXN_UPDATING || t->names == NULL)
        return WSYNC_OK;
    for (size_t i = 0; i < n; i++)
        if (wsync_txn_find(t, tensors[i].name) < 0)
            return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND,
                                "tensor \"%.200s\" is not part of version %" PRIu64
                                " (its begin declared %zu tensors)",
                                tensors[i].name, t->version, t->n_names);
    return WSYNC_OK;
}

void wsync_txn_applied(wsync_txn_t *t, const wsync_tensor_desc_t *tensors, size_t n, int wrote_live,
                       int64_t producer_pid)
{
    t->buckets++;
    for (size_t i = 0; i < n; i++) {
        long k = t->names != NULL ? wsync_txn_find(t, tensors[i].name) : -1;
        if (k >= 0 && t->seen[k])
            continue; /* sent again: counted once */
        if (k >= 0)
            t->seen[k] = 1;
        t->tensors++;
        t->bytes += tensors[i].nbytes;
    }
    if (wrote_live) /* a bucket that wrote only shadows (rollback mode) leaves the weights */
        t->written++;
    if (producer_pid > 0)
        t->producer_pid = producer_pid;
}

void wsync_txn_wrote(wsync_txn_t *t)
{
    t->written++;
}

wsync_result_t wsync_txn_commit(wsync_txn_t *t, uint64_t version, wsync_error_t *err)
{
    if (t->phase != WSYNC_TXN_UPDATING || (version != 0 && version != t->version))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "commit of version %" PRIu64 ": %s",
                            version,
                            t->phase == WSYNC_TXN_UPDATING ? "another version is open"
                                                           : "no update is open (begin first)");
    const int short_tensors = t->expect_tensors != 0 && t->tensors != t->expect_tensors;
    const int short_bytes = t->expect_bytes != 0 && t->bytes != t->expect_bytes;
    if (short_tensors || short_bytes) {
        char missing[160] = "";
        size_t off = 0, shown = 0;
        for (size_t i = 0; i < t->n_names && shown < 4 && off + 8 < sizeof(missing); i++)
            if (!t->seen[i]) {
                off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s\"%.60s\"",
                                        shown ? ", " : "; missing ", t->names[i]);
                shown++;
            }
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_REQUEST,
                            "commit of version %" PRIu64 " refused: %" PRIu64 " of %" PRIu64
                            " tensors and %" PRIu64 " of %" PRIu64 " bytes arrived%s%s",
                            t->version, t->tensors, t->expect_tensors, t->bytes, t->expect_bytes,
                            missing,
                            t->n_names > 0 && shown < t->n_names - t->tensors ? ", ..." : "");
    }
    t->committed = t->version;
    t->phase = WSYNC_TXN_CONSISTENT;
    t->reason[0] = '\0';
    wsync_txn_drop_names(t);
    return WSYNC_OK;
}

json_t *wsync_txn_state(const wsync_txn_t *t)
{
    static const char *const phase[] = {"consistent", "updating", "partial"};
    json_t *s = json_pack("{s:s, s:b, s:I}", "state", phase[t->phase], "consistent",
                          t->phase == WSYNC_TXN_CONSISTENT ||
                              (t->phase == WSYNC_TXN_UPDATING && t->written == 0),
                          "committed", (json_int_t)t->committed);
    if (s != NULL && t->phase != WSYNC_TXN_CONSISTENT)
        json_object_set_new(
            s, "update",
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "version", (json_int_t)t->version,
                      "buckets", (json_int_t)t->buckets, "tensors", (json_int_t)t->tensors, "bytes",
                      (json_int_t)t->bytes, "expect_tensors", (json_int_t)t->expect_tensors,
                      "expect_bytes", (json_int_t)t->expect_bytes, "declared", !t->implicit));
    if (s != NULL && t->reason[0] != '\0')
        json_object_set_new(s, "reason", json_string(t->reason));
    return s;
}
