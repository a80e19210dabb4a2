/* Plan once, replay (docs/DESIGN.md, "Plan once, replay"): the validated copy plans of buckets
 * that recorded one, and the checks a replay passes before its plan's copy runs. A replay never
 * writes where the bucket that recorded the plan was not allowed to: its ops are that bucket's,
 * checked then; what the replay itself names (its buffer, its segments) is checked per buffer
 * and per segment, never per tensor. */
#include "wsync_driver_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

/* Bounds of one engine rank's table: a steady trainer's buckets, many times over. */
#define WSYNC_DRIVER_MAX_PLANS 4096
#define WSYNC_DRIVER_MAX_PLAN_BYTES ((size_t)512 << 20)

const char *wsync_driver_plan_of(const wsync_manifest_t *m, int *replay)
{
    const int has = WSYNC_HAS_FIELD(wsync_manifest_t, m, replay) && m->plan != NULL;
    *replay = has && m->replay;
    return has ? m->plan : NULL;
}

static void wsync_plan_free(wsync_plan_t *p)
{
    free(p->ops);
    free(p->quant);
    free(p->tensors);
    free(p->names);
    free(p->tensor_segment);
    free(p->segments);
    memset(p, 0, sizeof(*p));
}

static void wsync_driver_plan_drop(wsync_driver_t *d, size_t i)
{
    d->plan_bytes -= d->plans[i].bytes;
    wsync_plan_free(&d->plans[i]);
    d->plans[i] = d->plans[--d->n_plans];
}

void wsync_driver_plans_clear(wsync_driver_t *d)
{
    while (d->n_plans > 0)
        wsync_driver_plan_drop(d, d->n_plans - 1);
    free(d->plans);
    d->plans = NULL;
    d->cap_plans = 0;
}

static wsync_plan_t *wsync_driver_plan_lookup(wsync_driver_t *d, const char *id)
{
    for (size_t i = 0; i < d->n_plans; i++)
        if (strcmp(d->plans[i].id, id) == 0)
            return &d->plans[i];
    return NULL;
}

static uint64_t wsync_plan_need(const wsync_copy_op_t *ops, size_t n)
{
    uint64_t need = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i].row_bytes > 0 && ops[i].rows > 0) {
            const uint64_t last =
                ops[i].src_offset + (ops[i].rows - 1) * ops[i].src_pitch + ops[i].row_bytes;
            need = last > need ? last : need;
        }
    return need;
}

wsync_result_t wsync_driver_plan_find(wsync_driver_t *d, const wsync_manifest_t *m,
                                      wsync_manifest_t *view, const wsync_plan_t **out,
                                      wsync_error_t *err)
{
    int replay;
    const char *id = wsync_driver_plan_of(m, &replay);
    wsync_plan_t *p = id != NULL ? wsync_driver_plan_lookup(d, id) : NULL;
    char bname[64];
    *out = NULL;
    if (p == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_UNKNOWN_PLAN,
                            "replay of plan \"%s\": this engine holds no plan of that id (never "
                            "recorded here, dropped when its mappings were released, or another "
                            "engine's)%s; send the bucket in full",
                            id != NULL ? id : "?",
                            (d->cfg.copy_flags & WSYNC_COPY_VERIFY)
                                ? " -- an engine that verifies digests keeps no plans"
                                : "");
    if (m->buffer.kind != p->kind || (p->n_segments == 0 && m->buffer.bytes < p->need)) {
        wsync_driver_buffer_name(&m->buffer, bname, sizeof(bname));
        return WSYNC_RECORD(err, WSYNC_ERR_UNKNOWN_PLAN,
                            "replay of plan \"%s\": its buffer %s (%" PRIu64
                            " bytes) is not of the kind or size the plan reads (%" PRIu64
                            " bytes); send the bucket in full",
                            id, bname, m->buffer.bytes, p->need);
    }
    if (m->n_segments != p->n_segments)
        return WSYNC_RECORD(err, WSYNC_ERR_UNKNOWN_PLAN,
                            "replay of plan \"%s\": %zu segment(s), the plan was recorded with "
                            "%zu; send the bucket in full",
                            id, m->n_segments, p->n_segments);
    for (size_t k = 0; k < m->n_segments; k++)
        if (!wsync_driver_same_segment(&m->segments[k], &p->segments[k])) {
            wsync_driver_buffer_name(&m->segments[k], bname, sizeof(bname));
            return WSYNC_RECORD(err, WSYNC_ERR_UNKNOWN_PLAN,
                                "replay of plan \"%s\": segment %zu (%s) is not the one the plan "
                                "was recorded with (memory re-made or moved); send the bucket "
                                "in full",
                                id, k, bname);
        }
    p->used = ++d->plan_clock;
    *view = *m;
    view->n_tensors = p->n;
    view->tensors = p->tensors;
    view->tensor_segment = p->tensor_segment;
    *out = p;
    return WSYNC_OK;
}

