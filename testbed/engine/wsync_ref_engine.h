/* The reference engine: one TP worker of a synthetic model in engine layout, reached through a
 * shim (chosen by name) and a plugin (dlopened by path), as a real engine worker would wire
 * them. Parameters live in one arena allocated with the plugin's mem_alloc (malloc when the
 * plugin is unusable and the native loader serves). Used by `wsync-engine`, the demo and the
 * conformance suite. Not thread safe. */
#ifndef WSYNC_REF_ENGINE_H
#define WSYNC_REF_ENGINE_H

#include <stdint.h>
#include "wsync_ref_layout.h"
#include "wsync_ref_lora.h"
#include "wsync_shim.h"

typedef struct wsync_ref_engine_config {
    const char *engine; /* shim: "sglang" | "vllm" | "lmdeploy" */
    const char *plugin; /* NULL: $WSYNC_PLUGIN or the loader's default */
    wsync_model_config_t model;
    uint32_t rank, size;
    uint32_t timeout_ms;
    uint32_t copy_flags;
    wsync_log_fn_t log; /* NULL: stderr at WARN and above */
    void *log_user;
    wsync_log_level_t log_level;
} wsync_ref_engine_config_t;

typedef struct wsync_ref_engine {
    wsync_ref_engine_config_t cfg;
    wsync_ref_layout_t layout;
    const wsync_shim_t *shim;
    wsync_engine_ops_t ops;
    wsync_driver_t *driver;
    wsync_shim_ctx_t ctx;
    unsigned char *arena;
    int arena_plugin; /* arena from the plugin's mem_alloc */
    wsync_stream_t stream;
    int own_stream;
    unsigned flushes, post_loads, native_loads; /* hook counters (tests) */
    wsync_ref_lora_t lora;                      /* adapter slots (dense, TP size 1) */
} wsync_ref_engine_t;

/* 0, or -1 with why. A plugin that cannot be used is not an error (native fallback). */
int wsync_ref_engine_open(wsync_ref_engine_t *e, const wsync_ref_engine_config_t *cfg, char *why,
                          size_t len);
void wsync_ref_engine_close(wsync_ref_engine_t *e);

/* One request message -> reply text (malloc'd). Engine-level methods besides the shim's:
 *   {"method":"wsync.verify","version":k} -> {"verified":n,"total":N,"mismatch":"<first>"}
 *   {"method":"wsync.lora_verify","lora_name":n,"version":k,"rank":r}
 *                                         -> {"verified":n,"total":N,"mismatch":"<first>"}: the
 *                                            adapter slot against model/wsync_lora.h's adapter
 *   {"method":"wsync.release"}            -> closes every mapping (retire handshake)
 *   {"method":"wsync.shutdown"}           -> *stop = 1 */
char *wsync_ref_engine_handle(wsync_ref_engine_t *e, const char *text, size_t len,
                              wsync_result_t *rc, int *stop);

/* Drain, then compare every parameter with wsync_ref_expected(version). Returns the number that
 * match; *first_bad (may be NULL) gets the first mismatching name. */
size_t wsync_ref_engine_verify(wsync_ref_engine_t *e, uint64_t version, char *first_bad,
                               size_t len);
/* Copy the whole arena to host memory `dst` (arena_bytes). Drains first. 0 on success. */
int wsync_ref_engine_snapshot(wsync_ref_engine_t *e, void *dst);

/* Serve trainer requests on a Unix socket until shutdown or the peer leaves. 0 on success. */
int wsync_ref_engine_serve(wsync_ref_engine_t *e, const char *socket_path, int timeout_ms);

#endif
