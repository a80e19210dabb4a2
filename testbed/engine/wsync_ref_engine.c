/* Reference engine; see wsync_ref_engine.h. */
#include "wsync_ref_engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_control.h"
#include "wsync_error.h"
#include "wsync_client.h"
#include "wsync_request.h"
#include "wsync_shm.h"
#include "wsync_wire.h"

static void wsync_ref_stderr_log(void *user, wsync_log_level_t level, const char *file, int line,
                                 const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const wsync_ref_engine_t *e = user;
    va_list ap;

    (void)file;
    (void)line;
    fprintf(stderr, "wsync-engine[%s rank %u] %s: ", e->cfg.engine, e->cfg.rank,
            names[level <= WSYNC_LOG_DEBUG ? level : WSYNC_LOG_DEBUG]);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ------------------------------------------------------------ registry callbacks */

static int wsync_ref_param(void *user, const char *name, wsync_param_info_t *out)
{
    wsync_ref_engine_t *e = user;
    const wsync_ref_view_t v = {.l = &e->layout, .arena = e->arena};
    return wsync_ref_view_param(&v, name, out);
}

static void wsync_ref_tp(void *user, uint32_t *rank, uint32_t *size)
{
    wsync_ref_engine_t *e = user;
    *rank = e->cfg.rank;
    *size = e->cfg.size;
}

static void wsync_ref_dims(void *user, wsync_model_dims_t *out)
{
    *out = ((wsync_ref_engine_t *)user)->layout.dims;
}

static wsync_stream_t wsync_ref_stream(void *user)
{
    return ((wsync_ref_engine_t *)user)->stream;
}

static void wsync_ref_flush(void *user)
{
    ((wsync_ref_engine_t *)user)->flushes++;
}

static void wsync_ref_post_load(void *user)
{
    ((wsync_ref_engine_t *)user)->post_loads++;
}

static wsync_adapter_slot_t *wsync_ref_lora_slot_cb(void *user, const char *name, int assign)
{
    return wsync_ref_lora_slot(&((wsync_ref_engine_t *)user)->lora, name, assign);
}

static void wsync_ref_lora_loaded_cb(void *user, const char *name, wsync_adapter_slot_t *slot)
{
    wsync_ref_lora_loaded(&((wsync_ref_engine_t *)user)->lora, name, slot);
}

static void wsync_ref_lora_unloaded_cb(void *user, const char *name)
{
    wsync_ref_lora_unloaded(&((wsync_ref_engine_t *)user)->lora, name);
}

static void wsync_ref_lora_reset_cb(void *user, const char *name)
{
    wsync_ref_lora_reset(&((wsync_ref_engine_t *)user)->lora, name);
}

/* Engine memory for the adapter slots: the plugin's, zero-filled. */
static void *wsync_ref_lora_mem_alloc(void *user, size_t bytes)
{
    wsync_ref_engine_t *e = user;
    const wsync_plugin_t *p = wsync_driver_plugin(e->driver);
    wsync_error_t err = {.struct_size = sizeof(err)};
    void *out = NULL, *zero = calloc(1, bytes ? bytes : 1);

    if (zero == NULL ||
        p->consumer->mem_alloc(wsync_driver_consumer(e->driver), bytes, &out, &err) != WSYNC_OK)
        out = NULL;
    if (out != NULL)
        p->consumer->mem_copy(wsync_driver_consumer(e->driver), out, zero, bytes, 0, &err);
    free(zero);
    return out;
}

static void wsync_ref_lora_mem_free(void *user, void *ptr)
{
    wsync_ref_engine_t *e = user;
    const wsync_plugin_t *p = wsync_driver_plugin(e->driver);
    if (WSYNC_HAS_OP(wsync_consumer_ops_t, p->consumer, mem_free))
        p->consumer->mem_free(wsync_driver_consumer(e->driver), ptr, NULL);
}

static int wsync_ref_lora_mem_read(void *user, void *dst, const void *src, size_t bytes)
{
    wsync_ref_engine_t *e = user;
    const wsync_plugin_t *p = wsync_driver_plugin(e->driver);
    return p->consumer->mem_copy(wsync_driver_consumer(e->driver), dst, src, bytes, 1, NULL) ==
                   WSYNC_OK
               ? 0
               : -1;
}

/* The engine's own loader, for when no plugin is usable: reads host_shm staging directly (the
 * way an engine without wsync would rebuild a shared CPU tensor), honouring ready/consumed. */
static wsync_result_t wsync_ref_native_copy(void *user, const wsync_buffer_desc_t *b,
                                            uint64_t generation, const wsync_copy_op_t *ops,
                                            size_t n, wsync_error_t *err)
{
    wsync_ref_engine_t *e = user;
    char name[WSYNC_SHM_NAME_MAX];
    wsync_shm_t shm;
    wsync_control_t *c;
    const unsigned char *data;
    wsync_result_t rc;

    e->native_loads++;
    if (b->kind != WSYNC_BUFFER_HOST_SHM || b->handle_len == 0 || b->handle_len >= sizeof(name))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "the reference engine's native loader reads host_shm buffers "
                            "only; load a wsync plugin for this buffer kind");
    memcpy(name, b->handle, b->handle_len);
    name[b->handle_len] = '\0';
    memset(&shm, 0, sizeof(shm));
    rc = wsync_shm_open(&shm, name, WSYNC_CONTROL_SIZE, err);
    if (rc != WSYNC_OK)
        return rc;
    c = shm.addr;
    rc = wsync_control_check(c, err);
    if (rc == WSYNC_OK && c->data_offset + b->base_offset + b->bytes > shm.size)
        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "buffer %s: %llu usable bytes do not fit the %zu-byte segment", name,
                          (unsigned long long)b->bytes, shm.size);
    if (rc == WSYNC_OK)
        rc = wsync_control_wait_ready(c, generation, e->cfg.timeout_ms ? e->cfg.timeout_ms : 30000,
                                      b->pid, err);
    if (rc == WSYNC_OK) {
        data = (const unsigned char *)shm.addr + c->data_offset + b->base_offset;
        for (size_t i = 0; i < n; i++)
            for (uint64_t r = 0; r < ops[i].rows; r++)
                memcpy((unsigned char *)ops[i].dst + r * ops[i].dst_pitch,
                       data + ops[i].src_offset + r * ops[i].src_pitch, ops[i].row_bytes);
        wsync_control_signal_consumed(c, generation);
    }
    wsync_shm_close(&shm);
    return rc;
}

