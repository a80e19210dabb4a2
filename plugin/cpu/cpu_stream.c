/* Host streams: a mutex-protected FIFO of tasks and one worker thread per stream. The lock is
 * taken once per task (one task per copy_weights call), never per copy op. */
#include "cpu_stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_direct.h"
#include "cpu_memcpy.h"
#include "wsync_convert.h"
#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_fp8.h"

/* Bytes copied before the digest of those same bytes is folded in: small enough that the
 * destination is still in cache when it is read back, large enough that per-chunk cost vanishes. */
#define WSYNC_CPU_VERIFY_CHUNK (64u * 1024u)

struct wsync_cpu_join {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    size_t remaining; /* arrivals still expected */
    _Atomic unsigned refs;
};

typedef struct wsync_cpu_task {
    struct wsync_cpu_task *next;
    wsync_cpu_task_kind_t kind;
    uint64_t seq;
    wsync_cpu_sink_t *sink;
    wsync_control_t *control;
    uint64_t generation;
    union {
        struct {
            uint32_t timeout_ms;
            int64_t peer_pid;
        } wait;
        struct {
            const uint8_t *src_base;
            int64_t remote_pid; /* > 0: op src_offset is an address in that process */
            uint32_t flags;
            uint64_t total_bytes; /* sum over ops (validated: no overflow) */
            size_t n;
            wsync_copy_op_t *ops; /* points into the task's tail */
            wsync_quant_t *quant; /* copy_quantized: after the ops in the tail; else NULL */
        } copy;
        struct {
            size_t n;
            wsync_cpu_stage_copy_t *copies; /* points into the task's tail */
        } stage;
        struct {
            wsync_host_fn_t fn;
            void *user;
        } host_fn;
        wsync_cpu_join_t *join;
    } u;
} wsync_cpu_task_t;

struct wsync_cpu_stream {
    pthread_mutex_t lock;
    pthread_cond_t cv_work; /* a task arrived or stop was set */
    pthread_cond_t cv_done; /* `completed` advanced */
    wsync_cpu_task_t *head, *tail;
    uint64_t enqueued;  /* seq of the last task enqueued */
    uint64_t completed; /* seq of the last task run */
    int stop;
    pthread_t thread;
};

/* ---------------------------------------------------------------- sinks */

void wsync_cpu_sink_init(wsync_cpu_sink_t *k)
{
    pthread_mutex_init(&k->lock, NULL);
    memset(&k->error, 0, sizeof(k->error));
    k->error.struct_size = sizeof(k->error);
    k->failed_generation = 0;
}

void wsync_cpu_sink_destroy(wsync_cpu_sink_t *k)
{
    pthread_mutex_destroy(&k->lock);
}

wsync_result_t wsync_cpu_sink_take(wsync_cpu_sink_t *k, wsync_error_t *err)
{
    pthread_mutex_lock(&k->lock);
    wsync_result_t code = k->error.code;
    wsync_error_copy(err, &k->error);
    wsync_error_clear(&k->error);
    pthread_mutex_unlock(&k->lock);
    return code;
}

static int wsync_cpu_sink_failed(wsync_cpu_sink_t *k, uint64_t generation)
{
    if (k == NULL)
        return 0;
    pthread_mutex_lock(&k->lock);
    int failed = k->failed_generation != 0 && k->failed_generation == generation;
    pthread_mutex_unlock(&k->lock);
    return failed;
}

/* ---------------------------------------------------------------- task bodies */

static void wsync_cpu_run_wait_ready(wsync_cpu_task_t *t)
{
    wsync_error_t local = {.struct_size = sizeof(local)};
    wsync_result_t r = wsync_control_wait_ready(t->control, t->generation, t->u.wait.timeout_ms,
                                                t->u.wait.peer_pid, &local);
    if (r == WSYNC_OK || t->sink == NULL)
        return;
    pthread_mutex_lock(&t->sink->lock);
    t->sink->failed_generation = t->generation;
    if (t->sink->error.code == WSYNC_OK)
        t->sink->error = local;
    pthread_mutex_unlock(&t->sink->lock);
}

