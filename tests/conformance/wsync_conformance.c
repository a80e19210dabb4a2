/* The conformance suite: one program, run against one shim and one plugin named on the command
 * line, so the same cases cover every shim x every plugin .so without a rebuild.
 *
 *   wsync_conformance --shim sglang|vllm|lmdeploy --plugin PATH [--case NAME] [--fixtures DIR]
 *
 * Cases: bitexact, reuse, torn, bad, fallback, lora (all by default; lora in
 * wsync_conformance_lora.c). The engine runs in this process;
 * the trainer in a child process (this program with --trainer-server), each loading the plugin,
 * talking through the shim's request messages.
 * Expected parameter bytes come from wsync_ref_layout.c, which shares no code with the shims'
 * mapping. Exit: 0 all passed, 1 a case failed, 77 the plugin cannot run here (SKIPPED). */
#include <getopt.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wsync_digest.h"
#include "wsync_loader.h"
#include "wsync_ref_engine.h"
#include "wsync_ref_trainer.h"
#include "wsync_wire.h"

#include "wsync_conformance.h"
#include "wsync_client.h"

#define CONF_SKIP 77

void conf_fail(conf_t *c, const char *fmt, ...)
{
    va_list ap;
    printf("FAIL: [%s] ", c->shim);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    c->failed = 1;
}

void conf_pass(conf_t *c, const char *fmt, ...)
{
    va_list ap;
    printf("PASS: [%s] ", c->shim);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* ----------------------------------------------------------- log capture */

void conf_log_fn(void *user, wsync_log_level_t level, const char *file, int line, const char *fmt,
                 ...)
{
    conf_log_t *l = user;
    char msg[1024];
    va_list ap;

    (void)file;
    (void)line;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level <= WSYNC_LOG_WARN)
        fprintf(stderr, "  engine log: %s\n", msg);
    if (l != NULL && l->len + strlen(msg) + 2 < sizeof(l->text))
        l->len += (size_t)snprintf(l->text + l->len, sizeof(l->text) - l->len, "%s\n", msg);
}

/* ----------------------------------------------------------- the engine side */

typedef struct conf_link {
    wsync_ref_engine_t *engine; /* the one engine rank this process plays */
} conf_link_t;

/* ----------------------------------------------------------- set-up helpers */

static wsync_model_config_t conf_model(const char *layout)
{
    return (wsync_model_config_t){
        .layout = layout, .scale = strcmp(layout, "moe") == 0 ? 4 : 8, .layers = 1};
}

int conf_engine(conf_t *c, wsync_ref_engine_t *e, const char *plugin, const char *layout,
                uint32_t rank, uint32_t size, conf_log_t *log)
{
    wsync_ref_engine_config_t cfg = {.engine = c->shim,
                                     .plugin = plugin,
                                     .model = conf_model(layout),
                                     .rank = rank,
                                     .size = size,
                                     .timeout_ms = 20000,
                                     .log = conf_log_fn,
                                     .log_user = log,
                                     .log_level = WSYNC_LOG_INFO};
    char why[256];
    if (wsync_ref_engine_open(e, &cfg, why, sizeof(why)) == 0)
        return 0;
    conf_fail(c, "engine %s tp %u/%u: %s", layout, rank, size, why);
    return -1;
}

/* ----------------------------------------------------------- trainer process
 *
 * The trainer runs in its own process (this program re-executed with --trainer-server), as in a
 * real deployment: CUDA IPC cannot open a handle in the process that exported it, and a fresh
 * exec keeps CUDA state from crossing a fork. Commands and replies are JSON over a socketpair. */

typedef struct conf_trainer {
    int fd;
    pid_t pid;
    size_t nbuckets, n_tensors;
    int packed;           /* vLLM: packed buckets instead of per-tensor handles */
    const char *mutation; /* server-side manifest edit for the next publishes (bad requests) */
} conf_trainer_t;

static json_t *conf_call(conf_trainer_t *t, json_t *req)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    char *text = json_dumps(req, JSON_COMPACT), *reply = NULL;
    size_t len;
    json_t *out = NULL;

    json_decref(req);
    if (text != NULL && wsync_wire_send(t->fd, text, strlen(text), &err) == WSYNC_OK &&
        wsync_wire_recv(t->fd, &reply, &len, 120000, &err) == WSYNC_OK)
        out = json_loads(reply, 0, NULL);
    if (out != NULL && !json_is_true(json_object_get(out, "ok"))) {
        fprintf(stderr, "  trainer: %s\n", json_string_value(json_object_get(out, "message")));
        json_decref(out);
        out = NULL;
    } else if (out == NULL && err.code != WSYNC_OK) {
        fprintf(stderr, "  trainer process: %s\n", err.message);
    }
    free(text);
    free(reply);
    return out;
}

