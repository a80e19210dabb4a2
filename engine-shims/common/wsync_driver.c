/* The request driver. Contract in wsync_driver.h. */
#include "wsync_driver.h"

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

/* One producer buffer this engine has consumed from. */
typedef struct wsync_driver_buffer {
    wsync_buffer_desc_t key;
    struct wsync_handle *handle; /* NULL in native mode */
    uint64_t last_generation;
    /* Direct mode: the segments its manifests named, held open so each stays mapped across
     * syncs (0 opens in the steady state); one that a whole weight version no longer names is
     * closed after its last bucket. */
    wsync_buffer_desc_t *seg_keys;
    struct wsync_handle **segs;
    uint64_t *seg_epoch; /* the weight version (counted by finished buckets) that last named it */
    size_t n_segs, cap_segs;
    uint64_t epoch;
} wsync_driver_buffer_t;

struct wsync_driver {
    wsync_driver_config_t cfg;
    wsync_host_t host;
    wsync_loader_t loader;
    const wsync_consumer_ops_t *ops; /* NULL: native fallback */
    struct wsync_consumer *consumer;
    char native_why[WSYNC_ERROR_MESSAGE_LEN + 64];
    wsync_driver_buffer_t *buffers;
    size_t n_buffers, cap_buffers;
    uint64_t opens; /* open_handle calls: buffers and segments mapped (or found cached) */
    wsync_txn_t txn;
    wsync_shadow_t *shadows; /* rollback mode, sorted by param */
    size_t n_shadows;
    /* A refusal the shim found in the request's own fields (wsync_driver_refuse): the next
     * apply gives its buckets back unread and returns it. */
    wsync_result_t refusal;
    char refusal_msg[WSYNC_ERROR_MESSAGE_LEN];
    /* The open version's producer, held as a pidfd from when its pid was first seen: it reads
     * as ended once that process exits (a zombie included), and a later process given the same
     * pid is another one. -1: none (or pidfd_open unavailable: then kill(pid, 0) decides). */
    int producer_fd;
    int64_t producer_fd_pid;
};

static int wsync_shadow_cmp(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)((const wsync_shadow_t *)a)->param;
    const uintptr_t y = (uintptr_t)((const wsync_shadow_t *)b)->param;
    return x < y ? -1 : x > y;
}

wsync_result_t wsync_driver_set_shadows(wsync_driver_t *d, const wsync_shadow_t *shadows, size_t n,
                                        wsync_error_t *err)
{
    wsync_shadow_t *t = NULL;
    if (n > 0) {
        if (shadows == NULL || (t = malloc(n * sizeof(*t))) == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "set_shadows: %zu shadows at NULL (or no memory)", n);
        memcpy(t, shadows, n * sizeof(*t));
        qsort(t, n, sizeof(*t), wsync_shadow_cmp);
        for (size_t i = 0; i < n; i++)
            if (t[i].param == NULL || t[i].shadow == NULL ||
                (i > 0 && (uintptr_t)t[i - 1].param + t[i - 1].bytes > (uintptr_t)t[i].param)) {
                free(t);
                return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                    "set_shadows: shadow %zu is NULL or its parameter overlaps "
                                    "another",
                                    i);
            }
    }
    free(d->shadows);
    d->shadows = t;
    d->n_shadows = n;
    return WSYNC_OK;
}

/* An op into a shadowed parameter writes the shadow instead; 1 when it still writes a live
 * parameter (moves bytes outside every shadow). */
static int wsync_driver_redirect(const wsync_driver_t *d, wsync_copy_op_t *op)
{
    if (op->rows == 0 || op->row_bytes == 0)
        return 0;
    const uintptr_t dst = (uintptr_t)op->dst;
    size_t lo = 0, hi = d->n_shadows;
    while (lo < hi) { /* the last shadow whose param starts at or before dst */
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)d->shadows[mid].param <= dst)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 1;
    const wsync_shadow_t *s = &d->shadows[lo - 1];
    if (dst - (uintptr_t)s->param >= s->bytes)
        return 1;
    op->dst = (unsigned char *)s->shadow + (dst - (uintptr_t)s->param);
    return 0;
}

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

