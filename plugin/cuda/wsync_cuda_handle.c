/* Consumer mappings: open/close through the shared cache, so a buffer is IPC-opened once per
 * process however many times the engine opens it, and closed when the last view goes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_cuda.h"
#include "wsync_cuda_peer.h"
#include "wsync_error.h"
#include "wsync_log.h"

/* Size of the allocation that starts at p, from the driver (0 when it cannot tell). */
static uint64_t allocation_bytes(const void *p)
{
    uintptr_t base;
    size_t size;
    if (!wsync_cuda_alloc_range(p, &base, &size))
        return 0;
    return (uint64_t)size - ((uintptr_t)p - base);
}

/* Let the engine's stream write *consumed* into the control block itself (a stream memory
 * write after the copies; no host function stalls the stream). When the tuning asks for the host
 * (consumed_host, an experiment) or the driver refuses, a host function queued after the copies
 * writes it. */
static void control_for_the_gpu(const wsync_cuda_tuning_t *tu, wsync_cuda_mapping_t *m)
{
    void *d = NULL;
    if (tu->consumed_host)
        return;
    if (cudaHostRegister(m->control, sizeof(*m->control),
                         cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        WSYNC_LOG_DEBUG("cudaHostRegister(control block) refused: consumed from a host function");
        return;
    }
    m->control_registered = 1;
    if (cudaHostGetDevicePointer(&d, (void *)&m->control->consumed_generation, 0) == cudaSuccess)
        m->consumed_dev = d;
    else
        (void)cudaGetLastError();
}

static void mapping_destroy(wsync_cuda_mapping_t *m)
{
    if (m->guard != NULL && m->guard->uses == m->guard_uses && m->guard->used)
        cudaEventSynchronize(m->guard->done); /* the last launch that read this segment */
    for (size_t i = 0; i < m->carriers.n; i++) {
        cudaEvent_t ev = (cudaEvent_t)m->carriers.at[i].event;
        cudaEventSynchronize(ev); /* no copy may still read the buffer */
        cudaEventDestroy(ev);
    }
    struct wsync_consumer *c = m->consumer;
    for (unsigned i = 0; c && i < WSYNC_CUDA_RING_SLOTS; i++) {
        wsync_cuda_slot_t *s = &c->ring.slot[i];
        if (s->owner == m) {
            cudaEventSynchronize(s->done);
            wsync_error_t e = {.struct_size = sizeof(e)};
            if (wsync_cuda_slot_check(s, &e) != WSYNC_OK)
                WSYNC_LOG_WARN("closing a buffer with an unreported digest failure: %s", e.message);
        }
    }
    if (m->has_ready)
        cudaEventDestroy(m->ready);
    if (m->has_consumed)
        cudaEventDestroy(m->consumed);
    if (m->is_vmm) {
        wsync_cuda_vmm_destroy(&m->vmm);
        atomic_fetch_add(&wsync_cuda_stats.ipc_mem_closes, 1);
    } else if (m->base) {
        cudaIpcCloseMemHandle(m->base);
        atomic_fetch_add(&wsync_cuda_stats.ipc_mem_closes, 1);
    }
    if (m->control) {
        if (m->control_registered) /* the streams' last events follow its writes */
            cudaHostUnregister(m->control);
        wsync_control_detach(m->control);
        wsync_shm_close(&m->control_shm);
        if (c != NULL)
            wsync_peers_drop(&c->peers, m->peer_pid);
    }
    free(m);
}

/* Map desc's control block (if it names one) and hold its producer as verified: the pid
 * its creator wrote there, which a manifest's pid must then equal. */
static wsync_result_t mapping_control_open(struct wsync_consumer *c, wsync_cuda_mapping_t *m,
                                           const wsync_buffer_desc_t *desc, wsync_error_t *err)
{
    wsync_result_t rc =
        wsync_shm_open(&m->control_shm, desc->control, sizeof(wsync_control_t), err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_control_t *ctl = m->control_shm.addr;
    rc = wsync_control_check(ctl, err);
    if (rc == WSYNC_OK && atomic_load(&ctl->retired))
        rc =
            WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                       "the producer retired buffer %s; wait for its next manifest", desc->control);
    const int64_t owner = atomic_load(&ctl->producer_pid);
    if (rc == WSYNC_OK && desc->pid > 0 && desc->pid != owner)
        rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                        "manifest says producer pid %lld, but buffer %s was published by pid %lld",
                        (long long)desc->pid, desc->control, (long long)owner);
    if (rc == WSYNC_OK && wsync_peers_add(&c->peers, owner) != 0)
        rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY,
                        "this engine already maps buffers of %d producers; close some first",
                        WSYNC_PEERS_MAX);
    if (rc == WSYNC_OK && (rc = wsync_control_attach(ctl, err)) != WSYNC_OK)
        wsync_peers_drop(&c->peers, owner);
    if (rc != WSYNC_OK) {
        wsync_shm_close(&m->control_shm);
        return rc;
    }
    m->peer_pid = owner;
    atomic_store(&ctl->consumer_pid, (int64_t)getpid());
    m->control = ctl;
    control_for_the_gpu(wsync_cuda_tuning_now(&c->tuning), m);
    return WSYNC_OK;
}

