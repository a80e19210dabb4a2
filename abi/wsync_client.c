/* wsync_strerror (wsync_client.h). */
#include "wsync_client.h"

const char *wsync_strerror(wsync_result_t r)
{
    switch (r) {
    case WSYNC_OK:
        return "success";
    case WSYNC_ERR_INVALID_ARGUMENT:
        return "invalid argument";
    case WSYNC_ERR_INCOMPATIBLE:
        return "incompatible ABI version";
    case WSYNC_ERR_NO_DEVICE:
        return "no usable device";
    case WSYNC_ERR_NOT_SUPPORTED:
        return "not supported by this plugin";
    case WSYNC_ERR_OUT_OF_MEMORY:
        return "out of memory";
    case WSYNC_ERR_BAD_MANIFEST:
        return "malformed manifest";
    case WSYNC_ERR_OUT_OF_BOUNDS:
        return "out of bounds";
    case WSYNC_ERR_STALE_GENERATION:
        return "stale generation";
    case WSYNC_ERR_TIMEOUT:
        return "timed out";
    case WSYNC_ERR_DIGEST_MISMATCH:
        return "digest mismatch";
    case WSYNC_ERR_SYSTEM:
        return "system call failed";
    case WSYNC_ERR_BUSY:
        return "resource busy";
    case WSYNC_ERR_LAYOUT_MISMATCH:
        return "layout mismatch";
    case WSYNC_ERR_NOT_FOUND:
        return "not found";
    case WSYNC_ERR_PEER_GONE:
        return "peer gone";
    case WSYNC_ERR_INTERNAL:
        return "internal error";
    case WSYNC_ERR_PERMISSION:
        return "permission denied";
    case WSYNC_ERR_BAD_REQUEST:
        return "malformed request";
    case WSYNC_ERR_BAD_ADAPTER:
        return "malformed adapter";
    case WSYNC_ERR_UNKNOWN_PLAN:
        return "unknown plan";
    }
    return "unknown wsync result";
}

const char *wsync_result_name(wsync_result_t r)
{
    static const char *const names[] = {
        [WSYNC_OK] = "OK",
        [WSYNC_ERR_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
        [WSYNC_ERR_INCOMPATIBLE] = "INCOMPATIBLE",
        [WSYNC_ERR_NO_DEVICE] = "NO_DEVICE",
        [WSYNC_ERR_NOT_SUPPORTED] = "NOT_SUPPORTED",
        [WSYNC_ERR_OUT_OF_MEMORY] = "OUT_OF_MEMORY",
        [WSYNC_ERR_BAD_MANIFEST] = "BAD_MANIFEST",
        [WSYNC_ERR_OUT_OF_BOUNDS] = "OUT_OF_BOUNDS",
        [WSYNC_ERR_STALE_GENERATION] = "STALE_GENERATION",
        [WSYNC_ERR_TIMEOUT] = "TIMEOUT",
        [WSYNC_ERR_DIGEST_MISMATCH] = "DIGEST_MISMATCH",
        [WSYNC_ERR_SYSTEM] = "SYSTEM",
        [WSYNC_ERR_BUSY] = "BUSY",
        [WSYNC_ERR_LAYOUT_MISMATCH] = "LAYOUT_MISMATCH",
        [WSYNC_ERR_NOT_FOUND] = "NOT_FOUND",
        [WSYNC_ERR_PEER_GONE] = "PEER_GONE",
        [WSYNC_ERR_INTERNAL] = "INTERNAL",
        [WSYNC_ERR_PERMISSION] = "PERMISSION",
        [WSYNC_ERR_BAD_REQUEST] = "BAD_REQUEST",
        [WSYNC_ERR_BAD_ADAPTER] = "BAD_ADAPTER",
        [WSYNC_ERR_UNKNOWN_PLAN] = "UNKNOWN_PLAN",
    };
    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : NULL;
}

int wsync_error_op(const wsync_error_t *err, uint64_t *op)
{
    if (!WSYNC_HAS_FIELD(wsync_error_t, err, op_valid) || !err->op_valid)
        return 0;
    if (op != NULL)
        *op = err->op;
    return 1;
}

void wsync_error_set_op(wsync_error_t *err, uint64_t op)
{
    if (!WSYNC_HAS_FIELD(wsync_error_t, err, op_valid))
        return;
    err->op = op;
    err->op_valid = 1;
}

void wsync_error_clear_op(wsync_error_t *err)
{
    if (!WSYNC_HAS_FIELD(wsync_error_t, err, op_valid))
        return;
    err->op = 0;
    err->op_valid = 0;
}
