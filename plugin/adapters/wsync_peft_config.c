/* adapter_config.json (PEFT LoRA) parsing and PEFT's module-matching rules. */
#include "wsync_peft_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "wsync_error.h"
#include "wsync_pyregex.h"

#define WSYNC_PEFT_WHAT "adapter_config.json"

typedef enum wsync_peft_match_kind {
    WSYNC_PEFT_MATCH_NONE = 0, /* key absent or null */
    WSYNC_PEFT_MATCH_LIST = 1,
    WSYNC_PEFT_MATCH_REGEX = 2,
    WSYNC_PEFT_MATCH_ALL_LINEAR = 3
} wsync_peft_match_kind_t;

/* A target_modules / exclude_modules value. */
typedef struct wsync_peft_match {
    wsync_peft_match_kind_t kind;
    const char **names; /* LIST: borrowed from cfg->root */
    size_t n_names;
    wsync_pyregex_t rx; /* REGEX */
} wsync_peft_match_t;

typedef struct wsync_peft_pattern {
    wsync_pyregex_t rx;
    double value;
} wsync_peft_pattern_t;

struct wsync_peft_config {
    json_t *root;
    uint32_t r;
    double alpha;
    int use_rslora;
    wsync_peft_match_t targets;
    wsync_peft_match_t excludes;
    wsync_peft_pattern_t *rank_pattern;
    size_t n_rank_pattern;
    wsync_peft_pattern_t *alpha_pattern;
    size_t n_alpha_pattern;
};

static wsync_result_t wsync_peft_parse_match(json_t *v, const char *key, int allow_all_linear,
                                             wsync_peft_match_t *m, wsync_error_t *err)
{
    if (v == NULL || json_is_null(v))
        return WSYNC_OK;
    if (json_is_string(v)) {
        if (allow_all_linear && strcmp(json_string_value(v), "all-linear") == 0) {
            m->kind = WSYNC_PEFT_MATCH_ALL_LINEAR;
            return WSYNC_OK;
        }
        m->kind = WSYNC_PEFT_MATCH_REGEX;
        char what[64];
        snprintf(what, sizeof(what), WSYNC_PEFT_WHAT " %s", key);
        return wsync_pyregex_compile(&m->rx, NULL, json_string_value(v), what, err);
    }
    if (!json_is_array(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"%s\" must be a list of module names or a regex "
                                          "string",
                          key);
    m->kind = WSYNC_PEFT_MATCH_LIST;
    m->n_names = json_array_size(v);
    m->names = calloc(m->n_names ? m->n_names : 1, sizeof(*m->names));
    if (m->names == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%s: %zu names", key, m->n_names);
    for (size_t i = 0; i < m->n_names; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e) || json_string_length(e) == 0)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                              WSYNC_PEFT_WHAT ": \"%s\"[%zu] is not a non-empty string", key, i);
        m->names[i] = json_string_value(e);
    }
    return WSYNC_OK;
}

static int wsync_peft_match(const wsync_peft_match_t *m, const char *module)
{
    switch (m->kind) {
    case WSYNC_PEFT_MATCH_NONE:
        return 0;
    case WSYNC_PEFT_MATCH_REGEX:
        return wsync_pyregex_match(&m->rx, module);
    case WSYNC_PEFT_MATCH_ALL_LINEAR: {
        const char *last = strrchr(module, '.');
        return strcmp(last ? last + 1 : module, "lm_head") != 0;
    }
    case WSYNC_PEFT_MATCH_LIST:
        break;
    }
    size_t ml = strlen(module);
    for (size_t i = 0; i < m->n_names; i++) {
        size_t nl = strlen(m->names[i]);
        if (strcmp(module, m->names[i]) == 0)
            return 1;
        if (ml > nl && module[ml - nl - 1] == '.' && strcmp(module + ml - nl, m->names[i]) == 0)
            return 1;
    }
    return 0;
}

