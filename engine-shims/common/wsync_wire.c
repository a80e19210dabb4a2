/* Length-prefixed messages over a Unix stream socket. Contract in wsync_wire.h. Every call is
 * blocking but bounded: waits go through poll() with a deadline, EINTR restarts the wait with the
 * remaining time, and sends use MSG_NOSIGNAL so a vanished peer is an error, not SIGPIPE.
 * Thread safety: one sender and one receiver per fd at a time. */
#define _GNU_SOURCE
#include "wsync_wire.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "wsync_error.h"

/* wsync_wire_send has no timeout argument: it fails when the peer takes no bytes for this long. */
#define WSYNC_WIRE_SEND_STALL_MS 30000
#define WSYNC_WIRE_CONNECT_RETRY_MS 10

static int64_t wsync_wire_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until `deadline` (-1 = none) in poll()'s convention. */
static int wsync_wire_left(int64_t deadline)
{
    int64_t left;
    if (deadline < 0)
        return -1;
    left = deadline - wsync_wire_now_ms();
    return left < 0 ? 0 : (int)left;
}

static int64_t wsync_wire_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : wsync_wire_now_ms() + timeout_ms;
}

/* Wait for `events` on fd. OK, TIMEOUT or SYSTEM; POLLHUP/POLLERR count as ready so the following
 * read/write reports the peer's state. */
static wsync_result_t wsync_wire_wait(int fd, short events, int64_t deadline, const char *what,
                                      wsync_error_t *err)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, wsync_wire_left(deadline));
        if (n > 0)
            return WSYNC_OK;
        if (n == 0)
            return WSYNC_RECORD(err, WSYNC_ERR_TIMEOUT,
                                "%s on fd %d timed out; the peer is alive but silent, raise the "
                                "timeout or check the peer",
                                what, fd);
        if (errno != EINTR)
            return WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "poll on fd %d failed: %s", fd,
                                strerror(errno));
    }
}

static wsync_result_t wsync_wire_make_addr(const char *path, struct sockaddr_un *addr,
                                           wsync_error_t *err)
{
    if (path == NULL || path[0] == '\0')
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "socket path is NULL or empty");
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr->sun_path))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "socket path '%s' is %zu bytes, the limit is %zu; use a shorter "
                            "directory",
                            path, strlen(path), sizeof(addr->sun_path) - 1);
    memcpy(addr->sun_path, path, strlen(path) + 1);
    return WSYNC_OK;
}

int wsync_wire_listen(const char *path, wsync_error_t *err)
{
    struct sockaddr_un addr;
    int fd;

    if (wsync_wire_make_addr(path, &addr, err) != WSYNC_OK)
        return -1;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "socket(AF_UNIX) failed: %s", strerror(errno));
        return -1;
    }
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "bind %s failed: %s; remove a stale socket file", path,
                     strerror(errno));
        close(fd);
        return -1;
    }
    /* The uid check on accept is the real gate; the mode keeps other users from connecting. */
    if (chmod(path, 0600) != 0 || listen(fd, 8) != 0) {
        WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "chmod/listen %s failed: %s", path, strerror(errno));
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}

/* PERMISSION unless the peer on fd runs as `uid`. */
static wsync_result_t wsync_wire_check_peer(int fd, uid_t uid, wsync_error_t *err)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "SO_PEERCRED on fd %d failed: %s", fd,
                            strerror(errno));
    if (cred.uid != uid)
        return WSYNC_RECORD(err, WSYNC_ERR_PERMISSION,
                            "refused peer pid %d of uid %u: only uid %u may connect", (int)cred.pid,
                            (unsigned)cred.uid, (unsigned)uid);
    return WSYNC_OK;
}

int wsync_wire_accept(int listen_fd, int timeout_ms, wsync_error_t *err)
{
    int64_t deadline = wsync_wire_deadline(timeout_ms);
    int fd;

    for (;;) {
        if (wsync_wire_wait(listen_fd, POLLIN, deadline, "accept", err) != WSYNC_OK)
            return -1;
        fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            break;
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
            WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "accept on fd %d failed: %s", listen_fd,
                         strerror(errno));
            return -1;
        }
    }
    if (wsync_wire_check_peer(fd, geteuid(), err) != WSYNC_OK) {
        close(fd);
        return -1;
    }
    return fd;
}

