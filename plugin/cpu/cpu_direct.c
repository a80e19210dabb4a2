/* Direct mode on the CPU backend: contract in cpu_direct.h. */
#define _GNU_SOURCE /* process_vm_readv */
#include "cpu_direct.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "wsync_error.h"

typedef struct wsync_cpu_run {
    uint64_t start, end;
} wsync_cpu_run_t;

typedef struct wsync_cpu_maps {
    wsync_cpu_run_t *runs; /* readable, adjacent mappings merged, rising */
    size_t n;
} wsync_cpu_maps_t;

static wsync_result_t wsync_cpu_maps_read(wsync_cpu_maps_t *m, wsync_error_t *err)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "direct mode: open /proc/self/maps: %s",
                          strerror(errno));
    size_t cap = 256;
    m->n = 0;
    m->runs = malloc(cap * sizeof(*m->runs));
    char line[512];
    while (m->runs != NULL && fgets(line, sizeof(line), f) != NULL) {
        uint64_t a, b;
        char perms[8];
        if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s", &a, &b, perms) != 3 || perms[0] != 'r')
            continue;
        if (m->n > 0 && m->runs[m->n - 1].end == a) {
            m->runs[m->n - 1].end = b;
            continue;
        }
        if (m->n == cap) {
            void *p = realloc(m->runs, 2 * cap * sizeof(*m->runs));
            if (p == NULL) {
                free(m->runs);
                m->runs = NULL;
                break;
            }
            m->runs = p;
            cap *= 2;
        }
        m->runs[m->n++] = (wsync_cpu_run_t){a, b};
    }
    fclose(f);
    if (m->runs == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "direct mode: no memory for the maps");
    return WSYNC_OK;
}

static wsync_result_t wsync_cpu_locate(void *user, const char *name, const void *src,
                                       uint64_t nbytes, wsync_buffer_desc_t *seg, uint64_t *offset,
                                       wsync_error_t *err)
{
    const wsync_cpu_maps_t *m = user;
    const uint64_t a = (uint64_t)(uintptr_t)src;
    size_t lo = 0, hi = m->n;
    while (lo < hi) { /* the first run that ends after a */
        size_t mid = lo + (hi - lo) / 2;
        if (m->runs[mid].end <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == m->n || m->runs[lo].start > a || m->runs[lo].end - a < nbytes)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "tensor \"%.80s\": its %" PRIu64 " bytes at 0x%" PRIx64
                          " are not all readable memory of this process",
                          name, nbytes, a);
    const uint64_t start = m->runs[lo].start;
    seg->kind = WSYNC_BUFFER_HOST_PID;
    for (int k = 0; k < 8; k++)
        seg->handle[k] = (uint8_t)(start >> (8 * k));
    seg->handle_len = 8;
    seg->bytes = m->runs[lo].end - start;
    seg->pid = (int64_t)getpid();
    memcpy(seg->device, "cpu", 4);
    *offset = a - start;
    return WSYNC_OK;
}

typedef struct wsync_cpu_locating {
    wsync_cpu_maps_t maps;
    wsync_nixl_ranges_t *nixl;
} wsync_cpu_locating_t;

static wsync_result_t wsync_cpu_locate_nixl(void *user, const char *name, const void *src,
                                            uint64_t nbytes, wsync_buffer_desc_t *seg,
                                            uint64_t *offset, wsync_error_t *err)
{
    wsync_cpu_locating_t *x = user;
    wsync_result_t r = wsync_cpu_locate(&x->maps, name, src, nbytes, seg, offset, err);
    if (r != WSYNC_OK || x->nixl == NULL)
        return r;
    const uint64_t start = (uint64_t)(uintptr_t)src - *offset;
    return wsync_nixl_segment(x->nixl, start, seg->bytes, seg, err);
}

wsync_result_t wsync_cpu_direct_stage(const wsync_stage_tensor_t *t, size_t n,
                                      wsync_direct_set_t *set, wsync_nixl_ranges_t *nixl,
                                      wsync_error_t *err)
{
    wsync_cpu_locating_t x = {.nixl = nixl};
    wsync_result_t r = wsync_cpu_maps_read(&x.maps, err);
    if (r == WSYNC_OK)
        r = wsync_direct_stage(set, t, n, wsync_cpu_locate_nixl, &x, err);
    free(x.maps.runs);
    return r;
}

