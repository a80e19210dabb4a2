/* Helpers of rel_harness.h. Runs inside cmocka tests: failures assert. */
#include "rel_harness.h"
#include "rel_proc.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "wsync_digest.h"
#include "wsync_client.h"

void rel_plugin_load(rel_plugin_t *p)
{
    memset(p, 0, sizeof(*p));
    p->dl = dlopen(REL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (p->dl == NULL)
        fail_msg("dlopen %s: %s", REL_PLUGIN, dlerror());
    wsync_plugin_init_fn_t init = (wsync_plugin_init_fn_t)dlsym(p->dl, WSYNC_PLUGIN_INIT_SYMBOL);
    assert_non_null(init);
    uint32_t v = WSYNC_ABI_VERSION;
    wsync_host_t host = {.struct_size = sizeof(host), .log = NULL};
    wsync_error_t err = rel_err();
    wsync_result_t r = init(&v, &host, &p->plugin, &err);
    if (r != WSYNC_OK)
        fail_msg("wsync_plugin_init: %s: %s", wsync_strerror(r), err.message);
    assert_int_equal(v, WSYNC_ABI_VERSION_1);
    p->C = p->plugin->consumer;
    p->P = p->plugin->producer;
    assert_non_null(p->C);
    assert_non_null(p->P);
}

void rel_plugin_unload(rel_plugin_t *p)
{
    /* Not dlclosed: plugins may keep process-lifetime state; the soak counts what stays. */
    memset(p, 0, sizeof(*p));
}

wsync_error_t rel_err(void)
{
    wsync_error_t e;
    memset(&e, 0, sizeof(e));
    e.struct_size = sizeof(e);
    return e;
}

static void rel_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the peer is gone; its reader reports it */
        p += w;
        n -= (size_t)w;
    }
}

void rel_send(int fd, const char *msg, size_t len)
{
    uint32_t n = (uint32_t)len;
    rel_write_all(fd, &n, sizeof(n));
    rel_write_all(fd, msg, len);
}

void rel_sendf(int fd, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    rel_send(fd, buf, (size_t)n);
}

static int rel_read_all(int fd, void *buf, size_t n, long deadline)
{
    char *p = buf;
    while (n > 0) {
        long left = deadline - rel_now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return -1;
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

char *rel_recv(int fd, int timeout_ms)
{
    long deadline = rel_now_ms() + timeout_ms;
    uint32_t n;
    if (rel_read_all(fd, &n, sizeof(n), deadline) != 0 || n > (64u << 20))
        return NULL;
    char *buf = malloc((size_t)n + 1);
    if (buf == NULL || rel_read_all(fd, buf, n, deadline) != 0) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

pid_t rel_spawn(const char *role, int *sock, const char *const *args)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char fdbuf[16];
        const char *argv[32];
        int fd = dup(sv[1]); /* dup drops CLOEXEC: the child keeps this one */
        size_t k = 0;
        snprintf(fdbuf, sizeof(fdbuf), "%d", fd);
        argv[k++] = "rel-child";
        argv[k++] = "--child";
        argv[k++] = role;
        argv[k++] = fdbuf;
        for (size_t i = 0; args != NULL && args[i] != NULL && k < 31; i++)
            argv[k++] = args[i];
        argv[k] = NULL;
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    close(sv[1]);
    *sock = sv[0];
    return pid;
}

int rel_child_main(int argc, char **argv, const char *const *roles, const rel_role_fn *fns,
                   size_t n)
{
    if (argc < 4 || strcmp(argv[1], "--child") != 0)
        return -1;
    int fd = atoi(argv[3]);
    for (size_t i = 0; i < n; i++)
        if (strcmp(argv[2], roles[i]) == 0)
            return fns[i](fd, argc - 4, argv + 4);
    fprintf(stderr, "unknown child role %s\n", argv[2]);
    return 2;
}

void rel_kill(pid_t pid)
{
    int status;
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
}

int rel_wait_exit(pid_t pid, int timeout_ms)
{
    long deadline = rel_now_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        if (rel_now_ms() > deadline) {
            rel_kill(pid);
            fail_msg("child %d did not exit within %d ms", (int)pid, timeout_ms);
        }
        usleep(2000);
    }
}

uint64_t rel_digest_of_fill(uint8_t b, size_t bytes)
{
    uint8_t *tmp = malloc(bytes ? bytes : 1);
    assert_non_null(tmp);
    memset(tmp, b, bytes);
    uint64_t d = wsync64(tmp, bytes);
    free(tmp);
    return d;
}

long rel_rss_kb(void)
{
    long kb = rel_proc_rss_kb();
    assert_true(kb >= 0);
    return kb;
}

int rel_count_fds(void)
{
    int n = rel_proc_count_fds();
    assert_true(n >= 0);
    return n;
}

int rel_count_wsync_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "/dev/shm/wsync-") != NULL)
            n++;
    fclose(f);
    return n;
}

int rel_count_shm(pid_t pid)
{
    char prefix[64];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;
    if (pid > 0)
        snprintf(prefix, sizeof(prefix), "wsync-%u-%ld-", (unsigned)geteuid(), (long)pid);
    else
        snprintf(prefix, sizeof(prefix), "wsync-%u-", (unsigned)geteuid());
    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

long rel_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int rel_unlink_shm_of(pid_t pid)
{
    int n = rel_proc_unlink_shm_of(pid);
    assert_true(n >= 0); /* /dev/shm readable */
    return n;
}

int rel_shm_exists(const uint8_t *handle, uint32_t len)
{
    char path[256];
    snprintf(path, sizeof(path), "/dev/shm%.*s", (int)strnlen((const char *)handle, len),
             (const char *)handle);
    return access(path, F_OK) == 0;
}
