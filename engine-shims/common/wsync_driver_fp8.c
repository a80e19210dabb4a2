/* The checks of buckets that quantize into fp8 parameters (wsync_driver.h). */
#include "wsync_driver_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"
#include "wsync_fp8.h"
#include "wsync_manifest.h"

/* A tensor that quantizes into an fp8 parameter: the plugin must have copy_quantized, and the
 * bucket be staged (a direct bucket's segments copy as they are) outside rollback mode (whose
 * shadows do not hold the block scales). */
wsync_result_t wsync_driver_can_quantize(const wsync_driver_t *d, const wsync_manifest_t *m,
                                         const char *name, wsync_error_t *err)
{
    if (d->ops == NULL || !WSYNC_HAS_OP(wsync_consumer_ops_t, d->ops, copy_quantized))
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "tensor \"%s\" quantizes into an fp8 parameter, which needs a plugin "
                            "with copy_quantized; %s has none",
                            name, d->ops == NULL ? "the native loader" : d->loader.path);
    if (m->n_segments > 0 || d->n_shadows > 0)
        return WSYNC_RECORD(err, WSYNC_ERR_NOT_SUPPORTED,
                            "tensor \"%s\" quantizes into an fp8 parameter: %s", name,
                            m->n_segments > 0 ? "send it in a staged bucket, not a direct one"
                                              : "rollback mode does not shadow fp8 parameters");
    return WSYNC_OK;
}

/* A per-tensor fp8 scale (WSYNC_QUANT_FP8_TENSOR) is the amax of every part of its parameter: the
 * bucket must bring all of them (want[t]: the rows its scale covers), or the scale would be of a
 * part alone. */
wsync_result_t wsync_driver_check_tensor_scales(const wsync_manifest_t *m,
                                                const wsync_copy_op_t *ops,
                                                const wsync_quant_t *quant, const uint64_t *want,
                                                wsync_error_t *err)
{
    size_t n = 0;
    for (size_t t = 0; t < m->n_tensors; t++)
        n += quant[t].kind == WSYNC_QUANT_FP8_TENSOR && ops[t].rows > 0;
    if (n == 0)
        return WSYNC_OK;
    wsync_fp8_ref_t *g = malloc(n * sizeof(*g));
    if (g == NULL)
        return WSYNC_RECORD(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu fp8 scales", n);
    for (size_t t = 0, k = 0; t < m->n_tensors; t++)
        if (quant[t].kind == WSYNC_QUANT_FP8_TENSOR && ops[t].rows > 0)
            g[k++] = (wsync_fp8_ref_t){(uintptr_t)quant[t].scale_dst, t};
    qsort(g, n, sizeof(*g), wsync_fp8_ref_cmp);
    wsync_result_t rc = WSYNC_OK;
    for (size_t i = 0; i < n && rc == WSYNC_OK;) {
        size_t j = i;
        uint64_t rows = 0;
        for (; j < n && g[j].scale == g[i].scale; j++)
            rows += ops[g[j].op].rows;
        if (rows != want[g[i].op])
            rc = WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                              "tensor \"%s\" quantizes into an fp8 parameter with one per-tensor "
                              "scale, whose %" PRIu64 " rows must all come in one bucket (the "
                              "scale is the amax of all of them); this bucket brings %" PRIu64
                              " of them in %zu tensor(s): send every part of the parameter (q, "
                              "k, v; gate, up) together",
                              m->tensors[g[i].op].name, want[g[i].op], rows, j - i);
        i = j;
    }
    free(g);
    return rc;
}
