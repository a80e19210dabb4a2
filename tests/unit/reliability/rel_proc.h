/* Process counters the soak tests watch (host and GPU): resident memory and open fds, read from
 * /proc/self; and the clean-up after a SIGKILLed process. No test framework: -1 when /proc or
 * /dev/shm cannot be read. */
#ifndef WSYNC_REL_PROC_H
#define WSYNC_REL_PROC_H

#include <sys/types.h>

long rel_proc_rss_kb(void); /* VmRSS in kB */
int rel_proc_count_fds(void);
/* Unlink /dev/shm/wsync-<uid>-<pid>-* (segments a SIGKILLed process left); returns the count. */
int rel_proc_unlink_shm_of(pid_t pid);

#endif
