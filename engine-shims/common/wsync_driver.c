/* The request driver. Contract in wsync_driver.h. */
#include "wsync_driver_impl.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wsync_digest.h"
#include "wsync_error.h"
#include "wsync_fp8.h"
#include "wsync_client.h"
#include "wsync_loader.h"
#include "wsync_manifest.h"
#include "wsync_shm_sweep.h"
#include "wsync_txn.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

void wsync_driver_log(wsync_driver_t *d, wsync_log_level_t level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    if (d == NULL || d->cfg.log == NULL || level > d->cfg.log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    d->cfg.log(d->cfg.log_user, level, __FILE__, __LINE__, "%s", msg);
}

/* WSYNC_DRIVER_TIMING=1: each request's host time by phase on stderr (docs/PERFORMANCE.md). */
int wsync_driver_timing(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("WSYNC_DRIVER_TIMING");
        on = v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
    }
    return on;
}

double wsync_driver_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void wsync_driver_fall_back(wsync_driver_t *d, const char *step, const wsync_error_t *e)
{
    snprintf(d->native_why, sizeof(d->native_why), "%s: %s: %s", step, wsync_strerror(e->code),
             e->message);
    wsync_driver_log(d, WSYNC_LOG_WARN,
                     "wsync: plugin unusable (%s); falling back to the engine's native loader",
                     d->native_why);
}

wsync_result_t wsync_driver_open(const wsync_driver_config_t *cfg, wsync_driver_t **out,
                                 wsync_error_t *err)
{
    wsync_error_t lerr = {.struct_size = sizeof(lerr)};
    wsync_driver_t *d;

    if (cfg == NULL || out == NULL || cfg->engine == NULL || cfg->map == NULL ||
        cfg->engine->param == NULL || cfg->engine->tp == NULL || cfg->engine->dims == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "driver config needs engine ops with param, tp and dims, and a "
                            "mapping table");
    d = calloc(1, sizeof(*d));
    if (d != NULL)
        d->producer_fd = -1;
    if (d == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: out of memory");
    d->cfg = *cfg;
    d->host = (wsync_host_t){.struct_size = sizeof(wsync_host_t),
                             .log = cfg->log,
                             .log_user = cfg->log_user,
                             .log_level = cfg->log_level};

    if (wsync_loader_open(&d->loader, cfg->plugin_path, &d->host, &lerr) != WSYNC_OK) {
        wsync_driver_fall_back(d, "load", &lerr);
    } else {
        const wsync_consumer_ops_t *ops = d->loader.plugin->consumer;
        wsync_consumer_config_t cc = {.struct_size = sizeof(cc),
                                      .device_ordinal = cfg->device_ordinal,
                                      .timeout_ms = cfg->timeout_ms,
                                      .max_manifest_bytes = cfg->max_manifest_bytes,
                                      .max_manifest_tensors = cfg->max_manifest_tensors};
        if (!WSYNC_HAS_OP(wsync_consumer_ops_t, ops, create) ||
            !WSYNC_HAS_OP(wsync_consumer_ops_t, ops, parse_manifest) ||
            !WSYNC_HAS_OP(wsync_consumer_ops_t, ops, open_handle) ||
            !WSYNC_HAS_OP(wsync_consumer_ops_t, ops, copy_weights) ||
            !WSYNC_HAS_OP(wsync_consumer_ops_t, ops, record_consumed)) {
            wsync_error_record(&lerr, WSYNC_ERR_INCOMPATIBLE, "open",
                               "%s lacks a consumer member the shims need", d->loader.path);
            wsync_driver_fall_back(d, "consumer table", &lerr);
            wsync_loader_close(&d->loader);
        } else if (ops->create(&cc, &d->consumer, &lerr) != WSYNC_OK) {
            wsync_driver_fall_back(d, "consumer create", &lerr);
            wsync_loader_close(&d->loader);
        } else {
            d->ops = ops;
        }
    }
    *out = d;
    return WSYNC_OK;
}

uint64_t wsync_driver_max_manifest_bytes(const wsync_driver_t *d)
{
    return d->cfg.max_manifest_bytes != 0 ? d->cfg.max_manifest_bytes
                                          : WSYNC_MANIFEST_DEFAULT_MAX_BYTES;
}

uint64_t wsync_driver_opens(const wsync_driver_t *d)
{
    return d->opens;
}

int wsync_driver_native(const wsync_driver_t *d, const char **why)
{
    if (why != NULL)
        *why = d->ops == NULL ? d->native_why : NULL;
    return d->ops == NULL;
}

const wsync_plugin_t *wsync_driver_plugin(const wsync_driver_t *d)
{
    return d->ops != NULL ? d->loader.plugin : NULL;
}

struct wsync_consumer *wsync_driver_consumer(const wsync_driver_t *d)
{
    return d->consumer;
}

wsync_stream_t wsync_driver_stream(const wsync_driver_t *d)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    return WSYNC_HAS_FIELD(wsync_engine_ops_t, e, stream) && e->stream != NULL ? e->stream(e->user)
                                                                               : NULL;
}

