/* wsync's own request messages, encoded: the transaction methods and the weight checker's
 * request, as wsync_shim.c (wsync_shim_txn, wsync_shim_check) decodes them. Every trainer, C or
 * Python (through libwsync_shim.so), sends these texts; nobody writes them by hand. Each
 * function returns compact JSON text (malloc'd; free it) or NULL with err set. */
#ifndef WSYNC_TXN_MSG_H
#define WSYNC_TXN_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

/* {"method": "wsync_begin", "version": v, "pid": pid, "expect": {"tensors": n, "bytes": nbytes,
 * "names": [...]}}: version >= 1; pid >= 1 (the producer: gone, the version ends) or 0 to leave
 * it out. */
char *wsync_txn_msg_begin(uint64_t version, int64_t pid, const char *const *names, size_t n,
                          uint64_t nbytes, wsync_error_t *err);
/* {"method": "wsync_commit", "version": v} (v 0: the version begun). */
char *wsync_txn_msg_commit(uint64_t version, wsync_error_t *err);
/* {"method": "wsync_abort", "reason": reason} (reason may be NULL). */
char *wsync_txn_msg_abort(const char *reason, wsync_error_t *err);
/* {"method": "wsync_state"}. */
char *wsync_txn_msg_state(wsync_error_t *err);
/* {"method": "wsync_check", "tensors": [{"name", "dtype", "shape"}, ...]}: tensor i is names[i]
 * of dtypes[i] (torch's name, "bfloat16"), shape dims[off_i .. off_i + ndims[i]) where off_i is
 * the sum of the ndims before it. */
char *wsync_txn_msg_check(const char *const *names, const char *const *dtypes,
                          const uint32_t *ndims, const int64_t *dims, size_t n, wsync_error_t *err);

#endif
