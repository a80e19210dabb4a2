/* Names of staging segments this process created and has not retired: unlinked when the process
 * exits (or the plugin is unloaded), so a crashed trainer loop does not leak /dev/shm. A forked
 * child inherits the list but never unlinks its parent's segments (the pid is checked). */
#ifndef WSYNC_CPU_UNLINK_H
#define WSYNC_CPU_UNLINK_H

#include <sys/types.h>

#include "wsync_shm.h"

typedef struct wsync_cpu_unlink {
    char name[WSYNC_SHM_NAME_MAX];
    pid_t pid;
    struct wsync_cpu_unlink *prev, *next;
} wsync_cpu_unlink_t;

/* `node` is owned by the caller and stays listed until unregister. Thread safe. */
void wsync_cpu_unlink_register(wsync_cpu_unlink_t *node, const char *name);
void wsync_cpu_unlink_unregister(wsync_cpu_unlink_t *node);

#endif
