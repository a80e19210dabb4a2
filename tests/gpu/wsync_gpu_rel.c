/* See wsync_gpu_rel.h. */
#include "wsync_gpu_rel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wsync_digest.h"

int wr_maps_snapshot(char *buf, size_t cap)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    size_t len = 0;
    int lines = 0;
    if (fd < 0 || cap == 0)
        return -1;
    while (len + 1 < cap) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    return lines;
}

int wr_count_maps(void)
{
    static char buf[1 << 20];
    return wr_maps_snapshot(buf, sizeof(buf));
}

/* Lines of a that are not in b (by whole-line comparison), printed with `mark`. */
static void wr_lines_missing(const char *a, const char *b, char mark, int max)
{
    int shown = 0;
    for (const char *p = a; *p && shown < max;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = 0;
        for (const char *q = b; *q && !found;) {
            const char *f = strchr(q, '\n');
            size_t m = f ? (size_t)(f - q) : strlen(q);
            found = m == n && memcmp(p, q, n) == 0;
            q = f ? f + 1 : q + m;
        }
        if (!found) {
            fprintf(stderr, "  %c %.*s\n", mark, (int)n, p);
            shown++;
        }
        p = e ? e + 1 : p + n;
    }
}

void wr_maps_diff(const char *before, const char *now, int max)
{
    if (before == NULL || now == NULL)
        return;
    fprintf(stderr, "mappings added (+) and removed (-) since the warm-up:\n");
    wr_lines_missing(now, before, '+', max);
    wr_lines_missing(before, now, '-', max);
}

long wr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *wr_who = "child";
static unsigned wr_seconds;
static char wr_phase_text[256] = "start";

static void wr_on_alarm(int sig)
{
    (void)sig;
    char msg[512];
    int n = snprintf(msg, sizeof(msg), "%s (pid %d): timed out after %u s in phase \"%s\"\n",
                     wr_who, (int)getpid(), wr_seconds, wr_phase_text);
    if (n > 0 && write(2, msg, (size_t)n) < 0)
        _exit(3);
    _exit(3);
}

void wr_watchdog(const char *who, unsigned seconds)
{
    wr_who = who;
    wr_seconds = seconds;
    signal(SIGALRM, wr_on_alarm);
    signal(SIGPIPE, SIG_IGN); /* a dead peer shows as a failed send, not a silent death */
    alarm(seconds);
}

void wr_phase(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(wr_phase_text, sizeof(wr_phase_text), fmt, ap);
    va_end(ap);
}

int wr_recv(int fd, char **buf, size_t *len, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    long deadline = wr_now_ms() + timeout_ms;
    for (;;) {
        long left = deadline - wr_now_ms();
        if (left <= 0)
            return -2;
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            return -2;
        if (r < 0)
            return -1;
        break;
    }
    /* the sender writes a whole message at once: the body follows the length at once */
    return wh_recv(fd, buf, len) == 0 ? 0 : -1;
}

int wr_kill(pid_t pid)
{
    int st = 0;
    kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

int wr_wait(pid_t pid, int timeout_ms)
{
    long deadline = wr_now_ms() + timeout_ms;
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        if (r < 0 && errno != EINTR)
            return -1001;
        if (wr_now_ms() > deadline) {
            wr_kill(pid);
            return -1000;
        }
        usleep(2000);
    }
}

pid_t wr_spawn(wr_child_fn fn, void *arg, int *sock)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        for (int i = 3; i < 1024; i++)
            if (i != sv[1])
                close(i);
        int rc = fn(sv[1], arg);
        fflush(NULL);
        _exit(rc);
    }
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return -1;
    }
    *sock = sv[0];
    return pid;
}

uint64_t wr_pattern_digest(uint64_t seed, size_t bytes)
{
    unsigned char *b = malloc(bytes ? bytes : 1);
    WG_CHECK(b != NULL, "no memory for %zu bytes", bytes);
    for (size_t j = 0; j < bytes; j++)
        b[j] = wg_pattern_byte(seed, j);
    uint64_t d = wsync64(b, bytes);
    free(b);
    return d;
}

unsigned long long wr_count_bad(const void *p, size_t bytes, uint64_t seed)
{
    static unsigned long long *dev;
    unsigned long long bad = 0;
    cudaError_t e = cudaSuccess;
    if (dev == NULL)
        e = cudaMalloc((void **)&dev, sizeof(*dev));
    if (e == cudaSuccess)
        e = cudaMemset(dev, 0, sizeof(*dev));
    if (e == cudaSuccess)
        e = wh_count_bad(p, bytes, seed, dev, 0);
    if (e == cudaSuccess)
        e = cudaMemcpy(&bad, dev, sizeof(bad), cudaMemcpyDeviceToHost);
    WG_CHECK(e == cudaSuccess, "checking %zu bytes at %p on the device: %s (%s)", bytes, p,
             cudaGetErrorName(e), cudaGetErrorString(e));
    return bad;
}
