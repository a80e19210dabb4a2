/* The demo's trainer process: two retained staging buffers used in turn, so bucket b + 1 is
 * staged (a checkpoint's crosses PCIe) while the engine copies bucket b; the consumed handshake
 * before every reuse and the retire handshake at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsync_checkpoint.h"
#include "wsync_cli.h"
#include "wsync_demo.h"
#include "wsync_digest.h"
#include "wsync_wire.h"

typedef struct wsync_trainer {
    const wsync_demo_options_t *o;
    wsync_loader_t l;
    wsync_host_t host;
    const wsync_consumer_ops_t *cops;
    const wsync_producer_ops_t *pops;
    wsync_consumer_t *mem;       /* a consumer used only for its memory helpers */
    wsync_staging_t *staging[2]; /* bucket b goes through staging[b % 2] */
    uint64_t pending[2];         /* the generation each published and not yet seen acked */
    wsync_stream_t stream;
    int have_stream;
    wsync_model_t model;
    void *params;           /* the trainer's parameters, plugin memory */
    unsigned char *scratch; /* host */
    uint64_t *expected;     /* wsync64 of each tensor for the current version */
    wsync_stage_tensor_t *stage;
    size_t *bucket_first; /* bucket b = tensors [bucket_first[b], bucket_first[b+1]) */
    size_t nbuckets;
    int fd;
    int registered; /* the checkpoint's shards are registered with the producer */
} wsync_trainer_t;

static int wsync_trainer_fail(const char *what, wsync_result_t rc, const wsync_error_t *err)
{
    return wsync_cli_report("trainer", what, rc, err);
}

/* Greedy packing in model order with the staging's 256-byte alignment. */
static int wsync_trainer_plan(wsync_trainer_t *t)
{
    uint64_t used = 0;

    t->bucket_first = calloc(t->model.n + 1, sizeof(*t->bucket_first));
    if (t->bucket_first == NULL)
        return 1;
    for (size_t i = 0; i < t->model.n; i++) {
        const wsync_model_tensor_t *m = &t->model.tensors[i];
        uint64_t at = (used + WSYNC_MODEL_ALIGN - 1) / WSYNC_MODEL_ALIGN * WSYNC_MODEL_ALIGN;
        if (m->nbytes > t->o->bucket_bytes) {
            fprintf(stderr,
                    "wsync trainer: tensor %s (%llu bytes) does not fit a %llu-byte bucket; "
                    "raise --bucket-mb or --scale\n",
                    m->name, (unsigned long long)m->nbytes, (unsigned long long)t->o->bucket_bytes);
            return 1;
        }
        if (i == 0 || at + m->nbytes > t->o->bucket_bytes) {
            t->bucket_first[t->nbuckets++] = i;
            at = 0;
        }
        used = at + m->nbytes;
    }
    t->bucket_first[t->nbuckets] = t->model.n;
    return 0;
}

/* A checkpoint's tensor is staged straight from the file's mapping, converted there when the
 * engine holds another float dtype (the stage's src_dtype); the CUDA plugin reads the mapping
 * over PCIe once it is registered (wsync_trainer_register). */
static int wsync_trainer_from_file(const wsync_trainer_t *t, const wsync_model_tensor_t *m)
{
    (void)t;
    return m->data != NULL;
}

/* Register every shard's mapping with the producer (register_host): a plugin without the member
 * (before 0.1.5) stages from plugin memory only, so the checkpoint goes through the parameters. */
static int wsync_trainer_register(wsync_trainer_t *t, int on)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_checkpoint_of(&t->model) == NULL || strcmp(t->l.plugin->name, "cpu") == 0)
        return 0;
    if (!WSYNC_HAS_OP(wsync_producer_ops_t, t->pops, register_host)) {
        fprintf(stderr,
                "wsync trainer: plugin %s has no register_host (ABI 0.1.5): it cannot stage "
                "a checkpoint from the file\n",
                t->l.path);
        return 1;
    }
    for (size_t k = 0; k < wsync_checkpoint_shards(wsync_checkpoint_of(&t->model)); k++) {
        const void *base;
        size_t len;
        wsync_checkpoint_shard_mapping(wsync_checkpoint_of(&t->model), k, &base, &len);
        wsync_result_t rc = on ? t->pops->register_host(t->staging[0], base, len, &err)
                               : t->pops->unregister_host(t->staging[0], base, &err);
        if (rc != WSYNC_OK)
            return wsync_trainer_fail(on ? "register_host of a checkpoint shard"
                                         : "unregister_host of a checkpoint shard",
                                      rc, &err);
        t->registered = on;
    }
    return 0;
}