static void wsync_driver_hook_begin(wsync_driver_t *d, uint64_t version)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, update_begin) && e->update_begin != NULL)
        e->update_begin(e->user, version);
}

static void wsync_driver_hook_end(wsync_driver_t *d, uint64_t version, int committed)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, update_end) && e->update_end != NULL)
        e->update_end(e->user, version, committed);
}

wsync_result_t wsync_driver_begin(wsync_driver_t *d, uint64_t version, uint64_t expect_tensors,
                                  uint64_t expect_bytes, const char *const *names, size_t n_names,
                                  wsync_error_t *err)
{
    const uint64_t open = d->txn.phase == WSYNC_TXN_UPDATING ? d->txn.version : 0;
    wsync_result_t rc =
        wsync_txn_begin(&d->txn, version, expect_tensors, expect_bytes, names, n_names, err);
    if (rc != WSYNC_OK)
        return rc;
    /* experts another EP rank holds never come here (one question to the engine first: most
     * run without expert parallelism, and a version may declare thousands of names) */
    const int ep = wsync_map_ep_active(d->cfg.engine);
    for (size_t i = 0; ep && i < n_names; i++)
        if (names[i] != NULL && !wsync_map_owned(d->cfg.map, d->cfg.engine, names[i]))
            wsync_txn_elsewhere(&d->txn, names[i]);
    if (open != 0) {
        wsync_driver_log(d, WSYNC_LOG_WARN, "wsync: %s", d->txn.reason);
        wsync_driver_hook_end(d, open, 0);
    }
    wsync_driver_hook_begin(d, version);
    return WSYNC_OK;
}

wsync_result_t wsync_driver_commit(wsync_driver_t *d, uint64_t version, wsync_error_t *err)
{
    wsync_result_t rc = wsync_txn_commit(&d->txn, version, err);
    if (rc == WSYNC_OK)
        wsync_driver_hook_end(d, d->txn.committed, 1);
    return rc;
}

void wsync_driver_abort(wsync_driver_t *d, const char *reason)
{
    const uint64_t v = d->txn.version;
    if (wsync_txn_abort(&d->txn, reason)) {
        wsync_driver_log(d, WSYNC_LOG_WARN, "wsync: %s", d->txn.reason);
        wsync_driver_hook_end(d, v, 0);
    }
}

/* Hold the open version's producer as a pidfd from the moment its pid is known. */
static void wsync_driver_watch(wsync_driver_t *d)
{
    const int64_t pid = d->txn.producer_pid;
    if (pid == d->producer_fd_pid)
        return;
    if (d->producer_fd >= 0)
        close(d->producer_fd);
    d->producer_fd = pid > 0 ? (int)syscall(SYS_pidfd_open, (pid_t)pid, 0) : -1;
    d->producer_fd_pid = pid;
}

