/* Fault injection on the CUDA plugin (docs/RELIABILITY.md, "CUDA plugin (GPU)"). A producer and
 * an engine run in two forked processes that this test process (which never touches CUDA)
 * drives over sockets, relaying manifests and SIGKILLing one of them at chosen points. Every
 * scenario runs for both staging kinds, legacy cuda_ipc and cuda_vmm_fd
 * (WSYNC_CUDA_STAGING_KIND); the vmm runs print a SKIPPED line where the fd cannot be taken.
 *
 * What must hold (the commit rule of the CUDA plugin):
 *  - producer killed mid-bucket: the engine ends with every parameter of the old generation or
 *    every parameter of the new one (checked word by word on the device), never a mix; an
 *    error is returned within the consumer's timeout + slack, never a hang; the engine then
 *    syncs from a restarted producer;
 *  - engine killed mid-copy: wait_consumed returns PEER_GONE or TIMEOUT naming the generation,
 *    within the timeout; the staging buffer still holds the bucket; a restarted engine completes
 *    the same generation from it, then the next one;
 *  - a replayed manifest of an old generation is refused with STALE_GENERATION, with the handle
 *    held and after it was closed and reopened; the weights stay at the newest generation;
 *  - retire while an engine maps the buffer: BUSY; after close_handle (or the engine's death):
 *    OK. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cmocka.h>

/* Buffers cross the harness boundary (allocated there, freed here): the real allocator. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#include "rel_proc.h"
#include "wsync_gpu_rel.h"
#include "wsync_manifest.h"
#include "wsync_client.h"

#define FN 8
#define FT (4u << 20) /* 8 x 4 MiB = 32 MiB per bucket */
#define TIMEOUT_MS 2000
#define SLACK_MS 3000  /* process teardown of a killed CUDA process, CUDA calls after the wait */
#define REPLY_MS 20000 /* bound on any reply that involves no fault */
#define CHILD_ALARM_S 90u

/* ------------------------------------------------------------------ children */

typedef struct role_arg {
    const char *kind; /* "ipc" or "vmm" */
    uint64_t base;    /* generation g holds the contents of generation g + base */
    uint32_t flags;   /* extra staging flags (WSYNC_STAGING_NO_DIGESTS) */
} role_arg_t;

static void reply(int fd, wsync_result_t r, long ms, const char *msg)
{
    char buf[1200];
    snprintf(buf, sizeof(buf), "R %d %ld %s", (int)r, ms, msg ? msg : "");
    WG_CHECK(wh_send_str(fd, buf) == 0, "the test process is gone");
}

/* Producer. Publishes generation 1 at start ("M <json>", or "E <code> <message>" when the
 * staging cannot be created), then serves: "wait <g>", "bucket <send|stage|publish> <spin_ms>"
 * (stage: SIGKILL itself after stage; publish: after publish, before sending), "readback <g>",
 * "retire". */