static wsync_result_t wsync_peft_parse_patterns(json_t *v, const char *key, int integral,
                                                wsync_peft_pattern_t **out, size_t *n,
                                                wsync_error_t *err)
{
    if (v == NULL || json_is_null(v))
        return WSYNC_OK;
    if (!json_is_object(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"%s\" must be an object of module pattern -> %s", key,
                          integral ? "rank" : "alpha");
    size_t cap = json_object_size(v);
    *out = calloc(cap ? cap : 1, sizeof(**out));
    if (*out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "%s: %zu patterns", key, cap);
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e)
    {
        wsync_peft_pattern_t *p = &(*out)[*n];
        if (integral ? !(json_is_integer(e) && json_integer_value(e) > 0 &&
                         json_integer_value(e) <= UINT32_MAX)
                     : !(json_is_number(e) && isfinite(json_number_value(e))))
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, WSYNC_PEFT_WHAT ": %s[\"%s\"] must be %s",
                              key, k, integral ? "an integer > 0" : "a finite number");
        char what[96];
        snprintf(what, sizeof(what), WSYNC_PEFT_WHAT " %s key", key);
        wsync_result_t rc = wsync_pyregex_compile(&p->rx, "(.*\\.)?", k, what, err);
        if (rc != WSYNC_OK)
            return rc;
        p->value = json_number_value(e);
        (*n)++;
    }
    return WSYNC_OK;
}

/* A key that must be false/absent (or null) for wsync to serve the adapter. */
static wsync_result_t wsync_peft_refuse_true(json_t *root, const char *key, const char *why,
                                             wsync_error_t *err)
{
    json_t *v = json_object_get(root, key);
    if (v == NULL || json_is_null(v) || json_is_false(v))
        return WSYNC_OK;
    if (!json_is_boolean(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, WSYNC_PEFT_WHAT ": \"%s\" must be a bool",
                          key);
    return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                      WSYNC_PEFT_WHAT ": %s true is not supported: %s", key, why);
}

static wsync_result_t wsync_peft_check_unsupported(json_t *root, wsync_error_t *err)
{
    json_t *v = json_object_get(root, "peft_type");
    if (v != NULL && !json_is_null(v) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "LORA") == 0))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          WSYNC_PEFT_WHAT ": peft_type %s is not supported: only LORA adapters "
                                          "can be loaded",
                          json_is_string(v) ? json_string_value(v) : "(not a string)");
    v = json_object_get(root, "bias");
    if (v != NULL && !json_is_null(v) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          WSYNC_PEFT_WHAT ": bias \"%s\" is not supported: trained biases change "
                                          "base weights; train with bias=\"none\"",
                          json_is_string(v) ? json_string_value(v) : "(not a string)");
    v = json_object_get(root, "modules_to_save");
    if (v != NULL && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0)) {
        char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        wsync_result_t rc = WSYNC_FAIL(
            err, WSYNC_ERR_NOT_SUPPORTED,
            "modules_to_save %.120s is not supported: full copies of base modules cannot be "
            "hot-loaded into a LoRA slot; sync them as weights instead",
            txt ? txt : "(?)");
        free(txt);
        return rc;
    }
    v = json_object_get(root, "layer_replication");
    if (v != NULL && !json_is_null(v))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          WSYNC_PEFT_WHAT ": layer_replication is not supported: it changes the "
                                          "engine's layer structure");
    v = json_object_get(root, "target_parameters");
    if (v != NULL && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          WSYNC_PEFT_WHAT ": target_parameters is not supported: only LoRA on "
                                          "modules (target_modules) can be loaded");
    wsync_result_t rc = wsync_peft_refuse_true(
        root, "use_dora", "DoRA needs a magnitude vector the engine slot has no room for", err);
    if (rc == WSYNC_OK)
        rc = wsync_peft_refuse_true(root, "fan_in_fan_out",
                                    "Conv1D-style (transposed) weights are not supported", err);
    if (rc == WSYNC_OK)
        rc = wsync_peft_refuse_true(root, "lora_bias", "the slot has no LoRA bias vector", err);
    return rc;
}