static int conf_call_ok(conf_trainer_t *t, json_t *req)
{
    json_t *r = conf_call(t, req);
    json_decref(r);
    return r != NULL ? 0 : -1;
}

static void conf_trainer_close(conf_trainer_t *t)
{
    if (t->fd >= 0) {
        conf_call_ok(t, json_pack("{s:s}", "cmd", "close"));
        close(t->fd);
    }
    if (t->pid > 0)
        waitpid(t->pid, NULL, 0);
    t->fd = -1;
    t->pid = 0;
}

static int conf_trainer(conf_t *c, conf_trainer_t *t, const char *layout, uint64_t bucket_mb)
{
    char self[4096], fdarg[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    int sv[2];
    json_t *r;

    memset(t, 0, sizeof(*t));
    t->fd = -1;
    if (n <= 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        conf_fail(c, "trainer: cannot create the trainer process");
        return -1;
    }
    self[n] = '\0';
    fflush(stdout);
    t->pid = fork();
    if (t->pid == 0) {
        close(sv[0]);
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        execl(self, self, "--trainer-server", fdarg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    t->fd = sv[0];
    r = conf_call(t,
                  json_pack("{s:s, s:s, s:s, s:s, s:I}", "cmd", "open", "shim", c->shim, "plugin",
                            c->plugin, "layout", layout, "bucket_mb", (json_int_t)bucket_mb));
    if (r == NULL) {
        conf_fail(c, "trainer %s: could not start (see above)", layout);
        conf_trainer_close(t);
        return -1;
    }
    t->nbuckets = (size_t)json_integer_value(json_object_get(r, "buckets"));
    t->n_tensors = (size_t)json_integer_value(json_object_get(r, "tensors"));
    json_decref(r);
    return 0;
}

static int conf_tr_fill(conf_trainer_t *t, uint64_t version)
{
    return conf_call_ok(t, json_pack("{s:s, s:I}", "cmd", "fill", "version", (json_int_t)version));
}

/* Stage and publish bucket b; *msgs gets the engine request messages. */
static int conf_tr_publish(conf_trainer_t *t, size_t b, json_t **msgs)
{
    json_t *r =
        conf_call(t, json_pack("{s:s, s:I, s:b, s:s?}", "cmd", "publish", "bucket", (json_int_t)b,
                               "packed", t->packed, "mutation", t->mutation));
    *msgs = r != NULL ? json_incref(json_object_get(r, "msgs")) : NULL;
    json_decref(r);
    return *msgs != NULL ? 0 : -1;
}

static int conf_tr_wait(conf_trainer_t *t)
{
    return conf_call_ok(t, json_pack("{s:s}", "cmd", "wait"));
}

static int conf_tr_new_peer(conf_trainer_t *t)
{
    return conf_call_ok(t, json_pack("{s:s}", "cmd", "new_peer"));
}

/* Deliver one request to the engine; returns its reply (new reference) or NULL. */
static json_t *conf_deliver(conf_link_t *link, json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT), *reply;
    int stop = 0;
    json_t *r;

    if (text == NULL)
        return NULL;
    reply = wsync_ref_engine_handle(link->engine, text, strlen(text), NULL, &stop);
    free(text);
    r = reply != NULL ? json_loads(reply, 0, NULL) : NULL;
    free(reply);
    return r;
}

/* A whole sync: fill, then per bucket publish, deliver, check, wait for *consumed*. */
static int conf_tr_sync(conf_trainer_t *t, conf_link_t *link, uint64_t version)
{
    if (conf_tr_fill(t, version) != 0)
        return -1;
    for (size_t b = 0; b < t->nbuckets; b++) {
        json_t *msgs, *msg;
        size_t i;
        int bad = 0;
        if (conf_tr_publish(t, b, &msgs) != 0)
            return -1;
        json_array_foreach(msgs, i, msg)
        {
            json_t *rep = conf_deliver(link, msg);
            if (!json_is_true(json_object_get(rep, "ok"))) {
                fprintf(stderr, "  engine refused %s: %s\n",
                        json_string_value(json_object_get(msg, "method")),
                        json_string_value(json_object_get(rep, "message")));
                bad = 1;
            }
            json_decref(rep);
        }
        json_decref(msgs);
        if (bad || conf_tr_wait(t) != 0)
            return -1;
    }
    return 0;
}

static int conf_verify(conf_t *c, wsync_ref_engine_t *e, uint64_t version, const char *what)
{
    char bad[WSYNC_REF_NAME_MAX];
    size_t ok = wsync_ref_engine_verify(e, version, bad, sizeof(bad));
    if (ok == e->layout.n)
        return 0;
    conf_fail(c, "%s: %zu/%zu engine parameters bit-exact, first mismatch %s", what, ok,
              e->layout.n, bad);
    return -1;
}

static uint64_t conf_digest(wsync_ref_engine_t *e)
{
    unsigned char *snap = malloc(e->layout.arena_bytes);
    uint64_t d = 0;
    if (snap != NULL && wsync_ref_engine_snapshot(e, snap) == 0)
        d = wsync64(snap, e->layout.arena_bytes);
    free(snap);
    return d;
}

/* ----------------------------------------------------------- cases */

/* Every engine parameter bit-exact: fused qkv / gate_up, experts, TP slices for tp 1, 2, 4. */
static void conf_bitexact(conf_t *c)
{
    static const char *const layouts[] = {"dense", "moe"};
    static const uint32_t tps[] = {1, 2, 4};

    for (size_t li = 0; li < 2; li++) {
        conf_trainer_t t;
        unsigned run = 0;
        if (conf_trainer(c, &t, layouts[li], 48) != 0)
            return;
        for (size_t ti = 0; ti < 3; ti++) {
            for (uint32_t r = 0; r < tps[ti]; r++, run++) {
                wsync_ref_engine_t e;
                conf_link_t link = {0};
                char what[96];
                if (conf_engine(c, &e, c->plugin, layouts[li], r, tps[ti], NULL) != 0)
                    continue;
                link.engine = &e;
                conf_tr_new_peer(&t); /* resend LMDeploy's persistent buffer */
                t.packed = run % 2;   /* vLLM: alternate packed buckets / per-tensor handles */
                snprintf(what, sizeof(what), "bitexact %s tp=%u rank %u%s", layouts[li], tps[ti], r,
                         strcmp(c->shim, "vllm") ? ""
                         : run % 2               ? " packed"
                                                 : " per-tensor");
                if (conf_tr_sync(&t, &link, 1 + run) != 0)
                    conf_fail(c, "%s: sync refused", what);
                else if (conf_verify(c, &e, 1 + run, what) == 0)
                    conf_pass(c,
                              "%s: %zu/%zu engine parameters from %zu HF tensors in %zu "
                              "buckets",
                              what, e.layout.n, e.layout.n, t.n_tensors, t.nbuckets);
                wsync_ref_engine_close(&e);
            }
        }
        conf_trainer_close(&t);
    }
}

/* Repeated syncs through one reused staging buffer (the mapping stays cached). */
static void conf_reuse(conf_t *c)
{
    conf_trainer_t t;
    wsync_ref_engine_t e;
    conf_link_t link = {0};
    const unsigned syncs = 6;

    if (conf_trainer(c, &t, "dense", 24) != 0)
        return;
    if (conf_engine(c, &e, c->plugin, "dense", 1, 2, NULL) == 0) {
        link.engine = &e;
        unsigned k;
        for (k = 1; k <= syncs; k++) {
            char what[64];
            snprintf(what, sizeof(what), "reuse sync %u", k);
            if (conf_tr_sync(&t, &link, k) != 0) {
                conf_fail(c, "%s refused", what);
                break;
            }
            if (conf_verify(c, &e, k, what) != 0)
                break;
        }
        if (k > syncs)
            conf_pass(c,
                      "reuse: %u syncs x %zu buckets through one staging buffer, all "
                      "bit-exact",
                      syncs, t.nbuckets);
        wsync_ref_engine_close(&e);
    }
    conf_trainer_close(&t);
}

/* The torn case's busy engine: the stream is held until the trainer has overwritten the staging
 * buffer (then a plugin that fired *consumed* early has let the copies read the new bytes), or
 * for CONF_TORN_HOLD_MS at most (a correct plugin keeps the trainer waiting for *consumed*, so
 * the overwrite can only come after the copies). A gate, not a fixed sleep: a slow machine
 * (sanitizers, parallel tests) cannot make the broken plugin look correct. */
#define CONF_TORN_HOLD_MS 3000
static _Atomic int conf_restaged;

static void conf_gate_fn(void *user)
{
    struct timespec ts = {0, 1000000L};
    (void)user;
    for (int ms = 0; ms < CONF_TORN_HOLD_MS && !atomic_load(&conf_restaged); ms++)
        nanosleep(&ts, NULL);
}

/* Per parameter: holds version `version` exactly, is still all zero (not loaded), or neither. */
static int conf_classify(wsync_ref_engine_t *e, uint64_t version, size_t *exact, size_t *zero,
                         char *other, size_t len)
{
    unsigned char *snap = malloc(e->layout.arena_bytes), *want = NULL;
    uint64_t max = 0;

    *exact = *zero = 0;
    other[0] = '\0';
    for (size_t i = 0; i < e->layout.n; i++)
        if (e->layout.params[i].nbytes > max)
            max = e->layout.params[i].nbytes;
    want = malloc(max);
    if (snap == NULL || want == NULL || wsync_ref_engine_snapshot(e, snap) != 0) {
        free(snap);
        free(want);
        return -1;
    }
    for (size_t i = 0; i < e->layout.n; i++) {
        const wsync_ref_param_t *p = &e->layout.params[i];
        const unsigned char *got = snap + p->offset;
        uint64_t j = 0;
        wsync_ref_expected(&e->layout, p, version, want);
        while (j < p->nbytes && got[j] == 0)
            j++;
        if (memcmp(got, want, p->nbytes) == 0)
            (*exact)++;
        else if (j == p->nbytes)
            (*zero)++;
        else if (other[0] == '\0')
            snprintf(other, len, "%s", p->name);
    }
    free(snap);
    free(want);
    return 0;
}

/* The engine stream is busy when the copies of a (not final) bucket are enqueued: *consumed*
 * must not fire before they ran, so the trainer's next bucket, written into the same staging
 * buffer as soon as *consumed* fires, cannot tear them. */
static void conf_torn(conf_t *c)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    conf_trainer_t t;
    wsync_ref_engine_t e;
    conf_link_t link = {0};
    const wsync_consumer_ops_t *cops;
    json_t *msgs = NULL, *msg, *rep;
    char bad[WSYNC_REF_NAME_MAX];
    size_t i, exact, zero;
    int refused = 0;

    if (conf_trainer(c, &t, "dense", 24) != 0)
        return;
    if (t.nbuckets < 2 || conf_engine(c, &e, c->plugin, "dense", 0, 2, NULL) != 0) {
        if (t.nbuckets < 2)
            conf_fail(c, "torn: the model must need at least two buckets");
        conf_trainer_close(&t);
        return;
    }
    link.engine = &e;
    cops = wsync_driver_plugin(e.driver) ? wsync_driver_plugin(e.driver)->consumer : NULL;
    if (cops == NULL || !WSYNC_HAS_OP(wsync_consumer_ops_t, cops, enqueue_host_fn)) {
        conf_fail(c, "torn: plugin has no enqueue_host_fn (or did not load)");
        goto out;
    }
    /* The engine is busy until the trainer restaged (or 3 s): the copies queue behind that. */
    atomic_store(&conf_restaged, 0);
    if (cops->enqueue_host_fn(wsync_driver_consumer(e.driver), e.stream, conf_gate_fn, NULL,
                              &err) != WSYNC_OK) {
        conf_fail(c, "torn: enqueue_host_fn: %s", err.message);
        goto out;
    }
    /* Bucket 0 of version 1: not the last bucket, so no request drains the engine stream. */
    if (conf_tr_fill(&t, 1) != 0 || conf_tr_publish(&t, 0, &msgs) != 0) {
        conf_fail(c, "torn: publish failed");
        goto out;
    }
    json_array_foreach(msgs, i, msg)
    {
        rep = conf_deliver(&link, msg);
        if (!json_is_true(json_object_get(rep, "ok")))
            refused = 1;
        json_decref(rep);
    }
    json_decref(msgs);
    if (refused) {
        conf_fail(c, "torn: engine refused the bucket");
        goto out;
    }
    /* The trainer reuses the buffer as soon as *consumed* fires: version 2 overwrites it. */
    if (conf_tr_wait(&t) != 0 || conf_tr_fill(&t, 2) != 0 || conf_tr_publish(&t, 0, &msgs) != 0) {
        atomic_store(&conf_restaged, 1);
        conf_fail(c, "torn: reuse of the staging buffer failed");
        goto out;
    }
    atomic_store(&conf_restaged, 1);
    json_decref(msgs);
    if (conf_classify(&e, 1, &exact, &zero, bad, sizeof(bad)) != 0) {
        conf_fail(c, "torn: could not read the engine parameters back");
    } else if (exact == 0 || exact + zero != e.layout.n) {
        printf("TORN: %zu of %zu engine parameters of bucket 0 hold bytes the trainer wrote "
               "after *consumed* fired (first: %s): the plugin recorded consumed before its "
               "copies finished\n",
               e.layout.n - exact - zero, exact + (e.layout.n - exact - zero), bad);
        conf_fail(c, "torn: busy engine stream produced torn weights");
    } else {
        conf_pass(c,
                  "torn: busy engine stream (held until the trainer restaged), buffer reused "
                  "right after consumed: "
                  "0 of %zu loaded engine parameters torn",
                  exact);
    }
out:
    wsync_ref_engine_close(&e);
    conf_trainer_close(&t);
}

/* ----------------------------------------------------------- bad requests */

typedef struct conf_bad {
    const char *name; /* also the trainer-side mutation (conf_mutations), NULL-less */
    int replay;       /* resend version 1 instead of a mutated version 2 */
    wsync_result_t code;
    const char *message; /* substring the error must contain */
    /* When the request hands the plugin the manifest as published (SGLang's "wsync_manifest"
     * load_format), the plugin's own check answers; 0 / NULL: the same as above. */
    wsync_result_t code_published;
    const char *message_published;
} conf_bad_t;

static json_t *conf_tensor(json_t *m, const char *suffix)
{
    json_t *t;
    size_t i;
    json_array_foreach(json_object_get(m, "tensors"), i, t)
    {
        const char *n = json_string_value(json_object_get(t, "name"));
        if (n != NULL && strlen(n) >= strlen(suffix) &&
            strcmp(n + strlen(n) - strlen(suffix), suffix) == 0)
            return t;
    }
    return NULL;
}

static void conf_mut_name(void *u, json_t *m)
{
    (void)u;
    json_object_set_new(conf_tensor(m, "layers.0.self_attn.q_proj.weight"), "name",
                        json_string("model.layers.0.self_attn.qq_proj.weight"));
}

static void conf_mut_shape(void *u, json_t *m)
{
    json_t *t = conf_tensor(m, "layers.0.self_attn.q_proj.weight");
    json_t *s = json_object_get(t, "shape");
    json_int_t d0 = json_integer_value(json_array_get(s, 0));
    json_int_t d1 = json_integer_value(json_array_get(s, 1));
    (void)u;
    json_object_set_new(t, "shape", json_pack("[I, I]", d0 / 2, d1 * 2)); /* same bytes */
}

static void conf_mut_dtype(void *u, json_t *m)
{
    (void)u;
    json_object_set_new(conf_tensor(m, "layers.0.mlp.down_proj.weight"), "dtype",
                        json_string("float16")); /* same size, wrong type */
}

static void conf_mut_truncated(void *u, json_t *m)
{
    json_t *t, *last = NULL;
    json_int_t bytes = json_integer_value(json_object_get(json_object_get(m, "buffer"), "bytes"));
    size_t i;
    (void)u;
    json_array_foreach(json_object_get(m, "tensors"), i, t) last = t;
    /* The last tensor starts inside the buffer and runs 100 bytes past its end. */
    json_object_set_new(
        last, "offset",
        json_integer(bytes + 100 - json_integer_value(json_object_get(last, "nbytes"))));
}

static void conf_mut_offset(void *u, json_t *m)
{
    json_t *t = conf_tensor(m, "model.norm.weight");
    json_int_t bytes = json_integer_value(json_object_get(json_object_get(m, "buffer"), "bytes"));
    (void)u;
    json_object_set_new(t, "offset", json_integer(bytes + 4096));
}

/* Apply version 1, then a bad version-2 bucket: the refusal must be the expected one and every
 * engine byte must stay as version 1 left it. */
static void conf_bad_one(conf_t *c, const conf_bad_t *b)
{
    conf_trainer_t t;
    wsync_ref_engine_t e;
    conf_link_t link = {0};
    json_t *msgs = NULL, *v1 = NULL, *msg;
    const char *core = strcmp(c->shim, "sglang") == 0 ? "update_weights_from_tensor"
                       : strcmp(c->shim, "vllm") == 0 ? "update_weights"
                                                      : "update_params";
    uint64_t before, after;
    int seen = 0;
    size_t i;

    if (conf_trainer(c, &t, "dense", 64) != 0)
        return;
    if (conf_engine(c, &e, c->plugin, "dense", 0, 2, NULL) != 0) {
        conf_trainer_close(&t);
        return;
    }
    link.engine = &e;
    /* Version 1, keeping its messages for the replay case. */
    if (conf_tr_fill(&t, 1) != 0 || conf_tr_publish(&t, 0, &v1) != 0) {
        conf_fail(c, "bad/%s: setup failed", b->name);
        goto out;
    }
    json_array_foreach(v1, i, msg) json_decref(conf_deliver(&link, msg));
    if (conf_tr_wait(&t) != 0 || conf_verify(c, &e, 1, "bad: setup sync") != 0)
        goto out;
    before = conf_digest(&e);

    if (!b->replay) {
        t.mutation = b->name;
        if (conf_tr_fill(&t, 2) != 0 || conf_tr_publish(&t, 0, &msgs) != 0) {
            conf_fail(c, "bad/%s: publish failed", b->name);
            goto out;
        }
    } else {
        msgs = json_incref(v1); /* replay: stale generation */
    }
    json_array_foreach(msgs, i, msg)
    {
        json_t *rep = conf_deliver(&link, msg);
        const char *method = json_string_value(json_object_get(msg, "method"));
        if (method != NULL && strcmp(method, core) == 0) {
            const char *text = json_string_value(json_object_get(rep, "message"));
            const char *fmt = json_string_value(json_object_get(msg, "load_format"));
            const int published =
                fmt != NULL && strcmp(fmt, "wsync_manifest") == 0 && b->message_published;
            const wsync_result_t code = published ? b->code_published : b->code;
            const char *needle = published ? b->message_published : b->message;
            seen = 1;
            if (json_is_true(json_object_get(rep, "ok")))
                conf_fail(c, "bad/%s: the engine accepted it", b->name);
            else if (json_integer_value(json_object_get(rep, "code")) != (json_int_t)code ||
                     text == NULL || strstr(text, needle) == NULL)
                conf_fail(c, "bad/%s: expected %s containing \"%s\", got %s: %s", b->name,
                          wsync_strerror(code), needle,
                          json_string_value(json_object_get(rep, "error")), text ? text : "(none)");
            else
                printf("  %s -> %s: %s\n", b->name, wsync_strerror(code), text);
        }
        json_decref(rep);
    }
    after = conf_digest(&e);
    if (!seen)
        conf_fail(c, "bad/%s: no %s message was sent", b->name, core);
    else if (before == 0 || before != after)
        conf_fail(c, "bad/%s: engine parameters changed (digest %016llx -> %016llx)", b->name,
                  (unsigned long long)before, (unsigned long long)after);
    else if (conf_verify(c, &e, 1, b->name) == 0)
        conf_pass(c,
                  "bad/%s: refused with its own error, all %zu engine parameters "
                  "byte-identical (wsync64 %016llx)",
                  b->name, e.layout.n, (unsigned long long)after);
out:
    json_decref(v1);
    json_decref(msgs);
    wsync_ref_engine_close(&e);
    conf_trainer_close(&t);
}

/* A plugin the engine cannot use: the error names the cause, nothing is written, and the
 * engine goes on with its native loader. Returns the engine open (caller closes) or -1. */
static int conf_unusable(conf_t *c, wsync_ref_engine_t *e, const char *what, const char *path,
                         const char *expect, conf_log_t *log)
{
    const char *why = NULL;
    unsigned char *zero;

    memset(log, 0, sizeof(*log));
    if (conf_engine(c, e, path, "dense", 0, 1, log) != 0)
        return -1;
    if (!wsync_driver_native(e->driver, &why)) {
        conf_fail(c, "%s: the engine loaded %s", what, path);
    } else if (strstr(why, expect) == NULL) {
        conf_fail(c, "%s: reason \"%s\" does not say \"%s\"", what, why, expect);
    } else if (strstr(log->text, "falling back to the engine's native loader") == NULL) {
        conf_fail(c, "%s: the fallback was not logged", what);
    } else if ((zero = calloc(1, e->layout.arena_bytes)) != NULL) {
        unsigned char *snap = malloc(e->layout.arena_bytes);
        int same = snap && wsync_ref_engine_snapshot(e, snap) == 0 &&
                   memcmp(snap, zero, e->layout.arena_bytes) == 0;
        free(snap);
        free(zero);
        if (!same)
            conf_fail(c, "%s: engine parameters were written", what);
        else
            return 0;
    }
    wsync_ref_engine_close(e);
    return -1;
}

static void conf_bad(conf_t *c)
{
    static const conf_bad_t cases[] = {
        {"unknown-name", 0, WSYNC_ERR_NOT_FOUND, "unknown tensor", WSYNC_OK, NULL},
        {"wrong-shape", 0, WSYNC_ERR_LAYOUT_MISMATCH, "wrong shape", WSYNC_OK, NULL},
        {"wrong-dtype", 0, WSYNC_ERR_LAYOUT_MISMATCH, "wrong dtype", WSYNC_OK, NULL},
        {"truncated-bucket", 0, WSYNC_ERR_BAD_MANIFEST, "truncated bucket", WSYNC_ERR_OUT_OF_BOUNDS,
         "exceeds buffer bytes"},
        {"offset-past-buffer", 0, WSYNC_ERR_OUT_OF_BOUNDS, "offset past the buffer",
         WSYNC_ERR_OUT_OF_BOUNDS, "exceeds buffer bytes"},
        {"stale-generation", 1, WSYNC_ERR_STALE_GENERATION, "stale generation", WSYNC_OK, NULL},
    };
    char path[4096];
    wsync_ref_engine_t e;
    conf_log_t log;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        conf_bad_one(c, &cases[i]);
    snprintf(path, sizeof(path), "%s/libwsync_fixture_abi2.so", c->fixtures);
    if (conf_unusable(c, &e, "bad/incompatible-abi", path, "no common ABI version", &log) == 0) {
        printf("  incompatible-abi -> %s", log.text);
        conf_pass(c, "bad/incompatible-abi: refused at load with its own error, nothing "
                     "written, native loader selected");
        wsync_ref_engine_close(&e);
    }
}

/* Plugin missing or failing init: the native loader serves, and says so. */
static void conf_fallback(conf_t *c)
{
    static const struct {
        const char *what, *file, *expect;
    } cases[] = {{"fallback/missing", "libwsync_does_not_exist.so", "no such file"},
                 {"fallback/init-fails", "libwsync_fixture_noinit.so", "no usable device"}};
    char path[4096];

    for (size_t i = 0; i < 2; i++) {
        wsync_ref_engine_t e;
        conf_log_t log;
        snprintf(path, sizeof(path), "%s/%s", c->fixtures, cases[i].file);
        if (conf_unusable(c, &e, cases[i].what, path, cases[i].expect, &log) != 0)
            continue;
        if (!c->host_kind) {
            conf_pass(c,
                      "%s: native loader selected and logged (the reference native loader "
                      "reads host_shm only, so no sync with this plugin)",
                      cases[i].what);
        } else {
            conf_trainer_t t;
            conf_link_t link = {.engine = &e};
            if (conf_trainer(c, &t, "dense", 24) == 0) {
                if (conf_tr_sync(&t, &link, 1) != 0)
                    conf_fail(c, "%s: sync through the native loader refused", cases[i].what);
                else if (e.native_loads == 0)
                    conf_fail(c, "%s: the native loader was not used", cases[i].what);
                else if (conf_verify(c, &e, 1, cases[i].what) == 0)
                    conf_pass(c,
                              "%s: logged, %u buckets through the native loader, %zu/%zu "
                              "engine parameters bit-exact",
                              cases[i].what, e.native_loads, e.layout.n, e.layout.n);
                conf_trainer_close(&t);
            }
        }
        wsync_ref_engine_close(&e);
    }
}

/* ----------------------------------------------------------- trainer server */

static const struct {
    const char *name;
    void (*fn)(void *user, json_t *manifest);
} conf_mutations[] = {{"unknown-name", conf_mut_name},
                      {"wrong-shape", conf_mut_shape},
                      {"wrong-dtype", conf_mut_dtype},
                      {"truncated-bucket", conf_mut_truncated},
                      {"offset-past-buffer", conf_mut_offset}};

static json_t *conf_server_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static json_t *conf_server_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return json_pack("{s:b, s:s}", "ok", 0, "message", msg);
}

