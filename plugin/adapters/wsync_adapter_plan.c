/* Adapter × slot validation and the shadow-copy plan. */
#include "wsync_adapter_plan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_convert.h"
#include "wsync_dtype.h"
#include "wsync_error.h"

/* An adapter module name the slot can receive: a plain target or one part of a packed one. */
typedef struct wsync_slot_entry {
    const char *name;
    char *owned; /* resolved sibling path, or NULL */
    size_t target;
    size_t part;  /* 0 for a plain target */
    size_t index; /* into the per-target assignment array */
} wsync_slot_entry_t;

typedef struct wsync_region {
    uintptr_t begin, end;
    size_t target;
    const char *what;
} wsync_region_t;

/* Scratch state of one build. */
typedef struct wsync_plan_ctx {
    const wsync_adapter_slot_t *slot;
    wsync_slot_entry_t *entries;
    size_t n_entries;
    size_t *base; /* per target: first entry index */
    const wsync_adapter_module_t **assign;
    uint64_t *col; /* per entry index: first rank column of that part */
    wsync_adapter_plan_t *plan;
} wsync_plan_ctx_t;

static size_t wsync_target_slots(const wsync_adapter_target_t *t)
{
    return t->n_parts ? t->n_parts : 1;
}

static int wsync_entry_cmp(const void *x, const void *y)
{
    return strcmp(((const wsync_slot_entry_t *)x)->name, ((const wsync_slot_entry_t *)y)->name);
}

static int wsync_region_cmp(const void *x, const void *y)
{
    const wsync_region_t *a = x, *b = y;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

static int wsync_part_cmp(const void *x, const void *y)
{
    const wsync_adapter_part_t *a = *(const wsync_adapter_part_t *const *)x;
    const wsync_adapter_part_t *b = *(const wsync_adapter_part_t *const *)y;
    return a->out_offset < b->out_offset ? -1 : a->out_offset > b->out_offset;
}

static wsync_result_t wsync_check_parts(const wsync_adapter_target_t *t, wsync_error_t *err)
{
    if (t->n_parts == 0)
        return WSYNC_OK;
    if (t->parts == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "slot target \"%s\": n_parts %zu but "
                          "parts is NULL",
                          t->module, t->n_parts);
    const wsync_adapter_part_t **sorted = malloc(t->n_parts * sizeof(*sorted));
    if (sorted == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu parts", t->n_parts);
    wsync_result_t rc = WSYNC_OK;
    for (size_t k = 0; k < t->n_parts && rc == WSYNC_OK; k++) {
        const wsync_adapter_part_t *p = &t->parts[k];
        sorted[k] = p;
        if (p->hf_module == NULL || p->hf_module[0] == '\0')
            rc = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "slot target \"%s\": parts[%zu] has no hf_module", t->module, k);
        else if (p->out_offset < 0 || p->out_features <= 0 ||
                 p->out_offset > t->out_features - p->out_features)
            rc = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                            "slot target \"%s\": part \"%s\" rows [%lld, +%lld) outside "
                            "out_features %lld",
                            t->module, p->hf_module, (long long)p->out_offset,
                            (long long)p->out_features, (long long)t->out_features);
    }
    if (rc == WSYNC_OK) {
        qsort(sorted, t->n_parts, sizeof(*sorted), wsync_part_cmp);
        for (size_t k = 1; k < t->n_parts && rc == WSYNC_OK; k++)
            if (sorted[k]->out_offset < sorted[k - 1]->out_offset + sorted[k - 1]->out_features)
                rc = WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "slot target \"%s\": parts \"%s\" and \"%s\" overlap", t->module,
                                sorted[k - 1]->hf_module, sorted[k]->hf_module);
    }
    free(sorted);
    return rc;
}

