/* Harness shared by wsync-bench-cuda and the GPU tests: plugin loading, a logger that captures
 * the plugin's stats line, length-prefixed messages over a socket, and small device kernels
 * (fill, compare, spin). Uses the ABI only to reach the plugin. Not thread safe. */
#ifndef WSYNC_CUDA_HARNESS_H
#define WSYNC_CUDA_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "wsync_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Counters parsed from the plugin's last "wsync-cuda stats" log line (WSYNC_CUDA_STATS=1). */
typedef struct wh_stats {
    unsigned long long ipc_mem_opens, ipc_mem_closes, ipc_event_opens, launches;
    int seen;
} wh_stats_t;
extern wh_stats_t wh_stats;

/* The plugin a benchmark loads: `name` when it holds a '/', else <this program's dir>/../lib/
 * <name> (NULL: libwsync_cuda.so), so a build tree's binaries find its plugin without
 * LD_LIBRARY_PATH. Written into buf; returns buf, or `name` if /proc/self/exe cannot be read. */
const char *wh_plugin_path(const char *name, char *buf, size_t cap);

/* dlopen `path` and initialise it (logging WARN and above to stderr, INFO stats captured).
 * Returns the init result; on failure `why` holds the reason. */
wsync_result_t wh_load(const char *path, const wsync_plugin_t **out, char *why, size_t why_len);

/* Load and init `path` in a forked child, so the caller's process never touches CUDA before it
 * forks its own workers. Returns 0 when usable, 77 when there is no device (why says why), 1 on
 * other failures. */
int wh_probe(const char *path, char *why, size_t why_len);

/* Length-prefixed messages over a stream socket. Blocking. recv: *buf malloc'd, NUL-terminated.
 * Both return 0 on success, -1 on error or orderly close. */
int wh_send(int fd, const void *buf, size_t len);
int wh_recv(int fd, char **buf, size_t *len);
int wh_send_str(int fd, const char *s);
/* Free a buffer from wh_recv (callers built with cmocka's malloc wrappers must use this). */
void wh_free(void *buf);

/* Benchmarks: on a failed CUDA call, print "<who>: file:line call: CUDA's message" and exit(1). */
void wh_cuda_die(const char *who, const char *file, int line, const char *call, cudaError_t e);
#define WH_CK(who, call)                                                                           \
    do {                                                                                           \
        cudaError_t wh_e_ = (call);                                                                \
        if (wh_e_ != cudaSuccess)                                                                  \
            wh_cuda_die((who), __FILE__, __LINE__, #call, wh_e_);                                  \
    } while (0)

/* CLOCK_MONOTONIC in milliseconds. */
double wh_now_ms(void);
/* Median of v[0..n) (sorts v in place); n > 0. */
double wh_median(double *v, unsigned n);
/* Median ms, by events e0 and e1 recorded on s around fn(arg, s), of `iters` calls (> 0) after
 * `warmup` more. A failed CUDA call ends the program, naming `who`. */
typedef void (*wh_timed_fn)(void *arg, cudaStream_t s);
double wh_time_events(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                      unsigned warmup, unsigned iters, wh_timed_fn fn, void *arg);
/* Each of n calls of fn timed alone by e0 and e1 on s, in order, into ms[0..n) (no warm-up:
 * the first calls as they come). */
void wh_time_each(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s, unsigned n,
                  wh_timed_fn fn, void *arg, double *ms);
/* The same with a kernel spinning about `spin_ns` on s before each e0, so the host work of fn
 * (planning, uploads, launches) is done while the GPU is busy: the GPU time of fn's work alone.
 * WH_GPU_ALONE_SPIN_NS outlasts the host work of any call the benchmarks time this way. */
#define WH_GPU_ALONE_SPIN_NS 50000000ull
double wh_time_events_gpu(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                          unsigned warmup, unsigned iters, uint64_t spin_ns, wh_timed_fn fn,
                          void *arg);
/* wh_time_events with the GPU busy just before each call, as after a training step: a kernel
 * spinning about `busy_ns` on s, the host waiting for it, then e0, fn(arg, s) and e1 (fn's host
 * work inside the time). Timed back to back instead, a quantizing kernel ran slower than its
 * GPU-alone time while one cudaMemcpyAsync did not (docs/PERFORMANCE.md). */
#define WH_BUSY_NS 2000000ull
double wh_time_events_busy(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                           unsigned warmup, unsigned iters, uint64_t busy_ns, wh_timed_fn fn,
                           void *arg);

/* Device helpers, enqueued on `s`. Word i of a filled buffer is mix(seed + i); bytes past the
 * last full word are the low bytes of the next word. */
cudaError_t wh_fill(void *p, size_t bytes, uint64_t seed, cudaStream_t s);
/* The same with every word ANDed with `mask` (e.g. a bit of each 16-bit lane cleared). */
cudaError_t wh_fill_mask(void *p, size_t bytes, uint64_t seed, uint64_t mask, cudaStream_t s);
/* Adds to *bad (device counter) the number of 8-byte words that differ from the fill pattern. */
cudaError_t wh_count_bad(const void *p, size_t bytes, uint64_t seed, unsigned long long *bad,
                         cudaStream_t s);
cudaError_t wh_count_bad_mask(const void *p, size_t bytes, uint64_t seed, uint64_t mask,
                              unsigned long long *bad, cudaStream_t s);
/* One block that spins for about `ns` nanoseconds (keeps a stream busy). */
cudaError_t wh_spin(uint64_t ns, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
