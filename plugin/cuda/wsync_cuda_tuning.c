/* The CUDA backend's settings; see wsync_cuda_tuning.h. The only file of the backend that reads
 * the environment. */
#include "wsync_cuda_tuning.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h" /* wsync_cuda_alloc_range */
#include "wsync_log.h"

/* Measured on one H200 (docs/PERFORMANCE.md, wsync-bench-cuda --lanes). */
#define WSYNC_CUDA_CE_SHARE_DEFAULT 1.0
#define WSYNC_CUDA_CE_MIN_BYTES_DEFAULT (16ull << 20)
#define WSYNC_CUDA_CE_LANES_DEFAULT 2

static wsync_buffer_kind_t staging_kind(void)
{
    const char *k = getenv("WSYNC_CUDA_STAGING_KIND");
    if (k != NULL && strcmp(k, "vmm") == 0)
        return WSYNC_BUFFER_CUDA_VMM_FD;
    if (k != NULL && strcmp(k, "ipc") == 0)
        return WSYNC_BUFFER_CUDA_IPC;
    if (k != NULL && k[0] != '\0')
        WSYNC_LOG_WARN("WSYNC_CUDA_STAGING_KIND=%s is neither vmm nor ipc: using the default", k);
    return (wsync_buffer_kind_t)0;
}

#ifdef WSYNC_CUDA_TUNABLE
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* The experiments' variables over the defaults (names in wsync_cuda_tuning.h). */
static void tuning_env(wsync_cuda_tuning_t *t)
{
    const char *v;
    if ((v = env("WSYNC_CUDA_KERNEL_VARIANT")))
        t->kernel_variant = atoi(v);
    if ((v = env("WSYNC_CUDA_BLOCKS_PER_SM")))
        t->blocks_per_sm = atoi(v);
    if ((v = env("WSYNC_CUDA_DIGEST_VARIANT")))
        t->digest_variant = atoi(v);
    if ((v = env("WSYNC_CUDA_QUANT_ORDER")))
        t->quant_order = strcmp(v, "runs") == 0      ? WSYNC_CUDA_QUANT_ORDER_RUNS
                         : strcmp(v, "strided") == 0 ? WSYNC_CUDA_QUANT_ORDER_STRIDED
                                                     : WSYNC_CUDA_QUANT_ORDER_MEASURED;
    if ((v = env("WSYNC_CUDA_QUANT_FAST")))
        t->quant_generic = atoi(v) == 0;
    if ((v = env("WSYNC_CUDA_QUANT_AHEAD")))
        t->quant_ahead = atoi(v) != 0;
    if ((v = env("WSYNC_CUDA_CE_PER_OP")))
        t->ce_per_op = strcmp(v, "1") == 0;
    if ((v = env("WSYNC_CUDA_CE_SHARE"))) {
        const double x = strtod(v, NULL);
        t->split.share = x < 0 ? 0 : x > 1 ? 1 : x;
    }
    if ((v = env("WSYNC_CUDA_CE_MIN_BYTES")))
        t->split.min_bytes = strtoull(v, NULL, 10);
    if ((v = env("WSYNC_CUDA_CE_LANES"))) {
        const long l = strtol(v, NULL, 10);
        t->split.lanes = l < 1 ? 1 : l > WSYNC_CUDA_MAX_LANES ? WSYNC_CUDA_MAX_LANES : (int)l;
    }
    if ((v = env("WSYNC_CUDA_CE_JOIN")) && strcmp(v, "0") == 0)
        t->split.range = NULL;
    if ((v = env("WSYNC_CUDA_CE_BALANCE")))
        t->split.balance = strcmp(v, "1") == 0;
    if ((v = env("WSYNC_CUDA_CONSUMED"))) {
        t->consumed_host = strcmp(v, "host") == 0;
        if (!t->consumed_host && strcmp(v, "gpu") != 0)
            WSYNC_LOG_WARN("WSYNC_CUDA_CONSUMED=\"%s\" is neither \"gpu\" nor \"host\": using gpu",
                           v);
    }
}
#endif

void wsync_cuda_tuning_read(wsync_cuda_tuning_t *t)
{
    memset(t, 0, sizeof(*t));
    t->kernel_variant = -1;
    t->quant_ahead = 1;
    t->split = (wsync_cuda_split_cfg_t){.share = WSYNC_CUDA_CE_SHARE_DEFAULT,
                                        .min_bytes = WSYNC_CUDA_CE_MIN_BYTES_DEFAULT,
                                        .lanes = WSYNC_CUDA_CE_LANES_DEFAULT,
                                        .range = wsync_cuda_alloc_range};
    t->staging_kind = staging_kind();
    const char *stats = getenv("WSYNC_CUDA_STATS");
    t->stats = stats != NULL && stats[0] != '\0' && strcmp(stats, "0") != 0;
#ifdef WSYNC_CUDA_TUNABLE
    tuning_env(t);
#endif
}

const wsync_cuda_tuning_t *wsync_cuda_tuning_now(wsync_cuda_tuning_t *t)
{
#ifdef WSYNC_CUDA_TUNABLE
    wsync_cuda_tuning_read(t);
#endif
    return t;
}
