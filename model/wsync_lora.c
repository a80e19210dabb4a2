/* The demo's synthetic adapter; see wsync_lora.h. */
#include "wsync_lora.h"

#include "wsync_safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int wsync_lora_linear(const char *name)
{
    size_t n = strlen(name);
    return strncmp(name, "model.layers.", 13) == 0 && n > 12 &&
           strcmp(name + n - 12, "_proj.weight") == 0;
}

int wsync_lora_build(wsync_lora_t *l, const wsync_model_t *model, uint32_t rank, char *why,
                     size_t len)
{
    memset(l, 0, sizeof(*l));
    if (rank < 1) {
        snprintf(why, len, "LoRA rank %u must be >= 1", rank);
        return -1;
    }
    l->rank = rank;
    l->alpha = 2.0 * rank;
    l->modules = calloc(model->n ? model->n : 1, sizeof(*l->modules));
    if (l->modules == NULL) {
        snprintf(why, len, "out of memory for %zu adapter modules", model->n);
        return -1;
    }
    for (size_t i = 0; i < model->n; i++) {
        const wsync_model_tensor_t *t = &model->tensors[i];
        if (t->ndim != 2 || !wsync_lora_linear(t->name))
            continue;
        wsync_lora_module_t *m = &l->modules[l->n++];
        snprintf(m->module, sizeof(m->module), "%.*s", (int)(strlen(t->name) - 7), t->name);
        snprintf(m->name_a, sizeof(m->name_a), "base_model.model.%s.lora_A.weight", m->module);
        snprintf(m->name_b, sizeof(m->name_b), "base_model.model.%s.lora_B.weight", m->module);
        m->out = t->shape[0];
        m->in = t->shape[1];
        l->bytes += 2u * rank * (uint64_t)(m->in + m->out);
    }
    if (l->n == 0) {
        snprintf(why, len, "layout %s has no linear layer modules", model->layout);
        wsync_lora_free(l);
        return -1;
    }
    return 0;
}

void wsync_lora_free(wsync_lora_t *l)
{
    free(l->modules);
    memset(l, 0, sizeof(*l));
}

char *wsync_lora_config_json(const wsync_lora_t *l)
{
    char *s = malloc(256);
    if (s != NULL)
        snprintf(s, 256,
                 "{\"peft_type\": \"LORA\", \"r\": %u, \"lora_alpha\": %.1f, "
                 "\"target_modules\": \"all-linear\", \"bias\": \"none\"}",
                 l->rank, l->alpha);
    return s;
}

/* Element i: a multiple of 1/64 in [-2, 2): at most 8 significant bits, exact in bf16. */
static uint16_t wsync_lora_value(size_t m, int b, uint64_t i, uint64_t version)
{
    uint64_t z = (i * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)m << 32) ^ ((uint64_t)b << 31) ^
                 (version * 0xBF58476D1CE4E5B9ull);
    z ^= z >> 29;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 32;
    float f = (float)((int)(z & 255) - 128) / 64.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

void wsync_lora_fill(const wsync_lora_t *l, size_t m, int b, uint64_t version, uint16_t *dst)
{
    const wsync_lora_module_t *mod = &l->modules[m];
    uint64_t n = (uint64_t)l->rank * (uint64_t)(b ? mod->out : mod->in);
    for (uint64_t i = 0; i < n; i++)
        dst[i] = wsync_lora_value(m, b, i, version);
}

void wsync_lora_expected(const wsync_lora_t *l, size_t m, int b, uint64_t version,
                         uint32_t max_rank, uint16_t *dst)
{
    const wsync_lora_module_t *mod = &l->modules[m];
    int64_t rows = b ? mod->out : max_rank, cols = b ? max_rank : mod->in;
    memset(dst, 0, (size_t)(rows * cols) * 2);
    for (int64_t r = 0; r < (b ? mod->out : (int64_t)l->rank); r++)
        for (int64_t c = 0; c < (b ? (int64_t)l->rank : mod->in); c++) {
            uint64_t src = b ? (uint64_t)(r * l->rank + c) : (uint64_t)(r * mod->in + c);
            dst[r * cols + c] = wsync_lora_value(m, b, src, version);
        }
}

int wsync_lora_write_dir(const wsync_lora_t *l, uint64_t version, const char *dir,
                         wsync_dtype_t dtype, const char *extra_module, char *why, size_t len)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    size_t n = 2 * l->n + (extra_module ? 2 : 0), max = 0;
    wsync_st_write_tensor_t *w = calloc(n, sizeof(*w));
    uint32_t **data = calloc(n, sizeof(*data));
    char path[4200], extra_names[2][WSYNC_LORA_NAME_MAX];
    int rc = -1;

    for (size_t m = 0; m < l->n; m++) {
        max = (size_t)l->modules[m].in > max ? (size_t)l->modules[m].in : max;
        max = (size_t)l->modules[m].out > max ? (size_t)l->modules[m].out : max;
    }
    uint16_t *tmp = malloc(2 * max * l->rank);
    if (w == NULL || data == NULL || tmp == NULL) {
        snprintf(why, len, "out of memory writing an adapter of %zu tensors", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        size_t m = i / 2 < l->n ? i / 2 : 0; /* the extra module takes module 0's shapes */
        int b = (int)(i % 2);
        int64_t rows = b ? l->modules[m].out : l->rank, cols = b ? l->rank : l->modules[m].in;
        const char *name = b ? l->modules[m].name_b : l->modules[m].name_a;
        data[i] = malloc(4u * (size_t)(rows * cols));
        if (data[i] == NULL) {
            snprintf(why, len, "out of memory writing an adapter");
            goto out;
        }
        wsync_lora_fill(l, m, b, version, tmp);
        if (dtype == WSYNC_DTYPE_BF16)
            memcpy(data[i], tmp, 2u * (size_t)(rows * cols));
        else
            for (int64_t k = 0; k < rows * cols; k++)
                data[i][k] = (uint32_t)tmp[k] << 16; /* bf16 -> f32 is exact */
        if (i / 2 >= l->n) {
            snprintf(extra_names[b], sizeof(extra_names[b]), "base_model.model.%s.lora_%s.weight",
                     extra_module, b ? "B" : "A");
            name = extra_names[b];
        }
        w[i] = (wsync_st_write_tensor_t){
            .name = name, .dtype = dtype, .ndim = 2, .shape = {rows, cols}, .data = data[i]};
    }
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    if (wsync_safetensors_write(path, w, n, NULL, &err) != WSYNC_OK) {
        snprintf(why, len, "%s", err.message);
        goto out;
    }
    snprintf(path, sizeof(path), "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(why, len, "cannot write %s", path);
        goto out;
    }
    const char *extra = extra_module ? strrchr(extra_module, '.') : NULL;
    fprintf(f,
            "{\"peft_type\": \"LORA\", \"r\": %u, \"lora_alpha\": %.1f, \"target_modules\": "
            "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", "
            "\"down_proj\"%s%s%s]}",
            l->rank, l->alpha, extra ? ", \"" : "", extra ? extra + 1 : "", extra ? "\"" : "");
    rc = fclose(f) == 0 ? 0 : -1;
out:
    for (size_t i = 0; data != NULL && i < n; i++)
        free(data[i]);
    free(data);
    free(tmp);
    free(w);
    return rc;
}