static wsync_result_t wsync_check_target(const wsync_adapter_slot_t *slot, size_t i,
                                         wsync_region_t *regions, wsync_error_t *err)
{
    const wsync_adapter_target_t *t = &slot->targets[i];
    if (!WSYNC_HAS_FIELD(wsync_adapter_target_t, t, parts))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "slot targets[%zu]: struct_size %zu is smaller than v1's %zu", i,
                          t->struct_size, sizeof(*t));
    if (t->module == NULL || t->module[0] == '\0')
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "slot targets[%zu] has no module name",
                          i);
    if (!wsync_convert_is_float(t->dtype))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "slot target \"%s\": dtype %s cannot hold LoRA weights (use bfloat16, "
                          "float16, float32 or float64)",
                          t->module, wsync_dtype_name(t->dtype));
    if (t->in_features <= 0 || t->out_features <= 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "slot target \"%s\": in_features %lld / out_features %lld must be > 0",
                          t->module, (long long)t->in_features, (long long)t->out_features);
    uint64_t esz = wsync_dtype_size(t->dtype), a_bytes, b_bytes;
    if (__builtin_mul_overflow((uint64_t)slot->max_rank, (uint64_t)t->in_features, &a_bytes) ||
        __builtin_mul_overflow(a_bytes, esz, &a_bytes) ||
        __builtin_mul_overflow((uint64_t)slot->max_rank, (uint64_t)t->out_features, &b_bytes) ||
        __builtin_mul_overflow(b_bytes, esz, &b_bytes) || a_bytes > UINTPTR_MAX / 2 ||
        b_bytes > UINTPTR_MAX / 2)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "slot target \"%s\": size overflows",
                          t->module);
    for (int c = 0; c < 2; c++) {
        if (t->lora_a[c] == NULL || t->lora_b[c] == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "slot target \"%s\": lora_a[%d] / lora_b[%d] is NULL", t->module, c,
                              c);
        regions[4 * i + 2 * c] =
            (wsync_region_t){(uintptr_t)t->lora_a[c], (uintptr_t)t->lora_a[c] + a_bytes, i,
                             c ? "lora_a[1]" : "lora_a[0]"};
        regions[4 * i + 2 * c + 1] =
            (wsync_region_t){(uintptr_t)t->lora_b[c], (uintptr_t)t->lora_b[c] + b_bytes, i,
                             c ? "lora_b[1]" : "lora_b[0]"};
    }
    return wsync_check_parts(t, err);
}

/* Every region the plugin may write, of both copies, must be disjoint: a shadow write must never
 * touch what requests are reading. */
static wsync_result_t wsync_check_regions(const wsync_adapter_slot_t *slot, wsync_region_t *r,
                                          size_t n, wsync_error_t *err)
{
    qsort(r, n, sizeof(*r), wsync_region_cmp);
    for (size_t k = 1; k < n; k++)
        if (r[k].begin < r[k - 1].end)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "slot buffers overlap: target \"%s\" %s and target \"%s\" %s",
                              slot->targets[r[k - 1].target].module, r[k - 1].what,
                              slot->targets[r[k].target].module, r[k].what);
    return WSYNC_OK;
}

static wsync_result_t wsync_check_slot(const wsync_adapter_slot_t *slot, int *active,
                                       wsync_error_t *err)
{
    if (slot == NULL || !WSYNC_HAS_FIELD(wsync_adapter_slot_t, slot, active))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "adapter slot is NULL or its struct_size is smaller than v1's");
    const char *name = slot->adapter_name ? slot->adapter_name : "(unnamed)";
    if (slot->active == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "slot \"%s\": active is NULL", name);
    *active = __atomic_load_n(slot->active, __ATOMIC_ACQUIRE);
    if (*active != 0 && *active != 1)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "slot \"%s\": *active is %d, not 0/1",
                          name, *active);
    if (slot->max_rank == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "slot \"%s\": max_rank is 0", name);
    if (slot->n_targets > 0 && slot->targets == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "slot \"%s\": n_targets %zu but targets is NULL", name, slot->n_targets);
    if (slot->n_targets > SIZE_MAX / (4 * sizeof(wsync_region_t)))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "slot \"%s\": too many targets", name);
    wsync_region_t *regions = calloc(4 * slot->n_targets + 1, sizeof(*regions));
    if (regions == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu targets", slot->n_targets);
    wsync_result_t rc = WSYNC_OK;
    for (size_t i = 0; i < slot->n_targets && rc == WSYNC_OK; i++)
        rc = wsync_check_target(slot, i, regions, err);
    if (rc == WSYNC_OK)
        rc = wsync_check_regions(slot, regions, 4 * slot->n_targets, err);
    free(regions);
    return rc;
}

