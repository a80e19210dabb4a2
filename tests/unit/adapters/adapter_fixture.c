/* Fixtures for the adapter tests; see adapter_fixture.h. Aborts on setup failures (tests only). */
#define _GNU_SOURCE
#include "adapter_fixture.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "wsync_convert.h"
#include "wsync_dtype.h"
#include "wsync_safetensors.h"

#define FX_CHECK(c)                                                                                \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fixture failure: %s (%s:%d)\n", #c, __FILE__, __LINE__);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

double fx_value(uint32_t seed, uint64_t i)
{
    uint64_t h = (uint64_t)seed * 2654435761u + i * 40503u + 17;
    h ^= h >> 13;
    return (double)((int64_t)(h % 97) - 48) / 64.0;
}

void fx_store(void *p, wsync_dtype_t dt, uint64_t i, double v)
{
    uint8_t *b = p;
    float f = (float)v;
    uint32_t u;
    uint16_t h;
    switch (dt) {
    case WSYNC_DTYPE_F64:
        memcpy(b + 8 * i, &v, 8);
        break;
    case WSYNC_DTYPE_F32:
        memcpy(b + 4 * i, &f, 4);
        break;
    case WSYNC_DTYPE_BF16:
        memcpy(&u, &f, 4);
        FX_CHECK((u & 0xffff) == 0); /* fixture values are exact in bf16 */
        h = (uint16_t)(u >> 16);
        memcpy(b + 2 * i, &h, 2);
        break;
    case WSYNC_DTYPE_F16:
        h = wsync_f32_to_f16(f);
        memcpy(b + 2 * i, &h, 2);
        break;
    default:
        FX_CHECK(!"float dtype");
    }
}

double fx_load(const void *p, wsync_dtype_t dt, uint64_t i)
{
    const uint8_t *b = p;
    double d;
    float f;
    uint16_t h;
    uint32_t u;
    switch (dt) {
    case WSYNC_DTYPE_F64:
        memcpy(&d, b + 8 * i, 8);
        return d;
    case WSYNC_DTYPE_F32:
        memcpy(&f, b + 4 * i, 4);
        return f;
    case WSYNC_DTYPE_BF16:
        memcpy(&h, b + 2 * i, 2);
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    case WSYNC_DTYPE_F16:
        memcpy(&h, b + 2 * i, 2);
        return wsync_f16_to_f32(h);
    default:
        FX_CHECK(!"float dtype");
    }
    return 0;
}

void fx_tempdir(char *buf, size_t len)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, len, "%s/wsync-adapter-XXXXXX", tmp ? tmp : "/tmp");
    FX_CHECK(mkdtemp(buf) != NULL);
}

static int fx_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void fx_rmtree(const char *dir)
{
    nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void fx_write_text(const char *dir, const char *file, const char *text)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    FX_CHECK(f != NULL);
    FX_CHECK(fwrite(text, 1, strlen(text), f) == strlen(text));
    FX_CHECK(fclose(f) == 0);
}