int wsync_driver_same_buffer(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return a->kind == b->kind && a->handle_len == b->handle_len &&
           memcmp(a->handle, b->handle, a->handle_len) == 0 && a->pid == b->pid &&
           strncmp(a->device, b->device, sizeof(a->device)) == 0;
}

wsync_driver_buffer_t *wsync_driver_find(wsync_driver_t *d, const wsync_buffer_desc_t *b)
{
    for (size_t i = 0; i < d->n_buffers; i++)
        if (wsync_driver_same_buffer(&d->buffers[i].key, b))
            return &d->buffers[i];
    return NULL;
}

/* Printable buffer name for messages: the shm name, or the first handle bytes in hex. */
void wsync_driver_buffer_name(const wsync_buffer_desc_t *b, char *buf, size_t len)
{
    if (b->kind == WSYNC_BUFFER_HOST_SHM) {
        size_t i;
        for (i = 0; i < b->handle_len && i + 1 < len; i++)
            buf[i] = b->handle[i] >= 0x20 && b->handle[i] < 0x7f ? (char)b->handle[i] : '?';
        buf[i] = '\0';
        return;
    }
    size_t off = (size_t)snprintf(buf, len, "ipc:");
    for (uint32_t i = 0; i < b->handle_len && i < 8 && off + 3 < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%02x", b->handle[i]);
}

wsync_result_t wsync_driver_parse(wsync_driver_t *d, const char *json, size_t len,
                                  const wsync_manifest_t **out, wsync_error_t *err)
{
    if (d->ops != NULL)
        return d->ops->parse_manifest(d->consumer, json, len, out, err);
    wsync_manifest_owned_t *m = NULL;
    wsync_result_t rc = wsync_manifest_parse(json, len, &m, err);
    *out = rc == WSYNC_OK ? &m->view : NULL;
    return rc;
}

/* The bucket of a manifest the plugin refused, so it can be given back unread: the same text
 * without its tensors (and direct-mode segments), parsed by the plugin, which names the buffer
 * and generation as the trainer published them. NULL when even that is refused (the text is not
 * a manifest: the trainer did not publish it, and waits for nothing). */
static const wsync_manifest_t *wsync_driver_parse_bucket(wsync_driver_t *d, const char *json,
                                                         size_t len)
{
    json_t *root = json_loadb(json, len, 0, NULL);
    const wsync_manifest_t *m = NULL;
    if (json_is_object(root) && json_object_set_new(root, "tensors", json_array()) == 0) {
        json_object_del(root, "segments");
        json_object_del(root, "digests");
        char *text = json_dumps(root, JSON_COMPACT);
        wsync_error_t quiet = {.struct_size = sizeof(quiet)};
        if (text != NULL && wsync_driver_parse(d, text, strlen(text), &m, &quiet) != WSYNC_OK)
            m = NULL;
        free(text);
    }
    json_decref(root);
    return m;
}

void wsync_driver_free_manifest(wsync_driver_t *d, const wsync_manifest_t *m)
{
    if (m == NULL)
        return;
    if (d->ops != NULL)
        d->ops->manifest_free(d->consumer, m);
    else
        wsync_manifest_free(wsync_manifest_owned_from_view(m));
}

/* A copy failure of one op (wsync_error_t.op, set by the plugin): name that op's tensor too. */
static void wsync_driver_name_op(const wsync_manifest_t *m, wsync_error_t *err)
{
    uint64_t i;
    if (!wsync_error_op(err, &i) || i >= m->n_tensors)
        return;
    char text[sizeof(err->message) + 160];
    snprintf(text, sizeof(text), "tensor \"%.120s\": %s", m->tensors[i].name, err->message);
    text[sizeof(err->message) - 1] = '\0'; /* cut to the message's size */
    memcpy(err->message, text, sizeof(err->message));
}

/* Step 2 of apply: everything checked, nothing written. ops[k] is the plan of tensor k in
 * manifest order. */
static wsync_result_t wsync_driver_validate(wsync_driver_t *d, const wsync_manifest_t *const *m,
                                            const wsync_plan_t *const *plans, size_t n,
                                            wsync_copy_op_t *ops, wsync_quant_t *quant,
                                            uint8_t *live, uint8_t *skip, wsync_error_t *err)
{
    char bname[64];
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        wsync_driver_buffer_t *known = wsync_driver_find(d, &m[i]->buffer);
        for (size_t j = 0; j < i; j++)
            if (wsync_driver_same_buffer(&m[j]->buffer, &m[i]->buffer)) {
                wsync_driver_buffer_name(&m[i]->buffer, bname, sizeof(bname));
                return WSYNC_RECORD(err, WSYNC_ERR_BAD_MANIFEST,
                                    "buckets %zu and %zu of one request name the same buffer "
                                    "%s; send one bucket per buffer per request",
                                    j, i, bname);
            }
        int replay;
        const char *plan = wsync_driver_plan_of(m[i], &replay);
        if (known != NULL && plan != NULL && !replay &&
            m[i]->generation == known->last_generation && strcmp(known->last_plan, plan) == 0) {
            /* the bucket sent again in full after another rank did not know its plan: this
             * rank took it already (by replay), and takes it once */
            skip[i] = 1;
            k += m[i]->n_tensors;
            continue;
        }
        if (known != NULL && m[i]->generation <= known->last_generation) {
            wsync_driver_buffer_name(&m[i]->buffer, bname, sizeof(bname));
            return WSYNC_RECORD(err, WSYNC_ERR_STALE_GENERATION,
                                "stale generation %" PRIu64 " for buffer %s: this engine "
                                "already consumed generation %" PRIu64
                                " from it; publish a newer bucket",
                                m[i]->generation, bname, known->last_generation);
        }
        if (plans[i] != NULL) { /* a replay: the plan's ops, checked when it was recorded */
            memcpy(ops + k, plans[i]->ops, plans[i]->n * sizeof(*ops));
            if (plans[i]->quant != NULL)
                memcpy(quant + k, plans[i]->quant, plans[i]->n * sizeof(*quant));
            live[i] = (uint8_t)plans[i]->live;
            k += plans[i]->n;
            continue;
        }
        const size_t k0 = k;
        uint64_t *want = calloc(m[i]->n_tensors ? m[i]->n_tensors : 1, sizeof(*want));
        int tensor_scales = 0;
        if (want == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu tensors",
                                m[i]->n_tensors);
        for (size_t t = 0; t < m[i]->n_tensors; t++, k++) {
            wsync_result_t rc = wsync_map_plan_quant(d->cfg.map, d->cfg.engine, &m[i]->tensors[t],
                                                     &ops[k], &quant[k], &want[t], err);
            if (rc == WSYNC_OK && quant[k].kind != WSYNC_QUANT_NONE)
                rc = wsync_driver_can_quantize(d, m[i], m[i]->tensors[t].name, err);
            if (rc != WSYNC_OK) {
                free(want);
                return rc;
            }
            tensor_scales |= quant[k].kind == WSYNC_QUANT_FP8_TENSOR;
            /* dst_extent counts from dst: the same inside the shadow */
            if (live != NULL && (d->n_shadows == 0 || wsync_driver_redirect(d, &ops[k])))
                live[i] = 1;
            const wsync_copy_op_t *op = &ops[k];
            uint64_t last = op->src_offset + (op->rows - 1) * op->src_pitch + op->row_bytes;
            const uint64_t cap = m[i]->n_segments > 0
                                     ? m[i]->segments[m[i]->tensor_segment[t]].bytes
                                     : m[i]->buffer.bytes;
            if (op->row_bytes > 0 && last > cap) {
                free(want);
                return WSYNC_RECORD(
                    err, WSYNC_ERR_OUT_OF_BOUNDS,
                    "tensor \"%s\" reads up to byte %" PRIu64 " of a %" PRIu64 "-byte %s",
                    m[i]->tensors[t].name, last, cap, m[i]->n_segments > 0 ? "segment" : "buffer");
            }
        }
        wsync_result_t rc =
            tensor_scales ? wsync_driver_check_tensor_scales(m[i], ops + k0, quant + k0, want, err)
                          : WSYNC_OK;
        free(want);
        if (rc != WSYNC_OK)
            return rc;
    }
    return WSYNC_OK;
}