static int producer(int fd, void *varg)
{
    const role_arg_t *arg = varg;
    wr_watchdog("producer", CHILD_ALARM_S);
    setenv("WSYNC_CUDA_STAGING_KIND", arg->kind, 1);
    /* cuda_vmm_fd: the engine (a sibling, not a descendant) takes our fd with pidfd_getfd,
     * which Yama ptrace_scope 1 allows only to a declared ptracer. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    wr_phase("load");
    const wsync_plugin_t *p = wg_load(WG_PLUGIN, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {.struct_size = sizeof(cfg),
                                  .bytes = (uint64_t)FN * FT,
                                  .flags = WSYNC_STAGING_FIXED_LAYOUT | arg->flags,
                                  .timeout_ms = TIMEOUT_MS};
    wsync_staging_t *s;
    wsync_error_t e = {.struct_size = sizeof(e)};
    wsync_result_t r = p->producer->create(&cfg, &s, &e);
    if (r != WSYNC_OK) {
        char buf[1100];
        snprintf(buf, sizeof(buf), "E %d %s", (int)r, e.message);
        wh_send_str(fd, buf);
        return 0;
    }
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *trainer;
    WG_CK(cudaMalloc((void **)&trainer, (size_t)FN * FT));
    char names[FN][32];
    wsync_stage_tensor_t t[FN];
    for (size_t k = 0; k < FN; k++) {
        snprintf(names[k], sizeof(names[k]), "layers.%zu.weight", k);
        t[k] = (wsync_stage_tensor_t){.struct_size = sizeof(t[k]),
                                      .name = names[k],
                                      .dtype = WSYNC_DTYPE_U8,
                                      .ndim = 1,
                                      .shape = {FT},
                                      .src = trainer + (size_t)k * FT};
    }
    uint64_t offsets[FN];
    uint64_t gen = 0;
    const char *mode = "send";
    unsigned spin_ms = 0;
    char *cmd = NULL;
    for (;;) {
        if (cmd == NULL || strncmp(cmd, "bucket ", 7) == 0) {
            char m[16] = "send";
            spin_ms = 0;
            if (cmd != NULL && sscanf(cmd + 7, "%15s %u", m, &spin_ms) >= 1)
                mode = strcmp(m, "stage") == 0     ? "stage"
                       : strcmp(m, "publish") == 0 ? "publish"
                                                   : "send";
            wr_phase("bucket %llu (%s)", (unsigned long long)gen + 1, mode);
            if (spin_ms) /* the stage runs behind it: the kill lands while staging is queued */
                WG_CK(wh_spin((uint64_t)spin_ms * 1000000ull, st));
            for (size_t k = 0; k < FN; k++)
                WG_CK(wh_fill(trainer + (size_t)k * FT, FT, wr_seed(gen + 1 + arg->base, k), st));
            WG_OK(p->producer->stage(s, st, t, FN, err));
            if (strcmp(mode, "stage") == 0)
                raise(SIGKILL);
            const char *json;
            WG_OK(p->producer->publish(s, st, 0, &json, &gen, err));
            if (strcmp(mode, "publish") == 0)
                raise(SIGKILL);
            wsync_manifest_owned_t *own;
            WG_OK(wsync_manifest_parse(json, strlen(json), &own, err));
            for (size_t k = 0; k < FN; k++)
                offsets[k] = own->view.tensors[k].offset;
            wsync_manifest_free(own);
            size_t n = strlen(json) + 3;
            char *msg = malloc(n);
            snprintf(msg, n, "M %s", json);
            WG_CHECK(wh_send_str(fd, msg) == 0, "the test process is gone");
            free(msg);
        } else if (strncmp(cmd, "wait ", 5) == 0) {
            uint64_t g = strtoull(cmd + 5, NULL, 10);
            wr_phase("wait_consumed(%llu)", (unsigned long long)g);
            wsync_error_t we = {.struct_size = sizeof(we)};
            long t0 = wr_now_ms();
            r = p->producer->wait_consumed(s, st, g, &we);
            reply(fd, r, wr_now_ms() - t0, we.message);
        } else if (strncmp(cmd, "readback ", 9) == 0) {
            uint64_t g = strtoull(cmd + 9, NULL, 10);
            wr_phase("read_back");
            unsigned char *host = malloc(FT);
            char msg[600] = "";
            r = WSYNC_OK;
            for (size_t k = 0; k < FN && r == WSYNC_OK; k++) {
                wsync_error_t re = {.struct_size = sizeof(re)};
                r = p->producer->read_back(s, offsets[k], host, FT, &re);
                if (r != WSYNC_OK) {
                    snprintf(msg, sizeof(msg), "read_back: %s", re.message);
                    break;
                }
                for (size_t j = 0; j < FT; j++)
                    if (host[j] != wg_pattern_byte(wr_seed(g + arg->base, k), j)) {
                        snprintf(msg, sizeof(msg),
                                 "staging tensor %zu byte %zu is %u, generation %llu has %u", k, j,
                                 host[j], (unsigned long long)g,
                                 wg_pattern_byte(wr_seed(g + arg->base, k), j));
                        r = WSYNC_ERR_DIGEST_MISMATCH;
                        break;
                    }
            }
            free(host);
            reply(fd, r, 0, msg);
        } else if (strcmp(cmd, "retire") == 0) {
            wr_phase("retire");
            wsync_error_t re = {.struct_size = sizeof(re)};
            r = p->producer->retire(s, &re);
            reply(fd, r, 0, re.message);
            if (r == WSYNC_OK) {
                wh_free(cmd);
                return 0;
            }
        }
        wh_free(cmd);
        cmd = NULL;
        wr_phase("idle");
        alarm(0); /* idle is bounded by the test process, which closes the socket or kills */
        if (wh_recv(fd, &cmd, NULL) != 0)
            return 0; /* the test process closed the socket */
        wr_watchdog("producer", CHILD_ALARM_S);
    }
}

typedef struct engine {
    const wsync_plugin_t *p;
    wsync_consumer_t *c;
    wsync_stream_t st;
    unsigned char *dst[FN];
    wsync_handle_t *held; /* keeps the producer's buffer mapped between syncs */
    int64_t held_pid;
    uint64_t offsets[FN];
} engine_t;

/* Every parameter holds contents generation cg? 0; -1 (values differ) or -2 (the CUDA context
 * is broken) with msg set. */
static int engine_check(engine_t *e, uint64_t cg, char *msg, size_t cap)
{
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        snprintf(msg, cap, "sync reported OK but cudaDeviceSynchronize then failed: %s (%s)",
                 cudaGetErrorName(ce), cudaGetErrorString(ce));
        return -2;
    }
    for (size_t k = 0; k < FN; k++) {
        unsigned long long bad = wr_count_bad(e->dst[k], FT, wr_seed(cg, k));
        if (bad) {
            snprintf(msg, cap,
                     "sync reported OK but parameter %zu has %llu of %u words that differ from "
                     "generation %llu",
                     k, bad, FT / 8, (unsigned long long)cg);
            return -1;
        }
    }
    return 0;
}

/* Copy (with digests unless NULL), record (wait), check contents cg. */
static wsync_result_t engine_copy(engine_t *e, wsync_handle_t *h, uint64_t g, uint64_t cg,
                                  const uint64_t *digests, unsigned spin_ms, int fd,
                                  wsync_error_t *err)
{
    wsync_copy_op_t ops[FN];
    for (size_t k = 0; k < FN; k++)
        ops[k] = (wsync_copy_op_t){.src_offset = e->offsets[k],
                                   .src_pitch = FT,
                                   .dst = e->dst[k],
                                   .dst_pitch = FT,
                                   .dst_extent = FT,
                                   .rows = 1,
                                   .row_bytes = FT,
                                   .digest = digests ? digests[k] : 0,
                                   .has_digest = digests != NULL};
    if (spin_ms)
        WG_CK(wh_spin((uint64_t)spin_ms * 1000000ull, (cudaStream_t)e->st));
    wr_phase("copy_weights(generation %llu)", (unsigned long long)g);
    wsync_result_t r =
        e->p->consumer->copy_weights(e->c, h, e->st, g, ops, FN, WSYNC_COPY_VERIFY, err);
    if (fd >= 0 && r == WSYNC_OK)
        WG_CHECK(wh_send_str(fd, "copying") == 0, "the test process is gone");
    if (r != WSYNC_OK)
        return r;
    wr_phase("record_consumed(generation %llu)", (unsigned long long)g);
    r = e->p->consumer->record_consumed(e->c, h, 1, err);
    if (r != WSYNC_OK)
        return r;
    wr_phase("checking generation %llu", (unsigned long long)cg);
    int bad = engine_check(e, cg, err->message, sizeof(err->message));
    if (bad != 0)
        return bad == -2 ? WSYNC_ERR_SYSTEM : WSYNC_ERR_DIGEST_MISMATCH;
    return WSYNC_OK;
}