/* Copy one row and fold the bytes that landed into st. */
static void wsync_cpu_copy_row_digest(uint8_t *dst, const uint8_t *src, uint64_t n,
                                      wsync64_state_t *st)
{
    while (n > 0) {
        size_t chunk = n < WSYNC_CPU_VERIFY_CHUNK ? (size_t)n : WSYNC_CPU_VERIFY_CHUNK;
        memcpy(dst, src, chunk);
        wsync64_update(st, dst, chunk);
        dst += chunk;
        src += chunk;
        n -= chunk;
    }
}

/* copy_quantized: every quantized source finite, checked before any op of the call writes;
 * else the sink holds the error naming the op, row and column. */
static int wsync_cpu_quant_sources_ok(wsync_cpu_task_t *t)
{
    for (size_t i = 0; i < t->u.copy.n; i++) {
        const wsync_copy_op_t *op = &t->u.copy.ops[i];
        const wsync_quant_t *q = &t->u.copy.quant[i];
        int64_t r, c;
        if (q->kind == WSYNC_QUANT_NONE || op->rows == 0 ||
            wsync_fp8_find_bad(t->u.copy.src_base + op->src_offset,
                               op->rows > 1 ? op->src_pitch : op->row_bytes, q->src_dtype,
                               (int64_t)op->rows, (int64_t)q->cols, &r, &c) == 0)
            continue;
        if (t->sink != NULL) {
            pthread_mutex_lock(&t->sink->lock);
            wsync_fail_op(
                &t->sink->error, WSYNC_ERR_INVALID_ARGUMENT, i, "copy_quantized",
                "generation %llu: op %zu: a NaN or infinite value at row %lld, column %lld "
                "of its source cannot be quantized to fp8; nothing of the bucket was "
                "written",
                (unsigned long long)t->generation, i, (long long)r, (long long)c);
            pthread_mutex_unlock(&t->sink->lock);
        }
        return 0;
    }
    return 1;
}

