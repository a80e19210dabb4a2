/* Control block: generations published with C11 atomics (by a host, or by a GPU's stream memory
 * write), waits on futex words in shared memory (FUTEX_WAIT without PRIVATE: the words are shared
 * between processes). Waits spin, then sleep in short slices, re-checking the generation and the
 * liveness of the peer each time. */
#include "wsync_control.h"
#include "wsync_clock.h"
#include "wsync_pid.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "wsync_error.h"
#include "wsync_shm_sweep.h"

void wsync_control_init(wsync_control_t *c, uint64_t data_offset, uint64_t data_bytes)
{
    c->version = WSYNC_CONTROL_VERSION;
    c->producer_pid = (int64_t)getpid();
    atomic_store(&c->consumer_pid, 0);
    atomic_store(&c->ready_generation, 0);
    atomic_store(&c->consumed_generation, 0);
    atomic_store(&c->ready_seq, 0);
    atomic_store(&c->consumed_seq, 0);
    atomic_store(&c->mapped, 0);
    atomic_store(&c->retired, 0);
    for (unsigned i = 0; i < WSYNC_CONTROL_MAX_MAPPERS; i++)
        atomic_store(&c->mapper_pid[i], 0);
    c->data_offset = data_offset;
    c->data_bytes = data_bytes;
    /* The magic last: a reader that sees it sees an initialised block. */
    atomic_thread_fence(memory_order_release);
    c->magic = WSYNC_CONTROL_MAGIC;
}

wsync_result_t wsync_control_check(const wsync_control_t *c, wsync_error_t *err)
{
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "control block is NULL");
    if (c->magic != WSYNC_CONTROL_MAGIC)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "segment has magic 0x%08x, not a wsync control block (0x%08x); the "
                          "manifest names the wrong buffer",
                          c->magic, WSYNC_CONTROL_MAGIC);
    if (c->version != WSYNC_CONTROL_VERSION)
        return WSYNC_FAIL(err, WSYNC_ERR_INCOMPATIBLE,
                          "control block version %u, this plugin speaks %u; use the same wsync "
                          "release on both sides",
                          c->version, WSYNC_CONTROL_VERSION);
    return WSYNC_OK;
}

static int wsync_control_take_slot(wsync_control_t *c, int64_t pid)
{
    for (unsigned i = 0; i < WSYNC_CONTROL_MAX_MAPPERS; i++) {
        int64_t expected = 0;
        if (atomic_compare_exchange_strong(&c->mapper_pid[i], &expected, pid)) {
            atomic_fetch_add(&c->mapped, 1);
            atomic_store(&c->consumer_pid, pid);
            return 1;
        }
    }
    return 0;
}

wsync_result_t wsync_control_attach(wsync_control_t *c, wsync_error_t *err)
{
    int64_t me = (int64_t)getpid();
    if (wsync_control_take_slot(c, me))
        return WSYNC_OK;
    wsync_control_live_mappers(c, NULL); /* reclaim slots of crashed holders, then retry */
    if (wsync_control_take_slot(c, me))
        return WSYNC_OK;
    return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                      "all %u mapper slots of this buffer are held by live processes; close "
                      "handles in other consumers first",
                      WSYNC_CONTROL_MAX_MAPPERS);
}

void wsync_control_detach(wsync_control_t *c)
{
    int64_t me = (int64_t)getpid();
    for (unsigned i = 0; i < WSYNC_CONTROL_MAX_MAPPERS; i++) {
        int64_t expected = me;
        if (atomic_compare_exchange_strong(&c->mapper_pid[i], &expected, 0)) {
            atomic_fetch_sub(&c->mapped, 1);
            return;
        }
    }
}

uint32_t wsync_control_live_mappers(wsync_control_t *c, int64_t *a_pid)
{
    uint32_t live = 0;
    for (unsigned i = 0; i < WSYNC_CONTROL_MAX_MAPPERS; i++) {
        int64_t pid = atomic_load(&c->mapper_pid[i]);
        if (pid == 0)
            continue;
        if (wsync_pid_exited(pid, 0)) {
            if (atomic_compare_exchange_strong(&c->mapper_pid[i], &pid, 0))
                atomic_fetch_sub(&c->mapped, 1);
            continue;
        }
        live++;
        if (a_pid != NULL)
            *a_pid = pid;
    }
    return live;
}

wsync_result_t wsync_control_retire(wsync_control_t *c, const char *name, wsync_error_t *err)
{
    int64_t holder = 0;
    uint32_t mapped = wsync_control_live_mappers(c, &holder);
    if (mapped > 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                          "staging buffer %s is still mapped by %u consumer(s) (pid %lld): the "
                          "consumer must close_handle and ack before the producer retires",
                          name, mapped, (long long)holder);
    atomic_store(&c->retired, 1);
    return WSYNC_OK;
}