/* Has the producer `pid` ended? Through its pidfd (readable once it exits), else kill(pid, 0). */
static int wsync_driver_producer_gone(wsync_driver_t *d, int64_t pid)
{
    wsync_driver_watch(d);
    if (d->producer_fd >= 0) {
        struct pollfd p = {.fd = d->producer_fd, .events = POLLIN};
        return poll(&p, 1, 0) > 0;
    }
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

void wsync_driver_check(wsync_driver_t *d)
{
    const int64_t pid = d->txn.producer_pid;
    if (d->txn.phase != WSYNC_TXN_UPDATING || pid <= 0)
        return;
    if (wsync_driver_producer_gone(d, pid)) {
        char why[96];
        snprintf(why, sizeof(why), "left unfinished: its producer (pid %lld) is gone",
                 (long long)pid);
        wsync_driver_abort(d, why);
        wsync_shm_sweep(pid); /* its staging, which it could not unlink */
    }
}

json_t *wsync_driver_state(wsync_driver_t *d)
{
    wsync_driver_check(d);
    return wsync_txn_state(&d->txn);
}

uint64_t wsync_driver_committed(const wsync_driver_t *d, int *updating)
{
    if (updating != NULL)
        *updating = d->txn.phase == WSYNC_TXN_UPDATING;
    return d->txn.committed;
}

uint64_t wsync_driver_open_version(const wsync_driver_t *d)
{
    return d->txn.phase == WSYNC_TXN_UPDATING ? d->txn.version : 0;
}

void wsync_driver_set_producer(wsync_driver_t *d, int64_t pid)
{
    if (d->txn.phase == WSYNC_TXN_UPDATING && pid > 0) {
        d->txn.producer_pid = pid;
        wsync_driver_watch(d);
    }
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

static wsync_stream_t wsync_driver_stream(const wsync_driver_t *d)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    return WSYNC_HAS_FIELD(wsync_engine_ops_t, e, stream) && e->stream != NULL ? e->stream(e->user)
                                                                               : NULL;
}

static int wsync_driver_same_buffer(const wsync_buffer_desc_t *a, const wsync_buffer_desc_t *b)
{
    return a->kind == b->kind && a->handle_len == b->handle_len &&
           memcmp(a->handle, b->handle, a->handle_len) == 0 && a->pid == b->pid &&
           strncmp(a->device, b->device, sizeof(a->device)) == 0;
}

static wsync_driver_buffer_t *wsync_driver_find(wsync_driver_t *d, const wsync_buffer_desc_t *b)
{
    for (size_t i = 0; i < d->n_buffers; i++)
        if (wsync_driver_same_buffer(&d->buffers[i].key, b))
            return &d->buffers[i];
    return NULL;
}

/* Printable buffer name for messages: the shm name, or the first handle bytes in hex. */
static void wsync_driver_buffer_name(const wsync_buffer_desc_t *b, char *buf, size_t len)
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

static wsync_result_t wsync_driver_parse(wsync_driver_t *d, const char *json, size_t len,
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

static void wsync_driver_free_manifest(wsync_driver_t *d, const wsync_manifest_t *m)
{
    if (m == NULL)
        return;
    if (d->ops != NULL)
        d->ops->manifest_free(d->consumer, m);
    else
        wsync_manifest_free(wsync_manifest_owned_from_view(m));
}

/* A tensor that quantizes into an fp8 parameter: the plugin must have copy_quantized, and the
 * bucket be staged (a direct bucket's segments copy as they are) outside rollback mode (whose
 * shadows do not hold the block scales). */
static wsync_result_t wsync_driver_can_quantize(const wsync_driver_t *d, const wsync_manifest_t *m,
                                                const char *name, wsync_error_t *err)
{
    if (d->ops == NULL || !WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, copy_quantized))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "tensor \"%s\" quantizes into an fp8 parameter, which needs a plugin "
                            "with copy_quantized; %s has none",
                            name, d->ops == NULL ? "the native loader" : d->loader.path);
    if (m->n_segments > 0 || d->n_shadows > 0)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "tensor \"%s\" quantizes into an fp8 parameter: %s", name,
                            m->n_segments > 0 ? "send it in a staged bucket, not a direct one"
                                              : "rollback mode does not shadow fp8 parameters");
    return WSYNC_OK;
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

/* A per-tensor fp8 scale (WSYNC_QUANT_FP8_TENSOR) is the amax of every part of its parameter: the
 * bucket must bring all of them (want[t]: the rows its scale covers), or the scale would be of a
 * part alone. */
static wsync_result_t wsync_driver_check_tensor_scales(const wsync_manifest_t *m,
                                                       const wsync_copy_op_t *ops,
                                                       const wsync_quant_t *quant,
                                                       const uint64_t *want, wsync_error_t *err)
{
    size_t n = 0;
    for (size_t t = 0; t < m->n_tensors; t++)
        n += quant[t].kind == WSYNC_QUANT_FP8_TENSOR && ops[t].rows > 0;
    if (n == 0)
        return WSYNC_OK;
    wsync_fp8_ref_t *g = malloc(n * sizeof(*g));
    if (g == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu fp8 scales", n);
    for (size_t t = 0, k = 0; t < m->n_tensors; t++)
        if (quant[t].kind == WSYNC_QUANT_FP8_TENSOR && ops[t].rows > 0)
            g[k++] = (wsync_fp8_ref_t){(uintptr_t)quant[t].scale_dst, t};
    qsort(g, n, sizeof(*g), wsync_fp8_ref_cmp);
    wsync_result_t rc = WSYNC_OK;
    for (size_t i = 0; i < n && rc == WSYNC_OK;) {
        size_t j = i;
        uint64_t rows = 0;
        for (; j < n && g[j].scale == g[i].scale; j++)
            rows += ops[g[j].op].rows;
        if (rows != want[g[i].op])
            rc = WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensor \"%s\" quantizes into an fp8 parameter with one per-tensor "
                              "scale, whose %" PRIu64 " rows must all come in one bucket (the "
                              "scale is the amax of all of them); this bucket brings %" PRIu64
                              " of them in %zu tensor(s): send every part of the parameter (q, "
                              "k, v; gate, up) together",
                              m->tensors[g[i].op].name, want[g[i].op], rows, j - i);
        i = j;
    }
    free(g);
    return rc;
}

