/* Update transactions and the watch on the open version's producer (wsync_driver.h). */
#include "wsync_driver_impl.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "wsync_error.h"
#include "wsync_pid.h"
#include "wsync_shm_sweep.h"

void wsync_driver_hook_begin(wsync_driver_t *d, uint64_t version)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, update_begin) && e->update_begin != NULL)
        e->update_begin(e->user, version);
}

static void wsync_driver_hook_end(wsync_driver_t *d, uint64_t version, int committed)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, update_end) && e->update_end != NULL)
        e->update_end(e->user, version, committed);
}

wsync_result_t wsync_driver_begin(wsync_driver_t *d, uint64_t version, uint64_t expect_tensors,
                                  uint64_t expect_bytes, const char *const *names, size_t n_names,
                                  wsync_error_t *err)
{
    const uint64_t open = d->txn.phase == WSYNC_TXN_UPDATING ? d->txn.version : 0;
    wsync_result_t rc =
        wsync_txn_begin(&d->txn, version, expect_tensors, expect_bytes, names, n_names, err);
    if (rc != WSYNC_OK)
        return rc;
    /* experts another EP rank holds never come here (one question to the engine first: most
     * run without expert parallelism, and a version may declare thousands of names) */
    const int ep = wsync_map_ep_active(d->cfg.engine);
    for (size_t i = 0; ep && i < n_names; i++)
        if (names[i] != NULL && !wsync_map_owned(d->cfg.map, d->cfg.engine, names[i]))
            wsync_txn_elsewhere(&d->txn, names[i]);
    if (open != 0) {
        wsync_driver_log(d, WSYNC_LOG_WARN, "wsync: %s", d->txn.reason);
        wsync_driver_hook_end(d, open, 0);
    }
    wsync_driver_hook_begin(d, version);
    return WSYNC_OK;
}

wsync_result_t wsync_driver_commit(wsync_driver_t *d, uint64_t version, wsync_error_t *err)
{
    wsync_result_t rc = wsync_txn_commit(&d->txn, version, err);
    if (rc == WSYNC_OK)
        wsync_driver_hook_end(d, d->txn.committed, 1);
    return rc;
}

void wsync_driver_abort(wsync_driver_t *d, const char *reason)
{
    const uint64_t v = d->txn.version;
    if (wsync_txn_abort(&d->txn, reason)) {
        wsync_driver_log(d, WSYNC_LOG_WARN, "wsync: %s", d->txn.reason);
        wsync_driver_hook_end(d, v, 0);
    }
}

/* Hold the open version's producer as a pidfd from the moment its pid is known. */
void wsync_driver_watch(wsync_driver_t *d)
{
    const int64_t pid = d->txn.producer_pid;
    if (pid == d->producer_fd_pid)
        return;
    if (d->producer_fd >= 0)
        close(d->producer_fd);
    d->producer_fd = pid > 0 ? (int)syscall(SYS_pidfd_open, (pid_t)pid, 0) : -1;
    d->producer_fd_pid = pid;
}

/* Has the producer `pid` ended? Through its pidfd (readable once it exits), else kill(pid, 0). */
static int wsync_driver_producer_gone(wsync_driver_t *d, int64_t pid)
{
    wsync_driver_watch(d);
    if (d->producer_fd >= 0) {
        struct pollfd p = {.fd = d->producer_fd, .events = POLLIN};
        return poll(&p, 1, 0) > 0;
    }
    return wsync_pid_exited(pid, 1);
}

void wsync_driver_check(wsync_driver_t *d)
{
    const int64_t pid = d->txn.producer_pid;
    if (d->txn.phase != WSYNC_TXN_UPDATING || pid <= 0)
        return;
    if (wsync_driver_producer_gone(d, pid)) {
        char why[96];
        snprintf(why, sizeof(why), "left unfinished: its producer (pid %lld) is gone",
                 (long long)pid);
        wsync_driver_abort(d, why);
        wsync_shm_sweep(pid); /* its staging, which it could not unlink */
    }
}

json_t *wsync_driver_state(wsync_driver_t *d)
{
    wsync_driver_check(d);
    return wsync_txn_state(&d->txn);
}

uint64_t wsync_driver_committed(const wsync_driver_t *d, int *updating)
{
    if (updating != NULL)
        *updating = d->txn.phase == WSYNC_TXN_UPDATING;
    return d->txn.committed;
}

uint64_t wsync_driver_open_version(const wsync_driver_t *d)
{
    return d->txn.phase == WSYNC_TXN_UPDATING ? d->txn.version : 0;
}

void wsync_driver_set_producer(wsync_driver_t *d, int64_t pid)
{
    if (d->txn.phase == WSYNC_TXN_UPDATING && pid > 0) {
        d->txn.producer_pid = pid;
        wsync_driver_watch(d);
    }
}