static wsync_result_t wsync_cpu_remote_error(int64_t pid, int e, uint64_t addr, wsync_error_t *err)
{
    if (e == ESRCH)
        return WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                          "the producer process %lld is gone; its direct bucket cannot be read",
                          (long long)pid);
    if (e == EPERM)
        return WSYNC_FAIL(err, WSYNC_ERR_PERMISSION,
                          "process_vm_readv(pid %lld): %s: reading a direct bucket needs ptrace "
                          "access to the producer (same user; with Yama's ptrace_scope 1 the "
                          "producer must allow it, e.g. prctl(PR_SET_PTRACER))",
                          (long long)pid, strerror(e));
    if (e == EFAULT)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "process_vm_readv(pid %lld): address 0x%" PRIx64
                          " is not mapped in the producer: memory it freed after publishing, or "
                          "an address the manifest made up",
                          (long long)pid, addr);
    return WSYNC_FAIL(err, WSYNC_ERR_SYSTEM, "process_vm_readv(pid %lld): %s", (long long)pid,
                      strerror(e));
}

#define WSYNC_CPU_IOV_BATCH (IOV_MAX < 1024 ? IOV_MAX : 1024)

typedef struct wsync_cpu_iov_batch {
    struct iovec local[WSYNC_CPU_IOV_BATCH], remote[WSYNC_CPU_IOV_BATCH];
    size_t k;
} wsync_cpu_iov_batch_t;

/* Reads the batch; a call may stop short (the kernel moves at most ~2 GiB a call, or an address
 * is no longer mapped): go on from where it stopped, and fail only when it moves nothing. */
static wsync_result_t wsync_cpu_iov_flush(int64_t pid, wsync_cpu_iov_batch_t *b, wsync_error_t *err)
{
    size_t first = 0;
    while (first < b->k) {
        ssize_t got = process_vm_readv((pid_t)pid, b->local + first, b->k - first,
                                       b->remote + first, b->k - first, 0);
        if (got < 0)
            return wsync_cpu_remote_error(pid, errno,
                                          (uint64_t)(uintptr_t)b->remote[first].iov_base, err);
        if (got == 0)
            return wsync_cpu_remote_error(pid, EFAULT,
                                          (uint64_t)(uintptr_t)b->remote[first].iov_base, err);
        uint64_t left = (uint64_t)got;
        while (first < b->k && left >= b->remote[first].iov_len)
            left -= b->remote[first++].iov_len;
        if (first < b->k && left > 0) {
            b->local[first].iov_base = (uint8_t *)b->local[first].iov_base + left;
            b->local[first].iov_len -= left;
            b->remote[first].iov_base = (uint8_t *)b->remote[first].iov_base + left;
            b->remote[first].iov_len -= left;
        }
    }
    b->k = 0;
    return WSYNC_OK;
}

wsync_result_t wsync_cpu_read_remote(int64_t pid, const wsync_copy_op_t *ops, size_t n,
                                     wsync_error_t *err)
{
    wsync_cpu_iov_batch_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a read batch");
    wsync_result_t r = WSYNC_OK;
    for (size_t i = 0; i < n && r == WSYNC_OK; i++) {
        for (uint64_t row = 0; ops[i].row_bytes > 0 && row < ops[i].rows && r == WSYNC_OK; row++) {
            if (b->k == WSYNC_CPU_IOV_BATCH && (r = wsync_cpu_iov_flush(pid, b, err)) != WSYNC_OK)
                break;
            b->local[b->k].iov_base = (uint8_t *)ops[i].dst + row * ops[i].dst_pitch;
            b->local[b->k].iov_len = ops[i].row_bytes;
            b->remote[b->k].iov_base =
                (void *)(uintptr_t)(ops[i].src_offset + row * ops[i].src_pitch);
            b->remote[b->k].iov_len = ops[i].row_bytes;
            b->k++;
        }
    }
    if (r == WSYNC_OK)
        r = wsync_cpu_iov_flush(pid, b, err);
    free(b);
    return r;
}