/* Step 2 of apply: everything checked, nothing written. ops[k] is the plan of tensor k in
 * manifest order. */
static wsync_result_t wsync_driver_validate(wsync_driver_t *d, const wsync_manifest_t *const *m,
                                            size_t n, wsync_copy_op_t *ops, wsync_quant_t *quant,
                                            uint8_t *live, wsync_error_t *err)
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
        if (known != NULL && m[i]->generation <= known->last_generation) {
            wsync_driver_buffer_name(&m[i]->buffer, bname, sizeof(bname));
            return WSYNC_RECORD(err, WSYNC_ERR_STALE_GENERATION,
                                "stale generation %" PRIu64 " for buffer %s: this engine "
                                "already consumed generation %" PRIu64
                                " from it; publish a newer bucket",
                                m[i]->generation, bname, known->last_generation);
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

static wsync_driver_buffer_t *wsync_driver_remember(wsync_driver_t *d, const wsync_buffer_desc_t *b)
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

static void wsync_driver_close_segments(wsync_driver_t *d, wsync_driver_buffer_t *e)
{
    for (size_t k = 0; k < e->n_segs; k++)
        if (e->segs[k] != NULL && d->ops != NULL)
            d->ops->close_handle(d->consumer, e->segs[k], NULL);
    free(e->segs);
    free(e->seg_keys);
    free(e->seg_epoch);
    e->segs = NULL;
    e->seg_keys = NULL;
    e->seg_epoch = NULL;
    e->n_segs = e->cap_segs = 0;
}

/* The held handle of segment `key`, opening (and holding) it when it is new. */
static wsync_result_t wsync_driver_segment(wsync_driver_t *d, wsync_driver_buffer_t *e,
                                           const wsync_buffer_desc_t *key, size_t *at,
                                           struct wsync_handle **out, wsync_error_t *err)
{
    /* a steady trainer names its segments in the same order every time: try *at first (where
     * the one after the last found sits), then all */
    size_t j = *at;
    if (j >= e->n_segs || !wsync_driver_same_buffer(&e->seg_keys[j], key))
        for (j = 0; j < e->n_segs && !wsync_driver_same_buffer(&e->seg_keys[j], key); j++)
            ;
    if (j < e->n_segs) {
        e->seg_epoch[j] = e->epoch;
        *out = e->segs[j];
        *at = j + 1;
        return WSYNC_OK;
    }
    if (e->n_segs == e->cap_segs) {
        size_t cap = e->cap_segs ? 2 * e->cap_segs : 64;
        void *a = realloc(e->segs, cap * sizeof(*e->segs));
        if (a != NULL)
            e->segs = a;
        void *b = realloc(e->seg_keys, cap * sizeof(*e->seg_keys));
        if (b != NULL)
            e->seg_keys = b;
        void *c = realloc(e->seg_epoch, cap * sizeof(*e->seg_epoch));
        if (c != NULL)
            e->seg_epoch = c;
        if (a == NULL || b == NULL || c == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: %zu segments", cap);
        e->cap_segs = cap;
    }
    wsync_result_t rc = d->ops->open_handle(d->consumer, key, out, err);
    d->opens++;
    if (rc != WSYNC_OK)
        return rc;
    e->segs[e->n_segs] = *out;
    e->seg_keys[e->n_segs] = *key;
    e->seg_epoch[e->n_segs] = e->epoch;
    e->n_segs++;
    *at = e->n_segs;
    return WSYNC_OK;
}

/* After the last bucket of a weight version: close every held segment no manifest of that
 * version named (memory the producer freed or re-made elsewhere); their copies are behind the
 * ones just enqueued on the same stream, and close_handle waits for them. */
static void wsync_driver_sweep_segments(wsync_driver_t *d, wsync_driver_buffer_t *e)
{
    size_t kept = 0;
    for (size_t j = 0; j < e->n_segs; j++) {
        if (e->seg_epoch[j] != e->epoch) {
            d->ops->close_handle(d->consumer, e->segs[j], NULL);
            continue;
        }
        e->segs[kept] = e->segs[j];
        e->seg_keys[kept] = e->seg_keys[j];
        e->seg_epoch[kept] = e->seg_epoch[j];
        kept++;
    }
    e->n_segs = kept;
    e->epoch++;
}

/* Direct mode, one bucket: the segments it names (held across buckets and syncs: 0 opens in
 * the steady state), every tensor in one copy_segments. */
static wsync_result_t wsync_driver_copy_direct(wsync_driver_t *d, wsync_driver_buffer_t *e,
                                               const wsync_manifest_t *m,
                                               const wsync_copy_op_t *ops, wsync_error_t *err)
{
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, copy_segments))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "a direct bucket (%zu segments) needs a plugin with copy_segments; %s "
                            "has none",
                            m->n_segments, d->loader.path);
    const size_t n = m->n_segments;
    struct wsync_handle **segs = calloc(n, sizeof(*segs));
    wsync_result_t rc = WSYNC_OK;
    if (segs == NULL)
        rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: %zu segments", n);
    size_t at = 0;
    for (size_t k = 0; rc == WSYNC_OK && k < n; k++)
        rc = wsync_driver_segment(d, e, &m->segments[k], &at, &segs[k], err);
    if (rc == WSYNC_OK)
        rc = d->ops->copy_segments(d->consumer, e->handle, segs, n, wsync_driver_stream(d),
                                   m->generation, ops, m->tensor_segment, m->n_tensors,
                                   d->cfg.copy_flags & ~WSYNC_COPY_QUANT_ONE_PASS, err);
    free(segs);
    if (rc == WSYNC_OK && m->finished)
        wsync_driver_sweep_segments(d, e);
    return rc;
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

