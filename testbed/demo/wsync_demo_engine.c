/* The demo's engine process: parameters allocated once (addresses never change), every manifest
 * mapped onto them by name, copied in place, *consumed* recorded, acked; after each sync every
 * parameter is read back and checked against the content the version must have. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_cli.h"
#include "wsync_demo.h"
#include "wsync_digest.h"
#include "wsync_wire.h"
#include "wsync_client.h"

typedef struct wsync_engine {
    const wsync_demo_options_t *o;
    wsync_loader_t l;
    wsync_host_t host;
    const wsync_consumer_ops_t *cops;
    wsync_consumer_t *c;
    wsync_stream_t stream;
    int have_stream;
    /* cached mappings of the trainer's staging buffers (it alternates between two), the one
     * the current bucket uses, and the slot used last */
    wsync_handle_t *hs[2];
    wsync_buffer_desc_t h_desc[2];
    wsync_handle_t *h;
    int h_last;
    wsync_model_t model;
    void *params; /* engine parameters, plugin memory, allocated once */
    wsync_copy_op_t *ops;
    unsigned char *scratch[2];
    int listen_fd, fd;
} wsync_engine_t;

static int wsync_engine_fail(const char *what, wsync_result_t rc, const wsync_error_t *err)
{
    return wsync_cli_report("engine", what, rc, err);
}

static int wsync_engine_setup(wsync_engine_t *e)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_consumer_config_t cfg = {.struct_size = sizeof(cfg),
                                   .timeout_ms = (uint32_t)e->o->timeout_ms};
    char why[160];
    wsync_result_t rc;

    /* Listen first so the trainer's connect finds us while we load. */
    e->listen_fd = wsync_wire_listen(e->o->socket_path, &err);
    if (e->listen_fd < 0)
        return wsync_engine_fail("listen", err.code, &err);
    wsync_cli_host(&e->host, "engine");
    if (wsync_cli_load(&e->l, e->o->plugin, &e->host) != 0)
        return 1;
    e->cops = e->l.plugin->consumer;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, e->cops, mem_alloc) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, e->cops, mem_copy)) {
        fprintf(stderr, "wsync engine: plugin %s lacks mem_alloc/mem_copy, which the demo needs\n",
                e->l.path);
        return 1;
    }
    if (wsync_model_build(&e->model, &e->o->model, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync engine: %s\n", why);
        return 1;
    }
    rc = e->cops->create(&cfg, &e->c, &err);
    if (rc != WSYNC_OK)
        return wsync_engine_fail("consumer create", rc, &err);
    rc = e->cops->mem_alloc(e->c, e->model.packed_bytes, &e->params, &err);
    if (rc != WSYNC_OK)
        return wsync_engine_fail("mem_alloc of the engine parameters", rc, &err);
    if (WSYNC_HAS_OP(wsync_consumer_ops_t, e->cops, stream_create)) {
        rc = e->cops->stream_create(e->c, &e->stream, &err);
        if (rc != WSYNC_OK)
            return wsync_engine_fail("stream_create", rc, &err);
        e->have_stream = 1;
    }
    e->ops = calloc(e->model.n, sizeof(*e->ops));
    e->scratch[0] = malloc(e->model.max_nbytes);
    e->scratch[1] = malloc(e->model.max_nbytes);
    if (e->ops == NULL || e->scratch[0] == NULL || e->scratch[1] == NULL) {
        fprintf(stderr, "wsync engine: out of host memory\n");
        return 1;
    }
    e->fd = wsync_wire_accept(e->listen_fd, e->o->timeout_ms, &err);
    if (e->fd < 0)
        return wsync_engine_fail("accept the trainer", err.code, &err);
    return 0;
}

/* Reply {"ok": false} so the trainer stops at once instead of timing out, and fail. */
static int wsync_engine_refuse(wsync_engine_t *e, const char *what, wsync_result_t rc,
                               const wsync_error_t *err)
{
    char msg[WSYNC_ERROR_MESSAGE_LEN + 96];

    snprintf(msg, sizeof(msg), "%s: %s: %s", what, wsync_strerror(rc),
             err && err->code != WSYNC_OK ? err->message : "");
    wsync_cli_send_json(e->fd, json_pack("{s:s, s:b, s:s}", "type", "ack", "ok", 0, "error", msg),
                        "engine");
    return wsync_engine_fail(what, rc, err);
}

/* Open the manifest's buffer, or reuse the cached mapping when it names the same one (two are
 * kept: the trainer alternates between two staging buffers); the one used less recently goes. */