/* "sync <cg> <spin_ms>\n<json>": parse, open, hold the buffer, copy, record, check, close. */
static wsync_result_t engine_sync(engine_t *e, const char *line, int fd, wsync_error_t *err)
{
    unsigned long long cg = 0;
    unsigned spin = 0;
    sscanf(line + 5, "%llu %u", &cg, &spin);
    const char *json = strchr(line, '\n');
    WG_CHECK(json != NULL, "sync without a manifest");
    json++;
    const wsync_manifest_t *m = NULL;
    wsync_handle_t *h = NULL;
    wr_phase("parse_manifest");
    wsync_result_t r = e->p->consumer->parse_manifest(e->c, json, strlen(json), &m, err);
    if (r == WSYNC_OK) {
        wr_phase("open_handle");
        r = e->p->consumer->open_handle(e->c, &m->buffer, &h, err);
    }
    if (r == WSYNC_OK && e->held_pid != m->buffer.pid) {
        wr_phase("re-holding the buffer");
        wsync_error_t ce = {.struct_size = sizeof(ce)};
        if (e->held)
            e->p->consumer->close_handle(e->c, e->held, &ce);
        e->held = NULL;
        e->held_pid = 0;
        r = e->p->consumer->open_handle(e->c, &m->buffer, &e->held, err);
        if (r == WSYNC_OK)
            e->held_pid = m->buffer.pid;
    }
    if (r == WSYNC_OK) {
        uint64_t dig[FN];
        for (size_t k = 0; k < FN; k++) {
            e->offsets[k] = m->tensors[k].offset;
            dig[k] = m->tensors[k].digest;
        }
        r = engine_copy(e, h, m->generation, cg, m->tensors[0].has_digest ? dig : NULL, spin,
                        spin ? fd : -1, err);
    }
    wr_phase("close_handle");
    wsync_error_t ce = {.struct_size = sizeof(ce)};
    if (h)
        e->p->consumer->close_handle(e->c, h, &ce);
    if (m)
        e->p->consumer->manifest_free(e->c, m);
    return r;
}

/* Engine. Serves "sync ...", "expect <g> <cg>" (copy generation g through the held handle before
 * its manifest exists, digests of contents cg), "state <a> <b>", "drop", "bye". */
static int engine(int fd, void *varg)
{
    (void)varg;
    wr_watchdog("engine", CHILD_ALARM_S);
    wr_phase("load");
    engine_t e = {.p = wg_load(WG_PLUGIN, 0)};
    WG_CK(cudaSetDevice(0));
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = TIMEOUT_MS};
    WG_OK(e.p->consumer->create(&cc, &e.c, err));
    WG_OK(e.p->consumer->stream_create(e.c, &e.st, err));
    for (size_t k = 0; k < FN; k++)
        WG_OK(e.p->consumer->mem_alloc(e.c, FT, (void **)&e.dst[k], err));
    for (;;) {
        char *cmd;
        wr_phase("idle");
        alarm(0); /* idle is bounded by the test process, which closes the socket or kills */
        if (wh_recv(fd, &cmd, NULL) != 0)
            return 0;
        wr_watchdog("engine", (TIMEOUT_MS + SLACK_MS) / 1000 + 10);
        wsync_error_t err = {.struct_size = sizeof(err)};
        long t0 = wr_now_ms();
        if (strncmp(cmd, "sync ", 5) == 0) {
            wsync_result_t r = engine_sync(&e, cmd, fd, &err);
            reply(fd, r, wr_now_ms() - t0, err.message);
        } else if (strncmp(cmd, "expect ", 7) == 0) {
            unsigned long long g = 0, cg = 0;
            sscanf(cmd + 7, "%llu %llu", &g, &cg);
            WG_CHECK(e.held != NULL, "expect without a held buffer");
            uint64_t dig[FN];
            for (size_t k = 0; k < FN; k++)
                dig[k] = wr_pattern_digest(wr_seed(cg, k), FT);
            WG_CHECK(wh_send_str(fd, "entering") == 0, "the test process is gone");
            t0 = wr_now_ms();
            wsync_result_t r = engine_copy(&e, e.held, g, cg, dig, 0, -1, &err);
            reply(fd, r, wr_now_ms() - t0, err.message);
        } else if (strncmp(cmd, "state ", 6) == 0) {
            unsigned long long a = 0, b = 0;
            sscanf(cmd + 6, "%llu %llu", &a, &b);
            wr_phase("state: cudaDeviceSynchronize");
            cudaError_t ce = cudaDeviceSynchronize();
            char buf[512];
            if (ce != cudaSuccess) {
                snprintf(buf, sizeof(buf), "X the engine's CUDA context is broken: %s (%s)",
                         cudaGetErrorName(ce), cudaGetErrorString(ce));
                WG_CHECK(wh_send_str(fd, buf) == 0, "the test process is gone");
                wh_free(cmd);
                return 4;
            }
            wr_phase("state: classifying");
            int na = 0, nb = 0, no = 0, len = 0;
            char detail[256] = "";
            for (size_t k = 0; k < FN; k++) {
                unsigned long long ba = wr_count_bad(e.dst[k], FT, wr_seed(a, k));
                unsigned long long bb = wr_count_bad(e.dst[k], FT, wr_seed(b, k));
                na += ba == 0;
                nb += ba != 0 && bb == 0;
                no += ba != 0 && bb != 0;
                len += snprintf(detail + len, sizeof(detail) - (size_t)len, "%c",
                                ba == 0   ? 'o'
                                : bb == 0 ? 'n'
                                          : 'X');
            }
            snprintf(buf, sizeof(buf), "S %d %d %d %s", na, nb, no, detail);
            WG_CHECK(wh_send_str(fd, buf) == 0, "the test process is gone");
        } else if (strcmp(cmd, "drop") == 0 || strcmp(cmd, "bye") == 0) {
            wr_phase("close the held handle");
            wsync_result_t r = WSYNC_OK;
            if (e.held)
                r = e.p->consumer->close_handle(e.c, e.held, &err);
            e.held = NULL;
            e.held_pid = 0;
            if (strcmp(cmd, "bye") == 0) {
                wr_phase("finalize");
                for (size_t k = 0; k < FN; k++)
                    e.p->consumer->mem_free(e.c, e.dst[k], &err);
                e.p->consumer->stream_destroy(e.c, e.st, &err);
                if (r == WSYNC_OK)
                    r = e.p->consumer->finalize(e.c, &err);
                reply(fd, r, wr_now_ms() - t0, err.message);
                wh_free(cmd);
                return 0;
            }
            reply(fd, r, wr_now_ms() - t0, err.message);
        }
        wh_free(cmd);
    }
}