wsync_driver_buffer_t *wsync_driver_remember(wsync_driver_t *d, const wsync_buffer_desc_t *b)
{
    wsync_driver_buffer_t *e = wsync_driver_find(d, b);
    if (e != NULL)
        return e;
    if (d->n_buffers == d->cap_buffers) {
        size_t cap = d->cap_buffers ? d->cap_buffers * 2 : 8;
        void *p = realloc(d->buffers, cap * sizeof(*d->buffers));
        if (p == NULL)
            return NULL;
        d->buffers = p;
        d->cap_buffers = cap;
    }
    e = &d->buffers[d->n_buffers++];
    memset(e, 0, sizeof(*e));
    e->key = *b;
    return e;
}

/* Step 3 of apply, one bucket. */
static void wsync_driver_release_unread(wsync_driver_t *d, const wsync_manifest_t *const *m,
                                        size_t n);

/* *wrote: the bucket failed after its copy wrote engine parameters (a digest mismatch; a NaN the
 * one-pass quantizer found, which left only its block unwritten). *t_copied (WSYNC_DRIVER_TIMING,
 * else untouched): when the plugin's copy call returned, in us. */
static wsync_result_t wsync_driver_execute(wsync_driver_t *d, const wsync_manifest_t *m,
                                           const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                           int *wrote, double *t_copied, wsync_error_t *err)
{
    const uint32_t plain_flags = d->cfg.copy_flags & ~WSYNC_COPY_QUANT_ONE_PASS;
    *wrote = 0;
    int quantizes = 0;
    for (size_t i = 0; i < m->n_tensors && !quantizes; i++)
        quantizes = quant[i].kind != WSYNC_QUANT_NONE;
    wsync_driver_buffer_t *e = wsync_driver_remember(d, &m->buffer);
    wsync_result_t rc;

    if (e == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: out of memory");
    if (d->ops == NULL) {
        const wsync_engine_ops_t *eng = d->cfg.engine;
        if (!WSYNC_HAS_FIELD(wsync_engine_ops_t, eng, native_copy) || eng->native_copy == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                                "no plugin (%s) and the engine gave no native loader",
                                d->native_why);
        if (m->n_segments > 0)
            return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                                "a direct bucket needs the plugin; none is loaded (%s)",
                                d->native_why);
        rc = eng->native_copy(eng->user, &m->buffer, m->generation, ops, m->n_tensors, err);
    } else {
        if (e->handle == NULL) {
            rc = d->ops->open_handle(d->consumer, &m->buffer, &e->handle, err);
            d->opens++;
            if (rc != WSYNC_OK)
                return rc;
        }
        if (m->n_segments > 0)
            rc = wsync_driver_copy_direct(d, e, m, ops, err);
        else if (quantizes) /* checked: the plugin has it */
            rc = d->ops->copy_quantized(d->consumer, e->handle, wsync_driver_stream(d),
                                        m->generation, ops, quant, m->n_tensors, d->cfg.copy_flags,
                                        err);
        else
            rc = d->ops->copy_weights(d->consumer, e->handle, wsync_driver_stream(d), m->generation,
                                      ops, m->n_tensors, plain_flags, err);
        const int refused = rc != WSYNC_OK; /* the copy call itself: it read nothing */
        if (wsync_driver_timing())
            *t_copied = wsync_driver_us();
        if (rc == WSYNC_OK)
            rc = d->ops->record_consumed(d->consumer, e->handle,
                                         (d->cfg.copy_flags & WSYNC_COPY_VERIFY) != 0 || quantizes,
                                         err);
        *wrote = !refused && (rc == WSYNC_ERR_DIGEST_MISMATCH ||
                              (rc == WSYNC_ERR_INVALID_ARGUMENT && quantizes &&
                               (d->cfg.copy_flags & WSYNC_COPY_QUANT_ONE_PASS)));
        if (rc == WSYNC_ERR_DIGEST_MISMATCH && !quantizes)
            wsync_driver_name_op(m, err);
        if (rc != WSYNC_OK && quantizes) {
            wsync_driver_name_op(m, err);
            if (refused) /* e.g. a NaN found before any write: the trainer may reuse the buffer */
                wsync_driver_release_unread(d, &m, 1);
        }
    }
    if (rc == WSYNC_OK)
        e->last_generation = m->generation;
    return rc;
}

