/* Consumer lifecycle and helpers: create/finalize, manifests, streams, memory, host callbacks. */
#include <stdlib.h>
#include <string.h>

#include "wsync_cuda.h"
#include "wsync_error.h"
#include "wsync_log.h"
#include "wsync_manifest.h"

static wsync_result_t consumer_create(const wsync_consumer_config_t *config,
                                      struct wsync_consumer **out, wsync_error_t *err)
{
    if (config == NULL || out == NULL ||
        !WSYNC_HAS_FIELD(wsync_consumer_config_t, config, timeout_ms))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "create needs a config (struct_size >= %zu) and an out pointer",
                          sizeof(wsync_consumer_config_v1_t));
    wsync_result_t rc = wsync_cuda_use_device(config->device_ordinal, err);
    if (rc != WSYNC_OK)
        return rc;
    struct wsync_consumer *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a consumer");
    c->device = config->device_ordinal;
    c->timeout_ms = config->timeout_ms ? config->timeout_ms : WSYNC_CUDA_DEFAULT_TIMEOUT_MS;
    pthread_mutex_init(&c->lock, NULL);
    wsync_peers_init(&c->peers);
    wsync_cuda_tuning_read(&c->tuning);
    cudaError_t e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device);
    if (e != cudaSuccess) {
        rc = wsync_cuda_fail(err, e, __func__, "cudaDeviceGetAttribute(MultiProcessorCount)");
        goto fail;
    }
    rc = wsync_cuda_device_uuid(c->device, c->uuid, err);
    if (rc != WSYNC_OK)
        goto fail;
    e = wsync_cuda_lane_create(&c->lane);
    if (e != cudaSuccess) {
        rc = wsync_cuda_fail(err, e, __func__, "creating the consumer's streams and events");
        goto fail;
    }
    c->cache = wsync_cache_create(wsync_cuda_map, wsync_cuda_unmap, c);
    if (c->cache == NULL) {
        rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the mapping cache");
        goto fail;
    }
    c->manifests = wsync_manifest_cache_for(config);
    if (c->manifests == NULL) {
        rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for the manifest parse cache");
        goto fail;
    }
    rc = wsync_cuda_ring_reserve(&c->ring, WSYNC_CUDA_RING_RESERVE_OPS, err);
    if (rc != WSYNC_OK)
        goto fail;
    WSYNC_LOG_INFO("cuda consumer on device %d (%s, %d SMs)", c->device, c->uuid, c->sm_count);
    *out = c;
    return WSYNC_OK;
fail:
    wsync_cuda_ring_free(&c->ring);
    if (c->manifests)
        wsync_manifest_cache_destroy(c->manifests);
    if (c->cache)
        wsync_cache_destroy(c->cache);
    wsync_cuda_lane_destroy(&c->lane);
    pthread_mutex_destroy(&c->lock);
    wsync_peers_destroy(&c->peers);
    free(c);
    return rc;
}

static wsync_result_t consumer_parse_manifest(struct wsync_consumer *c, const char *json,
                                              size_t len, const wsync_manifest_t **out,
                                              wsync_error_t *err)
{
    if (json == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "parse_manifest needs json and out");
    wsync_manifest_owned_t *m = NULL;
    wsync_result_t rc = wsync_manifest_parse_cached(c ? c->manifests : NULL, json, len, &m, err);
    if (rc != WSYNC_OK)
        return rc;
    *out = &m->view;
    return WSYNC_OK;
}

static void consumer_manifest_free(struct wsync_consumer *c, const wsync_manifest_t *m)
{
    (void)c;
    if (m)
        wsync_manifest_free(wsync_manifest_owned_from_view(m));
}

static wsync_result_t consumer_enqueue_host_fn(struct wsync_consumer *c, wsync_stream_t stream,
                                               wsync_host_fn_t fn, void *user, wsync_error_t *err)
{
    if (c == NULL || fn == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "enqueue_host_fn needs c and fn");
    cudaSetDevice(c->device);
    WSYNC_CUDA_TRY(err, cudaLaunchHostFunc(wsync_cuda_stream(stream), fn, user));
    return WSYNC_OK;
}