/* ------------------------------------------------------------------ the test process */

#define MAX_KIDS 8
static pid_t kids[MAX_KIDS];
static int kid_fd[MAX_KIDS];

typedef struct kid {
    pid_t pid;
    int fd;
    const char *name;
} kid_t;

static kid_t spawn(const char *name, wr_child_fn fn, role_arg_t *arg)
{
    kid_t k = {.name = name};
    k.pid = wr_spawn(fn, arg, &k.fd);
    assert_true(k.pid > 0);
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] == 0) {
            kids[i] = k.pid;
            kid_fd[i] = k.fd;
            break;
        }
    return k;
}

static void forget(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] == pid) {
            close(kid_fd[i]);
            kids[i] = 0;
        }
}

/* Kill + reap (the peer's liveness check sees the pid gone only once it is reaped). */
static void kill_kid(kid_t *k)
{
    wr_kill(k->pid);
    rel_proc_unlink_shm_of(k->pid);
    forget(k->pid);
}

/* Reap a child expected to end; its status is printed. */
static int reap_kid(kid_t *k, int ms)
{
    int st = wr_wait(k->pid, ms);
    rel_proc_unlink_shm_of(k->pid);
    forget(k->pid);
    return st;
}

/* Teardown: no child outlives a test, failed or not. */
static int kill_all(void **state)
{
    (void)state;
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] != 0) {
            wr_kill(kids[i]);
            rel_proc_unlink_shm_of(kids[i]);
            close(kid_fd[i]);
            kids[i] = 0;
        }
    return 0;
}