/* A request refused by validation read none of its buffers: give each parsed manifest's
 * generation back as consumed (an empty copy_weights, which waits for *ready*, then
 * record_consumed), so the trainer may reuse that buffer instead of waiting for a *consumed*
 * that would never come. A replay (not newer than the last generation taken) is left alone.
 * Best effort: the request's own error is what the caller sees. */
static void wsync_driver_release_unread(wsync_driver_t *d, const wsync_manifest_t *const *m,
                                        size_t n)
{
    for (size_t i = 0; d->ops != NULL && i < n; i++) {
        if (m[i] == NULL)
            continue;
        wsync_driver_buffer_t *e = wsync_driver_remember(d, &m[i]->buffer);
        if (e == NULL || m[i]->generation <= e->last_generation)
            continue;
        wsync_error_t local = {.struct_size = sizeof(local)};
        wsync_result_t rc = WSYNC_OK;
        if (e->handle == NULL)
            rc = d->ops->open_handle(d->consumer, &m[i]->buffer, &e->handle, &local);
        if (rc == WSYNC_OK)
            rc = d->ops->copy_weights(d->consumer, e->handle, wsync_driver_stream(d),
                                      m[i]->generation, NULL, 0, 0, &local);
        if (rc == WSYNC_OK)
            rc = d->ops->record_consumed(d->consumer, e->handle, 0, &local);
        if (rc == WSYNC_OK)
            e->last_generation = m[i]->generation;
        wsync_driver_log(d, rc == WSYNC_OK ? WSYNC_LOG_INFO : WSYNC_LOG_WARN,
                         "wsync: generation %llu of a refused request given back unread: %s%s%s",
                         (unsigned long long)m[i]->generation, wsync_strerror(rc),
                         rc == WSYNC_OK ? "" : ": ", rc == WSYNC_OK ? "" : local.message);
    }
}

