/* Shared by the fault, isolation and soak tests: the CPU plugin loaded by path, child processes
 * that run a role of this same executable (fork + exec, so a child never inherits plugin worker
 * threads), framed messages over a socketpair, and /proc counters. Test code only: every helper
 * fails the calling test (cmocka assert) instead of returning an error. */
#ifndef WSYNC_REL_HARNESS_H
#define WSYNC_REL_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wsync_abi.h"

#define REL_PLUGIN WSYNC_TEST_PLUGIN_DIR "/libwsync_cpu.so"

typedef struct rel_plugin {
    void *dl;
    const wsync_plugin_t *plugin;
    const wsync_consumer_ops_t *C;
    const wsync_producer_ops_t *P;
} rel_plugin_t;

/* dlopen REL_PLUGIN and negotiate ABI v1. Asserts on failure. */
void rel_plugin_load(rel_plugin_t *p);
void rel_plugin_unload(rel_plugin_t *p);

/* An error struct ready for a call (struct_size set, code OK). */
wsync_error_t rel_err(void);

/* Framed messages (4-byte length, bytes). rel_recv returns a malloc'd NUL-terminated string, or
 * NULL on EOF / after timeout_ms. */
void rel_send(int fd, const char *msg, size_t len);
void rel_sendf(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *rel_recv(int fd, int timeout_ms);

/* Start this executable as `argv0 --child <role> <fd> args...`; *sock is the parent's end. */
pid_t rel_spawn(const char *role, int *sock, const char *const *args);
/* Child dispatch for main(): returns -1 when argv is not a child invocation. */
typedef int (*rel_role_fn)(int fd, int argc, char **argv);
int rel_child_main(int argc, char **argv, const char *const *roles, const rel_role_fn *fns,
                   size_t n);
/* SIGKILL + reap; returns after the pid is gone (so kill(pid, 0) reports ESRCH). */
void rel_kill(pid_t pid);
/* waitpid with a bound; returns the exit status (or -signal), asserts on timeout. */
int rel_wait_exit(pid_t pid, int timeout_ms);

/* Tensor contents of generation g: every byte of tensor i is rel_fill_byte(g, i). */
static inline uint8_t rel_fill_byte(uint64_t g, size_t i)
{
    return (uint8_t)(0x11u * (unsigned)(g % 15 + 1) + 7u * (unsigned)i);
}
/* wsync64 of `bytes` bytes all equal to b (what a tensor of generation g must digest to). */
uint64_t rel_digest_of_fill(uint8_t b, size_t bytes);

/* /proc/self counters for the soak. */
long rel_rss_kb(void);
int rel_count_fds(void);
int rel_count_wsync_maps(void);
/* Names of /dev/shm/wsync-* segments of this uid whose name has our pid, or any pid (pid 0). */
int rel_count_shm(pid_t pid);
long rel_now_ms(void);
/* Remove every /dev/shm/wsync-<uid>-<pid>-* (segments a SIGKILLed process left); returns count. */
int rel_unlink_shm_of(pid_t pid);
/* Is there a /dev/shm entry for the shm name (leading '/') in handle bytes? */
int rel_shm_exists(const uint8_t *handle, uint32_t len);

/* ---- one producer and one engine driven through the plugin tables (rel_sync.c) ---- */

/* A trainer: a retained staging buffer holding n tensors "layers.<i>.weight" (uint8, bytes
 * each), filled per generation with rel_fill_byte. */
typedef struct rel_producer {
    const rel_plugin_t *pl;
    wsync_staging_t *s;
    wsync_stream_t stream;
    size_t n, bytes;
    uint8_t **src;
    const char *manifest; /* plugin-owned, valid until the next publish or retire */
    uint64_t generation;  /* of the last publish */
} rel_producer_t;

void rel_producer_create(rel_producer_t *p, const rel_plugin_t *pl, size_t n, size_t bytes,
                         uint32_t timeout_ms);
/* Fill with generation (p->generation + 1), stage, publish. */
wsync_result_t rel_producer_bucket(rel_producer_t *p, wsync_error_t *err);
/* Retire when `retire` (asserting success), then free the host memory. retire 0: the caller
 * already retired the staging (or gave up on it); it is not touched. */
void rel_producer_destroy(rel_producer_t *p, int retire);

/* An engine: n parameters of `bytes` each, matched to tensors by name. Parameters live in
 * caller memory when `params` is given (guard-page tests), else in malloc'd memory. */
typedef struct rel_engine {
    const rel_plugin_t *pl;
    wsync_consumer_t *c;
    size_t n, bytes;
    uint8_t **param;
    int own_params;
} rel_engine_t;

void rel_engine_create(rel_engine_t *e, const rel_plugin_t *pl, size_t n, size_t bytes,
                       uint32_t timeout_ms, uint8_t **params);
void rel_engine_destroy(rel_engine_t *e);
/* Copy ops for every tensor of m into the matching parameter (digests when m has them). */
wsync_copy_op_t *rel_engine_ops(rel_engine_t *e, const wsync_manifest_t *m);
/* One full sync: parse, open, copy (VERIFY), record_consumed(wait), close. First error. */
wsync_result_t rel_engine_sync(rel_engine_t *e, const char *json, wsync_error_t *err);
/* 1 when every parameter digests to generation g's contents, 0 otherwise. */
int rel_engine_is_gen(const rel_engine_t *e, uint64_t g);
/* Set every parameter to generation g's contents directly (the engine's initial weights). */
void rel_engine_fill(rel_engine_t *e, uint64_t g);

#endif
