/* What the conformance suite's case files share (wsync_conformance.c holds main and the weight
 * cases, wsync_conformance_lora.c the adapter cases). */
#ifndef WSYNC_CONFORMANCE_H
#define WSYNC_CONFORMANCE_H

#include <stddef.h>
#include "wsync_ref_engine.h"

typedef struct conf {
    const char *shim;
    const char *plugin;
    const char *only;
    const char *fixtures;
    int host_kind; /* the plugin under test stages in host_shm (the native loader can read it) */
    int failed;
} conf_t;

typedef struct conf_log {
    char text[16384];
    size_t len;
} conf_log_t;

/* "FAIL: [shim] ..." (marks the run failed) / "PASS: [shim] ...". */
void conf_fail(conf_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void conf_pass(conf_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Engine logger capturing into a conf_log_t (user; may be NULL). */
void conf_log_fn(void *user, wsync_log_level_t level, const char *file, int line, const char *fmt,
                 ...);
/* Open a reference engine of c->shim on `plugin` (1 layer). 0, or -1 after conf_fail. */
int conf_engine(conf_t *c, wsync_ref_engine_t *e, const char *plugin, const char *layout,
                uint32_t rank, uint32_t size, conf_log_t *log);

/* LoRA: load through the shim from a PEFT directory and (sglang) from tensors, bit-exact slots,
 * refused adapters leaving both copies unchanged, same-name reload, unload. */
void conf_lora(conf_t *c);

#endif