wsync_result_t wsync_driver_apply(wsync_driver_t *d, const char *const *manifests,
                                  const size_t *lens, size_t n, uint64_t *generation,
                                  wsync_error_t *err)
{
    const wsync_manifest_t **m;
    wsync_copy_op_t *ops = NULL;
    wsync_quant_t *quant = NULL; /* per op: how it quantizes (fp8 parameters) */
    uint8_t *live = NULL;        /* per manifest: writes a parameter outside every shadow */
    size_t total = 0, k = 0;
    uint64_t gen = 0;
    wsync_result_t rc = WSYNC_OK;

    if (d == NULL || (n > 0 && (manifests == NULL || lens == NULL)))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT, "apply: NULL driver or manifests");
    m = calloc(n ? n : 1, sizeof(*m));
    if (m == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "apply: out of memory");
    const int timing = wsync_driver_timing();
    double t_parsed = 0, t_checked = 0, t_copy = 0, t_record = 0;
    const double t0 = timing ? wsync_driver_us() : 0;
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++) {
        rc = wsync_driver_parse(d, manifests[i], lens[i], &m[i], err);
        if (rc == WSYNC_OK)
            total += m[i]->n_tensors;
    }
    if (rc == WSYNC_OK && d->refusal != WSYNC_OK) /* the request's own fields were refused */
        rc = WSYNC_RECORD(err, d->refusal, "%s", d->refusal_msg);
    d->refusal = WSYNC_OK;
    if (rc != WSYNC_OK) { /* a refusal at parse: every bucket of the request goes back unread */
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
        live = calloc(n ? n : 1, 1);
        rc = live != NULL ? wsync_driver_validate(d, m, n, ops, quant, live, err)
                          : WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "apply: out of memory");
        for (size_t i = 0; i < n && rc == WSYNC_OK; i++)
            rc = wsync_txn_check(&d->txn, m[i]->tensors, m[i]->n_tensors, err);
        if (rc != WSYNC_OK)
            wsync_driver_release_unread(d, m, n);
    }
    if (timing)
        t_parsed = t0, t_checked = wsync_driver_us();
    if (rc == WSYNC_OK && d->txn.phase != WSYNC_TXN_UPDATING && total > 0) {
        wsync_txn_begin_implicit(&d->txn); /* an engine request outside wsync_begin */
        wsync_driver_hook_begin(d, d->txn.version);
    }
    for (size_t i = 0; i < n && rc == WSYNC_OK; i++) {
        int wrote = 0;
        const double t_exec = timing ? wsync_driver_us() : 0;
        double t_copied = 0;
        rc = wsync_driver_execute(d, m[i], ops + k, quant + k, &wrote, &t_copied, err);
        if (t_copied > 0) {
            const double t_end = wsync_driver_us();
            t_copy += t_copied - t_exec, t_record += t_end - t_copied;
        }
        if (rc == WSYNC_OK) {
            wsync_txn_applied(&d->txn, m[i]->tensors, m[i]->n_tensors, live[i], m[i]->buffer.pid);
            wsync_driver_watch(d);
        } else if (wrote && live[i]) {
            wsync_txn_wrote(&d->txn);
        }
        k += m[i]->n_tensors;
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
    for (size_t i = 0; i < n; i++)
        wsync_driver_free_manifest(d, m[i]);
    free(live);
    free(ops);
    free(quant);
    free(m);
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
    for (size_t i = 0; i < d->n_buffers; i++) {
        wsync_driver_close_segments(d, &d->buffers[i]);
        if (d->buffers[i].handle != NULL && d->ops != NULL) {
            wsync_result_t r = d->ops->close_handle(d->consumer, d->buffers[i].handle, err);
            if (rc == WSYNC_OK)
                rc = r;
        }
        d->buffers[i].handle = NULL; /* generations stay remembered: replays are still refused */
    }
    return rc;
}

