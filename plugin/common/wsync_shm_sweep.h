/* The sweep of staging segments whose producer died without unlinking them (SIGKILL, OOM kill):
 * the exit-time unlink cannot run there, and each such segment keeps its RAM until unlinked.
 *
 * A segment's name carries its creator's uid, pid and pid namespace
 * ("/wsync-<uid>-<pid>-<seq>-<rand>-<pidns>"); a segment is swept only when the uid is ours,
 * the namespace is ours (so a pid is judged where it means something) and that pid is no
 * running process (gone, or a zombie). A live engine mapping keeps its pages: unlinking removes
 * the name, not the memory. */
#ifndef WSYNC_COMMON_SHM_SWEEP_H
#define WSYNC_COMMON_SHM_SWEEP_H

#include <stdint.h>

/* This process's pid namespace as it appears in segment names (0 when /proc is not readable). */
uint64_t wsync_shm_pidns(void);
/* Unlink the segments of dead producers; only those of `pid` when pid > 0. Returns the number
 * unlinked. Never blocks on anything but /dev/shm and /proc. */
int wsync_shm_sweep(int64_t pid);

#endif