static wsync_result_t wsync_engine_handle(wsync_engine_t *e, const wsync_buffer_desc_t *b,
                                          wsync_error_t *err)
{
    wsync_result_t rc;

    for (int k = 0; k < 2; k++) {
        const wsync_buffer_desc_t *d = &e->h_desc[k];
        if (e->hs[k] != NULL && d->kind == b->kind && d->pid == b->pid &&
            d->handle_len == b->handle_len && memcmp(d->handle, b->handle, b->handle_len) == 0 &&
            strcmp(d->device, b->device) == 0) {
            e->h = e->hs[k];
            e->h_last = k;
            return WSYNC_OK;
        }
    }
    const int k = e->hs[0] == NULL ? 0 : e->hs[1] == NULL ? 1 : 1 - e->h_last;
    if (e->hs[k] != NULL) {
        rc = e->cops->close_handle(e->c, e->hs[k], err);
        e->hs[k] = NULL;
        if (rc != WSYNC_OK)
            return rc;
    }
    e->h = NULL;
    rc = e->cops->open_handle(e->c, b, &e->hs[k], err);
    if (rc == WSYNC_OK) {
        e->h_desc[k] = *b;
        e->h = e->hs[k];
        e->h_last = k;
    }
    return rc;
}

/* Close every cached mapping (the first failure is returned). */
static wsync_result_t wsync_engine_close_all(wsync_engine_t *e, wsync_error_t *err)
{
    wsync_result_t first = WSYNC_OK;
    for (int k = 0; k < 2; k++)
        if (e->hs[k] != NULL) {
            wsync_result_t rc = e->cops->close_handle(e->c, e->hs[k], err);
            e->hs[k] = NULL;
            if (first == WSYNC_OK)
                first = rc;
        }
    e->h = NULL;
    return first;
}

/* Map every tensor of the manifest onto an engine parameter; refuses unknown names and any
 * dtype/shape disagreement before anything is copied. */
static int wsync_engine_build_ops(wsync_engine_t *e, const wsync_manifest_t *m, char *why,
                                  size_t len)
{
    if (m->n_tensors > e->model.n) {
        snprintf(why, len, "manifest has %zu tensors, the model only %zu", m->n_tensors,
                 e->model.n);
        return -1;
    }
    for (size_t i = 0; i < m->n_tensors; i++) {
        const wsync_tensor_desc_t *d = &m->tensors[i];
        long idx = wsync_model_find(&e->model, d->name);
        const wsync_model_tensor_t *p;
        wsync_copy_op_t *op = &e->ops[i];

        if (idx < 0) {
            snprintf(why, len, "unknown tensor name '%s': no such engine parameter", d->name);
            return -1;
        }
        p = &e->model.tensors[idx];
        if (d->dtype != p->dtype || d->ndim != p->ndim || d->nbytes != p->nbytes ||
            memcmp(d->shape, p->shape, p->ndim * sizeof(int64_t)) != 0) {
            snprintf(why, len, "tensor '%s': dtype/shape differ from the engine parameter",
                     d->name);
            return -1;
        }
        memset(op, 0, sizeof(*op));
        op->src_offset = d->offset;
        op->src_pitch = d->nbytes;
        op->dst = (char *)e->params + p->offset;
        op->dst_pitch = p->nbytes;
        op->dst_extent = p->nbytes;
        op->rows = 1;
        op->row_bytes = d->nbytes;
        op->digest = d->digest;
        op->has_digest = d->has_digest;
    }
    return 0;
}

static int wsync_engine_bucket(wsync_engine_t *e, double *copy_s)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_manifest_t *m = NULL;
    char *text = NULL, why[WSYNC_ERROR_MESSAGE_LEN];
    size_t len = 0;
    double t0;
    wsync_result_t rc;
    uint64_t gen;

    rc = wsync_wire_recv(e->fd, &text, &len, e->o->timeout_ms, &err);
    if (rc != WSYNC_OK)
        return wsync_engine_fail("waiting for a manifest", rc, &err);
    t0 = wsync_cli_now();
    rc = e->cops->parse_manifest(e->c, text, len, &m, &err);
    free(text);
    if (rc != WSYNC_OK)
        return wsync_engine_refuse(e, "parse_manifest", rc, &err);
    gen = m->generation;
    rc = wsync_engine_handle(e, &m->buffer, &err);
    if (rc != WSYNC_OK) {
        e->cops->manifest_free(e->c, m);
        return wsync_engine_refuse(e, "open_handle", rc, &err);
    }
    if (wsync_engine_build_ops(e, m, why, sizeof(why)) != 0) {
        e->cops->manifest_free(e->c, m);
        wsync_cli_send_json(
            e->fd, json_pack("{s:s, s:b, s:s}", "type", "ack", "ok", 0, "error", why), "engine");
        fprintf(stderr, "wsync engine: refused manifest of generation %llu: %s\n",
                (unsigned long long)gen, why);
        return 1;
    }
    rc = e->cops->copy_weights(e->c, e->h, e->stream, gen, e->ops, m->n_tensors,
                               e->o->verify ? WSYNC_COPY_VERIFY : 0, &err);
    e->cops->manifest_free(e->c, m);
    if (rc != WSYNC_OK)
        return wsync_engine_refuse(e, "copy_weights", rc, &err);
    /* wait=1: the copies are done and digest results are known before we ack. */
    rc = e->cops->record_consumed(e->c, e->h, 1, &err);
    if (rc != WSYNC_OK)
        return wsync_engine_refuse(e, "record_consumed", rc, &err);
    *copy_s += wsync_cli_now() - t0;
    return wsync_cli_send_json(
        e->fd, json_pack("{s:s, s:I, s:b}", "type", "ack", "generation", (json_int_t)gen, "ok", 1),
        "engine");
}