/* Full path of part k of target t: as given, or a sibling of the target module. */
static char *wsync_part_path(const wsync_adapter_target_t *t, const wsync_adapter_part_t *p)
{
    if (strchr(p->hf_module, '.') != NULL)
        return NULL;
    const char *dot = strrchr(t->module, '.');
    size_t plen = dot ? (size_t)(dot - t->module) + 1 : 0;
    size_t n = strlen(p->hf_module);
    char *s = malloc(plen + n + 1);
    if (s != NULL) {
        memcpy(s, t->module, plen);
        memcpy(s + plen, p->hf_module, n + 1);
    }
    return s;
}

static wsync_result_t wsync_build_entries(wsync_plan_ctx_t *cx, wsync_error_t *err)
{
    const wsync_adapter_slot_t *slot = cx->slot;
    size_t n = 0;
    cx->base = calloc(slot->n_targets + 1, sizeof(*cx->base));
    if (cx->base == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "slot entries");
    for (size_t i = 0; i < slot->n_targets; i++) {
        cx->base[i] = n;
        n += wsync_target_slots(&slot->targets[i]);
    }
    cx->base[slot->n_targets] = n;
    cx->entries = calloc(n + 1, sizeof(*cx->entries));
    cx->assign = calloc(n + 1, sizeof(*cx->assign));
    cx->col = calloc(n + 1, sizeof(*cx->col));
    if (cx->entries == NULL || cx->assign == NULL || cx->col == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu slot entries", n);
    for (size_t i = 0; i < slot->n_targets; i++) {
        const wsync_adapter_target_t *t = &slot->targets[i];
        for (size_t k = 0; k < wsync_target_slots(t); k++) {
            wsync_slot_entry_t *e = &cx->entries[cx->n_entries++];
            e->target = i;
            e->part = k;
            e->index = cx->base[i] + k;
            if (t->n_parts == 0) {
                e->name = t->module;
                continue;
            }
            e->owned = wsync_part_path(t, &t->parts[k]);
            if (e->owned == NULL && strchr(t->parts[k].hf_module, '.') == NULL)
                return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "part name");
            e->name = e->owned ? e->owned : t->parts[k].hf_module;
        }
    }
    qsort(cx->entries, cx->n_entries, sizeof(*cx->entries), wsync_entry_cmp);
    for (size_t k = 1; k < cx->n_entries; k++)
        if (strcmp(cx->entries[k].name, cx->entries[k - 1].name) == 0)
            return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "slot \"%s\": module \"%s\" is named by targets \"%s\" and \"%s\"",
                              slot->adapter_name ? slot->adapter_name : "(unnamed)",
                              cx->entries[k].name, slot->targets[cx->entries[k - 1].target].module,
                              slot->targets[cx->entries[k].target].module);
    return WSYNC_OK;
}