static void wsync_cpu_run_copy(wsync_cpu_task_t *t)
{
    const int verify = (t->u.copy.flags & WSYNC_COPY_VERIFY) != 0;
    size_t mismatches = 0, first = 0;
    uint64_t first_want = 0, first_got = 0;

    if (wsync_cpu_sink_failed(t->sink, t->generation))
        return;                     /* no ready: never copy a half-written bucket */
    if (t->u.copy.remote_pid > 0) { /* direct mode: the producer's own memory */
        wsync_error_t e = {.struct_size = sizeof(e)};
        if (wsync_cpu_read_remote(t->u.copy.remote_pid, t->u.copy.ops, t->u.copy.n, &e) !=
                WSYNC_OK &&
            t->sink != NULL) {
            pthread_mutex_lock(&t->sink->lock);
            wsync_fail_from(&t->sink->error, &e, "copy_segments", "generation %llu: %s",
                            (unsigned long long)t->generation, e.message);
            pthread_mutex_unlock(&t->sink->lock);
        }
        return;
    }
    const int one_pass = (t->u.copy.flags & WSYNC_COPY_QUANT_ONE_PASS) != 0;
    if (t->u.copy.quant != NULL && !one_pass && !wsync_cpu_quant_sources_ok(t))
        return; /* a NaN or infinity: nothing of the call is written */
    int64_t bad_row = 0, bad_col = 0;
    size_t bad_op = SIZE_MAX;
    if (t->u.copy.quant != NULL) {
        wsync_fp8_ref_t *refs = malloc((t->u.copy.n ? t->u.copy.n : 1) * sizeof(*refs));
        if (refs == NULL) {
            if (t->sink != NULL) {
                pthread_mutex_lock(&t->sink->lock);
                wsync_fail(&t->sink->error, WSYNC_ERR_OUT_OF_MEMORY, "copy_quantized",
                           "generation %llu: no memory for %zu ops; nothing was written",
                           (unsigned long long)t->generation, t->u.copy.n);
                pthread_mutex_unlock(&t->sink->lock);
            }
            return;
        }
        if (wsync_fp8_quantize_ops(t->u.copy.src_base, t->u.copy.ops, t->u.copy.quant, t->u.copy.n,
                                   refs, &bad_op, &bad_row, &bad_col) == 0)
            bad_op = SIZE_MAX;
        free(refs);
    }
    const int streaming = t->u.copy.total_bytes >= WSYNC_CPU_STREAMING_MIN_TASK;
    for (size_t i = 0; i < t->u.copy.n; i++) {
        const wsync_copy_op_t *op = &t->u.copy.ops[i];
        const uint8_t *src = t->u.copy.src_base + op->src_offset;
        uint8_t *dst = op->dst;
        uint64_t total = op->rows * op->row_bytes;

        if (total == 0)
            continue;
        if (t->u.copy.quant != NULL && t->u.copy.quant[i].kind != WSYNC_QUANT_NONE)
            continue; /* quantized above */
        if (verify && op->has_digest) {
            wsync64_state_t st;
            wsync64_init(&st);
            for (uint64_t r = 0; r < op->rows; r++)
                wsync_cpu_copy_row_digest(dst + r * op->dst_pitch, src + r * op->src_pitch,
                                          op->row_bytes, &st);
            uint64_t got = wsync64_final(&st);
            if (got != op->digest && mismatches++ == 0) {
                first = i;
                first_want = op->digest;
                first_got = got;
            }
        } else if (op->rows == 1 ||
                   (op->src_pitch == op->row_bytes && op->dst_pitch == op->row_bytes)) {
            if (streaming)
                wsync_cpu_copy_streaming(dst, src, (size_t)total);
            else
                memcpy(dst, src, (size_t)total);
        } else {
            for (uint64_t r = 0; r < op->rows; r++) {
                if (streaming)
                    wsync_cpu_copy_streaming(dst + r * op->dst_pitch, src + r * op->src_pitch,
                                             (size_t)op->row_bytes);
                else
                    memcpy(dst + r * op->dst_pitch, src + r * op->src_pitch, (size_t)op->row_bytes);
            }
        }
    }
    if (streaming)
        wsync_cpu_copy_fence(); /* streaming stores are weakly ordered */
    if (bad_op != SIZE_MAX && t->sink != NULL) {
        pthread_mutex_lock(&t->sink->lock);
        wsync_fail_op(
            &t->sink->error, WSYNC_ERR_INVALID_ARGUMENT, bad_op, "copy_quantized",
            "generation %llu: op %zu: a NaN or infinite value at row %lld, column %lld of "
            "its source cannot be quantized to fp8; %s holding it was left as it was "
            "and the rest of the bucket written (WSYNC_COPY_QUANT_ONE_PASS)",
            (unsigned long long)t->generation, bad_op, (long long)bad_row, (long long)bad_col,
            wsync_fp8_unit(t->u.copy.quant[bad_op].kind));
        pthread_mutex_unlock(&t->sink->lock);
    }
    if (mismatches == 0 || t->sink == NULL)
        return;
    pthread_mutex_lock(&t->sink->lock);
    wsync_fail_op(&t->sink->error, WSYNC_ERR_DIGEST_MISMATCH, first, "copy_weights",
                  "generation %llu: op %zu read bytes with wsync64:%016llx, manifest says "
                  "wsync64:%016llx (%zu of %zu ops differ); the staging buffer changed during the "
                  "copy or is corrupt: re-send the bucket",
                  (unsigned long long)t->generation, first, (unsigned long long)first_got,
                  (unsigned long long)first_want, mismatches, t->u.copy.n);
    pthread_mutex_unlock(&t->sink->lock);
}

static void wsync_cpu_run_stage(wsync_cpu_task_t *t)
{
    for (size_t i = 0; i < t->u.stage.n; i++) {
        const wsync_cpu_stage_copy_t *c = &t->u.stage.copies[i];
        if (c->src_dtype != c->dst_dtype)
            wsync_convert_row(c->dst, c->dst_dtype, c->src, c->src_dtype,
                              (size_t)(c->nbytes / wsync_dtype_size(c->dst_dtype)), 1.0);
        else if (c->nbytes != 0)
            memcpy(c->dst, c->src, (size_t)c->nbytes);
        if (c->digest != NULL)
            *c->digest = wsync64(c->dst, (size_t)c->nbytes);
        if (c->has_digest != NULL)
            *c->has_digest = 1;
    }
}

