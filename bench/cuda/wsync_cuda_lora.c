/* See wsync_cuda_lora.h. */
#include "wsync_cuda_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <jansson.h>

#include "wsync_convert.h"
#include "wsync_dtype.h"
#include "wsync_safetensors.h"

static uint64_t wl_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Mostly values in [-2, 2) with full double mantissas; every 97th tiny, every 89th huge. */
static double wl_value(uint64_t *s, uint64_t i)
{
    double v = ((double)(wl_next(s) >> 11) / 9007199254740992.0) * 4.0 - 2.0;
    if (i % 97 == 3)
        v *= 1e-6;
    if (i % 89 == 5)
        v *= 3e4;
    return v;
}

int wl_write_dir(const char *dir, const char *config, const wl_module_t *m, size_t n, uint64_t seed,
                 char *why, size_t why_len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(config, f) < 0 || fclose(f) != 0) {
        snprintf(why, why_len, "cannot write %s", path);
        return -1;
    }
    wsync_st_write_tensor_t *t = calloc(2 * n, sizeof(*t));
    char(*names)[192] = calloc(2 * n, sizeof(*names));
    unsigned char **data = calloc(2 * n, sizeof(*data));
    uint64_t s = seed;
    for (size_t k = 0; k < 2 * n; k++) {
        const wl_module_t *x = &m[k / 2];
        const int is_b = k % 2;
        snprintf(names[k], sizeof(names[k]), "base_model.model.%s.lora_%c.weight", x->hf,
                 is_b ? 'B' : 'A');
        t[k].name = names[k];
        t[k].dtype = x->dtype;
        t[k].ndim = 2;
        t[k].shape[0] = is_b ? x->out : x->r;
        t[k].shape[1] = is_b ? x->r : x->in;
        uint64_t count = (uint64_t)(t[k].shape[0] * t[k].shape[1]);
        data[k] = malloc(count * wsync_dtype_size(x->dtype) + 1);
        for (uint64_t i = 0; i < count; i++) {
            double v = wl_value(&s, i);
            wsync_convert_row(data[k] + i * wsync_dtype_size(x->dtype), x->dtype, &v,
                              WSYNC_DTYPE_F64, 1, 1.0);
        }
        t[k].data = data[k];
    }
    json_t *meta = json_pack("{s:s}", "format", "pt");
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    wsync_error_t err = {.struct_size = sizeof(err)};
    wsync_result_t rc = wsync_safetensors_write(path, t, 2 * n, meta, &err);
    json_decref(meta);
    for (size_t k = 0; k < 2 * n; k++)
        free(data[k]);
    free(data);
    free(names);
    free(t);
    if (rc != WSYNC_OK) {
        snprintf(why, why_len, "%s", err.message);
        return -1;
    }
    return 0;
}

int wl_slot_init(wl_slot_t *s, const char *name, uint32_t max_rank, const wl_target_t *t, size_t n,
                 int on_device)
{
    memset(s, 0, sizeof(*s));
    s->on_device = on_device;
    s->targets = calloc(n, sizeof(*s->targets));
    s->parts = calloc(4 * n, sizeof(*s->parts));
    s->a_bytes = calloc(n, sizeof(size_t));
    s->b_bytes = calloc(n, sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        wsync_adapter_target_t *x = &s->targets[i];
        x->struct_size = sizeof(*x);
        x->module = t[i].module;
        x->dtype = t[i].dtype;
        x->in_features = t[i].in;
        x->out_features = t[i].out;
        x->n_parts = t[i].n_parts;
        for (size_t p = 0; p < t[i].n_parts; p++) {
            s->parts[4 * i + p].hf_module = t[i].part_names[p];
            s->parts[4 * i + p].out_offset = t[i].part_offset[p];
            s->parts[4 * i + p].out_features = t[i].part_out[p];
        }
        x->parts = t[i].n_parts ? &s->parts[4 * i] : NULL;
        s->a_bytes[i] = (size_t)max_rank * (size_t)t[i].in * wsync_dtype_size(t[i].dtype);
        s->b_bytes[i] = (size_t)t[i].out * max_rank * wsync_dtype_size(t[i].dtype);
        for (int c = 0; c < 2; c++) {
            void **ab[2] = {&x->lora_a[c], &x->lora_b[c]};
            size_t sz[2] = {s->a_bytes[i], s->b_bytes[i]};
            for (int k = 0; k < 2; k++) {
                if (on_device) {
                    if (cudaMalloc(ab[k], sz[k]) != cudaSuccess ||
                        cudaMemset(*ab[k], 0xA5, sz[k]) != cudaSuccess)
                        return -1;
                } else {
                    *ab[k] = malloc(sz[k]);
                    if (*ab[k] == NULL)
                        return -1;
                    memset(*ab[k], 0xA5, sz[k]);
                }
            }
        }
    }
    s->slot.struct_size = sizeof(s->slot);
    s->slot.adapter_name = name;
    s->slot.max_rank = max_rank;
    s->slot.n_targets = n;
    s->slot.targets = s->targets;
    s->slot.active = &s->active;
    return 0;
}