static json_t *conf_server_do(wsync_ref_trainer_t *t, int *open, json_t *req)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    const char *cmd = json_string_value(json_object_get(req, "cmd"));
    json_t *msgs = NULL;
    char why[256];

    if (cmd == NULL)
        return conf_server_error("no cmd");
    if (strcmp(cmd, "open") == 0) {
        wsync_ref_trainer_config_t cfg = {
            .engine = json_string_value(json_object_get(req, "shim")),
            .plugin = json_string_value(json_object_get(req, "plugin")),
            .model = conf_model(json_string_value(json_object_get(req, "layout"))),
            .ranks = 1,
            .bucket_bytes = (uint64_t)json_integer_value(json_object_get(req, "bucket_mb")) << 20,
            .timeout_ms = 20000};
        if (*open || cfg.model.layout == NULL ||
            wsync_ref_trainer_open(t, &cfg, why, sizeof(why)) != 0)
            return conf_server_error("open: %s", *open ? "already open" : why);
        *open = 1;
        return json_pack("{s:b, s:I, s:I}", "ok", 1, "buckets", (json_int_t)t->nbuckets, "tensors",
                         (json_int_t)t->model.n);
    }
    if (!*open)
        return conf_server_error("%s before open", cmd);
    if (strcmp(cmd, "fill") == 0) {
        if (wsync_ref_trainer_fill(t, (uint64_t)json_integer_value(json_object_get(req, "version")),
                                   &err) != WSYNC_OK)
            return conf_server_error("fill: %s", err.message);
    } else if (strcmp(cmd, "publish") == 0) {
        const char *mutation = json_string_value(json_object_get(req, "mutation"));
        size_t b = (size_t)json_integer_value(json_object_get(req, "bucket"));
        t->mutate = NULL;
        for (size_t i = 0;
             mutation != NULL && i < sizeof(conf_mutations) / sizeof(conf_mutations[0]); i++)
            if (strcmp(conf_mutations[i].name, mutation) == 0)
                t->mutate = conf_mutations[i].fn;
        if (mutation != NULL && t->mutate == NULL)
            return conf_server_error("unknown mutation %s", mutation);
        t->cfg.packed = json_is_true(json_object_get(req, "packed"));
        if (b >= t->nbuckets || wsync_ref_trainer_publish(t, b, &msgs, &err) != WSYNC_OK)
            return conf_server_error("publish bucket %zu: %s", b, err.message);
        return json_pack("{s:b, s:o}", "ok", 1, "msgs", msgs);
    } else if (strcmp(cmd, "wait") == 0) {
        if (wsync_ref_trainer_wait(t, &err) != WSYNC_OK)
            return conf_server_error("wait_consumed: %s", err.message);
    } else if (strcmp(cmd, "new_peer") == 0) {
        wsync_ref_trainer_new_peer(t);
    } else if (strcmp(cmd, "close") != 0) {
        return conf_server_error("unknown cmd %s", cmd);
    }
    return json_pack("{s:b}", "ok", 1);
}

