/* Adapter description: tensor names → modules, checked against adapter_config.json. */
#include "wsync_adapter.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wsync_dtype.h"
#include "wsync_error.h"
#include "wsync_peft_config.h"
#include "wsync_safetensors.h"

#define WSYNC_PEFT_PREFIX "base_model.model."

struct wsync_adapter_priv {
    wsync_peft_config_t *config;
    wsync_safetensors_t *file; /* FROM_DIR: owns the mapping and its tensor views */
    wsync_adapter_module_t *modules;
    char **names; /* one malloc'd hf_module per module */
    size_t n_names;
};

/* A tensor classified by name: which module, A or B. */
typedef struct wsync_adapter_entry {
    char *module;
    int is_b;
    const wsync_adapter_tensor_t *t;
} wsync_adapter_entry_t;

static int wsync_adapter_entry_cmp(const void *x, const void *y)
{
    const wsync_adapter_entry_t *a = x, *b = y;
    int c = strcmp(a->module, b->module);
    return c ? c : a->is_b - b->is_b;
}

static int wsync_adapter_module_cmp(const void *x, const void *y)
{
    const wsync_adapter_module_t *a = x, *b = y;
    return strcmp(a->hf_module, b->hf_module);
}

static int wsync_has_suffix(const char *s, size_t len, const char *suffix)
{
    size_t n = strlen(suffix);
    return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

/* Split a PEFT tensor name into module and A/B; refuse what a LoRA slot cannot hold. */
static wsync_result_t wsync_adapter_classify(const char *name, wsync_adapter_entry_t *e,
                                             wsync_error_t *err)
{
    const char *m = name;
    if (strncmp(m, WSYNC_PEFT_PREFIX, strlen(WSYNC_PEFT_PREFIX)) == 0)
        m += strlen(WSYNC_PEFT_PREFIX);
    size_t len = strlen(m);
    if (strstr(m, "lora_embedding_A") || strstr(m, "lora_embedding_B"))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "tensor \"%s\": LoRA on embeddings is not supported; target linear "
                          "modules only",
                          name);
    if (strstr(m, "lora_magnitude_vector"))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "tensor \"%s\": DoRA magnitude vectors are not supported; train with "
                          "use_dora=False",
                          name);
    if (wsync_has_suffix(m, len, ".lora_A.bias") || wsync_has_suffix(m, len, ".lora_B.bias"))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "tensor \"%s\": LoRA biases are not supported; train with "
                          "lora_bias=False",
                          name);
    static const char sa[] = ".lora_A.weight", sb[] = ".lora_B.weight";
    size_t cut;
    if (wsync_has_suffix(m, len, sa)) {
        e->is_b = 0;
        cut = len - strlen(sa);
    } else if (wsync_has_suffix(m, len, sb)) {
        e->is_b = 1;
        cut = len - strlen(sb);
    } else {
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "tensor \"%s\" is not a LoRA weight (expected "
                          "base_model.model.<module>.lora_A.weight or .lora_B.weight)",
                          name);
    }
    if (cut == 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, "tensor \"%s\" names no module", name);
    e->module = strndup(m, cut);
    if (e->module == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "tensor \"%s\"", name);
    return WSYNC_OK;
}

static wsync_result_t wsync_adapter_check_tensor(const wsync_adapter_tensor_t *t,
                                                 wsync_error_t *err)
{
    uint64_t want;
    if (t->name == NULL || t->name[0] == '\0')
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, "an adapter tensor has no name");
    if (wsync_tensor_nbytes(t->dtype, t->ndim, t->shape, &want) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "tensor \"%s\": bad dtype %d or shape (ndim %u)", t->name, (int)t->dtype,
                          t->ndim);
    if (want != t->nbytes || (want > 0 && t->data == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "tensor \"%s\": nbytes %llu but %s x shape is %llu bytes", t->name,
                          (unsigned long long)t->nbytes, wsync_dtype_name(t->dtype),
                          (unsigned long long)want);
    return WSYNC_OK;
}

/* Fill one module from its A and B tensors; names in messages are PEFT's. */
static wsync_result_t wsync_adapter_module_init(const wsync_peft_config_t *cfg,
                                                wsync_adapter_module_t *mod,
                                                const wsync_adapter_tensor_t *a,
                                                const wsync_adapter_tensor_t *b, wsync_error_t *err)
{
    const char *name = mod->hf_module;
    if (!wsync_peft_config_targets(cfg, name))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "module \"%s\" has LoRA tensors but adapter_config.json target_modules "
                          "(minus exclude_modules) does not name it",
                          name);
    mod->rank = wsync_peft_config_rank(cfg, name);
    mod->alpha = wsync_peft_config_alpha(cfg, name);
    mod->scaling = wsync_peft_config_scaling(cfg, mod->rank, mod->alpha);
    if (a->ndim != 2 || b->ndim != 2)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "module \"%s\": lora_A and lora_B must be 2-D (got %u-D and %u-D)", name,
                          a->ndim, b->ndim);
    if (a->shape[0] != (int64_t)mod->rank || b->shape[1] != (int64_t)mod->rank)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "module \"%s\": lora_A [%lld, %lld] and lora_B [%lld, %lld] do not have "
                          "rank %u from adapter_config.json (r / rank_pattern)",
                          name, (long long)a->shape[0], (long long)a->shape[1],
                          (long long)b->shape[0], (long long)b->shape[1], mod->rank);
    mod->a = *a;
    mod->b = *b;
    return WSYNC_OK;
}