static void wsync_cpu_join_release(wsync_cpu_join_t *j)
{
    if (atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

static void wsync_cpu_run(wsync_cpu_task_t *t)
{
    switch (t->kind) {
    case WSYNC_CPU_TASK_WAIT_READY:
        wsync_cpu_run_wait_ready(t);
        break;
    case WSYNC_CPU_TASK_COPY:
        wsync_cpu_run_copy(t);
        break;
    case WSYNC_CPU_TASK_SIGNAL_CONSUMED:
        if (!wsync_cpu_sink_failed(t->sink, t->generation))
            wsync_control_signal_consumed(t->control, t->generation);
        break;
    case WSYNC_CPU_TASK_SIGNAL_READY:
        wsync_control_signal_ready(t->control, t->generation);
        break;
    case WSYNC_CPU_TASK_STAGE:
        wsync_cpu_run_stage(t);
        break;
    case WSYNC_CPU_TASK_HOST_FN:
        t->u.host_fn.fn(t->u.host_fn.user);
        break;
    case WSYNC_CPU_TASK_JOIN_ARRIVE:
        pthread_mutex_lock(&t->u.join->lock);
        t->u.join->remaining--;
        pthread_cond_broadcast(&t->u.join->cv);
        pthread_mutex_unlock(&t->u.join->lock);
        wsync_cpu_join_release(t->u.join);
        break;
    case WSYNC_CPU_TASK_JOIN_WAIT:
        pthread_mutex_lock(&t->u.join->lock);
        while (t->u.join->remaining > 0)
            pthread_cond_wait(&t->u.join->cv, &t->u.join->lock);
        pthread_mutex_unlock(&t->u.join->lock);
        wsync_cpu_join_release(t->u.join);
        break;
    }
}

static void *wsync_cpu_worker(void *arg)
{
    wsync_cpu_stream_t *s = arg;

    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cv_work, &s->lock);
        if (s->head == NULL)
            break; /* stop, and the queue is drained */
        wsync_cpu_task_t *t = s->head;
        s->head = t->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);

        uint64_t seq = t->seq;
        wsync_cpu_run(t);
        free(t);

        pthread_mutex_lock(&s->lock);
        s->completed = seq;
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---------------------------------------------------------------- enqueue */

static wsync_cpu_task_t *wsync_cpu_task_new(wsync_cpu_task_kind_t kind, size_t tail,
                                            wsync_error_t *err)
{
    wsync_cpu_task_t *t = malloc(sizeof(*t) + tail);
    if (t == NULL) {
        WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a stream task (%zu bytes)",
                   sizeof(*t) + tail);
        return NULL;
    }
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    return t;
}

static uint64_t wsync_cpu_enqueue(wsync_cpu_stream_t *s, wsync_cpu_task_t *t)
{
    pthread_mutex_lock(&s->lock);
    t->seq = ++s->enqueued;
    t->next = NULL;
    if (s->tail != NULL)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    uint64_t seq = t->seq;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->lock);
    return seq;
}