static int wsync_trainer_setup(wsync_trainer_t *t)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_consumer_config_t ccfg = {.struct_size = sizeof(ccfg),
                                    .timeout_ms = (uint32_t)t->o->timeout_ms};
    wsync_staging_config_t scfg = {.struct_size = sizeof(scfg),
                                   .bytes = t->o->bucket_bytes,
                                   .timeout_ms = (uint32_t)t->o->timeout_ms};
    char why[160];
    wsync_result_t rc;

    wsync_cli_host(&t->host, "trainer");
    if (wsync_cli_load(&t->l, t->o->plugin, &t->host) != 0)
        return 1;
    t->cops = t->l.plugin->consumer;
    t->pops = t->l.plugin->producer;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, mem_alloc) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, mem_copy) ||
        !WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, parse_manifest)) {
        fprintf(stderr,
                "wsync trainer: plugin %s lacks mem_alloc/mem_copy/parse_manifest, which "
                "the demo needs\n",
                t->l.path);
        return 1;
    }
    if (wsync_model_build(&t->model, &t->o->model, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync trainer: %s\n", why);
        return 1;
    }
    if (wsync_trainer_plan(t) != 0)
        return 1;
    rc = t->cops->create(&ccfg, &t->mem, &err);
    if (rc != WSYNC_OK)
        return wsync_trainer_fail("consumer create (memory helpers)", rc, &err);
    rc = t->cops->mem_alloc(t->mem, t->model.packed_bytes, &t->params, &err);
    if (rc != WSYNC_OK)
        return wsync_trainer_fail("mem_alloc of the trainer parameters", rc, &err);
    t->scratch = malloc(t->model.max_nbytes);
    t->expected = calloc(t->model.n, sizeof(*t->expected));
    t->stage = calloc(t->model.n, sizeof(*t->stage));
    if (t->scratch == NULL || t->expected == NULL || t->stage == NULL) {
        fprintf(stderr, "wsync trainer: out of host memory\n");
        return 1;
    }
    for (size_t i = 0; i < t->model.n; i++) {
        const wsync_model_tensor_t *m = &t->model.tensors[i];
        wsync_stage_tensor_t *s = &t->stage[i];
        s->struct_size = sizeof(*s);
        s->name = m->name;
        s->dtype = m->dtype;
        s->ndim = m->ndim;
        memcpy(s->shape, m->shape, sizeof(m->shape));
        /* A checkpoint on the CPU plugin stages straight from the file's mapping (plugin
         * memory is host memory); other bytes go through the trainer's parameters. */
        s->src = wsync_trainer_from_file(t, m) ? m->data : (const char *)t->params + m->offset;
        s->src_dtype = wsync_trainer_from_file(t, m) ? m->file_dtype : m->dtype;
    }
    for (int k = 0; k < 2; k++) {
        rc = t->pops->create(&scfg, &t->staging[k], &err);
        if (rc != WSYNC_OK)
            return wsync_trainer_fail("staging create", rc, &err);
    }
    if (wsync_trainer_register(t, 1) != 0)
        return 1;
    if (WSYNC_HAS_OP(wsync_producer_ops_t, t->pops, stream_create)) {
        rc = t->pops->stream_create(t->staging[0], &t->stream, &err);
        if (rc != WSYNC_OK)
            return wsync_trainer_fail("producer stream_create", rc, &err);
        t->have_stream = 1;
    }
    t->fd = wsync_wire_connect(t->o->socket_path, t->o->timeout_ms, &err);
    if (t->fd < 0)
        return wsync_trainer_fail("connect to the engine", err.code, &err);
    printf(
        "trainer: plugin %s %s (%s), %zu tensors, %.1f MiB payload, %zu buckets of <= %llu MiB\n",
        t->l.plugin->name, t->l.plugin->version, t->l.path, t->model.n,
        (double)t->model.payload_bytes / (1 << 20), t->nbuckets,
        (unsigned long long)(t->o->bucket_bytes >> 20));
    fflush(stdout);
    return 0;
}