static void wsync_adapter_entries_free(wsync_adapter_entry_t *e, size_t n)
{
    for (size_t i = 0; e != NULL && i < n; i++)
        free(e[i].module);
    free(e);
}

/* Group sorted entries into modules. Takes ownership of each entry's module string. */
static wsync_result_t wsync_adapter_group(wsync_adapter_t *ad, wsync_adapter_entry_t *e, size_t n,
                                          wsync_error_t *err)
{
    wsync_adapter_priv_t *p = ad->priv;
    p->modules = calloc(n ? n : 1, sizeof(*p->modules));
    p->names = calloc(n ? n : 1, sizeof(*p->names));
    if (p->modules == NULL || p->names == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu adapter modules", n);
    size_t nm = 0;
    for (size_t i = 0; i < n;) {
        const wsync_adapter_tensor_t *a = NULL, *b = NULL;
        size_t j = i;
        for (; j < n && strcmp(e[j].module, e[i].module) == 0; j++) {
            const wsync_adapter_tensor_t **slot = e[j].is_b ? &b : &a;
            if (*slot != NULL)
                return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                                  "module \"%s\": two lora_%c tensors (\"%s\" and \"%s\")",
                                  e[i].module, e[j].is_b ? 'B' : 'A', (*slot)->name, e[j].t->name);
            *slot = e[j].t;
        }
        if (a == NULL || b == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                              "module \"%s\": lora_%c.weight is missing (only \"%s\" present)",
                              e[i].module, a == NULL ? 'A' : 'B', (a ? a : b)->name);
        p->names[nm] = e[i].module;
        p->n_names = nm + 1;
        e[i].module = NULL;
        p->modules[nm].hf_module = p->names[nm];
        nm++;
        wsync_result_t rc = wsync_adapter_module_init(p->config, &p->modules[nm - 1], a, b, err);
        if (rc != WSYNC_OK)
            return rc;
        i = j;
    }
    ad->n_modules = nm;
    ad->modules = p->modules;
    qsort(p->modules, nm, sizeof(*p->modules), wsync_adapter_module_cmp);
    return WSYNC_OK;
}

static wsync_result_t wsync_adapter_build(wsync_adapter_t *ad, const wsync_adapter_tensor_t *t,
                                          size_t n, wsync_error_t *err)
{
    wsync_adapter_entry_t *e = calloc(n ? n : 1, sizeof(*e));
    if (e == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%zu adapter tensors", n);
    wsync_result_t rc = WSYNC_OK;
    size_t ne = 0;
    for (; rc == WSYNC_OK && ne < n; ne++) {
        rc = wsync_adapter_check_tensor(&t[ne], err);
        if (rc == WSYNC_OK)
            rc = wsync_adapter_classify(t[ne].name, &e[ne], err);
        e[ne].t = &t[ne];
    }
    if (rc == WSYNC_OK && n == 0)
        rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, "the adapter has no tensors");
    if (rc == WSYNC_OK) {
        qsort(e, n, sizeof(*e), wsync_adapter_entry_cmp);
        rc = wsync_adapter_group(ad, e, n, err);
    }
    wsync_adapter_entries_free(e, ne);
    return rc;
}

static wsync_adapter_t *wsync_adapter_alloc(wsync_adapter_memory_t memory)
{
    wsync_adapter_t *ad = calloc(1, sizeof(*ad));
    if (ad == NULL)
        return NULL;
    ad->priv = calloc(1, sizeof(*ad->priv));
    if (ad->priv == NULL) {
        free(ad);
        return NULL;
    }
    ad->memory = memory;
    return ad;
}

wsync_result_t wsync_adapter_from_tensors(const char *config_json, size_t config_len,
                                          const wsync_adapter_tensor_t *tensors, size_t n,
                                          wsync_adapter_memory_t memory, wsync_adapter_t **out,
                                          wsync_error_t *err)
{
    if (config_json == NULL || out == NULL || (n > 0 && tensors == NULL))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "config_json/tensors/out must not be NULL");
    *out = NULL;
    wsync_adapter_t *ad = wsync_adapter_alloc(memory);
    if (ad == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "adapter");
    wsync_result_t rc = wsync_peft_config_parse(config_json, config_len, &ad->priv->config, err);
    if (rc == WSYNC_OK)
        rc = wsync_adapter_build(ad, tensors, n, err);
    if (rc != WSYNC_OK) {
        wsync_adapter_free(ad);
        return rc;
    }
    *out = ad;
    return WSYNC_OK;
}