/* ------------------------------------------------------------ life cycle */

static const wsync_consumer_ops_t *wsync_ref_cops(const wsync_ref_engine_t *e)
{
    const wsync_plugin_t *p = wsync_driver_plugin(e->driver);
    return p != NULL ? p->consumer : NULL;
}

int wsync_ref_engine_open(wsync_ref_engine_t *e, const wsync_ref_engine_config_t *cfg, char *why,
                          size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_consumer_ops_t *cops;
    wsync_driver_config_t dc;

    memset(e, 0, sizeof(*e));
    e->cfg = *cfg;
    if (e->cfg.log == NULL) {
        e->cfg.log = wsync_ref_stderr_log;
        e->cfg.log_user = e;
        e->cfg.log_level = WSYNC_LOG_WARN;
    }
    e->shim = wsync_shim_find(cfg->engine);
    if (e->shim == NULL) {
        snprintf(why, len, "unknown engine \"%s\"; use sglang, vllm or lmdeploy",
                 cfg->engine ? cfg->engine : "(null)");
        return -1;
    }
    if (wsync_ref_layout_build(&e->layout, cfg->engine, &cfg->model, cfg->rank, cfg->size, why,
                               len) != 0)
        return -1;
    e->ops = (wsync_engine_ops_t){.struct_size = sizeof(wsync_engine_ops_t),
                                  .user = e,
                                  .param = wsync_ref_param,
                                  .tp = wsync_ref_tp,
                                  .dims = wsync_ref_dims,
                                  .stream = wsync_ref_stream,
                                  .flush_cache = wsync_ref_flush,
                                  .post_load = wsync_ref_post_load,
                                  .native_copy = wsync_ref_native_copy,
                                  .lora_slot = wsync_ref_lora_slot_cb,
                                  .lora_loaded = wsync_ref_lora_loaded_cb,
                                  .lora_unloaded = wsync_ref_lora_unloaded_cb,
                                  .reset_prefix_cache = wsync_ref_lora_reset_cb};
    dc = (wsync_driver_config_t){.plugin_path = cfg->plugin,
                                 .engine = &e->ops,
                                 .map = e->shim->map,
                                 .log = e->cfg.log,
                                 .log_user = e->cfg.log_user,
                                 .log_level = e->cfg.log_level,
                                 .timeout_ms = cfg->timeout_ms,
                                 .copy_flags = cfg->copy_flags};
    if (wsync_driver_open(&dc, &e->driver, &err) != WSYNC_OK) {
        snprintf(why, len, "driver: %s", err.message);
        wsync_ref_layout_free(&e->layout);
        return -1;
    }
    cops = wsync_ref_cops(e);
    if (cops != NULL && WSYNC_HAS_OP(wsync_consumer_ops_t, cops, mem_alloc) &&
        WSYNC_HAS_OP(wsync_consumer_ops_t, cops, mem_copy)) {
        void *p = NULL;
        if (cops->mem_alloc(wsync_driver_consumer(e->driver), e->layout.arena_bytes, &p, &err) !=
            WSYNC_OK) {
            snprintf(why, len, "mem_alloc of %llu bytes: %s",
                     (unsigned long long)e->layout.arena_bytes, err.message);
            wsync_ref_engine_close(e);
            return -1;
        }
        e->arena = p;
        e->arena_plugin = 1;
        void *zero = calloc(1, e->layout.arena_bytes);
        if (zero != NULL)
            cops->mem_copy(wsync_driver_consumer(e->driver), e->arena, zero, e->layout.arena_bytes,
                           0, &err);
        free(zero);
    } else {
        e->arena = calloc(1, e->layout.arena_bytes ? e->layout.arena_bytes : 1);
        if (e->arena == NULL) {
            snprintf(why, len, "out of memory for %llu bytes of parameters",
                     (unsigned long long)e->layout.arena_bytes);
            wsync_ref_engine_close(e);
            return -1;
        }
    }
    /* Adapter slots live in the plugin's memory; the native loader cannot hot-load adapters. */
    if (e->arena_plugin) {
        wsync_ref_lora_mem_t mem = {.user = e,
                                    .alloc = wsync_ref_lora_mem_alloc,
                                    .free = wsync_ref_lora_mem_free,
                                    .read = wsync_ref_lora_mem_read};
        if (wsync_ref_lora_build(&e->lora, &e->layout, &mem, why, len) != 0) {
            wsync_ref_engine_close(e);
            return -1;
        }
    }
    if (cops != NULL && WSYNC_HAS_OP(wsync_consumer_ops_t, cops, stream_create) &&
        cops->stream_create(wsync_driver_consumer(e->driver), &e->stream, &err) == WSYNC_OK)
        e->own_stream = 1;
    wsync_shim_ctx_init(&e->ctx, e->driver, cfg->rank, cfg->size);
    return 0;
}

