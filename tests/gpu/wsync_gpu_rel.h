/* Helpers of the GPU soak and fault tests (docs/RELIABILITY.md, "CUDA plugin (GPU)"): process
 * counters, bounded waits that name what hung, per-tensor generation checks on the device, and
 * clean-up of what a SIGKILLed producer leaves in /dev/shm. Test code only; every helper that
 * runs in a child ends it with a message (exit 1) instead of returning an error. */
#ifndef WSYNC_GPU_REL_H
#define WSYNC_GPU_REL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wsync_gpu_test.h"

/* ---- /proc/self counters ---- */
int wr_count_maps(void);
/* Copy /proc/self/maps into buf (NUL-terminated, truncated at cap - 1); allocates nothing, so
 * taking a snapshot adds no mapping. Returns the number of lines copied. */
int wr_maps_snapshot(char *buf, size_t cap);
/* Print to stderr the lines of `now` missing from `before` ("+") and the reverse ("-"), up to
 * `max` lines each: what a changed mapping count is made of. */
void wr_maps_diff(const char *before, const char *now, int max);
long wr_now_ms(void);

/* ---- bounded waits ---- */
/* In a child: arm alarm(seconds); when it fires, print "<who>: timed out after N s in phase
 * <phase>" and _exit(3). wr_phase names the current step for that message. */
void wr_watchdog(const char *who, unsigned seconds);
void wr_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* wh_recv bounded by timeout_ms: 0 and *buf on success, -1 on EOF/error, -2 on timeout. */
int wr_recv(int fd, char **buf, size_t *len, int timeout_ms);
/* SIGKILL (if still running) and reap; returns the wait status. */
int wr_kill(pid_t pid);
/* waitpid bounded by timeout_ms; returns the exit code, -signal, or -1000 on timeout (the child
 * is then SIGKILLed and reaped). */
int wr_wait(pid_t pid, int timeout_ms);
/* Fork a child that runs fn(fd, arg) and _exits with its return value; *sock is our end. The
 * child keeps no other descriptor of ours (so a sibling's EOF is seen) and is SIGKILLed when
 * the test process dies. */
typedef int (*wr_child_fn)(int fd, void *arg);
pid_t wr_spawn(wr_child_fn fn, void *arg, int *sock);

/* ---- tensor contents ---- */
/* Seed of tensor k in generation g (wh_fill / wg_pattern_byte pattern). */
static inline uint64_t wr_seed(uint64_t g, size_t k)
{
    return 0x5EED0000ull * (g + 1) + 0x1000ull * k + 11;
}
/* Host wsync64 of `bytes` bytes of the fill pattern of `seed`. */
uint64_t wr_pattern_digest(uint64_t seed, size_t bytes);
/* In a child with a current device: number of 8-byte words of `p` that differ from the pattern
 * of `seed` (synchronous). */
unsigned long long wr_count_bad(const void *p, size_t bytes, uint64_t seed);

#endif
