/* Pieces every wsync subcommand shares: the logger handed to plugins, plugin loading with a
 * printed diagnosis, a monotonic clock and JSON control messages over the wire. The CLI reaches
 * plugins through the ABI only (engine-shims/common/wsync_loader.h), so it runs with any plugin. */
#ifndef WSYNC_CLI_H
#define WSYNC_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "wsync_loader.h"

/* The commands wsync holds itself: argv[0] is the command name; return the exit status. The
 * others (demo, plan, bench) are the programs wsync-<command> beside the executable, run with
 * the same arguments by wsync_main.c. */
int wsync_cmd_info(int argc, char **argv);
int wsync_cmd_inspect(int argc, char **argv);

/* The host struct given to plugins: logs to stderr at or above $WSYNC_LOG_LEVEL
 * (error|warn|info|debug, default warn), prefixed with `who`. Thread safe. `who` must outlive it.
 */
void wsync_cli_host(wsync_host_t *host, const char *who);

/* Load `path` (NULL: the loader's default). On failure prints why to stderr and returns non-zero.
 */
int wsync_cli_load(wsync_loader_t *l, const char *path, const wsync_host_t *host);

/* Seconds on CLOCK_MONOTONIC. */
double wsync_cli_now(void);

/* Print "wsync <who>: <what> failed: <code>: <message>" to stderr; returns 1 (an exit status). */
int wsync_cli_report(const char *who, const char *what, wsync_result_t rc,
                     const wsync_error_t *err);

/* Send a JSON object (reference stolen) on fd. 0 on success, else prints and returns 1. */
int wsync_cli_send_json(int fd, json_t *msg, const char *who);
/* Receive one message and parse it as a JSON object whose "type" equals `type`; on any failure
 * (timeout, peer gone, wrong type, {"ok": false}) prints why and returns NULL. Caller decrefs. */
json_t *wsync_cli_recv_json(int fd, const char *type, int timeout_ms, const char *who);

/* Directory of the running executable into out (no trailing slash). 0 on success. */
int wsync_cli_exe_dir(char *out, size_t len);

/* Path of the program `name` beside the running executable into out. 0 on success, -1 when the
 * executable's directory is unknown or the path does not fit. */
int wsync_cli_sibling(char *out, size_t len, const char *name);

/* Replace this process with `path`, run as `path [sub] argv[1] .. argv[argc-1]` (sub may be NULL),
 * after flushing stdout. Returns only on failure, with errno saying why. */
void wsync_cli_exec(const char *path, const char *sub, int argc, char **argv);

#endif
