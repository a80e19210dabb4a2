/* wsync demo: a trainer process and an engine process syncing a synthetic model through a plugin,
 * talking over a Unix socket. Messages (JSON, trainer -> engine unless noted):
 *   {"type":"sync","version":k,"buckets":b}   then b manifests (the plugin's JSON, verbatim),
 *   engine -> trainer after each: {"type":"ack","generation":g,"ok":true|false,"error":...},
 *   engine -> trainer after the sync: {"type":"verified","version":k,"ok":n,"total":N,...},
 *   {"type":"end"}  engine closes its mapping -> {"type":"closed"}; only then the trainer retires.
 */
#ifndef WSYNC_DEMO_H
#define WSYNC_DEMO_H

#include <stdint.h>
#include "wsync_model.h"

typedef struct wsync_demo_options {
    const char *plugin; /* NULL: the loader's default */
    wsync_model_config_t model;
    unsigned syncs;
    uint64_t bucket_bytes;
    int verify;
    int timeout_ms; /* bound on every wait */
    char socket_path[108];
    int lora;               /* --lora: adapter-only sync (wsync_demo_lora.c) */
    uint32_t lora_rank;     /* the adapter's rank R */
    uint32_t lora_max_rank; /* the engine slot's max rank (>= R; padding is zero) */
} wsync_demo_options_t;

/* Each runs in its own forked process and returns its exit status. */
int wsync_demo_trainer(const wsync_demo_options_t *o);
int wsync_demo_engine(const wsync_demo_options_t *o);
int wsync_demo_lora_trainer(const wsync_demo_options_t *o);
int wsync_demo_lora_engine(const wsync_demo_options_t *o);

#endif