void wsync_driver_refuse(wsync_driver_t *d, wsync_result_t rc, const char *message)
{
    d->refusal = rc;
    snprintf(d->refusal_msg, sizeof(d->refusal_msg), "%s", message != NULL ? message : "");
}

/* The arrays of one apply: per manifest its parse, the view its steps read (the manifest, or a
 * replay with its plan's tensors), the plan it replays, and two flags. */
typedef struct wsync_apply {
    const wsync_manifest_t **m;
    const wsync_manifest_t **mv;
    wsync_manifest_t *views;
    const wsync_plan_t **plans;
    uint8_t *live; /* writes a parameter outside every shadow */
    uint8_t *skip; /* taken already (a bucket sent again in full, wsync_driver_validate) */
} wsync_apply_t;

static void wsync_apply_free(wsync_driver_t *d, wsync_apply_t *a, size_t n)
{
    for (size_t i = 0; a->m != NULL && i < n; i++)
        wsync_driver_free_manifest(d, a->m[i]);
    free(a->m);
    free(a->mv);
    free(a->views);
    free(a->plans);
    free(a->live);
    free(a->skip);
}

wsync_result_t wsync_driver_apply(wsync_driver_t *d, const char *const *manifests,
                                  const size_t *lens, size_t n, uint64_t *generation,
                                  wsync_error_t *err)
{
    wsync_copy_op_t *ops = NULL;
    wsync_quant_t *quant = NULL; /* per op: how it quantizes (fp8 parameters) */
    size_t total = 0, k = 0;
    uint64_t gen = 0;
    wsync_result_t rc = WSYNC_OK;

    if (d == NULL || (n > 0 && (manifests == NULL || lens == NULL)))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "apply: NULL driver or manifests");
    const size_t n1 = n ? n : 1;
    wsync_apply_t a = {calloc(n1, sizeof(*a.m)),
                       calloc(n1, sizeof(*a.mv)),
                       calloc(n1, sizeof(*a.views)),
                       calloc(n1, sizeof(*a.plans)),
                       calloc(n1, 1),
                       calloc(n1, 1)};
    if (a.m == NULL || a.mv == NULL || a.views == NULL || a.plans == NULL || a.live == NULL ||
        a.skip == NULL) {
        wsync_apply_free(d, &a, 0);
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "apply: out of memory");
    }
    const wsync_manifest_t **m = a.m, **mv = a.mv;
    const int timing = wsync_driver_timing();
    double t_parsed = 0, t_checked = 0, t_copy = 0, t_record = 0;
    const double t0 = timing ? wsync_driver_us() : 0;
    int unknown_plan = 0; /* a replay's plan is not here: its bucket stays unconsumed */
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++) {
        rc = wsync_driver_parse(d, manifests[i], lens[i], &m[i], err);
        int replay = 0;
        if (rc == WSYNC_OK && wsync_driver_plan_of(m[i], &replay) != NULL && replay) {
            rc = wsync_driver_plan_find(d, m[i], &a.views[i], &a.plans[i], err);
            unknown_plan = rc == WSYNC_ERR_UNKNOWN_PLAN;
        }
        if (rc == WSYNC_OK) {
            mv[i] = a.plans[i] != NULL ? &a.views[i] : m[i];
            total += mv[i]->n_tensors;
        }
    }
    if (rc == WSYNC_OK && d->refusal != WSYNC_OK) /* the request's own fields were refused */
        rc = WSYNC_RECORD(err, d->refusal, "%s", d->refusal_msg);
    d->refusal = WSYNC_OK;
    if (rc != WSYNC_OK && !unknown_plan) { /* a refusal at parse: every bucket goes back unread */
        for (size_t i = 0; i < n; i++)
            if (m[i] == NULL)
                m[i] = wsync_driver_parse_bucket(d, manifests[i], lens[i]);
        wsync_driver_release_unread(d, m, n);
    }
    if (rc == WSYNC_OK) {
        ops = calloc(total ? total : 1, sizeof(*ops));
        quant = calloc(total ? total : 1, sizeof(*quant));
        if (ops == NULL || quant == NULL)
            rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "apply: %zu ops", total);
    }
    if (rc == WSYNC_OK) {
        rc = wsync_driver_validate(d, mv, a.plans, n, ops, quant, a.live, a.skip, err);
        for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
            if (!a.skip[i])
                rc = wsync_txn_check(&d->txn, mv[i]->tensors, mv[i]->n_tensors, err);
        if (rc != WSYNC_OK)
            wsync_driver_release_unread(d, m, n);
    }
    if (timing)
        t_parsed = t0, t_checked = wsync_driver_us();
    size_t taking = 0; /* ops of buckets not taken already */
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
        taking += a.skip[i] ? 0 : mv[i]->n_tensors;
    if (rc == WSYNC_OK && d->txn.phase != WSYNC_TXN_UPDATING && taking > 0) {
        wsync_txn_begin_implicit(&d->txn); /* an engine request outside wsync_begin */
        wsync_driver_hook_begin(d, d->txn.version);
    }
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++) {
        int wrote = 0;
        const double t_exec = timing ? wsync_driver_us() : 0;
        double t_copied = 0;
        if (!a.skip[i])
            rc = wsync_driver_execute(d, mv[i], ops + k, quant + k, &wrote, &t_copied, err);
        if (t_copied > 0) {
            const double t_end = wsync_driver_us();
            t_copy += t_copied - t_exec, t_record += t_end - t_copied;
        }
        if (rc == WSYNC_OK && !a.skip[i]) {
            wsync_txn_applied(&d->txn, mv[i]->tensors, mv[i]->n_tensors, a.live[i],
                              mv[i]->buffer.pid);
            wsync_driver_watch(d);
            int replay;
            const char *plan = wsync_driver_plan_of(m[i], &replay);
            wsync_driver_buffer_t *e = wsync_driver_find(d, &m[i]->buffer);
            if (e != NULL)
                snprintf(e->last_plan, sizeof(e->last_plan), "%s", plan != NULL ? plan : "");
            if (plan != NULL && !replay)
                wsync_driver_plan_record(d, m[i], ops + k, quant + k, a.live[i]);
        } else if (rc != WSYNC_OK && wrote && a.live[i]) {
            wsync_txn_wrote(&d->txn);
        }
        k += mv[i]->n_tensors;
        if (m[i]->generation > gen)
            gen = m[i]->generation;
    }
    if (rc == WSYNC_OK && generation != NULL)
        *generation = gen;
    if (timing)
        fprintf(stderr,
                "wsync driver: %zu manifest(s), %zu ops: parse and plan %.0f us, copy call %.0f "
                "us, record_consumed %.0f us, total %.0f us\n",
                n, total, t_checked - t_parsed, t_copy, t_record, wsync_driver_us() - t0);
    if (rc != WSYNC_OK)
        wsync_driver_log(d, WSYNC_LOG_ERROR, "wsync: request refused: %s: %s", wsync_strerror(rc),
                         err != NULL ? err->message : "");
    wsync_apply_free(d, &a, n);
    free(ops);
    free(quant);
    return rc;
}

