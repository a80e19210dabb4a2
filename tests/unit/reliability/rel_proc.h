/* Process counters the soak tests watch (host and GPU): resident memory and open fds, read from
 * /proc/self. No test framework: -1 when /proc cannot be read. */
#ifndef WSYNC_REL_PROC_H
#define WSYNC_REL_PROC_H

long rel_proc_rss_kb(void); /* VmRSS in kB */
int rel_proc_count_fds(void);

#endif
