/* The fusion table (wsync_fusion.h). Data, and the one parser of it. */
#include "wsync_fusion.h"

#include <stdlib.h>
#include <string.h>

typedef struct wsync_fusion_proj {
    const char *name;
    wsync_fuse_t kind;
    int part;
} wsync_fusion_proj_t;

static const wsync_fusion_proj_t wsync_fusion_dense[] = {
    {"q_proj", WSYNC_FUSE_QKV, 0},      {"k_proj", WSYNC_FUSE_QKV, 1},
    {"v_proj", WSYNC_FUSE_QKV, 2},      {"gate_proj", WSYNC_FUSE_GATE_UP, 0},
    {"up_proj", WSYNC_FUSE_GATE_UP, 1},
};
static const wsync_fusion_proj_t wsync_fusion_expert[] = {
    {"gate_proj", WSYNC_FUSE_W13, 0}, {"w1", WSYNC_FUSE_W13, 0},
    {"up_proj", WSYNC_FUSE_W13, 1},   {"w3", WSYNC_FUSE_W13, 1},
    {"down_proj", WSYNC_FUSE_W2, 0},  {"w2", WSYNC_FUSE_W2, 0},
};

/* The component at c (up to the next '.' or the end) in table, or NULL. */
static const wsync_fusion_proj_t *wsync_fusion_find(const char *c, const wsync_fusion_proj_t *table,
                                                    size_t n)
{
    size_t len = strcspn(c, ".");
    for (size_t i = 0; i < n; i++)
        if (strlen(table[i].name) == len && memcmp(c, table[i].name, len) == 0)
            return &table[i];
    return NULL;
}

/* Digits only, at most 9 of them, ended by '.': the expert's number, else -1. */
static int64_t wsync_fusion_expert_no(const char *c)
{
    size_t len = strcspn(c, ".");
    if (len == 0 || len > 9 || c[len] != '.' || strspn(c, "0123456789") != len)
        return -1;
    return strtoll(c, NULL, 10);
}

wsync_fusion_t wsync_fusion_of(const char *name)
{
    wsync_fusion_t f = {
        .kind = WSYNC_FUSE_NONE, .part = 0, .expert = -1, .prefix_len = strlen(name), .suffix = ""};
    for (const char *c = name; c != NULL && *c != '\0';) {
        const char *dot = strchr(c, '.');
        const wsync_fusion_proj_t *p = NULL;
        int64_t e = -1;
        const char *proj = c;
        if (dot != NULL && (size_t)(dot - c) == strlen("experts") &&
            memcmp(c, "experts", strlen("experts")) == 0 &&
            (e = wsync_fusion_expert_no(dot + 1)) >= 0) {
            proj = strchr(dot + 1, '.') + 1;
            p = wsync_fusion_find(proj, wsync_fusion_expert,
                                  sizeof(wsync_fusion_expert) / sizeof(wsync_fusion_expert[0]));
        } else if (dot != NULL) {
            p = wsync_fusion_find(c, wsync_fusion_dense,
                                  sizeof(wsync_fusion_dense) / sizeof(wsync_fusion_dense[0]));
        }
        if (p != NULL) {
            const char *end = proj + strlen(p->name);
            f.kind = p->kind;
            f.part = p->part;
            f.expert = e;
            f.prefix_len = (size_t)(c - name);
            f.suffix = *end == '.' ? end + 1 : end;
            return f;
        }
        c = dot != NULL ? dot + 1 : NULL;
    }
    return f;
}