/* Land every adapter module in its entry; check shapes and dtypes against the target. */
static wsync_result_t wsync_assign(wsync_plan_ctx_t *cx, const wsync_adapter_t *a,
                                   wsync_error_t *err)
{
    const wsync_adapter_slot_t *slot = cx->slot;
    for (size_t m = 0; m < a->n_modules; m++) {
        const wsync_adapter_module_t *mod = &a->modules[m];
        wsync_slot_entry_t key = {.name = mod->hf_module};
        const wsync_slot_entry_t *e =
            bsearch(&key, cx->entries, cx->n_entries, sizeof(key), wsync_entry_cmp);
        if (e == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_NOT_FOUND,
                              "adapter module \"%s\" has no target in slot \"%s\" (the engine has "
                              "no LoRA buffer for it; drop it from target_modules)",
                              mod->hf_module, slot->adapter_name ? slot->adapter_name : "");
        const wsync_adapter_target_t *t = &slot->targets[e->target];
        int64_t out = t->n_parts ? t->parts[e->part].out_features : t->out_features;
        if (!wsync_convert_is_float(mod->a.dtype) || !wsync_convert_is_float(mod->b.dtype))
            return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                              "module \"%s\": lora_A %s / lora_B %s cannot convert to %s (only "
                              "bfloat16, float16, float32, float64)",
                              mod->hf_module, wsync_dtype_name(mod->a.dtype),
                              wsync_dtype_name(mod->b.dtype), wsync_dtype_name(t->dtype));
        if (mod->a.shape[1] != t->in_features || mod->b.shape[0] != out)
            return WSYNC_FAIL(err, WSYNC_ERR_LAYOUT_MISMATCH,
                              "module \"%s\": lora_A [%lld, %lld] / lora_B [%lld, %lld] do not "
                              "fit target \"%s\" (in %lld, out %lld: want [r, %lld] / [%lld, r])",
                              mod->hf_module, (long long)mod->a.shape[0],
                              (long long)mod->a.shape[1], (long long)mod->b.shape[0],
                              (long long)mod->b.shape[1], t->module, (long long)t->in_features,
                              (long long)out, (long long)t->in_features, (long long)out);
        cx->assign[e->index] = mod;
    }
    for (size_t i = 0; i < slot->n_targets; i++) {
        const wsync_adapter_target_t *t = &slot->targets[i];
        uint64_t sum = 0;
        for (size_t k = 0; k < wsync_target_slots(t); k++)
            if (cx->assign[cx->base[i] + k])
                sum += cx->assign[cx->base[i] + k]->rank;
        if (sum > slot->max_rank)
            return WSYNC_FAIL(err, WSYNC_ERR_LAYOUT_MISMATCH,
                              "target \"%s\": adapter rank %llu exceeds the slot's max_rank %u%s",
                              t->module, (unsigned long long)sum, slot->max_rank,
                              t->n_parts ? " (sum of the packed parts' ranks)" : "");
    }
    return WSYNC_OK;
}

static void wsync_zero(wsync_adapter_plan_t *p, uint8_t *dst, uint64_t pitch, uint64_t rows,
                       uint64_t row_bytes)
{
    if (rows == 0 || row_bytes == 0)
        return;
    p->zeros[p->n_zeros++] = (wsync_adapter_zero_op_t){dst, pitch, rows, row_bytes};
}

static void wsync_copy(wsync_adapter_plan_t *p, const wsync_adapter_tensor_t *src,
                       uint64_t src_pitch, uint8_t *dst, wsync_dtype_t dt, uint64_t dst_pitch,
                       uint64_t rows, uint64_t cols, double scale)
{
    if (rows == 0 || cols == 0)
        return;
    p->copies[p->n_copies++] = (wsync_adapter_copy_op_t){src->data, src->dtype, src_pitch, dst,  dt,
                                                         dst_pitch, rows,       cols,      scale};
}

