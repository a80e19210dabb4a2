/* For tests that model an engine whose copies of generation g are queued while the producer's
 * *ready*[g] is still pending (a producer that publishes before its stage completes): mark g as
 * published in the buffer's control block, as the producer's publish would, without the stage.
 * The engine refuses a copy of a generation never published (wsync_control_check_published). */
#ifndef WSYNC_TEST_PUBLISH_H
#define WSYNC_TEST_PUBLISH_H

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "wsync_control.h"

/* `name`: the control segment's shm name (host_shm: the buffer's handle). 0 on success. */
static inline int wsync_test_mark_published(const char *name, uint64_t generation)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return -1;
    void *p = mmap(NULL, sizeof(wsync_control_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return -1;
    atomic_store(&((wsync_control_t *)p)->published_generation, generation);
    munmap(p, sizeof(wsync_control_t));
    return 0;
}

#endif
