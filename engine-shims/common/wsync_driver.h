/* The request driver every shim ends in. A shim turns its engine's request into wsync manifests
 * (one per staging buffer); the driver
 *   1. parses each through the plugin's parse_manifest (or, in native fallback, the same parser
 *      linked in),
 *   2. validates and plans EVERYTHING before any byte moves: every tensor name known, every
 *      shape and dtype right, every source inside its buffer, every generation newer than the
 *      last one consumed from that buffer,
 *   3. opens each buffer once (the mapping stays cached across requests), enqueues the copies on
 *      the engine's stream and records *consumed* (on the copy stream, by the plugin's contract).
 * A bad request returns its error and leaves every engine parameter untouched.
 *
 * Plugin loading never fails the driver: when the plugin is missing, lacks the symbol, speaks
 * an incompatible ABI or fails init/create, the driver logs why and runs every request through
 * the engine's native_copy instead.
 *
 * Not thread safe: one driver per engine worker, called from one thread. */
#ifndef WSYNC_DRIVER_H
#define WSYNC_DRIVER_H

#include <jansson.h>
#include <stddef.h>
#include "wsync_abi.h"
#include "wsync_mapping.h"
#include "wsync_registry.h"

typedef struct wsync_driver wsync_driver_t;

typedef struct wsync_driver_config {
    const char *plugin_path;          /* the engine's config flag; NULL: $WSYNC_PLUGIN, default */
    const wsync_engine_ops_t *engine; /* borrowed for the driver's life */
    const wsync_map_table_t *map;     /* the shim's table; borrowed (static data) */
    wsync_log_fn_t log;               /* NULL: silent; also handed to the plugin */
    void *log_user;
    wsync_log_level_t log_level;
    int device_ordinal;
    uint32_t timeout_ms;         /* consumer waits (0 = plugin default) */
    uint32_t copy_flags;         /* WSYNC_COPY_VERIFY to check wsync64 digests while copying */
    uint64_t max_manifest_bytes; /* the consumer's manifest limits (0: the plugin's) */
    uint64_t max_manifest_tensors;
} wsync_driver_config_t;

/* Fails only on invalid arguments or out of memory; a plugin that cannot be used selects the
 * native fallback (see wsync_driver_native). */
wsync_result_t wsync_driver_open(const wsync_driver_config_t *cfg, wsync_driver_t **out,
                                 wsync_error_t *err);
/* Closes every cached mapping, finalizes the consumer, unloads the plugin. */
void wsync_driver_close(wsync_driver_t *d);

/* How many times the driver called the plugin's open_handle for weight buckets (buffers and
 * direct segments): a steady sync through retained buffers or unchanged segments adds 0. */
uint64_t wsync_driver_opens(const wsync_driver_t *d);
/* The manifest text limit the consumer enforces (the config's, else the plugin default). */
uint64_t wsync_driver_max_manifest_bytes(const wsync_driver_t *d);
/* 1 when requests go to the engine's native loader; *why (may be NULL) gets the reason. */
int wsync_driver_native(const wsync_driver_t *d, const char **why);
/* The loaded plugin and its consumer (NULL in native mode): engines allocate parameters with
 * the consumer's mem_alloc so they live where the plugin copies. */
const wsync_plugin_t *wsync_driver_plugin(const wsync_driver_t *d);
struct wsync_consumer *wsync_driver_consumer(const wsync_driver_t *d);

/* Refuse the request being served for a fault in its own fields (not in its manifests): the
 * next wsync_driver_apply parses its manifests, gives their buckets back unread (so the trainer's
 * next bucket does not wait for a *consumed* that never comes), writes nothing and returns `rc`
 * with `message`. Cleared by that apply, or by wsync_driver_refuse(d, WSYNC_OK, NULL). */
void wsync_driver_refuse(wsync_driver_t *d, wsync_result_t rc, const char *message);

/* Apply one request: `n` manifests (JSON text, each naming a distinct buffer). All are parsed,
 * validated and planned before the first copy. Non-blocking with a plugin (copies enqueued,
 * consumed recorded); blocking in native mode. On success *generation (may be NULL) gets the
 * highest generation applied. */
wsync_result_t wsync_driver_apply(wsync_driver_t *d, const char *const *manifests,
                                  const size_t *lens, size_t n, uint64_t *generation,
                                  wsync_error_t *err);

/* Update transactions (wsync_txn.h) over every bucket this driver applies. begin opens
 * `version` declaring what it holds (names may be NULL); a bucket without an open version opens
 * the next one implicitly; commit (version 0: the open one) succeeds only when everything
 * declared arrived; abort leaves it unfinished. The engine's update_begin / update_end hooks are
 * called as versions open and end. check ends an open version whose producer process is gone.
 * state is the JSON of wsync_txn_state (a new reference). */