/* The trainer process: serve commands until "close" or the parent leaves. */
static int conf_trainer_server(int fd)
{
    wsync_ref_trainer_t t;
    int open = 0, done = 0;

    memset(&t, 0, sizeof(t));
    while (!done) {
        wsync_error_t err = {.struct_size = sizeof(err)};
        char *text = NULL, *out;
        size_t len;
        json_t *req, *rep;
        if (wsync_wire_recv(fd, &text, &len, -1, &err) != WSYNC_OK)
            break;
        req = json_loads(text, 0, NULL);
        free(text);
        rep = conf_server_do(&t, &open, req);
        done = strcmp(json_string_value(json_object_get(req, "cmd"))
                          ? json_string_value(json_object_get(req, "cmd"))
                          : "",
                      "close") == 0;
        out = json_dumps(rep, JSON_COMPACT);
        json_decref(rep);
        json_decref(req);
        if (out == NULL || wsync_wire_send(fd, out, strlen(out), &err) != WSYNC_OK)
            done = 1;
        free(out);
    }
    if (open)
        wsync_ref_trainer_close(&t);
    close(fd);
    return 0;
}

/* ----------------------------------------------------------- main */

static int conf_probe(conf_t *c)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_loader_t l;
    wsync_result_t rc = wsync_loader_open(&l, c->plugin, NULL, &err);

    if (rc == WSYNC_ERR_NO_DEVICE) {
        printf("SKIPPED: plugin %s cannot run here: %s\n", c->plugin, err.message);
        return CONF_SKIP;
    }
    if (rc != WSYNC_OK) {
        printf("FAIL: plugin under test %s does not load: %s\n", c->plugin, err.message);
        return 1;
    }
    c->host_kind = strcmp(l.plugin->name, "cpu") == 0;
    printf("conformance: shim %s, plugin %s %s (%s)\n", c->shim, l.plugin->name, l.plugin->version,
           l.path);
    wsync_loader_close(&l);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"shim", required_argument, 0, 's'},
                                         {"plugin", required_argument, 0, 'p'},
                                         {"case", required_argument, 0, 'c'},
                                         {"fixtures", required_argument, 0, 'f'},
                                         {0, 0, 0, 0}};
    static const struct {
        const char *name;
        void (*run)(conf_t *);
    } cases[] = {{"bitexact", conf_bitexact}, {"reuse", conf_reuse},       {"torn", conf_torn},
                 {"bad", conf_bad},           {"fallback", conf_fallback}, {"lora", conf_lora}};
    conf_t c = {.fixtures = "."};
    int o, rc, ran = 0;

    if (argc == 3 && strcmp(argv[1], "--trainer-server") == 0)
        return conf_trainer_server(atoi(argv[2]));

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 's':
            c.shim = optarg;
            break;
        case 'p':
            c.plugin = optarg;
            break;
        case 'c':
            c.only = optarg;
            break;
        case 'f':
            c.fixtures = optarg;
            break;
        default:
            goto usage;
        }
    }
    if (c.shim == NULL || c.plugin == NULL || wsync_shim_find(c.shim) == NULL)
        goto usage;
    setenv("WSYNC_PLUGIN", "", 1); /* the engine uses exactly the path each case names */
    rc = conf_probe(&c);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (c.only != NULL && strcmp(c.only, cases[i].name) != 0)
            continue;
        cases[i].run(&c);
        ran++;
    }
    if (ran == 0) {
        printf("FAIL: no case named \"%s\"\n", c.only);
        return 1;
    }
    printf("%s: conformance of shim %s with %s\n", c.failed ? "FAILED" : "PASSED", c.shim,
           c.plugin);
    return c.failed ? 1 : 0;
usage:
    fprintf(stderr, "usage: wsync_conformance --shim sglang|vllm|lmdeploy --plugin PATH "
                    "[--case bitexact|reuse|torn|bad|fallback|lora] [--fixtures DIR]\n");
    return 2;
}