wsync_result_t wsync_driver_check_tensors(wsync_driver_t *d, const wsync_tensor_desc_t *t, size_t n,
                                          json_t **out, wsync_error_t *err)
{
    *out = NULL;
    if (d->ops == NULL || !WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, digest_regions))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "the weight checker needs a plugin with digest_regions (%s)",
                            d->ops == NULL ? d->native_why : d->loader.path);
    wsync_copy_op_t *ops = calloc(n ? n : 1, sizeof(*ops));
    uint64_t *digest = calloc(n ? n : 1, sizeof(*digest));
    wsync_result_t rc =
        ops && digest ? WSYNC_OK : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "check: %zu", n);
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
        rc = wsync_map_plan(d->cfg.map, d->cfg.engine, &t[i], &ops[i], err);
    if (rc == WSYNC_OK)
        rc = d->ops->digest_regions(d->consumer, wsync_driver_stream(d), ops, n, digest, err);
    json_t *list = rc == WSYNC_OK ? json_array() : NULL;
    for (size_t i = 0; list != NULL && i < n; i++) {
        char text[32];
        wsync64_format(digest[i], text);
        json_array_append_new(
            list,
            json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "name", t[i].name, "digest", text, "offset",
                      (json_int_t)ops[i].src_offset, "rows", (json_int_t)ops[i].rows, "row_bytes",
                      (json_int_t)ops[i].row_bytes, "pitch",
                      (json_int_t)(ops[i].rows > 1 ? ops[i].src_pitch : ops[i].row_bytes)));
    }
    free(ops);
    free(digest);
    *out = list;
    return rc;
}