/* A mapping that takes descriptors from a process (pidfd_getfd) trusts the pid it names, so
 * the pid is checked before any descriptor is taken: a cuda_vmm_fd buffer's against its own
 * control block (mapping_control_open); a cuda_vmm_run segment of a direct manifest must name a
 * producer whose control block this engine maps (the manifest buffer's, opened first). A
 * torch_expandable buffer is a foreign export (no control block): its pid is the exporter's
 * word, trusted as the engine trusts the message (docs/RELIABILITY.md). */
static wsync_result_t mapping_pid_check(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                        int64_t *verified, wsync_error_t *err)
{
    if (desc->kind != WSYNC_BUFFER_CUDA_VMM_RUN)
        return WSYNC_OK;
    if (wsync_peers_has(&c->peers, desc->pid)) {
        *verified = desc->pid;
        return WSYNC_OK;
    }
    char known[256];
    wsync_peers_show(&c->peers, known, sizeof(known));
    return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                      "buffer names producer pid %lld, which published no buffer this engine "
                      "maps (verified producers: %s); its descriptors are not taken",
                      (long long)desc->pid, known);
}

wsync_result_t wsync_cuda_map(void *user, const wsync_buffer_desc_t *desc, void **mapping,
                              wsync_error_t *err)
{
    struct wsync_consumer *c = user;
    wsync_result_t rc = WSYNC_OK;
    cudaError_t e;
    if (desc->kind == WSYNC_BUFFER_NIXL)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "a nixl buffer is read by the CPU plugin only; the CUDA plugin does not "
                          "pull over NIXL yet");
    if (desc->kind != WSYNC_BUFFER_CUDA_IPC && desc->kind != WSYNC_BUFFER_CUDA_VMM_FD &&
        desc->kind != WSYNC_BUFFER_TORCH_EXPANDABLE && desc->kind != WSYNC_BUFFER_CUDA_VMM_RUN)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "buffer kind %d is none of cuda_ipc, cuda_vmm_fd, torch_expandable, "
                          "cuda_vmm_run: "
                          "load the plugin that matches the producer (libwsync_cpu.so for "
                          "host_shm)",
                          (int)desc->kind);
    if (desc->kind == WSYNC_BUFFER_CUDA_IPC && desc->handle_len != sizeof(cudaIpcMemHandle_t) &&
        desc->handle_len != WSYNC_CUDA_SEGMENT_HANDLE_BYTES)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "cuda_ipc handle has %u bytes, expected %zu (cudaIpcMemHandle_t; a "
                          "direct segment's: %u, the allocation id after it)",
                          desc->handle_len, sizeof(cudaIpcMemHandle_t),
                          WSYNC_CUDA_SEGMENT_HANDLE_BYTES);
    wsync_cuda_mapping_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a mapping");
    m->consumer = c;
    m->vmm.fd = -1;
    m->deferred.struct_size = sizeof(m->deferred);
    /* A producer on another GPU: resolve its UUID, check and enable peer access (clear error
     * when the two GPUs cannot reach each other). */
    rc = wsync_cuda_peer_enable(c->device, desc->device, NULL, err);
    if (rc != WSYNC_OK)
        goto fail;
    if (desc->control[0] != '\0' && (rc = mapping_control_open(c, m, desc, err)) != WSYNC_OK)
        goto fail;
    int64_t verified = 0;
    if (desc->kind != WSYNC_BUFFER_CUDA_IPC &&
        (rc = mapping_pid_check(c, desc, &verified, err)) != WSYNC_OK)
        goto fail;
    if (m->control == NULL)
        m->peer_pid = verified; /* a direct segment: its producer, for copy_segments' check */
    if (desc->kind != WSYNC_BUFFER_CUDA_IPC) {
        if (desc->kind == WSYNC_BUFFER_CUDA_VMM_FD)
            rc = wsync_cuda_vmm_import(desc->handle, desc->handle_len, desc->pid, c->device,
                                       &m->vmm, err);
        else if (desc->kind == WSYNC_BUFFER_CUDA_VMM_RUN)
            rc = wsync_cuda_vmm_import_run(desc->handle, desc->handle_len, desc->pid, c->device,
                                           &m->vmm, err);
        else
            rc = wsync_cuda_vmm_import_torch(desc->handle, desc->handle_len, c->device, &m->vmm,
                                             err);
        if (rc != WSYNC_OK)
            goto fail;
        m->is_vmm = 1;
        m->base = (unsigned char *)(uintptr_t)m->vmm.ptr;
        m->alloc_bytes = m->vmm.size;
        atomic_fetch_add(&wsync_cuda_stats.ipc_mem_opens, 1);
    } else {
        cudaIpcMemHandle_t h;
        memcpy(&h, desc->handle, sizeof(h));
        e = cudaIpcOpenMemHandle((void **)&m->base, h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            m->base = NULL;
            rc = wsync_cuda_fail(err, e, __func__,
                                 "cudaIpcOpenMemHandle (is the producer alive, on this machine, "
                                 "and is the handle from another process?)");
            goto fail;
        }
        atomic_fetch_add(&wsync_cuda_stats.ipc_mem_opens, 1);
        m->alloc_bytes = allocation_bytes(m->base);
    }
    if (m->alloc_bytes != 0 &&
        (desc->base_offset > m->alloc_bytes || desc->bytes > m->alloc_bytes - desc->base_offset)) {
        rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                        "buffer base_offset %llu + bytes %llu exceeds the IPC allocation of %llu "
                        "bytes: the manifest does not describe this allocation",
                        (unsigned long long)desc->base_offset, (unsigned long long)desc->bytes,
                        (unsigned long long)m->alloc_bytes);
        goto fail;
    }
    if (desc->has_ready) {
        cudaIpcEventHandle_t eh;
        memcpy(&eh, desc->ready, sizeof(eh));
        if (desc->ready_len != sizeof(eh) ||
            (e = cudaIpcOpenEventHandle(&m->ready, eh)) != cudaSuccess) {
            rc = desc->ready_len != sizeof(eh)
                     ? WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                                  "ready event handle has %u bytes, expected %zu", desc->ready_len,
                                  sizeof(eh))
                     : wsync_cuda_fail(err, e, __func__, "cudaIpcOpenEventHandle(ready)");
            goto fail;
        }
        m->has_ready = 1;
        atomic_fetch_add(&wsync_cuda_stats.ipc_event_opens, 1);
    }
    if (desc->has_consumed) {
        cudaIpcEventHandle_t eh;
        memcpy(&eh, desc->consumed, sizeof(eh));
        if (desc->consumed_len != sizeof(eh) ||
            (e = cudaIpcOpenEventHandle(&m->consumed, eh)) != cudaSuccess) {
            rc = desc->consumed_len != sizeof(eh)
                     ? WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                                  "consumed event handle has %u bytes, expected %zu",
                                  desc->consumed_len, sizeof(eh))
                     : wsync_cuda_fail(err, e, __func__, "cudaIpcOpenEventHandle(consumed)");
            goto fail;
        }
        m->has_consumed = 1;
        atomic_fetch_add(&wsync_cuda_stats.ipc_event_opens, 1);
    }
    *mapping = m;
    return WSYNC_OK;