/* Read every parameter back and compare with the content version k must have. */
static long wsync_engine_verify(wsync_engine_t *e, uint64_t version)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    long ok = 0;

    for (size_t i = 0; i < e->model.n; i++) {
        const wsync_model_tensor_t *p = &e->model.tensors[i];
        wsync_result_t rc = e->cops->mem_copy(e->c, e->scratch[0], (char *)e->params + p->offset,
                                              p->nbytes, 1, &err);
        if (rc != WSYNC_OK) {
            wsync_engine_fail("mem_copy of a parameter to the host", rc, &err);
            return -1;
        }
        wsync_model_fill(p, version, e->scratch[1]);
        if (wsync64(e->scratch[0], p->nbytes) == wsync64(e->scratch[1], p->nbytes))
            ok++;
        else if (ok + 5 > (long)i) /* name the first few only */
            fprintf(stderr, "wsync engine: parameter %s does not hold version %llu\n", p->name,
                    (unsigned long long)version);
    }
    return ok;
}

static int wsync_engine_sync(wsync_engine_t *e, json_t *msg)
{
    json_int_t version = json_integer_value(json_object_get(msg, "version"));
    json_int_t buckets = json_integer_value(json_object_get(msg, "buckets"));
    double copy_s = 0;
    long ok = 0;

    if (version < 1 || buckets < 1) {
        fprintf(stderr, "wsync engine: bad sync message (version %lld, buckets %lld)\n",
                (long long)version, (long long)buckets);
        return 1;
    }
    for (json_int_t b = 0; b < buckets; b++)
        if (wsync_engine_bucket(e, &copy_s) != 0)
            return 1;
    if (e->o->verify) {
        ok = wsync_engine_verify(e, (uint64_t)version);
        if (ok < 0)
            return 1;
    }
    if (wsync_cli_send_json(e->fd,
                            json_pack("{s:s, s:I, s:I, s:I, s:f}", "type", "verified", "version",
                                      version, "ok", (json_int_t)ok, "total",
                                      (json_int_t)e->model.n, "copy_ms", copy_s * 1e3),
                            "engine") != 0)
        return 1;
    return e->o->verify && ok != (long)e->model.n;
}

/* Retire handshake, engine half: close our mapping, then ack so the trainer may free it. */
static int wsync_engine_close(wsync_engine_t *e)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    wsync_result_t rc = wsync_engine_close_all(e, &err);
    if (rc != WSYNC_OK)
        return wsync_engine_fail("close_handle", rc, &err);
    return wsync_cli_send_json(e->fd, json_pack("{s:s}", "type", "closed"), "engine");
}

static int wsync_engine_loop(wsync_engine_t *e)
{
    for (;;) {
        wsync_error_t err = {.struct_size = sizeof(err)};
        char *text = NULL;
        size_t len = 0;
        json_t *msg;
        const char *type;
        int rc;
        wsync_result_t wrc = wsync_wire_recv(e->fd, &text, &len, e->o->timeout_ms * 4, &err);

        if (wrc != WSYNC_OK)
            return wsync_engine_fail("waiting for the trainer", wrc, &err);
        msg = json_loadb(text, len, 0, NULL);
        free(text);
        type = json_string_value(json_object_get(msg, "type"));
        if (type != NULL && strcmp(type, "sync") == 0)
            rc = wsync_engine_sync(e, msg);
        else if (type != NULL && strcmp(type, "end") == 0)
            rc = -1;
        else {
            fprintf(stderr, "wsync engine: unexpected message type '%s'\n", type ? type : "?");
            rc = 1;
        }
        json_decref(msg);
        if (rc < 0)
            return wsync_engine_close(e);
        if (rc != 0)
            return rc;
    }
}

static void wsync_engine_teardown(wsync_engine_t *e)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (e->fd >= 0)
        close(e->fd);
    if (e->listen_fd >= 0) {
        close(e->listen_fd);
        unlink(e->o->socket_path);
    }
    wsync_engine_close_all(e, &err);
    if (e->have_stream)
        e->cops->stream_destroy(e->c, e->stream, &err);
    if (e->params != NULL && WSYNC_HAS_OP(wsync_consumer_ops_t, e->cops, mem_free))
        e->cops->mem_free(e->c, e->params, &err);
    if (e->c != NULL)
        e->cops->finalize(e->c, &err);
    free(e->ops);
    free(e->scratch[0]);
    free(e->scratch[1]);
    wsync_model_free(&e->model);
    wsync_loader_close(&e->l);
}

int wsync_demo_engine(const wsync_demo_options_t *o)
{
    wsync_engine_t e;
    int rc;

    memset(&e, 0, sizeof(e));
    e.o = o;
    e.fd = -1;
    e.listen_fd = -1;
    rc = wsync_engine_setup(&e);
    if (rc == 0)
        rc = wsync_engine_loop(&e);
    wsync_engine_teardown(&e);
    return rc;
}
