/* wsync's own request messages; see wsync_txn_msg.h. */
#include "wsync_txn_msg.h"

#include <jansson.h>
#include <stdlib.h>

#include "wsync_error.h"
#include "wsync_request.h"

/* The text of msg (stolen), or NULL with err. */
static char *txn_msg_text(json_t *msg, const char *what, wsync_error_t *err)
{
    char *text = msg != NULL ? wsync_req_dumps(msg) : NULL;
    json_decref(msg);
    if (text == NULL)
        WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "%s: no memory for the message", what);
    return text;
}

char *wsync_txn_msg_begin(uint64_t version, int64_t pid, const char *const *names, size_t n,
                          uint64_t nbytes, wsync_error_t *err)
{
    if (version == 0 || version > (uint64_t)INT64_MAX || pid < 0 || nbytes > (uint64_t)INT64_MAX ||
        (n > 0 && names == NULL)) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                     "wsync_begin: version %llu must be 1..2^63-1, pid %lld >= 0, names given "
                     "for %zu tensors",
                     (unsigned long long)version, (long long)pid, n);
        return NULL;
    }
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < n; i++) {
        json_t *s = names[i] != NULL ? json_string(names[i]) : NULL;
        if (s == NULL || json_array_append_new(list, s) != 0) {
            json_decref(list);
            WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                         "wsync_begin: names[%zu] is missing or not UTF-8 text", i);
            return NULL;
        }
    }
    json_t *msg = json_pack("{s:s, s:I, s:{s:I, s:I, s:o}}", "method", "wsync_begin", "version",
                            (json_int_t)version, "expect", "tensors", (json_int_t)n, "bytes",
                            (json_int_t)nbytes, "names", list);
    if (msg != NULL && pid > 0 && json_object_set_new(msg, "pid", json_integer(pid)) != 0) {
        json_decref(msg);
        msg = NULL;
    }
    return txn_msg_text(msg, "wsync_begin", err);
}

char *wsync_txn_msg_commit(uint64_t version, wsync_error_t *err)
{
    json_t *msg = json_pack("{s:s}", "method", "wsync_commit");
    if (msg != NULL && version > 0 &&
        json_object_set_new(msg, "version", json_integer((json_int_t)version)) != 0) {
        json_decref(msg);
        msg = NULL;
    }
    return txn_msg_text(msg, "wsync_commit", err);
}

char *wsync_txn_msg_abort(const char *reason, wsync_error_t *err)
{
    json_t *msg = json_pack("{s:s}", "method", "wsync_abort");
    json_t *why = reason != NULL ? json_string(reason) : NULL;
    if (reason != NULL && why == NULL) {
        json_decref(msg);
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "wsync_abort: the reason is not UTF-8 text");
        return NULL;
    }
    if (msg != NULL && why != NULL && json_object_set_new(msg, "reason", why) != 0) {
        json_decref(msg);
        msg = NULL;
    } else if (msg == NULL) {
        json_decref(why);
    }
    return txn_msg_text(msg, "wsync_abort", err);
}

char *wsync_txn_msg_state(wsync_error_t *err)
{
    return txn_msg_text(json_pack("{s:s}", "method", "wsync_state"), "wsync_state", err);
}

char *wsync_txn_msg_check(const char *const *names, const char *const *dtypes,
                          const uint32_t *ndims, const int64_t *dims, size_t n, wsync_error_t *err)
{
    if (n > 0 && (names == NULL || dtypes == NULL || ndims == NULL)) {
        WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                     "wsync_check: names, dtypes and ndims are needed for %zu tensors", n);
        return NULL;
    }
    json_t *list = json_array();
    size_t off = 0;
    for (size_t i = 0; list != NULL && i < n; i++) {
        json_t *shape = json_array();
        for (uint32_t k = 0; shape != NULL && k < ndims[i]; k++)
            if (dims == NULL || json_array_append_new(shape, json_integer(dims[off + k])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        off += ndims[i];
        json_t *t =
            shape != NULL && names[i] != NULL && dtypes[i] != NULL
                ? json_pack("{s:s, s:s, s:o}", "name", names[i], "dtype", dtypes[i], "shape", shape)
                : NULL;
        if (t == NULL || json_array_append_new(list, t) != 0) {
            json_decref(list);
            WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                         "wsync_check: tensors[%zu] has no name, dtype or shape, or they are not "
                         "UTF-8 text",
                         i);
            return NULL;
        }
    }
    return txn_msg_text(json_pack("{s:s, s:o}", "method", "wsync_check", "tensors", list),
                        "wsync_check", err);
}
