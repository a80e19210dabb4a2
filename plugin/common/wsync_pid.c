/* Whether a process has exited; see wsync_pid.h. */
#include "wsync_pid.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

int wsync_pid_exited(int64_t pid, int zombies)
{
    char path[48], buf[256];

    if (pid <= 0)
        return 0;
    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH;
    if (!zombies)
        return 0;
    snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
    return paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}
