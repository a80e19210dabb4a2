/* Direct mode on the CPU backend: the producer's memory as host_pid segments. A segment is a run
 * of adjacent readable mappings of the producer process (/proc/self/maps), named by its start
 * address; the consumer reads it with process_vm_readv, so it always reads the memory that is at
 * that address now (no mapping to go stale). */
#ifndef WSYNC_CPU_DIRECT_H
#define WSYNC_CPU_DIRECT_H

#include "wsync_direct.h"
#include "wsync_nixl_buffer.h"

/* Stage `t` into `set` (wsync_direct_stage), every tensor located in this process's readable
 * mappings: INVALID_ARGUMENT naming the tensor whose bytes are not all mapped readable. With
 * `nixl` (a nixl staging), each segment is registered there and named as a nixl segment. */
wsync_result_t wsync_cpu_direct_stage(const wsync_stage_tensor_t *t, size_t n,
                                      wsync_direct_set_t *set, wsync_nixl_ranges_t *nixl,
                                      wsync_error_t *err);

/* Consumer: rows of ops from process `pid` (op src_offset is an address there) into this
 * process, in batches of IOV_MAX rows per process_vm_readv. PEER_GONE (no such process),
 * PERMISSION (ptrace access refused), OUT_OF_BOUNDS (an address no longer mapped there). */
wsync_result_t wsync_cpu_read_remote(int64_t pid, const wsync_copy_op_t *ops, size_t n,
                                     wsync_error_t *err);

#endif