/* Ops and values for target i into copy p->shadow. */
static void wsync_plan_target(wsync_plan_ctx_t *cx, size_t i)
{
    const wsync_adapter_target_t *t = &cx->slot->targets[i];
    wsync_adapter_plan_t *p = cx->plan;
    const wsync_adapter_module_t **as = &cx->assign[cx->base[i]];
    size_t np = wsync_target_slots(t);
    uint64_t esz = wsync_dtype_size(t->dtype), R = cx->slot->max_rank;
    uint64_t in = (uint64_t)t->in_features, out = (uint64_t)t->out_features;
    uint8_t *A = t->lora_a[p->shadow], *B = t->lora_b[p->shadow];
    uint64_t pa = in * esz, pb = R * esz;

    /* Common scaling, or 1.0 with per-part scale folded into B. */
    double scaling = 0.0;
    int first = 1, uniform = 1;
    for (size_t k = 0; k < np; k++) {
        if (as[k] == NULL)
            continue;
        if (first)
            scaling = as[k]->scaling;
        else if (as[k]->scaling != scaling)
            uniform = 0;
        first = 0;
    }
    if (!uniform)
        scaling = 1.0;

    /* Parts in B-row order, so the zero fill of uncovered rows is one pass. */
    uint64_t c = 0, row = 0;
    uint64_t *col = &cx->col[cx->base[i]];
    for (size_t k = 0; k < np; k++) {
        col[k] = c;
        if (as[k] != NULL)
            c += as[k]->rank;
    }
    for (;;) {
        /* Next part by out_offset at or after `row`. */
        size_t best = np;
        for (size_t k = 0; k < np; k++) {
            uint64_t off = t->n_parts ? (uint64_t)t->parts[k].out_offset : 0;
            if (off >= row &&
                (best == np || off < (t->n_parts ? (uint64_t)t->parts[best].out_offset : 0)))
                best = k;
        }
        if (best == np)
            break;
        uint64_t off = t->n_parts ? (uint64_t)t->parts[best].out_offset : 0;
        uint64_t rows = t->n_parts ? (uint64_t)t->parts[best].out_features : out;
        wsync_zero(p, B + row * pb, pb, off - row, pb);
        const wsync_adapter_module_t *m = as[best];
        if (m == NULL) {
            wsync_zero(p, B + off * pb, pb, rows, pb);
        } else {
            uint64_t r = m->rank, c0 = col[best];
            uint64_t sa = wsync_dtype_size(m->a.dtype), sb = wsync_dtype_size(m->b.dtype);
            wsync_copy(p, &m->a, in * sa, A + c0 * pa, t->dtype, pa, r, in, 1.0);
            wsync_copy(p, &m->b, r * sb, B + off * pb + c0 * esz, t->dtype, pb, rows, r,
                       uniform ? 1.0 : m->scaling);
            wsync_zero(p, B + off * pb, pb, rows, c0 * esz);
            wsync_zero(p, B + off * pb + (c0 + r) * esz, pb, rows, (R - c0 - r) * esz);
        }
        row = off + rows;
    }
    wsync_zero(p, B + row * pb, pb, out - row, pb);
    wsync_zero(p, A + c * pa, pa, R - c, pa);
    p->values[i].rank = (uint32_t)c;
    p->values[i].scaling = c ? (float)scaling : 0.0f;
}

static void wsync_ctx_free(wsync_plan_ctx_t *cx)
{
    for (size_t k = 0; cx->entries && k < cx->n_entries; k++)
        free(cx->entries[k].owned);
    free(cx->entries);
    free(cx->assign);
    free(cx->col);
    free(cx->base);
}

static wsync_result_t wsync_plan_alloc(wsync_plan_ctx_t *cx, wsync_error_t *err)
{
    size_t nt = cx->slot->n_targets, ne = cx->base[nt];
    wsync_adapter_plan_t *p = calloc(1, sizeof(*p));
    if (p != NULL) {
        p->copies = calloc(2 * ne + 1, sizeof(*p->copies));
        p->zeros = calloc(3 * ne + 2 * nt + 1, sizeof(*p->zeros));
        p->values = calloc(nt + 1, sizeof(*p->values));
        p->n_targets = nt;
    }
    cx->plan = p;
    if (p == NULL || p->copies == NULL || p->zeros == NULL || p->values == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "adapter plan for %zu targets", nt);
    return WSYNC_OK;
}

