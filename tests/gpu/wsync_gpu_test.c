/* See wsync_gpu_test.h. */
#include "wsync_gpu_test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

void wg_require_device(const char *plugin)
{
    char why[512];
    int rc = wh_probe(plugin, why, sizeof(why));
    if (rc == 77) {
        printf("SKIPPED: no CUDA device (%s)\n", why);
        fflush(stdout);
        exit(77);
    }
    if (rc != 0) {
        fprintf(stderr, "cannot load %s: %s\n", plugin, why);
        exit(1);
    }
}

const wsync_plugin_t *wg_load(const char *plugin, int stats)
{
    char why[512];
    const wsync_plugin_t *p = NULL;
    if (stats)
        setenv("WSYNC_CUDA_STATS", "1", 1);
    wsync_result_t rc = wh_load(plugin, &p, why, sizeof(why));
    WG_CHECK(rc == WSYNC_OK, "%s", why);
    return p;
}

wsync_consumer_t *wg_consumer(const wsync_plugin_t *p, uint32_t timeout_ms)
{
    WG_CK(cudaSetDevice(0));
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = timeout_ms};
    wsync_consumer_t *c;
    WG_OK(p->consumer->create(&cc, &c, err));
    return c;
}

void wg_close_and_retire(const wsync_plugin_t *p, wsync_staging_t *s, int fd)
{
    char *bye;
    WG_CHECK(wh_recv(fd, &bye, NULL) == 0, "no close message from the consumer");
    wh_free(bye);
    WG_OK(p->producer->retire(s, err));
}

static pid_t wg_fork_role(wg_role_fn fn, int fd, int other, void *arg)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(other);
        int rc = fn(fd, arg);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    return pid;
}

int wg_run_pair(wg_role_fn producer, wg_role_fn consumer, void *arg, int *producer_status)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return -1;
    pid_t p = wg_fork_role(producer, sv[0], sv[1], arg);
    pid_t c = wg_fork_role(consumer, sv[1], sv[0], arg);
    close(sv[0]);
    close(sv[1]);
    int ps = 0, cs = 0;
    if (c > 0)
        waitpid(c, &cs, 0);
    if (p > 0)
        waitpid(p, &ps, 0);
    if (producer_status)
        *producer_status = p > 0 && WIFEXITED(ps) ? WEXITSTATUS(ps) : -1;
    return c > 0 && WIFEXITED(cs) ? WEXITSTATUS(cs) : -1;
}

int wg_pair_passes(wg_role_fn producer, wg_role_fn consumer, void *arg)
{
    int ps = -1;
    int cs = wg_run_pair(producer, consumer, arg, &ps);
    if (cs != 0 || ps != 0)
        fprintf(stderr, "producer exited %d, consumer exited %d (-1: killed by a signal)\n", ps,
                cs);
    return cs == 0 && ps == 0;
}

int wg_skipped;

int wg_finish(int rc, const char *test)
{
    if (rc != 0 || wg_skipped == 0)
        return rc;
    printf("SKIPPED (partial): %s ran, but %d of its tests were left out (their SKIPPED lines "
           "above say why); everything that ran passed\n",
           test, wg_skipped);
    fflush(stdout);
    return 77;
}