/* "Training": write version k of every parameter (not timed). */
static int wsync_trainer_fill(wsync_trainer_t *t, uint64_t version)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (t->have_stream && WSYNC_HAS_OP(wsync_producer_ops_t, t->pops, stream_synchronize)) {
        wsync_result_t rc = t->pops->stream_synchronize(t->staging[0], t->stream, &err);
        if (rc != WSYNC_OK)
            return wsync_trainer_fail("producer stream_synchronize", rc, &err);
    }
    for (size_t i = 0; i < t->model.n; i++) {
        const wsync_model_tensor_t *m = &t->model.tensors[i];
        wsync_result_t rc;
        if (wsync_trainer_from_file(t, m)) { /* staged from the mapping itself */
            if (t->o->verify && m->file_dtype == m->dtype)
                t->expected[i] = wsync64(m->data, m->nbytes);
            else if (t->o->verify) { /* the reference conversion, on the host */
                wsync_model_fill(m, version, t->scratch);
                t->expected[i] = wsync64(t->scratch, m->nbytes);
            }
            continue;
        }
        wsync_model_fill(m, version, t->scratch);
        if (t->o->verify)
            t->expected[i] = wsync64(t->scratch, m->nbytes);
        rc = t->cops->mem_copy(t->mem, (char *)t->params + m->offset, t->scratch, m->nbytes, 0,
                               &err);
        if (rc != WSYNC_OK)
            return wsync_trainer_fail("mem_copy into the trainer parameters", rc, &err);
    }
    return 0;
}

/* The trainer's own check: the digests it publishes are those of what it meant to send. */
static int wsync_trainer_check_manifest(wsync_trainer_t *t, const char *json)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const wsync_manifest_t *m = NULL;
    wsync_result_t rc = t->cops->parse_manifest(t->mem, json, strlen(json), &m, &err);
    int bad = 0;

    if (rc != WSYNC_OK)
        return wsync_trainer_fail("parse_manifest of our own manifest", rc, &err);
    for (size_t i = 0; i < m->n_tensors; i++) {
        long idx = wsync_model_find(&t->model, m->tensors[i].name);
        if (idx < 0 || !m->tensors[i].has_digest || m->tensors[i].digest != t->expected[idx]) {
            fprintf(stderr, "wsync trainer: published tensor %s has %s\n", m->tensors[i].name,
                    idx < 0 ? "an unknown name" : "a digest that differs from its content");
            bad = 1;
        }
    }
    t->cops->manifest_free(t->mem, m);
    return bad;
}

/* The ack of the bucket staging[k] carried last (acks come in bucket order), then *consumed*:
 * only after both may that buffer be overwritten. */
static int wsync_trainer_ack(wsync_trainer_t *t, int k)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (t->pending[k] == 0)
        return 0;
    json_t *ack = wsync_cli_recv_json(t->fd, "ack", t->o->timeout_ms, "trainer");
    if (ack == NULL)
        return 1;
    json_decref(ack);
    wsync_result_t rc = t->pops->wait_consumed(t->staging[k], t->stream, t->pending[k], &err);
    t->pending[k] = 0;
    if (rc != WSYNC_OK)
        return wsync_trainer_fail("wait_consumed", rc, &err);
    return 0;
}

static int wsync_trainer_bucket(wsync_trainer_t *t, size_t b)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    size_t first = t->bucket_first[b], n = t->bucket_first[b + 1] - first;
    const int k = (int)(b % 2);
    const char *json = NULL;
    uint64_t gen = 0;
    wsync_result_t rc;

    if (wsync_trainer_ack(t, k) != 0) /* bucket b - 2's */
        return 1;
    rc = t->pops->stage(t->staging[k], t->stream, &t->stage[first], n, &err);
    if (rc != WSYNC_OK)
        return wsync_trainer_fail("stage", rc, &err);
    rc = t->pops->publish(t->staging[k], t->stream, b + 1 == t->nbuckets, &json, &gen, &err);
    if (rc != WSYNC_OK)
        return wsync_trainer_fail("publish", rc, &err);
    if (t->o->verify && wsync_trainer_check_manifest(t, json) != 0)
        return 1;
    rc = wsync_wire_send(t->fd, json, strlen(json), &err);
    if (rc != WSYNC_OK)
        return wsync_trainer_fail("send manifest", rc, &err);
    t->pending[k] = gen;
    return 0;
}