static wsync_result_t wsync_plan_make(const wsync_adapter_t *a, const wsync_adapter_slot_t *slot,
                                      wsync_adapter_plan_t **out, wsync_error_t *err)
{
    if (out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int active = 0;
    wsync_result_t rc = wsync_check_slot(slot, &active, err);
    if (rc != WSYNC_OK)
        return rc;
    wsync_plan_ctx_t cx = {.slot = slot};
    rc = wsync_build_entries(&cx, err);
    if (rc == WSYNC_OK && a != NULL)
        rc = wsync_assign(&cx, a, err);
    if (rc == WSYNC_OK)
        rc = wsync_plan_alloc(&cx, err);
    if (rc == WSYNC_OK) {
        cx.plan->shadow = 1 - active;
        cx.plan->src_memory = a ? a->memory : WSYNC_ADAPTER_MEM_HOST;
        for (size_t i = 0; i < slot->n_targets; i++)
            wsync_plan_target(&cx, i);
        *out = cx.plan;
        cx.plan = NULL;
    }
    wsync_adapter_plan_free(cx.plan);
    wsync_ctx_free(&cx);
    return rc;
}

wsync_result_t wsync_adapter_plan_build(const wsync_adapter_t *a, const wsync_adapter_slot_t *slot,
                                        wsync_adapter_plan_t **out, wsync_error_t *err)
{
    if (a == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "adapter must not be NULL");
    return wsync_plan_make(a, slot, out, err);
}

wsync_result_t wsync_adapter_plan_build_empty(const wsync_adapter_slot_t *slot,
                                              wsync_adapter_plan_t **out, wsync_error_t *err)
{
    return wsync_plan_make(NULL, slot, out, err);
}

void wsync_adapter_plan_free(wsync_adapter_plan_t *plan)
{
    if (plan == NULL)
        return;
    free(plan->copies);
    free(plan->zeros);
    free(plan->values);
    free(plan);
}

wsync_result_t wsync_adapter_plan_exec_host(const wsync_adapter_plan_t *plan, wsync_error_t *err)
{
    if (plan == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "plan must not be NULL");
    for (size_t k = 0; k < plan->n_zeros; k++) {
        const wsync_adapter_zero_op_t *z = &plan->zeros[k];
        for (uint64_t r = 0; r < z->rows; r++)
            memset((uint8_t *)z->dst + r * z->dst_pitch, 0, z->row_bytes);
    }
    for (size_t k = 0; k < plan->n_copies; k++) {
        const wsync_adapter_copy_op_t *c = &plan->copies[k];
        for (uint64_t r = 0; r < c->rows; r++)
            wsync_convert_row((uint8_t *)c->dst + r * c->dst_pitch, c->dst_dtype,
                              (const uint8_t *)c->src + r * c->src_pitch, c->src_dtype, c->cols,
                              c->scale);
    }
    return WSYNC_OK;
}

wsync_result_t wsync_adapter_commit(wsync_adapter_slot_t *slot, const wsync_adapter_plan_t *plan,
                                    wsync_error_t *err)
{
    if (slot == NULL || plan == NULL || !WSYNC_HAS_FIELD(wsync_adapter_slot_t, slot, active) ||
        slot->active == NULL || plan->n_targets != slot->n_targets)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "slot/plan NULL or the plan was built for another slot");
    int s = plan->shadow;
    if (__atomic_load_n(slot->active, __ATOMIC_ACQUIRE) != 1 - s)
        return WSYNC_FAIL(err, WSYNC_ERR_BUSY,
                          "slot \"%s\": *active changed while the adapter was loading (another "
                          "loader?); nothing switched, load again",
                          slot->adapter_name ? slot->adapter_name : "");
    for (size_t i = 0; i < slot->n_targets; i++) {
        slot->targets[i].rank[s] = plan->values[i].rank;
        slot->targets[i].scaling[s] = plan->values[i].scaling;
    }
    __atomic_store_n(slot->active, s, __ATOMIC_RELEASE);
    return WSYNC_OK;
}