static void wsync_futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void wsync_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void wsync_control_signal(_Atomic uint64_t *gen, _Atomic uint32_t *seq, uint64_t g)
{
    uint64_t cur = atomic_load(gen);
    while (cur < g && !atomic_compare_exchange_weak(gen, &cur, g))
        ;
    atomic_fetch_add(seq, 1);
    wsync_futex_wake_all(seq);
}

void wsync_control_signal_ready(wsync_control_t *c, uint64_t generation)
{
    wsync_control_signal(&c->ready_generation, &c->ready_seq, generation);
}

void wsync_control_signal_consumed(wsync_control_t *c, uint64_t generation)
{
    wsync_control_signal(&c->consumed_generation, &c->consumed_seq, generation);
}

/* A generation a GPU writes (a stream memory write into the registered block) wakes no futex:
 * the wait spins (yielding) for its first WSYNC_CONTROL_SPIN_MS, the span of a bucket's copy,
 * then sleeps in futex slices of WSYNC_CONTROL_SLICE_MS, so a GPU write is seen within one. */
#define WSYNC_CONTROL_SPIN_MS 20u
#define WSYNC_CONTROL_SLICE_MS 1u

static wsync_result_t wsync_control_wait(wsync_control_t *c, _Atomic uint64_t *gen,
                                         _Atomic uint32_t *seq, const char *what,
                                         uint64_t generation, uint32_t timeout_ms, int64_t peer_pid,
                                         wsync_error_t *err)
{
    const uint64_t start = wsync_now_ms(), deadline = start + timeout_ms;

    for (;;) {
        uint32_t s = atomic_load(seq);
        uint64_t seen = atomic_load(gen);
        if (seen >= generation)
            return WSYNC_OK;
        if (wsync_pid_exited(peer_pid, 0)) {
            wsync_shm_sweep(peer_pid); /* its segments: nobody else will unlink them */
            return wsync_fail(err, WSYNC_ERR_PEER_GONE, __func__,
                              "waiting for %s generation %llu (last seen %llu): peer pid %lld "
                              "has exited; restart it and publish again",
                              what, (unsigned long long)generation, (unsigned long long)seen,
                              (long long)peer_pid);
        }
        if (atomic_load(&c->retired))
            return wsync_fail(err, WSYNC_ERR_PEER_GONE, __func__,
                              "waiting for %s generation %llu (last seen %llu): the producer "
                              "retired the buffer; close the handle",
                              what, (unsigned long long)generation, (unsigned long long)seen);
        uint64_t now = wsync_now_ms();
        if (now >= deadline)
            return wsync_fail(err, WSYNC_ERR_TIMEOUT, __func__,
                              "%s generation %llu did not arrive within %u ms (last seen %llu); "
                              "is the peer alive and did it publish that generation?",
                              what, (unsigned long long)generation, timeout_ms,
                              (unsigned long long)seen);
        uint64_t left = deadline - now;
        if (now - start < WSYNC_CONTROL_SPIN_MS)
            sched_yield();
        else
            wsync_futex_wait(
                seq, s, left < WSYNC_CONTROL_SLICE_MS ? (uint32_t)left : WSYNC_CONTROL_SLICE_MS);
    }
}

wsync_result_t wsync_control_wait_ready(wsync_control_t *c, uint64_t generation,
                                        uint32_t timeout_ms, int64_t peer_pid, wsync_error_t *err)
{
    return wsync_control_wait(c, &c->ready_generation, &c->ready_seq, "ready", generation,
                              timeout_ms, peer_pid, err);
}

wsync_result_t wsync_control_wait_consumed(wsync_control_t *c, uint64_t generation,
                                           uint32_t timeout_ms, int64_t peer_pid,
                                           wsync_error_t *err)
{
    return wsync_control_wait(c, &c->consumed_generation, &c->consumed_seq, "consumed", generation,
                              timeout_ms, peer_pid, err);
}

void wsync_control_publish(wsync_control_t *c, uint64_t generation)
{
    atomic_store(&c->published_generation, generation);
}

wsync_result_t wsync_control_check_published(wsync_control_t *c, uint64_t generation,
                                             const char *name, wsync_error_t *err)
{
    const uint64_t last = atomic_load(&c->published_generation);
    if (last == 0 || generation <= last)
        return WSYNC_OK;
    return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                      "generation %llu of buffer %s was never published (its producer's last is "
                      "%llu): the manifest is not the producer's",
                      (unsigned long long)generation, name, (unsigned long long)last);
}