int wsync_wire_connect(const char *path, int timeout_ms, wsync_error_t *err)
{
    int64_t deadline = wsync_wire_deadline(timeout_ms);
    struct sockaddr_un addr;
    int last = 0;

    if (wsync_wire_make_addr(path, &addr, err) != WSYNC_OK)
        return -1;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "socket(AF_UNIX) failed: %s", strerror(errno));
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0)
            return fd;
        last = errno;
        close(fd);
        /* The listener may not be up yet: retry those until the deadline. */
        if (last != ENOENT && last != ECONNREFUSED && last != EAGAIN && last != EINTR) {
            WSYNC_RECORD(err, last == EACCES ? WSYNC_ERR_PERMISSION : WSYNC_ERR_SYSTEM,
                         "connect %s failed: %s", path, strerror(last));
            return -1;
        }
        if (deadline >= 0 && wsync_wire_left(deadline) == 0) {
            WSYNC_RECORD(err, WSYNC_ERR_TIMEOUT,
                         "connect %s: no listener after %d ms (last error: %s); is the peer "
                         "running?",
                         path, timeout_ms, strerror(last));
            return -1;
        }
        usleep(WSYNC_WIRE_CONNECT_RETRY_MS * 1000);
    }
}

static wsync_result_t wsync_wire_write_all(int fd, const void *buf, size_t len, wsync_error_t *err)
{
    const unsigned char *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            wsync_result_t rc = wsync_wire_wait(
                fd, POLLOUT, wsync_wire_deadline(WSYNC_WIRE_SEND_STALL_MS), "send", err);
            if (rc != WSYNC_OK)
                return rc;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN))
            return WSYNC_RECORD(err, WSYNC_ERR_PEER_GONE,
                                "send on fd %d: the peer closed the connection (%s)", fd,
                                strerror(errno));
        return WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "send on fd %d failed: %s", fd,
                            n < 0 ? strerror(errno) : "wrote 0 bytes");
    }
    return WSYNC_OK;
}

wsync_result_t wsync_wire_send(int fd, const void *buf, size_t len, wsync_error_t *err)
{
    unsigned char hdr[4];
    wsync_result_t rc;

    if (fd < 0 || (buf == NULL && len > 0))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "fd %d / buffer %p invalid", fd, buf);
    if (len > WSYNC_WIRE_MAX_MESSAGE)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "message of %zu bytes exceeds the %u-byte maximum; split it", len,
                            WSYNC_WIRE_MAX_MESSAGE);
    for (int i = 0; i < 4; i++)
        hdr[i] = (unsigned char)(len >> (8 * i));
    rc = wsync_wire_write_all(fd, hdr, sizeof(hdr), err);
    if (rc == WSYNC_OK)
        rc = wsync_wire_write_all(fd, buf, len, err);
    return rc;
}

/* Read exactly len bytes before `deadline`. `started` says whether part of the message has
 * already arrived (for the PEER_GONE message). */
static wsync_result_t wsync_wire_read_all(int fd, void *buf, size_t len, int64_t deadline,
                                          int started, wsync_error_t *err)
{
    unsigned char *p = buf;
    size_t got = 0;

    while (got < len) {
        ssize_t n;
        wsync_result_t rc = wsync_wire_wait(fd, POLLIN, deadline, "recv", err);
        if (rc != WSYNC_OK)
            return rc;
        n = recv(fd, p + got, len - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0)
            return WSYNC_RECORD(err, WSYNC_ERR_PEER_GONE,
                                started || got > 0
                                    ? "recv on fd %d: the peer closed the connection in the "
                                      "middle of a message"
                                    : "recv on fd %d: the peer closed the connection",
                                fd);
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
            continue;
        if (errno == ECONNRESET)
            return WSYNC_RECORD(err, WSYNC_ERR_PEER_GONE,
                                "recv on fd %d: connection reset by the peer", fd);
        return WSYNC_RECORD(err, WSYNC_ERR_SYSTEM, "recv on fd %d failed: %s", fd, strerror(errno));
    }
    return WSYNC_OK;
}

wsync_result_t wsync_wire_recv(int fd, char **buf, size_t *len, int timeout_ms, wsync_error_t *err)
{
    int64_t deadline = wsync_wire_deadline(timeout_ms);
    unsigned char hdr[4];
    uint32_t n = 0;
    wsync_result_t rc;
    char *msg;

    if (fd < 0 || buf == NULL || len == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "fd %d, buf or len invalid", fd);
    *buf = NULL;
    *len = 0;
    rc = wsync_wire_read_all(fd, hdr, sizeof(hdr), deadline, 0, err);
    if (rc != WSYNC_OK)
        return rc;
    for (int i = 0; i < 4; i++)
        n |= (uint32_t)hdr[i] << (8 * i);
    if (n > WSYNC_WIRE_MAX_MESSAGE)
        return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                            "incoming message announces %u bytes, over the %u-byte maximum; "
                            "the stream is not a wsync wire or is corrupt: close it",
                            n, WSYNC_WIRE_MAX_MESSAGE);
    msg = malloc((size_t)n + 1);
    if (msg == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %u bytes for a message",
                            n + 1);
    rc = wsync_wire_read_all(fd, msg, n, deadline, 1, err);
    if (rc != WSYNC_OK) {
        free(msg);
        return rc;
    }
    msg[n] = '\0';
    *buf = msg;
    *len = n;
    return WSYNC_OK;
}