/* ------------------------------------------------------------ LoRA adapters */

static wsync_result_t wsync_driver_lora_ready(wsync_driver_t *d, wsync_error_t *err)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (!WSYNC_HAS_FIELD(wsync_engine_ops_t, e, lora_slot) || e->lora_slot == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "this engine has no LoRA slots (enable LoRA in the engine)");
    if (d->ops == NULL || !WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, hot_load_adapter))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "LoRA hot-load needs a wsync plugin with hot_load_adapter (%s); "
                            "use the engine's own adapter loader",
                            d->ops == NULL ? d->native_why : d->loader.path);
    return WSYNC_OK;
}

/* FROM_MANIFEST: parse, check the generation against what this engine took from the buffer,
 * open (or reuse) its mapping, hot-load, remember the generation. */
static wsync_result_t wsync_driver_load_from_manifest(wsync_driver_t *d,
                                                      wsync_adapter_source_t *src,
                                                      wsync_adapter_slot_t *slot, const char *json,
                                                      size_t len, wsync_error_t *err)
{
    const wsync_manifest_t *m = NULL;
    wsync_driver_buffer_t *b = NULL;
    char bname[64];
    wsync_result_t rc = wsync_driver_parse(d, json, len, &m, err);

    if (rc == WSYNC_OK) {
        b = wsync_driver_find(d, &m->buffer);
        if (b != NULL && m->generation <= b->last_generation) {
            wsync_driver_buffer_name(&m->buffer, bname, sizeof(bname));
            rc = WSYNC_RECORD(err, WSYNC_ERR_STALE_GENERATION,
                              "stale adapter generation %" PRIu64 " for buffer %s: this "
                              "engine already took generation %" PRIu64 " from it",
                              m->generation, bname, b->last_generation);
        } else if ((b = wsync_driver_remember(d, &m->buffer)) == NULL) {
            rc = WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "driver: out of memory");
        }
    }
    if (rc == WSYNC_OK && b->handle == NULL)
        rc = d->ops->open_handle(d->consumer, &m->buffer, &b->handle, err);
    if (rc == WSYNC_OK) {
        src->kind = WSYNC_ADAPTER_FROM_MANIFEST;
        src->handle = b->handle;
        src->manifest = m;
        rc = d->ops->hot_load_adapter(d->consumer, src, slot, wsync_driver_stream(d), err);
    }
    if (rc == WSYNC_OK)
        b->last_generation = m->generation;
    wsync_driver_free_manifest(d, m);
    return rc;
}

