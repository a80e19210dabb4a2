/* Control-message transport used by the CLI, the reference engine and the tests: a Unix stream
 * socket carrying length-prefixed messages (4-byte little-endian length, then the bytes). wsync
 * defines the messages (JSON), not the transport; real frameworks carry the same JSON over their
 * own RPC. The accepting side checks the peer's uid (SO_PEERCRED) and refuses other users. */
#ifndef WSYNC_WIRE_H
#define WSYNC_WIRE_H

#include <stddef.h>
#include "wsync_abi.h"

#define WSYNC_WIRE_MAX_MESSAGE (256u << 20)

/* Returns a listening fd (socket file created with mode 0600) or -1 with err set. */
int wsync_wire_listen(const char *path, wsync_error_t *err);
/* Accept one peer within timeout_ms; refuses (closes, WSYNC_ERR_PERMISSION naming the uid) a peer
 * of another uid. Returns the fd or -1. */
int wsync_wire_accept(int listen_fd, int timeout_ms, wsync_error_t *err);
int wsync_wire_connect(const char *path, int timeout_ms, wsync_error_t *err);

wsync_result_t wsync_wire_send(int fd, const void *buf, size_t len, wsync_error_t *err);
/* *buf is malloc'd and NUL-terminated (caller frees). PEER_GONE on orderly close, TIMEOUT after
 * timeout_ms without a complete message, BAD_MANIFEST for a length over the maximum. */
wsync_result_t wsync_wire_recv(int fd, char **buf, size_t *len, int timeout_ms, wsync_error_t *err);

#endif