static wsync_result_t consumer_finalize(struct wsync_consumer *c, wsync_error_t *err)
{
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "finalize(NULL)");
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    wsync_cache_destroy(c->cache); /* closes every mapping still held */
    wsync_cuda_ring_free(&c->ring);
    wsync_cuda_adapter_state_free(&c->adapter);
    wsync_manifest_cache_destroy(c->manifests);
    wsync_validate_memo_free(&c->valid);
    pthread_mutex_unlock(&c->lock);
    wsync_cuda_lane_destroy(&c->lane);
    pthread_mutex_destroy(&c->lock);
    wsync_peers_destroy(&c->peers);
    const int stats = c->tuning.stats;
    free(c);
    wsync_cuda_stats_log(stats);
    return WSYNC_OK;
}

static wsync_result_t consumer_stream_create(struct wsync_consumer *c, wsync_stream_t *out,
                                             wsync_error_t *err)
{
    if (c == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "stream_create needs c and out");
    cudaSetDevice(c->device);
    cudaStream_t s;
    WSYNC_CUDA_TRY(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return WSYNC_OK;
}

static wsync_result_t consumer_stream_destroy(struct wsync_consumer *c, wsync_stream_t s,
                                              wsync_error_t *err)
{
    if (c == NULL || s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "stream_destroy needs a stream made by stream_create");
    WSYNC_CUDA_TRY(err, cudaStreamDestroy((cudaStream_t)s));
    return WSYNC_OK;
}

static wsync_result_t consumer_stream_synchronize(struct wsync_consumer *c, wsync_stream_t s,
                                                  wsync_error_t *err)
{
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "stream_synchronize(NULL consumer)");
    WSYNC_CUDA_TRY(err, cudaStreamSynchronize(wsync_cuda_stream(s)));
    return WSYNC_OK;
}

static wsync_result_t consumer_mem_alloc(struct wsync_consumer *c, size_t bytes, void **out,
                                         wsync_error_t *err)
{
    if (c == NULL || out == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "mem_alloc needs c and out");
    cudaSetDevice(c->device);
    WSYNC_CUDA_TRY(err, cudaMalloc(out, bytes));
    return WSYNC_OK;
}

static wsync_result_t consumer_mem_free(struct wsync_consumer *c, void *p, wsync_error_t *err)
{
    if (c == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "mem_free(NULL consumer)");
    cudaSetDevice(c->device);
    WSYNC_CUDA_TRY(err, cudaFree(p));
    return WSYNC_OK;
}

/* Blocking and unordered with the caller's non-blocking streams: synchronize them first. */
static wsync_result_t consumer_mem_copy(struct wsync_consumer *c, void *dst, const void *src,
                                        size_t bytes, int kind, wsync_error_t *err)
{
    if (c == NULL || (bytes > 0 && (dst == NULL || src == NULL)) || (kind != 0 && kind != 1))
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "mem_copy: kind %d (0 host to device, 1 device to host), dst %p, src %p",
                          kind, dst, src);
    cudaSetDevice(c->device);
    WSYNC_CUDA_TRY(err, cudaMemcpy(dst, src, bytes,
                                   kind == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
    return WSYNC_OK;
}

const wsync_consumer_ops_v1_t wsync_cuda_consumer_ops = {
    .struct_size = sizeof(wsync_consumer_ops_v1_t),
    .abi_version = WSYNC_ABI_VERSION_1,
    .create = consumer_create,
    .parse_manifest = consumer_parse_manifest,
    .manifest_free = consumer_manifest_free,
    .open_handle = wsync_cuda_open_handle,
    .close_handle = wsync_cuda_close_handle,
    .copy_weights = wsync_cuda_copy_weights,
    .copy_segments = wsync_cuda_copy_segments,
    .digest_regions = wsync_cuda_digest_regions,
    .copy_quantized = wsync_cuda_copy_quantized,
    .record_consumed = wsync_cuda_record_consumed,
    .hot_load_adapter = wsync_cuda_hot_load_adapter,
    .enqueue_host_fn = consumer_enqueue_host_fn,
    .finalize = consumer_finalize,
    .stream_create = consumer_stream_create,
    .stream_destroy = consumer_stream_destroy,
    .stream_synchronize = consumer_stream_synchronize,
    .unload_adapter = wsync_cuda_unload_adapter,
    .mem_alloc = consumer_mem_alloc,
    .mem_free = consumer_mem_free,
    .mem_copy = consumer_mem_copy,
};