wsync_result_t wsync_driver_begin(wsync_driver_t *d, uint64_t version, uint64_t expect_tensors,
                                  uint64_t expect_bytes, const char *const *names, size_t n_names,
                                  wsync_error_t *err);
wsync_result_t wsync_driver_commit(wsync_driver_t *d, uint64_t version, wsync_error_t *err);
void wsync_driver_abort(wsync_driver_t *d, const char *reason);
void wsync_driver_check(wsync_driver_t *d);
json_t *wsync_driver_state(wsync_driver_t *d);
/* The committed version, and 1 when a version is open; the open version (0: none). */
uint64_t wsync_driver_committed(const wsync_driver_t *d, int *updating);
uint64_t wsync_driver_open_version(const wsync_driver_t *d);
/* The producer process of the open version (it is ended when that process is gone). */
void wsync_driver_set_producer(wsync_driver_t *d, int64_t pid);

/* Rollback mode for parameter groups small enough to hold twice: every copy whose destination
 * lies in param[i] .. + bytes[i] goes to shadow[i] instead, so a version that never commits
 * leaves those parameters exactly as they were. The engine owns the shadows: it fills each from
 * its parameter when a version opens (update_begin) and copies it into place when the version
 * commits (update_end with committed = 1). A version that wrote only shadows and ends
 * unfinished leaves the engine consistent. Replaces any earlier table; n = 0 clears it. */
typedef struct wsync_shadow {
    void *param;
    void *shadow;
    uint64_t bytes;
} wsync_shadow_t;
wsync_result_t wsync_driver_set_shadows(wsync_driver_t *d, const wsync_shadow_t *shadows, size_t n,
                                        wsync_error_t *err);

/* The weight checker: for each HF tensor t[i] (name, dtype, shape; offset 0), where it lives in
 * this engine rank (the mapping's plan, as for a copy) and the wsync64 of those bytes as the
 * engine holds them now, computed by the plugin on the engine's stream. *out: a JSON array of
 * {"name", "digest": "wsync64:<hex>", "offset", "rows", "row_bytes", "pitch"}, the last four the
 * region of the HF tensor this rank holds (its bytes from `offset`, `rows` rows of `row_bytes`,
 * `pitch` apart), so the trainer digests the same bytes of its own tensor. Blocking. */
wsync_result_t wsync_driver_check_tensors(wsync_driver_t *d, const wsync_tensor_desc_t *t, size_t n,
                                          json_t **out, wsync_error_t *err);

/* Wait until every copy enqueued on the engine stream is done. Blocking. */
wsync_result_t wsync_driver_drain(wsync_driver_t *d, wsync_error_t *err);

/* Drain, then close every cached mapping (the engine's half of the retire handshake: close,
 * ack, then the producer may free its staging). Blocking. */
wsync_result_t wsync_driver_release(wsync_driver_t *d, wsync_error_t *err);

/* LoRA: load adapter `name` into the engine's slot for it (the engine's lora_slot, assigning a
 * free one for a new name), from a PEFT directory (`path`) or from the tensors of a producer
 * buffer (`manifest` JSON naming them as PEFT saves them, plus `config`, the
 * adapter_config.json text). A manifest's buffer is mapped once and cached like a weight
 * bucket's; a generation not newer than the last one taken from it is refused. The plugin writes
 * the slot's shadow copy and only then switches *active: live requests see the old adapter or
 * the new one, never a gap. Everything is validated before the first byte is written: a refused
 * adapter leaves both copies unchanged. *reloaded (may be NULL) is 1 when `name` was already
 * loaded (a same-name reload: the shim resets that adapter's prefix cache). Blocking. Needs a
 * plugin with hot_load_adapter: NOT_SUPPORTED in native mode or without the engine's lora_slot. */
wsync_result_t wsync_driver_load_adapter(wsync_driver_t *d, const char *name, const char *path,
                                         const char *manifest, size_t manifest_len,
                                         const char *config, int *reloaded, wsync_error_t *err);
/* Unload adapter `name` (the plugin zeroes the shadow, switches, then clears the other copy) and
 * free its slot. NOT_FOUND when `name` is not loaded. Blocking. */
wsync_result_t wsync_driver_unload_adapter(wsync_driver_t *d, const char *name, wsync_error_t *err);
/* The engine's prefix-cache reset for adapter `name`, when it gave one. */
void wsync_driver_reset_prefix_cache(wsync_driver_t *d, const char *name);

/* Engine hooks, forwarded when the engine gave them (drained first). */
void wsync_driver_flush_cache(wsync_driver_t *d);
void wsync_driver_post_load(wsync_driver_t *d);

/* Log through the configured logger (shims use it for their own messages). */
/* WSYNC_DRIVER_TIMING=1 (read once): requests print their host time by phase on stderr; a
 * monotonic clock in microseconds for it. */
int wsync_driver_timing(void);
double wsync_driver_us(void);

void wsync_driver_log(wsync_driver_t *d, wsync_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