static wsync_result_t wsync_peft_parse_root(wsync_peft_config_t *cfg, wsync_error_t *err)
{
    json_t *root = cfg->root;
    wsync_result_t rc = wsync_peft_check_unsupported(root, err);
    if (rc != WSYNC_OK)
        return rc;

    json_t *v = json_object_get(root, "r");
    if (v == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, WSYNC_PEFT_WHAT ": \"r\" is missing");
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > UINT32_MAX) {
        char got[48];
        if (json_is_number(v))
            snprintf(got, sizeof(got), "%s %g", json_is_integer(v) ? "integer" : "non-integer",
                     json_number_value(v));
        else
            snprintf(got, sizeof(got), "a JSON %s", json_is_string(v) ? "string" : "non-number");
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"r\" must be an integer > 0 (got %s)", got);
    }
    cfg->r = (uint32_t)json_integer_value(v);

    v = json_object_get(root, "lora_alpha");
    if (v == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"lora_alpha\" is missing");
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"lora_alpha\" must be a finite number");
    cfg->alpha = json_number_value(v);

    v = json_object_get(root, "use_rslora");
    if (v != NULL && !json_is_null(v) && !json_is_boolean(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"use_rslora\" must be a bool");
    cfg->use_rslora = json_is_true(v);

    v = json_object_get(root, "target_modules");
    if (v == NULL || json_is_null(v))
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          WSYNC_PEFT_WHAT ": \"target_modules\" is missing; list the modules the "
                                          "adapter trains");
    rc = wsync_peft_parse_match(v, "target_modules", 1, &cfg->targets, err);
    if (rc == WSYNC_OK)
        rc = wsync_peft_parse_match(json_object_get(root, "exclude_modules"), "exclude_modules", 0,
                                    &cfg->excludes, err);
    if (rc == WSYNC_OK)
        rc = wsync_peft_parse_patterns(json_object_get(root, "rank_pattern"), "rank_pattern", 1,
                                       &cfg->rank_pattern, &cfg->n_rank_pattern, err);
    if (rc == WSYNC_OK)
        rc = wsync_peft_parse_patterns(json_object_get(root, "alpha_pattern"), "alpha_pattern", 0,
                                       &cfg->alpha_pattern, &cfg->n_alpha_pattern, err);
    return rc;
}

wsync_result_t wsync_peft_config_parse(const char *json, size_t len, wsync_peft_config_t **out,
                                       wsync_error_t *err)
{
    if (json == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "json/out must not be NULL");
    *out = NULL;
    wsync_peft_config_t *cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "PEFT config");
    json_error_t jerr;
    cfg->root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    wsync_result_t rc;
    if (cfg->root == NULL)
        rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                        WSYNC_PEFT_WHAT " is not valid JSON: %s (line %d, column %d)", jerr.text,
                        jerr.line, jerr.column);
    else if (!json_is_object(cfg->root))
        rc = WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, WSYNC_PEFT_WHAT " is not a JSON object");
    else
        rc = wsync_peft_parse_root(cfg, err);
    if (rc != WSYNC_OK) {
        wsync_peft_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return WSYNC_OK;
}

void wsync_peft_config_free(wsync_peft_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < cfg->n_rank_pattern; i++)
        wsync_pyregex_free(&cfg->rank_pattern[i].rx);
    for (size_t i = 0; i < cfg->n_alpha_pattern; i++)
        wsync_pyregex_free(&cfg->alpha_pattern[i].rx);
    free(cfg->rank_pattern);
    free(cfg->alpha_pattern);
    wsync_pyregex_free(&cfg->targets.rx);
    wsync_pyregex_free(&cfg->excludes.rx);
    free(cfg->targets.names);
    free(cfg->excludes.names);
    json_decref(cfg->root);
    free(cfg);
}

int wsync_peft_config_targets(const wsync_peft_config_t *cfg, const char *module)
{
    if (wsync_peft_match(&cfg->excludes, module))
        return 0;
    return wsync_peft_match(&cfg->targets, module);
}

static const wsync_peft_pattern_t *wsync_peft_find(const wsync_peft_pattern_t *p, size_t n,
                                                   const char *module)
{
    for (size_t i = 0; i < n; i++)
        if (wsync_pyregex_match(&p[i].rx, module))
            return &p[i];
    return NULL;
}

uint32_t wsync_peft_config_rank(const wsync_peft_config_t *cfg, const char *module)
{
    const wsync_peft_pattern_t *p = wsync_peft_find(cfg->rank_pattern, cfg->n_rank_pattern, module);
    return p ? (uint32_t)p->value : cfg->r;
}

double wsync_peft_config_alpha(const wsync_peft_config_t *cfg, const char *module)
{
    const wsync_peft_pattern_t *p =
        wsync_peft_find(cfg->alpha_pattern, cfg->n_alpha_pattern, module);
    return p ? p->value : cfg->alpha;
}

double wsync_peft_config_scaling(const wsync_peft_config_t *cfg, uint32_t rank, double alpha)
{
    return cfg->use_rslora ? alpha / sqrt((double)rank) : alpha / (double)rank;
}

int wsync_peft_config_use_rslora(const wsync_peft_config_t *cfg)
{
    return cfg->use_rslora;
}