void wsync_ref_engine_close(wsync_ref_engine_t *e)
{
    const wsync_consumer_ops_t *cops = e->driver ? wsync_ref_cops(e) : NULL;

    if (e->ctx.state != NULL)
        wsync_shim_ctx_free(&e->ctx);
    if (cops != NULL) {
        wsync_driver_release(e->driver, NULL);
        if (e->own_stream)
            cops->stream_destroy(wsync_driver_consumer(e->driver), e->stream, NULL);
        e->stream = NULL; /* the driver's last drain runs on the default stream */
        wsync_ref_lora_free(&e->lora);
        if (e->arena_plugin && WSYNC_HAS_OP(wsync_consumer_ops_t, cops, mem_free))
            cops->mem_free(wsync_driver_consumer(e->driver), e->arena, NULL);
    } else {
        free(e->arena);
    }
    wsync_driver_close(e->driver);
    wsync_ref_layout_free(&e->layout);
    memset(e, 0, sizeof(*e));
}

/* ------------------------------------------------------------ checks */

int wsync_ref_engine_snapshot(wsync_ref_engine_t *e, void *dst)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_consumer_ops_t *cops = wsync_ref_cops(e);

    if (wsync_driver_drain(e->driver, &err) != WSYNC_OK)
        return -1;
    if (!e->arena_plugin) {
        memcpy(dst, e->arena, e->layout.arena_bytes);
        return 0;
    }
    return cops->mem_copy(wsync_driver_consumer(e->driver), dst, e->arena, e->layout.arena_bytes, 1,
                          &err) == WSYNC_OK
               ? 0
               : -1;
}

size_t wsync_ref_engine_verify(wsync_ref_engine_t *e, uint64_t version, char *first_bad, size_t len)
{
    unsigned char *snap = malloc(e->layout.arena_bytes ? e->layout.arena_bytes : 1);
    unsigned char *want = NULL;
    uint64_t max = 0;
    size_t ok = 0;

    if (first_bad != NULL && len > 0)
        first_bad[0] = '\0';
    for (size_t i = 0; i < e->layout.n; i++)
        if (e->layout.params[i].nbytes > max)
            max = e->layout.params[i].nbytes;
    want = malloc(max ? max : 1);
    if (snap == NULL || want == NULL || wsync_ref_engine_snapshot(e, snap) != 0) {
        if (first_bad != NULL)
            snprintf(first_bad, len, "(could not read the parameters back)");
        free(snap);
        free(want);
        return 0;
    }
    for (size_t i = 0; i < e->layout.n; i++) {
        const wsync_ref_param_t *p = &e->layout.params[i];
        wsync_ref_expected(&e->layout, p, version, want);
        if (memcmp(snap + p->offset, want, p->nbytes) == 0)
            ok++;
        else if (first_bad != NULL && first_bad[0] == '\0')
            snprintf(first_bad, len, "%s", p->name);
    }
    free(snap);
    free(want);
    return ok;
}

/* ------------------------------------------------------------ requests */

