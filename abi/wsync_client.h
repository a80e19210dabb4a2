/*
 * wsync client helpers: behaviour that engines want beside the frozen tables, kept out of the
 * frozen headers so it can change without an ABI version. Link wsync_client (static, PIC).
 */
#ifndef WSYNC_CLIENT_H
#define WSYNC_CLIENT_H

#include "wsync_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A short English name of `r` ("stale generation"); "unknown wsync result" for a code this
 * build does not know. Static storage; thread safe. */
const char *wsync_strerror(wsync_result_t r);
/* The name of `r` as the enum spells it without its prefix ("STALE_GENERATION"), or NULL for a
 * code this build does not know. The one table of result names: bindings ask it. */
const char *wsync_result_name(wsync_result_t r);
/* The index of the op whose failure `err` records into *op, and 1; 0 when the failure is not one
 * op's or err's struct_size predates the member (wsync_error_t.op, 0.1.8). */
int wsync_error_op(const wsync_error_t *err, uint64_t *op);
/* Record that err's failure is op `op`'s (when struct_size covers the members). */
void wsync_error_set_op(wsync_error_t *err, uint64_t op);
/* Forget err's op (a new failure, or err cleared). */
void wsync_error_clear_op(wsync_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* WSYNC_CLIENT_H */