void wl_slot_free(wl_slot_t *s)
{
    for (size_t i = 0; i < s->slot.n_targets; i++)
        for (int c = 0; c < 2; c++) {
            if (s->on_device) {
                cudaFree(s->targets[i].lora_a[c]);
                cudaFree(s->targets[i].lora_b[c]);
            } else {
                free(s->targets[i].lora_a[c]);
                free(s->targets[i].lora_b[c]);
            }
        }
    free(s->targets);
    free(s->parts);
    free(s->a_bytes);
    free(s->b_bytes);
    memset(s, 0, sizeof(*s));
}

static uint64_t wl_diff(const unsigned char *a, const unsigned char *b, size_t n, size_t *first)
{
    uint64_t d = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            if (d == 0)
                *first = i;
            d++;
        }
    return d;
}

uint64_t wl_slot_compare(const wl_slot_t *dev, const wl_slot_t *host, int idx, char *why,
                         size_t why_len)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < dev->slot.n_targets; i++) {
        const wsync_adapter_target_t *d = &dev->targets[i], *h = &host->targets[i];
        for (int k = 0; k < 2; k++) {
            size_t n = k ? dev->b_bytes[i] : dev->a_bytes[i];
            unsigned char *tmp = malloc(n);
            if (cudaMemcpy(tmp, k ? d->lora_b[idx] : d->lora_a[idx], n, cudaMemcpyDeviceToHost) !=
                cudaSuccess) {
                snprintf(why, why_len, "cudaMemcpy failed");
                free(tmp);
                return bad + 1;
            }
            size_t first = 0;
            uint64_t x = wl_diff(tmp, k ? h->lora_b[idx] : h->lora_a[idx], n, &first);
            if (x && bad == 0)
                snprintf(why, why_len, "%s %s: %llu bytes differ, first at byte %zu (%02x vs %02x)",
                         d->module, k ? "B" : "A", (unsigned long long)x, first, tmp[first],
                         ((unsigned char *)(k ? h->lora_b[idx] : h->lora_a[idx]))[first]);
            bad += x;
            free(tmp);
        }
        if (d->rank[idx] != h->rank[idx] || d->scaling[idx] != h->scaling[idx]) {
            if (bad == 0)
                snprintf(why, why_len, "%s: rank %u scaling %g, host %u %g", d->module,
                         d->rank[idx], d->scaling[idx], h->rank[idx], h->scaling[idx]);
            bad++;
        }
    }
    return bad;
}

int wl_slot_all(const wl_slot_t *dev, int idx, unsigned char byte)
{
    for (size_t i = 0; i < dev->slot.n_targets; i++)
        for (int k = 0; k < 2; k++) {
            size_t n = k ? dev->b_bytes[i] : dev->a_bytes[i];
            unsigned char *tmp = malloc(n);
            const wsync_adapter_target_t *d = &dev->targets[i];
            int ok = cudaMemcpy(tmp, k ? d->lora_b[idx] : d->lora_a[idx], n,
                                cudaMemcpyDeviceToHost) == cudaSuccess;
            for (size_t j = 0; ok && j < n; j++)
                ok = tmp[j] == byte;
            free(tmp);
            if (!ok)
                return 0;
        }
    return 1;
}

void wl_qwen3_8b(unsigned layers, int64_t r, wl_target_t **t, wl_module_t **m, size_t *n)
{
    static const struct {
        const char *name;
        int64_t in, out;
    } mods[7] = {{"self_attn.q_proj", 4096, 4096}, {"self_attn.k_proj", 4096, 1024},
                 {"self_attn.v_proj", 4096, 1024}, {"self_attn.o_proj", 4096, 4096},
                 {"mlp.gate_proj", 4096, 12288},   {"mlp.up_proj", 4096, 12288},
                 {"mlp.down_proj", 12288, 4096}};
    *n = (size_t)layers * 7;
    *t = calloc(*n, sizeof(**t));
    *m = calloc(*n, sizeof(**m));
    for (unsigned l = 0; l < layers; l++)
        for (int k = 0; k < 7; k++) {
            size_t i = (size_t)l * 7 + (size_t)k;
            snprintf((*t)[i].module, sizeof((*t)[i].module), "model.layers.%u.%s", l, mods[k].name);
            (*t)[i].in = mods[k].in;
            (*t)[i].out = mods[k].out;
            (*t)[i].dtype = WSYNC_DTYPE_BF16;
            snprintf((*m)[i].hf, sizeof((*m)[i].hf), "%s", (*t)[i].module);
            (*m)[i].r = r;
            (*m)[i].in = mods[k].in;
            (*m)[i].out = mods[k].out;
            (*m)[i].dtype = WSYNC_DTYPE_BF16;
        }
}
