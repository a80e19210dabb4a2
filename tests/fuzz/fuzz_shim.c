/* Fuzz target: one engine shim's request parser (WSYNC_FUZZ_SHIM names it: "sglang", "vllm",
 * "lmdeploy"), through wsync_shim_serve, the entry point an engine worker calls with each
 * message (several messages per input, NUL-separated, served in order on one worker context:
 * vLLM's start / update / finish, LMDeploy's persistent buffer). The driver runs in native mode
 * (no plugin) against a fake engine whose native loader checks that every op the driver planned
 * stays inside the engine's parameter and reads inside the manifest's buffer. Invariants: every
 * request gets a reply; planned ops never leave the parameter; the request loader
 * (wsync_req_loadb) takes exactly the texts json_loadb takes, as equal objects. */
#include <string.h>

#include "wsync_driver.h"
#include "wsync_fuzz.h"
#include "wsync_request.h"
#include "wsync_shim.h"

#ifndef WSYNC_FUZZ_SHIM
#error "define WSYNC_FUZZ_SHIM"
#endif

#define PARAM_BYTES 8192
static uint8_t param_mem[PARAM_BYTES];

static int fake_param(void *user, const char *name, wsync_param_info_t *out)
{
    (void)user;
    if (name == NULL || name[0] == '\0' || strstr(name, "unknown") != NULL)
        return -1;
    memset(out, 0, sizeof(*out));
    out->ptr = param_mem;
    out->dtype = WSYNC_DTYPE_BF16;
    out->ndim = 2;
    out->shape[0] = 64;
    out->shape[1] = 64;
    return 0;
}

static void fake_tp(void *user, uint32_t *rank, uint32_t *size)
{
    (void)user;
    *rank = 0;
    *size = 1;
}

static void fake_dims(void *user, wsync_model_dims_t *out)
{
    (void)user;
    memset(out, 0, sizeof(*out));
    out->hidden = 64;
    out->heads = 4;
    out->kv_heads = 2;
    out->head_dim = 16;
    out->intermediate = 128;
    out->vocab = 64;
}

static wsync_result_t fake_native_copy(void *user, const wsync_buffer_desc_t *buffer,
                                       uint64_t generation, const wsync_copy_op_t *ops,
                                       size_t n_ops, wsync_error_t *err)
{
    (void)user;
    (void)generation;
    (void)err;
    for (size_t i = 0; i < n_ops; i++) {
        const wsync_copy_op_t *op = &ops[i];
        if (op->rows == 0 || op->row_bytes == 0)
            continue;
        uint64_t dlast, slast;
        WSYNC_FUZZ_CHECK(!__builtin_mul_overflow(op->rows - 1, op->dst_pitch, &dlast));
        WSYNC_FUZZ_CHECK(!__builtin_add_overflow(dlast, op->row_bytes, &dlast));
        WSYNC_FUZZ_CHECK(!__builtin_mul_overflow(op->rows - 1, op->src_pitch, &slast));
        WSYNC_FUZZ_CHECK(!__builtin_add_overflow(slast, op->row_bytes, &slast));
        WSYNC_FUZZ_CHECK(!__builtin_add_overflow(slast, op->src_offset, &slast));
        const uint8_t *d = op->dst;
        WSYNC_FUZZ_CHECK(d >= param_mem && d <= param_mem + PARAM_BYTES);
        WSYNC_FUZZ_CHECK(dlast <= (uint64_t)(param_mem + PARAM_BYTES - d));
        WSYNC_FUZZ_CHECK(dlast <= op->dst_extent);
        WSYNC_FUZZ_CHECK(slast <= buffer->bytes);
    }
    return WSYNC_OK;
}

static wsync_engine_ops_t engine = {
    .struct_size = sizeof(wsync_engine_ops_t),
    .param = fake_param,
    .tp = fake_tp,
    .dims = fake_dims,
    .native_copy = fake_native_copy,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static wsync_driver_t *driver;
    static const wsync_shim_t *shim;
    wsync_error_t err = {.struct_size = sizeof(err)};

    if (driver == NULL) {
        shim = wsync_shim_find(WSYNC_FUZZ_SHIM);
        WSYNC_FUZZ_CHECK(shim != NULL);
        wsync_driver_config_t cfg = {
            .plugin_path = "/nonexistent/libwsync_fuzz_none.so", /* native mode */
            .engine = &engine,
            .map = shim->map,
        };
        WSYNC_FUZZ_CHECK(wsync_driver_open(&cfg, &driver, &err) == WSYNC_OK);
        WSYNC_FUZZ_CHECK(wsync_driver_native(driver, NULL));
    }
    wsync_shim_ctx_t ctx;
    wsync_shim_ctx_init(&ctx, driver, 0, 1);
    size_t pos = 0;
    while (pos <= size) {
        const uint8_t *end = size > pos ? memchr(data + pos, '\0', size - pos) : NULL;
        size_t len = end ? (size_t)(end - (data + pos)) : size - pos;
        /* the request loader takes exactly what jansson takes, as the same object */
        json_t *a = json_loadb((const char *)data + pos, len, 0, NULL);
        json_t *b = wsync_req_loadb((const char *)data + pos, len, NULL);
        WSYNC_FUZZ_CHECK((a == NULL) == (b == NULL) && (a == NULL || json_equal(a, b)));
        json_decref(a);
        json_decref(b);
        wsync_result_t rc = WSYNC_OK;
        err = (wsync_error_t){.struct_size = sizeof(err)};
        char *reply = wsync_shim_serve(shim, &ctx, (const char *)data + pos, len, &rc, &err);
        WSYNC_FUZZ_CHECK(reply != NULL);
        free(reply);
        pos += len + 1;
    }
    wsync_shim_ctx_free(&ctx);
    return 0;
}