wsync_result_t wsync_driver_load_adapter(wsync_driver_t *d, const char *name, const char *path,
                                         const char *manifest, size_t manifest_len,
                                         const char *config, int *reloaded, wsync_error_t *err)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    wsync_adapter_source_t src = {.struct_size = sizeof(src), .adapter_config_json = config};
    wsync_adapter_slot_t *slot;
    wsync_result_t rc = wsync_driver_lora_ready(d, err);

    if (rc != WSYNC_OK)
        return rc;
    if (name == NULL || name[0] == '\0' || (path == NULL) == (manifest == NULL) ||
        (manifest != NULL && config == NULL))
        return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "an adapter load needs a name and either a path or a manifest "
                            "with its adapter_config.json");
    slot = e->lora_slot(e->user, name, 0);
    if (reloaded != NULL)
        *reloaded = slot != NULL;
    if (slot == NULL && (slot = e->lora_slot(e->user, name, 1)) == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_BUSY,
                            "no free LoRA slot for adapter \"%s\"; unload one first", name);
    /* The engine's earlier work (requests reading the shadow copy) first. */
    rc = wsync_driver_drain(d, err);
    if (rc == WSYNC_OK && path != NULL) {
        src.kind = WSYNC_ADAPTER_FROM_DIR;
        src.path = path;
        rc = d->ops->hot_load_adapter(d->consumer, &src, slot, wsync_driver_stream(d), err);
    } else if (rc == WSYNC_OK) {
        rc = wsync_driver_load_from_manifest(d, &src, slot, manifest, manifest_len, err);
    }
    if (rc == WSYNC_OK && WSYNC_HAS_FIELD(wsync_engine_ops_t, e, lora_loaded) &&
        e->lora_loaded != NULL)
        e->lora_loaded(e->user, name, slot);
    if (rc != WSYNC_OK)
        wsync_driver_log(d, WSYNC_LOG_ERROR, "wsync: adapter \"%s\" refused: %s: %s", name,
                         wsync_strerror(rc), err != NULL ? err->message : "");
    return rc;
}

wsync_result_t wsync_driver_unload_adapter(wsync_driver_t *d, const char *name, wsync_error_t *err)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    wsync_adapter_slot_t *slot;
    wsync_result_t rc = wsync_driver_lora_ready(d, err);

    if (rc != WSYNC_OK)
        return rc;
    if (!WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, unload_adapter))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED, "plugin %s has no unload_adapter",
                            d->loader.path);
    slot = name != NULL ? e->lora_slot(e->user, name, 0) : NULL;
    if (slot == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_FOUND, "adapter \"%s\" is not loaded",
                            name ? name : "(null)");
    rc = wsync_driver_drain(d, err);
    if (rc == WSYNC_OK)
        rc = d->ops->unload_adapter(d->consumer, slot, err);
    if (rc == WSYNC_OK && WSYNC_HAS_FIELD(wsync_engine_ops_t, e, lora_unloaded) &&
        e->lora_unloaded != NULL)
        e->lora_unloaded(e->user, name);
    return rc;
}

void wsync_driver_reset_prefix_cache(wsync_driver_t *d, const char *name)
{
    const wsync_engine_ops_t *e = d->cfg.engine;
    if (WSYNC_HAS_FIELD(wsync_engine_ops_t, e, reset_prefix_cache) && e->reset_prefix_cache != NULL)
        e->reset_prefix_cache(e->user, name);
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
    if (d->producer_fd >= 0)
        close(d->producer_fd);
    free(d->shadows);
    free(d->buffers);
    free(d);
}