static int wsync_trainer_sync(wsync_trainer_t *t, unsigned k)
{
    double t0, dt;
    json_t *rep;
    long ok, total;
    int failed;

    if (wsync_trainer_fill(t, k) != 0)
        return 1;
    if (wsync_cli_send_json(t->fd,
                            json_pack("{s:s, s:I, s:I}", "type", "sync", "version", (json_int_t)k,
                                      "buckets", (json_int_t)t->nbuckets),
                            "trainer") != 0)
        return 1;
    t0 = wsync_cli_now();
    double shown = t0;
    for (size_t b = 0; b < t->nbuckets; b++) {
        if (wsync_trainer_bucket(t, b) != 0)
            return 1;
        /* a long push says how far it got, about once a second, on stderr */
        const double now = wsync_cli_now();
        if (now - shown >= 1.0 && b + 1 < t->nbuckets) {
            fprintf(stderr, "sync %u/%u: bucket %zu/%zu\n", k, t->o->syncs, b + 1, t->nbuckets);
            shown = now;
        }
    }
    /* the last two buckets' acks, in the order they were sent */
    if (wsync_trainer_ack(t, (int)(t->nbuckets % 2)) != 0 ||
        wsync_trainer_ack(t, (int)((t->nbuckets + 1) % 2)) != 0)
        return 1;
    dt = wsync_cli_now() - t0;
    rep = wsync_cli_recv_json(t->fd, "verified", t->o->timeout_ms * 4, "trainer");
    if (rep == NULL)
        return 1;
    ok = (long)json_integer_value(json_object_get(rep, "ok"));
    total = (long)json_integer_value(json_object_get(rep, "total"));
    failed = t->o->verify && (ok != total || total != (long)t->model.n);
    printf("sync %u/%u: %8.2f ms, %6.2f GB/s, %zu buckets, ", k, t->o->syncs, dt * 1e3,
           (double)t->model.payload_bytes / dt / 1e9, t->nbuckets);
    if (t->o->verify)
        printf("verified %ld/%zu tensors%s\n", ok, t->model.n, failed ? " FAILED" : "");
    else
        printf("not verified (--no-verify)\n");
    fflush(stdout);
    json_decref(rep);
    return failed;
}

/* Retire handshake: the engine closes its mapping and acks; only then the buffer is freed. */
static int wsync_trainer_finish(wsync_trainer_t *t)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    json_t *closed;
    wsync_result_t rc;

    if (wsync_cli_send_json(t->fd, json_pack("{s:s}", "type", "end"), "trainer") != 0)
        return 1;
    closed = wsync_cli_recv_json(t->fd, "closed", t->o->timeout_ms, "trainer");
    if (closed == NULL)
        return 1;
    json_decref(closed);
    if (t->have_stream) {
        rc = t->pops->stream_destroy(t->staging[0], t->stream, &err);
        t->have_stream = 0;
        if (rc != WSYNC_OK)
            return wsync_trainer_fail("producer stream_destroy", rc, &err);
    }
    if (wsync_trainer_register(t, 0) != 0)
        return 1;
    for (int k = 0; k < 2; k++) {
        rc = t->pops->retire(t->staging[k], &err);
        t->staging[k] = NULL;
        if (rc != WSYNC_OK)
            return wsync_trainer_fail("retire", rc, &err);
    }
    printf("trainer: engine closed its mappings; staging retired\n");
    return 0;
}

static void wsync_trainer_teardown(wsync_trainer_t *t)
{
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (t->fd >= 0)
        close(t->fd);
    if (t->have_stream)
        t->pops->stream_destroy(t->staging[0], t->stream, &err);
    if (t->staging[0] != NULL && t->registered)
        wsync_trainer_register(t, 0);
    for (int k = 0; k < 2; k++)
        if (t->staging[k] != NULL)
            t->pops->retire(t->staging[k], &err);
    if (t->params != NULL && WSYNC_HAS_OP(wsync_consumer_ops_t, t->cops, mem_free))
        t->cops->mem_free(t->mem, t->params, &err);
    if (t->mem != NULL)
        t->cops->finalize(t->mem, &err);
    free(t->scratch);
    free(t->expected);
    free(t->stage);
    free(t->bucket_first);
    wsync_model_free(&t->model);
    wsync_loader_close(&t->l);
}

int wsync_demo_trainer(const wsync_demo_options_t *o)
{
    wsync_trainer_t t;
    int rc;

    memset(&t, 0, sizeof(t));
    t.o = o;
    t.fd = -1;
    rc = wsync_trainer_setup(&t);
    for (unsigned k = 1; rc == 0 && k <= o->syncs; k++)
        rc = wsync_trainer_sync(&t, k);
    if (rc == 0)
        rc = wsync_trainer_finish(&t);
    wsync_trainer_teardown(&t);
    return rc;
}