/* Fill p from m and its ops; 0 when memory is short. */
static int wsync_plan_fill(wsync_plan_t *p, const wsync_manifest_t *m, const wsync_copy_op_t *ops,
                           const wsync_quant_t *quant, int live)
{
    const size_t n = m->n_tensors;
    size_t names_len = 0;
    int quantizes = 0;
    for (size_t i = 0; i < n; i++) {
        names_len += strlen(m->tensors[i].name) + 1;
        quantizes |= quant[i].kind != WSYNC_QUANT_NONE;
    }
    snprintf(p->id, sizeof(p->id), "%s", m->plan);
    p->n = n;
    p->ops = malloc((n ? n : 1) * sizeof(*p->ops));
    p->quant = quantizes ? malloc(n * sizeof(*p->quant)) : NULL;
    p->tensors = malloc((n ? n : 1) * sizeof(*p->tensors));
    p->names = malloc(names_len ? names_len : 1);
    p->n_segments = m->n_segments;
    p->segments = m->n_segments ? malloc(m->n_segments * sizeof(*p->segments)) : NULL;
    p->tensor_segment = m->n_segments ? malloc((n ? n : 1) * sizeof(*p->tensor_segment)) : NULL;
    if (p->ops == NULL || (quantizes && p->quant == NULL) || p->tensors == NULL ||
        p->names == NULL || (m->n_segments && (p->segments == NULL || p->tensor_segment == NULL)))
        return 0;
    memcpy(p->ops, ops, n * sizeof(*p->ops));
    if (quantizes)
        memcpy(p->quant, quant, n * sizeof(*p->quant));
    char *w = p->names;
    for (size_t i = 0; i < n; i++) {
        const size_t len = strlen(m->tensors[i].name) + 1;
        p->tensors[i] = m->tensors[i];
        memcpy(w, m->tensors[i].name, len);
        p->tensors[i].name = w;
        p->tensors[i].has_digest = 0;
        w += len;
    }
    if (m->n_segments) {
        memcpy(p->segments, m->segments, m->n_segments * sizeof(*p->segments));
        memcpy(p->tensor_segment, m->tensor_segment, n * sizeof(*p->tensor_segment));
    }
    p->kind = m->buffer.kind;
    p->need = wsync_plan_need(ops, n);
    p->live = live;
    p->bytes = n * (sizeof(*p->ops) + sizeof(*p->tensors) + sizeof(uint32_t)) + names_len +
               (quantizes ? n * sizeof(*p->quant) : 0) + m->n_segments * sizeof(*p->segments);
    return 1;
}

void wsync_driver_plan_record(wsync_driver_t *d, const wsync_manifest_t *m,
                              const wsync_copy_op_t *ops, const wsync_quant_t *quant, int live)
{
    int replay;
    const char *id = wsync_driver_plan_of(m, &replay);
    if (id == NULL || replay || (d->cfg.copy_flags & WSYNC_COPY_VERIFY))
        return;
    wsync_plan_t *old = wsync_driver_plan_lookup(d, id);
    if (old != NULL)
        wsync_driver_plan_drop(d, (size_t)(old - d->plans));
    if (d->n_plans == d->cap_plans) {
        const size_t cap = d->cap_plans ? 2 * d->cap_plans : 16;
        wsync_plan_t *a = realloc(d->plans, cap * sizeof(*a));
        if (a == NULL)
            return;
        d->plans = a;
        d->cap_plans = cap;
    }
    wsync_plan_t p = {0};
    if (!wsync_plan_fill(&p, m, ops, quant, live)) {
        wsync_plan_free(&p);
        wsync_driver_log(d, WSYNC_LOG_WARN, "wsync: plan \"%s\" not kept: out of memory", id);
        return;
    }
    p.used = ++d->plan_clock;
    d->plans[d->n_plans++] = p;
    d->plan_bytes += p.bytes;
    while (d->n_plans > 1 &&
           (d->n_plans > WSYNC_DRIVER_MAX_PLANS || d->plan_bytes > WSYNC_DRIVER_MAX_PLAN_BYTES)) {
        size_t lru = 0;
        for (size_t i = 1; i < d->n_plans; i++)
            if (d->plans[i].used < d->plans[lru].used)
                lru = i;
        wsync_driver_plan_drop(d, lru);
    }
}