void fx_write_adapter(const char *dir, const fx_module_t *mods, size_t n)
{
    wsync_st_write_tensor_t *t = calloc(2 * n, sizeof(*t));
    char **names = calloc(2 * n, sizeof(*names));
    void **bufs = calloc(2 * n, sizeof(*bufs));
    FX_CHECK(t && names && bufs);
    for (size_t k = 0; k < n; k++) {
        const fx_module_t *m = &mods[k];
        for (int isb = 0; isb < 2; isb++) {
            size_t j = 2 * k + (size_t)isb;
            int64_t rows = isb ? m->out : m->r, cols = isb ? m->r : m->in;
            FX_CHECK(asprintf(&names[j], "base_model.model.%s.lora_%c.weight", m->hf_module,
                              isb ? 'B' : 'A') > 0);
            bufs[j] = malloc((size_t)(rows * cols) * wsync_dtype_size(m->dtype) + 1);
            FX_CHECK(bufs[j] != NULL);
            for (int64_t i = 0; i < rows * cols; i++)
                fx_store(bufs[j], m->dtype, (uint64_t)i,
                         fx_value(m->seed + (uint32_t)isb, (uint64_t)i));
            t[j] = (wsync_st_write_tensor_t){.name = names[j],
                                             .dtype = m->dtype,
                                             .ndim = 2,
                                             .shape = {rows, cols},
                                             .data = bufs[j]};
        }
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    json_t *meta = json_pack("{s:s}", "format", "pt");
    wsync_error_t err = {.struct_size = sizeof(err)};
    FX_CHECK(wsync_safetensors_write(path, t, 2 * n, meta, &err) == WSYNC_OK);
    json_decref(meta);
    for (size_t j = 0; j < 2 * n; j++) {
        free(names[j]);
        free(bufs[j]);
    }
    free(t);
    free(names);
    free(bufs);
}

void fx_write_raw_safetensors(const char *path, const char *header, uint64_t hlen_override,
                              const void *data, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    FX_CHECK(f != NULL);
    uint64_t hlen = hlen_override ? hlen_override : strlen(header);
    uint8_t lb[8];
    for (int i = 0; i < 8; i++)
        lb[i] = (uint8_t)(hlen >> (8 * i));
    FX_CHECK(fwrite(lb, 1, 8, f) == 8);
    FX_CHECK(fwrite(header, 1, strlen(header), f) == strlen(header));
    if (data_len)
        FX_CHECK(fwrite(data, 1, data_len, f) == data_len);
    FX_CHECK(fclose(f) == 0);
}

void fx_slot_init(fx_slot_t *s, const char *name, uint32_t max_rank, const fx_target_spec_t *t,
                  size_t n)
{
    FX_CHECK(n <= 16);
    memset(s, 0, sizeof(*s));
    s->slot.struct_size = sizeof(s->slot);
    s->slot.adapter_name = name;
    s->slot.max_rank = max_rank;
    s->slot.n_targets = n;
    s->slot.targets = s->targets;
    s->slot.active = &s->active;
    for (size_t i = 0; i < n; i++) {
        wsync_adapter_target_t *g = &s->targets[i];
        size_t es = wsync_dtype_size(t[i].dtype);
        g->struct_size = sizeof(*g);
        g->module = t[i].module;
        g->dtype = t[i].dtype;
        g->in_features = t[i].in;
        g->out_features = t[i].out;
        s->a_bytes[i] = (size_t)max_rank * (size_t)t[i].in * es;
        s->b_bytes[i] = (size_t)t[i].out * (size_t)max_rank * es;
        for (int c = 0; c < 2; c++) {
            g->lora_a[c] = malloc(s->a_bytes[i]);
            g->lora_b[c] = malloc(s->b_bytes[i]);
            FX_CHECK(g->lora_a[c] && g->lora_b[c]);
            memset(g->lora_a[c], 0xA5, s->a_bytes[i]);
            memset(g->lora_b[c], 0xA5, s->b_bytes[i]);
            g->scaling[c] = -7.0f;
            g->rank[c] = 777;
        }
        g->n_parts = t[i].n_parts;
        memcpy(s->parts[i], t[i].parts, sizeof(t[i].parts));
        g->parts = t[i].n_parts ? s->parts[i] : NULL;
    }
}

void fx_slot_free(fx_slot_t *s)
{
    for (size_t i = 0; i < s->slot.n_targets; i++)
        for (int c = 0; c < 2; c++) {
            free(s->targets[i].lora_a[c]);
            free(s->targets[i].lora_b[c]);
        }
}

static size_t fx_snapshot_len(const fx_slot_t *s)
{
    size_t len = sizeof(int);
    for (size_t i = 0; i < s->slot.n_targets; i++)
        len += 2 * (s->a_bytes[i] + s->b_bytes[i]) + 2 * (sizeof(float) + sizeof(uint32_t));
    return len;
}

static void fx_snapshot_fill(const fx_slot_t *s, uint8_t *p)
{
    int active = s->active;
    memcpy(p, &active, sizeof(int));
    p += sizeof(int);
    for (size_t i = 0; i < s->slot.n_targets; i++) {
        const wsync_adapter_target_t *g = &s->targets[i];
        for (int c = 0; c < 2; c++) {
            memcpy(p, g->lora_a[c], s->a_bytes[i]);
            p += s->a_bytes[i];
            memcpy(p, g->lora_b[c], s->b_bytes[i]);
            p += s->b_bytes[i];
            memcpy(p, &g->scaling[c], sizeof(float));
            p += sizeof(float);
            memcpy(p, &g->rank[c], sizeof(uint32_t));
            p += sizeof(uint32_t);
        }
    }
}

void fx_snapshot_take(const fx_slot_t *s, fx_snapshot_t *snap)
{
    snap->len = fx_snapshot_len(s);
    snap->bytes = malloc(snap->len);
    FX_CHECK(snap->bytes != NULL);
    fx_snapshot_fill(s, snap->bytes);
}

int fx_snapshot_equal(const fx_slot_t *s, const fx_snapshot_t *snap)
{
    uint8_t *now = malloc(snap->len);
    FX_CHECK(now != NULL && fx_snapshot_len(s) == snap->len);
    fx_snapshot_fill(s, now);
    int eq = memcmp(now, snap->bytes, snap->len) == 0;
    free(now);
    return eq;
}

void fx_snapshot_free(fx_snapshot_t *snap)
{
    free(snap->bytes);
    snap->bytes = NULL;
}