fail:
    if (m->control != NULL)
        wsync_peers_drop(&c->peers, m->peer_pid);
    m->consumer = NULL; /* no ring slot is its */
    mapping_destroy(m);
    return rc;
}

void wsync_cuda_unmap(void *user, void *mapping)
{
    (void)user;
    mapping_destroy(mapping);
}

wsync_result_t wsync_cuda_open_handle(struct wsync_consumer *c, const wsync_buffer_desc_t *desc,
                                      struct wsync_handle **out, wsync_error_t *err)
{
    if (c == NULL || desc == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "open_handle needs a consumer, a buffer desc and an out pointer");
    struct wsync_handle *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a handle");
    wsync_cuda_range_push("wsync:open_handle");
    wsync_result_t rc = wsync_cuda_use_device(c->device, err);
    if (rc == WSYNC_OK)
        rc = wsync_cache_acquire(c->cache, desc, &h->entry, NULL, err);
    wsync_cuda_range_pop();
    if (rc != WSYNC_OK) {
        free(h);
        return rc;
    }
    h->magic = WSYNC_CUDA_HANDLE_MAGIC;
    h->base_offset = desc->base_offset;
    h->bytes = desc->bytes;
    h->segment = desc->kind == WSYNC_BUFFER_CUDA_VMM_RUN ||
                 (desc->kind == WSYNC_BUFFER_CUDA_IPC &&
                  desc->handle_len == WSYNC_CUDA_SEGMENT_HANDLE_BYTES);
    *out = h;
    return WSYNC_OK;
}

wsync_result_t wsync_cuda_close_handle(struct wsync_consumer *c, struct wsync_handle *h,
                                       wsync_error_t *err)
{
    if (c == NULL || h == NULL || h->magic != WSYNC_CUDA_HANDLE_MAGIC)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "close_handle got %p, which is not an open handle of this consumer",
                          (void *)h);
    wsync_cuda_range_push("wsync:close_handle");
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    wsync_cache_release(c->cache, h->entry);
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_range_pop();
    h->magic = 0;
    free(h);
    return WSYNC_OK;
}
