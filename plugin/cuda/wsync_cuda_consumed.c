/* *consumed* of the last copied generation, on the stream that carried the copies (joined). */
#include <stdlib.h>

#include "wsync_cuda.h"
#include "wsync_error.h"
#include "wsync_log.h"

typedef struct wsync_cuda_signal {
    wsync_control_t *control;
    uint64_t generation;
} wsync_cuda_signal_t;

/* Runs on a CUDA runtime thread once the stream reaches it: no CUDA calls here. */
static void CUDART_CB wsync_cuda_signal_fn(void *user)
{
    wsync_cuda_signal_t *sig = user;
    wsync_control_signal_consumed(sig->control, sig->generation);
    free(sig);
}

/* Signal *consumed* of `generation` in the control block when `stream` gets there. The mapping
 * (and its control block) outlives the callback: unmapping waits for the streams' last events,
 * recorded after it. */
static wsync_result_t signal_in_stream_order(wsync_control_t *control, uint64_t generation,
                                             cudaStream_t stream, wsync_error_t *err)
{
    wsync_cuda_signal_t *sig = malloc(sizeof(*sig));
    if (sig == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to signal consumed");
    sig->control = control;
    sig->generation = generation;
    cudaError_t e = cudaLaunchHostFunc(stream, wsync_cuda_signal_fn, sig);
    if (e != cudaSuccess) {
        free(sig);
        return wsync_cuda_fail(err, e, __func__, "cudaLaunchHostFunc(signal consumed)");
    }
    return WSYNC_OK;
}

/* Raise the control block's consumed generation when `stream` gets there: by the GPU itself (a
 * stream memory write into the registered control block: nothing stalls the stream, and the
 * producer's wait sees it at once) where the driver allows it, else from a host function. */
static wsync_result_t signal_control(wsync_cuda_mapping_t *m, cudaStream_t stream,
                                     wsync_error_t *err)
{
    if (m->consumed_dev != NULL) {
        if (wsync_cuda_write_value64(stream, m->consumed_dev, m->copied_generation) == cudaSuccess)
            return WSYNC_OK;
        (void)cudaGetLastError(); /* refused at enqueue: nothing was queued */
        WSYNC_LOG_DEBUG("cuStreamWriteValue64 refused: consumed from a host function from now on");
        m->consumed_dev = NULL;
    }
    return signal_in_stream_order(m->control, m->copied_generation, stream, err);
}

wsync_result_t wsync_cuda_signal_consumed(wsync_cuda_mapping_t *m, cudaStream_t stream,
                                          wsync_error_t *err)
{
    /* A foreign producer without a control block gets its *consumed* event; ours publish none
     * (an engine killed with that record queued would poison the event for good). */
    if (m->has_consumed && m->control == NULL)
        WSYNC_CUDA_TRY(err, cudaEventRecord(m->consumed, stream));
    /* The control block's consumed generation moves when the GPU gets there, not when the record
     * is enqueued: a producer's bounded host wait then covers the copies, and an engine that dies
     * mid-copy shows up as PEER_GONE / TIMEOUT in wait_consumed instead of a producer stream
     * waiting on an event that will never fire. */
    if (m->control != NULL)
        return signal_control(m, stream, err);
    return WSYNC_OK;
}
