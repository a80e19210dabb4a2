/* Whether a process has exited: the one answer the control block's waits, the segment sweep and
 * the engine shims' producer watch all ask. */
#ifndef WSYNC_COMMON_PID_H
#define WSYNC_COMMON_PID_H

#include <stdint.h>

/* 1 when `pid` (> 0) names no running process here: no such process, or (zombies != 0) a
 * zombie, which has exited but is not yet reaped. zombies 0 asks kill() alone (no /proc read:
 * for a check made every millisecond of a wait); 0 for pid <= 0. */
int wsync_pid_exited(int64_t pid, int zombies);

#endif
