/* POSIX shared memory segments for staging and control. Created O_EXCL with mode 0600; opening
 * checks that the segment belongs to our uid and is 0600, so another user cannot feed or read us.
 */
#ifndef WSYNC_COMMON_SHM_H
#define WSYNC_COMMON_SHM_H

#include <stddef.h>
#include "wsync_abi.h"

#define WSYNC_SHM_NAME_MAX 64

typedef struct wsync_shm {
    char name[WSYNC_SHM_NAME_MAX]; /* "/wsync-<uid>-<pid>-<seq>-<rand>-<pidns>" */
    void *addr;
    size_t size;
    int owner; /* 1 when this process created it (may unlink) */
} wsync_shm_t;

/* Create a new segment of `size` bytes (zero-filled). Blocking. Sweeps dead producers' segments
 * first (wsync_shm_sweep.h). */
wsync_result_t wsync_shm_create(wsync_shm_t *s, const char *tag, size_t size, wsync_error_t *err);
/* Map an existing segment; refuses a foreign owner, a mode other than 0600, or size < min_size. */
wsync_result_t wsync_shm_open(wsync_shm_t *s, const char *name, size_t min_size,
                              wsync_error_t *err);
/* Unmap (both sides). Safe on a zeroed struct. */
void wsync_shm_close(wsync_shm_t *s);
/* Remove the name (creator only); existing mappings stay valid until closed. */
void wsync_shm_unlink(wsync_shm_t *s);

#endif
