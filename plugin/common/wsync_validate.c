/* Edge validation of copy ops and generations (docs/DESIGN.md §2: validate completely before any
 * byte is written). Pure functions; thread safe. */
#include "wsync_validate.h"

#include "wsync_cache.h"

#include "wsync_error.h"

/* Byte just past the last one a 2-D region touches: start + (rows-1)*pitch + row_bytes. */
static int wsync_region_end(uint64_t start, uint64_t rows, uint64_t pitch, uint64_t row_bytes,
                            uint64_t *end)
{
    uint64_t span;
    if (__builtin_mul_overflow(rows - 1, pitch, &span) ||
        __builtin_add_overflow(span, row_bytes, &span) || __builtin_add_overflow(start, span, end))
        return -1;
    return 0;
}

static wsync_result_t wsync_validate_op(const wsync_copy_op_t *op, size_t i, uint64_t src_bytes,
                                        wsync_error_t *err)
{
    uint64_t end;

    if (op->rows == 0 || op->row_bytes == 0)
        return WSYNC_OK; /* moves nothing: an empty tensor */
    if (op->dst == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "op %zu: dst is NULL but the op moves %llu x %llu bytes", i,
                          (unsigned long long)op->rows, (unsigned long long)op->row_bytes);
    uint64_t src_pitch = op->rows > 1 ? op->src_pitch : op->row_bytes;
    uint64_t dst_pitch = op->rows > 1 ? op->dst_pitch : op->row_bytes;
    if (src_pitch < op->row_bytes || dst_pitch < op->row_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "op %zu: src_pitch %llu / dst_pitch %llu smaller than row_bytes %llu "
                          "with %llu rows; rows would overlap",
                          i, (unsigned long long)op->src_pitch, (unsigned long long)op->dst_pitch,
                          (unsigned long long)op->row_bytes, (unsigned long long)op->rows);

    if (wsync_region_end(op->src_offset, op->rows, src_pitch, op->row_bytes, &end) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "op %zu: src_offset %llu + (rows %llu - 1) x src_pitch %llu + row_bytes "
                          "%llu overflows 64 bits",
                          i, (unsigned long long)op->src_offset, (unsigned long long)op->rows,
                          (unsigned long long)src_pitch, (unsigned long long)op->row_bytes);
    if (end > src_bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "op %zu: source bytes [%llu, %llu) exceed the buffer's %llu bytes "
                          "(src_offset %llu, rows %llu, src_pitch %llu, row_bytes %llu)",
                          i, (unsigned long long)op->src_offset, (unsigned long long)end,
                          (unsigned long long)src_bytes, (unsigned long long)op->src_offset,
                          (unsigned long long)op->rows, (unsigned long long)src_pitch,
                          (unsigned long long)op->row_bytes);

    if (wsync_region_end(0, op->rows, dst_pitch, op->row_bytes, &end) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "op %zu: (rows %llu - 1) x dst_pitch %llu + row_bytes %llu overflows "
                          "64 bits",
                          i, (unsigned long long)op->rows, (unsigned long long)dst_pitch,
                          (unsigned long long)op->row_bytes);
    if (end > op->dst_extent)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_BOUNDS,
                          "op %zu: writes %llu bytes from dst but dst_extent is %llu (rows %llu, "
                          "dst_pitch %llu, row_bytes %llu); the destination parameter is too "
                          "small",
                          i, (unsigned long long)end, (unsigned long long)op->dst_extent,
                          (unsigned long long)op->rows, (unsigned long long)dst_pitch,
                          (unsigned long long)op->row_bytes);
    return WSYNC_OK;
}

wsync_result_t wsync_validate_copy_ops(const wsync_copy_op_t *ops, size_t n, uint64_t src_bytes,
                                       wsync_error_t *err)
{
    if (n > 0 && ops == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT, "ops is NULL but n_ops is %zu", n);
    for (size_t i = 0; i < n; i++) {
        wsync_result_t r = wsync_validate_op(&ops[i], i, src_bytes, err);
        if (r != WSYNC_OK)
            return r;
    }
    return WSYNC_OK;
}

wsync_result_t wsync_validate_generation(uint64_t last, uint64_t generation, wsync_error_t *err)
{
    if (generation <= last)
        return WSYNC_FAIL(err, WSYNC_ERR_STALE_GENERATION,
                          "generation %llu is not newer than the last one copied from this "
                          "buffer (%llu); replayed or reordered manifest",
                          (unsigned long long)generation, (unsigned long long)last);
    return WSYNC_OK;
}

wsync_result_t wsync_validate_adapter_call(const void *consumer, const wsync_adapter_source_t *src,
                                           const wsync_adapter_slot_t *slot, wsync_error_t *err)
{
    if (consumer == NULL || src == NULL || slot == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "consumer %p, source %p and slot %p must all be non-NULL", consumer,
                          (const void *)src, (const void *)slot);
    return WSYNC_OK;
}

uint64_t wsync_copy_ops_bytes(const wsync_copy_op_t *ops, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; ops != NULL && i < n; i++) {
        uint64_t b;
        if (__builtin_mul_overflow(ops[i].rows, ops[i].row_bytes, &b) ||
            __builtin_add_overflow(total, b, &total))
            return UINT64_MAX;
    }
    return total;
}

wsync_result_t wsync_validate_adapter_manifest(const wsync_manifest_t *m,
                                               const wsync_buffer_desc_t *key, uint64_t bytes,
                                               uint64_t last_generation, wsync_error_t *err)
{
    if (m == NULL || key == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "adapter source FROM_MANIFEST needs the parsed manifest of an open "
                          "handle (manifest %p)",
                          (const void *)m);
    if (!wsync_cache_key_equal(&m->buffer, key) || m->buffer.bytes > bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "the adapter manifest (generation %llu, %llu bytes) names another "
                          "buffer than the handle it came with (%llu bytes); open the manifest's "
                          "buffer",
                          (unsigned long long)m->generation, (unsigned long long)m->buffer.bytes,
                          (unsigned long long)bytes);
    return wsync_validate_generation(last_generation, m->generation, err);
}

wsync_result_t wsync_validate_copy_args(const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                        wsync_error_t *err)
{
    if (n_ops != 0 && ops == NULL)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, "copy_weights",
                          "ops is NULL with n_ops %zu", n_ops);
    if ((flags & ~WSYNC_COPY_VERIFY) != 0)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, "copy_weights",
                          "unknown copy flags 0x%x; only WSYNC_COPY_VERIFY (0x1) is defined",
                          flags & ~WSYNC_COPY_VERIFY);
    if ((uint64_t)n_ops > UINT32_MAX)
        return wsync_fail(err, WSYNC_ERR_INVALID_ARGUMENT, "copy_weights",
                          "%zu ops in one call; at most %u: split the bucket", n_ops, UINT32_MAX);
    return WSYNC_OK;
}
