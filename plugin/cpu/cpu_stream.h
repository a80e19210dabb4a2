/* Host streams: in-order work queues, each served by its own worker thread, so the CPU backend
 * has real asynchrony and the stream-ordering rules of docs/DESIGN.md §2 hold as they do on a GPU.
 *
 * Tasks run one at a time, in enqueue order. Enqueueing is thread safe and never blocks on the
 * work itself. Each task gets a sequence number; wsync_cpu_stream_wait(s, seq) blocks until that
 * task (and so everything before it) is done. Tasks that belong to a handle report their outcome
 * into the handle's sink (first error wins); a failed wait-ready makes the stream skip the copies
 * and the consumed signal queued behind it for that handle and generation. */
#ifndef WSYNC_CPU_STREAM_H
#define WSYNC_CPU_STREAM_H

#include <pthread.h>
#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_control.h"
#include "wsync_digest.h"

typedef struct wsync_cpu_stream wsync_cpu_stream_t;

/* Where stream work on one handle reports. Owned by the handle; must outlive every task that
 * names it (close_handle drains the streams first). `lock` guards both fields. */
typedef struct wsync_cpu_sink {
    pthread_mutex_t lock;
    wsync_error_t error;        /* first error since the last wsync_cpu_sink_take */
    uint64_t failed_generation; /* wait-ready of this generation failed: its copies are skipped */
} wsync_cpu_sink_t;

void wsync_cpu_sink_init(wsync_cpu_sink_t *k);
void wsync_cpu_sink_destroy(wsync_cpu_sink_t *k);
/* Move the pending error (if any) into err and clear it; returns its code. */
wsync_result_t wsync_cpu_sink_take(wsync_cpu_sink_t *k, wsync_error_t *err);

/* Joins several streams: the stream that waits proceeds once `count` other streams arrived. */
typedef struct wsync_cpu_join wsync_cpu_join_t;

/* One producer staging copy (src -> dst, nbytes at dst), digest written to *digest when
 * non-NULL. src_dtype != dst_dtype: nbytes / size(dst_dtype) elements converted (0.1.5's
 * src_dtype, wsync_convert.h). */
typedef struct wsync_cpu_stage_copy {
    const void *src;
    void *dst;
    uint64_t nbytes;
    wsync_dtype_t src_dtype, dst_dtype;
    uint64_t *digest;
    int *has_digest;
} wsync_cpu_stage_copy_t;

typedef enum wsync_cpu_task_kind {
    WSYNC_CPU_TASK_WAIT_READY = 1,
    WSYNC_CPU_TASK_COPY,
    WSYNC_CPU_TASK_SIGNAL_CONSUMED,
    WSYNC_CPU_TASK_SIGNAL_READY,
    WSYNC_CPU_TASK_STAGE,
    WSYNC_CPU_TASK_HOST_FN,
    WSYNC_CPU_TASK_JOIN_ARRIVE,
    WSYNC_CPU_TASK_JOIN_WAIT
} wsync_cpu_task_kind_t;

/* Task payloads. Pointers in them are borrowed and must stay valid until the task ran; `ops` and
 * `copies` arrays are copied into the task (one allocation per enqueue, none per op). */
wsync_result_t wsync_cpu_stream_wait_ready(wsync_cpu_stream_t *s, wsync_control_t *control,
                                           uint64_t generation, uint32_t timeout_ms,
                                           int64_t peer_pid, wsync_cpu_sink_t *sink, uint64_t *seq,
                                           wsync_error_t *err);
/* quant: NULL, or per op how it quantizes (copy_quantized: every quantized source is checked
 * finite before the task writes anything; a bad value goes to the sink). */
wsync_result_t wsync_cpu_stream_copy(wsync_cpu_stream_t *s, const uint8_t *src_base,
                                     const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                     size_t n, uint32_t flags, uint64_t generation,
                                     wsync_cpu_sink_t *sink, uint64_t *seq, wsync_error_t *err);
/* Direct mode: ops whose src_offset is an address in process `pid`, read with
 * process_vm_readv (cpu_direct.h); an error goes to the sink. */
wsync_result_t wsync_cpu_stream_copy_remote(wsync_cpu_stream_t *s, int64_t pid,
                                            const wsync_copy_op_t *ops, size_t n,
                                            uint64_t generation, wsync_cpu_sink_t *sink,
                                            uint64_t *seq, wsync_error_t *err);
/* Queue *consumed* of `generation` after everything on s. record_consumed's only caller (in
 * cpu_copy.c, another object file): the early-consumed fixture (tests/fixtures) replaces it at
 * link time (--wrap) with a signal that fires at once. */
wsync_result_t wsync_cpu_stream_signal_consumed(wsync_cpu_stream_t *s, wsync_control_t *control,
                                                uint64_t generation, wsync_cpu_sink_t *sink,
                                                uint64_t *seq, wsync_error_t *err);
wsync_result_t wsync_cpu_stream_signal_ready(wsync_cpu_stream_t *s, wsync_control_t *control,
                                             uint64_t generation, uint64_t *seq,
                                             wsync_error_t *err);
wsync_result_t wsync_cpu_stream_stage(wsync_cpu_stream_t *s, const wsync_cpu_stage_copy_t *c,
                                      size_t n, uint64_t *seq, wsync_error_t *err);
wsync_result_t wsync_cpu_stream_host_fn(wsync_cpu_stream_t *s, wsync_host_fn_t fn, void *user,
                                        uint64_t *seq, wsync_error_t *err);

/* Make `waiter` proceed only after every stream in others[0..n) reached this point. Either all
 * markers are enqueued or none (on OUT_OF_MEMORY). */
wsync_result_t wsync_cpu_stream_join(wsync_cpu_stream_t *waiter, wsync_cpu_stream_t *const *others,
                                     size_t n, wsync_error_t *err);

/* Start a stream and its worker thread. Blocking. */
wsync_result_t wsync_cpu_stream_create(wsync_cpu_stream_t **out, wsync_error_t *err);
/* Drain the queue, stop the worker and free the stream. Blocking. Safe with NULL. */
void wsync_cpu_stream_destroy(wsync_cpu_stream_t *s);
/* Block until task `seq` (and everything enqueued before it) has run. */
void wsync_cpu_stream_wait(wsync_cpu_stream_t *s, uint64_t seq);
/* Block until everything enqueued before the call has run. */
void wsync_cpu_stream_synchronize(wsync_cpu_stream_t *s);
/* Sequence number of the last task enqueued (0 = none yet). */
uint64_t wsync_cpu_stream_last_seq(wsync_cpu_stream_t *s);

#endif
