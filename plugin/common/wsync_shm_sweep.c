/* Sweep of dead producers' staging segments (see wsync_shm_sweep.h). */
#include "wsync_shm_sweep.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wsync_log.h"
#include "wsync_pid.h"

uint64_t wsync_shm_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

int wsync_shm_sweep(int64_t only)
{
    const unsigned uid = (unsigned)geteuid();
    const uint64_t ns = wsync_shm_pidns();
    const int64_t self = (int64_t)getpid();
    int swept = 0;

    if (ns == 0)
        return 0;
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        unsigned u, seq, rnd;
        long long pid;
        uint64_t their_ns;
        int end = 0;
        if (sscanf(e->d_name, "wsync-%u-%lld-%u-%8x-%" SCNx64 "%n", &u, &pid, &seq, &rnd, &their_ns,
                   &end) != 5 ||
            e->d_name[end] != '\0')
            continue;
        if (u != uid || their_ns != ns || pid == self || (only > 0 && pid != only) ||
            !wsync_pid_exited(pid, 1))
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (shm_unlink(name) == 0) {
            swept++;
            WSYNC_LOG_INFO("swept %s: its producer (pid %lld) is gone", name, pid);
        }
    }
    closedir(d);
    return swept;
}
