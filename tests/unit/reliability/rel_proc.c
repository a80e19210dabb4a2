#include "rel_proc.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long rel_proc_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

int rel_proc_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory stream itself */
}

int rel_proc_unlink_shm_of(pid_t pid)
{
    char prefix[64], path[512];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;
    if (d == NULL)
        return -1;
    snprintf(prefix, sizeof(prefix), "wsync-%u-%ld-", (unsigned)geteuid(), (long)pid);
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
        if (unlink(path) == 0)
            n++;
    }
    closedir(d);
    return n;
}