/* Read a whole small file; *out is malloc'd and NUL-terminated. */
static wsync_result_t wsync_read_small_file(const char *path, char **out, size_t *len,
                                            wsync_error_t *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return WSYNC_FAIL(err, errno == ENOENT ? WSYNC_ERR_NOT_FOUND : WSYNC_ERR_SYSTEM,
                          "open(%s): %s", path, strerror(errno));
    char *buf = malloc(WSYNC_ADAPTER_CONFIG_MAX + 1);
    if (buf == NULL) {
        fclose(f);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "reading %s", path);
    }
    size_t n = fread(buf, 1, WSYNC_ADAPTER_CONFIG_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > WSYNC_ADAPTER_CONFIG_MAX) {
        free(buf);
        return WSYNC_FAIL(err, bad ? WSYNC_ERR_SYSTEM : WSYNC_ERR_BAD_ADAPTER, "%s: %s", path,
                          bad ? "read failed" : "larger than 16 MiB");
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return WSYNC_OK;
}

static int wsync_file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Open the directory's safetensors file, or explain why there is none. */
static wsync_result_t wsync_adapter_open_weights(const char *dir, wsync_safetensors_t **st,
                                                 wsync_error_t *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    if (wsync_file_exists(path))
        return wsync_safetensors_open(path, st, err);
    snprintf(path, sizeof(path), "%s/adapter_model.bin", dir);
    if (wsync_file_exists(path))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "%s: adapter_model.bin (pickle) is not supported; save with "
                          "safe_serialization=True",
                          dir);
    return WSYNC_FAIL(err, WSYNC_ERR_NOT_FOUND,
                      "%s: no adapter_model.safetensors; is this a PEFT adapter directory?", dir);
}

/* The file's tensors, as they are (they live as long as the file stays open). */
static wsync_result_t wsync_adapter_views(wsync_adapter_t *ad, wsync_error_t *err)
{
    wsync_safetensors_t *st = ad->priv->file;
    return wsync_adapter_build(ad, wsync_safetensors_tensors(st), wsync_safetensors_count(st), err);
}

wsync_result_t wsync_adapter_from_dir(const char *path, wsync_adapter_t **out, wsync_error_t *err)
{
    if (path == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "path/out must not be NULL");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_FOUND, "%s is not a directory", path);
    wsync_adapter_t *ad = wsync_adapter_alloc(WSYNC_ADAPTER_MEM_HOST);
    if (ad == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "adapter");
    char cpath[4096];
    char *cfg = NULL;
    size_t cfg_len = 0;
    snprintf(cpath, sizeof(cpath), "%s/adapter_config.json", path);
    wsync_result_t rc = WSYNC_OK;
    if (!wsync_file_exists(cpath))
        rc = WSYNC_FAIL(err, WSYNC_ERR_NOT_FOUND,
                        "%s: adapter_config.json is missing; save the adapter with PEFT's "
                        "save_pretrained",
                        path);
    if (rc == WSYNC_OK)
        rc = wsync_read_small_file(cpath, &cfg, &cfg_len, err);
    if (rc == WSYNC_OK)
        rc = wsync_peft_config_parse(cfg, cfg_len, &ad->priv->config, err);
    if (rc == WSYNC_OK)
        rc = wsync_adapter_open_weights(path, &ad->priv->file, err);
    if (rc == WSYNC_OK)
        rc = wsync_adapter_views(ad, err);
    free(cfg);
    if (rc != WSYNC_OK) {
        wsync_adapter_free(ad);
        return rc;
    }
    *out = ad;
    return WSYNC_OK;
}

void wsync_adapter_free(wsync_adapter_t *a)
{
    if (a == NULL)
        return;
    wsync_adapter_priv_t *p = a->priv;
    if (p != NULL) {
        for (size_t i = 0; i < p->n_names; i++)
            free(p->names[i]);
        free(p->names);
        free(p->modules);
        wsync_safetensors_close(p->file);
        wsync_peft_config_free(p->config);
        free(p);
    }
    free(a);
}

const wsync_adapter_module_t *wsync_adapter_find(const wsync_adapter_t *a, const char *hf_module)
{
    if (a == NULL || hf_module == NULL)
        return NULL;
    wsync_adapter_module_t key = {.hf_module = hf_module};
    return bsearch(&key, a->modules, a->n_modules, sizeof(key), wsync_adapter_module_cmp);
}