static char *wsync_ref_local(wsync_ref_engine_t *e, const char *method, json_t *req,
                             wsync_result_t *rc, int *stop)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_t *reply;
    char *out;

    *rc = WSYNC_OK;
    if (strcmp(method, "wsync.verify") == 0) {
        char bad[WSYNC_REF_NAME_MAX];
        uint64_t version = (uint64_t)json_integer_value(json_object_get(req, "version"));
        size_t ok = wsync_ref_engine_verify(e, version, bad, sizeof(bad));
        reply =
            wsync_req_reply_ok(method, json_pack("{s:I, s:I, s:s, s:I, s:b}", "verified",
                                                 (json_int_t)ok, "total", (json_int_t)e->layout.n,
                                                 "mismatch", bad, "rank", (json_int_t)e->cfg.rank,
                                                 "native", wsync_driver_native(e->driver, NULL)));
    } else if (strcmp(method, "wsync.lora_verify") == 0) {
        char bad[WSYNC_REF_NAME_MAX + 32], why[128];
        const char *name = json_string_value(json_object_get(req, "lora_name"));
        uint64_t version = (uint64_t)json_integer_value(json_object_get(req, "version"));
        uint32_t rank = (uint32_t)json_integer_value(json_object_get(req, "rank"));
        wsync_lora_t a;
        size_t ok = 0;
        bad[0] = '\0';
        if (wsync_lora_build(&a, &e->layout.model, rank, why, sizeof(why)) == 0) {
            wsync_driver_drain(e->driver, NULL);
            ok = wsync_ref_lora_verify(&e->lora, name, &a, version, bad, sizeof(bad));
            wsync_lora_free(&a);
        } else {
            snprintf(bad, sizeof(bad), "%s", why);
        }
        reply = wsync_req_reply_ok(method,
                                   json_pack("{s:I, s:I, s:s}", "verified", (json_int_t)ok, "total",
                                             (json_int_t)(2 * e->lora.n_targets), "mismatch", bad));
    } else if (strcmp(method, "wsync.release") == 0) {
        *rc = wsync_driver_release(e->driver, &err);
        reply = *rc == WSYNC_OK ? wsync_req_reply_ok(method, NULL)
                                : wsync_req_reply_error(method, *rc, &err);
    } else if (strcmp(method, "wsync.shutdown") == 0) {
        *stop = 1;
        reply = wsync_req_reply_ok(method, NULL);
    } else {
        *rc = WSYNC_RECORD(&err, WSYNC_ERR_NOT_SUPPORTED, "unknown engine method \"%s\"", method);
        reply = wsync_req_reply_error(method, *rc, &err);
    }
    out = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    return out;
}

char *wsync_ref_engine_handle(wsync_ref_engine_t *e, const char *text, size_t len,
                              wsync_result_t *rc, int *stop)
{
    json_t *req = json_loadb(text, len, 0, NULL);
    const char *method = json_string_value(json_object_get(req, "method"));
    wsync_result_t local;
    char *out;

    if (rc == NULL)
        rc = &local;
    if (method != NULL && strncmp(method, "wsync.", 6) == 0)
        out = wsync_ref_local(e, method, req, rc, stop);
    else
        out = wsync_shim_serve(e->shim, &e->ctx, text, len, rc, NULL);
    json_decref(req);
    return out;
}

int wsync_ref_engine_serve(wsync_ref_engine_t *e, const char *socket_path, int timeout_ms)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    int lfd = wsync_wire_listen(socket_path, &err), fd, stop = 0, status = 0;

    if (lfd < 0) {
        fprintf(stderr, "wsync-engine: listen on %s: %s\n", socket_path, err.message);
        return 1;
    }
    fd = wsync_wire_accept(lfd, timeout_ms, &err);
    close(lfd);
    unlink(socket_path);
    if (fd < 0) {
        fprintf(stderr, "wsync-engine: accept on %s: %s\n", socket_path, err.message);
        return 1;
    }
    while (!stop) {
        char *msg = NULL, *reply;
        size_t len = 0;
        wsync_result_t rc = wsync_wire_recv(fd, &msg, &len, timeout_ms, &err);
        if (rc == WSYNC_ERR_PEER_GONE)
            break;
        if (rc != WSYNC_OK) {
            fprintf(stderr, "wsync-engine: receive: %s\n", err.message);
            status = 1;
            break;
        }
        reply = wsync_ref_engine_handle(e, msg, len, NULL, &stop);
        free(msg);
        rc = reply != NULL ? wsync_wire_send(fd, reply, strlen(reply), &err)
                           : WSYNC_ERR_OUT_OF_MEMORY;
        free(reply);
        if (rc != WSYNC_OK) {
            fprintf(stderr, "wsync-engine: send reply: %s\n", wsync_strerror(rc));
            status = 1;
            break;
        }
    }
    close(fd);
    return status;
}