static void send_cmd(kid_t *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void send_cmd(kid_t *k, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (wh_send_str(k->fd, buf) != 0)
        fail_msg("%s (pid %d) is gone: cannot send \"%s\"", k->name, (int)k->pid, buf);
}

/* "sync <cg> <spin>\n<json>" to the engine. */
static void send_sync(kid_t *e, uint64_t cg, unsigned spin, const char *json)
{
    size_t n = strlen(json) + 64;
    char *buf = malloc(n);
    snprintf(buf, n, "sync %llu %u\n%s", (unsigned long long)cg, spin, json);
    int rc = wh_send_str(e->fd, buf);
    free(buf);
    if (rc != 0)
        fail_msg("engine (pid %d) is gone: cannot send a manifest", (int)e->pid);
}

/* The next message of k within ms; fails the test naming what was awaited. Returned text is
 * malloc'd. */
static char *expect_msg(kid_t *k, int ms, const char *prefix, const char *what)
{
    char *m = NULL;
    int rc = wr_recv(k->fd, &m, NULL, ms);
    if (rc == -2) {
        wr_kill(k->pid);
        forget(k->pid);
        fail_msg("%s (pid %d) did not answer within %d ms while %s: it hangs (killed now; its "
                 "watchdog message, if any, is above)",
                 k->name, (int)k->pid, ms, what);
    }
    if (rc != 0) {
        int st = wr_wait(k->pid, 5000);
        forget(k->pid);
        fail_msg("%s (pid %d) closed its socket while %s (exit %d; negative: signal; 3: its "
                 "watchdog; 4: broken CUDA context; its message is above)",
                 k->name, (int)k->pid, what, st);
    }
    if (strncmp(m, prefix, strlen(prefix)) != 0)
        fail_msg("%s (pid %d) answered \"%.400s\" while %s, expected \"%s...\"", k->name,
                 (int)k->pid, m, what, prefix);
    return m;
}

typedef struct result {
    int code;
    long ms;
    char msg[1100];
} result_t;

static result_t expect_result(kid_t *k, int ms, const char *what)
{
    result_t r = {0};
    char *m = expect_msg(k, ms, "R ", what);
    int off = 0;
    if (sscanf(m, "R %d %ld %n", &r.code, &r.ms, &off) < 2)
        fail_msg("bad reply \"%s\"", m);
    snprintf(r.msg, sizeof(r.msg), "%s", m + off);
    wh_free(m);
    return r;
}

static void expect_ok(kid_t *k, int ms, const char *what)
{
    result_t r = expect_result(k, ms, what);
    if (r.code != WSYNC_OK)
        fail_msg("%s: %s answered %s: %s", what, k->name, wsync_strerror((wsync_result_t)r.code),
                 r.msg);
}

/* Start a producer; returns 0 and its first manifest in *json, or -1 (vmm unusable: SKIPPED line
 * printed). */
static int start_producer(kid_t *p, role_arg_t *arg, char **json)
{
    *p = spawn("producer", producer, arg);
    char *m = NULL;
    int rc = wr_recv(p->fd, &m, NULL, REPLY_MS);
    if (rc != 0)
        fail_msg("producer (pid %d, %s) sent no first manifest (%s)", (int)p->pid, arg->kind,
                 rc == -2 ? "timeout" : "it exited; message above");
    if (strncmp(m, "E ", 2) == 0) {
        int code = atoi(m + 2);
        if (strcmp(arg->kind, "vmm") == 0 &&
            (code == WSYNC_ERR_NOT_SUPPORTED || code == WSYNC_ERR_PERMISSION)) {
            print_message("SKIPPED: cuda_vmm_fd staging not available here: %s\n", m);
            wh_free(m);
            return -1;
        }
        fail_msg("producer (%s) could not create its staging: %s", arg->kind, m);
    }
    assert_true(strncmp(m, "M ", 2) == 0);
    *json = strdup(m + 2);
    wh_free(m);
    return 0;
}

/* First sync of an engine with a producer; -1 when vmm cannot be imported here (SKIPPED). */
static int first_sync(kid_t *e, const char *kind, uint64_t cg, const char *json)
{
    send_sync(e, cg, 0, json);
    result_t r = expect_result(e, REPLY_MS, "first sync");
    if (r.code != WSYNC_OK && strcmp(kind, "vmm") == 0 &&
        (r.code == WSYNC_ERR_PERMISSION || r.code == WSYNC_ERR_NOT_SUPPORTED)) {
        print_message("SKIPPED: cuda_vmm_fd import not available here: %s: %s\n",
                      wsync_strerror((wsync_result_t)r.code), r.msg);
        return -1;
    }
    if (r.code != WSYNC_OK)
        fail_msg("first sync (%s): %s: %s", kind, wsync_strerror((wsync_result_t)r.code), r.msg);
    return 0;
}

typedef struct state {
    int old_n, new_n, other_n;
    char detail[32];
} state_t;

static state_t engine_state(kid_t *e, uint64_t a, uint64_t b)
{
    state_t s = {0};
    send_cmd(e, "state %llu %llu", (unsigned long long)a, (unsigned long long)b);
    char *m = expect_msg(e, REPLY_MS, "S ", "reading its parameters back");
    sscanf(m, "S %d %d %d %31s", &s.old_n, &s.new_n, &s.other_n, s.detail);
    wh_free(m);
    return s;
}

/* ---- (a) producer killed mid-bucket ---- */

typedef struct trial {
    const char *name;
    const char *how; /* expect | send | dead_open */
    const char *bucket_mode;
    unsigned spin_ms;
    int kill_after_ms; /* send: kill this long after the manifest was relayed */
    uint32_t flags;    /* producer staging flags */
} trial_t;

static const trial_t trials[] = {
    {"killed after stage, before publish (engine waiting)", "expect", "stage", 30, 0, 0},
    {"killed right after publish, manifest not sent (engine waiting)", "expect", "publish", 0, 0,
     0},
    {"killed as the manifest is relayed", "send", "send", 0, 0, 0},
    {"killed 2 ms after the manifest", "send", "send", 0, 2, 0},
    {"killed 20 ms after the manifest", "send", "send", 0, 20, 0},
    {"killed before the engine opens the buffer (handle closed)", "dead_open", "send", 0, 0, 0},
    /* Without digests publish does not wait for the stage kernel: the manifest is out while the
     * stage (behind a 200 ms spin) and the ready record are still queued on the dead producer's
     * stream. The engine's copy waits for that ready event. Last: a hang here ends the test. */
    {"killed while its stage is queued (NO_DIGESTS, manifest out early)", "send", "send", 200, 20,
     WSYNC_STAGING_NO_DIGESTS},
};

static void producer_killed(const char *kind)
{
    int n_old = 0, n_new = 0, n_err = 0, n_mixed = 0;
    long worst_ms = 0;
    for (size_t i = 0; i < sizeof(trials) / sizeof(trials[0]); i++) {
        const trial_t *t = &trials[i];
        role_arg_t pa = {.kind = kind, .base = 0, .flags = t->flags},
                   ra = {.kind = kind, .base = 2};
        kid_t e = spawn("engine", engine, NULL), p, p2;
        char *json1 = NULL, *json2 = NULL, *json3 = NULL;
        if (start_producer(&p, &pa, &json1) != 0 || first_sync(&e, kind, 1, json1) != 0) {
            kill_all(NULL);
            free(json1);
            WG_SKIP();
        }
        send_cmd(&p, "wait 1");
        expect_ok(&p, REPLY_MS, "wait_consumed(1)");

        result_t r;
        long t_dead = 0;
        if (strcmp(t->how, "expect") == 0) {
            send_cmd(&e, "expect 2 2");
            wh_free(expect_msg(&e, REPLY_MS, "entering", "computing digests"));
            usleep(20000); /* the engine is inside copy_weights, waiting for ready(2) */
            send_cmd(&p, "bucket %s %u", t->bucket_mode, t->spin_ms);
            int st = reap_kid(&p, REPLY_MS);
            t_dead = wr_now_ms();
            if (st != -SIGKILL)
                fail_msg("[%s] %s: producer ended with %d, expected its own SIGKILL", kind, t->name,
                         st);
            r = expect_result(&e, TIMEOUT_MS + SLACK_MS, "waiting for a killed producer");
        } else {
            if (strcmp(t->how, "dead_open") == 0) {
                send_cmd(&e, "drop");
                expect_ok(&e, REPLY_MS, "drop");
            }
            send_cmd(&p, "bucket send %u", t->spin_ms);
            char *m = expect_msg(&p, REPLY_MS, "M ", "staging bucket 2");
            json2 = strdup(m + 2);
            wh_free(m);
            if (strcmp(t->how, "dead_open") == 0) {
                kill_kid(&p);
                t_dead = wr_now_ms();
                send_sync(&e, 2, 0, json2);
            } else {
                send_sync(&e, 2, 0, json2);
                if (t->kill_after_ms)
                    usleep((useconds_t)t->kill_after_ms * 1000);
                kill_kid(&p);
                t_dead = wr_now_ms();
            }
            r = expect_result(&e, TIMEOUT_MS + SLACK_MS, "syncing from a killed producer");
        }
        long since = wr_now_ms() - t_dead;
        if (since > worst_ms)
            worst_ms = since;
        state_t s = engine_state(&e, 1, 2);
        print_message("[%s] %-62s -> %s in %ld ms (%ld ms after the death): params %s%s%s\n", kind,
                      t->name, wsync_strerror((wsync_result_t)r.code), r.ms, since, s.detail,
                      r.code ? ": " : "", r.code ? r.msg : "");
        if (s.other_n != 0 || (s.old_n != FN && s.new_n != FN)) {
            n_mixed++;
            fail_msg("[%s] %s: MIXED bucket: %d parameters old, %d new, %d neither (%s); "
                     "sync said %s: %s",
                     kind, t->name, s.old_n, s.new_n, s.other_n, s.detail,
                     wsync_strerror((wsync_result_t)r.code), r.msg);
        }
        if (r.code == WSYNC_OK && s.new_n != FN)
            fail_msg("[%s] %s: sync reported OK but the parameters are old (%s)", kind, t->name,
                     s.detail);
        if (r.code != WSYNC_OK && r.msg[0] == '\0')
            fail_msg("[%s] %s: error %s without a message", kind, t->name,
                     wsync_strerror((wsync_result_t)r.code));
        if (strcmp(t->bucket_mode, "stage") == 0 && r.code == WSYNC_OK)
            fail_msg("[%s] %s: a bucket never published was copied", kind, t->name);
        n_err += r.code != WSYNC_OK;
        n_old += s.old_n == FN;
        n_new += s.new_n == FN;

        /* The engine survives: it syncs from a restarted producer (contents of generation 3). */
        if (start_producer(&p2, &ra, &json3) != 0)
            fail_msg("restarted producer could not start");
        send_sync(&e, 3, 0, json3);
        expect_ok(&e, REPLY_MS, "syncing from the restarted producer");
        s = engine_state(&e, 3, 3);
        if (s.old_n != FN)
            fail_msg("[%s] %s: after the restart, parameters are %s, expected all of generation 3",
                     kind, t->name, s.detail);
        send_cmd(&p2, "wait 1");
        expect_ok(&p2, REPLY_MS, "restarted producer's wait_consumed(1)");
        send_cmd(&e, "bye");
        expect_ok(&e, REPLY_MS, "finalize");
        assert_int_equal(reap_kid(&e, REPLY_MS), 0);
        send_cmd(&p2, "retire");
        expect_ok(&p2, REPLY_MS, "retire of the restarted producer");
        assert_int_equal(reap_kid(&p2, REPLY_MS), 0);
        free(json1);
        free(json2);
        free(json3);
    }
    print_message("[%s] producer killed in %zu trials: %d kept the old generation, %d committed "
                  "the new one, %d mixed; %d errors reported; slowest answer %ld ms after the "
                  "death (bound %d)\n",
                  kind, sizeof(trials) / sizeof(trials[0]), n_old, n_new, n_mixed, n_err, worst_ms,
                  TIMEOUT_MS + SLACK_MS);
    assert_int_equal(n_mixed, 0);
}

/* ---- (b) engine killed mid-copy ---- */

static void engine_killed(const char *kind)
{
    role_arg_t pa = {.kind = kind, .base = 0};
    kid_t p, e = spawn("engine", engine, NULL), e2;
    char *json1 = NULL;
    if (start_producer(&p, &pa, &json1) != 0 || first_sync(&e, kind, 1, json1) != 0) {
        free(json1);
        WG_SKIP();
    }
    free(json1);
    /* Generation 1 went through first, so the engine's kernels are loaded and its op tables
     * allocated: the copies of generation 2 really queue behind the spin instead of the first
     * copy_weights waiting for it (a lazy module load can wait for work already on the GPU). */
    send_cmd(&p, "wait 1");
    expect_ok(&p, REPLY_MS, "wait_consumed(1)");
    send_cmd(&p, "bucket send 0");
    char *m = expect_msg(&p, REPLY_MS, "M ", "staging bucket 2");
    char *json2 = strdup(m + 2);
    wh_free(m);
    /* The engine's copies wait behind a 300 ms spin on its stream when it is killed. */
    long t_sent = wr_now_ms();
    send_sync(&e, 2, 300, json2);
    m = NULL;
    int rc = wr_recv(e.fd, &m, NULL, REPLY_MS);
    long answered = wr_now_ms() - t_sent;
    print_message("[%s] engine answered \"%s\" %ld ms after the sync request\n", kind,
                  rc == 0 ? m : "(nothing)", answered);
    if (rc != 0 || strcmp(m, "copying") != 0)
        fail_msg("engine did not start copying (%s)", rc == 0 ? m : "no answer");
    wh_free(m);
    if (answered >= 250)
        fail_msg("copy_weights blocked %ld ms behind the busy engine stream: it must only enqueue",
                 answered);
    send_cmd(&p, "wait 2");
    usleep(30000);
    kill_kid(&e);
    long t_dead = wr_now_ms();
    result_t r = expect_result(&p, TIMEOUT_MS + SLACK_MS, "wait_consumed after the engine died");
    long since = wr_now_ms() - t_dead;
    print_message("[%s] engine killed mid-copy: wait_consumed(2) -> %s after %ld ms (%ld ms after "
                  "the death): %s\n",
                  kind, wsync_strerror((wsync_result_t)r.code), r.ms, since, r.msg);
    if (r.code != WSYNC_ERR_PEER_GONE && r.code != WSYNC_ERR_TIMEOUT)
        fail_msg("wait_consumed after the engine's death returned %s (%s), expected PEER_GONE or "
                 "TIMEOUT",
                 wsync_strerror((wsync_result_t)r.code), r.msg);
    if (strstr(r.msg, "generation 2") == NULL)
        fail_msg("the error does not name generation 2: %s", r.msg);
    if (r.ms > TIMEOUT_MS + SLACK_MS)
        fail_msg("wait_consumed took %ld ms, bound %d", r.ms, TIMEOUT_MS + SLACK_MS);
    send_cmd(&p, "readback 2");
    expect_ok(&p, REPLY_MS, "reading the staging buffer back after the engine's death");

    /* A restarted engine completes generation 2 from the same staging buffer, then 3. */
    e2 = spawn("restarted engine", engine, NULL);
    send_sync(&e2, 2, 0, json2);
    expect_ok(&e2, REPLY_MS, "restarted engine syncing generation 2");
    send_cmd(&p, "wait 2");
    expect_ok(&p, REPLY_MS, "wait_consumed(2) with the restarted engine");
    send_cmd(&p, "bucket send 0");
    m = expect_msg(&p, REPLY_MS, "M ", "staging bucket 3");
    send_sync(&e2, 3, 0, m + 2);
    wh_free(m);
    expect_ok(&e2, REPLY_MS, "restarted engine syncing generation 3");
    send_cmd(&p, "wait 3");
    expect_ok(&p, REPLY_MS, "wait_consumed(3)");
    send_cmd(&e2, "bye");
    expect_ok(&e2, REPLY_MS, "finalize");
    assert_int_equal(reap_kid(&e2, REPLY_MS), 0);
    send_cmd(&p, "retire"); /* the dead engine's mapper slot is reclaimed */
    expect_ok(&p, REPLY_MS, "retire after one engine died mapped and one closed");
    assert_int_equal(reap_kid(&p, REPLY_MS), 0);
    free(json2);
}

/* ---- (c) replayed manifests ---- */

static void replay(const char *kind, int close_between)
{
    role_arg_t pa = {.kind = kind, .base = 0};
    kid_t p, e = spawn("engine", engine, NULL);
    char *json1 = NULL, *json2 = NULL;
    if (start_producer(&p, &pa, &json1) != 0 || first_sync(&e, kind, 1, json1) != 0) {
        free(json1);
        WG_SKIP();
    }
    send_cmd(&p, "wait 1");
    expect_ok(&p, REPLY_MS, "wait_consumed(1)");
    send_cmd(&p, "bucket send 0");
    char *m = expect_msg(&p, REPLY_MS, "M ", "staging bucket 2");
    json2 = strdup(m + 2);
    wh_free(m);
    send_sync(&e, 2, 0, json2);
    expect_ok(&e, REPLY_MS, "sync of generation 2");
    send_cmd(&p, "wait 2");
    expect_ok(&p, REPLY_MS, "wait_consumed(2)");
    const char *replays[] = {json1, json2, json1};
    for (int i = 0; i < 3; i++) {
        if (close_between) { /* nothing of the buffer stays mapped in between */
            send_cmd(&e, "drop");
            expect_ok(&e, REPLY_MS, "drop");
        }
        send_sync(&e, i == 1 ? 2 : 1, 0, replays[i]);
        result_t r = expect_result(&e, REPLY_MS, "replaying a manifest");
        print_message("[%s] replay of generation %d%s -> %s: %s\n", kind, i == 1 ? 2 : 1,
                      close_between ? " after close_handle" : " (handle held)",
                      wsync_strerror((wsync_result_t)r.code), r.msg);
        state_t s = engine_state(&e, 2, 1);
        if (s.old_n != FN) /* "old" here: generation 2, the newest */
            fail_msg("[%s] after a replay the parameters are %s (o: generation 2, n: 1), expected "
                     "all of generation 2",
                     kind, s.detail);
        if (r.code != WSYNC_ERR_STALE_GENERATION)
            fail_msg("[%s] replayed manifest of generation %d%s: %s (%s), expected "
                     "STALE_GENERATION before anything is copied",
                     kind, i == 1 ? 2 : 1, close_between ? " after close_handle" : "",
                     wsync_strerror((wsync_result_t)r.code), r.msg);
    }
    send_cmd(&e, "bye");
    expect_ok(&e, REPLY_MS, "finalize");
    assert_int_equal(reap_kid(&e, REPLY_MS), 0);
    send_cmd(&p, "retire");
    expect_ok(&p, REPLY_MS, "retire");
    assert_int_equal(reap_kid(&p, REPLY_MS), 0);
    free(json1);
    free(json2);
}

/* ---- (d) retire while mapped ---- */

static void retire_while_mapped(const char *kind)
{
    role_arg_t pa = {.kind = kind, .base = 0};
    kid_t p, e = spawn("engine", engine, NULL);
    char *json1 = NULL;
    if (start_producer(&p, &pa, &json1) != 0 || first_sync(&e, kind, 1, json1) != 0) {
        free(json1);
        WG_SKIP();
    }
    send_cmd(&p, "wait 1");
    expect_ok(&p, REPLY_MS, "wait_consumed(1)");
    for (int i = 0; i < 2; i++) {
        send_cmd(&p, "retire");
        result_t r = expect_result(&p, REPLY_MS, "retire while mapped");
        print_message("[%s] retire while mapped -> %s: %s\n", kind,
                      wsync_strerror((wsync_result_t)r.code), r.msg);
        if (r.code != WSYNC_ERR_BUSY)
            fail_msg("[%s] retire while the engine maps the buffer: %s (%s), expected BUSY", kind,
                     wsync_strerror((wsync_result_t)r.code), r.msg);
    }
    send_cmd(&e, "drop");
    expect_ok(&e, REPLY_MS, "close_handle");
    send_cmd(&p, "retire");
    expect_ok(&p, REPLY_MS, "retire after close_handle");
    assert_int_equal(reap_kid(&p, REPLY_MS), 0);

    /* An engine killed while mapping does not hold retire at BUSY. */
    kid_t p2;
    char *json2 = NULL;
    assert_int_equal(start_producer(&p2, &pa, &json2), 0);
    send_sync(&e, 1, 0, json2);
    expect_ok(&e, REPLY_MS, "sync with the second producer");
    kill_kid(&e);
    send_cmd(&p2, "retire");
    expect_ok(&p2, REPLY_MS, "retire after the mapping engine was killed");
    assert_int_equal(reap_kid(&p2, REPLY_MS), 0);
    free(json1);
    free(json2);
}

/* WSYNC_CUDA_STAGING_KIND=ipc|vmm in the environment (tests/gpu/run_on_device.sh runs the suite
 * once per kind) keeps the runs of that kind only. */
static void run_kind(void (*fn)(const char *), const char *kind)
{
    const char *env = getenv("WSYNC_CUDA_STAGING_KIND");
    if (env != NULL && (strcmp(env, "ipc") == 0 || strcmp(env, "vmm") == 0) &&
        strcmp(env, kind) != 0) {
        print_message("SKIPPED: WSYNC_CUDA_STAGING_KIND=%s leaves out the %s run\n", env, kind);
        WG_SKIP();
    }
    fn(kind);
}

#define KIND_TESTS(fn, name)                                                                       \
    static void test_##name##_ipc(void **state)                                                    \
    {                                                                                              \
        (void)state;                                                                               \
        run_kind(fn, "ipc");                                                                       \
    }                                                                                              \
    static void test_##name##_vmm(void **state)                                                    \
    {                                                                                              \
        (void)state;                                                                               \
        run_kind(fn, "vmm");                                                                       \
    }

static void replay_held(const char *kind)
{
    replay(kind, 0);
}
static void replay_closed(const char *kind)
{
    replay(kind, 1);
}

KIND_TESTS(producer_killed, producer_killed_mid_bucket)
KIND_TESTS(engine_killed, engine_killed_mid_copy)
KIND_TESTS(replay_held, replayed_manifest_refused)
KIND_TESTS(replay_closed, replayed_manifest_refused_after_close)
KIND_TESTS(retire_while_mapped, retire_while_mapped_busy)

#define KIND_ENTRIES(name)                                                                         \
    cmocka_unit_test_teardown(test_##name##_ipc, kill_all),                                        \
        cmocka_unit_test_teardown(test_##name##_vmm, kill_all)

int main(void)
{
    wg_require_device(WG_PLUGIN);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        KIND_ENTRIES(producer_killed_mid_bucket),
        KIND_ENTRIES(engine_killed_mid_copy),
        KIND_ENTRIES(replayed_manifest_refused),
        KIND_ENTRIES(replayed_manifest_refused_after_close),
        KIND_ENTRIES(retire_while_mapped_busy),
    };
    return wg_finish(cmocka_run_group_tests(tests, NULL, NULL), "torture_gpu_fault");
}
