/* Helpers of the multi-GPU tests: count the GPUs without initialising CUDA in the calling
 * process (a forked child asks the runtime), skip loudly when there are too few, name the
 * physical GPU of rank r for a child's CUDA_VISIBLE_DEVICES, and fork/wait groups of children.
 * Not thread safe. */
#ifndef WSYNC_GPU_MULTI_H
#define WSYNC_GPU_MULTI_H

#include <stddef.h>
#include <sys/types.h>

#define WGM_MAX_CHILDREN 32

/* Number of CUDA devices this process would see (0 without a driver; why says so). Forks. */
int wgm_count_gpus(char *why, size_t len);

/* Exit 77 with "SKIPPED: needs N GPUs, found M (<why>)" when fewer than `need` are visible;
 * returns the count otherwise. */
int wgm_require_gpus(int need, const char *test);

/* Entry r of this process's CUDA_VISIBLE_DEVICES (or "r" when unset) into buf. */
const char *wgm_visible(int r, char *buf, size_t len);

/* In a child, before any CUDA call: see only the physical GPU of rank r (as device 0). */
void wgm_pin_to_gpu(int r);

typedef int (*wgm_child_fn)(int index, void *arg);
/* Fork fn(i, arg) for i in [0, n); the parent then closes close_fds[0..n_close) (so a child that
 * dies shows as EOF to its peer) and waits for all. Returns the number of children that did not
 * exit 0 (each is reported on stderr). */
int wgm_run_children(int n, wgm_child_fn fn, void *arg, const int *close_fds, int n_close);

#endif
