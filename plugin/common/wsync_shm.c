/* POSIX shared memory segments: created O_EXCL, mode 0600, owned by our uid; mapped with
 * MAP_POPULATE so the first copy out of a fresh mapping does not pay for page faults. */
#include "wsync_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wsync_error.h"
#include "wsync_shm_sweep.h"

static _Atomic uint32_t wsync_shm_seq;

/* A name shm_open accepts: "/" then 1..NAME_MAX-1 bytes without another '/'. */
static int wsync_shm_name_ok(const char *name)
{
    size_t n = strnlen(name, WSYNC_SHM_NAME_MAX);
    if (n < 2 || n >= WSYNC_SHM_NAME_MAX || name[0] != '/')
        return 0;
    return strchr(name + 1, '/') == NULL;
}

static uint32_t wsync_shm_random(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16) ^
                 (uint64_t)(uintptr_t)&ts;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static wsync_result_t wsync_shm_map(wsync_shm_t *s, int fd, size_t size, wsync_error_t *err)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED)
        return WSYNC_FAIL(err, errno == ENOMEM ? WSYNC_ERR_OUT_OF_MEMORY : WSYNC_ERR_SYSTEM,
                          "mmap of shared memory %s (%zu bytes) failed: %s", s->name, size,
                          strerror(errno));
    s->addr = p;
    s->size = size;
    return WSYNC_OK;
}

wsync_result_t wsync_shm_create(wsync_shm_t *s, const char *tag, size_t size, wsync_error_t *err)
{
    int fd = -1;

    memset(s, 0, sizeof(*s));
    if (size == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "shared memory segment for %s: size 0; ask for at least one byte",
                          tag ? tag : "?");
    wsync_shm_sweep(0); /* segments of producers killed before they could unlink */
    const uint64_t ns = wsync_shm_pidns();
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        snprintf(s->name, sizeof(s->name), "/wsync-%u-%ld-%u-%08x-%llx", (unsigned)geteuid(),
                 (long)getpid(), (unsigned)atomic_fetch_add(&wsync_shm_seq, 1), wsync_shm_random(),
                 (unsigned long long)ns);
        fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        int e = errno;
        wsync_result_t code = e == EACCES ? WSYNC_ERR_PERMISSION : WSYNC_ERR_SYSTEM;
        s->name[0] = '\0';
        return WSYNC_FAIL(err, code, "shm_open (create) for %s failed: %s; check /dev/shm",
                          tag ? tag : "?", strerror(e));
    }
    /* umask may only clear bits; make the mode exactly 0600 regardless. */
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(s->name);
        wsync_result_t r = WSYNC_FAIL(err, WSYNC_ERR_SYSTEM,
                                      "sizing shared memory %s to %zu bytes for %s failed: %s; "
                                      "check free space in /dev/shm",
                                      s->name, size, tag ? tag : "?", strerror(e));
        s->name[0] = '\0';
        return r;
    }
    wsync_result_t r = wsync_shm_map(s, fd, size, err);
    close(fd);
    if (r != WSYNC_OK) {
        shm_unlink(s->name);
        s->name[0] = '\0';
        return r;
    }
    s->owner = 1;
    return WSYNC_OK;
}

wsync_result_t wsync_shm_open(wsync_shm_t *s, const char *name, size_t min_size, wsync_error_t *err)
{
    struct stat st;

    memset(s, 0, sizeof(*s));
    if (name == NULL || !wsync_shm_name_ok(name))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "shared memory name \"%.*s\" is not of the form /<name> (< %d bytes, "
                          "one leading '/')",
                          WSYNC_SHM_NAME_MAX, name ? name : "(null)", WSYNC_SHM_NAME_MAX);
    snprintf(s->name, sizeof(s->name), "%s", name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        s->name[0] = '\0';
        if (e == ENOENT)
            return WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                              "shared memory %s does not exist: the producer retired it or "
                              "exited; ask it to publish again",
                              name);
        return WSYNC_FAIL(err, e == EACCES ? WSYNC_ERR_PERMISSION : WSYNC_ERR_SYSTEM,
                          "shm_open of %s failed: %s", name, strerror(e));
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        s->name[0] = '\0';
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "fstat of shared memory %s failed: %s", name,
                          strerror(e));
    }
    if (st.st_uid != geteuid() || (st.st_mode & 07777) != 0600) {
        close(fd);
        s->name[0] = '\0';
        return WSYNC_FAIL(err, WSYNC_ERR_PERMISSION,
                          "shared memory %s has owner uid %u mode %04o; wsync only maps its own "
                          "uid (%u) with mode 0600",
                          name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                          (unsigned)geteuid());
    }
    if (st.st_size <= 0 || (uint64_t)st.st_size < (uint64_t)min_size) {
        close(fd);
        s->name[0] = '\0';
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "shared memory %s is %lld bytes, smaller than the %zu required", name,
                          (long long)st.st_size, min_size);
    }
    wsync_result_t r = wsync_shm_map(s, fd, (size_t)st.st_size, err);
    close(fd);
    if (r != WSYNC_OK)
        s->name[0] = '\0';
    return r;
}

void wsync_shm_close(wsync_shm_t *s)
{
    if (s == NULL || s->addr == NULL)
        return;
    munmap(s->addr, s->size);
    s->addr = NULL;
    s->size = 0;
}

void wsync_shm_unlink(wsync_shm_t *s)
{
    if (s == NULL || !s->owner || s->name[0] == '\0')
        return;
    shm_unlink(s->name);
    s->owner = 0;
}