static wsync_result_t wsync_cpu_submit(wsync_cpu_stream_t *s, wsync_cpu_task_t *t, uint64_t *seq)
{
    uint64_t q = wsync_cpu_enqueue(s, t);
    if (seq != NULL)
        *seq = q;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_stream_wait_ready(wsync_cpu_stream_t *s, wsync_control_t *control,
                                           uint64_t generation, uint32_t timeout_ms,
                                           int64_t peer_pid, wsync_cpu_sink_t *sink, uint64_t *seq,
                                           wsync_error_t *err)
{
    wsync_cpu_task_t *t = wsync_cpu_task_new(WSYNC_CPU_TASK_WAIT_READY, 0, err);
    if (t == NULL)
        return WSYNC_ERR_OUT_OF_MEMORY;
    t->control = control;
    t->generation = generation;
    t->sink = sink;
    t->u.wait.timeout_ms = timeout_ms;
    t->u.wait.peer_pid = peer_pid;
    return wsync_cpu_submit(s, t, seq);
}

static wsync_cpu_task_t *wsync_cpu_copy_task(const uint8_t *src_base, int64_t remote_pid,
                                             const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                             size_t n, uint32_t flags, uint64_t generation,
                                             wsync_cpu_sink_t *sink, wsync_error_t *err)
{
    const size_t each = sizeof(*ops) + (quant != NULL ? sizeof(*quant) : 0);
    if (n > (SIZE_MAX - sizeof(wsync_cpu_task_t)) / each) {
        WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu copy ops do not fit in memory", n);
        return NULL;
    }
    wsync_cpu_task_t *t = wsync_cpu_task_new(WSYNC_CPU_TASK_COPY, n * each, err);
    if (t == NULL)
        return NULL;
    t->generation = generation;
    t->sink = sink;
    t->u.copy.src_base = src_base;
    t->u.copy.remote_pid = remote_pid;
    t->u.copy.flags = flags;
    t->u.copy.n = n;
    t->u.copy.ops = (wsync_copy_op_t *)(void *)(t + 1);
    if (n != 0)
        memcpy(t->u.copy.ops, ops, n * sizeof(*ops));
    t->u.copy.quant = NULL;
    if (quant != NULL) {
        t->u.copy.quant = (wsync_quant_t *)(void *)(t->u.copy.ops + n);
        if (n != 0)
            memcpy(t->u.copy.quant, quant, n * sizeof(*quant));
    }
    for (size_t i = 0; i < n; i++)
        t->u.copy.total_bytes += ops[i].rows * ops[i].row_bytes;
    return t;
}

wsync_result_t wsync_cpu_stream_copy(wsync_cpu_stream_t *s, const uint8_t *src_base,
                                     const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                     size_t n, uint32_t flags, uint64_t generation,
                                     wsync_cpu_sink_t *sink, uint64_t *seq, wsync_error_t *err)
{
    wsync_cpu_task_t *t =
        wsync_cpu_copy_task(src_base, 0, ops, quant, n, flags, generation, sink, err);
    return t != NULL ? wsync_cpu_submit(s, t, seq) : WSYNC_ERR_OUT_OF_MEMORY;
}

wsync_result_t wsync_cpu_stream_copy_remote(wsync_cpu_stream_t *s, int64_t pid,
                                            const wsync_copy_op_t *ops, size_t n,
                                            uint64_t generation, wsync_cpu_sink_t *sink,
                                            uint64_t *seq, wsync_error_t *err)
{
    wsync_cpu_task_t *t = wsync_cpu_copy_task(NULL, pid, ops, NULL, n, 0, generation, sink, err);
    return t != NULL ? wsync_cpu_submit(s, t, seq) : WSYNC_ERR_OUT_OF_MEMORY;
}

wsync_result_t wsync_cpu_stream_signal_consumed(wsync_cpu_stream_t *s, wsync_control_t *control,
                                                uint64_t generation, wsync_cpu_sink_t *sink,
                                                uint64_t *seq, wsync_error_t *err)
{
    wsync_cpu_task_t *t = wsync_cpu_task_new(WSYNC_CPU_TASK_SIGNAL_CONSUMED, 0, err);
    if (t == NULL)
        return WSYNC_ERR_OUT_OF_MEMORY;
    t->control = control;
    t->generation = generation;
    t->sink = sink;
    return wsync_cpu_submit(s, t, seq);
}

wsync_result_t wsync_cpu_stream_signal_ready(wsync_cpu_stream_t *s, wsync_control_t *control,
                                             uint64_t generation, uint64_t *seq, wsync_error_t *err)
{
    wsync_cpu_task_t *t = wsync_cpu_task_new(WSYNC_CPU_TASK_SIGNAL_READY, 0, err);
    if (t == NULL)
        return WSYNC_ERR_OUT_OF_MEMORY;
    t->control = control;
    t->generation = generation;
    return wsync_cpu_submit(s, t, seq);
}

wsync_result_t wsync_cpu_stream_stage(wsync_cpu_stream_t *s, const wsync_cpu_stage_copy_t *c,
                                      size_t n, uint64_t *seq, wsync_error_t *err)
{
    if (n > (SIZE_MAX - sizeof(wsync_cpu_task_t)) / sizeof(*c))
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu staging copies do not fit", n);
    wsync_cpu_task_t *t = wsync_cpu_task_new(WSYNC_CPU_TASK_STAGE, n * sizeof(*c), err);
    if (t == NULL)
        return WSYNC_ERR_OUT_OF_MEMORY;
    t->u.stage.n = n;
    t->u.stage.copies = (wsync_cpu_stage_copy_t *)(void *)(t + 1);
    if (n != 0)
        memcpy(t->u.stage.copies, c, n * sizeof(*c));
    return wsync_cpu_submit(s, t, seq);
}

wsync_result_t wsync_cpu_stream_host_fn(wsync_cpu_stream_t *s, wsync_host_fn_t fn, void *user,
                                        uint64_t *seq, wsync_error_t *err)
{
    wsync_cpu_task_t *t = wsync_cpu_task_new(WSYNC_CPU_TASK_HOST_FN, 0, err);
    if (t == NULL)
        return WSYNC_ERR_OUT_OF_MEMORY;
    t->u.host_fn.fn = fn;
    t->u.host_fn.user = user;
    return wsync_cpu_submit(s, t, seq);
}

wsync_result_t wsync_cpu_stream_join(wsync_cpu_stream_t *waiter, wsync_cpu_stream_t *const *others,
                                     size_t n, wsync_error_t *err)
{
    wsync_cpu_task_t **marks;
    wsync_cpu_join_t *j;

    if (n == 0)
        return WSYNC_OK;
    marks = calloc(n + 1, sizeof(*marks));
    j = malloc(sizeof(*j));
    if (marks == NULL || j == NULL) {
        free(marks);
        free(j);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to join %zu streams", n + 1);
    }
    for (size_t i = 0; i <= n; i++) {
        marks[i] = wsync_cpu_task_new(i < n ? WSYNC_CPU_TASK_JOIN_ARRIVE : WSYNC_CPU_TASK_JOIN_WAIT,
                                      0, err);
        if (marks[i] == NULL) {
            for (size_t k = 0; k < i; k++)
                free(marks[k]);
            free(marks);
            free(j);
            return WSYNC_ERR_OUT_OF_MEMORY;
        }
        marks[i]->u.join = j;
    }
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->remaining = n;
    atomic_init(&j->refs, (unsigned)(n + 1));
    wsync_cpu_enqueue(waiter, marks[n]);
    for (size_t i = 0; i < n; i++)
        wsync_cpu_enqueue(others[i], marks[i]);
    free(marks);
    return WSYNC_OK;
}

/* ---------------------------------------------------------------- lifecycle */

wsync_result_t wsync_cpu_stream_create(wsync_cpu_stream_t **out, wsync_error_t *err)
{
    wsync_cpu_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a stream");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    int rc = pthread_create(&s->thread, NULL, wsync_cpu_worker, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv_done);
        pthread_cond_destroy(&s->cv_work);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return WSYNC_FAIL(err, rc == EAGAIN ? WSYNC_ERR_OUT_OF_MEMORY : WSYNC_ERR_SYSTEM,
                          "pthread_create for a stream worker failed: %s", strerror(rc));
    }
    *out = s;
    return WSYNC_OK;
}

void wsync_cpu_stream_destroy(wsync_cpu_stream_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv_done);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void wsync_cpu_stream_wait(wsync_cpu_stream_t *s, uint64_t seq)
{
    pthread_mutex_lock(&s->lock);
    while (s->completed < seq)
        pthread_cond_wait(&s->cv_done, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

void wsync_cpu_stream_synchronize(wsync_cpu_stream_t *s)
{
    wsync_cpu_stream_wait(s, wsync_cpu_stream_last_seq(s));
}

uint64_t wsync_cpu_stream_last_seq(wsync_cpu_stream_t *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t q = s->enqueued;
    pthread_mutex_unlock(&s->lock);
    return q;
}