wsync_result_t wsync_driver_drain(wsync_driver_t *d, wsync_error_t *err)
{
    if (d->ops == NULL)
        return WSYNC_OK; /* native copies are blocking */
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, stream_synchronize))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED, "plugin %s has no stream_synchronize",
                            d->loader.path);
    return d->ops->stream_synchronize(d->consumer, wsync_driver_stream(d), err);
}

wsync_result_t wsync_driver_release(wsync_driver_t *d, wsync_error_t *err)
{
    wsync_result_t rc = wsync_driver_drain(d, err);
    wsync_driver_plans_clear(d); /* the mappings they replay into go */
    for (size_t i = 0; i < d->n_buffers; i++) {
        wsync_driver_close_segments(d, &d->buffers[i]);
        d->buffers[i].last_plan[0] = '\0';
        if (d->buffers[i].handle != NULL && d->ops != NULL) {
            wsync_result_t r = d->ops->close_handle(d->consumer, d->buffers[i].handle, err);
            if (rc == WSYNC_OK)
                rc = r;
        }
        d->buffers[i].handle = NULL; /* generations stay remembered: replays are still refused */
    }
    return rc;
}

void wsync_driver_flush_cache(wsync_driver_t *d)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, flush_cache) && e->flush_cache != NULL)
        e->flush_cache(e->user);
}

void wsync_driver_post_load(wsync_driver_t *d)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, post_load) && e->post_load != NULL)
        e->post_load(e->user);
}

void wsync_driver_close(wsync_driver_t *d)
{
    if (d == NULL)
        return;
    if (d->ops != NULL) {
        wsync_driver_release(d, NULL);
        d->ops->finalize(d->consumer, NULL);
    }
    wsync_loader_close(&d->loader);
    wsync_txn_free(&d->txn);
    wsync_driver_plans_clear(d);
    if (d->producer_fd >= 0)
        close(d->producer_fd);
    free(d->shadows);
    free(d->buffers);
    free(d);
}
