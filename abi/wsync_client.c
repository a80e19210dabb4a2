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
    }
    return "unknown wsync result";
}
