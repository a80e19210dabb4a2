/* See wsync_gpu_multi.h. */
#include "wsync_gpu_multi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

int wgm_count_gpus(char *why, size_t len)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, len, "pipe failed");
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        char msg[256];
        snprintf(msg, sizeof(msg), "%d %s", e == cudaSuccess ? n : 0,
                 e == cudaSuccess ? "ok" : cudaGetErrorString(e));
        ssize_t w = write(fds[1], msg, strlen(msg) + 1);
        _exit(w > 0 ? 0 : 1);
    }
    close(fds[1]);
    char msg[256] = "";
    ssize_t got = pid > 0 ? read(fds[0], msg, sizeof(msg) - 1) : -1;
    close(fds[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    int n = 0;
    char text[200] = "";
    if (got <= 0 || sscanf(msg, "%d %199[^\n]", &n, text) < 1) {
        snprintf(why, len, "device probe did not answer");
        return 0;
    }
    snprintf(why, len, "%s", n > 0 ? "CUDA devices counted" : text);
    return n;
}

int wgm_require_gpus(int need, const char *test)
{
    char why[256];
    int n = wgm_count_gpus(why, sizeof(why));
    if (n < need) {
        printf("SKIPPED: %s needs %d GPU%s, found %d (%s)\n", test, need, need == 1 ? "" : "s", n,
               why);
        fflush(stdout);
        exit(77);
    }
    return n;
}

const char *wgm_visible(int r, char *buf, size_t len)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL || v[0] == '\0') {
        snprintf(buf, len, "%d", r);
        return buf;
    }
    int i = 0;
    const char *p = v;
    while (i < r && (p = strchr(p, ',')) != NULL) {
        p++;
        i++;
    }
    if (p == NULL) {
        snprintf(buf, len, "%d", r);
        return buf;
    }
    size_t n = strcspn(p, ",");
    snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), p);
    return buf;
}

void wgm_pin_to_gpu(int r)
{
    char buf[128];
    setenv("CUDA_VISIBLE_DEVICES", wgm_visible(r, buf, sizeof(buf)), 1);
}

int wgm_run_children(int n, wgm_child_fn fn, void *arg, const int *close_fds, int n_close)
{
    pid_t pids[WGM_MAX_CHILDREN];
    int bad = 0;
    if (n > WGM_MAX_CHILDREN)
        return n;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            int rc = fn(i, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
    }
    for (int i = 0; i < n_close; i++)
        close(close_fds[i]);
    for (int i = 0; i < n; i++) {
        int st = 0;
        if (pids[i] < 0 || waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "child %d: %s %d\n", i,
                    pids[i] < 0       ? "fork failed"
                    : WIFSIGNALED(st) ? "killed by signal"
                                      : "exit status",
                    pids[i] < 0       ? 0
                    : WIFSIGNALED(st) ? WTERMSIG(st)
                                      : WEXITSTATUS(st));
            bad++;
        }
    }
    return bad;
}
