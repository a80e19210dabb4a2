/* Host side of the harness. See wsync_cuda_harness.h. */
#include "wsync_cuda_harness.h"
#include "wsync_client.h"

#include <dlfcn.h>
#include <limits.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

wh_stats_t wh_stats;

static void wh_log(void *user, wsync_log_level_t level, const char *file, int line, const char *fmt,
                   ...)
{
    (void)user;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *st = strstr(msg, "wsync-cuda stats ");
    if (st) {
        if (sscanf(st,
                   "wsync-cuda stats ipc_mem_opens=%llu ipc_mem_closes=%llu ipc_event_opens=%llu "
                   "launches=%llu",
                   &wh_stats.ipc_mem_opens, &wh_stats.ipc_mem_closes, &wh_stats.ipc_event_opens,
                   &wh_stats.launches) == 4)
            wh_stats.seen = 1;
        return;
    }
    if (level <= WSYNC_LOG_WARN)
        fprintf(stderr, "[plugin %s %s:%d] %s\n", level == WSYNC_LOG_ERROR ? "error" : "warn", file,
                line, msg);
}

wsync_result_t wh_load(const char *path, const wsync_plugin_t **out, char *why, size_t why_len)
{
    static wsync_host_t host;
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        snprintf(why, why_len, "dlopen %s: %s", path, dlerror());
        return WSYNC_ERR_NOT_FOUND;
    }
    wsync_plugin_init_fn_t init = (wsync_plugin_init_fn_t)dlsym(dl, WSYNC_PLUGIN_INIT_SYMBOL);
    if (init == NULL) {
        snprintf(why, why_len, "%s has no %s", path, WSYNC_PLUGIN_INIT_SYMBOL);
        return WSYNC_ERR_NOT_FOUND;
    }
    host.struct_size = sizeof(host);
    host.log = wh_log;
    host.log_level = WSYNC_LOG_INFO;
    uint32_t v = WSYNC_ABI_VERSION;
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t rc = init(&v, &host, out, &err);
    if (rc != WSYNC_OK)
        snprintf(why, why_len, "%s: %s", wsync_strerror(rc), err.message);
    return rc;
}

int wh_probe(const char *path, char *why, size_t why_len)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        const wsync_plugin_t *p;
        char msg[512] = "";
        wsync_result_t rc = wh_load(path, &p, msg, sizeof(msg));
        if (write(fds[1], msg, strlen(msg)) < 0)
            _exit(1);
        _exit(rc == WSYNC_OK ? 0 : rc == WSYNC_ERR_NO_DEVICE ? 77 : 1);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], why, why_len - 1);
    why[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return 1;
    return WEXITSTATUS(st);
}

static int wh_io(int fd, void *buf, size_t len, int writing)
{
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wh_send(int fd, const void *buf, size_t len)
{
    uint32_t n = (uint32_t)len;
    if (wh_io(fd, &n, sizeof(n), 1) != 0)
        return -1;
    return wh_io(fd, (void *)buf, len, 1);
}

int wh_send_str(int fd, const char *s)
{
    return wh_send(fd, s, strlen(s));
}

void wh_free(void *buf)
{
    free(buf);
}

int wh_recv(int fd, char **buf, size_t *len)
{
    uint32_t n;
    if (wh_io(fd, &n, sizeof(n), 0) != 0)
        return -1;
    char *b = malloc((size_t)n + 1);
    if (b == NULL || wh_io(fd, b, n, 0) != 0) {
        free(b);
        return -1;
    }
    b[n] = '\0';
    *buf = b;
    if (len)
        *len = n;
    return 0;
}

void wh_cuda_die(const char *who, const char *file, int line, const char *call, cudaError_t e)
{
    fprintf(stderr, "%s: %s:%d %s: %s\n", who, file, line, call, cudaGetErrorString(e));
    exit(1);
}

double wh_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int wh_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double wh_median(double *v, unsigned n)
{
    qsort(v, n, sizeof(*v), wh_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One call of fn timed by e0 and e1 on s, ms. spin_ns > 0: a kernel spins on s before e0; wait:
 * the host waits for it first. */
static double time_one(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                       uint64_t spin_ns, int wait, wh_timed_fn fn, void *arg)
{
    if (spin_ns > 0)
        WH_CK(who, wh_spin(spin_ns, s));
    if (spin_ns > 0 && wait)
        WH_CK(who, cudaStreamSynchronize(s));
    WH_CK(who, cudaEventRecord(e0, s));
    fn(arg, s);
    WH_CK(who, cudaEventRecord(e1, s));
    WH_CK(who, cudaEventSynchronize(e1));
    float ms;
    WH_CK(who, cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

void wh_time_each(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s, unsigned n,
                  wh_timed_fn fn, void *arg, double *ms)
{
    for (unsigned i = 0; i < n; i++)
        ms[i] = time_one(who, e0, e1, s, 0, 0, fn, arg);
}

/* The median of time_one over iters calls after warmup more. WSYNC_BENCH_SAMPLES=1 prints every
 * call's time, warm-up calls included, in call order (a median that moves with the number of
 * calls: the first calls slower than the rest). */
static double time_events(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                          unsigned warmup, unsigned iters, uint64_t spin_ns, int wait,
                          wh_timed_fn fn, void *arg)
{
    double *t = calloc(iters, sizeof(*t));
    if (t == NULL) {
        fprintf(stderr, "%s: out of memory\n", who);
        exit(1);
    }
    const char *env = getenv("WSYNC_BENCH_SAMPLES");
    const int samples = env != NULL && strcmp(env, "1") == 0;
    for (unsigned i = 0; i < warmup + iters; i++) {
        const double ms = time_one(who, e0, e1, s, spin_ns, wait, fn, arg);
        if (i >= warmup)
            t[i - warmup] = ms;
        if (samples)
            printf("%s%s%.3f", i == 0 ? "      samples, ms (warm-up | timed): " : " ",
                   i == warmup ? "| " : "", ms);
    }
    if (samples)
        printf("\n");
    double med = wh_median(t, iters);
    free(t);
    return med;
}

double wh_time_events_gpu(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                          unsigned warmup, unsigned iters, uint64_t spin_ns, wh_timed_fn fn,
                          void *arg)
{
    return time_events(who, e0, e1, s, warmup, iters, spin_ns, 0, fn, arg);
}

double wh_time_events_busy(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                           unsigned warmup, unsigned iters, uint64_t busy_ns, wh_timed_fn fn,
                           void *arg)
{
    return time_events(who, e0, e1, s, warmup, iters, busy_ns, 1, fn, arg);
}

double wh_time_events(const char *who, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t s,
                      unsigned warmup, unsigned iters, wh_timed_fn fn, void *arg)
{
    return time_events(who, e0, e1, s, warmup, iters, 0, 0, fn, arg);
}

const char *wh_plugin_path(const char *name, char *buf, size_t cap)
{
    if (name != NULL && strchr(name, '/') != NULL)
        return name;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return name != NULL ? name : "libwsync_cuda.so";
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = '\0';
    snprintf(buf, cap, "%s/../lib/%s", self, name != NULL ? name : "libwsync_cuda.so");
    return buf;
}
